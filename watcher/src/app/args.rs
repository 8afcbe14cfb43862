//! The settings of the watcher: what it watches and publishes to, how it settles bursts, and
//! the limits and policies it keeps tenants to.

use hafleet_proto::FleetName;
use hafleet_runtime::settings::Deprecations;
use std::time::Duration;

/// Settings of `hafleet-watcher`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub nats: hafleet_runtime::NatsArgs,
    /// Only Ingresses of this class (spec.ingressClassName, or the legacy
    /// kubernetes.io/ingress.class annotation). Unset: every Ingress carrying hafleet.io/fleet.
    #[arg(long, env = "HAFLEET_INGRESS_CLASS")]
    pub ingress_class: Option<String>,
    /// Most time to let a burst of cluster changes settle before resolving: a burst that goes
    /// on longer is published in steps of this. A change that comes after a second without
    /// one is resolved at once; only those that follow within a second wait to settle.
    #[arg(long, env = "HAFLEET_DEBOUNCE", default_value = "100ms",
          value_parser = hafleet_runtime::settings::duration)]
    pub debounce: Duration,
    /// Time without a cluster change after which a burst counts as settled (a burst: changes
    /// less than a second apart; a change after a quiet second is resolved at once).
    #[arg(long, env = "HAFLEET_QUIET", default_value = "20ms",
          value_parser = hafleet_runtime::settings::duration)]
    pub quiet: Duration,
    /// Deprecated: --debounce in milliseconds.
    #[arg(long, env = "HAFLEET_DEBOUNCE_MS", hide = true, conflicts_with = "debounce")]
    pub debounce_ms: Option<u64>,
    /// Deprecated: --quiet in milliseconds.
    #[arg(long, env = "HAFLEET_QUIET_MS", hide = true, conflicts_with = "quiet")]
    pub quiet_ms: Option<u64>,
    /// Where each fleet takes traffic, shown in the `status.loadBalancer.ingress` of every
    /// Ingress routed on it (so `kubectl get ingress` shows it): `edge=192.0.2.10,192.0.2.11
    /// core=lb.example.com` (fleets separated by spaces, addresses by commas; IPs or
    /// hostnames). Fleets not named leave their Ingresses' status alone.
    #[arg(long, env = "HAFLEET_FLEET_ADDRESSES", default_value = "", value_parser = crate::core::status::parse)]
    pub fleet_addresses: crate::core::status::FleetAddresses,
    /// Most paths one Ingress may route (rules × paths, and its default backend). A larger
    /// Ingress is refused alone with a Warning Event; the others go on.
    #[arg(long, env = "HAFLEET_MAX_PATHS_PER_INGRESS", default_value_t = 1000)]
    pub max_paths_per_ingress: usize,
    /// Most bytes one Ingress's resolved routes may take in a route event (also capped by the
    /// NATS server's max_payload). A larger Ingress is refused alone with a Warning Event.
    #[arg(long, env = "HAFLEET_MAX_INGRESS_BYTES", default_value_t = 256 * 1024)]
    pub max_ingress_bytes: usize,
    /// Most refused Ingresses per namespace kept for their last good routes (an Ingress that
    /// fails its checks keeps serving what it served before). Beyond it the oldest of them are
    /// withdrawn, each with a Warning Event, so that a namespace's broken Ingresses cannot grow
    /// what every fleet holds and every snapshot names without bound.
    #[arg(long, env = "HAFLEET_MAX_KEPT_PER_NAMESPACE", default_value_t = 1000)]
    pub max_kept_per_namespace: usize,
    /// Most changes per minute one namespace may make to what a fleet runs (each may reload
    /// its hosts), after a burst of ten seconds' worth. Beyond it the namespace's changed
    /// Ingresses wait, each with a Throttled Warning Event, and go together, in their latest
    /// state, when the budget allows. Deletions never wait. 0: no limit.
    #[arg(long, env = "HAFLEET_NAMESPACE_CHANGES_PER_MINUTE", default_value_t = 30)]
    pub namespace_changes_per_minute: u32,
    /// Let any namespace route any host. By default a host belongs, on each fleet, to the
    /// namespace of the oldest Ingress that routes it, and other namespaces' routes for it are
    /// ignored (with a Warning Event) unless an Ingress of the owning namespace lists them in
    /// its `hafleet.io/share-hosts-with` annotation (or `*`). For single-tenant clusters.
    #[arg(long, env = "HAFLEET_SHARE_HOSTS_ACROSS_NAMESPACES")]
    pub share_hosts_across_namespaces: bool,
    /// The cluster admin's tenancy policy, as NAMESPACE/NAME of a ConfigMap whose `policy.yaml`
    /// says which namespaces may use which fleets, claim which hosts and write rules without a
    /// host (README, "Tenancy policy"). Ingresses outside it are not routed, with a Warning
    /// Event. Read live; a broken policy keeps the last good one; until one is read, nothing
    /// is published. Unset: every namespace may do all of it.
    #[arg(long, env = "HAFLEET_TENANCY_POLICY", value_parser = crate::core::policy::parse_ref)]
    pub tenancy_policy: Option<(String, String)>,
    /// The namespace of the fleets' settings: a ConfigMap `hafleet-fleet-<fleet>` there sets
    /// that fleet's timeouts, X-Forwarded-For, access log, HSTS and PROXY protocol (README,
    /// "Fleet settings"). Read live; a ConfigMap with a mistake gets a Warning Event and its
    /// fleet keeps its last good settings. Give it to one watcher per fleet (with several
    /// clusters, one cluster's). Unset: no settings are published (the renderer keeps what it
    /// has; a fleet never given any has the defaults).
    #[arg(long, env = "HAFLEET_SETTINGS_NAMESPACE")]
    pub settings_namespace: Option<hafleet_proto::Namespace>,
    /// How often to re-resolve everything from the caches even without changes, which retries
    /// publishes that failed. Reads only the local caches; never polls the API server.
    #[arg(long, env = "HAFLEET_RESYNC", default_value = "30s",
          value_parser = hafleet_runtime::settings::duration)]
    pub resync: Duration,
    /// Deprecated: --resync in seconds.
    #[arg(long, env = "HAFLEET_RESYNC_SECS", hide = true, conflicts_with = "resync")]
    pub resync_secs: Option<u64>,
    /// A pass that would delete more than this many Ingresses of one fleet at once (a relist
    /// after the API server was restored from an empty backup, say) sends no delete events
    /// for them but a snapshot, which the renderer's mass-deletion guard checks
    /// (--sweep-guard-percent). 0: every deletion goes as its own event.
    #[arg(long, env = "HAFLEET_BULK_DELETE_THRESHOLD", default_value_t = 10)]
    pub bulk_delete_threshold: usize,
    /// Where each fleet's Services send traffic, unless a Service's `hafleet.io/endpoints`
    /// annotation says otherwise: `edge=pods core=nodes`, fleets separated by spaces. `nodes`
    /// (the default for fleets not named): to the Ready nodes at the Service's NodePort, where
    /// kube-proxy forwards it. `pods`: straight to the Service's ready pods, from its
    /// EndpointSlices, each health-checked by HAProxy and changed without reloads; for
    /// clusters whose pod addresses the HAProxy hosts can reach (BGP, cloud VPC routing). Any
    /// type of Service works in pods mode, ClusterIP and headless included.
    #[arg(long, env = "HAFLEET_ENDPOINTS", value_delimiter = ' ', value_parser = parse_endpoints)]
    pub endpoints: Vec<(FleetName, crate::core::pods::Mode)>,
    /// Serve the certificates of Ingresses' `spec.tls` on these fleets, each private key
    /// sealed to the fleet's age X25519 recipient (`hafleet keygen` prints it):
    /// `edge=age1… core=age1…`, fleets separated by spaces. Turns on the watch of
    /// `kubernetes.io/tls` Secrets (metadata only; the data of the Secrets fleet Ingresses
    /// name is read one by one), which needs the RBAC of deploy/kubernetes/components/tls.
    /// Fleets not named get no certificates; unset: TLS off.
    #[arg(long, env = "HAFLEET_SEAL_TO", value_delimiter = ' ', value_parser = parse_seal_to)]
    pub seal_to: Vec<(FleetName, crate::core::tls_secrets::SealTo)>,
    /// With TLS on, the only namespaces whose `kubernetes.io/tls` Secrets the watcher watches
    /// and reads (comma-separated): the RBAC of deploy/kubernetes/components/tls
    /// then needs a RoleBinding in each of these only, so the watcher can read no Secret
    /// elsewhere (the renderer's signing key, the appliers' SSH keys). A Secret named from
    /// another namespace is not served, and its Ingress is told why. Unset: every namespace
    /// (a ClusterRoleBinding: the watcher may read every Secret of the cluster).
    #[arg(long, env = "HAFLEET_TLS_NAMESPACES", value_delimiter = ',', num_args = 1..,
          value_parser = parse_namespace)]
    pub tls_namespaces: Vec<String>,
    /// Each TLS fleet's default certificate: the `kubernetes.io/tls` Secret HTTPS answers with
    /// for a name no Ingress has a certificate for, as `edge=hafleet/edge-default` (fleets
    /// separated by spaces; the fleet needs --seal-to). A fleet without one refuses such names.
    #[arg(long, env = "HAFLEET_DEFAULT_CERT", value_delimiter = ' ', value_parser = parse_default_cert)]
    pub default_cert: Vec<(FleetName, (String, String))>,
    /// Deprecated: HAFLEET_DEFAULT_CERT's old name.
    #[arg(long = "default-certs", env = "HAFLEET_DEFAULT_CERTS", hide = true,
          value_delimiter = ' ', value_parser = parse_default_cert, conflicts_with = "default_cert")]
    pub default_certs: Vec<(FleetName, (String, String))>,
    /// Days before a served certificate's notAfter from which its Ingress gets a
    /// CertificateExpiring Warning Event (it is still served until it expires, then refused).
    #[arg(long, env = "HAFLEET_CERT_EXPIRY_WARNING_DAYS", default_value_t = 14)]
    pub cert_expiry_warning_days: u32,
    /// This cluster's id, when several clusters feed the same fleets (an RFC 1123 label, each
    /// cluster its own): its Ingresses, Services and nodes are told apart from other
    /// clusters' (HAProxy names its backends `be_…:<id>` and its servers `<node>:<id>`), and
    /// its snapshots sweep only its own Ingresses. Unset: the one cluster. Setting or changing
    /// it on a running pipeline makes its Ingresses new ones: the old ones are not swept.
    #[arg(long, env = "HAFLEET_CLUSTER_ID")]
    pub cluster_id: Option<hafleet_proto::ClusterId>,
    #[command(flatten)]
    pub lease: crate::k8s::elector::LeaseArgs,
    #[command(flatten)]
    pub health: hafleet_runtime::health::HealthArgs,
}

impl RunArgs {
    /// Takes the deprecated spellings of settings into the current ones; returns what was
    /// used, to log.
    pub fn settle(&mut self) -> Deprecations {
        let (ms, s) = (Duration::from_millis(1), Duration::from_secs(1));
        let mut d = Deprecations::default();
        d.renamed(self.debounce_ms.take(), ms, &mut self.debounce, ("debounce-ms", "debounce"));
        d.renamed(self.quiet_ms.take(), ms, &mut self.quiet, ("quiet-ms", "quiet"));
        d.renamed(self.resync_secs.take(), s, &mut self.resync, ("resync-secs", "resync"));
        let lease = &mut self.lease;
        let names = ("lease-duration-secs", "lease-duration");
        d.renamed(lease.lease_duration_secs.take(), s, &mut lease.lease_duration, names);
        let old = std::mem::take(&mut self.default_certs);
        let names = ("HAFLEET_DEFAULT_CERTS", "HAFLEET_DEFAULT_CERT");
        d.renamed_env(&old, &mut self.default_cert, names);
        d
    }

    /// The fleets whose Services go to their pods by default (`--endpoints FLEET=pods`).
    pub fn pods_fleets(&self) -> Vec<FleetName> {
        let pods = self.endpoints.iter().filter(|(_, m)| *m == crate::core::pods::Mode::Pods);
        pods.map(|(f, _)| f.clone()).collect()
    }

    /// What one Ingress's route event may take ([`crate::core::route_events::over_budget`]).
    pub fn ingress_limits(&self) -> crate::core::route_events::IngressLimits<'_> {
        crate::core::route_events::IngressLimits {
            max_paths: self.max_paths_per_ingress,
            max_bytes: self.max_ingress_bytes,
            cluster: self.cluster_id.as_ref(),
        }
    }
}

/// `FLEET=pods` or `FLEET=nodes`.
fn parse_endpoints(s: &str) -> Result<(FleetName, crate::core::pods::Mode), String> {
    let (fleet, mode) = s.split_once('=').ok_or("expected FLEET=pods or FLEET=nodes")?;
    let fleet = FleetName::new(fleet).map_err(|e| e.to_string())?;
    Ok((fleet, mode.parse()?))
}

/// `FLEET=NAMESPACE/NAME`.
fn parse_default_cert(s: &str) -> Result<(FleetName, (String, String)), String> {
    let (fleet, secret) = s.split_once('=').ok_or("expected FLEET=NAMESPACE/NAME")?;
    let fleet = FleetName::new(fleet).map_err(|e| e.to_string())?;
    let (ns, name) = secret.split_once('/').ok_or("expected FLEET=NAMESPACE/NAME")?;
    hafleet_proto::Namespace::new(ns).map_err(|e| e.to_string())?;
    hafleet_proto::ObjectName::new(name).map_err(|e| e.to_string())?;
    Ok((fleet, (ns.to_owned(), name.to_owned())))
}

/// `FLEET=age1…`. Errors never quote the value: an identity pasted here by mistake (the
/// private half) must not reach a log.
fn parse_namespace(s: &str) -> Result<String, String> {
    hafleet_proto::Namespace::new(s.trim()).map(|n| n.to_string()).map_err(|e| e.to_string())
}

fn parse_seal_to(s: &str) -> Result<(FleetName, crate::core::tls_secrets::SealTo), String> {
    if s.to_ascii_uppercase().contains("AGE-SECRET-KEY") {
        return Err("this is a fleet's private identity (AGE-SECRET-KEY-1…), which belongs \
                    with its applier only; give the watcher its recipient (age1…, printed by \
                    `hafleet keygen`)"
            .into());
    }
    let (fleet, recipient) = s.split_once('=').ok_or("expected FLEET=age1…")?;
    let fleet =
        FleetName::new(fleet).map_err(|_| "the fleet before '=' is not a valid fleet name")?;
    Ok((fleet, recipient.parse()?))
}
