//! Fleet settings: the ConfigMap `hafleet-fleet-<fleet>` in the settings namespace
//! (`--settings-namespace`), read strictly into [`FleetSettings`]. Pure: [`parse`] reads one
//! ConfigMap's keys; [`InForce::plan`] decides, from every such ConfigMap as it stands, what to
//! publish per fleet and what to tell. A ConfigMap with an unknown key or a bad value changes
//! nothing: its fleet keeps the last good settings, and a Warning Event names each mistake.
//!
//! ```yaml
//! apiVersion: v1
//! kind: ConfigMap
//! metadata: {name: hafleet-fleet-edge, namespace: hafleet-system}
//! data:
//!   timeout-client: 1m
//!   timeout-tunnel: 2h
//!   forwarded-for: replace        # replace (default), append or off
//!   access-log: udp://10.0.0.5:514
//!   hsts-max-age: "31536000"
//! ```

use hafleet_proto::{
    AcceptProxy, FleetName, FleetSettings, ForwardedFor, Hsts, LogTarget, SettingsUpdate,
};
use k8s_openapi::api::core::v1::ConfigMap;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use crate::core::annotations::{millis, number};

/// A fleet's settings live in the ConfigMap of this name followed by the fleet's.
pub const NAME_PREFIX: &str = "hafleet-fleet-";

/// Every key, with what it takes: the reference for admins (README) and for the error that
/// names an unknown key.
pub const KNOWN: &[(&str, &str)] = &[
    ("timeout-client", "a duration from 1s to 24h (default 30s), e.g. 90s, 5m"),
    ("timeout-server", "a duration from 1s to 24h (default 30s)"),
    ("timeout-connect", "a duration from 100ms to 1m (default 2s)"),
    ("timeout-tunnel", "idle WebSockets and other upgraded connections: 1s to 24h (default 1h)"),
    ("timeout-http-request", "time to send a whole request head: 1s to 5m (default 10s)"),
    ("timeout-http-keep-alive", "idle time between requests: 100ms to 5m (default 10s)"),
    ("forwarded-for", "replace (default), append or off: the X-Forwarded-For backends get"),
    ("max-connections", "most client connections per host, 1 to 1000000"),
    ("hsts-max-age", "seconds, 0 to 63072000: Strict-Transport-Security on HTTPS answers"),
    ("hsts-include-subdomains", "true or false (needs hsts-max-age)"),
    ("hsts-preload", "true or false (needs hsts-max-age)"),
    ("access-log", "stdout, stderr, udp://IP:PORT or tcp://IP:PORT (syslog)"),
    ("accept-proxy", "binds that take the PROXY protocol from a load balancer: http, https"),
    ("prometheus-port", "a port for HAProxy's own Prometheus metrics (/metrics), 1 to 65535"),
    (
        "error-page-<code>",
        "the HTML HAProxy answers with for 400, 403, 404, 429, 503, …: at most 8 KiB",
    ),
];

const SECOND: u32 = 1_000;
const MINUTE: u32 = 60 * SECOND;
const DAY: u32 = 24 * 60 * MINUTE;

/// The fleet a ConfigMap of this name sets, if it is one.
pub fn fleet_of(name: &str) -> Option<FleetName> {
    FleetName::new(name.strip_prefix(NAME_PREFIX)?).ok()
}

/// Reads every key of a settings ConfigMap; errors name the key and the reason.
pub fn parse(data: &BTreeMap<String, String>) -> Result<FleetSettings, Vec<String>> {
    let mut s = FleetSettings::default();
    let mut errors = Vec::new();
    let (mut include_subdomains, mut preload) = (None, None);
    let t = &mut s.timeouts;
    for (key, value) in data {
        let v = value.trim();
        let result: Result<(), String> = match key.as_str() {
            "timeout-client" => millis(v, SECOND, DAY).map(|d| t.client_ms = Some(d)),
            "timeout-server" => millis(v, SECOND, DAY).map(|d| t.server_ms = Some(d)),
            "timeout-connect" => millis(v, 100, MINUTE).map(|d| t.connect_ms = Some(d)),
            "timeout-tunnel" => millis(v, SECOND, DAY).map(|d| t.tunnel_ms = Some(d)),
            "timeout-http-request" => {
                millis(v, SECOND, 5 * MINUTE).map(|d| t.http_request_ms = Some(d))
            }
            "timeout-http-keep-alive" => {
                millis(v, 100, 5 * MINUTE).map(|d| t.http_keep_alive_ms = Some(d))
            }
            "forwarded-for" => ForwardedFor::ALL
                .iter()
                .find(|(name, _)| *name == v)
                .map(|(_, f)| s.forwarded_for = *f)
                .ok_or_else(|| "must be replace, append or off".to_owned()),
            "max-connections" => number(v, 1, 1_000_000).map(|n| s.max_connections = Some(n)),
            "hsts-max-age" => number(v, 0, 63_072_000).map(|n| {
                s.hsts = Some(Hsts { max_age_secs: n, include_subdomains: false, preload: false })
            }),
            "hsts-include-subdomains" => flag(v).map(|b| include_subdomains = Some(b)),
            "hsts-preload" => flag(v).map(|b| preload = Some(b)),
            "access-log" => log_target(v).map(|l| s.access_log = Some(l)),
            "accept-proxy" => accept_proxy(v).map(|a| s.accept_proxy = a),
            "prometheus-port" => {
                number(v, 1, 65_535).map(|p| s.prometheus_port = u16::try_from(p).ok())
            }
            k if k.starts_with("error-page-") => {
                error_page(&k["error-page-".len()..], value).map(|p| s.error_pages.push(p))
            }
            _ => Err(format!(
                "is not a fleet setting (known: {})",
                KNOWN.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
            )),
        };
        if let Err(why) = result {
            errors.push(format!("{key}={:?} {why}", shortened(value)));
        }
    }
    match (&mut s.hsts, include_subdomains.is_some() || preload.is_some()) {
        (Some(h), _) => {
            h.include_subdomains = include_subdomains.unwrap_or(false);
            h.preload = preload.unwrap_or(false);
        }
        (None, true) => {
            errors.push("hsts-include-subdomains and hsts-preload need hsts-max-age".into())
        }
        (None, false) => {}
    }
    match errors.is_empty() {
        true => Ok(s),
        false => Err(errors),
    }
}

/// A value as an error quotes it: at most 64 characters.
fn shortened(value: &str) -> String {
    match value.chars().count() <= 64 {
        true => value.to_owned(),
        false => format!("{}…", value.chars().take(48).collect::<String>()),
    }
}

fn flag(v: &str) -> Result<bool, String> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err("must be true or false".into()),
    }
}

/// An error page's status code (from its key) and body (the value as written, not trimmed).
fn error_page(code: &str, body: &str) -> Result<(u16, String), String> {
    let codes = || {
        let all: Vec<String> =
            hafleet_proto::ERROR_PAGE_CODES.iter().map(|c| c.to_string()).collect();
        format!("is not a status HAProxy answers with ({})", all.join(", "))
    };
    let code = code
        .parse::<u16>()
        .ok()
        .filter(|c| hafleet_proto::ERROR_PAGE_CODES.contains(c))
        .ok_or_else(codes)?;
    if body.trim().is_empty() {
        return Err("is empty".into());
    }
    if body.len() > hafleet_proto::MAX_ERROR_PAGE {
        return Err(format!(
            "is {} bytes, more than {}",
            body.len(),
            hafleet_proto::MAX_ERROR_PAGE
        ));
    }
    Ok((code, body.to_owned()))
}

/// `stdout`, `stderr`, `udp://IP:PORT` or `tcp://IP:PORT`: an address, never a name HAProxy
/// would resolve when it starts.
fn log_target(v: &str) -> Result<LogTarget, String> {
    let bad = || "must be stdout, stderr, udp://IP:PORT or tcp://IP:PORT".to_owned();
    let addr = |a: &str| a.parse::<SocketAddr>().ok().filter(|a| a.port() != 0).ok_or_else(bad);
    match v.split_once("://") {
        None if v == "stdout" => Ok(LogTarget::Stdout),
        None if v == "stderr" => Ok(LogTarget::Stderr),
        Some(("udp", a)) => addr(a).map(LogTarget::Udp),
        Some(("tcp", a)) => addr(a).map(LogTarget::Tcp),
        _ => Err(bad()),
    }
}

/// A comma-separated list of `http` and `https`, each at most once; empty or `none`: neither.
fn accept_proxy(v: &str) -> Result<AcceptProxy, String> {
    let mut a = AcceptProxy::default();
    if v == "none" {
        return Ok(a);
    }
    for bind in v.split(',').map(str::trim).filter(|b| !b.is_empty()) {
        match bind {
            "http" if !a.http => a.http = true,
            "https" if !a.https => a.https = true,
            _ => return Err("must list http, https or both (or be none)".into()),
        }
    }
    Ok(a)
}

/// What a pass decided: the settings to publish, and what to tell on which ConfigMap.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub publish: Vec<SettingsUpdate>,
    /// (ConfigMap, warning?, reason, note).
    pub tell: Vec<(Arc<ConfigMap>, bool, &'static str, String)>,
}

/// The settings a watcher read and published, per fleet.
#[derive(Debug, Default)]
pub struct InForce {
    /// The last good settings of each fleet with a ConfigMap, with its resourceVersion.
    good: BTreeMap<FleetName, (String, FleetSettings)>,
    /// What was published (and acked) per fleet.
    published: BTreeMap<FleetName, FleetSettings>,
    /// (ConfigMap name, resourceVersion) already told about.
    told: BTreeSet<(String, String)>,
}

impl InForce {
    /// Forgets what was published, so that every fleet's settings go out again.
    pub fn forget_published(&mut self) {
        self.published.clear();
    }

    /// From the settings namespace's ConfigMaps as they stand: what to publish for each fleet
    /// that has a ConfigMap or routes (`fleets`). A fleet without a ConfigMap gets the
    /// defaults; one whose ConfigMap is broken keeps its last good settings, or gets nothing
    /// published when this run has read none (the renderer keeps what it has).
    pub fn plan(
        &mut self,
        config_maps: &[Arc<ConfigMap>],
        fleets: impl IntoIterator<Item = FleetName>,
        (epoch, cluster): (u64, Option<&hafleet_proto::ClusterId>),
    ) -> Plan {
        let mut plan = Plan::default();
        let mut with_map: BTreeSet<FleetName> = BTreeSet::new();
        for cm in config_maps {
            let Some(name) = cm.metadata.name.as_deref() else { continue };
            let Some(fleet) = fleet_of(name) else { continue };
            with_map.insert(fleet.clone());
            let rv = cm.metadata.resource_version.clone().unwrap_or_default();
            if self.good.get(&fleet).is_some_and(|(seen, _)| *seen == rv) {
                continue;
            }
            let first = self.told.insert((name.to_owned(), rv.clone()));
            match parse(&cm.data.clone().unwrap_or_default()) {
                Ok(settings) => {
                    self.good.insert(fleet.clone(), (rv, settings));
                }
                Err(errors) => {
                    if first {
                        let note = format!(
                            "fleet {fleet} keeps its last good settings: {}",
                            errors.join("; ")
                        );
                        plan.tell.push((Arc::clone(cm), true, "InvalidSettings", note));
                    }
                }
            }
        }
        // A ConfigMap that went: its fleet is back to the defaults.
        self.good.retain(|fleet, _| with_map.contains(fleet));
        self.told.retain(|(name, _)| fleet_of(name).is_some_and(|f| with_map.contains(&f)));
        let fleets: BTreeSet<FleetName> =
            fleets.into_iter().chain(with_map.iter().cloned()).collect();
        for fleet in fleets {
            let (rv, settings) = match self.good.get(&fleet) {
                Some((rv, s)) => (rv.clone(), s.clone()),
                // Broken, and nothing good read yet: nothing to say.
                None if with_map.contains(&fleet) => continue,
                None => (String::new(), FleetSettings::default()),
            };
            if self.published.get(&fleet) == Some(&settings) {
                continue;
            }
            plan.publish.push(SettingsUpdate {
                schema: hafleet_proto::SETTINGS_SCHEMA_VERSION,
                epoch,
                cluster: cluster.cloned(),
                fleet,
                settings,
                resource_version: rv,
            });
        }
        plan
    }

    /// Records that `update` was published (and acked).
    pub fn published(&mut self, update: &SettingsUpdate) {
        self.published.insert(update.fleet.clone(), update.settings.clone());
    }

    /// The ConfigMap whose settings `update` are, to tell that they are out.
    pub fn source<'a>(
        config_maps: &'a [Arc<ConfigMap>],
        update: &SettingsUpdate,
    ) -> Option<&'a Arc<ConfigMap>> {
        let name = format!("{NAME_PREFIX}{}", update.fleet);
        config_maps.iter().find(|cm| cm.metadata.name.as_deref() == Some(name.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn every_key_is_read_into_its_setting() {
        let s = parse(&data(&[
            ("timeout-client", "90s"),
            ("timeout-server", "2m"),
            ("timeout-connect", "500ms"),
            ("timeout-tunnel", "2h"),
            ("timeout-http-request", "5s"),
            ("timeout-http-keep-alive", "1s"),
            ("forwarded-for", "append"),
            ("max-connections", "5000"),
            ("hsts-max-age", "31536000"),
            ("hsts-include-subdomains", "true"),
            ("hsts-preload", "false"),
            ("access-log", "tcp://[::1]:6514"),
            ("accept-proxy", "https, http"),
            ("error-page-503", "<h1>Back soon</h1>\n"),
            ("error-page-404", "<p>nothing here</p>"),
            ("prometheus-port", "8405"),
        ]))
        .unwrap();
        let t = &s.timeouts;
        assert_eq!(
            (t.client_ms, t.server_ms, t.connect_ms, t.tunnel_ms),
            (Some(90_000), Some(120_000), Some(500), Some(7_200_000))
        );
        assert_eq!((t.http_request_ms, t.http_keep_alive_ms), (Some(5_000), Some(1_000)));
        assert_eq!((s.forwarded_for, s.max_connections), (ForwardedFor::Append, Some(5000)));
        let hsts = s.hsts.unwrap();
        assert_eq!(
            (hsts.max_age_secs, hsts.include_subdomains, hsts.preload),
            (31_536_000, true, false)
        );
        assert_eq!(s.access_log, Some(LogTarget::Tcp("[::1]:6514".parse().unwrap())));
        assert_eq!(s.accept_proxy, AcceptProxy { http: true, https: true });
        let pages: Vec<u16> = s.error_pages.iter().map(|(c, _)| *c).collect();
        assert_eq!(pages, [404, 503], "sorted by code");
        assert_eq!(s.error_pages[1].1, "<h1>Back soon</h1>\n", "the body as written");
        assert_eq!(parse(&data(&[])).unwrap(), FleetSettings::default());
        assert_eq!(s.prometheus_port, Some(8405));
        assert_eq!(KNOWN.len(), 15, "every key in KNOWN is read above");
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key_and_the_reason() {
        for (key, value, says) in [
            ("timeout-clinet", "30s", "is not a fleet setting (known: timeout-client"),
            ("timeout-client", "30", "with a unit"),
            ("timeout-client", "25h", "from 1s to 24h"),
            ("timeout-connect", "50ms", "from 100ms to 1m"),
            ("forwarded-for", "yes", "replace, append or off"),
            ("max-connections", "0", "from 1 to 1000000"),
            ("hsts-max-age", "-1", "whole number"),
            ("hsts-preload", "yes", "true or false"),
            ("access-log", "udp://logs.example.com:514", "udp://IP:PORT"),
            ("access-log", "/var/log/haproxy.log", "stdout, stderr"),
            ("access-log", "udp://127.0.0.1:0", "udp://IP:PORT"),
            ("accept-proxy", "http,http", "http, https or both"),
            ("accept-proxy", "tcp", "http, https or both"),
            ("error-page-200", "<p>ok</p>", "not a status HAProxy answers with (400"),
            ("prometheus-port", "70000", "from 1 to 65535"),
            ("error-page-x", "<p>ok</p>", "not a status"),
            ("error-page-503", " ", "is empty"),
            ("error-page-503", &"x".repeat(8193), "more than 8192"),
        ] {
            let errors = parse(&data(&[(key, value)])).unwrap_err();
            assert_eq!(errors.len(), 1, "{key}: {errors:?}");
            assert!(
                errors[0].starts_with(&format!("{key}=")) && errors[0].contains(says),
                "{errors:?}"
            );
        }
        let errors = parse(&data(&[("hsts-preload", "true")])).unwrap_err();
        assert!(errors[0].contains("need hsts-max-age"), "{errors:?}");
    }

    fn cm(fleet: &str, rv: &str, pairs: &[(&str, &str)]) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{NAME_PREFIX}{fleet}")),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            data: Some(data(pairs)),
            ..Default::default()
        })
    }

    #[test]
    fn a_broken_configmap_keeps_the_last_good_settings_and_is_told_once() {
        let mut f = InForce::default();
        let edge = FleetName::new("edge").unwrap();
        let core = FleetName::new("core").unwrap();
        let at = (5, None);
        let good = [cm("edge", "1", &[("timeout-client", "1m")])];
        let plan = f.plan(&good, [core.clone()], at);
        assert!(plan.tell.is_empty());
        let fleets: Vec<_> =
            plan.publish.iter().map(|u| (u.fleet.as_str(), u.resource_version.as_str())).collect();
        assert_eq!(fleets, [("core", ""), ("edge", "1")], "core gets the defaults");
        for u in &plan.publish {
            f.published(u);
        }
        assert_eq!(f.plan(&good, [core.clone()], at), Plan::default(), "nothing new");

        let broken = [cm("edge", "2", &[("timeout-client", "1 minute")])];
        let plan = f.plan(&broken, [], at);
        assert!(plan.publish.is_empty(), "the last good settings stay");
        assert_eq!(plan.tell.len(), 1);
        assert!(plan.tell[0].3.contains("timeout-client=\"1 minute\""), "{}", plan.tell[0].3);
        assert!(f.plan(&broken, [], at).tell.is_empty(), "told once");

        // Deleted: back to the defaults.
        let plan = f.plan(&[], [edge.clone()], at);
        assert_eq!(plan.publish.len(), 1);
        assert_eq!(plan.publish[0].settings, FleetSettings::default());

        // A watcher that starts with a broken ConfigMap publishes nothing for its fleet.
        let mut fresh = InForce::default();
        let plan = fresh.plan(&broken, [edge], at);
        assert!(plan.publish.is_empty() && plan.tell.len() == 1);
        // Not a settings ConfigMap: ignored.
        let other = [Arc::new(ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("hafleet-tenancy".into()),
                ..Default::default()
            },
            ..Default::default()
        })];
        assert_eq!(InForce::default().plan(&other, [], at), Plan::default());
    }
}
