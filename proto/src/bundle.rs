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
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Bundle {
    pub config: String,
    /// Sorted by name, no name twice.
    #[serde(default)]
    pub maps: Vec<MapFile>,
    /// The certificates a crt-list map names, sorted by id, no id twice; their keys sealed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certs: Vec<crate::SealedCert>,
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
        Ok(Bundle { config: self.config, maps: self.maps, certs })
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

    /// Each certificate's id ([`crate::SealedCert::id`]), in order.
    pub fn cert_ids(&self) -> Vec<String> {
        self.certs.iter().map(crate::SealedCert::id).collect()
    }

    /// Checks that the config is the one `sha256` names and every map is the one its name
    /// names.
    pub fn verify(&self, sha256: &str) -> Result<(), BundleError> {
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
        let mut ids = std::collections::BTreeSet::new();
        for c in &self.certs {
            c.check()
                .map_err(|why| BundleError::Cert { fingerprint: c.fingerprint.clone(), why })?;
            let id = c.id();
            if !ids.insert(id.clone()) {
                return Err(BundleError::DuplicateCert { id });
            }
        }
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
        let bundle = Bundle { config: "global\n".into(), maps: vec![map.clone()], certs: vec![] };
        bundle.verify(&bundle.sha256()).unwrap();
        assert!(matches!(bundle.verify("00"), Err(BundleError::ConfigMismatch { .. })));
        let mut tampered = bundle.clone();
        tampered.maps[0].content.push_str("evil be_evil\n");
        assert!(matches!(
            tampered.verify(&tampered.sha256()),
            Err(BundleError::MapMismatch { .. })
        ));
        let twice =
            Bundle { config: "global\n".into(), maps: vec![map.clone(), map], certs: vec![] };
        assert!(matches!(twice.verify(&twice.sha256()), Err(BundleError::DuplicateMap { .. })));
    }

    #[test]
    fn a_bundle_verifies_each_certificate_once() {
        let der = b"end-entity";
        let cert = crate::SealedCert {
            fingerprint: sha256_hex(der),
            names: vec![],
            not_after_unix: 0,
            chain_pem: crate::tls::certificates_pem([der.as_slice()]),
            sealed_key:
                "-----BEGIN AGE ENCRYPTED FILE-----\nYWJj\n-----END AGE ENCRYPTED FILE-----\n"
                    .into(),
            recipient: String::new(),
        };
        let ok = Bundle { config: "global\n".into(), maps: vec![], certs: vec![cert.clone()] };
        ok.verify(&ok.sha256()).unwrap();
        let mut forged = ok.clone();
        forged.certs[0].fingerprint = sha256_hex(b"another");
        assert!(matches!(forged.verify(&forged.sha256()), Err(BundleError::Cert { .. })));
        let mut twice = ok.clone();
        twice.certs.push(cert);
        assert!(matches!(twice.verify(&twice.sha256()), Err(BundleError::DuplicateCert { .. })));
    }

    #[test]
    fn a_stashed_bundle_names_its_certificates_and_is_whole_again_with_them() {
        let cert = |der: &[u8]| crate::SealedCert {
            fingerprint: sha256_hex(der),
            names: vec![],
            not_after_unix: 0,
            chain_pem: crate::tls::certificates_pem([der]),
            sealed_key:
                "-----BEGIN AGE ENCRYPTED FILE-----\nYWJj\n-----END AGE ENCRYPTED FILE-----\n"
                    .into(),
            recipient: String::new(),
        };
        let (a, b) = (cert(b"a"), cert(b"b"));
        let map = MapFile {
            name: MapName::for_content("exact", "k v\n").unwrap(),
            content: "k v\n".into(),
        };
        let bundle = Bundle {
            config: "global\n".into(),
            maps: vec![map],
            certs: vec![a.clone(), b.clone()],
        };
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
