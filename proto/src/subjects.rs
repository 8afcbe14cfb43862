//! Subject, stream, consumer and header names. Keep them: operators grep for them.

use crate::values::{FleetName, HostName};

/// Stream holding every route event (`hafleet.routes.>`).
pub const ROUTES_STREAM: &str = "HAFLEET_ROUTES";
/// Stream holding every published config version (`hafleet.configs.>`).
pub const CONFIGS_STREAM: &str = "HAFLEET_CONFIGS";
/// Stream holding every apply report (`hafleet.reports.>`).
pub const REPORTS_STREAM: &str = "HAFLEET_REPORTS";

/// Stream holding messages a consumer could not read, parked for an operator to look at.
pub const DEADLETTER_STREAM: &str = "HAFLEET_DEADLETTER";

pub const ROUTES_SUBJECTS: &str = "hafleet.routes.>";
pub const DEADLETTER_SUBJECTS: &str = "hafleet.deadletter.>";
/// Where the renderer parks route messages it cannot read.
pub const ROUTES_DEADLETTER_SUBJECT: &str = "hafleet.deadletter.routes";
/// Header of a parked message: why it could not be read.
pub const ERROR_HEADER: &str = "Hafleet-Error";
/// Header of a parked message: its sequence in the stream it came from.
pub const SOURCE_SEQ_HEADER: &str = "Hafleet-Source-Seq";
pub const CONFIGS_SUBJECTS: &str = "hafleet.configs.>";
pub const REPORTS_SUBJECTS: &str = "hafleet.reports.>";

/// Subject of the watcher's snapshot markers. Fleet names are RFC 1123 labels and never start
/// with `_`, so this cannot collide with a fleet's subject.
pub const ROUTES_SNAPSHOT_SUBJECT: &str = "hafleet.routes._snapshot";

/// Subject of the watcher's node sets ([`crate::NodesUpdate`]); like the snapshot's, it cannot
/// collide with a fleet's subject.
pub const ROUTES_NODES_SUBJECT: &str = "hafleet.routes._nodes";

/// JetStream's de-duplication header: publishes that are retried carry the same id.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";
/// Header naming the schema version of the payload.
pub const SCHEMA_HEADER: &str = "Hafleet-Schema";

/// Durable consumer name of the renderer on [`ROUTES_STREAM`].
pub const RENDERER_CONSUMER: &str = "hafleet-renderer";

/// Durable consumer name of a fleet's applier on [`CONFIGS_STREAM`].
pub fn applier_consumer(fleet: &FleetName) -> String {
    format!("hafleet-applier-{fleet}")
}

/// Object store bucket holding the bundles that are too large for a message (stream
/// `OBJ_hafleet-bundles`). One bucket for every fleet: NATS permissions match whole subject
/// tokens, so a bucket per fleet could not be granted to the renderer without granting it
/// every stream.
pub const BUNDLES_BUCKET: &str = "hafleet-bundles";

/// Object store bucket holding checkpoints of the renderer's desired state (stream
/// `OBJ_hafleet-checkpoints`), named `routes-<sequence, 20 digits>`: where replay and a renderer
/// on an empty store start once the routes stream has dropped its oldest messages.
pub const CHECKPOINTS_BUCKET: &str = "hafleet-checkpoints";

/// Name of a bundle in [`BUNDLES_BUCKET`]: `<fleet>-<sha256>`.
pub fn bundle_object(fleet: &FleetName, sha256: &str) -> String {
    format!("{fleet}-{sha256}")
}

/// Subject of one fleet's route events.
pub fn routes_subject(fleet: &FleetName) -> String {
    format!("hafleet.routes.{fleet}")
}

/// Subject of one fleet's config versions.
pub fn configs_subject(fleet: &FleetName) -> String {
    format!("hafleet.configs.{fleet}")
}

/// Subject of one host's apply reports.
pub fn reports_subject(fleet: &FleetName, host: &HostName) -> String {
    format!("hafleet.reports.{fleet}.{host}")
}

/// What a stream is for; each binary turns this into its client's stream config, so the three
/// agree on names and subjects without sharing a NATS dependency here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSpec {
    pub name: &'static str,
    pub subjects: &'static str,
    /// How long messages are kept; `None` keeps them until limits say otherwise.
    pub max_age_secs: Option<u64>,
}

pub const ROUTES: StreamSpec =
    StreamSpec { name: ROUTES_STREAM, subjects: ROUTES_SUBJECTS, max_age_secs: None };
pub const CONFIGS: StreamSpec =
    StreamSpec { name: CONFIGS_STREAM, subjects: CONFIGS_SUBJECTS, max_age_secs: None };
pub const DEADLETTER: StreamSpec = StreamSpec {
    name: DEADLETTER_STREAM,
    subjects: DEADLETTER_SUBJECTS,
    max_age_secs: Some(30 * 24 * 3600),
};
pub const REPORTS: StreamSpec = StreamSpec {
    name: REPORTS_STREAM,
    subjects: REPORTS_SUBJECTS,
    max_age_secs: Some(7 * 24 * 3600),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_built_from_validated_names() {
        let fleet = FleetName::new("edge").unwrap();
        let host = HostName::new("lb-1").unwrap();
        assert_eq!(routes_subject(&fleet), "hafleet.routes.edge");
        assert_eq!(configs_subject(&fleet), "hafleet.configs.edge");
        assert_eq!(reports_subject(&fleet, &host), "hafleet.reports.edge.lb-1");
        assert_eq!(applier_consumer(&fleet), "hafleet-applier-edge");
    }

    #[test]
    fn snapshot_subject_is_inside_the_routes_stream_but_no_fleet_can_claim_it() {
        assert!(ROUTES_SNAPSHOT_SUBJECT.starts_with("hafleet.routes."));
        assert!(FleetName::new("_snapshot").is_err());
    }
}
