//! A version's files: `haproxy.cfg` and the map files it looks routes up in.
//!
//! ```text
//! <dir of config_path>/haproxy.cfg                        default-path config; names the maps:
//! <dir of config_path>/hafleet-maps/<kind>-<sha256>.map   map_str(hafleet-maps/exact-<sha256>.map)
//! ```
//! A map file is named by the sha256 of its content, so the config's own sha256 covers every
//! map it names, two versions never write different bytes under one name, and a config is
//! swapped in (one rename) only once every map it names is on the host.

use crate::{InvalidValue, sha256_hex};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Folder of the map files, relative to the config file's folder.
pub const MAPS_DIR: &str = "hafleet-maps";

/// A map file's name: `<kind>-<sha256 of its content>.map`, `kind` being lowercase letters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MapName(String);

impl MapName {
    /// The name for `content` of this `kind` (`exact`, `prefix`, …).
    pub fn for_content(kind: &str, content: &str) -> Result<Self, InvalidValue> {
        Self::new(format!("{kind}-{}.map", sha256_hex(content.as_bytes())))
    }

    pub fn new(value: String) -> Result<Self, InvalidValue> {
        let rule = |rule| InvalidValue::Rule { what: "map name", value: value.clone(), rule };
        let Some(stem) = value.strip_suffix(".map") else {
            return Err(rule("must end in .map"));
        };
        let Some((kind, digest)) = stem.rsplit_once('-') else {
            return Err(rule("must be <kind>-<sha256>.map"));
        };
        if kind.is_empty() || kind.len() > 32 || !kind.bytes().all(|b| b.is_ascii_lowercase()) {
            return Err(rule("kind must be 1 to 32 lowercase letters"));
        }
        if digest.len() != 64 || !digest.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(rule("must end in a lowercase hex sha256"));
        }
        Ok(MapName(value))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The sha256 the name promises for the content.
    pub fn digest(&self) -> &str {
        let stem = self.0.strip_suffix(".map").unwrap_or(&self.0);
        stem.rsplit_once('-').map(|(_, d)| d).unwrap_or_default()
    }

    /// What the map is for (`exact`, `prefix`, …): the part of the name before its digest.
    pub fn kind(&self) -> &str {
        self.0.rsplit_once('-').map(|(k, _)| k).unwrap_or_default()
    }

    /// The path the config uses for it, relative to the config's folder.
    pub fn relative_path(&self) -> String {
        format!("{MAPS_DIR}/{}", self.0)
    }
}

impl TryFrom<String> for MapName {
    type Error = InvalidValue;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<MapName> for String {
    fn from(value: MapName) -> String {
        value.0
    }
}

impl fmt::Display for MapName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One map file of a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapFile {
    pub name: MapName,
    pub content: String,
}

/// Everything a host needs for one version.
#[derive(Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Bundle {
    pub config: String,
    /// Sorted by name, no name twice.
    #[serde(default)]
    pub maps: Vec<MapFile>,
    /// The certificates a crt-list map names, sorted by id, no id twice; their keys sealed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certs: Vec<crate::SealedCert>,
    /// [`Bundle::cert_ids`], worked out once (never sent, never compared).
    #[serde(skip)]
    pub ids: CertIds,
}

/// A bundle's certificate ids, worked out once for the certificate list they were worked out
/// from: an id is a sha256 of 1.5 KB, and a rollout asks for them per host and per step
/// (10,000 certificates: 15 MB hashed per ask). Kept with the list's address and length, so a
/// list replaced or grown is hashed again; a certificate edited in place is not seen, and no
/// code edits one in a bundle it has asked the ids of. A bundle's clone keeps them for its own
/// list (the same certificates); [`Bundle::verify`] always works them out anew.
#[derive(Default)]
pub struct CertIds(std::sync::RwLock<Option<(usize, std::sync::Arc<[String]>)>>);

impl Clone for Bundle {
    fn clone(&self) -> Self {
        let copy = Bundle::new(self.config.clone(), self.maps.clone(), self.certs.clone());
        if let Some(ids) = self.kept_ids() {
            copy.keep(ids);
        }
        copy
    }
}

impl Clone for CertIds {
    fn clone(&self) -> Self {
        CertIds::default()
    }
}

impl PartialEq for CertIds {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for CertIds {}

impl fmt::Debug for CertIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CertIds")
    }
}

/// A bundle as the bundles stream keeps it ([`crate::Body::Stream`]): its config and maps, and
/// its certificates by id ([`crate::SealedCert::id`]), each stored once apart on
/// [`crate::cert_subject`]. A fleet of 10,000 certificates carries 15 MB of them; a version
/// that rotates one stores and moves one. Bundles stored by earlier renderers carry `certs`
/// whole, and are read as they are.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StashedBundle {
    pub config: String,
    #[serde(default)]
    pub maps: Vec<MapFile>,
    /// Certificates carried whole (earlier renderers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certs: Vec<crate::SealedCert>,
    /// Certificates stored apart, by id, in the bundle's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cert_ids: Vec<String>,
}

/// [`StashedBundle`] as it is written, borrowing the bundle's config and maps.
#[derive(Serialize)]
struct StashedRef<'a> {
    config: &'a str,
    maps: &'a [MapFile],
    cert_ids: &'a [String],
}

impl StashedBundle {
    /// The JSON the bundles stream keeps for `bundle` whose certificates have the ids `ids`
    /// (theirs, in order: [`Bundle::cert_ids`]).
    pub fn encode(bundle: &Bundle, ids: &[String]) -> Vec<u8> {
        debug_assert_eq!(ids.len(), bundle.certs.len());
        let stashed = StashedRef { config: &bundle.config, maps: &bundle.maps, cert_ids: ids };
        serde_json::to_vec(&stashed).expect("bundles serialize")
    }

    /// The ids it names that `have` does not know: the certificates to read.
    pub fn missing(&self, have: impl Fn(&str) -> bool) -> Vec<&str> {
        self.cert_ids.iter().map(String::as_str).filter(|id| !have(id)).collect()
    }

    /// The bundle whole, each certificate it names by id taken from `by_id` (which must hold
    /// every one, each under its own id: [`Bundle::verify`] checks the rest); `Err(id)`: the
    /// first it lacks.
    pub fn into_bundle(
        self,
        by_id: impl Fn(&str) -> Option<crate::SealedCert>,
    ) -> Result<Bundle, String> {
        let mut certs = self.certs;
        certs.reserve(self.cert_ids.len());
        for id in self.cert_ids {
            match by_id(&id) {
                Some(c) => certs.push(c),
                None => return Err(id),
            }
        }
        Ok(Bundle::new(self.config, self.maps, certs))
    }
}

/// Why a bundle is not the one its version names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    #[error("config does not match its sha256 (claimed {claimed}, got {actual})")]
    ConfigMismatch { claimed: String, actual: String },
    #[error("map {name} does not match the sha256 in its name")]
    MapMismatch { name: String },
    #[error("map {name} appears twice")]
    DuplicateMap { name: String },
    #[error("certificate {fingerprint}: {why}")]
    Cert { fingerprint: String, why: crate::CertError },
    #[error("certificate {id} appears twice")]
    DuplicateCert { id: String },
}

impl Bundle {
    /// The bundle's identity: the config's sha256 (the config names each map by its digest).
    pub fn sha256(&self) -> String {
        sha256_hex(self.config.as_bytes())
    }

    /// Bytes of every file together.
    pub fn size(&self) -> usize {
        self.config.len()
            + self.maps.iter().map(|m| m.content.len()).sum::<usize>()
            + self.certs.iter().map(|c| c.chain_pem.len() + c.sealed_key.len()).sum::<usize>()
    }

    /// A bundle of these files.
    pub fn new(config: String, maps: Vec<MapFile>, certs: Vec<crate::SealedCert>) -> Bundle {
        Bundle { config, maps, certs, ids: CertIds::default() }
    }

    /// A bundle of these files whose certificates' ids are `ids`, in order, as the caller
    /// worked them out (the renderer, which names each certificate's file by its id): kept as
    /// [`Bundle::cert_ids`] without hashing them again. [`Bundle::verify`] works them out anew.
    pub fn with_cert_ids(
        config: String,
        maps: Vec<MapFile>,
        certs: Vec<crate::SealedCert>,
        ids: std::sync::Arc<[String]>,
    ) -> Bundle {
        assert_eq!(ids.len(), certs.len(), "one id per certificate");
        let bundle = Bundle::new(config, maps, certs);
        bundle.keep(ids);
        bundle
    }

    /// Each certificate's id ([`crate::SealedCert::id`]), in order; worked out once
    /// ([`CertIds`]).
    pub fn cert_ids(&self) -> std::sync::Arc<[String]> {
        if let Some(ids) = self.kept_ids() {
            return ids;
        }
        let ids: std::sync::Arc<[String]> = self.certs.iter().map(crate::SealedCert::id).collect();
        self.keep(std::sync::Arc::clone(&ids));
        ids
    }

    /// The ids kept for this bundle's certificate list, if they are for it.
    fn kept_ids(&self) -> Option<std::sync::Arc<[String]>> {
        let at = (self.certs.as_ptr() as usize, self.certs.len());
        let kept = self.ids.0.read().unwrap_or_else(|e| e.into_inner());
        kept.as_ref().filter(|(addr, ids)| (*addr, ids.len()) == at).map(|(_, ids)| ids.clone())
    }

    /// Keeps `ids` as the ids of this bundle's certificate list.
    fn keep(&self, ids: std::sync::Arc<[String]>) {
        *self.ids.0.write().unwrap_or_else(|e| e.into_inner()) =
            Some((self.certs.as_ptr() as usize, ids));
    }

    /// The certificate whose file is `path` (relative to the config's folder, as
    /// [`Bundle::cert_paths`] gives it). Certificates are sorted by id, so it is found by a
    /// binary search of [`Bundle::cert_ids`] (a walk, in a bundle that is not sorted).
    pub fn cert_by_path(&self, path: &str) -> Option<&crate::SealedCert> {
        let id = path.strip_prefix(crate::tls::CERTS_DIR)?.strip_prefix('/')?;
        let id = id.strip_suffix(".pem")?;
        let ids = self.cert_ids();
        let at = match ids.binary_search_by(|i| i.as_str().cmp(id)) {
            Ok(at) => Some(at),
            Err(_) => ids.iter().position(|i| i == id),
        };
        at.and_then(|at| self.certs.get(at))
    }

    /// The path of each certificate's file relative to the config's folder
    /// ([`crate::SealedCert::relative_path`]), in order, from [`Bundle::cert_ids`].
    pub fn cert_paths(&self) -> impl Iterator<Item = (String, &crate::SealedCert)> + '_ {
        let ids = self.cert_ids();
        let paths: Vec<String> =
            ids.iter().map(|id| format!("{}/{id}.pem", crate::tls::CERTS_DIR)).collect();
        paths.into_iter().zip(&self.certs)
    }

    /// Checks that the config is the one `sha256` names, every map is the one its name names,
    /// and every certificate is well formed and comes once.
    pub fn verify(&self, sha256: &str) -> Result<(), BundleError> {
        self.verify_files(sha256)?;
        // The ids are worked out anew here whatever was kept, and kept for what follows.
        let mut ids = Vec::with_capacity(self.certs.len());
        for c in &self.certs {
            c.check()
                .map_err(|why| BundleError::Cert { fingerprint: c.fingerprint.clone(), why })?;
            ids.push(c.id());
        }
        self.keep_ids(ids.into())
    }

    /// [`Bundle::verify`] for a bundle whose certificates were each checked
    /// ([`crate::SealedCert::check`]) and found to be the id they were read by, in `ids`, in
    /// order (a reader's shelf of certificates read by id): they are not checked or hashed
    /// again, only that no id comes twice. At 10,000 certificates that was a third of an
    /// applier's work per version.
    pub fn verify_read(
        &self,
        sha256: &str,
        ids: std::sync::Arc<[String]>,
    ) -> Result<(), BundleError> {
        assert_eq!(ids.len(), self.certs.len(), "one id per certificate");
        self.verify_files(sha256)?;
        self.keep_ids(ids)
    }

    /// The config and the maps of [`Bundle::verify`].
    fn verify_files(&self, sha256: &str) -> Result<(), BundleError> {
        let actual = self.sha256();
        if actual != sha256 {
            return Err(BundleError::ConfigMismatch { claimed: sha256.to_owned(), actual });
        }
        let mut seen = std::collections::BTreeSet::new();
        for m in &self.maps {
            if !seen.insert(m.name.as_str()) {
                return Err(BundleError::DuplicateMap { name: m.name.to_string() });
            }
            if sha256_hex(m.content.as_bytes()) != m.name.digest() {
                return Err(BundleError::MapMismatch { name: m.name.to_string() });
            }
        }
        Ok(())
    }

    /// Refuses an id that comes twice, then keeps `ids` as the certificates' ([`CertIds`]).
    fn keep_ids(&self, ids: std::sync::Arc<[String]>) -> Result<(), BundleError> {
        let mut seen = std::collections::HashSet::with_capacity(ids.len());
        if let Some(id) = ids.iter().find(|id| !seen.insert(id.as_str())) {
            return Err(BundleError::DuplicateCert { id: id.clone() });
        }
        self.keep(ids);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_names_carry_the_digest_of_their_content() {
        let name = MapName::for_content("exact", "a.com/x be_x\n").unwrap();
        assert_eq!(name.digest(), sha256_hex(b"a.com/x be_x\n"));
        assert!(name.relative_path().starts_with("hafleet-maps/exact-"));
        for bad in [
            "exact.map",
            "exact-abc.map",
            "Exact-0000000000000000000000000000000000000000000000000000000000000000.map",
            "../x-0000000000000000000000000000000000000000000000000000000000000000.map",
            "x-0000000000000000000000000000000000000000000000000000000000000000.cfg",
        ] {
            assert!(MapName::new(bad.into()).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_bundle_verifies_its_config_and_every_map() {
        let map = MapFile {
            name: MapName::for_content("exact", "k v\n").unwrap(),
            content: "k v\n".into(),
        };
        let bundle = Bundle::new("global\n".into(), vec![map.clone()], vec![]);
        bundle.verify(&bundle.sha256()).unwrap();
        assert!(matches!(bundle.verify("00"), Err(BundleError::ConfigMismatch { .. })));
        let mut tampered = bundle.clone();
        tampered.maps[0].content.push_str("evil be_evil\n");
        assert!(matches!(
            tampered.verify(&tampered.sha256()),
            Err(BundleError::MapMismatch { .. })
        ));
        let twice = Bundle::new("global\n".into(), vec![map.clone(), map], vec![]);
        assert!(matches!(twice.verify(&twice.sha256()), Err(BundleError::DuplicateMap { .. })));
    }

    #[test]
    fn a_bundle_verifies_each_certificate_once() {
        let der = b"end-entity";
        let cert = crate::SealedCert {
            fingerprint: sha256_hex(der),
            names: vec![],
            not_after_unix: 0,
            chain_pem: crate::tls::certificates_pem([der.as_slice()]).into(),
            sealed_key:
                "-----BEGIN AGE ENCRYPTED FILE-----\nYWJj\n-----END AGE ENCRYPTED FILE-----\n"
                    .into(),
            recipient: String::new(),
        };
        let ok = Bundle::new("global\n".into(), vec![], vec![cert.clone()]);
        ok.verify(&ok.sha256()).unwrap();
        let mut forged = ok.clone();
        forged.certs[0].fingerprint = sha256_hex(b"another");
        assert!(matches!(forged.verify(&forged.sha256()), Err(BundleError::Cert { .. })));
        let mut twice = ok.clone();
        twice.certs.push(cert);
        assert!(matches!(twice.verify(&twice.sha256()), Err(BundleError::DuplicateCert { .. })));

        // Read by id (each checked when read): the ids given are kept, the config and maps
        // still checked, an id twice still refused.
        let ids: std::sync::Arc<[String]> = vec![ok.certs[0].id()].into();
        let read = Bundle::new("global\n".into(), vec![], ok.certs.clone());
        read.verify_read(&read.sha256(), ids.clone()).unwrap();
        assert!(std::sync::Arc::ptr_eq(&read.cert_ids(), &ids), "kept, not worked out again");
        assert!(matches!(read.verify_read("00", ids), Err(BundleError::ConfigMismatch { .. })));
        let ids: std::sync::Arc<[String]> = vec![twice.certs[0].id(), twice.certs[1].id()].into();
        let err = twice.verify_read(&twice.sha256(), ids);
        assert!(matches!(err, Err(BundleError::DuplicateCert { .. })));
    }

    fn cert(der: &[u8]) -> crate::SealedCert {
        crate::SealedCert {
            fingerprint: sha256_hex(der),
            names: vec![],
            not_after_unix: 0,
            chain_pem: crate::tls::certificates_pem([der]).into(),
            sealed_key:
                "-----BEGIN AGE ENCRYPTED FILE-----\nYWJj\n-----END AGE ENCRYPTED FILE-----\n"
                    .into(),
            recipient: String::new(),
        }
    }

    #[test]
    fn a_bundle_works_its_certificate_ids_out_once_for_the_list_it_has() {
        let (a, b) = (cert(b"a"), cert(b"b"));
        let mut bundle = Bundle::new("global\n".into(), vec![], vec![a.clone()]);
        assert_eq!(&*bundle.cert_ids(), [a.id()]);
        let kept = bundle.cert_ids();
        assert!(std::sync::Arc::ptr_eq(&kept, &bundle.cert_ids()), "worked out once");
        // A list replaced, or grown, is worked out anew.
        bundle.certs = vec![b.clone()];
        assert_eq!(&*bundle.cert_ids(), [b.id()]);
        bundle.certs.push(a.clone());
        assert_eq!(&*bundle.cert_ids(), [b.id(), a.id()]);
        let paths: Vec<String> = bundle.cert_paths().map(|(p, _)| p).collect();
        assert_eq!(paths, [b.relative_path(), a.relative_path()]);
        // Each found by its path, sorted or not.
        for c in [&a, &b] {
            assert_eq!(bundle.cert_by_path(&c.relative_path()), Some(c));
            let mut sorted = bundle.clone();
            sorted.certs.sort_by_key(|c| c.id());
            assert_eq!(sorted.cert_by_path(&c.relative_path()), Some(c));
        }
        for not in ["hafleet-certs/00.pem", "hafleet-maps/x.map", &a.id()] {
            assert_eq!(bundle.cert_by_path(not), None, "{not}");
        }
        // A clone keeps them for its own list; neither changes what the bundles compare.
        let copy = bundle.clone();
        assert_eq!(copy, bundle);
        assert!(std::sync::Arc::ptr_eq(&copy.cert_ids(), &bundle.cert_ids()));
        // Given by whoever worked them out, they are kept as given.
        let ids = bundle.cert_ids();
        let given = Bundle::with_cert_ids("global\n".into(), vec![], bundle.certs.clone(), ids);
        assert!(std::sync::Arc::ptr_eq(&given.cert_ids(), &bundle.cert_ids()));
        // verify works them out anew and keeps them.
        bundle.verify(&bundle.sha256()).unwrap();
        assert_eq!(&*bundle.cert_ids(), [b.id(), a.id()]);
    }

    #[test]
    fn a_stashed_bundle_names_its_certificates_and_is_whole_again_with_them() {
        let (a, b) = (cert(b"a"), cert(b"b"));
        let map = MapFile {
            name: MapName::for_content("exact", "k v\n").unwrap(),
            content: "k v\n".into(),
        };
        let bundle = Bundle::new("global\n".into(), vec![map], vec![a.clone(), b.clone()]);
        let ids = bundle.cert_ids();
        let json = StashedBundle::encode(&bundle, &ids);
        let text = String::from_utf8(json.clone()).unwrap();
        assert!(!text.contains("BEGIN"), "no certificate or key in the stashed bundle: {text}");
        let stashed: StashedBundle = serde_json::from_slice(&json).unwrap();
        assert_eq!(stashed.cert_ids, vec![a.id(), b.id()]);
        assert_eq!(stashed.missing(|id| id == a.id()), vec![b.id().as_str()]);
        let shelf = [a.clone(), b.clone()];
        let by_id = |id: &str| shelf.iter().find(|c| c.id() == id).cloned();
        assert_eq!(stashed.clone().into_bundle(by_id).unwrap(), bundle);
        let only_a = |id: &str| (id == a.id()).then(|| a.clone());
        assert_eq!(stashed.into_bundle(only_a), Err(b.id()));
        // What earlier renderers stored (the bundle whole) reads as it is.
        let old: StashedBundle =
            serde_json::from_slice(&serde_json::to_vec(&bundle).unwrap()).unwrap();
        assert_eq!(old.into_bundle(|_| None).unwrap(), bundle);
    }
}
