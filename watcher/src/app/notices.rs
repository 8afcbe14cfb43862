//! Notices from the fleets: reads their config versions and apply reports from NATS and posts
//! what [`crate::core::feedback::Feedback`] makes of them on the Ingresses in the watcher's
//! cache. Runs on the leader only; ends with an error if NATS stops delivering (the caller
//! starts it again).

use crate::core::feedback::Feedback;
use crate::core::served::Fleets;
use crate::k8s::events::Warnings;
use anyhow::Context as _;
use async_nats::jetstream::consumer::{DeliverPolicy, push};
use futures::StreamExt as _;
use hafleet_proto::{ApplyReport, ConfigVersion, IngressKey};
use k8s_openapi::api::networking::v1::Ingress;
use kube::runtime::reflector::{ObjectRef, Store};

async fn ordered(
    bus: &hafleet_runtime::nats::Bus,
    stream: &str,
    filter: &str,
    deliver_policy: DeliverPolicy,
) -> anyhow::Result<push::Ordered> {
    let stream =
        bus.js.get_stream(stream).await.with_context(|| format!("cannot open stream {stream}"))?;
    let consumer = bus.ordered(&stream, filter, deliver_policy).await?;
    consumer.messages().await.context("cannot read")
}

/// When this process started telling: reports and versions since are fresh, across restarts
/// of [`run`].
static STARTED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Posts what the fleets' reports tell, until NATS stops delivering.
///
/// `feedback` outlives a restart of this function, so what was told is not told again.
/// A report is taken only from its own subject (`hafleet.reports.<fleet>.<host>`, which
/// only that fleet's applier may publish on): one fleet's applier cannot speak for another.
pub(crate) async fn run(
    bus: hafleet_runtime::nats::Bus,
    ingresses: Store<Ingress>,
    warnings: Warnings,
    (feedback, fleets, served): (&mut Feedback, &mut Fleets, &super::state::Served),
) -> anyhow::Result<()> {
    let started = *STARTED.get_or_init(hafleet_runtime::now_unix_ms);
    // Versions published since this leader started (not only from now: the stream may not
    // have existed at the first try).
    let since = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(started) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let mut versions = ordered(
        &bus,
        hafleet_proto::CONFIGS_STREAM,
        hafleet_proto::CONFIGS_SUBJECTS,
        DeliverPolicy::ByStartTime { start_time: since },
    )
    .await?;
    // Each host's last report first: which hosts each fleet has.
    let mut reports = ordered(
        &bus,
        hafleet_proto::REPORTS_STREAM,
        hafleet_proto::REPORTS_SUBJECTS,
        DeliverPolicy::LastPerSubject,
    )
    .await?;
    loop {
        let notices = tokio::select! {
            m = versions.next() => {
                let m = m.context("configs stream ended")?.context("configs stream")?;
                match ConfigVersion::decode(&m.payload) {
                    Ok(v) => {
                        fleets.on_version(&v);
                        feedback.on_version(&v)
                    }
                    Err(_) => continue,
                }
            }
            m = reports.next() => {
                let m = m.context("reports stream ended")?.context("reports stream")?;
                match ApplyReport::decode(&m.payload) {
                    Ok(r) if m.subject.as_str()
                        == hafleet_proto::reports_subject(&r.fleet, &r.host) =>
                    {
                        fleets.on_report(&r);
                        feedback.on_report(&r, r.finished_unix_ms >= started)
                    }
                    _ => continue,
                }
            }
        };
        // What each fleet serves, for the Gateways' status: the passes are woken on a change.
        let now = fleets.all();
        {
            let mut shared = served.fleets.lock().unwrap_or_else(|p| p.into_inner());
            if *shared != now {
                *shared = now;
                served.changed.notify_one();
            }
        }
        for notice in notices {
            // HTTPRoutes are told through their status, not Events, so far.
            for key in notice.ingresses.iter().filter(|k| k.kind.is_ingress()) {
                if let Some(ingress) = ingresses.get(&object_ref(key)) {
                    // Feedback is rate-limited and best effort: a lost one is not repeated.
                    let _ = warnings
                        .post(&*ingress, notice.warning, notice.reason, notice.note.clone())
                        .await;
                }
            }
        }
    }
}

fn object_ref(key: &IngressKey) -> ObjectRef<Ingress> {
    ObjectRef::new(key.name.as_str()).within(key.namespace.as_str())
}
