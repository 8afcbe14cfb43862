//! One pass over the cluster's objects, decided without I/O: what to publish, what to hold and
//! what to tell whom. [`crate::app::run`] reads the caches, carries the plan out and records
//! what was acked.
//!
//! ```text
//! resolve (phase 1): each Ingress through the memo, the admin's policy, the size budget and
//!   tenancy ──▶ Resolution ──▶ which TLS Secrets it needs (the loop reads the changed ones)
//! finish (phase 2): certificates sealed in, budgets checked again, refused Ingresses kept up
//!   to the cap, the diff against what was published, the churn budget ──▶ Plan
//! ```
//! The TLS Secrets are the one input read in the middle: which ones are needed depends on
//! what phase 1 routed, and reading a Secret is I/O, so the pass is two functions.

use crate::core::churn::Budget;
use crate::core::index::{self, Action, Desired, Published, Wanted};
use crate::core::model::{Resolved, Warning};
use crate::core::policy::Policy;
use crate::core::resolve::{Endpoints, Memo, Refused, Services};
use crate::core::route_events::{IngressLimits, over_budget};
use hafleet_proto::{FleetName, IngressKey};
use k8s_openapi::api::networking::v1::Ingress;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// The watcher's settings a pass decides by.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// `--ingress-class` and `--endpoints`.
    pub resolve: crate::core::resolve::Config<'a>,
    /// Unless `--share-hosts-across-namespaces`: a host belongs to the namespace that routed it
    /// first.
    pub namespaces_own_hosts: bool,
    pub limits: IngressLimits<'a>,
    /// The largest message NATS takes.
    pub payload_limit: usize,
    /// `--max-kept-per-namespace`.
    pub max_kept_per_namespace: usize,
    /// `--cert-expiry-warning-days`.
    pub cert_expiry_warning_days: u32,
    /// `--bulk-delete-threshold`.
    pub bulk_delete_threshold: usize,
}

/// What the caches hold at the start of a pass.
pub struct Objects<'a> {
    pub ingresses: &'a [Arc<Ingress>],
    /// The Gateway API's objects, where the API server serves them.
    pub gateway: Option<&'a crate::core::gateway::Objects<'a>>,
    pub services: &'a Services,
    /// What the EndpointSlices say (`None`: the API server serves none).
    pub endpoints: Option<&'a Endpoints>,
    /// With `--tenancy-policy`: the policy in force.
    pub policy: Option<&'a Policy>,
}

/// A Warning Event to post on an Ingress (once per generation and note: the loop keeps what
/// was said), logged as `what`.
#[derive(Debug, Clone)]
pub struct Tell {
    pub subject: Subject,
    pub key: IngressKey,
    /// `g<generation>`, else the resourceVersion: what a warning is said once per.
    pub rv: String,
    pub reason: &'static str,
    pub note: String,
    pub what: &'static str,
}

type Seen = HashMap<IngressKey, Subject, foldhash::fast::RandomState>;

/// An object that routes, as the caches hold it.
#[derive(Debug, Clone)]
pub enum Subject {
    Ingress(Arc<Ingress>),
    /// A Gateway API route: an HTTPRoute or a TLSRoute.
    Route(crate::core::gateway::RouteKind, Arc<kube::api::DynamicObject>),
}

impl Subject {
    pub fn as_ingress(&self) -> Option<&Arc<Ingress>> {
        match self {
            Subject::Ingress(i) => Some(i),
            Subject::Route(..) => None,
        }
    }

    fn meta(&self) -> &kube::api::ObjectMeta {
        match self {
            Subject::Ingress(i) => &i.metadata,
            Subject::Route(_, r) => &r.metadata,
        }
    }

    /// What a warning about it is said once per ([`said_once_per`]).
    pub fn said_once_per(&self) -> String {
        said_once_per(self.meta())
    }

    /// Its creation time, in Unix seconds (0: unknown).
    pub fn created(&self) -> i64 {
        crate::core::model::created_unix(self.meta())
    }

    /// The reference an Event about it names.
    pub fn object_ref(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        use kube::Resource;
        match self {
            Subject::Ingress(i) => i.object_ref(&()),
            Subject::Route(kind, r) => {
                r.object_ref(&crate::core::gateway::api_resource(kind.kind()))
            }
        }
    }
}

/// Phase 1's result: every Ingress meant for hafleet, routed (tenants kept apart) or kept.
pub struct Resolution {
    desired: Wanted,
    /// Every Ingress in `desired`.
    seen: Seen,
    /// What to tell each routed Ingress that does not stop it (its own warnings and tenancy's).
    told: BTreeMap<IngressKey, Vec<Warning>>,
    tells: Vec<Tell>,
    /// (Ingress, what its warnings are said once per) of every Ingress that exists, when
    /// `prune_warned` asked for it.
    current: Option<BTreeSet<(IngressKey, String)>>,
    /// How many Ingresses were resolved anew (the others came from the memo).
    pub resolved_anew: usize,
    /// Fleets the admin's policy refuses an object on while it is routed on others: if it is
    /// kept later (over budget), not on these.
    refused_fleets: HashMap<IngressKey, Vec<FleetName>>,
    /// The Gateway API's objects as this pass read them, for their status.
    pub gateway: GatewayPass,
}

/// What a pass read of the Gateway API: hafleet's classes and Gateways, and each route
/// (HTTPRoute, TLSRoute) with what its status says to its parents that are hafleet's.
#[derive(Debug, Default)]
pub struct GatewayPass {
    pub index: crate::core::gateway::Index,
    pub routes: Vec<GatewayRoute>,
}

/// A route of the Gateway API as a pass read it: its kind, the object, its parents' status.
pub type GatewayRoute = (
    crate::core::gateway::RouteKind,
    Arc<kube::api::DynamicObject>,
    Arc<Vec<crate::core::gateway::route::ParentStatus>>,
);

/// What a pass does, in order: tell, publish `actions`, and remember the rest.
#[derive(Debug)]
pub struct Plan {
    /// Warning Events, in the order they were decided.
    pub tells: Vec<Tell>,
    /// Deletes first, then upserts, each in key order; held upserts left out.
    pub actions: Vec<Action>,
    /// The deletes of `actions` that go as a snapshot instead (a mass deletion), by fleet.
    pub bulk: BTreeMap<FleetName, BTreeSet<IngressKey>>,
    /// The upserts the churn budget held, (fleet, Ingress).
    pub held: Vec<(FleetName, IngressKey)>,
    /// Held Ingresses never published: a snapshot lists them as kept.
    pub held_new: BTreeSet<IngressKey>,
    /// Refused Ingresses that keep their last good routes.
    pub kept: BTreeSet<IngressKey>,
    /// Every Ingress that exists, when warnings said before may be about ones that changed
    /// or went: keep only these.
    pub current: Option<BTreeSet<(IngressKey, String)>>,
    /// The Gateway API's objects as the pass read them, for their status.
    pub gateway: GatewayPass,
    /// What the pass wanted for each Ingress, and the objects (for [`Plan::routed`]).
    desired: Wanted,
    seen: Seen,
}

impl Plan {
    /// How many Ingresses are desired (routed or kept).
    pub fn desired(&self) -> usize {
        self.desired.len()
    }

    /// The routed Ingresses with routes on `fleet`s with addresses, whose status may show
    /// them.
    pub fn routed<'a>(
        &'a self,
        has_addresses: impl Fn(&FleetName) -> bool + 'a,
    ) -> impl Iterator<Item = (&'a IngressKey, &'a FleetName, &'a Arc<Ingress>)> + 'a {
        self.desired.iter().filter_map(move |(key, d)| match d {
            // An Ingress is on one fleet.
            Desired::Routed(rs) => match rs.as_slice() {
                [r] if !r.routes.is_empty() && has_addresses(&r.fleet) => {
                    Some((key, &r.fleet, self.seen.get(key)?.as_ingress()?))
                }
                _ => None,
            },
            Desired::Keep(_) => None,
        })
    }
}

/// What a warning about `ing` is said once per: the spec's generation (a status update, ours
/// included, must not repeat every warning), else the resourceVersion.
pub fn said_once_per(meta: &kube::api::ObjectMeta) -> String {
    match (meta.generation, &meta.resource_version) {
        (Some(generation), _) => format!("g{generation}"),
        (None, rv) => rv.clone().unwrap_or_default(),
    }
}

/// Phase 1: resolves every Ingress (anew only where its inputs changed), refuses what the
/// policy or the size budget does not allow, and keeps tenants apart.
pub fn resolve(
    objects: &Objects<'_>,
    rules: &Rules<'_>,
    memo: &mut Memo,
    published: &Published,
    prune_warned: bool,
) -> Resolution {
    let mut out = Resolution {
        desired: Wanted::default(),
        seen: HashMap::default(),
        told: BTreeMap::new(),
        tells: Vec::new(),
        current: prune_warned.then(BTreeSet::new),
        resolved_anew: 0,
        gateway: GatewayPass::default(),
        refused_fleets: HashMap::default(),
    };
    let policy = objects.policy;
    memo.begin_pass();
    for ing in objects.ingresses {
        let ns = ing.metadata.namespace.as_deref().unwrap_or("default");
        let name = ing.metadata.name.as_deref().unwrap_or_default();
        let result = memo.resolve(ing, rules.resolve, objects.services, objects.endpoints);
        let key = IngressKey::new(ns, name);
        let result = result.map(|r| vec![r]);
        out.take(Subject::Ingress(ing.clone()), key, result, (policy, rules, published));
    }
    if let Some(gw) = objects.gateway {
        let index = crate::core::gateway::Index::new(gw);
        memo.routes.begin_pass(crate::core::gateway::memo::Around::of(gw));
        use crate::core::gateway::RouteKind;
        let http = gw.routes.iter().map(|r| (RouteKind::Http, r));
        let tls = gw.tls_routes.iter().map(|r| (RouteKind::Tls, r));
        let tcp = gw.tcp_routes.iter().map(|r| (RouteKind::Tcp, r));
        for (kind, route) in http.chain(tls).chain(tcp) {
            let (ns, name) = (route.metadata.namespace.as_deref(), route.metadata.name.as_deref());
            let sources = (objects.services, objects.endpoints);
            let outcome = memo.routes.resolve(route, sources, || {
                crate::core::gateway::route::resolve_kind(
                    kind,
                    route,
                    &index,
                    rules.resolve,
                    sources,
                )
            });
            let (ns, name) = (ns.unwrap_or("default"), name.unwrap_or_default());
            let key = kind.key(ns, name);
            let subject = Subject::Route(kind, route.clone());
            out.take(subject, key, outcome.result, (policy, rules, published));
            out.gateway.routes.push((kind, route.clone(), outcome.parents));
        }
        out.gateway.index = index;
        memo.routes.end_pass();
        out.resolved_anew += memo.routes.fresh;
    }
    memo.end_pass();
    out.resolved_anew += memo.fresh();
    // Hosts kept to the namespace that owns them; the losers of conflicts told.
    let mut routed = index::routed_mut(&mut out.desired);
    out.told = crate::core::tenancy::keep_apart(&mut routed, rules.namespaces_own_hosts);
    out
}

impl Resolution {
    /// Takes one object's resolution: routed, kept (refused, with its last good routes) or
    /// withdrawn, and what to tell it.
    fn take(
        &mut self,
        subject: Subject,
        key: Result<IngressKey, hafleet_proto::InvalidValue>,
        result: Result<Vec<Resolved>, Refused>,
        (policy, rules, published): (Option<&Policy>, &Rules<'_>, &Published),
    ) {
        // What a warning is said once per: a String, made only where it is needed (most
        // objects of a pass are neither told nor pruned against).
        if let Some(current) = &mut self.current
            && let Ok(key) = &key
        {
            current.insert((key.clone(), subject.said_once_per()));
        }
        let mut tell = |key: &IngressKey, reason, note: String| {
            let what = "ingress refused";
            let (rv, key) = (subject.said_once_per(), key.clone());
            self.tells.push(Tell { subject: subject.clone(), key, rv, reason, note, what });
        };
        match result {
            Ok(mut rs) => {
                // Outside the admin's policy: not routed on that fleet (what it had there is
                // withdrawn, even where the rest is kept), and told.
                let mut refused = Vec::new();
                rs.retain(|r| {
                    let ns = r.key.namespace.as_str();
                    match policy.and_then(|p| p.refuses(ns, &r.fleet, &r.routes)) {
                        Some(why) => {
                            tell(&r.key, "NotAllowed", format!("not routed by hafleet: {why}"));
                            refused.push(r.fleet.clone());
                            false
                        }
                        None => true,
                    }
                });
                let Some(first) = rs.first() else { return };
                let key = first.key.clone();
                // Only routes that differ from what was published can have grown too large
                // (certificates, not sealed in yet, are counted in `finish`).
                let over = rs.iter().find_map(|r| {
                    (!index::routes_current(published, r))
                        .then(|| over_budget(r, &rules.limits, rules.payload_limit))
                        .flatten()
                });
                let desired = match over {
                    // Refused like any invalid Ingress: alone, with a Warning, keeping its
                    // routes.
                    Some(why) => {
                        let note = format!("not routed by hafleet: {why}; split the Ingress");
                        tell(&key, "RoutesTooLarge", note);
                        Desired::Keep(refused.clone())
                    }
                    None => Desired::Routed(rs),
                };
                if !refused.is_empty() {
                    self.refused_fleets.insert(key.clone(), refused);
                }
                self.seen.insert(key.clone(), subject);
                self.desired.insert(key, desired);
            }
            Err(Refused::NotSelected) => {}
            Err(Refused::Invalid(why)) => {
                let Ok(key) = key else {
                    tracing::warn!(object = ?subject.object_ref().name, "object with an invalid name ignored");
                    return;
                };
                let reason = match &subject {
                    Subject::Ingress(_) => "InvalidIngress",
                    Subject::Route(crate::core::gateway::RouteKind::Http, _) => "InvalidHTTPRoute",
                    Subject::Route(crate::core::gateway::RouteKind::Tls, _) => "InvalidTLSRoute",
                    Subject::Route(crate::core::gateway::RouteKind::Tcp, _) => "InvalidTCPRoute",
                };
                tell(&key, reason, format!("not routed by hafleet: {}", why.join("; ")));
                // Its last good routes stay only where the policy still allows them.
                let meta = subject.meta();
                if let Some(why) =
                    policy.and_then(|p| crate::core::policy::refuses_kept(p, &key, meta, published))
                {
                    tell(&key, "NotAllowed", format!("not routed by hafleet: {why}"));
                    return;
                }
                self.seen.insert(key.clone(), subject);
                self.desired.insert(key, Desired::Keep(vec![]));
            }
        }
    }

    /// The TLS Secrets (namespace, name) that the routed Ingresses of fleets with TLS on
    /// (`sealed_for`) name in `spec.tls`, and the HTTPS listeners of hafleet's Gateways on
    /// them (each listener's, routes or not, so its status can say whether it resolves).
    pub fn secrets(&self, sealed_for: impl Fn(&FleetName) -> bool) -> BTreeSet<(String, String)> {
        let mut wanted = BTreeSet::new();
        for d in self.desired.values() {
            let Desired::Routed(rs) = d else { continue };
            for r in rs {
                if !sealed_for(&r.fleet) {
                    continue;
                }
                let Some(subject) = self.seen.get(&r.key) else { continue };
                let ns = r.key.namespace.as_str();
                for e in tls_spec(r, subject) {
                    let Some(secret) = e.secret else { continue };
                    wanted.insert((e.namespace.unwrap_or_else(|| ns.to_owned()), secret));
                }
            }
        }
        wanted.extend(self.gateway.index.listener_secrets(&sealed_for));
        wanted
    }
}

/// The certificate of Secret (namespace, name) sealed to a fleet, or why not (`None`: nothing
/// to tell, it was not read).
pub type SealedLookup<'a> = dyn FnMut(&FleetName, &str, &str) -> Looked + 'a;

/// TLS, when the watcher serves it: which fleets have a sealing key, and each Secret's
/// certificate sealed to a fleet (or why not; `None` when there is nothing to tell).
pub struct Tls<'a> {
    pub sealed_for: &'a dyn Fn(&FleetName) -> bool,
    pub lookup: &'a mut SealedLookup<'a>,
    pub now_unix: i64,
    /// Each object's entries as the passes before worked them out.
    pub memo: &'a mut SealMemo,
}

/// Phase 2: seals the certificates in (with `tls`), refuses what has grown over budget with
/// them, keeps refused Ingresses up to the cap per namespace, and decides what to publish now
/// and what the churn budget holds.
pub fn finish(
    mut res: Resolution,
    tls: Option<Tls<'_>>,
    rules: &Rules<'_>,
    published: &Published,
    churn: &mut Budget,
    now: tokio::time::Instant,
) -> Plan {
    let mut too_big: Vec<(IngressKey, String)> = Vec::new();
    let mut tls = tls;
    if let Some(tls) = tls.as_mut() {
        tls.memo.begin();
    }
    for r in index::routed_mut(&mut res.desired) {
        let mut sealing = Vec::new();
        let subject = res.seen.get(&r.key);
        if let (Some(tls), Some(subject)) = (tls.as_mut(), subject) {
            seal(r, subject, tls, rules, &mut sealing);
            // Certificates count against the Ingress's budget too.
            if !r.tls.is_empty()
                && !index::is_current(published, r)
                && let Some(why) = over_budget(r, &rules.limits, rules.payload_limit)
            {
                too_big.push((r.key.clone(), why));
            }
        }
        // Its own warnings, tenancy's, then the certificates'. (Nothing reads a Resolved's
        // warnings after this: publishing compares routes.)
        // (An object on several fleets has one entry: each warning once.)
        let mut said = std::mem::take(&mut r.warnings);
        for w in res.told.remove(&r.key).unwrap_or_default().into_iter().chain(sealing) {
            if !said.contains(&w) {
                said.push(w);
            }
        }
        if !said.is_empty() {
            res.told.insert(r.key.clone(), said);
        }
    }
    if let Some(tls) = tls.as_mut() {
        tls.memo.end();
    }
    let mut plan_tells = std::mem::take(&mut res.tells);
    let mut tell = |subject: &Subject, key: &IngressKey, reason, note, what| {
        let (subject, key, rv) = (subject.clone(), key.clone(), subject.said_once_per());
        plan_tells.push(Tell { subject, key, rv, reason, note, what });
    };
    for (key, why) in too_big {
        // Refused like any Ingress over budget: alone, keeping what it had (where the policy
        // still allows it).
        let refused = res.refused_fleets.remove(&key).unwrap_or_default();
        res.desired.insert(key.clone(), Desired::Keep(refused));
        if let Some(seen) = res.seen.get(&key) {
            let note = format!("not routed by hafleet: {why}; split the Ingress");
            tell(seen, &key, "RoutesTooLarge", note, "ingress refused");
        }
    }
    for (key, said) in std::mem::take(&mut res.told) {
        let Some(seen) = res.seen.get(&key) else { continue };
        for w in said {
            tell(seen, &key, w.reason, w.note, "ingress routed with a caveat");
        }
    }
    // Refused Ingresses kept beyond the cap (the oldest of a namespace's) are no longer desired
    // at all: what was published of them is deleted and no snapshot keeps them.
    let cap = rules.max_kept_per_namespace;
    let refused = res.desired.iter().filter(|(_, d)| matches!(d, Desired::Keep(_)));
    let times = refused.map(|(k, _)| (k.clone(), res.seen.get(k).map_or(0, Subject::created)));
    for key in index::beyond_cap(times.collect::<Vec<_>>(), cap) {
        res.desired.remove(&key);
        let Some(seen) = res.seen.get(&key) else { continue };
        let note = format!(
            "refused, and no longer served with its last good routes: namespace {} has more \
             refused Ingresses than the watcher keeps for their last good routes \
             (--max-kept-per-namespace {cap}), and this is one of the oldest; fix or delete \
             the refused Ingresses",
            key.namespace
        );
        tell(seen, &key, "RefusedNotKept", note, "refused ingress no longer kept");
    }
    let actions = index::diff(published, &res.desired);
    // Upserts of a namespace over its budget wait, unrecorded: the next diff finds them again.
    let crate::core::churn::Admitted { go: actions, held } = churn.admit(actions, published, now);
    for (fleet, key) in &held {
        let Some(seen) = res.seen.get(key) else { continue };
        let note = churn.note(fleet, &key.namespace);
        tell(seen, key, "Throttled", note, "ingress changes held");
    }
    // A held Ingress never published (by this run) is kept: no snapshot sweeps what it had.
    let held_new =
        held.iter().map(|(_, k)| k).filter(|k| !published.contains_key(*k)).cloned().collect();
    let kept = res
        .desired
        .iter()
        .filter(|(_, d)| matches!(d, Desired::Keep(_)))
        .map(|(k, _)| k.clone())
        .collect();
    Plan {
        tells: plan_tells,
        bulk: index::bulk_deletes(&actions, rules.bulk_delete_threshold),
        actions,
        held,
        held_new,
        kept,
        current: res.current,
        gateway: res.gateway,
        desired: res.desired,
        seen: res.seen,
    }
}

mod seal;
pub use seal::{Looked, SealMemo};
use seal::{seal, tls_spec};

#[cfg(test)]
mod tests;
