//! HTTPS listeners: a Gateway's certificates go through the same sealed path as an Ingress's
//! `spec.tls` (sealed by the watcher to the fleet, opened only on its hosts), routes of HTTPS
//! listeners are served over TLS only, and a certificate rotates without a reload.

use super::{Bed, http_route, infra_gateway as gateway};
use crate::CONVERGE;
use anyhow::{Context, Result};
use hafleet_tests::eventually;
use hafleet_tests::gateway_api::{INFRA_NS, conditions_of, create, get, has_condition};
use hafleet_tests::tls::{
    fingerprint, https_get_as, self_signed, served_fingerprint, tls_on, tls_secret,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const CERT: &str = "tls-validity-checks-certificate";
const NAMES: &[&str] = &["example.org", "second-example.org", "shop.org", "*.wildcard.org"];

/// An HTTPS listener of the upstream base, with the upstream certificate.
fn https_listener(name: &str, hostname: Option<&str>) -> Value {
    let tls = json!({"certificateRefs": [{"group": "", "kind": "Secret", "name": CERT,
        "namespace": INFRA_NS}]});
    super::listener(name, hostname, Some(tls))
}

/// GET / for `host` over HTTPS on every host of the fleet, the certificate checked against
/// `ca` for `host`, until each answers `status` with a body that starts with `body`.
async fn https_everywhere(
    bed: &Bed,
    ca: &std::path::Path,
    host: &str,
    (status, body): (u16, &str),
) -> Result<()> {
    for h in &bed.world.stack.hosts {
        let addr = h.https_addr();
        let what = format!("{}: https://{host}/ -> {status} {body:?}", h.name());
        eventually(CONVERGE, &what, || async move {
            let answer = https_get_as(addr, host, host, ca).await?;
            let (head, got) = answer.split_once("\r\n\r\n").context("an HTTP answer")?;
            anyhow::ensure!(head.starts_with(&format!("HTTP/1.1 {status}")), "{head}");
            anyhow::ensure!(got.starts_with(body), "{got}");
            Ok(())
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", bed.world.stack.logs()))?;
    }
    Ok(())
}

/// HTTPRouteHTTPSListener: routes attach to a Gateway's HTTPS listeners (one without a
/// hostname, one with), are served over TLS with the listener's certificate, and a host no
/// route has gets 404 (with the fleet's default certificate). Also hafleet's own: the routes
/// of HTTPS listeners are not served over plain HTTP; the usual pair on one host (an HTTP
/// listener's route that redirects to HTTPS, an HTTPS listener's route that serves) does
/// both; the listener's certificate rotates on every host without a reload; and a listener
/// naming a Secret that does not exist says so (GatewayInvalidTLSConfiguration's case).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_https_listener() -> Result<()> {
    let mut bed = Bed::start().await?;
    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), INFRA_NS);
    // The upstream certificate names `*`, `*.org` and `*.wildcard.org`, which OpenSSL's
    // clients do not take for a host of one label under `org`: the hosts by name instead.
    let (crt, key) = self_signed(NAMES)?;
    secrets.create(&PostParams::default(), &tls_secret(CERT, &crt, &key)?).await?;
    // The fleet's default certificate, for names no listener has (a Secret of its own, naming
    // no host a listener serves: HAProxy also answers the names of the bind line's own
    // certificate with it).
    let (default_crt, default_key) = self_signed(&["unknown-example.org"])?;
    secrets
        .create(&PostParams::default(), &tls_secret("edge-default", &default_crt, &default_key)?)
        .await?;
    let default = format!("edge={INFRA_NS}/edge-default");
    let env = [("HAFLEET_DEFAULT_CERT", default.as_str()), ("HAFLEET_TLS_NAMESPACES", INFRA_NS)];
    tls_on(&mut bed.world.stack, &env).await?;
    let ca = bed.world.stack.dir().join("gateway-ca.pem");
    std::fs::write(&ca, [crt.as_slice(), &default_crt].concat())?;

    create(
        &bed.client,
        gateway(
            "same-namespace-with-https-listener",
            json!([
                https_listener("https", None),
                https_listener("https-with-hostname", Some("second-example.org")),
                https_listener("https-with-wildcard-hostname", Some("*.wildcard.org")),
                https_listener(
                    "https-with-hostname-matching-wildcard",
                    Some("fourth-example.wildcard.org")
                ),
            ]),
        ),
    )
    .await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace-with-https-listener"}],
        "hostnames": ["example.org"],
        "rules": [{"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, "httproute-https-test", spec)).await?;
    let spec = json!({"parentRefs": [{"name": "same-namespace-with-https-listener",
            "sectionName": "https-with-hostname"}],
        "rules": [{"backendRefs": [{"name": "infra-backend-v2", "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, "httproute-https-test-no-hostname", spec)).await?;
    let gw = "same-namespace-with-https-listener";
    bed.accepted_and_resolved((INFRA_NS, "httproute-https-test"), gw).await?;
    bed.accepted_and_resolved((INFRA_NS, "httproute-https-test-no-hostname"), gw).await?;

    https_everywhere(&bed, &ca, "example.org", (200, "infra-backend-v1 /")).await?;
    https_everywhere(&bed, &ca, "unknown-example.org", (404, "")).await?;
    https_everywhere(&bed, &ca, "second-example.org", (200, "infra-backend-v2 /")).await?;
    // Only HTTPS listeners have these routes: plain HTTP finds none (and is not redirected).
    let stack = &bed.world.stack;
    crate::expect_everywhere(stack, "example.org", "/", 404, "").await?;
    crate::expect_everywhere(stack, "second-example.org", "/", 404, "").await?;

    // The usual pair: plain HTTP redirected to HTTPS by an HTTP listener's route, HTTPS served
    // by an HTTPS listener's route, one host and one path.
    let http = super::listener("http", Some("shop.org"), None);
    create(&bed.client, gateway("web", json!([http, https_listener("https", Some("shop.org"))])))
        .await?;
    let redirect = json!({"parentRefs": [{"name": "web", "sectionName": "http"}],
        "rules": [{"filters": [{"type": "RequestRedirect",
            "requestRedirect": {"scheme": "https", "statusCode": 301}}]}]});
    create(&bed.client, http_route(INFRA_NS, "shop-redirect", redirect)).await?;
    let serve = json!({"parentRefs": [{"name": "web", "sectionName": "https"}],
        "rules": [{"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]});
    create(&bed.client, http_route(INFRA_NS, "shop", serve)).await?;
    https_everywhere(&bed, &ca, "shop.org", (200, "infra-backend-v1 /")).await?;
    for h in &stack.hosts {
        let what = format!("{}: http://shop.org/cart redirected", h.name());
        let addr = h.http_addr();
        eventually(CONVERGE, &what, || async move {
            let r = hafleet_tests::http::http_get_full(addr, "shop.org", "/cart").await?;
            let location = r.headers.iter().find(|(k, _)| k == "location").map(|(_, v)| v.clone());
            anyhow::ensure!(r.status == 301, "{}", r.status);
            anyhow::ensure!(location.as_deref() == Some("https://shop.org/cart"), "{location:?}");
            Ok(())
        })
        .await?;
    }

    // A rotation: the Secret's data replaced is served on every host through the runtime API,
    // the masters' reload counters unchanged.
    let reloads = |bed: &Bed| -> Result<Vec<u32>> {
        bed.world.stack.hosts.iter().map(|h| h.reload_count()).collect()
    };
    let before = reloads(&bed)?;
    let (new_crt, new_key) = self_signed(NAMES)?;
    let rotated = tls_secret(CERT, &new_crt, &new_key)?;
    let patch = kube::api::Patch::Merge(json!({"data": rotated.data}));
    secrets.patch(CERT, &kube::api::PatchParams::default(), &patch).await?;
    let new_fp = fingerprint(&new_crt)?;
    for (h, sni) in stack.hosts.iter().flat_map(|h| {
        ["example.org", "second-example.org", "shop.org"].into_iter().map(move |s| (h, s))
    }) {
        let addr = h.https_addr();
        let what = format!("{} serves {sni} the rotated certificate", h.name());
        let want = new_fp.as_str();
        eventually(CONVERGE, &what, || async move {
            let got = served_fingerprint(addr, sni).await?;
            anyhow::ensure!(got.as_deref() == Some(want), "{got:?}");
            Ok(())
        })
        .await?;
    }
    assert_eq!(reloads(&bed)?, before, "a rotation never reloads");
    std::fs::write(&ca, [new_crt.as_slice(), &default_crt].concat())?;
    https_everywhere(&bed, &ca, "example.org", (200, "infra-backend-v1 /")).await?;

    // A listener whose Secret does not exist: ResolvedRefs False, InvalidCertificateRef.
    let missing = json!({"name": "https", "port": 443, "protocol": "HTTPS",
        "allowedRoutes": {"namespaces": {"from": "All"}},
        "tls": {"certificateRefs": [{"group": "", "kind": "Secret",
            "name": "nonexistent-certificate"}]}});
    create(&bed.client, gateway("gateway-certificate-nonexistent-secret", json!([missing])))
        .await?;
    let client = &bed.client;
    eventually(CONVERGE, "the listener says its Secret does not resolve", || async move {
        let gw = get(client, "Gateway", Some(INFRA_NS), "gateway-certificate-nonexistent-secret")
            .await?;
        let listener = &gw.data["status"]["listeners"][0];
        let said = conditions_of(listener);
        let reason = Some("InvalidCertificateRef");
        anyhow::ensure!(has_condition(&said, "ResolvedRefs", "False", reason), "{said:?}");
        anyhow::ensure!(listener["attachedRoutes"] == 0, "{listener}");
        Ok(())
    })
    .await
}
