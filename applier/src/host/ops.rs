//! The one typed boundary between the rollout and a host: what the applier asks of a host
//! ([`HostOps`], one open session with one host) and how it reaches the fleet's hosts
//! ([`Hosts`]). [`super::ssh`] does it over SSH with the scripts; [`super::fake`] in memory,
//! for the rollout's tests.
//!
//! ```text
//! rollout ──Hosts::open──▶ Box<dyn HostOps> ──refresh, upload, validate, swap, reload,
//!    │                                        runtime commands (with the swap or apart),
//!    │                                        mark loaded, restore──▶ host
//!    └──Hosts::drift_state (a session of its own)
//! ```

use super::answer::{self, Exit, LiveShas, LiveState};
use crate::core::inventory::Host;
use crate::core::plan::{HostFiles, ProcState};
use futures::future::BoxFuture;
use hafleet_proto::{ApplyOutcome, ApplyStage};
use std::time::Duration;

/// A failure on one host, before it becomes an [`ApplyOutcome`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub stage: ApplyStage,
    pub message: String,
    pub restored: bool,
    /// The step the script that failed names by its exit code, if it does.
    pub exit: Option<Exit>,
}

impl Failure {
    /// Failed before it changed anything on the host (the swap, or what comes before it).
    pub fn changed_nothing(&self) -> bool {
        self.exit.is_some_and(Exit::changed_nothing)
    }

    /// The outcome a host reports for this failure.
    pub fn outcome(self) -> ApplyOutcome {
        ApplyOutcome::Failed { stage: self.stage, message: self.message, restored: self.restored }
    }
}

/// A failure at `stage`, its message cut to 2,000 bytes.
pub fn fail(stage: ApplyStage, message: impl Into<String>) -> Failure {
    let mut message: String = message.into();
    if message.len() > 2000 {
        let mut cut = 2000;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push('…');
    }
    Failure { stage, message, restored: false, exit: None }
}

/// How an upload of the config (with the maps the host lacks) is checked on arrival.
#[derive(Debug, Clone, Copy)]
pub enum UploadCheck<'a> {
    /// Its sha256 must be this one, then `haproxy -c` on `check`, a config that loads the
    /// version's maps and new certificate files alone, and `show proc` (upload_files.sh):
    /// for a version whose config HAProxy runs but for its maps and crt-list. The stream
    /// starts with `certs` certificate files ([`crate::rollout::cert_stream`]'s records), put
    /// in place before the check.
    /// With `then`, the change goes live in the same round trip once checked.
    Maps { sha256: &'a str, check: &'a str, certs: usize, then: Option<RuntimeSwap<'a>> },
    /// Its sha256 must be this one, then `haproxy -c` on it and `show proc`
    /// (upload_validate.sh). With `then`, the change goes live in the same round trip once
    /// validated.
    Validated { sha256: &'a str, then: Option<RuntimeSwap<'a>> },
}

impl<'a> UploadCheck<'a> {
    /// The runtime change that goes live with the upload, if one does.
    pub fn then(&self) -> Option<&RuntimeSwap<'a>> {
        match self {
            UploadCheck::Maps { then, .. } | UploadCheck::Validated { then, .. } => then.as_ref(),
        }
    }
}

/// What the runtime change that went live with an upload ([`UploadCheck`]'s `then`) answered
/// after the check, as [`HostOps::swap_runtime`] would have.
pub type WentLive = Result<answer::SwapRuntime, Failure>;

/// What a reload's round trip asks of the host (reload_wait.sh, or swap_reload.sh with a
/// swap).
#[derive(Debug, Clone, Copy)]
pub struct ReloadRequest<'a> {
    /// Swap in this attempt's validated upload (its token) first, if the live and loaded
    /// sha256 lines are still those it was prepared on.
    pub swap: Option<(&'a str, &'a LiveShas)>,
    /// How many looks at `show proc` the host takes, at most.
    pub looks: u64,
    /// For how many seconds the host looks, at most.
    pub secs: u64,
    /// Once the reload is provably ours, mark the live file loaded if it has this sha256.
    pub mark: Option<&'a str>,
    /// The swapped-in upload's stat, for the mark.
    pub stat: Option<&'a str>,
    /// How long the host waits before its first look.
    pub first_look: Duration,
    /// The version the new worker is told it serves.
    pub version: Option<u64>,
}

/// What a change through the runtime API asks of the host in one round trip
/// (swap_runtime.sh): the swap, after checking the host is as prepared, then the commands.
/// Or, with the upload itself ([`UploadCheck`]'s `then`), in the upload's round trip.
#[derive(Debug, Clone, Copy)]
pub struct RuntimeSwap<'a> {
    /// This attempt's validated upload (with the upload: its own token).
    pub token: &'a str,
    /// The live and loaded sha256 lines it was prepared on.
    pub prepared: &'a LiveShas,
    /// The worker the commands are for, which must still be the current one; `None`: the
    /// current one, whichever it is, its pid put in place of `runtime::ANY_WORKER` in
    /// `session` on the host (with the upload, whose `show proc` comes in the same trip).
    pub pid: Option<u32>,
    /// The kinds of map replaced: each is found in `show map` and prepared, and `{map:KIND}`
    /// in `session` becomes its `@<version> #<id>`.
    pub maps: &'a [&'a str],
    /// The kinds of map edited in place, each with the number of entries it must hold: each is
    /// found in `show map`, and `{mapid:KIND}` in `session` becomes its `#<id>`.
    pub edited: &'a [(&'a str, usize)],
    /// Whether the session changes certificates: the worker's crt-list is found in `show ssl
    /// crt-list` and fills in `runtime::CRT_LIST_ON_HOST`, and each certificate file the
    /// session names (`runtime::cert_file_on_host`) is read on the host.
    pub crt_list: bool,
    /// The master CLI session (see `runtime::session`).
    pub session: &'a [u8],
}

/// What marking the live file loaded records (mark_loaded.sh).
#[derive(Debug, Clone, Copy)]
pub struct Mark<'a> {
    /// The live file must have this sha256 (empty: whatever is live, after a restore).
    pub expected_sha: &'a str,
    /// The master's reload count after our reload.
    pub reloads: Option<u64>,
    /// The stat of the upload that became the live file: then it is not hashed again.
    pub upload_stat: Option<&'a str>,
    /// The version the running worker is told it serves.
    pub version: Option<u64>,
}

/// One open session with one host: everything a rollout asks of it. Each method is one
/// round trip; failures come back typed, at the stage they are reported at.
pub trait HostOps: Send + Sync {
    /// The live and loaded sha256 lines and `show proc` now (refresh.sh); `None` if they
    /// could not be read.
    fn refresh(&self) -> BoxFuture<'_, Option<answer::Refresh>>;
    /// Removes the upload `token` (best effort).
    fn discard<'a>(&'a self, token: &'a str) -> BoxFuture<'a, ()>;
    /// Writes `count` maps from `stream` (see `Outgoing::stream`), each checked on arrival.
    fn upload_maps<'a>(
        &'a self,
        token: &'a str,
        count: usize,
        stream: &'a [u8],
    ) -> BoxFuture<'a, Result<(), Failure>>;
    /// Writes `count` certificate files from `stream` (see `cert_stream`).
    fn upload_certs<'a>(
        &'a self,
        token: &'a str,
        count: usize,
        stream: &'a [u8],
    ) -> BoxFuture<'a, Result<(), Failure>>;
    /// Writes the config under `token` and `maps` map files from `stream`, checked as `check`
    /// says. A dropped connection is an `Upload` failure, a refusal a `Validate` one (or the
    /// stage its exit code names). With a change to go live at once (the check's `then`),
    /// what it answered once the upload passed its check.
    fn upload<'a>(
        &'a self,
        token: &'a str,
        check: UploadCheck<'a>,
        maps: usize,
        stream: &'a [u8],
    ) -> BoxFuture<'a, Result<(answer::Uploaded, Option<WentLive>), Failure>>;
    /// Keeps the live file as last-known-good and renames the upload `token` over it.
    fn swap<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<(), Failure>>;
    /// Swaps the upload in if the host is as it was prepared, then sends the runtime
    /// commands to the worker (swap_runtime.sh). Exits Stale or Swap: nothing was done.
    fn swap_runtime<'a>(
        &'a self,
        ask: RuntimeSwap<'a>,
    ) -> BoxFuture<'a, Result<answer::SwapRuntime, Failure>>;
    /// Asks the master to reload (after a swap, if asked) and watches `show proc`.
    fn reload<'a>(
        &'a self,
        request: ReloadRequest<'a>,
    ) -> BoxFuture<'a, Result<answer::Reload, Failure>>;
    /// Puts last-known-good back as the live file (no reload).
    fn restore(&self) -> BoxFuture<'_, Result<(), Failure>>;
    /// Records the live file as the one HAProxy loaded, and tells the worker its version.
    fn mark_loaded<'a>(&'a self, mark: Mark<'a>) -> BoxFuture<'a, Result<(), Failure>>;
    /// The master's `show proc`.
    fn show_proc(&self) -> BoxFuture<'_, Result<ProcState, String>>;
    /// One command on the master CLI; what it printed.
    fn master_cli<'a>(&'a self, command: &'a str) -> BoxFuture<'a, Result<String, String>>;
    /// One interactive master CLI session fed `input` (see `runtime::session`); what it
    /// printed.
    fn session<'a>(&'a self, input: &'a [u8]) -> BoxFuture<'a, Result<String, String>>;
    /// Ends the session: kept for the next rollout if `healthy`, else closed.
    fn give_back(self: Box<Self>, healthy: bool) -> BoxFuture<'static, ()>;
}

/// A session opened with a host and what its first operation answered; `Err`: no session.
pub type Opened<T> = Result<(Box<dyn HostOps>, Result<T, Failure>), Failure>;

/// How the applier reaches its fleet's hosts.
pub trait Hosts: Send + Sync + std::fmt::Debug {
    /// A session with `host` and its state: the live and loaded sha256 lines and which of
    /// `names` (one a line) it lacks. `Err`: no session (`Connect` or `HostKey`).
    fn open<'a>(&'a self, host: &'a Host, names: &'a [u8]) -> BoxFuture<'a, Opened<LiveState>>;
    /// The session kept with `host` since its last apply, if there is one, not checked: for
    /// an apply that assumes the host is as that one left it (see `rollout::prepare`), whose
    /// first command fails if the session died. `None`: open one with [`Hosts::open`].
    fn take_kept<'a>(&'a self, host: &'a Host) -> BoxFuture<'a, Option<Box<dyn HostOps>>> {
        let _ = host;
        Box::pin(async { None })
    }
    /// A session with `host` that answered a no-op; `Err` (at `Upload`) if none.
    fn open_checked<'a>(&'a self, host: &'a Host) -> BoxFuture<'a, Opened<()>>;
    /// What a drift check reads of `host`: its files (those of `names`, one a line), `show
    /// proc` and node checks; `Err` if the host cannot be read.
    fn drift_state<'a>(
        &'a self,
        host: &'a Host,
        names: &'a [u8],
    ) -> BoxFuture<'a, Result<HostFiles, String>>;
    /// Ends every session kept (at shutdown).
    fn close_all(&self) -> BoxFuture<'_, ()>;
    /// Ends the sessions kept to anything but `hosts` as they are now (an inventory re-read:
    /// a host gone, or one whose address, port or user changed).
    fn keep_only<'a>(&'a self, hosts: &'a [Host]) -> BoxFuture<'a, ()> {
        let _ = hosts;
        Box::pin(async {})
    }
}
