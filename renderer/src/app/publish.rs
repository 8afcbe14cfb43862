//! Publishing what the renderer decided: stored versions that are not out yet, and releases of
//! held sweeps. The run loop and the history service both publish; both come here, so neither
//! depends on the other.

use crate::adapters::bus::{self, Bus};
use crate::adapters::store::Store;
use crate::core::state::SweepGuard;
use hafleet_proto::FleetName;
use tracing::{error, info, warn};

/// Publishes every version stored but not yet published, oldest first within each fleet.
/// A fleet whose version cannot be published (the object store full, a permission taken away)
/// is reported and left for the next try; its later versions wait behind it so its order holds,
/// and other fleets go on. Returns whether anything is left to publish.
///
/// With `guard` (the run loop's publishing; not an operator's rollback or resume), a fleet
/// this store has never published goes through [`hold_rebuilt`] first.
pub async fn publish_unpublished(
    bus: &bus::Bus,
    store: &Store,
    signer: &hafleet_proto::Signer,
    guard: Option<&SweepGuard>,
) -> anyhow::Result<bool> {
    // Fleets the guard could not check yet wait, as a fleet whose publish failed does.
    let mut stuck: Vec<FleetName> = match guard {
        Some(guard) => hold_rebuilt(bus, store, guard).await?,
        None => Vec::new(),
    };
    for v in store.unpublished()? {
        if stuck.contains(&v.fleet) {
            continue;
        }
        let started = std::time::Instant::now();
        let v = signer.sign(v);
        match bus.publish_version(&v).await {
            Ok(_) => {
                store.set_published(&v.fleet, v.version)?;
                fleet_gauges(store, &v.fleet, Some(v.version))?;
                let publish_ms = started.elapsed().as_secs_f64() * 1e3;
                info!(fleet = %v.fleet, version = v.version, publish_ms, "version published");
                hafleet_runtime::health::Health::global().count(
                    (
                        "hafleet_renderer_versions_published_total",
                        "Config versions published, by fleet.",
                    ),
                    &[("fleet", v.fleet.as_str())],
                    1.0,
                );
            }
            Err(e) => {
                error!(fleet = %v.fleet, version = v.version, error = ?anyhow::Error::from(e),
                       "version cannot be published; other fleets go on, this one is retried");
                stuck.push(v.fleet.clone());
            }
        }
    }
    Ok(!stuck.is_empty())
}

/// Sets `fleet`'s gauges: whether it is pinned and, given, the newest version published.
pub fn fleet_gauges(store: &Store, fleet: &FleetName, newest: Option<u64>) -> anyhow::Result<()> {
    let m = hafleet_runtime::health::Health::global();
    let labels = [("fleet", fleet.as_str())];
    if let Some(n) = newest {
        let what = ("hafleet_fleet_newest_version", "The newest version published, by fleet.");
        m.gauge(what, &labels, n as f64);
    }
    let pinned = store.pinned(fleet)?.is_some();
    let what = (
        "hafleet_fleet_pinned",
        "1 while a rollback (or a held rebuilt state) pins the fleet: its changes are recorded, \
         not published, until `resume`.",
    );
    m.gauge(what, &labels, f64::from(u8::from(pinned)));
    Ok(())
}

/// The mass-deletion guard over a rebuilt state. A fleet this store has versions of but has
/// never published, while its subject has a version of an earlier store (the store was lost
/// and rebuilt from a checkpoint, the routes stream and the watchers' restatement): if the
/// newest version would serve so many fewer routes than the newest published one that the
/// guard holds it (an API server restored from an empty backup, a watcher that lost its
/// rights), none of those versions is published. They are held and the fleet pinned, as after
/// a rollback, until an operator looks and runs `resume`. The guard of snapshots cannot see
/// this: a rebuilt state never held what the restatement left out.
///
/// Returns the fleets it could not check (the configs stream unreadable for now): they are not
/// published this time.
async fn hold_rebuilt(
    bus: &Bus,
    store: &Store,
    guard: &SweepGuard,
) -> anyhow::Result<Vec<FleetName>> {
    let mut unchecked = Vec::new();
    for fleet in store.fleets_with_versions()? {
        if store.published(&fleet)? > 0
            || store.pinned(&fleet)?.is_some()
            || store.resumed(&fleet)?
        {
            continue;
        }
        let Some(newest) = store.latest_summary(&fleet)? else { continue };
        if newest.held {
            continue;
        }
        let published = match bus::latest_published(bus, &fleet).await {
            Ok(p) => p,
            Err(e) => {
                warn!(fleet = %fleet, error = %e, "cannot read the newest published version to \
                      compare a rebuilt state with; publishing the fleet later");
                unchecked.push(fleet);
                continue;
            }
        };
        let now = store.version(&fleet, newest.number)?.and_then(|v| v.routes);
        let (Some(before), Some(now)) = (published.routes, now) else { continue };
        let gone = before.saturating_sub(now);
        if !guard.holds(gone as usize, before as usize) {
            continue;
        }
        store.hold_unpublished(&fleet, published.number)?;
        fleet_gauges(store, &fleet, None)?;
        error!(fleet = %fleet, published = published.number, published_routes = before,
               version = newest.number, routes = now,
               "this renderer's rebuilt state would withdraw too much of the fleet at once; \
                nothing published, the fleet is pinned to what its hosts run. Check the API \
                server and the watcher, then `hafleet resume --fleet {fleet}` to \
                publish what the state renders now");
        hafleet_runtime::health::Health::global().count(
            (
                "hafleet_renderer_rebuilt_held_total",
                "Fleets whose first version after a rebuilt state the mass-deletion guard held.",
            ),
            &[("fleet", fleet.as_str())],
            1.0,
        );
    }
    Ok(unchecked)
}

/// Publishes the release of `held` on the routes stream; returns its sequence. Its message id
/// names the hold, so a second release of the same hold (by the operator and the policy, say)
/// is dropped by the stream as a duplicate. It carries `epoch`, the newest watcher epoch the
/// renderer has seen of the hold's cluster: it is not fenced off while that watcher runs, and
/// a watcher that starts after it, reading the stream's newest message, still picks an epoch
/// above it.
pub async fn publish_confirm(
    bus: &Bus,
    fleet: &FleetName,
    held: &hafleet_proto::HeldSweep,
    epoch: u64,
    by: &str,
) -> anyhow::Result<u64> {
    let msg = hafleet_proto::RouteMessage::Confirm(hafleet_proto::SweepConfirm {
        schema: hafleet_proto::route_schema(held.cluster.as_ref()),
        epoch,
        fleet: fleet.clone(),
        snapshot_seq: held.snapshot_seq,
        by: by.to_owned(),
        cluster: held.cluster.clone(),
    });
    let id = format!("confirm-{fleet}-{}", held.snapshot_seq);
    let seq =
        bus.publish(hafleet_proto::ROUTES_CONFIRM_SUBJECT.to_owned(), &id, msg.encode()).await?;
    tracing::warn!(fleet = %fleet, snapshot_seq = held.snapshot_seq, by, stream_seq = seq,
                   ingresses = held.ingresses.len(), "held sweep released");
    Ok(seq)
}
