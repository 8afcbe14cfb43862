//! The renderer's loop: consume route messages, coalesce bursts, commit state and versions,
//! publish, then ack.
//!
//! ```text
//! routes stream ──▶ batch (first message + what follows it, until --quiet passes without
//!   one or --coalesce after the first)
//!   ──▶ skip seq ≤ applied_seq ──▶ state::apply ──▶ versions::next_version per touched fleet
//!   ──▶ store.commit (state + versions + applied_seq, one transaction, flushed)
//!   ──▶ publish unpublished versions ──▶ ack the batch
//! ```
//! A crash anywhere in there repeats work but loses none: unacked messages come back and are
//! skipped by sequence, and versions stored but not yet published are published at start-up.

use super::args::RunArgs;
use super::checkpointer::Checkpointer;
use super::history_service::answer_history;
use super::intake::{check_same_stream, fill_gaps, floors, held_gauge, process, rerender_all};
use super::publish::{publish_confirm, publish_unpublished};
use crate::adapters::bus;
use crate::adapters::store::Store;
use crate::core::state;
use anyhow::Context as _;
use futures::StreamExt;
use hafleet_proto::FleetName;
use std::time::Duration;
use tracing::{error, info, warn};

/// Publishes the renderer's settings into the routes stream, where it takes them up in order.
async fn record_render_settings(
    bus: &bus::Bus,
    settings: hafleet_proto::RenderSettings,
) -> anyhow::Result<()> {
    let sha = settings.template_sha256();
    let msg = hafleet_proto::RouteMessage::Render(settings).encode();
    // One id per start: a retried publish is stored once, a later start's again.
    let id = format!(
        "render-{}-{}",
        &hafleet_proto::sha256_hex(&msg)[..16],
        hafleet_runtime::now_unix_ms()
    );
    let subject = hafleet_proto::ROUTES_RENDER_SUBJECT;
    let what = "the routes stream to record the render settings";
    let seq =
        hafleet_runtime::nats::retrying(what, || bus.publish(subject.to_owned(), &id, msg.clone()))
            .await?;
    info!(
        seq,
        template = &sha[..12],
        "render settings recorded in the routes stream; they apply from there"
    );
    Ok(())
}

/// Runs the renderer until SIGTERM or Ctrl-C.
pub async fn run(mut args: RunArgs) -> anyhow::Result<()> {
    args.settle().log();
    hafleet_runtime::install_shutdown_handler();
    let health =
        hafleet_runtime::health::start(&args.health, "starting: store, streams, start-up renders")
            .await?;
    // What the flags say (checked now: a template that does not compile stops the start).
    let wanted = args.render.settings()?;
    let flags_renderer = crate::core::render::Renderer::from_settings(&wanted)
        .context("the renderer's template (--template, or the built-in one)")?;
    let flags_guard = args.render.guard();
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
    // Events the store never applied and the stream no longer holds: publishing before the
    // watchers restate everything would withdraw what those events routed.
    let mut gap = Gap::at_start(&bus, &store).await?;
    // The desired state lives in memory; the store is its journal. Work follows the change.
    let mut desired = store.desired()?;
    // Render with the settings the stream has reached; the flags' go into the stream below and
    // take over when the renderer reaches them, so every version, and every replay, is
    // rendered with the settings of its point of the stream.
    let mut renderer = match desired.render.as_ref().filter(|r| **r != wanted) {
        None => flags_renderer,
        Some(recorded) => crate::core::render::Renderer::from_settings(recorded).unwrap_or_else(|e| {
            error!(error = %e, "the recorded render settings no longer compile; rendering with the flags'");
            flags_renderer
        }),
    };
    if let Some(g) = &mut gap {
        // Every cluster the state knows restates, besides those seen beginning.
        g.restated.expect(desired.epochs.keys().map(Option::as_ref));
    }
    for ((fleet, cluster), held) in &desired.held {
        held_gauge(&desired, fleet);
        error!(fleet = %fleet, cluster = cluster.as_ref().map(|c| c.as_str()),
               snapshot_seq = held.snapshot_seq, ingresses = held.ingresses.len(),
               "a sweep is held since before this start; see `hafleet sweep status`");
    }
    for fleet in store.fleets_with_versions()? {
        let published = store.published(&fleet)?;
        super::publish::fleet_gauges(&store, &fleet, (published > 0).then_some(published))?;
    }
    let start_floors = floors(&bus, &store, desired.fleets.keys()).await?;
    rerender_all(&store, &renderer, &desired, &start_floors)?;
    let mut unpublished = match gap.is_some() {
        true => true,
        false => {
            publish_unpublished(&bus, &store, &signer, Some(&flags_guard.in_force(&desired)))
                .await?
        }
    };
    // Reads on `hafleet.history.<fleet>`, changes on `….change` (granted per fleet).
    let reads = bus
        .client
        .subscribe(hafleet_proto::HISTORY_SUBJECTS)
        .await
        .context("cannot subscribe to history requests")?;
    let changes = bus
        .client
        .subscribe(hafleet_proto::HISTORY_CHANGE_SUBJECTS)
        .await
        .context("cannot subscribe to history requests")?;
    let mut history = futures::stream::select(reads, changes);

    let applied = store.applied_seq()?;
    let (stream, consumer) = bus::routes_consumer(&bus, applied).await?;
    check_same_stream(&store, stream.cached_info())?;
    // Only into the stream this store follows: a start that stops at the check above must
    // not append to a stream it will not read.
    if desired.render.as_ref() != Some(&wanted) {
        record_render_settings(&bus, wanted).await?;
    }
    let mut messages = consumer.messages().await.context("cannot pull from the routes stream")?;
    info!(data_dir = %args.data_dir.display(), applied_seq = store.applied_seq()?, "renderer running");
    health.ready();

    let coalesce = args.coalesce;
    let quiet = args.quiet.min(args.coalesce);
    let shutdown = hafleet_runtime::shutdown_signal();
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(Duration::from_secs(60).min(r.checkpoint_interval));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut retry = tokio::time::interval(args.publish_retry.max(Duration::from_secs(1)));
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut releases = Releases::default();
    // Versions HAProxy refused: traced to the Ingresses that made them, which are quarantined.
    let mut refusals = super::refusals::refusals(bus.clone());
    let mut quarantined = std::collections::BTreeSet::new();
    loop {
        let first = tokio::select! {
            m = messages.next() => m,
            Some(report) = refusals.recv() => {
                let take = super::refusals::take(&bus, &store, &desired, &report, &mut quarantined);
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
            _ = retry.tick(), if unpublished && gap.is_none() => {
                unpublished = publish_unpublished(&bus, &store, &signer, Some(&flags_guard.in_force(&desired))).await?;
                continue;
            }
            _ = Gap::tick(&mut gap) => {
                match gap.as_ref().is_some_and(Gap::over) {
                    true => {
                        gap = None;
                        unpublished = publish_unpublished(&bus, &store, &signer, Some(&flags_guard.in_force(&desired))).await?;
                    }
                    false => {
                        if let Some(g) = gap.as_ref().filter(|g| g.restated.any_done()) {
                            let waiting = g.restated.waiting_for();
                            info!(clusters = ?waiting, "waiting for these clusters' restatements");
                        }
                        Gap::ask(&bus, &mut gap).await
                    }
                }
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
            // After the last event of a watcher's pass, with nothing more in the stream, only
            // what the client holds already is taken (a timeout polls its future once).
            let now = tokio::time::Instant::now();
            let until = match batch.last().is_some_and(ends_a_pass) {
                true => now,
                false => deadline.min(now + quiet),
            };
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
        process(&bus, &stream, &store, &mut renderer, &mut desired, &flags_guard, &entries).await?;
        if let Some(g) = &mut gap {
            batch.iter().for_each(|m| g.note(m));
            if g.over() {
                gap = None;
            }
        }
        // Committed versions are safe in the store: the batch is acked even if a fleet's
        // version could not be published yet; it is retried on its own.
        unpublished = match gap.is_some() {
            true => true,
            false => {
                publish_unpublished(&bus, &store, &signer, Some(&flags_guard.in_force(&desired)))
                    .await?
            }
        };
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

/// Whether `m` is the last route event of a watcher's pass over its cluster
/// ([`hafleet_proto::PASS_MORE_HEADER`] is 0) and the stream held nothing more for the
/// renderer when it was delivered: then nothing else is coming to fold into the batch, and
/// waiting out --quiet would only delay the version.
fn ends_a_pass(m: &async_nats::jetstream::Message) -> bool {
    let last = m
        .headers
        .as_ref()
        .and_then(|h| h.get(hafleet_proto::PASS_MORE_HEADER))
        .is_some_and(|more| more.as_str() == "0");
    last && m.info().is_ok_and(|info| info.pending == 0)
}

/// A gap in the routes stream behind the store: the events between what the store applied and
/// the stream's first message are gone. Until a watcher restates everything (its initial
/// publish: every Ingress again, then a snapshot), nothing is published, and the watchers are
/// asked to (on [`hafleet_proto::RESYNC_SUBJECT`], every 30 s).
struct Gap {
    /// The sequences lost, first and last.
    lost: (u64, u64),
    /// The stream's last sequence when the renderer started: only a snapshot after it answers
    /// the ask (one from before names Ingresses whose events are gone).
    after: u64,
    ask: tokio::time::Interval,
    /// The watchers' restatement since the renderer started.
    restated: crate::core::restatement::Restatement,
}

/// How long after a cluster's restatement the renderer waits for the others that began
/// theirs (a watcher that died half way).
const RESTATE_GRACE: Duration = Duration::from_secs(60);

impl Gap {
    async fn at_start(bus: &bus::Bus, store: &Store) -> anyhow::Result<Option<Gap>> {
        let applied = store.applied_seq()?;
        let bounds = bus::routes_bounds(bus).await?;
        // (A new stream's first sequence is 0; one emptied by retention's, its last + 1.)
        if bounds.first <= applied + 1 {
            return Ok(None);
        }
        let lost = (applied + 1, bounds.first - 1);
        error!(
            from_seq = lost.0,
            to_seq = lost.1,
            "the routes stream no longer holds events this store never applied: publishing \
             nothing until a watcher restates every Ingress (asked on {})",
            hafleet_proto::RESYNC_SUBJECT
        );
        let mut ask = tokio::time::interval(Duration::from_secs(30));
        ask.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let restated = Default::default();
        Ok(Some(Gap { lost, after: bounds.last, ask, restated }))
    }

    /// Ticks while there is a gap; never without one.
    async fn tick(gap: &mut Option<Gap>) {
        match gap {
            Some(g) => {
                g.ask.tick().await;
            }
            None => std::future::pending().await,
        }
    }

    /// Asks the watchers to restate everything.
    async fn ask(bus: &bus::Bus, gap: &mut Option<Gap>) {
        let Some(g) = gap else { return };
        let body = format!("{}-{}", g.lost.0, g.lost.1);
        match bus.client.publish(hafleet_proto::RESYNC_SUBJECT, body.into()).await {
            Ok(()) => info!(
                from_seq = g.lost.0,
                to_seq = g.lost.1,
                "asked the watchers to restate every Ingress"
            ),
            Err(e) => {
                warn!(error = %e, "cannot ask the watchers to restate every Ingress; again later")
            }
        }
    }

    /// Notes `m`, if it was published since the renderer started: the nodes that begin a
    /// watcher's restatement, the snapshot that ends it (decoded only then).
    fn note(&mut self, m: &async_nats::jetstream::Message) {
        if m.info().is_ok_and(|i| i.stream_sequence > self.after) {
            let snapshot = || {
                matches!(
                    hafleet_proto::RouteMessage::decode(&m.payload),
                    Ok(hafleet_proto::RouteMessage::Snapshot(_))
                )
            };
            let now = tokio::time::Instant::now();
            self.restated.note(m.subject.as_str(), snapshot, now);
        }
    }

    /// Whether the watchers have restated everything: every cluster that began has sent its
    /// snapshot, or [`RESTATE_GRACE`] has passed since the first did. Says so.
    fn over(&self) -> bool {
        let now = tokio::time::Instant::now();
        if !self.restated.complete(now, RESTATE_GRACE) {
            if self.restated.any_done() {
                let waiting = self.restated.waiting_for();
                tracing::debug!(clusters = ?waiting, "waiting for the other clusters' restatements");
            }
            return false;
        }
        let waiting = self.restated.waiting_for();
        match waiting.is_empty() {
            true => info!("the watchers restated everything after the gap; publishing again"),
            false => warn!(clusters = ?waiting, "publishing again without these clusters' \
                           snapshots (they began restating and did not finish within a minute)"),
        }
        true
    }
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

/// The signing key at `path`. A key others may read is used, with a warning: in Kubernetes it
/// comes from a Secret mounted with `defaultMode: 0400`.
fn load_signer(path: &std::path::Path) -> anyhow::Result<hafleet_proto::Signer> {
    use std::os::unix::fs::PermissionsExt as _;
    // Zeroed once the key is parsed (the key itself zeroes on drop: ed25519-dalek's zeroize).
    let text = zeroize::Zeroizing::new(
        std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the signing key {}", path.display()))?,
    );
    let mode = std::fs::metadata(path)?.permissions().mode();
    if mode & 0o077 != 0 {
        warn!(path = %path.display(), mode = format!("{:o}", mode & 0o777),
              "the signing key is readable by others; make it 0400 or 0600");
    }
    hafleet_proto::Signer::from_pem(&text)
        .with_context(|| format!("cannot use the signing key {}", path.display()))
}
