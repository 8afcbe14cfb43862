//! What ships in `deploy/` agrees with the code: the Grafana dashboard graphs only metrics
//! some binary exposes.

use std::collections::BTreeSet;
use std::path::Path;

fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Every `hafleet_…` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("hafleet_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// Metric names written in the binaries' sources (string literals of every `.rs` file).
fn exposed() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for dir in ["applier/src", "renderer/src", "watcher/src", "runtime/src"] {
        let mut stack = vec![workspace().join(dir)];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for literal in text.split('"').skip(1).step_by(2) {
                        out.extend(metric_names(literal));
                    }
                }
            }
        }
    }
    out
}

#[test]
fn the_dashboard_graphs_only_metrics_the_binaries_expose() {
    let path = workspace().join("deploy/grafana/hafleet-dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let exposed = exposed();
    let mut graphed = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {} graphs nothing", panel["title"]);
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            for name in metric_names(expr) {
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|_| expr.contains("histogram")))
                    .unwrap_or(&name)
                    .to_owned();
                assert!(
                    exposed.contains(&base),
                    "{base} (panel {}) is not exposed",
                    panel["title"]
                );
                graphed.insert(base);
            }
        }
    }
    // And every metric a binary exposes is on the dashboard (test-only names aside).
    for name in exposed.iter().filter(|n| {
        ["hafleet_applier_", "hafleet_renderer_", "hafleet_watcher_", "hafleet_nats_"]
            .iter()
            .any(|p| n.starts_with(p))
    }) {
        assert!(graphed.contains(name), "{name} is exposed but not on the dashboard");
    }
}

/// The alert rules of `components/prometheus` use only metrics the binaries expose, and alert
/// on what the operators' runbook covers.
#[test]
fn the_alert_rules_use_only_metrics_the_binaries_expose() {
    let path = workspace().join("deploy/kubernetes/components/prometheus/hafleet-alerts.yaml");
    let rules = std::fs::read_to_string(&path).unwrap();
    let exposed = exposed();
    let mut used = BTreeSet::new();
    for line in rules.lines().filter(|l| l.trim_start().starts_with("expr:")) {
        for name in metric_names(line) {
            assert!(exposed.contains(&name), "{name} is in an alert rule but not exposed");
            used.insert(name);
        }
    }
    for name in [
        "hafleet_fleet_pinned",
        "hafleet_applier_host_behind_versions",
        "hafleet_applier_drift_total",
        "hafleet_applier_tls_earliest_not_after_seconds",
        "hafleet_applier_outcomes_total",
        "hafleet_ready",
    ] {
        assert!(used.contains(name), "no alert on {name}");
    }
}
