//! One module per task of the operator's.

pub mod deadletter;
pub mod docs;
pub mod fleets;
pub mod history;
pub mod keygen;
pub mod permissions;
pub mod replay;
pub mod status;
