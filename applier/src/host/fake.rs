//! An in-memory fleet of hosts behind [`Hosts`] and [`HostOps`], for the rollout's tests: each
//! host holds a live and a loaded sha256, its files by name, uploads by token, last-known-good
//! and a master's `show proc`; any operation can be made to fail (a number of times) and every
//! call is logged in order. Each operation takes [`FakeHosts::latency`] of (tokio) time, so
//! that concurrent hosts interleave as over a network, and tests run under
//! `tokio::time::pause`.
//!
//! What it does not do: apply `sed` edits (an upload sent as an edit lands with the sha256 the
//! applier expects) or run `haproxy -c` (a config is refused when a test says so).

use super::answer::{self, Exit, LiveShas, LiveState, MasterAnswer};
use super::ops::{
    Failure, HostOps, Hosts, Mark, Opened, ReloadRequest, RuntimeSwap, UploadCheck, WentLive, fail,
};
use crate::core::inventory::Host;
use crate::core::plan::{HostFiles, ProcState, current_worker};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use hafleet_proto::ApplyStage;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An operation of [`HostOps`] or [`Hosts`], for failure injection and the call log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Open,
    /// A kept session taken without a check (`Hosts::take_kept`).
    Take,
    Refresh,
    Discard,
    UploadMaps,
    UploadCerts,
    Upload,
    Swap,
    Reload,
    Restore,
    MarkLoaded,
    ShowProc,
    MasterCli,
    Session,
    SwapRuntime,
    /// A change that went live in its upload's round trip (a swap_runtime after the check).
    UploadLive,
    DriftState,
}

/// One host's state.
#[derive(Debug, Clone)]
pub struct FakeHost {
    /// The live file's sha256 and the loaded marker's.
    pub live: Option<String>,
    pub loaded: Option<String>,
    /// Last-known-good's sha256.
    pub last_good: Option<String>,
    /// Files beside the config (maps by name, certificates as `../hafleet-certs/<id>.pem`),
    /// with their sha256.
    pub files: BTreeMap<String, String>,
    /// Uploads not yet swapped in: token to sha256.
    pub uploads: BTreeMap<String, String>,
    /// The master's reload count, failed reloads and workers (pid, reloads lived through).
    pub proc: ProcState,
    /// Configs (sha256) `haproxy -c` and the master refuse.
    pub refuses: HashSet<String>,
    /// Spares that hold a server in the running process (a bridge must not use them).
    pub busy_spares: HashSet<String>,
    /// Injected failures: each op fails with its failure as many times as given.
    pub failures: HashMap<Op, (Failure, u32)>,
    /// The version the running worker was told it serves.
    pub told_version: Option<u64>,
    next_pid: u32,
}

impl FakeHost {
    /// A host whose HAProxy runs (and whose live file is) the config with `sha` (`None`: a
    /// new host, nothing of hafleet's there).
    pub fn running(sha: Option<&str>) -> Self {
        FakeHost {
            live: sha.map(str::to_owned),
            loaded: sha.map(str::to_owned),
            last_good: sha.map(str::to_owned),
            proc: ProcState { reloads: 0, failed: 0, workers: vec![(100, 0)] },
            next_pid: 101,
            files: BTreeMap::new(),
            uploads: BTreeMap::new(),
            refuses: HashSet::new(),
            busy_spares: HashSet::new(),
            failures: HashMap::new(),
            told_version: None,
        }
    }

    /// Makes `op` fail `times` times with `failure`.
    pub fn failing(mut self, op: Op, failure: Failure, times: u32) -> Self {
        self.failures.insert(op, (failure, times));
        self
    }

    fn injected(&mut self, op: Op) -> Option<Failure> {
        let (failure, times) = self.failures.get_mut(&op)?;
        if *times == 0 {
            return None;
        }
        *times -= 1;
        Some(failure.clone())
    }

    fn shas(&self) -> LiveShas {
        LiveShas {
            live: self.live.clone().unwrap_or_default(),
            loaded: self.loaded.clone().unwrap_or_default(),
        }
    }

    /// `show proc` as HAProxy 2.6 prints it.
    fn show_proc(&self) -> String {
        let ProcState { reloads, failed, workers } = &self.proc;
        let mut out = format!(
            "#<PID> <type> <reloads> <uptime> <version>\n1 master {reloads} [failed: {failed}] 0d00h00m01s 2.6.12\n# workers\n"
        );
        for (pid, lived) in workers {
            out.push_str(&format!("{pid} worker {lived} 0d00h00m01s 2.6.12\n"));
        }
        out + "# programs\n"
    }

    /// A reload: a new worker if the live file is a config the master takes, else a failed
    /// reload (the old workers serve on).
    fn reload(&mut self) -> bool {
        self.proc.reloads += 1;
        for (_, lived) in &mut self.proc.workers {
            *lived += 1;
        }
        if self.live.as_ref().is_some_and(|sha| self.refuses.contains(sha)) {
            self.proc.failed += 1;
            return false;
        }
        // Old workers leave at once (no connections last here).
        self.proc.workers = vec![(self.next_pid, 0)];
        self.next_pid += 1;
        true
    }

    /// What the CLI answers `command` (without `@!<pid>`).
    fn cli(&self, command: &str) -> String {
        if let Some(spare) = command.strip_prefix("show servers state ") {
            let mut out = "1\n# be_id be_name srv_id srv_name srv_addr\n".to_owned();
            if self.busy_spares.contains(spare) {
                out.push_str(&format!("3 {spare} 1 other 10.9.9.9\n"));
            }
            return out;
        }
        if command.starts_with("add server ") {
            return "New server registered.".into();
        }
        if command.starts_with("set server ") && command.contains(" addr ") {
            return "IP changed from the old address".into();
        }
        String::new()
    }

    /// What an interactive session of `commands` prints: a prompt, then each answer and a
    /// prompt.
    fn answer_session(&self, commands: &[String]) -> String {
        let mut out = "> ".to_owned();
        for command in commands {
            out.push_str(&self.cli(command));
            out.push_str("\n> ");
        }
        out
    }

    /// Takes what an upload stream names (see `Outgoing::stream`, `cert_stream`): files into
    /// [`FakeHost::files`]; returns the config's sha256 if it came whole.
    fn unpack(&mut self, stream: &[u8]) -> Option<String> {
        let text = String::from_utf8_lossy(stream);
        let mut lines = text.split_inclusive('\n');
        let mut config = None;
        while let Some(head) = lines.next() {
            let fields: Vec<&str> = head.split_whitespace().collect();
            let count_at = match fields.first() {
                Some(&"hafleet-cert") => fields.len().checked_sub(1),
                _ => fields.len().checked_sub(2),
            };
            let count: usize = count_at.and_then(|i| fields[i].parse().ok()).unwrap_or(0);
            let body: String = lines.by_ref().take(count).collect();
            match fields.as_slice() {
                ["hafleet-map" | "hafleet-map-edit", name, digest, ..] => {
                    self.files.insert((*name).to_owned(), (*digest).to_owned());
                }
                ["hafleet-cert", name, sha, _] => {
                    self.files.insert(format!("../hafleet-certs/{name}"), (*sha).to_owned());
                }
                ["hafleet-config", _, newline] => {
                    let body = match *newline {
                        "1" => body,
                        _ => body.strip_suffix('\n').unwrap_or(&body).to_owned(),
                    };
                    config = Some(hafleet_proto::sha256_hex(body.as_bytes()));
                }
                _ => {}
            }
        }
        config
    }
}

/// A fleet of [`FakeHost`]s by name, and the log of every call.
#[derive(Debug, Clone, Default)]
pub struct FakeHosts {
    inner: Arc<Mutex<Fleet>>,
    /// How long each operation takes.
    pub latency: Duration,
}

#[derive(Debug, Default)]
struct Fleet {
    hosts: HashMap<String, FakeHost>,
    /// (host, op), in the order they ran.
    log: Vec<(String, Op)>,
    /// When each op of `log` ended, in (tokio) time.
    ended: Vec<tokio::time::Instant>,
    /// (host, command) for each master CLI command, in order.
    commands: Vec<(String, String)>,
}

impl FakeHosts {
    /// Hosts named as given, each as given; operations take 5 ms.
    pub fn new(hosts: impl IntoIterator<Item = (String, FakeHost)>) -> Self {
        let fleet = Fleet { hosts: hosts.into_iter().collect(), ..Fleet::default() };
        FakeHosts { inner: Arc::new(Mutex::new(fleet)), latency: Duration::from_millis(5) }
    }

    /// A host's state now.
    pub fn host(&self, name: &str) -> FakeHost {
        self.lock().hosts[name].clone()
    }

    /// Changes a host's state.
    pub fn change(&self, name: &str, f: impl FnOnce(&mut FakeHost)) {
        f(self.lock().hosts.get_mut(name).expect("a host of the fleet"));
    }

    /// Every call so far: (host, op), in order.
    pub fn log(&self) -> Vec<(String, Op)> {
        self.lock().log.clone()
    }

    /// When `host` first ended `op`, in (tokio) time.
    pub fn ended(&self, host: &str, op: Op) -> Option<tokio::time::Instant> {
        let fleet = self.lock();
        let at = fleet.log.iter().position(|(h, o)| h == host && *o == op)?;
        Some(fleet.ended[at])
    }

    /// Every master CLI command so far: (host, command), in order.
    pub fn commands(&self) -> Vec<(String, String)> {
        self.lock().commands.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Fleet> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits the latency, logs the call and runs `f` on the host unless a failure is
    /// injected for `op`.
    async fn call<T>(
        &self,
        name: &str,
        op: Op,
        f: impl FnOnce(&mut FakeHost) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        tokio::time::sleep(self.latency).await;
        let mut fleet = self.lock();
        fleet.log.push((name.to_owned(), op));
        fleet.ended.push(tokio::time::Instant::now());
        let host = fleet.hosts.get_mut(name).expect("a host of the fleet");
        match host.injected(op) {
            Some(failure) => Err(failure),
            None => f(host),
        }
    }

    fn session(&self, host: &Host) -> Box<dyn HostOps> {
        Box::new(Session { fleet: self.clone(), name: host.name.to_string() })
    }
}

/// A session with one fake host.
#[derive(Debug)]
struct Session {
    fleet: FakeHosts,
    name: String,
}

impl Session {
    async fn call<T>(
        &self,
        op: Op,
        f: impl FnOnce(&mut FakeHost) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        self.fleet.call(&self.name, op, f).await
    }

    /// An upload of files as one stream (maps or certificates): they land on the host.
    fn unpack<'a>(&'a self, op: Op, stream: &'a [u8]) -> BoxFuture<'a, Result<(), Failure>> {
        let unpack = move |h: &mut FakeHost| {
            h.unpack(stream);
            Ok(())
        };
        self.call(op, unpack).boxed()
    }

    /// swap_runtime.sh, logged as `op`.
    fn runtime_swap<'a>(
        &'a self,
        op: Op,
        ask: RuntimeSwap<'a>,
    ) -> BoxFuture<'a, Result<answer::SwapRuntime, Failure>> {
        // Each kind of map is `#<n>` (its place in `ask.maps`, then `ask.edited`); one
        // replaced whole is prepared as version 1.
        let mut text = String::from_utf8_lossy(ask.session).into_owned();
        for (n, kind) in ask.maps.iter().enumerate() {
            text = text.replace(&format!("{{map:{kind}}}"), &format!("@1 #{n}"));
        }
        for (n, (kind, _)) in ask.edited.iter().enumerate() {
            text = text.replace(&format!("{{mapid:{kind}}}"), &format!("#{}", ask.maps.len() + n));
        }
        let commands = session_commands(text.as_bytes());
        async move {
            let sent = self
                .call(op, |h| {
                    if h.shas() != *ask.prepared {
                        return Err(exit(Exit::Stale, "the host changed since it was prepared"));
                    }
                    let current = current_worker(&h.proc);
                    if current.is_none() || ask.pid.is_some_and(|pid| current != Some(pid)) {
                        return Err(exit(Exit::Stale, "another worker is the current one"));
                    }
                    swap(h, ask.token)?;
                    Ok(answer::SwapRuntime::Sent(h.answer_session(&commands)))
                })
                .await;
            if sent.is_ok() {
                self.log_commands(commands.iter().map(String::as_str));
            }
            sent
        }
        .boxed()
    }

    fn log_commands<'a>(&self, commands: impl IntoIterator<Item = &'a str>) {
        let mut fleet = self.fleet.lock();
        for c in commands {
            fleet.commands.push((self.name.clone(), c.to_owned()));
        }
    }
}

/// A failure a script names by its exit code.
fn exit(exit: Exit, message: &str) -> Failure {
    Failure { exit: Some(exit), ..fail(exit.stage(), message) }
}

impl HostOps for Session {
    fn refresh(&self) -> BoxFuture<'_, Option<answer::Refresh>> {
        let refresh =
            |h: &mut FakeHost| Ok(answer::Refresh { shas: h.shas(), proc: Some(h.proc.clone()) });
        self.call(Op::Refresh, refresh).map(Result::ok).boxed()
    }

    fn discard<'a>(&'a self, token: &'a str) -> BoxFuture<'a, ()> {
        let discard = move |h: &mut FakeHost| {
            h.uploads.remove(token);
            Ok(())
        };
        self.call(Op::Discard, discard).map(|_| ()).boxed()
    }

    fn upload_maps<'a>(
        &'a self,
        _token: &'a str,
        _count: usize,
        stream: &'a [u8],
    ) -> BoxFuture<'a, Result<(), Failure>> {
        self.unpack(Op::UploadMaps, stream)
    }

    fn upload_certs<'a>(
        &'a self,
        _token: &'a str,
        _count: usize,
        stream: &'a [u8],
    ) -> BoxFuture<'a, Result<(), Failure>> {
        self.unpack(Op::UploadCerts, stream)
    }

    fn upload<'a>(
        &'a self,
        token: &'a str,
        check: UploadCheck<'a>,
        _maps: usize,
        stream: &'a [u8],
    ) -> BoxFuture<'a, Result<(answer::Uploaded, Option<WentLive>), Failure>> {
        async move {
            let uploaded = self
                .call(Op::Upload, move |h| {
                    let whole = h.unpack(stream);
                    let (UploadCheck::Validated { sha256, .. } | UploadCheck::Maps { sha256, .. }) =
                        check;
                    if whole.as_ref().is_some_and(|s| s != sha256) {
                        return Err(exit(Exit::Upload, "uploaded file has another sha256"));
                    }
                    if h.refuses.contains(sha256) {
                        return Err(fail(ApplyStage::Validate, "haproxy -c: fatal errors"));
                    }
                    h.uploads.insert(token.to_owned(), sha256.to_owned());
                    let proc = h.show_proc();
                    let stat = Some(format!("stat {token}"));
                    Ok(answer::Uploaded { sha: Some(sha256.to_owned()), stat, proc })
                })
                .await?;
            // A change that goes live in the same round trip: logged as a swap_runtime of its
            // own, which may be made to fail alone.
            // Not without one current worker: then the rollout swaps in a round trip of its own.
            // The worker is the one the upload's `show proc` names, as the script takes it.
            let worker = uploaded.show_proc().and_then(|p| current_worker(&p));
            let went = match (check.then(), worker) {
                (Some(ask), Some(pid)) => {
                    let ask = RuntimeSwap { pid: Some(pid), ..*ask };
                    Some(self.runtime_swap(Op::UploadLive, ask).await)
                }
                _ => None,
            };
            Ok((uploaded, went))
        }
        .boxed()
    }

    fn swap<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<(), Failure>> {
        self.call(Op::Swap, move |h| swap(h, token)).boxed()
    }

    fn swap_runtime<'a>(
        &'a self,
        ask: RuntimeSwap<'a>,
    ) -> BoxFuture<'a, Result<answer::SwapRuntime, Failure>> {
        self.runtime_swap(Op::SwapRuntime, ask)
    }

    fn reload<'a>(
        &'a self,
        request: ReloadRequest<'a>,
    ) -> BoxFuture<'a, Result<answer::Reload, Failure>> {
        self.call(Op::Reload, move |h| {
            if let Some((token, prepared)) = request.swap {
                if h.shas() != *prepared {
                    return Err(exit(Exit::Stale, "the host changed since it was prepared"));
                }
                swap(h, token)?;
            }
            let before = h.show_proc();
            let took = h.reload();
            let mut marked = false;
            if took && request.mark.is_some() && request.mark == h.live.as_deref() {
                h.loaded = h.live.clone();
                h.last_good = h.live.clone();
                h.told_version = request.version;
                marked = true;
            }
            Ok(answer::Reload {
                before,
                master: MasterAnswer::Silent,
                after: Some(h.proc.clone()),
                looks: Some(1),
                marked,
            })
        })
        .boxed()
    }

    fn restore(&self) -> BoxFuture<'_, Result<(), Failure>> {
        self.call(Op::Restore, |h| {
            h.live = h.last_good.clone();
            Ok(())
        })
        .boxed()
    }

    fn mark_loaded<'a>(&'a self, mark: Mark<'a>) -> BoxFuture<'a, Result<(), Failure>> {
        self.call(Op::MarkLoaded, move |h| {
            if !mark.expected_sha.is_empty() && h.live.as_deref() != Some(mark.expected_sha) {
                return Err(fail(ApplyStage::Verify, "the live file is not the one expected"));
            }
            h.loaded = h.live.clone();
            h.last_good = h.live.clone();
            h.told_version = mark.version;
            Ok(())
        })
        .boxed()
    }

    fn show_proc(&self) -> BoxFuture<'_, Result<ProcState, String>> {
        let proc = |h: &mut FakeHost| Ok(h.proc.clone());
        self.call(Op::ShowProc, proc).map(|r| r.map_err(|f| f.message)).boxed()
    }

    fn master_cli<'a>(&'a self, command: &'a str) -> BoxFuture<'a, Result<String, String>> {
        let command = command.split_once(' ').map_or(command, |(_, c)| c);
        self.log_commands([command]);
        self.call(Op::MasterCli, move |h| Ok(h.cli(command)))
            .map(|r| r.map_err(|f| f.message))
            .boxed()
    }

    fn session<'a>(&'a self, input: &'a [u8]) -> BoxFuture<'a, Result<String, String>> {
        let commands = session_commands(input);
        self.log_commands(commands.iter().map(String::as_str));
        self.call(Op::Session, move |h| Ok(h.answer_session(&commands)))
            .map(|r| r.map_err(|f| f.message))
            .boxed()
    }

    fn give_back(self: Box<Self>, _healthy: bool) -> BoxFuture<'static, ()> {
        async {}.boxed()
    }
}

/// The commands of a master CLI session (`@!<pid> <command>` lines; a payload, after ` <<`,
/// runs to an empty line), without their `@!<pid>`.
fn session_commands(input: &[u8]) -> Vec<String> {
    let input = String::from_utf8_lossy(input);
    let mut commands = Vec::new();
    let mut lines = input.lines();
    while let Some(line) = lines.next() {
        let Some((_, command)) = line.strip_prefix("@!").and_then(|l| l.split_once(' ')) else {
            continue;
        };
        if let Some(command) = command.strip_suffix(" <<") {
            lines.by_ref().take_while(|l| !l.is_empty()).for_each(drop);
            commands.push(command.to_owned());
        } else {
            commands.push(command.to_owned());
        }
    }
    commands
}

/// Keeps the live file as last-known-good and renames the upload `token` over it.
fn swap(h: &mut FakeHost, token: &str) -> Result<(), Failure> {
    let Some(sha) = h.uploads.remove(token) else {
        return Err(exit(Exit::Swap, "no such upload"));
    };
    h.last_good = h.live.take();
    h.live = Some(sha);
    Ok(())
}

impl Hosts for FakeHosts {
    fn open<'a>(&'a self, host: &'a Host, names: &'a [u8]) -> BoxFuture<'a, Opened<LiveState>> {
        async move {
            let names = String::from_utf8_lossy(names).into_owned();
            let state = self
                .call(host.name.as_str(), Op::Open, |h| {
                    let missing = names.lines().filter(|n| !h.files.contains_key(*n));
                    Ok(LiveState { shas: h.shas(), missing: missing.map(str::to_owned).collect() })
                })
                .await;
            match state {
                // An injected failure to open is one to connect.
                Err(failure) => Err(failure),
                Ok(state) => Ok((self.session(host), Ok(state))),
            }
        }
        .boxed()
    }

    fn take_kept<'a>(&'a self, host: &'a Host) -> BoxFuture<'a, Option<Box<dyn HostOps>>> {
        // A host that cannot be reached (an open fails) keeps no session either.
        let mut fleet = self.lock();
        let fleet = &mut *fleet;
        let down = fleet.hosts[host.name.as_str()].failures.get(&Op::Open).is_some_and(|f| f.1 > 0);
        if !down {
            fleet.log.push((host.name.to_string(), Op::Take));
            fleet.ended.push(tokio::time::Instant::now());
        }
        let kept = (!down).then(|| self.session(host));
        Box::pin(async move { kept })
    }

    fn open_checked<'a>(&'a self, host: &'a Host) -> BoxFuture<'a, Opened<()>> {
        async move {
            self.call(host.name.as_str(), Op::Open, |_| Ok(())).await?;
            Ok((self.session(host), Ok(())))
        }
        .boxed()
    }

    fn drift_state<'a>(
        &'a self,
        host: &'a Host,
        names: &'a [u8],
    ) -> BoxFuture<'a, Result<HostFiles, String>> {
        async move {
            let names = String::from_utf8_lossy(names).into_owned();
            let files = self.call(host.name.as_str(), Op::DriftState, |h| {
                Ok(HostFiles {
                    live: h.live.clone(),
                    loaded: h.loaded.clone(),
                    maps: names.lines().map(|n| (n.to_owned(), h.files.get(n).cloned())).collect(),
                    reloads_marked: Some(h.proc.reloads),
                    reloads_now: Some(h.proc.reloads),
                    nodes: None,
                })
            });
            files.await.map_err(|f| f.message)
        }
        .boxed()
    }

    fn close_all(&self) -> BoxFuture<'_, ()> {
        async {}.boxed()
    }
}
