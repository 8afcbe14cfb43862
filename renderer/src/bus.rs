//! NATS adapter of the renderer: its routes consumer and config publishing. Connection, streams
//! and publishing come from `hafleet_runtime`.

use async_nats::jetstream::{self, consumer::pull, stream};
pub use hafleet_runtime::nats::{Bus, BusError};
use std::time::Duration;

/// The renderer's durable consumer of every route message, positioned just after `applied_seq`,
/// the last sequence whose effect the renderer's store holds.
///
/// The store, not the consumer, is the source of truth for the position: state and sequence
/// commit in one transaction. So at start-up the consumer is re-created at that position; what
/// a previous run had in flight but never committed comes again, in order.
pub async fn routes_consumer(
    bus: &Bus,
    applied_seq: u64,
) -> Result<(stream::Stream, jetstream::consumer::Consumer<pull::Config>), BusError> {
    let stream = bus.ensure_stream(hafleet_proto::ROUTES).await?;
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

/// The newest version number published on `fleet`'s configs subject (0: none).
pub async fn latest_published_number(
    bus: &Bus,
    fleet: &hafleet_proto::FleetName,
) -> Result<u64, BusError> {
    let failed = |e: Box<dyn std::error::Error + Send + Sync>| BusError::Stream {
        name: hafleet_proto::CONFIGS_STREAM,
        source: e,
    };
    let stream =
        bus.js.get_stream(hafleet_proto::CONFIGS_STREAM).await.map_err(|e| failed(Box::new(e)))?;
    let subject = hafleet_proto::configs_subject(fleet);
    match stream.get_last_raw_message_by_subject(&subject).await {
        Ok(m) => {
            #[derive(serde::Deserialize)]
            struct Number {
                version: u64,
            }
            Ok(serde_json::from_slice::<Number>(&m.payload).map(|n| n.version).unwrap_or(0))
        }
        Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(0),
        Err(e) => Err(failed(Box::new(e))),
    }
}
