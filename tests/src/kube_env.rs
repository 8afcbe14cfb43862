//! A real etcd + kube-apiserver on free loopback ports, with an admin kubeconfig, for one test.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::http::http_get;
use crate::proc::{ChildGuard, TestDir, free_port, is_addr_in_use, random_token, run};

const ETCD_TIMEOUT: Duration = Duration::from_secs(30);
const APISERVER_TIMEOUT: Duration = Duration::from_secs(60);

/// etcd and kube-apiserver for one test; both are killed on drop (apiserver first).
///
/// The user name of the watcher's ServiceAccount `hafleet/hafleet-watcher`.
pub const WATCHER_USER: &str = "system:serviceaccount:hafleet:hafleet-watcher";

/// No controllers, kubelet or kube-proxy run: tests create Nodes themselves. The kubeconfig
/// authenticates with a static token in group `system:masters`.
pub struct KubeEnv {
    // Field order is drop order.
    apiserver: ChildGuard,
    etcd: ChildGuard,
    port: u16,
    token: String,
    kubeconfig: PathBuf,
    watcher_kubeconfig: PathBuf,
    dir: TestDir,
}

impl std::fmt::Debug for KubeEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeEnv")
            .field("server", &self.server_url())
            .field("kubeconfig", &self.kubeconfig)
            .finish()
    }
}

/// Paths of kube-apiserver and etcd: `HAFLEET_KUBE_APISERVER` / `HAFLEET_ETCD`, else
/// `$KUBEBUILDER_ASSETS/{kube-apiserver,etcd}`, else `~/.cache/hafleet/kube-1.20.2-reflect2/kube-apiserver`
/// and `etcd` on `PATH`.
pub fn find_binaries() -> Result<(PathBuf, PathBuf)> {
    let assets = std::env::var_os("KUBEBUILDER_ASSETS").map(PathBuf::from);
    let from_assets = |name: &str| assets.as_ref().map(|a| a.join(name)).filter(|p| p.is_file());
    let apiserver = std::env::var_os("HAFLEET_KUBE_APISERVER")
        .map(PathBuf::from)
        .or_else(|| from_assets("kube-apiserver"))
        .or_else(|| {
            let home = PathBuf::from(std::env::var_os("HOME")?);
            Some(home.join(".cache/hafleet/kube-1.20.2-reflect2/kube-apiserver"))
        });
    let etcd = std::env::var_os("HAFLEET_ETCD")
        .map(PathBuf::from)
        .or_else(|| from_assets("etcd"))
        .or_else(|| which("etcd"));
    match (apiserver, etcd) {
        (Some(a), Some(e)) if a.is_file() && e.is_file() => Ok((a, e)),
        (a, e) => bail!(
            "kube-apiserver ({a:?}) or etcd ({e:?}) not found: run `bash tests/setup.sh` and export \
             the HAFLEET_KUBE_APISERVER=... and HAFLEET_ETCD=... lines it prints (or set \
             KUBEBUILDER_ASSETS)"
        ),
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(name)).find(|p| p.is_file())
}

impl KubeEnv {
    /// Starts etcd and kube-apiserver, waits for `/readyz` and namespace `default`, and writes
    /// the kubeconfig. Takes about 3-4 s.
    pub async fn start() -> Result<KubeEnv> {
        let (apiserver_bin, etcd_bin) = find_binaries()?;
        let dir = TestDir::new("hafleet-kube-")?;
        let token = random_token();
        let watcher_token = random_token();
        // The watcher authenticates as its ServiceAccount would: RBAC matches ServiceAccount
        // subjects by this user name, so deploy/kubernetes/watcher-rbac.yaml applies to it as
        // it is.
        std::fs::write(
            dir.path().join("tokens.csv"),
            format!(
                "{token},admin,admin,system:masters\n\
                 {watcher_token},{WATCHER_USER},hafleet-watcher,\"system:serviceaccounts,system:serviceaccounts:hafleet\"\n"
            ),
        )?;
        let mut genrsa = tokio::process::Command::new("openssl");
        genrsa.arg("genrsa").arg("-out").arg(dir.path().join("sa.key")).arg("2048");
        let genrsa = async { run(&mut genrsa).await.context("generate the service-account key") };
        let (etcd, _) = tokio::try_join!(start_etcd(&etcd_bin, dir.path()), genrsa)?;

        let mut attempt = 0;
        let (apiserver, port) = loop {
            attempt += 1;
            let port = free_port(Ipv4Addr::LOCALHOST.into());
            match start_apiserver(&apiserver_bin, dir.path(), &etcd.1, port).await {
                Ok(child) => break (child, port),
                Err(e) if attempt < 3 && is_addr_in_use(&e) => continue,
                Err(e) => return Err(e),
            }
        };
        let mut env = KubeEnv {
            apiserver,
            etcd: etcd.0,
            port,
            token,
            kubeconfig: dir.path().join("kubeconfig"),
            watcher_kubeconfig: dir.path().join("watcher.kubeconfig"),
            dir,
        };
        env.write_kubeconfig(&env.kubeconfig, "admin", &env.token)?;
        env.write_kubeconfig(&env.watcher_kubeconfig, WATCHER_USER, &watcher_token)?;
        env.wait_until_ready().await?;
        Ok(env)
    }

    /// Writes a kubeconfig for `user` trusting the apiserver's self-signed `apiserver.crt` (a
    /// bundle of the serving cert, with IP SAN 127.0.0.1, and its CA; rustls accepts it).
    fn write_kubeconfig(&self, path: &Path, user: &str, token: &str) -> Result<()> {
        let kubeconfig = format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: hafleet-test\n  \
               cluster:\n    \
                 server: {server}\n    \
                 certificate-authority: {ca}\n\
             users:\n\
             - name: {user}\n  \
               user:\n    \
                 token: {token}\n\
             contexts:\n\
             - name: hafleet-test\n  \
               context:\n    \
                 cluster: hafleet-test\n    \
                 user: {user}\n    \
                 namespace: default\n\
             current-context: hafleet-test\n",
            server = self.server_url(),
            ca = self.ca_cert_path().display(),
        );
        std::fs::write(path, kubeconfig).context("write kubeconfig")
    }

    async fn wait_until_ready(&mut self) -> Result<()> {
        // The apiserver writes its self-signed cert before it serves, but not instantly.
        let ca = self.ca_cert_path();
        self.apiserver.wait_ready(APISERVER_TIMEOUT, || async { ca.is_file() }).await?;
        let client = self.client().await?;
        let readyz = kube::core::Request::new("");
        self.apiserver
            .wait_ready(APISERVER_TIMEOUT, || async {
                let Ok(request) = readyz.get("readyz", &Default::default()) else { return false };
                matches!(client.request_text(request).await, Ok(body) if body.trim() == "ok")
            })
            .await?;
        let namespaces: Api<Namespace> = Api::all(client);
        self.apiserver
            .wait_ready(APISERVER_TIMEOUT, || async {
                matches!(namespaces.get_opt("default").await, Ok(Some(_)))
            })
            .await
    }

    /// `https://127.0.0.1:<port>`
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Gives the watcher's kubeconfig a real token of ServiceAccount `hafleet/hafleet-watcher`
    /// (a TokenRequest, signed by the API server's service-account key, as a pod's projected
    /// token is), once deploy/kubernetes/watcher-rbac.yaml has created that ServiceAccount.
    /// Until then the kubeconfig holds a static token for the same user name.
    pub async fn use_watcher_service_account_token(&self) -> Result<()> {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        use k8s_openapi::api::core::v1::ServiceAccount;
        let accounts: kube::Api<ServiceAccount> =
            kube::Api::namespaced(self.client().await?, "hafleet");
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(24 * 3600),
                ..Default::default()
            }),
            ..Default::default()
        };
        let token = accounts
            .create_token_request("hafleet-watcher", &Default::default(), &request)
            .await
            .context("TokenRequest for ServiceAccount hafleet/hafleet-watcher")?
            .status
            .and_then(|s| s.token)
            .context("TokenRequest without a token")?;
        self.write_kubeconfig(&self.watcher_kubeconfig, WATCHER_USER, &token)
    }

    /// A kubeconfig for the watcher's ServiceAccount (user [`WATCHER_USER`]): it may do only
    /// what deploy/kubernetes/watcher-rbac.yaml grants, once that is applied.
    pub fn watcher_kubeconfig_path(&self) -> &Path {
        &self.watcher_kubeconfig
    }

    /// The bearer token of user `admin` (group `system:masters`).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The apiserver's self-signed serving cert + CA, used as `certificate-authority`.
    pub fn ca_cert_path(&self) -> PathBuf {
        self.dir.path().join("certs/apiserver.crt")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn apiserver_pid(&self) -> u32 {
        self.apiserver.pid()
    }

    pub fn etcd_pid(&self) -> u32 {
        self.etcd.pid()
    }

    pub fn apiserver_log(&self) -> &Path {
        self.apiserver.log_path()
    }

    pub fn etcd_log(&self) -> &Path {
        self.etcd.log_path()
    }

    /// A client built from the kubeconfig file, as a binary given `KUBECONFIG` would build it.
    pub async fn client(&self) -> Result<kube::Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Creates namespace `ns` unless it exists.
    pub async fn ensure_namespace(&self, ns: &str) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client().await?);
        if api.get_opt(ns).await?.is_none() {
            let namespace: Namespace = serde_json::from_value(serde_json::json!({
                "metadata": { "name": ns }
            }))?;
            match api.create(&PostParams::default(), &namespace).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e).with_context(|| format!("create namespace {ns}")),
            }
        }
        Ok(())
    }

    /// Creates a Node with `status.addresses` = [InternalIP `internal_ip`] and `Ready=True`
    /// (the API accepts status on a Node's create).
    pub async fn create_ready_node(&self, name: &str, internal_ip: Ipv4Addr) -> Result<Node> {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": { "kubernetes.io/hostname": name } },
            "status": {
                "addresses": [
                    { "type": "InternalIP", "address": internal_ip.to_string() },
                    { "type": "Hostname", "address": name },
                ],
                "conditions": [ready_condition(true)],
            },
        }))?;
        let api: Api<Node> = Api::all(self.client().await?);
        api.create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("create node {name}"))
    }

    /// Sets the Node's `Ready` condition to True or False (through the status subresource).
    pub async fn set_node_ready(&self, name: &str, ready: bool) -> Result<Node> {
        let api: Api<Node> = Api::all(self.client().await?);
        let patch = serde_json::json!({ "status": { "conditions": [ready_condition(ready)] } });
        api.patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .with_context(|| format!("set node {name} ready={ready}"))
    }

    /// Creates a `NodePort` Service with one TCP port `port` (named `http`, selector
    /// `app=<name>`) and returns the nodePort the apiserver allocated.
    pub async fn create_nodeport_service(&self, ns: &str, name: &str, port: i32) -> Result<i32> {
        let service: Service = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "namespace": ns },
            "spec": {
                "type": "NodePort",
                "selector": { "app": name },
                "ports": [{ "name": "http", "protocol": "TCP", "port": port, "targetPort": port }],
            },
        }))?;
        let api: Api<Service> = Api::namespaced(self.client().await?, ns);
        let created = api
            .create(&PostParams::default(), &service)
            .await
            .with_context(|| format!("create service {ns}/{name}"))?;
        created
            .spec
            .and_then(|s| s.ports)
            .and_then(|p| p.first().and_then(|p| p.node_port))
            .with_context(|| format!("service {ns}/{name} got no nodePort"))
    }
}

fn ready_condition(ready: bool) -> serde_json::Value {
    let now = k8s_openapi::jiff::Timestamp::now().round(k8s_openapi::jiff::Unit::Second);
    let now = now.map(|t| t.to_string()).unwrap_or_default();
    serde_json::json!({
        "type": "Ready",
        "status": if ready { "True" } else { "False" },
        "reason": if ready { "KubeletReady" } else { "KubeletNotReady" },
        "message": "set by hafleet-tests",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    })
}

/// Starts etcd on free ports (retrying on a port race); returns it and its client URL.
async fn start_etcd(bin: &Path, dir: &Path) -> Result<(ChildGuard, String)> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let lo = Ipv4Addr::LOCALHOST.into();
        let [client_port, peer_port] = crate::free_ports::<2>(lo);
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let data_dir = dir.join(format!("etcd-{attempt}"));
        let mut cmd = Command::new(bin);
        cmd.arg("--name=default")
            .arg(format!("--data-dir={}", data_dir.display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=default={peer_url}"))
            // A single member: no peers to wait for, so elect itself at once (saves ~0.5 s).
            .arg("--heartbeat-interval=10")
            .arg("--election-timeout=100")
            .arg("--log-level=warn")
            .arg("--logger=zap");
        let mut child = ChildGuard::spawn("etcd", &mut cmd, &dir.join("etcd.log"))?;
        let health = (Ipv4Addr::LOCALHOST, client_port).into();
        let ready = child
            .wait_ready(ETCD_TIMEOUT, || async move {
                matches!(http_get(health, "127.0.0.1", "/health").await,
                         Ok((200, body)) if body.contains("true"))
            })
            .await;
        match ready {
            Ok(()) => return Ok((child, client_url)),
            Err(e) if attempt < 3 && is_addr_in_use(&e) => continue,
            Err(e) => return Err(e),
        }
    }
}

async fn start_apiserver(bin: &Path, dir: &Path, etcd_url: &str, port: u16) -> Result<ChildGuard> {
    let sa_key = dir.join("sa.key");
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--etcd-servers={etcd_url}"))
        .arg(format!("--secure-port={port}"))
        .arg("--bind-address=127.0.0.1")
        .arg("--advertise-address=127.0.0.1")
        .arg(format!("--cert-dir={}", dir.join("certs").display()))
        // Room for the benches' and the demo's 10,000 NodePort Services (the defaults hold
        // 254 ClusterIPs and 2,768 NodePorts). NodePorts stay below Linux's ephemeral range.
        .arg("--service-cluster-ip-range=10.0.0.0/16")
        .arg("--service-node-port-range=20000-32767")
        .arg(format!("--service-account-key-file={}", sa_key.display()))
        .arg(format!("--service-account-signing-key-file={}", sa_key.display()))
        .arg("--service-account-issuer=https://kubernetes.default.svc")
        .arg("--authorization-mode=RBAC")
        .arg(format!("--token-auth-file={}", dir.join("tokens.csv").display()))
        // Nothing here runs the controllers these would need; they only slow startup.
        .arg("--enable-priority-and-fairness=false")
        .arg("--disable-admission-plugins=ServiceAccount")
        .arg("--endpoint-reconciler-type=none")
        // Kubernetes 1.20 stores EndpointSlices' `serving` and `terminating` conditions only
        // with this gate (alpha there, on by default from 1.22): pods mode drains terminating
        // endpoints by them.
        .arg("--feature-gates=EndpointSliceTerminatingCondition=true")
        .arg("--profiling=false");
    let mut child = ChildGuard::spawn("kube-apiserver", &mut cmd, &dir.join("apiserver.log"))?;
    // Catch an early bind failure (port race) here, so the caller can retry on another port.
    let addr = (Ipv4Addr::LOCALHOST, port).into();
    child.wait_ready(APISERVER_TIMEOUT, || crate::proc::tcp_accepts(addr)).await?;
    Ok(child)
}
