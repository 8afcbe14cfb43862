//! Several Kubernetes clusters feeding one fleet: a watcher per cluster, each with its own
//! `--cluster-id` (or none, for the cluster that was there first).

use crate::{CONVERGE, World, expect_everywhere, ingress};
use anyhow::{Context, Result};
use hafleet_proto::{ClusterId, RouteMessage};
use hafleet_tests::stack::{Component, Stack, kubectl_apply, workspace_file};
use hafleet_tests::{ChildGuard, HttpBackend, KubeEnv, eventually, http_get, random_loopback_ip};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

/// The notes of the Events about Ingress `name` in `default` of a cluster.
async fn notes_on(events: &Api<Event>, name: &str) -> Result<Vec<String>> {
    let all = events.list(&ListParams::default()).await?.items;
    Ok(all
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|e| e.note)
        .collect())
}

/// Starts a watcher of `cluster` with `--cluster-id east`, logging to `watcher-east.log`.
fn watcher_of(stack: &Stack, cluster: &KubeEnv) -> Result<ChildGuard> {
    let mut cmd = stack.command(Component::Watcher);
    cmd.env("KUBECONFIG", cluster.watcher_kubeconfig_path())
        .env("HAFLEET_CLUSTER_ID", "east")
        .env("HAFLEET_HEALTH_ADDR", "127.0.0.1:0");
    ChildGuard::spawn("watcher-east", &mut cmd, &stack.dir().join("watcher-east.log"))
}

/// A second cluster, `east`, joins fleet `edge`, fed until then by a cluster whose watcher has
/// no id. Both have an Ingress `default/shop`, a Service `default/web` and a node `node-1`:
/// each Ingress routes to its own cluster's Service on its own cluster's nodes, HAProxy names
/// east's backend and servers apart, each watcher tells its own Ingress where its change went
/// live, and each cluster's snapshot sweeps its own Ingresses and no other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_feed_one_fleet_and_each_snapshot_sweeps_only_its_own() -> Result<()> {
    let mut world = World::start().await?;
    world.route("shop", "west.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "west.example.com", "/", 200, "web@node-").await?;

    let east = KubeEnv::start().await?;
    kubectl_apply(&east, &workspace_file("deploy/kubernetes/watcher-rbac.yaml")).await?;
    east.use_watcher_service_account_token().await?;
    let ip = random_loopback_ip();
    east.create_ready_node("node-1", ip).await?;
    let _east_health = hafleet_tests::cluster::node_health(ip, "node-1").await?;
    let port = u16::try_from(east.create_nodeport_service("default", "web", 80).await?)?;
    let _east_web = HttpBackend::start(ip, port, "east-web@node-1").await?;
    let east_ingresses: Api<Ingress> = Api::namespaced(east.client().await?, "default");
    let shop = ingress("shop", Some("edge"), "east.example.com", "/", "web");
    east_ingresses.create(&PostParams::default(), &shop).await?;
    let east_watcher = watcher_of(&world.stack, &east)?;
    expect_everywhere(&world.stack, "east.example.com", "/", 200, "east-web@node-1").await?;
    expect_everywhere(&world.stack, "west.example.com", "/", 200, "web@node-").await?;
    for h in &world.stack.hosts {
        let config = h.live_config();
        for line in ["backend be_default_web_80\n", "backend be_default_web_80:east\n"] {
            assert!(config.contains(line), "{}: no {line:?}\n{config}", h.name());
        }
        let east_server = format!("server node-1:east {ip}:{port}");
        assert!(config.contains(&east_server), "{}: no {east_server:?}\n{config}", h.name());
        assert!(config.contains("server node-1 "), "{}: west's node-1\n{config}", h.name());
    }
    let version = world.stack.latest_version().await?.context("a version")?;
    let causes: Vec<String> =
        version.causes.iter().filter_map(|c| c.ingress.as_ref().map(|k| k.to_string())).collect();
    assert_eq!(causes, ["default/shop@east"], "version {}", version.version);

    // East's watcher tells east's shop; the other watcher does not tell its own shop about a
    // change it did not make.
    let live = format!("version {} live on 2/2 hosts of fleet edge", version.version);
    let east_events: Api<Event> = Api::namespaced(east.client().await?, "default");
    let west_events: Api<Event> = Api::namespaced(world.stack.kube.client().await?, "default");
    let (east_events, live_ref) = (&east_events, &live);
    eventually(CONVERGE, "east's shop is told its change is live", || async move {
        let notes = notes_on(east_events, "shop").await?;
        anyhow::ensure!(notes.iter().any(|n| n == live_ref), "{notes:?}");
        Ok(())
    })
    .await?;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let west_notes = notes_on(&west_events, "shop").await?;
    assert!(!west_notes.contains(&live), "{west_notes:?}");

    // The first cluster's watcher restarts: its snapshot lists its own Ingresses only, and
    // east's stays. A route made after it is live once the snapshot was taken in.
    world.stack.restart_with(Component::Watcher, &[])?;
    // Ready once its snapshot is published: `later` comes after it in the stream.
    world.stack.until_ready(Component::Watcher, CONVERGE).await?;
    world.route("later", "later.example.com", "/", "api").await?;
    expect_everywhere(&world.stack, "later.example.com", "/", 200, "api@").await?;
    for h in &world.stack.hosts {
        let (status, body) = http_get(h.http_addr(), "east.example.com", "/").await?;
        assert_eq!((status, body.starts_with("east-web@")), (200, true), "{}: {body}", h.name());
    }
    // East's watcher, whose epoch is now older than the other cluster's newest, is not
    // fenced off: epochs are per cluster.
    let blog = ingress("blog", Some("edge"), "blog.east.example.com", "/", "web");
    east_ingresses.create(&PostParams::default(), &blog).await?;
    expect_everywhere(&world.stack, "blog.east.example.com", "/", 200, "east-web@").await?;

    // A Service of east in pods mode: its pod is a server of east's backend, named by its
    // address, and later sweeps of east's Ingresses leave it alone.
    let port = hafleet_tests::free_port(std::net::Ipv4Addr::LOCALHOST.into());
    let east_pod = hafleet_tests::pods::start_pod("east-pod", port).await?;
    let east_client = east.client().await?;
    hafleet_tests::pods::create_pods_service(east_client.clone(), "default", "pods", port, true)
        .await?;
    let pod = [(hafleet_tests::pods::ip(&east_pod), hafleet_tests::pods::Condition::Ready)];
    let east_slices = hafleet_tests::pods::Slices::of(east_client, "default").await?;
    east_slices.put("pods-1", "pods", port, &pod).await?;
    let pods = ingress("pods", Some("edge"), "pods.east.example.com", "/", "pods");
    east_ingresses.create(&PostParams::default(), &pods).await?;
    expect_everywhere(&world.stack, "pods.east.example.com", "/", 200, "east-pod").await?;
    let config = world.stack.hosts[0].live_config();
    let server = format!("    server {0} {0}\n", east_pod.addr());
    let backend = config.split("backend be_default_pods_80:east\n").nth(1).unwrap_or_default();
    assert!(backend.split("\nbackend ").next().unwrap_or_default().contains(&server), "{config}");

    // East's last run had a clock an hour ahead (its nodes message says so), and the stream's
    // newest message is then the other cluster's: east's next run must still take an epoch
    // above its own cluster's last, or the renderer fences off its snapshot below.
    let admin = async_nats::jetstream::new(world.stack.nats.client().await?);
    let routes = admin.get_stream(hafleet_proto::ROUTES_STREAM).await?;
    let subject = hafleet_proto::routes_nodes_subject(Some(&ClusterId::new("east")?));
    let raw = routes.get_last_raw_message_by_subject(&subject).await?;
    let RouteMessage::Nodes(mut nodes) = RouteMessage::decode(&raw.payload)? else {
        anyhow::bail!("not a nodes message on {subject}");
    };
    nodes.epoch += 3_600 * 1_000_000_000;
    admin.publish(subject, RouteMessage::Nodes(nodes).encode().into()).await?.await?;
    world.route("west-2", "west-2.example.com", "/", "api").await?;
    expect_everywhere(&world.stack, "west-2.example.com", "/", 200, "api@").await?;

    // East's Ingress is deleted while its watcher is down: east's next snapshot sweeps it,
    // and only it.
    drop(east_watcher);
    east_ingresses.delete("shop", &DeleteParams::default()).await?;
    let _east_watcher = watcher_of(&world.stack, &east)?;
    expect_everywhere(&world.stack, "east.example.com", "/", 404, "").await?;
    expect_everywhere(&world.stack, "west.example.com", "/", 200, "web@node-").await?;
    expect_everywhere(&world.stack, "later.example.com", "/", 200, "api@").await?;
    let swept = world.stack.latest_version().await?.context("a version")?;
    let swept: Vec<String> = swept
        .causes
        .iter()
        .filter(|c| c.what == "sweep")
        .filter_map(|c| Some(c.ingress.as_ref()?.to_string()))
        .collect();
    assert_eq!(swept, ["default/shop@east"]);
    expect_everywhere(&world.stack, "blog.east.example.com", "/", 200, "east-web@").await?;
    expect_everywhere(&world.stack, "pods.east.example.com", "/", 200, "east-pod").await?;
    Ok(())
}
