//! The command line: the watcher has one command, which runs it ([`crate::app::run`]).

use clap::Parser;

/// Publishes the routes of Ingresses annotated `hafleet.io/fleet: <fleet>` to NATS JetStream.
///
/// Reads the cluster from KUBECONFIG (or the in-cluster service account).
#[derive(Debug, Parser)]
#[command(name = "hafleet-watcher", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub run: crate::app::args::RunArgs,
    #[command(flatten)]
    pub log: hafleet_runtime::LogArgs,
}

impl Cli {
    /// Parses the command line and runs it; `main` is nothing more.
    pub async fn parse_and_run() -> anyhow::Result<()> {
        let cli = Cli::parse();
        hafleet_runtime::init_tracing(&cli.log);
        crate::app::run::run(cli.run).await
    }
}

#[cfg(test)]
#[test]
fn every_flag_takes_its_own_name_as_its_variable_and_durations_carry_their_unit() {
    hafleet_runtime::settings::assert_grammar(&<Cli as clap::CommandFactory>::command());
}
