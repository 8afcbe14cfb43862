//! Tests of [`super`]: HTTPRoutes against hafleet's Gateways, as the upstream specification
//! says they attach, resolve and report.

use super::route::{Outcome, resolve};
use super::status::route_status;
use super::*;
use crate::core::resolve::{Config, Refused, Services};
use hafleet_proto::{FailStatus, IngressKey, PathKind};
use k8s_openapi::api::core::v1::Service;
use serde_json::json;

fn object(value: serde_json::Value) -> Arc<DynamicObject> {
    Arc::new(serde_json::from_value(value).unwrap())
}

fn class(name: &str, controller: &str) -> Arc<DynamicObject> {
    object(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": name}, "spec": {"controllerName": controller}}))
}

/// Gateway `infra/edge` of class `hafleet` on fleet `edge` with these listeners.
fn gateway(listeners: serde_json::Value) -> Arc<DynamicObject> {
    object(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "edge", "namespace": "infra", "annotations": {"hafleet.io/fleet": "edge"}},
        "spec": {"gatewayClassName": "hafleet", "listeners": listeners}}))
}

fn http_listener(name: &str, hostname: Option<&str>, from: &str) -> serde_json::Value {
    let mut l = json!({"name": name, "port": 80, "protocol": "HTTP",
        "allowedRoutes": {"namespaces": {"from": from}}});
    if let Some(h) = hostname {
        l["hostname"] = json!(h);
    }
    l
}

fn route(ns: &str, spec: serde_json::Value) -> Arc<DynamicObject> {
    object(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "shop", "namespace": ns, "generation": 3, "resourceVersion": "7"},
        "spec": spec}))
}

fn services(list: &[(&str, &str)]) -> Services {
    list.iter()
        .map(|(ns, name)| {
            let svc: Service = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": ns},
                "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}
            }))
            .unwrap();
            (((*ns).to_owned(), (*name).to_owned()), Arc::new(svc))
        })
        .collect()
}

fn resolve_with(
    gateway: &Arc<DynamicObject>,
    grants: &[Arc<DynamicObject>],
    r: &DynamicObject,
    services: &Services,
) -> Outcome {
    let classes = [class("hafleet", CONTROLLER_NAME), class("other", "example.com/else")];
    let gateways = std::slice::from_ref(gateway);
    let objects = Objects { classes: &classes, gateways, grants, ..Default::default() };
    resolve(r, &Index::new(&objects), Config::default(), services, None)
}

/// A parent's `ResolvedRefs` when every backendRef resolves (said to parents that do not take
/// the route too).
const RESOLVED: (&str, &str, bool) = ("ResolvedRefs", "ResolvedRefs", true);

/// `(reason, ok)` of each condition of the route's first parent.
fn conditions(o: &Outcome) -> Vec<(&'static str, &'static str, bool)> {
    o.parents[0].conditions.iter().map(|c| (c.type_, c.reason, c.ok)).collect()
}

fn hosts_and_paths(o: &Outcome) -> Vec<(String, String, PathKind)> {
    let r = &o.result.as_ref().expect("routed")[0];
    r.routes
        .iter()
        .map(|r| {
            let host = r.host.as_ref().map_or("*".to_owned(), |h| h.to_string());
            (host, r.path.to_string(), r.kind)
        })
        .collect()
}

#[test]
fn a_route_on_a_hafleet_gateway_is_routed_on_its_fleet_under_its_own_key() {
    let gw = gateway(json!([http_listener("http", None, "All")]));
    let r = route(
        "shop",
        json!({"parentRefs": [{"name": "edge", "namespace": "infra"}],
        "hostnames": ["shop.example.com"],
        "rules": [
            {"matches": [{"path": {"type": "Exact", "value": "/login"}},
                         {"path": {"type": "PathPrefix", "value": "/api"}}],
             "filters": [{"type": "RequestHeaderModifier",
                          "requestHeaderModifier": {"set": [{"name": "X-Env", "value": "prod"}]}}],
             "backendRefs": [{"name": "api", "port": 80}]},
            // The same path again: the first rule has it.
            {"matches": [{"path": {"value": "/api"}}], "backendRefs": [{"name": "web", "port": 80}]},
            {"backendRefs": [{"name": "web", "port": 80}]}
        ]}),
    );
    let o = resolve_with(&gw, &[], &r, &services(&[("shop", "api"), ("shop", "web")]));
    assert_eq!(
        conditions(&o),
        [("Accepted", "Accepted", true), ("ResolvedRefs", "ResolvedRefs", true)]
    );
    assert_eq!(o.parents[0].listeners, ["http"]);
    let resolved = &o.result.as_ref().unwrap()[0];
    assert_eq!(resolved.key, IngressKey::http_route("shop", "shop").unwrap());
    assert_eq!(resolved.fleet.as_str(), "edge");
    assert_eq!(
        hosts_and_paths(&o),
        [
            ("shop.example.com".into(), "/login".into(), PathKind::Exact),
            ("shop.example.com".into(), "/api".into(), PathKind::Prefix),
            ("shop.example.com".into(), "/".into(), PathKind::Prefix),
        ]
    );
    let api = &resolved.routes[1].backend;
    assert_eq!((api.service.name.as_str(), api.node_port), ("api", Some(30080)));
    assert_eq!(api.options.request_headers.set[0].0.as_str(), "X-Env");
    assert_eq!(resolved.routes[2].backend.service.name.as_str(), "web");
    assert!(resolved.routes[2].backend.options.request_headers.is_empty());
}

#[test]
fn hostnames_are_intersected_with_the_listeners() {
    for (listener, route, want) in [
        (None, "a.example.com", Some("a.example.com")),
        (Some("a.example.com"), "a.example.com", Some("a.example.com")),
        (Some("*.example.com"), "a.example.com", Some("a.example.com")),
        (Some("*.example.com"), "a.b.example.com", Some("a.b.example.com")),
        (Some("*.example.com"), "example.com", None),
        (Some("a.example.com"), "*.example.com", Some("a.example.com")),
        (Some("*.example.com"), "*.b.example.com", Some("*.b.example.com")),
        (Some("*.b.example.com"), "*.example.com", Some("*.b.example.com")),
        (Some("a.example.com"), "b.example.com", None),
    ] {
        assert_eq!(intersect(listener, route).as_deref(), want, "{listener:?} {route}");
    }
    let gw = gateway(json!([
        http_listener("wild", Some("*.example.com"), "All"),
        http_listener("other", Some("other.org"), "All"),
    ]));
    let spec = |hostnames: serde_json::Value| {
        route(
            "shop",
            json!({"parentRefs": [{"name": "edge", "namespace": "infra"}], "hostnames": hostnames,
                   "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}),
        )
    };
    let svc = services(&[("shop", "web")]);
    let o = resolve_with(&gw, &[], &spec(json!(["a.example.com", "nope.net"])), &svc);
    assert_eq!(hosts_and_paths(&o), [("a.example.com".into(), "/".into(), PathKind::Prefix)]);
    assert_eq!(o.parents[0].listeners, ["wild"]);
    // No hostnames of its own: each listener's.
    let o = resolve_with(&gw, &[], &spec(json!([])), &svc);
    let hosts: Vec<String> = hosts_and_paths(&o).into_iter().map(|h| h.0).collect();
    assert_eq!(hosts, ["*.example.com", "other.org"]);
    let o = resolve_with(&gw, &[], &spec(json!(["nope.net"])), &svc);
    assert_eq!(conditions(&o), [("Accepted", "NoMatchingListenerHostname", false), RESOLVED]);
    assert_eq!(o.result.unwrap_err(), Refused::NotSelected);
}

#[test]
fn listeners_say_which_namespaces_and_section_a_route_may_attach_from() {
    let svc = services(&[("shop", "web")]);
    let spec = |parent: serde_json::Value| {
        route(
            "shop",
            json!({"parentRefs": [parent], "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}),
        )
    };
    let same = gateway(json!([http_listener("http", None, "Same")]));
    let o = resolve_with(&same, &[], &spec(json!({"name": "edge", "namespace": "infra"})), &svc);
    assert_eq!(conditions(&o), [("Accepted", "NotAllowedByListeners", false), RESOLVED]);
    let all = gateway(json!([http_listener("http", None, "All")]));
    let named = json!({"name": "edge", "namespace": "infra", "sectionName": "nope"});
    let o = resolve_with(&all, &[], &spec(named), &svc);
    assert_eq!(conditions(&o), [("Accepted", "NoMatchingParent", false), RESOLVED]);
    let named = json!({"name": "edge", "namespace": "infra", "sectionName": "http"});
    assert!(resolve_with(&all, &[], &spec(named), &svc).result.is_ok());
    // A Gateway of another class, or one that does not exist: not hafleet's to answer.
    let o = resolve_with(&all, &[], &spec(json!({"name": "elsewhere"})), &svc);
    assert!(o.parents.is_empty());
    assert_eq!(o.result.unwrap_err(), Refused::NotSelected);
    // A listener hafleet does not serve yet says so, and takes no route.
    let udp = gateway(json!([{"name": "dns", "port": 53, "protocol": "UDP"}]));
    let o = resolve_with(&udp, &[], &spec(json!({"name": "edge", "namespace": "infra"})), &svc);
    assert_eq!(conditions(&o), [("Accepted", "NotAllowedByListeners", false), RESOLVED]);
}

/// An HTTPS listener's certificate is its first certificateRefs entry (in another namespace
/// with a ReferenceGrant there); a host reached through HTTPS listeners only is served over
/// TLS only, one reached through both over either; the route asks for the listener's Secret
/// for the hosts it routes through it, and never redirects plain HTTP by itself.
#[test]
fn https_listeners_give_their_certificate_and_keep_their_routes_to_tls() {
    let https = |name: &str, hostname: &str, cert: serde_json::Value| {
        json!({"name": name, "port": 443, "protocol": "HTTPS", "hostname": hostname,
            "allowedRoutes": {"namespaces": {"from": "All"}},
            "tls": {"certificateRefs": [cert]}})
    };
    let gw = gateway(json!([
        http_listener("http", Some("both.example.com"), "All"),
        https("both", "both.example.com", json!({"name": "both-cert"})),
        https("secure", "secure.example.com", json!({"name": "secure-cert"})),
        https("other", "other.example.com", json!({"name": "c", "namespace": "certs"})),
        https("map", "map.example.com", json!({"name": "c", "kind": "ConfigMap"})),
    ]));
    let svc = services(&[("shop", "web")]);
    let r = route(
        "shop",
        json!({"parentRefs": [{"name": "edge", "namespace": "infra"}],
            "hostnames": ["both.example.com", "secure.example.com", "other.example.com"],
            "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}),
    );
    let o = resolve_with(&gw, &[], &r, &svc);
    let resolved = &o.result.as_ref().expect("routed")[0];
    let tls_of = |host: &str| {
        let route = resolved.routes.iter().find(|r| r.host.as_ref().unwrap().as_str() == host);
        let route = route.expect("a route for the host");
        assert_eq!(route.backend.options.ssl_redirect, Some(false));
        route.more.as_ref().is_some_and(|m| m.tls)
    };
    assert!(!tls_of("both.example.com"));
    assert!(tls_of("secure.example.com"));
    assert!(tls_of("other.example.com"));
    let asked: Vec<(Option<&str>, Option<&str>, Vec<String>)> = resolved
        .tls_spec
        .iter()
        .map(|e| (e.namespace.as_deref(), e.secret.as_deref(), e.hosts.clone()))
        .collect();
    assert_eq!(
        asked,
        [
            (Some("infra"), Some("both-cert"), vec!["both.example.com".to_owned()]),
            (Some("infra"), Some("secure-cert"), vec!["secure.example.com".to_owned()]),
        ]
    );
    // The listeners' own status: the certificate of another namespace needs a grant there;
    // a ConfigMap is no certificate.
    let classes = [class("hafleet", CONTROLLER_NAME)];
    let gateways = std::slice::from_ref(&gw);
    let index = Index::new(&Objects { classes: &classes, gateways, ..Default::default() });
    let view = &index.gateways[&("infra".to_owned(), "edge".to_owned())];
    let unresolved: Vec<Option<&str>> =
        view.listeners.iter().map(|l| l.unresolved.as_ref().map(|(r, _)| *r)).collect();
    assert_eq!(
        unresolved,
        [None, None, None, Some("RefNotPermitted"), Some("InvalidCertificateRef")]
    );
    let grant = object(json!({"apiVersion": "gateway.networking.k8s.io/v1beta1",
        "kind": "ReferenceGrant", "metadata": {"name": "certs", "namespace": "certs"},
        "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
            "namespace": "infra"}], "to": [{"group": "", "kind": "Secret"}]}}));
    let o = resolve_with(&gw, &[grant], &r, &svc);
    let asked = &o.result.as_ref().expect("routed")[0].tls_spec;
    assert!(
        asked
            .iter()
            .any(|e| e.namespace.as_deref() == Some("certs") && e.hosts == ["other.example.com"])
    );
    // A Secret that is not usable says why on its listener, which is then not Programmed.
    let unusable = |_: &str, name: &str| (name == "secure-cert").then(|| "has no tls.key".into());
    let status = super::status::gateway_status(
        view,
        &std::collections::BTreeMap::new(),
        &Default::default(),
        (Some((4, 2)), &unusable),
        "2026-11-27T00:00:00Z",
    )
    .expect("a status");
    let listener = |name: &str| {
        let all = status["listeners"].as_array().unwrap();
        all.iter().find(|l| l["name"] == name).unwrap()["conditions"].clone()
    };
    let condition = |name: &str, type_: &str| {
        let all = listener(name);
        let c = all.as_array().unwrap().iter().find(|c| c["type"] == type_).unwrap().clone();
        (c["status"].as_str().unwrap().to_owned(), c["reason"].as_str().unwrap().to_owned())
    };
    assert_eq!(
        condition("secure", "ResolvedRefs"),
        ("False".into(), "InvalidCertificateRef".into())
    );
    assert_eq!(condition("secure", "Programmed"), ("False".into(), "Invalid".into()));
    assert_eq!(condition("both", "ResolvedRefs"), ("True".into(), "ResolvedRefs".into()));
    assert_eq!(condition("both", "Programmed"), ("True".into(), "Programmed".into()));
    assert_eq!(condition("map", "ResolvedRefs"), ("False".into(), "InvalidCertificateRef".into()));
}

#[test]
fn a_backend_that_cannot_be_resolved_answers_500_and_says_why() {
    let gw = gateway(json!([http_listener("http", None, "All")]));
    let svc = services(&[("shop", "web"), ("billing", "pay")]);
    let spec = |backend: serde_json::Value| {
        route(
            "shop",
            json!({"parentRefs": [{"name": "edge", "namespace": "infra"}],
                   "rules": [{"backendRefs": [backend]}]}),
        )
    };
    let grant = object(
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "ReferenceGrant",
        "metadata": {"name": "shop-pays", "namespace": "billing"},
        "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "shop"}],
                 "to": [{"group": "", "kind": "Service", "name": "pay"}]}}),
    );
    for (backend, grants, reason) in [
        (json!({"name": "gone", "port": 80}), vec![], "BackendNotFound"),
        (json!({"name": "pay", "namespace": "billing", "port": 80}), vec![], "RefNotPermitted"),
        (json!({"group": "example.com", "kind": "Bucket", "name": "b"}), vec![], "InvalidKind"),
        (json!({"name": "web"}), vec![], "UnsupportedValue"),
    ] {
        let o = resolve_with(&gw, &grants, &spec(backend.clone()), &svc);
        assert_eq!(
            conditions(&o),
            [("Accepted", "Accepted", true), ("ResolvedRefs", reason, false)],
            "{backend}"
        );
        let routes = &o.result.as_ref().unwrap()[0].routes;
        assert_eq!(routes[0].backend.options.fail_status, Some(FailStatus::InternalError));
    }
    let granted = json!({"name": "pay", "namespace": "billing", "port": 80});
    let o = resolve_with(&gw, &[grant], &spec(granted), &svc);
    let routes = &o.result.as_ref().unwrap()[0].routes;
    assert_eq!(routes[0].backend.options.fail_status, None);
    assert_eq!(routes[0].backend.service.namespace.as_str(), "billing");
    // No backendRefs at all: 500 too.
    let r = route(
        "shop",
        json!({"parentRefs": [{"name": "edge", "namespace": "infra"}], "rules": [{}]}),
    );
    let o = resolve_with(&gw, &[], &r, &svc);
    let routes = &o.result.as_ref().unwrap()[0].routes;
    assert_eq!(routes[0].backend.options.fail_status, Some(FailStatus::InternalError));
}

#[test]
fn what_is_not_served_yet_refuses_the_route_and_says_so() {
    let gw = gateway(json!([http_listener("http", None, "All")]));
    let svc = services(&[("shop", "web")]);
    let r = route(
        "shop",
        json!({"parentRefs": [{"name": "edge", "namespace": "infra"}],
               "rules": [{"matches": [{"headers": [{"type": "RegularExpression", "name": "version", "value": "2.*"}]}],
                          "backendRefs": [{"name": "web", "port": 80}]}]}),
    );
    let o = resolve_with(&gw, &[], &r, &svc);
    assert_eq!(o.parents[0].conditions[0].reason, "UnsupportedValue");
    let message = &o.parents[0].conditions[0].message;
    assert!(
        message.contains("rules[0].matches[0].headers[0].type: RegularExpression"),
        "{message}"
    );
    assert!(o.parents[0].listeners.is_empty(), "a refused route is attached to no listener");
    assert!(matches!(o.result, Err(Refused::Invalid(_))));
}

#[test]
fn a_route_status_keeps_other_controllers_entries_and_is_written_only_on_a_change() {
    let gw = gateway(json!([http_listener("http", None, "All")]));
    let svc = services(&[("shop", "web")]);
    let spec = json!({"parentRefs": [{"name": "edge", "namespace": "infra"}, {"name": "theirs"}],
                      "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]});
    let theirs = json!({"parentRef": {"name": "theirs"}, "controllerName": "example.com/else",
                        "conditions": []});
    let mut r = (*route("shop", spec)).clone();
    r.data["status"] = json!({"parents": [theirs]});
    let o = resolve_with(&gw, &[], &r, &svc);
    let status = route_status(&r, &o.parents, "2026-11-27T04:00:00Z").expect("a change");
    let parents = status["parents"].as_array().unwrap();
    assert_eq!(parents[0], theirs);
    assert_eq!(parents[1]["controllerName"], CONTROLLER_NAME);
    assert_eq!(parents[1]["parentRef"]["kind"], "Gateway");
    assert_eq!(parents[1]["conditions"][0]["observedGeneration"], 3);
    assert_eq!(parents[1]["conditions"][0]["lastTransitionTime"], "2026-11-27T04:00:00Z");
    r.data["status"] = status;
    assert_eq!(route_status(&r, &o.parents, "2026-11-27T05:00:00Z"), None, "unchanged");
    // Its parent gone: hafleet's entry goes, theirs stays.
    let status = route_status(&r, &[], "2026-11-27T05:00:00Z").expect("a change");
    assert_eq!(status["parents"].as_array().unwrap().len(), 1);
}

#[test]
fn matches_ask_of_the_request_and_weights_share_it() {
    let gw = gateway(json!([http_listener("http", None, "All")]));
    let svc = services(&[("shop", "v1"), ("shop", "v2")]);
    let r = route(
        "shop",
        json!({"parentRefs": [{"name": "edge", "namespace": "infra"}],
        "rules": [
          {"matches": [{"path": {"value": "/api"}, "method": "POST",
                        "headers": [{"name": "Version", "value": "2"},
                                    {"name": "version", "value": "3"}],
                        "queryParams": [{"name": "debug", "value": "on"}]},
                       {"path": {"value": "/api"}}],
           "backendRefs": [{"name": "v2", "port": 80}]},
          {"backendRefs": [{"name": "v1", "port": 80, "weight": 3},
                           {"name": "v2", "port": 80, "weight": 1},
                           {"name": "gone", "port": 80, "weight": 1},
                           {"name": "v1", "port": 80, "weight": 0}]}
        ]}),
    );
    let o = resolve_with(&gw, &[], &r, &svc);
    let routes = &o.result.as_ref().unwrap()[0].routes;
    assert_eq!(routes.len(), 3);
    let more = routes[0].more.as_deref().expect("conditions");
    // Of two entries for one header (names without case), the first.
    assert_eq!(more.headers.len(), 1);
    assert_eq!((more.headers[0].0.as_str(), more.headers[0].1.as_str()), ("Version", "2"));
    assert_eq!((more.query[0].0.as_str(), more.query[0].1.as_str()), ("debug", "on"));
    assert_eq!(more.method, Some(hafleet_proto::Method::Post));
    assert!(routes[1].more.is_none(), "the second match asks nothing more");
    let split = routes[2].more.as_deref().expect("weights");
    assert!(split.has_no_conditions());
    assert_eq!(split.weight, Some(3));
    assert_eq!(routes[2].backend.service.name.as_str(), "v1");
    let shares: Vec<(u32, &str, Option<FailStatus>)> = split
        .split
        .iter()
        .map(|(w, b)| (*w, b.service.name.as_str(), b.options.fail_status))
        .collect();
    assert_eq!(shares, [(1, "v2", None), (1, "gone", Some(FailStatus::InternalError))]);
    // The unresolvable share is said, and answers 500.
    assert_eq!(o.parents[0].conditions[1].reason, "BackendNotFound");
}

#[test]
fn redirects_and_rewrites_are_tied_to_each_match_s_path() {
    let gw = gateway(json!([http_listener("http", None, "All")]));
    let svc = services(&[("shop", "web")]);
    let r = route(
        "shop",
        json!({"parentRefs": [{"name": "edge", "namespace": "infra"}], "rules": [
            {"matches": [{"path": {"value": "/old"}}, {"path": {"value": "/older"}}],
             "filters": [{"type": "RequestRedirect", "requestRedirect": {
                 "port": 8083, "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}}}]},
            {"matches": [{"path": {"value": "/api"}}],
             "filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "api.internal",
                 "path": {"type": "ReplaceFullPath", "replaceFullPath": "/v2"}}}],
             "backendRefs": [{"name": "web", "port": 80}]},
            {"matches": [{"path": {"value": "/bad"}}],
             "filters": [{"type": "RequestRedirect", "requestRedirect": {"statusCode": 200}}]}
        ]}),
    );
    let o = resolve_with(&gw, &[], &r, &svc);
    let message = &o.parents[0].conditions[0].message;
    assert!(message.contains("rules[2].filters[0].requestRedirect: statusCode 200"), "{message}");
    let r = route(
        "shop",
        json!({"parentRefs": [{"name": "edge", "namespace": "infra"}], "rules": [
            {"matches": [{"path": {"value": "/old"}}, {"path": {"value": "/older"}}],
             "filters": [{"type": "RequestRedirect", "requestRedirect": {
                 "port": 8083, "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}}}]},
            {"matches": [{"path": {"value": "/api"}}],
             "filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "api.internal",
                 "path": {"type": "ReplaceFullPath", "replaceFullPath": "/v2"}}}],
             "backendRefs": [{"name": "web", "port": 80}]}
        ]}),
    );
    let o = resolve_with(&gw, &[], &r, &svc);
    // A redirect needs no backendRefs, and says nothing is unresolved.
    assert_eq!(conditions(&o)[1], ("ResolvedRefs", "ResolvedRefs", true));
    let routes = &o.result.as_ref().unwrap()[0].routes;
    let from = |i: usize| {
        let redirect = routes[i].backend.options.redirect.as_deref().unwrap();
        assert_eq!((redirect.port, redirect.code, redirect.host.as_ref()), (Some(8083), 302, None));
        redirect.prefix_to.as_ref().unwrap().from.to_string()
    };
    assert_eq!((from(0), from(1)), ("/old".to_owned(), "/older".to_owned()));
    let api = &routes[2].backend.options;
    assert_eq!(api.request_headers.set[0].0.as_str(), "Host");
    assert_eq!(api.request_headers.set[0].1.as_str(), "api.internal");
    let rewrite = api.rewrite.as_deref().unwrap();
    assert_eq!((rewrite.to.as_str(), rewrite.exact), ("/v2", true));
}

#[test]
fn a_gateway_is_programmed_only_once_its_fleet_serves_it() {
    let gw = gateway(json!([http_listener("http", None, "All")]));
    let classes = [class("hafleet", CONTROLLER_NAME)];
    let objects =
        Objects { classes: &classes, gateways: std::slice::from_ref(&gw), ..Default::default() };
    let index = Index::new(&objects);
    let view = &index.gateways[&("infra".to_owned(), "edge".to_owned())];
    let counts = std::collections::BTreeMap::from([("http", 1usize)]);
    let addresses = crate::core::status::parse("edge=192.0.2.10").unwrap();
    let usable = |_: &str, _: &str| None;
    let status =
        |served| super::status::gateway_status(view, &counts, &addresses, (served, &usable), "t0");
    let pending = status(None).unwrap();
    let said = |s: &serde_json::Value, at: &str| {
        s[at]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (c["type"].as_str().unwrap().to_owned(), c["status"].as_str().unwrap().to_owned())
            })
            .collect::<Vec<_>>()
    };
    assert!(said(&pending, "conditions").contains(&("Programmed".into(), "False".into())));
    assert_eq!(pending["addresses"][0], json!({"type": "IPAddress", "value": "192.0.2.10"}));
    let live = status(Some((12, 2))).unwrap();
    assert!(said(&live, "conditions").contains(&("Programmed".into(), "True".into())));
    assert!(
        said(&live["listeners"][0], "conditions").contains(&("Programmed".into(), "True".into()))
    );
    let message = live["conditions"][1]["message"].as_str().unwrap();
    assert_eq!(message, "fleet edge serves it: version 12 on 2 hosts");
    assert_eq!(live["listeners"][0]["attachedRoutes"], 1);
}

#[test]
fn a_selector_picks_namespaces_by_their_labels() {
    let selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector =
        serde_json::from_value(json!({
            "matchLabels": {"team": "shop"},
            "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod", "stage"]},
                                 {"key": "legacy", "operator": "DoesNotExist"}]
        }))
        .unwrap();
    let labels = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    };
    assert!(selects(&selector, &labels(&[("team", "shop"), ("env", "prod")])));
    assert!(!selects(&selector, &labels(&[("team", "shop"), ("env", "dev")])));
    assert!(!selects(&selector, &labels(&[("team", "shop"), ("env", "prod"), ("legacy", "1")])));
    assert!(!selects(&selector, &labels(&[("env", "prod")])));
    // A listener that selects: a route of a picked namespace attaches, of another not.
    let gw = gateway(json!([{"name": "http", "port": 80, "protocol": "HTTP",
        "allowedRoutes": {"namespaces": {"from": "Selector", "selector": {"matchLabels": {"team": "shop"}}}}}]));
    let classes = [class("hafleet", CONTROLLER_NAME)];
    let namespaces: NamespaceLabels = [
        ("shop".to_owned(), labels(&[("team", "shop")])),
        ("blog".to_owned(), labels(&[("team", "blog")])),
    ]
    .into_iter()
    .collect();
    let svc = services(&[("shop", "web"), ("blog", "web")]);
    let objects = Objects {
        classes: &classes,
        gateways: std::slice::from_ref(&gw),
        namespaces: Some(&namespaces),
        ..Default::default()
    };
    let index = Index::new(&objects);
    let spec = json!({"parentRefs": [{"name": "edge", "namespace": "infra"}],
                      "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]});
    let shop = resolve(&route("shop", spec.clone()), &index, Config::default(), &svc, None);
    assert!(shop.result.is_ok());
    let blog = resolve(&route("blog", spec), &index, Config::default(), &svc, None);
    assert_eq!(conditions(&blog), [("Accepted", "NotAllowedByListeners", false), RESOLVED]);
}

/// Gateway API durations, and what a rule's timeouts make of its backend's `timeout server`.
#[test]
fn timeouts_bound_the_backend_s_answer() {
    use super::filters::{TIMEOUT_OFF_MS, duration_ms};
    assert_eq!(duration_ms("500ms"), Ok(500));
    assert_eq!(duration_ms("1h30m"), Ok(5_400_000));
    assert_eq!(duration_ms("1m1s1ms"), Ok(61_001));
    assert_eq!(duration_ms("0s"), Ok(0));
    for bad in ["", "5", "ms", "1d", "1.5s", "123456s", "1h1h1h1h1h", "25h", " 1s"] {
        assert!(duration_ms(bad).is_err(), "{bad}");
    }
    let gw = gateway(json!([http_listener("http", None, "All")]));
    let svc = services(&[("shop", "web")]);
    let with = |timeouts: serde_json::Value| {
        let r = route(
            "shop",
            json!({"parentRefs": [{"name": "edge", "namespace": "infra"}],
                "rules": [{"backendRefs": [{"name": "web", "port": 80}], "timeouts": timeouts}]}),
        );
        resolve_with(&gw, &[], &r, &svc)
    };
    let server = |o: &Outcome| {
        o.result.as_ref().expect("routed")[0].routes[0].backend.options.timeout_server_ms
    };
    assert_eq!(server(&with(json!({"request": "500ms"}))), Some(500));
    assert_eq!(server(&with(json!({"request": "2s", "backendRequest": "1s"}))), Some(1_000));
    assert_eq!(server(&with(json!({"request": "0s"}))), Some(TIMEOUT_OFF_MS));
    assert_eq!(server(&with(json!({}))), None);
    // The schema's rule (its CEL, gone from the test bed's CRDs): backendRequest <= request.
    let o = with(json!({"request": "1s", "backendRequest": "2s"}));
    assert_eq!(conditions(&o)[0], ("Accepted", "UnsupportedValue", false));
    let r = route(
        "shop",
        json!({"parentRefs": [{"name": "edge", "namespace": "infra"}],
            "rules": [{"backendRefs": [{"name": "web", "port": 80}], "retry": {"attempts": 2}}]}),
    );
    let o = resolve_with(&gw, &[], &r, &svc);
    assert!(
        matches!(o.result, Err(Refused::Invalid(ref why)) if why[0].contains("rules[0].retry is not served"))
    );
    let o = with(json!({"request": "soon"}));
    assert!(
        matches!(o.result, Err(Refused::Invalid(ref why)) if why[0].contains("rules[0].timeouts"))
    );
}

/// An HTTPRoute whose parents are Gateways of two fleets is served by both, each with the
/// hostnames its own Gateway's listeners allow (as upstream's HTTPRouteMultipleGateways has
/// it: each Gateway gets the route independently), and both parents accept it.
#[test]
fn a_route_attached_to_gateways_of_two_fleets_is_routed_on_each() {
    let on = |name: &str, fleet: &str, hostname: &str| {
        object(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": name, "namespace": "infra", "annotations": {"hafleet.io/fleet": fleet}},
            "spec": {"gatewayClassName": "hafleet",
                     "listeners": [http_listener("http", Some(hostname), "All")]}}))
    };
    let gateways = [on("edge", "edge", "*.example.com"), on("core", "core", "shop.example.com")];
    let classes = [class("hafleet", CONTROLLER_NAME)];
    let objects = Objects { classes: &classes, gateways: &gateways, ..Default::default() };
    let r = route(
        "shop",
        json!({"parentRefs": [{"name": "edge", "namespace": "infra"}, {"name": "core", "namespace": "infra"}],
            "hostnames": ["shop.example.com", "blog.example.com"],
            "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}),
    );
    let svc = services(&[("shop", "web")]);
    let o = resolve(&r, &Index::new(&objects), Config::default(), &svc, None);
    let routed = o.result.as_ref().expect("routed");
    let hosts = |i: usize| -> (String, Vec<String>) {
        let r = &routed[i];
        let hosts = r.routes.iter().map(|r| r.host.as_ref().unwrap().to_string()).collect();
        (r.fleet.to_string(), hosts)
    };
    assert_eq!(routed.len(), 2);
    assert_eq!(hosts(0), ("core".to_owned(), vec!["shop.example.com".to_owned()]));
    let (edge, mut edge_hosts) = hosts(1);
    edge_hosts.sort();
    assert_eq!(
        (edge.as_str(), edge_hosts),
        ("edge", vec!["blog.example.com".into(), "shop.example.com".into()])
    );
    assert!(routed.iter().all(|r| r.key == IngressKey::http_route("shop", "shop").unwrap()));
    for p in o.parents.iter() {
        assert!(p.conditions.iter().all(|c| c.ok), "{:?}", p.conditions);
    }
}

#[test]
fn a_backend_ref_s_header_filters_change_only_its_own_share_after_the_rule_s() {
    let gw = gateway(json!([http_listener("http", None, "All")]));
    let svc = services(&[("shop", "v1"), ("shop", "v2")]);
    let set = |name: &str, value: &str| {
        json!({"type": "RequestHeaderModifier",
               "requestHeaderModifier": {"set": [{"name": name, "value": value}]}})
    };
    let r = route(
        "shop",
        json!({"parentRefs": [{"name": "edge", "namespace": "infra"}],
        "rules": [{
          "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
              "set": [{"name": "Backend", "value": "rule"}, {"name": "X-Rule", "value": "1"}],
              "add": [{"name": "X-Trace", "value": "rule"}]}}],
          "backendRefs": [
            {"name": "v1", "port": 80, "weight": 1, "filters": [set("Backend", "v1"),
              {"type": "RequestHeaderModifier",
               "requestHeaderModifier": {"add": [{"name": "X-Trace", "value": "v1"}]}},
              {"type": "ResponseHeaderModifier",
               "responseHeaderModifier": {"remove": ["Server"]}}]},
            {"name": "v2", "port": 80, "weight": 1, "filters": [set("Backend", "v2")]}]}]}),
    );
    let o = resolve_with(&gw, &[], &r, &svc);
    assert_eq!(conditions(&o)[0], ("Accepted", "Accepted", true));
    let routes = &o.result.as_ref().unwrap()[0].routes;
    let first = &routes[0].backend;
    let (_, second) = &routes[0].more.as_deref().expect("a split").split[0];
    let sets = |b: &hafleet_proto::Backend| -> Vec<String> {
        b.options.request_headers.set.iter().map(|(n, v)| format!("{n}={v}")).collect()
    };
    // The backendRef's set wins over the rule's for its own header; the rule's others stay.
    assert_eq!(sets(first), ["X-Rule=1", "Backend=v1"]);
    assert_eq!(sets(second), ["X-Rule=1", "Backend=v2"]);
    let adds: Vec<String> =
        first.options.request_headers.add.iter().map(|(n, v)| format!("{n}={v}")).collect();
    assert_eq!(adds, ["X-Trace=rule", "X-Trace=v1"], "an add keeps the rule's add");
    assert_eq!(first.options.response_headers.remove.len(), 1);
    assert!(second.options.response_headers.is_empty());
    assert_ne!(first.options, second.options, "each share its own HAProxy backend");

    // Another filter on a backendRef is not served: the route is refused and says which.
    let mirror = route(
        "shop",
        json!({"parentRefs": [{"name": "edge", "namespace": "infra"}],
        "rules": [{"backendRefs": [{"name": "v1", "port": 80, "filters": [
            {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "v2", "port": 80}}}]}]}]}),
    );
    let o = resolve_with(&gw, &[], &mirror, &svc);
    assert_eq!(o.parents[0].conditions[0].reason, "UnsupportedValue");
    let message = &o.parents[0].conditions[0].message;
    assert!(message.contains("filter RequestMirror on a backendRef is not served"), "{message}");
    assert!(matches!(o.result, Err(Refused::Invalid(_))));
}

/// A TLS listener that passes connections through by their SNI.
fn tls_listener(name: &str, hostname: Option<&str>, mode: &str) -> serde_json::Value {
    let mut l = json!({"name": name, "port": 443, "protocol": "TLS", "tls": {"mode": mode},
        "allowedRoutes": {"namespaces": {"from": "All"}}});
    if let Some(h) = hostname {
        l["hostname"] = json!(h);
    }
    l
}

fn resolve_tls(
    gateway: &Arc<DynamicObject>,
    grants: &[Arc<DynamicObject>],
    r: &DynamicObject,
    services: &Services,
) -> Outcome {
    let classes = [class("hafleet", CONTROLLER_NAME)];
    let gateways = std::slice::from_ref(gateway);
    let objects = Objects { classes: &classes, gateways, grants, ..Default::default() };
    let index = Index::new(&objects);
    super::route::resolve_kind(RouteKind::Tls, r, &index, Config::default(), (services, None))
}

#[test]
fn a_tls_route_passes_its_names_through_on_tls_listeners_only() {
    let gw = gateway(json!([
        http_listener("http", None, "All"),
        tls_listener("tls", Some("*.example.com"), "Passthrough"),
    ]));
    let svc = services(&[("shop", "db"), ("shop", "web")]);
    let spec = |parent: serde_json::Value, hosts: serde_json::Value, refs: serde_json::Value| {
        route(
            "shop",
            json!({"parentRefs": [parent], "hostnames": hosts,
                             "rules": [{"backendRefs": refs}]}),
        )
    };
    let edge = json!({"name": "edge", "namespace": "infra"});
    let db = json!([{"name": "db", "port": 80}]);
    let r = spec(edge.clone(), json!(["db.example.com", "db.example.org"]), db.clone());
    let o = resolve_tls(&gw, &[], &r, &svc);
    assert_eq!(conditions(&o), [("Accepted", "Accepted", true), RESOLVED]);
    assert_eq!(o.parents[0].listeners, ["tls"], "never the HTTP listener");
    let resolved = &o.result.as_ref().expect("routed")[0];
    assert_eq!(resolved.key, IngressKey::tls_route("shop", "shop").unwrap());
    // The listener's hostname keeps the name it covers; the other name is not served.
    assert_eq!(resolved.routes.len(), 1);
    let r0 = &resolved.routes[0];
    assert_eq!(r0.host.as_ref().map(|h| h.as_str()), Some("db.example.com"));
    assert!(r0.is_passthrough() && r0.backend.options.tcp, "{r0:?}");
    assert_eq!(r0.backend.node_port, Some(30080));
    assert!(resolved.tls_spec.is_empty(), "no certificate: nothing is terminated");

    // An HTTPRoute cannot take the TLS listener, nor a TLSRoute the HTTP one.
    let by_section =
        |section: &str| json!({"name": "edge", "namespace": "infra", "sectionName": section});
    let http = route(
        "shop",
        json!({"parentRefs": [by_section("tls")],
                                    "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}),
    );
    let o = resolve_with(&gw, &[], &http, &svc);
    assert_eq!(o.parents[0].conditions[0].reason, "NotAllowedByListeners");
    let o = resolve_tls(
        &gw,
        &[],
        &spec(by_section("http"), json!(["db.example.com"]), db.clone()),
        &svc,
    );
    assert_eq!(o.parents[0].conditions[0].reason, "NotAllowedByListeners");
    let message = &o.parents[0].conditions[0].message;
    assert!(message.contains("allows TLSRoutes of namespace shop"), "{message}");

    // A name no listener covers; a Service that does not exist.
    let o = resolve_tls(&gw, &[], &spec(edge.clone(), json!(["db.example.org"]), db.clone()), &svc);
    assert_eq!(o.parents[0].conditions[0].reason, "NoMatchingListenerHostname");
    let gone = json!([{"name": "gone", "port": 80}]);
    let o = resolve_tls(&gw, &[], &spec(edge.clone(), json!(["db.example.com"]), gone), &svc);
    assert_eq!(o.parents[0].conditions[1].reason, "BackendNotFound");
    let failing = &o.result.as_ref().expect("routed")[0].routes[0].backend;
    assert_eq!(
        (failing.options.fail_status, failing.options.tcp),
        (Some(FailStatus::InternalError), true)
    );
    // Two backends share the name's connections by weight, both carried as TCP.
    let two = json!([{"name": "db", "port": 80, "weight": 3}, {"name": "web", "port": 80}]);
    let o = resolve_tls(&gw, &[], &spec(edge.clone(), json!(["db.example.com"]), two), &svc);
    assert_eq!(o.parents[0].conditions[0].reason, "Accepted");
    let route = &o.result.as_ref().expect("routed")[0].routes[0];
    let more = route.more.as_deref().expect("more");
    assert_eq!((more.weight, more.split.len(), more.passthrough), (Some(3), 1, true));
    assert!(route.backend.options.tcp && more.split[0].1.options.tcp);

    // Another namespace's Service needs a ReferenceGrant from TLSRoutes (an HTTPRoute's does
    // not do).
    let svc = services(&[("data", "db")]);
    let other = json!([{"name": "db", "namespace": "data", "port": 80}]);
    let r = spec(edge.clone(), json!(["db.example.com"]), other);
    let grant = |from_kind: &str| {
        object(json!({"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
            "metadata": {"name": "g", "namespace": "data"},
            "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": from_kind, "namespace": "shop"}],
                     "to": [{"group": "", "kind": "Service"}]}}))
    };
    let o = resolve_tls(&gw, &[grant("HTTPRoute")], &r, &svc);
    assert_eq!(o.parents[0].conditions[1].reason, "RefNotPermitted");
    let o = resolve_tls(&gw, &[grant("TLSRoute")], &r, &svc);
    assert_eq!(conditions(&o), [("Accepted", "Accepted", true), RESOLVED]);
}

#[test]
fn a_tls_listener_that_would_terminate_is_not_served() {
    let gw = gateway(json!([tls_listener("tls", None, "Terminate")]));
    let index = Index::new(&Objects {
        classes: &[class("hafleet", CONTROLLER_NAME)],
        gateways: std::slice::from_ref(&gw),
        ..Default::default()
    });
    let view = &index.gateways[&("infra".to_owned(), "edge".to_owned())];
    let (reason, message) = view.listeners[0].refused.clone().expect("refused");
    assert_eq!(reason, "UnsupportedValue");
    assert!(message.contains("Passthrough"), "{message}");
}

#[test]
fn a_tcp_route_takes_its_listeners_ports_shared_by_weight() {
    let tcp = |name: &str, port: u16| {
        json!({"name": name, "port": port, "protocol": "TCP",
               "allowedRoutes": {"kinds": [{"kind": "TCPRoute"}], "namespaces": {"from": "All"}}})
    };
    let gw =
        gateway(json!([http_listener("http", None, "All"), tcp("one", 9300), tcp("two", 9301)]));
    let svc = services(&[("shop", "db"), ("shop", "db2")]);
    let resolve_tcp = |parent: serde_json::Value, refs: serde_json::Value| {
        let r = route("shop", json!({"parentRefs": [parent], "rules": [{"backendRefs": refs}]}));
        let classes = [class("hafleet", CONTROLLER_NAME)];
        let objects = Objects {
            classes: &classes,
            gateways: std::slice::from_ref(&gw),
            ..Default::default()
        };
        let index = Index::new(&objects);
        super::route::resolve_kind(RouteKind::Tcp, &r, &index, Config::default(), (&svc, None))
    };
    let ports = |o: &Outcome| -> Vec<u16> {
        o.result.as_ref().expect("routed")[0].routes.iter().filter_map(|r| r.tcp_port()).collect()
    };
    let db = json!([{"name": "db", "port": 80}]);
    let all = resolve_tcp(json!({"name": "edge", "namespace": "infra"}), db.clone());
    assert_eq!(conditions(&all), [("Accepted", "Accepted", true), RESOLVED]);
    assert_eq!(all.parents[0].listeners, ["one", "two"], "never the HTTP listener");
    assert_eq!(ports(&all), [9300, 9301]);
    let r = &all.result.as_ref().unwrap()[0];
    assert_eq!(r.key, IngressKey::tcp_route("shop", "shop").unwrap());
    assert!(r.routes.iter().all(|r| r.host.is_none() && r.backend.options.tcp));
    let by_port =
        resolve_tcp(json!({"name": "edge", "namespace": "infra", "port": 9301}), db.clone());
    assert_eq!(ports(&by_port), [9301]);
    let by_section =
        resolve_tcp(json!({"name": "edge", "namespace": "infra", "sectionName": "one"}), db);
    assert_eq!(ports(&by_section), [9300]);
    let http = resolve_tcp(
        json!({"name": "edge", "namespace": "infra", "sectionName": "http"}),
        json!([]),
    );
    assert_eq!(http.parents[0].conditions[0].reason, "NotAllowedByListeners");

    let weighted = resolve_tcp(
        json!({"name": "edge", "namespace": "infra", "sectionName": "one"}),
        json!([{"name": "db", "port": 80, "weight": 3}, {"name": "db2", "port": 80, "weight": 1},
               {"name": "db", "port": 80, "weight": 0}]),
    );
    let route = &weighted.result.as_ref().unwrap()[0].routes[0];
    let more = route.more.as_deref().expect("a port and shares");
    assert_eq!((more.port, more.weight), (Some(9300), Some(3)));
    assert_eq!(more.split.len(), 1);
    assert!(more.split[0].1.options.tcp && more.split[0].1.service.name.as_str() == "db2");
}

#[test]
fn a_tcp_listener_on_a_port_another_protocol_serves_on_its_fleet_is_refused() {
    let tcp = |name: &str, port: u16| {
        json!({"name": name, "port": port, "protocol": "TCP",
               "allowedRoutes": {"kinds": [{"kind": "TCPRoute"}], "namespaces": {"from": "All"}}})
    };
    // Gateway infra/edge: HTTP on 80, TCP on 5432. Gateway infra/db on the same fleet: TCP
    // on 80 and 5433. Gateway infra/other on another fleet: TCP on 8080 and 443.
    let edge = gateway(json!([http_listener("http", None, "All"), tcp("pg", 5432)]));
    let named = |name: &str, fleet: &str, listeners: serde_json::Value| {
        object(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": name, "namespace": "infra", "annotations": {"hafleet.io/fleet": fleet}},
            "spec": {"gatewayClassName": "hafleet", "listeners": listeners}}))
    };
    let db = named("db", "edge", json!([tcp("web", 80), tcp("pg2", 5433)]));
    let other = named("other", "core", json!([tcp("web", 8080), tcp("https", 443)]));
    let classes = [class("hafleet", CONTROLLER_NAME)];
    let gateways = [edge, db, other];
    let index =
        Index::new(&Objects { classes: &classes, gateways: &gateways, ..Default::default() });
    let refused = |gw: &str| -> Vec<Option<&'static str>> {
        index.gateways[&("infra".to_owned(), gw.to_owned())]
            .listeners
            .iter()
            .map(|l| l.refused.as_ref().map(|(reason, _)| *reason))
            .collect()
    };
    assert_eq!(refused("edge"), [None, None]);
    assert_eq!(refused("db"), [Some(PORT_UNAVAILABLE), None]);
    assert_eq!(
        refused("other"),
        [None, Some(PORT_UNAVAILABLE)],
        "another fleet: 8080 is free on its hosts, 443 is their HTTPS bind by default"
    );
    let view = &index.gateways[&("infra".to_owned(), "db".to_owned())];
    let (_, why) = view.listeners[0].refused.as_ref().unwrap();
    assert!(why.contains("listener http (HTTP) of Gateway infra/edge"), "{why}");
    // Its status says so: not Accepted, Conflicted with ProtocolConflict.
    let usable = |_: &str, _: &str| None;
    let status = super::status::gateway_status(
        view,
        &std::collections::BTreeMap::new(),
        &Default::default(),
        (None, &usable),
        "2026-11-28T00:00:00Z",
    )
    .expect("a status");
    let listener = &status["listeners"][0];
    let said: Vec<(String, String, String)> = listener["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
            (s("type"), s("status"), s("reason"))
        })
        .collect();
    assert!(
        said.contains(&("Accepted".into(), "False".into(), "PortUnavailable".into())),
        "{said:?}"
    );
    assert!(
        said.contains(&("Conflicted".into(), "True".into(), "ProtocolConflict".into())),
        "{said:?}"
    );
}
