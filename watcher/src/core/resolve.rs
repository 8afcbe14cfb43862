//! From Kubernetes objects to a fleet's routes. Pure: Ingress, Services and Nodes in, a
//! validated [`Resolved`] or the reasons it was refused out.
//!
//! Routes go to Ready nodes' InternalIP at the Service's NodePort (kube-proxy takes it from
//! there). A route names the NodePort; the nodes are resolved apart ([`ready_nodes`]) and
//! published once for every route. A Service that does not exist, or that has no NodePort
//! for the port (not NodePort or LoadBalancer, the port or its nodePort gone), resolves to no
//! NodePort: HAProxy answers 503 until that is fixed, and the route never stays on a NodePort
//! Kubernetes may have given to another Service.

use crate::core::model::{Resolved, Warning};
use hafleet_proto::{
    Backend, FleetName, HttpHost, HttpPath, IngressKey, Namespace, NodeAddr, ObjectName, PathKind,
    PathRewrite, Route, ServiceRef, TrafficPolicy,
};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};
use kube::api::DynamicObject;
use serde::Deserialize as _;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

/// The annotation that puts an Ingress on a fleet.
pub const FLEET_ANNOTATION: &str = "hafleet.io/fleet";
/// The ingress class annotation of Ingresses older than `spec.ingressClassName`.
pub const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
/// Nodes with this label get no traffic from hafleet, as from any Kubernetes load balancer.
pub const EXCLUDE_FROM_LB_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// Why an Ingress is not routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Not for hafleet (no fleet annotation, or another ingress class): nothing to say.
    NotSelected,
    /// Meant for hafleet but wrong: say so on the Ingress.
    Invalid(Vec<String>),
}

/// Services by (namespace, name), shared with the watch cache (never copied). Hashed: a pass
/// looks up every Ingress's Services, and a B-tree's string comparisons were most of a pass
/// over 10,000 Ingresses in a profile of the running watcher.
pub type Services = HashMap<(String, String), std::sync::Arc<Service>, foldhash::fast::RandomState>;

/// For each Service (namespace, name): the nodes that run a ready endpoint of it, by name.
pub type EndpointNodes = HashMap<(String, String), BTreeSet<String>>;

/// What the EndpointSlices say, where the API server serves them.
#[derive(Debug, Default)]
pub struct Endpoints {
    /// Of `Local` Services: the nodes with a ready endpoint ([`endpoints`]).
    pub nodes: EndpointNodes,
    /// Of Services in pods mode: their slices ([`crate::core::pods::SliceCache`]).
    pub pods: crate::core::pods::PodSlices,
}

/// The watcher's settings that resolving depends on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Config<'a> {
    /// `--ingress-class`: only Ingresses of this class.
    pub ingress_class: Option<&'a str>,
    /// `--endpoints FLEET=pods`: fleets whose Services go to their pods unless a Service's
    /// `hafleet.io/endpoints` says `nodes`.
    pub pods_fleets: &'a [FleetName],
}

/// The label that names a Service on its EndpointSlices.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// One endpoint of an EndpointSlice, as `discovery.k8s.io/v1` and `v1beta1` both write it.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SliceEndpoint {
    #[serde(default)]
    conditions: Option<SliceConditions>,
    /// v1, and v1beta1 from Kubernetes 1.20 when its feature gate is on.
    #[serde(default)]
    node_name: Option<String>,
    /// v1beta1: the node's `kubernetes.io/hostname` label under that key.
    #[serde(default)]
    topology: Option<BTreeMap<String, String>>,
}

#[derive(serde::Deserialize)]
struct SliceConditions {
    #[serde(default)]
    ready: Option<bool>,
}

/// The Service (namespace, name) an EndpointSlice belongs to, by its
/// `kubernetes.io/service-name` label.
pub fn slice_service(slice: &DynamicObject) -> Option<(&String, &String)> {
    Some((
        slice.metadata.namespace.as_ref()?,
        slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?,
    ))
}

/// Whether a Service forwards only on nodes with an endpoint (`externalTrafficPolicy: Local`).
pub fn is_local(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local")
}

/// The nodes with a ready endpoint of each Service, from its EndpointSlices (of either API
/// version). An endpoint whose `ready` condition is absent counts as ready, as Kubernetes
/// defines it. Its node is its `nodeName`, else the node whose `kubernetes.io/hostname`
/// label its v1beta1 topology names (that label's value, when no node carries it); an
/// endpoint on no node (outside the cluster) serves no NodePort. Slices that do not parse are
/// skipped, not fatal: they are the API server's, not a user's, to get right.
pub fn endpoints<'a>(
    slices: impl IntoIterator<Item = &'a DynamicObject>,
    nodes: impl IntoIterator<Item = &'a Node>,
) -> EndpointNodes {
    let by_hostname: HashMap<&str, &str> = nodes
        .into_iter()
        .filter_map(|n| {
            let hostname = n.metadata.labels.as_ref()?.get(HOSTNAME_LABEL)?;
            Some((hostname.as_str(), n.metadata.name.as_deref()?))
        })
        .collect();
    let mut out = EndpointNodes::new();
    for slice in slices {
        let Some((ns, service)) = slice_service(slice) else { continue };
        let listed = match slice.data.get("endpoints") {
            None | Some(serde_json::Value::Null) => vec![],
            Some(list) => match Vec::<SliceEndpoint>::deserialize(list) {
                Ok(list) => list,
                Err(_) => continue,
            },
        };
        let nodes = out.entry((ns.clone(), service.clone())).or_default();
        for e in listed {
            if !e.conditions.and_then(|c| c.ready).unwrap_or(true) {
                continue;
            }
            let node = e.node_name.or_else(|| {
                let hostname = e.topology?.remove(HOSTNAME_LABEL)?;
                Some(by_hostname.get(hostname.as_str()).map_or(hostname, |n| (*n).to_owned()))
            });
            if let Some(node) = node {
                nodes.insert(node);
            }
        }
    }
    out
}

/// Decides whether `ingress` is hafleet's and resolves it.
pub fn resolve(
    ingress: &Ingress,
    config: Config<'_>,
    services: &Services,
    endpoints: Option<&Endpoints>,
) -> Result<Resolved, Refused> {
    let meta = &ingress.metadata;
    let annotations = meta.annotations.as_ref();
    let Some(fleet) = annotations.and_then(|a| a.get(FLEET_ANNOTATION)) else {
        return Err(Refused::NotSelected);
    };
    if let Some(want) = config.ingress_class {
        let class =
            ingress.spec.as_ref().and_then(|s| s.ingress_class_name.as_deref()).or_else(|| {
                annotations.and_then(|a| a.get(LEGACY_CLASS_ANNOTATION)).map(|s| s.as_str())
            });
        if class != Some(want) {
            return Err(Refused::NotSelected);
        }
    }

    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let fleet = FleetName::new(fleet.as_str())
        .map_err(|e| errors.push(format!("annotation {FLEET_ANNOTATION}: {e}")))
        .ok();
    let namespace = meta.namespace.as_deref().unwrap_or("default");
    let pods_by_default = fleet.as_ref().is_some_and(|f| config.pods_fleets.contains(f));
    let sources = Sources { services, endpoints, pods_by_default };
    let key = IngressKey::new(namespace, meta.name.as_deref().unwrap_or_default())
        .map_err(|e| errors.push(e.to_string()))
        .ok();

    let settings = crate::core::annotations::read(annotations).unwrap_or_else(|why| {
        errors.extend(why);
        Default::default()
    });

    let mut routes = Vec::new();
    let spec = ingress.spec.as_ref();
    let rules = spec.and_then(|s| s.rules.as_deref()).unwrap_or_default();
    for (i, rule) in rules.iter().enumerate() {
        let host = match rule.host.as_deref() {
            None | Some("") => None,
            Some(h) => match HttpHost::new(h) {
                Ok(h) => Some(h),
                Err(e) => {
                    errors.push(format!("rules[{i}].host: {e}"));
                    continue;
                }
            },
        };
        let paths = rule.http.as_ref().map(|h| h.paths.as_slice()).unwrap_or_default();
        for (j, p) in paths.iter().enumerate() {
            let at = format!("rules[{i}].http.paths[{j}]");
            let path = match HttpPath::new(p.path.as_deref().unwrap_or("/")) {
                Ok(path) => path,
                Err(e) => {
                    errors.push(format!("{at}.path: {e}"));
                    continue;
                }
            };
            let kind = match PathKind::from_k8s(&p.path_type) {
                Ok(k) => k,
                Err(e) => {
                    errors.push(format!("{at}.pathType: {e}"));
                    continue;
                }
            };
            match backend(namespace, &p.backend, &sources, &mut warnings) {
                Ok(backend) => {
                    routes.push(Route { host: host.clone(), path, kind, backend, more: None })
                }
                Err(e) => errors.push(format!("{at}.backend: {e}")),
            }
        }
    }
    if let Some(default) = spec.and_then(|s| s.default_backend.as_ref()) {
        match backend(namespace, default, &sources, &mut warnings) {
            Ok(backend) => routes.push(Route {
                host: None,
                path: HttpPath::root(),
                kind: PathKind::Prefix,
                backend,
                more: None,
            }),
            Err(e) => errors.push(format!("defaultBackend: {e}")),
        }
    }

    for route in &mut routes {
        // The Service's, not the Ingress's.
        let send_proxy = route.backend.options.send_proxy;
        route.backend.options = settings.options.clone();
        route.backend.options.send_proxy = send_proxy;
        // A rewrite replaces the route's own path: routes with other paths are other backends.
        route.backend.options.rewrite = settings.rewrite_to.as_ref().map(|to| {
            Box::new(PathRewrite {
                from: route.path.trimmed(),
                to: to.clone(),
                exact: route.kind == PathKind::Exact,
            })
        });
    }
    match (fleet, key) {
        (Some(fleet), Some(key)) if errors.is_empty() => {
            Ok(Resolved::of((fleet, key), meta, routes, warnings, settings.sharing))
        }
        _ => Err(Refused::Invalid(errors)),
    }
}

/// Each Ingress's last resolution, reused on the next pass while nothing it was resolved from
/// changed: the same Ingress object, and the same objects (or absence) for every Service it
/// names, with the same endpoint nodes. The watch caches replace an object on every change and
/// keep it otherwise, so "the same" is the same `Arc`: a pass over 10,000 Ingresses resolves
/// only those whose inputs changed (see BENCHMARKS.md). One `Memo` serves one [`Config`]
/// and one source of endpoints, as a watcher has.
#[derive(Default)]
pub struct Memo {
    /// By the Ingress's uid ([`memo_key`]): the object a status write replaced is found again.
    entries: HashMap<String, Memoized, foldhash::fast::RandomState>,
    /// The pass under way: entries not resolved in it are forgotten at its end.
    pass: u64,
    /// How many Ingresses this pass resolved anew.
    fresh: usize,
    /// The HTTPRoutes' own, beside.
    pub routes: crate::core::gateway::memo::RouteMemo,
}

/// A Service an Ingress names: (namespace, name), the object (none: missing), its endpoint
/// nodes and its slices in pods mode.
pub(crate) type NamedService = (
    (String, String),
    Option<std::sync::Arc<Service>>,
    Option<BTreeSet<String>>,
    Option<Vec<std::sync::Arc<crate::core::pods::SliceView>>>,
);

struct Memoized {
    ingress: std::sync::Arc<Ingress>,
    /// Each Service the Ingress names, as it was resolved with.
    named: Vec<NamedService>,
    result: Result<Resolved, Refused>,
    /// The last pass that asked for it.
    pass: u64,
}

impl Memo {
    /// [`resolve`], or the same answer as last pass when its inputs have not changed.
    pub fn resolve(
        &mut self,
        ingress: &std::sync::Arc<Ingress>,
        config: Config<'_>,
        services: &Services,
        endpoints: Option<&Endpoints>,
    ) -> Result<Resolved, Refused> {
        let still = |m: &Memoized| {
            (std::sync::Arc::ptr_eq(&m.ingress, ingress)
                || same_but_status(&m.ingress.metadata, &ingress.metadata))
                && unchanged(&m.named, services, endpoints)
        };
        let key = memo_key(&ingress.metadata, std::sync::Arc::as_ptr(ingress) as usize);
        let pass = self.pass;
        match self.entries.get_mut(key.as_ref()) {
            Some(m) if still(m) => {
                // A status write gives the Ingress a new object: kept, so the next pass finds
                // it the same by address.
                m.ingress = ingress.clone();
                m.pass = pass;
                m.result.clone()
            }
            _ => {
                let named = named_now(named_services(ingress), services, endpoints);
                let result = resolve(ingress, config, services, endpoints);
                self.fresh += 1;
                let m = Memoized { ingress: ingress.clone(), named, result: result.clone(), pass };
                self.entries.insert(key.into_owned(), m);
                result
            }
        }
    }

    /// Starts a pass: what is not resolved again before [`Memo::end_pass`] is forgotten.
    pub fn begin_pass(&mut self) {
        self.pass += 1;
        self.fresh = 0;
    }

    /// How many Ingresses the pass under way (or the last) resolved anew, not from memory.
    pub fn fresh(&self) -> usize {
        self.fresh
    }

    /// Forgets the Ingresses the pass did not resolve (deleted, or replaced by a newer object).
    pub fn end_pass(&mut self) {
        let pass = self.pass;
        self.entries.retain(|_, m| m.pass == pass);
    }

    /// How many Ingresses are remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Each of `keys` as `services` and `endpoints` have it now.
pub(crate) fn named_now(
    keys: Vec<(String, String)>,
    services: &Services,
    endpoints: Option<&Endpoints>,
) -> Vec<NamedService> {
    keys.into_iter()
        .map(|key| {
            let service = services.get(&key).cloned();
            let nodes = endpoints.and_then(|e| e.nodes.get(&key)).cloned();
            let pods = endpoints.and_then(|e| e.pods.get(&key)).cloned();
            (key, service, nodes, pods)
        })
        .collect()
}

/// What a memo keeps an object's resolution by: its uid, else (objects made without one) the
/// address `at` of the object.
pub(crate) fn memo_key(meta: &kube::api::ObjectMeta, at: usize) -> std::borrow::Cow<'_, str> {
    match meta.uid.as_deref() {
        Some(uid) => std::borrow::Cow::Borrowed(uid),
        None => std::borrow::Cow::Owned(format!("@{at:x}")),
    }
}

/// Whether an object whose metadata is now `now` was `then` with only its status (or its
/// resourceVersion, managed fields) changed: the same spec (generation), labels,
/// annotations, creation and deletion. What hafleet writes of an Ingress or a route is its
/// status: it resolves as before, and the routes of its last resolution stay shared with
/// what was published, not compared with it at every pass.
pub(crate) fn same_but_status(then: &kube::api::ObjectMeta, now: &kube::api::ObjectMeta) -> bool {
    then.generation.is_some()
        && then.generation == now.generation
        && then.uid == now.uid
        && then.name == now.name
        && then.namespace == now.namespace
        && then.creation_timestamp == now.creation_timestamp
        && then.deletion_timestamp.is_some() == now.deletion_timestamp.is_some()
        && then.labels == now.labels
        && then.annotations == now.annotations
}

/// Whether every one of `named` is as `services` and `endpoints` have it now: the same
/// object (or still none), the same endpoint nodes and slices.
pub(crate) fn unchanged(
    named: &[NamedService],
    services: &Services,
    endpoints: Option<&Endpoints>,
) -> bool {
    named.iter().all(|(key, then, nodes, pods)| {
        let same = match (services.get(key), then) {
            (Some(now), Some(then)) => std::sync::Arc::ptr_eq(now, then),
            (None, None) => true,
            _ => false,
        };
        same && endpoints.and_then(|e| e.nodes.get(key)) == nodes.as_ref()
            && endpoints.and_then(|e| e.pods.get(key)) == pods.as_ref()
    })
}

/// The Services (namespace, name) an Ingress's backends name, each once.
fn named_services(ingress: &Ingress) -> Vec<(String, String)> {
    let namespace = ingress.metadata.namespace.as_deref().unwrap_or("default");
    let spec = ingress.spec.as_ref();
    let rules = spec.and_then(|s| s.rules.as_deref()).unwrap_or_default();
    let mut named: Vec<(String, String)> = rules
        .iter()
        .flat_map(|r| r.http.as_ref().map(|h| h.paths.as_slice()).unwrap_or_default())
        .map(|p| &p.backend)
        .chain(spec.and_then(|s| s.default_backend.as_ref()))
        .filter_map(|b| Some((namespace.to_owned(), b.service.as_ref()?.name.clone())))
        .collect();
    named.sort();
    named.dedup();
    named
}

/// The nodes routes go to: Ready, with an InternalIP and without the exclusion label, sorted
/// by name.
pub fn ready_nodes<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Vec<NodeAddr> {
    let mut ready: Vec<NodeAddr> = nodes
        .into_iter()
        .filter_map(|n| {
            let status = n.status.as_ref()?;
            let is_ready = status
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            // Cordoned nodes stay: kube-proxy on them still serves NodePorts while they drain.
            // The label Kubernetes' own service load balancers honour takes a node out.
            let excluded =
                n.metadata.labels.as_ref().is_some_and(|l| l.contains_key(EXCLUDE_FROM_LB_LABEL));
            if !is_ready || excluded {
                return None;
            }
            let ip = status
                .addresses
                .as_ref()?
                .iter()
                .filter(|a| a.type_ == "InternalIP")
                .find_map(|a| a.address.parse::<IpAddr>().ok())?;
            let name = ObjectName::new(n.metadata.name.clone()?).ok()?;
            Some(NodeAddr { name, addr: ip })
        })
        .collect();
    ready.sort();
    ready
}

/// What a route's backend is resolved from.
pub(crate) struct Sources<'a> {
    pub(crate) services: &'a Services,
    pub(crate) endpoints: Option<&'a Endpoints>,
    /// The Ingress's fleet sends Services to their pods unless they say otherwise.
    pub(crate) pods_by_default: bool,
}

/// The Service port behind an Ingress backend. In nodes mode, a route whose Service is
/// missing, or cannot be reached through a NodePort (not NodePort or LoadBalancer, or without
/// that port or its nodePort), goes to no NodePort at all, so HAProxy answers 503: routing on to
/// the NodePort it had could reach whatever Service Kubernetes gives that port next. In pods
/// mode ([`crate::core::pods`]) it goes to the serving endpoints of the Service port. Only what
/// is wrong with the Ingress itself (or the Service's hafleet annotations) is an `Err`, which
/// refuses the Ingress (it keeps its published routes).
pub(crate) fn backend(
    namespace: &str,
    backend: &IngressBackend,
    sources: &Sources<'_>,
    warnings: &mut Vec<Warning>,
) -> Result<Backend, String> {
    if backend.resource.is_some() {
        return Err("resource backends are not supported; use a Service".into());
    }
    let svc = backend.service.as_ref().ok_or("no service")?;
    let name = ObjectName::new(svc.name.as_str()).map_err(|e| e.to_string())?;
    let ns = Namespace::new(namespace).map_err(|e| e.to_string())?;
    let port = svc.port.as_ref().ok_or("service.port is missing")?;
    let no_node_port = |name: ObjectName, ns: Namespace| {
        let port = port.number.and_then(|n| u16::try_from(n).ok()).unwrap_or(0);
        serverless(ServiceRef { namespace: ns, name, port, cluster: None })
    };
    let key = (namespace.to_owned(), svc.name.clone());
    let Some(service) = sources.services.get(&key) else {
        warnings.push(Warning {
            reason: "BackendMissing",
            note: format!("service {namespace}/{name} does not exist; requests get 503"),
        });
        return Ok(no_node_port(name, ns));
    };
    let send_proxy =
        send_proxy_of(service).map_err(|e| format!("service {namespace}/{name}: {e}"))?;
    let mode = crate::core::pods::mode_of(service)
        .map_err(|e| format!("service {namespace}/{name}: {e}"))?;
    let options = hafleet_proto::BackendOptions { send_proxy, ..Default::default() };
    if mode.unwrap_or(match sources.pods_by_default {
        true => crate::core::pods::Mode::Pods,
        false => crate::core::pods::Mode::Nodes,
    }) == crate::core::pods::Mode::Pods
    {
        let pods = pods_backend(service, port, sources.endpoints.map(|e| e.pods.get(&key)));
        let (service_port, pods) = pods.unwrap_or_else(|why| {
            warnings.push(Warning {
                reason: "RouteWithdrawn",
                note: format!("service {namespace}/{name} {why}; requests get 503"),
            });
            (port.number.and_then(|n| u16::try_from(n).ok()).unwrap_or(0), vec![])
        });
        if !pods.iter().any(|p| !p.draining) {
            warnings.push(Warning {
                reason: "NoReadyEndpoint",
                note: format!(
                    "service {namespace}/{name} is routed to its pods and has no ready endpoint \
                     for port {service_port}; requests get 503"
                ),
            });
        }
        return Ok(Backend {
            service: ServiceRef { namespace: ns, name, port: service_port, cluster: None },
            node_port: None,
            servers: vec![],
            traffic_policy: TrafficPolicy::Cluster,
            endpoint_nodes: None,
            options,
            pods: Some(pods),
        });
    }
    let (service_port, node_port, traffic_policy) = match node_port_of(service, port) {
        Ok(found) => found,
        Err(why) => {
            warnings.push(Warning {
                reason: "RouteWithdrawn",
                note: format!(
                    "service {namespace}/{name} {why}; hafleet routes to NodePorts, so its \
                     routes get no traffic (503) until it has one"
                ),
            });
            return Ok(no_node_port(name, ns));
        }
    };
    // A Local Service's NodePort forwards only on nodes with an endpoint of their own (kube-proxy
    // drops its traffic on the others): the route names those nodes, when they can be known.
    let endpoint_nodes = match (traffic_policy, sources.endpoints) {
        (TrafficPolicy::Local, Some(all)) => {
            let on: Vec<ObjectName> = all
                .nodes
                .get(&key)
                .into_iter()
                .flatten()
                .filter_map(|n| ObjectName::new(n.as_str()).ok())
                .collect();
            if on.is_empty() {
                warnings.push(Warning {
                    reason: "NoReadyEndpoint",
                    note: format!(
                        "service {namespace}/{name} has externalTrafficPolicy Local and no ready \
                         endpoint on any node; requests get 503"
                    ),
                });
            }
            Some(on)
        }
        _ => None,
    };
    Ok(Backend {
        service: ServiceRef { namespace: ns, name, port: service_port, cluster: None },
        node_port: Some(node_port),
        servers: vec![],
        traffic_policy,
        endpoint_nodes,
        options,
        pods: None,
    })
}

/// A backend of `service` with no servers (HAProxy answers 503, or what its options say).
pub(crate) fn serverless(service: ServiceRef) -> Backend {
    Backend {
        service,
        node_port: None,
        servers: vec![],
        traffic_policy: TrafficPolicy::Cluster,
        endpoint_nodes: None,
        options: Default::default(),
        pods: None,
    }
}

/// In pods mode: the Service's port that `port` names and the serving endpoints behind it, or
/// what keeps them from being known (completing "service ns/name …"). `slices` is `None` where
/// the API server serves no EndpointSlices.
fn pods_backend(
    service: &Service,
    port: &k8s_openapi::api::networking::v1::ServiceBackendPort,
    slices: Option<Option<&Vec<std::sync::Arc<crate::core::pods::SliceView>>>>,
) -> Result<(u16, Vec<hafleet_proto::PodEndpoint>), String> {
    let found = service_port(service, port)?;
    let service_port = u16::try_from(found.port).map_err(|_| "port is out of range")?;
    let slices =
        slices.ok_or("is routed to its pods, but the API server serves no EndpointSlices")?;
    let name = found.name.as_deref().unwrap_or_default();
    Ok((
        service_port,
        crate::core::pods::endpoints_of(slices.map_or(&[][..], |s| s.as_slice()), name),
    ))
}

/// The Service's port that `port` names, by number or name (completing "service ns/name …").
fn service_port<'a>(
    service: &'a Service,
    port: &k8s_openapi::api::networking::v1::ServiceBackendPort,
) -> Result<&'a k8s_openapi::api::core::v1::ServicePort, String> {
    let spec = service.spec.as_ref().ok_or("has no spec")?;
    let ports = spec.ports.as_deref().unwrap_or_default();
    let found = match (&port.number, &port.name) {
        (Some(n), _) => ports.iter().find(|p| p.port == *n),
        (None, Some(pname)) => ports.iter().find(|p| p.name.as_deref() == Some(pname.as_str())),
        (None, None) => None,
    };
    let named = port.number.map(|n| n.to_string()).or_else(|| port.name.clone());
    found.ok_or_else(|| format!("has no port {}", named.unwrap_or_default()))
}

/// The Service's annotation that asks HAProxy to speak the PROXY protocol to its servers.
pub const SEND_PROXY_ANNOTATION: &str = "hafleet.io/send-proxy";

/// The PROXY protocol version a Service's `hafleet.io/send-proxy` asks for.
fn send_proxy_of(service: &Service) -> Result<Option<hafleet_proto::ProxyProtocol>, String> {
    let annotations = service.metadata.annotations.as_ref();
    match annotations.and_then(|a| a.get(SEND_PROXY_ANNOTATION)).map(|v| v.trim()) {
        None => Ok(None),
        Some("v1") => Ok(Some(hafleet_proto::ProxyProtocol::V1)),
        Some("v2") => Ok(Some(hafleet_proto::ProxyProtocol::V2)),
        Some(other) => {
            Err(format!("annotation {SEND_PROXY_ANNOTATION}={other:?} must be v1 or v2"))
        }
    }
}

/// The Service's port that `port` names, its NodePort and its traffic policy, or what keeps
/// the Service from being reached through a NodePort (completing "service ns/name …").
fn node_port_of(
    service: &Service,
    port: &k8s_openapi::api::networking::v1::ServiceBackendPort,
) -> Result<(u16, u16, TrafficPolicy), String> {
    let spec = service.spec.as_ref().ok_or("has no spec")?;
    let kind = spec.type_.as_deref().unwrap_or("ClusterIP");
    if kind != "NodePort" && kind != "LoadBalancer" {
        return Err(format!("is of type {kind}, not NodePort or LoadBalancer"));
    }
    let found = service_port(service, port)?;
    let node_port = found
        .node_port
        .and_then(|p| u16::try_from(p).ok())
        .ok_or_else(|| format!("port {} has no nodePort", found.port))?;
    let service_port = u16::try_from(found.port).map_err(|_| "port is out of range")?;
    let traffic_policy = match is_local(service) {
        true => TrafficPolicy::Local,
        false => TrafficPolicy::Cluster,
    };
    Ok((service_port, node_port, traffic_policy))
}

#[cfg(test)]
mod tests;

/// Shared fixtures for the watcher's unit tests.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    /// Ingress `ns/name` on `fleet`, resolved to `n_routes` copies of [`route`].
    pub fn resolved(ns: &str, name: &str, fleet: &str, n_routes: usize) -> Resolved {
        Resolved {
            fleet: FleetName::new(fleet).unwrap(),
            key: IngressKey::new(ns, name).unwrap(),
            created_unix: 0,
            resource_version: "1".into(),
            routes: std::sync::Arc::new(vec![route(); n_routes]),
            warnings: vec![],
            sharing: Default::default(),
            tls: Default::default(),
            tls_spec: vec![],
        }
    }

    pub fn route() -> Route {
        Route {
            host: Some(HttpHost::new("a.com").unwrap()),
            path: HttpPath::root(),
            kind: PathKind::Prefix,
            backend: Backend {
                service: ServiceRef {
                    namespace: Namespace::new("default").unwrap(),
                    name: ObjectName::new("web").unwrap(),
                    port: 80,
                    cluster: None,
                },
                node_port: Some(30080),
                servers: vec![],
                traffic_policy: TrafficPolicy::Cluster,
                endpoint_nodes: None,
                options: Default::default(),
                pods: None,
            },
            more: None,
        }
    }
}
