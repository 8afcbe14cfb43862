//! What an Ingress's filter annotations do to requests (issue 31): headers on the way in and
//! out, a path-prefix rewrite, a redirect, a deny list and a rate limit, on every host.

use crate::settings::{head_echo, raw_get_path};
use crate::{World, expect_everywhere};
use anyhow::Result;
use hafleet_tests::fixtures::IngressBuilder;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use std::net::SocketAddr;

/// An Ingress on fleet `edge` for `host` and `path` (Prefix) to Service `service`, with these
/// `hafleet.io/` annotations.
fn annotated(
    name: &str,
    host: &str,
    path: &str,
    service: &str,
    annotations: &[(&str, &str)],
) -> Ingress {
    let b = IngressBuilder::new(name).fleet("edge").annotations(annotations);
    b.route(host, path, service).build()
}

/// Each filter annotation changes what a request gets, on every host: the backend sees the
/// headers set and not the ones removed, and the path rewritten; the client sees the response
/// header; a redirect answers with its Location (path and query kept); a denied source gets
/// 403; past the rate limit, 429. A Service annotated `hafleet.io/send-proxy` gets the PROXY
/// protocol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_filter_annotation_changes_what_a_request_gets() -> Result<()> {
    let world = World::start().await?;
    let stack = &world.stack;
    let node_port =
        u16::try_from(stack.kube.create_nodeport_service("default", "echo", 80).await?)?;
    let mut servers = Vec::new();
    for b in world.backends.iter().filter(|b| b.addr().port() != node_port).take(2) {
        servers.push(head_echo(SocketAddr::new(b.addr().ip(), node_port)).await?);
    }
    // A Service that takes the PROXY protocol: its servers learn the client's address first.
    let proxied = u16::try_from(stack.kube.create_nodeport_service("default", "pecho", 80).await?)?;
    for b in world.backends.iter().filter(|b| b.addr().port() != proxied).take(2) {
        servers.push(head_echo(SocketAddr::new(b.addr().ip(), proxied)).await?);
    }
    let services: Api<Service> = Api::namespaced(stack.kube.client().await?, "default");
    let send = serde_json::json!({"metadata": {"annotations": {"hafleet.io/send-proxy": "v1"}}});
    services.patch("pecho", &PatchParams::default(), &Patch::Merge(&send)).await?;
    let headers = [
        ("request-headers-set", "X-Env: prod\nX-Team: shop"),
        ("request-headers-remove", "X-Debug"),
        ("response-headers-set", "X-Served-By: hafleet"),
        ("rewrite-path-prefix", "/v2"),
    ];
    for ing in [
        annotated("filtered", "api.example.com", "/api", "echo", &headers),
        annotated("proxied", "proxy.example.com", "/", "pecho", &[]),
        annotated("limited", "rate.example.com", "/", "echo", &[("rate-limit", "5")]),
        annotated("denied", "deny.example.com", "/", "web", &[("deny-source", "127.0.0.0/8")]),
        annotated(
            "moved",
            "old.example.com",
            "/",
            "web",
            &[("redirect-prefix", "https://new.example.com"), ("redirect-code", "301")],
        ),
    ] {
        world.ingresses.create(&PostParams::default(), &ing).await?;
    }
    expect_everywhere(stack, "api.example.com", "/api/items", 200, "get /v2/items http/1.1")
        .await?;
    expect_everywhere(stack, "deny.example.com", "/", 403, "").await?;
    expect_everywhere(stack, "old.example.com", "/x", 301, "").await?;
    expect_everywhere(stack, "rate.example.com", "/", 200, "get / http/1.1").await?;
    expect_everywhere(stack, "proxy.example.com", "/", 200, "proxy tcp4 127.0.0.1 ").await?;

    for h in &stack.hosts {
        let addr = h.http_addr();
        let name = h.name();
        let got =
            raw_get_path(addr, "", "api.example.com", "/api/items?q=1", "X-Debug: 1\r\n").await?;
        assert!(got.starts_with("HTTP/1.1 200"), "{name}: {got}");
        let (head, body) = got.split_once("\r\n\r\n").unwrap_or((&got, ""));
        assert!(body.starts_with("get /v2/items?q=1 http/1.1\r\n"), "{name}: {body}");
        assert!(body.contains("x-env: prod\r\n") && body.contains("x-team: shop\r\n"), "{body}");
        assert!(!body.contains("x-debug"), "{name}: a removed header reached the backend: {body}");
        assert!(head.to_ascii_lowercase().contains("x-served-by: hafleet"), "{name}: {head}");
        // The whole prefix only: /apix is not /api's.
        let other = raw_get_path(addr, "", "api.example.com", "/apix", "").await?;
        assert!(other.starts_with("HTTP/1.1 404"), "{name}: {other}");

        let moved = raw_get_path(addr, "", "old.example.com", "/a/b?c=d", "").await?;
        assert!(moved.starts_with("HTTP/1.1 301"), "{name}: {moved}");
        let location = moved.lines().find(|l| l.to_ascii_lowercase().starts_with("location:"));
        assert_eq!(location, Some("location: https://new.example.com/a/b?c=d"), "{name}: {moved}");

        // A second after the last request (the checks above made some): a fresh window.
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        let mut statuses = Vec::new();
        for _ in 0..30 {
            let got = raw_get_path(addr, "", "rate.example.com", "/", "").await?;
            statuses.push(got.get(9..12).unwrap_or_default().to_owned());
        }
        assert!(statuses[..5].iter().all(|s| s == "200"), "{name}: {statuses:?}");
        assert!(statuses.iter().any(|s| s == "429"), "{name}: never limited: {statuses:?}");
    }
    for s in servers {
        s.abort();
    }
    Ok(())
}
