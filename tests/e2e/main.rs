//! End-to-end: real kube-apiserver, NATS, sshd and HAProxy, and the three hafleet binaries as
//! processes. Each test starts its own stack on its own loopback addresses and ports.

use anyhow::Result;
use hafleet_tests::stack::Stack;
use hafleet_tests::{HttpBackend, eventually, http_get, random_loopback_ip};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use std::net::Ipv4Addr;
use std::time::Duration;

/// How long a change may take to reach every HAProxy host. Generous: CI machines are small and
/// the first rollout also warms up SSH.
const CONVERGE: Duration = Duration::from_secs(60);

fn ingress(name: &str, fleet: Option<&str>, host: &str, path: &str, service: &str) -> Ingress {
    let annotations = fleet.map(|f| json!({"hafleet.io/fleet": f})).unwrap_or(json!({}));
    serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"rules": [{"host": host, "http": {"paths": [{
            "path": path, "pathType": "Prefix",
            "backend": {"service": {"name": service, "port": {"number": 80}}}
        }]}}]}
    }))
    .unwrap()
}

/// Two Ready nodes and one NodePort Service with a backend on each node at its NodePort (what
/// kube-proxy would do).
async fn service_on_two_nodes(
    stack: &Stack,
    service: &str,
    nodes: &[(String, Ipv4Addr)],
) -> Result<Vec<HttpBackend>> {
    let node_port = stack.kube.create_nodeport_service("default", service, 80).await?;
    let mut backends = Vec::new();
    for (node, ip) in nodes {
        let port = u16::try_from(node_port)?;
        backends.push(HttpBackend::start(*ip, port, &format!("{service}@{node}")).await?);
    }
    Ok(backends)
}

/// Waits until a GET through every HAProxy host of the stack answers `status` with a body
/// starting with `body_prefix`.
async fn expect_everywhere(
    stack: &Stack,
    host: &str,
    path: &str,
    status: u16,
    body_prefix: &str,
) -> Result<()> {
    for h in &stack.hosts {
        let what = format!("{} {host}{path} -> {status} {body_prefix:?}", h.name());
        let addr = h.http_addr();
        eventually(CONVERGE, &what, || async move {
            let (got, body) = http_get(addr, host, path).await?;
            anyhow::ensure!(got == status && body.starts_with(body_prefix), "got {got} {body:?}");
            Ok(())
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotated_ingress_goes_live_on_both_hosts_and_follows_every_change() -> Result<()> {
    let stack = Stack::start("edge", 2).await?;
    let nodes: Vec<(String, Ipv4Addr)> =
        (1..=2).map(|i| (format!("node-{i}"), random_loopback_ip())).collect();
    for (name, ip) in &nodes {
        stack.kube.create_ready_node(name, *ip).await?;
    }
    let _web = service_on_two_nodes(&stack, "web", &nodes).await?;
    let _api = service_on_two_nodes(&stack, "api", &nodes).await?;
    let ingresses: Api<Ingress> = Api::namespaced(stack.kube.client().await?, "default");

    // An Ingress without the annotation is not hafleet's.
    ingresses
        .create(&PostParams::default(), &ingress("other", None, "other.example.com", "/", "web"))
        .await?;
    // The annotated one goes live on both hosts; Prefix matches whole segments only.
    ingresses
        .create(
            &PostParams::default(),
            &ingress("shop", Some("edge"), "shop.example.com", "/app", "web"),
        )
        .await?;
    expect_everywhere(&stack, "shop.example.com", "/app/cart", 200, "web@node-").await?;
    expect_everywhere(&stack, "shop.example.com", "/app", 200, "web@node-").await?;
    expect_everywhere(&stack, "SHOP.example.com:80", "/app", 200, "web@node-").await?;
    expect_everywhere(&stack, "shop.example.com", "/application", 404, "").await?;
    expect_everywhere(&stack, "other.example.com", "/", 404, "").await?;
    for h in &stack.hosts {
        let live = h.live_config();
        assert!(live.contains("shop.example.com"), "{}: {live}", h.name());
        assert!(!live.contains("other.example.com"), "unannotated Ingress reached {}", h.name());
    }

    // A new host and path, pointing at another Service: the old ones stop routing.
    let mut changed = ingresses.get("shop").await?;
    changed.spec = ingress("shop", None, "api.example.com", "/v1", "api").spec;
    ingresses.replace("shop", &PostParams::default(), &changed).await?;
    expect_everywhere(&stack, "api.example.com", "/v1/users", 200, "api@node-").await?;
    expect_everywhere(&stack, "shop.example.com", "/app", 404, "").await?;

    // Deleted: nothing routes any more.
    ingresses.delete("shop", &DeleteParams::default()).await?;
    expect_everywhere(&stack, "api.example.com", "/v1/users", 404, "").await?;
    Ok(())
}
