//! What a version costs HAProxy at scale: `--ingresses` Ingresses, each on its own
//! Service (a backend each), on `--nodes` nodes with node health checks on and the
//! renderer's default subset of nodes per backend, rendered by the renderer's own code with
//! the built-in template. A real HAProxy (master-worker, master socket) runs on the files.
//! Timed: `haproxy -c`; a reload, from asking the master to a new worker in `show proc`;
//! and, through the applier's own runtime-API code, the two changes that need no reload at
//! that size: a node drained, and a route added on a running backend (the map replaced).
//! Nodes are 127.1.x.y addresses where nothing listens: their checks fail fast, locally.

use anyhow::{Context, Result};
use hafleet_applier::core::{plan, runtime_api as runtime};
use hafleet_proto::{Bundle, FleetName, NodeAddr, ObjectName};
use hafleet_renderer::core::{model, render::Renderer};
use hafleet_tests::{ChildGuard, TestDir};
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct ReloadArgs {
    #[arg(long, default_value_t = 10_000)]
    ingresses: usize,
    #[arg(long, default_value_t = 200)]
    nodes: usize,
    /// Runs of each timed step.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Nodes listed per backend, as the renderer's `--servers-per-backend`.
    #[arg(long, default_value_t = model::DEFAULT_SERVERS_PER_BACKEND)]
    servers_per_backend: usize,
}

fn nodes(n: usize) -> Vec<NodeAddr> {
    (0..n)
        .map(|i| NodeAddr {
            name: ObjectName::new(format!("node-{i}")).expect("valid name"),
            addr: std::net::Ipv4Addr::new(127, 1, (i / 250) as u8, (i % 250 + 1) as u8).into(),
        })
        .collect()
}

/// The fleet of `a` (with `more` Ingresses on Services of their own), optionally with one
/// more route on the first Ingress's Service.
fn render(a: &ReloadArgs, more: usize, nodes: &[NodeAddr], extra: bool) -> Result<Bundle> {
    let n = a.ingresses + more;
    let mut ingresses = crate::fleet(n, |i| (format!("svc-{i}"), 30000 + (i % 2700) as u16))?;
    if extra {
        // One more route, on the first Ingress's Service: map entries only.
        let more = crate::fleet(1, |_| ("svc-0".to_owned(), 30000))?;
        let (_, mut entry) = more.into_iter().next().context("one")?;
        std::sync::Arc::make_mut(&mut entry.routes)[0].host =
            Some(hafleet_proto::HttpHost::new("extra.example.com")?);
        ingresses.insert(hafleet_proto::IngressKey::new("bench", "extra")?, entry);
    }
    let options =
        model::Options { servers_per_backend: a.servers_per_backend, ..Default::default() };
    let model = model::build_with(&FleetName::new("bench")?, &ingresses, nodes, &options);
    Ok(Renderer::builtin().render(&model)?)
}

/// Sends `input` to the master socket and returns what it answered.
fn master(socket: &Path, input: &str) -> Result<String> {
    let mut child = std::process::Command::new("socat")
        .args(["-T", "60", "stdio"])
        .arg(format!("unix-connect:{}", socket.display()))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        // Polling before the master listens is refused: that is the answer, not news.
        .stderr(std::process::Stdio::null())
        .spawn()?;
    child.stdin.take().context("stdin")?.write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn show_proc(socket: &Path) -> Result<plan::ProcState> {
    plan::parse_show_proc(&master(socket, "show proc\n")?).context("show proc")
}

fn median(mut ms: Vec<f64>) -> f64 {
    ms.sort_by(|a, b| a.total_cmp(b));
    ms[ms.len() / 2]
}

/// Sends the plan from `from` to `to` through the master CLI, as the applier does; returns
/// the commands sent and the time taken.
fn runtime_change(socket: &Path, from: &Bundle, to: &Bundle) -> Result<(usize, f64)> {
    let steps = match runtime::plan(from, to) {
        runtime::Plan::Runtime(steps) => steps,
        // A new Service: served through a spare ahead of its reload (not timed here).
        runtime::Plan::Bridged { bridge, .. } => bridge.steps,
        other => anyhow::bail!("expected a change through the runtime API, not {other:?}"),
    };
    let started = Instant::now();
    let pid = plan::current_worker(&show_proc(socket)?).context("current worker")?;
    let mut sent = 1;
    let mut maps = runtime::MapRefs::default();
    if runtime::changes_maps(&steps) {
        let show = master(socket, &format!("@!{pid} show map\n"))?;
        let ids;
        (ids, maps) = runtime::locate_maps(&show, &steps).map_err(anyhow::Error::msg)?;
        sent += 1;
        if !ids.is_empty() {
            let prepare = runtime::prepare_commands(&ids);
            let out = master(socket, &runtime::session(pid, &prepare))?;
            sent += prepare.len();
            maps.prepared = runtime::prepared_maps(ids, &runtime::answers(&out, prepare.len()))
                .map_err(anyhow::Error::msg)?;
        }
    }
    let commands = runtime::commands(&steps, &maps, &runtime::CertInputs::default())
        .map_err(anyhow::Error::msg)?;
    let out = master(socket, &runtime::session(pid, &commands))?;
    let answers = runtime::answers(&out, commands.len());
    if let Some((command, answer)) = runtime::first_refused(&commands, &answers) {
        anyhow::bail!("HAProxy answered {answer:?} to {command}");
    }
    Ok((sent + commands.len(), started.elapsed().as_secs_f64() * 1000.0))
}

/// What the applier sets for its `haproxy -c` (applier/src/host/scripts/lib.sh, `validate`).
const HUGE_PAGES: &str = "glibc.malloc.hugetlb=1";

/// Starts a master-worker HAProxy on `config` with its master socket at `socket` (and
/// `GLIBC_TUNABLES` set to `tunables` if given), then reloads it `runs` times: the time
/// of each from asking the master to a new worker in `show proc`.
async fn start_and_reload(
    haproxy: &str,
    config: &Path,
    socket: &Path,
    tunables: Option<&str>,
    runs: usize,
) -> Result<(ChildGuard, Vec<f64>)> {
    let http = std::net::SocketAddr::new(
        [127, 0, 0, 1].into(),
        hafleet_tests::free_port([127, 0, 0, 1].into()),
    );
    let mut cmd = std::process::Command::new(haproxy);
    cmd.arg("-W")
        .arg("-db")
        .arg("-S")
        .arg(socket)
        .arg("-f")
        .arg(config)
        .env("HAFLEET_HTTP_BIND", http.to_string());
    match tunables {
        Some(t) => cmd.env("GLIBC_TUNABLES", t),
        None => cmd.env_remove("GLIBC_TUNABLES"),
    };
    let log = socket.with_extension("log");
    let mut child = ChildGuard::spawn("haproxy", &mut cmd, &log)?;
    let sock = socket.to_owned();
    child
        .wait_ready(Duration::from_secs(120), || {
            let sock = sock.clone();
            async move { show_proc(&sock).is_ok_and(|p| plan::current_worker(&p).is_some()) }
        })
        .await?;

    let mut reload = Vec::new();
    for _ in 0..runs {
        let before = show_proc(socket)?;
        let started = Instant::now();
        master(socket, "reload\n")?;
        let deadline = started + Duration::from_secs(120);
        loop {
            if let Ok(after) = show_proc(socket) {
                match plan::check_reload(&before, &after) {
                    plan::ReloadCheck::Done => break,
                    plan::ReloadCheck::Failed => anyhow::bail!("reload failed"),
                    plan::ReloadCheck::Raced => anyhow::bail!("someone else reloaded too"),
                    plan::ReloadCheck::Pending => {}
                }
            }
            anyhow::ensure!(Instant::now() < deadline, "no new worker after 120 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        reload.push(started.elapsed().as_secs_f64() * 1000.0);
        // Let the old worker go before the next run.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok((child, reload))
}

pub async fn run(a: ReloadArgs) -> Result<()> {
    let haproxy =
        if Path::new("/usr/sbin/haproxy").exists() { "/usr/sbin/haproxy" } else { "haproxy" };
    let all = nodes(a.nodes);
    let started = Instant::now();
    let base = render(&a, 0, &all, false)?;
    let render_ms = started.elapsed().as_secs_f64() * 1000.0;
    let dir = TestDir::new("hafleet-bench-reload")?;
    let config = crate::write_bundle(dir.path(), &base)?;
    // Plain, and as the applier runs it (its heap on transparent huge pages), in turn.
    let (mut check, mut check_thp) = (Vec::new(), Vec::new());
    for _ in 0..a.runs {
        check.push(crate::check_config(&config)?);
        check_thp.push(crate::check_config_with(&config, Some(HUGE_PAGES))?);
    }
    let socket = dir.path().join("master.sock");
    let (mut child, reload) = start_and_reload(haproxy, &config, &socket, None, a.runs).await?;

    // A node drained: every backend whose subset held it moves to another node.
    let drained = render(&a, 0, &all[1..], false)?;
    let (drain_commands, drain_ms) = runtime_change(&socket, &base, &drained)?;
    // A route added on a running backend: the map of prefix rules replaced whole.
    let routed = render(&a, 0, &all[1..], true)?;
    // What the applier works out for each host before it sends anything: the plan from the
    // bundle HAProxy runs to the next (a new Service: a reload; the two changes above: the
    // runtime API).
    let added = render(&a, 1, &all, false)?;
    let plan_ms = |from: &Bundle, to: &Bundle, reload: bool| -> Result<f64> {
        let times = (0..a.runs.max(5))
            .map(|_| {
                let started = Instant::now();
                let plan = runtime::plan_alone(from, to);
                let ms = started.elapsed().as_secs_f64() * 1000.0;
                anyhow::ensure!(
                    matches!(plan, runtime::Plan::Reload(_)) == reload,
                    "the plan should {}reload",
                    if reload { "" } else { "not " }
                );
                Ok(ms)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(median(times))
    };
    let plan_added = plan_ms(&base, &added, true)?;
    // The bridge of that reload (its new backend through a spare), which a rollout looks
    // for on another thread while the hosts check the version.
    let bridge_ms = median(
        (0..a.runs.max(5))
            .map(|_| {
                let started = Instant::now();
                let bridge = runtime::bridge(&base, &added);
                let ms = started.elapsed().as_secs_f64() * 1000.0;
                anyhow::ensure!(bridge.is_some(), "a new Service should have a spare");
                Ok(ms)
            })
            .collect::<Result<Vec<_>>>()?,
    );
    let plan_drained = plan_ms(&base, &drained, false)?;
    let plan_routed = plan_ms(&drained, &routed, false)?;
    let (map_commands, map_ms) = runtime_change(&socket, &drained, &routed)?;
    // A new Service served through a spare backend, as the applier does ahead of the
    // reload that adds its own backend.
    let added_routed = render(&a, 1, &all[1..], true)?;
    let (spare_commands, spare_ms) = runtime_change(&socket, &routed, &added_routed)?;
    child.kill();
    // A host whose HAProxy runs with the same tunable (the README's "For big fleets").
    let thp = dir.path().join("master-thp.sock");
    let (mut child, reload_thp) =
        start_and_reload(haproxy, &config, &thp, Some(HUGE_PAGES), a.runs).await?;
    child.kill();

    println!(
        "{} Ingresses (one Service each) on {} nodes, node health checks, {} servers per \
         backend; rendered in {render_ms:.0} ms\n",
        a.ingresses, a.nodes, a.servers_per_backend
    );
    println!("| measure | value |\n|---|---|");
    println!(
        "| config + maps | {:.1} MB ({:.1} MB config) |",
        base.size() as f64 / 1e6,
        base.config.len() as f64 / 1e6
    );
    println!("| `haproxy -c` (median of {}) | {:.0} ms |", a.runs, median(check));
    println!(
        "| `haproxy -c` with `GLIBC_TUNABLES={HUGE_PAGES}`, as the applier runs it (median of {}) | {:.0} ms |",
        a.runs,
        median(check_thp)
    );
    println!("| reload → new worker (median of {}) | {:.0} ms |", a.runs, median(reload));
    println!(
        "| reload → new worker, HAProxy started with `GLIBC_TUNABLES={HUGE_PAGES}` (median of {}) | {:.0} ms |",
        a.runs,
        median(reload_thp)
    );
    println!(
        "| node drained through the runtime API | {drain_commands} commands, {drain_ms:.0} ms |"
    );
    println!(
        "| route added on a running backend (map replaced) | {map_commands} commands, {map_ms:.0} ms |"
    );
    println!(
        "| a new Service through a spare backend, ahead of its reload (servers added, maps replaced) | {spare_commands} commands, {spare_ms:.0} ms |"
    );
    println!(
        "| finding a spare for a new Service (median; off the rollout's path: while hosts check the config) | {bridge_ms:.1} ms |"
    );
    println!(
        "| the applier's plan (median): a new Service (reload) / node drained / route added | \
         {plan_added:.1} / {plan_drained:.1} / {plan_routed:.1} ms |"
    );
    Ok(())
}
