//! The cluster admin's tenancy policy: which namespaces may use which fleets, which hosts each
//! may claim, and which may write rules without a host (or a `defaultBackend`). Pure: parsed
//! from the `policy.yaml` key of a ConfigMap the admin writes (`hafleet-watcher
//! --tenancy-policy NAMESPACE/NAME`), then asked about each resolved Ingress.
//!
//! ```yaml
//! namespaces:
//!   team-a:
//!     fleets: [edge]                      # fleet names, or "*" for every fleet
//!     hosts: [shop.example.com, .team-a.example.com]
//!     host-less: false                    # rules without a host, defaultBackend
//!   "*":                                  # every namespace not named above
//!     fleets: [edge]
//!     hosts: [.apps.example.com]
//! ```
//! A host entry is a host (`shop.example.com`), a wildcard host (`*.example.com`: that
//! wildcard rule, not the names under it), a suffix starting with `.` (every host and wildcard
//! under it, not the bare domain) or `*` (any host). A namespace the policy does not name (and
//! no `"*"` entry covers) may use no fleet. Without a policy, any namespace may do all of it,
//! as before.

use hafleet_proto::{FleetName, HttpHost, Namespace, Route};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The ConfigMap key the policy is read from.
pub const KEY: &str = "policy.yaml";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    namespaces: BTreeMap<String, GrantFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct GrantFile {
    #[serde(default)]
    fleets: Vec<String>,
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default)]
    host_less: bool,
}

/// What one namespace (or every namespace not named) may do.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Grant {
    /// `None`: every fleet.
    fleets: Option<Vec<FleetName>>,
    hosts: Vec<HostGrant>,
    host_less: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostGrant {
    Any,
    /// This host (or wildcard host) exactly.
    Exact(String),
    /// Hosts and wildcards ending in this (which starts with `.`).
    Under(String),
}

impl HostGrant {
    fn parse(entry: &str) -> Result<HostGrant, String> {
        if entry == "*" {
            return Ok(HostGrant::Any);
        }
        if let Some(domain) = entry.strip_prefix('.') {
            HttpHost::new(domain)
                .ok()
                .filter(|_| !domain.starts_with('*'))
                .ok_or_else(|| format!("host suffix {entry:?} is not '.' and a host name"))?;
            return Ok(HostGrant::Under(entry.to_owned()));
        }
        HttpHost::new(entry).map_err(|e| e.to_string())?;
        Ok(HostGrant::Exact(entry.to_owned()))
    }

    fn allows(&self, host: &str) -> bool {
        match self {
            HostGrant::Any => true,
            HostGrant::Exact(h) => h == host,
            HostGrant::Under(suffix) => host.ends_with(suffix.as_str()),
        }
    }
}

/// A parsed policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// By namespace; `"*"` for every namespace not named.
    grants: BTreeMap<String, Grant>,
}

impl Policy {
    /// Reads a policy; the error says what is wrong and where.
    pub fn parse(yaml: &str) -> Result<Policy, String> {
        let file: File = serde_saphyr::from_str(yaml).map_err(|e| e.to_string())?;
        let mut grants = BTreeMap::new();
        for (ns, g) in file.namespaces {
            if ns != "*" {
                Namespace::new(ns.as_str()).map_err(|e| format!("namespaces: {e}"))?;
            }
            let at = |e: String| format!("namespaces.{ns}: {e}");
            let fleets = match g.fleets.iter().any(|f| f == "*") {
                true => None,
                false => Some(
                    g.fleets
                        .iter()
                        .map(|f| FleetName::new(f.as_str()).map_err(|e| at(e.to_string())))
                        .collect::<Result<_, _>>()?,
                ),
            };
            let hosts = g
                .hosts
                .iter()
                .map(|h| HostGrant::parse(h).map_err(at))
                .collect::<Result<_, _>>()?;
            grants.insert(ns, Grant { fleets, hosts, host_less: g.host_less });
        }
        Ok(Policy { grants })
    }

    /// Why an Ingress of `namespace` routing `routes` on `fleet` is outside the policy, or
    /// `None` if it is inside.
    pub fn refuses(&self, namespace: &str, fleet: &FleetName, routes: &[Route]) -> Option<String> {
        let Some(grant) = self.grants.get(namespace).or_else(|| self.grants.get("*")) else {
            return Some(format!("the tenancy policy gives namespace {namespace} no fleet"));
        };
        if grant.fleets.as_ref().is_some_and(|f| !f.contains(fleet)) {
            return Some(format!(
                "the tenancy policy does not let namespace {namespace} use fleet {fleet}"
            ));
        }
        let mut denied: Vec<&str> = routes
            .iter()
            .filter_map(|r| r.host.as_ref().map(|h| h.as_str()))
            .filter(|h| !grant.hosts.iter().any(|g| g.allows(h)))
            .collect();
        denied.sort_unstable();
        denied.dedup();
        if !denied.is_empty() {
            return Some(format!(
                "the tenancy policy does not let namespace {namespace} claim host {}",
                denied.join(", ")
            ));
        }
        if !grant.host_less && routes.iter().any(|r| r.host.is_none()) {
            return Some(format!(
                "the tenancy policy does not let namespace {namespace} write rules without a \
                 host or a defaultBackend"
            ));
        }
        None
    }
}

/// Why an Ingress refused as it stands may not keep its last good routes under `policy`:
/// those this watcher published (its hosts checked too), else what its fleet annotation says
/// (its namespace and fleet checked). `None`: it may.
pub fn refuses_kept(
    policy: &Policy,
    key: &hafleet_proto::IngressKey,
    meta: &kube::api::ObjectMeta,
    published: &crate::core::index::Published,
) -> Option<String> {
    let ns = key.namespace.as_str();
    match published.get(key) {
        Some(fleets) => fleets.iter().find_map(|(fleet, routes)| {
            let routes = routes.as_ref().map(|(r, _)| r.as_slice()).unwrap_or_default();
            policy.refuses(ns, fleet, routes)
        }),
        None => {
            let annotations = meta.annotations.as_ref()?;
            let fleet = FleetName::new(annotations.get("hafleet.io/fleet")?.trim()).ok()?;
            policy.refuses(ns, &fleet, &[])
        }
    }
}

/// `--tenancy-policy`: NAMESPACE/NAME of the ConfigMap.
pub fn parse_ref(s: &str) -> Result<(String, String), String> {
    let (ns, name) = s.split_once('/').ok_or("expected NAMESPACE/NAME of a ConfigMap")?;
    Namespace::new(ns).map_err(|e| e.to_string())?;
    hafleet_proto::ObjectName::new(name).map_err(|e| e.to_string())?;
    Ok((ns.to_owned(), name.to_owned()))
}

/// The policy in force, kept across passes: parsed again only when its ConfigMap changed, and
/// the last good one kept while the ConfigMap is broken.
#[derive(Debug, Default)]
pub struct InForce {
    /// (resourceVersion, what it said) of the ConfigMap last read.
    read: Option<(String, Result<Policy, String>)>,
    good: Option<Policy>,
}

/// What [`InForce::refresh`] found new to say, once per change of the ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum News {
    Nothing,
    Read,
    Broken(String),
}

impl InForce {
    /// Takes the ConfigMap as it is now (`None`: it does not exist). Returns what to say about
    /// it; [`InForce::policy`] then gives the policy to decide with.
    pub fn refresh(&mut self, cm: Option<&k8s_openapi::api::core::v1::ConfigMap>) -> News {
        let rv = cm.and_then(|c| c.metadata.resource_version.clone()).unwrap_or_default();
        if self.read.as_ref().is_some_and(|(seen, _)| *seen == rv) {
            return News::Nothing;
        }
        let parsed = match cm.and_then(|c| c.data.as_ref()).and_then(|d| d.get(KEY)) {
            Some(yaml) => Policy::parse(yaml),
            None if cm.is_none() => Err("the ConfigMap does not exist".to_owned()),
            None => Err(format!("the ConfigMap has no {KEY} key")),
        };
        let news = match &parsed {
            Ok(p) => {
                self.good = Some(p.clone());
                News::Read
            }
            Err(e) => News::Broken(e.clone()),
        };
        self.read = Some((rv, parsed));
        news
    }

    /// Takes the ConfigMap at `at` (NAMESPACE/NAME) as it is now, logs what changed, and
    /// gives the policy to decide with; an error while none was ever good (nothing may be
    /// published then).
    pub fn in_force(
        &mut self,
        (ns, name): &(String, String),
        cm: Option<&k8s_openapi::api::core::v1::ConfigMap>,
    ) -> Result<&Policy, String> {
        match self.refresh(cm) {
            News::Nothing => {}
            News::Read => {
                tracing::info!(configmap = %format!("{ns}/{name}"), "tenancy policy read")
            }
            News::Broken(why) => tracing::warn!(
                configmap = %format!("{ns}/{name}"), %why,
                "tenancy policy not usable; the last good one stays in force"
            ),
        }
        self.policy().ok_or_else(|| {
            format!("no usable tenancy policy in ConfigMap {ns}/{name} yet: publishing nothing")
        })
    }

    /// The policy to decide with: the last one read that was good. `None` until one was:
    /// then nothing may be published (a watcher told to keep a policy never routes without
    /// one).
    pub fn policy(&self) -> Option<&Policy> {
        self.good.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::resolve::tests_support::route;

    fn routes(hosts: &[Option<&str>]) -> Vec<Route> {
        hosts
            .iter()
            .map(|h| {
                let mut r = route();
                r.host = h.map(|h| HttpHost::new(h).unwrap());
                r
            })
            .collect()
    }

    const POLICY: &str = "
namespaces:
  team-a:
    fleets: [edge]
    hosts: [shop.example.com, .team-a.example.com, '*.wild.example.com']
  ops:
    fleets: ['*']
    hosts: ['*']
    host-less: true
  '*':
    fleets: [edge]
    hosts: [.apps.example.com]
";

    #[test]
    fn namespaces_get_the_fleets_hosts_and_host_less_rules_they_are_given() {
        let p = Policy::parse(POLICY).unwrap();
        let (edge, core) = (FleetName::new("edge").unwrap(), FleetName::new("core").unwrap());
        let ok = |ns: &str, fleet: &FleetName, hosts: &[Option<&str>]| {
            p.refuses(ns, fleet, &routes(hosts))
        };
        for hosts in [
            &[Some("shop.example.com")][..],
            &[Some("x.team-a.example.com"), Some("a.b.team-a.example.com")],
            &[Some("*.team-a.example.com"), Some("*.wild.example.com")],
        ] {
            assert_eq!(ok("team-a", &edge, hosts), None, "{hosts:?}");
        }
        let says = |r: Option<String>, what: &str| {
            let r = r.expect("refused");
            assert!(r.contains(what), "{r}");
        };
        says(ok("team-a", &core, &[Some("shop.example.com")]), "use fleet core");
        says(ok("team-a", &edge, &[Some("team-a.example.com")]), "claim host team-a.example.com");
        says(ok("team-a", &edge, &[Some("x.wild.example.com")]), "claim host x.wild");
        says(ok("team-a", &edge, &[Some("evilteam-a.example.com")]), "claim host");
        says(ok("team-a", &edge, &[None]), "without a host or a defaultBackend");
        assert_eq!(ok("ops", &core, &[None, Some("anything.test")]), None);
        assert_eq!(ok("team-z", &edge, &[Some("z.apps.example.com")]), None, "the '*' entry");
        says(ok("team-z", &edge, &[Some("shop.example.com")]), "namespace team-z claim host");
        let no_default = Policy::parse("namespaces: {ops: {fleets: ['*'], hosts: ['*']}}").unwrap();
        says(
            no_default.refuses("team-z", &edge, &routes(&[Some("a.b")])),
            "gives namespace team-z no fleet",
        );
    }

    #[test]
    fn a_broken_policy_keeps_the_last_good_one_and_each_change_is_said_once() {
        let cm = |rv: &str, yaml: Option<&str>| k8s_openapi::api::core::v1::ConfigMap {
            metadata: kube::api::ObjectMeta {
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            data: yaml.map(|y| [(KEY.to_owned(), y.to_owned())].into()),
            ..Default::default()
        };
        let mut p = InForce::default();
        assert!(matches!(p.refresh(None), News::Broken(e) if e.contains("does not exist")));
        assert!(p.policy().is_none(), "nothing is published without a policy");
        assert_eq!(p.refresh(Some(&cm("1", Some(POLICY)))), News::Read);
        assert_eq!(p.refresh(Some(&cm("1", Some(POLICY)))), News::Nothing);
        let good = p.policy().cloned().unwrap();
        assert!(matches!(p.refresh(Some(&cm("2", Some("namespaces: 3")))), News::Broken(_)));
        assert_eq!(p.policy(), Some(&good), "the last good one stays");
        assert!(
            matches!(p.refresh(Some(&cm("3", None))), News::Broken(e) if e.contains("no policy.yaml"))
        );
        assert_eq!(p.refresh(Some(&cm("3", None))), News::Nothing);
    }

    #[test]
    fn a_policy_with_a_mistake_is_refused_whole_with_where_it_is() {
        for (yaml, says) in [
            ("namespaces: {Team: {}}", "namespace"),
            ("namespaces: {a: {fleets: [Edge]}}", "namespaces.a: fleet name"),
            ("namespaces: {a: {hosts: ['a b']}}", "namespaces.a: host"),
            ("namespaces: {a: {hosts: ['.*.x.com']}}", "host suffix"),
            ("namespaces: {a: {hostless: true}}", "hostless"),
            ("fleets: [edge]", "fleets"),
        ] {
            let e = Policy::parse(yaml).unwrap_err();
            assert!(e.contains(says), "{yaml}: {e}");
        }
    }
}
