//! Wiring: the renderer's run loop and the effects around the pure steps of [`crate::core`].
//!
//! ```text
//! run ──▶ intake (stream → state → versions → store) ──▶ publish (versions out, then ack)
//!  ├───▶ history_service (history, rollback, resume, sweep confirm) ──▶ publish
//!  ├───▶ refusals (HAProxy refused a version → quarantine its Ingresses)
//!  └───▶ checkpointer (desired state → object store, and back into an empty store)
//! ```

pub mod args;
pub mod checkpointer;
pub mod history_service;
pub mod intake;
pub mod publish;
pub mod refusals;
pub mod run;
