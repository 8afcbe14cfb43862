//! `hafleet-bench tls`: HTTPS at scale, in two parts.
//!
//! HAProxy alone, for each of `--certs` (10, 1,000, 10,000): ECDSA P-256 certificates made
//! with rcgen, signed by a bench CA, one file (chain and key) each and a crt-list naming
//! `tls-<i>.example.com`, on the built-in template's bind options (`strict-sni`, ALPN
//! h2,http/1.1); `haproxy -c` time, start-to-serving time, and full TLS 1.3 handshakes per
//! second (no resumption; each connection one handshake, one request, closed) for the first
//! and the last name, from `--connections` clients in this process.
//!
//! The pipeline, on `--hosts` hosts: `--pipeline-certs` TLS Ingresses, each with a Secret of
//! its own, created and served on every host; then a host added to the fleet, timed from the
//! applier's start to that host serving every certificate (a host joining, or rebuilt, in a
//! fleet of that many certificates); then `--rotations` rotations of one Secret, each timed
//! from the patch returning to every host serving the new certificate, with the masters'
//! reload counters compared before and after.

use anyhow::{Context, Result, bail};
use hafleet_tests::cluster::{ready_nodes, service_with_backends};
use hafleet_tests::stack::Stack;
use hafleet_tests::{ChildGuard, HaproxyHost, TestDir, eventually, free_port, random_loopback_ip};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, PostParams};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, clap::Args)]
pub struct TlsArgs {
    /// Certificate counts for the HAProxy-alone cases.
    #[arg(long, value_delimiter = ',', default_value = "10,1000,10000")]
    certs: Vec<usize>,
    /// Seconds of handshakes per name.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Concurrent clients, each one connection at a time.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// TLS Ingresses (each with a Secret of its own) in the pipeline cases; 0 skips them.
    #[arg(long, default_value_t = 1000)]
    pipeline_certs: usize,
    /// Rotations measured in the pipeline.
    #[arg(long, default_value_t = 50)]
    rotations: usize,
    /// HAProxy hosts in the fleet before one is added.
    #[arg(long, default_value_t = 2)]
    hosts: usize,
}

// The bench's CA (hafleet_tests::tls::Issuer), and clients that trust it.
use hafleet_tests::tls::Issuer;

/// A client that trusts `issuer`'s CA only, resumes no session, and offers no ALPN.
trait Client {
    fn client(&self) -> Result<tokio_rustls::TlsConnector>;
}

impl Client for Issuer {
    fn client(&self) -> Result<tokio_rustls::TlsConnector> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der())?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.resumption = rustls::client::Resumption::disabled();
        Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
    }
}

fn name(i: usize) -> String {
    format!("tls-{i}.example.com")
}

/// One handshake for `sni` at `addr`: the sha256 of the certificate served, checked by the
/// client against the CA and the name.
async fn served(tls: &tokio_rustls::TlsConnector, addr: SocketAddr, sni: &str) -> Result<String> {
    let tcp = TcpStream::connect(addr).await?;
    let server = rustls_pki_types::ServerName::try_from(sni.to_owned())?;
    let stream = tokio::time::timeout(Duration::from_secs(5), tls.connect(server, tcp))
        .await
        .context("handshake timed out")??;
    let certs = stream.get_ref().1.peer_certificates().context("no certificate")?;
    Ok(hafleet_proto::sha256_hex(certs.first().context("no certificate")?.as_ref()))
}

/// Full handshakes per second for `sni`, each followed by one request answered and the
/// connection closed.
async fn handshakes(
    tls: &tokio_rustls::TlsConnector,
    addr: SocketAddr,
    sni: &str,
    a: &TlsArgs,
) -> Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    let request = format!("GET / HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..a.connections {
        let (tls, request) = (tls.clone(), request.clone());
        let server = rustls_pki_types::ServerName::try_from(sni.to_owned())?;
        tasks.spawn(async move {
            let mut done = 0u64;
            let mut buf = Vec::with_capacity(512);
            while Instant::now() < deadline {
                let tcp = TcpStream::connect(addr).await?;
                tcp.set_nodelay(true)?;
                let mut stream = tls.connect(server.clone(), tcp).await?;
                stream.write_all(request.as_bytes()).await?;
                buf.clear();
                // HAProxy closes after the answer; a TLS close_notify may or may not come.
                let _ = stream.read_to_end(&mut buf).await;
                if !buf.starts_with(b"HTTP/1.1 200") {
                    bail!("answered {:?}", String::from_utf8_lossy(&buf));
                }
                done += 1;
            }
            Ok::<u64, anyhow::Error>(done)
        });
    }
    crate::per_second(tasks).await
}

/// `n` certificate files and a crt-list for them in `dir`; returns the crt-list's path.
fn write_certs(dir: &Path, issuer: &Issuer, n: usize) -> Result<std::path::PathBuf> {
    use std::fmt::Write as _;
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs)?;
    let mut list = String::new();
    for i in 0..n {
        let (crt, key) = issuer.issue(&name(i))?;
        let file = certs.join(format!("{i}.pem"));
        std::fs::write(&file, format!("{crt}{key}"))?;
        writeln!(list, "{} {}", file.display(), name(i))?;
    }
    let path = dir.join("certs.list");
    std::fs::write(&path, list)?;
    Ok(path)
}

/// HAProxy alone with `n` certificates: check, start, handshakes.
async fn haproxy_alone(issuer: &Issuer, n: usize, a: &TlsArgs) -> Result<String> {
    let dir = TestDir::new("hafleet-bench-tls")?;
    let made = Instant::now();
    let list = write_certs(dir.path(), issuer, n)?;
    let made_s = made.elapsed().as_secs_f64();
    let ip = random_loopback_ip();
    let addr = SocketAddr::new(ip.into(), free_port(ip.into()));
    let config = dir.path().join("haproxy.cfg");
    std::fs::write(
        &config,
        format!(
            "global\n    httpclient.ssl.verify none\n\ndefaults\n    mode http\n    \
             timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\n\
             frontend https\n    bind {addr} ssl crt-list {list} strict-sni alpn h2,http/1.1\n    \
             http-request return status 200 content-type text/plain string ok\n",
            list = list.display()
        ),
    )?;
    let check_ms = crate::check_config(&config)?;
    let started = Instant::now();
    let mut cmd = std::process::Command::new(crate::haproxy_bin());
    cmd.arg("-db").arg("-f").arg(&config);
    let mut child = ChildGuard::spawn("haproxy", &mut cmd, &dir.path().join("haproxy.log"))?;
    let tls = issuer.client()?;
    let first = name(0);
    let first = first.as_str();
    let tls_ref = &tls;
    child
        .wait_ready(Duration::from_secs(120), || async move {
            served(tls_ref, addr, first).await.is_ok()
        })
        .await?;
    let start_ms = started.elapsed().as_secs_f64() * 1000.0;
    // Warm-up, then the first and the last name.
    handshakes(&tls, addr, first, &TlsArgs { seconds: 1, ..a.clone() }).await?;
    let hs_first = handshakes(&tls, addr, first, a).await?;
    let hs_last = handshakes(&tls, addr, &name(n - 1), a).await?;
    child.kill();
    Ok(format!(
        "| {n} | {made_s:.1} s | {check_ms:.0} ms | {start_ms:.0} ms | {hs_first:.0} | {hs_last:.0} |"
    ))
}

impl Clone for TlsArgs {
    fn clone(&self) -> TlsArgs {
        TlsArgs {
            certs: self.certs.clone(),
            seconds: self.seconds,
            connections: self.connections,
            pipeline_certs: self.pipeline_certs,
            rotations: self.rotations,
            hosts: self.hosts,
        }
    }
}

fn tls_ingress(i: usize) -> Result<Ingress> {
    let (host, secret) = (name(i), format!("tls-{i}"));
    let b = hafleet_tests::fixtures::IngressBuilder::new(&secret).fleet("edge");
    Ok(b.route(&host, "/", "web").tls(&[&host], &secret).build())
}

/// Waits until every host has reported the newest version and its master answers.
async fn settled(stack: &Stack) -> Result<()> {
    eventually(Duration::from_secs(300), "every host on the newest version", || async move {
        let newest = stack.latest_version().await?.context("a version")?.version;
        for h in &stack.hosts {
            let done = stack.last_report(h.name()).await?.map(|r| r.version);
            anyhow::ensure!(done == Some(newest), "{}: {done:?} of {newest}", h.name());
            h.reload_count()?;
        }
        Ok(())
    })
    .await
}

/// How long the pipeline's first load and a host's join may take at most.
const LONG: Duration = Duration::from_secs(1800);

/// Waits (polling every 5 ms, at most `limit`) until every host of `hosts` serves `sni` with
/// the certificate `fingerprint`.
async fn until_everywhere(
    tls: &tokio_rustls::TlsConnector,
    hosts: &[HaproxyHost],
    sni: &str,
    fingerprint: &str,
    limit: Duration,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    for h in hosts {
        loop {
            if served(tls, h.https_addr(), sni).await.is_ok_and(|fp| fp == fingerprint) {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "{} never served {sni}", h.name());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(())
}

fn fingerprint_of(pem: &str) -> Result<String> {
    hafleet_tests::tls::fingerprint(pem.as_bytes())
}

async fn pipeline(issuer: &Issuer, a: &TlsArgs) -> Result<()> {
    let n = a.pipeline_certs;
    let mut stack = Stack::start("edge", a.hosts).await?;
    // Rotations go back to back in one namespace: the per-namespace budget is off here.
    hafleet_tests::tls::tls_on(&mut stack, &[("HAFLEET_NAMESPACE_CHANGES_PER_MINUTE", "0")])
        .await?;
    let (nodes, _processes) = ready_nodes(&stack, 2).await?;
    let _backends = service_with_backends(&stack, "web", &nodes).await?;
    let client = stack.kube.client().await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let ingresses: Api<Ingress> = Api::namespaced(client, "default");
    let tls = issuer.client()?;

    // N Secrets and TLS Ingresses, 16 at a time.
    let made: Vec<(String, String)> =
        (0..n).map(|i| issuer.issue(&name(i))).collect::<Result<_>>()?;
    let started = Instant::now();
    {
        use futures::StreamExt as _;
        let (secrets, ingresses, made) = (&secrets, &ingresses, &made);
        let created: Vec<Result<()>> = futures::stream::iter(0..n)
            .map(|i| async move {
                let (crt, key) = &made[i];
                let secret = hafleet_tests::tls::tls_secret(
                    &format!("tls-{i}"),
                    crt.as_bytes(),
                    key.as_bytes(),
                )?;
                secrets.create(&PostParams::default(), &secret).await?;
                ingresses.create(&PostParams::default(), &tls_ingress(i)?).await?;
                Ok(())
            })
            .buffer_unordered(16)
            .collect()
            .await;
        created.into_iter().collect::<Result<()>>()?;
    }
    let created_s = started.elapsed().as_secs_f64();
    let last_fp = fingerprint_of(&made[n - 1].0)?;
    until_everywhere(&tls, &stack.hosts, &name(n - 1), &last_fp, LONG)
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))?;
    let all_s = started.elapsed().as_secs_f64();
    // The last name served does not mean every one is (16 creates run at once): the join
    // below starts from a version that holds all n certificates.
    let version = eventually(Duration::from_secs(600), "a version with every certificate", || {
        let stack = &stack;
        async move {
            let v = stack.latest_version().await?.context("a version")?;
            let certs = v.bundle().map(|b| b.certs.len()).unwrap_or_default();
            anyhow::ensure!(certs >= n, "version {} has {certs} certificates", v.version);
            Ok(v)
        }
    })
    .await?;
    until_everywhere(&tls, &stack.hosts, &name(0), &fingerprint_of(&made[0].0)?, LONG).await?;
    println!(
        "{n} TLS Ingresses and Secrets created in {created_s:.1} s; the last certificate served \
         on all {} hosts {all_s:.1} s after the first create; version {} is {:.1} MB",
        stack.hosts.len(),
        version.version,
        version.size as f64 / 1e6
    );

    // A host joins the fleet: from the applier's start to it serving every certificate. The
    // fleet is settled first, so that the restart cuts no apply short (a host whose apply it
    // cut reloads once more, which the join would be timed with).
    settled(&stack).await?;
    let joined = HaproxyHost::start(&format!("lb-{}", stack.hosts.len() + 1), &stack.keys).await?;
    stack.hosts.push(joined);
    let identity = stack.dir().join("edge.age");
    let identity = identity.to_str().context("utf-8 path")?.to_owned();
    let started = Instant::now();
    stack.restart_applier_with_inventory("", &[("HAFLEET_TLS_IDENTITY", &identity)])?;
    let new_host = std::slice::from_ref(stack.hosts.last().context("a host")?);
    until_everywhere(&tls, new_host, &name(n - 1), &last_fp, LONG)
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))?;
    let join_s = started.elapsed().as_secs_f64();
    for i in (0..n).step_by((n / 20).max(1)) {
        until_everywhere(
            &tls,
            new_host,
            &name(i),
            &fingerprint_of(&made[i].0)?,
            Duration::from_secs(5),
        )
        .await?;
    }
    println!(
        "a host joining a fleet of {n} certificates: serving all of them {join_s:.2} s after the \
         applier started"
    );

    // Rotations of tls-0, as cert-manager does them.
    let reloads = |stack: &Stack| -> Result<Vec<u32>> {
        stack.hosts.iter().map(|h| h.reload_count()).collect()
    };
    settled(&stack).await?;
    let before = reloads(&stack)?;
    let mut ms = Vec::with_capacity(a.rotations);
    for _ in 0..a.rotations {
        let (crt, key) = issuer.issue(&name(0))?;
        let fp = fingerprint_of(&crt)?;
        let data = hafleet_tests::tls::tls_secret("tls-0", crt.as_bytes(), key.as_bytes())?.data;
        let patch = kube::api::Patch::Merge(serde_json::json!({ "data": data }));
        secrets.patch("tls-0", &kube::api::PatchParams::default(), &patch).await?;
        let started = Instant::now();
        until_everywhere(&tls, &stack.hosts, &name(0), &fp, Duration::from_secs(120))
            .await
            .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))?;
        ms.push(started.elapsed().as_secs_f64() * 1000.0);
        // Every host's report of this rotation in before the next one starts.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let after = reloads(&stack)?;
    println!(
        "\nrotation of one certificate among {n}, patch to served on all {} hosts (ms):\n",
        stack.hosts.len()
    );
    println!("| case | n | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|");
    println!("{}", crate::percentiles("rotation", ms));
    println!(
        "master reloads during the rotations, per host: {:?}",
        before.iter().zip(&after).map(|(b, a)| a - b).collect::<Vec<_>>()
    );
    Ok(())
}

pub async fn run(a: TlsArgs) -> Result<()> {
    let issuer = Issuer::new("hafleet bench CA")?;
    println!(
        "HAProxy alone: ECDSA P-256 certificates in a crt-list; full TLS 1.3 handshakes/s, {} \
         clients, {} s per name\n",
        a.connections, a.seconds
    );
    println!(
        "| certificates | made in | haproxy -c | start to serving | handshakes/s, first name | handshakes/s, last name |"
    );
    println!("|---|---|---|---|---|---|");
    for &n in &a.certs {
        anyhow::ensure!(n >= 1, "--certs start at 1");
        let row = haproxy_alone(&issuer, n, &a).await?;
        println!("{row}");
    }
    if a.pipeline_certs > 0 {
        println!();
        pipeline(&issuer, &a).await?;
    }
    Ok(())
}
