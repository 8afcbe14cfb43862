//! From a fleet's rules to the map files HAProxy looks routes up in. Pure.
//!
//! Three maps, each looked up as a tree, so a request costs the same with 10 or 100,000 routes:
//!
//! ```text
//! exact.map  (map_str)  key <host><path>    e.g. shop.example.com/api   Exact rules
//! prefix.map (map_beg)  key <host><path>/   e.g. shop.example.com/api/  Prefix rules
//! hosts.map  (map_str)  key <host>          e.g. shop.example.com       hosts that have rules
//! ```
//! The frontend looks up `<host><path>` in the exact map, then `<host><path>/` in the prefix map
//! (the longest key that begins the lookup key wins), then, only for a host that has no rules
//! of its own (not in the hosts map), the same for its wildcard (`*.example.com`), and only
//! when that has no rules either, the same two without a host for rules that match any host.
//! So a host's owner answers every request for it: a path it does not route is a 404, never
//! another namespace's wildcard or host-less rule. Appending `/` to both the prefix keys and the lookup key makes
//! prefixes match whole segments: `/foo` matches `/foo` and `/foo/x`, never `/foobar`. A key
//! never contains a space (hosts and paths pass proto's allowlists), and host keys never start
//! with `/`, so the host-less keys (which do) cannot be mistaken for them.

use crate::core::model::RuleModel;
use hafleet_proto::{MapFile, MapName};
use serde::Serialize;

/// The map files of a fleet and the paths the template names them by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Maps {
    pub files: Vec<MapFile>,
    pub paths: MapPaths,
}

/// What the template sees: each map's path relative to the config's folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MapPaths {
    pub exact: String,
    pub prefix: String,
    /// Hosts (exact and wildcard) that have rules: a request for one is answered by its rules
    /// only (`map_str`, value `1`).
    pub hosts: String,
    /// The crt-list of the HTTPS bind; `None`: no host has a certificate (no HTTPS).
    pub crt_list: Option<String>,
    /// Hosts whose plain-HTTP requests are redirected to HTTPS (`map_str`); `None`: none.
    pub redirect: Option<String>,
    /// The fleet's default certificate's file (not a map: it goes on the HTTPS bind's `crt`);
    /// `None`: names no certificate is listed for are refused (`strict-sni`).
    pub default_cert: Option<String>,
    /// The route maps ([`Maps::add_routes`]), when the fleet has an access log.
    pub exact_route: Option<String>,
    pub prefix_route: Option<String>,
    /// Wildcards that match any number of labels (an HTTPRoute's), by what follows `*.`
    /// (`map_str`: `example.com *.example.com`); `None`: none ([`Maps::add_deep_wildcards`]).
    pub deep: Option<String>,
    /// The label counts of those suffixes, the longest first: for each, the frontend looks
    /// the request's host's last labels up in `deep`.
    pub deep_depths: Vec<usize>,
    /// Backends whose routes set their own client timeout, with it in milliseconds
    /// (`map_str_int`); `None`: none ([`Maps::add_client_timeouts`]).
    pub client_timeouts: Option<String>,
    /// Passthrough routes by their SNI (`map_str`: `host backend`, a wildcard as
    /// `*.example.com`); `None`: none, and HTTPS is terminated on its bind directly.
    pub sni: Option<String>,
    /// The passthrough routes' wildcards by what follows `*.` (`map_str`: `example.com
    /// backend`), which match any number of labels, as the Gateway API says; `None`: none.
    pub sni_deep: Option<String>,
    /// The label counts of those suffixes, the longest first: for each, `hafleet_tls` looks
    /// the name's last labels up in `sni_deep`.
    pub sni_depths: Vec<usize>,
}

impl Maps {
    /// With these files too (the dispatch shapes' maps, [`crate::core::groups`]).
    pub fn add_files(&mut self, files: &[MapFile]) {
        self.files.extend(files.iter().cloned());
        self.files.sort_by(|a, b| a.name.cmp(&b.name));
    }

    /// With the TLS files of `tls` ([`crate::core::certs::files`]).
    pub fn add_tls(&mut self, tls: &crate::core::certs::TlsFiles) {
        for (file, path) in
            [(&tls.crt_list, &mut self.paths.crt_list), (&tls.redirect, &mut self.paths.redirect)]
        {
            if let Some(file) = file {
                *path = Some(file.name.relative_path());
                self.files.push(file.clone());
            }
        }
        self.paths.default_cert.clone_from(&tls.default_cert);
        self.files.sort_by(|a, b| a.name.cmp(&b.name));
    }
}

/// Builds both maps from rules whose `key` is set. Rules hold one claim per (host, path, kind),
/// so keys are unique; they are sorted so the same rules make the same bytes.
pub fn build<R: std::borrow::Borrow<RuleModel>>(rules: &[R]) -> Maps {
    build_holding(rules, &[])
}

/// [`build`], with `held` (hosts of quarantined Ingresses) in the hosts map too: without
/// rules, a request for one is a 404, not another host's or the host-less rules'.
pub fn build_holding<R: std::borrow::Borrow<RuleModel>>(rules: &[R], held: &[String]) -> Maps {
    let mut exact = Vec::new();
    let mut prefix = Vec::new();
    let mut hosts = Vec::new();
    let mut sni = Vec::new();
    for rule in rules {
        let rule = rule.borrow();
        let map = match rule.kind {
            // Chosen by a TLS connection's SNI, before any request: not an HTTP host's rule.
            "sni" => {
                sni.push((rule.key.as_str(), rule.backend.as_str()));
                continue;
            }
            // A TCP port's: its own frontend, no map.
            "tcp" => continue,
            "exact" => &mut exact,
            _ => &mut prefix,
        };
        map.push((rule.key.as_str(), rule.backend.as_str()));
        if let Some(host) = rule.host.as_deref() {
            hosts.push((host, "1"));
        }
    }
    hosts.extend(held.iter().map(|h| (h.as_str(), "1")));
    hosts.sort_unstable();
    hosts.dedup();
    let exact = file("exact", text(exact));
    let prefix = file("prefix", text(prefix));
    let hosts = file("hosts", text(hosts));
    let mut paths = MapPaths {
        exact: exact.name.relative_path(),
        prefix: prefix.name.relative_path(),
        hosts: hosts.name.relative_path(),
        crt_list: None,
        redirect: None,
        default_cert: None,
        exact_route: None,
        prefix_route: None,
        deep: None,
        deep_depths: Vec::new(),
        client_timeouts: None,
        sni: None,
        sni_deep: None,
        sni_depths: Vec::new(),
    };
    let mut files = vec![exact, prefix, hosts];
    let deep: Vec<(&str, &str)> =
        sni.iter().filter_map(|(k, v)| Some((k.strip_prefix("*.")?, *v))).collect();
    if !deep.is_empty() {
        paths.sni_depths = depths(&deep);
        let deep = file("snideep", text(deep));
        paths.sni_deep = Some(deep.name.relative_path());
        files.push(deep);
    }
    if !sni.is_empty() {
        let sni = file("sni", text(sni));
        paths.sni = Some(sni.name.relative_path());
        files.push(sni);
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Maps { files, paths }
}

/// The label counts of wildcards' suffixes (the keys of `entries`), the longest first, each
/// once: the lookups a name takes, one per count.
fn depths(entries: &[(&str, &str)]) -> Vec<usize> {
    let mut depths: Vec<usize> =
        entries.iter().map(|(suffix, _)| suffix.split('.').count()).collect();
    depths.sort_unstable_by(|a, b| b.cmp(a));
    depths.dedup();
    depths
}

/// A map's text: `key value` lines, sorted, so the same entries make the same bytes.
fn text(mut map: Vec<(&str, &str)>) -> String {
    map.sort_unstable();
    let mut out = String::with_capacity(map.iter().map(|(k, v)| k.len() + v.len() + 2).sum());
    for (k, v) in map {
        out.push_str(k);
        out.push(' ');
        out.push_str(v);
        out.push('\n');
    }
    out
}

/// A map file of `kind`, named by its content.
fn file(kind: &str, content: String) -> MapFile {
    MapFile {
        name: MapName::for_content(kind, &content).expect("kinds are lowercase letters"),
        content,
    }
}

impl Maps {
    /// With the map of the wildcard hosts among `wildcards` (`*.example.com`) that match any
    /// number of labels: a host under none of the fleet's hosts or one-label wildcards is
    /// looked up by its last labels, as many as each such suffix has, the longest first, so
    /// `a.b.example.com` finds `*.example.com` (and `*.b.example.com` first, had it one).
    pub fn add_deep_wildcards(&mut self, wildcards: &[String]) {
        let mut entries: Vec<(&str, &str)> =
            wildcards.iter().filter_map(|w| Some((w.strip_prefix("*.")?, w.as_str()))).collect();
        if entries.is_empty() {
            return;
        }
        let depths = depths(&entries);
        entries.sort_unstable();
        let deep = file("deep", text(entries));
        self.paths.deep = Some(deep.name.relative_path());
        self.paths.deep_depths = depths;
        self.files.push(deep);
        self.files.sort_by(|a, b| a.name.cmp(&b.name));
    }

    /// With the map of the client timeouts that backends' routes set (`hafleet.io/timeout-client`),
    /// by backend name, in milliseconds: the frontend looks the chosen backend up in it, so a
    /// request costs one lookup however many routes set one. None set: no map.
    pub fn add_client_timeouts<B: std::borrow::Borrow<crate::core::model::BackendModel>>(
        &mut self,
        backends: &[B],
    ) {
        let values: Vec<(&str, String)> = backends
            .iter()
            .filter_map(|b| {
                let b = b.borrow();
                Some((b.name.as_str(), b.timeout_client_ms?.to_string()))
            })
            .collect();
        if values.is_empty() {
            return;
        }
        let map =
            file("clienttimeouts", text(values.iter().map(|(k, v)| (*k, v.as_str())).collect()));
        self.paths.client_timeouts = Some(map.name.relative_path());
        self.files.push(map);
        self.files.sort_by(|a, b| a.name.cmp(&b.name));
    }

    /// With the route maps: the same keys as the exact and prefix maps, each naming the
    /// Ingress whose rule it is, for the access log (only when the fleet logs: they double
    /// the lookups of a request).
    pub fn add_routes<R: std::borrow::Borrow<RuleModel>>(&mut self, rules: &[R]) {
        let mut exact = Vec::new();
        let mut prefix = Vec::new();
        for rule in rules.iter().map(|r| r.borrow()).filter(|r| !["sni", "tcp"].contains(&r.kind)) {
            let map = if rule.kind == "exact" { &mut exact } else { &mut prefix };
            map.push((rule.key.as_str(), rule.ingress.as_str()));
        }
        let (exact, prefix) = (file("exactroute", text(exact)), file("prefixroute", text(prefix)));
        self.paths.exact_route = Some(exact.name.relative_path());
        self.paths.prefix_route = Some(prefix.name.relative_path());
        self.files.extend([exact, prefix]);
        self.files.sort_by(|a, b| a.name.cmp(&b.name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(host: Option<&str>, path: &str, kind: &'static str, backend: &str) -> RuleModel {
        let mut rule = RuleModel {
            key: String::new(),
            host: host.map(str::to_owned),
            path: path.into(),
            kind,
            backend: backend.into(),
            ingress: "default/x".into(),
        };
        rule.key = rule.map_key();
        rule
    }

    /// What the built-in template does with the maps: exact on `<host><path>`, longest
    /// `map_beg` on `<host><path>/`, then, for a host not in the hosts map, both for its
    /// wildcard, then, for a wildcard not in it either, both without the host.
    fn lookup(maps: &Maps, host: &str, path: &str) -> Option<String> {
        let parse = |kind: &str| -> Vec<(String, String)> {
            let file = maps.files.iter().find(|f| f.name.as_str().starts_with(kind)).unwrap();
            file.content
                .lines()
                .map(|l| {
                    let (k, v) = l.split_once(' ').unwrap();
                    (k.to_owned(), v.to_owned())
                })
                .collect()
        };
        let (exact, prefix, owned) = (parse("exact-"), parse("prefix-"), parse("hosts-"));
        let wildcard = format!("*{}", &host[host.find('.').unwrap_or(host.len())..]);
        for h in [host, &wildcard, ""] {
            let k = format!("{h}{path}");
            if let Some((_, v)) = exact.iter().find(|(key, _)| *key == k) {
                return Some(v.clone());
            }
            let k = format!("{h}{path}/");
            if let Some((_, v)) = prefix
                .iter()
                .filter(|(key, _)| k.starts_with(key.as_str()))
                .max_by_key(|(key, _)| key.len())
            {
                return Some(v.clone());
            }
            if owned.iter().any(|(key, _)| *key == h) {
                return None;
            }
        }
        None
    }

    /// The deep wildcards' map: each suffix names its wildcard; the depths to try, the longest
    /// first; nothing when no wildcard matches deep.
    #[test]
    fn deep_wildcards_are_keyed_by_their_suffix() {
        let mut maps = build(&[rule(Some("*.w.com"), "/", "prefix", "wild")]);
        maps.add_deep_wildcards(&[]);
        assert_eq!((maps.paths.deep.as_ref(), maps.files.len()), (None, 3));
        maps.add_deep_wildcards(&["*.w.com".into(), "*.a.b.org".into(), "*.x.com".into()]);
        let deep = maps.files.iter().find(|f| f.name.as_str().starts_with("deep-")).unwrap();
        assert_eq!(deep.content, "a.b.org *.a.b.org\nw.com *.w.com\nx.com *.x.com\n");
        assert_eq!(maps.paths.deep_depths, [3, 2]);
        assert_eq!(maps.paths.deep.as_deref(), Some(deep.name.relative_path().as_str()));
    }

    #[test]
    fn lookups_keep_kubernetes_matching() {
        let maps = build(&[
            rule(Some("a.com"), "/", "prefix", "root"),
            rule(Some("a.com"), "/api", "prefix", "api"),
            rule(Some("a.com"), "/api", "exact", "api-exact"),
            rule(Some("a.com"), "/api/v1", "prefix", "v1"),
            rule(Some("b.com"), "/only", "prefix", "only"),
            rule(None, "/", "prefix", "any"),
            rule(None, "/static", "exact", "static"),
            rule(Some("*.w.com"), "/w", "prefix", "wild"),
            rule(Some("own.w.com"), "/own", "prefix", "own"),
        ]);
        let cases = [
            ("a.com", "/api", Some("api-exact")),
            ("a.com", "/api/", Some("api")),
            ("a.com", "/api/x", Some("api")),
            ("a.com", "/api/v1", Some("v1")),
            ("a.com", "/api/v1/users", Some("v1")),
            ("a.com", "/apix", Some("root")),
            ("a.com", "/", Some("root")),
            ("b.com", "/only/x", Some("only")),
            ("b.com", "/onlyx", None), // b.com has rules: only they answer it
            ("b.com", "/static", None),
            ("c.com", "/x", Some("any")),
            ("c.com", "/static", Some("static")),
            ("a.com.evil", "/api", Some("any")),
            ("x.w.com", "/w", Some("wild")),
            ("x.w.com", "/x", None), // the wildcard has rules: host-less ones never answer
            ("own.w.com", "/w", None), // an exact host with rules: not its wildcard's
            ("own.w.com", "/own", Some("own")),
            ("x.y.w.com", "/x", Some("any")), // one label deep: not the wildcard's
        ];
        for (host, path, want) in cases {
            assert_eq!(lookup(&maps, host, path).as_deref(), want, "{host}{path}");
        }
        let no_default = build(&[rule(Some("a.com"), "/app", "prefix", "app")]);
        assert_eq!(lookup(&no_default, "a.com", "/application"), None, "404, not a prefix");
        assert_eq!(lookup(&no_default, "b.com", "/app"), None);
        let hosts = maps.files.iter().find(|f| f.name.as_str().starts_with("hosts-")).unwrap();
        assert_eq!(hosts.content, "*.w.com 1\na.com 1\nb.com 1\nown.w.com 1\n");
    }

    #[test]
    fn the_same_rules_make_the_same_files_whatever_their_order() {
        let a = rule(Some("a.com"), "/x", "prefix", "x");
        let b = rule(Some("b.com"), "/y", "exact", "y");
        assert_eq!(build(&[a.clone(), b.clone()]), build(&[b, a]));
        assert_ne!(build::<RuleModel>(&[]).paths, build(&[rule(None, "/", "prefix", "z")]).paths);
    }

    #[test]
    fn the_route_maps_have_the_routing_maps_keys_each_naming_its_ingress() {
        let mut shop = rule(Some("shop.example.com"), "/api", "prefix", "be_api");
        shop.ingress = "team-a/shop".into();
        let rules = [shop, rule(None, "/healthz", "exact", "be_web")];
        let mut maps = build(&rules);
        assert_eq!(maps.paths.exact_route, None, "none unless asked for");
        maps.add_routes(&rules);
        let content = |kind: &str| {
            let file = maps.files.iter().find(|f| f.name.kind() == kind).unwrap();
            file.content.clone()
        };
        assert_eq!(content("prefixroute"), "shop.example.com/api/ team-a/shop\n");
        assert_eq!(content("exactroute"), "/healthz default/x\n");
        let keys = |text: String| -> Vec<String> {
            text.lines().map(|l| l.split(' ').next().unwrap().to_owned()).collect()
        };
        assert_eq!(keys(content("prefix")), keys(content("prefixroute")));
        assert_eq!(keys(content("exact")), keys(content("exactroute")));
        assert!(maps.paths.prefix_route.as_deref().is_some_and(|p| p.contains("prefixroute-")));
    }

    #[test]
    fn passthrough_rules_go_to_the_sni_map_only() {
        let rules = [
            rule(Some("pass.example.com"), "", "sni", "be_pass"),
            rule(Some("*.wild.example.com"), "", "sni", "be_pass"),
            rule(Some("web.example.com"), "/", "prefix", "be_web"),
        ];
        let mut maps = build(&rules);
        maps.add_routes(&rules);
        let content = |kind: &str| {
            maps.files.iter().find(|f| f.name.kind() == kind).map(|f| f.content.clone())
        };
        assert_eq!(
            content("sni").as_deref(),
            Some("*.wild.example.com be_pass\npass.example.com be_pass\n")
        );
        assert!(maps.paths.sni.as_deref().is_some_and(|p| p.contains("sni-")));
        // The wildcards again, by their suffix, for names more than one label under them.
        assert_eq!(content("snideep").as_deref(), Some("wild.example.com be_pass\n"));
        assert_eq!(maps.paths.sni_depths, [3]);
        for kind in ["exact", "prefix", "hosts", "exactroute", "prefixroute"] {
            let text = content(kind).unwrap_or_default();
            assert!(!text.contains("pass"), "{kind}: {text}");
        }
        assert_eq!(lookup(&maps, "web.example.com", "/"), Some("be_web".into()));
        let plain = build(&rules[2..]);
        assert_eq!((plain.paths.sni, plain.paths.sni_deep), (None, None), "no passthrough route");
        assert_eq!(build(&rules[..1]).paths.sni_deep, None, "no passthrough wildcard");
    }
}
