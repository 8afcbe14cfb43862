use super::*;

/// Opens a store that this process has just closed: sled releases its directory lock from
/// a background thread after the last handle drops, so this waits (up to 5 s) for that.
fn reopen(path: &Path) -> Store {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match Store::open(path) {
            Err(StoreError::Open { source: sled::Error::Io(e), .. })
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            other => return other.unwrap(),
        }
    }
}
use hafleet_proto::SCHEMA_VERSION;

fn version(fleet: &FleetName, n: u64) -> ConfigVersion {
    let bundle = hafleet_proto::Bundle::new("x".into(), vec![], vec![]);
    ConfigVersion {
        schema: SCHEMA_VERSION,
        fleet: fleet.clone(),
        version: n,
        parent: n.checked_sub(1).filter(|p| *p > 0),
        sha256: bundle.sha256(),
        created_unix_ms: 0,
        causes: vec![],
        notes: vec![],
        restores: None,
        size: 1,
        body: hafleet_proto::Body::Inline { bundle },
        signature: None,
        quarantined: vec![],
        routes: None,
    }
}

fn node_2() -> hafleet_proto::NodeAddr {
    hafleet_proto::NodeAddr {
        name: hafleet_proto::ObjectName::new("n2").unwrap(),
        addr: "10.0.0.2".parse().unwrap(),
    }
}

#[test]
fn the_newest_version_read_after_its_commit_is_the_one_the_store_holds() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = FleetName::new("edge").unwrap();
    let store = Store::open(dir.path()).unwrap();
    for n in 1..=3 {
        store.commit(&[], &[big(&fleet, n)], n).unwrap();
    }
    // The newest from memory, the older ones from the store, all as committed.
    for n in 1..=3 {
        assert_eq!(store.version(&fleet, n).unwrap().unwrap(), big(&fleet, n), "{n}");
    }
    assert_eq!(store.unpublished().unwrap().len(), 3);
    drop(store);
    let store = reopen(dir.path());
    assert_eq!(store.version(&fleet, 3).unwrap().unwrap(), big(&fleet, 3));
}

#[test]
fn a_commit_survives_reopening_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = FleetName::new("edge").unwrap();
    let key = IngressKey::new("default", "web").unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let entry = IngressEntry {
            created_unix: 1,
            resource_version: "5".into(),
            routes: Default::default(),
            seq: 1,
            tls: Vec::new(),
            quarantined: None,
        };
        let node = hafleet_proto::NodeAddr {
            name: hafleet_proto::ObjectName::new("n1").unwrap(),
            addr: "10.0.0.1".parse().unwrap(),
        };
        // The same namespace/name in a named cluster is another Ingress, with nodes and an
        // epoch of its own.
        let east = Some(hafleet_proto::ClusterId::new("east").unwrap());
        let theirs = key.clone().in_cluster(east.as_ref());
        store
            .commit(
                &[
                    StateWrite::Put(fleet.clone(), key.clone(), entry.clone()),
                    StateWrite::Put(fleet.clone(), theirs, IngressEntry { seq: 2, ..entry }),
                    StateWrite::Nodes(None, vec![node.clone()]),
                    StateWrite::Nodes(east.clone(), vec![node, node_2()]),
                    StateWrite::Epoch(None, 40),
                    StateWrite::Epoch(east, 9),
                ],
                &[version(&fleet, 1), version(&fleet, 2)],
                17,
            )
            .unwrap();
        store.set_published(&fleet, 1).unwrap();
    }
    let store = reopen(dir.path());
    assert_eq!(store.applied_seq().unwrap(), 17);
    let desired = store.desired().unwrap();
    assert!(desired.ingresses(&fleet).contains_key(&key));
    assert_eq!(desired.nodes[&None][0].name.as_str(), "n1");
    let east = hafleet_proto::ClusterId::new("east").unwrap();
    let theirs = &desired.ingresses(&fleet)[&key.clone().in_cluster(Some(&east))];
    assert_eq!((desired.ingresses(&fleet).len(), theirs.seq), (2, 2));
    assert_eq!(desired.nodes[&Some(east.clone())].len(), 2);
    assert_eq!((desired.epoch(None), desired.epoch(Some(&east))), (40, 9));
    assert_eq!(store.latest(&fleet).unwrap().unwrap().version, 2);
    let unpublished: Vec<u64> = store.unpublished().unwrap().iter().map(|v| v.version).collect();
    assert_eq!(unpublished, [2]);
}

#[test]
fn versions_written_as_plain_json_by_earlier_builds_are_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let fleet = FleetName::new("edge").unwrap();
    let old = version(&fleet, 3);
    store.versions.insert(version_key(&fleet, 3), old.encode()).unwrap();
    assert_eq!(store.version(&fleet, 3).unwrap(), Some(old.clone()));
    // What this build writes is a delta to the old record, and reads back the same.
    store.commit(&[], &[version(&fleet, 4)], 1).unwrap();
    let raw = store.versions.get(version_key(&fleet, 4)).unwrap().unwrap();
    assert!(raw.starts_with(&DELTA_MAGIC));
    assert_eq!(be_u64(&raw[4..12]), 3, "the plain record is its keyframe");
    assert_eq!(store.version(&fleet, 4).unwrap(), Some(version(&fleet, 4)));
}

/// A version of a big config, one line changed per number.
fn big(fleet: &FleetName, n: u64) -> ConfigVersion {
    let mut config: String = (0..20_000)
        .map(|i| format!("    server node-{i} 10.0.{}.{}:30080\n", i / 250, i % 250))
        .collect();
    config.push_str(&format!("# change {n}\n"));
    let bundle = hafleet_proto::Bundle::new(config, vec![], vec![]);
    ConfigVersion {
        sha256: bundle.sha256(),
        body: hafleet_proto::Body::Inline { bundle },
        signature: None,
        ..version(fleet, n)
    }
}

#[test]
fn versions_are_deltas_to_a_keyframe_every_64_and_read_back_the_same_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = FleetName::new("edge").unwrap();
    let other = FleetName::new("core").unwrap();
    let raw = |store: &Store, n: u64| store.versions.get(version_key(&fleet, n)).unwrap().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        // Two in one commit, then one per commit, with another fleet in between.
        store.commit(&[], &[big(&fleet, 1), big(&fleet, 2)], 1).unwrap();
        for n in 3..=100 {
            store.commit(&[], &[big(&fleet, n), version(&other, n)], n).unwrap();
        }
        assert!(raw(&store, 1).starts_with(&ZSTD_MAGIC), "the first is whole");
        assert!(raw(&store, 65).starts_with(&ZSTD_MAGIC), "and one in 64");
        for n in [2, 64, 66, 100] {
            let stored = raw(&store, n);
            assert!(stored.starts_with(&DELTA_MAGIC), "version {n}");
            let keyframe = if n < 65 { 1 } else { 65 };
            assert_eq!(be_u64(&stored[4..12]), keyframe, "version {n}");
            assert!(stored.len() * 20 < raw(&store, keyframe).len(), "version {n} is small");
        }
    }
    // A new process finds the keyframe its next version refers to from the store.
    let store = reopen(dir.path());
    store.commit(&[], &[big(&fleet, 101)], 101).unwrap();
    assert_eq!(be_u64(&raw(&store, 101)[4..12]), 65);
    let all = store.versions(&fleet).unwrap();
    assert_eq!(all.len(), 101);
    for (i, v) in all.iter().enumerate() {
        assert_eq!(*v, big(&fleet, i as u64 + 1));
    }
    assert_eq!(store.version(&fleet, 77).unwrap(), Some(big(&fleet, 77)));
    assert_eq!(store.latest(&fleet).unwrap(), Some(big(&fleet, 101)));
    assert_eq!(store.version(&other, 50).unwrap(), Some(version(&other, 50)));
}

#[test]
fn a_version_that_grew_away_from_its_keyframe_is_the_next_keyframe() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let fleet = FleetName::new("edge").unwrap();
    let raw = |n: u64| store.versions.get(version_key(&fleet, n)).unwrap().unwrap();
    // A small first version, then one with 2 MB of text that does not compress (as sealed
    // keys): a delta to the first would carry it all.
    store.commit(&[], &[version(&fleet, 1)], 1).unwrap();
    let noise = |n: u64| -> String {
        let mut x = n;
        (0..2_000_000)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                char::from(b'a' + (x >> 59) as u8)
            })
            .collect()
    };
    let grown = |n: u64, tail: &str| {
        let bundle = hafleet_proto::Bundle::new(format!("{}{tail}", noise(7)), vec![], vec![]);
        ConfigVersion {
            sha256: bundle.sha256(),
            body: hafleet_proto::Body::Inline { bundle },
            ..version(&fleet, n)
        }
    };
    store.commit(&[], &[grown(2, "")], 2).unwrap();
    assert!(raw(2).starts_with(&ZSTD_MAGIC), "stored whole, a keyframe");
    // The next one changes a line: a small delta to version 2.
    store.commit(&[], &[grown(3, "\nchanged\n")], 3).unwrap();
    let stored = raw(3);
    assert!(stored.starts_with(&DELTA_MAGIC));
    assert_eq!(be_u64(&stored[4..12]), 2);
    assert!(stored.len() < 64 * 1024, "{} bytes", stored.len());
    for n in 1..=3 {
        let expected =
            if n == 1 { version(&fleet, 1) } else { grown(n, ["", "\nchanged\n"][n as usize - 2]) };
        assert_eq!(reopen_read(&store, &fleet, n), expected, "version {n}");
    }
}

/// Version `n` as read from the store, not from what it keeps of its last commit.
fn reopen_read(store: &Store, fleet: &FleetName, n: u64) -> ConfigVersion {
    let key = version_key(fleet, n);
    let raw = store.versions.get(&key).unwrap().unwrap();
    store.decode_version(&key, &raw, &mut None).unwrap()
}

#[test]
fn versions_sort_numerically_not_as_text() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let fleet = FleetName::new("edge").unwrap();
    let all: Vec<ConfigVersion> = (1..=12).map(|n| version(&fleet, n)).collect();
    store.commit(&[], &all, 1).unwrap();
    assert_eq!(store.latest(&fleet).unwrap().unwrap().version, 12);
    // A fleet whose name is a prefix of another's must not see the other's versions.
    let other = FleetName::new("edge-2").unwrap();
    store.commit(&[], &[version(&other, 99)], 2).unwrap();
    assert_eq!(store.latest(&fleet).unwrap().unwrap().version, 12);
    assert_eq!(store.versions(&fleet).unwrap().len(), 12);
    assert_eq!(store.fleets_with_versions().unwrap(), [fleet.clone(), other.clone()]);
    assert_eq!(store.unpublished().unwrap().len(), 13, "every fleet's versions");
}

/// A certificate as versions carry it (nothing in it is opened here).
fn sealed(n: u32) -> hafleet_proto::SealedCert {
    let der = format!("end-entity {n}");
    hafleet_proto::SealedCert {
        fingerprint: hafleet_proto::sha256_hex(der.as_bytes()),
        names: vec![],
        not_after_unix: 0,
        chain_pem: hafleet_proto::tls::certificates_pem([der.as_bytes()]).into(),
        sealed_key: format!("-----BEGIN AGE ENCRYPTED FILE-----\nkey {n}\n").into(),
        recipient: "age1".into(),
    }
}

fn with_certs(fleet: &FleetName, n: u64, certs: &[u32]) -> ConfigVersion {
    let mut certs: Vec<_> = certs.iter().map(|&c| sealed(c)).collect();
    certs.sort_by_key(|c| c.id());
    let bundle = hafleet_proto::Bundle::new(format!("global\n# {n}\n"), vec![], certs);
    ConfigVersion {
        sha256: bundle.sha256(),
        body: hafleet_proto::Body::Inline { bundle },
        ..version(fleet, n)
    }
}

#[test]
fn certificates_are_stored_once_apart_from_the_versions_that_name_them() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = FleetName::new("edge").unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        store.commit(&[], &[with_certs(&fleet, 1, &[1, 2, 3])], 1).unwrap();
        // A rotation: one certificate replaced; two versions in one commit share theirs.
        let (two, three) = (with_certs(&fleet, 2, &[1, 2, 4]), with_certs(&fleet, 3, &[1, 2, 4]));
        store.commit(&[], &[two, three], 2).unwrap();
        assert_eq!(store.certs.len(), 4, "each certificate once");
        for n in 1..=3u64 {
            let key = version_key(&fleet, n);
            let raw = store.versions.get(&key).unwrap().unwrap();
            let json = store.version_json(&key, &raw, &mut None).unwrap();
            let json = String::from_utf8(json).unwrap();
            assert!(!json.contains("key 1") && json.contains("stored_cert_ids"), "{json}");
        }
    }
    // Read back whole, after a reopen (not from what the store keeps of its last commit).
    let store = reopen(dir.path());
    for (n, certs) in [(1, [1, 2, 3]), (2, [1, 2, 4]), (3, [1, 2, 4])] {
        assert_eq!(reopen_read(&store, &fleet, n), with_certs(&fleet, n, &certs), "version {n}");
    }
    assert_eq!(store.versions(&fleet).unwrap().len(), 3);
    // A new process stores only what it does not hold.
    store.commit(&[], &[with_certs(&fleet, 4, &[1, 5])], 3).unwrap();
    assert_eq!(store.certs.len(), 5);
    // A certificate gone from the store: the versions naming it say so.
    store.certs.remove(sealed(5).id().as_bytes()).unwrap();
    let key = version_key(&fleet, 4);
    let raw = store.versions.get(&key).unwrap().unwrap();
    let err = store.decode_version(&key, &raw, &mut None).unwrap_err();
    assert!(matches!(err, StoreError::MissingCert { .. }), "{err}");
    // A version stored by an earlier build, its certificates inline, reads as it was.
    let old = with_certs(&fleet, 5, &[6]);
    store.versions.insert(version_key(&fleet, 5), compress(&old.encode())).unwrap();
    assert_eq!(reopen_read(&store, &fleet, 5), old);
}
