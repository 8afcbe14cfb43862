//! `hafleet fleets`: every fleet the running renderer knows, with how many of its hosts run
//! the version published to them (from the reports stream).

use crate::output::Output;
use crate::session::Session;
use hafleet_proto::FleetSummary;
use serde::Serialize;

/// One fleet as `fleets` prints it.
#[derive(Debug, Serialize)]
struct Row {
    #[serde(flatten)]
    fleet: FleetSummary,
    /// When its newest version was made (RFC 3339).
    newest_time: Option<String>,
    /// Hosts that reported, and those whose newest report runs the published version.
    hosts: usize,
    hosts_on_published: usize,
}

/// Runs `hafleet fleets`.
pub async fn fleets(session: &Session) -> anyhow::Result<()> {
    let bus = session.connect().await?;
    let mut rows = Vec::new();
    for fleet in session.fleets(&bus).await? {
        let reports = super::history::reports(&bus, &fleet.name).await?;
        rows.push(Row {
            newest_time: fleet.newest_unix_ms.map(hafleet_runtime::rfc3339_of_unix_ms),
            hosts: reports.len(),
            hosts_on_published: super::history::live_on(&reports, fleet.published),
            fleet,
        });
    }
    if session.output != Output::Table {
        return session.output.print(&rows);
    }
    if rows.is_empty() {
        println!("the renderer knows no fleet yet (no annotated Ingress or Gateway routes to one)");
        return Ok(());
    }
    let dash = |n: Option<u64>| n.map_or("-".to_owned(), |n| n.to_string());
    let mut table = vec![[
        "FLEET".to_owned(),
        "NEWEST".into(),
        "PUBLISHED".into(),
        "PINNED".into(),
        "HOSTS".into(),
        "HELD SWEEPS".into(),
        "OBJECTS".into(),
        "UPDATED".into(),
    ]];
    for r in &rows {
        table.push([
            r.fleet.name.to_string(),
            dash(r.fleet.newest),
            dash(Some(r.fleet.published).filter(|p| *p > 0)),
            dash(r.fleet.pinned),
            format!("{}/{}", r.hosts_on_published, r.hosts),
            r.fleet.held_sweeps.to_string(),
            r.fleet.objects.to_string(),
            r.newest_time.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    print!("{}", hafleet_runtime::table(&table));
    Ok(())
}
