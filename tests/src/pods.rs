//! Pods standing in for a Service's endpoints: local HTTP servers on loopback addresses, and
//! the EndpointSlices that name them, written as Kubernetes' EndpointSlice controller would
//! (the test API server runs no controllers, so only what a test writes exists).

use crate::HttpBackend;
use anyhow::{Context, Result};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use std::net::{IpAddr, Ipv4Addr};

/// Starts a pod: an [`HttpBackend`] named `name` at `port` on a random loopback address (a
/// pod's own IP), retrying on another address if that one is taken.
pub async fn start_pod(name: &str, port: u16) -> Result<HttpBackend> {
    let mut last = None;
    for _ in 0..10 {
        match HttpBackend::start(crate::random_loopback_ip(), port, name).await {
            Ok(pod) => return Ok(pod),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("tried")).context("no free loopback address for a pod")
}

/// The pod's IP.
pub fn ip(pod: &HttpBackend) -> Ipv4Addr {
    match pod.addr().ip() {
        IpAddr::V4(ip) => ip,
        IpAddr::V6(_) => unreachable!("pods start on IPv4 loopback addresses"),
    }
}

/// Which pods answer `host` through the HAProxy at `addr`, over `n` requests (a pod's answer
/// starts with its name); an answer other than a 200 is an error.
pub async fn answering(
    addr: std::net::SocketAddr,
    host: &str,
    n: usize,
) -> Result<std::collections::BTreeSet<String>> {
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..n {
        let (status, body) = crate::http_get(addr, host, "/").await?;
        anyhow::ensure!(status == 200, "got {status} {body:?}");
        seen.insert(body.split_whitespace().next().unwrap_or_default().to_owned());
    }
    Ok(seen)
}

/// An endpoint's conditions, as the EndpointSlice controller sets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Ready: serves.
    Ready,
    /// Running, failing its readiness probe: gets nothing.
    NotReady,
    /// Being deleted, still passing its readiness probe: drained.
    Terminating,
}

/// The EndpointSlices of one namespace, at the version the API server serves.
pub struct Slices {
    api: Api<DynamicObject>,
    ar: ApiResource,
}

impl Slices {
    pub async fn of(client: kube::Client, namespace: &str) -> Result<Slices> {
        let (ar, _) = kube::discovery::group(&client, "discovery.k8s.io")
            .await?
            .recommended_kind("EndpointSlice")
            .context("the API server serves no EndpointSlice")?;
        Ok(Slices { api: Api::namespaced_with(client, namespace, &ar), ar })
    }

    /// Writes slice `name` of `service`: port `http` at `port`, and `endpoints`.
    pub async fn put(
        &self,
        name: &str,
        service: &str,
        port: u16,
        endpoints: &[(Ipv4Addr, Condition)],
    ) -> Result<()> {
        let endpoints: Vec<serde_json::Value> = endpoints
            .iter()
            .map(|(ip, c)| {
                let (ready, serving, terminating) = match c {
                    Condition::Ready => (true, true, false),
                    Condition::NotReady => (false, false, false),
                    Condition::Terminating => (false, true, true),
                };
                serde_json::json!({"addresses": [ip.to_string()], "conditions":
                    {"ready": ready, "serving": serving, "terminating": terminating}})
            })
            .collect();
        let mut slice: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": self.ar.api_version, "kind": "EndpointSlice",
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "endpoints": endpoints,
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        }))?;
        match self.api.get_opt(name).await? {
            None => {
                self.api.create(&PostParams::default(), &slice).await?;
            }
            Some(now) => {
                slice.metadata.resource_version = now.metadata.resource_version;
                self.api.replace(name, &PostParams::default(), &slice).await?;
            }
        }
        Ok(())
    }
}

/// Creates Service `name` in `namespace` of type ClusterIP, port 80 named `http` to target
/// port `target`, routed to its pods by its `hafleet.io/endpoints` annotation when `annotated`
/// (else by its fleet's default).
pub async fn create_pods_service(
    client: kube::Client,
    namespace: &str,
    name: &str,
    target: u16,
    annotated: bool,
) -> Result<()> {
    let annotations = match annotated {
        true => serde_json::json!({"hafleet.io/endpoints": "pods"}),
        false => serde_json::json!({}),
    };
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"type": "ClusterIP", "selector": {"app": name},
                 "ports": [{"name": "http", "port": 80, "targetPort": target}]}
    }))?;
    Api::namespaced(client, namespace).create(&PostParams::default(), &svc).await?;
    Ok(())
}
