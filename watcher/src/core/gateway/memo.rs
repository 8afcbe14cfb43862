//! Each HTTPRoute's last resolution, reused on the next pass while nothing it was resolved from
//! changed: the same route object, the same Gateway API objects around it (classes' and
//! Gateways' specs and fleets, ReferenceGrants, namespace labels), and the same Services (and endpoints) its backendRefs
//! name. The watch caches replace an object on every change and keep it otherwise, so "the
//! same" is the same `Arc`, as for Ingresses ([`crate::core::resolve::Memo`]).

use super::Objects;
use super::route::Outcome;
use super::spec::{HttpRouteSpec, spec_of};
use crate::core::resolve::FLEET_ANNOTATION;
use crate::core::resolve::{Endpoints, Services};
use kube::api::DynamicObject;
use std::collections::HashMap;
use std::sync::Arc;

/// What every route's resolution depends on besides the route and its Services: the objects
/// an [`super::Index`] is built from, by address (namespace labels by value).
/// A class's or Gateway's namespace, name, generation and fleet annotation.
type SpecKey = (Option<String>, Option<String>, Option<i64>, Option<String>);

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Around {
    /// Classes and Gateways by what a route's resolution reads of them: name, generation
    /// (their spec) and fleet annotation, not their status (which hafleet writes after every
    /// route change).
    specs: Vec<SpecKey>,
    /// ReferenceGrants by address.
    grants: Vec<usize>,
    namespaces: Vec<(String, Vec<(String, String)>)>,
}

impl Around {
    pub fn of(objects: &Objects<'_>) -> Around {
        let spec = |o: &Arc<DynamicObject>| {
            let m = &o.metadata;
            let fleet = m.annotations.as_ref().and_then(|a| a.get(FLEET_ANNOTATION)).cloned();
            (m.namespace.clone(), m.name.clone(), m.generation, fleet)
        };
        let specs = objects.classes.iter().chain(objects.gateways).map(spec).collect();
        let grants = objects.grants.iter().map(|o| Arc::as_ptr(o) as usize).collect();
        let mut namespaces: Vec<(String, Vec<(String, String)>)> = objects
            .namespaces
            .into_iter()
            .flatten()
            .map(|(n, l)| (n.clone(), l.iter().map(|(k, v)| (k.clone(), v.clone())).collect()))
            .collect();
        namespaces.sort();
        Around { specs, grants, namespaces }
    }
}

use crate::core::resolve::{
    NamedService as Named, memo_key, named_now, same_but_status, unchanged,
};

struct Memoized {
    route: Arc<DynamicObject>,
    named: Vec<Named>,
    outcome: Outcome,
    pass: u64,
}

#[derive(Default)]
pub struct RouteMemo {
    around: Around,
    /// By the route's uid (its address when it has none): the object a status write replaced
    /// is found again.
    entries: HashMap<String, Memoized, foldhash::fast::RandomState>,
    pass: u64,
    /// How many routes this pass resolved anew.
    pub fresh: usize,
}

impl RouteMemo {
    /// Starts a pass over routes around `around`: what changed there resolves every route
    /// anew.
    pub fn begin_pass(&mut self, around: Around) {
        self.pass += 1;
        self.fresh = 0;
        if around != self.around {
            self.entries.clear();
            self.around = around;
        }
    }

    /// Forgets the routes the pass did not resolve.
    pub fn end_pass(&mut self) {
        let pass = self.pass;
        self.entries.retain(|_, m| m.pass == pass);
    }

    /// `resolve(route)`, or the same outcome as last pass when its inputs have not changed.
    pub fn resolve(
        &mut self,
        route: &Arc<DynamicObject>,
        (services, endpoints): (&Services, Option<&Endpoints>),
        resolve: impl FnOnce() -> Outcome,
    ) -> Outcome {
        let same = |m: &Memoized| {
            (Arc::ptr_eq(&m.route, route) || same_but_status(&m.route.metadata, &route.metadata))
                && unchanged(&m.named, services, endpoints)
        };
        let key = memo_key(&route.metadata, Arc::as_ptr(route) as usize);
        let key = key.as_ref();
        let pass = self.pass;
        if let Some(m) = self.entries.get_mut(key)
            && same(m)
        {
            // A status write gives the route a new object: kept, so the next pass finds it
            // the same by address.
            m.route = route.clone();
            m.pass = pass;
            return m.outcome.clone();
        }
        let named = named_now(named_services(route), services, endpoints);
        let outcome = resolve();
        self.fresh += 1;
        let m = Memoized { route: route.clone(), named, outcome: outcome.clone(), pass };
        self.entries.insert(key.to_owned(), m);
        outcome
    }
}

/// The Services (namespace, name) a route's backendRefs name, each once.
fn named_services(route: &DynamicObject) -> Vec<(String, String)> {
    let ns = route.metadata.namespace.as_deref().unwrap_or("default");
    let Ok(spec) = spec_of::<HttpRouteSpec>(route) else { return vec![] };
    let mut named: Vec<(String, String)> = spec
        .rules
        .iter()
        .flat_map(|r| r.backend_refs.iter())
        .map(|b| (b.namespace.clone().unwrap_or_else(|| ns.to_owned()), b.name.clone()))
        .collect();
    named.sort();
    named.dedup();
    named
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_is_resolved_again_only_when_it_or_what_it_names_changed() {
        let route: Arc<DynamicObject> = Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": "r", "namespace": "shop"},
                "spec": {"rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}
            }))
            .unwrap(),
        );
        let services = Services::default();
        let mut memo = RouteMemo::default();
        let outcome = || Outcome {
            result: Err(crate::core::resolve::Refused::NotSelected),
            parents: Default::default(),
        };
        for _ in 0..3 {
            memo.begin_pass(Around::default());
            memo.resolve(&route, (&services, None), outcome);
            memo.end_pass();
        }
        assert_eq!(memo.fresh, 0, "unchanged: from memory");
        // Its Service appears: resolved again.
        let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "web", "namespace": "shop"}}),
        )
        .unwrap();
        let mut services = Services::default();
        services.insert(("shop".into(), "web".into()), Arc::new(svc));
        memo.begin_pass(Around::default());
        memo.resolve(&route, (&services, None), outcome);
        assert_eq!(memo.fresh, 1);
        // Its status written (a new object of the same generation): from memory, the
        // memoized outcome's routes shared; a new generation: resolved again.
        let with = |generation: i64, status: &str| -> Arc<DynamicObject> {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                    "metadata": {"name": "r", "namespace": "shop", "uid": "u-1", "generation": generation},
                    "spec": {"rules": [{"backendRefs": [{"name": "web", "port": 80}]}]},
                    "status": {"parents": [{"controllerName": status}]}
                }))
                .unwrap(),
            )
        };
        memo.begin_pass(Around::default());
        memo.resolve(&with(1, "a"), (&services, None), outcome);
        assert_eq!(memo.fresh, 1);
        memo.begin_pass(Around::default());
        memo.resolve(&with(1, "b"), (&services, None), outcome);
        assert_eq!(memo.fresh, 0, "only its status changed");
        memo.begin_pass(Around::default());
        memo.resolve(&with(2, "b"), (&services, None), outcome);
        assert_eq!(memo.fresh, 1, "a new generation");
        // Something around every route changed: all resolved again.
        memo.begin_pass(Around { grants: vec![1], ..Around::default() });
        memo.resolve(&route, (&services, None), outcome);
        assert_eq!(memo.fresh, 1);
    }
}
