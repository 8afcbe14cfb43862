//! The fleet the renderer benchmarks render: `n` Ingresses, each on its own host with a
//! `Prefix` and an `Exact` rule (2 paths), each backend on `nodes` nodes.

use hafleet_proto::{
    Backend, HttpHost, HttpPath, IngressKey, Namespace, ObjectName, PathKind, Route, Server,
    ServiceRef,
};
use hafleet_renderer::state::IngressEntry;
use std::collections::BTreeMap;

/// The routes of Ingress `i`, its backend on `nodes` nodes.
pub fn routes(i: usize, nodes: usize) -> Vec<Route> {
    let backend = Backend {
        service: ServiceRef {
            namespace: Namespace::new("team").unwrap(),
            name: ObjectName::new(format!("svc-{i}")).unwrap(),
            port: 80,
        },
        servers: (1..=nodes)
            .map(|n| Server {
                node: ObjectName::new(format!("node-{n}")).unwrap(),
                addr: std::net::Ipv4Addr::from(0x0a00_0000 + n as u32).into(),
                port: 30000 + (i % 2000) as u16,
            })
            .collect(),
        traffic_policy: hafleet_proto::TrafficPolicy::Cluster,
    };
    let host = HttpHost::new(format!("app-{i}.example.com")).unwrap();
    vec![
        Route {
            host: Some(host.clone()),
            path: HttpPath::new("/api").unwrap(),
            kind: PathKind::Prefix,
            backend: backend.clone(),
        },
        Route {
            host: Some(host),
            path: HttpPath::new("/healthz").unwrap(),
            kind: PathKind::Exact,
            backend,
        },
    ]
}

pub fn key(i: usize) -> IngressKey {
    IngressKey::new("team", &format!("ing-{i}")).unwrap()
}

/// `n` Ingresses on `nodes` nodes.
pub fn fleet(n: usize, nodes: usize) -> BTreeMap<IngressKey, IngressEntry> {
    (0..n)
        .map(|i| {
            let entry = IngressEntry {
                created_unix: i as i64,
                resource_version: "1".into(),
                routes: routes(i, nodes),
                seq: 0,
            };
            (key(i), entry)
        })
        .collect()
}
