//! hafleet-bench: end-to-end latency on real parts. Starts the loopback stack and measures:
//! - one Ingress at a time: from `create` returning to the route answering through every
//!   HAProxy host, and each host's apply time as its report gives it;
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
use hafleet_tests::stack::Stack;
use hafleet_tests::{HttpBackend, http_get, random_loopback_ip};
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
}

/// The pipeline bench's settings (the default mode).
#[derive(Debug, clap::Args)]
struct Args {
    /// Ingresses created one at a time.
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
}

fn ingress(name: &str, host: &str) -> Ingress {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "annotations": {"hafleet.io/fleet": "edge"}},
        "spec": {"rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
            "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}
    }))
    .expect("valid Ingress")
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
        None => pipeline(cli.pipeline).await,
    }
}

async fn pipeline(args: Args) -> Result<()> {
    let stack = Stack::start("edge", args.hosts).await?;
    let mut backends = Vec::new();
    let node_port = u16::try_from(stack.kube.create_nodeport_service("default", "web", 80).await?)?;
    for i in 1..=3 {
        let ip = random_loopback_ip();
        stack.kube.create_ready_node(&format!("node-{i}"), ip).await?;
        backends.push(HttpBackend::start(ip, node_port, &format!("web@node-{i}")).await?);
    }
    let api: Api<Ingress> = Api::namespaced(stack.kube.client().await?, "default");

    // Warm-up: the first rollout also opens SSH connections.
    api.create(&PostParams::default(), &ingress("warm", "warm.example.com")).await?;
    until_served(&stack, "warm.example.com").await?;

    if args.existing > 0 {
        use futures::StreamExt as _;
        let started = Instant::now();
        let api = &api;
        let created: Vec<_> = futures::stream::iter(0..args.existing)
            .map(|i| async move {
                api.create(
                    &PostParams::default(),
                    &ingress(&format!("existing-{i}"), &format!("existing-{i}.example.com")),
                )
                .await
            })
            .buffer_unordered(16)
            .collect()
            .await;
        for c in created {
            c?;
        }
        let sent = started.elapsed().as_secs_f64();
        until_served(&stack, &format!("existing-{}.example.com", args.existing - 1)).await?;
        until_served(&stack, "existing-0.example.com").await?;
        let size = stack.latest_version().await?.map(|v| v.size).unwrap_or(0);
        println!(
            "{} existing Ingresses: created in {sent:.1} s, served everywhere after {:.1} s; \
             config + maps {:.1} MB\n",
            args.existing,
            started.elapsed().as_secs_f64(),
            size as f64 / 1e6
        );
    }

    let mut converge = Vec::new();
    let mut apply = Vec::new();
    for i in 0..args.sequential {
        let host = format!("seq-{i}.example.com");
        api.create(&PostParams::default(), &ingress(&format!("seq-{i}"), &host)).await?;
        let started = Instant::now();
        until_served(&stack, &host).await?;
        converge.push(started.elapsed().as_secs_f64() * 1000.0);
        for h in &stack.hosts {
            if let Some(r) = stack.last_report(h.name()).await? {
                apply.push(r.duration_ms as f64);
            }
        }
    }

    let versions_before = stack.last_report("lb-1").await?.map(|r| r.version).unwrap_or(0);
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
    let versions_after = stack.last_report("lb-1").await?.map(|r| r.version).unwrap_or(0);

    println!("| measure | n | p50 ms | p90 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|---|");
    println!("{}", percentiles("Ingress created → served by every host", converge));
    println!("{}", percentiles("apply on one host (report duration)", apply));
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

mod routing {
    //! Routing cost by number of routes: one Ingress per host (`app-<i>.example.com`, `/`
    //! Prefix), rendered by the renderer's own code with the built-in template, served by a
    //! real HAProxy started on the rendered files; a load generator of `--connections`
    //! keep-alive connections sends `GET /` for `--seconds` per case.

    use anyhow::{Context, Result, bail};
    use hafleet_proto::{
        Backend, FleetName, HttpHost, HttpPath, IngressKey, Namespace, NodeAddr, ObjectName,
        PathKind, Route, ServiceRef, TrafficPolicy,
    };
    use hafleet_renderer::{model, render::Renderer, state::IngressEntry};
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
    }

    fn ingresses(n: usize, backend: SocketAddr) -> Result<BTreeMap<IngressKey, IngressEntry>> {
        let SocketAddr::V4(addr) = backend else { bail!("IPv4 backend expected") };
        let backend = Backend {
            service: ServiceRef {
                namespace: Namespace::new("bench")?,
                name: ObjectName::new("web")?,
                port: 80,
            },
            node_port: Some(addr.port()),
            servers: vec![],
            traffic_policy: TrafficPolicy::Cluster,
        };
        (0..n)
            .map(|i| {
                let route = Route {
                    host: Some(HttpHost::new(format!("app-{i}.example.com"))?),
                    path: HttpPath::root(),
                    kind: PathKind::Prefix,
                    backend: backend.clone(),
                };
                let entry = IngressEntry {
                    created_unix: i as i64,
                    resource_version: "1".into(),
                    routes: vec![route],
                    seq: 1,
                };
                Ok((IngressKey::new("bench", &format!("app-{i}"))?, entry))
            })
            .collect()
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
        let started = Instant::now();
        let mut total = 0;
        while let Some(done) = tasks.join_next().await {
            total += done??;
        }
        Ok(total as f64 / started.elapsed().as_secs_f64())
    }

    pub async fn run(a: RoutingArgs) -> Result<()> {
        let haproxy = if std::path::Path::new("/usr/sbin/haproxy").exists() {
            "/usr/sbin/haproxy"
        } else {
            "haproxy"
        };
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
            let model =
                model::build(&FleetName::new("bench")?, &ingresses(n, backend.addr())?, &nodes);
            let bundle = Renderer::builtin().render(&model)?;
            let config = dir.path().join("haproxy.cfg");
            std::fs::create_dir_all(dir.path().join(hafleet_proto::MAPS_DIR))?;
            std::fs::write(&config, &bundle.config)?;
            for m in &bundle.maps {
                std::fs::write(dir.path().join(m.name.relative_path()), &m.content)?;
            }
            let started = Instant::now();
            let check = std::process::Command::new(haproxy)
                .arg("-c")
                .arg("-q")
                .arg("-f")
                .arg(&config)
                .output()?;
            let check_ms = started.elapsed().as_secs_f64() * 1000.0;
            anyhow::ensure!(
                check.status.success(),
                "haproxy -c: {}",
                String::from_utf8_lossy(&check.stderr)
            );
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
            }
        }
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
            },
            node_port: Some(30000 + (i % 2000) as u16),
            servers: vec![],
            traffic_policy: TrafficPolicy::Cluster,
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
        let mut cmd = std::process::Command::new(bin_path("hafleet-renderer"));
        cmd.arg("run")
            .env("HAFLEET_NATS_URL", nats.url_for("hafleet-renderer"))
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
