//! HTTPS (issue 12), as far as it is built: the watcher reads the `kubernetes.io/tls` Secrets
//! that fleet Ingresses name (with the TLS RBAC component, and only those), checks each
//! certificate, and seals its key to the fleet; bad Secrets get a Warning Event naming the
//! Secret and why.

use crate::{CONVERGE, World};
use anyhow::{Context as _, Result};
use hafleet_applier::core::identity::FleetIdentity;
use hafleet_proto::{RouteChange, RouteMessage};
use hafleet_tests::eventually;
use hafleet_tests::fixtures::IngressBuilder;
use hafleet_tests::stack::Component;
use hafleet_tests::tls::{
    fingerprint, https_get_as, self_signed, served_fingerprint, tls_on, tls_secret, write_identity,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, PostParams};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn tls_ingress(name: &str, host: &str, secret: &str) -> Result<Ingress> {
    Ok(IngressBuilder::new(name).fleet("edge").route(host, "/", "web").tls(&[host], secret).build())
}

/// The base64 body lines of a PEM key: what would show if the key travelled in clear.
fn key_lines(key_pem: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(key_pem)
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() > 20)
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_seals_each_certificate_to_its_fleet_and_warns_about_bad_secrets() -> Result<()>
{
    let mut world = World::with_hosts(1).await?;
    hafleet_tests::tls::allow_tls_namespaces(&world.stack, &["default"]).await?;
    let edge = FleetIdentity::generate();
    let seal_to = format!("edge={}", edge.recipient());
    // Every message on NATS from here on, as an observer with every right sees it.
    let captured: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let mut sub = world.stack.nats.client().await?.subscribe("hafleet.>").await?;
    {
        let captured = captured.clone();
        tokio::spawn(async move {
            while let Some(m) = futures::StreamExt::next(&mut sub).await {
                captured.lock().unwrap().push(m.payload.to_vec());
            }
        });
    }
    world.stack.restart_with(
        Component::Watcher,
        &[("HAFLEET_SEAL_TO", &seal_to), ("HAFLEET_TLS_NAMESPACES", "default")],
    )?;

    let client = world.stack.kube.client().await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let (crt, key) = self_signed(&["shop.example.com"])?;
    let (_, other_key) = self_signed(&["shop.example.com"])?;
    secrets.create(&PostParams::default(), &tls_secret("shop-tls", &crt, &key)?).await?;
    secrets.create(&PostParams::default(), &tls_secret("mismatched", &crt, &other_key)?).await?;
    // A Secret of that name exists, but in another namespace: never used.
    world.stack.kube.ensure_namespace("elsewhere").await?;
    let theirs: Api<Secret> = Api::namespaced(client.clone(), "elsewhere");
    theirs.create(&PostParams::default(), &tls_secret("theirs", &crt, &key)?).await?;

    let ingresses = &world.ingresses;
    ingresses
        .create(&PostParams::default(), &tls_ingress("shop", "shop.example.com", "shop-tls")?)
        .await?;
    ingresses
        .create(&PostParams::default(), &tls_ingress("bad", "bad.example.com", "mismatched")?)
        .await?;
    ingresses
        .create(&PostParams::default(), &tls_ingress("stolen", "stolen.example.com", "theirs")?)
        .await?;

    // The route event of `shop` carries its certificate, the key sealed to edge.
    let shop_cert = |fingerprint: String| {
        let captured = captured.clone();
        eventually(CONVERGE, "shop's route event with the certificate", move || {
            let (captured, fingerprint) = (captured.clone(), fingerprint.clone());
            async move {
                let msgs = captured.lock().unwrap().clone();
                msgs.iter()
                    .filter_map(|m| match RouteMessage::decode(m) {
                        Ok(RouteMessage::Event(e)) if e.ingress.name.as_str() == "shop" => Some(e),
                        _ => None,
                    })
                    .find_map(|e| match e.change {
                        RouteChange::Upsert { tls, .. } => tls
                            .into_iter()
                            .find_map(|t| t.cert.filter(|c| c.fingerprint == fingerprint)),
                        RouteChange::Delete => None,
                    })
                    .ok_or_else(|| anyhow::anyhow!("not yet"))
            }
        })
    };
    let cert = shop_cert(fingerprint(&crt)?).await?;
    cert.check()?;
    assert_eq!(cert.names.iter().map(|n| n.as_str()).collect::<Vec<_>>(), ["shop.example.com"]);
    let file = edge.cert_file(&cert)?;
    for line in key_lines(&key) {
        assert!(file.contains(&line), "the edge identity opens the key");
    }
    assert!(FleetIdentity::generate().cert_file(&cert).is_err(), "another identity cannot");

    for (name, why) in [
        ("bad", "Secret default/mismatched: tls.key does not match the certificate"),
        ("stolen", "Secret default/theirs: no Secret of type kubernetes.io/tls"),
    ] {
        let event =
            crate::refusals::warning_event_in(&world.stack, "default", name, "InvalidTLSSecret")
                .await?;
        let note = event.note.unwrap_or_default();
        assert!(note.contains(why), "{note}");
    }

    // A rotation, as cert-manager does it (the Secret's data replaced), publishes the new
    // certificate, its new key sealed too.
    let (crt2, key2) = self_signed(&["shop.example.com"])?;
    let rotated = tls_secret("shop-tls", &crt2, &key2)?;
    let patch = kube::api::Patch::Merge(json!({"data": rotated.data}));
    secrets.patch("shop-tls", &kube::api::PatchParams::default(), &patch).await?;
    let new = shop_cert(fingerprint(&crt2)?).await?;
    for line in key_lines(&key2) {
        assert!(edge.cert_file(&new)?.contains(&line), "the rotated key opens");
    }

    // Nothing on NATS, and nothing in the watcher's log, ever carried a private key in clear.
    let msgs = captured.lock().unwrap().clone();
    assert!(msgs.len() > 3, "the capture saw the traffic");
    let log = std::fs::read_to_string(world.stack.log_path(Component::Watcher))?;
    let texts = msgs.iter().map(|m| String::from_utf8_lossy(m).into_owned()).chain([log]);
    for text in texts {
        assert!(!text.contains("PRIVATE KEY"), "a key in clear: {text}");
        for keys in [&key, &other_key, &key2] {
            for line in key_lines(keys) {
                assert!(!text.contains(line.as_str()), "a key's line in clear: {text}");
            }
        }
    }
    Ok(())
}

/// GET / over HTTPS for `host`, the server's certificate checked against `ca` and `host`.
async fn https_get(addr: std::net::SocketAddr, host: &str, ca: &std::path::Path) -> Result<String> {
    https_get_as(addr, host, host, ca).await
}

/// Waits until every host serves `sni` with the certificate `want` (`None`: refuses it).
async fn expect_cert_everywhere(
    stack: &hafleet_tests::stack::Stack,
    sni: &str,
    want: Option<&str>,
) -> Result<()> {
    for h in &stack.hosts {
        let addr = h.https_addr();
        let what = format!("{} serves {sni} with {want:?}", h.name());
        eventually(CONVERGE, &what, || async move {
            let got = served_fingerprint(addr, sni).await?;
            anyhow::ensure!(got.as_deref() == want, "got {got:?}");
            Ok(())
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_host_serves_each_tls_host_its_own_certificate_by_sni() -> Result<()> {
    let mut world = World::start().await?;
    let stack_dir = world.stack.dir().to_owned();
    let edge = tls_on(&mut world.stack, &[]).await?;

    let secrets: Api<Secret> = Api::namespaced(world.stack.kube.client().await?, "default");
    let (shop_crt, shop_key) = self_signed(&["shop.example.com"])?;
    let (wild_crt, wild_key) = self_signed(&["*.example.org"])?;
    secrets.create(&PostParams::default(), &tls_secret("shop-tls", &shop_crt, &shop_key)?).await?;
    secrets.create(&PostParams::default(), &tls_secret("wild-tls", &wild_crt, &wild_key)?).await?;
    let ingresses = &world.ingresses;
    ingresses
        .create(&PostParams::default(), &tls_ingress("shop", "shop.example.com", "shop-tls")?)
        .await?;
    ingresses
        .create(&PostParams::default(), &tls_ingress("wild", "*.example.org", "wild-tls")?)
        .await?;
    world.route("plain", "plain.example.com", "/", "api").await?;
    // An exact host under the wildcard, routed without a certificate: the wildcard's
    // certificate must not answer for it.
    world.route("under", "b.example.org", "/", "api").await?;

    let shop_fp = fingerprint(&shop_crt)?;
    let wild_fp = fingerprint(&wild_crt)?;
    expect_cert_everywhere(&world.stack, "shop.example.com", Some(&shop_fp)).await?;
    expect_cert_everywhere(&world.stack, "a.example.org", Some(&wild_fp)).await?;
    // No certificate is listed for it: refused, never another tenant's certificate.
    expect_cert_everywhere(&world.stack, "plain.example.com", None).await?;
    expect_cert_everywhere(&world.stack, "b.example.org", None).await?;

    // A real request over HTTPS, the certificate checked by the client, reaches the Service.
    let ca = stack_dir.join("shop-ca.pem");
    std::fs::write(&ca, &shop_crt)?;
    for h in &world.stack.hosts {
        let answer = https_get(h.https_addr(), "shop.example.com", &ca).await?;
        assert!(answer.starts_with("HTTP/1.1 200") && answer.contains("web@"), "{answer}");
    }
    // Plain HTTP for a host with a certificate is redirected; for one without, it is served.
    crate::expect_everywhere(&world.stack, "shop.example.com", "/", 308, "").await?;
    crate::expect_everywhere(&world.stack, "plain.example.com", "/", 200, "api@").await?;
    crate::expect_everywhere(&world.stack, "a.example.org", "/", 308, "").await?;
    crate::expect_everywhere(&world.stack, "b.example.org", "/", 200, "api@").await?;
    // Over a connection set up for one name, a request for another host is refused (421).
    let wild_ca = stack_dir.join("wild-ca.pem");
    std::fs::write(&wild_ca, &wild_crt)?;
    let addr = world.stack.hosts[0].https_addr();
    let answer = https_get_as(addr, "a.example.org", "b.example.org", &wild_ca).await?;
    assert!(answer.starts_with("HTTP/1.1 421"), "{answer}");
    for h in &world.stack.hosts {
        let r =
            hafleet_tests::http::http_get_full(h.http_addr(), "shop.example.com", "/x?y=1").await?;
        let location = r.headers.iter().find(|(k, _)| k == "location").map(|(_, v)| v.as_str());
        assert_eq!(location, Some("https://shop.example.com/x?y=1"));
    }

    // On the hosts the key is in a file only its owner reads, in a folder only it enters.
    use std::os::unix::fs::PermissionsExt;
    for h in &world.stack.hosts {
        let certs = h.dir().join(hafleet_proto::tls::CERTS_DIR);
        assert_eq!(std::fs::metadata(&certs)?.permissions().mode() & 0o777, 0o700);
        let files: Vec<_> = std::fs::read_dir(&certs)?.collect::<Result<_, _>>()?;
        assert_eq!(files.len(), 2, "{files:?}");
        for f in files {
            assert_eq!(f.metadata()?.permissions().mode() & 0o777, 0o600, "{:?}", f.path());
        }
    }

    // A rotation (the Secret's data replaced) is served on every host, through the runtime
    // API: the masters' reload counters stay where they were.
    let reloads = |stack: &hafleet_tests::stack::Stack| -> Result<Vec<u32>> {
        stack.hosts.iter().map(|h| h.reload_count()).collect()
    };
    let before = reloads(&world.stack)?;
    let (new_crt, new_key) = self_signed(&["shop.example.com"])?;
    let rotated = tls_secret("shop-tls", &new_crt, &new_key)?;
    let patch = kube::api::Patch::Merge(json!({"data": rotated.data}));
    secrets.patch("shop-tls", &kube::api::PatchParams::default(), &patch).await?;
    let new_fp = fingerprint(&new_crt)?;
    expect_cert_everywhere(&world.stack, "shop.example.com", Some(&new_fp)).await?;
    expect_cert_everywhere(&world.stack, "a.example.org", Some(&wild_fp)).await?;
    assert_eq!(reloads(&world.stack)?, before, "a rotation never reloads");
    // A new TLS host with a certificate of its own goes in the same way.
    let (new_host_crt, new_host_key) = self_signed(&["new.example.com"])?;
    secrets
        .create(&PostParams::default(), &tls_secret("new-tls", &new_host_crt, &new_host_key)?)
        .await?;
    ingresses
        .create(&PostParams::default(), &tls_ingress("new", "new.example.com", "new-tls")?)
        .await?;
    let new_host_fp = fingerprint(&new_host_crt)?;
    expect_cert_everywhere(&world.stack, "new.example.com", Some(&new_host_fp)).await?;
    crate::expect_everywhere(&world.stack, "new.example.com", "/", 308, "").await?;
    assert_eq!(reloads(&world.stack)?, before, "a new certificate never reloads");
    // What the files on disk say is what runs: a reload now changes nothing that is served.
    for h in &world.stack.hosts {
        h.reload()?;
    }
    for (sni, fp) in [
        ("shop.example.com", &new_fp),
        ("a.example.org", &wild_fp),
        ("new.example.com", &new_host_fp),
    ] {
        expect_cert_everywhere(&world.stack, sni, Some(fp)).await?;
    }
    // A default certificate for the fleet: names without one of their own get it (not another
    // tenant's), from the next version on.
    let (default_crt, default_key) = self_signed(&["edge-default.invalid"])?;
    secrets
        .create(&PostParams::default(), &tls_secret("edge-default", &default_crt, &default_key)?)
        .await?;
    world.stack.restart_with(
        Component::Watcher,
        &[
            ("HAFLEET_SEAL_TO", &format!("edge={}", edge.recipient())),
            ("HAFLEET_TLS_NAMESPACES", "default"),
            ("HAFLEET_DEFAULT_CERT", "edge=default/edge-default"),
            // Every certificate here is valid for 30 days: all within 60 days of expiring.
            ("HAFLEET_CERT_EXPIRY_WARNING_DAYS", "60"),
        ],
    )?;
    let default_fp = fingerprint(&default_crt)?;
    for sni in ["plain.example.com", "b.example.org", "unknown.example.net"] {
        expect_cert_everywhere(&world.stack, sni, Some(&default_fp)).await?;
    }
    expect_cert_everywhere(&world.stack, "shop.example.com", Some(&new_fp)).await?;
    expect_cert_everywhere(&world.stack, "a.example.org", Some(&wild_fp)).await?;
    let event =
        crate::refusals::warning_event_in(&world.stack, "default", "shop", "CertificateExpiring")
            .await?;
    let note = event.note.unwrap_or_default();
    assert!(note.contains("Secret default/shop-tls") && note.contains(&new_fp), "{note}");
    // Each host's earliest notAfter is a metric of the applier.
    let (_, metrics) =
        hafleet_tests::http_get(world.stack.health_addr(Component::Applier), "health", "/metrics")
            .await?;
    for h in &world.stack.hosts {
        let line = metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "hafleet_applier_tls_earliest_not_after_seconds{{fleet=\"edge\",host=\"{}\"}}",
                    h.name()
                ))
            })
            .with_context(|| format!("no expiry metric for {}:\n{metrics}", h.name()))?;
        let value: f64 = line.rsplit(' ').next().unwrap_or_default().parse()?;
        let in_days = (value
            - std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs_f64())
            / 86_400.0;
        assert!((29.0..=31.0).contains(&in_days), "{line}");
    }

    // No component logged a key, even with the keys going through the runtime API.
    for c in [Component::Watcher, Component::Renderer, Component::Applier] {
        let log = std::fs::read_to_string(world.stack.log_path(c))?;
        assert!(!log.contains("PRIVATE KEY"), "{c:?} logged a key");
        for key in [&shop_key, &wild_key, &new_key, &new_host_key, &default_key] {
            for line in key_lines(key) {
                assert!(!log.contains(&line), "{c:?} logged a key's line");
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_serves_the_certificate_of_before_a_rotation_and_no_other_fleet_opens_a_key()
-> Result<()> {
    let mut world = World::start().await?;
    tls_on(&mut world.stack, &[]).await?;
    let secrets: Api<Secret> = Api::namespaced(world.stack.kube.client().await?, "default");
    let (old_crt, old_key) = self_signed(&["shop.example.com"])?;
    secrets.create(&PostParams::default(), &tls_secret("shop-tls", &old_crt, &old_key)?).await?;
    world
        .ingresses
        .create(&PostParams::default(), &tls_ingress("shop", "shop.example.com", "shop-tls")?)
        .await?;
    let old_fp = fingerprint(&old_crt)?;
    expect_cert_everywhere(&world.stack, "shop.example.com", Some(&old_fp)).await?;
    let before = world.stack.latest_version().await?.context("a version")?.version;

    let rotate = |name: &'static str| {
        let secrets = secrets.clone();
        async move {
            let (crt, key) = self_signed(&["shop.example.com"])?;
            let data = tls_secret(name, &crt, &key)?.data;
            let patch = kube::api::Patch::Merge(json!({ "data": data }));
            secrets.patch(name, &kube::api::PatchParams::default(), &patch).await?;
            anyhow::Ok((fingerprint(&crt)?, key))
        }
    };
    let (new_fp, new_key) = rotate("shop-tls").await?;
    expect_cert_everywhere(&world.stack, "shop.example.com", Some(&new_fp)).await?;
    let rotated = world.stack.latest_version().await?.context("a version")?;
    // The version's message names its bundle and carries no certificate; the bundles stream
    // holds each certificate once, apart, by id, under the fleet's subjects.
    let js = async_nats::jetstream::new(world.stack.nats.client().await?);
    let fleet = hafleet_proto::FleetName::new("edge")?;
    let raw = js
        .get_stream(hafleet_proto::CONFIGS_STREAM)
        .await?
        .get_last_raw_message_by_subject(&hafleet_proto::configs_subject(&fleet))
        .await?;
    let message = String::from_utf8_lossy(&raw.payload);
    assert!(!message.contains("BEGIN"), "a certificate or key in the version: {message}");
    let published = hafleet_proto::ConfigVersion::decode(&raw.payload)?;
    assert_eq!(published.version, rotated.version);
    assert!(matches!(published.body, hafleet_proto::Body::Stream { .. }), "{message}");
    let bundles = js.get_stream_no_info(hafleet_proto::BUNDLES_STREAM).await?;
    let certs = &rotated.bundle().context("fetched whole")?.certs;
    assert!(certs.iter().any(|c| c.fingerprint == new_fp), "the new certificate is in it");
    for c in certs {
        let m = bundles
            .direct_get_last_for_subject(hafleet_proto::cert_subject(&fleet, &c.id()))
            .await?;
        let stored: hafleet_proto::SealedCert = serde_json::from_slice(&m.payload)?;
        assert_eq!(stored, *c, "{} stored by its id", c.fingerprint);
    }
    let (rotated, rotated_sha) = (rotated.version, rotated.sha256);
    world.report("lb-2", rotated).await?;

    // The history names the certificates by fingerprint, the rotation by host; never a key.
    let diff =
        crate::history::ok(&world, &["history", "diff", &before.to_string(), &rotated.to_string()])
            .await?;
    assert!(diff.contains(&format!("shop.example.com: {old_fp} → {new_fp}")), "{diff}");
    let shown = crate::history::ok(&world, &["history", "show", &before.to_string()]).await?;
    let listed = shown.split("----- certificates").nth(1).context("a certificates section")?;
    assert!(listed.contains(&format!(" sha256:{old_fp} ")), "{shown}");
    assert!(!listed.contains(&new_fp), "only the certificates of that version: {shown}");
    // As JSON the sealed keys are blanked too: a fingerprint, no key in any form.
    let json =
        crate::history::ok(&world, &["history", "show", &before.to_string(), "-o", "json"]).await?;
    let parsed: serde_json::Value = serde_json::from_str(&json)?;
    let certs = parsed.pointer("/version/body/bundle/certs").context("certs in the JSON")?;
    let certs = certs.as_array().context("a list")?;
    assert!(certs.iter().any(|c| c["fingerprint"] == old_fp.as_str()), "{json}");
    assert!(certs.iter().all(|c| c["sealed_key"] == "(sealed, not shown)"), "{json}");
    // Replayed from the routes stream, the fleet's config is the rotated version's,
    // certificates and all; as JSON too, with the sealed keys blanked.
    let now = u64::MAX.to_string();
    let replayed = crate::history::ok(&world, &["replay", "--until", &now]).await?;
    let shown_now = crate::history::ok(&world, &["history", "show", &rotated.to_string()]).await?;
    assert_eq!(replayed, shown_now);
    assert!(replayed.contains(&format!(" sha256:{new_fp} ")), "{replayed}");
    let replayed_json =
        crate::history::ok(&world, &["replay", "--until", &now, "-o", "json"]).await?;
    let parsed: serde_json::Value = serde_json::from_str(&replayed_json)?;
    assert_eq!(parsed["sha256"], rotated_sha.as_str(), "{replayed_json}");
    let certs = parsed.pointer("/bundle/certs").and_then(|c| c.as_array()).context("certs")?;
    assert!(certs.iter().all(|c| c["sealed_key"] == "(sealed, not shown)"), "{replayed_json}");
    for text in [&diff, &shown, &json, &replayed, &replayed_json] {
        assert!(!text.contains("PRIVATE KEY") && !text.contains("AGE ENCRYPTED"), "{text}");
        for line in key_lines(&old_key).iter().chain(&key_lines(&new_key)) {
            assert!(!text.contains(line.as_str()), "a key's line in the history: {text}");
        }
    }

    // Rolled back to the version of before the rotation: every host serves the old
    // certificate again (its sealed key came back with the version), through the runtime API.
    let reloads = |stack: &hafleet_tests::stack::Stack| -> Result<Vec<u32>> {
        stack.hosts.iter().map(|h| h.reload_count()).collect()
    };
    let counted = reloads(&world.stack)?;
    let out = crate::history::ok(&world, &["rollback", &before.to_string()]).await?;
    assert!(out.contains("rolled back"), "{out}");
    expect_cert_everywhere(&world.stack, "shop.example.com", Some(&old_fp)).await?;
    assert_eq!(reloads(&world.stack)?, counted, "a rollback of a rotation never reloads");
    crate::history::ok(&world, &["resume"]).await?;
    expect_cert_everywhere(&world.stack, "shop.example.com", Some(&new_fp)).await?;

    // An applier holding another fleet's identity opens none of edge's keys: the next
    // rotation fails on each host before anything there changes, and says why.
    let blue = FleetIdentity::generate();
    let blue_file = write_identity(world.stack.dir(), "blue.age", &blue)?;
    world.stack.restart_with(
        Component::Applier,
        &[("HAFLEET_TLS_IDENTITY", blue_file.to_str().context("path")?)],
    )?;
    let (refused_fp, _) = rotate("shop-tls").await?;
    let refused = {
        let stack = &world.stack;
        eventually(CONVERGE, "a version with the third certificate", || async {
            match stack.latest_version().await? {
                Some(v)
                    if v.bundle()
                        .is_some_and(|b| b.certs.iter().any(|c| c.fingerprint == refused_fp)) =>
                {
                    Ok(v.version)
                }
                other => anyhow::bail!("newest: {:?}", other.map(|v| v.version)),
            }
        })
        .await?
    };
    // The canary fails and the rollout halts there: the other host is not even tried.
    let report = world.report("lb-1", refused).await?;
    match &report.outcome {
        hafleet_proto::ApplyOutcome::Failed { stage, message, restored } => {
            assert_eq!(*stage, hafleet_proto::ApplyStage::Upload, "{message}");
            assert!(message.contains(&blue.recipient()), "{message}");
            assert!(message.contains("does not open with this fleet's identity"), "{message}");
            assert!(!restored, "nothing on the host was touched: {message}");
        }
        other => panic!("lb-1 applied a version it cannot open: {other:?}"),
    }
    // Given time to go on (a rollout that went past its canary would reach lb-2 in well
    // under a second), lb-2 is still not tried.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let lb2 = world.stack.last_report("lb-2").await?.context("lb-2 has reports")?;
    assert!(lb2.version < refused, "{lb2:?}");
    for h in &world.stack.hosts {
        let served = served_fingerprint(h.https_addr(), "shop.example.com").await?;
        assert_eq!(served.as_deref(), Some(new_fp.as_str()), "{} keeps its certificate", h.name());
    }
    Ok(())
}

/// A certificate file edited or deleted on a host is found by the drift check (with
/// `--tls-identity` the applier knows what each file must hold) and put back, without a
/// reload: HAProxy holds the certificates it loaded, and a later reload or restart reads the
/// files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_file_edited_or_deleted_on_a_host_is_put_back_without_a_reload() -> Result<()>
{
    let mut world = World::start().await?;
    tls_on(&mut world.stack, &[]).await?;
    let identity = world.stack.dir().join(format!("{}.age", world.stack.fleet));
    let identity = identity.to_str().context("identity path")?.to_owned();
    world.stack.restart_with(
        Component::Applier,
        &[("HAFLEET_TLS_IDENTITY", identity.as_str()), ("HAFLEET_DRIFT_CHECK", "1s")],
    )?;
    let secrets: Api<Secret> = Api::namespaced(world.stack.kube.client().await?, "default");
    let (crt, key) = self_signed(&["shop.example.com"])?;
    secrets.create(&PostParams::default(), &tls_secret("shop-tls", &crt, &key)?).await?;
    world
        .ingresses
        .create(&PostParams::default(), &tls_ingress("shop", "shop.example.com", "shop-tls")?)
        .await?;
    let fp = fingerprint(&crt)?;
    expect_cert_everywhere(&world.stack, "shop.example.com", Some(&fp)).await?;
    let version = world.stack.latest_version().await?.context("a version")?.version;
    for h in &world.stack.hosts {
        world.report(h.name(), version).await?;
    }

    let lb2 = &world.stack.hosts[1];
    let dir = lb2.dir().join(hafleet_proto::tls::CERTS_DIR);
    let files: Vec<std::path::PathBuf> =
        std::fs::read_dir(&dir)?.map(|e| e.map(|e| e.path())).collect::<std::io::Result<_>>()?;
    let [file] = files.as_slice() else { anyhow::bail!("one certificate file: {files:?}") };
    let good = std::fs::read(file)?;
    let name = format!(
        "{}/{}",
        hafleet_proto::tls::CERTS_DIR,
        file.file_name().unwrap().to_string_lossy()
    );
    let reloads = lb2.reload_count()?;
    let stack = &world.stack;
    let (good, file) = (&good, file);
    for (how, finding) in [("edited", "was changed"), ("deleted", "is missing")] {
        let before = stack.last_report("lb-2").await?.context("no report")?.finished_unix_ms;
        match how {
            "edited" => std::fs::write(file, b"-----BEGIN CERTIFICATE-----\nnot this\n")?,
            _ => std::fs::remove_file(file)?,
        }
        let repaired = eventually(CONVERGE, &format!("the {how} file put back"), || async move {
            let r = stack.last_report("lb-2").await?.context("no report")?;
            anyhow::ensure!(r.finished_unix_ms > before && r.drift.is_some(), "{r:?}");
            anyhow::ensure!(std::fs::read(file).ok().as_ref() == Some(good), "not put back");
            Ok(r)
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))?;
        let found = repaired.drift.clone().unwrap_or_default();
        assert!(found.contains(&format!("certificate file {name} {finding}")), "{found}");
        assert_eq!(repaired.outcome, hafleet_proto::ApplyOutcome::Applied, "{repaired:?}");
        assert_eq!(repaired.reloads, 0, "{repaired:?}");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(file)?.permissions().mode() & 0o777, 0o600);
    }
    assert_eq!(lb2.reload_count()?, reloads, "no reload on lb-2");
    expect_cert_everywhere(&world.stack, "shop.example.com", Some(&fp)).await?;
    Ok(())
}
