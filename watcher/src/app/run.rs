//! The watcher's loop.
//!
//! ```text
//! watches (Ingress, Service, Node, EndpointSlice) ──tick──▶ at once if none came for a
//!   second before it, else settle (--quiet without a change, at most --debounce)
//!   ──▶ Ready nodes changed? publish them
//!   ──▶ resolve every Ingress from the caches (resolve::Memo: anew only where an Ingress, a
//!   Service it names or their endpoints changed) ──▶ index::diff against what was published
//!   ──▶ publish (acked) ──▶ index::record
//! ```
//! Routes name NodePorts, not nodes: a node joining, leaving or going NotReady is one nodes
//! message, whatever the number of Ingresses.
//! After start-up, once every cache is listed and every live Ingress is published, a snapshot
//! names them all, so the renderer can sweep Ingresses deleted while no watcher ran.

use super::args::RunArgs;
use super::effects::{send_default_cert, send_nodes, send_settings, send_snapshot, tell};
use super::state::{State, TlsState};
use crate::core::index::{self, Action, Published};
use crate::core::pass;
use crate::core::resolve::{self, Services};
use crate::core::route_events::route_event;
use crate::k8s::events::Warnings;
use crate::k8s::watch::{self as kube_adapter, Caches};
use anyhow::Context as _;
use futures::{FutureExt as _, StreamExt};
use hafleet_proto::{FleetName, RouteChange};
use hafleet_runtime::nats::Bus;
use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::{debug, info, warn};

/// Runs the watcher until SIGTERM or Ctrl-C.
pub async fn run(mut args: RunArgs) -> anyhow::Result<()> {
    args.settle().log();
    hafleet_runtime::install_shutdown_handler();
    let health =
        hafleet_runtime::health::start(&args.health, "the watches have not listed yet").await?;
    health.gauge(LEADER, &[], f64::from(!args.lease.leader_election));
    let client = kube::Client::try_default()
        .await
        .context("cannot build a Kubernetes client (KUBECONFIG, or in-cluster service account)")?;
    // Discovery (which EndpointSlice version) must see the real server, not guess without it.
    let version =
        hafleet_runtime::wait_for("the Kubernetes API server", || client.apiserver_version())
            .await?;
    info!(version = %version.git_version, "Kubernetes API server answers");
    let bus = args.nats.connect_waiting().await?;
    let routes = bus.ensure_stream(hafleet_proto::ROUTES).await?;
    // The renderer fences off messages of an epoch older than the newest it has seen: this
    // run's must be above every earlier run's, whatever this machine's clock says.
    let last_epoch = newest_epoch(&routes, args.cluster_id.as_ref()).await?;

    let slices = kube_adapter::endpoint_slice_api(&client).await;
    let policy_ref = args.tenancy_policy.as_ref().map(|(ns, name)| (ns.as_str(), name.as_str()));
    let settings_ns = args.settings_namespace.as_ref().map(|ns| ns.as_str());
    // The Gateway API is read where the cluster serves it (its CRDs installed before the
    // watcher starts: discovery is not repeated).
    let gateway_api = kube_adapter::serves_gateway_api(&client).await;
    info!(
        gateway_api = gateway_api.is_some(),
        tls_routes = gateway_api.is_some_and(|g| g.tls_routes),
        tcp_routes = gateway_api.is_some_and(|g| g.tcp_routes),
        "Gateway API (gateway.networking.k8s.io/v1) served by the cluster"
    );
    let (caches, mut changes) = kube_adapter::watch(
        client.clone(),
        slices,
        (!args.seal_to.is_empty()).then_some(args.tls_namespaces.as_slice()),
        (policy_ref, settings_ns),
        gateway_api,
    );
    let secrets_client = client.clone();
    let warnings = Warnings::new(client.clone());
    let mut state = State {
        cluster: args.cluster_id.clone(),
        epoch: crate::k8s::elector::next_epoch(
            last_epoch,
            SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64,
        ),
        seq: 0,
        published: Published::default(),
        nodes: None,
        kept: BTreeSet::new(),
        held_new: BTreeSet::new(),
        snapshot_due: false,
        warned: BTreeSet::new(),
        leader: None,
        tls: TlsState {
            client: Some(secrets_client),
            ..TlsState::default_for(args.seal_to.iter().cloned())
        },
        memo: resolve::Memo::default(),
        seal_memo: Default::default(),
        slices: Default::default(),
        policy: Default::default(),
        churn: Default::default(),
        restating: None,
        settings: Default::default(),
        route_seqs: Default::default(),
        served: Default::default(),
        statuses: Default::default(),
        last_gateway: None,
    };
    state.statuses.spawn_writer(warnings.clone());
    let shutdown = hafleet_runtime::shutdown_signal();
    tokio::pin!(shutdown);

    // Drive the watches until every cache holds its initial list.
    let ready = caches.ready();
    tokio::pin!(ready);
    loop {
        tokio::select! {
            r = &mut ready => { r.context("watch caches never became ready")?; break; }
            _ = changes.next() => {}
            _ = &mut shutdown => {
                info!("watcher stopping (the watches had not listed yet)");
                stop(&bus).await;
                return Ok(());
            }
        }
    }
    // With leader election, stand by (keeping the caches warm) until this replica holds the
    // lease; its epoch is when it took it, so a later leader's messages are newer.
    if args.lease.leader_election {
        let elector = crate::k8s::elector::Elector::new(client, &args.lease);
        // A standby with warm caches is ready: ready to take over.
        health.ready();
        let lead = elector.lead(last_epoch);
        tokio::pin!(lead);
        let leadership = loop {
            tokio::select! {
                l = &mut lead => break l,
                _ = changes.next() => {}
                _ = &mut shutdown => {
                    info!("watcher stopping (standing by)");
                    bus.drain().await;
                    return Ok(());
                }
            }
        };
        state.epoch = leadership.since_unix_nanos;
        health.gauge(LEADER, &[], 1.0);
        state.leader = Some(leadership);
    }
    let epoch = state.epoch;
    info!(epoch, "caches listed; publishing the initial state");
    // Both retried until done, or until a stop is asked for: NATS may be away for long.
    let initial = async || sync(&args, &caches, &warnings, &bus, &mut state).await;
    let published = crate::app::snapshot::until_done("initial publish", shutdown.as_mut(), initial);
    if published.await.is_none() {
        info!("watcher stopping (the initial state was not published)");
        stop(&bus).await;
        return Ok(());
    }
    let snapshot = async || send_snapshot(&bus, &mut state).await;
    let sent = crate::app::snapshot::until_done("snapshot publish", shutdown.as_mut(), snapshot);
    if sent.await.is_none() {
        info!("watcher stopping (the snapshot was not published)");
        stop(&bus).await;
        return Ok(());
    }
    health.ready();
    // The initial state restates what the fleets run: only changes from here on are counted.
    state.churn = crate::core::churn::Budget::new(args.namespace_changes_per_minute);
    state.route_seqs.clear();
    // What the first pass counted waits for the sequences just forgotten: the next wake-up
    // runs a pass.
    state.last_gateway = None;
    // Events from the fleets' reports on the Ingresses that caused each version: the leader's
    // job, started again if NATS stops delivering (the streams may not exist yet).
    {
        let (bus, store, warnings) = (bus.clone(), caches.ingresses.clone(), warnings.clone());
        let cluster = args.cluster_id.clone();
        let served = state.served.clone();
        tokio::spawn(async move {
            let mut told = crate::core::feedback::Feedback::for_cluster(cluster);
            let mut fleets = crate::core::served::Fleets::default();
            loop {
                let (bus, store, warnings) = (bus.clone(), store.clone(), warnings.clone());
                let run =
                    super::notices::run(bus, store, warnings, (&mut told, &mut fleets, &served));
                if let Err(e) = run.await {
                    debug!(error = ?e, "reading the fleets' reports stopped; again in 5 s");
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
    }

    // A renderer whose routes stream lost events it never applied asks for everything again.
    let mut resyncs = bus
        .client
        .subscribe(hafleet_proto::RESYNC_SUBJECT)
        .await
        .context("cannot subscribe to renderers' resync requests")?;
    let mut last_restated: Option<tokio::time::Instant> = None;
    let debounce = args.debounce;
    let quiet = args.quiet.min(args.debounce);
    let resync = args.resync.max(Duration::from_secs(1));
    let mut leadership = state.leader.clone();
    let served_changed = state.served.changed.clone();
    let lost = async move {
        match leadership.as_mut() {
            Some(l) => l.lost().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    // When the last cluster change was taken in (see lone_change).
    let mut last_change: Option<tokio::time::Instant> = None;
    loop {
        let due = state.churn.next_due(tokio::time::Instant::now());
        // Woken only because a fleet serves another version: nothing a pass reads changed.
        let mut served_only = false;
        tokio::select! {
            _ = &mut lost => {
                // Another replica may hold it now: stop publishing at once, and come back as
                // a standby (the process manager restarts it).
                bus.drain().await;
                anyhow::bail!("lost the lease: exiting, to come back as a standby");
            }
            tick = changes.next() => {
                if tick.is_none() { break; }
                if lone_change(last_change.map(|t| t.elapsed())) {
                    // Nothing else is coming that anything says of: resolved at once, with
                    // whatever else the watches already hold (their caches kept current).
                    while let Some(Some(_)) = changes.next().now_or_never() {}
                } else {
                    // Changes in a row: let the burst settle, keeping the caches current
                    // meanwhile, until no change came for `quiet`, or `debounce` after the first.
                    let settle = tokio::time::sleep(debounce);
                    tokio::pin!(settle);
                    loop {
                        tokio::select! {
                            _ = &mut settle => break,
                            more = tokio::time::timeout(quiet, changes.next()) => {
                                if more.is_err() { break; }
                            }
                        }
                    }
                }
                last_change = Some(tokio::time::Instant::now());
            }
            _ = tokio::time::sleep(resync) => {}
            Some(asked) = resyncs.next() => {
                // At most one restatement per 10 s, however often it is asked for.
                if last_restated.is_some_and(|t| t.elapsed() < Duration::from_secs(10)) {
                    continue;
                }
                last_restated = Some(tokio::time::Instant::now());
                let lost = String::from_utf8_lossy(&asked.payload).chars().take(64).collect::<String>();
                info!(lost_seqs = %lost, "a renderer lost events it never applied: publishing every Ingress again, then a snapshot");
                restate(&mut state, args.namespace_changes_per_minute);
            }
            // A fleet serves another version: the Gateways' Programmed may change. Without a
            // Gateway nothing does, and a pass at each rollout's end (165 ms at 10,000
            // Ingresses) would only hold up the next change; the wake-up waits for one.
            _ = served_changed.notified(), if has_gateways(&caches) => served_only = true,
            // Held changes whose namespace has budget again.
            _ = crate::core::churn::sleep_until(due) => {}
            _ = &mut shutdown => break,
        }
        // The Gateways' Programmed is decided again from the last pass's reading: a pass at
        // each rollout's end would hold up the next change for as long as it takes (at
        // 10,000 HTTPRoutes, most of that change's wait in the watcher).
        if served_only
            && let Some(g) = &caches.gateway
            && let Some((mut pass, attached)) = state.last_gateway.take()
        {
            if state.leader.as_ref().is_none_or(|l| l.holds()) {
                // The statuses are compared with the objects as the caches hold them now (the
                // pass's may predate a status hafleet wrote since).
                let (classes, gateways) = (g.classes.state(), g.gateways.state());
                super::effects::current_gateways(&mut pass, &gateways);
                queue_gateway_status(&args, &state, &classes, (&pass.index, &attached));
            }
            state.last_gateway = Some((pass, attached));
            continue;
        }
        match sync(&args, &caches, &warnings, &bus, &mut state).await {
            Err(e) => {
                // The next wake-up, whatever it is, runs a pass: what failed is tried again,
                // and no status is decided from the pass before.
                state.last_gateway = None;
                warn!(error = %format!("{e:#}"), "publish failed; will retry")
            }
            Ok(()) => {
                // A restatement is out (its snapshot too): changes count again.
                if let Some(per_minute) = state.restating.take_if(|_| !state.snapshot_due) {
                    state.churn = crate::core::churn::Budget::new(per_minute);
                }
            }
        }
    }
    info!("watcher stopping");
    bus.drain().await;
    Ok(())
}

/// How long the cluster must have been without a change for the next one to be resolved at
/// once ([`lone_change`]).
const LONE_AFTER: Duration = Duration::from_secs(1);

/// Whether a cluster change is resolved at once rather than after a settling window: when
/// none came for [`LONE_AFTER`] before it (`since_last`: how long ago the last one was taken
/// in; `None`, none since start-up). A lone change (a user's edit) has nothing to wait for, and
/// waiting for `--quiet` was a fifth of a change's time at 10 Ingresses. One that follows
/// others within a second is taken to be part of a burst (an `apply` of many objects, a
/// namespace created or deleted, a scale-up) and settles first: the burst's first change
/// going alone costs its namespace one more pass of its churn budget, which a threshold of
/// `--debounce` (100 ms) spent often enough on a loaded machine to hold bursts back.
fn lone_change(since_last: Option<Duration>) -> bool {
    since_last.is_none_or(|d| d >= LONE_AFTER)
}

/// Whether the cluster has a Gateway (of any class): only then does what the fleets serve
/// change a status.
fn has_gateways(caches: &crate::k8s::watch::Caches) -> bool {
    caches.gateway.as_ref().is_some_and(|g| !g.gateways.is_empty())
}

/// Makes the next pass publish every routed Ingress again and a snapshot after them, as the
/// initial publish does: nothing counts as published, and the churn budget starts anew (a
/// restatement is no tenant's change).
fn restate(state: &mut State, changes_per_minute: u32) {
    state.published.clear();
    state.nodes = None;
    state.tls.defaults.clear();
    state.settings.forget_published();
    state.snapshot_due = true;
    state.churn = crate::core::churn::Budget::new(0);
    state.restating = Some(changes_per_minute);
}

/// Flushes what NATS has pending and closes, for at most a few seconds: NATS may be what the
/// watcher was waiting for when the stop came.
async fn stop(bus: &Bus) {
    if tokio::time::timeout(Duration::from_secs(5), bus.drain()).await.is_err() {
        warn!("NATS did not drain in 5 s; exiting without");
    }
}

/// The newest epoch this watcher's run must be above (`None` when the stream holds nothing
/// to go by): of the stream's last message, and of the last node set and snapshot of its own
/// cluster (the last message may be another cluster's, whose watcher's clock is behind).
async fn newest_epoch(
    routes: &async_nats::jetstream::stream::Stream,
    cluster: Option<&hafleet_proto::ClusterId>,
) -> anyhow::Result<Option<u64>> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound;
    // No such message is an answer (dropped by retention, or none sent yet), not a failure
    // to wait out.
    let found = |got: Result<
        async_nats::jetstream::message::StreamMessage,
        async_nats::jetstream::stream::LastRawMessageError,
    >| match got {
        Ok(m) => Ok(hafleet_proto::RouteMessage::decode(&m.payload).ok().map(|m| m.epoch())),
        Err(e) if e.kind() == NoMessageFound => Ok(None),
        Err(e) => Err(e),
    };
    let mut newest = None;
    let last = routes.cached_info().state.last_sequence;
    if last > 0 {
        let read = || async { found(routes.get_raw_message(last).await) };
        newest = hafleet_runtime::nats::retrying("the routes stream's newest message", read)
            .await
            .context("cannot read the routes stream's newest message")?;
    }
    for subject in [
        hafleet_proto::routes_nodes_subject(cluster),
        hafleet_proto::routes_snapshot_subject(cluster),
    ] {
        let read = || async { found(routes.get_last_raw_message_by_subject(&subject).await) };
        let epoch = hafleet_runtime::nats::retrying("this cluster's newest message", read)
            .await
            .with_context(|| format!("cannot read the last message on {subject}"))?;
        newest = newest.max(epoch);
    }
    Ok(newest)
}

const ROUTE_EVENTS: (&str, &str) = (
    "hafleet_watcher_route_events_total",
    "Route events published (and acked), by upsert or delete.",
);
const LEADER: (&str, &str) = (
    "hafleet_watcher_leader",
    "1 while this replica publishes (holds the lease, or runs without leader election).",
);
/// Resolves everything from the caches ([`crate::core::pass`] decides) and carries the plan
/// out: tells, publishes what changed, records what was acked. Stops at the first failed
/// publish; what was not published is found again next time.
async fn sync(
    args: &RunArgs,
    caches: &Caches,
    warnings: &Warnings,
    bus: &Bus,
    state: &mut State,
) -> anyhow::Result<()> {
    if let Some(lease) = &state.leader {
        anyhow::ensure!(lease.holds(), "the lease may have run out: not publishing");
    }
    let started = std::time::Instant::now();
    let services: Services = caches
        .services
        .state()
        .into_iter()
        .filter_map(|s| Some(((s.metadata.namespace.clone()?, s.metadata.name.clone()?), s)))
        .collect();
    let all_nodes = caches.nodes.state();
    let nodes = resolve::ready_nodes(all_nodes.iter().map(|n| n.as_ref()));
    // Only Local Services look their endpoints up: the others' slices (most of a cluster's,
    // and its busiest objects) are not read.
    // Services in pods mode read their slices (each parsed once per object), as do Local
    // ones for their nodes; the others' slices (most of a cluster's, and its busiest objects)
    // are not read.
    let pods_fleets = args.pods_fleets();
    let endpoints = caches.endpoint_slices.as_ref().map(|slices| {
        let slices = slices.state();
        let service = |ns: &str, name: &str| services.get(&(ns.to_owned(), name.to_owned()));
        let local = slices.iter().map(|s| s.as_ref()).filter(|s| {
            resolve::slice_service(s).is_some_and(|(ns, name)| {
                service(ns, name).is_some_and(|svc| resolve::is_local(svc))
            })
        });
        let nodes = resolve::endpoints(local, all_nodes.iter().map(|n| n.as_ref()));
        let pods = state.slices.by_service(&slices, |ns, name| {
            service(ns, name).is_some_and(|svc| match crate::core::pods::mode_of(svc) {
                Ok(Some(mode)) => mode == crate::core::pods::Mode::Pods,
                // Said wrong: the Ingresses that route to it are told.
                Err(_) => false,
                Ok(None) => !pods_fleets.is_empty(),
            })
        });
        resolve::Endpoints { nodes, pods }
    });
    if state.nodes.as_ref() != Some(&nodes) {
        send_nodes(bus, state, nodes).await?;
    }
    let policy = match (&caches.policy, &args.tenancy_policy) {
        (Some(store), Some(at)) => {
            let cm = store.state().into_iter().next();
            Some(state.policy.in_force(at, cm.as_deref()).map_err(anyhow::Error::msg)?.clone())
        }
        _ => None,
    };
    let rules = pass::Rules {
        resolve: resolve::Config {
            ingress_class: args.ingress_class.as_deref(),
            pods_fleets: &pods_fleets,
        },
        namespaces_own_hosts: !args.share_hosts_across_namespaces,
        limits: args.ingress_limits(),
        payload_limit: bus.payload_limit(),
        max_kept_per_namespace: args.max_kept_per_namespace,
        cert_expiry_warning_days: args.cert_expiry_warning_days,
        bulk_delete_threshold: args.bulk_delete_threshold,
    };
    let ingresses = caches.ingresses.state();
    let gateway = caches.gateway.as_ref().map(|g| {
        let labels: crate::core::gateway::NamespaceLabels = g
            .namespaces
            .state()
            .iter()
            .filter_map(|n| Some((n.metadata.name.clone()?, n.metadata.labels.clone()?)))
            .collect();
        let state = |s: &Option<kube::runtime::reflector::Store<_>>| {
            s.as_ref().map(|s| s.state()).unwrap_or_default()
        };
        let routes = (g.routes.state(), state(&g.tls_routes), state(&g.tcp_routes));
        (g.classes.state(), g.gateways.state(), routes, g.grants.state(), labels)
    });
    let gateway = gateway.as_ref().map(|(classes, gateways, routes, grants, labels)| {
        let (routes, tls_routes, tcp_routes) = (&routes.0, &routes.1, &routes.2);
        let namespaces = Some(labels);
        crate::core::gateway::Objects {
            classes,
            gateways,
            routes,
            tls_routes,
            tcp_routes,
            grants,
            namespaces,
        }
    });
    let objects = pass::Objects {
        ingresses: &ingresses,
        gateway: gateway.as_ref(),
        services: &services,
        endpoints: endpoints.as_ref(),
        policy: policy.as_ref(),
    };
    // Warnings said before may be about Ingresses that changed or went since.
    let prune_warned = !state.warned.is_empty();
    let resolution =
        pass::resolve(&objects, &rules, &mut state.memo, &state.published, prune_warned);
    let resolved = started.elapsed();
    let now_unix = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;
    // The one read in the middle of a pass: the TLS Secrets the routed Ingresses name whose
    // resourceVersion changed.
    if let Some(meta) = &caches.tls_secrets {
        let seal_to = &state.tls.seal_to;
        let wanted = resolution.secrets(|fleet| seal_to.contains_key(fleet));
        let defaults = args.default_cert.iter().filter(|(f, _)| seal_to.contains_key(f));
        let wanted = wanted.into_iter().chain(defaults.map(|(_, secret)| secret.clone()));
        state.tls.refresh(meta, &wanted.collect(), now_unix).await;
    }
    let (tls_state, churn, seal_memo) = (&mut state.tls, &mut state.churn, &mut state.seal_memo);
    let sealing: BTreeSet<FleetName> = tls_state.seal_to.keys().cloned().collect();
    let sealed_for = |fleet: &FleetName| sealing.contains(fleet);
    let mut lookup =
        |fleet: &FleetName, ns: &str, name: &str| tls_state.sealed(fleet, ns, name, now_unix);
    let tls = caches.tls_secrets.is_some().then_some(pass::Tls {
        sealed_for: &sealed_for,
        lookup: &mut lookup,
        now_unix,
        memo: seal_memo,
    });
    let now = tokio::time::Instant::now();
    let mut plan = pass::finish(resolution, tls, &rules, &state.published, churn, now);

    for t in &plan.tells {
        let said = (&t.key, t.rv.as_str(), t.reason, t.note.clone());
        tell(warnings, &mut state.warned, &t.subject, said, t.what).await;
    }
    // Forget warnings about objects that changed or went away, so the set stays bounded.
    if let Some(current) = &plan.current {
        state.warned.retain(|(k, rv, _)| current.contains(&(k.clone(), rv.clone())));
    }
    state.held_new = std::mem::take(&mut plan.held_new);
    // An Ingress that leaves `kept` (fixed, moved or deleted) may still be held by the renderer
    // from before this watcher started, unknown to `published`: a new snapshot sweeps it.
    if state.kept.iter().any(|k| !plan.kept.contains(k)) {
        state.snapshot_due = true;
    }
    state.kept = std::mem::take(&mut plan.kept);
    // What a pass costs before it publishes; only Ingresses whose inputs changed are resolved.
    debug!(
        ingresses = plan.desired(),
        changed = plan.actions.len(),
        resolved_anew = state.memo.fresh(),
        sealed_anew = state.seal_memo.fresh(),
        resolve_ms = resolved.as_secs_f64() * 1000.0,
        pass_ms = started.elapsed().as_secs_f64() * 1000.0,
        held = plan.held.len(),
        "pass over the cluster's objects"
    );
    for (fleet, keys) in &plan.bulk {
        warn!(fleet = %fleet, ingresses = keys.len(),
              "many Ingresses gone at once: publishing a snapshot for the renderer's guard to check instead of deletes");
    }
    let bulk = |action: &Action| match action {
        Action::Delete { fleet, key } => plan.bulk.get(fleet).is_some_and(|k| k.contains(key)),
        Action::Upsert(_) => false,
    };
    let (bulk_deletes, actions): (Vec<Action>, Vec<Action>) =
        std::mem::take(&mut plan.actions).into_iter().partition(bulk);
    for action in bulk_deletes {
        // The snapshot below leaves it out of `live`.
        index::record(&mut state.published, &action);
        state.snapshot_due = true;
    }
    let mut more = actions.len();
    for action in actions {
        more -= 1;
        publish(bus, state, action, more).await?;
    }
    for (fleet, (ns, name)) in &args.default_cert {
        send_default_cert(bus, state, fleet, (ns, name), now_unix).await?;
    }
    if let Some(store) = &caches.settings {
        // Each fleet once: a clone per published object would be 50,000 at 50,000 Ingresses.
        let fleets: std::collections::BTreeSet<&FleetName> =
            state.published.values().flatten().map(|(fleet, _)| fleet).collect();
        let fleets = fleets.into_iter().cloned().collect();
        send_settings(bus, warnings, state, &store.state(), fleets).await?;
    }
    // Last: a snapshot closes what came before it (a renderer that lost events waits for one
    // after everything is restated).
    if state.snapshot_due {
        send_snapshot(bus, state).await?;
    }
    // Every Ingress routed on a fleet with addresses shows them, once its routes are out.
    for (key, fleet, ing) in plan.routed(|fleet| args.fleet_addresses.contains_key(fleet)) {
        if !state.published.contains_key(key) {
            continue; // held
        }
        let Some(addresses) = args.fleet_addresses.get(fleet) else { continue };
        if !crate::core::status::shows(ing, addresses) {
            warnings.set_status(ing, addresses.clone()).await;
        }
    }
    if let Some(objects) = &gateway {
        let attached =
            super::effects::route_status(&state.statuses, &plan.gateway, &state.route_seqs);
        queue_gateway_status(args, state, objects.classes, (&plan.gateway.index, &attached));
        state.last_gateway = Some((std::mem::take(&mut plan.gateway), attached));
    }
    Ok(())
}

/// Queues the statuses of GatewayClasses `classes` and of the Gateways of `index` with the
/// routes `attached` to them, given what the fleets serve now
/// ([`super::effects::gateway_status`]).
fn queue_gateway_status(
    args: &RunArgs,
    state: &State,
    classes: &[std::sync::Arc<kube::api::DynamicObject>],
    gateways: (&crate::core::gateway::Index, &super::effects::Attached),
) {
    let served = state.served.fleets.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let now_unix = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let unusable =
        |fleet: &FleetName, ns: &str, name: &str| state.tls.unusable(fleet, ns, name, now_unix);
    super::effects::gateway_status(&state.statuses, classes, gateways, args, &served, &unusable);
}

/// Publishes one route event and records it once acked; `more` route events of this pass
/// follow it (the renderer renders at once after the last: [`hafleet_proto::PASS_MORE_HEADER`]).
async fn publish(bus: &Bus, state: &mut State, action: Action, more: usize) -> anyhow::Result<()> {
    let at = (state.epoch, state.cluster.as_ref());
    let (fleet, key, msg) = match &action {
        Action::Upsert(r) => {
            let change = RouteChange::Upsert { routes: r.routes.to_vec(), tls: r.tls.to_vec() };
            let msg =
                route_event(&r.fleet, &r.key, r.created_unix, &r.resource_version, change, at);
            (&r.fleet, &r.key, msg)
        }
        Action::Delete { fleet, key } => {
            (fleet, key, route_event(fleet, key, 0, "", RouteChange::Delete, at))
        }
    };
    let id = state.next_msg_id();
    let more = more.to_string();
    let more = [(hafleet_proto::PASS_MORE_HEADER, more.as_str())];
    let subject = hafleet_proto::routes_subject(fleet);
    let seq = match bus.publish_with_headers(subject, &id, msg.encode(), &more).await {
        Ok(seq) => seq,
        Err(e) => {
            // The publish may or may not have been stored: the next sync sends what is
            // desired for this Ingress again (an upsert or a delete repeated is harmless).
            index::record_unknown(&mut state.published, &action);
            return Err(e.into());
        }
    };
    let op = if matches!(action, Action::Upsert(_)) { "upsert" } else { "delete" };
    info!(fleet = %fleet, ingress = %key, op, stream_seq = seq, "route event published");
    if !key.kind.is_ingress() {
        let seqs = state.route_seqs.entry(key.clone()).or_default();
        match seqs.iter_mut().find(|(f, _)| f == fleet) {
            Some((_, s)) => *s = seq,
            None => seqs.push((fleet.clone(), seq)),
        }
    }
    hafleet_runtime::health::Health::global().count(ROUTE_EVENTS, &[("op", op)], 1.0);
    index::record(&mut state.published, &action);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_after_a_quiet_second_is_resolved_at_once_one_in_a_burst_settles_first() {
        assert!(lone_change(None), "the first change since start-up");
        assert!(lone_change(Some(Duration::from_secs(1))));
        assert!(lone_change(Some(Duration::from_secs(60))));
        assert!(!lone_change(Some(Duration::from_millis(999))));
        assert!(!lone_change(Some(Duration::from_millis(100))));
        assert!(!lone_change(Some(Duration::ZERO)));
    }
}
