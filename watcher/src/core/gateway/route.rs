//! One HTTPRoute: the Gateways of hafleet it attaches to, its routes for their fleet, and
//! what its status says to each of them. Pure.
//!
//! Served so far: `Exact` and `PathPrefix` path matches, hostnames (intersected with each
//! listener's), one Service per rule (in another namespace with a ReferenceGrant there), and
//! the request and response header modifiers. A rule whose backend cannot be resolved
//! answers 500, as the specification says. What is not served yet (header, query and method
//! matches, several weighted backends, redirects, rewrites, …) refuses the route with
//! `Accepted: False`, reason `UnsupportedValue`, and a message that names it: never served
//! as something else.

use super::spec::{BackendRef, HeaderModifier, HttpRouteSpec, ParentRef, RouteRule, spec_of};
use super::{Index, intersect};
use crate::core::model::{Resolved, Sharing, Warning};
use crate::core::resolve::{Config, Endpoints, Refused, Services, Sources};
use hafleet_proto::{
    Backend, FailStatus, FleetName, HeaderName, HeaderRules, HeaderValue, HttpHost, HttpPath,
    IngressKey, Namespace, ObjectName, PathKind, Route, ServiceRef, TrafficPolicy,
};
use kube::api::DynamicObject;

/// A condition of a route's parent status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub type_: &'static str,
    pub ok: bool,
    pub reason: &'static str,
    /// Never empty: Kubernetes 1.20 refuses an empty message.
    pub message: String,
}

impl Condition {
    fn yes(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Condition { type_, ok: true, reason, message: message.into() }
    }

    fn no(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Condition { type_, ok: false, reason, message: message.into() }
    }
}

/// What an HTTPRoute's status says to one of its parents that is hafleet's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentStatus {
    /// As the route wrote it.
    pub parent_ref: ParentRef,
    /// `Accepted` and `ResolvedRefs`.
    pub conditions: Vec<Condition>,
    /// The Gateway (namespace, name) and its listeners the route is attached to.
    pub gateway: (String, String),
    pub listeners: Vec<String>,
}

/// An HTTPRoute resolved: its routes (or why not) and its parents' statuses.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub result: Result<Resolved, Refused>,
    /// Empty: no parent of it is hafleet's (its status is not hafleet's to write).
    pub parents: Vec<ParentStatus>,
}

/// A parent the route attached to: its fleet and the hostnames it may serve there (`None`:
/// any host).
struct Attached {
    index: usize,
    fleet: FleetName,
    hosts: Vec<Option<HttpHost>>,
}

/// Resolves `route` against hafleet's Gateways in `index`.
pub fn resolve(
    route: &DynamicObject,
    index: &Index,
    config: Config<'_>,
    services: &Services,
    endpoints: Option<&Endpoints>,
) -> Outcome {
    let nothing = Outcome { result: Err(Refused::NotSelected), parents: vec![] };
    let Ok(spec) = spec_of::<HttpRouteSpec>(route) else { return nothing };
    let meta = &route.metadata;
    let namespace = meta.namespace.as_deref().unwrap_or("default");
    let (mut parents, attached) = attach(&spec, namespace, index);
    if parents.is_empty() {
        return nothing;
    }
    let Some(fleet) = attached.first().map(|a| a.fleet.clone()) else {
        return Outcome { result: Err(Refused::NotSelected), parents };
    };
    // One fleet serves an HTTPRoute: parents on another are told so.
    let mut hosts: Vec<Option<HttpHost>> = Vec::new();
    for a in &attached {
        if a.fleet != fleet {
            let message = format!(
                "an HTTPRoute is served by one fleet: this parent's Gateway is on fleet {}, \
                 the route's first parent's on fleet {fleet}",
                a.fleet
            );
            parents[a.index].conditions =
                vec![Condition::no("Accepted", "UnsupportedValue", message)];
            parents[a.index].listeners.clear();
            continue;
        }
        for h in &a.hosts {
            if !hosts.contains(h) {
                hosts.push(h.clone());
            }
        }
    }

    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let mut unresolved: Vec<(&'static str, String)> = Vec::new();
    let pods_by_default = config.pods_fleets.contains(&fleet);
    let sources = Sources { services, endpoints, pods_by_default };
    let mut routes: Vec<Route> = Vec::new();
    for (i, rule) in spec.rules.iter().enumerate() {
        let at = format!("rules[{i}]");
        let Some(paths) = paths_of(rule, &at, &mut errors) else { continue };
        let Some(options) = options_of(rule, &at, &mut errors) else { continue };
        let mut backend = match backend_of(rule, namespace, meta, index, &sources) {
            Ok(Ok((backend, said))) => {
                warnings.extend(said);
                backend
            }
            Ok(Err((reason, message, backend))) => {
                unresolved.push((reason, format!("{at}: {message}")));
                backend
            }
            Err(e) => {
                errors.push(format!("{at}.backendRefs: {e}"));
                continue;
            }
        };
        let fail_status = backend.options.fail_status;
        let send_proxy = backend.options.send_proxy;
        backend.options = options;
        backend.options.fail_status = fail_status;
        backend.options.send_proxy = send_proxy;
        for host in &hosts {
            for (path, kind) in &paths {
                // The first rule to claim a host, path and kind has it, as the spec orders.
                let claimed = routes.iter().any(|r| {
                    &r.host == host && r.kind == *kind && r.path.trimmed() == path.trimmed()
                });
                if !claimed {
                    let (host, path) = (host.clone(), path.clone());
                    routes.push(Route { host, path, kind: *kind, backend: backend.clone() });
                }
            }
        }
    }

    let resolved_refs = match unresolved.first() {
        None => Condition::yes("ResolvedRefs", "ResolvedRefs", "every backendRef resolves"),
        Some((reason, _)) => {
            let all: Vec<&str> = unresolved.iter().map(|(_, m)| m.as_str()).collect();
            let message = format!("{}; those rules answer 500", all.join("; "));
            Condition::no("ResolvedRefs", reason, message)
        }
    };
    let accepted = match errors.is_empty() {
        true => Condition::yes("Accepted", "Accepted", "accepted by hafleet"),
        false => Condition::no("Accepted", "UnsupportedValue", errors.join("; ")),
    };
    for a in attached.iter().filter(|a| a.fleet == fleet) {
        parents[a.index].conditions = vec![accepted.clone(), resolved_refs.clone()];
    }
    if !errors.is_empty() {
        for a in &attached {
            parents[a.index].listeners.clear();
        }
        return Outcome { result: Err(Refused::Invalid(errors)), parents };
    }
    let name = meta.name.as_deref().unwrap_or_default();
    let Ok(key) = IngressKey::http_route(namespace, name) else {
        return Outcome { result: Err(Refused::NotSelected), parents };
    };
    let sharing = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::core::model::SHARE_ANNOTATION))
        .map(|v| Sharing::parse(v))
        .transpose();
    let sharing = match sharing {
        Ok(s) => s.unwrap_or_default(),
        Err(e) => {
            let note = format!("annotation {}: {e}", crate::core::model::SHARE_ANNOTATION);
            return Outcome { result: Err(Refused::Invalid(vec![note])), parents };
        }
    };
    let resolved = Resolved {
        fleet,
        key,
        created_unix: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()).unwrap_or(0),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
        routes: std::sync::Arc::new(routes),
        warnings,
        sharing,
        tls: Vec::new(),
    };
    Outcome { result: Ok(resolved), parents }
}

/// Every parentRef that names one of hafleet's Gateways gets a status; those whose Gateway
/// has a fleet and a listener that takes the route are attached.
fn attach(
    spec: &HttpRouteSpec,
    namespace: &str,
    index: &Index,
) -> (Vec<ParentStatus>, Vec<Attached>) {
    let mut parents = Vec::new();
    let mut attached = Vec::new();
    for parent in spec.parent_refs.iter().filter(|p| p.is_gateway()) {
        let gw_ns = parent.namespace.as_deref().unwrap_or(namespace);
        let Some(gw) = index.gateways.get(&(gw_ns.to_owned(), parent.name.clone())) else {
            continue;
        };
        let i = parents.len();
        let gateway = (gw_ns.to_owned(), parent.name.clone());
        let mut status = ParentStatus {
            parent_ref: parent.clone(),
            conditions: vec![],
            gateway,
            listeners: vec![],
        };
        let refuse = |reason, message: String| vec![Condition::no("Accepted", reason, message)];
        let fleet = match &gw.fleet {
            Ok(f) => f.clone(),
            Err(why) => {
                let message = format!("Gateway {gw_ns}/{} is not served: {why}", parent.name);
                status.conditions = refuse("Pending", message);
                parents.push(status);
                continue;
            }
        };
        let named = gw.listeners.iter().filter(|l| {
            parent.section_name.as_ref().is_none_or(|s| *s == l.spec.name)
                && parent.port.is_none_or(|p| p == l.spec.port)
        });
        let named: Vec<_> = named.collect();
        if named.is_empty() {
            let message = "no listener of the Gateway has the sectionName and port it names";
            status.conditions = refuse("NoMatchingParent", message.into());
            parents.push(status);
            continue;
        }
        let allowing: Vec<_> = named
            .into_iter()
            .filter(|l| l.refused.is_none() && l.allows(gw_ns, namespace))
            .collect();
        if allowing.is_empty() {
            let message = format!(
                "no listener of Gateway {gw_ns}/{} that hafleet serves allows HTTPRoutes of \
                 namespace {namespace}",
                parent.name
            );
            status.conditions = refuse("NotAllowedByListeners", message);
            parents.push(status);
            continue;
        }
        let mut hosts = Vec::new();
        for l in allowing {
            let mine: Vec<Option<String>> = match (spec.hostnames.is_empty(), &l.spec.hostname) {
                (true, listener) => vec![listener.clone()],
                (false, listener) => spec
                    .hostnames
                    .iter()
                    .filter_map(|h| intersect(listener.as_deref(), h).map(Some))
                    .collect(),
            };
            if mine.is_empty() {
                continue;
            }
            status.listeners.push(l.spec.name.clone());
            for h in mine {
                // A hostname that is not one (the schema's pattern, if removed) serves nothing.
                let host = match h {
                    None => None,
                    Some(h) => match HttpHost::new(h.as_str()) {
                        Ok(h) => Some(h),
                        Err(_) => continue,
                    },
                };
                if !hosts.contains(&host) {
                    hosts.push(host);
                }
            }
        }
        if status.listeners.is_empty() {
            let message = "no hostname of the route matches a listener's hostname";
            status.conditions = refuse("NoMatchingListenerHostname", message.into());
            parents.push(status);
            continue;
        }
        attached.push(Attached { index: i, fleet, hosts });
        parents.push(status);
    }
    (parents, attached)
}

/// The paths a rule matches, or `None` (its errors said) when one is not served.
fn paths_of(
    rule: &RouteRule,
    at: &str,
    errors: &mut Vec<String>,
) -> Option<Vec<(HttpPath, PathKind)>> {
    let mut paths = Vec::new();
    if rule.matches.is_empty() {
        return Some(vec![(HttpPath::root(), PathKind::Prefix)]);
    }
    let before = errors.len();
    for (j, m) in rule.matches.iter().enumerate() {
        let at = format!("{at}.matches[{j}]");
        for (what, set) in [
            ("headers", !m.headers.is_empty()),
            ("queryParams", !m.query_params.is_empty()),
            ("method", m.method.is_some()),
        ] {
            if set {
                errors.push(format!("{at}.{what}: matches on it are not served by hafleet yet"));
            }
        }
        let path = m.path.clone().unwrap_or_default();
        let value = path.value.as_deref().unwrap_or("/");
        let kind = match path.type_.as_deref().unwrap_or("PathPrefix") {
            "PathPrefix" => PathKind::Prefix,
            "Exact" => PathKind::Exact,
            other => {
                errors.push(format!("{at}.path.type: {other} is not served by hafleet"));
                continue;
            }
        };
        match HttpPath::new(value) {
            Ok(p) => paths.push((p, kind)),
            Err(e) => errors.push(format!("{at}.path.value: {e}")),
        }
    }
    (errors.len() == before).then_some(paths)
}

/// The backend options a rule's filters make, or `None` (its errors said).
fn options_of(
    rule: &RouteRule,
    at: &str,
    errors: &mut Vec<String>,
) -> Option<hafleet_proto::BackendOptions> {
    let before = errors.len();
    let mut options = hafleet_proto::BackendOptions::default();
    for (j, f) in rule.filters.iter().enumerate() {
        let at = format!("{at}.filters[{j}]");
        let (modifier, into) = match f.type_.as_str() {
            "RequestHeaderModifier" => (&f.request_header_modifier, &mut options.request_headers),
            "ResponseHeaderModifier" => {
                (&f.response_header_modifier, &mut options.response_headers)
            }
            other => {
                errors.push(format!("{at}: filter {other} is not served by hafleet yet"));
                continue;
            }
        };
        match modifier.as_ref().map(header_rules) {
            Some(Ok(rules)) => **into = rules,
            Some(Err(e)) => errors.push(format!("{at}: {e}")),
            None => errors.push(format!("{at}: the filter of type {} is missing", f.type_)),
        }
    }
    (errors.len() == before).then_some(options)
}

fn header_rules(m: &HeaderModifier) -> Result<HeaderRules, String> {
    let pair = |p: &super::spec::HeaderPair| -> Result<(HeaderName, HeaderValue), String> {
        Ok((
            HeaderName::new(p.name.as_str()).map_err(|e| e.to_string())?,
            HeaderValue::new(p.value.as_str()).map_err(|e| e.to_string())?,
        ))
    };
    Ok(HeaderRules {
        remove: m
            .remove
            .iter()
            .map(|n| HeaderName::new(n.as_str()).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?,
        set: m.set.iter().map(pair).collect::<Result<_, _>>()?,
        add: m.add.iter().map(pair).collect::<Result<_, _>>()?,
    })
}

/// A rule's backend: `Ok(Ok(..))` resolved (with what to tell), `Ok(Err((reason, message,
/// backend)))` not resolvable (the backend answers 500), `Err` not served.
#[allow(clippy::type_complexity)]
fn backend_of(
    rule: &RouteRule,
    namespace: &str,
    meta: &kube::api::ObjectMeta,
    index: &Index,
    sources: &Sources<'_>,
) -> Result<Result<(Backend, Vec<Warning>), (&'static str, String, Backend)>, String> {
    let refs: Vec<&BackendRef> = rule.backend_refs.iter().filter(|r| r.weight != Some(0)).collect();
    let failing = |ns: &str, name: &str, port: u16| -> Result<Backend, String> {
        let mut b = empty_backend(ns, name, port)?;
        b.options.fail_status = Some(FailStatus::InternalError);
        Ok(b)
    };
    let route_name = meta.name.as_deref().unwrap_or_default();
    let r = match refs.as_slice() {
        [] => {
            let message = "the rule has no backendRefs";
            return Ok(Err((
                "BackendNotFound",
                message.into(),
                failing(namespace, route_name, 0)?,
            )));
        }
        [r] => *r,
        _ => return Err("several weighted backends are not served by hafleet yet".into()),
    };
    if !r.filters.is_empty() {
        return Err("filters on a backendRef are not served by hafleet yet".into());
    }
    let ns = r.namespace.as_deref().unwrap_or(namespace);
    let port = r.port.unwrap_or(0);
    if !r.is_service() {
        let kind = r.kind.as_deref().unwrap_or("Service");
        let message = format!("backendRef {}: kind {kind} is not a Service", r.name);
        return Ok(Err(("InvalidKind", message, failing(namespace, route_name, 0)?)));
    }
    if ns != namespace && !index.grants_service(namespace, ns, &r.name) {
        let message = format!(
            "backendRef {ns}/{}: no ReferenceGrant in namespace {ns} lets HTTPRoutes of \
             namespace {namespace} name it",
            r.name
        );
        return Ok(Err(("RefNotPermitted", message, failing(ns, &r.name, port)?)));
    }
    if r.port.is_none() {
        let message = format!("backendRef {ns}/{}: a Service needs a port", r.name);
        return Ok(Err(("UnsupportedValue", message, failing(ns, &r.name, 0)?)));
    }
    if !sources.services.contains_key(&(ns.to_owned(), r.name.clone())) {
        let message = format!("backendRef {ns}/{}: the Service does not exist", r.name);
        return Ok(Err(("BackendNotFound", message, failing(ns, &r.name, port)?)));
    }
    let ingress_backend = k8s_openapi::api::networking::v1::IngressBackend {
        resource: None,
        service: Some(k8s_openapi::api::networking::v1::IngressServiceBackend {
            name: r.name.clone(),
            port: Some(k8s_openapi::api::networking::v1::ServiceBackendPort {
                name: None,
                number: Some(i32::from(port)),
            }),
        }),
    };
    let mut said = Vec::new();
    let backend = crate::core::resolve::backend(ns, &ingress_backend, sources, &mut said)?;
    Ok(Ok((backend, said)))
}

/// A backend of Service `ns/name` port `port` with no servers.
fn empty_backend(ns: &str, name: &str, port: u16) -> Result<Backend, String> {
    Ok(Backend {
        service: ServiceRef {
            namespace: Namespace::new(ns).map_err(|e| e.to_string())?,
            name: ObjectName::new(name).map_err(|e| e.to_string())?,
            port,
            cluster: None,
        },
        node_port: None,
        servers: vec![],
        traffic_policy: TrafficPolicy::Cluster,
        endpoint_nodes: None,
        options: Default::default(),
        pods: None,
    })
}
