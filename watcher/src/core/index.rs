//! What the watcher has published and what it must publish next. Pure.
//!
//! Each Ingress is in one of three desired states: routed (publish its routes when they differ
//! from what was published), invalid (publish nothing: the fleet keeps the routes it had, so a
//! bad edit never takes a working site down), or gone (publish a delete if anything was
//! published). A fleet change is a delete on the old fleet and an upsert on the new one.

use crate::core::model::Resolved;
use hafleet_proto::{FleetName, IngressKey, Route, TlsEntry};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Desired {
    /// Its routes, one [`Resolved`] per fleet that serves it, in fleet order: an Ingress's
    /// one fleet, or each fleet of the Gateways an HTTPRoute attaches to. Never empty.
    Routed(Vec<Resolved>),
    /// Refused: keep whatever was published before, on every fleet but these (which the
    /// admin's policy no longer allows it).
    Keep(Vec<FleetName>),
}

impl Desired {
    /// Routed on one fleet.
    pub fn one(r: Resolved) -> Desired {
        Desired::Routed(vec![r])
    }
}

/// What was last published (and acked) of an object on one fleet. `None`: a publish to that
/// fleet failed and may or may not have been stored, so whatever is desired must be sent again.
pub type PublishedRoutes = Option<(std::sync::Arc<Vec<Route>>, std::sync::Arc<Vec<TlsEntry>>)>;

/// What was last published per object, on each fleet it was published to (one for an
/// Ingress; an HTTPRoute's Gateways may be on several), in fleet order. Hashed: every pass
/// looks up every object in it.
pub type Published = std::collections::HashMap<
    IngressKey,
    Vec<(FleetName, PublishedRoutes)>,
    foldhash::fast::RandomState,
>;

/// What was last published of `key` on `fleet`: `None` when nothing was.
pub fn published_on<'a>(
    published: &'a Published,
    key: &IngressKey,
    fleet: &FleetName,
) -> Option<&'a PublishedRoutes> {
    published.get(key)?.iter().find(|(f, _)| f == fleet).map(|(_, p)| p)
}

/// What a pass wants for each object. Hashed, as [`Published`] is; [`diff`] puts its
/// actions in key order.
pub type Wanted = std::collections::HashMap<IngressKey, Desired, foldhash::fast::RandomState>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Upsert(Resolved),
    Delete { fleet: FleetName, key: IngressKey },
}

/// The routes of `desired` on every fleet, to keep tenants apart and add certificates to.
pub fn routed_mut(desired: &mut Wanted) -> Vec<&mut Resolved> {
    desired
        .values_mut()
        .flat_map(|d| match d {
            Desired::Routed(rs) => rs.iter_mut(),
            Desired::Keep(_) => [].iter_mut(),
        })
        .collect()
}

/// Whether these routes (certificates aside) are what was last published of the object on its
/// fleet.
pub fn routes_current(published: &Published, r: &Resolved) -> bool {
    matches!(published_on(published, &r.key, &r.fleet), Some(Some((routes, _)))
        if routes == &r.routes)
}

/// Whether exactly these routes and certificates are what was last published of the object on
/// its fleet.
pub fn is_current(published: &Published, r: &Resolved) -> bool {
    matches!(published_on(published, &r.key, &r.fleet), Some(Some((routes, tls)))
        if routes == &r.routes && tls == &r.tls)
}

/// The actions that bring `published` to `desired`, deletes first, each kind in key order: a
/// delete for each fleet an object is gone from (deleted, or moved to another fleet), an
/// upsert for every object's routes on a fleet that are not current.
pub fn diff(published: &Published, desired: &Wanted) -> Vec<Action> {
    let mut deletes = Vec::new();
    for (key, fleets) in published {
        for (fleet, _) in fleets {
            match desired.get(key) {
                Some(Desired::Keep(refused)) if !refused.contains(fleet) => {}
                Some(Desired::Routed(rs)) if rs.iter().any(|r| &r.fleet == fleet) => {}
                _ => deletes.push(Action::Delete { fleet: fleet.clone(), key: key.clone() }),
            }
        }
    }
    let mut upserts = Vec::new();
    for want in desired.values() {
        if let Desired::Routed(rs) = want {
            for r in rs.iter().filter(|r| !is_current(published, r)) {
                upserts.push(Action::Upsert(r.clone()));
            }
        }
    }
    let key = |a: &Action| match a {
        Action::Upsert(r) => (r.key.clone(), r.fleet.clone()),
        Action::Delete { key, fleet } => (key.clone(), fleet.clone()),
    };
    deletes.sort_by_cached_key(key);
    upserts.sort_by_cached_key(key);
    deletes.extend(upserts);
    deletes
}

/// The deletions of `actions` that make a mass deletion: of a fleet from which they delete
/// more than `threshold` Ingresses (0: never), by fleet. They go as one snapshot for the
/// renderer's guard rather than event by event. An Ingress that moves to another fleet (an
/// upsert of it there in the same pass) is not deleted and is not counted.
pub fn bulk_deletes(
    actions: &[Action],
    threshold: usize,
) -> BTreeMap<FleetName, std::collections::BTreeSet<IngressKey>> {
    let moved: std::collections::BTreeSet<&IngressKey> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Upsert(r) => Some(&r.key),
            Action::Delete { .. } => None,
        })
        .collect();
    let mut deletes: BTreeMap<FleetName, std::collections::BTreeSet<IngressKey>> = BTreeMap::new();
    for action in actions {
        if let Action::Delete { fleet, key } = action
            && !moved.contains(key)
        {
            deletes.entry(fleet.clone()).or_default().insert(key.clone());
        }
    }
    deletes.retain(|_, keys| threshold > 0 && keys.len() > threshold);
    deletes
}

/// Records that `action` was published.
pub fn record(published: &mut Published, action: &Action) {
    match action {
        Action::Upsert(r) => {
            set(published, &r.key, &r.fleet, Some((r.routes.clone(), r.tls.clone())));
        }
        Action::Delete { fleet, key } => {
            if let Some(fleets) = published.get_mut(key) {
                fleets.retain(|(f, _)| f != fleet);
                if fleets.is_empty() {
                    published.remove(key);
                }
            }
        }
    }
}

/// Records that publishing `action` failed: its effect is unknown, so the next diff sends
/// whatever is desired for that object on that fleet again.
pub fn record_unknown(published: &mut Published, action: &Action) {
    let (fleet, key) = match action {
        Action::Upsert(r) => (&r.fleet, &r.key),
        Action::Delete { fleet, key } => (fleet, key),
    };
    set(published, key, fleet, None);
}

/// Sets what was published of `key` on `fleet`, keeping the fleets in order.
fn set(published: &mut Published, key: &IngressKey, fleet: &FleetName, routes: PublishedRoutes) {
    let fleets = published.entry(key.clone()).or_default();
    match fleets.binary_search_by(|(f, _)| f.cmp(fleet)) {
        Ok(i) => fleets[i].1 = routes,
        Err(i) => fleets.insert(i, (fleet.clone(), routes)),
    }
}

/// The refused Ingresses among `kept` (each with its creation time, Unix seconds) that are
/// not kept any more: per namespace, all but the `cap` newest (the oldest go first; equal
/// times by key, so a pass picks the same ones as the one before). Keeping a refused Ingress
/// holds its last good routes and a line in every snapshot: a namespace with many broken
/// Ingresses must not grow them without bound.
pub fn beyond_cap(
    kept: impl IntoIterator<Item = (IngressKey, i64)>,
    cap: usize,
) -> Vec<IngressKey> {
    let mut by_namespace: BTreeMap<hafleet_proto::Namespace, Vec<(i64, IngressKey)>> =
        BTreeMap::new();
    for (key, created) in kept {
        by_namespace.entry(key.namespace.clone()).or_default().push((created, key));
    }
    let mut out = Vec::new();
    for (_, mut keys) in by_namespace {
        if keys.len() <= cap {
            continue;
        }
        // Newest first; the ones after the first `cap` go.
        keys.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        out.extend(keys.into_iter().skip(cap).map(|(_, k)| k));
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_ingresses_are_kept_up_to_the_cap_per_namespace_the_newest_first() {
        let key = |ns: &str, name: &str| IngressKey::new(ns, name).unwrap();
        let kept = [
            (key("a", "old"), 100),
            (key("a", "new"), 300),
            (key("a", "mid-2"), 200),
            (key("a", "mid-1"), 200),
            (key("b", "oldest"), 1),
            (key("b", "other"), 2),
        ];
        assert_eq!(beyond_cap(kept.clone(), 2), [key("a", "mid-2"), key("a", "old")]);
        assert_eq!(beyond_cap(kept.clone(), 3), [key("a", "old")]);
        assert!(beyond_cap(kept.clone(), 4).is_empty());
        assert_eq!(beyond_cap(kept.clone(), 0).len(), kept.len());
    }

    fn resolved(name: &str, fleet: &str, n_routes: usize) -> Resolved {
        crate::core::resolve::tests_support::resolved("default", name, fleet, n_routes)
    }

    fn apply(published: &mut Published, desired: &Wanted) -> Vec<Action> {
        let actions = diff(published, desired);
        for a in &actions {
            record(published, a);
        }
        actions
    }

    #[test]
    fn new_changed_unchanged_and_gone() {
        let mut published = Published::default();
        let mut desired = Wanted::default();
        let a = resolved("a", "edge", 1);
        desired.insert(a.key.clone(), Desired::one(a.clone()));
        assert_eq!(apply(&mut published, &desired), [Action::Upsert(a.clone())]);
        assert!(apply(&mut published, &desired).is_empty(), "unchanged publishes nothing");
        let a2 = resolved("a", "edge", 2);
        desired.insert(a.key.clone(), Desired::one(a2.clone()));
        assert_eq!(apply(&mut published, &desired), [Action::Upsert(a2)]);
        desired.clear();
        assert_eq!(
            apply(&mut published, &desired),
            [Action::Delete { fleet: a.fleet.clone(), key: a.key.clone() }]
        );
        assert!(published.is_empty());
    }

    #[test]
    fn more_deletes_of_one_fleet_than_the_threshold_are_a_bulk_deletion() {
        let delete = |name: &str, fleet: &str| Action::Delete {
            fleet: FleetName::new(fleet).unwrap(),
            key: IngressKey::new("default", name).unwrap(),
        };
        let mut actions: Vec<Action> = (0..11).map(|i| delete(&format!("e{i}"), "edge")).collect();
        actions.extend((0..10).map(|i| delete(&format!("c{i}"), "core")));
        actions.push(Action::Upsert(resolved("new", "core", 1)));
        let bulk = bulk_deletes(&actions, 10);
        let sizes: Vec<_> = bulk.iter().map(|(f, keys)| (f.as_str(), keys.len())).collect();
        assert_eq!(sizes, [("edge", 11)]);
        assert!(bulk_deletes(&actions, 0).is_empty(), "0 turns it off");
        assert_eq!(bulk_deletes(&actions, 9).len(), 2);
        // Moving to another fleet is not deleting.
        actions.push(Action::Upsert(resolved("e0", "core", 1)));
        assert!(bulk_deletes(&actions, 10).is_empty());
        assert!(
            !bulk_deletes(&actions, 9)[&FleetName::new("edge").unwrap()]
                .contains(&IngressKey::new("default", "e0").unwrap())
        );
    }

    #[test]
    fn an_invalid_edit_keeps_the_old_routes() {
        let mut published = Published::default();
        let a = resolved("a", "edge", 1);
        let mut desired = Wanted::from_iter([(a.key.clone(), Desired::one(a.clone()))]);
        apply(&mut published, &desired);
        desired.insert(a.key.clone(), Desired::Keep(vec![]));
        assert!(apply(&mut published, &desired).is_empty());
        assert_eq!(published.len(), 1);
    }

    #[test]
    fn a_failed_publish_is_sent_again_whatever_it_was() {
        let mut published = Published::default();
        let a = resolved("a", "edge", 1);
        let routed = Wanted::from_iter([(a.key.clone(), Desired::one(a.clone()))]);
        apply(&mut published, &routed);
        // A delete that may have been stored, then the same Ingress back with the same routes.
        let delete = Action::Delete { fleet: a.fleet.clone(), key: a.key.clone() };
        record_unknown(&mut published, &delete);
        assert_eq!(diff(&published, &routed), [Action::Upsert(a.clone())]);
        // A delete that may have failed, and the Ingress still gone.
        record_unknown(&mut published, &delete);
        assert_eq!(diff(&published, &Wanted::default()), [delete]);
    }

    #[test]
    fn moving_to_another_fleet_deletes_then_upserts() {
        let mut published = Published::default();
        let a = resolved("a", "edge", 1);
        apply(&mut published, &Wanted::from_iter([(a.key.clone(), Desired::one(a.clone()))]));
        let moved = resolved("a", "core", 1);
        let actions = apply(
            &mut published,
            &Wanted::from_iter([(a.key.clone(), Desired::one(moved.clone()))]),
        );
        assert_eq!(
            actions,
            [Action::Delete { fleet: a.fleet.clone(), key: a.key.clone() }, Action::Upsert(moved)]
        );
        assert_eq!(published[&a.key][0].0.as_str(), "core");
    }

    #[test]
    fn an_object_on_two_fleets_is_published_and_withdrawn_on_each() {
        let mut published = Published::default();
        let (edge, core) = (resolved("r", "edge", 1), resolved("r", "core", 1));
        let both = Desired::Routed(vec![core.clone(), edge.clone()]);
        let actions = apply(&mut published, &Wanted::from_iter([(edge.key.clone(), both)]));
        assert_eq!(actions, [Action::Upsert(core.clone()), Action::Upsert(edge.clone())]);
        let fleets: Vec<&str> = published[&edge.key].iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(fleets, ["core", "edge"]);
        // Changed on one fleet only: one upsert. Gone from the other: one delete.
        let edge2 = resolved("r", "edge", 2);
        let actions = apply(
            &mut published,
            &Wanted::from_iter([(edge.key.clone(), Desired::one(edge2.clone()))]),
        );
        assert_eq!(
            actions,
            [
                Action::Delete { fleet: core.fleet.clone(), key: core.key.clone() },
                Action::Upsert(edge2)
            ]
        );
        assert_eq!(published[&edge.key].len(), 1);
        // Kept, but not where the policy refuses it: withdrawn from core alone.
        let mut two = Published::default();
        let both = Desired::Routed(vec![core.clone(), edge.clone()]);
        apply(&mut two, &Wanted::from_iter([(edge.key.clone(), both)]));
        let keep = Desired::Keep(vec![core.fleet.clone()]);
        let actions = apply(&mut two, &Wanted::from_iter([(edge.key.clone(), keep)]));
        assert_eq!(actions, [Action::Delete { fleet: core.fleet.clone(), key: core.key.clone() }]);
        // Refused: kept on every fleet it is on.
        let actions =
            apply(&mut published, &Wanted::from_iter([(edge.key.clone(), Desired::Keep(vec![]))]));
        assert!(actions.is_empty());
        assert!(apply(&mut published, &Wanted::default()).len() == 1 && published.is_empty());
    }
}
