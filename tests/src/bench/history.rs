//! The history commands as an operator runs them: a separate `hafleet` process,
//! as the `hafleet-operator` NATS user, against real NATS and a running renderer. Route
//! events are published straight to the routes stream (as the watcher would), so no API
//! server or HAProxy is needed.

use anyhow::{Context, Result};
use hafleet_proto::{
    Backend, FleetName, HttpHost, HttpPath, IngressKey, Namespace, NodeAddr, NodesUpdate,
    ObjectName, PathKind, Route, RouteChange, RouteEvent, RouteMessage, SCHEMA_VERSION, ServiceRef,
    TrafficPolicy,
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
        pods: None,
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
                more: None,
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
        let out = tokio::process::Command::new(bin_path("hafleet"))
            .args(args)
            .envs(nats.env_for("hafleet-operator"))
            .env("RUST_LOG", "warn")
            .output()
            .await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
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
        .envs(nats.env_for("hafleet-renderer"))
        .env("HAFLEET_SIGNING_KEY", &signing.private)
        .env("HAFLEET_DATA_DIR", dir.path().join("renderer-data"))
        .env("HAFLEET_COALESCE", "5ms")
        // No checkpoint inside the run: replay reads every event from the stream.
        .env("HAFLEET_CHECKPOINT_EVERY", "1000000000");
    let _renderer =
        ChildGuard::spawn("hafleet-renderer", &mut cmd, &dir.path().join("renderer.log"))?;
    let bus = nats.bus().await?;
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
        &["history", "list", "--fleet", "small", "--limit", &limit, "-o", "json"],
        a.runs,
    )
    .await?;
    let rows: serde_json::Value = serde_json::from_str(&out)?;
    anyhow::ensure!(rows.as_array().map(Vec::len) == Some(a.versions), "list returned {}", rows);

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
        timed(&nats, &["replay", "--fleet", "big", "--until", &until, "-o", "json"], a.runs.min(3))
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
    row(format!("replay of {events} events ({} Ingresses) --json", a.ingresses), replay, "< 10 s");
    println!("\n{} events published in {publish_s:.1} s", a.events);
    Ok(())
}
