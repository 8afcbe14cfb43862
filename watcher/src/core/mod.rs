//! Pure decisions: from Kubernetes objects to validated routes, to what to publish and what
//! to tell. No API server, no NATS; the clock is a parameter.

pub mod annotations;
pub mod churn;
pub mod feedback;
pub mod fleet_settings;
pub mod gateway;
pub mod index;
pub mod model;
pub mod pass;
pub mod pods;
pub mod policy;
pub mod resolve;
pub mod route_events;
pub mod served;
pub mod status;
pub mod tenancy;
pub mod tls_secrets;
