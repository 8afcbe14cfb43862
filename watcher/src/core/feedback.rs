//! Feedback from the fleets on the Ingresses: which version of their change went live where,
//! and what failed. Pure: [`Feedback`] turns config versions (which Ingresses caused each)
//! and apply reports into [`Notice`]s, which the watcher posts as Events on those Ingresses
//! ([`crate::app::notices`]).
//!
//! - A failure on a host (refused, rolled back, unreachable…) is told once per host and
//!   version, as a Warning: "version 43 rolled back on lb-2 at probe: …".
//! - Once every host of the fleet (as many as the report says the inventory has, or, from
//!   appliers that do not say, the hosts seen reporting) has reported a version, it is told
//!   once, as
//!   Normal "version 42 live on 2/2 hosts of fleet edge" (Warning `PartlyLive` if not all).
//! - Reports older than the watcher's start (read to learn each fleet's hosts) tell nothing,
//!   so a new leader does not repeat what the last one said.
//! - A version caused by many Ingresses is told on the first [`MAX_INGRESSES`] of them.
//! - Where several clusters feed a fleet, each watcher tells its own cluster's Ingresses only.

use hafleet_proto::{ApplyOutcome, ApplyReport, ApplyStage, ConfigVersion, FleetName, IngressKey};
use std::collections::{BTreeMap, BTreeSet};

/// Most Ingresses one version's notice is posted on.
pub const MAX_INGRESSES: usize = 100;
/// Versions remembered per fleet (their causes and outcomes).
const KEEP_VERSIONS: usize = 64;

/// An Event to post on some Ingresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub ingresses: Vec<IngressKey>,
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

#[derive(Debug, Default)]
struct VersionState {
    ingresses: Vec<IngressKey>,
    outcomes: BTreeMap<String, bool>,
    told_live: bool,
}

/// What the watcher knows of each fleet's versions and hosts.
#[derive(Debug, Default)]
pub struct Feedback {
    /// The watcher's `--cluster-id`: the causes of other clusters are not its to tell.
    cluster: Option<hafleet_proto::ClusterId>,
    hosts: BTreeMap<FleetName, BTreeSet<String>>,
    versions: BTreeMap<FleetName, BTreeMap<u64, VersionState>>,
    /// Fresh reports of versions not seen yet (they come on another subject, and may overtake
    /// their version), taken again when it comes.
    early: Vec<ApplyReport>,
}

/// Most early reports kept.
const KEEP_EARLY: usize = 1000;

impl Feedback {
    /// Feedback for the Ingresses of `cluster` (`None`: of watchers without a cluster id).
    pub fn for_cluster(cluster: Option<hafleet_proto::ClusterId>) -> Self {
        Feedback { cluster, ..Feedback::default() }
    }

    /// Remembers which Ingresses caused `v`; returns what reports that came before it tell.
    pub fn on_version(&mut self, v: &ConfigVersion) -> Vec<Notice> {
        self.remember(v);
        // An Ingress the renderer quarantined is told why, whatever the hosts say next.
        let quarantined = v.causes.iter().filter(|c| c.what == "quarantine").filter_map(|c| {
            let key = c.ingress.as_ref().filter(|k| k.is_in(self.cluster.as_ref()))?;
            Some(Notice {
                ingresses: vec![key.clone().in_cluster(None)],
                warning: true,
                reason: "Quarantined",
                note: format!(
                    "taken out of fleet {} until it is changed: {}",
                    v.fleet,
                    c.note.as_deref().unwrap_or("HAProxy refused the lines it made")
                ),
            })
        });
        let quarantined: Vec<Notice> = quarantined.collect();
        let (now, later): (Vec<ApplyReport>, Vec<ApplyReport>) = std::mem::take(&mut self.early)
            .into_iter()
            .partition(|r| r.fleet == v.fleet && r.version == v.version);
        self.early = later;
        let told = now.iter().flat_map(|r| self.on_report(r, true)).collect::<Vec<_>>();
        quarantined.into_iter().chain(told).collect()
    }

    fn remember(&mut self, v: &ConfigVersion) {
        let mut ingresses: Vec<IngressKey> = Vec::new();
        let own = v.causes.iter().filter_map(|c| c.ingress.as_ref());
        // As the watcher's caches name them: without the cluster.
        let own =
            own.filter(|k| k.is_in(self.cluster.as_ref())).map(|k| k.clone().in_cluster(None));
        for key in own {
            if !ingresses.contains(&key) {
                ingresses.push(key);
            }
        }
        let versions = self.versions.entry(v.fleet.clone()).or_default();
        versions.entry(v.version).or_default().ingresses = ingresses;
        while versions.len() > KEEP_VERSIONS {
            versions.pop_first();
        }
    }

    /// Takes a report; `fresh` when it is newer than the watcher's start. Returns what to tell.
    pub fn on_report(&mut self, r: &ApplyReport, fresh: bool) -> Vec<Notice> {
        let host = r.host.to_string();
        self.hosts.entry(r.fleet.clone()).or_default().insert(host.clone());
        // A drift report is about the host, not about a change someone made.
        let drift = matches!(r.outcome, ApplyOutcome::Failed { stage: ApplyStage::Drift, .. });
        if !fresh || drift {
            return vec![];
        }
        let Some(state) = self.versions.get_mut(&r.fleet).and_then(|v| v.get_mut(&r.version))
        else {
            if self.early.len() < KEEP_EARLY {
                self.early.push(r.clone());
            }
            return vec![];
        };
        if state.ingresses.is_empty() {
            return vec![];
        }
        let ingresses: Vec<IngressKey> =
            state.ingresses.iter().take(MAX_INGRESSES).cloned().collect();
        let mut out = Vec::new();
        let ok = matches!(r.outcome, ApplyOutcome::Applied | ApplyOutcome::Unchanged);
        let first = state.outcomes.insert(host.clone(), ok) != Some(ok);
        if let (ApplyOutcome::Failed { stage, message, restored }, true) = (&r.outcome, first) {
            let (reason, what) = match (stage, restored) {
                (ApplyStage::Signature, _) => ("VersionRefused", "refused"),
                (_, true) => ("RolledBack", "rolled back"),
                (ApplyStage::Validate, _) => ("ConfigRefused", "refused by HAProxy"),
                _ => ("ApplyFailed", "failed"),
            };
            out.push(Notice {
                ingresses: ingresses.clone(),
                warning: true,
                reason,
                note: format!(
                    "version {} {what} on {host} at {}: {message}",
                    r.version,
                    stage.as_str()
                ),
            });
        }
        // The inventory's count when the applier gives it (a host removed from the inventory
        // still has reports for days); else the hosts seen report.
        let known = match r.fleet_hosts {
            0 => self.hosts.get(&r.fleet).map(BTreeSet::len).unwrap_or(0),
            n => n as usize,
        };
        if !state.told_live && state.outcomes.len() >= known {
            state.told_live = true;
            let live = state.outcomes.values().filter(|ok| **ok).count();
            out.push(Notice {
                ingresses,
                warning: live < known,
                reason: if live < known { "PartlyLive" } else { "Live" },
                note: format!(
                    "version {} live on {live}/{known} hosts of fleet {}",
                    r.version, r.fleet
                ),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hafleet_proto::{Bundle, Cause, HostName, SCHEMA_VERSION};

    fn version(n: u64, ingresses: &[&str]) -> ConfigVersion {
        ConfigVersion {
            causes: ingresses
                .iter()
                .map(|name| Cause {
                    stream_seq: 1,
                    ingress: Some(IngressKey::new("shop", name).unwrap()),
                    what: "upsert".into(),
                    resource_version: None,
                    added: vec![],
                    removed: vec![],
                    note: None,
                })
                .collect(),
            ..ConfigVersion::inline(FleetName::new("edge").unwrap(), n, Bundle::default())
        }
    }

    fn report(host: &str, n: u64, outcome: ApplyOutcome) -> ApplyReport {
        ApplyReport {
            schema: SCHEMA_VERSION,
            fleet: FleetName::new("edge").unwrap(),
            host: HostName::new(host).unwrap(),
            version: n,
            sha256: String::new(),
            outcome,
            finished_unix_ms: 0,
            duration_ms: 0,
            reloads: 0,
            runtime_commands: 0,
            bridged: 0,
            sent_bytes: 0,
            drift: None,
            fleet_hosts: 2,
            quarantined: vec![],
        }
    }

    fn learn_hosts(f: &mut Feedback) {
        for host in ["lb-1", "lb-2"] {
            assert!(f.on_report(&report(host, 1, ApplyOutcome::Applied), false).is_empty());
        }
    }

    #[test]
    fn a_version_is_told_live_once_every_known_host_reported_it() {
        let mut f = Feedback::default();
        learn_hosts(&mut f);
        assert!(f.on_version(&version(2, &["web", "web", "api"])).is_empty());
        assert!(f.on_report(&report("lb-1", 2, ApplyOutcome::Applied), true).is_empty());
        let told = f.on_report(&report("lb-2", 2, ApplyOutcome::Unchanged), true);
        assert_eq!(told.len(), 1, "{told:?}");
        assert_eq!(told[0].note, "version 2 live on 2/2 hosts of fleet edge");
        assert_eq!((told[0].reason, told[0].warning), ("Live", false));
        assert_eq!(told[0].ingresses.len(), 2, "each Ingress once");
        // A retry's report does not say it again.
        assert!(f.on_report(&report("lb-2", 2, ApplyOutcome::Applied), true).is_empty());
    }

    /// A version made by Ingresses of two clusters: each cluster's watcher tells its own, by
    /// the names its caches know them by.
    #[test]
    fn each_clusters_watcher_tells_its_own_ingresses_only() {
        let east = hafleet_proto::ClusterId::new("east").unwrap();
        let mut v = version(2, &["web", "api"]);
        v.causes[1].ingress = v.causes[1].ingress.take().map(|k| k.in_cluster(Some(&east)));
        for (cluster, want) in [(None, "shop/web"), (Some(east), "shop/api")] {
            let mut f = Feedback::for_cluster(cluster);
            learn_hosts(&mut f);
            assert!(f.on_version(&v).is_empty());
            f.on_report(&report("lb-1", 2, ApplyOutcome::Applied), true);
            let told = f.on_report(&report("lb-2", 2, ApplyOutcome::Applied), true);
            let named: Vec<String> = told[0].ingresses.iter().map(|k| k.to_string()).collect();
            assert_eq!(named, [want]);
        }
    }

    #[test]
    fn a_failure_is_told_once_per_host_and_the_version_as_partly_live() {
        let mut f = Feedback::default();
        learn_hosts(&mut f);
        assert!(f.on_version(&version(3, &["web"])).is_empty());
        let rolled = ApplyOutcome::Failed {
            stage: ApplyStage::Probe,
            message: "GET /healthz got 503".into(),
            restored: true,
        };
        let told = f.on_report(&report("lb-1", 3, rolled.clone()), true);
        assert_eq!(told.len(), 1);
        assert_eq!(told[0].reason, "RolledBack");
        assert_eq!(told[0].note, "version 3 rolled back on lb-1 at probe: GET /healthz got 503");
        assert!(f.on_report(&report("lb-1", 3, rolled), true).is_empty(), "once per host");
        let told = f.on_report(&report("lb-2", 3, ApplyOutcome::Applied), true);
        assert_eq!(told.len(), 1);
        assert_eq!((told[0].reason, told[0].warning), ("PartlyLive", true));
        assert_eq!(told[0].note, "version 3 live on 1/2 hosts of fleet edge");
    }

    #[test]
    fn old_reports_drift_and_versions_no_ingress_caused_tell_nothing() {
        let mut f = Feedback::default();
        learn_hosts(&mut f);
        assert!(f.on_version(&version(4, &["web"])).is_empty());
        assert!(f.on_report(&report("lb-1", 4, ApplyOutcome::Applied), false).is_empty());
        let drift = ApplyOutcome::Failed {
            stage: ApplyStage::Drift,
            message: "edited".into(),
            restored: false,
        };
        assert!(f.on_report(&report("lb-2", 4, drift), true).is_empty());
        assert!(f.on_version(&version(5, &[])).is_empty());
        assert!(f.on_report(&report("lb-1", 5, ApplyOutcome::Applied), true).is_empty());
    }

    #[test]
    fn a_host_removed_from_the_inventory_does_not_hold_back_live() {
        let mut f = Feedback::default();
        learn_hosts(&mut f);
        assert!(f.on_report(&report("lb-3", 1, ApplyOutcome::Applied), false).is_empty());
        assert!(f.on_version(&version(7, &["web"])).is_empty());
        // Reports say the inventory has 2 hosts now: lb-3's old reports do not count.
        assert!(f.on_report(&report("lb-1", 7, ApplyOutcome::Applied), true).is_empty());
        let told = f.on_report(&report("lb-2", 7, ApplyOutcome::Applied), true);
        assert_eq!(told.len(), 1, "{told:?}");
        assert_eq!(told[0].note, "version 7 live on 2/2 hosts of fleet edge");
    }

    #[test]
    fn reports_that_overtake_their_version_are_told_when_it_comes() {
        let mut f = Feedback::default();
        learn_hosts(&mut f);
        assert!(f.on_report(&report("lb-1", 6, ApplyOutcome::Applied), true).is_empty());
        assert!(f.on_report(&report("lb-2", 6, ApplyOutcome::Applied), true).is_empty());
        let told = f.on_version(&version(6, &["web"]));
        assert_eq!(told.len(), 1, "{told:?}");
        assert_eq!(told[0].note, "version 6 live on 2/2 hosts of fleet edge");
    }
}
