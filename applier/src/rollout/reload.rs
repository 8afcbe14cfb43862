//! A reload asked of the master and watched until it is provably ours, and restoring
//! last-known-good.

use super::*;

/// Asks the master to reload and waits until a new worker runs, after exactly the one reload
/// asked for (so it is ours), or the reload failed. Returns `show proc` after it. A reload by
/// someone else in between makes the newest worker unattributable: it asks again (twice at
/// most), since the file it loads is the one this apply put in place. A master that answers
/// that another reload is still in progress (HAProxy 3.1 and later) did nothing: it is asked
/// again, every [`BUSY_PAUSE`], until the reload timeout.
///
/// What else the reload's round trip does: see [`ReloadAsk`]. Also returns whether the live
/// file was marked loaded.
pub(super) async fn reload(
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
pub(super) const BUSY_PAUSE: Duration = Duration::from_millis(100);

/// Why a reload must be asked for again.
pub(super) enum Again {
    /// Another reload came with ours (`show proc` after it).
    Raced(plan::ProcState),
    /// The master did not reload: another reload was still in progress.
    Busy,
}

/// What a reload's round trip does besides reloading.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReloadAsk<'a> {
    /// Swap in this attempt's validated upload (its token) first, if the live and loaded
    /// sha256 lines are still those it was prepared on; failing either is a `Swap` failure
    /// that changed nothing.
    pub(super) swap: Option<(&'a str, &'a LiveShas)>,
    /// Once the reload is provably ours, mark the live file loaded if it has this sha256, as
    /// [`mark_loaded`] would (for a host without probes, where loading is passing them).
    pub(super) mark: Option<&'a str>,
    /// The swapped-in upload's stat, for the mark (see [`Uploaded::stat`]).
    pub(super) stat: Option<&'a str>,
    /// The version the new worker is told it serves, once the reload is ours.
    pub(super) version: Option<u64>,
}

/// The sha256 a reload of `version` on `host` may mark loaded in its own round trip: only
/// where no probes must pass first.
pub(super) fn mark_with_reload<'a>(host: &Host, version: &'a ConfigVersion) -> Option<&'a str> {
    let probes = host.probe_address.is_some() && !host.probes.is_empty();
    (!probes).then_some(version.sha256.as_str())
}

/// One reload: `Ok(Ok(after))` when it is provably ours, `Ok(Err(again))` when it must be asked
/// for again.
pub(super) async fn reload_once(
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
pub(super) async fn restore(conn: &dyn HostOps, host: &Host, settings: &RolloutSettings) -> bool {
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
