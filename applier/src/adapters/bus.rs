//! NATS adapter of the applier: the fleet's config consumer, the newest version, and reports.
//! Connection, streams and publishing come from `hafleet_runtime`.

use async_nats::jetstream::{self, consumer::pull, stream};
use hafleet_proto::{ApplyReport, ConfigVersion, FleetName};
pub use hafleet_runtime::nats::{Bus, BusError};
use std::time::Duration;

/// How long JetStream waits for an ack before delivering a version again.
pub const ACK_WAIT: Duration = Duration::from_secs(60);

/// The fleet's durable consumer of `hafleet.configs.<fleet>`.
pub async fn configs_consumer(
    stream: &stream::Stream,
    fleet: &FleetName,
) -> Result<jetstream::consumer::Consumer<pull::Config>, BusError> {
    let name = hafleet_proto::applier_consumer(fleet);
    let create = || {
        stream.get_or_create_consumer(
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
    };
    hafleet_runtime::nats::retrying("JetStream to create the fleet's consumer", create)
        .await
        .map_err(|e| BusError::Consumer { name: name.clone(), source: Box::new(e) })
}

/// The newest version published for `fleet`, read straight from the stream by its subject (a
/// direct get, which the fleet's NATS user may do for its own subject only).
pub async fn latest_version(
    stream: &stream::Stream,
    fleet: &FleetName,
) -> Result<Option<ConfigVersion>, BusError> {
    let subject = hafleet_proto::configs_subject(fleet);
    match stream.direct_get_last_for_subject(&subject).await {
        Ok(m) => match ConfigVersion::decode(&m.payload) {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                tracing::error!(error = %e, "newest config message is unreadable");
                Ok(None)
            }
        },
        Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => Ok(None),
        Err(e) => {
            Err(BusError::Stream { name: hafleet_proto::CONFIGS_STREAM, source: Box::new(e) })
        }
    }
}

/// Publishes one host's report.
pub async fn publish_report(bus: &Bus, report: &ApplyReport) -> Result<(), BusError> {
    let id =
        format!("{}-{}-v{}-{}", report.fleet, report.host, report.version, report.finished_unix_ms);
    let subject = hafleet_proto::reports_subject(&report.fleet, &report.host);
    bus.publish(subject, &id, report.encode()).await?;
    Ok(())
}
