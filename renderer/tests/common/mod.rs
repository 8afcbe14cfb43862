//! What the renderer's tests against the real HAProxy share: which HAProxy binaries to try,
//! certificates made by `openssl`, and a bundle laid out as a host holds it.

#![allow(dead_code)]

use hafleet_proto::Bundle;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A loopback port nothing listens on (yet).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Kills the child when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `port` on loopback takes connections (10 s at most).
pub fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every HAProxy a config must pass: the one on `PATH` (Debian's 2.6), the one the test hosts
/// run if another (`$HAFLEET_HAPROXY`), and the 3.0 that tests/setup.sh builds
/// (`$HAFLEET_HAPROXY30`, or any `haproxy-<version>/haproxy` in its cache), when there.
pub fn haproxies() -> Vec<PathBuf> {
    let mut found = vec![PathBuf::from("haproxy")];
    for var in ["HAFLEET_HAPROXY", "HAFLEET_HAPROXY30"] {
        found.extend(std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from));
    }
    let cache = std::env::var_os("HAFLEET_CACHE").map(PathBuf::from).or_else(|| {
        std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/hafleet"))
    });
    if let Some(Ok(entries)) = cache.map(std::fs::read_dir) {
        let mut cached: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("haproxy-"))
            .map(|e| e.path().join("haproxy"))
            .filter(|p| p.is_file())
            .collect();
        cached.sort();
        found.extend(cached);
    }
    let mut seen = Vec::new();
    found.retain(|p| {
        let key = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        let new = !seen.contains(&key);
        seen.push(key);
        new
    });
    found
}

/// A self-signed P-256 certificate for `names` and its key, made by `openssl`.
pub fn openssl_cert(dir: &Path, names: &[&str]) -> (Vec<u8>, Vec<u8>) {
    let (k, c) = (dir.join(format!("{}.key", names[0])), dir.join(format!("{}.crt", names[0])));
    let run = |args: &[&std::ffi::OsStr]| {
        let out = Command::new("openssl").args(args).output().expect("openssl runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let os = |s: &str| std::ffi::OsString::from(s);
    run(&[
        &os("ecparam"),
        &os("-name"),
        &os("prime256v1"),
        &os("-genkey"),
        &os("-noout"),
        &os("-out"),
        k.as_os_str(),
    ]);
    let san: Vec<String> = names.iter().map(|n| format!("DNS:{n}")).collect();
    run(&[
        &os("req"),
        &os("-x509"),
        &os("-new"),
        &os("-key"),
        k.as_os_str(),
        &os("-out"),
        c.as_os_str(),
        &os("-days"),
        &os("30"),
        &os("-subj"),
        &os(&format!("/CN={}", names[0])),
        &os("-addext"),
        &os(&format!("subjectAltName={}", san.join(","))),
    ]);
    (std::fs::read(c).unwrap(), std::fs::read(k).unwrap())
}

/// `bundle` in a new folder as the applier leaves it on a host: the config, the map files and
/// each certificate opened with `identity` (chain and key in one file).
pub fn lay_out(
    bundle: &Bundle,
    identity: &hafleet_applier::core::identity::FleetIdentity,
) -> tempfile::TempDir {
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("haproxy.cfg"), &bundle.config).unwrap();
    std::fs::create_dir(host.path().join(hafleet_proto::MAPS_DIR)).unwrap();
    std::fs::create_dir(host.path().join(hafleet_proto::tls::CERTS_DIR)).unwrap();
    for m in &bundle.maps {
        std::fs::write(host.path().join(m.name.relative_path()), &m.content).unwrap();
    }
    for c in &bundle.certs {
        let file = identity.cert_file(c).unwrap();
        std::fs::write(host.path().join(c.relative_path()), file.as_bytes()).unwrap();
    }
    host
}
