//! SSH adapter (the `openssh` crate over the system's `ssh`, one multiplexed master connection
//! per host). Host keys are checked strictly against a known_hosts file the operator provides:
//! an unknown or changed key refuses the connection; nothing is ever added on the fly.

use crate::core::inventory::Host;
use crate::host::scripts::Script;
use openssh::{ControlPersist, KnownHosts, Session, SessionBuilder, Stdio};
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

/// How the applier reaches its hosts.
#[derive(Debug, Clone)]
pub struct SshSettings {
    pub identity: PathBuf,
    pub known_hosts: PathBuf,
    pub connect_timeout: Duration,
    /// Where the multiplexing control sockets live.
    pub control_dir: PathBuf,
    /// The only ssh_config `ssh` reads (see [`SshSettings::new`]).
    pub config_file: PathBuf,
    /// Longest any one remote command may take; a command still running then counts as failed.
    pub command_timeout: Duration,
}

impl SshSettings {
    /// Writes the applier's own ssh_config into `control_dir`. It trusts host keys from
    /// `known_hosts` alone: not ~/.ssh/known_hosts, not /etc/ssh/ssh_known_hosts, and it never
    /// adds one. Nothing from the user's or the system's ssh_config applies.
    pub fn new(
        identity: PathBuf,
        known_hosts: PathBuf,
        connect_timeout: Duration,
        control_dir: PathBuf,
    ) -> std::io::Result<Self> {
        let config_file = control_dir.join("ssh_config");
        let quoted = |p: &std::path::Path| format!("\"{}\"", p.display());
        std::fs::write(
            &config_file,
            format!(
                "Host *\n  StrictHostKeyChecking yes\n  UserKnownHostsFile {}\n  \
                 GlobalKnownHostsFile /dev/null\n  UpdateHostKeys no\n  IdentitiesOnly yes\n  \
                 PasswordAuthentication no\n  KbdInteractiveAuthentication no\n",
                quoted(&known_hosts)
            ),
        )?;
        Ok(SshSettings {
            identity,
            known_hosts,
            connect_timeout,
            control_dir,
            config_file,
            command_timeout: Duration::from_secs(120),
        })
    }

    /// The same settings, remote commands bounded by `timeout` (120 s unless set).
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }
}

/// The fingerprints of the keys `host` offers, read with `ssh-keyscan` and `ssh-keygen -lf -`
/// (for a report of a key that is not the pinned one); empty if they cannot be read.
pub async fn offered_fingerprints(host: &Host) -> Vec<String> {
    let scan = tokio::process::Command::new("ssh-keyscan")
        .args(["-T", "5", "-p", &host.port.to_string(), &host.address])
        .stderr(std::process::Stdio::null())
        .output();
    let Ok(Ok(scan)) = tokio::time::timeout(Duration::from_secs(10), scan).await else {
        return vec![];
    };
    let Ok(mut keygen) = tokio::process::Command::new("ssh-keygen")
        .args(["-l", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
    else {
        return vec![];
    };
    if let Some(mut stdin) = keygen.stdin.take() {
        let _ = stdin.write_all(&scan.stdout).await;
    }
    match keygen.wait_with_output().await {
        Ok(out) => crate::core::plan::fingerprints(&String::from_utf8_lossy(&out.stdout)),
        Err(_) => vec![],
    }
}

/// What a remote command did.
#[derive(Debug, Clone)]
pub struct RemoteOutput {
    pub success: bool,
    /// The exit code (None: killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// An open connection to one host.
#[derive(Debug)]
pub struct HostConn {
    session: Session,
    command_timeout: Duration,
}

impl HostConn {
    pub async fn connect(host: &Host, settings: &SshSettings) -> Result<Self, openssh::Error> {
        let mut builder = SessionBuilder::default();
        builder
            .user(host.user.clone())
            .port(host.port)
            .keyfile(&settings.identity)
            // Strict checking against --ssh-known-hosts alone is set in the generated ssh_config
            // (a path given on ssh's command line would be split at spaces).
            .known_hosts_check(KnownHosts::Strict)
            // Only the applier's own ssh_config: what reaches a host is the inventory.
            .config_file(&settings.config_file)
            .connect_timeout(settings.connect_timeout)
            .server_alive_interval(Duration::from_secs(15))
            // Kept between versions that come at least hourly; a master left behind by an
            // applier that crashed goes away by itself after an idle hour.
            .control_persist(ControlPersist::IdleFor(NonZeroUsize::new(3600).expect("non-zero")))
            .control_directory(&settings.control_dir);
        let session = builder.connect_mux(&host.address).await?;
        Ok(HostConn { session, command_timeout: settings.command_timeout })
    }

    /// Runs `script` (its [`Script::text`]) with `sh -c` on the host, `args` as `$1`, `$2`,
    /// …; each argument is quoted for the remote shell by `openssh`. `stdin` is written and closed if given. A
    /// command that has not finished within the command timeout fails (its remote process is
    /// left to the connection's end).
    pub async fn run(
        &self,
        script: &Script,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<RemoteOutput, openssh::Error> {
        match tokio::time::timeout(self.command_timeout, self.run_unbounded(script, args, stdin))
            .await
        {
            Ok(result) => result,
            Err(_) => Err(openssh::Error::ChildIo(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "remote command did not finish within {} s",
                    self.command_timeout.as_secs()
                ),
            ))),
        }
    }

    async fn run_unbounded(
        &self,
        script: &Script,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<RemoteOutput, openssh::Error> {
        let started = std::time::Instant::now();
        let mut cmd = self.session.command("sh");
        cmd.arg("-c").arg(script.text()).arg("hafleet").args(args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child = cmd.spawn().await?;
        let pipe = stdin.map(|bytes| (child.stdin().take().expect("stdin is piped"), bytes));
        let (fed, out) = fed_while(pipe, capped_output(child, script.name)).await;
        let out = out?;
        // A script that failed says why on stderr (it may stop reading at once); one that
        // succeeded without reading all it was given is an error of its own.
        if let (Err(e), true) = (fed, out.status.success()) {
            return Err(openssh::Error::ChildIo(e));
        }
        tracing::debug!(
            ms = started.elapsed().as_secs_f64() * 1000.0,
            script = script.name,
            "remote command"
        );
        Ok(RemoteOutput {
            success: out.status.success(),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Whether the connection still works (a master that does not answer within 5 s does not).
    pub async fn alive(&self) -> bool {
        matches!(
            tokio::time::timeout(Duration::from_secs(5), self.session.check()).await,
            Ok(Ok(()))
        )
    }

    pub async fn close(self) {
        let _ = self.session.close().await;
    }
}

/// A pooled connection's key: the host's name and where it is reached, so that a host whose
/// address, port or user changed (an inventory re-read) never gets the old machine's session.
fn pool_key(host: &Host) -> String {
    format!("{}\n{}@{}:{}", host.name, host.user, host.address, host.port)
}

/// Open connections kept between versions, one per host: a rollout then costs no SSH
/// handshake. A pooled connection must run the rollout's first (read-only) command on its host
/// within the connect timeout to be reused, else the command runs again on a new connection (a
/// host that went away since shows up as unreachable, not as a failed upload); a connection is
/// closed after any failed apply. When the known_hosts file's contents change, every
/// connection is closed, including ones in use at that moment, so a revoked or rotated host key
/// takes effect at the next rollout.
#[derive(Debug)]
pub struct ConnPool {
    settings: SshSettings,
    conns: Mutex<HashMap<String, (u64, HostConn)>>,
    /// The known_hosts contents connections were made under, and a generation that goes up
    /// each time they change.
    known_hosts: Mutex<(Option<Vec<u8>>, u64)>,
}

impl ConnPool {
    pub fn new(settings: SshSettings) -> Self {
        ConnPool { settings, conns: Mutex::default(), known_hosts: Mutex::default() }
    }

    /// A working connection to `host`, the known_hosts generation it belongs to, and what
    /// `script` (read-only: it may run twice, with `stdin` each time) printed there. The
    /// pooled connection is used if the host answers `script` over it within the connect
    /// timeout (so the check costs no round trip of its own); otherwise `script` runs on a new
    /// connection. `Err` only if no connection could be made.
    pub async fn take_running(
        &self,
        host: &Host,
        script: &Script,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<(HostConn, u64, Result<RemoteOutput, openssh::Error>), openssh::Error> {
        let generation = self.known_hosts_generation().await;
        let pooled = self.conns.lock().await.remove(&pool_key(host));
        if let Some((conn_generation, conn)) = pooled {
            if conn_generation == generation {
                let first = conn.run(script, args, stdin);
                if let Ok(Ok(out)) =
                    tokio::time::timeout(self.settings.connect_timeout, first).await
                {
                    return Ok((conn, generation, Ok(out)));
                }
            }
            conn.close().await;
        }
        let conn = HostConn::connect(host, &self.settings).await?;
        let out = conn.run(script, args, stdin).await;
        Ok((conn, generation, out))
    }

    /// The connection kept to `host`, if one of the current known_hosts generation is, as it
    /// is: nothing is run to check it (its first command fails if it died meanwhile).
    pub async fn take(&self, host: &Host) -> Option<(HostConn, u64)> {
        let generation = self.known_hosts_generation().await;
        let (conn_generation, conn) = self.conns.lock().await.remove(&pool_key(host))?;
        if conn_generation != generation {
            conn.close().await;
            return None;
        }
        Some((conn, generation))
    }

    /// Returns a connection after a successful apply made under `generation`; closes it after
    /// a failed one, or if known_hosts changed meanwhile.
    pub async fn give_back(&self, host: &Host, conn: HostConn, generation: u64, healthy: bool) {
        let current = self.known_hosts.lock().await.1;
        if healthy && generation == current {
            self.conns.lock().await.insert(pool_key(host), (generation, conn));
        } else {
            conn.close().await;
        }
    }

    /// Reads known_hosts; if its contents changed, closes every pooled connection and starts a
    /// new generation.
    async fn known_hosts_generation(&self) -> u64 {
        let contents = std::fs::read(&self.settings.known_hosts).ok();
        let mut known = self.known_hosts.lock().await;
        if known.0 != contents {
            known.0 = contents;
            known.1 += 1;
            let stale: Vec<HostConn> =
                self.conns.lock().await.drain().map(|(_, (_, c))| c).collect();
            for conn in stale {
                conn.close().await;
            }
        }
        known.1
    }

    /// Closes the connections to anything but `hosts` as they are now.
    pub async fn keep_only(&self, hosts: &[Host]) {
        let keys: std::collections::HashSet<String> = hosts.iter().map(pool_key).collect();
        let stale: Vec<HostConn> = {
            let mut conns = self.conns.lock().await;
            let gone: Vec<String> = conns.keys().filter(|k| !keys.contains(*k)).cloned().collect();
            gone.into_iter().filter_map(|k| conns.remove(&k)).map(|(_, c)| c).collect()
        };
        for conn in stale {
            conn.close().await;
        }
    }

    /// Closes every connection (at shutdown).
    pub async fn close_all(&self) {
        let all: Vec<HostConn> = self.conns.lock().await.drain().map(|(_, (_, c))| c).collect();
        for conn in all {
            conn.close().await;
        }
    }
}

/// Writes `bytes` to `stdin` and closes it while `done` (the command's end, its output read)
/// runs, and gives how the writing went with `done`'s result. Fed while the output is read: a
/// script that answers as it reads (live_state.sh's names) would otherwise fill its stdout while
/// this side still writes its stdin. Once the command has ended, the writing is not waited
/// for: a write still blocked then never ends if something else keeps the pipe open (an ssh
/// master, say), so it counts as input the command did not read.
/// The most a remote command may print on its stdout, and on its stderr: hafleet's scripts
/// answer in kilobytes (a `show` of 10,000 servers' state in a few megabytes), and a host
/// that says more (a compromised one, streaming without end) is cut off there, not read whole
/// into the applier's memory.
pub const MAX_ANSWER_BYTES: usize = 32 << 20;

/// What a remote command printed and how it ended.
struct Output {
    status: std::process::ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Waits for `child`, reading its stdout and stderr together, each up to
/// [`MAX_ANSWER_BYTES`]: one that says more fails the command at once (the pipes closed, the
/// remote process gets SIGPIPE on its next write), and the host with it.
async fn capped_output(
    mut child: openssh::Child<&Session>,
    script: &str,
) -> Result<Output, openssh::Error> {
    let (stdout, stderr) = tokio::try_join!(
        read_capped(child.stdout().take(), MAX_ANSWER_BYTES, (script, "stdout")),
        read_capped(child.stderr().take(), MAX_ANSWER_BYTES, (script, "stderr")),
    )
    .map_err(openssh::Error::ChildIo)?;
    let status = child.wait().await?;
    Ok(Output { status, stdout, stderr })
}

/// Reads `pipe` to its end, up to `cap` bytes; more is an error naming the script and the
/// pipe (`what`).
async fn read_capped<R: tokio::io::AsyncRead + Unpin>(
    pipe: Option<R>,
    cap: usize,
    (script, what): (&str, &str),
) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    if let Some(mut pipe) = pipe {
        AsyncReadExt::take(&mut pipe, cap as u64 + 1).read_to_end(&mut buf).await?;
    }
    if buf.len() > cap {
        return Err(std::io::Error::other(format!(
            "the host's answer to {script} was more than {} bytes on its {what}: cut off",
            cap
        )));
    }
    Ok(buf)
}

async fn fed_while<W, T>(
    stdin: Option<(W, &[u8])>,
    done: impl std::future::Future<Output = T>,
) -> (std::io::Result<()>, T)
where
    W: tokio::io::AsyncWrite + Unpin,
{
    let feed = async {
        let Some((mut pipe, bytes)) = stdin else { return Ok(()) };
        pipe.write_all(bytes).await?;
        pipe.shutdown().await
    };
    tokio::pin!(feed, done);
    tokio::select! {
        biased;
        fed = &mut feed => (fed, done.await),
        out = &mut done => {
            // What the feed can still finish at once (closing the pipe after its last write)
            // it finishes here: a timeout of zero polls it once.
            let fed = match tokio::time::timeout(Duration::ZERO, &mut feed).await {
                Ok(fed) => fed,
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "the remote command ended before reading all its input",
                )),
            };
            (fed, out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{fed_while, read_capped};

    /// An answer of the cap is read whole; one byte more is an error that names the script and
    /// the pipe, and nothing beyond the cap is read.
    #[tokio::test]
    async fn an_answer_longer_than_the_cap_is_cut_off() {
        let long = vec![b'x'; 4096];
        let whole = read_capped(Some(&long[..1024]), 1024, ("validate", "stdout")).await;
        assert_eq!(whole.unwrap().len(), 1024);
        let err = read_capped(Some(long.as_slice()), 1024, ("validate", "stderr")).await;
        let err = err.unwrap_err().to_string();
        assert!(err.contains("validate") && err.contains("1024 bytes on its stderr"), "{err}");
        assert!(read_capped(None::<&[u8]>, 1024, ("x", "stdout")).await.unwrap().is_empty());
    }
    use std::process::Stdio;
    use std::time::Duration;

    /// A command that reads all it is given, and one that ends without reading while a
    /// process it left behind keeps its stdin open (as an ssh master may): the first is fed
    /// whole; the second's end is not held up by the blocked write, which counts as unread.
    #[tokio::test]
    async fn a_command_that_ends_without_reading_does_not_hold_the_call() {
        let input = vec![b'x'; 1 << 20];
        let run = |script: &str| {
            let mut cmd = tokio::process::Command::new("sh");
            cmd.arg("-c").arg(script).stdin(Stdio::piped()).stdout(Stdio::piped());
            cmd.stderr(Stdio::null()).kill_on_drop(true);
            cmd.spawn().unwrap()
        };
        let mut reads = run("wc -c");
        let pipe = reads.stdin.take().map(|p| (p, input.as_slice()));
        let (fed, out) = fed_while(pipe, reads.wait_with_output()).await;
        assert!(fed.is_ok());
        assert_eq!(String::from_utf8_lossy(&out.unwrap().stdout).trim(), "1048576");

        // The left-behind reader holds stdin for 30 s and nothing else; the bound below only
        // tells a hang (30 s) from an answer.
        // (sh gives a background job /dev/null as stdin unless told otherwise.)
        let mut leaves = run("exec 3<&0; sleep 30 <&3 >/dev/null 2>&1 & echo $!; exit 0");
        let pipe = leaves.stdin.take().map(|p| (p, input.as_slice()));
        let call = fed_while(pipe, leaves.wait_with_output());
        let (fed, out) = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("the call waited for the blocked write");
        let out = out.unwrap();
        let sleeper = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let _ = std::process::Command::new("kill").arg(&sleeper).status();
        assert!(out.status.success());
        let err = fed.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe, "{err}");
    }
}
