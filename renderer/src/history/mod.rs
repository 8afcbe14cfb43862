//! History: what versions a fleet had, why, and putting an older one back. [`service`] is
//! the renderer's side (answers over NATS from its store); [`cli`] is the operator's side.

pub mod cli;
pub mod service;
