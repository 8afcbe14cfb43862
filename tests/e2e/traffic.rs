//! Production traffic through the fleet (issue 31): long-lived connections, and what the
//! built-in template does for them.

use crate::{CONVERGE, World, expect_everywhere};
use anyhow::{Context as _, Result};
use hafleet_tests::assert::on_every_host;
use hafleet_tests::fixtures::IngressBuilder;
use hafleet_tests::stack::Component;
use hafleet_tests::websocket::{echo, upgrade, upgrade_echo};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An upgraded connection idle for longer than the client and server timeouts (30 s) is
/// still open, on every host: the template's `timeout tunnel` applies to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_idle_longer_than_the_client_timeout_stays_open() -> Result<()> {
    let world = World::start().await?;
    let stack = &world.stack;
    let node_port = u16::try_from(stack.kube.create_nodeport_service("default", "ws", 80).await?)?;
    // The nodes are where web's backends listen (web@node-1, web@node-2).
    let mut servers = Vec::new();
    for b in world.backends.iter().filter(|b| b.addr().port() != node_port).take(2) {
        servers.push(upgrade_echo(SocketAddr::new(b.addr().ip(), node_port)).await?);
    }
    world.route("ws", "ws.example.com", "/", "ws").await?;
    expect_everywhere(stack, "ws.example.com", "/", 200, "ws@").await?;
    let idle = |addr: SocketAddr| async move {
        let mut conn = upgrade(addr, "ws.example.com").await?;
        // Longer than `timeout client 30s` and `timeout server 30s`.
        tokio::time::sleep(Duration::from_secs(40)).await;
        echo(&mut conn, b"still there?").await.context("after the idle time")
    };
    let (a, b) = tokio::join!(idle(stack.hosts[0].http_addr()), idle(stack.hosts[1].http_addr()));
    a.context("lb-1")?;
    b.context("lb-2")?;
    for s in servers {
        s.abort();
    }
    Ok(())
}

/// A stand-in for a Service behind kube-proxy that reads a request's whole body
/// (`Content-Length`) before it answers with it: a request whose client pauses in its body
/// is in progress until the client goes on.
async fn body_echo(addr: SocketAddr) -> Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    Ok(tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                let end = loop {
                    if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        break end + 4;
                    }
                    match conn.read(&mut buf).await {
                        Ok(n) if n > 0 && got.len() < 64 * 1024 => got.extend_from_slice(&buf[..n]),
                        _ => return,
                    }
                };
                let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while got.len() < end + length {
                    match conn.read(&mut buf).await {
                        Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                        _ => return,
                    }
                }
                let body = &got[end..end + length];
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(&[answer.as_bytes(), body].concat()).await;
            });
        }
    }))
}

/// A POST to `host` whose 5-byte body comes in two parts, `pause` apart; the whole answer,
/// or what came of it before the connection closed.
async fn paused_post(addr: SocketAddr, host: &str, pause: Duration) -> Result<String> {
    let mut conn = TcpStream::connect(addr).await?;
    let head = format!(
        "POST /upload HTTP/1.1\r\nHost: {host}\r\nContent-Length: 5\r\nConnection: close\r\n\r\nab"
    );
    conn.write_all(head.as_bytes()).await?;
    tokio::time::sleep(pause).await;
    // HAProxy may have given up and closed by now: what it answered is the result.
    let _ = conn.write_all(b"cde").await;
    let mut answer = Vec::new();
    let read = conn.read_to_end(&mut answer);
    match tokio::time::timeout(Duration::from_secs(15), read).await {
        Ok(_) => Ok(String::from_utf8_lossy(&answer).into_owned()),
        Err(_) => anyhow::bail!("no answer in 15 s"),
    }
}

/// A route's own client timeout (`hafleet.io/timeout-client`) where HAProxy can set one per
/// request (3.0 and later): with the fleet's `timeout-client` at 1s, a request body that
/// pauses for 3 s passes on the route that sets 10s and is cut on a route that sets none.
/// Older HAProxy keeps the fleet's timeout for both routes (the line is skipped): the route
/// that sets one still serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_s_own_client_timeout_outlasts_the_fleet_s_where_haproxy_can_set_it() -> Result<()>
{
    let mut world = World::start().await?;
    let kube = &world.stack.kube;
    let node_port = u16::try_from(kube.create_nodeport_service("default", "upload", 80).await?)?;
    let mut servers = Vec::new();
    for b in world.backends.iter().filter(|b| b.addr().port() != node_port).take(2) {
        servers.push(body_echo(SocketAddr::new(b.addr().ip(), node_port)).await?);
    }
    kube.ensure_namespace("hafleet").await?;
    world.stack.restart_with(Component::Watcher, &[("HAFLEET_SETTINGS_NAMESPACE", "hafleet")])?;
    let stack = &world.stack;
    let maps: Api<ConfigMap> = Api::namespaced(stack.kube.client().await?, "hafleet");
    let settings = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "hafleet-fleet-edge"},
        "data": {"timeout-client": "1s"}
    }))?;
    maps.create(&PostParams::default(), &settings).await?;
    let patient = IngressBuilder::new("patient")
        .fleet("edge")
        .annotations(&[("timeout-client", "10s")])
        .route("patient.example.com", "/", "upload")
        .build();
    world.ingresses.create(&PostParams::default(), &patient).await?;
    world.route("hasty", "hasty.example.com", "/", "upload").await?;
    expect_everywhere(stack, "patient.example.com", "/", 200, "").await?;
    expect_everywhere(stack, "hasty.example.com", "/", 200, "").await?;
    on_every_host(
        stack,
        CONVERGE,
        "runs the fleet's and the route's client timeouts",
        |h| async move {
            let live = h.live_config();
            anyhow::ensure!(live.contains("timeout client 1s"), "no fleet timeout yet");
            anyhow::ensure!(
                live.contains("http-request set-timeout client"),
                "no route timeout yet"
            );
            Ok(())
        },
    )
    .await?;

    let pause = Duration::from_secs(3);
    for h in &stack.hosts {
        let (name, addr) = (h.name(), h.http_addr());
        let version = h.haproxy_version()?;
        let passed = paused_post(addr, "patient.example.com", pause).await?;
        assert!(passed.starts_with("HTTP/1.1 200"), "{name} ({version}): {passed}");
        assert!(passed.ends_with("\r\n\r\nabcde"), "{name} ({version}): {passed}");
        let cut = paused_post(addr, "hasty.example.com", pause).await?;
        let major: u32 = version.split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
        if major >= 3 {
            assert!(!cut.starts_with("HTTP/1.1 200"), "{name} ({version}): not cut: {cut}");
        }
    }
    for s in servers {
        s.abort();
    }
    Ok(())
}
