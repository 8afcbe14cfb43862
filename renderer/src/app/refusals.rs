//! Refusals: reading the reports of versions `haproxy -c` refused and publishing the
//! quarantines of the Ingresses that made them. The I/O around the pure
//! [`crate::core::quarantine::trace`].

use crate::adapters::store::Store;
use crate::core::quarantine::{Traced, trace};
use crate::core::state::Desired;
use anyhow::Context as _;
use async_nats::jetstream::consumer::DeliverPolicy;
use futures::StreamExt as _;
use hafleet_proto::{ApplyOutcome, ApplyReport, ApplyStage, FleetName, Quarantine};
use hafleet_runtime::nats::Bus;
use std::collections::BTreeSet;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

/// Reports of versions `haproxy -c` refused, from every fleet's hosts: each host's last
/// report first (a refusal while the renderer was down is still seen), then as they come.
/// Read again after any error, every 5 s (the stream may not exist yet).
pub fn refusals(bus: Bus) -> mpsc::Receiver<ApplyReport> {
    let (tx, rx) = mpsc::channel(64);
    let span = tracing::info_span!("refusals");
    tokio::spawn(tracing::Instrument::instrument(
        async move {
            loop {
                if let Err(e) = read(&bus, &tx).await {
                    debug!(error = %format!("{e:#}"), "reading the reports stopped; again in 5 s");
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
        },
        span,
    ));
    rx
}

async fn read(bus: &Bus, tx: &mpsc::Sender<ApplyReport>) -> anyhow::Result<()> {
    let stream = bus
        .js
        .get_stream(hafleet_proto::REPORTS_STREAM)
        .await
        .context("cannot open the reports stream")?;
    let consumer = bus
        .ordered(&stream, hafleet_proto::REPORTS_SUBJECTS, DeliverPolicy::LastPerSubject)
        .await?;
    let mut messages = consumer.messages().await.context("cannot read the reports")?;
    while let Some(m) = messages.next().await {
        let m = m.context("reports stream")?;
        let Ok(r) = ApplyReport::decode(&m.payload) else { continue };
        // Only a fleet's own applier may publish on its subjects.
        if m.subject.as_str() != hafleet_proto::reports_subject(&r.fleet, &r.host) {
            continue;
        }
        if matches!(r.outcome, ApplyOutcome::Failed { stage: ApplyStage::Validate, .. })
            && tx.send(r).await.is_err()
        {
            return Ok(());
        }
    }
    anyhow::bail!("reports stream ended")
}

/// Takes a refusal: if it is of its fleet's newest version (and the fleet is not pinned),
/// traces it and publishes the quarantine it calls for, once per version (`done`).
pub async fn take(
    bus: &Bus,
    store: &Store,
    desired: &Desired,
    report: &ApplyReport,
    done: &mut BTreeSet<(FleetName, u64)>,
) -> anyhow::Result<()> {
    let ApplyOutcome::Failed { message, .. } = &report.outcome else { return Ok(()) };
    let fleet = &report.fleet;
    let key = (fleet.clone(), report.version);
    if done.contains(&key) {
        return Ok(());
    }
    let latest = store.latest(fleet)?;
    let Some(version) = latest.filter(|v| v.version == report.version) else {
        return Ok(()); // an older version: a newer one is on its way or live
    };
    if store.pinned(fleet)?.is_some() || version.sha256 != report.sha256 {
        return Ok(());
    }
    let Some(bundle) = version.bundle() else {
        warn!(fleet = %fleet, version = version.version, "refused version not held whole; not traced");
        return Ok(());
    };
    done.insert(key);
    let ingresses = desired.ingresses(fleet);
    match trace(&bundle.config, message, ingresses) {
        Traced::Unexplained(why) => {
            warn!(fleet = %fleet, version = version.version, host = %report.host, %why,
                  "HAProxy refused the fleet's newest version and no Ingress explains it: the fleet halts until the template or the host is fixed");
        }
        Traced::Ingresses(culprits) => {
            let msg = hafleet_proto::RouteMessage::Quarantine(Quarantine {
                schema: hafleet_proto::PARTS_SCHEMA_VERSION,
                fleet: fleet.clone(),
                version: version.version,
                ingresses: culprits.clone(),
                message: hafleet_proto::quarantine::cut_message(&alerts_only(message)),
            });
            let id = format!("quarantine-{fleet}-{}", version.version);
            let subject = hafleet_proto::ROUTES_QUARANTINE_SUBJECT.to_owned();
            let seq = bus.publish(subject, &id, msg.encode()).await?;
            let names: Vec<String> = culprits.iter().map(|(k, _)| k.to_string()).collect();
            info!(fleet = %fleet, version = version.version, stream_seq = seq,
                  ingresses = %names.join(", "), "quarantined what HAProxy refused");
        }
    }
    Ok(())
}

/// HAProxy's alert lines (not its notices), which say what is wrong.
fn alerts_only(message: &str) -> String {
    let alerts: Vec<&str> = message.lines().filter(|l| l.contains("[ALERT]")).collect();
    match alerts.is_empty() {
        true => message.to_owned(),
        false => alerts.join("\n"),
    }
}
