//! hafleet-renderer: keeps each fleet's desired state in sled, renders HAProxy configs with
//! minijinja, and publishes numbered, explained config versions.
//!
//! The folders are the layers; each step of the pipeline is one module:
//!
//! ```text
//! cli/       the command line: `run`, and the operator's history, rollback, resume, sweep, replay
//! app/       wiring: the run loop and the effects around the pure steps
//!   run              start-up, the select loop, shutdown
//! core/      pure decisions, no I/O
//!   state            route messages → desired state (snapshots: parts made whole)
//!   model            desired state → render model (filters, settings, certs, par)
//!   maps, render     render model → map files and config text
//!   versions         config text → a new version or none
//!   checkpoint       which checkpoints to write, restore from and drop
//!   quarantine       a refused version → the Ingresses that made it
//! adapters/  I/O: store (sled), bus (NATS)
//! ```
//! Arrows run down the list: `cli` and `app` use `core` and `adapters`, `adapters` use `core`
//! for its types, and `core` uses neither.

pub mod adapters;
pub mod app;
pub mod cli;
pub mod core;

pub use cli::{Cli, Command};
