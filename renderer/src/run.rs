//! The renderer's loop: consume route messages, coalesce bursts, commit state and versions,
//! publish, then ack.
//!
//! ```text
//! routes stream ──▶ batch (first message + whatever arrives within --coalesce-ms)
//!   ──▶ skip seq ≤ applied_seq ──▶ state::apply ──▶ versions::next_version per touched fleet
//!   ──▶ store.commit (state + versions + applied_seq, one transaction, flushed)
//!   ──▶ publish unpublished versions ──▶ ack the batch
//! ```
//! A crash anywhere in there repeats work but loses none: unacked messages come back and are
//! skipped by sequence, and versions stored but not yet published are published at start-up.

use crate::bus;
use crate::render::Renderer;
use crate::state::{self, Applied};
use crate::store::Store;
use crate::versions::{Latest, next_version};
use anyhow::Context as _;
use async_nats::jetstream;
use futures::StreamExt;
use hafleet_proto::{Cause, ConfigVersion, DecodeError, FleetName, RouteMessage};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tracing::{error, info, warn};

/// Settings of `hafleet-renderer run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub nats: hafleet_runtime::NatsArgs,
    /// Directory of the renderer's state store (sled). Keep it on persistent storage: it holds
    /// every fleet's desired state and config history.
    #[arg(long, env = "HAFLEET_DATA_DIR", default_value = "/var/lib/hafleet/renderer")]
    pub data_dir: PathBuf,
    /// minijinja template to render instead of the built-in one (see
    /// renderer/templates/haproxy.cfg.j2 for the model it receives).
    #[arg(long, env = "HAFLEET_TEMPLATE")]
    pub template: Option<PathBuf>,
    /// How long to wait for more route events after one arrives, so that a burst of changes
    /// makes one version instead of many.
    #[arg(long, env = "HAFLEET_COALESCE_MS", default_value_t = 200)]
    pub coalesce_ms: u64,
    /// Most route events folded into one batch.
    #[arg(long, env = "HAFLEET_MAX_BATCH", default_value_t = 1000)]
    pub max_batch: usize,
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let renderer = match &args.template {
        Some(path) => {
            let source = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read template {}", path.display()))?;
            Renderer::new(source).with_context(|| format!("template {}", path.display()))?
        }
        None => Renderer::builtin(),
    };
    let store = Store::open(&args.data_dir)?;
    let bus = args.nats.connect().await?;
    bus.ensure_stream(hafleet_proto::CONFIGS).await?;
    bus.ensure_stream(hafleet_proto::DEADLETTER).await?;
    // The desired state lives in memory; the store is its journal. Work follows the change.
    let mut desired = store.desired()?;
    rerender_all(&store, &renderer, &desired)?;
    publish_unpublished(&bus, &store).await?;
    let mut history = bus
        .client
        .subscribe(hafleet_proto::HISTORY_SUBJECTS)
        .await
        .context("cannot subscribe to history requests")?;

    let applied = store.applied_seq()?;
    let (stream, consumer) = bus::routes_consumer(&bus, applied).await?;
    check_same_stream(&store, stream.cached_info())?;
    let mut messages = consumer.messages().await.context("cannot pull from the routes stream")?;
    info!(data_dir = %args.data_dir.display(), applied_seq = store.applied_seq()?, "renderer running");

    let coalesce = Duration::from_millis(args.coalesce_ms);
    let shutdown = hafleet_runtime::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let first = tokio::select! {
            m = messages.next() => m,
            Some(request) = history.next() => {
                answer_history(&bus, &store, &renderer, &desired, request).await;
                continue;
            }
            _ = &mut shutdown => break,
        };
        let first = match first {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                warn!(error = %e, "routes stream hiccup; continuing");
                continue;
            }
            None => break,
        };
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + coalesce;
        while batch.len() < args.max_batch {
            match tokio::time::timeout_at(deadline, messages.next()).await {
                Ok(Some(Ok(m))) => batch.push(m),
                Ok(Some(Err(e))) => {
                    warn!(error = %e, "routes stream hiccup while batching");
                    break;
                }
                Ok(None) | Err(_) => break,
            }
        }
        let entries = fill_gaps(&stream, store.applied_seq()?, &batch).await?;
        process(&bus, &store, &renderer, &mut desired, &entries).await?;
        publish_unpublished(&bus, &store).await?;
        for m in &batch {
            if let Err(e) = m.ack().await {
                // Not fatal: the message comes back and is skipped by its sequence.
                warn!(error = %e, "ack failed");
            }
        }
    }
    info!("renderer stopping");
    bus.drain().await;
    Ok(())
}

/// Refuses to go on if the routes stream is not the one the store followed (NATS lost its
/// data and the stream was created anew): its sequences mean other messages now, and applying
/// "after" the stored sequence would silently skip or misapply changes.
fn check_same_stream(
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

/// The batch as (stream sequence, payload), in sequence order, without what is already applied,
/// and with any sequence the consumer skipped read from the stream, so that events are applied
/// exactly once and in order whatever the deliveries did.
async fn fill_gaps(
    stream: &async_nats::jetstream::stream::Stream,
    applied: u64,
    batch: &[jetstream::Message],
) -> anyhow::Result<Vec<(u64, bytes::Bytes)>> {
    let mut delivered: Vec<(u64, bytes::Bytes)> = batch
        .iter()
        .filter_map(|m| match m.info() {
            Ok(info) => Some((info.stream_sequence, m.payload.clone())),
            Err(e) => {
                warn!(error = %e, "message without JetStream metadata; skipped");
                None
            }
        })
        .filter(|(seq, _)| *seq > applied)
        .collect();
    delivered.sort_by_key(|(seq, _)| *seq);
    delivered.dedup_by_key(|(seq, _)| *seq);
    let mut entries = Vec::with_capacity(delivered.len());
    let mut next = applied + 1;
    for (seq, payload) in delivered {
        while next < seq {
            match bus::routes_message(stream, next).await? {
                Some(missing) => {
                    info!(seq = next, "filled a gap in deliveries from the stream");
                    entries.push((next, missing));
                }
                None => warn!(seq = next, "route message no longer in the stream; skipped"),
            }
            next += 1;
        }
        entries.push((seq, payload));
        next = seq + 1;
    }
    Ok(entries)
}

/// Applies entries (in sequence order, all above the applied sequence) and commits them.
/// Returns the versions it made.
///
/// A message this build cannot read (not JSON, a schema it does not know, a value that fails
/// an allowlist) is parked on the dead-letter subject, with the reason and its sequence, before
/// anything is committed; the rest of the batch goes on. One bad message must not stop every
/// fleet behind it, and parked, it is not lost: an operator can read it back and, after an
/// upgrade, publish it again.
#[tracing::instrument(skip_all, fields(messages = entries.len()))]
async fn process(
    bus: &bus::Bus,
    store: &Store,
    renderer: &Renderer,
    desired: &mut state::Desired,
    entries: &[(u64, bytes::Bytes)],
) -> anyhow::Result<Vec<ConfigVersion>> {
    let mut last_seq = store.applied_seq()?;
    let mut out = Applied::default();
    for (seq, payload) in entries {
        let seq = *seq;
        match RouteMessage::decode(payload) {
            Ok(msg) => state::apply(desired, seq, &msg, &mut out),
            Err(e) => park(bus, seq, payload, &e).await?,
        }
        last_seq = last_seq.max(seq);
    }
    let floors = floors(bus, store, out.causes.keys()).await?;
    let versions = make_versions(store, renderer, desired, out.causes, &floors)?;
    store.commit(&out.writes, &versions, last_seq)?;
    Ok(versions)
}

/// Publishes an unreadable route message on the dead-letter subject.
async fn park(
    bus: &bus::Bus,
    seq: u64,
    payload: &bytes::Bytes,
    error: &DecodeError,
) -> anyhow::Result<()> {
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
fn rerender_all(
    store: &Store,
    renderer: &Renderer,
    desired: &state::Desired,
) -> anyhow::Result<()> {
    let applied = store.applied_seq()?;
    let causes = desired
        .keys()
        .map(|fleet| {
            let cause = Cause {
                stream_seq: applied,
                ingress: None,
                what: "rerender".to_owned(),
                resource_version: None,
                added: vec![],
                removed: vec![],
            };
            (fleet.clone(), vec![cause])
        })
        .collect();
    let versions = make_versions(store, renderer, desired, causes, &BTreeMap::new())?;
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
    let empty = BTreeMap::new();
    for (fleet, causes) in causes {
        let ingresses = desired.get(&fleet).unwrap_or(&empty);
        let latest = store.latest_summary(&fleet)?;
        let latest = latest.as_ref().map(|l| Latest { version: l.number, sha256: &l.sha256 });
        let floor = floors.get(&fleet).copied().unwrap_or(0);
        match next_version(
            renderer,
            &fleet,
            ingresses,
            latest,
            floor,
            causes,
            hafleet_runtime::now_unix_ms(),
        ) {
            Ok(Some(v)) => {
                info!(fleet = %v.fleet, version = v.version, sha256 = %v.sha256, bytes = v.size,
                      causes = v.causes.len(), notes = v.notes.len(), "new config version");
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
/// subject, which new numbers must stay above. A store that was lost and rebuilt from the
/// routes stream must never reuse a number an applier may have seen.
async fn floors<'a>(
    bus: &bus::Bus,
    store: &Store,
    fleets: impl Iterator<Item = &'a FleetName>,
) -> anyhow::Result<BTreeMap<FleetName, u64>> {
    let mut floors = BTreeMap::new();
    for fleet in fleets {
        if !store.knows(fleet)? {
            let n = bus::latest_published_number(bus, fleet).await?;
            if n > 0 {
                info!(fleet = %fleet, above = n, "no stored history; numbering continues above the newest published version");
            }
            floors.insert(fleet.clone(), n);
        }
    }
    Ok(floors)
}

/// Answers one history request and replies; a request without a reply subject is dropped.
async fn answer_history(
    bus: &bus::Bus,
    store: &Store,
    renderer: &Renderer,
    desired: &state::Desired,
    request: async_nats::Message,
) {
    use hafleet_proto::{HistoryErrorKind, HistoryReply, HistoryRequest};
    let Some(reply_to) = request.reply.clone() else { return };
    let fleet = request.subject.as_str().rsplit('.').next().unwrap_or_default();
    let reply =
        match (FleetName::new(fleet), serde_json::from_slice::<HistoryRequest>(&request.payload)) {
            (Ok(fleet), Ok(req)) => {
                let ctx = crate::history::service::Ctx { bus, store, renderer, desired };
                crate::history::service::handle(&ctx, &fleet, req).await
            }
            (Err(e), _) => {
                HistoryReply::Error { kind: HistoryErrorKind::BadRequest, message: e.to_string() }
            }
            (_, Err(e)) => HistoryReply::Error {
                kind: HistoryErrorKind::BadRequest,
                message: format!("not a history request: {e}"),
            },
        };
    if let Err(e) = bus.client.publish(reply_to, reply.encode().into()).await {
        warn!(error = %e, "history reply lost");
    }
}

pub(crate) async fn publish_unpublished(bus: &bus::Bus, store: &Store) -> anyhow::Result<()> {
    for v in store.unpublished()? {
        bus.publish_version(&v).await?;
        store.set_published(&v.fleet, v.version)?;
        info!(fleet = %v.fleet, version = v.version, "version published");
    }
    Ok(())
}
