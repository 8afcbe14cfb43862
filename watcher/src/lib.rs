//! hafleet-watcher: watches annotated Ingresses and the Services and Nodes they route to, and
//! publishes each Ingress's fully resolved routes for its fleet.
//!
//! The folders are the layers, and each step of a pass is one module in them:
//!
//! ```text
//! cli        the command line (one command: run)
//! app/       wiring: the effects around the pure steps
//!   run              start-up, leader election, the loop and one pass over the caches
//!   args             the settings
//!   state            what the watcher keeps between passes (published, told, certificates)
//!   effects          a pass's decisions out: nodes, default certs, settings, snapshots, Events
//!   kept             refused Ingresses kept for their last routes, capped per namespace
//!   snapshot         every Ingress it knows, published whole or in parts
//!   notices          the fleets' versions and reports → Events on the Ingresses
//! core/      pure decisions: no API server, no NATS, the clock a parameter
//!   model            what the steps hand each other: Resolved, Warning, Sharing
//!   annotations      an Ingress's hafleet.io/ annotations, read strictly
//!   resolve          Ingress + Services + Nodes → validated routes (tls_secrets: certificates
//!                    checked and sealed)
//!   tenancy          hosts kept to their namespace, conflicts told to the loser; policy: the
//!                    admin's tenancy policy
//!   index            what to publish; churn: what waits for the namespace's budget
//!   route_events     the messages, and whether one Ingress's fits what one may take
//!   fleet_settings   the fleets' settings ConfigMaps
//!   status           an Ingress's status.loadBalancer; feedback: reports → notices
//! k8s/       Kubernetes adapters: watch (reflectors), events (Events and status written
//!            back), elector (leader election on a Lease)
//! ```
//! NATS comes through `hafleet_runtime`. Arrows run down the list and never back: `cli` and
//! `app` use `core` and `k8s`, `k8s` uses `core` for its constants, and `core` uses neither.

pub mod app;
pub mod cli;
pub mod core;
pub mod k8s;

pub use cli::Cli;
