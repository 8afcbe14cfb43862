//! A real `nats-server` with JetStream on a free loopback port, for one test.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::http::http_get;
use crate::proc::{ChildGuard, TestDir, free_port, is_addr_in_use, tcp_accepts};

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// `nats-server -js` with its store in a temp dir; killed on drop.
///
/// It runs with the permissions hafleet ships (deploy/nats/hafleet-permissions.conf): user
/// `admin` may do anything (the tests' own view), and `hafleet-watcher`, `hafleet-renderer`,
/// `hafleet-operator` and each fleet's `hafleet-applier-<fleet>` ([`NatsServer::add_applier`])
/// only what that file, or `hafleet-applier nats-permissions`, grants them (see
/// [`NatsServer::url_for`]).
pub struct NatsServer {
    child: Option<ChildGuard>,
    port: u16,
    monitor_port: u16,
    password: String,
    dir: TestDir,
    /// Fleets with an applier user, as an operator adds them.
    fleets: std::sync::Mutex<Vec<hafleet_proto::FleetName>>,
}

/// The component users of deploy/nats/hafleet-permissions.conf and their permission variables.
pub const COMPONENT_USERS: [(&str, &str); 3] = [
    ("hafleet-watcher", "HAFLEET_WATCHER"),
    ("hafleet-renderer", "HAFLEET_RENDERER"),
    ("hafleet-operator", "HAFLEET_OPERATOR"),
];

impl std::fmt::Debug for NatsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsServer").field("url", &self.url()).field("dir", &self.dir).finish()
    }
}

impl NatsServer {
    /// Starts the server and waits until JetStream is healthy and a client can connect.
    pub async fn start() -> Result<NatsServer> {
        let mut dir = TestDir::new("hafleet-nats-")?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let lo = Ipv4Addr::LOCALHOST.into();
            let mut server = NatsServer {
                child: None,
                port: free_port(lo),
                monitor_port: free_port(lo),
                password: crate::proc::random_token(),
                dir,
                fleets: Default::default(),
            };
            match server.spawn().await {
                Ok(()) => return Ok(server),
                Err(e) if attempt < 3 && is_addr_in_use(&e) => dir = server.take_dir(),
                Err(e) => return Err(e),
            }
        }
    }

    fn take_dir(self) -> TestDir {
        let NatsServer { mut child, dir, .. } = self;
        drop(child.take());
        dir
    }

    async fn spawn(&mut self) -> Result<()> {
        let store = self.store_dir();
        std::fs::create_dir_all(&store)?;
        let config = self.write_config()?;
        let mut cmd = Command::new("nats-server");
        cmd.arg("-c").arg(&config);
        // JetStream is on in the config file, not by flag: a config reload (a fleet added)
        // would otherwise turn it off.
        cmd.args(["-a", "127.0.0.1"]).args([
            "-p",
            &self.port.to_string(),
            "-m",
            &self.monitor_port.to_string(),
        ]);
        let mut child =
            ChildGuard::spawn("nats-server", &mut cmd, &self.dir.path().join("nats.log"))
                .context("start nats-server (install it with tests/setup.sh)")?;
        let (addr, monitor, password) = (self.addr(), self.monitor_addr(), self.password.clone());
        child
            .wait_ready(READY_TIMEOUT, || {
                let password = password.clone();
                async move {
                    tcp_accepts(addr).await
                        && matches!(http_get(monitor, "127.0.0.1", "/healthz").await,
                                    Ok((200, body)) if body.contains("ok"))
                        && async_nats::ConnectOptions::with_user_and_password(
                            "admin".into(),
                            password,
                        )
                        .connect(addr.to_string())
                        .await
                        .is_ok()
                }
            })
            .await?;
        self.child = Some(child);
        Ok(())
    }

    /// The server config: hafleet's permissions file, included as it ships (less its example
    /// fleet), each added fleet's applier permissions as `hafleet-applier nats-permissions`
    /// prints them, and one user per component and fleet plus `admin`, all with this server's
    /// password.
    fn write_config(&self) -> Result<PathBuf> {
        use hafleet_applier::permissions;
        let shipped =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/nats/hafleet-permissions.conf");
        let example = permissions::nats_permissions(&hafleet_proto::FleetName::new("edge")?);
        let text = std::fs::read_to_string(&shipped)
            .with_context(|| format!("read {}", shipped.display()))?
            .replace(&example, "");
        std::fs::write(self.dir.path().join("hafleet-permissions.conf"), text)?;
        let mut users = format!("    {{ user: admin, password: \"{}\" }}\n", self.password);
        let mut all: Vec<(String, String)> =
            COMPONENT_USERS.iter().map(|(u, p)| (u.to_string(), p.to_string())).collect();
        let mut fleets = String::new();
        for fleet in self.fleets.lock().expect("not poisoned").iter() {
            fleets.push_str(&permissions::nats_permissions(fleet));
            all.push((permissions::user(fleet), permissions::variable(fleet)));
        }
        for (user, permissions) in all {
            users.push_str(&format!(
                "    {{ user: {user}, password: \"{}\", permissions: ${permissions} }}\n",
                self.password
            ));
        }
        let config = self.dir.path().join("nats.conf");
        std::fs::write(
            &config,
            format!(
                "jetstream {{ store_dir: {store:?} }}\ninclude hafleet-permissions.conf\n{fleets}\
                 authorization {{\n  users = [\n{users}  ]\n}}\n",
                store = self.store_dir().display().to_string()
            ),
        )?;
        Ok(config)
    }

    /// Adds `fleet`'s applier user (`hafleet-applier-<fleet>`) with the permissions
    /// `hafleet-applier nats-permissions` prints, and reloads the server's config, as an
    /// operator adding a fleet would. Returns once the user can connect.
    pub async fn add_applier(&self, fleet: &str) -> Result<()> {
        let fleet = hafleet_proto::FleetName::new(fleet)?;
        let user = hafleet_applier::permissions::user(&fleet);
        {
            let mut fleets = self.fleets.lock().expect("not poisoned");
            if fleets.contains(&fleet) {
                return Ok(());
            }
            fleets.push(fleet);
        }
        self.write_config()?;
        let pid = self.pid().context("nats-server is not running")?;
        let status = Command::new("nats-server")
            .arg("--signal")
            .arg(format!("reload={pid}"))
            .status()
            .context("nats-server --signal reload")?;
        anyhow::ensure!(status.success(), "nats-server --signal reload={pid}: {status}");
        let deadline = std::time::Instant::now() + READY_TIMEOUT;
        loop {
            match self.client_as(&user).await {
                Ok(_) => return Ok(()),
                Err(e) if std::time::Instant::now() > deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// `nats://admin:…@127.0.0.1:<port>`: the tests' own, unrestricted user.
    pub fn url(&self) -> String {
        self.url_for("admin")
    }

    /// The URL a component connects with as `user` (one of [`COMPONENT_USERS`], or `admin`).
    pub fn url_for(&self, user: &str) -> String {
        format!("nats://{user}:{}@127.0.0.1:{}", self.password, self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        (Ipv4Addr::LOCALHOST, self.port).into()
    }

    /// The HTTP monitoring endpoint (`/healthz`, `/jsz`, `/connz`, ...).
    pub fn monitor_addr(&self) -> SocketAddr {
        (Ipv4Addr::LOCALHOST, self.monitor_port).into()
    }

    /// JetStream's store directory (`store_dir`); it survives [`NatsServer::restart`].
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("jetstream")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("nats.log")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A new client connection as `admin`.
    pub async fn client(&self) -> Result<async_nats::Client> {
        self.client_as("admin").await
    }

    /// A new client connection as `user` (one of [`COMPONENT_USERS`], `admin`, or a fleet's
    /// `hafleet-applier-<fleet>`, which gets its fleet's inbox prefix, as the applier does).
    pub async fn client_as(&self, user: &str) -> Result<async_nats::Client> {
        let mut options = async_nats::ConnectOptions::with_user_and_password(
            user.to_owned(),
            self.password.clone(),
        );
        if let Some(fleet) = user.strip_prefix("hafleet-applier-") {
            let fleet = hafleet_proto::FleetName::new(fleet)?;
            options = options.custom_inbox_prefix(hafleet_proto::applier_inbox_prefix(&fleet));
        }
        options
            .connect(self.addr().to_string())
            .await
            .with_context(|| format!("connect to NATS at {} as {user}", self.addr()))
    }

    /// Kills the server with SIGKILL (a crash); [`NatsServer::start_again`] brings it back.
    pub fn kill(&mut self) {
        drop(self.child.take());
    }

    /// The server's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.pid())
    }

    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.is_running())
    }

    /// Starts the server again (after [`NatsServer::kill`]) on the same port and store dir.
    pub async fn start_again(&mut self) -> Result<()> {
        self.kill();
        self.spawn().await
    }

    /// Crash and restart: SIGKILL, then start on the same port and store dir, and wait.
    pub async fn restart(&mut self) -> Result<()> {
        self.start_again().await
    }
}
