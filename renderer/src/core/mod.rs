//! Pure decisions: from route messages to desired state, to a render model, to config text
//! and map files, to a new version or none. No sled, no NATS, no clock (time is a parameter).

pub mod certs;
pub mod checkpoint;
pub mod filters;
pub mod groups;
pub mod maps;
pub mod model;
pub mod par;
pub mod quarantine;
pub mod render;
pub mod restatement;
pub mod settings;
pub mod snapshots;
pub mod state;
pub mod versions;
