//! The history API: requests an operator's CLI sends to the renderer over NATS request/reply
//! (`hafleet.history.<fleet>`), and its replies. The renderer owns the versions; nobody else
//! opens its store.

use crate::messages::{Cause, ConfigVersion, IngressKey};
use serde::{Deserialize, Serialize};

/// Subjects the renderer answers history requests on: reads.
pub const HISTORY_SUBJECTS: &str = "hafleet.history.*";

/// Subjects of the requests that change what a fleet runs ([`HistoryRequest::changes`]), apart
/// from the reads so that NATS permissions can grant them per fleet.
pub const HISTORY_CHANGE_SUBJECTS: &str = "hafleet.history.*.change";

/// Subject of a request to republish a message parked on the dead-letter stream
/// ([`RepublishRequest`]). It changes what fleets run, so it is one of the change subjects
/// (`_deadletter` is no fleet's name): an operator granted `hafleet.history.*.change` may send
/// it, one granted some fleets' changes only may not.
pub const DEADLETTER_REPUBLISH_SUBJECT: &str = "hafleet.history._deadletter.change";

/// Subject of the request for every fleet the renderer knows ([`FleetSummary`]): a read
/// (`_fleets` is no fleet's name), so every operator may send it. Its payload is empty.
pub const FLEETS_SUBJECT: &str = "hafleet.history._fleets";

/// A fleet as `hafleet fleets` lists it: what the renderer knows of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetSummary {
    pub name: crate::FleetName,
    /// The newest version recorded (published or held), and when it was made.
    pub newest: Option<u64>,
    pub newest_unix_ms: Option<u64>,
    /// The newest version published to the fleet's appliers (0: none yet).
    pub published: u64,
    /// The version a rollback pinned the fleet to.
    pub pinned: Option<u64>,
    /// Sweeps the mass-deletion guard holds for it.
    pub held_sweeps: usize,
    /// Ingresses (and routes of Gateway API) in its desired state.
    pub objects: usize,
}

/// Republish the route message parked at `deadletter_seq` of the dead-letter stream: the
/// renderer reads it, checks that it can now read it (after an upgrade), and publishes it on
/// [`crate::ROUTES_REPUBLISH_SUBJECT`], into the routes stream, where it is applied in order
/// (and replayed) like any route event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepublishRequest {
    pub deadletter_seq: u64,
}

/// Subject of one fleet's history requests: `request`'s, reads or changes.
pub fn history_subject(fleet: &crate::FleetName) -> String {
    format!("hafleet.history.{fleet}")
}

/// Subject of one fleet's history requests that change what it runs.
pub fn history_change_subject(fleet: &crate::FleetName) -> String {
    format!("hafleet.history.{fleet}.change")
}

/// What an operator asks of a fleet's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum HistoryRequest {
    /// The newest `limit` versions, newest first.
    List { limit: usize },
    /// One version with its bundle (inline, or in the object store when too large).
    Show { version: u64 },
    /// Republish `version`'s bundle as a new version and pin the fleet to it.
    Rollback { version: u64 },
    /// Unpin: publish the config the desired state renders now.
    Resume,
    /// The sweep held for the fleet, if any.
    HeldSweep,
    /// Release the sweep held for the fleet (the one at `snapshot_seq`, so an operator never
    /// releases a hold they did not look at).
    ConfirmSweep { snapshot_seq: u64 },
}

impl HistoryRequest {
    /// Whether it changes what the fleet runs or will run (a rollback, a resume, a sweep's
    /// release): sent on [`history_change_subject`], never answered on the read subject.
    pub fn changes(&self) -> bool {
        matches!(
            self,
            HistoryRequest::Rollback { .. }
                | HistoryRequest::Resume
                | HistoryRequest::ConfirmSweep { .. }
        )
    }

    /// Its name, as its `op` says it.
    pub fn encode_name(&self) -> &'static str {
        match self {
            HistoryRequest::List { .. } => "list",
            HistoryRequest::Show { .. } => "show",
            HistoryRequest::Rollback { .. } => "rollback",
            HistoryRequest::Resume => "resume",
            HistoryRequest::HeldSweep => "held_sweep",
            HistoryRequest::ConfirmSweep { .. } => "confirm_sweep",
        }
    }

    /// The subject it goes to for `fleet`.
    pub fn subject(&self, fleet: &crate::FleetName) -> String {
        match self.changes() {
            true => history_change_subject(fleet),
            false => history_subject(fleet),
        }
    }
}

/// A snapshot's withdrawals the renderer holds back: more of the fleet at once than its guard
/// lets through (an API server restored from an empty backup, a wrong selector).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldSweep {
    /// The routes stream sequence and watcher epoch of the snapshot.
    pub snapshot_seq: u64,
    pub epoch: u64,
    /// When the renderer first held these withdrawals (its clock, Unix ms; a later snapshot
    /// that holds again keeps it). 0 until the renderer stamps it.
    pub since_unix_ms: u64,
    /// The Ingresses it would withdraw (fewer as they come back), with their routes.
    pub ingresses: Vec<(IngressKey, usize)>,
    /// The fleet's routes when it was held (of its cluster's Ingresses).
    pub fleet_routes: usize,
    /// The cluster whose snapshot it is: only its Ingresses are withdrawn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::ClusterId>,
}

/// One line of a fleet's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionSummary {
    pub number: u64,
    pub parent: Option<u64>,
    pub sha256: String,
    pub created_unix_ms: u64,
    /// Bytes of the bundle's files together.
    pub size: u64,
    /// What made it, in one line: `shop/web updated, blog/x deleted`.
    pub cause: String,
    /// The version whose bundle it republishes (a rollback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restores: Option<u64>,
    /// Rendered while the fleet was pinned by a rollback: recorded, never published.
    #[serde(default)]
    pub held: bool,
}

/// The renderer's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum HistoryReply {
    List {
        versions: Vec<VersionSummary>,
        /// The version a rollback pinned the fleet to, if any.
        pinned: Option<u64>,
    },
    Version {
        summary: VersionSummary,
        version: Box<ConfigVersion>,
    },
    /// A rollback or resume was carried out: `version` is the version now published (`None`:
    /// nothing to publish, the fleet already runs what its state renders).
    Done {
        version: Option<u64>,
        pinned: Option<u64>,
    },
    /// The sweeps held for the fleet: `sweep` (`None`: none) and, when several clusters feed
    /// it, the other clusters' in `more`.
    Held {
        sweep: Option<HeldSweep>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        more: Vec<HeldSweep>,
    },
    /// A release was published to the routes stream at `stream_seq`; the renderer withdraws
    /// the Ingresses when it reaches it.
    Confirmed {
        stream_seq: u64,
    },
    /// A parked message was published again, at `stream_seq` of the routes stream.
    Republished {
        stream_seq: u64,
    },
    /// Every fleet the renderer knows, by name ([`FLEETS_SUBJECT`]).
    Fleets {
        fleets: Vec<FleetSummary>,
    },
    Error {
        kind: HistoryErrorKind,
        message: String,
    },
}

/// What kind of failure a [`HistoryReply::Error`] is, for exit codes and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryErrorKind {
    UnknownFleet,
    NoSuchVersion,
    /// No sweep is held, or another one than the request names.
    NoSuchSweep,
    /// No parked message at the sequence the request names.
    NoSuchMessage,
    BadRequest,
    Internal,
}

impl VersionSummary {
    /// The summary of a version, with its causes in one line.
    pub fn of(v: &ConfigVersion, held: bool) -> Self {
        VersionSummary {
            number: v.version,
            parent: v.parent,
            sha256: v.sha256.clone(),
            created_unix_ms: v.created_unix_ms,
            size: v.size,
            cause: one_line(&v.causes, v.restores),
            restores: v.restores,
            held,
        }
    }
}

/// `shop/web updated, blog/x deleted`: each Ingress once, with its last change, then sweeps
/// and re-renders; at most five named, then `and N more`.
pub fn one_line(causes: &[Cause], restores: Option<u64>) -> String {
    if let Some(n) = restores {
        return format!("rollback to version {n}");
    }
    let mut named: Vec<(String, &str)> = Vec::new();
    let mut other: Vec<&str> = Vec::new();
    for c in causes {
        let what = match c.what.as_str() {
            "upsert" if c.added.is_empty() && c.removed.is_empty() => "resent",
            "upsert" => "updated",
            "delete" | "sweep" => "deleted",
            "settings" => "fleet settings changed",
            w if w.starts_with("sweep confirmed") => "deleted (held sweep released)",
            w => w,
        };
        match &c.ingress {
            Some(k) => {
                let k = k.to_string();
                match named.iter_mut().find(|(n, _)| *n == k) {
                    Some(slot) => slot.1 = what,
                    None => named.push((k, what)),
                }
            }
            None if !other.contains(&what) => other.push(what),
            None => {}
        }
    }
    let mut parts: Vec<String> = named.iter().take(5).map(|(k, w)| format!("{k} {w}")).collect();
    if named.len() > 5 {
        parts.push(format!("and {} more", named.len() - 5));
    }
    parts.extend(other.iter().map(|w| w.to_string()));
    if parts.is_empty() { "no route change".to_owned() } else { parts.join(", ") }
}

impl HistoryRequest {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("requests serialize")
    }
}

impl HistoryReply {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("replies serialize")
    }

    /// The `Version` reply for `version`, its causes cut ([`ConfigVersion::fitted`]) so that
    /// the whole reply is at most `limit` bytes; `None` if even the cut one is larger. What
    /// the reply holds around the version (its summary, the tags) is measured, not guessed:
    /// the version is serialized inside the reply as it is alone.
    pub fn version_within(
        summary: VersionSummary,
        version: &ConfigVersion,
        limit: usize,
    ) -> Option<HistoryReply> {
        let whole =
            HistoryReply::Version { summary: summary.clone(), version: Box::new(version.clone()) };
        let size = whole.encode().len();
        if size <= limit {
            return Some(whole);
        }
        let around = size - version.encode().len();
        let fitted = version.fitted(limit.checked_sub(around)?);
        let reply = HistoryReply::Version { summary, version: Box::new(fitted) };
        (reply.encode().len() <= limit).then_some(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IngressKey;

    fn cause(name: &str, what: &str, added: &[&str]) -> Cause {
        Cause {
            stream_seq: 1,
            ingress: Some(IngressKey::new("shop", name).unwrap()),
            what: what.into(),
            resource_version: None,
            added: added.iter().map(|s| s.to_string()).collect(),
            removed: vec![],
            note: None,
        }
    }

    #[test]
    fn causes_read_as_one_line() {
        let causes = [
            cause("web", "upsert", &["a.com/ (Prefix)"]),
            cause("x", "delete", &[]),
            cause("web", "upsert", &["a.com/b (Prefix)"]),
        ];
        assert_eq!(one_line(&causes, None), "shop/web updated, shop/x deleted");
        assert_eq!(one_line(&causes, Some(3)), "rollback to version 3");
        assert_eq!(one_line(&[], None), "no route change");
        let many: Vec<Cause> =
            (0..7).map(|i| cause(&format!("i{i}"), "upsert", &["x/ (Prefix)"])).collect();
        assert!(one_line(&many, None).ends_with("shop/i4 updated, and 2 more"));
    }

    /// A version with thousands of causes is cut so that the reply, summary and all, fits
    /// the limit to the byte; one that fits is left whole; a limit below the summary alone
    /// gives no reply.
    #[test]
    fn a_version_reply_fits_its_limit_exactly() {
        let bundle = crate::Bundle::new("global\n".into(), vec![], vec![]);
        let mut v =
            ConfigVersion::inline(crate::FleetName::new("edge").unwrap(), 7, bundle.clone());
        let added: Vec<String> = (0..50).map(|r| format!("h{r}.example.com/ (Prefix)")).collect();
        let added: Vec<&str> = added.iter().map(String::as_str).collect();
        v.causes = (0..5000).map(|i| cause(&format!("web-{i}"), "upsert", &added)).collect();
        let summary = VersionSummary::of(&v, false);
        let limit = 256 * 1024;
        let reply = HistoryReply::version_within(summary.clone(), &v, limit).unwrap();
        assert!(reply.encode().len() <= limit);
        let HistoryReply::Version { version, summary: s } = &reply else { panic!("{reply:?}") };
        assert_eq!((&s.sha256, version.causes.len()), (&v.sha256, 101));
        // The version is cut to the limit less exactly what the reply holds around it.
        let around = reply.encode().len() - version.encode().len();
        assert_eq!(**version, v.fitted(limit - around));
        assert!(around < 1024, "{around}");

        let mut small = v.clone();
        small.causes.truncate(2);
        let whole = HistoryReply::version_within(summary.clone(), &small, limit).unwrap();
        assert_eq!(
            whole,
            HistoryReply::Version { summary: summary.clone(), version: Box::new(small) }
        );

        assert_eq!(HistoryReply::version_within(summary, &v, 100), None);
    }

    #[test]
    fn requests_and_replies_round_trip() {
        for r in [
            HistoryRequest::List { limit: 5 },
            HistoryRequest::Show { version: 3 },
            HistoryRequest::Rollback { version: 2 },
            HistoryRequest::Resume,
        ] {
            assert_eq!(serde_json::from_slice::<HistoryRequest>(&r.encode()).unwrap(), r);
        }
        let e = HistoryReply::Error { kind: HistoryErrorKind::NoSuchVersion, message: "x".into() };
        assert_eq!(serde_json::from_slice::<HistoryReply>(&e.encode()).unwrap(), e);
    }
}
