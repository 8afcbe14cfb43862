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
pub type Endpoints = HashMap<(String, String), BTreeSet<String>>;

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
) -> Endpoints {
    let by_hostname: HashMap<&str, &str> = nodes
        .into_iter()
        .filter_map(|n| {
            let hostname = n.metadata.labels.as_ref()?.get(HOSTNAME_LABEL)?;
            Some((hostname.as_str(), n.metadata.name.as_deref()?))
        })
        .collect();
    let mut out = Endpoints::new();
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
    ingress_class: Option<&str>,
    services: &Services,
    endpoints: Option<&Endpoints>,
) -> Result<Resolved, Refused> {
    let meta = &ingress.metadata;
    let annotations = meta.annotations.as_ref();
    let Some(fleet) = annotations.and_then(|a| a.get(FLEET_ANNOTATION)) else {
        return Err(Refused::NotSelected);
    };
    if let Some(want) = ingress_class {
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
            match backend(namespace, &p.backend, (services, endpoints), &mut warnings) {
                Ok(backend) => routes.push(Route { host: host.clone(), path, kind, backend }),
                Err(e) => errors.push(format!("{at}.backend: {e}")),
            }
        }
    }
    if let Some(default) = spec.and_then(|s| s.default_backend.as_ref()) {
        match backend(namespace, default, (services, endpoints), &mut warnings) {
            Ok(backend) => routes.push(Route {
                host: None,
                path: HttpPath::root(),
                kind: PathKind::Prefix,
                backend,
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
        (Some(fleet), Some(key)) if errors.is_empty() => Ok(Resolved {
            fleet,
            key,
            created_unix: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()).unwrap_or(0),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            routes: std::sync::Arc::new(routes),
            warnings,
            sharing: settings.sharing,
            tls: Vec::new(),
        }),
        _ => Err(Refused::Invalid(errors)),
    }
}

/// Each Ingress's last resolution, reused on the next pass while nothing it was resolved from
/// changed: the same Ingress object, and the same objects (or absence) for every Service it
/// names, with the same endpoint nodes. The watch caches replace an object on every change and
/// keep it otherwise, so "the same" is the same `Arc`: a pass over 10,000 Ingresses resolves
/// only those whose inputs changed (see BENCHMARKS.md). One `Memo` serves one ingress class
/// and one source of endpoints, as a watcher has.
#[derive(Default)]
pub struct Memo {
    /// By the address of the Ingress object, which each entry holds so that the address stays
    /// that object's.
    entries: HashMap<usize, Memoized, foldhash::fast::RandomState>,
    /// The pass under way: entries not resolved in it are forgotten at its end.
    pass: u64,
    /// How many Ingresses this pass resolved anew.
    fresh: usize,
}

/// A Service an Ingress names: (namespace, name), the object (none: missing), and its
/// endpoint nodes.
type NamedService = ((String, String), Option<std::sync::Arc<Service>>, Option<BTreeSet<String>>);

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
        ingress_class: Option<&str>,
        services: &Services,
        endpoints: Option<&Endpoints>,
    ) -> Result<Resolved, Refused> {
        let still = |m: &Memoized| {
            std::sync::Arc::ptr_eq(&m.ingress, ingress)
                && m.named.iter().all(|(key, then, nodes)| {
                    let same = match (services.get(key), then) {
                        (Some(now), Some(then)) => std::sync::Arc::ptr_eq(now, then),
                        (None, None) => true,
                        _ => false,
                    };
                    same && endpoints.and_then(|e| e.get(key)) == nodes.as_ref()
                })
        };
        let at = std::sync::Arc::as_ptr(ingress) as usize;
        let pass = self.pass;
        match self.entries.get_mut(&at) {
            Some(m) if still(m) => {
                m.pass = pass;
                m.result.clone()
            }
            _ => {
                let named = named_services(ingress)
                    .into_iter()
                    .map(|key| {
                        let service = services.get(&key).cloned();
                        let nodes = endpoints.and_then(|e| e.get(&key)).cloned();
                        (key, service, nodes)
                    })
                    .collect();
                let result = resolve(ingress, ingress_class, services, endpoints);
                self.fresh += 1;
                let m = Memoized { ingress: ingress.clone(), named, result: result.clone(), pass };
                self.entries.insert(at, m);
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

/// The Service port behind an Ingress backend. A route whose Service is missing, or cannot be
/// reached through a NodePort (not NodePort or LoadBalancer, or without that port or its
/// nodePort), goes to no NodePort at all, so HAProxy answers 503: routing on to the NodePort it
/// had could reach whatever Service Kubernetes gives that port next. Only what is wrong with
/// the Ingress itself is an `Err`, which refuses the Ingress (it keeps its published routes).
fn backend(
    namespace: &str,
    backend: &IngressBackend,
    (services, endpoints): (&Services, Option<&Endpoints>),
    warnings: &mut Vec<Warning>,
) -> Result<Backend, String> {
    if backend.resource.is_some() {
        return Err("resource backends are not supported; use a Service".into());
    }
    let svc = backend.service.as_ref().ok_or("no service")?;
    let name = ObjectName::new(svc.name.as_str()).map_err(|e| e.to_string())?;
    let ns = Namespace::new(namespace).map_err(|e| e.to_string())?;
    let port = svc.port.as_ref().ok_or("service.port is missing")?;
    let no_node_port = |name: ObjectName, ns: Namespace| Backend {
        service: ServiceRef {
            namespace: ns,
            name,
            port: port.number.and_then(|n| u16::try_from(n).ok()).unwrap_or(0),
            cluster: None,
        },
        node_port: None,
        servers: vec![],
        traffic_policy: TrafficPolicy::Cluster,
        endpoint_nodes: None,
        options: Default::default(),
    };
    let Some(service) = services.get(&(namespace.to_owned(), svc.name.clone())) else {
        warnings.push(Warning {
            reason: "BackendMissing",
            note: format!("service {namespace}/{name} does not exist; requests get 503"),
        });
        return Ok(no_node_port(name, ns));
    };
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
    let endpoint_nodes = match (traffic_policy, endpoints) {
        (TrafficPolicy::Local, Some(all)) => {
            let on: Vec<ObjectName> = all
                .get(&(namespace.to_owned(), svc.name.clone()))
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
    let send_proxy =
        send_proxy_of(service).map_err(|e| format!("service {namespace}/{name}: {e}"))?;
    Ok(Backend {
        service: ServiceRef { namespace: ns, name, port: service_port, cluster: None },
        node_port: Some(node_port),
        servers: vec![],
        traffic_policy,
        endpoint_nodes,
        options: hafleet_proto::BackendOptions { send_proxy, ..Default::default() },
    })
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
    let ports = spec.ports.as_deref().unwrap_or_default();
    let found = match (&port.number, &port.name) {
        (Some(n), _) => ports.iter().find(|p| p.port == *n),
        (None, Some(pname)) => ports.iter().find(|p| p.name.as_deref() == Some(pname.as_str())),
        (None, None) => None,
    };
    let named = port.number.map(|n| n.to_string()).or_else(|| port.name.clone());
    let found = found.ok_or_else(|| format!("has no port {}", named.unwrap_or_default()))?;
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
mod tests {
    use super::*;
    use serde_json::json;

    fn ingress(v: serde_json::Value) -> Ingress {
        serde_json::from_value(v).unwrap()
    }

    fn web_ingress(host: &str, path: &str) -> Ingress {
        ingress(json!({
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "7",
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "annotations": {"hafleet.io/fleet": "edge"}},
            "spec": {"rules": [{"host": host, "http": {"paths": [
                {"path": path, "pathType": "Prefix",
                 "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}
        }))
    }

    fn services(kind: &str) -> Services {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"type": kind, "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}
        }))
        .unwrap();
        [(("shop".to_owned(), "web".to_owned()), std::sync::Arc::new(svc))].into_iter().collect()
    }

    fn node(name: &str, ip: &str, ready: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}],
                       "conditions": [{"type": "Ready", "status": ready}]}
        }))
        .unwrap()
    }

    #[test]
    fn a_nodeport_ingress_resolves_to_its_node_port_and_routes_go_to_ready_nodes() {
        let r = resolve(&web_ingress("shop.example.com", "/"), None, &services("NodePort"), None)
            .unwrap();
        assert_eq!(r.fleet.as_str(), "edge");
        assert_eq!(r.key.to_string(), "shop/web");
        assert_eq!(r.resource_version, "7");
        assert_eq!(r.created_unix, 1_767_225_600);
        assert_eq!(r.routes[0].backend.node_port, Some(30080));
        assert!(r.routes[0].backend.servers.is_empty(), "nodes travel on their own");
        let nodes = [
            node("n2", "127.0.0.3", "True"),
            node("n1", "127.0.0.2", "True"),
            node("n3", "127.0.0.4", "False"),
        ];
        let ready: Vec<String> =
            ready_nodes(&nodes).iter().map(|n| format!("{} {}", n.name, n.addr)).collect();
        assert_eq!(ready, ["n1 127.0.0.2", "n2 127.0.0.3"]);
    }

    #[test]
    fn cordoned_nodes_serve_and_excluded_ones_do_not() {
        let mut cordoned = node("n1", "127.0.0.2", "True");
        cordoned.spec = Some(serde_json::from_value(json!({"unschedulable": true})).unwrap());
        let mut excluded = node("n2", "127.0.0.3", "True");
        excluded.metadata.labels = Some([(EXCLUDE_FROM_LB_LABEL.to_owned(), String::new())].into());
        let ready = ready_nodes(&[cordoned, excluded]);
        let nodes: Vec<&str> = ready.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(nodes, ["n1"]);
    }

    #[test]
    fn without_the_annotation_or_with_another_class_it_is_not_ours() {
        let mut ing = web_ingress("a.com", "/");
        let s = services("NodePort");
        assert!(resolve(&ing, Some("hafleet"), &s, None) == Err(Refused::NotSelected));
        ing.spec.as_mut().unwrap().ingress_class_name = Some("hafleet".into());
        assert!(resolve(&ing, Some("hafleet"), &s, None).is_ok());
        ing.metadata.annotations = None;
        assert_eq!(resolve(&ing, None, &s, None), Err(Refused::NotSelected));
    }

    #[test]
    fn injection_attempts_are_refused_with_reasons() {
        let s = services("NodePort");
        let Err(Refused::Invalid(why)) =
            resolve(&web_ingress("a.com", "/x\n    use_backend evil"), None, &s, None)
        else {
            panic!("a path with a newline must be refused")
        };
        assert!(why[0].starts_with("rules[0].http.paths[0].path"), "{why:?}");
        let Err(Refused::Invalid(why)) = resolve(&web_ingress("a.com }", "/"), None, &s, None)
        else {
            panic!("a host with a brace must be refused")
        };
        assert!(why[0].starts_with("rules[0].host"), "{why:?}");
        let mut bad_fleet = web_ingress("a.com", "/");
        bad_fleet
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(FLEET_ANNOTATION.into(), "Edge!".into());
        assert!(matches!(resolve(&bad_fleet, None, &s, None), Err(Refused::Invalid(_))));
    }

    fn slice(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_local_service_names_the_nodes_with_a_ready_endpoint_from_either_slice_version() {
        let mut s = services("NodePort");
        let svc = s.get_mut(&("shop".to_owned(), "web".to_owned())).unwrap();
        std::sync::Arc::make_mut(svc).spec.as_mut().unwrap().external_traffic_policy =
            Some("Local".into());
        let meta = |name: &str| {
            json!({"name": name, "namespace": "shop",
                   "labels": {"kubernetes.io/service-name": "web"}})
        };
        let v1 = slice(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": meta("web-a"), "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.1.0.1"], "nodeName": "n1", "conditions": {"ready": true}},
                {"addresses": ["10.1.0.2"], "nodeName": "n2", "conditions": {"ready": false}},
                {"addresses": ["10.1.0.3"], "nodeName": "n3"},
                {"addresses": ["10.1.0.9"]}
            ]
        }));
        // v1beta1 (Kubernetes 1.20): the node is found by its hostname label.
        let v1beta1 = slice(json!({
            "apiVersion": "discovery.k8s.io/v1beta1", "kind": "EndpointSlice",
            "metadata": meta("web-b"), "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.1.0.4"], "topology": {"kubernetes.io/hostname": "host-5"}},
                {"addresses": ["10.1.0.5"], "topology": {"kubernetes.io/hostname": "n6"}}
            ]
        }));
        let mut n5 = node("n5", "10.0.0.5", "True");
        n5.metadata.labels = Some([(HOSTNAME_LABEL.to_owned(), "host-5".to_owned())].into());
        let other = slice(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "x", "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "other"}},
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.1.0.8"], "nodeName": "n9"}]
        }));
        let eps = endpoints([&v1, &v1beta1, &other], [&n5]);
        let r = resolve(&web_ingress("a.com", "/"), None, &s, Some(&eps)).unwrap();
        let b = &r.routes[0].backend;
        assert_eq!(b.traffic_policy, TrafficPolicy::Local);
        let on: Vec<&str> = b.endpoint_nodes.iter().flatten().map(|n| n.as_str()).collect();
        assert_eq!(on, ["n1", "n3", "n5", "n6"], "not n2 (not ready), not n9 (another Service)");
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        // No slice: no node serves it, and the owner is told.
        let r = resolve(&web_ingress("a.com", "/"), None, &s, Some(&Endpoints::new())).unwrap();
        assert_eq!(r.routes[0].backend.endpoint_nodes, Some(vec![]));
        assert_eq!(r.warnings[0].reason, "NoReadyEndpoint");
        assert!(r.warnings[0].note.contains("no ready endpoint"), "{:?}", r.warnings);
        // EndpointSlices not served: unknown, every node (as before).
        let r = resolve(&web_ingress("a.com", "/"), None, &s, None).unwrap();
        assert_eq!(r.routes[0].backend.endpoint_nodes, None);
        // A Cluster Service does not name endpoints: every node forwards.
        let r = resolve(&web_ingress("a.com", "/"), None, &services("NodePort"), Some(&eps));
        assert_eq!(r.unwrap().routes[0].backend.endpoint_nodes, None);
    }

    /// The memo answers as `resolve` would, and resolves anew exactly when the Ingress object,
    /// a Service it names (changed, gone or come) or such a Service's endpoint nodes changed.
    #[test]
    fn the_memo_resolves_again_only_what_changed_and_forgets_what_went() {
        use std::sync::Arc;
        let mut memo = Memo::default();
        let web = Arc::new(web_ingress("a.com", "/"));
        let other = Arc::new(ingress(json!({
            "metadata": {"name": "other", "namespace": "shop",
                         "annotations": {"hafleet.io/fleet": "edge"}},
            "spec": {"defaultBackend": {"service": {"name": "missing", "port": {"number": 80}}}}
        })));
        let mut s = services("NodePort");
        let pass = |memo: &mut Memo,
                    s: &Services,
                    eps: Option<&Endpoints>,
                    ings: &[&Arc<Ingress>]| {
            memo.begin_pass();
            let out: Vec<_> = ings.iter().map(|i| memo.resolve(i, None, s, eps)).collect();
            memo.end_pass();
            for (ing, got) in ings.iter().zip(&out) {
                assert_eq!(got, &resolve(ing, None, s, eps), "the memo answers as resolve does");
            }
            (memo.fresh(), out)
        };
        assert_eq!(pass(&mut memo, &s, None, &[&web, &other]).0, 2);
        assert_eq!(pass(&mut memo, &s, None, &[&web, &other]).0, 0, "nothing changed");

        // The Service it names changes (a new object in the cache): resolved anew.
        let key = ("shop".to_owned(), "web".to_owned());
        let mut svc = (*s[&key]).clone();
        svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(30081);
        s.insert(key.clone(), Arc::new(svc));
        let (fresh, out) = pass(&mut memo, &s, None, &[&web, &other]);
        assert_eq!(fresh, 1, "only the Ingress that names it");
        assert_eq!(out[0].as_ref().unwrap().routes[0].backend.node_port, Some(30081));

        // A Service it names that did not exist appears.
        let mut missing = (*s[&key]).clone();
        missing.metadata.name = Some("missing".into());
        s.insert(("shop".to_owned(), "missing".to_owned()), Arc::new(missing));
        let (fresh, out) = pass(&mut memo, &s, None, &[&web, &other]);
        assert_eq!(fresh, 1);
        assert!(out[1].as_ref().unwrap().warnings.is_empty(), "no longer BackendMissing");

        // The Service goes Local: its endpoint nodes count, and a change of them too.
        let mut local = (*s[&key]).clone();
        local.spec.as_mut().unwrap().external_traffic_policy = Some("Local".into());
        s.insert(key.clone(), Arc::new(local));
        let mut eps = Endpoints::new();
        eps.insert(key.clone(), ["n1".to_owned()].into());
        assert_eq!(pass(&mut memo, &s, Some(&eps), &[&web, &other]).0, 1);
        assert_eq!(pass(&mut memo, &s, Some(&eps), &[&web, &other]).0, 0);
        eps.insert(key.clone(), ["n1".to_owned(), "n2".to_owned()].into());
        let (fresh, out) = pass(&mut memo, &s, Some(&eps), &[&web, &other]);
        assert_eq!(fresh, 1);
        let on = out[0].as_ref().unwrap().routes[0].backend.endpoint_nodes.clone().unwrap();
        assert_eq!(on.iter().map(|n| n.as_str()).collect::<Vec<_>>(), ["n1", "n2"]);

        // An edited Ingress is a new object: resolved anew, and the old one forgotten; an
        // Ingress no longer listed is forgotten too.
        let edited = Arc::new(web_ingress("b.com", "/"));
        let (fresh, out) = pass(&mut memo, &s, Some(&eps), &[&edited]);
        assert_eq!(fresh, 1);
        assert_eq!(out[0].as_ref().unwrap().routes[0].host.as_ref().unwrap().as_str(), "b.com");
        assert_eq!(memo.len(), 1, "web's old object and other are forgotten");
        assert_eq!(pass(&mut memo, &s, Some(&eps), &[&edited, &other]).0, 1, "other comes back");
    }

    /// A route must never stay on a NodePort its Service no longer has: Kubernetes may give
    /// that port to another Service.
    #[test]
    fn a_service_that_cannot_be_reached_through_a_node_port_withdraws_the_route() {
        let with_spec = |spec: serde_json::Value| -> Services {
            let svc: Service = serde_json::from_value(
                json!({"metadata": {"name": "web", "namespace": "shop"}, "spec": spec}),
            )
            .unwrap();
            [(("shop".to_owned(), "web".to_owned()), std::sync::Arc::new(svc))]
                .into_iter()
                .collect()
        };
        for (spec, why) in [
            (json!({"type": "ClusterIP", "ports": [{"port": 80}]}), "is of type ClusterIP"),
            (json!({"type": "NodePort", "ports": [{"port": 81, "nodePort": 30081}]}), "no port 80"),
            (json!({"type": "NodePort", "ports": [{"port": 80}]}), "port 80 has no nodePort"),
        ] {
            let r = resolve(&web_ingress("a.com", "/"), None, &with_spec(spec), None).unwrap();
            let b = &r.routes[0].backend;
            assert_eq!((b.node_port, b.service.port), (None, 80), "{why}");
            assert_eq!(r.warnings.len(), 1, "{why}");
            assert_eq!(r.warnings[0].reason, "RouteWithdrawn");
            assert!(r.warnings[0].note.contains(why), "{}", r.warnings[0].note);
            assert!(r.warnings[0].note.contains("503"), "{}", r.warnings[0].note);
        }
    }

    #[test]
    fn a_missing_service_routes_to_nothing_with_a_warning() {
        let r = resolve(&web_ingress("a.com", "/"), None, &Services::default(), None).unwrap();
        assert_eq!(r.routes[0].backend.node_port, None);
        assert_eq!(r.warnings.len(), 1);
    }
}

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
            tls: vec![],
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
            },
        }
    }
}
