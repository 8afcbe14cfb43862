//! Tenants kept apart. Pure: the routes every Ingress resolved to in, the routes each may keep
//! and what to tell the others out.
//!
//! - **Hosts belong to namespaces.** On each fleet, a host belongs to the namespace of the
//!   oldest Ingress that routes it (creationTimestamp, then namespace/name: the same order the
//!   renderer settles conflicts in). Another namespace's routes for that host are dropped, and
//!   that Ingress is told (`HostTaken`), unless an Ingress of the owning namespace that routes
//!   the host lists the other namespace in `hafleet.io/share-hosts-with` (or `*`). Rules
//!   without a host match every host, so they are owned the same way, as one more host: one
//!   namespace cannot catch another's traffic with a host-less rule. A wildcard host is a host
//!   of its own (`*.example.com` is not `shop.example.com`).
//! - **The loser of a conflict is told.** Two routes of one fleet with the same host, path and
//!   match kind: the older Ingress's wins (the renderer routes it), and the other Ingress gets a
//!   `PathTaken` Warning naming the winner.
//!
//! Dropping routes from the message, rather than refusing the Ingress, withdraws them even from
//! an Ingress that routed the host before the owner appeared, and keeps its other hosts routed.

use crate::core::model::{Resolved, SHARE_ANNOTATION, Sharing, Warning};
use hafleet_proto::{IngressKey, PathKind};
use std::collections::{BTreeMap, HashMap};

/// A route's host as ownership sees it: `""` for a rule without a host.
fn host_of(route: &hafleet_proto::Route) -> &str {
    route.host.as_ref().map_or("", |h| h.as_str())
}

/// A Prefix route's path as a claim sees it: without trailing slashes (`/foo/` claims what
/// `/foo` does), the root kept. Borrowed, as [`hafleet_proto::HttpPath::trimmed`] is not.
fn claimed_path(route: &hafleet_proto::Route) -> &str {
    let path = route.path.as_str();
    match route.kind {
        PathKind::Exact => path,
        PathKind::Prefix => match path.trim_end_matches('/') {
            "" => "/",
            trimmed => trimmed,
        },
    }
}

/// With `namespaces_own_hosts`, drops from each Ingress of `routed` the routes for hosts
/// another namespace owns and does not share; returns what to tell each Ingress (the routes
/// dropped, and the conflicts it lost).
///
/// Runs on every watcher pass over every routed Ingress, so it decides on names borrowed from
/// `routed` in hash maps first (nothing copied per route), and drops routes after.
pub fn keep_apart(
    routed: &mut [&mut Resolved],
    namespaces_own_hosts: bool,
) -> BTreeMap<IngressKey, Vec<Warning>> {
    type Hashed<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
    let mut warnings: BTreeMap<IngressKey, Vec<Warning>> = BTreeMap::new();
    // Oldest first: the first to claim a host owns it, the first to claim a path wins it.
    // (A key and a fleet are unique, so an unstable sort gives the one order: an HTTPRoute
    // on several fleets has one entry per fleet.)
    routed.sort_unstable_by(|a, b| {
        (a.created_unix, &a.key, &a.fleet).cmp(&(b.created_unix, &b.key, &b.fleet))
    });
    // (index into `routed`, indices of the routes it loses) for each Ingress that loses any.
    let mut drops: Vec<(usize, Vec<usize>)> = Vec::new();
    {
        let routed: &[&mut Resolved] = routed;
        // (fleet, host) → the index of the owning Ingress (the oldest that routes it); none
        // when any namespace may route any host.
        // Sized up front: growing tables of 10,000s of entries on every pass showed in profiles.
        let routes: usize = routed.iter().map(|r| r.routes.len()).sum();
        fn sized<K, V>(n: usize) -> Hashed<K, V> {
            Hashed::with_capacity_and_hasher(n, Default::default())
        }
        let mut owners: Hashed<(&str, &str), usize> =
            sized(if namespaces_own_hosts { routes } else { 0 });
        // (fleet, host) → whom the owning namespace's Ingresses that route it share it with
        // (absent: nobody).
        let mut shared: Hashed<(&str, &str), Sharing> = Hashed::default();
        if namespaces_own_hosts {
            for (i, r) in routed.iter().enumerate() {
                for route in r.routes.iter() {
                    owners.entry((r.fleet.as_str(), host_of(route))).or_insert(i);
                }
            }
            for r in routed.iter().filter(|r| r.sharing != Sharing::Nobody) {
                for route in r.routes.iter() {
                    let at = (r.fleet.as_str(), host_of(route));
                    if owners.get(&at).is_some_and(|&o| routed[o].key.namespace == r.key.namespace)
                    {
                        shared.entry(at).or_default().widen(&r.sharing);
                    }
                }
            }
        }

        let mut claims: Hashed<(&str, &str, &str, PathKind), usize> = sized(routes);
        for (i, r) in routed.iter().enumerate() {
            let (key, fleet) = (&r.key, &r.fleet);
            // Host → owner, in host order (the order the Ingress is told in).
            let mut taken: BTreeMap<&str, usize> = BTreeMap::new();
            // The indices of its routes it loses, ascending.
            let mut lost = Vec::new();
            for (j, route) in r.routes.iter().enumerate() {
                let at = (fleet.as_str(), host_of(route));
                let Some(&owner) = owners.get(&at) else { continue };
                let allowed = routed[owner].key.namespace == key.namespace
                    || shared.get(&at).is_some_and(|s| s.allows(key.namespace.as_str()));
                if !allowed {
                    taken.insert(at.1, owner);
                    lost.push(j);
                }
            }
            for (host, owner) in taken {
                let owner = &routed[owner].key;
                let (what, verb) = match host.is_empty() {
                    true => ("rules without a host".to_owned(), "belong"),
                    false => (format!("host {host}"), "belongs"),
                };
                warnings.entry(key.clone()).or_default().push(Warning {
                    reason: "HostTaken",
                    note: format!(
                        "{what} on fleet {fleet} {verb} to namespace {} (Ingress {owner} is the \
                         oldest that routes it); these routes are ignored unless an Ingress of \
                         {} that routes it lists {} in {SHARE_ANNOTATION}",
                        owner.namespace, owner.namespace, key.namespace
                    ),
                });
            }
            for (j, route) in r.routes.iter().enumerate() {
                // A route that asks more of a request (an HTTPRoute's matches, TLS) claims no
                // path: the renderer ranks it among the routes of its host and path.
                let asks_more = route.more.as_deref().is_some_and(|m| !m.has_no_conditions());
                if lost.binary_search(&j).is_ok() || asks_more {
                    continue;
                }
                let claim = (fleet.as_str(), host_of(route), claimed_path(route), route.kind);
                let winner = *claims.entry(claim).or_insert(i);
                if routed[winner].key != *key {
                    let winner = &routed[winner].key;
                    let host = if claim.1.is_empty() { "*" } else { claim.1 };
                    warnings.entry(key.clone()).or_default().push(Warning {
                        reason: "PathTaken",
                        note: format!(
                            "{host}{} ({:?}) is already routed by {winner}, an older Ingress; \
                             this route is ignored while it does",
                            claim.2, route.kind
                        ),
                    });
                }
            }
            if !lost.is_empty() {
                drops.push((i, lost));
            }
        }
    }
    for (i, lost) in drops {
        let mut j = 0;
        std::sync::Arc::make_mut(&mut routed[i].routes).retain(|_| {
            j += 1;
            lost.binary_search(&(j - 1)).is_err()
        });
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::resolve::tests_support::route;
    use hafleet_proto::{FleetName, HttpHost, HttpPath};

    fn ingress(ns: &str, name: &str, created: i64, hosts: &[Option<&str>]) -> Resolved {
        Resolved {
            fleet: FleetName::new("edge").unwrap(),
            key: IngressKey::new(ns, name).unwrap(),
            created_unix: created,
            resource_version: "1".into(),
            routes: std::sync::Arc::new(
                hosts
                    .iter()
                    .map(|h| {
                        let mut r = route();
                        r.host = h.map(|h| HttpHost::new(h).unwrap());
                        r
                    })
                    .collect(),
            ),
            warnings: vec![],
            sharing: Sharing::Nobody,
            tls: Default::default(),
            tls_spec: vec![],
        }
    }

    fn hosts(r: &Resolved) -> Vec<&str> {
        r.routes.iter().map(host_of).collect()
    }

    #[test]
    fn a_host_belongs_to_the_oldest_ingress_s_namespace_and_others_are_dropped_and_told() {
        let mut owner = ingress("team-a", "shop", 10, &[Some("shop.com")]);
        let mut same_ns = ingress("team-a", "shop-api", 30, &[Some("shop.com")]);
        let mut thief = ingress("team-b", "steal", 20, &[Some("shop.com"), Some("b.com"), None]);
        let mut catch_all = ingress("team-c", "all", 5, &[None]);
        let warnings =
            keep_apart(&mut [&mut thief, &mut owner, &mut same_ns, &mut catch_all], true);
        assert_eq!(hosts(&owner), ["shop.com"]);
        assert_eq!(hosts(&thief), ["b.com"], "its own host stays; shop.com and host-less go");
        assert_eq!(hosts(&catch_all), [""], "the oldest host-less rule's namespace owns those");
        let told = &warnings[&thief.key];
        assert!(told.iter().all(|w| w.reason == "HostTaken"), "{told:?}");
        assert!(
            told.iter().any(|w| w
                .note
                .contains("host shop.com on fleet edge belongs to namespace team-a")),
            "{told:?}"
        );
        assert!(
            told.iter().any(|w| w
                .note
                .contains("rules without a host on fleet edge belong to namespace team-c")),
            "{told:?}"
        );
        // The same namespace may route the host; its duplicate path loses to the older one.
        assert_eq!(hosts(&same_ns), ["shop.com"]);
        let lost = &warnings[&same_ns.key];
        assert_eq!(lost.len(), 1, "{lost:?}");
        assert_eq!(lost[0].reason, "PathTaken");
        assert!(
            lost[0].note.contains("shop.com/ (Prefix) is already routed by team-a/shop"),
            "{}",
            lost[0].note
        );
        assert!(!warnings.contains_key(&owner.key));
    }

    #[test]
    fn the_owner_may_share_a_host_with_named_namespaces_or_everyone() {
        let mut owner = ingress("team-a", "shop", 10, &[Some("shop.com")]);
        owner.sharing = Sharing::parse("team-b, team-x").unwrap();
        let mut b = ingress("team-b", "b", 20, &[Some("shop.com")]);
        let mut c = ingress("team-c", "c", 30, &[Some("shop.com")]);
        std::sync::Arc::make_mut(&mut b.routes)[0].path = HttpPath::new("/b").unwrap();
        std::sync::Arc::make_mut(&mut c.routes)[0].path = HttpPath::new("/c").unwrap();
        let warnings = keep_apart(&mut [&mut owner, &mut b, &mut c], true);
        assert_eq!(hosts(&b), ["shop.com"]);
        assert!(hosts(&c).is_empty());
        assert!(!warnings.contains_key(&b.key));
        assert_eq!(warnings[&c.key][0].reason, "HostTaken");
        owner.sharing = Sharing::parse("*").unwrap();
        let mut c = ingress("team-c", "c", 30, &[Some("shop.com")]);
        keep_apart(&mut [&mut owner, &mut c], true);
        assert_eq!(hosts(&c), ["shop.com"]);
        assert!(Sharing::parse("Team-B").is_err());
        assert!(Sharing::parse("a;b").is_err());
    }

    /// A route that asks more of a request (here: only over TLS) shares its host and path with
    /// an older plain route of the same namespace: the renderer ranks them, nothing is taken.
    #[test]
    fn a_route_that_asks_more_takes_no_path() {
        let mut plain = ingress("team-a", "redirect", 10, &[Some("shop.com")]);
        let mut tls = ingress("team-a", "serve", 20, &[Some("shop.com")]);
        let more = hafleet_proto::RouteMore { tls: true, ..Default::default() };
        std::sync::Arc::make_mut(&mut tls.routes)[0].more = Some(Box::new(more));
        let warnings = keep_apart(&mut [&mut tls, &mut plain], true);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!((hosts(&plain), hosts(&tls)), (vec!["shop.com"], vec!["shop.com"]));
    }

    #[test]
    fn a_prefix_with_trailing_slashes_claims_what_it_would_without() {
        let at = |ns: &str, name: &str, created: i64, path: &str, kind: PathKind| {
            let mut r = ingress(ns, name, created, &[Some("shop.com")]);
            let routes = std::sync::Arc::make_mut(&mut r.routes);
            routes[0].path = HttpPath::new(path).unwrap();
            routes[0].kind = kind;
            r
        };
        let mut first = at("team-a", "first", 10, "/foo", PathKind::Prefix);
        let mut slash = at("team-a", "slash", 20, "/foo//", PathKind::Prefix);
        let mut exact = at("team-a", "exact", 30, "/foo/", PathKind::Exact);
        let mut root = at("team-a", "root", 40, "/", PathKind::Prefix);
        let mut slashes = at("team-a", "slashes", 50, "//", PathKind::Prefix);
        let warnings =
            keep_apart(&mut [&mut slashes, &mut root, &mut exact, &mut slash, &mut first], true);
        let lost: Vec<(&str, &str)> = warnings
            .iter()
            .flat_map(|(k, w)| w.iter().map(move |w| (k.name.as_str(), w.reason)))
            .collect();
        assert_eq!(lost, [("slash", "PathTaken"), ("slashes", "PathTaken")], "{warnings:?}");
        assert!(
            warnings[&slash.key][0]
                .note
                .contains("shop.com/foo (Prefix) is already routed by team-a/first")
        );
        assert!(warnings[&slashes.key][0].note.contains("already routed by team-a/root"));
        assert_eq!(hosts(&slash), ["shop.com"], "a lost path is told, its route stays");
    }

    #[test]
    fn fleets_and_wildcards_are_owned_apart() {
        let mut a = ingress("team-a", "a", 10, &[Some("shop.com"), Some("*.shop.com")]);
        let mut b = ingress("team-b", "b", 20, &[Some("x.shop.com")]);
        let mut other_fleet = ingress("team-c", "c", 30, &[Some("shop.com")]);
        other_fleet.fleet = FleetName::new("core").unwrap();
        let warnings = keep_apart(&mut [&mut a, &mut b, &mut other_fleet], true);
        assert!(warnings.is_empty(), "{warnings:?}");
        let mut thief = ingress("team-b", "t", 40, &[Some("shop.com")]);
        keep_apart(&mut [&mut a, &mut thief], false);
        assert_eq!(hosts(&thief), ["shop.com"], "single-tenant: any namespace routes any host");
        assert_eq!(hosts(&b), ["x.shop.com"], "an exact host is not its wildcard");
        assert_eq!(hosts(&other_fleet), ["shop.com"], "hosts are owned per fleet");
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    /// One Ingress for the property test: (namespace, creation time, sharing, routes as
    /// (host, path, exact)), from small sets so that claims collide often.
    type Drawn = (usize, i64, usize, Vec<(Option<usize>, usize, bool)>);

    fn drawn_ingress(i: usize, (ns, created, share, routes): &Drawn) -> Resolved {
        const HOSTS: [&str; 4] = ["shop.com", "*.shop.com", "a.shop.com", "b.com"];
        const PATHS: [&str; 3] = ["/", "/api", "/api/"];
        let namespace = ["team-a", "team-b", "team-c"][*ns];
        let mut r = ingress(namespace, &format!("ing-{i}"), *created, &[]);
        r.routes = std::sync::Arc::new(
            routes
                .iter()
                .map(|(host, path, exact)| {
                    let mut route = route();
                    route.host = host.map(|h| HttpHost::new(HOSTS[h]).unwrap());
                    route.path = HttpPath::new(PATHS[*path]).unwrap();
                    route.kind = if *exact { PathKind::Exact } else { PathKind::Prefix };
                    route
                })
                .collect(),
        );
        r.sharing = match share {
            0 => Sharing::Everyone,
            1 => Sharing::Namespaces(["team-b".to_owned()].into()),
            _ => Sharing::Nobody,
        };
        r
    }

    /// Each Ingress's kept routes and what it is told.
    type Outcome = BTreeMap<IngressKey, (Vec<hafleet_proto::Route>, Vec<(&'static str, String)>)>;

    fn outcome(mut all: Vec<Resolved>, own_hosts: bool) -> Outcome {
        let told = {
            let mut refs: Vec<&mut Resolved> = all.iter_mut().collect();
            keep_apart(&mut refs, own_hosts)
        };
        all.into_iter()
            .map(|r| {
                let said = told.get(&r.key).into_iter().flatten();
                let said = said.map(|w| (w.reason, w.note.clone())).collect();
                (r.key.clone(), (r.routes.to_vec(), said))
            })
            .collect()
    }

    proptest::proptest! {
        /// Who owns a host and who wins a path depends on the Ingresses, never on the order
        /// the watcher's caches listed them in.
        #[test]
        fn tenancy_does_not_depend_on_input_order(
            drawn in proptest::collection::vec(
                (
                    0usize..3,
                    0i64..4,
                    0usize..6,
                    proptest::collection::vec(
                        (proptest::option::of(0usize..4), 0usize..3, proptest::bool::ANY),
                        1..4,
                    ),
                ),
                1..8,
            ),
            rotate in 0usize..8,
            own_hosts in proptest::bool::ANY,
        ) {
            let ingresses: Vec<Resolved> =
                drawn.iter().enumerate().map(|(i, d)| drawn_ingress(i, d)).collect();
            let mut reordered = ingresses.clone();
            reordered.reverse();
            let k = rotate % reordered.len();
            reordered.rotate_left(k);
            proptest::prop_assert_eq!(outcome(ingresses, own_hosts), outcome(reordered, own_hosts));
        }
    }
}
