//! Tests of [`super`]: its behaviour, apart from its code.

use super::*;
use hafleet_proto::{NodesUpdate, ObjectName, RouteEvent, RoutesSnapshot, SCHEMA_VERSION};

#[test]
fn messages_of_an_older_watcher_epoch_are_fenced_off() {
    let mut desired = Desired::new();
    let mut out = Applied::default();
    let nodes = |epoch| {
        RouteMessage::Nodes(NodesUpdate {
            schema: SCHEMA_VERSION,
            epoch,
            nodes: vec![NodeAddr {
                name: ObjectName::new("n1").unwrap(),
                addr: "127.0.0.2".parse().unwrap(),
            }],
            cluster: None,
        })
    };
    apply_unguarded(&mut desired, 1, &nodes(10), &mut out);
    assert_eq!(desired.epoch(None), 10);
    assert!(out.writes.contains(&StateWrite::Epoch(None, 10)));
    let before = desired.clone();
    let mut out = Applied::default();
    let stale = RouteMessage::Snapshot(RoutesSnapshot {
        schema: SCHEMA_VERSION,
        epoch: 9,
        live: vec![],
        keep: vec![],
        cluster: None,
        parts: vec![],
    });
    apply_unguarded(&mut desired, 2, &stale, &mut out);
    assert_eq!(desired, before, "an older watcher's sweep changes nothing");
    assert_eq!(out.fenced, vec![(9, 10)]);
    assert!(out.writes.is_empty() && out.causes.is_empty());
    let mut out = Applied::default();
    apply_unguarded(&mut desired, 3, &nodes(11), &mut out);
    assert_eq!(
        (desired.epoch(None), out.writes.as_slice()),
        (11, &[StateWrite::Epoch(None, 11)][..])
    );
}

fn east() -> ClusterId {
    ClusterId::new("east").unwrap()
}

/// Ingress `name` of cluster `cluster` (an upsert of one route to Service `s` there), at
/// watcher epoch `epoch`.
fn clustered(name: &str, cluster: Option<&ClusterId>, epoch: u64) -> RouteMessage {
    let mut route = crate::core::model::tests::route(
        Some("a.example"),
        "/",
        hafleet_proto::PathKind::Prefix,
        "s",
    );
    route.backend.service.cluster = cluster.cloned();
    let upsert = RouteChange::Upsert { routes: vec![route], tls: vec![] };
    match event(name, upsert) {
        RouteMessage::Event(e) => {
            RouteMessage::Event(RouteEvent { ingress: e.ingress.in_cluster(cluster), epoch, ..e })
        }
        _ => unreachable!(),
    }
}

/// Two clusters feed one fleet: each has its own epochs, nodes, Ingresses (the same
/// namespace/name in both is two Ingresses) and snapshots, which sweep its own only; its
/// guard counts its own routes.
#[test]
fn each_cluster_fences_sweeps_and_holds_its_own_part_of_a_fleet() {
    let east = east();
    let mut d = Desired::new();
    let mut out = Applied::default();
    // The unnamed cluster's watcher runs at a later epoch than east's: east is not fenced.
    for i in 0..12 {
        apply_unguarded(&mut d, i + 1, &clustered(&format!("w{i}"), None, 50), &mut out);
    }
    apply_unguarded(&mut d, 20, &clustered("w0", Some(&east), 7), &mut out);
    apply_unguarded(&mut d, 21, &clustered("e1", Some(&east), 7), &mut out);
    assert!(out.fenced.is_empty(), "{:?}", out.fenced);
    assert_eq!((d.epoch(None), d.epoch(Some(&east))), (50, 7));
    assert_eq!(d.ingresses(&fleet()).len(), 14, "default/w0 of each cluster is its own");
    // Nodes: each cluster's set replaces its own.
    let nodes = |cluster: Option<&ClusterId>, names: &[&str]| {
        RouteMessage::Nodes(NodesUpdate {
            schema: SCHEMA_VERSION,
            epoch: if cluster.is_some() { 7 } else { 50 },
            cluster: cluster.cloned(),
            nodes: names
                .iter()
                .map(|n| NodeAddr {
                    name: ObjectName::new(*n).unwrap(),
                    addr: "127.0.0.2".parse().unwrap(),
                })
                .collect(),
        })
    };
    apply_unguarded(&mut d, 22, &nodes(None, &["n1", "n2"]), &mut out);
    let mut out = Applied::default();
    apply_unguarded(&mut d, 23, &nodes(Some(&east), &["n1"]), &mut out);
    assert_eq!((d.nodes[&None].len(), d.nodes[&Some(east.clone())].len()), (2, 1));
    assert_eq!(out.causes[&fleet()][0].added, ["n1@east (127.0.0.2)"]);
    // East's older epoch is fenced within east only.
    let mut out = Applied::default();
    apply_unguarded(&mut d, 24, &clustered("e2", Some(&east), 6), &mut out);
    assert_eq!(out.fenced, [(6, 7)]);
    // East's snapshot, empty (its API server restored from an empty backup): it would
    // withdraw both its Ingresses, all of its routes though 2 of the fleet's 14: held,
    // and the unnamed cluster's twelve are not touched.
    let guard = SweepGuard { percent: 50, min_routes: 2 };
    let empty = RouteMessage::Snapshot(RoutesSnapshot {
        schema: SCHEMA_VERSION,
        epoch: 7,
        live: vec![],
        keep: vec![],
        cluster: Some(east.clone()),
        parts: vec![],
    });
    let mut out = Applied::default();
    apply(&mut d, 25, &empty, &guard, &mut out);
    assert_eq!(d.ingresses(&fleet()).len(), 14);
    let hold = (fleet(), Some(east.clone()));
    let held = &d.held[&hold];
    assert_eq!((held.ingresses.len(), held.fleet_routes), (2, 2));
    assert_eq!(held.cluster.as_ref(), Some(&east));
    assert!(held.ingresses.iter().all(|(k, _)| k.is_in(Some(&east))));
    // The unnamed cluster's snapshot that lists its own sweeps nothing of east's, and
    // leaves east's hold alone.
    let own: Vec<_> = d
        .ingresses(&fleet())
        .keys()
        .filter(|k| k.is_in(None))
        .map(|k| (fleet(), k.clone()))
        .collect();
    let snap = RouteMessage::Snapshot(RoutesSnapshot {
        schema: SCHEMA_VERSION,
        epoch: 50,
        live: own,
        keep: vec![],
        cluster: None,
        parts: vec![],
    });
    let mut out = Applied::default();
    apply(&mut d, 26, &snap, &guard, &mut out);
    assert!(out.causes.is_empty() && d.held.contains_key(&hold));
    // Released by a confirm of east's hold: east's two go, nobody else's.
    let confirm = RouteMessage::Confirm(hafleet_proto::SweepConfirm {
        schema: SCHEMA_VERSION,
        epoch: 7,
        fleet: fleet(),
        snapshot_seq: 25,
        by: "operator".into(),
        cluster: Some(east.clone()),
    });
    let mut out = Applied::default();
    apply(&mut d, 27, &confirm, &guard, &mut out);
    assert!(d.held.is_empty());
    assert_eq!(d.ingresses(&fleet()).len(), 12);
    assert!(d.ingresses(&fleet()).keys().all(|k| k.is_in(None)));
}

/// [`apply`] with the default guard.
fn apply_unguarded(d: &mut Desired, seq: u64, msg: &RouteMessage, out: &mut Applied) {
    apply(d, seq, msg, &SweepGuard::default(), out);
}

fn fleet() -> FleetName {
    FleetName::new("edge").unwrap()
}

fn event(name: &str, change: RouteChange) -> RouteMessage {
    RouteMessage::Event(RouteEvent {
        schema: SCHEMA_VERSION,
        fleet: fleet(),
        ingress: IngressKey::new("default", name).unwrap(),
        created_unix: 1,
        resource_version: "1".into(),
        change,
        epoch: 1,
    })
}

#[test]
fn upsert_then_delete_round_trips_to_empty() {
    let mut d = Desired::new();
    let mut out = Applied::default();
    apply_unguarded(
        &mut d,
        1,
        &event("a", RouteChange::Upsert { routes: vec![], tls: vec![] }),
        &mut out,
    );
    assert_eq!(d.ingresses(&fleet()).len(), 1);
    apply_unguarded(&mut d, 2, &event("a", RouteChange::Delete), &mut out);
    assert!(d.ingresses(&fleet()).is_empty());
    assert_eq!(route_writes(&out).len(), 2);
    assert_eq!(out.causes[&fleet()].len(), 2);
}

#[test]
fn repeating_an_upsert_writes_nothing() {
    let mut d = Desired::new();
    let mut out = Applied::default();
    let msg = event("a", RouteChange::Upsert { routes: vec![], tls: vec![] });
    apply_unguarded(&mut d, 1, &msg, &mut out);
    apply_unguarded(&mut d, 2, &msg, &mut out);
    assert_eq!(route_writes(&out).len(), 1);
}

/// The writes of routes and nodes, less the epoch's (the first message of an epoch).
fn route_writes(out: &Applied) -> Vec<&StateWrite> {
    out.writes.iter().filter(|w| !matches!(w, StateWrite::Epoch(..))).collect()
}

#[test]
fn a_snapshot_sweeps_what_is_not_live_in_every_fleet() {
    let mut d = Desired::new();
    let mut out = Applied::default();
    apply_unguarded(
        &mut d,
        1,
        &event("a", RouteChange::Upsert { routes: vec![], tls: vec![] }),
        &mut out,
    );
    apply_unguarded(
        &mut d,
        2,
        &event("b", RouteChange::Upsert { routes: vec![], tls: vec![] }),
        &mut out,
    );
    apply_unguarded(
        &mut d,
        3,
        &event("kept", RouteChange::Upsert { routes: vec![], tls: vec![] }),
        &mut out,
    );
    let snap = RouteMessage::Snapshot(RoutesSnapshot {
        schema: SCHEMA_VERSION,
        epoch: 2,
        live: vec![(fleet(), IngressKey::new("default", "b").unwrap())],
        keep: vec![IngressKey::new("default", "kept").unwrap()],
        cluster: None,
        parts: vec![],
    });
    let mut out = Applied::default();
    apply_unguarded(&mut d, 4, &snap, &mut out);
    let left: Vec<_> = d.ingresses(&fleet()).keys().map(|k| k.to_string()).collect();
    assert_eq!(left, ["default/b", "default/kept"], "refused Ingresses are kept");
    assert_eq!(
        route_writes(&out),
        [&StateWrite::Remove(fleet(), IngressKey::new("default", "a").unwrap())]
    );
    assert_eq!(out.causes[&fleet()][0].what, "sweep");
}

/// A fleet of `n` Ingresses of one route each, applied at sequences 1..=n.
fn fleet_of(n: u64, guard: &SweepGuard) -> Desired {
    let mut d = Desired::new();
    let mut out = Applied::default();
    let route = crate::core::model::tests::route(
        Some("a.example"),
        "/",
        hafleet_proto::PathKind::Prefix,
        "s",
    );
    for i in 1..=n {
        let upsert = RouteChange::Upsert { routes: vec![route.clone()], tls: vec![] };
        apply(&mut d, i, &event(&format!("i{i}"), upsert), guard, &mut out);
    }
    d
}

fn epoch_2(msg: RouteMessage) -> RouteMessage {
    match msg {
        RouteMessage::Event(e) => RouteMessage::Event(RouteEvent { epoch: 2, ..e }),
        other => other,
    }
}

/// A snapshot (epoch 2) in which only Ingresses `i1..=live` are live.
fn snapshot_keeping(live: u64) -> RouteMessage {
    RouteMessage::Snapshot(RoutesSnapshot {
        schema: SCHEMA_VERSION,
        epoch: 2,
        live: (1..=live)
            .map(|i| (fleet(), IngressKey::new("default", &format!("i{i}")).unwrap()))
            .collect(),
        keep: vec![],
        cluster: None,
        parts: vec![],
    })
}

#[test]
fn a_snapshot_that_would_withdraw_too_much_is_held_until_confirmed() {
    let guard = SweepGuard { percent: 50, min_routes: 10 };
    let mut d = fleet_of(30, &guard);
    // 10 of 30 routes: a third, under the guard's half: swept.
    let mut out = Applied::default();
    apply(&mut d, 31, &snapshot_keeping(20), &guard, &mut out);
    assert_eq!(d.ingresses(&fleet()).len(), 20);
    assert!(d.held.is_empty() && out.held_changed.is_empty());

    // 16 of 20 (an API server restored from an old backup): held, nothing withdrawn.
    let mut out = Applied::default();
    apply(&mut d, 32, &snapshot_keeping(4), &guard, &mut out);
    assert_eq!(d.ingresses(&fleet()).len(), 20, "nothing withdrawn");
    assert!(out.causes.is_empty(), "no version");
    let held = &d.held[&(fleet(), None)];
    assert_eq!((held.snapshot_seq, held.epoch, held.ingresses.len()), (32, 2, 16));
    assert_eq!(held.fleet_routes, 20);
    assert!(out.held_changed.contains(&(fleet(), None)));

    // An Ingress that comes back leaves the hold; one deleted explicitly goes.
    let mut out = Applied::default();
    let route = crate::core::model::tests::route(None, "/", hafleet_proto::PathKind::Prefix, "s");
    apply(
        &mut d,
        33,
        &epoch_2(event("i5", RouteChange::Upsert { routes: vec![route], tls: vec![] })),
        &guard,
        &mut out,
    );
    apply(&mut d, 34, &epoch_2(event("i6", RouteChange::Delete)), &guard, &mut out);
    assert_eq!(d.held[&(fleet(), None)].ingresses.len(), 14);
    assert_eq!(d.ingresses(&fleet()).len(), 19);

    // A release naming another snapshot changes nothing; the right one withdraws the rest.
    let confirm = |snapshot_seq| {
        RouteMessage::Confirm(hafleet_proto::SweepConfirm {
            schema: SCHEMA_VERSION,
            epoch: 2,
            fleet: fleet(),
            snapshot_seq,
            by: "operator".into(),
            cluster: None,
        })
    };
    let mut out = Applied::default();
    apply(&mut d, 35, &confirm(31), &guard, &mut out);
    assert_eq!(out.stale_confirms, [(fleet(), 31)]);
    assert_eq!(d.ingresses(&fleet()).len(), 19);
    apply(&mut d, 36, &confirm(32), &guard, &mut out);
    let left: Vec<_> = d.ingresses(&fleet()).keys().map(|k| k.name.to_string()).collect();
    assert_eq!(left, ["i1", "i2", "i3", "i4", "i5"]);
    assert!(d.held.is_empty());
    assert_eq!(out.causes[&fleet()].len(), 14);
    assert_eq!(out.causes[&fleet()][0].what, "sweep confirmed by operator");
}

#[test]
fn moves_to_another_fleet_are_not_held_and_a_renewed_hold_keeps_its_age() {
    let guard = SweepGuard { percent: 50, min_routes: 10 };
    let mut d = fleet_of(20, &guard);
    // All 20 live, but in fleet `core`: moved, not deleted.
    let core = FleetName::new("core").unwrap();
    let moved = RouteMessage::Snapshot(RoutesSnapshot {
        schema: SCHEMA_VERSION,
        epoch: 2,
        live: (1..=20)
            .map(|i| (core.clone(), IngressKey::new("default", &format!("i{i}")).unwrap()))
            .collect(),
        keep: vec![],
        cluster: None,
        parts: vec![],
    });
    apply(&mut d, 21, &moved, &guard, &mut Applied::default());
    assert!(d.held.is_empty() && d.ingresses(&fleet()).is_empty());

    let mut d = fleet_of(20, &guard);
    apply(&mut d, 21, &snapshot_keeping(0), &guard, &mut Applied::default());
    d.held.get_mut(&(fleet(), None)).unwrap().since_unix_ms = 1234;
    apply(&mut d, 22, &snapshot_keeping(1), &guard, &mut Applied::default());
    let held = &d.held[&(fleet(), None)];
    assert_eq!((held.snapshot_seq, held.since_unix_ms, held.ingresses.len()), (22, 1234, 19));
}

#[test]
fn a_later_snapshot_replaces_the_hold_and_the_guard_can_be_turned_off() {
    let guard = SweepGuard { percent: 50, min_routes: 10 };
    let mut d = fleet_of(20, &guard);
    apply(&mut d, 21, &snapshot_keeping(0), &guard, &mut Applied::default());
    assert_eq!(d.held[&(fleet(), None)].ingresses.len(), 20);
    // The API server is back but for three Ingresses: those three are swept at once.
    let mut out = Applied::default();
    apply(&mut d, 22, &snapshot_keeping(17), &guard, &mut out);
    assert!(d.held.is_empty(), "the hold is replaced");
    assert_eq!(d.ingresses(&fleet()).len(), 17);
    // A small fleet is not held for losing most of it: under the minimum.
    let mut small = fleet_of(4, &guard);
    apply(&mut small, 5, &snapshot_keeping(0), &guard, &mut Applied::default());
    assert!(small.held.is_empty() && small.ingresses(&fleet()).is_empty());
    // 100 % never holds.
    let off = SweepGuard { percent: 100, min_routes: 0 };
    let mut d = fleet_of(20, &off);
    apply(&mut d, 21, &snapshot_keeping(0), &off, &mut Applied::default());
    assert!(d.held.is_empty() && d.ingresses(&fleet()).is_empty());
}

fn nodes(list: &[(&str, &str)]) -> RouteMessage {
    RouteMessage::Nodes(NodesUpdate {
        schema: SCHEMA_VERSION,
        epoch: 1,
        nodes: list
            .iter()
            .map(|(n, a)| NodeAddr { name: ObjectName::new(*n).unwrap(), addr: a.parse().unwrap() })
            .collect(),
        cluster: None,
    })
}

#[test]
fn a_node_change_is_one_write_and_one_cause_per_fleet_whatever_the_ingresses() {
    let mut d = Desired::new();
    let mut out = Applied::default();
    for i in 0..100 {
        let e = event(&format!("i{i}"), RouteChange::Upsert { routes: vec![], tls: vec![] });
        apply_unguarded(&mut d, i + 1, &e, &mut out);
    }
    let mut out = Applied::default();
    apply_unguarded(&mut d, 200, &nodes(&[("n2", "10.0.0.2"), ("n1", "10.0.0.1")]), &mut out);
    assert_eq!(d.nodes[&None].iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["n1", "n2"]);
    assert_eq!(out.writes.len(), 1);
    assert_eq!(out.causes[&fleet()].len(), 1);
    assert_eq!(out.causes[&fleet()][0].added, ["n1 (10.0.0.1)", "n2 (10.0.0.2)"]);

    // n1 moves, n2 leaves, n3 joins.
    let mut out = Applied::default();
    apply_unguarded(&mut d, 201, &nodes(&[("n1", "10.0.0.9"), ("n3", "10.0.0.3")]), &mut out);
    let cause = &out.causes[&fleet()][0];
    assert_eq!((cause.what.as_str(), cause.ingress.as_ref()), ("nodes", None));
    assert_eq!(cause.added, ["n1 (10.0.0.9)", "n3 (10.0.0.3)"]);
    assert_eq!(cause.removed, ["n2"]);

    // The same set again changes nothing.
    let mut out = Applied::default();
    apply_unguarded(&mut d, 202, &nodes(&[("n3", "10.0.0.3"), ("n1", "10.0.0.9")]), &mut out);
    assert!(out.writes.is_empty() && out.causes.is_empty());
}

fn sealed(tag: &str, names: &[&str], recipient: &str) -> hafleet_proto::SealedCert {
    hafleet_proto::SealedCert {
        fingerprint: hafleet_proto::sha256_hex(tag.as_bytes()),
        names: names.iter().map(|n| hafleet_proto::HttpHost::new(*n).unwrap()).collect(),
        not_after_unix: 0,
        chain_pem: hafleet_proto::tls::certificates_pem([tag.as_bytes()]).into(),
        sealed_key: format!(
            "-----BEGIN AGE ENCRYPTED FILE-----\nYWJj{}\n-----END AGE ENCRYPTED FILE-----\n",
            recipient.len()
        )
        .into(),
        recipient: recipient.into(),
    }
}

fn tls_entry(hosts: &[&str], cert: Option<hafleet_proto::SealedCert>) -> TlsEntry {
    TlsEntry {
        hosts: hosts.iter().map(|h| hafleet_proto::HttpHost::new(*h).unwrap()).collect(),
        secret: hafleet_proto::ObjectName::new("s").unwrap(),
        cert,
    }
}

#[test]
fn certificates_keep_their_sealed_bytes_and_a_bad_secret_keeps_only_what_it_served() {
    let held = sealed("a", &["a.example.com"], "age1one");
    let mut fleet = Ingresses::new();
    let mut old = IngressEntry {
        created_unix: 1,
        resource_version: "1".into(),
        routes: Default::default(),
        seq: 1,
        tls: vec![tls_entry(&["a.example.com"], Some(held.clone()))],
        quarantined: None,
    };
    fleet.insert(IngressKey::new("t", "i").unwrap(), old.clone());
    // Sealed anew to the same recipient (a watcher restart): the bytes held stay.
    let mut resealed = held.clone();
    resealed.sealed_key = resealed.sealed_key.replace("YWJj", "ZGVm").into();
    let got = settle_tls(&fleet, Some(&old), &[tls_entry(&["a.example.com"], Some(resealed))]);
    assert_eq!(got[0].cert.as_ref(), Some(&held));
    // Sealed to a new recipient (the fleet's identity replaced): taken.
    let rekeyed = sealed("a", &["a.example.com"], "age1two");
    let got =
        settle_tls(&fleet, Some(&old), &[tls_entry(&["a.example.com"], Some(rekeyed.clone()))]);
    assert_eq!(got[0].cert.as_ref(), Some(&rekeyed));
    // The Secret went bad: the certificate stays for the hosts it served and covers only.
    old.tls = vec![tls_entry(&["a.example.com"], Some(held.clone()))];
    let bad = tls_entry(&["a.example.com", "b.example.com"], None);
    let got = settle_tls(&fleet, Some(&old), std::slice::from_ref(&bad));
    assert_eq!(got, vec![tls_entry(&["a.example.com"], Some(held.clone()))]);
    // Nothing held from it: nothing served.
    assert_eq!(settle_tls(&fleet, None, std::slice::from_ref(&bad)), vec![bad]);
}

#[test]
fn a_default_certificate_is_set_kept_across_a_reseal_and_replaced() {
    let mut d = Desired::default();
    let fleet = FleetName::new("edge").unwrap();
    let msg = |cert: Option<hafleet_proto::SealedCert>| {
        RouteMessage::DefaultCert(hafleet_proto::DefaultCert {
            schema: 1,
            epoch: 1,
            fleet: fleet.clone(),
            cert,
            cluster: None,
        })
    };
    let first = sealed("d", &["d.invalid"], "age1one");
    let mut out = Applied::default();
    apply(&mut d, 1, &msg(Some(first.clone())), &SweepGuard::default(), &mut out);
    assert_eq!(d.default_certs.get(&fleet), Some(&first));
    assert_eq!(out.causes[&fleet][0].added, [format!("default {}", first.fingerprint)]);
    let mut resealed = first.clone();
    resealed.sealed_key = resealed.sealed_key.replace("YWJj", "ZGVm").into();
    let mut out = Applied::default();
    apply(&mut d, 2, &msg(Some(resealed)), &SweepGuard::default(), &mut out);
    assert!(out.causes.is_empty() && out.writes.is_empty(), "a reseal changes nothing");
    assert_eq!(d.default_certs.get(&fleet), Some(&first));
    let second = sealed("e", &["d.invalid"], "age1one");
    let mut out = Applied::default();
    apply(&mut d, 3, &msg(Some(second.clone())), &SweepGuard::default(), &mut out);
    assert_eq!(d.default_certs.get(&fleet), Some(&second));
    assert!(matches!(out.writes.as_slice(), [StateWrite::DefaultCerts(_)]));
}

#[test]
fn fleet_settings_replace_the_fleets_whole_and_a_change_is_a_cause_naming_each_key() {
    let mut d = Desired::default();
    let fleet = FleetName::new("edge").unwrap();
    let msg = |settings: hafleet_proto::FleetSettings, rv: &str| {
        RouteMessage::Settings(hafleet_proto::SettingsUpdate {
            schema: hafleet_proto::SETTINGS_SCHEMA_VERSION,
            epoch: 1,
            cluster: None,
            fleet: fleet.clone(),
            settings,
            resource_version: rv.into(),
        })
    };
    let mut longer = hafleet_proto::FleetSettings::default();
    longer.timeouts.client_ms = Some(120_000);
    let mut out = Applied::default();
    apply(&mut d, 1, &msg(longer.clone(), "7"), &SweepGuard::default(), &mut out);
    assert_eq!(d.settings.get(&fleet), Some(&longer));
    let cause = &out.causes[&fleet][0];
    assert_eq!((cause.what.as_str(), cause.resource_version.as_deref()), ("settings", Some("7")));
    assert_eq!(
        (cause.added.as_slice(), cause.removed.len()),
        (&["timeout-client=2m".to_owned()][..], 0)
    );
    assert!(matches!(out.writes.as_slice(), [StateWrite::Epoch(..), StateWrite::Settings(_)]));

    let mut out = Applied::default();
    apply(&mut d, 2, &msg(longer.clone(), "8"), &SweepGuard::default(), &mut out);
    assert!(out.causes.is_empty() && out.writes.is_empty(), "the same settings change nothing");

    // Back to the defaults (the ConfigMap deleted): the fleet holds none, and the cause says
    // what went.
    let mut out = Applied::default();
    apply(&mut d, 3, &msg(Default::default(), ""), &SweepGuard::default(), &mut out);
    assert!(d.settings.is_empty());
    let cause = &out.causes[&fleet][0];
    assert_eq!(
        (cause.removed.as_slice(), cause.resource_version.as_ref()),
        (&["timeout-client=2m".to_owned()][..], None)
    );
}

fn render_settings(template: &str, percent: u8) -> hafleet_proto::RenderSettings {
    hafleet_proto::RenderSettings {
        schema: SCHEMA_VERSION,
        template: template.into(),
        builtin: false,
        servers_per_backend: 8,
        spare_backends: 0,
        node_health: None,
        sweep_guard_percent: percent,
        sweep_guard_min_routes: 10,
    }
}

#[test]
fn render_settings_are_state_a_change_is_a_cause_per_fleet_and_their_guard_is_in_force() {
    // The flags' guard would hold a sweep of 20 of 30 routes; the recorded one (100%) does not.
    let flags = SweepGuard { percent: 50, min_routes: 10 };
    let mut d = fleet_of(30, &flags);
    let mut out = Applied::default();
    let recorded = render_settings("global\n", 100);
    apply(&mut d, 31, &RouteMessage::Render(recorded.clone()), &flags, &mut out);
    assert!(out.render_changed && d.render.as_ref() == Some(&recorded));
    let cause = &out.causes[&fleet()][0];
    assert_eq!((cause.what.as_str(), cause.stream_seq), ("render settings", 31));
    assert!(cause.added.iter().any(|a| a.starts_with("template ")), "{cause:?}");
    assert!(matches!(out.writes.as_slice(), [StateWrite::Render(Some(_))]));
    // The same settings again (a renderer restarted before it read its own): nothing.
    let mut out = Applied::default();
    apply(&mut d, 32, &RouteMessage::Render(recorded.clone()), &flags, &mut out);
    assert!(!out.render_changed && out.causes.is_empty() && out.writes.is_empty());
    // No epoch fences the renderer's own message, and it moves none.
    assert_eq!(d.epoch(None), 1);
    // The guard in force is the recorded one: the sweep goes through.
    let mut out = Applied::default();
    apply(&mut d, 33, &snapshot_keeping(10), &flags, &mut out);
    assert!(d.held.is_empty() && d.ingresses(&fleet()).len() == 10, "{:?}", d.held);
    // A change of template only names the template.
    let mut out = Applied::default();
    apply(&mut d, 34, &RouteMessage::Render(render_settings("defaults\n", 100)), &flags, &mut out);
    let cause = &out.causes[&fleet()][0];
    assert_eq!((cause.added.len(), cause.removed.len()), (1, 1), "{cause:?}");
}

#[test]
fn a_passthrough_or_tcp_route_is_labelled_by_what_chooses_it() {
    let kind = hafleet_proto::PathKind::Prefix;
    let mut route = crate::core::model::tests::route(Some("db.example.com"), "/", kind, "db");
    assert_eq!(route_label(&route), "db.example.com/ (Prefix)");
    let more = hafleet_proto::RouteMore { passthrough: true, ..Default::default() };
    route.more = Some(Box::new(more));
    assert_eq!(route_label(&route), "sni db.example.com (passthrough)");
    let more = hafleet_proto::RouteMore { port: Some(5432), ..Default::default() };
    route.more = Some(Box::new(more));
    route.host = None;
    assert_eq!(route_label(&route), "tcp port 5432");
}
