//! Checkpoints of the desired state in the object store: written every so many route events
//! or so long, dropped once the routes stream no longer reaches them, and read back to rebuild
//! an empty store. Which to write, keep and restore is decided in [`crate::core::checkpoint`].

use super::args::RetentionArgs;
use crate::adapters::bus;
use crate::adapters::store::Store;
use crate::core::state;
use anyhow::Context as _;
use async_nats::jetstream;
use std::collections::BTreeMap;
use std::time::Duration;
use tracing::{info, warn};

/// Writes checkpoints of the desired state to the object store and drops those that no point
/// of the kept history needs any more. A failed checkpoint is logged and tried again later:
/// it costs replay range, never a route event.
pub(crate) struct Checkpointer {
    bucket: jetstream::object_store::ObjectStore,
    every: u64,
    interval: Duration,
    last_seq: u64,
    last_at: tokio::time::Instant,
}

impl Checkpointer {
    pub(crate) async fn start(bus: &bus::Bus, args: &RetentionArgs) -> anyhow::Result<Self> {
        let bucket = bus::checkpoint_store(bus, true).await?.context("no checkpoint bucket")?;
        let last_seq = bus::list_checkpoints(&bucket).await?.last().copied().unwrap_or(0);
        Ok(Checkpointer {
            bucket,
            every: args.checkpoint_every.max(1),
            interval: args.checkpoint_interval,
            last_seq,
            last_at: tokio::time::Instant::now(),
        })
    }

    /// Fills an empty store from the newest checkpoint of the routes stream it follows, so a
    /// renderer whose disk was lost starts where the checkpoint left off even after the
    /// stream dropped the messages before it.
    pub(crate) async fn restore(&self, bus: &bus::Bus, store: &Store) -> anyhow::Result<()> {
        let bus::RoutesBounds { first, last, created, .. } = bus::routes_bounds(bus).await?;
        let Some(&seq) =
            bus::list_checkpoints(&self.bucket).await?.iter().rev().find(|s| **s <= last)
        else {
            if first > 1 {
                warn!(
                    first_seq = first,
                    "empty store, no checkpoint, and the routes stream no \
                      longer starts at its beginning: the state is rebuilt from what it holds"
                );
            }
            return Ok(());
        };
        let c = bus::get_checkpoint(&self.bucket, seq).await?;
        if c.routes_stream_created != created {
            warn!(checkpoint = seq, "the newest checkpoint is of another routes stream; not used");
            return Ok(());
        }
        store.set_routes_stream_created(&created)?;
        store.restore(&c.desired(), c.seq, &c.latest)?;
        info!(checkpoint = seq, fleets = c.fleets.len(), "empty store restored from a checkpoint");
        Ok(())
    }

    /// Checkpoints if `every` events or `interval` passed since the last one.
    pub(crate) async fn maybe(&mut self, bus: &bus::Bus, store: &Store, desired: &state::Desired) {
        let Ok(applied) = store.applied_seq() else { return };
        let due = applied >= self.last_seq + self.every || self.last_at.elapsed() >= self.interval;
        if applied <= self.last_seq || !due {
            return;
        }
        match self.write(bus, store, desired, applied).await {
            Ok(bytes) => {
                info!(seq = applied, bytes, "desired state checkpointed");
                self.last_seq = applied;
                self.last_at = tokio::time::Instant::now();
            }
            Err(e) => {
                warn!(error = format!("{e:#}"), "checkpoint failed; trying again later");
                self.last_at = tokio::time::Instant::now();
            }
        }
    }

    async fn write(
        &self,
        bus: &bus::Bus,
        store: &Store,
        desired: &state::Desired,
        applied: u64,
    ) -> anyhow::Result<usize> {
        let mut latest = BTreeMap::new();
        for fleet in desired.fleets.keys() {
            let n = store.latest_summary(fleet)?.map(|s| s.number).unwrap_or(0);
            latest.insert(fleet.clone(), n.max(store.floor(fleet)?));
        }
        let created = store.routes_stream_created()?.unwrap_or_default();
        let now = hafleet_runtime::now_unix_ms();
        let c = crate::core::checkpoint::Checkpoint::new(applied, created, now, latest, desired);
        let bytes = bus::put_checkpoint(&self.bucket, &c).await?;
        let first = bus::routes_bounds(bus).await?.first;
        let all = bus::list_checkpoints(&self.bucket).await?;
        for old in crate::core::checkpoint::prunable(&all, first) {
            bus::delete_checkpoint(&self.bucket, old).await?;
            info!(seq = old, "checkpoint dropped: the routes stream no longer reaches it");
        }
        Ok(bytes)
    }
}
