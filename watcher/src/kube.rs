//! Kubernetes adapter: reflectors (watch-driven caches, never polling) for Ingresses, Services
//! and Nodes, a stream that ticks whenever any of them changes, and Warning Events.

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::networking::v1::Ingress;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use std::pin::Pin;
use tracing::warn;

/// Read-only views of the cluster, kept current by watches.
#[derive(Clone)]
pub struct Caches {
    pub ingresses: Store<Ingress>,
    pub services: Store<Service>,
    pub nodes: Store<Node>,
}

/// Ticks once per change seen on any watch. Drive it to keep the caches current.
pub type Changes = Pin<Box<dyn Stream<Item = ()> + Send>>;

/// Starts the three watches. Nothing is fetched until the returned stream is polled.
pub fn watch(client: Client) -> (Caches, Changes) {
    let (ingresses, ing_writer) = reflector::store::<Ingress>();
    let (services, svc_writer) = reflector::store::<Service>();
    let (nodes, node_writer) = reflector::store::<Node>();
    let cfg = watcher::Config::default;
    let ing = watcher(Api::<Ingress>::all(client.clone()), cfg())
        .default_backoff()
        .reflect(ing_writer)
        .map(|r| r.map(|_| ()).map_err(|e| ("ingresses", e)));
    let svc = watcher(Api::<Service>::all(client.clone()), cfg())
        .default_backoff()
        .reflect(svc_writer)
        .map(|r| r.map(|_| ()).map_err(|e| ("services", e)));
    let node = watcher(Api::<Node>::all(client), cfg())
        .default_backoff()
        .reflect(node_writer)
        .map(|r| r.map(|_| ()).map_err(|e| ("nodes", e)));
    let changes = futures::stream::select_all([ing.boxed(), svc.boxed(), node.boxed()]).map(|r| {
        if let Err((what, e)) = r {
            // The watcher backs off and resumes by itself; the caches keep their last state.
            warn!(watch = what, error = %e, "watch error");
        }
    });
    (Caches { ingresses, services, nodes }, Box::pin(changes))
}

impl Caches {
    /// Waits until every cache has its initial list.
    pub async fn ready(&self) -> anyhow::Result<()> {
        self.ingresses.wait_until_ready().await?;
        self.services.wait_until_ready().await?;
        self.nodes.wait_until_ready().await?;
        Ok(())
    }
}

/// Posts Warning Events on Ingresses hafleet refuses or routes with caveats.
#[derive(Clone)]
pub struct Warnings {
    recorder: Recorder,
}

impl Warnings {
    pub fn new(client: Client) -> Self {
        let reporter = Reporter { controller: "hafleet-watcher".into(), instance: None };
        Warnings { recorder: Recorder::new(client, reporter) }
    }

    pub async fn warn(&self, ingress: &Ingress, reason: &str, note: String) {
        let mut note = note;
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let event = Event {
            type_: EventType::Warning,
            reason: reason.to_owned(),
            note: Some(note),
            action: "Route".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &ingress.object_ref(&())).await {
            warn!(error = %e, "cannot post event");
        }
    }
}
