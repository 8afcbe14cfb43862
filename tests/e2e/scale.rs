//! Configs of any size: a bundle larger than a NATS message travels through the fleet's object
//! store, is checked against its sha256 on arrival, and goes live on every host.

use crate::{World, expect_everywhere, render_with};
use anyhow::Result;
use hafleet_proto::{Body, ConfigVersion, FleetName};

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
