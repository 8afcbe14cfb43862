//! How long the renderer takes to turn a fleet's desired state into config text (model build +
//! template), by fleet size. Results and method: BENCHMARKS.md.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hafleet_proto::{
    Backend, FleetName, HttpHost, HttpPath, IngressKey, Namespace, ObjectName, PathKind, Route,
    Server, ServiceRef,
};
use hafleet_renderer::{model, render::Renderer, state::IngressEntry};
use std::collections::BTreeMap;

/// `n` Ingresses, each with two rules (a Prefix and an Exact path) on its own host, each
/// backend on 3 nodes: the shape of a typical fleet.
fn fleet(n: usize) -> BTreeMap<IngressKey, IngressEntry> {
    (0..n)
        .map(|i| {
            let backend = Backend {
                service: ServiceRef {
                    namespace: Namespace::new("team").unwrap(),
                    name: ObjectName::new(format!("svc-{i}")).unwrap(),
                    port: 80,
                },
                servers: (1..=3)
                    .map(|n| Server {
                        node: ObjectName::new(format!("node-{n}")).unwrap(),
                        addr: format!("10.0.0.{n}").parse().unwrap(),
                        port: 30000 + (i % 2000) as u16,
                    })
                    .collect(),
            };
            let host = HttpHost::new(format!("app-{i}.example.com")).unwrap();
            let routes = vec![
                Route {
                    host: Some(host.clone()),
                    path: HttpPath::new("/api").unwrap(),
                    kind: PathKind::Prefix,
                    backend: backend.clone(),
                },
                Route {
                    host: Some(host),
                    path: HttpPath::new("/healthz").unwrap(),
                    kind: PathKind::Exact,
                    backend,
                },
            ];
            let key = IngressKey::new("team", &format!("ing-{i}")).unwrap();
            (
                key,
                IngressEntry {
                    created_unix: i as i64,
                    resource_version: "1".into(),
                    routes,
                    seq: 0,
                },
            )
        })
        .collect()
}

fn render(c: &mut Criterion) {
    let renderer = Renderer::builtin();
    let name = FleetName::new("edge").unwrap();
    let mut group = c.benchmark_group("render_fleet");
    for n in [10usize, 100, 1000, 5000] {
        let state = fleet(n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &state, |b, state| {
            b.iter(|| renderer.render(&model::build(&name, state)).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, render);
criterion_main!(benches);
