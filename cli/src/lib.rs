//! `hafleet`: the operator's command line. It talks to NATS only: it asks the running renderer
//! (request/reply on `hafleet.history.…`) and reads the streams, as an operator NATS user, from
//! any machine; it never opens a component's store nor logs in to a host. The component
//! binaries (`hafleet-watcher`, `hafleet-renderer`, `hafleet-applier`) only run.
//!
//! ```text
//! session    who to ask and how: flags over environment over the context file over defaults
//! context    the context file (~/.config/hafleet/config.yaml): NATS, credentials, a fleet
//! output     -o table|json|yaml
//! commands/  one module per task
//!   fleets           the fleets the renderer knows, with their hosts from the reports
//!   status           what each host of a fleet runs
//!   history          history list|show|diff|why, rollback, resume, sweep
//!   replay           a past config rebuilt from the routes stream and a checkpoint
//!   deadletter       the parked route messages
//!   permissions      NATS permissions of an applier or an operator
//!   keygen           a fleet's TLS identity
//!   docs             completions, the man page, the CLI reference, the version
//! ```

pub mod commands;
pub mod context;
pub mod output;
pub mod session;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use commands::{deadletter, history, replay};

/// The version with the commit it was built from.
pub const LONG_VERSION: &str =
    concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("HAFLEET_GIT_COMMIT"), ")");

/// Operates hafleet fleets: what each runs, their config history, rollbacks, replays and
/// held sweeps, from any machine that reaches NATS.
///
/// Settings come from flags, then HAFLEET_* environment variables, then the current context of
/// the context file (see `hafleet context`), then defaults.
#[derive(Debug, Parser)]
#[command(name = "hafleet", version = LONG_VERSION, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub global: session::GlobalArgs,
    #[command(flatten)]
    pub log: hafleet_runtime::LogArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The fleets the renderer knows: newest and published version, pin, held sweeps, objects,
    /// and how many hosts run the published version.
    Fleets,
    /// What each host of a fleet runs: live version and sha256, its last outcome and when,
    /// drift, quarantined Ingresses.
    Status,
    /// A fleet's config history: list, show, diff, why.
    #[command(subcommand)]
    History(history::HistoryCommand),
    /// Republish version N's config as a new version and pin the fleet to it: later changes
    /// are rendered and recorded as held, not published, until `hafleet resume`.
    Rollback {
        /// The version to put back.
        #[arg(value_name = "VERSION")]
        number: u64,
    },
    /// Unpin a rolled-back fleet and publish the config its current state renders.
    Resume,
    /// Rebuild a fleet's config as it was at a point of the routes stream (a sequence or a
    /// time), from the stream and the newest checkpoint before that point, and print it.
    Replay(replay::ReplayArgs),
    /// Show or release a sweep the mass-deletion guard holds.
    #[command(subcommand)]
    Sweep(history::SweepCommand),
    /// List, show or republish the route messages the renderer could not read and parked.
    #[command(subcommand)]
    Deadletter(deadletter::DeadLetterCommand),
    /// Print NATS permissions for the server's config (deploy/nats/hafleet-permissions.conf):
    /// of one fleet's applier (--fleet), which may consume, read and report for that fleet
    /// only; or of an operator (--operator NAME, --operator-all).
    NatsPermissions(commands::permissions::PermissionsArgs),
    /// Make a fleet's TLS identity: writes the private half to --out (mode 0600; never
    /// overwritten) for this fleet's applier, and prints the public half (age1…) for the
    /// watcher's --seal-to FLEET=RECIPIENT. Only this file opens the fleet's TLS keys.
    Keygen {
        /// Where to write the identity file.
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Show, choose and edit contexts: named sets of NATS address, credentials and fleet.
    #[command(subcommand)]
    Context(context::ContextCommand),
    /// Print a shell completion script: `hafleet completion bash > /etc/bash_completion.d/hafleet`.
    Completion { shell: clap_complete::Shell },
    /// Print the version and the commit it was built from.
    Version,
    /// Print the man page (roff): `hafleet man > /usr/local/share/man/man1/hafleet.1`.
    #[command(hide = true)]
    Man,
}

/// Parses the command line (`name`: how the user called it, `hafleet` or `kubectl hafleet`)
/// and runs it; `main` is nothing more.
pub async fn parse_and_run(name: &'static str) -> anyhow::Result<()> {
    let matches = Cli::command().name(name).bin_name(name).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    hafleet_runtime::init_tracing(&cli.log);
    let given = cli.global.given_on_command_line(&matches);
    run(cli, &given).await
}

/// Runs a parsed command line; `given` are the connection flags given on it (not by the
/// environment).
pub async fn run(cli: Cli, given: &context::Settings) -> anyhow::Result<()> {
    let global = &cli.global;
    let session = || session::Session::new(global);
    match cli.command {
        Command::Completion { shell } => commands::docs::completion(shell),
        Command::Version => commands::docs::version(global.output),
        Command::Man => commands::docs::man(),
        Command::Keygen { out } => commands::keygen::keygen(&out),
        Command::NatsPermissions(args) => {
            commands::permissions::print(&args, session()?.fleet.as_ref())
        }
        Command::Context(command) => context::run(command, global, given),
        Command::Fleets => commands::fleets::fleets(&session()?).await,
        Command::Status => commands::status::status(&session()?).await,
        Command::History(command) => history::history(&session()?, command).await,
        Command::Rollback { number } => {
            history::rollback_or_resume(&session()?, Some(number)).await
        }
        Command::Resume => history::rollback_or_resume(&session()?, None).await,
        Command::Replay(args) => replay::replay(&session()?, args).await,
        Command::Sweep(command) => history::sweep(&session()?, command).await,
        Command::Deadletter(command) => deadletter::deadletter(&session()?, command).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
        hafleet_runtime::settings::assert_grammar(&Cli::command());
    }

    #[test]
    fn global_flags_go_before_or_after_the_command_and_only_the_given_ones_are_written() {
        let m = Cli::command()
            .try_get_matches_from([
                "hafleet",
                "context",
                "set",
                "prod",
                "--nats-url",
                "tls://n:4222",
                "-o",
                "json",
            ])
            .unwrap();
        let cli = Cli::from_arg_matches(&m).unwrap();
        assert_eq!(cli.global.output, output::Output::Json);
        let given = cli.global.given_on_command_line(&m);
        assert_eq!(given.nats_url.as_deref(), Some("tls://n:4222"));
        assert_eq!(given.fleet, None);
        let m =
            Cli::command().try_get_matches_from(["hafleet", "--fleet", "edge", "status"]).unwrap();
        let cli = Cli::from_arg_matches(&m).unwrap();
        assert_eq!(cli.global.fleet.map(|f| f.to_string()).as_deref(), Some("edge"));
        assert!(
            Cli::command()
                .try_get_matches_from(["hafleet", "status", "--fleet", "Bad_Name"])
                .is_err()
        );
    }
}
