//! The NATS permissions of one fleet's applier, as `hafleet-applier nats-permissions --fleet F`
//! prints them for the server's config. Pure.
//!
//! With them an applier can consume only its own fleet's configs (through its named durable
//! consumer, whose filter is pinned in the API subject: the server refuses a create request
//! whose filter differs from the subject's), read only its own fleet's newest config and large
//! bundles (direct gets name the subject they read), publish only its own fleet's reports, and
//! receive replies only on its own inbox prefix. It cannot read, acknowledge or forge another
//! fleet's versions or reports.

use hafleet_proto::{
    BUNDLES_STREAM, CONFIGS_STREAM, FleetName, REPORTS_STREAM, applier_consumer,
    applier_inbox_prefix, configs_subject,
};

/// The NATS config variable holding `fleet`'s applier permissions: `HAFLEET_APPLIER_<FLEET>`,
/// upper case, `-` as `_`.
pub fn variable(fleet: &FleetName) -> String {
    format!("HAFLEET_APPLIER_{}", fleet.as_str().to_ascii_uppercase().replace('-', "_"))
}

/// The NATS user name of `fleet`'s applier.
pub fn user(fleet: &FleetName) -> String {
    format!("hafleet-applier-{fleet}")
}

/// The permissions block, as a NATS config variable assignment.
pub fn nats_permissions(fleet: &FleetName) -> String {
    let consumer = applier_consumer(fleet);
    let configs = configs_subject(fleet);
    let publish = [
        format!("hafleet.reports.{fleet}.*"),
        "$JS.API.INFO".to_owned(),
        format!("$JS.API.STREAM.INFO.{CONFIGS_STREAM}"),
        format!("$JS.API.STREAM.INFO.{REPORTS_STREAM}"),
        format!("$JS.API.STREAM.CREATE.{REPORTS_STREAM}"),
        format!("$JS.API.DIRECT.GET.{CONFIGS_STREAM}.{configs}"),
        format!("$JS.API.DIRECT.GET.{BUNDLES_STREAM}.hafleet.bundles.{fleet}.>"),
        format!("$JS.API.CONSUMER.INFO.{CONFIGS_STREAM}.{consumer}"),
        format!("$JS.API.CONSUMER.CREATE.{CONFIGS_STREAM}.{consumer}.{configs}"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{CONFIGS_STREAM}.{consumer}"),
        format!("$JS.ACK.{CONFIGS_STREAM}.{consumer}.>"),
    ];
    let mut out = format!(
        "# Fleet {fleet}'s applier (user {user}), as `hafleet-applier nats-permissions --fleet \
         {fleet}` prints it.\n{var} = {{\n  publish = [\n",
        user = user(fleet),
        var = variable(fleet)
    );
    for subject in publish {
        out.push_str(&format!("    \"{subject}\",\n"));
    }
    out.push_str(&format!("  ]\n  subscribe = [\"{}.>\"]\n}}\n", applier_inbox_prefix(fleet)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subject_names_the_fleet_except_the_read_only_stream_lookups() {
        let fleet = FleetName::new("edge-eu").unwrap();
        let text = nats_permissions(&fleet);
        assert!(text.contains("HAFLEET_APPLIER_EDGE_EU = {"), "{text}");
        for line in text.lines().filter(|l| l.trim_start().starts_with('"')) {
            let generic = line.contains("$JS.API.INFO") || line.contains("$JS.API.STREAM.");
            assert!(generic || line.contains("edge-eu"), "not fleet-bound: {line}");
            assert!(!line.contains("MSG.GET"), "reads any message of the stream: {line}");
        }
        assert!(text.contains("subscribe = [\"_INBOX_edge-eu.>\"]"), "{text}");
        assert!(
            text.contains(
                "\"$JS.API.CONSUMER.CREATE.HAFLEET_CONFIGS.hafleet-applier-edge-eu.hafleet.configs.edge-eu\""
            ),
            "the consumer's filter is pinned: {text}"
        );
    }

    #[test]
    fn the_shipped_example_is_what_the_command_prints() {
        let shipped = include_str!("../../../deploy/nats/hafleet-permissions.conf");
        let edge = nats_permissions(&FleetName::new("edge").unwrap());
        assert!(shipped.contains(&edge), "deploy/nats/hafleet-permissions.conf is stale:\n{edge}");
    }
}
