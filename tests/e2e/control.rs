//! The control plane (issue 34): every component reaches NATS over TLS, known by its NKEY,
//! and no secret shows on a command line or in `--help`.

use crate::{World, expect_everywhere};
use anyhow::{Context, Result};
use hafleet_tests::stack::Component;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// The stack runs as the README says to run it: NATS takes TLS connections only, each
/// component signs in with its own NKEY seed file, and traffic flows. A client that does not
/// speak TLS is turned away; a component given a CA that did not sign the server's certificate
/// stops at once with an error that says what to check, rather than waiting forever; no
/// component's command line holds a seed, and `--help` never shows the value of
/// `HAFLEET_NATS_URL` (a password in it, say).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_is_reached_over_tls_with_keys_and_a_wrong_ca_is_refused_at_once() -> Result<()> {
    let mut world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;

    // The server asks every client for TLS first thing, and one with the CA but no key of a
    // user it knows is turned away.
    let mut tcp = tokio::net::TcpStream::connect(world.stack.nats.addr()).await?;
    let mut info = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut info)).await??;
    let info = String::from_utf8_lossy(&info[..n]);
    assert!(info.starts_with("INFO ") && info.contains("\"tls_required\":true"), "{info}");
    let url = world.stack.nats.url();
    let anonymous = hafleet_runtime::NatsArgs {
        nats_ca: Some(world.stack.nats.ca_path()),
        ..hafleet_runtime::NatsArgs::for_url(url)
    };
    let err = anonymous.connect().await.expect_err("a client without a key was taken");
    assert!(format!("{err:#}").contains("cannot connect to NATS"), "{err:#}");

    // No seed on any command line.
    let seeds: Vec<String> = ["hafleet-watcher", "hafleet-renderer", "hafleet-applier-edge"]
        .into_iter()
        .map(|u| world.stack.nats.seed_of(u))
        .collect::<Result<_>>()?;
    for c in [Component::Watcher, Component::Renderer, Component::Applier] {
        let pid = world.stack.pid(c).context("running")?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
        let cmdline = String::from_utf8_lossy(&cmdline);
        for seed in &seeds {
            assert!(!cmdline.contains(seed.as_str()), "{c:?}'s command line holds a seed");
        }
    }

    // `--help` with a password in the environment's URL does not show it.
    for (c, args) in [
        ("hafleet-watcher", &["--help"][..]),
        ("hafleet-renderer", &["run", "--help"]),
        ("hafleet", &["history", "list", "--help"]),
        ("hafleet", &["--help"]),
        ("hafleet-applier", &["--help"]),
    ] {
        let out = std::process::Command::new(hafleet_tests::bin_path(c))
            .args(args)
            .env("HAFLEET_NATS_URL", "nats://hafleet:hunter2-secret@nats.example:4222")
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("--nats-creds") && text.contains("--nats-ca"), "{text}");
        assert!(!text.contains("hunter2-secret"), "{c} --help shows the URL's password");
    }

    // Logs written to a file (a pipe or journald alike) carry no colour codes.
    for c in [Component::Watcher, Component::Renderer, Component::Applier] {
        let log = std::fs::read_to_string(world.stack.log_path(c))?;
        assert!(log.contains(" INFO ") && !log.contains('\x1b'), "{c:?} logged colour codes");
    }

    // A CA of someone else's: the renderer says what is wrong and stops.
    let other = hafleet_tests::tls::Ca::new("not the NATS server's CA")?;
    let other_ca = world.stack.dir().join("other-ca.pem");
    std::fs::write(&other_ca, other.cert_pem()?)?;
    let other_ca = other_ca.display().to_string();
    world.stack.restart_with(Component::Renderer, &[("HAFLEET_NATS_CA", other_ca.as_str())])?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while world.stack.is_running(Component::Renderer) {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the renderer still waits");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(world.stack.log_path(Component::Renderer))?;
    let last = log.lines().rev().find(|l| l.contains("error")).unwrap_or_default();
    assert!(
        last.contains("cannot connect to NATS at tls://127.0.0.1:") && last.contains("--nats-ca"),
        "{last}"
    );
    Ok(())
}

/// Whether the API server lets the watcher's ServiceAccount `verb` Secrets in `namespace`
/// (`None`: every namespace), named `name` when given: a SubjectAccessReview, the API server's
/// own authorizer answering.
async fn watcher_may(
    client: &kube::Client,
    verb: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> Result<bool> {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let review: SubjectAccessReview = serde_json::from_value(serde_json::json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {
            "user": hafleet_tests::kube_env::WATCHER_USER,
            "groups": ["system:serviceaccounts", "system:serviceaccounts:hafleet"],
            "resourceAttributes": {"verb": verb, "resource": "secrets", "namespace": namespace,
                                   "name": name}
        }
    }))?;
    let api: kube::Api<SubjectAccessReview> = kube::Api::all(client.clone());
    let answer = api.create(&Default::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// With HTTPS on as the manifests set it up, the watcher's ServiceAccount may read the Secrets
/// of the namespaces it serves certificates from, and not the renderer's signing key, the
/// appliers' SSH keys or the NATS keys in namespace `hafleet`, nor list Secrets cluster-wide;
/// and the watcher serves HTTPS with just that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_cannot_read_the_keys_that_sign_versions_or_reach_hosts() -> Result<()> {
    let mut world = World::with_hosts(1).await?;
    hafleet_tests::tls::tls_on(&mut world.stack, &[]).await?;
    let client = world.stack.kube.client().await?;
    for secret in ["hafleet-signing-key", "hafleet-applier-edge-ssh", "hafleet-nats-renderer"] {
        for verb in ["get", "watch"] {
            let may = watcher_may(&client, verb, Some("hafleet"), Some(secret)).await?;
            assert!(!may, "the watcher may {verb} Secret hafleet/{secret}");
        }
    }
    assert!(!watcher_may(&client, "list", None, None).await?, "it may list every Secret");
    assert!(!watcher_may(&client, "list", Some("hafleet"), None).await?);
    // What it needs: the TLS Secrets of `default`.
    assert!(watcher_may(&client, "list", Some("default"), None).await?);
    assert!(watcher_may(&client, "get", Some("default"), Some("shop-tls")).await?);
    // And with only that, a certificate of `default` is served.
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), "default");
    let (crt, key) = hafleet_tests::tls::self_signed(&["shop.example.com"])?;
    let secret = hafleet_tests::tls::tls_secret("shop-tls", &crt, &key)?;
    secrets.create(&Default::default(), &secret).await?;
    let ingress: k8s_openapi::api::networking::v1::Ingress =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "shop", "annotations": {"hafleet.io/fleet": "edge"}},
            "spec": {"ingressClassName": "hafleet",
                     "tls": [{"hosts": ["shop.example.com"], "secretName": "shop-tls"}],
                     "rules": [{"host": "shop.example.com", "http": {"paths": [{"path": "/",
                       "pathType": "Prefix", "backend": {"service": {"name": "web",
                       "port": {"number": 80}}}}]}}]}
        }))?;
    world.ingresses.create(&Default::default(), &ingress).await?;
    let want = hafleet_tests::tls::fingerprint(&crt)?;
    let addr = world.stack.hosts[0].https_addr();
    hafleet_tests::eventually(
        crate::CONVERGE,
        "shop.example.com served with its certificate",
        || {
            let want = want.clone();
            async move {
                let got = hafleet_tests::tls::served_fingerprint(addr, "shop.example.com").await?;
                anyhow::ensure!(got.as_deref() == Some(want.as_str()), "{got:?}");
                Ok(())
            }
        },
    )
    .await
}

/// A host that answers without end (here: its HAProxy prints 100 MB when asked to check a
/// config, as a compromised host could) is cut off at the applier's cap and reported failed,
/// the applier's memory bounded and the rest of the fleet served; a host that may not be the
/// canary (`canary = false`) is never the first to take a version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_answers_without_end_is_cut_off_and_the_fleet_goes_on() -> Result<()> {
    let mut world = World::start().await?;
    world.route("before", "before.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "before.example.com", "/", 200, "web@").await?;

    // lb-1 (first in the inventory) may not be the canary, and its checks print 100 MB.
    let spewer = world.stack.hosts[0].dir().join("haproxy-that-talks");
    let real = world.stack.hosts[0].haproxy_bin().display().to_string();
    std::fs::write(
        &spewer,
        format!(
            "#!/bin/sh\nif [ \"$1\" = -c ]; then head -c 104857600 /dev/zero | tr '\\0' x; fi\n\
             exec {real} \"$@\"\n"
        ),
    )?;
    std::fs::set_permissions(&spewer, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let inventory = std::fs::read_to_string(world.stack.inventory_path())?;
    let mut hosts: Vec<String> = inventory.split("[[hosts]]").map(str::to_owned).collect();
    // [0] is what comes before the first host; [1] is lb-1's.
    let talking = format!("haproxy_bin = \"{}\"", spewer.display());
    hosts[1] = hosts[1].replace(&format!("haproxy_bin = \"{real}\""), &talking);
    hosts[1].push_str("canary = false\n");
    std::fs::write(world.stack.inventory_path(), hosts.join("[[hosts]]"))?;
    world.stack.restart_with(Component::Applier, &[])?;

    // A new route: its maps are checked with `haproxy -c` on each host.
    let before = world.stack.latest_version().await?.context("a version")?.version;
    world.route("after", "after.example.com", "/", "api").await?;
    let stack = &world.stack;
    let version =
        hafleet_tests::eventually(crate::CONVERGE, "the version with the route", || async move {
            let v = stack.latest_version().await?.context("a version")?.version;
            anyhow::ensure!(v > before, "still version {v}");
            Ok(v)
        })
        .await?;
    let lb1 = world.report("lb-1", version).await?;
    let said = format!("{:?}", lb1.outcome);
    assert!(said.contains("cut off"), "{said}");
    // lb-2 was the canary (lb-1 may not be): it serves the new route; the applier runs on.
    let lb2 = world.report("lb-2", version).await?;
    assert_eq!(lb2.outcome, hafleet_proto::ApplyOutcome::Applied);
    assert!(lb2.finished_unix_ms <= lb1.finished_unix_ms, "lb-1 went first");
    crate::expect_on(&world.stack.hosts[1..], &world.stack, "after.example.com", "/", 200, "api@")
        .await?;
    assert!(world.stack.is_running(Component::Applier), "the applier went down");
    // The applier's memory stayed far below what the host printed.
    let pid = world.stack.pid(Component::Applier).context("running")?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let peak_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmHWM")?;
    assert!(peak_kb < 100 * 1024, "the applier's peak memory: {peak_kb} kB");
    Ok(())
}

/// Consumers are their owners': the watcher's NATS user can create ordered readers but not a
/// named consumer (neither through the named subject nor with a durable name through the
/// ephemeral one), so it cannot move an applier's; and an applier whose consumer was changed
/// by hand (an operator with every right) puts it right at its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_consumer_is_its_owner_s_and_is_put_right() -> Result<()> {
    let mut world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let consumer = "hafleet-applier-edge";
    let config = serde_json::json!({"durable_name": consumer, "filter_subject": "hafleet.configs.edge",
        "ack_policy": "explicit", "deliver_policy": "new", "max_ack_pending": 1});
    let watcher = world.stack.nats.client_as("hafleet-watcher").await?;
    for subject in [
        format!("$JS.API.CONSUMER.CREATE.HAFLEET_CONFIGS.{consumer}.hafleet.configs.edge"),
        "$JS.API.CONSUMER.CREATE.HAFLEET_CONFIGS".to_owned(),
        format!("$JS.API.CONSUMER.DURABLE.CREATE.HAFLEET_CONFIGS.{consumer}"),
    ] {
        let body = serde_json::json!({"stream_name": "HAFLEET_CONFIGS", "config": config,
                                      "action": "update"});
        let asked = watcher.request(subject.clone(), serde_json::to_vec(&body)?.into());
        let answer = tokio::time::timeout(Duration::from_secs(5), asked).await;
        let refused = match answer {
            Ok(Ok(m)) => String::from_utf8_lossy(&m.payload).contains("\"error\""),
            _ => true, // no permission: the request goes nowhere
        };
        assert!(refused, "the watcher changed the applier's consumer through {subject}");
    }
    let admin = world.stack.nats.bus().await?;
    let stream = admin.js.get_stream("HAFLEET_CONFIGS").await?;
    let info = stream.consumer_info(consumer).await?;
    assert_eq!(info.config.max_ack_pending, 100, "{:?}", info.config);

    // Changed by hand: the applier puts it right when it starts.
    let mut changed = info.config.clone();
    changed.max_ack_pending = 1;
    changed.ack_wait = Duration::from_secs(5);
    stream.update_consumer(changed).await?;
    assert_eq!(stream.consumer_info(consumer).await?.config.max_ack_pending, 1);
    world.stack.restart_with(Component::Applier, &[])?;
    let stream = &stream;
    hafleet_tests::eventually(crate::CONVERGE, "the applier's consumer put right", || async move {
        let c = stream.clone().consumer_info(consumer).await?.config;
        anyhow::ensure!(c.max_ack_pending == 100 && c.ack_wait == Duration::from_secs(60), "{c:?}");
        Ok(())
    })
    .await?;
    let log = std::fs::read_to_string(world.stack.log_path(Component::Applier))?;
    assert!(log.contains("the fleet's consumer was changed; putting it right"), "{log}");
    // And it still serves.
    world.route("after", "after.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "after.example.com", "/", 200, "web@").await
}

/// A renderer started on an empty store while the routes stream no longer holds the events
/// that made its fleet (gone with retention, here purged) publishes nothing from what is left:
/// it asks the watchers to restate every Ingress, and its first version after that holds them
/// all, where it used to publish a fleet without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renderer_behind_a_gapped_stream_publishes_nothing_until_everything_is_restated()
-> Result<()> {
    let mut world = World::start().await?;
    let hosts = ["a.example.com", "b.example.com", "c.example.com"];
    for (i, host) in hosts.iter().enumerate() {
        world.route(&format!("r{i}"), host, "/", "web").await?;
    }
    for host in hosts {
        expect_everywhere(&world.stack, host, "/", 200, "web@").await?;
    }
    let before = world.stack.latest_version().await?.context("a version")?.version;

    // The renderer's store is lost, and the stream no longer holds what it never applied.
    world.stack.kill(Component::Renderer);
    std::fs::remove_dir_all(world.stack.dir().join("renderer-data"))?;
    let admin = world.stack.nats.bus().await?;
    admin.js.get_stream(hafleet_proto::ROUTES_STREAM).await?.purge().await?;
    if let Ok(checkpoints) = admin.js.get_stream("OBJ_hafleet-checkpoints").await {
        checkpoints.purge().await?;
    }
    world.stack.restart_with(Component::Renderer, &[])?;

    // The watcher restates everything when asked; the next version holds every Ingress, and
    // no version of the new renderer ever lacked one.
    let stack = &world.stack;
    let newer = hafleet_tests::eventually(
        crate::CONVERGE,
        "a version after the restatement",
        || async move {
            let v = stack.latest_version().await?.context("a version")?;
            anyhow::ensure!(v.version > before, "still version {}", v.version);
            Ok(v.version)
        },
    )
    .await?;
    let log = std::fs::read_to_string(world.stack.log_path(Component::Renderer))?;
    assert!(log.contains("publishing nothing until a watcher restates every Ingress"), "{log}");
    let wlog = std::fs::read_to_string(world.stack.log_path(Component::Watcher))?;
    assert!(wlog.contains("publishing every Ingress again"), "{wlog}");
    let bus = world.stack.nats.bus().await?;
    for v in world.stack.versions().await? {
        if v.version <= before {
            continue;
        }
        let number = v.version;
        let v = bus.fetch_bundle(v).await?;
        let hafleet_proto::Body::Inline { bundle } = &v.body else { anyhow::bail!("not fetched") };
        let map = bundle.maps.iter().find(|m| m.name.as_str().starts_with("hosts-"));
        let map = map.map(|m| m.content.as_str()).unwrap_or_default();
        for host in hosts {
            assert!(map.contains(host), "version {number} lacks {host}:\n{map}");
        }
    }
    assert!(newer > before);
    for host in hosts {
        expect_everywhere(&world.stack, host, "/", 200, "web@").await?;
    }
    Ok(())
}

/// Reads for every fleet, changes for some: the shipped `HAFLEET_OPERATOR_READER` lists a
/// fleet's history but cannot roll it back (a rollback goes on `hafleet.history.<fleet>.change`,
/// which it is not granted); an operator printed by `nats-permissions --operator NAME
/// --may-change core` cannot either, one with `--may-change edge` can; and the renderer answers
/// no change sent on the read subject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_may_read_every_fleet_s_history_and_change_only_where_granted() -> Result<()> {
    let world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    world.route("more", "more.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "more.example.com", "/", 200, "web@").await?;
    let run = async |user: &str, args: &[&str]| {
        let args = [args, &["--fleet", "edge", "--timeout", "5s"]].concat();
        crate::history::cli_as(&world, user, &args).await.map(|(ok, _, err)| (ok, err))
    };
    let before = world.stack.latest_version().await?.context("a version")?.version;
    for user in ["hafleet-operator-reader", "hafleet-operator-core-only"] {
        let (listed, why) = run(user, &["history", "list"]).await?;
        assert!(listed, "{user}: {why}");
        let (rolled, _) = run(user, &["rollback", "1"]).await?;
        assert!(!rolled, "{user} rolled fleet edge back");
    }
    assert_eq!(world.stack.latest_version().await?.context("a version")?.version, before);
    // A change on the read subject (an older CLI's way) is refused by the renderer itself.
    let client = world.stack.nats.client_as("hafleet-operator").await?;
    let asked = hafleet_proto::HistoryRequest::Rollback { version: 1 };
    let answer = client.request("hafleet.history.edge", asked.encode().into()).await?;
    let text = String::from_utf8_lossy(&answer.payload);
    assert!(text.contains("hafleet.history.<fleet>.change"), "{text}");
    assert_eq!(world.stack.latest_version().await?.context("a version")?.version, before);
    // The operator of fleet edge may, and may resume it.
    let (rolled, why) = run("hafleet-operator-edge-only", &["rollback", "1"]).await?;
    assert!(rolled, "{why}");
    let (resumed, why) = run("hafleet-operator-edge-only", &["resume"]).await?;
    assert!(resumed, "{why}");
    Ok(())
}

/// The mass-deletion guard covers a rebuilt state: a renderer whose store was lost, behind a
/// gapped stream, whose watchers then restate far fewer Ingresses than its fleet's hosts serve
/// (an API server restored from an empty backup, say) publishes none of it. The fleet is
/// pinned to what its hosts run, and `resume` publishes the state once an operator has looked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_renderer_holds_a_first_version_that_would_withdraw_most_of_the_fleet()
-> Result<()> {
    let mut world = World::start().await?;
    let hosts = ["a.example.com", "b.example.com", "c.example.com", "d.example.com"];
    for (i, host) in hosts.iter().enumerate() {
        world.route(&format!("r{i}"), host, "/", "web").await?;
    }
    for host in hosts {
        expect_everywhere(&world.stack, host, "/", 200, "web@").await?;
    }
    let before = world.stack.latest_version().await?.context("a version")?;
    assert_eq!(before.routes, Some(4), "the version says how many routes it serves");

    world.stack.kill(Component::Renderer);
    std::fs::remove_dir_all(world.stack.dir().join("renderer-data"))?;
    let admin = world.stack.nats.bus().await?;
    admin.js.get_stream(hafleet_proto::ROUTES_STREAM).await?.purge().await?;
    if let Ok(checkpoints) = admin.js.get_stream("OBJ_hafleet-checkpoints").await {
        checkpoints.purge().await?;
    }
    for i in 1..4 {
        world.ingresses.delete(&format!("r{i}"), &Default::default()).await?;
    }
    world.stack.restart_with(Component::Renderer, &[("HAFLEET_SWEEP_GUARD_MIN_ROUTES", "2")])?;

    let log = world.stack.log_path(Component::Renderer);
    hafleet_tests::eventually(crate::CONVERGE, "the rebuilt state held", || async {
        let text = std::fs::read_to_string(&log)?;
        anyhow::ensure!(text.contains("rebuilt state would withdraw too much"), "not yet");
        Ok(())
    })
    .await?;
    assert_eq!(world.stack.latest_version().await?.context("a version")?.version, before.version);
    for host in hosts {
        expect_everywhere(&world.stack, host, "/", 200, "web@").await?;
    }
    let listed = crate::history::ok(&world, &["history", "list"]).await?;
    assert!(listed.contains(&format!("fleet pinned to version {}", before.version)), "{listed}");

    let resumed = crate::history::ok(&world, &["resume"]).await?;
    assert!(resumed.contains("resumed"), "{resumed}");
    expect_everywhere(&world.stack, "b.example.com", "/", 404, "").await?;
    expect_everywhere(&world.stack, "a.example.com", "/", 200, "web@").await?;
    let after = world.stack.latest_version().await?.context("a version")?;
    assert_eq!((after.routes, after.version > before.version), (Some(1), true));
    Ok(())
}

/// The dead-letter tool: `deadletter list` and `show` read what the renderer parked (the
/// reader may), and `republish` asks the renderer to publish a parked message again into the
/// routes stream once it can read it (here one parked as an older renderer would have, from a
/// newer watcher's event): its routes go live. The renderer refuses one it still cannot read
/// and a sequence with no message; operators granted some fleets' changes only cannot ask.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_route_messages_are_listed_shown_and_republished_once_readable() -> Result<()> {
    use hafleet_proto::{HttpHost, ObjectName, RouteChange, RouteMessage};
    let world = World::start().await?;
    world.route("a", "a.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "a.example.com", "/", 200, "web@").await?;

    // The watcher's event for `a`, made into one for an Ingress `parked` at p.example.com.
    let js = async_nats::jetstream::new(world.stack.nats.client().await?);
    let routes = js.get_stream(hafleet_proto::ROUTES_STREAM).await?;
    let newest = routes.get_last_raw_message_by_subject("hafleet.routes.edge").await?;
    let RouteMessage::Event(mut event) = RouteMessage::decode(&newest.payload)? else {
        anyhow::bail!("the newest message of fleet edge is no event");
    };
    assert_eq!(event.ingress.name.as_str(), "a");
    event.ingress.name = ObjectName::new("parked")?;
    let RouteChange::Upsert { routes: r, .. } = &mut event.change else {
        anyhow::bail!("not an upsert: {:?}", event.change);
    };
    r.iter_mut().for_each(|r| r.host = Some(HttpHost::new("p.example.com").expect("a host")));
    let readable = serde_json::to_vec(&RouteMessage::Event(event))?;
    // First one this renderer cannot read (parked by it), then the readable one, parked as an
    // older renderer would have parked it.
    let future = serde_json::json!({"type": "event", "schema": 99, "fleet": "edge",
                                    "change": {"op": "rename"}});
    js.publish("hafleet.routes.edge", serde_json::to_vec(&future)?.into()).await?.await?;
    let parked = async || anyhow::Ok(js.get_stream(hafleet_proto::DEADLETTER_STREAM).await?);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while parked().await.map_or(0, |s| s.cached_info().state.messages) == 0 {
        anyhow::ensure!(std::time::Instant::now() < deadline, "nothing parked");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let park = async |payload: Vec<u8>, source: u64| -> Result<()> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(hafleet_proto::ERROR_HEADER, "schema 9 is newer than this build reads");
        headers.insert(hafleet_proto::SOURCE_SEQ_HEADER, source.to_string().as_str());
        let subject = hafleet_proto::ROUTES_DEADLETTER_SUBJECT;
        js.publish_with_headers(subject, headers, payload.into()).await?.await?;
        Ok(())
    };
    park(readable, newest.sequence).await?;
    // And `a`'s own event, as if parked before the one the renderer applied: stale.
    park(newest.payload.to_vec(), newest.sequence - 1).await?;

    let cli = async |user: &str, args: &[&str]| {
        let args = [args, &["--timeout", "5s"]].concat();
        crate::history::cli_as(&world, user, &args).await
    };
    let (ok, listed, err) =
        cli("hafleet-operator-reader", &["deadletter", "list", "-o", "json"]).await?;
    assert!(ok, "{err}");
    let listed: serde_json::Value = serde_json::from_str(&listed)?;
    let listed = listed.as_array().context("an array")?;
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(listed[0]["error"].as_str().is_some_and(|e| e.contains("schema 99")), "{listed:?}");
    assert_eq!(listed[1]["source_seq"], newest.sequence, "{listed:?}");
    let (unreadable, readable) = (listed[0]["seq"].to_string(), listed[1]["seq"].to_string());
    let (ok, shown, err) =
        cli("hafleet-operator-reader", &["deadletter", "show", &readable]).await?;
    assert!(
        ok && shown.contains("p.example.com") && shown.contains("Hafleet-Error"),
        "{shown}{err}"
    );

    // Who may not, and what the renderer refuses.
    for user in ["hafleet-operator-reader", "hafleet-operator-edge-only"] {
        let (ok, _, _) = cli(user, &["deadletter", "republish", &readable]).await?;
        assert!(!ok, "{user} republished a parked message");
    }
    let (ok, _, err) = cli("hafleet-operator", &["deadletter", "republish", &unreadable]).await?;
    assert!(!ok && err.contains("still cannot read"), "{err}");
    let stale = listed[2]["seq"].to_string();
    let (ok, _, err) = cli("hafleet-operator", &["deadletter", "republish", &stale]).await?;
    assert!(!ok && err.contains("a newer event of"), "{err}");
    let (ok, _, err) = cli("hafleet-operator", &["deadletter", "republish", "999"]).await?;
    assert!(!ok && err.contains("no such parked message"), "{err}");
    expect_everywhere(&world.stack, "p.example.com", "/", 404, "").await?;

    let (ok, out, err) = cli("hafleet-operator", &["deadletter", "republish", &readable]).await?;
    assert!(ok && out.contains("republished at routes sequence"), "{out}{err}");
    expect_everywhere(&world.stack, "p.example.com", "/", 200, "web@").await?;
    let republished = routes.get_last_raw_message_by_subject("hafleet.routes._republish").await?;
    let seq = republished.headers.get(hafleet_proto::DEADLETTER_SEQ_HEADER).map(|v| v.to_string());
    assert_eq!(seq.as_deref(), Some(readable.as_str()));
    Ok(())
}

/// Mutual TLS: against a NATS server that asks every client for a certificate of its CA, the
/// operator's CLI connects with `--nats-cert`/`--nats-key` (here through `HAFLEET_NATS_CERT`
/// and `HAFLEET_NATS_KEY`), is turned away without them, and names a key file it cannot read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_asking_for_client_certificates_takes_nats_cert_and_key() -> Result<()> {
    let nats = hafleet_tests::nats::NatsServer::start_requiring_client_certs().await?;
    let env = nats.env_for("hafleet-operator");
    let run = async |drop: &[&str], set: &[(&str, &str)]| {
        let out = tokio::process::Command::new(hafleet_tests::bin_path("hafleet"))
            .args(["deadletter", "list"])
            .env_clear()
            .envs(env.iter().filter(|(k, _)| !drop.contains(k)).cloned())
            .envs(set.iter().copied())
            .env("NO_COLOR", "1")
            .output()
            .await?;
        let text = String::from_utf8_lossy(&out.stderr).into_owned();
        anyhow::Ok((out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), text))
    };
    let (ok, out, err) = run(&[], &[]).await?;
    assert!(ok && out.contains("no parked messages"), "{out}{err}");
    let (ok, _, err) = run(&["HAFLEET_NATS_CERT", "HAFLEET_NATS_KEY"], &[]).await?;
    assert!(!ok, "connected without a client certificate: {err}");
    assert!(err.contains("give --nats-cert and --nats-key"), "{err}");
    let missing = nats.ca_path().with_file_name("no-such.key");
    let missing = missing.display().to_string();
    let (ok, _, err) = run(&[], &[("HAFLEET_NATS_KEY", missing.as_str())]).await?;
    assert!(!ok && err.contains("no-such.key"), "{err}");
    Ok(())
}
