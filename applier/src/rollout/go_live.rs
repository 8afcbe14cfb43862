//! Putting a prepared host live: the swap, the runtime API or a reload (bridged through spares
//! where it can be), the probes, the loaded marker; last-known-good back on any failure.

use super::*;

/// Puts a prepared host live (see [`prepare`]) and gives its connection back.
pub(super) async fn finish(
    prepared: Prepared<'_>,
    version: &ConfigVersion,
    settings: &RolloutSettings,
) -> (Result<ApplyOutcome, Failure>, Effort) {
    let (result, effort, unmarked) = finish_live(prepared, version, settings, false).await;
    debug_assert!(unmarked.is_none(), "marked unless asked to leave it");
    (result, effort)
}

/// [`finish`], but with `mark_later`, a host that went live through the runtime API (and
/// passed its probes) is not marked loaded yet: it comes back as an [`Unmarked`], connection
/// and all, for the rollout to mark while the next hosts go live. The canary's verdict is in
/// once HAProxy took the change and the probes passed; the record of it need not hold the
/// fleet up.
#[tracing::instrument(skip_all, fields(host = %prepared.host.name, version = version.version))]
pub(super) async fn finish_live(
    prepared: Prepared<'_>,
    version: &ConfigVersion,
    settings: &RolloutSettings,
    mark_later: bool,
) -> (Result<ApplyOutcome, Failure>, Effort, Option<Unmarked>) {
    let Prepared { host, conn, step, state, .. } = prepared;
    let mut effort = Effort::default();
    let Some(conn) = conn else {
        let Next::Done(result) = step else { unreachable!("only a failure has no connection") };
        return (result, effort, None);
    };
    let mut mark = None;
    let result = match step {
        Next::Done(result) => result,
        Next::ReloadOnly => reload_only(&*conn, host, version, settings, &mut effort).await,
        Next::Staged { token, uploaded, change, bridge } => {
            let staged = Staged { token: token.as_str(), uploaded, change: &change, bridge };
            let later = mark_later.then_some(&mut mark);
            go_live(&*conn, host, version, staged, &state, settings, &mut effort, later).await
        }
    };
    match (mark, &result) {
        (Some(mark), Ok(_)) => (result, effort, Some(Unmarked { conn, mark })),
        _ => {
            if matches!(result, Ok(ApplyOutcome::Applied | ApplyOutcome::Unchanged)) {
                settings.record_applied(host, &version.sha256);
            }
            conn.give_back(result.is_ok()).await;
            (result, effort, None)
        }
    }
}

/// What marking a live host loaded writes (see [`mark_loaded`]).
pub(super) struct MarkArgs {
    sha: String,
    version: Option<u64>,
    reloads: u64,
    stat: Option<String>,
}

/// A host live on a version and not marked loaded yet ([`finish_live`]), with its connection.
pub(super) struct Unmarked {
    conn: Box<dyn HostOps>,
    mark: MarkArgs,
}

impl Unmarked {
    /// Marks `host` loaded and gives its connection back.
    pub(super) async fn mark(self, host: &Host, settings: &RolloutSettings) -> Result<(), Failure> {
        let Unmarked { conn, mark } = self;
        let done = (mark.sha.as_str(), mark.version);
        let marked = mark_loaded(&*conn, done, Some(mark.reloads), mark.stat.as_deref()).await;
        if marked.is_ok() {
            settings.record_applied(host, &mark.sha);
        }
        conn.give_back(marked.is_ok()).await;
        marked
    }
}

/// The live file is the version but HAProxy never loaded it: reload, verify, mark.
pub(super) async fn reload_only(
    conn: &dyn HostOps,
    host: &Host,
    version: &ConfigVersion,
    settings: &RolloutSettings,
    effort: &mut Effort,
) -> Result<ApplyOutcome, Failure> {
    info!("live file is this version but HAProxy never loaded it; reloading");
    effort.reloads += 1;
    let mark = mark_with_reload(host, version);
    let ask = ReloadAsk { swap: None, mark, stat: None, version: told(version) };
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
        let done = (version.sha256.as_str(), told(version));
        mark_loaded(conn, done, Some(after.reloads), None).await?;
    }
    Ok(ApplyOutcome::Applied)
}

/// Swaps a staged upload in and makes HAProxy take it: through the runtime API when `change`
/// allows, else with a reload; then probes and marks it loaded, or puts last-known-good back.
/// With `mark_later`, a change taken through the runtime API is not marked: what the mark
/// needs is left there instead (see [`finish_live`]).
#[allow(clippy::too_many_arguments)]
pub(super) async fn go_live(
    conn: &dyn HostOps,
    host: &Host,
    version: &ConfigVersion,
    staged: Staged<'_>,
    prepared_state: &LiveShas,
    settings: &RolloutSettings,
    effort: &mut Effort,
    mark_later: Option<&mut Option<MarkArgs>>,
) -> Result<ApplyOutcome, Failure> {
    let Staged { token, uploaded: Uploaded { before, stat, sent, went_live }, change, bridge } =
        staged;
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
    // A change the runtime API takes, certificates apart, swaps in the same round trip as its
    // commands (swap_runtime.sh), which checks first that the host is as it was prepared.
    let swap_with_commands = runtime::swaps_with_commands(change);
    if !swap_with_reload && !swap_with_commands {
        conn.swap(token).await?;
    }

    // The files hold the version now; the running process takes it without a reload if it can.
    let live_without_reload = match change {
        runtime::Plan::Nothing => {
            info!("the new config differs from the running one in comments only; no reload");
            true
        }
        runtime::Plan::Runtime(steps) => {
            tracing::debug!(
                steps = steps.len(),
                maps_edited = ?runtime::edited_maps(steps),
                maps_replaced = ?runtime::map_kinds(steps),
                with_upload = went_live.is_some(),
                "through the runtime API"
            );
            let taken = match went_live {
                // Gone live in the upload's round trip.
                Some(went) => match SwapPlan::new(steps) {
                    Ok(swap) => swap.took(went?, steps),
                    Err(why) => Err(why),
                },
                None => swap_runtime(conn, token, prepared_state, &before, steps).await?,
            };
            match taken {
                Ok(sent) => {
                    effort.runtime_commands = sent;
                    info!(commands = sent, "applied through the runtime API; no reload");
                    true
                }
                Err(why) => {
                    warn!(%why, "the runtime API did not take the change; reloading instead");
                    false
                }
            }
        }
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
        if let Some(later) = mark_later {
            let (sha, version) = (version.sha256.clone(), told(version));
            *later = Some(MarkArgs { sha, version, reloads: before.reloads, stat });
            return Ok(ApplyOutcome::Applied);
        }
        let stat = stat.as_deref();
        let done = (version.sha256.as_str(), told(version));
        mark_loaded(conn, done, Some(before.reloads), stat).await?;
        return Ok(ApplyOutcome::Applied);
    }

    effort.reloads += 1;
    let ask = ReloadAsk {
        swap: swap_with_reload.then_some((token, prepared_state)),
        mark: mark_with_reload(host, version),
        stat: stat.as_deref(),
        version: told(version),
    };
    match reload(conn, host, settings, ask).await {
        Ok((after, marked)) => {
            probed(conn, host, settings, effort).await?;
            if !marked {
                let stat = stat.as_deref();
                let done = (version.sha256.as_str(), told(version));
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
pub(super) struct Staged<'a> {
    pub(super) token: &'a str,
    pub(super) uploaded: Uploaded,
    pub(super) change: &'a runtime::Plan,
    /// For a reload: its bridge, being looked for.
    pub(super) bridge: Option<PendingBridge>,
}

/// Serves a reload's new backends through spares (see [`runtime::bridge`]) until the reload,
/// which follows whatever happens here: the files hold the version already, and the reload
/// makes the process serve them.
pub(super) async fn bridged(
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
pub(super) async fn bridge_steps(
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

/// Runs the host's probes against what now runs; if they do not pass in time, puts
/// last-known-good back (a config that loaded and passed them) and fails at `Probe`.
pub(super) async fn probed(
    conn: &dyn HostOps,
    host: &Host,
    settings: &RolloutSettings,
    effort: &mut Effort,
) -> Result<(), Failure> {
    let (Some(address), false) = (&host.probe_address, host.probes.is_empty()) else {
        return Ok(());
    };
    let Err(why) =
        crate::adapters::probe::until_pass(address, &host.probes, settings.probe_timeout).await
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
pub(super) async fn apply_runtime(
    conn: &dyn HostOps,
    before: &plan::ProcState,
    steps: &[runtime::Step],
    (bundle, identity): (Option<&Bundle>, Option<&crate::core::identity::FleetIdentity>),
) -> Result<u32, String> {
    let pid = plan::current_worker(before).ok_or("no single current worker in `show proc`")?;
    let mut sent = 0;
    let mut certs = runtime::CertInputs::default();
    if runtime::touches_certs(steps) {
        let show = format!("@!{pid} show ssl crt-list");
        let out = conn.master_cli(&show).await?;
        sent += 1;
        certs.crt_list = runtime::running_crt_list(&out)
            .ok_or("`show ssl crt-list` does not list exactly one crt-list of hafleet's")?;
        let identity = identity.ok_or("no --tls-identity to open the certificates' keys")?;
        for path in runtime::added_certs(steps) {
            let cert = bundle
                .and_then(|b| b.cert_by_path(path))
                .ok_or_else(|| format!("the version does not hold {path}"))?;
            certs
                .files
                .insert(path.to_owned(), identity.cert_file(cert).map_err(|e| e.to_string())?);
        }
    }
    let mut maps = runtime::MapRefs::default();
    if runtime::changes_maps(steps) {
        let show = format!("@!{pid} show map");
        let out = conn.master_cli(&show).await?;
        sent += 1;
        let ids;
        (ids, maps) = runtime::locate_maps(&out, steps)?;
        if !ids.is_empty() {
            let prepare = runtime::prepare_commands(&ids);
            let answers = session(conn, pid, &prepare).await?;
            sent += prepare.len();
            maps.prepared = runtime::prepared_maps(ids, &answers)?;
        }
    }
    let commands = runtime::commands(steps, &maps, &certs)?;
    let answers = session(conn, pid, &commands).await?;
    sent += commands.len();
    let answers: Vec<&str> = answers.iter().map(String::as_str).collect();
    if let Some((command, answer)) = runtime::first_refused(&commands, &answers) {
        return Err(format!("HAProxy answered {answer:?} to `{command}`"));
    }
    Ok(sent as u32)
}

/// What swap_runtime.sh is asked for a plan's steps: the maps it replaces whole and those it
/// edits, whether it changes certificates, and the commands, with placeholders for the maps'
/// ids, the crt-list's name and the certificate files, all filled in on the host.
pub(super) struct SwapPlan<'a> {
    pub(super) kinds: Vec<&'a str>,
    pub(super) edited: Vec<(&'a str, usize)>,
    pub(super) crt_list: bool,
    pub(super) commands: Vec<runtime::Command>,
}

impl<'a> SwapPlan<'a> {
    pub(super) fn new(steps: &'a [runtime::Step]) -> Result<Self, String> {
        let maps = runtime::map_placeholders(steps);
        let commands = runtime::commands(steps, &maps, &runtime::CertInputs::on_host())?;
        Ok(SwapPlan {
            kinds: runtime::map_kinds(steps),
            edited: runtime::edited_maps(steps),
            crt_list: runtime::touches_certs(steps),
            commands,
        })
    }

    /// What the host answered: the number of commands sent (with `show map` and a `prepare
    /// map` for each map replaced whole), or why the runtime API did not take the change (the
    /// swap stands: the caller reloads).
    pub(super) fn took(
        &self,
        out: answer::SwapRuntime,
        steps: &[runtime::Step],
    ) -> Result<u32, String> {
        let out = match out {
            answer::SwapRuntime::Sent(out) => out,
            answer::SwapRuntime::Skipped(why) => {
                return Err(format!("the maps could not be prepared: {why}"));
            }
        };
        let answers = runtime::answers(&out, self.commands.len());
        if let Some((command, answer)) = runtime::first_refused(&self.commands, &answers) {
            return Err(format!("HAProxy answered {answer:?} to `{command}`"));
        }
        let asked = if runtime::changes_maps(steps) { self.kinds.len() + 1 } else { 0 };
        Ok((asked + usize::from(self.crt_list) + self.commands.len()) as u32)
    }
}

/// Swaps the upload `token` in and sends `steps` (no certificate among them) to the current
/// worker of `before`, in one round trip (swap_runtime.sh), if the host is still as it was
/// `prepared`: the number of commands sent, or why the runtime API did not take the change
/// (the swap stands: the caller reloads). `Err`: the host changed since it was prepared, or
/// the swap failed; nothing was done (or, the connection lost, it is not known).
async fn swap_runtime(
    conn: &dyn HostOps,
    token: &str,
    prepared: &LiveShas,
    before: &plan::ProcState,
    steps: &[runtime::Step],
) -> Result<Result<u32, String>, Failure> {
    let planned = plan::current_worker(before)
        .ok_or_else(|| "no single current worker in `show proc`".to_owned())
        .and_then(|pid| Ok((pid, SwapPlan::new(steps)?)));
    let (pid, swap) = match planned {
        Ok(planned) => planned,
        Err(why) => {
            conn.swap(token).await?;
            return Ok(Err(why));
        }
    };
    let session = runtime::session(pid, &swap.commands);
    let ask = ops::RuntimeSwap {
        token,
        prepared,
        pid: Some(pid),
        maps: &swap.kinds,
        edited: &swap.edited,
        crt_list: swap.crt_list,
        session: session.as_bytes(),
    };
    let out = conn.swap_runtime(ask).await?;
    Ok(swap.took(out, steps))
}

/// One interactive master CLI session: the answers to `commands`, in order.
pub(super) async fn session(
    conn: &dyn HostOps,
    pid: u32,
    commands: &[runtime::Command],
) -> Result<Vec<String>, String> {
    let input = runtime::session(pid, commands);
    let out = conn.session(input.as_bytes()).await?;
    Ok(runtime::answers(&out, commands.len()).into_iter().map(str::to_owned).collect())
}

/// Records the live file as what HAProxy loaded, if it is `expected_sha` (empty: whatever is
/// live, after a restore), with the master's reload count after our reload (`reloads`), so a
/// later reload by anyone else shows. A live file with the stat of the upload that became it
/// (`upload_stat`) is that upload, whose sha256 was checked on arrival: it is not hashed again.
/// Another applier may have swapped in a different file meanwhile; then this is a failure, not
/// a report of something HAProxy does not run.
pub(super) async fn mark_loaded(
    conn: &dyn HostOps,
    (expected_sha, version): (&str, Option<u64>),
    reloads: Option<u64>,
    upload_stat: Option<&str>,
) -> Result<(), Failure> {
    // The running worker is told the version it serves (access logs name it).
    conn.mark_loaded(Mark { expected_sha, reloads, upload_stat, version }).await
}

/// The version the running worker is told it serves, for the access log's `v<version>`: only
/// when the config logs it (`proc.hafleet_version`), which saves two master-socket round trips
/// (`show proc`, `set var`) on every apply of a fleet without an access log.
fn told(version: &ConfigVersion) -> Option<u64> {
    let logs = version.bundle().is_none_or(|b| b.config.contains("proc.hafleet_version"));
    logs.then_some(version.version)
}

pub(super) fn parse_show_proc(
    host: &Host,
    stdout: &str,
    stderr: &str,
) -> Result<plan::ProcState, String> {
    answer::show_proc(&host.master_socket, stdout, stderr)
}
