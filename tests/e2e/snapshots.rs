//! The watcher's start-up snapshot at any size, and its start-up when NATS does not answer.
//!
//! - a restart whose snapshot is over 2 MB (twice what a NATS message may carry) publishes it
//!   in parts; the renderer joins them and sweeps what was deleted meanwhile, and no more;
//! - SIGTERM ends a watcher that is retrying its initial publish against a NATS server that
//!   does not answer;
//! - what a snapshot keeps of refused Ingresses is capped per namespace.

use crate::{CONVERGE, World, expect_everywhere, ingress};
use anyhow::{Context as _, Result};
use futures::StreamExt as _;
use hafleet_tests::eventually;
use hafleet_tests::stack::Component;
use kube::api::{Api, DeleteParams, PostParams};
use std::time::{Duration, Instant};

/// A 253-character name (the most Kubernetes allows) in dot-separated parts of at most 63.
fn long_name(i: usize) -> String {
    let first = format!("s{i:05}-{}", "x".repeat(56));
    format!("{first}.{}.{}.{}", "y".repeat(63), "z".repeat(63), "w".repeat(61))
}

fn host(i: usize) -> String {
    format!("i{i}.bulk.example.com")
}

/// The value of `field=` on the last line of `log` that contains `message`.
fn field(log: &str, message: &str, field: &str) -> Option<u64> {
    let line = log.lines().rev().find(|l| l.contains(message))?;
    let at = line.find(&format!(" {field}="))? + field.len() + 2;
    line[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// 7,400 Ingresses named with 253 characters make a snapshot of about 2.2 MB. The watcher,
/// killed, misses one deletion; started again it publishes the snapshot in parts, the renderer
/// withdraws that Ingress and only that one, replay rebuilds the same config from the stream,
/// and a change after the restart is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_a_snapshot_over_2_mb_sweeps_what_went_and_serves_the_next_change()
-> Result<()> {
    const COUNT: usize = 7_400;
    let mut world = World::with_hosts(1).await?;
    let started = Instant::now();
    let api = &world.ingresses;
    let created: Vec<Result<()>> = futures::stream::iter(0..COUNT)
        .map(|i| async move {
            let ing = ingress(&long_name(i), Some("edge"), &host(i), "/", "web");
            api.create(&PostParams::default(), &ing).await?;
            Ok(())
        })
        .buffer_unordered(32)
        .collect()
        .await;
    created.into_iter().collect::<Result<Vec<()>>>()?;
    let made = started.elapsed();
    // Served before the restart, the one to delete included.
    for i in [0, COUNT / 2, COUNT - 1] {
        expect_everywhere(&world.stack, &host(i), "/", 200, "web@").await?;
    }
    let served = started.elapsed();

    world.stack.kill(Component::Watcher);
    let gone = COUNT / 2;
    world.ingresses.delete(&long_name(gone), &DeleteParams::default()).await?;
    // Nobody told the renderer: still served.
    expect_everywhere(&world.stack, &host(gone), "/", 200, "web@").await?;

    let restarted = Instant::now();
    let log_path = world.stack.log_path(Component::Watcher);
    // The restarted run's log only (the log file is appended to).
    let before = std::fs::read_to_string(&log_path).map(|l| l.len()).unwrap_or(0);
    world.stack.start_component(Component::Watcher)?;
    let log_path = &log_path;
    let log = eventually(CONVERGE, "the restarted watcher's snapshot", || async move {
        let log = std::fs::read_to_string(log_path).unwrap_or_default();
        let log = log.get(before..).unwrap_or_default().to_owned();
        anyhow::ensure!(field(&log, "snapshot published", "parts").unwrap_or(0) > 0, "not yet");
        Ok(log)
    })
    .await?;
    let bytes = field(&log, "snapshot published", "bytes").context("bytes")?;
    let parts = field(&log, "snapshot published", "parts").context("parts")?;
    assert!(bytes > 2 * 1024 * 1024, "a snapshot of {bytes} bytes");
    assert!(parts >= 3, "{bytes} bytes in {parts} parts: more than a message each?");
    assert!(!log.contains("snapshot publish failed"), "{log}");

    // Swept: the deleted one only.
    expect_everywhere(&world.stack, &host(gone), "/", 404, "").await?;
    let swept = restarted.elapsed();
    for i in [0, 1, gone - 1, gone + 1, COUNT - 1] {
        expect_everywhere(&world.stack, &host(i), "/", 200, "web@").await?;
    }
    let renderer = std::fs::read_to_string(world.stack.log_path(Component::Renderer))?;
    assert!(!renderer.contains("parked"), "{renderer}");
    let newest = world.stack.latest_version().await?.context("a version")?;
    let sweep = newest.causes.iter().find(|c| c.what == "sweep").context("a sweep cause")?;
    assert_eq!(sweep.ingress.as_ref().map(|k| k.name.to_string()), Some(long_name(gone)));
    assert_eq!(newest.causes.iter().filter(|c| c.what == "sweep").count(), 1);

    // Replay, from the stream alone, joins the parts the same way: the same config.
    let (version, seq) = (newest.version.to_string(), sweep.stream_seq.to_string());
    let shown = crate::history::ok(&world, &["history", "show", &version]).await?;
    let replayed = crate::history::ok(&world, &["replay", "--until", &seq]).await?;
    assert_eq!(replayed, shown, "replay at the snapshot is version {version}");

    // The next change is served.
    world.route("after", "after.example.com", "/", "api").await?;
    expect_everywhere(&world.stack, "after.example.com", "/", 200, "api@").await?;
    eprintln!(
        "{COUNT} Ingresses created in {made:?}, served in {served:?}; after the restart a \
         {bytes}-byte snapshot in {parts} parts, swept in {swept:?}"
    );
    Ok(())
}

/// Freezes a process (SIGSTOP) until dropped (SIGCONT).
struct Frozen(u32);

impl Frozen {
    fn new(pid: u32) -> Result<Frozen> {
        let ok = std::process::Command::new("kill").args(["-STOP", &pid.to_string()]).status()?;
        anyhow::ensure!(ok.success(), "kill -STOP {pid}");
        Ok(Frozen(pid))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").args(["-CONT", &self.0.to_string()]).status();
    }
}

/// A watcher that becomes the leader while NATS does not answer (the server frozen with
/// SIGSTOP) retries its initial publish; SIGTERM ends it there, at once and cleanly, and the
/// failure was logged once per distinct error, without a backtrace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_watcher_retrying_its_initial_publish() -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let mut world = World::with_hosts(1).await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;

    // Another replica holds the lease, renewed every second until NATS is frozen.
    world.stack.kill(Component::Watcher);
    world.stack.kube.ensure_namespace("hafleet").await?;
    let leases: Api<Lease> = Api::namespaced(world.stack.kube.client().await?, "hafleet");
    let lease = |renewed: MicroTime| -> Result<Lease> {
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": "hafleet-watcher"},
            "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3,
                     "renewTime": renewed},
        }))?)
    };
    let now = || MicroTime(k8s_openapi::jiff::Timestamp::now());
    leases.create(&PostParams::default(), &lease(now())?).await?;
    let renewer = {
        let leases = leases.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(700)).await;
                let patch = serde_json::json!({"spec": {"renewTime": now()}});
                let params = kube::api::PatchParams::default();
                let _ = leases
                    .patch("hafleet-watcher", &params, &kube::api::Patch::Merge(&patch))
                    .await;
            }
        })
    };
    world.stack.start_component_with(
        Component::Watcher,
        &[
            ("HAFLEET_LEADER_ELECTION", "true"),
            ("HAFLEET_LEASE_DURATION", "3s"),
            ("HAFLEET_IDENTITY", "watcher-a"),
            ("RUST_BACKTRACE", "1"),
        ],
    )?;
    let log_path = world.stack.log_path(Component::Watcher);
    let log_path = &log_path;
    let logged = |needle: &'static str| async move {
        eventually(CONVERGE, needle, || async move {
            let log = std::fs::read_to_string(log_path).unwrap_or_default();
            anyhow::ensure!(log.contains(needle), "not yet");
            Ok(log)
        })
        .await
    };
    logged("standing by").await?;
    let nats = world.stack.nats.pid().context("nats pid")?;
    let frozen = Frozen::new(nats)?;
    renewer.abort();
    logged("took the lease").await?;
    logged("initial publish failed").await?;
    // Several tries later (each waits for an ack that never comes).
    tokio::time::sleep(Duration::from_secs(12)).await;

    let pid = world.stack.pid(Component::Watcher).context("watcher pid")?;
    let term = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status()?;
    assert!(term.success());
    let asked = Instant::now();
    let stack = &mut world.stack;
    let exited = hafleet_tests::wait_for(Duration::from_secs(20), || {
        let running = stack.is_running(Component::Watcher);
        async move { !running }
    })
    .await;
    let log = std::fs::read_to_string(log_path)?;
    assert!(exited, "the watcher did not stop after SIGTERM\n{log}");
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(10), "it took {took:?} to stop\n{log}");
    assert!(log.contains("watcher stopping (the initial state was not published)"), "{log}");
    assert!(!log.contains("stack backtrace"), "{log}");
    // Each failure said once: never the same error twice in a row.
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("initial publish failed"))
        .map(|l| l.split(" error=").nth(1).unwrap_or(l))
        .collect();
    assert!(said.windows(2).all(|w| w[0] != w[1]), "the same error said twice\n{log}");
    let said = said.len();
    drop(frozen);
    eprintln!("stopped {took:?} after SIGTERM; {said} failure(s) logged");
    Ok(())
}

/// With `--max-kept-per-namespace 2`, three Ingresses of a namespace edited into refused ones:
/// the two newest keep their last good routes (across a watcher restart too), the oldest is
/// withdrawn and told why with a `RefusedNotKept` Warning Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_ingresses_kept_for_their_routes_are_capped_per_namespace() -> Result<()> {
    use kube::api::{Patch, PatchParams};
    let mut world = World::with_hosts(1).await?;
    let cap = [("HAFLEET_MAX_KEPT_PER_NAMESPACE", "2")];
    world.stack.restart_with(Component::Watcher, &cap)?;
    let names = ["k1", "k2", "k3"];
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            // Creation times are in seconds: one each, so that "oldest" is k1.
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
        world.route(name, &format!("{name}.example.com"), "/", "web").await?;
    }
    for name in names {
        expect_everywhere(&world.stack, &format!("{name}.example.com"), "/", 200, "web@").await?;
    }
    for name in names {
        let patch = serde_json::json!({"spec": {"rules": [{"host": format!("{name}.example.com"),
            "http": {"paths": [{"path": "/a b", "pathType": "Prefix",
             "backend": {"service": {"name": "api", "port": {"number": 80}}}}]}}]}});
        world.ingresses.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    let stack = &world.stack;
    for name in names {
        crate::refusals::warning_event_in(stack, "default", name, "InvalidIngress").await?;
    }
    let told = crate::refusals::warning_event_in(stack, "default", "k1", "RefusedNotKept").await?;
    let note = told.note.unwrap_or_default();
    assert!(note.contains("--max-kept-per-namespace 2"), "{note}");
    expect_everywhere(stack, "k1.example.com", "/", 404, "").await?;
    for name in ["k2", "k3"] {
        expect_everywhere(stack, &format!("{name}.example.com"), "/", 200, "web@").await?;
    }

    // A restart keeps the same two: its snapshot names them and not k1. (A route created
    // once the snapshot is out is applied after it.)
    let snapshots = |stack: &hafleet_tests::stack::Stack| {
        let log = std::fs::read_to_string(stack.log_path(Component::Watcher)).unwrap_or_default();
        log.matches("snapshot published").count()
    };
    let before = snapshots(&world.stack);
    world.stack.restart_with(Component::Watcher, &cap)?;
    let stack = &world.stack;
    eventually(CONVERGE, "the restarted watcher's snapshot", || async move {
        anyhow::ensure!(snapshots(stack) > before, "not yet");
        Ok(())
    })
    .await?;
    world.route("after", "after.example.com", "/", "api").await?;
    let stack = &world.stack;
    expect_everywhere(stack, "after.example.com", "/", 200, "api@").await?;
    expect_everywhere(stack, "k1.example.com", "/", 404, "").await?;
    for name in ["k2", "k3"] {
        expect_everywhere(stack, &format!("{name}.example.com"), "/", 200, "web@").await?;
    }
    // Said once per watcher run (the log holds every run's, each after its "caches listed").
    let log = std::fs::read_to_string(stack.log_path(Component::Watcher))?;
    let runs: Vec<usize> = log
        .split("caches listed")
        .skip(1)
        .map(|run| run.matches("refused ingress no longer kept ingress=default/k1").count())
        .collect();
    // The World's first watcher (no cap) may be restarted before it lists (then its run left
    // no "caches listed"); the two runs with the cap each told k1 once.
    let (uncapped, capped) = runs.split_at(runs.len().saturating_sub(2));
    assert_eq!(capped, [1, 1], "k1 told once per watcher run?\n{log}");
    assert!(uncapped.len() <= 1 && uncapped.iter().all(|n| *n == 0), "{runs:?}\n{log}");
    Ok(())
}
