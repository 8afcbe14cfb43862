//! Pure decisions: which hosts and how ([`inventory`]), waves and what the master CLI says
//! ([`plan`]), what a change takes through the runtime API or a reload ([`runtime_api`]), a
//! file sent as an edit of the host's ([`patch`]), and the fleet's TLS identity that opens
//! the version's sealed keys ([`identity`]).

pub mod identity;
pub mod inventory;
pub mod patch;
pub mod plan;
pub mod runtime_api;
