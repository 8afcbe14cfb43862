//! Bundles too large for a message, in the bundles stream ([`hafleet_proto::BUNDLES_STREAM`]):
//! the config and maps cut into chunks, and each certificate stored once apart, by id
//! ([`hafleet_proto::cert_subject`]). A fleet of 10,000 certificates carries 15 MB of them;
//! a version that rotates one stores one and each reader reads one, the others being on its
//! shelf ([`CertShelf`]).

use super::{BoxError, Bus, BusError, chunk_count};
use async_nats::jetstream::stream;
use futures::{StreamExt as _, TryStreamExt as _};
use hafleet_proto::{Body, ConfigVersion, FleetName, SealedCert, StashedBundle};
use std::collections::{HashMap, HashSet, VecDeque};

/// Bundles whose certificates a reader keeps on its shelf: the newest few it read (the one
/// running, the one going out, one to roll back to).
const KEPT_BUNDLES: usize = 3;

/// Certificates stored or read at once, each a message of its own.
const CERTS_AT_ONCE: usize = 64;

/// What a connection knows of the certificates in the bundles stream.
#[derive(Debug, Default)]
pub(super) struct CertShelf {
    /// Per fleet, the ids known to be stored (written, or listed once from the stream), so
    /// a version stores only the certificates new to it.
    stored: HashMap<FleetName, HashSet<String>>,
    /// Certificates read, by id, each checked to be that id and well formed
    /// ([`SealedCert::check`]): those of the bundles in `recent`.
    read: HashMap<String, SealedCert>,
    /// The ids of the newest bundles read, newest last.
    recent: VecDeque<Vec<String>>,
}

impl CertShelf {
    /// Keeps what was read for the newest [`KEPT_BUNDLES`] bundles, `ids` the newest.
    fn keep_read(&mut self, ids: Vec<String>) {
        self.recent.push_back(ids);
        while self.recent.len() > KEPT_BUNDLES {
            self.recent.pop_front();
        }
        let wanted: HashSet<&str> = self.recent.iter().flatten().map(String::as_str).collect();
        self.read.retain(|id, _| wanted.contains(id.as_str()));
    }
}

impl Bus {
    /// Puts `v`'s bundle into the bundles stream and returns `v` naming it instead of carrying
    /// it: first each certificate the stream lacks (on its own subject, by id), then the rest
    /// ([`StashedBundle`]) cut into chunks no larger than a message. Chunk 0 goes last and
    /// says how many there are, so a bundle whose chunk 0 is there with that count is stored
    /// whole, certificates included.
    pub async fn stash_bundle(&self, v: &ConfigVersion) -> Result<ConfigVersion, BusError> {
        let Body::Inline { bundle } = &v.body else { return Ok(v.clone()) };
        let stream = self.ensure_stream(hafleet_proto::BUNDLES).await?;
        let ids = bundle.cert_ids();
        self.store_certs(&stream, &v.fleet, &bundle.certs, &ids).await?;
        let json = StashedBundle::encode(bundle, &ids);
        let pieces: Vec<&[u8]> = json.chunks(self.payload_limit().max(1)).collect();
        let chunks = u32::try_from(pieces.len()).expect("fewer than 2^32 chunks");
        let first = hafleet_proto::bundle_chunk_subject(&v.fleet, &v.sha256, 0);
        let stored = match stream.direct_get_last_for_subject(first).await {
            Ok(m) => chunk_count(&m) == Some(chunks),
            Err(_) => false,
        };
        if !stored {
            let count = chunks.to_string();
            for (i, piece) in pieces.iter().enumerate().rev() {
                let index = i as u32;
                let subject = hafleet_proto::bundle_chunk_subject(&v.fleet, &v.sha256, index);
                let id = format!("bundle-{}-{}-{index}", v.fleet, v.sha256);
                let extra: &[(&str, &str)] = if index == 0 {
                    &[(hafleet_proto::CHUNKS_HEADER, count.as_str())]
                } else {
                    &[]
                };
                self.publish_with_headers(subject, &id, piece.to_vec(), extra).await?;
            }
        }
        let mut by_ref = v.clone();
        by_ref.body = Body::Stream { chunks };
        Ok(by_ref)
    }

    /// Stores each of `certs` (whose ids are `ids`) that the stream does not hold yet. What
    /// it holds is listed once per fleet and connection, then followed as this connection
    /// stores more; storing one again would change nothing (one message per subject), it
    /// would only cost the time.
    async fn store_certs(
        &self,
        stream: &stream::Stream,
        fleet: &FleetName,
        certs: &[SealedCert],
        ids: &[String],
    ) -> Result<(), BusError> {
        if certs.is_empty() {
            return Ok(());
        }
        let listed = self.certs.lock().expect("shelf lock").stored.contains_key(fleet);
        if !listed {
            let stored = list_stored(stream, fleet).await?;
            self.certs
                .lock()
                .expect("shelf lock")
                .stored
                .entry(fleet.clone())
                .or_default()
                .extend(stored);
        }
        let missing: Vec<usize> = {
            let shelf = self.certs.lock().expect("shelf lock");
            let stored = &shelf.stored[fleet];
            (0..ids.len()).filter(|&i| !stored.contains(&ids[i])).collect()
        };
        let writes = missing.iter().map(|&i| {
            let (cert, id) = (&certs[i], &ids[i]);
            async move {
                let json = serde_json::to_vec(cert).expect("certificates serialize");
                let subject = hafleet_proto::cert_subject(fleet, id);
                self.publish(subject, &format!("cert-{fleet}-{id}"), json).await
            }
        });
        futures::stream::iter(writes).buffered(CERTS_AT_ONCE).try_collect::<Vec<u64>>().await?;
        let mut shelf = self.certs.lock().expect("shelf lock");
        let stored = shelf.stored.entry(fleet.clone()).or_default();
        stored.extend(missing.into_iter().map(|i| ids[i].clone()));
        Ok(())
    }

    /// `v` with its bundle inline: as it came, or read from the bundles stream (by subject, so
    /// an applier needs no right to any other fleet's), each certificate it names taken from
    /// the shelf or read by id and checked to be that id, and the whole checked against the
    /// sha256 the version names.
    pub async fn fetch_bundle(&self, v: ConfigVersion) -> Result<ConfigVersion, BusError> {
        let Body::Stream { chunks } = v.body else { return Ok(v) };
        let (version, fleet) = (v.version, v.fleet.to_string());
        let bad = |e: BoxError| BusError::BadBundle { fleet: fleet.clone(), version, source: e };
        // The body is not signed: a chunk count the size cannot explain is refused before any
        // read (each chunk holds up to a message's payload; the JSON adds less than the size).
        let most = (v.size as usize * 2 + 4096) / self.payload_limit().max(1) + 2;
        if chunks as usize > most {
            return Err(bad(format!("{chunks} chunks for a {}-byte bundle", v.size).into()));
        }
        let stream =
            self.js.get_stream_no_info(hafleet_proto::BUNDLES_STREAM).await.map_err(|e| {
                BusError::Stream { name: hafleet_proto::BUNDLES_STREAM, source: e.into() }
            })?;
        let reads = (0..chunks).map(|index| {
            let subject = hafleet_proto::bundle_chunk_subject(&v.fleet, &v.sha256, index);
            let stream = &stream;
            async move {
                let failed = |e: BoxError| BusError::BundleRead {
                    subject: subject.clone(),
                    index,
                    version,
                    source: e,
                };
                let m = stream
                    .direct_get_last_for_subject(subject.clone())
                    .await
                    .map_err(|e| failed(Box::new(e)))?;
                if index == 0 && chunk_count(&m) != Some(chunks) {
                    return Err(failed(format!("chunk 0 does not say {chunks} chunks").into()));
                }
                Ok(m.payload)
            }
        });
        // Stops at the first chunk that cannot be read.
        let pieces: Vec<bytes::Bytes> =
            futures::stream::iter(reads).buffered(4).try_collect().await?;
        let stashed: StashedBundle =
            serde_json::from_slice(&pieces.concat()).map_err(|e| bad(Box::new(e)))?;
        self.read_certs(&stream, &v, &stashed).await?;
        let ids = stashed.cert_ids.clone();
        // Each certificate on the shelf was checked when read: only a bundle with some
        // carried inline (an earlier renderer's) has them all checked again.
        let all_read = stashed.certs.is_empty();
        let bundle = {
            let shelf = self.certs.lock().expect("shelf lock");
            stashed.into_bundle(|id| shelf.read.get(id).cloned())
        };
        let bundle = bundle.map_err(|id| bad(format!("certificate {id} was not read").into()))?;
        let v = match all_read {
            true => v.with_read_bundle(bundle, ids.as_slice().into()),
            false => v.with_bundle(bundle),
        };
        let v = v.map_err(|e| bad(Box::new(e)))?;
        self.certs.lock().expect("shelf lock").keep_read(ids);
        Ok(v)
    }

    /// Reads each certificate `stashed` names that the shelf lacks, and puts it there once
    /// its content is the id it was read by.
    async fn read_certs<I>(
        &self,
        stream: &stream::Stream<I>,
        v: &ConfigVersion,
        stashed: &StashedBundle,
    ) -> Result<(), BusError> {
        let missing: Vec<String> = {
            let shelf = self.certs.lock().expect("shelf lock");
            stashed
                .missing(|id| shelf.read.contains_key(id))
                .into_iter()
                .map(str::to_owned)
                .collect()
        };
        let reads = missing.into_iter().map(|id| async move {
            let subject = hafleet_proto::cert_subject(&v.fleet, &id);
            let failed = |e: BoxError| BusError::CertRead {
                subject: subject.clone(),
                version: v.version,
                source: e,
            };
            let m = stream
                .direct_get_last_for_subject(subject.clone())
                .await
                .map_err(|e| failed(Box::new(e)))?;
            let cert: SealedCert =
                serde_json::from_slice(&m.payload).map_err(|e| failed(Box::new(e)))?;
            if cert.id() != id {
                return Err(failed("its content is not the certificate its id names".into()));
            }
            // Checked once, here: a bundle made of what the shelf holds is not checked again.
            cert.check().map_err(|e| failed(Box::new(e)))?;
            Ok((id, cert))
        });
        let read: Vec<(String, SealedCert)> =
            futures::stream::iter(reads).buffered(CERTS_AT_ONCE).try_collect().await?;
        self.certs.lock().expect("shelf lock").read.extend(read);
        Ok(())
    }
}

/// The ids of `fleet`'s certificates the stream holds.
async fn list_stored(
    stream: &stream::Stream,
    fleet: &FleetName,
) -> Result<HashSet<String>, BusError> {
    let failed = |e: BoxError| BusError::Stream { name: hafleet_proto::BUNDLES_STREAM, source: e };
    let prefix = hafleet_proto::cert_subject(fleet, "");
    let subjects = stream
        .info_with_subjects(hafleet_proto::cert_subjects(fleet))
        .await
        .map_err(|e| failed(Box::new(e)))?;
    subjects
        .map_err(|e| failed(Box::new(e)))
        .try_filter_map(|(subject, _)| {
            let id = subject.strip_prefix(&prefix).map(str::to_owned);
            async move { Ok(id) }
        })
        .try_collect()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shelf_keeps_the_certificates_of_the_newest_bundles_read() {
        let cert = |n: u8| SealedCert {
            fingerprint: n.to_string(),
            names: vec![],
            not_after_unix: 0,
            chain_pem: "".into(),
            sealed_key: "".into(),
            recipient: String::new(),
        };
        let mut shelf = CertShelf::default();
        // Bundles naming {0,1}, {1,2}, {2,3}, then {4}, each read in turn (with a stray 5
        // read beside the first): the first falls out, and with it 0.
        shelf.read.insert("5".into(), cert(5));
        for ids in [["0", "1"].as_slice(), &["1", "2"], &["2", "3"], &["4"]] {
            for id in ids {
                shelf.read.insert(id.to_string(), cert(id.parse().unwrap()));
            }
            shelf.keep_read(ids.iter().map(|s| s.to_string()).collect());
        }
        let mut kept: Vec<&str> = shelf.read.keys().map(String::as_str).collect();
        kept.sort();
        assert_eq!(kept, ["1", "2", "3", "4"]);
    }
}
