//! The upstream conformance case about the kinds of Services a route may name: Services
//! without a NodePort, reached at their pods (the fleet in pods mode, issue 32).

use super::{Bed, V1, expect_cases, get_, http_route};
use anyhow::Result;
use hafleet_tests::gateway_api::{INFRA_NS, create};
use hafleet_tests::pods::{Condition, Slices, ip, start_pod};
use hafleet_tests::stack::Component;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use serde_json::json;

/// HTTPRouteServiceTypes: a ClusterIP Service whose EndpointSlices are written by hand, a
/// headless Service with a selector, and a headless Service without one each reach the pod
/// their EndpointSlice names. (The test API server runs no EndpointSlice controller: the test
/// writes every slice, as the upstream test writes the manual ones. The Services' port is
/// named `http`, as the slices the test helpers write name theirs; upstream's is
/// `first-port`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_service_types() -> Result<()> {
    let mut bed = Bed::start().await?;
    // Services without a NodePort are reached at their pods: the fleet's default.
    bed.world.stack.restart_with(Component::Watcher, &[("HAFLEET_ENDPOINTS", "edge=pods")])?;
    let pod = start_pod("infra-backend-v1", 3000).await?;
    let services: Api<Service> = Api::namespaced(bed.client.clone(), INFRA_NS);
    let slices = Slices::of(bed.client.clone(), INFRA_NS).await?;
    let kinds = [
        ("manual-endpointslices", false, false),
        ("headless", true, true),
        ("headless-manual-endpointslices", true, false),
    ];
    for (name, headless, selector) in kinds {
        let mut spec = json!({"ports": [{"name": "http", "protocol": "TCP", "port": 8080,
            "targetPort": 3000}]});
        if headless {
            spec["clusterIP"] = json!("None");
        }
        if selector {
            spec["selector"] = json!({"app": "infra-backend-v1"});
        }
        let svc: Service =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))?;
        services.create(&PostParams::default(), &svc).await?;
        slices.put(&format!("{name}-ip4"), name, 3000, &[(ip(&pod), Condition::Ready)]).await?;
    }
    let rule = |path: &str, service: &str| {
        json!({"matches": [{"path": {"type": "Exact", "value": path}}],
               "backendRefs": [{"name": service, "port": 8080}]})
    };
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [
        rule("/manual-endpointslices", "manual-endpointslices"),
        rule("/headless", "headless"),
        rule("/headless-manual-endpointslices", "headless-manual-endpointslices")]});
    create(&bed.client, http_route(INFRA_NS, "service-types", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "service-types"), "same-namespace").await?;
    expect_cases(
        &bed,
        &[
            (get_("/manual-endpointslices"), V1),
            (get_("/headless"), V1),
            (get_("/headless-manual-endpointslices"), V1),
        ],
    )
    .await?;
    assert!(pod.hits() > 0, "the pod answered");
    Ok(())
}
