//! The upstream conformance cases about filters: redirects, URL rewrites and header
//! modifiers, and timeouts.

use super::{ANY, Bed, V1, backend, expect_cases, get_, http_route, prefix};
use crate::{CONVERGE, expect_everywhere};
use anyhow::Result;
use hafleet_tests::gateway_api::{INFRA_NS, create};
use serde_json::{Value, json};

/// What a redirect must say: its status and the parts of its Location given (a port not
/// given must not be there).
struct Moved<'a> {
    path: &'a str,
    status: u16,
    scheme: &'a str,
    host: &'a str,
    port: Option<&'a str>,
    to: &'a str,
}

/// A rule on `path` (PathPrefix) that redirects as `redirect` says.
fn redirect_rule(path: &str, redirect: Value) -> Value {
    json!({"matches": [{"path": prefix(path)}],
           "filters": [{"type": "RequestRedirect", "requestRedirect": redirect}]})
}

/// Creates HTTPRoute `name` with `rules` on same-namespace, waits until it is accepted and
/// checks each of `cases` on every host.
async fn redirects(name: &str, rules: Vec<Value>, cases: &[Moved<'_>]) -> Result<()> {
    let bed = Bed::start().await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": rules});
    create(&bed.client, http_route(INFRA_NS, name, spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, name), "same-namespace").await?;
    let stack = &bed.world.stack;
    for c in cases {
        let what =
            format!("{} -> {} {}://{}{:?}{}", c.path, c.status, c.scheme, c.host, c.port, c.to);
        hafleet_tests::assert::on_every_host(stack, CONVERGE, &what, |h| async move {
            let r = hafleet_tests::http_get_full(h.http_addr(), ANY, c.path).await?;
            let location = r.header("location").unwrap_or_default().to_owned();
            let port = c.port.map(|p| format!(":{p}")).unwrap_or_default();
            let want = format!("{}://{}{port}{}", c.scheme, c.host, c.to);
            anyhow::ensure!(
                r.status == c.status && location == want,
                "got {} {location:?}",
                r.status
            );
            Ok(())
        })
        .await?;
    }
    Ok(())
}

fn moved<'a>(path: &'a str, status: u16, host: &'a str, to: &'a str) -> Moved<'a> {
    Moved { path, status, scheme: "http", host, port: None, to }
}

/// HTTPRouteRedirectHostAndStatus: the host replaced, 302 unless a status is given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_redirect_host_and_status() -> Result<()> {
    let rules = vec![
        redirect_rule("/hostname-redirect", json!({"hostname": "example.org"})),
        redirect_rule("/host-and-status", json!({"statusCode": 301, "hostname": "example.org"})),
    ];
    let cases = [
        moved("/hostname-redirect", 302, "example.org", "/hostname-redirect"),
        moved("/host-and-status", 301, "example.org", "/host-and-status"),
    ];
    redirects("redirect-host-and-status", rules, &cases).await
}

/// HTTPRoute303Redirect, HTTPRoute307Redirect and HTTPRoute308Redirect (Extended), in one
/// route: each status as given, the rest of the request's location kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_303_307_308_redirect() -> Result<()> {
    let rules = vec![
        redirect_rule("/see-other", json!({"statusCode": 303})),
        redirect_rule("/temporary", json!({"statusCode": 307})),
        redirect_rule("/permanent", json!({"statusCode": 308})),
    ];
    let cases = [
        moved("/see-other", 303, ANY, "/see-other"),
        moved("/temporary", 307, ANY, "/temporary"),
        moved("/permanent", 308, ANY, "/permanent"),
    ];
    redirects("redirect-codes", rules, &cases).await
}

/// HTTPRouteRedirectPort (Extended): the port given, the request's host kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_redirect_port() -> Result<()> {
    let rules = vec![
        redirect_rule("/port", json!({"port": 8083})),
        redirect_rule("/port-and-host", json!({"hostname": "example.org", "port": 8083})),
        redirect_rule("/port-and-status", json!({"port": 8083, "statusCode": 301})),
        redirect_rule(
            "/port-and-host-and-status",
            json!({"port": 8083, "hostname": "example.org", "statusCode": 302}),
        ),
    ];
    let on = |path, status, host| Moved { port: Some("8083"), ..moved(path, status, host, path) };
    let cases = [
        on("/port", 302, ANY),
        on("/port-and-host", 302, "example.org"),
        on("/port-and-status", 301, ANY),
        on("/port-and-host-and-status", 302, "example.org"),
    ];
    redirects("redirect-port", rules, &cases).await
}

/// HTTPRouteRedirectScheme (Extended): https, its own port left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_redirect_scheme() -> Result<()> {
    let rules = vec![
        redirect_rule("/scheme", json!({"scheme": "https"})),
        redirect_rule("/scheme-and-host", json!({"hostname": "example.org", "scheme": "https"})),
        redirect_rule("/scheme-and-status", json!({"scheme": "https", "statusCode": 301})),
        redirect_rule(
            "/scheme-and-host-and-status",
            json!({"scheme": "https", "statusCode": 302, "hostname": "example.org"}),
        ),
    ];
    let https = |path, status, host| Moved { scheme: "https", ..moved(path, status, host, path) };
    let cases = [
        https("/scheme", 302, ANY),
        https("/scheme-and-host", 302, "example.org"),
        https("/scheme-and-status", 301, ANY),
        https("/scheme-and-host-and-status", 302, "example.org"),
    ];
    redirects("redirect-scheme", rules, &cases).await
}

/// HTTPRouteRedirectPath (Extended): the prefix or the whole path replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_redirect_path() -> Result<()> {
    let prefix_to = |to: &str| json!({"type": "ReplacePrefixMatch", "replacePrefixMatch": to});
    let full = |to: &str| json!({"type": "ReplaceFullPath", "replaceFullPath": to});
    let rules = vec![
        redirect_rule("/original-prefix", json!({"path": prefix_to("/replacement-prefix")})),
        redirect_rule("/full", json!({"path": full("/full-path-replacement")})),
        redirect_rule(
            "/path-and-host",
            json!({"hostname": "example.org", "path": prefix_to("/replacement-prefix")}),
        ),
        redirect_rule(
            "/path-and-status",
            json!({"path": prefix_to("/replacement-prefix"), "statusCode": 301}),
        ),
        redirect_rule(
            "/full-path-and-host",
            json!({"hostname": "example.org", "path": full("/replacement-full")}),
        ),
        redirect_rule(
            "/full-path-and-status",
            json!({"path": full("/replacement-full"), "statusCode": 301}),
        ),
    ];
    let cases = [
        moved("/original-prefix/lemon", 302, ANY, "/replacement-prefix/lemon"),
        moved("/full/path/original", 302, ANY, "/full-path-replacement"),
        moved("/path-and-host", 302, "example.org", "/replacement-prefix"),
        moved("/path-and-status", 301, ANY, "/replacement-prefix"),
        moved("/full-path-and-host", 302, "example.org", "/replacement-full"),
        moved("/full-path-and-status", 301, ANY, "/replacement-full"),
    ];
    redirects("redirect-path", rules, &cases).await
}

/// The header lines the echo backend says it got, by lower-case name (values of one name
/// joined with ",").
fn echoed(body: &str) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::<String, String>::new();
    for line in body.lines().skip(1) {
        if let Some((n, v)) = line.split_once(':') {
            let slot = out.entry(n.trim().to_ascii_lowercase()).or_default();
            if !slot.is_empty() {
                slot.push(',');
            }
            slot.push_str(v.trim());
        }
    }
    out
}

/// Sends `host` `path` with `sent` headers to every host until the backend says it got the
/// request as `got_path` (its first line) with `want` headers and none of `absent`.
async fn backend_sees(
    bed: &Bed,
    (host, path, sent): (&str, &str, &[(&str, &str)]),
    (backend, got_path): (&str, &str),
    want: &[(&str, &str)],
    absent: &[&str],
) -> Result<()> {
    let what = format!("{host}{path} {sent:?} -> {backend} {got_path} {want:?} without {absent:?}");
    hafleet_tests::assert::on_every_host(&bed.world.stack, CONVERGE, &what, |h| async move {
        let r = hafleet_tests::http_request(h.http_addr(), "GET", host, path, sent).await?;
        let first = r.body.lines().next().unwrap_or_default().to_owned();
        anyhow::ensure!(
            r.status == 200 && first == format!("{backend} {got_path}"),
            "got {} {:?}",
            r.status,
            r.body
        );
        let got = echoed(&r.body);
        for (n, v) in want {
            anyhow::ensure!(
                got.get(&n.to_ascii_lowercase()).map(String::as_str) == Some(*v),
                "{n}: {got:?}"
            );
        }
        for n in absent {
            anyhow::ensure!(!got.contains_key(&n.to_ascii_lowercase()), "{n} still there: {got:?}");
        }
        Ok(())
    })
    .await?;
    Ok(())
}

/// The header changes of the upstream rewrite cases.
fn modify_headers() -> Value {
    json!({"type": "RequestHeaderModifier", "requestHeaderModifier": {
        "set": [{"name": "X-Header-Set", "value": "set-overwrites-values"}],
        "add": [{"name": "X-Header-Add", "value": "header-val-1"},
                {"name": "X-Header-Add-Append", "value": "header-val-2"}],
        "remove": ["X-Header-Remove"]}})
}

const SENT: [(&str, &str); 3] = [
    ("X-Header-Remove", "remove-val"),
    ("X-Header-Add-Append", "append-val-1"),
    ("X-Header-Set", "set-val"),
];
const CHANGED: [(&str, &str); 3] = [
    ("X-Header-Add", "header-val-1"),
    ("X-Header-Add-Append", "append-val-1,header-val-2"),
    ("X-Header-Set", "set-overwrites-values"),
];

/// HTTPRouteRewritePath (Extended): the prefix replaced (or stripped), or the whole path;
/// with header changes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_rewrite_path() -> Result<()> {
    let bed = Bed::start().await?;
    let rewrite = |path: &str, modifier: Value, more: Option<Value>| {
        let mut filters = vec![json!({"type": "URLRewrite", "urlRewrite": {"path": modifier}})];
        filters.extend(more);
        json!({"matches": [{"path": prefix(path)}], "filters": filters,
               "backendRefs": backend("infra-backend-v1")})
    };
    let prefix_to = |to: &str| json!({"type": "ReplacePrefixMatch", "replacePrefixMatch": to});
    let full = |to: &str| json!({"type": "ReplaceFullPath", "replaceFullPath": to});
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [
        rewrite("/prefix/one", prefix_to("/one"), None),
        rewrite("/strip-prefix", prefix_to("/"), None),
        rewrite("/full/one", full("/one"), None),
        rewrite("/full/rewrite-path-and-modify-headers", full("/test"), Some(modify_headers())),
        rewrite("/prefix/rewrite-path-and-modify-headers", prefix_to("/prefix"), Some(modify_headers())),
    ]});
    create(&bed.client, http_route(INFRA_NS, "rewrite-path", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "rewrite-path"), "same-namespace").await?;
    let v1 = "infra-backend-v1";
    for (path, got) in [
        ("/prefix/one/two", "/one/two"),
        ("/strip-prefix/three", "/three"),
        ("/strip-prefix", "/"),
        ("/full/one/two", "/one"),
    ] {
        backend_sees(&bed, (ANY, path, &[]), (v1, got), &[], &[]).await?;
    }
    let full_path = "/full/rewrite-path-and-modify-headers/test";
    backend_sees(&bed, (ANY, full_path, &SENT), (v1, "/test"), &CHANGED, &["X-Header-Remove"])
        .await?;
    let prefixed = "/prefix/rewrite-path-and-modify-headers/one";
    backend_sees(&bed, (ANY, prefixed, &SENT), (v1, "/prefix/one"), &CHANGED, &["X-Header-Remove"])
        .await
}

/// HTTPRouteRewriteHost (Extended): the backend sees the Host rewritten; with header changes
/// too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_rewrite_host() -> Result<()> {
    let bed = Bed::start().await?;
    let rule = |path: &str, host: &str, to: &str, more: Option<Value>| {
        let mut filters = vec![json!({"type": "URLRewrite", "urlRewrite": {"hostname": host}})];
        filters.extend(more);
        json!({"matches": [{"path": prefix(path)}], "filters": filters, "backendRefs": backend(to)})
    };
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "hostnames": ["rewrite.example"], "rules": [
        rule("/one", "one.example.org", "infra-backend-v1", None),
        rule("/two", "example.org", "infra-backend-v2", None),
        rule("/rewrite-host-and-modify-headers", "test.example.org", "infra-backend-v2", Some(modify_headers())),
    ]});
    create(&bed.client, http_route(INFRA_NS, "rewrite-host", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "rewrite-host"), "same-namespace").await?;
    let at = "rewrite.example";
    backend_sees(
        &bed,
        (at, "/one", &[]),
        ("infra-backend-v1", "/one"),
        &[("Host", "one.example.org")],
        &[],
    )
    .await?;
    backend_sees(
        &bed,
        (at, "/two", &[]),
        ("infra-backend-v2", "/two"),
        &[("Host", "example.org")],
        &[],
    )
    .await?;
    let mut want = CHANGED.to_vec();
    want.push(("Host", "test.example.org"));
    let path = "/rewrite-host-and-modify-headers";
    backend_sees(&bed, (at, path, &SENT), ("infra-backend-v2", path), &want, &["X-Header-Remove"])
        .await
}

/// HTTPRouteRequestHeaderModifier (Core): set, add and remove on the way to the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_request_header_modifier() -> Result<()> {
    request_header_modifier(false).await
}

/// HTTPRouteBackendRequestHeaderModifier (Extended): the same cases, each filter under the
/// rule's backendRef instead of the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_backend_request_header_modifier() -> Result<()> {
    request_header_modifier(true).await
}

/// HTTPRouteRequestHeaderModifier's cases, with each filter on the rule or (`on_backend`) on
/// its one backendRef, as upstream's two manifests put them.
async fn request_header_modifier(on_backend: bool) -> Result<()> {
    let bed = Bed::start().await?;
    let rule = |path: &str, modifier: Value| {
        let filters = json!([{"type": "RequestHeaderModifier", "requestHeaderModifier": modifier}]);
        let mut rule = json!({"matches": [{"path": prefix(path)}],
                              "backendRefs": backend("infra-backend-v1")});
        if on_backend {
            rule["backendRefs"][0]["filters"] = filters;
        } else {
            rule["filters"] = filters;
        }
        rule
    };
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [
        rule("/set", json!({"set": [{"name": "X-Header-Set", "value": "set-overwrites-values"}]})),
        rule("/add", json!({"add": [{"name": "X-Header-Add", "value": "add-appends-values"}]})),
        rule("/remove", json!({"remove": ["X-Header-Remove"]})),
        rule("/multiple", json!({
            "set": [{"name": "X-Header-Set-1", "value": "header-set-1"}, {"name": "X-Header-Set-2", "value": "header-set-2"}],
            "add": [{"name": "X-Header-Add-1", "value": "header-add-1"}, {"name": "X-Header-Add-2", "value": "header-add-2"},
                    {"name": "X-Header-Add-3", "value": "header-add-3"}],
            "remove": ["X-Header-Remove-1", "X-Header-Remove-2"]})),
        rule("/case-insensitivity", json!({
            "set": [{"name": "X-Header-Set", "value": "header-set"}],
            "add": [{"name": "X-Header-Add", "value": "header-add"}],
            "remove": ["X-Header-Remove"]})),
    ]});
    create(&bed.client, http_route(INFRA_NS, "request-header-modifier", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "request-header-modifier"), "same-namespace").await?;
    let v1 = "infra-backend-v1";
    let sees = |path: &'static str,
                sent: &'static [(&'static str, &'static str)],
                want: &'static [(&'static str, &'static str)],
                absent: &'static [&'static str]| {
        backend_sees(&bed, (ANY, path, sent), (v1, path), want, absent)
    };
    sees(
        "/set",
        &[("Some-Other-Header", "val")],
        &[("Some-Other-Header", "val"), ("X-Header-Set", "set-overwrites-values")],
        &[],
    )
    .await?;
    sees(
        "/set",
        &[("Some-Other-Header", "val"), ("X-Header-Set", "some-other-value")],
        &[("X-Header-Set", "set-overwrites-values")],
        &[],
    )
    .await?;
    sees("/add", &[("Some-Other-Header", "val")], &[("X-Header-Add", "add-appends-values")], &[])
        .await?;
    sees(
        "/add",
        &[("Some-Other-Header", "val"), ("X-Header-Add", "some-other-value")],
        &[("X-Header-Add", "some-other-value,add-appends-values")],
        &[],
    )
    .await?;
    sees("/remove", &[("X-Header-Remove", "val")], &[], &["X-Header-Remove"]).await?;
    sees(
        "/multiple",
        &[
            ("X-Header-Set-2", "set-val"),
            ("X-Header-Add-2", "add-val"),
            ("X-Header-Remove-2", "remove-val"),
        ],
        &[
            ("X-Header-Set-1", "header-set-1"),
            ("X-Header-Set-2", "header-set-2"),
            ("X-Header-Add-1", "header-add-1"),
            ("X-Header-Add-2", "add-val,header-add-2"),
            ("X-Header-Add-3", "header-add-3"),
        ],
        &["X-Header-Remove-1", "X-Header-Remove-2"],
    )
    .await?;
    sees(
        "/case-insensitivity",
        &[
            ("x-header-set", "original-val-set"),
            ("x-header-add", "original-val-add"),
            ("x-header-remove", "original-val-remove"),
        ],
        &[("X-Header-Set", "header-set"), ("X-Header-Add", "original-val-add,header-add")],
        &["X-Header-Remove"],
    )
    .await?;
    // The request still reaches its backend where nothing matches another rule.
    expect_cases(&bed, &[(get_("/set"), V1)]).await?;
    Ok(())
}

/// A response-header case: the path, the headers the backend is asked to set, the headers the
/// client must see, and those it must not.
type Echoed =
    (&'static str, &'static str, &'static [(&'static str, &'static str)], &'static [&'static str]);

/// The values of header `name` in `r`, joined with "," (`None`: absent).
fn joined(r: &hafleet_tests::Response, name: &str) -> Option<String> {
    let values: Vec<&str> = r
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

/// HTTPRouteResponseHeaderModifier (Extended): set, add and remove on the way back to the
/// client, over what the backend answered with (the echo backend sets the headers asked for in
/// `X-Echo-Set-Header`, as upstream's does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_response_header_modifier() -> Result<()> {
    let bed = Bed::start().await?;
    let rule = |path: &str, modifier: Value| {
        json!({"matches": [{"path": prefix(path)}],
               "filters": [{"type": "ResponseHeaderModifier", "responseHeaderModifier": modifier}],
               "backendRefs": backend("infra-backend-v1")})
    };
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [
        rule("/set", json!({"set": [{"name": "X-Header-Set", "value": "set-overwrites-values"}]})),
        rule("/add", json!({"add": [{"name": "X-Header-Add", "value": "add-appends-values"}]})),
        rule("/remove", json!({"remove": ["X-Header-Remove"]})),
        rule("/multiple", json!({
            "set": [{"name": "X-Header-Set-1", "value": "header-set-1"},
                    {"name": "X-Header-Set-2", "value": "header-set-2"}],
            "add": [{"name": "X-Header-Add-1", "value": "header-add-1"},
                    {"name": "X-Header-Add-2", "value": "header-add-2"},
                    {"name": "X-Header-Add-3", "value": "header-add-3"}],
            "remove": ["X-Header-Remove-1", "X-Header-Remove-2"]})),
    ]});
    create(&bed.client, http_route(INFRA_NS, "response-header-modifier", spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, "response-header-modifier"), "same-namespace").await?;
    let cases: [Echoed; 5] = [
        (
            "/set",
            "Some-Other-Header:val",
            &[("Some-Other-Header", "val"), ("X-Header-Set", "set-overwrites-values")],
            &[],
        ),
        (
            "/set",
            "X-Header-Set:some-other-value",
            &[("X-Header-Set", "set-overwrites-values")],
            &[],
        ),
        (
            "/add",
            "X-Header-Add:some-other-value",
            &[("X-Header-Add", "some-other-value,add-appends-values")],
            &[],
        ),
        ("/remove", "X-Header-Remove:val", &[], &["X-Header-Remove"]),
        (
            "/multiple",
            "X-Header-Remove-1:val,X-Header-Remove-2:remove-val-2,X-Header-Add-2:add-val-2",
            &[
                ("X-Header-Set-1", "header-set-1"),
                ("X-Header-Set-2", "header-set-2"),
                ("X-Header-Add-1", "header-add-1"),
                ("X-Header-Add-2", "add-val-2,header-add-2"),
                ("X-Header-Add-3", "header-add-3"),
            ],
            &["X-Header-Remove-1", "X-Header-Remove-2"],
        ),
    ];
    for (path, set, want, absent) in cases {
        let what = format!("{path} with {set} -> {want:?} without {absent:?}");
        hafleet_tests::assert::on_every_host(&bed.world.stack, CONVERGE, &what, |h| async move {
            let sent = [("X-Echo-Set-Header", set)];
            let r = hafleet_tests::http_request(h.http_addr(), "GET", ANY, path, &sent).await?;
            anyhow::ensure!(
                r.status == 200 && r.body.starts_with("infra-backend-v1 "),
                "got {}",
                r.status
            );
            for (n, v) in want {
                anyhow::ensure!(joined(&r, n).as_deref() == Some(*v), "{n}: {:?}", r.headers);
            }
            for n in absent {
                anyhow::ensure!(joined(&r, n).is_none(), "{n} still there: {:?}", r.headers);
            }
            Ok(())
        })
        .await?;
    }
    Ok(())
}

/// HTTPRouteTimeoutRequest and HTTPRouteTimeoutBackendRequest: a rule's `timeouts.request`
/// (or `backendRequest`) of 500ms answers 504 when the backend takes a second, and `0s` lets
/// it take that long. (Served as the backend's `timeout server`: how long HAProxy waits for
/// the backend's answer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_timeout_request_and_backend_request() -> Result<()> {
    let bed = Bed::start().await?;
    let rule = |path: &str, timeouts: Value| {
        json!({"matches": [{"path": prefix(path)}], "backendRefs": backend("infra-backend-v1"),
               "timeouts": timeouts})
    };
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [
        rule("/request-timeout", json!({"request": "500ms"})),
        rule("/disable-request-timeout", json!({"request": "0s"}))]});
    create(&bed.client, http_route(INFRA_NS, "request-timeout", spec)).await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [
        rule("/backend-timeout", json!({"backendRequest": "500ms"})),
        rule("/disable-backend-timeout", json!({"backendRequest": "0s"}))]});
    create(&bed.client, http_route(INFRA_NS, "backend-request-timeout", spec)).await?;
    for name in ["request-timeout", "backend-request-timeout"] {
        bed.accepted_and_resolved((INFRA_NS, name), "same-namespace").await?;
    }
    let stack = &bed.world.stack;
    for (timed, off) in [
        ("/request-timeout", "/disable-request-timeout"),
        ("/backend-timeout", "/disable-backend-timeout"),
    ] {
        expect_everywhere(stack, ANY, timed, 200, "infra-backend-v1").await?;
        expect_everywhere(stack, ANY, &format!("{timed}?delay=1s"), 504, "").await?;
        expect_everywhere(stack, ANY, &format!("{off}?delay=1s"), 200, "infra-backend-v1").await?;
    }
    Ok(())
}

/// HTTPRouteRequestHeaderModifierBackendWeights (Extended): each of two weighted backendRefs
/// sets header `Backend` to its own name; in 100 requests, every one reaches the backend that
/// its header names, and both shares are taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_request_header_modifier_backend_weights() -> Result<()> {
    let bed = Bed::start().await?;
    let weighted = |name: &str| {
        json!({"name": name, "port": 8080, "weight": 10, "filters": [
            {"type": "RequestHeaderModifier",
             "requestHeaderModifier": {"set": [{"name": "Backend", "value": name}]}}]})
    };
    let spec = json!({"parentRefs": [{"name": "same-namespace"}], "rules": [{"backendRefs": [
        weighted("infra-backend-v1"), weighted("infra-backend-v2")]}]});
    let name = "request-header-modifier-backend-weights";
    create(&bed.client, http_route(INFRA_NS, name, spec)).await?;
    bed.accepted_and_resolved((INFRA_NS, name), "same-namespace").await?;
    let stack = &bed.world.stack;
    expect_everywhere(stack, ANY, "/", 200, "infra-backend-v").await?;
    let mut reached = std::collections::BTreeSet::new();
    for i in 0..100 {
        let host = &stack.hosts[i % stack.hosts.len()];
        let r = hafleet_tests::http_request(host.http_addr(), "GET", ANY, "/", &[]).await?;
        anyhow::ensure!(r.status == 200, "{} {}", r.status, r.body);
        let pod = r.body.split_whitespace().next().unwrap_or_default().to_owned();
        let said = echoed(&r.body);
        let header = said.get("backend").map(String::as_str);
        anyhow::ensure!(header == Some(pod.as_str()), "backend {pod} got Backend: {header:?}");
        reached.insert(pod);
    }
    anyhow::ensure!(reached.len() == 2, "one share was never taken: {reached:?}");
    Ok(())
}
