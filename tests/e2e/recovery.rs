//! Any component killed (SIGKILL) and restarted, the pipeline converges to what the cluster's
//! Ingresses say (invariant 3).

use crate::{CONVERGE, World, expect_everywhere, expect_on, metrics};
use anyhow::{Context as _, Result};
use hafleet_proto::{ApplyOutcome, ApplyStage};
use hafleet_tests::proc::tcp_accepts;
use hafleet_tests::stack::Component;
use hafleet_tests::{eventually, http_get, wait_for};
use kube::api::DeleteParams;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_components_catch_up_on_restart_and_deletions_while_down_are_swept() -> Result<()> {
    let mut world = World::start().await?;
    world.route("a", "a.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "a.example.com", "/", 200, "web@").await?;

    // Renderer down while an Ingress is created: its durable consumer picks the event up.
    world.stack.kill(Component::Renderer);
    world.route("b", "b.example.com", "/", "api").await?;
    world.stack.start_component(Component::Renderer)?;
    expect_everywhere(&world.stack, "b.example.com", "/", 200, "api@").await?;

    // Watcher down while an Ingress is deleted: its start-up snapshot sweeps it.
    world.stack.kill(Component::Watcher);
    world.ingresses.delete("a", &DeleteParams::default()).await?;
    world.stack.start_component(Component::Watcher)?;
    expect_everywhere(&world.stack, "a.example.com", "/", 404, "").await?;
    expect_everywhere(&world.stack, "b.example.com", "/", 200, "api@").await?;

    // Applier down while a version is published: it applies it when it is back.
    world.stack.kill(Component::Applier);
    world.route("c", "c.example.com", "/", "web").await?;
    world.stack.start_component(Component::Applier)?;
    expect_everywhere(&world.stack, "c.example.com", "/", 200, "web@").await?;

    // NATS itself restarted (same store): every component reconnects and carries on.
    world.stack.nats.restart().await?;
    world.route("d", "d.example.com", "/", "api").await?;
    expect_everywhere(&world.stack, "d.example.com", "/", 200, "api@").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_left_between_swap_and_reload_is_reloaded_not_reported_unchanged() -> Result<()> {
    let mut world = World::start().await?;
    world.route("a", "a.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "a.example.com", "/", 200, "web@").await?;

    world.stack.kill(Component::Applier);
    world.route("b", "b.example.com", "/", "api").await?;
    let stack = &world.stack;
    let v2 = eventually(CONVERGE, "version 2 published", || async move {
        match stack.latest_version().await? {
            Some(v) if v.version >= 2 => Ok(v),
            other => anyhow::bail!("newest: {:?}", other.map(|v| v.version)),
        }
    })
    .await?;

    // What an applier killed right after its atomic rename leaves on a host: the new file is
    // live, HAProxy still runs the old config.
    let lb1 = &world.stack.hosts[0];
    // (Its maps were uploaded before the rename.)
    let bundle = v2.bundle().expect("fetched");
    for m in &bundle.maps {
        let path = lb1.config_path().with_file_name(m.name.relative_path());
        std::fs::create_dir_all(path.parent().expect("in a folder"))?;
        std::fs::write(path, &m.content)?;
    }
    std::fs::write(lb1.config_path(), &bundle.config)?;
    let (status, _) = http_get(lb1.http_addr(), "b.example.com", "/").await?;
    assert_eq!(status, 404, "HAProxy has not loaded the new file yet");

    world.stack.start_component(Component::Applier)?;
    expect_everywhere(&world.stack, "b.example.com", "/", 200, "api@").await?;
    assert_eq!(world.report("lb-1", 2).await?.outcome, ApplyOutcome::Applied);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_nodeport_stops_answering_costs_no_failed_request() -> Result<()> {
    let mut world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@node-1").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@node-2").await?;

    // node-1's kube-proxy stops answering; the node stays Ready in the API, so no new config
    // comes: HAProxy's retries and health checks alone must keep every request whole.
    let dead = world.backends.remove(0);
    assert_eq!(dead.name(), "web@node-1");
    let addr = dead.addr();
    drop(dead);
    assert!(wait_for(Duration::from_secs(5), || async move { !tcp_accepts(addr).await }).await);
    for h in &world.stack.hosts {
        for i in 0..20 {
            let (status, body) = http_get(h.http_addr(), "shop.example.com", "/").await?;
            assert_eq!(status, 200, "{} request {i}: {body}", h.name());
            assert!(body.starts_with("web@node-2"), "{} request {i}: {body}", h.name());
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renderer_whose_routes_stream_was_lost_refuses_to_guess() -> Result<()> {
    let mut world = World::start().await?;
    world.route("a", "a.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "a.example.com", "/", 200, "web@").await?;

    // NATS loses its data while the renderer is down: the routes stream comes back empty, with
    // sequences that no longer mean what the renderer's store applied.
    world.stack.kill(Component::Renderer);
    world.stack.nats.kill();
    let store = world.stack.nats.store_dir();
    std::fs::remove_dir_all(&store)?;
    std::fs::create_dir_all(&store)?;
    world.stack.nats.start_again().await?;
    world.stack.start_component(Component::Renderer)?;

    let log = world.stack.log_path(Component::Renderer);
    let stack = &mut world.stack;
    let deadline = std::time::Instant::now() + CONVERGE;
    while stack.is_running(Component::Renderer) {
        anyhow::ensure!(std::time::Instant::now() < deadline, "the renderer kept running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = std::fs::read_to_string(log)?;
    assert!(text.contains("the routes stream was created anew"), "{text}");
    // HAProxy keeps serving the last good config meanwhile.
    expect_everywhere(&world.stack, "a.example.com", "/", 200, "web@").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_route_messages_are_parked_and_the_renderer_goes_on() -> Result<()> {
    let world = World::start().await?;
    world.route("a", "a.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "a.example.com", "/", 200, "web@").await?;

    // A newer watcher published something this renderer cannot read, then something that is
    // not a message at all.
    let js = async_nats::jetstream::new(world.stack.nats.client().await?);
    let future = serde_json::json!({"type": "event", "schema": 99, "fleet": "edge",
                                    "change": {"op": "rename"}});
    js.publish("hafleet.routes.edge", serde_json::to_vec(&future)?.into()).await?.await?;
    js.publish("hafleet.routes.edge", "junk".into()).await?.await?;

    // Later changes still go live: nothing is stuck behind them.
    world.route("b", "b.example.com", "/", "api").await?;
    expect_everywhere(&world.stack, "b.example.com", "/", 200, "api@").await?;
    let mut stack = world.stack;
    assert!(stack.is_running(Component::Renderer));

    // Both are parked, with the reason and where they came from.
    let parked = js.get_stream(hafleet_proto::DEADLETTER_STREAM).await?;
    let mut reasons = Vec::new();
    for seq in 1..=2 {
        let m = parked.get_raw_message(seq).await?;
        assert_eq!(m.subject.as_str(), hafleet_proto::ROUTES_DEADLETTER_SUBJECT);
        let reason = m.headers.get(hafleet_proto::ERROR_HEADER).map(|v| v.to_string());
        let source = m.headers.get(hafleet_proto::SOURCE_SEQ_HEADER).map(|v| v.to_string());
        assert!(source.is_some_and(|s| s.parse::<u64>().is_ok()), "{:?}", m.headers);
        reasons.push((reason.unwrap_or_default(), m.payload));
    }
    assert!(reasons[0].0.contains("schema 99"), "{:?}", reasons[0].0);
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&reasons[0].1)?, future);
    assert_eq!(&reasons[1].1[..], b"junk");
    stack.kill(Component::Renderer);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_sshd_goes_down_is_skipped_and_catches_up() -> Result<()> {
    let mut world = World::start().await?;
    world.route("a", "a.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "a.example.com", "/", 200, "web@").await?;

    // lb-2's sshd stops (its pooled connection dies with it): the host is unreachable, the rest
    // of the fleet is not held up, and lb-2 is retried until it is back.
    // Once lb-2 has finished with version 1 (a rollout cut mid-way is another case).
    world.report("lb-2", 1).await?;
    world.stack.hosts[1].stop_sshd();
    world.route("b", "b.example.com", "/", "api").await?;
    expect_on(&world.stack.hosts[..1], &world.stack, "b.example.com", "/", 200, "api@").await?;
    let report = world.report("lb-2", 2).await?;
    assert!(
        matches!(report.outcome, ApplyOutcome::Failed { stage: ApplyStage::Connect, .. }),
        "{report:?}"
    );
    world.stack.hosts[1].start_sshd().await?;
    expect_everywhere(&world.stack, "b.example.com", "/", 200, "api@").await?;
    Ok(())
}

/// Two watchers with leader election: one publishes, the other stands by with warm caches;
/// the leader SIGKILLed, the standby takes the lease within its duration and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_watcher_takes_over_when_the_leader_is_killed() -> Result<()> {
    let mut world = World::start().await?;
    let election = |me: &'static str| {
        [
            ("HAFLEET_LEADER_ELECTION", "true"),
            ("HAFLEET_LEASE_DURATION", "3s"),
            ("HAFLEET_IDENTITY", me),
        ]
    };
    world.stack.restart_with(Component::Watcher, &election("watcher-a"))?;
    let log_of = |path: &std::path::Path| std::fs::read_to_string(path).unwrap_or_default();
    let a_log = world.stack.log_path(Component::Watcher);
    let a_log = &a_log;
    eventually(CONVERGE, "watcher-a takes the lease", || async move {
        anyhow::ensure!(log_of(a_log).contains("took the lease"), "not yet");
        Ok(())
    })
    .await?;
    let b_log = world.stack.dir().join("watcher-b.log");
    let mut cmd = world.stack.command(Component::Watcher);
    cmd.envs(election("watcher-b")).env("HAFLEET_HEALTH_ADDR", "127.0.0.1:0");
    let _b = hafleet_tests::ChildGuard::spawn("watcher-b", &mut cmd, &b_log)?;
    let b_log = &b_log;
    eventually(CONVERGE, "watcher-b stands by", || async move {
        anyhow::ensure!(log_of(b_log).contains("standing by"), "not yet");
        Ok(())
    })
    .await?;
    world.route("before", "before.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "before.example.com", "/", 200, "web@").await?;
    assert!(!log_of(b_log).contains("route event published"), "the standby published");

    world.stack.kill(Component::Watcher);
    world.route("after", "after.example.com", "/", "api").await?;
    expect_everywhere(&world.stack, "after.example.com", "/", 200, "api@").await?;
    let b = log_of(b_log);
    assert!(b.contains("took the lease"), "{b}");
    expect_everywhere(&world.stack, "before.example.com", "/", 200, "web@").await?;
    Ok(())
}

/// Each component answers `/healthz`, `/readyz` once it does its job, and `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_component_answers_healthz_and_readyz() -> Result<()> {
    let mut world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    for c in [Component::Watcher, Component::Renderer, Component::Applier] {
        let addr = world.stack.health_addr(c);
        let (status, body) = http_get(addr, "health", "/healthz").await?;
        assert_eq!((status, body.as_str()), (200, "ok\n"), "{c:?}");
        // Ready once its start-up is done: the applier's start-up rollout may still be
        // reporting when the hosts already serve the version.
        world.stack.until_ready(c, CONVERGE).await?;
        let (status, body) = http_get(addr, "health", "/readyz").await?;
        assert_eq!((status, body.as_str()), (200, "ready\n"), "{c:?}");
        assert_eq!(http_get(addr, "health", "/other").await?.0, 404, "{c:?}");
    }
    // Each one's metrics count what it did: the route event, the version, the applies.
    let stack = &world.stack;
    let metrics = |c| metrics(stack, c);
    // Each counts right after its publish is acked, which may be a moment after the next
    // component acted on it: read until counted.
    let counted = |c, needles: &'static [&'static str]| async move {
        eventually(CONVERGE, &format!("{c:?}'s counts"), || async move {
            let text = metrics(c).await?;
            for n in needles {
                anyhow::ensure!(text.contains(n), "{n:?} not in\n{text}");
            }
            Ok(())
        })
        .await
    };
    counted(
        Component::Watcher,
        &["hafleet_watcher_route_events_total{op=\"upsert\"} ", "hafleet_watcher_leader 1\n"],
    )
    .await?;
    counted(Component::Renderer, &["hafleet_renderer_versions_published_total{fleet=\"edge\"} "])
        .await?;
    // Hosts serve the version before the applier has counted (and reported) the rollout.
    let version = world.stack.latest_version().await?.expect("a version").version;
    for host in ["lb-1", "lb-2"] {
        world.report(host, version).await?;
    }
    let applier = eventually(CONVERGE, "the applier's counts", || async move {
        let applier = metrics(Component::Applier).await?;
        for host in ["lb-1", "lb-2"] {
            let line =
                format!("hafleet_applier_outcomes_total{{fleet=\"edge\",host=\"{host}\",outcome=\"applied\"}} ");
            anyhow::ensure!(applier.contains(&line), "{applier}");
        }
        Ok(applier)
    })
    .await?;
    assert!(applier.contains("# TYPE hafleet_applier_reloads_total counter"), "{applier}");
    for host in ["lb-1", "lb-2"] {
        let live =
            format!("hafleet_applier_live_version{{fleet=\"edge\",host=\"{host}\"}} {version}\n");
        assert!(applier.contains(&live), "{live:?} not in\n{applier}");
        let took =
            format!("hafleet_applier_apply_seconds_count{{fleet=\"edge\",host=\"{host}\"}} ");
        assert!(applier.contains(&took), "{took:?} not in\n{applier}");
        let behind =
            format!("hafleet_applier_host_behind_versions{{fleet=\"edge\",host=\"{host}\"}} 0\n");
        assert!(applier.contains(&behind), "{behind:?} not in\n{applier}");
    }
    let newest = &format!("hafleet_fleet_newest_version{{fleet=\"edge\"}} {version}\n");
    eventually(CONVERGE, "the fleet's gauges", || async move {
        let text = metrics(Component::Renderer).await?;
        for n in [newest.as_str(), "hafleet_fleet_pinned{fleet=\"edge\"} 0\n"] {
            anyhow::ensure!(text.contains(n), "{n:?} not in\n{text}");
        }
        Ok(())
    })
    .await?;
    counted(Component::Renderer, &["hafleet_renderer_render_seconds_count{fleet=\"edge\"} "])
        .await?;
    for c in [Component::Watcher, Component::Renderer, Component::Applier] {
        parses_as_prometheus_text(&metrics(c).await?).with_context(|| format!("{c:?}"))?;
    }

    // Cut off from NATS, each component says it is not ready, and why; back, it is again.
    world.stack.nats.kill();
    let stack = &world.stack;
    for c in [Component::Watcher, Component::Renderer, Component::Applier] {
        eventually(CONVERGE, &format!("{c:?} not ready without NATS"), || async move {
            let (status, body) = http_get(stack.health_addr(c), "health", "/readyz").await?;
            anyhow::ensure!(status == 503 && body.contains("NATS"), "{status} {body}");
            Ok(())
        })
        .await?;
    }
    // A component started while NATS is down waits for it, says so, and is not ready.
    world.stack.restart_with(Component::Applier, &[])?;
    let stack = &world.stack;
    eventually(CONVERGE, "the restarted applier waiting for NATS", || async move {
        let (status, body) =
            http_get(stack.health_addr(Component::Applier), "health", "/readyz").await?;
        anyhow::ensure!(status == 503 && body.contains("waiting for NATS at tls://"), "{body}");
        let seed = stack.nats.seed_of(&format!("hafleet-applier-{}", stack.fleet))?;
        anyhow::ensure!(!body.contains(&seed), "credentials shown: {body}");
        Ok(())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(world.stack.is_running(Component::Applier), "it waits, it does not exit");
    let log = std::fs::read_to_string(world.stack.log_path(Component::Applier))?;
    assert!(log.contains("waiting for NATS at tls://127.0.0.1:"), "{log}");
    world.stack.nats.start_again().await?;
    let stack = &world.stack;
    for c in [Component::Watcher, Component::Renderer, Component::Applier] {
        stack.until_ready(c, CONVERGE).await?;
    }
    let addr = world.stack.health_addr(Component::Renderer);
    let (_, renderer) = http_get(addr, "health", "/metrics").await?;
    assert!(renderer.contains("hafleet_nats_errors_total{what=\"disconnected\"} "), "{renderer}");
    Ok(())
}

/// Checks Prometheus' text format line by line: `# HELP`/`# TYPE` comments, and samples
/// `name{label="value",…} number` with a valid metric name, quoted label values and a float.
fn parses_as_prometheus_text(text: &str) -> Result<()> {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !n.starts_with(|c: char| c.is_ascii_digit())
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut words = rest.splitn(3, ' ');
            let (kind, name) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            anyhow::ensure!(
                matches!(kind, "HELP" | "TYPE") && name_ok(name),
                "bad comment {line:?}"
            );
            continue;
        }
        let (series, value) = line.rsplit_once(' ').context(format!("no value: {line:?}"))?;
        anyhow::ensure!(
            value.parse::<f64>().is_ok() || matches!(value, "+Inf" | "-Inf" | "NaN"),
            "bad value {line:?}"
        );
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => {
                (name, Some(labels.strip_suffix('}').context(format!("unclosed {line:?}"))?))
            }
            None => (series, None),
        };
        anyhow::ensure!(name_ok(name), "bad name {line:?}");
        for pair in labels.into_iter().flat_map(|l| l.split("\",")) {
            let (key, value) = pair.split_once("=\"").context(format!("bad label {line:?}"))?;
            anyhow::ensure!(name_ok(key) && !value.contains('\n'), "bad label {line:?}");
        }
    }
    Ok(())
}

/// Every remote command is bounded: one that hangs on a real host fails at the applier's
/// `--remote-timeout-secs`, naming the timeout, instead of stalling the rollout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_command_that_hangs_fails_at_the_timeout() -> Result<()> {
    use hafleet_applier::host::conn::{HostConn, SshSettings};
    use hafleet_applier::host::scripts::{NOOP, Script};
    let world = World::start().await?;
    let h = &world.stack.hosts[0];
    let control = hafleet_tests::TestDir::new("hafleet-ssh-timeout")?;
    let settings = SshSettings::new(
        world.stack.keys.identity.clone(),
        world.stack.keys.known_hosts.clone(),
        Duration::from_secs(10),
        control.path().to_owned(),
    )?
    .with_command_timeout(Duration::from_secs(1));
    let host = hafleet_applier::core::inventory::Host {
        name: hafleet_proto::HostName::new(h.name())?,
        address: h.ssh_host().to_string(),
        port: h.ssh_port(),
        user: h.ssh_user().to_owned(),
        config_path: h.config_path().display().to_string(),
        master_socket: h.master_socket().display().to_string(),
        haproxy_bin: h.haproxy_bin().display().to_string(),
        probe_address: None,
        probes: vec![],
        canary: true,
    };
    let conn = HostConn::connect(&host, &settings).await?;
    assert!(conn.run(&NOOP, &[], None).await?.success, "the host answers");
    let started = std::time::Instant::now();
    let hang = Script::new("hang", "sleep 30");
    let err = conn.run(&hang, &[], None).await.expect_err("a hung command must fail");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    let said = format!("{err:?}");
    assert!(said.contains("remote command did not finish within 1 s"), "{said}");
    Ok(())
}

/// With `HAFLEET_LOG_FORMAT=json` every line each binary logs is one JSON object, with the
/// fleet, version, host and Ingress as fields of their own; and no line holds a NATS password
/// or key material.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_fleet_version_host_and_ingress_as_fields_and_no_secrets() -> Result<()> {
    let mut world = World::start().await?;
    let components = [Component::Watcher, Component::Renderer, Component::Applier];
    let mut offsets = Vec::new();
    for c in components {
        // Measured once the process is gone: one still starting (a loaded machine) would
        // write its first text lines after the mark otherwise.
        world.stack.kill(c);
        offsets.push(std::fs::metadata(world.stack.log_path(c))?.len() as usize);
        world.stack.start_component_with(c, &[("HAFLEET_LOG_FORMAT", "json")])?;
    }
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let version = world.stack.latest_version().await?.context("a version")?.version;
    world.report("lb-2", version).await?;

    let seeds: Vec<String> = ["hafleet-watcher", "hafleet-renderer", "hafleet-applier-edge"]
        .into_iter()
        .map(|u| world.stack.nats.seed_of(u))
        .collect::<Result<_>>()?;
    let signing_key = std::fs::read_to_string(&world.stack.signing.private)?;
    let key_body = signing_key.lines().nth(1).context("key body")?;
    let mut events = Vec::new();
    for (c, offset) in components.into_iter().zip(offsets) {
        let text = std::fs::read_to_string(world.stack.log_path(c))?;
        for line in text[offset..].lines().filter(|l| !l.trim().is_empty()) {
            let event: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("{c:?} logged a line that is not JSON: {line}"))?;
            anyhow::ensure!(event["level"].is_string() && event["message"].is_string(), "{line}");
            for seed in &seeds {
                anyhow::ensure!(!line.contains(seed), "{c:?} logged a NATS seed: {line}");
            }
            anyhow::ensure!(!line.contains(key_body), "{c:?} logged the signing key: {line}");
            events.push(event);
        }
    }
    let has = |message: &str, fields: &[(&str, serde_json::Value)]| {
        events.iter().any(|e| e["message"] == message && fields.iter().all(|(k, v)| e[*k] == *v))
    };
    assert!(has(
        "route event published",
        &[("fleet", "edge".into()), ("ingress", "default/shop".into())]
    ));
    assert!(has("new config version", &[("fleet", "edge".into()), ("version", version.into())]));
    assert!(has(
        "host done",
        &[("fleet", "edge".into()), ("host", "lb-2".into()), ("version", version.into())]
    ));
    Ok(())
}

/// SIGTERM during a rollout lets it finish: every host ends on the version, none half-applied,
/// and then the applier exits by itself. (Each host's `haproxy` is made slow, 2 s a call, so
/// the signal lands mid-rollout.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_rollout_finishes_it_on_every_host_then_exits() -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;

    let slow = world.stack.dir().join("slow-haproxy");
    let haproxy = world.stack.hosts[0].haproxy_bin().display().to_string();
    std::fs::write(&slow, format!("#!/bin/sh\nsleep 2\nexec {haproxy} \"$@\"\n"))?;
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755))?;
    let inventory = world.stack.dir().join("inventory-slow.toml");
    hafleet_tests::stack::write_inventory(&inventory, &world.stack.hosts)?;
    let mut text = std::fs::read_to_string(&inventory)?;
    for h in &world.stack.hosts {
        let bin = format!("haproxy_bin = \"{}\"", h.haproxy_bin().display());
        text = text.replace(&bin, &format!("haproxy_bin = {:?}", slow));
    }
    std::fs::write(&inventory, text)?;
    let inventory = inventory.to_str().context("utf-8 path")?.to_owned();
    world.stack.restart_with(
        Component::Applier,
        &[("HAFLEET_INVENTORY", &inventory), ("HAFLEET_PARALLELISM", "1")],
    )?;
    let stack = &world.stack;
    stack.until_ready(Component::Applier, CONVERGE).await?;

    world.route("blog", "blog.example.com", "/", "api").await?;
    let version = eventually(CONVERGE, "the next version", || async move {
        let v = stack.latest_version().await?.context("none")?;
        anyhow::ensure!(
            v.bundle().is_some_and(|b| b.config.contains("blog.example.com"))
                || v.bundle()
                    .is_some_and(|b| b.maps.iter().any(|m| m.content.contains("blog.example.com"))),
            "not yet"
        );
        Ok(v)
    })
    .await?;
    let log_path = world.stack.log_path(Component::Applier);
    let started = format!("rolling out fleet=edge version={}", version.version);
    eventually(CONVERGE, "the rollout started", || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let found = log.contains(&started);
        async move {
            anyhow::ensure!(found, "not yet");
            Ok(())
        }
    })
    .await?;
    let pid = world.stack.pid(Component::Applier).context("applier pid")?;
    let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status()?;
    assert!(status.success());
    let mid_rollout = std::time::Instant::now();

    let stack = &mut world.stack;
    let exited = wait_for(CONVERGE, || {
        let running = stack.is_running(Component::Applier);
        async move { !running }
    })
    .await;
    let log = std::fs::read_to_string(&log_path)?;
    assert!(exited, "the applier did not stop after SIGTERM\n{log}");
    assert!(
        mid_rollout.elapsed() > Duration::from_secs(2),
        "it stopped before the rollout could have finished (a slow haproxy -c is 2 s)\n{log}"
    );
    let config = &version.bundle().context("inline")?.config;
    for h in &world.stack.hosts {
        let r = world.report(h.name(), version.version).await?;
        assert_eq!(r.outcome, ApplyOutcome::Applied, "{r:?}");
        assert_eq!(&std::fs::read_to_string(h.config_path())?, config, "{} half-applied", h.name());
    }
    let tail = &log[log.find(&started).unwrap_or(0)..];
    let done = tail.find("rollout done").context("no rollout done")?;
    let stopping = tail.find("applier stopping").context("no applier stopping")?;
    assert!(done < stopping, "{tail}");
    Ok(())
}

/// A watcher whose API server does not answer yet waits for it with backoff, says so in its
/// log and its readiness, and does not exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_started_before_its_api_server_waits_for_it() -> Result<()> {
    let mut world = World::start().await?;
    let real = std::fs::read_to_string(world.stack.kube.watcher_kubeconfig_path())?;
    let line = real.lines().find(|l| l.trim_start().starts_with("server:")).context("server")?;
    let closed = hafleet_tests::free_port(std::net::Ipv4Addr::LOCALHOST.into());
    let away = real.replace(line, &format!("    server: https://127.0.0.1:{closed}"));
    let path = world.stack.dir().join("kubeconfig-away");
    std::fs::write(&path, away)?;
    world
        .stack
        .restart_with(Component::Watcher, &[("KUBECONFIG", path.to_str().context("utf-8")?)])?;
    let stack = &world.stack;
    eventually(CONVERGE, "the watcher waiting", || async move {
        let (status, body) =
            http_get(stack.health_addr(Component::Watcher), "health", "/readyz").await?;
        anyhow::ensure!(
            status == 503 && body.contains("waiting for the Kubernetes API server"),
            "{status} {body}"
        );
        Ok(())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(world.stack.is_running(Component::Watcher), "it waits, it does not exit");
    let log = std::fs::read_to_string(world.stack.log_path(Component::Watcher))?;
    assert!(log.matches("waiting for the Kubernetes API server").count() >= 2, "{log}");
    Ok(())
}

/// On a 3-node NATS cluster, with every stream replicated 3 times, SIGKILL of the node that
/// leads the routes stream in the middle of a burst of Ingress changes loses no event the
/// watcher had acknowledged: the routes stream holds at least every one it counted, every
/// Ingress goes live on every host, and the killed node catches up when it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_node_killed_during_a_burst_loses_no_acknowledged_event() -> Result<()> {
    let mut world = World::on_nats_cluster(3).await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let js = async_nats::jetstream::new(world.stack.nats.client().await?);
    for name in
        [hafleet_proto::ROUTES_STREAM, hafleet_proto::CONFIGS_STREAM, hafleet_proto::REPORTS_STREAM]
    {
        let info = js.get_stream(name).await?.info().await?.clone();
        assert_eq!(info.config.num_replicas, 3, "{name}");
    }
    let leader = js.get_stream(hafleet_proto::ROUTES_STREAM).await?.info().await?.clone();
    let leader = leader.cluster.and_then(|c| c.leader).context("no leader")?;
    let node: usize = leader.trim_start_matches('n').parse()?;

    const BURST: usize = 30;
    for i in 0..BURST {
        world.route(&format!("b{i}"), &format!("b{i}.example.com"), "/", "web").await?;
        if i == BURST / 3 {
            world.stack.nats.kill_node(node);
        }
    }
    for i in 0..BURST {
        expect_everywhere(&world.stack, &format!("b{i}.example.com"), "/", 200, "web@").await?;
    }

    // Every route event the watcher counted (it counts once JetStream acknowledged it) is in
    // the stream, read through the surviving nodes.
    let (_, metrics) =
        http_get(world.stack.health_addr(Component::Watcher), "health", "/metrics").await?;
    let acked: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("hafleet_watcher_route_events_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert!(acked >= (BURST + 1) as f64, "{metrics}");
    let js = async_nats::jetstream::new(world.stack.nats.client().await?);
    let routes = js.get_stream(hafleet_proto::ROUTES_STREAM).await?;
    let mut subjects = routes.info_with_subjects("hafleet.routes.edge").await?;
    let mut stored = 0;
    while let Some(item) = futures::StreamExt::next(&mut subjects).await {
        stored += item?.1;
    }
    assert!(stored as f64 >= acked, "stream holds {stored} route events, {acked} were acked");

    // The killed node comes back and is current again.
    world.stack.nats.start_node_again(node).await?;
    let js = &js;
    eventually(CONVERGE, "every replica current", || async move {
        let info = js.get_stream(hafleet_proto::ROUTES_STREAM).await?.info().await?.clone();
        let cluster = info.cluster.context("no cluster info")?;
        anyhow::ensure!(
            cluster.leader.is_some()
                && cluster.replicas.len() == 2
                && cluster.replicas.iter().all(|r| r.current && !r.offline),
            "{cluster:?}"
        );
        Ok(())
    })
    .await?;
    Ok(())
}

/// Only the newest watcher is listened to: a route message carrying an older epoch (a deposed
/// leader that resumed after a pause, publishing with the watcher's own NATS user) changes
/// nothing, and the renderer says so; the current watcher's next change goes live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_messages_of_an_older_watcher_epoch_are_fenced_off() -> Result<()> {
    use hafleet_proto::{HttpHost, IngressKey, RouteMessage};
    let world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let admin = async_nats::jetstream::new(world.stack.nats.client().await?);
    let routes = admin.get_stream(hafleet_proto::ROUTES_STREAM).await?;
    let raw = routes.get_last_raw_message_by_subject("hafleet.routes.edge").await?;
    let RouteMessage::Event(mut ghost) = RouteMessage::decode(&raw.payload)? else {
        anyhow::bail!("the last message on hafleet.routes.edge is not a route event");
    };
    let current = ghost.epoch;
    ghost.epoch = current - 1;
    ghost.ingress = IngressKey::new("default", "ghost")?;
    let hafleet_proto::RouteChange::Upsert { routes, .. } = &mut ghost.change else {
        anyhow::bail!("shop's last event is not an upsert");
    };
    for route in routes {
        route.host = Some(HttpHost::new("ghost.example.com")?);
    }
    let watcher = async_nats::jetstream::new(world.stack.nats.client_as("hafleet-watcher").await?);
    watcher
        .publish("hafleet.routes.edge", RouteMessage::Event(ghost).encode().into())
        .await?
        .await?;

    world.route("real", "real.example.com", "/", "api").await?;
    expect_everywhere(&world.stack, "real.example.com", "/", 200, "api@").await?;
    expect_everywhere(&world.stack, "ghost.example.com", "/", 404, "").await?;
    let log = std::fs::read_to_string(world.stack.log_path(Component::Renderer))?;
    assert!(
        log.contains("route message of an older watcher ignored")
            && log.contains(&format!("newest={current}")),
        "{log}"
    );
    Ok(())
}

/// A watcher's epoch is above every earlier run's whatever its clock says: after a run whose
/// clock was an hour ahead (its nodes message says so), a restarted watcher is not fenced off,
/// and its next Ingress goes live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_watcher_is_not_fenced_off_by_an_earlier_run_with_a_clock_ahead() -> Result<()>
{
    use hafleet_proto::RouteMessage;
    let mut world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let admin = async_nats::jetstream::new(world.stack.nats.client().await?);
    let routes = admin.get_stream(hafleet_proto::ROUTES_STREAM).await?;
    let raw = routes.get_last_raw_message_by_subject(hafleet_proto::ROUTES_NODES_SUBJECT).await?;
    let RouteMessage::Nodes(mut nodes) = RouteMessage::decode(&raw.payload)? else {
        anyhow::bail!("not a nodes message");
    };
    let ahead = nodes.epoch + 3_600 * 1_000_000_000;
    nodes.epoch = ahead;
    let subject = hafleet_proto::ROUTES_NODES_SUBJECT;
    admin.publish(subject, RouteMessage::Nodes(nodes).encode().into()).await?.await?;

    world.stack.restart_with(Component::Watcher, &[])?;
    world.route("later", "later.example.com", "/", "api").await?;
    expect_everywhere(&world.stack, "later.example.com", "/", 200, "api@").await?;
    let log = std::fs::read_to_string(world.stack.log_path(Component::Renderer))?;
    assert!(!log.contains("route message of an older watcher ignored"), "{log}");
    Ok(())
}
