//! Whether a fleet's desired state makes a new config version. Pure: the clock is a parameter.

use crate::core::render::{RenderError, Renderer};
use crate::core::state::Desired;
use hafleet_proto::{Body, Cause, ConfigVersion, FleetName, SCHEMA_VERSION};

/// The newest version a fleet has: its number and sha256.
#[derive(Debug, Clone, Copy)]
pub struct Latest<'a> {
    pub version: u64,
    pub sha256: &'a str,
}

/// Renders `fleet` from `desired` and returns the next version of `fleet`, or `None` when the config is
/// byte for byte the one `latest` already holds (invariant 4: same state, same version).
/// `floor` is a number the next version must be above (the newest one published, when the
/// store lost its history).
pub fn next_version(
    renderer: &Renderer,
    fleet: &FleetName,
    desired: &Desired,
    latest: Option<Latest<'_>>,
    floor: u64,
    causes: Vec<Cause>,
    now_unix_ms: u64,
) -> Result<Option<ConfigVersion>, RenderError> {
    let fleetwide = crate::core::render::Fleetwide::of(desired, fleet);
    let model = renderer.model(fleet, desired.ingresses(fleet), &desired.nodes, fleetwide);
    let bundle = renderer.render(&model)?;
    let sha256 = bundle.sha256();
    if latest.is_some_and(|l| l.sha256 == sha256) {
        return Ok(None);
    }
    let parent = latest.map(|l| l.version).or((floor > 0).then_some(floor));
    let quarantined = desired
        .ingresses(fleet)
        .iter()
        .filter(|(_, e)| e.quarantined.is_some())
        .map(|(k, _)| k.clone())
        .take(hafleet_proto::MAX_QUARANTINED_LISTED)
        .collect();
    let routes = desired
        .ingresses(fleet)
        .values()
        .filter(|e| e.quarantined.is_none())
        .map(|e| e.routes.len() as u64)
        .sum();
    Ok(Some(ConfigVersion {
        schema: SCHEMA_VERSION,
        fleet: fleet.clone(),
        version: parent.unwrap_or(0).max(floor) + 1,
        parent,
        sha256,
        created_unix_ms: now_unix_ms,
        causes,
        notes: version_notes(model.notes),
        restores: None,
        size: bundle.size() as u64,
        body: Body::Inline { bundle },
        signature: None,
        quarantined,
        routes: Some(routes),
    }))
}

/// Most notes a version's message carries: each is a line of the config's `# Notes:` too,
/// which keeps them all, but the message must stay within a NATS message however many routes
/// are ignored (10,000 notes are about a megabyte).
pub const MAX_VERSION_NOTES: usize = 200;

/// `notes`, cut to [`MAX_VERSION_NOTES`] with a last line saying how many more the config has.
fn version_notes(mut notes: Vec<String>) -> Vec<String> {
    if notes.len() > MAX_VERSION_NOTES {
        let more = notes.len() - MAX_VERSION_NOTES;
        notes.truncate(MAX_VERSION_NOTES);
        notes.push(format!("… and {more} more: the config's `# Notes:` lists them all"));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::state::IngressEntry;
    use hafleet_proto::IngressKey;

    #[test]
    fn the_same_state_makes_no_new_version_and_a_change_makes_the_next_one() {
        let r = Renderer::builtin();
        let fleet = FleetName::new("edge").unwrap();
        let empty = Desired::new();
        let v1 = next_version(&r, &fleet, &empty, None, 0, vec![], 1).unwrap().unwrap();
        assert_eq!((v1.version, v1.parent), (1, None));
        let latest = Some(Latest { version: 1, sha256: &v1.sha256 });
        assert!(next_version(&r, &fleet, &empty, latest, 0, vec![], 2).unwrap().is_none());
        // A store that lost its history continues above what was published.
        let v8 = next_version(&r, &fleet, &empty, None, 7, vec![], 1).unwrap().unwrap();
        assert_eq!((v8.version, v8.parent), (8, Some(7)));

        let mut one = Desired::new();
        one.fleets.entry(fleet.clone()).or_default().insert(
            IngressKey::new("default", "web").unwrap(),
            IngressEntry {
                created_unix: 1,
                resource_version: "1".into(),
                routes: Default::default(),
                seq: 1,
                tls: Vec::new(),
                quarantined: None,
            },
        );
        // An Ingress without routes renders the same config: still no new version.
        assert!(next_version(&r, &fleet, &one, latest, 0, vec![], 3).unwrap().is_none());
    }

    #[test]
    fn a_version_carries_at_most_200_notes_and_says_how_many_more_the_config_has() {
        let few: Vec<String> = (0..MAX_VERSION_NOTES).map(|i| format!("note {i}")).collect();
        assert_eq!(version_notes(few.clone()), few);
        let many: Vec<String> = (0..10_000).map(|i| format!("note {i}")).collect();
        let kept = version_notes(many);
        assert_eq!(kept.len(), MAX_VERSION_NOTES + 1);
        assert_eq!(kept[MAX_VERSION_NOTES - 1], "note 199");
        assert_eq!(
            kept[MAX_VERSION_NOTES],
            "… and 9800 more: the config's `# Notes:` lists them all"
        );
    }
}
