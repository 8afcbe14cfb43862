//! Refused Ingresses kept for their last good routes, at most so many per namespace
//! (`--max-kept-per-namespace`): the pure choice is [`crate::core::index::beyond_cap`]; this reads
//! creation times from the cache and tells the Ingresses that lose their routes.

use crate::core::index::{self, Desired};
use crate::k8s::events::Warnings;
use hafleet_proto::IngressKey;
use k8s_openapi::api::networking::v1::Ingress;
use kube::runtime::reflector::{ObjectRef, Store};
use std::collections::{BTreeSet, HashMap};

/// Withdraws the refused Ingresses kept beyond --max-kept-per-namespace (the oldest of a
/// namespace's), each with a Warning Event: they are no longer desired at all, so what was
/// published of them is deleted and no snapshot keeps them.
pub async fn cap(
    cap: usize,
    ingresses: &Store<Ingress>,
    warnings: &Warnings,
    warned: &mut BTreeSet<(IngressKey, String, String)>,
    desired: &mut index::Wanted,
) {
    let mut found = HashMap::<IngressKey, _, foldhash::fast::RandomState>::default();
    for (key, want) in desired.iter() {
        if !matches!(want, Desired::Keep) {
            continue;
        }
        let at = ObjectRef::new(key.name.as_str()).within(key.namespace.as_str());
        found.insert(key.clone(), ingresses.get(&at));
    }
    let created = |ing: &Option<std::sync::Arc<Ingress>>| {
        let t = ing.as_ref().and_then(|i| i.metadata.creation_timestamp.as_ref());
        t.map_or(0, |t| t.0.as_second())
    };
    let times = found.iter().map(|(k, ing)| (k.clone(), created(ing)));
    for key in index::beyond_cap(times, cap) {
        desired.remove(&key);
        let Some(Some(ing)) = found.get(&key) else { continue };
        let rv = match (ing.metadata.generation, &ing.metadata.resource_version) {
            (Some(generation), _) => format!("g{generation}"),
            (None, rv) => rv.clone().unwrap_or_default(),
        };
        let note = format!(
            "refused, and no longer served with its last good routes: namespace {} has more \
             refused Ingresses than the watcher keeps for their last good routes \
             (--max-kept-per-namespace {cap}), and this is one of the oldest; fix or delete \
             the refused Ingresses",
            key.namespace
        );
        let said = (&key, rv.as_str(), "RefusedNotKept", note);
        crate::app::effects::tell(warnings, warned, ing, said, "refused ingress no longer kept")
            .await;
    }
}
