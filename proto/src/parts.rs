//! A snapshot too large for one NATS message, published in parts on the routes stream.
//!
//! ```text
//! watcher: SnapshotPart 0 ──ack seq 17──▶  SnapshotPart 1 ──ack seq 18──▶ … ──▶
//!          Snapshot { parts: [17, 18, …], live: [], keep: [] }
//! renderer: parts change nothing as they pass; the final Snapshot reads each of its parts back
//!           from the stream by sequence, joins them, and sweeps as one snapshot.
//! ```
//! Only the final message acts, and only once every part it names is read back and matches it
//! (same epoch and cluster, in order). A watcher that dies between parts leaves parts no
//! snapshot names: they change nothing. A renderer that dies between them reads them again
//! from the stream, and so does a replay: the stream alone says what the snapshot was.

use crate::messages::{IngressKey, RouteMessage, RoutesSnapshot};
use crate::values::{ClusterId, FleetName};
use serde::{Deserialize, Serialize};

/// One part of a snapshot published in parts ([`RoutesSnapshot::parts`]), on the same subject
/// as the snapshot, before it. Of schema [`crate::PARTS_SCHEMA_VERSION`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotPart {
    pub schema: u32,
    pub epoch: u64,
    /// The cluster whose watcher sent it; as [`RoutesSnapshot::cluster`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterId>,
    /// Its place among the snapshot's parts, from 0.
    pub index: u32,
    /// A slice of the snapshot's `live`, in the snapshot's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub live: Vec<(FleetName, IngressKey)>,
    /// A slice of the snapshot's `keep`, in the snapshot's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keep: Vec<IngressKey>,
}

/// Why a snapshot's parts do not make it whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartsError {
    #[error("its part {index} (stream sequence {seq}) is no longer in the routes stream")]
    Missing { index: usize, seq: u64 },
    #[error("its part {index} (stream sequence {seq}) is not a snapshot part: {what}")]
    NotAPart { index: usize, seq: u64, what: String },
    #[error(
        "its part {index} (stream sequence {seq}) belongs to another snapshot: {what} \
         (the snapshot's: {expected})"
    )]
    Mismatch { index: usize, seq: u64, what: String, expected: String },
}

impl RoutesSnapshot {
    /// This snapshot cut into parts of which none encodes to more than `limit` bytes, in
    /// order (`live` first, then `keep`); `None` when the snapshot fits in `limit` itself.
    /// The final message then names them ([`RoutesSnapshot::naming_parts`]). A part holds at
    /// least one entry, so a `limit` smaller than one entry makes parts larger than it.
    pub fn split(&self, limit: usize) -> Option<Vec<SnapshotPart>> {
        if RouteMessage::Snapshot(self.clone()).encode().len() <= limit {
            return None;
        }
        // Parts that name HTTPRoutes are of the schema that reads them.
        let schema = self.schema.max(crate::PARTS_SCHEMA_VERSION);
        let part = |index: u32| SnapshotPart {
            schema,
            epoch: self.epoch,
            cluster: self.cluster.clone(),
            index,
            live: vec![],
            keep: vec![],
        };
        // An empty part with the widest index, and both keys with their brackets
        // (`,"live":[]`, `,"keep":[]`): what a part costs besides its entries.
        let frame = RouteMessage::SnapshotPart(part(u32::MAX)).encode().len() + 20;
        let budget = limit.saturating_sub(frame);
        let mut parts = vec![part(0)];
        let mut used = 0;
        let size = |json: Vec<u8>| json.len() + 1; // and its comma
        let entries = self
            .live
            .iter()
            .map(|l| (Some(l), None))
            .chain(self.keep.iter().map(|k| (None, Some(k))));
        for (live, keep) in entries {
            let cost = match (live, keep) {
                (Some(l), _) => size(serde_json::to_vec(l).expect("keys serialize")),
                (_, Some(k)) => size(serde_json::to_vec(k).expect("keys serialize")),
                _ => unreachable!(),
            };
            let last = parts.last_mut().expect("one part at least");
            let empty = last.live.is_empty() && last.keep.is_empty();
            if !empty && used + cost > budget {
                let index = u32::try_from(parts.len()).expect("fewer than 2^32 parts");
                parts.push(part(index));
                used = 0;
            }
            let last = parts.last_mut().expect("one part at least");
            match (live, keep) {
                (Some(l), _) => last.live.push(l.clone()),
                (_, Some(k)) => last.keep.push(k.clone()),
                _ => unreachable!(),
            }
            used += cost;
        }
        Some(parts)
    }

    /// The final message of a snapshot published in parts: the snapshot's epoch and cluster,
    /// no entries of its own, and its parts' stream sequences in order.
    pub fn naming_parts(&self, seqs: Vec<u64>) -> RoutesSnapshot {
        RoutesSnapshot {
            schema: self.schema.max(crate::PARTS_SCHEMA_VERSION),
            epoch: self.epoch,
            cluster: self.cluster.clone(),
            live: vec![],
            keep: vec![],
            parts: seqs,
        }
    }

    /// The whole snapshot from this final message and its parts, read back from the stream at
    /// the sequences it names (`None`: the stream no longer holds that one): every part's
    /// entries in order, then the final's own; the snapshot as it would have been sent whole. It is refused unless each part is there, is a
    /// part, and is this snapshot's (its epoch, its cluster, its place).
    pub fn join(
        &self,
        parts: impl IntoIterator<Item = (u64, Option<RouteMessage>)>,
    ) -> Result<RoutesSnapshot, PartsError> {
        // As it would have been sent whole.
        let schema = crate::route_schema(self.cluster.as_ref());
        let mut whole =
            RoutesSnapshot { schema, parts: vec![], live: vec![], keep: vec![], ..self.clone() };
        let mut read = parts.into_iter();
        for (index, &seq) in self.parts.iter().enumerate() {
            let part = match read.next() {
                Some((got, Some(RouteMessage::SnapshotPart(p)))) if got == seq => p,
                Some((got, Some(other))) if got == seq => {
                    let what = format!("a {} message", kind(&other));
                    return Err(PartsError::NotAPart { index, seq, what });
                }
                _ => return Err(PartsError::Missing { index, seq }),
            };
            let theirs = (part.epoch, part.cluster.as_ref(), part.index as usize);
            let ours = (self.epoch, self.cluster.as_ref(), index);
            if theirs != ours {
                let show = |(epoch, cluster, index): (u64, Option<&ClusterId>, usize)| {
                    let cluster = cluster.map_or("none", |c| c.as_str());
                    format!("epoch {epoch}, cluster {cluster}, index {index}")
                };
                let (what, expected) = (show(theirs), show(ours));
                return Err(PartsError::Mismatch { index, seq, what, expected });
            }
            whole.live.extend(part.live);
            whole.keep.extend(part.keep);
        }
        whole.live.extend(self.live.iter().cloned());
        whole.keep.extend(self.keep.iter().cloned());
        let keys = whole.live.iter().map(|(_, k)| k).chain(whole.keep.iter());
        whole.schema = crate::keys_schema(whole.cluster.as_ref(), keys);
        Ok(whole)
    }
}

/// What a route message is, as its `type` names it.
fn kind(msg: &RouteMessage) -> &'static str {
    match msg {
        RouteMessage::Event(_) => "event",
        RouteMessage::Snapshot(_) => "snapshot",
        RouteMessage::SnapshotPart(_) => "snapshot_part",
        RouteMessage::Nodes(_) => "nodes",
        RouteMessage::Confirm(_) => "confirm",
        RouteMessage::DefaultCert(_) => "default_cert",
        RouteMessage::Quarantine(_) => "quarantine",
        RouteMessage::Settings(_) => "settings",
        RouteMessage::Render(_) => "render settings",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(live: usize, keep: usize, cluster: Option<&str>) -> RoutesSnapshot {
        let cluster = cluster.map(|c| ClusterId::new(c).unwrap());
        // Names of 190 characters in dot-separated parts of at most 63.
        let name = |i: usize| {
            let part = |c: char| format!("{c}{:0>62}", i);
            format!("{}.{}.{}", part('a'), part('b'), part('c'))
        };
        let key =
            |i: usize| IngressKey::new("team-a", &name(i)).unwrap().in_cluster(cluster.as_ref());
        RoutesSnapshot {
            schema: crate::route_schema(cluster.as_ref()),
            epoch: 42,
            cluster: cluster.clone(),
            live: (0..live).map(|i| (FleetName::new("edge").unwrap(), key(i))).collect(),
            keep: (live..live + keep).map(key).collect(),
            parts: vec![],
        }
    }

    /// What the stream would hold: each part at its sequence, decoded from its bytes.
    fn stored(parts: &[SnapshotPart], first_seq: u64) -> Vec<(u64, Option<RouteMessage>)> {
        parts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let bytes = RouteMessage::SnapshotPart(p.clone()).encode();
                (first_seq + i as u64, Some(RouteMessage::decode(&bytes).unwrap()))
            })
            .collect()
    }

    #[test]
    fn a_snapshot_that_fits_is_not_split() {
        let s = snapshot(10, 2, None);
        let size = RouteMessage::Snapshot(s.clone()).encode().len();
        assert_eq!(s.split(size), None);
        assert!(s.split(size - 1).is_some());
    }

    #[test]
    fn every_part_fits_and_the_parts_join_to_the_snapshot() {
        for (live, keep, limit, cluster) in [
            (5_000, 300, 64 * 1024, None),
            (2_000, 0, 10_000, Some("east")),
            (0, 700, 8_000, None),
            (1, 1, 450, Some("east")),
        ] {
            let s = snapshot(live, keep, cluster);
            let parts = s.split(limit).expect("too large for one message");
            for p in &parts {
                let size = RouteMessage::SnapshotPart(p.clone()).encode().len();
                assert!(size <= limit, "part {} takes {size} > {limit}", p.index);
                assert!(!p.live.is_empty() || !p.keep.is_empty(), "empty part {}", p.index);
            }
            let seqs: Vec<u64> = (100..100 + parts.len() as u64).collect();
            let last = s.naming_parts(seqs);
            let last_size = RouteMessage::Snapshot(last.clone()).encode().len();
            assert!(last_size <= limit, "the final message takes {last_size}");
            let joined = last.join(stored(&parts, 100)).unwrap();
            assert_eq!(joined, s);
        }
    }

    #[test]
    fn parts_use_their_room() {
        // Not one entry per part: each part is filled up to the limit, less an entry.
        let s = snapshot(5_000, 0, None);
        let limit = 100 * 1024;
        let parts = s.split(limit).unwrap();
        let whole = RouteMessage::Snapshot(s).encode().len();
        assert!(parts.len() <= whole / limit + 2, "{} parts for {whole} bytes", parts.len());
    }

    #[test]
    fn a_missing_foreign_or_misplaced_part_refuses_the_snapshot() {
        let s = snapshot(3_000, 10, Some("east"));
        let parts = s.split(50_000).unwrap();
        assert!(parts.len() >= 3, "{}", parts.len());
        let last = s.naming_parts((1..=parts.len() as u64).collect());
        let good = stored(&parts, 1);

        let mut gone = good.clone();
        gone[1].1 = None;
        assert_eq!(last.join(gone), Err(PartsError::Missing { index: 1, seq: 2 }));
        assert!(matches!(last.join(good[..2].to_vec()), Err(PartsError::Missing { index: 2, .. })));

        let mut other = good.clone();
        other[0].1 = Some(RouteMessage::Snapshot(s.clone()));
        assert!(matches!(last.join(other), Err(PartsError::NotAPart { index: 0, .. })));

        let mut older = parts.clone();
        older[2].epoch = 41;
        let e = last.join(stored(&older, 1)).unwrap_err();
        assert!(e.to_string().contains("epoch 41"), "{e}");

        let mut west = parts.clone();
        west[0].cluster = Some(ClusterId::new("west").unwrap());
        assert!(matches!(last.join(stored(&west, 1)), Err(PartsError::Mismatch { index: 0, .. })));

        let mut swapped = parts.clone();
        swapped.swap(0, 1);
        assert!(matches!(
            last.join(stored(&swapped, 1)),
            Err(PartsError::Mismatch { index: 0, .. })
        ));
    }

    #[test]
    fn parts_and_the_final_message_are_refused_by_a_reader_of_schema_4() {
        // A renderer that reads up to schema 4 parks them: it must not take the final message
        // for an empty snapshot and sweep every Ingress.
        let s = snapshot(2_000, 0, None);
        let parts = s.split(20_000).unwrap();
        let last = RouteMessage::Snapshot(s.naming_parts(vec![1, 2]));
        for msg in [RouteMessage::SnapshotPart(parts[0].clone()), last] {
            let bytes = msg.encode();
            let err = crate::messages::check_schema_first(&bytes, 1, 4).unwrap_err();
            assert!(err.to_string().contains("schema 5"), "{err}");
            assert_eq!(RouteMessage::decode(&bytes).unwrap(), msg);
        }
    }
}
