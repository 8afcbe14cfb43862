//! A real `nats-server` with JetStream on a free loopback port, for one test.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::http::http_get;
use crate::proc::{ChildGuard, TestDir, free_ports, is_addr_in_use, tcp_accepts};

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// `nats-server` with JetStream, its store in a temp dir; killed on drop. One server, or a
/// cluster of several ([`NatsServer::start_cluster`]) whose every URL lists all nodes.
///
/// It runs as the README recommends: clients over TLS only (a certificate for 127.0.0.1 from
/// a CA of the test's own), each user known by its NKEY (its seed in a file only the test
/// reads), with the permissions hafleet ships (deploy/nats/hafleet-permissions.conf): user
/// `admin` may do anything (the tests' own view), and `hafleet-watcher`, `hafleet-renderer`,
/// `hafleet-operator` and each fleet's `hafleet-applier-<fleet>` ([`NatsServer::add_applier`])
/// only what that file, or `hafleet nats-permissions`, grants them (see
/// [`NatsServer::env_for`]).
pub struct NatsServer {
    nodes: Vec<Node>,
    /// Each user's NKEY, by user name.
    keys: std::sync::Mutex<std::collections::BTreeMap<String, nkeys::KeyPair>>,
    /// TLS for clients: always, but where `HAFLEET_TEST_NATS_PLAIN=1` asks for plain NATS (the
    /// bench's comparison of the two).
    tls: bool,
    /// Whether clients must show a certificate of the test CA too.
    client_certs: bool,
    dir: TestDir,
    /// Fleets with an applier user, as an operator adds them.
    fleets: std::sync::Mutex<Vec<hafleet_proto::FleetName>>,
}

/// One server of the cluster.
struct Node {
    child: Option<ChildGuard>,
    port: u16,
    monitor_port: u16,
    /// Where cluster routes connect (clusters only).
    cluster_port: u16,
}

/// The component users of deploy/nats/hafleet-permissions.conf and their permission variables.
pub const COMPONENT_USERS: [(&str, &str); 4] = [
    ("hafleet-watcher", "HAFLEET_WATCHER"),
    ("hafleet-renderer", "HAFLEET_RENDERER"),
    ("hafleet-operator", "HAFLEET_OPERATOR"),
    ("hafleet-operator-reader", "HAFLEET_OPERATOR_READER"),
];

/// Operators who may change one fleet only: (name, fleet); user `hafleet-operator-<name>`.
pub const OPERATORS_OF_ONE_FLEET: [(&str, &str); 2] =
    [("edge-only", "edge"), ("core-only", "core")];

impl std::fmt::Debug for NatsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsServer").field("url", &self.url()).field("dir", &self.dir).finish()
    }
}

impl NatsServer {
    /// Starts one server and waits until JetStream is healthy and a client can connect.
    pub async fn start() -> Result<NatsServer> {
        Self::start_with(false).await
    }

    /// Starts one server that also asks every client for a certificate of the test CA (mutual
    /// TLS): [`NatsServer::args_for`] and [`NatsServer::env_for`] give one
    /// (`--nats-cert`/`--nats-key`).
    pub async fn start_requiring_client_certs() -> Result<NatsServer> {
        Self::start_with(true).await
    }

    async fn start_with(client_certs: bool) -> Result<NatsServer> {
        let mut dir = TestDir::new("hafleet-nats-")?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut server = NatsServer::new(dir, 1);
            server.client_certs = client_certs && server.tls;
            match server.spawn_all().await {
                Ok(()) => return Ok(server),
                Err(e) if attempt < 3 && is_addr_in_use(&e) => dir = server.take_dir(),
                Err(e) => return Err(e),
            }
        }
    }

    /// Starts a cluster of `nodes` servers (routes between them, JetStream clustered), and
    /// waits until every one is healthy and a client can connect.
    pub async fn start_cluster(nodes: usize) -> Result<NatsServer> {
        let mut dir = TestDir::new("hafleet-nats-cluster-")?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut server = NatsServer::new(dir, nodes.max(1));
            match server.spawn_all().await {
                Ok(()) => return Ok(server),
                Err(e) if attempt < 3 && is_addr_in_use(&e) => dir = server.take_dir(),
                Err(e) => return Err(e),
            }
        }
    }

    fn new(dir: TestDir, nodes: usize) -> NatsServer {
        let lo = Ipv4Addr::LOCALHOST.into();
        NatsServer {
            nodes: (0..nodes)
                .map(|_| {
                    let [port, monitor_port, cluster_port] = free_ports::<3>(lo);
                    Node { child: None, port, monitor_port, cluster_port }
                })
                .collect(),
            keys: Default::default(),
            tls: std::env::var("HAFLEET_TEST_NATS_PLAIN").as_deref() != Ok("1"),
            client_certs: false,
            dir,
            fleets: Default::default(),
        }
    }

    fn take_dir(self) -> TestDir {
        let NatsServer { nodes, dir, .. } = self;
        drop(nodes);
        dir
    }

    /// Node `i`'s folder: the server's own for one server, `node-<i>` in a cluster.
    fn node_dir(&self, i: usize) -> PathBuf {
        match self.nodes.len() {
            1 => self.dir.path().to_owned(),
            _ => self.dir.path().join(format!("node-{i}")),
        }
    }

    /// Starts every node that is not running, then waits for all of them: a clustered
    /// JetStream is healthy only once a quorum of nodes runs.
    async fn spawn_all(&mut self) -> Result<()> {
        self.write_tls()?;
        for i in 0..self.nodes.len() {
            if self.nodes[i].child.is_none() {
                self.spawn_node(i)?;
            }
        }
        for i in 0..self.nodes.len() {
            self.wait_node(i).await?;
        }
        Ok(())
    }

    fn spawn_node(&mut self, i: usize) -> Result<()> {
        let dir = self.node_dir(i);
        std::fs::create_dir_all(dir.join("jetstream"))?;
        self.write_config(i)?;
        let mut cmd = Command::new("nats-server");
        cmd.arg("-c").arg(dir.join("nats.conf"));
        // JetStream is on in the config file, not by flag: a config reload (a fleet added)
        // would otherwise turn it off.
        cmd.args(["-a", "127.0.0.1"]).args([
            "-p",
            &self.nodes[i].port.to_string(),
            "-m",
            &self.nodes[i].monitor_port.to_string(),
        ]);
        let child = ChildGuard::spawn("nats-server", &mut cmd, &dir.join("nats.log"))
            .context("start nats-server (install it with tests/setup.sh)")?;
        self.nodes[i].child = Some(child);
        Ok(())
    }

    async fn wait_node(&mut self, i: usize) -> Result<()> {
        let lo = Ipv4Addr::LOCALHOST;
        let addr: SocketAddr = (lo, self.nodes[i].port).into();
        let monitor: SocketAddr = (lo, self.nodes[i].monitor_port).into();
        let options = self.options_for("admin")?;
        let child = self.nodes[i].child.as_mut().context("node not started")?;
        child
            .wait_ready(READY_TIMEOUT, || {
                let options = options.clone();
                async move {
                    tcp_accepts(addr).await
                        && matches!(http_get(monitor, "127.0.0.1", "/healthz").await,
                                    Ok((200, body)) if body.contains("ok"))
                        && options.connect(addr.to_string()).await.is_ok()
                }
            })
            .await
    }

    /// Every node's config ([`NatsServer::write_config`]) in its folder.
    fn write_configs(&self) -> Result<()> {
        for i in 0..self.nodes.len() {
            self.write_config(i)?;
        }
        Ok(())
    }

    /// The CA (`ca.pem`), and the server's certificate for 127.0.0.1 and its key, made once.
    fn write_tls(&self) -> Result<()> {
        let dir = self.dir.path();
        if !self.tls || dir.join("server.pem").exists() {
            return Ok(());
        }
        let issuer = crate::tls::Issuer::new("hafleet test NATS CA")?;
        let (cert, key) = issuer.issue("127.0.0.1")?;
        crate::proc::write_private(&dir.join("server.key"), key.as_bytes())?;
        std::fs::write(dir.join("server.pem"), cert)?;
        std::fs::write(dir.join("ca.pem"), issuer.ca_pem())?;
        let (cert, key) = issuer.issue("hafleet-client")?;
        crate::proc::write_private(&dir.join("client.key"), key.as_bytes())?;
        std::fs::write(dir.join("client.pem"), cert)?;
        Ok(())
    }

    /// The CA the server's certificate chains to (`HAFLEET_NATS_CA`).
    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// `user`'s NKEY, made on first use, and the file its seed is in (`HAFLEET_NATS_CREDS`).
    fn key(&self, user: &str) -> Result<(String, PathBuf)> {
        let path = self.dir.path().join("creds").join(format!("{user}.nk"));
        let mut keys = self.keys.lock().expect("not poisoned");
        if let Some(k) = keys.get(user) {
            return Ok((k.public_key(), path));
        }
        let pair = nkeys::KeyPair::new_user();
        std::fs::create_dir_all(path.parent().context("a folder")?)?;
        let seed = pair.seed().map_err(|e| anyhow::anyhow!("an NKEY seed: {e}"))?;
        // A file left by an attempt whose ports were taken (the folder is kept for the next
        // attempt, the keys are not): this attempt's key replaces it.
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        crate::proc::write_private(&path, format!("{seed}\n").as_bytes())?;
        let public = pair.public_key();
        keys.insert(user.to_owned(), pair);
        Ok((public, path))
    }

    /// The server config: TLS for clients, hafleet's permissions file, included as it ships
    /// (less its example fleet), each added fleet's applier permissions as `hafleet-applier
    /// nats-permissions` prints them, and one user per component and fleet plus `admin`, each
    /// by its NKEY.
    fn write_config(&self, node: usize) -> Result<PathBuf> {
        let dir = self.node_dir(node);
        std::fs::create_dir_all(&dir)?;
        use hafleet_cli::commands::permissions;
        let shipped =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/nats/hafleet-permissions.conf");
        let example = permissions::nats_permissions(&hafleet_proto::FleetName::new("edge")?);
        let text = std::fs::read_to_string(&shipped)
            .with_context(|| format!("read {}", shipped.display()))?
            .replace(&example, "");
        let permissions = dir.join("hafleet-permissions.conf");
        std::fs::write(dir.join("hafleet-permissions.conf.partial"), text)?;
        std::fs::rename(dir.join("hafleet-permissions.conf.partial"), permissions)?;
        let mut users = format!("    {{ nkey: {} }}\n", self.key("admin")?.0);
        let mut all: Vec<(String, String)> =
            COMPONENT_USERS.iter().map(|(u, p)| (u.to_string(), p.to_string())).collect();
        let mut fleets = String::new();
        // Operators of one fleet each, as `nats-permissions --operator NAME --may-change F`
        // prints them: `hafleet-operator-edge-only` may change fleet edge, `…-core-only` core.
        for (name, fleet) in OPERATORS_OF_ONE_FLEET {
            use permissions::{Changes, operator_permissions, operator_user, operator_variable};
            let name = hafleet_proto::FleetName::new(name)?;
            let may = Changes::Fleets(vec![hafleet_proto::FleetName::new(fleet)?]);
            fleets.push_str(&operator_permissions(Some(&name), &may));
            all.push((operator_user(Some(&name)), operator_variable(Some(&name))));
        }
        for fleet in self.fleets.lock().expect("not poisoned").iter() {
            fleets.push_str(&permissions::nats_permissions(fleet));
            all.push((permissions::user(fleet), permissions::variable(fleet)));
        }
        for (user, permissions) in all {
            users.push_str(&format!(
                "    {{ nkey: {}, permissions: ${permissions} }}\n",
                self.key(&user)?.0
            ));
        }
        let cluster = match self.nodes.len() {
            1 => String::new(),
            _ => {
                let routes: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|n| format!("\"nats-route://127.0.0.1:{}\"", n.cluster_port))
                    .collect();
                format!(
                    "server_name: n{node}\ncluster {{\n  name: hafleet\n  listen: \"127.0.0.1:{}\"\n  \
                     routes: [{}]\n}}\n",
                    self.nodes[node].cluster_port,
                    routes.join(", ")
                )
            }
        };
        // Written aside and renamed into place: a running node reading its config (at start
        // or on a reload) never sees a half-written file. The file store's size is set: left
        // unset, JetStream takes 75% of the disk's free space at start, and a busy disk
        // (a build beside the tests) then refuses the renderer's streams (1 GiB and 2 GiB of
        // retention) with "insufficient storage resources"; the tests store megabytes.
        let config = dir.join("nats.conf");
        let partial = dir.join("nats.conf.partial");
        std::fs::write(
            &partial,
            format!(
                "{cluster}jetstream {{ store_dir: {store:?}, max_file_store: 64GB }}\n{tls}\
                 include hafleet-permissions.conf\n\
                 {fleets}authorization {{\n  users = [\n{users}  ]\n}}\n",
                store = dir.join("jetstream").display().to_string(),
                tls = match self.tls {
                    true => format!(
                        "tls {{ cert_file: {:?}, key_file: {:?}, timeout: 5{} }}\n",
                        self.dir.path().join("server.pem").display().to_string(),
                        self.dir.path().join("server.key").display().to_string(),
                        match self.client_certs {
                            true => format!(", verify: true, ca_file: {:?}", self.ca_path()),
                            false => String::new(),
                        }
                    ),
                    false => String::new(),
                },
            ),
        )?;
        std::fs::rename(&partial, &config)?;
        Ok(config)
    }

    /// Adds `fleet`'s applier user (`hafleet-applier-<fleet>`) with the permissions
    /// `hafleet nats-permissions` prints, and reloads the server's config, as an
    /// operator adding a fleet would. Returns once the user can connect.
    pub async fn add_applier(&self, fleet: &str) -> Result<()> {
        let fleet = hafleet_proto::FleetName::new(fleet)?;
        let user = hafleet_cli::commands::permissions::user(&fleet);
        {
            let mut fleets = self.fleets.lock().expect("not poisoned");
            if fleets.contains(&fleet) {
                return Ok(());
            }
            fleets.push(fleet);
        }
        self.write_configs()?;
        for node in &self.nodes {
            let pid = node.child.as_ref().map(|c| c.pid()).context("nats-server is not running")?;
            let status = Command::new("nats-server")
                .arg("--signal")
                .arg(format!("reload={pid}"))
                .status()
                .context("nats-server --signal reload")?;
            anyhow::ensure!(status.success(), "nats-server --signal reload={pid}: {status}");
        }
        let deadline = std::time::Instant::now() + READY_TIMEOUT;
        loop {
            match self.client_as(&user).await {
                Ok(_) => return Ok(()),
                Err(e) if std::time::Instant::now() > deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// `tls://127.0.0.1:<port>` (a comma-separated list of every node's, for a cluster).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "tls" } else { "nats" };
        let urls: Vec<String> =
            self.nodes.iter().map(|n| format!("{scheme}://127.0.0.1:{}", n.port)).collect();
        urls.join(",")
    }

    /// The settings a component connects with as `user` (one of [`COMPONENT_USERS`], a
    /// fleet's `hafleet-applier-<fleet>`, or `admin`), as environment variables: the URL, the
    /// CA and the user's NKEY seed file.
    pub fn env_for(&self, user: &str) -> Vec<(&'static str, String)> {
        let (_, creds) = self.key(user).expect("an NKEY for the user");
        let mut env = vec![
            ("HAFLEET_NATS_URL", self.url()),
            ("HAFLEET_NATS_CREDS", creds.display().to_string()),
        ];
        if self.tls {
            env.push(("HAFLEET_NATS_CA", self.ca_path().display().to_string()));
        }
        if self.client_certs {
            env.push((
                "HAFLEET_NATS_CERT",
                self.dir.path().join("client.pem").display().to_string(),
            ));
            env.push((
                "HAFLEET_NATS_KEY",
                self.dir.path().join("client.key").display().to_string(),
            ));
        }
        env
    }

    /// `user`'s NKEY seed, for tests that check no one shows it.
    pub fn seed_of(&self, user: &str) -> Result<String> {
        let (_, path) = self.key(user)?;
        Ok(std::fs::read_to_string(path)?.trim().to_owned())
    }

    /// The settings of [`NatsServer::env_for`], as a binary reads them.
    pub fn args_for(&self, user: &str) -> hafleet_runtime::NatsArgs {
        let (_, creds) = self.key(user).expect("an NKEY for the user");
        let mut args = hafleet_runtime::NatsArgs::for_url(self.url());
        args.nats_ca = self.tls.then(|| self.ca_path());
        args.nats_creds = Some(creds);
        if self.client_certs {
            args.nats_cert = Some(self.dir.path().join("client.pem"));
            args.nats_key = Some(self.dir.path().join("client.key"));
        }
        args
    }

    /// A bus as `admin`, as the components make theirs.
    pub async fn bus(&self) -> Result<hafleet_runtime::nats::Bus> {
        Ok(self.args_for("admin").connect().await?)
    }

    /// Connect options as `user`: TLS with the test CA, and the user's NKEY.
    fn options_for(&self, user: &str) -> Result<async_nats::ConnectOptions> {
        let mut options = self.args_for(user).options(async_nats::ConnectOptions::new())?;
        if let Some(fleet) = user.strip_prefix("hafleet-applier-") {
            let fleet = hafleet_proto::FleetName::new(fleet)?;
            options = options.custom_inbox_prefix(hafleet_proto::applier_inbox_prefix(&fleet));
        }
        Ok(options)
    }

    /// The first node's client port.
    pub fn port(&self) -> u16 {
        self.nodes[0].port
    }

    /// The first node's client address.
    pub fn addr(&self) -> SocketAddr {
        (Ipv4Addr::LOCALHOST, self.nodes[0].port).into()
    }

    /// Every node's client address.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect()
    }

    /// The first node's HTTP monitoring endpoint (`/healthz`, `/jsz`, `/connz`, ...).
    pub fn monitor_addr(&self) -> SocketAddr {
        (Ipv4Addr::LOCALHOST, self.nodes[0].monitor_port).into()
    }

    /// The first node's JetStream store directory; it survives [`NatsServer::restart`].
    pub fn store_dir(&self) -> PathBuf {
        self.node_dir(0).join("jetstream")
    }

    pub fn log_path(&self) -> PathBuf {
        self.node_dir(0).join("nats.log")
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
        let scheme = if self.tls { "tls" } else { "nats" };
        let addrs: Vec<String> = self.addrs().iter().map(|a| format!("{scheme}://{a}")).collect();
        self.options_for(user)?
            .connect(addrs)
            .await
            .with_context(|| format!("connect to NATS at {:?} as {user}", self.addrs()))
    }

    /// Kills every node with SIGKILL (a crash); [`NatsServer::start_again`] brings them back.
    pub fn kill(&mut self) {
        for node in &mut self.nodes {
            drop(node.child.take());
        }
    }

    /// Kills node `i` alone with SIGKILL; [`NatsServer::start_node_again`] brings it back.
    pub fn kill_node(&mut self, i: usize) {
        drop(self.nodes[i].child.take());
    }

    /// Starts node `i` again on its ports and store, and waits until it is healthy.
    pub async fn start_node_again(&mut self, i: usize) -> Result<()> {
        self.kill_node(i);
        self.spawn_node(i)?;
        self.wait_node(i).await
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The first node's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.nodes[0].child.as_ref().map(|c| c.pid())
    }

    pub fn is_running(&mut self) -> bool {
        self.nodes.iter_mut().all(|n| n.child.as_mut().is_some_and(|c| c.is_running()))
    }

    /// Starts every node again (after [`NatsServer::kill`]) on the same ports and stores.
    pub async fn start_again(&mut self) -> Result<()> {
        self.kill();
        self.spawn_all().await
    }

    /// Crash and restart: SIGKILL, then start on the same ports and stores, and wait.
    pub async fn restart(&mut self) -> Result<()> {
        self.start_again().await
    }
}
