//! The applier's inventory changes without a restart: on SIGHUP at once, and when the file
//! changes (as a ConfigMap update swaps it); a host taken out stops getting versions and its
//! gauges go, a host put in gets the fleet's current version at once, and an inventory that
//! does not parse is refused while the hosts in use go on.

use crate::{World, expect_everywhere, expect_on, metrics};
use anyhow::Result;
use hafleet_tests::eventually;
use hafleet_tests::stack::{Component, write_inventory};
use std::time::Duration;

/// Writes the inventory aside, then renames it over the one in use, as a ConfigMap update or
/// an editor does: the applier never reads half of it.
fn replace_inventory(
    world: &World,
    hosts: &[hafleet_tests::haproxy_host::HaproxyHost],
) -> Result<()> {
    let path = world.stack.inventory_path().to_owned();
    let aside = path.with_extension("new");
    write_inventory(&aside, hosts)?;
    std::fs::rename(&aside, &path)?;
    Ok(())
}

/// Waits until the applier's log says the inventory was re-read `n` times in all.
async fn rereads(world: &World, n: usize) -> Result<()> {
    let log = world.stack.log_path(Component::Applier);
    eventually(Duration::from_secs(20), &format!("{n} inventory re-reads"), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        async move {
            anyhow::ensure!(text.matches("inventory re-read").count() >= n, "not yet");
            Ok(())
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inventory_is_reread_on_sighup_and_on_change_without_a_restart() -> Result<()> {
    let mut world = World::start().await?;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "shop.example.com", "/", 200, "web@").await?;
    let pid = world.stack.pid(Component::Applier).expect("the applier runs");

    // lb-2 taken out, on SIGHUP: the next version reaches lb-1 only, and lb-2's gauges go.
    replace_inventory(&world, &world.stack.hosts[..1])?;
    assert!(
        std::process::Command::new("kill").args(["-HUP", &pid.to_string()]).status()?.success()
    );
    rereads(&world, 1).await?;
    world.route("blog", "blog.example.com", "/", "api").await?;
    expect_on(&world.stack.hosts[..1], &world.stack, "blog.example.com", "/", 200, "api@").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    expect_on(&world.stack.hosts[1..], &world.stack, "blog.example.com", "/", 404, "").await?;
    let m = metrics(&world.stack, Component::Applier).await?;
    assert!(
        !m.lines()
            .any(|l| l.starts_with("hafleet_applier_live_version") && l.contains("host=\"lb-2\"")),
        "lb-2's gauges stay after it left: {m}"
    );

    // An inventory that does not parse is refused; lb-1 goes on taking versions.
    let path = world.stack.inventory_path().to_owned();
    std::fs::write(path.with_extension("new"), "[[hosts]]\nname = \"Not A Host\"\n")?;
    std::fs::rename(path.with_extension("new"), &path)?;
    let log = world.stack.log_path(Component::Applier);
    eventually(Duration::from_secs(20), "the broken inventory refused", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        async move {
            anyhow::ensure!(text.contains("the new inventory is refused"), "not yet");
            Ok(())
        }
    })
    .await?;
    world.route("news", "news.example.com", "/", "web").await?;
    expect_on(&world.stack.hosts[..1], &world.stack, "news.example.com", "/", 200, "web@").await?;

    // Both hosts again, no signal: the change is seen by itself, and lb-2 gets the current
    // version (blog and news) at once, without a new version.
    let version = world.stack.latest_version().await?.expect("a version").version;
    replace_inventory(&world, &world.stack.hosts)?;
    rereads(&world, 2).await?;
    expect_everywhere(&world.stack, "news.example.com", "/", 200, "web@").await?;
    expect_everywhere(&world.stack, "blog.example.com", "/", 200, "api@").await?;
    assert_eq!(world.stack.latest_version().await?.expect("a version").version, version);
    assert_eq!(world.stack.pid(Component::Applier), Some(pid), "the applier was restarted");
    let m = metrics(&world.stack, Component::Applier).await?;
    for (outcome, n) in [("applied", 2), ("refused", 1)] {
        let line = format!(
            "hafleet_applier_inventory_reloads_total{{fleet=\"edge\",outcome=\"{outcome}\"}} {n}"
        );
        assert!(m.contains(&line), "no {line:?} in {m}");
    }
    Ok(())
}
