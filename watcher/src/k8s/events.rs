//! Kubernetes adapter, writing back: Warning (and Normal) Events on the Ingresses and
//! ConfigMaps hafleet reads, and the status of the Ingresses it routes.

use k8s_openapi::api::networking::v1::Ingress;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};
use tracing::{info, warn};

/// Writes back to Ingresses: Warning Events on those hafleet refuses or routes with caveats,
/// and the status of those it routes.
#[derive(Clone)]
pub struct Warnings {
    recorder: Recorder,
    client: Client,
}

impl Warnings {
    pub fn new(client: Client) -> Self {
        let reporter = Reporter { controller: "hafleet-watcher".into(), instance: None };
        Warnings { recorder: Recorder::new(client.clone(), reporter), client }
    }

    /// Sets `status.loadBalancer.ingress`; a failure is logged and retried on the next pass.
    pub async fn set_status(
        &self,
        ingress: &Ingress,
        entries: Vec<k8s_openapi::api::networking::v1::IngressLoadBalancerIngress>,
    ) {
        let (Some(ns), Some(name)) =
            (ingress.metadata.namespace.as_deref(), ingress.metadata.name.as_deref())
        else {
            return;
        };
        let api: Api<Ingress> = Api::namespaced(self.client.clone(), ns);
        let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": entries}}});
        let params = kube::api::PatchParams::default();
        match api.patch_status(name, &params, &kube::api::Patch::Merge(&patch)).await {
            Ok(_) => {
                info!(ingress = %format!("{ns}/{name}"), "status set to the fleet's addresses")
            }
            Err(e) => warn!(ingress = %format!("{ns}/{name}"), error = %e, "cannot set status"),
        }
    }

    /// Posts a Warning Event on the object `reference` names; whether the API server took it.
    pub async fn warn(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        reason: &str,
        note: String,
    ) -> bool {
        self.post_ref(reference, true, reason, note).await
    }

    /// Sets the `status` of a Gateway API object (`namespace`: `None` for a cluster-scoped
    /// GatewayClass); whether it was set (a failure is logged).
    pub async fn set_gateway_status(
        &self,
        kind: &str,
        (namespace, name): (Option<&str>, &str),
        status: serde_json::Value,
    ) -> bool {
        let ar = crate::core::gateway::api_resource(kind);
        let api: Api<kube::api::DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        };
        let patch = serde_json::json!({"status": status});
        let params = kube::api::PatchParams::default();
        let at = format!("{}{name}", namespace.map(|n| format!("{n}/")).unwrap_or_default());
        match api.patch_status(name, &params, &kube::api::Patch::Merge(&patch)).await {
            Ok(_) => {
                tracing::debug!(kind, object = %at, "status set");
                true
            }
            Err(e) => {
                warn!(kind, object = %at, error = %e, "cannot set status");
                false
            }
        }
    }

    /// Posts an Event (Warning or Normal) on `object`; repeats are counted by the recorder.
    /// Whether the API server took it (a failure is logged).
    pub async fn post<K: kube::Resource<DynamicType = ()>>(
        &self,
        object: &K,
        warning: bool,
        reason: &str,
        note: String,
    ) -> bool {
        self.post_ref(&object.object_ref(&()), warning, reason, note).await
    }

    /// [`Warnings::post`] on the object `reference` names.
    pub async fn post_ref(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        warning: bool,
        reason: &str,
        note: String,
    ) -> bool {
        let mut note = note;
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let event = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.to_owned(),
            note: Some(note),
            action: "Route".into(),
            secondary: None,
        };
        match self.recorder.publish(&event, reference).await {
            Ok(()) => true,
            Err(e) => {
                warn!(error = %e, reason, "cannot post event; it is posted again on the next pass");
                false
            }
        }
    }
}
