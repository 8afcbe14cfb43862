//! hafleet-demo: the whole pipeline on loopback with a sample app, for people to try hafleet
//! (`./deploy/local/demo.sh`), and for CI to prove the README true (`--smoke`).

use anyhow::{Context, Result};
use clap::Parser;
use hafleet_tests::stack::Stack;
use hafleet_tests::{HttpBackend, eventually, http_get, random_loopback_ip};
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
}

const FLEET: &str = "edge";
const HOST: &str = "hello.local";

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
    let stack = Stack::start(FLEET, args.hosts).await?;

    let nodes: Vec<(String, std::net::Ipv4Addr)> =
        (1..=2).map(|i| (format!("node-{i}"), random_loopback_ip())).collect();
    for (name, ip) in &nodes {
        stack.kube.create_ready_node(name, *ip).await?;
    }
    let node_port =
        u16::try_from(stack.kube.create_nodeport_service("default", "hello", 80).await?)?;
    let mut backends = Vec::new();
    for (name, ip) in &nodes {
        backends.push(HttpBackend::start(*ip, node_port, &format!("hello from {name}")).await?);
    }
    let ingress: Ingress = serde_json::from_value(serde_json::json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": "hello", "annotations": {"hafleet.io/fleet": FLEET}},
        "spec": {"rules": [{"host": HOST, "http": {"paths": [{
            "path": "/", "pathType": "Prefix",
            "backend": {"service": {"name": "hello", "port": {"number": 80}}}
        }]}}]}
    }))?;
    Api::<Ingress>::namespaced(stack.kube.client().await?, "default")
        .create(&PostParams::default(), &ingress)
        .await
        .context("creating the sample Ingress")?;

    for h in &stack.hosts {
        let addr = h.http_addr();
        let (status, body) = eventually(
            Duration::from_secs(90),
            &format!("{} serves {HOST}", h.name()),
            || async move {
                let (status, body) = http_get(addr, HOST, "/").await?;
                anyhow::ensure!(
                    status == 200 && body.starts_with("hello from node-"),
                    "got {status} {body:?}"
                );
                Ok((status, body))
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))?;
        println!(
            "ok: GET http://{addr}/ Host: {HOST} through HAProxy {} -> {status} {}",
            h.name(),
            body.trim()
        );
    }

    if args.smoke {
        println!("smoke test passed: traffic went through every HAProxy host to the backend");
        return Ok(());
    }

    let mut env = String::new();
    writeln!(env, "# hafleet demo: source this file")?;
    writeln!(env, "export KUBECONFIG={}", stack.kube.kubeconfig_path().display())?;
    writeln!(env, "export HAFLEET_NATS_URL={}", stack.nats.url())?;
    writeln!(env, "export HAFLEET_FLEET={FLEET}")?;
    writeln!(env, "export HAFLEET_DEMO_DIR={}", stack.dir().display())?;
    for (i, h) in stack.hosts.iter().enumerate() {
        writeln!(env, "export HAFLEET_HOST_{}={}", i + 1, h.http_addr())?;
        writeln!(env, "export HAFLEET_HOST_{}_CONFIG={}", i + 1, h.config_path().display())?;
    }
    if let Some(parent) = args.env_file.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.env_file, env)?;

    let first = stack.hosts[0].http_addr();
    println!(
        "\nhafleet is running. In another shell:\n\
         \n  source {env}\
         \n  curl -H 'Host: {HOST}' http://$HAFLEET_HOST_1/        # through HAProxy {first}\
         \n  kubectl get ingress,svc,nodes\
         \n  kubectl apply -f your-ingress.yaml    # annotate it hafleet.io/fleet: {FLEET}\
         \n  cat $HAFLEET_HOST_1_CONFIG             # the live HAProxy config\
         \n\nLogs of the three binaries: {dir}/*.log\nCtrl-C stops everything.",
        env = args.env_file.display(),
        dir = stack.dir().display(),
    );
    tokio::signal::ctrl_c().await?;
    eprintln!("stopping…");
    drop(backends);
    drop(stack);
    let _ = std::fs::remove_file(&args.env_file);
    Ok(())
}
