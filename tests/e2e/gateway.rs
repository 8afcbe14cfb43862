//! The Gateway API (issue 33). So far, the test bed: the upstream CRDs install on the test API
//! server, and it stores and serves custom resources.

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
