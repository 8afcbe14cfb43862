//! What the watcher keeps between passes: what it published and under which epoch, what it
//! told, the certificates it read and sealed, and the policies, budgets and settings in force.

use crate::core::index::Published;
use crate::core::resolve;
use crate::k8s::watch as kube_adapter;
use hafleet_proto::{FleetName, IngressKey, NodeAddr};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tracing::warn;

/// The routes-stream sequence of each object's last published change, by object and fleet.
/// The newest routes-stream sequence published of each Gateway API route, per fleet: looked
/// up for every route at every pass, so by borrowed key.
pub(crate) type RouteSeqs =
    std::collections::HashMap<IngressKey, Vec<(FleetName, u64)>, foldhash::fast::RandomState>;

/// [`RouteSeqs`] of `key` on `fleet` (0: none published).
pub(crate) fn route_seq(seqs: &RouteSeqs, key: &IngressKey, fleet: &FleetName) -> u64 {
    seqs.get(key).and_then(|v| v.iter().find(|(f, _)| f == fleet)).map_or(0, |(_, s)| *s)
}

pub(crate) struct State {
    /// `--cluster-id`: stamped on everything published, which this watcher's view of its one
    /// cluster does not carry.
    pub(crate) cluster: Option<hafleet_proto::ClusterId>,
    pub(crate) epoch: u64,
    pub(crate) seq: u64,
    pub(crate) published: Published,
    /// The node set last published (and acked); `None` before the first or after a failed
    /// publish, so that it is sent (again).
    pub(crate) nodes: Option<Vec<NodeAddr>>,
    /// Ingresses meant for hafleet but refused as they stand: they keep their routes.
    pub(crate) kept: BTreeSet<IngressKey>,
    /// Ingresses the churn budget holds that this run never published: listed as kept in a
    /// snapshot (nothing sweeps them), but their going out is no reason for one.
    pub(crate) held_new: BTreeSet<IngressKey>,
    /// A snapshot must be published after the next successful sync.
    pub(crate) snapshot_due: bool,
    /// With leader election: the lease this replica holds. Nothing is published unless it
    /// holds.
    pub(crate) leader: Option<crate::k8s::elector::Leadership>,
    /// (ingress, generation or resourceVersion, reason) already reported, so each is said once.
    pub(crate) warned: BTreeSet<(IngressKey, String, String)>,
    pub(crate) tls: TlsState,
    /// Each Ingress's resolution, redone only when it or what it names changed.
    pub(crate) memo: resolve::Memo,
    /// Each routed object's certificates as sealed in, worked out again only when its routes,
    /// its `spec.tls` or a Secret it names changed.
    pub(crate) seal_memo: crate::core::pass::SealMemo,
    /// Each EndpointSlice as pods mode reads it, read again only when it changed.
    pub(crate) slices: crate::core::pods::SliceCache,
    /// With `--tenancy-policy`: the policy in force.
    pub(crate) policy: crate::core::policy::InForce,
    /// `--namespace-changes-per-minute`, once the initial state is out.
    pub(crate) churn: crate::core::churn::Budget,
    /// While a renderer's resync is being answered: the churn budget to go back to.
    pub(crate) restating: Option<u32>,
    /// With `--settings-namespace`: the fleets' settings read and published.
    pub(crate) settings: crate::core::fleet_settings::InForce,
    /// The routes-stream sequence of each object's last published change on each fleet since
    /// the initial state (that one restates what the fleets run): what a Gateway's
    /// `Programmed` waits for, on the Gateway's fleet.
    pub(crate) route_seqs: RouteSeqs,
    /// What each fleet's hosts all run, as the fleets' reports tell ([`crate::app::notices`]).
    pub(crate) served: Served,
    /// Gateway API statuses to write, by a task of their own.
    pub(crate) statuses: StatusQueue,
    /// What the last pass read of the Gateway API (its Gateways and routes, and the routes
    /// attached to each Gateway): when only what the fleets serve changed, the Gateways'
    /// `Programmed` is decided again from it, without a pass.
    pub(crate) last_gateway: Option<LastGateway>,
}

/// What the last pass read of the Gateway API (its Gateways and routes), and what the routes
/// add up to on each Gateway. The GatewayClasses are read from the cache when used.
pub(crate) type LastGateway = (crate::core::pass::GatewayPass, super::effects::Attached);

/// Which Gateway API object a status is for: (kind, namespace, name).
type StatusOf = (&'static str, Option<String>, String);

/// The Gateway API statuses a pass decided, written by a task of their own ([`StatusQueue::
/// spawn_writer`], 8 at a time) so that a pass never waits on them: 10,000 HTTPRoutes are
/// 10,000 requests. The newest status of an object replaces one not written yet.
#[derive(Clone, Default)]
pub(crate) struct StatusQueue {
    pending: std::sync::Arc<std::sync::Mutex<BTreeMap<StatusOf, serde_json::Value>>>,
    wake: std::sync::Arc<tokio::sync::Notify>,
    /// Each route's status as last decided, by the route object (its address in the watch
    /// cache, which replaces an object on every change): the object and what its parents were
    /// told. A pass decides again only a route whose object or parents changed (10,000 routes
    /// are 10,000 statuses to build, and 20,000 keys to copy if keyed by name); a write that
    /// fails forgets it.
    pub(crate) decided: std::sync::Arc<std::sync::Mutex<Decided>>,
}

/// [`StatusQueue::decided`].
pub(crate) type Decided = std::collections::HashMap<
    usize,
    (
        std::sync::Arc<kube::api::DynamicObject>,
        std::sync::Arc<Vec<crate::core::gateway::route::ParentStatus>>,
    ),
    foldhash::fast::RandomState,
>;

impl StatusQueue {
    pub(crate) fn push(
        &self,
        kind: &'static str,
        ns: Option<&str>,
        name: &str,
        status: serde_json::Value,
    ) {
        let key = (kind, ns.map(str::to_owned), name.to_owned());
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).insert(key, status);
        self.wake.notify_one();
    }

    /// Writes what is pushed, until the process ends. A write that fails is logged; the next
    /// pass decides the status again (the object still says the old one).
    pub(crate) fn spawn_writer(&self, warnings: crate::k8s::events::Warnings) {
        let queue = self.clone();
        tokio::spawn(async move {
            use futures::StreamExt as _;
            loop {
                queue.wake.notified().await;
                let batch =
                    std::mem::take(&mut *queue.pending.lock().unwrap_or_else(|p| p.into_inner()));
                let warnings = &warnings;
                futures::stream::iter(batch)
                    .for_each_concurrent(8, |((kind, ns, name), status)| {
                        let decided = &queue.decided;
                        async move {
                            let at = (ns.as_deref(), name.as_str());
                            if !warnings.set_gateway_status(kind, at, status).await
                                && kind.ends_with("Route")
                            {
                                let same = |r: &kube::api::DynamicObject| {
                                    r.metadata.namespace == ns
                                        && r.metadata.name.as_deref() == Some(name.as_str())
                                        && r.types.as_ref().is_none_or(|t| t.kind == kind)
                                };
                                let mut decided = decided.lock().unwrap_or_else(|p| p.into_inner());
                                decided.retain(|_, (r, _)| !same(r));
                            }
                        }
                    })
                    .await;
            }
        });
    }
}

/// What each fleet serves, shared by the task that reads the fleets' reports and the passes
/// (which it wakes when it changes).
#[derive(Clone, Default)]
pub(crate) struct Served {
    pub(crate) fleets:
        std::sync::Arc<std::sync::Mutex<BTreeMap<FleetName, crate::core::served::Served>>>,
    pub(crate) changed: std::sync::Arc<tokio::sync::Notify>,
}

/// A Secret's certificate as read: the resourceVersion, and the checked certificate or why not.
pub(crate) type ReadCert =
    (String, Result<std::sync::Arc<crate::core::tls_secrets::CheckedCert>, String>);

/// What is kept per Secret, by namespace then name: looked up with the names as borrowed
/// (`&str`), as every pass does for every TLS Ingress, without making a key.
#[derive(Debug)]
pub(crate) struct BySecret<V>(HashMap<String, HashMap<String, V, Hasher>, Hasher>);

type Hasher = foldhash::fast::RandomState;

impl<V> Default for BySecret<V> {
    fn default() -> Self {
        BySecret(HashMap::default())
    }
}

impl<V> BySecret<V> {
    pub(crate) fn get(&self, ns: &str, name: &str) -> Option<&V> {
        self.0.get(ns)?.get(name)
    }

    pub(crate) fn insert(&mut self, ns: &str, name: &str, v: V) {
        self.0.entry(ns.to_owned()).or_default().insert(name.to_owned(), v);
    }

    /// Keeps the entries of (namespace, name) in `wanted`.
    pub(crate) fn retain_in(&mut self, wanted: &BTreeSet<(String, String)>) {
        let wanted: std::collections::HashSet<(&str, &str), Hasher> =
            wanted.iter().map(|(ns, name)| (ns.as_str(), name.as_str())).collect();
        for (ns, names) in self.0.iter_mut() {
            names.retain(|name, _| wanted.contains(&(ns.as_str(), name.as_str())));
        }
        self.0.retain(|_, names| !names.is_empty());
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.0.values().flat_map(HashMap::values)
    }
}

/// What the watcher keeps for TLS: the checked certificates of the Secrets that Ingresses of
/// fleets with a sealing key name (only those), by (namespace, name), with the resourceVersion
/// they were read at; and each chain sealed once per fleet (sealing anew would change its
/// bytes, and so the version, for nothing).
pub(crate) struct TlsState {
    pub(crate) client: Option<kube::Client>,
    pub(crate) seal_to: BTreeMap<FleetName, crate::core::tls_secrets::SealTo>,
    pub(crate) certs: BySecret<ReadCert>,
    /// Per fleet, each chain (by its sha256) sealed to it.
    pub(crate) seals:
        HashMap<FleetName, HashMap<String, std::sync::Arc<hafleet_proto::SealedCert>, Hasher>>,
    /// The default certificate last published (and acked) per fleet.
    pub(crate) defaults: BTreeMap<FleetName, hafleet_proto::SealedCert>,
    /// (fleet, why) already logged for a default certificate that cannot be used.
    pub(crate) default_warned: BTreeSet<(FleetName, String)>,
}

impl TlsState {
    pub(crate) fn default_for(
        seal_to: impl IntoIterator<Item = (FleetName, crate::core::tls_secrets::SealTo)>,
    ) -> TlsState {
        TlsState {
            client: None,
            seal_to: seal_to.into_iter().collect(),
            certs: BySecret::default(),
            seals: HashMap::new(),
            defaults: BTreeMap::new(),
            default_warned: BTreeSet::new(),
        }
    }

    /// Reads (again) the Secrets among `wanted` whose resourceVersion in the metadata cache is
    /// not the one read, and forgets the Secrets no longer wanted.
    pub(crate) async fn refresh(
        &mut self,
        meta: &crate::k8s::watch::TlsSecrets,
        wanted: &BTreeSet<(String, String)>,
        now_unix: i64,
    ) {
        self.certs.retain_in(wanted);
        let chains: BTreeSet<&str> = self
            .certs
            .values()
            .filter_map(|(_, c)| c.as_ref().ok().map(|c| c.chain_sha256.as_str()))
            .collect();
        for sealed in self.seals.values_mut() {
            sealed.retain(|chain, _| chains.contains(chain.as_str()));
        }
        let Some(client) = &self.client else { return };
        for (ns, name) in wanted {
            if !meta.reads(ns) {
                let why = format!(
                    "the watcher reads no Secret of namespace {ns} (it is not in its \
                     --tls-namespaces)"
                );
                self.certs.insert(ns, name, (String::new(), Err(why)));
                continue;
            }
            let Some(rv) =
                meta.get(ns, name).map(|m| m.metadata.resource_version.clone().unwrap_or_default())
            else {
                let why = format!(
                    "no Secret of type {} by that name in namespace {ns}",
                    crate::core::tls_secrets::SECRET_TYPE
                );
                self.certs.insert(ns, name, (String::new(), Err(why)));
                continue;
            };
            if self.certs.get(ns, name).is_some_and(|(seen, _)| *seen == rv) {
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
            self.certs.insert(ns, name, checked);
        }
    }

    /// Why Secret `name` in `ns` cannot be served on `fleet`, if it cannot (`None` too when it
    /// was not read yet).
    pub(crate) fn unusable(
        &self,
        fleet: &FleetName,
        ns: &str,
        name: &str,
        now_unix: i64,
    ) -> Option<String> {
        if !self.seal_to.contains_key(fleet) {
            return Some(format!(
                "TLS is off on fleet {fleet} (the watcher has no --seal-to for it)"
            ));
        }
        match &self.certs.get(ns, name)?.1 {
            Err(why) => Some(why.clone()),
            Ok(cert) => cert.usable_at(now_unix).err().map(|e| e.to_string()),
        }
    }

    /// The certificate of Secret `name` in `ns`, sealed to `fleet`; or why not, with the
    /// Secret's resourceVersion (so a Secret that breaks again is said again), or `None` when
    /// there is nothing to tell its owner (not read yet: the API server did not answer).
    pub(crate) fn sealed(
        &mut self,
        fleet: &FleetName,
        ns: &str,
        name: &str,
        now_unix: i64,
    ) -> crate::core::pass::Looked {
        let to = self.seal_to.get(fleet).ok_or(None)?;
        let (rv, checked) = self.certs.get(ns, name).ok_or(None)?;
        let at = |why: String| {
            Some(if rv.is_empty() { why } else { format!("{why} (resourceVersion {rv})") })
        };
        let cert = checked.as_ref().map_err(|why| at(why.clone()))?;
        cert.usable_at(now_unix).map_err(|e| at(e.to_string()))?;
        if let Some(sealed) = self.seals.get(fleet).and_then(|s| s.get(&cert.chain_sha256)) {
            return Ok(sealed.clone());
        }
        let sealed = std::sync::Arc::new(cert.seal(to));
        let of_fleet = self.seals.entry(fleet.clone()).or_default();
        of_fleet.insert(cert.chain_sha256.clone(), sealed.clone());
        Ok(sealed)
    }
}

impl State {
    pub(crate) fn next_msg_id(&mut self) -> String {
        self.seq += 1;
        match &self.cluster {
            Some(c) => format!("watcher-{c}-{}-{}", self.epoch, self.seq),
            None => format!("watcher-{}-{}", self.epoch, self.seq),
        }
    }
}
