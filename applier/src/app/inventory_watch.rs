//! The inventory, re-read without a restart: at once on SIGHUP, and whenever its content
//! changes (looked at every few seconds: a ConfigMap update swaps the file under the pod, and
//! an editor renames over it, neither of which a restart should be needed for). A new text
//! that does not parse is refused, logged and counted; the hosts in use stay.

use crate::core::inventory::{self, Host};
use anyhow::Context as _;
use std::path::PathBuf;
use std::time::Duration;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// How often the file is compared with the text in use.
const LOOK_EVERY: Duration = Duration::from_secs(5);

const RELOADS: (&str, &str) = (
    "hafleet_applier_inventory_reloads_total",
    "Inventory re-reads that changed the hosts (outcome=applied) or were refused (outcome=refused).",
);

/// The inventory file and the text in use.
pub struct InventoryWatch {
    path: PathBuf,
    text: String,
    hangup: Signal,
    look: tokio::time::Interval,
}

impl InventoryWatch {
    /// Reads and parses the inventory at start-up: failing here stops the applier.
    pub fn start(path: PathBuf) -> anyhow::Result<(InventoryWatch, Vec<Host>)> {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read inventory {}", path.display()))?;
        let hosts =
            inventory::parse(&text).with_context(|| format!("inventory {}", path.display()))?;
        let hangup = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
        // Both series from the start, at 0: an alert on their increase sees the first one.
        for outcome in ["applied", "refused"] {
            hafleet_runtime::health::Health::global().count(RELOADS, &[("outcome", outcome)], 0.0);
        }
        let mut look =
            tokio::time::interval_at(tokio::time::Instant::now() + LOOK_EVERY, LOOK_EVERY);
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok((InventoryWatch { path, text, hangup, look }, hosts))
    }

    /// Waits for a new inventory text that parses, and returns its hosts (the caller compares
    /// them with those in use). A text that does not parse is refused once, logged and
    /// counted.
    pub async fn next(&mut self) -> Vec<Host> {
        loop {
            let asked = tokio::select! {
                _ = self.hangup.recv() => true,
                _ = self.look.tick() => false,
            };
            let text = match std::fs::read_to_string(&self.path) {
                Ok(text) => text,
                Err(e) => {
                    if asked {
                        tracing::warn!(path = %self.path.display(), error = %e, "SIGHUP: cannot read the inventory; the hosts in use stay");
                    }
                    continue;
                }
            };
            if text == self.text {
                if asked {
                    tracing::info!(path = %self.path.display(), "SIGHUP: the inventory is unchanged");
                }
                continue;
            }
            self.text = text;
            match inventory::parse(&self.text) {
                Ok(hosts) => return hosts,
                Err(e) => {
                    tracing::error!(path = %self.path.display(), error = %e, "the new inventory is refused; the hosts in use stay");
                    count("refused");
                }
            }
        }
    }
}

/// Counts one re-read by outcome.
pub fn count(outcome: &str) {
    hafleet_runtime::health::Health::global().count(RELOADS, &[("outcome", outcome)], 1.0);
}
