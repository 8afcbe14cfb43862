//! What each host runs stays what it was given: node health checks that drain a failing node,
//! drift (a config, map or certificate file edited or deleted on a host) repaired or reported,
//! and versions sent as edits of the files a host has.

use crate::{CONVERGE, World, expect_everywhere, expect_on, metrics};
use anyhow::{Context as _, Result};
use hafleet_proto::{ApplyOutcome, ApplyStage};
use hafleet_tests::stack::Component;
use hafleet_tests::{eventually, http_get};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_health_checks_each_node_once_drain_a_failing_node_and_can_be_turned_off() -> Result<()>
{
    // Node health checks are on by default: each node of the world answers on kube-proxy's
    // health port, 10256. The applier reads how each host sees them at each drift check.
    let mut world = World::start().await?;
    // (In the spelling of before, still taken for a release, with a warning.)
    world.stack.restart_with(Component::Applier, &[("HAFLEET_DRIFT_CHECK_SECS", "1")])?;
    let log_path = world.stack.log_path(Component::Applier);
    hafleet_tests::eventually(Duration::from_secs(20), "a deprecation warning", || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        async move {
            anyhow::ensure!(
                log.contains("--drift-check-secs (HAFLEET_DRIFT_CHECK_SECS) is deprecated")
                    && log.contains("use --drift-check 1s (HAFLEET_DRIFT_CHECK)"),
                "no deprecation warning: {log}"
            );
            Ok(())
        }
    })
    .await?;
    let health2 = world.node_health.pop().expect("node-2's health");
    let health1 = world.node_health.pop().expect("node-1's health");
    assert_eq!((health1.name(), health2.name()), ("healthy@node-1", "healthy@node-2"));
    assert_eq!(health2.addr().port(), 10256);
    world.route("shop", "shop.example.com", "/", "web").await?;
    world.route("blog", "blog.example.com", "/", "api").await?;
    let stack = &world.stack;
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;
    expect_everywhere(stack, "blog.example.com", "/", 200, "api@").await?;
    let config = stack.hosts[0].live_config();
    assert!(config.contains("backend hafleet_nodes"), "{config}");
    assert_eq!(config.matches(" no-check track hafleet_nodes/").count(), 4, "{config}");

    // Checks go to the nodes' health port, none to the Services' NodePorts.
    let nodeport_hits = |w: &World| w.backends.iter().map(|b| b.hits()).sum::<u64>();
    let (before, checks_before) = (nodeport_hits(&world), health1.hits() + health2.hits());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(nodeport_hits(&world), before, "no health check reached a NodePort");
    assert!(
        health1.hits() + health2.hits() >= checks_before + 4,
        "nodes checked: {} -> {}",
        checks_before,
        health1.hits() + health2.hits()
    );

    // node-2 stops answering for its health: every Service's servers on it are drained at once.
    drop(health2);
    let only_node_1 = |addr| async move {
        for (host, service) in [("shop.example.com", "web"), ("blog.example.com", "api")] {
            for _ in 0..4 {
                let (status, body) = http_get(addr, host, "/").await?;
                anyhow::ensure!(
                    status == 200 && body.starts_with(&format!("{service}@node-1")),
                    "{host}: {status} {body}"
                );
            }
        }
        Ok(())
    };
    for h in &stack.hosts {
        let what = format!("node-2 drained on {}", h.name());
        eventually(CONVERGE, &what, || only_node_1(h.http_addr())).await?;
        // ...and stays drained: its health check keeps failing.
        tokio::time::sleep(Duration::from_secs(3)).await;
        only_node_1(h.http_addr()).await?;
    }
    let nodes_seen = |down: u32| async move {
        eventually(CONVERGE, &format!("{down} of 2 nodes down"), || async move {
            let text = metrics(stack, Component::Applier).await?;
            for host in ["lb-1", "lb-2"] {
                for line in [
                    format!("hafleet_applier_nodes_checked{{fleet=\"edge\",host=\"{host}\"}} 2\n"),
                    format!(
                        "hafleet_applier_nodes_down{{fleet=\"edge\",host=\"{host}\"}} {down}\n"
                    ),
                ] {
                    anyhow::ensure!(text.contains(&line), "{line:?} not in\n{text}");
                }
            }
            Ok(())
        })
        .await
    };
    nodes_seen(1).await?;
    let every_node_fails = "every node's health check fails on this host";
    let applier_log = || std::fs::read_to_string(stack.log_path(Component::Applier));
    assert!(!applier_log()?.contains(every_node_fails), "one of two nodes fails");

    // Every node fails (as when the hosts cannot reach the health port): every Cluster
    // Service answers 503, and the applier says why, for each host.
    drop(health1);
    nodes_seen(2).await?;
    for h in &stack.hosts {
        let (status, body) = http_get(h.http_addr(), "shop.example.com", "/").await?;
        assert_eq!(status, 503, "{}: {body}", h.name());
        let log = applier_log()?;
        let warned = log.lines().any(|l| {
            l.contains(every_node_fails)
                && l.contains(&format!("host={}", h.name()))
                && l.contains("Connection refused")
        });
        assert!(warned, "no warning for {}:\n{log}", h.name());
    }

    // Turned off (for nodes without kube-proxy's health port), each server checks its own
    // NodePort again: node-2's still answer, so it serves again, health port or not.
    world.stack.restart_with(Component::Renderer, &[("HAFLEET_NODE_HEALTH_PORT", "0")])?;
    let stack = &world.stack;
    for h in &stack.hosts {
        let addr = h.http_addr();
        eventually(CONVERGE, &format!("node-2 back on {}", h.name()), || async move {
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..8 {
                let (status, body) = http_get(addr, "shop.example.com", "/").await?;
                anyhow::ensure!(status == 200, "{status} {body}");
                seen.insert(body.split_whitespace().next().unwrap_or_default().to_owned());
            }
            anyhow::ensure!(seen.iter().any(|b| b.starts_with("web@node-2")), "{seen:?}");
            Ok(())
        })
        .await?;
        let config = h.live_config();
        assert!(!config.contains("hafleet_nodes"), "{config}");
        assert_eq!(config.matches(" track ").count(), 0, "{config}");
    }
    eventually(CONVERGE, "no node checks to count", || async {
        let text = metrics(stack, Component::Applier).await?;
        let line = "hafleet_applier_nodes_checked{fleet=\"edge\",host=\"lb-1\"} NaN\n";
        anyhow::ensure!(text.contains(line), "{line:?} not in\n{text}");
        Ok(())
    })
    .await?;
    Ok(())
}

/// With node health on, every node is checked once whichever backends hold it: a backend whose
/// only node goes NotReady moves to the other node through the runtime API, without a reload
/// (adding a health check would need one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_node_health_a_backend_moves_to_another_node_without_a_reload() -> Result<()> {
    let mut world = World::start().await?;
    world.stack.restart_with(Component::Renderer, &[("HAFLEET_SERVERS_PER_BACKEND", "1")])?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    let stack = &world.stack;
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;

    let config = stack.hosts[0].live_config();
    let held: Vec<&str> = config
        .lines()
        .filter_map(|l| l.trim().strip_prefix("server "))
        .filter(|l| l.contains(" track hafleet_nodes/"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(held.len(), 1, "one node in web's subset\n{config}");
    let (held, other) =
        if held[0] == "node-1" { ("node-1", "node-2") } else { ("node-2", "node-1") };
    for node in ["node-1", "node-2"] {
        assert!(
            config
                .lines()
                .any(|l| l.trim().starts_with(&format!("server {node} ")) && l.contains(":10256")),
            "{node} checked once in hafleet_nodes, held or not\n{config}"
        );
    }

    let before = stack.latest_version().await?.expect("a version").version;
    let reloads_before: Vec<u32> =
        stack.hosts.iter().map(|h| h.reload_count()).collect::<Result<_>>()?;
    stack.kube.set_node_ready(held, false).await?;
    for h in &stack.hosts {
        let report = world.report(h.name(), before + 1).await?;
        assert_eq!(report.outcome, ApplyOutcome::Applied, "{report:?}");
        assert_eq!(report.reloads, 0, "moved without a reload: {report:?}");
        assert!(report.runtime_commands > 0, "{report:?}");
    }
    let reloads: Vec<u32> = stack.hosts.iter().map(|h| h.reload_count()).collect::<Result<_>>()?;
    assert_eq!(reloads, reloads_before, "no host reloaded");
    for h in &stack.hosts {
        for _ in 0..4 {
            let (status, body) = http_get(h.http_addr(), "shop.example.com", "/").await?;
            assert_eq!(status, 200, "{}", h.name());
            assert!(body.starts_with(&format!("web@{other}")), "{}: {body}", h.name());
        }
    }
    Ok(())
}

/// A stack whose applier checks for drift every `drift_check` (0s: never), with
/// `shop.example.com` live and reported on every host.
async fn shop_live_with_drift_checks_every(drift_check: &str) -> Result<World> {
    let mut world = World::start().await?;
    let env = [("HAFLEET_DRIFT_CHECK", drift_check)];
    world.stack.restart_with(Component::Applier, &env)?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let version = world.stack.latest_version().await?.expect("a version").version;
    for h in &world.stack.hosts {
        world.report(h.name(), version).await?;
    }
    Ok(world)
}

/// The map files on `host`, sorted.
fn map_files(host: &hafleet_tests::HaproxyHost) -> Result<Vec<std::path::PathBuf>> {
    let dir = host.config_path().parent().context("config dir")?.join("hafleet-maps");
    let mut maps: Vec<std::path::PathBuf> =
        std::fs::read_dir(&dir)?.map(|e| e.map(|e| e.path())).collect::<std::io::Result<_>>()?;
    maps.retain(|p| p.extension().is_some_and(|x| x == "map"));
    maps.sort();
    Ok(maps)
}

/// A host whose config is edited by hand is put back to its version (`--drift-policy repair`,
/// the default), or only reported, once (`report`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_edited_by_hand_is_repaired_or_reported_as_the_drift_policy_says() -> Result<()> {
    let mut world = shop_live_with_drift_checks_every("1s").await?;
    let lb2 = &world.stack.hosts[1];
    let file = |h: &hafleet_tests::HaproxyHost| std::fs::read_to_string(h.config_path());
    let good = file(lb2)?;
    std::fs::write(lb2.config_path(), format!("{good}# edited by hand\n"))?;
    let good = &good;
    eventually(CONVERGE, "lb-2 put back to its version", || async move {
        anyhow::ensure!(file(lb2)? == *good, "still edited");
        Ok(())
    })
    .await?;
    let stack = &world.stack;
    let repaired = eventually(CONVERGE, "the repair's report", || async move {
        let r = stack.last_report("lb-2").await?.context("no report")?;
        anyhow::ensure!(r.drift.is_some(), "{r:?}");
        Ok(r)
    })
    .await?;
    assert_eq!(repaired.outcome, ApplyOutcome::Applied, "{repaired:?}");
    // The file differs from what HAProxy last loaded through us, and nothing proves HAProxy
    // was not reloaded onto the edit by someone else: the repair reloads, to be sure.
    assert_eq!(repaired.reloads, 1, "{repaired:?}");
    let found = repaired.drift.unwrap_or_default();
    assert!(found.contains("the live config has sha256"), "{found}");

    // Report only: the edit stays, and is reported once, as drift.
    world.stack.restart_with(
        Component::Applier,
        &[("HAFLEET_DRIFT_CHECK", "1s"), ("HAFLEET_DRIFT_POLICY", "report")],
    )?;
    let lb2 = &world.stack.hosts[1];
    let stack = &world.stack;
    // The restarted applier converges first (nothing to do); then lb-2 is edited again.
    eventually(CONVERGE, "the restarted applier's start-up report", || async move {
        let r = stack.last_report("lb-2").await?.context("no report")?;
        anyhow::ensure!(r.drift.is_none() && r.outcome == ApplyOutcome::Unchanged, "{r:?}");
        Ok(())
    })
    .await?;
    std::fs::write(lb2.config_path(), format!("{good}# edited again\n"))?;
    let reported = eventually(CONVERGE, "the drift report", || async move {
        let r = stack.last_report("lb-2").await?.context("no report")?;
        anyhow::ensure!(r.drift.is_some(), "{r:?}");
        Ok(r)
    })
    .await?;
    let ApplyOutcome::Failed { stage, .. } = &reported.outcome else {
        panic!("drift left as it is is a failure at stage drift: {reported:?}");
    };
    assert_eq!(*stage, ApplyStage::Drift);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        file(lb2)?.ends_with("# edited again\n"),
        "report only: left as it is\n{}",
        std::fs::read_to_string(stack.log_path(Component::Applier)).unwrap_or_default()
    );
    let after = stack.last_report("lb-2").await?.context("no report")?;
    assert_eq!(after.finished_unix_ms, reported.finished_unix_ms, "reported once");

    // Someone reloads lb-1 by hand: its files are the version's, but the reload is not the
    // applier's, so HAProxy may run anything. Told apart by the master's reload count.
    stack.hosts[0].reload()?;
    let foreign = eventually(CONVERGE, "lb-1's foreign reload reported", || async move {
        let r = stack.last_report("lb-1").await?.context("no report")?;
        anyhow::ensure!(r.drift.is_some(), "{r:?}");
        Ok(r)
    })
    .await?;
    let found = foreign.drift.unwrap_or_default();
    assert!(found.contains("HAProxy was reloaded outside hafleet"), "{found}");
    assert!(!found.contains("live config"), "the files are the version's: {found}");
    Ok(())
}

/// A host whose map files are deleted or edited by hand gets them back from the drift check
/// (`repair`, the default), without a reload: HAProxy holds the maps it loaded, only the files
/// are wrong, and a later reload or restart would load them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_files_deleted_or_edited_on_a_host_are_put_back_without_a_reload() -> Result<()> {
    let world = shop_live_with_drift_checks_every("1s").await?;
    let lb2 = &world.stack.hosts[1];
    let maps = map_files(lb2)?;
    anyhow::ensure!(maps.len() >= 2, "a version has at least two map files: {maps:?}");
    let (gone, edited) = (&maps[0], &maps[1]);
    let (gone_text, edited_text) = (std::fs::read(gone)?, std::fs::read(edited)?);
    std::fs::remove_file(gone)?;
    let mut evil = edited_text.clone();
    evil.extend_from_slice(b"evil.example.com be_evil\n");
    std::fs::write(edited, &evil)?;
    let stack = &world.stack;
    let (gone_text, edited_text) = (&gone_text, &edited_text);
    let repaired = eventually(CONVERGE, "lb-2's map files put back", || async move {
        let r = stack.last_report("lb-2").await?.context("no report")?;
        anyhow::ensure!(r.drift.is_some(), "{r:?}");
        anyhow::ensure!(std::fs::read(gone).ok().as_ref() == Some(gone_text), "still gone");
        anyhow::ensure!(std::fs::read(edited)? == *edited_text, "still edited");
        Ok(r)
    })
    .await?;
    let found = repaired.drift.clone().unwrap_or_default();
    let name = |p: &std::path::Path| p.file_name().unwrap().to_string_lossy().into_owned();
    assert!(found.contains(&format!("map {} is missing", name(gone))), "{found}");
    assert!(found.contains(&format!("map {} was changed", name(edited))), "{found}");
    assert_eq!(repaired.outcome, ApplyOutcome::Applied, "{repaired:?}");
    assert_eq!(repaired.reloads, 0, "the files only: {repaired:?}");
    // Checked again: nothing left to find, and the site still served.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = stack.last_report("lb-2").await?.context("no report")?;
    assert_eq!(after.finished_unix_ms, repaired.finished_unix_ms, "repaired once: {after:?}");
    expect_on(std::slice::from_ref(lb2), stack, "shop.example.com", "/", 200, "web@").await?;
    Ok(())
}

/// With drift checks off, a map file deleted on a host comes back with the next apply there
/// (here the restarted applier's catch-up), without a reload: the config is the version's,
/// and HAProxy holds the map it loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_puts_back_a_missing_map_file_of_a_config_that_is_live() -> Result<()> {
    let mut world = shop_live_with_drift_checks_every("0s").await?;
    let lb2 = &world.stack.hosts[1];
    let gone = map_files(lb2)?.first().context("a map file")?.clone();
    let text = std::fs::read(&gone)?;
    std::fs::remove_file(&gone)?;
    let reloads = lb2.reload_count()?;
    // The report of the apply that put the file back, not the one from before: the file is
    // back on the host a moment before its report is.
    let earlier = world.stack.last_report("lb-2").await?.context("no report")?.finished_unix_ms;
    world.stack.restart_with(Component::Applier, &[("HAFLEET_DRIFT_CHECK", "0s")])?;
    let stack = &world.stack;
    let (gone, text) = (&gone, &text);
    let report = eventually(CONVERGE, "lb-2's map file put back", || async move {
        let r = stack.last_report("lb-2").await?.context("no report")?;
        anyhow::ensure!(r.finished_unix_ms > earlier, "not yet reported: {r:?}");
        anyhow::ensure!(r.outcome == ApplyOutcome::Applied, "{r:?}");
        anyhow::ensure!(std::fs::read(gone).ok().as_ref() == Some(text), "still gone");
        Ok(r)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))?;
    assert_eq!(report.reloads, 0, "{report:?}");
    assert_eq!(stack.hosts[1].reload_count()?, reloads, "no reload on lb-2");
    eventually(CONVERGE, "lb-1, which had every file, unchanged", || async move {
        let r = stack.last_report("lb-1").await?.context("no report")?;
        anyhow::ensure!(r.outcome == ApplyOutcome::Unchanged, "{r:?}");
        Ok(())
    })
    .await?;
    Ok(())
}

/// A change goes to each host as edits of the files it has: an Ingress on a routed Service
/// (no reload) and one on a Service no Ingress used (a reload) each send a fraction of the
/// config and maps; a host that lost the map an edit is made from gets the files whole in
/// the same apply, and serves the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_go_as_edits_and_whole_to_a_host_that_lacks_what_an_edit_is_made_from() -> Result<()>
{
    let world = shop_live_with_drift_checks_every("0s").await?;
    for i in 0..30 {
        world.route(&format!("s{i}"), &format!("s{i}.example.com"), "/", "web").await?;
    }
    expect_everywhere(&world.stack, "s29.example.com", "/", 200, "web@").await?;
    let stack = &world.stack;
    // What sending a host its files whole takes: its config and map files.
    let whole = |h: &hafleet_tests::HaproxyHost| -> Result<u64> {
        let config = std::fs::read_to_string(h.config_path())?;
        let mut size = config.len() as u64;
        for m in map_files(h)? {
            if config.contains(&*m.file_name().unwrap().to_string_lossy()) {
                size += std::fs::metadata(&m)?.len();
            }
        }
        Ok(size)
    };
    // Waits for every host's report of the version that serves `host`.
    let world = &world;
    let whole = &whole;
    let reports = |host: &'static str, body: &'static str| async move {
        expect_everywhere(stack, host, "/", 200, body).await?;
        let version = stack.latest_version().await?.context("a version")?.version;
        let mut reports = Vec::new();
        for h in &stack.hosts {
            let r = world.report(h.name(), version).await?;
            anyhow::ensure!(r.outcome == ApplyOutcome::Applied, "{r:?}");
            reports.push((r, whole(h)?));
        }
        Ok::<_, anyhow::Error>(reports)
    };
    world.route("edit-a", "edit-a.example.com", "/", "web").await?;
    for (r, whole) in reports("edit-a.example.com", "web@").await? {
        assert_eq!(r.reloads, 0, "{r:?}");
        assert!(r.sent_bytes > 0 && r.sent_bytes * 4 < whole, "{} of {whole}: {r:?}", r.sent_bytes);
    }
    world.route("edit-b", "edit-b.example.com", "/", "api").await?;
    for (r, whole) in reports("edit-b.example.com", "api@").await? {
        assert_eq!(r.reloads, 1, "a new backend: {r:?}");
        assert!(r.sent_bytes > 0 && r.sent_bytes * 4 < whole, "{} of {whole}: {r:?}", r.sent_bytes);
    }
    // lb-2 loses the prefix map its live config names: the next edit of it cannot be made.
    let lb2 = &stack.hosts[1];
    let config = std::fs::read_to_string(lb2.config_path())?;
    let lost = map_files(lb2)?
        .into_iter()
        .find(|m| {
            let name = m.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("prefix-") && config.contains(&name)
        })
        .context("the live prefix map")?;
    std::fs::remove_file(&lost)?;
    world.route("edit-c", "edit-c.example.com", "/", "web").await?;
    let sent: Vec<(u64, u64)> = reports("edit-c.example.com", "web@")
        .await?
        .into_iter()
        .map(|(r, whole)| (r.sent_bytes, whole))
        .collect();
    assert!(sent[0].0 * 4 < sent[0].1, "lb-1 took edits: {sent:?}");
    assert!(sent[1].0 > sent[1].1, "lb-2 took the edits, then the files whole: {sent:?}");
    // The applier counts what it sent each host, at least what these reports say.
    let text = metrics(stack, Component::Applier).await?;
    for (h, (bytes, _)) in stack.hosts.iter().zip(&sent) {
        let line =
            format!("hafleet_applier_sent_bytes_total{{fleet=\"edge\",host=\"{}\"}} ", h.name());
        let total: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .with_context(|| format!("no {line}in\n{text}"))?
            .parse()?;
        assert!(total >= *bytes as f64, "{line}{total}, last report {bytes}");
    }
    Ok(())
}
