//! TCPRoutes: every connection to a TCP listener's port, on each host of the fleet, goes to
//! the route's backends. Ported from the upstream conformance cases
//! (`conformance/tests/tcproute-*.go`, v1.6.1), with echo servers that name their Service.

use super::Bed;
use crate::CONVERGE;
use anyhow::{Context as _, Result};
use hafleet_tests::eventually;
use hafleet_tests::gateway_api::{APP_NS, INFRA_NS, create, get};
use serde_json::{Value, json};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A TCP echo of the upstream kind: on each connection, reads what the client sends first
/// and answers with `name` (its Service), then closes.
async fn tcp_echo(addr: SocketAddr, name: &str) -> Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let name = name.to_owned();
    Ok(tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let name = name.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                if matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {
                    let _ = conn.write_all(format!("{name}\n").as_bytes()).await;
                }
            });
        }
    }))
}

/// Service `name` of `ns` on port 3000, with a TCP echo on each of the bed's nodes.
async fn echo_service(bed: &Bed, ns: &str, name: &str) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let kube = &bed.world.stack.kube;
    let port = u16::try_from(kube.create_nodeport_service(ns, name, 3000).await?)?;
    let mut servers = Vec::new();
    for b in &bed.world.backends[..2] {
        servers.push(tcp_echo(SocketAddr::new(b.addr().ip(), port), name).await?);
    }
    Ok(servers)
}

/// Gateway `name` of gateway-conformance-infra on fleet `edge` with TCP listeners
/// (name, port) taking TCPRoutes.
fn tcp_gateway(name: &str, listeners: &[(&str, u16)]) -> Value {
    let listeners: Vec<Value> = listeners
        .iter()
        .map(|(l, port)| {
            json!({"name": l, "port": port, "protocol": "TCP",
                   "allowedRoutes": {"kinds": [{"kind": "TCPRoute"}]}})
        })
        .collect();
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": INFRA_NS, "annotations": {"hafleet.io/fleet": "edge"}},
        "spec": {"gatewayClassName": "hafleet", "listeners": listeners}})
}

/// TCPRoute `name` of gateway-conformance-infra with `parent` and one rule to `backends`.
fn tcp_route(name: &str, parent: Value, backends: Value) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "TCPRoute",
        "metadata": {"name": name, "namespace": INFRA_NS},
        "spec": {"parentRefs": [parent], "rules": [{"backendRefs": backends}]}})
}

/// What one connection to `port` of `host`'s address gets: the echo's name.
async fn echo_at(host: &hafleet_tests::HaproxyHost, port: u16) -> Result<String> {
    let addr = SocketAddr::new(host.http_addr().ip(), port);
    let mut conn = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        tokio::net::TcpStream::connect(addr),
    )
    .await
    .context("connect timed out")??;
    conn.write_all(b"ping\n").await?;
    let mut answer = String::new();
    tokio::time::timeout(std::time::Duration::from_secs(5), conn.read_to_string(&mut answer))
        .await
        .context("no answer in 5 s")??;
    Ok(answer.trim().to_owned())
}

/// Waits until every host answers connections to each `port` with the echo named with it.
async fn every_host_echoes(bed: &Bed, want: &[(u16, &str)]) -> Result<()> {
    for h in &bed.world.stack.hosts {
        for (port, name) in want {
            let what = format!("{}:{port} -> {name}", h.name());
            eventually(CONVERGE, &what, || async move {
                let got = echo_at(h, *port).await?;
                anyhow::ensure!(got == *name, "got {got:?}");
                Ok(())
            })
            .await?;
        }
    }
    Ok(())
}

/// TCPRouteParentRefPortAndSectionName: three TCPRoutes attach to a Gateway's three TCP
/// listeners by port, by sectionName and by both; each port of every host reaches its
/// route's backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_route_parent_ref_port_and_section_name() -> Result<()> {
    let bed = Bed::start().await?;
    let mut servers = Vec::new();
    for name in ["tcp-echo-one", "tcp-echo-two", "tcp-echo-three"] {
        servers.extend(echo_service(&bed, INFRA_NS, name).await?);
    }
    let gw = "tcp-multi-listener-gateway";
    let parent = |extra: Value| {
        let mut p = json!({"name": gw});
        p.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
        p
    };
    let backend = |name: &str| json!([{"name": name, "port": 3000}]);
    for object in [
        tcp_gateway(gw, &[("one", 9300), ("two", 9301), ("three", 9302)]),
        tcp_route("tcp-route-by-port", parent(json!({"port": 9300})), backend("tcp-echo-one")),
        tcp_route(
            "tcp-route-by-section",
            parent(json!({"sectionName": "two"})),
            backend("tcp-echo-two"),
        ),
        tcp_route(
            "tcp-route-by-section-and-port",
            parent(json!({"sectionName": "three", "port": 9302})),
            backend("tcp-echo-three"),
        ),
    ] {
        create(&bed.client, object).await?;
    }
    let want = [("Accepted", "True", "Accepted"), ("ResolvedRefs", "True", "ResolvedRefs")];
    for route in ["tcp-route-by-port", "tcp-route-by-section", "tcp-route-by-section-and-port"] {
        bed.kind_says("TCPRoute", (INFRA_NS, route), gw, &want).await?;
    }
    every_host_echoes(
        &bed,
        &[(9300, "tcp-echo-one"), (9301, "tcp-echo-two"), (9302, "tcp-echo-three")],
    )
    .await
}

/// TCPRouteParentRefAttachAll: a TCPRoute whose parentRef names neither a section nor a port
/// attaches to every TCP listener of the Gateway; each port reaches its backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_route_parent_ref_attach_all() -> Result<()> {
    let bed = Bed::start().await?;
    let _servers = echo_service(&bed, INFRA_NS, "tcp-echo-attach-all").await?;
    let gw = "tcp-attach-all-gateway";
    create(&bed.client, tcp_gateway(gw, &[("one", 9310), ("two", 9311)])).await?;
    let backend = json!([{"name": "tcp-echo-attach-all", "port": 3000}]);
    create(&bed.client, tcp_route("tcp-route-attach-all", json!({"name": gw}), backend)).await?;
    let want = [("Accepted", "True", "Accepted"), ("ResolvedRefs", "True", "ResolvedRefs")];
    bed.kind_says("TCPRoute", (INFRA_NS, "tcp-route-attach-all"), gw, &want).await?;
    every_host_echoes(&bed, &[(9310, "tcp-echo-attach-all"), (9311, "tcp-echo-attach-all")]).await
}

/// TCPRouteMultipleRoutesAttachment: two TCPRoutes on one listener are both Accepted and
/// counted (2 attached routes); only the older one's backend gets connections (100 of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_route_multiple_routes_attachment() -> Result<()> {
    let bed = Bed::start().await?;
    let mut servers = echo_service(&bed, INFRA_NS, "tcp-attach-backend-1").await?;
    servers.extend(echo_service(&bed, INFRA_NS, "tcp-attach-backend-2").await?);
    let gw = "tcp-multi-route-attach-gateway";
    create(&bed.client, tcp_gateway(gw, &[("tcp", 9320)])).await?;
    let parent = json!({"name": gw, "sectionName": "tcp"});
    let older = tcp_route(
        "tcproute-attach-older",
        parent.clone(),
        json!([{"name": "tcp-attach-backend-1", "port": 3000}]),
    );
    create(&bed.client, older).await?;
    let want = [("Accepted", "True", "Accepted")];
    bed.kind_says("TCPRoute", (INFRA_NS, "tcproute-attach-older"), gw, &want).await?;
    every_host_echoes(&bed, &[(9320, "tcp-attach-backend-1")]).await?;
    // Creation times have second precision: the newer one is strictly newer.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let newer = tcp_route(
        "tcproute-attach-newer",
        parent,
        json!([{"name": "tcp-attach-backend-2", "port": 3000}]),
    );
    create(&bed.client, newer).await?;
    bed.kind_says("TCPRoute", (INFRA_NS, "tcproute-attach-newer"), gw, &want).await?;
    let client = &bed.client;
    eventually(CONVERGE, "the listener counts both routes", || async move {
        let gw = get(client, "Gateway", Some(INFRA_NS), gw).await?;
        let attached = &gw.data["status"]["listeners"][0]["attachedRoutes"];
        anyhow::ensure!(*attached == 2, "{attached}");
        Ok(())
    })
    .await?;
    for i in 0..100 {
        let host = &bed.world.stack.hosts[i % bed.world.stack.hosts.len()];
        let got = echo_at(host, 9320).await?;
        anyhow::ensure!(got == "tcp-attach-backend-1", "connection {i} reached {got:?}");
    }
    Ok(())
}

/// TCPRouteWeightedRouting: 70/30/0 weights share 500 connections within 5 points each (up to
/// ten tries), the weight-0 backend none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_route_weighted_routing() -> Result<()> {
    let bed = Bed::start().await?;
    let mut servers = Vec::new();
    for name in ["tcp-backend-v1", "tcp-backend-v2", "tcp-backend-v3"] {
        servers.extend(echo_service(&bed, INFRA_NS, name).await?);
    }
    let gw = "tcp-weighted-gateway";
    create(&bed.client, tcp_gateway(gw, &[("tcp", 9330)])).await?;
    let backends = json!([
        {"name": "tcp-backend-v1", "port": 3000, "weight": 70},
        {"name": "tcp-backend-v2", "port": 3000, "weight": 30},
        {"name": "tcp-backend-v3", "port": 3000, "weight": 0}]);
    create(
        &bed.client,
        tcp_route("tcp-weighted-route", json!({"name": gw, "sectionName": "tcp"}), backends),
    )
    .await?;
    let want = [("Accepted", "True", "Accepted"), ("ResolvedRefs", "True", "ResolvedRefs")];
    bed.kind_says("TCPRoute", (INFRA_NS, "tcp-weighted-route"), gw, &want).await?;
    let hosts = &bed.world.stack.hosts;
    for h in hosts {
        eventually(CONVERGE, &format!("{} serves port 9330", h.name()), || async move {
            echo_at(h, 9330).await.map(|_| ())
        })
        .await?;
    }
    let mut last = String::new();
    for _ in 0..10 {
        let mut counts = std::collections::BTreeMap::<String, u32>::new();
        for i in 0..500 {
            *counts.entry(echo_at(&hosts[i % hosts.len()], 9330).await?).or_default() += 1;
        }
        let share = |b: &str| f64::from(counts.get(b).copied().unwrap_or(0)) / 500.0;
        let (v1, v2, v3) =
            (share("tcp-backend-v1"), share("tcp-backend-v2"), share("tcp-backend-v3"));
        if (v1 - 0.7).abs() <= 0.05 && (v2 - 0.3).abs() <= 0.05 && v3 == 0.0 {
            return Ok(());
        }
        last = format!("{counts:?}");
    }
    anyhow::bail!("not within 5 points of 70/30/0 in ten tries; last: {last}")
}

/// What a TCPRoute that cannot be served is told, on one bed: TCPRouteInvalidNonTCPListener
/// (a sectionName naming an HTTP listener: NotAllowedByListeners),
/// TCPRouteInvalidBackendRefNonexistent (BackendNotFound) and
/// TCPRouteInvalidCrossNamespaceBackendRef (another namespace's Service without a
/// ReferenceGrant: RefNotPermitted); and TCPRouteReferenceGrant: with the grant, that route
/// reaches the other namespace's backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_route_invalid_cases_and_reference_grant() -> Result<()> {
    let bed = Bed::start().await?;
    let _servers = echo_service(&bed, APP_NS, "tcp-app-backend").await?;
    let client = &bed.client;
    let mut mixed = tcp_gateway("tcp-invalid-gateway", &[("tcp", 9340)]);
    mixed["spec"]["listeners"].as_array_mut().context("listeners")?.push(
        json!({"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "Same"}}}),
    );
    create(client, mixed).await?;
    create(client, tcp_gateway("tcp-grant-gateway", &[("tcp", 9341)])).await?;
    let on = |gw: &str, section: &str| json!({"name": gw, "sectionName": section});
    let app = json!([{"name": "tcp-app-backend", "namespace": APP_NS, "port": 3000}]);
    for route in [
        tcp_route(
            "tcproute-non-tcp-listener",
            on("tcp-invalid-gateway", "http"),
            json!([{"name": "tcp-app-backend", "port": 3000}]),
        ),
        tcp_route(
            "tcproute-nonexistent-backend",
            on("tcp-invalid-gateway", "tcp"),
            json!([{"name": "nonexistent", "port": 3000}]),
        ),
        tcp_route("tcproute-cross-namespace", on("tcp-grant-gateway", "tcp"), app),
    ] {
        create(client, route).await?;
    }
    let cases = [
        (
            "tcproute-non-tcp-listener",
            "tcp-invalid-gateway",
            ("Accepted", "False", "NotAllowedByListeners"),
        ),
        (
            "tcproute-nonexistent-backend",
            "tcp-invalid-gateway",
            ("ResolvedRefs", "False", "BackendNotFound"),
        ),
        (
            "tcproute-cross-namespace",
            "tcp-grant-gateway",
            ("ResolvedRefs", "False", "RefNotPermitted"),
        ),
    ];
    for (route, gw, want) in cases {
        bed.kind_says("TCPRoute", (INFRA_NS, route), gw, &[want]).await?;
    }
    let grant = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "ReferenceGrant",
        "metadata": {"name": "tcp-reference-grant", "namespace": APP_NS},
        "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "TCPRoute", "namespace": INFRA_NS}],
                 "to": [{"group": "", "kind": "Service", "name": "tcp-app-backend"}]}});
    create(client, grant).await?;
    let resolved = [("ResolvedRefs", "True", "ResolvedRefs")];
    let route = (INFRA_NS, "tcproute-cross-namespace");
    bed.kind_says("TCPRoute", route, "tcp-grant-gateway", &resolved).await?;
    every_host_echoes(&bed, &[(9341, "tcp-app-backend")]).await
}
