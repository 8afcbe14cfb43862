//! Golden tests of the built-in template: each fixture (a fleet's Ingresses) renders to a
//! reviewed snapshot, and every snapshot passes `haproxy -c` with the real HAProxy.

use hafleet_proto::{FleetName, IngressKey, Route};
use hafleet_renderer::{model, render::Renderer, state::IngressEntry};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

#[derive(Deserialize)]
struct Fixture {
    namespace: String,
    name: String,
    created_unix: i64,
    routes: Vec<Route>,
}

fn render_fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let fixtures: Vec<Fixture> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let ingresses: BTreeMap<IngressKey, IngressEntry> = fixtures
        .into_iter()
        .map(|f| {
            (
                IngressKey::new(&f.namespace, &f.name).unwrap(),
                IngressEntry {
                    created_unix: f.created_unix,
                    resource_version: "1".into(),
                    routes: f.routes,
                    seq: 0,
                },
            )
        })
        .collect();
    let fleet = FleetName::new("edge").unwrap();
    Renderer::builtin().render(&model::build(&fleet, &ingresses)).unwrap()
}

/// Runs the real `haproxy -c` on the config; panics with HAProxy's words if it refuses it.
fn assert_haproxy_accepts(config: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("haproxy.cfg");
    std::fs::write(&file, config).unwrap();
    let out = Command::new("haproxy")
        .arg("-c")
        .arg("-f")
        .arg(&file)
        .output()
        .expect("haproxy is installed (run tests/setup.sh)");
    assert!(
        out.status.success(),
        "haproxy -c refused the config:\n{}\n{}{}",
        config,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn shop_fleet() {
    let config = render_fixture("shop.json");
    insta::assert_snapshot!(config);
    assert_haproxy_accepts(&config);
}

#[test]
fn empty_fleet() {
    let config = render_fixture("empty.json");
    insta::assert_snapshot!(config);
    assert_haproxy_accepts(&config);
}

#[test]
fn haproxy_check_catches_a_broken_config() {
    // The check above must be able to fail, or it proves nothing.
    let result = std::panic::catch_unwind(|| assert_haproxy_accepts("frontend x\n  bindd :1\n"));
    assert!(result.is_err());
}
