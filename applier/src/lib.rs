//! hafleet-applier: one per fleet. Takes each config version the renderer publishes for the
//! fleet and puts it live on every HAProxy host of the fleet over SSH, safely: validate, atomic
//! swap, reload, verify, roll back on any failure, report per host.
//!
//! Pure decisions: [`inventory`] (what hosts and how), [`plan`] (waves, reading the master CLI),
//! [`patch`] (a file sent as an edit of the host's).
//! Adapters: [`host`] (what the applier asks of a host, as a trait with an SSH implementation
//! over [`ssh`] (openssh) and the scripts, and an in-memory fake for tests; the one reader of
//! the scripts' answers) and [`bus`] (NATS). Steps: [`rollout`] (against the [`host`] trait).
//! Wiring: [`run`].

pub mod bus;
pub mod host;
pub mod inventory;
pub mod patch;
pub mod permissions;
pub mod plan;
pub mod probe;
pub mod rollout;
pub mod run;
pub mod runtime;
pub mod ssh;
pub mod status;
pub mod tls;

use clap::Parser;

/// Applies a fleet's HAProxy config versions to its hosts over SSH. Without a subcommand it
/// runs (every run flag below); `status` shows what each host runs.
#[derive(Debug, Parser)]
#[command(
    name = "hafleet-applier",
    version,
    about,
    long_about = None,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: Option<run::RunArgs>,
    #[command(flatten)]
    pub log: hafleet_runtime::LogArgs,
}

/// The run settings alone, for a command line that gives none of them.
#[derive(Debug, Parser)]
#[command(name = "hafleet-applier")]
struct RunOnly {
    #[command(flatten)]
    run: run::RunArgs,
    #[command(flatten)]
    log: hafleet_runtime::LogArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// What each host of a fleet runs: live version and sha256, its last outcome and when,
    /// drift. Read from the reports stream through NATS, from any machine.
    Status(status::StatusArgs),
    /// Print the NATS permissions of one fleet's applier, for the server's config (see
    /// deploy/nats/hafleet-permissions.conf): it may consume, read and report for that fleet
    /// only.
    NatsPermissions {
        /// The fleet.
        #[arg(long)]
        fleet: hafleet_proto::FleetName,
    },
    /// Make a fleet's TLS identity: writes the private half to --out (mode 0600; never
    /// overwritten) for this fleet's applier, and prints the public half (age1…) for the
    /// watcher's --seal-to FLEET=RECIPIENT. Only this file opens the fleet's TLS keys.
    Keygen {
        /// Where to write the identity file.
        #[arg(long)]
        out: std::path::PathBuf,
    },
}

impl Cli {
    /// Parses the command line and runs it; `main` is nothing more.
    pub async fn parse_and_run() -> anyhow::Result<()> {
        let cli = Cli::parse();
        hafleet_runtime::init_tracing(&cli.log);
        match cli {
            Cli { command: Some(Command::Status(args)), .. } => status::status(args).await,
            Cli { command: Some(Command::NatsPermissions { fleet }), .. } => {
                print!("{}", permissions::nats_permissions(&fleet));
                Ok(())
            }
            Cli { command: Some(Command::Keygen { out }), .. } => keygen(&out),
            // Read the run settings as the run command alone, with its required arguments
            // required again: `run` is `None` when they all come from the environment (as
            // under systemd).
            Cli { command: None, .. } => run::run(RunOnly::parse().run).await,
        }
    }
}

/// `keygen`: the identity file, created 0600 and never over an existing file.
fn keygen(out: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let id = tls::FleetIdentity::generate();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("cannot create {} (it is never overwritten)", out.display()))?;
    f.write_all(id.to_file_text().as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", out.display()))?;
    println!("{}", id.recipient());
    Ok(())
}
