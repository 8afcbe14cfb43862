//! hafleet-renderer: keeps each fleet's desired state in sled, renders HAProxy configs with
//! minijinja, and publishes numbered, explained config versions.
//!
//! Pure decisions: [`state`] (messages → desired state), [`model`] (state → render model),
//! [`maps`] and [`render`] (model → map files and config text), [`versions`] (text → new version or not),
//! [`quarantine`] (a refused version → the Ingresses that made it). Adapters: [`store`]
//! (sled) and [`bus`] (NATS). Wiring: [`run`].

pub mod bus;
pub mod checkpoint;
pub mod filters;
pub mod history;
pub mod maps;
pub mod model;
pub mod par;
pub mod quarantine;
pub mod render;
pub mod run;
pub mod settings;
pub mod snapshots;
pub mod state;
pub mod store;
pub mod tls;
pub mod versions;

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
    Run(run::RunArgs),
    /// Print the built-in HAProxy template, as a starting point for --template.
    Template,
    /// Read a fleet's config history from a running renderer (through NATS).
    #[command(subcommand)]
    History(history::cli::HistoryCommand),
    /// Republish version N's config as a new version and pin the fleet to it: later changes
    /// are rendered and recorded as held, not published, until `resume`.
    Rollback {
        #[command(flatten)]
        common: history::cli::Common,
        /// The version to put back.
        version: u64,
    },
    /// Rebuild a fleet's config as it was at a point of the routes stream (a sequence or a
    /// time), from the stream and the newest checkpoint before that point, and print it.
    Replay(history::replay::ReplayArgs),
    /// Unpin a rolled-back fleet and publish the config its current state renders.
    Resume {
        #[command(flatten)]
        common: history::cli::Common,
    },
    /// Show or release a sweep the mass-deletion guard holds (through NATS).
    #[command(subcommand)]
    Sweep(history::cli::SweepCommand),
}

impl Cli {
    /// Parses the command line and runs it; `main` is nothing more.
    pub async fn parse_and_run() -> anyhow::Result<()> {
        let cli = Cli::parse();
        hafleet_runtime::init_tracing(&cli.log);
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Template => {
                print!("{}", render::BUILTIN_TEMPLATE);
                Ok(())
            }
            Command::History(command) => history::cli::history(command).await,
            Command::Sweep(command) => history::cli::sweep(command).await,
            Command::Rollback { common, version } => {
                history::cli::rollback_or_resume(common, Some(version)).await
            }
            Command::Replay(args) => history::replay::replay(args).await,
            Command::Resume { common } => history::cli::rollback_or_resume(common, None).await,
        }
    }
}
