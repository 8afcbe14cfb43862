//! hafleet-applier: one per fleet. Takes each config version the renderer publishes for the
//! fleet and puts it live on every HAProxy host of the fleet over SSH, safely: validate, atomic
//! swap, reload, verify, roll back on any failure, report per host.
//!
//! Pure decisions: [`inventory`] (what hosts and how), [`plan`] (waves, reading the master CLI).
//! Adapters: [`ssh`] (openssh) and [`bus`] (NATS). Steps: [`rollout`]. Wiring: [`run`].

pub mod bus;
pub mod inventory;
pub mod plan;
pub mod probe;
pub mod rollout;
pub mod run;
pub mod runtime;
pub mod ssh;

use clap::Parser;

/// Applies a fleet's HAProxy config versions to its hosts over SSH.
#[derive(Debug, Parser)]
#[command(name = "hafleet-applier", version, about, long_about = None)]
pub struct Cli {
    #[command(flatten)]
    pub run: run::RunArgs,
}

impl Cli {
    /// Parses the command line and runs it; `main` is nothing more.
    pub async fn parse_and_run() -> anyhow::Result<()> {
        hafleet_runtime::init_tracing();
        run::run(Cli::parse().run).await
    }
}
