//! The whole pipeline on loopback: API server, NATS, HAProxy hosts behind sshd, and the three
//! hafleet binaries as real processes. The end-to-end tests and `hafleet-demo` both start this.
//!
//! ```text
//! KubeEnv (etcd + kube-apiserver) ─▶ hafleet-watcher ─▶ NatsServer ─▶ hafleet-renderer
//!                                                          │
//!                 HaproxyHost × N (sshd + haproxy -W) ◀── hafleet-applier (--fleet F)
//! ```

use crate::bin_path;
use crate::haproxy_host::{HaproxyHost, SigningKeys, SshClientKeys};
use crate::kube_env::KubeEnv;
use crate::nats::NatsServer;
use crate::proc::{ChildGuard, TestDir};
use anyhow::{Context, Result};
use hafleet_proto::{ApplyReport, ConfigVersion, FleetName, HostName};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

/// A file of the workspace, by its path from the workspace root.
pub fn workspace_file(path: &str) -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// `kubectl apply -f FILE` as the admin, as an operator installing hafleet would.
pub async fn kubectl_apply(kube: &KubeEnv, file: &std::path::Path) -> Result<()> {
    kubectl(kube, "apply", file).await
}

/// `kubectl VERB -f FILE` as the admin (`apply`, or `create` for an object too large for
/// apply's annotation).
pub async fn kubectl(kube: &KubeEnv, verb: &str, file: &std::path::Path) -> Result<()> {
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kube.kubeconfig_path())
        .args([verb, "-f"])
        .arg(file)
        .output()
        .await
        .context("running kubectl (tests/setup.sh installs it)")?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl {verb} -f {} failed: {}{}",
        file.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Writes an applier inventory of `hosts` (in this order) to `path`.
pub fn write_inventory(path: &std::path::Path, hosts: &[HaproxyHost]) -> Result<()> {
    write_inventory_with(path, hosts, "")
}

/// Writes an applier inventory for `hosts`, each with its HTTP address as `probe_address`,
/// then `extra` (fleet-wide `[[probes]]`, say).
fn write_inventory_with(path: &std::path::Path, hosts: &[HaproxyHost], extra: &str) -> Result<()> {
    let mut inventory = String::from(extra);
    inventory.push('\n');
    for h in hosts {
        write!(
            inventory,
            "[[hosts]]\nname = \"{}\"\naddress = \"{}\"\nport = {}\nuser = \"{}\"\n\
             config_path = \"{}\"\nmaster_socket = \"{}\"\nhaproxy_bin = \"{}\"\n\
             probe_address = \"{}\"\n\n",
            h.name(),
            h.ssh_host(),
            h.ssh_port(),
            h.ssh_user(),
            h.config_path().display(),
            h.master_socket().display(),
            h.haproxy_bin().display(),
            h.http_addr(),
        )?;
    }
    std::fs::write(path, inventory)?;
    Ok(())
}

/// A second fleet on the same cluster, NATS, watcher and renderer: its own HAProxy hosts and
/// its own applier.
#[derive(Debug)]
pub struct ExtraFleet {
    pub name: String,
    pub hosts: Vec<HaproxyHost>,
    applier: ChildGuard,
}

impl ExtraFleet {
    pub fn applier_log(&self) -> String {
        self.applier.log_tail(40)
    }
}

/// Which hafleet binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    Watcher,
    Renderer,
    Applier,
}

impl Component {
    pub fn binary(self) -> &'static str {
        match self {
            Component::Watcher => "hafleet-watcher",
            Component::Renderer => "hafleet-renderer",
            Component::Applier => "hafleet-applier",
        }
    }
}

/// A running pipeline for one fleet.
#[derive(Debug)]
pub struct Stack {
    pub fleet: String,
    pub kube: KubeEnv,
    pub nats: NatsServer,
    pub keys: SshClientKeys,
    /// The renderer's version-signing key pair; appliers trust its public half.
    pub signing: SigningKeys,
    pub hosts: Vec<HaproxyHost>,
    dir: TestDir,
    inventory: PathBuf,
    watcher: Option<ChildGuard>,
    renderer: Option<ChildGuard>,
    applier: Option<ChildGuard>,
    /// Where each component answers `/healthz` and `/readyz` (watcher, renderer, applier).
    health: [std::net::SocketAddr; 3],
}

impl Stack {
    /// Starts every server and the three binaries; returns once they are all up.
    pub async fn start(fleet: &str, hosts: usize) -> Result<Stack> {
        Stack::start_on(fleet, hosts, 1).await
    }

    /// [`Stack::start`] on a NATS cluster of `nats_nodes` servers (1: a single server); the
    /// components create their streams with as many replicas (at most 3).
    pub async fn start_on(fleet: &str, hosts: usize, nats_nodes: usize) -> Result<Stack> {
        // Health ports on an address of their own: a port picked on 127.0.0.1 can be taken,
        // before the component binds it, by the source port of any client connection there.
        let health_ip = crate::random_loopback_ip();
        let dir = TestDir::new("hafleet-stack")?;
        let nats = async {
            match nats_nodes {
                0 | 1 => NatsServer::start().await,
                n => NatsServer::start_cluster(n).await,
            }
        };
        let (kube, nats) = tokio::try_join!(KubeEnv::start(), nats)?;
        nats.add_applier(fleet).await?;
        // The watcher runs with exactly the RBAC the project ships.
        kubectl_apply(&kube, &workspace_file("deploy/kubernetes/watcher-rbac.yaml")).await?;
        // ...under a token of its own ServiceAccount, as in a pod.
        kube.use_watcher_service_account_token().await?;
        let keys = SshClientKeys::generate(dir.path())?;
        let signing = SigningKeys::generate(dir.path())?;
        let mut started = Vec::new();
        for i in 1..=hosts {
            started.push(HaproxyHost::start(&format!("lb-{i}"), &keys).await?);
        }
        let inventory_path = dir.path().join("inventory.toml");
        write_inventory(&inventory_path, &started)?;
        let mut stack = Stack {
            fleet: fleet.to_owned(),
            kube,
            nats,
            keys,
            signing,
            hosts: started,
            dir,
            inventory: inventory_path,
            watcher: None,
            renderer: None,
            applier: None,
            health: crate::free_ports::<3>(health_ip.into()).map(|port| (health_ip, port).into()),
        };
        stack.start_component(Component::Renderer)?;
        stack.start_component(Component::Applier)?;
        stack.start_component(Component::Watcher)?;
        Ok(stack)
    }

    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Starts another fleet: `hosts` HAProxy hosts named `<fleet>-lb-N` and an applier for them.
    pub async fn start_extra_fleet(&self, fleet: &str, hosts: usize) -> Result<ExtraFleet> {
        let mut started = Vec::new();
        for i in 1..=hosts {
            started.push(HaproxyHost::start(&format!("{fleet}-lb-{i}"), &self.keys).await?);
        }
        let inventory = self.dir.path().join(format!("inventory-{fleet}.toml"));
        write_inventory(&inventory, &started)?;
        self.nats.add_applier(fleet).await?;
        let mut cmd = self.command(Component::Applier);
        // Its own NATS user and health port: the stack's applier has the ones `command` gives.
        cmd.envs(self.nats.env_for(&format!("hafleet-applier-{fleet}")))
            .env("HAFLEET_FLEET", fleet)
            .env("HAFLEET_INVENTORY", &inventory)
            .env("HAFLEET_HEALTH_ADDR", "127.0.0.1:0");
        let log = self.dir.path().join(format!("hafleet-applier-{fleet}.log"));
        let applier = ChildGuard::spawn("hafleet-applier", &mut cmd, &log)?;
        Ok(ExtraFleet { name: fleet.to_owned(), hosts: started, applier })
    }

    pub fn inventory_path(&self) -> &std::path::Path {
        &self.inventory
    }

    /// The command line a component runs with in this stack.
    pub fn command(&self, c: Component) -> Command {
        let mut cmd = Command::new(bin_path(c.binary()));
        // Each component as its own NATS user, with the permissions hafleet ships.
        let replicas = self.nats.node_count().min(3).to_string();
        let user = match c {
            Component::Applier => format!("hafleet-applier-{}", self.fleet),
            _ => c.binary().to_owned(),
        };
        cmd.envs(self.nats.env_for(&user))
            .env("HAFLEET_NATS_REPLICAS", replicas)
            .env("HAFLEET_HEALTH_ADDR", self.health_addr(c).to_string())
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
            // Logs go to a file: no colour codes, without NO_COLOR's help (a test checks).
            .env_remove("NO_COLOR");
        match c {
            Component::Watcher => {
                cmd.env("KUBECONFIG", self.kube.watcher_kubeconfig_path());
            }
            Component::Renderer => {
                cmd.arg("run")
                    .env("HAFLEET_DATA_DIR", self.dir.path().join("renderer-data"))
                    .env("HAFLEET_SIGNING_KEY", &self.signing.private);
            }
            Component::Applier => {
                cmd.env("HAFLEET_FLEET", &self.fleet)
                    .env("HAFLEET_INVENTORY", &self.inventory)
                    .env("HAFLEET_SSH_IDENTITY", &self.keys.identity)
                    .env("HAFLEET_SSH_KNOWN_HOSTS", &self.keys.known_hosts)
                    .env("HAFLEET_VERIFY_KEY", &self.signing.public)
                    .env("HAFLEET_RETRY", "2s");
            }
        }
        cmd
    }

    fn slot(&mut self, c: Component) -> &mut Option<ChildGuard> {
        match c {
            Component::Watcher => &mut self.watcher,
            Component::Renderer => &mut self.renderer,
            Component::Applier => &mut self.applier,
        }
    }

    /// Starts (or restarts after [`Stack::kill`]) a component; its log is appended to.
    pub fn start_component(&mut self, c: Component) -> Result<()> {
        self.start_component_with(c, &[])
    }

    /// Like [`Stack::start_component`], with extra environment (e.g. `HAFLEET_TEMPLATE`).
    pub fn start_component_with(&mut self, c: Component, env: &[(&str, &str)]) -> Result<()> {
        let log = self.dir.path().join(format!("{}.log", c.binary()));
        let mut cmd = self.command(c);
        cmd.envs(env.iter().copied());
        let child = ChildGuard::spawn(c.binary(), &mut cmd, &log)
            .with_context(|| format!("starting {}", c.binary()))?;
        *self.slot(c) = Some(child);
        Ok(())
    }

    /// Kills a component and starts it again with extra environment (new flags, say).
    pub fn restart_with(&mut self, c: Component, env: &[(&str, &str)]) -> Result<()> {
        self.kill(c);
        self.start_component_with(c, env)
    }

    /// Restarts the applier with an inventory of this stack's hosts followed by `extra` TOML
    /// (fleet-wide `[[probes]]`, say).
    pub fn restart_applier_with_inventory(
        &mut self,
        extra: &str,
        env: &[(&str, &str)],
    ) -> Result<()> {
        let path = self.dir.path().join("inventory-extra.toml");
        write_inventory_with(&path, &self.hosts, extra)?;
        let path = path.to_str().context("utf-8 temp path")?.to_owned();
        let mut env = env.to_vec();
        env.push(("HAFLEET_INVENTORY", &path));
        self.restart_with(Component::Applier, &env)
    }

    /// Where a component answers `/healthz` and `/readyz`.
    pub fn health_addr(&self, c: Component) -> std::net::SocketAddr {
        self.health[match c {
            Component::Watcher => 0,
            Component::Renderer => 1,
            Component::Applier => 2,
        }]
    }

    /// Waits, at most `timeout`, until component `c` answers `/readyz` with 200.
    pub async fn until_ready(&self, c: Component, timeout: std::time::Duration) -> Result<()> {
        let addr = self.health_addr(c);
        crate::eventually(timeout, &format!("{c:?} ready"), || async move {
            let (status, body) = crate::http_get(addr, "health", "/readyz").await?;
            anyhow::ensure!(status == 200, "{status} {body}");
            Ok(())
        })
        .await
    }

    /// The process id of a running component.
    pub fn pid(&mut self, c: Component) -> Option<u32> {
        self.slot(c).as_ref().map(|child| child.pid())
    }

    /// Whether a component's process is still running.
    pub fn is_running(&mut self, c: Component) -> bool {
        self.slot(c).as_mut().is_some_and(|child| child.is_running())
    }

    /// Kills a component with SIGKILL, as a crash would.
    pub fn kill(&mut self, c: Component) {
        if let Some(mut child) = self.slot(c).take() {
            child.kill();
        }
    }

    /// The newest apply report of a host, read from the reports stream.
    pub async fn last_report(&self, host: &str) -> Result<Option<ApplyReport>> {
        let js = async_nats::jetstream::new(self.nats.client().await?);
        let Ok(mut stream) = js.get_stream(hafleet_proto::REPORTS_STREAM).await else {
            return Ok(None);
        };
        let subject = hafleet_proto::reports_subject(
            &FleetName::new(self.fleet.as_str())?,
            &HostName::new(host)?,
        );
        if stream.info().await?.state.messages == 0 {
            return Ok(None);
        }
        match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(msg) => Ok(Some(ApplyReport::decode(&msg.payload)?)),
            Err(_) => Ok(None),
        }
    }

    /// The newest config version published for the stack's fleet, read from the configs stream,
    /// with its bundle (fetched from the bundles stream if it went there).
    pub async fn latest_version(&self) -> Result<Option<ConfigVersion>> {
        let client = self.nats.client().await?;
        let js = async_nats::jetstream::new(client.clone());
        let Ok(stream) = js.get_stream(hafleet_proto::CONFIGS_STREAM).await else {
            return Ok(None);
        };
        let subject = hafleet_proto::configs_subject(&FleetName::new(self.fleet.as_str())?);
        let v = match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(msg) => ConfigVersion::decode(&msg.payload)?,
            Err(_) => return Ok(None),
        };
        let bus = hafleet_runtime::nats::Bus::from_client(client);
        Ok(Some(bus.fetch_bundle(v).await?))
    }

    /// Every config version of the stack's fleet still in the configs stream, oldest first
    /// (without fetching bundles that went to the bundles stream).
    pub async fn versions(&self) -> Result<Vec<ConfigVersion>> {
        let js = async_nats::jetstream::new(self.nats.client().await?);
        let Ok(mut stream) = js.get_stream(hafleet_proto::CONFIGS_STREAM).await else {
            return Ok(vec![]);
        };
        let state = stream.info().await?.state.clone();
        let fleet = FleetName::new(self.fleet.as_str())?;
        let mut out = Vec::new();
        for seq in state.first_sequence..=state.last_sequence {
            let Ok(msg) = stream.get_raw_message(seq).await else { continue };
            if let Ok(v) = ConfigVersion::decode(&msg.payload)
                && v.fleet == fleet
            {
                out.push(v);
            }
        }
        Ok(out)
    }

    pub fn log_path(&self, c: Component) -> PathBuf {
        self.dir.path().join(format!("{}.log", c.binary()))
    }

    /// The last lines of every component's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for c in [Component::Watcher, Component::Renderer, Component::Applier] {
            let tail = crate::proc::log_tail(&self.log_path(c), 40);
            let _ = writeln!(out, "----- {} -----\n{tail}", c.binary());
        }
        out
    }
}
