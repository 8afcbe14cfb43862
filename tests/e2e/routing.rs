//! Ingresses become routes on every HAProxy host and follow every change.

use crate::{CONVERGE, World, expect_everywhere, expect_on, ingress, node_listed_everywhere};
use anyhow::Result;
use hafleet_proto::ApplyOutcome;
use hafleet_tests::eventually;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn an_annotated_ingress_goes_live_on_both_hosts_and_follows_every_change() -> Result<()> {
    let world = World::start().await?;
    let (stack, ingresses) = (&world.stack, &world.ingresses);

    // An Ingress without the annotation is not hafleet's.
    ingresses
        .create(&PostParams::default(), &ingress("other", None, "other.example.com", "/", "web"))
        .await?;
    // The annotated one goes live on both hosts; Prefix matches whole segments only.
    ingresses
        .create(
            &PostParams::default(),
            &ingress("shop", Some("edge"), "shop.example.com", "/app", "web"),
        )
        .await?;
    expect_everywhere(stack, "shop.example.com", "/app/cart", 200, "web@node-").await?;
    expect_everywhere(stack, "shop.example.com", "/app", 200, "web@node-").await?;
    expect_everywhere(stack, "SHOP.example.com:80", "/app", 200, "web@node-").await?;
    expect_everywhere(stack, "shop.example.com", "/application", 404, "").await?;
    expect_everywhere(stack, "other.example.com", "/", 404, "").await?;
    for h in &stack.hosts {
        let live = h.live_config();
        assert!(live.contains("shop.example.com"), "{}: {live}", h.name());
        assert!(!live.contains("other.example.com"), "unannotated Ingress reached {}", h.name());
    }

    // A node that stops being Ready leaves every host's backend; it comes back when Ready.
    node_listed_everywhere(stack, "node-2", true).await?;
    stack.kube.set_node_ready("node-2", false).await?;
    node_listed_everywhere(stack, "node-2", false).await?;
    expect_everywhere(stack, "shop.example.com", "/app", 200, "web@node-1").await?;
    stack.kube.set_node_ready("node-2", true).await?;
    node_listed_everywhere(stack, "node-2", true).await?;

    // Cordoning (a drain) keeps a node: kube-proxy still serves on it. The load-balancer
    // exclusion label takes it out.
    let nodes: Api<Node> = Api::all(stack.kube.client().await?);
    let cordon = serde_json::json!({"spec": {"unschedulable": true}});
    nodes.patch("node-2", &PatchParams::default(), &Patch::Merge(&cordon)).await?;
    let exclude = serde_json::json!({"metadata": {"labels": {
        "node.kubernetes.io/exclude-from-external-load-balancers": ""}}});
    nodes.patch("node-1", &PatchParams::default(), &Patch::Merge(&exclude)).await?;
    for h in &stack.hosts {
        eventually(CONVERGE, &format!("{}: node-1 excluded", h.name()), || async move {
            let live = h.live_config();
            anyhow::ensure!(!live.contains("server node-1 "), "node-1 still in {}", h.name());
            Ok(())
        })
        .await?;
        assert!(h.live_config().contains("server node-2 "), "a cordoned node keeps serving");
    }
    let include = serde_json::json!({"metadata": {"labels": {
        "node.kubernetes.io/exclude-from-external-load-balancers": null}}});
    nodes.patch("node-1", &PatchParams::default(), &Patch::Merge(&include)).await?;

    // A new host and path, pointing at another Service: the old ones stop routing.
    let mut changed = ingresses.get("shop").await?;
    changed.spec = ingress("shop", None, "api.example.com", "/v1", "api").spec;
    ingresses.replace("shop", &PostParams::default(), &changed).await?;
    expect_everywhere(stack, "api.example.com", "/v1/users", 200, "api@node-").await?;
    expect_everywhere(stack, "shop.example.com", "/app", 404, "").await?;

    // Deleted: nothing routes any more.
    ingresses.delete("shop", &DeleteParams::default()).await?;
    expect_everywhere(stack, "api.example.com", "/v1/users", 404, "").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fleet_serves_only_its_own_ingresses_and_an_ingress_can_move() -> Result<()> {
    let world = World::start().await?;
    let stack = &world.stack;
    let core = stack.start_extra_fleet("core", 1).await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    world.route_on("core", "intranet", "intra.example.com", "/", "api").await?;

    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;
    expect_on(&core.hosts, stack, "intra.example.com", "/", 200, "api@").await?;
    expect_everywhere(stack, "intra.example.com", "/", 404, "").await?;
    expect_on(&core.hosts, stack, "shop.example.com", "/", 404, "").await?;
    assert!(!core.hosts[0].live_config().contains("shop.example.com"));
    assert!(!stack.hosts[0].live_config().contains("intra.example.com"));

    // Re-annotated: it leaves edge and goes live on core.
    let patch = serde_json::json!({"metadata": {"annotations": {"hafleet.io/fleet": "core"}}});
    world.ingresses.patch("shop", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    expect_on(&core.hosts, stack, "shop.example.com", "/", 200, "web@").await?;
    expect_everywhere(stack, "shop.example.com", "/", 404, "").await?;
    Ok(())
}

/// Every host's master reload counter.
fn reload_counts(stack: &hafleet_tests::stack::Stack) -> Result<Vec<u32>> {
    stack.hosts.iter().map(|h| h.reload_count()).collect()
}

/// Waits for every host's report of the fleet's latest version and checks it went live
/// without a reload, through the runtime API.
async fn live_without_a_reload(world: &World) -> Result<()> {
    let version = world.stack.latest_version().await?.expect("a version").version;
    for h in &world.stack.hosts {
        let report = world.report(h.name(), version).await?;
        assert_eq!(report.version, version, "{report:?}");
        assert_eq!(report.outcome, hafleet_proto::ApplyOutcome::Applied, "{report:?}");
        assert_eq!(report.reloads, 0, "{report:?}");
        assert!(report.runtime_commands > 0, "{report:?}");
    }
    Ok(())
}

/// Checks that every host's running maps hold what their files say, and that no map was
/// replaced since the last reload (no new version: `curr_ver=0`): a change of a few entries
/// edits them in place.
fn maps_edited_in_place(stack: &hafleet_tests::stack::Stack) -> Result<()> {
    for h in &stack.hosts {
        h.running_maps_match_files()?;
        let shown = h.master_cli("@1 show map")?;
        let maps: Vec<&str> = shown.lines().filter(|l| l.contains("hafleet-maps/")).collect();
        assert!(!maps.is_empty(), "{shown}");
        assert!(maps.iter().all(|l| l.contains(" curr_ver=0 ")), "{}: {shown}", h.name());
    }
    Ok(())
}

/// Routes first.example.com to the web Service and waits until every host serves it and has
/// reported the version.
async fn first_route_live(world: &World) -> Result<()> {
    let stack = &world.stack;
    world.route("first", "first.example.com", "/", "web").await?;
    expect_everywhere(stack, "first.example.com", "/", 200, "web@node-").await?;
    let first = stack.latest_version().await?.expect("a version").version;
    for h in &stack.hosts {
        world.report(h.name(), first).await?;
    }
    Ok(())
}

/// A watcher's pass is rendered as soon as its last route event is in, not after the window
/// that lets a burst settle: here the renderer waits 20 s without a route event before it
/// closes a batch (--quiet), and a lone Ingress is served on every host before that window
/// could have closed. The watcher tells with each route event how many more of the same pass
/// follow (none here), so the renderer knows that nothing else is coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_pass_is_rendered_without_waiting_out_the_renderer_s_quiet_window() -> Result<()>
{
    use hafleet_tests::stack::Component;
    let mut world = World::start().await?;
    first_route_live(&world).await?;
    let quiet = std::time::Duration::from_secs(20);
    let renderer = [("HAFLEET_QUIET", "20s"), ("HAFLEET_COALESCE", "60s")];
    world.stack.restart_with(Component::Renderer, &renderer)?;
    world.stack.until_ready(Component::Renderer, CONVERGE).await?;
    let before = world.stack.latest_version().await?.map_or(0, |v| v.version);
    let asked = std::time::Instant::now();
    world.route("lone", "lone.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "lone.example.com", "/", 200, "web@node-").await?;
    let took = asked.elapsed();
    assert!(took < quiet, "served after {took:?}: the window of {quiet:?} was waited out");
    let now = world.stack.latest_version().await?.expect("a version").version;
    assert_eq!(now, before + 1, "one version for one change");
    Ok(())
}

/// A route to a backend the hosts already run changes only map entries: it goes live through
/// the runtime API without a reload, its few entries edited in the running maps, and so does
/// its removal. The files on disk match what runs, so a reload afterwards serves the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_to_a_running_backend_goes_live_and_away_without_a_reload() -> Result<()> {
    let world = World::start().await?;
    let stack = &world.stack;
    first_route_live(&world).await?;
    let reloads = reload_counts(stack)?;

    world.route("second", "second.example.com", "/shop", "web").await?;
    expect_everywhere(stack, "second.example.com", "/shop/cart", 200, "web@node-").await?;
    expect_everywhere(stack, "second.example.com", "/", 404, "").await?;
    live_without_a_reload(&world).await?;
    assert_eq!(reload_counts(stack)?, reloads, "a new map entry reloads nothing");
    maps_edited_in_place(stack)?;
    // Only map files changed: each host checked them alone, not all of the config again.
    let log = std::fs::read_to_string(stack.log_path(hafleet_tests::stack::Component::Applier))?;
    let quick = log.matches("but for its maps and certificates: checking those alone").count();
    assert!(quick >= stack.hosts.len(), "{quick} quick checks\n{log}");

    world.ingresses.delete("second", &DeleteParams::default()).await?;
    expect_everywhere(stack, "second.example.com", "/shop/cart", 404, "").await?;
    live_without_a_reload(&world).await?;
    assert_eq!(reload_counts(stack)?, reloads, "a map entry removed reloads nothing");
    maps_edited_in_place(stack)?;
    expect_everywhere(stack, "first.example.com", "/", 200, "web@node-").await?;

    // What runs is what the files say: reloaded by hand, each host serves the same.
    for (h, before) in stack.hosts.iter().zip(&reloads) {
        h.reload()?;
        eventually(CONVERGE, &format!("{} reloaded", h.name()), || async move {
            anyhow::ensure!(h.reload_count()? > *before, "not yet");
            Ok(())
        })
        .await?;
    }
    expect_everywhere(stack, "first.example.com", "/", 200, "web@node-").await?;
    expect_everywhere(stack, "second.example.com", "/shop/cart", 404, "").await?;

    // A command HAProxy refuses falls back to a reload: someone removed node-2's server from
    // the web backend by hand on the first host, so draining node-2 there cannot put it in
    // maintenance; the second host takes the drain through the runtime API.
    let (tampered, other) = (&stack.hosts[0], &stack.hosts[1]);
    tampered.master_cli("@1 set server be_default_web_80/node-2 state maint")?;
    let answer = tampered.master_cli("@1 del server be_default_web_80/node-2")?;
    assert!(answer.contains("Server deleted"), "{answer}");
    let before = stack.latest_version().await?.expect("a version").version;
    let reloads = reload_counts(stack)?;
    stack.kube.set_node_ready("node-2", false).await?;
    node_listed_everywhere(stack, "node-2", false).await?;
    let fell_back = world.report(tampered.name(), before + 1).await?;
    assert_eq!(fell_back.outcome, hafleet_proto::ApplyOutcome::Applied, "{fell_back:?}");
    assert_eq!(fell_back.reloads, 1, "{fell_back:?}");
    let drained = world.report(other.name(), before + 1).await?;
    assert_eq!(
        (drained.reloads, drained.outcome.clone()),
        (0, hafleet_proto::ApplyOutcome::Applied)
    );
    assert_eq!(reload_counts(stack)?, [reloads[0] + 1, reloads[1]]);
    expect_everywhere(stack, "first.example.com", "/", 200, "web@node-1").await?;
    Ok(())
}

/// A running map that is not the file it was loaded from (an entry added by hand) is never
/// edited from a state it does not have: the canary, whose change goes live in its upload's
/// round trip, finds that the map does not hold the entries the edits start from, keeps the
/// swap and reloads; the other host takes the same change as edits. After it, each host's
/// running maps are its files again, and the entry added by hand is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_changed_by_hand_is_reloaded_not_edited() -> Result<()> {
    let world = World::start().await?;
    let stack = &world.stack;
    first_route_live(&world).await?;
    let (tampered, other) = (&stack.hosts[0], &stack.hosts[1]);
    let shown = tampered.master_cli("@1 show map")?;
    let ids = hafleet_applier::core::runtime_api::map_ids(&shown, &["hosts"])
        .ok_or_else(|| anyhow::anyhow!("not one hosts map in {shown}"))?;
    let added =
        tampered.master_cli(&format!("@1 add map {} byhand.example.com x", ids["hosts"]))?;
    assert!(added.trim().is_empty(), "add map answered {added:?}");
    assert!(tampered.running_maps_match_files().is_err(), "the running map differs from its file");
    let before = stack.latest_version().await?.expect("a version").version;
    let reloads = reload_counts(stack)?;

    world.route("second", "second.example.com", "/shop", "web").await?;
    expect_everywhere(stack, "second.example.com", "/shop/cart", 200, "web@node-").await?;
    let reloaded = world.report(tampered.name(), before + 1).await?;
    assert_eq!((reloaded.outcome.clone(), reloaded.reloads), (ApplyOutcome::Applied, 1));
    let edited = world.report(other.name(), before + 1).await?;
    assert_eq!((edited.outcome.clone(), edited.reloads), (ApplyOutcome::Applied, 0));
    assert!(edited.runtime_commands > 0, "{edited:?}");
    assert_eq!(reload_counts(stack)?, [reloads[0] + 1, reloads[1]]);
    for h in &stack.hosts {
        h.running_maps_match_files()?;
    }
    let shown = tampered.master_cli("@1 show map")?;
    let ids = hafleet_applier::core::runtime_api::map_ids(&shown, &["hosts"])
        .ok_or_else(|| anyhow::anyhow!("not one hosts map in {shown}"))?;
    let entries = tampered.master_cli(&format!("@1 show map {}", ids["hosts"]))?;
    assert!(!entries.contains("byhand.example.com"), "{entries}");
    let log = std::fs::read_to_string(stack.log_path(hafleet_tests::stack::Component::Applier))?;
    assert!(log.contains("the runtime API did not take the change; reloading instead"), "{log}");
    Ok(())
}

/// A new Service needs a reload (a backend of its own), but each host serves it through a
/// spare backend before that reload: here each host holds every reload for 2 s before HAProxy
/// reads the config, and the new host answers on each before its HAProxy has started again.
/// The reload then gives the Service its own backend and leaves the spare empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_service_is_served_through_a_spare_backend_before_its_reload() -> Result<()> {
    let world = World::start().await?;
    let stack = &world.stack;
    // Held from the first version on, so that the applier knows these hosts' reloads are
    // slow (it bridges only reloads that take 250 ms or more).
    for h in &stack.hosts {
        h.hold_reloads(Some(std::time::Duration::from_secs(2)))?;
    }
    first_route_live(&world).await?;
    for h in &stack.hosts {
        assert!(h.live_config().contains("\nbackend hafleet_spare_0\n"), "{}", h.live_config());
    }
    let reloads = reload_counts(stack)?;
    let execs: Vec<usize> = stack.hosts.iter().map(|h| h.haproxy_execs()).collect::<Result<_>>()?;

    // The api Service has no backend on the hosts yet.
    world.route("second", "second.example.com", "/", "api").await?;
    for (h, execs) in stack.hosts.iter().zip(&execs) {
        let addr = h.http_addr();
        eventually(CONVERGE, &format!("{} serves second.example.com", h.name()), || async move {
            let (status, body) =
                hafleet_tests::http::http_get(addr, "second.example.com", "/").await?;
            anyhow::ensure!(
                status == 200 && body.starts_with("api@node-"),
                "got {status} {body:?}"
            );
            Ok(())
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))?;
        // Served by the worker that ran before the change: HAProxy has not started again.
        assert_eq!(h.haproxy_execs()?, *execs, "{} served it only after a reload", h.name());
    }
    let version = stack.latest_version().await?.expect("a version").version;
    for h in &stack.hosts {
        let report = world.report(h.name(), version).await?;
        assert_eq!(report.outcome, hafleet_proto::ApplyOutcome::Applied, "{report:?}");
        assert_eq!((report.reloads, report.bridged), (1, 1), "{report:?}");
        assert!(report.runtime_commands > 0, "{report:?}");
        h.hold_reloads(None)?;
    }
    let after: Vec<u32> = reloads.iter().map(|r| r + 1).collect();
    assert_eq!(reload_counts(stack)?, after, "one reload each");
    // Each reload went through the wrapper that held it: HAProxy started again on each (its
    // master execs itself to load the config, then once more to drop it, in wait mode).
    for (h, before) in stack.hosts.iter().zip(&execs) {
        assert!(h.haproxy_execs()? > *before, "{} never started again", h.name());
    }
    // After the reload: the Service's own backend serves it, the spare is empty again.
    expect_everywhere(stack, "second.example.com", "/", 200, "api@node-").await?;
    expect_everywhere(stack, "first.example.com", "/", 200, "web@node-").await?;
    for h in &stack.hosts {
        assert!(h.live_config().contains("\nbackend be_default_api_80\n"));
        let spare = h.master_cli("@1 show servers state hafleet_spare_0")?;
        assert!(!spare.contains("hafleet_spare_0 "), "{spare}");
        let own = h.master_cli("@1 show servers state be_default_api_80")?;
        assert!(own.contains("be_default_api_80 "), "{own}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_lookups_keep_exact_longest_prefix_host_less_and_404_semantics() -> Result<()> {
    let world = World::start().await?;
    let stack = &world.stack;
    let path = |p: &str, kind: &str, svc: &str| {
        serde_json::json!({"path": p, "pathType": kind,
            "backend": {"service": {"name": svc, "port": {"number": 80}}}})
    };
    let ing: k8s_openapi::api::networking::v1::Ingress =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": {"name": "mixed", "annotations": {"hafleet.io/fleet": "edge"}},
            "spec": {"rules": [
                {"host": "shop.example.com", "http": {"paths": [
                    path("/", "Prefix", "web"),
                    path("/api", "Prefix", "api"),
                    path("/api/v1", "Prefix", "web"),
                    path("/api/v1/status", "Exact", "api"),
                ]}},
                // A rule without a host: any host that no host rule takes.
                {"http": {"paths": [path("/static", "Prefix", "api")]}},
                // A wildcard: one label deep; an exact host wins over it.
                {"host": "*.wild.test", "http": {"paths": [
                    path("/", "Prefix", "api"),
                    path("/exact", "Exact", "web"),
                ]}},
                {"host": "exact.wild.test", "http": {"paths": [path("/", "Prefix", "web")]}},
            ]}
        }))?;
    world.ingresses.create(&PostParams::default(), &ing).await?;
    let h = "shop.example.com";
    for (host, path, status, body) in [
        (h, "/api/v1/status", 200, "api@"), // Exact beats the longer-matching prefix /api/v1
        (h, "/api/v1/status/x", 200, "web@"), // an Exact rule matches nothing below it
        (h, "/api/v1/users", 200, "web@"),  // the longest prefix wins
        (h, "/api/v1", 200, "web@"),
        (h, "/api/users", 200, "api@"),
        (h, "/api", 200, "api@"),
        (h, "/apiv1", 200, "web@"), // segments, not characters: falls to /
        (h, "/static/x", 200, "web@"), // the host's own / beats the host-less rule
        ("other.example.com", "/static/app.js", 200, "api@"), // host-less rule
        ("other.example.com", "/staticfiles", 404, ""),
        ("other.example.com", "/", 404, ""), // nothing routes it: the 404 default
        ("a.wild.test", "/x", 200, "api@"),  // the wildcard's prefix
        ("a.wild.test", "/exact", 200, "web@"), // the wildcard's Exact rule
        ("B.wild.test:80", "/exact", 200, "web@"), // case and port do not matter
        ("exact.wild.test", "/exact", 200, "web@"), // the exact host wins: its own /
        ("exact.wild.test", "/x", 200, "web@"),
        ("b.a.wild.test", "/x", 404, ""), // one label only: falls to the host-less rules
        ("wild.test", "/x", 404, ""),     // and the bare domain is not covered
        ("b.a.wild.test", "/static/x", 200, "api@"), // … which route what they route
    ] {
        expect_everywhere(stack, host, path, status, body).await?;
    }
    // Routing is in the maps, not in a list of use_backend lines.
    let live = stack.hosts[0].live_config();
    assert!(!live.contains("use_backend be_"), "{live}");
    assert!(live.contains("map_beg(hafleet-maps/prefix-"), "{live}");
    Ok(())
}

/// The servers a backend lists in a live config.
fn servers_of(config: &str, backend: &str) -> Vec<String> {
    config
        .split(&format!("\nbackend {backend}\n"))
        .nth(1)
        .map(|rest| {
            rest.lines()
                .take_while(|l| !l.trim().is_empty() && !l.starts_with("backend "))
                .filter_map(|l| l.trim().strip_prefix("server ").map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// An EndpointSlice of `service` in `default`, as the EndpointSlice controller writes it at
/// `ar`'s version, with one endpoint per (node, ready): `nodeName` in `discovery.k8s.io/v1`,
/// the node's hostname label in `v1beta1`'s topology (the only form Kubernetes 1.20 keeps).
fn endpoint_slice(
    ar: &kube::api::ApiResource,
    name: &str,
    service: &str,
    on: &[(&str, bool)],
) -> Result<kube::api::DynamicObject> {
    let endpoints: Vec<serde_json::Value> = on
        .iter()
        .enumerate()
        .map(|(i, (node, ready))| {
            let mut e = serde_json::json!({"addresses": [format!("10.9.0.{}", i + 1)],
                                           "conditions": {"ready": ready}});
            match ar.version.as_str() {
                "v1beta1" => {
                    e["topology"] = serde_json::json!({"kubernetes.io/hostname": hostname(node)})
                }
                _ => e["nodeName"] = serde_json::json!(node),
            }
            e
        })
        .collect();
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": ar.api_version, "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))?)
}

/// The `kubernetes.io/hostname` label the tests give a node: not its name, so that finding
/// the node from a v1beta1 topology is proven.
fn hostname(node: &str) -> String {
    format!("host-of-{node}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_services_list_a_bounded_subset_of_nodes_and_local_ones_their_endpoints_nodes()
-> Result<()> {
    let mut world = World::start().await?;
    world.stack.restart_with(
        hafleet_tests::stack::Component::Renderer,
        &[("HAFLEET_SERVERS_PER_BACKEND", "1")],
    )?;
    let client = world.stack.kube.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for node in ["node-1", "node-2"] {
        let label =
            serde_json::json!({"metadata": {"labels": {"kubernetes.io/hostname": hostname(node)}}});
        nodes.patch(node, &PatchParams::default(), &Patch::Merge(&label)).await?;
    }
    // api forwards only on nodes with an endpoint of its own: its EndpointSlice, written here
    // as the EndpointSlice controller would, at the version this API server serves, puts its
    // one ready endpoint on node-1 (and a not-ready one on node-2).
    let (ar, _) = kube::discovery::group(&client, "discovery.k8s.io")
        .await?
        .recommended_kind("EndpointSlice")
        .ok_or_else(|| anyhow::anyhow!("the API server serves no EndpointSlice"))?;
    let slices: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &ar);
    slices
        .create(
            &PostParams::default(),
            &endpoint_slice(&ar, "api-1", "api", &[("node-1", true), ("node-2", false)])?,
        )
        .await?;
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client, "default");
    let local = serde_json::json!({"spec": {"externalTrafficPolicy": "Local"}});
    services.patch("api", &PatchParams::default(), &Patch::Merge(&local)).await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    world.route("blog", "blog.example.com", "/", "api").await?;
    let stack = &world.stack;
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;
    expect_everywhere(stack, "blog.example.com", "/", 200, "api@").await?;

    for h in &stack.hosts {
        let config = h.live_config();
        let web = servers_of(&config, "be_default_web_80");
        assert_eq!(web.len(), 1, "Cluster: one node of two\n{config}");
        let api = servers_of(&config, "be_default_api_80");
        assert_eq!(api.len(), 1, "Local: the node with a ready endpoint\n{config}");
        assert!(api[0].starts_with("node-1 "), "{config}");
        // Every request goes to the one node the subset holds, the same on every host.
        let node = web[0].split_whitespace().next().unwrap_or_default().to_owned();
        for _ in 0..6 {
            let (status, body) =
                hafleet_tests::http_get(h.http_addr(), "shop.example.com", "/").await?;
            assert_eq!(status, 200);
            assert!(body.starts_with(&format!("web@{node}")), "{body} is not from {node}");
            let (status, body) =
                hafleet_tests::http_get(h.http_addr(), "blog.example.com", "/").await?;
            assert_eq!((status, body.starts_with("api@node-1")), (200, true), "{body}");
        }
    }
    assert_eq!(
        servers_of(&stack.hosts[0].live_config(), "be_default_web_80"),
        servers_of(&stack.hosts[1].live_config(), "be_default_web_80")
    );

    // The endpoint moves: node-2's becomes ready, node-1's goes. api follows, on every host.
    let mut moved = endpoint_slice(&ar, "api-1", "api", &[("node-1", false), ("node-2", true)])?;
    moved.metadata.resource_version = slices.get("api-1").await?.metadata.resource_version;
    slices.replace("api-1", &PostParams::default(), &moved).await?;
    for h in &stack.hosts {
        eventually(CONVERGE, &format!("api only on node-2 on {}", h.name()), || async move {
            let config = h.live_config();
            let api = servers_of(&config, "be_default_api_80");
            anyhow::ensure!(api.len() == 1 && api[0].starts_with("node-2 "), "{api:?}");
            Ok(())
        })
        .await?;
    }
    expect_everywhere(stack, "blog.example.com", "/", 200, "api@node-2").await?;
    Ok(())
}

/// Every `hafleet.io/` setting takes effect in HAProxy; an unknown key or a bad value is
/// refused with an Event naming it, and the Ingress keeps its last good routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotations_set_haproxy_behaviour_and_a_bad_one_keeps_the_last_good_routes() -> Result<()>
{
    let world = World::start().await?;
    let stack = &world.stack;
    let host = "tuned.example.com";
    let mut ing = ingress("tuned", Some("edge"), host, "/", "web");
    let settings = [
        ("hafleet.io/balance", "leastconn"),
        ("hafleet.io/timeout-connect", "3s"),
        ("hafleet.io/timeout-server", "1m"),
        ("hafleet.io/health-check-path", "/healthz"),
        ("hafleet.io/health-check-interval", "3s"),
        ("hafleet.io/sticky-cookie", "SRV"),
        ("hafleet.io/max-conn", "50"),
    ];
    let annotations = ing.metadata.annotations.get_or_insert_default();
    for (k, v) in settings {
        annotations.insert(k.into(), v.into());
    }
    world.ingresses.create(&PostParams::default(), &ing).await?;
    expect_everywhere(stack, host, "/", 200, "web@node-").await?;
    for h in &stack.hosts {
        let live = h.live_config();
        for line in [
            "balance leastconn",
            "timeout connect 3s",
            "timeout server 1m",
            "option httpchk GET /healthz",
            "cookie SRV insert indirect nocache",
            " inter 3s maxconn 50 cookie node-",
        ] {
            assert!(live.contains(line), "{line:?} missing on {}\n{live}", h.name());
        }
        // Stickiness: HAProxy names the server in the cookie it sets.
        let r = hafleet_tests::http_get_full(h.http_addr(), host, "/").await?;
        let cookie = r.header("set-cookie").unwrap_or_default();
        assert!(cookie.starts_with("SRV=node-"), "{r:?}");
    }

    // Only 10.0.0.0/8 may come in: this test's 127.x address gets 403; then it may again.
    let patch = |k: &str, v: &str| {
        let mut a = serde_json::Map::new();
        a.insert(k.to_owned(), v.into());
        serde_json::json!({"metadata": {"annotations": a}})
    };
    let set = |k: &'static str, v: &'static str| {
        let ingresses = &world.ingresses;
        let body = patch(k, v);
        async move { ingresses.patch("tuned", &PatchParams::default(), &Patch::Merge(&body)).await }
    };
    set("hafleet.io/allow-source", "10.0.0.0/8").await?;
    expect_everywhere(stack, host, "/", 403, "").await?;
    set("hafleet.io/allow-source", "10.0.0.0/8, 127.0.0.0/8").await?;
    expect_everywhere(stack, host, "/", 200, "web@node-").await?;

    // Plain HTTP goes to HTTPS.
    set("hafleet.io/ssl-redirect", "true").await?;
    expect_everywhere(stack, host, "/x", 308, "").await?;
    let r = hafleet_tests::http_get_full(stack.hosts[0].http_addr(), host, "/x").await?;
    assert_eq!(r.header("location"), Some("https://tuned.example.com/x"), "{r:?}");

    // A mistyped key: refused with an Event naming it; the last good routes stay (308).
    set("hafleet.io/ssl-redirekt", "false").await?;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(stack.kube.client().await?, "default");
    let events = &events;
    eventually(CONVERGE, "InvalidIngress event naming the key", || async move {
        let found = events.list(&Default::default()).await?.items.into_iter().any(|e| {
            e.reason.as_deref() == Some("InvalidIngress")
                && e.note.as_deref().is_some_and(|n| n.contains("hafleet.io/ssl-redirekt"))
        });
        anyhow::ensure!(found, "not yet");
        Ok(())
    })
    .await?;
    expect_everywhere(stack, host, "/x", 308, "").await?;
    Ok(())
}

/// A routed Ingress shows where its fleet takes traffic, as `kubectl get ingress` reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_ingress_shows_its_fleet_s_addresses_in_its_status() -> Result<()> {
    let mut world = World::start().await?;
    let addresses: Vec<String> =
        world.stack.hosts.iter().map(|h| h.http_addr().ip().to_string()).collect();
    let setting = format!("edge={} core=lb.core.example", addresses.join(","));
    world.stack.restart_with(
        hafleet_tests::stack::Component::Watcher,
        &[("HAFLEET_FLEET_ADDRESSES", &setting)],
    )?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    world
        .ingresses
        .create(&PostParams::default(), &ingress("other", None, "o.example.com", "/", "web"))
        .await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let ingresses = &world.ingresses;
    let shown = |name: &'static str| async move {
        let ing = ingresses.get(name).await?;
        let shown: Vec<String> = ing
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|lb| lb.ingress)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|i| i.ip.or(i.hostname))
            .collect();
        anyhow::Ok(shown)
    };
    let addresses = &addresses;
    eventually(CONVERGE, "shop's status shows edge's addresses", || async move {
        let ips = shown("shop").await?;
        anyhow::ensure!(ips == *addresses, "status shows {ips:?}");
        Ok(())
    })
    .await?;
    assert!(shown("other").await?.is_empty(), "an Ingress hafleet does not route is left alone");
    Ok(())
}
