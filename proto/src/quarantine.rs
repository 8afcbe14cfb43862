//! Quarantine: the renderer's answer to a version HAProxy refused because of what some
//! Ingresses made. Published by the renderer on [`crate::ROUTES_QUARANTINE_SUBJECT`], into the
//! routes stream, so that replay takes the same Ingresses out at the same point and history
//! explains it.

use crate::{FleetName, IngressKey};
use serde::{Deserialize, Serialize};

/// Takes Ingresses out of a fleet's config, each as it stands (`resource_version`): an
/// Ingress stays out until an event with another resourceVersion (its owner changed it) or
/// its deletion. Its other fleets are not touched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantine {
    pub schema: u32,
    pub fleet: FleetName,
    /// The version `haproxy -c` refused.
    pub version: u64,
    /// Each Ingress taken out, with the resourceVersion it had in that version.
    pub ingresses: Vec<(IngressKey, String)>,
    /// What HAProxy said about the lines they made (cut to [`MAX_MESSAGE`] bytes).
    pub message: String,
}

/// Most bytes of HAProxy's words a quarantine carries (they go into Events, whose notes are
/// at most 1 KB).
pub const MAX_MESSAGE: usize = 900;

/// `message` cut to at most [`MAX_MESSAGE`] bytes, on a character boundary.
pub fn cut_message(message: &str) -> String {
    if message.len() <= MAX_MESSAGE {
        return message.to_owned();
    }
    let mut end = MAX_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarantine_round_trips_and_its_message_is_cut_to_fit_an_event() {
        let q = crate::RouteMessage::Quarantine(Quarantine {
            schema: crate::PARTS_SCHEMA_VERSION,
            fleet: FleetName::new("edge").unwrap(),
            version: 7,
            ingresses: vec![(IngressKey::new("default", "bad").unwrap(), "g3".into())],
            message: cut_message(&"é".repeat(1000)),
        });
        assert_eq!(crate::RouteMessage::decode(&q.encode()).unwrap(), q);
        let crate::RouteMessage::Quarantine(q) = q else { unreachable!() };
        assert!(q.message.len() <= MAX_MESSAGE + '…'.len_utf8() && q.message.ends_with('…'));
        assert_eq!(cut_message("short"), "short");
    }
}
