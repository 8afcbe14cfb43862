//! One HTTPRoute: the Gateways of hafleet it attaches to, its routes for their fleet, and
//! what its status says to each of them. Pure.
//!
//! Served so far: `Exact` and `PathPrefix` path matches, `Exact` header and query parameter
//! matches and method matches (each match one route, carrying what else it asks in
//! [`RouteMore`]), hostnames (intersected with each listener's), Services (in another
//! namespace with a ReferenceGrant there) sharing a rule's requests by weight, and the
//! request and response header modifiers, redirects, URL rewrites and timeouts
//! ([`super::filters`]), and a backendRef's own header modifiers (after its rule's, for the
//! requests it takes). A backendRef that cannot be resolved answers its
//! share of the requests with 500, as the specification says. What is not served yet
//! (regular expressions, mirrors, other backendRef filters, …) refuses the
//! route with `Accepted: False`, reason `UnsupportedValue`, and a message that names it:
//! never served as something else.

use super::spec::{
    BackendRef, HttpRouteSpec, ParentRef, RouteRule, TcpRouteSpec, TlsRouteSpec, ValueMatch,
    spec_of,
};
use super::{Index, RouteKind, intersect};
use crate::core::model::{Resolved, Sharing, Warning};
use crate::core::resolve::{Config, Endpoints, Refused, Services, Sources};
use hafleet_proto::{
    Backend, FailStatus, FleetName, HeaderName, HeaderValue, HttpHost, HttpPath, Method, Namespace,
    ObjectName, ParamName, PathKind, Route, RouteMore, ServiceRef,
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
    /// One per fleet, in fleet order.
    pub result: Result<Vec<Resolved>, Refused>,
    /// Empty: no parent of it is hafleet's (its status is not hafleet's to write). Shared:
    /// a memoized outcome goes to the pass and the status bookkeeping without a copy.
    pub parents: std::sync::Arc<Vec<ParentStatus>>,
}

/// A parent the route attached to: its fleet and the hostnames it may serve there (`None`:
/// any host), each with the listeners it comes through.
struct Attached {
    index: usize,
    fleet: FleetName,
    hosts: Vec<(Option<HttpHost>, Via)>,
}

/// How requests for a host reach a route: through HTTP listeners, HTTPS listeners (with
/// their certificates' Secrets, (namespace, name)), or both; for a TCPRoute, through the
/// ports of its TCP listeners.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Via {
    plain: bool,
    tls: bool,
    certs: Vec<(String, String)>,
    ports: Vec<u16>,
}

impl Via {
    fn add(&mut self, other: &Via) {
        self.plain |= other.plain;
        self.tls |= other.tls;
        for c in &other.certs {
            if !self.certs.contains(c) {
                self.certs.push(c.clone());
            }
        }
        for p in &other.ports {
            if !self.ports.contains(p) {
                self.ports.push(*p);
            }
        }
    }
}

/// The hosts a route is reached for on one fleet, each with how.
type Hosts = Vec<(Option<HttpHost>, Via)>;

/// Adds `host` reached `via` to `hosts`.
fn add_host(hosts: &mut Vec<(Option<HttpHost>, Via)>, host: &Option<HttpHost>, via: &Via) {
    match hosts.iter_mut().find(|(h, _)| h == host) {
        Some((_, v)) => v.add(via),
        None => hosts.push((host.clone(), via.clone())),
    }
}

/// A route's spec, of either kind hafleet reads.
enum Spec {
    Http(HttpRouteSpec),
    Tls(TlsRouteSpec),
    Tcp(TcpRouteSpec),
}

impl Spec {
    fn read(route: &DynamicObject, kind: RouteKind) -> Option<Spec> {
        match kind {
            RouteKind::Http => spec_of::<HttpRouteSpec>(route).ok().map(Spec::Http),
            RouteKind::Tls => spec_of::<TlsRouteSpec>(route).ok().map(Spec::Tls),
            RouteKind::Tcp => spec_of::<TcpRouteSpec>(route).ok().map(Spec::Tcp),
        }
    }

    fn kind(&self) -> RouteKind {
        match self {
            Spec::Http(_) => RouteKind::Http,
            Spec::Tls(_) => RouteKind::Tls,
            Spec::Tcp(_) => RouteKind::Tcp,
        }
    }

    fn parent_refs(&self) -> &[ParentRef] {
        match self {
            Spec::Http(s) => &s.parent_refs,
            Spec::Tls(s) => &s.parent_refs,
            Spec::Tcp(s) => &s.parent_refs,
        }
    }

    fn hostnames(&self) -> &[String] {
        match self {
            Spec::Http(s) => &s.hostnames,
            Spec::Tls(s) => &s.hostnames,
            Spec::Tcp(_) => &[],
        }
    }

    /// The routes of its rules for `hosts` (one fleet's).
    fn routes(
        &self,
        (namespace, meta): (&str, &kube::api::ObjectMeta),
        index: &Index,
        sources: (&Services, Option<&Endpoints>, bool),
        hosts: &[(Option<HttpHost>, Via)],
        said: &mut Said,
    ) -> Vec<Route> {
        match self {
            Spec::Http(s) => rules_routes(s, (namespace, meta), index, sources, hosts, said),
            Spec::Tls(s) => {
                let at = (namespace, meta);
                stream_routes(RouteKind::Tls, &s.rules, at, index, sources, hosts, said)
            }
            Spec::Tcp(s) => {
                let at = (namespace, meta);
                stream_routes(RouteKind::Tcp, &s.rules, at, index, sources, hosts, said)
            }
        }
    }
}

/// Resolves HTTPRoute `route` against hafleet's Gateways in `index`: its routes on each fleet
/// whose Gateways it attaches to (each fleet with the hostnames its own listeners allow).
pub fn resolve(
    route: &DynamicObject,
    index: &Index,
    config: Config<'_>,
    services: &Services,
    endpoints: Option<&Endpoints>,
) -> Outcome {
    resolve_kind(RouteKind::Http, route, index, config, (services, endpoints))
}

/// Resolves a route of `kind` ([`resolve`] for an HTTPRoute; a TLSRoute's routes are
/// passthrough routes, by SNI).
pub fn resolve_kind(
    kind: RouteKind,
    route: &DynamicObject,
    index: &Index,
    config: Config<'_>,
    (services, endpoints): (&Services, Option<&Endpoints>),
) -> Outcome {
    let nothing = Outcome { result: Err(Refused::NotSelected), parents: Default::default() };
    let Some(spec) = Spec::read(route, kind) else { return nothing };
    let meta = &route.metadata;
    let namespace = meta.namespace.as_deref().unwrap_or("default");
    let (mut parents, attached) = attach(&spec, namespace, index);
    if parents.is_empty() {
        return nothing;
    }
    // Each fleet's hosts, from the listeners of its Gateways the route attached to. Nothing
    // attached: the rules are still resolved, for the parents' ResolvedRefs.
    let mut fleets: Vec<(FleetName, Hosts)> = Vec::new();
    for a in &attached {
        let at = match fleets.binary_search_by(|(f, _)| f.cmp(&a.fleet)) {
            Ok(i) => i,
            Err(i) => {
                fleets.insert(i, (a.fleet.clone(), Vec::new()));
                i
            }
        };
        for (h, via) in &a.hosts {
            add_host(&mut fleets[at].1, h, via);
        }
    }
    let mut said = Said::default();
    let mut each: Vec<(FleetName, Vec<Route>, Hosts)> = Vec::new();
    match fleets.is_empty() {
        true => {
            let sources = (services, endpoints, false);
            spec.routes((namespace, meta), index, sources, &[], &mut said);
        }
        false => {
            for (fleet, hosts) in fleets {
                let pods = config.pods_fleets.contains(&fleet);
                let sources = (services, endpoints, pods);
                let routes = spec.routes((namespace, meta), index, sources, &hosts, &mut said);
                each.push((fleet, routes, hosts));
            }
        }
    }
    let Said { errors, warnings, unresolved } = said;

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
    for a in &attached {
        parents[a.index].conditions = vec![accepted.clone(), resolved_refs.clone()];
    }
    // A parent that does not take the route still hears whether its references resolve.
    for p in parents.iter_mut().filter(|p| p.conditions.len() == 1) {
        p.conditions.push(resolved_refs.clone());
    }
    if each.is_empty() {
        return Outcome { result: Err(Refused::NotSelected), parents: parents.into() };
    }
    if !errors.is_empty() {
        for a in &attached {
            parents[a.index].listeners.clear();
        }
        return Outcome { result: Err(Refused::Invalid(errors)), parents: parents.into() };
    }
    let name = meta.name.as_deref().unwrap_or_default();
    let Ok(key) = spec.kind().key(namespace, name) else {
        return Outcome { result: Err(Refused::NotSelected), parents: parents.into() };
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
            return Outcome { result: Err(Refused::Invalid(vec![note])), parents: parents.into() };
        }
    };
    let resolved = each
        .into_iter()
        .map(|(fleet, routes, hosts)| {
            let mut r =
                Resolved::of((fleet, key.clone()), meta, routes, warnings.clone(), sharing.clone());
            r.tls_spec = tls_spec(&hosts);
            r
        })
        .collect();
    Outcome { result: Ok(resolved), parents: parents.into() }
}

/// What resolving a route's rules said: why it is refused, its warnings and its backendRefs
/// that do not resolve (reason, message). Each once, however many fleets it was resolved for.
#[derive(Default)]
struct Said {
    errors: Vec<String>,
    warnings: Vec<Warning>,
    unresolved: Vec<(&'static str, String)>,
}

impl Said {
    fn error(&mut self, e: String) {
        if !self.errors.contains(&e) {
            self.errors.push(e);
        }
    }

    /// A rule's backends, what they said taken down (`at`: the rule); `None` when the rule
    /// is not served (the error said).
    fn backends(
        &mut self,
        found: Result<Backends, String>,
        at: &str,
    ) -> Option<Vec<(u32, Backend)>> {
        match found {
            Ok((backends, warned, failed)) => {
                for w in warned {
                    if !self.warnings.contains(&w) {
                        self.warnings.push(w);
                    }
                }
                for (reason, m) in failed {
                    let entry = (reason, format!("{at}: {m}"));
                    if !self.unresolved.contains(&entry) {
                        self.unresolved.push(entry);
                    }
                }
                Some(backends)
            }
            Err(e) => {
                self.error(format!("{at}.backendRefs: {e}"));
                None
            }
        }
    }
}

/// The routes of a TLSRoute's or TCPRoute's rules on one fleet, each to its rule's backends
/// (shared by weight), carried as TCP: for a TLSRoute, each of `hosts` (an SNI, passed
/// through); for a TCPRoute, each port of the TCP listeners it attached to (`hosts`' ports).
/// A host or port goes to the first rule that has it.
fn stream_routes(
    kind: RouteKind,
    rules: &[super::spec::TlsRouteRule],
    (namespace, meta): (&str, &kube::api::ObjectMeta),
    index: &Index,
    (services, endpoints, pods_by_default): (&Services, Option<&Endpoints>, bool),
    hosts: &[(Option<HttpHost>, Via)],
    said: &mut Said,
) -> Vec<Route> {
    let sources = Sources { services, endpoints, pods_by_default };
    // What each route is taken by: a name (TLSRoute; a route without one takes none) or a
    // port (TCPRoute).
    let mut keys: Vec<(Option<HttpHost>, Option<u16>)> = match kind {
        RouteKind::Tcp => {
            hosts.iter().flat_map(|(_, via)| via.ports.iter().map(|p| (None, Some(*p)))).collect()
        }
        _ => hosts.iter().filter_map(|(h, _)| Some((Some(h.clone()?), None))).collect(),
    };
    keys.sort();
    keys.dedup();
    let mut routes: Vec<Route> = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        let at = format!("rules[{i}]");
        let found = backends_of(&rule.backend_refs, kind, namespace, meta, index, &sources);
        let Some(mut backends) = said.backends(found, &at) else { continue };
        for (_, b) in &mut backends {
            b.options.tcp = true;
        }
        let Some(((weight, backend), split)) = backends.split_first() else { continue };
        for (host, port) in &keys {
            if routes.iter().any(|r| r.host == *host && r.tcp_port() == *port) {
                continue;
            }
            let more = RouteMore {
                passthrough: kind == RouteKind::Tls,
                port: *port,
                weight: (!split.is_empty()).then_some(*weight),
                split: split.to_vec(),
                ..Default::default()
            };
            routes.push(Route {
                host: host.clone(),
                path: HttpPath::root(),
                kind: PathKind::Prefix,
                backend: backend.clone(),
                more: Some(Box::new(more)),
            });
        }
    }
    routes
}

/// The routes of `spec`'s rules for `hosts` (one fleet's), with the Services resolved from
/// `sources` (services, endpoints, whether the fleet routes to pods by default).
fn rules_routes(
    spec: &HttpRouteSpec,
    (namespace, meta): (&str, &kube::api::ObjectMeta),
    index: &Index,
    (services, endpoints, pods_by_default): (&Services, Option<&Endpoints>, bool),
    hosts: &[(Option<HttpHost>, Via)],
    said: &mut Said,
) -> Vec<Route> {
    let sources = Sources { services, endpoints, pods_by_default };
    let mut routes: Vec<Route> = Vec::new();
    for (i, rule) in spec.rules.iter().enumerate() {
        let at = format!("rules[{i}]");
        let mut errors = Vec::new();
        let matches = matches_of(rule, &at, &mut errors);
        let filters = matches.as_ref().and_then(|_| super::filters::of(rule, &at, &mut errors));
        errors.into_iter().for_each(|e| said.error(e));
        let (Some(matches), Some(filters)) = (matches, filters) else { continue };
        // A redirect needs no backend: its rule's route gets an empty one.
        let redirects = filters.redirect.is_some() && rule.backend_refs.is_empty();
        let found = match redirects {
            true => {
                let route_name = meta.name.as_deref().unwrap_or_default();
                empty_backend(namespace, route_name, 0).map(|b| (vec![(1, b)], vec![], vec![]))
            }
            false => {
                backends_of(&rule.backend_refs, RouteKind::Http, namespace, meta, index, &sources)
            }
        };
        let Some(backends) = said.backends(found, &at) else { continue };
        for (host, via) in hosts {
            for (path, kind, conditions) in &matches {
                // The rule's filters apply whichever backend takes the request, tied to the
                // match's own path.
                let options = filters.for_route(path, *kind);
                let backends: Vec<(u32, Backend)> = backends
                    .iter()
                    .map(|(weight, backend)| {
                        let mut backend = backend.clone();
                        let own = std::mem::replace(&mut backend.options, options.clone());
                        backend.options.fail_status = own.fail_status;
                        backend.options.send_proxy = own.send_proxy;
                        // A backendRef's own header filters run after the rule's.
                        let o = &mut backend.options;
                        for (rule, own) in [
                            (&mut o.request_headers, &own.request_headers),
                            (&mut o.response_headers, &own.response_headers),
                        ] {
                            if !own.is_empty() {
                                **rule = super::filters::layered(rule, own);
                            }
                        }
                        // Its listeners say which scheme serves it: plain HTTP is never
                        // redirected for a host because it has a certificate.
                        backend.options.ssl_redirect = Some(false);
                        (*weight, backend)
                    })
                    .collect();
                let Some(((weight, backend), split)) = backends.split_first() else { continue };
                let mut more = conditions.clone();
                // Reached through HTTPS listeners only: not served over plain HTTP.
                more.tls = via.tls && !via.plain;
                if !split.is_empty() {
                    more.weight = Some(*weight);
                    more.split = split.to_vec();
                }
                let more = (!more.is_empty()).then(|| Box::new(more));
                // The first rule to claim a host, path, kind and conditions has them, as the
                // spec orders.
                let claimed = routes.iter().any(|r| {
                    &r.host == host
                        && r.kind == *kind
                        && r.path.trimmed() == path.trimmed()
                        && same_conditions(r.more.as_deref(), more.as_deref())
                });
                if !claimed {
                    let (host, path) = (host.clone(), path.clone());
                    let backend = backend.clone();
                    routes.push(Route { host, path, kind: *kind, backend, more });
                }
            }
        }
    }
    routes
}

/// Every parentRef that names one of hafleet's Gateways gets a status; those whose Gateway
/// has a fleet and a listener that takes the route are attached.
fn attach(spec: &Spec, namespace: &str, index: &Index) -> (Vec<ParentStatus>, Vec<Attached>) {
    let kind = spec.kind();
    let mut parents = Vec::new();
    let mut attached = Vec::new();
    for parent in spec.parent_refs().iter().filter(|p| p.is_gateway()) {
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
            .filter(|l| {
                l.refused.is_none() && l.allows(kind, gw_ns, namespace, index.namespaces.as_ref())
            })
            .collect();
        if allowing.is_empty() {
            let message = format!(
                "no listener of Gateway {gw_ns}/{} that hafleet serves allows {}s of \
                 namespace {namespace}",
                parent.name,
                kind.kind()
            );
            status.conditions = refuse("NotAllowedByListeners", message);
            parents.push(status);
            continue;
        }
        let mut hosts = Vec::new();
        for l in allowing {
            let names = spec.hostnames();
            let mine: Vec<Option<String>> = match (names.is_empty(), &l.spec.hostname) {
                (true, listener) => vec![listener.clone()],
                (false, listener) => names
                    .iter()
                    .filter_map(|h| intersect(listener.as_deref(), h).map(Some))
                    .collect(),
            };
            if mine.is_empty() {
                continue;
            }
            status.listeners.push(l.spec.name.clone());
            let is_tls = l.spec.protocol != "HTTP";
            let via = Via {
                plain: !is_tls,
                tls: is_tls,
                certs: l.cert.iter().cloned().collect(),
                ports: (kind == RouteKind::Tcp).then_some(l.spec.port).into_iter().collect(),
            };
            for h in mine {
                // A hostname that is not one (the schema's pattern, if removed) serves nothing.
                let host = match h {
                    None => None,
                    Some(h) => match HttpHost::new(h.as_str()) {
                        Ok(h) => Some(h),
                        Err(_) => continue,
                    },
                };
                add_host(&mut hosts, &host, &via);
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

/// The certificates a route's hosts ask for: each HTTPS listener's Secret for the hosts
/// reached through it (a host-less route gets the fleet's default certificate, if any).
fn tls_spec(hosts: &[(Option<HttpHost>, Via)]) -> Vec<crate::core::tls_secrets::SpecEntry> {
    let mut by_cert: std::collections::BTreeMap<&(String, String), Vec<String>> =
        std::collections::BTreeMap::new();
    for (host, via) in hosts {
        let Some(host) = host else { continue };
        for cert in &via.certs {
            by_cert.entry(cert).or_default().push(host.as_str().to_owned());
        }
    }
    by_cert
        .into_iter()
        .map(|((ns, name), hosts)| crate::core::tls_secrets::SpecEntry {
            hosts,
            secret: Some(name.clone()),
            namespace: Some(ns.clone()),
        })
        .collect()
}

/// Whether two routes ask the same of a request.
fn same_conditions(a: Option<&RouteMore>, b: Option<&RouteMore>) -> bool {
    let conditions = |m: Option<&RouteMore>| {
        m.map(|m| (m.headers.clone(), m.query.clone(), m.method, m.tls)).unwrap_or_default()
    };
    conditions(a) == conditions(b)
}

/// What a rule matches: each match's path, its kind and what else it asks of a request; or
/// `None` (its errors said) when one is not served.
fn matches_of(
    rule: &RouteRule,
    at: &str,
    errors: &mut Vec<String>,
) -> Option<Vec<(HttpPath, PathKind, RouteMore)>> {
    if rule.matches.is_empty() {
        return Some(vec![(HttpPath::root(), PathKind::Prefix, RouteMore::default())]);
    }
    let before = errors.len();
    let mut matches = Vec::new();
    for (j, m) in rule.matches.iter().enumerate() {
        let at = format!("{at}.matches[{j}]");
        let mut more = RouteMore::default();
        // Of two entries for the same header, only the first counts (the spec's rule).
        let mut seen: Vec<String> = Vec::new();
        for (k, h) in m.headers.iter().enumerate() {
            let at = format!("{at}.headers[{k}]");
            let Some(value) = exact(h, &at, errors) else { continue };
            if seen.contains(&h.name.to_ascii_lowercase()) {
                continue;
            }
            seen.push(h.name.to_ascii_lowercase());
            match HeaderName::new(h.name.as_str()) {
                Ok(name) => more.headers.push((name, value)),
                Err(e) => errors.push(format!("{at}.name: {e}")),
            }
        }
        let mut seen: Vec<&str> = Vec::new();
        for (k, q) in m.query_params.iter().enumerate() {
            let at = format!("{at}.queryParams[{k}]");
            let Some(value) = exact(q, &at, errors) else { continue };
            if seen.contains(&q.name.as_str()) {
                continue;
            }
            seen.push(q.name.as_str());
            match ParamName::new(q.name.as_str()) {
                Ok(name) => more.query.push((name, value)),
                Err(e) => errors.push(format!("{at}.name: {e}")),
            }
        }
        if let Some(method) = &m.method {
            match Method::parse(method) {
                Some(method) => more.method = Some(method),
                None => errors.push(format!("{at}.method: {method:?} is not an HTTP method")),
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
            Ok(p) => matches.push((p, kind, more)),
            Err(e) => errors.push(format!("{at}.path.value: {e}")),
        }
    }
    (errors.len() == before).then_some(matches)
}

/// The value an `Exact` header or query match asks for, or `None` (said in `errors`).
fn exact(m: &ValueMatch, at: &str, errors: &mut Vec<String>) -> Option<HeaderValue> {
    match m.type_.as_deref().unwrap_or("Exact") {
        "Exact" => match HeaderValue::new(m.value.as_str()) {
            Ok(v) => Some(v),
            Err(e) => {
                errors.push(format!("{at}.value: {e}"));
                None
            }
        },
        other => {
            errors.push(format!("{at}.type: {other} is not served by hafleet (Exact is)"));
            None
        }
    }
}

/// What a rule's backends resolve to.
type Backends = (Vec<(u32, Backend)>, Vec<Warning>, Vec<(&'static str, String)>);

/// A rule's backends with their weights (none of weight 0), what to tell, and the ones that
/// cannot be resolved (reason, message): each of those answers its share of the requests with
/// 500, as does a rule without backends. `Err`: not served.
fn backends_of(
    refs: &[BackendRef],
    kind: RouteKind,
    namespace: &str,
    meta: &kube::api::ObjectMeta,
    index: &Index,
    sources: &Sources<'_>,
) -> Result<Backends, String> {
    let mut backends = Vec::new();
    let mut said = Vec::new();
    let mut failed = Vec::new();
    for r in refs.iter().filter(|r| r.weight != Some(0)) {
        let weight = u32::try_from(r.weight.unwrap_or(1))
            .map_err(|_| format!("backendRef {}: a weight is not negative", r.name))?;
        match backend_of(r, kind, namespace, index, sources)? {
            Ok((backend, warnings)) => {
                said.extend(warnings);
                backends.push((weight, backend));
            }
            Err((reason, message, backend)) => {
                failed.push((reason, message));
                backends.push((weight, backend));
            }
        }
    }
    if backends.is_empty() {
        let route = meta.name.as_deref().unwrap_or_default();
        let mut b = empty_backend(namespace, route, 0)?;
        b.options.fail_status = Some(FailStatus::InternalError);
        // Nothing to resolve, nothing unresolved: the rule answers 500, as the spec says.
        backends.push((1, b));
    }
    Ok((backends, said, failed))
}

/// A backendRef's backend: `Ok(Ok(..))` resolved (with what to tell), `Ok(Err((reason,
/// message, backend)))` not resolvable (the backend answers 500), `Err` not served.
#[allow(clippy::type_complexity)]
fn backend_of(
    r: &BackendRef,
    kind: RouteKind,
    namespace: &str,
    index: &Index,
    sources: &Sources<'_>,
) -> Result<Result<(Backend, Vec<Warning>), (&'static str, String, Backend)>, String> {
    let failing = |ns: &str, name: &str, port: u16| -> Result<Backend, String> {
        let mut b = empty_backend(ns, name, port)?;
        b.options.fail_status = Some(FailStatus::InternalError);
        Ok(b)
    };
    let (request_headers, response_headers) = super::filters::backend_ref_headers(&r.filters)
        .map_err(|e| format!("backendRef {}: {e}", r.name))?;
    let ns = r.namespace.as_deref().unwrap_or(namespace);
    let port = r.port.unwrap_or(0);
    if !r.is_service() {
        let kind = r.kind.as_deref().unwrap_or("Service");
        let message = format!("backendRef {}: kind {kind} is not a Service", r.name);
        return Ok(Err(("InvalidKind", message, failing(namespace, &r.name, 0)?)));
    }
    if ns != namespace && !index.grants_service(kind, namespace, ns, &r.name) {
        let message = format!(
            "backendRef {ns}/{}: no ReferenceGrant in namespace {ns} lets {}s of namespace \
             {namespace} name it",
            r.name,
            kind.kind()
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
    let mut backend = crate::core::resolve::backend(ns, &ingress_backend, sources, &mut said)?;
    // Its own filters: its requests and answers only (layered over its rule's, below).
    backend.options.request_headers = Box::new(request_headers);
    backend.options.response_headers = Box::new(response_headers);
    Ok(Ok((backend, said)))
}

/// A backend of Service `ns/name` port `port` with no servers.
fn empty_backend(ns: &str, name: &str, port: u16) -> Result<Backend, String> {
    let namespace = Namespace::new(ns).map_err(|e| e.to_string())?;
    let name = ObjectName::new(name).map_err(|e| e.to_string())?;
    Ok(crate::core::resolve::serverless(ServiceRef { namespace, name, port, cluster: None }))
}
