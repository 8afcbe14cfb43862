//! hafleet-applier: one per fleet. Takes each config version the renderer publishes for the
//! fleet and puts it live on every HAProxy host of the fleet over SSH, safely: validate, atomic
//! swap, reload, verify, roll back on any failure, report per host.
//!
//! The folders, in the order a version meets them:
//! - [`app`]: wiring, the run loop ([`app::run`]) that takes each version;
//! - [`rollout`]: the steps of a rollout (prepare, go live, reload, repair) over the hosts,
//!   canary first, then waves;
//! - [`core`]: pure decisions: hosts ([`core::inventory`]), waves and the master CLI's words
//!   ([`core::plan`]), runtime API or reload ([`core::runtime_api`]), edits ([`core::patch`]),
//!   the fleet's TLS identity ([`core::identity`]);
//! - [`host`]: what the applier asks of a host, as a trait ([`host::ops`]) with the SSH
//!   implementation ([`host::ssh`] over the openssh pool [`host::conn`] and the `sh` scripts),
//!   an in-memory fake for tests, and the one reader of the scripts' answers;
//! - [`adapters`]: NATS ([`adapters::bus`]) and HTTP probes ([`adapters::probe`]);
//!
//! The operator's commands (`status`, `keygen`, `nats-permissions`) are `hafleet`'s.

pub mod adapters;
pub mod app;
pub mod core;
pub mod host;
pub mod rollout;

use clap::Parser;

/// Applies a fleet's HAProxy config versions to its hosts over SSH, until SIGTERM or Ctrl-C.
/// What each host runs: `hafleet status`.
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
    /// A command that moved to the operator CLI, `hafleet`.
    #[command(subcommand)]
    pub moved: Option<Moved>,
    #[command(flatten)]
    pub run: Option<app::run::RunArgs>,
    #[command(flatten)]
    pub log: hafleet_runtime::LogArgs,
}

/// Commands that moved to `hafleet`: named, they say so.
#[derive(Debug, clap::Subcommand)]
pub enum Moved {
    #[command(external_subcommand)]
    Moved(Vec<String>),
}

/// The run settings alone, for a command line that gives none of them.
#[derive(Debug, Parser)]
#[command(name = "hafleet-applier")]
struct RunOnly {
    #[command(flatten)]
    run: app::run::RunArgs,
    #[command(flatten)]
    log: hafleet_runtime::LogArgs,
}

impl Cli {
    /// Parses the command line and runs it; `main` is nothing more.
    pub async fn parse_and_run() -> anyhow::Result<()> {
        let cli = Cli::parse();
        hafleet_runtime::init_tracing(&cli.log);
        match cli.moved {
            Some(Moved::Moved(args)) => hafleet_runtime::moved_to_cli("hafleet-applier", &args),
            // Read the run settings as the run command alone, with its required arguments
            // required again: `run` is `None` when they all come from the environment (as
            // under systemd).
            None => app::run::run(RunOnly::parse().run).await,
        }
    }
}

#[cfg(test)]
#[test]
fn every_flag_takes_its_own_name_as_its_variable_and_durations_carry_their_unit() {
    hafleet_runtime::settings::assert_grammar(&<Cli as clap::CommandFactory>::command());
}
