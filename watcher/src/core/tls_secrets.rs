//! Certificates from `kubernetes.io/tls` Secrets: checked here, before anything leaves the
//! watcher, and their private keys sealed to the fleet that serves them. Pure: no I/O.
//!
//! What a certificate must be to go anywhere: `tls.crt` only PEM certificates (end-entity
//! first) and `tls.key` one PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC), parsable, the key
//! the one the certificate's public key names, and not expired. Anything else is refused with a
//! reason for the Ingress's Warning Event, so `haproxy -c` never sees one tenant's bad Secret.
//! The key is re-encoded from its DER and sealed at once; its clear text never leaves this
//! module but in the sealed form, and no error or `Debug` output quotes it.

use hafleet_proto::tls::{certificates_pem, pem_block};
use hafleet_proto::{HttpHost, SealedCert};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use std::fmt;
use zeroize::Zeroizing;

/// The Secret type the watcher reads (and the only one it watches).
pub const SECRET_TYPE: &str = "kubernetes.io/tls";

/// Why a Secret's certificate is not served. Never quotes key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertProblem {
    #[error("has no {0}")]
    Missing(&'static str),
    #[error("tls.crt holds no PEM certificate")]
    NoCertificate,
    #[error("tls.crt: certificate {index} does not parse: {why}")]
    Unparsable { index: usize, why: String },
    #[error("tls.key holds no PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC)")]
    NoKey,
    #[error("tls.key is not a key HAProxy and this watcher can use ({0})")]
    UnsupportedKey(String),
    #[error("tls.key does not match the certificate's public key")]
    KeyMismatch,
    #[error("the certificate expired at {0}")]
    Expired(String),
    #[error("the certificate is not valid before {0}")]
    NotYetValid(String),
    #[error("the certificate names no DNS name (subjectAltName)")]
    NoNames,
    #[error(
        "tls.crt: certificate {index} is signed with {algorithm}, which HAProxy's OpenSSL refuses"
    )]
    WeakSignature { index: usize, algorithm: &'static str },
}

/// Signature algorithms OpenSSL 3 refuses at its default security level: (OID, name).
const WEAK_SIGNATURES: &[(&str, &str)] = &[
    ("1.2.840.113549.1.1.2", "md2WithRSAEncryption"),
    ("1.2.840.113549.1.1.4", "md5WithRSAEncryption"),
    ("1.2.840.113549.1.1.5", "sha1WithRSAEncryption"),
    ("1.2.840.10045.4.1", "ecdsa-with-SHA1"),
    ("1.2.840.10040.4.3", "dsa-with-sha1"),
];

/// A certificate that passed every check, with its key in clear (zeroed when dropped). Its
/// `Debug` shows the fingerprint and names only.
pub struct CheckedCert {
    pub fingerprint: String,
    pub names: Vec<HttpHost>,
    pub not_after_unix: i64,
    pub not_before_unix: i64,
    pub chain_pem: String,
    /// sha256 of `chain_pem`, lowercase hex: what a seal of it is kept by.
    pub chain_sha256: String,
    key_pem: Zeroizing<String>,
}

impl fmt::Debug for CheckedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckedCert")
            .field("fingerprint", &self.fingerprint)
            .field("names", &self.names)
            .field("not_after_unix", &self.not_after_unix)
            .finish_non_exhaustive()
    }
}

/// Checks a `kubernetes.io/tls` Secret's `tls.crt` and `tls.key` at time `now_unix`.
pub fn check(
    crt: Option<&[u8]>,
    key: Option<&[u8]>,
    now_unix: i64,
) -> Result<CheckedCert, CertProblem> {
    let crt = crt.ok_or(CertProblem::Missing("tls.crt"))?;
    let key = key.ok_or(CertProblem::Missing("tls.key"))?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(crt)
        .collect::<Result<_, _>>()
        .map_err(|_| CertProblem::NoCertificate)?;
    let first = chain.first().ok_or(CertProblem::NoCertificate)?;
    for (index, der) in chain.iter().enumerate() {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| CertProblem::Unparsable { index, why: e.to_string() })?;
        // What OpenSSL 3 refuses to load ("md too weak"): one such certificate would make
        // `haproxy -c` fail for the whole fleet.
        let oid = cert.signature_algorithm.algorithm.to_id_string();
        if let Some((_, name)) = WEAK_SIGNATURES.iter().find(|(o, _)| *o == oid) {
            return Err(CertProblem::WeakSignature { index, algorithm: name });
        }
    }
    let (_, leaf) = x509_parser::parse_x509_certificate(first)
        .map_err(|e| CertProblem::Unparsable { index: 0, why: e.to_string() })?;

    // Only the key's kind and DER are kept; the text around it (comments, other blocks) is not.
    let key_der = PrivateKeyDer::from_pem_slice(key).map_err(|_| CertProblem::NoKey)?;
    let label = match &key_der {
        PrivateKeyDer::Pkcs1(_) => "RSA PRIVATE KEY",
        PrivateKeyDer::Sec1(_) => "EC PRIVATE KEY",
        PrivateKeyDer::Pkcs8(_) => "PRIVATE KEY",
        _ => return Err(CertProblem::UnsupportedKey("unknown encoding".into())),
    };
    let key_pem = Zeroizing::new(pem_block(label, key_der.secret_der()));
    let signing = rustls::crypto::ring::sign::any_supported_type(&key_der)
        .map_err(|e| CertProblem::UnsupportedKey(e.to_string()))?;
    let certified = rustls::sign::CertifiedKey::new(chain.clone(), signing);
    certified.keys_match().map_err(|e| match e {
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
            CertProblem::KeyMismatch
        }
        other => CertProblem::UnsupportedKey(other.to_string()),
    })?;

    let validity = leaf.validity();
    let (not_before_unix, not_after_unix) =
        (validity.not_before.timestamp(), validity.not_after.timestamp());
    let mut names: Vec<HttpHost> = match leaf.subject_alternative_name() {
        Ok(Some(san)) => san
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(s) => {
                    HttpHost::new(s.to_ascii_lowercase()).ok()
                }
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    names.sort();
    names.dedup();
    if names.is_empty() {
        return Err(CertProblem::NoNames);
    }
    let chain_pem = certificates_pem(chain.iter().map(|c| c.as_ref()));
    let checked = CheckedCert {
        fingerprint: hafleet_proto::sha256_hex(first),
        names,
        not_after_unix,
        not_before_unix,
        chain_sha256: hafleet_proto::sha256_hex(chain_pem.as_bytes()),
        chain_pem,
        key_pem,
    };
    checked.usable_at(now_unix)?;
    Ok(checked)
}

impl CheckedCert {
    /// Whether it is valid at `now_unix`: checked at each use, since a result is kept while
    /// its Secret does not change (a certificate issued a little ahead of this clock becomes
    /// usable by itself, and one expires by itself).
    pub fn usable_at(&self, now_unix: i64) -> Result<(), CertProblem> {
        if self.not_after_unix <= now_unix {
            return Err(CertProblem::Expired(rfc3339(self.not_after_unix)));
        }
        // A certificate issued just now by a machine whose clock is a little ahead of this
        // one is taken (clients allow the same skew).
        if self.not_before_unix > now_unix + NOT_BEFORE_SKEW_SECS {
            return Err(CertProblem::NotYetValid(rfc3339(self.not_before_unix)));
        }
        Ok(())
    }
}

/// How far in the future a certificate's notBefore may be and still count as valid now.
pub const NOT_BEFORE_SKEW_SECS: i64 = 300;

/// Unix seconds as RFC 3339 (UTC), for notes.
fn rfc3339(t: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(t)
        .ok()
        .and_then(|d| d.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| format!("Unix time {t}"))
}

/// A fleet's public sealing key (an age X25519 recipient, `age1…`), as the platform team
/// configures it for the watcher.
#[derive(Clone)]
pub struct SealTo(age::x25519::Recipient);

impl fmt::Debug for SealTo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SealTo({})", self.0)
    }
}

impl std::str::FromStr for SealTo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.trim().parse::<age::x25519::Recipient>().map(SealTo).map_err(|_| {
            "not an age X25519 recipient (age1…, as `hafleet keygen` prints it)".into()
        })
    }
}

impl CheckedCert {
    /// The certificate with its key encrypted to `to`. Each call seals anew (age picks a
    /// fresh ephemeral key), so callers keep the result rather than seal again.
    pub fn seal(&self, to: &SealTo) -> SealedCert {
        let mut armored = Vec::new();
        {
            let encryptor = age::Encryptor::with_recipients(std::iter::once(&to.0 as _))
                .expect("one recipient");
            let armor = age::armor::ArmoredWriter::wrap_output(
                &mut armored,
                age::armor::Format::AsciiArmor,
            )
            .expect("writing to memory");
            let mut w = encryptor.wrap_output(armor).expect("writing to memory");
            std::io::Write::write_all(&mut w, self.key_pem.as_bytes()).expect("writing to memory");
            w.finish().and_then(|armor| armor.finish()).expect("writing to memory");
        }
        SealedCert {
            fingerprint: self.fingerprint.clone(),
            names: self.names.clone(),
            not_after_unix: self.not_after_unix,
            chain_pem: self.chain_pem.as_str().into(),
            sealed_key: String::from_utf8(armored).expect("age armor is ASCII").into(),
            recipient: to.0.to_string(),
        }
    }
}

/// One `spec.tls` entry as the Ingress gives it (or an HTTPS listener's certificate for the
/// hosts an HTTPRoute routes through it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecEntry {
    pub hosts: Vec<String>,
    pub secret: Option<String>,
    /// The Secret's namespace; `None`: the object's own.
    pub namespace: Option<String>,
}

impl SpecEntry {
    /// The entries of an Ingress's `spec.tls`.
    pub fn of(ingress: &k8s_openapi::api::networking::v1::Ingress) -> Vec<SpecEntry> {
        let tls = ingress.spec.as_ref().and_then(|s| s.tls.as_deref()).unwrap_or_default();
        tls.iter()
            .map(|t| SpecEntry {
                hosts: t.hosts.clone().unwrap_or_default(),
                secret: t.secret_name.clone().filter(|s| !s.is_empty()),
                namespace: None,
            })
            .collect()
    }
}

/// What Secret (namespace, name) gives for a fleet: its certificate sealed to the fleet; or
/// why not, `None` when there is nothing to tell the Ingress's owner (the Secret could not be
/// read yet).
pub type Lookup<'a> =
    dyn FnMut(&str, &str) -> Result<std::sync::Arc<SealedCert>, Option<String>> + 'a;

/// The TLS entries of an Ingress in `namespace` that routes `routed` hosts (after tenancy: a
/// namespace never installs a certificate for a host it does not route), and the warnings
/// (reason, note) for its owner. An entry without hosts stands for every routed host its
/// certificate covers. A Secret `lookup` cannot use gives an entry without a certificate (its
/// hosts keep theirs) and a warning naming the Secret and why.
///
/// A certificate that expires before `warn_after_unix` gives a `CertificateExpiring` warning
/// (it is still served).
pub fn entries(
    namespace: &str,
    spec: &[SpecEntry],
    routed: &std::collections::BTreeSet<HttpHost>,
    lookup: &mut Lookup<'_>,
    warn_after_unix: i64,
) -> (Vec<hafleet_proto::TlsEntry>, Vec<(&'static str, String)>) {
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    for (i, e) in spec.iter().enumerate() {
        let at = format!("spec.tls[{i}]");
        let Some(secret) = &e.secret else {
            warnings
                .push(("InvalidTLS", format!("{at} names no secretName: not served over HTTPS")));
            continue;
        };
        let Ok(secret_name) = hafleet_proto::ObjectName::new(secret.as_str()) else {
            warnings.push(("InvalidTLS", format!("{at}.secretName is not a valid Secret name")));
            continue;
        };
        let mut hosts = Vec::new();
        for h in &e.hosts {
            match HttpHost::new(h.to_ascii_lowercase()) {
                Ok(h) if routed.contains(&h) => hosts.push(h),
                Ok(h) => warnings.push((
                    "TLSHostNotRouted",
                    format!(
                        "{at}: host {h} is not routed by this Ingress here; no certificate for it"
                    ),
                )),
                Err(err) => warnings.push(("InvalidTLS", format!("{at}.hosts: {err}"))),
            }
        }
        let wanted_all = e.hosts.is_empty();
        let namespace = e.namespace.as_deref().unwrap_or(namespace);
        if wanted_all {
            hosts = routed.iter().cloned().collect();
        }
        if hosts.is_empty() {
            continue;
        }
        let cert = match lookup(namespace, secret) {
            Ok(cert) => {
                let (covered, not): (Vec<HttpHost>, Vec<HttpHost>) =
                    hosts.into_iter().partition(|h| {
                        cert.names.iter().any(|n| hafleet_proto::tls::name_covers(n, h))
                    });
                if !not.is_empty() && !wanted_all {
                    let names: Vec<&str> = not.iter().map(|h| h.as_str()).collect();
                    warnings.push((
                        "TLSHostNotCovered",
                        format!(
                            "{at}: Secret {namespace}/{secret}'s certificate does not cover {}; \
                             not served over HTTPS",
                            names.join(", ")
                        ),
                    ));
                }
                hosts = covered;
                if hosts.is_empty() {
                    continue;
                }
                if cert.not_after_unix < warn_after_unix {
                    warnings.push((
                        "CertificateExpiring",
                        format!(
                            "{at}: Secret {namespace}/{secret}'s certificate ({}) expires at {}; \
                             renew it",
                            cert.fingerprint,
                            rfc3339(cert.not_after_unix)
                        ),
                    ));
                }
                Some(SealedCert::clone(&cert))
            }
            Err(None) => None,
            Err(Some(why)) => {
                warnings.push((
                    "InvalidTLSSecret",
                    format!(
                        "{at}: Secret {namespace}/{secret}: {why}; its hosts keep the certificate \
                         they had, or get the fleet's default"
                    ),
                ));
                None
            }
        };
        hosts.sort();
        hosts.dedup();
        out.push(hafleet_proto::TlsEntry { hosts, secret: secret_name, cert });
    }
    out.sort();
    out.dedup();
    (out, warnings)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::process::Command;

    /// A self-signed certificate and key made by the `openssl` command, valid for `days`: `key`
    /// is `ec` (P-256, SEC1 as `openssl ecparam` writes it), `ec8` (P-256, PKCS#8) or `rsa`
    /// (2048, PKCS#8). Without names its only subjectAltName is an IP address.
    pub fn openssl_cert(names: &[&str], key: &str, days: u32) -> (Vec<u8>, Vec<u8>) {
        openssl_cert_with(names, key, days, &[])
    }

    /// [`openssl_cert`] with more arguments for `openssl req` (`-sha1`, say).
    pub fn openssl_cert_with(
        names: &[&str],
        key: &str,
        days: u32,
        more: &[&str],
    ) -> (Vec<u8>, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let (k, c) = (dir.path().join("k.pem"), dir.path().join("c.pem"));
        let ok = |cmd: &mut Command| {
            let out = cmd.output().expect("openssl runs");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        };
        let genkey: &[&str] = match key {
            "ec" => &["ecparam", "-name", "prime256v1", "-genkey", "-noout"],
            "ec8" => &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
            _ => &["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        };
        ok(Command::new("openssl").args(genkey).arg("-out").arg(&k));
        let san = if names.is_empty() {
            "IP:127.0.0.1".to_owned()
        } else {
            names.iter().map(|n| format!("DNS:{n}")).collect::<Vec<_>>().join(",")
        };
        ok(Command::new("openssl")
            .args(["req", "-x509", "-new", "-key"])
            .arg(&k)
            .arg("-out")
            .arg(&c)
            .args(["-days", &days.to_string(), "-subj", "/CN=hafleet-test"])
            .args(["-addext", &format!("subjectAltName={san}")])
            .args(more));
        (std::fs::read(&c).unwrap(), std::fs::read(&k).unwrap())
    }

    fn now() -> i64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
    }

    #[test]
    fn good_certificates_of_every_key_kind_pass_and_are_re_encoded() {
        for kind in ["ec", "ec8", "rsa"] {
            let (crt, key) = openssl_cert(&["a.example.com", "*.b.example.com"], kind, 30);
            let c = check(Some(&crt), Some(&key), now()).unwrap_or_else(|e| panic!("{kind}: {e}"));
            let names: Vec<&str> = c.names.iter().map(|n| n.as_str()).collect();
            assert_eq!(names, ["*.b.example.com", "a.example.com"], "{kind}");
            assert!(c.not_after_unix > now() + 29 * 86400, "{kind}");
            let der = CertificateDer::from_pem_slice(&crt).unwrap();
            assert_eq!(c.fingerprint, hafleet_proto::sha256_hex(&der), "{kind}");
            assert_eq!(
                hafleet_proto::tls::pem_certificates(&c.chain_pem).unwrap(),
                vec![der.to_vec()]
            );
            assert!(c.key_pem.contains("PRIVATE KEY-----\n"), "{kind}");
            assert!(!format!("{c:?}").contains("PRIVATE"), "Debug shows no key");
        }
    }

    #[test]
    fn bad_secrets_are_refused_with_a_reason_that_quotes_no_key() {
        let (crt, key) = openssl_cert(&["a.example.com"], "ec", 30);
        let (_, other_key) = openssl_cert(&["a.example.com"], "ec", 30);
        let (ip_crt, ip_key) = openssl_cert(&[], "ec", 30);
        let t = now();
        assert_eq!(check(None, Some(&key), t).unwrap_err(), CertProblem::Missing("tls.crt"));
        assert_eq!(check(Some(&crt), None, t).unwrap_err(), CertProblem::Missing("tls.key"));
        assert_eq!(check(Some(&key), Some(&key), t).unwrap_err(), CertProblem::NoCertificate);
        assert_eq!(check(Some(&crt), Some(&crt), t).unwrap_err(), CertProblem::NoKey);
        assert_eq!(check(Some(b"junk"), Some(&key), t).unwrap_err(), CertProblem::NoCertificate);
        assert_eq!(check(Some(&crt), Some(&other_key), t).unwrap_err(), CertProblem::KeyMismatch);
        let later = t + 31 * 86_400;
        assert!(matches!(check(Some(&crt), Some(&key), later), Err(CertProblem::Expired(_))));
        let earlier = t - 86_400;
        assert!(matches!(check(Some(&crt), Some(&key), earlier), Err(CertProblem::NotYetValid(_))));
        let just_before = t - 60;
        assert!(check(Some(&crt), Some(&key), just_before).is_ok(), "a minute of skew is taken");
        let read_early = check(Some(&crt), Some(&key), t).unwrap();
        assert!(matches!(read_early.usable_at(later), Err(CertProblem::Expired(_))));
        assert!(matches!(read_early.usable_at(earlier), Err(CertProblem::NotYetValid(_))));
        assert_eq!(check(Some(&ip_crt), Some(&ip_key), t).unwrap_err(), CertProblem::NoNames);
        let (sha1_crt, sha1_key) = openssl_cert_with(&["a.example.com"], "rsa", 30, &["-sha1"]);
        let weak = check(Some(&sha1_crt), Some(&sha1_key), t).unwrap_err();
        assert_eq!(
            weak,
            CertProblem::WeakSignature { index: 0, algorithm: "sha1WithRSAEncryption" }
        );
        let mut broken = String::from_utf8(crt.clone()).unwrap();
        broken = broken.replacen("MII", "MIX", 1);
        let err = check(Some(broken.as_bytes()), Some(&key), t).unwrap_err();
        assert!(
            matches!(err, CertProblem::Unparsable { .. } | CertProblem::NoCertificate),
            "{err}"
        );
        // What the checks say never quotes a key, whatever was wrong with it.
        let mut broken_key = String::from_utf8(other_key.clone()).unwrap();
        broken_key = broken_key.replacen("MH", "MX", 1);
        let errors = [
            check(Some(&crt), Some(&other_key), t),
            check(Some(&crt), Some(broken_key.as_bytes()), t),
            check(Some(&other_key), Some(&other_key), t),
            check(Some(&crt), Some(&crt), t),
        ];
        let key_lines: Vec<String> = [&other_key, &key]
            .iter()
            .flat_map(|k| String::from_utf8_lossy(k).lines().map(str::to_owned).collect::<Vec<_>>())
            .filter(|l| !l.starts_with("-----"))
            .collect();
        for e in errors {
            let e = e.unwrap_err();
            for text in [e.to_string(), format!("{e:?}")] {
                for line in &key_lines {
                    assert!(!text.contains(line.as_str()), "{text}");
                }
            }
        }
    }

    #[test]
    fn a_sealed_key_opens_only_with_its_fleet_identity_and_is_not_in_clear() {
        let (crt, key) = openssl_cert(&["a.example.com"], "ec8", 30);
        let c = check(Some(&crt), Some(&key), now()).unwrap();
        let edge = age::x25519::Identity::generate();
        let other = age::x25519::Identity::generate();
        let to: SealTo = edge.to_public().to_string().parse().unwrap();
        let sealed = c.seal(&to);
        sealed.check().unwrap();
        let key_body = String::from_utf8(key.clone()).unwrap().lines().nth(1).unwrap().to_owned();
        let json = serde_json::to_string(&sealed).unwrap();
        assert!(!json.contains(&key_body) && !json.contains("PRIVATE KEY"), "{json}");
        let open = |id: &age::x25519::Identity| {
            let r = age::armor::ArmoredReader::new(sealed.sealed_key.as_bytes());
            let d = age::Decryptor::new(r).ok()?;
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut d.decrypt(std::iter::once(id as _)).ok()?, &mut out)
                .ok()?;
            Some(out)
        };
        assert_eq!(open(&edge).unwrap(), c.key_pem.as_bytes());
        assert!(open(&other).is_none(), "another fleet's identity cannot open it");
        assert_ne!(c.seal(&to).sealed_key, sealed.sealed_key, "each seal is fresh");
        assert!("age1bad".parse::<SealTo>().is_err());
    }

    #[test]
    fn entries_cover_only_routed_hosts_their_certificate_names() {
        let (crt, key) = openssl_cert(&["a.example.com", "*.w.example.com"], "ec", 30);
        let to: SealTo = age::x25519::Identity::generate().to_public().to_string().parse().unwrap();
        let sealed = std::sync::Arc::new(check(Some(&crt), Some(&key), now()).unwrap().seal(&to));
        let h = |s: &str| HttpHost::new(s).unwrap();
        let routed: std::collections::BTreeSet<HttpHost> =
            [h("a.example.com"), h("x.w.example.com"), h("b.example.com")].into();
        let spec = vec![
            SpecEntry {
                hosts: vec![
                    "A.example.com".into(),
                    "x.w.example.com".into(),
                    "b.example.com".into(),
                    "c.example.com".into(),
                ],
                secret: Some("good".into()),
                namespace: None,
            },
            SpecEntry {
                hosts: vec!["b.example.com".into()],
                secret: Some("bad".into()),
                namespace: None,
            },
            SpecEntry { hosts: vec![], secret: Some("good".into()), namespace: None },
            SpecEntry { hosts: vec!["a.example.com".into()], secret: None, namespace: None },
        ];
        let mut asked = Vec::new();
        let mut lookup = |ns: &str, name: &str| {
            assert_eq!(ns, "team");
            asked.push(name.to_owned());
            if name == "good" { Ok(sealed.clone()) } else { Err(Some("has no tls.key".to_owned())) }
        };
        let soon = sealed.not_after_unix + 1;
        let (got, warnings) = entries("team", &spec, &routed, &mut lookup, 0);
        let (_, expiring) =
            entries("team", &spec[..1], &routed, &mut |_, _| Ok(sealed.clone()), soon);
        assert_eq!(
            expiring.iter().filter(|(r, _)| *r == "CertificateExpiring").count(),
            1,
            "{expiring:?}"
        );
        assert!(
            expiring
                .iter()
                .any(|(_, n)| n.contains("Secret team/good's certificate") && n.contains("renew"))
        );
        assert_eq!(asked, ["good", "bad", "good"]);
        assert_eq!(got.len(), 2, "{got:?}");
        let good = got.iter().find(|e| e.cert.is_some()).unwrap();
        assert_eq!(good.hosts, [h("a.example.com"), h("x.w.example.com")]);
        let bad = got.iter().find(|e| e.cert.is_none()).unwrap();
        assert_eq!(
            (bad.hosts.as_slice(), bad.secret.as_str()),
            ([h("b.example.com")].as_slice(), "bad")
        );
        let reasons: Vec<&str> = warnings.iter().map(|(r, _)| *r).collect();
        assert_eq!(
            reasons,
            ["TLSHostNotRouted", "TLSHostNotCovered", "InvalidTLSSecret", "InvalidTLS"]
        );
        assert!(warnings[1].1.contains("team/good") && warnings[1].1.contains("b.example.com"));
        assert!(warnings[2].1.contains("Secret team/bad: has no tls.key"));
    }
}
