//! Messages on the three streams. Each carries `schema` so a consumer can refuse what it does not
//! understand; all of them round-trip through JSON unchanged.

use crate::bundle::{Bundle, BundleError};
use crate::values::{
    Cidr, ClusterId, CookieName, FleetName, HostName, HttpHost, HttpPath, Namespace, ObjectName,
    PathKind,
};
use crate::{InvalidValue, SCHEMA_VERSION};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// Why a payload could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("payload is not a valid message: {0}")]
    Json(#[from] serde_json::Error),
    #[error("schema {found} is not supported (this build reads schema {reads} of it)")]
    Schema { found: u32, reads: u32 },
    #[error("bundle of version {version} is not the one it names")]
    Bundle {
        version: u64,
        #[source]
        source: BundleError,
    },
}

/// Reads only `schema`, before the whole message: a message of a newer schema may not parse
/// as this build's types at all, and must still be recognised as newer, not as junk. Every
/// message type has a required `schema` field, so this is the only check needed. `oldest` is
/// the oldest schema whose shape of this message this build still reads, `newest` the newest.
pub(crate) fn check_schema_first(
    bytes: &[u8],
    oldest: u32,
    newest: u32,
) -> Result<(), DecodeError> {
    #[derive(Deserialize)]
    struct Probe {
        schema: Option<u32>,
    }
    match serde_json::from_slice::<Probe>(bytes) {
        Ok(Probe { schema: Some(found) }) if !(oldest..=newest).contains(&found) => {
            Err(DecodeError::Schema { found, reads: newest })
        }
        _ => Ok(()),
    }
}

/// Identifies one object that routes: an Ingress, or (with [`SourceKind::HttpRoute`]) a
/// Gateway API HTTPRoute. The name stays from before HTTPRoutes: every message, store key and
/// history names routing objects by it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct IngressKey {
    pub namespace: Namespace,
    pub name: ObjectName,
    /// The cluster it lives in, when several feed the fleets (`--cluster-id` of the watcher
    /// that published it). `None`: a watcher without one (every message before clusters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterId>,
    /// What kind of object it is; absent: an Ingress (every message before HTTPRoutes). Of
    /// schema [`crate::GATEWAY_SCHEMA_VERSION`] when it is not an Ingress.
    #[serde(default, skip_serializing_if = "SourceKind::is_ingress")]
    pub kind: SourceKind,
}

/// The kind of object an [`IngressKey`] names.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum SourceKind {
    #[default]
    Ingress,
    #[serde(rename = "HTTPRoute")]
    HttpRoute,
    /// A Gateway API TLSRoute: its routes are passthrough routes
    /// ([`crate::RouteMore::passthrough`]).
    #[serde(rename = "TLSRoute")]
    TlsRoute,
    /// A Gateway API TCPRoute: its routes take a listener port's connections
    /// ([`crate::RouteMore::port`]).
    #[serde(rename = "TCPRoute")]
    TcpRoute,
}

impl SourceKind {
    pub fn is_ingress(&self) -> bool {
        *self == SourceKind::Ingress
    }
}

impl std::fmt::Display for IngressKey {
    /// `namespace/name` for an Ingress, `httproute:namespace/name` for an HTTPRoute,
    /// `tlsroute:namespace/name` for a TLSRoute, `tcproute:namespace/name` for a TCPRoute, and
    /// `@cluster` when it has one.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            SourceKind::Ingress => {}
            SourceKind::HttpRoute => f.write_str("httproute:")?,
            SourceKind::TlsRoute => f.write_str("tlsroute:")?,
            SourceKind::TcpRoute => f.write_str("tcproute:")?,
        }
        write!(f, "{}/{}", self.namespace, self.name)?;
        match &self.cluster {
            Some(c) => write!(f, "@{c}"),
            None => Ok(()),
        }
    }
}

/// A Service port that routes point at.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ServiceRef {
    pub namespace: Namespace,
    pub name: ObjectName,
    /// The Service's `port` (not the NodePort), after resolving a named port.
    pub port: u16,
    /// The cluster the Service (and so its NodePort and nodes) is in; as [`IngressKey::cluster`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterId>,
}

/// One address HAProxy sends traffic to: a Ready node's InternalIP and the Service's NodePort.
/// Only route messages of schema 1 and 2 list servers; see [`Backend::servers`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Server {
    pub node: ObjectName,
    pub addr: IpAddr,
    pub port: u16,
}

/// The Service port behind a route. Its servers are the nodes of the newest [`NodesUpdate`]
/// at `node_port`: nodes travel once, in their own message, so a node joining or leaving is one
/// message however many Ingresses there are.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Backend {
    pub service: ServiceRef,
    /// The Service port's NodePort. `None` when the Service does not exist (yet): no servers,
    /// HAProxy answers 503.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port: Option<u16>,
    /// Route messages of schema 1 and 2 carried the servers themselves (every Ready node at
    /// the NodePort, sorted by node name). Still read, and used as they are, so that replaying
    /// old history renders what was rendered then; never sent any more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<Server>,
    /// The Service's `externalTrafficPolicy`. Absent in messages means `Cluster` (and
    /// messages of watchers that did not send it were all treated as `Cluster`).
    #[serde(default, skip_serializing_if = "TrafficPolicy::is_cluster")]
    pub traffic_policy: TrafficPolicy,
    /// For a `Local` Service: the nodes that run a ready endpoint of it (from its
    /// EndpointSlices), sorted and each once; only these forward its traffic, so only these
    /// of the nodes are its servers. `None` where the watcher could not know (a cluster that
    /// serves no EndpointSlices, or messages of earlier watchers): every node, as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_nodes: Option<Vec<ObjectName>>,
    /// How HAProxy treats this Ingress's traffic to the Service (its `hafleet.io/`
    /// annotations). Backends with other options are other HAProxy backends.
    #[serde(default, skip_serializing_if = "BackendOptions::is_default")]
    pub options: BackendOptions,
    /// Pods mode (`hafleet.io/endpoints: pods` on the Service, or its fleet's default): the
    /// servers are these endpoints of the Service's pods, straight, not nodes at a NodePort
    /// (`node_port` is then `None`). Sorted by address and port, each once; empty when none
    /// serves (HAProxy answers 503). `None`: nodes mode. Route messages with it are of
    /// schema [`crate::PODS_SCHEMA_VERSION`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<Vec<PodEndpoint>>,
}

/// One endpoint of a Service's pods that HAProxy sends traffic to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PodEndpoint {
    pub addr: IpAddr,
    pub port: u16,
    /// Terminating but still serving: no new requests (weight 0), open ones finish.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
}

/// HAProxy's load-balancing algorithm for a backend (`hafleet.io/balance`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Balance {
    Roundrobin,
    StaticRr,
    Leastconn,
    First,
    Source,
    Random,
}

impl Balance {
    /// Every algorithm, as HAProxy and the annotation spell it.
    pub const ALL: [(&'static str, Balance); 6] = [
        ("roundrobin", Balance::Roundrobin),
        ("static-rr", Balance::StaticRr),
        ("leastconn", Balance::Leastconn),
        ("first", Balance::First),
        ("source", Balance::Source),
        ("random", Balance::Random),
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Balance::Roundrobin => "roundrobin",
            Balance::StaticRr => "static-rr",
            Balance::Leastconn => "leastconn",
            Balance::First => "first",
            Balance::Source => "source",
            Balance::Random => "random",
        }
    }
}

/// Per-Ingress settings of the backends its routes go to, from its `hafleet.io/` annotations.
/// Every field is validated where it is read; absent means HAProxy's (or the template's)
/// default. Durations are in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BackendOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance: Option<Balance>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_connect_ms: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_server_ms: Option<u32>,
    /// `option httpchk GET <path>` for servers that check themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check_path: Option<HttpPath>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check_interval_ms: Option<u32>,
    /// Stickiness: HAProxy inserts this cookie naming the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sticky_cookie: Option<CookieName>,
    /// Only these source networks are served; others get 403. Empty: everyone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_source: Vec<Cidr>,
    /// `Some(true)`: plain-HTTP requests are redirected to HTTPS (308), TLS or not;
    /// `Some(false)`: never, not even for its hosts that have a certificate; `None` (unset):
    /// redirected for its hosts that have a certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssl_redirect: Option<bool>,
    /// Most concurrent connections per server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_conn: Option<u32>,
    /// These source networks get 403 (after `allow_source`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_source: Vec<Cidr>,
    /// Most requests per second from one client address; more get 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit_rps: Option<u32>,
    /// How long an upgraded connection (a WebSocket) may idle on both sides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_tunnel_ms: Option<u32>,
    /// How long the client may stay silent on a request this route took (sending its body,
    /// or reading the answer): set per request in the frontend once the route is known, by
    /// HAProxy 3.0 and later; older HAProxy keeps the fleet's `timeout-client`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_client_ms: Option<u32>,
    /// HAProxy carries the connection to the servers as TCP, not HTTP: a passthrough route's
    /// backend ([`crate::RouteMore::passthrough`]). Nothing HTTP applies to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tcp: bool,
    /// Header changes on the request, before it reaches the backend. (Boxed, as the two
    /// below: most routes have none, and every route of 10,000s is held in memory.)
    #[serde(default, skip_serializing_if = "no_header_rules")]
    pub request_headers: Box<crate::HeaderRules>,
    /// Header changes on the response, before it reaches the client.
    #[serde(default, skip_serializing_if = "no_header_rules")]
    pub response_headers: Box<crate::HeaderRules>,
    /// Requests are redirected, not sent to the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Box<crate::Redirect>>,
    /// The route's path prefix replaced on the way to the backend (set per route: its `from`
    /// is the route's path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<Box<crate::PathRewrite>>,
    /// The PROXY protocol to the Service's servers (the Service's `hafleet.io/send-proxy`),
    /// so that they learn the client's address without HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_proxy: Option<ProxyProtocol>,
    /// Every request is answered with this status (500 or 503) and no server is tried: an
    /// HTTPRoute rule whose backend cannot be resolved answers 500, as the Gateway API says.
    /// Of schema [`crate::GATEWAY_SCHEMA_VERSION`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_status: Option<FailStatus>,
}

/// The statuses a backend may answer every request with by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum FailStatus {
    #[serde(rename = "500")]
    InternalError,
    #[serde(rename = "503")]
    Unavailable,
}

impl FailStatus {
    pub fn code(&self) -> u16 {
        match self {
            FailStatus::InternalError => 500,
            FailStatus::Unavailable => 503,
        }
    }
}

/// A PROXY protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyProtocol {
    V1,
    V2,
}

impl ProxyProtocol {
    /// The `server` keyword that sends it.
    pub fn server_keyword(&self) -> &'static str {
        match self {
            ProxyProtocol::V1 => "send-proxy",
            ProxyProtocol::V2 => "send-proxy-v2",
        }
    }
}

/// For serde: header rules that change nothing are not written.
#[allow(clippy::borrowed_box)]
fn no_header_rules(rules: &Box<crate::HeaderRules>) -> bool {
    rules.is_empty()
}

impl BackendOptions {
    pub fn is_default(&self) -> bool {
        *self == BackendOptions::default()
    }
}

/// How a Service's NodePort forwards (`spec.externalTrafficPolicy`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum TrafficPolicy {
    /// Every node forwards to every endpoint: any node serves, so a bounded subset of nodes
    /// per backend is enough.
    #[default]
    Cluster,
    /// A node serves only with an endpoint of its own: nodes are not interchangeable.
    Local,
}

impl TrafficPolicy {
    pub fn is_cluster(&self) -> bool {
        *self == TrafficPolicy::Cluster
    }
}

/// A Ready node that routes go to: its name and InternalIP.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeAddr {
    pub name: ObjectName,
    pub addr: IpAddr,
}

/// Every node routes go to, published on [`crate::ROUTES_NODES_SUBJECT`] by a watcher after it
/// (re)starts and whenever the set changes (a node joins, leaves, goes NotReady, changes its
/// address or is excluded from load balancers). It replaces the previous set whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodesUpdate {
    pub schema: u32,
    pub epoch: u64,
    /// Whose nodes: a cluster's node set replaces that cluster's only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterId>,
    /// Sorted by name, each name once.
    pub nodes: Vec<NodeAddr>,
}

/// One fully resolved routing rule of an Ingress.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Route {
    /// `None` matches any host (a rule without `host`, or the default backend).
    pub host: Option<HttpHost>,
    pub path: HttpPath,
    pub kind: PathKind,
    pub backend: Backend,
    /// What it asks of a request besides host and path, and the backends that share its
    /// requests with `backend` (an HTTPRoute's); `None` for an Ingress's. Boxed: most routes
    /// have none, and every route of 10,000s is held in memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub more: Option<Box<crate::RouteMore>>,
}

impl Route {
    /// Every backend the route sends requests to: its own, then those it shares them with.
    pub fn backends(&self) -> impl Iterator<Item = &Backend> {
        let split = self.more.iter().flat_map(|m| m.split.iter().map(|(_, b)| b));
        std::iter::once(&self.backend).chain(split)
    }

    /// [`Route::backends`], to change.
    pub fn backends_mut(&mut self) -> impl Iterator<Item = &mut Backend> {
        let split = self.more.iter_mut().flat_map(|m| m.split.iter_mut().map(|(_, b)| b));
        std::iter::once(&mut self.backend).chain(split)
    }

    /// Whether it takes TLS connections by their SNI, unopened
    /// ([`crate::RouteMore::passthrough`]).
    pub fn is_passthrough(&self) -> bool {
        self.more.as_deref().is_some_and(|m| m.passthrough)
    }

    /// The port whose every TCP connection it takes, for a TCPRoute's
    /// ([`crate::RouteMore::port`]).
    pub fn tcp_port(&self) -> Option<u16> {
        self.more.as_deref().and_then(|m| m.port)
    }
}

/// What happened to an Ingress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum RouteChange {
    /// The Ingress's routes are now exactly these, and its hosts with TLS are served with
    /// these certificates (none: plain HTTP only).
    Upsert {
        routes: Vec<Route>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tls: Vec<crate::TlsEntry>,
    },
    /// The Ingress is gone from this fleet (deleted, re-annotated or no longer selected).
    Delete,
}

/// One Ingress's routes for one fleet, published on `hafleet.routes.<fleet>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteEvent {
    pub schema: u32,
    pub fleet: FleetName,
    pub ingress: IngressKey,
    /// `metadata.creationTimestamp` in Unix seconds: on a conflict the older Ingress wins.
    pub created_unix: i64,
    /// `metadata.resourceVersion` of the Ingress the event was computed from, for explanations.
    pub resource_version: String,
    pub change: RouteChange,
    /// Which watcher run published it; a new run starts with a snapshot.
    pub epoch: u64,
}

/// Published by a watcher once it has listed everything after a (re)start, after the upserts of
/// every live Ingress: whatever a fleet holds that is neither in `live` nor in `keep` was
/// deleted meanwhile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutesSnapshot {
    pub schema: u32,
    pub epoch: u64,
    /// The cluster whose watcher sent it: it sweeps that cluster's Ingresses and no other's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterId>,
    pub live: Vec<(FleetName, IngressKey)>,
    /// Ingresses that exist and are meant for hafleet but are refused as they stand (a bad
    /// edit): they keep whatever routes they had, in whichever fleet.
    #[serde(default)]
    pub keep: Vec<IngressKey>,
    /// A snapshot too large for one message: the stream sequences of its
    /// [`crate::SnapshotPart`]s, in order, whose entries come before its own (see
    /// [`crate::parts`]). Empty: it is whole.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<u64>,
}

/// Releases a sweep the renderer held (a snapshot that would have withdrawn too much of a
/// fleet at once), published on [`crate::ROUTES_CONFIRM_SUBJECT`] by the renderer when an
/// operator confirms it (`hafleet sweep confirm`) or its release policy says so. It is
/// in the routes stream, so replay withdraws the same Ingresses at the same point.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepConfirm {
    pub schema: u32,
    /// The newest watcher epoch the renderer had seen when it published it (a newer watcher
    /// starts with a snapshot, which replaces the hold anyway).
    pub epoch: u64,
    pub fleet: FleetName,
    /// The routes stream sequence of the snapshot held: it releases that hold and no other.
    pub snapshot_seq: u64,
    /// Who released it, for the version's causes: `operator` or `policy`.
    pub by: String,
    /// The cluster of the snapshot held (its epochs are that cluster's watcher's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterId>,
}

/// A fleet's default certificate, published on `hafleet.routes.<fleet>` by a watcher with
/// `--default-cert` for it: what HTTPS answers for a name no Ingress has a certificate for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefaultCert {
    pub schema: u32,
    pub epoch: u64,
    /// The cluster whose watcher sent it (its epoch is that watcher's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterId>,
    pub fleet: FleetName,
    /// `None`: the fleet has none (names without a certificate are refused).
    pub cert: Option<crate::SealedCert>,
}

/// Anything on the routes stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RouteMessage {
    Event(RouteEvent),
    Snapshot(RoutesSnapshot),
    SnapshotPart(crate::SnapshotPart),
    Nodes(NodesUpdate),
    Confirm(SweepConfirm),
    DefaultCert(DefaultCert),
    Quarantine(crate::Quarantine),
    Settings(crate::SettingsUpdate),
    /// The renderer's template and render options from here on.
    Render(crate::RenderSettings),
}

impl RouteMessage {
    /// The cluster whose watcher published it (for a confirm: the cluster of the snapshot
    /// it releases). Epochs are per cluster: each cluster's watchers count their own.
    pub fn cluster(&self) -> Option<&ClusterId> {
        match self {
            RouteMessage::Event(e) => e.ingress.cluster.as_ref(),
            RouteMessage::Snapshot(s) => s.cluster.as_ref(),
            RouteMessage::SnapshotPart(p) => p.cluster.as_ref(),
            RouteMessage::Nodes(n) => n.cluster.as_ref(),
            RouteMessage::Confirm(c) => c.cluster.as_ref(),
            RouteMessage::DefaultCert(d) => d.cluster.as_ref(),
            // The renderer's own, about Ingresses of any cluster: no watcher's epoch fences it.
            RouteMessage::Quarantine(_) => None,
            RouteMessage::Settings(s) => s.cluster.as_ref(),
            RouteMessage::Render(_) => None,
        }
    }

    /// The epoch of the watcher run that published it.
    pub fn epoch(&self) -> u64 {
        match self {
            RouteMessage::Event(e) => e.epoch,
            RouteMessage::Snapshot(s) => s.epoch,
            RouteMessage::SnapshotPart(p) => p.epoch,
            RouteMessage::Nodes(n) => n.epoch,
            RouteMessage::Confirm(c) => c.epoch,
            RouteMessage::DefaultCert(d) => d.epoch,
            RouteMessage::Quarantine(_) => 0,
            RouteMessage::Settings(s) => s.epoch,
            RouteMessage::Render(_) => 0,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("route messages always serialize")
    }

    /// The subject a message of the renderer's own must have come on (its render settings,
    /// sweep releases, quarantines), which no watcher may publish on; `None` for a watcher's.
    /// A renderer's message found on another subject was forged by someone who may publish
    /// route events, and is not applied.
    pub fn renderer_subject(&self) -> Option<&'static str> {
        match self {
            RouteMessage::Render(_) => Some(crate::ROUTES_RENDER_SUBJECT),
            RouteMessage::Confirm(_) => Some(crate::ROUTES_CONFIRM_SUBJECT),
            RouteMessage::Quarantine(_) => Some(crate::ROUTES_QUARANTINE_SUBJECT),
            _ => None,
        }
    }

    /// Whether it came on a subject it may come on ([`RouteMessage::renderer_subject`]).
    pub fn on_its_subject(&self, subject: &str) -> bool {
        self.renderer_subject().is_none_or(|own| own == subject)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        check_schema_first(bytes, 1, crate::PASSTHROUGH_SCHEMA_VERSION)?;
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// A route event that went into a version: which Ingress, and where in the routes stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    pub stream_seq: u64,
    /// `None` for a snapshot sweep.
    pub ingress: Option<IngressKey>,
    /// `upsert`, `delete`, `sweep`, `nodes`, `rerender`, `rollback` or `resume`.
    pub what: String,
    pub resource_version: Option<String>,
    /// Routes the change added, as `host/path (Kind)` (`*` for any host); for `nodes`, the
    /// nodes that joined or changed address, as `name (address)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<String>,
    /// Routes the change removed, in the same form.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    /// Why, where the kind of change does not say it all: for `quarantine`, what HAProxy said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Where a version's files are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Body {
    /// In the message itself.
    Inline { bundle: Bundle },
    /// Too large for a NATS message: in the stream [`crate::BUNDLES_STREAM`], the bundle's
    /// JSON cut into `chunks` messages on [`crate::bundle_chunk_subject`] `0..chunks`. The
    /// subjects name the fleet, so NATS permissions give each fleet's applier its own bundles
    /// only.
    Stream { chunks: u32 },
}

/// A numbered, explained HAProxy config for one fleet, published on `hafleet.configs.<fleet>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigVersion {
    pub schema: u32,
    pub fleet: FleetName,
    /// 1, 2, 3, … per fleet, never reused.
    pub version: u64,
    pub parent: Option<u64>,
    /// Hex sha256 of the bundle's config, which names every map file by its own sha256.
    pub sha256: String,
    pub created_unix_ms: u64,
    /// The route events that made this version.
    pub causes: Vec<Cause>,
    /// Things an operator should know: conflicts resolved, routes dropped and why.
    pub notes: Vec<String>,
    /// Set when this version republishes the bundle of an older one (a rollback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restores: Option<u64>,
    /// Bytes of the bundle's files together.
    pub size: u64,
    pub body: Body,
    /// The renderer's signature over fleet, number and sha256 (see [`crate::signature`]);
    /// set when the version is published, checked by appliers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<crate::VersionSignature>,
    /// Ingresses this version leaves out because HAProxy refused what they made
    /// ([`crate::Quarantine`]), at most [`MAX_QUARANTINED_LISTED`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<IngressKey>,
    /// How many routes it serves (of every Ingress and HTTPRoute not quarantined): a renderer
    /// that rebuilt its state compares its first version with the newest published one by
    /// them (the mass-deletion guard). `None` in versions of older renderers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<u64>,
}

/// Most quarantined Ingresses a version or a report names (the config's notes name them all).
pub const MAX_QUARANTINED_LISTED: usize = 100;

impl ConfigVersion {
    /// Version `version` of `fleet` carrying `bundle`, with no parent, causes, notes or
    /// signature yet, created at time 0: set the rest with struct update syntax.
    pub fn inline(fleet: FleetName, version: u64, bundle: Bundle) -> ConfigVersion {
        ConfigVersion {
            schema: crate::SCHEMA_VERSION,
            fleet,
            version,
            parent: None,
            sha256: bundle.sha256(),
            created_unix_ms: 0,
            causes: vec![],
            notes: vec![],
            restores: None,
            size: bundle.size() as u64,
            body: Body::Inline { bundle },
            signature: None,
            quarantined: vec![],
            routes: None,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("config versions always serialize")
    }

    /// Decodes and, for an inline bundle, checks that it is the one the sha256 names (a
    /// bundle from the bundles stream is checked by [`ConfigVersion::with_bundle`]).
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        check_schema_first(bytes, 2, SCHEMA_VERSION)?;
        let v: ConfigVersion = serde_json::from_slice(bytes)?;
        if let Body::Inline { bundle } = &v.body {
            bundle
                .verify(&v.sha256)
                .map_err(|source| DecodeError::Bundle { version: v.version, source })?;
        }
        Ok(v)
    }

    /// This version with its explanation cut until its message takes at most `limit` bytes,
    /// if it can be: first each cause's routes (10 of each kind, then a line saying how many
    /// more), then the causes themselves (the first 100, then one saying how many more). A
    /// batch of thousands of changes, each naming its routes, can be more than a NATS
    /// message; the renderer's store keeps every cause. Neither the bundle nor the signature
    /// changes (causes are not signed).
    pub fn fitted(&self, limit: usize) -> ConfigVersion {
        const ROUTES: usize = 10;
        const CAUSES: usize = 100;
        let mut v = self.clone();
        if v.encode().len() <= limit {
            return v;
        }
        let cut = |list: &mut Vec<String>| {
            if list.len() > ROUTES {
                let more = list.len() - ROUTES;
                list.truncate(ROUTES);
                list.push(format!("… and {more} more"));
            }
        };
        for c in &mut v.causes {
            cut(&mut c.added);
            cut(&mut c.removed);
        }
        if v.encode().len() > limit && v.causes.len() > CAUSES {
            let more = v.causes.len() - CAUSES;
            let last = v.causes.last().map(|c| c.stream_seq).unwrap_or_default();
            v.causes.truncate(CAUSES);
            v.causes.push(Cause {
                stream_seq: last,
                ingress: None,
                what: format!("… and {more} more"),
                resource_version: None,
                added: vec![],
                removed: vec![],
                note: None,
            });
        }
        v
    }

    /// The bundle, if the message carries it.
    pub fn bundle(&self) -> Option<&Bundle> {
        match &self.body {
            Body::Inline { bundle } => Some(bundle),
            Body::Stream { .. } => None,
        }
    }

    /// This version with `bundle` inline, after checking it is the one the version names.
    pub fn with_bundle(mut self, bundle: Bundle) -> Result<Self, DecodeError> {
        bundle
            .verify(&self.sha256)
            .map_err(|source| DecodeError::Bundle { version: self.version, source })?;
        self.body = Body::Inline { bundle };
        Ok(self)
    }

    /// [`ConfigVersion::with_bundle`] for a bundle whose certificates were each checked and
    /// read by their id, `ids` ([`Bundle::verify_read`]).
    pub fn with_read_bundle(
        mut self,
        bundle: Bundle,
        ids: std::sync::Arc<[String]>,
    ) -> Result<Self, DecodeError> {
        bundle
            .verify_read(&self.sha256, ids)
            .map_err(|source| DecodeError::Bundle { version: self.version, source })?;
        self.body = Body::Inline { bundle };
        Ok(self)
    }
}

/// The step of a rollout that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyStage {
    /// The version is not signed by a key the applier trusts: refused before any host was
    /// touched.
    Signature,
    /// The host could not be reached.
    Connect,
    /// The host answered with a key that is not the one pinned for it (unknown or changed):
    /// refused, whatever else it says.
    HostKey,
    Upload,
    Validate,
    Swap,
    Reload,
    Verify,
    /// The version loaded, but the host's HTTP probes did not pass: rolled back.
    Probe,
    /// The host no longer runs the version it was given (a file edited or removed by hand, a
    /// reload by someone else); found by the applier's periodic check.
    Drift,
}

impl ApplyStage {
    /// The stage as reports spell it (`host_key`, `probe`, …).
    pub fn as_str(&self) -> &'static str {
        match self {
            ApplyStage::Signature => "signature",
            ApplyStage::Connect => "connect",
            ApplyStage::HostKey => "host_key",
            ApplyStage::Upload => "upload",
            ApplyStage::Validate => "validate",
            ApplyStage::Swap => "swap",
            ApplyStage::Reload => "reload",
            ApplyStage::Verify => "verify",
            ApplyStage::Probe => "probe",
            ApplyStage::Drift => "drift",
        }
    }
}

/// What a host did with a version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ApplyOutcome {
    /// The version is live and HAProxy reloaded onto it.
    Applied,
    /// The host already ran this exact config; nothing was touched.
    Unchanged,
    /// The version is not live. `restored` says whether the last-known-good config was put back
    /// (only needed when the failure came after the swap): the host was rolled back.
    Failed { stage: ApplyStage, message: String, restored: bool },
}

/// One host's result for one version, published on `hafleet.reports.<fleet>.<host>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyReport {
    pub schema: u32,
    pub fleet: FleetName,
    pub host: HostName,
    pub version: u64,
    pub sha256: String,
    pub outcome: ApplyOutcome,
    pub finished_unix_ms: u64,
    /// From the moment the rollout turned to this host to `finished_unix_ms` (a host of the
    /// first wave had its files uploaded and checked while the canary went live; that is not
    /// counted).
    pub duration_ms: u64,
    /// Reloads this apply asked HAProxy for: 0 when the change went in through the runtime API
    /// (or nothing changed), 1 for a reload, 2 when last-known-good had to be reloaded back.
    /// Reports of appliers before it read as 0.
    #[serde(default)]
    pub reloads: u32,
    /// Runtime API commands this apply sent: instead of a reload, or, with `bridged`, ahead
    /// of one.
    #[serde(default)]
    pub runtime_commands: u32,
    /// New backends the host served through spare backends ahead of the reload that added
    /// them (the new Services answered before the reload). 0 from appliers before it.
    #[serde(default)]
    pub bridged: u32,
    /// Bytes of the version's files this apply sent to the host: its config and map files
    /// (each as an edit of the host's own where it could) and certificate files. 0 when
    /// nothing was uploaded, and from appliers before it.
    #[serde(default)]
    pub sent_bytes: u64,
    /// What the applier's drift check found on the host before this apply (which repaired
    /// it), or, with outcome `failed` at stage `drift`, found and left as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<String>,
    /// Hosts in the fleet's inventory when this was reported (0 from appliers before it):
    /// how many reports make a version live everywhere.
    #[serde(default)]
    pub fleet_hosts: u32,
    /// The Ingresses the applied version leaves out as quarantined (its `quarantined`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<IngressKey>,
}

impl ApplyReport {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("reports always serialize")
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        check_schema_first(bytes, 1, SCHEMA_VERSION)?;
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// Convenience for callers that build an [`IngressKey`] from raw strings.
impl IngressKey {
    pub fn new(namespace: &str, name: &str) -> Result<Self, InvalidValue> {
        Ok(IngressKey {
            namespace: Namespace::new(namespace)?,
            name: ObjectName::new(name)?,
            cluster: None,
            kind: SourceKind::Ingress,
        })
    }

    /// The key of HTTPRoute `namespace/name`.
    pub fn http_route(namespace: &str, name: &str) -> Result<Self, InvalidValue> {
        Ok(IngressKey { kind: SourceKind::HttpRoute, ..IngressKey::new(namespace, name)? })
    }

    /// The key of TLSRoute `namespace/name`.
    pub fn tls_route(namespace: &str, name: &str) -> Result<Self, InvalidValue> {
        Ok(IngressKey { kind: SourceKind::TlsRoute, ..IngressKey::new(namespace, name)? })
    }

    /// The key of TCPRoute `namespace/name`.
    pub fn tcp_route(namespace: &str, name: &str) -> Result<Self, InvalidValue> {
        Ok(IngressKey { kind: SourceKind::TcpRoute, ..IngressKey::new(namespace, name)? })
    }

    /// The same Ingress, said to be in `cluster`.
    pub fn in_cluster(self, cluster: Option<&ClusterId>) -> Self {
        IngressKey { cluster: cluster.cloned(), ..self }
    }

    /// Whether it is in `cluster` (both none: the cluster of a watcher without an id).
    pub fn is_in(&self, cluster: Option<&ClusterId>) -> bool {
        self.cluster.as_ref() == cluster
    }
}

#[cfg(test)]
mod tests;
