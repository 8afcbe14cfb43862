//! `hafleet status --fleet F`: what each host of a fleet runs, from the reports
//! stream, as an operator sees it from any machine with NATS access (the `hafleet-operator`
//! user). It needs no running applier and never touches a host.
//!
//! A host's live version is the version of its newest `applied` or `unchanged` report: a
//! failure before the swap leaves that version running, and a rollback puts back the last
//! config that loaded and passed its probes, which is that same version. Only a failure after
//! the swap that could not restore, or drift left as it is, leaves it unknown.

use crate::output::Output;
use crate::session::Session;
use futures::StreamExt as _;
use hafleet_proto::{ApplyOutcome, ApplyReport, ApplyStage, FleetName};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// One host's state, as `status` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostStatus {
    pub host: String,
    /// The version live on the host; `None` when its reports cannot tell.
    pub version: Option<u64>,
    pub sha256: Option<String>,
    /// The newest report: its version, outcome (`applied`, `unchanged`, `failed at <stage>`)
    /// and when it finished.
    pub last_version: u64,
    pub last_outcome: String,
    pub last_message: Option<String>,
    pub last_unix_ms: u64,
    /// What the applier's drift check last said about the host: `none reported`, `drifted:
    /// …` (found and left as it is, `--drift-policy report`), `repaired: …` or `repair
    /// failed: …`.
    pub drift: String,
    /// Ingresses the version of the newest report leaves out (quarantined by the renderer).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<String>,
}

/// A host's status from its reports, oldest first. Pure.
pub fn of_host(host: &str, reports: &[ApplyReport]) -> Option<HostStatus> {
    let last = reports.last()?;
    let live = reports
        .iter()
        .rev()
        .find(|r| matches!(r.outcome, ApplyOutcome::Applied | ApplyOutcome::Unchanged));
    let unknown_after_swap = matches!(
        &last.outcome,
        ApplyOutcome::Failed { stage, restored: false, .. }
            if matches!(stage, ApplyStage::Swap | ApplyStage::Reload | ApplyStage::Verify | ApplyStage::Probe | ApplyStage::Drift)
    );
    let live = live.filter(|_| !unknown_after_swap);
    let (last_outcome, last_message) = match &last.outcome {
        ApplyOutcome::Applied => ("applied".to_owned(), None),
        ApplyOutcome::Unchanged => ("unchanged".to_owned(), None),
        ApplyOutcome::Failed { stage, message, restored } => (
            format!("failed at {}{}", stage.as_str(), if *restored { ", rolled back" } else { "" }),
            Some(message.clone()),
        ),
    };
    Some(HostStatus {
        host: host.to_owned(),
        version: live.map(|r| r.version),
        sha256: live.map(|r| r.sha256.clone()),
        last_version: last.version,
        last_outcome,
        last_message,
        last_unix_ms: last.finished_unix_ms,
        quarantined: last.quarantined.iter().map(|k| k.to_string()).collect(),
        drift: match (&last.outcome, &last.drift) {
            (ApplyOutcome::Failed { stage: ApplyStage::Drift, .. }, Some(found)) => {
                format!("drifted: {found}")
            }
            (ApplyOutcome::Failed { .. }, Some(found)) => format!("repair failed: {found}"),
            (_, Some(found)) => format!("repaired: {found}"),
            (_, None) => "none reported".to_owned(),
        },
    })
}

/// Every report of `fleet` the reports stream holds, per host, oldest first.
async fn reports(
    bus: &hafleet_runtime::nats::Bus,
    fleet: &FleetName,
    timeout: Duration,
) -> anyhow::Result<BTreeMap<String, Vec<ApplyReport>>> {
    use anyhow::Context as _;
    let mut out: BTreeMap<String, Vec<ApplyReport>> = BTreeMap::new();
    let stream = match bus.js.get_stream(hafleet_proto::REPORTS_STREAM).await {
        Ok(s) => s,
        Err(_) => return Ok(out),
    };
    let filter = format!("hafleet.reports.{fleet}.*");
    let consumer = bus
        .ordered(&stream, &filter, Default::default())
        .await
        .context("cannot read the reports stream")?;
    if consumer.cached_info().num_pending == 0 {
        return Ok(out);
    }
    let mut messages = consumer.messages().await.context("cannot read the reports stream")?;
    loop {
        let m = tokio::time::timeout(timeout, messages.next())
            .await
            .context("the reports stream stopped answering")?
            .context("the reports stream ended")??;
        let pending = m.info().map(|i| i.pending).unwrap_or(0);
        if let Ok(r) = ApplyReport::decode(&m.payload) {
            out.entry(r.host.to_string()).or_default().push(r);
        }
        if pending == 0 {
            return Ok(out);
        }
    }
}

/// When, to the second, for the table.
fn time_of(unix_ms: u64) -> String {
    hafleet_runtime::rfc3339_of_unix_ms(unix_ms / 1000 * 1000)
}

/// Runs `hafleet status`.
pub async fn status(session: &Session) -> anyhow::Result<()> {
    let bus = session.connect().await?;
    let fleet = session.fleet(&bus).await?;
    let all = reports(&bus, &fleet, session.timeout).await?;
    anyhow::ensure!(
        !all.is_empty(),
        "fleet {fleet} has no reports: no applier has reported on it (within the reports \
         stream's 7 days), or the fleet name is wrong (see `hafleet fleets`)"
    );
    let hosts: Vec<HostStatus> = all.iter().filter_map(|(h, r)| of_host(h, r)).collect();
    if session.output != Output::Table {
        return session.output.print(&hosts);
    }
    let mut rows =
        vec![["HOST", "VERSION", "SHA256", "LAST", "OUTCOME", "WHEN", "DRIFT"].map(String::from)];
    for h in &hosts {
        rows.push([
            h.host.clone(),
            h.version.map_or("?".into(), |v| v.to_string()),
            h.sha256.as_deref().map_or("-".into(), |s| s.get(..12).unwrap_or(s).to_owned()),
            h.last_version.to_string(),
            h.last_outcome.clone(),
            time_of(h.last_unix_ms),
            h.drift.clone(),
        ]);
    }
    print!("{}", hafleet_runtime::table(&rows));
    for h in hosts.iter().filter(|h| h.last_message.is_some()) {
        println!("{}: {}", h.host, h.last_message.as_deref().unwrap_or_default());
    }
    for h in hosts.iter().filter(|h| !h.quarantined.is_empty()) {
        println!("{}: quarantined (left out): {}", h.host, h.quarantined.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(version: u64, outcome: ApplyOutcome) -> ApplyReport {
        ApplyReport {
            schema: hafleet_proto::SCHEMA_VERSION,
            fleet: FleetName::new("edge").unwrap(),
            host: hafleet_proto::HostName::new("lb-1").unwrap(),
            version,
            sha256: format!("sha-{version}"),
            outcome,
            finished_unix_ms: 1_795_480_113_000,
            duration_ms: 5,
            reloads: 0,
            runtime_commands: 0,
            bridged: 0,
            sent_bytes: 0,
            drift: None,
            fleet_hosts: 2,
            quarantined: vec![],
        }
    }

    fn failed(stage: ApplyStage, restored: bool) -> ApplyOutcome {
        ApplyOutcome::Failed { stage, message: "why".into(), restored }
    }

    #[test]
    fn the_live_version_is_the_newest_that_went_live_unless_a_failure_left_it_unknown() {
        let ok = |v| report(v, ApplyOutcome::Applied);
        let s = of_host("lb-1", &[ok(1), ok(2)]).unwrap();
        assert_eq!((s.version, s.last_outcome.as_str()), (Some(2), "applied"));
        // Refused before the swap, or rolled back: version 2 still runs.
        for outcome in [failed(ApplyStage::Validate, false), failed(ApplyStage::Probe, true)] {
            let s = of_host("lb-1", &[ok(1), ok(2), report(3, outcome)]).unwrap();
            assert_eq!((s.version, s.last_version), (Some(2), 3));
            assert_eq!(s.sha256.as_deref(), Some("sha-2"));
            assert!(s.last_outcome.starts_with("failed at "), "{}", s.last_outcome);
        }
        let s = of_host("lb-1", &[ok(1), report(2, failed(ApplyStage::Probe, true))]).unwrap();
        assert_eq!(s.last_outcome, "failed at probe, rolled back");
        // Failed after the swap without a restore: nobody knows.
        let s = of_host("lb-1", &[ok(1), report(2, failed(ApplyStage::Reload, false))]).unwrap();
        assert_eq!(s.version, None);
        assert!(of_host("lb-1", &[]).is_none());
        // Drift: left as it is, the version is unknown; repaired, it runs again.
        let mut left = report(3, failed(ApplyStage::Drift, false));
        left.drift = Some("the live config has sha256 abc".into());
        let s = of_host("lb-1", &[ok(3), left.clone()]).unwrap();
        assert_eq!(
            (s.version, s.drift.as_str()),
            (None, "drifted: the live config has sha256 abc")
        );
        let mut repaired = ok(3);
        repaired.drift = left.drift.clone();
        let s = of_host("lb-1", &[ok(3), left, repaired]).unwrap();
        assert_eq!(
            (s.version, s.drift.as_str()),
            (Some(3), "repaired: the live config has sha256 abc")
        );
        let mut failed_repair = report(3, failed(ApplyStage::Upload, false));
        failed_repair.drift = Some("map exact-aa.map was changed".into());
        let s = of_host("lb-1", &[ok(3), failed_repair]).unwrap();
        assert_eq!(s.drift, "repair failed: map exact-aa.map was changed");
        assert_eq!(of_host("lb-1", &[ok(3)]).unwrap().drift, "none reported");
        assert_eq!(time_of(1_795_480_113_000), "2026-11-24T00:28:33Z");
        assert_eq!(time_of(0), "1970-01-01T00:00:00Z");
    }
}
