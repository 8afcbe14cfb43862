//! Production traffic through the fleet (issue 31): long-lived connections, and what the
//! built-in template does for them.

use crate::{World, expect_everywhere};
use anyhow::{Context as _, Result};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A stand-in for a WebSocket service behind kube-proxy: answers an `Upgrade: websocket`
/// request with 101 and then echoes every byte; any other request with 200 `ws@`.
async fn upgrade_echo(addr: SocketAddr) -> Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    Ok(tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
                    if conn.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
                if !text.contains("upgrade: websocket") {
                    let ok = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nws@";
                    let _ = conn.write_all(ok.as_bytes()).await;
                    return;
                }
                // The accept value of RFC 6455's example key, which the client below sends.
                let switch = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                              Connection: Upgrade\r\n\
                              Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
                if conn.write_all(switch.as_bytes()).await.is_err() {
                    return;
                }
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    }))
}

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
        let mut conn = TcpStream::connect(addr).await?;
        let upgrade = "GET /socket HTTP/1.1\r\nHost: ws.example.com\r\nUpgrade: websocket\r\n\
                       Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
                       Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
        conn.write_all(upgrade.as_bytes()).await?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            anyhow::ensure!(conn.read(&mut byte).await? == 1, "closed before the answer");
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        anyhow::ensure!(head.starts_with("HTTP/1.1 101"), "{head}");
        // Longer than `timeout client 30s` and `timeout server 30s`.
        tokio::time::sleep(Duration::from_secs(35)).await;
        conn.write_all(b"still there?").await.context("writing after the idle time")?;
        let mut echo = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(5), conn.read_exact(&mut echo))
            .await
            .context("no echo")?
            .context("closed during the idle time")?;
        anyhow::ensure!(&echo == b"still there?", "{:?}", String::from_utf8_lossy(&echo));
        anyhow::Ok(())
    };
    let (a, b) = tokio::join!(idle(stack.hosts[0].http_addr()), idle(stack.hosts[1].http_addr()));
    a.context("lb-1")?;
    b.context("lb-2")?;
    for s in servers {
        s.abort();
    }
    Ok(())
}
