//! Kubernetes adapter, reading: reflectors (watch-driven caches, never polling) for Ingresses,
//! Services, Nodes and EndpointSlices, and a stream that ticks whenever any of them changes.
//! Events and status go the other way, through [`crate::k8s::events`].

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret, Service};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use std::pin::Pin;
use std::time::Duration;
use tracing::{info, warn};

/// Read-only views of the cluster, kept current by watches.
#[derive(Clone)]
pub struct Caches {
    pub ingresses: Store<Ingress>,
    pub services: Store<Service>,
    pub nodes: Store<Node>,
    /// Where Services' endpoints run, read as the server serves them (`discovery.k8s.io/v1`,
    /// or `v1beta1` before Kubernetes 1.21); `None` on a server that serves neither.
    pub endpoint_slices: Option<Store<DynamicObject>>,
    /// With TLS on: the `kubernetes.io/tls` Secrets, metadata only (name and resourceVersion,
    /// never data). The data of the ones fleet Ingresses name is read with [`secret_data`].
    pub tls_secrets: Option<TlsSecrets>,
    /// With `--tenancy-policy`: that one ConfigMap (or none while it does not exist).
    pub policy: Option<Store<ConfigMap>>,
    /// With `--settings-namespace`: that namespace's ConfigMaps (the fleets' settings are
    /// those named `hafleet-fleet-<fleet>`).
    pub settings: Option<Store<ConfigMap>>,
    /// Where the cluster serves the Gateway API: its objects.
    pub gateway: Option<GatewayCaches>,
}

/// The `kubernetes.io/tls` Secrets the watcher watches: every namespace's, or those of
/// `--tls-namespaces` (one watch each).
#[derive(Clone)]
pub struct TlsSecrets {
    stores: Vec<Store<PartialObjectMeta<Secret>>>,
    /// `None`: every namespace.
    namespaces: Option<std::collections::BTreeSet<String>>,
}

impl TlsSecrets {
    /// Whether the watcher reads TLS Secrets of namespace `ns`.
    pub fn reads(&self, ns: &str) -> bool {
        self.namespaces.as_ref().is_none_or(|n| n.contains(ns))
    }

    /// Secret `ns/name`'s metadata, if it is a TLS Secret the watcher watches.
    pub fn get(&self, ns: &str, name: &str) -> Option<std::sync::Arc<PartialObjectMeta<Secret>>> {
        let key = reflector::ObjectRef::new(name).within(ns);
        self.stores.iter().find_map(|s| s.get(&key))
    }
}

/// The Gateway API's objects hafleet reads: every GatewayClass, Gateway, HTTPRoute and
/// ReferenceGrant (status included: hafleet compares the status it would write with it).
#[derive(Clone)]
pub struct GatewayCaches {
    pub classes: Store<DynamicObject>,
    pub gateways: Store<DynamicObject>,
    pub routes: Store<DynamicObject>,
    /// TLSRoutes and TCPRoutes, where the cluster serves them (their CRDs are installed
    /// apart).
    pub tls_routes: Option<Store<DynamicObject>>,
    pub tcp_routes: Option<Store<DynamicObject>>,
    pub grants: Store<DynamicObject>,
    /// Namespaces, metadata only: their labels, which a listener may select routes by.
    pub namespaces: Store<PartialObjectMeta<k8s_openapi::api::core::v1::Namespace>>,
}

/// What the API server serves of the Gateway API as the watcher starts.
#[derive(Debug, Clone, Copy)]
pub struct GatewayApi {
    /// TLSRoutes and TCPRoutes at `v1` (their CRDs are of the standard channel, installed
    /// apart).
    pub tls_routes: bool,
    pub tcp_routes: bool,
}

/// Whether the API server serves the Gateway API (`gateway.networking.k8s.io/v1`, its CRDs
/// installed), as the watcher starts, and which of the route kinds hafleet reads beside
/// HTTPRoute.
pub async fn serves_gateway_api(client: &Client) -> Option<GatewayApi> {
    let group = kube::discovery::group(client, crate::core::gateway::spec::GROUP).await.ok()?;
    if !group.versions().any(|v| v == "v1") {
        return None;
    }
    let served = |kind: &str| group.versioned_resources("v1").iter().any(|(ar, _)| ar.kind == kind);
    Some(GatewayApi { tls_routes: served("TLSRoute"), tcp_routes: served("TCPRoute") })
}

/// Ticks once per change seen on any watch. Drive it to keep the caches current.
pub type Changes = Pin<Box<dyn Stream<Item = ()> + Send>>;

/// Starts the watches; EndpointSlices at `endpoint_slices` when given (see
/// [`endpoint_slice_api`]). Nothing is fetched until the returned stream is polled.
pub fn watch(
    client: Client,
    endpoint_slices: Option<ApiResource>,
    tls: Option<&[String]>,
    (policy, settings): (Option<(&str, &str)>, Option<&str>),
    gateway_api: Option<GatewayApi>,
) -> (Caches, Changes) {
    let (ingresses, ing_writer) = reflector::store::<Ingress>();
    let (services, svc_writer) = reflector::store::<Service>();
    let (nodes, node_writer) = reflector::store::<Node>();
    let cfg = watcher::Config::default;
    // The caches keep only what routing reads: no managedFields (often most of an object),
    // and of a Node not its images or system info.
    let ing = watcher(Api::<Ingress>::all(client.clone()), cfg())
        .default_backoff()
        .modify(|i| {
            i.metadata.managed_fields = None;
            // Only hafleet's own annotations and the legacy class are read (not, say,
            // kubectl's last-applied-configuration, a copy of the whole object).
            if let Some(a) = i.metadata.annotations.as_mut() {
                a.retain(|k, _| {
                    k.starts_with(crate::core::annotations::PREFIX)
                        || k == crate::core::resolve::LEGACY_CLASS_ANNOTATION
                });
            }
        })
        .reflect(ing_writer)
        .map(|r| r.map(|_| ()).map_err(|e| ("ingresses", e)));
    let svc = watcher(Api::<Service>::all(client.clone()), cfg())
        .default_backoff()
        .modify(|s| {
            s.metadata.managed_fields = None;
            s.status = None;
        })
        .reflect(svc_writer)
        .map(|r| r.map(|_| ()).map_err(|e| ("services", e)));
    let node = watcher(Api::<Node>::all(client.clone()), cfg())
        .default_backoff()
        .modify(|n| {
            n.metadata.managed_fields = None;
            if let Some(status) = n.status.as_mut() {
                status.images = None;
                status.node_info = None;
                status.volumes_attached = None;
                status.volumes_in_use = None;
            }
        })
        .reflect(node_writer)
        .map(|r| r.map(|_| ()).map_err(|e| ("nodes", e)));
    let mut all = vec![ing.boxed(), svc.boxed(), node.boxed()];
    let tls_secrets = tls.map(|namespaces| {
        // Every namespace's, or one watch per namespace named (where its RoleBinding is).
        let apis: Vec<Api<PartialObjectMeta<Secret>>> = match namespaces {
            [] => vec![Api::all(client.clone())],
            some => some.iter().map(|ns| Api::namespaced(client.clone(), ns)).collect(),
        };
        let mut stores = Vec::with_capacity(apis.len());
        for api in apis {
            let (store, writer) = reflector::store::<PartialObjectMeta<Secret>>();
            let config = cfg().fields(&format!("type={}", crate::core::tls_secrets::SECRET_TYPE));
            let secrets = watcher(api, config)
                .default_backoff()
                .modify(|s| {
                    s.metadata.managed_fields = None;
                    s.metadata.annotations = None;
                    s.metadata.labels = None;
                })
                .reflect(writer)
                .map(|r| r.map(|_| ()).map_err(|e| ("secrets", e)));
            all.push(secrets.boxed());
            stores.push(store);
        }
        let namespaces = (!namespaces.is_empty()).then(|| namespaces.iter().cloned().collect());
        TlsSecrets { stores, namespaces }
    });
    // The tenancy policy: one ConfigMap, watched by name in its namespace (the watcher's Role
    // there is all it needs; it reads no other ConfigMap's data).
    let policy = policy.map(|(ns, name)| {
        let (store, writer) = reflector::store::<ConfigMap>();
        let config = cfg().fields(&format!("metadata.name={name}"));
        let cms = watcher(Api::<ConfigMap>::namespaced(client.clone(), ns), config)
            .default_backoff()
            .modify(|c| c.metadata.managed_fields = None)
            .reflect(writer)
            .map(|r| r.map(|_| ()).map_err(|e| ("tenancy policy", e)));
        all.push(cms.boxed());
        store
    });
    // The fleets' settings: the ConfigMaps of one namespace, the admin's (the watcher's Role
    // there is all it needs).
    let settings = settings.map(|ns| {
        let (store, writer) = reflector::store::<ConfigMap>();
        let cms = watcher(Api::<ConfigMap>::namespaced(client.clone(), ns), cfg())
            .default_backoff()
            .modify(|c| c.metadata.managed_fields = None)
            .reflect(writer)
            .map(|r| r.map(|_| ()).map_err(|e| ("fleet settings", e)));
        all.push(cms.boxed());
        store
    });
    let gateway = gateway_api.map(|api| {
        let mut watch_kind = |kind: &'static str| {
            let ar = crate::core::gateway::api_resource(kind);
            let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
            let store = writer.as_reader();
            let mut seen = SpecSeen::default();
            let objects = watcher(Api::<DynamicObject>::all_with(client.clone(), &ar), cfg())
                .default_backoff()
                .modify(|o| o.metadata.managed_fields = None)
                .reflect(writer)
                // The cache holds every change; a pass follows only those of what hafleet
                // reads (not the statuses it writes itself: each would wake one more pass).
                .filter(move |r| std::future::ready(r.as_ref().map_or(true, |e| seen.wakes(e))))
                .map(move |r| r.map(|_| ()).map_err(|e| (kind, e)));
            all.push(objects.boxed());
            store
        };
        let (classes, gateways) = (watch_kind("GatewayClass"), watch_kind("Gateway"));
        let (routes, grants) = (watch_kind("HTTPRoute"), watch_kind("ReferenceGrant"));
        let tls_routes = api.tls_routes.then(|| watch_kind("TLSRoute"));
        let tcp_routes = api.tcp_routes.then(|| watch_kind("TCPRoute"));
        let (namespaces, writer) =
            reflector::store::<PartialObjectMeta<k8s_openapi::api::core::v1::Namespace>>();
        let api =
            Api::<PartialObjectMeta<k8s_openapi::api::core::v1::Namespace>>::all(client.clone());
        let watched = watcher(api, cfg())
            .default_backoff()
            .modify(|n| {
                n.metadata.managed_fields = None;
                n.metadata.annotations = None;
            })
            .reflect(writer)
            .map(|r| r.map(|_| ()).map_err(|e| ("namespaces", e)));
        all.push(watched.boxed());
        GatewayCaches { classes, gateways, routes, tls_routes, tcp_routes, grants, namespaces }
    });
    let endpoint_slices = endpoint_slices.map(|ar| {
        let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
        let store = writer.as_reader();
        let eps = watcher(Api::<DynamicObject>::all_with(client, &ar), cfg())
            .default_backoff()
            // Only what routing reads is kept: not managedFields or annotations.
            .modify(|s| {
                s.metadata.managed_fields = None;
                s.metadata.annotations = None;
            })
            .reflect(writer)
            .map(|r| r.map(|_| ()).map_err(|e| ("endpointslices", e)));
        all.push(eps.boxed());
        store
    });
    let changes = futures::stream::select_all(all).map(|r| {
        if let Err((what, e)) = r {
            // The watcher backs off and resumes by itself; the caches keep their last state.
            warn!(watch = what, error = %e, "watch error");
        }
    });
    let caches = Caches {
        ingresses,
        services,
        nodes,
        endpoint_slices,
        tls_secrets,
        policy,
        settings,
        gateway,
    };
    (caches, Box::pin(changes))
}

/// What a Gateway API object was when it last woke a pass: its generation (moved by its spec
/// only: these kinds have a status subresource), labels, annotations and whether it is being
/// deleted, hashed, by namespace and name. A change of its status alone wakes no pass.
#[derive(Default)]
struct SpecSeen(std::collections::HashMap<(Option<String>, Option<String>), u64>);

impl SpecSeen {
    /// Whether `event` should wake a pass, remembering what it saw.
    fn wakes(&mut self, event: &watcher::Event<DynamicObject>) -> bool {
        use std::hash::{Hash, Hasher};
        let key = |m: &kube::api::ObjectMeta| (m.namespace.clone(), m.name.clone());
        match event {
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                let m = &o.metadata;
                let mut h = std::hash::DefaultHasher::new();
                (m.generation, &m.labels, &m.annotations, m.deletion_timestamp.is_some())
                    .hash(&mut h);
                let new = h.finish();
                let before = self.0.insert(key(m), new);
                matches!(event, watcher::Event::InitApply(_)) || before != Some(new)
            }
            watcher::Event::Delete(o) => {
                self.0.remove(&key(&o.metadata));
                true
            }
            watcher::Event::Init | watcher::Event::InitDone => true,
        }
    }
}

/// A `kubernetes.io/tls` Secret's `tls.crt` and `tls.key` and its resourceVersion, read from
/// the API server; `Ok(None)` if it is gone or of another type. The caller holds it no longer
/// than it must.
pub async fn secret_data(
    client: &Client,
    namespace: &str,
    name: &str,
) -> kube::Result<Option<(String, Option<Vec<u8>>, Option<Vec<u8>>)>> {
    let Some(mut secret) =
        Api::<Secret>::namespaced(client.clone(), namespace).get_opt(name).await?
    else {
        return Ok(None);
    };
    if secret.type_.as_deref() != Some(crate::core::tls_secrets::SECRET_TYPE) {
        return Ok(None);
    }
    let mut data = secret.data.take().unwrap_or_default();
    let mut take = |k: &str| data.remove(k).map(|b| b.0);
    let (crt, key) = (take("tls.crt"), take("tls.key"));
    Ok(Some((secret.metadata.resource_version.unwrap_or_default(), crt, key)))
}

/// The EndpointSlice API the server prefers (`discovery.k8s.io/v1` from Kubernetes 1.21,
/// `v1beta1` on 1.17 to 1.20), or `None` when it serves neither: then `Local` Services are
/// routed to every node, as without endpoints. Retries until the server answers.
pub async fn endpoint_slice_api(client: &Client) -> Option<ApiResource> {
    loop {
        match kube::discovery::group(client, "discovery.k8s.io").await {
            Ok(group) => {
                let found = group.recommended_kind("EndpointSlice").map(|(ar, _)| ar);
                match &found {
                    Some(ar) => info!(version = %ar.api_version, "watching EndpointSlices"),
                    None => warn!(
                        "discovery.k8s.io serves no EndpointSlice: Local Services go to every node"
                    ),
                }
                return found;
            }
            Err(kube::Error::Discovery(kube::error::DiscoveryError::MissingApiGroup(_))) => {
                warn!("the API server serves no discovery.k8s.io: Local Services go to every node");
                return None;
            }
            Err(e) => {
                warn!(error = %e, "cannot discover the EndpointSlice API; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

impl Caches {
    /// Waits until every cache has its initial list.
    pub async fn ready(&self) -> anyhow::Result<()> {
        self.ingresses.wait_until_ready().await?;
        self.services.wait_until_ready().await?;
        self.nodes.wait_until_ready().await?;
        if let Some(slices) = &self.endpoint_slices {
            slices.wait_until_ready().await?;
        }
        if let Some(secrets) = &self.tls_secrets {
            for store in &secrets.stores {
                store.wait_until_ready().await?;
            }
        }
        if let Some(policy) = &self.policy {
            policy.wait_until_ready().await?;
        }
        if let Some(settings) = &self.settings {
            settings.wait_until_ready().await?;
        }
        if let Some(g) = &self.gateway {
            for store in [&g.classes, &g.gateways, &g.routes, &g.grants] {
                store.wait_until_ready().await?;
            }
            for store in [&g.tls_routes, &g.tcp_routes].into_iter().flatten() {
                store.wait_until_ready().await?;
            }
            g.namespaces.wait_until_ready().await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gateway_api_object_wakes_a_pass_for_its_spec_and_metadata_not_its_status() {
        let route = |generation: i64, annotation: &str, status: &str| -> DynamicObject {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": "shop", "namespace": "shop", "generation": generation,
                             "annotations": {"a": annotation}},
                "status": {"parents": [{"controllerName": status}]}
            }))
            .unwrap()
        };
        let mut seen = SpecSeen::default();
        assert!(seen.wakes(&watcher::Event::Apply(route(1, "x", "none"))));
        assert!(!seen.wakes(&watcher::Event::Apply(route(1, "x", "hafleet"))), "status only");
        assert!(seen.wakes(&watcher::Event::Apply(route(2, "x", "hafleet"))), "a new generation");
        assert!(seen.wakes(&watcher::Event::Apply(route(2, "y", "hafleet"))), "an annotation");
        assert!(seen.wakes(&watcher::Event::Delete(route(2, "y", "hafleet"))));
        assert!(
            seen.wakes(&watcher::Event::Apply(route(2, "y", "hafleet"))),
            "back after a delete"
        );
        assert!(seen.wakes(&watcher::Event::InitApply(route(2, "y", "hafleet"))), "a relist");
    }
}
