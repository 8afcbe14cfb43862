//! From a fleet's desired state to the model the template renders. Pure and deterministic: the
//! same desired state (the same stream replayed) gives the same model (invariant 4).
//!
//! Decisions made here:
//! - conflicts: the same host + path + match kind claimed by two Ingresses goes to the older
//!   Ingress (creation time, then namespace/name); the other is named in `notes`;
//! - order: none that matters. Rules go into map files looked up by key ([`crate::core::maps`]), which
//!   decide Exact before Prefix and the longest prefix; the model lists rules in claim order;
//! - backends: one per Service port, shared by every rule that points at it, with the NodePort
//!   of the newest route event that carries it (an older Ingress's may be stale), on the nodes
//!   of the newest nodes message (a bounded subset of them for `Cluster` Services).

use crate::core::groups::Conditional;
use crate::core::state::{IngressEntry, Nodes};
use hafleet_proto::{
    Backend, ClusterId, FleetName, IngressKey, NodeAddr, PathKind, ServiceRef, TrafficPolicy,
};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, btree_map::Entry};
use std::net::IpAddr;
use std::sync::Arc;

/// What the template sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RenderModel {
    pub fleet: String,
    pub rules: Vec<Arc<RuleModel>>,
    /// Dispatch: the host and path keys with routes that ask more of a request, or share
    /// requests by weight ([`crate::core::groups`]); `None`: no such route.
    pub dispatch: Option<crate::core::groups::DispatchModel>,
    pub backends: Vec<Arc<BackendModel>>,
    /// With node health checks on: every node, addressed at its health port, in name order;
    /// the template checks each once and servers `track` them.
    pub nodes: Vec<ServerModel>,
    /// The path node health checks ask for (`None`: node health checks off).
    pub node_check_path: Option<String>,
    pub notes: Vec<String>,
    /// With node health checks on, `--spare-backends` empty backends named
    /// `hafleet_spare_<n>` ([`SPARE_PREFIX`]), each with a default backend's settings: the
    /// applier serves a new Service through one of them, at runtime, until the reload that
    /// gives it its own backend (applier/src/core/runtime_api/mod.rs, `bridge`). Through the template's
    /// `backend` macro, after the other backends.
    pub spares: Vec<Arc<BackendModel>>,
    /// Certificates and the files that serve them ([`crate::core::certs::files`]); the template sees
    /// them through `maps`.
    #[serde(skip)]
    pub tls: crate::core::certs::TlsFiles,
    /// Hosts of quarantined Ingresses: in the hosts map without rules, so a request for one
    /// is a 404, never another namespace's wildcard or host-less rule.
    #[serde(skip)]
    pub held_hosts: Vec<String>,
    /// Wildcard hosts of HTTPRoutes (`*.example.com`), which match hosts any number of labels
    /// under theirs, as the Gateway API says (an Ingress's wildcard matches one label).
    #[serde(skip)]
    pub deep_wildcards: Vec<String>,
    /// The fleet's settings, defaults filled in ([`crate::core::settings`]).
    pub settings: crate::core::settings::SettingsModel,
    /// Ports whose every TCP connection a TCPRoute takes, each with its backends, in port
    /// order.
    pub tcp: Vec<TcpModel>,
    /// Passthrough routes that share their connections by weight: the SNI map names each
    /// such route's split, which `hafleet_tls` draws among; by name.
    pub sni_splits: Vec<SniSplit>,
}

/// A passthrough route's backends, drawn among once per connection: the SNI map's value for
/// its name is `name` ([`crate::core::groups::SPLIT_PREFIX`] and the shares' hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SniSplit {
    pub name: String,
    pub total: u32,
    pub shares: Vec<TcpShare>,
}

/// A TCP port of the fleet's hosts and where its connections go: each share's backend, and
/// below which value of one draw in `0..total` it is taken (the last share: `None`, the rest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TcpModel {
    pub port: u16,
    pub total: u32,
    pub shares: Vec<TcpShare>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TcpShare {
    pub backend: String,
    pub below: Option<u32>,
}

/// One draw in `0..total` among `shares` (weight, backend), in their order: the total, and
/// each share with the value its draw must be below (the last: none).
fn draw(shares: &[(u32, String)]) -> (u32, Vec<TcpShare>) {
    let total = shares.iter().map(|(w, _)| *w).sum::<u32>().max(1);
    let mut below = 0;
    let last = shares.len().saturating_sub(1);
    let shares = shares
        .iter()
        .enumerate()
        .map(|(i, (weight, backend))| {
            below += weight;
            TcpShare { backend: backend.clone(), below: (i < last).then_some(below) }
        })
        .collect();
    (total, shares)
}

impl TcpModel {
    /// Port `port` shared by `shares` (weight, backend), in their order.
    fn of(port: u16, shares: &[(u32, String)]) -> TcpModel {
        let (total, shares) = draw(shares);
        TcpModel { port, total, shares }
    }
}

impl SniSplit {
    /// The split of a passthrough route shared by `shares` (weight, backend), named by them:
    /// the same shares in several routes are one split.
    fn of(shares: &[(u32, String)]) -> SniSplit {
        let mut h = fnv1a(b"sni");
        for (weight, backend) in shares {
            h = fnv1a_more(h, format!(" {weight}:{backend}").as_bytes());
        }
        let name = format!("{}{h:016x}", crate::core::groups::SPLIT_PREFIX);
        let (total, shares) = draw(shares);
        SniSplit { name, total, shares }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleModel {
    /// The key the maps store the rule under ([`RuleModel::map_key`]).
    pub key: String,
    /// `None`: any host.
    pub host: Option<String>,
    /// Trailing slash removed for `prefix` (Kubernetes ignores it); as written for `exact`;
    /// empty for `sni`; the port for `tcp`.
    pub path: String,
    /// `exact` or `prefix`; `sni` for a passthrough route, looked up by the SNI of a TLS
    /// connection (its host) in the SNI map, not by a request; `tcp` for a TCPRoute's port.
    pub kind: &'static str,
    pub backend: String,
    /// `namespace/name` of the Ingress the rule comes from.
    pub ingress: String,
}

impl RuleModel {
    /// The key the maps ([`crate::core::maps`]) store the rule under.
    pub fn map_key(&self) -> String {
        let host = self.host.as_deref().unwrap_or("");
        match self.kind {
            "sni" => host.to_owned(),
            "tcp" => self.path.clone(),
            "exact" => format!("{host}{}", self.path),
            _ if self.path == "/" => format!("{host}/"),
            _ => format!("{host}{}/", self.path),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct BackendModel {
    pub name: String,
    /// `namespace/service:port`.
    pub service: String,
    pub servers: Vec<ServerModel>,
    /// The Ingress's `hafleet.io/` settings, as HAProxy writes them. `None`, empty or `false`:
    /// not set (the template's and HAProxy's defaults).
    pub balance: Option<&'static str>,
    pub timeout_connect: Option<String>,
    pub timeout_server: Option<String>,
    /// The client timeout of requests routed here, in milliseconds: not in the backend's
    /// section (HAProxy sets it in the frontend), but in the client-timeouts map
    /// ([`crate::core::maps::Maps::add_client_timeouts`]).
    pub timeout_client_ms: Option<u32>,
    /// `mode tcp`: a passthrough route's backend, carrying TLS connections unopened.
    pub tcp: bool,
    /// `option httpchk GET <path>`.
    pub check_path: Option<String>,
    pub check_interval: Option<String>,
    /// Stickiness: the cookie HAProxy inserts; each server's value is its name.
    pub cookie: Option<String>,
    /// Only these source networks are served (403 for others); empty: everyone.
    pub allow_source: Vec<String>,
    /// Redirect plain-HTTP requests to HTTPS (308).
    pub ssl_redirect: bool,
    /// Most connections per server.
    pub max_conn: Option<u32>,
    /// Deny, rate limit, redirect, headers, rewrite, tunnel timeout; `None`: none of them.
    pub filters: Option<Box<crate::core::filters::FiltersModel>>,
    /// `send-proxy` or `send-proxy-v2` on every server: the Service takes the PROXY protocol.
    pub send_proxy: Option<&'static str>,
    /// Every request is answered with this status, no server tried (an HTTPRoute rule whose
    /// backend cannot be resolved: 500).
    pub fail_status: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ServerModel {
    pub name: String,
    /// `ip:port`, IPv6 in brackets.
    pub addr: String,
    /// `hafleet_nodes/<node>`: the server takes its node's health instead of checking itself.
    pub track: Option<String>,
    /// A terminating pod's endpoint: weight 0, so no new requests; open ones finish.
    pub draining: bool,
}

/// HAProxy proxy name of the backend that health-checks nodes.
pub const NODES_BACKEND: &str = "hafleet_nodes";

/// HAProxy proxy name of a Service port, and of the settings Ingresses route to it with:
/// `be_<namespace>_<service>_<port>`, then, for settings other than the defaults, `_` and the
/// first 8 hex digits of the sha256 of their JSON (each set of settings is its own HAProxy
/// backend), then, for a Service of a named cluster, `:<cluster>`. Kubernetes names and
/// cluster ids never contain `_` or `:`, so the parts cannot run into each other.
fn backend_name(b: &Backend) -> String {
    let name = backend_name_in_cluster(b);
    match &b.service.cluster {
        Some(c) => format!("{name}:{c}"),
        None => name,
    }
}

/// The HAProxy backend a route goes to ([`backend_name`]).
pub fn backend_of(route: &hafleet_proto::Route) -> String {
    backend_name(&route.backend)
}

/// [`backend_name`] without its cluster.
fn backend_name_in_cluster(b: &Backend) -> String {
    let s = &b.service;
    // A backend only acts on `ssl-redirect: "true"`; "false" is about the Ingress's TLS hosts
    // (crate::core::certs), so it must not make a backend of its own (nor rename one).
    let mut options = std::borrow::Cow::Borrowed(&b.options);
    if options.ssl_redirect == Some(false) {
        options.to_mut().ssl_redirect = None;
    }
    match options.is_default() {
        true => format!("be_{}_{}_{}", s.namespace, s.name, s.port),
        false => {
            let json = serde_json::to_vec(&*options).unwrap_or_default();
            let digest = hafleet_proto::sha256_hex(&json);
            format!("be_{}_{}_{}_{}", s.namespace, s.name, s.port, &digest[..8])
        }
    }
}

/// A duration in milliseconds as HAProxy reads it, in the largest unit that divides it.
fn duration(ms: u32) -> String {
    match ms {
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

/// The default of `--servers-per-backend`. Three nodes per `Cluster` Service: any node
/// forwards its traffic, a node that leaves the Ready set is replaced by the next in the
/// Service's rendezvous order (through the runtime API when node health checks are on), and
/// HAProxy 2.6's reload time grows with the number of servers (BENCHMARKS.md: at 10,000
/// Services a reload takes 0.6 s with 3, 1.2 s with 10). Raise it where one Service's
/// traffic needs more entry nodes.
pub const DEFAULT_SERVERS_PER_BACKEND: usize = 3;

/// The default of `--spare-backends`: new Services a host can serve at once ahead of their
/// reload. Each is an empty backend (one proxy among the fleet's thousands).
pub const DEFAULT_SPARE_BACKENDS: usize = 4;

/// The name of the spare backends, before their number: `hafleet_spare_0`, … The applier
/// knows them by it (a name no Service's backend can take: those start with `be_`).
pub const SPARE_PREFIX: &str = "hafleet_spare_";

/// The default of `--node-health-port`: kube-proxy's health port. kube-proxy answers
/// `/healthz` there on every node, and cloud load balancers check it for
/// `externalTrafficPolicy: Cluster` Services (Kubernetes 1.28 and later have it answer 503 on
/// a node being deleted or drained by the cluster autoscaler).
pub const DEFAULT_NODE_HEALTH_PORT: u16 = 10256;

/// The default of `--node-health-path`.
pub const DEFAULT_NODE_HEALTH_PATH: &str = "/healthz";

/// Settings that change what a model holds. Replay must use the renderer's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Most nodes a `Cluster` Service's backend lists (0: all). `Local` Services always list
    /// every node they are given: there, nodes are not interchangeable.
    pub servers_per_backend: usize,
    /// Empty backends rendered for new Services to be served through at runtime, ahead of
    /// their reload (with node health checks on; see [`RenderModel::spares`]).
    pub spare_backends: usize,
    /// Check each node's health once (e.g. kube-proxy's `:10256/healthz`) and have the
    /// servers of `Cluster` backends track it, instead of checking every server.
    pub node_health: Option<NodeHealth>,
}

/// Where a node answers for its own health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHealth {
    pub port: u16,
    pub path: hafleet_proto::HttpPath,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            servers_per_backend: DEFAULT_SERVERS_PER_BACKEND,
            spare_backends: DEFAULT_SPARE_BACKENDS,
            node_health: Some(NodeHealth {
                port: DEFAULT_NODE_HEALTH_PORT,
                path: hafleet_proto::HttpPath::new(DEFAULT_NODE_HEALTH_PATH)
                    .expect("the default path passes the allowlist"),
            }),
        }
    }
}

/// FNV-1a, 64 bits. Part of the output's definition: changing it would move every subset.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_more(0xcbf2_9ce4_8422_2325, bytes)
}

/// FNV-1a of what was hashed into `h`, then `bytes`: hashing pieces one after the other is
/// hashing them joined.
fn fnv1a_more(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

/// A Service port's seed in rendezvous scores: FNV-1a of `namespace/name:port`, spread.
fn seed(s: &ServiceRef) -> u64 {
    let mut port = itoa::Buffer::new();
    [
        s.namespace.as_str().as_bytes(),
        b"/",
        s.name.as_str().as_bytes(),
        b":",
        port.format(s.port).as_bytes(),
    ]
    .iter()
    .fold(0xcbf2_9ce4_8422_2325, |h, piece| fnv1a_more(h, piece))
    .wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// SplitMix64's finaliser: spreads a combined hash over all 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A server a backend may list: a node at the backend's NodePort.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Candidate<'a> {
    pub node: &'a str,
    pub addr: IpAddr,
    pub port: u16,
    /// `addr` written for a server line, with its `:` (`10.0.0.1:`, `[fd00::1]:`), when the
    /// pool wrote it once for every backend.
    pub written: Option<&'a str>,
}

/// The nodes that NodePort backends' servers come from, each name hashed once per render
/// rather than once per backend: every cluster's, grouped by cluster, each group in name order.
pub struct NodePool<'a> {
    nodes: Vec<&'a NodeAddr>,
    /// Each node's server name: its name, and `:<cluster>` after it in a named cluster (two
    /// clusters may both have a `node-1`).
    names: Vec<std::borrow::Cow<'a, str>>,
    hashes: Vec<u64>,
    /// Each node's address as a server line writes it before the port.
    written: Vec<String>,
    /// Where each cluster's nodes are in `nodes`.
    clusters: BTreeMap<Option<&'a ClusterId>, std::ops::Range<usize>>,
}

impl<'a> NodePool<'a> {
    /// The nodes of one cluster, the one of watchers without `--cluster-id`.
    pub fn new(nodes: &'a [NodeAddr]) -> Self {
        Self::with(std::iter::once((None, nodes)))
    }

    /// Every cluster's nodes.
    pub fn of(nodes: &'a Nodes) -> Self {
        Self::with(nodes.iter().map(|(c, n)| (c.as_ref(), n.as_slice())))
    }

    fn with(groups: impl Iterator<Item = (Option<&'a ClusterId>, &'a [NodeAddr])>) -> Self {
        let mut pool = NodePool {
            nodes: vec![],
            names: vec![],
            hashes: vec![],
            written: vec![],
            clusters: BTreeMap::new(),
        };
        for (cluster, nodes) in groups {
            let start = pool.nodes.len();
            for n in nodes {
                pool.nodes.push(n);
                pool.names.push(match cluster {
                    Some(c) => format!("{}:{c}", n.name).into(),
                    None => n.name.as_str().into(),
                });
                pool.hashes.push(fnv1a(n.name.as_str().as_bytes()));
                pool.written.push(match n.addr {
                    IpAddr::V4(ip) => format!("{ip}:"),
                    IpAddr::V6(ip) => format!("[{ip}]:"),
                });
            }
            pool.clusters.insert(cluster, start..pool.nodes.len());
        }
        pool
    }

    /// Where `cluster`'s nodes are (none: an empty range).
    fn range(&self, cluster: Option<&ClusterId>) -> std::ops::Range<usize> {
        self.clusters.get(&cluster).cloned().unwrap_or(0..0)
    }

    /// The servers a route message of schema 1 or 2 listed itself, with their nodes' hashes.
    fn listed(backend: &'a Backend) -> impl Iterator<Item = (u64, Candidate<'a>)> {
        backend.servers.iter().map(|s| {
            let c = Candidate { node: s.node.as_str(), addr: s.addr, port: s.port, written: None };
            (fnv1a(c.node.as_bytes()), c)
        })
    }

    /// The pool's `i`th node at `port`.
    fn at(&self, i: usize, port: u16) -> Candidate<'_> {
        let n = self.nodes[i];
        Candidate { node: &self.names[i], addr: n.addr, port, written: Some(&self.written[i]) }
    }
}

/// Rendezvous (highest random weight) choice of `k` of a `Cluster` backend's servers: each
/// node scores `mix(hash(service) * C ^ hash(node))` and the `k` best are kept. The same nodes
/// give the same subset, and a node joining or leaving changes only the subsets it enters or
/// leaves: about `k / nodes` of the backends. The kept servers stay in node-name order.
///
/// Every server the backend could list is the pool's nodes at its NodePort, or the servers a
/// route message of schema 1 or 2 listed itself.
pub fn subset<'a>(backend: &'a Backend, pool: &'a NodePool<'a>, k: usize) -> Vec<Candidate<'a>> {
    match (backend.servers.is_empty(), backend.node_port) {
        (false, _) => pick(backend, NodePool::listed(backend), backend.servers.len(), k),
        (true, Some(port)) => pick_from_pool(backend, pool, port, k),
        (true, None) => vec![],
    }
}

/// [`pick`] for the nodes of the backend's cluster in the pool at `port`, scoring node indices
/// rather than candidates. The pool is in node-name order within a cluster, so a tie (of two
/// 64-bit scores) goes to the same node as in [`pick`].
fn pick_from_pool<'a>(
    backend: &Backend,
    pool: &'a NodePool<'a>,
    port: u16,
    k: usize,
) -> Vec<Candidate<'a>> {
    let range = pool.range(backend.service.cluster.as_ref());
    if backend.traffic_policy == TrafficPolicy::Local {
        // Only nodes with an endpoint of their own forward: those, all of them (a subset
        // could leave out the only one). Both lists are in node-name order.
        return match &backend.endpoint_nodes {
            Some(on) => range
                .filter(|i| on.contains(&pool.nodes[*i].name))
                .map(|i| pool.at(i, port))
                .collect(),
            None => range.map(|i| pool.at(i, port)).collect(),
        };
    }
    if k == 0 || range.len() <= k {
        return range.map(|i| pool.at(i, port)).collect();
    }
    let seed = seed(&backend.service);
    let first = u32::try_from(range.start).expect("fewer than 2^32 nodes");
    let mut scored: Vec<(u64, u32)> =
        pool.hashes[range].iter().zip(first..).map(|(node, i)| (mix(seed ^ node), i)).collect();
    scored.select_nth_unstable_by(k - 1, |a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let mut kept: Vec<u32> = scored[..k].iter().map(|(_, i)| *i).collect();
    kept.sort_unstable();
    kept.into_iter().map(|i| pool.at(i as usize, port)).collect()
}

/// [`subset`] of the `n` servers `all` gives.
fn pick<'a>(
    backend: &Backend,
    all: impl Iterator<Item = (u64, Candidate<'a>)>,
    n: usize,
    k: usize,
) -> Vec<Candidate<'a>> {
    if k == 0 || n <= k || backend.traffic_policy == TrafficPolicy::Local {
        return all.map(|(_, c)| c).collect();
    }
    let seed = seed(&backend.service);
    let mut scored: Vec<(u64, Candidate<'a>)> =
        all.map(|(node, c)| (mix(seed ^ node), c)).collect();
    scored.select_nth_unstable_by(k - 1, |a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    scored.truncate(k);
    let mut kept: Vec<Candidate<'a>> = scored.into_iter().map(|(_, c)| c).collect();
    kept.sort_unstable();
    kept
}

/// Whether a backend's servers track their nodes' health rather than checking themselves:
/// only `Cluster` ones, where any node that forwards at all can serve. A `Local` Service is
/// served only by nodes with an endpoint of their own, which a node check cannot see.
fn tracks_nodes(backend: &Backend, options: &Options) -> bool {
    options.node_health.is_some()
        && backend.traffic_policy == TrafficPolicy::Cluster
        && backend.pods.is_none()
}

/// A backend's model from its chosen servers.
fn backend_model(
    name: String,
    backend: &Backend,
    servers: &[Candidate],
    track: bool,
) -> BackendModel {
    let s = &backend.service;
    let o = &backend.options;
    // A TCP backend (a passthrough route's) sees no request: nothing HTTP applies to it,
    // whatever its options say.
    let http = !o.tcp;
    BackendModel {
        name,
        service: format!("{}/{}:{}", s.namespace, s.name, s.port),
        balance: o.balance.map(|b| b.as_str()),
        timeout_connect: o.timeout_connect_ms.map(duration),
        timeout_server: o.timeout_server_ms.map(duration),
        timeout_client_ms: o.timeout_client_ms.filter(|_| http),
        tcp: o.tcp,
        check_path: o.health_check_path.as_ref().filter(|_| http).map(|p| p.to_string()),
        check_interval: o.health_check_interval_ms.map(duration),
        cookie: o.sticky_cookie.as_ref().filter(|_| http).map(|c| c.to_string()),
        allow_source: match http {
            true => o.allow_source.iter().map(|c| c.to_string()).collect(),
            false => Vec::new(),
        },
        ssl_redirect: http && o.ssl_redirect == Some(true),
        max_conn: o.max_conn,
        filters: crate::core::filters::FiltersModel::of(o).filter(|_| http).map(Box::new),
        send_proxy: o.send_proxy.map(|p| p.server_keyword()),
        fail_status: o.fail_status.map(|f| f.code()),
        servers: match &backend.pods {
            Some(pods) => pods.iter().map(pod_server).collect(),
            None => node_servers(servers, track),
        },
    }
}

/// The server of a pod's endpoint, named after its address and port (`10.1.2.3:8080`; names
/// may hold `:` and `.`), so the same endpoint is the same server in every version and the
/// applier adds and removes endpoints at runtime.
fn pod_server(pod: &hafleet_proto::PodEndpoint) -> ServerModel {
    let addr = std::net::SocketAddr::new(pod.addr, pod.port).to_string();
    ServerModel {
        name: format!("{}:{}", pod.addr, pod.port),
        addr,
        track: None,
        draining: pod.draining,
    }
}

/// The servers of a backend in nodes mode: its chosen nodes at the NodePort.
fn node_servers(servers: &[Candidate], track: bool) -> Vec<ServerModel> {
    servers
        .iter()
        .map(|c| ServerModel {
            name: c.node.to_owned(),
            addr: match c.written {
                Some(ip) => {
                    let mut port = itoa::Buffer::new();
                    let port = port.format(c.port);
                    let mut addr = String::with_capacity(ip.len() + port.len());
                    addr.push_str(ip);
                    addr.push_str(port);
                    addr
                }
                None => std::net::SocketAddr::new(c.addr, c.port).to_string(),
            },
            track: track.then(|| format!("{NODES_BACKEND}/{}", c.node)),
            draining: false,
        })
        .collect()
}

/// What one build of a fleet's model lends the next: each Ingress's rules (for as long as its
/// routes are the same) and each backend's model (its subset of nodes chosen, its addresses
/// written; for as long as the nodes and options are the same). Each depends on nothing else,
/// so a hit is exactly what building it again would give, and one change to a fleet of 10,000
/// Ingresses builds one Ingress's rules and one backend, not 10,000.
///
/// Entries are looked up in place and stamped with the build that used them; a build drops
/// the ones it did not use. An Ingress whose routes are the same `Arc` as last time is known
/// without comparing them.
#[derive(Debug, Default)]
pub struct Memo {
    nodes: Nodes,
    options: Option<Options>,
    /// Which build this is: what an entry's stamp is compared with.
    build: u64,
    backends: HashMap<Backend, (u64, Arc<BackendModel>), foldhash::fast::RandomState>,
    rules: HashMap<IngressKey, RulesOf, foldhash::fast::RandomState>,
}

impl Memo {
    /// Forgets every backend unless `nodes` and `options` are those it was filled with.
    fn check(&mut self, nodes: &Nodes, options: &Options) {
        if self.nodes != *nodes || self.options.as_ref() != Some(options) {
            self.backends.clear();
            self.nodes = nodes.clone();
            self.options = Some(options.clone());
        }
    }
}

/// The models of the backends (name → newest event's sequence and backend), and, with node
/// health checks on, the nodes tracked servers follow, each once, at its health port, in
/// node-name order: every node of `pool`, and the nodes that servers listed by route messages
/// of schema 1 or 2 name (at the address of the newest event, `seq`, that names them). Every
/// node is listed, not only those some subset holds, so that a backend moving to another node
/// never adds a health check (which only a reload can).
fn backend_models(
    backends: BTreeMap<std::borrow::Cow<'_, str>, (u64, &Backend)>,
    pool: &NodePool,
    options: &Options,
    memo: &mut Memo,
) -> (Vec<Arc<BackendModel>>, Vec<ServerModel>) {
    let mut listed: BTreeMap<&str, (u64, IpAddr)> = BTreeMap::new();
    for (seq, backend) in backends.values() {
        if tracks_nodes(backend, options) {
            for s in &backend.servers {
                let slot = listed.entry(s.node.as_str()).or_insert((*seq, s.addr));
                if *seq > slot.0 {
                    *slot = (*seq, s.addr);
                }
            }
        }
    }
    // The memo's models where it has them; the others built, on every core if there are many
    // (a fresh renderer, or new nodes).
    let backends: Vec<(&str, &Backend)> =
        backends.iter().map(|(name, (_, backend))| (name.as_ref(), *backend)).collect();
    let build = memo.build;
    let Ok(all) = crate::core::par::reuse_or_build(
        &backends,
        |(_, backend)| {
            let (used, model) = memo.backends.get_mut(*backend)?;
            *used = build;
            Some((None, Arc::clone(model)))
        },
        |part| {
            let built = part.iter().map(|(name, backend)| {
                let servers = subset(backend, pool, options.servers_per_backend);
                let track = tracks_nodes(backend, options);
                let model = backend_model((*name).to_owned(), backend, &servers, track);
                (Some(*backend), Arc::new(model))
            });
            Ok::<_, std::convert::Infallible>(built.collect())
        },
    );
    let models = all
        .into_iter()
        .map(|(built, model)| {
            if let Some(backend) = built {
                memo.backends.insert(backend.clone(), (build, Arc::clone(&model)));
            }
            model
        })
        .collect();
    memo.backends.retain(|_, (used, _)| *used == build);
    let nodes = match &options.node_health {
        Some(health) => {
            let mut all: BTreeMap<&str, IpAddr> =
                listed.into_iter().map(|(name, (_, ip))| (name, ip)).collect();
            all.extend(pool.names.iter().zip(&pool.nodes).map(|(name, n)| (&**name, n.addr)));
            all.into_iter()
                .map(|(name, ip)| ServerModel {
                    name: name.to_owned(),
                    addr: std::net::SocketAddr::new(ip, health.port).to_string(),
                    track: None,
                    draining: false,
                })
                .collect()
        }
        None => vec![],
    };
    (models, nodes)
}

/// The rules of one Ingress's routes, one per route, as they were last built.
#[derive(Debug)]
struct RulesOf {
    routes: Arc<Vec<hafleet_proto::Route>>,
    rules: Arc<[Arc<RuleModel>]>,
    /// The build that last used it ([`Memo::build`]).
    used: u64,
}

/// The rule of each route of `key`: a route's claim is its host, its path (a prefix without
/// its trailing `/`) and its kind, which is what its map key says.
fn rules_of(key: &IngressKey, routes: &[hafleet_proto::Route]) -> Arc<[Arc<RuleModel>]> {
    let ingress = key.to_string();
    routes
        .iter()
        .map(|route| {
            let passthrough = route.is_passthrough();
            let port = route.tcp_port();
            let path = match route.kind {
                _ if passthrough => String::new(),
                _ if port.is_some() => port.unwrap_or_default().to_string(),
                PathKind::Prefix => route.path.trimmed().as_str().to_owned(),
                PathKind::Exact => route.path.as_str().to_owned(),
            };
            let mut rule = RuleModel {
                host: route.host.as_ref().map(|h| h.as_str().to_owned()),
                path,
                kind: match route.kind {
                    _ if passthrough => "sni",
                    _ if port.is_some() => "tcp",
                    PathKind::Exact => "exact",
                    PathKind::Prefix => "prefix",
                },
                backend: backend_name(&route.backend),
                ingress: ingress.clone(),
                key: String::new(),
            };
            rule.key = rule.map_key();
            Arc::new(rule)
        })
        .collect()
}

/// A route's backends with their weights, by HAProxy name: its own (named as `rule` names it)
/// first.
fn shares_of(route: &hafleet_proto::Route, rule: &RuleModel) -> Vec<(u32, String)> {
    let more = route.more.as_deref();
    let mut shares = vec![(more.and_then(|m| m.weight).unwrap_or(1), rule.backend.clone())];
    for (weight, backend) in more.map(|m| m.split.as_slice()).unwrap_or_default() {
        shares.push((*weight, backend_name(backend)));
    }
    shares
}

/// Builds the model of one fleet with the default [`Options`].
pub fn build(
    fleet: &FleetName,
    ingresses: &BTreeMap<IngressKey, IngressEntry>,
    nodes: &[NodeAddr],
) -> RenderModel {
    build_with(fleet, ingresses, nodes, &Options::default())
}

/// Builds the model of one fleet whose NodePort backends go to `nodes` (of one cluster, the
/// one of watchers without `--cluster-id`).
pub fn build_with(
    fleet: &FleetName,
    ingresses: &BTreeMap<IngressKey, IngressEntry>,
    nodes: &[NodeAddr],
    options: &Options,
) -> RenderModel {
    let nodes = Nodes::from([(None, nodes.to_vec())]);
    build_memo(fleet, ingresses, &nodes, options, &mut Memo::default())
}

/// Builds the model of one fleet whose NodePort backends go to the nodes of their Service's
/// cluster, taking what it can from `memo` (the same fleet's last build) and leaving in it
/// what the next build can take.
pub fn build_memo(
    fleet: &FleetName,
    ingresses: &BTreeMap<IngressKey, IngressEntry>,
    nodes: &Nodes,
    options: &Options,
    memo: &mut Memo,
) -> RenderModel {
    let mut owners: Vec<(&IngressKey, &IngressEntry)> = ingresses.iter().collect();
    owners.sort_by_key(|(key, entry)| (entry.created_unix, *key));

    // Each Ingress's rules as built last time, unless its routes changed; the others built,
    // on every core if there are many (a fresh renderer).
    memo.build += 1;
    let build = memo.build;
    let Ok(all) = crate::core::par::reuse_or_build(
        &owners,
        |(key, entry)| {
            let kept = memo.rules.get_mut(*key)?;
            if !Arc::ptr_eq(&kept.routes, &entry.routes) {
                if kept.routes != entry.routes {
                    return None;
                }
                kept.routes = Arc::clone(&entry.routes);
            }
            kept.used = build;
            Some((None, Arc::clone(&kept.rules)))
        },
        |part| {
            let built = part.iter().map(|(key, entry)| (Some(*key), rules_of(key, &entry.routes)));
            Ok::<_, std::convert::Infallible>(built.collect())
        },
    );
    let built: Vec<Arc<[Arc<RuleModel>]>> = all
        .into_iter()
        .zip(&owners)
        .map(|((fresh, rules), (_, entry))| {
            if let Some(key) = fresh {
                let kept = RulesOf {
                    routes: Arc::clone(&entry.routes),
                    rules: Arc::clone(&rules),
                    used: build,
                };
                memo.rules.insert(key.clone(), kept);
            }
            rules
        })
        .collect();
    memo.rules.retain(|_, kept| kept.used == build);

    // A claim is a rule's map (kind) and key; the first (oldest) Ingress to make it wins.
    // Routes that ask more of a request (HTTPRoute matches) claim nothing: they are
    // candidates of their key's dispatch group ([`crate::core::groups`]).
    let mut claimed: HashMap<(&str, &str), (&IngressKey, usize), foldhash::fast::RandomState> =
        HashMap::with_capacity_and_hasher(owners.len() * 2, Default::default());
    let mut rules = Vec::with_capacity(owners.len() * 2);
    let mut backends: BTreeMap<std::borrow::Cow<'_, str>, (u64, &Backend)> = BTreeMap::new();
    let mut notes = Vec::new();
    let mut conditional: BTreeMap<(&'static str, String), Vec<Conditional>> = BTreeMap::new();
    let mut weighted: HashMap<(&str, &str), Vec<(u32, String)>, foldhash::fast::RandomState> =
        HashMap::default();
    let mut tcp: Vec<TcpModel> = Vec::new();
    let mut sni_splits: BTreeMap<String, SniSplit> = BTreeMap::new();

    for ((key, entry), built) in owners.iter().zip(&built) {
        for (route, rule) in entry.routes.iter().zip(built.iter()) {
            let more = route.more.as_deref();
            let shares = || shares_of(route, rule);
            match more {
                Some(m) if !m.has_no_conditions() => {
                    conditional.entry((rule.kind, rule.key.clone())).or_default().push(
                        Conditional {
                            precedence: m.precedence(),
                            asks: crate::core::groups::Asks::of(m),
                            shares: shares(),
                            rule: Arc::clone(rule),
                        },
                    );
                }
                _ => match claimed.entry((rule.kind, rule.key.as_str())) {
                    std::collections::hash_map::Entry::Occupied(claim) => {
                        let owner = claim.get().0;
                        if owner != *key {
                            notes.push(format!(
                                "{key}: {}{} ({:?}) is already routed by {owner}, the older \
                                 Ingress; ignored",
                                rule.host.as_deref().unwrap_or("*"),
                                rule.path,
                                route.kind,
                            ));
                        }
                        continue;
                    }
                    std::collections::hash_map::Entry::Vacant(slot) => {
                        slot.insert((key, rules.len()));
                        rules.push(Arc::clone(rule));
                        let split = more.is_some_and(|m| !m.split.is_empty());
                        match route.tcp_port() {
                            // A TCP port's own frontend draws among its shares.
                            Some(port) => tcp.push(TcpModel::of(port, &shares())),
                            // So does hafleet_tls, for a name the SNI map gives to a split.
                            None if split && route.is_passthrough() => {
                                let sni = SniSplit::of(&shares());
                                let named =
                                    RuleModel { backend: sni.name.clone(), ..(**rule).clone() };
                                if let Some(last) = rules.last_mut() {
                                    *last = Arc::new(named);
                                }
                                sni_splits.insert(sni.name.clone(), sni);
                            }
                            None if split => {
                                weighted.insert((rule.kind, rule.key.as_str()), shares());
                            }
                            None => {}
                        }
                    }
                },
            }
            // Every Ingress carries the Service's NodePort as resolved when it was last
            // published; the newest event's is the current one.
            for (i, backend) in route.backends().enumerate() {
                let name = match i {
                    0 => std::borrow::Cow::Borrowed(rule.backend.as_str()),
                    _ => std::borrow::Cow::Owned(backend_name(backend)),
                };
                match backends.entry(name) {
                    Entry::Vacant(slot) => {
                        slot.insert((entry.seq, backend));
                    }
                    Entry::Occupied(mut slot) if entry.seq > slot.get().0 => {
                        slot.insert((entry.seq, backend));
                    }
                    Entry::Occupied(_) => {}
                }
            }
        }
    }
    let claimed_at = claimed.iter().map(|(k, (_, i))| (*k, *i)).collect();
    let dispatch = crate::core::groups::build(&mut rules, &claimed_at, &weighted, conditional);

    memo.check(nodes, options);
    let (backends, nodes) = backend_models(backends, &NodePool::of(nodes), options, memo);
    RenderModel {
        fleet: fleet.to_string(),
        rules,
        dispatch,
        backends,
        nodes,
        node_check_path: options.node_health.as_ref().map(|h| h.path.to_string()),
        notes,
        spares: spares(options),
        tls: Default::default(),
        held_hosts: Vec::new(),
        deep_wildcards: Vec::new(),
        settings: Default::default(),
        tcp: {
            tcp.sort_by_key(|t| t.port);
            tcp
        },
        sni_splits: sni_splits.into_values().collect(),
    }
}

/// The spare backends `options` ask for: none without node health checks, where a server
/// added at runtime would have no health check to track.
fn spares(options: &Options) -> Vec<Arc<BackendModel>> {
    let count = if options.node_health.is_some() { options.spare_backends } else { 0 };
    (0..count)
        .map(|n| {
            Arc::new(BackendModel {
                name: format!("{SPARE_PREFIX}{n}"),
                service: "spare: serves a new Service until the reload that names it".into(),
                servers: vec![],
                balance: None,
                timeout_connect: None,
                timeout_server: None,
                timeout_client_ms: None,
                tcp: false,
                check_path: None,
                check_interval: None,
                cookie: None,
                allow_source: vec![],
                ssl_redirect: false,
                max_conn: None,
                filters: None,
                send_proxy: None,
                fail_status: None,
            })
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests;
