//! The route events the watcher publishes, and whether one Ingress's fits what one may take.
//! Pure.

use hafleet_proto::{FleetName, IngressKey, RouteChange, RouteEvent, RouteMessage};

/// What one Ingress's route event may take, from the watcher's settings.
#[derive(Debug, Clone, Copy)]
pub struct IngressLimits<'a> {
    /// `--max-paths-per-ingress`.
    pub max_paths: usize,
    /// `--max-ingress-bytes`.
    pub max_bytes: usize,
    /// `--cluster-id`: the cluster the event names its Services in.
    pub cluster: Option<&'a hafleet_proto::ClusterId>,
}

/// Why the Ingress's share of its fleet is more than one Ingress may take: more paths than
/// `--max-paths-per-ingress`, or a route event larger than `--max-ingress-bytes` or than a NATS
/// message may carry. `None` when it fits.
pub fn over_budget(
    r: &crate::core::model::Resolved,
    limits: &IngressLimits<'_>,
    payload_limit: usize,
) -> Option<String> {
    if r.routes.len() > limits.max_paths {
        return Some(format!(
            "it has {} paths, more than --max-paths-per-ingress ({})",
            r.routes.len(),
            limits.max_paths
        ));
    }
    let change = RouteChange::Upsert { routes: r.routes.to_vec(), tls: r.tls.to_vec() };
    let at = (0, limits.cluster);
    let msg = route_event(&r.fleet, &r.key, r.created_unix, &r.resource_version, change, at);
    let size = msg.encode().len();
    let limit = limits.max_bytes.min(payload_limit);
    (size > limit).then(|| {
        format!(
            "its resolved routes take {size} bytes, more than {limit} (--max-ingress-bytes {}, \
             NATS max_payload {payload_limit})",
            limits.max_bytes
        )
    })
}

/// The route event of `key` on `fleet`, its Services named as of `cluster`.
pub fn route_event(
    fleet: &FleetName,
    key: &IngressKey,
    created_unix: i64,
    resource_version: &str,
    mut change: RouteChange,
    (epoch, cluster): (u64, Option<&hafleet_proto::ClusterId>),
) -> RouteMessage {
    // The Ingress and the Services its routes go to are this cluster's.
    let mut schema = hafleet_proto::keys_schema(cluster, std::iter::once(key));
    if let RouteChange::Upsert { routes, .. } = &mut change {
        for route in routes.iter_mut() {
            // Matches and weighted backends are the Gateway API's; passthrough newer still.
            if route.more.is_some() {
                schema = schema.max(hafleet_proto::GATEWAY_SCHEMA_VERSION);
            }
            if route.is_passthrough() || route.tcp_port().is_some() {
                schema = schema.max(hafleet_proto::PASSTHROUGH_SCHEMA_VERSION);
            }
            for backend in route.backends_mut() {
                backend.service.cluster = cluster.cloned();
                // A renderer that cannot read pods parks the event rather than serve it
                // nothing.
                if backend.pods.is_some() {
                    schema = schema.max(hafleet_proto::PODS_SCHEMA_VERSION);
                }
                if backend.options.fail_status.is_some() {
                    schema = schema.max(hafleet_proto::GATEWAY_SCHEMA_VERSION);
                }
                if backend.options.tcp {
                    schema = schema.max(hafleet_proto::PASSTHROUGH_SCHEMA_VERSION);
                }
            }
        }
    }
    RouteMessage::Event(RouteEvent {
        schema,
        fleet: fleet.clone(),
        ingress: key.clone().in_cluster(cluster),
        created_unix,
        resource_version: resource_version.to_owned(),
        change,
        epoch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A route event that names a Service in pods mode is of the schema that carries pods, so
    /// that a renderer that cannot read them parks it; any other keeps its schema.
    #[test]
    fn an_event_with_pods_is_of_the_pods_schema() {
        let r = crate::core::resolve::tests_support::resolved("shop", "web", "edge", 1);
        let event = |routes: Vec<hafleet_proto::Route>| {
            let change = RouteChange::Upsert { routes, tls: vec![] };
            match route_event(&r.fleet, &r.key, 0, "1", change, (1, None)) {
                RouteMessage::Event(e) => e.schema,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(event(r.routes.to_vec()), hafleet_proto::SCHEMA_VERSION);
        let mut pods = r.routes.to_vec();
        pods[0].backend.pods = Some(vec![]);
        assert_eq!(event(pods), hafleet_proto::PODS_SCHEMA_VERSION);
        let mut failing = r.routes.to_vec();
        failing[0].backend.options.fail_status = Some(hafleet_proto::FailStatus::InternalError);
        assert_eq!(event(failing), hafleet_proto::GATEWAY_SCHEMA_VERSION);
    }

    /// An HTTPRoute's event is of the Gateway API schema: a renderer of before HTTPRoutes
    /// parks it rather than take it for the Ingress of the same name.
    #[test]
    fn an_http_route_event_is_of_the_gateway_schema() {
        let r = crate::core::resolve::tests_support::resolved("shop", "web", "edge", 1);
        let key = hafleet_proto::IngressKey::http_route("shop", "web").unwrap();
        let change = RouteChange::Upsert { routes: r.routes.to_vec(), tls: vec![] };
        match route_event(&r.fleet, &key, 0, "1", change, (1, None)) {
            RouteMessage::Event(e) => {
                assert_eq!((e.schema, e.ingress), (hafleet_proto::GATEWAY_SCHEMA_VERSION, key))
            }
            other => panic!("{other:?}"),
        }
    }
}
