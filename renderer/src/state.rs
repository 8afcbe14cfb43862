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

/// What the renderer keeps of one Ingress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngressEntry {
    pub created_unix: i64,
    pub resource_version: String,
    pub routes: Vec<Route>,
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
}

/// How a route is named in a version's causes: `host/path (Kind)`, `*` for any host.
pub fn route_label(route: &Route) -> String {
    let host = route.host.as_ref().map(|h| h.as_str()).unwrap_or("*");
    format!("{host}{} ({:?})", route.path, route.kind)
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
                known.entry((c.recipient.as_str(), c.chain_pem.as_str())).or_insert(c);
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
                let key = (c.recipient.as_str(), c.chain_pem.as_str());
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
    let epoch = msg.epoch();
    let cluster = msg.cluster();
    let newest = desired.epoch(cluster);
    // A quarantine is the renderer's own (about Ingresses of any cluster): no watcher's
    // epoch fences it, and it moves none.
    let own = matches!(msg, RouteMessage::Quarantine(_));
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
                        routes: routes.clone(),
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
        // (crate::snapshots) and comes here whole.
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
mod tests {
    use super::*;
    use hafleet_proto::{NodesUpdate, ObjectName, RouteEvent, RoutesSnapshot, SCHEMA_VERSION};

    #[test]
    fn messages_of_an_older_watcher_epoch_are_fenced_off() {
        let mut desired = Desired::new();
        let mut out = Applied::default();
        let nodes = |epoch| {
            RouteMessage::Nodes(NodesUpdate {
                schema: SCHEMA_VERSION,
                epoch,
                nodes: vec![NodeAddr {
                    name: ObjectName::new("n1").unwrap(),
                    addr: "127.0.0.2".parse().unwrap(),
                }],
                cluster: None,
            })
        };
        apply_unguarded(&mut desired, 1, &nodes(10), &mut out);
        assert_eq!(desired.epoch(None), 10);
        assert!(out.writes.contains(&StateWrite::Epoch(None, 10)));
        let before = desired.clone();
        let mut out = Applied::default();
        let stale = RouteMessage::Snapshot(RoutesSnapshot {
            schema: SCHEMA_VERSION,
            epoch: 9,
            live: vec![],
            keep: vec![],
            cluster: None,
            parts: vec![],
        });
        apply_unguarded(&mut desired, 2, &stale, &mut out);
        assert_eq!(desired, before, "an older watcher's sweep changes nothing");
        assert_eq!(out.fenced, vec![(9, 10)]);
        assert!(out.writes.is_empty() && out.causes.is_empty());
        let mut out = Applied::default();
        apply_unguarded(&mut desired, 3, &nodes(11), &mut out);
        assert_eq!(
            (desired.epoch(None), out.writes.as_slice()),
            (11, &[StateWrite::Epoch(None, 11)][..])
        );
    }

    fn east() -> ClusterId {
        ClusterId::new("east").unwrap()
    }

    /// Ingress `name` of cluster `cluster` (an upsert of one route to Service `s` there), at
    /// watcher epoch `epoch`.
    fn clustered(name: &str, cluster: Option<&ClusterId>, epoch: u64) -> RouteMessage {
        let mut route = crate::model::tests::route(
            Some("a.example"),
            "/",
            hafleet_proto::PathKind::Prefix,
            "s",
        );
        route.backend.service.cluster = cluster.cloned();
        let upsert = RouteChange::Upsert { routes: vec![route], tls: vec![] };
        match event(name, upsert) {
            RouteMessage::Event(e) => RouteMessage::Event(RouteEvent {
                ingress: e.ingress.in_cluster(cluster),
                epoch,
                ..e
            }),
            _ => unreachable!(),
        }
    }

    /// Two clusters feed one fleet: each has its own epochs, nodes, Ingresses (the same
    /// namespace/name in both is two Ingresses) and snapshots, which sweep its own only; its
    /// guard counts its own routes.
    #[test]
    fn each_cluster_fences_sweeps_and_holds_its_own_part_of_a_fleet() {
        let east = east();
        let mut d = Desired::new();
        let mut out = Applied::default();
        // The unnamed cluster's watcher runs at a later epoch than east's: east is not fenced.
        for i in 0..12 {
            apply_unguarded(&mut d, i + 1, &clustered(&format!("w{i}"), None, 50), &mut out);
        }
        apply_unguarded(&mut d, 20, &clustered("w0", Some(&east), 7), &mut out);
        apply_unguarded(&mut d, 21, &clustered("e1", Some(&east), 7), &mut out);
        assert!(out.fenced.is_empty(), "{:?}", out.fenced);
        assert_eq!((d.epoch(None), d.epoch(Some(&east))), (50, 7));
        assert_eq!(d.ingresses(&fleet()).len(), 14, "default/w0 of each cluster is its own");
        // Nodes: each cluster's set replaces its own.
        let nodes = |cluster: Option<&ClusterId>, names: &[&str]| {
            RouteMessage::Nodes(NodesUpdate {
                schema: SCHEMA_VERSION,
                epoch: if cluster.is_some() { 7 } else { 50 },
                cluster: cluster.cloned(),
                nodes: names
                    .iter()
                    .map(|n| NodeAddr {
                        name: ObjectName::new(*n).unwrap(),
                        addr: "127.0.0.2".parse().unwrap(),
                    })
                    .collect(),
            })
        };
        apply_unguarded(&mut d, 22, &nodes(None, &["n1", "n2"]), &mut out);
        let mut out = Applied::default();
        apply_unguarded(&mut d, 23, &nodes(Some(&east), &["n1"]), &mut out);
        assert_eq!((d.nodes[&None].len(), d.nodes[&Some(east.clone())].len()), (2, 1));
        assert_eq!(out.causes[&fleet()][0].added, ["n1@east (127.0.0.2)"]);
        // East's older epoch is fenced within east only.
        let mut out = Applied::default();
        apply_unguarded(&mut d, 24, &clustered("e2", Some(&east), 6), &mut out);
        assert_eq!(out.fenced, [(6, 7)]);
        // East's snapshot, empty (its API server restored from an empty backup): it would
        // withdraw both its Ingresses, all of its routes though 2 of the fleet's 14: held,
        // and the unnamed cluster's twelve are not touched.
        let guard = SweepGuard { percent: 50, min_routes: 2 };
        let empty = RouteMessage::Snapshot(RoutesSnapshot {
            schema: SCHEMA_VERSION,
            epoch: 7,
            live: vec![],
            keep: vec![],
            cluster: Some(east.clone()),
            parts: vec![],
        });
        let mut out = Applied::default();
        apply(&mut d, 25, &empty, &guard, &mut out);
        assert_eq!(d.ingresses(&fleet()).len(), 14);
        let hold = (fleet(), Some(east.clone()));
        let held = &d.held[&hold];
        assert_eq!((held.ingresses.len(), held.fleet_routes), (2, 2));
        assert_eq!(held.cluster.as_ref(), Some(&east));
        assert!(held.ingresses.iter().all(|(k, _)| k.is_in(Some(&east))));
        // The unnamed cluster's snapshot that lists its own sweeps nothing of east's, and
        // leaves east's hold alone.
        let own: Vec<_> = d
            .ingresses(&fleet())
            .keys()
            .filter(|k| k.is_in(None))
            .map(|k| (fleet(), k.clone()))
            .collect();
        let snap = RouteMessage::Snapshot(RoutesSnapshot {
            schema: SCHEMA_VERSION,
            epoch: 50,
            live: own,
            keep: vec![],
            cluster: None,
            parts: vec![],
        });
        let mut out = Applied::default();
        apply(&mut d, 26, &snap, &guard, &mut out);
        assert!(out.causes.is_empty() && d.held.contains_key(&hold));
        // Released by a confirm of east's hold: east's two go, nobody else's.
        let confirm = RouteMessage::Confirm(hafleet_proto::SweepConfirm {
            schema: SCHEMA_VERSION,
            epoch: 7,
            fleet: fleet(),
            snapshot_seq: 25,
            by: "operator".into(),
            cluster: Some(east.clone()),
        });
        let mut out = Applied::default();
        apply(&mut d, 27, &confirm, &guard, &mut out);
        assert!(d.held.is_empty());
        assert_eq!(d.ingresses(&fleet()).len(), 12);
        assert!(d.ingresses(&fleet()).keys().all(|k| k.is_in(None)));
    }

    /// [`apply`] with the default guard.
    fn apply_unguarded(d: &mut Desired, seq: u64, msg: &RouteMessage, out: &mut Applied) {
        apply(d, seq, msg, &SweepGuard::default(), out);
    }

    fn fleet() -> FleetName {
        FleetName::new("edge").unwrap()
    }

    fn event(name: &str, change: RouteChange) -> RouteMessage {
        RouteMessage::Event(RouteEvent {
            schema: SCHEMA_VERSION,
            fleet: fleet(),
            ingress: IngressKey::new("default", name).unwrap(),
            created_unix: 1,
            resource_version: "1".into(),
            change,
            epoch: 1,
        })
    }

    #[test]
    fn upsert_then_delete_round_trips_to_empty() {
        let mut d = Desired::new();
        let mut out = Applied::default();
        apply_unguarded(
            &mut d,
            1,
            &event("a", RouteChange::Upsert { routes: vec![], tls: vec![] }),
            &mut out,
        );
        assert_eq!(d.ingresses(&fleet()).len(), 1);
        apply_unguarded(&mut d, 2, &event("a", RouteChange::Delete), &mut out);
        assert!(d.ingresses(&fleet()).is_empty());
        assert_eq!(route_writes(&out).len(), 2);
        assert_eq!(out.causes[&fleet()].len(), 2);
    }

    #[test]
    fn repeating_an_upsert_writes_nothing() {
        let mut d = Desired::new();
        let mut out = Applied::default();
        let msg = event("a", RouteChange::Upsert { routes: vec![], tls: vec![] });
        apply_unguarded(&mut d, 1, &msg, &mut out);
        apply_unguarded(&mut d, 2, &msg, &mut out);
        assert_eq!(route_writes(&out).len(), 1);
    }

    /// The writes of routes and nodes, less the epoch's (the first message of an epoch).
    fn route_writes(out: &Applied) -> Vec<&StateWrite> {
        out.writes.iter().filter(|w| !matches!(w, StateWrite::Epoch(..))).collect()
    }

    #[test]
    fn a_snapshot_sweeps_what_is_not_live_in_every_fleet() {
        let mut d = Desired::new();
        let mut out = Applied::default();
        apply_unguarded(
            &mut d,
            1,
            &event("a", RouteChange::Upsert { routes: vec![], tls: vec![] }),
            &mut out,
        );
        apply_unguarded(
            &mut d,
            2,
            &event("b", RouteChange::Upsert { routes: vec![], tls: vec![] }),
            &mut out,
        );
        apply_unguarded(
            &mut d,
            3,
            &event("kept", RouteChange::Upsert { routes: vec![], tls: vec![] }),
            &mut out,
        );
        let snap = RouteMessage::Snapshot(RoutesSnapshot {
            schema: SCHEMA_VERSION,
            epoch: 2,
            live: vec![(fleet(), IngressKey::new("default", "b").unwrap())],
            keep: vec![IngressKey::new("default", "kept").unwrap()],
            cluster: None,
            parts: vec![],
        });
        let mut out = Applied::default();
        apply_unguarded(&mut d, 4, &snap, &mut out);
        let left: Vec<_> = d.ingresses(&fleet()).keys().map(|k| k.to_string()).collect();
        assert_eq!(left, ["default/b", "default/kept"], "refused Ingresses are kept");
        assert_eq!(
            route_writes(&out),
            [&StateWrite::Remove(fleet(), IngressKey::new("default", "a").unwrap())]
        );
        assert_eq!(out.causes[&fleet()][0].what, "sweep");
    }

    /// A fleet of `n` Ingresses of one route each, applied at sequences 1..=n.
    fn fleet_of(n: u64, guard: &SweepGuard) -> Desired {
        let mut d = Desired::new();
        let mut out = Applied::default();
        let route = crate::model::tests::route(
            Some("a.example"),
            "/",
            hafleet_proto::PathKind::Prefix,
            "s",
        );
        for i in 1..=n {
            let upsert = RouteChange::Upsert { routes: vec![route.clone()], tls: vec![] };
            apply(&mut d, i, &event(&format!("i{i}"), upsert), guard, &mut out);
        }
        d
    }

    fn epoch_2(msg: RouteMessage) -> RouteMessage {
        match msg {
            RouteMessage::Event(e) => RouteMessage::Event(RouteEvent { epoch: 2, ..e }),
            other => other,
        }
    }

    /// A snapshot (epoch 2) in which only Ingresses `i1..=live` are live.
    fn snapshot_keeping(live: u64) -> RouteMessage {
        RouteMessage::Snapshot(RoutesSnapshot {
            schema: SCHEMA_VERSION,
            epoch: 2,
            live: (1..=live)
                .map(|i| (fleet(), IngressKey::new("default", &format!("i{i}")).unwrap()))
                .collect(),
            keep: vec![],
            cluster: None,
            parts: vec![],
        })
    }

    #[test]
    fn a_snapshot_that_would_withdraw_too_much_is_held_until_confirmed() {
        let guard = SweepGuard { percent: 50, min_routes: 10 };
        let mut d = fleet_of(30, &guard);
        // 10 of 30 routes: a third, under the guard's half: swept.
        let mut out = Applied::default();
        apply(&mut d, 31, &snapshot_keeping(20), &guard, &mut out);
        assert_eq!(d.ingresses(&fleet()).len(), 20);
        assert!(d.held.is_empty() && out.held_changed.is_empty());

        // 16 of 20 (an API server restored from an old backup): held, nothing withdrawn.
        let mut out = Applied::default();
        apply(&mut d, 32, &snapshot_keeping(4), &guard, &mut out);
        assert_eq!(d.ingresses(&fleet()).len(), 20, "nothing withdrawn");
        assert!(out.causes.is_empty(), "no version");
        let held = &d.held[&(fleet(), None)];
        assert_eq!((held.snapshot_seq, held.epoch, held.ingresses.len()), (32, 2, 16));
        assert_eq!(held.fleet_routes, 20);
        assert!(out.held_changed.contains(&(fleet(), None)));

        // An Ingress that comes back leaves the hold; one deleted explicitly goes.
        let mut out = Applied::default();
        let route = crate::model::tests::route(None, "/", hafleet_proto::PathKind::Prefix, "s");
        apply(
            &mut d,
            33,
            &epoch_2(event("i5", RouteChange::Upsert { routes: vec![route], tls: vec![] })),
            &guard,
            &mut out,
        );
        apply(&mut d, 34, &epoch_2(event("i6", RouteChange::Delete)), &guard, &mut out);
        assert_eq!(d.held[&(fleet(), None)].ingresses.len(), 14);
        assert_eq!(d.ingresses(&fleet()).len(), 19);

        // A release naming another snapshot changes nothing; the right one withdraws the rest.
        let confirm = |snapshot_seq| {
            RouteMessage::Confirm(hafleet_proto::SweepConfirm {
                schema: SCHEMA_VERSION,
                epoch: 2,
                fleet: fleet(),
                snapshot_seq,
                by: "operator".into(),
                cluster: None,
            })
        };
        let mut out = Applied::default();
        apply(&mut d, 35, &confirm(31), &guard, &mut out);
        assert_eq!(out.stale_confirms, [(fleet(), 31)]);
        assert_eq!(d.ingresses(&fleet()).len(), 19);
        apply(&mut d, 36, &confirm(32), &guard, &mut out);
        let left: Vec<_> = d.ingresses(&fleet()).keys().map(|k| k.name.to_string()).collect();
        assert_eq!(left, ["i1", "i2", "i3", "i4", "i5"]);
        assert!(d.held.is_empty());
        assert_eq!(out.causes[&fleet()].len(), 14);
        assert_eq!(out.causes[&fleet()][0].what, "sweep confirmed by operator");
    }

    #[test]
    fn moves_to_another_fleet_are_not_held_and_a_renewed_hold_keeps_its_age() {
        let guard = SweepGuard { percent: 50, min_routes: 10 };
        let mut d = fleet_of(20, &guard);
        // All 20 live, but in fleet `core`: moved, not deleted.
        let core = FleetName::new("core").unwrap();
        let moved = RouteMessage::Snapshot(RoutesSnapshot {
            schema: SCHEMA_VERSION,
            epoch: 2,
            live: (1..=20)
                .map(|i| (core.clone(), IngressKey::new("default", &format!("i{i}")).unwrap()))
                .collect(),
            keep: vec![],
            cluster: None,
            parts: vec![],
        });
        apply(&mut d, 21, &moved, &guard, &mut Applied::default());
        assert!(d.held.is_empty() && d.ingresses(&fleet()).is_empty());

        let mut d = fleet_of(20, &guard);
        apply(&mut d, 21, &snapshot_keeping(0), &guard, &mut Applied::default());
        d.held.get_mut(&(fleet(), None)).unwrap().since_unix_ms = 1234;
        apply(&mut d, 22, &snapshot_keeping(1), &guard, &mut Applied::default());
        let held = &d.held[&(fleet(), None)];
        assert_eq!((held.snapshot_seq, held.since_unix_ms, held.ingresses.len()), (22, 1234, 19));
    }

    #[test]
    fn a_later_snapshot_replaces_the_hold_and_the_guard_can_be_turned_off() {
        let guard = SweepGuard { percent: 50, min_routes: 10 };
        let mut d = fleet_of(20, &guard);
        apply(&mut d, 21, &snapshot_keeping(0), &guard, &mut Applied::default());
        assert_eq!(d.held[&(fleet(), None)].ingresses.len(), 20);
        // The API server is back but for three Ingresses: those three are swept at once.
        let mut out = Applied::default();
        apply(&mut d, 22, &snapshot_keeping(17), &guard, &mut out);
        assert!(d.held.is_empty(), "the hold is replaced");
        assert_eq!(d.ingresses(&fleet()).len(), 17);
        // A small fleet is not held for losing most of it: under the minimum.
        let mut small = fleet_of(4, &guard);
        apply(&mut small, 5, &snapshot_keeping(0), &guard, &mut Applied::default());
        assert!(small.held.is_empty() && small.ingresses(&fleet()).is_empty());
        // 100 % never holds.
        let off = SweepGuard { percent: 100, min_routes: 0 };
        let mut d = fleet_of(20, &off);
        apply(&mut d, 21, &snapshot_keeping(0), &off, &mut Applied::default());
        assert!(d.held.is_empty() && d.ingresses(&fleet()).is_empty());
    }

    fn nodes(list: &[(&str, &str)]) -> RouteMessage {
        RouteMessage::Nodes(NodesUpdate {
            schema: SCHEMA_VERSION,
            epoch: 1,
            nodes: list
                .iter()
                .map(|(n, a)| NodeAddr {
                    name: ObjectName::new(*n).unwrap(),
                    addr: a.parse().unwrap(),
                })
                .collect(),
            cluster: None,
        })
    }

    #[test]
    fn a_node_change_is_one_write_and_one_cause_per_fleet_whatever_the_ingresses() {
        let mut d = Desired::new();
        let mut out = Applied::default();
        for i in 0..100 {
            let e = event(&format!("i{i}"), RouteChange::Upsert { routes: vec![], tls: vec![] });
            apply_unguarded(&mut d, i + 1, &e, &mut out);
        }
        let mut out = Applied::default();
        apply_unguarded(&mut d, 200, &nodes(&[("n2", "10.0.0.2"), ("n1", "10.0.0.1")]), &mut out);
        assert_eq!(
            d.nodes[&None].iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
            ["n1", "n2"]
        );
        assert_eq!(out.writes.len(), 1);
        assert_eq!(out.causes[&fleet()].len(), 1);
        assert_eq!(out.causes[&fleet()][0].added, ["n1 (10.0.0.1)", "n2 (10.0.0.2)"]);

        // n1 moves, n2 leaves, n3 joins.
        let mut out = Applied::default();
        apply_unguarded(&mut d, 201, &nodes(&[("n1", "10.0.0.9"), ("n3", "10.0.0.3")]), &mut out);
        let cause = &out.causes[&fleet()][0];
        assert_eq!((cause.what.as_str(), cause.ingress.as_ref()), ("nodes", None));
        assert_eq!(cause.added, ["n1 (10.0.0.9)", "n3 (10.0.0.3)"]);
        assert_eq!(cause.removed, ["n2"]);

        // The same set again changes nothing.
        let mut out = Applied::default();
        apply_unguarded(&mut d, 202, &nodes(&[("n3", "10.0.0.3"), ("n1", "10.0.0.9")]), &mut out);
        assert!(out.writes.is_empty() && out.causes.is_empty());
    }

    fn sealed(tag: &str, names: &[&str], recipient: &str) -> hafleet_proto::SealedCert {
        hafleet_proto::SealedCert {
            fingerprint: hafleet_proto::sha256_hex(tag.as_bytes()),
            names: names.iter().map(|n| hafleet_proto::HttpHost::new(*n).unwrap()).collect(),
            not_after_unix: 0,
            chain_pem: hafleet_proto::tls::certificates_pem([tag.as_bytes()]),
            sealed_key: format!(
                "-----BEGIN AGE ENCRYPTED FILE-----\nYWJj{}\n-----END AGE ENCRYPTED FILE-----\n",
                recipient.len()
            ),
            recipient: recipient.into(),
        }
    }

    fn tls_entry(hosts: &[&str], cert: Option<hafleet_proto::SealedCert>) -> TlsEntry {
        TlsEntry {
            hosts: hosts.iter().map(|h| hafleet_proto::HttpHost::new(*h).unwrap()).collect(),
            secret: hafleet_proto::ObjectName::new("s").unwrap(),
            cert,
        }
    }

    #[test]
    fn certificates_keep_their_sealed_bytes_and_a_bad_secret_keeps_only_what_it_served() {
        let held = sealed("a", &["a.example.com"], "age1one");
        let mut fleet = Ingresses::new();
        let mut old = IngressEntry {
            created_unix: 1,
            resource_version: "1".into(),
            routes: vec![],
            seq: 1,
            tls: vec![tls_entry(&["a.example.com"], Some(held.clone()))],
            quarantined: None,
        };
        fleet.insert(IngressKey::new("t", "i").unwrap(), old.clone());
        // Sealed anew to the same recipient (a watcher restart): the bytes held stay.
        let mut resealed = held.clone();
        resealed.sealed_key = resealed.sealed_key.replace("YWJj", "ZGVm");
        let got = settle_tls(&fleet, Some(&old), &[tls_entry(&["a.example.com"], Some(resealed))]);
        assert_eq!(got[0].cert.as_ref(), Some(&held));
        // Sealed to a new recipient (the fleet's identity replaced): taken.
        let rekeyed = sealed("a", &["a.example.com"], "age1two");
        let got =
            settle_tls(&fleet, Some(&old), &[tls_entry(&["a.example.com"], Some(rekeyed.clone()))]);
        assert_eq!(got[0].cert.as_ref(), Some(&rekeyed));
        // The Secret went bad: the certificate stays for the hosts it served and covers only.
        old.tls = vec![tls_entry(&["a.example.com"], Some(held.clone()))];
        let bad = tls_entry(&["a.example.com", "b.example.com"], None);
        let got = settle_tls(&fleet, Some(&old), std::slice::from_ref(&bad));
        assert_eq!(got, vec![tls_entry(&["a.example.com"], Some(held.clone()))]);
        // Nothing held from it: nothing served.
        assert_eq!(settle_tls(&fleet, None, std::slice::from_ref(&bad)), vec![bad]);
    }

    #[test]
    fn a_default_certificate_is_set_kept_across_a_reseal_and_replaced() {
        let mut d = Desired::default();
        let fleet = FleetName::new("edge").unwrap();
        let msg = |cert: Option<hafleet_proto::SealedCert>| {
            RouteMessage::DefaultCert(hafleet_proto::DefaultCert {
                schema: 1,
                epoch: 1,
                fleet: fleet.clone(),
                cert,
                cluster: None,
            })
        };
        let first = sealed("d", &["d.invalid"], "age1one");
        let mut out = Applied::default();
        apply(&mut d, 1, &msg(Some(first.clone())), &SweepGuard::default(), &mut out);
        assert_eq!(d.default_certs.get(&fleet), Some(&first));
        assert_eq!(out.causes[&fleet][0].added, [format!("default {}", first.fingerprint)]);
        let mut resealed = first.clone();
        resealed.sealed_key = resealed.sealed_key.replace("YWJj", "ZGVm");
        let mut out = Applied::default();
        apply(&mut d, 2, &msg(Some(resealed)), &SweepGuard::default(), &mut out);
        assert!(out.causes.is_empty() && out.writes.is_empty(), "a reseal changes nothing");
        assert_eq!(d.default_certs.get(&fleet), Some(&first));
        let second = sealed("e", &["d.invalid"], "age1one");
        let mut out = Applied::default();
        apply(&mut d, 3, &msg(Some(second.clone())), &SweepGuard::default(), &mut out);
        assert_eq!(d.default_certs.get(&fleet), Some(&second));
        assert!(matches!(out.writes.as_slice(), [StateWrite::DefaultCerts(_)]));
    }
}
