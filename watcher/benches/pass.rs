//! One watcher pass at cluster scale, without I/O: `n` annotated Ingresses, each on its own
//! host with its own NodePort Service. Times each part of a pass as the watcher runs it
//! ([`pass::resolve`]: the Ingresses through the memo and tenancy; [`pass::finish`]: the diff
//! against what was published, the caps and budgets) and the Services' index, over
//! repeated passes in which one Ingress changed, and, for comparison, resolving every Ingress
//! anew as passes did before the memo. A bench binary; the report is a table for
//! BENCHMARKS.md.
//! Run: `cargo bench -p hafleet-watcher --bench pass` (`-- --ingresses N --passes N`).

use hafleet_watcher::core::index::{self, Published};
use hafleet_watcher::core::pass;
use hafleet_watcher::core::resolve::{self, Services};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::DynamicObject;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

fn arg(name: &str, default: usize) -> usize {
    let argv: Vec<String> = std::env::args().collect();
    argv.windows(2)
        .find(|w| w[0] == name)
        .map(|w| w[1].parse().expect("a number"))
        .unwrap_or(default)
}

fn ingress(i: usize, generation: i64) -> Arc<Ingress> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {
                "name": format!("ing-{i}"), "namespace": "team", "uid": format!("ing-uid-{i}"),
                "annotations": {"hafleet.io/fleet": "edge"},
                "generation": generation, "resourceVersion": format!("{}", i * 10 + generation as usize),
                "creationTimestamp": "2026-11-01T00:00:00Z",
            },
            "spec": {"rules": [{"host": format!("app-{i}.example.com"), "http": {"paths": [
                {"path": format!("/v{generation}"), "pathType": "Prefix",
                 "backend": {"service": {"name": format!("svc-{i}"), "port": {"number": 80}}}},
                {"path": "/healthz", "pathType": "Exact",
                 "backend": {"service": {"name": format!("svc-{i}"), "port": {"number": 80}}}},
            ]}}]},
        }))
        .unwrap(),
    )
}

/// HTTPRoute `route-i` of namespace `team` on Gateway `infra/edge`, as [`ingress`]'s rules.
fn http_route(i: usize, generation: i64) -> Arc<DynamicObject> {
    let backend = json!([{"name": format!("svc-{i}"), "port": 80}]);
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {
                "name": format!("route-{i}"), "namespace": "team", "uid": format!("route-uid-{i}"),
                "generation": generation, "resourceVersion": format!("{}", i * 10 + generation as usize),
                "creationTimestamp": "2026-11-01T00:00:00Z",
            },
            "spec": {"parentRefs": [{"name": "edge", "namespace": "infra"}],
                     "hostnames": [format!("app-{i}.example.com")], "rules": [
                {"matches": [{"path": {"type": "PathPrefix", "value": format!("/v{generation}")}}],
                 "backendRefs": backend},
                {"matches": [{"path": {"type": "Exact", "value": "/healthz"}}],
                 "backendRefs": backend},
            ]},
        }))
        .unwrap(),
    )
}

/// hafleet's GatewayClass and Gateway `infra/edge` on fleet `edge`, HTTP on 80 for routes of
/// every namespace.
fn gateway_objects() -> (Vec<Arc<DynamicObject>>, Vec<Arc<DynamicObject>>) {
    let object = |v: serde_json::Value| Arc::new(serde_json::from_value(v).unwrap());
    let class = object(
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": "hafleet"}, "spec": {"controllerName": "hafleet.io/gateway-controller"}}),
    );
    let gateway = object(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "edge", "namespace": "infra", "annotations": {"hafleet.io/fleet": "edge"}},
        "spec": {"gatewayClassName": "hafleet", "listeners": [{"name": "http", "port": 80,
            "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}}]}}));
    (vec![class], vec![gateway])
}

fn service(i: usize) -> Arc<Service> {
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("svc-{i}"), "namespace": "team"},
            "spec": {"type": "NodePort", "ports": [
                {"port": 80, "targetPort": 8080, "nodePort": 30000 + (i % 2000)},
            ]},
        }))
        .unwrap(),
    )
}

fn ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1000.0
}

fn p50_p90(mut xs: Vec<f64>) -> String {
    xs.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
    format!("{:.2} | {:.2}", at(0.5), at(0.9))
}

fn main() {
    let n = arg("--ingresses", 10_000);
    let passes = arg("--passes", 50);
    // With `--http-routes`: the same rules as HTTPRoutes on a Gateway, no Ingress.
    let routes_mode = std::env::args().any(|a| a == "--http-routes");
    let mut ingresses: Vec<Arc<Ingress>> =
        if routes_mode { vec![] } else { (0..n).map(|i| ingress(i, 1)).collect() };
    let mut routes: Vec<Arc<DynamicObject>> =
        if routes_mode { (0..n).map(|i| http_route(i, 1)).collect() } else { vec![] };
    let (classes, gateways) = gateway_objects();
    let services_store: Vec<Arc<Service>> = (0..n).map(service).collect();
    let mut published = Published::default();
    let mut memo = resolve::Memo::default();
    let mut churn = hafleet_watcher::core::churn::Budget::default();
    let now = tokio::time::Instant::now;
    let rules = pass::Rules {
        resolve: Default::default(),
        namespaces_own_hosts: true,
        limits: hafleet_watcher::core::route_events::IngressLimits {
            max_paths: 1000,
            max_bytes: 1 << 20,
            cluster: None,
        },
        payload_limit: 1 << 20,
        max_kept_per_namespace: 100,
        cert_expiry_warning_days: 14,
        bulk_delete_threshold: 0,
    };
    let mut times: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for pass in 0..passes + 1 {
        // One Ingress (HTTPRoute) changed since the last pass, as when a user edits one.
        let changed = pass * 7919 % n;
        match routes_mode {
            true => routes[changed] = http_route(changed, 2 + pass as i64),
            false => ingresses[changed] = ingress(changed, 2 + pass as i64),
        }
        let started = Instant::now();
        let t = Instant::now();
        let services: Services = services_store
            .iter()
            .filter_map(|s| {
                Some(((s.metadata.namespace.clone()?, s.metadata.name.clone()?), s.clone()))
            })
            .collect();
        let index_ms = ms(t);
        let t = Instant::now();
        let mut fresh = 0;
        for ing in &ingresses {
            fresh += resolve::resolve(ing, Default::default(), &services, None).is_ok() as usize;
        }
        assert_eq!(fresh, ingresses.len());
        let every_ms = ms(t);
        let t = Instant::now();
        let gateway = hafleet_watcher::core::gateway::Objects {
            classes: &classes,
            gateways: &gateways,
            routes: &routes,
            ..Default::default()
        };
        let objects = pass::Objects {
            gateway: routes_mode.then_some(&gateway),
            ingresses: &ingresses,
            services: &services,
            endpoints: None,
            policy: None,
        };
        let resolution = pass::resolve(&objects, &rules, &mut memo, &published, false);
        let resolve_ms = ms(t);
        assert_eq!(resolution.resolved_anew, if pass == 0 { n } else { 1 }, "only the changed one");
        let t = Instant::now();
        let mut plan = pass::finish(resolution, None, &rules, &published, &mut churn, now());
        assert!(plan.tells.is_empty());
        let actions = std::mem::take(&mut plan.actions);
        // Dropped as the watcher drops it, once it has carried it out.
        drop(plan);
        let finish_ms = ms(t);
        let pass_ms = ms(started) - every_ms;
        for action in &actions {
            index::record(&mut published, action);
        }
        if pass == 0 {
            assert_eq!(actions.len(), n);
            continue;
        }
        assert_eq!(actions.len(), 1, "one Ingress changed");
        for (part, ms) in [
            ("services index", index_ms),
            ("resolve every Ingress (not in the pass)", every_ms),
            ("resolve (memoized) and tenancy", resolve_ms),
            ("finish: the diff, caps and budgets, the plan dropped", finish_ms),
            ("pass", pass_ms),
        ] {
            times.entry(part).or_default().push(ms);
        }
    }
    let what = if routes_mode { "HTTPRoutes" } else { "Ingresses" };
    println!("{n} {what}, {passes} passes, one changed before each\n");
    println!("| part | p50 ms | p90 ms |\n|---|---|---|");
    for part in [
        "services index",
        "resolve every Ingress (not in the pass)",
        "resolve (memoized) and tenancy",
        "finish: the diff, caps and budgets, the plan dropped",
        "pass",
    ] {
        println!("| {part} | {} |", p50_p90(times.remove(part).unwrap()));
    }
}
