//! HTTP probes of a host after a version goes live: `GET <path>` with a `Host` header, sent
//! from the applier to the address HAProxy serves on, must get the expected status before a
//! deadline, or the host goes back to last-known-good.

use hafleet_proto::{HttpHost, HttpPath};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One probe: `GET path` with `Host: host` must answer `status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probe {
    pub path: HttpPath,
    pub host: HttpHost,
    pub status: u16,
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GET http://{}{} expecting {}", self.host, self.path, self.status)
    }
}

/// The status code of an HTTP/1.x response's status line. Pure.
pub fn status_of(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end();
    let mut parts = line.split(' ');
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    let code = parts.next()?;
    (code.len() == 3).then(|| code.parse().ok()).flatten()
}

/// Sends one probe to `address` (`host:port`) and reads the status, within `timeout`.
async fn once(address: &str, probe: &Probe, timeout: Duration) -> Result<u16, String> {
    let exchange = async {
        let mut stream =
            tokio::net::TcpStream::connect(address).await.map_err(|e| format!("connect: {e}"))?;
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: hafleet-applier-probe\r\n\
             Connection: close\r\n\r\n",
            probe.path, probe.host
        );
        stream.write_all(request.as_bytes()).await.map_err(|e| format!("send: {e}"))?;
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.contains(&b'\n') && head.len() < 8192 {
            match stream.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
                Err(e) => return Err(format!("read: {e}")),
            }
        }
        status_of(&head).ok_or_else(|| "no HTTP status line in the answer".to_owned())
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| "timed out".to_owned())?
}

/// Runs every probe against `address` until each has answered its status once, trying again
/// every 200 ms; gives up at `deadline` naming the first probe that has not passed and what it
/// got last.
pub async fn until_pass(address: &str, probes: &[Probe], deadline: Duration) -> Result<(), String> {
    let until = tokio::time::Instant::now() + deadline;
    for probe in probes {
        loop {
            let got = once(address, probe, Duration::from_secs(2)).await;
            match got {
                Ok(status) if status == probe.status => break,
                _ if tokio::time::Instant::now() >= until => {
                    let got = match got {
                        Ok(status) => format!("got {status}"),
                        Err(e) => e,
                    };
                    return Err(format!(
                        "probe {probe} at {address} did not pass within {}s: {got}",
                        deadline.as_secs()
                    ));
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_are_read_strictly() {
        assert_eq!(status_of(b"HTTP/1.1 200 OK\r\nx: y\r\n"), Some(200));
        assert_eq!(status_of(b"HTTP/1.0 503 Service Unavailable\r\n"), Some(503));
        assert_eq!(status_of(b"HTTP/1.1 404\r\n"), Some(404));
        for bad in [&b""[..], b"SSH-2.0-OpenSSH\r\n", b"HTTP/1.1 2000 OK\r\n", b"HTTP/2 200\r\n"] {
            assert_eq!(status_of(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    /// Against a real listener: a probe passes on the expected status, and one that never gets
    /// it fails at the deadline naming the probe and what it got.
    #[tokio::test]
    async fn a_probe_passes_on_its_status_and_fails_at_the_deadline_with_what_it_got() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else { return };
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                let status =
                    if text.contains("Host: ok.test") { "200 OK" } else { "404 Not Found" };
                let _ = s.write_all(format!("HTTP/1.1 {status}\r\n\r\n").as_bytes()).await;
            }
        });
        let probe = |host: &str| Probe {
            path: HttpPath::new("/healthz").unwrap(),
            host: HttpHost::new(host).unwrap(),
            status: 200,
        };
        until_pass(&address, &[probe("ok.test")], Duration::from_secs(2)).await.unwrap();
        let err =
            until_pass(&address, &[probe("ok.test"), probe("bad.test")], Duration::from_secs(1))
                .await
                .unwrap_err();
        assert!(err.contains("GET http://bad.test/healthz expecting 200"), "{err}");
        assert!(err.contains("got 404"), "{err}");
    }
}
