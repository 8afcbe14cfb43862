//! Renders a [`RenderModel`] into a bundle: the map files ([`crate::core::maps`]) and the config text
//! from a minijinja template that names them. The built-in template is compiled in; operators
//! can replace it. Undefined variables are errors, so a typo in a template fails loudly at
//! start-up instead of rendering an empty directive.
//!
//! A template that defines a `backend(b)` macro gets `backend_sections`: every backend rendered
//! through it, in name order. Each section is kept per fleet between renders and rendered again
//! only when its backend changed, so one change to a fleet of 10,000 backends renders one
//! section, not 10,000. `backends` is handed to the template only if it names it.

use crate::core::maps::{self, MapPaths};
use crate::core::model::{BackendModel, RenderModel, RuleModel};
use hafleet_proto::Bundle;
use minijinja::value::{Enumerator, Object, ObjectRepr};
use minijinja::{Environment, UndefinedBehavior, Value};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The template shipped with hafleet.
pub const BUILTIN_TEMPLATE: &str = include_str!("../../templates/haproxy.cfg.j2");

const NAME: &str = "haproxy.cfg";

/// The macro that renders one backend's section.
const BACKEND_MACRO: &str = "backend";

/// Each backend's section as last rendered, by the backend's content.
type Sections = HashMap<SectionKey, String, foldhash::fast::RandomState>;

/// A backend as the key of its section: hashed by name alone (cheap, and one backend per name),
/// equal only when the whole backend is (at once when it is the same shared model, as the
/// model's memo hands out for a backend that did not change).
#[derive(Debug)]
struct SectionKey(Arc<BackendModel>);

impl std::hash::Hash for SectionKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.name.hash(state);
    }
}

impl PartialEq for SectionKey {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Eq for SectionKey {}

/// What one fleet's last model build and render lend the next.
#[derive(Debug, Default)]
struct Kept {
    memo: crate::core::model::Memo,
    sections: Sections,
    cert_ids: crate::core::certs::IdMemo,
}

/// A loaded, checked template.
#[derive(Debug)]
pub struct Renderer {
    env: Environment<'static>,
    options: crate::core::model::Options,
    /// Whether the template names `backends` (otherwise it is not built for it).
    uses_backends: bool,
    /// Whether the template defines the `backend(b)` macro.
    has_backend_macro: bool,
    /// Per fleet.
    kept: Mutex<HashMap<String, Kept>>,
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
    /// Routes that ask more of a request, or share it by weight ([`crate::core::groups`]).
    dispatch: Option<&'a crate::core::groups::DispatchModel>,
    /// What a split's draw is taken from ([`crate::core::groups::DRAW_SCALE`]).
    draw_scale: u64,
    backends: &'a [Arc<BackendModel>],
    /// Every backend's section, rendered by the template's `backend(b)` macro ("" without it).
    backend_sections: &'a str,
    /// Nodes to health-check once each (empty when node health checks are off).
    nodes: &'a [crate::core::model::ServerModel],
    node_check_path: Option<&'a str>,
    notes: &'a [String],
    /// Spare backends' sections, by the `backend` macro ("" without it or without spares).
    spare_sections: &'a str,
    /// The fleet's settings ([`crate::core::settings::SettingsModel`]).
    settings: &'a crate::core::settings::SettingsModel,
    /// TCP ports and their backends ([`crate::core::model::TcpModel`]).
    tcp: &'a [crate::core::model::TcpModel],
    /// Passthrough routes' splits ([`crate::core::model::SniSplit`]).
    sni_splits: &'a [crate::core::model::SniSplit],
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

    /// The renderer `settings` describe: their template, compiled, with their options.
    pub fn from_settings(settings: &hafleet_proto::RenderSettings) -> anyhow::Result<Self> {
        let node_health = settings
            .node_health
            .as_ref()
            .map(|(port, path)| crate::core::model::NodeHealth { port: *port, path: path.clone() });
        Ok(Renderer::new(settings.template.clone())?.with_options(crate::core::model::Options {
            servers_per_backend: settings.servers_per_backend,
            spare_backends: settings.spare_backends,
            node_health,
        }))
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
        let template = env.get_template(NAME).map_err(RenderError::Compile)?;
        let uses_backends = template.undeclared_variables(false).contains("backends");
        let empty = RenderModel {
            dispatch: None,
            fleet: "check".into(),
            rules: vec![],
            backends: vec![],
            nodes: vec![],
            node_check_path: None,
            tls: Default::default(),
            notes: vec![],
            spares: vec![],
            held_hosts: vec![],
            deep_wildcards: vec![],
            settings: Default::default(),
            tcp: vec![],
            sni_splits: vec![],
        };
        let maps = maps::build::<RuleModel>(&[]);
        let captured = template
            .render_captured(context(&empty, &maps.paths, &[], ("", "")))
            .map_err(RenderError::Render)?;
        let has_backend_macro = captured.state().lookup(BACKEND_MACRO).is_some();
        drop(captured);
        let renderer = Renderer {
            env,
            options: Default::default(),
            uses_backends,
            has_backend_macro,
            kept: Mutex::new(HashMap::new()),
        };
        // Once with a backend, so that a macro that cannot render is refused now.
        renderer.render(&RenderModel {
            backends: vec![Arc::new(BackendModel {
                name: "be_check_check_80".into(),
                service: "check/check:80".into(),
                servers: vec![crate::core::model::ServerModel {
                    name: "node".into(),
                    addr: "127.0.0.1:30080".into(),
                    track: None,
                    draining: true,
                }],
                // Every setting on, so that a macro that breaks on one is refused now too.
                balance: Some("leastconn"),
                timeout_connect: Some("5s".into()),
                timeout_server: Some("1m".into()),
                timeout_client_ms: Some(90_000),
                tcp: false,
                check_path: Some("/healthz".into()),
                check_interval: Some("2s".into()),
                cookie: Some("SRV".into()),
                allow_source: vec!["10.0.0.0/8".into()],
                ssl_redirect: true,
                max_conn: Some(100),
                filters: crate::core::filters::FiltersModel::of(
                    &crate::core::filters::every_filter(),
                )
                .map(Box::new),
                send_proxy: Some("send-proxy-v2"),
                fail_status: None,
            })],
            settings: crate::core::settings::SettingsModel::every_one_set(),
            ..empty
        })?;
        renderer.kept.lock().expect("not poisoned").clear();
        Ok(renderer)
    }

    /// The same template, building models with `options`.
    pub fn with_options(mut self, options: crate::core::model::Options) -> Self {
        self.options = options;
        self
    }

    /// What the models this renderer renders are built with.
    pub fn options(&self) -> &crate::core::model::Options {
        &self.options
    }

    /// The model of `fleet`, built with this renderer's options and with what its last build
    /// of the same fleet can lend ([`crate::core::model::Memo`]).
    pub fn model(
        &self,
        fleet: &hafleet_proto::FleetName,
        ingresses: &crate::core::state::Ingresses,
        nodes: &crate::core::state::Nodes,
        fleetwide: Fleetwide<'_>,
    ) -> RenderModel {
        // Quarantined Ingresses are not in the config (nor in conflicts or certificates),
        // but named in its notes, and their hosts kept theirs. Rare: one walk finds none, and
        // the common case borrows the Ingresses as they are.
        let mut quarantined: Vec<String> = Vec::new();
        let mut held_hosts: std::collections::BTreeSet<String> = Default::default();
        let without: crate::core::state::Ingresses;
        let ingresses = match ingresses.values().any(|e| e.quarantined.is_some()) {
            false => ingresses,
            true => {
                let (out, kept): (Vec<_>, Vec<_>) =
                    ingresses.iter().partition(|(_, e)| e.quarantined.is_some());
                for (k, e) in out {
                    quarantined.push(format!(
                        "{k}: quarantined, HAProxy refused what it made (history why)"
                    ));
                    let hosts = e.routes.iter().filter_map(|r| r.host.as_ref());
                    held_hosts.extend(hosts.map(|h| h.as_str().to_owned()));
                }
                without = kept.into_iter().map(|(k, e)| (k.clone(), e.clone())).collect();
                &without
            }
        };
        let mut all = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let kept = all.entry(fleet.to_string()).or_default();
        let mut model =
            crate::core::model::build_memo(fleet, ingresses, nodes, &self.options, &mut kept.memo);
        let default_cert = fleetwide.default_cert;
        model.tls = crate::core::certs::files_with(ingresses, default_cert, &mut kept.cert_ids);
        if let Some(settings) = fleetwide.settings {
            model.settings = crate::core::settings::SettingsModel::of(settings);
        }
        // The metrics port is bound on every host: a TCP port on it would fail the reload.
        if let Some(port) = model.settings.prometheus_port
            && model.tcp.iter().any(|t| t.port == port)
        {
            model.tcp.retain(|t| t.port != port);
            model.notes.push(format!(
                "TCP port {port} is the fleet's prometheus-port: its TCPRoute is not served"
            ));
        }
        model.notes.splice(0..0, quarantined.into_iter().chain(model.tls.notes.iter().cloned()));
        model.held_hosts = held_hosts.into_iter().collect();
        let mut deep: Vec<String> = ingresses
            .iter()
            .filter(|(k, _)| !k.kind.is_ingress())
            // A passthrough route's wildcard is looked up by the SNI (`maps.sni_deep`).
            .flat_map(|(_, e)| e.routes.iter().filter(|r| !r.is_passthrough()))
            .filter_map(|r| r.host.as_ref())
            .filter(|h| h.as_str().starts_with("*."))
            .map(|h| h.as_str().to_owned())
            .collect();
        deep.sort_unstable();
        deep.dedup();
        model.deep_wildcards = deep;
        model
    }

    pub fn render(&self, model: &RenderModel) -> Result<Bundle, RenderError> {
        let mut maps = maps::build_holding(&model.rules, &model.held_hosts);
        if model.settings.log.is_some() {
            maps.add_routes(&model.rules);
        }
        maps.add_tls(&model.tls);
        maps.add_deep_wildcards(&model.deep_wildcards);
        maps.add_client_timeouts(&model.backends);
        if let Some(d) = &model.dispatch {
            maps.add_files(&d.files);
        }
        let template = self.env.get_template(NAME).map_err(RenderError::Compile)?;
        let (sections, spares) = if self.has_backend_macro {
            (
                self.backend_sections(&template, model, &maps.paths)?,
                spare_sections(&template, model, &maps.paths)?,
            )
        } else {
            (String::new(), String::new())
        };
        let backends = if self.uses_backends { model.backends.as_slice() } else { &[] };
        // Written into a buffer sized for the sections and the rest, not grown (and copied)
        // by doubling: at 10,000 backends the sections are megabytes.
        let mut out = Vec::with_capacity(sections.len() + 64 * 1024 + model.notes.len() * 128);
        template
            .render_captured_to(
                context(model, &maps.paths, backends, (&sections, &spares)),
                &mut out,
            )
            .map_err(RenderError::Render)?;
        let mut config = String::from_utf8(out).map_err(|e| {
            RenderError::Render(minijinja::Error::new(
                minijinja::ErrorKind::BadSerialization,
                e.to_string(),
            ))
        })?;
        if !config.ends_with('\n') {
            config.push('\n');
        }
        let (certs, ids) = (model.tls.certs.clone(), model.tls.ids.clone());
        Ok(Bundle::with_cert_ids(config, maps.files, certs, ids))
    }

    /// Every backend's section through the template's macro, in the model's (name) order: the
    /// fleet's sections of the last render where the backend is the same, the macro's output
    /// where it is new or changed. Sections of backends that are gone are dropped.
    fn backend_sections(
        &self,
        template: &minijinja::Template<'_, '_>,
        model: &RenderModel,
        paths: &MapPaths,
    ) -> Result<String, RenderError> {
        let mut all = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let fleet = all.entry(model.fleet.clone()).or_default();
        let mut old = std::mem::take(&mut fleet.sections);
        // A kept section moves over with its key: no backend is cloned for it. New and changed
        // backends go through the macro, which sees the fleet-wide values, not the backends.
        let texts = crate::core::par::reuse_or_build(
            &model.backends,
            |b| old.remove_entry(&SectionKey(Arc::clone(b))),
            |part| {
                let captured = template
                    .render_captured(context(model, paths, &[], ("", "")))
                    .map_err(RenderError::Render)?;
                part.iter()
                    .map(|b| {
                        let text = captured
                            .state()
                            .call_macro(BACKEND_MACRO, &[Value::from_dyn_object(Arc::clone(b))])
                            .map_err(RenderError::Render)?;
                        Ok((SectionKey(Arc::clone(b)), text))
                    })
                    .collect()
            },
        )?;
        drop(old);
        let mut kept = Sections::with_capacity_and_hasher(model.backends.len(), Default::default());
        let mut out = String::new();
        out.reserve(texts.iter().map(|(_, t)| t.len()).sum());
        for (key, text) in texts {
            out.push_str(&text);
            kept.insert(key, text);
        }
        fleet.sections = kept;
        Ok(out)
    }
}

/// The model's spare backends through the template's `backend` macro (a handful: rendered
/// anew each time).
fn spare_sections(
    template: &minijinja::Template<'_, '_>,
    model: &RenderModel,
    paths: &MapPaths,
) -> Result<String, RenderError> {
    if model.spares.is_empty() {
        return Ok(String::new());
    }
    let captured = template
        .render_captured(context(model, paths, &[], ("", "")))
        .map_err(RenderError::Render)?;
    let mut out = String::new();
    for b in &model.spares {
        let text = captured
            .state()
            .call_macro(BACKEND_MACRO, &[Value::from_dyn_object(Arc::clone(b))])
            .map_err(RenderError::Render)?;
        out.push_str(&text);
    }
    Ok(out)
}

/// A backend as the `backend(b)` macro sees it: the fields of [`BackendModel`], read where they
/// are instead of copied into a map of values first (10,000 backends of 10 servers each are
/// 400,000 values on a full render).
impl Object for BackendModel {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "name" => Some(Value::from(self.name.as_str())),
            "service" => Some(Value::from(self.service.as_str())),
            "servers" => Some(Value::from_object(ServersOf(Arc::clone(self)))),
            "balance" => Some(Value::from(self.balance)),
            "timeout_connect" => Some(Value::from(self.timeout_connect.as_deref())),
            "timeout_server" => Some(Value::from(self.timeout_server.as_deref())),
            "timeout_client_ms" => Some(Value::from(self.timeout_client_ms)),
            "tcp" => Some(Value::from(self.tcp)),
            "check_path" => Some(Value::from(self.check_path.as_deref())),
            "check_interval" => Some(Value::from(self.check_interval.as_deref())),
            "cookie" => Some(Value::from(self.cookie.as_deref())),
            "allow_source" => Some(Value::from_serialize(&self.allow_source)),
            "ssl_redirect" => Some(Value::from(self.ssl_redirect)),
            "max_conn" => Some(Value::from(self.max_conn)),
            "send_proxy" => Some(Value::from(self.send_proxy)),
            "fail_status" => Some(Value::from(self.fail_status)),
            "filters" => Some(match &self.filters {
                Some(f) => Value::from_serialize(f),
                None => Value::from(()),
            }),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&[
            "name",
            "service",
            "servers",
            "balance",
            "timeout_connect",
            "timeout_server",
            "timeout_client_ms",
            "tcp",
            "check_path",
            "check_interval",
            "cookie",
            "allow_source",
            "ssl_redirect",
            "max_conn",
            "filters",
            "send_proxy",
            "fail_status",
        ])
    }
}

/// A backend's servers, as a sequence.
#[derive(Debug)]
struct ServersOf(Arc<BackendModel>);

impl Object for ServersOf {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let i = key.as_usize()?;
        (i < self.0.servers.len()).then(|| Value::from_object(ServerOf(Arc::clone(&self.0), i)))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.0.servers.len())
    }
}

/// The `i`th server of a backend: the fields of [`crate::core::model::ServerModel`].
#[derive(Debug)]
struct ServerOf(Arc<BackendModel>, usize);

impl Object for ServerOf {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let s = &self.0.servers[self.1];
        match key.as_str()? {
            "name" => Some(Value::from(s.name.as_str())),
            "addr" => Some(Value::from(s.addr.as_str())),
            "track" => Some(s.track.as_deref().map_or(Value::from(()), Value::from)),
            "draining" => Some(Value::from(s.draining)),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&["name", "addr", "track", "draining"])
    }
}

/// What the template renders with.
/// What a fleet's model takes besides its Ingresses and nodes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fleetwide<'a> {
    /// What HTTPS answers for a name no Ingress has a certificate for.
    pub default_cert: Option<&'a hafleet_proto::SealedCert>,
    /// `None`: the defaults.
    pub settings: Option<&'a hafleet_proto::FleetSettings>,
}

impl<'a> Fleetwide<'a> {
    /// `fleet`'s, as `desired` holds them.
    pub fn of(desired: &'a crate::core::state::Desired, fleet: &hafleet_proto::FleetName) -> Self {
        Fleetwide {
            default_cert: desired.default_certs.get(fleet),
            settings: desired.settings.get(fleet),
        }
    }
}

fn context<'a>(
    model: &'a RenderModel,
    maps: &'a MapPaths,
    backends: &'a [Arc<BackendModel>],
    (backend_sections, spare_sections): (&'a str, &'a str),
) -> Context<'a> {
    Context {
        fleet: &model.fleet,
        maps,
        routes: model.rules.len(),
        dispatch: model.dispatch.as_ref(),
        draw_scale: crate::core::groups::DRAW_SCALE,
        backends,
        backend_sections,
        nodes: &model.nodes,
        node_check_path: model.node_check_path.as_deref(),
        notes: &model.notes,
        spare_sections,
        settings: &model.settings,
        tcp: &model.tcp,
        sni_splits: &model.sni_splits,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::state::IngressEntry;
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
                        cluster: None,
                    },
                    node_port: Some(30000 + (i % 2000) as u16),
                    servers: vec![],
                    traffic_policy: TrafficPolicy::Cluster,
                    endpoint_nodes: None,
                    options: Default::default(),
                    pods: None,
                };
                let route = Route {
                    host: Some(HttpHost::new(format!("app-{i}.example.com")).unwrap()),
                    path: HttpPath::new("/").unwrap(),
                    kind: PathKind::Prefix,
                    backend,
                    more: None,
                };
                let entry = IngressEntry {
                    created_unix: i as i64,
                    resource_version: "1".into(),
                    routes: vec![route].into(),
                    seq: 1,
                    tls: Vec::new(),
                    quarantined: None,
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
        let size =
            |n| r.render(&crate::core::model::build(&name, &ingresses, &nodes(n))).unwrap().size();
        let (small, large) = (size(20), size(200));
        let growth = large as f64 / small as f64 - 1.0;
        assert!(growth < 0.10, "{small} -> {large} bytes: {:.1}% more", growth * 100.0);
        // Without subsets it would grow about tenfold: the bound is what keeps it flat.
        let all = Renderer::builtin()
            .with_options(crate::core::model::Options {
                servers_per_backend: 0,
                node_health: None,
                ..Default::default()
            })
            .render(&crate::core::model::build_with(
                &name,
                &ingresses,
                &nodes(200),
                &crate::core::model::Options {
                    servers_per_backend: 0,
                    node_health: None,
                    ..Default::default()
                },
            ))
            .unwrap()
            .size();
        assert!(all > 5 * large, "all nodes: {all} bytes; subsets: {large}");
    }

    #[test]
    fn a_warm_renderer_builds_and_renders_what_a_fresh_one_does_through_every_change() {
        let name = FleetName::new("edge").unwrap();
        let other = FleetName::new("core").unwrap();
        let health = crate::core::model::Options {
            servers_per_backend: 2,
            spare_backends: 0,
            node_health: Some(crate::core::model::NodeHealth {
                port: 10256,
                path: hafleet_proto::HttpPath::new("/healthz").unwrap(),
            }),
        };
        let no_health = crate::core::model::Options { node_health: None, ..Default::default() };
        for options in [no_health, health] {
            let warm = Renderer::builtin().with_options(options.clone());
            let mut ingresses = fleet(50);
            let mut nodes_now = nodes(3);
            let check = |ingresses: &BTreeMap<IngressKey, IngressEntry>, nodes: &[NodeAddr]| {
                for f in [&name, &other] {
                    let fresh = crate::core::model::build_with(f, ingresses, nodes, &options);
                    let model = warm.model(
                        f,
                        ingresses,
                        &[(None, nodes.to_vec())].into(),
                        Default::default(),
                    );
                    assert_eq!(model, fresh, "fleet {f}");
                    let fresh = Renderer::builtin().render(&fresh).unwrap();
                    assert_eq!(warm.render(&model).unwrap(), fresh, "fleet {f}");
                }
            };
            check(&ingresses, &nodes_now);
            // A backend changes its NodePort, one goes, one comes, a node leaves.
            let key = IngressKey::new("team", "ing-3").unwrap();
            Arc::make_mut(&mut ingresses.get_mut(&key).unwrap().routes)[0].backend.node_port =
                Some(32000);
            check(&ingresses, &nodes_now);
            ingresses.remove(&IngressKey::new("team", "ing-7").unwrap());
            ingresses.extend(fleet(60).into_iter().skip(50));
            check(&ingresses, &nodes_now);
            // A younger Ingress claims ing-4's host and path: it loses, until ing-4 goes.
            let mut rival = ingresses[&IngressKey::new("team", "ing-4").unwrap()].clone();
            rival.created_unix = 1_000;
            Arc::make_mut(&mut rival.routes)[0].backend.service.name =
                ObjectName::new("rival").unwrap();
            ingresses.insert(IngressKey::new("team", "rival").unwrap(), rival);
            check(&ingresses, &nodes_now);
            ingresses.remove(&IngressKey::new("team", "ing-4").unwrap());
            check(&ingresses, &nodes_now);
            nodes_now.remove(1);
            check(&ingresses, &nodes_now);
            nodes_now = nodes(5);
            check(&ingresses, &nodes_now);
            check(&BTreeMap::new(), &nodes_now);
        }
    }

    #[test]
    fn a_template_without_the_macro_loops_over_backends_itself() {
        let source =
            "{% for b in backends %}{{ b.name }}\n{% endfor %}{{ backend_sections }}".to_owned();
        let r = Renderer::new(source).unwrap();
        let model =
            crate::core::model::build(&FleetName::new("edge").unwrap(), &fleet(2), &nodes(1));
        assert_eq!(r.render(&model).unwrap().config, "be_team_svc-0_80\nbe_team_svc-1_80\n");
    }

    /// The macro reads backends through [`Object`], not as serialized maps: whatever a
    /// template does with `b` (fields, filters, tests, loops, JSON) must come out the same.
    #[test]
    fn the_backend_macro_sees_what_a_serialized_backend_shows() {
        let body = "{{ b.name }} {{ b.service|upper }} {{ b.servers|length }} \
            {%- for s in b.servers %} {{ loop.index }}:{{ s.name }}={{ s.addr }}\
            {%- if s.track is none %} checked{% else %} track {{ s.track }}{% endif %}\
            {%- if loop.last %}.{% endif %}{% endfor %} \
            {%- if b.servers %} {{ b.servers[0].addr }} {{ b.servers[-1] }}{% endif %} \
            {{ b.servers|map(attribute='name')|join(',') }} \
            {{ b|list }} {{ 'servers' in b }} {{ b.missing is undefined }}\n";
        let source =
            format!("{{% macro backend(b) %}}{body}{{% endmacro %}}{{{{ backend_sections }}}}");
        let mut ingresses = fleet(3);
        Arc::make_mut(&mut ingresses.values_mut().next().unwrap().routes)[0].backend.node_port =
            None;
        let model = crate::core::model::build_with(
            &FleetName::new("edge").unwrap(),
            &ingresses,
            &nodes(3),
            &crate::core::model::Options {
                servers_per_backend: 2,
                spare_backends: 0,
                node_health: Some(crate::core::model::NodeHealth {
                    port: 10256,
                    path: hafleet_proto::HttpPath::new("/healthz").unwrap(),
                }),
            },
        );
        let config = Renderer::new(source).unwrap().render(&model).unwrap().config;
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        let looped = format!("{{% for b in backends %}}{body}{{% endfor %}}");
        env.add_template("t", &looped).unwrap();
        let serialized: Vec<Value> =
            model.backends.iter().map(|b| Value::from_serialize(&**b)).collect();
        let expected = env.get_template("t").unwrap().render(minijinja::context! {
            backends => serialized
        });
        assert_eq!(config, expected.unwrap());
        assert!(config.contains("track hafleet_nodes/"), "{config}");
        assert!(config.contains(" 0 "), "a backend without servers: {config}");
    }

    #[test]
    fn a_backend_macro_that_cannot_render_is_refused_at_load() {
        let source = "{% macro backend(b) %}{{ b.nmae }}{% endmacro %}{{ backend_sections }}";
        let err = Renderer::new(source.to_owned()).unwrap_err();
        assert!(matches!(err, RenderError::Render(_)), "{err:?}");
    }
}
