//! The Gateway API, read into the same routes as Ingresses. Pure: GatewayClasses, Gateways,
//! HTTPRoutes and ReferenceGrants in (as the watch caches hold them), each HTTPRoute's routes
//! for its fleet and the status of every object hafleet answers for out.
//!
//! ```text
//! GatewayClass (spec.controllerName: hafleet.io/gateway-controller) ── ours
//!   └─ Gateway (gatewayClassName: ours, annotation hafleet.io/fleet) ── a fleet's listeners
//!        └─ HTTPRoute (parentRefs: the Gateway, a listener that allows it) ── routes
//!             └─ backendRefs: Services (in another namespace: a ReferenceGrant there)
//! ```
//! An HTTPRoute becomes a [`crate::core::model::Resolved`] keyed as an HTTPRoute
//! ([`hafleet_proto::IngressKey::http_route`]), so the rest of the pass (the tenancy
//! policy, budgets, host ownership across Ingresses and HTTPRoutes, publishing) is the
//! Ingresses' own.

pub mod filters;
pub mod memo;
pub mod route;
pub mod spec;
pub mod status;

#[cfg(test)]
mod tests;

use crate::core::resolve::FLEET_ANNOTATION;
use hafleet_proto::FleetName;
use kube::api::{ApiResource, DynamicObject};
use spec::{GROUP, GatewayClassSpec, GatewaySpec, Listener, ReferenceGrantSpec, spec_of};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// The `spec.controllerName` of the GatewayClasses hafleet serves.
pub const CONTROLLER_NAME: &str = "hafleet.io/gateway-controller";

/// The kinds hafleet reads, as the API serves them.
pub fn api_resource(kind: &str) -> ApiResource {
    let plural = match kind {
        "GatewayClass" => "gatewayclasses",
        "Gateway" => "gateways",
        "HTTPRoute" => "httproutes",
        "TLSRoute" => "tlsroutes",
        "TCPRoute" => "tcproutes",
        "ReferenceGrant" => "referencegrants",
        other => panic!("not a Gateway API kind hafleet reads: {other}"),
    };
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// What the watch caches hold of the Gateway API.
#[derive(Default)]
pub struct Objects<'a> {
    pub classes: &'a [Arc<DynamicObject>],
    pub gateways: &'a [Arc<DynamicObject>],
    pub routes: &'a [Arc<DynamicObject>],
    /// TLSRoutes, where the API server serves them.
    pub tls_routes: &'a [Arc<DynamicObject>],
    /// TCPRoutes, where the API server serves them.
    pub tcp_routes: &'a [Arc<DynamicObject>],
    pub grants: &'a [Arc<DynamicObject>],
    /// Each namespace's labels (for listeners that select namespaces); `None`: not read.
    pub namespaces: Option<&'a NamespaceLabels>,
}

/// Namespaces' labels, by name.
pub type NamespaceLabels = HashMap<String, std::collections::BTreeMap<String, String>>;

/// One of hafleet's Gateways, read.
#[derive(Debug, Clone)]
pub struct GatewayView {
    pub object: Arc<DynamicObject>,
    /// Its fleet, or why it has none.
    pub fleet: Result<FleetName, String>,
    pub listeners: Vec<ListenerView>,
}

/// A listener and whether hafleet serves it.
#[derive(Debug, Clone)]
pub struct ListenerView {
    pub spec: Listener,
    /// Why it is not served: (reason, message). `None`: served.
    pub refused: Option<(&'static str, String)>,
    /// An HTTPS listener's certificate: the Secret (namespace, name) of its first
    /// `certificateRefs` entry, when that entry may be used.
    pub cert: Option<(String, String)>,
    /// Why its certificate reference does not resolve: (reason, message) for its
    /// `ResolvedRefs` condition.
    pub unresolved: Option<(&'static str, String)>,
}

/// The kinds of route hafleet reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteKind {
    Http,
    /// A TLSRoute: TLS connections passed through by their SNI.
    Tls,
    /// A TCPRoute: every connection to a listener's port.
    Tcp,
}

impl RouteKind {
    /// Its Kubernetes kind.
    pub fn kind(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Tls => "TLSRoute",
            RouteKind::Tcp => "TCPRoute",
        }
    }

    /// The key of route `namespace/name` of this kind.
    pub fn key(
        self,
        namespace: &str,
        name: &str,
    ) -> Result<hafleet_proto::IngressKey, hafleet_proto::InvalidValue> {
        match self {
            RouteKind::Http => hafleet_proto::IngressKey::http_route(namespace, name),
            RouteKind::Tls => hafleet_proto::IngressKey::tls_route(namespace, name),
            RouteKind::Tcp => hafleet_proto::IngressKey::tcp_route(namespace, name),
        }
    }

    /// The kind of route a listener of `protocol` takes, if any.
    pub fn of_protocol(protocol: &str) -> Option<RouteKind> {
        match protocol {
            "HTTP" | "HTTPS" => Some(RouteKind::Http),
            "TLS" => Some(RouteKind::Tls),
            "TCP" => Some(RouteKind::Tcp),
            _ => None,
        }
    }
}

impl ListenerView {
    /// Whether it lets a route of `kind` from namespace `route_ns` attach, on a Gateway of
    /// namespace `gateway_ns` (`labels`: every namespace's, for a selector): its protocol
    /// takes that kind, and its `allowedRoutes` allow it.
    pub fn allows(
        &self,
        kind: RouteKind,
        gateway_ns: &str,
        route_ns: &str,
        labels: Option<&NamespaceLabels>,
    ) -> bool {
        let allowed = self.spec.allowed_routes.as_ref();
        let kinds = allowed.map(|a| a.kinds.as_slice()).unwrap_or_default();
        let kind_ok = RouteKind::of_protocol(&self.spec.protocol) == Some(kind)
            && (kinds.is_empty()
                || kinds.iter().any(|k| {
                    k.kind == kind.kind() && k.group.as_deref().unwrap_or(GROUP) == GROUP
                }));
        let namespaces = allowed.and_then(|a| a.namespaces.as_ref());
        let ns_ok = match namespaces.and_then(|n| n.from.as_deref()).unwrap_or("Same") {
            "All" => true,
            "Same" => gateway_ns == route_ns,
            "Selector" => {
                let of = labels.and_then(|l| l.get(route_ns));
                match (namespaces.and_then(|n| n.selector.as_ref()), of) {
                    (Some(selector), Some(of)) => selects(selector, of),
                    _ => false,
                }
            }
            _ => false,
        };
        kind_ok && ns_ok
    }
}

/// The Gateway API objects of a pass, indexed: hafleet's classes and Gateways, and the
/// ReferenceGrants.
#[derive(Debug, Default)]
pub struct Index {
    /// The names of the GatewayClasses whose controller is hafleet.
    pub classes: BTreeSet<String>,
    /// Each namespace's labels, where listeners select namespaces.
    pub namespaces: Option<NamespaceLabels>,
    /// hafleet's Gateways by (namespace, name).
    pub gateways: HashMap<(String, String), GatewayView>,
    /// Every ReferenceGrant: (its namespace, what it grants).
    grants: Vec<(String, ReferenceGrantSpec)>,
}

impl Index {
    pub fn new(objects: &Objects<'_>) -> Index {
        let classes: BTreeSet<String> = objects
            .classes
            .iter()
            .filter(|c| is_ours(c))
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        let grants: Vec<(String, ReferenceGrantSpec)> = objects
            .grants
            .iter()
            .filter_map(|g| {
                let ns = g.metadata.namespace.clone()?;
                Some((ns, spec_of::<ReferenceGrantSpec>(g).ok()?))
            })
            .collect();
        let mut gateways = HashMap::new();
        for gw in objects.gateways {
            let Ok(spec) = spec_of::<GatewaySpec>(gw) else { continue };
            if !classes.contains(&spec.gateway_class_name) {
                continue;
            }
            let (Some(ns), Some(name)) = (&gw.metadata.namespace, &gw.metadata.name) else {
                continue;
            };
            let fleet = match gw.metadata.annotations.as_ref().and_then(|a| a.get(FLEET_ANNOTATION))
            {
                None => Err(format!("it has no {FLEET_ANNOTATION} annotation naming its fleet")),
                Some(f) => FleetName::new(f.as_str())
                    .map_err(|e| format!("annotation {FLEET_ANNOTATION}: {e}")),
            };
            let listeners = spec.listeners.into_iter().map(|l| listener_view(l, ns, &grants));
            let view = GatewayView { object: gw.clone(), fleet, listeners: listeners.collect() };
            gateways.insert((ns.clone(), name.clone()), view);
        }
        refuse_tcp_ports_taken(&mut gateways);
        Index { classes, gateways, grants, namespaces: objects.namespaces.cloned() }
    }

    /// Whether a ReferenceGrant in `to_ns` lets routes of `kind` in `from_ns` name Service
    /// `name`.
    pub fn grants_service(&self, kind: RouteKind, from_ns: &str, to_ns: &str, name: &str) -> bool {
        grants(&self.grants, (kind.kind(), from_ns), ("Service", to_ns, name))
    }

    /// The Secrets (namespace, name) that HTTPS listeners of Gateways on fleets `sealed_for`
    /// name.
    pub fn listener_secrets(
        &self,
        sealed_for: impl Fn(&FleetName) -> bool,
    ) -> impl Iterator<Item = (String, String)> {
        self.gateways
            .values()
            .filter(move |g| g.fleet.as_ref().is_ok_and(&sealed_for))
            .flat_map(|g| g.listeners.iter().filter_map(|l| l.cert.clone()))
    }
}

/// Whether a ReferenceGrant in `to_ns` lets objects of kind `from_kind` in `from_ns` name the
/// core object `to_kind` `name` there.
fn grants(
    all: &[(String, ReferenceGrantSpec)],
    (from_kind, from_ns): (&str, &str),
    (to_kind, to_ns, name): (&str, &str, &str),
) -> bool {
    all.iter().filter(|(ns, _)| ns == to_ns).any(|(_, g)| {
        g.from.iter().any(|f| f.group == GROUP && f.kind == from_kind && f.namespace == from_ns)
            && g.to.iter().any(|t| {
                t.group.is_empty()
                    && t.kind == to_kind
                    && t.name.as_deref().is_none_or(|n| n == name)
            })
    })
}

/// Whether a GatewayClass is hafleet's.
pub fn is_ours(class: &DynamicObject) -> bool {
    spec_of::<GatewayClassSpec>(class).is_ok_and(|s| s.controller_name == CONTROLLER_NAME)
}

/// The reason a TCP listener is refused when its port is another protocol's on its fleet.
pub const PORT_UNAVAILABLE: &str = "PortUnavailable";

/// Refuses each TCP listener whose port an HTTP, HTTPS or TLS listener of a Gateway on the
/// same fleet serves, or that is 80 or 443 (the hosts' HTTP and HTTPS binds unless their
/// environment says otherwise): those are the fleet's HTTP and HTTPS binds, and a TCP
/// listener's port is bound on each host by a frontend of its own, so both on one port would
/// fail the hosts' reload, for every route of the fleet.
fn refuse_tcp_ports_taken(gateways: &mut HashMap<(String, String), GatewayView>) {
    let mut taken: HashMap<(&FleetName, u16), String> = HashMap::new();
    let mut keys: Vec<&(String, String)> = gateways.keys().collect();
    keys.sort();
    for key in keys {
        let g = &gateways[key];
        let Ok(fleet) = &g.fleet else { continue };
        for l in g.listeners.iter().filter(|l| l.refused.is_none() && l.spec.protocol != "TCP") {
            let by = format!(
                "listener {} ({}) of Gateway {}/{}",
                l.spec.name, l.spec.protocol, key.0, key.1
            );
            taken.entry((fleet, l.spec.port)).or_insert(by);
        }
    }
    let refusals: Vec<((String, String), usize, String)> = gateways
        .iter()
        .filter_map(|(key, g)| Some((key, g, g.fleet.as_ref().ok()?)))
        .flat_map(|(key, g, fleet)| {
            let taken = &taken;
            g.listeners.iter().enumerate().filter_map(move |(i, l)| {
                if l.refused.is_some() || l.spec.protocol != "TCP" {
                    return None;
                }
                let port = l.spec.port;
                let why = match (port, taken.get(&(fleet, port))) {
                    (_, Some(by)) => format!(
                        "port {port} is fleet {fleet}'s HTTP or HTTPS bind ({by} serves it); a \
                         TCP listener needs a port of its own"
                    ),
                    // What the hosts bind unless $HAFLEET_HTTP_BIND or $HAFLEET_HTTPS_BIND
                    // say otherwise, which the watcher cannot see.
                    (80 | 443, None) => format!(
                        "port {port} is where the hosts of fleet {fleet} bind HTTP or HTTPS by \
                         default; a TCP listener needs a port of its own"
                    ),
                    _ => return None,
                };
                Some((key.clone(), i, why))
            })
        })
        .collect();
    for (key, i, why) in refusals {
        if let Some(l) = gateways.get_mut(&key).and_then(|g| g.listeners.get_mut(i)) {
            l.refused = Some((PORT_UNAVAILABLE, why));
        }
    }
}

/// A listener of a Gateway in `gateway_ns`, read: whether hafleet serves it, and an HTTPS
/// listener's certificate (its first `certificateRefs` entry: a Secret, in another namespace
/// only with a ReferenceGrant there).
fn listener_view(
    spec: Listener,
    gateway_ns: &str,
    all_grants: &[(String, ReferenceGrantSpec)],
) -> ListenerView {
    let mut cert = None;
    let mut unresolved = None;
    let refused = match (spec.protocol.as_str(), &spec.tls) {
        ("HTTP", _) => None,
        ("HTTPS", Some(tls)) if tls.mode.as_deref().is_some_and(|m| m != "Terminate") => Some((
            "UnsupportedValue",
            format!("tls.mode {:?} is not served by hafleet (Terminate is)", tls.mode),
        )),
        // TLS passed through by its SNI (a TLSRoute's); hafleet does not terminate TLS for
        // TLSRoutes.
        ("TLS", Some(tls)) if tls.mode.as_deref() == Some("Passthrough") => None,
        // Every connection to its port, on $HAFLEET_TCP_ADDR of each host (a TCPRoute's).
        ("TCP", _) => None,
        ("TLS", _) => Some((
            "UnsupportedValue",
            "a TLS listener is served with tls.mode Passthrough only (TLSRoutes are passed \
             through by their SNI, not terminated)"
                .to_owned(),
        )),
        ("HTTPS", tls) => {
            match tls.as_ref().and_then(|t| t.certificate_refs.first()) {
                None => {
                    let why = "an HTTPS listener needs tls.certificateRefs";
                    unresolved = Some(("InvalidCertificateRef", why.to_owned()));
                }
                Some(r) => match certificate(r, gateway_ns, all_grants) {
                    Ok(secret) => cert = Some(secret),
                    Err(why) => unresolved = Some(why),
                },
            }
            None
        }
        (other, _) => Some((
            "UnsupportedProtocol",
            format!("protocol {other:?} is not served by hafleet (HTTP, HTTPS, TLS and TCP are)"),
        )),
    };
    let namespaces = spec.allowed_routes.as_ref().and_then(|a| a.namespaces.as_ref());
    let refused = refused.or_else(|| match namespaces {
        Some(n) if n.from.as_deref() == Some("Selector") && n.selector.is_none() => {
            let why = "allowedRoutes.namespaces.from: Selector needs a selector";
            Some(("UnsupportedValue", why.to_owned()))
        }
        Some(n) if !matches!(n.from.as_deref(), None | Some("Same" | "All" | "Selector")) => {
            Some(("UnsupportedValue", format!("allowedRoutes.namespaces.from: {:?}", n.from)))
        }
        _ => None,
    });
    ListenerView { spec, refused, cert, unresolved }
}

/// The Secret (namespace, name) a listener's `certificateRefs` entry names, or why it may not
/// be used: (reason, message).
fn certificate(
    r: &spec::SecretRef,
    gateway_ns: &str,
    all_grants: &[(String, ReferenceGrantSpec)],
) -> Result<(String, String), (&'static str, String)> {
    let kind = r.kind.as_deref().unwrap_or("Secret");
    if !r.group.is_empty() || kind != "Secret" {
        let group = if r.group.is_empty() { "core" } else { r.group.as_str() };
        let why = format!("certificateRefs[0]: {kind} of group {group} is not a Secret");
        return Err(("InvalidCertificateRef", why));
    }
    let ns = r.namespace.as_deref().unwrap_or(gateway_ns);
    if ns != gateway_ns && !grants(all_grants, ("Gateway", gateway_ns), ("Secret", ns, &r.name)) {
        let why = format!(
            "certificateRefs[0]: Secret {ns}/{}: no ReferenceGrant in namespace {ns} lets \
             Gateways of namespace {gateway_ns} name it",
            r.name
        );
        return Err(("RefNotPermitted", why));
    }
    Ok((ns.to_owned(), r.name.clone()))
}

/// Whether `labels` meet `selector` (`matchLabels` and `matchExpressions` `In`, `NotIn`,
/// `Exists`, `DoesNotExist`, all of them). An operator it does not know selects nothing.
pub fn selects(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let by_labels = selector.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        match (e.operator.as_str(), labels.get(&e.key)) {
            ("In", Some(v)) => values.contains(v),
            ("In", None) => false,
            ("NotIn", Some(v)) => !values.contains(v),
            ("NotIn", None) => true,
            ("Exists", found) => found.is_some(),
            ("DoesNotExist", found) => found.is_none(),
            _ => false,
        }
    });
    by_labels && by_expressions
}

/// The hostname a listener's `hostname` and a route's hostname both match, if any: the more
/// specific of the two (a wildcard `*.example.com` matches names under `example.com`, not
/// `example.com` itself).
pub fn intersect(listener: Option<&str>, route: &str) -> Option<String> {
    let Some(l) = listener else { return Some(route.to_owned()) };
    if l == route {
        return Some(route.to_owned());
    }
    if let Some(suffix) = l.strip_prefix('*')
        && route.ends_with(suffix)
    {
        return Some(route.to_owned());
    }
    if let Some(suffix) = route.strip_prefix('*')
        && l.ends_with(suffix)
    {
        return Some(l.to_owned());
    }
    None
}
