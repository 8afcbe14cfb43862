//! Adapters: the renderer's I/O. [`store`] is sled (the desired state's journal and every
//! version), [`bus`] is NATS (the routes consumer, publishing, checkpoints).

pub mod bus;
pub mod store;
