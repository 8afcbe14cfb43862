//! The fleet the renderer benchmarks render: `n` Ingresses, each on its own host with a
//! `Prefix` and an `Exact` rule (2 paths) and its own NodePort Service, on a cluster of `nodes`
//! nodes.

use hafleet_proto::{
    Backend, HttpHost, HttpPath, IngressKey, Namespace, NodeAddr, ObjectName, PathKind, Route,
    ServiceRef,
};
use hafleet_renderer::core::state::IngressEntry;
use std::collections::BTreeMap;

/// The routes of Ingress `i`.
pub fn routes(i: usize) -> Vec<Route> {
    let backend = Backend {
        service: ServiceRef {
            namespace: Namespace::new("team").unwrap(),
            name: ObjectName::new(format!("svc-{i}")).unwrap(),
            port: 80,
            cluster: None,
        },
        node_port: Some(30000 + (i % 2000) as u16),
        servers: vec![],
        traffic_policy: hafleet_proto::TrafficPolicy::Cluster,
        endpoint_nodes: None,
        options: Default::default(),
        pods: None,
    };
    let host = HttpHost::new(format!("app-{i}.example.com")).unwrap();
    vec![
        Route {
            host: Some(host.clone()),
            path: HttpPath::new("/api").unwrap(),
            kind: PathKind::Prefix,
            backend: backend.clone(),
            more: None,
        },
        Route {
            host: Some(host),
            path: HttpPath::new("/healthz").unwrap(),
            kind: PathKind::Exact,
            backend,
            more: None,
        },
    ]
}

pub fn key(i: usize) -> IngressKey {
    IngressKey::new("team", &format!("ing-{i}")).unwrap()
}

/// A cluster of `n` Ready nodes.
pub fn nodes(n: usize) -> Vec<NodeAddr> {
    (1..=n)
        .map(|n| NodeAddr {
            name: ObjectName::new(format!("node-{n}")).unwrap(),
            addr: std::net::Ipv4Addr::from(0x0a00_0000 + n as u32).into(),
        })
        .collect()
}

/// `n` Ingresses.
pub fn fleet(n: usize) -> BTreeMap<IngressKey, IngressEntry> {
    (0..n)
        .map(|i| {
            let entry = IngressEntry {
                created_unix: i as i64,
                resource_version: "1".into(),
                routes: routes(i).into(),
                seq: 0,
                tls: Vec::new(),
                quarantined: None,
            };
            (key(i), entry)
        })
        .collect()
}
