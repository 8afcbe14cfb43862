//! Pods mode: HAProxy sends traffic straight to a Service's ready pods, from the
//! EndpointSlices the tests write (the pods are local servers on loopback addresses), and
//! follows them through the runtime API, without reloads.

use crate::{CONVERGE, World, expect_everywhere};
use anyhow::Result;
use hafleet_tests::assert::on_every_host;
use hafleet_tests::pods::{Condition, Slices, answering, create_pods_service, ip, start_pod};
use hafleet_tests::stack::{Component, Stack};
use hafleet_tests::{HttpBackend, http_get};
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// Waits until exactly `pods` answer `host` on every host, and says how long it took.
async fn until_served_by(stack: &Stack, host: &str, pods: &[&HttpBackend]) -> Result<Duration> {
    let started = Instant::now();
    let want: BTreeSet<String> = pods.iter().map(|p| p.name().to_owned()).collect();
    let what = format!("{host} served by exactly {want:?}");
    let want = &want;
    on_every_host(stack, CONVERGE, &what, |h| async move {
        // Round robin: twice as many requests as servers sees each of them.
        let seen = answering(h.http_addr(), host, 2 * want.len() + 2).await?;
        anyhow::ensure!(&seen == want, "answered by {seen:?}");
        Ok(())
    })
    .await?;
    Ok(started.elapsed())
}

/// Each host's master's reload counter.
fn reloads(stack: &Stack) -> Result<Vec<u32>> {
    stack.hosts.iter().map(|h| h.reload_count()).collect()
}

fn endpoints(pods: &[(&HttpBackend, Condition)]) -> Vec<(Ipv4Addr, Condition)> {
    pods.iter().map(|(p, c)| (ip(p), *c)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_goes_to_exactly_the_ready_pods_and_follows_them_without_a_reload() -> Result<()> {
    let world = World::start().await?;
    let stack = &world.stack;
    let client = stack.kube.client().await?;
    let port = hafleet_tests::free_port(std::net::Ipv4Addr::LOCALHOST.into());
    let pods: Vec<HttpBackend> = {
        let mut v = Vec::new();
        for i in 1..=4 {
            v.push(start_pod(&format!("shop-pod-{i}"), port).await?);
        }
        v
    };
    let [p1, p2, p3, p4] = [&pods[0], &pods[1], &pods[2], &pods[3]];
    create_pods_service(client.clone(), "default", "shop", port, true).await?;
    let slices = Slices::of(client, "default").await?;
    use Condition::{NotReady, Ready, Terminating};
    slices
        .put("shop-1", "shop", port, &endpoints(&[(p1, Ready), (p2, Ready), (p3, NotReady)]))
        .await?;
    world.route("shop", "shop.example.com", "/", "shop").await?;
    until_served_by(stack, "shop.example.com", &[p1, p2]).await?;
    let config = stack.hosts[0].live_config();
    assert!(config.contains(&format!("server {0}:{port} {0}:{port}", ip(p1))), "{config}");
    assert!(!config.contains(&ip(p3).to_string()), "not ready: not listed\n{config}");
    let before = reloads(stack)?;

    // Out of rotation when not ready, in when ready: through the runtime API.
    slices
        .put("shop-1", "shop", port, &endpoints(&[(p1, Ready), (p2, NotReady), (p3, NotReady)]))
        .await?;
    let out = until_served_by(stack, "shop.example.com", &[p1]).await?;
    slices
        .put("shop-1", "shop", port, &endpoints(&[(p1, Ready), (p2, NotReady), (p3, Ready)]))
        .await?;
    let added = until_served_by(stack, "shop.example.com", &[p1, p3]).await?;
    println!("not ready → out of rotation on every host: {out:?}; ready → in: {added:?}");
    assert_eq!(reloads(stack)?, before, "endpoint changes reload nothing");

    // A terminating pod is drained: no new requests, and the one in progress finishes, even
    // when the endpoint goes from the slice while it runs.
    let h = &stack.hosts[0];
    slices.put("shop-1", "shop", port, &endpoints(&[(p3, Ready)])).await?;
    until_served_by(stack, "shop.example.com", &[p3]).await?;
    let slow = tokio::spawn({
        let addr = h.http_addr();
        async move { http_get(addr, "shop.example.com", "/slow/2500").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    slices.put("shop-1", "shop", port, &endpoints(&[(p3, Terminating), (p4, Ready)])).await?;
    until_served_by(stack, "shop.example.com", &[p4]).await?;
    let draining = stack.hosts[0].live_config();
    assert!(draining.contains(&format!("{0}:{port} {0}:{port} weight 0", ip(p3))), "{draining}");
    slices.put("shop-1", "shop", port, &endpoints(&[(p4, Ready)])).await?;
    let (status, body) = slow.await??;
    assert_eq!((status, body.starts_with("shop-pod-3 /slow/2500")), (200, true), "{body}");
    on_every_host(stack, CONVERGE, "p3 gone from the config", |h| async move {
        let config = h.live_config();
        anyhow::ensure!(!config.contains(&ip(p3).to_string()), "still listed");
        Ok(())
    })
    .await?;
    assert_eq!(reloads(stack)?, before, "draining and removal reload nothing");

    // Each pod is health-checked on its own: one that stops answering is taken out by
    // HAProxy before the slice says anything, and no request fails meanwhile (retried on
    // another server).
    slices.put("shop-1", "shop", port, &endpoints(&[(p1, Ready), (p4, Ready)])).await?;
    until_served_by(stack, "shop.example.com", &[p1, p4]).await?;
    let p1_server = format!("{}:{port}", ip(p1));
    let mut pods = pods;
    drop(pods.remove(0));
    let p4 = &pods[2];
    until_served_by(stack, "shop.example.com", &[p4]).await?;
    until_down(stack, &p1_server).await?;
    assert_eq!(reloads(stack)?, before, "health checks reload nothing");
    expect_everywhere(stack, "shop.example.com", "/", 200, "shop-pod-4").await?;

    // With `hafleet.io/health-check-path` the check is HTTP, for the pods the config lists and
    // for one added at runtime alike: a path that answers 503 takes every pod out.
    let patch = serde_json::json!({"metadata": {"annotations":
        {"hafleet.io/health-check-path": "/status/503"}}});
    let patch = kube::api::Patch::Merge(&patch);
    world.ingresses.patch("shop", &kube::api::PatchParams::default(), &patch).await?;
    expect_everywhere(stack, "shop.example.com", "/", 503, "").await?;
    let p5 = start_pod("shop-pod-5", port).await?;
    let settled = reloads(stack)?;
    slices.put("shop-1", "shop", port, &endpoints(&[(p4, Ready), (&p5, Ready)])).await?;
    until_down(stack, &format!("{}:{port}", ip(&p5))).await?;
    assert_eq!(reloads(stack)?, settled, "added at runtime, checked over HTTP");
    expect_everywhere(stack, "shop.example.com", "/", 503, "").await?;
    Ok(())
}

/// Waits until every host's HAProxy has server `name` down by its health check.
async fn until_down(stack: &Stack, name: &str) -> Result<()> {
    on_every_host(stack, CONVERGE, &format!("{name} down by its own check"), |h| async move {
        // `show servers state`: backend id and name, server id and name, address, then the
        // operational state (0: down).
        let state = h.master_cli("@1 show servers state")?;
        let line = state.lines().find(|l| l.split_whitespace().nth(3) == Some(name));
        let op = line.and_then(|l| l.split_whitespace().nth(5));
        anyhow::ensure!(op == Some("0"), "{line:?}");
        Ok(())
    })
    .await?;
    Ok(())
}

/// A Deployment of 20 pods rolled over one pod at a time (a new pod ready, then the old one
/// terminating, then gone and stopped), each step one slice edit, under a steady loop of
/// requests through every host: no request fails and no host reloads. The fleet sends its
/// Services to their pods by default (`--endpoints edge=pods`), without an annotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_of_20_pods_under_steady_requests_loses_none_and_reloads_nothing()
-> Result<()> {
    let mut world = World::start().await?;
    world.stack.restart_with(Component::Watcher, &[("HAFLEET_ENDPOINTS", "edge=pods")])?;
    let stack = &world.stack;
    let client = stack.kube.client().await?;
    let port = hafleet_tests::free_port(std::net::Ipv4Addr::LOCALHOST.into());
    let mut old = Vec::new();
    for i in 0..20 {
        old.push(Some(start_pod(&format!("v1-{i}"), port).await?));
    }
    create_pods_service(client.clone(), "default", "roll", port, false).await?;
    let slices = Slices::of(client, "default").await?;
    let ready = |p: &HttpBackend| (ip(p), Condition::Ready);
    let all: Vec<_> = old.iter().flatten().map(ready).collect();
    slices.put("roll-1", "roll", port, &all).await?;
    world.route("roll", "roll.example.com", "/", "roll").await?;
    let first: Vec<&HttpBackend> = old.iter().flatten().collect();
    until_served_by(stack, "roll.example.com", &first).await?;
    let before = reloads(stack)?;

    // The steady loop: one request after another through each host, until told to stop.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loops: Vec<_> = stack
        .hosts
        .iter()
        .map(|h| {
            let (addr, stop) = (h.http_addr(), stop.clone());
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0u32, Vec::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match http_get(addr, "roll.example.com", "/").await {
                        Ok((200, _)) => ok += 1,
                        Ok((status, body)) => failed.push(format!("{status} {body}")),
                        Err(e) => failed.push(format!("{e:#}")),
                    }
                }
                (ok, failed)
            })
        })
        .collect();

    let mut new: Vec<HttpBackend> = Vec::new();
    for i in 0..20 {
        new.push(start_pod(&format!("v2-{i}"), port).await?);
        let listed = |old: &[Option<HttpBackend>],
                      new: &[HttpBackend],
                      terminating: Option<usize>| {
            let olds = old.iter().enumerate().filter_map(|(j, p)| {
                let c =
                    if Some(j) == terminating { Condition::Terminating } else { Condition::Ready };
                p.as_ref().map(|p| (ip(p), c))
            });
            olds.chain(new.iter().map(ready)).collect::<Vec<_>>()
        };
        // The new pod is ready and the old one terminating: one edit, as the controller does.
        slices.put("roll-1", "roll", port, &listed(&old, &new, Some(i))).await?;
        let serving: Vec<&HttpBackend> = old
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, p)| p.as_ref())
            .chain(&new)
            .collect();
        until_served_by(stack, "roll.example.com", &serving).await?;
        // The old pod is gone from the slice, then stops.
        let gone = old[i].take();
        slices.put("roll-1", "roll", port, &listed(&old, &new, None)).await?;
        let name = gone.as_ref().map(|p| ip(p).to_string()).unwrap_or_default();
        let name = &name;
        on_every_host(stack, CONVERGE, &format!("{name} out of the config"), |h| async move {
            anyhow::ensure!(!h.live_config().contains(&format!("{name}:")), "still listed");
            Ok(())
        })
        .await?;
        drop(gone);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    for l in loops {
        let (ok, failed) = l.await?;
        assert!(
            failed.is_empty(),
            "{} of {} requests failed: {failed:?}",
            failed.len(),
            ok as usize + failed.len()
        );
        total += ok;
    }
    println!("{total} requests during the rolling update, none failed");
    assert!(total > 100, "the loop ran: {total} requests");
    assert_eq!(reloads(stack)?, before, "a rolling update reloads nothing");
    let serving: Vec<&HttpBackend> = new.iter().collect();
    until_served_by(stack, "roll.example.com", &serving).await?;
    Ok(())
}
