//! When the watchers have restated everything after a gap in the routes stream. Pure: the
//! subjects of the messages that follow the renderer's ask in, a verdict out.
//!
//! Each watcher that restates publishes its cluster's nodes first (on
//! `hafleet.routes._nodes[.<cluster>]`) and its snapshot last (on
//! `hafleet.routes._snapshot[.<cluster>]`). With several clusters feeding the fleets, the
//! first snapshot must not end the wait while another cluster's restatement is under way: its
//! Ingresses would be published as withdrawn. The wait ends once every cluster seen restating
//! has sent its snapshot, or, for a cluster whose watcher never finishes, `grace` after the
//! first snapshot (the mass-deletion guard of a rebuilt state still holds a version that
//! would withdraw too much).

use std::collections::BTreeSet;
use std::time::Duration;
use tokio::time::Instant;

/// What the renderer has seen of the watchers' restatement since it asked.
#[derive(Debug, Default)]
pub struct Restatement {
    /// Clusters (by their subjects' suffix, `""` for the unnamed one) whose nodes came.
    started: BTreeSet<String>,
    /// Clusters whose snapshot came.
    done: BTreeSet<String>,
    /// When the first snapshot came.
    first_done: Option<Instant>,
}

impl Restatement {
    /// Expects the restatement of `clusters` too (those the renderer's state knows), whether
    /// or not their nodes come first.
    pub fn expect<'a>(
        &mut self,
        clusters: impl Iterator<Item = Option<&'a hafleet_proto::ClusterId>>,
    ) {
        self.started.extend(clusters.map(|c| c.map_or(String::new(), |c| c.as_str().to_owned())));
    }

    /// Notes a message on `subject`, received at `now`; `is_snapshot`: whether it is a
    /// whole snapshot (asked only for messages on a snapshot subject).
    pub fn note(&mut self, subject: &str, is_snapshot: impl FnOnce() -> bool, now: Instant) {
        if let Some(cluster) = cluster_of(subject, hafleet_proto::ROUTES_NODES_SUBJECT) {
            self.started.insert(cluster.to_owned());
        } else if let Some(cluster) = cluster_of(subject, hafleet_proto::ROUTES_SNAPSHOT_SUBJECT)
            && self.started.contains(cluster)
            && is_snapshot()
        {
            // (A snapshot of a cluster whose restatement was not seen to begin is a routine
            // one, not the end of a restatement.)
            self.done.insert(cluster.to_owned());
            self.first_done.get_or_insert(now);
        }
    }

    /// Whether the restatement is over at `now`: a snapshot came, and every cluster that
    /// started has sent its own, or `grace` has passed since the first.
    pub fn complete(&self, now: Instant, grace: Duration) -> bool {
        match self.first_done {
            None => false,
            Some(first) => self.started.is_subset(&self.done) || now >= first + grace,
        }
    }

    /// Whether a cluster has finished.
    pub fn any_done(&self) -> bool {
        self.first_done.is_some()
    }

    /// The clusters that started and have not finished (`""`: the unnamed one).
    pub fn waiting_for(&self) -> Vec<&str> {
        self.started.difference(&self.done).map(String::as_str).collect()
    }
}

/// The cluster a subject of `base`'s family names: `""` for `base` itself, the suffix for
/// `base.<cluster>`; `None` for another subject.
fn cluster_of<'a>(subject: &'a str, base: &str) -> Option<&'a str> {
    match subject.strip_prefix(base)? {
        "" => Some(""),
        rest => rest.strip_prefix('.'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_ends_once_every_cluster_that_started_has_sent_its_snapshot() {
        let grace = Duration::from_secs(60);
        let t0 = Instant::now();
        let mut r = Restatement::default();
        r.note("hafleet.routes._nodes.east", || unreachable!(), t0);
        r.note("hafleet.routes._nodes.west", || unreachable!(), t0);
        r.note("hafleet.routes.edge", || unreachable!(), t0);
        assert!(!r.complete(t0, grace), "no snapshot yet");
        // A part on the snapshot subject is not the snapshot.
        r.note("hafleet.routes._snapshot.east", || false, t0);
        assert!(!r.complete(t0, grace));
        r.note("hafleet.routes._snapshot.east", || true, t0);
        assert!(!r.complete(t0 + Duration::from_secs(1), grace), "west is restating");
        assert_eq!(r.waiting_for(), ["west"]);
        r.note("hafleet.routes._snapshot.west", || true, t0 + Duration::from_secs(2));
        assert!(r.complete(t0 + Duration::from_secs(2), grace));
    }

    #[test]
    fn a_cluster_that_never_finishes_is_waited_for_no_longer_than_the_grace() {
        let grace = Duration::from_secs(60);
        let t0 = Instant::now();
        let mut r = Restatement::default();
        r.note("hafleet.routes._nodes", || unreachable!(), t0);
        r.note("hafleet.routes._nodes.gone", || unreachable!(), t0);
        r.note("hafleet.routes._snapshot", || true, t0);
        assert_eq!(r.waiting_for(), ["gone"]);
        assert!(!r.complete(t0 + Duration::from_secs(59), grace));
        assert!(r.complete(t0 + grace, grace));
        // A snapshot without the nodes that begin a restatement ends nothing.
        let mut routine = Restatement::default();
        routine.note("hafleet.routes._snapshot", || true, t0);
        assert!(!routine.complete(t0 + grace, grace));
        // A cluster the state knows is waited for, nodes or not.
        let mut known = Restatement::default();
        let east = hafleet_proto::ClusterId::new("east").unwrap();
        known.expect([None, Some(&east)].into_iter());
        known.note("hafleet.routes._nodes", || unreachable!(), t0);
        known.note("hafleet.routes._snapshot", || true, t0);
        assert_eq!(known.waiting_for(), ["east"]);
        // `hafleet.routes._nodesX` is no cluster's nodes subject.
        let mut other = Restatement::default();
        other.note("hafleet.routes._nodesX", || unreachable!(), t0);
        other.note("hafleet.routes._nodes", || unreachable!(), t0);
        other.note("hafleet.routes._snapshot", || true, t0);
        assert!(other.complete(t0, grace));
    }
}
