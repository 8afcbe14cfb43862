//! Intake: route messages from the stream, in order and exactly once, applied to the desired
//! state ([`crate::core::state`]), rendered into versions ([`crate::core::versions`]) and
//! committed to the store. Unreadable messages are parked on the dead-letter subject.

use crate::adapters::bus;
use crate::adapters::store::Store;
use crate::core::render::Renderer;
use crate::core::state::{self, Applied};
use crate::core::versions::{Latest, next_version};
use anyhow::Context as _;
use async_nats::jetstream;
use hafleet_proto::{Cause, ConfigVersion, FleetName, RouteMessage};
use std::collections::BTreeMap;
use tracing::{error, info, warn};

/// Refuses to go on if the routes stream is not the one the store followed (NATS lost its
/// data and the stream was created anew): its sequences mean other messages now, and applying
/// "after" the stored sequence would silently skip or misapply changes.
pub(crate) fn check_same_stream(
    store: &Store,
    info: &async_nats::jetstream::stream::Info,
) -> anyhow::Result<()> {
    let applied = store.applied_seq()?;
    let created = info.created.unix_timestamp_nanos().to_string();
    let last = info.state.last_sequence;
    let advice = "Restore NATS's data, or start the renderer on an empty --data-dir to rebuild \
                  its state from the stream as it is now";
    match store.routes_stream_created()? {
        Some(known) if known != created => anyhow::bail!(
            "the routes stream was created anew ({created}; this store follows the one created \
             {known}). {advice}"
        ),
        Some(_) => {}
        None => store.set_routes_stream_created(&created)?,
    }
    anyhow::ensure!(
        last >= applied,
        "the routes stream ends at sequence {last} but this renderer's store has applied up to \
         {applied}: the stream was reset. {advice}"
    );
    Ok(())
}

/// The batch as (stream sequence, payload) with each one's subject, in sequence order, without what is already applied,
/// and with any sequence the consumer skipped read from the stream, so that events are applied
/// exactly once and in order whatever the deliveries did.
pub(crate) async fn fill_gaps(
    stream: &async_nats::jetstream::stream::Stream,
    applied: u64,
    batch: &[jetstream::Message],
) -> anyhow::Result<Entries> {
    let mut delivered: Vec<(u64, bytes::Bytes, async_nats::Subject)> = batch
        .iter()
        .filter_map(|m| match m.info() {
            Ok(info) => Some((info.stream_sequence, m.payload.clone(), m.subject.clone())),
            Err(e) => {
                warn!(error = %e, "message without JetStream metadata; skipped");
                None
            }
        })
        .filter(|(seq, _, _)| *seq > applied)
        .collect();
    delivered.sort_by_key(|(seq, _, _)| *seq);
    delivered.dedup_by_key(|(seq, _, _)| *seq);
    let mut entries = Entries::default();
    let mut next = applied + 1;
    for (seq, payload, subject) in delivered {
        while next < seq {
            match bus::stream_message(stream, hafleet_proto::ROUTES_STREAM, next).await? {
                Some(missing) => {
                    info!(seq = next, "filled a gap in deliveries from the stream");
                    entries.subjects.insert(next, missing.subject);
                    entries.messages.push((next, missing.payload));
                }
                None => warn!(seq = next, "route message no longer in the stream; skipped"),
            }
            next += 1;
        }
        entries.subjects.insert(seq, subject);
        entries.messages.push((seq, payload));
        next = seq + 1;
    }
    Ok(entries)
}

/// A batch's messages in sequence order, and the subject each came on.
#[derive(Debug, Default)]
pub(crate) struct Entries {
    pub messages: Vec<(u64, bytes::Bytes)>,
    pub subjects: std::collections::BTreeMap<u64, async_nats::Subject>,
}

/// Applies entries (in sequence order, all above the applied sequence) and commits them.
/// Returns the versions it made.
///
/// A message this build cannot read (not JSON, a schema it does not know, a value that fails
/// an allowlist) is parked on the dead-letter subject, with the reason and its sequence, before
/// anything is committed; the rest of the batch goes on. One bad message must not stop every
/// fleet behind it, and parked, it is not lost: an operator can read it back and, after an
/// upgrade, publish it again.
#[tracing::instrument(skip_all, fields(messages = batch.messages.len()))]
pub(crate) async fn process(
    bus: &bus::Bus,
    stream: &async_nats::jetstream::stream::Stream,
    store: &Store,
    renderer: &mut Renderer,
    desired: &mut state::Desired,
    guard: &state::SweepGuard,
    batch: &Entries,
) -> anyhow::Result<Vec<ConfigVersion>> {
    let mut last_seq = store.applied_seq()?;
    let mut out = Applied::default();
    let mut applied = 0u32;
    let entries = &batch.messages;
    for (seq, payload) in entries {
        let seq = *seq;
        let subject = batch.subjects.get(&seq).map_or("", |s| s.as_str());
        let msg = match RouteMessage::decode(payload) {
            Ok(msg) if !msg.on_its_subject(subject) => {
                let why = format!(
                    "a message of the renderer's own on {subject:?}, not {:?}: forged by \
                     someone who may publish route events; not applied",
                    msg.renderer_subject().unwrap_or_default()
                );
                error!(seq, subject, "{why}");
                park(bus, seq, payload, &why).await?;
                last_seq = last_seq.max(seq);
                continue;
            }
            Ok(msg) => msg,
            Err(e) => {
                park(bus, seq, payload, &e).await?;
                last_seq = last_seq.max(seq);
                continue;
            }
        };
        // A snapshot in parts reads them from this batch, or back from the stream.
        let read = async |part: u64| match crate::core::snapshots::in_batch(entries, part) {
            Some(bytes) => Ok(Some(bytes)),
            None => {
                let what = "the routes stream to read a snapshot's part";
                hafleet_runtime::nats::retrying(what, || bus::routes_message(stream, part)).await
            }
        };
        match crate::core::snapshots::whole(msg, read).await? {
            Ok(msg) => {
                applied += 1;
                state::apply(desired, seq, &msg, guard, &mut out)
            }
            Err(e) => {
                error!(seq, error = %e, "snapshot in parts cannot be made whole: nothing swept");
                park(bus, seq, payload, &e).await?
            }
        }
        last_seq = last_seq.max(seq);
    }
    hafleet_runtime::health::Health::global().count(
        ("hafleet_renderer_route_messages_total", "Route messages applied."),
        &[],
        f64::from(applied),
    );
    for (epoch, newest) in &out.fenced {
        warn!(epoch, newest, "route message of an older watcher ignored (a deposed leader?)");
    }
    hafleet_runtime::health::Health::global().count(
        ("hafleet_renderer_messages_fenced_total", "Route messages of an older watcher ignored."),
        &[],
        out.fenced.len() as f64,
    );
    report_holds(desired, &mut out);
    if out.render_changed
        && let Some(settings) = &desired.render
    {
        match Renderer::from_settings(settings) {
            Ok(new) => {
                info!(
                    template = &settings.template_sha256()[..12],
                    "rendering with the render settings the stream recorded"
                );
                *renderer = new;
            }
            Err(e) => {
                error!(error = %e, "the recorded render settings do not compile; rendering as before")
            }
        }
    }
    let floors = floors(bus, store, out.causes.keys()).await?;
    let versions = make_versions(store, renderer, desired, out.causes, &floors)?;
    let started = std::time::Instant::now();
    store.commit(&out.writes, &versions, last_seq)?;
    tracing::debug!(
        versions = versions.len(),
        commit_ms = started.elapsed().as_secs_f64() * 1e3,
        "state and versions committed"
    );
    Ok(versions)
}

/// Stamps new holds with the time, logs and counts every hold that began, changed or ended,
/// and adds the write that stores them.
fn report_holds(desired: &mut state::Desired, out: &mut Applied) {
    for (fleet, snapshot_seq) in &out.stale_confirms {
        warn!(fleet = %fleet, snapshot_seq, "sweep release for a hold that is no longer there; ignored");
    }
    if out.held_changed.is_empty() {
        return;
    }
    let now = hafleet_runtime::now_unix_ms();
    for hold in &out.held_changed {
        let (fleet, cluster) = hold;
        held_gauge(desired, fleet);
        let cluster = cluster.as_ref().map(|c| c.as_str());
        let held = desired.held.get_mut(hold);
        let count = held.as_ref().map_or(0, |h| h.ingresses.len());
        match held {
            Some(h) if h.since_unix_ms == 0 => {
                h.since_unix_ms = now;
                let routes: usize = h.ingresses.iter().map(|(_, n)| n).sum();
                error!(fleet = %fleet, cluster, snapshot_seq = h.snapshot_seq, ingresses = count,
                       routes, fleet_routes = h.fleet_routes,
                       "snapshot would withdraw too much of the fleet at once; held. Check the \
                        API server and the watcher, then `hafleet sweep status` and \
                        `sweep confirm` to withdraw them");
            }
            Some(h) => {
                info!(fleet = %fleet, cluster, snapshot_seq = h.snapshot_seq, ingresses = count,
                      "held sweep narrowed: Ingresses came back or were deleted")
            }
            None => info!(fleet = %fleet, cluster, "no sweep held any more"),
        }
    }
    out.writes.push(state::StateWrite::Held(desired.held.clone()));
}

/// Sets the metric of the Ingresses held sweeps keep in `fleet`.
pub(crate) fn held_gauge(desired: &state::Desired, fleet: &FleetName) {
    let count: usize = desired.held_in(fleet).map(|h| h.ingresses.len()).sum();
    const HELD: (&str, &str) = (
        "hafleet_renderer_sweep_held_ingresses",
        "Ingresses a held sweep keeps from being withdrawn, by fleet (0: none held).",
    );
    let labels = [("fleet", fleet.as_str())];
    hafleet_runtime::health::Health::global().gauge(HELD, &labels, count as f64);
}

/// Publishes an unreadable route message on the dead-letter subject.
async fn park(
    bus: &bus::Bus,
    seq: u64,
    payload: &bytes::Bytes,
    error: &dyn std::fmt::Display,
) -> anyhow::Result<()> {
    hafleet_runtime::health::Health::global().count(
        (
            "hafleet_renderer_messages_parked_total",
            "Route messages that could not be read, parked.",
        ),
        &[],
        1.0,
    );
    let reason: String = error.to_string().chars().filter(|c| !c.is_control()).take(500).collect();
    error!(seq, error = %reason, subject = hafleet_proto::ROUTES_DEADLETTER_SUBJECT,
           "route message cannot be read; parked on the dead-letter subject");
    let seq_text = seq.to_string();
    bus.publish_with_headers(
        hafleet_proto::ROUTES_DEADLETTER_SUBJECT.to_owned(),
        &format!("routes-{seq}"),
        payload.to_vec(),
        &[(hafleet_proto::ERROR_HEADER, &reason), (hafleet_proto::SOURCE_SEQ_HEADER, &seq_text)],
    )
    .await
    .with_context(|| format!("parking route message {seq}"))?;
    Ok(())
}

/// Renders every fleet whose state the renderer holds and makes a version for each one whose
/// config differs from its newest version: after a template change or an upgrade of hafleet,
/// each fleet gets the new config at once, explained as a re-render.
pub(crate) fn rerender_all(
    store: &Store,
    renderer: &Renderer,
    desired: &state::Desired,
    floors: &BTreeMap<FleetName, u64>,
) -> anyhow::Result<()> {
    let applied = store.applied_seq()?;
    let causes = desired
        .fleets
        .keys()
        .map(|fleet| {
            let cause = Cause {
                stream_seq: applied,
                ingress: None,
                what: "rerender".to_owned(),
                resource_version: None,
                added: vec![],
                removed: vec![],
                note: None,
            };
            (fleet.clone(), vec![cause])
        })
        .collect();
    let versions = make_versions(store, renderer, desired, causes, floors)?;
    if !versions.is_empty() {
        info!(fleets = versions.len(), "re-rendered at start-up: the template or hafleet changed");
        store.commit(&[], &versions, applied)?;
    }
    Ok(())
}

/// The next version of each fleet in `causes` whose config changed. A fleet that fails to
/// render gets no version and a warning; the others are not held up.
pub(crate) fn make_versions(
    store: &Store,
    renderer: &Renderer,
    desired: &state::Desired,
    causes: BTreeMap<FleetName, Vec<Cause>>,
    floors: &BTreeMap<FleetName, u64>,
) -> anyhow::Result<Vec<ConfigVersion>> {
    let mut versions = Vec::new();
    for (fleet, causes) in causes {
        let latest = store.latest_summary(&fleet)?;
        let latest = latest.as_ref().map(|l| Latest { version: l.number, sha256: &l.sha256 });
        let floor = floors.get(&fleet).copied().unwrap_or(0);
        let started = std::time::Instant::now();
        let next = next_version(
            renderer,
            &fleet,
            desired,
            latest,
            floor,
            causes,
            hafleet_runtime::now_unix_ms(),
        );
        let took = started.elapsed();
        hafleet_runtime::health::Health::global().observe(
            ("hafleet_renderer_render_seconds", "Time to render a fleet's next version, by fleet."),
            &[("fleet", fleet.as_str())],
            took,
        );
        match next {
            Ok(Some(v)) => {
                info!(fleet = %v.fleet, version = v.version, sha256 = %v.sha256, bytes = v.size,
                      causes = v.causes.len(), notes = v.notes.len(),
                      render_ms = took.as_secs_f64() * 1e3, "new config version");
                for note in &v.notes {
                    warn!(fleet = %v.fleet, version = v.version, note = %note, "route ignored");
                }
                versions.push(v);
            }
            Ok(None) => {}
            Err(e) => {
                warn!(fleet = %fleet, error = ?anyhow::Error::from(e), "render failed; no new version")
            }
        }
    }
    Ok(versions)
}

/// For each fleet the store has no version of: the newest version number published on its
/// subject or named by the checkpoint the store was restored from, which new numbers must stay
/// above. A store that was lost and rebuilt must never reuse a number an applier may have seen.
pub(crate) async fn floors<'a>(
    bus: &bus::Bus,
    store: &Store,
    fleets: impl Iterator<Item = &'a FleetName>,
) -> anyhow::Result<BTreeMap<FleetName, u64>> {
    let mut floors = BTreeMap::new();
    for fleet in fleets {
        if !store.knows(fleet)? {
            let n = bus::latest_published(bus, fleet).await?.number.max(store.floor(fleet)?);
            if n > 0 {
                info!(fleet = %fleet, above = n, "no stored history; numbering continues above the newest published version");
            }
            floors.insert(fleet.clone(), n);
        }
    }
    Ok(floors)
}
