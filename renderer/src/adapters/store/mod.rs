//! sled adapter: desired state, config versions, and how far the routes stream was applied.
//!
//! ```text
//! ingresses: <fleet> 0x00 <namespace> 0x00 <name>  -> IngressEntry (JSON)
//! versions:  <fleet> 0x00 <version: u64 BE>         -> ConfigVersion (JSON)
//! summaries: <fleet> 0x00 <version: u64 BE>         -> VersionSummary (JSON): what `history
//!                                                      list` reads, without decoding configs
//! certs:     <certificate id>                       -> SealedCert (JSON): each once, named by
//!                                                      the versions that carry it ([`certs`])
//! meta:      "applied_seq"                          -> u64 BE: last routes-stream sequence applied
//!            "published" 0x00 <fleet>               -> u64 BE: last version published to NATS
//!            "routes_stream_created"                -> when the routes stream followed was created
//!            "pinned" 0x00 <fleet>                  -> u64 BE: the rollback the fleet is pinned to
//!            "floor" 0x00 <fleet>                   -> u64 BE: numbers a restored fleet stays above
//!            "resumed" 0x00 <fleet>                 -> (empty): an operator resumed the fleet, so
//!                                                      the guard of a rebuilt state is done with it
//! ```
//! Versions are stored as zstd-compressed JSON: one in [`KEYFRAME_EVERY`] of a fleet whole (a
//! keyframe), the others as a zstd frame compressed against the JSON of the fleet's last
//! keyframe (zstd's "patch from" mode: the keyframe is the window every match can refer to),
//! each behind a header naming its keyframe. A version is one change apart from the one
//! before, so at 10,000 Ingresses on 200 nodes a delta takes a few kB where the whole version
//! takes about 1 MB; reading one costs at most two decompressions. Records written as plain JSON
//! or whole zstd frames by earlier builds are still read, and serve as keyframes.
//! A batch's state writes, its new versions and its `applied_seq` commit in one transaction, so
//! after a crash the store is either before or after the batch, never in between.

use crate::core::state::{Desired, IngressEntry, StateWrite};
use hafleet_proto::{ConfigVersion, FleetName, IngressKey, VersionSummary};
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError};
use std::collections::HashMap;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the state store at {path}")]
    Open { path: String, source: sled::Error },
    #[error("state store I/O failed")]
    Io(#[from] sled::Error),
    #[error("state store holds a record that does not decode: {key}")]
    Corrupt { key: String, source: serde_json::Error },
    #[error("state store's version {key} names certificate {id}, which it does not hold")]
    MissingCert { key: String, id: String },
}

impl From<TransactionError<StoreError>> for StoreError {
    fn from(e: TransactionError<StoreError>) -> Self {
        match e {
            TransactionError::Abort(e) => e,
            TransactionError::Storage(e) => StoreError::Io(e),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Store {
    db: sled::Db,
    ingresses: sled::Tree,
    versions: sled::Tree,
    summaries: sled::Tree,
    meta: sled::Tree,
    certs: sled::Tree,
    /// The ids the `certs` tree holds, listed at the first commit that needs them: a version
    /// stores only the certificates new to the store.
    stored_certs: std::sync::Arc<std::sync::Mutex<Option<std::collections::HashSet<String>>>>,
    /// Per fleet: its last keyframe's number and JSON, which its next versions are deltas to.
    keyframes: std::sync::Arc<std::sync::Mutex<HashMap<FleetName, Keyframe>>>,
    /// Per fleet: the newest version committed, as it was given. Publishing reads it right
    /// after the commit; at 10,000 certificates reading it back from the store (decompressing
    /// and parsing 15 MB of JSON) took about a third of the time between render and publish.
    /// Versions are only ever written by [`Store::commit`], so it is what the store holds.
    newest: std::sync::Arc<std::sync::Mutex<HashMap<FleetName, ConfigVersion>>>,
}

/// A fleet's last keyframe: its number and JSON.
type Keyframe = (u64, std::sync::Arc<Vec<u8>>);

/// A fleet's versions are stored whole once in this many (and when it has none yet), as deltas
/// against the last whole one in between.
pub const KEYFRAME_EVERY: u64 = 64;

/// A delta larger than this (and than [`DELTA_SHARE`] of its version) is stored whole instead,
/// as a new keyframe: the fleet has grown away from its keyframe (a first version with a few
/// Ingresses, then 10,000 created), and every delta until the next keyframe would carry the
/// difference again (7.7 MB of 15 MB each at 10,000 certificates, written at every change).
const DELTA_MAX: usize = 256 * 1024;

/// See [`DELTA_MAX`]: a delta over 1/32 of its version's JSON.
const DELTA_SHARE: usize = 32;

/// What a stored delta starts with, then its keyframe's number (u64 BE), then a zstd frame.
const DELTA_MAGIC: [u8; 4] = *b"hfd1";

/// zstd's level for versions: level 1 keeps one change cheap, and deltas are small anyway.
const LEVEL: i32 = 1;

/// The window a delta of `json` against `base` needs: both must fit, so that every byte of the
/// keyframe can be referred to. zstd accepts 2^10 to 2^31 (64-bit).
fn window_log(base: &[u8], json: &[u8]) -> u32 {
    let need = (base.len() + json.len()).max(1 << 10);
    (usize::BITS - (need - 1).leading_zeros()).clamp(10, 31)
}

/// `json` as a delta against the keyframe `base` (number `base_no`).
fn compress_delta(json: &[u8], base_no: u64, base: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write as _;
    let mut out = Vec::with_capacity(json.len() / 64 + 64);
    out.extend_from_slice(&DELTA_MAGIC);
    out.extend_from_slice(&base_no.to_be_bytes());
    let mut encoder = zstd::stream::write::Encoder::with_ref_prefix(&mut out, LEVEL, base)?;
    encoder.window_log(window_log(base, json))?;
    encoder.long_distance_matching(true)?;
    encoder.write_all(json)?;
    encoder.finish()?;
    Ok(out)
}

/// The JSON of a delta's body (`frame`, after the header) against its keyframe's JSON.
fn decompress_delta(frame: &[u8], base: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut decoder = zstd::stream::read::Decoder::with_ref_prefix(frame, base)?;
    decoder.window_log_max(31)?;
    let mut json = Vec::new();
    decoder.read_to_end(&mut json)?;
    Ok(json)
}

const APPLIED_SEQ: &[u8] = b"applied_seq";
const ROUTES_CREATED: &[u8] = b"routes_stream_created";
/// The node set, as JSON.
const NODES: &[u8] = b"nodes";
/// The newest watcher epoch seen (big-endian u64).
const EPOCH: &[u8] = b"epoch";
/// The sweeps held back by the guard (JSON: pairs of fleet and hold).
const HELD: &[u8] = b"held-sweeps";
/// Each fleet's default certificate (JSON: pairs of fleet and sealed certificate).
const DEFAULT_CERTS: &[u8] = b"default-certs";
/// Every fleet's settings (JSON pairs), where they are not the defaults.
const SETTINGS: &[u8] = b"settings";
const RENDER: &[u8] = b"render-settings";

fn join(parts: &[&str]) -> Vec<u8> {
    parts.join("\0").into_bytes()
}

/// An Ingress's row: `fleet\0namespace\0name`, and `\0cluster` for one of a named cluster.
fn ingress_row(fleet: &FleetName, key: &IngressKey) -> Vec<u8> {
    let mut parts = vec![fleet.as_str(), key.namespace.as_str(), key.name.as_str()];
    parts.extend(key.cluster.as_ref().map(|c| c.as_str()));
    join(&parts)
}

/// Where a cluster's nodes, or its newest epoch (`what`: [`NODES`] or [`EPOCH`]), are kept:
/// `what` itself for watchers without a cluster id, `what\0cluster` for a named one.
fn cluster_key(what: &[u8], cluster: &Option<hafleet_proto::ClusterId>) -> Vec<u8> {
    let mut key = what.to_vec();
    if let Some(c) = cluster {
        key.push(0);
        key.extend_from_slice(c.as_str().as_bytes());
    }
    key
}

/// The clusters kept under `what` ([`cluster_key`]) and their values.
fn by_cluster(
    meta: &sled::Tree,
    what: &[u8],
) -> Result<Vec<(Option<hafleet_proto::ClusterId>, sled::IVec)>, StoreError> {
    let mut all: Vec<_> = meta.get(what)?.map(|v| (None, v)).into_iter().collect();
    let mut prefix = what.to_vec();
    prefix.push(0);
    for item in meta.scan_prefix(&prefix) {
        let (key, value) = item?;
        let name = String::from_utf8_lossy(&key[prefix.len()..]).into_owned();
        if let Ok(cluster) = hafleet_proto::ClusterId::new(name) {
            all.push((Some(cluster), value));
        }
    }
    Ok(all)
}

fn version_key(fleet: &FleetName, version: u64) -> Vec<u8> {
    let mut key = join(&[fleet.as_str(), ""]);
    key.extend_from_slice(&version.to_be_bytes());
    key
}

fn pinned_key(fleet: &FleetName) -> Vec<u8> {
    join(&["pinned", fleet.as_str()])
}

fn published_key(fleet: &FleetName) -> Vec<u8> {
    join(&["published", fleet.as_str()])
}

fn be_u64(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    buf.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(buf)
}

fn resumed_key(fleet: &FleetName) -> Vec<u8> {
    join(&["resumed", fleet.as_str()])
}

fn floor_key(fleet: &FleetName) -> Vec<u8> {
    join(&["floor", fleet.as_str()])
}

/// The first bytes of every zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

fn decode<T: serde::de::DeserializeOwned>(key: &[u8], value: &[u8]) -> Result<T, StoreError> {
    let corrupt = |source| StoreError::Corrupt {
        key: String::from_utf8_lossy(key).replace('\0', "/"),
        source,
    };
    if value.starts_with(&ZSTD_MAGIC) {
        let json = zstd::decode_all(value).map_err(|e| corrupt(serde_json::Error::io(e)))?;
        return serde_json::from_slice(&json).map_err(corrupt);
    }
    serde_json::from_slice(value).map_err(corrupt)
}

/// A version as stored whole: its JSON, compressed.
fn compress(json: &[u8]) -> Vec<u8> {
    zstd::encode_all(json, LEVEL).expect("compressing into memory cannot fail")
}

/// The JSON of a record stored whole: compressed, or plain as earlier builds wrote it.
fn whole_json(value: &[u8]) -> std::io::Result<Vec<u8>> {
    if value.starts_with(&ZSTD_MAGIC) { zstd::decode_all(value) } else { Ok(value.to_vec()) }
}

impl Store {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = sled::open(path)
            .map_err(|source| StoreError::Open { path: path.display().to_string(), source })?;
        Ok(Store {
            ingresses: db.open_tree("ingresses")?,
            versions: db.open_tree("versions")?,
            summaries: db.open_tree("summaries")?,
            meta: db.open_tree("meta")?,
            certs: db.open_tree("certs")?,
            stored_certs: Default::default(),
            keyframes: Default::default(),
            newest: Default::default(),
            db,
        })
    }

    /// The JSON of the version stored at `key` as `value`, through its keyframe when it is a
    /// delta. `base` keeps the last keyframe read, for the next call.
    fn version_json(
        &self,
        key: &[u8],
        value: &[u8],
        base: &mut Option<Keyframe>,
    ) -> Result<Vec<u8>, StoreError> {
        let corrupt = |e: std::io::Error| StoreError::Corrupt {
            key: String::from_utf8_lossy(key).replace('\0', "/"),
            source: serde_json::Error::io(e),
        };
        if !value.starts_with(&DELTA_MAGIC) {
            return whole_json(value).map_err(corrupt);
        }
        if value.len() < 12 || key.len() < 8 {
            return Err(corrupt(std::io::Error::other("a delta without its header")));
        }
        let number = be_u64(&value[4..12]);
        // The keyframe a fleet's new versions refer to is kept in memory: reading back a
        // version just committed (to publish it) does not read and decompress it again.
        if base.as_ref().is_none_or(|(n, _)| *n != number) {
            let fleet = String::from_utf8_lossy(&key[..key.len().saturating_sub(9)]);
            let all = self.keyframes.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(kept) = FleetName::new(fleet.into_owned()).ok().and_then(|f| all.get(&f))
                && kept.0 == number
            {
                *base = Some(kept.clone());
            }
        }
        let keyframe = match base {
            Some((n, json)) if *n == number => std::sync::Arc::clone(json),
            _ => {
                let base_key = [&key[..key.len() - 8], &number.to_be_bytes()[..]].concat();
                let raw = self.versions.get(&base_key)?.ok_or_else(|| {
                    corrupt(std::io::Error::other(format!("keyframe {number} is missing")))
                })?;
                if raw.starts_with(&DELTA_MAGIC) {
                    let why = format!("keyframe {number} is itself a delta");
                    return Err(corrupt(std::io::Error::other(why)));
                }
                let json = std::sync::Arc::new(whole_json(&raw).map_err(corrupt)?);
                *base = Some((number, std::sync::Arc::clone(&json)));
                json
            }
        };
        decompress_delta(&value[12..], &keyframe).map_err(corrupt)
    }

    /// The version stored at `key` as `value` ([`Store::version_json`]).
    fn decode_version(
        &self,
        key: &[u8],
        value: &[u8],
        base: &mut Option<Keyframe>,
    ) -> Result<ConfigVersion, StoreError> {
        let json = self.version_json(key, value, base)?;
        let name = || String::from_utf8_lossy(key).replace('\0', "/");
        let by_id = |id: &str| match self.certs.get(id.as_bytes())? {
            Some(raw) => decode(id.as_bytes(), &raw),
            None => Err(StoreError::MissingCert { key: name(), id: id.to_owned() }),
        };
        certs::join(&json, by_id).map_err(|source| StoreError::Corrupt { key: name(), source })?
    }

    /// The keyframe `fleet`'s next version is a delta to: the last one its newest stored
    /// version refers to (or is). `None` when it has no version yet.
    fn keyframe(&self, fleet: &FleetName) -> Result<Option<Keyframe>, StoreError> {
        if let Some(kept) = self.keyframes.lock().unwrap_or_else(|p| p.into_inner()).get(fleet) {
            return Ok(Some(kept.clone()));
        }
        // Not locked while reading: reading a delta looks at the kept keyframes too.
        let prefix = join(&[fleet.as_str(), ""]);
        let Some(item) = self.versions.scan_prefix(&prefix).next_back() else { return Ok(None) };
        let (key, value) = item?;
        let mut base = None;
        let json = self.version_json(&key, &value, &mut base)?;
        let found = match base {
            Some(keyframe) => keyframe,
            None => (be_u64(&key[key.len() - 8..]), std::sync::Arc::new(json)),
        };
        let mut all = self.keyframes.lock().unwrap_or_else(|p| p.into_inner());
        all.insert(fleet.clone(), found.clone());
        Ok(Some(found))
    }

    /// When the routes stream this store follows was created, as recorded the first time.
    pub fn routes_stream_created(&self) -> Result<Option<String>, StoreError> {
        Ok(self.meta.get(ROUTES_CREATED)?.map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    pub fn set_routes_stream_created(&self, created: &str) -> Result<(), StoreError> {
        self.meta.insert(ROUTES_CREATED, created.as_bytes())?;
        self.db.flush()?;
        Ok(())
    }

    /// The last routes-stream sequence whose effect is stored.
    pub fn applied_seq(&self) -> Result<u64, StoreError> {
        Ok(self.meta.get(APPLIED_SEQ)?.map(|v| be_u64(&v)).unwrap_or(0))
    }

    /// Every fleet's Ingresses.
    pub fn desired(&self) -> Result<Desired, StoreError> {
        let mut desired = Desired::new();
        for item in self.ingresses.iter() {
            let (key, value) = item?;
            let text = String::from_utf8_lossy(&key).into_owned();
            let mut parts = text.split('\0');
            let (Some(fleet), Some(ns), Some(name)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let cluster = match parts.next().map(hafleet_proto::ClusterId::new) {
                Some(Ok(c)) => Some(c),
                Some(Err(_)) => continue,
                None => None,
            };
            let (Ok(fleet), Ok(ingress)) = (FleetName::new(fleet), IngressKey::new(ns, name))
            else {
                continue;
            };
            let ingress = ingress.in_cluster(cluster.as_ref());
            let entry: IngressEntry = decode(&key, &value)?;
            desired.fleets.entry(fleet).or_default().insert(ingress, entry);
        }
        // Fleets whose every Ingress is gone still have versions (or, restored, a floor) and
        // must still be rendered.
        for fleet in self.fleets_with_versions()?.into_iter().chain(self.floored_fleets()?) {
            desired.fleets.entry(fleet).or_default();
        }
        for (cluster, epoch) in by_cluster(&self.meta, EPOCH)? {
            desired.epochs.insert(cluster, be_u64(&epoch));
        }
        for (cluster, nodes) in by_cluster(&self.meta, NODES)? {
            desired.nodes.insert(cluster, decode(NODES, &nodes)?);
        }
        if let Some(held) = self.meta.get(HELD)? {
            let pairs: Vec<(FleetName, hafleet_proto::HeldSweep)> = decode(HELD, &held)?;
            desired.held = pairs.into_iter().map(|(f, h)| ((f, h.cluster.clone()), h)).collect();
        }
        if let Some(certs) = self.meta.get(DEFAULT_CERTS)? {
            let pairs: Vec<(FleetName, hafleet_proto::SealedCert)> = decode(DEFAULT_CERTS, &certs)?;
            desired.default_certs = pairs.into_iter().collect();
        }
        if let Some(settings) = self.meta.get(SETTINGS)? {
            let pairs: Vec<(FleetName, hafleet_proto::FleetSettings)> =
                decode(SETTINGS, &settings)?;
            desired.settings = pairs.into_iter().collect();
        }
        if let Some(render) = self.meta.get(RENDER)? {
            desired.render = decode(RENDER, &render)?;
        }
        Ok(desired)
    }

    /// Fleets that have versions, in name order. Seeks from one fleet's prefix to the next
    /// instead of walking every version: it runs after every batch.
    pub fn fleets_with_versions(&self) -> Result<Vec<FleetName>, StoreError> {
        let mut fleets = Vec::new();
        let mut from: Vec<u8> = Vec::new();
        while let Some(item) = self.versions.range(from.as_slice()..).next() {
            let (key, _) = item?;
            let end = key.iter().position(|b| *b == 0).unwrap_or(key.len());
            if let Ok(f) = FleetName::new(String::from_utf8_lossy(&key[..end]).into_owned()) {
                fleets.push(f);
            }
            // The smallest key after every "<fleet>\0…" key.
            from = key[..end].to_vec();
            from.push(1);
        }
        Ok(fleets)
    }

    /// The newest version of a fleet.
    pub fn latest(&self, fleet: &FleetName) -> Result<Option<ConfigVersion>, StoreError> {
        let prefix = join(&[fleet.as_str(), ""]);
        match self.versions.scan_prefix(&prefix).next_back() {
            Some(item) => {
                let (key, value) = item?;
                Ok(Some(self.decode_version(&key, &value, &mut None)?))
            }
            None => Ok(None),
        }
    }

    pub fn version(
        &self,
        fleet: &FleetName,
        version: u64,
    ) -> Result<Option<ConfigVersion>, StoreError> {
        let newest = self.newest.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = newest.get(fleet).filter(|v| v.version == version) {
            return Ok(Some(v.clone()));
        }
        drop(newest);
        let key = version_key(fleet, version);
        self.versions.get(&key)?.map(|v| self.decode_version(&key, &v, &mut None)).transpose()
    }

    /// Versions of a fleet, oldest first.
    pub fn versions(&self, fleet: &FleetName) -> Result<Vec<ConfigVersion>, StoreError> {
        let prefix = join(&[fleet.as_str(), ""]);
        let mut base = None;
        self.versions
            .scan_prefix(&prefix)
            .map(|item| {
                let (key, value) = item?;
                self.decode_version(&key, &value, &mut base)
            })
            .collect()
    }

    /// Commits a batch: state writes, new versions and the applied sequence, atomically; then
    /// flushes to disk before returning, so the caller may ack the batch's messages.
    pub fn commit(
        &self,
        writes: &[StateWrite],
        new_versions: &[ConfigVersion],
        applied_seq: u64,
    ) -> Result<(), StoreError> {
        let held: Vec<bool> = new_versions
            .iter()
            .map(|v| Ok(v.restores.is_none() && self.pinned(&v.fleet)?.is_some()))
            .collect::<Result<_, StoreError>>()?;
        // Each version whole or as a delta to its fleet's keyframe; new keyframes are kept
        // once the transaction has committed.
        let mut keyframes: HashMap<FleetName, Keyframe> = HashMap::new();
        let mut encoded: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = Vec::with_capacity(new_versions.len());
        // Certificates the store does not hold yet, each once: (id, JSON).
        let mut new_certs: Vec<(String, Vec<u8>)> = Vec::new();
        let mut adding = std::collections::HashSet::new();
        let mut stored_certs = self.stored_certs()?;
        let stored = stored_certs.get_or_insert_default();
        for (v, held) in new_versions.iter().zip(held) {
            let summary =
                serde_json::to_vec(&VersionSummary::of(v, held)).expect("summaries serialize");
            let (json, certs) = certs::split(v);
            for (id, cert) in certs.iter().flat_map(|(ids, certs)| ids.iter().zip(certs.iter())) {
                if !stored.contains(id) && adding.insert(id.clone()) {
                    let cert = serde_json::to_vec(cert).expect("certificates serialize");
                    new_certs.push((id.clone(), cert));
                }
            }
            let base = match keyframes.get(&v.fleet) {
                Some(kept) => Some(kept.clone()),
                None => self.keyframe(&v.fleet)?,
            };
            let delta = match base {
                Some((n, base)) if v.version > n && v.version - n < KEYFRAME_EVERY => {
                    let delta = compress_delta(&json, n, &base)
                        .expect("compressing into memory cannot fail");
                    (delta.len() <= DELTA_MAX.max(json.len() / DELTA_SHARE)).then_some(delta)
                }
                _ => None,
            };
            let stored = match delta {
                Some(delta) => delta,
                None => {
                    let stored = compress(&json);
                    keyframes.insert(v.fleet.clone(), (v.version, std::sync::Arc::new(json)));
                    stored
                }
            };
            encoded.push((version_key(&v.fleet, v.version), stored, summary));
        }
        (&self.ingresses, &self.versions, &self.summaries, &self.meta, &self.certs).transaction(
            |(ingresses, versions, summaries, meta, certs)| {
                for write in writes {
                    match write {
                        StateWrite::Put(fleet, key, entry) => {
                            let v = serde_json::to_vec(entry).expect("entries serialize");
                            ingresses.insert(ingress_row(fleet, key), v)?;
                        }
                        StateWrite::Remove(fleet, key) => {
                            ingresses.remove(ingress_row(fleet, key))?;
                        }
                        StateWrite::Nodes(cluster, nodes) => {
                            let v = serde_json::to_vec(nodes).expect("nodes serialize");
                            meta.insert(cluster_key(NODES, cluster), v)?;
                        }
                        StateWrite::Epoch(cluster, epoch) => {
                            meta.insert(cluster_key(EPOCH, cluster), &epoch.to_be_bytes())?;
                        }
                        StateWrite::Held(held) => {
                            let pairs: Vec<_> = held.iter().map(|((f, _), h)| (f, h)).collect();
                            let v = serde_json::to_vec(&pairs).expect("holds serialize");
                            meta.insert(HELD, v)?;
                        }
                        StateWrite::DefaultCerts(certs) => {
                            let pairs: Vec<_> = certs.iter().collect();
                            let v = serde_json::to_vec(&pairs).expect("certificates serialize");
                            meta.insert(DEFAULT_CERTS, v)?;
                        }
                        StateWrite::Settings(settings) => {
                            let pairs: Vec<_> = settings.iter().collect();
                            let v = serde_json::to_vec(&pairs).expect("settings serialize");
                            meta.insert(SETTINGS, v)?;
                        }
                        StateWrite::Render(render) => {
                            let v = serde_json::to_vec(render).expect("render settings serialize");
                            meta.insert(RENDER, v)?;
                        }
                    }
                }
                for (id, cert) in &new_certs {
                    certs.insert(id.as_bytes(), cert.as_slice())?;
                }
                for (k, v, summary) in &encoded {
                    versions.insert(k.as_slice(), v.as_slice())?;
                    summaries.insert(k.as_slice(), summary.as_slice())?;
                }
                meta.insert(APPLIED_SEQ, &applied_seq.to_be_bytes())?;
                Ok::<(), ConflictableTransactionError<StoreError>>(())
            },
        )?;
        self.db.flush()?;
        stored.extend(new_certs.into_iter().map(|(id, _)| id));
        drop(stored_certs);
        self.keyframes.lock().unwrap_or_else(|p| p.into_inner()).extend(keyframes);
        let mut newest = self.newest.lock().unwrap_or_else(|p| p.into_inner());
        for v in new_versions {
            newest.insert(v.fleet.clone(), v.clone());
        }
        Ok(())
    }

    /// The ids of the certificates the store holds (listed from the `certs` tree the first
    /// time). Locked for a commit's length.
    fn stored_certs(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, Option<std::collections::HashSet<String>>>, StoreError>
    {
        let mut known = self.stored_certs.lock().unwrap_or_else(|p| p.into_inner());
        if known.is_none() {
            let ids = self.certs.iter().keys().map(|k| Ok(String::from_utf8_lossy(&k?).into()));
            *known = Some(ids.collect::<Result<_, sled::Error>>()?);
        }
        Ok(known)
    }

    /// The last version of `fleet` known to be published to NATS.
    pub fn published(&self, fleet: &FleetName) -> Result<u64, StoreError> {
        Ok(self.meta.get(published_key(fleet))?.map(|v| be_u64(&v)).unwrap_or(0))
    }

    pub fn set_published(&self, fleet: &FleetName, version: u64) -> Result<(), StoreError> {
        self.meta.insert(published_key(fleet), &version.to_be_bytes())?;
        self.db.flush()?;
        Ok(())
    }

    /// Versions stored but not yet published (and not held by a pin), oldest first, across all
    /// fleets. Reads only the versions after each fleet's published mark.
    pub fn unpublished(&self) -> Result<Vec<ConfigVersion>, StoreError> {
        let mut out = Vec::new();
        for fleet in self.fleets_with_versions()? {
            for item in self.after_published(&fleet)? {
                let (_, summary) = item?;
                if !summary.held
                    && let Some(v) = self.version(&fleet, summary.number)?
                {
                    out.push(v);
                }
            }
        }
        Ok(out)
    }

    /// The summaries of `fleet`'s versions after its published mark, oldest first, with
    /// their keys.
    fn after_published(
        &self,
        fleet: &FleetName,
    ) -> Result<impl Iterator<Item = Result<(sled::IVec, VersionSummary), StoreError>>, StoreError>
    {
        let from = version_key(fleet, self.published(fleet)? + 1);
        let to = version_key(fleet, u64::MAX);
        Ok(self.summaries.range(from..=to).map(|item| {
            let (key, value) = item?;
            let summary = decode(&key, &value)?;
            Ok((key, summary))
        }))
    }

    /// Holds every version of `fleet` not yet published (they are recorded as rendered while
    /// pinned, never published) and pins the fleet to `pin`, until `resume`. Flushed.
    pub fn hold_unpublished(&self, fleet: &FleetName, pin: u64) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for item in self.after_published(fleet)? {
            let (key, summary) = item?;
            let summary = VersionSummary { held: true, ..summary };
            batch.insert(key, serde_json::to_vec(&summary).expect("summaries serialize"));
        }
        self.summaries.apply_batch(batch)?;
        self.meta.insert(pinned_key(fleet), &pin.to_be_bytes())?;
        self.db.flush()?;
        Ok(())
    }

    /// Whether an operator resumed `fleet` (after which a rebuilt state's first versions go
    /// out without the guard's comparison: the operator looked).
    pub fn resumed(&self, fleet: &FleetName) -> Result<bool, StoreError> {
        Ok(self.meta.contains_key(resumed_key(fleet))?)
    }

    /// Notes that an operator resumed `fleet`. Flushed.
    pub fn set_resumed(&self, fleet: &FleetName) -> Result<(), StoreError> {
        self.meta.insert(resumed_key(fleet), &[])?;
        self.db.flush()?;
        Ok(())
    }

    /// The newest `limit` summaries of a fleet, newest first.
    pub fn summaries(
        &self,
        fleet: &FleetName,
        limit: usize,
    ) -> Result<Vec<VersionSummary>, StoreError> {
        let prefix = join(&[fleet.as_str(), ""]);
        self.summaries
            .scan_prefix(&prefix)
            .rev()
            .take(limit)
            .map(|item| {
                let (key, value) = item?;
                decode(&key, &value)
            })
            .collect()
    }

    /// The newest version's summary, held or not.
    pub fn latest_summary(&self, fleet: &FleetName) -> Result<Option<VersionSummary>, StoreError> {
        Ok(self.summaries(fleet, 1)?.pop())
    }

    /// The summary of one version.
    pub fn summary(
        &self,
        fleet: &FleetName,
        version: u64,
    ) -> Result<Option<VersionSummary>, StoreError> {
        let key = version_key(fleet, version);
        self.summaries.get(&key)?.map(|v| decode(&key, &v)).transpose()
    }

    /// Whether the store knows the fleet (it has versions of it).
    pub fn knows(&self, fleet: &FleetName) -> Result<bool, StoreError> {
        Ok(self.summaries.scan_prefix(join(&[fleet.as_str(), ""])).next().is_some())
    }

    /// Whether the store holds nothing yet: no state, no versions, nothing applied.
    pub fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.applied_seq()? == 0 && self.ingresses.is_empty() && self.summaries.is_empty())
    }

    /// Fills an empty store from a checkpoint: its Ingresses, its sequence as the applied one,
    /// and each fleet's newest number as the floor its next version stays above.
    pub fn restore(
        &self,
        desired: &Desired,
        applied_seq: u64,
        floors: &std::collections::BTreeMap<FleetName, u64>,
    ) -> Result<(), StoreError> {
        // Floors first: alone they only raise numbers, and they leave the store empty, so a
        // crash before the commit below restores again at the next start.
        for (fleet, n) in floors {
            self.meta.insert(floor_key(fleet), &n.to_be_bytes())?;
        }
        // The state and its sequence in one transaction, as every batch commits them.
        let writes: Vec<StateWrite> = desired
            .fleets
            .iter()
            .flat_map(|(fleet, ingresses)| {
                ingresses
                    .iter()
                    .map(|(key, entry)| StateWrite::Put(fleet.clone(), key.clone(), entry.clone()))
            })
            .chain(desired.nodes.iter().map(|(c, n)| StateWrite::Nodes(c.clone(), n.clone())))
            .chain(desired.epochs.iter().map(|(c, e)| StateWrite::Epoch(c.clone(), *e)))
            .chain([
                StateWrite::Held(desired.held.clone()),
                StateWrite::DefaultCerts(desired.default_certs.clone()),
                StateWrite::Settings(desired.settings.clone()),
                StateWrite::Render(desired.render.clone()),
            ])
            .collect();
        self.commit(&writes, &[], applied_seq)
    }

    /// The number a fleet's versions must stay above because a checkpoint said so (0: none).
    pub fn floor(&self, fleet: &FleetName) -> Result<u64, StoreError> {
        Ok(self.meta.get(floor_key(fleet))?.map(|v| be_u64(&v)).unwrap_or(0))
    }

    /// Fleets a restored store has Ingresses or floors for but no versions of yet.
    pub fn floored_fleets(&self) -> Result<Vec<FleetName>, StoreError> {
        let mut out = Vec::new();
        for item in self.meta.scan_prefix(join(&["floor", ""])).keys() {
            let key = item?;
            if let Ok(f) = FleetName::new(String::from_utf8_lossy(&key[6..]).into_owned()) {
                out.push(f);
            }
        }
        Ok(out)
    }

    /// The rollback version the fleet is pinned to.
    pub fn pinned(&self, fleet: &FleetName) -> Result<Option<u64>, StoreError> {
        Ok(self.meta.get(pinned_key(fleet))?.map(|v| be_u64(&v)))
    }

    pub fn set_pinned(&self, fleet: &FleetName, pinned: Option<u64>) -> Result<(), StoreError> {
        match pinned {
            Some(v) => self.meta.insert(pinned_key(fleet), &v.to_be_bytes())?,
            None => self.meta.remove(pinned_key(fleet))?,
        };
        self.db.flush()?;
        Ok(())
    }
}

mod certs;
#[cfg(test)]
mod tests;
