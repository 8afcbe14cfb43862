//! Golden tests of the built-in template: each fixture (a fleet's Ingresses) renders to a
//! reviewed snapshot, and every snapshot passes `haproxy -c` with the real HAProxy.

use hafleet_proto::{Bundle, FleetName, IngressKey, NodeAddr, Route};
use hafleet_renderer::core::{
    model,
    render::{Fleetwide, Renderer},
    state::IngressEntry,
};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

mod common;
use common::{haproxies, openssl_cert};

#[derive(Deserialize)]
struct Fixture {
    namespace: String,
    name: String,
    /// An HTTPRoute's, when it says so.
    #[serde(default)]
    kind: hafleet_proto::SourceKind,
    created_unix: i64,
    routes: Vec<Route>,
}

/// A fixture file: the Ingresses and the nodes of a nodes message, or (as route messages of
/// schema 2 carried their servers themselves) only the Ingresses.
#[derive(Deserialize)]
#[serde(untagged)]
enum FixtureFile {
    WithNodes { nodes: Vec<NodeAddr>, ingresses: Vec<Fixture> },
    IngressesOnly(Vec<Fixture>),
}

/// Renders with node health checks off (`--node-health-port 0`): the settings these snapshots
/// were first taken with, before node health checks became the default (the snapshot below
/// with them is the default's).
fn render_fixture(name: &str) -> Bundle {
    render_fixture_with(name, render_settings_off())
}

/// The built-in template with node health checks off.
fn render_settings_off() -> Renderer {
    let options = model::Options { node_health: None, ..Default::default() };
    Renderer::builtin().with_options(options)
}

fn render_fixture_with(name: &str, renderer: Renderer) -> Bundle {
    render_fixture_from(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name),
        renderer,
    )
}

fn render_fixture_from(path: &Path, renderer: Renderer) -> Bundle {
    let (nodes, ingresses) = read_fixture(path);
    let fleet = FleetName::new("edge").unwrap();
    renderer.render(&model::build_with(&fleet, &ingresses, &nodes, renderer.options())).unwrap()
}

/// A fixture file's nodes and Ingresses.
fn read_fixture(path: &Path) -> (Vec<NodeAddr>, BTreeMap<IngressKey, IngressEntry>) {
    let (nodes, fixtures) =
        match serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap() {
            FixtureFile::WithNodes { nodes, ingresses } => (nodes, ingresses),
            FixtureFile::IngressesOnly(ingresses) => (vec![], ingresses),
        };
    let ingresses: BTreeMap<IngressKey, IngressEntry> = fixtures
        .into_iter()
        .map(|f| {
            (
                IngressKey { kind: f.kind, ..IngressKey::new(&f.namespace, &f.name).unwrap() },
                IngressEntry {
                    created_unix: f.created_unix,
                    resource_version: "1".into(),
                    routes: f.routes.into(),
                    seq: 0,
                    tls: Vec::new(),
                    quarantined: None,
                },
            )
        })
        .collect();
    (nodes, ingresses)
}

/// The bundle as one text for a snapshot: the config, then each map file.
fn snapshot_text(bundle: &Bundle) -> String {
    let mut out = bundle.config.clone();
    for m in &bundle.maps {
        out.push_str(&format!("\n----- {} -----\n{}", m.name.relative_path(), m.content));
    }
    out
}

/// Runs the real `haproxy -c` (`haproxy`) on the bundle laid out as on a host: HAProxy's words
/// if it refuses it.
fn refusal(haproxy: &Path, bundle: &Bundle) -> Option<String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("haproxy.cfg");
    std::fs::write(&file, &bundle.config).unwrap();
    std::fs::create_dir(dir.path().join(hafleet_proto::MAPS_DIR)).unwrap();
    for m in &bundle.maps {
        std::fs::write(dir.path().join(m.name.relative_path()), &m.content).unwrap();
    }
    let out =
        Command::new(haproxy).arg("-c").arg("-f").arg(&file).output().unwrap_or_else(|e| {
            panic!("run {} (tests/setup.sh installs it): {e}", haproxy.display())
        });
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (!out.status.success()).then_some(said)
}

/// Panics with HAProxy's words if any of [`haproxies`] refuses the bundle.
fn assert_haproxy_accepts(bundle: &Bundle) {
    for haproxy in haproxies() {
        if let Some(said) = refusal(&haproxy, bundle) {
            panic!(
                "{} -c refused the config:\n{}\n{said}",
                haproxy.display(),
                snapshot_text(bundle)
            );
        }
    }
}

#[test]
fn shop_fleet() {
    let bundle = render_fixture("shop.json");
    insta::assert_snapshot!(snapshot_text(&bundle));
    assert_haproxy_accepts(&bundle);
}

/// Route messages of schema 2 listed each backend's servers; replaying them must render what
/// was rendered then, byte for byte (this snapshot is the one of the build that read them).
#[test]
fn shop_fleet_from_schema_2_messages() {
    let bundle = render_fixture("shop_schema_2.json");
    insta::assert_snapshot!(snapshot_text(&bundle));
    assert_haproxy_accepts(&bundle);
}

#[test]
fn shop_fleet_with_node_health_checks() {
    // The default settings: each node checked once on kube-proxy's port.
    let options = model::Options::default();
    assert_eq!(
        options.node_health,
        Some(model::NodeHealth {
            port: 10256,
            path: hafleet_proto::HttpPath::new("/healthz").unwrap(),
        })
    );
    let bundle = render_fixture_with("shop.json", Renderer::builtin().with_options(options));
    let text = snapshot_text(&bundle);
    // Cluster servers track their node; each node is checked once.
    assert!(text.contains("backend hafleet_nodes\n"), "{text}");
    assert!(text.contains(" no-check track hafleet_nodes/"), "{text}");
    insta::assert_snapshot!(text);
    assert_haproxy_accepts(&bundle);
}

/// Pods mode: each endpoint is a server named by its address and port that checks itself (no
/// node tracking, even with node health checks on); a draining one has weight 0; a Service
/// without endpoints has no servers (503). HAProxy accepts it.
#[test]
fn a_fleet_with_services_in_pods_mode() {
    let bundle = render_fixture_with("pods.json", Renderer::builtin());
    let text = snapshot_text(&bundle);
    for line in [
        "    server 10.2.0.5:8080 10.2.0.5:8080 maxconn 100 send-proxy-v2\n",
        "    server 10.2.0.6:8080 10.2.0.6:8080 weight 0 maxconn 100 send-proxy-v2\n",
        "    server fd00::7:8080 [fd00::7]:8080 maxconn 100 send-proxy-v2\n",
        "    option httpchk GET /healthz\n",
    ] {
        assert!(text.contains(line), "{line:?} not in\n{text}");
    }
    let pods = text.split("\nbackend be_shop_web_80").nth(1).expect("the pods backend");
    let pods = &pods[..pods.find("\nbackend ").unwrap_or(pods.len())];
    assert!(!pods.contains("track"), "pods check themselves\n{pods}");
    assert!(text.contains(" no-check track hafleet_nodes/"), "nodes mode still tracks\n{text}");
    insta::assert_snapshot!(text);
    assert_haproxy_accepts(&bundle);
}

/// One Service routed by two Ingresses: one with the defaults, one with every `hafleet.io/`
/// setting. Each is its own HAProxy backend, and HAProxy accepts every setting's line.
#[test]
fn a_service_routed_with_and_without_settings() {
    let bundle = render_fixture("options.json");
    let text = snapshot_text(&bundle);
    assert!(text.contains("backend be_shop_web_80\n"), "{text}");
    let tuned = text.split("\nbackend be_shop_web_80_").nth(1).expect("a backend with settings");
    for line in [
        "acl hafleet_allowed src 10.0.0.0/8 2001:db8::/32\n",
        "http-request deny deny_status 403 unless hafleet_allowed",
        "http-request redirect scheme https code 308 unless { ssl_fc }",
        "balance leastconn",
        "timeout connect 500ms",
        "timeout server 2m",
        "option httpchk GET /healthz",
        "cookie SRV insert indirect nocache",
        "server node-a 10.1.0.1:30080 inter 5s maxconn 100 cookie node-a",
    ] {
        assert!(tuned.contains(line), "{line:?} missing\n{text}");
    }
    // The route's client timeout: set in the frontend by the backend chosen (HAProxy 3.0 and
    // later), from a map that names only the tuned backend.
    let name = format!("be_shop_web_80_{}", tuned.lines().next().unwrap_or_default());
    let map = bundle.maps.iter().find(|m| m.name.as_str().starts_with("clienttimeouts"));
    assert_eq!(map.map(|m| m.content.as_str()), Some(format!("{name} 90000\n").as_str()));
    let frontend = text.split("\nfrontend hafleet_http\n").nth(1).unwrap_or_default();
    assert!(frontend.contains(".if version_atleast(3.0)\n    http-request set-timeout client var(txn.backend),map_str_int(hafleet-maps/clienttimeouts"), "{text}");
    assert!(!text.contains("timeout client 1m30s"), "not in a section: {text}");
    insta::assert_snapshot!(text);
    assert_haproxy_accepts(&bundle);
}

/// Header rules, a deny list, a rate limit, redirects and rewrites, each in the backend of the
/// route that asks for it, and HAProxy accepts every line.
#[test]
fn routes_with_filters() {
    let bundle = render_fixture("filters.json");
    let text = snapshot_text(&bundle);
    for line in [
        "acl hafleet_denied src 192.0.2.0/24\n",
        "http-request deny deny_status 429 if { sc_http_req_rate(0) gt 20 }",
        "http-request del-header X-Debug\n",
        "http-request set-header X-Env \"prod\"\n",
        "http-request add-header Via \"hafleet\"\n",
        "http-request replace-path '^/api(/.*)$' '/v2\\1' if { var(txn.hafleet_rewrite) -m beg /api/ }",
        "http-response set-header Cache-Control \"max-age=60, public\"\n",
        "http-response del-header Server\n",
        "timeout tunnel 2h\n",
        "http-request redirect prefix https://new.example.com code 301\n",
        "http-request redirect location https://new.example.com:8443/plans%%2F2026 code 308\n",
        "http-request set-path '/'\n",
        "server node-a 10.1.0.1:30081 send-proxy-v2\n",
        "http-request return status 500\n",
        "http-request set-var(txn.draw) rand(1000000) if { var(txn.backend) -m beg hafleet_s_ }\n",
        "http-request set-var(txn.hafleet_h0) req.fhdr(x-canary),hex if { var(txn.backend) -m beg hafleet_g_ }\n",
        "http-request set-var(txn.hafleet_q0) url_param(debug),hex if { var(txn.backend) -m beg hafleet_g_ }\n",
        "{ var(txn.draw) -m int lt 900000 }\n",
        ".474554.79657320706C65617365.6F6E 000000~be_shop_api_80\n",
        "gone.example.com/ be_shop_missing_80_",
    ] {
        assert!(text.contains(line), "{line:?} missing\n{text}");
    }
    insta::assert_snapshot!(text);
    assert_haproxy_accepts(&bundle);
}

/// The longest `allow-source` the watcher takes (256 networks) is rendered on lines HAProxy
/// reads (at most 64 words each), so `haproxy -c` accepts it.
#[test]
fn an_allow_source_as_long_as_allowed_passes_haproxy() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/options.json");
    let mut fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let nets: Vec<String> = (0..256).map(|i| format!("10.{i}.0.0/16")).collect();
    let options = &mut fixture["ingresses"][1]["routes"][0]["backend"]["options"];
    assert!(options["allow_source"].is_array(), "{fixture}");
    options["allow_source"] = serde_json::json!(nets);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("wide.json"), fixture.to_string()).unwrap();
    let bundle = render_fixture_from(&dir.path().join("wide.json"), render_settings_off());
    let lines: Vec<&str> =
        bundle.config.lines().filter(|l| l.contains("acl hafleet_allowed src ")).collect();
    assert_eq!(lines.len(), 8, "{}", bundle.config);
    assert!(lines.iter().all(|l| l.split_whitespace().count() == 3 + 32), "{lines:?}");
    assert_haproxy_accepts(&bundle);
}

#[test]
fn empty_fleet() {
    let bundle = render_fixture("empty.json");
    insta::assert_snapshot!(snapshot_text(&bundle));
    assert_haproxy_accepts(&bundle);
}

#[test]
fn haproxy_check_catches_a_broken_config() {
    // The check above must be able to fail, with every HAProxy, or it proves nothing.
    let broken = Bundle::new("frontend x\n  bindd :1\n".into(), vec![], vec![]);
    // Nor may a config pass whose map file is missing.
    let mut missing = render_fixture("shop.json");
    missing.maps.pop();
    for haproxy in haproxies() {
        assert!(refusal(&haproxy, &broken).is_some(), "{}", haproxy.display());
        assert!(refusal(&haproxy, &missing).is_some(), "{}", haproxy.display());
    }
}

/// The whole TLS path short of the hosts: certificates checked and sealed as the watcher does,
/// rendered into a crt-list and an HTTPS bind, opened as the applier does, and the result
/// accepted by the real `haproxy -c`. Hosts are listed for the certificate that covers them,
/// and plain HTTP for them redirects unless their Ingress says not to.
#[test]
fn a_fleet_with_certificates_passes_haproxy_check() {
    use hafleet_proto::{HttpHost, ObjectName, TlsEntry};
    let dir = tempfile::tempdir().unwrap();
    let identity = hafleet_applier::core::identity::FleetIdentity::generate();
    let to: hafleet_watcher::core::tls_secrets::SealTo = identity.recipient().parse().unwrap();
    let sealed = |names: &[&str]| {
        let (crt, key) = openssl_cert(dir.path(), names);
        // Read after the certificate is made: its notBefore is the second it was made in.
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        hafleet_watcher::core::tls_secrets::check(Some(&crt), Some(&key), now.as_secs() as i64)
            .unwrap()
            .seal(&to)
    };
    let (shop, wild) = (sealed(&["shop.example.com"]), sealed(&["*.example.org"]));
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/shop.json");
    let (nodes, fixtures) =
        match serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap() {
            FixtureFile::WithNodes { nodes, ingresses } => (nodes, ingresses),
            FixtureFile::IngressesOnly(ingresses) => (vec![], ingresses),
        };
    let mut ingresses: BTreeMap<IngressKey, IngressEntry> = fixtures
        .into_iter()
        .map(|f| {
            let key = IngressKey::new(&f.namespace, &f.name).unwrap();
            let entry = IngressEntry {
                created_unix: f.created_unix,
                resource_version: "1".into(),
                routes: f.routes.into(),
                seq: 0,
                tls: Vec::new(),
                quarantined: None,
            };
            (key, entry)
        })
        .collect();
    let entry = |hosts: &[&str], cert: &hafleet_proto::SealedCert| TlsEntry {
        hosts: hosts.iter().map(|h| HttpHost::new(*h).unwrap()).collect(),
        secret: ObjectName::new("tls").unwrap(),
        cert: Some(cert.clone()),
    };
    let first = ingresses.values_mut().next().unwrap();
    first.tls = vec![entry(&["shop.example.com"], &shop), entry(&["a.example.org"], &wild)];
    let fleet = FleetName::new("edge").unwrap();
    let renderer = Renderer::builtin();
    let bundle = renderer
        .render(&renderer.model(
            &fleet,
            &ingresses,
            &[(None, nodes.clone())].into(),
            Default::default(),
        ))
        .unwrap();
    bundle.verify(&bundle.sha256()).unwrap();
    assert_eq!(bundle.certs.len(), 2);
    let crt_list = bundle.maps.iter().find(|m| m.name.kind() == "crtlist").unwrap();
    assert!(
        bundle
            .config
            .contains(&format!("ssl crt-list {} strict-sni", crt_list.name.relative_path()))
    );
    for (cert, host) in [(&shop, "shop.example.com"), (&wild, "a.example.org")] {
        assert!(
            crt_list.content.contains(&format!("{} {host}\n", cert.relative_path())),
            "{}",
            crt_list.content
        );
    }
    let redirect = bundle.maps.iter().find(|m| m.name.kind() == "redirect").unwrap();
    assert_eq!(redirect.content, "a.example.org 1\nshop.example.com 1\n");
    assert!(!bundle.config.contains("PRIVATE KEY") && !crt_list.content.contains("PRIVATE KEY"));

    assert_tls_bundle_loads(&bundle, &identity);

    // A fleet with a default certificate and no TLS host: an empty crt-list, the default on
    // the bind, and HAProxy takes it.
    let default = sealed(&["edge-default.invalid"]);
    let plain: BTreeMap<IngressKey, IngressEntry> = ingresses
        .into_iter()
        .map(|(k, mut e)| {
            e.tls.clear();
            (k, e)
        })
        .collect();
    let bundle = renderer
        .render(&renderer.model(
            &fleet,
            &plain,
            &[(None, nodes.clone())].into(),
            Fleetwide { default_cert: Some(&default), settings: None },
        ))
        .unwrap();
    assert!(bundle.config.contains(&format!("ssl crt {} crt-list", default.relative_path())));
    assert!(!bundle.config.contains("strict-sni"));
    assert_eq!(bundle.certs, vec![default.clone()]);
    assert_tls_bundle_loads(&bundle, &identity);

    // Every fleet setting on, HTTPS included: HAProxy takes it.
    let settings = every_setting();
    let fleetwide = Fleetwide { default_cert: Some(&default), settings: Some(&settings) };
    let bundle = renderer
        .render(&renderer.model(&fleet, &plain, &[(None, nodes)].into(), fleetwide))
        .unwrap();
    for line in [
        "alpn h2,http/1.1 accept-proxy",
        "http-response set-header strict-transport-security \"max-age=31536000; includeSubDomains; preload\" if { ssl_fc }",
    ] {
        assert!(bundle.config.contains(line), "{line}:\n{}", bundle.config);
    }
    assert_tls_bundle_loads(&bundle, &identity);
}

/// Every fleet setting away from its default.
fn every_setting() -> hafleet_proto::FleetSettings {
    hafleet_proto::FleetSettings {
        forwarded_for: hafleet_proto::ForwardedFor::Replace,
        timeouts: hafleet_proto::Timeouts {
            client_ms: Some(60_000),
            server_ms: Some(90_000),
            connect_ms: Some(500),
            tunnel_ms: Some(7_200_000),
            http_request_ms: Some(5_000),
            http_keep_alive_ms: Some(2_000),
        },
        max_connections: Some(20_000),
        hsts: Some(hafleet_proto::Hsts {
            max_age_secs: 31_536_000,
            include_subdomains: true,
            preload: true,
        }),
        access_log: Some(hafleet_proto::LogTarget::Udp("127.0.0.1:514".parse().unwrap())),
        accept_proxy: hafleet_proto::AcceptProxy { http: true, https: true },
        prometheus_port: Some(8405),
        error_pages: vec![
            (404, "<h1>Not here</h1>\n".into()),
            (503, "<p class=\"later\">Back at 5 $PM #soon 100% \\o/ café</p>\n".into()),
        ],
    }
}

/// The fleet settings' lines in the config, each log target HAProxy takes, and each
/// `forwarded-for` mode.
#[test]
fn shop_fleet_with_every_setting() {
    let renderer = render_settings_off();
    let fleet = FleetName::new("edge").unwrap();
    let (nodes, ingresses) =
        read_fixture(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/shop.json"));
    let nodes = [(None, nodes)].into();
    let with = |settings: &hafleet_proto::FleetSettings| {
        let fleetwide = Fleetwide { default_cert: None, settings: Some(settings) };
        renderer.render(&renderer.model(&fleet, &ingresses, &nodes, fleetwide)).unwrap()
    };
    let bundle = with(&every_setting());
    insta::assert_snapshot!(snapshot_text(&bundle));
    assert_haproxy_accepts(&bundle);
    let mut settings = every_setting();
    for target in ["stdout", "stderr", "tcp://127.0.0.1:6514", "udp://[::1]:514"] {
        settings.access_log = Some(match target.split_once("://") {
            Some(("tcp", a)) => hafleet_proto::LogTarget::Tcp(a.parse().unwrap()),
            Some((_, a)) => hafleet_proto::LogTarget::Udp(a.parse().unwrap()),
            None if target == "stdout" => hafleet_proto::LogTarget::Stdout,
            None => hafleet_proto::LogTarget::Stderr,
        });
        assert_haproxy_accepts(&with(&settings));
    }
    for (mode, has, lacks) in [
        (hafleet_proto::ForwardedFor::Append, "option forwardfor", "del-header x-forwarded-for"),
        (hafleet_proto::ForwardedFor::Off, "timeout tunnel 2h", "forward"),
    ] {
        settings.forwarded_for = mode;
        let bundle = with(&settings);
        assert!(bundle.config.contains(has) && !bundle.config.contains(lacks), "{mode:?}");
        assert_haproxy_accepts(&bundle);
    }
}

/// Lays `bundle` out as the applier does (each certificate's file holds its chain and its key,
/// opened with `identity`) and runs the real `haproxy -c` on it.
fn assert_tls_bundle_loads(
    bundle: &Bundle,
    identity: &hafleet_applier::core::identity::FleetIdentity,
) {
    let host = common::lay_out(bundle, identity);
    for haproxy in haproxies() {
        let out = Command::new(&haproxy)
            .arg("-c")
            .arg("-f")
            .arg(host.path().join("haproxy.cfg"))
            .env("HAFLEET_HTTP_BIND", "127.0.0.1:18080")
            .env("HAFLEET_HTTPS_BIND", "127.0.0.1:18443")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{} -c refused it:\n{}\n{}{}",
            haproxy.display(),
            bundle.config,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A certificate that serves more hosts than a crt-list line holds (HAProxy reads 2,048 words
/// and 65,535 characters a line, and refuses the config beyond) is listed on several lines; a
/// wildcard that would have to exclude more than a line holds is not served (with a note),
/// rather than freezing the fleet. HAProxy accepts both.
#[test]
fn a_certificate_for_more_hosts_than_a_line_holds_is_split_and_haproxy_accepts_it() {
    use hafleet_proto::{HttpHost, ObjectName, TlsEntry};
    let dir = tempfile::tempdir().unwrap();
    let identity = hafleet_applier::core::identity::FleetIdentity::generate();
    let to: hafleet_watcher::core::tls_secrets::SealTo = identity.recipient().parse().unwrap();
    let (crt, key) = openssl_cert(dir.path(), &["*.example.org"]);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let wild =
        hafleet_watcher::core::tls_secrets::check(Some(&crt), Some(&key), now.as_secs() as i64)
            .unwrap()
            .seal(&to);
    let route = |host: &str| -> hafleet_proto::Route {
        serde_json::from_value(serde_json::json!({
            "host": host, "path": "/", "kind": "Prefix",
            "backend": {"service": {"namespace": "shop", "name": "web", "port": 80},
                        "node_port": 30080}
        }))
        .unwrap()
    };
    let entry = |created: i64, hosts: &[String], tls: Vec<TlsEntry>| IngressEntry {
        created_unix: created,
        resource_version: "1".into(),
        routes: hosts.iter().map(|h| route(h)).collect::<Vec<_>>().into(),
        seq: 0,
        tls,
        quarantined: None,
    };
    let fleet = FleetName::new("edge").unwrap();
    let nodes = vec![hafleet_proto::NodeAddr {
        name: hafleet_proto::ObjectName::new("node-a").unwrap(),
        addr: "10.1.0.1".parse().unwrap(),
    }];
    for (others, wildcard_served) in [(500, true), (1_200, false)] {
        // One Ingress serves *.example.org and 1,500 names under it with the certificate;
        // another routes `others` names under it without one (the wildcard must exclude them).
        let mut served: Vec<String> = (0..1_500).map(|i| format!("h{i}.example.org")).collect();
        served.push("*.example.org".into());
        let tls = vec![TlsEntry {
            hosts: served.iter().map(|h| HttpHost::new(h.as_str()).unwrap()).collect(),
            secret: ObjectName::new("wild").unwrap(),
            cert: Some(wild.clone()),
        }];
        let plain: Vec<String> = (0..others).map(|i| format!("o{i}.example.org")).collect();
        let ingresses: BTreeMap<IngressKey, IngressEntry> = [
            (IngressKey::new("shop", "served").unwrap(), entry(1, &served, tls)),
            (IngressKey::new("shop", "plain").unwrap(), entry(2, &plain, vec![])),
        ]
        .into();
        let renderer = Renderer::builtin();
        let model =
            renderer.model(&fleet, &ingresses, &[(None, nodes.clone())].into(), Default::default());
        let bundle = renderer.render(&model).unwrap();
        let crt_list = bundle.maps.iter().find(|m| m.name.kind() == "crtlist").unwrap();
        let lines: Vec<&str> = crt_list.content.lines().collect();
        for l in &lines {
            assert!(l.split_whitespace().count() <= 1_000 && l.len() <= 60_000, "{l}");
        }
        let wildcard_lines = lines.iter().filter(|l| l.contains(" *.example.org")).count();
        let excluded = crt_list.content.matches(" !o").count();
        let noted = model.notes.iter().any(|n| n.contains("*.example.org not served over HTTPS"));
        match wildcard_served {
            true => assert_eq!((wildcard_lines, excluded, noted), (1, others, false)),
            false => {
                assert_eq!((wildcard_lines, excluded, noted), (0, 0, true), "{:?}", model.notes)
            }
        }
        let listed = crt_list.content.matches(" h").count();
        assert_eq!(listed, 1_500, "every exact name listed once");
        assert_tls_bundle_loads(&bundle, &identity);
    }
}
