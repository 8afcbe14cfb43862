//! hafleet-watcher: watches annotated Ingresses and the Services and Nodes they route to, and
//! publishes each Ingress's fully resolved routes for its fleet.
//!
//! The folders are the layers:
//!
//! ```text
//! cli        the command line
//! app/       wiring: run (the loop), kept, snapshot
//! core/      pure decisions: annotations, resolve, tenancy, tls_secrets, index, churn, policy,
//!            fleet_settings, route_events, status, feedback
//! k8s/       Kubernetes adapters: watch (reflectors, Events), elector (the Lease)
//! ```
//! NATS comes through `hafleet_runtime`.

pub mod app;
pub mod cli;
pub mod core;
pub mod k8s;

pub use cli::Cli;
