//! Passthrough routes (a TLSRoute's) beside HTTPS termination, and a TCPRoute's port, on the
//! real HAProxy: the
//! rendered bundle is laid out as a host holds it, HAProxy serves it, `openssl s_server` is a
//! passthrough backend and `openssl s_client` the client.

use hafleet_proto::{
    Backend, FleetName, HttpHost, HttpPath, IngressKey, Namespace, NodeAddr, ObjectName, PathKind,
    Route, RouteMore, ServiceRef, SourceKind, TlsEntry, TrafficPolicy,
};
use hafleet_renderer::core::{
    model,
    render::{Fleetwide, Renderer},
    state::IngressEntry,
};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{Killed, free_port, haproxies, lay_out, openssl_cert, wait_listening};

/// An HTTP backend on loopback that answers every request with the `X-Forwarded-For` it got.
fn forwarded_for_echo() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten().take(64) {
            let mut conn = conn;
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
            let xff = head.lines().find_map(|l| l.strip_prefix("x-forwarded-for: ")).unwrap_or("-");
            let body = format!("terminated, for {xff}\n");
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(answer.as_bytes());
        }
    });
    port
}

/// `openssl s_server` on a loopback port with a certificate of its own for `name` (made in
/// `dir`), answering a GET itself: the server and its port, once it listens.
fn s_server(dir: &std::path::Path, name: &str) -> (Killed, u16) {
    openssl_cert(dir, &[name]);
    let port = free_port();
    let server = Killed(
        Command::new("openssl")
            .args(["s_server", "-accept", &port.to_string(), "-www", "-quiet"])
            .arg("-cert")
            .arg(dir.join(format!("{name}.crt")))
            .arg("-key")
            .arg(dir.join(format!("{name}.key")))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl runs"),
    );
    wait_listening(port);
    (server, port)
}

/// What `openssl s_client` says of a TLS connection to `port` asking for `name`, with `send`
/// written once it is up: its stdout (the peer's certificate subject, what came back).
fn s_client(port: u16, name: &str, send: &str) -> String {
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}"), "-servername", name])
        .args(["-ign_eof", "-verify_quiet"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl runs");
    child.stdin.take().unwrap().write_all(send.as_bytes()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A route of `host` to Service `name` at NodePort `port`, passed through when `passthrough`.
fn route(host: &str, name: &str, port: u16, passthrough: bool) -> Route {
    let mut backend = Backend {
        service: ServiceRef {
            namespace: Namespace::new("shop").unwrap(),
            name: ObjectName::new(name).unwrap(),
            port: 443,
            cluster: None,
        },
        node_port: Some(port),
        servers: vec![],
        traffic_policy: TrafficPolicy::Cluster,
        endpoint_nodes: None,
        options: Default::default(),
        pods: None,
    };
    backend.options.tcp = passthrough;
    Route {
        host: Some(HttpHost::new(host).unwrap()),
        path: HttpPath::root(),
        kind: PathKind::Prefix,
        backend,
        more: passthrough.then(|| Box::new(RouteMore { passthrough: true, ..Default::default() })),
    }
}

/// A TCPRoute's route: every connection to `port` goes to Service `name` at NodePort
/// `node_port`.
fn tcp_route(port: u16, name: &str, node_port: u16) -> Route {
    let mut r = route("unused.invalid", name, node_port, false);
    r.host = None;
    r.backend.options.tcp = true;
    r.more = Some(Box::new(RouteMore { port: Some(port), ..Default::default() }));
    r
}

fn entry(created: i64, routes: Vec<Route>, tls: Vec<TlsEntry>) -> IngressEntry {
    IngressEntry {
        created_unix: created,
        resource_version: "1".into(),
        routes: routes.into(),
        seq: 1,
        tls,
        quarantined: None,
    }
}

/// One HTTPS bind, two ways: a TLS connection whose SNI a passthrough route names (exactly,
/// or under its wildcard, any number of labels deep) reaches that route's backend unopened, so the
/// backend's own certificate answers; one for a host of the fleet's certificates is
/// terminated by HAProxy (the fleet's certificate answers) and routed as HTTP, the backend
/// learning the client's address; a name neither serves is refused; a passthrough route that
/// shares its connections by weight reaches each of its backends. On every HAProxy the
/// tests know (2.6, and 3.0 when built).
#[test]
fn passthrough_and_termination_share_the_https_bind() {
    let dir = tempfile::tempdir().unwrap();
    let identity = hafleet_applier::core::identity::FleetIdentity::generate();
    let to: hafleet_watcher::core::tls_secrets::SealTo = identity.recipient().parse().unwrap();
    let (crt, key) = openssl_cert(dir.path(), &["term.example.com"]);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let sealed =
        hafleet_watcher::core::tls_secrets::check(Some(&crt), Some(&key), now.as_secs() as i64)
            .unwrap()
            .seal(&to);
    // The passthrough backend: openssl's own server, with a certificate of its own; and a
    // second one, which a route shares its connections with.
    let (_backend, pass_port) = s_server(dir.path(), "pass.example.com");
    let (_backend2, pass2_port) = s_server(dir.path(), "pass2.example.com");
    let http_port = forwarded_for_echo();
    let mut shared = route("split.example.com", "pass", pass_port, true);
    if let Some(more) = shared.more.as_mut() {
        more.weight = Some(1);
        more.split = vec![(1, route("split.example.com", "pass2", pass2_port, true).backend)];
    }

    let tcp_port = free_port();
    let web = IngressKey::new("shop", "web").unwrap();
    let db = IngressKey { kind: SourceKind::TcpRoute, ..IngressKey::new("shop", "db").unwrap() };
    let tls =
        IngressKey { kind: SourceKind::HttpRoute, ..IngressKey::new("shop", "pass").unwrap() };
    let term = TlsEntry {
        hosts: vec![HttpHost::new("term.example.com").unwrap()],
        secret: ObjectName::new("tls").unwrap(),
        cert: Some(sealed),
    };
    let ingresses: BTreeMap<IngressKey, IngressEntry> = [
        (web, entry(1, vec![route("term.example.com", "web", http_port, false)], vec![term])),
        (db, entry(3, vec![tcp_route(tcp_port, "db", http_port)], vec![])),
        (
            tls,
            entry(
                2,
                vec![
                    route("pass.example.com", "pass", pass_port, true),
                    route("*.wild.example.com", "pass", pass_port, true),
                    shared,
                ],
                vec![],
            ),
        ),
    ]
    .into();
    let nodes = vec![NodeAddr {
        name: ObjectName::new("node-1").unwrap(),
        addr: "127.0.0.1".parse().unwrap(),
    }];
    let options = model::Options { node_health: None, ..Default::default() };
    let renderer = Renderer::builtin().with_options(options);
    let fleet = FleetName::new("edge").unwrap();
    let model = renderer.model(&fleet, &ingresses, &[(None, nodes)].into(), Fleetwide::default());
    let bundle = renderer.render(&model).unwrap();
    let sni = bundle.maps.iter().find(|m| m.name.kind() == "sni").expect("an SNI map");
    assert_eq!(sni.content.lines().count(), 3, "{}", sni.content);
    assert!(sni.content.contains("pass.example.com be_shop_pass_443_"), "{}", sni.content);
    assert!(sni.content.contains("split.example.com hafleet_s_"), "{}", sni.content);
    let exact_and_prefix: String = bundle
        .maps
        .iter()
        .filter(|m| ["exact", "prefix", "hosts"].contains(&m.name.kind()))
        .map(|m| m.content.as_str())
        .collect();
    assert!(!exact_and_prefix.contains("pass.example.com"), "no HTTP rule: {exact_and_prefix}");
    let host = lay_out(&bundle, &identity);

    // With the fleet settings that touch the HTTPS bind and frontends (a load balancer's
    // PROXY protocol, an access log, a connection limit), HAProxy takes it too; the PROXY
    // protocol is then read where connections come in, hafleet_tls's bind.
    let settings = hafleet_proto::FleetSettings {
        accept_proxy: hafleet_proto::AcceptProxy { http: true, https: true },
        access_log: Some(hafleet_proto::LogTarget::Stdout),
        max_connections: Some(1000),
        ..Default::default()
    };
    let fleetwide = Fleetwide { default_cert: None, settings: Some(&settings) };
    let nodes = [(
        None,
        vec![NodeAddr {
            name: ObjectName::new("node-1").unwrap(),
            addr: "127.0.0.1".parse().unwrap(),
        }],
    )]
    .into();
    let set = renderer.render(&renderer.model(&fleet, &ingresses, &nodes, fleetwide)).unwrap();
    let tls_frontend = set.config.split("\nfrontend hafleet_tls\n").nth(1).unwrap_or_default();
    assert!(
        tls_frontend.contains("bind \"${HAFLEET_HTTPS_BIND-:443}\" accept-proxy\n"),
        "{}",
        set.config
    );
    assert!(
        set.config.contains("bind \"abns@hafleet-https-${HAFLEET_HTTPS_BIND-:443}\" ssl crt-list"),
        "{}",
        set.config
    );
    // A TCP port that is the fleet's metrics port is not bound twice (the reload would fail).
    let metrics =
        hafleet_proto::FleetSettings { prometheus_port: Some(tcp_port), ..Default::default() };
    let fleetwide = Fleetwide { default_cert: None, settings: Some(&metrics) };
    let clash = renderer.render(&renderer.model(&fleet, &ingresses, &nodes, fleetwide)).unwrap();
    let frontend = format!("frontend hafleet_tcp_{tcp_port}\n");
    assert!(set.config.contains(&frontend), "{}", set.config);
    assert!(!clash.config.contains(&frontend), "{}", clash.config);
    assert!(clash.config.contains(&format!("TCP port {tcp_port} is the fleet's prometheus-port")));
    let with_settings = lay_out(&set, &identity);
    for haproxy in haproxies() {
        let out = Command::new(&haproxy)
            .arg("-c")
            .arg("-f")
            .arg(with_settings.path().join("haproxy.cfg"))
            .env("HAFLEET_HTTP_BIND", "127.0.0.1:18080")
            .env("HAFLEET_HTTPS_BIND", "127.0.0.1:18443")
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{}: {said}\n{}", haproxy.display(), set.config);
        assert!(!said.contains("WARNING"), "{}: {said}", haproxy.display());
    }

    for haproxy in haproxies() {
        let (http, https) = (free_port(), free_port());
        let _served = Killed(
            Command::new(&haproxy)
                .arg("-db")
                .arg("-f")
                .arg(host.path().join("haproxy.cfg"))
                .env("HAFLEET_HTTP_BIND", format!("127.0.0.1:{http}"))
                .env("HAFLEET_HTTPS_BIND", format!("127.0.0.1:{https}"))
                .env("HAFLEET_TCP_ADDR", "127.0.0.1")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        wait_listening(https);
        let at = haproxy.display();
        for name in ["pass.example.com", "a.wild.example.com", "b.a.wild.example.com"] {
            // openssl's server answers a GET itself (-www) and closes.
            let got = s_client(https, name, "GET / HTTP/1.0\r\n\r\n");
            assert!(
                got.contains("CN = pass.example.com") || got.contains("CN=pass.example.com"),
                "{at}: {name} was not passed through: {got}"
            );
        }
        // A name shared by weight, 1:1: in 24 connections, both backends answer (each
        // missed with odds of 1 in 2^24), and only they.
        let mut answered = std::collections::BTreeSet::new();
        for _ in 0..24 {
            let got = s_client(https, "split.example.com", "GET / HTTP/1.0\r\n\r\n");
            let cn = ["pass.example.com", "pass2.example.com"].into_iter().find(|cn| {
                got.contains(&format!("CN = {cn}")) || got.contains(&format!("CN={cn}"))
            });
            answered.insert(cn.unwrap_or_else(|| panic!("{at}: split: {got}")));
        }
        assert_eq!(answered.len(), 2, "{at}: one share never taken: {answered:?}");
        let request = "GET / HTTP/1.1\r\nHost: term.example.com\r\nConnection: close\r\n\r\n";
        let got = s_client(https, "term.example.com", request);
        assert!(
            got.contains("CN = term.example.com") || got.contains("CN=term.example.com"),
            "{at}: {got}"
        );
        assert!(got.contains("terminated, for 127.0.0.1"), "{at}: not routed as HTTP: {got}");
        // A name no one serves, and the wildcard's own suffix, which it does not cover.
        for name in ["nobody.example.com", "wild.example.com"] {
            let got = s_client(https, name, "");
            assert!(
                !got.contains("CN = ") && !got.contains("CN="),
                "{at}: a name no one serves: {got}"
            );
        }
        // Plain HTTP for the terminated host goes to HTTPS, as before passthrough.
        let mut plain = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], http))).unwrap();
        plain.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        plain.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 308"), "{at}: {answer}");
        // A TCPRoute's port: the bytes go to its backend as they are (no X-Forwarded-For:
        // nothing read them as HTTP).
        let mut tcp = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], tcp_port))).unwrap();
        tcp.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).unwrap();
        assert!(answer.ends_with("terminated, for -\n"), "{at}: {answer}");
    }
}
