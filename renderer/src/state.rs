//! A fleet's desired state and how route messages change it. Pure: no sled, no NATS.
//!
//! The state of a fleet is the set of its Ingresses with their resolved routes. Messages are
//! applied in stream order; the caller skips any message whose stream sequence is at or below
//! the last one applied, so redelivery after a crash changes nothing (invariant 4).

use hafleet_proto::{Cause, FleetName, IngressKey, Route, RouteChange, RouteMessage};
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
}

/// Every fleet's Ingresses, as far as one batch of messages needs them.
pub type Desired = BTreeMap<FleetName, BTreeMap<IngressKey, IngressEntry>>;

/// One change to the stored state, for the store to write in the same transaction as versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateWrite {
    Put(FleetName, IngressKey, IngressEntry),
    Remove(FleetName, IngressKey),
}

/// The outcome of applying a batch: writes for the store, and per fleet the causes to record.
#[derive(Debug, Default)]
pub struct Applied {
    pub writes: Vec<StateWrite>,
    pub causes: BTreeMap<FleetName, Vec<Cause>>,
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

/// Applies one message at stream sequence `seq` to `desired` (which must hold every fleet the
/// store knows for snapshot sweeps to see them) and records what changed.
pub fn apply(desired: &mut Desired, seq: u64, msg: &RouteMessage, out: &mut Applied) {
    match msg {
        RouteMessage::Event(event) => {
            let fleet = desired.entry(event.fleet.clone()).or_default();
            let cause = |what: &str, (added, removed): (Vec<String>, Vec<String>)| Cause {
                stream_seq: seq,
                ingress: Some(event.ingress.clone()),
                what: what.to_owned(),
                resource_version: Some(event.resource_version.clone()),
                added,
                removed,
            };
            match &event.change {
                RouteChange::Upsert { routes } => {
                    let mut entry = IngressEntry {
                        created_unix: event.created_unix,
                        resource_version: event.resource_version.clone(),
                        routes: routes.clone(),
                        seq,
                    };
                    let unchanged = fleet.get(&event.ingress).is_some_and(|old| {
                        entry.seq = old.seq;
                        *old == entry
                    });
                    entry.seq = seq;
                    let old_routes = fleet.get(&event.ingress).map(|e| e.routes.as_slice());
                    let changes = route_changes(old_routes.unwrap_or_default(), routes);
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
        RouteMessage::Snapshot(snapshot) => {
            let live: BTreeSet<(&FleetName, &IngressKey)> =
                snapshot.live.iter().map(|(f, k)| (f, k)).collect();
            let keep: BTreeSet<&IngressKey> = snapshot.keep.iter().collect();
            for (fleet, ingresses) in desired.iter_mut() {
                let gone: Vec<IngressKey> = ingresses
                    .keys()
                    .filter(|k| !live.contains(&(fleet, *k)) && !keep.contains(k))
                    .cloned()
                    .collect();
                for key in gone {
                    let old = ingresses.remove(&key).map(|e| e.routes).unwrap_or_default();
                    out.writes.push(StateWrite::Remove(fleet.clone(), key.clone()));
                    out.causes.entry(fleet.clone()).or_default().push(Cause {
                        stream_seq: seq,
                        ingress: Some(key),
                        what: "sweep".to_owned(),
                        resource_version: None,
                        added: vec![],
                        removed: route_changes(&old, &[]).1,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hafleet_proto::{RouteEvent, RoutesSnapshot, SCHEMA_VERSION};

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
        apply(&mut d, 1, &event("a", RouteChange::Upsert { routes: vec![] }), &mut out);
        assert_eq!(d[&fleet()].len(), 1);
        apply(&mut d, 2, &event("a", RouteChange::Delete), &mut out);
        assert!(d[&fleet()].is_empty());
        assert_eq!(out.writes.len(), 2);
        assert_eq!(out.causes[&fleet()].len(), 2);
    }

    #[test]
    fn repeating_an_upsert_writes_nothing() {
        let mut d = Desired::new();
        let mut out = Applied::default();
        let msg = event("a", RouteChange::Upsert { routes: vec![] });
        apply(&mut d, 1, &msg, &mut out);
        apply(&mut d, 2, &msg, &mut out);
        assert_eq!(out.writes.len(), 1);
    }

    #[test]
    fn a_snapshot_sweeps_what_is_not_live_in_every_fleet() {
        let mut d = Desired::new();
        let mut out = Applied::default();
        apply(&mut d, 1, &event("a", RouteChange::Upsert { routes: vec![] }), &mut out);
        apply(&mut d, 2, &event("b", RouteChange::Upsert { routes: vec![] }), &mut out);
        apply(&mut d, 3, &event("kept", RouteChange::Upsert { routes: vec![] }), &mut out);
        let snap = RouteMessage::Snapshot(RoutesSnapshot {
            schema: SCHEMA_VERSION,
            epoch: 2,
            live: vec![(fleet(), IngressKey::new("default", "b").unwrap())],
            keep: vec![IngressKey::new("default", "kept").unwrap()],
        });
        let mut out = Applied::default();
        apply(&mut d, 4, &snap, &mut out);
        let left: Vec<_> = d[&fleet()].keys().map(|k| k.to_string()).collect();
        assert_eq!(left, ["default/b", "default/kept"], "refused Ingresses are kept");
        assert_eq!(
            out.writes,
            [StateWrite::Remove(fleet(), IngressKey::new("default", "a").unwrap())]
        );
        assert_eq!(out.causes[&fleet()][0].what, "sweep");
    }
}
