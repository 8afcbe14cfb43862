//! The operator's commands: what each host runs ([`status`]) and the NATS permissions of a
//! fleet's applier ([`permissions`]).

pub mod permissions;
pub mod status;
