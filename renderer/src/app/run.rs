//! The renderer's loop: consume route messages, coalesce bursts, commit state and versions,
//! publish, then ack.
//!
//! ```text
//! routes stream ──▶ batch (first message + what follows it, until --quiet-ms pass without
//!   one or --coalesce-ms after the first)
//!   ──▶ skip seq ≤ applied_seq ──▶ state::apply ──▶ versions::next_version per touched fleet
//!   ──▶ store.commit (state + versions + applied_seq, one transaction, flushed)
//!   ──▶ publish unpublished versions ──▶ ack the batch
//! ```
//! A crash anywhere in there repeats work but loses none: unacked messages come back and are
//! skipped by sequence, and versions stored but not yet published are published at start-up.

use super::publish::{publish_confirm, publish_unpublished};
use crate::adapters::bus;
use crate::adapters::store::Store;
use crate::core::render::Renderer;
use crate::core::state::{self, Applied};
use crate::core::versions::{Latest, next_version};
use anyhow::Context as _;
use async_nats::jetstream;
use futures::StreamExt;
use hafleet_proto::{Cause, ConfigVersion, FleetName, RouteMessage};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tracing::{error, info, warn};

/// Settings of `hafleet-renderer run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub nats: hafleet_runtime::NatsArgs,
    #[command(flatten)]
    pub health: hafleet_runtime::health::HealthArgs,
    /// Directory of the renderer's state store (sled). Keep it on persistent storage: it holds
    /// every fleet's desired state and config history.
    #[arg(long, env = "HAFLEET_DATA_DIR", default_value = "/var/lib/hafleet/renderer")]
    pub data_dir: PathBuf,
    #[command(flatten)]
    pub render: RenderArgs,
    /// Most milliseconds to wait for more route events after one arrives, so that a burst of
    /// changes makes one version instead of many.
    #[arg(long, env = "HAFLEET_COALESCE_MS", default_value_t = 200)]
    pub coalesce_ms: u64,
    /// Milliseconds without a route event after which a batch closes before --coalesce-ms: a
    /// lone change is rendered after this, a burst is folded for up to --coalesce-ms.
    #[arg(long, env = "HAFLEET_QUIET_MS", default_value_t = 20)]
    pub quiet_ms: u64,
    /// Most route events folded into one batch.
    #[arg(long, env = "HAFLEET_MAX_BATCH", default_value_t = 1000)]
    pub max_batch: usize,
    /// Seconds between tries to publish a version that could not be published.
    #[arg(long, env = "HAFLEET_PUBLISH_RETRY_SECS", default_value_t = 5)]
    pub publish_retry_secs: u64,
    #[command(flatten)]
    pub retention: RetentionArgs,
    /// The renderer's ed25519 private key (PKCS#8 PEM, `openssl genpkey -algorithm ed25519`).
    /// Every version is signed with it when published; appliers apply only versions signed by
    /// a key they trust (their --verify-key), so NATS access alone cannot push a config. Keep
    /// it readable by the renderer only.
    #[arg(long, env = "HAFLEET_SIGNING_KEY")]
    pub signing_key: PathBuf,
    /// Release a sweep held by the guard (see --sweep-guard-percent) by itself this long after
    /// it was held (e.g. 30m); 0 (the default) holds it until an operator runs `hafleet-renderer
    /// sweep confirm`.
    #[arg(long, env = "HAFLEET_SWEEP_RELEASE_AFTER", default_value = "0s",
          value_parser = humantime::parse_duration)]
    pub sweep_release_after: Duration,
}

/// Everything that decides what a config looks like. `replay` takes the same flags (and reads
/// the same environment variables): it is byte for byte the renderer's output only with them.
#[derive(Debug, Clone, clap::Args)]
pub struct RenderArgs {
    /// minijinja template to render instead of the built-in one (see
    /// renderer/templates/haproxy.cfg.j2 for the model it receives).
    #[arg(long, env = "HAFLEET_TEMPLATE")]
    pub template: Option<PathBuf>,
    /// Most nodes listed in the backend of a Service with `externalTrafficPolicy: Cluster`
    /// (0: every Ready node). Any node forwards such a Service's traffic, so a bounded,
    /// deterministic subset (rendezvous hashing on Service and node names) keeps configs and
    /// health checks growing as Services + nodes rather than Services × nodes, and a node
    /// joining or leaving moves only the backends that hash to it. `Local` Services always
    /// list every node.
    #[arg(long, env = "HAFLEET_SERVERS_PER_BACKEND",
          default_value_t = crate::core::model::DEFAULT_SERVERS_PER_BACKEND)]
    pub servers_per_backend: usize,
    /// Empty backends (`hafleet_spare_0`, …) kept in every config while node health checks
    /// are on. A version whose only change HAProxy cannot take at runtime is new Services
    /// (up to this many) is served on each host through spares, at runtime, before the reload
    /// that gives each its own backend: at 10,000 Services a new one answers a reload's time
    /// sooner. 0: no spares (a new Service waits for its reload).
    #[arg(long, env = "HAFLEET_SPARE_BACKENDS",
          default_value_t = crate::core::model::DEFAULT_SPARE_BACKENDS)]
    pub spare_backends: usize,
    /// Check each node's health once per HAProxy host, on this port of the node (kube-proxy's
    /// `/healthz` answers on 10256, the default), and have the servers of `Cluster` backends
    /// track it (`track`) instead of checking each Service on each node. HAProxy hosts must
    /// reach it: a node whose check fails takes no `Cluster` traffic. 0: every server checks
    /// its own NodePort (for clusters whose nodes do not serve kube-proxy's health port).
    #[arg(long, env = "HAFLEET_NODE_HEALTH_PORT",
          default_value_t = crate::core::model::DEFAULT_NODE_HEALTH_PORT)]
    pub node_health_port: u16,
    /// The path node health checks ask for.
    #[arg(long, env = "HAFLEET_NODE_HEALTH_PATH",
          default_value = crate::core::model::DEFAULT_NODE_HEALTH_PATH)]
    pub node_health_path: hafleet_proto::HttpPath,
    /// Mass-deletion guard: a snapshot of the watcher (after its restart, or a resync that
    /// loses many Ingresses at once) that would withdraw more than this percentage of a
    /// fleet's routes at once withdraws none of them: the fleet keeps serving them, the
    /// renderer logs and counts the hold, and `hafleet-renderer sweep status` shows it until
    /// `sweep confirm` (or --sweep-release-after) releases it. 100 turns the guard off.
    #[arg(long, env = "HAFLEET_SWEEP_GUARD_PERCENT", default_value_t = 50,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub sweep_guard_percent: u8,
    /// ...and only when it withdraws at least this many routes (small fleets change by more
    /// than half with a few deletions).
    #[arg(long, env = "HAFLEET_SWEEP_GUARD_MIN_ROUTES", default_value_t = 10)]
    pub sweep_guard_min_routes: usize,
}

impl RenderArgs {
    /// The mass-deletion guard these flags describe.
    pub fn guard(&self) -> state::SweepGuard {
        state::SweepGuard {
            percent: self.sweep_guard_percent,
            min_routes: self.sweep_guard_min_routes,
        }
    }

    /// The renderer these flags describe.
    pub fn renderer(&self) -> anyhow::Result<Renderer> {
        let node_health = (self.node_health_port != 0).then(|| crate::core::model::NodeHealth {
            port: self.node_health_port,
            path: self.node_health_path.clone(),
        });
        Ok(Renderer::load(self.template.as_deref())?.with_options(crate::core::model::Options {
            servers_per_backend: self.servers_per_backend,
            spare_backends: self.spare_backends,
            node_health,
        }))
    }
}

/// How much history NATS keeps, and how often the renderer checkpoints its desired state so
/// that any point inside the kept history can be replayed (`hafleet-renderer replay`) and an
/// empty store can be rebuilt. The renderer owns the routes and configs streams' retention: it
/// sets them to these values at start-up.
///
/// Keep the routes stream's limits well above a checkpoint's span (`--checkpoint-every`
/// events, `--checkpoint-interval`) and above the longest time the renderer may be down:
/// messages the stream drops before the renderer applied them are lost to it.
#[derive(Debug, Clone, clap::Args)]
pub struct RetentionArgs {
    /// Oldest route event the routes stream keeps (e.g. 30d, 12h; 0 keeps them forever).
    #[arg(long, env = "HAFLEET_ROUTES_MAX_AGE", default_value = "30d",
          value_parser = humantime::parse_duration)]
    pub routes_max_age: Duration,
    /// Most bytes the routes stream keeps, oldest dropped first (e.g. 1GiB, 500MB; 0: no limit).
    #[arg(long, env = "HAFLEET_ROUTES_MAX_BYTES", default_value = "1GiB",
          value_parser = hafleet_runtime::parse_bytes)]
    pub routes_max_bytes: u64,
    /// Oldest config version the configs stream keeps. Appliers need only the newest;
    /// `history` reads the renderer's store, which keeps every version.
    #[arg(long, env = "HAFLEET_CONFIGS_MAX_AGE", default_value = "90d",
          value_parser = humantime::parse_duration)]
    pub configs_max_age: Duration,
    /// Most bytes the configs stream keeps.
    #[arg(long, env = "HAFLEET_CONFIGS_MAX_BYTES", default_value = "2GiB",
          value_parser = hafleet_runtime::parse_bytes)]
    pub configs_max_bytes: u64,
    /// Checkpoint the desired state after this many route events...
    #[arg(long, env = "HAFLEET_CHECKPOINT_EVERY", default_value_t = 10_000)]
    pub checkpoint_every: u64,
    /// ...or this long after the last checkpoint, if anything changed since.
    #[arg(long, env = "HAFLEET_CHECKPOINT_INTERVAL", default_value = "6h",
          value_parser = humantime::parse_duration)]
    pub checkpoint_interval: Duration,
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    hafleet_runtime::install_shutdown_handler();
    let health =
        hafleet_runtime::health::start(&args.health, "starting: store, streams, start-up renders")
            .await?;
    let renderer = args.render.renderer()?;
    let signer = load_signer(&args.signing_key)?;
    info!(key = signer.key_id(), "versions are signed");
    let store = Store::open(&args.data_dir)?;
    let bus = args.nats.connect_waiting().await?;
    let r = &args.retention;
    let routes = bus::Retention { max_age: r.routes_max_age, max_bytes: r.routes_max_bytes };
    let configs = bus::Retention { max_age: r.configs_max_age, max_bytes: r.configs_max_bytes };
    bus::ensure_retention(&bus, hafleet_proto::ROUTES, routes).await?;
    bus::ensure_retention(&bus, hafleet_proto::CONFIGS, configs).await?;
    bus.ensure_stream(hafleet_proto::DEADLETTER).await?;
    let mut checkpoints = Checkpointer::start(&bus, r).await?;
    if store.is_empty()? {
        checkpoints.restore(&bus, &store).await?;
    }
    // The desired state lives in memory; the store is its journal. Work follows the change.
    let mut desired = store.desired()?;
    for ((fleet, cluster), held) in &desired.held {
        held_gauge(&desired, fleet);
        error!(fleet = %fleet, cluster = cluster.as_ref().map(|c| c.as_str()),
               snapshot_seq = held.snapshot_seq, ingresses = held.ingresses.len(),
               "a sweep is held since before this start; see `hafleet-renderer sweep status`");
    }
    let start_floors = floors(&bus, &store, desired.fleets.keys()).await?;
    rerender_all(&store, &renderer, &desired, &start_floors)?;
    let mut unpublished = publish_unpublished(&bus, &store, &signer).await?;
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
    health.ready();

    let coalesce = Duration::from_millis(args.coalesce_ms);
    let quiet = Duration::from_millis(args.quiet_ms.min(args.coalesce_ms));
    let shutdown = hafleet_runtime::shutdown_signal();
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(Duration::from_secs(60).min(r.checkpoint_interval));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut retry = tokio::time::interval(Duration::from_secs(args.publish_retry_secs.max(1)));
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let guard = args.render.guard();
    let mut releases = Releases::default();
    // Versions HAProxy refused: traced to the Ingresses that made them, which are quarantined.
    let mut refusals = crate::core::quarantine::adapter::refusals(bus.clone());
    let mut quarantined = std::collections::BTreeSet::new();
    loop {
        let first = tokio::select! {
            m = messages.next() => m,
            Some(report) = refusals.recv() => {
                let take = crate::core::quarantine::adapter::take(&bus, &store, &desired, &report, &mut quarantined);
                if let Err(e) = take.await {
                    warn!(fleet = %report.fleet, version = report.version, error = %format!("{e:#}"),
                          "cannot quarantine what HAProxy refused");
                }
                continue;
            }
            Some(request) = history.next() => {
                let ctx = crate::app::history_service::Ctx {
                    bus: &bus, store: &store, renderer: &renderer, desired: &desired, signer: &signer,
                };
                answer_history(ctx, request).await;
                // A rollback or resume may have left a version unpublished: the retry sees it.
                unpublished = true;
                continue;
            }
            _ = tick.tick() => {
                checkpoints.maybe(&bus, &store, &desired).await;
                continue;
            }
            _ = releases.tick.tick(), if !args.sweep_release_after.is_zero() => {
                releases.due(&bus, &desired, args.sweep_release_after).await;
                continue;
            }
            _ = retry.tick(), if unpublished => {
                unpublished = publish_unpublished(&bus, &store, &signer).await?;
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
            let until = deadline.min(tokio::time::Instant::now() + quiet);
            match tokio::time::timeout_at(until, messages.next()).await {
                Ok(Some(Ok(m))) => batch.push(m),
                Ok(Some(Err(e))) => {
                    warn!(error = %e, "routes stream hiccup while batching");
                    break;
                }
                Ok(None) | Err(_) => break,
            }
        }
        let entries = fill_gaps(&stream, store.applied_seq()?, &batch).await?;
        process(&bus, &stream, &store, &renderer, &mut desired, &guard, &entries).await?;
        // Committed versions are safe in the store: the batch is acked even if a fleet's
        // version could not be published yet; it is retried on its own.
        unpublished = publish_unpublished(&bus, &store, &signer).await?;
        for m in &batch {
            if let Err(e) = m.ack().await {
                // Not fatal: the message comes back and is skipped by its sequence.
                warn!(error = %e, "ack failed");
            }
        }
        checkpoints.maybe(&bus, &store, &desired).await;
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
    stream: &async_nats::jetstream::stream::Stream,
    store: &Store,
    renderer: &Renderer,
    desired: &mut state::Desired,
    guard: &state::SweepGuard,
    entries: &[(u64, bytes::Bytes)],
) -> anyhow::Result<Vec<ConfigVersion>> {
    let mut last_seq = store.applied_seq()?;
    let mut out = Applied::default();
    let mut applied = 0u32;
    for (seq, payload) in entries {
        let seq = *seq;
        let msg = match RouteMessage::decode(payload) {
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
    let floors = floors(bus, store, out.causes.keys()).await?;
    let versions = make_versions(store, renderer, desired, out.causes, &floors)?;
    store.commit(&out.writes, &versions, last_seq)?;
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
                        API server and the watcher, then `hafleet-renderer sweep status` and \
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
fn held_gauge(desired: &state::Desired, fleet: &FleetName) {
    let count: usize = desired.held_in(fleet).map(|h| h.ingresses.len()).sum();
    const HELD: (&str, &str) = (
        "hafleet_renderer_sweep_held_ingresses",
        "Ingresses a held sweep keeps from being withdrawn, by fleet (0: none held).",
    );
    let labels = [("fleet", fleet.as_str())];
    hafleet_runtime::health::Health::global().gauge(HELD, &labels, count as f64);
}

/// Releases of held sweeps by --sweep-release-after.
struct Releases {
    tick: tokio::time::Interval,
    /// Holds already released, (fleet, snapshot sequence): the stream has the release.
    sent: std::collections::BTreeSet<(FleetName, u64)>,
}

impl Default for Releases {
    fn default() -> Self {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Releases { tick, sent: Default::default() }
    }
}

impl Releases {
    /// Publishes a release for each hold older than `after`.
    async fn due(&mut self, bus: &bus::Bus, desired: &state::Desired, after: Duration) {
        let now = hafleet_runtime::now_unix_ms();
        self.sent.retain(|(f, seq)| desired.held_in(f).any(|h| h.snapshot_seq == *seq));
        for ((fleet, _), held) in &desired.held {
            let age = Duration::from_millis(now.saturating_sub(held.since_unix_ms));
            if held.since_unix_ms == 0 || age < after {
                continue;
            }
            if !self.sent.insert((fleet.clone(), held.snapshot_seq)) {
                continue;
            }
            let epoch = desired.epoch(held.cluster.as_ref());
            let sent = publish_confirm(bus, fleet, held, epoch, "policy").await;
            if let Err(e) = sent {
                warn!(fleet = %fleet, error = %e, "cannot publish the release of a held sweep; retrying");
                self.sent.remove(&(fleet.clone(), held.snapshot_seq));
            }
        }
    }
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
fn rerender_all(
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
        hafleet_runtime::health::Health::global().observe(
            ("hafleet_renderer_render_seconds", "Time to render a fleet's next version, by fleet."),
            &[("fleet", fleet.as_str())],
            started.elapsed(),
        );
        match next {
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
/// subject or named by the checkpoint the store was restored from, which new numbers must stay
/// above. A store that was lost and rebuilt must never reuse a number an applier may have seen.
async fn floors<'a>(
    bus: &bus::Bus,
    store: &Store,
    fleets: impl Iterator<Item = &'a FleetName>,
) -> anyhow::Result<BTreeMap<FleetName, u64>> {
    let mut floors = BTreeMap::new();
    for fleet in fleets {
        if !store.knows(fleet)? {
            let n = bus::latest_published_number(bus, fleet).await?.max(store.floor(fleet)?);
            if n > 0 {
                info!(fleet = %fleet, above = n, "no stored history; numbering continues above the newest published version");
            }
            floors.insert(fleet.clone(), n);
        }
    }
    Ok(floors)
}

/// Answers one history request and replies; a request without a reply subject is dropped.
async fn answer_history(ctx: crate::app::history_service::Ctx<'_>, request: async_nats::Message) {
    use hafleet_proto::{HistoryErrorKind, HistoryReply, HistoryRequest};
    let Some(reply_to) = request.reply.clone() else { return };
    let fleet = request.subject.as_str().rsplit('.').next().unwrap_or_default();
    let reply =
        match (FleetName::new(fleet), serde_json::from_slice::<HistoryRequest>(&request.payload)) {
            (Ok(fleet), Ok(req)) => crate::app::history_service::handle(&ctx, &fleet, req).await,
            (Err(e), _) => {
                HistoryReply::Error { kind: HistoryErrorKind::BadRequest, message: e.to_string() }
            }
            (_, Err(e)) => HistoryReply::Error {
                kind: HistoryErrorKind::BadRequest,
                message: format!("not a history request: {e}"),
            },
        };
    if let Err(e) = ctx.bus.client.publish(reply_to, reply.encode().into()).await {
        warn!(error = %e, "history reply lost");
    }
}

/// The signing key at `path`. A key others may read is used, with a warning: in Kubernetes it
/// comes from a Secret mounted with `defaultMode: 0400`.
fn load_signer(path: &std::path::Path) -> anyhow::Result<hafleet_proto::Signer> {
    use std::os::unix::fs::PermissionsExt as _;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the signing key {}", path.display()))?;
    let mode = std::fs::metadata(path)?.permissions().mode();
    if mode & 0o077 != 0 {
        warn!(path = %path.display(), mode = format!("{:o}", mode & 0o777),
              "the signing key is readable by others; make it 0400 or 0600");
    }
    hafleet_proto::Signer::from_pem(&text)
        .with_context(|| format!("cannot use the signing key {}", path.display()))
}

/// Writes checkpoints of the desired state to the object store and drops those that no point
/// of the kept history needs any more. A failed checkpoint is logged and tried again later:
/// it costs replay range, never a route event.
struct Checkpointer {
    bucket: jetstream::object_store::ObjectStore,
    every: u64,
    interval: Duration,
    last_seq: u64,
    last_at: tokio::time::Instant,
}

impl Checkpointer {
    async fn start(bus: &bus::Bus, args: &RetentionArgs) -> anyhow::Result<Self> {
        let bucket = bus::checkpoint_store(bus, true).await?.context("no checkpoint bucket")?;
        let last_seq = bus::list_checkpoints(&bucket).await?.last().copied().unwrap_or(0);
        Ok(Checkpointer {
            bucket,
            every: args.checkpoint_every.max(1),
            interval: args.checkpoint_interval,
            last_seq,
            last_at: tokio::time::Instant::now(),
        })
    }

    /// Fills an empty store from the newest checkpoint of the routes stream it follows, so a
    /// renderer whose disk was lost starts where the checkpoint left off even after the
    /// stream dropped the messages before it.
    async fn restore(&self, bus: &bus::Bus, store: &Store) -> anyhow::Result<()> {
        let bus::RoutesBounds { first, last, created, .. } = bus::routes_bounds(bus).await?;
        let Some(&seq) =
            bus::list_checkpoints(&self.bucket).await?.iter().rev().find(|s| **s <= last)
        else {
            if first > 1 {
                warn!(
                    first_seq = first,
                    "empty store, no checkpoint, and the routes stream no \
                      longer starts at its beginning: the state is rebuilt from what it holds"
                );
            }
            return Ok(());
        };
        let c = bus::get_checkpoint(&self.bucket, seq).await?;
        if c.routes_stream_created != created {
            warn!(checkpoint = seq, "the newest checkpoint is of another routes stream; not used");
            return Ok(());
        }
        store.set_routes_stream_created(&created)?;
        store.restore(&c.desired(), c.seq, &c.latest)?;
        info!(checkpoint = seq, fleets = c.fleets.len(), "empty store restored from a checkpoint");
        Ok(())
    }

    /// Checkpoints if `every` events or `interval` passed since the last one.
    async fn maybe(&mut self, bus: &bus::Bus, store: &Store, desired: &state::Desired) {
        let Ok(applied) = store.applied_seq() else { return };
        let due = applied >= self.last_seq + self.every || self.last_at.elapsed() >= self.interval;
        if applied <= self.last_seq || !due {
            return;
        }
        match self.write(bus, store, desired, applied).await {
            Ok(bytes) => {
                info!(seq = applied, bytes, "desired state checkpointed");
                self.last_seq = applied;
                self.last_at = tokio::time::Instant::now();
            }
            Err(e) => {
                warn!(error = format!("{e:#}"), "checkpoint failed; trying again later");
                self.last_at = tokio::time::Instant::now();
            }
        }
    }

    async fn write(
        &self,
        bus: &bus::Bus,
        store: &Store,
        desired: &state::Desired,
        applied: u64,
    ) -> anyhow::Result<usize> {
        let mut latest = BTreeMap::new();
        for fleet in desired.fleets.keys() {
            let n = store.latest_summary(fleet)?.map(|s| s.number).unwrap_or(0);
            latest.insert(fleet.clone(), n.max(store.floor(fleet)?));
        }
        let created = store.routes_stream_created()?.unwrap_or_default();
        let now = hafleet_runtime::now_unix_ms();
        let c = crate::core::checkpoint::Checkpoint::new(applied, created, now, latest, desired);
        let bytes = bus::put_checkpoint(&self.bucket, &c).await?;
        let first = bus::routes_bounds(bus).await?.first;
        let all = bus::list_checkpoints(&self.bucket).await?;
        for old in crate::core::checkpoint::prunable(&all, first) {
            bus::delete_checkpoint(&self.bucket, old).await?;
            info!(seq = old, "checkpoint dropped: the routes stream no longer reaches it");
        }
        Ok(bytes)
    }
}
