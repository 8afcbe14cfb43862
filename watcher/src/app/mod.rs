//! Wiring: the watcher's run loop and the effects around the pure steps of [`crate::core`].

pub mod args;
pub mod effects;
pub mod notices;
pub mod run;
pub mod snapshot;
pub mod state;
