//! Routes that ask more of a request than its host and path (an HTTPRoute's header, query and
//! method matches), or that share requests among backends by weight: dispatch groups. Pure.
//!
//! The maps still decide by host and path alone, so a request costs the same lookups as
//! before. Where a host and path have such routes, the maps name a group
//! (`hafleet_g_<hash>`) instead of a backend, and the frontend checks that group's candidates
//! in order, each a `use_backend` guarded by the group's name: a request the maps gave to a
//! plain backend checks none of them; one given to a group checks the groups' lines (all of
//! them, in the worst case: HAProxy has no jump, so the cost grows with the conditional
//! routes of the whole fleet, not with the routes of other hosts; see BENCHMARKS.md).
//!
//! Order, the Gateway API's: a more specific path first (an exact path, then longer
//! prefixes); for one path, a method match, then more header matches, then more query
//! matches, then the older route (creation time, then namespace/name), then its rule order;
//! the plain route of that path last. A request that meets none of a path's routes falls to
//! the routes of the shorter prefixes of the same host, and then to a 404: never to another
//! host's rules.

use crate::core::model::RuleModel;
use hafleet_proto::RouteMore;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The names of groups start with this; no backend's does.
pub const GROUP_PREFIX: &str = "hafleet_g_";

/// A weighted share is drawn from `0..DRAW_SCALE`, once per request.
pub const DRAW_SCALE: u64 = 1_000_000;

/// A group as the template sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupModel {
    pub name: String,
    /// In order; the first whose conditions hold takes the request.
    pub candidates: Vec<CandidateModel>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CandidateModel {
    /// HAProxy ACL terms, all of which must hold ("": none).
    pub conditions: String,
    /// The backends sharing its requests; one without `below` takes what is left.
    pub split: Vec<ShareModel>,
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
    pub precedence: (bool, usize, usize),
    pub conditions: String,
    /// (weight, backend name), its own backend first.
    pub shares: Vec<(u32, String)>,
    pub rule: Arc<RuleModel>,
}

/// The HAProxy ACL terms of what `more` asks of a request. Every value is an allowlisted
/// newtype: none can end a quoted string.
pub fn conditions_of(more: &RouteMore) -> String {
    let mut terms = Vec::new();
    if let Some(m) = more.method {
        terms.push(format!("{{ method {} }}", m.as_str()));
    }
    for (name, value) in &more.headers {
        terms.push(format!("{{ req.fhdr({name}) -m str \"{value}\" }}"));
    }
    for (name, value) in &more.query {
        terms.push(format!("{{ url_param({name}) -m str \"{value}\" }}"));
    }
    terms.join(" ")
}

/// Dispatch groups for the keys with conditional routes (`conditional`, by (kind, key), each
/// list in claim order) or a plain route that shares by weight (`weighted`: the shares of the
/// plain rule at that key). `rules` holds the plain rules (`claimed`: their index by (kind,
/// key)); each key that becomes a group has its rule there name the group instead (added
/// when the key had no plain rule).
pub fn build(
    rules: &mut Vec<Arc<RuleModel>>,
    claimed: &HashMap<(&str, &str), usize, foldhash::fast::RandomState>,
    weighted: &HashMap<(&str, &str), Vec<(u32, String)>, foldhash::fast::RandomState>,
    mut conditional: BTreeMap<(&'static str, String), Vec<Conditional>>,
) -> Vec<GroupModel> {
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
    let mut groups = Vec::with_capacity(keys.len());
    let mut renamed: Vec<(Option<usize>, Arc<RuleModel>)> = Vec::new();
    for (kind, key) in keys {
        let mut candidates: Vec<CandidateModel> = Vec::new();
        let own = conditional.get(&(kind, key.clone()));
        let example = match (claimed.get(&(kind, key.as_str())), own.and_then(|l| l.first())) {
            (Some(&i), _) => Arc::clone(&rules[i]),
            (None, Some(c)) => Arc::clone(&c.rule),
            (None, None) => continue,
        };
        let mut take = |list: Option<&Vec<Conditional>>| {
            for c in list.into_iter().flatten() {
                candidates.push(candidate(c.conditions.clone(), &c.shares));
            }
        };
        take(own);
        match plain(kind, &key, rules) {
            Some(shares) => candidates.push(candidate(String::new(), &shares)),
            // Nothing plain at this path: the shorter prefixes of the same host.
            None => {
                for covering in covering_keys(kind, &example) {
                    take(conditional.get(&("prefix", covering.clone())));
                    if let Some(shares) = plain("prefix", &covering, rules) {
                        candidates.push(candidate(String::new(), &shares));
                        break;
                    }
                }
            }
        }
        let name = format!("{GROUP_PREFIX}{:016x}", fnv1a(format!("{kind} {key}").as_bytes()));
        let rule = RuleModel { backend: name.clone(), ..(*example).clone() };
        renamed.push((claimed.get(&(kind, key.as_str())).copied(), Arc::new(rule)));
        groups.push(GroupModel { name, candidates });
    }
    for (at, rule) in renamed {
        match at {
            Some(i) => rules[i] = rule,
            None => rules.push(rule),
        }
    }
    groups
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

fn candidate(conditions: String, shares: &[(u32, String)]) -> CandidateModel {
    let total: u64 = shares.iter().map(|(w, _)| u64::from(*w)).sum::<u64>().max(1);
    let mut cumulative = 0u64;
    let last = shares.len().saturating_sub(1);
    let split = shares
        .iter()
        .enumerate()
        .map(|(i, (w, backend))| {
            cumulative += u64::from(*w);
            let below = (i < last).then(|| cumulative * DRAW_SCALE / total);
            ShareModel { backend: backend.clone(), below }
        })
        .collect();
    CandidateModel { conditions, split }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
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

    /// A conditional route before the plain one of its path, in precedence order; a path with
    /// conditional routes only falls to the plain route of a shorter prefix; weights become
    /// thresholds of the draw.
    #[test]
    fn candidates_are_ordered_as_the_gateway_api_orders_them() {
        let mut rules = vec![rule("h", "/", "prefix", "be_root")];
        let mut claimed: HashMap<(&str, &str), usize, foldhash::fast::RandomState> =
            HashMap::default();
        claimed.insert(("prefix", "h/"), 0usize);
        let mut weighted: HashMap<(&str, &str), Vec<(u32, String)>, foldhash::fast::RandomState> =
            HashMap::default();
        weighted
            .insert(("prefix", "h/"), vec![(3, "be_root".to_owned()), (1, "be_canary".to_owned())]);
        let api = rule("h", "/api", "prefix", "be_v2");
        let cond = |precedence, conditions: &str, backend: &str| Conditional {
            precedence,
            conditions: conditions.into(),
            shares: vec![(1, backend.into())],
            rule: Arc::clone(&api),
        };
        let mut conditional = BTreeMap::new();
        conditional.insert(
            ("prefix", "h/api/".to_owned()),
            vec![
                cond((false, 1, 0), "H1", "be_h1"),
                cond((true, 0, 0), "M", "be_m"),
                cond((false, 2, 0), "H2", "be_h2"),
            ],
        );
        let groups = build(&mut rules, &claimed, &weighted, conditional);
        assert_eq!(groups.len(), 2);
        let api_group = groups.iter().find(|g| g.candidates.len() == 4).unwrap();
        let order: Vec<&str> = api_group.candidates.iter().map(|c| c.conditions.as_str()).collect();
        assert_eq!(order, ["M", "H2", "H1", ""]);
        let fallback = &api_group.candidates[3].split;
        assert_eq!(fallback[0], ShareModel { backend: "be_root".into(), below: Some(750_000) });
        assert_eq!(fallback[1], ShareModel { backend: "be_canary".into(), below: None });
        // Both keys' rules name their groups; the one without a plain rule was added.
        assert_eq!(rules.len(), 2);
        assert!(rules.iter().all(|r| r.backend.starts_with(GROUP_PREFIX)));
        assert_eq!(rules[1].key, "h/api/");
    }

    #[test]
    fn conditions_are_acl_terms_with_quoted_values() {
        let more = RouteMore {
            headers: vec![(
                hafleet_proto::HeaderName::new("Version").unwrap(),
                hafleet_proto::HeaderValue::new("2 beta").unwrap(),
            )],
            query: vec![(
                hafleet_proto::ParamName::new("debug").unwrap(),
                hafleet_proto::HeaderValue::new("on").unwrap(),
            )],
            method: Some(hafleet_proto::Method::Post),
            ..Default::default()
        };
        assert_eq!(
            conditions_of(&more),
            "{ method POST } { req.fhdr(Version) -m str \"2 beta\" } { url_param(debug) -m str \"on\" }"
        );
    }
}
