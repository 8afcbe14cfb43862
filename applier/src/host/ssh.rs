//! [`HostOps`] and [`Hosts`] over SSH: each operation is one of [`super::scripts`] run on the
//! host through a pooled [`crate::host::conn::HostConn`], its answer read by [`super::answer`].

use super::answer::{self, Exit, LiveState};
use super::ops::{
    Failure, HostOps, Hosts, Mark, Opened, ReloadRequest, RuntimeSwap, UploadCheck, WentLive, fail,
};
use super::scripts::{self, Script};
use crate::core::inventory::Host;
use crate::core::plan::{self, HostFiles, ProcState};
use crate::host::conn::{ConnPool, HostConn, RemoteOutput};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use hafleet_proto::ApplyStage;
use std::sync::Arc;
use tracing::warn;

/// The fleet's hosts over SSH, sessions kept between versions in a [`ConnPool`].
#[derive(Debug)]
pub struct SshHosts {
    pool: Arc<ConnPool>,
}

impl SshHosts {
    pub fn new(pool: ConnPool) -> Self {
        SshHosts { pool: Arc::new(pool) }
    }

    fn session(&self, host: &Host, conn: HostConn, generation: u64) -> Box<dyn HostOps> {
        let pool = self.pool.clone();
        Box::new(SshHost { host: host.clone(), conn, generation, pool })
    }
}

/// One session with one host over SSH.
#[derive(Debug)]
pub struct SshHost {
    host: Host,
    conn: HostConn,
    /// The known_hosts generation the connection belongs to.
    generation: u64,
    pool: Arc<ConnPool>,
}

impl SshHost {
    /// Runs a script; a non-zero exit becomes a failure of `stage` carrying its output.
    async fn remote(
        &self,
        stage: ApplyStage,
        script: &Script,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<String, Failure> {
        outcome_of(stage, self.conn.run(script, args, stdin).await)
    }

    /// Sends `count` files as one stream to `script` (upload_maps.sh, upload_certs.sh), which
    /// lands them beside the live config for this attempt (`token`).
    async fn upload_stream(
        &self,
        script: &Script,
        token: &str,
        count: usize,
        stream: &[u8],
    ) -> Result<(), Failure> {
        let count = count.to_string();
        let args = [self.live(), token, count.as_str()];
        self.remote(ApplyStage::Upload, script, &args, Some(stream)).await?;
        Ok(())
    }

    fn live(&self) -> &str {
        self.host.config_path.as_str()
    }

    fn socket(&self) -> &str {
        self.host.master_socket.as_str()
    }
}

impl HostOps for SshHost {
    fn refresh(&self) -> BoxFuture<'_, Option<answer::Refresh>> {
        async move {
            let args = [self.live(), self.socket()];
            match self.conn.run(&scripts::REFRESH, &args, None).await {
                Ok(out) if out.success => Some(answer::Refresh::parse(&out.stdout)),
                _ => None,
            }
        }
        .boxed()
    }

    fn discard<'a>(&'a self, token: &'a str) -> BoxFuture<'a, ()> {
        async move {
            let _ = self.conn.run(&scripts::DISCARD, &[self.live(), token], None).await;
        }
        .boxed()
    }

    fn upload_maps<'a>(
        &'a self,
        token: &'a str,
        count: usize,
        stream: &'a [u8],
    ) -> BoxFuture<'a, Result<(), Failure>> {
        self.upload_stream(&scripts::UPLOAD_MAPS, token, count, stream).boxed()
    }

    fn upload_certs<'a>(
        &'a self,
        token: &'a str,
        count: usize,
        stream: &'a [u8],
    ) -> BoxFuture<'a, Result<(), Failure>> {
        self.upload_stream(&scripts::UPLOAD_CERTS, token, count, stream).boxed()
    }

    fn upload<'a>(
        &'a self,
        token: &'a str,
        check: UploadCheck<'a>,
        maps: usize,
        stream: &'a [u8],
    ) -> BoxFuture<'a, Result<(answer::Uploaded, Option<WentLive>), Failure>> {
        async move {
            let count = maps.to_string();
            let haproxy = self.host.haproxy_bin.as_str();
            let live = self.live();
            // What follows the check in the stream (the config that checks the maps, the
            // session of a change that goes live at once). Sized once and zeroed after: the
            // certificates' keys are in it.
            let then = check.then();
            let extra = then.map_or(0, |t| t.session.len());
            let mut with_more = zeroize::Zeroizing::new(Vec::new());
            let (sha256, certs) = match check {
                UploadCheck::Maps { sha256, check, certs, .. } => {
                    with_more.reserve(stream.len() + check.len() + extra + 128);
                    with_more.extend_from_slice(stream);
                    crate::rollout::stream_record(&mut with_more, "hafleet-check", check);
                    (sha256, Some(certs.to_string()))
                }
                UploadCheck::Validated { sha256, .. } => (sha256, None),
            };
            if let Some(then) = then {
                if with_more.is_empty() {
                    with_more.reserve(stream.len() + extra + 64);
                    with_more.extend_from_slice(stream);
                }
                let session = String::from_utf8_lossy(then.session);
                crate::rollout::stream_record(&mut with_more, "hafleet-session", &session);
            }
            let stream = if with_more.is_empty() { stream } else { &with_more[..] };
            let mut args = vec![haproxy, live, token, self.socket(), sha256, &count];
            let script = match &certs {
                Some(certs) => {
                    args.push(certs);
                    &scripts::UPLOAD_FILES
                }
                None => &scripts::UPLOAD_VALIDATE,
            };
            let went: Vec<String> = then.map(swap_args).unwrap_or_default();
            args.extend(went.iter().map(String::as_str));
            let ran = self.conn.run(script, &args, Some(stream)).await;
            match ran {
                // A dropped connection is an upload that may pass, not a refused config. With
                // a change going live in the same command it may have come after the swap
                // (not known): reported as the swap's, as swap_runtime's own would be.
                Err(e) => {
                    let stage = if then.is_some() { ApplyStage::Swap } else { ApplyStage::Upload };
                    Err(fail(stage, ssh_error(&e)))
                }
                Ok(out) => match answer::went_live(&out.stdout).filter(|_| then.is_some()) {
                    // Checked, then gone live (or not) in the same round trip.
                    Some((uploaded, after)) => {
                        let (uploaded, after) =
                            (answer::Uploaded::parse(uploaded), after.to_owned());
                        let went = match out.success {
                            true => {
                                // Why it was skipped, without what the check said before.
                                let said = out.stderr.rsplit_once("hafleet-live\n");
                                let said = said.map_or(out.stderr.as_str(), |(_, after)| after);
                                Ok(answer::SwapRuntime::parse(&after, said))
                            }
                            false => Err(runtime_swap_failure(Ok(out))),
                        };
                        Ok((uploaded, Some(went)))
                    }
                    _ => outcome_of(ApplyStage::Validate, Ok(out))
                        .map(|out| (answer::Uploaded::parse(&out), None)),
                },
            }
        }
        .boxed()
    }

    fn swap<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<(), Failure>> {
        async move {
            self.remote(ApplyStage::Swap, &scripts::SWAP, &[self.live(), token], None).await?;
            Ok(())
        }
        .boxed()
    }

    fn swap_runtime<'a>(
        &'a self,
        ask: RuntimeSwap<'a>,
    ) -> BoxFuture<'a, Result<answer::SwapRuntime, Failure>> {
        async move {
            let pid = ask.pid.map_or_else(|| "-".to_owned(), |p| p.to_string());
            let mut args = vec![self.live(), ask.token, self.socket(), &pid];
            let went = swap_args(&ask);
            args.extend(went.iter().map(String::as_str));
            let run = self.conn.run(&scripts::SWAP_RUNTIME, &args, Some(ask.session)).await;
            match run {
                Ok(out) if out.success => Ok(answer::SwapRuntime::parse(&out.stdout, &out.stderr)),
                failed => Err(runtime_swap_failure(failed)),
            }
        }
        .boxed()
    }

    fn reload<'a>(
        &'a self,
        request: ReloadRequest<'a>,
    ) -> BoxFuture<'a, Result<answer::Reload, Failure>> {
        async move {
            let first = request.first_look;
            let first = match first.is_zero() {
                true => "0".to_owned(),
                false => format!("{}.{:03}", first.as_secs(), first.subsec_millis()),
            };
            let looks = request.looks.to_string();
            let secs = request.secs.to_string();
            let mark = request.mark.unwrap_or_default();
            let stat = request.stat.unwrap_or_default();
            let wait = [self.socket(), &looks, &secs, mark, stat, &first];
            let version = request.version.map(|v| v.to_string()).unwrap_or_default();
            let live = self.live();
            let out = match request.swap {
                Some((token, prepared)) => {
                    let mut args = vec![live, token];
                    args.extend(wait);
                    args.extend([prepared.live.as_str(), prepared.loaded.as_str(), &version]);
                    // Exits Stale, NoProc and Swap say nothing was done; anything else comes
                    // after the swap.
                    self.remote(ApplyStage::Verify, &scripts::SWAP_RELOAD, &args, None).await?
                }
                None => {
                    let mut args = vec![live];
                    args.extend(wait);
                    args.push(&version);
                    self.remote(ApplyStage::Verify, &scripts::RELOAD_WAIT, &args, None).await?
                }
            };
            Ok(answer::Reload::parse(&out))
        }
        .boxed()
    }

    fn restore(&self) -> BoxFuture<'_, Result<(), Failure>> {
        async move {
            self.remote(ApplyStage::Swap, &scripts::RESTORE, &[self.live()], None).await?;
            Ok(())
        }
        .boxed()
    }

    fn mark_loaded<'a>(&'a self, mark: Mark<'a>) -> BoxFuture<'a, Result<(), Failure>> {
        async move {
            let reloads = mark.reloads.map(|r| r.to_string()).unwrap_or_default();
            let version = mark.version.map(|v| v.to_string()).unwrap_or_default();
            let args = [
                self.live(),
                mark.expected_sha,
                &reloads,
                mark.upload_stat.unwrap_or_default(),
                self.socket(),
                &version,
            ];
            self.remote(ApplyStage::Verify, &scripts::MARK_LOADED, &args, None).await?;
            Ok(())
        }
        .boxed()
    }

    fn show_proc(&self) -> BoxFuture<'_, Result<ProcState, String>> {
        async move {
            let out = self
                .conn
                .run(&scripts::MASTER_CLI, &[self.socket(), "show proc"], None)
                .await
                .map_err(|e| ssh_error(&e))?;
            answer::show_proc(self.socket(), &out.stdout, &out.stderr)
        }
        .boxed()
    }

    fn master_cli<'a>(&'a self, command: &'a str) -> BoxFuture<'a, Result<String, String>> {
        async move {
            let out = self
                .conn
                .run(&scripts::MASTER_CLI, &[self.socket(), command], None)
                .await
                .map_err(|e| ssh_error(&e))?;
            Ok(out.stdout)
        }
        .boxed()
    }

    fn session<'a>(&'a self, input: &'a [u8]) -> BoxFuture<'a, Result<String, String>> {
        async move {
            let out = self
                .conn
                .run(&scripts::MASTER_SESSION, &[self.socket()], Some(input))
                .await
                .map_err(|e| ssh_error(&e))?;
            if !out.success {
                return Err(format!("master CLI session failed: {}", out.stderr.trim()));
            }
            Ok(out.stdout)
        }
        .boxed()
    }

    fn give_back(self: Box<Self>, healthy: bool) -> BoxFuture<'static, ()> {
        async move {
            let SshHost { host, conn, generation, pool } = *self;
            pool.give_back(&host, conn, generation, healthy).await;
        }
        .boxed()
    }
}

impl Hosts for SshHosts {
    fn open<'a>(&'a self, host: &'a Host, names: &'a [u8]) -> BoxFuture<'a, Opened<LiveState>> {
        async move {
            let live = host.config_path.as_str();
            let running =
                self.pool.take_running(host, &scripts::LIVE_STATE, &[live], Some(names)).await;
            let (conn, generation, state) = match running {
                Ok(c) => c,
                Err(e) => return Err(connect_failure(host, &e).await),
            };
            let state = outcome_of(ApplyStage::Upload, state).map(|out| LiveState::parse(&out));
            Ok((self.session(host, conn, generation), state))
        }
        .boxed()
    }

    fn take_kept<'a>(&'a self, host: &'a Host) -> BoxFuture<'a, Option<Box<dyn HostOps>>> {
        async move {
            let (conn, generation) = self.pool.take(host).await?;
            Some(self.session(host, conn, generation))
        }
        .boxed()
    }

    fn open_checked<'a>(&'a self, host: &'a Host) -> BoxFuture<'a, Opened<()>> {
        async move {
            let (conn, generation, out) =
                match self.pool.take_running(host, &scripts::NOOP, &[], None).await {
                    Ok(running) => running,
                    Err(e) => return Err(fail(ApplyStage::Upload, ssh_error(&e))),
                };
            let done = outcome_of(ApplyStage::Upload, out).map(|_| ());
            Ok((self.session(host, conn, generation), done))
        }
        .boxed()
    }

    fn drift_state<'a>(
        &'a self,
        host: &'a Host,
        names: &'a [u8],
    ) -> BoxFuture<'a, Result<HostFiles, String>> {
        async move {
            let args = [host.config_path.as_str(), host.master_socket.as_str()];
            let (conn, generation, out) = self
                .pool
                .take_running(host, &scripts::DRIFT_STATE, &args, Some(names))
                .await
                .map_err(|e| e.to_string())?;
            self.pool.give_back(host, conn, generation, out.is_ok()).await;
            let out = out.map_err(|e| e.to_string())?;
            if !out.success {
                return Err(out.stderr);
            }
            Ok(answer::drift_state(&out.stdout))
        }
        .boxed()
    }

    fn close_all(&self) -> BoxFuture<'_, ()> {
        self.pool.close_all().boxed()
    }

    fn keep_only<'a>(&'a self, hosts: &'a [Host]) -> BoxFuture<'a, ()> {
        self.pool.keep_only(hosts).boxed()
    }
}

/// swap_runtime's arguments after LIVE TOKEN SOCKET PID (see scripts/lib.sh): the sha256 lines
/// the host was prepared on, each map replaced whole (`KIND`) and each edited (`=KIND:COUNT`),
/// and `+crtlist` for a change of certificates.
fn swap_args(ask: &RuntimeSwap<'_>) -> Vec<String> {
    let (live, loaded) = (&ask.prepared.live, &ask.prepared.loaded);
    let whole = ask.maps.iter().map(|k| k.to_string());
    let edited = ask.edited.iter().map(|(k, n)| format!("={k}:{n}"));
    let crt_list = ask.crt_list.then(|| "+crtlist".to_owned());
    let shas = [live.clone(), loaded.clone()];
    shas.into_iter().chain(whole).chain(edited).chain(crt_list).collect()
}

/// swap_runtime failed: Stale and Swap changed nothing; anything else may have come after the
/// swap, which leaves a live file HAProxy has not loaded (reloaded at the next look).
fn runtime_swap_failure(run: Result<RemoteOutput, openssh::Error>) -> Failure {
    match outcome_of(ApplyStage::Swap, run) {
        Err(failure) => failure,
        Ok(_) => fail(ApplyStage::Swap, "swap_runtime exited 0 but was read as a failure"),
    }
}

/// A script's stdout; a non-zero exit becomes a failure of `stage` carrying its output.
/// A script that does several steps names the one that failed by its exit code.
fn outcome_of(
    stage: ApplyStage,
    run: Result<RemoteOutput, openssh::Error>,
) -> Result<String, Failure> {
    match run {
        Ok(out) if out.success => Ok(out.stdout),
        Ok(out) => {
            let exit = Exit::of(out.code);
            let stage = exit.map_or(stage, Exit::stage);
            let said = format!("{}{}", out.stdout, out.stderr);
            Err(Failure { exit, ..fail(stage, said.trim()) })
        }
        Err(e) => Err(fail(stage, ssh_error(&e))),
    }
}

/// Why the connection failed: a host key that is not the pinned one (with the fingerprints the
/// host offers, from `ssh-keyscan`), or the host not being reachable.
async fn connect_failure(host: &Host, e: &openssh::Error) -> Failure {
    let mut said = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        said.push_str(": ");
        said.push_str(&s.to_string());
        source = s.source();
    }
    if !plan::is_host_key_refusal(&said) {
        return fail(ApplyStage::Connect, said);
    }
    let offered = crate::host::conn::offered_fingerprints(host).await;
    let offered = match offered.is_empty() {
        true => "its key could not be read".to_owned(),
        false => format!("it offers {}", offered.join(", ")),
    };
    warn!(host = %host.name, %offered, "host key is not the pinned one; refused");
    fail(
        ApplyStage::HostKey,
        format!(
            "host key of {}:{} is not the one pinned in --ssh-known-hosts (unknown or changed); \
             {offered}. Refused: pin the right key to let it in. ssh said: {said}",
            host.address, host.port
        ),
    )
}

/// An SSH error with its causes, for the host's report (`ssh: failure while accessing standard
/// i/o of remote process: the host's answer to … was more than … bytes on its stderr: cut off`).
fn ssh_error(e: &openssh::Error) -> String {
    let mut text = format!("ssh: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}
