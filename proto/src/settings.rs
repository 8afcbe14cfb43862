//! Fleet settings: what a platform team sets for a whole fleet (timeouts, the client's address,
//! access logs, HSTS, PROXY protocol from an upstream load balancer) without forking the
//! template. A watcher reads them from the ConfigMap `hafleet-fleet-<fleet>` in its settings
//! namespace, checks every key, and publishes them on `hafleet.routes.<fleet>` as a
//! [`SettingsUpdate`]; the renderer records them in the routes stream (so `history why` names a
//! change and replay reproduces it) and the template reads them.
//!
//! Every value here is a number, a flag, an enum or a socket address: nothing a tenant or an
//! admin writes reaches HAProxy as text.

use crate::{ClusterId, FleetName};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// One fleet's settings; `Default` is what a fleet without a ConfigMap gets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetSettings {
    #[serde(default, skip_serializing_if = "ForwardedFor::is_default")]
    pub forwarded_for: ForwardedFor,
    #[serde(default, skip_serializing_if = "Timeouts::is_default")]
    pub timeouts: Timeouts,
    /// Most concurrent client connections of the HTTP(S) frontend on each host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// `Strict-Transport-Security` on every HTTPS answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hsts: Option<Hsts>,
    /// Where each host sends one line per request. `None`: no access log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log: Option<LogTarget>,
    /// The binds that expect the PROXY protocol from an upstream load balancer.
    #[serde(default, skip_serializing_if = "AcceptProxy::is_default")]
    pub accept_proxy: AcceptProxy,
    /// The body HAProxy answers with for a status code ([`ERROR_PAGE_CODES`]), as HTML of at
    /// most [`MAX_ERROR_PAGE`] bytes; sorted by code, each once. Any text: the template writes
    /// it byte by byte escaped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub error_pages: Vec<(u16, String)>,
    /// HAProxy's own Prometheus metrics on this port of each host, at `/metrics`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus_port: Option<u16>,
}

/// The statuses an error page may be given for: those HAProxy itself answers with.
pub const ERROR_PAGE_CODES: [u16; 14] =
    [400, 401, 403, 404, 405, 408, 410, 413, 429, 500, 501, 502, 503, 504];

/// Most bytes of an error page: it must fit in one HAProxy buffer with its headers.
pub const MAX_ERROR_PAGE: usize = 8192;

/// What backends learn of the client's address through `X-Forwarded-For`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum ForwardedFor {
    /// A client's own `X-Forwarded-For` is dropped and the address HAProxy sees (or the one
    /// the PROXY protocol gave) is sent: a client cannot make itself look like another.
    #[default]
    Replace,
    /// The client's `X-Forwarded-For` is kept and the address appended: for fleets behind a
    /// load balancer that sets it and that nothing else can reach.
    Append,
    /// No `X-Forwarded-For`.
    Off,
}

impl ForwardedFor {
    pub const ALL: [(&'static str, ForwardedFor); 3] = [
        ("replace", ForwardedFor::Replace),
        ("append", ForwardedFor::Append),
        ("off", ForwardedFor::Off),
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            ForwardedFor::Replace => "replace",
            ForwardedFor::Append => "append",
            ForwardedFor::Off => "off",
        }
    }

    pub fn is_default(&self) -> bool {
        *self == ForwardedFor::default()
    }
}

/// The fleet's timeouts, in milliseconds; `None`: the template's default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeouts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ms: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_ms: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_ms: Option<u32>,
    /// An upgraded connection (a WebSocket) idle on both sides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel_ms: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_request_ms: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_keep_alive_ms: Option<u32>,
}

impl Timeouts {
    pub fn is_default(&self) -> bool {
        *self == Timeouts::default()
    }
}

/// HTTP Strict Transport Security.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hsts {
    pub max_age_secs: u32,
    #[serde(default)]
    pub include_subdomains: bool,
    #[serde(default)]
    pub preload: bool,
}

/// Where an access log goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogTarget {
    /// HAProxy's standard output: the service manager's journal, or the file it is sent to.
    Stdout,
    Stderr,
    /// Syslog over UDP.
    Udp(SocketAddr),
    /// Syslog over TCP.
    Tcp(SocketAddr),
}

impl std::fmt::Display for LogTarget {
    /// As the settings key spells it: `stdout`, `stderr`, `udp://ip:port`, `tcp://ip:port`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogTarget::Stdout => write!(f, "stdout"),
            LogTarget::Stderr => write!(f, "stderr"),
            LogTarget::Udp(a) => write!(f, "udp://{a}"),
            LogTarget::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}

/// Which binds take the PROXY protocol (v1 or v2) from an upstream load balancer; a client
/// that does not send it there is refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptProxy {
    #[serde(default)]
    pub http: bool,
    #[serde(default)]
    pub https: bool,
}

impl AcceptProxy {
    pub fn is_default(&self) -> bool {
        *self == AcceptProxy::default()
    }
}

/// `ms` as HAProxy and the settings spell a duration: `1h`, `90s`, `250ms`.
pub fn duration_text(ms: u32) -> String {
    match ms {
        0 => "0ms".into(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

impl FleetSettings {
    /// Each setting that differs from the default, as `key=value` in the ConfigMap's spelling,
    /// sorted: what a version's causes and notes show.
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.forwarded_for.is_default() {
            out.push(format!("forwarded-for={}", self.forwarded_for.as_str()));
        }
        let t = &self.timeouts;
        for (key, value) in [
            ("timeout-client", t.client_ms),
            ("timeout-server", t.server_ms),
            ("timeout-connect", t.connect_ms),
            ("timeout-tunnel", t.tunnel_ms),
            ("timeout-http-request", t.http_request_ms),
            ("timeout-http-keep-alive", t.http_keep_alive_ms),
        ] {
            if let Some(ms) = value {
                out.push(format!("{key}={}", duration_text(ms)));
            }
        }
        if let Some(n) = self.max_connections {
            out.push(format!("max-connections={n}"));
        }
        if let Some(h) = &self.hsts {
            out.push(format!("hsts-max-age={}", h.max_age_secs));
            if h.include_subdomains {
                out.push("hsts-include-subdomains=true".into());
            }
            if h.preload {
                out.push("hsts-preload=true".into());
            }
        }
        if let Some(target) = &self.access_log {
            out.push(format!("access-log={target}"));
        }
        let binds: Vec<&str> =
            [("http", self.accept_proxy.http), ("https", self.accept_proxy.https)]
                .into_iter()
                .filter_map(|(name, on)| on.then_some(name))
                .collect();
        if !binds.is_empty() {
            out.push(format!("accept-proxy={}", binds.join(",")));
        }
        if let Some(port) = self.prometheus_port {
            out.push(format!("prometheus-port={port}"));
        }
        for (code, body) in &self.error_pages {
            let sha = crate::sha256_hex(body.as_bytes());
            out.push(format!("error-page-{code}=sha256:{} ({} bytes)", &sha[..12], body.len()));
        }
        out.sort();
        out
    }
}

/// A fleet's settings as its watcher read them, published on `hafleet.routes.<fleet>`. Each
/// replaces the fleet's settings whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingsUpdate {
    pub schema: u32,
    pub epoch: u64,
    /// The cluster whose watcher sent it (its epoch is that watcher's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterId>,
    pub fleet: FleetName,
    pub settings: FleetSettings,
    /// The ConfigMap's resourceVersion; empty when there is none (the defaults).
    #[serde(default)]
    pub resource_version: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_describe_what_differs_from_the_defaults() {
        let s = FleetSettings {
            forwarded_for: ForwardedFor::Append,
            timeouts: Timeouts {
                client_ms: Some(90_000),
                tunnel_ms: Some(7_200_000),
                ..Default::default()
            },
            max_connections: Some(5000),
            hsts: Some(Hsts { max_age_secs: 31_536_000, include_subdomains: true, preload: false }),
            access_log: Some(LogTarget::Udp("127.0.0.1:514".parse().unwrap())),
            accept_proxy: AcceptProxy { http: true, https: false },
            error_pages: vec![(503, "<h1>later</h1>".to_owned())],
            prometheus_port: Some(8405),
        };
        let msg = crate::RouteMessage::Settings(SettingsUpdate {
            schema: crate::SETTINGS_SCHEMA_VERSION,
            epoch: 3,
            cluster: None,
            fleet: FleetName::new("edge").unwrap(),
            settings: s.clone(),
            resource_version: "12".into(),
        });
        assert_eq!(crate::RouteMessage::decode(&msg.encode()).unwrap(), msg);
        assert_eq!(
            s.describe(),
            [
                "accept-proxy=http",
                "access-log=udp://127.0.0.1:514",
                "error-page-503=sha256:f989205cbc60 (14 bytes)",
                "forwarded-for=append",
                "hsts-include-subdomains=true",
                "hsts-max-age=31536000",
                "max-connections=5000",
                "prometheus-port=8405",
                "timeout-client=90s",
                "timeout-tunnel=2h",
            ]
        );
        assert!(FleetSettings::default().describe().is_empty());
        assert_eq!(serde_json::to_string(&FleetSettings::default()).unwrap(), "{}");
    }
}
