//! Proves each piece of the test environment works against the real servers.

use std::net::Ipv4Addr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use futures::StreamExt;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::Api;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::proc::{pid_alive, wait_for};
use crate::{
    HaproxyHost, HttpBackend, KubeEnv, NatsServer, SshClientKeys, TestDir, eventually, http_get,
    random_loopback_ip,
};

const T: Duration = Duration::from_secs(15);

#[tokio::test]
async fn nats_round_trip_and_restart_keeps_jetstream() {
    let mut nats = NatsServer::start().await.unwrap();
    let client = nats.client().await.unwrap();
    let mut sub = client.subscribe("selftest.ping").await.unwrap();
    client.publish("selftest.ping", "hello".into()).await.unwrap();
    client.flush().await.unwrap();
    let msg = tokio::time::timeout(T, sub.next()).await.unwrap().unwrap();
    assert_eq!(msg.payload.as_ref(), b"hello");

    let js = async_nats::jetstream::new(client);
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "SELFTEST".into(),
        subjects: vec!["selftest.js.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    js.publish("selftest.js.a", "x".into()).await.unwrap().await.unwrap();

    let old_pid = nats.pid().unwrap();
    nats.restart().await.unwrap();
    assert!(!pid_alive(old_pid));
    let js = async_nats::jetstream::new(nats.client().await.unwrap());
    let mut stream = js.get_stream("SELFTEST").await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 1);

    let pid = nats.pid().unwrap();
    drop(nats);
    assert!(!pid_alive(pid), "nats-server {pid} survived drop");
}

#[tokio::test]
async fn kube_env_serves_nodes_services_and_ingresses() {
    let started = Instant::now();
    let kube = KubeEnv::start().await.unwrap();
    eprintln!("KubeEnv::start took {:?}", started.elapsed());

    let node = kube.create_ready_node("node-a", Ipv4Addr::new(127, 0, 0, 11)).await.unwrap();
    let status = node.status.unwrap();
    assert_eq!(status.addresses.unwrap()[0].address, "127.0.0.11");
    assert_eq!(status.conditions.unwrap()[0].status, "True");
    let node = kube.set_node_ready("node-a", false).await.unwrap();
    let conditions = node.status.unwrap().conditions.unwrap();
    assert_eq!(conditions.len(), 1);
    assert_eq!((conditions[0].type_.as_str(), conditions[0].status.as_str()), ("Ready", "False"));

    kube.ensure_namespace("shop").await.unwrap();
    kube.ensure_namespace("shop").await.unwrap();
    let node_port = kube.create_nodeport_service("shop", "web", 8080).await.unwrap();
    assert!((20000..=32767).contains(&node_port), "nodePort {node_port}");

    let ingresses: Api<Ingress> = Api::all(kube.client().await.unwrap());
    assert!(ingresses.list(&Default::default()).await.unwrap().items.is_empty());
    let kubeconfig = std::fs::read_to_string(kube.kubeconfig_path()).unwrap();
    assert!(kubeconfig.contains("certificate-authority:"), "{kubeconfig}");

    let pids = [kube.apiserver_pid(), kube.etcd_pid()];
    drop(kube);
    for pid in pids {
        assert!(!pid_alive(pid), "{pid} survived drop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_hosts_serve_ssh_and_reload() {
    let keys_dir = TestDir::new("hafleet-keys-").unwrap();
    let keys = SshClientKeys::generate(keys_dir.path()).unwrap();
    let (mut one, two) =
        tokio::try_join!(HaproxyHost::start("edge-1", &keys), HaproxyHost::start("edge-2", &keys))
            .unwrap();
    let known_hosts = || std::fs::read_to_string(&keys.known_hosts).unwrap();
    assert_eq!(known_hosts().lines().count(), 2, "{}", known_hosts());

    for host in [&one, &two] {
        let (status, _) = http_get(host.http_addr(), "shop.example", "/").await.unwrap();
        assert_eq!(status, 404);
        let bind = host.ssh("echo $HAFLEET_HTTP_BIND").await.unwrap();
        assert_eq!(bind.trim(), host.http_addr().to_string());
        assert_eq!(host.ssh("id -un").await.unwrap().trim(), host.ssh_user());
        // What the applier will do: the master CLI and `haproxy -c`, as the host user over SSH.
        let sock = host.master_socket().display().to_string();
        let show_proc = format!("echo 'show proc' | socat stdio unix-connect:{sock}");
        assert!(host.ssh(&show_proc).await.unwrap().contains("master"));
        let cfg = host.config_path().display().to_string();
        let haproxy = host.haproxy_bin().display();
        host.ssh(&format!("{haproxy} -c -q -f {cfg}")).await.unwrap();
    }

    // A new config routing to a backend takes effect on `reload`.
    let backend = HttpBackend::start(random_loopback_ip(), 0, "web-1").await.unwrap();
    let before = one.show_proc().unwrap();
    assert_eq!((before.reloads, before.failed, before.workers.len()), (0, 0, 1));
    let routed = format!(
        "global\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 30s\n  \
         timeout server 30s\nfrontend hafleet_http\n  bind \"${{HAFLEET_HTTP_BIND}}\"\n  \
         default_backend web\nbackend web\n  server s1 {}\n",
        backend.addr()
    );
    std::fs::write(one.config_path(), &routed).unwrap();
    one.reload().unwrap();
    let after = eventually(T, "reload counted", || async {
        let p = one.show_proc()?;
        ensure!(p.reloads == 1 && p.failed == 0, "{p:?}");
        Ok(p)
    })
    .await
    .unwrap();
    assert_ne!(after.workers, before.workers);
    let body = eventually(T, "traffic reaches web-1", || async {
        match http_get(one.http_addr(), "shop.example", "/cart").await? {
            (200, body) => Ok(body),
            other => anyhow::bail!("{other:?}"),
        }
    })
    .await
    .unwrap();
    assert_eq!(body, "web-1 /cart\n");

    // A broken config: the reload fails, counted, and the old worker keeps serving.
    std::fs::write(one.config_path(), format!("{routed}  garbage\n")).unwrap();
    one.reload().unwrap();
    eventually(T, "failed reload counted", || async {
        let p = one.show_proc()?;
        ensure!(p.reloads == 2 && p.failed == 1 && p.workers == after.workers, "{p:?}");
        Ok(())
    })
    .await
    .unwrap();
    let (status, body) = http_get(one.http_addr(), "shop.example", "/").await.unwrap();
    assert_eq!((status, body.as_str()), (200, "web-1 /\n"));

    // An open SSH session; its remote shell must not outlive the host either.
    let mut session = one
        .ssh_command()
        .arg("echo $$; exec sleep 3600")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(session.stdout.take().unwrap()).read_line(&mut line).await.unwrap();
    let remote_sleep: u32 = line.trim().parse().unwrap();
    assert!(pid_alive(remote_sleep));

    // Failure helpers, then cleanup: no process of host one survives.
    let mut pids = vec![remote_sleep, one.haproxy_pid().unwrap()];
    pids.extend(one.show_proc().unwrap().workers);
    one.kill_haproxy();
    assert!(!one.haproxy_running());
    assert!(http_get(one.http_addr(), "x", "/").await.is_err());
    let sshd_pid = std::fs::read_to_string(one.dir().join("sshd.pid")).unwrap();
    pids.push(sshd_pid.trim().parse().unwrap());
    drop(one);
    for pid in pids {
        // SIGKILL is sent on drop; the kernel takes a moment to finish each process off.
        let gone = wait_for(Duration::from_secs(5), || async move { !pid_alive(pid) }).await;
        assert!(gone, "{pid} survived drop");
    }
    assert_eq!(known_hosts().lines().count(), 1, "{}", known_hosts());
    two.ssh("true").await.context("host two still reachable").unwrap();
}

#[tokio::test]
async fn backend_answers_and_stops_on_drop() {
    let backend = HttpBackend::start(random_loopback_ip(), 0, "web-1").await.unwrap();
    let (status, body) = http_get(backend.addr(), "shop.example", "/a/b?c=d").await.unwrap();
    assert_eq!((status, body.as_str()), (200, "web-1 /a/b?c=d\n"));
    assert_eq!(backend.hits(), 1);
    let addr = backend.addr();
    drop(backend);
    eventually(T, "backend stopped listening", || async {
        ensure!(http_get(addr, "x", "/").await.is_err(), "still answers");
        Ok(())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn eventually_reports_what_and_last_error() {
    let started = Instant::now();
    let err = eventually(Duration::from_millis(300), "the answer is 42", || async {
        anyhow::bail!("got 41") as anyhow::Result<()>
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("the answer is 42") && err.contains("got 41"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
}
