//! Wiring: the renderer's run loop and the effects around the pure steps of [`crate::core`].

pub mod history_service;
pub mod publish;
pub mod run;
