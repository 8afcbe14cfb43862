//! Checkpoints of the desired state: every fleet's Ingresses as they stood after one routes
//! stream sequence, with each fleet's newest version number. Pure: encoding and the choices of
//! which checkpoint to start from and which to drop; `bus` stores them in the object store.
//!
//! They keep replay true under bounded retention: once the routes stream has dropped its oldest
//! messages, the state at a point is the newest checkpoint at or before it plus the messages
//! after that checkpoint, which the stream still holds. A renderer started on an empty store
//! starts from the newest checkpoint for the same reason, and numbers its versions above the
//! checkpoint's.

use crate::core::state::{Desired, IngressEntry};
use hafleet_proto::{ClusterId, FleetName, IngressKey, NodeAddr};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of the checkpoint encoding.
pub const CHECKPOINT_SCHEMA: u32 = 1;

/// The desired state after routes stream sequence `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub schema: u32,
    /// The last routes stream sequence applied.
    pub seq: u64,
    /// When the routes stream was created: a checkpoint of another stream means nothing.
    pub routes_stream_created: String,
    pub created_unix_ms: u64,
    /// Each fleet's newest version number, so that numbering continues above it.
    pub latest: BTreeMap<FleetName, u64>,
    /// Every fleet's Ingresses (pairs: JSON object keys must be strings).
    pub fleets: Vec<(FleetName, Vec<(IngressKey, IngressEntry)>)>,
    /// The nodes routes went to (absent in checkpoints of builds whose route messages listed
    /// servers themselves): those of watchers without a cluster id.
    #[serde(default)]
    pub nodes: Vec<NodeAddr>,
    /// The newest watcher epoch seen (0 in checkpoints of builds that did not fence), of
    /// watchers without a cluster id.
    #[serde(default)]
    pub epoch: u64,
    /// The nodes and newest watcher epoch of each named cluster (`--cluster-id`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterPart>,
    /// The sweeps held back by the guard (pairs, as `fleets`; each names its cluster).
    #[serde(default)]
    pub held: Vec<(FleetName, hafleet_proto::HeldSweep)>,
    /// Each fleet's default certificate (pairs, as `fleets`).
    #[serde(default)]
    pub default_certs: Vec<(FleetName, hafleet_proto::SealedCert)>,
    /// Each fleet's settings where they are not the defaults (pairs, as `fleets`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub settings: Vec<(FleetName, hafleet_proto::FleetSettings)>,
    /// The renderer's settings at this point (absent in checkpoints of builds before they
    /// went into the stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub render: Option<hafleet_proto::RenderSettings>,
}

/// What a checkpoint keeps of a named cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterPart {
    pub cluster: ClusterId,
    #[serde(default)]
    pub nodes: Vec<NodeAddr>,
    #[serde(default)]
    pub epoch: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint does not decompress")]
    Compression(#[source] std::io::Error),
    #[error("checkpoint does not decode")]
    Json(#[from] serde_json::Error),
    #[error("checkpoint schema {0} is not known to this build (it reads {CHECKPOINT_SCHEMA})")]
    Schema(u32),
}

impl Checkpoint {
    pub fn new(
        seq: u64,
        routes_stream_created: String,
        created_unix_ms: u64,
        latest: BTreeMap<FleetName, u64>,
        desired: &Desired,
    ) -> Self {
        let fleets = desired
            .fleets
            .iter()
            .map(|(f, ingresses)| {
                (f.clone(), ingresses.iter().map(|(k, e)| (k.clone(), e.clone())).collect())
            })
            .collect();
        let clusters: std::collections::BTreeSet<ClusterId> =
            (desired.nodes.keys()).chain(desired.epochs.keys()).filter_map(|c| c.clone()).collect();
        Checkpoint {
            schema: CHECKPOINT_SCHEMA,
            seq,
            routes_stream_created,
            created_unix_ms,
            latest,
            fleets,
            nodes: desired.nodes.get(&None).cloned().unwrap_or_default(),
            epoch: desired.epoch(None),
            clusters: clusters
                .into_iter()
                .map(|cluster| ClusterPart {
                    nodes: desired.nodes.get(&Some(cluster.clone())).cloned().unwrap_or_default(),
                    epoch: desired.epoch(Some(&cluster)),
                    cluster,
                })
                .collect(),
            held: desired.held.iter().map(|((f, _), h)| (f.clone(), h.clone())).collect(),
            default_certs: desired
                .default_certs
                .iter()
                .map(|(f, c)| (f.clone(), c.clone()))
                .collect(),
            settings: desired.settings.iter().map(|(f, s)| (f.clone(), s.clone())).collect(),
            render: desired.render.clone(),
        }
    }

    pub fn desired(&self) -> Desired {
        Desired {
            fleets: self
                .fleets
                .iter()
                .map(|(f, ingresses)| (f.clone(), ingresses.iter().cloned().collect()))
                .collect(),
            // Nothing kept for the unnamed cluster when it has nothing: as a store that never
            // heard of it.
            nodes: std::iter::once((None, self.nodes.clone()))
                .filter(|(_, n)| !n.is_empty())
                .chain(self.clusters.iter().map(|c| (Some(c.cluster.clone()), c.nodes.clone())))
                .collect(),
            epochs: std::iter::once((None, self.epoch))
                .filter(|(_, e)| *e > 0)
                .chain(self.clusters.iter().map(|c| (Some(c.cluster.clone()), c.epoch)))
                .collect(),
            held: self
                .held
                .iter()
                .map(|(f, h)| ((f.clone(), h.cluster.clone()), h.clone()))
                .collect(),
            default_certs: self.default_certs.iter().cloned().collect(),
            settings: self.settings.iter().cloned().collect(),
            render: self.render.clone(),
        }
    }

    /// JSON, zstd-compressed: route state repeats itself and shrinks about tenfold.
    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("checkpoints serialize");
        zstd::encode_all(json.as_slice(), 3).expect("compressing into memory cannot fail")
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, CheckpointError> {
        let json = zstd::decode_all(bytes).map_err(CheckpointError::Compression)?;
        let c: Checkpoint = serde_json::from_slice(&json)?;
        if c.schema != CHECKPOINT_SCHEMA {
            return Err(CheckpointError::Schema(c.schema));
        }
        Ok(c)
    }
}

/// Object name of the checkpoint after `seq`; zero-padded so that names sort as numbers.
pub fn object_name(seq: u64) -> String {
    format!("routes-{seq:020}")
}

/// The sequence a checkpoint object's name stands for.
pub fn parse_object_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("routes-")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Where a replay to `until` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    /// From nothing: the stream still holds its first message.
    Empty,
    /// From the checkpoint after this sequence.
    Checkpoint(u64),
}

/// The state at `until` cannot be rebuilt: the stream no longer holds the messages before it
/// and no checkpoint bridges the gap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "sequence {until} is older than the kept history: the routes stream starts at sequence \
     {first_seq}{}",
    match oldest_checkpoint { Some(c) => format!(" and the oldest checkpoint is after sequence {c}"), None => " and there is no checkpoint".to_owned() }
)]
pub struct TooOld {
    pub until: u64,
    pub first_seq: u64,
    pub oldest_checkpoint: Option<u64>,
}

/// The best base for replaying to `until`: the newest checkpoint at or before it from which
/// every later message is still in the stream (whose first sequence is `first_seq`), else the
/// empty state if the stream still starts at its beginning.
pub fn base_for(checkpoints: &[u64], until: u64, first_seq: u64) -> Result<Base, TooOld> {
    let usable = |c: u64| c <= until && (c + 1 >= first_seq || c == until);
    match checkpoints.iter().copied().filter(|c| usable(*c)).max() {
        Some(c) => Ok(Base::Checkpoint(c)),
        None if first_seq <= 1 => Ok(Base::Empty),
        None => {
            Err(TooOld { until, first_seq, oldest_checkpoint: checkpoints.iter().min().copied() })
        }
    }
}

/// Checkpoints that can no longer serve any replay: those more than one sequence before the
/// stream's first kept message (the messages after them are gone). The newest checkpoint is
/// always kept: a renderer on an empty store starts from it.
pub fn prunable(checkpoints: &[u64], first_seq: u64) -> Vec<u64> {
    let newest = checkpoints.iter().copied().max();
    checkpoints.iter().copied().filter(|c| c + 1 < first_seq && Some(*c) != newest).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_round_trips_compressed() {
        let fleet = FleetName::new("edge").unwrap();
        let mut desired = Desired::new();
        let entry = IngressEntry {
            created_unix: 1,
            resource_version: "9".into(),
            routes: Default::default(),
            seq: 4,
            tls: Vec::new(),
            quarantined: None,
        };
        desired
            .fleets
            .entry(fleet.clone())
            .or_default()
            .insert(IngressKey::new("shop", "web").unwrap(), entry);
        let n1 = NodeAddr {
            name: hafleet_proto::ObjectName::new("n1").unwrap(),
            addr: "10.0.0.1".parse().unwrap(),
        };
        desired.nodes.insert(None, vec![n1.clone()]);
        // A named cluster's part: an Ingress of the same name, nodes, an epoch, a held sweep.
        let east = hafleet_proto::ClusterId::new("east").unwrap();
        let theirs = IngressKey::new("shop", "web").unwrap().in_cluster(Some(&east));
        let entry = desired.fleets[&fleet].values().next().cloned().unwrap();
        desired.fleets.get_mut(&fleet).unwrap().insert(theirs.clone(), entry);
        desired.nodes.insert(Some(east.clone()), vec![n1]);
        desired.epochs.insert(Some(east.clone()), 3);
        let hold = hafleet_proto::HeldSweep {
            snapshot_seq: 39,
            epoch: 3,
            since_unix_ms: 1,
            ingresses: vec![(theirs, 1)],
            fleet_routes: 1,
            cluster: Some(east.clone()),
        };
        desired.held.insert((fleet.clone(), Some(east)), hold);
        let latest = BTreeMap::from([(fleet, 12)]);
        let c = Checkpoint::new(40, "t".into(), 5, latest, &desired);
        let bytes = c.encode();
        assert_eq!(&bytes[..4], &[0x28, 0xb5, 0x2f, 0xfd], "a zstd frame");
        let back = Checkpoint::decode(&bytes).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.desired(), desired);
        assert!(Checkpoint::decode(b"{}").is_err());
    }

    #[test]
    fn names_sort_as_numbers_and_parse_back() {
        assert!(object_name(9) < object_name(10));
        assert_eq!(parse_object_name(&object_name(12345)), Some(12345));
        assert_eq!(parse_object_name("routes-12"), None);
        assert_eq!(parse_object_name("edge-abc"), None);
    }

    #[test]
    fn replay_starts_from_the_newest_usable_checkpoint_or_refuses() {
        // The whole stream is kept: no checkpoint needed, but the newest one before is faster.
        assert_eq!(base_for(&[], 50, 1), Ok(Base::Empty));
        assert_eq!(base_for(&[10, 40, 60], 50, 1), Ok(Base::Checkpoint(40)));
        // Messages 1..=30 are gone: 40 bridges, 10 does not.
        assert_eq!(base_for(&[10, 40], 50, 31), Ok(Base::Checkpoint(40)));
        assert_eq!(base_for(&[10, 30], 50, 31), Ok(Base::Checkpoint(30)));
        // A point a checkpoint holds exactly is served even when its messages are gone.
        assert_eq!(base_for(&[10, 40], 10, 31), Ok(Base::Checkpoint(10)));
        assert_eq!(
            base_for(&[10, 40], 20, 31),
            Err(TooOld { until: 20, first_seq: 31, oldest_checkpoint: Some(10) })
        );
        let e = base_for(&[], 5, 31).unwrap_err().to_string();
        assert!(e.contains("starts at sequence 31 and there is no checkpoint"), "{e}");
    }

    #[test]
    fn only_checkpoints_before_the_kept_stream_are_dropped_and_never_the_newest() {
        assert_eq!(prunable(&[10, 20, 40], 31), [10, 20]);
        assert_eq!(prunable(&[10, 30, 40], 31), [10]);
        assert_eq!(prunable(&[10, 20], 100), [10], "the newest stays for restarts");
        assert!(prunable(&[10, 20], 1).is_empty());
    }
}
