//! Wiring: the run loop that takes each version and rolls it out ([`run`]), and the inventory
//! re-read without a restart ([`inventory_watch`]).

pub mod inventory_watch;
pub mod run;
