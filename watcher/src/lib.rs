//! hafleet-watcher: watches annotated Ingresses and the Services and Nodes they route to, and
//! publishes each Ingress's fully resolved routes for its fleet.
//!
//! Pure decisions: [`resolve`] (objects → validated routes), [`tenancy`] (hosts kept to their
//! namespace, conflicts told to the loser), [`index`] (what to publish) and [`churn`] (what
//! waits, so that no namespace changes a fleet more often than its budget), [`policy`] (the
//! admin's tenancy policy), [`fleet_settings`] (the fleets' settings ConfigMaps) and [`events`] (route events, and what one Ingress's may take).
//! Adapters: [`kube`] (reflectors, Events); NATS through `hafleet_runtime`. Wiring: [`run`].

pub mod annotations;
pub mod churn;
pub mod events;
pub mod feedback;
pub mod fleet_settings;
pub mod index;
pub mod kept;
pub mod kube;
pub mod lease;
pub mod policy;
pub mod resolve;
pub mod run;
pub mod snapshot;
pub mod status;
pub mod tenancy;
pub mod tls;

use clap::Parser;

/// Publishes the routes of Ingresses annotated `hafleet.io/fleet: <fleet>` to NATS JetStream.
///
/// Reads the cluster from KUBECONFIG (or the in-cluster service account).
#[derive(Debug, Parser)]
#[command(name = "hafleet-watcher", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub run: run::RunArgs,
    #[command(flatten)]
    pub log: hafleet_runtime::LogArgs,
}

impl Cli {
    /// Parses the command line and runs it; `main` is nothing more.
    pub async fn parse_and_run() -> anyhow::Result<()> {
        let cli = Cli::parse();
        hafleet_runtime::init_tracing(&cli.log);
        run::run(cli.run).await
    }
}
