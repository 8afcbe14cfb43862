//! NATS JetStream adapter: the fleet's config consumer and apply reports.

use async_nats::jetstream::{self, consumer::pull, stream};
use hafleet_proto::{
    ApplyReport, ConfigVersion, FleetName, MSG_ID_HEADER, SCHEMA_HEADER, StreamSpec,
};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("cannot connect to NATS at {url}")]
    Connect { url: String, source: async_nats::ConnectError },
    #[error("cannot create or open stream {name}")]
    Stream { name: &'static str, source: Box<dyn std::error::Error + Send + Sync> },
    #[error("cannot create or open consumer {name}")]
    Consumer { name: String, source: Box<dyn std::error::Error + Send + Sync> },
    #[error("publishing the report of {host} for version {version} failed")]
    ReportFailed { host: String, version: u64, source: Box<dyn std::error::Error + Send + Sync> },
}

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

/// The fleet's durable consumer of `hafleet.configs.<fleet>`.
pub async fn configs_consumer(
    js: &jetstream::Context,
    fleet: &FleetName,
) -> Result<jetstream::consumer::Consumer<pull::Config>, BusError> {
    let stream = ensure_stream(js, hafleet_proto::CONFIGS).await?;
    let name = hafleet_proto::applier_consumer(fleet);
    stream
        .get_or_create_consumer(
            &name,
            pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: hafleet_proto::configs_subject(fleet),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                // Rollouts send progress acks, so this only bounds how long a crashed applier's
                // message waits before it is delivered again.
                ack_wait: ACK_WAIT,
                max_ack_pending: 100,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| BusError::Consumer { name, source: Box::new(e) })
}

/// How long JetStream waits for an ack before delivering a version again.
pub const ACK_WAIT: Duration = Duration::from_secs(60);

/// The newest version published for `fleet`, read straight from the stream.
pub async fn latest_version(
    js: &jetstream::Context,
    fleet: &FleetName,
) -> Result<Option<ConfigVersion>, BusError> {
    let stream = ensure_stream(js, hafleet_proto::CONFIGS).await?;
    let subject = hafleet_proto::configs_subject(fleet);
    match stream.get_last_raw_message_by_subject(&subject).await {
        Ok(m) => match ConfigVersion::decode(&m.payload) {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                tracing::error!(error = %e, "newest config message is unreadable");
                Ok(None)
            }
        },
        Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => {
            Err(BusError::Stream { name: hafleet_proto::CONFIGS_STREAM, source: Box::new(e) })
        }
    }
}

pub async fn publish_report(js: &jetstream::Context, report: &ApplyReport) -> Result<(), BusError> {
    let failed = |e: Box<dyn std::error::Error + Send + Sync>| BusError::ReportFailed {
        host: report.host.to_string(),
        version: report.version,
        source: e,
    };
    let mut headers = async_nats::HeaderMap::new();
    let id =
        format!("{}-{}-v{}-{}", report.fleet, report.host, report.version, report.finished_unix_ms);
    headers.insert(MSG_ID_HEADER, id.as_str());
    headers.insert(SCHEMA_HEADER, hafleet_proto::SCHEMA_VERSION.to_string().as_str());
    js.publish_with_headers(
        hafleet_proto::reports_subject(&report.fleet, &report.host),
        headers,
        report.encode().into(),
    )
    .await
    .map_err(|e| failed(Box::new(e)))?
    .await
    .map_err(|e| failed(Box::new(e)))?;
    Ok(())
}
