//! Gateways on several fleets. A Gateway's addresses are its fleet's (its HAProxy hosts), so
//! Gateways that must answer apart, as upstream's have addresses of their own, are on fleets
//! of their own; an HTTPRoute attached to Gateways of two fleets is served by each.

use super::{ANY, Bed, INFRA_NS, backend, http_route, prefix};
use crate::{expect_everywhere, expect_on};
use anyhow::Result;
use hafleet_tests::gateway_api::{create, patch};
use serde_json::json;

/// HTTPRouteMultipleGateways: a route attached to Gateways `same-namespace` and
/// `all-namespaces` answers `/shared` through each, and each Gateway's dedicated route answers
/// `/` through that Gateway only. Here `all-namespaces` is moved to fleet `core` (its own
/// host). Then (hafleet's own) the shared route leaves `all-namespaces`: fleet core stops
/// serving it, so `/shared` falls to core's dedicated route, while edge keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_multiple_gateways() -> Result<()> {
    let bed = Bed::start().await?;
    let stack = &bed.world.stack;
    let core = stack.start_extra_fleet("core", 1).await?;
    let on_core = json!({"metadata": {"annotations": {"hafleet.io/fleet": "core"}}});
    patch(&bed.client, "Gateway", (INFRA_NS, "all-namespaces"), on_core).await?;
    let rule = |path: &str, to: &str| json!({"matches": [{"path": prefix(path)}], "backendRefs": backend(to)});
    let routes = [
        (
            "multiple-gateways-shared-route",
            json!([{"name": "same-namespace"}, {"name": "all-namespaces"}]),
            rule("/shared", "infra-backend-v1"),
        ),
        (
            "same-namespace-dedicated-route",
            json!([{"name": "same-namespace"}]),
            rule("/", "infra-backend-v2"),
        ),
        (
            "all-namespaces-dedicated-route",
            json!([{"name": "all-namespaces"}]),
            rule("/", "infra-backend-v3"),
        ),
    ];
    for (name, parents, rule) in &routes {
        let spec = json!({"parentRefs": parents, "rules": [rule]});
        create(&bed.client, http_route(INFRA_NS, name, spec)).await?;
    }
    for (gateway, dedicated) in [
        ("same-namespace", "same-namespace-dedicated-route"),
        ("all-namespaces", "all-namespaces-dedicated-route"),
    ] {
        for route in ["multiple-gateways-shared-route", dedicated] {
            bed.accepted_and_resolved((INFRA_NS, route), gateway).await?;
        }
    }
    expect_everywhere(stack, ANY, "/shared", 200, "infra-backend-v1 /shared").await?;
    expect_everywhere(stack, ANY, "/", 200, "infra-backend-v2 /").await?;
    expect_on(&core.hosts, stack, ANY, "/shared", 200, "infra-backend-v1 /shared").await?;
    expect_on(&core.hosts, stack, ANY, "/", 200, "infra-backend-v3 /").await?;

    let only_edge = json!({"spec": {"parentRefs": [{"name": "same-namespace"}]}});
    patch(&bed.client, "HTTPRoute", (INFRA_NS, "multiple-gateways-shared-route"), only_edge)
        .await?;
    expect_on(&core.hosts, stack, ANY, "/shared", 200, "infra-backend-v3 /shared").await?;
    expect_everywhere(stack, ANY, "/shared", 200, "infra-backend-v1 /shared").await?;
    Ok(())
}
