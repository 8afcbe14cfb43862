//! The upstream conformance cases about hostnames: listeners' and routes' hostnames
//! intersected, and wildcards that match any number of labels.

use super::{Ask, Bed, V1, V2, V3, backend, expect_cases, http_route, infra_gateway, prefix};
use crate::CONVERGE;
use anyhow::Result;
use hafleet_tests::eventually;
use hafleet_tests::gateway_api::{INFRA_NS, create, get};
use serde_json::{Value, json};

fn listener(name: &str, hostname: Option<&str>) -> Value {
    super::listener(name, hostname, None)
}

fn at(host: &'static str, path: &'static str) -> Ask<'static> {
    Ask { method: "GET", host, path, headers: &[] }
}

/// HTTPRouteListenerHostnameMatching: routes attached to listeners by section take each
/// listener's hostname; the most specific listener hostname wins, and a wildcard listener
/// hostname matches any number of labels under it (never the name itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_listener_hostname_matching() -> Result<()> {
    let bed = Bed::start().await?;
    let gw = "httproute-listener-hostname-matching";
    let listeners = json!([
        listener("listener-1", Some("bar.com")),
        listener("listener-2", Some("foo.bar.com")),
        listener("listener-3", Some("*.bar.com")),
        listener("listener-4", Some("*.foo.com")),
    ]);
    create(&bed.client, infra_gateway(gw, listeners)).await?;
    let section = |s: &str| json!({"name": gw, "sectionName": s});
    for (name, parents, service) in [
        ("backend-v1", json!([section("listener-1")]), "infra-backend-v1"),
        ("backend-v2", json!([section("listener-2")]), "infra-backend-v2"),
        ("backend-v3", json!([section("listener-3"), section("listener-4")]), "infra-backend-v3"),
    ] {
        let spec = json!({"parentRefs": parents, "rules": [{"backendRefs": backend(service)}]});
        create(&bed.client, http_route(INFRA_NS, name, spec)).await?;
    }
    for name in ["backend-v1", "backend-v2", "backend-v3"] {
        bed.accepted_and_resolved((INFRA_NS, name), gw).await?;
    }
    expect_cases(
        &bed,
        &[
            (at("bar.com", "/"), V1),
            (at("foo.bar.com", "/"), V2),
            (at("baz.bar.com", "/"), V3),
            (at("boo.bar.com", "/"), V3),
            (at("multiple.prefixes.bar.com", "/"), V3),
            (at("multiple.prefixes.foo.com", "/"), V3),
            (at("foo.com", "/"), None),
            (at("no.matching.host", "/"), None),
        ],
    )
    .await
}

/// HTTPRouteHostnameIntersection: a route's hostnames intersected with each listener's (a
/// specific name with a wildcard, a wildcard with a wildcard); a route none of whose
/// hostnames intersects attaches nowhere and is counted on no listener; a listener without a
/// hostname takes the route's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_hostname_intersection() -> Result<()> {
    let bed = Bed::start().await?;
    let gw = "httproute-hostname-intersection";
    let listeners = json!([
        listener("listener-1", Some("very.specific.com")),
        listener("listener-2", Some("*.wildcard.io")),
        listener("listener-3", Some("*.anotherwildcard.io")),
    ]);
    create(&bed.client, infra_gateway(gw, listeners)).await?;
    let all = "httproute-hostname-intersection-all";
    create(&bed.client, infra_gateway(all, json!([listener("listener-1", None)]))).await?;
    let routes = [
        (
            "specific-host-matches-listener-specific-host",
            json!(["non.matching.com", "*.nonmatchingwildcard.io", "very.specific.com"]),
            "/s1",
            "infra-backend-v1",
        ),
        (
            "specific-host-matches-listener-wildcard-host",
            json!([
                "non.matching.com",
                "wildcard.io",
                "foo.wildcard.io",
                "bar.wildcard.io",
                "foo.bar.wildcard.io"
            ]),
            "/s2",
            "infra-backend-v2",
        ),
        (
            "wildcard-host-matches-listener-specific-host",
            json!(["non.matching.com", "*.specific.com"]),
            "/s3",
            "infra-backend-v3",
        ),
        (
            "wildcard-host-matches-listener-wildcard-host",
            json!(["*.anotherwildcard.io"]),
            "/s4",
            "infra-backend-v1",
        ),
        (
            "no-intersecting-hosts",
            json!(["specific.but.wrong.com", "wildcard.io"]),
            "/s5",
            "infra-backend-v2",
        ),
    ];
    for (name, hostnames, path, service) in &routes {
        let spec = json!({"parentRefs": [{"name": gw, "namespace": INFRA_NS}],
            "hostnames": hostnames,
            "rules": [{"matches": [{"path": prefix(path)}], "backendRefs": backend(service)}]});
        create(&bed.client, http_route(INFRA_NS, name, spec)).await?;
    }
    let spec = json!({"parentRefs": [{"name": all, "namespace": INFRA_NS}],
        "hostnames": ["first.com", "sub.first.com", "second.com", "sub.second.com"],
        "rules": [{"backendRefs": backend("infra-backend-v2")}]});
    create(&bed.client, http_route(INFRA_NS, all, spec)).await?;
    for (name, ..) in &routes[..4] {
        bed.accepted_and_resolved((INFRA_NS, name), gw).await?;
    }
    bed.accepted_and_resolved((INFRA_NS, all), all).await?;
    let want = [("Accepted", "False", "NoMatchingListenerHostname")];
    bed.route_says((INFRA_NS, "no-intersecting-hosts"), gw, &want).await?;
    // Routes count on a listener only where they are accepted.
    let client = &bed.client;
    eventually(CONVERGE, "routes counted where accepted", || async move {
        let gateway = get(client, "Gateway", Some(INFRA_NS), gw).await?;
        let listeners = gateway.data["status"]["listeners"].as_array().cloned().unwrap_or_default();
        let counts: Vec<(&str, i64)> = listeners
            .iter()
            .map(|l| {
                let name = l["name"].as_str().unwrap_or_default();
                (name, l["attachedRoutes"].as_i64().unwrap_or(-1))
            })
            .collect();
        let want = [("listener-1", 2), ("listener-2", 1), ("listener-3", 1)];
        anyhow::ensure!(counts == want, "{counts:?}");
        Ok(())
    })
    .await?;
    expect_cases(
        &bed,
        &[
            (at("very.specific.com", "/s1"), V1),
            (at("very.specific.com:1234", "/s1"), V1),
            (at("non.matching.com", "/s1"), None),
            (at("foo.nonmatchingwildcard.io", "/s1"), None),
            (at("foo.wildcard.io", "/s1"), None),
            (at("very.specific.com", "/non-matching-prefix"), None),
            (at("foo.wildcard.io", "/s2"), V2),
            (at("bar.wildcard.io", "/s2"), V2),
            (at("foo.bar.wildcard.io", "/s2"), V2),
            (at("non.matching.com", "/s2"), None),
            (at("wildcard.io", "/s2"), None),
            (at("very.specific.com", "/s2"), None),
            (at("foo.wildcard.io", "/non-matching-prefix"), None),
            (at("very.specific.com", "/s3"), V3),
            (at("non.matching.com", "/s3"), None),
            (at("foo.specific.com", "/s3"), None),
            (at("foo.wildcard.io", "/s3"), None),
            (at("foo.anotherwildcard.io", "/s4"), V1),
            (at("bar.anotherwildcard.io", "/s4"), V1),
            (at("foo.bar.anotherwildcard.io", "/s4"), V1),
            (at("anotherwildcard.io", "/s4"), None),
            (at("foo.wildcard.io", "/s4"), None),
            (at("very.specific.com", "/s4"), None),
            (at("foo.anotherwildcard.io", "/non-matching-prefix"), None),
            (at("specific.but.wrong.com", "/s5"), None),
            (at("wildcard.io", "/s5"), None),
            (at("first.com", "/"), V2),
            (at("sub.first.com", "/"), V2),
            (at("second.com", "/"), V2),
            (at("sub.second.com", "/"), V2),
            (at("third.com", "/"), None),
            (at("sub.third.com", "/"), None),
        ],
    )
    .await
}
