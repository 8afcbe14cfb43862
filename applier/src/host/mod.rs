//! The host side of the applier: what runs on a HAProxy host and how its answers read.
//!
//! ```text
//! scripts/*.sh ──include_str!──▶ scripts (one Script per operation) ──ssh──▶ host
//!                                                                              │ stdout, exit code
//! rollout, drift ◀── typed values ◀── answer (the one reader of every answer) ◀┘
//! ```

pub mod answer;
pub mod scripts;
