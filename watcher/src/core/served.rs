//! Which version each fleet serves on all its hosts, for the Gateways' `Programmed`. Pure:
//! config versions and apply reports in (as [`crate::core::feedback`] reads them), a
//! [`Served`] per fleet out.
//!
//! A fleet serves version V when as many hosts as the latest report says the inventory has
//! last reported V, or a newer version, applied (or unchanged). A newer version not live
//! everywhere yet does not undo that: whether a Gateway's routes are in what is served is
//! the routes-stream sequence's to say ([`Served::seq`]). Reports older than the watcher count too: a new leader knows what the hosts
//! run. A version read since the watcher started also says how far into the routes stream it
//! reaches (its newest cause's stream sequence); one from before does not.

use hafleet_proto::{ApplyOutcome, ApplyReport, ApplyStage, ConfigVersion, FleetName};
use std::collections::BTreeMap;

/// What a fleet's hosts all run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    pub version: u64,
    pub hosts: usize,
    /// The newest routes-stream sequence among the causes of the versions up to it that the
    /// watcher read (`None`: none read; it started later).
    pub seq: Option<u64>,
}

/// Versions remembered per fleet.
const KEEP: usize = 256;

#[derive(Debug, Default)]
pub struct Fleets {
    /// Per fleet: each host's last report (version, applied or unchanged).
    hosts: BTreeMap<FleetName, BTreeMap<String, (u64, bool)>>,
    /// Per fleet: the inventory's size, as the latest report says (0: not said).
    inventory: BTreeMap<FleetName, usize>,
    /// Per fleet: each version read and its newest cause's stream sequence.
    versions: BTreeMap<FleetName, BTreeMap<u64, u64>>,
}

impl Fleets {
    pub fn on_version(&mut self, v: &ConfigVersion) {
        let seq = v.causes.iter().map(|c| c.stream_seq).max().unwrap_or(0);
        let versions = self.versions.entry(v.fleet.clone()).or_default();
        versions.insert(v.version, seq);
        while versions.len() > KEEP {
            versions.pop_first();
        }
    }

    pub fn on_report(&mut self, r: &ApplyReport) {
        // A drift report is about the host's files, not about a version it took.
        if matches!(r.outcome, ApplyOutcome::Failed { stage: ApplyStage::Drift, .. }) {
            return;
        }
        let ok = matches!(r.outcome, ApplyOutcome::Applied | ApplyOutcome::Unchanged);
        let hosts = self.hosts.entry(r.fleet.clone()).or_default();
        hosts.insert(r.host.to_string(), (r.version, ok));
        if r.fleet_hosts > 0 {
            self.inventory.insert(r.fleet.clone(), r.fleet_hosts as usize);
        }
    }

    /// What `fleet` serves on all its hosts: the newest version that as many hosts as the
    /// inventory has run, or a newer one (a version holds every change before it). A host
    /// whose last report is a failure counts for none; a host gone from the inventory, whose
    /// last report stays, does not keep the others from counting.
    pub fn served(&self, fleet: &FleetName) -> Option<Served> {
        let hosts = self.hosts.get(fleet)?;
        let want = self.inventory.get(fleet).copied().unwrap_or(hosts.len()).max(1);
        let mut running: Vec<u64> = hosts.values().filter(|(_, ok)| *ok).map(|(v, _)| *v).collect();
        running.sort_unstable_by(|a, b| b.cmp(a));
        let version = *running.get(want - 1)?;
        let read = self.versions.get(fleet);
        let seq = read.and_then(|r| r.range(..=version).map(|(_, s)| *s).max());
        Some(Served { version, hosts: want, seq })
    }

    /// [`Fleets::served`] of every fleet that serves one version.
    pub fn all(&self) -> BTreeMap<FleetName, Served> {
        self.hosts.keys().filter_map(|f| Some((f.clone(), self.served(f)?))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hafleet_proto::{Bundle, Cause, HostName, SCHEMA_VERSION};

    fn edge() -> FleetName {
        FleetName::new("edge").unwrap()
    }

    fn version(n: u64, seq: u64) -> ConfigVersion {
        let cause = Cause {
            stream_seq: seq,
            ingress: None,
            what: "upsert".into(),
            resource_version: None,
            added: vec![],
            removed: vec![],
            note: None,
        };
        ConfigVersion { causes: vec![cause], ..ConfigVersion::inline(edge(), n, Bundle::default()) }
    }

    fn report(host: &str, version: u64, outcome: ApplyOutcome) -> ApplyReport {
        ApplyReport {
            schema: SCHEMA_VERSION,
            fleet: edge(),
            host: HostName::new(host).unwrap(),
            version,
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
            sha256: String::new(),
        }
    }

    #[test]
    fn a_fleet_serves_the_newest_version_every_host_runs() {
        let mut f = Fleets::default();
        f.on_version(&version(7, 40));
        f.on_report(&report("lb-1", 7, ApplyOutcome::Applied));
        assert_eq!(f.served(&edge()), None, "one host of two");
        f.on_report(&report("lb-2", 7, ApplyOutcome::Unchanged));
        assert_eq!(f.served(&edge()), Some(Served { version: 7, hosts: 2, seq: Some(40) }));
        f.on_version(&version(8, 41));
        // Version 8 is out, not live yet: 7 is still what every host serves.
        assert_eq!(f.served(&edge()).map(|s| s.version), Some(7));
        f.on_report(&report("lb-1", 8, ApplyOutcome::Applied));
        assert_eq!(f.served(&edge()).map(|s| (s.version, s.seq)), Some((7, Some(40))));
        let failed = ApplyOutcome::Failed {
            stage: ApplyStage::Validate,
            message: "no".into(),
            restored: true,
        };
        f.on_report(&report("lb-2", 8, failed));
        assert_eq!(f.served(&edge()), None, "a host refused it: it serves nothing known");
        f.on_report(&report("lb-2", 8, ApplyOutcome::Applied));
        assert_eq!(f.served(&edge()).map(|s| (s.version, s.seq)), Some((8, Some(41))));
        // What hosts ran before the watcher read any version: served, reaching nowhere known.
        let mut late = Fleets::default();
        late.on_report(&report("lb-1", 5, ApplyOutcome::Applied));
        late.on_report(&report("lb-2", 5, ApplyOutcome::Applied));
        assert_eq!(late.served(&edge()).map(|s| s.seq), Some(None));
        // A host gone from the inventory (its last report stays) does not hold the others.
        let mut gone = Fleets::default();
        gone.on_report(&ApplyReport { fleet_hosts: 1, ..report("old", 3, ApplyOutcome::Applied) });
        gone.on_report(&ApplyReport { fleet_hosts: 1, ..report("lb-1", 9, ApplyOutcome::Applied) });
        assert_eq!(gone.served(&edge()).map(|s| (s.version, s.hosts)), Some((9, 1)));
    }
}
