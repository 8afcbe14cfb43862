//! Bounded churn (`hafleet-watcher --namespace-changes-per-minute`): a namespace that changes
//! its Ingress in a loop reloads its fleet no more often than its budget allows, is told so
//! with a `Throttled` Event, and its last state goes live once it stops; another namespace's
//! change made meanwhile goes live at once.

use crate::refusals::warning_event_in;
use crate::{CONVERGE, World, expect_everywhere};
use anyhow::{Context as _, Result};
use hafleet_tests::fixtures::IngressBuilder;
use hafleet_tests::stack::Component;
use hafleet_tests::{HttpBackend, eventually};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::{Duration, Instant};

/// The budget under test: a change every 10 s, a burst of one.
const PER_MINUTE: u32 = 6;
const INTERVAL: Duration = Duration::from_secs(60 / PER_MINUTE as u64);
const BURST: u32 = 1;

fn ingress(name: &str, host: &str, service: &str, balance: &str) -> Ingress {
    IngressBuilder::new(name)
        .fleet("edge")
        .annotate("balance", balance)
        .route(host, "/", service)
        .build()
}

/// Each host's reloads so far.
fn reloads(world: &World) -> Result<Vec<u32>> {
    world.stack.hosts.iter().map(|h| h.reload_count()).collect()
}

/// Waits until every host has reported the fleet's newest version.
async fn settled(world: &World) -> Result<()> {
    let version = world.stack.latest_version().await?.context("a version")?.version;
    for h in &world.stack.hosts {
        world.report(h.name(), version).await?;
    }
    Ok(())
}

/// Namespace `default` toggles `hafleet.io/balance` of one Ingress 100 times in a minute (the
/// 100th to a third value); meanwhile namespace `team-b` creates an Ingress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_toggling_an_annotation_reloads_its_fleet_no_more_than_its_budget() -> Result<()>
{
    let mut world = World::start().await?;
    let per_minute = PER_MINUTE.to_string();
    world.stack.restart_with(
        Component::Watcher,
        &[("HAFLEET_NAMESPACE_CHANGES_PER_MINUTE", per_minute.as_str())],
    )?;
    world.stack.until_ready(Component::Watcher, CONVERGE).await?;
    let stack = &world.stack;
    let loud = ingress("loud", "loud.example.com", "web", "roundrobin");
    world.ingresses.create(&PostParams::default(), &loud).await?;
    expect_everywhere(stack, "loud.example.com", "/", 200, "web@").await?;
    settled(&world).await?;

    // team-b's Service, served on both nodes.
    let client = stack.kube.client().await?;
    stack.kube.ensure_namespace("team-b").await?;
    let node_port = stack.kube.create_nodeport_service("team-b", "shop", 80).await?;
    let mut shop_backends = Vec::new();
    for node in Api::<Node>::all(client.clone()).list(&ListParams::default()).await? {
        let ip = node
            .status
            .and_then(|s| s.addresses)
            .and_then(|a| a.into_iter().find(|a| a.type_ == "InternalIP"))
            .context("a node's InternalIP")?
            .address
            .parse()?;
        let name = format!("shop@{}", node.metadata.name.unwrap_or_default());
        shop_backends.push(HttpBackend::start(ip, u16::try_from(node_port)?, &name).await?);
    }
    let team_b: Api<Ingress> = Api::namespaced(client.clone(), "team-b");

    let before = reloads(&world)?;
    let started = Instant::now();
    let toggler = {
        let ingresses = world.ingresses.clone();
        tokio::spawn(async move {
            let mut at = tokio::time::Instant::now();
            for i in 0..100 {
                let balance = match i {
                    99 => "source",
                    i if i % 2 == 0 => "leastconn",
                    _ => "roundrobin",
                };
                let patch = json!({"metadata": {"annotations": {"hafleet.io/balance": balance}}});
                ingresses.patch("loud", &PatchParams::default(), &Patch::Merge(&patch)).await?;
                if i == 99 {
                    break;
                }
                at += Duration::from_millis(600);
                tokio::time::sleep_until(at).await;
            }
            anyhow::Ok(Instant::now())
        })
    };

    // Half way: another namespace's new Ingress goes live as fast as the pipeline goes, not
    // when the toggling namespace's next change is due.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let created = Instant::now();
    let shop = ingress("shop", "shop.example.com", "shop", "roundrobin");
    team_b.create(&PostParams::default(), &shop).await?;
    expect_everywhere(stack, "shop.example.com", "/", 200, "shop@").await?;
    let other_live = created.elapsed();
    println!("team-b's Ingress live on every host {other_live:?} after it was created");
    assert!(other_live < INTERVAL, "{other_live:?}: held behind namespace default's budget?");

    let stopped = toggler.await??;
    let toggled = stopped - started;
    let during = reloads(&world)?;
    // Changes of `default` that may go in `toggled`: the burst and one a token after it. One
    // more reload for team-b's Ingress. Without the budget it would be up to 100.
    let most = BURST + (toggled.as_secs_f64() / INTERVAL.as_secs_f64()).ceil() as u32 + 1;
    for ((h, b), d) in stack.hosts.iter().zip(&before).zip(&during) {
        println!("{}: {} reloads in {toggled:?} of toggling (at most {most})", h.name(), d - b);
        assert!(
            d - b <= most,
            "{}: {} reloads, more than {most}\n{}",
            h.name(),
            d - b,
            stack.logs()
        );
    }

    // The namespace was told, once for this generation (annotations do not make a new one).
    let told = warning_event_in(stack, "default", "loud", "Throttled").await?;
    let note = told.note.unwrap_or_default();
    assert!(note.contains("--namespace-changes-per-minute 6"), "{note}");
    let events: Api<Event> = Api::namespaced(client, "default");
    let throttled = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Throttled"))
        .count();
    assert_eq!(throttled, 1, "one Throttled Event for the generation");

    // The last state goes live once a token is due: at most an interval after the last
    // change, and the pipeline's time.
    for h in &stack.hosts {
        eventually(INTERVAL + CONVERGE, &format!("{}: balance source", h.name()), || async move {
            anyhow::ensure!(h.live_config().contains("\n    balance source\n"), "not yet");
            Ok(())
        })
        .await?;
    }
    let final_live = stopped.elapsed();
    println!("the last state live on every host {final_live:?} after the last change");
    assert!(final_live < INTERVAL + Duration::from_secs(10), "{final_live:?}");
    settled(&world).await?;
    let after = reloads(&world)?;
    for (b, a) in before.iter().zip(&after) {
        assert!(a - b <= most + 1, "{} reloads in all, more than {}", a - b, most + 1);
    }
    expect_everywhere(stack, "loud.example.com", "/", 200, "web@").await?;
    drop(shop_backends);
    Ok(())
}
