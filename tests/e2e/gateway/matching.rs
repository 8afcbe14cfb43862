//! The upstream conformance cases about matching: paths, headers, query parameters, methods,
//! precedence, and weights.

use super::{ANY, Ask, Bed, V1, V2, V3, backend, expect_cases, get_, headers, http_route, prefix};
use crate::expect_everywhere;
use anyhow::Result;
use hafleet_tests::gateway_api::{INFRA_NS, create};
use serde_json::{Value, json};

/// HTTPRouteMatching: a rule's matches are OR-ed: a path, or a header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_matching() -> Result<()> {
    let bed = Bed::start().await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [
        {"matches": [{"path": prefix("/")}, {"headers": headers(&[("version", "one")])}],
         "backendRefs": backend("infra-backend-v1")},
        {"matches": [{"path": prefix("/v2")}, {"headers": headers(&[("version", "two")])}],
         "backendRefs": backend("infra-backend-v2")}]});
    create(&bed.client, http_route(INFRA_NS, "matching", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "matching"), "same-namespace").await?;
    let h = |path, headers| Ask { method: "GET", host: ANY, path, headers };
    expect_cases(
        &bed,
        &[
            (get_("/"), V1),
            (get_("/example"), V1),
            (h("/", &[("Version", "one")]), V1),
            (get_("/v2"), V2),
            (get_("/v2/example"), V2),
            (h("/", &[("Version", "two")]), V2),
            (get_("/v2/"), V2),
            (get_("/v2example"), V1),
            (get_("/foo/v2/example"), V1),
        ],
    )
    .await
}

/// HTTPRouteNamedRule (Extended, provisional): a rule's name changes nothing of its routing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_named_rule() -> Result<()> {
    let bed = Bed::start().await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [
        {"name": "named-rule", "matches": [{"path": prefix("/named")}],
         "backendRefs": backend("infra-backend-v1")},
        {"matches": [{"path": prefix("/unnamed")}], "backendRefs": backend("infra-backend-v2")}]});
    create(&bed.client, http_route(INFRA_NS, "http-named-rules", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "http-named-rules"), "same-namespace").await?;
    expect_cases(&bed, &[(get_("/named"), V1), (get_("/unnamed"), V2)]).await
}

/// HTTPRouteHeaderMatching: headers are AND-ed within a match; more header matches win.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_header_matching() -> Result<()> {
    let bed = Bed::start().await?;
    let rule = |matches: Vec<Value>, to: &str| {
        let matches: Vec<Value> = matches.into_iter().map(|h| json!({"headers": h})).collect();
        json!({"matches": matches, "backendRefs": backend(to)})
    };
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [
        rule(vec![headers(&[("version", "one")])], "infra-backend-v1"),
        rule(vec![headers(&[("version", "two")])], "infra-backend-v2"),
        rule(vec![headers(&[("version", "two"), ("color", "orange")])], "infra-backend-v1"),
        rule(vec![headers(&[("color", "blue")]), headers(&[("color", "green")])], "infra-backend-v1"),
        rule(vec![headers(&[("color", "red")]), headers(&[("color", "yellow")])], "infra-backend-v2"),
    ]});
    create(&bed.client, http_route(INFRA_NS, "header-matching", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "header-matching"), "same-namespace").await?;
    let h = |headers| Ask { method: "GET", host: ANY, path: "/", headers };
    expect_cases(
        &bed,
        &[
            (h(&[("Version", "one")]), V1),
            (h(&[("Version", "two")]), V2),
            (h(&[("Version", "two"), ("Color", "orange")]), V1),
            (h(&[("Version", "two"), ("Color", "blue")]), V2),
            (h(&[("Color", "orange")]), None),
            (h(&[("Some-Other-Header", "one")]), None),
            (h(&[("Color", "blue")]), V1),
            (h(&[("Color", "green")]), V1),
            (h(&[("Color", "red")]), V2),
            (h(&[("Color", "yellow")]), V2),
            (h(&[("Color", "purple")]), None),
        ],
    )
    .await
}

/// HTTPRouteMatchingAcrossRoutes: two routes share a host; the older one's rules come first
/// where they tie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_matching_across_routes() -> Result<()> {
    let bed = Bed::start().await?;
    let part1 = json!({"parentRefs": [{"name": "same-namespace"}],
        "hostnames": ["example.com", "example.net"], "rules": [
        {"matches": [{"path": prefix("/")}, {"headers": headers(&[("version", "one")])}],
         "backendRefs": backend("infra-backend-v1")}]});
    let part2 = json!({"parentRefs": [{"name": "same-namespace"}],
        "hostnames": ["example.com"], "rules": [
        {"matches": [{"path": prefix("/v2")}, {"headers": headers(&[("version", "two")])}],
         "backendRefs": backend("infra-backend-v2")}]});
    create(&bed.client, http_route(INFRA_NS, "matching-part1", part1)).await?;
    create(&bed.client, http_route(INFRA_NS, "matching-part2", part2)).await?;
    bed.accepted_and_resolved((INFRA_NS, "matching-part1"), "same-namespace").await?;
    bed.accepted_and_resolved((INFRA_NS, "matching-part2"), "same-namespace").await?;
    let on = |host, path, headers| Ask { method: "GET", host, path, headers };
    expect_cases(
        &bed,
        &[
            (on("example.com", "/", &[]), V1),
            (on("example.com", "/example", &[]), V1),
            (on("example.net", "/example", &[]), V1),
            (on("example.com", "/example", &[("Version", "one")]), V1),
            (on("example.com", "/v2", &[]), V2),
            (on("example.net", "/v2", &[]), V1),
            (on("example.com", "/v2/example", &[]), V2),
            (on("example.com", "/", &[("Version", "two")]), V2),
        ],
    )
    .await
}

/// HTTPRoutePathMatchOrder: exact paths before prefixes, longer prefixes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_path_match_order() -> Result<()> {
    let bed = Bed::start().await?;
    let rule = |kind: &str, path: &str, to: &str| json!({"matches": [{"path": {"type": kind, "value": path}}], "backendRefs": backend(to)});
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [
        rule("Exact", "/match", "infra-backend-v1"),
        rule("Exact", "/match/exact", "infra-backend-v2"),
        rule("Exact", "/match/exact/one", "infra-backend-v3"),
        rule("PathPrefix", "/match/", "infra-backend-v3"),
        rule("PathPrefix", "/match/prefix/", "infra-backend-v1"),
        rule("PathPrefix", "/match/prefix/one", "infra-backend-v2"),
    ]});
    create(&bed.client, http_route(INFRA_NS, "path-matching-order", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "path-matching-order"), "same-namespace").await?;
    expect_cases(
        &bed,
        &[
            (get_("/match/exact/one"), V3),
            (get_("/match/exact"), V2),
            (get_("/match"), V1),
            (get_("/match/prefix/one/any"), V2),
            (get_("/match/prefix/any"), V1),
            (get_("/match/any"), V3),
        ],
    )
    .await
}

/// HTTPRouteQueryParamMatching (Extended): query parameters, alone and with paths and
/// headers; more query matches win; a path is more specific than any query match.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_query_param_matching() -> Result<()> {
    let bed = Bed::start().await?;
    let q = |list: &[(&str, &str)]| headers(list);
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [
        {"matches": [{"queryParams": q(&[("animal", "whale")])}], "backendRefs": backend("infra-backend-v1")},
        {"matches": [{"queryParams": q(&[("animal", "dolphin")])}], "backendRefs": backend("infra-backend-v2")},
        {"matches": [{"queryParams": q(&[("animal", "dolphin"), ("color", "blue")])},
                     {"queryParams": q(&[("ANIMAL", "Whale")])}], "backendRefs": backend("infra-backend-v3")},
        {"matches": [{"path": prefix("/path1"), "queryParams": q(&[("animal", "whale")])}],
         "backendRefs": backend("infra-backend-v1")},
        {"matches": [{"headers": headers(&[("version", "one")]), "queryParams": q(&[("animal", "whale")])}],
         "backendRefs": backend("infra-backend-v2")},
        {"matches": [{"path": prefix("/path2"), "headers": headers(&[("version", "two")]),
                      "queryParams": q(&[("animal", "whale")])}], "backendRefs": backend("infra-backend-v3")},
        {"matches": [{"path": prefix("/path3"), "queryParams": q(&[("animal", "shark")])},
                     {"path": prefix("/path4"), "headers": headers(&[("version", "three")]),
                      "queryParams": q(&[("animal", "kraken")])}], "backendRefs": backend("infra-backend-v1")},
        {"matches": [{"path": prefix("/path5")}], "backendRefs": backend("infra-backend-v1")},
        {"matches": [{"queryParams": q(&[("animal", "hydra")])}], "backendRefs": backend("infra-backend-v2")},
        {"matches": [{"headers": headers(&[("version", "four")])}], "backendRefs": backend("infra-backend-v3")},
    ]});
    create(&bed.client, http_route(INFRA_NS, "query-param-matching", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "query-param-matching"), "same-namespace").await?;
    let h = |path, headers| Ask { method: "GET", host: ANY, path, headers };
    expect_cases(
        &bed,
        &[
            (get_("/?animal=whale"), V1),
            (get_("/?animal=dolphin"), V2),
            (get_("/?animal=dolphin&color=blue"), V3),
            (get_("/?ANIMAL=Whale"), V3),
            (get_("/?animal=whale&otherparam=irrelevant"), V1),
            (get_("/?animal=dolphin&color=yellow"), V2),
            (get_("/?color=blue"), None),
            (get_("/?animal=dog"), None),
            (get_("/?animal=whaledolphin"), None),
            (get_("/"), None),
            (get_("/path1?animal=whale"), V1),
            (h("/?animal=whale", &[("version", "one")]), V2),
            (h("/path2?animal=whale", &[("version", "two")]), V3),
            (get_("/path3?animal=shark"), V1),
            (h("/path4?animal=kraken", &[("version", "three")]), V1),
            (get_("/?animal=shark"), None),
            (get_("/path4?animal=kraken"), None),
            (get_("/path5?animal=hydra"), V1),
            (h("/?animal=hydra", &[("version", "four")]), V3),
        ],
    )
    .await
}

/// HTTPRouteMethodMatching (Extended): methods, alone and with paths and headers; a method
/// match wins over header matches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_method_matching() -> Result<()> {
    let bed = Bed::start().await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [
        {"matches": [{"method": "POST"}], "backendRefs": backend("infra-backend-v1")},
        {"matches": [{"method": "GET"}], "backendRefs": backend("infra-backend-v2")},
        {"matches": [{"path": prefix("/path1"), "method": "GET"}], "backendRefs": backend("infra-backend-v1")},
        {"matches": [{"headers": headers(&[("version", "one")]), "method": "PUT"}],
         "backendRefs": backend("infra-backend-v2")},
        {"matches": [{"path": prefix("/path2"), "headers": headers(&[("version", "two")]), "method": "POST"}],
         "backendRefs": backend("infra-backend-v3")},
        {"matches": [{"path": prefix("/path3"), "method": "PATCH"},
                     {"path": prefix("/path4"), "headers": headers(&[("version", "three")]), "method": "DELETE"}],
         "backendRefs": backend("infra-backend-v1")},
        {"matches": [{"path": prefix("/path5")}], "backendRefs": backend("infra-backend-v1")},
        {"matches": [{"method": "PATCH"}], "backendRefs": backend("infra-backend-v2")},
        {"matches": [{"headers": headers(&[("version", "four")])}], "backendRefs": backend("infra-backend-v3")},
    ]});
    create(&bed.client, http_route(INFRA_NS, "method-matching", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "method-matching"), "same-namespace").await?;
    let m = |method, path, headers| Ask { method, host: ANY, path, headers };
    expect_cases(
        &bed,
        &[
            (m("POST", "/", &[]), V1),
            (m("GET", "/", &[]), V2),
            (m("HEAD", "/", &[]), None),
            (m("GET", "/path1", &[]), V1),
            (m("PUT", "/", &[("version", "one")]), V2),
            (m("POST", "/path2", &[("version", "two")]), V3),
            (m("PATCH", "/path3", &[]), V1),
            (m("DELETE", "/path4", &[("version", "three")]), V1),
            (m("PUT", "/", &[]), None),
            (m("DELETE", "/path4", &[]), None),
            (m("PATCH", "/path5", &[]), V1),
            (m("PATCH", "/", &[("version", "four")]), V2),
        ],
    )
    .await
}

/// HTTPRouteWeight: 500 requests share 70/30/0 within 5 points, as upstream checks (up to
/// ten tries, as upstream retries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_weight() -> Result<()> {
    let bed = Bed::start().await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [{"backendRefs": [
        {"name": "infra-backend-v1", "port": 8080, "weight": 70},
        {"name": "infra-backend-v2", "port": 8080, "weight": 30},
        {"name": "infra-backend-v3", "port": 8080, "weight": 0}]}]});
    create(&bed.client, http_route(INFRA_NS, "weighted-backends", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "weighted-backends"), "same-namespace").await?;
    let stack = &bed.world.stack;
    expect_everywhere(stack, ANY, "/", 200, "infra-backend-v").await?;
    let mut last = String::new();
    for _ in 0..10 {
        let mut counts = std::collections::BTreeMap::<String, u32>::new();
        for i in 0..500 {
            let host = &stack.hosts[i % stack.hosts.len()];
            let (status, body) = hafleet_tests::http_get(host.http_addr(), ANY, "/").await?;
            anyhow::ensure!(status == 200, "{status} {body}");
            let from = body.split_whitespace().next().unwrap_or_default().to_owned();
            *counts.entry(from).or_default() += 1;
        }
        let share = |b: &str| f64::from(counts.get(b).copied().unwrap_or(0)) / 500.0;
        let (v1, v2, v3) =
            (share("infra-backend-v1"), share("infra-backend-v2"), share("infra-backend-v3"));
        if (v1 - 0.7).abs() <= 0.05 && (v2 - 0.3).abs() <= 0.05 && v3 == 0.0 {
            return Ok(());
        }
        last = format!("{counts:?}");
    }
    anyhow::bail!("not within 5 points of 70/30/0 in ten tries; last: {last}")
}
