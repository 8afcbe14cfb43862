//! NATS JetStream adapter: publishing route messages.

use async_nats::jetstream::{self, stream};
use hafleet_proto::{MSG_ID_HEADER, RouteMessage, SCHEMA_HEADER, StreamSpec};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("cannot connect to NATS at {url}")]
    Connect { url: String, source: async_nats::ConnectError },
    #[error("cannot create or open stream {name}")]
    Stream { name: &'static str, source: Box<dyn std::error::Error + Send + Sync> },
    #[error("publishing to {subject} failed")]
    PublishFailed { subject: String, source: Box<dyn std::error::Error + Send + Sync> },
}

pub async fn ensure_stream(js: &jetstream::Context, spec: StreamSpec) -> Result<(), BusError> {
    js.get_or_create_stream(stream::Config {
        name: spec.name.to_owned(),
        subjects: vec![spec.subjects.to_owned()],
        max_age: spec.max_age_secs.map(Duration::from_secs).unwrap_or_default(),
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .map_err(|e| BusError::Stream { name: spec.name, source: Box::new(e) })?;
    Ok(())
}

/// Publishes and waits for JetStream's ack. `msg_id` makes a retried publish a no-op.
pub async fn publish(
    js: &jetstream::Context,
    subject: String,
    msg_id: &str,
    msg: &RouteMessage,
) -> Result<u64, BusError> {
    let failed = |subject: &str, e: Box<dyn std::error::Error + Send + Sync>| {
        BusError::PublishFailed { subject: subject.to_owned(), source: e }
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(MSG_ID_HEADER, msg_id);
    headers.insert(SCHEMA_HEADER, hafleet_proto::SCHEMA_VERSION.to_string().as_str());
    let ack = js
        .publish_with_headers(subject.clone(), headers, msg.encode().into())
        .await
        .map_err(|e| failed(&subject, Box::new(e)))?
        .await
        .map_err(|e| failed(&subject, Box::new(e)))?;
    Ok(ack.sequence)
}
