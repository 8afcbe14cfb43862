//! The Gateway API on the test API server: the upstream CRDs (tests/gateway-api/, v1.6.1),
//! made acceptable to Kubernetes 1.20 and installed.

use crate::KubeEnv;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// The Gateway API version whose CRDs the tests install.
pub const VERSION: &str = "v1.6.1";

/// The CRD files, in the order they are created.
pub fn crd_files() -> Vec<PathBuf> {
    let dir = crate::stack::workspace_file("tests/gateway-api").join(VERSION);
    ["gatewayclasses", "gateways", "httproutes", "referencegrants", "tlsroutes", "tcproutes"]
        .iter()
        .map(|kind| dir.join(format!("gateway.networking.k8s.io_{kind}.yaml")))
        .collect()
}

/// `yaml` without what Kubernetes 1.20 refuses in a CRD's schema: every
/// `x-kubernetes-validations` block (CEL rules, from 1.25) and every `default: ""` (an empty
/// default that 1.20's structural schema checks refuse). Line by line, on the block style
/// controller-gen writes: a key's block is the lines indented deeper than the key, and the
/// list items at the key's own indentation.
pub fn for_kubernetes_1_20(yaml: &str) -> String {
    let mut out = String::with_capacity(yaml.len());
    let mut skipping: Option<usize> = None;
    for line in yaml.lines() {
        let indent = line.len() - line.trim_start().len();
        let content = line.trim_start();
        if let Some(key) = skipping {
            let inside = indent > key || (indent == key && content.starts_with("- "));
            if inside || content.is_empty() {
                continue;
            }
            skipping = None;
        }
        if content.starts_with("x-kubernetes-validations:") {
            skipping = Some(indent);
            continue;
        }
        if content == "default: \"\"" {
            continue;
        }
        out.push_str(line);
        out.push('\n');
        // The test API server stores an empty string in a custom resource as null (its
        // vendored JSON decoder under a newer Go), which a string field refuses: such fields
        // (a pattern that allows "") take null too. The watcher reads null as "".
        if content.starts_with("pattern: ^$|") {
            out.push_str(&" ".repeat(indent));
            out.push_str("nullable: true\n");
        }
    }
    out
}

/// Creates the Gateway API CRDs on `kube`, transformed ([`for_kubernetes_1_20`]), and waits
/// until the API server serves them.
pub async fn install_crds(kube: &KubeEnv, work: &Path) -> Result<()> {
    for file in crd_files() {
        let yaml = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        let name = file.file_name().context("a file name")?;
        let out = work.join(name);
        std::fs::write(&out, for_kubernetes_1_20(&yaml))?;
        // `create`, not `apply`: a CRD of this size does not fit in apply's annotation.
        crate::stack::kubectl(kube, "create", &out).await?;
    }
    let client = kube.client().await?;
    crate::eventually(std::time::Duration::from_secs(30), "the Gateway API served", || {
        let client = client.clone();
        async move {
            let group = kube::discovery::group(&client, "gateway.networking.k8s.io").await?;
            let kinds = ["GatewayClass", "Gateway", "HTTPRoute", "ReferenceGrant", "TLSRoute"];
            for kind in kinds.into_iter().chain(["TCPRoute"]) {
                group.recommended_kind(kind).with_context(|| format!("no {kind} yet"))?;
            }
            Ok(())
        }
    })
    .await
}

/// The upstream conformance suite's namespaces (conformance/base/manifests.yaml).
pub const INFRA_NS: &str = "gateway-conformance-infra";
pub const WEB_NS: &str = "gateway-conformance-web-backend";
pub const APP_NS: &str = "gateway-conformance-app-backend";

/// The upstream base's namespace labels: (namespace, value of `gateway-conformance`).
pub const NAMESPACE_LABELS: [(&str, &str); 3] =
    [(INFRA_NS, "infra"), (WEB_NS, "backend"), (APP_NS, "backend")];

/// The Services of the upstream base, (namespace, name), each on port 8080.
pub const BASE_SERVICES: [(&str, &str); 6] = [
    (INFRA_NS, "infra-backend-v1"),
    (INFRA_NS, "infra-backend-v2"),
    (INFRA_NS, "infra-backend-v3"),
    (WEB_NS, "web-backend"),
    (APP_NS, "app-backend-v1"),
    (APP_NS, "app-backend-v2"),
];

/// The `controllerName` of hafleet's GatewayClasses.
pub const CONTROLLER_NAME: &str = "hafleet.io/gateway-controller";

/// The API resource of Gateway API `kind` (v1).
pub fn resource(kind: &str) -> kube::api::ApiResource {
    let plural = format!("{}s", kind.to_lowercase()).replace("classs", "classes");
    kube::api::ApiResource {
        group: "gateway.networking.k8s.io".into(),
        version: "v1".into(),
        api_version: "gateway.networking.k8s.io/v1".into(),
        kind: kind.into(),
        plural,
    }
}

/// Creates `object` (a Gateway API object, as JSON with its apiVersion and kind).
pub async fn create(client: &kube::Client, object: serde_json::Value) -> Result<()> {
    use kube::api::{Api, DynamicObject, PostParams};
    let kind = object["kind"].as_str().context("a kind")?.to_owned();
    let ar = resource(&kind);
    let object: DynamicObject = serde_json::from_value(object)?;
    let api: Api<DynamicObject> = match object.metadata.namespace.as_deref() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("create {kind} {:?}", object.metadata.name))?;
    Ok(())
}

/// Reads Gateway API object `kind` `namespace/name` (`None`: cluster-scoped).
pub async fn get(
    client: &kube::Client,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> Result<kube::api::DynamicObject> {
    use kube::api::{Api, DynamicObject};
    let ar = resource(kind);
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    Ok(api.get(name).await?)
}

/// Deletes Gateway API object `kind` `namespace/name`.
pub async fn delete(
    client: &kube::Client,
    kind: &str,
    (namespace, name): (&str, &str),
) -> Result<()> {
    use kube::api::{Api, DeleteParams, DynamicObject};
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource(kind));
    api.delete(name, &DeleteParams::default())
        .await
        .with_context(|| format!("delete {kind} {namespace}/{name}"))?;
    Ok(())
}

/// Merge-patches Gateway API object `kind` `namespace/name` with `patch`.
pub async fn patch(
    client: &kube::Client,
    kind: &str,
    (namespace, name): (&str, &str),
    patch: serde_json::Value,
) -> Result<()> {
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource(kind));
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("patch {kind} {namespace}/{name}"))?;
    Ok(())
}

/// The upstream base's GatewayClass (hafleet's) and Gateways `same-namespace` (HTTP on 80,
/// routes of its own namespace), `all-namespaces` (routes of any) and `backend-namespaces`
/// (routes of the namespaces labelled `gateway-conformance: backend`), on `fleet`.
pub fn base_objects(fleet: &str) -> Vec<serde_json::Value> {
    let gateway = |name: &str, from: &str| {
        serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": name, "namespace": INFRA_NS,
                         "annotations": {"hafleet.io/fleet": fleet}},
            "spec": {"gatewayClassName": "hafleet", "listeners": [{
                "name": "http", "port": 80, "protocol": "HTTP",
                "allowedRoutes": {"namespaces": {"from": from}}}]}
        })
    };
    let backend_namespaces = serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "backend-namespaces", "namespace": INFRA_NS,
                     "annotations": {"hafleet.io/fleet": fleet}},
        "spec": {"gatewayClassName": "hafleet", "listeners": [{
            "name": "http", "port": 80, "protocol": "HTTP",
            "allowedRoutes": {"namespaces": {"from": "Selector",
                "selector": {"matchLabels": {"gateway-conformance": "backend"}}}}}]}
    });
    vec![
        serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": "hafleet"},
            "spec": {"controllerName": CONTROLLER_NAME}
        }),
        gateway("same-namespace", "Same"),
        gateway("all-namespaces", "All"),
        backend_namespaces,
    ]
}

/// `(type, status, reason)` of each condition `status` lists under `conditions`.
pub fn conditions_of(status: &serde_json::Value) -> Vec<(String, String, String)> {
    let list = status.get("conditions").and_then(|c| c.as_array()).cloned().unwrap_or_default();
    list.iter()
        .map(|c| {
            let field = |k: &str| c.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
            (field("type"), field("status"), field("reason"))
        })
        .collect()
}

/// Whether `conditions` has `type_` with `status` (`"True"`/`"False"`) and, when given,
/// `reason`.
pub fn has_condition(
    conditions: &[(String, String, String)],
    type_: &str,
    status: &str,
    reason: Option<&str>,
) -> bool {
    conditions
        .iter()
        .any(|(t, s, r)| t == type_ && s == status && reason.is_none_or(|want| want == r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cel_rules_and_empty_defaults_go_and_everything_else_stays() {
        let yaml = "\
spec:
  properties:
    name:
      default: \"\"
      type: string
    port:
      default: 80
      x-kubernetes-validations:
      - message: a
        rule: self > 0
      - message: b
        rule: |
          self < 65536
      maximum: 65535
    rules:
      type: array
  x-kubernetes-validations:
  - rule: true
status: {}
";
        let want = "\
spec:
  properties:
    name:
      type: string
    port:
      default: 80
      maximum: 65535
    rules:
      type: array
status: {}
";
        assert_eq!(for_kubernetes_1_20(yaml), want);
    }

    #[test]
    fn the_vendored_crds_keep_no_cel_rule() {
        let mut removed = 0;
        for file in crd_files() {
            let yaml = std::fs::read_to_string(&file).unwrap();
            removed += yaml.matches("x-kubernetes-validations").count();
            let out = for_kubernetes_1_20(&yaml);
            assert!(!out.contains("x-kubernetes-validations"), "{}", file.display());
            assert!(!out.contains("rule: "), "{}", file.display());
            assert!(out.contains("kind: CustomResourceDefinition"));
        }
        assert!(removed > 10, "the upstream CRDs have CEL rules to remove: {removed}");
    }

    /// A string field that may be "" takes null too (the test API server stores "" so).
    #[test]
    fn a_field_that_may_be_empty_may_be_null() {
        let yaml = "        group:\n          pattern: ^$|^[a-z]+$\n          type: string\n";
        let want = "        group:\n          pattern: ^$|^[a-z]+$\n          nullable: true\n          type: string\n";
        assert_eq!(for_kubernetes_1_20(yaml), want);
    }
}
