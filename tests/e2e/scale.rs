//! Configs of any size: a bundle larger than a NATS message travels in chunks through the
//! bundles stream, is checked against its sha256 on arrival, and goes live on every host. A fleet whose
//! version cannot be published holds up no other. 1,000 Ingress changes in a few seconds end
//! with the right config everywhere, in a bounded number of versions and reloads. A node going
//! NotReady among 1,000 Ingresses is one message and one version, and is drained through the
//! runtime API without a reload.

use crate::{
    CONVERGE, World, expect_everywhere, expect_on, ingress, node_listed_everywhere, render_with,
};
use anyhow::Result;
use hafleet_proto::{Body, ConfigVersion, FleetName};
use hafleet_tests::{eventually, http_get, stack::Component};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_8_mb_config_goes_live_on_both_hosts_through_the_bundles_stream() -> Result<()> {
    let mut world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;

    // 100,000 comment lines of ~85 bytes after the last backend: an 8.5 MB config, eight
    // times NATS's default max_payload.
    let marker = "# hafleet-padding";
    let pad = |t: &str| {
        format!(
            "{t}\n{{% for i in range(2000) %}}{{% for j in range(50) %}}{marker} {{{{ i }}}}-{{{{ j }}}} {}\n{{% endfor %}}{{% endfor %}}",
            "x".repeat(60)
        )
    };
    let version = render_with(&mut world, "padded.cfg.j2", pad, marker).await?;

    // The message names the bundle; it does not carry it.
    let stack = &world.stack;
    let js = async_nats::jetstream::new(stack.nats.client().await?);
    let stream = js.get_stream(hafleet_proto::CONFIGS_STREAM).await?;
    let subject = hafleet_proto::configs_subject(&FleetName::new("edge")?);
    let raw = stream.get_last_raw_message_by_subject(&subject).await?;
    assert!(raw.payload.len() < 64 * 1024, "message of {} bytes", raw.payload.len());
    let published = ConfigVersion::decode(&raw.payload)?;
    assert_eq!(published.version, version);
    assert!(
        matches!(published.body, Body::Stream { chunks } if chunks >= 8),
        "{:?}",
        published.body
    );
    assert!(published.size > 8_000_000, "bundle of {} bytes", published.size);

    // Every host runs it, byte for byte, and still routes.
    let fetched = stack.latest_version().await?.expect("published");
    let config = &fetched.bundle().expect("fetched").config;
    for h in &stack.hosts {
        let report = world.report(h.name(), version).await?;
        assert_eq!(report.outcome, hafleet_proto::ApplyOutcome::Applied, "{}", h.name());
        let live = std::fs::read_to_string(h.config_path())?;
        assert_eq!(live.len(), config.len(), "{}", h.name());
        assert!(live == *config, "{} runs other bytes", h.name());
    }
    // history show answers for it too: the reply, more than NATS takes with the bundle in it,
    // names the bundle, and the CLI prints the config from there whole.
    let shown = crate::history::ok(&world, &["history", "show", &version.to_string()]).await?;
    assert!(shown.contains(config.as_str()), "history show printed {} bytes", shown.len());
    world.route("blog", "blog.example.com", "/", "api").await?;
    expect_everywhere(stack, "blog.example.com", "/", 200, "api@").await?;
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;
    Ok(())
}

/// A fleet whose version cannot be published (here: the bundles stream its large bundle needs
/// is full) is reported and retried, and every other fleet keeps getting its versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_whose_version_cannot_be_published_holds_up_no_other_fleet() -> Result<()> {
    let mut world = World::start().await?;
    let core = world.stack.start_extra_fleet("core", 1).await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let before = world.stack.latest_version().await?.expect("a version").version;

    // The bundles stream holds at most 1 MiB, and fleet edge's next config is 2.5 MB.
    let js = async_nats::jetstream::new(world.stack.nats.client().await?);
    let spec = hafleet_proto::BUNDLES;
    js.create_stream(async_nats::jetstream::stream::Config {
        name: spec.name.into(),
        subjects: vec![spec.subjects.into()],
        allow_direct: true,
        max_messages_per_subject: 1,
        max_bytes: 1 << 20,
        discard: async_nats::jetstream::stream::DiscardPolicy::New,
        ..Default::default()
    })
    .await?;
    let marker = "# hafleet-padding";
    let template = format!(
        "{}\n{{% if fleet == \"edge\" %}}{{% for i in range(30000) %}}{marker} {{{{ i }}}} {}\n{{% endfor %}}{{% endif %}}",
        hafleet_renderer::core::render::BUILTIN_TEMPLATE,
        "x".repeat(60)
    );
    let path = world.stack.dir().join("edge-padded.cfg.j2");
    std::fs::write(&path, template)?;
    world.stack.restart_with(
        Component::Renderer,
        &[
            ("HAFLEET_TEMPLATE", path.to_str().expect("utf-8 temp path")),
            ("HAFLEET_PUBLISH_RETRY", "1s"),
        ],
    )?;

    // Fleet core gets its routes while edge's version is stuck.
    world.route_on("core", "intranet", "intra.example.com", "/", "api").await?;
    expect_on(&core.hosts, &world.stack, "intra.example.com", "/", 200, "api@").await?;
    let stack = &world.stack;
    eventually(CONVERGE, "the stuck publish reported", || async move {
        let log = std::fs::read_to_string(stack.log_path(Component::Renderer))?;
        anyhow::ensure!(
            log.contains("version cannot be published; other fleets go on")
                && log.contains("fleet=edge"),
            "not yet"
        );
        Ok(())
    })
    .await?;
    assert_eq!(stack.latest_version().await?.expect("a version").version, before);

    // Room in the stream again: the retry publishes edge's version and it goes live.
    let mut bucket = js.get_stream(spec.name).await?;
    let mut config = bucket.info().await?.config.clone();
    config.max_bytes = -1;
    js.update_stream(config).await?;
    let v = eventually(CONVERGE, "edge's padded version published", || async move {
        match stack.latest_version().await? {
            Some(v) if v.bundle().is_some_and(|b| b.config.contains(marker)) => Ok(v.version),
            other => anyhow::bail!("latest: {:?}", other.map(|v| v.version)),
        }
    })
    .await?;
    assert!(v > before);
    for h in &stack.hosts {
        let report = world.report(h.name(), v).await?;
        assert_eq!(report.outcome, hafleet_proto::ApplyOutcome::Applied, "{}", h.name());
    }
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;
    Ok(())
}

/// How many reports each host of the stack has sent so far (one per apply attempt).
async fn reports_per_host(world: &World) -> Result<Vec<u64>> {
    use futures::StreamExt as _;
    let js = async_nats::jetstream::new(world.stack.nats.client().await?);
    let stream = js.get_stream(hafleet_proto::REPORTS_STREAM).await?;
    let mut counts = std::collections::BTreeMap::new();
    let mut subjects = stream.info_with_subjects("hafleet.reports.edge.*").await?;
    while let Some(item) = subjects.next().await {
        let (subject, n) = item?;
        counts.insert(subject, n as u64);
    }
    Ok(world
        .stack
        .hosts
        .iter()
        .map(|h| counts.get(&format!("hafleet.reports.edge.{}", h.name())).copied().unwrap_or(0))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_ingress_changes_converge_on_every_host_with_bounded_reloads() -> Result<()> {
    use futures::StreamExt as _;
    let world = World::start().await?;
    let stack = &world.stack;
    world.route("warm", "warm.example.com", "/", "web").await?;
    expect_everywhere(stack, "warm.example.com", "/", 200, "web@").await?;
    let v_before = stack.latest_version().await?.expect("a version").version;
    let reports_before = reports_per_host(&world).await?;

    // 1,000 changes as fast as the API server takes them: 500 created, then 250 of them
    // moved to another Service and the other 250 deleted.
    let started = std::time::Instant::now();
    let api = &world.ingresses;
    let name = |i: usize| format!("churn-{i}");
    let host = |i: usize| format!("churn-{i}.example.com");
    futures::stream::iter(0..500)
        .map(|i| async move {
            api.create(
                &PostParams::default(),
                &ingress(&name(i), Some("edge"), &host(i), "/", "web"),
            )
            .await
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    futures::stream::iter(0..500)
        .map(|i| async move {
            if i % 2 == 0 {
                let patch = serde_json::json!({"spec": {"rules": [{"host": host(i), "http": {"paths": [
                    {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "api", "port": {"number": 80}}}}
                ]}}]}});
                api.patch(&name(i), &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ())
            } else {
                api.delete(&name(i), &DeleteParams::default()).await.map(|_| ())
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let churn = started.elapsed();

    // Converged: every moved Ingress answers from api, every deleted one is gone, on both hosts.
    let last_moved = host(498);
    expect_everywhere(stack, &last_moved, "/", 200, "api@").await?;
    for h in &stack.hosts {
        let addr = h.http_addr();
        eventually(CONVERGE, &format!("all 500 on {}", h.name()), || async move {
            for i in 0..500 {
                let (status, body) = hafleet_tests::http_get(addr, &host(i), "/").await?;
                if i % 2 == 0 {
                    anyhow::ensure!(
                        status == 200 && body.starts_with("api@"),
                        "{}: {status} {body}",
                        host(i)
                    );
                } else {
                    anyhow::ensure!(status == 404, "{}: {status}", host(i));
                }
            }
            Ok(())
        })
        .await?;
    }
    let converged = started.elapsed();
    let versions = stack.latest_version().await?.expect("a version").version - v_before;
    let reports_after = reports_per_host(&world).await?;
    let reloads: Vec<u64> = reports_after.iter().zip(&reports_before).map(|(a, b)| a - b).collect();
    println!(
        "churn: 1,000 changes sent in {:.1} s, converged after {:.1} s, {versions} versions, \
         applies per host {reloads:?}",
        churn.as_secs_f64(),
        converged.as_secs_f64()
    );
    // Bounded: coalescing folds the changes into far fewer versions, and an applier that falls
    // behind skips to the newest, so no host reloads once per change.
    assert!(versions <= 100, "{versions} versions for 1,000 changes");
    for (h, n) in stack.hosts.iter().zip(&reloads) {
        assert!(*n <= versions, "{} applied {n} times for {versions} versions", h.name());
    }
    Ok(())
}

/// The routes stream's last sequence and the subjects of the messages after `after`.
async fn routes_after(world: &World, after: u64) -> Result<(u64, Vec<String>)> {
    let js = async_nats::jetstream::new(world.stack.nats.client().await?);
    let mut stream = js.get_stream(hafleet_proto::ROUTES_STREAM).await?;
    let last = stream.info().await?.state.last_sequence;
    let mut subjects = Vec::new();
    for seq in after + 1..=last {
        subjects.push(stream.get_raw_message(seq).await?.subject.to_string());
    }
    Ok((last, subjects))
}

/// Routes name NodePorts and nodes travel once: a node going NotReady among 1,000 Ingresses is
/// one message on the routes stream and one version, and the node leaves every backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_going_not_ready_among_a_thousand_ingresses_is_one_message_and_one_version()
-> Result<()> {
    use futures::StreamExt as _;
    let world = World::start().await?;
    let stack = &world.stack;
    let api = &world.ingresses;
    let host = |i: usize| format!("n-{i}.example.com");
    futures::stream::iter(0..1000)
        .map(|i| async move {
            let service = if i % 2 == 0 { "web" } else { "api" };
            let ing = ingress(&format!("n-{i}"), Some("edge"), &host(i), "/", service);
            api.create(&PostParams::default(), &ing).await
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    expect_everywhere(stack, &host(999), "/", 200, "api@").await?;
    expect_everywhere(stack, &host(998), "/", 200, "web@").await?;

    // Settled: nothing more comes on the routes stream.
    let (mut seq, _) = routes_after(&world, 0).await?;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let (settled, late) = routes_after(&world, seq).await?;
    assert!(late.is_empty(), "still publishing: {late:?}");
    seq = settled;

    for ready in [false, true] {
        let before = stack.latest_version().await?.expect("a version").version;
        let reloads_before: Vec<u32> =
            stack.hosts.iter().map(|h| h.reload_count()).collect::<Result<_>>()?;
        stack.kube.set_node_ready("node-2", ready).await?;
        node_listed_everywhere(stack, "node-2", ready).await?;
        for h in &stack.hosts {
            let report = world.report(h.name(), before + 1).await?;
            assert_eq!(report.outcome, hafleet_proto::ApplyOutcome::Applied, "{report:?}");
            if ready {
                // A node joining needs a reload: HAProxy cannot track a server's health
                // check that was added at runtime.
                assert_eq!(report.reloads, 1, "{report:?}");
            } else {
                assert_eq!(report.reloads, 0, "drained without a reload: {report:?}");
                assert!(report.runtime_commands >= 3, "{report:?}");
            }
        }
        let reloads: Vec<u32> =
            stack.hosts.iter().map(|h| h.reload_count()).collect::<Result<_>>()?;
        let expected: Vec<u32> = reloads_before.iter().map(|r| r + u32::from(ready)).collect();
        assert_eq!(reloads, expected, "node-2 ready = {ready}: reloads per host");
        if !ready {
            // Every request, not just one, goes to node-1: node-2's servers are out of the
            // running process, not only out of the file.
            for h in &stack.hosts {
                for i in [0, 1, 500, 999, 998, 3] {
                    let service = if i % 2 == 0 { "web" } else { "api" };
                    let (status, body) = http_get(h.http_addr(), &host(i), "/").await?;
                    assert_eq!(status, 200, "{} {}", h.name(), host(i));
                    assert!(body.starts_with(&format!("{service}@node-1")), "{body}");
                }
            }
        }
        let (last, subjects) = routes_after(&world, seq).await?;
        assert_eq!(
            subjects,
            [hafleet_proto::ROUTES_NODES_SUBJECT],
            "node-2 ready = {ready}: one nodes message, no route event"
        );
        seq = last;
        let after = stack.latest_version().await?.expect("a version").version;
        assert_eq!(after, before + 1, "node-2 ready = {ready}: one version");
    }
    Ok(())
}

/// From 20 to 200 nodes, the live config of 2,000 Ingresses, each on a NodePort Service of
/// its own, grows by less than 10% on every host: a backend lists a bounded subset of the
/// nodes, and each node's health is checked once. Read from the hosts' files, which passed
/// `haproxy -c` and loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_20_to_200_nodes_the_live_config_of_2000_ingresses_grows_by_less_than_10_percent()
-> Result<()> {
    use hafleet_tests::cluster::{create_ingresses, create_services, node_health, ready_nodes};
    let stack = hafleet_tests::stack::Stack::start("edge", 2).await?;
    let (_, mut health) = ready_nodes(&stack, 20).await?;
    let name = |i: usize| format!("g-{i}");
    create_services(&stack, (0..2000).map(name)).await?;
    let ingresses = (0..2000).map(|i| (name(i), format!("{}.example.com", name(i)), name(i)));
    create_ingresses(&stack, "edge", ingresses).await?;
    let stack = &stack;
    // Every host's live config once it has the 2,000 backends and `nodes` node checks, and
    // reported the newest version.
    let live = |nodes: usize| async move {
        eventually(
            CONVERGE,
            &format!("2,000 backends, {nodes} nodes on every host"),
            || async move {
                let version = stack.latest_version().await?.map(|v| v.version).unwrap_or(0);
                let mut sizes = Vec::new();
                for h in &stack.hosts {
                    let config = std::fs::read_to_string(h.config_path())?;
                    let backends = config.matches("\nbackend be_default_g-").count();
                    let checks = config.matches(":10256\n").count();
                    anyhow::ensure!(
                        (backends, checks) == (2000, nodes),
                        "{}: {backends}, {checks}",
                        h.name()
                    );
                    let r = stack.last_report(h.name()).await?;
                    let r = r.filter(|r| {
                        r.version == version && r.outcome == hafleet_proto::ApplyOutcome::Applied
                    });
                    anyhow::ensure!(r.is_some(), "{} has not reported version {version}", h.name());
                    sizes.push(config.len());
                }
                Ok(sizes)
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))
    };
    let small = live(20).await?;
    for i in 21..=200 {
        let ip = hafleet_tests::random_loopback_ip();
        stack.kube.create_ready_node(&format!("node-{i}"), ip).await?;
        health.push(node_health(ip, &format!("node-{i}")).await?);
    }
    let large = live(200).await?;
    for (small, large) in small.iter().zip(&large) {
        let growth = *large as f64 / *small as f64 - 1.0;
        println!(
            "live config, 20 -> 200 nodes: {small} -> {large} bytes ({:+.1}%)",
            growth * 100.0
        );
        assert!(growth < 0.10, "{small} -> {large} bytes: {:.1}% more", growth * 100.0);
        assert!(growth > 0.0, "200 node checks take some room: {small} -> {large}");
    }
    Ok(())
}

/// One version goes live on 20 hosts: the canary alone first, then the others in waves of at
/// most `--parallelism` (2 by default) at once, as the hosts' reports show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_fans_out_to_twenty_hosts_canary_first_in_bounded_waves() -> Result<()> {
    let world = World::with_hosts(20).await?;
    // The first version meets hosts whose sshd may still be starting (an unreachable canary
    // passes the role on); the one measured is the next.
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    world.route("second", "second.example.com", "/", "api").await?;
    expect_everywhere(&world.stack, "second.example.com", "/", 200, "api@").await?;
    let version = world.stack.latest_version().await?.expect("a version").version;
    // Each host's [start, end] of applying the version, from its report.
    let mut spans = Vec::new();
    for h in &world.stack.hosts {
        let r = world.report(h.name(), version).await?;
        assert_eq!(r.outcome, hafleet_proto::ApplyOutcome::Applied, "{r:?}");
        spans.push((h.name().to_owned(), r.finished_unix_ms - r.duration_ms, r.finished_unix_ms));
    }
    let (canary, canary_start, canary_end) = spans[0].clone();
    assert_eq!(canary, "lb-1");
    // Reports carry whole milliseconds: a host that starts right as another ends may seem to
    // start up to 2 ms before it.
    const SLACK: u64 = 2;
    for (host, start, _) in &spans[1..] {
        assert!(
            start + SLACK >= canary_end,
            "{host} started at {start}, before the canary ended at {canary_end}"
        );
    }
    // At no moment were more than two hosts being applied at once (the canary included).
    for (_, start, _) in &spans {
        let busy = spans.iter().filter(|(_, s, e)| *s <= *start && start + SLACK < *e).count();
        assert!(busy <= 2, "{busy} hosts at once at {start}: {spans:?}");
    }
    assert!(canary_start <= spans.iter().map(|s| s.1).min().unwrap_or(0));
    Ok(())
}

/// The demo's scale path (Ingresses on Services of their own, more nodes than a backend's
/// subset, node health, the fleet's addresses in status), small: what
/// `./deploy/local/demo.sh --ingresses 10000 --nodes 200` runs, as a process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_with_many_ingresses_and_more_nodes_than_a_subset() -> Result<()> {
    let out = tokio::process::Command::new(hafleet_tests::bin_path("hafleet-demo"))
        .args(["--smoke", "--ingresses", "30", "--nodes", "12"])
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    for line in [
        "Host: app-29.local through HAProxy lb-1 -> 200 app-29@node-",
        "Host: app-29.local through HAProxy lb-2 -> 200 app-29@node-",
        "Host: app-1.local through HAProxy lb-1 -> 503",
        // --ingresses 30, and ws.local's.
        "31 Ingresses on 12 nodes",
        "smoke test passed",
    ] {
        assert!(stdout.contains(line), "{line:?} missing:\n{stdout}");
    }
    Ok(())
}

/// The demo on a 3-node NATS cluster (`--nats-cluster`), as a process: traffic through every
/// HAProxy host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_on_a_nats_cluster() -> Result<()> {
    let out = tokio::process::Command::new(hafleet_tests::bin_path("hafleet-demo"))
        .args(["--smoke", "--nats-cluster"])
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("smoke test passed"), "{stdout}");
    Ok(())
}

/// The README's demo, as a new user runs it: it writes its env file, and with what that file
/// names, HAProxy host 1 serves hello.local (over HTTPS, from the demo's CA), the applier
/// answers /metrics and `hafleet` answers; Ctrl-C stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_s_env_file_names_working_hosts_and_metrics() -> Result<()> {
    let dir = hafleet_tests::TestDir::new("hafleet-demo-env")?;
    let env_file = dir.path().join("env");
    let mut demo = std::process::Command::new(hafleet_tests::bin_path("hafleet-demo"));
    demo.arg("--env-file").arg(&env_file);
    let mut child =
        hafleet_tests::ChildGuard::spawn("hafleet-demo", &mut demo, &dir.path().join("demo.log"))?;
    let env = eventually(std::time::Duration::from_secs(300), "the demo's env file", || {
        let text = std::fs::read_to_string(&env_file).unwrap_or_default();
        async move {
            anyhow::ensure!(text.contains("HAFLEET_APPLIER_METRICS="), "not yet");
            Ok(text)
        }
    })
    .await?;
    let var = |name: &str| -> Result<String> {
        let prefix = format!("export {name}=");
        let line = env.lines().find_map(|l| l.strip_prefix(&prefix));
        Ok(line.ok_or_else(|| anyhow::anyhow!("{name} missing:\n{env}"))?.to_owned())
    };
    // hello.local has a certificate: plain HTTP redirects, HTTPS from the demo's CA serves.
    let host: std::net::SocketAddr = var("HAFLEET_HOST_1")?.parse()?;
    let (status, _) = http_get(host, "hello.local", "/").await?;
    assert_eq!(status, 308, "plain HTTP for a TLS host redirects");
    let tls: std::net::SocketAddr = var("HAFLEET_HOST_1_TLS")?.parse()?;
    let ca = std::path::PathBuf::from(var("HAFLEET_DEMO_CA")?);
    let answer = hafleet_tests::tls::https_get_as(tls, "hello.local", "hello.local", &ca).await?;
    assert!(answer.starts_with("HTTP/1.1 200") && answer.contains("hello@node-"), "{answer}");
    for (name, own) in [
        ("HAFLEET_WATCHER_METRICS", "hafleet_watcher_route_events_total"),
        ("HAFLEET_RENDERER_METRICS", "hafleet_renderer_versions_published_total"),
        ("HAFLEET_APPLIER_METRICS", "hafleet_applier_live_version"),
    ] {
        let addr: std::net::SocketAddr = var(name)?.parse()?;
        let (status, body) = http_get(addr, "metrics", "/metrics").await?;
        assert!(status == 200 && body.contains("\nhafleet_build_info{"), "{name}: {status} {body}");
        // hello.local is live, so each component has done its part; the applier counts a
        // rollout when every host is done with it, a moment after the last one serves.
        eventually(
            std::time::Duration::from_secs(30),
            &format!("{name} has {own}"),
            || async move {
                let (_, body) = http_get(addr, "metrics", "/metrics").await?;
                anyhow::ensure!(body.contains(&format!("\n{own}")), "{body}");
                Ok(())
            },
        )
        .await?;
    }
    // The operator CLI with nothing but the env file, as the README shows it.
    for args in ["status", "fleets", "history list"] {
        let script = format!(
            "source {} && {} {args}",
            env_file.display(),
            hafleet_tests::bin_path("hafleet").display()
        );
        let out = std::process::Command::new("bash").args(["-c", &script]).output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && !text.trim().is_empty(),
            "hafleet {args} with the demo's env: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let pid = child.pid().to_string();
    assert!(std::process::Command::new("kill").args(["-INT", &pid]).status()?.success());
    let stopped = hafleet_tests::wait_for(std::time::Duration::from_secs(60), || {
        let running = child.is_running();
        async move { !running }
    })
    .await;
    assert!(stopped, "the demo did not stop on Ctrl-C\n{}", child.log_tail(20));
    assert!(!env_file.exists(), "the env file is removed on exit");
    Ok(())
}
