//! Child processes that die with their owner, log files, temp dirs, free ports and waiting helpers.

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{Read, Seek, SeekFrom};
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};

/// A running child process that is killed (with everything it forked) and reaped on drop.
///
/// Its stdout and stderr go to [`ChildGuard::log_path`].
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
    pid: u32,
    log: PathBuf,
}

impl std::fmt::Debug for ChildGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildGuard")
            .field("name", &self.name)
            .field("pid", &self.pid)
            .field("log", &self.log)
            .finish()
    }
}

impl ChildGuard {
    /// Spawns `cmd` with stdin from /dev/null and stdout+stderr appended to `log`.
    pub fn spawn(name: &str, cmd: &mut Command, log: &Path) -> Result<ChildGuard> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("open log file {}", log.display()))?;
        let err = out.try_clone()?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .with_context(|| format!("spawn {name}: {cmd:?}"))?;
        Ok(ChildGuard {
            name: name.to_string(),
            pid: child.id(),
            child: Some(child),
            log: log.into(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// `Some(status)` once the process has exited (it is reaped), `None` while it runs.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        match &mut self.child {
            Some(child) => child.try_wait().ok().flatten(),
            None => None,
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child.is_some() && self.try_wait().is_none()
    }

    /// Kills the process and all its descendants with SIGKILL and reaps it. Idempotent.
    ///
    /// Descendants matter: HAProxy's workers and sshd's per-connection processes outlive their
    /// parent otherwise (sshd's session processes even call `setsid`).
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        // Only while it is unreaped is its pid surely still ours to walk from.
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        let descendants = descendants(self.pid);
        let _ = child.kill();
        let _ = child.wait();
        kill_pids(&descendants);
    }

    /// Polls `ready` every 50 ms until it returns true. Fails early if the process exits, and
    /// after `timeout`; both errors carry the tail of the log.
    pub async fn wait_ready<F, Fut>(&mut self, timeout: Duration, mut ready: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                bail!(
                    "{} exited during startup ({status}); log {}:\n{}",
                    self.name,
                    self.log.display(),
                    self.log_tail(40)
                );
            }
            if ready().await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} was not ready within {timeout:?}; log {}:\n{}",
                    self.name,
                    self.log.display(),
                    self.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether a start error was caused by a port taken between [`free_port`] and the bind.
pub(crate) fn is_addr_in_use(err: &anyhow::Error) -> bool {
    format!("{err:#}").to_lowercase().contains("address already in use")
}

/// All live descendants of `pid`, found by walking `/proc/*/stat`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(p) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(ppid) = proc_stat(p).map(|(_, ppid)| ppid) {
                parents.push((p, ppid));
            }
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(parents.iter().filter(|(_, pp)| *pp == parent).map(|(p, _)| *p));
        i += 1;
    }
    found.remove(0);
    found
}

/// (state, ppid) from `/proc/<pid>/stat`.
fn proc_stat(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ppid ..."; comm may contain spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Whether a process with this pid exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    matches!(proc_stat(pid), Some((state, _)) if state != 'Z' && state != 'X')
}

fn kill_pids(pids: &[u32]) {
    let alive: Vec<String> =
        pids.iter().filter(|p| pid_alive(**p)).map(|p| p.to_string()).collect();
    if !alive.is_empty() {
        let _ = Command::new("kill")
            .arg("-KILL")
            .args(&alive)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The last `lines` lines of a file (reads at most its last 64 KiB).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return format!("<cannot open {}>", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = Vec::new();
    let _ = file.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs a command to completion; its stdout on success, an error with its stderr otherwise.
pub async fn run(cmd: &mut tokio::process::Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A temp dir that is removed on drop, unless `HAFLEET_KEEP_TMP` is set (then its path is printed).
#[derive(Debug)]
pub struct TestDir(tempfile::TempDir);

impl TestDir {
    pub fn new(prefix: &str) -> Result<TestDir> {
        Ok(TestDir(tempfile::Builder::new().prefix(prefix).tempdir().context("create temp dir")?))
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::env::var_os("HAFLEET_KEEP_TMP").is_some() {
            self.0.disable_cleanup(true);
            eprintln!("HAFLEET_KEEP_TMP: kept {}", self.0.path().display());
        }
    }
}

/// A port that was free on `ip` a moment ago (the OS picks it; another process may still race).
pub fn free_port(ip: IpAddr) -> u16 {
    free_ports::<1>(ip)[0]
}

/// `N` different ports that were free on `ip` a moment ago. Each is held until all are picked:
/// a port picked and let go at once can be picked again by the next call (two components of a
/// stack once got the same health port so, and the second could not start).
pub fn free_ports<const N: usize>(ip: IpAddr) -> [u16; N] {
    let held: [TcpListener; N] = std::array::from_fn(|_| {
        TcpListener::bind((ip, 0)).unwrap_or_else(|e| panic!("cannot bind {ip}:0: {e}"))
    });
    held.map(|l| {
        l.local_addr().map(|a| a.port()).unwrap_or_else(|e| panic!("no address for {ip}:0: {e}"))
    })
}

/// A pseudo-random u64 from time, pid and a counter (splitmix64); not for cryptography.
pub fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let mut z = (nanos as u64)
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Writes `content` to a new file at `path` only its owner reads (0600): a key or a seed.
pub fn write_private(path: &std::path::Path, content: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(content)
}

/// A random 32-hex-digit token.
pub fn random_token() -> String {
    format!("{:016x}{:016x}", random_u64(), random_u64())
}

/// A random `127.X.Y.Z` (X in 100..=250, Y in 0..=255, Z in 2..=254), so that parallel test
/// processes binding the same ports rarely collide. All of 127/8 is routed to `lo` on Linux.
pub fn random_loopback_ip() -> Ipv4Addr {
    let r = random_u64();
    let x = 100 + (r % 151) as u8;
    let y = (r >> 16) as u8;
    let z = 2 + ((r >> 32) % 253) as u8;
    Ipv4Addr::new(127, x, y, z)
}

/// Polls `f` every 50 ms until it returns true (then `true`) or `timeout` passes (then `false`).
pub async fn wait_for<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether a TCP connection to `addr` succeeds within a second.
pub async fn tcp_accepts(addr: std::net::SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_picked_together_differ() {
        let lo = std::net::Ipv4Addr::LOCALHOST.into();
        for _ in 0..50 {
            let ports = free_ports::<8>(lo);
            let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
            assert_eq!(distinct.len(), ports.len(), "{ports:?}");
            assert!(ports.iter().all(|p| *p != 0));
        }
    }
}
