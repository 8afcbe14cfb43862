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
/// Where the renderer publishes a parked route message again, on an operator's request
/// ([`crate::RepublishRequest`]); like the snapshot's, no fleet can claim it.
pub const ROUTES_REPUBLISH_SUBJECT: &str = "hafleet.routes._republish";
/// Header of a republished route message: its sequence in the dead-letter stream.
pub const DEADLETTER_SEQ_HEADER: &str = "Hafleet-Deadletter-Seq";
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

/// Where a watcher of `cluster` publishes its node sets: [`ROUTES_NODES_SUBJECT`], and
/// `.<cluster>` after it for a named cluster, so that each cluster's newest is found by
/// subject (a watcher's epoch must be above its own cluster's last one).
pub fn routes_nodes_subject(cluster: Option<&crate::ClusterId>) -> String {
    of_cluster(ROUTES_NODES_SUBJECT, cluster)
}

/// Where a watcher of `cluster` publishes its snapshots, as [`routes_nodes_subject`].
pub fn routes_snapshot_subject(cluster: Option<&crate::ClusterId>) -> String {
    of_cluster(ROUTES_SNAPSHOT_SUBJECT, cluster)
}

/// `subject`, and `.<cluster>` after it for a named cluster.
fn of_cluster(subject: &str, cluster: Option<&crate::ClusterId>) -> String {
    match cluster {
        Some(c) => format!("{subject}.{c}"),
        None => subject.to_owned(),
    }
}

/// Subject of the renderer's releases of held sweeps ([`crate::SweepConfirm`]); like the
/// snapshot's, it cannot collide with a fleet's subject.
pub const ROUTES_CONFIRM_SUBJECT: &str = "hafleet.routes._confirm";

/// Subject of the renderer's quarantines ([`crate::Quarantine`]); like the snapshot's, it
/// cannot collide with a fleet's subject.
pub const ROUTES_QUARANTINE_SUBJECT: &str = "hafleet.routes._quarantine";

/// Subject of the renderer's own settings ([`crate::RenderSettings`]); like the snapshot's, it
/// cannot collide with a fleet's subject.
pub const ROUTES_RENDER_SUBJECT: &str = "hafleet.routes._render";

/// Where a renderer asks the watchers to publish everything again (core NATS, not a stream):
/// its routes stream lost events it had not applied (a store rebuilt past the stream's
/// retention), and it publishes nothing until they do.
pub const RESYNC_SUBJECT: &str = "hafleet.resync";

/// JetStream's de-duplication header: publishes that are retried carry the same id.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";
/// Header naming the schema version of the payload.
pub const SCHEMA_HEADER: &str = "Hafleet-Schema";
/// Header of a watcher's route event: how many more route events the same pass over the
/// cluster publishes after it (`0` on its last). A renderer that has the last one, with
/// nothing more pending in the stream, renders at once instead of waiting out its quiet
/// window; without the header (another publisher) it waits as before.
pub const PASS_MORE_HEADER: &str = "Hafleet-Pass-More";

/// Durable consumer name of the renderer on [`ROUTES_STREAM`].
pub const RENDERER_CONSUMER: &str = "hafleet-renderer";

/// Durable consumer name of a fleet's applier on [`CONFIGS_STREAM`].
pub fn applier_consumer(fleet: &FleetName) -> String {
    format!("hafleet-applier-{fleet}")
}

/// Stream holding the bundles too large for a message (`hafleet.bundles.>`), each cut into
/// chunks on [`bundle_chunk_subject`]. One subject per chunk, keeping only its last message:
/// storing a bundle again changes nothing. Its subjects name the fleet, so an applier can be
/// allowed to read its own fleet's bundles and no other's (an object store's subjects could
/// not say whose an object is).
pub const BUNDLES_STREAM: &str = "HAFLEET_BUNDLES";
pub const BUNDLES_SUBJECTS: &str = "hafleet.bundles.>";
/// Header of a bundle's chunk 0: how many chunks the bundle has.
pub const CHUNKS_HEADER: &str = "Hafleet-Chunks";

/// Object store bucket holding checkpoints of the renderer's desired state (stream
/// `OBJ_hafleet-checkpoints`), named `routes-<sequence, 20 digits>`: where replay and a renderer
/// on an empty store start once the routes stream has dropped its oldest messages.
pub const CHECKPOINTS_BUCKET: &str = "hafleet-checkpoints";

/// Subject of chunk `index` of `fleet`'s bundle `sha256`: `hafleet.bundles.<fleet>.<sha256>.<index>`.
pub fn bundle_chunk_subject(fleet: &FleetName, sha256: &str, index: u32) -> String {
    format!("hafleet.bundles.{fleet}.{sha256}.{index}")
}

/// Subject of one certificate of `fleet` in [`BUNDLES_STREAM`]: `hafleet.bundles.<fleet>.cert.<id>`
/// ([`crate::SealedCert::id`]). A bundle in the stream names its certificates by id
/// ([`crate::StashedBundle`]), each stored once, so a version that rotates one certificate
/// stores and moves that one. Under the fleet's bundles subjects, so an applier reads its own
/// fleet's certificates only; `cert` is never a bundle's sha256, so no chunk is named alike.
pub fn cert_subject(fleet: &FleetName, id: &str) -> String {
    format!("hafleet.bundles.{fleet}.cert.{id}")
}

/// The subjects of every certificate of `fleet` ([`cert_subject`]).
pub fn cert_subjects(fleet: &FleetName) -> String {
    format!("hafleet.bundles.{fleet}.cert.*")
}

/// The inbox prefix of `fleet`'s applier: replies to it (JetStream API answers, pulled
/// configs) go where no other fleet's applier may subscribe.
pub fn applier_inbox_prefix(fleet: &FleetName) -> String {
    format!("_INBOX_{fleet}")
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
    /// Reads by subject go through `$JS.API.DIRECT.GET.<stream>.<subject>`, whose API subject
    /// names what is read, so NATS permissions can allow one fleet's subjects only.
    pub direct: bool,
    /// Only the last message of each subject is kept.
    pub last_per_subject: bool,
}

impl StreamSpec {
    const fn new(name: &'static str, subjects: &'static str) -> StreamSpec {
        StreamSpec { name, subjects, max_age_secs: None, direct: false, last_per_subject: false }
    }
}

pub const ROUTES: StreamSpec = StreamSpec::new(ROUTES_STREAM, ROUTES_SUBJECTS);
pub const CONFIGS: StreamSpec =
    StreamSpec { direct: true, ..StreamSpec::new(CONFIGS_STREAM, CONFIGS_SUBJECTS) };
pub const BUNDLES: StreamSpec = StreamSpec {
    direct: true,
    last_per_subject: true,
    ..StreamSpec::new(BUNDLES_STREAM, BUNDLES_SUBJECTS)
};
pub const DEADLETTER: StreamSpec = StreamSpec {
    max_age_secs: Some(30 * 24 * 3600),
    ..StreamSpec::new(DEADLETTER_STREAM, DEADLETTER_SUBJECTS)
};
pub const REPORTS: StreamSpec = StreamSpec {
    max_age_secs: Some(7 * 24 * 3600),
    ..StreamSpec::new(REPORTS_STREAM, REPORTS_SUBJECTS)
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
