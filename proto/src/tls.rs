//! Certificates as they travel from the watcher to the appliers: the public parts in clear, the
//! private key sealed (age, X25519) to the one fleet that serves it. Nothing here can read a
//! sealed key; the appliers open them (`hafleet-applier`'s `tls` module).
//!
//! A certificate's identity on a host is [`SealedCert::id`], the sha256 of its chain and its
//! sealed key together: the crt-list names each certificate file by it, the config names the
//! crt-list by its digest, and the renderer signs the config's sha256, so a version's signature
//! covers the sealed bytes too.

use crate::values::HttpHost;
use base64::Engine;
use serde::{Deserialize, Serialize};

/// Where a fleet's certificate files live on a host, next to the config (0700, files 0600).
pub const CERTS_DIR: &str = "hafleet-certs";

const CERT_BEGIN: &str = "-----BEGIN CERTIFICATE-----";
const CERT_END: &str = "-----END CERTIFICATE-----";
const AGE_BEGIN: &str = "-----BEGIN AGE ENCRYPTED FILE-----";
const AGE_END: &str = "-----END AGE ENCRYPTED FILE-----";

/// One certificate with its key sealed to a fleet.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SealedCert {
    /// sha256 of the DER end-entity certificate, lowercase hex: how history names it.
    pub fingerprint: String,
    /// The DNS names it is valid for (subject alternative names), lowercase, wildcards as
    /// `*.example.com`; names that are not valid hosts are left out.
    pub names: Vec<HttpHost>,
    /// notAfter, Unix seconds.
    pub not_after_unix: i64,
    /// The chain, end-entity first: PEM `CERTIFICATE` blocks re-encoded from DER, nothing
    /// else (no text, no key). Shared: a fleet's 10,000 certificates are copied into every
    /// version the renderer makes, and copying their text was a quarter of its time.
    pub chain_pem: std::sync::Arc<str>,
    /// The private key as PEM, encrypted with age to the fleet's recipient, ASCII-armored.
    /// Shared, as `chain_pem` is.
    pub sealed_key: std::sync::Arc<str>,
    /// The recipient (`age1…`) it is sealed to, so that a fleet whose identity is replaced
    /// gets its keys sealed anew.
    #[serde(default)]
    pub recipient: String,
}

/// Why a sealed certificate is not fit to reach a host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    #[error("certificate chain is not only PEM CERTIFICATE blocks")]
    Chain,
    #[error("fingerprint {claimed} is not the sha256 of the first certificate")]
    Fingerprint { claimed: String },
    #[error("sealed key is not an ASCII-armored age file")]
    SealedKey,
}

impl SealedCert {
    /// Its identity on hosts: sha256 of the chain, a NUL, and the sealed key, lowercase hex.
    pub fn id(&self) -> String {
        let mut bytes = Vec::with_capacity(self.chain_pem.len() + 1 + self.sealed_key.len());
        bytes.extend_from_slice(self.chain_pem.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(self.sealed_key.as_bytes());
        crate::sha256_hex(&bytes)
    }

    /// The path of its file (chain and key) relative to the config's folder.
    pub fn relative_path(&self) -> String {
        format!("{CERTS_DIR}/{}.pem", self.id())
    }

    /// Checks the shape of everything that reaches a host: the chain is PEM certificate
    /// blocks only, the fingerprint is the first one's, and the sealed key is an age armor
    /// (which cannot carry a line HAProxy would read as anything but base64).
    pub fn check(&self) -> Result<(), CertError> {
        let ders = pem_certificates(&self.chain_pem).ok_or(CertError::Chain)?;
        let first = ders.first().ok_or(CertError::Chain)?;
        if crate::sha256_hex(first) != self.fingerprint {
            return Err(CertError::Fingerprint { claimed: self.fingerprint.clone() });
        }
        if !is_age_armor(&self.sealed_key) {
            return Err(CertError::SealedKey);
        }
        Ok(())
    }
}

/// PEM for DER certificates: 64 base64 characters a line, as OpenSSL writes it.
pub fn certificates_pem<'a>(ders: impl IntoIterator<Item = &'a [u8]>) -> String {
    ders.into_iter().map(|der| pem_block("CERTIFICATE", der)).collect()
}

/// One PEM block: `-----BEGIN <label>-----`, the base64 of `der` in lines of 64, the END
/// line. Its base64 is zeroed when dropped and the text is sized once (no growth leaves a copy
/// behind in freed memory), so it serves for private keys too.
pub fn pem_block(label: &str, der: &[u8]) -> String {
    let b64 = zeroize::Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(der));
    let mut out = String::with_capacity(b64.len() + b64.len() / 64 + 2 * label.len() + 40);
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

/// Whether `text` is exactly one armored block: the line `begin`, base64 lines of at most
/// `max_line` characters, the line `end`, and nothing after it. What a host's file may hold
/// from a sealed payload or an opened key: nothing HAProxy would read as anything else.
pub fn is_one_block(text: &str, begin: &str, end: &str, max_line: usize) -> bool {
    let mut lines = text.lines();
    if lines.next() != Some(begin) {
        return false;
    }
    let mut ended = false;
    for line in lines {
        if ended {
            return false;
        }
        if line == end {
            ended = true;
        } else if line.is_empty() || line.len() > max_line || !line.bytes().all(is_base64_byte) {
            return false;
        }
    }
    ended
}

/// The DER certificates of a PEM text that holds exactly CERTIFICATE blocks with base64
/// lines and nothing else, or `None`.
pub fn pem_certificates(pem: &str) -> Option<Vec<Vec<u8>>> {
    let mut ders = Vec::new();
    let mut lines = pem.lines();
    while let Some(line) = lines.next() {
        if line != CERT_BEGIN {
            return None;
        }
        let mut b64 = String::new();
        loop {
            let line = lines.next()?;
            if line == CERT_END {
                break;
            }
            if line.is_empty() || line.len() > 76 || !line.bytes().all(is_base64_byte) {
                return None;
            }
            b64.push_str(line);
        }
        let der = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        if der.is_empty() {
            return None;
        }
        ders.push(der);
    }
    if ders.is_empty() || !pem.ends_with('\n') { None } else { Some(ders) }
}

fn is_base64_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'='
}

fn is_age_armor(text: &str) -> bool {
    is_one_block(text, AGE_BEGIN, AGE_END, 64)
}

/// One `spec.tls` entry of an Ingress: these hosts are served with this certificate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TlsEntry {
    /// Sorted, each once; hosts the Ingress routes, each covered by one of the certificate's
    /// names (when there is a certificate).
    pub hosts: Vec<HttpHost>,
    /// The Secret it came from, in the Ingress's namespace.
    pub secret: crate::ObjectName,
    /// `None`: the Secret is unusable as it stands (the Ingress has a Warning Event saying
    /// why); the hosts keep the certificate they were served with, or get the fleet's default.
    pub cert: Option<SealedCert>,
}

/// Whether a certificate name (`a.example.com` or `*.example.com`) covers `host` as TLS
/// clients check it: a wildcard stands for exactly one whole label.
pub fn name_covers(name: &HttpHost, host: &HttpHost) -> bool {
    let (name, host) = (name.as_str(), host.as_str());
    if name == host {
        return true;
    }
    match (name.strip_prefix("*."), host.split_once('.')) {
        (Some(parent), Some((label, rest))) => !label.is_empty() && label != "*" && rest == parent,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn armor() -> String {
        format!("{AGE_BEGIN}\nYWdlLWVuY3J5cHRpb24ub3JnL3YxCi0+IFgyNTUxOQ==\n{AGE_END}\n")
    }

    fn cert(der: &[u8]) -> SealedCert {
        SealedCert {
            fingerprint: crate::sha256_hex(der),
            names: vec![HttpHost::new("a.example.com").unwrap()],
            not_after_unix: 0,
            chain_pem: certificates_pem([der, b"intermediate".as_slice()]).into(),
            sealed_key: armor().into(),
            recipient: String::new(),
        }
    }

    #[test]
    fn a_chain_round_trips_through_pem_and_only_certificates_pass() {
        let der = vec![7u8; 100];
        let pem = certificates_pem([der.as_slice()]);
        assert!(pem.lines().all(|l| l.len() <= 64));
        assert_eq!(pem_certificates(&pem).unwrap(), vec![der]);
        for bad in [
            String::new(),
            pem.replace("CERTIFICATE", "PRIVATE KEY"),
            format!("{pem}junk\n"),
            pem.trim_end().to_owned(),
            pem.replacen('\n', "\n\n", 2),
            format!("{pem}-----BEGIN CERTIFICATE-----\nAAAA\n"),
            pem.replacen("A", "A\nbind :1\n", 1),
            format!("{pem}-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"),
        ] {
            assert!(pem_certificates(&bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_sealed_cert_checks_its_fingerprint_chain_and_armor() {
        let c = cert(b"end-entity");
        c.check().unwrap();
        assert_eq!(c.relative_path(), format!("hafleet-certs/{}.pem", c.id()));
        let mut wrong = c.clone();
        wrong.fingerprint = crate::sha256_hex(b"intermediate");
        assert!(matches!(wrong.check(), Err(CertError::Fingerprint { .. })));
        let mut key_in_clear = c.clone();
        key_in_clear.chain_pem =
            format!("{}-----BEGIN PRIVATE KEY-----\nAAAA\n", key_in_clear.chain_pem).into();
        assert_eq!(key_in_clear.check(), Err(CertError::Chain));
        let mut not_sealed = c.clone();
        not_sealed.sealed_key =
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".into();
        assert_eq!(not_sealed.check(), Err(CertError::SealedKey));
        let mut trailing = c.clone();
        trailing.sealed_key = format!("{}crt-list x\n", trailing.sealed_key).into();
        assert_eq!(trailing.check(), Err(CertError::SealedKey));
        let mut other_key = c.clone();
        other_key.sealed_key = other_key.sealed_key.replace("YWdl", "YWdm").into();
        assert_ne!(other_key.id(), c.id(), "the id covers the sealed key");
    }

    #[test]
    fn wildcard_names_cover_exactly_one_label() {
        let h = |s: &str| HttpHost::new(s).unwrap();
        assert!(name_covers(&h("a.example.com"), &h("a.example.com")));
        assert!(name_covers(&h("*.example.com"), &h("a.example.com")));
        assert!(name_covers(&h("*.example.com"), &h("*.example.com")));
        assert!(!name_covers(&h("*.example.com"), &h("example.com")));
        assert!(!name_covers(&h("*.example.com"), &h("a.b.example.com")));
        assert!(!name_covers(&h("a.example.com"), &h("b.example.com")));
        assert!(!name_covers(&h("a.example.com"), &h("*.example.com")));
    }
}
