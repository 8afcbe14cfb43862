//! End-to-end: real kube-apiserver, NATS, sshd and HAProxy, and the three hafleet binaries as
//! processes. Each test starts its own stack on its own loopback addresses and ports.
//!
//! - `history`: the history CLI lists, shows, diffs, explains, rolls back and resumes;
//! - `routing`: Ingresses become routes on every host and follow every change;
//! - `refusals`: bad input (an Ingress, a config HAProxy refuses, an unknown host key) changes
//!   nothing that works;
//! - `recovery`: any component killed and restarted, the pipeline converges;
//! - `traffic`: long-lived connections through the fleet;
//! - `pods`: pods mode, traffic straight to the ready pods of the EndpointSlices;
//! - `settings`: a fleet's settings ConfigMap changes what every host does;
//! - `filters`: an Ingress's header, redirect, rewrite, deny and rate annotations;
//! - `gateway`: the Gateway API (so far, its CRDs on the test API server);
//! - `tenants`: what one namespace can and cannot do to another, or one Ingress to its fleet;
//! - `churn`: a namespace changing its Ingresses in a loop reloads its fleet within its budget;
//! - `scale`: configs larger than a NATS message go live in chunks through the bundles stream;
//! - `clusters`: several Kubernetes clusters feed one fleet;
//! - `image`: the container image, built and run.

mod churn;
mod cli;
mod clusters;
mod control;
mod deploy;
mod docs;
mod drift;
mod filters;
mod gateway;
mod history;
mod image;
mod inventory;
mod pods;
mod recovery;
mod refusals;
mod routing;
mod scale;
mod settings;
mod snapshots;
mod tenants;
mod tls;
mod traffic;

use anyhow::Result;
use hafleet_tests::assert::{on_every_host, on_hosts};
use hafleet_tests::fixtures::IngressBuilder;
use hafleet_tests::stack::{Component, Stack};
use hafleet_tests::{HaproxyHost, HttpBackend, eventually, http_get, random_loopback_ip};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, PostParams};
use std::net::Ipv4Addr;
use std::time::Duration;

/// How long a change may take to reach every HAProxy host. Generous: CI machines are small and
/// the first rollout also warms up SSH.
pub const CONVERGE: Duration = Duration::from_secs(60);

/// An Ingress on `fleet` (none: not hafleet's) routing `host` and `path` (Prefix) to port 80 of
/// `service`: the most common one; [`IngressBuilder`] builds any other.
pub fn ingress(name: &str, fleet: Option<&str>, host: &str, path: &str, service: &str) -> Ingress {
    let b = IngressBuilder::new(name).route(host, path, service);
    match fleet {
        Some(f) => b.fleet(f).build(),
        None => b.build(),
    }
}

/// Two Ready nodes and one NodePort Service with a backend on each node at its NodePort (what
/// kube-proxy would do).
pub async fn service_on_two_nodes(
    stack: &Stack,
    service: &str,
    nodes: &[(String, Ipv4Addr)],
) -> Result<Vec<HttpBackend>> {
    let node_port = stack.kube.create_nodeport_service("default", service, 80).await?;
    let mut backends = Vec::new();
    for (node, ip) in nodes {
        let port = u16::try_from(node_port)?;
        backends.push(HttpBackend::start(*ip, port, &format!("{service}@{node}")).await?);
    }
    Ok(backends)
}

/// What component `c` of `stack` answers at `/metrics` (an error unless 200).
pub async fn metrics(stack: &Stack, c: Component) -> Result<String> {
    let (status, body) = http_get(stack.health_addr(c), "health", "/metrics").await?;
    anyhow::ensure!(status == 200, "{c:?} /metrics: {status}");
    Ok(body)
}

/// Waits until every HAProxy host's live config lists (`want`) or no longer lists a server on
/// `node`.
pub async fn node_listed_everywhere(stack: &Stack, node: &str, want: bool) -> Result<()> {
    let line = format!("server {node} ");
    let line = &line;
    on_every_host(stack, CONVERGE, &format!("{line}listed = {want}"), |h| async move {
        let listed = h.live_config().contains(line.as_str());
        anyhow::ensure!(listed == want, "listed = {listed}");
        Ok(())
    })
    .await?;
    Ok(())
}

/// Waits until a GET through every HAProxy host of the stack answers `status` with a body
/// starting with `body_prefix`.
pub async fn expect_everywhere(
    stack: &Stack,
    host: &str,
    path: &str,
    status: u16,
    body_prefix: &str,
) -> Result<()> {
    expect_on(&stack.hosts, stack, host, path, status, body_prefix).await
}

/// Like [`expect_everywhere`], for any set of HAProxy hosts (another fleet's, say).
pub async fn expect_on(
    hosts: &[HaproxyHost],
    stack: &Stack,
    host: &str,
    path: &str,
    status: u16,
    body_prefix: &str,
) -> Result<()> {
    let what = format!("{host}{path} -> {status} {body_prefix:?}");
    on_hosts(stack, hosts, CONVERGE, &what, |h| async move {
        let (got, body) = http_get(h.http_addr(), host, path).await?;
        anyhow::ensure!(got == status && body.starts_with(body_prefix), "got {got} {body:?}");
        Ok(())
    })
    .await?;
    Ok(())
}

/// A stack for fleet `edge` with two HAProxy hosts, two Ready nodes that answer for their
/// health as kube-proxy does, and Services `web` and `api` served on both nodes.
pub struct World {
    pub stack: Stack,
    pub ingresses: Api<Ingress>,
    /// `web@node-1`, `web@node-2`, `api@node-1`, `api@node-2`.
    pub backends: Vec<HttpBackend>,
    /// Each node's health port: `healthy@node-1`, `healthy@node-2`.
    pub node_health: Vec<HttpBackend>,
}

impl World {
    pub async fn start() -> Result<World> {
        World::with_hosts(2).await
    }

    /// [`World::start`] with `hosts` HAProxy hosts.
    pub async fn with_hosts(hosts: usize) -> Result<World> {
        World::on(Stack::start("edge", hosts).await?).await
    }

    /// [`World::start`] on a NATS cluster of `nodes` servers.
    pub async fn on_nats_cluster(nodes: usize) -> Result<World> {
        World::on(Stack::start_on("edge", 2, nodes).await?).await
    }

    async fn on(stack: Stack) -> Result<World> {
        let nodes: Vec<(String, Ipv4Addr)> =
            (1..=2).map(|i| (format!("node-{i}"), random_loopback_ip())).collect();
        let mut node_health = Vec::with_capacity(nodes.len());
        for (name, ip) in &nodes {
            stack.kube.create_ready_node(name, *ip).await?;
            node_health.push(hafleet_tests::cluster::node_health(*ip, name).await?);
        }
        let mut backends = service_on_two_nodes(&stack, "web", &nodes).await?;
        backends.extend(service_on_two_nodes(&stack, "api", &nodes).await?);
        let ingresses = Api::namespaced(stack.kube.client().await?, "default");
        Ok(World { stack, ingresses, backends, node_health })
    }

    /// Creates an Ingress on fleet `edge`.
    pub async fn route(&self, name: &str, host: &str, path: &str, service: &str) -> Result<()> {
        self.route_on("edge", name, host, path, service).await
    }

    /// Creates an Ingress on `fleet`.
    pub async fn route_on(
        &self,
        fleet: &str,
        name: &str,
        host: &str,
        path: &str,
        service: &str,
    ) -> Result<()> {
        self.ingresses
            .create(&PostParams::default(), &ingress(name, Some(fleet), host, path, service))
            .await?;
        Ok(())
    }

    /// Waits until `host` of the stack has a report for `version` and returns it.
    pub async fn report(&self, host: &str, version: u64) -> Result<hafleet_proto::ApplyReport> {
        let stack = &self.stack;
        eventually(CONVERGE, &format!("report of {host} for version {version}"), || async move {
            match stack.last_report(host).await? {
                Some(r) if r.version >= version => Ok(r),
                other => anyhow::bail!("last report: {other:?}"),
            }
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))
    }
}

/// Restarts the renderer with the built-in template changed by `edit`, and returns the
/// version it makes at start-up (its config contains `marker`).
pub async fn render_with(
    world: &mut World,
    name: &str,
    edit: impl Fn(&str) -> String,
    marker: &str,
) -> Result<u64> {
    let template = edit(hafleet_renderer::core::render::BUILTIN_TEMPLATE);
    assert!(template.contains(marker));
    let path = world.stack.dir().join(name);
    std::fs::write(&path, template)?;
    world.stack.restart_with(
        Component::Renderer,
        &[("HAFLEET_TEMPLATE", path.to_str().expect("utf-8 temp path"))],
    )?;
    let stack = &world.stack;
    eventually(CONVERGE, &format!("a version rendered with {name}"), || async move {
        match stack.latest_version().await? {
            Some(v) if v.bundle().is_some_and(|b| b.config.contains(marker)) => Ok(v.version),
            other => anyhow::bail!("newest: {:?}", other.map(|v| v.version)),
        }
    })
    .await
}
