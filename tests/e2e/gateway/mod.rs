//! The Gateway API (issue 33): the test bed (the upstream CRDs on the test API server), the
//! upstream conformance cases ported (here, [`matching`] and [`filters`]), and hafleet's own
//! cases (an HTTPRoute beside Ingresses).

mod canary;
mod filters;
mod fleets;
mod hostnames;
mod matching;
mod passthrough;
mod services;
mod tcp;
mod tls;

use anyhow::{Context, Result};
use hafleet_tests::gateway_api::install_crds;
use hafleet_tests::{KubeEnv, TestDir};
use kube::api::{Api, DynamicObject, PostParams};

/// The API server built from Debian's Kubernetes 1.20 source with the vendored reflect2
/// v1.0.1 died (`fatal error: fault`) on the first custom resource; built with v1.0.2 it takes
/// the v1.6.1 standard CRDs (without their CEL rules) and stores a GatewayClass and an
/// HTTPRoute that name each other, and gives them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_api_crds_install_and_custom_resources_round_trip() -> Result<()> {
    let kube = KubeEnv::start().await?;
    let work = TestDir::new("gateway-crds")?;
    install_crds(&kube, work.path()).await?;
    let client = kube.client().await?;
    let group = kube::discovery::group(&client, "gateway.networking.k8s.io").await?;
    let resource = |kind: &str| -> Result<kube::api::ApiResource> {
        Ok(group.recommended_kind(kind).with_context(|| format!("no {kind}"))?.0)
    };
    let class_ar = resource("GatewayClass")?;
    let classes: Api<DynamicObject> = Api::all_with(client.clone(), &class_ar);
    let class: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": class_ar.api_version, "kind": "GatewayClass",
        "metadata": {"name": "hafleet"},
        "spec": {"controllerName": "hafleet.io/gateway-controller"}
    }))?;
    classes.create(&PostParams::default(), &class).await?;
    let route_ar = resource("HTTPRoute")?;
    let routes: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &route_ar);
    let route: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": route_ar.api_version, "kind": "HTTPRoute",
        "metadata": {"name": "shop"},
        "spec": {
            "parentRefs": [{"name": "edge"}],
            "hostnames": ["shop.example.com"],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}],
                       "backendRefs": [{"name": "api", "port": 80}]}]
        }
    }))?;
    routes.create(&PostParams::default(), &route).await?;
    let back = classes.get("hafleet").await?;
    assert_eq!(back.data["spec"]["controllerName"], "hafleet.io/gateway-controller");
    let back = routes.get("shop").await?;
    assert_eq!(back.data["spec"]["rules"][0]["backendRefs"][0]["name"], "api");
    // The schema's own defaults still apply: a match without a method, a weight of 1.
    assert_eq!(back.data["spec"]["rules"][0]["backendRefs"][0]["weight"], 1, "{:#}", back.data);
    assert!(kube.client().await?.apiserver_version().await.is_ok(), "the API server still runs");
    Ok(())
}

// The upstream conformance cases (conformance/tests/httproute-*.go at v1.6.1), ported: each
// test is named after its upstream short name, creates what its manifest creates (as JSON)
// on top of the upstream base (tests/src/gateway_api.rs), and checks what the upstream test
// checks, against the real API server, NATS, sshd and HAProxy.

use crate::{CONVERGE, World, expect_everywhere};
use hafleet_tests::gateway_api::{
    APP_NS, BASE_SERVICES, INFRA_NS, WEB_NS, base_objects, conditions_of, create, get,
    has_condition,
};
use hafleet_tests::stack::Component;
use hafleet_tests::{HttpBackend, eventually};
use serde_json::{Value, json};

/// A stack with the Gateway API installed, the upstream base created (its namespaces, its
/// Services with echo servers on both nodes, hafleet's GatewayClass and the Gateways
/// `same-namespace` and `all-namespaces` on fleet `edge`) and the watcher started after it.
pub(crate) struct Bed {
    pub(crate) world: World,
    pub(crate) client: kube::Client,
    _echo: Vec<HttpBackend>,
}

impl Bed {
    pub(crate) async fn start() -> Result<Bed> {
        let mut world = World::start().await?;
        let work = world.stack.dir().join("gateway-crds");
        std::fs::create_dir_all(&work)?;
        install_crds(&world.stack.kube, &work).await?;
        // The watcher finds the Gateway API as it starts.
        world.stack.restart_with(Component::Watcher, &[])?;
        let kube = &world.stack.kube;
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(kube.client().await?);
        for (ns, label) in hafleet_tests::gateway_api::NAMESPACE_LABELS {
            kube.ensure_namespace(ns).await?;
            let labels = json!({"metadata": {"labels": {"gateway-conformance": label}}});
            let patch = kube::api::Patch::Merge(&labels);
            namespaces.patch(ns, &Default::default(), &patch).await?;
        }
        // The World's nodes: where its `web` backends listen.
        let nodes: Vec<std::net::Ipv4Addr> = world.backends[..2]
            .iter()
            .map(|b| match b.addr().ip() {
                std::net::IpAddr::V4(ip) => ip,
                other => panic!("a node on {other}"),
            })
            .collect();
        let mut echo = Vec::new();
        for (ns, name) in BASE_SERVICES {
            let port = u16::try_from(kube.create_nodeport_service(ns, name, 8080).await?)?;
            for ip in &nodes {
                echo.push(HttpBackend::start_echoing(*ip, port, name).await?);
            }
        }
        let client = kube.client().await?;
        for object in base_objects("edge") {
            create(&client, object).await?;
        }
        Ok(Bed { world, client, _echo: echo })
    }

    /// Waits until HTTPRoute `ns/name`'s status for Gateway `gateway` (of namespace
    /// gateway-conformance-infra) has every one of `want` (type, status, reason).
    pub(crate) async fn route_says(
        &self,
        route: (&str, &str),
        gateway: &str,
        want: &[(&str, &str, &str)],
    ) -> Result<()> {
        self.kind_says("HTTPRoute", route, gateway, want).await
    }

    /// [`Bed::route_says`] of a route of `kind` (TLSRoute, say).
    pub(crate) async fn kind_says(
        &self,
        kind: &str,
        (ns, name): (&str, &str),
        gateway: &str,
        want: &[(&str, &str, &str)],
    ) -> Result<()> {
        let client = &self.client;
        let what = format!("{kind} {ns}/{name} on {gateway}: {want:?}");
        eventually(CONVERGE, &what, || async move {
            let route = get(client, kind, Some(ns), name).await?;
            let parents = route.data["status"]["parents"].as_array().cloned().unwrap_or_default();
            let ours = parents
                .iter()
                .find(|p| {
                    p["controllerName"] == hafleet_tests::gateway_api::CONTROLLER_NAME
                        && p["parentRef"]["name"] == gateway
                })
                .with_context(|| format!("no status of hafleet's for {gateway}: {parents:?}"))?;
            let said = conditions_of(ours);
            for (t, s, r) in want {
                anyhow::ensure!(has_condition(&said, t, s, Some(r)), "{said:?}");
            }
            let generation = route.metadata.generation.unwrap_or_default();
            let observed: Vec<i64> = ours["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["observedGeneration"].as_i64())
                .collect();
            anyhow::ensure!(observed.iter().all(|g| *g == generation), "observed {observed:?}");
            Ok(())
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", self.world.stack.logs()))
    }

    pub(crate) async fn accepted_and_resolved(
        &self,
        route: (&str, &str),
        gateway: &str,
    ) -> Result<()> {
        let want = [("Accepted", "True", "Accepted"), ("ResolvedRefs", "True", "ResolvedRefs")];
        self.route_says(route, gateway, &want).await?;
        self.programmed(gateway).await
    }

    /// Waits until HTTPRoute `route` (namespace, name) has at most one parent and none that
    /// accepts it, and Gateway `gateway` (of gateway-conformance-infra) counts no route on any
    /// listener: upstream's HTTPRouteMustHaveNoAcceptedParents and GatewayMustHaveZeroRoutes.
    pub(crate) async fn no_parent_accepts(&self, route: (&str, &str), gateway: &str) -> Result<()> {
        let client = &self.client;
        eventually(CONVERGE, "no parent accepts it, no route attached", || async move {
            let route = get(client, "HTTPRoute", Some(route.0), route.1).await?;
            let parents = route.data["status"]["parents"].as_array().cloned().unwrap_or_default();
            anyhow::ensure!(parents.len() <= 1, "one parent at most: {parents:?}");
            for p in &parents {
                let said = conditions_of(p);
                anyhow::ensure!(!has_condition(&said, "Accepted", "True", None), "{said:?}");
            }
            let gw = get(client, "Gateway", Some(INFRA_NS), gateway).await?;
            let listeners = gw.data["status"]["listeners"].as_array().cloned().unwrap_or_default();
            anyhow::ensure!(!listeners.is_empty(), "no listener status yet");
            anyhow::ensure!(listeners.iter().all(|l| l["attachedRoutes"] == 0), "{listeners:?}");
            Ok(())
        })
        .await
    }

    /// Waits until Gateway `gateway` (of gateway-conformance-infra) and its listeners are
    /// Programmed, as the upstream helpers wait.
    pub(crate) async fn programmed(&self, gateway: &str) -> Result<()> {
        let client = &self.client;
        eventually(CONVERGE, &format!("Gateway {gateway} programmed"), || async move {
            let gw = get(client, "Gateway", Some(INFRA_NS), gateway).await?;
            let status = &gw.data["status"];
            let said = conditions_of(status);
            anyhow::ensure!(has_condition(&said, "Programmed", "True", None), "{said:?}");
            for l in status["listeners"].as_array().into_iter().flatten() {
                let said = conditions_of(l);
                anyhow::ensure!(has_condition(&said, "Programmed", "True", None), "{said:?}");
            }
            Ok(())
        })
        .await
    }
}

/// Gateway `name` of gateway-conformance-infra, on fleet `edge`, with these listeners.
pub(crate) fn infra_gateway(name: &str, listeners: Value) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": INFRA_NS,
            "annotations": {"hafleet.io/fleet": "edge"}},
        "spec": {"gatewayClassName": "hafleet", "listeners": listeners}})
}

/// A listener for routes of its Gateway's namespace: HTTP on port 80, or, given `tls`, HTTPS
/// on 443 with that `tls`.
pub(crate) fn listener(name: &str, hostname: Option<&str>, tls: Option<Value>) -> Value {
    let mut l = json!({"name": name, "port": 80, "protocol": "HTTP",
        "allowedRoutes": {"namespaces": {"from": "Same"}}});
    if let Some(h) = hostname {
        l["hostname"] = json!(h);
    }
    if let Some(tls) = tls {
        l["port"] = json!(443);
        l["protocol"] = json!("HTTPS");
        l["tls"] = tls;
    }
    l
}

pub(crate) fn http_route(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
           "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// Any Host: the upstream cases without hostnames are served for every host.
pub(crate) const ANY: &str = "conformance.example";

/// HTTPRouteSimpleSameNamespace: a route in the Gateway's namespace attaches and reaches
/// infra-backend-v1. Also: the GatewayClass is Accepted; the Gateway is Accepted, and
/// Programmed (naming the version) once every host serves the route; its listener counts the
/// route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_simple_same_namespace() -> Result<()> {
    let bed = Bed::start().await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace"}],
                      "rules": [{"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, "gateway-conformance-infra-test", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "gateway-conformance-infra-test"), "same-namespace")
        .await?;
    expect_everywhere(&bed.world.stack, ANY, "/", 200, "infra-backend-v1 /").await?;
    let client = &bed.client;
    eventually(CONVERGE, "class and Gateway accepted, one route attached", || async move {
        let class = get(client, "GatewayClass", None, "hafleet").await?;
        let said = conditions_of(&class.data["status"]);
        anyhow::ensure!(has_condition(&said, "Accepted", "True", Some("Accepted")), "{said:?}");
        let gw = get(client, "Gateway", Some(INFRA_NS), "same-namespace").await?;
        let said = conditions_of(&gw.data["status"]);
        anyhow::ensure!(has_condition(&said, "Accepted", "True", Some("Accepted")), "{said:?}");
        // Programmed once every host of the fleet serves a version with the route, and
        // that version named.
        anyhow::ensure!(has_condition(&said, "Programmed", "True", Some("Programmed")), "{said:?}");
        let programmed = gw.data["status"]["conditions"].as_array().into_iter().flatten();
        let message = programmed
            .filter(|c| c["type"] == "Programmed")
            .find_map(|c| c["message"].as_str())
            .unwrap_or_default();
        anyhow::ensure!(
            message.contains("version ") && message.contains("on 2 hosts"),
            "{message}"
        );
        let listener = &gw.data["status"]["listeners"][0];
        anyhow::ensure!(listener["attachedRoutes"] == 1, "{listener}");
        let said = conditions_of(listener);
        anyhow::ensure!(has_condition(&said, "Accepted", "True", None), "{said:?}");
        anyhow::ensure!(has_condition(&said, "Programmed", "True", None), "{said:?}");
        Ok(())
    })
    .await
}

/// HTTPRouteCrossNamespace: a route in a namespace the listener selects by label attaches to
/// the Gateway of another namespace and reaches its own namespace's Service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_cross_namespace() -> Result<()> {
    let bed = Bed::start().await?;
    let spec = json!({"parentRefs": [{"name": "backend-namespaces", "namespace": INFRA_NS}],
                      "rules": [{"backendRefs": [{"name": "web-backend", "port": 8080}]}]});
    create(&bed.client, http_route(WEB_NS, "cross-namespace", spec)).await?;
    bed.accepted_and_resolved((WEB_NS, "cross-namespace"), "backend-namespaces").await?;
    expect_everywhere(&bed.world.stack, ANY, "/", 200, "web-backend /").await?;
    // A namespace the selector does not pick: not allowed by the listener.
    let spec = json!({"parentRefs": [{"name": "backend-namespaces", "namespace": INFRA_NS}],
                      "hostnames": ["other.example"],
                      "rules": [{"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, "not-selected", spec)).await?;
    let want = [("Accepted", "False", "NotAllowedByListeners")];
    bed.route_says((INFRA_NS, "not-selected"), "backend-namespaces", &want).await
}

/// HTTPRouteExactPathMatching: `Exact` matches the path alone, case and trailing slash
/// included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_exact_path_matching() -> Result<()> {
    let bed = Bed::start().await?;
    let rule = |path: &str, backend: &str| {
        json!({"matches": [{"path": {"type": "Exact", "value": path}}],
               "backendRefs": [{"name": backend, "port": 8080}]})
    };
    let spec = json!({"parentRefs": [{"name": "same-namespace"}],
                      "rules": [rule("/one", "infra-backend-v1"), rule("/two", "infra-backend-v2")]});
    create(&bed.client, http_route(INFRA_NS, "exact-matching", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "exact-matching"), "same-namespace").await?;
    let stack = &bed.world.stack;
    expect_everywhere(stack, ANY, "/one", 200, "infra-backend-v1 /one").await?;
    expect_everywhere(stack, ANY, "/two", 200, "infra-backend-v2 /two").await?;
    for path in ["/", "/one/example", "/two/", "/Two"] {
        expect_everywhere(stack, ANY, path, 404, "").await?;
    }
    Ok(())
}

/// HTTPRouteInvalidNonExistentBackendRef: a Service that does not exist: ResolvedRefs False
/// (BackendNotFound), and requests get 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_invalid_non_existent_backend_ref() -> Result<()> {
    let bed = Bed::start().await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace"}],
                      "rules": [{"backendRefs": [{"name": "nonexistent", "namespace": INFRA_NS, "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, "invalid-nonexistent-backend-ref", spec)).await?;
    let want = [("Accepted", "True", "Accepted"), ("ResolvedRefs", "False", "BackendNotFound")];
    bed.route_says((INFRA_NS, "invalid-nonexistent-backend-ref"), "same-namespace", &want).await?;
    expect_everywhere(&bed.world.stack, ANY, "/", 500, "").await
}

/// HTTPRouteInvalidCrossNamespaceBackendRef: a Service of another namespace without a
/// ReferenceGrant there: ResolvedRefs False (RefNotPermitted), and requests get 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_invalid_cross_namespace_backend_ref() -> Result<()> {
    let bed = Bed::start().await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace"}],
                      "rules": [{"backendRefs": [{"name": "web-backend", "namespace": WEB_NS, "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, "invalid-cross-namespace-backend-ref", spec)).await?;
    let want = [("Accepted", "True", "Accepted"), ("ResolvedRefs", "False", "RefNotPermitted")];
    bed.route_says((INFRA_NS, "invalid-cross-namespace-backend-ref"), "same-namespace", &want)
        .await?;
    expect_everywhere(&bed.world.stack, ANY, "/", 500, "").await
}

/// HTTPRouteInvalidBackendRefUnknownKind: a backendRef of a kind that is no Service:
/// ResolvedRefs False (InvalidKind), and requests get 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_invalid_backend_ref_unknown_kind() -> Result<()> {
    let bed = Bed::start().await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [{"backendRefs": [
        {"group": "unknownkind.example.com", "kind": "NonExistent", "name": "infra-backend-v1", "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, "invalid-backend-ref-unknown-kind", spec)).await?;
    let want = [("Accepted", "True", "Accepted"), ("ResolvedRefs", "False", "InvalidKind")];
    bed.route_says((INFRA_NS, "invalid-backend-ref-unknown-kind"), "same-namespace", &want).await?;
    expect_everywhere(&bed.world.stack, ANY, "/v2", 500, "").await
}

/// HTTPRouteNoBackendRefs (`httproute-omitted-backendrefs`): a rule without backendRefs (or with an empty list) answers
/// 500; the others still forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_no_backend_refs() -> Result<()> {
    let bed = Bed::start().await?;
    let exact = |path: &str| json!([{"path": {"type": "Exact", "value": path}}]);
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [
        {"matches": exact("/omitted-no-forward")},
        {"matches": exact("/empty-no-forward"), "backendRefs": []},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
         "backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, "omitted-backendrefs", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "omitted-backendrefs"), "same-namespace").await?;
    let stack = &bed.world.stack;
    expect_everywhere(stack, ANY, "/forward", 200, "infra-backend-v1 /forward").await?;
    expect_everywhere(stack, ANY, "/omitted-no-forward", 500, "").await?;
    expect_everywhere(stack, ANY, "/empty-no-forward", 500, "").await
}

/// HTTPRouteInvalidParentRefNotMatchingSectionName: a sectionName no listener has: Accepted
/// False (NoMatchingParent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_invalid_parent_ref_not_matching_section_name() -> Result<()> {
    let bed = Bed::start().await?;
    let name = "httproute-listener-not-matching-section-name";
    let spec = json!({"parentRefs": [{"name": "same-namespace", "namespace": INFRA_NS, "port": 80,
                                      "sectionName": "http1"}],
                      "rules": [{"backendRefs": [{"name": "infra-backend-v1", "kind": "Service", "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, name, spec)).await?;
    let want = [("Accepted", "False", "NoMatchingParent")];
    bed.route_says((INFRA_NS, name), "same-namespace", &want).await
}

/// HTTPRouteObservedGenerationBump: after a change of the route, its conditions say the new
/// generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_observed_generation_bump() -> Result<()> {
    let bed = Bed::start().await?;
    let name = "observed-generation-bump";
    let spec = json!({"parentRefs": [{"name": "same-namespace"}],
                      "rules": [{"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, name, spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, name), "same-namespace").await?;
    let before = get(&bed.client, "HTTPRoute", Some(INFRA_NS), name).await?.metadata.generation;
    let change =
        json!({"spec": {"rules": [{"backendRefs": [{"name": "infra-backend-v2", "port": 8080}]}]}});
    hafleet_tests::gateway_api::patch(&bed.client, "HTTPRoute", (INFRA_NS, name), change).await?;
    // `route_says` waits until every condition's observedGeneration is the route's.
    bed.accepted_and_resolved((INFRA_NS, name), "same-namespace").await?;
    let after = get(&bed.client, "HTTPRoute", Some(INFRA_NS), name).await?.metadata.generation;
    assert_ne!(before, after, "the generation changes with the spec");
    expect_everywhere(&bed.world.stack, ANY, "/", 200, "infra-backend-v2 /").await
}

/// What hafleet does not serve yet refuses the route, never serves it as something else: a
/// regular-expression match gets `Accepted: False` (`UnsupportedValue`) and a Warning Event on
/// the HTTPRoute naming the field, and no request is routed by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_route_asking_for_what_is_not_served_is_refused_and_told() -> Result<()> {
    let bed = Bed::start().await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "hostnames": ["regex.example"],
        "rules": [{"matches": [{"path": {"type": "RegularExpression", "value": "/a.*"}}],
                   "backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, "regex", spec)).await?;
    let want = [("Accepted", "False", "UnsupportedValue")];
    bed.route_says((INFRA_NS, "regex"), "same-namespace", &want).await?;
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(bed.client.clone(), INFRA_NS);
    let events = &events;
    eventually(CONVERGE, "a Warning Event on the HTTPRoute", || async move {
        let all = events.list(&Default::default()).await?.items;
        let told = all.iter().any(|e| {
            let about = e.regarding.as_ref();
            about.and_then(|r| r.kind.as_deref()) == Some("HTTPRoute")
                && about.and_then(|r| r.name.as_deref()) == Some("regex")
                && e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some("InvalidHTTPRoute")
                && e.note.as_deref().is_some_and(|n| n.contains("rules[0].matches[0].path.type"))
        });
        anyhow::ensure!(told, "events: {:?}", all.iter().map(|e| &e.note).collect::<Vec<_>>());
        Ok(())
    })
    .await?;
    expect_everywhere(&bed.world.stack, "regex.example", "/abc", 404, "").await
}

/// HTTPRouteReferenceGrant: with a ReferenceGrant in its namespace, a Service of another
/// namespace is reached; once the grant is deleted, requests get 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_reference_grant() -> Result<()> {
    let bed = Bed::start().await?;
    let grant = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "ReferenceGrant",
        "metadata": {"name": "reference-grant", "namespace": WEB_NS},
        "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": INFRA_NS}],
                 "to": [{"group": "", "kind": "Service", "name": "web-backend"}]}});
    create(&bed.client, grant).await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace"}],
                      "rules": [{"backendRefs": [{"name": "web-backend", "namespace": WEB_NS, "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, "reference-grant", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "reference-grant"), "same-namespace").await?;
    let stack = &bed.world.stack;
    expect_everywhere(stack, ANY, "/", 200, "web-backend /").await?;
    let ar = hafleet_tests::gateway_api::resource("ReferenceGrant");
    let grants: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(bed.client.clone(), WEB_NS, &ar);
    grants.delete("reference-grant", &Default::default()).await?;
    let want = [("ResolvedRefs", "False", "RefNotPermitted")];
    bed.route_says((INFRA_NS, "reference-grant"), "same-namespace", &want).await?;
    expect_everywhere(stack, ANY, "/", 500, "").await
}

fn reference_grant(ns: &str, name: &str, from: Value, to: Value) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "ReferenceGrant",
           "metadata": {"name": name, "namespace": ns},
           "spec": {"from": [from], "to": [to]}})
}

/// HTTPRouteInvalidReferenceGrant: ReferenceGrants that are each wrong in one way (their
/// namespace, the from group, kind or namespace, the to group, kind or name) let nothing
/// through: ResolvedRefs False (RefNotPermitted), and requests get 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_invalid_reference_grant() -> Result<()> {
    let bed = Bed::start().await?;
    let route_from =
        |group: &str, kind: &str, ns: &str| json!({"group": group, "kind": kind, "namespace": ns});
    let to =
        |group: &str, kind: &str, name: &str| json!({"group": group, "kind": kind, "name": name});
    let gw_group = "gateway.networking.k8s.io";
    let good_from = route_from(gw_group, "HTTPRoute", INFRA_NS);
    let good_to = to("", "Service", "web-backend");
    let wrong = [
        (INFRA_NS, "reference-grant-wrong-namespace", good_from.clone(), good_to.clone()),
        (
            WEB_NS,
            "reference-grant-wrong-from-group",
            route_from("not-the-group-youre-looking-for", "HTTPRoute", INFRA_NS),
            good_to.clone(),
        ),
        (
            WEB_NS,
            "reference-grant-wrong-from-kind",
            route_from(gw_group, "Gateway", INFRA_NS),
            good_to.clone(),
        ),
        (
            WEB_NS,
            "reference-grant-wrong-from-namespace",
            route_from(gw_group, "HTTPRoute", "not-the-namespace-youre-looking-for"),
            good_to.clone(),
        ),
        (
            WEB_NS,
            "reference-grant-wrong-to-group",
            good_from.clone(),
            to("not-the-group-youre-looking-for", "Service", "web-backend"),
        ),
        (
            WEB_NS,
            "reference-grant-wrong-to-kind",
            good_from.clone(),
            to("", "Secret", "web-backend"),
        ),
        (
            WEB_NS,
            "reference-grant-wrong-to-name",
            good_from.clone(),
            to("", "Secret", "not-the-service-youre-looking-for"),
        ),
    ];
    for (ns, name, from, to) in wrong {
        create(&bed.client, reference_grant(ns, name, from, to)).await?;
    }
    let spec = json!({"parentRefs": [{"name": "same-namespace"}],
                      "rules": [{"backendRefs": [{"name": "web-backend", "namespace": WEB_NS, "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, "reference-grant", spec)).await?;
    let want = [("Accepted", "True", "Accepted"), ("ResolvedRefs", "False", "RefNotPermitted")];
    bed.route_says((INFRA_NS, "reference-grant"), "same-namespace", &want).await?;
    expect_everywhere(&bed.world.stack, ANY, "/", 500, "").await
}

/// HTTPRoutePartiallyInvalidViaInvalidReferenceGrant: a grant that names one Service lets
/// that rule through (200 from app-backend-v1) while the rule naming its sibling answers 500,
/// and the route says RefNotPermitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_partially_invalid_via_invalid_reference_grant() -> Result<()> {
    let bed = Bed::start().await?;
    let from =
        json!({"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": INFRA_NS});
    let to = json!({"group": "", "kind": "Service", "name": "app-backend-v1"});
    create(&bed.client, reference_grant(APP_NS, "invalid-reference-grant", from, to)).await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [
        {"matches": [{"path": {"type": "PathPrefix", "value": "/v2"}}],
         "backendRefs": [{"name": "app-backend-v2", "namespace": APP_NS, "port": 8080}]},
        {"backendRefs": [{"name": "app-backend-v1", "namespace": APP_NS, "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, "invalid-reference-grant", spec)).await?;
    let want = [("Accepted", "True", "Accepted"), ("ResolvedRefs", "False", "RefNotPermitted")];
    bed.route_says((INFRA_NS, "invalid-reference-grant"), "same-namespace", &want).await?;
    let stack = &bed.world.stack;
    expect_everywhere(stack, ANY, "/v2", 500, "").await?;
    expect_everywhere(stack, ANY, "/", 200, "app-backend-v1 /").await
}

/// HTTPRouteInvalidCrossNamespaceParentRef: a route of another namespace names a Gateway whose
/// listener takes only its own namespace's: Accepted False (NotAllowedByListeners) with its
/// references resolved, no parent accepts it, and the Gateway counts no route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_invalid_cross_namespace_parent_ref() -> Result<()> {
    let bed = Bed::start().await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace", "namespace": INFRA_NS}],
                      "rules": [{"backendRefs": [{"name": "web-backend", "port": 8080}]}]});
    create(&bed.client, http_route(WEB_NS, "invalid-cross-namespace-parent-ref", spec)).await?;
    let want =
        [("Accepted", "False", "NotAllowedByListeners"), ("ResolvedRefs", "True", "ResolvedRefs")];
    bed.route_says((WEB_NS, "invalid-cross-namespace-parent-ref"), "same-namespace", &want).await?;
    bed.no_parent_accepts((WEB_NS, "invalid-cross-namespace-parent-ref"), "same-namespace").await
}

/// One fleet, both APIs: an Ingress and an HTTPRoute route side by side; the version's causes
/// name the HTTPRoute as such; and a host an Ingress's namespace owns is not taken by an
/// HTTPRoute of another namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_route_and_an_ingress_share_a_fleet_and_its_hosts_rules() -> Result<()> {
    let bed = Bed::start().await?;
    bed.world.route("shop", "ing.example.com", "/", "web").await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace"}],
                      "hostnames": ["gw.example.com", "ing.example.com"],
                      "rules": [{"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, "mixed", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "mixed"), "same-namespace").await?;
    let stack = &bed.world.stack;
    expect_everywhere(stack, "gw.example.com", "/", 200, "infra-backend-v1 /").await?;
    // The Ingress's namespace routed ing.example.com first: it keeps it.
    expect_everywhere(stack, "ing.example.com", "/", 200, "web@").await?;
    let versions = stack.versions().await?;
    let named = versions.iter().flat_map(|v| &v.causes).filter_map(|c| c.ingress.as_ref());
    let names: Vec<String> = named.map(|k| k.to_string()).collect();
    assert!(names.iter().any(|n| n == "httproute:gateway-conformance-infra/mixed"), "{names:?}");
    assert!(names.iter().any(|n| n == "default/shop"), "{names:?}");
    let latest = stack.latest_version().await?.context("a version")?;
    let config = &latest.bundle().context("a bundle")?.config;
    assert!(config.contains("be_gateway-conformance-infra_infra-backend-v1_8080"), "{config}");
    Ok(())
}

/// An HTTPRoute change in the history: `why` names the HTTPRoute and what it asks; a rollback
/// serves the route as it was; replay rebuilds both versions byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_and_replay_reproduce_an_http_route_change() -> Result<()> {
    use crate::history::ok;
    let bed = Bed::start().await?;
    let (world, stack) = (&bed.world, &bed.world.stack);
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "hostnames": ["shop.example.com"],
                      "rules": [{"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, "shop", spec)).await?;
    expect_everywhere(stack, "shop.example.com", "/", 200, "infra-backend-v1 /").await?;
    let v1 = stack.latest_version().await?.context("a version")?.version;
    world.report("lb-1", v1).await?;
    world.report("lb-2", v1).await?;
    // The change: everything to v2, and requests with `version: 3` to v3.
    let rules = json!({"spec": {"rules": [
        {"matches": [{"headers": [{"name": "version", "value": "3"}]}],
         "backendRefs": [{"name": "infra-backend-v3", "port": 8080}]},
        {"backendRefs": [{"name": "infra-backend-v2", "port": 8080}]}]}});
    hafleet_tests::gateway_api::patch(&bed.client, "HTTPRoute", (INFRA_NS, "shop"), rules).await?;
    expect_everywhere(stack, "shop.example.com", "/", 200, "infra-backend-v2 /").await?;
    let v2 = stack.latest_version().await?.context("a version")?.version;
    world.report("lb-1", v2).await?;
    world.report("lb-2", v2).await?;
    let why = ok(world, &["history", "why", &v2.to_string()]).await?;
    assert!(why.contains("httproute:gateway-conformance-infra/shop"), "{why}");
    assert!(why.contains("shop.example.com/ (Prefix) when version: 3"), "{why}");
    // Replay rebuilds each version byte for byte, from the stream sequence `why` names.
    for v in [v1, v2] {
        let why: Value = serde_json::from_str(
            &ok(world, &["history", "why", &v.to_string(), "-o", "json"]).await?,
        )?;
        let seq = why["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["stream_seq"].as_u64())
            .max()
            .context("a sequence")?;
        let shown = ok(world, &["history", "show", &v.to_string()]).await?;
        assert_eq!(
            ok(world, &["replay", "--until", &seq.to_string()]).await?,
            shown,
            "version {v}"
        );
    }
    // Rolled back: the route as it was, on every host.
    ok(world, &["rollback", &v1.to_string()]).await?;
    expect_everywhere(stack, "shop.example.com", "/", 200, "infra-backend-v1 /").await
}

/// A request of the upstream cases: method, host, path (and query), headers.
pub(crate) struct Ask<'a> {
    pub(crate) method: &'a str,
    pub(crate) host: &'a str,
    pub(crate) path: &'a str,
    pub(crate) headers: &'a [(&'a str, &'a str)],
}

pub(crate) fn get_(path: &str) -> Ask<'_> {
    Ask { method: "GET", host: ANY, path, headers: &[] }
}

/// Each of `cases` (a request, and the backend that answers it, or `None` for a 404) holds on
/// every host, once the fleet serves the route.
pub(crate) async fn expect_cases(bed: &Bed, cases: &[(Ask<'_>, Option<&str>)]) -> Result<()> {
    let stack = &bed.world.stack;
    for (ask, backend) in cases {
        let what =
            format!("{} {}{} {:?} -> {backend:?}", ask.method, ask.host, ask.path, ask.headers);
        hafleet_tests::assert::on_every_host(stack, CONVERGE, &what, |h| async move {
            let r = hafleet_tests::http_request(
                h.http_addr(),
                ask.method,
                ask.host,
                ask.path,
                ask.headers,
            )
            .await?;
            match backend {
                Some(b) => {
                    let from = r.body.split_whitespace().next().unwrap_or_default();
                    anyhow::ensure!(r.status == 200 && from == *b, "got {} {:?}", r.status, r.body)
                }
                None => anyhow::ensure!(r.status == 404, "got {} {:?}", r.status, r.body),
            }
            Ok(())
        })
        .await?;
    }
    Ok(())
}

pub(crate) const V1: Option<&str> = Some("infra-backend-v1");
pub(crate) const V2: Option<&str> = Some("infra-backend-v2");
pub(crate) const V3: Option<&str> = Some("infra-backend-v3");

pub(crate) fn prefix(value: &str) -> Value {
    json!({"type": "PathPrefix", "value": value})
}

pub(crate) fn backend(name: &str) -> Value {
    json!([{"name": name, "port": 8080}])
}

pub(crate) fn headers(list: &[(&str, &str)]) -> Value {
    list.iter().map(|(n, v)| json!({"name": n, "value": v})).collect()
}
