//! TLSRoutes: TLS connections passed through by their SNI to a backend that alone holds the
//! certificate, on the same HTTPS bind as terminated HTTPS. Ported from the upstream
//! conformance cases (`conformance/tests/tlsroute-*.go`, v1.6.1).

use super::Bed;
use crate::CONVERGE;
use anyhow::Result;
use hafleet_tests::eventually;
use hafleet_tests::gateway_api::{INFRA_NS, create, delete, get};
use hafleet_tests::tls::{
    fingerprint, https_get_as, self_signed, served_fingerprint, tls_answering,
};
use serde_json::{Value, json};

/// Gateway `name` of gateway-conformance-infra on fleet `edge` with one TLS listener `https`
/// on 443 for `hostname`, of `mode`, taking TLSRoutes of its own namespace.
fn tls_gateway(name: &str, hostname: Option<&str>, mode: &str) -> Value {
    let mut listener = json!({"name": "https", "port": 443, "protocol": "TLS",
        "allowedRoutes": {"namespaces": {"from": "Same"}, "kinds": [{"kind": "TLSRoute"}]},
        "tls": {"mode": mode}});
    if let Some(h) = hostname {
        listener["hostname"] = json!(h);
    }
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": INFRA_NS, "annotations": {"hafleet.io/fleet": "edge"}},
        "spec": {"gatewayClassName": "hafleet", "listeners": [listener]}})
}

/// TLSRoute `name` of gateway-conformance-infra on Gateway `gateway` for `hostnames`, to
/// Service `backend` (of `backend_ns`, when given) on port 8443.
fn tls_route(name: &str, gateway: &str, hostnames: &[&str], backend: Value) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "TLSRoute",
        "metadata": {"name": name, "namespace": INFRA_NS},
        "spec": {"parentRefs": [{"name": gateway, "namespace": INFRA_NS}],
                 "hostnames": hostnames, "rules": [{"backendRefs": [backend]}]}})
}

/// A Service `tcp-backend` of gateway-conformance-infra on port 8443 whose pods (one on each
/// of the World's nodes) serve TLS for `names` with a certificate of their own; that
/// certificate (PEM).
async fn tls_backend(
    bed: &Bed,
    names: &[&str],
) -> Result<(Vec<u8>, Vec<tokio::task::JoinHandle<()>>)> {
    let (cert, key) = self_signed(names)?;
    let servers = tls_service(bed, "tcp-backend", (&cert, &key)).await?;
    Ok((cert, servers))
}

/// A Service `name` of gateway-conformance-infra on port 8443 whose pods (one on each of the
/// World's nodes) serve TLS with `cert` and `key`, answering with their Service's name.
async fn tls_service(
    bed: &Bed,
    name: &str,
    (cert, key): (&[u8], &[u8]),
) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let kube = &bed.world.stack.kube;
    let port = u16::try_from(kube.create_nodeport_service(INFRA_NS, name, 8443).await?)?;
    let mut servers = Vec::new();
    for b in &bed.world.backends[..2] {
        let at = std::net::SocketAddr::new(b.addr().ip(), port);
        servers.push(tls_answering(at, (cert, key), name).await?);
    }
    Ok(servers)
}

/// TLSRouteSimpleSameNamespace (and TLSRouteListenerPassthroughSupportedKinds): a TLSRoute
/// on a Passthrough listener attaches; on every host, a TLS connection for its name gets the
/// backend's own certificate (HAProxy never holds it) and the backend's answer, through the
/// fleet's HTTPS bind; the listener lists TLSRoute among its supported kinds and counts the
/// route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_route_simple_same_namespace() -> Result<()> {
    let bed = Bed::start().await?;
    let (cert, _servers) = tls_backend(&bed, &["abc.example.com"]).await?;
    create(&bed.client, tls_gateway("gateway-tlsroute", Some("*.example.com"), "Passthrough"))
        .await?;
    let backend = json!({"name": "tcp-backend", "port": 8443});
    let route = tls_route(
        "gateway-conformance-infra-test",
        "gateway-tlsroute",
        &["abc.example.com"],
        backend,
    );
    create(&bed.client, route).await?;
    let want = [("Accepted", "True", "Accepted"), ("ResolvedRefs", "True", "ResolvedRefs")];
    bed.kind_says(
        "TLSRoute",
        (INFRA_NS, "gateway-conformance-infra-test"),
        "gateway-tlsroute",
        &want,
    )
    .await?;

    let ca = bed.world.stack.dir().join("tcp-backend.pem");
    std::fs::write(&ca, &cert)?;
    let want_print = fingerprint(&cert)?;
    for h in &bed.world.stack.hosts {
        let addr = h.https_addr();
        let what = format!("{}: abc.example.com passed through", h.name());
        let (ca, want_print) = (&ca, &want_print);
        eventually(CONVERGE, &what, || async move {
            let served = served_fingerprint(addr, "abc.example.com").await?;
            anyhow::ensure!(served.as_ref() == Some(want_print), "served {served:?}");
            let answer = https_get_as(addr, "abc.example.com", "abc.example.com", ca).await?;
            anyhow::ensure!(answer.ends_with("\r\n\r\ntcp-backend\n"), "{answer}");
            Ok(())
        })
        .await?;
    }
    let client = &bed.client;
    eventually(CONVERGE, "the listener's supported kinds and routes", || async move {
        let gw = get(client, "Gateway", Some(INFRA_NS), "gateway-tlsroute").await?;
        let listener = &gw.data["status"]["listeners"][0];
        let kinds = &listener["supportedKinds"];
        anyhow::ensure!(kinds.to_string().contains("\"TLSRoute\""), "{kinds}");
        anyhow::ensure!(listener["attachedRoutes"] == 1, "{listener}");
        Ok(())
    })
    .await?;
    Ok(())
}

/// TLSRouteHostnameIntersection: a TLSRoute takes the names where its hostnames and its
/// listener's intersect, a wildcard matching any number of labels, the more specific name
/// first; a name outside the intersection is refused. Upstream's four Gateways each have an
/// address of their own; here they share one fleet's HTTPS bind, so each case runs alone, its
/// Gateway and routes deleted before the next. Then, beyond upstream, a rule with two
/// backends shares its name's connections between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_route_hostname_intersection() -> Result<()> {
    let bed = Bed::start().await?;
    let client = &bed.client;
    let names = ["abc.example.com", "other.example.com", "a.b.example.com"];
    let (cert, key) = self_signed(&names)?;
    let _one = tls_service(&bed, "tls-backend", (&cert, &key)).await?;
    let _two = tls_service(&bed, "tls-backend-2", (&cert, &key)).await?;
    let ca = bed.world.stack.dir().join("tls-backend.pem");
    std::fs::write(&ca, &cert)?;
    let backend = |name: &str| json!({"name": name, "port": 8443});
    // (listener hostname, [(route, its hostname, its backend)], [(name, the backend that
    // answers it, None: refused)]), as upstream's cases x-1 to x-4.
    type Case<'a> =
        (Option<&'a str>, Vec<(&'a str, &'a str, &'a str)>, Vec<(&'a str, Option<&'a str>)>);
    let cases: Vec<Case> = vec![
        (
            Some("abc.example.com"),
            vec![("tlsroute-more-specific-wc-hostname-x-1", "*.example.com", "tls-backend")],
            vec![("abc.example.com", Some("tls-backend")), ("non.matching.com", None)],
        ),
        (
            Some("*.example.com"),
            vec![
                ("tlsroute-exact-hostname-x-2", "abc.example.com", "tls-backend"),
                ("tlsroute-less-specific-wc-hostname-x-2", "*.com", "tls-backend-2"),
            ],
            vec![
                ("abc.example.com", Some("tls-backend")),
                ("other.example.com", Some("tls-backend-2")),
                ("a.b.example.com", Some("tls-backend-2")),
                ("non.matching.com", None),
            ],
        ),
        (
            Some("*.com"),
            vec![
                ("tlsroute-exact-hostname-x-3", "abc.example.com", "tls-backend"),
                ("tlsroute-more-specific-wc-hostname-x-3", "*.example.com", "tls-backend-2"),
            ],
            vec![
                ("abc.example.com", Some("tls-backend")),
                ("other.example.com", Some("tls-backend-2")),
                ("non.matching.com", None),
            ],
        ),
        (
            None,
            vec![
                ("tlsroute-exact-hostname-x-4", "abc.example.com", "tls-backend"),
                ("tlsroute-less-specific-wc-hostname-x-4", "*.com", "tls-backend-2"),
            ],
            vec![
                ("abc.example.com", Some("tls-backend")),
                ("other.example.com", Some("tls-backend-2")),
                ("non.matching.org", None),
            ],
        ),
    ];
    for (i, (listener, routes, asks)) in cases.into_iter().enumerate() {
        let gateway = format!("gw-tlsroute-x-{}", i + 1);
        create(client, tls_gateway(&gateway, listener, "Passthrough")).await?;
        for (route, hostname, to) in &routes {
            create(client, tls_route(route, &gateway, &[hostname], backend(to))).await?;
        }
        let want = [("Accepted", "True", "Accepted"), ("ResolvedRefs", "True", "ResolvedRefs")];
        for (route, _, _) in &routes {
            bed.kind_says("TLSRoute", (INFRA_NS, route), &gateway, &want).await?;
        }
        for h in &bed.world.stack.hosts {
            let addr = h.https_addr();
            for (name, answers) in &asks {
                let what = format!("{}: {gateway}: {name} answered by {answers:?}", h.name());
                let ca = &ca;
                eventually(CONVERGE, &what, || async move {
                    match answers {
                        Some(backend) => {
                            let answer = https_get_as(addr, name, name, ca).await?;
                            let body = format!("\r\n\r\n{backend}\n");
                            anyhow::ensure!(answer.ends_with(&body), "{answer}");
                        }
                        None => {
                            let served = served_fingerprint(addr, name).await?;
                            anyhow::ensure!(served.is_none(), "{name} was served");
                        }
                    }
                    Ok(())
                })
                .await?;
            }
        }
        for (route, _, _) in &routes {
            delete(client, "TLSRoute", (INFRA_NS, route)).await?;
        }
        delete(client, "Gateway", (INFRA_NS, &gateway)).await?;
    }
    // Beyond upstream: a rule with two backends shares a name's connections between them,
    // one draw per connection (each missed in 24 connections with odds of 1 in 2^24).
    create(client, tls_gateway("gw-tlsroute-shared", Some("*.example.com"), "Passthrough")).await?;
    let mut shared = tls_route(
        "tlsroute-shared",
        "gw-tlsroute-shared",
        &["abc.example.com"],
        backend("tls-backend"),
    );
    shared["spec"]["rules"][0]["backendRefs"] = json!([
        {"name": "tls-backend", "port": 8443, "weight": 1},
        {"name": "tls-backend-2", "port": 8443, "weight": 1}]);
    create(client, shared).await?;
    let want = [("Accepted", "True", "Accepted"), ("ResolvedRefs", "True", "ResolvedRefs")];
    bed.kind_says("TLSRoute", (INFRA_NS, "tlsroute-shared"), "gw-tlsroute-shared", &want).await?;
    let addr = bed.world.stack.hosts[0].https_addr();
    let ca = &ca;
    eventually(CONVERGE, "both backends answer abc.example.com", || async move {
        let mut answered = std::collections::BTreeSet::new();
        for _ in 0..24 {
            let answer = https_get_as(addr, "abc.example.com", "abc.example.com", ca).await?;
            answered.insert(answer.rsplit("\r\n\r\n").next().unwrap_or_default().to_owned());
        }
        let want: std::collections::BTreeSet<String> =
            ["tls-backend\n", "tls-backend-2\n"].map(String::from).into();
        anyhow::ensure!(answered == want, "{answered:?}");
        Ok(())
    })
    .await
}

/// Waits until Gateway `gateway`'s listener `listener` says `want` (type, status, reason).
async fn listener_says(bed: &Bed, gateway: &str, want: (&str, &str, &str)) -> Result<()> {
    let client = &bed.client;
    let what = format!("Gateway {gateway}'s listener: {want:?}");
    eventually(CONVERGE, &what, || async move {
        let gw = get(client, "Gateway", Some(INFRA_NS), gateway).await?;
        let said = hafleet_tests::gateway_api::conditions_of(&gw.data["status"]["listeners"][0]);
        anyhow::ensure!(
            hafleet_tests::gateway_api::has_condition(&said, want.0, want.1, Some(want.2)),
            "{said:?}"
        );
        Ok(())
    })
    .await
}

/// What a TLSRoute that cannot be served is told, as the upstream cases say, on one bed:
/// TLSRouteInvalidNoMatchingListener (a Gateway whose only listener is HTTP, or HTTPS, does
/// not allow it: NotAllowedByListeners; a sectionName no listener has: NoMatchingParent),
/// TLSRouteInvalidNoMatchingListenerHostname (a name neither an exact nor a wildcard listener
/// hostname covers: NoMatchingListenerHostname, and the Gateways count no route),
/// TLSRouteInvalidBackendRefNonexistent (BackendNotFound), TLSRouteInvalidBackendRefUnknownKind
/// (InvalidKind) and TLSRouteListenerTerminateNotSupported (a TLS listener that would
/// terminate: the listener's Accepted False, UnsupportedValue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_route_invalid_cases_say_why() -> Result<()> {
    let bed = Bed::start().await?;
    let client = &bed.client;
    let (_cert, _servers) = tls_backend(&bed, &["abc.example.com"]).await?;
    let plain = |name: &str, protocol: &str, port: u16| {
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": name, "namespace": INFRA_NS, "annotations": {"hafleet.io/fleet": "edge"}},
            "spec": {"gatewayClassName": "hafleet", "listeners": [
                {"name": protocol.to_lowercase(), "port": port, "protocol": protocol,
                 "allowedRoutes": {"namespaces": {"from": "Same"}}}]}})
    };
    let mut https = plain("gateway-tlsroute-https-only", "HTTPS", 443);
    https["spec"]["listeners"][0]["tls"] = json!({"mode": "Terminate", "certificateRefs": [
        {"group": "", "kind": "Secret", "name": "tls-validity-checks-certificate"}]});
    for gw in [
        plain("gateway-tlsroute-http-only", "HTTP", 80),
        https,
        tls_gateway("gateway-tlsroute-tls-passthrough-only", None, "Passthrough"),
        tls_gateway("gateway-tls-exact-hostname", Some("www.example.com"), "Passthrough"),
        tls_gateway("gateway-tls-wildcard-hostname", Some("*.example.com"), "Passthrough"),
        tls_gateway(
            "gateway-tlsroute-terminate-unsupported",
            Some("terminate.example.com"),
            "Terminate",
        ),
    ] {
        create(client, gw).await?;
    }
    let backend = || json!({"name": "tcp-backend", "port": 8443});
    let mut no_section = tls_route(
        "tlsroute-no-matching-section",
        "gateway-tlsroute-tls-passthrough-only",
        &["abc.example.com"],
        backend(),
    );
    no_section["spec"]["parentRefs"][0]["sectionName"] = json!("does-not-exist");
    let mut unknown_kind = tls_route(
        "invalid-backend-ref-unknown-kind",
        "gateway-tlsroute-tls-passthrough-only",
        &["abc.example.com"],
        backend(),
    );
    unknown_kind["spec"]["rules"][0]["backendRefs"][0] = json!({"group": "unknownkind.example.com", "kind": "NonExistent", "name": "tls-backend", "port": 443});
    for route in [
        tls_route(
            "tlsroute-not-allowed-protocol-http",
            "gateway-tlsroute-http-only",
            &["abc.example.com"],
            backend(),
        ),
        tls_route(
            "tlsroute-not-allowed-protocol-https",
            "gateway-tlsroute-https-only",
            &["abc.example.com"],
            backend(),
        ),
        no_section,
        tls_route(
            "tlsroute-hostname-mismatch-1",
            "gateway-tls-exact-hostname",
            &["abc.example.com"],
            backend(),
        ),
        tls_route(
            "tlsroute-hostname-mismatch-2",
            "gateway-tls-wildcard-hostname",
            &["abc.example.net"],
            backend(),
        ),
        tls_route(
            "invalid-backend-ref-nonexistent",
            "gateway-tlsroute-tls-passthrough-only",
            &["abc.example.com"],
            json!({"name": "nonexistent", "port": 443}),
        ),
        unknown_kind,
    ] {
        create(client, route).await?;
    }
    let not = |reason| [("Accepted", "False", reason)];
    for (route, gateway, want) in [
        (
            "tlsroute-not-allowed-protocol-http",
            "gateway-tlsroute-http-only",
            not("NotAllowedByListeners"),
        ),
        (
            "tlsroute-not-allowed-protocol-https",
            "gateway-tlsroute-https-only",
            not("NotAllowedByListeners"),
        ),
        (
            "tlsroute-no-matching-section",
            "gateway-tlsroute-tls-passthrough-only",
            not("NoMatchingParent"),
        ),
        (
            "tlsroute-hostname-mismatch-1",
            "gateway-tls-exact-hostname",
            not("NoMatchingListenerHostname"),
        ),
        (
            "tlsroute-hostname-mismatch-2",
            "gateway-tls-wildcard-hostname",
            not("NoMatchingListenerHostname"),
        ),
        (
            "invalid-backend-ref-nonexistent",
            "gateway-tlsroute-tls-passthrough-only",
            [("ResolvedRefs", "False", "BackendNotFound")],
        ),
        (
            "invalid-backend-ref-unknown-kind",
            "gateway-tlsroute-tls-passthrough-only",
            [("ResolvedRefs", "False", "InvalidKind")],
        ),
    ] {
        bed.kind_says("TLSRoute", (INFRA_NS, route), gateway, &want).await?;
    }
    listener_says(
        &bed,
        "gateway-tlsroute-terminate-unsupported",
        ("Accepted", "False", "UnsupportedValue"),
    )
    .await?;
    for gateway in ["gateway-tls-exact-hostname", "gateway-tls-wildcard-hostname"] {
        let gw = get(client, "Gateway", Some(INFRA_NS), gateway).await?;
        let attached = &gw.data["status"]["listeners"][0]["attachedRoutes"];
        anyhow::ensure!(*attached == 0, "{gateway}: {attached}");
    }
    Ok(())
}

/// HTTPRouteDisallowedKind: an HTTPRoute names a Gateway whose only listener takes TLSRoutes:
/// Accepted False (NotAllowedByListeners) with its references resolved, no parent accepts it,
/// and the Gateway counts no route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_disallowed_kind() -> Result<()> {
    let bed = Bed::start().await?;
    let client = &bed.client;
    create(client, tls_gateway("tlsroutes-only", None, "Passthrough")).await?;
    let spec = json!({"parentRefs": [{"name": "tlsroutes-only", "namespace": INFRA_NS}],
        "rules": [{"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]});
    create(client, super::http_route(INFRA_NS, "disallowed-kind", spec)).await?;
    let want =
        [("Accepted", "False", "NotAllowedByListeners"), ("ResolvedRefs", "True", "ResolvedRefs")];
    bed.route_says((INFRA_NS, "disallowed-kind"), "tlsroutes-only", &want).await?;
    bed.no_parent_accepts((INFRA_NS, "disallowed-kind"), "tlsroutes-only").await
}

/// TLSRouteInvalidReferenceGrant: a TLSRoute's Service in another namespace, with only
/// ReferenceGrants that are wrong in one way each (the grant's namespace, the from group, kind
/// or namespace, the to group, kind or name): the route is Accepted, its ResolvedRefs False
/// with RefNotPermitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_route_invalid_reference_grant() -> Result<()> {
    let bed = Bed::start().await?;
    let client = &bed.client;
    let app = hafleet_tests::gateway_api::APP_NS;
    let grant = |name: &str, ns: &str, from: (&str, &str, &str), to: (&str, &str, &str)| {
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "ReferenceGrant",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"from": [{"group": from.0, "kind": from.1, "namespace": from.2}],
                     "to": [{"group": to.0, "kind": to.1, "name": to.2}]}})
    };
    let (g, right_from, right_to) = (
        "gateway.networking.k8s.io",
        ("gateway.networking.k8s.io", "TLSRoute", INFRA_NS),
        ("", "Service", "tls-backend"),
    );
    let wrong = "not-the-one";
    for object in [
        grant("reference-grant-wrong-namespace", INFRA_NS, right_from, right_to),
        grant("reference-grant-wrong-from-group", app, (wrong, "TLSRoute", INFRA_NS), right_to),
        grant("reference-grant-wrong-from-kind", app, (g, "Gateway", INFRA_NS), right_to),
        grant("reference-grant-wrong-from-namespace", app, (g, "TLSRoute", wrong), right_to),
        grant("reference-grant-wrong-to-group", app, right_from, (wrong, "Service", "tls-backend")),
        grant("reference-grant-wrong-to-kind", app, right_from, ("", "Secret", "tls-backend")),
        grant("reference-grant-wrong-to-name", app, right_from, ("", "Service", wrong)),
        tls_gateway("gateway-tlsroute-referencegrant", Some("*.example.com"), "Passthrough"),
        tls_route(
            "gateway-conformance-infra-test",
            "gateway-tlsroute-referencegrant",
            &["abc.example.com"],
            json!({"name": "tls-backend", "namespace": app, "port": 443}),
        ),
    ] {
        create(client, object).await?;
    }
    let want = [("Accepted", "True", "Accepted"), ("ResolvedRefs", "False", "RefNotPermitted")];
    let route = (INFRA_NS, "gateway-conformance-infra-test");
    bed.kind_says("TLSRoute", route, "gateway-tlsroute-referencegrant", &want).await
}
