//! Versions signed by the renderer, verified by appliers before they touch a host.
//!
//! NATS permissions keep each component to its own subjects, but whoever holds the renderer's
//! NATS credentials (or the server) could still publish a config. So the renderer signs each
//! version with an ed25519 key only it holds, and an applier applies only versions signed by a
//! key it was configured with: NATS access alone cannot push a config to a load balancer.
//!
//! What is signed ([`statement`]) is the fleet, the version number and the sha256 of the
//! version's config. The config names every map file (and any other file of the bundle) by its
//! own sha256, so the signature covers every byte that reaches a host. An applier also checks
//! that a version is its own fleet's, so one signed for a fleet is refused by every other
//! fleet's applier. Not covered: how the message carries the bundle (inline, or in how many
//! chunks; a wrong body fails the sha256 check) and freshness: an older signed version of the
//! fleet, republished, still verifies (the applier's done-mark skips it while it runs; see the
//! README for the start-up case).
//!
//! Keys are the usual PEM files, so platform teams make and keep them with the tools they use
//! for any other key:
//! ```text
//! openssl genpkey -algorithm ed25519 -out signing.pem          # the renderer's (secret)
//! openssl pkey -in signing.pem -pubout -out signing.pub.pem    # every applier's
//! ```

use crate::ConfigVersion;
use ed25519_dalek::pkcs8::{DecodePrivateKey as _, DecodePublicKey as _};
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A version's signature: which key made it, and the ed25519 signature of its [`statement`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionSignature {
    /// The signing key's id: the first 16 hex digits of the sha256 of its 32-byte public key.
    pub key: String,
    /// 64 bytes, hex.
    pub ed25519: String,
}

/// Why a version is not accepted as the renderer's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("version {version} is not signed; appliers take only versions the renderer signed")]
    Unsigned { version: u64 },
    #[error(
        "version {version} is signed by key {key}, which this applier does not trust \
         (trusted: {trusted})"
    )]
    UnknownKey { version: u64, key: String, trusted: String },
    #[error(
        "version {version} has a signature by key {key} that does not verify: forged or altered"
    )]
    Invalid { version: u64, key: String },
    #[error("version {version} is fleet {got}'s, not this applier's fleet {want}")]
    OtherFleet { version: u64, got: String, want: String },
}

/// Why a key file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error(
        "not an ed25519 private key in PKCS#8 PEM (-----BEGIN PRIVATE KEY-----, as \
         `openssl genpkey -algorithm ed25519` writes it)"
    )]
    Private,
    #[error(
        "not an ed25519 public key in PEM (-----BEGIN PUBLIC KEY-----, as \
         `openssl pkey -in signing.pem -pubout` writes it)"
    )]
    Public,
}

/// The bytes a version's signature covers.
pub fn statement(v: &ConfigVersion) -> Vec<u8> {
    format!("hafleet config version\0v1\0{}\0{}\0{}", v.fleet, v.version, v.sha256).into_bytes()
}

fn key_id(key: &VerifyingKey) -> String {
    crate::sha256_hex(key.as_bytes())[..16].to_owned()
}

/// The renderer's signing key. Its `Debug` shows only the key id.
pub struct Signer {
    key: SigningKey,
    id: String,
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signer").field("key", &self.id).finish_non_exhaustive()
    }
}

impl Signer {
    /// From a PKCS#8 PEM private key. The error never quotes the text.
    pub fn from_pem(pem: &str) -> Result<Signer, KeyError> {
        let key = SigningKey::from_pkcs8_pem(pem).map_err(|_| KeyError::Private)?;
        let id = key_id(&key.verifying_key());
        Ok(Signer { key, id })
    }

    /// The id appliers see in signatures and in their errors.
    pub fn key_id(&self) -> &str {
        &self.id
    }

    /// `v` with its signature set.
    pub fn sign(&self, mut v: ConfigVersion) -> ConfigVersion {
        let sig = self.key.sign(&statement(&v));
        v.signature =
            Some(VersionSignature { key: self.id.clone(), ed25519: hex::encode(sig.to_bytes()) });
        v
    }
}

/// The public keys an applier trusts: more than one while a signing key is being replaced.
#[derive(Debug, Clone)]
pub struct Verifier {
    keys: Vec<(String, VerifyingKey)>,
}

impl Verifier {
    /// From PEM public keys; at least one.
    pub fn from_pems<'a>(pems: impl IntoIterator<Item = &'a str>) -> Result<Verifier, KeyError> {
        let keys = pems
            .into_iter()
            .map(|pem| {
                let key = VerifyingKey::from_public_key_pem(pem).map_err(|_| KeyError::Public)?;
                Ok((key_id(&key), key))
            })
            .collect::<Result<Vec<_>, KeyError>>()?;
        if keys.is_empty() {
            return Err(KeyError::Public);
        }
        Ok(Verifier { keys })
    }

    /// Ids of the trusted keys, for logs.
    pub fn key_ids(&self) -> Vec<&str> {
        self.keys.iter().map(|(id, _)| id.as_str()).collect()
    }

    /// Accepts `v` only if it is `fleet`'s and a trusted key signed exactly its fleet, number
    /// and sha256: a version signed for one fleet, republished on another's subject, is
    /// refused there.
    pub fn verify(
        &self,
        fleet: &crate::FleetName,
        v: &ConfigVersion,
    ) -> Result<(), SignatureError> {
        let version = v.version;
        if v.fleet != *fleet {
            return Err(SignatureError::OtherFleet {
                version,
                got: v.fleet.to_string(),
                want: fleet.to_string(),
            });
        }
        let Some(sig) = &v.signature else { return Err(SignatureError::Unsigned { version }) };
        let Some((_, key)) = self.keys.iter().find(|(id, _)| *id == sig.key) else {
            return Err(SignatureError::UnknownKey {
                version,
                key: sig.key.clone(),
                trusted: self.key_ids().join(", "),
            });
        };
        let invalid = || SignatureError::Invalid { version, key: sig.key.clone() };
        let bytes: [u8; 64] =
            hex::decode(&sig.ed25519).ok().and_then(|b| b.try_into().ok()).ok_or_else(invalid)?;
        key.verify_strict(&statement(v), &ed25519_dalek::Signature::from_bytes(&bytes))
            .map_err(|_| invalid())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Bundle, FleetName};

    // Made with `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout`: the formats
    // operators hand to hafleet.
    const PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIM9ubYZcNVmpOvFOEv9BHY1W4/Ws0RGp4FAGNm6HW5Bb
-----END PRIVATE KEY-----
";
    const OTHER_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIDZykN229AP2ayUzInlTcnF0+egaoapH2kjX5ixjrOTt
-----END PRIVATE KEY-----
";

    fn public_of(private: &str) -> String {
        use ed25519_dalek::pkcs8::EncodePublicKey as _;
        let key = SigningKey::from_pkcs8_pem(private).unwrap();
        key.verifying_key().to_public_key_pem(Default::default()).unwrap()
    }

    fn edge() -> FleetName {
        FleetName::new("edge").unwrap()
    }

    fn version(fleet: &str, n: u64, config: &str) -> ConfigVersion {
        let bundle = Bundle::new(config.into(), vec![], vec![]);
        ConfigVersion::inline(FleetName::new(fleet).unwrap(), n, bundle)
    }

    #[test]
    fn a_signed_version_verifies_and_any_change_to_what_reaches_a_host_does_not() {
        let signer = Signer::from_pem(PRIVATE).unwrap();
        let verifier = Verifier::from_pems([public_of(PRIVATE).as_str()]).unwrap();
        let signed = signer.sign(version("edge", 7, "global\n"));
        verifier.verify(&edge(), &signed).unwrap();
        // Through the wire and back.
        verifier.verify(&edge(), &ConfigVersion::decode(&signed.encode()).unwrap()).unwrap();

        let mut other_fleet = signed.clone();
        other_fleet.fleet = FleetName::new("internal").unwrap();
        let mut other_number = signed.clone();
        other_number.version = 8;
        let forged = version("edge", 7, "global\n  # evil\n");
        let mut other_config = forged.clone();
        other_config.signature = signed.signature.clone();
        for bad in [other_number, other_config] {
            assert!(
                matches!(verifier.verify(&edge(), &bad), Err(SignatureError::Invalid { .. })),
                "{bad:?}"
            );
        }
        // Relabelled for another fleet, the signature fails there; signed for another fleet,
        // it is that fleet's and refused here.
        let internal = FleetName::new("internal").unwrap();
        let invalid = verifier.verify(&internal, &other_fleet);
        assert!(matches!(invalid, Err(SignatureError::Invalid { .. })));
        let theirs = signer.sign(version("internal", 7, "global\n"));
        verifier.verify(&internal, &theirs).unwrap();
        let refused = verifier.verify(&edge(), &theirs);
        assert!(matches!(refused, Err(SignatureError::OtherFleet { .. })), "{refused:?}");
        assert_eq!(verifier.verify(&edge(), &forged), Err(SignatureError::Unsigned { version: 7 }));
        let mut garbage = signed.clone();
        garbage.signature.as_mut().unwrap().ed25519 = "zz".into();
        assert!(matches!(verifier.verify(&edge(), &garbage), Err(SignatureError::Invalid { .. })));
    }

    #[test]
    fn only_trusted_keys_count_and_two_may_be_trusted_during_a_key_change() {
        let ours = Signer::from_pem(PRIVATE).unwrap();
        let theirs = Signer::from_pem(OTHER_PRIVATE).unwrap();
        assert_ne!(ours.key_id(), theirs.key_id());
        let only_ours = Verifier::from_pems([public_of(PRIVATE).as_str()]).unwrap();
        let by_them = theirs.sign(version("edge", 1, "global\n"));
        let err = only_ours.verify(&edge(), &by_them).unwrap_err();
        assert!(matches!(err, SignatureError::UnknownKey { .. }));
        assert!(err.to_string().contains(theirs.key_id()), "{err}");
        let both =
            Verifier::from_pems([public_of(PRIVATE).as_str(), public_of(OTHER_PRIVATE).as_str()])
                .unwrap();
        both.verify(&edge(), &by_them).unwrap();
        both.verify(&edge(), &ours.sign(version("edge", 2, "global\n"))).unwrap();
    }

    #[test]
    fn key_material_stays_out_of_errors_and_debug_output() {
        let signer = Signer::from_pem(PRIVATE).unwrap();
        let shown = format!("{signer:?}");
        assert!(shown.contains(signer.key_id()) && !shown.contains("MC4C"), "{shown}");
        let err = Signer::from_pem(&PRIVATE.replace("MC4C", "MC5C")).unwrap_err().to_string();
        assert!(!err.contains("MC"), "{err}");
        assert!(Verifier::from_pems([PRIVATE]).is_err(), "a private key is not a public key");
        assert!(Verifier::from_pems([]).is_err());
    }
}
