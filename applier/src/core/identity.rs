//! Opening the certificates of a version: each private key was sealed by the watcher to this
//! fleet's age X25519 recipient, and only this fleet's identity (a file on the applier's machine,
//! never on NATS) opens it. Pure: the identity's text comes in, a certificate file's content
//! (chain and key, for a file HAProxy reads at 0600) goes out, zeroed when dropped. No error
//! and no `Debug` output quotes a key.

use hafleet_proto::SealedCert;
use std::fmt;
use zeroize::Zeroizing;

/// This fleet's private unsealing key. Its `Debug` shows the public half only.
pub struct FleetIdentity(age::x25519::Identity);

impl fmt::Debug for FleetIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FleetIdentity(recipient {})", self.recipient())
    }
}

/// Why a certificate of a version cannot be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsealError {
    #[error(
        "certificate {fingerprint}: its sealed key does not open with this fleet's identity \
         (recipient {recipient}): sealed to another recipient (the watcher's --seal-to for the \
         fleet), or damaged"
    )]
    NotOurs { fingerprint: String, recipient: String },
    #[error("certificate {fingerprint}: the sealed key does not decrypt to one PEM private key")]
    NotAKey { fingerprint: String },
}

impl FleetIdentity {
    /// From an age identity file: `AGE-SECRET-KEY-1…` on a line, `#` comments allowed, as
    /// `hafleet keygen` or `age-keygen` write it. The error never quotes the text.
    pub fn from_text(text: &str) -> Result<FleetIdentity, String> {
        let keys: Vec<&str> =
            text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
        match keys.as_slice() {
            [one] => one.parse::<age::x25519::Identity>().map(FleetIdentity).map_err(|_| {
                "the identity file's key line is not an age X25519 identity (AGE-SECRET-KEY-1…)"
                    .to_owned()
            }),
            _ => Err(format!(
                "the identity file must hold exactly one AGE-SECRET-KEY-1… line, not {}",
                keys.len()
            )),
        }
    }

    /// A new identity, as `keygen` makes it.
    pub fn generate() -> FleetIdentity {
        FleetIdentity(age::x25519::Identity::generate())
    }

    /// The identity file's text (secret: write it 0600).
    pub fn to_file_text(&self) -> Zeroizing<String> {
        use age::secrecy::ExposeSecret;
        Zeroizing::new(format!(
            "# hafleet fleet identity: unseals the TLS keys the watcher seals to\n\
             # recipient: {}\n{}\n",
            self.recipient(),
            self.0.to_string().expose_secret()
        ))
    }

    /// The public half (`age1…`), for the watcher's `--seal-to FLEET=RECIPIENT`.
    pub fn recipient(&self) -> String {
        self.0.to_public().to_string()
    }

    /// The content of `cert`'s file on a host: its chain, then its key, opened.
    pub fn cert_file(&self, cert: &SealedCert) -> Result<Zeroizing<String>, UnsealError> {
        let not_ours = || UnsealError::NotOurs {
            fingerprint: cert.fingerprint.clone(),
            recipient: self.recipient(),
        };
        let reader = age::armor::ArmoredReader::new(cert.sealed_key.as_bytes());
        let decryptor = age::Decryptor::new(reader).map_err(|_| not_ours())?;
        // Room for any key the watcher seals (an RSA 4096 PEM is 3.3 KB) up front: a Vec
        // that grows leaves copies of the key in the memory it gives back.
        let mut key = Zeroizing::new(Vec::with_capacity(8192));
        let mut r = decryptor.decrypt(std::iter::once(&self.0 as _)).map_err(|_| not_ours())?;
        std::io::Read::read_to_end(&mut r, &mut key).map_err(|_| not_ours())?;
        let not_a_key = || UnsealError::NotAKey { fingerprint: cert.fingerprint.clone() };
        let key = std::str::from_utf8(&key).map_err(|_| not_a_key())?;
        if !is_one_private_key(key) {
            return Err(not_a_key());
        }
        let mut file = Zeroizing::new(String::with_capacity(cert.chain_pem.len() + key.len()));
        file.push_str(&cert.chain_pem);
        file.push_str(key);
        Ok(file)
    }
}

/// One PEM private key block (the labels the watcher writes) with base64 lines, and nothing
/// else: a sealed payload cannot smuggle anything else into a file HAProxy reads.
fn is_one_private_key(text: &str) -> bool {
    let Some(label) = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("-----BEGIN "))
        .and_then(|l| l.strip_suffix("-----"))
    else {
        return false;
    };
    ["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"].contains(&label)
        && hafleet_proto::tls::is_one_block(
            text,
            &format!("-----BEGIN {label}-----"),
            &format!("-----END {label}-----"),
            76,
        )
        && text.ends_with('\n')
}

/// Certificates sealed as the watcher seals them, for tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A private key's PEM as the watcher seals it (not a usable key).
    pub(crate) const KEY: &str =
        "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBcd\n-----END EC PRIVATE KEY-----\n";

    /// `payload` sealed to `recipient`, with a chain of the one "certificate" `der`.
    pub(crate) fn sealed_with(recipient: &str, payload: &str, der: &[u8]) -> SealedCert {
        let r: age::x25519::Recipient = recipient.parse().unwrap();
        let mut out = Vec::new();
        let e = age::Encryptor::with_recipients(std::iter::once(&r as _)).unwrap();
        let a = age::armor::ArmoredWriter::wrap_output(&mut out, age::armor::Format::AsciiArmor)
            .unwrap();
        let mut w = e.wrap_output(a).unwrap();
        std::io::Write::write_all(&mut w, payload.as_bytes()).unwrap();
        w.finish().unwrap().finish().unwrap();
        SealedCert {
            fingerprint: hafleet_proto::sha256_hex(der),
            names: vec![],
            not_after_unix: 0,
            chain_pem: hafleet_proto::tls::certificates_pem([der]).into(),
            sealed_key: String::from_utf8(out).unwrap().into(),
            recipient: String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{KEY, sealed_with};
    use super::*;

    fn sealed_to(recipient: &str, payload: &str) -> SealedCert {
        sealed_with(recipient, payload, b"not really a certificate")
    }

    #[test]
    fn only_the_fleet_identity_opens_its_keys_and_nothing_but_a_key_passes() {
        let edge = FleetIdentity::generate();
        let other = FleetIdentity::generate();
        let cert = sealed_to(&edge.recipient(), KEY);
        cert.check().unwrap();
        let file = edge.cert_file(&cert).unwrap();
        assert_eq!(file.as_str(), format!("{}{KEY}", cert.chain_pem));
        let err = other.cert_file(&cert).unwrap_err();
        assert!(matches!(err, UnsealError::NotOurs { .. }), "{err}");
        for bad in [
            format!("{KEY}bind :1\n"),
            KEY.replace("EC PRIVATE", "CERTIFICATE"),
            KEY.trim_end().to_owned(),
            format!("{KEY}{KEY}"),
        ] {
            let err = edge.cert_file(&sealed_to(&edge.recipient(), &bad)).unwrap_err();
            assert!(matches!(err, UnsealError::NotAKey { .. }), "{bad:?}");
            assert!(!err.to_string().contains("MHcC"));
        }
    }

    #[test]
    fn an_identity_file_round_trips_and_its_debug_hides_the_secret() {
        let id = FleetIdentity::generate();
        let text = id.to_file_text();
        let again = FleetIdentity::from_text(&text).unwrap();
        assert_eq!(again.recipient(), id.recipient());
        assert!(!format!("{id:?}").contains("AGE-SECRET-KEY"));
        assert!(FleetIdentity::from_text("# nothing\n").is_err());
        let err = FleetIdentity::from_text("AGE-SECRET-KEY-1NOTAKEY\n").unwrap_err();
        assert!(!err.contains("NOTAKEY"));
        assert!(FleetIdentity::from_text(&format!("{}{}", *text, *text)).is_err());
    }
}
