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

use anyhow::{Context as _, Result};
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
    /// Pods mode at scale: 10,000 ClusterIP Services × 3 pods, time to served, an endpoint
    /// change to served, reloads, HAProxy's and the watcher's memory.
    Pods(pods::PodsArgs),
}

#[path = "../bench/pods.rs"]
mod pods;
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
    /// Milliseconds without any change before each change timed one at a time (and before its
    /// Service of its own): each is then a lone change, as a user's edit is, which the watcher
    /// resolves at once after a second without one. 0: back to back, as the bench did before
    /// 2026-11-28 (each then waits out the watcher's --quiet).
    #[arg(long, default_value_t = 1100)]
    pause_ms: u64,
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
    /// HTTPRoutes instead of Ingresses, on a Gateway `edge` of the fleet (the Gateway API's
    /// CRDs installed first): each `<name>` routes `<host>/` to the Service's port 80.
    #[arg(long)]
    http_routes: bool,
}

/// What the pipeline bench creates: Ingresses, or HTTPRoutes on the Gateway `edge`.
struct Creator {
    ingresses: Api<Ingress>,
    routes: Option<Api<kube::api::DynamicObject>>,
}

impl Creator {
    /// Creates `name` routing `host/` to Service `service` port 80.
    async fn create(&self, name: &str, host: &str, service: &str) -> Result<()> {
        match &self.routes {
            None => {
                self.ingresses
                    .create(&PostParams::default(), &ingress_to(name, host, service))
                    .await?;
            }
            Some(routes) => {
                let route: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
                    "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"parentRefs": [{"name": "edge"}], "hostnames": [host],
                             "rules": [{"backendRefs": [{"name": service, "port": 80}]}]}
                }))?;
                routes.create(&PostParams::default(), &route).await?;
            }
        }
        Ok(())
    }

    /// How many of the objects it created have no status from hafleet yet: an HTTPRoute whose
    /// parent status is not `Accepted` for its generation. Each is a status write still to come, which the API server, etcd and the
    /// watcher share the machine's two cores with.
    async fn unsettled(&self) -> Result<usize> {
        let params = kube::api::ListParams::default();
        Ok(match &self.routes {
            // The bench's fleet has no addresses (`HAFLEET_FLEET_ADDRESSES`), so the watcher
            // writes no Ingress status.
            None => 0,
            Some(routes) => {
                let list = routes.list(&params).await?;
                let accepted = |r: &kube::api::DynamicObject| {
                    let generation = r.metadata.generation.unwrap_or(0);
                    let parents =
                        r.data["status"]["parents"].as_array().cloned().unwrap_or_default();
                    parents.iter().any(|p| {
                        let conditions = p["conditions"].as_array().cloned().unwrap_or_default();
                        conditions.iter().any(|c| {
                            c["type"] == "Accepted"
                                && c["status"] == "True"
                                && c["observedGeneration"].as_i64() == Some(generation)
                        })
                    })
                };
                list.items.iter().filter(|r| !accepted(r)).count()
            }
        })
    }

    /// What it creates, for the report.
    fn what(&self) -> &'static str {
        if self.routes.is_some() { "HTTPRoute" } else { "Ingress" }
    }

    /// [`Api::what`] in the plural.
    fn whats(&self) -> &'static str {
        if self.routes.is_some() { "HTTPRoutes" } else { "Ingresses" }
    }
}

/// Installs the Gateway API's CRDs, hafleet's GatewayClass and the Gateway `edge` of the fleet
/// (routes of namespace `default`), and restarts the watcher to find them.
async fn gateway_api(stack: &mut Stack) -> Result<Api<kube::api::DynamicObject>> {
    let crds = stack.dir().join("gateway-api");
    std::fs::create_dir_all(&crds)?;
    hafleet_tests::gateway_api::install_crds(&stack.kube, &crds).await?;
    let client = stack.kube.client().await?;
    let class = serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": "hafleet"},
        "spec": {"controllerName": hafleet_tests::gateway_api::CONTROLLER_NAME}
    });
    let gateway = serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "edge", "namespace": "default", "annotations": {"hafleet.io/fleet": "edge"}},
        "spec": {"gatewayClassName": "hafleet",
                 "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}
    });
    for object in [class, gateway] {
        hafleet_tests::gateway_api::create(&client, object).await?;
    }
    let ar = hafleet_tests::gateway_api::resource("HTTPRoute");
    Ok(Api::namespaced_with(client, "default", &ar))
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
    /// The latency budget, hop by hop, each change's: created → route event stored, → version
    /// stored, → the canary's apply done, → every host's apply done.
    hops: [Vec<f64>; 4],
}

/// When a stream stored the newest message on `subject`, in Unix ms.
async fn stored_at(stack: &Stack, stream: &str, subject: &str) -> Result<f64> {
    let js = async_nats::jetstream::new(stack.nats.client().await?);
    let stream = js.get_stream(stream).await?;
    let m = stream.get_last_raw_message_by_subject(subject).await?;
    Ok((m.time.unix_timestamp_nanos() / 1_000) as f64 / 1000.0)
}

impl Measured {
    /// Creates `name` (routing `host` to `service`) and waits until `host` answers everywhere; takes each host's report of
    /// the version that made it live.
    async fn change(
        &mut self,
        stack: &Stack,
        api: &Creator,
        (name, host, service): (&str, &str, &str),
    ) -> Result<()> {
        api.create(name, host, service).await?;
        let started = Instant::now();
        let created_ms = hafleet_runtime::now_unix_ms() as f64;
        until_served(stack, host).await?;
        self.converge.push(started.elapsed().as_secs_f64() * 1000.0);
        // A host serves the route before the applier reports: wait for the report of the
        // version that made it live.
        let version = stack.latest_version().await?.map(|v| v.version).unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut finished: Vec<f64> = Vec::new();
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
            finished.push(report.finished_unix_ms as f64);
            self.sent.push(report.sent_bytes as f64);
            self.reloads += report.reloads;
            self.bridged += report.bridged;
            self.reports += 1;
        }
        let fleet = hafleet_proto::FleetName::new(stack.fleet.as_str())?;
        let event =
            stored_at(stack, hafleet_proto::ROUTES_STREAM, &hafleet_proto::routes_subject(&fleet))
                .await?;
        let config = stored_at(
            stack,
            hafleet_proto::CONFIGS_STREAM,
            &hafleet_proto::configs_subject(&fleet),
        )
        .await?;
        finished.sort_by(f64::total_cmp);
        let (canary, last) = (finished[0], finished[finished.len() - 1]);
        for (hop, ms) in self.hops.iter_mut().zip([
            event - created_ms,
            config - event,
            canary - config,
            last - canary,
        ]) {
            hop.push(ms.max(0.0));
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

/// A memory figure of process `pid` from `/proc/<pid>/status` (`VmRSS`: resident now,
/// `VmHWM`: its peak), in MB.
fn memory_mb(pid: u32, field: &str) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {field} for {pid}"))?;
    Ok(kb / 1024.0)
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
        Some(Mode::Pods(args)) => pods::run(args).await,
        None => pipeline(cli.pipeline).await,
    }
}

async fn pipeline(args: Args) -> Result<()> {
    let mut stack = Stack::start("edge", args.hosts).await?;
    // The bench changes one namespace's Ingresses back to back, as fast as they go live: it
    // measures the pipeline, so the watcher's per-namespace budget is off.
    let routes = match args.http_routes {
        true => Some(gateway_api(&mut stack).await?),
        false => None,
    };
    stack.restart_with(Component::Watcher, &[("HAFLEET_NAMESPACE_CHANGES_PER_MINUTE", "0")])?;
    let stack = stack;
    let (nodes, mut backends) = ready_nodes(&stack, args.nodes).await?;
    backends.extend(service_with_backends(&stack, "web", &nodes).await?);
    let ingresses: Api<Ingress> = Api::namespaced(stack.kube.client().await?, "default");
    let api = Creator { ingresses, routes };

    // Warm-up: the first rollout also opens SSH connections.
    api.create("warm", "warm.example.com", "web").await?;
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
        match api.routes {
            None => create_ingresses(&stack, "edge", existing).await?,
            Some(_) => {
                use futures::StreamExt as _;
                let api = &api;
                let created =
                    futures::stream::iter(existing)
                        .map(|(name, host, service)| async move {
                            api.create(&name, &host, &service).await
                        })
                        .buffer_unordered(16)
                        .collect::<Vec<_>>()
                        .await;
                created.into_iter().collect::<Result<Vec<()>>>()?;
            }
        }
        let sent = started.elapsed().as_secs_f64();
        until_served(&stack, &format!("existing-{last}.example.com")).await?;
        until_served(&stack, "existing-0.example.com").await?;
        let size = stack.latest_version().await?.map(|v| v.size).unwrap_or(0);
        println!(
            "{} existing {} on {} Services, {} nodes: created in {sent:.1} s, served \
             everywhere after {:.1} s; config + maps {:.1} MB",
            args.existing,
            api.whats(),
            if args.own_services { args.existing } else { 1 },
            args.nodes,
            started.elapsed().as_secs_f64(),
            size as f64 / 1e6
        );
        // The changes are timed on a settled cluster: the statuses of what was just created
        // are written after it is served, and those writes share the cores with what is timed.
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let left = api.unsettled().await?;
            if left == 0 {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "{left} without a status after 300 s");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        println!("… every one's status written after {:.1} s\n", started.elapsed().as_secs_f64());
    }

    let (mut known, mut new) = (Measured::default(), Measured::default());
    let pause = Duration::from_millis(args.pause_ms);
    for i in 0..args.sequential {
        let host = format!("seq-{i}.example.com");
        tokio::time::sleep(pause).await;
        known.change(&stack, &api, (&format!("seq-{i}"), &host, "web")).await?;
        // A Service of its own, with a backend on every node it is routed to, before its
        // Ingress.
        let service = format!("svc-{i}");
        tokio::time::sleep(pause).await;
        backends.extend(service_with_backends(&stack, &service, &nodes).await?);
        let host = format!("own-{i}.example.com");
        tokio::time::sleep(pause).await;
        new.change(&stack, &api, (&format!("own-{i}"), &host, &service)).await?;
    }

    let versions_before = stack.latest_version().await?.map(|v| v.version).unwrap_or(0);
    let started = Instant::now();
    for i in 0..args.burst {
        api.create(&format!("burst-{i}"), &format!("burst-{i}.example.com"), "web").await?;
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
                &format!("{} {what}: created → served by every host", api.what()),
                m.converge.clone()
            )
        );
        let apply = format!("{} {what}: apply on one host", api.what());
        println!("{}", percentiles(&apply, m.apply.clone()));
    }
    println!("\n| latency budget, hop by hop | n | p50 ms | p90 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|---|");
    for (what, m) in [("on a routed Service", &known), ("on a new Service", &new)] {
        for (hop, ms) in [
            "created → route event stored (watcher)",
            "→ version stored (renderer)",
            "→ the canary's apply done (applier)",
            "→ every host's apply done (applier)",
        ]
        .iter()
        .zip(&m.hops)
        {
            println!("{}", percentiles(&format!("{what}: {hop}"), ms.clone()));
        }
    }
    println!(
        "\nreloads per host report: {} of {} on a routed Service, {} of {} on a new Service \
         (of which served through a spare before the reload: {})",
        known.reloads, known.reports, new.reloads, new.reports, new.bridged
    );
    println!("\n| files sent to a host per change (bytes) | n | p50 | p90 | p99 | max |");
    println!("|---|---|---|---|---|---|");
    for (what, m) in [("on a routed Service", &known), ("on a new Service", &new)] {
        println!("{}", percentiles(&format!("{} {what}", api.what()), m.sent.clone()));
    }
    println!(
        "\nburst: {} {} created back to back → all served by all {} hosts in {:.0} ms, \
         in {} config versions",
        args.burst,
        api.whats(),
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
                pods: None,
            };
            let route = Route {
                host: Some(HttpHost::new(format!("app-{i}.example.com"))?),
                path: HttpPath::root(),
                kind: PathKind::Prefix,
                backend,
                more: None,
            };
            let entry = IngressEntry {
                created_unix: i as i64,
                resource_version: "1".into(),
                routes: vec![route].into(),
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

#[path = "../bench/routing.rs"]
mod routing;

#[path = "../bench/reload.rs"]
mod reload;

#[path = "../bench/history.rs"]
mod history;

mod watcher {
    //! The watcher's start on a big cluster: 200 Ready nodes, and 10,000 Ingresses each on a
    //! NodePort Service of its own, in the real API server. Each run starts the watcher (release
    //! build, default settings) and times it from the process starting to its first snapshot
    //! published, which comes after every Ingress's routes and the nodes are published and
    //! acked by JetStream; then reads its peak resident memory (VmHWM). The renderer and the
    //! applier are stopped, so the two cores are the watcher's, the API server's and NATS's.
    //!
    //! With `--fleets N` the Ingresses are spread over N fleets (`edge`, `edge-1`, …), one
    //! watcher for all. With `--renderer` the renderer runs too: after the first run, once it
    //! has published a version of every fleet, its peak memory is read; then one Ingress is
    //! added on `edge`, timed from its create to `edge`'s next version published, and the
    //! other fleets' versions are checked to stay as they were (no version published for them
    //! within 3 s).

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
        /// Fleets the Ingresses are spread over, one watcher for all.
        #[arg(long, default_value_t = 1)]
        fleets: usize,
        /// NodePort Services the Ingresses go to, Ingress i to Service i modulo this (the test
        /// API server has 12,768 node ports); default: one per Ingress.
        #[arg(long)]
        services: Option<usize>,
        /// Keeps the renderer running: its memory, and a change on one fleet (see above).
        #[arg(long)]
        renderer: bool,
    }

    /// The name of fleet `n` of the bench.
    fn fleet(n: usize) -> String {
        if n == 0 { "edge".to_owned() } else { format!("edge-{n}") }
    }

    /// Versions the renderer published, per fleet, as its log says.
    fn published(stack: &Stack) -> std::collections::BTreeMap<String, usize> {
        let log = std::fs::read_to_string(stack.log_path(Component::Renderer)).unwrap_or_default();
        let mut out = std::collections::BTreeMap::new();
        for line in log.lines().filter(|l| l.contains("version published")) {
            if let Some(f) = line.split("fleet=").nth(1).and_then(|r| r.split_whitespace().next()) {
                *out.entry(f.to_owned()).or_default() += 1;
            }
        }
        out
    }

    /// Waits until `until` holds of what the renderer published (at most `secs`).
    async fn wait_published(
        stack: &Stack,
        secs: u64,
        until: impl Fn(&std::collections::BTreeMap<String, usize>) -> bool,
    ) -> Result<()> {
        let started = Instant::now();
        while !until(&published(stack)) {
            anyhow::ensure!(started.elapsed() < Duration::from_secs(secs), "not in {secs} s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    fn snapshots(stack: &Stack) -> usize {
        std::fs::read_to_string(stack.log_path(Component::Watcher))
            .unwrap_or_default()
            .matches("snapshot published")
            .count()
    }

    pub async fn run(a: WatcherArgs) -> Result<()> {
        let fleets = a.fleets.max(1);
        let mut stack = Stack::start("edge", 1).await?;
        for c in [Component::Watcher, Component::Renderer, Component::Applier] {
            if !(a.renderer && c == Component::Renderer) {
                stack.kill(c);
            }
        }
        let started = Instant::now();
        let (_nodes, _processes) = ready_nodes(&stack, a.nodes).await?;
        let services = a.services.unwrap_or(a.ingresses).max(1);
        create_services(&stack, (0..services).map(|i| format!("svc-{i}"))).await?;
        for f in 0..fleets {
            let ingresses = (0..a.ingresses).filter(|i| i % fleets == f).map(|i| {
                let service = format!("svc-{}", i % services);
                (format!("ing-{i}"), format!("ing-{i}.example.com"), service)
            });
            create_ingresses(&stack, &fleet(f), ingresses).await?;
        }
        println!(
            "{} nodes, {services} Services and {} Ingresses on {fleets} fleet(s) created in \
             {:.1} s\n",
            a.nodes,
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
            let rss = crate::memory_mb(pid, "VmHWM")?;
            println!("| {run} | {took:.2} | {rss:.0} |");
            if a.renderer && run == 1 {
                renderer_and_one_change(&mut stack, fleets).await?;
            }
            stack.kill(Component::Watcher);
        }
        Ok(())
    }

    /// The renderer's memory once every fleet has a version, and one change on `edge`: the
    /// watcher runs.
    async fn renderer_and_one_change(stack: &mut Stack, fleets: usize) -> Result<()> {
        let started = Instant::now();
        let every = |p: &std::collections::BTreeMap<String, usize>| {
            (0..fleets).all(|f| p.get(&fleet(f)).is_some_and(|n| *n > 0))
        };
        wait_published(stack, 600, every).await?;
        // Settled: nothing published for 3 s.
        let mut last = published(stack);
        loop {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let now = published(stack);
            if now == last {
                break;
            }
            last = now;
        }
        let pid = stack.pid(Component::Renderer).context("the renderer runs")?;
        let rss = crate::memory_mb(pid, "VmHWM")?;
        println!(
            "\nrenderer: a version of each of {fleets} fleet(s) published {:.1} s after the \
             watcher's snapshot was; peak RSS {rss:.0} MB",
            started.elapsed().as_secs_f64()
        );
        let before = published(stack);
        let edge = before.get("edge").copied().unwrap_or(0);
        let added = Instant::now();
        let one = std::iter::once((
            "ing-added".to_owned(),
            "ing-added.example.com".to_owned(),
            "svc-0".to_owned(),
        ));
        create_ingresses(stack, "edge", one).await?;
        wait_published(stack, 60, |p| p.get("edge").copied().unwrap_or(0) > edge).await?;
        let took = added.elapsed().as_secs_f64() * 1000.0;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = published(stack);
        let others_moved: Vec<&String> = after
            .iter()
            .filter(|(f, n)| f.as_str() != "edge" && before.get(*f) != Some(*n))
            .map(|(f, _)| f)
            .collect();
        println!(
            "one Ingress added on edge: created → edge's version published in {took:.0} ms; \
             other fleets with a new version: {others_moved:?}\n"
        );
        Ok(())
    }
}

#[path = "../bench/applier.rs"]
mod applier;
