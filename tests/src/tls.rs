//! Certificates for the HTTPS tests, the demo and the bench: made by `openssl` as an operator
//! would (self-signed, or by a CA of their own), put in `kubernetes.io/tls` Secrets, and
//! checked from the client side with `openssl s_client`.

use crate::stack::{Component, Stack, kubectl_apply, workspace_file};
use anyhow::{Context as _, Result};
use hafleet_applier::core::identity::FleetIdentity;
use k8s_openapi::api::core::v1::Secret;
use std::path::{Path, PathBuf};

fn openssl(args: &[&str]) -> Result<()> {
    let out = std::process::Command::new("openssl")
        .args(args)
        .output()
        .context("running openssl (tests/setup.sh installs it)")?;
    anyhow::ensure!(
        out.status.success(),
        "openssl {}: {}",
        args.first().unwrap_or(&""),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str().context("a UTF-8 temp path")
}

fn subject_alt_names(names: &[&str]) -> String {
    let san: Vec<String> = names.iter().map(|n| format!("DNS:{n}")).collect();
    format!("subjectAltName={}", san.join(","))
}

/// A self-signed P-256 certificate for `names` (the first is the CN), valid for 30 days, and
/// its key (SEC1 PEM).
pub fn self_signed(names: &[&str]) -> Result<(Vec<u8>, Vec<u8>)> {
    let dir = tempfile::tempdir()?;
    let (k, c) = (dir.path().join("k.pem"), dir.path().join("c.pem"));
    let (ks, cs) = (path_str(&k)?, path_str(&c)?);
    openssl(&["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", ks])?;
    let subj = format!("/CN={}", names[0]);
    let san = subject_alt_names(names);
    openssl(&[
        "req", "-x509", "-new", "-key", ks, "-out", cs, "-days", "30", "-subj", &subj, "-addext",
        &san,
    ])?;
    Ok((std::fs::read(c)?, std::fs::read(k)?))
}

/// A certificate authority of one's own, as the demo makes: its certificate is what clients
/// are given to trust (`curl --cacert`).
pub struct Ca {
    dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
}

impl Ca {
    /// A P-256 CA named `name`, valid for 30 days.
    pub fn new(name: &str) -> Result<Ca> {
        let dir = tempfile::tempdir()?;
        let (key, cert) = (dir.path().join("ca.key"), dir.path().join("ca.pem"));
        openssl(&["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", path_str(&key)?])?;
        openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            path_str(&key)?,
            "-out",
            path_str(&cert)?,
            "-days",
            "30",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ])?;
        Ok(Ca { dir, cert, key })
    }

    /// The CA's certificate (PEM).
    pub fn cert_pem(&self) -> Result<Vec<u8>> {
        Ok(std::fs::read(&self.cert)?)
    }

    /// A P-256 server certificate for `names` signed by this CA, valid for 30 days, and its
    /// key.
    pub fn issue(&self, names: &[&str]) -> Result<(Vec<u8>, Vec<u8>)> {
        let d = self.dir.path();
        let (k, csr, c, ext) =
            (d.join("leaf.key"), d.join("leaf.csr"), d.join("leaf.pem"), d.join("leaf.ext"));
        std::fs::write(
            &ext,
            format!(
                "{}\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n\
                 extendedKeyUsage=serverAuth\n",
                subject_alt_names(names)
            ),
        )?;
        openssl(&["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", path_str(&k)?])?;
        let subj = format!("/CN={}", names[0]);
        openssl(&["req", "-new", "-key", path_str(&k)?, "-out", path_str(&csr)?, "-subj", &subj])?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            path_str(&csr)?,
            "-CA",
            path_str(&self.cert)?,
            "-CAkey",
            path_str(&self.key)?,
            "-CAcreateserial",
            "-days",
            "30",
            "-extfile",
            path_str(&ext)?,
            "-out",
            path_str(&c)?,
        ])?;
        let (crt, key) = (std::fs::read(&c)?, std::fs::read(&k)?);
        for f in [&k, &csr, &c] {
            std::fs::remove_file(f)?;
        }
        Ok((crt, key))
    }
}

/// A CA made in process (rcgen), and the certificates it signs: for the NATS server of the
/// tests and the bench's thousands of certificates, where `openssl` per certificate is slow.
pub struct Issuer {
    ca: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Issuer {
    pub fn new(name: &str) -> Result<Issuer> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages =
            vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
        let ca = params.self_signed(&key)?;
        Ok(Issuer { ca, key })
    }

    /// A P-256 certificate for `name` (a DNS name or an IP address; PEM), valid from an hour
    /// ago for 30 days, and its key (PKCS#8 PEM).
    pub fn issue(&self, name: &str) -> Result<(String, String)> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(vec![name.to_owned()])?;
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(30);
        let cert = params.signed_by(&key, &self.ca, &self.key)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// The CA's certificate (PEM).
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// The CA's certificate (DER).
    pub fn ca_der(&self) -> rustls_pki_types::CertificateDer<'static> {
        self.ca.der().clone()
    }
}

/// A `kubernetes.io/tls` Secret `name` holding `crt` and `key`.
pub fn tls_secret(name: &str, crt: &[u8], key: &[u8]) -> Result<Secret> {
    use base64::Engine;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": name},
        "data": {"tls.crt": b64(crt), "tls.key": b64(key)}
    }))?)
}

/// The DER of the first PEM block of `pem`.
pub fn pem_der(pem: &[u8]) -> Result<Vec<u8>> {
    use base64::Engine;
    let text = String::from_utf8_lossy(pem);
    let body: String = text
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    Ok(base64::engine::general_purpose::STANDARD.decode(body)?)
}

/// The sha256 of the DER of `pem`'s (first) certificate: how hafleet names it.
pub fn fingerprint(pem: &[u8]) -> Result<String> {
    Ok(hafleet_proto::sha256_hex(&pem_der(pem)?))
}

/// The certificate `addr` serves for SNI `sni`, by fingerprint; `None` when the handshake
/// fails (a name no certificate is listed for, with strict-sni).
pub async fn served_fingerprint(addr: std::net::SocketAddr, sni: &str) -> Result<Option<String>> {
    let out = tokio::process::Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-servername", sni])
        .stdin(std::process::Stdio::null())
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    // Refused means: connected, then the handshake failed (not: nothing listens there).
    anyhow::ensure!(text.contains("CONNECTED"), "no TLS listener at {addr}");
    let Some(start) = text.find("-----BEGIN CERTIFICATE-----") else { return Ok(None) };
    Ok(Some(fingerprint(text[start..].as_bytes())?))
}

/// GET / with `Host: host` over a TLS connection made for `sni`, the server's certificate
/// checked against `ca` and `sni`; the whole answer.
pub async fn https_get_as(
    addr: std::net::SocketAddr,
    sni: &str,
    host: &str,
    ca: &Path,
) -> Result<String> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new("openssl")
        .args(["s_client", "-quiet", "-verify_return_error", "-connect", &addr.to_string()])
        .args(["-servername", sni, "-verify_hostname", sni, "-CAfile"])
        .arg(ca)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let mut stdin = child.stdin.take().context("stdin")?;
    stdin.write_all(request.as_bytes()).await?;
    let out = tokio::time::timeout(std::time::Duration::from_secs(10), child.wait_with_output())
        .await
        .context("openssl s_client timed out")??;
    drop(stdin);
    anyhow::ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Writes `identity` to `dir/name` as `hafleet keygen` does: an age identity file
/// only its owner reads.
pub fn write_identity(dir: &Path, name: &str, identity: &FleetIdentity) -> Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
    f.write_all(identity.to_file_text().as_bytes())?;
    Ok(path)
}

/// Lets the watcher read the TLS Secrets of `namespaces` as the README says: the TLS RBAC
/// component's ClusterRole, and its example RoleBinding in each namespace.
pub async fn allow_tls_namespaces(stack: &Stack, namespaces: &[&str]) -> Result<()> {
    kubectl_apply(
        &stack.kube,
        &workspace_file("deploy/kubernetes/components/tls/watcher-tls-rbac.yaml"),
    )
    .await?;
    let example = std::fs::read_to_string(workspace_file(
        "deploy/kubernetes/components/tls/tls-rolebinding.yaml",
    ))?;
    for ns in namespaces {
        stack.kube.ensure_namespace(ns).await?;
        let file = stack.dir().join(format!("tls-rolebinding-{ns}.yaml"));
        std::fs::write(&file, example.replace("namespace: default", &format!("namespace: {ns}")))?;
        kubectl_apply(&stack.kube, &file).await?;
    }
    Ok(())
}

/// Turns HTTPS on for `stack`'s fleet as the README says: the TLS RBAC component applied (the
/// watcher reads the Secrets of namespace `default`, or of the namespaces `watcher_env`'s
/// `HAFLEET_TLS_NAMESPACES` names), a fleet identity made for its applier, the watcher
/// sealing to its recipient. `watcher_env` is more of the watcher's settings
/// (`HAFLEET_DEFAULT_CERT`, say). Returns the identity.
pub async fn tls_on(stack: &mut Stack, watcher_env: &[(&str, &str)]) -> Result<FleetIdentity> {
    let namespaces = watcher_env
        .iter()
        .find(|(k, _)| *k == "HAFLEET_TLS_NAMESPACES")
        .map_or("default", |(_, v)| *v);
    allow_tls_namespaces(stack, &namespaces.split(',').collect::<Vec<_>>()).await?;
    let identity = FleetIdentity::generate();
    let file = write_identity(stack.dir(), &format!("{}.age", stack.fleet), &identity)?;
    let seal_to = format!("{}={}", stack.fleet, identity.recipient());
    let mut env =
        vec![("HAFLEET_SEAL_TO", seal_to.as_str()), ("HAFLEET_TLS_NAMESPACES", "default")];
    env.extend_from_slice(watcher_env);
    stack.restart_with(Component::Watcher, &env)?;
    stack.restart_with(Component::Applier, &[("HAFLEET_TLS_IDENTITY", path_str(&file)?)])?;
    Ok(identity)
}

/// A TLS server on `addr` with certificate `cert` and key `key` (PEM) that answers each
/// connection's first bytes with an HTTP 200 whose body is `label`, then closes: the backend
/// of a passthrough route (a TLSRoute's), which only it can decrypt. Stops on drop of the
/// handle's task (abort).
pub async fn tls_answering(
    addr: std::net::SocketAddr,
    (cert, key): (&[u8], &[u8]),
    label: &str,
) -> Result<tokio::task::JoinHandle<()>> {
    use rustls_pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let chain = rustls_pki_types::CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .context("the certificate's PEM")?;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key).context("the key's PEM")?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let label = label.to_owned();
    Ok(tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let (acceptor, label) = (acceptor.clone(), label.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(conn).await else { return };
                let mut buf = [0u8; 4096];
                if !matches!(tls.read(&mut buf).await, Ok(n) if n > 0) {
                    return;
                }
                let body = format!("{label}\n");
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    }))
}
