//! A fleet's settings as the template sees them ([`hafleet_proto::FleetSettings`], from the
//! ConfigMap `hafleet-fleet-<fleet>`): every value already in HAProxy's spelling, with the
//! built-in defaults filled in, so that a template only prints them. Pure.

use hafleet_proto::{FleetSettings, ForwardedFor, LogTarget, duration_text};
use serde::Serialize;

/// The defaults of a fleet without settings: what the built-in template always had, and a
/// tunnel timeout long enough for WebSockets.
pub const DEFAULT_TIMEOUTS: Timeouts = Timeouts {
    client_ms: 30_000,
    server_ms: 30_000,
    connect_ms: 2_000,
    tunnel_ms: 3_600_000,
    http_request_ms: 10_000,
    http_keep_alive_ms: 10_000,
};

/// Timeouts in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub client_ms: u32,
    pub server_ms: u32,
    pub connect_ms: u32,
    pub tunnel_ms: u32,
    pub http_request_ms: u32,
    pub http_keep_alive_ms: u32,
}

/// What the template sees as `settings`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SettingsModel {
    /// `replace`, `append` or `off` ([`ForwardedFor`]).
    pub forwarded_for: &'static str,
    pub timeout_client: String,
    pub timeout_server: String,
    pub timeout_connect: String,
    pub timeout_tunnel: String,
    pub timeout_http_request: String,
    pub timeout_http_keep_alive: String,
    pub max_connections: Option<u32>,
    /// The `Strict-Transport-Security` value, e.g. `max-age=31536000; includeSubDomains`.
    pub hsts: Option<String>,
    /// What follows `log` in `global`: target, format and facility.
    pub log: Option<String>,
    pub accept_proxy_http: bool,
    pub accept_proxy_https: bool,
    /// Each setting that is not the default, as `key=value`.
    pub set: Vec<String>,
    /// The fleet's error pages: status code, and the body as a double-quoted HAProxy string's
    /// inside ([`quoted_inside`]).
    pub error_pages: Vec<(u16, String)>,
    /// The port of HAProxy's Prometheus endpoint.
    pub prometheus_port: Option<u16>,
}

impl Default for SettingsModel {
    fn default() -> Self {
        SettingsModel::of(&FleetSettings::default())
    }
}

impl SettingsModel {
    pub fn of(s: &FleetSettings) -> SettingsModel {
        let t = &s.timeouts;
        let d = DEFAULT_TIMEOUTS;
        let text = |set: Option<u32>, default: u32| duration_text(set.unwrap_or(default));
        SettingsModel {
            forwarded_for: s.forwarded_for.as_str(),
            timeout_client: text(t.client_ms, d.client_ms),
            timeout_server: text(t.server_ms, d.server_ms),
            timeout_connect: text(t.connect_ms, d.connect_ms),
            timeout_tunnel: text(t.tunnel_ms, d.tunnel_ms),
            timeout_http_request: text(t.http_request_ms, d.http_request_ms),
            timeout_http_keep_alive: text(t.http_keep_alive_ms, d.http_keep_alive_ms),
            max_connections: s.max_connections,
            hsts: s.hsts.as_ref().map(|h| {
                let mut v = format!("max-age={}", h.max_age_secs);
                if h.include_subdomains {
                    v.push_str("; includeSubDomains");
                }
                if h.preload {
                    v.push_str("; preload");
                }
                v
            }),
            log: s.access_log.map(|target| match target {
                LogTarget::Stdout => "stdout format raw local0".to_owned(),
                LogTarget::Stderr => "stderr format raw local0".to_owned(),
                LogTarget::Udp(addr) => format!("udp@{addr} local0"),
                LogTarget::Tcp(addr) => format!("tcp@{addr} local0"),
            }),
            accept_proxy_http: s.accept_proxy.http,
            accept_proxy_https: s.accept_proxy.https,
            set: s.describe(),
            error_pages: s
                .error_pages
                .iter()
                .filter(|(code, _)| hafleet_proto::ERROR_PAGE_CODES.contains(code))
                .map(|(code, body)| (*code, quoted_inside(body)))
                .collect(),
            prometheus_port: s.prometheus_port,
        }
    }

    /// Every setting away from its default: what a template is tried with when it is loaded,
    /// so that one that breaks on a setting is refused then, not when an admin sets it.
    pub fn every_one_set() -> SettingsModel {
        SettingsModel::of(&FleetSettings {
            forwarded_for: ForwardedFor::Append,
            timeouts: hafleet_proto::Timeouts {
                client_ms: Some(1_000),
                server_ms: Some(1_000),
                connect_ms: Some(1_000),
                tunnel_ms: Some(1_000),
                http_request_ms: Some(1_000),
                http_keep_alive_ms: Some(1_000),
            },
            max_connections: Some(1),
            hsts: Some(hafleet_proto::Hsts {
                max_age_secs: 1,
                include_subdomains: true,
                preload: true,
            }),
            access_log: Some(LogTarget::Stdout),
            accept_proxy: hafleet_proto::AcceptProxy { http: true, https: true },
            prometheus_port: Some(8405),
            error_pages: vec![(503, "<p class=\"x\">\"$HOME\" #1 %[src] \\ café</p>\n".into())],
        })
    }

    /// Whether backends get `X-Forwarded-For` at all.
    pub fn forwards_for(&self) -> bool {
        self.forwarded_for != ForwardedFor::Off.as_str()
    }
}

/// `text` as the inside of a double-quoted HAProxy word: letters, digits, spaces and inert
/// punctuation as they are, every other byte (quotes, `\`, `$`, `#`, `%`, line breaks,
/// UTF-8) as `\xNN`, which HAProxy turns back into that byte. Nothing in it can end the
/// word, name a variable or start a comment.
pub fn quoted_inside(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    for b in text.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b' ' => out.push(char::from(b)),
            b'<' | b'>' | b'/' | b'=' | b'.' | b',' | b':' | b';' | b'!' | b'?' | b'(' | b')'
            | b'-' | b'_' | b'*' | b'+' | b'&' | b'@' | b'[' | b']' | b'{' | b'}' | b'|' | b'~'
            | b'^' | b'\'' => out.push(char::from(b)),
            b => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hafleet_proto::{AcceptProxy, Hsts};

    #[test]
    fn defaults_are_the_templates_and_settings_are_in_haproxys_spelling() {
        let d = SettingsModel::default();
        assert_eq!(
            (d.timeout_client.as_str(), d.timeout_tunnel.as_str(), d.timeout_connect.as_str()),
            ("30s", "1h", "2s")
        );
        assert_eq!((d.forwarded_for, d.log.as_deref(), d.hsts.as_deref()), ("replace", None, None));
        assert!(d.forwards_for() && d.set.is_empty());
        let s = SettingsModel::of(&FleetSettings {
            forwarded_for: ForwardedFor::Off,
            timeouts: hafleet_proto::Timeouts { server_ms: Some(1_500), ..Default::default() },
            hsts: Some(Hsts { max_age_secs: 600, include_subdomains: true, preload: true }),
            access_log: Some(LogTarget::Tcp("127.0.0.1:6514".parse().unwrap())),
            accept_proxy: AcceptProxy { http: false, https: true },
            max_connections: Some(10),
            prometheus_port: None,
            error_pages: vec![(200, "ignored".into()), (503, "<b>\"x\" $y</b>\n".into())],
        });
        assert_eq!(s.error_pages, [(503, "<b>\\x22x\\x22 \\x24y</b>\\x0a".to_owned())]);
        assert_eq!(s.timeout_server, "1500ms");
        assert_eq!(s.hsts.as_deref(), Some("max-age=600; includeSubDomains; preload"));
        assert_eq!(s.log.as_deref(), Some("tcp@127.0.0.1:6514 local0"));
        assert!(!s.forwards_for() && s.accept_proxy_https && !s.accept_proxy_http);
        assert_eq!(s.set.len(), 10, "{:?}", s.set);
    }
}
