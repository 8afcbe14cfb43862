//! The command line: `run` starts the renderer ([`crate::app`]); `template` prints the
//! built-in template. The operator's commands (history, rollback, replay, …) are `hafleet`'s.

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
    Run(Box<crate::app::args::RunArgs>),
    /// Print the built-in HAProxy template, as a starting point for --template.
    Template,
    /// A command that moved to the operator CLI, `hafleet`.
    #[command(external_subcommand)]
    Moved(Vec<String>),
}

impl Cli {
    /// Parses the command line and runs it; `main` is nothing more.
    pub async fn parse_and_run() -> anyhow::Result<()> {
        let cli = Cli::parse();
        hafleet_runtime::init_tracing(&cli.log);
        match cli.command {
            Command::Run(args) => crate::app::run::run(*args).await,
            Command::Template => {
                print!("{}", crate::core::render::BUILTIN_TEMPLATE);
                Ok(())
            }
            Command::Moved(args) => hafleet_runtime::moved_to_cli("hafleet-renderer", &args),
        }
    }
}

#[cfg(test)]
#[test]
fn every_flag_takes_its_own_name_as_its_variable_and_durations_carry_their_unit() {
    hafleet_runtime::settings::assert_grammar(&<Cli as clap::CommandFactory>::command());
}
