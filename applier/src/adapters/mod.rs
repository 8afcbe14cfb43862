//! What the applier reaches besides its hosts: NATS ([`bus`]) and the HTTP probes that
//! check a host after a change ([`probe`]).

pub mod bus;
pub mod probe;
