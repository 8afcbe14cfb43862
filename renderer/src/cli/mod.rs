//! The command line: `run` starts the renderer ([`crate::app`]); every other command is the
//! operator's, run from any machine that reaches NATS: [`history`] (history, rollback, resume,
//! sweep) asks the running renderer, [`deadletter`] reads the parked route messages (and asks
//! the renderer to republish one), [`replay`] rebuilds a past config from the routes stream.

pub mod deadletter;
pub mod history;
pub mod replay;

use clap::{Parser, Subcommand};

/// Renders HAProxy configs for hafleet fleets from the route events the watcher publishes.
#[derive(Debug, Parser)]
#[command(name = "hafleet-renderer", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub log: hafleet_runtime::LogArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Consume route events and publish config versions until SIGTERM or Ctrl-C.
    Run(crate::app::args::RunArgs),
    /// Print the built-in HAProxy template, as a starting point for --template.
    Template,
    /// Read a fleet's config history from a running renderer (through NATS).
    #[command(subcommand)]
    History(history::HistoryCommand),
    /// Republish version N's config as a new version and pin the fleet to it: later changes
    /// are rendered and recorded as held, not published, until `resume`.
    Rollback {
        #[command(flatten)]
        common: history::Common,
        /// The version to put back.
        version: u64,
    },
    /// Rebuild a fleet's config as it was at a point of the routes stream (a sequence or a
    /// time), from the stream and the newest checkpoint before that point, and print it.
    Replay(replay::ReplayArgs),
    /// Unpin a rolled-back fleet and publish the config its current state renders.
    Resume {
        #[command(flatten)]
        common: history::Common,
    },
    /// Show or release a sweep the mass-deletion guard holds (through NATS).
    #[command(subcommand)]
    Sweep(history::SweepCommand),
    /// List, show or republish the route messages the renderer could not read and parked.
    #[command(subcommand)]
    Deadletter(deadletter::DeadLetterCommand),
}

impl Cli {
    /// Parses the command line and runs it; `main` is nothing more.
    pub async fn parse_and_run() -> anyhow::Result<()> {
        let cli = Cli::parse();
        hafleet_runtime::init_tracing(&cli.log);
        match cli.command {
            Command::Run(args) => crate::app::run::run(args).await,
            Command::Template => {
                print!("{}", crate::core::render::BUILTIN_TEMPLATE);
                Ok(())
            }
            Command::History(command) => history::history(command).await,
            Command::Sweep(command) => history::sweep(command).await,
            Command::Deadletter(command) => deadletter::deadletter(command).await,
            Command::Rollback { common, version } => {
                history::rollback_or_resume(common, Some(version)).await
            }
            Command::Replay(args) => replay::replay(args).await,
            Command::Resume { common } => history::rollback_or_resume(common, None).await,
        }
    }
}
