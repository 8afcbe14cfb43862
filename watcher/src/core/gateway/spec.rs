//! The parts of the Gateway API objects (`gateway.networking.k8s.io/v1`, standard channel)
//! that hafleet reads, as serde types over a [`DynamicObject`]'s `spec`. Unknown fields are
//! ignored; defaults are the schema's, applied here too, since the CRDs of an older install
//! (or the test bed's, whose CEL rules are removed) may not have applied them.

use kube::api::DynamicObject;
use serde::Deserialize;

/// The API group of every kind here.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// A string that may be null, read as "".
fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

/// `spec` of `object`, or why it does not read.
pub fn spec_of<T: for<'de> Deserialize<'de> + Default>(
    object: &DynamicObject,
) -> Result<T, String> {
    match object.data.get("spec") {
        None | Some(serde_json::Value::Null) => Ok(T::default()),
        Some(spec) => T::deserialize(spec).map_err(|e| format!("spec does not read: {e}")),
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassSpec {
    #[serde(default)]
    pub controller_name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    #[serde(default)]
    pub gateway_class_name: String,
    #[serde(default)]
    pub listeners: Vec<Listener>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Listener {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub port: u16,
    #[serde(default)]
    pub protocol: String,
    #[serde(default)]
    pub allowed_routes: Option<AllowedRoutes>,
    /// An HTTPS listener's certificates.
    #[serde(default)]
    pub tls: Option<ListenerTls>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerTls {
    /// `Terminate` (absent: the default) or `Passthrough`.
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub certificate_refs: Vec<SecretRef>,
}

/// A `certificateRefs` entry: a Secret unless group or kind say otherwise.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Absent, null or "": the core group.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub group: String,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub name: String,
    /// Absent: the Gateway's.
    #[serde(default)]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllowedRoutes {
    #[serde(default)]
    pub namespaces: Option<RouteNamespaces>,
    /// Empty: the kinds the protocol takes (HTTPRoute for HTTP and HTTPS).
    #[serde(default)]
    pub kinds: Vec<GroupKind>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteNamespaces {
    /// `Same` (the default), `All` or `Selector`.
    #[serde(default)]
    pub from: Option<String>,
    /// With `Selector`: the labels of the namespaces whose routes may attach.
    #[serde(default)]
    pub selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GroupKind {
    #[serde(default)]
    pub group: Option<String>,
    pub kind: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteSpec {
    #[serde(default)]
    pub parent_refs: Vec<ParentRef>,
    #[serde(default)]
    pub hostnames: Vec<String>,
    #[serde(default)]
    pub rules: Vec<RouteRule>,
}

/// A TLSRoute's spec: names (SNI) and the backends their connections go to, unopened.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsRouteSpec {
    #[serde(default)]
    pub parent_refs: Vec<ParentRef>,
    #[serde(default)]
    pub hostnames: Vec<String>,
    #[serde(default)]
    pub rules: Vec<TlsRouteRule>,
}

/// A TCPRoute's spec: every connection to the ports of the listeners it attaches to goes to
/// its rule's backends.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TcpRouteSpec {
    #[serde(default)]
    pub parent_refs: Vec<ParentRef>,
    #[serde(default)]
    pub rules: Vec<TlsRouteRule>,
}

/// A TLSRoute's or TCPRoute's rule: its backends only.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsRouteRule {
    #[serde(default)]
    pub backend_refs: Vec<BackendRef>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub section_name: Option<String>,
    #[serde(default)]
    pub port: Option<u16>,
}

impl ParentRef {
    /// Whether it names a Gateway (group and kind as written, or their defaults).
    pub fn is_gateway(&self) -> bool {
        self.group.as_deref().unwrap_or(GROUP) == GROUP
            && self.kind.as_deref().unwrap_or("Gateway") == "Gateway"
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteRule {
    /// Absent or empty: one match, every path (`PathPrefix /`).
    #[serde(default)]
    pub matches: Vec<RouteMatch>,
    #[serde(default)]
    pub filters: Vec<RouteFilter>,
    #[serde(default)]
    pub backend_refs: Vec<BackendRef>,
    #[serde(default)]
    pub timeouts: Option<Timeouts>,
    /// Not served: read only to refuse it.
    #[serde(default)]
    pub retry: Option<serde_json::Value>,
    /// Not served: read only to refuse it.
    #[serde(default)]
    pub session_persistence: Option<serde_json::Value>,
}

/// A rule's `timeouts`: Gateway API durations (`500ms`, `1h30m`; `0s` turns one off).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timeouts {
    #[serde(default)]
    pub request: Option<String>,
    #[serde(default)]
    pub backend_request: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteMatch {
    #[serde(default)]
    pub path: Option<PathMatch>,
    #[serde(default)]
    pub headers: Vec<ValueMatch>,
    #[serde(default)]
    pub query_params: Vec<ValueMatch>,
    #[serde(default)]
    pub method: Option<String>,
}

/// A header or query parameter match.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ValueMatch {
    /// `Exact` (the default) or `RegularExpression`.
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub value: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PathMatch {
    /// `Exact`, `PathPrefix` (the default) or `RegularExpression`.
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    /// Default `/`.
    #[serde(default)]
    pub value: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteFilter {
    #[serde(default, rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub request_header_modifier: Option<HeaderModifier>,
    #[serde(default)]
    pub response_header_modifier: Option<HeaderModifier>,
    #[serde(default)]
    pub request_redirect: Option<RequestRedirect>,
    #[serde(default)]
    pub url_rewrite: Option<UrlRewrite>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestRedirect {
    #[serde(default)]
    pub scheme: Option<String>,
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub path: Option<PathModifier>,
    #[serde(default)]
    pub port: Option<u16>,
    /// Default 302.
    #[serde(default)]
    pub status_code: Option<u16>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UrlRewrite {
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub path: Option<PathModifier>,
}

/// `ReplaceFullPath` or `ReplacePrefixMatch`, and its value.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PathModifier {
    #[serde(default, rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub replace_full_path: Option<String>,
    #[serde(default)]
    pub replace_prefix_match: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeaderModifier {
    #[serde(default)]
    pub set: Vec<HeaderPair>,
    #[serde(default)]
    pub add: Vec<HeaderPair>,
    #[serde(default)]
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct HeaderPair {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BackendRef {
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub port: Option<u16>,
    /// Default 1.
    #[serde(default)]
    pub weight: Option<i32>,
    #[serde(default)]
    pub filters: Vec<serde_json::Value>,
}

impl BackendRef {
    /// Whether it names a Service (the core group, kind `Service`, or their defaults).
    pub fn is_service(&self) -> bool {
        self.group.as_deref().unwrap_or("").is_empty()
            && self.kind.as_deref().unwrap_or("Service") == "Service"
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantSpec {
    #[serde(default)]
    pub from: Vec<GrantFrom>,
    #[serde(default)]
    pub to: Vec<GrantTo>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantFrom {
    /// Null reads as "" (an API server may store "" so).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub namespace: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantTo {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    /// Absent: every object of the kind in the grant's namespace.
    #[serde(default)]
    pub name: Option<String>,
}
