//! From a fleet's desired state to the model the template renders. Pure and deterministic: the
//! same desired state (the same stream replayed) gives the same model (invariant 4).
//!
//! Decisions made here:
//! - conflicts: the same host + path + match kind claimed by two Ingresses goes to the older
//!   Ingress (creation time, then namespace/name); the other is named in `notes`;
//! - order: none that matters. Rules go into map files looked up by key ([`crate::maps`]), which
//!   decide Exact before Prefix and the longest prefix; the model lists rules in claim order;
//! - backends: one per Service port, shared by every rule that points at it, with the NodePort
//!   of the newest route event that carries it (an older Ingress's may be stale), on the nodes
//!   of the newest nodes message (a bounded subset of them for `Cluster` Services).

use crate::state::{IngressEntry, Nodes};
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
    /// gives it its own backend (applier/src/runtime.rs, `bridge`). Through the template's
    /// `backend` macro, after the other backends.
    pub spares: Vec<Arc<BackendModel>>,
    /// Certificates and the files that serve them ([`crate::tls::files`]); the template sees
    /// them through `maps`.
    #[serde(skip)]
    pub tls: crate::tls::TlsFiles,
    /// Hosts of quarantined Ingresses: in the hosts map without rules, so a request for one
    /// is a 404, never another namespace's wildcard or host-less rule.
    #[serde(skip)]
    pub held_hosts: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleModel {
    /// The key the maps store the rule under ([`crate::maps::key`]).
    pub key: String,
    /// `None`: any host.
    pub host: Option<String>,
    /// Trailing slash removed for `prefix` (Kubernetes ignores it); as written for `exact`.
    pub path: String,
    /// `exact` or `prefix`.
    pub kind: &'static str,
    pub backend: String,
    /// `namespace/name` of the Ingress the rule comes from.
    pub ingress: String,
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
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ServerModel {
    pub name: String,
    /// `ip:port`, IPv6 in brackets.
    pub addr: String,
    /// `hafleet_nodes/<node>`: the server takes its node's health instead of checking itself.
    pub track: Option<String>,
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
    // (crate::tls), so it must not make a backend of its own (nor rename one).
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
fn fnv1a(bytes: &[u8]) -> u64 {
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
    options.node_health.is_some() && backend.traffic_policy == TrafficPolicy::Cluster
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
    BackendModel {
        name,
        service: format!("{}/{}:{}", s.namespace, s.name, s.port),
        balance: o.balance.map(|b| b.as_str()),
        timeout_connect: o.timeout_connect_ms.map(duration),
        timeout_server: o.timeout_server_ms.map(duration),
        check_path: o.health_check_path.as_ref().map(|p| p.to_string()),
        check_interval: o.health_check_interval_ms.map(duration),
        cookie: o.sticky_cookie.as_ref().map(|c| c.to_string()),
        allow_source: o.allow_source.iter().map(|c| c.to_string()).collect(),
        ssl_redirect: o.ssl_redirect == Some(true),
        max_conn: o.max_conn,
        servers: servers
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
            })
            .collect(),
    }
}

/// What one build of a fleet's model lends the next: each Ingress's rules (for as long as its
/// routes are the same) and each backend's model (its subset of nodes chosen, its addresses
/// written; for as long as the nodes and options are the same). Each depends on nothing else,
/// so a hit is exactly what building it again would give, and one change to a fleet of 10,000
/// Ingresses builds one Ingress's rules and one backend, not 10,000.
#[derive(Debug, Default)]
pub struct Memo {
    nodes: Nodes,
    options: Option<Options>,
    backends: HashMap<Backend, Arc<BackendModel>, foldhash::fast::RandomState>,
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
    backends: BTreeMap<&str, (u64, &Backend)>,
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
        backends.into_iter().map(|(name, (_, backend))| (name, backend)).collect();
    let Ok(all) = crate::par::reuse_or_build(
        &backends,
        |(_, backend)| memo.backends.remove_entry(*backend),
        |part| {
            let built = part.iter().map(|(name, backend)| {
                let servers = subset(backend, pool, options.servers_per_backend);
                let track = tracks_nodes(backend, options);
                let model = backend_model((*name).to_owned(), backend, &servers, track);
                ((*backend).clone(), Arc::new(model))
            });
            Ok::<_, std::convert::Infallible>(built.collect())
        },
    );
    let mut kept = HashMap::with_capacity_and_hasher(all.len(), Default::default());
    let models = all
        .into_iter()
        .map(|(key, model)| {
            kept.insert(key, Arc::clone(&model));
            model
        })
        .collect();
    memo.backends = kept;
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
    routes: Vec<hafleet_proto::Route>,
    rules: Arc<[Arc<RuleModel>]>,
}

/// The rule of each route of `key`: a route's claim is its host, its path (a prefix without
/// its trailing `/`) and its kind, which is what its map key says.
fn rules_of(key: &IngressKey, routes: &[hafleet_proto::Route]) -> Arc<[Arc<RuleModel>]> {
    let ingress = key.to_string();
    routes
        .iter()
        .map(|route| {
            let path = match route.kind {
                PathKind::Prefix => route.path.trimmed().as_str().to_owned(),
                PathKind::Exact => route.path.as_str().to_owned(),
            };
            let mut rule = RuleModel {
                host: route.host.as_ref().map(|h| h.as_str().to_owned()),
                path,
                kind: match route.kind {
                    PathKind::Exact => "exact",
                    PathKind::Prefix => "prefix",
                },
                backend: backend_name(&route.backend),
                ingress: ingress.clone(),
                key: String::new(),
            };
            rule.key = crate::maps::key(&rule);
            Arc::new(rule)
        })
        .collect()
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
    let mut old = std::mem::take(&mut memo.rules);
    let Ok(all) = crate::par::reuse_or_build(
        &owners,
        |(key, entry)| old.remove_entry(*key).filter(|(_, kept)| kept.routes == entry.routes),
        |part| {
            let built = part.iter().map(|(key, entry)| {
                let rules = rules_of(key, &entry.routes);
                ((*key).clone(), RulesOf { routes: entry.routes.clone(), rules })
            });
            Ok::<_, std::convert::Infallible>(built.collect())
        },
    );
    drop(old);
    memo.rules.reserve(all.len());
    let built: Vec<Arc<[Arc<RuleModel>]>> = all
        .into_iter()
        .map(|(key, kept)| {
            let rules = Arc::clone(&kept.rules);
            memo.rules.insert(key, kept);
            rules
        })
        .collect();

    // A claim is a rule's map (kind) and key; the first (oldest) Ingress to make it wins.
    let mut claimed: HashMap<(&str, &str), &IngressKey, foldhash::fast::RandomState> =
        HashMap::with_capacity_and_hasher(owners.len() * 2, Default::default());
    let mut rules = Vec::with_capacity(owners.len() * 2);
    let mut backends: BTreeMap<&str, (u64, &Backend)> = BTreeMap::new();
    let mut notes = Vec::new();

    for ((key, entry), built) in owners.iter().zip(&built) {
        for (route, rule) in entry.routes.iter().zip(built.iter()) {
            match claimed.entry((rule.kind, rule.key.as_str())) {
                std::collections::hash_map::Entry::Occupied(claim) => {
                    let owner = *claim.get();
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
                    slot.insert(key);
                    rules.push(Arc::clone(rule));
                }
            }
            // Every Ingress carries the Service's NodePort as resolved when it was last
            // published; the newest event's is the current one.
            match backends.entry(rule.backend.as_str()) {
                Entry::Vacant(slot) => {
                    slot.insert((entry.seq, &route.backend));
                }
                Entry::Occupied(mut slot) if entry.seq > slot.get().0 => {
                    slot.insert((entry.seq, &route.backend));
                }
                Entry::Occupied(_) => {}
            }
        }
    }

    memo.check(nodes, options);
    let (backends, nodes) = backend_models(backends, &NodePool::of(nodes), options, memo);
    RenderModel {
        fleet: fleet.to_string(),
        rules,
        backends,
        nodes,
        node_check_path: options.node_health.as_ref().map(|h| h.path.to_string()),
        notes,
        spares: spares(options),
        tls: Default::default(),
        held_hosts: Vec::new(),
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
                check_path: None,
                check_interval: None,
                cookie: None,
                allow_source: vec![],
                ssl_redirect: false,
                max_conn: None,
            })
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use hafleet_proto::{Backend, HttpHost, HttpPath, Namespace, ObjectName, Route, Server};

    fn one_node() -> Vec<NodeAddr> {
        vec![NodeAddr {
            name: ObjectName::new("node-1").unwrap(),
            addr: "127.0.0.2".parse().unwrap(),
        }]
    }

    pub(crate) fn route(host: Option<&str>, path: &str, kind: PathKind, svc: &str) -> Route {
        Route {
            host: host.map(|h| HttpHost::new(h).unwrap()),
            path: HttpPath::new(path).unwrap(),
            kind,
            backend: Backend {
                service: ServiceRef {
                    namespace: Namespace::new("default").unwrap(),
                    name: ObjectName::new(svc).unwrap(),
                    port: 80,
                    cluster: None,
                },
                node_port: Some(30080),
                servers: vec![],
                traffic_policy: hafleet_proto::TrafficPolicy::Cluster,
                endpoint_nodes: None,
                options: Default::default(),
            },
        }
    }

    fn fleet_of(entries: Vec<(&str, i64, Vec<Route>)>) -> BTreeMap<IngressKey, IngressEntry> {
        entries
            .into_iter()
            .map(|(name, created, routes)| {
                (
                    IngressKey::new("default", name).unwrap(),
                    IngressEntry {
                        created_unix: created,
                        resource_version: "1".into(),
                        routes,
                        seq: 0,
                        tls: Vec::new(),
                        quarantined: None,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn the_older_ingress_wins_a_conflict_and_the_loser_is_noted() {
        let f = FleetName::new("edge").unwrap();
        let state = fleet_of(vec![
            ("young", 200, vec![route(Some("a.com"), "/x/", PathKind::Prefix, "young")]),
            ("old", 100, vec![route(Some("a.com"), "/x", PathKind::Prefix, "old")]),
        ]);
        let m = build(&f, &state, &one_node());
        assert_eq!(m.rules.len(), 1);
        assert_eq!(m.rules[0].ingress, "default/old");
        assert_eq!(m.backends.len(), 1);
        assert_eq!(m.notes.len(), 1);
        assert!(m.notes[0].starts_with("default/young: a.com/x"), "{}", m.notes[0]);
    }

    #[test]
    fn shared_services_take_the_server_list_of_the_newest_event() {
        let f = FleetName::new("edge").unwrap();
        let mut state = fleet_of(vec![
            ("old", 1, vec![route(Some("a.com"), "/", PathKind::Prefix, "web")]),
            ("new", 2, vec![route(Some("b.com"), "/", PathKind::Prefix, "web")]),
        ]);
        let old = IngressKey::new("default", "old").unwrap();
        let new = IngressKey::new("default", "new").unwrap();
        state.get_mut(&old).unwrap().seq = 5;
        state.get_mut(&new).unwrap().seq = 9;
        state.get_mut(&new).unwrap().routes[0].backend.node_port = Some(31111);
        let m = build(&f, &state, &one_node());
        assert_eq!(m.backends.len(), 1);
        assert_eq!(m.backends[0].servers[0].addr, "127.0.0.2:31111");
    }

    #[test]
    fn the_model_does_not_depend_on_arrival_order() {
        let f = FleetName::new("edge").unwrap();
        let a = ("a", 1, vec![route(Some("a.com"), "/", PathKind::Prefix, "a")]);
        let b = ("b", 1, vec![route(Some("b.com"), "/", PathKind::Prefix, "b")]);
        let one = build(&f, &fleet_of(vec![a.clone(), b.clone()]), &one_node());
        let two = build(&f, &fleet_of(vec![b, a]), &one_node());
        assert_eq!(one, two);
    }

    fn backend_on(svc: usize, policy: TrafficPolicy) -> Backend {
        Backend {
            service: ServiceRef {
                namespace: Namespace::new("team").unwrap(),
                name: ObjectName::new(format!("svc-{svc}")).unwrap(),
                port: 80,
                cluster: None,
            },
            node_port: Some(30080),
            servers: vec![],
            traffic_policy: policy,
            endpoint_nodes: None,
            options: Default::default(),
        }
    }

    fn nodes(range: impl Iterator<Item = usize>) -> Vec<NodeAddr> {
        range
            .map(|n| NodeAddr {
                name: ObjectName::new(format!("node-{n:03}")).unwrap(),
                addr: std::net::Ipv4Addr::from(0x0a00_0000 + n as u32).into(),
            })
            .collect()
    }

    /// The nodes `svc`'s backend lists when the cluster has `on`.
    fn chosen(svc: usize, on: &[NodeAddr], policy: TrafficPolicy, k: usize) -> Vec<String> {
        let b = backend_on(svc, policy);
        subset(&b, &NodePool::new(on), k).iter().map(|c| c.node.to_owned()).collect()
    }

    #[test]
    fn cluster_backends_keep_a_bounded_subset_local_ones_every_node() {
        let all = nodes(0..200);
        let kept = chosen(1, &all, TrafficPolicy::Cluster, 10);
        assert_eq!(kept.len(), 10);
        assert!(kept.is_sorted(), "node-name order: {kept:?}");
        assert_eq!(chosen(1, &all, TrafficPolicy::Cluster, 10), kept, "deterministic");
        assert_eq!(chosen(1, &all, TrafficPolicy::Cluster, 0).len(), 200, "0 keeps every node");
        assert_eq!(chosen(1, &nodes(0..4), TrafficPolicy::Cluster, 10).len(), 4);
        assert_eq!(chosen(1, &all, TrafficPolicy::Local, 10).len(), 200, "endpoints unknown");
        // With its endpoints known, a Local backend lists exactly the nodes that run one, in
        // node-name order, however many; nodes it names that are not Ready are left out.
        let mut local = backend_on(1, TrafficPolicy::Local);
        let on = ["node-150", "node-003", "node-077", "node-999"];
        local.endpoint_nodes = Some(on.iter().map(|n| ObjectName::new(*n).unwrap()).collect());
        let listed = |b: &Backend| -> Vec<String> {
            subset(b, &NodePool::new(&all), 1).iter().map(|c| c.node.to_owned()).collect()
        };
        assert_eq!(listed(&local), ["node-003", "node-077", "node-150"], "unsorted input");
        local.endpoint_nodes.as_mut().unwrap().sort();
        assert_eq!(listed(&local), ["node-003", "node-077", "node-150"]);
        local.endpoint_nodes = Some(vec![]);
        assert!(listed(&local).is_empty(), "no endpoint: no server, HAProxy answers 503");
        let mut gone = backend_on(1, TrafficPolicy::Cluster);
        gone.node_port = None;
        assert!(subset(&gone, &NodePool::new(&all), 10).is_empty(), "no NodePort, no server");
    }

    /// The subsets of the first build of rendezvous subsets (score every node, select the k
    /// best): the one-pass choice must pick the very same servers, or an upgrade would move
    /// backends for nothing.
    #[test]
    fn the_one_pass_choice_picks_what_scoring_every_node_picks() {
        let all = nodes(0..200);
        for svc in 0..300 {
            let b = backend_on(svc, TrafficPolicy::Cluster);
            let s = &b.service;
            let service = fnv1a(format!("{}/{}:{}", s.namespace, s.name, s.port).as_bytes());
            let mut scored: Vec<(u64, &str)> = all
                .iter()
                .map(|n| {
                    let h = fnv1a(n.name.as_str().as_bytes());
                    (mix(service.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ h), n.name.as_str())
                })
                .collect();
            scored.select_nth_unstable_by(9, |a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
            let mut want: Vec<&str> = scored[..10].iter().map(|(_, n)| *n).collect();
            want.sort_unstable();
            assert_eq!(chosen(svc, &all, TrafficPolicy::Cluster, 10), want, "svc-{svc}");
        }
    }

    #[test]
    fn with_node_health_every_node_is_checked_once_whichever_subsets_hold_it() {
        let options = Options {
            servers_per_backend: 1,
            spare_backends: 0,
            node_health: Some(NodeHealth { port: 10256, path: HttpPath::new("/healthz").unwrap() }),
        };
        let f = FleetName::new("edge").unwrap();
        let state =
            fleet_of(vec![("one", 1, vec![route(Some("a.com"), "/", PathKind::Prefix, "a")])]);
        let m = build_with(&f, &state, &nodes(0..3), &options);
        assert_eq!(m.backends[0].servers.len(), 1, "one node in the subset");
        let checked: Vec<&str> = m.nodes.iter().map(|n| n.addr.as_str()).collect();
        assert_eq!(checked, ["10.0.0.0:10256", "10.0.0.1:10256", "10.0.0.2:10256"]);
        let track = m.backends[0].servers[0].track.as_deref().unwrap();
        assert!(track.starts_with("hafleet_nodes/node-00"), "{track}");
    }

    /// Two clusters feeding one fleet, each with a Service `default/a:80` and a node named
    /// `node-000`: two HAProxy backends, each on its own cluster's nodes (a subset of those
    /// only), and every node of both checked once under a name of its own.
    #[test]
    fn a_clusters_services_go_to_its_own_nodes_under_names_of_their_own() {
        let east = ClusterId::new("east").unwrap();
        let options = Options {
            servers_per_backend: 2,
            spare_backends: 0,
            node_health: Some(NodeHealth { port: 10256, path: HttpPath::new("/healthz").unwrap() }),
        };
        let f = FleetName::new("edge").unwrap();
        let mut state =
            fleet_of(vec![("one", 1, vec![route(Some("a.com"), "/", PathKind::Prefix, "a")])]);
        let mut theirs = route(Some("b.com"), "/", PathKind::Prefix, "a");
        theirs.backend.service.cluster = Some(east.clone());
        let (key, mut entry) = state.iter().next().map(|(k, e)| (k.clone(), e.clone())).unwrap();
        entry.routes = vec![theirs];
        state.insert(key.in_cluster(Some(&east)), entry);
        let east_nodes: Vec<NodeAddr> = nodes(0..3)
            .into_iter()
            .map(|n| NodeAddr { addr: "10.1.0.9".parse().unwrap(), ..n })
            .collect();
        let all: Nodes = [(None, nodes(0..5)), (Some(east.clone()), east_nodes)].into();
        let m = build_memo(&f, &state, &all, &options, &mut Memo::default());
        let names: Vec<&str> = m.backends.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["be_default_a_80", "be_default_a_80:east"]);
        let rules: Vec<(&str, &str)> =
            m.rules.iter().map(|r| (r.ingress.as_str(), r.backend.as_str())).collect();
        assert_eq!(
            rules,
            [("default/one", "be_default_a_80"), ("default/one@east", "be_default_a_80:east")]
        );
        let ours = &m.backends[0].servers;
        assert_eq!(ours.len(), 2, "a subset of its own cluster's five");
        assert!(ours.iter().all(|s| s.addr.starts_with("10.0.0.") && !s.name.contains(':')));
        let theirs = &m.backends[1].servers;
        assert_eq!(theirs.len(), 2);
        for s in theirs {
            assert!(s.name.ends_with(":east") && s.addr.starts_with("10.1.0.9:"), "{s:?}");
            assert_eq!(s.track.as_deref(), Some(format!("hafleet_nodes/{}", s.name).as_str()));
        }
        let checked: Vec<&str> = m.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(checked.len(), 8, "{checked:?}");
        assert!(checked.contains(&"node-000") && checked.contains(&"node-000:east"));
        // The unnamed cluster alone renders as before clusters: the same subsets, names.
        let alone = build_with(
            &f,
            &fleet_of(vec![("one", 1, vec![route(Some("a.com"), "/", PathKind::Prefix, "a")])]),
            &nodes(0..5),
            &options,
        );
        assert_eq!(alone.backends[0], m.backends[0]);
    }

    #[test]
    fn servers_listed_by_a_schema_2_message_are_used_as_they_are() {
        let mut b = backend_on(1, TrafficPolicy::Cluster);
        b.node_port = None;
        b.servers = vec![Server {
            node: ObjectName::new("old-node").unwrap(),
            addr: "10.9.9.9".parse().unwrap(),
            port: 31000,
        }];
        let all = nodes(0..3);
        let pool = NodePool::new(&all);
        let kept = subset(&b, &pool, 10);
        assert_eq!(kept.len(), 1);
        assert_eq!((kept[0].node, kept[0].port), ("old-node", 31000));
    }

    #[test]
    fn a_node_leaving_or_joining_moves_only_the_backends_that_hash_to_it() {
        let k = 10;
        let (mut moved_leave, mut moved_join) = (0, 0);
        let mut uses = vec![0usize; 201];
        let (all, left, joined_set) =
            (nodes(0..200), nodes((0..200).filter(|n| *n != 7)), nodes(0..201));
        for svc in 0..1000 {
            let before = chosen(svc, &all, TrafficPolicy::Cluster, k);
            for n in &before {
                uses[n[5..].parse::<usize>().unwrap()] += 1;
            }
            // node-007 leaves.
            let after = chosen(svc, &left, TrafficPolicy::Cluster, k);
            if before.contains(&"node-007".to_owned()) {
                moved_leave += 1;
                let same = before.iter().filter(|n| after.contains(n)).count();
                assert_eq!(same, k - 1, "only node-007 is replaced");
            } else {
                assert_eq!(after, before, "a backend without node-007 does not move");
            }
            // node-200 joins.
            let joined = chosen(svc, &joined_set, TrafficPolicy::Cluster, k);
            if joined != before {
                moved_join += 1;
                assert!(joined.contains(&"node-200".to_owned()));
                assert_eq!(before.iter().filter(|n| joined.contains(n)).count(), k - 1);
            }
        }
        // About k / nodes = 5% of the backends move, and load spreads over every node.
        assert!((20..=90).contains(&moved_leave), "{moved_leave} backends moved on a leave");
        assert!((20..=90).contains(&moved_join), "{moved_join} backends moved on a join");
        let (min, max) = (uses[..200].iter().min().unwrap(), uses[..200].iter().max().unwrap());
        assert!(*min >= 20 && *max <= 100, "uses per node between {min} and {max}");
    }
}
