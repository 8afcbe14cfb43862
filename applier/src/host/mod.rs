//! The host side of the applier: what the applier asks of a HAProxy host, what runs there and
//! how its answers read.
//!
//! ```text
//! rollout, drift ──ops::HostOps / ops::Hosts (typed)──▶ ssh (scripts over a pooled connection)
//!                                                   └──▶ fake (in memory, for tests)
//! scripts/*.sh ──include_str!──▶ scripts (one Script per operation) ──ssh──▶ host
//!                                                                              │ stdout, exit code
//! ssh ◀── typed values ◀── answer (the one reader of every answer) ◀───────────┘
//! ```

pub mod answer;
pub mod conn;
#[cfg(test)]
pub mod fake;
pub mod ops;
pub mod scripts;
pub mod ssh;

pub use ops::{Failure, HostOps, Hosts};
