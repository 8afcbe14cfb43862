//! The rollout against in-memory hosts ([`crate::host::fake`]), in paused time: canary first,
//! waves, halts, what is retried, hosts prepared ahead, and bridging through spares.

use super::*;
use crate::host::fake::{FakeHost, FakeHosts, Op};
use hafleet_proto::{Bundle, FleetName, HostName};

fn version(n: u64, config: &str) -> ConfigVersion {
    let bundle = Bundle::new(config.into(), vec![], vec![]);
    ConfigVersion::inline(FleetName::new("edge").unwrap(), n, bundle)
}

/// A config with an access log that names the version, these backends (each one server) and
/// these empty spares.
fn config(backends: &[&str], spares: usize) -> String {
    let mut c = "global\n    default-path config\ndefaults\n    \
                 log-format \"v%[var(proc.hafleet_version)]\"\n"
        .to_owned();
    for b in backends {
        c.push_str(&format!(
            "backend {b}\n    server n1 10.0.0.1:30081 no-check track hafleet_nodes/n1\n"
        ));
    }
    for s in 0..spares {
        c.push_str(&format!("backend hafleet_spare_{s}\n"));
    }
    c
}

fn host(n: usize) -> Host {
    Host {
        name: HostName::new(format!("h{n}")).unwrap(),
        address: "192.0.2.1".into(),
        port: 22,
        user: "hafleet".into(),
        config_path: "/etc/haproxy/haproxy.cfg".into(),
        master_socket: "/run/haproxy-master.sock".into(),
        haproxy_bin: "/usr/sbin/haproxy".into(),
        probe_address: None,
        probes: vec![],
        canary: true,
    }
}

/// `n` hosts running the config `running` (`None`: new hosts), each as `each` makes it.
fn fleet(
    n: usize,
    running: Option<&ConfigVersion>,
    each: impl Fn(usize, FakeHost) -> FakeHost,
) -> (Vec<Host>, FakeHosts) {
    let sha = running.map(|v| v.sha256.as_str());
    let fake = FakeHosts::new((0..n).map(|i| (format!("h{i}"), each(i, FakeHost::running(sha)))));
    ((0..n).map(host).collect(), fake)
}

fn settings(fake: &FakeHosts, hosts: usize, parallelism: usize) -> RolloutSettings {
    RolloutSettings {
        hosts: Box::new(fake.clone()),
        parallelism,
        reload_timeout: Duration::from_secs(2),
        probe_timeout: Duration::from_secs(1),
        fleet_hosts: hosts,
        tls_identity: None,
        reload_times: Default::default(),
        cert_shas: Default::default(),
        drift_files: Default::default(),
        plans: Default::default(),
        applied: Default::default(),
    }
}

/// Settings for one in-memory host, for other modules' tests.
pub(super) fn settings_for_tests() -> RolloutSettings {
    let (_, fake) = fleet(1, None, |_, h| h);
    settings(&fake, 1, 1)
}

/// Where in the log `host` first did `op`.
fn at(log: &[(String, Op)], host: usize, op: Op) -> usize {
    let name = format!("h{host}");
    log.iter().position(|(h, o)| *h == name && *o == op).unwrap_or_else(|| {
        panic!("h{host} never did {op:?}: {log:?}");
    })
}

fn count(log: &[(String, Op)], host: usize, op: Op) -> usize {
    let name = format!("h{host}");
    log.iter().filter(|(h, o)| *h == name && *o == op).count()
}

fn outcomes(result: &RolloutResult) -> Vec<(usize, ApplyOutcome)> {
    result.outcomes.iter().map(|r| (r.host, r.outcome.clone())).collect()
}

fn stage_of(outcome: &ApplyOutcome) -> Option<ApplyStage> {
    match outcome {
        ApplyOutcome::Failed { stage, .. } => Some(*stage),
        _ => None,
    }
}

/// A fleet without an access log is not told its version: two master-socket round trips
/// saved on every apply.
#[tokio::test(start_paused = true)]
async fn a_config_that_logs_no_version_is_not_told_one() {
    let unlogged = |c: String| c.replace("log-format \"v%[var(proc.hafleet_version)]\"", "");
    let v1 = version(1, &unlogged(config(&["be_a"], 0)));
    let v2 = version(2, &unlogged(config(&["be_a", "be_b"], 0)));
    let (hosts, fake) = fleet(2, Some(&v1), |_, h| h);
    let result = roll_out(&hosts, &v2, &[], &settings(&fake, 2, 1)).await;
    assert_eq!(outcomes(&result), [(0, ApplyOutcome::Applied), (1, ApplyOutcome::Applied)]);
    for i in 0..2 {
        assert_eq!(fake.host(&format!("h{i}")).told_version, None);
    }
}

#[tokio::test(start_paused = true)]
async fn the_canary_goes_first_while_the_first_wave_is_prepared_then_waves_follow() {
    let (v1, v2) = (version(1, &config(&["be_a"], 0)), version(2, &config(&["be_a", "be_b"], 0)));
    let (hosts, fake) = fleet(5, Some(&v1), |_, h| h);
    let settings = settings(&fake, 5, 2);
    let result = roll_out(&hosts, &v2, &[], &settings).await;

    let applied: Vec<_> = (0..5).map(|i| (i, ApplyOutcome::Applied)).collect();
    assert_eq!(outcomes(&result), applied);
    assert!(result.not_attempted.is_empty() && result.to_retry().is_empty());
    for i in 0..5 {
        let h = fake.host(&format!("h{i}"));
        assert_eq!((h.live.as_ref(), h.loaded.as_ref()), (Some(&v2.sha256), Some(&v2.sha256)));
        assert_eq!(h.told_version, Some(2), "the new worker is told its version");
        assert_eq!(h.last_good.as_ref(), Some(&v2.sha256));
        assert_eq!(h.proc.reloads, 1, "one reload each");
    }
    let log = fake.log();
    // The canary reloads first; the first wave was uploaded and checked meanwhile, each host
    // once, and goes live after it.
    for i in 1..=2 {
        assert!(at(&log, i, Op::Upload) < at(&log, 0, Op::Reload), "h{i} prepared ahead");
        assert!(at(&log, i, Op::Reload) > at(&log, 0, Op::Reload));
        assert_eq!((count(&log, i, Op::Open), count(&log, i, Op::Upload)), (1, 1));
    }
    // The second wave starts once the first is done.
    for i in 3..=4 {
        for done in 1..=2 {
            assert!(at(&log, i, Op::Open) > at(&log, done, Op::Reload), "{log:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_canary_refused_halts_the_rollout_and_removes_what_was_prepared_ahead() {
    let (v1, v2) = (version(1, &config(&["be_a"], 0)), version(2, "global\n    bogus\n"));
    let (hosts, fake) = fleet(4, Some(&v1), |_, mut h| {
        h.refuses.insert(v2.sha256.clone());
        h
    });
    let settings = settings(&fake, 4, 2);
    let result = roll_out(&hosts, &v2, &[], &settings).await;

    assert_eq!(result.outcomes.len(), 1);
    assert_eq!(stage_of(&result.outcomes[0].outcome), Some(ApplyStage::Validate));
    assert_eq!(result.not_attempted, [1, 2, 3]);
    assert!(result.to_retry().is_empty(), "the same config would be refused again");
    let log = fake.log();
    for i in 1..=2 {
        assert_eq!(count(&log, i, Op::Upload), 1, "h{i} was prepared ahead");
        assert_eq!(count(&log, i, Op::Discard), 1, "and its upload removed");
    }
    assert_eq!(count(&log, 3, Op::Open), 0, "beyond the first wave, nothing was touched");
    for i in 0..4 {
        let h = fake.host(&format!("h{i}"));
        assert_eq!((h.live.as_ref(), h.loaded.as_ref()), (Some(&v1.sha256), Some(&v1.sha256)));
        assert!(h.uploads.is_empty(), "h{i} keeps no upload");
        assert_eq!(count(&log, i, Op::Swap) + count(&log, i, Op::Reload), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_canary_whose_reload_fails_is_restored_and_halts() {
    let (v1, v2) = (version(1, &config(&["be_a"], 0)), version(2, &config(&["be_b"], 0)));
    let (hosts, fake) = fleet(3, Some(&v1), |i, mut h| {
        if i == 0 {
            // haproxy -c passes, but the master's new worker does not start.
            h.failures.insert(Op::Reload, (ops::fail(ApplyStage::Reload, "refused"), 1));
        }
        h
    });
    let settings = settings(&fake, 3, 1);
    let result = roll_out(&hosts, &v2, &[], &settings).await;

    let ApplyOutcome::Failed { stage, restored, .. } = &result.outcomes[0].outcome else {
        panic!("{result:?}");
    };
    assert_eq!((*stage, *restored), (ApplyStage::Reload, true));
    assert_eq!(result.not_attempted, [1, 2]);
    assert!(result.to_retry().is_empty());
    let h0 = fake.host("h0");
    assert_eq!((h0.live.as_ref(), h0.loaded.as_ref()), (Some(&v1.sha256), Some(&v1.sha256)));
    assert_eq!(count(&fake.log(), 0, Op::Restore), 1);
    assert_eq!(result.outcomes[0].effort.reloads, 2, "the reload and the restore's");
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_canary_is_passed_over_and_retried_later() {
    let (v1, v2) = (version(1, &config(&["be_a"], 0)), version(2, &config(&["be_b"], 0)));
    let (hosts, fake) = fleet(3, Some(&v1), |i, mut h| {
        if i == 0 {
            let down = ops::fail(ApplyStage::Connect, "connection refused");
            h.failures.insert(Op::Open, (down, 1));
        }
        h
    });
    let settings = settings(&fake, 3, 2);
    let result = roll_out(&hosts, &v2, &[], &settings).await;

    let outcomes = outcomes(&result);
    assert_eq!(stage_of(&outcomes[0].1), Some(ApplyStage::Connect));
    assert_eq!(&outcomes[1..], [(1, ApplyOutcome::Applied), (2, ApplyOutcome::Applied)]);
    assert_eq!(result.to_retry(), [0]);
    // The retry (the run loop's, a while later) reaches it.
    let again = roll_out(&hosts[..1], &v2, &[], &settings).await;
    assert_eq!(outcomes_of(&again), [ApplyOutcome::Applied]);
    assert_eq!(fake.host("h0").loaded.as_ref(), Some(&v2.sha256));
}

/// A host that may not be the canary (`canary = false`) is never the first to get a version,
/// even ahead of the others in the inventory; when no host that may be the canary can be
/// reached, the version goes nowhere.
#[tokio::test(start_paused = true)]
async fn a_host_that_may_not_be_the_canary_never_goes_first() {
    let (v1, v2) = (version(1, &config(&["be_a"], 0)), version(2, &config(&["be_b"], 0)));
    let (mut hosts, fake) = fleet(3, Some(&v1), |_, h| h);
    hosts[0].canary = false;
    let result = roll_out(&hosts, &v2, &[], &settings(&fake, 3, 1)).await;
    assert_eq!(result.outcomes[0].host, 1, "h1 is the canary");
    assert!(outcomes_of(&result).iter().all(|o| *o == ApplyOutcome::Applied));
    let log = fake.log();
    assert!(at(&log, 1, Op::Reload) < at(&log, 0, Op::Open), "h0 went after the canary");

    // The only host that may be the canary is down: nothing goes anywhere.
    let (v3, down) = (version(3, &config(&["be_c"], 0)), ops::fail(ApplyStage::Connect, "down"));
    let (mut hosts, fake) = fleet(2, Some(&v2), |i, mut h| {
        if i == 0 {
            h.failures.insert(Op::Open, (down.clone(), 1));
        }
        h
    });
    hosts[1].canary = false;
    let result = roll_out(&hosts, &v3, &[], &settings(&fake, 2, 1)).await;
    assert_eq!(stage_of(&outcomes(&result)[0].1), Some(ApplyStage::Connect));
    assert_eq!(result.not_attempted, [1]);
    assert_eq!(fake.host("h1").loaded.as_ref(), Some(&v2.sha256));
}

/// A version that went live on the canary goes to hosts retried or put in the inventory later,
/// even when none of them may be the canary.
#[tokio::test(start_paused = true)]
async fn hosts_that_may_not_be_the_canary_still_take_a_version_that_passed_one() {
    let (v1, v2) = (version(1, &config(&["be_a"], 0)), version(2, &config(&["be_b"], 0)));
    let (mut hosts, fake) = fleet(2, Some(&v1), |_, h| h);
    hosts.iter_mut().for_each(|h| h.canary = false);
    let halted = roll_out(&hosts, &v2, &[], &settings(&fake, 2, 1)).await;
    assert_eq!(halted.not_attempted, [0, 1], "no canary: nothing goes");
    let result = roll_out(&followers(hosts), &v2, &[], &settings(&fake, 2, 1)).await;
    assert!(outcomes_of(&result).iter().all(|o| *o == ApplyOutcome::Applied), "{result:?}");
    assert_eq!(fake.host("h1").loaded.as_ref(), Some(&v2.sha256));
}

fn outcomes_of(result: &RolloutResult) -> Vec<ApplyOutcome> {
    result.outcomes.iter().map(|r| r.outcome.clone()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_failed_wave_halts_what_may_pass_is_retried_what_was_refused_is_not() {
    let (v1, v2) = (version(1, &config(&["be_a"], 0)), version(2, &config(&["be_b"], 0)));
    // A dropped upload on h1: retryable.
    let dropped = ops::fail(ApplyStage::Upload, "ssh: connection reset");
    let (hosts, fake) = fleet(5, Some(&v1), |i, h| match i {
        1 => h.failing(Op::Upload, dropped.clone(), 1),
        _ => h,
    });
    let settings = settings(&fake, 5, 2);
    let result = roll_out(&hosts, &v2, &[], &settings).await;
    let got: Vec<_> = outcomes(&result).iter().map(|(i, o)| (*i, stage_of(o))).collect();
    assert_eq!(got, [(0, None), (1, Some(ApplyStage::Upload)), (2, None)]);
    assert_eq!(result.not_attempted, [3, 4], "the wave after the failure never starts");
    assert_eq!(result.to_retry(), [1, 3, 4]);
    let retry: Vec<Host> = result.to_retry().iter().map(|&i| hosts[i].clone()).collect();
    let again = roll_out(&retry, &v2, &[], &settings).await;
    assert_eq!(outcomes_of(&again), vec![ApplyOutcome::Applied; 3]);

    // A host that refuses the config in a wave: nothing is retried with it.
    let (hosts, fake) = fleet(5, Some(&v1), |i, mut h| {
        if i == 2 {
            h.refuses.insert(v2.sha256.clone());
        }
        h
    });
    let result = roll_out(&hosts, &v2, &[], &self::settings(&fake, 5, 2)).await;
    assert_eq!(stage_of(&result.outcomes[2].outcome), Some(ApplyStage::Validate));
    assert_eq!(result.not_attempted, [3, 4]);
    assert!(result.to_retry().is_empty());
    // The host that refused it still runs what it ran.
    assert_eq!(fake.host("h2").live.as_ref(), Some(&v1.sha256));
}

#[tokio::test(start_paused = true)]
async fn a_host_that_changed_while_prepared_ahead_is_prepared_again() {
    let (v1, v2) = (version(1, &config(&["be_a"], 0)), version(2, &config(&["be_b"], 0)));
    let stale = Failure { exit: Some(Exit::Stale), ..ops::fail(ApplyStage::Swap, "changed") };
    let (hosts, fake) = fleet(2, Some(&v1), |i, h| match i {
        1 => h.failing(Op::Reload, stale.clone(), 1),
        _ => h,
    });
    let settings = settings(&fake, 2, 1);
    let result = roll_out(&hosts, &v2, &[], &settings).await;
    assert_eq!(outcomes_of(&result), [ApplyOutcome::Applied, ApplyOutcome::Applied]);
    let log = fake.log();
    assert_eq!((count(&log, 1, Op::Open), count(&log, 1, Op::Upload)), (2, 2));
    assert_eq!(fake.host("h1").loaded.as_ref(), Some(&v2.sha256));
}

/// A change the runtime API takes goes live on each host in one round trip after its upload
/// (swap_runtime), and on the canary in the upload's own round trip: no read of a host
/// prepared ahead, no swap or session apart, no reload. A host whose worker changed since it
/// was prepared is prepared again and then goes live, in its upload's round trip.
#[tokio::test(start_paused = true)]
async fn a_runtime_change_swaps_with_its_commands_and_a_stale_host_is_prepared_again() {
    let moved = |c: String| c.replace("10.0.0.1:30081", "10.0.0.2:30081");
    let (v1, v2) = (version(1, &config(&["be_a"], 0)), version(2, &moved(config(&["be_a"], 0))));
    let (hosts, fake) = fleet(3, Some(&v1), |_, h| h);
    let settings = settings(&fake, 3, 2);
    // h2's master reloads (another worker) while the canary goes live.
    let known = [&v1];
    let result = {
        let rollout = roll_out(&hosts, &v2, &known, &settings);
        let meddle = async {
            while !fake.log().contains(&("h0".to_owned(), Op::UploadLive)) {
                tokio::time::sleep(Duration::from_micros(100)).await;
            }
            fake.change("h2", |h| h.proc.workers = vec![(999, 0)]);
        };
        tokio::join!(rollout, meddle).0
    };
    let applied = [ApplyOutcome::Applied, ApplyOutcome::Applied, ApplyOutcome::Applied];
    assert_eq!(outcomes_of(&result), applied);
    let log = fake.log();
    for i in 0..3 {
        let effort = result.outcomes[i].effort;
        assert_eq!((effort.reloads, effort.runtime_commands), (0, 1), "h{i}");
        for op in [Op::Refresh, Op::Swap, Op::Session, Op::MasterCli, Op::Reload] {
            assert_eq!(count(&log, i, op), 0, "h{i} did {op:?}: {log:?}");
        }
        let name = format!("h{i}");
        let live = log
            .iter()
            .rposition(|(h, o)| *h == name && matches!(o, Op::SwapRuntime | Op::UploadLive));
        assert!(live < Some(at(&log, i, Op::MarkLoaded)), "{log:?}");
        assert_eq!(fake.host(&format!("h{i}")).loaded.as_ref(), Some(&v2.sha256));
    }
    let set = "set server be_a/n1 addr 10.0.0.2 port 30081".to_owned();
    assert!(fake.commands().contains(&("h2".to_owned(), set)), "{:?}", fake.commands());
    let trips =
        |i| [Op::Upload, Op::UploadLive, Op::SwapRuntime, Op::Open].map(|op| count(&log, i, op));
    assert_eq!(trips(0), [1, 1, 0, 1], "the canary: live with its upload");
    assert_eq!(trips(1), [1, 0, 1, 1], "prepared ahead: live on its turn");
    assert_eq!(trips(2), [2, 1, 1, 2], "stale on its turn, prepared again and live with it");
}

/// The canary of a change through the runtime API is marked loaded while the first wave goes
/// live, not before it: its verdict (HAProxy took the commands, the probes passed) is in.
/// A mark that fails then fails the canary's report and halts the waves after that one.
#[tokio::test(start_paused = true)]
async fn the_canary_is_marked_while_the_first_wave_goes_live_and_a_failed_mark_halts_the_rest() {
    let moved = |c: String| c.replace("10.0.0.1:30081", "10.0.0.2:30081");
    let (v1, v2) = (version(1, &config(&["be_a"], 0)), version(2, &moved(config(&["be_a"], 0))));
    let known = [&v1];
    let (hosts, fake) = fleet(3, Some(&v1), |_, h| h);
    let result = roll_out(&hosts, &v2, &known, &settings(&fake, 3, 1)).await;
    assert_eq!(outcomes_of(&result), [const { ApplyOutcome::Applied }; 3]);
    // h1's change went live while h0 was being marked (each op takes the same time), not
    // after.
    let marked = fake.ended("h0", Op::MarkLoaded).unwrap();
    let h1_live = fake.ended("h1", Op::SwapRuntime).unwrap();
    assert_eq!(h1_live, marked, "h1 waited for h0's mark: {:?}", fake.log());
    assert_eq!(fake.host("h0").loaded.as_ref(), Some(&v2.sha256));

    let unmarkable = Failure { exit: None, ..ops::fail(ApplyStage::Verify, "disk full") };
    let (hosts, fake) = fleet(3, Some(&v1), |i, h| match i {
        0 => h.failing(Op::MarkLoaded, unmarkable.clone(), 1),
        _ => h,
    });
    let result = roll_out(&hosts, &v2, &known, &settings(&fake, 3, 1)).await;
    let got: Vec<_> = outcomes(&result).iter().map(|(i, o)| (*i, stage_of(o))).collect();
    assert_eq!(got, [(0, Some(ApplyStage::Verify)), (1, None)], "h1 went with the mark");
    assert_eq!(result.not_attempted, [2], "the waves after it halt");
    assert_eq!(count(&fake.log(), 2, Op::SwapRuntime), 0);
}

/// A host as the applier's last apply left it is not read before the next version: the
/// upload goes first, on the kept session, as edits of what was left there. One changed by
/// hand since is found out when it would go live (its live file is not the one assumed),
/// read and prepared again, and takes the version all the same.
#[tokio::test(start_paused = true)]
async fn a_host_as_the_last_apply_left_it_is_not_read_first_and_one_changed_since_is() {
    let at = |port: &str| config(&["be_a"], 0).replace("10.0.0.1:30081", port);
    let (v1, v2, v3) = (
        version(1, &at("10.0.0.1:1")),
        version(2, &at("10.0.0.1:2")),
        version(3, &at("10.0.0.1:3")),
    );
    let (hosts, fake) = fleet(2, Some(&v1), |_, h| h);
    let settings = settings(&fake, 2, 1);
    let result = roll_out(&hosts, &v2, &[&v1], &settings).await;
    assert_eq!(outcomes_of(&result), [ApplyOutcome::Applied, ApplyOutcome::Applied]);
    let log = fake.log();
    assert_eq!((count(&log, 0, Op::Open), count(&log, 0, Op::Take)), (1, 0), "nothing to go by");

    fake.change("h1", |h| h.live = Some("edited by hand".into()));
    let result = roll_out(&hosts, &v3, &[&v1, &v2], &settings).await;
    assert_eq!(outcomes_of(&result), [ApplyOutcome::Applied, ApplyOutcome::Applied]);
    let log = fake.log();
    assert_eq!((count(&log, 0, Op::Open), count(&log, 0, Op::Take)), (1, 1), "{log:?}");
    assert_eq!(result.outcomes[0].effort.reloads, 0, "through the runtime API");
    // h1: taken as left, found changed when going live, read and prepared again.
    assert_eq!((count(&log, 1, Op::Take), count(&log, 1, Op::Open)), (1, 2), "{log:?}");
    for h in ["h0", "h1"] {
        assert_eq!(fake.host(h).loaded.as_ref(), Some(&v3.sha256), "{h}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_unchanged_host_is_left_alone() {
    let v1 = version(1, &config(&["be_a"], 0));
    let (hosts, fake) = fleet(2, Some(&v1), |_, h| h);
    let result = roll_out(&hosts, &v1, &[], &settings(&fake, 2, 1)).await;
    assert_eq!(outcomes_of(&result), [ApplyOutcome::Unchanged, ApplyOutcome::Unchanged]);
    let ops: Vec<Op> = fake.log().into_iter().map(|(_, op)| op).collect();
    assert_eq!(ops, [Op::Open, Op::Open]);
}

#[tokio::test(start_paused = true)]
async fn new_backends_are_bridged_through_empty_spares_until_the_reload() {
    let (v1, v2) = (version(1, &config(&["be_a"], 1)), version(2, &config(&["be_a", "be_b"], 1)));
    // h1's spare holds another Service's server in the running process: not bridged there.
    let (hosts, fake) = fleet(2, Some(&v1), |i, mut h| {
        if i == 1 {
            h.busy_spares.insert("hafleet_spare_0".into());
        }
        h
    });
    let settings = settings(&fake, 2, 1);
    let result = roll_out(&hosts, &v2, &[&v1], &settings).await;
    assert_eq!(outcomes_of(&result), [ApplyOutcome::Applied, ApplyOutcome::Applied]);
    let effort: Vec<(u32, u32)> =
        result.outcomes.iter().map(|r| (r.effort.bridged, r.effort.reloads)).collect();
    assert_eq!(effort, [(1, 1), (0, 1)], "bridged where the spare was empty; reloaded on both");

    let commands = fake.commands();
    let on = |h: &str| -> Vec<String> {
        commands.iter().filter(|(name, _)| name == h).map(|(_, c)| c.clone()).collect()
    };
    let h0 = on("h0");
    assert_eq!(h0[0], "show servers state hafleet_spare_0", "the spare is checked first");
    assert!(h0[1].starts_with("add server hafleet_spare_0/"), "{h0:?}");
    assert!(h0.iter().any(|c| c.starts_with("enable server hafleet_spare_0/")), "{h0:?}");
    assert_eq!(on("h1"), ["show servers state hafleet_spare_0"], "a busy spare is left alone");
    // On both, the swap comes before the runtime commands, the reload after them.
    let log = fake.log();
    for i in 0..2 {
        assert!(at(&log, i, Op::Swap) < at(&log, i, Op::Session));
        assert!(at(&log, i, Op::Session) < at(&log, i, Op::Reload));
        assert_eq!(fake.host(&format!("h{i}")).loaded.as_ref(), Some(&v2.sha256));
    }
}
