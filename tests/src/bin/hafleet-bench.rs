//! hafleet-bench: end-to-end latency on real parts. Starts the loopback stack and measures:
//! - one Ingress at a time, of two kinds taken in turn: one on a Service the fleet already
//!   routes to (map entries only: the hosts take it through the runtime API) and one on a new
//!   Service (a new backend: the hosts reload). For each, from `create` returning to the route
//!   answering through every HAProxy host, and each host's apply time and reloads as its
//!   report gives them;
//! - a burst: N Ingresses created back to back, until all answer everywhere, and how many
//!   config versions the renderer made for them (coalescing).
//!
//!
//! `hafleet-bench routing` measures what a request costs with many routes: requests/s through
//! one HAProxy for the first route, the last route and an unknown host, at 10 and 10,000
//! routes, with the config and map files the renderer makes.
//!
//! Run `cargo build --release --workspace --bins && target/release/hafleet-bench`; the numbers
//! and the method are in BENCHMARKS.md.

use anyhow::Result;
use clap::Parser;
use hafleet_proto::IngressKey;
use hafleet_renderer::core::state::IngressEntry;
use hafleet_tests::cluster::{
    create_ingresses, create_services, ready_nodes, service_with_backends,
};
use hafleet_tests::http_get;
use hafleet_tests::stack::{Component, Stack};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, PostParams};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(name = "hafleet-bench", about)]
struct Cli {
    #[command(subcommand)]
    mode: Option<Mode>,
    #[command(flatten)]
    pipeline: Args,
}

#[derive(Debug, clap::Subcommand)]
enum Mode {
    /// Requests/s through one HAProxy for the first route, the last route and an unknown
    /// host, by number of routes.
    Routing(routing::RoutingArgs),
    /// `history list` of 1,000 versions and `replay` of 100,000 route events, each run as
    /// the operator's CLI process against NATS and a running renderer.
    History(history::HistoryArgs),
    /// `haproxy -c`, a reload, and changes through the runtime API, at 10,000 Ingresses on
    /// 200 nodes.
    Reload(reload::ReloadArgs),
    /// The watcher's start: from the process starting to its first full snapshot published,
    /// and its peak memory, with 10,000 Ingresses and 200 nodes in the API server.
    Watcher(watcher::WatcherArgs),
    /// The applier alone against `ansible-playbook` (template task validating with
    /// `haproxy -c`, reload handler), side by side on the same hosts and config: from a
    /// version published (or the playbook started) to live on 1, 5 and 20 hosts.
    Applier(applier::ApplierArgs),
    /// HTTPS: HAProxy alone with 10, 1,000 and 10,000 certificates (check, start, handshakes
    /// per second), then the pipeline: a fleet of TLS Ingresses loaded, a host joining it,
    /// and rotations to served on every host.
    Tls(tls::TlsArgs),
}

#[path = "../bench/tls.rs"]
mod tls;

/// The pipeline bench's settings (the default mode).
#[derive(Debug, clap::Args)]
struct Args {
    /// Ingresses created one at a time, of each kind (on the Service every other Ingress
    /// uses, and on a Service of its own).
    #[arg(long, default_value_t = 30)]
    sequential: usize,
    /// Ingresses created back to back in the burst.
    #[arg(long, default_value_t = 50)]
    burst: usize,
    /// HAProxy hosts in the fleet.
    #[arg(long, default_value_t = 3)]
    hosts: usize,
    /// Ingresses created (16 at a time) before measuring, so that every change is measured
    /// against a fleet of this size.
    #[arg(long, default_value_t = 0)]
    existing: usize,
    /// Give each existing Ingress a NodePort Service of its own (one HAProxy backend each),
    /// instead of pointing them all at one Service (map entries only).
    #[arg(long)]
    own_services: bool,
    /// Ready nodes in the cluster. Only the nodes the renderer lists for a Service (its subset:
    /// the renderer's default `--servers-per-backend`, 3) run a backend process for it.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
}

fn ingress(name: &str, host: &str) -> Ingress {
    ingress_to(name, host, "web")
}

fn ingress_to(name: &str, host: &str, service: &str) -> Ingress {
    hafleet_tests::fixtures::IngressBuilder::new(name)
        .fleet("edge")
        .route(host, "/", service)
        .build()
}

/// One kind of change measured one at a time.
#[derive(Default)]
struct Measured {
    converge: Vec<f64>,
    apply: Vec<f64>,
    /// Bytes of files each host report says were sent.
    sent: Vec<f64>,
    reloads: u32,
    /// New backends the hosts served through spares ahead of their reload.
    bridged: u32,
    reports: u32,
}

impl Measured {
    /// Creates `ing` and waits until `host` answers everywhere; takes each host's report of
    /// the version that made it live.
    async fn change(
        &mut self,
        stack: &Stack,
        api: &Api<Ingress>,
        ing: &Ingress,
        host: &str,
    ) -> Result<()> {
        api.create(&PostParams::default(), ing).await?;
        let started = Instant::now();
        until_served(stack, host).await?;
        self.converge.push(started.elapsed().as_secs_f64() * 1000.0);
        // A host serves the route before the applier reports: wait for the report of the
        // version that made it live.
        let version = stack.latest_version().await?.map(|v| v.version).unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(30);
        for h in &stack.hosts {
            let report = loop {
                match stack.last_report(h.name()).await? {
                    Some(r) if r.version >= version => break r,
                    _ if Instant::now() > deadline => {
                        anyhow::bail!("no report of version {version} from {}", h.name())
                    }
                    _ => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            };
            self.apply.push(report.duration_ms as f64);
            self.sent.push(report.sent_bytes as f64);
            self.reloads += report.reloads;
            self.bridged += report.bridged;
            self.reports += 1;
        }
        Ok(())
    }
}

/// Polls every 5 ms until `host` answers 200 through every HAProxy host; bounded at 120 s.
async fn until_served(stack: &Stack, host: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    for h in &stack.hosts {
        loop {
            if let Ok((200, _)) = http_get(h.http_addr(), host, "/").await {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{host} not served by {}\n{}",
                h.name(),
                stack.logs()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(())
}

/// What `tasks` (each counting what it did until its deadline) did per second, from now until
/// the last one ends; the first that failed is the error.
async fn per_second(mut tasks: tokio::task::JoinSet<Result<u64>>) -> Result<f64> {
    let started = Instant::now();
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

fn percentiles(label: &str, mut ms: Vec<f64>) -> String {
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| ms[((ms.len() as f64 - 1.0) * p).round() as usize];
    format!(
        "| {label} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
        ms.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        ms[ms.len() - 1]
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.mode {
        Some(Mode::Routing(args)) => routing::run(args).await,
        Some(Mode::History(args)) => history::run(args).await,
        Some(Mode::Reload(args)) => reload::run(args).await,
        Some(Mode::Watcher(args)) => watcher::run(args).await,
        Some(Mode::Applier(args)) => applier::run(args).await,
        Some(Mode::Tls(args)) => tls::run(args).await,
        None => pipeline(cli.pipeline).await,
    }
}

async fn pipeline(args: Args) -> Result<()> {
    let mut stack = Stack::start("edge", args.hosts).await?;
    // The bench changes one namespace's Ingresses back to back, as fast as they go live: it
    // measures the pipeline, so the watcher's per-namespace budget is off.
    stack.restart_with(Component::Watcher, &[("HAFLEET_NAMESPACE_CHANGES_PER_MINUTE", "0")])?;
    let stack = stack;
    let (nodes, mut backends) = ready_nodes(&stack, args.nodes).await?;
    backends.extend(service_with_backends(&stack, "web", &nodes).await?);
    let api: Api<Ingress> = Api::namespaced(stack.kube.client().await?, "default");

    // Warm-up: the first rollout also opens SSH connections.
    api.create(&PostParams::default(), &ingress("warm", "warm.example.com")).await?;
    until_served(&stack, "warm.example.com").await?;

    if args.existing > 0 {
        let started = Instant::now();
        let last = args.existing - 1;
        let service =
            |i: usize| if args.own_services { format!("existing-{i}") } else { "web".into() };
        if args.own_services {
            // Services first, as a team would: only the two whose routes are checked below
            // get backend processes (10,000 Services x 10 nodes would be 100,000 listeners).
            create_services(&stack, (1..last).map(service)).await?;
            for i in [0, last] {
                backends.extend(service_with_backends(&stack, &service(i), &nodes).await?);
            }
            println!(
                "{} NodePort Services created in {:.1} s",
                args.existing,
                started.elapsed().as_secs_f64()
            );
        }
        let started = Instant::now();
        let existing = (0..args.existing)
            .map(|i| (format!("existing-{i}"), format!("existing-{i}.example.com"), service(i)));
        create_ingresses(&stack, "edge", existing).await?;
        let sent = started.elapsed().as_secs_f64();
        until_served(&stack, &format!("existing-{last}.example.com")).await?;
        until_served(&stack, "existing-0.example.com").await?;
        let size = stack.latest_version().await?.map(|v| v.size).unwrap_or(0);
        println!(
            "{} existing Ingresses on {} Services, {} nodes: created in {sent:.1} s, served \
             everywhere after {:.1} s; config + maps {:.1} MB\n",
            args.existing,
            if args.own_services { args.existing } else { 1 },
            args.nodes,
            started.elapsed().as_secs_f64(),
            size as f64 / 1e6
        );
    }

    let (mut known, mut new) = (Measured::default(), Measured::default());
    for i in 0..args.sequential {
        let host = format!("seq-{i}.example.com");
        known.change(&stack, &api, &ingress(&format!("seq-{i}"), &host), &host).await?;
        // A Service of its own, with a backend on every node it is routed to, before its
        // Ingress.
        let service = format!("svc-{i}");
        backends.extend(service_with_backends(&stack, &service, &nodes).await?);
        let host = format!("own-{i}.example.com");
        new.change(&stack, &api, &ingress_to(&format!("own-{i}"), &host, &service), &host).await?;
    }

    let versions_before = stack.latest_version().await?.map(|v| v.version).unwrap_or(0);
    let started = Instant::now();
    for i in 0..args.burst {
        api.create(
            &PostParams::default(),
            &ingress(&format!("burst-{i}"), &format!("burst-{i}.example.com")),
        )
        .await?;
    }
    for i in 0..args.burst {
        until_served(&stack, &format!("burst-{i}.example.com")).await?;
    }
    let burst_ms = started.elapsed().as_secs_f64() * 1000.0;
    let versions_after = stack.latest_version().await?.map(|v| v.version).unwrap_or(0);

    println!("| measure | n | p50 ms | p90 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|---|");
    for (what, m) in [("on a routed Service", &known), ("on a new Service", &new)] {
        println!(
            "{}",
            percentiles(
                &format!("Ingress {what}: created → served by every host"),
                m.converge.clone()
            )
        );
        println!("{}", percentiles(&format!("Ingress {what}: apply on one host"), m.apply.clone()));
    }
    println!(
        "\nreloads per host report: {} of {} on a routed Service, {} of {} on a new Service \
         (of which served through a spare before the reload: {})",
        known.reloads, known.reports, new.reloads, new.reports, new.bridged
    );
    println!("\n| files sent to a host per change (bytes) | n | p50 | p90 | p99 | max |");
    println!("|---|---|---|---|---|---|");
    for (what, m) in [("on a routed Service", &known), ("on a new Service", &new)] {
        println!("{}", percentiles(&format!("Ingress {what}"), m.sent.clone()));
    }
    println!(
        "\nburst: {} Ingresses created back to back → all served by all {} hosts in {:.0} ms, \
         in {} config versions",
        args.burst,
        args.hosts,
        burst_ms,
        versions_after - versions_before
    );
    Ok(())
}

/// `n` Ingresses in namespace `bench`, `app-<i>` routing `app-<i>.example.com/` (Prefix) to
/// the Service and NodePort `service(i)` names.
fn fleet(
    n: usize,
    service: impl Fn(usize) -> (String, u16),
) -> Result<std::collections::BTreeMap<IngressKey, IngressEntry>> {
    use hafleet_proto::{
        Backend, HttpHost, HttpPath, Namespace, ObjectName, PathKind, Route, ServiceRef,
        TrafficPolicy,
    };
    (0..n)
        .map(|i| {
            let (name, node_port) = service(i);
            let backend = Backend {
                service: ServiceRef {
                    namespace: Namespace::new("bench")?,
                    name: ObjectName::new(name)?,
                    port: 80,
                    cluster: None,
                },
                node_port: Some(node_port),
                servers: vec![],
                traffic_policy: TrafficPolicy::Cluster,
                endpoint_nodes: None,
                options: Default::default(),
            };
            let route = Route {
                host: Some(HttpHost::new(format!("app-{i}.example.com"))?),
                path: HttpPath::root(),
                kind: PathKind::Prefix,
                backend,
            };
            let entry = IngressEntry {
                created_unix: i as i64,
                resource_version: "1".into(),
                routes: vec![route],
                seq: 1,
                tls: Vec::new(),
                quarantined: None,
            };
            Ok((IngressKey::new("bench", &format!("app-{i}"))?, entry))
        })
        .collect()
}

/// The HAProxy binary: Debian's, or the first on PATH.
fn haproxy_bin() -> &'static str {
    if std::path::Path::new("/usr/sbin/haproxy").exists() { "/usr/sbin/haproxy" } else { "haproxy" }
}

/// Writes `bundle` as a host holds it: `dir/haproxy.cfg` and the map files beside it. Returns
/// the config's path.
fn write_bundle(
    dir: &std::path::Path,
    bundle: &hafleet_proto::Bundle,
) -> Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir.join(hafleet_proto::MAPS_DIR))?;
    let config = dir.join("haproxy.cfg");
    std::fs::write(&config, &bundle.config)?;
    for m in &bundle.maps {
        std::fs::write(dir.join(m.name.relative_path()), &m.content)?;
    }
    Ok(config)
}

/// `haproxy -c` on `config`: milliseconds taken; an error if HAProxy refuses it.
fn check_config(config: &std::path::Path) -> Result<f64> {
    check_config_with(config, None)
}

/// `haproxy -c` of `config`, with `GLIBC_TUNABLES` set to `tunables` if given.
fn check_config_with(config: &std::path::Path, tunables: Option<&str>) -> Result<f64> {
    let mut cmd = std::process::Command::new(haproxy_bin());
    match tunables {
        Some(t) => cmd.env("GLIBC_TUNABLES", t),
        None => cmd.env_remove("GLIBC_TUNABLES"),
    };
    let started = Instant::now();
    let out = cmd.arg("-c").arg("-q").arg("-f").arg(config).output()?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(out.status.success(), "haproxy -c: {}", String::from_utf8_lossy(&out.stderr));
    Ok(ms)
}

mod routing {
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
    }

    fn ingresses(
        n: usize,
        backend: SocketAddr,
        filters: bool,
    ) -> Result<BTreeMap<IngressKey, IngressEntry>> {
        let SocketAddr::V4(addr) = backend else { bail!("IPv4 backend expected") };
        let mut fleet = crate::fleet(n, |_| ("web".to_owned(), addr.port()))?;
        if filters {
            use hafleet_proto::{Cidr, HeaderName, HeaderValue};
            let header = |n: &str, v: &str| {
                Ok::<_, anyhow::Error>((HeaderName::new(n)?, HeaderValue::new(v)?))
            };
            let (request, response) = (header("X-Bench", "1")?, header("X-Served-By", "hafleet")?);
            for route in fleet.values_mut().flat_map(|e| e.routes.iter_mut()) {
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
                let close =
                    head.lines().any(|l| l.starts_with("connection:") && l.contains("close"));
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
        let request =
            format!("GET / HTTP/1.1\r\nHost: {host}\r\nUser-Agent: hafleet-bench\r\n\r\n");
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
            let ingresses = ingresses(n, backend.addr(), a.filters)?;
            let model = model::build_with(&fleet, &ingresses, &nodes, &options);
            let bundle = Renderer::load(a.template.as_deref())?.render(&model)?;
            let config = crate::write_bundle(dir.path(), &bundle)?;
            let check_ms = crate::check_config(&config)?;
            let http = SocketAddr::new(ip.into(), free_port(ip.into()));
            let mut cmd = std::process::Command::new(haproxy);
            cmd.arg("-db").arg("-f").arg(&config).env("HAFLEET_HTTP_BIND", http.to_string());
            let mut child =
                ChildGuard::spawn("haproxy", &mut cmd, &dir.path().join("haproxy.log"))?;
            child
                .wait_ready(Duration::from_secs(30), || async move {
                    TcpStream::connect(http).await.is_ok()
                })
                .await?;
            // Warm-up, then the three cases.
            load(http, "app-0.example.com", 200, &RoutingArgs { seconds: 1, ..a.clone_args() })
                .await?;
            let first = load(http, "app-0.example.com", 200, &a).await?;
            let last = load(http, &format!("app-{}.example.com", n - 1), 200, &a).await?;
            let unknown = load(http, "nobody.example.com", 404, &a).await?;
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
            }
        }
    }
}

mod reload {
    //! What a version costs HAProxy at scale: `--ingresses` Ingresses, each on its own
    //! Service (a backend each), on `--nodes` nodes with node health checks on and the
    //! renderer's default subset of nodes per backend, rendered by the renderer's own code with
    //! the built-in template. A real HAProxy (master-worker, master socket) runs on the files.
    //! Timed: `haproxy -c`; a reload, from asking the master to a new worker in `show proc`;
    //! and, through the applier's own runtime-API code, the two changes that need no reload at
    //! that size: a node drained, and a route added on a running backend (the map replaced).
    //! Nodes are 127.1.x.y addresses where nothing listens: their checks fail fast, locally.

    use anyhow::{Context, Result};
    use hafleet_applier::core::{plan, runtime_api as runtime};
    use hafleet_proto::{Bundle, FleetName, NodeAddr, ObjectName};
    use hafleet_renderer::core::{model, render::Renderer};
    use hafleet_tests::{ChildGuard, TestDir};
    use std::io::Write as _;
    use std::path::Path;
    use std::time::{Duration, Instant};

    #[derive(Debug, clap::Args)]
    pub struct ReloadArgs {
        #[arg(long, default_value_t = 10_000)]
        ingresses: usize,
        #[arg(long, default_value_t = 200)]
        nodes: usize,
        /// Runs of each timed step.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Nodes listed per backend, as the renderer's `--servers-per-backend`.
        #[arg(long, default_value_t = model::DEFAULT_SERVERS_PER_BACKEND)]
        servers_per_backend: usize,
    }

    fn nodes(n: usize) -> Vec<NodeAddr> {
        (0..n)
            .map(|i| NodeAddr {
                name: ObjectName::new(format!("node-{i}")).expect("valid name"),
                addr: std::net::Ipv4Addr::new(127, 1, (i / 250) as u8, (i % 250 + 1) as u8).into(),
            })
            .collect()
    }

    /// The fleet of `a` (with `more` Ingresses on Services of their own), optionally with one
    /// more route on the first Ingress's Service.
    fn render(a: &ReloadArgs, more: usize, nodes: &[NodeAddr], extra: bool) -> Result<Bundle> {
        let n = a.ingresses + more;
        let mut ingresses = crate::fleet(n, |i| (format!("svc-{i}"), 30000 + (i % 2700) as u16))?;
        if extra {
            // One more route, on the first Ingress's Service: map entries only.
            let more = crate::fleet(1, |_| ("svc-0".to_owned(), 30000))?;
            let (_, mut entry) = more.into_iter().next().context("one")?;
            entry.routes[0].host = Some(hafleet_proto::HttpHost::new("extra.example.com")?);
            ingresses.insert(hafleet_proto::IngressKey::new("bench", "extra")?, entry);
        }
        let options =
            model::Options { servers_per_backend: a.servers_per_backend, ..Default::default() };
        let model = model::build_with(&FleetName::new("bench")?, &ingresses, nodes, &options);
        Ok(Renderer::builtin().render(&model)?)
    }

    /// Sends `input` to the master socket and returns what it answered.
    fn master(socket: &Path, input: &str) -> Result<String> {
        let mut child = std::process::Command::new("socat")
            .args(["-T", "60", "stdio"])
            .arg(format!("unix-connect:{}", socket.display()))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            // Polling before the master listens is refused: that is the answer, not news.
            .stderr(std::process::Stdio::null())
            .spawn()?;
        child.stdin.take().context("stdin")?.write_all(input.as_bytes())?;
        let out = child.wait_with_output()?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn show_proc(socket: &Path) -> Result<plan::ProcState> {
        plan::parse_show_proc(&master(socket, "show proc\n")?).context("show proc")
    }

    fn median(mut ms: Vec<f64>) -> f64 {
        ms.sort_by(|a, b| a.total_cmp(b));
        ms[ms.len() / 2]
    }

    /// Sends the plan from `from` to `to` through the master CLI, as the applier does; returns
    /// the commands sent and the time taken.
    fn runtime_change(socket: &Path, from: &Bundle, to: &Bundle) -> Result<(usize, f64)> {
        let steps = match runtime::plan(from, to) {
            runtime::Plan::Runtime(steps) => steps,
            // A new Service: served through a spare ahead of its reload (not timed here).
            runtime::Plan::Bridged { bridge, .. } => bridge.steps,
            other => anyhow::bail!("expected a change through the runtime API, not {other:?}"),
        };
        let started = Instant::now();
        let pid = plan::current_worker(&show_proc(socket)?).context("current worker")?;
        let mut sent = 1;
        let mut prepared = runtime::PreparedMaps::new();
        let kinds = runtime::map_kinds(&steps);
        if !kinds.is_empty() {
            let show = master(socket, &format!("@!{pid} show map\n"))?;
            let ids = runtime::map_ids(&show, &kinds).context("map ids")?;
            let prepare = runtime::prepare_commands(&ids);
            let out = master(socket, &runtime::session(pid, &prepare))?;
            sent += 1 + prepare.len();
            prepared = runtime::prepared_maps(ids, &runtime::answers(&out, prepare.len()))
                .map_err(anyhow::Error::msg)?;
        }
        let commands = runtime::commands(&steps, &prepared, &runtime::CertInputs::default())
            .map_err(anyhow::Error::msg)?;
        let out = master(socket, &runtime::session(pid, &commands))?;
        let answers = runtime::answers(&out, commands.len());
        if let Some((command, answer)) = runtime::first_refused(&commands, &answers) {
            anyhow::bail!("HAProxy answered {answer:?} to {command}");
        }
        Ok((sent + commands.len(), started.elapsed().as_secs_f64() * 1000.0))
    }

    /// What the applier sets for its `haproxy -c` (applier/src/host/scripts/lib.sh, `validate`).
    const HUGE_PAGES: &str = "glibc.malloc.hugetlb=1";

    /// Starts a master-worker HAProxy on `config` with its master socket at `socket` (and
    /// `GLIBC_TUNABLES` set to `tunables` if given), then reloads it `runs` times: the time
    /// of each from asking the master to a new worker in `show proc`.
    async fn start_and_reload(
        haproxy: &str,
        config: &Path,
        socket: &Path,
        tunables: Option<&str>,
        runs: usize,
    ) -> Result<(ChildGuard, Vec<f64>)> {
        let http = std::net::SocketAddr::new(
            [127, 0, 0, 1].into(),
            hafleet_tests::free_port([127, 0, 0, 1].into()),
        );
        let mut cmd = std::process::Command::new(haproxy);
        cmd.arg("-W")
            .arg("-db")
            .arg("-S")
            .arg(socket)
            .arg("-f")
            .arg(config)
            .env("HAFLEET_HTTP_BIND", http.to_string());
        match tunables {
            Some(t) => cmd.env("GLIBC_TUNABLES", t),
            None => cmd.env_remove("GLIBC_TUNABLES"),
        };
        let log = socket.with_extension("log");
        let mut child = ChildGuard::spawn("haproxy", &mut cmd, &log)?;
        let sock = socket.to_owned();
        child
            .wait_ready(Duration::from_secs(120), || {
                let sock = sock.clone();
                async move { show_proc(&sock).is_ok_and(|p| plan::current_worker(&p).is_some()) }
            })
            .await?;

        let mut reload = Vec::new();
        for _ in 0..runs {
            let before = show_proc(socket)?;
            let started = Instant::now();
            master(socket, "reload\n")?;
            let deadline = started + Duration::from_secs(120);
            loop {
                if let Ok(after) = show_proc(socket) {
                    match plan::check_reload(&before, &after) {
                        plan::ReloadCheck::Done => break,
                        plan::ReloadCheck::Failed => anyhow::bail!("reload failed"),
                        plan::ReloadCheck::Raced => anyhow::bail!("someone else reloaded too"),
                        plan::ReloadCheck::Pending => {}
                    }
                }
                anyhow::ensure!(Instant::now() < deadline, "no new worker after 120 s");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            reload.push(started.elapsed().as_secs_f64() * 1000.0);
            // Let the old worker go before the next run.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok((child, reload))
    }

    pub async fn run(a: ReloadArgs) -> Result<()> {
        let haproxy =
            if Path::new("/usr/sbin/haproxy").exists() { "/usr/sbin/haproxy" } else { "haproxy" };
        let all = nodes(a.nodes);
        let started = Instant::now();
        let base = render(&a, 0, &all, false)?;
        let render_ms = started.elapsed().as_secs_f64() * 1000.0;
        let dir = TestDir::new("hafleet-bench-reload")?;
        let config = crate::write_bundle(dir.path(), &base)?;
        // Plain, and as the applier runs it (its heap on transparent huge pages), in turn.
        let (mut check, mut check_thp) = (Vec::new(), Vec::new());
        for _ in 0..a.runs {
            check.push(crate::check_config(&config)?);
            check_thp.push(crate::check_config_with(&config, Some(HUGE_PAGES))?);
        }
        let socket = dir.path().join("master.sock");
        let (mut child, reload) = start_and_reload(haproxy, &config, &socket, None, a.runs).await?;

        // A node drained: every backend whose subset held it moves to another node.
        let drained = render(&a, 0, &all[1..], false)?;
        let (drain_commands, drain_ms) = runtime_change(&socket, &base, &drained)?;
        // A route added on a running backend: the map of prefix rules replaced whole.
        let routed = render(&a, 0, &all[1..], true)?;
        // What the applier works out for each host before it sends anything: the plan from the
        // bundle HAProxy runs to the next (a new Service: a reload; the two changes above: the
        // runtime API).
        let added = render(&a, 1, &all, false)?;
        let plan_ms = |from: &Bundle, to: &Bundle, reload: bool| -> Result<f64> {
            let times = (0..a.runs.max(5))
                .map(|_| {
                    let started = Instant::now();
                    let plan = runtime::plan_alone(from, to);
                    let ms = started.elapsed().as_secs_f64() * 1000.0;
                    anyhow::ensure!(
                        matches!(plan, runtime::Plan::Reload(_)) == reload,
                        "the plan should {}reload",
                        if reload { "" } else { "not " }
                    );
                    Ok(ms)
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(median(times))
        };
        let plan_added = plan_ms(&base, &added, true)?;
        // The bridge of that reload (its new backend through a spare), which a rollout looks
        // for on another thread while the hosts check the version.
        let bridge_ms = median(
            (0..a.runs.max(5))
                .map(|_| {
                    let started = Instant::now();
                    let bridge = runtime::bridge(&base, &added);
                    let ms = started.elapsed().as_secs_f64() * 1000.0;
                    anyhow::ensure!(bridge.is_some(), "a new Service should have a spare");
                    Ok(ms)
                })
                .collect::<Result<Vec<_>>>()?,
        );
        let plan_drained = plan_ms(&base, &drained, false)?;
        let plan_routed = plan_ms(&drained, &routed, false)?;
        let (map_commands, map_ms) = runtime_change(&socket, &drained, &routed)?;
        // A new Service served through a spare backend, as the applier does ahead of the
        // reload that adds its own backend.
        let added_routed = render(&a, 1, &all[1..], true)?;
        let (spare_commands, spare_ms) = runtime_change(&socket, &routed, &added_routed)?;
        child.kill();
        // A host whose HAProxy runs with the same tunable (the README's "For big fleets").
        let thp = dir.path().join("master-thp.sock");
        let (mut child, reload_thp) =
            start_and_reload(haproxy, &config, &thp, Some(HUGE_PAGES), a.runs).await?;
        child.kill();

        println!(
            "{} Ingresses (one Service each) on {} nodes, node health checks, {} servers per \
             backend; rendered in {render_ms:.0} ms\n",
            a.ingresses, a.nodes, a.servers_per_backend
        );
        println!("| measure | value |\n|---|---|");
        println!(
            "| config + maps | {:.1} MB ({:.1} MB config) |",
            base.size() as f64 / 1e6,
            base.config.len() as f64 / 1e6
        );
        println!("| `haproxy -c` (median of {}) | {:.0} ms |", a.runs, median(check));
        println!(
            "| `haproxy -c` with `GLIBC_TUNABLES={HUGE_PAGES}`, as the applier runs it (median of {}) | {:.0} ms |",
            a.runs,
            median(check_thp)
        );
        println!("| reload → new worker (median of {}) | {:.0} ms |", a.runs, median(reload));
        println!(
            "| reload → new worker, HAProxy started with `GLIBC_TUNABLES={HUGE_PAGES}` (median of {}) | {:.0} ms |",
            a.runs,
            median(reload_thp)
        );
        println!(
            "| node drained through the runtime API | {drain_commands} commands, {drain_ms:.0} ms |"
        );
        println!(
            "| route added on a running backend (map replaced) | {map_commands} commands, {map_ms:.0} ms |"
        );
        println!(
            "| a new Service through a spare backend, ahead of its reload (servers added, maps replaced) | {spare_commands} commands, {spare_ms:.0} ms |"
        );
        println!(
            "| finding a spare for a new Service (median; off the rollout's path: while hosts check the config) | {bridge_ms:.1} ms |"
        );
        println!(
            "| the applier's plan (median): a new Service (reload) / node drained / route added | \
             {plan_added:.1} / {plan_drained:.1} / {plan_routed:.1} ms |"
        );
        Ok(())
    }
}

mod history {
    //! The history commands as an operator runs them: a separate `hafleet-renderer` process,
    //! as the `hafleet-operator` NATS user, against real NATS and a running renderer. Route
    //! events are published straight to the routes stream (as the watcher would), so no API
    //! server or HAProxy is needed.

    use anyhow::{Context, Result};
    use hafleet_proto::{
        Backend, FleetName, HttpHost, HttpPath, IngressKey, Namespace, NodeAddr, NodesUpdate,
        ObjectName, PathKind, Route, RouteChange, RouteEvent, RouteMessage, SCHEMA_VERSION,
        ServiceRef, TrafficPolicy,
    };
    use hafleet_tests::{ChildGuard, NatsServer, TestDir, bin_path};
    use std::time::{Duration, Instant};

    #[derive(Debug, clap::Args)]
    pub struct HistoryArgs {
        /// Versions to make before timing `history list --limit <versions>`.
        #[arg(long, default_value_t = 1000)]
        versions: usize,
        /// Route events to publish before timing `replay`.
        #[arg(long, default_value_t = 100_000)]
        events: usize,
        /// Distinct Ingresses the events update in turn.
        #[arg(long, default_value_t = 10_000)]
        ingresses: usize,
        /// Runs of each timed command.
        #[arg(long, default_value_t = 5)]
        runs: usize,
    }

    fn event(fleet: &FleetName, i: usize, rv: usize) -> Result<Vec<u8>> {
        let backend = Backend {
            service: ServiceRef {
                namespace: Namespace::new("bench")?,
                name: ObjectName::new(format!("svc-{i}"))?,
                port: 80,
                cluster: None,
            },
            node_port: Some(30000 + (i % 2000) as u16),
            servers: vec![],
            traffic_policy: TrafficPolicy::Cluster,
            endpoint_nodes: None,
            options: Default::default(),
        };
        let msg = RouteMessage::Event(RouteEvent {
            schema: SCHEMA_VERSION,
            fleet: fleet.clone(),
            ingress: IngressKey::new("bench", &format!("ing-{i}"))?,
            created_unix: i as i64,
            resource_version: rv.to_string(),
            change: RouteChange::Upsert {
                routes: vec![Route {
                    host: Some(HttpHost::new(format!("app-{i}.example.com"))?),
                    path: HttpPath::new(format!("/v{rv}"))?,
                    kind: PathKind::Prefix,
                    backend,
                }],
                tls: vec![],
            },
            epoch: 1,
        });
        Ok(serde_json::to_vec(&msg)?)
    }

    /// Publishes `(i, rv)` events on the fleet's routes subject, pipelining acks by 1,000.
    async fn publish(
        js: &async_nats::jetstream::Context,
        fleet: &FleetName,
        events: impl Iterator<Item = (usize, usize)>,
    ) -> Result<u64> {
        let subject = hafleet_proto::routes_subject(fleet);
        let mut pending = Vec::new();
        let mut last = 0;
        for (i, rv) in events {
            pending.push(js.publish(subject.clone(), event(fleet, i, rv)?.into()).await?);
            if pending.len() == 1000 {
                for ack in pending.drain(..) {
                    last = ack.await?.sequence;
                }
            }
        }
        for ack in pending {
            last = ack.await?.sequence;
        }
        Ok(last)
    }

    /// Runs the CLI `runs` times as the operator; returns each run's wall time in ms and the
    /// last run's stdout.
    async fn timed(nats: &NatsServer, args: &[&str], runs: usize) -> Result<(Vec<f64>, String)> {
        let mut times = Vec::new();
        let mut stdout = String::new();
        for _ in 0..runs {
            let started = Instant::now();
            let out = tokio::process::Command::new(bin_path("hafleet-renderer"))
                .args(args)
                .env("HAFLEET_NATS_URL", nats.url_for("hafleet-operator"))
                .env("RUST_LOG", "warn")
                .output()
                .await?;
            times.push(started.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        }
        Ok((times, stdout))
    }

    async fn renderer_at(
        js: &async_nats::jetstream::Context,
        fleet: &FleetName,
        version: u64,
    ) -> Result<()> {
        let subject = hafleet_proto::configs_subject(fleet);
        hafleet_tests::eventually(Duration::from_secs(600), "renderer caught up", || {
            let subject = subject.clone();
            async move {
                let stream = js.get_stream(hafleet_proto::CONFIGS_STREAM).await?;
                let m = stream.get_last_raw_message_by_subject(&subject).await?;
                let v: serde_json::Value = serde_json::from_slice(&m.payload)?;
                let n = v["version"].as_u64().unwrap_or(0);
                anyhow::ensure!(n >= version, "at version {n}");
                Ok(())
            }
        })
        .await
    }

    pub async fn run(a: HistoryArgs) -> Result<()> {
        let nats = NatsServer::start().await?;
        let dir = TestDir::new("hafleet-bench-history")?;
        let signing = hafleet_tests::SigningKeys::generate(dir.path())?;
        let mut cmd = std::process::Command::new(bin_path("hafleet-renderer"));
        cmd.arg("run")
            .env("HAFLEET_NATS_URL", nats.url_for("hafleet-renderer"))
            .env("HAFLEET_SIGNING_KEY", &signing.private)
            .env("HAFLEET_DATA_DIR", dir.path().join("renderer-data"))
            .env("HAFLEET_COALESCE_MS", "5")
            // No checkpoint inside the run: replay reads every event from the stream.
            .env("HAFLEET_CHECKPOINT_EVERY", "1000000000");
        let _renderer =
            ChildGuard::spawn("hafleet-renderer", &mut cmd, &dir.path().join("renderer.log"))?;
        let bus = hafleet_runtime::nats::Bus::connect(&nats.url()).await?;
        // The streams may not exist yet: the renderer is still starting.
        bus.ensure_stream(hafleet_proto::ROUTES).await?;
        bus.ensure_stream(hafleet_proto::CONFIGS).await?;
        let js = bus.js.clone();
        // Three nodes, as a watcher publishes them, before any route.
        let nodes = RouteMessage::Nodes(NodesUpdate {
            schema: SCHEMA_VERSION,
            epoch: 1,
            nodes: (1..=3)
                .map(|n| {
                    Ok(NodeAddr {
                        name: ObjectName::new(format!("node-{n}"))?,
                        addr: std::net::Ipv4Addr::new(10, 0, 0, n).into(),
                    })
                })
                .collect::<Result<_>>()?,
            cluster: None,
        });
        js.publish(hafleet_proto::ROUTES_NODES_SUBJECT, nodes.encode().into()).await?.await?;

        // history list: a small fleet changed `versions` times, one version per change.
        let small = FleetName::new("small")?;
        for rv in 0..a.versions {
            publish(&js, &small, std::iter::once((rv % 10, rv))).await?;
            renderer_at(&js, &small, rv as u64 + 1).await?;
        }
        let limit = a.versions.to_string();
        let (list, out) = timed(
            &nats,
            &["history", "list", "--fleet", "small", "--limit", &limit, "--json"],
            a.runs,
        )
        .await?;
        let rows: serde_json::Value = serde_json::from_str(&out)?;
        anyhow::ensure!(
            rows.as_array().map(Vec::len) == Some(a.versions),
            "list returned {}",
            rows
        );

        // replay: `events` updates of `ingresses` Ingresses on fleet big.
        let big = FleetName::new("big")?;
        let started = Instant::now();
        let last =
            publish(&js, &big, (0..a.events).map(|k| (k % a.ingresses, k / a.ingresses))).await?;
        let publish_s = started.elapsed().as_secs_f64();
        // Let the renderer finish its own work first, so it does not share the CPU with replay.
        hafleet_tests::eventually(Duration::from_secs(900), "renderer idle", || {
            let js = js.clone();
            async move {
                let stream = js.get_stream(hafleet_proto::ROUTES_STREAM).await?;
                let info = stream.consumer_info(hafleet_proto::RENDERER_CONSUMER).await?;
                anyhow::ensure!(
                    info.num_pending == 0 && info.num_ack_pending == 0,
                    "{} pending",
                    info.num_pending + info.num_ack_pending as u64
                );
                Ok(())
            }
        })
        .await?;
        let until = last.to_string();
        let (replay, out) =
            timed(&nats, &["replay", "--fleet", "big", "--until", &until, "--json"], a.runs.min(3))
                .await?;
        let replayed: serde_json::Value = serde_json::from_str(&out)?;
        let events = replayed["events"].as_u64().context("events")?;

        println!(
            "| command (separate process, as hafleet-operator) | runs | p50 ms | max ms | target |"
        );
        println!("|---|---|---|---|---|");
        let row = |label: String, mut xs: Vec<f64>, target: &str| {
            xs.sort_by(|a, b| a.total_cmp(b));
            println!(
                "| {label} | {} | {:.0} | {:.0} | {target} |",
                xs.len(),
                xs[xs.len() / 2],
                xs[xs.len() - 1]
            );
        };
        row(format!("history list --limit {} --json", a.versions), list, "< 200 ms");
        row(
            format!("replay of {events} events ({} Ingresses) --json", a.ingresses),
            replay,
            "< 10 s",
        );
        println!("\n{} events published in {publish_s:.1} s", a.events);
        Ok(())
    }
}

mod watcher {
    //! The watcher's start on a big cluster: 200 Ready nodes, and 10,000 Ingresses each on a
    //! NodePort Service of its own, in the real API server. Each run starts the watcher (release
    //! build, default settings) and times it from the process starting to its first snapshot
    //! published, which comes after every Ingress's routes and the nodes are published and
    //! acked by JetStream; then reads its peak resident memory (VmHWM). The renderer and the
    //! applier are stopped, so the two cores are the watcher's, the API server's and NATS's.

    use anyhow::{Context, Result};
    use hafleet_tests::cluster::{create_ingresses, create_services, ready_nodes};
    use hafleet_tests::stack::{Component, Stack};
    use std::time::{Duration, Instant};

    #[derive(Debug, clap::Args)]
    pub struct WatcherArgs {
        #[arg(long, default_value_t = 10_000)]
        ingresses: usize,
        #[arg(long, default_value_t = 200)]
        nodes: usize,
        /// Starts timed.
        #[arg(long, default_value_t = 3)]
        runs: usize,
    }

    fn snapshots(stack: &Stack) -> usize {
        std::fs::read_to_string(stack.log_path(Component::Watcher))
            .unwrap_or_default()
            .matches("snapshot published")
            .count()
    }

    /// Peak resident memory of `pid`, in MB.
    fn peak_rss_mb(pid: u32) -> Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .context("no VmHWM")?;
        Ok(kb / 1024.0)
    }

    pub async fn run(a: WatcherArgs) -> Result<()> {
        let mut stack = Stack::start("edge", 1).await?;
        for c in [Component::Watcher, Component::Renderer, Component::Applier] {
            stack.kill(c);
        }
        let started = Instant::now();
        let (_nodes, _processes) = ready_nodes(&stack, a.nodes).await?;
        create_services(&stack, (0..a.ingresses).map(|i| format!("svc-{i}"))).await?;
        let ingresses = (0..a.ingresses)
            .map(|i| (format!("ing-{i}"), format!("ing-{i}.example.com"), format!("svc-{i}")));
        create_ingresses(&stack, "edge", ingresses).await?;
        println!(
            "{} nodes, {} Services and {} Ingresses created in {:.1} s\n",
            a.nodes,
            a.ingresses,
            a.ingresses,
            started.elapsed().as_secs_f64()
        );
        println!("| run | start → first snapshot published s | peak RSS MB |");
        println!("|---|---|---|");
        for run in 1..=a.runs {
            let before = snapshots(&stack);
            let started = Instant::now();
            stack.start_component(Component::Watcher)?;
            let pid = stack.pid(Component::Watcher).context("the watcher runs")?;
            while snapshots(&stack) == before {
                anyhow::ensure!(
                    started.elapsed() < Duration::from_secs(300),
                    "no snapshot in 300 s"
                );
                anyhow::ensure!(stack.is_running(Component::Watcher), "the watcher exited");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let took = started.elapsed().as_secs_f64();
            let rss = peak_rss_mb(pid)?;
            println!("| {run} | {took:.2} | {rss:.0} |");
            stack.kill(Component::Watcher);
        }
        Ok(())
    }
}

mod applier {
    use super::*;
    use hafleet_proto::{Bundle, ConfigVersion, FleetName, Signer};
    use hafleet_tests::{
        ChildGuard, HaproxyHost, NatsServer, SigningKeys, SshClientKeys, TestDir, bin_path,
    };

    #[derive(Debug, clap::Args)]
    pub struct ApplierArgs {
        /// Fleet sizes measured, each with its own applier (hosts are the first N of the
        /// largest).
        #[arg(long, value_delimiter = ',', default_value = "1,5,20")]
        hosts: Vec<usize>,
        /// Changes measured per fleet size and per tool, after one warm-up.
        #[arg(long, default_value_t = 10)]
        rounds: u64,
        /// Backends in the config (one `use_backend` rule and one server each).
        #[arg(long, default_value_t = 200)]
        backends: usize,
        /// Hosts the applier updates at once after the canary (its --parallelism).
        #[arg(long, default_value_t = 5)]
        parallelism: usize,
    }

    /// The config both tools put live: a frontend routing `backends` hosts, each to its own
    /// backend. `round` (a Jinja2 expression for ansible, a number for hafleet) changes it.
    fn config(backends: usize, round: &str) -> String {
        let mut c = format!(
            "# hafleet-bench applier, round {round}\nglobal\n    httpclient.ssl.verify none\n\ndefaults\n    mode http\n    \
             timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\n\
             frontend hafleet_http\n    bind \"${{HAFLEET_HTTP_BIND-:80}}\"\n"
        );
        for i in 0..backends {
            c.push_str(&format!(
                "    use_backend be_{i} if {{ hdr(host) -i app-{i}.example.com }}\n"
            ));
        }
        c.push_str(
            "    default_backend be_none\n\nbackend be_none\n    http-request return status 404\n",
        );
        // A backend of the round's own: every round's config needs a reload, as a new Service
        // does, with either tool.
        c.push_str(&format!("\nbackend be_round_{round}\n    server s1 127.0.0.1:19999\n"));
        for i in 0..backends {
            c.push_str(&format!(
                "\nbackend be_{i}\n    server s1 127.0.0.1:{} weight 1\n",
                20000 + i
            ));
        }
        c
    }

    fn version(fleet: &FleetName, n: u64, config: String, signer: &Signer) -> ConfigVersion {
        let bundle = Bundle { config, maps: vec![], certs: vec![] };
        signer.sign(ConfigVersion {
            parent: n.checked_sub(1).filter(|p| *p > 0),
            created_unix_ms: hafleet_runtime::now_unix_ms(),
            ..ConfigVersion::inline(fleet.clone(), n, bundle)
        })
    }

    /// Publishes `v` and waits until every one of `hosts` reported it applied; returns the
    /// time from the publish to the last host's finish.
    async fn live_in(
        nats: &NatsServer,
        hosts: &[HaproxyHost],
        v: &ConfigVersion,
    ) -> Result<Duration> {
        let client = nats.client().await?;
        let bus = hafleet_runtime::nats::Bus::from_client(client);
        let start = hafleet_runtime::now_unix_ms();
        bus.publish_version(v).await?;
        let reports = bus.js.get_stream(hafleet_proto::REPORTS_STREAM).await?;
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut last = 0;
        for h in hosts {
            let subject =
                hafleet_proto::reports_subject(&v.fleet, &hafleet_proto::HostName::new(h.name())?);
            loop {
                let r = reports
                    .get_last_raw_message_by_subject(&subject)
                    .await
                    .ok()
                    .and_then(|m| hafleet_proto::ApplyReport::decode(&m.payload).ok());
                match r {
                    Some(r) if r.version == v.version => {
                        anyhow::ensure!(
                            matches!(r.outcome, hafleet_proto::ApplyOutcome::Applied)
                                && r.reloads == 1,
                            "{}: not applied with one reload: {r:?}",
                            h.name()
                        );
                        last = last.max(r.finished_unix_ms);
                        break;
                    }
                    _ if Instant::now() > deadline => {
                        anyhow::bail!("{} never applied v{}", h.name(), v.version)
                    }
                    _ => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        }
        Ok(Duration::from_millis(last.saturating_sub(start)))
    }

    fn percentile(sorted: &[Duration], p: f64) -> Duration {
        sorted[((sorted.len() - 1) as f64 * p).round() as usize]
    }

    pub async fn run(a: ApplierArgs) -> Result<()> {
        let dir = TestDir::new("hafleet-bench-applier")?;
        let most = a.hosts.iter().copied().max().unwrap_or(1);
        let keys = SshClientKeys::generate(dir.path())?;
        let signing = SigningKeys::generate(dir.path())?;
        let signer = Signer::from_pem(&std::fs::read_to_string(&signing.private)?)?;
        let nats = NatsServer::start().await?;
        // The streams the renderer would have made.
        let admin = hafleet_runtime::nats::Bus::connect(&nats.url()).await?;
        admin.ensure_stream(hafleet_proto::CONFIGS).await?;
        admin.ensure_stream(hafleet_proto::REPORTS).await?;
        let mut hosts = Vec::new();
        for i in 1..=most {
            hosts.push(HaproxyHost::start(&format!("lb-{i}"), &keys).await?);
        }
        println!(
            "{} backends per config, {} rounds after a warm-up; hafleet: publish -> last host's \
             report; ansible: ansible-playbook's wall time (forks = hosts, pipelining, \
             ControlPersist)",
            a.backends, a.rounds
        );
        println!(
            "{:>5}  {:>22}  {:>22}  {:>7}",
            "hosts", "hafleet p50 / p90", "ansible p50 / p90", "ratio"
        );
        for &n in &a.hosts {
            let fleet = FleetName::new(format!("bench-{n}"))?;
            let subset = &hosts[..n];
            // hafleet: its applier for these hosts, versions published as the renderer would.
            nats.add_applier(fleet.as_str()).await?;
            let inventory = dir.path().join(format!("inventory-{n}.toml"));
            hafleet_tests::stack::write_inventory(&inventory, subset)?;
            let mut cmd = std::process::Command::new(bin_path("hafleet-applier"));
            cmd.env("HAFLEET_NATS_URL", nats.url_for(&format!("hafleet-applier-{fleet}")))
                .env("HAFLEET_FLEET", fleet.as_str())
                .env("HAFLEET_INVENTORY", &inventory)
                .env("HAFLEET_SSH_IDENTITY", &keys.identity)
                .env("HAFLEET_SSH_KNOWN_HOSTS", &keys.known_hosts)
                .env("HAFLEET_VERIFY_KEYS", &signing.public)
                .env("HAFLEET_PARALLELISM", a.parallelism.to_string())
                .env("HAFLEET_DRIFT_CHECK_SECS", "0")
                // RUST_LOG=hafleet_applier=debug shows each remote command's time in the log.
                .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()));
            let log = dir.path().join(format!("applier-{n}.log"));
            let applier = ChildGuard::spawn("hafleet-applier", &mut cmd, &log)?;
            let mut ours = Vec::new();
            for round in 0..=a.rounds {
                let v = version(
                    &fleet,
                    round + 1,
                    config(a.backends, &format!("{n}-{round}")),
                    &signer,
                );
                let took = live_in(&nats, subset, &v).await?;
                if round > 0 {
                    ours.push(took);
                }
            }
            drop(applier);

            // ansible-playbook: the same hosts, the same config, one change per run.
            let play = hafleet_tests::ansible::Playbook::new(
                &dir.path().join(format!("ansible-{n}")),
                subset,
                &config(a.backends, "{{ round }}"),
            )?;
            let mut theirs = Vec::new();
            for round in 0..=a.rounds {
                let start = Instant::now();
                play.run(round + 1000, n)?;
                if round > 0 {
                    theirs.push(start.elapsed());
                }
            }
            // Both really put their config live.
            for h in subset {
                let live = std::fs::read_to_string(h.config_path())?;
                anyhow::ensure!(
                    live.contains(&format!("round {}", a.rounds + 1000)),
                    "{}: {live:.80}",
                    h.name()
                );
            }
            ours.sort();
            theirs.sort();
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            println!(
                "{n:>5}  {:>9.0} / {:>6.0} ms  {:>9.0} / {:>6.0} ms  {:>6.1}x",
                ms(percentile(&ours, 0.5)),
                ms(percentile(&ours, 0.9)),
                ms(percentile(&theirs, 0.5)),
                ms(percentile(&theirs, 0.9)),
                ms(percentile(&theirs, 0.5)) / ms(percentile(&ours, 0.5)).max(0.001),
            );
        }
        Ok(())
    }
}
