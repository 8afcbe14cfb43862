//! hafleet-bench: end-to-end latency on real parts. Starts the loopback stack and measures:
//! - one Ingress at a time: from `create` returning to the route answering through every
//!   HAProxy host, and each host's apply time as its report gives it;
//! - a burst: N Ingresses created back to back, until all answer everywhere, and how many
//!   config versions the renderer made for them (coalescing).
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
    let args = Args::parse();
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
