use super::*;
use serde_json::json;

const HAFLEET: Config<'static> = Config { ingress_class: Some("hafleet"), pods_fleets: &[] };

fn ingress(v: serde_json::Value) -> Ingress {
    serde_json::from_value(v).unwrap()
}

fn web_ingress(host: &str, path: &str) -> Ingress {
    ingress(json!({
        "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "7",
                     "creationTimestamp": "2026-01-01T00:00:00Z",
                     "annotations": {"hafleet.io/fleet": "edge"}},
        "spec": {"rules": [{"host": host, "http": {"paths": [
            {"path": path, "pathType": "Prefix",
             "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}
    }))
}

fn services(kind: &str) -> Services {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"type": kind, "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}
    }))
    .unwrap();
    [(("shop".to_owned(), "web".to_owned()), std::sync::Arc::new(svc))].into_iter().collect()
}

fn node(name: &str, ip: &str, ready: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}],
                   "conditions": [{"type": "Ready", "status": ready}]}
    }))
    .unwrap()
}

#[test]
fn a_nodeport_ingress_resolves_to_its_node_port_and_routes_go_to_ready_nodes() {
    let r = resolve(
        &web_ingress("shop.example.com", "/"),
        Config::default(),
        &services("NodePort"),
        None,
    )
    .unwrap();
    assert_eq!(r.fleet.as_str(), "edge");
    assert_eq!(r.key.to_string(), "shop/web");
    assert_eq!(r.resource_version, "7");
    assert_eq!(r.created_unix, 1_767_225_600);
    assert_eq!(r.routes[0].backend.node_port, Some(30080));
    assert!(r.routes[0].backend.servers.is_empty(), "nodes travel on their own");
    let nodes = [
        node("n2", "127.0.0.3", "True"),
        node("n1", "127.0.0.2", "True"),
        node("n3", "127.0.0.4", "False"),
    ];
    let ready: Vec<String> =
        ready_nodes(&nodes).iter().map(|n| format!("{} {}", n.name, n.addr)).collect();
    assert_eq!(ready, ["n1 127.0.0.2", "n2 127.0.0.3"]);
}

#[test]
fn cordoned_nodes_serve_and_excluded_ones_do_not() {
    let mut cordoned = node("n1", "127.0.0.2", "True");
    cordoned.spec = Some(serde_json::from_value(json!({"unschedulable": true})).unwrap());
    let mut excluded = node("n2", "127.0.0.3", "True");
    excluded.metadata.labels = Some([(EXCLUDE_FROM_LB_LABEL.to_owned(), String::new())].into());
    let ready = ready_nodes(&[cordoned, excluded]);
    let nodes: Vec<&str> = ready.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(nodes, ["n1"]);
}

#[test]
fn without_the_annotation_or_with_another_class_it_is_not_ours() {
    let mut ing = web_ingress("a.com", "/");
    let s = services("NodePort");
    assert!(resolve(&ing, HAFLEET, &s, None) == Err(Refused::NotSelected));
    ing.spec.as_mut().unwrap().ingress_class_name = Some("hafleet".into());
    assert!(resolve(&ing, HAFLEET, &s, None).is_ok());
    ing.metadata.annotations = None;
    assert_eq!(resolve(&ing, Config::default(), &s, None), Err(Refused::NotSelected));
}

#[test]
fn injection_attempts_are_refused_with_reasons() {
    let s = services("NodePort");
    let Err(Refused::Invalid(why)) =
        resolve(&web_ingress("a.com", "/x\n    use_backend evil"), Config::default(), &s, None)
    else {
        panic!("a path with a newline must be refused")
    };
    assert!(why[0].starts_with("rules[0].http.paths[0].path"), "{why:?}");
    let Err(Refused::Invalid(why)) =
        resolve(&web_ingress("a.com }", "/"), Config::default(), &s, None)
    else {
        panic!("a host with a brace must be refused")
    };
    assert!(why[0].starts_with("rules[0].host"), "{why:?}");
    let mut bad_fleet = web_ingress("a.com", "/");
    bad_fleet
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(FLEET_ANNOTATION.into(), "Edge!".into());
    assert!(matches!(resolve(&bad_fleet, Config::default(), &s, None), Err(Refused::Invalid(_))));
}

fn slice(v: serde_json::Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

#[test]
fn a_local_service_names_the_nodes_with_a_ready_endpoint_from_either_slice_version() {
    let mut s = services("NodePort");
    let svc = s.get_mut(&("shop".to_owned(), "web".to_owned())).unwrap();
    std::sync::Arc::make_mut(svc).spec.as_mut().unwrap().external_traffic_policy =
        Some("Local".into());
    let meta = |name: &str| {
        json!({"name": name, "namespace": "shop",
               "labels": {"kubernetes.io/service-name": "web"}})
    };
    let v1 = slice(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": meta("web-a"), "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.1.0.1"], "nodeName": "n1", "conditions": {"ready": true}},
            {"addresses": ["10.1.0.2"], "nodeName": "n2", "conditions": {"ready": false}},
            {"addresses": ["10.1.0.3"], "nodeName": "n3"},
            {"addresses": ["10.1.0.9"]}
        ]
    }));
    // v1beta1 (Kubernetes 1.20): the node is found by its hostname label.
    let v1beta1 = slice(json!({
        "apiVersion": "discovery.k8s.io/v1beta1", "kind": "EndpointSlice",
        "metadata": meta("web-b"), "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.1.0.4"], "topology": {"kubernetes.io/hostname": "host-5"}},
            {"addresses": ["10.1.0.5"], "topology": {"kubernetes.io/hostname": "n6"}}
        ]
    }));
    let mut n5 = node("n5", "10.0.0.5", "True");
    n5.metadata.labels = Some([(HOSTNAME_LABEL.to_owned(), "host-5".to_owned())].into());
    let other = slice(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "x", "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": "other"}},
        "addressType": "IPv4", "endpoints": [{"addresses": ["10.1.0.8"], "nodeName": "n9"}]
    }));
    let eps = Endpoints { nodes: endpoints([&v1, &v1beta1, &other], [&n5]), ..Default::default() };
    let r = resolve(&web_ingress("a.com", "/"), Config::default(), &s, Some(&eps)).unwrap();
    let b = &r.routes[0].backend;
    assert_eq!(b.traffic_policy, TrafficPolicy::Local);
    let on: Vec<&str> = b.endpoint_nodes.iter().flatten().map(|n| n.as_str()).collect();
    assert_eq!(on, ["n1", "n3", "n5", "n6"], "not n2 (not ready), not n9 (another Service)");
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    // No slice: no node serves it, and the owner is told.
    let r = resolve(&web_ingress("a.com", "/"), Config::default(), &s, Some(&Endpoints::default()))
        .unwrap();
    assert_eq!(r.routes[0].backend.endpoint_nodes, Some(vec![]));
    assert_eq!(r.warnings[0].reason, "NoReadyEndpoint");
    assert!(r.warnings[0].note.contains("no ready endpoint"), "{:?}", r.warnings);
    // EndpointSlices not served: unknown, every node (as before).
    let r = resolve(&web_ingress("a.com", "/"), Config::default(), &s, None).unwrap();
    assert_eq!(r.routes[0].backend.endpoint_nodes, None);
    // A Cluster Service does not name endpoints: every node forwards.
    let r =
        resolve(&web_ingress("a.com", "/"), Config::default(), &services("NodePort"), Some(&eps));
    assert_eq!(r.unwrap().routes[0].backend.endpoint_nodes, None);
}

/// The memo answers as `resolve` would, and resolves anew exactly when the Ingress object,
/// a Service it names (changed, gone or come) or such a Service's endpoint nodes changed.
#[test]
fn the_memo_resolves_again_only_what_changed_and_forgets_what_went() {
    use std::sync::Arc;
    let mut memo = Memo::default();
    let web = Arc::new(web_ingress("a.com", "/"));
    let other = Arc::new(ingress(json!({
        "metadata": {"name": "other", "namespace": "shop",
                     "annotations": {"hafleet.io/fleet": "edge"}},
        "spec": {"defaultBackend": {"service": {"name": "missing", "port": {"number": 80}}}}
    })));
    let mut s = services("NodePort");
    let pass = |memo: &mut Memo, s: &Services, eps: Option<&Endpoints>, ings: &[&Arc<Ingress>]| {
        memo.begin_pass();
        let out: Vec<_> = ings.iter().map(|i| memo.resolve(i, Config::default(), s, eps)).collect();
        memo.end_pass();
        for (ing, got) in ings.iter().zip(&out) {
            assert_eq!(
                got,
                &resolve(ing, Config::default(), s, eps),
                "the memo answers as resolve does"
            );
        }
        (memo.fresh(), out)
    };
    assert_eq!(pass(&mut memo, &s, None, &[&web, &other]).0, 2);
    assert_eq!(pass(&mut memo, &s, None, &[&web, &other]).0, 0, "nothing changed");

    // The Service it names changes (a new object in the cache): resolved anew.
    let key = ("shop".to_owned(), "web".to_owned());
    let mut svc = (*s[&key]).clone();
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(30081);
    s.insert(key.clone(), Arc::new(svc));
    let (fresh, out) = pass(&mut memo, &s, None, &[&web, &other]);
    assert_eq!(fresh, 1, "only the Ingress that names it");
    assert_eq!(out[0].as_ref().unwrap().routes[0].backend.node_port, Some(30081));

    // A Service it names that did not exist appears.
    let mut missing = (*s[&key]).clone();
    missing.metadata.name = Some("missing".into());
    s.insert(("shop".to_owned(), "missing".to_owned()), Arc::new(missing));
    let (fresh, out) = pass(&mut memo, &s, None, &[&web, &other]);
    assert_eq!(fresh, 1);
    assert!(out[1].as_ref().unwrap().warnings.is_empty(), "no longer BackendMissing");

    // The Service goes Local: its endpoint nodes count, and a change of them too.
    let mut local = (*s[&key]).clone();
    local.spec.as_mut().unwrap().external_traffic_policy = Some("Local".into());
    s.insert(key.clone(), Arc::new(local));
    let mut eps = Endpoints::default();
    eps.nodes.insert(key.clone(), ["n1".to_owned()].into());
    assert_eq!(pass(&mut memo, &s, Some(&eps), &[&web, &other]).0, 1);
    assert_eq!(pass(&mut memo, &s, Some(&eps), &[&web, &other]).0, 0);
    eps.nodes.insert(key.clone(), ["n1".to_owned(), "n2".to_owned()].into());
    let (fresh, out) = pass(&mut memo, &s, Some(&eps), &[&web, &other]);
    assert_eq!(fresh, 1);
    let on = out[0].as_ref().unwrap().routes[0].backend.endpoint_nodes.clone().unwrap();
    assert_eq!(on.iter().map(|n| n.as_str()).collect::<Vec<_>>(), ["n1", "n2"]);

    // An edited Ingress is a new object: resolved anew, and the old one forgotten; an
    // Ingress no longer listed is forgotten too.
    let edited = Arc::new(web_ingress("b.com", "/"));
    let (fresh, out) = pass(&mut memo, &s, Some(&eps), &[&edited]);
    assert_eq!(fresh, 1);
    assert_eq!(out[0].as_ref().unwrap().routes[0].host.as_ref().unwrap().as_str(), "b.com");
    assert_eq!(memo.len(), 1, "web's old object and other are forgotten");
    assert_eq!(pass(&mut memo, &s, Some(&eps), &[&edited, &other]).0, 1, "other comes back");
}

/// A route must never stay on a NodePort its Service no longer has: Kubernetes may give
/// that port to another Service.
#[test]
fn a_service_that_cannot_be_reached_through_a_node_port_withdraws_the_route() {
    let with_spec = |spec: serde_json::Value| -> Services {
        let svc: Service = serde_json::from_value(
            json!({"metadata": {"name": "web", "namespace": "shop"}, "spec": spec}),
        )
        .unwrap();
        [(("shop".to_owned(), "web".to_owned()), std::sync::Arc::new(svc))].into_iter().collect()
    };
    for (spec, why) in [
        (json!({"type": "ClusterIP", "ports": [{"port": 80}]}), "is of type ClusterIP"),
        (json!({"type": "NodePort", "ports": [{"port": 81, "nodePort": 30081}]}), "no port 80"),
        (json!({"type": "NodePort", "ports": [{"port": 80}]}), "port 80 has no nodePort"),
    ] {
        let r =
            resolve(&web_ingress("a.com", "/"), Config::default(), &with_spec(spec), None).unwrap();
        let b = &r.routes[0].backend;
        assert_eq!((b.node_port, b.service.port), (None, 80), "{why}");
        assert_eq!(r.warnings.len(), 1, "{why}");
        assert_eq!(r.warnings[0].reason, "RouteWithdrawn");
        assert!(r.warnings[0].note.contains(why), "{}", r.warnings[0].note);
        assert!(r.warnings[0].note.contains("503"), "{}", r.warnings[0].note);
    }
}

#[test]
fn a_missing_service_routes_to_nothing_with_a_warning() {
    let r =
        resolve(&web_ingress("a.com", "/"), Config::default(), &Services::default(), None).unwrap();
    assert_eq!(r.routes[0].backend.node_port, None);
    assert_eq!(r.warnings.len(), 1);
}

/// Service `web` in `shop` of type ClusterIP, port 80 named `http`, with `annotations`.
fn cluster_ip_service(annotations: serde_json::Value) -> Services {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
        "spec": {"type": "ClusterIP", "ports": [{"name": "http", "port": 80, "targetPort": "web"}]}
    }))
    .unwrap();
    [(("shop".to_owned(), "web".to_owned()), std::sync::Arc::new(svc))].into_iter().collect()
}

/// What the EndpointSlices say of `web`: one slice with port `http` at 8080 and `endpoints`.
fn pod_slices(endpoints: serde_json::Value) -> Endpoints {
    let slice: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}], "endpoints": endpoints
    }))
    .unwrap();
    let mut cache = crate::core::pods::SliceCache::default();
    let pods = cache.by_service(&[std::sync::Arc::new(slice)], |_, _| true);
    Endpoints { pods, ..Default::default() }
}

fn pods_of(r: &Resolved) -> Vec<String> {
    let pods = r.routes[0].backend.pods.as_ref().expect("pods mode");
    pods.iter()
        .map(|p| format!("{}:{}{}", p.addr, p.port, if p.draining { " d" } else { "" }))
        .collect()
}

#[test]
fn a_service_in_pods_mode_routes_to_its_serving_endpoints_whatever_its_type() {
    let s = cluster_ip_service(json!({"hafleet.io/endpoints": "pods"}));
    let eps = pod_slices(json!([
        {"addresses": ["10.2.0.2"], "conditions": {"ready": true}},
        {"addresses": ["10.2.0.1"], "conditions": {"ready": true}},
        {"addresses": ["10.2.0.3"], "conditions": {"ready": false}},
        {"addresses": ["10.2.0.4"], "conditions": {"ready": false, "serving": true, "terminating": true}}
    ]));
    let r = resolve(&web_ingress("a.com", "/"), Config::default(), &s, Some(&eps)).unwrap();
    assert_eq!(pods_of(&r), ["10.2.0.1:8080", "10.2.0.2:8080", "10.2.0.4:8080 d"]);
    let b = &r.routes[0].backend;
    assert_eq!((b.node_port, b.service.port), (None, 80));
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);

    // None serving: routed, to nothing (503), and told.
    let none = pod_slices(json!([{"addresses": ["10.2.0.3"], "conditions": {"ready": false}}]));
    let r = resolve(&web_ingress("a.com", "/"), Config::default(), &s, Some(&none)).unwrap();
    assert!(pods_of(&r).is_empty());
    assert_eq!(r.warnings[0].reason, "NoReadyEndpoint");
    // No EndpointSlices served at all: the same, saying why.
    let r = resolve(&web_ingress("a.com", "/"), Config::default(), &s, None).unwrap();
    assert!(pods_of(&r).is_empty());
    assert!(r.warnings[0].note.contains("serves no EndpointSlices"), "{:?}", r.warnings);
}

#[test]
fn a_fleet_may_default_to_pods_and_a_service_may_say_otherwise() {
    let eps = pod_slices(json!([{"addresses": ["10.2.0.1"]}]));
    let edge = [FleetName::new("edge").unwrap()];
    let pods_fleet = Config { pods_fleets: &edge, ..Default::default() };
    let s = cluster_ip_service(json!({}));
    let r = resolve(&web_ingress("a.com", "/"), pods_fleet, &s, Some(&eps)).unwrap();
    assert_eq!(pods_of(&r), ["10.2.0.1:8080"]);
    // Another fleet's default is nodes: a ClusterIP Service cannot be reached that way.
    let r = resolve(&web_ingress("a.com", "/"), Config::default(), &s, Some(&eps)).unwrap();
    assert_eq!(r.routes[0].backend.pods, None);
    assert_eq!(r.warnings[0].reason, "RouteWithdrawn");
    // The Service's own word wins over its fleet's.
    let mut nodes = services("NodePort");
    let svc = nodes.get_mut(&("shop".to_owned(), "web".to_owned())).unwrap();
    std::sync::Arc::make_mut(svc).metadata.annotations =
        Some([("hafleet.io/endpoints".to_owned(), "nodes".to_owned())].into());
    let r = resolve(&web_ingress("a.com", "/"), pods_fleet, &nodes, Some(&eps)).unwrap();
    assert_eq!(
        (r.routes[0].backend.pods.as_ref(), r.routes[0].backend.node_port),
        (None, Some(30080))
    );
    // A value that is neither refuses the Ingress, saying so.
    let bad = cluster_ip_service(json!({"hafleet.io/endpoints": "pod"}));
    let Err(Refused::Invalid(why)) =
        resolve(&web_ingress("a.com", "/"), pods_fleet, &bad, Some(&eps))
    else {
        panic!("refused")
    };
    assert!(why[0].contains("hafleet.io/endpoints"), "{why:?}");
}

#[test]
fn the_memo_resolves_again_when_a_pods_mode_service_s_slices_change() {
    let mut memo = Memo::default();
    let web = std::sync::Arc::new(web_ingress("a.com", "/"));
    let s = cluster_ip_service(json!({"hafleet.io/endpoints": "pods"}));
    let one = pod_slices(json!([{"addresses": ["10.2.0.1"]}]));
    let mut pass = |eps: &Endpoints| {
        memo.begin_pass();
        let r = memo.resolve(&web, Config::default(), &s, Some(eps)).unwrap();
        memo.end_pass();
        (memo.fresh(), pods_of(&r))
    };
    assert_eq!(pass(&one), (1, vec!["10.2.0.1:8080".to_owned()]));
    assert_eq!(pass(&one).0, 0, "the same slices");
    let two = pod_slices(json!([{"addresses": ["10.2.0.1"]}, {"addresses": ["10.2.0.2"]}]));
    assert_eq!(pass(&two), (1, vec!["10.2.0.1:8080".to_owned(), "10.2.0.2:8080".to_owned()]));
}

#[test]
fn a_service_asks_for_the_proxy_protocol_and_a_bad_value_refuses_the_ingress() {
    let with = |value: &str| -> Services {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop",
                         "annotations": {SEND_PROXY_ANNOTATION: value}},
            "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}
        }))
        .unwrap();
        [(("shop".to_owned(), "web".to_owned()), std::sync::Arc::new(svc))].into_iter().collect()
    };
    let ing = web_ingress("a.com", "/");
    for (value, want) in
        [("v1", hafleet_proto::ProxyProtocol::V1), (" v2 ", hafleet_proto::ProxyProtocol::V2)]
    {
        let r = resolve(&ing, Config::default(), &with(value), None).unwrap();
        assert_eq!(r.routes[0].backend.options.send_proxy, Some(want), "{value}");
        assert_eq!(r.routes[0].backend.node_port, Some(30080));
    }
    let plain = resolve(&ing, Config::default(), &services("NodePort"), None).unwrap();
    assert_eq!(plain.routes[0].backend.options.send_proxy, None);
    for bad in ["v3", "V1", "true", "", "v1 send-proxy-v2"] {
        let Err(Refused::Invalid(why)) = resolve(&ing, Config::default(), &with(bad), None) else {
            panic!("send-proxy {bad:?} must refuse the Ingress")
        };
        assert!(why[0].contains("service shop/web"), "{bad}: {why:?}");
        assert!(why[0].contains("must be v1 or v2"), "{bad}: {why:?}");
    }
}
