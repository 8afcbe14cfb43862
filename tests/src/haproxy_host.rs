//! One "HAProxy host", as a real edge VM would be: its own sshd and its own HAProxy in
//! master-worker mode, both on loopback, logged in to and run as user `hafleet-host`.
//!
//! # HAProxy 2.6 master CLI, as observed (2.6.12-1+deb12u4)
//! `show proc` on the master socket, fresh start:
//! ```text
//! #<PID>          <type>          <reloads>       <uptime>        <version>
//! 16114           master          0 [failed: 0]   0d00h00m01s     2.6.12-1+deb12u4
//! # workers
//! 16117           worker          0               0d00h00m01s     2.6.12-1+deb12u4
//! # programs
//!
//! ```
//! - `reload` prints nothing (2.7+ prints a status; 2.6 does not) and returns at once. The master
//!   re-executes itself: for ~50 ms afterwards connecting to the socket fails with ECONNREFUSED,
//!   so callers must retry. After a good reload: `master 1 [failed: 0]`, a new worker pid with
//!   reloads `0`.
//! - A reload with a broken config: `master 2 [failed: 1]`; the old worker keeps serving and its
//!   `<reloads>` column becomes `1` (the reloads it has survived). The error is only in the
//!   master's stderr (`[ALERT] ... config : parsing [...]`, `[WARNING] ... Loading failure!`),
//!   not on the CLI (`show startup-logs` does not exist in 2.6 on the master CLI).
//! - The `[failed: N]` counter is reset to 0 by the next successful reload (observed
//!   `2 [failed: 1]` -> `3 [failed: 0]`), so "did my reload fail" must be judged from one
//!   reload's before/after, e.g. `reloads` went up by one and `failed` is not 0.
//! - Workers still draining connections after a reload are listed under a `# old workers`
//!   header (with reloads `1`) until they exit.
//! - Over SSH as `hafleet-host`, `PATH` is sshd's default (`/usr/local/bin:/usr/bin:/bin:/usr/games`
//!   on Debian), without `/usr/sbin`: run `/usr/sbin/haproxy -c -f ...` by absolute path.
//!
//! # HAProxy 3.0 (3.0.11, `HAFLEET_HAPROXY`), where it differs, as observed
//! - `show proc` has the same columns and the same counters: after a refused reload
//!   `master 1 [failed: 1]`, and the old worker's `<reloads>` is `1`.
//! - `reload` waits for the outcome and prints it, then the startup logs:
//!   ```text
//!   Success=0
//!   --
//!   [NOTICE]   (32072) : haproxy version is 3.0.11-9e587df
//!   [ALERT]    (32072) : [/path/haproxy.main()] Cannot raise FD limit to 2000053, limit is 20000.
//!   [WARNING]  (32072) : Loading failure!
//!   ```
//!   (`Success=1` after a good one); `show startup-logs` works on the master CLI.
//! - `haproxy -c` prints nothing for a valid config (2.6: `Configuration file is valid`).
//! - The fd table is mapped and filled for `maxconn` before the FD limit is checked: a
//!   `maxconn 100000000` reload takes 7 to 20 s and 12.5 GB before it fails (2.6 fails at
//!   once), with the master CLI refusing connections all the while.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::proc::{
    ChildGuard, TestDir, free_port, free_ports, is_addr_in_use, random_loopback_ip, run,
    tcp_accepts,
};

/// The user SSH logs in as and HAProxy runs as (when the tests run as root).
pub const HOST_USER: &str = "hafleet-host";
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Set, the test hosts (and the demo's) run this HAProxy binary instead of Debian's
/// `/usr/sbin/haproxy` (2.6): for instance the 3.0 that `tests/setup.sh` builds,
/// `HAFLEET_HAPROXY=$HAFLEET_HAPROXY30`. The applier's inventory names the same binary for
/// `haproxy -c`.
pub const HOST_HAPROXY: &str = "HAFLEET_HAPROXY";

/// The HAProxy binary the test hosts run: `$HAFLEET_HAPROXY`, else Debian's.
pub fn host_haproxy() -> PathBuf {
    match std::env::var_os(HOST_HAPROXY) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ if Path::new("/usr/sbin/haproxy").exists() => PathBuf::from("/usr/sbin/haproxy"),
        _ => PathBuf::from("haproxy"),
    }
}

/// Set, the test hosts' HAProxy runs with its value as `GLIBC_TUNABLES` (for instance
/// `glibc.malloc.hugetlb=1`, the advice of docs/install.md, "For big fleets").
pub const HOST_GLIBC_TUNABLES: &str = "HAFLEET_TEST_HOST_GLIBC_TUNABLES";

/// The client side of SSH for one test env: an ed25519 identity and a known_hosts file that
/// every [`HaproxyHost`] started with these keys pins its host key in.
#[derive(Debug, Clone)]
pub struct SshClientKeys {
    pub identity: PathBuf,
    pub known_hosts: PathBuf,
}

impl SshClientKeys {
    /// Generates `dir/id_ed25519` (+ `.pub`, no passphrase, 0600) and an empty `dir/known_hosts`.
    pub fn generate(dir: &Path) -> Result<SshClientKeys> {
        let identity = dir.join("id_ed25519");
        ssh_keygen(&identity)?;
        let known_hosts = dir.join("known_hosts");
        std::fs::write(&known_hosts, "")?;
        Ok(SshClientKeys { identity, known_hosts })
    }

    /// The public key line (`ssh-ed25519 AAAA... comment`).
    pub fn public_key(&self) -> Result<String> {
        Ok(std::fs::read_to_string(self.identity.with_extension("pub"))?.trim().to_string())
    }
}

fn ssh_keygen(path: &Path) -> Result<()> {
    let out = Command::new("ssh-keygen")
        .args(["-t", "ed25519", "-N", "", "-q", "-C", "hafleet-tests", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .context("run ssh-keygen (install openssh-client with tests/setup.sh)")?;
    if !out.status.success() {
        bail!("ssh-keygen -f {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// Serializes edits of known_hosts files within this process.
static KNOWN_HOSTS: Mutex<()> = Mutex::new(());

/// The account the host runs as: `hafleet-host` when we are root, else the current user.
#[derive(Debug, Clone)]
struct HostUser {
    name: String,
    uid: u32,
    gid: u32,
    root: bool,
}

impl HostUser {
    fn get() -> Result<HostUser> {
        static USER: OnceLock<std::result::Result<HostUser, String>> = OnceLock::new();
        USER.get_or_init(|| HostUser::lookup().map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(|e| anyhow!(e))
    }

    fn lookup() -> Result<HostUser> {
        let root = id(&["-u"])? == 0;
        if !root {
            let name = String::from_utf8(Command::new("id").arg("-un").output()?.stdout)?;
            return Ok(HostUser {
                name: name.trim().into(),
                uid: id(&["-u"])?,
                gid: id(&["-g"])?,
                root,
            });
        }
        let uid = id(&["-u", HOST_USER]).with_context(|| {
            format!("user {HOST_USER} does not exist: run `bash tests/setup.sh` (as root)")
        })?;
        unlock_account()?;
        Ok(HostUser { name: HOST_USER.into(), uid, gid: id(&["-g", HOST_USER])?, root })
    }
}

/// [`host_haproxy`] by a path `user` can execute. A binary given in `HAFLEET_HAPROXY` may sit
/// where only root reaches it (tests/setup.sh caches 3.0 under root's home, mode 0700): when
/// the hosts run as another user, it is hard-linked (else copied) into the host's folder `dir`.
fn reachable_haproxy(dir: &Path, user: &HostUser) -> Result<PathBuf> {
    let bin = host_haproxy();
    if !user.root || std::env::var_os(HOST_HAPROXY).is_none() {
        return Ok(bin);
    }
    let local = dir.join("haproxy");
    let linked = std::fs::hard_link(&bin, &local).is_ok()
        && std::fs::metadata(&local)?.permissions().mode() & 0o005 == 0o005;
    if !linked {
        let _ = std::fs::remove_file(&local);
        std::fs::copy(&bin, &local)
            .with_context(|| format!("copy {HOST_HAPROXY}={} for the hosts", bin.display()))?;
        std::fs::set_permissions(&local, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(local)
}

fn id(args: &[&str]) -> Result<u32> {
    let out = Command::new("id").args(args).output().context("run id")?;
    if !out.status.success() {
        bail!("id {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8(out.stdout)?.trim().parse()?)
}

/// `useradd --system` leaves the password field `!`, which sshd (with `UsePAM no`) treats as a
/// locked account and refuses even public-key logins ("account is locked"). `*` means "no
/// password" without being locked.
fn unlock_account() -> Result<()> {
    for _ in 0..20 {
        let out = Command::new("getent").args(["shadow", HOST_USER]).output()?;
        let entry = String::from_utf8_lossy(&out.stdout);
        if !entry.split(':').nth(1).unwrap_or("").starts_with('!') {
            return Ok(());
        }
        // Another test process may hold the lock on /etc/shadow; then check again.
        let _ = Command::new("usermod").args(["-p", "*", HOST_USER]).output();
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("cannot unlock account {HOST_USER} (usermod -p '*' {HOST_USER})")
}

/// The state the master CLI's `show proc` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShowProc {
    pub master_pid: u32,
    /// Reloads since the master started, successful or not.
    pub reloads: u32,
    /// Failed reloads since the last successful one (HAProxy 2.6 resets it on success).
    pub failed: u32,
    pub workers: Vec<u32>,
    pub old_workers: Vec<u32>,
}

/// Parses HAProxy's `show proc` (2.6 and 3.0 alike; see the module docs for the format).
pub fn parse_show_proc(text: &str) -> Result<ShowProc> {
    let mut master = None;
    let (mut workers, mut old_workers) = (Vec::new(), Vec::new());
    let mut section = "";
    for line in text.lines() {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('#') {
            section = match header.trim() {
                "workers" => "workers",
                "old workers" => "old workers",
                _ => "",
            };
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [pid, "master", reloads, "[failed:", failed, ..] => {
                master =
                    Some((pid.parse()?, reloads.parse()?, failed.trim_end_matches(']').parse()?));
            }
            [pid, "worker", ..] if section == "workers" => workers.push(pid.parse()?),
            [pid, "worker", ..] if section == "old workers" => old_workers.push(pid.parse()?),
            _ => {}
        }
    }
    let (master_pid, reloads, failed) =
        master.ok_or_else(|| anyhow!("no master line in `show proc` output: {text:?}"))?;
    Ok(ShowProc { master_pid, reloads, failed, workers, old_workers })
}

/// sshd + HAProxy (master-worker) for one simulated edge host; both killed on drop, and its
/// line removed from the shared known_hosts file.
pub struct HaproxyHost {
    name: String,
    user: HostUser,
    keys: SshClientKeys,
    http_addr: SocketAddrV4,
    https_addr: SocketAddrV4,
    ssh_port: u16,
    /// The HAProxy binary, by a path the host user can reach (see [`HaproxyHost::haproxy_bin`]).
    haproxy_bin: PathBuf,
    haproxy: Option<ChildGuard>,
    sshd: Option<ChildGuard>,
    dir: PathBuf,
    _tmp: TestDir,
}

impl std::fmt::Debug for HaproxyHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HaproxyHost")
            .field("name", &self.name)
            .field("ssh_port", &self.ssh_port)
            .field("http_addr", &self.http_addr)
            .field("dir", &self.dir)
            .finish()
    }
}

impl HaproxyHost {
    /// Starts HAProxy with a bootstrap config answering 404 on a random `127.X.Y.Z:port`, then
    /// sshd on `127.0.0.1:<free port>` with `SetEnv HAFLEET_HTTP_BIND=<that address>`, pins its
    /// host key in `keys.known_hosts`, and waits until a real `ssh` login works.
    pub async fn start(name: &str, keys: &SshClientKeys) -> Result<HaproxyHost> {
        let user = HostUser::get()?;
        let tmp = TestDir::new("hafleet-host-")?;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))?;
        let dir = tmp.path().join(name);
        std::fs::create_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
        let ip = random_loopback_ip();
        let [http, https] = free_ports::<2>(ip.into());
        let mut host = HaproxyHost {
            name: name.to_string(),
            http_addr: SocketAddrV4::new(ip, http),
            https_addr: SocketAddrV4::new(ip, https),
            ssh_port: free_port(Ipv4Addr::LOCALHOST.into()),
            haproxy_bin: reachable_haproxy(&dir, &user)?,
            user,
            keys: keys.clone(),
            haproxy: None,
            sshd: None,
            dir,
            _tmp: tmp,
        };
        host.chown(&host.dir)?;
        ssh_keygen(&host.dir.join("ssh_host_ed25519_key"))?;
        std::fs::write(host.dir.join("authorized_keys"), format!("{}\n", keys.public_key()?))?;
        std::fs::write(host.config_path(), BOOTSTRAP_CONFIG)?;
        host.chown(&host.config_path())?;

        for attempt in 1.. {
            match host.start_haproxy().await {
                Err(e) if attempt < 3 && is_addr_in_use(&e) => {
                    let ip = random_loopback_ip();
                    let [http, https] = free_ports::<2>(ip.into());
                    host.http_addr = SocketAddrV4::new(ip, http);
                    host.https_addr = SocketAddrV4::new(ip, https);
                }
                result => {
                    result?;
                    break;
                }
            }
        }
        for attempt in 1.. {
            match host.start_sshd().await {
                Err(e) if attempt < 3 && is_addr_in_use(&e) => {
                    host.ssh_port = free_port(Ipv4Addr::LOCALHOST.into());
                }
                result => {
                    result?;
                    break;
                }
            }
        }
        Ok(host)
    }

    fn chown(&self, path: &Path) -> Result<()> {
        if self.user.root {
            std::os::unix::fs::chown(path, Some(self.user.uid), Some(self.user.gid))
                .with_context(|| format!("chown {} to {}", path.display(), self.user.name))?;
        }
        Ok(())
    }

    /// (Re)starts sshd on [`HaproxyHost::ssh_port`] and waits until `ssh ... true` succeeds.
    pub async fn start_sshd(&mut self) -> Result<()> {
        self.stop_sshd();
        let config = format!(
            "Port {port}\n\
             ListenAddress 127.0.0.1\n\
             HostKey {dir}/ssh_host_ed25519_key\n\
             PidFile {dir}/sshd.pid\n\
             AuthorizedKeysFile {dir}/authorized_keys\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             PubkeyAuthentication yes\n\
             UsePAM no\n\
             StrictModes no\n\
             AllowUsers {user}\n\
             PermitRootLogin no\n\
             SetEnv HAFLEET_HTTP_BIND={bind} HAFLEET_HTTPS_BIND={https} HAFLEET_METRICS_ADDR={ip} HAFLEET_TCP_ADDR={ip}\n\
             LogLevel ERROR\n\
             MaxStartups 100\n\
             MaxSessions 100\n\
             Subsystem sftp internal-sftp\n",
            port = self.ssh_port,
            dir = self.dir.display(),
            user = self.user.name,
            bind = self.http_addr,
            https = self.https_addr,
            ip = self.http_addr.ip(),
        );
        let config_path = self.dir.join("sshd_config");
        std::fs::write(&config_path, config)?;
        if self.user.root {
            std::fs::create_dir_all("/run/sshd")?;
            std::fs::set_permissions("/run/sshd", std::fs::Permissions::from_mode(0o755))?;
        }
        let mut cmd = Command::new("/usr/sbin/sshd");
        cmd.arg("-D").arg("-e").arg("-f").arg(&config_path);
        let mut sshd = ChildGuard::spawn("sshd", &mut cmd, &self.dir.join("sshd.log"))?;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.ssh_port));
        sshd.wait_ready(READY_TIMEOUT, || tcp_accepts(addr)).await?;
        self.pin_host_key()?;
        sshd.wait_ready(READY_TIMEOUT, || async { self.ssh("true").await.is_ok() })
            .await
            .with_context(|| {
                format!("ssh login to {} (last try: {:?})", self.name, ssh_error(self))
            })?;
        self.sshd = Some(sshd);
        Ok(())
    }

    /// Adds `[127.0.0.1]:<port> ssh-ed25519 AAAA...` to the known_hosts file (once).
    fn pin_host_key(&self) -> Result<()> {
        let pubkey = std::fs::read_to_string(self.dir.join("ssh_host_ed25519_key.pub"))?;
        let mut parts = pubkey.split_whitespace();
        let (kind, key) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
        let line = format!("{} {kind} {key}\n", self.known_hosts_pattern());
        let _guard = KNOWN_HOSTS.lock().unwrap_or_else(|e| e.into_inner());
        let current = std::fs::read_to_string(&self.keys.known_hosts).unwrap_or_default();
        if !current.lines().any(|l| format!("{l}\n") == line) {
            // One write with O_APPEND, so other processes sharing the file do not interleave.
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.keys.known_hosts)?
                .write_all(line.as_bytes())?;
        }
        Ok(())
    }

    fn known_hosts_pattern(&self) -> String {
        format!("[127.0.0.1]:{}", self.ssh_port)
    }

    fn unpin_host_key(&self) {
        let _guard = KNOWN_HOSTS.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(current) = std::fs::read_to_string(&self.keys.known_hosts) else { return };
        let prefix = format!("{} ", self.known_hosts_pattern());
        let kept: String =
            current.lines().filter(|l| !l.starts_with(&prefix)).map(|l| format!("{l}\n")).collect();
        if kept != current {
            let _ = std::fs::write(&self.keys.known_hosts, kept);
        }
    }

    /// (Re)starts HAProxy as the host user with the current `haproxy.cfg`, and waits until the
    /// HTTP port accepts connections and the master CLI answers.
    pub async fn start_haproxy(&mut self) -> Result<()> {
        self.kill_haproxy();
        let wrapper = self.write_wrapper(&self.haproxy_bin.display().to_string())?;
        let mut cmd = Command::new(&wrapper);
        cmd.arg("-W")
            .arg("-S")
            .arg(format!("{},mode,600", self.master_socket().display()))
            .arg("-f")
            .arg(self.config_path())
            .arg("-p")
            .arg(self.dir.join("haproxy.pid"))
            .current_dir(&self.dir)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", &self.dir)
            .env("HAFLEET_HTTP_BIND", self.http_addr.to_string())
            .env("HAFLEET_HTTPS_BIND", self.https_addr.to_string())
            .env("HAFLEET_METRICS_ADDR", self.http_addr.ip().to_string())
            .env("HAFLEET_TCP_ADDR", self.http_addr.ip().to_string());
        // A host set up as docs/install.md's "For big fleets" says (its heap on transparent huge
        // pages), for a bench run. Unset, a host runs as a fresh install's would.
        if let Some(tunables) = std::env::var_os(HOST_GLIBC_TUNABLES) {
            cmd.env("GLIBC_TUNABLES", tunables);
        }
        if self.user.root {
            cmd.uid(self.user.uid).gid(self.user.gid);
        }
        let _ = std::fs::remove_file(self.master_socket());
        let mut child = ChildGuard::spawn("haproxy", &mut cmd, &self.dir.join("haproxy.log"))?;
        let http = SocketAddr::V4(self.http_addr);
        let socket = self.master_socket();
        child
            .wait_ready(READY_TIMEOUT, || {
                let socket = socket.clone();
                async move { tcp_accepts(http).await && socket.exists() }
            })
            .await?;
        self.haproxy = Some(child);
        // The socket file can exist a moment before the master answers on it (an empty
        // answer): ask again, for at most a second.
        let mut answer = self.show_proc();
        for _ in 0..50 {
            if answer.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            answer = self.show_proc();
        }
        answer.context("master CLI after start")?;
        Ok(())
    }

    /// The script HAProxy starts through, which its master runs again at each reload (it
    /// re-executes its own `argv[0]`): it counts HAProxy's starts in [`Self::haproxy_execs`]
    /// and, while [`Self::hold_reloads`] says so, makes a reload wait before HAProxy reads
    /// the config, as a slow reload of a big config would. The first start is never held.
    fn write_wrapper(&self, haproxy: &str) -> Result<PathBuf> {
        let path = self.dir.join("haproxy-wrapper");
        // Builtins only, but for the hold's `sleep`: the master execs this with whatever
        // signals it had blocked, and a shell that forks (`$(dirname …)`) then waits on a
        // child whose end it may never hear of.
        let script = format!(
            "#!/bin/bash\n\
             d=${{0%/*}}\n\
             if [ \"${{HAFLEET_TEST_RELOAD:-}}\" = 1 ] && [ -f \"$d/hold-reloads\" ]; then read -r hold < \"$d/hold-reloads\"; sleep \"$hold\"; fi\n\
             export HAFLEET_TEST_RELOAD=1\n\
             echo exec >> \"$d/haproxy-execs\"\n\
             exec -a \"$0\" {haproxy} \"$@\"\n"
        );
        std::fs::write(&path, script)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        let execs = self.dir.join("haproxy-execs");
        std::fs::OpenOptions::new().create(true).append(true).open(&execs)?;
        self.chown(&execs)?;
        Ok(path)
    }

    /// How many times HAProxy started on this host, its master's re-executions at reloads
    /// included: a reload held by [`Self::hold_reloads`] counts once the hold is over.
    pub fn haproxy_execs(&self) -> Result<usize> {
        Ok(std::fs::read_to_string(self.dir.join("haproxy-execs"))?.lines().count())
    }

    /// From now on, each reload waits this long before HAProxy reads its config (`None`: no
    /// longer), while the old worker serves on.
    pub fn hold_reloads(&self, hold: Option<std::time::Duration>) -> Result<()> {
        let path = self.dir.join("hold-reloads");
        match hold {
            Some(hold) => std::fs::write(&path, format!("{:.3}\n", hold.as_secs_f64()))?,
            None => {
                let _ = std::fs::remove_file(&path);
            }
        }
        Ok(())
    }

    /// Kills HAProxy's master and workers (SIGKILL), as a crash would.
    pub fn kill_haproxy(&mut self) {
        drop(self.haproxy.take());
    }

    /// Kills sshd and every SSH session it spawned, as if the host went away.
    pub fn stop_sshd(&mut self) {
        drop(self.sshd.take());
    }

    pub fn haproxy_running(&mut self) -> bool {
        self.haproxy.as_mut().is_some_and(|c| c.is_running())
    }

    pub fn sshd_running(&mut self) -> bool {
        self.sshd.as_mut().is_some_and(|c| c.is_running())
    }

    /// The HAProxy master's pid, while it runs.
    pub fn haproxy_pid(&self) -> Option<u32> {
        self.haproxy.as_ref().map(|c| c.pid())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The HAProxy binary this host runs ([`host_haproxy`]), by a path its user can reach:
    /// what the applier's inventory names as `haproxy_bin`.
    pub fn haproxy_bin(&self) -> &Path {
        &self.haproxy_bin
    }

    /// The version the master says it runs (the last column of its `show proc` line), e.g.
    /// `2.6.12-1+deb12u4` or `3.0.11-9e587df`.
    pub fn haproxy_version(&self) -> Result<String> {
        let text = self.master_cli("show proc")?;
        text.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.get(1) == Some(&"master"))
            .and_then(|f| f.last().map(|v| v.to_string()))
            .ok_or_else(|| anyhow!("no master line in `show proc` output: {text:?}"))
    }

    pub fn ssh_port(&self) -> u16 {
        self.ssh_port
    }

    /// Always `127.0.0.1`.
    pub fn ssh_host(&self) -> IpAddr {
        Ipv4Addr::LOCALHOST.into()
    }

    /// `hafleet-host` (or the current user when not running as root).
    pub fn ssh_user(&self) -> &str {
        &self.user.name
    }

    pub fn keys(&self) -> &SshClientKeys {
        &self.keys
    }

    /// Where HAProxy serves HTTP; also `$HAFLEET_HTTP_BIND` for HAProxy and SSH sessions.
    pub fn http_addr(&self) -> SocketAddr {
        SocketAddr::V4(self.http_addr)
    }

    /// Where HAProxy serves HTTPS once a version has certificates; `$HAFLEET_HTTPS_BIND`.
    pub fn https_addr(&self) -> SocketAddr {
        SocketAddr::V4(self.https_addr)
    }

    /// `<dir>/haproxy.cfg`, owned by the host user; the file HAProxy loads on every reload.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("haproxy.cfg")
    }

    /// `<dir>/master.sock`: the master CLI (mode 600, owned by the host user).
    pub fn master_socket(&self) -> PathBuf {
        self.dir.join("master.sock")
    }

    /// The host's directory (owned by the host user); logs are `haproxy.log` and `sshd.log`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn haproxy_log(&self) -> PathBuf {
        self.dir.join("haproxy.log")
    }

    pub fn sshd_log(&self) -> PathBuf {
        self.dir.join("sshd.log")
    }

    /// The config file as it is now on the host.
    /// The live config and, after it, every map file it names (each once per mention).
    pub fn live_config(&self) -> String {
        let config = std::fs::read_to_string(self.config_path())
            .unwrap_or_else(|e| panic!("read {}: {e}", self.config_path().display()));
        // Then every map file it names, so routes (which live in the maps) show in the text.
        let mut out = config.clone();
        for word in config.split(|c: char| c == '(' || c == ')' || c == ',' || c.is_whitespace()) {
            if word.starts_with("hafleet-maps/") && word.ends_with(".map") {
                let path = self.config_path().with_file_name(word);
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
                out.push_str(&format!("\n----- {word} -----\n{text}"));
            }
        }
        out
    }

    /// Sends one command to the master CLI with `socat` and returns its output. Retries for up
    /// to 3 s while the socket refuses connections (it does for ~50 ms after each `reload`).
    pub fn master_cli(&self, cmd: &str) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let mut child = Command::new("socat")
                .arg("stdio")
                .arg(format!("unix-connect:{}", self.master_socket().display()))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .context("run socat (install it with tests/setup.sh)")?;
            if let Some(mut stdin) = child.stdin.take() {
                let _ = stdin.write_all(format!("{cmd}\n").as_bytes());
            }
            let out = child.wait_with_output()?;
            if out.status.success() {
                return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
            }
            if Instant::now() >= deadline {
                bail!(
                    "master CLI {:?} on {}: {}",
                    cmd,
                    self.master_socket().display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Checks that each map the live config names holds in the running worker (`show map
    /// #<id>`, found by kind, as the applier finds it) exactly the entries of its file: what a
    /// change through the runtime API must leave, whether it replaced the map or edited it.
    pub fn running_maps_match_files(&self) -> Result<()> {
        let proc = self.show_proc()?;
        let [pid] = proc.workers[..] else { bail!("not one current worker: {proc:?}") };
        // Sorted, a key twice kept twice.
        let entries = |text: &str, skip: usize| -> Vec<String> {
            let lines =
                text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'));
            let mut out: Vec<String> = lines
                .map(|l| l.split_whitespace().skip(skip).collect::<Vec<_>>().join(" "))
                .collect();
            out.sort();
            out
        };
        let shown = self.master_cli(&format!("@!{pid} show map"))?;
        let config = std::fs::read_to_string(self.config_path())?;
        let files = config
            .split(|c: char| c == '(' || c == ')' || c == ',' || c.is_whitespace())
            .filter(|w| w.starts_with("hafleet-maps/") && w.ends_with(".map"))
            .collect::<std::collections::BTreeSet<_>>();
        anyhow::ensure!(!files.is_empty(), "the live config names no map");
        for file in files {
            let name =
                hafleet_proto::MapName::new(file.trim_start_matches("hafleet-maps/").into())?;
            let kind = name.kind();
            // The crt-list is a file of the HTTPS bind, not a map.
            if kind == hafleet_applier::core::runtime_api::CRT_LIST {
                continue;
            }
            // Found by kind, as the applier finds it.
            let Some(ids) = hafleet_applier::core::runtime_api::map_ids(&shown, &[kind]) else {
                bail!("{}: not one running {kind} map in {shown}", self.name)
            };
            let id = &ids[kind];
            let running = entries(&self.master_cli(&format!("@!{pid} show map {id}"))?, 1);
            let text = std::fs::read_to_string(self.config_path().with_file_name(file))?;
            let want = entries(&text, 0);
            anyhow::ensure!(
                running == want,
                "{}: the running {kind} map is not {file}: only running {:?}, only in the file {:?}",
                self.name,
                running.iter().filter(|e| !want.contains(e)).collect::<Vec<_>>(),
                want.iter().filter(|e| !running.contains(e)).collect::<Vec<_>>()
            );
        }
        Ok(())
    }

    /// `show proc`, parsed. A master busy with a reload may answer nothing at all: asked
    /// again, for up to 5 s.
    pub fn show_proc(&self) -> Result<ShowProc> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = self.master_cli("show proc")?;
            if !text.trim().is_empty() || Instant::now() >= deadline {
                return parse_show_proc(&text);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The master's reload counter (successful and failed reloads since it started).
    pub fn reload_count(&self) -> Result<u32> {
        Ok(self.show_proc()?.reloads)
    }

    /// Sends `reload` to the master (2.6 answers before the reload is done, 3.0 once it is done
    /// or after socat's half a second, whichever comes first; watch `reload_count`).
    pub fn reload(&self) -> Result<()> {
        self.master_cli("reload").map(drop)
    }

    /// `ssh` with this host's options, ready for `.arg(remote command)`.
    pub fn ssh_command(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("ssh");
        cmd.args(self.ssh_args());
        cmd
    }

    /// The `ssh` arguments up to and including `user@127.0.0.1`: our identity only, strict host
    /// key checking against the shared known_hosts, no user or system ssh_config.
    pub fn ssh_args(&self) -> Vec<String> {
        vec![
            "-F".into(),
            "/dev/null".into(),
            "-i".into(),
            self.keys.identity.display().to_string(),
            "-o".into(),
            format!("UserKnownHostsFile={}", self.keys.known_hosts.display()),
            "-o".into(),
            "StrictHostKeyChecking=yes".into(),
            "-o".into(),
            "BatchMode=yes".into(),
            "-o".into(),
            "IdentitiesOnly=yes".into(),
            "-o".into(),
            "ConnectTimeout=5".into(),
            "-p".into(),
            self.ssh_port.to_string(),
            format!("{}@127.0.0.1", self.user.name),
        ]
    }

    /// Runs `remote_cmd` over SSH; its stdout, or an error with its stderr.
    pub async fn ssh(&self, remote_cmd: &str) -> Result<String> {
        run(self.ssh_command().arg(remote_cmd)).await
    }
}

/// The last ssh error, for a startup failure message.
fn ssh_error(host: &HaproxyHost) -> String {
    let out = Command::new("ssh").args(host.ssh_args()).arg("true").stdin(Stdio::null()).output();
    match out {
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
        Err(e) => e.to_string(),
    }
}

impl Drop for HaproxyHost {
    fn drop(&mut self) {
        self.kill_haproxy();
        self.stop_sshd();
        self.unpin_host_key();
    }
}

/// Valid, and answers 404 to everything until the applier installs a real config.
const BOOTSTRAP_CONFIG: &str = "\
# Bootstrap config written by hafleet-tests; the applier replaces it.
global
    httpclient.ssl.verify none

defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend hafleet_http
    bind \"${HAFLEET_HTTP_BIND-:80}\"
    default_backend hafleet_none

backend hafleet_none
    http-request return status 404
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_show_proc_of_2_6() {
        let text = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n\
            16114           master          5 [failed: 1]   0d00h00m18s     2.6.12-1+deb12u4\n\
            # workers\n\
            16304           worker          0               0d00h00m00s     2.6.12-1+deb12u4\n\
            # old workers\n\
            16258           worker          1               0d00h00m06s     2.6.12-1+deb12u4\n\
            # programs\n\n";
        let p = parse_show_proc(text).unwrap();
        assert_eq!(
            p,
            ShowProc {
                master_pid: 16114,
                reloads: 5,
                failed: 1,
                workers: vec![16304],
                old_workers: vec![16258]
            }
        );
    }
}

/// The renderer's version-signing key pair, made by `openssl` as an operator would:
/// `dir/signing.pem` (private, PKCS#8, 0600) and `dir/signing.pub.pem` (public).
#[derive(Debug, Clone)]
pub struct SigningKeys {
    pub private: PathBuf,
    pub public: PathBuf,
}

impl SigningKeys {
    pub fn generate(dir: &Path) -> Result<SigningKeys> {
        Self::generate_named(dir, "signing")
    }

    /// Like [`SigningKeys::generate`], as `dir/<name>.pem` and `dir/<name>.pub.pem`.
    pub fn generate_named(dir: &Path, name: &str) -> Result<SigningKeys> {
        let private = dir.join(format!("{name}.pem"));
        let public = dir.join(format!("{name}.pub.pem"));
        let run = |args: &[&std::ffi::OsStr]| -> Result<()> {
            let out = Command::new("openssl")
                .args(args)
                .stdin(Stdio::null())
                .output()
                .context("run openssl (install it with tests/setup.sh)")?;
            if !out.status.success() {
                bail!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
            Ok(())
        };
        run(&[
            "genpkey".as_ref(),
            "-algorithm".as_ref(),
            "ed25519".as_ref(),
            "-out".as_ref(),
            private.as_os_str(),
        ])?;
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600))?;
        run(&[
            "pkey".as_ref(),
            "-in".as_ref(),
            private.as_os_str(),
            "-pubout".as_ref(),
            "-out".as_ref(),
            public.as_os_str(),
        ])?;
        Ok(SigningKeys { private, public })
    }
}
