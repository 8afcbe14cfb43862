//! A tiny HTTP backend standing in for kube-proxy at `<node InternalIP>:<nodePort>`.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// Answers every request with `200` (the status `<code>` for `/status/<code>`) and the body
/// `"<name> <request-path>\n"` (after a while for `/slow/<ms>`), then closes the connection. Stops listening (and drops open connections) on drop.
pub struct HttpBackend {
    name: String,
    addr: SocketAddr,
    hits: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for HttpBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpBackend").field("name", &self.name).field("addr", &self.addr).finish()
    }
}

impl HttpBackend {
    /// Listens on `ip:port` (port 0 picks a free one; see [`HttpBackend::addr`]).
    pub async fn start(ip: Ipv4Addr, port: u16, name: &str) -> Result<HttpBackend> {
        HttpBackend::start_with(ip, port, name, false).await
    }

    /// [`HttpBackend::start`], whose body also echoes the request's header lines after its
    /// first line (`"<name> <path>\n<Name: value>\n…"`), as the Gateway API conformance suite's
    /// echo server tells what it got.
    pub async fn start_echoing(ip: Ipv4Addr, port: u16, name: &str) -> Result<HttpBackend> {
        HttpBackend::start_with(ip, port, name, true).await
    }

    async fn start_with(ip: Ipv4Addr, port: u16, name: &str, echo: bool) -> Result<HttpBackend> {
        let listener = TcpListener::bind((ip, port))
            .await
            .with_context(|| format!("backend {name}: bind {ip}:{port}"))?;
        let addr = listener.local_addr()?;
        let hits = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(serve(listener, name.to_string(), hits.clone(), echo));
        Ok(HttpBackend { name: name.to_string(), addr, hits, task })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many requests it has answered.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
}

impl Drop for HttpBackend {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts the open connections too.
        self.task.abort();
    }
}

async fn serve(listener: TcpListener, name: String, hits: Arc<AtomicU64>, echo: bool) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    conns.spawn(answer(stream, name.clone(), hits.clone(), echo));
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn answer(mut stream: TcpStream, name: String, hits: Arc<AtomicU64>, echo: bool) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let read_head = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        true
    };
    if !matches!(tokio::time::timeout(Duration::from_secs(10), read_head).await, Ok(true)) {
        return;
    }
    let text = String::from_utf8_lossy(&head);
    let path = text.split_whitespace().nth(1).unwrap_or("/");
    // `/slow/<ms>`: answers after that long (at most 10 s), as a request in progress; so does
    // `?delay=<n>ms` or `<n>s` on any path, as the Gateway API conformance echo server takes it.
    let delay = path.split_once('?').and_then(|(_, q)| {
        let value = q.split('&').find_map(|p| p.strip_prefix("delay="))?;
        match value.strip_suffix("ms") {
            Some(ms) => ms.parse::<u64>().ok(),
            None => value.strip_suffix('s')?.parse::<u64>().ok().map(|s| s * 1000),
        }
    });
    if let Some(ms) = path.strip_prefix("/slow/").and_then(|ms| ms.parse::<u64>().ok()).or(delay) {
        tokio::time::sleep(Duration::from_millis(ms.min(10_000))).await;
    }
    // `/status/<code>`: answers with that status (a health check that fails, say).
    let status = path
        .strip_prefix("/status/")
        .and_then(|c| c.parse::<u16>().ok())
        .filter(|c| (200..600).contains(c))
        .unwrap_or(200);
    let mut body = format!("{name} {path}\n");
    // Echoing: `X-Echo-Set-Header: A:1, B:2` asks for those headers on the response, as
    // the Gateway API conformance suite's echo server takes it.
    let mut extra = String::new();
    if echo {
        let end = text.find("\r\n\r\n").unwrap_or(text.len());
        for line in text[..end].split("\r\n").skip(1) {
            let Some((n, v)) = line.split_once(':') else { continue };
            if !n.trim().eq_ignore_ascii_case("x-echo-set-header") {
                continue;
            }
            for pair in v.split(',').filter_map(|p| p.split_once(':')) {
                extra.push_str(&format!("{}: {}\r\n", pair.0.trim(), pair.1.trim()));
            }
        }
    }
    if echo {
        let end = text.find("\r\n\r\n").unwrap_or(text.len());
        for line in text[..end].split("\r\n").skip(1) {
            body.push_str(line);
            body.push('\n');
        }
    }
    let response = format!(
        "HTTP/1.1 {status} Hafleet\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         X-Hafleet-Backend: {name}\r\n{extra}Connection: close\r\n\r\n{body}",
        body.len()
    );
    hits.fetch_add(1, Ordering::Relaxed);
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}
