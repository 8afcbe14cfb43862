//! How long the renderer takes to turn a fleet's desired state into config text (model build +
//! template), by fleet size. Results and method: BENCHMARKS.md.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
mod common;

use hafleet_proto::FleetName;
use hafleet_renderer::core::{model, render::Renderer};

fn render(c: &mut Criterion) {
    let renderer = Renderer::builtin();
    let name = FleetName::new("edge").unwrap();
    let mut group = c.benchmark_group("render_fleet");
    for n in [10usize, 100, 1000, 5000] {
        let state = common::fleet(n);
        let nodes = common::nodes(3);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &state, |b, state| {
            b.iter(|| renderer.render(&model::build(&name, state, &nodes)).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, render);
criterion_main!(benches);
