//! A cluster's moving parts as the demo and the benches need them at scale: Ready nodes that
//! answer for their health as kube-proxy would, and NodePort Services with a backend process on
//! each node the renderer routes them to, not on every node (10,000 Services on 200 nodes would
//! be 2 million listeners).

use crate::stack::Stack;
use crate::{HttpBackend, random_loopback_ip};
use anyhow::Result;
use hafleet_proto::{Backend, Namespace, NodeAddr, ObjectName, ServiceRef, TrafficPolicy};
use hafleet_renderer::core::model::{DEFAULT_SERVERS_PER_BACKEND, NodePool, subset};
use std::net::IpAddr;

/// Where nodes answer for their health: kube-proxy's `/healthz` port, which the renderer checks
/// by default (`--node-health-port`).
pub const NODE_HEALTH_PORT: u16 = hafleet_renderer::core::model::DEFAULT_NODE_HEALTH_PORT;

/// Creates `count` Ready nodes `node-1`… on random loopback addresses, each answering 200 at
/// [`NODE_HEALTH_PORT`] as kube-proxy would (the returned processes; keep them).
pub async fn ready_nodes(stack: &Stack, count: usize) -> Result<(Vec<NodeAddr>, Vec<HttpBackend>)> {
    let mut nodes = Vec::with_capacity(count);
    let mut processes = Vec::with_capacity(count);
    for i in 1..=count {
        let ip = random_loopback_ip();
        let name = format!("node-{i}");
        stack.kube.create_ready_node(&name, ip).await?;
        processes.push(node_health(ip, &name).await?);
        nodes.push(NodeAddr { name: ObjectName::new(name)?, addr: ip.into() });
    }
    Ok((nodes, processes))
}

/// What kube-proxy answers on node `name` at `ip`: its health, at [`NODE_HEALTH_PORT`], with
/// body `healthy@<name>` (keep the process; dropping it fails the node's health check).
pub async fn node_health(ip: std::net::Ipv4Addr, name: &str) -> Result<HttpBackend> {
    HttpBackend::start(ip, NODE_HEALTH_PORT, &format!("healthy@{name}")).await
}

/// Creates NodePort Service `name` in `default` and starts its backend process (answering
/// `<name>@<node>`) at the NodePort on each node the renderer lists for it: its subset of
/// `nodes`, chosen by the renderer's own code with the default servers per backend (every
/// node, when there are no more than that).
pub async fn service_with_backends(
    stack: &Stack,
    name: &str,
    nodes: &[NodeAddr],
) -> Result<Vec<HttpBackend>> {
    let port = u16::try_from(stack.kube.create_nodeport_service("default", name, 80).await?)?;
    let backend = Backend {
        service: ServiceRef {
            namespace: Namespace::new("default")?,
            name: ObjectName::new(name)?,
            port: 80,
            cluster: None,
        },
        node_port: Some(port),
        servers: vec![],
        traffic_policy: TrafficPolicy::Cluster,
        endpoint_nodes: None,
        options: Default::default(),
        pods: None,
    };
    let pool = NodePool::new(nodes);
    let mut started = Vec::new();
    for c in subset(&backend, &pool, DEFAULT_SERVERS_PER_BACKEND) {
        let IpAddr::V4(ip) = c.addr else { anyhow::bail!("node {} is not IPv4", c.node) };
        started.push(HttpBackend::start(ip, port, &format!("{name}@{}", c.node)).await?);
    }
    Ok(started)
}

/// Creates NodePort Services `names` in `default`, 16 requests at a time (no backend
/// processes: see [`service_with_backends`] for that).
pub async fn create_services(stack: &Stack, names: impl Iterator<Item = String>) -> Result<()> {
    use futures::StreamExt as _;
    let created = futures::stream::iter(names)
        .map(|name| async move {
            stack.kube.create_nodeport_service("default", &name, 80).await.map(drop)
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    created.into_iter().collect()
}

/// Creates Ingresses on `fleet` in `default`, each (name, host, service) routing `host/` to the
/// Service's port 80, 16 requests at a time.
pub async fn create_ingresses(
    stack: &Stack,
    fleet: &str,
    ingresses: impl Iterator<Item = (String, String, String)>,
) -> Result<()> {
    use futures::StreamExt as _;
    let api: kube::Api<k8s_openapi::api::networking::v1::Ingress> =
        kube::Api::namespaced(stack.kube.client().await?, "default");
    let api = &api;
    let created = futures::stream::iter(ingresses)
        .map(|(name, host, service)| async move {
            let ingress = crate::fixtures::IngressBuilder::new(&name).fleet(fleet);
            let ingress = ingress.route(&host, "/", &service).build();
            api.create(&kube::api::PostParams::default(), &ingress).await?;
            anyhow::Ok(())
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    created.into_iter().collect()
}
