//! Wiring: the run loop that takes each version and rolls it out ([`run`]).

pub mod run;
