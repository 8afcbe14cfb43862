//! Tests of [`super`]: its behaviour, apart from its code.

use super::*;

/// A version explained by thousands of causes, each naming its routes, is cut to fit a
/// message; a small one is left as it is.
#[test]
fn a_version_whose_causes_are_more_than_a_message_is_cut_to_fit() {
    let bundle = Bundle::new("global\n".into(), vec![], vec![]);
    let cause = |i: u64| Cause {
        stream_seq: i,
        ingress: Some(IngressKey::new("shop", &format!("web-{i}")).unwrap()),
        what: "upsert".into(),
        resource_version: Some(i.to_string()),
        added: (0..50).map(|r| format!("h{r}.example.com/ (Prefix)")).collect(),
        removed: vec!["old.example.com/ (Prefix)".into()],
        note: None,
    };
    let mut v = ConfigVersion::inline(FleetName::new("edge").unwrap(), 7, bundle);
    v.causes = (0..5000).map(cause).collect();
    let limit = 1024 * 1024;
    assert!(v.encode().len() > 5 * limit);
    let fitted = v.fitted(limit);
    assert!(fitted.encode().len() <= limit);
    assert_eq!((fitted.version, &fitted.sha256, &fitted.body), (7, &v.sha256, &v.body));
    assert_eq!(fitted.causes.len(), 101);
    assert_eq!(fitted.causes[0].added.len(), 11);
    assert_eq!(fitted.causes[0].added[10], "… and 40 more");
    assert_eq!(fitted.causes[0].removed, v.causes[0].removed);
    assert_eq!(fitted.causes[100].what, "… and 4900 more");
    assert_eq!(fitted.causes[100].stream_seq, 4999);
    v.causes.truncate(3);
    assert_eq!(v.fitted(limit), v);
}

fn route() -> Route {
    Route {
        host: Some(HttpHost::new("shop.example.com").unwrap()),
        path: HttpPath::new("/api").unwrap(),
        kind: PathKind::Prefix,
        backend: Backend {
            service: ServiceRef {
                namespace: Namespace::new("shop").unwrap(),
                name: ObjectName::new("api").unwrap(),
                port: 80,
                cluster: None,
            },
            node_port: Some(30080),
            servers: vec![],
            traffic_policy: TrafficPolicy::Cluster,
            endpoint_nodes: None,
            options: Default::default(),
            pods: None,
        },
        more: None,
    }
}

fn nodes() -> RouteMessage {
    RouteMessage::Nodes(NodesUpdate {
        schema: SCHEMA_VERSION,
        epoch: 7,
        cluster: None,
        nodes: vec![NodeAddr {
            name: ObjectName::new("node-1").unwrap(),
            addr: "127.0.0.2".parse().unwrap(),
        }],
    })
}

fn event(change: RouteChange) -> RouteMessage {
    RouteMessage::Event(RouteEvent {
        schema: SCHEMA_VERSION,
        fleet: FleetName::new("edge").unwrap(),
        ingress: IngressKey::new("shop", "web").unwrap(),
        created_unix: 1_700_000_000,
        resource_version: "42".into(),
        change,
        epoch: 7,
    })
}

fn east(ns: &str, name: &str) -> IngressKey {
    IngressKey::new(ns, name).unwrap().in_cluster(Some(&ClusterId::new("east").unwrap()))
}

/// A key in a cluster says so wherever it is written, and one in none is written as
/// before clusters (so old history reads, and renders, the same).
#[test]
fn an_ingress_key_names_its_cluster_only_when_it_has_one() {
    let plain = IngressKey::new("shop", "web").unwrap();
    assert_eq!(plain.to_string(), "shop/web");
    assert_eq!(serde_json::to_string(&plain).unwrap(), r#"{"namespace":"shop","name":"web"}"#);
    let key = east("shop", "web");
    assert_eq!(key.to_string(), "shop/web@east");
    assert!(key.is_in(Some(&ClusterId::new("east").unwrap())) && !key.is_in(None));
    assert!(plain.is_in(None) && plain != key);
    let json = serde_json::to_string(&key).unwrap();
    assert_eq!(serde_json::from_str::<IngressKey>(&json).unwrap(), key);
    let bad = r#"{"namespace":"shop","name":"web","cluster":"East_1"}"#;
    assert!(serde_json::from_str::<IngressKey>(bad).is_err());
    // A message naming a cluster is of a schema a renderer of before clusters refuses.
    assert_eq!(crate::route_schema(None), SCHEMA_VERSION);
    assert_eq!(crate::route_schema(key.cluster.as_ref()), crate::CLUSTER_SCHEMA_VERSION);
    // What a build of before clusters checks (schemas up to 3) refuses such a message,
    // and still takes one without a cluster.
    let named = RouteMessage::Event(RouteEvent {
        schema: crate::route_schema(key.cluster.as_ref()),
        ingress: key,
        ..match event(RouteChange::Delete) {
            RouteMessage::Event(e) => e,
            _ => unreachable!(),
        }
    });
    let err = check_schema_first(&named.encode(), 1, SCHEMA_VERSION).unwrap_err();
    assert!(matches!(err, DecodeError::Schema { found: 4, reads: 3 }), "{err}");
    assert!(check_schema_first(&event(RouteChange::Delete).encode(), 1, 3).is_ok());
    assert_eq!(RouteMessage::decode(&named.encode()).unwrap(), named);
}

#[test]
fn route_messages_round_trip() {
    for msg in [
        event(RouteChange::Upsert { routes: vec![route()], tls: vec![] }),
        event(RouteChange::Delete),
        nodes(),
        RouteMessage::Snapshot(RoutesSnapshot {
            schema: SCHEMA_VERSION,
            epoch: 7,
            cluster: None,
            live: vec![(FleetName::new("edge").unwrap(), IngressKey::new("a", "b").unwrap())],
            keep: vec![IngressKey::new("a", "c").unwrap()],
            parts: vec![],
        }),
        RouteMessage::Snapshot(RoutesSnapshot {
            schema: SCHEMA_VERSION,
            epoch: 7,
            cluster: Some(ClusterId::new("east").unwrap()),
            live: vec![(FleetName::new("edge").unwrap(), east("a", "b"))],
            keep: vec![east("a", "c")],
            parts: vec![],
        }),
    ] {
        assert_eq!(RouteMessage::decode(&msg.encode()).unwrap(), msg);
    }
}

#[test]
fn unknown_schema_is_refused() {
    let mut json: serde_json::Value =
        serde_json::from_slice(&event(RouteChange::Delete).encode()).unwrap();
    json["schema"] = 99.into();
    let err = RouteMessage::decode(&serde_json::to_vec(&json).unwrap()).unwrap_err();
    assert!(matches!(err, DecodeError::Schema { found: 99, reads: 9 }), "{err}");
}

#[test]
fn a_newer_schema_that_no_longer_parses_is_still_reported_as_a_schema_error() {
    let mut json: serde_json::Value =
        serde_json::from_slice(&event(RouteChange::Delete).encode()).unwrap();
    json["schema"] = (crate::PASSTHROUGH_SCHEMA_VERSION + 1).into();
    json["change"] = serde_json::json!({"op": "rename", "to": "elsewhere"});
    let err = RouteMessage::decode(&serde_json::to_vec(&json).unwrap()).unwrap_err();
    assert!(matches!(err, DecodeError::Schema { found: 10, .. }), "{err}");
    assert!(matches!(RouteMessage::decode(b"junk"), Err(DecodeError::Json(_))));
}

#[test]
fn an_unsafe_host_inside_a_message_fails_to_decode() {
    let mut json: serde_json::Value = serde_json::from_slice(
        &event(RouteChange::Upsert { routes: vec![route()], tls: vec![] }).encode(),
    )
    .unwrap();
    json["change"]["routes"][0]["host"] = "x.com\n  use_backend evil".into();
    assert!(RouteMessage::decode(&serde_json::to_vec(&json).unwrap()).is_err());
}

fn version(config: &str) -> ConfigVersion {
    let bundle = Bundle::new(config.into(), vec![], vec![]);
    ConfigVersion {
        schema: SCHEMA_VERSION,
        fleet: FleetName::new("edge").unwrap(),
        version: 3,
        parent: Some(2),
        sha256: bundle.sha256(),
        created_unix_ms: 1,
        causes: vec![Cause {
            stream_seq: 9,
            ingress: Some(IngressKey::new("shop", "web").unwrap()),
            what: "upsert".into(),
            resource_version: Some("42".into()),
            added: vec!["shop.example.com/api (Prefix)".into()],
            removed: vec![],
            note: None,
        }],
        notes: vec!["conflict".into()],
        restores: None,
        size: bundle.size() as u64,
        body: Body::Inline { bundle },
        signature: None,
        quarantined: vec![],
        routes: None,
    }
}

#[test]
fn config_versions_round_trip_and_check_their_hash() {
    let v = version("global\n");
    assert_eq!(ConfigVersion::decode(&v.encode()).unwrap(), v);
    let mut tampered = v.clone();
    let Body::Inline { bundle } = &mut tampered.body else { unreachable!() };
    bundle.config.push_str("  # changed\n");
    let err = ConfigVersion::decode(&tampered.encode()).unwrap_err();
    assert!(matches!(err, DecodeError::Bundle { version: 3, .. }), "{err}");
}

#[test]
fn a_bundle_from_the_bundles_stream_is_checked_before_it_is_taken() {
    let v = version("global\n");
    let bundle = v.bundle().unwrap().clone();
    let mut by_ref = v.clone();
    by_ref.body = Body::Stream { chunks: 3 };
    let by_ref = ConfigVersion::decode(&by_ref.encode()).unwrap();
    assert!(by_ref.bundle().is_none());
    assert_eq!(by_ref.clone().with_bundle(bundle).unwrap(), v);
    let other = Bundle::new("other\n".into(), vec![], vec![]);
    assert!(by_ref.with_bundle(other).is_err());
}

#[test]
fn route_messages_of_schema_1_are_still_read_config_versions_only_from_schema_2() {
    let mut json: serde_json::Value =
        serde_json::from_slice(&event(RouteChange::Delete).encode()).unwrap();
    json["schema"] = 1.into();
    assert!(RouteMessage::decode(&serde_json::to_vec(&json).unwrap()).is_ok());
    let mut json: serde_json::Value = serde_json::from_slice(&version("x\n").encode()).unwrap();
    json["schema"] = 1.into();
    let err = ConfigVersion::decode(&serde_json::to_vec(&json).unwrap()).unwrap_err();
    assert!(matches!(err, DecodeError::Schema { found: 1, .. }), "{err}");
    json["schema"] = 2.into();
    assert!(ConfigVersion::decode(&serde_json::to_vec(&json).unwrap()).is_ok());
}

#[test]
fn a_schema_2_route_event_with_its_servers_is_still_read_as_it_was() {
    let old = serde_json::json!({
        "type": "event", "schema": 2, "fleet": "edge",
        "ingress": {"namespace": "shop", "name": "web"},
        "created_unix": 1, "resource_version": "4", "epoch": 1,
        "change": {"op": "upsert", "routes": [{
            "host": "shop.example.com", "path": "/", "kind": "Prefix",
            "backend": {
                "service": {"namespace": "shop", "name": "web", "port": 80},
                "servers": [{"node": "n1", "addr": "10.0.0.1", "port": 30080}]
            }
        }]}
    });
    let RouteMessage::Event(e) = RouteMessage::decode(old.to_string().as_bytes()).unwrap() else {
        panic!("an event")
    };
    let RouteChange::Upsert { routes, .. } = e.change else { panic!("an upsert") };
    assert_eq!(routes[0].backend.node_port, None);
    assert_eq!(routes[0].backend.servers[0].port, 30080);
    // New messages never carry servers, and name the NodePort.
    let new = String::from_utf8(
        event(RouteChange::Upsert { routes: vec![route()], tls: vec![] }).encode(),
    )
    .unwrap();
    assert!(new.contains(r#""node_port":30080"#) && !new.contains("servers"), "{new}");
}

#[test]
fn an_unsafe_node_name_fails_to_decode() {
    let mut json: serde_json::Value = serde_json::from_slice(&nodes().encode()).unwrap();
    json["nodes"][0]["name"] = "n1 check inter 1".into();
    assert!(RouteMessage::decode(&serde_json::to_vec(&json).unwrap()).is_err());
}

#[test]
fn reports_of_appliers_that_did_not_count_reloads_still_read() {
    let old = br#"{"schema":3,"fleet":"edge","host":"lb-1","version":3,"sha256":"ab","outcome":{"result":"applied"},"finished_unix_ms":5,"duration_ms":6}"#;
    let r = ApplyReport::decode(old).unwrap();
    assert_eq!((r.outcome, r.reloads, r.runtime_commands), (ApplyOutcome::Applied, 0, 0));
}

#[test]
fn stages_are_named_as_reports_spell_them() {
    use ApplyStage::*;
    for stage in [Connect, HostKey, Upload, Validate, Swap, Reload, Verify, Probe, Drift] {
        assert_eq!(serde_json::to_value(stage).unwrap(), stage.as_str());
    }
}

#[test]
fn reports_round_trip() {
    for outcome in [
        ApplyOutcome::Applied,
        ApplyOutcome::Unchanged,
        ApplyOutcome::Failed {
            stage: ApplyStage::Validate,
            message: "bad".into(),
            restored: false,
        },
    ] {
        let r = ApplyReport {
            schema: SCHEMA_VERSION,
            fleet: FleetName::new("edge").unwrap(),
            host: HostName::new("lb-1").unwrap(),
            version: 3,
            sha256: "ab".into(),
            outcome,
            finished_unix_ms: 5,
            duration_ms: 6,
            reloads: 0,
            runtime_commands: 7,
            bridged: 1,
            sent_bytes: 8,
            drift: None,
            fleet_hosts: 2,
            quarantined: vec![],
        };
        assert_eq!(ApplyReport::decode(&r.encode()).unwrap(), r);
    }
}

/// A route whose Service is in pods mode round-trips, and a message without the field (every
/// earlier one) reads as nodes mode.
#[test]
fn pods_round_trip_and_their_absence_is_nodes_mode() {
    let mut r = route();
    let pod =
        |addr: &str, draining| PodEndpoint { addr: addr.parse().unwrap(), port: 8080, draining };
    r.backend.node_port = None;
    r.backend.pods = Some(vec![pod("10.2.0.1", false), pod("fd00::1", true)]);
    let msg = event(RouteChange::Upsert { routes: vec![r.clone()], tls: vec![] });
    let bytes = msg.encode();
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert!(text.contains(r#""pods":[{"addr":"10.2.0.1","port":8080},{"addr":"fd00::1","port":8080,"draining":true}]"#), "{text}");
    assert_eq!(RouteMessage::decode(&bytes).unwrap(), msg);
    let nodes = event(RouteChange::Upsert { routes: vec![route()], tls: vec![] }).encode();
    assert!(!String::from_utf8(nodes.clone()).unwrap().contains("pods"));
    let RouteMessage::Event(e) = RouteMessage::decode(&nodes).unwrap() else { panic!() };
    let RouteChange::Upsert { routes, .. } = e.change else { panic!() };
    assert_eq!(routes[0].backend.pods, None);
}

/// An HTTPRoute's key says so on the wire and in the history (`httproute:ns/name`), and a
/// message that names one is of the Gateway API schema; an Ingress's key is written as before
/// it, so Ingress messages keep their bytes (and replays of old history theirs).
#[test]
fn an_http_route_key_is_another_object_than_the_ingress_of_its_name() {
    let ing = IngressKey::new("shop", "web").unwrap();
    let route = IngressKey::http_route("shop", "web").unwrap();
    assert_ne!(ing, route);
    assert_eq!(serde_json::to_string(&ing).unwrap(), r#"{"namespace":"shop","name":"web"}"#);
    let json = serde_json::to_string(&route).unwrap();
    assert_eq!(json, r#"{"namespace":"shop","name":"web","kind":"HTTPRoute"}"#);
    assert_eq!(serde_json::from_str::<IngressKey>(&json).unwrap(), route);
    assert_eq!(
        (ing.to_string(), route.to_string()),
        ("shop/web".into(), "httproute:shop/web".into())
    );
    // A TLSRoute's likewise, of the passthrough schema (a renderer of before parks it).
    let tls = IngressKey::tls_route("shop", "web").unwrap();
    assert_eq!(tls.to_string(), "tlsroute:shop/web");
    let json = serde_json::to_string(&tls).unwrap();
    assert_eq!(json, r#"{"namespace":"shop","name":"web","kind":"TLSRoute"}"#);
    assert_eq!(
        crate::keys_schema(None, [&ing, &route, &tls].into_iter()),
        crate::PASSTHROUGH_SCHEMA_VERSION
    );
    assert_eq!(crate::keys_schema(None, [&ing].into_iter()), SCHEMA_VERSION);
    assert_eq!(crate::keys_schema(None, [&ing, &route].into_iter()), crate::GATEWAY_SCHEMA_VERSION);
    // A renderer of before HTTPRoutes (reads up to 7) parks such a message.
    let msg = RouteMessage::Event(RouteEvent {
        schema: crate::GATEWAY_SCHEMA_VERSION,
        ingress: route,
        ..match event(RouteChange::Delete) {
            RouteMessage::Event(e) => e,
            _ => unreachable!(),
        }
    });
    let err = check_schema_first(&msg.encode(), 1, crate::PODS_SCHEMA_VERSION).unwrap_err();
    assert!(matches!(err, DecodeError::Schema { found: 8, reads: 7 }), "{err}");
    assert_eq!(RouteMessage::decode(&msg.encode()).unwrap(), msg);
}
