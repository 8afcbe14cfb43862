//! A WebSocket stand-in: a server behind kube-proxy's address that answers an upgrade and
//! then echoes every byte, and a client that upgrades through HAProxy. Enough of RFC 6455 for
//! a proxy to treat the connection as one (the handshake); the bytes after it are not framed.

use anyhow::{Context as _, Result};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Reads an HTTP head (up to the blank line) one byte at a time, so that nothing after it is
/// taken; `None` if the peer closed first.
async fn read_head(conn: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        if conn.read(&mut byte).await.unwrap_or(0) == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// Listens on `addr`: answers an `Upgrade: websocket` request with 101 and then echoes every
/// byte; any other request with 200 and the body `ws@`. Stops when the task is aborted.
pub async fn upgrade_echo(addr: SocketAddr) -> Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await.with_context(|| format!("bind {addr}"))?;
    Ok(tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Some(head) = read_head(&mut conn).await else { return };
                if !head.to_ascii_lowercase().contains("upgrade: websocket") {
                    let ok = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nws@";
                    let _ = conn.write_all(ok.as_bytes()).await;
                    return;
                }
                // The accept value of RFC 6455's example key, which `upgrade` sends.
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

/// Opens a connection to `addr` and upgrades `GET /socket` for `host` to a WebSocket; the
/// stream after the 101.
pub async fn upgrade(addr: SocketAddr, host: &str) -> Result<TcpStream> {
    let mut conn = TcpStream::connect(addr).await.with_context(|| format!("connect {addr}"))?;
    let request = format!(
        "GET /socket HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    conn.write_all(request.as_bytes()).await?;
    let head = read_head(&mut conn).await.context("closed before the answer")?;
    anyhow::ensure!(head.starts_with("HTTP/1.1 101"), "not upgraded: {head}");
    Ok(conn)
}

/// Sends `message` on an upgraded connection and reads it back, within 5 s.
pub async fn echo(conn: &mut TcpStream, message: &[u8]) -> Result<()> {
    conn.write_all(message).await.context("writing")?;
    let mut back = vec![0u8; message.len()];
    tokio::time::timeout(std::time::Duration::from_secs(5), conn.read_exact(&mut back))
        .await
        .context("no echo in 5 s")?
        .context("closed before the echo")?;
    anyhow::ensure!(back == message, "echoed {:?}", String::from_utf8_lossy(&back));
    Ok(())
}
