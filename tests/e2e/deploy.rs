//! What ships in deploy/kubernetes is what the API server accepts, NATS component included.

use anyhow::{Context as _, Result};

/// The Kubernetes manifests are what the API server accepts: `kubectl apply -k
/// deploy/kubernetes`, as an operator installing hafleet would (no controllers run here, so
/// nothing is scheduled), and the example applier beside it; then the same again as a
/// server-side dry run: nothing changes. With `components: [components/nats]` added, as
/// components/nats says, the 3-node NATS cluster is accepted too (a server-side dry run), and
/// its config is one `nats-server -t` accepts ([`the_nats_component_s_config_is_valid`]).
/// (The test API server is Kubernetes 1.20, which serves PodDisruptionBudgets as
/// `policy/v1beta1` only: the built manifests say `policy/v1`, for every cluster of today, and
/// are applied here with that one word changed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_manifests_apply_to_the_api_server() -> Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let kube = hafleet_tests::KubeEnv::start().await?;
    let base = hafleet_tests::stack::workspace_file("deploy/kubernetes");
    let built =
        tokio::process::Command::new("kubectl").arg("kustomize").arg(&base).output().await?;
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let built = String::from_utf8(built.stdout)?;
    assert!(built.contains("apiVersion: policy/v1\n"), "{built}");
    let for_1_20 = built.replace("apiVersion: policy/v1\n", "apiVersion: policy/v1beta1\n");
    // deploy/kubernetes as an operator running NATS in the cluster has it: a copy, with the
    // NATS component added to its kustomization.
    let copy = tempfile::tempdir()?;
    let status = tokio::process::Command::new("cp")
        .arg("-R")
        .arg(&base)
        .arg(copy.path().join("kubernetes"))
        .status()
        .await?;
    assert!(status.success(), "cp -R {}: {status}", base.display());
    let kustomization = copy.path().join("kubernetes/kustomization.yaml");
    let mut text = std::fs::read_to_string(&kustomization)?;
    text.push_str("components:\n  - components/nats\n");
    std::fs::write(&kustomization, text)?;
    let with_nats = tokio::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(copy.path().join("kubernetes"))
        .output()
        .await?;
    assert!(with_nats.status.success(), "{}", String::from_utf8_lossy(&with_nats.stderr));
    let with_nats = String::from_utf8(with_nats.stdout)?;
    let nats_for_1_20 =
        with_nats.replace("apiVersion: policy/v1\n", "apiVersion: policy/v1beta1\n");
    let example = std::fs::read_to_string(hafleet_tests::stack::workspace_file(
        "deploy/examples/applier-edge.yaml",
    ))?;
    let kubectl = async |args: &[&str], input: &str| -> Result<(bool, String)> {
        let mut child = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kube.kubeconfig_path())
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        child.stdin.take().context("stdin")?.write_all(input.as_bytes()).await?;
        let out = child.wait_with_output().await?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((out.status.success(), text))
    };
    let (ok, text) = kubectl(&["apply", "-o", "name", "-f", "-"], &for_1_20).await?;
    assert!(ok, "{text}");
    let (ok, text) =
        kubectl(&["apply", "-n", "hafleet", "-o", "name", "-f", "-"], &example).await?;
    assert!(ok, "{text}");
    let (ok, mut stdout) =
        kubectl(&["apply", "--dry-run=server", "-o", "name", "-f", "-"], &for_1_20).await?;
    assert!(ok, "{stdout}");
    let (ok, more) =
        kubectl(&["apply", "-n", "hafleet", "--dry-run=server", "-o", "name", "-f", "-"], &example)
            .await?;
    assert!(ok, "{more}");
    stdout.push_str(&more);
    let (ok, nats) =
        kubectl(&["apply", "--dry-run=server", "-o", "name", "-f", "-"], &nats_for_1_20).await?;
    assert!(ok, "{nats}");
    for object in [
        "statefulset.apps/nats",
        "service/nats",
        "service/nats-headless",
        "poddisruptionbudget.policy/nats",
        "networkpolicy.networking.k8s.io/nats",
        "statefulset.apps/hafleet-renderer",
        "deployment.apps/hafleet-watcher",
    ] {
        assert!(nats.lines().any(|l| l == object), "{object} missing:\n{nats}");
    }
    assert!(nats.lines().any(|l| l.starts_with("configmap/hafleet-nats-config-")), "{nats}");
    the_nats_component_s_config_is_valid(&with_nats)?;
    for object in [
        "namespace/hafleet",
        "serviceaccount/hafleet-watcher",
        "clusterrole.rbac.authorization.k8s.io/hafleet-watcher",
        "role.rbac.authorization.k8s.io/hafleet-watcher-lease",
        "deployment.apps/hafleet-watcher",
        "statefulset.apps/hafleet-renderer",
        "service/hafleet-renderer",
        "poddisruptionbudget.policy/hafleet-watcher",
        "networkpolicy.networking.k8s.io/hafleet",
        "ingressclass.networking.k8s.io/hafleet",
        "configmap/hafleet-applier-edge-inventory",
        "deployment.apps/hafleet-applier-edge",
    ] {
        assert!(stdout.lines().any(|l| l == object), "{object} missing:\n{stdout}");
    }
    // The renderer's StatefulSet names the Service that governs it.
    assert!(built.contains("serviceName: hafleet-renderer"), "{built}");
    // The base installs no applier: the example is for documentation addresses.
    assert!(!built.contains("hafleet-applier-edge"), "{built}");
    // The inventory in the example ConfigMap is one the applier accepts.
    let manifest = example;
    // The block scalar under `inventory.toml: |`, indented four spaces.
    let inventory: String = manifest
        .split_once("inventory.toml: |\n")
        .map(|(_, rest)| rest)
        .unwrap_or_default()
        .lines()
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    let hosts = hafleet_applier::core::inventory::parse(&inventory)?;
    assert_eq!(hosts.len(), 2);
    assert_eq!(hosts[0].probes.len(), 1);
    Ok(())
}

/// The NATS component, as `kubectl kustomize` built it into `built`: its servers route to one
/// another by the names the StatefulSet gives them, the watcher and the renderer create
/// streams of 3 replicas, the permissions it ships are deploy/nats/hafleet-permissions.conf
/// to the byte, and its config with the users of hafleet-users.conf.example (keys filled in,
/// and a second fleet, core, added as the example says) is one `nats-server -t` accepts:
/// in the pod's environment, with the Secret's files (a CA of the test's own) where the pod
/// has them.
fn the_nats_component_s_config_is_valid(built: &str) -> Result<()> {
    use hafleet_cli::commands::permissions;
    assert!(built.contains("serviceName: nats-headless\n"), "{built}");
    assert!(built.contains("value: $(POD_NAME).nats-headless.hafleet.svc:6222\n"), "{built}");
    let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(built)?;
    for (kind, name) in [("Deployment", "hafleet-watcher"), ("StatefulSet", "hafleet-renderer")] {
        let object = documents
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .with_context(|| format!("no {kind} {name}"))?;
        let env = &object["spec"]["template"]["spec"]["containers"][0]["env"];
        let replicas = serde_json::json!({"name": "HAFLEET_NATS_REPLICAS", "value": "3"});
        assert!(env.as_array().is_some_and(|e| e.contains(&replicas)), "{name}: {env}");
    }
    let config = documents
        .iter()
        .find(|d| {
            d["kind"] == "ConfigMap"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("hafleet-nats-config-"))
        })
        .context("no ConfigMap hafleet-nats-config")?;
    let file = |key: &str| config["data"][key].as_str().context(key.to_owned());
    let shipped = std::fs::read_to_string(hafleet_tests::stack::workspace_file(
        "deploy/nats/hafleet-permissions.conf",
    ))?;
    assert!(
        file("hafleet-permissions.conf")? == shipped,
        "deploy/kubernetes/components/nats/hafleet-permissions.conf is not a copy of \
         deploy/nats/hafleet-permissions.conf: copy it again"
    );
    let nats_conf = file("nats.conf")?;
    for i in 0..3 {
        let route = format!("nats-route://nats-{i}.nats-headless.hafleet.svc:6222\n");
        assert!(nats_conf.contains(&route), "{route} missing:\n{nats_conf}");
    }
    // The pod's folders, here: the Secret's (a certificate for the Services' names, from a CA
    // of the test's own), the pid file's and the store's.
    let dir = tempfile::tempdir()?;
    let at = |p: &str| dir.path().join(p).display().to_string();
    for d in ["config", "tls", "run", "data"] {
        std::fs::create_dir(dir.path().join(d))?;
    }
    let ca = hafleet_tests::tls::Ca::new("hafleet test NATS CA")?;
    let (crt, key) = ca.issue(&["nats.hafleet.svc", "*.nats-headless.hafleet.svc"])?;
    std::fs::write(at("tls/tls.crt"), crt)?;
    std::fs::write(at("tls/tls.key"), key)?;
    std::fs::write(at("tls/ca.crt"), ca.cert_pem()?)?;
    let local = nats_conf
        .replace("/etc/nats/tls/", &at("tls/"))
        .replace("/var/run/nats/", &at("run/"))
        .replace("store_dir: /data\n", &format!("store_dir: {:?}\n", at("data")));
    assert!(!local.contains("/etc/nats") && !local.contains(" /data"), "{local}");
    std::fs::write(at("config/nats.conf"), local)?;
    std::fs::write(at("config/hafleet-permissions.conf"), &shipped)?;
    // The operator's hafleet-users.conf: the example, each PUBLIC_KEY_OF_… a user's key.
    let mut users = std::fs::read_to_string(hafleet_tests::stack::workspace_file(
        "deploy/kubernetes/components/nats/hafleet-users.conf.example",
    ))?;
    let mut filled = 0;
    while let Some(start) = users.find("nkey: PUBLIC_KEY_OF_").map(|i| i + "nkey: ".len()) {
        let len = users[start..]
            .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
            .unwrap_or(users.len() - start);
        users.replace_range(start..start + len, &nkeys::KeyPair::new_user().public_key());
        filled += 1;
    }
    assert_eq!(filled, 5, "{users}");
    let core = hafleet_proto::FleetName::new("core")?;
    let user = format!(
        "    {{ nkey: {}, permissions: ${} }}\n",
        nkeys::KeyPair::new_user().public_key(),
        permissions::variable(&core)
    );
    let users = users
        .replacen(
            "\nauthorization {",
            &format!("\n{}\nauthorization {{", permissions::nats_permissions(&core)),
            1,
        )
        .replacen("  users = [\n", &format!("  users = [\n{user}"), 1);
    assert!(users.contains("HAFLEET_APPLIER_CORE = {"), "{users}");
    std::fs::write(at("config/hafleet-users.conf"), users)?;
    let out = std::process::Command::new("nats-server")
        .arg("-t")
        .arg("-c")
        .arg(at("config/nats.conf"))
        .env("POD_NAME", "nats-0")
        .env("CLUSTER_ADVERTISE", "nats-0.nats-headless.hafleet.svc:6222")
        .output()
        .context("nats-server (install it with tests/setup.sh)")?;
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("is valid"), "nats-server -t: {text}");
    Ok(())
}
