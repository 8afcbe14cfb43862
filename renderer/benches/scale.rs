//! The renderer at fleet scale: full render (a fresh renderer, every backend section rendered),
//! one change end to end through the store (sections of unchanged backends kept), memory,
//! 1,000 versions on disk, `history list` of 1,000, and replaying 100,000 route events.
//! A bench binary (not criterion): several of these take seconds, and the report is a table
//! for BENCHMARKS.md. Run: `cargo bench -p hafleet-renderer --bench scale`
//! (`-- --ingresses N --nodes A,B --versions N --events N` to change the sizes).

mod common;

/// The allocator the renderer binary runs with (renderer/src/main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use hafleet_proto::{
    Cause, FleetName, HistoryReply, RouteChange, RouteEvent, RouteMessage, SCHEMA_VERSION,
};
use hafleet_renderer::adapters::store::Store;
use hafleet_renderer::core::render::Renderer;
use hafleet_renderer::core::state::{self, Applied, Desired};
use hafleet_renderer::core::versions::{Latest, next_version};
use std::time::Instant;

struct Args {
    ingresses: usize,
    nodes: Vec<usize>,
    versions: usize,
    events: usize,
}

fn args() -> Args {
    let mut a = Args { ingresses: 10_000, nodes: vec![3, 200], versions: 1000, events: 100_000 };
    let argv: Vec<String> = std::env::args().collect();
    for pair in argv.windows(2) {
        let v = &pair[1];
        match pair[0].as_str() {
            "--ingresses" => a.ingresses = v.parse().expect("--ingresses N"),
            "--nodes" => a.nodes = v.split(',').map(|n| n.parse().expect("--nodes A,B")).collect(),
            "--versions" => a.versions = v.parse().expect("--versions N"),
            "--events" => a.events = v.parse().expect("--events N"),
            _ => {}
        }
    }
    a
}

fn ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1000.0
}

/// (median, p90, max) of a sample, in ms.
fn stats(mut xs: Vec<f64>) -> String {
    xs.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
    format!("{:.1} | {:.1} | {:.1}", at(0.5), at(0.9), xs[xs.len() - 1])
}

fn status_kib(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn dir_bytes(path: &std::path::Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(path).unwrap().flatten() {
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() { dir_bytes(&entry.path()) } else { meta.len() };
    }
    total
}

fn upsert(fleet: &FleetName, i: usize, rv: usize) -> RouteMessage {
    let mut routes = common::routes(i);
    // Every update moves the Exact rule, so each one changes the config.
    routes[1].path = hafleet_proto::HttpPath::new(format!("/v{rv}")).unwrap();
    RouteMessage::Event(RouteEvent {
        schema: SCHEMA_VERSION,
        fleet: fleet.clone(),
        ingress: common::key(i),
        created_unix: i as i64,
        resource_version: rv.to_string(),
        change: RouteChange::Upsert { routes, tls: vec![] },
        epoch: 1,
    })
}

/// What the renderer does for one route event: apply it, render the fleet, make the version
/// and commit state and version in one flushed transaction. Returns the version's number.
fn one_change(
    store: &Store,
    renderer: &Renderer,
    desired: &mut Desired,
    fleet: &FleetName,
    seq: u64,
    msg: &RouteMessage,
) -> u64 {
    let mut out = Applied::default();
    state::apply(desired, seq, msg, &state::SweepGuard::default(), &mut out);
    let latest = store.latest_summary(fleet).unwrap();
    let latest = latest.as_ref().map(|l| Latest { version: l.number, sha256: &l.sha256 });
    let causes: Vec<Cause> = out.causes.remove(fleet).unwrap_or_default();
    let v =
        next_version(renderer, fleet, desired, latest, 0, causes, 0).unwrap().expect("a change");
    let n = v.version;
    store.commit(&out.writes, &[v], seq).unwrap();
    store.set_published(fleet, n).unwrap();
    n
}

fn main() {
    let a = args();
    let renderer = Renderer::builtin();
    let fleet = FleetName::new("edge").unwrap();
    println!(
        "renderer at {} Ingresses ({} paths); release build; times in ms\n",
        a.ingresses,
        a.ingresses * 2
    );
    println!("| measure | nodes | median | p90 | max | other |");
    println!("|---|---|---|---|---|---|");
    for &nodes in &a.nodes {
        let before_kib = status_kib("VmRSS:");
        let mut desired = Desired::new();
        desired.fleets.insert(fleet.clone(), common::fleet(a.ingresses));
        desired.nodes = [(None, common::nodes(nodes))].into();
        let state_kib = status_kib("VmRSS:").saturating_sub(before_kib);

        // Full render: model, template, maps, sha256.
        let reps = 10;
        let mut times = Vec::new();
        let mut size = 0;
        for _ in 0..reps {
            // A fresh renderer: no backend section kept from an earlier render.
            let renderer = Renderer::builtin();
            let started = Instant::now();
            let v = next_version(&renderer, &fleet, &desired, None, 0, vec![], 0).unwrap().unwrap();
            times.push(ms(started));
            size = v.size;
        }
        println!(
            "| full render | {nodes} | {} | bundle {:.1} MB; state in memory {:.0} MB; peak RSS {:.0} MB |",
            stats(times),
            size as f64 / 1e6,
            state_kib as f64 / 1024.0,
            status_kib("VmHWM:") as f64 / 1024.0
        );

        // Where a render's time goes.
        let (mut build, mut render, mut hash) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..reps {
            let started = Instant::now();
            let model = hafleet_renderer::core::model::build(
                &fleet,
                desired.ingresses(&fleet),
                &desired.nodes[&None],
            );
            build.push(ms(started));
            let renderer = Renderer::builtin();
            let started = Instant::now();
            let bundle = renderer.render(&model).unwrap();
            render.push(ms(started));
            let started = Instant::now();
            let _ = bundle.sha256();
            hash.push(ms(started));
        }
        println!("| … model build | {nodes} | {} | |", stats(build));
        println!("| … maps + template | {nodes} | {} | |", stats(render));
        println!("| … sha256 | {nodes} | {} | |", stats(hash));

        // One change through the store, then up to --versions versions on disk.
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut seq = 1;
        let v1 = next_version(&renderer, &fleet, &desired, None, 0, vec![], 0).unwrap().unwrap();
        store.commit(&[], &[v1], seq).unwrap();
        let versions = a.versions;
        let mut times = Vec::new();
        for k in 1..versions {
            seq += 1;
            let msg = upsert(&fleet, (k * 7919) % a.ingresses, k);
            let started = Instant::now();
            one_change(&store, &renderer, &mut desired, &fleet, seq, &msg);
            times.push(ms(started));
        }
        let disk = dir_bytes(dir.path());
        println!(
            "| one change: apply, render, commit (flushed) | {nodes} | {} | {versions} versions: {:.0} MB on disk ({:.2} MB each) |",
            stats(times),
            disk as f64 / 1e6,
            disk as f64 / 1e6 / versions as f64
        );

        // `history list`: the summaries the renderer reads and the reply it encodes.
        let mut times = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            let versions = store.summaries(&fleet, 1000).unwrap();
            let reply = HistoryReply::List { versions, pinned: None }.encode();
            times.push(ms(started));
            assert!(!reply.is_empty());
        }
        println!("| history list of {versions} (store + reply) | {nodes} | {} | |", stats(times));
    }

    // Replay: decode and apply N route events (10 updates of each Ingress, on 3 nodes), then
    // render once, as `hafleet replay` does after reading them from the stream.
    let nodes = 3;
    let encoded: Vec<Vec<u8>> = (0..a.events)
        .map(|k| {
            let msg = upsert(&fleet, k % a.ingresses, k / a.ingresses);
            serde_json::to_vec(&msg).unwrap()
        })
        .collect();
    let mut times = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let mut desired =
            Desired { nodes: [(None, common::nodes(nodes))].into(), ..Desired::new() };
        let mut out = Applied::default();
        for (seq, bytes) in encoded.iter().enumerate() {
            let msg = RouteMessage::decode(bytes).unwrap();
            state::apply(
                &mut desired,
                seq as u64 + 1,
                &msg,
                &state::SweepGuard::default(),
                &mut out,
            );
            out = Applied::default();
        }
        assert_eq!(desired.ingresses(&fleet).len(), a.ingresses.min(a.events));
        let v = next_version(&renderer, &fleet, &desired, None, 0, vec![], 0).unwrap();
        assert!(v.is_some());
        times.push(ms(started));
    }
    println!("| replay {} events + render | {nodes} | {} | |", a.events, stats(times));
}
