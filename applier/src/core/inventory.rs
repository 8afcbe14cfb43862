//! A fleet's inventory: which HAProxy servers it has and how to reach and drive each one.
//! Parsed from TOML and validated up front, because its paths and names end up in commands run
//! on those servers.
//!
//! ```toml
//! [[hosts]]
//! name = "lb-1"                                # RFC 1123 label; names reports
//! address = "10.0.0.10"                        # IP address or DNS name
//! port = 22                                    # default 22
//! user = "hafleet"                             # default "hafleet"
//! config_path = "/etc/haproxy/haproxy.cfg"     # the file HAProxy's master loads (-f)
//! master_socket = "/run/haproxy-master.sock"   # HAProxy's master CLI (-S)
//! haproxy_bin = "/usr/sbin/haproxy"            # the default; sshd's PATH lacks /usr/sbin
//! probe_address = "10.0.0.10:80"               # where HAProxy serves HTTP, for the probes
//! canary = true                                # may be the canary (the default); false: never
//!
//! [[probes]]                                   # every host's, unless it lists its own
//! path = "/healthz"                            #   (as [[hosts.probes]])
//! host = "shop.example.com"                    # the Host header
//! status = 200                                 # the status it must answer
//! ```
//! Order matters: the first host that can be reached (of those that may be: `canary = false`
//! keeps a host out of the role, a host of another trust zone say, so that it cannot veto
//! every version) is the canary, and each version goes there alone before it goes anywhere
//! else; at least one host must be able to be the canary. After a version goes live on a host, each probe must
//! answer its status within the applier's `--probe-timeout`, or the host goes back to
//! last-known-good and the rollout halts.

use crate::adapters::probe::Probe;
use hafleet_proto::{HostName, HttpHost};
use serde::Deserialize;
use std::collections::BTreeSet;
use std::net::IpAddr;

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("inventory is not valid TOML")]
    Parse(#[from] toml::de::Error),
    #[error("inventory lists no hosts")]
    Empty,
    #[error("host {host}: {what} {value:?} is not allowed: {rule}")]
    Invalid { host: String, what: &'static str, value: String, rule: &'static str },
    #[error("host name {0} appears twice")]
    Duplicate(String),
    #[error("every host says canary = false: at least one must be able to be the canary")]
    NoCanary,
    #[error("host name: {0}")]
    Name(#[from] hafleet_proto::InvalidValue),
}

/// One HAProxy server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub name: HostName,
    pub address: String,
    pub port: u16,
    pub user: String,
    pub config_path: String,
    pub master_socket: String,
    pub haproxy_bin: String,
    /// `host:port` HAProxy serves HTTP on, as the applier reaches it; set when `probes` are.
    pub probe_address: Option<String>,
    /// What must answer after each version goes live here.
    pub probes: Vec<Probe>,
    /// Whether it may be the canary.
    pub canary: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInventory {
    hosts: Vec<RawHost>,
    #[serde(default)]
    probes: Vec<Probe>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    name: String,
    address: String,
    #[serde(default = "default_port")]
    port: u16,
    #[serde(default = "default_user")]
    user: String,
    #[serde(default = "default_config_path")]
    config_path: String,
    #[serde(default = "default_master_socket")]
    master_socket: String,
    #[serde(default = "default_haproxy_bin")]
    haproxy_bin: String,
    #[serde(default)]
    probe_address: Option<String>,
    #[serde(default)]
    probes: Option<Vec<Probe>>,
    #[serde(default = "default_canary")]
    canary: bool,
}

fn default_canary() -> bool {
    true
}

fn default_port() -> u16 {
    22
}
fn default_user() -> String {
    "hafleet".into()
}
fn default_config_path() -> String {
    "/etc/haproxy/haproxy.cfg".into()
}
fn default_master_socket() -> String {
    "/run/haproxy-master.sock".into()
}
fn default_haproxy_bin() -> String {
    "/usr/sbin/haproxy".into()
}

/// Parses and validates an inventory. Hosts keep their order (the canary is the first reachable).
pub fn parse(text: &str) -> Result<Vec<Host>, InventoryError> {
    let raw: RawInventory = toml::from_str(text)?;
    if raw.hosts.is_empty() {
        return Err(InventoryError::Empty);
    }
    let mut seen = BTreeSet::new();
    let mut hosts = Vec::with_capacity(raw.hosts.len());
    for h in raw.hosts {
        let name = HostName::new(h.name)?;
        if !seen.insert(name.clone()) {
            return Err(InventoryError::Duplicate(name.to_string()));
        }
        let invalid = |what, value: &str, rule| InventoryError::Invalid {
            host: name.to_string(),
            what,
            value: value.to_owned(),
            rule,
        };
        if h.address.parse::<IpAddr>().is_err() && HttpHost::new(h.address.as_str()).is_err() {
            return Err(invalid("address", &h.address, "must be an IP address or a DNS name"));
        }
        let user_ok = !h.user.is_empty()
            && h.user.len() <= 32
            && h.user.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && h.user
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-".contains(c));
        if !user_ok {
            return Err(invalid("user", &h.user, "must be a POSIX user name ([a-z_][a-z0-9_-]*)"));
        }
        for (what, path) in [("config_path", &h.config_path), ("master_socket", &h.master_socket)] {
            if !is_safe_path(path) || !path.starts_with('/') {
                return Err(invalid(what, path, "must be an absolute path of [A-Za-z0-9._/-]"));
            }
        }
        if !is_safe_path(&h.haproxy_bin) {
            return Err(invalid(
                "haproxy_bin",
                &h.haproxy_bin,
                "must be a path of [A-Za-z0-9._/-]",
            ));
        }
        if h.port == 0 {
            return Err(invalid("port", "0", "must be 1-65535"));
        }
        let probes = h.probes.unwrap_or_else(|| raw.probes.clone());
        if let Some(a) = &h.probe_address {
            let ok = a.rsplit_once(':').is_some_and(|(addr, port)| {
                let addr = addr.trim_start_matches('[').trim_end_matches(']');
                port.parse::<u16>().is_ok_and(|p| p != 0)
                    && (addr.parse::<IpAddr>().is_ok() || HttpHost::new(addr).is_ok())
            });
            if !ok {
                return Err(invalid("probe_address", a, "must be host:port (an IP or DNS name)"));
            }
        }
        if !probes.is_empty() && h.probe_address.is_none() {
            return Err(invalid("probe_address", "", "is needed to run the host's probes"));
        }
        hosts.push(Host {
            name,
            address: h.address,
            port: h.port,
            user: h.user,
            config_path: h.config_path,
            master_socket: h.master_socket,
            haproxy_bin: h.haproxy_bin,
            probe_address: h.probe_address,
            probes,
            canary: h.canary,
        });
    }
    if !hosts.iter().any(|h| h.canary) {
        return Err(InventoryError::NoCanary);
    }
    Ok(hosts)
}

fn is_safe_path(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 4096
        && !p.split('/').any(|part| part == "..")
        && p.chars().all(|c| c.is_ascii_alphanumeric() || "._/-".contains(c))
}

/// How a re-read inventory differs from the one in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reread {
    /// For each host of the old inventory, its index in the new one (`None`: removed).
    pub moved: Vec<Option<usize>>,
    /// Hosts of the new inventory that are new, or whose entry changed (address, paths,
    /// probes…): they are given the fleet's current version.
    pub fresh: Vec<usize>,
    /// Hosts no longer in it.
    pub removed: Vec<HostName>,
}

impl Reread {
    /// Whether anything changed at all (the order of hosts counts: it chooses the canary).
    pub fn changes_anything(&self) -> bool {
        !self.fresh.is_empty()
            || !self.removed.is_empty()
            || self.moved.iter().enumerate().any(|(i, m)| *m != Some(i))
    }
}

/// Compares the inventory in use with a re-read one, host by host, by name. Pure.
pub fn reread(old: &[Host], new: &[Host]) -> Reread {
    let at = |name: &HostName| new.iter().position(|h| &h.name == name);
    let moved: Vec<Option<usize>> =
        old.iter().map(|h| at(&h.name).filter(|&j| new[j] == *h)).collect();
    let kept: Vec<usize> = moved.iter().flatten().copied().collect();
    Reread {
        fresh: (0..new.len()).filter(|j| !kept.contains(j)).collect(),
        removed: old.iter().filter(|h| at(&h.name).is_none()).map(|h| h.name.clone()).collect(),
        moved,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reread_inventory_names_new_changed_moved_and_removed_hosts() {
        let text = |hosts: &[(&str, &str)]| {
            let mut t = String::new();
            for (name, address) in hosts {
                t.push_str(&format!("[[hosts]]\nname = \"{name}\"\naddress = \"{address}\"\n"));
            }
            parse(&t).unwrap()
        };
        let old = text(&[("lb-1", "10.0.0.1"), ("lb-2", "10.0.0.2"), ("lb-3", "10.0.0.3")]);
        assert!(!reread(&old, &old).changes_anything());
        // lb-2 goes, lb-3 moves up and gets a new address, lb-4 comes.
        let new = text(&[("lb-1", "10.0.0.1"), ("lb-3", "10.0.0.9"), ("lb-4", "10.0.0.4")]);
        let r = reread(&old, &new);
        assert_eq!(r.moved, [Some(0), None, None]);
        assert_eq!(r.fresh, [1, 2]);
        assert_eq!(r.removed.iter().map(|h| h.as_str()).collect::<Vec<_>>(), ["lb-2"]);
        assert!(r.changes_anything());
        // Only the order: nothing fresh, but it changes (the canary is the first host).
        let swapped = text(&[("lb-2", "10.0.0.2"), ("lb-1", "10.0.0.1"), ("lb-3", "10.0.0.3")]);
        let r = reread(&old, &swapped);
        assert_eq!((r.moved, r.fresh.len()), (vec![Some(1), Some(0), Some(2)], 0));
    }

    #[test]
    fn a_host_may_be_kept_from_the_canary_role_but_not_every_host() {
        let hosts = parse(
            "[[hosts]]\nname = \"lb-1\"\naddress = \"10.0.0.1\"\ncanary = false\n\
             [[hosts]]\nname = \"lb-2\"\naddress = \"10.0.0.2\"\n",
        )
        .unwrap();
        assert_eq!(hosts.iter().map(|h| h.canary).collect::<Vec<_>>(), [false, true]);
        let none = parse("[[hosts]]\nname = \"lb-1\"\naddress = \"10.0.0.1\"\ncanary = false\n");
        assert!(matches!(none, Err(InventoryError::NoCanary)), "{none:?}");
    }

    #[test]
    fn probes_are_the_fleet_s_unless_a_host_lists_its_own_and_need_an_address() {
        let hosts = parse(
            r#"
            [[probes]]
            path = "/healthz"
            host = "shop.example.com"
            status = 200
            [[hosts]]
            name = "lb-1"
            address = "10.0.0.1"
            probe_address = "10.0.0.1:80"
            [[hosts]]
            name = "lb-2"
            address = "10.0.0.2"
            probe_address = "lb-2.example.com:8080"
            [[hosts.probes]]
            path = "/"
            host = "other.example.com"
            status = 404
            "#,
        )
        .unwrap();
        assert_eq!(
            hosts[0].probes[0].to_string(),
            "GET http://shop.example.com/healthz expecting 200"
        );
        assert_eq!(hosts[1].probes.len(), 1);
        assert_eq!(hosts[1].probes[0].status, 404);
        let no_address = "[[probes]]\npath=\"/\"\nhost=\"a.com\"\nstatus=200\n[[hosts]]\nname=\"a\"\naddress=\"1.1.1.1\"\n";
        assert!(parse(no_address).unwrap_err().to_string().contains("probe_address"));
        for bad in ["1.1.1.1", "1.1.1.1:0", "a b:80", "1.1.1.1:x"] {
            let text =
                format!("[[hosts]]\nname=\"a\"\naddress=\"1.1.1.1\"\nprobe_address=\"{bad}\"\n");
            assert!(parse(&text).is_err(), "{bad}");
        }
        let bad_path = "[[probes]]\npath=\"x y\"\nhost=\"a.com\"\nstatus=200\n[[hosts]]\nname=\"a\"\naddress=\"1.1.1.1\"\n";
        assert!(parse(bad_path).is_err());
    }

    #[test]
    fn defaults_fill_in_and_order_is_kept() {
        let hosts = parse(
            r#"
            [[hosts]]
            name = "lb-2"
            address = "10.0.0.2"
            [[hosts]]
            name = "lb-1"
            address = "lb-1.example.com"
            port = 2222
            user = "edge"
            config_path = "/srv/haproxy/haproxy.cfg"
            "#,
        )
        .unwrap();
        assert_eq!(hosts[0].name.as_str(), "lb-2");
        assert_eq!(hosts[0].port, 22);
        assert_eq!(hosts[0].user, "hafleet");
        assert_eq!(hosts[0].config_path, "/etc/haproxy/haproxy.cfg");
        assert_eq!(hosts[1].port, 2222);
        assert_eq!(hosts[1].config_path, "/srv/haproxy/haproxy.cfg");
    }

    #[test]
    fn unsafe_values_are_refused_with_the_field_named() {
        let case = |field: &str| {
            let text = format!("[[hosts]]\nname = \"lb-1\"\naddress = \"10.0.0.1\"\n{field}\n");
            // What an operator sees: the error and its causes.
            let mut err: &dyn std::error::Error = &parse(&text).unwrap_err();
            let mut text = err.to_string();
            while let Some(source) = err.source() {
                text = format!("{text}: {source}");
                err = source;
            }
            text
        };
        assert!(case("config_path = \"/etc/x;rm -rf /\"").contains("config_path"));
        assert!(case("config_path = \"relative.cfg\"").contains("config_path"));
        assert!(case("master_socket = \"/run/../etc/x\"").contains("master_socket"));
        assert!(case("user = \"root; id\"").contains("user"));
        assert!(case("haproxy_bin = \"$(id)\"").contains("haproxy_bin"));
        assert!(case("port = 0").contains("port"));
        assert!(case("colour = \"red\"").contains("colour"), "unknown fields are errors");
        let bad_addr = "[[hosts]]\nname = \"lb-1\"\naddress = \"a b\"\n";
        assert!(parse(bad_addr).unwrap_err().to_string().contains("address"));
    }

    #[test]
    fn names_must_be_unique_labels_and_the_list_not_empty() {
        let dup = "[[hosts]]\nname=\"a\"\naddress=\"1.1.1.1\"\n[[hosts]]\nname=\"a\"\naddress=\"1.1.1.2\"\n";
        assert!(matches!(parse(dup), Err(InventoryError::Duplicate(_))));
        assert!(matches!(parse("hosts = []"), Err(InventoryError::Empty)));
        assert!(parse("[[hosts]]\nname=\"LB_1\"\naddress=\"1.1.1.1\"\n").is_err());
    }
}
