//! Tests of [`super`]: its behaviour, apart from its code.

use super::*;
use hafleet_proto::{Backend, HttpHost, HttpPath, Namespace, ObjectName, Route, Server};

fn one_node() -> Vec<NodeAddr> {
    vec![NodeAddr { name: ObjectName::new("node-1").unwrap(), addr: "127.0.0.2".parse().unwrap() }]
}

pub(crate) fn route(host: Option<&str>, path: &str, kind: PathKind, svc: &str) -> Route {
    Route {
        host: host.map(|h| HttpHost::new(h).unwrap()),
        path: HttpPath::new(path).unwrap(),
        kind,
        backend: Backend {
            service: ServiceRef {
                namespace: Namespace::new("default").unwrap(),
                name: ObjectName::new(svc).unwrap(),
                port: 80,
                cluster: None,
            },
            node_port: Some(30080),
            servers: vec![],
            traffic_policy: hafleet_proto::TrafficPolicy::Cluster,
            endpoint_nodes: None,
            options: Default::default(),
            pods: None,
        },
        more: None,
    }
}

fn fleet_of(entries: Vec<(&str, i64, Vec<Route>)>) -> BTreeMap<IngressKey, IngressEntry> {
    entries
        .into_iter()
        .map(|(name, created, routes)| {
            (
                IngressKey::new("default", name).unwrap(),
                IngressEntry {
                    created_unix: created,
                    resource_version: "1".into(),
                    routes: routes.into(),
                    seq: 0,
                    tls: Vec::new(),
                    quarantined: None,
                },
            )
        })
        .collect()
}

#[test]
fn the_older_ingress_wins_a_conflict_and_the_loser_is_noted() {
    let f = FleetName::new("edge").unwrap();
    let state = fleet_of(vec![
        ("young", 200, vec![route(Some("a.com"), "/x/", PathKind::Prefix, "young")]),
        ("old", 100, vec![route(Some("a.com"), "/x", PathKind::Prefix, "old")]),
    ]);
    let m = build(&f, &state, &one_node());
    assert_eq!(m.rules.len(), 1);
    assert_eq!(m.rules[0].ingress, "default/old");
    assert_eq!(m.backends.len(), 1);
    assert_eq!(m.notes.len(), 1);
    assert!(m.notes[0].starts_with("default/young: a.com/x"), "{}", m.notes[0]);
}

#[test]
fn shared_services_take_the_server_list_of_the_newest_event() {
    let f = FleetName::new("edge").unwrap();
    let mut state = fleet_of(vec![
        ("old", 1, vec![route(Some("a.com"), "/", PathKind::Prefix, "web")]),
        ("new", 2, vec![route(Some("b.com"), "/", PathKind::Prefix, "web")]),
    ]);
    let old = IngressKey::new("default", "old").unwrap();
    let new = IngressKey::new("default", "new").unwrap();
    state.get_mut(&old).unwrap().seq = 5;
    state.get_mut(&new).unwrap().seq = 9;
    Arc::make_mut(&mut state.get_mut(&new).unwrap().routes)[0].backend.node_port = Some(31111);
    let m = build(&f, &state, &one_node());
    assert_eq!(m.backends.len(), 1);
    assert_eq!(m.backends[0].servers[0].addr, "127.0.0.2:31111");
}

#[test]
fn the_model_does_not_depend_on_arrival_order() {
    let f = FleetName::new("edge").unwrap();
    let a = ("a", 1, vec![route(Some("a.com"), "/", PathKind::Prefix, "a")]);
    let b = ("b", 1, vec![route(Some("b.com"), "/", PathKind::Prefix, "b")]);
    let one = build(&f, &fleet_of(vec![a.clone(), b.clone()]), &one_node());
    let two = build(&f, &fleet_of(vec![b, a]), &one_node());
    assert_eq!(one, two);
}

fn backend_on(svc: usize, policy: TrafficPolicy) -> Backend {
    Backend {
        service: ServiceRef {
            namespace: Namespace::new("team").unwrap(),
            name: ObjectName::new(format!("svc-{svc}")).unwrap(),
            port: 80,
            cluster: None,
        },
        node_port: Some(30080),
        servers: vec![],
        traffic_policy: policy,
        endpoint_nodes: None,
        options: Default::default(),
        pods: None,
    }
}

fn nodes(range: impl Iterator<Item = usize>) -> Vec<NodeAddr> {
    range
        .map(|n| NodeAddr {
            name: ObjectName::new(format!("node-{n:03}")).unwrap(),
            addr: std::net::Ipv4Addr::from(0x0a00_0000 + n as u32).into(),
        })
        .collect()
}

/// The nodes `svc`'s backend lists when the cluster has `on`.
fn chosen(svc: usize, on: &[NodeAddr], policy: TrafficPolicy, k: usize) -> Vec<String> {
    let b = backend_on(svc, policy);
    subset(&b, &NodePool::new(on), k).iter().map(|c| c.node.to_owned()).collect()
}

#[test]
fn cluster_backends_keep_a_bounded_subset_local_ones_every_node() {
    let all = nodes(0..200);
    let kept = chosen(1, &all, TrafficPolicy::Cluster, 10);
    assert_eq!(kept.len(), 10);
    assert!(kept.is_sorted(), "node-name order: {kept:?}");
    assert_eq!(chosen(1, &all, TrafficPolicy::Cluster, 10), kept, "deterministic");
    assert_eq!(chosen(1, &all, TrafficPolicy::Cluster, 0).len(), 200, "0 keeps every node");
    assert_eq!(chosen(1, &nodes(0..4), TrafficPolicy::Cluster, 10).len(), 4);
    assert_eq!(chosen(1, &all, TrafficPolicy::Local, 10).len(), 200, "endpoints unknown");
    // With its endpoints known, a Local backend lists exactly the nodes that run one, in
    // node-name order, however many; nodes it names that are not Ready are left out.
    let mut local = backend_on(1, TrafficPolicy::Local);
    let on = ["node-150", "node-003", "node-077", "node-999"];
    local.endpoint_nodes = Some(on.iter().map(|n| ObjectName::new(*n).unwrap()).collect());
    let listed = |b: &Backend| -> Vec<String> {
        subset(b, &NodePool::new(&all), 1).iter().map(|c| c.node.to_owned()).collect()
    };
    assert_eq!(listed(&local), ["node-003", "node-077", "node-150"], "unsorted input");
    local.endpoint_nodes.as_mut().unwrap().sort();
    assert_eq!(listed(&local), ["node-003", "node-077", "node-150"]);
    local.endpoint_nodes = Some(vec![]);
    assert!(listed(&local).is_empty(), "no endpoint: no server, HAProxy answers 503");
    let mut gone = backend_on(1, TrafficPolicy::Cluster);
    gone.node_port = None;
    assert!(subset(&gone, &NodePool::new(&all), 10).is_empty(), "no NodePort, no server");
}

/// The subsets of the first build of rendezvous subsets (score every node, select the k
/// best): the one-pass choice must pick the very same servers, or an upgrade would move
/// backends for nothing.
#[test]
fn the_one_pass_choice_picks_what_scoring_every_node_picks() {
    let all = nodes(0..200);
    for svc in 0..300 {
        let b = backend_on(svc, TrafficPolicy::Cluster);
        let s = &b.service;
        let service = fnv1a(format!("{}/{}:{}", s.namespace, s.name, s.port).as_bytes());
        let mut scored: Vec<(u64, &str)> = all
            .iter()
            .map(|n| {
                let h = fnv1a(n.name.as_str().as_bytes());
                (mix(service.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ h), n.name.as_str())
            })
            .collect();
        scored.select_nth_unstable_by(9, |a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let mut want: Vec<&str> = scored[..10].iter().map(|(_, n)| *n).collect();
        want.sort_unstable();
        assert_eq!(chosen(svc, &all, TrafficPolicy::Cluster, 10), want, "svc-{svc}");
    }
}

#[test]
fn with_node_health_every_node_is_checked_once_whichever_subsets_hold_it() {
    let options = Options {
        servers_per_backend: 1,
        spare_backends: 0,
        node_health: Some(NodeHealth { port: 10256, path: HttpPath::new("/healthz").unwrap() }),
    };
    let f = FleetName::new("edge").unwrap();
    let state = fleet_of(vec![("one", 1, vec![route(Some("a.com"), "/", PathKind::Prefix, "a")])]);
    let m = build_with(&f, &state, &nodes(0..3), &options);
    assert_eq!(m.backends[0].servers.len(), 1, "one node in the subset");
    let checked: Vec<&str> = m.nodes.iter().map(|n| n.addr.as_str()).collect();
    assert_eq!(checked, ["10.0.0.0:10256", "10.0.0.1:10256", "10.0.0.2:10256"]);
    let track = m.backends[0].servers[0].track.as_deref().unwrap();
    assert!(track.starts_with("hafleet_nodes/node-00"), "{track}");
}

/// Two clusters feeding one fleet, each with a Service `default/a:80` and a node named
/// `node-000`: two HAProxy backends, each on its own cluster's nodes (a subset of those
/// only), and every node of both checked once under a name of its own.
#[test]
fn a_clusters_services_go_to_its_own_nodes_under_names_of_their_own() {
    let east = ClusterId::new("east").unwrap();
    let options = Options {
        servers_per_backend: 2,
        spare_backends: 0,
        node_health: Some(NodeHealth { port: 10256, path: HttpPath::new("/healthz").unwrap() }),
    };
    let f = FleetName::new("edge").unwrap();
    let mut state =
        fleet_of(vec![("one", 1, vec![route(Some("a.com"), "/", PathKind::Prefix, "a")])]);
    let mut theirs = route(Some("b.com"), "/", PathKind::Prefix, "a");
    theirs.backend.service.cluster = Some(east.clone());
    let (key, mut entry) = state.iter().next().map(|(k, e)| (k.clone(), e.clone())).unwrap();
    entry.routes = vec![theirs].into();
    state.insert(key.in_cluster(Some(&east)), entry);
    let east_nodes: Vec<NodeAddr> = nodes(0..3)
        .into_iter()
        .map(|n| NodeAddr { addr: "10.1.0.9".parse().unwrap(), ..n })
        .collect();
    let all: Nodes = [(None, nodes(0..5)), (Some(east.clone()), east_nodes)].into();
    let m = build_memo(&f, &state, &all, &options, &mut Memo::default());
    let names: Vec<&str> = m.backends.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["be_default_a_80", "be_default_a_80:east"]);
    let rules: Vec<(&str, &str)> =
        m.rules.iter().map(|r| (r.ingress.as_str(), r.backend.as_str())).collect();
    assert_eq!(
        rules,
        [("default/one", "be_default_a_80"), ("default/one@east", "be_default_a_80:east")]
    );
    let ours = &m.backends[0].servers;
    assert_eq!(ours.len(), 2, "a subset of its own cluster's five");
    assert!(ours.iter().all(|s| s.addr.starts_with("10.0.0.") && !s.name.contains(':')));
    let theirs = &m.backends[1].servers;
    assert_eq!(theirs.len(), 2);
    for s in theirs {
        assert!(s.name.ends_with(":east") && s.addr.starts_with("10.1.0.9:"), "{s:?}");
        assert_eq!(s.track.as_deref(), Some(format!("hafleet_nodes/{}", s.name).as_str()));
    }
    let checked: Vec<&str> = m.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(checked.len(), 8, "{checked:?}");
    assert!(checked.contains(&"node-000") && checked.contains(&"node-000:east"));
    // The unnamed cluster alone renders as before clusters: the same subsets, names.
    let alone = build_with(
        &f,
        &fleet_of(vec![("one", 1, vec![route(Some("a.com"), "/", PathKind::Prefix, "a")])]),
        &nodes(0..5),
        &options,
    );
    assert_eq!(alone.backends[0], m.backends[0]);
}

#[test]
fn servers_listed_by_a_schema_2_message_are_used_as_they_are() {
    let mut b = backend_on(1, TrafficPolicy::Cluster);
    b.node_port = None;
    b.servers = vec![Server {
        node: ObjectName::new("old-node").unwrap(),
        addr: "10.9.9.9".parse().unwrap(),
        port: 31000,
    }];
    let all = nodes(0..3);
    let pool = NodePool::new(&all);
    let kept = subset(&b, &pool, 10);
    assert_eq!(kept.len(), 1);
    assert_eq!((kept[0].node, kept[0].port), ("old-node", 31000));
}

#[test]
fn a_node_leaving_or_joining_moves_only_the_backends_that_hash_to_it() {
    let k = 10;
    let (mut moved_leave, mut moved_join) = (0, 0);
    let mut uses = vec![0usize; 201];
    let (all, left, joined_set) =
        (nodes(0..200), nodes((0..200).filter(|n| *n != 7)), nodes(0..201));
    for svc in 0..1000 {
        let before = chosen(svc, &all, TrafficPolicy::Cluster, k);
        for n in &before {
            uses[n[5..].parse::<usize>().unwrap()] += 1;
        }
        // node-007 leaves.
        let after = chosen(svc, &left, TrafficPolicy::Cluster, k);
        if before.contains(&"node-007".to_owned()) {
            moved_leave += 1;
            let same = before.iter().filter(|n| after.contains(n)).count();
            assert_eq!(same, k - 1, "only node-007 is replaced");
        } else {
            assert_eq!(after, before, "a backend without node-007 does not move");
        }
        // node-200 joins.
        let joined = chosen(svc, &joined_set, TrafficPolicy::Cluster, k);
        if joined != before {
            moved_join += 1;
            assert!(joined.contains(&"node-200".to_owned()));
            assert_eq!(before.iter().filter(|n| joined.contains(n)).count(), k - 1);
        }
    }
    // About k / nodes = 5% of the backends move, and load spreads over every node.
    assert!((20..=90).contains(&moved_leave), "{moved_leave} backends moved on a leave");
    assert!((20..=90).contains(&moved_join), "{moved_join} backends moved on a join");
    let (min, max) = (uses[..200].iter().min().unwrap(), uses[..200].iter().max().unwrap());
    assert!(*min >= 20 && *max <= 100, "uses per node between {min} and {max}");
}

#[test]
fn the_memo_reuses_what_did_not_change_and_forgets_what_went() {
    let f = FleetName::new("edge").unwrap();
    let nodes = Nodes::from([(None, one_node())]);
    let options = Options::default();
    let mut state = fleet_of(vec![
        ("a", 1, vec![route(Some("a.com"), "/", PathKind::Prefix, "a")]),
        ("b", 2, vec![route(Some("b.com"), "/", PathKind::Prefix, "b")]),
    ]);
    let mut memo = Memo::default();
    let first = build_memo(&f, &state, &nodes, &options, &mut memo);
    let key = |name| IngressKey::new("default", name).unwrap();

    // The same routes in a new Arc: the rules and backends built before, not new ones.
    state.get_mut(&key("a")).unwrap().routes =
        Arc::new(vec![route(Some("a.com"), "/", PathKind::Prefix, "a")]);
    let again = build_memo(&f, &state, &nodes, &options, &mut memo);
    assert_eq!(again, first);
    assert!(Arc::ptr_eq(&again.rules[0], &first.rules[0]));
    assert!(Arc::ptr_eq(&again.backends[0], &first.backends[0]));
    assert!(Arc::ptr_eq(&memo.rules[&key("a")].routes, &state[&key("a")].routes));

    // A changed route is built anew; a gone Ingress and its backend leave the memo.
    Arc::make_mut(&mut state.get_mut(&key("a")).unwrap().routes)[0].path =
        HttpPath::new("/v2").unwrap();
    state.remove(&key("b"));
    let changed = build_memo(&f, &state, &nodes, &options, &mut memo);
    assert_eq!(changed, build(&f, &state, &one_node()));
    assert_eq!(changed.rules[0].path, "/v2");
    assert!(Arc::ptr_eq(&changed.backends[0], &first.backends[0]));
    assert_eq!(memo.rules.len(), 1);
    assert_eq!(memo.backends.len(), 1);
}

#[test]
fn a_tcp_port_goes_to_the_oldest_route_and_draws_among_its_shares() {
    let f = FleetName::new("edge").unwrap();
    let tcp = |svc: &str, port: u16, split: Vec<(u32, Backend)>| {
        let mut r = route(None, "/", PathKind::Prefix, svc);
        r.backend.options.tcp = true;
        let weight = (!split.is_empty()).then_some(3);
        r.more = Some(Box::new(hafleet_proto::RouteMore {
            port: Some(port),
            weight,
            split,
            ..Default::default()
        }));
        r
    };
    let mut other = route(None, "/", PathKind::Prefix, "db-b").backend;
    other.options.tcp = true;
    let state = fleet_of(vec![
        ("newer", 200, vec![tcp("rival", 9300, vec![])]),
        ("older", 100, vec![tcp("db-a", 9300, vec![(1, other)])]),
        ("alone", 300, vec![tcp("cache", 9301, vec![])]),
    ]);
    let m = build(&f, &state, &one_node());
    let ports: Vec<u16> = m.tcp.iter().map(|t| t.port).collect();
    assert_eq!(ports, [9300, 9301]);
    let shares: Vec<(&str, Option<u32>)> =
        m.tcp[0].shares.iter().map(|s| (s.backend.as_str(), s.below)).collect();
    assert_eq!(m.tcp[0].total, 4);
    assert!(shares[0].0.starts_with("be_default_db-a_80_") && shares[0].1 == Some(3), "{shares:?}");
    assert!(shares[1].0.starts_with("be_default_db-b_80_") && shares[1].1.is_none(), "{shares:?}");
    assert_eq!(m.tcp[1].shares.len(), 1);
    assert!(m.notes.iter().any(|n| n.starts_with("default/newer")), "{:?}", m.notes);
    assert!(m.rules.iter().all(|r| r.kind == "tcp"));
}
