//! hafleet-demo: the whole pipeline on loopback with a sample app, for people to try hafleet
//! (`./deploy/local/demo.sh`), and for CI to prove the README true (`--smoke`).

use anyhow::{Context, Result};
use clap::Parser;
use hafleet_tests::cluster::{
    create_ingresses, create_services, ready_nodes, service_with_backends,
};
use hafleet_tests::fixtures::IngressBuilder;
use hafleet_tests::haproxy_host::host_haproxy;
use hafleet_tests::stack::{Component, Stack};
use hafleet_tests::tls::{
    Ca, fingerprint, https_get_as, self_signed, served_fingerprint, tls_on, tls_secret,
};
use hafleet_tests::websocket::{echo, upgrade, upgrade_echo};
use hafleet_tests::{eventually, http_get, http_get_full};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, PostParams};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

/// Runs hafleet on loopback: API server, NATS, HAProxy hosts behind sshd, the three binaries,
/// and a sample Ingress with its backend.
#[derive(Debug, Parser)]
#[command(name = "hafleet-demo", about)]
struct Args {
    /// Prove one request through every HAProxy host, tear everything down, exit 0 or 1.
    #[arg(long)]
    smoke: bool,
    /// Where to write the env file to `source` (KUBECONFIG, NATS URL, HAProxy hosts).
    #[arg(long, default_value = ".demo/env")]
    env_file: PathBuf,
    /// How many HAProxy hosts the fleet has.
    #[arg(long, default_value_t = 2)]
    hosts: usize,
    /// How many Ready nodes the cluster has. Each answers for its health as kube-proxy would,
    /// where the renderer checks it by default.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// How many Ingresses the fleet serves besides `ws.local`'s: `hello.local`, and
    /// `app-<i>.local` for the rest,
    /// each on a NodePort Service of its own. Try `--ingresses 10000 --nodes 200`. Only
    /// hello and the last app run backend processes; the others answer 503.
    #[arg(long, default_value_t = 1)]
    ingresses: usize,
    /// Run NATS as a 3-node cluster with every stream replicated 3 times (the production
    /// set-up), instead of one server.
    #[arg(long)]
    nats_cluster: bool,
    /// Where hello.local's traffic goes: `nodes`, to the nodes at its Service's NodePort (each
    /// node playing kube-proxy's part), or `pods`, straight to two pods (local servers on
    /// loopback addresses) through a ClusterIP Service in pods mode, from an EndpointSlice the
    /// demo writes.
    #[arg(long, default_value = "nodes", value_parser = ["nodes", "pods"])]
    endpoints: String,
}

const FLEET: &str = "edge";
const HOST: &str = "hello.local";
/// A WebSocket echo, over plain HTTP.
const WS_HOST: &str = "ws.local";
/// Where the watcher reads the fleet's settings (`hafleet-fleet-edge`): its own namespace, as
/// in deploy/kubernetes.
const SETTINGS_NAMESPACE: &str = "hafleet";

/// The Secret holding hello's certificate, issued by the demo's CA.
const HELLO_TLS: &str = "hello-tls";
/// The Secret holding the fleet's default certificate (self-signed), served for names that
/// have none of their own.
const DEFAULT_TLS: &str = "edge-default-tls";

/// The host the demo's HTTPRoute routes.
const GW_HOST: &str = "gw.local";

/// hafleet's GatewayClass, the fleet's Gateway `edge` (HTTP, routes of every namespace) and
/// an HTTPRoute `hello` for `gw.local` to the Service `hello`.
fn gateway_objects() -> Vec<serde_json::Value> {
    vec![
        serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": "hafleet"},
            "spec": {"controllerName": hafleet_tests::gateway_api::CONTROLLER_NAME}
        }),
        serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": FLEET, "namespace": "default", "annotations": {"hafleet.io/fleet": FLEET}},
            "spec": {"gatewayClassName": "hafleet", "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP",
                 "allowedRoutes": {"namespaces": {"from": "All"}}}]}
        }),
        serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "hello", "namespace": "default"},
            "spec": {"parentRefs": [{"name": FLEET}], "hostnames": [GW_HOST],
                     "rules": [{"backendRefs": [{"name": "hello", "port": 80}]}]}
        }),
    ]
}

/// An Ingress on `fleet` routing `host`, every path, to Service `service` port 80; served over
/// HTTPS with the certificate in Secret `tls` (if given), HTTP redirected there.
fn ingress(name: &str, host: &str, service: &str, tls: Option<&str>) -> Ingress {
    let b = IngressBuilder::new(name).fleet(FLEET).route(host, "/", service);
    match tls {
        Some(secret) => b.tls(&[host], secret).build(),
        None => b.build(),
    }
}

/// hello in pods mode: a ClusterIP Service annotated `hafleet.io/endpoints: pods`, two pods
/// answering `hello@pod-<i>`, and the EndpointSlice that lists them ready.
async fn hello_pods(stack: &Stack) -> Result<Vec<hafleet_tests::HttpBackend>> {
    use hafleet_tests::pods::{Condition, Slices, create_pods_service, ip, start_pod};
    let client = stack.kube.client().await?;
    let port = hafleet_tests::free_port(std::net::Ipv4Addr::LOCALHOST.into());
    let mut pods = Vec::new();
    for i in 1..=2 {
        pods.push(start_pod(&format!("hello@pod-{i}"), port).await?);
    }
    create_pods_service(client.clone(), "default", "hello", port, true).await?;
    let ready: Vec<_> = pods.iter().map(|p| (ip(p), Condition::Ready)).collect();
    Slices::of(client, "default").await?.put("hello-1", "hello", port, &ready).await?;
    eprintln!("hello.local is served by two pods, straight: {}", {
        let addrs: Vec<String> = pods.iter().map(|p| p.addr().to_string()).collect();
        addrs.join(" ")
    });
    Ok(pods)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    match run(&args).await {
        Ok(()) => {}
        Err(e) => {
            eprintln!("hafleet-demo: {e:#}");
            std::process::exit(1);
        }
    }
}

async fn run(args: &Args) -> Result<()> {
    eprintln!("starting kube-apiserver, NATS, {} HAProxy hosts and hafleet…", args.hosts);
    anyhow::ensure!(args.nodes >= 1 && args.ingresses >= 1, "--nodes and --ingresses start at 1");
    let nats_nodes = if args.nats_cluster { 3 } else { 1 };
    let mut stack = Stack::start_on(FLEET, args.hosts, nats_nodes).await?;
    // Debian's HAProxy, or the one HAFLEET_HAPROXY names (tests/setup.sh builds 3.0).
    for h in &stack.hosts {
        let version = h.haproxy_version().with_context(|| format!("{}'s HAProxy", h.name()))?;
        println!("{} runs HAProxy {version} ({})", h.name(), host_haproxy().display());
    }
    // HTTPS: a CA of the demo's own issues hello's certificate; the fleet's default
    // certificate, for names without one, is self-signed.
    let ca = Ca::new("hafleet demo CA")?;
    let ca_file = stack.dir().join("demo-ca.pem");
    std::fs::write(&ca_file, ca.cert_pem()?)?;
    let (hello_crt, hello_key) = ca.issue(&[HOST])?;
    let (default_crt, default_key) = self_signed(&["edge-default.invalid"])?;
    let client = stack.kube.client().await?;
    let secrets = Api::<Secret>::namespaced(client.clone(), "default");
    for (name, crt, key) in
        [(HELLO_TLS, &hello_crt, &hello_key), (DEFAULT_TLS, &default_crt, &default_key)]
    {
        secrets
            .create(&PostParams::default(), &tls_secret(name, crt, key)?)
            .await
            .with_context(|| format!("creating Secret {name}"))?;
    }
    // `kubectl get ingress` shows where the fleet takes traffic: its HAProxy hosts.
    let addresses: Vec<String> =
        stack.hosts.iter().map(|h| h.http_addr().ip().to_string()).collect();
    let fleet_addresses = format!("{FLEET}={}", addresses.join(","));
    let default_cert = format!("{FLEET}=default/{DEFAULT_TLS}");
    // The fleet's settings: an access log on each host's standard output, which the demo
    // writes to a file per host (HSTS stays off: the demo's CA is no public one).
    let settings: ConfigMap = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": format!("hafleet-fleet-{FLEET}"), "namespace": SETTINGS_NAMESPACE},
        "data": {"access-log": "stdout"}
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), SETTINGS_NAMESPACE)
        .create(&PostParams::default(), &settings)
        .await
        .context("creating the fleet's settings")?;
    // The Gateway API: the upstream CRDs (the watcher, restarted below, finds them), hafleet's
    // GatewayClass and the Gateway `edge` of the fleet.
    let crds = stack.dir().join("gateway-api");
    std::fs::create_dir_all(&crds)?;
    hafleet_tests::gateway_api::install_crds(&stack.kube, &crds).await?;
    for object in gateway_objects() {
        hafleet_tests::gateway_api::create(&client, object).await?;
    }
    tls_on(
        &mut stack,
        &[
            ("HAFLEET_FLEET_ADDRESSES", fleet_addresses.as_str()),
            ("HAFLEET_DEFAULT_CERT", default_cert.as_str()),
            ("HAFLEET_SETTINGS_NAMESPACE", SETTINGS_NAMESPACE),
        ],
    )
    .await?;
    let (nodes, mut backends) = ready_nodes(&stack, args.nodes).await?;
    if args.endpoints == "pods" {
        backends.extend(hello_pods(&stack).await?);
    } else {
        backends.extend(service_with_backends(&stack, "hello", &nodes).await?);
    }
    // A WebSocket echo service behind ws.local (kube-proxy's part played on each node).
    let ws_port =
        u16::try_from(stack.kube.create_nodeport_service("default", "echo-ws", 80).await?)?;
    let mut ws_servers = Vec::new();
    for n in &nodes {
        ws_servers.push(upgrade_echo(std::net::SocketAddr::new(n.addr, ws_port)).await?);
    }
    let gw_client = client.clone();
    let ingresses = Api::<Ingress>::namespaced(client, "default");
    for ing in
        [ingress("hello", HOST, "hello", Some(HELLO_TLS)), ingress("ws", WS_HOST, "echo-ws", None)]
    {
        ingresses
            .create(&PostParams::default(), &ing)
            .await
            .context("creating the sample Ingresses")?;
    }
    // The rest of the fleet: Services first, then their Ingresses.
    let last_app = (args.ingresses > 1).then(|| args.ingresses - 1);
    if let Some(last) = last_app {
        eprintln!("creating {last} more Services and Ingresses on {} nodes…", args.nodes);
        let started = std::time::Instant::now();
        create_services(&stack, (1..last).map(|i| format!("app-{i}"))).await?;
        backends.extend(service_with_backends(&stack, &format!("app-{last}"), &nodes).await?);
        let apps =
            (1..=last).map(|i| (format!("app-{i}"), format!("app-{i}.local"), format!("app-{i}")));
        create_ingresses(&stack, FLEET, apps).await.context("creating the app Ingresses")?;
        eprintln!("created in {:.1} s", started.elapsed().as_secs_f64());
    }

    // hello over HTTPS through every HAProxy host, its certificate checked against the
    // demo's CA; over HTTP it is redirected. Names without a certificate get the default one.
    let default_fp = fingerprint(&default_crt)?;
    for h in &stack.hosts {
        let addr = h.https_addr();
        let answer = eventually(
            Duration::from_secs(300),
            &format!("{} serves {HOST} over HTTPS", h.name()),
            || async {
                let answer = https_get_as(addr, HOST, HOST, &ca_file).await?;
                anyhow::ensure!(
                    answer.starts_with("HTTP/1.1 200") && answer.contains("hello@"),
                    "got {answer:?}"
                );
                Ok(answer)
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))?;
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
        println!(
            "ok: GET https://{HOST}/ through HAProxy {} at {addr}, certificate checked against \
             the demo CA -> 200 {}",
            h.name(),
            body.lines().next().unwrap_or_default().trim()
        );
        let unknown = served_fingerprint(addr, "unknown.local").await?;
        anyhow::ensure!(
            unknown.as_deref() == Some(default_fp.as_str()),
            "{} serves unknown.local with {unknown:?}, not the default certificate",
            h.name()
        );
        let redirect = http_get_full(h.http_addr(), HOST, "/").await?;
        let location = redirect.headers.iter().find(|(k, _)| k == "location").map(|(_, v)| v);
        anyhow::ensure!(
            redirect.status == 308 && location.is_some_and(|l| l == "https://hello.local/"),
            "{} answers http://{HOST}/ with {} {location:?}, not a redirect to HTTPS",
            h.name(),
            redirect.status
        );
    }
    println!(
        "ok: http://{HOST}/ is redirected to HTTPS (308); names without a certificate get the \
         fleet's default one"
    );
    // A WebSocket through every host, and the access log that names the requests.
    for h in &stack.hosts {
        let addr = h.http_addr();
        eventually(
            Duration::from_secs(300),
            &format!("{} upgrades {WS_HOST}", h.name()),
            || async {
                let mut conn = upgrade(addr, WS_HOST).await?;
                echo(&mut conn, b"hello over a WebSocket").await
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))?;
        println!("ok: ws://{WS_HOST}/socket through HAProxy {} at {addr} echoes", h.name());
        let log = h.haproxy_log();
        let line =
            eventually(Duration::from_secs(60), &format!("{}'s access log", h.name()), || async {
                let text = std::fs::read_to_string(&log)?;
                let line =
                    text.lines().find(|l| l.starts_with(&format!("{FLEET} ")) && l.contains(HOST));
                line.map(str::to_owned).ok_or_else(|| anyhow::anyhow!("no line for {HOST} yet"))
            })
            .await?;
        println!("ok: {}'s access log: {line}", h.name());
    }

    // The HTTPRoute on the Gateway: the same Service, by the Gateway API, on every host; the
    // Gateway says Programmed once every host serves it.
    for h in &stack.hosts {
        let addr = h.http_addr();
        let (_, body) = eventually(
            Duration::from_secs(300),
            &format!("{} serves {GW_HOST}", h.name()),
            || async move {
                let (status, body) = http_get(addr, GW_HOST, "/").await?;
                anyhow::ensure!(
                    status == 200 && body.starts_with("hello@"),
                    "got {status} {body:?}"
                );
                Ok((status, body))
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))?;
        println!(
            "ok: GET http://{addr}/ Host: {GW_HOST} (HTTPRoute hello on Gateway {FLEET}) through \
             HAProxy {} -> 200 {}",
            h.name(),
            body.lines().next().unwrap_or_default().trim()
        );
    }
    let client = &gw_client;
    let programmed =
        eventually(Duration::from_secs(120), "Gateway edge Programmed", || async move {
            let gw =
                hafleet_tests::gateway_api::get(client, "Gateway", Some("default"), FLEET).await?;
            let conditions =
                gw.data["status"]["conditions"].as_array().cloned().unwrap_or_default();
            let programmed = conditions
                .iter()
                .find(|c| c["type"] == "Programmed" && c["status"] == "True")
                .and_then(|c| c["message"].as_str().map(str::to_owned));
            programmed.ok_or_else(|| anyhow::anyhow!("not yet: {conditions:?}"))
        })
        .await?;
    println!("ok: kubectl get gateway {FLEET}: Programmed ({programmed})");
    // The last app through every HAProxy host; the first app is routed too, but nothing runs
    // behind its NodePort: HAProxy answers 503 (an unknown host gets 404).
    let mut expect = vec![];
    if let Some(last) = last_app {
        expect.push((format!("app-{last}.local"), 200, format!("app-{last}@node-")));
        if last > 1 {
            expect.push(("app-1.local".to_owned(), 503, String::new()));
        }
    }
    for (host, want, body_starts) in &expect {
        for h in &stack.hosts {
            let addr = h.http_addr();
            let (status, body) = eventually(
                Duration::from_secs(300),
                &format!("{} serves {host}", h.name()),
                || async move {
                    let (status, body) = http_get(addr, host, "/").await?;
                    anyhow::ensure!(
                        status == *want && body.starts_with(body_starts.as_str()),
                        "got {status} {body:?}"
                    );
                    Ok((status, body))
                },
            )
            .await
            .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))?;
            println!(
                "ok: GET http://{addr}/ Host: {host} through HAProxy {} -> {status} {}",
                h.name(),
                body.lines().next().unwrap_or_default().trim()
            );
        }
    }
    let ingresses = &ingresses;
    let shown =
        eventually(Duration::from_secs(60), "hello's status shows the hosts", || async move {
            let status = ingresses.get("hello").await?.status;
            let shown: Vec<String> = status
                .and_then(|s| s.load_balancer)
                .and_then(|lb| lb.ingress)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|i| i.ip)
                .collect();
            anyhow::ensure!(!shown.is_empty(), "no address yet");
            Ok(shown)
        })
        .await?;
    anyhow::ensure!(shown == addresses, "hello's status shows {shown:?}, not {addresses:?}");
    println!("ok: kubectl get ingress hello shows ADDRESS {}", shown.join(","));
    if let Some(version) = stack.latest_version().await? {
        println!(
            "version {} live: {} Ingresses on {} nodes, config + maps {:.1} MB",
            version.version,
            args.ingresses + 1,
            args.nodes,
            version.size as f64 / 1e6
        );
    }

    if args.smoke {
        println!("smoke test passed: traffic went through every HAProxy host to the backend");
        return Ok(());
    }

    let mut env = String::new();
    writeln!(env, "# hafleet demo: source this file")?;
    writeln!(env, "export KUBECONFIG={}", stack.kube.kubeconfig_path().display())?;
    // The operator's NATS settings: TLS with the demo's CA, and an NKEY seed file.
    for (name, value) in stack.nats.env_for("admin") {
        writeln!(env, "export {name}={value}")?;
    }
    writeln!(env, "export HAFLEET_FLEET={FLEET}")?;
    writeln!(env, "export HAFLEET_DEMO_DIR={}", stack.dir().display())?;
    for (name, c) in [
        ("WATCHER", Component::Watcher),
        ("RENDERER", Component::Renderer),
        ("APPLIER", Component::Applier),
    ] {
        // host:port of /metrics, /healthz and /readyz.
        writeln!(env, "export HAFLEET_{name}_METRICS={}", stack.health_addr(c))?;
    }
    writeln!(env, "export HAFLEET_DEMO_CA={}", ca_file.display())?;
    for (i, h) in stack.hosts.iter().enumerate() {
        writeln!(env, "export HAFLEET_HOST_{}={}", i + 1, h.http_addr())?;
        writeln!(env, "export HAFLEET_HOST_{}_TLS={}", i + 1, h.https_addr())?;
        writeln!(env, "export HAFLEET_HOST_{}_CONFIG={}", i + 1, h.config_path().display())?;
        writeln!(env, "export HAFLEET_HOST_{}_ACCESS_LOG={}", i + 1, h.haproxy_log().display())?;
    }
    if let Some(parent) = args.env_file.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // Whole or not at all: whoever waits for the file never reads half of it.
    let partial = args.env_file.with_extension("partial");
    std::fs::write(&partial, env)?;
    std::fs::rename(&partial, &args.env_file)?;

    let first = stack.hosts[0].https_addr();
    println!(
        "\nhafleet is running. In another shell:\n\
         \n  source {env}\
         \n  curl --cacert $HAFLEET_DEMO_CA --resolve {HOST}:{port}:{ip} https://{HOST}:{port}/\
         \n                                          # through HAProxy {first}, over HTTPS\
         \n  curl -i -H 'Host: {HOST}' http://$HAFLEET_HOST_1/   # 308 to https://{HOST}/\
         \n  kubectl get ingress,svc,nodes\
         \n  kubectl get gatewayclass,gateway,httproute   # the Gateway API, on the same fleet\
         \n  curl -H 'Host: {GW_HOST}' http://$HAFLEET_HOST_1/   # the HTTPRoute hello\
         \n  kubectl apply -f your-ingress.yaml    # annotate it hafleet.io/fleet: {FLEET}\
         \n  cat $HAFLEET_HOST_1_CONFIG             # the live HAProxy config\
         \n  tail -f $HAFLEET_HOST_1_ACCESS_LOG     # one line a request: route, server, timings\
         \n  curl -i -N -H 'Host: {WS_HOST}' -H 'Connection: Upgrade' -H 'Upgrade: websocket' \\\
         \n    -H 'Sec-WebSocket-Version: 13' -H 'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==' \\\
         \n    http://$HAFLEET_HOST_1/socket         # a WebSocket: 101, then what you type echoes\
         \n  kubectl -n {SETTINGS_NAMESPACE} edit configmap hafleet-fleet-{FLEET}   # the fleet's settings\
         \n  curl http://$HAFLEET_APPLIER_METRICS/metrics   # each binary's metrics\
         \n\nLogs of the three binaries: {dir}/*.log\nCtrl-C stops everything.",
        env = args.env_file.display(),
        port = first.port(),
        ip = first.ip(),
        dir = stack.dir().display(),
    );
    tokio::signal::ctrl_c().await?;
    eprintln!("stopping…");
    drop(backends);
    ws_servers.iter().for_each(|s| s.abort());
    drop(stack);
    let _ = std::fs::remove_file(&args.env_file);
    Ok(())
}
