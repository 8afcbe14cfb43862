//! Routes that ask more of a request than its host and path (an HTTPRoute's header, query and
//! method matches), or that share requests among backends by weight: dispatch groups. Pure.
//!
//! The maps still decide by host and path alone. Where a host and path have such routes, the
//! maps name a group (`hafleet_g_<hash>`) instead of a backend, and a few more lookups decide
//! among the group's candidates, so a request costs the same whatever the number of routes:
//! - every candidate has a *shape*: whether it asks for a method, which headers and query
//!   parameters it asks for (by name), and whether it takes only requests over TLS (an
//!   HTTPRoute of HTTPS listeners only). The fleet has few shapes, however many routes;
//! - per shape, one map file: the key is the group and the values the candidate asks for
//!   (hex, so no value can break a map line), the value its rank in the group and its
//!   target (`000003~be_shop_web_80`);
//! - a request of a group reads the headers, parameters and method the fleet's shapes name
//!   (once each), looks its key up in each shape's map, and keeps the best rank found.
//!   Requests the maps gave to a backend skip all of it (each line is guarded).
//!
//! A candidate that shares requests by weight targets a split (`hafleet_s_<hash>`), whose
//! `use_backend` lines draw among its backends: those lines are checked only by requests of a
//! split, but all of them (their cost grows with the fleet's weighted routes).
//!
//! Order, the Gateway API's: a more specific path first (an exact path, then longer
//! prefixes); for one path, a method match, then more header matches, then more query
//! matches, then the older route (creation time, then namespace/name), then its rule order;
//! the plain route of that path last. A request that meets none of a path's routes falls to
//! the routes of the shorter prefixes of the same host, and then to a 404: never to another
//! host's rules.

use crate::core::model::RuleModel;
use crate::core::model::fnv1a;
use hafleet_proto::RouteMore;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The names of groups start with this; no backend's does.
pub const GROUP_PREFIX: &str = "hafleet_g_";
/// The names of splits start with this; no backend's does.
pub const SPLIT_PREFIX: &str = "hafleet_s_";

/// A weighted share is drawn from `0..DRAW_SCALE`, once per request of a split.
pub const DRAW_SCALE: u64 = 1_000_000;

/// What the template sees of the fleet's groups.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DispatchModel {
    /// The header names the shapes ask for: header `i` is read into `txn.hafleet_h<i>`.
    pub headers: Vec<String>,
    /// The query parameter names: parameter `i` into `txn.hafleet_q<i>`.
    pub params: Vec<String>,
    /// Whether a shape asks for the method (read into `txn.hafleet_m`).
    pub method: bool,
    /// Whether a shape asks for TLS (`txn.hafleet_t` is hex `1` over TLS, unset otherwise).
    pub tls: bool,
    pub shapes: Vec<ShapeModel>,
    pub splits: Vec<SplitModel>,
    /// The shapes' map files.
    #[serde(skip)]
    pub files: Vec<hafleet_proto::MapFile>,
}

/// One shape: the converters that append a request's values to its group (`key`, after
/// `var(txn.backend)`), and its map file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShapeModel {
    pub key: String,
    pub map: String,
}

/// A candidate that shares requests by weight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SplitModel {
    pub name: String,
    /// The backends sharing its requests; one without `below` takes what is left.
    pub shares: Vec<ShareModel>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShareModel {
    pub backend: String,
    /// Taken when the request's draw (`0..DRAW_SCALE`) is below this.
    pub below: Option<u64>,
}

/// A route that asks more of a request, as the claims found it.
pub struct Conditional {
    /// [`RouteMore::precedence`].
    pub precedence: (bool, usize, usize, bool),
    /// What it asks: the method, and headers (names lower case) and query parameters, each
    /// sorted by name.
    pub asks: Asks,
    /// (weight, backend name), its own backend first.
    pub shares: Vec<(u32, String)>,
    pub rule: Arc<RuleModel>,
}

/// What a candidate asks of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asks {
    pub method: Option<&'static str>,
    pub headers: Vec<(String, String)>,
    pub query: Vec<(String, String)>,
    /// Only over TLS.
    pub tls: bool,
}

impl Asks {
    pub fn of(more: &RouteMore) -> Asks {
        let mut headers: Vec<(String, String)> = more
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().to_ascii_lowercase(), v.as_str().to_owned()))
            .collect();
        headers.sort();
        let mut query: Vec<(String, String)> = more
            .query
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_str().to_owned()))
            .collect();
        query.sort();
        Asks { method: more.method.map(|m| m.as_str()), headers, query, tls: more.tls }
    }

    /// The names it asks for: its shape.
    fn shape(&self) -> Shape {
        let names = |l: &[(String, String)]| l.iter().map(|(n, _)| n.clone()).collect();
        (self.method.is_some(), names(&self.headers), names(&self.query), self.tls)
    }

    /// Its values, as the shape's key appends them: `.` and each value in hex.
    fn key(&self) -> String {
        let mut key = String::new();
        let values = self
            .method
            .into_iter()
            .chain(self.headers.iter().chain(&self.query).map(|(_, v)| v.as_str()))
            .chain(self.tls.then_some("1"));
        for v in values {
            key.push('.');
            key.push_str(&hex::encode_upper(v.as_bytes()));
        }
        key
    }
}

/// What a candidate asks for, by name: the method or not, header names, query parameter names,
/// TLS or not.
type Shape = (bool, Vec<String>, Vec<String>, bool);

/// A candidate of a group: what it asks (`None`: nothing) and its shares.
struct Candidate {
    asks: Asks,
    shares: Vec<(u32, String)>,
}

/// Dispatch for the keys with conditional routes (`conditional`, by (kind, key), each list in
/// claim order) or a plain route that shares by weight (`weighted`: the shares of the plain
/// rule at that key). `rules` holds the plain rules (`claimed`: their index by (kind, key));
/// each key that becomes a group has its rule there name the group instead (added when the
/// key had no plain rule). `None`: no group.
pub fn build(
    rules: &mut Vec<Arc<RuleModel>>,
    claimed: &HashMap<(&str, &str), usize, foldhash::fast::RandomState>,
    weighted: &HashMap<(&str, &str), Vec<(u32, String)>, foldhash::fast::RandomState>,
    mut conditional: BTreeMap<(&'static str, String), Vec<Conditional>>,
) -> Option<DispatchModel> {
    for list in conditional.values_mut() {
        // Stable: the claim order (older route, then rule order) breaks ties.
        list.sort_by_key(|c| std::cmp::Reverse(c.precedence));
    }
    let plain = |kind: &str, key: &str, rules: &[Arc<RuleModel>]| -> Option<Vec<(u32, String)>> {
        let i = *claimed.get(&(kind, key))?;
        Some(
            weighted
                .get(&(kind, key))
                .cloned()
                .unwrap_or_else(|| vec![(1, rules[i].backend.clone())]),
        )
    };
    let mut keys: Vec<(&'static str, String)> = conditional.keys().cloned().collect();
    keys.extend(weighted.keys().map(|(kind, key)| (kind_of(kind), (*key).to_owned())));
    keys.sort();
    keys.dedup();
    if keys.is_empty() {
        return None;
    }
    let mut groups: Vec<(String, Vec<Candidate>)> = Vec::with_capacity(keys.len());
    let mut renamed: Vec<(Option<usize>, Arc<RuleModel>)> = Vec::new();
    for (kind, key) in keys {
        let mut candidates: Vec<Candidate> = Vec::new();
        let own = conditional.get(&(kind, key.clone()));
        let example = match (claimed.get(&(kind, key.as_str())), own.and_then(|l| l.first())) {
            (Some(&i), _) => Arc::clone(&rules[i]),
            (None, Some(c)) => Arc::clone(&c.rule),
            (None, None) => continue,
        };
        let mut take = |list: Option<&Vec<Conditional>>| {
            for c in list.into_iter().flatten() {
                candidates.push(Candidate { asks: c.asks.clone(), shares: c.shares.clone() });
            }
        };
        take(own);
        match plain(kind, &key, rules) {
            Some(shares) => candidates.push(Candidate { asks: Asks::default(), shares }),
            // Nothing plain at this path: the shorter prefixes of the same host.
            None => {
                for covering in covering_keys(kind, &example) {
                    take(conditional.get(&("prefix", covering.clone())));
                    if let Some(shares) = plain("prefix", &covering, rules) {
                        candidates.push(Candidate { asks: Asks::default(), shares });
                        break;
                    }
                }
            }
        }
        let name = format!("{GROUP_PREFIX}{:016x}", fnv1a(format!("{kind} {key}").as_bytes()));
        let rule = RuleModel { backend: name.clone(), ..(*example).clone() };
        renamed.push((claimed.get(&(kind, key.as_str())).copied(), Arc::new(rule)));
        groups.push((name, candidates));
    }
    for (at, rule) in renamed {
        match at {
            Some(i) => rules[i] = rule,
            None => rules.push(rule),
        }
    }
    Some(dispatch(groups))
}

/// The shapes, their maps and the splits of `groups` (name, candidates in order).
fn dispatch(groups: Vec<(String, Vec<Candidate>)>) -> DispatchModel {
    let mut model = DispatchModel::default();
    // Every name asked for, in name order: the index of each is its variable.
    let mut headers = std::collections::BTreeSet::new();
    let mut params = std::collections::BTreeSet::new();
    let mut shapes: BTreeMap<Shape, Vec<(String, String)>> = BTreeMap::new();
    for (group, candidates) in &groups {
        for (rank, c) in candidates.iter().enumerate() {
            headers.extend(c.asks.headers.iter().map(|(n, _)| n.clone()));
            params.extend(c.asks.query.iter().map(|(n, _)| n.clone()));
            model.method |= c.asks.method.is_some();
            model.tls |= c.asks.tls;
            let target = match c.shares.as_slice() {
                [(_, backend)] => backend.clone(),
                shares => {
                    // Named by its shares: the same split in several groups is one.
                    let said: Vec<String> =
                        shares.iter().map(|(w, b)| format!("{w}:{b}")).collect();
                    let name = format!("{SPLIT_PREFIX}{:016x}", fnv1a(said.join(" ").as_bytes()));
                    if !model.splits.iter().any(|s| s.name == name) {
                        model.splits.push(SplitModel { name: name.clone(), shares: split(shares) });
                    }
                    name
                }
            };
            let entries = shapes.entry(c.asks.shape()).or_default();
            entries.push((format!("{group}{}", c.asks.key()), format!("{rank:06}~{target}")));
        }
    }
    model.headers = headers.into_iter().collect();
    model.params = params.into_iter().collect();
    for (i, ((method, hs, qs, tls), mut entries)) in shapes.into_iter().enumerate() {
        let mut key = String::new();
        if method {
            key.push_str(",concat(.,txn.hafleet_m,)");
        }
        for h in &hs {
            let at = model.headers.iter().position(|x| x == h).unwrap_or_default();
            key.push_str(&format!(",concat(.,txn.hafleet_h{at},)"));
        }
        for q in &qs {
            let at = model.params.iter().position(|x| x == q).unwrap_or_default();
            key.push_str(&format!(",concat(.,txn.hafleet_q{at},)"));
        }
        if tls {
            key.push_str(",concat(.,txn.hafleet_t,)");
        }
        // One candidate a key: of the same group and values, the first (the best rank).
        entries.sort();
        entries.dedup_by(|b, a| a.0 == b.0);
        let mut content = String::new();
        for (k, v) in &entries {
            content.push_str(k);
            content.push(' ');
            content.push_str(v);
            content.push('\n');
        }
        let kind = format!("match{}", letters(i));
        let name = hafleet_proto::MapName::for_content(&kind, &content).expect("kinds are letters");
        model.shapes.push(ShapeModel { key, map: name.relative_path() });
        model.files.push(hafleet_proto::MapFile { name, content });
    }
    model
}

/// `i` in lowercase letters (a, b, …, z, ba, …): map kinds are letters only.
fn letters(mut i: usize) -> String {
    let mut out = Vec::new();
    loop {
        out.push(b'a' + (i % 26) as u8);
        i /= 26;
        if i == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("letters")
}

fn kind_of(kind: &str) -> &'static str {
    if kind == "exact" { "exact" } else { "prefix" }
}

/// The prefix keys of the same host whose rules a request at `rule`'s path also matches, the
/// longest first: for an exact path, its own path as a prefix and every shorter one; for a
/// prefix, the shorter ones.
fn covering_keys(kind: &str, rule: &RuleModel) -> Vec<String> {
    let host = rule.host.as_deref().unwrap_or("");
    let path = rule.path.trim_end_matches('/');
    let mut paths = Vec::new();
    if kind == "exact" && !path.is_empty() {
        paths.push(path.to_owned());
    }
    let mut rest = path;
    while let Some(cut) = rest.rfind('/') {
        rest = &rest[..cut];
        if !rest.is_empty() {
            paths.push(rest.to_owned());
        }
    }
    if !path.is_empty() || kind == "exact" {
        paths.push(String::new());
    }
    paths.into_iter().map(|p| format!("{host}{p}/")).collect()
}

fn split(shares: &[(u32, String)]) -> Vec<ShareModel> {
    let total: u64 = shares.iter().map(|(w, _)| u64::from(*w)).sum::<u64>().max(1);
    let mut cumulative = 0u64;
    let last = shares.len().saturating_sub(1);
    shares
        .iter()
        .enumerate()
        .map(|(i, (w, backend))| {
            cumulative += u64::from(*w);
            let below = (i < last).then(|| cumulative * DRAW_SCALE / total);
            ShareModel { backend: backend.clone(), below }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(host: &str, path: &str, kind: &'static str, backend: &str) -> Arc<RuleModel> {
        let mut r = RuleModel {
            key: String::new(),
            host: Some(host.into()),
            path: path.into(),
            kind,
            backend: backend.into(),
            ingress: "shop/web".into(),
        };
        r.key = r.map_key();
        Arc::new(r)
    }

    #[test]
    fn covering_keys_are_the_shorter_prefixes_of_the_same_host() {
        let keys = |kind, path| covering_keys(kind, &rule("h", path, kind, "b"));
        assert_eq!(keys("prefix", "/a/b"), ["h/a/", "h/"]);
        assert_eq!(keys("prefix", "/"), Vec::<String>::new());
        assert_eq!(keys("exact", "/a/b"), ["h/a/b/", "h/a/", "h/"]);
        assert_eq!(keys("exact", "/"), ["h/"]);
    }

    fn asks(headers: &[(&str, &str)], method: Option<&'static str>) -> Asks {
        Asks {
            method,
            headers: headers.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect(),
            query: vec![],
            tls: false,
        }
    }

    /// A conditional route before the plain one of its path, in precedence order; a path with
    /// conditional routes only falls to the plain route of a shorter prefix; weights make a
    /// split; each shape has its map, keyed by group and hex values.
    #[test]
    fn candidates_are_ranked_as_the_gateway_api_orders_them() {
        let mut rules = vec![rule("h", "/", "prefix", "be_root")];
        let mut claimed: HashMap<(&str, &str), usize, foldhash::fast::RandomState> =
            HashMap::default();
        claimed.insert(("prefix", "h/"), 0usize);
        let mut weighted: HashMap<(&str, &str), Vec<(u32, String)>, foldhash::fast::RandomState> =
            HashMap::default();
        weighted
            .insert(("prefix", "h/"), vec![(3, "be_root".to_owned()), (1, "be_canary".to_owned())]);
        let api = rule("h", "/api", "prefix", "be_v2");
        let cond = |precedence, asks: Asks, backend: &str| Conditional {
            precedence,
            asks,
            shares: vec![(1, backend.into())],
            rule: Arc::clone(&api),
        };
        let mut conditional = BTreeMap::new();
        conditional.insert(
            ("prefix", "h/api/".to_owned()),
            vec![
                cond((false, 1, 0, false), asks(&[("version", "1")], None), "be_h1"),
                cond((true, 0, 0, false), asks(&[], Some("GET")), "be_m"),
                cond(
                    (false, 2, 0, false),
                    asks(&[("color", "red"), ("version", "2")], None),
                    "be_h2",
                ),
            ],
        );
        let d = build(&mut rules, &claimed, &weighted, conditional).expect("groups");
        assert_eq!(d.headers, ["color", "version"]);
        assert!(d.method);
        // Four shapes: nothing, the method, version, color and version.
        assert_eq!(d.shapes.len(), 4);
        let all: String = d.files.iter().map(|f| f.content.as_str()).collect();
        let api_group = rules.iter().find(|r| r.key == "h/api/").unwrap().backend.clone();
        assert!(api_group.starts_with(GROUP_PREFIX));
        // The method first, then two headers, then one; then the root's split.
        assert!(all.contains(&format!("{api_group}.474554 000000~be_m\n")), "{all}");
        assert!(all.contains(&format!("{api_group}.726564.32 000001~be_h2\n")), "{all}");
        assert!(all.contains(&format!("{api_group}.31 000002~be_h1\n")), "{all}");
        let split = &d
            .splits
            .iter()
            .find(|s| all.contains(&format!("{api_group} 000003~{}", s.name)))
            .unwrap();
        assert_eq!(split.shares[0], ShareModel { backend: "be_root".into(), below: Some(750_000) });
        assert_eq!(split.shares[1], ShareModel { backend: "be_canary".into(), below: None });
        // The shapes' keys append what each asks, in that order.
        assert!(
            d.shapes
                .iter()
                .any(|s| s.key == ",concat(.,txn.hafleet_h0,),concat(.,txn.hafleet_h1,)")
        );
        // Both keys' rules name their groups; the one without a plain rule was added.
        assert_eq!(rules.len(), 2);
        assert!(rules.iter().all(|r| r.backend.starts_with(GROUP_PREFIX)));
    }

    /// A route only served over TLS ranks before the plain route of its path, in a shape of its
    /// own whose key appends the TLS variable (hex `1` over TLS, so plain requests miss it).
    #[test]
    fn a_tls_only_route_is_a_shape_that_plain_requests_miss() {
        let mut rules = vec![rule("h", "/", "prefix", "be_redirect")];
        let mut claimed: HashMap<(&str, &str), usize, foldhash::fast::RandomState> =
            HashMap::default();
        claimed.insert(("prefix", "h/"), 0usize);
        let tls = Conditional {
            precedence: (false, 0, 0, true),
            asks: Asks { tls: true, ..Asks::default() },
            shares: vec![(1, "be_app".into())],
            rule: Arc::clone(&rules[0]),
        };
        let mut conditional = BTreeMap::new();
        conditional.insert(("prefix", "h/".to_owned()), vec![tls]);
        let d = build(&mut rules, &claimed, &HashMap::default(), conditional).expect("groups");
        assert!(d.tls);
        let group = rules[0].backend.clone();
        let all: String = d.files.iter().map(|f| f.content.as_str()).collect();
        assert!(all.contains(&format!("{group}.31 000000~be_app\n")), "{all}");
        assert!(all.contains(&format!("{group} 000001~be_redirect\n")), "{all}");
        assert!(d.shapes.iter().any(|s| s.key == ",concat(.,txn.hafleet_t,)"));
    }

    #[test]
    fn what_a_route_asks_is_sorted_by_name_and_keyed_in_hex() {
        let more = RouteMore {
            headers: vec![
                (
                    hafleet_proto::HeaderName::new("Version").unwrap(),
                    hafleet_proto::HeaderValue::new("2 beta").unwrap(),
                ),
                (
                    hafleet_proto::HeaderName::new("Color").unwrap(),
                    hafleet_proto::HeaderValue::new("red").unwrap(),
                ),
            ],
            query: vec![(
                hafleet_proto::ParamName::new("debug").unwrap(),
                hafleet_proto::HeaderValue::new("on").unwrap(),
            )],
            method: Some(hafleet_proto::Method::Post),
            ..Default::default()
        };
        let a = Asks::of(&more);
        assert_eq!(a.headers[0].0, "color");
        assert_eq!(a.key(), ".504F5354.726564.322062657461.6F6E");
        assert_eq!(letters(0), "a");
        assert_eq!(letters(27), "bb");
    }
}
