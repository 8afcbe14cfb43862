//! `hafleet-bench pods`: a fleet whose Services send traffic straight to their pods. Creates
//! `--services` ClusterIP Services in pods mode (the fleet's default, `--endpoints edge=pods`),
//! each with an EndpointSlice of `--pods` ready endpoints and an Ingress, and measures:
//! - the time from the first Ingress created to every Ingress served by every host;
//! - an endpoint change (one pod replaced by a new one, one slice edit) to the new pod
//!   answering on every host and the old one on none, repeated `--changes` times, and the
//!   reloads it cost;
//! - each host's HAProxy worker memory and the watcher's peak memory.
//!
//! Only the Services the bench sends requests to have pods that listen (local servers on
//! loopback addresses); the others' endpoints are addresses nothing answers on, checked once
//! an hour (`hafleet.io/health-check-interval`) so that 30,000 health checks do not run on
//! the bench's 2 cores.

use anyhow::{Context, Result};
use futures::StreamExt as _;
use hafleet_tests::HttpBackend;
use hafleet_tests::pods::{Condition, Slices, answering, create_pods_service, ip, start_pod};
use hafleet_tests::stack::{Component, Stack};
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct PodsArgs {
    /// Services, each with its own Ingress and EndpointSlice.
    #[arg(long, default_value_t = 10_000)]
    services: usize,
    /// Endpoints per Service.
    #[arg(long, default_value_t = 3)]
    pods: usize,
    /// Endpoint changes measured.
    #[arg(long, default_value_t = 30)]
    changes: usize,
    /// HAProxy hosts.
    #[arg(long, default_value_t = 2)]
    hosts: usize,
}

/// The Service (and its Ingress and host) of index `i`.
fn name(i: usize) -> String {
    format!("pods-{i}")
}

/// An address for endpoint `j` of Service `i` that nothing listens on.
fn silent(i: usize, j: usize) -> Ipv4Addr {
    let n = u32::try_from(i * 8 + j).expect("fewer than 2^29 endpoints");
    Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 64, 0, 0)) + n)
}

/// Waits (polling every 5 ms, at most 120 s) until exactly `pods` answer `host` everywhere.
async fn until_answered_by(stack: &Stack, host: &str, pods: &[&HttpBackend]) -> Result<()> {
    let want: BTreeSet<String> = pods.iter().map(|p| p.name().to_owned()).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut all = true;
        for h in &stack.hosts {
            let seen = answering(h.http_addr(), host, 2 * want.len()).await.ok();
            all &= seen.as_ref() == Some(&want);
        }
        if all {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{host} never answered by {want:?}\n{}",
            stack.logs()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub async fn run(a: PodsArgs) -> Result<()> {
    let mut stack = Stack::start("edge", a.hosts).await?;
    stack.restart_with(
        Component::Watcher,
        &[("HAFLEET_ENDPOINTS", "edge=pods"), ("HAFLEET_NAMESPACE_CHANGES_PER_MINUTE", "0")],
    )?;
    let client = stack.kube.client().await?;
    let slices = Slices::of(client.clone(), "default").await?;
    let port = hafleet_tests::free_port(std::net::Ipv4Addr::LOCALHOST.into());
    // The first and the last Service have pods that answer.
    let last = a.services - 1;
    let mut live: Vec<Vec<HttpBackend>> = Vec::new();
    for i in [0, last] {
        let mut pods = Vec::new();
        for j in 0..a.pods {
            pods.push(start_pod(&format!("{}-{j}", name(i)), port).await?);
        }
        live.push(pods);
    }
    let endpoints = |i: usize| -> Vec<(Ipv4Addr, Condition)> {
        match i {
            0 => live[0].iter().map(|p| (ip(p), Condition::Ready)).collect(),
            i if i == last => live[1].iter().map(|p| (ip(p), Condition::Ready)).collect(),
            i => (0..a.pods).map(|j| (silent(i, j), Condition::Ready)).collect(),
        }
    };
    let started = Instant::now();
    let made = futures::stream::iter(0..a.services)
        .map(|i| {
            let (client, slices, eps) = (client.clone(), &slices, endpoints(i));
            async move {
                create_pods_service(client, "default", &name(i), port, false).await?;
                slices.put(&format!("{}-1", name(i)), &name(i), port, &eps).await
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    made.into_iter().collect::<Result<Vec<()>>>()?;
    println!(
        "{} ClusterIP Services with {} endpoints each created in {:.1} s",
        a.services,
        a.pods,
        started.elapsed().as_secs_f64()
    );
    let api: kube::Api<k8s_openapi::api::networking::v1::Ingress> =
        kube::Api::namespaced(client.clone(), "default");
    let api = &api;
    let started = Instant::now();
    let made = futures::stream::iter(0..a.services)
        .map(|i| async move {
            let b = hafleet_tests::fixtures::IngressBuilder::new(&name(i)).fleet("edge");
            // Only the Services with pods that answer are checked often.
            let b = match i == 0 || i == last {
                true => b,
                false => b.annotations(&[("hafleet.io/health-check-interval", "1h")]),
            };
            let ing = b.route(&format!("{}.example.com", name(i)), "/", &name(i)).build();
            api.create(&kube::api::PostParams::default(), &ing).await?;
            anyhow::Ok(())
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    made.into_iter().collect::<Result<Vec<()>>>()?;
    let sent = started.elapsed().as_secs_f64();
    let first: Vec<&HttpBackend> = live[0].iter().collect();
    until_answered_by(&stack, &format!("{}.example.com", name(0)), &first).await?;
    let lasts: Vec<&HttpBackend> = live[1].iter().collect();
    until_answered_by(&stack, &format!("{}.example.com", name(last)), &lasts).await?;
    let size = stack.latest_version().await?.map(|v| v.size).unwrap_or(0);
    println!(
        "{} Ingresses created in {sent:.1} s, every one served by every host after {:.1} s; \
         config + maps {:.1} MB",
        a.services,
        started.elapsed().as_secs_f64(),
        size as f64 / 1e6
    );
    let reloads = |stack: &Stack| -> Result<Vec<u32>> {
        stack.hosts.iter().map(|h| h.reload_count()).collect()
    };
    let before = reloads(&stack)?;

    // Endpoint changes: the oldest pod of Service 0 replaced by a new one, one slice edit.
    let host = format!("{}.example.com", name(0));
    let mut took = Vec::with_capacity(a.changes);
    for c in 0..a.changes {
        let new = start_pod(&format!("{}-new-{c}", name(0)), port).await?;
        let mut pods = std::mem::take(&mut live[0]);
        pods.remove(0);
        pods.push(new);
        let eps: Vec<_> = pods.iter().map(|p| (ip(p), Condition::Ready)).collect();
        let t = Instant::now();
        slices.put(&format!("{}-1", name(0)), &name(0), port, &eps).await?;
        let want: Vec<&HttpBackend> = pods.iter().collect();
        until_answered_by(&stack, &host, &want).await?;
        took.push(t.elapsed().as_secs_f64() * 1000.0);
        live[0] = pods;
    }
    let reloaded: Vec<u32> =
        reloads(&stack)?.iter().zip(&before).map(|(now, then)| now - then).collect();
    println!("| measure | n | p50 ms | p90 ms | p99 ms | max ms |\n|---|---|---|---|---|---|");
    println!(
        "{}",
        crate::percentiles("endpoint change (a pod replaced) → served by every host", took)
    );
    println!("\nreloads during the endpoint changes, per host: {reloaded:?}");
    for h in &stack.hosts {
        let proc = h.show_proc()?;
        let mut rss = 0.0;
        for pid in &proc.workers {
            rss += crate::memory_mb(*pid, "VmRSS")?;
        }
        println!("{}: HAProxy worker resident memory {rss:.0} MB", h.name());
    }
    let watcher = stack.pid(Component::Watcher).context("the watcher runs")?;
    let (now, peak) = (crate::memory_mb(watcher, "VmRSS")?, crate::memory_mb(watcher, "VmHWM")?);
    println!("watcher: resident memory {now:.0} MB, peak {peak:.0} MB");
    Ok(())
}
