//! Configs of any size: a bundle larger than a NATS message travels through the fleet's object
//! store, is checked against its sha256 on arrival, and goes live on every host.

use crate::{CONVERGE, World, expect_everywhere, expect_on, ingress, render_with};
use anyhow::Result;
use hafleet_proto::{Body, ConfigVersion, FleetName};
use hafleet_tests::{eventually, stack::Component};
use kube::api::PostParams;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_8_mb_config_goes_live_on_both_hosts_through_the_object_store() -> Result<()> {
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
    assert!(matches!(published.body, Body::Object { .. }), "{:?}", published.body);
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
    world.route("blog", "blog.example.com", "/", "api").await?;
    expect_everywhere(stack, "blog.example.com", "/", 200, "api@").await?;
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;
    Ok(())
}

/// A fleet whose version cannot be published (here: the object store its large bundle needs
/// is full) is reported and retried, and every other fleet keeps getting its versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_whose_version_cannot_be_published_holds_up_no_other_fleet() -> Result<()> {
    let mut world = World::start().await?;
    let core = world.stack.start_extra_fleet("core", 1).await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let before = world.stack.latest_version().await?.expect("a version").version;

    // The bundle bucket holds at most 1 MiB, and fleet edge's next config is 2.5 MB.
    let js = async_nats::jetstream::new(world.stack.nats.client().await?);
    js.create_object_store(async_nats::jetstream::object_store::Config {
        bucket: hafleet_proto::BUNDLES_BUCKET.into(),
        max_bytes: 1 << 20,
        ..Default::default()
    })
    .await?;
    let marker = "# hafleet-padding";
    let template = format!(
        "{}\n{{% if fleet == \"edge\" %}}{{% for i in range(30000) %}}{marker} {{{{ i }}}} {}\n{{% endfor %}}{{% endif %}}",
        hafleet_renderer::render::BUILTIN_TEMPLATE,
        "x".repeat(60)
    );
    let path = world.stack.dir().join("edge-padded.cfg.j2");
    std::fs::write(&path, template)?;
    world.stack.kill(Component::Renderer);
    world.stack.start_component_with(
        Component::Renderer,
        &[
            ("HAFLEET_TEMPLATE", path.to_str().expect("utf-8 temp path")),
            ("HAFLEET_PUBLISH_RETRY_SECS", "1"),
        ],
    )?;

    // Fleet core gets its routes while edge's version is stuck.
    world
        .ingresses
        .create(
            &PostParams::default(),
            &ingress("intranet", Some("core"), "intra.example.com", "/", "api"),
        )
        .await?;
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

    // Room in the bucket again: the retry publishes edge's version and it goes live.
    let mut bucket = js.get_stream("OBJ_hafleet-bundles").await?;
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
