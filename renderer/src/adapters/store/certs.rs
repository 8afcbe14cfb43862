//! Certificates stored apart from the versions that name them, each once, by id
//! ([`hafleet_proto::SealedCert::id`]), as the bundles stream keeps them.
//!
//! A fleet of 10,000 certificates carries 15 MB of chains and sealed keys in every version.
//! Stored inline, each commit encoded and compressed all of it (a third of a certificate
//! rotation's time in the renderer), and sealed keys, being random, compress to little. A
//! version is stored without them, naming them by id in one more JSON field, so its record
//! is its config and maps; each certificate goes once into the `certs` tree.

use hafleet_proto::{Body, Bundle, ConfigVersion, SealedCert};
use std::sync::Arc;

/// The field a stored version's JSON names its certificates by.
const IDS_FIELD: &str = "stored_cert_ids";

/// A version's certificates, with their ids in the same order.
pub(super) type Certs<'a> = (Arc<[String]>, &'a [SealedCert]);

/// The JSON the store keeps for `v`: without its bundle's certificates, naming them by id; and
/// those certificates with their ids (`None`: it has none, and its JSON is [`ConfigVersion::encode`]'s).
pub(super) fn split(v: &ConfigVersion) -> (Vec<u8>, Option<Certs<'_>>) {
    let Some(bundle) = v.bundle().filter(|b| !b.certs.is_empty()) else {
        return (v.encode(), None);
    };
    // Every field named (no `..`): a field added to versions cannot be left out of the store
    // unseen.
    let ConfigVersion {
        schema,
        fleet,
        version,
        parent,
        sha256,
        created_unix_ms,
        causes,
        notes,
        restores,
        size,
        body: _,
        signature,
        quarantined,
        routes,
    } = v;
    let without = Bundle::new(bundle.config.clone(), bundle.maps.clone(), Vec::new());
    let stripped = ConfigVersion {
        schema: *schema,
        fleet: fleet.clone(),
        version: *version,
        parent: *parent,
        sha256: sha256.clone(),
        created_unix_ms: *created_unix_ms,
        causes: causes.clone(),
        notes: notes.clone(),
        restores: *restores,
        size: *size,
        body: Body::Inline { bundle: without },
        signature: signature.clone(),
        quarantined: quarantined.clone(),
        routes: *routes,
    };
    let ids = bundle.cert_ids();
    let mut json = stripped.encode();
    // One more field before the object's closing brace.
    assert_eq!(json.pop(), Some(b'}'), "a version encodes as a JSON object");
    json.extend_from_slice(format!(",\"{IDS_FIELD}\":").as_bytes());
    serde_json::to_writer(&mut json, &*ids).expect("ids serialize");
    json.push(b'}');
    (json, Some((ids, &bundle.certs)))
}

#[derive(serde::Deserialize)]
struct StoredIds {
    #[serde(default, rename = "stored_cert_ids")]
    ids: Vec<String>,
}

/// The version whose stored JSON is `json`, its certificates taken from `by_id` by the ids the
/// JSON names (versions stored whole carry theirs). `Err`: the JSON does not decode, or
/// `by_id` lacks an id (its message says which).
pub(super) fn join<E>(
    json: &[u8],
    by_id: impl Fn(&str) -> Result<SealedCert, E>,
) -> Result<Result<ConfigVersion, E>, serde_json::Error> {
    let mut v: ConfigVersion = serde_json::from_slice(json)?;
    let StoredIds { ids } = serde_json::from_slice(json)?;
    if ids.is_empty() {
        return Ok(Ok(v));
    }
    let Body::Inline { bundle } = &mut v.body else { return Ok(Ok(v)) };
    let mut certs = Vec::with_capacity(ids.len());
    for id in &ids {
        match by_id(id) {
            Ok(cert) => certs.push(cert),
            Err(e) => return Ok(Err(e)),
        }
    }
    let (config, maps) = (std::mem::take(&mut bundle.config), std::mem::take(&mut bundle.maps));
    *bundle = Bundle::new(config, maps, certs);
    Ok(Ok(v))
}
