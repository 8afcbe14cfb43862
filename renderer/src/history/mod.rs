//! History: what versions a fleet had, why, and putting an older one back. [`service`] is
//! the renderer's side (answers over NATS from its store); [`cli`] is the operator's side; [`replay`] rebuilds a past config from the
//! routes stream on the operator's machine.

pub mod cli;
pub mod replay;
pub mod service;
