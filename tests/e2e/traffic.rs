//! Production traffic through the fleet (issue 31): long-lived connections, and what the
//! built-in template does for them.

use crate::{World, expect_everywhere};
use anyhow::{Context as _, Result};
use hafleet_tests::websocket::{echo, upgrade, upgrade_echo};
use std::net::SocketAddr;
use std::time::Duration;

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
