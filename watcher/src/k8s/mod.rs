//! Kubernetes adapters: [`watch`] (reflectors and Warning Events) and [`elector`] (leader
//! election on a Lease).

pub mod elector;
pub mod watch;
