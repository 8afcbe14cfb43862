//! A fleet's desired state and how route messages change it. Pure: no sled, no NATS.
//!
//! The state of a fleet is the set of its Ingresses with their resolved routes. Messages are
//! applied in stream order; the caller skips any message whose stream sequence is at or below
//! the last one applied, so redelivery after a crash changes nothing (invariant 4).

use hafleet_proto::{
    Cause, ClusterId, FleetName, HeldSweep, IngressKey, NodeAddr, Route, RouteChange, RouteMessage,
    TlsEntry,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What the renderer keeps of one Ingress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngressEntry {
    pub created_unix: i64,
    pub resource_version: String,
    /// Shared, so that the model's memo knows an unchanged Ingress by pointer
    /// ([`crate::core::model::Memo`]); an event with the same routes keeps the Arc.
    pub routes: Arc<Vec<Route>>,
    /// Stream sequence of the event that set these routes: when Ingresses share a Service,
    /// the newest event's server list is the current one.
    #[serde(default)]
    pub seq: u64,
    /// Its TLS entries: which of its hosts are served with which certificate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls: Vec<hafleet_proto::TlsEntry>,
    /// Taken out of the fleet's config by a [`hafleet_proto::Quarantine`] (what HAProxy said),
    /// until an event with another resourceVersion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<String>,
}

/// One fleet's Ingresses.
pub type Ingresses = BTreeMap<IngressKey, IngressEntry>;

static NO_INGRESSES: Ingresses = BTreeMap::new();

/// Each cluster's nodes (`None`: the cluster of watchers without `--cluster-id`), as the
/// newest nodes message of that cluster gave them: sorted by name, each once. A route's
/// servers are nodes of its Service's cluster.
pub type Nodes = BTreeMap<Option<ClusterId>, Vec<NodeAddr>>;

/// A held sweep is a fleet's and a cluster's: each cluster's snapshot sweeps its own.
pub type HoldKey = (FleetName, Option<ClusterId>);

/// What every config is rendered from: each fleet's Ingresses and the nodes their routes go to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    pub fleets: BTreeMap<FleetName, Ingresses>,
    pub nodes: Nodes,
    /// Per cluster, the newest watcher epoch seen: messages of an older one (a deposed leader
    /// that resumed after a pause) are fenced off. Each cluster's watchers count their own.
    pub epochs: BTreeMap<Option<ClusterId>, u64>,
    /// Per fleet and cluster, the withdrawals of a snapshot that the [`SweepGuard`] held back;
    /// those Ingresses stay in `fleets` (and live) until a [`RouteMessage::Confirm`] releases
    /// them.
    pub held: BTreeMap<HoldKey, HeldSweep>,
    /// Per fleet, the certificate HTTPS answers with for a name no Ingress has one for
    /// ([`RouteMessage::DefaultCert`]).
    pub default_certs: BTreeMap<FleetName, hafleet_proto::SealedCert>,
    /// Per fleet, the settings its watcher read ([`RouteMessage::Settings`]); a fleet not
    /// here has the defaults.
    pub settings: BTreeMap<FleetName, hafleet_proto::FleetSettings>,
    /// The renderer's template and options as of this point of the stream
    /// ([`RouteMessage::Render`]); `None` before any renderer recorded them (then the
    /// renderer's own flags decide).
    pub render: Option<hafleet_proto::RenderSettings>,
}

/// When a snapshot's withdrawals are held instead of applied: when they would take more than
/// `percent` % of a fleet's routes, and at least `min_routes` routes, at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepGuard {
    /// 1–100; 100 never holds.
    pub percent: u8,
    pub min_routes: usize,
}

impl Default for SweepGuard {
    fn default() -> Self {
        SweepGuard { percent: 50, min_routes: 10 }
    }
}

impl SweepGuard {
    /// The guard `settings` describe.
    pub fn of(settings: &hafleet_proto::RenderSettings) -> Self {
        SweepGuard {
            percent: settings.sweep_guard_percent,
            min_routes: settings.sweep_guard_min_routes,
        }
    }

    /// The guard in force for `desired`: the one the stream recorded, else `self` (the
    /// renderer's flags, before any renderer recorded its settings).
    pub fn in_force(self, desired: &Desired) -> Self {
        desired.render.as_ref().map_or(self, SweepGuard::of)
    }

    /// Whether withdrawing `routes` of a fleet's `of` routes at once is held.
    pub fn holds(&self, routes: usize, of: usize) -> bool {
        routes >= self.min_routes && routes * 100 > usize::from(self.percent) * of
    }
}

impl Desired {
    pub fn new() -> Self {
        Desired::default()
    }

    /// A fleet's Ingresses; none for a fleet the state does not know.
    pub fn ingresses(&self, fleet: &FleetName) -> &Ingresses {
        self.fleets.get(fleet).unwrap_or(&NO_INGRESSES)
    }

    /// The newest epoch seen of `cluster`'s watchers.
    pub fn epoch(&self, cluster: Option<&ClusterId>) -> u64 {
        self.epochs.get(&cluster.cloned()).copied().unwrap_or(0)
    }

    /// The sweeps held in `fleet`, one per cluster at most.
    pub fn held_in<'a>(&'a self, fleet: &'a FleetName) -> impl Iterator<Item = &'a HeldSweep> {
        self.held.iter().filter(move |((f, _), _)| f == fleet).map(|(_, h)| h)
    }
}

/// One change to the stored state, for the store to write in the same transaction as versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateWrite {
    Put(FleetName, IngressKey, IngressEntry),
    Remove(FleetName, IngressKey),
    /// A cluster's node set, replaced whole.
    Nodes(Option<ClusterId>, Vec<NodeAddr>),
    /// The newest watcher epoch of a cluster.
    Epoch(Option<ClusterId>, u64),
    /// Every held sweep, replaced whole.
    Held(BTreeMap<HoldKey, HeldSweep>),
    /// Every fleet's default certificate, replaced whole.
    DefaultCerts(BTreeMap<FleetName, hafleet_proto::SealedCert>),
    /// Every fleet's settings, replaced whole.
    Settings(BTreeMap<FleetName, hafleet_proto::FleetSettings>),
    /// The renderer's settings, replaced whole.
    Render(Option<hafleet_proto::RenderSettings>),
}

/// The outcome of applying a batch: writes for the store, and per fleet the causes to record.
#[derive(Debug, Default)]
pub struct Applied {
    pub writes: Vec<StateWrite>,
    pub causes: BTreeMap<FleetName, Vec<Cause>>,
    /// Messages fenced off: (their epoch, the newest seen).
    pub fenced: Vec<(u64, u64)>,
    /// Holds that began, changed or ended ([`Desired::held`]); the caller stamps new ones
    /// with the time and writes [`StateWrite::Held`].
    pub held_changed: BTreeSet<HoldKey>,
    /// Releases that matched no held sweep: (fleet, snapshot sequence).
    pub stale_confirms: Vec<(FleetName, u64)>,
    /// The renderer's settings changed ([`RouteMessage::Render`]): render with the new ones.
    pub render_changed: bool,
}

/// How a route is named in a version's causes: `host/path (Kind)`, `*` for any host.
pub fn route_label(route: &Route) -> String {
    let host = route.host.as_ref().map(|h| h.as_str()).unwrap_or("*");
    // A TLSRoute's name is chosen by the SNI, a TCPRoute's by the port: no path.
    let mut label = match (route.is_passthrough(), route.tcp_port()) {
        (true, _) => format!("sni {host} (passthrough)"),
        (false, Some(port)) => format!("tcp port {port}"),
        (false, None) => format!("{host}{} ({:?})", route.path, route.kind),
    };
    // An HTTPRoute's matches and weights: `when GET X-Canary: yes ?debug=on TLS`, `split 9:1`.
    if let Some(more) = route.more.as_deref() {
        let mut when: Vec<String> = more.method.iter().map(|m| m.as_str().to_owned()).collect();
        when.extend(more.headers.iter().map(|(n, v)| format!("{n}: {v}")));
        when.extend(more.query.iter().map(|(n, v)| format!("?{n}={v}")));
        if more.tls {
            when.push("TLS".to_owned());
        }
        if !when.is_empty() {
            label.push_str(&format!(" when {}", when.join(" ")));
        }
        if !more.split.is_empty() {
            let weights: Vec<String> = std::iter::once(more.weight.unwrap_or(1))
                .chain(more.split.iter().map(|(w, _)| *w))
                .map(|w| w.to_string())
                .collect();
            label.push_str(&format!(" split {}", weights.join(":")));
        }
    }
    label
}

/// Routes in `new` and not in `old`, and the other way round, as labels.
fn route_changes(old: &[Route], new: &[Route]) -> (Vec<String>, Vec<String>) {
    let labels = |rs: &[Route]| rs.iter().map(route_label).collect::<BTreeSet<String>>();
    let (old, new) = (labels(old), labels(new));
    (new.difference(&old).cloned().collect(), old.difference(&new).cloned().collect())
}

/// The TLS labels (`tls <host> <fingerprint>`) in `new` and not in `old`, and the reverse.
fn tls_changes(old: &[TlsEntry], new: &[TlsEntry]) -> (Vec<String>, Vec<String>) {
    let labels = |es: &[TlsEntry]| {
        es.iter()
            .filter_map(|e| e.cert.as_ref().map(|c| (e, c)))
            .flat_map(|(e, c)| e.hosts.iter().map(move |h| format!("tls {h} {}", c.fingerprint)))
            .collect::<BTreeSet<String>>()
    };
    let (old, new) = (labels(old), labels(new));
    (new.difference(&old).cloned().collect(), old.difference(&new).cloned().collect())
}

/// An Ingress's incoming TLS entries as the renderer keeps them: a certificate the fleet
/// already holds (the same chain) keeps the sealed bytes it was first seen with, so a watcher
/// that seals it anew (after a restart) changes no version; an entry without a certificate
/// (its Secret is unusable now) keeps the one the Ingress had from that Secret, so a bad
/// Secret never takes a working certificate away. A certificate that fails its checks counts
/// as none.
fn settle_tls(
    fleet: &Ingresses,
    old: Option<&IngressEntry>,
    incoming: &[TlsEntry],
) -> Vec<TlsEntry> {
    // By (recipient, chain): a key sealed to another recipient (the fleet's identity replaced)
    // is taken as new.
    let mut known: BTreeMap<(&str, &str), &hafleet_proto::SealedCert> = BTreeMap::new();
    if incoming.iter().any(|e| e.cert.is_some()) {
        for e in fleet.values().flat_map(|i| &i.tls) {
            if let Some(c) = &e.cert {
                known.entry((c.recipient.as_str(), &*c.chain_pem)).or_insert(c);
            }
        }
    }
    // What the Ingress had from that Secret: its certificate and the hosts it served then.
    let had = |secret: &hafleet_proto::ObjectName| {
        old.into_iter()
            .flat_map(|o| &o.tls)
            .filter(|e| &e.secret == secret)
            .find_map(|e| Some((e.cert.as_ref()?, &e.hosts)))
    };
    incoming
        .iter()
        .map(|e| match e.cert.as_ref().filter(|c| c.check().is_ok()) {
            Some(c) => {
                let key = (c.recipient.as_str(), &*c.chain_pem);
                let cert = known.get(&key).map_or_else(|| c.clone(), |k| (*k).clone());
                TlsEntry { cert: Some(cert), ..e.clone() }
            }
            // Kept only for hosts it served then and covers.
            None => match had(&e.secret) {
                Some((cert, served)) => TlsEntry {
                    hosts: e
                        .hosts
                        .iter()
                        .filter(|h| served.contains(h))
                        .filter(|h| {
                            cert.names.iter().any(|n| hafleet_proto::tls::name_covers(n, h))
                        })
                        .cloned()
                        .collect(),
                    secret: e.secret.clone(),
                    cert: Some(cert.clone()),
                },
                None => e.clone(),
            },
        })
        .collect()
}

/// Nodes in `new` and not in `old` or at another address, and names in `old` and not in
/// `new`, as labels: `name (address)` and `name`, with `@cluster` after the name in a cluster.
fn node_changes(
    old: &[NodeAddr],
    new: &[NodeAddr],
    cluster: Option<&ClusterId>,
) -> (Vec<String>, Vec<String>) {
    let at = cluster.map(|c| format!("@{c}")).unwrap_or_default();
    let before: BTreeMap<&str, &std::net::IpAddr> =
        old.iter().map(|n| (n.name.as_str(), &n.addr)).collect();
    let after: BTreeSet<&str> = new.iter().map(|n| n.name.as_str()).collect();
    let added = new
        .iter()
        .filter(|n| before.get(n.name.as_str()) != Some(&&n.addr))
        .map(|n| format!("{}{at} ({})", n.name, n.addr))
        .collect();
    let removed = before
        .keys()
        .filter(|name| !after.contains(*name))
        .map(|name| format!("{name}{at}"))
        .collect();
    (added, removed)
}

/// Applies one message at stream sequence `seq` to `desired` (which must hold every fleet the
/// store knows for snapshot sweeps and node changes to see them) and records what changed.
///
/// A message from a watcher epoch older than the newest seen of its cluster changes nothing:
/// only the newest watcher (the Lease's holder) of each cluster is listened to. Epochs only
/// grow: a new leader takes one above the last one written in the Lease.
///
/// Each cluster's messages change that cluster's part of the state only: its nodes, its
/// Ingresses (a snapshot sweeps no other cluster's) and its held sweeps.
///
/// A snapshot whose withdrawals from a fleet trip `guard` withdraws nothing there: they are
/// held ([`Desired::held`]) until a confirm for that snapshot, and an Ingress that comes back
/// meanwhile (an upsert) or is deleted leaves the hold. A later snapshot replaces the hold.
pub fn apply(
    desired: &mut Desired,
    seq: u64,
    msg: &RouteMessage,
    guard: &SweepGuard,
    out: &mut Applied,
) {
    let guard = &guard.in_force(desired);
    let epoch = msg.epoch();
    let cluster = msg.cluster();
    let newest = desired.epoch(cluster);
    // A quarantine is the renderer's own (about Ingresses of any cluster): no watcher's
    // epoch fences it, and it moves none.
    let own = matches!(msg, RouteMessage::Quarantine(_) | RouteMessage::Render(_));
    if epoch < newest && !own {
        out.fenced.push((epoch, newest));
        return;
    }
    if epoch > newest && !own {
        desired.epochs.insert(cluster.cloned(), epoch);
        out.writes.push(StateWrite::Epoch(cluster.cloned(), epoch));
    }
    match msg {
        RouteMessage::Nodes(update) => {
            let mut nodes = update.nodes.clone();
            nodes.sort();
            nodes.dedup_by(|a, b| a.name == b.name);
            let old = desired.nodes.get(&update.cluster).map(Vec::as_slice).unwrap_or_default();
            if nodes == old {
                return;
            }
            let (added, removed) = node_changes(old, &nodes, cluster);
            desired.nodes.insert(update.cluster.clone(), nodes.clone());
            out.writes.push(StateWrite::Nodes(update.cluster.clone(), nodes));
            // Every fleet may route to these nodes: one cause each, one version each.
            for fleet in desired.fleets.keys() {
                out.causes.entry(fleet.clone()).or_default().push(Cause {
                    stream_seq: seq,
                    ingress: None,
                    what: "nodes".to_owned(),
                    resource_version: None,
                    added: added.clone(),
                    removed: removed.clone(),
                    note: None,
                });
            }
        }
        RouteMessage::Event(event) => {
            let hold = (event.fleet.clone(), event.ingress.cluster.clone());
            if let Some(held) = desired.held.get_mut(&hold) {
                let before = held.ingresses.len();
                held.ingresses.retain(|(k, _)| *k != event.ingress);
                if held.ingresses.len() != before {
                    if held.ingresses.is_empty() {
                        desired.held.remove(&hold);
                    }
                    out.held_changed.insert(hold);
                }
            }
            let fleet = desired.fleets.entry(event.fleet.clone()).or_default();
            let cause = |what: &str, (added, removed): (Vec<String>, Vec<String>)| Cause {
                stream_seq: seq,
                ingress: Some(event.ingress.clone()),
                what: what.to_owned(),
                resource_version: Some(event.resource_version.clone()),
                added,
                removed,
                note: None,
            };
            match &event.change {
                RouteChange::Upsert { routes, tls } => {
                    let tls = settle_tls(fleet, fleet.get(&event.ingress), tls);
                    let mut entry = IngressEntry {
                        created_unix: event.created_unix,
                        resource_version: event.resource_version.clone(),
                        routes: match fleet.get(&event.ingress) {
                            Some(old) if *old.routes == *routes => Arc::clone(&old.routes),
                            _ => Arc::new(routes.clone()),
                        },
                        seq,
                        tls,
                        quarantined: None,
                    };
                    // A quarantined Ingress stays out until what made its lines changes: a
                    // resend of the same routes (a watcher restart, a status write that bumped
                    // its resourceVersion) does not let it back in.
                    entry.quarantined = fleet
                        .get(&event.ingress)
                        .filter(|old| old.routes == entry.routes && old.tls == entry.tls)
                        .and_then(|old| old.quarantined.clone());
                    let unchanged = fleet.get(&event.ingress).is_some_and(|old| {
                        entry.seq = old.seq;
                        *old == entry
                    });
                    entry.seq = seq;
                    let old = fleet.get(&event.ingress);
                    let old_routes = old.map(|e| e.routes.as_slice());
                    let mut changes = route_changes(old_routes.unwrap_or_default(), routes);
                    let (added, removed) =
                        tls_changes(old.map(|e| e.tls.as_slice()).unwrap_or_default(), &entry.tls);
                    changes.0.extend(added);
                    changes.1.extend(removed);
                    if !unchanged {
                        fleet.insert(event.ingress.clone(), entry.clone());
                        out.writes.push(StateWrite::Put(
                            event.fleet.clone(),
                            event.ingress.clone(),
                            entry,
                        ));
                    }
                    out.causes
                        .entry(event.fleet.clone())
                        .or_default()
                        .push(cause("upsert", changes));
                }
                RouteChange::Delete => {
                    let mut changes = (vec![], vec![]);
                    if let Some(old) = fleet.remove(&event.ingress) {
                        changes = route_changes(&old.routes, &[]);
                        out.writes
                            .push(StateWrite::Remove(event.fleet.clone(), event.ingress.clone()));
                    }
                    out.causes
                        .entry(event.fleet.clone())
                        .or_default()
                        .push(cause("delete", changes));
                }
            }
        }
        // A part of a snapshot changes nothing by itself: the snapshot naming it reads it back
        // (crate::core::snapshots) and comes here whole.
        RouteMessage::SnapshotPart(_) => {}
        RouteMessage::Snapshot(snapshot) => {
            debug_assert!(snapshot.parts.is_empty(), "a snapshot in parts is joined first");
            let live: BTreeSet<(&FleetName, &IngressKey)> =
                snapshot.live.iter().map(|(f, k)| (f, k)).collect();
            let keep: BTreeSet<&IngressKey> = snapshot.keep.iter().collect();
            let moved_to: BTreeSet<&IngressKey> = snapshot.live.iter().map(|(_, k)| k).collect();
            for (fleet, ingresses) in desired.fleets.iter_mut() {
                // Its own cluster's Ingresses only: another cluster's are not in its view.
                let gone: Vec<(IngressKey, usize)> = ingresses
                    .iter()
                    .filter(|(k, _)| k.is_in(cluster))
                    .filter(|(k, _)| !live.contains(&(fleet, *k)) && !keep.contains(k))
                    .map(|(k, e)| (k.clone(), e.routes.len()))
                    .collect();
                // Ingresses that moved to another fleet are not deletions: they always go.
                let (moved, gone): (Vec<_>, Vec<_>) =
                    gone.into_iter().partition(|(k, _)| moved_to.contains(k));
                withdraw(fleet, ingresses, moved.into_iter().map(|(k, _)| k), seq, "sweep", out);
                // This snapshot says what the fleet holds now: an earlier hold is replaced
                // (held since it began, for the release policy).
                let hold = (fleet.clone(), cluster.cloned());
                let earlier = desired.held.remove(&hold);
                if earlier.is_some() {
                    out.held_changed.insert(hold.clone());
                }
                let routes: usize = gone.iter().map(|(_, n)| n).sum();
                // Of the routes this cluster gives the fleet: losing all of one cluster's is
                // held however many other clusters give.
                let fleet_routes: usize = ingresses
                    .iter()
                    .filter(|(k, _)| k.is_in(cluster))
                    .map(|(_, e)| e.routes.len())
                    .sum();
                if guard.holds(routes, fleet_routes) {
                    desired.held.insert(
                        hold.clone(),
                        HeldSweep {
                            snapshot_seq: seq,
                            epoch,
                            since_unix_ms: earlier.map_or(0, |h| h.since_unix_ms),
                            ingresses: gone,
                            fleet_routes,
                            cluster: cluster.cloned(),
                        },
                    );
                    out.held_changed.insert(hold);
                    continue;
                }
                let keys = gone.into_iter().map(|(k, _)| k);
                withdraw(fleet, ingresses, keys, seq, "sweep", out);
            }
        }
        RouteMessage::DefaultCert(d) => {
            let fleet = &d.fleet;
            let old = desired.default_certs.get(fleet);
            let new = d.cert.as_ref().filter(|c| c.check().is_ok());
            // The same chain sealed to the same recipient (a watcher that restarted) is no
            // change: the bytes held stay.
            let same = |a: &hafleet_proto::SealedCert, b: &hafleet_proto::SealedCert| {
                a.chain_pem == b.chain_pem && a.recipient == b.recipient
            };
            if match (old, new) {
                (Some(a), Some(b)) => same(a, b),
                (None, None) => true,
                _ => false,
            } {
                return;
            }
            let label = |c: &hafleet_proto::SealedCert| format!("default {}", c.fingerprint);
            let cause = Cause {
                stream_seq: seq,
                ingress: None,
                what: "default certificate".into(),
                resource_version: None,
                added: new.map(label).into_iter().collect(),
                removed: old.map(label).into_iter().collect(),
                note: None,
            };
            match new {
                Some(c) => desired.default_certs.insert(fleet.clone(), c.clone()),
                None => desired.default_certs.remove(fleet),
            };
            desired.fleets.entry(fleet.clone()).or_default();
            out.writes.push(StateWrite::DefaultCerts(desired.default_certs.clone()));
            out.causes.entry(fleet.clone()).or_default().push(cause);
        }
        RouteMessage::Settings(update) => {
            let fleet = &update.fleet;
            let defaults = hafleet_proto::FleetSettings::default();
            let old = desired.settings.get(fleet).unwrap_or(&defaults);
            if *old == update.settings {
                return;
            }
            let (before, after) = (old.describe(), update.settings.describe());
            let cause = Cause {
                stream_seq: seq,
                ingress: None,
                what: "settings".into(),
                resource_version: Some(update.resource_version.clone()).filter(|rv| !rv.is_empty()),
                added: after.iter().filter(|s| !before.contains(s)).cloned().collect(),
                removed: before.iter().filter(|s| !after.contains(s)).cloned().collect(),
                note: None,
            };
            match update.settings == defaults {
                true => desired.settings.remove(fleet),
                false => desired.settings.insert(fleet.clone(), update.settings.clone()),
            };
            desired.fleets.entry(fleet.clone()).or_default();
            out.writes.push(StateWrite::Settings(desired.settings.clone()));
            out.causes.entry(fleet.clone()).or_default().push(cause);
        }
        RouteMessage::Render(settings) => {
            if desired.render.as_ref() == Some(settings) {
                return;
            }
            let before = desired.render.as_ref().map(|r| r.describe()).unwrap_or_default();
            let after = settings.describe();
            for fleet in desired.fleets.keys() {
                out.causes.entry(fleet.clone()).or_default().push(Cause {
                    stream_seq: seq,
                    ingress: None,
                    what: "render settings".into(),
                    resource_version: None,
                    added: after.iter().filter(|s| !before.contains(s)).cloned().collect(),
                    removed: before.iter().filter(|s| !after.contains(s)).cloned().collect(),
                    note: None,
                });
            }
            desired.render = Some(settings.clone());
            out.writes.push(StateWrite::Render(desired.render.clone()));
            out.render_changed = true;
        }
        RouteMessage::Quarantine(q) => {
            let Some(ingresses) = desired.fleets.get_mut(&q.fleet) else { return };
            for (key, rv) in &q.ingresses {
                let Some(entry) = ingresses.get_mut(key) else { continue };
                // Changed since (its owner may have fixed it), or out already.
                if entry.resource_version != *rv || entry.quarantined.is_some() {
                    continue;
                }
                entry.quarantined = Some(q.message.clone());
                out.writes.push(StateWrite::Put(q.fleet.clone(), key.clone(), entry.clone()));
                out.causes.entry(q.fleet.clone()).or_default().push(Cause {
                    stream_seq: seq,
                    ingress: Some(key.clone()),
                    what: "quarantine".into(),
                    resource_version: Some(rv.clone()),
                    added: vec![],
                    removed: route_changes(&entry.routes, &[]).1,
                    note: Some(format!("version {} failed haproxy -c: {}", q.version, q.message)),
                });
            }
        }
        RouteMessage::Confirm(confirm) => {
            let fleet = &confirm.fleet;
            let hold = (fleet.clone(), confirm.cluster.clone());
            let Some(held) =
                desired.held.get(&hold).filter(|h| h.snapshot_seq == confirm.snapshot_seq)
            else {
                out.stale_confirms.push((fleet.clone(), confirm.snapshot_seq));
                return;
            };
            let keys: Vec<IngressKey> = held.ingresses.iter().map(|(k, _)| k.clone()).collect();
            desired.held.remove(&hold);
            out.held_changed.insert(hold);
            let what = format!("sweep confirmed by {}", confirm.by);
            let ingresses = desired.fleets.entry(fleet.clone()).or_default();
            withdraw(fleet, ingresses, keys.into_iter(), seq, &what, out);
        }
    }
}

/// Removes `keys` from a fleet's Ingresses, each a cause `what`.
fn withdraw(
    fleet: &FleetName,
    ingresses: &mut Ingresses,
    keys: impl Iterator<Item = IngressKey>,
    seq: u64,
    what: &str,
    out: &mut Applied,
) {
    for key in keys {
        let Some(old) = ingresses.remove(&key) else { continue };
        out.writes.push(StateWrite::Remove(fleet.clone(), key.clone()));
        out.causes.entry(fleet.clone()).or_default().push(Cause {
            stream_seq: seq,
            ingress: Some(key),
            what: what.to_owned(),
            resource_version: None,
            added: vec![],
            removed: route_changes(&old.routes, &[]).1,
            note: None,
        });
    }
}

#[cfg(test)]
mod tests;
