//! Builders for the Kubernetes objects the tests, the demo and the benches create: one per
//! kind, so that a test says what is particular about its object and nothing else.
//!
//! ```ignore
//! let ing = IngressBuilder::new("shop")
//!     .fleet("edge")
//!     .annotate("balance", "leastconn")          // hafleet.io/balance
//!     .route("shop.example.com", "/", "web")     // Prefix, port 80
//!     .exact(Some("shop.example.com"), "/healthz", "api")
//!     .tls(&["shop.example.com"], "shop-tls")
//!     .build();
//! ```

use k8s_openapi::api::networking::v1::Ingress;
use serde_json::{Map, Value, json};

/// An Ingress under construction: `networking.k8s.io/v1`, in the namespace of the `Api` it is
/// created through.
#[derive(Debug, Clone)]
pub struct IngressBuilder {
    name: String,
    annotations: Map<String, Value>,
    /// Rules in the order their hosts first appear; `None`: a rule without a host.
    rules: Vec<(Option<String>, Vec<Value>)>,
    tls: Vec<Value>,
    default_backend: Option<Value>,
    class: Option<String>,
}

impl IngressBuilder {
    pub fn new(name: &str) -> IngressBuilder {
        IngressBuilder {
            name: name.to_owned(),
            annotations: Map::new(),
            rules: Vec::new(),
            tls: Vec::new(),
            default_backend: None,
            class: None,
        }
    }

    /// `hafleet.io/fleet: <fleet>`.
    pub fn fleet(self, fleet: &str) -> Self {
        self.annotate("fleet", fleet)
    }

    /// An annotation: `key` as it is if it has a `/`, else `hafleet.io/<key>`.
    pub fn annotate(mut self, key: &str, value: &str) -> Self {
        let key = match key.contains('/') {
            true => key.to_owned(),
            false => format!("hafleet.io/{key}"),
        };
        self.annotations.insert(key, value.into());
        self
    }

    /// Each of `annotations`, as [`IngressBuilder::annotate`] takes them.
    pub fn annotations(self, annotations: &[(&str, &str)]) -> Self {
        annotations.iter().fold(self, |b, (k, v)| b.annotate(k, v))
    }

    /// `spec.ingressClassName`.
    pub fn class(mut self, class: &str) -> Self {
        self.class = Some(class.to_owned());
        self
    }

    /// A path of `kind` (`Prefix`, `Exact` or `ImplementationSpecific`) for `host` (`None`:
    /// any host) to port 80 of Service `service`.
    pub fn path(mut self, host: Option<&str>, path: &str, kind: &str, service: &str) -> Self {
        let entry = json!({"path": path, "pathType": kind, "backend": backend(service, 80)});
        match self.rules.iter_mut().find(|(h, _)| h.as_deref() == host) {
            Some((_, paths)) => paths.push(entry),
            None => self.rules.push((host.map(str::to_owned), vec![entry])),
        }
        self
    }

    /// A `Prefix` path for `host` to port 80 of `service`.
    pub fn route(self, host: &str, path: &str, service: &str) -> Self {
        self.path(Some(host), path, "Prefix", service)
    }

    /// An `Exact` path.
    pub fn exact(self, host: Option<&str>, path: &str, service: &str) -> Self {
        self.path(host, path, "Exact", service)
    }

    /// `spec.defaultBackend`: port 80 of `service`.
    pub fn default_backend(mut self, service: &str) -> Self {
        self.default_backend = Some(backend(service, 80));
        self
    }

    /// A `spec.tls` entry: `hosts` served with the certificate in Secret `secret`.
    pub fn tls(mut self, hosts: &[&str], secret: &str) -> Self {
        self.tls.push(json!({"hosts": hosts, "secretName": secret}));
        self
    }

    pub fn build(self) -> Ingress {
        let rules: Vec<Value> = self
            .rules
            .into_iter()
            .map(|(host, paths)| {
                let mut rule = json!({"http": {"paths": paths}});
                if let Some(host) = host {
                    rule["host"] = host.into();
                }
                rule
            })
            .collect();
        let mut spec = json!({"rules": rules});
        if !self.tls.is_empty() {
            spec["tls"] = self.tls.into();
        }
        if let Some(backend) = self.default_backend {
            spec["defaultBackend"] = backend;
        }
        if let Some(class) = self.class {
            spec["ingressClassName"] = class.into();
        }
        serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": {"name": self.name, "annotations": self.annotations},
            "spec": spec
        }))
        .expect("the builder makes valid Ingresses")
    }
}

fn backend(service: &str, port: u16) -> Value {
    json!({"service": {"name": service, "port": {"number": port}}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_groups_paths_by_host_and_spells_annotations_in_full() {
        let ing = IngressBuilder::new("shop")
            .fleet("edge")
            .annotate("balance", "leastconn")
            .annotate("kubernetes.io/ingress.class", "x")
            .route("a.example.com", "/", "web")
            .exact(None, "/static", "api")
            .route("a.example.com", "/api", "api")
            .tls(&["a.example.com"], "a-tls")
            .default_backend("web")
            .build();
        let a = ing.metadata.annotations.unwrap();
        assert_eq!(a["hafleet.io/fleet"], "edge");
        assert_eq!(a["hafleet.io/balance"], "leastconn");
        assert_eq!(a["kubernetes.io/ingress.class"], "x");
        let spec = ing.spec.unwrap();
        let rules = spec.rules.unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].host.as_deref(), Some("a.example.com"));
        assert_eq!(rules[0].http.as_ref().unwrap().paths.len(), 2);
        assert_eq!(rules[1].host, None);
        assert_eq!(rules[1].http.as_ref().unwrap().paths[0].path_type, "Exact");
        assert_eq!(spec.tls.unwrap()[0].secret_name.as_deref(), Some("a-tls"));
        assert!(spec.default_backend.is_some());
    }
}
