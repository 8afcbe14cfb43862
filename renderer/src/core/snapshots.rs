//! Snapshots published in parts ([`hafleet_proto::parts`]), made whole before they are applied.
//!
//! ```text
//! SnapshotPart … SnapshotPart … Snapshot { parts: [seq, seq, …] }
//!      │ applied as nothing          │ each part read back by sequence (from the batch in
//!      │ (their stream sequences     │ hand, else the routes stream), checked, joined
//!      ▼  still count as applied)    ▼ ──▶ state::apply, as one whole snapshot
//! ```
//! The run loop and replay share this, each with its own way to read a message by sequence,
//! so both rebuild the same state from the same stream.

use bytes::Bytes;
use hafleet_proto::{PartsError, RouteMessage};

/// `msg` as [`crate::core::state::apply`] takes it: as it is, unless it is a snapshot in parts,
/// which is joined from the parts `read` returns by stream sequence (`None`: no longer in the
/// stream). `Ok(Err(_))` when its parts do not make it whole: it must not be applied (a partial
/// snapshot would sweep what its missing parts name). `Err` only when `read` fails.
pub async fn whole<E>(
    msg: RouteMessage,
    mut read: impl AsyncFnMut(u64) -> Result<Option<Bytes>, E>,
) -> Result<Result<RouteMessage, PartsError>, E> {
    let RouteMessage::Snapshot(last) = msg else { return Ok(Ok(msg)) };
    if last.parts.is_empty() {
        return Ok(Ok(RouteMessage::Snapshot(last)));
    }
    let mut parts = Vec::with_capacity(last.parts.len());
    for (index, &seq) in last.parts.iter().enumerate() {
        let part = match read(seq).await? {
            None => None,
            Some(bytes) => match RouteMessage::decode(&bytes) {
                Ok(m) => Some(m),
                Err(e) => return Ok(Err(PartsError::NotAPart { index, seq, what: e.to_string() })),
            },
        };
        parts.push((seq, part));
    }
    Ok(last.join(parts).map(RouteMessage::Snapshot))
}

/// The payload at `seq` among `entries` (sorted by sequence), if there.
pub fn in_batch(entries: &[(u64, Bytes)], seq: u64) -> Option<Bytes> {
    entries.binary_search_by_key(&seq, |(s, _)| *s).ok().map(|i| entries[i].1.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hafleet_proto::{FleetName, IngressKey, RoutesSnapshot, SCHEMA_VERSION};
    use std::collections::BTreeMap;

    fn snapshot() -> RoutesSnapshot {
        let edge = FleetName::new("edge").unwrap();
        RoutesSnapshot {
            schema: SCHEMA_VERSION,
            epoch: 9,
            cluster: None,
            live: (0..400)
                .map(|i| (edge.clone(), IngressKey::new("default", &format!("i{i}")).unwrap()))
                .collect(),
            keep: vec![IngressKey::new("default", "kept").unwrap()],
            parts: vec![],
        }
    }

    /// A stream holding `s` in parts from sequence 10, and the final message after them.
    fn stream_of(s: &RoutesSnapshot) -> (BTreeMap<u64, Bytes>, RouteMessage) {
        let parts = s.split(2_000).expect("in parts");
        let mut stream = BTreeMap::new();
        for (i, p) in parts.into_iter().enumerate() {
            stream.insert(10 + i as u64, Bytes::from(RouteMessage::SnapshotPart(p).encode()));
        }
        let last = RouteMessage::Snapshot(s.naming_parts(stream.keys().copied().collect()));
        (stream, last)
    }

    #[tokio::test]
    async fn a_snapshot_in_parts_is_joined_from_what_the_stream_holds() {
        let s = snapshot();
        let (stream, last) = stream_of(&s);
        let got = whole(last, async |seq| Ok::<_, ()>(stream.get(&seq).cloned())).await;
        assert_eq!(got, Ok(Ok(RouteMessage::Snapshot(s))));
    }

    #[tokio::test]
    async fn a_part_gone_or_unreadable_leaves_the_snapshot_unapplied() {
        let s = snapshot();
        let (mut stream, last) = stream_of(&s);
        let second = *stream.keys().nth(1).unwrap();
        stream.insert(second, Bytes::from_static(b"junk"));
        let got = whole(last.clone(), async |seq| Ok::<_, ()>(stream.get(&seq).cloned())).await;
        assert!(matches!(got, Ok(Err(PartsError::NotAPart { index: 1, .. }))), "{got:?}");
        stream.remove(&second);
        let got = whole(last.clone(), async |seq| Ok::<_, ()>(stream.get(&seq).cloned())).await;
        assert!(matches!(got, Ok(Err(PartsError::Missing { index: 1, .. }))), "{got:?}");
        // A failed read is not a verdict: the caller tries again.
        assert_eq!(whole(last, async |_| Err::<Option<Bytes>, _>("down")).await, Err("down"));
    }

    #[tokio::test]
    async fn other_messages_pass_unread() {
        let s = snapshot();
        let unread = async |_| -> Result<Option<Bytes>, ()> { panic!("read") };
        let got = whole(RouteMessage::Snapshot(s.clone()), unread).await;
        assert_eq!(got, Ok(Ok(RouteMessage::Snapshot(s))));
    }

    /// The parts and the joined final message leave the state exactly as the snapshot sent
    /// whole would: what replay and the run loop rebuild does not depend on how it was sent.
    #[tokio::test]
    async fn parts_then_the_joined_snapshot_sweep_as_the_whole_one() {
        use crate::core::state::{Applied, Desired, SweepGuard, apply};
        let edge = FleetName::new("edge").unwrap();
        let mut before = Desired::new();
        let mut out = Applied::default();
        // i0..i449 exist; the snapshot names i0..i399 and `kept`: i400..i449 go.
        for (seq, i) in (1..).zip(0..450) {
            let event = RouteMessage::Event(hafleet_proto::RouteEvent {
                schema: SCHEMA_VERSION,
                fleet: edge.clone(),
                ingress: IngressKey::new("default", &format!("i{i}")).unwrap(),
                created_unix: 1,
                resource_version: "1".into(),
                change: hafleet_proto::RouteChange::Upsert { routes: vec![], tls: vec![] },
                epoch: 9,
            });
            apply(&mut before, seq, &event, &SweepGuard::default(), &mut out);
        }
        let guard = SweepGuard { percent: 100, min_routes: 0 };
        let s = snapshot();
        let mut whole_sent = before.clone();
        apply(&mut whole_sent, 1000, &RouteMessage::Snapshot(s.clone()), &guard, &mut out);
        assert_eq!(whole_sent.ingresses(&edge).len(), 400);

        let (stream, last) = stream_of(&s);
        let mut in_parts = before.clone();
        for (seq, bytes) in &stream {
            let part = RouteMessage::decode(bytes).unwrap();
            apply(&mut in_parts, *seq, &part, &guard, &mut out);
        }
        assert_eq!(in_parts, before, "a part changes nothing by itself");
        let joined = whole(last, async |seq| Ok::<_, ()>(stream.get(&seq).cloned())).await;
        apply(&mut in_parts, 1000, &joined.unwrap().unwrap(), &guard, &mut out);
        assert_eq!(in_parts, whole_sent);
    }

    #[test]
    fn a_part_in_the_batch_is_found_by_sequence() {
        let entries = vec![(3, Bytes::from_static(b"a")), (5, Bytes::from_static(b"b"))];
        assert_eq!(in_batch(&entries, 5), Some(Bytes::from_static(b"b")));
        assert_eq!(in_batch(&entries, 4), None);
    }
}
