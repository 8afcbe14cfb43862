//! Routing cost by number of routes: one Ingress per host (`app-<i>.example.com`, `/`
//! Prefix), rendered by the renderer's own code with the built-in template, served by a
//! real HAProxy started on the rendered files; a load generator of `--connections`
//! keep-alive connections sends `GET /` for `--seconds` per case.

use anyhow::{Context, Result, bail};
use hafleet_proto::{FleetName, IngressKey, NodeAddr, ObjectName};
use hafleet_renderer::core::{model, render::Renderer, state::IngressEntry};
use hafleet_tests::{ChildGuard, HttpBackend, TestDir, free_port, random_loopback_ip};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, clap::Args)]
pub struct RoutingArgs {
    /// Numbers of routes to measure at.
    #[arg(long, value_delimiter = ',', default_value = "10,10000")]
    routes: Vec<usize>,
    /// Seconds of load per case.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Render with this template instead of the built-in one (to compare two templates
    /// in one run: run the bench once with each, back to back).
    #[arg(long)]
    template: Option<std::path::PathBuf>,
    /// Give every route filters (a request and a response header set, a source denied),
    /// which its backend runs on each request it serves.
    #[arg(long)]
    filters: bool,
    /// Make every route an HTTPRoute's that matches a header too (`X-Version: 1`, which every
    /// request sends): each host's path is then a dispatch group, checked by `use_backend`
    /// lines (renderer/src/core/groups.rs).
    #[arg(long)]
    header_matches: bool,
    /// Log every request (the fleet setting `access-log`) as syslog over UDP to a socket the
    /// bench reads: what the route maps looked up for the log line and the line itself cost.
    #[arg(long)]
    access_log: bool,
}

fn ingresses(
    n: usize,
    backend: SocketAddr,
    (filters, header_matches): (bool, bool),
) -> Result<BTreeMap<IngressKey, IngressEntry>> {
    let SocketAddr::V4(addr) = backend else { bail!("IPv4 backend expected") };
    let mut fleet = crate::fleet(n, |_| ("web".to_owned(), addr.port()))?;
    if header_matches {
        use hafleet_proto::{HeaderName, HeaderValue, RouteMore, SourceKind};
        let more = RouteMore {
            headers: vec![(HeaderName::new("X-Version")?, HeaderValue::new("1")?)],
            ..Default::default()
        };
        fleet = fleet
            .into_iter()
            .map(|(key, mut entry)| {
                for route in std::sync::Arc::make_mut(&mut entry.routes).iter_mut() {
                    route.more = Some(Box::new(more.clone()));
                }
                (IngressKey { kind: SourceKind::HttpRoute, ..key }, entry)
            })
            .collect();
    }
    if filters {
        use hafleet_proto::{Cidr, HeaderName, HeaderValue};
        let header =
            |n: &str, v: &str| Ok::<_, anyhow::Error>((HeaderName::new(n)?, HeaderValue::new(v)?));
        let (request, response) = (header("X-Bench", "1")?, header("X-Served-By", "hafleet")?);
        for route in
            fleet.values_mut().flat_map(|e| std::sync::Arc::make_mut(&mut e.routes).iter_mut())
        {
            let o = &mut route.backend.options;
            o.request_headers.set = vec![request.clone()];
            o.response_headers.set = vec![response.clone()];
            o.deny_source = vec![Cidr::parse("192.0.2.0/24")?];
        }
    }
    Ok(fleet)
}

/// Reads one HTTP/1.1 response with a Content-Length body; returns its status and whether
/// the server keeps the connection open.
async fn response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<(u16, bool)> {
    buf.clear();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let status: u16 = head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .context("bad status line")?;
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let close = head.lines().any(|l| l.starts_with("connection:") && l.contains("close"));
            while buf.len() < end + 4 + length {
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    bail!("connection closed inside a body");
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok((status, !close));
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            bail!("connection closed before a response");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Requests/s for `host` over `connections` connections for `seconds`; every answer must
/// have status `expect`.
async fn load(addr: SocketAddr, host: &str, expect: u16, a: &RoutingArgs) -> Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    let extra = if a.header_matches { "X-Version: 1\r\n" } else { "" };
    let request =
        format!("GET / HTTP/1.1\r\nHost: {host}\r\nUser-Agent: hafleet-bench\r\n{extra}\r\n");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..a.connections {
        let request = request.clone();
        tasks.spawn(async move {
            let mut done = 0u64;
            let mut buf = Vec::with_capacity(4096);
            while Instant::now() < deadline {
                let mut stream = TcpStream::connect(addr).await?;
                stream.set_nodelay(true)?;
                loop {
                    stream.write_all(request.as_bytes()).await?;
                    let (status, keep) = response(&mut stream, &mut buf).await?;
                    if status != expect {
                        bail!("answered {status}, expected {expect}");
                    }
                    done += 1;
                    if !keep || Instant::now() >= deadline {
                        break;
                    }
                }
            }
            Ok::<u64, anyhow::Error>(done)
        });
    }
    crate::per_second(tasks).await
}

/// What came to the access-log socket: how many lines, and the routes they named.
#[derive(Debug, Clone, Default)]
struct Logged {
    count: u64,
    routes: std::collections::BTreeSet<String>,
}

/// A UDP socket on `ip` that counts the syslog lines sent to it and keeps the route each
/// names (the word after `route=` or, failing that, nothing), until the bench ends.
async fn log_sink(
    ip: std::net::Ipv4Addr,
) -> Result<(SocketAddr, std::sync::Arc<std::sync::Mutex<Logged>>)> {
    let socket = tokio::net::UdpSocket::bind(SocketAddr::new(ip.into(), 0)).await?;
    let target = socket.local_addr()?;
    let logged = std::sync::Arc::new(std::sync::Mutex::new(Logged::default()));
    let into = std::sync::Arc::clone(&logged);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = socket.recv(&mut buf).await {
            let line = String::from_utf8_lossy(&buf[..n]);
            let Ok(mut l) = into.lock() else { return };
            l.count += 1;
            let route = line.split_whitespace().find_map(|w| w.strip_prefix("route="));
            if let Some(route) = route.filter(|_| l.routes.len() < 64) {
                l.routes.insert(route.to_owned());
            }
        }
    });
    Ok((target, logged))
}

pub async fn run(a: RoutingArgs) -> Result<()> {
    let haproxy = crate::haproxy_bin();
    let ip = random_loopback_ip();
    let backend = HttpBackend::start(ip, free_port(ip.into()), "web@node-1").await?;
    println!(
        "requests/s through one HAProxy, {} keep-alive connections, {} s per case\n",
        a.connections, a.seconds
    );
    println!(
        "| routes | config + maps | haproxy -c | first route | last route | unknown host (404) | last / first | unknown / first |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for &n in &a.routes {
        let dir = TestDir::new("hafleet-bench-routing")?;
        let SocketAddr::V4(addr) = backend.addr() else { bail!("IPv4 backend expected") };
        let nodes = [NodeAddr { name: ObjectName::new("node-1")?, addr: (*addr.ip()).into() }];
        // No node health checks: nothing answers on the node's health port here, and
        // servers that track a failing check would answer 503.
        let options = model::Options { node_health: None, ..Default::default() };
        let fleet = FleetName::new("bench")?;
        let ingresses = ingresses(n, backend.addr(), (a.filters, a.header_matches))?;
        let mut model = model::build_with(&fleet, &ingresses, &nodes, &options);
        let logged = match a.access_log {
            true => {
                let (target, logged) = log_sink(ip).await?;
                let settings = hafleet_proto::FleetSettings {
                    access_log: Some(hafleet_proto::LogTarget::Udp(target)),
                    ..Default::default()
                };
                model.settings = hafleet_renderer::core::settings::SettingsModel::of(&settings);
                Some(logged)
            }
            false => None,
        };
        let bundle = Renderer::load(a.template.as_deref())?.render(&model)?;
        let config = crate::write_bundle(dir.path(), &bundle)?;
        let check_ms = crate::check_config(&config)?;
        let http = SocketAddr::new(ip.into(), free_port(ip.into()));
        let mut cmd = std::process::Command::new(haproxy);
        cmd.arg("-db").arg("-f").arg(&config).env("HAFLEET_HTTP_BIND", http.to_string());
        let mut child = ChildGuard::spawn("haproxy", &mut cmd, &dir.path().join("haproxy.log"))?;
        child
            .wait_ready(Duration::from_secs(30), || async move {
                TcpStream::connect(http).await.is_ok()
            })
            .await?;
        // Warm-up, then the three cases.
        load(http, "app-0.example.com", 200, &RoutingArgs { seconds: 1, ..a.clone_args() }).await?;
        let first = load(http, "app-0.example.com", 200, &a).await?;
        let last = load(http, &format!("app-{}.example.com", n - 1), 200, &a).await?;
        let unknown = load(http, "nobody.example.com", 404, &a).await?;
        if let Some(logged) = logged {
            // Every case's requests were logged, each line naming its route.
            let lines = logged.lock().map(|l| l.clone()).unwrap_or_default();
            let last_route = format!("bench/app-{}", n - 1);
            if lines.count < 1000 || !lines.routes.contains(&last_route) {
                bail!("{} access-log lines came, none naming {last_route}", lines.count);
            }
        }
        println!(
            "| {n} | {:.0} KB | {check_ms:.0} ms | {first:.0} | {last:.0} | {unknown:.0} | {:.0}% | {:.0}% |",
            bundle.size() as f64 / 1e3,
            100.0 * last / first,
            100.0 * unknown / first
        );
        child.kill();
    }
    Ok(())
}

impl RoutingArgs {
    fn clone_args(&self) -> RoutingArgs {
        RoutingArgs {
            routes: self.routes.clone(),
            seconds: self.seconds,
            connections: self.connections,
            template: self.template.clone(),
            filters: self.filters,
            header_matches: self.header_matches,
            access_log: self.access_log,
        }
    }
}
