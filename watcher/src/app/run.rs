//! The watcher's loop.
//!
//! ```text
//! watches (Ingress, Service, Node, EndpointSlice) ──tick──▶ settle (--quiet-ms without a change,
//!   at most --debounce-ms) ──▶ Ready nodes changed? publish them
//!   ──▶ resolve every Ingress from the caches (resolve::Memo: anew only where an Ingress, a
//!   Service it names or their endpoints changed) ──▶ index::diff against what was published
//!   ──▶ publish (acked) ──▶ index::record
//! ```
//! Routes name NodePorts, not nodes: a node joining, leaving or going NotReady is one nodes
//! message, whatever the number of Ingresses.
//! After start-up, once every cache is listed and every live Ingress is published, a snapshot
//! names them all, so the renderer can sweep Ingresses deleted while no watcher ran.

use crate::core::index::{self, Action, Desired, Published};
use crate::core::resolve::{self, Refused, Services};
use crate::core::tenancy;
use crate::k8s::watch::{self as kube_adapter, Caches, Warnings};
use anyhow::Context as _;
use futures::StreamExt;
use hafleet_proto::{FleetName, IngressKey, NodeAddr, NodesUpdate, RouteChange, RouteMessage};
use hafleet_runtime::nats::Bus;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::{debug, info, warn};

/// Settings of `hafleet-watcher`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub nats: hafleet_runtime::NatsArgs,
    /// Only Ingresses of this class (spec.ingressClassName, or the legacy
    /// kubernetes.io/ingress.class annotation). Unset: every Ingress carrying hafleet.io/fleet.
    #[arg(long, env = "HAFLEET_INGRESS_CLASS")]
    pub ingress_class: Option<String>,
    /// Most milliseconds to let a burst of cluster changes settle before resolving: a burst
    /// that goes on longer is published in steps of this.
    #[arg(long, env = "HAFLEET_DEBOUNCE_MS", default_value_t = 100)]
    pub debounce_ms: u64,
    /// Milliseconds without a cluster change after which a burst counts as settled: a lone
    /// change is resolved after this, not after --debounce-ms.
    #[arg(long, env = "HAFLEET_QUIET_MS", default_value_t = 20)]
    pub quiet_ms: u64,
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
    /// Seconds between re-resolving everything from the caches even without changes, which
    /// retries publishes that failed. Reads only the local caches; never polls the API server.
    #[arg(long, env = "HAFLEET_RESYNC_SECS", default_value_t = 30)]
    pub resync_secs: u64,
    /// A pass that would delete more than this many Ingresses of one fleet at once (a relist
    /// after the API server was restored from an empty backup, say) sends no delete events
    /// for them but a snapshot, which the renderer's mass-deletion guard checks
    /// (--sweep-guard-percent). 0: every deletion goes as its own event.
    #[arg(long, env = "HAFLEET_BULK_DELETE_THRESHOLD", default_value_t = 10)]
    pub bulk_delete_threshold: usize,
    /// Serve the certificates of Ingresses' `spec.tls` on these fleets, each private key
    /// sealed to the fleet's age X25519 recipient (`hafleet-applier keygen` prints it):
    /// `edge=age1… core=age1…`, fleets separated by spaces. Turns on the watch of
    /// `kubernetes.io/tls` Secrets (metadata only; the data of the Secrets fleet Ingresses
    /// name is read one by one), which needs the RBAC of deploy/kubernetes/components/tls.
    /// Fleets not named get no certificates; unset: TLS off.
    #[arg(long, env = "HAFLEET_SEAL_TO", value_delimiter = ' ', value_parser = parse_seal_to)]
    pub seal_to: Vec<(FleetName, crate::core::tls_secrets::SealTo)>,
    /// Each TLS fleet's default certificate: the `kubernetes.io/tls` Secret HTTPS answers with
    /// for a name no Ingress has a certificate for, as `edge=hafleet/edge-default` (fleets
    /// separated by spaces; the fleet needs --seal-to). A fleet without one refuses such names.
    #[arg(long, env = "HAFLEET_DEFAULT_CERTS", value_delimiter = ' ', value_parser = parse_default_cert)]
    pub default_cert: Vec<(FleetName, (String, String))>,
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

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    hafleet_runtime::install_shutdown_handler();
    let health =
        hafleet_runtime::health::start(&args.health, "the watches have not listed yet").await?;
    health.gauge(LEADER, &[], f64::from(!args.lease.leader_election));
    let client = kube::Client::try_default()
        .await
        .context("cannot build a Kubernetes client (KUBECONFIG, or in-cluster service account)")?;
    // Discovery (which EndpointSlice version) must see the real server, not guess without it.
    let version =
        hafleet_runtime::wait_for("the Kubernetes API server", || client.apiserver_version())
            .await?;
    info!(version = %version.git_version, "Kubernetes API server answers");
    let bus = args.nats.connect_waiting().await?;
    let routes = bus.ensure_stream(hafleet_proto::ROUTES).await?;
    // The renderer fences off messages of an epoch older than the newest it has seen: this
    // run's must be above every earlier run's, whatever this machine's clock says.
    let last_epoch = newest_epoch(&routes, args.cluster_id.as_ref()).await?;

    let slices = kube_adapter::endpoint_slice_api(&client).await;
    let policy_ref = args.tenancy_policy.as_ref().map(|(ns, name)| (ns.as_str(), name.as_str()));
    let settings_ns = args.settings_namespace.as_ref().map(|ns| ns.as_str());
    let (caches, mut changes) = kube_adapter::watch(
        client.clone(),
        slices,
        !args.seal_to.is_empty(),
        (policy_ref, settings_ns),
    );
    let secrets_client = client.clone();
    let warnings = Warnings::new(client.clone());
    let mut state = State {
        cluster: args.cluster_id.clone(),
        epoch: crate::k8s::elector::next_epoch(
            last_epoch,
            SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64,
        ),
        seq: 0,
        published: Published::default(),
        nodes: None,
        kept: BTreeSet::new(),
        held_new: BTreeSet::new(),
        snapshot_due: false,
        warned: BTreeSet::new(),
        leader: None,
        tls: TlsState {
            client: Some(secrets_client),
            ..TlsState::default_for(args.seal_to.iter().cloned())
        },
        memo: resolve::Memo::default(),
        policy: Default::default(),
        churn: Default::default(),
        settings: Default::default(),
    };
    let shutdown = hafleet_runtime::shutdown_signal();
    tokio::pin!(shutdown);

    // Drive the watches until every cache holds its initial list.
    let ready = caches.ready();
    tokio::pin!(ready);
    loop {
        tokio::select! {
            r = &mut ready => { r.context("watch caches never became ready")?; break; }
            _ = changes.next() => {}
            _ = &mut shutdown => {
                info!("watcher stopping (the watches had not listed yet)");
                stop(&bus).await;
                return Ok(());
            }
        }
    }
    // With leader election, stand by (keeping the caches warm) until this replica holds the
    // lease; its epoch is when it took it, so a later leader's messages are newer.
    if args.lease.leader_election {
        let elector = crate::k8s::elector::Elector::new(client, &args.lease);
        // A standby with warm caches is ready: ready to take over.
        health.ready();
        let lead = elector.lead(last_epoch);
        tokio::pin!(lead);
        let leadership = loop {
            tokio::select! {
                l = &mut lead => break l,
                _ = changes.next() => {}
                _ = &mut shutdown => {
                    info!("watcher stopping (standing by)");
                    bus.drain().await;
                    return Ok(());
                }
            }
        };
        state.epoch = leadership.since_unix_nanos;
        health.gauge(LEADER, &[], 1.0);
        state.leader = Some(leadership);
    }
    let epoch = state.epoch;
    info!(epoch, "caches listed; publishing the initial state");
    // Both retried until done, or until a stop is asked for: NATS may be away for long.
    let initial = async || sync(&args, &caches, &warnings, &bus, &mut state).await;
    let published = crate::app::snapshot::until_done("initial publish", shutdown.as_mut(), initial);
    if published.await.is_none() {
        info!("watcher stopping (the initial state was not published)");
        stop(&bus).await;
        return Ok(());
    }
    let snapshot = async || send_snapshot(&bus, &mut state).await;
    let sent = crate::app::snapshot::until_done("snapshot publish", shutdown.as_mut(), snapshot);
    if sent.await.is_none() {
        info!("watcher stopping (the snapshot was not published)");
        stop(&bus).await;
        return Ok(());
    }
    health.ready();
    // The initial state restates what the fleets run: only changes from here on are counted.
    state.churn = crate::core::churn::Budget::new(args.namespace_changes_per_minute);
    // Events from the fleets' reports on the Ingresses that caused each version: the leader's
    // job, started again if NATS stops delivering (the streams may not exist yet).
    {
        let (bus, store, warnings) = (bus.clone(), caches.ingresses.clone(), warnings.clone());
        let cluster = args.cluster_id.clone();
        tokio::spawn(async move {
            let mut told = crate::core::feedback::Feedback::for_cluster(cluster);
            loop {
                let (bus, store, warnings) = (bus.clone(), store.clone(), warnings.clone());
                let run = crate::core::feedback::adapter::run(bus, store, warnings, &mut told);
                if let Err(e) = run.await {
                    debug!(error = ?e, "reading the fleets' reports stopped; again in 5 s");
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
    }

    let debounce = Duration::from_millis(args.debounce_ms);
    let quiet = Duration::from_millis(args.quiet_ms.min(args.debounce_ms));
    let resync = Duration::from_secs(args.resync_secs.max(1));
    let mut leadership = state.leader.clone();
    let lost = async move {
        match leadership.as_mut() {
            Some(l) => l.lost().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    loop {
        let due = state.churn.next_due(tokio::time::Instant::now());
        tokio::select! {
            _ = &mut lost => {
                // Another replica may hold it now: stop publishing at once, and come back as
                // a standby (the process manager restarts it).
                bus.drain().await;
                anyhow::bail!("lost the lease: exiting, to come back as a standby");
            }
            tick = changes.next() => {
                if tick.is_none() { break; }
                // Let the burst settle, keeping the caches current meanwhile: until no change
                // came for `quiet`, or `debounce` after the first.
                let settle = tokio::time::sleep(debounce);
                tokio::pin!(settle);
                loop {
                    tokio::select! {
                        _ = &mut settle => break,
                        more = tokio::time::timeout(quiet, changes.next()) => {
                            if more.is_err() { break; }
                        }
                    }
                }
            }
            _ = tokio::time::sleep(resync) => {}
            // Held changes whose namespace has budget again.
            _ = crate::core::churn::sleep_until(due) => {}
            _ = &mut shutdown => break,
        }
        if let Err(e) = sync(&args, &caches, &warnings, &bus, &mut state).await {
            warn!(error = %format!("{e:#}"), "publish failed; will retry");
        }
    }
    info!("watcher stopping");
    bus.drain().await;
    Ok(())
}

/// Flushes what NATS has pending and closes, for at most a few seconds: NATS may be what the
/// watcher was waiting for when the stop came.
async fn stop(bus: &Bus) {
    if tokio::time::timeout(Duration::from_secs(5), bus.drain()).await.is_err() {
        warn!("NATS did not drain in 5 s; exiting without");
    }
}

/// The newest epoch this watcher's run must be above (`None` when the stream holds nothing
/// to go by): of the stream's last message, and of the last node set and snapshot of its own
/// cluster (the last message may be another cluster's, whose watcher's clock is behind).
async fn newest_epoch(
    routes: &async_nats::jetstream::stream::Stream,
    cluster: Option<&hafleet_proto::ClusterId>,
) -> anyhow::Result<Option<u64>> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound;
    // No such message is an answer (dropped by retention, or none sent yet), not a failure
    // to wait out.
    let found = |got: Result<
        async_nats::jetstream::message::StreamMessage,
        async_nats::jetstream::stream::LastRawMessageError,
    >| match got {
        Ok(m) => Ok(hafleet_proto::RouteMessage::decode(&m.payload).ok().map(|m| m.epoch())),
        Err(e) if e.kind() == NoMessageFound => Ok(None),
        Err(e) => Err(e),
    };
    let mut newest = None;
    let last = routes.cached_info().state.last_sequence;
    if last > 0 {
        let read = || async { found(routes.get_raw_message(last).await) };
        newest = hafleet_runtime::nats::retrying("the routes stream's newest message", read)
            .await
            .context("cannot read the routes stream's newest message")?;
    }
    for subject in [
        hafleet_proto::routes_nodes_subject(cluster),
        hafleet_proto::routes_snapshot_subject(cluster),
    ] {
        let read = || async { found(routes.get_last_raw_message_by_subject(&subject).await) };
        let epoch = hafleet_runtime::nats::retrying("this cluster's newest message", read)
            .await
            .with_context(|| format!("cannot read the last message on {subject}"))?;
        newest = newest.max(epoch);
    }
    Ok(newest)
}

const ROUTE_EVENTS: (&str, &str) = (
    "hafleet_watcher_route_events_total",
    "Route events published (and acked), by upsert or delete.",
);
const WARNINGS: (&str, &str) =
    ("hafleet_watcher_warnings_total", "Warning Events posted on Ingresses, by reason.");
const LEADER: (&str, &str) = (
    "hafleet_watcher_leader",
    "1 while this replica publishes (holds the lease, or runs without leader election).",
);

struct State {
    /// `--cluster-id`: stamped on everything published, which this watcher's view of its one
    /// cluster does not carry.
    cluster: Option<hafleet_proto::ClusterId>,
    epoch: u64,
    seq: u64,
    published: Published,
    /// The node set last published (and acked); `None` before the first or after a failed
    /// publish, so that it is sent (again).
    nodes: Option<Vec<NodeAddr>>,
    /// Ingresses meant for hafleet but refused as they stand: they keep their routes.
    kept: BTreeSet<IngressKey>,
    /// Ingresses the churn budget holds that this run never published: listed as kept in a
    /// snapshot (nothing sweeps them), but their going out is no reason for one.
    held_new: BTreeSet<IngressKey>,
    /// A snapshot must be published after the next successful sync.
    snapshot_due: bool,
    /// With leader election: the lease this replica holds. Nothing is published unless it
    /// holds.
    leader: Option<crate::k8s::elector::Leadership>,
    /// (ingress, generation or resourceVersion, reason) already reported, so each is said once.
    warned: BTreeSet<(IngressKey, String, String)>,
    tls: TlsState,
    /// Each Ingress's resolution, redone only when it or what it names changed.
    memo: resolve::Memo,
    /// With `--tenancy-policy`: the policy in force.
    policy: crate::core::policy::InForce,
    /// `--namespace-changes-per-minute`, once the initial state is out.
    churn: crate::core::churn::Budget,
    /// With `--settings-namespace`: the fleets' settings read and published.
    settings: crate::core::fleet_settings::InForce,
}

/// A Secret's certificate as read: the resourceVersion, and the checked certificate or why not.
type ReadCert = (String, Result<std::sync::Arc<crate::core::tls_secrets::CheckedCert>, String>);

/// What the watcher keeps for TLS: the checked certificates of the Secrets that Ingresses of
/// fleets with a sealing key name (only those), by (namespace, name), with the resourceVersion
/// they were read at; and each chain sealed once per fleet (sealing anew would change its
/// bytes, and so the version, for nothing).
struct TlsState {
    client: Option<kube::Client>,
    seal_to: BTreeMap<FleetName, crate::core::tls_secrets::SealTo>,
    certs: BTreeMap<(String, String), ReadCert>,
    seals: BTreeMap<(FleetName, String), hafleet_proto::SealedCert>,
    /// The default certificate last published (and acked) per fleet.
    defaults: BTreeMap<FleetName, hafleet_proto::SealedCert>,
    /// (fleet, why) already logged for a default certificate that cannot be used.
    default_warned: BTreeSet<(FleetName, String)>,
}

impl TlsState {
    fn default_for(
        seal_to: impl IntoIterator<Item = (FleetName, crate::core::tls_secrets::SealTo)>,
    ) -> TlsState {
        TlsState {
            client: None,
            seal_to: seal_to.into_iter().collect(),
            certs: BTreeMap::new(),
            seals: BTreeMap::new(),
            defaults: BTreeMap::new(),
            default_warned: BTreeSet::new(),
        }
    }

    /// Reads (again) the Secrets among `wanted` whose resourceVersion in the metadata cache is
    /// not the one read, and forgets the Secrets no longer wanted.
    async fn refresh(
        &mut self,
        meta: &kube::runtime::reflector::Store<
            kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Secret>,
        >,
        wanted: &BTreeSet<(String, String)>,
        now_unix: i64,
    ) {
        self.certs.retain(|k, _| wanted.contains(k));
        let chains: BTreeSet<String> = self
            .certs
            .values()
            .filter_map(|(_, c)| {
                c.as_ref().ok().map(|c| hafleet_proto::sha256_hex(c.chain_pem.as_bytes()))
            })
            .collect();
        self.seals.retain(|(_, chain), _| chains.contains(chain));
        let Some(client) = &self.client else { return };
        for (ns, name) in wanted {
            let key = kube::runtime::reflector::ObjectRef::new(name).within(ns);
            let Some(rv) =
                meta.get(&key).map(|m| m.metadata.resource_version.clone().unwrap_or_default())
            else {
                let why = format!(
                    "no Secret of type {} by that name in namespace {ns}",
                    crate::core::tls_secrets::SECRET_TYPE
                );
                self.certs.insert((ns.clone(), name.clone()), (String::new(), Err(why)));
                continue;
            };
            if self.certs.get(&(ns.clone(), name.clone())).is_some_and(|(seen, _)| *seen == rv) {
                continue;
            }
            let checked = match kube_adapter::secret_data(client, ns, name).await {
                Ok(Some((rv, crt, key))) => {
                    let key = key.map(zeroize::Zeroizing::new);
                    let got = crate::core::tls_secrets::check(
                        crt.as_deref(),
                        key.as_deref().map(|k| k.as_slice()),
                        now_unix,
                    )
                    .map(std::sync::Arc::new)
                    .map_err(|e| e.to_string());
                    (rv, got)
                }
                Ok(None) => (
                    rv,
                    Err(format!(
                        "no Secret of type {} by that name in namespace {ns}",
                        crate::core::tls_secrets::SECRET_TYPE
                    )),
                ),
                Err(e) => {
                    // Not cached: read again next pass.
                    warn!(namespace = %ns, secret = %name, error = %e, "cannot read a TLS Secret");
                    continue;
                }
            };
            self.certs.insert((ns.clone(), name.clone()), checked);
        }
    }

    /// The certificate of Secret `name` in `ns`, sealed to `fleet`; or why not, with the
    /// Secret's resourceVersion (so a Secret that breaks again is said again), or `None` when
    /// there is nothing to tell its owner (not read yet: the API server did not answer).
    fn sealed(
        &mut self,
        fleet: &FleetName,
        ns: &str,
        name: &str,
        now_unix: i64,
    ) -> Result<hafleet_proto::SealedCert, Option<String>> {
        let to = self.seal_to.get(fleet).ok_or(None)?;
        let (rv, checked) = self.certs.get(&(ns.to_owned(), name.to_owned())).ok_or(None)?;
        let at = |why: String| {
            Some(if rv.is_empty() { why } else { format!("{why} (resourceVersion {rv})") })
        };
        let cert = checked.as_ref().map_err(|why| at(why.clone()))?;
        cert.usable_at(now_unix).map_err(|e| at(e.to_string()))?;
        let chain = hafleet_proto::sha256_hex(cert.chain_pem.as_bytes());
        Ok(self.seals.entry((fleet.clone(), chain)).or_insert_with(|| cert.seal(to)).clone())
    }
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
fn parse_seal_to(s: &str) -> Result<(FleetName, crate::core::tls_secrets::SealTo), String> {
    if s.to_ascii_uppercase().contains("AGE-SECRET-KEY") {
        return Err("this is a fleet's private identity (AGE-SECRET-KEY-1…), which belongs \
                    with its applier only; give the watcher its recipient (age1…, printed by \
                    `hafleet-applier keygen`)"
            .into());
    }
    let (fleet, recipient) = s.split_once('=').ok_or("expected FLEET=age1…")?;
    let fleet =
        FleetName::new(fleet).map_err(|_| "the fleet before '=' is not a valid fleet name")?;
    Ok((fleet, recipient.parse()?))
}

impl State {
    fn next_msg_id(&mut self) -> String {
        self.seq += 1;
        match &self.cluster {
            Some(c) => format!("watcher-{c}-{}-{}", self.epoch, self.seq),
            None => format!("watcher-{}-{}", self.epoch, self.seq),
        }
    }
}

/// Resolves everything from the caches and publishes what changed. Stops at the first failed
/// publish; what was not published is found again next time.
async fn sync(
    args: &RunArgs,
    caches: &Caches,
    warnings: &Warnings,
    bus: &Bus,
    state: &mut State,
) -> anyhow::Result<()> {
    if let Some(lease) = &state.leader {
        anyhow::ensure!(lease.holds(), "the lease may have run out: not publishing");
    }
    let started = std::time::Instant::now();
    let services: Services = caches
        .services
        .state()
        .into_iter()
        .filter_map(|s| Some(((s.metadata.namespace.clone()?, s.metadata.name.clone()?), s)))
        .collect();
    let all_nodes = caches.nodes.state();
    let nodes = resolve::ready_nodes(all_nodes.iter().map(|n| n.as_ref()));
    // Only Local Services look their endpoints up: the others' slices (most of a cluster's,
    // and its busiest objects) are not read.
    let endpoints = caches.endpoint_slices.as_ref().map(|slices| {
        let slices = slices.state();
        let local = slices.iter().map(|s| s.as_ref()).filter(|s| {
            resolve::slice_service(s).is_some_and(|(ns, name)| {
                services.get(&(ns.clone(), name.clone())).is_some_and(|svc| resolve::is_local(svc))
            })
        });
        resolve::endpoints(local, all_nodes.iter().map(|n| n.as_ref()))
    });
    if state.nodes.as_ref() != Some(&nodes) {
        send_nodes(bus, state, nodes).await?;
    }

    let policy = match (&caches.policy, &args.tenancy_policy) {
        (Some(store), Some(at)) => {
            let cm = store.state().into_iter().next();
            Some(state.policy.in_force(at, cm.as_deref()).map_err(anyhow::Error::msg)?.clone())
        }
        _ => None,
    };

    let mut desired = index::Wanted::default();
    // (Ingress, resourceVersion) of every Ingress that exists now, when some warning said
    // before may be about one that changed or went (warnings said in this pass are current).
    let prune_warned = !state.warned.is_empty();
    let mut current: BTreeSet<(IngressKey, String)> = BTreeSet::new();
    // The routed Ingresses' objects, to post Events on once tenants are kept apart.
    let mut objects: HashMap<IngressKey, _, foldhash::fast::RandomState> = HashMap::default();
    state.memo.begin_pass();
    for ing in caches.ingresses.state() {
        let ns = ing.metadata.namespace.as_deref().unwrap_or("default");
        let name = ing.metadata.name.as_deref().unwrap_or_default();
        // What a warning is said once per: the spec's generation (a status update, ours
        // included, must not repeat every warning), else the resourceVersion.
        let rv = match (ing.metadata.generation, &ing.metadata.resource_version) {
            (Some(generation), _) => format!("g{generation}"),
            (None, rv) => rv.clone().unwrap_or_default(),
        };
        if prune_warned && let Ok(key) = IngressKey::new(ns, name) {
            current.insert((key, rv.clone()));
        }
        let resolved =
            state.memo.resolve(&ing, args.ingress_class.as_deref(), &services, endpoints.as_ref());
        match resolved {
            // Outside the admin's policy: not routed (what it had is withdrawn), and told.
            Ok(r)
                if let Some(why) = policy
                    .as_ref()
                    .and_then(|p| p.refuses(r.key.namespace.as_str(), &r.fleet, &r.routes)) =>
            {
                let note = format!("not routed by hafleet: {why}");
                let said = (&r.key, rv.as_str(), "NotAllowed", note);
                tell(warnings, &mut state.warned, &ing, said, "ingress refused").await;
            }
            // Only routes that differ from what was published can have grown too large.
            Ok(r)
                if !index::is_current(&state.published, &r)
                    && let Some(why) =
                        crate::core::route_events::over_budget(&r, args, bus.payload_limit()) =>
            {
                // Refused like any invalid Ingress: alone, with a Warning, keeping its routes.
                let note = format!("not routed by hafleet: {why}; split the Ingress");
                let said = (&r.key, rv.as_str(), "RoutesTooLarge", note);
                tell(warnings, &mut state.warned, &ing, said, "ingress refused").await;
                desired.insert(r.key.clone(), Desired::Keep);
            }
            Ok(r) => {
                objects.insert(r.key.clone(), (ing.clone(), rv));
                desired.insert(r.key.clone(), Desired::Routed(r));
            }
            Err(Refused::NotSelected) => {}
            Err(Refused::Invalid(why)) => {
                let Ok(key) = IngressKey::new(ns, name) else {
                    warn!(namespace = ns, name, "ingress with an invalid name ignored");
                    continue;
                };
                let note = format!("not routed by hafleet: {}", why.join("; "));
                let said = (&key, rv.as_str(), "InvalidIngress", note);
                tell(warnings, &mut state.warned, &ing, said, "ingress refused").await;
                // Its last good routes stay only where the policy still allows them.
                if let Some(why) = policy.as_ref().and_then(|p| {
                    crate::core::policy::refuses_kept(p, &key, &ing, &state.published)
                }) {
                    let said =
                        (&key, rv.as_str(), "NotAllowed", format!("not routed by hafleet: {why}"));
                    tell(warnings, &mut state.warned, &ing, said, "ingress refused").await;
                    continue;
                }
                desired.insert(key, Desired::Keep);
            }
        }
    }
    state.memo.end_pass();
    let resolved = started.elapsed();
    // Hosts kept to the namespace that owns them; the losers of conflicts told.
    let mut routed = index::routed_mut(&mut desired);
    let mut told = tenancy::keep_apart(&mut routed, !args.share_hosts_across_namespaces);
    let now_unix = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;
    let mut too_big: Vec<(IngressKey, String)> = Vec::new();
    if let Some(meta) = &caches.tls_secrets {
        let wanted: BTreeSet<(String, String)> = routed
            .iter()
            .filter(|r| state.tls.seal_to.contains_key(&r.fleet))
            .flat_map(|r| {
                let ing = objects.get(&r.key).map(|(ing, _)| ing);
                let spec =
                    ing.map(|i| crate::core::tls_secrets::SpecEntry::of(i)).unwrap_or_default();
                let ns = r.key.namespace.as_str().to_owned();
                spec.into_iter().filter_map(move |e| Some((ns.clone(), e.secret?)))
            })
            .chain(
                args.default_cert
                    .iter()
                    .filter(|(f, _)| state.tls.seal_to.contains_key(f))
                    .map(|(_, secret)| secret.clone()),
            )
            .collect();
        state.tls.refresh(meta, &wanted, now_unix).await;
    }
    for r in routed {
        if caches.tls_secrets.is_some()
            && let Some((ing, _)) = objects.get(&r.key)
        {
            let spec = crate::core::tls_secrets::SpecEntry::of(ing);
            if !spec.is_empty() && !state.tls.seal_to.contains_key(&r.fleet) {
                let note = format!(
                    "spec.tls is not served: TLS is off on fleet {} (the watcher has no \
                     --seal-to for it)",
                    r.fleet
                );
                told.entry(r.key.clone())
                    .or_default()
                    .push(crate::core::model::Warning { reason: "TLSNotEnabled", note });
            }
            if spec.is_empty() || !state.tls.seal_to.contains_key(&r.fleet) {
                told.entry(r.key.clone())
                    .or_default()
                    .splice(0..0, std::mem::take(&mut r.warnings));
                continue;
            }
            let hosts: BTreeSet<hafleet_proto::HttpHost> =
                r.routes.iter().filter_map(|route| route.host.clone()).collect();
            let ns = r.key.namespace.as_str();
            let tls = &mut state.tls;
            let mut lookup = |name: &str| tls.sealed(&r.fleet, ns, name, now_unix);
            let warn_after = now_unix + i64::from(args.cert_expiry_warning_days) * 86_400;
            let (entries, said) =
                crate::core::tls_secrets::entries(ns, &spec, &hosts, &mut lookup, warn_after);
            r.tls = entries;
            told.entry(r.key.clone()).or_default().extend(
                said.into_iter().map(|(reason, note)| crate::core::model::Warning { reason, note }),
            );
            // Certificates count against the Ingress's budget too.
            if !index::is_current(&state.published, r)
                && let Some(why) =
                    crate::core::route_events::over_budget(r, args, bus.payload_limit())
            {
                too_big.push((r.key.clone(), why));
            }
        }
        // Nothing reads a Resolved's warnings after this (publishing compares routes).
        told.entry(r.key.clone()).or_default().splice(0..0, std::mem::take(&mut r.warnings));
    }
    for (key, why) in too_big {
        // Refused like any Ingress over budget: alone, keeping what it had.
        desired.insert(key.clone(), Desired::Keep);
        if let Some((ing, rv)) = objects.get(&key) {
            let note = format!("not routed by hafleet: {why}; split the Ingress");
            let said = (&key, rv.as_str(), "RoutesTooLarge", note);
            tell(warnings, &mut state.warned, ing, said, "ingress refused").await;
        }
    }
    for (key, said) in told {
        let Some((ing, rv)) = objects.get(&key) else { continue };
        for w in said {
            let said = (&key, rv.as_str(), w.reason, w.note);
            tell(warnings, &mut state.warned, ing, said, "ingress routed with a caveat").await;
        }
    }
    let cap = args.max_kept_per_namespace;
    crate::app::kept::cap(cap, &caches.ingresses, warnings, &mut state.warned, &mut desired).await;
    let actions = index::diff(&state.published, &desired);
    // Upserts of a namespace over its budget wait, unrecorded: the next diff finds them again.
    let crate::core::churn::Admitted { go: actions, held } =
        state.churn.admit(actions, &state.published, tokio::time::Instant::now());
    // A held Ingress never published (by this run) is kept: no snapshot sweeps what it had.
    // (Not a reason for a snapshot when it goes: its publish replaces it.)
    state.held_new = held
        .iter()
        .map(|(_, k)| k)
        .filter(|k| !state.published.contains_key(*k))
        .cloned()
        .collect();
    let kept: BTreeSet<IngressKey> = desired
        .iter()
        .filter(|(_, d)| matches!(d, Desired::Keep))
        .map(|(k, _)| k.clone())
        .collect();
    // An Ingress that leaves `kept` (fixed, moved or deleted) may still be held by the renderer
    // from before this watcher started, unknown to `published`: a new snapshot sweeps it.
    if state.kept.iter().any(|k| !kept.contains(k)) {
        state.snapshot_due = true;
    }
    state.kept = kept;
    // Forget warnings about objects that changed or went away, so the set stays bounded.
    if prune_warned {
        state.warned.retain(|(k, rv, _)| current.contains(&(k.clone(), rv.clone())));
    }
    for (fleet, key) in &held {
        let Some((ing, rv)) = objects.get(key) else { continue };
        let said = (key, rv.as_str(), "Throttled", state.churn.note(fleet, &key.namespace));
        tell(warnings, &mut state.warned, ing, said, "ingress changes held").await;
    }
    // What a pass costs before it publishes; only Ingresses whose inputs changed are resolved.
    debug!(
        ingresses = desired.len(),
        changed = actions.len(),
        resolved_anew = state.memo.fresh(),
        resolve_ms = resolved.as_secs_f64() * 1000.0,
        pass_ms = started.elapsed().as_secs_f64() * 1000.0,
        held = held.len(),
        "pass over the cluster's objects"
    );
    let bulk = index::bulk_deletes(&actions, args.bulk_delete_threshold);
    for (fleet, keys) in &bulk {
        warn!(fleet = %fleet, ingresses = keys.len(),
              "many Ingresses gone at once: publishing a snapshot for the renderer's guard to check instead of deletes");
    }
    for action in actions {
        if let Action::Delete { fleet, key } = &action
            && bulk.get(fleet).is_some_and(|keys| keys.contains(key))
        {
            // The snapshot below leaves it out of `live`.
            index::record(&mut state.published, &action);
            state.snapshot_due = true;
            continue;
        }
        let (fleet, key, msg) = match &action {
            Action::Upsert(r) => (
                r.fleet.clone(),
                r.key.clone(),
                crate::core::route_events::route_event(
                    &r.fleet,
                    &r.key,
                    r.created_unix,
                    &r.resource_version,
                    RouteChange::Upsert { routes: r.routes.to_vec(), tls: r.tls.clone() },
                    (state.epoch, state.cluster.as_ref()),
                ),
            ),
            Action::Delete { fleet, key } => (
                fleet.clone(),
                key.clone(),
                crate::core::route_events::route_event(
                    fleet,
                    key,
                    0,
                    "",
                    RouteChange::Delete,
                    (state.epoch, state.cluster.as_ref()),
                ),
            ),
        };
        let id = state.next_msg_id();
        let published = bus.publish(hafleet_proto::routes_subject(&fleet), &id, msg.encode()).await;
        let seq = match published {
            Ok(seq) => seq,
            Err(e) => {
                // The publish may or may not have been stored: the next sync sends what is
                // desired for this Ingress again (an upsert or a delete repeated is harmless).
                index::record_unknown(&mut state.published, &action);
                return Err(e.into());
            }
        };
        let op = if matches!(action, Action::Upsert(_)) { "upsert" } else { "delete" };
        info!(fleet = %fleet, ingress = %key, op, stream_seq = seq, "route event published");
        hafleet_runtime::health::Health::global().count(ROUTE_EVENTS, &[("op", op)], 1.0);
        index::record(&mut state.published, &action);
    }
    if state.snapshot_due {
        send_snapshot(bus, state).await?;
    }
    for (fleet, (ns, name)) in &args.default_cert {
        send_default_cert(bus, state, fleet, (ns, name), now_unix).await?;
    }
    if let Some(store) = &caches.settings {
        let fleets = state.published.values().map(|(fleet, _)| fleet.clone());
        send_settings(bus, warnings, state, &store.state(), fleets.collect()).await?;
    }
    // Every Ingress routed on a fleet with addresses shows them, once its routes are out.
    for (key, (ing, _)) in &objects {
        let Some(Desired::Routed(r)) = desired.get(key) else { continue };
        if !state.published.contains_key(key) {
            continue; // held
        }
        let Some(addresses) = args.fleet_addresses.get(&r.fleet) else { continue };
        if !r.routes.is_empty() && !crate::core::status::shows(ing, addresses) {
            warnings.set_status(ing, addresses.clone()).await;
        }
    }
    Ok(())
}

/// Posts a Warning Event (`reason`, `note`) on `ing` once per Ingress, generation and note,
/// logging it as `what` and counting it. One the API server did not take is tried again on
/// the next pass.
pub(crate) async fn tell(
    warnings: &Warnings,
    warned: &mut BTreeSet<(IngressKey, String, String)>,
    ing: &k8s_openapi::api::networking::v1::Ingress,
    (key, rv, reason, note): (&IngressKey, &str, &'static str, String),
    what: &'static str,
) {
    if !warned.insert((key.clone(), rv.to_owned(), note.clone())) {
        return;
    }
    warn!(ingress = %key, reason, note = %note, "{what}");
    hafleet_runtime::health::Health::global().count(WARNINGS, &[("reason", reason)], 1.0);
    if !warnings.warn(ing, reason, note.clone()).await {
        warned.remove(&(key.clone(), rv.to_owned(), note));
    }
}

/// Publishes `fleet`'s default certificate when it is not the one last published. A Secret
/// that cannot be used is logged (there is no Ingress to tell) and the fleet keeps the one it
/// had.
async fn send_default_cert(
    bus: &Bus,
    state: &mut State,
    fleet: &FleetName,
    (ns, name): (&str, &str),
    now_unix: i64,
) -> anyhow::Result<()> {
    let cert = match state.tls.sealed(fleet, ns, name, now_unix) {
        Ok(cert) => cert,
        Err(why) => {
            if let Some(why) = why
                && state.tls.default_warned.insert((fleet.clone(), why.clone()))
            {
                warn!(fleet = %fleet, secret = %format!("{ns}/{name}"), %why, "the fleet's default certificate is not usable; it keeps the one it had");
            }
            return Ok(());
        }
    };
    if state.tls.defaults.get(fleet) == Some(&cert) {
        return Ok(());
    }
    let msg = RouteMessage::DefaultCert(hafleet_proto::DefaultCert {
        schema: hafleet_proto::route_schema(state.cluster.as_ref()),
        epoch: state.epoch,
        cluster: state.cluster.clone(),
        fleet: fleet.clone(),
        cert: Some(cert.clone()),
    });
    let id = state.next_msg_id();
    let seq = bus.publish(hafleet_proto::routes_subject(fleet), &id, msg.encode()).await?;
    info!(fleet = %fleet, fingerprint = %cert.fingerprint, stream_seq = seq, "default certificate published");
    state.tls.defaults.insert(fleet.clone(), cert);
    Ok(())
}

/// Publishes each fleet's settings that changed, and tells the ConfigMaps' admin what was
/// taken and what was not.
async fn send_settings(
    bus: &Bus,
    warnings: &Warnings,
    state: &mut State,
    config_maps: &[std::sync::Arc<k8s_openapi::api::core::v1::ConfigMap>],
    fleets: Vec<FleetName>,
) -> anyhow::Result<()> {
    let at = (state.epoch, state.cluster.as_ref());
    let plan = state.settings.plan(config_maps, fleets, at);
    for (cm, warning, reason, note) in plan.tell {
        warn!(configmap = ?cm.metadata.name, note = %note, "fleet settings refused");
        warnings.post(&*cm, warning, reason, note).await;
    }
    for update in plan.publish {
        let fleet = update.fleet.clone();
        let msg = RouteMessage::Settings(update.clone());
        let id = state.next_msg_id();
        let seq = bus.publish(hafleet_proto::routes_subject(&fleet), &id, msg.encode()).await?;
        let set = update.settings.describe().join(" ");
        info!(fleet = %fleet, stream_seq = seq, settings = %set, "fleet settings published");
        state.settings.published(&update);
        if let Some(cm) = crate::core::fleet_settings::InForce::source(config_maps, &update) {
            let note = format!(
                "published for fleet {fleet}: {}",
                if set.is_empty() { "the defaults" } else { &set }
            );
            warnings.post(&**cm, false, "SettingsPublished", note).await;
        }
    }
    Ok(())
}

/// Publishes the node set that every route's servers come from.
async fn send_nodes(bus: &Bus, state: &mut State, nodes: Vec<NodeAddr>) -> anyhow::Result<()> {
    let msg = RouteMessage::Nodes(NodesUpdate {
        schema: hafleet_proto::route_schema(state.cluster.as_ref()),
        epoch: state.epoch,
        cluster: state.cluster.clone(),
        nodes: nodes.clone(),
    });
    let id = state.next_msg_id();
    state.nodes = None;
    let seq = bus
        .publish(hafleet_proto::routes_nodes_subject(state.cluster.as_ref()), &id, msg.encode())
        .await?;
    info!(nodes = nodes.len(), stream_seq = seq, "nodes published");
    state.nodes = Some(nodes);
    Ok(())
}

/// Publishes a snapshot: every Ingress this watcher knows, live or kept (in parts when it is
/// larger than a NATS message). The renderer sweeps whatever else it holds.
async fn send_snapshot(bus: &Bus, state: &mut State) -> anyhow::Result<()> {
    let cluster = state.cluster.clone();
    let kept: BTreeSet<IngressKey> = state.kept.union(&state.held_new).cloned().collect();
    let snapshot =
        crate::app::snapshot::build(&state.published, &kept, state.epoch, cluster.as_ref());
    let subject = hafleet_proto::routes_snapshot_subject(cluster.as_ref());
    let sent =
        crate::app::snapshot::publish(bus, &subject, &snapshot, || state.next_msg_id()).await?;
    info!(
        epoch = state.epoch,
        ingresses = state.published.len(),
        kept = state.kept.len(),
        stream_seq = sent.seq,
        parts = sent.parts,
        bytes = sent.bytes,
        "snapshot published"
    );
    state.snapshot_due = false;
    Ok(())
}
