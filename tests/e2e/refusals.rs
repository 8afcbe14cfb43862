//! Bad input changes nothing that works (invariants 1, 2 and 5): an Ingress that tries to
//! inject directives, a config HAProxy refuses at `haproxy -c` or only at reload, and a host
//! whose SSH key is not the pinned one.

use crate::{CONVERGE, World, expect_everywhere, expect_on, render_with};
use anyhow::{Context as _, Result};
use hafleet_proto::{ApplyOutcome, ApplyStage};
use hafleet_tests::eventually;
use hafleet_tests::fixtures::IngressBuilder;
use hafleet_tests::stack::Component;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, ListParams, Patch, PatchParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingress_that_tries_to_inject_directives_is_refused_alone_with_a_warning_event()
-> Result<()> {
    let mut world = World::start().await?;
    let stack = &world.stack;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;

    // The API server accepts this path; hafleet must not let it into haproxy.cfg.
    let evil_path = "/x }\n    use_backend be_default_web_80 if TRUE #";
    world.route("evil", "evil.example.com", evil_path, "api").await?;
    // A valid Ingress created after the bad one still goes live: nothing is frozen.
    world.route("later", "later.example.com", "/", "api").await?;
    expect_everywhere(stack, "later.example.com", "/", 200, "api@").await?;

    // A valid Ingress edited into an invalid one keeps the routes it had.
    let patch = serde_json::json!({"spec": {"rules": [{"host": "shop.example.com", "http": {"paths": [
        {"path": "/a b", "pathType": "Prefix",
         "backend": {"service": {"name": "api", "port": {"number": 80}}}}]}}]}});
    let ingresses: &Api<Ingress> = &world.ingresses;
    ingresses.patch("shop", &PatchParams::default(), &Patch::Merge(&patch)).await?;

    for name in ["evil", "shop"] {
        warning_event(stack, name, "InvalidIngress").await?;
    }
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;
    expect_everywhere(stack, "evil.example.com", "/", 404, "").await?;

    // A watcher restart does not sweep it either: its snapshot names refused Ingresses. (The
    // route created after the restart is applied after the snapshot, so once it is served the
    // snapshot has been applied too.)
    let snapshots = |stack: &hafleet_tests::stack::Stack| {
        std::fs::read_to_string(stack.log_path(Component::Watcher))
            .unwrap_or_default()
            .matches("snapshot published")
            .count()
    };
    let before = snapshots(&world.stack);
    world.stack.kill(Component::Watcher);
    world.stack.start_component(Component::Watcher)?;
    let stack = &world.stack;
    eventually(CONVERGE, "the restarted watcher's snapshot", || async move {
        anyhow::ensure!(snapshots(stack) > before, "not yet");
        Ok(())
    })
    .await?;
    world.route("after-restart", "after.example.com", "/", "api").await?;
    let stack = &world.stack;
    expect_everywhere(stack, "after.example.com", "/", 200, "api@").await?;
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;
    // Kept across the restart, it is still deleted when its Ingress is: the new watcher never
    // published it, so only a fresh snapshot can sweep it.
    world.ingresses.delete("shop", &Default::default()).await?;
    expect_everywhere(stack, "shop.example.com", "/", 404, "").await?;
    for h in &stack.hosts {
        let live = h.live_config();
        assert!(!live.contains("evil.example.com") && !live.contains("/x }"), "{live}");
        assert!(!live.contains("/a b"), "{live}");
    }
    Ok(())
}

/// The Warning Event with `reason` on Ingress `name` in `default`, once it is posted.
async fn warning_event(
    stack: &hafleet_tests::stack::Stack,
    name: &str,
    reason: &str,
) -> Result<Event> {
    warning_event_in(stack, "default", name, reason).await
}

/// [`warning_event`] in namespace `ns`.
pub(crate) async fn warning_event_in(
    stack: &hafleet_tests::stack::Stack,
    ns: &str,
    name: &str,
    reason: &str,
) -> Result<Event> {
    let events: Api<Event> = Api::namespaced(stack.kube.client().await?, ns);
    let events = &events;
    eventually(CONVERGE, &format!("{reason} event on ingress {name}"), || async move {
        events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
            .ok_or_else(|| anyhow::anyhow!("no {reason} event for {name} yet"))
    })
    .await
}

/// A host belongs to the namespace of the oldest Ingress that routes it: another namespace's
/// Ingress cannot take a path of it until the owner shares the host, and the loser of a
/// same-namespace conflict is told who won.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_belong_to_the_oldest_ingress_s_namespace_and_losers_are_told() -> Result<()> {
    let world = World::start().await?;
    let stack = &world.stack;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(stack, "shop.example.com", "/admin", 200, "web@").await?;

    // team-b claims shop.example.com/admin, for a Service it does not even have: were the
    // route taken, /admin would answer 503.
    let client = stack.kube.client().await?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let team_b = serde_json::from_value(serde_json::json!({"metadata": {"name": "team-b"}}))?;
    namespaces.create(&kube::api::PostParams::default(), &team_b).await?;
    let foreign: Api<Ingress> = Api::namespaced(client, "team-b");
    let thief = crate::ingress("thief", Some("edge"), "shop.example.com", "/admin", "missing");
    foreign.create(&kube::api::PostParams::default(), &thief).await?;
    let event = warning_event_in(stack, "team-b", "thief", "HostTaken").await?;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("host shop.example.com on fleet edge belongs to namespace default"),
        "{note}"
    );
    expect_everywhere(stack, "shop.example.com", "/admin", 200, "web@").await?;

    // The owner shares the host with team-b: its route goes live (503: no such Service).
    let share =
        serde_json::json!({"metadata": {"annotations": {"hafleet.io/share-hosts-with": "team-b"}}});
    world.ingresses.patch("shop", &PatchParams::default(), &Patch::Merge(&share)).await?;
    expect_everywhere(stack, "shop.example.com", "/admin", 503, "").await?;
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;

    // A younger Ingress of the owner's namespace on the same host and path loses, and is told.
    // creationTimestamp counts whole seconds and a tie goes by name ("copy" sorts before
    // "shop"): created within the second `shop` was, `copy` would be the older one. Since
    // applies got faster, this test can get here within that second.
    let created = |i: Ingress| i.metadata.creation_timestamp.map(|t| t.0.as_second());
    let shop_created =
        created(world.ingresses.get("shop").await?).context("shop's creationTimestamp")?;
    // At most 2 s (the API server runs on this machine's clock).
    for _ in 0..20 {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
        if now.as_secs() as i64 > shop_created {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    world.route("copy", "shop.example.com", "/", "api").await?;
    let event = warning_event(stack, "copy", "PathTaken").await?;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("shop.example.com/ (Prefix) is already routed by default/shop"),
        "{note}"
    );
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;
    Ok(())
}

/// An Ingress over the size budget is refused alone, with an Event; the rest go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingress_over_the_size_budget_is_refused_alone() -> Result<()> {
    let mut world = World::start().await?;
    world.stack.restart_with(Component::Watcher, &[("HAFLEET_MAX_PATHS_PER_INGRESS", "3")])?;
    let ingress = |name: &str, host: &str, n: usize| -> Result<Ingress> {
        let b = IngressBuilder::new(name).fleet("edge");
        Ok((0..n).fold(b, |b, i| b.route(host, &format!("/p{i}"), "web")).build())
    };
    let post = kube::api::PostParams::default();
    world.ingresses.create(&post, &ingress("big", "big.example.com", 4)?).await?;
    world.ingresses.create(&post, &ingress("fits", "fits.example.com", 3)?).await?;
    let stack = &world.stack;
    expect_everywhere(stack, "fits.example.com", "/p2", 200, "web@").await?;
    let event = warning_event(stack, "big", "RoutesTooLarge").await?;
    let note = event.note.unwrap_or_default();
    assert!(note.contains("4 paths, more than --max-paths-per-ingress (3)"), "{note}");
    expect_everywhere(stack, "big.example.com", "/p0", 404, "").await?;
    Ok(())
}

/// A Service that stops being reachable through its NodePort takes its routes off that port
/// (Kubernetes may give it to another Service) with an Event, and they come back with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_whose_service_loses_its_node_port_is_withdrawn_with_an_event() -> Result<()> {
    let world = World::start().await?;
    let stack = &world.stack;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(stack.kube.client().await?, "default");
    let node_port = services
        .get("web")
        .await?
        .spec
        .and_then(|s| s.ports)
        .and_then(|p| p.first().and_then(|p| p.node_port))
        .ok_or_else(|| anyhow::anyhow!("web has no nodePort"))?;
    let ports = |node_port: Option<i32>| {
        let mut port =
            serde_json::json!({"name": "http", "protocol": "TCP", "port": 80, "targetPort": 80});
        if let Some(n) = node_port {
            port["nodePort"] = n.into();
        }
        serde_json::json!([port])
    };

    let cluster_ip = serde_json::json!({"spec": {"type": "ClusterIP", "ports": ports(None)}});
    services.patch("web", &PatchParams::default(), &Patch::Merge(&cluster_ip)).await?;
    expect_everywhere(stack, "shop.example.com", "/", 503, "").await?;
    for h in &stack.hosts {
        let live = h.live_config();
        assert!(!live.contains(&format!(":{node_port}")), "{node_port} still routed\n{live}");
    }
    let event = warning_event(stack, "shop", "RouteWithdrawn").await?;
    let note = event.note.unwrap_or_default();
    assert!(note.contains("default/web is of type ClusterIP") && note.contains("503"), "{note}");

    let back = serde_json::json!({"spec": {"type": "NodePort", "ports": ports(Some(node_port))}});
    services.patch("web", &PatchParams::default(), &Patch::Merge(&back)).await?;
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;
    Ok(())
}

/// A version that loads but breaks what the probes check is rolled back on the canary to the
/// last config that passed them, and the rollout halts: the other host never gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_whose_probes_fail_is_rolled_back_and_halts_the_rollout() -> Result<()> {
    let mut world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let probes = "[[probes]]\npath = \"/\"\nhost = \"shop.example.com\"\nstatus = 200\n";
    world.stack.restart_applier_with_inventory(probes, &[("HAFLEET_PROBE_TIMEOUT", "2s")])?;
    // A good version goes live with its probes passing: it becomes last-known-good.
    world.route("second", "second.example.com", "/", "api").await?;
    expect_everywhere(&world.stack, "second.example.com", "/", 200, "api@").await?;
    let good = world.stack.latest_version().await?.expect("a version").version;
    for h in &world.stack.hosts {
        assert_eq!(world.report(h.name(), good).await?.outcome, ApplyOutcome::Applied);
    }
    let live = world.stack.hosts[0].live_config();

    // A template that routes nothing: it passes `haproxy -c` and reloads, but shop answers 404.
    let routing = "    use_backend %[var(txn.backend)] if { var(txn.backend) -m found }\n";
    let bad = render_with(
        &mut world,
        "no-routing.j2",
        |t| {
            assert!(t.contains(routing));
            t.replace(routing, "    # routing lost\n")
        },
        "# routing lost",
    )
    .await?;
    let report = world.report("lb-1", bad).await?;
    let ApplyOutcome::Failed { stage, message, restored } = &report.outcome else {
        panic!("version {bad} should fail its probes: {report:?}\n{}", world.stack.logs());
    };
    assert_eq!(*stage, ApplyStage::Probe, "{message}");
    assert!(
        message.contains("GET http://shop.example.com/ expecting 200")
            && message.contains("got 404"),
        "{message}"
    );
    assert!(restored, "rolled back to last-known-good");
    assert_eq!(world.stack.hosts[0].live_config(), live, "lb-1 runs last-known-good again");
    assert_eq!(world.stack.hosts[1].live_config(), live, "the rollout halted at the canary");
    // lb-2 was prepared (its upload checked) while the canary went live; the halt removed it.
    let lb2 = world.stack.hosts[1].config_path();
    let folder = lb2.parent().context("config folder")?;
    let staged: Vec<String> = std::fs::read_dir(folder)?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|name| name.contains(".hafleet-new-"))
        .collect();
    assert!(staged.is_empty(), "uploads left on lb-2 after the halt: {staged:?}");
    assert_eq!(world.stack.last_report("lb-2").await?.map(|r| r.version), Some(good));
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;

    // What an operator sees from their machine: `hafleet status`, as hafleet-operator.
    let status = |args: &[&str]| {
        std::process::Command::new(hafleet_tests::bin_path("hafleet"))
            .arg("status")
            .args(args)
            .envs(world.stack.nats.env_for("hafleet-operator"))
            .output()
    };
    let out = status(&["--fleet", "edge", "-o", "json"])?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let hosts: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
    let by_name = |n: &str| hosts.iter().find(|h| h["host"] == n).cloned().unwrap_or_default();
    let (lb1, lb2) = (by_name("lb-1"), by_name("lb-2"));
    assert_eq!(lb1["version"], good, "{hosts:?}");
    assert_eq!(lb1["last_version"], bad, "{hosts:?}");
    assert_eq!(lb1["last_outcome"], "failed at probe, rolled back", "{hosts:?}");
    assert_eq!(
        (lb2["version"].clone(), lb2["last_outcome"].clone()),
        (good.into(), "applied".into())
    );
    let good_sha = world.report("lb-2", good).await?.sha256;
    assert_eq!(lb1["sha256"], good_sha.as_str());
    assert_eq!(lb1["drift"], "none reported");
    let table = status(&["--fleet", "edge"])?;
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.starts_with("HOST") && table.contains("failed at probe"), "{table}");
    let unknown = status(&["--fleet", "nosuch"])?;
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("fleet nosuch has no reports"));
    // The rollback is counted for lb-1 alone.
    let addr = world.stack.health_addr(Component::Applier);
    let (_, metrics) = hafleet_tests::http_get(addr, "health", "/metrics").await?;
    assert!(
        metrics.contains("hafleet_applier_rollbacks_total{fleet=\"edge\",host=\"lb-1\"} 1\n"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("hafleet_applier_rollbacks_total{fleet=\"edge\",host=\"lb-2\"}"),
        "{metrics}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_haproxy_refuses_never_goes_live_and_the_rollout_halts_at_the_canary() -> Result<()>
{
    let mut world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let v1 = world.report("lb-1", 1).await?;
    assert_eq!(v1.outcome, ApplyOutcome::Applied);
    let good = world.stack.hosts[0].live_config();

    // 1. `haproxy -c` refuses the config: the live file is never touched. (The renderer
    //    re-renders every fleet when its template changes.)
    let bad = render_with(
        &mut world,
        "bad-directive.j2",
        |t| t.replace("    mode http\n", "    mode http\n    no-such-directive on\n"),
        "no-such-directive",
    )
    .await?;
    let report = world.report("lb-1", bad).await?;
    assert_eq!(report.version, bad);
    let ApplyOutcome::Failed { stage, message, restored } = &report.outcome else {
        panic!("version {bad} should fail validation: {report:?}\n{}", world.stack.logs());
    };
    assert_eq!(*stage, ApplyStage::Validate, "{message}");
    assert!(message.contains("no-such-directive"), "HAProxy's words reach the report: {message}");
    assert!(!restored, "nothing to restore: the live file was never replaced");
    assert_eq!(world.stack.hosts[0].live_config(), good);
    assert_eq!(world.stack.hosts[1].live_config(), good, "the rollout halted at the canary");
    assert_eq!(world.stack.last_report("lb-2").await?.map(|r| r.version), Some(1));

    // 2. The config passes `haproxy -c` but HAProxy cannot load it on reload: it asks for
    //    2,000,053 file descriptors, more than Linux lets a process have unless fs.nr_open is
    //    raised (1,048,576 by default). Both 2.6 and 3.0 refuse it within a second (`Cannot
    //    raise FD limit to 2000039` / `2000053`), and the canary rolls back to last-known-good.
    //    Not `maxconn 100000000`: 2.6 refuses that at once (it cannot allocate the fd table),
    //    but 3.0 maps and fills a 12.8 GB fd table first and refuses only 7 to 20 s later, its
    //    master CLI refusing connections meanwhile; past the applier's reload timeout (10 s)
    //    that is reported as `Verify` ("no new HAProxy worker within 10000 ms of the reload"),
    //    not `Reload`, and `restored: false` (the restore's reload cannot reach the master).
    let bad = render_with(
        &mut world,
        "bad-reload.j2",
        |t| t.replace("global\n", "global\n    maxconn 1000000\n"),
        "maxconn 1000000",
    )
    .await?;
    let report = world.report("lb-1", bad).await?;
    assert_eq!(report.version, bad);
    let ApplyOutcome::Failed { stage, restored, .. } = &report.outcome else {
        panic!("version {bad} should fail on reload: {report:?}\n{}", world.stack.logs());
    };
    assert_eq!(*stage, ApplyStage::Reload);
    assert!(restored, "last-known-good is back");
    assert_eq!(world.stack.hosts[0].live_config(), good);
    assert_eq!(world.stack.hosts[1].live_config(), good);
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;

    // 3. A good template again: the next version goes everywhere.
    render_with(
        &mut world,
        "good.j2",
        |t| format!("{t}# good template again\n"),
        "# good template again",
    )
    .await?;
    world.route("fourth", "fourth.example.com", "/", "api").await?;
    expect_everywhere(&world.stack, "fourth.example.com", "/", 200, "api@").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_whose_ssh_key_is_not_pinned_is_refused_and_does_not_freeze_its_fleet()
-> Result<()> {
    let world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;

    // Forget the canary's (lb-1's) host key: strict checking must refuse it, not learn it.
    let known_hosts = world.stack.keys.known_hosts.clone();
    let pinned = std::fs::read_to_string(&known_hosts)?;
    let lb1 = format!("[127.0.0.1]:{} ", world.stack.hosts[0].ssh_port());
    let without: String =
        pinned.lines().filter(|l| !l.starts_with(&lb1)).map(|l| format!("{l}\n")).collect();
    assert_ne!(without, pinned, "lb-1's key was pinned");
    std::fs::write(&known_hosts, &without)?;

    world.route("second", "second.example.com", "/", "api").await?;
    let report = world.report("lb-1", 2).await?;
    let ApplyOutcome::Failed { stage, message, .. } = &report.outcome else {
        panic!("lb-1 must be refused: {report:?}");
    };
    // Told apart from an unreachable host, with the fingerprint of the key it offers: the one
    // that was pinned (ssh-keygen's reading of the forgotten known_hosts line).
    assert_eq!(*stage, ApplyStage::HostKey, "{message}");
    let addr = world.stack.health_addr(Component::Applier);
    let (_, metrics) = hafleet_tests::http_get(addr, "health", "/metrics").await?;
    let counted =
        "hafleet_applier_ssh_errors_total{fleet=\"edge\",host=\"lb-1\",stage=\"host_key\"} ";
    assert!(metrics.contains(counted), "{metrics}");
    let forgotten = world.stack.dir().join("forgotten_known_hosts");
    std::fs::write(
        &forgotten,
        pinned.lines().filter(|l| l.starts_with(&lb1)).collect::<Vec<_>>().join("\n"),
    )?;
    let keygen = std::process::Command::new("ssh-keygen").arg("-lf").arg(&forgotten).output()?;
    let pinned_fp = String::from_utf8_lossy(&keygen.stdout)
        .split_whitespace()
        .nth(1)
        .unwrap_or("no fingerprint")
        .to_owned();
    assert!(pinned_fp.starts_with("SHA256:"), "{pinned_fp}");
    assert!(message.contains(&format!("it offers {pinned_fp}")), "{message}");
    // An unreachable canary passes the role on: the rest of the fleet is not frozen.
    assert_eq!(world.report("lb-2", 2).await?.outcome, ApplyOutcome::Applied);
    expect_on(&world.stack.hosts[1..], &world.stack, "second.example.com", "/", 200, "api@")
        .await?;
    assert_eq!(std::fs::read_to_string(&known_hosts)?, without, "nothing was added");

    // Pin the key again: the applier's retry brings lb-1 to the current version.
    std::fs::write(&known_hosts, &pinned)?;
    expect_everywhere(&world.stack, "second.example.com", "/", 200, "api@").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_role_reads_what_it_routes_and_nothing_more() -> Result<()> {
    use k8s_openapi::api::core::v1::{Secret, Service};
    // Every stack runs its watcher with deploy/kubernetes/watcher-rbac.yaml (the other tests
    // prove it is enough); this one proves it is not more.
    let world = World::start().await?;
    let kubeconfig =
        kube::config::Kubeconfig::read_from(world.stack.kube.watcher_kubeconfig_path())?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let client = kube::Client::try_from(config)?;
    let forbidden = |r: Result<(), kube::Error>| match r {
        Err(kube::Error::Api(e)) if e.code == 403 => Ok(()),
        other => Err(anyhow::anyhow!("expected 403 Forbidden, got {other:?}")),
    };
    Api::<Ingress>::all(client.clone()).list(&ListParams::default()).await?;
    Api::<Service>::all(client.clone()).list(&ListParams::default()).await?;
    forbidden(Api::<Secret>::all(client.clone()).list(&ListParams::default()).await.map(|_| ()))?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), "default");
    let ing = crate::ingress("sneaky", Some("edge"), "a.example.com", "/", "web");
    forbidden(ingresses.create(&Default::default(), &ing).await.map(|_| ()))?;
    let services: Api<Service> = Api::namespaced(client, "default");
    forbidden(services.delete("web", &Default::default()).await.map(|_| ()))?;

    // It runs under a real ServiceAccount token (a JWT the API server signed), and
    // `kubectl auth can-i` with that token says what it may do.
    let text = std::fs::read_to_string(world.stack.kube.watcher_kubeconfig_path())?;
    let token = text.lines().find_map(|l| l.trim().strip_prefix("token: ")).unwrap_or_default();
    assert_eq!(token.trim_matches('"').split('.').count(), 3, "not a ServiceAccount JWT");
    let can_i = |verb: &'static str, resource: &'static str| {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        let kubeconfig = world.stack.kube.watcher_kubeconfig_path().to_owned();
        async move {
            let out = tokio::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .args(["auth", "can-i", verb, resource, "--all-namespaces"])
                .args((!subresource.is_empty()).then(|| format!("--subresource={subresource}")))
                .output()
                .await?;
            anyhow::Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        }
    };
    for (verb, resource, answer) in [
        ("list", "ingresses.networking.k8s.io", "yes"),
        ("patch", "ingresses.networking.k8s.io/status", "yes"),
        ("get", "secrets", "no"),
        ("list", "secrets", "no"),
        ("watch", "secrets", "no"),
        ("create", "ingresses.networking.k8s.io", "no"),
        ("delete", "services", "no"),
        ("list", "configmaps", "no"), // only the tenancy policy's, by name, in its namespace
    ] {
        assert_eq!(can_i(verb, resource).await?, answer, "can-i {verb} {resource}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_component_may_publish_only_its_own_messages_on_nats() -> Result<()> {
    // Every stack runs each component as its own NATS user with
    // deploy/nats/hafleet-permissions.conf (the other tests prove that is enough); this one
    // proves a component cannot speak for another, e.g. a watcher cannot publish a config.
    let world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let nats = &world.stack.nats;
    let publish = |user: &'static str, subject: &'static str| async move {
        let mut js = async_nats::jetstream::new(nats.client_as(user).await?);
        js.set_timeout(std::time::Duration::from_secs(2));
        let ack = js.publish(subject, "not a real message".into()).await?.await;
        anyhow::Ok(ack.is_ok())
    };
    for (user, subject, allowed) in [
        ("hafleet-watcher", "hafleet.configs.edge", false),
        ("hafleet-applier-edge", "hafleet.configs.edge", false),
        ("hafleet-renderer", "hafleet.routes.edge", false),
        ("hafleet-applier-edge", "hafleet.routes.edge", false),
        ("hafleet-watcher", "hafleet.reports.edge.lb-1", false),
        // Nor the renderer's own messages on the routes stream: its render settings (a
        // template reaches every host), sweep releases, quarantines, republished messages.
        ("hafleet-watcher", hafleet_proto::ROUTES_RENDER_SUBJECT, false),
        ("hafleet-watcher", hafleet_proto::ROUTES_CONFIRM_SUBJECT, false),
        ("hafleet-watcher", hafleet_proto::ROUTES_QUARANTINE_SUBJECT, false),
        ("hafleet-watcher", hafleet_proto::ROUTES_REPUBLISH_SUBJECT, false),
        ("hafleet-operator", hafleet_proto::ROUTES_RENDER_SUBJECT, false),
        // Controls: the same publish succeeds for the component that owns the subject (on a
        // fleet nobody serves, so nothing real is disturbed).
        ("hafleet-renderer", "hafleet.configs.nobody", true),
        ("hafleet-watcher", "hafleet.routes.nobody", true),
        ("hafleet-applier-edge", "hafleet.reports.edge.nobody", true),
        // Nor may an applier speak for another fleet.
        ("hafleet-applier-edge", "hafleet.reports.core.lb-1", false),
    ] {
        assert_eq!(publish(user, subject).await?, allowed, "{user} publishing on {subject}");
    }
    let js = async_nats::jetstream::new(nats.client_as("hafleet-watcher").await?);
    assert!(js.delete_stream(hafleet_proto::CONFIGS_STREAM).await.is_err());
    // And the fleet still runs the renderer's config, not a forged one.
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    assert_eq!(
        world.stack.latest_version().await?.map(|v| v.fleet.to_string()),
        Some("edge".into())
    );
    Ok(())
}

/// A stream that exists with another configuration (here: narrower subjects, as a hand-made
/// stream might have) is refused with a clear error, never silently reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_configured_otherwise_is_refused_not_reused() -> Result<()> {
    let mut world = World::start().await?;
    world.stack.kill(Component::Applier);
    let js = async_nats::jetstream::new(world.stack.nats.client().await?);
    js.delete_stream(hafleet_proto::REPORTS_STREAM).await?;
    js.create_stream(async_nats::jetstream::stream::Config {
        name: hafleet_proto::REPORTS_STREAM.into(),
        subjects: vec!["hafleet.reports.edge.>".into()],
        ..Default::default()
    })
    .await?;
    let (exited, log) = applier_until_it_exits(&mut world).await?;
    assert!(exited, "the applier went on with a stream it does not own\n{log}");
    assert!(
        log.contains("stream HAFLEET_REPORTS already exists with another configuration")
            && log.contains("subjects"),
        "{log}"
    );

    // The right subjects, but republishing every report elsewhere: refused as well.
    js.delete_stream(hafleet_proto::REPORTS_STREAM).await?;
    js.create_stream(async_nats::jetstream::stream::Config {
        name: hafleet_proto::REPORTS_STREAM.into(),
        subjects: vec![hafleet_proto::REPORTS_SUBJECTS.into()],
        republish: Some(async_nats::jetstream::stream::Republish {
            source: hafleet_proto::REPORTS_SUBJECTS.into(),
            destination: "_INBOX_edge.leak.>".into(),
            headers_only: false,
        }),
        ..Default::default()
    })
    .await?;
    let (exited, log) = applier_until_it_exits(&mut world).await?;
    assert!(exited, "the applier went on with a republishing stream\n{log}");
    assert!(log.contains("republishes its messages"), "{log}");
    Ok(())
}

/// NATS access alone cannot push a config: a version nobody signed, one signed by a key the
/// applier does not trust, and a signed one whose config was changed are each refused before
/// any host is touched, reported at stage `signature`; and none of them, though newer, holds
/// back the renderer's next version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_not_signed_by_the_renderer_are_refused_before_any_host_is_touched() -> Result<()>
{
    use hafleet_proto::{Body, Bundle, ConfigVersion, Signer};
    let mut world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let stack = &world.stack;
    let live = stack.latest_version().await?.context("no version")?;
    assert!(live.signature.is_some(), "the renderer signs what it publishes");
    let files = || -> Result<Vec<String>> {
        stack.hosts.iter().map(|h| Ok(std::fs::read_to_string(h.config_path())?)).collect()
    };
    let before = files()?;

    let forge = |n: u64| -> ConfigVersion {
        let Some(Bundle { config, maps, certs, .. }) = live.bundle().cloned() else {
            panic!("a small version travels inline")
        };
        let bundle = Bundle::new(format!("{config}# forged\n"), maps, certs);
        ConfigVersion {
            version: live.version + n,
            parent: Some(live.version),
            sha256: bundle.sha256(),
            size: bundle.size() as u64,
            body: Body::Inline { bundle },
            signature: None,
            ..live.clone()
        }
    };
    let rogue = hafleet_tests::SigningKeys::generate_named(stack.dir(), "rogue")?;
    let rogue = Signer::from_pem(&std::fs::read_to_string(&rogue.private)?)?;
    let unsigned = forge(100);
    let by_rogue = rogue.sign(forge(101));
    let tampered = ConfigVersion { signature: live.signature.clone(), ..forge(102) };
    // Signed with the renderer's own key, but for another fleet.
    let renderer = Signer::from_pem(&std::fs::read_to_string(&stack.signing.private)?)?;
    let core = hafleet_proto::FleetName::new("core")?;
    let for_core = renderer.sign(ConfigVersion { fleet: core, ..forge(103) });
    // Published with the admin's NATS rights: more than any component has.
    let js = async_nats::jetstream::new(stack.nats.client().await?);
    let subject = hafleet_proto::configs_subject(&live.fleet);
    for (forged, why) in [
        (&unsigned, "is not signed"),
        (&by_rogue, "which this applier does not trust"),
        (&tampered, "does not verify"),
    ] {
        js.publish(subject.clone(), forged.encode().into()).await?.await?;
        for host in ["lb-1", "lb-2"] {
            let number = forged.version;
            eventually(CONVERGE, "the refusal's report", || async move {
                let r = stack.last_report(host).await?.context("no report")?;
                anyhow::ensure!(r.version == number, "{r:?}");
                let ApplyOutcome::Failed { stage, message, restored } = &r.outcome else {
                    anyhow::bail!("a forged version was not refused: {r:?}");
                };
                anyhow::ensure!(
                    *stage == ApplyStage::Signature && message.contains(why) && !restored,
                    "{r:?}"
                );
                Ok(())
            })
            .await?;
        }
    }
    // Another fleet's version on this fleet's subject is skipped (no report: the fleet's
    // reports are its own), whoever signed it.
    js.publish(subject.clone(), for_core.encode().into()).await?.await?;
    let log_path = stack.log_path(Component::Applier);
    eventually(CONVERGE, "the other fleet's version skipped", || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        async move {
            anyhow::ensure!(
                log.contains("config of another fleet on this fleet's subject"),
                "not yet"
            );
            Ok(())
        }
    })
    .await?;
    assert_eq!(files()?, before, "no host was touched");
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;

    // An applier that starts while core's version is the newest on edge's subject does not
    // converge on it either.
    world.stack.restart_with(Component::Applier, &[])?;
    let stack = &world.stack;
    stack.until_ready(Component::Applier, CONVERGE).await?;
    let files = || -> Result<Vec<String>> {
        stack.hosts.iter().map(|h| Ok(std::fs::read_to_string(h.config_path())?)).collect()
    };
    assert_eq!(files()?, before, "no host was touched at start-up");

    // The renderer's next version goes live, though forged ones with higher numbers came first.
    world.route("blog", "blog.example.com", "/", "api").await?;
    expect_everywhere(stack, "blog.example.com", "/", 200, "api@").await?;
    assert!(files()?.iter().all(|f| !f.contains("# forged")));
    Ok(())
}

/// Each fleet's applier has NATS credentials of its own (`hafleet nats-permissions`):
/// with fleet edge's, nothing of fleet core's can be read, neither through the JetStream API
/// (newest config, whole-stream reads, a consumer of its own or of core's, core's large
/// bundles and certificates) nor by subscribing to core's subject; the same reads of edge's own succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_fleets_applier_credentials_cannot_read_another_fleets_configs() -> Result<()> {
    use async_nats::jetstream::consumer::pull;
    use futures::StreamExt as _;
    let world = World::start().await?;
    let core = world.stack.start_extra_fleet("core", 1).await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    world.route_on("core", "intranet", "intra.example.com", "/", "api").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    expect_on(&core.hosts, &world.stack, "intra.example.com", "/", 200, "api@").await?;

    let nats = &world.stack.nats;
    let admin = nats.client().await?;
    let admin_bus = hafleet_runtime::nats::Bus::from_client(admin.clone());
    let edge = nats.client_as("hafleet-applier-edge").await?;
    let mut js = async_nats::jetstream::new(edge.clone());
    js.set_timeout(std::time::Duration::from_secs(2));
    let configs = js.get_stream_no_info(hafleet_proto::CONFIGS_STREAM).await?;

    // The newest config, by subject: edge's own, not core's.
    let own = configs.direct_get_last_for_subject("hafleet.configs.edge").await;
    assert!(own.is_ok(), "control: edge reads its own newest config: {own:?}");
    assert!(configs.direct_get_last_for_subject("hafleet.configs.core").await.is_err());
    // Reads of any message of the stream.
    assert!(configs.get_raw_message(1).await.is_err(), "MSG.GET reads every fleet's");
    assert!(configs.direct_get(1).await.is_err(), "DIRECT.GET by sequence reads every fleet's");
    // Consumers: core's filter under edge's name, core's own consumer, an unnamed one.
    for (name, filter) in [
        (Some("hafleet-applier-edge"), "hafleet.configs.core"),
        (Some("hafleet-applier-core"), "hafleet.configs.core"),
        (None, "hafleet.configs.core"),
        (None, "hafleet.configs.>"),
    ] {
        let config = pull::Config {
            durable_name: name.map(str::to_owned),
            filter_subject: filter.into(),
            ..Default::default()
        };
        let created = configs.create_consumer(config).await;
        assert!(created.is_err(), "edge made a consumer {name:?} of {filter}");
    }

    // Large bundles: both fleets' newest, put in the bundles stream as the renderer does.
    let mut shas = Vec::new();
    for fleet in ["edge", "core"] {
        let subject = format!("hafleet.configs.{fleet}");
        let raw = admin_bus
            .js
            .get_stream(hafleet_proto::CONFIGS_STREAM)
            .await?
            .get_last_raw_message_by_subject(&subject)
            .await?;
        let v = hafleet_proto::ConfigVersion::decode(&raw.payload)?;
        admin_bus.stash_bundle(&v).await?;
        shas.push((v.fleet.clone(), v.sha256.clone()));
    }
    let bundles = js.get_stream_no_info(hafleet_proto::BUNDLES_STREAM).await?;
    let chunk = |i: usize| hafleet_proto::bundle_chunk_subject(&shas[i].0, &shas[i].1, 0);
    assert!(bundles.direct_get_last_for_subject(chunk(0)).await.is_ok(), "control: edge's own");
    assert!(bundles.direct_get_last_for_subject(chunk(1)).await.is_err(), "core's bundle");
    // Certificates are stored apart, by id, under their fleet's bundles subjects: edge reads
    // its own, not core's.
    let cert = |i: usize| hafleet_proto::cert_subject(&shas[i].0, &"c".repeat(64));
    for i in [0, 1] {
        admin_bus.publish(cert(i), &format!("cert-test-{i}"), b"{}".to_vec()).await?;
    }
    assert!(bundles.direct_get_last_for_subject(cert(0)).await.is_ok(), "control: edge's own");
    assert!(bundles.direct_get_last_for_subject(cert(1)).await.is_err(), "core's certificate");

    // Core messages: edge's subscription gets none; the admin's, made the same way, does.
    let mut theirs = edge.subscribe("hafleet.configs.core").await?;
    let mut admins = admin.subscribe("hafleet.configs.core").await?;
    edge.flush().await?;
    admin.flush().await?;
    world.route_on("core", "wiki", "wiki.example.com", "/", "api").await?;
    let seen = tokio::time::timeout(CONVERGE, admins.next()).await?;
    assert!(seen.is_some(), "control: core's next version was published");
    let leaked = tokio::time::timeout(std::time::Duration::from_secs(2), theirs.next()).await;
    assert!(!matches!(leaked, Ok(Some(_))), "edge's credentials received core's config");
    Ok(())
}

/// The appliers' reports come back on the Ingress whose change made each version, as Events:
/// Normal `Live` "version N live on 2/2 hosts of fleet edge" once both hosts took it, and
/// Warning `RolledBack` naming the host, the stage and why when the canary put it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ingress_tells_where_its_change_went_live_and_where_it_was_rolled_back() -> Result<()> {
    let mut world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let version = world.stack.latest_version().await?.context("a version")?.version;
    let events: Api<Event> = Api::namespaced(world.stack.kube.client().await?, "default");
    let events = &events;
    let told = |name: &'static str, reason: &'static str, note: String| async move {
        eventually(CONVERGE, &format!("{reason} event on {name}"), || {
            let note = note.clone();
            async move {
                let all = events.list(&ListParams::default()).await?.items;
                let found = all.iter().find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                        && e.note.as_deref().is_some_and(|n| n.contains(&note))
                });
                let found = found.ok_or_else(|| anyhow::anyhow!("not yet"))?;
                Ok(found.type_.clone().unwrap_or_default())
            }
        })
        .await
    };
    let kind =
        told("shop", "Live", format!("version {version} live on 2/2 hosts of fleet edge")).await?;
    assert_eq!(kind, "Normal");

    // Probes no version can pass: the next one is rolled back on the canary.
    let probes = "[[probes]]\npath = \"/\"\nhost = \"nowhere.example.com\"\nstatus = 200\n";
    world.stack.restart_applier_with_inventory(probes, &[("HAFLEET_PROBE_TIMEOUT", "2s")])?;
    world.route("blog", "blog.example.com", "/", "api").await?;
    let kind = told("blog", "RolledBack", "rolled back on lb-1 at probe: ".into()).await?;
    assert_eq!(kind, "Warning");
    Ok(())
}

/// Starts the stack's applier and waits, at most `CONVERGE`, for it to exit; says whether it
/// did, and gives its log.
async fn applier_until_it_exits(world: &mut World) -> Result<(bool, String)> {
    world.stack.start_component(Component::Applier)?;
    let stack = &mut world.stack;
    let exited = hafleet_tests::wait_for(CONVERGE, || {
        let running = stack.is_running(Component::Applier);
        async move { !running }
    })
    .await;
    Ok((exited, std::fs::read_to_string(world.stack.log_path(Component::Applier))?))
}

/// The renderer's own messages count only on their own subjects, which no watcher may publish
/// on: render settings published on a fleet's subject (as anyone who may publish route events
/// could) are parked, not applied, and no version carries their template.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_settings_on_a_route_subject_are_parked_not_applied() -> Result<()> {
    let world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let forged = hafleet_proto::RouteMessage::Render(hafleet_proto::RenderSettings {
        schema: hafleet_proto::SCHEMA_VERSION,
        template: "global\n# forged-template-marker\n".into(),
        builtin: false,
        servers_per_backend: 1,
        spare_backends: 0,
        node_health: None,
        sweep_guard_percent: 100,
        sweep_guard_min_routes: 10,
    });
    let admin = world.stack.nats.bus().await?;
    admin.js.publish("hafleet.routes.edge", forged.encode().into()).await?.await?;
    let parked = eventually(CONVERGE, "the forged settings parked", || async {
        let (ok, out, err) =
            crate::history::cli(&world, &["deadletter", "list", "-o", "json"]).await?;
        anyhow::ensure!(ok, "{err}");
        let parked: serde_json::Value = serde_json::from_str(&out)?;
        anyhow::ensure!(parked.as_array().is_some_and(|a| !a.is_empty()), "none yet");
        Ok(parked)
    })
    .await?;
    assert!(parked[0]["error"].as_str().unwrap_or_default().contains("forged"), "{parked}");
    // The fleet goes on with the settings it had.
    world.route("blog", "blog.example.com", "/", "api").await?;
    expect_everywhere(&world.stack, "blog.example.com", "/", 200, "api@").await?;
    let latest = world.stack.latest_version().await?.context("a version")?;
    let config = latest.bundle().map(|b| b.config.clone()).unwrap_or_default();
    assert!(!config.contains("forged-template-marker"), "the forged template was applied");
    Ok(())
}
