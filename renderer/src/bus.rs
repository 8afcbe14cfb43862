//! NATS JetStream adapter: the routes consumer and config publishing.

use async_nats::jetstream::{self, consumer::pull, stream};
use hafleet_proto::{ConfigVersion, MSG_ID_HEADER, SCHEMA_HEADER, StreamSpec};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("cannot connect to NATS at {url}")]
    Connect { url: String, source: async_nats::ConnectError },
    #[error("cannot create or open stream {name}")]
    Stream { name: &'static str, source: Box<dyn std::error::Error + Send + Sync> },
    #[error("cannot create or open consumer {name}")]
    Consumer { name: String, source: Box<dyn std::error::Error + Send + Sync> },
    #[error("publishing version {version} of fleet {fleet} failed")]
    PublishFailed { fleet: String, version: u64, source: Box<dyn std::error::Error + Send + Sync> },
    #[error(
        "version {version} of fleet {fleet} is {size} bytes, more than NATS accepts ({max}); \
         raise max_payload on the server"
    )]
    TooLarge { fleet: String, version: u64, size: usize, max: usize },
}

/// Creates the stream if it does not exist. Every component calls this for the streams it
/// touches, so they can start in any order.
pub async fn ensure_stream(
    js: &jetstream::Context,
    spec: StreamSpec,
) -> Result<stream::Stream, BusError> {
    js.get_or_create_stream(stream::Config {
        name: spec.name.to_owned(),
        subjects: vec![spec.subjects.to_owned()],
        max_age: spec.max_age_secs.map(Duration::from_secs).unwrap_or_default(),
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .map_err(|e| BusError::Stream { name: spec.name, source: Box::new(e) })
}

/// The renderer's durable consumer of every route message, positioned just after `applied_seq`,
/// the last sequence whose effect the renderer's store holds.
///
/// The store, not the consumer, is the source of truth for the position: state and sequence
/// commit in one transaction. So at start-up the consumer is re-created at that position; what
/// a previous run had in flight but never committed comes again, in order.
pub async fn routes_consumer(
    js: &jetstream::Context,
    applied_seq: u64,
) -> Result<(stream::Stream, jetstream::consumer::Consumer<pull::Config>), BusError> {
    let stream = ensure_stream(js, hafleet_proto::ROUTES).await?;
    let name = hafleet_proto::RENDERER_CONSUMER;
    let failed = |e: Box<dyn std::error::Error + Send + Sync>| BusError::Consumer {
        name: name.to_owned(),
        source: e,
    };
    if stream.consumer_info(name).await.is_ok() {
        stream.delete_consumer(name).await.map_err(|e| failed(Box::new(e)))?;
    }
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(name.to_owned()),
            deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: applied_seq + 1,
            },
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(60),
            max_ack_pending: 10_000,
            ..Default::default()
        })
        .await
        .map_err(|e| failed(Box::new(e)))?;
    Ok((stream, consumer))
}

/// Reads one message of the routes stream by sequence, to fill a gap in what the consumer
/// delivered (a delivery lost on a reconnect comes back only after `ack_wait`, too late to be
/// applied in order). `None` if the stream no longer holds it.
pub async fn routes_message(
    stream: &stream::Stream,
    seq: u64,
) -> Result<Option<bytes::Bytes>, BusError> {
    use async_nats::jetstream::stream::RawMessageErrorKind;
    match stream.get_raw_message(seq).await {
        Ok(m) => Ok(Some(m.payload)),
        Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(BusError::Stream { name: hafleet_proto::ROUTES_STREAM, source: Box::new(e) }),
    }
}

/// Publishes a version and waits for JetStream's ack. The message id makes a retry after a
/// crash a no-op inside the duplicate window.
pub async fn publish_version(
    client: &async_nats::Client,
    js: &jetstream::Context,
    v: &ConfigVersion,
) -> Result<(), BusError> {
    let payload = v.encode();
    let max = client.server_info().max_payload;
    if payload.len() > max {
        return Err(BusError::TooLarge {
            fleet: v.fleet.to_string(),
            version: v.version,
            size: payload.len(),
            max,
        });
    }
    let failed = |e: Box<dyn std::error::Error + Send + Sync>| BusError::PublishFailed {
        fleet: v.fleet.to_string(),
        version: v.version,
        source: e,
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(MSG_ID_HEADER, format!("{}-v{}", v.fleet, v.version).as_str());
    headers.insert(SCHEMA_HEADER, hafleet_proto::SCHEMA_VERSION.to_string().as_str());
    js.publish_with_headers(hafleet_proto::configs_subject(&v.fleet), headers, payload.into())
        .await
        .map_err(|e| failed(Box::new(e)))?
        .await
        .map_err(|e| failed(Box::new(e)))?;
    Ok(())
}
