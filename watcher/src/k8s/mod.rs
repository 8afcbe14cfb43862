//! Kubernetes adapters: [`watch`] (reflectors: the caches a pass reads), [`events`] (Warning
//! Events and Ingress status written back) and [`elector`] (leader election on a Lease).

pub mod elector;
pub mod events;
pub mod watch;
