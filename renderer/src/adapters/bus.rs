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
    let create = || {
        stream.create_consumer(pull::Config {
            durable_name: Some(name.to_owned()),
            deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: applied_seq + 1,
            },
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(60),
            max_ack_pending: 10_000,
            ..Default::default()
        })
    };
    let consumer =
        hafleet_runtime::nats::retrying("JetStream to create the renderer's consumer", create)
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
    Ok(stream_message(stream, hafleet_proto::ROUTES_STREAM, seq).await?.map(|m| m.payload))
}

/// Message `seq` of `stream` (named `name` in errors), headers and all; `None` if the stream
/// does not hold it (deleted, aged out, never was).
pub async fn stream_message(
    stream: &stream::Stream,
    name: &'static str,
    seq: u64,
) -> Result<Option<jetstream::message::StreamMessage>, BusError> {
    use async_nats::jetstream::stream::RawMessageErrorKind;
    match stream.get_raw_message(seq).await {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(BusError::Stream { name, source: Box::new(e) }),
    }
}

/// Message `seq` of the dead-letter stream; `None` if there is none.
pub async fn deadletter_message(
    bus: &Bus,
    seq: u64,
) -> anyhow::Result<Option<jetstream::message::StreamMessage>> {
    use anyhow::Context as _;
    let name = hafleet_proto::DEADLETTER_STREAM;
    let stream = bus.js.get_stream(name).await.context("no dead-letter stream")?;
    Ok(stream_message(&stream, name, seq).await?)
}

/// The newest version published on `fleet`'s configs subject: its number (0: none) and the
/// routes it serves (`None`: none, or a version of an older renderer that did not say).
pub async fn latest_published(
    bus: &Bus,
    fleet: &hafleet_proto::FleetName,
) -> Result<Published, BusError> {
    let failed = |e: Box<dyn std::error::Error + Send + Sync>| BusError::Stream {
        name: hafleet_proto::CONFIGS_STREAM,
        source: e,
    };
    let stream =
        bus.js.get_stream(hafleet_proto::CONFIGS_STREAM).await.map_err(|e| failed(Box::new(e)))?;
    let subject = hafleet_proto::configs_subject(fleet);
    match stream.get_last_raw_message_by_subject(&subject).await {
        Ok(m) => Ok(serde_json::from_slice::<Published>(&m.payload).unwrap_or_default()),
        Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {
            Ok(Published::default())
        }
        Err(e) => Err(failed(Box::new(e))),
    }
}

/// What [`latest_published`] reads of a version.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct Published {
    #[serde(rename = "version")]
    pub number: u64,
    #[serde(default)]
    pub routes: Option<u64>,
}

/// How long and how much a stream keeps (`0`: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub max_age: Duration,
    pub max_bytes: u64,
}

/// Sets the retention of a stream the renderer owns (routes, configs) to what its flags say,
/// updating the stream if it was created with other limits (by another component, or by a
/// renderer run with other flags). Returns the stream.
pub async fn ensure_retention(
    bus: &Bus,
    spec: hafleet_proto::StreamSpec,
    retention: Retention,
) -> Result<stream::Stream, BusError> {
    let stream = bus.ensure_stream(spec).await?;
    let failed = |e: Box<dyn std::error::Error + Send + Sync>| BusError::Stream {
        name: spec.name,
        source: e,
    };
    // As `ensure_stream` just read it: no second request.
    let info = stream.cached_info().clone();
    let max_bytes = if retention.max_bytes == 0 { -1 } else { retention.max_bytes as i64 };
    if info.config.max_age != retention.max_age || info.config.max_bytes != max_bytes {
        let mut config = info.config.clone();
        config.max_age = retention.max_age;
        config.max_bytes = max_bytes;
        hafleet_runtime::nats::retrying("JetStream to set the stream's retention", || {
            bus.js.update_stream(config.clone())
        })
        .await
        .map_err(|e| failed(Box::new(e)))?;
        tracing::info!(stream = spec.name, max_age = ?retention.max_age, max_bytes = retention.max_bytes,
                       "stream retention set");
    }
    Ok(stream)
}

/// What the routes stream holds now.
#[derive(Debug, Clone)]
pub struct RoutesBounds {
    /// Its first kept sequence (`last + 1` when it holds nothing).
    pub first: u64,
    pub last: u64,
    /// When it was created, as the store records it.
    pub created: String,
    /// Before this time no event can be placed any more: the stream dropped the messages
    /// before `first` (the oldest kept message's time, or the last one's when it holds none).
    /// `None` while the stream still starts at its beginning.
    pub horizon: Option<time::OffsetDateTime>,
}

pub async fn routes_bounds(bus: &Bus) -> anyhow::Result<RoutesBounds> {
    use anyhow::Context as _;
    let mut stream = bus
        .js
        .get_stream(hafleet_proto::ROUTES_STREAM)
        .await
        .context("cannot open the routes stream")?;
    let info = stream.info().await.context("cannot read the routes stream's state")?;
    let state = &info.state;
    let oldest = if state.messages > 0 { state.first_timestamp } else { state.last_timestamp };
    let horizon = (state.first_sequence > 1).then_some(oldest);
    Ok(RoutesBounds {
        first: state.first_sequence,
        last: state.last_sequence,
        created: info.created.unix_timestamp_nanos().to_string(),
        horizon,
    })
}

/// The checkpoint bucket; created when `create` (the renderer), else `None` if it does not
/// exist yet (an operator's read).
pub async fn checkpoint_store(
    bus: &Bus,
    create: bool,
) -> anyhow::Result<Option<jetstream::object_store::ObjectStore>> {
    use anyhow::Context as _;
    let bucket = hafleet_proto::CHECKPOINTS_BUCKET;
    if let Ok(store) = bus.js.get_object_store(bucket).await {
        return Ok(Some(store));
    }
    if !create {
        return Ok(None);
    }
    let store = bus
        .js
        .create_object_store(jetstream::object_store::Config {
            bucket: bucket.to_owned(),
            description: Some("hafleet desired-state checkpoints of the routes stream".into()),
            storage: stream::StorageType::File,
            num_replicas: bus.replicas,
            ..Default::default()
        })
        .await
        .with_context(|| format!("cannot create object store bucket {bucket}"))?;
    Ok(Some(store))
}

/// Sequences of the stored checkpoints, oldest first.
pub async fn list_checkpoints(
    store: &jetstream::object_store::ObjectStore,
) -> anyhow::Result<Vec<u64>> {
    use anyhow::Context as _;
    use futures::StreamExt as _;
    let mut list = store.list().await.context("cannot list checkpoints")?;
    let mut out = Vec::new();
    while let Some(info) = list.next().await {
        let info = info.context("cannot list checkpoints")?;
        if let Some(seq) = crate::core::checkpoint::parse_object_name(&info.name) {
            out.push(seq);
        }
    }
    out.sort_unstable();
    Ok(out)
}

pub async fn get_checkpoint(
    store: &jetstream::object_store::ObjectStore,
    seq: u64,
) -> anyhow::Result<crate::core::checkpoint::Checkpoint> {
    use anyhow::Context as _;
    use tokio::io::AsyncReadExt as _;
    let name = crate::core::checkpoint::object_name(seq);
    let mut object =
        store.get(&name).await.with_context(|| format!("cannot read checkpoint {name}"))?;
    let mut bytes = Vec::new();
    object
        .read_to_end(&mut bytes)
        .await
        .with_context(|| format!("cannot read checkpoint {name}"))?;
    crate::core::checkpoint::Checkpoint::decode(&bytes)
        .with_context(|| format!("checkpoint {name}"))
}

pub async fn put_checkpoint(
    store: &jetstream::object_store::ObjectStore,
    checkpoint: &crate::core::checkpoint::Checkpoint,
) -> anyhow::Result<usize> {
    use anyhow::Context as _;
    let name = crate::core::checkpoint::object_name(checkpoint.seq);
    let bytes = checkpoint.encode();
    store
        .put(name.as_str(), &mut bytes.as_slice())
        .await
        .with_context(|| format!("cannot store checkpoint {name}"))?;
    Ok(bytes.len())
}

pub async fn delete_checkpoint(
    store: &jetstream::object_store::ObjectStore,
    seq: u64,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let name = crate::core::checkpoint::object_name(seq);
    store.delete(&name).await.with_context(|| format!("cannot delete checkpoint {name}"))
}
