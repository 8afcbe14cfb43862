//! `/healthz` and `/readyz` over HTTP, for whatever runs the process (Kubernetes probes,
//! systemd, a load balancer's check). Off unless `--health-addr` is given.
//!
//! - `GET /healthz`: 200 while the process serves requests at all.
//! - `GET /readyz`: 200 once the component does its job (the watcher has published what the
//!   cluster holds, the renderer consumes its stream, the applier has converged on start-up),
//!   503 with the reason before that or when it stops being able to.
//!
//! A few lines of HTTP/1.1 by hand: two fixed answers do not need a web framework.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Where to answer health checks.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// Address to serve `/healthz` and `/readyz` on (e.g. `0.0.0.0:8080` in a pod). Unset: no
    /// health endpoint.
    #[arg(long, env = "HAFLEET_HEALTH_ADDR")]
    pub health_addr: Option<SocketAddr>,
}

/// Whether the component is ready, and why not; shared with the health endpoint.
#[derive(Debug, Clone)]
pub struct Health(Arc<Mutex<Result<(), String>>>);

impl Health {
    /// Not ready yet, for `why`.
    pub fn new(why: &str) -> Health {
        Health(Arc::new(Mutex::new(Err(why.to_owned()))))
    }

    pub fn ready(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Ok(());
    }

    pub fn not_ready(&self, why: &str) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Err(why.to_owned());
    }

    fn state(&self) -> Result<(), String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The answer to a request's first line (`GET /readyz HTTP/1.1`). Pure.
pub fn answer(request_line: &str, health: &Result<(), String>) -> (u16, String) {
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/healthz") => (200, "ok\n".into()),
        ("GET" | "HEAD", "/readyz") => match health {
            Ok(()) => (200, "ready\n".into()),
            Err(why) => (503, format!("not ready: {why}\n")),
        },
        ("GET" | "HEAD", _) => (404, "not found: /healthz or /readyz\n".into()),
        _ => (405, "only GET\n".into()),
    }
}

/// Serves the endpoints on `args.health_addr`, if set, in the background; returns the address
/// bound (a port of 0 picks one).
pub async fn serve(args: &HealthArgs, health: Health) -> std::io::Result<Option<SocketAddr>> {
    let Some(addr) = args.health_addr else { return Ok(None) };
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tracing::info!(addr = %bound, "serving /healthz and /readyz");
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { continue };
            let health = health.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                let read = async {
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return false,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    true
                };
                if !matches!(tokio::time::timeout(Duration::from_secs(5), read).await, Ok(true)) {
                    return;
                }
                let text = String::from_utf8_lossy(&head);
                let (status, body) = answer(text.lines().next().unwrap_or(""), &health.state());
                let reason = match status {
                    200 => "OK",
                    404 => "Not Found",
                    405 => "Method Not Allowed",
                    _ => "Service Unavailable",
                };
                let response = format!(
                    "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok(Some(bound))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_readiness_and_everything_else() {
        let ready = Ok(());
        let waiting = Err("caches not listed yet".to_owned());
        assert_eq!(answer("GET /healthz HTTP/1.1", &waiting).0, 200);
        assert_eq!(answer("GET /readyz HTTP/1.1", &ready), (200, "ready\n".into()));
        let (status, body) = answer("GET /readyz?verbose HTTP/1.1", &waiting);
        assert_eq!((status, body.as_str()), (503, "not ready: caches not listed yet\n"));
        assert_eq!(answer("GET /metrics HTTP/1.1", &ready).0, 404);
        assert_eq!(answer("POST /readyz HTTP/1.1", &ready).0, 405);
        assert_eq!(answer("", &ready).0, 405);
    }
}
