//! Putting a version live on hosts. Per host:
//!
//! ```text
//! connect ─▶ live file and loaded marker = version? ──both──▶ Unchanged
//!              │ file only (stopped between swap and reload) ──▶ reload, verify, mark
//!              │ neither
//!              ▼
//!            upload the map files the host lacks to hafleet-maps/ (named   ┐
//!              by their sha256), each checked                              │
//!            upload to <config>.hafleet-new-<token>, check its sha256      │ one round
//!            haproxy -c -f <config>.hafleet-new-<token>                    │ trip
//!              (refused: Failed, live file untouched)                      │
//!            show proc (before)                                            ┘
//!              (maps and config go as `sed` edits of the host's own where the applier holds
//!               the version its live file is (crate::patch), each checked by its sha256;
//!               whole otherwise, or again whole when an edit does not come out right.
//!               A version that differs from the running config only in its map files and
//!               crt-list: haproxy -c runs on a config that loads those maps alone, as the
//!               config uses them, and the new certificate files alone)
//!            ── up to here: `prepare`, done for the first wave while the canary goes live;
//!               from here: `finish` (a host prepared ahead first checks that its files are
//!               as they were, else it is prepared again, and reads show proc anew: in the
//!               reload's own round trip when the change needs one)
//!            copy live ─▶ <config>.hafleet-last-good; rename new ─▶ live   (atomic)
//!            the change fits the runtime API (see crate::runtime) and HAProxy takes every
//!            command? ──yes──▶ no reload
//!              │ no (then the swap above is in the reload's round trip, unless the reload
//!              │ has a bridge: its new backends go into empty spares first, the spares
//!              │ checked empty, the servers added, then the maps, each only if the last
//!              │ went through; a host prepared ahead for it is read again first)
//!              ▼
//!            show proc (before); reload on the master CLI; show proc on the host until a new
//!            worker runs
//!            (then from the applier, until the reload timeout);
//!            the host's HTTP probes pass within the deadline (from the applier);
//!            record the live sha256 in <config>.hafleet-loaded and the file as last-good;
//!            sweep maps no config names
//!              │ reload or probes failed or timed out
//!              └─▶ restore last-good, reload again ─▶ Failed { restored }
//! ```
//! The live file is only ever replaced by rename, so it is always a complete file that passed
//! `haproxy -c` (invariant 1). Map files are named by their content and written before any
//! config that names them, so a config on disk never names a map that is missing or different.

use crate::host::answer::{self, Exit, LiveShas, LiveState};
use crate::host::ops::{self, Failure, HostOps, Hosts, Mark, ReloadRequest, fail};
use crate::inventory::Host;
use crate::plan::{self, HostPlan, ReloadCheck};
use crate::runtime;
use hafleet_proto::{ApplyOutcome, ApplyStage, Bundle, ConfigVersion};
use std::time::Duration;
use tracing::{info, warn};

/// How rollouts behave.
#[derive(Debug)]
pub struct RolloutSettings {
    /// How the hosts are reached (over SSH, connections kept between versions; in memory in
    /// tests).
    pub hosts: Box<dyn Hosts>,
    /// Hosts updated at once after the canary.
    pub parallelism: usize,
    /// How long a reload may take before it counts as failed.
    pub reload_timeout: Duration,
    /// How long a host's probes may take to pass after a version goes live there.
    pub probe_timeout: Duration,
    /// Hosts in the fleet's inventory, which each report names (a retry or a repair touches
    /// only some).
    pub fleet_hosts: usize,
    /// Opens the versions' certificate keys (`--tls-identity`).
    pub tls_identity: Option<std::sync::Arc<crate::tls::FleetIdentity>>,
    /// How long each host's last reload took to show its new worker, by host name (see
    /// [`first_look`]).
    pub reload_times:
        std::sync::Mutex<std::collections::HashMap<hafleet_proto::HostName, Duration>>,
    /// The sha256 of each certificate file (chain and opened key) a host should hold, by its
    /// path: what a drift check compares the hosts' files with. Opening a key takes an age
    /// decryption, so each is worked out once.
    pub cert_shas: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// The files the newest version's drift checks expect, by the version's sha256.
    pub drift_files: std::sync::Mutex<Option<(String, ExpectedFiles)>>,
    /// The plans worked out for the versions' hosts (see [`Plans`]).
    pub plans: Plans,
}

/// The plans from one bundle to another worked out lately, by their sha256s. The hosts of a
/// fleet almost always run the same version, so a rollout works out each plan once instead of
/// once per host: a node drained at 10,000 backends takes 40 to 50 ms to plan (two configs of
/// 2.8 MB parsed), in the rollout's one task, which 20 hosts would otherwise wait on in turn.
#[derive(Debug, Default)]
pub struct Plans(std::sync::Mutex<Vec<PlanEntry>>);

/// (the loaded bundle's sha256, the next one's, the plan between them, and for a reload,
/// the [`runtime::bridge`] being looked for).
type PlanEntry = (String, String, std::sync::Arc<runtime::Plan>, Option<PendingBridge>);

/// A [`runtime::bridge`] worked out on a blocking thread, awaited by every host that needs it.
pub type PendingBridge = futures::future::Shared<
    futures::future::BoxFuture<'static, Option<std::sync::Arc<runtime::Bridge>>>,
>;

impl Plans {
    /// Plans kept: those of the last few versions, from the one or two versions hosts run.
    const KEEP: usize = 4;

    /// The plan from `loaded` to `next`, worked out once for each pair of versions; for a
    /// reload, also the bridge (new backends served through spares ahead of it), looked for
    /// on a blocking thread from now on, while the hosts upload and check the version.
    pub fn get(
        &self,
        loaded: &ConfigVersion,
        next: &ConfigVersion,
    ) -> Option<(std::sync::Arc<runtime::Plan>, Option<PendingBridge>)> {
        use futures::FutureExt as _;
        let (Some(from), Some(to)) = (loaded.bundle(), next.bundle()) else { return None };
        // Held while planning, with no await inside: a rollout prepares its hosts in one task,
        // so nothing contends for it.
        let mut plans = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = |e: &PlanEntry| e.0 == loaded.sha256 && e.1 == next.sha256;
        if let Some(entry) = plans.iter().find(|e| key(e)) {
            return Some((entry.2.clone(), entry.3.clone()));
        }
        let plan = std::sync::Arc::new(runtime::plan_alone(from, to));
        let bridge = matches!(*plan, runtime::Plan::Reload(_)).then(|| {
            let (from, to) = (from.clone(), to.clone());
            let task = tokio::task::spawn_blocking(move || {
                runtime::bridge(&from, &to).map(std::sync::Arc::new)
            });
            async move { task.await.ok().flatten() }.boxed().shared()
        });
        if plans.len() >= Self::KEEP {
            plans.remove(0);
        }
        plans.push((loaded.sha256.clone(), next.sha256.clone(), plan.clone(), bridge.clone()));
        Some((plan, bridge))
    }
}

/// How long a reload on `host` waits before its first look at `show proc`: two thirds of
/// what the host's last reload took (its whole round trip), so that a host whose reloads
/// take 600 ms (10,000 backends) spends the CPU of a few dozen looks, not of a hundred,
/// while HAProxy parses. A reload faster than that is seen at most a third of the last one
/// late, and teaches the next one. None known yet, or a last reload under
/// [`LOOK_AT_ONCE_UNDER`]: look at once (a few looks cost little, and a wait would be most
/// of such a reload).
fn first_look(settings: &RolloutSettings, host: &Host) -> Duration {
    let times = settings.reload_times.lock().unwrap_or_else(|e| e.into_inner());
    match times.get(&host.name) {
        Some(last) if *last >= LOOK_AT_ONCE_UNDER => *last * 2 / 3,
        _ => Duration::ZERO,
    }
}

/// Reloads faster than this are looked at from the start (see [`first_look`]).
const LOOK_AT_ONCE_UNDER: Duration = Duration::from_millis(250);

/// Whether a reload on `host` is worth bridging to spares first: when its last reload took
/// [`BRIDGE_RELOADS_FROM`] or more, or none is known yet. A bridge costs its own round trips
/// (the swap apart, the spares asked, the servers, the maps: about 60 ms on loopback), which
/// a quick reload (a small fleet's) would not win back: at 10 Ingresses a new Service was
/// served 64 ms later with one (BENCHMARKS.md).
fn worth_bridging(settings: &RolloutSettings, host: &Host) -> bool {
    let times = settings.reload_times.lock().unwrap_or_else(|e| e.into_inner());
    times.get(&host.name).is_none_or(|last| *last >= BRIDGE_RELOADS_FROM)
}

/// See [`worth_bridging`].
const BRIDGE_RELOADS_FROM: Duration = Duration::from_millis(250);

/// What an apply asked of HAProxy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Effort {
    /// Reloads (a restore of last-known-good counts as one more).
    pub reloads: u32,
    /// Runtime API commands sent instead of a reload.
    pub runtime_commands: u32,
    /// Bytes of the version's files sent to the host: config, maps (as edits where it could)
    /// and certificate files.
    pub sent_bytes: u64,
    /// New backends served through spare backends ahead of the reload that added them.
    pub bridged: u32,
}

/// Puts `version` live on one host and says how it went. `known` are versions the applier
/// holds whole: a host whose HAProxy loaded one of them may take the change through the
/// runtime API. Never panics on remote trouble.
pub async fn apply_host(
    host: &Host,
    version: &ConfigVersion,
    known: &[&ConfigVersion],
    settings: &RolloutSettings,
) -> (ApplyOutcome, Effort) {
    let prepared = prepare(host, version, known, settings).await;
    let (result, effort) = finish(prepared, version, settings).await;
    (result.unwrap_or_else(failed), effort)
}

/// A host made ready for a version by [`prepare`]: connected, its state read, the version's
/// files uploaded and validated under an attempt's own names, nothing live changed yet.
/// [`finish`] puts it live; [`abandon`] removes the upload.
pub struct Prepared<'a> {
    host: &'a Host,
    /// The session with the host; `None` if none could be opened.
    conn: Option<Box<dyn HostOps>>,
    step: Next,
    /// When preparing began.
    pub started: std::time::Instant,
    /// The live and loaded sha256 lines live_state.sh printed when it was prepared.
    state: LiveShas,
}

impl Prepared<'_> {
    /// Staged for a change that swaps in the reload's own round trip, which checks that the
    /// host is as it was prepared. A reload that may be bridged to spares swaps first, on its
    /// own, and sends runtime commands to the worker of now: such a host is read again
    /// ([`refresh`]) like one taking a change through the runtime API.
    fn reloads(&self) -> bool {
        matches!(&self.step, Next::Staged { change, bridge: None, .. } if matches!(**change, runtime::Plan::Reload(_)))
    }
}

/// What [`finish`] has left to do.
enum Next {
    /// Nothing: this is the outcome (unchanged, or a failure while preparing).
    Done(Result<ApplyOutcome, Failure>),
    /// The live file is the version, but HAProxy never loaded it: reload.
    ReloadOnly,
    /// The upload `token` passed its check: swap it in and make HAProxy take it, as `change`
    /// says.
    Staged {
        token: String,
        uploaded: Uploaded,
        change: std::sync::Arc<runtime::Plan>,
        bridge: Option<PendingBridge>,
    },
}

/// Connects to `host`, reads its state and uploads and validates what `version` needs there,
/// changing nothing HAProxy serves: a rollout prepares the first wave while the canary goes
/// live. Never fails: a failure is kept for [`finish`] to report.
#[tracing::instrument(skip_all, fields(host = %host.name, version = version.version))]
pub async fn prepare<'a>(
    host: &'a Host,
    version: &ConfigVersion,
    known: &[&ConfigVersion],
    settings: &RolloutSettings,
) -> Prepared<'a> {
    let started = std::time::Instant::now();
    let mut names = String::new();
    for m in version.bundle().iter().flat_map(|b| &b.maps) {
        names.push_str(m.name.as_str());
        names.push('\n');
    }
    // Certificate files are asked for as paths from the maps' folder.
    for c in version.bundle().iter().flat_map(|b| &b.certs) {
        names.push_str(&format!("../{}\n", c.relative_path()));
    }
    let (conn, state) = match settings.hosts.open(host, names.as_bytes()).await {
        Ok(c) => c,
        Err(failure) => {
            let step = Next::Done(Err(failure));
            return Prepared { host, conn: None, step, started, state: LiveShas::default() };
        }
    };
    let (step, state) = match state {
        Ok(state) => match stage(&*conn, host, version, &state, known, settings).await {
            Ok(step) => (step, state.shas),
            Err(f) => (Next::Done(Err(f)), LiveShas::default()),
        },
        Err(f) => (Next::Done(Err(f)), LiveShas::default()),
    };
    Prepared { host, conn: Some(conn), step, started, state }
}

/// A host prepared ahead for the runtime API, made current when the rollout turns to it: its
/// files must still be what they were (else it is prepared again), and its `show proc` is
/// read again, so that the runtime API's worker is that of now, not of before the canary. (A
/// host prepared for a reload checks both in the reload's round trip: swap_reload.sh.)
async fn refresh<'a>(
    mut prepared: Prepared<'a>,
    version: &ConfigVersion,
    known: &[&ConfigVersion],
    settings: &RolloutSettings,
) -> Prepared<'a> {
    let host = prepared.host;
    let (Some(conn), Next::Staged { .. }) = (&prepared.conn, &prepared.step) else {
        return prepared;
    };
    let before = match conn.refresh().await {
        Some(now) if now.shas == prepared.state => now.proc,
        _ => None,
    };
    match (before, &mut prepared.step) {
        (Some(before), Next::Staged { uploaded, .. }) => {
            uploaded.before = before;
            prepared
        }
        _ => {
            warn!(host = %host.name, "the host changed while the canary went live; preparing it again");
            abandon(prepared).await;
            prepare(host, version, known, settings).await
        }
    }
}

/// Puts a prepared host live (see [`prepare`]) and gives its connection back.
#[tracing::instrument(skip_all, fields(host = %prepared.host.name, version = version.version))]
async fn finish(
    prepared: Prepared<'_>,
    version: &ConfigVersion,
    settings: &RolloutSettings,
) -> (Result<ApplyOutcome, Failure>, Effort) {
    let Prepared { host, conn, step, state, .. } = prepared;
    let mut effort = Effort::default();
    let Some(conn) = conn else {
        let Next::Done(result) = step else { unreachable!("only a failure has no connection") };
        return (result, effort);
    };
    let result = match step {
        Next::Done(result) => result,
        Next::ReloadOnly => reload_only(&*conn, host, version, settings, &mut effort).await,
        Next::Staged { token, uploaded, change, bridge } => {
            let staged = Staged { token: token.as_str(), uploaded, change: &change, bridge };
            go_live(&*conn, host, version, staged, &state, settings, &mut effort).await
        }
    };
    conn.give_back(result.is_ok()).await;
    (result, effort)
}

/// Drops a prepared host that must not go live (its rollout halted): removes its upload and
/// gives its connection back.
#[tracing::instrument(skip_all, fields(host = %prepared.host.name))]
pub async fn abandon(prepared: Prepared<'_>) {
    let Prepared { conn, step, .. } = prepared;
    let Some(conn) = conn else { return };
    if let Next::Staged { token, .. } = &step {
        conn.discard(token).await;
    }
    let healthy = !matches!(step, Next::Done(Err(_)));
    conn.give_back(healthy).await;
}

fn failed(f: Failure) -> ApplyOutcome {
    f.outcome()
}

/// [`prepare`]'s work once `state` (what live_state.sh printed) is known.
async fn stage(
    conn: &dyn HostOps,
    host: &Host,
    version: &ConfigVersion,
    state: &LiveState,
    known: &[&ConfigVersion],
    settings: &RolloutSettings,
) -> Result<Next, Failure> {
    let tls_identity = settings.tls_identity.as_deref();
    let (live_sha, loaded_sha) = (state.shas.live(), state.shas.loaded());
    let missing: Vec<&str> = state.missing.iter().map(String::as_str).collect();
    match plan::host_plan(live_sha, loaded_sha, &version.sha256) {
        HostPlan::Unchanged => {
            // HAProxy runs this version, but files it loaded may be gone from the disk (a
            // restore, a hand): put them back, so that its next reload or restart finds them.
            // Nothing reloads.
            let Some(bundle) = version.bundle().filter(|_| !missing.is_empty()) else {
                return Ok(Next::Done(Ok(ApplyOutcome::Unchanged)));
            };
            let token = attempt_token(version.version);
            put_files(conn, bundle, &missing, &token, tls_identity).await?;
            info!(files = missing.len(), "files of the version were missing; put back, no reload");
            return Ok(Next::Done(Ok(ApplyOutcome::Applied)));
        }
        HostPlan::ReloadOnly => return Ok(Next::ReloadOnly),
        HostPlan::Full => {}
    }
    // What the change takes, when the applier holds the bundle HAProxy runs there.
    let loaded =
        known.iter().find(|v| live_sha == Some(v.sha256.as_str()) && loaded_sha == live_sha);
    let (change, bridge) =
        loaded.and_then(|loaded| settings.plans.get(loaded, version)).unwrap_or_else(|| {
            let why = "the applier does not hold the config HAProxy runs";
            (std::sync::Arc::new(runtime::Plan::Reload(why.into())), None)
        });
    let bridge = bridge.filter(|_| worth_bridging(settings, host));
    let loaded = loaded.and_then(|v| v.bundle());

    // A name of this attempt's own: a second applier (a rolling update, say) can never swap in
    // a file this one validated, or the other way round.
    let token = attempt_token(version.version);
    // A version that changes only map files and certificates (the config is the loaded one
    // but for their names) is checked by loading its maps and new certificate files alone:
    // the rest passed `haproxy -c` and loaded.
    let map_check = match (&*change, runtime::files_only(&change)) {
        (runtime::Plan::Runtime(steps), true) => version
            .bundle()
            .and_then(|b| runtime::map_check_config(b, &runtime::added_certs(steps))),
        (_, true) => version.bundle().and_then(|b| runtime::map_check_config(b, &[])),
        (_, false) => None,
    };
    let validate = UploadCheck {
        missing_maps: &missing,
        map_check: map_check.as_deref(),
        live: loaded,
        tls_identity,
    };
    match upload_and_validate(conn, host, version, &validate, &token).await {
        Ok(uploaded) => Ok(Next::Staged { token, uploaded, change, bridge }),
        Err(failure) => {
            // Leave no copy of a config that is not live behind (best effort).
            conn.discard(&token).await;
            Err(failure)
        }
    }
}

/// The live file is the version but HAProxy never loaded it: reload, verify, mark.
async fn reload_only(
    conn: &dyn HostOps,
    host: &Host,
    version: &ConfigVersion,
    settings: &RolloutSettings,
    effort: &mut Effort,
) -> Result<ApplyOutcome, Failure> {
    info!("live file is this version but HAProxy never loaded it; reloading");
    effort.reloads += 1;
    let mark = mark_with_reload(host, version);
    let ask = ReloadAsk { swap: None, mark, stat: None, version: Some(version.version) };
    let (after, marked) = match reload(conn, host, settings, ask).await {
        Ok(done) => done,
        Err(failure) if failure.changed_nothing() => {
            effort.reloads -= 1;
            return Err(failure);
        }
        Err(mut failure) => {
            // The live file is one HAProxy will not load: put last-known-good back, so a host
            // restart does not start HAProxy on it.
            effort.reloads += 1;
            failure.restored = restore(conn, host, settings).await;
            return Err(failure);
        }
    };
    probed(conn, host, settings, effort).await?;
    if !marked {
        let done = (version.sha256.as_str(), Some(version.version));
        mark_loaded(conn, done, Some(after.reloads), None).await?;
    }
    Ok(ApplyOutcome::Applied)
}

/// Swaps a staged upload in and makes HAProxy take it: through the runtime API when `change`
/// allows, else with a reload; then probes and marks it loaded, or puts last-known-good back.
async fn go_live(
    conn: &dyn HostOps,
    host: &Host,
    version: &ConfigVersion,
    staged: Staged<'_>,
    prepared_state: &LiveShas,
    settings: &RolloutSettings,
    effort: &mut Effort,
) -> Result<ApplyOutcome, Failure> {
    let Staged { token, uploaded: Uploaded { before, stat, sent }, change, bridge } = staged;
    effort.sent_bytes += sent;
    // For a reload: its bridge, if one was found (looked for while the host checked the
    // version, so by now it is there).
    let bridge = match (change, bridge) {
        (runtime::Plan::Reload(_), Some(pending)) => pending.await,
        _ => None,
    };
    // A change that needs a reload swaps in the same round trip as the reload (below); one
    // bridged to spares first swaps before its runtime commands, so that a stop in between
    // leaves a live file HAProxy has not loaded (reloaded at the next look).
    let swap_with_reload = matches!(change, runtime::Plan::Reload(_)) && bridge.is_none();
    if !swap_with_reload {
        conn.swap(token).await?;
    }

    // The files hold the version now; the running process takes it without a reload if it can.
    let live_without_reload = match change {
        runtime::Plan::Nothing => {
            info!("the new config differs from the running one in comments only; no reload");
            true
        }
        runtime::Plan::Runtime(steps) => match apply_runtime(
            conn,
            &before,
            steps,
            (version.bundle(), settings.tls_identity.as_deref()),
        )
        .await
        {
            Ok(sent) => {
                effort.runtime_commands = sent;
                info!(commands = sent, "applied through the runtime API; no reload");
                true
            }
            Err(why) => {
                warn!(%why, "the runtime API did not take the change; reloading instead");
                false
            }
        },
        runtime::Plan::Reload(why) => {
            match &bridge {
                Some(bridge) => {
                    bridged(conn, version, &before, (why, bridge), settings, effort).await
                }
                None => info!(%why, "the change needs a reload"),
            }
            false
        }
        runtime::Plan::Bridged { why, bridge } => {
            bridged(conn, version, &before, (why, bridge), settings, effort).await;
            false
        }
    };
    if live_without_reload {
        probed(conn, host, settings, effort).await?;
        let stat = stat.as_deref();
        let done = (version.sha256.as_str(), Some(version.version));
        mark_loaded(conn, done, Some(before.reloads), stat).await?;
        return Ok(ApplyOutcome::Applied);
    }

    effort.reloads += 1;
    let ask = ReloadAsk {
        swap: swap_with_reload.then_some((token, prepared_state)),
        mark: mark_with_reload(host, version),
        stat: stat.as_deref(),
        version: Some(version.version),
    };
    match reload(conn, host, settings, ask).await {
        Ok((after, marked)) => {
            probed(conn, host, settings, effort).await?;
            if !marked {
                let stat = stat.as_deref();
                let done = (version.sha256.as_str(), Some(version.version));
                mark_loaded(conn, done, Some(after.reloads), stat).await?;
            }
            Ok(ApplyOutcome::Applied)
        }
        Err(failure) if failure.changed_nothing() => {
            // Nothing changed: the live file is the one HAProxy runs.
            effort.reloads -= 1;
            conn.discard(token).await;
            Err(failure)
        }
        Err(mut failure) => {
            warn!(stage = ?failure.stage, message = %failure.message, "reload failed; restoring last-known-good");
            effort.reloads += 1;
            failure.restored = restore(conn, host, settings).await;
            Err(failure)
        }
    }
}

/// What [`go_live`] puts live: the staged upload, and how.
struct Staged<'a> {
    token: &'a str,
    uploaded: Uploaded,
    change: &'a runtime::Plan,
    /// For a reload: its bridge, being looked for.
    bridge: Option<PendingBridge>,
}

/// Serves a reload's new backends through spares (see [`runtime::bridge`]) until the reload,
/// which follows whatever happens here: the files hold the version already, and the reload
/// makes the process serve them.
async fn bridged(
    conn: &dyn HostOps,
    version: &ConfigVersion,
    before: &plan::ProcState,
    (why, bridge): (&str, &runtime::Bridge),
    settings: &RolloutSettings,
    effort: &mut Effort,
) {
    match bridge_steps(conn, version, before, bridge, settings).await {
        Ok(sent) => {
            effort.runtime_commands = sent;
            effort.bridged = bridge.spares.len() as u32;
            info!(%why, spares = ?bridge.spares, commands = sent, "the change needs a reload; its new backends are served through spares until then");
        }
        Err(failed) => {
            warn!(%why, %failed, "the change needs a reload; spares did not take its new backends");
        }
    }
}

/// [`bridged`]'s commands, in three steps, each only if the one before went through: the
/// spares are empty in the running process too (a failed restore can leave one holding
/// another Service's servers, which a map entry must never reach); every new server is in its
/// spare; then the maps name the spares. Returns the commands sent.
async fn bridge_steps(
    conn: &dyn HostOps,
    version: &ConfigVersion,
    before: &plan::ProcState,
    bridge: &runtime::Bridge,
    settings: &RolloutSettings,
) -> Result<u32, String> {
    let pid = plan::current_worker(before).ok_or("no single current worker in `show proc`")?;
    let checks = runtime::spare_checks(bridge);
    let answers = session(conn, pid, &checks).await?;
    if let Some(busy) = runtime::busy_spare(bridge, &answers) {
        return Err(format!("{busy} is not empty in the running process"));
    }
    let (servers, maps) = runtime::split_bridge(&bridge.steps);
    let keys = (version.bundle(), settings.tls_identity.as_deref());
    let added = apply_runtime(conn, before, &servers, keys).await?;
    let mapped = apply_runtime(conn, before, &maps, keys).await?;
    Ok(checks.len() as u32 + added + mapped)
}

/// How `host`'s files differ from `version` (`None`: they do not), and how its HAProxy sees
/// the nodes it checks (`None`: node health checks off, or no worker answered); `Err` when
/// the host cannot be read (a drift check skips it: the retry loop deals with unreachable
/// hosts).
pub async fn drift_of(
    host: &Host,
    version: &ConfigVersion,
    settings: &RolloutSettings,
) -> Result<(Option<plan::Drift>, Option<plan::NodeChecks>), String> {
    let files = expected_files(version, settings);
    let files: Vec<(&str, &str)> = files.iter().map(|(n, s)| (n.as_str(), s.as_str())).collect();
    let names: String = files.iter().map(|(name, _)| format!("{name}\n")).collect();
    let found = settings.hosts.drift_state(host, names.as_bytes()).await?;
    Ok((plan::drift(&version.sha256, &files, &found), found.nodes))
}

/// The files besides the config a host of `version` holds, as drift checks name them (maps
/// by name, certificate files as `../hafleet-certs/<id>.pem`), each with the sha256 it must
/// have; worked out once per version. A certificate file's is known only by opening its key
/// (once per certificate): without `--tls-identity` (or a key that does not open)
/// certificate files are not checked.
fn expected_files(version: &ConfigVersion, settings: &RolloutSettings) -> ExpectedFiles {
    let mut cached = settings.drift_files.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((sha, files)) = cached.as_ref()
        && *sha == version.sha256
    {
        return files.clone();
    }
    let files = std::sync::Arc::new(work_out_files(version, settings));
    *cached = Some((version.sha256.clone(), files.clone()));
    files
}

/// What a drift check expects of a host's files: (name, sha256).
type ExpectedFiles = std::sync::Arc<Vec<(String, String)>>;

fn work_out_files(version: &ConfigVersion, settings: &RolloutSettings) -> Vec<(String, String)> {
    let Some(bundle) = version.bundle() else { return Vec::new() };
    let mut files: Vec<(String, String)> = bundle
        .maps
        .iter()
        .map(|m| (m.name.as_str().to_owned(), m.name.digest().to_owned()))
        .collect();
    let Some(identity) = settings.tls_identity.as_deref() else { return files };
    let mut known = settings.cert_shas.lock().unwrap_or_else(|e| e.into_inner());
    let wanted: std::collections::HashSet<String> =
        bundle.certs.iter().map(|c| c.relative_path()).collect();
    known.retain(|path, _| wanted.contains(path));
    for cert in &bundle.certs {
        let path = cert.relative_path();
        let sha = match known.get(&path) {
            Some(sha) => sha.clone(),
            None => match identity.cert_file(cert) {
                Ok(file) => {
                    let sha = hafleet_proto::sha256_hex(file.as_bytes());
                    known.insert(path.clone(), sha.clone());
                    sha
                }
                Err(_) => continue,
            },
        };
        files.push((format!("../{path}"), sha));
    }
    files
}

/// Puts the files `names` of `version` (maps, and certificate files as
/// `../hafleet-certs/<id>.pem`) back on `host` as the version has them: the maps in one
/// round trip (UPLOAD_MAPS), the certificates opened with `--tls-identity` (UPLOAD_CERTS),
/// each checked on arrival and renamed over what is there only once all arrived whole, so
/// HAProxy never finds one half written or missing. The repair of a drift in those files
/// alone: HAProxy holds the maps and certificates it loaded, so nothing reloads. `Applied`,
/// or where it failed.
pub async fn put_back_files(
    host: &Host,
    version: &ConfigVersion,
    names: &[String],
    settings: &RolloutSettings,
) -> ApplyOutcome {
    let Some(bundle) = version.bundle() else {
        return failed(fail(ApplyStage::Upload, "the applier does not hold the version's files"));
    };
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    // A connection from the pool (a no-op checks it), then the uploads on it: each writes
    // under this attempt's own token, never run twice.
    let (conn, mut done) = match settings.hosts.open_checked(host).await {
        Ok(running) => running,
        Err(failure) => return failed(failure),
    };
    if done.is_ok() {
        let (token, identity) = (attempt_token(version.version), settings.tls_identity.as_deref());
        done = put_files(&*conn, bundle, &names, &token, identity).await;
    }
    conn.give_back(done.is_ok()).await;
    match done {
        Ok(()) => ApplyOutcome::Applied,
        Err(f) => failed(f),
    }
}

/// Writes the map and certificate files of `bundle` that `names` lists (LIVE_STATE's and
/// DRIFT_STATE's names) on the host, each checked on arrival and renamed over in place: maps in
/// one round trip, then certificates opened with `identity`.
async fn put_files(
    conn: &dyn HostOps,
    bundle: &Bundle,
    names: &[&str],
    token: &str,
    identity: Option<&crate::tls::FleetIdentity>,
) -> Result<(), Failure> {
    upload_maps(conn, &missing_maps(bundle, names), token).await?;
    upload_certs(conn, bundle, names, token, identity).await.map(|_| ())
}

/// Runs the host's probes against what now runs; if they do not pass in time, puts
/// last-known-good back (a config that loaded and passed them) and fails at `Probe`.
async fn probed(
    conn: &dyn HostOps,
    host: &Host,
    settings: &RolloutSettings,
    effort: &mut Effort,
) -> Result<(), Failure> {
    let (Some(address), false) = (&host.probe_address, host.probes.is_empty()) else {
        return Ok(());
    };
    let Err(why) = crate::probe::until_pass(address, &host.probes, settings.probe_timeout).await
    else {
        return Ok(());
    };
    warn!(%why, "probes failed; rolling back to last-known-good");
    let mut failure = fail(ApplyStage::Probe, why);
    effort.reloads += 1;
    failure.restored = restore(conn, host, settings).await;
    Err(failure)
}

/// Sends `steps` to the running worker through the master CLI. Returns how many commands
/// went, or why the running process did not take the change (then it needs a reload, which
/// makes it serve the files whatever the commands did).
async fn apply_runtime(
    conn: &dyn HostOps,
    before: &plan::ProcState,
    steps: &[runtime::Step],
    (bundle, identity): (Option<&Bundle>, Option<&crate::tls::FleetIdentity>),
) -> Result<u32, String> {
    let pid = plan::current_worker(before).ok_or("no single current worker in `show proc`")?;
    let mut sent = 0;
    let mut certs = runtime::CertInputs::default();
    let cert_steps = steps
        .iter()
        .any(|s| matches!(s, runtime::Step::AddCert { .. } | runtime::Step::RemoveCert { .. }));
    if cert_steps {
        let show = format!("@!{pid} show ssl crt-list");
        let out = conn.master_cli(&show).await?;
        sent += 1;
        certs.crt_list = runtime::running_crt_list(&out)
            .ok_or("`show ssl crt-list` does not list exactly one crt-list of hafleet's")?;
        let identity = identity.ok_or("no --tls-identity to open the certificates' keys")?;
        let by_path = certs_by_path(bundle);
        for path in runtime::added_certs(steps) {
            let cert =
                by_path.get(path).ok_or_else(|| format!("the version does not hold {path}"))?;
            certs
                .files
                .insert(path.to_owned(), identity.cert_file(cert).map_err(|e| e.to_string())?);
        }
    }
    let mut prepared = runtime::PreparedMaps::new();
    let kinds = runtime::map_kinds(steps);
    if !kinds.is_empty() {
        let show = format!("@!{pid} show map");
        let out = conn.master_cli(&show).await?;
        let ids = runtime::map_ids(&out, &kinds)
            .ok_or_else(|| format!("`show map` does not list one map of each kind {kinds:?}"))?;
        let prepare = runtime::prepare_commands(&ids);
        let answers = session(conn, pid, &prepare).await?;
        sent += prepare.len() + 1;
        prepared = runtime::prepared_maps(ids, &answers)?;
    }
    let commands = runtime::commands(steps, &prepared, &certs)?;
    let answers = session(conn, pid, &commands).await?;
    sent += commands.len();
    let answers: Vec<&str> = answers.iter().map(String::as_str).collect();
    if let Some((command, answer)) = runtime::first_refused(&commands, &answers) {
        return Err(format!("HAProxy answered {answer:?} to `{command}`"));
    }
    Ok(sent as u32)
}

/// One interactive master CLI session: the answers to `commands`, in order.
async fn session(
    conn: &dyn HostOps,
    pid: u32,
    commands: &[runtime::Command],
) -> Result<Vec<String>, String> {
    let input = runtime::session(pid, commands);
    let out = conn.session(input.as_bytes()).await?;
    Ok(runtime::answers(&out, commands.len()).into_iter().map(str::to_owned).collect())
}

/// What an upload sends and how it is checked.
struct UploadCheck<'a> {
    /// The version's map files the host does not have yet.
    missing_maps: &'a [&'a str],
    /// A config that loads only the maps and new certificate files
    /// ([`runtime::map_check_config`]), for a version whose config HAProxy runs but for its
    /// maps and crt-list; `None`: `haproxy -c` on the whole config.
    map_check: Option<&'a str>,
    /// The bundle whose config is the host's live file, if the applier holds it: a version
    /// that changes a few of its lines is sent as an edit of it.
    live: Option<&'a Bundle>,
    /// Opens the version's certificate keys.
    tls_identity: Option<&'a crate::tls::FleetIdentity>,
}

/// What an upload leaves for the rest of the apply.
struct Uploaded {
    /// `show proc` before the change.
    before: plan::ProcState,
    /// The upload's stat (`%i %s %y`): a rename keeps it, so the live file having it later
    /// is the upload itself, and marking it loaded need not hash it again.
    stat: Option<String>,
    /// Bytes sent (see [`Effort::sent_bytes`]).
    sent: u64,
}

/// Uploads the version under this attempt's name, checks what landed, validates it with
/// `haproxy -c`, and reads `show proc` for the reload check to come.
async fn upload_and_validate(
    conn: &dyn HostOps,
    host: &Host,
    version: &ConfigVersion,
    check: &UploadCheck<'_>,
    token: &str,
) -> Result<Uploaded, Failure> {
    let missing = check.missing_maps;
    let Some(bundle) = version.bundle() else {
        return Err(fail(ApplyStage::Upload, "the version's bundle was not fetched"));
    };
    let maps = missing_maps(bundle, missing);
    let certs = upload_certs(conn, bundle, missing, token, check.tls_identity).await?;
    // The maps and the config in one round trip, as edits of the host's own where the applier
    // holds the bundle its live file is.
    let diffed = std::time::Instant::now();
    let outgoing = Outgoing::edited(&maps, &bundle.config, check.live);
    tracing::debug!(diff_ms = diffed.elapsed().as_secs_f64() * 1e3, "files to send worked out");
    let count = maps.len();
    // The upload's stat, the bytes sent, and `show proc`.
    let (stat, bytes, proc) = match check.map_check {
        Some(map_check) => {
            let landing = ops::UploadCheck::Landed;
            let (landed, bytes) = send(conn, token, landing, count, &outgoing).await?;
            let sha = landed.sha.as_deref().unwrap_or_default();
            if sha != version.sha256 {
                return Err(fail(
                    ApplyStage::Upload,
                    format!("uploaded file has sha256 {sha} instead of {}", version.sha256),
                ));
            }
            info!(
                "the config is the running one but for its maps and certificates: checking \
                 those alone"
            );
            let checked = conn.validate_maps(token, map_check).await?;
            (landed.stat, bytes, checked.proc)
        }
        None => {
            let check = ops::UploadCheck::Validated { sha256: &version.sha256 };
            let (out, bytes) = send(conn, token, check, count, &outgoing).await?;
            (out.stat, bytes, out.proc)
        }
    };
    let before = parse_show_proc(host, &proc, "").map_err(|m| fail(ApplyStage::Verify, m))?;
    Ok(Uploaded { before, stat, sent: certs + bytes })
}

/// The certificates of `bundle` by their file's path. Built once per use: a path is a sha256
/// of the certificate's chain and sealed key, and looking each up by a walk over 10,000
/// certificates hashed 15 MB per lookup (a host joining such a fleet spent 52 s on it).
fn certs_by_path(
    bundle: Option<&Bundle>,
) -> std::collections::HashMap<String, &hafleet_proto::SealedCert> {
    bundle.iter().flat_map(|b| &b.certs).map(|c| (c.relative_path(), c)).collect()
}

/// The map files of `bundle` that the host does not have yet (`missing` names them, among
/// certificate files).
fn missing_maps<'a>(bundle: &'a Bundle, missing: &[&str]) -> Vec<&'a hafleet_proto::MapFile> {
    let missing: std::collections::HashSet<&str> = missing.iter().copied().collect();
    bundle.maps.iter().filter(|m| missing.contains(m.name.as_str())).collect()
}

/// Uploads `maps` whole in one round trip (UPLOAD_MAPS), each checked on arrival.
async fn upload_maps(
    conn: &dyn HostOps,
    maps: &[&hafleet_proto::MapFile],
    token: &str,
) -> Result<(), Failure> {
    if maps.is_empty() {
        return Ok(());
    }
    let stream = Outgoing::whole(maps, None).stream();
    conn.upload_maps(token, maps.len(), &stream).await
}

/// Uploads `outgoing` (its config and `maps` map files) under `token`, checked as `check`
/// says. Files sent as edits that do not come out as the version's on the host (its own file
/// was not the one the edit was made from) are sent again whole, at once: the same round trip
/// again. Returns the host's answer and the bytes sent.
async fn send(
    conn: &dyn HostOps,
    token: &str,
    check: ops::UploadCheck<'_>,
    maps: usize,
    outgoing: &Outgoing<'_>,
) -> Result<(answer::Uploaded, u64), Failure> {
    let run = |stream: Vec<u8>| async move { conn.upload(token, check, maps, &stream).await };
    let stream = outgoing.stream();
    let bytes = stream.len() as u64;
    tracing::debug!(bytes, edits = outgoing.has_edits(), "files sent");
    match run(stream).await {
        Err(f) if f.exit == Some(Exit::Upload) && outgoing.has_edits() => {
            warn!(error = %f.message, "files sent as edits did not come out as the version's; sending them whole");
            let whole = outgoing.whole_again().stream();
            let more = whole.len() as u64;
            Ok((run(whole).await?, bytes + more))
        }
        done => Ok((done?, bytes)),
    }
}

/// A version's files on their way to a host: the map files it lacks and the config, each
/// whole or as an edit of the host's own (a map of the same kind, the live file), where the
/// applier holds the bundle the host's live file is and the edit is smaller (see
/// [`crate::patch`]).
pub(crate) struct Outgoing<'a> {
    /// Each map, and the map of the host's it is an edit of with the `sed` script.
    pub(crate) maps:
        Vec<(&'a hafleet_proto::MapFile, Option<(&'a hafleet_proto::MapName, String)>)>,
    /// The config, and the `sed` script that makes it from the live file.
    pub(crate) config: Option<(&'a str, Option<String>)>,
}

impl<'a> Outgoing<'a> {
    pub(crate) fn whole(maps: &[&'a hafleet_proto::MapFile], config: Option<&'a str>) -> Self {
        Outgoing {
            maps: maps.iter().map(|m| (*m, None)).collect(),
            config: config.map(|c| (c, None)),
        }
    }

    /// `maps` and `config`, as edits of what `live` (the bundle of the host's live file) has
    /// where that is smaller.
    pub(crate) fn edited(
        maps: &[&'a hafleet_proto::MapFile],
        config: &'a str,
        live: Option<&'a Bundle>,
    ) -> Self {
        let Some(live) = live else { return Self::whole(maps, Some(config)) };
        let base = |m: &hafleet_proto::MapFile| {
            live.maps.iter().find(|b| b.name.kind() == m.name.kind() && b.name != m.name)
        };
        let maps = maps
            .iter()
            .map(|m| {
                let edit = base(m).and_then(|b| {
                    crate::patch::sed_script(&b.content, &m.content).map(|script| (&b.name, script))
                });
                (*m, edit)
            })
            .collect();
        let edit = crate::patch::sed_script(&live.config, config);
        Outgoing { maps, config: Some((config, edit)) }
    }

    fn has_edits(&self) -> bool {
        self.maps.iter().any(|(_, e)| e.is_some())
            || self.config.as_ref().is_some_and(|(_, e)| e.is_some())
    }

    /// The same files, all whole.
    pub(crate) fn whole_again(&self) -> Self {
        let maps: Vec<_> = self.maps.iter().map(|(m, _)| *m).collect();
        Self::whole(&maps, self.config.as_ref().map(|(c, _)| *c))
    }

    /// What upload_files.sh, upload_validate.sh and upload_maps.sh unpack: for each map,
    /// `hafleet-map <name> <sha256> <lines> <1 if it ends in a newline, else 0>` and its
    /// content, or `hafleet-map-edit <name> <sha256> <the host's map it edits> <lines> 1` and
    /// the `sed` script; then, with a config, `hafleet-config <lines> <1|0>` and the config, or
    /// `hafleet-config-edit <lines> 1` and the script that edits the live file. Lines are
    /// counted as awk reads them, so any text goes through whole; a map's sha256 is the one
    /// its name promises (the bundle was checked against it), and the config's is checked on
    /// arrival by the caller.
    pub(crate) fn stream(&self) -> Vec<u8> {
        fn record(out: &mut Vec<u8>, head: &str, content: &str) {
            let lines = content.matches('\n').count()
                + usize::from(!content.ends_with('\n') && !content.is_empty());
            let newline = u8::from(content.ends_with('\n'));
            out.extend_from_slice(format!("{head} {lines} {newline}\n").as_bytes());
            out.extend_from_slice(content.as_bytes());
            if !content.is_empty() && newline == 0 {
                out.push(b'\n');
            }
        }
        let size = |text: &str, edit: Option<&String>| edit.map_or(text.len(), String::len) + 160;
        let size: usize = self
            .maps
            .iter()
            .map(|(m, e)| size(&m.content, e.as_ref().map(|(_, s)| s)))
            .sum::<usize>()
            + self.config.as_ref().map_or(0, |(c, e)| size(c, e.as_ref()));
        let mut out = Vec::with_capacity(size);
        for (map, edit) in &self.maps {
            let (name, digest) = (map.name.as_str(), map.name.digest());
            match edit {
                Some((base, script)) => {
                    let head = format!("hafleet-map-edit {name} {digest} {base}");
                    record(&mut out, &head, script);
                }
                None => record(&mut out, &format!("hafleet-map {name} {digest}"), &map.content),
            }
        }
        match &self.config {
            Some((_, Some(script))) => record(&mut out, "hafleet-config-edit", script),
            Some((config, None)) => record(&mut out, "hafleet-config", config),
            None => {}
        }
        out
    }
}

/// Writes the certificate files of `bundle` that the host does not have yet (`missing` names
/// them `../hafleet-certs/<id>.pem`): each is the chain and the key opened with the fleet's
/// identity, sent over SSH, written 0600 in a 0700 folder and checked on arrival. The opened
/// key exists only in this process's memory (zeroed after) and in that file.
async fn upload_certs(
    conn: &dyn HostOps,
    bundle: &Bundle,
    missing: &[&str],
    token: &str,
    identity: Option<&crate::tls::FleetIdentity>,
) -> Result<u64, Failure> {
    if !missing.iter().any(|name| name.starts_with("../")) {
        return Ok(0);
    }
    let by_path = certs_by_path(Some(bundle));
    let certs: Vec<&hafleet_proto::SealedCert> = missing
        .iter()
        .filter_map(|name| name.strip_prefix("../"))
        .filter_map(|path| by_path.get(path).copied())
        .collect();
    if certs.is_empty() {
        return Ok(0);
    }
    let Some(identity) = identity else {
        return Err(fail(
            ApplyStage::Upload,
            "the version has TLS certificates and this applier has no --tls-identity to open \
             their keys",
        ));
    };
    // At most CERTS_PER_UPLOAD keys opened in memory at once.
    let mut sent = 0;
    for batch in certs.chunks(CERTS_PER_UPLOAD) {
        let mut files = Vec::with_capacity(batch.len());
        for cert in batch {
            let file =
                identity.cert_file(cert).map_err(|e| fail(ApplyStage::Upload, e.to_string()))?;
            files.push((format!("{}.pem", cert.id()), file));
        }
        let stream = cert_stream(&files).map_err(|e| fail(ApplyStage::Upload, e))?;
        conn.upload_certs(token, files.len(), &stream).await?;
        sent += stream.len() as u64;
    }
    Ok(sent)
}

/// Certificate files sent in one UPLOAD_CERTS round trip, at most.
const CERTS_PER_UPLOAD: usize = 1000;

/// UPLOAD_CERTS's input: for each (name, content), `hafleet-cert <name> <sha256> <lines>` and
/// the content. Contents are PEM text: lines ending in a newline, no carriage return.
pub(crate) fn cert_stream(
    files: &[(String, zeroize::Zeroizing<String>)],
) -> Result<zeroize::Zeroizing<Vec<u8>>, String> {
    // Sized once: a Vec that grows leaves copies of the keys in the memory it gives back.
    let headers: usize = files.iter().map(|(name, _)| name.len() + 64 + 40).sum();
    let bodies: usize = files.iter().map(|(_, content)| content.len()).sum();
    let mut out = zeroize::Zeroizing::new(Vec::with_capacity(headers + bodies));
    let capacity = out.capacity();
    for (name, content) in files {
        let is_name = name.strip_suffix(".pem").is_some_and(|id| {
            !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if !is_name || !content.ends_with('\n') || content.contains('\r') {
            return Err(format!("certificate file {name} is not PEM lines"));
        }
        let sha = hafleet_proto::sha256_hex(content.as_bytes());
        let lines = content.lines().count();
        out.extend_from_slice(format!("hafleet-cert {name} {sha} {lines}\n").as_bytes());
        out.extend_from_slice(content.as_bytes());
    }
    debug_assert_eq!(out.capacity(), capacity, "never reallocated");
    Ok(out)
}

/// `v<version>-<pid>-<nanoseconds>`: unique per attempt, and only `[a-z0-9-]`.
fn attempt_token(version: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("v{version}-{}-{nanos}", std::process::id())
}

/// Records the live file as what HAProxy loaded, if it is `expected_sha` (empty: whatever is
/// live, after a restore), with the master's reload count after our reload (`reloads`), so a
/// later reload by anyone else shows. A live file with the stat of the upload that became it
/// (`upload_stat`) is that upload, whose sha256 was checked on arrival: it is not hashed again.
/// Another applier may have swapped in a different file meanwhile; then this is a failure, not
/// a report of something HAProxy does not run.
async fn mark_loaded(
    conn: &dyn HostOps,
    (expected_sha, version): (&str, Option<u64>),
    reloads: Option<u64>,
    upload_stat: Option<&str>,
) -> Result<(), Failure> {
    // The running worker is told the version it serves (access logs name it).
    conn.mark_loaded(Mark { expected_sha, reloads, upload_stat, version }).await
}

fn parse_show_proc(host: &Host, stdout: &str, stderr: &str) -> Result<plan::ProcState, String> {
    answer::show_proc(&host.master_socket, stdout, stderr)
}

/// Asks the master to reload and waits until a new worker runs, after exactly the one reload
/// asked for (so it is ours), or the reload failed. Returns `show proc` after it. A reload by
/// someone else in between makes the newest worker unattributable: it asks again (twice at
/// most), since the file it loads is the one this apply put in place. A master that answers
/// that another reload is still in progress (HAProxy 3.1 and later) did nothing: it is asked
/// again, every [`BUSY_PAUSE`], until the reload timeout.
///
/// What else the reload's round trip does: see [`ReloadAsk`]. Also returns whether the live
/// file was marked loaded.
async fn reload(
    conn: &dyn HostOps,
    host: &Host,
    settings: &RolloutSettings,
    mut ask: ReloadAsk<'_>,
) -> Result<(plan::ProcState, bool), Failure> {
    let busy_until = tokio::time::Instant::now() + settings.reload_timeout;
    let mut raced = 0;
    loop {
        match reload_once(conn, host, settings, ask).await? {
            Ok(done) => return Ok(done),
            Err(Again::Raced(after)) => {
                raced += 1;
                if raced == 3 {
                    return Err(fail(
                        ApplyStage::Verify,
                        "other reloads kept coming with ours: cannot tell ours apart",
                    ));
                }
                warn!(reloads = after.reloads, "another reload came with ours; reloading again");
            }
            Err(Again::Busy) => {
                if tokio::time::Instant::now() >= busy_until {
                    return Err(fail(
                        ApplyStage::Verify,
                        format!(
                            "HAProxy's master kept answering that another reload is still in \
                             progress for {} ms",
                            settings.reload_timeout.as_millis()
                        ),
                    ));
                }
                info!("another reload is still in progress on the host; asking again");
                tokio::time::sleep(BUSY_PAUSE).await;
            }
        }
        // The swap (if any) is done: the next round trip only reloads.
        ask.swap = None;
    }
}

/// How long a reload the master held off (another one in progress) waits before it asks
/// again.
const BUSY_PAUSE: Duration = Duration::from_millis(100);

/// Why a reload must be asked for again.
enum Again {
    /// Another reload came with ours (`show proc` after it).
    Raced(plan::ProcState),
    /// The master did not reload: another reload was still in progress.
    Busy,
}

/// What a reload's round trip does besides reloading.
#[derive(Debug, Clone, Copy)]
struct ReloadAsk<'a> {
    /// Swap in this attempt's validated upload (its token) first, if the live and loaded
    /// sha256 lines are still those it was prepared on; failing either is a `Swap` failure
    /// that changed nothing.
    swap: Option<(&'a str, &'a LiveShas)>,
    /// Once the reload is provably ours, mark the live file loaded if it has this sha256, as
    /// [`mark_loaded`] would (for a host without probes, where loading is passing them).
    mark: Option<&'a str>,
    /// The swapped-in upload's stat, for the mark (see [`Uploaded::stat`]).
    stat: Option<&'a str>,
    /// The version the new worker is told it serves, once the reload is ours.
    version: Option<u64>,
}

/// The sha256 a reload of `version` on `host` may mark loaded in its own round trip: only
/// where no probes must pass first.
fn mark_with_reload<'a>(host: &Host, version: &'a ConfigVersion) -> Option<&'a str> {
    let probes = host.probe_address.is_some() && !host.probes.is_empty();
    (!probes).then_some(version.sha256.as_str())
}

/// One reload: `Ok(Ok(after))` when it is provably ours, `Ok(Err(again))` when it must be asked
/// for again.
async fn reload_once(
    conn: &dyn HostOps,
    host: &Host,
    settings: &RolloutSettings,
    ask: ReloadAsk<'_>,
) -> Result<Result<(plan::ProcState, bool), Again>, Failure> {
    let timeout = settings.reload_timeout;
    let asked = tokio::time::Instant::now();
    let deadline = asked + timeout;
    // Never past the reload timeout.
    let first = first_look(settings, host).min(timeout / 2);
    // A reload usually completes within tens of milliseconds: the host itself looks every
    // 3 ms (one round trip in all), at most 150 times (about a second) and for at most the
    // reload timeout in whole seconds (1 to 10; a look that hangs is cut after a second);
    // after that the applier looks, backing off to 100 ms, until the deadline.
    let request = ReloadRequest {
        // Exits Stale, NoProc and Swap say nothing was done; anything else comes after the
        // swap.
        swap: ask.swap,
        looks: (timeout.as_millis() / 8).clamp(1, 150) as u64,
        secs: timeout.as_secs().clamp(1, 10),
        mark: ask.mark,
        stat: ask.stat,
        first_look: first,
        version: ask.version,
    };
    let answer::Reload { before, master, after, looks, marked } = conn.reload(request).await?;
    let before = parse_show_proc(host, &before, "").map_err(|m| fail(ApplyStage::Verify, m))?;
    let before = &before;
    tracing::debug!(first_look = ?first, pending_looks = looks, ms = asked.elapsed().as_millis() as u64, "reload seen from the host");
    match master {
        answer::MasterAnswer::Busy => return Ok(Err(Again::Busy)),
        answer::MasterAnswer::Refused { logs } => {
            return Err(fail(
                ApplyStage::Reload,
                format!("HAProxy's master refused the new config on reload: {logs}"),
            ));
        }
        answer::MasterAnswer::Loaded { logs } if !logs.is_empty() => {
            info!(%logs, "HAProxy's master reloaded");
        }
        answer::MasterAnswer::Other(said) => warn!(%said, "HAProxy's master answered the reload"),
        answer::MasterAnswer::Loaded { .. } | answer::MasterAnswer::Silent => {}
    }
    // Only when the host saw the reload done, as below, and marked it.
    let mut marked = marked;
    // While the master re-executes, its socket may refuse connections: that is "pending".
    let mut seen = after;
    let mut pause = Duration::from_millis(10);
    loop {
        if let Some(after) = seen.take() {
            match plan::check_reload(before, &after) {
                ReloadCheck::Done => {
                    let mut times = settings.reload_times.lock().unwrap_or_else(|e| e.into_inner());
                    times.insert(host.name.clone(), asked.elapsed());
                    return Ok(Ok((after, marked)));
                }
                ReloadCheck::Raced => return Ok(Err(Again::Raced(after))),
                ReloadCheck::Failed => {
                    return Err(fail(
                        ApplyStage::Reload,
                        "HAProxy's master refused the new config on reload (show proc counts a \
                         failed reload)",
                    ));
                }
                ReloadCheck::Pending => {}
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(fail(
                ApplyStage::Verify,
                format!("no new HAProxy worker within {} ms of the reload", timeout.as_millis()),
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 5 / 4).min(Duration::from_millis(100));
        seen = conn.show_proc().await.ok();
        marked = false;
    }
}

/// Puts last-known-good back and reloads onto it. True if HAProxy runs it again.
async fn restore(conn: &dyn HostOps, host: &Host, settings: &RolloutSettings) -> bool {
    if conn.restore().await.is_err() {
        return false;
    }
    let ask = ReloadAsk { swap: None, mark: None, stat: None, version: None };
    let restored = match reload(conn, host, settings, ask).await {
        Ok((after, _)) => mark_loaded(conn, ("", None), Some(after.reloads), None).await.is_ok(),
        Err(_) => false,
    };
    info!(restored, "last-known-good restored");
    restored
}

/// Whether a failure at `stage` may go away by itself (a dropped connection, a slow host), so
/// that trying the same version again makes sense. A config HAProxy refused is refused again.
/// (A host key refusal is retried too: the operator may pin the right key.)
pub fn retryable(stage: ApplyStage) -> bool {
    !matches!(stage, ApplyStage::Validate | ApplyStage::Reload | ApplyStage::Probe)
}

/// What one host did with the version.
#[derive(Debug, Clone)]
pub struct HostResult {
    /// Index into the rollout's hosts.
    pub host: usize,
    pub outcome: ApplyOutcome,
    pub took: Duration,
    /// When the host was done (milliseconds since the Unix epoch), for its report: hosts
    /// finish at different times, and their reports go out after the whole rollout.
    pub finished_unix_ms: u64,
    pub effort: Effort,
}

/// What a rollout did.
#[derive(Debug, Default)]
pub struct RolloutResult {
    /// Every host attempted.
    pub outcomes: Vec<HostResult>,
    /// Hosts not attempted because the rollout halted.
    pub not_attempted: Vec<usize>,
}

impl RolloutResult {
    /// Hosts worth another try with the same version: those that failed in a way that may pass,
    /// and, unless HAProxy itself refused the config somewhere, those never reached.
    pub fn to_retry(&self) -> Vec<usize> {
        let mut retry: Vec<usize> = self
            .outcomes
            .iter()
            .filter(|r| matches!(r.outcome, ApplyOutcome::Failed { stage, .. } if retryable(stage)))
            .map(|r| r.host)
            .collect();
        let refused = self
            .outcomes
            .iter()
            .any(|r| matches!(r.outcome, ApplyOutcome::Failed { stage, .. } if !retryable(stage)));
        if !refused {
            retry.extend(&self.not_attempted);
        }
        retry.sort_unstable();
        retry
    }
}

/// Puts host `i` live, from what was prepared for it if anything was. Its time (the report's
/// duration) counts from the moment the rollout turns to it: preparing it ahead, while the
/// canary went live, changed nothing it serves, and is not counted.
async fn attempt_host<'a>(
    hosts: &'a [Host],
    i: usize,
    prepared: Option<Prepared<'a>>,
    version: &ConfigVersion,
    known: &[&ConfigVersion],
    settings: &RolloutSettings,
) -> HostResult {
    let (prepared, started, ahead) = match prepared {
        // A reload checks, in its own round trip, that the host is as it was prepared.
        Some(p) if p.reloads() => (p, std::time::Instant::now(), true),
        Some(p) => {
            let started = std::time::Instant::now();
            (refresh(p, version, known, settings).await, started, false)
        }
        None => {
            let p = prepare(&hosts[i], version, known, settings).await;
            let started = p.started;
            (p, started, false)
        }
    };
    let (mut result, mut effort) = finish(prepared, version, settings).await;
    if ahead && matches!(&result, Err(f) if f.exit == Some(Exit::Stale)) {
        warn!(host = %hosts[i].name, "the host changed while the canary went live; preparing it again");
        let p = prepare(&hosts[i], version, known, settings).await;
        (result, effort) = finish(p, version, settings).await;
    }
    let outcome = result.unwrap_or_else(failed);
    let finished_unix_ms = hafleet_runtime::now_unix_ms();
    HostResult { host: i, outcome, took: started.elapsed(), finished_unix_ms, effort }
}

/// Rolls `version` out over `hosts`. The canary is the first host in inventory order that can
/// be reached: unreachable hosts before it are skipped (and retried later), so one host that is
/// down never freezes its fleet. A canary that fails halts the rollout. After it, the other
/// hosts go in waves of `parallelism`; any failure other than an unreachable host halts. While
/// the canary goes live, the first wave is prepared (uploaded and validated, nothing live
/// changed); if the rollout halts, what was prepared is removed.
pub async fn roll_out(
    hosts: &[Host],
    version: &ConfigVersion,
    known: &[&ConfigVersion],
    settings: &RolloutSettings,
) -> RolloutResult {
    let halted = |result: &mut RolloutResult, rest: &[usize]| {
        warn!(fleet = %version.fleet, version = version.version, "rollout halted");
        result.not_attempted = rest.to_vec();
    };
    let order: Vec<usize> = (0..hosts.len()).collect();
    let mut result = RolloutResult::default();
    // Hosts of the first wave, prepared (uploaded and validated, nothing live changed) while
    // the canary goes live, so the wave only has to swap and apply.
    let mut ready: std::collections::HashMap<usize, Prepared<'_>> = Default::default();
    let mut next = 0;
    while next < order.len() {
        let canary = order[next];
        let canary_prepared = ready.remove(&canary);
        let ahead: Vec<usize> = order[next + 1..]
            .iter()
            .copied()
            .filter(|i| !ready.contains_key(i))
            .take(settings.parallelism.max(1).saturating_sub(ready.len()))
            .collect();
        let prepare_ahead = ahead.iter().map(|&i| prepare(&hosts[i], version, known, settings));
        let (tried, prepared) = tokio::join!(
            attempt_host(hosts, canary, canary_prepared, version, known, settings),
            futures::future::join_all(prepare_ahead)
        );
        ready.extend(ahead.into_iter().zip(prepared));
        next += 1;
        let verdict = plan::canary_verdict(&tried.outcome);
        result.outcomes.push(tried);
        match verdict {
            plan::CanaryVerdict::Unreachable => continue,
            plan::CanaryVerdict::Passed => break,
            plan::CanaryVerdict::Failed => {
                for (_, p) in ready.drain() {
                    abandon(p).await;
                }
                halted(&mut result, &order[next..]);
                return result;
            }
        }
    }
    let rest = &order[next..];
    for (n, wave) in rest.chunks(settings.parallelism.max(1)).enumerate() {
        let attempts = wave
            .iter()
            .map(|&i| attempt_host(hosts, i, ready.remove(&i), version, known, settings));
        let outcomes = futures::future::join_all(attempts).await;
        let halt = outcomes.iter().any(|r| {
            matches!(r.outcome, ApplyOutcome::Failed { stage, .. }
                if !matches!(stage, ApplyStage::Connect | ApplyStage::HostKey))
        });
        result.outcomes.extend(outcomes);
        if halt {
            halted(&mut result, plan::not_yet_attempted(rest, settings.parallelism, n));
            break;
        }
    }
    // Prepared for a wave that never came (a halt): nothing of theirs may stay behind.
    for (_, p) in ready.drain() {
        abandon(p).await;
    }
    result
}

#[cfg(test)]
mod against_fake;

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(stage: ApplyStage) -> ApplyOutcome {
        ApplyOutcome::Failed { stage, message: String::new(), restored: false }
    }

    fn host(host: usize, outcome: ApplyOutcome) -> HostResult {
        HostResult {
            host,
            outcome,
            took: Duration::ZERO,
            finished_unix_ms: 0,
            effort: Effort::default(),
        }
    }

    #[test]
    fn transient_failures_and_unreached_hosts_are_retried_refusals_are_not() {
        let unreachable_canary = RolloutResult {
            outcomes: vec![host(0, failed(ApplyStage::Connect))],
            not_attempted: vec![1, 2],
        };
        assert_eq!(unreachable_canary.to_retry(), [0, 1, 2]);
        let refused = RolloutResult {
            outcomes: vec![host(0, failed(ApplyStage::Validate))],
            not_attempted: vec![1, 2],
        };
        assert!(refused.to_retry().is_empty(), "the same config would be refused again");
        let mixed = RolloutResult {
            outcomes: vec![
                host(0, ApplyOutcome::Applied),
                host(1, failed(ApplyStage::Upload)),
                host(2, failed(ApplyStage::Reload)),
            ],
            not_attempted: vec![3],
        };
        assert_eq!(mixed.to_retry(), [1]);
    }

    fn version(n: u64, config: &str) -> ConfigVersion {
        let bundle = hafleet_proto::Bundle { config: config.into(), maps: vec![], certs: vec![] };
        ConfigVersion::inline(hafleet_proto::FleetName::new("edge").unwrap(), n, bundle)
    }

    #[tokio::test]
    async fn each_pair_of_versions_is_planned_once_and_the_newest_pairs_are_kept() {
        let config = |backends: &[&str]| {
            let mut c = "global\n    default-path config\n".to_owned();
            for b in backends {
                c.push_str(&format!("backend {b}\n    server n1 10.0.0.1:30080\n"));
            }
            c
        };
        let (a, b) = (version(1, &config(&["be_a"])), version(2, &config(&["be_a", "be_b"])));
        let plans = Plans::default();
        let (first, bridge) = plans.get(&a, &b).unwrap();
        assert!(matches!(&*first, runtime::Plan::Reload(w) if w.contains("1 backend(s) added")));
        // No spares here: the reload has no bridge.
        assert!(bridge.expect("looked for, for a reload").await.is_none());
        // The second host of the rollout gets the same plan, not one worked out again.
        assert!(std::sync::Arc::ptr_eq(&first, &plans.get(&a, &b).unwrap().0));
        // The other way round is another plan.
        let back = plans.get(&b, &a).unwrap().0;
        assert!(matches!(&*back, runtime::Plan::Reload(w) if w.contains("1 removed")));
        let (same, bridge) = plans.get(&a, &a).unwrap();
        assert_eq!((&*same, bridge.is_none()), (&runtime::Plan::Nothing, true));
        // Older pairs make way for newer ones.
        for n in 3..3 + Plans::KEEP as u64 {
            plans.get(&a, &version(n, &config(&["be_a", &format!("be_{n}")])));
        }
        assert_eq!(plans.0.lock().unwrap().len(), Plans::KEEP);
        assert!(!std::sync::Arc::ptr_eq(&first, &plans.get(&a, &b).unwrap().0));
        // With a spare, a new backend of tracking servers has a bridge, found once for all
        // hosts.
        let tracking = "    server n1 10.0.0.1:30081 no-check track hafleet_nodes/n1\n";
        let spared = version(20, &format!("{}backend hafleet_spare_0\n", config(&["be_a"])));
        let spared_b = version(
            21,
            &format!("{}backend be_b\n{tracking}backend hafleet_spare_0\n", config(&["be_a"])),
        );
        let (plan, pending) = plans.get(&spared, &spared_b).unwrap();
        assert!(matches!(&*plan, runtime::Plan::Reload(_)), "{plan:?}");
        let bridge = pending.expect("looked for").await.expect("a spare is free");
        assert_eq!(bridge.spares, [("be_b".to_owned(), "hafleet_spare_0".to_owned())]);
        let again = plans.get(&spared, &spared_b).unwrap().1.expect("kept").await.unwrap();
        assert!(std::sync::Arc::ptr_eq(&bridge, &again));
        // Without the bundle of either, there is no plan to make.
        let not_fetched = ConfigVersion { body: hafleet_proto::Body::Stream { chunks: 1 }, ..b };
        assert!(plans.get(&a, &not_fetched).is_none());
    }
}
