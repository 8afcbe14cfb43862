//! Config history from an operator's machine: `hafleet history|rollback|resume` run as
//! separate processes, as the `hafleet-operator` NATS user, against a running pipeline.

use crate::{CONVERGE, World, expect_everywhere};
use anyhow::{Context, Result};
use hafleet_tests::bin_path;
use hafleet_tests::{eventually, stack::Component};
use std::time::Duration;
use time::format_description::well_known::Rfc3339;

/// Runs `hafleet <args> --fleet edge` as the operator; returns (success, stdout, stderr).
pub(crate) async fn cli(world: &World, args: &[&str]) -> Result<(bool, String, String)> {
    cli_as(world, "hafleet-operator", &[args, &["--fleet", "edge"]].concat()).await
}

/// `hafleet ARGS` as NATS user `user`: (success, stdout, stderr).
pub(crate) async fn cli_as(
    world: &World,
    user: &str,
    args: &[&str],
) -> Result<(bool, String, String)> {
    let out = tokio::process::Command::new(bin_path("hafleet"))
        .args(args)
        .envs(world.stack.nats.env_for(user))
        .env("NO_COLOR", "1")
        .output()
        .await
        .context("running hafleet")?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

pub(crate) async fn ok(world: &World, args: &[&str]) -> Result<String> {
    let (success, stdout, stderr) = cli(world, args).await?;
    anyhow::ensure!(success, "hafleet {args:?} failed: {stderr}\n{}", world.stack.logs());
    Ok(stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_lists_shows_diffs_explains_rolls_back_and_resumes() -> Result<()> {
    let world = World::start().await?;
    let stack = &world.stack;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;
    let v_shop = world.stack.latest_version().await?.expect("a version").version;
    world.report("lb-2", v_shop).await?;
    world.route("blog", "blog.example.com", "/", "api").await?;
    expect_everywhere(stack, "blog.example.com", "/", 200, "api@").await?;
    let v_blog = world.stack.latest_version().await?.expect("a version").version;
    assert!(v_blog > v_shop);
    world.report("lb-2", v_blog).await?;

    // list: newest first, live on both hosts, with a one-line cause.
    let json: serde_json::Value =
        serde_json::from_str(&ok(&world, &["history", "list", "-o", "json"]).await?)?;
    let rows = json.as_array().context("an array")?;
    assert_eq!(rows[0]["number"], v_blog);
    assert_eq!(rows[0]["live"], true, "{json}");
    assert_eq!(rows[0]["live_hosts"], 2, "{json}");
    assert_eq!(rows[0]["cause"], "default/blog updated", "{json}");
    assert!(rows[0]["sha256"].as_str().is_some_and(|s| s.len() == 64));
    assert!(rows[0]["time"].as_str().is_some_and(|t| t.contains('T')));
    let table = ok(&world, &["history", "list"]).await?;
    assert!(table.starts_with("VERSION"), "{table}");
    assert!(table.contains("2/2"), "{table}");

    // show: byte for byte what the hosts run.
    let shown = ok(&world, &["history", "show", &v_blog.to_string()]).await?;
    let live = std::fs::read_to_string(stack.hosts[0].config_path())?;
    assert!(shown.starts_with(&live), "show prints the config first, as published");
    assert!(shown.contains("blog.example.com/ be_default_api_80"), "{shown}");

    // diff: the route that came with blog, in the prefix map.
    let diff = ok(&world, &["history", "diff", &v_shop.to_string(), &v_blog.to_string()]).await?;
    assert!(diff.contains("+blog.example.com/ be_default_api_80"), "{diff}");
    // why: the Ingress, what changed, and where in the routes stream.
    let why: serde_json::Value = serde_json::from_str(
        &ok(&world, &["history", "why", &v_blog.to_string(), "-o", "json"]).await?,
    )?;
    let cause = &why["causes"][0];
    assert_eq!(cause["ingress"], "default/blog", "{why}");
    assert_eq!(cause["added"][0], "blog.example.com/ (Prefix)", "{why}");
    assert!(cause["stream_seq"].as_u64().is_some_and(|s| s > 0), "{why}");

    // rollback to the version before blog: HAProxy stops serving blog, and a later change
    // is held, not published.
    let out = ok(&world, &["rollback", &v_shop.to_string()]).await?;
    assert!(out.contains("rolled back"), "{out}");
    expect_everywhere(stack, "blog.example.com", "/", 404, "").await?;
    world.route("news", "news.example.com", "/", "web").await?;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    expect_everywhere(stack, "news.example.com", "/", 404, "").await?;
    let json: serde_json::Value =
        serde_json::from_str(&ok(&world, &["history", "list", "-o", "json"]).await?)?;
    assert_eq!(json[0]["held"], true, "the change after the rollback is held: {json}");
    assert_eq!(json[1]["restores"], v_shop, "{json}");
    assert_eq!(json[1]["pinned"], true, "{json}");

    // resume: the latest state goes live again.
    ok(&world, &["resume"]).await?;
    expect_everywhere(stack, "blog.example.com", "/", 200, "api@").await?;
    expect_everywhere(stack, "news.example.com", "/", 200, "web@").await?;

    // Clear errors, non-zero exits.
    let (success, _, stderr) = cli(&world, &["history", "show", "999"]).await?;
    assert!(!success && stderr.contains("no such version"), "{stderr}");
    let (success, _, stderr) = cli(&world, &["rollback", "999"]).await?;
    assert!(!success && stderr.contains("no such version"), "{stderr}");
    let out = tokio::process::Command::new(bin_path("hafleet"))
        .args(["history", "list", "--fleet", "nowhere"])
        .envs(world.stack.nats.env_for("hafleet-operator"))
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("unknown fleet"), "{stderr}");
    let out = tokio::process::Command::new(bin_path("hafleet"))
        .args(["history", "list", "--fleet", "edge", "--nats-url", "nats://127.0.0.1:1"])
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("cannot connect to NATS"), "{stderr}");
    Ok(())
}

/// The version an Ingress's creation made: the newest one once `host` answers everywhere.
async fn served(world: &World, name: &str, host: &str) -> Result<u64> {
    world.route(name, host, "/", "web").await?;
    expect_everywhere(&world.stack, host, "/", 200, "web@").await?;
    Ok(world.stack.latest_version().await?.expect("a version").version)
}

/// Sequences of the checkpoints in the object store, read as the tests' admin.
async fn checkpoints(world: &World) -> Result<Vec<u64>> {
    let bus = world.stack.nats.bus().await?;
    match hafleet_renderer::adapters::bus::checkpoint_store(&bus, false).await? {
        Some(b) => hafleet_renderer::adapters::bus::list_checkpoints(&b).await,
        None => Ok(vec![]),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_rebuilds_past_configs_byte_for_byte_within_retention_and_a_lost_store_keeps_numbering()
-> Result<()> {
    let mut world = World::start().await?;
    // Checkpoint after every batch, with the routes stream's size bounded by a flag.
    world.stack.restart_with(
        Component::Renderer,
        &[("HAFLEET_CHECKPOINT_EVERY", "1"), ("HAFLEET_ROUTES_MAX_BYTES", "64MiB")],
    )?;
    let v_a = served(&world, "a", "a.example.com").await?;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let between = time::OffsetDateTime::now_utc().format(&Rfc3339)?;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let v_b = served(&world, "b", "b.example.com").await?;
    assert!(v_b > v_a);

    // The flag set the stream's retention; the default age is there too.
    let admin = world.stack.nats.bus().await?;
    let mut routes = admin.js.get_stream(hafleet_proto::ROUTES_STREAM).await?;
    let config = routes.info().await?.config.clone();
    assert_eq!(config.max_bytes, 64 << 20);
    assert_eq!(config.max_age, Duration::from_secs(30 * 24 * 3600));

    // Replay at a time between the two creations prints the earlier version byte for byte.
    let at_a = ok(&world, &["history", "show", &v_a.to_string()]).await?;
    let replayed = ok(&world, &["replay", "--until", &between]).await?;
    assert_eq!(replayed, at_a, "replay at {between} is version {v_a}");
    // By sequence: the one `why` names for b's version gives b's version.
    let why: serde_json::Value = serde_json::from_str(
        &ok(&world, &["history", "why", &v_b.to_string(), "-o", "json"]).await?,
    )?;
    let seq_b = why["causes"][0]["stream_seq"].as_u64().context("a sequence")?;
    let at_b = ok(&world, &["history", "show", &v_b.to_string()]).await?;
    assert_eq!(ok(&world, &["replay", "--until", &seq_b.to_string()]).await?, at_b);
    // --diff: from the newest version to the replayed past, b's route goes away.
    let diff = ok(&world, &["replay", "--until", &between, "--diff"]).await?;
    assert!(diff.contains("-b.example.com/ be_default_web_80"), "{diff}");
    let (success, _, stderr) = cli(&world, &["replay", "--until", "last tuesday"]).await?;
    assert!(!success && stderr.contains("neither a stream sequence nor an RFC 3339"), "{stderr}");

    // The renderer restarted with other render settings (one server per backend): it records
    // them in the routes stream, a version says why, and replay renders each point with the
    // settings of that point without being told them.
    let env = [
        ("HAFLEET_CHECKPOINT_EVERY", "1"),
        ("HAFLEET_ROUTES_MAX_BYTES", "64MiB"),
        ("HAFLEET_SERVERS_PER_BACKEND", "1"),
    ];
    world.stack.restart_with(Component::Renderer, &env)?;
    let v_r = eventually(CONVERGE, "a version for the new render settings", || async {
        let v = world.stack.latest_version().await?.context("a version")?.version;
        anyhow::ensure!(v > v_b, "not yet");
        Ok(v)
    })
    .await?;
    let why: serde_json::Value = serde_json::from_str(
        &ok(&world, &["history", "why", &v_r.to_string(), "-o", "json"]).await?,
    )?;
    assert_eq!(why["causes"][0]["what"], "render settings", "{why}");
    assert!(why["causes"][0]["added"].to_string().contains("servers per backend 1"), "{why}");
    let at_r = ok(&world, &["history", "show", &v_r.to_string()]).await?;
    assert_ne!(at_r, at_b);
    assert_eq!(ok(&world, &["replay", "--until", &seq_b.to_string()]).await?, at_b);
    assert_eq!(ok(&world, &["replay", "--until", &u64::MAX.to_string()]).await?, at_r);

    // The stream drops everything up to b's event (as its limits would); a checkpoint after b
    // still lets replay reach b's point, and refuses, clearly, a point nothing can rebuild.
    eventually(CONVERGE, "a checkpoint at or after b's event", || async {
        let all = checkpoints(&world).await?;
        anyhow::ensure!(all.iter().any(|c| *c >= seq_b), "checkpoints: {all:?}");
        Ok(())
    })
    .await?;
    routes.purge().sequence(seq_b + 1).await?;
    let (success, _, stderr) = cli(&world, &["replay", "--until", &between]).await?;
    assert!(!success && stderr.contains("older than the kept history"), "{stderr}");
    let latest = world.stack.latest_version().await?.expect("a version").version;
    let now = ok(&world, &["replay", "--until", &u64::MAX.to_string()]).await?;
    assert_eq!(now, ok(&world, &["history", "show", &latest.to_string()]).await?);

    // The renderer's disk is lost. Restarted on an empty store, it starts from the checkpoint
    // (the events before it are gone from the stream), keeps serving a and b, and numbers the
    // next version above every number it published before.
    world.stack.kill(Component::Renderer);
    std::fs::remove_dir_all(world.stack.dir().join("renderer-data"))?;
    world.stack.start_component(Component::Renderer)?;
    let v_c = served(&world, "c", "c.example.com").await?;
    assert!(v_c > latest, "numbering continues: {v_c} after {latest}");
    expect_everywhere(&world.stack, "a.example.com", "/", 200, "web@").await?;
    expect_everywhere(&world.stack, "b.example.com", "/", 200, "web@").await?;
    let log = std::fs::read_to_string(world.stack.log_path(Component::Renderer))?;
    assert!(log.contains("empty store restored from a checkpoint"), "{log}");
    Ok(())
}

/// The mass-deletion guard: a watcher that comes back to an API server missing most of a
/// fleet's Ingresses (restored from an old backup, say) withdraws none of them until an
/// operator looks and confirms; then exactly those go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mass_deletion_is_held_until_an_operator_confirms_it() -> Result<()> {
    let mut world = World::start().await?;
    for i in 0..12 {
        world.route(&format!("m{i}"), &format!("m{i}.example.com"), "/", "web").await?;
    }
    expect_everywhere(&world.stack, "m11.example.com", "/", 200, "web@").await?;
    let (_, nothing, _) = cli(&world, &["sweep", "status"]).await?;
    assert!(nothing.contains("no sweep held"), "{nothing}");

    // While the watcher is down, 11 of the fleet's 12 Ingresses disappear.
    world.stack.kill(Component::Watcher);
    for i in 1..12 {
        world.ingresses.delete(&format!("m{i}"), &Default::default()).await?;
    }
    world.stack.start_component(Component::Watcher)?;
    let held = eventually(CONVERGE, "the renderer holds the sweep", || async {
        let out = ok(&world, &["sweep", "status", "-o", "json"]).await?;
        let holds: Vec<serde_json::Value> = serde_json::from_str(&out)?;
        anyhow::ensure!(!holds.is_empty(), "nothing held yet");
        anyhow::ensure!(holds.len() == 1, "one cluster, one hold: {out}");
        Ok(holds[0].clone())
    })
    .await?;
    assert_eq!(held["ingresses"].as_array().map(Vec::len), Some(11), "{held}");
    assert_eq!(held["fleet_routes"], 12, "{held}");
    let snapshot = held["snapshot_seq"].as_u64().context("snapshot_seq")?;
    let text = ok(&world, &["sweep", "status"]).await?;
    assert!(text.contains("would withdraw 11 Ingresses (11 of 12 routes)"), "{text}");
    assert!(text.contains("default/m7"), "{text}");
    assert!(text.contains(&format!("sweep confirm --fleet edge --snapshot {snapshot}")), "{text}");
    let (_, body) = hafleet_tests::http_get(
        world.stack.health_addr(Component::Renderer),
        "metrics",
        "/metrics",
    )
    .await?;
    assert!(body.contains("hafleet_renderer_sweep_held_ingresses{fleet=\"edge\"} 11"), "{body}");
    // Held: every host still serves them.
    for i in [1, 6, 11] {
        expect_everywhere(&world.stack, &format!("m{i}.example.com"), "/", 200, "web@").await?;
    }

    // A confirm must name the hold it releases.
    let wrong = (snapshot + 1000).to_string();
    let (success, _, stderr) = cli(&world, &["sweep", "confirm", "--snapshot", &wrong]).await?;
    assert!(!success && stderr.contains("no such sweep"), "{stderr}");
    let out = ok(&world, &["sweep", "confirm", "--snapshot", &snapshot.to_string()]).await?;
    assert!(out.contains("released"), "{out}");
    for i in [1, 6, 11] {
        expect_everywhere(&world.stack, &format!("m{i}.example.com"), "/", 404, "").await?;
    }
    expect_everywhere(&world.stack, "m0.example.com", "/", 200, "web@").await?;
    let (_, nothing, _) = cli(&world, &["sweep", "status"]).await?;
    assert!(nothing.contains("no sweep held"), "{nothing}");
    let list = ok(&world, &["history", "list", "--limit", "1"]).await?;
    assert!(list.contains("deleted (held sweep released)"), "{list}");
    Ok(())
}

/// With --sweep-release-after, a held sweep goes by itself once the hold is that old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_sweep_is_released_by_the_release_policy() -> Result<()> {
    let mut world = World::start().await?;
    let policy = [("HAFLEET_SWEEP_RELEASE_AFTER", "5s"), ("HAFLEET_SWEEP_GUARD_MIN_ROUTES", "2")];
    world.stack.restart_with(Component::Renderer, &policy)?;
    for i in 0..3 {
        world.route(&format!("p{i}"), &format!("p{i}.example.com"), "/", "web").await?;
    }
    expect_everywhere(&world.stack, "p2.example.com", "/", 200, "web@").await?;
    world.stack.kill(Component::Watcher);
    for i in 1..3 {
        world.ingresses.delete(&format!("p{i}"), &Default::default()).await?;
    }
    world.stack.start_component(Component::Watcher)?;
    eventually(CONVERGE, "the renderer holds the sweep", || async {
        let out = ok(&world, &["sweep", "status", "-o", "json"]).await?;
        let holds: Vec<serde_json::Value> = serde_json::from_str(&out)?;
        anyhow::ensure!(!holds.is_empty(), "nothing held yet");
        Ok(())
    })
    .await?;
    expect_everywhere(&world.stack, "p1.example.com", "/", 200, "web@").await?;
    // No operator: the policy releases it.
    expect_everywhere(&world.stack, "p1.example.com", "/", 404, "").await?;
    expect_everywhere(&world.stack, "p0.example.com", "/", 200, "web@").await?;
    let newest = world.stack.latest_version().await?.context("a version")?;
    let whats: Vec<&str> = newest.causes.iter().map(|c| c.what.as_str()).collect();
    assert_eq!(whats, ["sweep confirmed by policy"; 2], "{:?}", newest.causes);
    Ok(())
}
