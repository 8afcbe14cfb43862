//! NATS adapter of the applier: the fleet's config consumer, the newest version, and reports.
//! Connection, streams and publishing come from `hafleet_runtime`.

use async_nats::jetstream::{self, consumer::pull, stream};
use hafleet_proto::{ApplyReport, ConfigVersion, FleetName};
pub use hafleet_runtime::nats::{Bus, BusError};
use std::time::Duration;

/// How long JetStream waits for an ack before delivering a version again.
pub const ACK_WAIT: Duration = Duration::from_secs(60);

/// The configuration the fleet's durable consumer must have.
fn consumer_config(fleet: &FleetName) -> pull::Config {
    let name = hafleet_proto::applier_consumer(fleet);
    pull::Config {
        durable_name: Some(name),
        filter_subject: hafleet_proto::configs_subject(fleet),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        // Rollouts send progress acks, so this only bounds how long a crashed applier's
        // message waits before it is delivered again.
        ack_wait: ACK_WAIT,
        max_ack_pending: 100,
        ..Default::default()
    }
}

/// What of `found` differs from what the applier relies on (`want`); empty: nothing.
fn consumer_drift(want: &pull::Config, found: &jetstream::consumer::Config) -> Vec<String> {
    let mut drift = Vec::new();
    if found.filter_subject != want.filter_subject || !found.filter_subjects.is_empty() {
        drift.push(format!("filter {:?}, not {:?}", found.filter_subject, want.filter_subject));
    }
    if found.ack_policy != want.ack_policy {
        drift.push(format!("ack policy {:?}", found.ack_policy));
    }
    if found.ack_wait != want.ack_wait {
        drift.push(format!("ack wait {:?}, not {:?}", found.ack_wait, want.ack_wait));
    }
    if found.max_ack_pending != want.max_ack_pending {
        drift.push(format!("max ack pending {}", found.max_ack_pending));
    }
    if found.deliver_policy != want.deliver_policy {
        drift.push(format!("deliver policy {:?}", found.deliver_policy));
    }
    // Unlimited is 0 in a request and -1 in the server's answer.
    let unlimited = |n: i64| if n <= 0 { -1 } else { n };
    if unlimited(found.max_deliver) != unlimited(want.max_deliver)
        || found.rate_limit != want.rate_limit
    {
        drift.push("delivery limits".to_owned());
    }
    drift
}

/// The fleet's durable consumer of `hafleet.configs.<fleet>`, as the applier relies on it: one
/// that someone changed (another filter, an ack policy, limits) is put right, and one that
/// cannot be (a deliver policy JetStream does not let change) refuses the start with what to do.
pub async fn configs_consumer(
    stream: &stream::Stream,
    fleet: &FleetName,
) -> Result<jetstream::consumer::Consumer<pull::Config>, BusError> {
    let want = consumer_config(fleet);
    let name = hafleet_proto::applier_consumer(fleet);
    let failed = |e: Box<dyn std::error::Error + Send + Sync>| BusError::Consumer {
        name: name.clone(),
        source: e,
    };
    let create = || stream.get_or_create_consumer(&name, want.clone());
    let mut consumer =
        hafleet_runtime::nats::retrying("JetStream to create the fleet's consumer", create)
            .await
            .map_err(|e| failed(Box::new(e)))?;
    let drift = consumer_drift(&want, &consumer.cached_info().config);
    if !drift.is_empty() {
        tracing::warn!(consumer = %name, drift = %drift.join(", "), "the fleet's consumer was changed; putting it right");
        consumer = stream.update_consumer(want.clone()).await.map_err(|e| {
            failed(
                format!(
                    "it was changed ({}) and cannot be put right ({e}); delete it (nats consumer \
                     rm {} {name}) and start the applier again",
                    drift.join(", "),
                    hafleet_proto::CONFIGS_STREAM
                )
                .into(),
            )
        })?;
        let left = consumer_drift(&want, &consumer.cached_info().config);
        if !left.is_empty() {
            return Err(failed(
                format!("still differs after an update: {}", left.join(", ")).into(),
            ));
        }
    }
    Ok(consumer)
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
