//! Test environment for hafleet: real etcd + kube-apiserver, NATS JetStream, sshd + HAProxy
//! hosts and HTTP backends, each started per test on loopback and cleaned up on drop.
//!
//! Install the binaries with `bash tests/setup.sh` (see `/work/shared/TESTING.md`).
//! Set `HAFLEET_KEEP_TMP=1` to keep the temp dirs (configs, logs) of a failed test.

pub mod ansible;
pub mod assert;
pub mod backend;
pub mod cluster;
pub mod fixtures;
pub mod gateway_api;
pub mod haproxy_host;
pub mod http;
pub mod kube_env;
pub mod nats;
pub mod pods;
pub mod proc;
pub mod stack;
pub mod tls;
pub mod websocket;

#[cfg(test)]
mod deploy_checks;
#[cfg(test)]
mod selftest;

use std::path::PathBuf;

pub use backend::HttpBackend;
pub use haproxy_host::{HaproxyHost, ShowProc, SigningKeys, SshClientKeys};
pub use http::{Response, eventually, http_get, http_get_full, http_request};
pub use kube_env::KubeEnv;
pub use nats::NatsServer;
pub use proc::{ChildGuard, TestDir, free_port, free_ports, random_loopback_ip, wait_for};

/// The path of a workspace binary such as `hafleet-watcher`: in `$HAFLEET_BIN_DIR` if set, else
/// next to the running test executable (`target/<profile>/`, leaving `deps/`).
///
/// # Panics
/// If the binary is not there, with a message saying to run `cargo build --workspace --bins`.
pub fn bin_path(name: &str) -> PathBuf {
    let dir = match std::env::var_os("HAFLEET_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let exe = std::env::current_exe().expect("current_exe");
            let mut dir = exe.parent().expect("exe has a parent").to_path_buf();
            if dir.ends_with("deps") {
                dir.pop();
            }
            dir
        }
    };
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "binary {name} not found at {}: run `cargo build --workspace --bins` first \
         (or set HAFLEET_BIN_DIR)",
        path.display()
    );
    path
}
