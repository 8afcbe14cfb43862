//! Fleet settings (issue 31): the ConfigMap `hafleet-fleet-<fleet>` changes what every host
//! of the fleet does, without a restart of any component, and history and replay name it.

use crate::history::ok;
use crate::refusals::warning_event_in;
use crate::{CONVERGE, World, expect_everywhere};
use anyhow::{Context as _, Result};
use hafleet_tests::assert::on_every_host;
use hafleet_tests::stack::Component;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A stand-in for a Service behind kube-proxy that answers every request with its head, as
/// it arrived, for a body: what the backend was told.
pub(crate) async fn head_echo(addr: SocketAddr) -> Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    Ok(tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let body = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
            });
        }
    }))
}

/// Sends `before` (a PROXY protocol header, say), then a GET of `/` for `host` with
/// `headers`, and returns the whole answer ("" when the connection was closed without one).
pub(crate) async fn raw_get(
    addr: SocketAddr,
    before: &str,
    host: &str,
    headers: &str,
) -> Result<String> {
    raw_get_path(addr, before, host, "/", headers).await
}

/// [`raw_get`] of `path`.
pub(crate) async fn raw_get_path(
    addr: SocketAddr,
    before: &str,
    host: &str,
    path: &str,
    headers: &str,
) -> Result<String> {
    let mut conn = TcpStream::connect(addr).await?;
    let request = format!(
        "{before}GET {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n"
    );
    conn.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    let read = conn.read_to_end(&mut answer);
    match tokio::time::timeout(Duration::from_secs(10), read).await {
        Ok(_) => Ok(String::from_utf8_lossy(&answer).into_owned()),
        Err(_) => anyhow::bail!("no answer in 10 s"),
    }
}

/// The fleet's settings, end to end: by default a backend gets the client's address in
/// `X-Forwarded-For` and never the one a client claims; the ConfigMap turns on the PROXY
/// protocol (a load balancer's client address reaches the backend) and an access log that
/// names the fleet and the host; the change is a `settings` cause in `history why`, replay
/// renders it, and a ConfigMap with a mistake gets a Warning Event and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_settings_change_what_every_host_does_and_history_names_them() -> Result<()> {
    let mut world = World::start().await?;
    let node_port =
        u16::try_from(world.stack.kube.create_nodeport_service("default", "echo", 80).await?)?;
    let mut servers = Vec::new();
    for b in world.backends.iter().filter(|b| b.addr().port() != node_port).take(2) {
        servers.push(head_echo(SocketAddr::new(b.addr().ip(), node_port)).await?);
    }
    world.route("echo", "echo.example.com", "/", "echo").await?;
    expect_everywhere(&world.stack, "echo.example.com", "/", 200, "get / http/1.1").await?;

    // The defaults: the client's own address, whatever it claims.
    for h in &world.stack.hosts {
        let claims = "X-Forwarded-For: 6.6.6.6\r\n";
        let answer = raw_get(h.http_addr(), "", "echo.example.com", claims).await?;
        assert!(answer.contains("x-forwarded-for: 127.0.0.1\r\n"), "{}: {answer}", h.name());
        assert!(!answer.contains("6.6.6.6"), "{}: a claimed address passed: {answer}", h.name());
        assert!(answer.contains("x-forwarded-proto: http\r\n"), "{answer}");
    }

    // The settings namespace, read by a watcher started with it.
    world.stack.kube.ensure_namespace("hafleet").await?;
    world.stack.restart_with(Component::Watcher, &[("HAFLEET_SETTINGS_NAMESPACE", "hafleet")])?;
    let client = world.stack.kube.client().await?;
    let maps: Api<ConfigMap> = Api::namespaced(client, "hafleet");
    let settings = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "hafleet-fleet-edge"},
        "data": {"accept-proxy": "http", "access-log": "stdout", "timeout-tunnel": "2h",
                 "prometheus-port": "19405",
                 "error-page-404": "<h1>Nothing at \"$HOST\" 100%</h1>\n"}
    }))?;
    maps.create(&PostParams::default(), &settings).await?;
    let stack = &world.stack;
    on_every_host(stack, CONVERGE, "runs the settings", |h| async move {
        let live = h.live_config();
        anyhow::ensure!(live.contains("accept-proxy") && live.contains("timeout tunnel 2h"));
        Ok(())
    })
    .await?;
    let version = stack.latest_version().await?.context("a version")?.version;
    // Live is more than the file: each host reports the version once HAProxy runs it.
    for h in &stack.hosts {
        world.report(h.name(), version).await?;
    }

    // PROXY protocol: the load balancer's client is the one the backend learns of; a client
    // that does not speak it is refused.
    for h in &stack.hosts {
        let proxy = format!("PROXY TCP4 203.0.113.7 {} 40000 80\r\n", h.http_addr().ip());
        let answer = raw_get(h.http_addr(), &proxy, "echo.example.com", "").await?;
        assert!(answer.contains("x-forwarded-for: 203.0.113.7\r\n"), "{}: {answer}", h.name());
        // The fleet's own page for what no route serves, byte for byte.
        let missing = raw_get(h.http_addr(), &proxy, "nowhere.example.com", "").await?;
        assert!(missing.starts_with("HTTP/1.1 404"), "{}: {missing}", h.name());
        assert!(missing.ends_with("\r\n\r\n<h1>Nothing at \"$HOST\" 100%</h1>\n"), "{missing}");
        let plain = raw_get(h.http_addr(), "", "echo.example.com", "").await.unwrap_or_default();
        assert!(!plain.starts_with("HTTP/1.1 200"), "{}: served without PROXY: {plain}", h.name());
    }
    // HAProxy's own metrics, on each host's address.
    for h in &stack.hosts {
        let metrics = SocketAddr::new(h.http_addr().ip(), 19405);
        let (status, body) = hafleet_tests::http_get(metrics, "metrics", "/metrics").await?;
        assert_eq!(status, 200, "{}: {body}", h.name());
        assert!(body.contains("haproxy_process_"), "{}: {body}", h.name());
    }
    // The access log: one line a request, naming the fleet, the version the host serves, the
    // route (the Ingress), the host, the backend and the request.
    for h in &stack.hosts {
        let log = std::fs::read_to_string(h.haproxy_log())?;
        let line = log
            .lines()
            .find(|l| l.starts_with(&format!("edge v{version} ")) && l.contains("echo.example.com"))
            .with_context(|| {
                format!("{}: no access log line in:\n{log}\n{}", h.name(), stack.logs())
            })?;
        assert!(line.contains(" route=default/echo be_default_echo_80/"), "{line}");
        assert!(line.contains(" 200 "), "{line}");
        assert!(line.contains("\"GET / HTTP/1.1\""), "{line}");
    }

    // A route added to a running backend goes live without a reload, route maps included:
    // its requests are logged under its own Ingress.
    let reloads: Vec<u32> = stack.hosts.iter().map(|h| h.reload_count()).collect::<Result<_>>()?;
    world.route("more", "more.example.com", "/", "echo").await?;
    on_every_host(stack, CONVERGE, "logs more.example.com under its route", |h| async move {
        let proxy = format!("PROXY TCP4 203.0.113.8 {} 40001 80\r\n", h.http_addr().ip());
        let answer = raw_get(h.http_addr(), &proxy, "more.example.com", "").await?;
        anyhow::ensure!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let log = std::fs::read_to_string(h.haproxy_log())?;
        anyhow::ensure!(
            log.lines()
                .any(|l| l.contains(" route=default/more ") && l.contains("more.example.com")),
            "no line for more.example.com under route=default/more"
        );
        Ok(())
    })
    .await?;
    let now: Vec<u32> = stack.hosts.iter().map(|h| h.reload_count()).collect::<Result<_>>()?;
    assert_eq!(now, reloads, "a route on a running backend reloads nothing, logging or not");

    // History: the version's cause is the settings change, with each key set.
    let why: serde_json::Value = serde_json::from_str(
        &ok(&world, &["history", "why", &version.to_string(), "-o", "json"]).await?,
    )?;
    let causes = why["causes"].as_array().context("causes")?;
    let cause =
        causes.iter().find(|c| c["what"] == "settings").with_context(|| format!("{why}"))?;
    let added: Vec<&str> =
        cause["added"].as_array().context("added")?.iter().filter_map(|a| a.as_str()).collect();
    assert_eq!(added.len(), 5, "{added:?}");
    assert_eq!(added[..2], ["accept-proxy=http", "access-log=stdout"]);
    assert!(added[2].starts_with("error-page-404=sha256:"), "{added:?}");
    assert_eq!(added[3..], ["prometheus-port=19405", "timeout-tunnel=2h"]);
    // Replay at that point renders it.
    let seq = cause["stream_seq"].as_u64().context("stream_seq")?;
    let replayed = ok(&world, &["replay", "--until", &seq.to_string()]).await?;
    assert!(replayed.contains("accept-proxy") && replayed.contains("log stdout format raw"));

    // A mistake: told on the ConfigMap, and the fleet keeps what it has.
    let current = stack.latest_version().await?.context("a version")?.version;
    let bad = serde_json::json!({"data": {"timeout-client": "1 minute"}});
    maps.patch("hafleet-fleet-edge", &PatchParams::default(), &Patch::Merge(&bad)).await?;
    let event = warning_event_in(stack, "hafleet", "hafleet-fleet-edge", "InvalidSettings").await?;
    let note = event.note.unwrap_or_default();
    assert!(note.contains("timeout-client=\"1 minute\"") && note.contains("last good"), "{note}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let newest = stack.latest_version().await?.context("a version")?.version;
    assert_eq!(newest, current, "a broken ConfigMap makes no version");
    for s in servers {
        s.abort();
    }
    Ok(())
}
