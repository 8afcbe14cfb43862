//! Pods mode: a Service's servers are its pods' endpoints, read from its EndpointSlices, not
//! the nodes at its NodePort. Pure.
//!
//! A Service is in pods mode when its `hafleet.io/endpoints` annotation says `pods`, or when it
//! says nothing and the Ingress's fleet defaults to pods (`--endpoints FLEET=pods`). Any type
//! of Service may be: ClusterIP, headless, NodePort or LoadBalancer.
//!
//! Of a slice's endpoints, those that are ready (and not terminating) serve; those terminating
//! but still serving are drained (no new requests; open ones finish); the others get nothing.
//! A Service port's endpoints are on the slice port of the same name (`targetPort` resolved by
//! Kubernetes per slice, so a named `targetPort` may differ between pods).

use crate::core::resolve::SERVICE_NAME_LABEL;
use hafleet_proto::PodEndpoint;
use k8s_openapi::api::core::v1::Service;
use kube::api::DynamicObject;
use serde::Deserialize as _;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

/// The Service annotation that chooses where its traffic goes: `pods` or `nodes`.
pub const ENDPOINTS_ANNOTATION: &str = "hafleet.io/endpoints";

/// Where a Service's traffic goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// To nodes at its NodePort (kube-proxy takes it from there).
    Nodes,
    /// To its pods' endpoints, straight.
    Pods,
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Mode, String> {
        match s.trim() {
            "nodes" => Ok(Mode::Nodes),
            "pods" => Ok(Mode::Pods),
            other => Err(format!("{other:?} is neither pods nor nodes")),
        }
    }
}

/// The mode the Service's annotation asks for (`None`: it says nothing).
pub fn mode_of(service: &Service) -> Result<Option<Mode>, String> {
    let annotations = service.metadata.annotations.as_ref();
    match annotations.and_then(|a| a.get(ENDPOINTS_ANNOTATION)) {
        None => Ok(None),
        Some(v) => {
            v.parse().map(Some).map_err(|e| format!("annotation {ENDPOINTS_ANNOTATION}: {e}"))
        }
    }
}

/// One EndpointSlice as pods mode reads it: its TCP ports and the endpoints that may get
/// traffic. Parsed once per slice object ([`SliceCache`]).
#[derive(Debug, PartialEq, Eq)]
pub struct SliceView {
    /// The slice's name, which orders a Service's slices.
    name: String,
    /// (name, "" for an unnamed port; number) of each TCP port.
    ports: Vec<(String, u16)>,
    /// (address, draining) of each endpoint that serves.
    endpoints: Vec<(IpAddr, bool)>,
}

/// The slice's fields that pods mode reads, as `discovery.k8s.io/v1` and `v1beta1` write them.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Slice {
    #[serde(default)]
    address_type: Option<String>,
    #[serde(default)]
    ports: Option<Vec<SlicePort>>,
    #[serde(default)]
    endpoints: Option<Vec<SliceEndpoint>>,
}

#[derive(serde::Deserialize)]
struct SlicePort {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    port: Option<i32>,
    #[serde(default)]
    protocol: Option<String>,
}

#[derive(serde::Deserialize)]
struct SliceEndpoint {
    #[serde(default)]
    addresses: Vec<String>,
    #[serde(default)]
    conditions: Option<Conditions>,
}

#[derive(serde::Deserialize, Default)]
struct Conditions {
    #[serde(default)]
    ready: Option<bool>,
    #[serde(default)]
    serving: Option<bool>,
    #[serde(default)]
    terminating: Option<bool>,
}

/// Whether an endpoint with these conditions gets traffic: `Some(false)` serves, `Some(true)`
/// is drained, `None` gets none. As Kubernetes defines them, an absent `ready` counts as ready,
/// an absent `serving` as `ready` (API servers before 1.20 do not write it) and an absent
/// `terminating` as not terminating.
fn draining(c: &Conditions) -> Option<bool> {
    let ready = c.ready.unwrap_or(true);
    match (c.terminating.unwrap_or(false), c.serving.unwrap_or(ready)) {
        (true, true) => Some(true),
        (true, false) => None,
        (false, _) => ready.then_some(false),
    }
}

/// Reads a slice; `None` for one that does not parse or whose addresses are not IPs (FQDN).
/// Slices are the API server's to get right: one that does not parse is skipped.
pub fn view(slice: &DynamicObject) -> Option<SliceView> {
    let data = Slice::deserialize(&slice.data).ok()?;
    if !matches!(data.address_type.as_deref(), Some("IPv4" | "IPv6")) {
        return None;
    }
    let ports = data
        .ports
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.protocol.as_deref().is_none_or(|p| p == "TCP"))
        .filter_map(|p| Some((p.name.unwrap_or_default(), u16::try_from(p.port?).ok()?)))
        .collect();
    let endpoints = data
        .endpoints
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| {
            let draining = draining(&e.conditions.unwrap_or_default())?;
            // Addresses are fungible; Kubernetes lets consumers use only the first.
            let addr = e.addresses.first()?.parse().ok()?;
            Some((addr, draining))
        })
        .collect();
    Some(SliceView { name: slice.metadata.name.clone().unwrap_or_default(), ports, endpoints })
}

/// The slices of each Service in pods mode, by (namespace, name), in name order.
pub type PodSlices = HashMap<(String, String), Vec<Arc<SliceView>>, foldhash::fast::RandomState>;

/// Each slice object's [`view`], kept while the watch cache holds the same object (the same
/// `Arc`), so a pass reads only the slices that changed since the last.
#[derive(Debug, Default)]
pub struct SliceCache {
    views: HashMap<usize, Viewed, foldhash::fast::RandomState>,
}

/// A slice object, kept so that its address stays its own, and its view.
type Viewed = (Arc<DynamicObject>, Option<Arc<SliceView>>);

impl SliceCache {
    /// The views of the slices of the Services `wanted` (namespace, name) says are in pods
    /// mode; forgets the slices not among `slices` any more.
    pub fn by_service(
        &mut self,
        slices: &[Arc<DynamicObject>],
        wanted: impl Fn(&str, &str) -> bool,
    ) -> PodSlices {
        let mut next = HashMap::with_capacity_and_hasher(self.views.len(), Default::default());
        let mut out = PodSlices::default();
        for slice in slices {
            let Some(ns) = slice.metadata.namespace.as_ref() else { continue };
            let labels = slice.metadata.labels.as_ref();
            let Some(service) = labels.and_then(|l| l.get(SERVICE_NAME_LABEL)) else { continue };
            if !wanted(ns, service) {
                continue;
            }
            let at = Arc::as_ptr(slice) as usize;
            let view = match self.views.remove(&at) {
                Some((object, view)) if Arc::ptr_eq(&object, slice) => view,
                _ => view(slice).map(Arc::new),
            };
            next.insert(at, (slice.clone(), view.clone()));
            if let Some(view) = view {
                out.entry((ns.clone(), service.clone())).or_default().push(view);
            }
        }
        for views in out.values_mut() {
            views.sort_by(|a, b| a.name.cmp(&b.name));
        }
        self.views = next;
        out
    }
}

/// The endpoints of Service port `port_name` ("" for an unnamed port) in `slices`: sorted,
/// each (address, port) once, serving where any slice says it serves.
pub fn endpoints_of(slices: &[Arc<SliceView>], port_name: &str) -> Vec<PodEndpoint> {
    let mut found: BTreeMap<(IpAddr, u16), bool> = BTreeMap::new();
    for slice in slices {
        let Some((_, port)) = slice.ports.iter().find(|(name, _)| name == port_name) else {
            continue;
        };
        for (addr, draining) in &slice.endpoints {
            let slot = found.entry((*addr, *port)).or_insert(*draining);
            *slot &= *draining;
        }
    }
    found.into_iter().map(|((addr, port), draining)| PodEndpoint { addr, port, draining }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(name: &str, ports: serde_json::Value, endpoints: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "shop",
                         "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4", "ports": ports, "endpoints": endpoints
        }))
        .unwrap()
    }

    fn ep(addr: &str, conditions: serde_json::Value) -> serde_json::Value {
        json!({"addresses": [addr], "conditions": conditions})
    }

    fn listed(eps: &[PodEndpoint]) -> Vec<String> {
        let state = |e: &PodEndpoint| if e.draining { " draining" } else { "" };
        eps.iter().map(|e| format!("{}:{}{}", e.addr, e.port, state(e))).collect()
    }

    #[test]
    fn ready_endpoints_serve_terminating_ones_drain_and_the_others_get_nothing() {
        let s = slice(
            "web-1",
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
            json!([
                ep("10.0.0.1", json!({"ready": true})),
                ep("10.0.0.2", json!({})),
                ep("10.0.0.3", json!({"ready": false})),
                ep("10.0.0.4", json!({"ready": false, "serving": true, "terminating": true})),
                ep("10.0.0.5", json!({"ready": false, "serving": false, "terminating": true})),
                ep("10.0.0.6", json!({"ready": false, "serving": true})),
            ]),
        );
        let v = Arc::new(view(&s).unwrap());
        assert_eq!(
            listed(&endpoints_of(&[v], "http")),
            ["10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.4:8080 draining"]
        );
    }

    #[test]
    fn a_named_port_is_found_per_slice_and_an_endpoint_serves_if_any_slice_says_so() {
        let a = slice(
            "web-a",
            json!([{"name": "http", "port": 8080}, {"name": "metrics", "port": 9090}]),
            json!([
                ep("10.0.0.1", json!({"ready": true})),
                ep("10.0.0.2", json!({"terminating": true, "serving": true}))
            ]),
        );
        // Pods of another template, whose named targetPort is another number.
        let b = slice(
            "web-b",
            json!([{"name": "http", "port": 8081}, {"name": "udp", "port": 53, "protocol": "UDP"}]),
            json!([ep("10.0.0.3", json!({"ready": true})), ep("10.0.0.2", json!({"ready": true}))]),
        );
        let views = [Arc::new(view(&a).unwrap()), Arc::new(view(&b).unwrap())];
        assert_eq!(
            listed(&endpoints_of(&views, "http")),
            ["10.0.0.1:8080", "10.0.0.2:8080 draining", "10.0.0.2:8081", "10.0.0.3:8081"]
        );
        assert_eq!(
            listed(&endpoints_of(&views, "metrics")),
            ["10.0.0.1:9090", "10.0.0.2:9090 draining"]
        );
        assert!(endpoints_of(&views, "udp").is_empty(), "TCP only");
        // The same endpoint in two slices (a pod moving between them) serves once.
        let c = slice(
            "web-c",
            json!([{"name": "http", "port": 8081}]),
            json!([ep("10.0.0.3", json!({"terminating": true, "serving": true}))]),
        );
        let views = [views[1].clone(), Arc::new(view(&c).unwrap())];
        assert_eq!(listed(&endpoints_of(&views, "http")), ["10.0.0.2:8081", "10.0.0.3:8081"]);
    }

    #[test]
    fn fqdn_slices_and_slices_that_do_not_parse_are_skipped() {
        let mut s = slice("web-1", json!([{"port": 80}]), json!([ep("10.0.0.1", json!({}))]));
        assert_eq!(listed(&endpoints_of(&[Arc::new(view(&s).unwrap())], "")), ["10.0.0.1:80"]);
        s.data["addressType"] = json!("FQDN");
        assert!(view(&s).is_none());
        s.data["addressType"] = json!("IPv4");
        s.data["endpoints"] = json!("not a list");
        assert!(view(&s).is_none());
    }

    #[test]
    fn the_cache_reads_a_slice_again_only_when_its_object_changed() {
        let mut cache = SliceCache::default();
        let one =
            Arc::new(slice("web-1", json!([{"port": 80}]), json!([ep("10.0.0.1", json!({}))])));
        let two =
            Arc::new(slice("web-2", json!([{"port": 80}]), json!([ep("10.0.0.2", json!({}))])));
        let all = [two.clone(), one.clone()];
        let first = cache.by_service(&all, |_, _| true);
        let key = ("shop".to_owned(), "web".to_owned());
        assert_eq!(
            first[&key].iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
            ["web-1", "web-2"]
        );
        let again = cache.by_service(&all, |_, _| true);
        assert!(first[&key].iter().zip(&again[&key]).all(|(a, b)| Arc::ptr_eq(a, b)), "kept");
        let edited =
            Arc::new(slice("web-1", json!([{"port": 80}]), json!([ep("10.0.0.9", json!({}))])));
        let after = cache.by_service(&[edited, two], |_, _| true);
        assert!(!Arc::ptr_eq(&after[&key][0], &first[&key][0]), "read again");
        assert!(Arc::ptr_eq(&after[&key][1], &first[&key][1]));
        assert!(cache.by_service(&[], |_, _| true).is_empty());
        assert!(cache.views.is_empty(), "forgotten");
        assert!(cache.by_service(&all, |_, _| false).is_empty(), "only Services in pods mode");
    }

    #[test]
    fn the_annotation_says_pods_or_nodes_and_nothing_else() {
        let svc = |v: Option<&str>| -> Service {
            let mut s = Service::default();
            if let Some(v) = v {
                s.metadata.annotations =
                    Some([(ENDPOINTS_ANNOTATION.to_owned(), v.to_owned())].into());
            }
            s
        };
        assert_eq!(mode_of(&svc(None)), Ok(None));
        assert_eq!(mode_of(&svc(Some("pods"))), Ok(Some(Mode::Pods)));
        assert_eq!(mode_of(&svc(Some(" nodes "))), Ok(Some(Mode::Nodes)));
        assert!(mode_of(&svc(Some("pod"))).unwrap_err().contains("neither pods nor nodes"));
    }
}
