//! Effects of a pass: what [`super::run`] decided, published on NATS (nodes, default
//! certificates, fleet settings, snapshots) or told on the Ingresses and ConfigMaps (Warning
//! Events, each said once).

use super::state::State;
use crate::k8s::events::Warnings;
use hafleet_proto::{FleetName, IngressKey, NodeAddr, NodesUpdate, RouteMessage};
use hafleet_runtime::nats::Bus;
use std::collections::{BTreeMap, BTreeSet};
use tracing::{info, warn};

const WARNINGS: (&str, &str) =
    ("hafleet_watcher_warnings_total", "Warning Events posted on Ingresses, by reason.");

/// Posts a Warning Event (`reason`, `note`) on `ing` once per Ingress, generation and note,
/// logging it as `what` and counting it. One the API server did not take is tried again on
/// the next pass.
pub(crate) async fn tell(
    warnings: &Warnings,
    warned: &mut BTreeSet<(IngressKey, String, String)>,
    subject: &crate::core::pass::Subject,
    (key, rv, reason, note): (&IngressKey, &str, &'static str, String),
    what: &'static str,
) {
    if !warned.insert((key.clone(), rv.to_owned(), note.clone())) {
        return;
    }
    warn!(ingress = %key, reason, note = %note, "{what}");
    hafleet_runtime::health::Health::global().count(WARNINGS, &[("reason", reason)], 1.0);
    if !warnings.warn(&subject.object_ref(), reason, note.clone()).await {
        warned.remove(&(key.clone(), rv.to_owned(), note));
    }
}

/// Publishes `fleet`'s default certificate when it is not the one last published. A Secret
/// that cannot be used is logged (there is no Ingress to tell) and the fleet keeps the one it
/// had.
pub(crate) async fn send_default_cert(
    bus: &Bus,
    state: &mut State,
    fleet: &FleetName,
    (ns, name): (&str, &str),
    now_unix: i64,
) -> anyhow::Result<()> {
    let cert = match state.tls.sealed(fleet, ns, name, now_unix) {
        Ok(cert) => hafleet_proto::SealedCert::clone(&cert),
        Err(why) => {
            if let Some(why) = why
                && state.tls.default_warned.insert((fleet.clone(), why.clone()))
            {
                warn!(fleet = %fleet, secret = %format!("{ns}/{name}"), %why, "the fleet's default certificate is not usable; it keeps the one it had");
            }
            return Ok(());
        }
    };
    if state.tls.defaults.get(fleet) == Some(&cert) {
        return Ok(());
    }
    let msg = RouteMessage::DefaultCert(hafleet_proto::DefaultCert {
        schema: hafleet_proto::route_schema(state.cluster.as_ref()),
        epoch: state.epoch,
        cluster: state.cluster.clone(),
        fleet: fleet.clone(),
        cert: Some(cert.clone()),
    });
    let id = state.next_msg_id();
    let seq = bus.publish(hafleet_proto::routes_subject(fleet), &id, msg.encode()).await?;
    info!(fleet = %fleet, fingerprint = %cert.fingerprint, stream_seq = seq, "default certificate published");
    state.tls.defaults.insert(fleet.clone(), cert);
    Ok(())
}

/// Publishes each fleet's settings that changed, and tells the ConfigMaps' admin what was
/// taken and what was not.
pub(crate) async fn send_settings(
    bus: &Bus,
    warnings: &Warnings,
    state: &mut State,
    config_maps: &[std::sync::Arc<k8s_openapi::api::core::v1::ConfigMap>],
    fleets: Vec<FleetName>,
) -> anyhow::Result<()> {
    let at = (state.epoch, state.cluster.as_ref());
    let plan = state.settings.plan(config_maps, fleets, at);
    for (cm, warning, reason, note) in plan.tell {
        warn!(configmap = ?cm.metadata.name, note = %note, "fleet settings refused");
        warnings.post(&*cm, warning, reason, note).await;
    }
    for update in plan.publish {
        let fleet = update.fleet.clone();
        let msg = RouteMessage::Settings(update.clone());
        let id = state.next_msg_id();
        let seq = bus.publish(hafleet_proto::routes_subject(&fleet), &id, msg.encode()).await?;
        let set = update.settings.describe().join(" ");
        info!(fleet = %fleet, stream_seq = seq, settings = %set, "fleet settings published");
        state.settings.published(&update);
        if let Some(cm) = crate::core::fleet_settings::InForce::source(config_maps, &update) {
            let note = format!(
                "published for fleet {fleet}: {}",
                if set.is_empty() { "the defaults" } else { &set }
            );
            warnings.post(&**cm, false, "SettingsPublished", note).await;
        }
    }
    Ok(())
}

/// Publishes the node set that every route's servers come from.
pub(crate) async fn send_nodes(
    bus: &Bus,
    state: &mut State,
    nodes: Vec<NodeAddr>,
) -> anyhow::Result<()> {
    let msg = RouteMessage::Nodes(NodesUpdate {
        schema: hafleet_proto::route_schema(state.cluster.as_ref()),
        epoch: state.epoch,
        cluster: state.cluster.clone(),
        nodes: nodes.clone(),
    });
    let id = state.next_msg_id();
    state.nodes = None;
    let seq = bus
        .publish(hafleet_proto::routes_nodes_subject(state.cluster.as_ref()), &id, msg.encode())
        .await?;
    info!(nodes = nodes.len(), stream_seq = seq, "nodes published");
    state.nodes = Some(nodes);
    Ok(())
}

/// Publishes a snapshot: every Ingress this watcher knows, live or kept (in parts when it is
/// larger than a NATS message). The renderer sweeps whatever else it holds.
pub(crate) async fn send_snapshot(bus: &Bus, state: &mut State) -> anyhow::Result<()> {
    let cluster = state.cluster.clone();
    let kept: BTreeSet<IngressKey> = state.kept.union(&state.held_new).cloned().collect();
    let snapshot =
        crate::app::snapshot::build(&state.published, &kept, state.epoch, cluster.as_ref());
    let subject = hafleet_proto::routes_snapshot_subject(cluster.as_ref());
    let sent =
        crate::app::snapshot::publish(bus, &subject, &snapshot, || state.next_msg_id()).await?;
    info!(
        epoch = state.epoch,
        ingresses = state.published.len(),
        kept = state.kept.len(),
        stream_seq = sent.seq,
        parts = sent.parts,
        bytes = sent.bytes,
        "snapshot published"
    );
    state.snapshot_due = false;
    Ok(())
}

/// What the routes of a pass add up to on each of hafleet's Gateways (namespace, name): the
/// routes attached to each listener, and the newest routes-stream sequence published for
/// them (what `Programmed` waits for its fleet to serve).
#[derive(Debug, Default)]
pub(crate) struct Attached {
    listeners: BTreeMap<(String, String), BTreeMap<String, usize>>,
    needed: BTreeMap<(String, String), u64>,
}

/// Puts the Gateways the cache holds now (`gateways`) in `pass` (the last pass's reading), so
/// that statuses decided from it compare with the statuses written since: each Gateway as
/// cached now if its spec (generation) is the one the pass read, else left out (gone, or
/// changed: the pass its change wakes decides it).
pub(crate) fn current_gateways(
    pass: &mut crate::core::pass::GatewayPass,
    gateways: &[std::sync::Arc<kube::api::DynamicObject>],
) {
    let now: std::collections::HashMap<(&str, &str), &std::sync::Arc<kube::api::DynamicObject>> =
        gateways
            .iter()
            .filter_map(|g| {
                Some(((g.metadata.namespace.as_deref()?, g.metadata.name.as_deref()?), g))
            })
            .collect();
    pass.index.gateways.retain(|(ns, name), view| match now.get(&(ns.as_str(), name.as_str())) {
        Some(g) if g.metadata.generation == view.object.metadata.generation => {
            view.object = std::sync::Arc::clone(g);
            true
        }
        _ => false,
    });
}

/// The time a status says it was decided at (RFC 3339, whole seconds).
fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

/// Queues the status of each route of `pass` with a parent of hafleet's, where it changed,
/// and counts what they add up to on each Gateway ([`gateway_status`] takes that).
pub(crate) fn route_status(
    queue: &super::state::StatusQueue,
    pass: &crate::core::pass::GatewayPass,
    route_seqs: &super::state::RouteSeqs,
) -> Attached {
    use crate::core::gateway::status;
    let now = now_rfc3339();
    // Routes attached to each listener: (Gateway namespace, name) → listener → count; and the
    // newest routes-stream sequence published for the routes attached to each Gateway.
    let mut attached: BTreeMap<(&str, &str), BTreeMap<&str, usize>> = BTreeMap::new();
    let mut needed: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut decided = queue.decided.lock().unwrap_or_else(|p| p.into_inner());
    let mut next =
        super::state::Decided::with_capacity_and_hasher(pass.routes.len(), Default::default());
    for (kind, route, parents) in &pass.routes {
        let (ns, name) = (
            route.metadata.namespace.as_deref().unwrap_or("default"),
            route.metadata.name.as_deref().unwrap_or_default(),
        );
        let key = kind.key(ns, name);
        for p in parents.iter() {
            // What was last published of the route on this parent's Gateway's fleet.
            let fleet = pass.index.gateways.get(&p.gateway).and_then(|gw| gw.fleet.as_ref().ok());
            let seq = match (&key, fleet) {
                (Ok(k), Some(f)) => super::state::route_seq(route_seqs, k, f),
                _ => 0,
            };
            let gateway = (p.gateway.0.as_str(), p.gateway.1.as_str());
            let on = attached.entry(gateway).or_default();
            for l in &p.listeners {
                *on.entry(l.as_str()).or_default() += 1;
            }
            let at = needed.entry(gateway).or_default();
            *at = (*at).max(seq);
        }
        let (Some(ns), Some(name)) = (&route.metadata.namespace, &route.metadata.name) else {
            continue;
        };
        let at = std::sync::Arc::as_ptr(route) as usize;
        let unchanged = decided.get(&at).is_some_and(|(r, p)| {
            std::sync::Arc::ptr_eq(r, route) && (std::sync::Arc::ptr_eq(p, parents) || p == parents)
        });
        if !unchanged && let Some(new) = status::route_status(route, parents, &now) {
            queue.push(kind.kind(), Some(ns), name, new);
        }
        next.insert(at, (route.clone(), parents.clone()));
    }
    *decided = next;
    let owned = |(ns, name): (&str, &str)| (ns.to_owned(), name.to_owned());
    Attached {
        listeners: attached
            .into_iter()
            .map(|(g, ls)| (owned(g), ls.into_iter().map(|(l, n)| (l.to_owned(), n)).collect()))
            .collect(),
        needed: needed.into_iter().map(|(g, seq)| (owned(g), seq)).collect(),
    }
}

/// Queues the status of hafleet's GatewayClasses and of its Gateways in `index` (listeners,
/// the routes `attached` to each, `Programmed` by what the fleets serve), where it changed:
/// a few objects, decided again whenever what the fleets serve changes.
pub(crate) fn gateway_status(
    queue: &super::state::StatusQueue,
    classes: &[std::sync::Arc<kube::api::DynamicObject>],
    (index, attached): (&crate::core::gateway::Index, &Attached),
    args: &crate::app::args::RunArgs,
    served: &BTreeMap<FleetName, crate::core::served::Served>,
    unusable: &dyn Fn(&FleetName, &str, &str) -> Option<String>,
) {
    use crate::core::gateway::status;
    let now = now_rfc3339();
    for class in classes.iter().filter(|c| crate::core::gateway::is_ours(c)) {
        let Some(name) = class.metadata.name.as_deref() else { continue };
        if let Some(new) = status::class_status(class, &now) {
            queue.push("GatewayClass", None, name, new);
        }
    }
    for (key, gw) in &index.gateways {
        let (ns, name) = key;
        let none = BTreeMap::new();
        let counts: BTreeMap<&str, usize> = attached
            .listeners
            .get(key)
            .unwrap_or(&none)
            .iter()
            .map(|(l, n)| (l.as_str(), *n))
            .collect();
        // Programmed once its fleet's hosts all run a version that holds what was last
        // published for its routes.
        let need = attached.needed.get(key).copied().unwrap_or(0);
        let programmed = gw
            .fleet
            .as_ref()
            .ok()
            .and_then(|f| served.get(f))
            .and_then(|s| (s.seq.unwrap_or(0) >= need).then_some((s.version, s.hosts)));
        let addresses = &args.fleet_addresses;
        let unusable = |ns: &str, name: &str| match &gw.fleet {
            Ok(fleet) => unusable(fleet, ns, name),
            Err(_) => None,
        };
        let checks = (programmed, &unusable as &status::Unusable<'_>);
        if let Some(new) = status::gateway_status(gw, &counts, addresses, checks, &now) {
            queue.push("Gateway", Some(ns), name, new);
        }
    }
}
