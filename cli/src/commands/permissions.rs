//! The NATS permissions of one fleet's applier or of an operator, as `hafleet nats-permissions`
//! prints them for the server's config. Pure, but for printing them.
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

/// Whose permissions `hafleet nats-permissions` prints: a fleet's applier (the global
/// `--fleet`, or the context's fleet), or an operator.
#[derive(Debug, clap::Args)]
pub struct PermissionsArgs {
    /// An operator's name (an RFC 1123 label): prints HAFLEET_OPERATOR_<NAME> for user
    /// hafleet-operator-<name>, who reads every fleet's history and may roll back, resume and
    /// release sweeps of the --may-change fleets only.
    #[arg(long, conflicts_with = "operator_all")]
    pub operator: Option<FleetName>,
    /// A fleet the operator may roll back, resume and release sweeps of; repeat it.
    #[arg(long = "may-change", requires = "operator", value_name = "FLEET")]
    pub may_change: Vec<FleetName>,
    /// The operator of every fleet (HAFLEET_OPERATOR, user hafleet-operator), who may also
    /// republish parked messages.
    #[arg(long)]
    pub operator_all: bool,
}

/// Prints the block `args` ask for; without an operator, `fleet`'s applier's.
pub fn print(args: &PermissionsArgs, fleet: Option<&FleetName>) -> anyhow::Result<()> {
    let text = match (&args.operator, args.operator_all, fleet) {
        (Some(name), _, _) => {
            operator_permissions(Some(name), &Changes::Fleets(args.may_change.clone()))
        }
        (None, true, _) => operator_permissions(None, &Changes::All),
        (None, false, Some(fleet)) => nats_permissions(fleet),
        (None, false, None) => anyhow::bail!(
            "whose permissions? give --fleet FLEET (its applier's), --operator NAME or \
             --operator-all"
        ),
    };
    print!("{text}");
    Ok(())
}

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
        "# Fleet {fleet}'s applier (user {user}), as `hafleet nats-permissions --fleet {fleet}` \
         prints it.\n{var} = {{\n  publish = [\n",
        user = user(fleet),
        var = variable(fleet)
    );
    for subject in publish {
        out.push_str(&format!("    \"{subject}\",\n"));
    }
    out.push_str(&format!("  ]\n  subscribe = [\"{}.>\"]\n}}\n", applier_inbox_prefix(fleet)));
    out
}

/// Whose rollbacks, resumes and sweep releases an operator may send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changes {
    /// Every fleet's, and republishing parked route messages (`hafleet.history.*.change`).
    All,
    /// These fleets' only (none: reads only).
    Fleets(Vec<FleetName>),
}

/// What every operator reads: the renderer's history (request/reply), the reports, large
/// bundles, the routes stream and checkpoints (replay) and the parked messages. Comment lines
/// start with `#`.
const OPERATOR_READS: &[&str] = &[
    "hafleet.history.*",
    "$JS.API.INFO",
    "$JS.API.STREAM.INFO.HAFLEET_REPORTS",
    "$JS.API.STREAM.MSG.GET.HAFLEET_REPORTS",
    "$JS.API.DIRECT.GET.HAFLEET_REPORTS.>",
    "# hafleet status: a fleet's reports read with an ordered consumer.",
    "$JS.API.CONSUMER.CREATE.HAFLEET_REPORTS",
    "$JS.FC.HAFLEET_REPORTS.>",
    "$JS.API.DIRECT.GET.HAFLEET_BUNDLES.>",
    "# replay: the routes stream read with ordered consumers, and the checkpoints.",
    "$JS.API.STREAM.INFO.HAFLEET_ROUTES",
    "$JS.API.CONSUMER.CREATE.HAFLEET_ROUTES",
    "$JS.FC.HAFLEET_ROUTES.>",
    "$JS.API.STREAM.INFO.OBJ_hafleet-checkpoints",
    "$JS.API.STREAM.MSG.GET.OBJ_hafleet-checkpoints",
    "$JS.API.DIRECT.GET.OBJ_hafleet-checkpoints.>",
    "$JS.API.CONSUMER.CREATE.OBJ_hafleet-checkpoints",
    "$JS.FC.OBJ_hafleet-checkpoints.>",
    "# deadletter list|show: the route messages the renderer parked.",
    "$JS.API.STREAM.INFO.HAFLEET_DEADLETTER",
    "$JS.API.STREAM.MSG.GET.HAFLEET_DEADLETTER",
];

/// The NATS config variable of operator `name` (`None`: the operator of every fleet):
/// `HAFLEET_OPERATOR` or `HAFLEET_OPERATOR_<NAME>`.
pub fn operator_variable(name: Option<&FleetName>) -> String {
    match name {
        None => "HAFLEET_OPERATOR".to_owned(),
        Some(n) => {
            format!("HAFLEET_OPERATOR_{}", n.as_str().to_ascii_uppercase().replace('-', "_"))
        }
    }
}

/// The NATS user name of operator `name`: `hafleet-operator` or `hafleet-operator-<name>`.
pub fn operator_user(name: Option<&FleetName>) -> String {
    match name {
        None => "hafleet-operator".to_owned(),
        Some(n) => format!("hafleet-operator-{n}"),
    }
}

/// An operator's permissions block: every read, and the changes `changes` allows. `name`
/// (an RFC 1123 label, like a fleet's) names the variable and the user.
pub fn operator_permissions(name: Option<&FleetName>, changes: &Changes) -> String {
    let (what, command) = match changes {
        Changes::All => (
            "reads, and rollback, resume, sweep release of every fleet and deadletter \
             republish"
                .to_owned(),
            "--operator-all".to_owned(),
        ),
        Changes::Fleets(f) if f.is_empty() => ("reads only".to_owned(), String::new()),
        Changes::Fleets(f) => {
            let names: Vec<&str> = f.iter().map(|f| f.as_str()).collect();
            let flags: Vec<String> = names.iter().map(|n| format!(" --may-change {n}")).collect();
            (
                format!("reads, and rollback, resume, sweep release of {}", names.join(", ")),
                flags.concat(),
            )
        }
    };
    let command = match name {
        Some(n) => format!("--operator {n}{command}"),
        None => command,
    };
    let mut out = format!(
        "# User {user}: {what}.\n# As `hafleet nats-permissions {command}` prints it.\n{var} = {{\n  publish = [\n",
        user = operator_user(name),
        command = command.trim_start(),
        var = operator_variable(name),
    );
    let mut line = |subject: &str| match subject.strip_prefix('#') {
        Some(comment) => out.push_str(&format!("    #{comment}\n")),
        None => out.push_str(&format!("    \"{subject}\",\n")),
    };
    for subject in OPERATOR_READS {
        line(subject);
    }
    match changes {
        Changes::All => {
            line("# Every fleet's changes, and republishing parked messages.");
            line(hafleet_proto::HISTORY_CHANGE_SUBJECTS);
        }
        Changes::Fleets(fleets) => {
            for fleet in fleets {
                line(&hafleet_proto::history_change_subject(fleet));
            }
        }
    }
    out.push_str("  ]\n  subscribe = [\"_INBOX.>\"]\n}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_of_some_fleets_may_change_those_only_and_republish_nothing() {
        let edge = FleetName::new("edge").unwrap();
        let core = FleetName::new("core").unwrap();
        let name = FleetName::new("oncall-eu").unwrap();
        let text = operator_permissions(Some(&name), &Changes::Fleets(vec![edge, core]));
        assert!(text.contains("HAFLEET_OPERATOR_ONCALL_EU = {"), "{text}");
        assert!(text.contains("User hafleet-operator-oncall-eu:"), "{text}");
        assert!(
            text.contains(
                "nats-permissions --operator oncall-eu --may-change edge --may-change core`"
            ),
            "{text}"
        );
        let changes: Vec<&str> = text.lines().filter(|l| l.contains(".change")).collect();
        assert_eq!(
            changes,
            ["    \"hafleet.history.edge.change\",", "    \"hafleet.history.core.change\","],
            "{text}"
        );
        assert!(!text.contains("*.change") && !text.contains("_deadletter"), "{text}");
        // Nothing that writes a stream or a route event.
        for l in text.lines().filter(|l| l.trim_start().starts_with('"')) {
            assert!(!l.contains("hafleet.routes") && !l.contains("hafleet.configs"), "{l}");
            assert!(!l.contains("CREATE.HAFLEET") || l.contains("CONSUMER.CREATE"), "{l}");
        }
    }

    #[test]
    fn the_shipped_operator_blocks_are_what_the_command_prints() {
        let shipped = include_str!("../../../deploy/nats/hafleet-permissions.conf");
        let reader = FleetName::new("reader").unwrap();
        for block in [
            operator_permissions(None, &Changes::All),
            operator_permissions(Some(&reader), &Changes::Fleets(vec![])),
        ] {
            assert!(
                shipped.contains(&block),
                "deploy/nats/hafleet-permissions.conf is stale:\n{block}"
            );
        }
    }

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
