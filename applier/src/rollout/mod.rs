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
//!               the version its live file is (crate::core::patch), each checked by its sha256;
//!               whole otherwise, or again whole when an edit does not come out right.
//!               A version that differs from the running config only in its map files and
//!               crt-list: haproxy -c runs on a config that loads those maps alone, as the
//!               config uses them, and the new certificate files alone)
//!            ── up to here: `prepare`, done for the first wave while the canary goes live;
//!               from here: `finish` (a host prepared ahead first checks that its files are
//!               as they were, else it is prepared again, and reads show proc anew: in the
//!               reload's own round trip when the change needs one)
//!            copy live ─▶ <config>.hafleet-last-good; rename new ─▶ live   (atomic)
//!            the change fits the runtime API (see crate::core::runtime_api) and HAProxy takes every
//!            command? ──yes──▶ no reload
//!              (without a certificate in it, the swap, `show map`, `prepare map` and the
//!               commands go in one round trip, which first checks that the host's files and
//!               worker are those it was prepared on, as a reload's does: a host prepared
//!               ahead is not read again)
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
//!
//! Every step asks the host through [`crate::host::HostOps`] (SSH, or the in-memory fake in
//! `against_fake`). Here: the settings, the canary and the waves ([`roll_out`]). Beside it:
//! `plans` (plans between versions, once per pair), `prepare` (up to a host staged),
//! `go_live` (swap, runtime API, bridge, probes, mark), `reload` (a reload watched until it is
//! ours; restore), `repair` (drift, files put back).

use crate::core::inventory::Host;
use crate::core::plan::{self, HostPlan, ReloadCheck};
use crate::core::runtime_api as runtime;
use crate::host::answer::{self, Exit, LiveShas, LiveState};
use crate::host::ops::{self, Failure, HostOps, Hosts, Mark, ReloadRequest, fail};
use hafleet_proto::{ApplyOutcome, ApplyStage, Bundle, ConfigVersion};
use std::time::Duration;
use tracing::{info, warn};

mod go_live;
mod plans;
mod prepare;
mod reload;
mod repair;

use go_live::*;
pub use plans::{PendingBridge, Plans};
pub(crate) use prepare::stream_record;
use prepare::*;
#[cfg(test)]
pub(crate) use prepare::{Outgoing, cert_stream};
pub use prepare::{Prepared, Then, abandon, prepare};
use reload::*;
use repair::*;
pub use repair::{drift_of, put_back_files};

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
    pub tls_identity: Option<std::sync::Arc<crate::core::identity::FleetIdentity>>,
    /// How long each host's last reload took to show its new worker, by host name (see
    /// [`first_look`]).
    pub reload_times:
        std::sync::Mutex<std::collections::HashMap<hafleet_proto::HostName, Duration>>,
    /// The sha256 of each certificate file (chain and opened key) a host should hold, by its
    /// path: what a drift check compares the hosts' files with. Opening a key takes an age
    /// decryption, so each is worked out once; many at once (10,000 after a start) off the
    /// applier's loop ([`repair::CertShas`]).
    pub cert_shas: repair::CertShas,
    /// The files the newest version's drift checks expect, by the version's sha256.
    pub drift_files: std::sync::Mutex<Option<(String, ExpectedFiles)>>,
    /// The plans worked out for the versions' hosts (see [`Plans`]).
    pub plans: Plans,
    /// By host, the sha256 of the version its last apply left live and loaded, with every
    /// file of it there: the next version is prepared on that assumption, without reading
    /// the host first (see [`prepare`]). Taken when a host is prepared, put back when its
    /// apply is done.
    pub applied: std::sync::Mutex<std::collections::HashMap<hafleet_proto::HostName, String>>,
}

impl RolloutSettings {
    /// Records that `host` runs `sha`, live and loaded, every file of it there.
    pub(crate) fn record_applied(&self, host: &Host, sha: &str) {
        let mut applied = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        applied.insert(host.name.clone(), sha.to_owned());
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
    let prepared = prepare(host, version, known, settings, Then::GoLive).await;
    let (result, effort) = finish(prepared, version, settings).await;
    (result.unwrap_or_else(failed), effort)
}

fn failed(f: Failure) -> ApplyOutcome {
    f.outcome()
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
/// With `mark_later`, a host that went live through the runtime API comes back unmarked (see
/// [`finish_live`]): its report is done once [`marked`] says so.
async fn attempt_host<'a>(
    hosts: &'a [Host],
    i: usize,
    prepared: Option<Prepared<'a>>,
    version: &ConfigVersion,
    (known, settings): (&[&ConfigVersion], &RolloutSettings),
    mark_later: bool,
) -> (HostResult, Option<Unmarked>) {
    let (prepared, started) = match prepared {
        // A reload, or runtime commands, check in their own round trip that the host is as
        // it was prepared.
        Some(p) if p.checks_when_live() => (p, std::time::Instant::now()),
        Some(p) => {
            let started = std::time::Instant::now();
            (refresh(p, version, known, settings).await, started)
        }
        None => {
            let p = prepare(&hosts[i], version, known, settings, Then::GoLive).await;
            let started = p.started;
            (p, started)
        }
    };
    let (mut result, mut effort, mut unmarked) =
        finish_live(prepared, version, settings, mark_later).await;
    if matches!(&result, Err(f) if f.exit == Some(Exit::Stale)) {
        warn!(host = %hosts[i].name, "the host changed since it was prepared; preparing it again");
        let p = prepare(&hosts[i], version, known, settings, Then::GoLive).await;
        (result, effort, unmarked) = finish_live(p, version, settings, mark_later).await;
    }
    let outcome = result.unwrap_or_else(failed);
    let finished_unix_ms = hafleet_runtime::now_unix_ms();
    let took = started.elapsed();
    (HostResult { host: i, outcome, took, finished_unix_ms, effort }, unmarked)
}

/// Marks a host that [`attempt_host`] left unmarked, at once, and completes its result: done
/// when the mark is, or failed (at `Verify`) if the mark failed.
async fn marked(
    result: &mut HostResult,
    unmarked: Unmarked,
    (host, settings): (&Host, &RolloutSettings),
) {
    let started = std::time::Instant::now();
    if let Err(failure) = unmarked.mark(host, settings).await {
        warn!(message = %failure.message, "the canary went live but cannot be marked loaded");
        result.outcome = failure.outcome();
    }
    result.took += started.elapsed();
    result.finished_unix_ms = hafleet_runtime::now_unix_ms();
}

/// Rolls `version` out over `hosts`. The canary is the first host in inventory order that may
/// be one (`canary`) and can be reached: unreachable hosts before it are skipped (and retried
/// later), so one host that is down never freezes its fleet; when none of those can be
/// reached, the version goes nowhere (the others are not attempted). A canary that fails halts the rollout. After it, the other
/// hosts go in waves of `parallelism`; any failure other than an unreachable host halts. While
/// the canary goes live, the first wave is prepared (uploaded and validated, nothing live
/// changed); if the rollout halts, what was prepared is removed. A canary that took the
/// change through the runtime API is marked loaded (its loaded marker and last-known-good
/// written) while the first wave goes live: its verdict is in before that, and a mark that
/// fails fails its report and halts the waves after the first.
/// `hosts` for a version that already went live on the fleet's canary (a retry of hosts it
/// did not reach, hosts put in the inventory since): any of them may go first, so a subset of
/// hosts kept from the canary's role (`canary = false`) is not left waiting for a canary it
/// has none of.
pub fn followers(hosts: impl IntoIterator<Item = Host>) -> Vec<Host> {
    hosts.into_iter().map(|h| Host { canary: true, ..h }).collect()
}

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
    // The hosts that may be the canary first, each group in inventory order.
    let (mut order, others): (Vec<usize>, Vec<usize>) =
        (0..hosts.len()).partition(|&i| hosts[i].canary);
    let candidates = order.len();
    order.extend(others);
    let mut result = RolloutResult::default();
    // Hosts of the first wave, prepared (uploaded and validated, nothing live changed) while
    // the canary goes live, so the wave only has to swap and apply.
    let mut ready: std::collections::HashMap<usize, Prepared<'_>> = Default::default();
    // The canary, live and not yet marked loaded (marked while the first wave goes live).
    let mut canary_unmarked: Option<Unmarked> = None;
    let mut next = 0;
    while next < order.len() {
        if next == candidates {
            // No host that may be the canary could be reached: none of the others goes first.
            for (_, p) in ready.drain() {
                abandon(p).await;
            }
            halted(&mut result, &order[next..]);
            return result;
        }
        let canary = order[next];
        let canary_prepared = ready.remove(&canary);
        let ahead: Vec<usize> = order[next + 1..]
            .iter()
            .copied()
            .filter(|i| !ready.contains_key(i))
            .take(settings.parallelism.max(1).saturating_sub(ready.len()))
            .collect();
        let prepare_ahead =
            ahead.iter().map(|&i| prepare(&hosts[i], version, known, settings, Then::Wait));
        // With hosts to follow, the canary's mark goes with the first wave (see finish_live).
        let mark_later = next + 1 < order.len();
        let ((tried, unmarked), prepared) = tokio::join!(
            attempt_host(hosts, canary, canary_prepared, version, (known, settings), mark_later),
            futures::future::join_all(prepare_ahead)
        );
        ready.extend(ahead.into_iter().zip(prepared));
        next += 1;
        let verdict = plan::canary_verdict(&tried.outcome);
        result.outcomes.push(tried);
        canary_unmarked = unmarked;
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
    // The canary is the last host tried so far: it passed (or there is no rest).
    let canary_at = result.outcomes.len().saturating_sub(1);
    for (n, wave) in rest.chunks(settings.parallelism.max(1)).enumerate() {
        let attempts = wave
            .iter()
            .map(|&i| attempt_host(hosts, i, ready.remove(&i), version, (known, settings), false));
        let canary = result.outcomes.get_mut(canary_at);
        let mark = async {
            if let (Some(canary), Some(unmarked)) = (canary, canary_unmarked.take()) {
                let host = &hosts[canary.host];
                marked(canary, unmarked, (host, settings)).await;
            }
        };
        let (outcomes, ()) = tokio::join!(futures::future::join_all(attempts), mark);
        let canary_failed = result
            .outcomes
            .get(canary_at)
            .is_some_and(|c| matches!(c.outcome, ApplyOutcome::Failed { .. }));
        let outcomes: Vec<HostResult> = outcomes.into_iter().map(|(r, _)| r).collect();
        let halt = canary_failed
            || outcomes.iter().any(|r| {
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
    if let (Some(canary), Some(unmarked)) =
        (result.outcomes.get_mut(canary_at), canary_unmarked.take())
    {
        let host = &hosts[canary.host];
        marked(canary, unmarked, (host, settings)).await;
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

    #[test]
    fn the_files_new_to_a_version_are_those_its_names_list_and_the_other_s_do_not() {
        let cert = |der: &[u8]| hafleet_proto::SealedCert {
            fingerprint: hafleet_proto::sha256_hex(der),
            names: vec![],
            not_after_unix: 0,
            chain_pem: hafleet_proto::tls::certificates_pem([der]).into(),
            sealed_key: String::from_utf8_lossy(der).into_owned().into(),
            recipient: String::new(),
        };
        let map = |kind: &str, content: &str| hafleet_proto::MapFile {
            name: hafleet_proto::MapName::for_content(kind, content).unwrap(),
            content: content.into(),
        };
        let (a, b, c) = (cert(b"a"), cert(b"b"), cert(b"c"));
        let was = hafleet_proto::Bundle::new(
            "global\n".into(),
            vec![map("exact", "a.com be_a\n"), map("prefix", "a.com/ be_a\n")],
            vec![a.clone(), b.clone()],
        );
        let now = hafleet_proto::Bundle::new(
            "global\n".into(),
            vec![map("exact", "a.com be_b\n"), map("prefix", "a.com/ be_a\n")],
            vec![b, c.clone()],
        );
        let had: std::collections::HashSet<String> = file_names(&was).collect();
        let by_names: Vec<String> = file_names(&now).filter(|n| !had.contains(n)).collect();
        let new = new_files(&was, &now);
        assert_eq!(new, by_names);
        assert_eq!(new, [now.maps[0].name.to_string(), format!("../{}", c.relative_path())]);
        assert!(new_files(&now, &now).is_empty());
    }

    fn version(n: u64, config: &str) -> ConfigVersion {
        let bundle = hafleet_proto::Bundle::new(config.into(), vec![], vec![]);
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
