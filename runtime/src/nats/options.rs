//! How the binaries connect to NATS: the URL, TLS (a CA, a client certificate) and the
//! credentials (a `.creds` file or an NKEY seed), each secret read from a file, never shown in
//! `--help`, a log line or an error.

use super::{Bus, BusError};
use hafleet_proto::FleetName;
use std::path::PathBuf;

/// The NATS settings every binary takes (`#[command(flatten)]`).
#[derive(Debug, Clone, clap::Args)]
pub struct NatsArgs {
    /// NATS server URL: `tls://host:4222` (TLS required) or `nats://host:4222`. Several
    /// servers of one cluster are given comma-separated (tls://nats-1:4222,nats-2:4222):
    /// the first that answers is used, and the client fails over to the others. Prefer
    /// --nats-creds to a user and password in the URL (nats://user:password@host:4222,
    /// still taken, percent-encoded, never shown in messages).
    #[arg(
        long,
        env = "HAFLEET_NATS_URL",
        default_value = "nats://127.0.0.1:4222",
        hide_env_values = true
    )]
    pub nats_url: String,
    /// CA certificates (PEM) that the server's certificate must chain to. Given, the
    /// connection is TLS or nothing, whatever the URL's scheme.
    #[arg(long, env = "HAFLEET_NATS_CA", value_name = "FILE")]
    pub nats_ca: Option<PathBuf>,
    /// A client certificate (PEM) for servers that verify clients (with --nats-key).
    #[arg(long, env = "HAFLEET_NATS_CERT", value_name = "FILE", requires = "nats_key")]
    pub nats_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM; keep it 0400).
    #[arg(long, env = "HAFLEET_NATS_KEY", value_name = "FILE", requires = "nats_cert")]
    pub nats_key: Option<PathBuf>,
    /// Who this component is to NATS: a `.creds` file (a user JWT and its NKEY seed, as
    /// `nsc` writes it) or a file holding an NKEY user seed alone (`SU…`, as `nk -gen user`
    /// writes it). Keep it 0400; its content is never shown.
    #[arg(long, env = "HAFLEET_NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// Copies JetStream keeps of each stream hafleet creates: 1 on a single server, 3 on a
    /// 3-node cluster, so that losing a node loses no acknowledged message. Streams that
    /// already exist keep theirs.
    #[arg(long, env = "HAFLEET_NATS_REPLICAS", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=5))]
    pub nats_replicas: u8,
}

impl NatsArgs {
    /// Settings for `url` alone (no TLS files, no credentials file).
    pub fn for_url(url: impl Into<String>) -> NatsArgs {
        NatsArgs {
            nats_url: url.into(),
            nats_ca: None,
            nats_cert: None,
            nats_key: None,
            nats_creds: None,
            nats_replicas: 1,
        }
    }

    /// Connects once: for a command that answers and exits (`history`, `status`).
    pub async fn connect(&self) -> Result<Bus, BusError> {
        let options = self.options(async_nats::ConnectOptions::new())?;
        Ok(Bus::connect_with(&self.nats_url, options, false)
            .await?
            .with_replicas(self.nats_replicas))
    }

    /// Connects, waiting for NATS with backoff and saying so: for a component's start-up.
    pub async fn connect_waiting(&self) -> Result<Bus, BusError> {
        let options = self.options(async_nats::ConnectOptions::new())?;
        Ok(Bus::connect_with(&self.nats_url, options, true)
            .await?
            .with_replicas(self.nats_replicas))
    }

    /// Connects as `fleet`'s applier, waiting for NATS like [`NatsArgs::connect_waiting`]:
    /// replies come to the fleet's own inbox prefix
    /// ([`hafleet_proto::applier_inbox_prefix`]), which its NATS user may subscribe to.
    pub async fn connect_as_applier(&self, fleet: &FleetName) -> Result<Bus, BusError> {
        let options = async_nats::ConnectOptions::new()
            .custom_inbox_prefix(hafleet_proto::applier_inbox_prefix(fleet));
        let options = self.options(options)?;
        Ok(Bus::connect_with(&self.nats_url, options, true)
            .await?
            .with_replicas(self.nats_replicas))
    }

    /// `options` with this TLS and these credentials.
    pub fn options(
        &self,
        mut options: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions, BusError> {
        let unusable = |what: &str, path: &std::path::Path, why: String| BusError::Settings {
            what: format!("{what} {}: {why}", path.display()),
        };
        if let Some(ca) = &self.nats_ca {
            // Read here, so that a missing file is said before any connection is tried.
            std::fs::metadata(ca).map_err(|e| unusable("--nats-ca", ca, e.to_string()))?;
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        if let (Some(cert), Some(key)) = (&self.nats_cert, &self.nats_key) {
            std::fs::metadata(cert).map_err(|e| unusable("--nats-cert", cert, e.to_string()))?;
            std::fs::metadata(key).map_err(|e| unusable("--nats-key", key, e.to_string()))?;
            options = options.add_client_certificate(cert.clone(), key.clone()).require_tls(true);
        }
        if self.nats_url.trim_start().starts_with("tls://") {
            options = options.require_tls(true);
        }
        if let Some(path) = &self.nats_creds {
            let text = zeroize::Zeroizing::new(
                std::fs::read_to_string(path)
                    .map_err(|e| unusable("--nats-creds", path, e.to_string()))?,
            );
            options = with_credentials(options, &text)
                .map_err(|why| unusable("--nats-creds", path, why))?;
        }
        Ok(options)
    }
}

/// `options` authenticating with `text`: a `.creds` file's content, or an NKEY user seed.
/// The error never quotes the text.
fn with_credentials(
    options: async_nats::ConnectOptions,
    text: &str,
) -> Result<async_nats::ConnectOptions, String> {
    let trimmed = text.trim();
    if trimmed.contains("BEGIN NATS USER JWT") {
        return options.credentials(trimmed).map_err(|_| {
            "not a .creds file a NATS client can read (a user JWT and its seed)".into()
        });
    }
    let is_seed = trimmed.starts_with("SU")
        && trimmed.len() == 58
        && trimmed.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit());
    if !is_seed {
        return Err("neither a .creds file nor an NKEY user seed (58 characters, SU…)".into());
    }
    Ok(options.nkey(trimmed.to_owned()))
}

/// Whether a connection error is one that waiting does not mend: TLS set up wrong, a
/// handshake refused on what either side presented, or a key the client cannot sign with.
pub(super) fn is_permanent(e: &async_nats::ConnectError) -> bool {
    use async_nats::ConnectErrorKind as Kind;
    match e.kind() {
        Kind::Tls | Kind::Authentication => true,
        Kind::Io => tls_failure(e).is_some(),
        _ => false,
    }
}

/// How a TLS handshake failed, as far as the settings go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TlsFailure {
    /// This client does not trust the server's certificate (--nats-ca, the URL's host).
    ServerNotTrusted,
    /// The server sent an alert: it refused what this client presented (no client
    /// certificate where it asks for one, or one it does not trust).
    RefusedByServer,
    /// Another handshake failure.
    Other,
}

/// The TLS failure behind a connection error: rustls's error inside the I/O error the
/// handshake returned. `None` when it is not one (a refused connection, a reset, a timeout).
fn tls_failure(e: &async_nats::ConnectError) -> Option<TlsFailure> {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let inner = match s.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|i| i as &(dyn std::error::Error + 'static)),
            None => Some(s),
        };
        if let Some(tls) = inner.and_then(|i| i.downcast_ref::<rustls::Error>()) {
            return Some(match tls {
                rustls::Error::InvalidCertificate(_) => TlsFailure::ServerNotTrusted,
                rustls::Error::AlertReceived(_) => TlsFailure::RefusedByServer,
                _ => TlsFailure::Other,
            });
        }
        source = s.source();
    }
    None
}

/// A connection error with what to check, for the errors that settings cause.
#[derive(Debug)]
pub(super) struct Explained(pub(super) async_nats::ConnectError);

impl std::fmt::Display for Explained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const TRUST: &str = "; check that --nats-ca holds the CA that signed the server's \
                             certificate, and that the URL names a host that certificate is for";
        let hint = match (self.0.kind(), tls_failure(&self.0)) {
            (_, Some(TlsFailure::ServerNotTrusted)) => TRUST,
            (_, Some(TlsFailure::RefusedByServer)) => {
                "; the server refused this client's TLS: where it asks clients for a \
                 certificate, give --nats-cert and --nats-key (a certificate signed by a CA \
                 the server trusts, and its key)"
            }
            (async_nats::ConnectErrorKind::Tls, _) | (_, Some(TlsFailure::Other)) => {
                "; check --nats-ca, and --nats-cert and --nats-key if the server asks for a \
                 client certificate"
            }
            (
                async_nats::ConnectErrorKind::Authentication
                | async_nats::ConnectErrorKind::AuthorizationViolation,
                _,
            ) => {
                "; check that --nats-creds holds this component's key, and that the server's \
                 configuration lists its public key"
            }
            _ => "",
        };
        write!(f, "{}{hint}", self.0)
    }
}

impl std::error::Error for Explained {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_a_creds_file_or_a_seed_and_never_quoted() {
        let seed = "SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4";
        assert!(with_credentials(async_nats::ConnectOptions::new(), &format!("{seed}\n")).is_ok());
        let secret = "SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC";
        let err = with_credentials(async_nats::ConnectOptions::new(), secret).unwrap_err();
        assert!(!err.contains(secret) && err.contains("NKEY user seed"), "{err}");
        let err = with_credentials(async_nats::ConnectOptions::new(), "hunter2").unwrap_err();
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn a_missing_file_is_said_before_connecting() {
        let mut args = NatsArgs::for_url("tls://127.0.0.1:4222");
        args.nats_ca = Some("/nonexistent/ca.pem".into());
        let err = args.options(async_nats::ConnectOptions::new()).unwrap_err().to_string();
        assert!(err.contains("--nats-ca /nonexistent/ca.pem"), "{err}");
    }
}
