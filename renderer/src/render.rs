//! Renders a [`RenderModel`] into a bundle: the map files ([`crate::maps`]) and the config text
//! from a minijinja template that names them. The built-in template is compiled in; operators
//! can replace it. Undefined variables are errors, so a typo in a template fails loudly at
//! start-up instead of rendering an empty directive.

use crate::maps::{self, MapPaths};
use crate::model::{BackendModel, RenderModel};
use hafleet_proto::Bundle;
use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;

/// The template shipped with hafleet.
pub const BUILTIN_TEMPLATE: &str = include_str!("../templates/haproxy.cfg.j2");

const NAME: &str = "haproxy.cfg";

/// A loaded, checked template.
#[derive(Debug)]
pub struct Renderer {
    env: Environment<'static>,
    options: crate::model::Options,
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("template does not compile")]
    Compile(#[source] minijinja::Error),
    #[error("template failed to render")]
    Render(#[source] minijinja::Error),
}

/// What a template sees. Rules are not in it: they are in the maps, whatever their number.
#[derive(Debug, Serialize)]
struct Context<'a> {
    fleet: &'a str,
    /// Paths of the map files, relative to the config's folder (the config sets
    /// `default-path config`).
    maps: &'a MapPaths,
    /// How many host + path rules the maps hold.
    routes: usize,
    backends: &'a [BackendModel],
    /// Nodes to health-check once each (empty when node health checks are off).
    nodes: &'a [crate::model::ServerModel],
    node_check_path: Option<&'a str>,
    notes: &'a [String],
}

impl Renderer {
    /// The template in `path`, or the built-in one.
    pub fn load(path: Option<&std::path::Path>) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let Some(path) = path else { return Ok(Renderer::builtin()) };
        let source = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read template {}", path.display()))?;
        Renderer::new(source).with_context(|| format!("template {}", path.display()))
    }

    pub fn builtin() -> Self {
        Self::new(BUILTIN_TEMPLATE.to_owned()).expect("the built-in template compiles")
    }

    /// Compiles `source`, and renders it once against an empty fleet so that a template that
    /// cannot render is refused before it is ever used.
    pub fn new(source: String) -> Result<Self, RenderError> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_keep_trailing_newline(true);
        env.add_template_owned(NAME, source).map_err(RenderError::Compile)?;
        let renderer = Renderer { env, options: Default::default() };
        renderer.render(&RenderModel {
            fleet: "check".into(),
            rules: vec![],
            backends: vec![],
            nodes: vec![],
            node_check_path: None,
            notes: vec![],
        })?;
        Ok(renderer)
    }

    /// The same template, building models with `options`.
    pub fn with_options(mut self, options: crate::model::Options) -> Self {
        self.options = options;
        self
    }

    /// What the models this renderer renders are built with.
    pub fn options(&self) -> &crate::model::Options {
        &self.options
    }

    pub fn render(&self, model: &RenderModel) -> Result<Bundle, RenderError> {
        let maps = maps::build(&model.rules);
        let template = self.env.get_template(NAME).map_err(RenderError::Compile)?;
        let context = Context {
            fleet: &model.fleet,
            maps: &maps.paths,
            routes: model.rules.len(),
            backends: &model.backends,
            nodes: &model.nodes,
            node_check_path: model.node_check_path.as_deref(),
            notes: &model.notes,
        };
        let mut config = template.render(context).map_err(RenderError::Render)?;
        if !config.ends_with('\n') {
            config.push('\n');
        }
        Ok(Bundle { config, maps: maps.files })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::IngressEntry;
    use hafleet_proto::{
        Backend, FleetName, HttpHost, HttpPath, IngressKey, Namespace, NodeAddr, ObjectName,
        PathKind, Route, ServiceRef, TrafficPolicy,
    };
    use std::collections::BTreeMap;

    /// `n` Ready nodes.
    fn nodes(n: usize) -> Vec<NodeAddr> {
        (0..n)
            .map(|k| NodeAddr {
                name: ObjectName::new(format!("node-{k}")).unwrap(),
                addr: std::net::Ipv4Addr::from(0x0a00_0000 + k as u32).into(),
            })
            .collect()
    }

    /// `n` Ingresses, each with its own Service.
    fn fleet(n: usize) -> BTreeMap<IngressKey, IngressEntry> {
        (0..n)
            .map(|i| {
                let backend = Backend {
                    service: ServiceRef {
                        namespace: Namespace::new("team").unwrap(),
                        name: ObjectName::new(format!("svc-{i}")).unwrap(),
                        port: 80,
                    },
                    node_port: Some(30000 + (i % 2000) as u16),
                    servers: vec![],
                    traffic_policy: TrafficPolicy::Cluster,
                };
                let route = Route {
                    host: Some(HttpHost::new(format!("app-{i}.example.com")).unwrap()),
                    path: HttpPath::new("/").unwrap(),
                    kind: PathKind::Prefix,
                    backend,
                };
                let entry = IngressEntry {
                    created_unix: i as i64,
                    resource_version: "1".into(),
                    routes: vec![route],
                    seq: 1,
                };
                (IngressKey::new("team", &format!("ing-{i}")).unwrap(), entry)
            })
            .collect()
    }

    #[test]
    fn from_20_to_200_nodes_the_config_of_2000_ingresses_grows_by_less_than_10_percent() {
        let r = Renderer::builtin();
        let name = FleetName::new("edge").unwrap();
        let ingresses = fleet(2000);
        let size = |n| r.render(&crate::model::build(&name, &ingresses, &nodes(n))).unwrap().size();
        let (small, large) = (size(20), size(200));
        let growth = large as f64 / small as f64 - 1.0;
        assert!(growth < 0.10, "{small} -> {large} bytes: {:.1}% more", growth * 100.0);
        // Without subsets it would grow about tenfold: the bound is what keeps it flat.
        let all = Renderer::builtin()
            .with_options(crate::model::Options { servers_per_backend: 0, node_health: None })
            .render(&crate::model::build_with(
                &name,
                &ingresses,
                &nodes(200),
                &crate::model::Options { servers_per_backend: 0, node_health: None },
            ))
            .unwrap()
            .size();
        assert!(all > 5 * large, "all nodes: {all} bytes; subsets: {large}");
    }
}
