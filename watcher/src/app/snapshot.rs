//! The watcher's snapshot (every Ingress it knows, live or kept) and how it goes out: whole
//! when it fits in a NATS message, else in parts on the same subject (see
//! [`hafleet_proto::parts`]), each part acked before the next, and then the message that names
//! them by their stream sequences.
//!
//! Also how the start-up loops retry: until done or until a stop is asked for, saying each
//! distinct failure once.

use crate::core::index::Published;
use hafleet_proto::{ClusterId, FleetName, IngressKey, RouteMessage, RoutesSnapshot};
use hafleet_runtime::nats::Bus;
use std::collections::BTreeSet;
use std::time::Duration;
use tracing::{debug, info, warn};

/// Room left in a message for what a publish adds besides the payload, on top of the header
/// room [`Bus::payload_limit`] already keeps.
const HEADROOM: usize = 4 * 1024;

/// The snapshot of what was published and what is kept, in the same order from one snapshot
/// to the next (`published` is hashed).
pub fn build(
    published: &Published,
    kept: &BTreeSet<IngressKey>,
    epoch: u64,
    cluster: Option<&ClusterId>,
) -> RoutesSnapshot {
    let mut live: Vec<(FleetName, IngressKey)> = published
        .iter()
        .flat_map(|(k, fleets)| fleets.iter().map(move |(f, _)| (f, k)))
        .map(|(f, k)| (f.clone(), k.clone().in_cluster(cluster)))
        .collect();
    live.sort_by(|a, b| (&a.1, &a.0).cmp(&(&b.1, &b.0)));
    let keys = live.iter().map(|(_, k)| k).chain(kept.iter());
    RoutesSnapshot {
        schema: hafleet_proto::keys_schema(cluster, keys),
        epoch,
        cluster: cluster.cloned(),
        live,
        keep: kept.iter().map(|k| k.clone().in_cluster(cluster)).collect(),
        parts: vec![],
    }
}

/// What a snapshot took to publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    /// Stream sequence of the (final) snapshot message.
    pub seq: u64,
    /// Messages before it (0: it went whole).
    pub parts: usize,
    /// Bytes of every message together.
    pub bytes: usize,
}

/// Publishes `snapshot` on `subject`, in parts when it does not fit in one message; each
/// message gets an id from `next_id`. A failure part way leaves parts that no snapshot names,
/// which change nothing; publishing again sends them all again.
pub async fn publish(
    bus: &Bus,
    subject: &str,
    snapshot: &RoutesSnapshot,
    mut next_id: impl FnMut() -> String,
) -> anyhow::Result<Sent> {
    let limit = bus.payload_limit().saturating_sub(HEADROOM).max(1024);
    let Some(parts) = snapshot.split(limit) else {
        let bytes = RouteMessage::Snapshot(snapshot.clone()).encode();
        let size = bytes.len();
        let seq = bus.publish(subject.to_owned(), &next_id(), bytes).await?;
        return Ok(Sent { seq, parts: 0, bytes: size });
    };
    let mut seqs = Vec::with_capacity(parts.len());
    let mut size = 0;
    for part in parts {
        let index = part.index;
        let bytes = RouteMessage::SnapshotPart(part).encode();
        size += bytes.len();
        let seq = bus.publish(subject.to_owned(), &next_id(), bytes).await?;
        debug!(index, stream_seq = seq, "snapshot part published");
        seqs.push(seq);
    }
    let count = seqs.len();
    let last = RouteMessage::Snapshot(snapshot.naming_parts(seqs)).encode();
    size += last.len();
    let seq = bus.publish(subject.to_owned(), &next_id(), last).await?;
    Ok(Sent { seq, parts: count, bytes: size })
}

/// Says each failure of a retried step once: the first time, and again only when another
/// error came in between (each with its causes on one line, no backtrace).
#[derive(Debug, Default)]
pub struct Failures {
    last: Option<String>,
    repeats: u64,
}

impl Failures {
    /// Notes a failure of `what`; returns whether it was logged.
    pub fn failed(&mut self, what: &str, e: &anyhow::Error) -> bool {
        let text = format!("{e:#}");
        if self.last.as_deref() == Some(text.as_str()) {
            self.repeats += 1;
            return false;
        }
        if self.repeats > 0 {
            info!(times = self.repeats + 1, "{what}: the error before failed that many times");
        }
        warn!(error = %text, "{what} failed; retrying every second until it works");
        self.last = Some(text);
        self.repeats = 0;
        true
    }
}

/// Runs `attempt` until it succeeds, a second after each failure (said once per distinct
/// error), and returns what it gave; `None` as soon as `stop` resolves, whether during an
/// attempt (which is dropped) or between two.
pub async fn until_done<T>(
    what: &str,
    mut stop: std::pin::Pin<&mut impl Future<Output = ()>>,
    mut attempt: impl AsyncFnMut() -> anyhow::Result<T>,
) -> Option<T> {
    let mut failures = Failures::default();
    loop {
        tokio::select! {
            done = attempt() => match done {
                Ok(value) => return Some(value),
                Err(e) => { failures.failed(what, &e); }
            },
            _ = &mut stop => return None,
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = &mut stop => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn a_snapshot_lists_live_ingresses_in_key_order_with_the_kept_ones() {
        let edge = FleetName::new("edge").unwrap();
        let mut published = Published::default();
        for name in ["b", "a", "c"] {
            published.insert(IngressKey::new("default", name).unwrap(), vec![(edge.clone(), None)]);
        }
        let kept = BTreeSet::from([IngressKey::new("default", "k").unwrap()]);
        let east = ClusterId::new("east").unwrap();
        let s = build(&published, &kept, 7, Some(&east));
        let names: Vec<&str> = s.live.iter().map(|(_, k)| k.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(s.live.iter().all(|(_, k)| k.cluster.as_ref() == Some(&east)));
        assert_eq!(s.keep, [IngressKey::new("default", "k").unwrap().in_cluster(Some(&east))]);
        assert_eq!(
            (s.epoch, s.schema, s.parts.len()),
            (7, hafleet_proto::CLUSTER_SCHEMA_VERSION, 0)
        );
    }

    #[test]
    fn the_same_failure_is_said_once() {
        let mut f = Failures::default();
        let too_large = || anyhow::anyhow!("more than NATS accepts").context("publish failed");
        assert!(f.failed("snapshot publish", &too_large()));
        assert!(!f.failed("snapshot publish", &too_large()));
        assert!(!f.failed("snapshot publish", &too_large()));
        assert!(f.failed("snapshot publish", &anyhow::anyhow!("timed out")));
        assert!(f.failed("snapshot publish", &too_large()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_retries_between_attempts() {
        let tries = AtomicU32::new(0);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let stop = async move {
            let _ = rx.await;
        };
        tokio::pin!(stop);
        let loop_ =
            until_done("snapshot publish", stop.as_mut(), async || -> anyhow::Result<()> {
                tries.fetch_add(1, Ordering::SeqCst);
                anyhow::bail!("more than NATS accepts")
            });
        let stopper = async {
            tokio::time::sleep(Duration::from_millis(10_500)).await;
            tx.send(()).unwrap();
        };
        let (ended, ()) = tokio::join!(loop_, stopper);
        assert_eq!(ended, None);
        // At 0 s, 1 s, … 10 s: a try a second, then the stop at 10.5 s.
        assert_eq!(tries.load(Ordering::SeqCst), 11);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_an_attempt_that_hangs_and_success_ends_the_loop() {
        let stop = tokio::time::sleep(Duration::from_secs(3));
        tokio::pin!(stop);
        let hangs = async || -> anyhow::Result<()> { std::future::pending().await };
        let started = tokio::time::Instant::now();
        assert_eq!(until_done("initial publish", stop.as_mut(), hangs).await, None);
        assert_eq!(started.elapsed(), Duration::from_secs(3));

        let tries = AtomicU32::new(0);
        let never = std::future::pending::<()>();
        tokio::pin!(never);
        let third_time = async || match tries.fetch_add(1, Ordering::SeqCst) {
            0 | 1 => anyhow::bail!("not yet"),
            n => Ok(n),
        };
        assert_eq!(until_done("initial publish", never.as_mut(), third_time).await, Some(2));
    }
}
