//! The runtime API's plans, bridges and commands, from pairs of bundles.

use super::*;
use hafleet_proto::{MapFile, MapName};

/// A bundle shaped like the built-in template's: `nodes` are (name, ip) checked in
/// hafleet_nodes; each backend lists (server, ip:port) tracking the node of that name.
fn bundle(nodes: &[(&str, &str)], backends: &[(&str, &[(&str, &str)])], exact: &str) -> Bundle {
    let maps = vec![
        MapFile { name: MapName::for_content("exact", exact).unwrap(), content: exact.into() },
        MapFile {
            name: MapName::for_content("prefix", "/ be_a\n").unwrap(),
            content: "/ be_a\n".into(),
        },
    ];
    let mut c = format!(
        "# Generated for {} routes\nglobal\n    default-path config\n\ndefaults\n    mode http\n    \
         default-server check inter 2s fall 2 rise 2\n\nfrontend f\n    # {} rules\n    \
         http-request set-var(txn.backend) path,map_str({})\n    \
         http-request set-var(txn.backend) path,map_beg({})\n    \
         use_backend %[var(txn.backend)]\n\nbackend hafleet_nodes\n    option httpchk GET /healthz\n",
        exact.lines().count(),
        exact.lines().count(),
        maps[0].name.relative_path(),
        maps[1].name.relative_path()
    );
    for (n, ip) in nodes {
        c.push_str(&format!("    server {n} {ip}:10256\n"));
    }
    for (b, servers) in backends {
        c.push_str(&format!("\nbackend {b}\n    # a comment\n"));
        for (s, addr) in servers.iter() {
            c.push_str(&format!("    server {s} {addr} no-check track hafleet_nodes/{s}\n"));
        }
    }
    Bundle::new(c, maps, vec![])
}

const NODES: &[(&str, &str)] = &[("n1", "10.0.0.1"), ("n2", "10.0.0.2")];

#[test]
fn a_change_of_map_contents_and_comments_only_is_found_without_parsing() {
    let servers: &[(&str, &str)] = &[("n1", "10.0.0.1:30080")];
    let a = bundle(NODES, &[("be_a", servers)], "x be_a\n");
    // Another exact map (and with it the `# N rules` comments): map steps only.
    let b = bundle(NODES, &[("be_a", servers)], "x be_a\ny be_a\n");
    assert!(same_but_map_names(&a, &b));
    let Plan::Runtime(steps) = plan(&a, &b) else { panic!("a map change needs no reload") };
    assert!(matches!(steps.as_slice(), [Step::EditMap { kind, .. }] if kind == "exact"));
    // A server changed as well: not the fast case, and the parsed plan sees it.
    let c = bundle(NODES, &[("be_a", &[("n2", "10.0.0.2:30080")])], "x be_a\ny be_a\n");
    assert!(!same_but_map_names(&a, &c));
    let Plan::Runtime(steps) = plan(&a, &c) else { panic!("a subset move needs no reload") };
    assert!(steps.iter().any(|s| matches!(s, Step::EditMap { .. })));
    assert!(steps.iter().any(|s| matches!(s, Step::AddServer { .. })));
    // A line break next to a map name is a change, whatever the rest.
    let mut e = b.clone();
    let joined = format!("{})\n", e.maps[0].name.relative_path());
    e.config = e.config.replacen(&joined, &format!("{}) ", e.maps[0].name.relative_path()), 1);
    assert_ne!(e.config, b.config);
    assert!(!same_but_map_names(&b, &e));
    // A map name that is not one of the bundle's: never the fast case.
    let mut d = b.clone();
    d.config = d.config.replace(&d.maps[0].name.relative_path(), "hafleet-maps/exact-0.map");
    assert!(!same_but_map_names(&a, &d));
}

#[test]
fn the_same_config_needs_nothing_and_a_comment_is_not_a_change() {
    let a = bundle(NODES, &[("be_a", &[("n1", "10.0.0.1:30080")])], "x be_a\n");
    assert_eq!(plan(&a, &a.clone()), Plan::Nothing);
    let mut b = a.clone();
    b.config = b.config.replace("# a comment", "# another comment");
    assert_eq!(plan(&a, &b), Plan::Nothing);
}

#[test]
fn a_node_drained_is_servers_put_in_maintenance_and_deleted_without_a_reload() {
    let both: &[(&str, &str)] = &[("n1", "10.0.0.1:30080"), ("n2", "10.0.0.2:30080")];
    let one: &[(&str, &str)] = &[("n1", "10.0.0.1:30080")];
    let a = bundle(NODES, &[("be_a", both), ("be_b", both)], "x be_a\n");
    let b = bundle(&NODES[..1], &[("be_a", one), ("be_b", one)], "x be_a\n");
    let remove = |backend: &str, server: &str| Step::RemoveServer {
        backend: backend.into(),
        server: server.into(),
    };
    assert_eq!(
        plan(&a, &b),
        Plan::Runtime(vec![
            remove("be_a", "n2"),
            remove("be_b", "n2"),
            remove("hafleet_nodes", "n2")
        ])
    );
}

#[test]
fn a_node_joining_needs_a_reload_because_its_own_check_cannot_be_tracked_at_runtime() {
    let one: &[(&str, &str)] = &[("n1", "10.0.0.1:30080")];
    let both: &[(&str, &str)] = &[("n1", "10.0.0.1:30080"), ("n2", "10.0.0.2:30080")];
    let a = bundle(&NODES[..1], &[("be_a", one)], "x be_a\n");
    let b = bundle(NODES, &[("be_a", both)], "x be_a\n");
    let Plan::Reload(why) = plan(&a, &b) else { panic!("a new checked server is a reload") };
    assert!(why.contains("hafleet_nodes/n2"), "{why}");
}

#[test]
fn a_subset_moving_to_a_known_node_adds_a_tracking_server_before_removing_the_old() {
    let a = bundle(NODES, &[("be_a", &[("n1", "10.0.0.1:30080")])], "x be_a\n");
    let b = bundle(NODES, &[("be_a", &[("n2", "10.0.0.2:30080")])], "x be_a\n");
    assert_eq!(
        plan(&a, &b),
        Plan::Runtime(vec![
            Step::AddServer {
                backend: "be_a".into(),
                server: "n2".into(),
                addr: "10.0.0.2:30080".into(),
                // no-check is refused by `add server`, and means nothing there.
                params: vec!["track".into(), "hafleet_nodes/n2".into()],
            },
            Step::RemoveServer { backend: "be_a".into(), server: "n1".into() },
        ])
    );
}

#[test]
fn a_node_port_or_address_change_is_set_server_addr() {
    let a = bundle(NODES, &[("be_a", &[("n1", "10.0.0.1:30080")])], "x be_a\n");
    let b = bundle(
        &[("n1", "10.0.0.9"), NODES[1]],
        &[("be_a", &[("n1", "[fd00::1]:30081")])],
        "x be_a\n",
    );
    assert_eq!(
        plan(&a, &b),
        Plan::Runtime(vec![
            Step::SetAddr {
                backend: "be_a".into(),
                server: "n1".into(),
                ip: "fd00::1".parse().unwrap(),
                port: 30081
            },
            Step::SetAddr {
                backend: "hafleet_nodes".into(),
                server: "n1".into(),
                ip: "10.0.0.9".parse().unwrap(),
                port: 10256
            },
        ])
    );
}

#[test]
fn map_entries_are_edited_or_replaced_whole_and_the_renamed_map_file_is_not_a_change() {
    let servers: &[(&str, &str)] = &[("n1", "10.0.0.1:30080")];
    let a = bundle(NODES, &[("be_a", servers)], "x be_a\n");
    let b = bundle(NODES, &[("be_a", servers)], "x be_a\ny be_a\n");
    assert_eq!(
        plan(&a, &b),
        Plan::Runtime(vec![Step::EditMap {
            kind: "exact".into(),
            edits: vec![MapEdit::Add { key: "y".into(), value: "be_a".into() }],
            before: 1,
        }])
    );
    let many: String = (0..=map_edits::MAX_MAP_EDITS).map(|i| format!("h{i} be_a\n")).collect();
    let c = bundle(NODES, &[("be_a", servers)], &many);
    assert_eq!(
        plan(&a, &c),
        Plan::Runtime(vec![Step::ReplaceMap { kind: "exact".into(), content: many.clone() }])
    );
    let cmds = commands(
        &[Step::EditMap {
            kind: "exact".into(),
            edits: vec![
                MapEdit::Add { key: "y".into(), value: "be_a".into() },
                MapEdit::Set { key: "x".into(), value: "be_b".into() },
                MapEdit::Del { key: "z".into() },
            ],
            before: 2,
        }],
        &MapRefs { ids: [("exact".to_owned(), "#3".to_owned())].into(), ..MapRefs::default() },
        &CertInputs::default(),
    )
    .unwrap();
    let lines: Vec<&str> = cmds.iter().map(|c| c.line.as_str()).collect();
    assert_eq!(lines, ["add map #3 y be_a", "set map #3 x be_b", "del map #3 z"]);
    assert!(cmds.iter().all(|c| c.payload.is_none() && c.expect == Expect::Empty));
}

/// Lays `check` out next to `bundle`'s maps as on a host and runs the real `haproxy -c`.
fn haproxy_accepts(check: &str, maps: &[MapFile]) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("hafleet-maps")).unwrap();
    for m in maps {
        std::fs::write(dir.path().join(m.name.relative_path()), &m.content).unwrap();
    }
    let file = dir.path().join("haproxy.cfg.hafleet-mapcheck");
    std::fs::write(&file, check).unwrap();
    let out = std::process::Command::new("haproxy")
        .arg("-c")
        .arg("-f")
        .arg(&file)
        .output()
        .expect("haproxy is installed (bash tests/setup.sh)");
    match out.status.success() {
        true => Ok(()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

#[test]
fn a_map_only_version_is_checked_by_loading_its_maps_as_its_config_uses_them() {
    let servers: &[(&str, &str)] = &[("n1", "10.0.0.1:30080")];
    let a = bundle(NODES, &[("be_a", servers)], "x be_a\n");
    let b = bundle(NODES, &[("be_a", servers)], "x be_a\ny be_a\n");
    assert!(files_only(&plan(&a, &b)));
    assert!(files_only(&plan(&a, &a)), "comments only");
    let moved = bundle(NODES, &[("be_a", &[("n2", "10.0.0.2:30080")])], "x be_a\n");
    assert!(!files_only(&plan(&a, &moved)), "servers change: the whole config is checked");
    assert!(!files_only(&Plan::Reload("x".into())));

    let check = map_check_config(&b, &[]).expect("the built-in shape has a quick check");
    for m in &b.maps {
        assert!(check.contains(&m.name.relative_path()), "{check}");
    }
    assert!(check.contains("path,map_str(hafleet-maps/exact-"), "{check}");
    assert!(check.contains("path,map_beg(hafleet-maps/prefix-"), "{check}");
    assert!(check.contains("default-path config"), "{check}");
    // No CA store loaded at each check for an HTTP client it never uses.
    assert!(check.contains("\n    httpclient.ssl.verify none\n"), "{check}");
    haproxy_accepts(&check, &b.maps).unwrap();
    // A map that is not on the host fails the check.
    let err = haproxy_accepts(&check, &b.maps[1..]).unwrap_err();
    assert!(err.contains("exact-"), "{err}");
    // Each converter the config applies is applied: a map read as regexes by a custom
    // template is refused for an entry that is not one.
    let mut regex = b.clone();
    regex.config = regex.config.replace("map_beg(", "map_reg(");
    regex.maps[1].content = "/( be_a\n".into();
    let check = map_check_config(&regex, &[]).unwrap();
    assert!(check.contains("map_reg("), "{check}");
    let err = haproxy_accepts(&check, &regex.maps).unwrap_err();
    assert!(err.contains("regex"), "{err}");
}

#[test]
fn the_whole_config_is_checked_when_its_maps_cannot_be_checked_alone() {
    let b = bundle(NODES, &[("be_a", &[("n1", "10.0.0.1:30080")])], "x be_a\n");
    let mut no_default_path = b.clone();
    no_default_path.config = no_default_path.config.replace("default-path config", "");
    assert_eq!(map_check_config(&no_default_path, &[]), None);
    let mut named_otherwise = b.clone();
    named_otherwise
        .config
        .push_str(&format!("\nfrontend g\n    acl a path -f {}\n", b.maps[0].name.relative_path()));
    assert_eq!(map_check_config(&named_otherwise, &[]), None);
    let mut unused = b.clone();
    unused.config =
        unused.config.replace(&format!("path,map_beg({})", b.maps[1].name.relative_path()), "path");
    assert_eq!(map_check_config(&unused, &[]), None, "a map the config does not name");
}

#[test]
fn backend_names_are_the_headers_parse_reads() {
    let config = "global\n    # backend not_a_header\n#backend commented\n\
                  backend be_a\n    server n1 10.0.0.1:1\n    use_backend be_x\n\
                  backend\tbe_b # trailing\nfrontend f\n    default_backend be_a\n\
                  backends_typo be_c\n";
    let parsed: BTreeSet<&str> = parse(config).unwrap().backends.keys().copied().collect();
    assert_eq!(backend_names(config), parsed);
    assert_eq!(parsed, BTreeSet::from(["be_a", "be_b"]));
    // A backend gone with another section changed: a reload either way, said as the first.
    let servers: &[(&str, &str)] = &[("n1", "10.0.0.1:30080")];
    let two = bundle(NODES, &[("be_a", servers), ("be_b", servers)], "x be_a\n");
    let mut one = bundle(NODES, &[("be_a", servers)], "x be_a\n");
    one.config = one.config.replace("mode http", "mode http\n    timeout client 5s");
    assert!(
        matches!(plan(&two, &one), Plan::Reload(w) if w.contains("0 backend(s) added and 1 removed"))
    );
}

#[test]
fn new_backends_are_served_through_free_spares_ahead_of_their_reload() {
    let servers: &[(&str, &str)] = &[("n1", "10.0.0.1:30080"), ("n2", "10.0.0.2:30081")];
    let spare = |n: &str| (format!("{SPARE_PREFIX}{n}"), Vec::<(&str, &str)>::new());
    let (s0, s1) = (spare("0"), spare("1"));
    let with = |extra: &[(&str, &[(&str, &str)])], exact: &str| {
        let mut all: Vec<(&str, &[(&str, &str)])> = vec![("be_a", servers)];
        all.extend_from_slice(extra);
        all.push((&s0.0, &s0.1));
        all.push((&s1.0, &s1.1));
        bundle(NODES, &all, exact)
    };
    let a = with(&[], "x be_a\n");
    let b = with(&[("be_b", servers)], "x be_a\ny be_b\n");
    let Plan::Bridged { why, bridge } = plan(&a, &b) else { panic!("{:?}", plan(&a, &b)) };
    assert!(why.contains("1 backend(s) added"), "{why}");
    assert_eq!(bridge.spares, [("be_b".to_owned(), s0.0.clone())]);
    let add = |server: &str, addr: &str| Step::AddServer {
        backend: s0.0.clone(),
        server: server.into(),
        addr: addr.into(),
        params: vec!["track".into(), format!("hafleet_nodes/{server}")],
    };
    let replaced = Step::EditMap {
        kind: "exact".into(),
        edits: vec![MapEdit::Add { key: "y".into(), value: s0.0.clone() }],
        before: 1,
    };
    assert_eq!(bridge.steps, [add("n1", "10.0.0.1:30080"), add("n2", "10.0.0.2:30081"), replaced]);
    // Two new backends take the two spares; a third finds none and only reloads.
    let c = with(&[("be_b", servers), ("be_c", servers)], "x be_a\ny be_b\nz be_c\n");
    let Plan::Bridged { bridge, .. } = plan(&a, &c) else { panic!("two spares, two backends") };
    let taken: Vec<&str> = bridge.spares.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(taken, [s0.0.as_str(), s1.0.as_str()]);
    let three = [("be_b", servers), ("be_c", servers), ("be_d", servers)];
    assert!(matches!(plan(&a, &with(&three, "x be_a\n")), Plan::Reload(_)));
    // A spare that has servers (a template's own) is not free.
    let busy = |bundle: &Bundle| {
        let mut busy = bundle.clone();
        busy.config = busy.config.replace(
            &format!("backend {}\n    # a comment\n", s0.0),
            &format!(
                "backend {}\n    server n1 10.0.0.1:1 no-check track hafleet_nodes/n1\n",
                s0.0
            ),
        );
        busy
    };
    let (busy, busy_next) = (busy(&a), busy(&b));
    let Plan::Bridged { bridge, .. } = plan(&busy, &busy_next) else { panic!("spare 1 is free") };
    assert_eq!(bridge.spares, [("be_b".to_owned(), s1.0.clone())]);
    // The running process is asked whether the spares are empty: one that lists a server,
    // or an answer that is no list, keeps the bridge from going on.
    let head = "1\n# be_id be_name srv_id srv_name srv_addr\n";
    let Plan::Bridged { bridge, .. } = plan(&a, &c) else { unreachable!() };
    let shows: Vec<String> = spare_checks(&bridge).iter().map(|c| c.line.clone()).collect();
    assert_eq!(shows, ["show servers state hafleet_spare_0", "show servers state hafleet_spare_1"]);
    assert_eq!(busy_spare(&bridge, &[head, head]), None);
    let held = format!("{head}7 hafleet_spare_1 1 n1 10.0.0.1 2 0 1 1 3 6 3 4 6 0 0 0 - 30080\n");
    assert_eq!(busy_spare(&bridge, &[head, held.as_str()]), Some("hafleet_spare_1"));
    assert_eq!(busy_spare(&bridge, &[head, "Can't find backend.\n"]), Some("hafleet_spare_1"));
    assert_eq!(busy_spare(&bridge, &[head]), Some("hafleet_spare_1"));
    let (adds, maps) = split_bridge(&bridge.steps);
    assert!(adds.iter().all(|s| matches!(s, Step::AddServer { .. })) && adds.len() == 4);
    assert!(matches!(maps.as_slice(), [Step::EditMap { .. }]));
    // A new backend whose header says more than its name (`from`, a template's own).
    let mut from = b.clone();
    from.config = from.config.replace("backend be_b\n", "backend be_b from other\n");
    assert!(matches!(plan(&a, &from), Plan::Reload(_)));
    // No spares, a backend removed, or a new backend whose settings differ from a spare's:
    // a reload alone.
    let plain = bundle(NODES, &[("be_a", servers)], "x be_a\n");
    let plain_b = bundle(NODES, &[("be_a", servers), ("be_b", servers)], "x be_a\n");
    assert!(matches!(plan(&plain, &plain_b), Plan::Reload(_)));
    let swapped =
        with(&[("be_b", servers)], "y be_b\n").config.replace("backend be_a\n", "backend be_z\n");
    let swapped = Bundle { config: swapped, ..b.clone() };
    assert!(matches!(plan(&a, &swapped), Plan::Reload(_)));
    let mut balanced = b.clone();
    balanced.config =
        balanced.config.replace("backend be_b\n", "backend be_b\n    balance leastconn\n");
    assert!(matches!(plan(&a, &balanced), Plan::Reload(_)));
    // A passthrough route's backend (TCP) is never served through a spare (HTTP): the TLS
    // bytes would be read as requests.
    let mut tcp = b.clone();
    tcp.config = tcp.config.replace("backend be_b\n", "backend be_b\n    mode tcp\n");
    assert!(matches!(plan(&a, &tcp), Plan::Reload(_)));
    // Servers that check their own health (a new Service in pods mode) are added to the spare
    // with their check.
    let mut checked = b.clone();
    checked.config = checked.config.replace(
        "server n1 10.0.0.1:30080 no-check track hafleet_nodes/n1\n    server n2 10.0.0.2:30081 no-check track hafleet_nodes/n2\n\nbackend hafleet_spare_0",
        "server n1 10.0.0.1:30080\n\nbackend hafleet_spare_0",
    );
    assert_ne!(checked.config, b.config);
    let Plan::Bridged { bridge, .. } = plan(&a, &checked) else { panic!("bridged") };
    let checks = |s: &Step| matches!(s, Step::AddServer { params, .. } if params[0] == "check");
    assert!(bridge.steps.iter().any(checks), "{:?}", bridge.steps);
}

#[test]
fn new_backends_other_lines_and_unknown_server_settings_need_a_reload() {
    let servers: &[(&str, &str)] = &[("n1", "10.0.0.1:30080")];
    let a = bundle(NODES, &[("be_a", servers)], "x be_a\n");
    let added = bundle(NODES, &[("be_a", servers), ("be_b", servers)], "x be_a\n");
    assert!(matches!(plan(&a, &added), Plan::Reload(w) if w.contains("1 backend(s) added")));
    let mut timeout = a.clone();
    timeout.config = timeout.config.replace("mode http", "mode http\n    timeout client 5s");
    assert!(matches!(plan(&a, &timeout), Plan::Reload(w) if w.contains("other than a backend")));
    let mut balance = a.clone();
    balance.config.push_str("    balance source\n");
    assert!(matches!(plan(&a, &balance), Plan::Reload(w) if w.contains("beyond its servers")));
    let mut maxconn = a.clone();
    maxconn.config = maxconn.config.replace("no-check track", "maxconn 5 no-check track");
    assert!(matches!(plan(&a, &maxconn), Plan::Reload(w) if w.contains("beyond its address")));
    // A server added at runtime inherits no default-server: one that sets more than check
    // timings makes an added server different from the file's.
    let moved = bundle(NODES, &[("be_a", &[("n2", "10.0.0.2:30080")])], "x be_a\n");
    let mut a_maxconn = a.clone();
    let mut moved_maxconn = moved.clone();
    for b in [&mut a_maxconn, &mut moved_maxconn] {
        b.config = b.config.replace("rise 2", "rise 2 maxconn 10");
    }
    assert!(matches!(plan(&a_maxconn, &moved_maxconn), Plan::Reload(w) if w.contains("maxconn")));
    assert!(matches!(plan(&a, &moved), Plan::Runtime(_)));
}

#[test]
fn weights_are_set_and_a_weight_removed_goes_back_to_one() {
    let a = bundle(NODES, &[("be_a", &[("n1", "10.0.0.1:30080")])], "x be_a\n");
    let mut b = a.clone();
    b.config = b.config.replace("no-check track", "weight 7 no-check track");
    let set = |weight| {
        Plan::Runtime(vec![Step::SetWeight { backend: "be_a".into(), server: "n1".into(), weight }])
    };
    assert_eq!(plan(&a, &b), set(7));
    assert_eq!(plan(&b, &a), set(1));
}

#[test]
fn commands_chunk_map_payloads_and_name_the_prepared_version() {
    let content: String = (0..2000).map(|i| format!("host{i}.example.com/ be_a\n")).collect();
    let steps = vec![
        Step::AddServer {
            backend: "be_a".into(),
            server: "n2".into(),
            addr: "10.0.0.2:30080".into(),
            params: vec!["track".into(), "hafleet_nodes/n2".into()],
        },
        Step::ReplaceMap { kind: "prefix".into(), content: content.clone() },
    ];
    let maps = MapRefs {
        prepared: PreparedMaps::from([("prefix".to_owned(), "@4 #1".to_owned())]),
        ..MapRefs::default()
    };
    let cmds = commands(&steps, &maps, &CertInputs::default()).unwrap();
    assert_eq!(cmds[0].line, "add server be_a/n2 10.0.0.2:30080 track hafleet_nodes/n2");
    assert_eq!(cmds[1].line, "enable server be_a/n2");
    let adds: Vec<&Command> = cmds.iter().filter(|c| c.payload.is_some()).collect();
    assert!(adds.len() > 1, "{} bytes in one payload", content.len());
    assert!(adds.iter().all(|c| c.line == "add map @4 #1"));
    assert!(adds.iter().all(|c| c.payload.as_ref().unwrap().len() <= MAP_PAYLOAD_BYTES));
    let sent: String = adds.iter().map(|c| c.payload.as_ref().unwrap().as_str()).collect();
    assert_eq!(sent, content, "every entry once, in order");
    assert_eq!(cmds.last().unwrap().line, "commit map @4 #1");
    assert!(
        commands(&steps, &MapRefs::default(), &CertInputs::default()).is_err(),
        "an unprepared map"
    );
}

// Captured from HAProxy 2.6.12's master CLI: `prompt`, `set server … state maint` (empty
// answer), `add map #1 <<` with one entry, `show map #1`, `set server … state ready`, `quit`.
const SESSION: &str = "master> \nmaster> + + \nmaster> 0x562c94e2bc40 x y\n0x562c94e2bce0 z w\n0x7f39f804ced0 q r\n\nmaster> \nmaster> master> ";

#[test]
fn a_session_s_answers_are_told_apart_by_the_prompt() {
    let got = answers(SESSION, 4);
    assert_eq!(got.len(), 4);
    assert_eq!(got[0], "");
    assert_eq!(got[1], "+ + ");
    assert!(got[2].starts_with("0x562c94e2bc40 x y\n"));
    assert_eq!(got[3], "");
    let empty = Command::new("x".into(), Expect::Empty);
    assert!(empty.accepted(got[1]), "payload prompts are not an answer");
    assert!(!empty.accepted("No such server.\n"));
    // A connection that closed early leaves commands unanswered.
    let mut cmds = vec![empty.clone(); 6];
    cmds[2].expect = Expect::Anything;
    assert_eq!(first_refused(&cmds[..4], &got), None);
    assert_eq!(first_refused(&cmds, &answers(SESSION, 6)), Some(("x", "no answer".into())));
    cmds[2].expect = Expect::Empty;
    assert!(first_refused(&cmds, &got).unwrap().1.starts_with("0x562c94e2bc40 x y"));
    assert!(answers("", 2).is_empty());
}

#[test]
fn sessions_prefix_the_worker_and_end_payloads_with_a_blank_line() {
    let cmds = vec![
        Command::new("set server a/b state maint".into(), Expect::Empty),
        Command {
            line: "add map @2 #0".into(),
            payload: Some(String::from("k v\n").into()),
            expect: Expect::Empty,
        },
    ];
    assert_eq!(
        session(42, &cmds).as_str(),
        "prompt\n@!42 set server a/b state maint\n@!42 add map @2 #0 <<\nk v\n\nquit\n"
    );
}

#[test]
fn maps_are_found_by_kind_under_the_name_they_were_loaded_with() {
    let show = "# id (file) description\n0 (hafleet-maps/exact-4842e04a7cca046ba124389aaebf24e07c6d1d810cf0823f5987f9be078eb896.map) pattern loaded from file 'x' used by map at file '/h/haproxy.cfg' line 36. curr_ver=0 next_ver=0 entry_cnt=1\n1 (hafleet-maps/prefix-852c4d26aa55d2ce637764c67c70f3d609789212de358fd5ab22aeff36f26f5c.map) pattern loaded from file 'y' used by map. curr_ver=0 next_ver=0 entry_cnt=3\n\n";
    let ids = map_ids(show, &["prefix", "exact"]).unwrap();
    assert_eq!(ids["exact"], "#0");
    assert_eq!(ids["prefix"], "#1");
    assert!(map_ids(show, &["host"]).is_none());
    assert_eq!(prepared_version("New version created: 3\n"), Some(3));
    assert_eq!(prepared_version("Unknown map identifier."), None);
    let ids: BTreeMap<String, String> = [("exact".into(), "#1".into())].into();
    let prepared = prepared_maps(ids.clone(), &["New version created: 3\n"]).unwrap();
    assert_eq!(prepared["exact"], "@3 #1");
    let steps = [
        Step::ReplaceMap { kind: "prefix".into(), content: String::new() },
        Step::EditMap { kind: "exact".into(), edits: vec![], before: 1 },
    ];
    let placeholders = map_placeholders(&steps);
    assert_eq!(placeholders.prepared["prefix"], "{map:prefix}");
    assert_eq!(placeholders.ids["exact"], "{mapid:exact}");
    // Found together: the one replaced whole is to be prepared, the one edited addressed.
    let (to_prepare, refs) = locate_maps(show, &steps).unwrap();
    assert_eq!(to_prepare, BTreeMap::from([("prefix".to_owned(), "#1".to_owned())]));
    assert_eq!(refs.ids, BTreeMap::from([("exact".to_owned(), "#0".to_owned())]));
    // A map edited that does not hold the entries its edits start from is not edited.
    let steps = [Step::EditMap { kind: "prefix".into(), edits: vec![], before: 2 }];
    assert_eq!(miscounted(show, &edited_maps(&steps)), Some(("prefix", Some(3))));
    assert!(locate_maps(show, &steps).unwrap_err().contains("holds Some(3) entries"));
    let uncounted = show.replace(" entry_cnt=3", "");
    let steps = [Step::EditMap { kind: "prefix".into(), edits: vec![], before: 3 }];
    assert!(locate_maps(show, &steps).is_ok());
    assert!(locate_maps(&uncounted, &steps).is_err(), "a count not said is not the one expected");
    assert!(prepared_maps(ids.clone(), &["Unknown map identifier."]).is_err());
    assert!(prepared_maps(ids, &[] as &[&str]).is_err(), "an answer missing");
}

/// A bundle with an HTTPS bind whose crt-list is `crt_list`.
fn tls_bundle(crt_list: &str) -> Bundle {
    let name = MapName::for_content("crtlist", crt_list).unwrap();
    let config = format!(
        "global\n    default-path config\n\nfrontend f\n    bind :443 ssl crt-list {} strict-sni\n",
        name.relative_path()
    );
    Bundle::new(config, vec![MapFile { name, content: crt_list.into() }], vec![])
}

#[test]
fn a_rotated_certificate_is_loaded_listed_and_the_old_one_unlisted_without_a_reload() {
    let old =
        tls_bundle("hafleet-certs/aa.pem a.example.com\nhafleet-certs/bb.pem b.example.com\n");
    let new =
        tls_bundle("hafleet-certs/bb.pem b.example.com\nhafleet-certs/cc.pem a.example.com\n");
    let Plan::Runtime(steps) = plan(&old, &new) else { panic!("{:?}", plan(&old, &new)) };
    assert_eq!(
        steps,
        vec![
            Step::AddCert {
                path: "hafleet-certs/cc.pem".into(),
                filters: vec!["a.example.com".into()]
            },
            Step::RemoveCert { path: "hafleet-certs/aa.pem".into() },
        ]
    );
    assert!(files_only(&Plan::Runtime(steps.clone())), "checked by loading the new file");
    let mut inputs =
        CertInputs { crt_list: "hafleet-maps/crtlist-x.map".into(), ..Default::default() };
    assert!(commands(&steps, &MapRefs::default(), &inputs).is_err(), "no file, no commands");
    let pem = "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n-----BEGIN EC PRIVATE KEY-----\nSECRET\n-----END EC PRIVATE KEY-----\n";
    inputs.files.insert("hafleet-certs/cc.pem".into(), zeroize::Zeroizing::new(pem.into()));
    let cmds = commands(&steps, &MapRefs::default(), &inputs).unwrap();
    let lines: Vec<&str> = cmds.iter().map(|c| c.line.as_str()).collect();
    assert_eq!(
        lines,
        [
            "new ssl cert hafleet-certs/cc.pem",
            "set ssl cert hafleet-certs/cc.pem",
            "commit ssl cert hafleet-certs/cc.pem",
            "add ssl crt-list hafleet-maps/crtlist-x.map",
            "del ssl crt-list hafleet-maps/crtlist-x.map hafleet-certs/aa.pem",
            "del ssl cert hafleet-certs/aa.pem",
        ]
    );
    assert_eq!(
        cmds[3].payload.as_ref().map(|p| p.as_str()),
        Some("hafleet-certs/cc.pem a.example.com\n")
    );
    // Each payload ends in a newline, so the session's empty line ends it.
    assert!(cmds.iter().filter_map(|c| c.payload.as_deref()).all(|p| p.ends_with('\n')));
    assert!(session(7, &cmds).contains("-----END EC PRIVATE KEY-----\n\n@!7 commit ssl cert"));
    assert!(cmds[1].payload.as_deref().unwrap().contains("SECRET"));
    assert!(!format!("{cmds:?}").contains("SECRET"), "Debug hides the key");
    assert!(!format!("{inputs:?}").contains("SECRET"));
    // The answers HAProxy 2.6 gives (seen on its master CLI).
    assert!(cmds[0].accepted("New empty certificate store 'hafleet-certs/cc.pem'!\n"));
    assert!(cmds[1].accepted("+ + Transaction created for certificate hafleet-certs/cc.pem!\n"));
    assert!(cmds[2].accepted("Committing hafleet-certs/cc.pem\nSuccess!\n"));
    assert!(!cmds[2].accepted("Committing hafleet-certs/cc.pem\nError: bad key\n"));
    assert!(
        cmds[3].accepted(
            "+ Inserting certificate 'hafleet-certs/cc.pem' in crt-list 'x'.\nSuccess!\n"
        )
    );
    assert!(cmds[4].accepted("Entry 'hafleet-certs/aa.pem' deleted in crtlist 'x'!\n"));
}

#[test]
fn certificates_that_change_hosts_or_https_turned_on_need_a_reload() {
    let a = tls_bundle("hafleet-certs/aa.pem a.example.com\n");
    let more_hosts = tls_bundle("hafleet-certs/aa.pem a.example.com b.example.com\n");
    assert!(matches!(plan(&a, &more_hosts), Plan::Reload(why) if why.contains("other hosts")));
    let plain = Bundle::new("global\n    default-path config\n".into(), vec![], vec![]);
    assert!(matches!(plan(&plain, &a), Plan::Reload(_)));
    assert_eq!(plan(&a, &a), Plan::Nothing);
}

/// The runtime API adds and deletes crt-list entries by certificate: one the renderer
/// split over several lines (more hosts than a line holds) is reloaded instead.
#[test]
fn a_certificate_on_several_crt_list_lines_is_reloaded_not_changed_at_runtime() {
    let one = tls_bundle("hafleet-certs/aa.pem a.com\n");
    let split = tls_bundle("hafleet-certs/aa.pem a.com\nhafleet-certs/aa.pem b.com\n");
    let err = cert_steps(&one, &split).unwrap_err();
    assert!(err.contains("several crt-list lines"), "{err}");
    assert!(cert_steps(&split, &one).is_err());
    assert!(cert_steps(&one, &one).is_ok());
    // Left as it is, it changes nothing: another certificate still goes in at runtime.
    let more = tls_bundle(
        "hafleet-certs/aa.pem a.com\nhafleet-certs/aa.pem b.com\nhafleet-certs/bb.pem c.com\n",
    );
    let (adds, removes) = cert_steps(&split, &more).unwrap();
    assert_eq!(adds.len(), 1, "{adds:?}");
    assert!(removes.is_empty());
    assert!(cert_steps(&more, &split).is_ok(), "bb removed at runtime");
    assert!(cert_steps(&more, &tls_bundle("hafleet-certs/bb.pem c.com\n")).is_err());
}

#[test]
fn the_running_crt_list_is_the_one_hafleet_named() {
    let name = MapName::for_content("crtlist", "x").unwrap().relative_path();
    assert_eq!(running_crt_list(&format!("{name}\n")), Some(name.clone()));
    assert_eq!(running_crt_list("/etc/haproxy/other.list\n"), None);
    assert_eq!(running_crt_list(&format!("{name}\n{name}\n")), None);
}

#[test]
fn a_tls_fleet_keeps_the_map_only_check() {
    let mut b = tls_bundle("hafleet-certs/aa.pem a.example.com\n");
    let exact = MapFile {
        name: MapName::for_content("exact", "a.example.com/ be_a\n").unwrap(),
        content: "a.example.com/ be_a\n".into(),
    };
    b.config.push_str(&format!(
        "    http-request set-var(txn.b) path,map_str({})\n",
        exact.name.relative_path()
    ));
    b.maps.push(exact.clone());
    let check = map_check_config(&b, &[]).expect("the crt-list does not stop the map-only check");
    assert!(check.contains(&format!("map_str({})", exact.name.relative_path())), "{check}");
    assert!(!check.contains("crt-list") && !check.contains("crtlist-"), "{check}");
    // A rotation: only the new file is loaded, as a crt-list line loads it.
    let check = map_check_config(&b, &["hafleet-certs/cc.pem"]).unwrap();
    assert!(check.ends_with("bind 127.0.0.1:2 ssl crt hafleet-certs/cc.pem\n"), "{check}");
    assert!(!check.contains("aa.pem"), "{check}");
    assert_eq!(map_check_config(&b, &["../etc/x.pem"]), None);
}

/// The check of new certificate files, run by the real `haproxy -c` on real files: a
/// hundred files pass (HAProxy reads at most 64 words a line), a key that is not the
/// certificate's fails.
#[test]
fn haproxy_checks_new_certificate_files_alone() {
    let dir = tempfile::tempdir().unwrap();
    let b = tls_bundle("hafleet-certs/c0.pem a.example.com\n");
    std::fs::create_dir(dir.path().join(hafleet_proto::MAPS_DIR)).unwrap();
    std::fs::write(dir.path().join(b.maps[0].name.relative_path()), &b.maps[0].content).unwrap();
    let certs = dir.path().join(hafleet_proto::tls::CERTS_DIR);
    std::fs::create_dir(&certs).unwrap();
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl").args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let key = |name: &str| {
        let path = certs.join(name).to_str().unwrap().to_owned();
        openssl(&["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", &path]);
        std::fs::read_to_string(&path).unwrap()
    };
    let (k1, k2) = (key("k1"), key("k2"));
    let crt = certs.join("crt").to_str().unwrap().to_owned();
    let k1_path = certs.join("k1").to_str().unwrap().to_owned();
    openssl(&["req", "-x509", "-new", "-key", &k1_path, "-out", &crt, "-subj", "/CN=a"]);
    let crt = std::fs::read_to_string(&crt).unwrap();
    let paths: Vec<String> = (0..100).map(|i| format!("hafleet-certs/c{i}.pem")).collect();
    for p in &paths {
        std::fs::write(dir.path().join(p), format!("{crt}{k1}")).unwrap();
    }
    let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
    let check = dir.path().join("check.cfg");
    std::fs::write(&check, map_check_config(&b, &refs).unwrap()).unwrap();
    let haproxy_c = || {
        std::process::Command::new("/usr/sbin/haproxy")
            .arg("-c")
            .arg("-f")
            .arg(&check)
            .output()
            .expect("haproxy (tests/setup.sh installs it)")
    };
    let out = haproxy_c();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(dir.path().join(&paths[57]), format!("{crt}{k2}")).unwrap();
    assert!(!haproxy_c().status.success(), "a key of another certificate");
}

/// What the running process serves, as far as a plan can change it: each backend's servers
/// and their addresses, and each map's content.
type Served = (BTreeMap<(String, String), String>, BTreeMap<String, BTreeMap<String, String>>);

fn served(b: &Bundle) -> Served {
    let mut servers = BTreeMap::new();
    let mut backend = String::new();
    for line in b.config.lines() {
        if let Some(name) = line.strip_prefix("backend ") {
            backend = name.to_owned();
        } else if let ["server", name, addr, ..] =
            line.split_whitespace().collect::<Vec<_>>().as_slice()
        {
            servers.insert((backend.clone(), (*name).to_owned()), (*addr).to_owned());
        }
    }
    let maps = b
        .maps
        .iter()
        .map(|m| (m.name.kind().to_owned(), map_edits::entry_map(&m.content)))
        .collect();
    (servers, maps)
}

/// `steps` carried out on what `served` describes, as HAProxy carries them out.
fn carried_out((mut servers, mut maps): Served, steps: &[Step]) -> Served {
    for step in steps {
        match step {
            Step::SetAddr { backend, server, ip, port } => {
                servers.insert((backend.clone(), server.clone()), format!("{ip}:{port}"));
            }
            Step::AddServer { backend, server, addr, .. } => {
                servers.insert((backend.clone(), server.clone()), addr.clone());
            }
            Step::RemoveServer { backend, server } => {
                servers.remove(&(backend.clone(), server.clone()));
            }
            Step::ReplaceMap { kind, content } => {
                maps.insert(kind.clone(), map_edits::entry_map(content));
            }
            Step::EditMap { kind, edits, before } => {
                let map = maps.get_mut(kind).expect("a map of each kind");
                assert_eq!(map.len(), *before, "the entries the edits start from");
                let content: String = map.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
                *map = map_edits::carried_out(&content, edits);
            }
            other => panic!("no certificates here: {other:?}"),
        }
    }
    (servers, maps)
}

proptest::proptest! {
    /// Between two configs of the same backends (servers moved, added, removed, re-addressed;
    /// maps changed), the plan needs no reload, and its steps carried out on what the loaded
    /// config serves give what the next one serves.
    #[test]
    fn a_runtime_plan_carried_out_on_the_loaded_bundle_gives_the_next(
        a in proptest::collection::vec(proptest::collection::btree_map(0usize..4, 0u16..3, 0..4), 2),
        b in proptest::collection::vec(proptest::collection::btree_map(0usize..4, 0u16..3, 0..4), 2),
        maps in (0usize..4, 0usize..4),
    ) {
        const NODES4: &[(&str, &str)] =
            &[("n1", "10.0.0.1"), ("n2", "10.0.0.2"), ("n3", "10.0.0.3"), ("n4", "10.0.0.4")];
        // The last has more entries than are edited one by one.
        let many: String = (0..20).map(|i| format!("h{i} be_b\n")).collect();
        let exact: [&str; 4] = ["", "x be_a\n", "x be_a\ny be_b\n", &many];
        let make = |drawn: &[BTreeMap<usize, u16>], exact: &str| {
            let servers: Vec<Vec<(&str, String)>> = drawn
                .iter()
                .map(|b| {
                    b.iter()
                        .map(|(n, p)| (NODES4[*n].0, format!("{}:{}", NODES4[*n].1, 30080 + p)))
                        .collect()
                })
                .collect();
            let refs: Vec<Vec<(&str, &str)>> = servers
                .iter()
                .map(|s| s.iter().map(|(n, a)| (*n, a.as_str())).collect())
                .collect();
            bundle(NODES4, &[("be_a", &refs[0]), ("be_b", &refs[1])], exact)
        };
        let (loaded, next) = (make(&a, exact[maps.0]), make(&b, exact[maps.1]));
        match plan(&loaded, &next) {
            Plan::Nothing => proptest::prop_assert_eq!(served(&loaded), served(&next)),
            Plan::Runtime(steps) => {
                proptest::prop_assert_eq!(carried_out(served(&loaded), &steps), served(&next));
            }
            other => proptest::prop_assert!(false, "needs no reload, planned {other:?}"),
        }
    }
}

/// `bundle` with one more backend, `be_pods`, whose servers (name, ip:port, extra parameters)
/// check themselves, as the renderer writes pods mode's.
fn with_pods(base: &Bundle, servers: &[(&str, &str)]) -> Bundle {
    let mut b = base.clone();
    b.config.push_str("\nbackend be_pods\n    option httpchk GET /healthz\n");
    for (addr, extra) in servers {
        b.config.push_str(&format!("    server {addr} {addr}{extra}\n"));
    }
    b
}

#[test]
fn a_pod_that_checks_itself_is_added_at_runtime_with_the_check_it_would_inherit() {
    let base = bundle(NODES, &[("be_a", &[("n1", "10.0.0.1:30080")])], "x be_a\n");
    let a = with_pods(&base, &[("10.2.0.1:8080", ""), ("10.2.0.2:8080", "")]);
    let b = with_pods(
        &base,
        &[("10.2.0.1:8080", " weight 0"), ("10.2.0.3:8080", " maxconn 100 send-proxy-v2")],
    );
    let Plan::Runtime(steps) = plan(&a, &b) else { panic!("pod churn needs no reload") };
    assert_eq!(
        steps,
        vec![
            Step::AddServer {
                backend: "be_pods".into(),
                server: "10.2.0.3:8080".into(),
                addr: "10.2.0.3:8080".into(),
                // What `default-server` would have given it, spelt out.
                params: ["maxconn", "100", "send-proxy-v2", "check", "fall", "2", "inter", "2s"]
                    .into_iter()
                    .chain(["rise", "2"])
                    .map(String::from)
                    .collect(),
            },
            // Draining: no new requests.
            Step::SetWeight {
                backend: "be_pods".into(),
                server: "10.2.0.1:8080".into(),
                weight: 0
            },
            Step::RemoveServer { backend: "be_pods".into(), server: "10.2.0.2:8080".into() },
        ]
    );
    let sent: Vec<String> = commands(&steps, &MapRefs::default(), &CertInputs::default())
        .unwrap()
        .iter()
        .map(|c| c.line.clone())
        .collect();
    let add = sent.iter().position(|l| l.starts_with("add server be_pods/10.2.0.3:8080 ")).unwrap();
    assert_eq!(
        sent[add + 1..add + 3],
        ["enable health be_pods/10.2.0.3:8080", "enable server be_pods/10.2.0.3:8080"],
        "its check started, then it serves"
    );
    // Back to ready: weight 1 again.
    let Plan::Runtime(steps) = plan(&b, &with_pods(&base, &[("10.2.0.1:8080", "")])) else {
        panic!("no reload")
    };
    assert!(steps.contains(&Step::SetWeight {
        backend: "be_pods".into(),
        server: "10.2.0.1:8080".into(),
        weight: 1
    }));
}

#[test]
fn a_server_other_servers_track_or_with_options_add_server_lacks_needs_a_reload() {
    let base = bundle(NODES, &[("be_a", &[("n1", "10.0.0.1:30080")])], "x be_a\n");
    let a = with_pods(&base, &[]);
    let sticky = with_pods(&base, &[("10.2.0.1:8080", " cookie 10.2.0.1:8080")]);
    let Plan::Reload(why) = plan(&a, &sticky) else { panic!("add server takes no cookie") };
    assert!(why.contains("it sets cookie"), "{why}");
    // A node is checked once and tracked by others: HAProxy cannot track a server added at
    // runtime, so a new node is a reload.
    let one = bundle(&NODES[..1], &[("be_a", &[("n1", "10.0.0.1:30080")])], "x be_a\n");
    let two = bundle(
        NODES,
        &[("be_a", &[("n1", "10.0.0.1:30080"), ("n2", "10.0.0.2:30080")])],
        "x be_a\n",
    );
    let Plan::Reload(why) = plan(&one, &two) else { panic!("a tracked server is a reload") };
    assert!(why.contains("hafleet_nodes/n2") && why.contains("track"), "{why}");
}
