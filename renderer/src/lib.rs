//! hafleet-renderer: keeps each fleet's desired state in sled, renders HAProxy configs with
//! minijinja, and publishes numbered, explained config versions.
//!
//! The folders are the layers, and each step of the pipeline is one module in them:
//!
//! ```text
//! cli/       the command line (`run`), and the operator's commands, which need only NATS:
//!   history          history, rollback, resume, sweep: asked of the running renderer
//!   replay           a past config rebuilt from the routes stream and a checkpoint
//! app/       wiring: the effects around the pure steps
//!   run              start-up, the loop that selects between the sources below, shutdown
//!   args             the settings of `run` (RenderArgs: what decides a config; replay's too)
//!   intake           route messages → state::apply → versions → store.commit; bad ones parked
//!   publish          stored versions and sweep releases out on NATS
//!   history_service  answers history requests, rolls back, resumes, releases sweeps
//!   refusals         HAProxy refused a version → quarantine its Ingresses
//!   checkpointer     desired state → object store, and back into an empty store
//! core/      pure decisions: no sled, no NATS, the clock a parameter
//!   state            route messages → desired state (snapshots: parts made whole)
//!   model            desired state → render model (filters, settings, certs, par)
//!   maps, render     render model → map files and config text
//!   versions         config text → a new version or none
//!   checkpoint       which checkpoint to write, start from, drop
//!   quarantine       a refused version → the Ingresses that made it
//! adapters/  I/O: store (sled), bus (NATS)
//! ```
//! Arrows run down the list and never back: `cli` and `app` use `core` and `adapters`,
//! `adapters` use `core` for its types, and `core` uses neither.

pub mod adapters;
pub mod app;
pub mod cli;
pub mod core;

pub use cli::{Cli, Command};
