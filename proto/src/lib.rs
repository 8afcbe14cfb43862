//! hafleet's contract: every message that crosses NATS, every subject, stream and header name,
//! and the validated values that may reach an HAProxy config.
//!
//! ```text
//!  watcher ──RouteEvent──▶ hafleet.routes.<fleet> ──▶ renderer
//!  renderer ──ConfigVersion──▶ hafleet.configs.<fleet> ──▶ applier
//!  applier ──ApplyReport──▶ hafleet.reports.<fleet>.<host> ──▶ watcher
//! ```
//!
//! Nothing here does I/O. Values that end up in `haproxy.cfg` (hosts, paths, names) are newtypes
//! whose only constructors check them against allowlists, so a message that deserializes is a
//! message whose strings are safe to render.

pub mod bundle;
pub mod filters;
pub mod history;
pub mod matches;
pub mod messages;
pub mod parts;
pub mod quarantine;
pub mod render;
pub mod settings;
pub mod signature;
pub mod subjects;
pub mod tls;
pub mod values;

pub use bundle::*;
pub use filters::{
    HeaderName, HeaderRules, HeaderValue, PathRewrite, REDIRECT_CODES, Redirect, Scheme,
};
pub use history::*;
pub use matches::{Method, ParamName, RouteMore};
pub use messages::*;
pub use parts::{PartsError, SnapshotPart};
pub use quarantine::Quarantine;
pub use render::RenderSettings;
pub use settings::{
    AcceptProxy, ERROR_PAGE_CODES, FleetSettings, ForwardedFor, Hsts, LogTarget, MAX_ERROR_PAGE,
    SettingsUpdate, Timeouts, duration_text,
};
pub use signature::{SignatureError, Signer, Verifier, VersionSignature};
pub use subjects::*;
pub use tls::{CertError, SealedCert, TlsEntry};
pub use values::*;

/// Version of the message schema. Bumped on any incompatible change; consumers reject messages
/// with a schema they do not know instead of misreading them.
///
/// 2: config versions carry a bundle (config and map files), inline or in the object store.
/// Route messages and reports did not change, so schema 1 ones are still read.
/// 3: route messages name a backend's NodePort instead of listing its servers, and the nodes
/// travel once in their own message ([`NodesUpdate`]). Route messages of schema 1 and 2 and
/// config versions of schema 2 are still read.
pub const SCHEMA_VERSION: u32 = 3;

/// Schema of the route messages of a watcher with a cluster id (`--cluster-id`), and the
/// newest route schema this build reads: 4 adds the cluster to Ingress keys, Services and the
/// nodes, snapshot, default-certificate and confirm messages. A renderer that reads only
/// schema 3 parks them instead of taking them for the unnamed cluster's (east's nodes would
/// replace every node, east's `default/web` would overwrite the other's). A watcher without a
/// cluster id still sends schema 3, the same bytes as before clusters.
pub const CLUSTER_SCHEMA_VERSION: u32 = 4;

/// Schema of a snapshot published in parts ([`parts`]) and of its parts, and the newest route
/// schema this build reads. A renderer that reads only schema 4 parks them instead of taking
/// the final message, whose entries are in its parts, for an empty snapshot (which would sweep
/// every Ingress of its cluster). A snapshot that fits in one message is sent as before.
pub const PARTS_SCHEMA_VERSION: u32 = 5;

/// Schema of a fleet's settings ([`SettingsUpdate`]), and the newest route schema this build
/// reads. A renderer that reads only schema 5 parks them instead of failing on a message type it
/// does not know; every other route message is sent as before.
pub const SETTINGS_SCHEMA_VERSION: u32 = 6;

/// Schema of the route events that name a Service in pods mode ([`Backend::pods`]), and the
/// newest route schema this build reads. A renderer that reads only schema 6 parks them instead
/// of rendering a pods backend as one without servers; every other route message is sent as
/// before.
pub const PODS_SCHEMA_VERSION: u32 = 7;

/// Schema of the route messages that name an HTTPRoute ([`IngressKey::kind`]) or a backend
/// that answers by itself ([`BackendOptions::fail_status`]), and the newest route schema this
/// build reads. A renderer that reads only schema 7 parks them instead of taking an HTTPRoute
/// for the Ingress of the same name; every other route message is sent as before.
pub const GATEWAY_SCHEMA_VERSION: u32 = 8;

/// Schema of the route messages that name a TLSRoute or a TCPRoute ([`SourceKind`]) or carry
/// a passthrough or TCP route ([`RouteMore::passthrough`], [`RouteMore::port`],
/// [`BackendOptions::tcp`]), and the newest route schema this build reads. A renderer that
/// reads only schema 8 parks them instead of serving such a route as an HTTP one; every other
/// route message is sent as before.
pub const PASSTHROUGH_SCHEMA_VERSION: u32 = 9;

/// The schema of a route message of `cluster`.
pub fn route_schema(cluster: Option<&values::ClusterId>) -> u32 {
    match cluster {
        Some(_) => CLUSTER_SCHEMA_VERSION,
        None => SCHEMA_VERSION,
    }
}

/// The schema of a route message of `cluster` that names `keys`:
/// [`PASSTHROUGH_SCHEMA_VERSION`] when one is a TLSRoute, [`GATEWAY_SCHEMA_VERSION`] when one
/// is not an Ingress, else [`route_schema`].
pub fn keys_schema<'a>(
    cluster: Option<&values::ClusterId>,
    keys: impl Iterator<Item = &'a IngressKey>,
) -> u32 {
    keys.map(|k| match k.kind {
        SourceKind::Ingress => 0,
        SourceKind::HttpRoute => GATEWAY_SCHEMA_VERSION,
        SourceKind::TlsRoute | SourceKind::TcpRoute => PASSTHROUGH_SCHEMA_VERSION,
    })
    .max()
    .unwrap_or(0)
    .max(route_schema(cluster))
}

/// Hex sha256 of bytes, the one hash every component uses for configs and payloads.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}
