//! A minimal HTTP/1.1 client for tests, and `eventually` for retrying until a condition holds.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `GET path` with a `Host` header and `Connection: close`; returns (status, body).
/// The whole exchange is bounded by 5 s.
pub async fn http_get(addr: SocketAddr, host: &str, path: &str) -> Result<(u16, String)> {
    let r = http_get_full(addr, host, path).await?;
    Ok((r.status, r.body))
}

/// An answer with its headers.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// (name in lowercase, value), in order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }
}

/// [`http_get`], with the answer's headers.
pub async fn http_get_full(addr: SocketAddr, host: &str, path: &str) -> Result<Response> {
    tokio::time::timeout(Duration::from_secs(5), get(addr, host, path))
        .await
        .map_err(|_| anyhow!("GET http://{host}{path} via {addr}: timed out after 5s"))?
        .with_context(|| format!("GET http://{host}{path} via {addr}"))
}

async fn get(addr: SocketAddr, host: &str, path: &str) -> Result<Response> {
    send(addr, "GET", host, path, &[]).await
}

/// A request of `method` for `http://host/path` with these extra headers, sent to `addr`
/// (cut off after 5 s).
pub async fn http_request(
    addr: SocketAddr,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Response> {
    tokio::time::timeout(Duration::from_secs(5), send(addr, method, host, path, headers))
        .await
        .map_err(|_| anyhow!("{method} http://{host}{path} via {addr}: timed out after 5s"))?
        .with_context(|| format!("{method} http://{host}{path} via {addr}"))
}

async fn send(
    addr: SocketAddr,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Response> {
    let mut stream = TcpStream::connect(addr).await?;
    let extra: String = headers.iter().map(|(n, v)| format!("{n}: {v}\r\n")).collect();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: hafleet-tests\r\nAccept: */*\r\n\
         {extra}Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    if method == "HEAD" {
        // No body follows, whatever Content-Length says: read up to the end of the head.
        let mut buf = [0u8; 4096];
        while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await?;
            anyhow::ensure!(n > 0, "closed before the end of the head");
            raw.extend_from_slice(&buf[..n]);
        }
        let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
        raw.truncate(end);
        return parse(&raw, false);
    }
    stream.read_to_end(&mut raw).await?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Result<Response> {
    parse(raw, true)
}

/// A response; `with_body`: as the head says (none for an answer to HEAD).
fn parse(raw: &[u8], with_body: bool) -> Result<Response> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("no end of headers in {:?}", String::from_utf8_lossy(raw)))?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let body = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    let mut content_length = None;
    let mut chunked = false;
    let mut headers = Vec::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        headers.push((name.trim().to_ascii_lowercase(), value.to_owned()));
        if name.eq_ignore_ascii_case("content-length") {
            content_length = value.parse::<usize>().ok();
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        }
    }
    let body = if !with_body {
        Vec::new()
    } else if chunked {
        dechunk(body)?
    } else if let Some(n) = content_length {
        body.get(..n).ok_or_else(|| anyhow!("body shorter than content-length {n}"))?.to_vec()
    } else {
        body.to_vec()
    };
    Ok(Response { status, headers, body: String::from_utf8_lossy(&body).into_owned() })
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = data.windows(2).position(|w| w == b"\r\n").context("truncated chunk size")?;
        let size_text = String::from_utf8_lossy(&data[..eol]);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(data.get(..size).context("truncated chunk")?);
        data = data.get(size + 2..).context("truncated chunk")?;
    }
}

/// Calls `f` every ~100 ms until it returns `Ok`, for at most `timeout` (an attempt that hangs is
/// cut off at the deadline). The error names `what` and carries the last attempt's error.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let start = Instant::now();
    let deadline = start + timeout;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let last = match tokio::time::timeout(remaining, f()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => e,
            Err(_) => anyhow!("attempt still running at the deadline"),
        };
        if Instant::now() >= deadline {
            bail!(
                "not true within {timeout:?} ({attempts} attempts): {what}; last error: {last:#}"
            );
        }
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(Duration::from_millis(100).min(left)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcdef").unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "abc"));
        assert_eq!(r.header("CONTENT-length"), Some("3"));
        let raw = b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let r = parse_response(raw).unwrap();
        assert_eq!((r.status, r.body.as_str()), (404, "abcde"));
        let r = parse_response(b"HTTP/1.0 503 X\r\n\r\nall").unwrap();
        assert_eq!((r.status, r.body.as_str(), r.header("x")), (503, "all", None));
    }
}
