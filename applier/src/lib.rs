//! hafleet-applier: one per fleet. Takes each config version the renderer publishes for the
//! fleet and puts it live on every HAProxy host of the fleet over SSH, safely: validate, atomic
//! swap, reload, verify, roll back on any failure, report per host.
//!
//! The folders, in the order a version meets them:
//! - [`app`]: wiring, the run loop ([`app::run`]) that takes each version;
//! - [`rollout`]: the steps of a rollout (prepare, go live, reload, repair) over the hosts,
//!   canary first, then waves;
//! - [`core`]: pure decisions: hosts ([`core::inventory`]), waves and the master CLI's words
//!   ([`core::plan`]), runtime API or reload ([`core::runtime_api`]), edits ([`core::patch`]),
//!   the fleet's TLS identity ([`core::identity`]);
//! - [`host`]: what the applier asks of a host, as a trait ([`host::ops`]) with the SSH
//!   implementation ([`host::ssh`] over the openssh pool [`host::conn`] and the `sh` scripts),
//!   an in-memory fake for tests, and the one reader of the scripts' answers;
//! - [`adapters`]: NATS ([`adapters::bus`]) and HTTP probes ([`adapters::probe`]);
//! - [`cli`]: the operator's commands (`status`, `nats-permissions`).

pub mod adapters;
pub mod app;
pub mod cli;
pub mod core;
pub mod host;
pub mod rollout;

use clap::Parser;

/// Applies a fleet's HAProxy config versions to its hosts over SSH. Without a subcommand it
/// runs (every run flag below); `status` shows what each host runs.
#[derive(Debug, Parser)]
#[command(
    name = "hafleet-applier",
    version,
    about,
    long_about = None,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: Option<app::run::RunArgs>,
    #[command(flatten)]
    pub log: hafleet_runtime::LogArgs,
}

/// The run settings alone, for a command line that gives none of them.
#[derive(Debug, Parser)]
#[command(name = "hafleet-applier")]
struct RunOnly {
    #[command(flatten)]
    run: app::run::RunArgs,
    #[command(flatten)]
    log: hafleet_runtime::LogArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// What each host of a fleet runs: live version and sha256, its last outcome and when,
    /// drift. Read from the reports stream through NATS, from any machine.
    Status(cli::status::StatusArgs),
    /// Print NATS permissions for the server's config (see
    /// deploy/nats/hafleet-permissions.conf): of one fleet's applier (--fleet), which may
    /// consume, read and report for that fleet only; or of an operator (--operator NAME),
    /// who reads every fleet's history and may roll back, resume and release sweeps of the
    /// --may-change fleets only (or of every fleet, and republish parked messages, with
    /// --operator-all).
    #[command(group = clap::ArgGroup::new("whose").required(true).args(["fleet", "operator", "operator_all"]))]
    NatsPermissions {
        /// The fleet whose applier's permissions to print.
        #[arg(long)]
        fleet: Option<hafleet_proto::FleetName>,
        /// An operator's name (an RFC 1123 label): prints HAFLEET_OPERATOR_<NAME> for user
        /// hafleet-operator-<name>.
        #[arg(long)]
        operator: Option<hafleet_proto::FleetName>,
        /// A fleet the operator may roll back, resume and release sweeps of; repeat it.
        #[arg(long = "may-change", requires = "operator", value_name = "FLEET")]
        may_change: Vec<hafleet_proto::FleetName>,
        /// The operator of every fleet (HAFLEET_OPERATOR, user hafleet-operator).
        #[arg(long)]
        operator_all: bool,
    },
    /// Make a fleet's TLS identity: writes the private half to --out (mode 0600; never
    /// overwritten) for this fleet's applier, and prints the public half (age1…) for the
    /// watcher's --seal-to FLEET=RECIPIENT. Only this file opens the fleet's TLS keys.
    Keygen {
        /// Where to write the identity file.
        #[arg(long)]
        out: std::path::PathBuf,
    },
}

impl Cli {
    /// Parses the command line and runs it; `main` is nothing more.
    pub async fn parse_and_run() -> anyhow::Result<()> {
        let cli = Cli::parse();
        hafleet_runtime::init_tracing(&cli.log);
        match cli {
            Cli { command: Some(Command::Status(args)), .. } => cli::status::status(args).await,
            Cli {
                command: Some(Command::NatsPermissions { fleet, operator, may_change, .. }),
                ..
            } => {
                use cli::permissions::{Changes, nats_permissions, operator_permissions};
                match (fleet, operator) {
                    (Some(fleet), _) => print!("{}", nats_permissions(&fleet)),
                    (None, Some(name)) => {
                        print!(
                            "{}",
                            operator_permissions(Some(&name), &Changes::Fleets(may_change))
                        )
                    }
                    (None, None) => print!("{}", operator_permissions(None, &Changes::All)),
                }
                Ok(())
            }
            Cli { command: Some(Command::Keygen { out }), .. } => keygen(&out),
            // Read the run settings as the run command alone, with its required arguments
            // required again: `run` is `None` when they all come from the environment (as
            // under systemd).
            Cli { command: None, .. } => app::run::run(RunOnly::parse().run).await,
        }
    }
}

/// `keygen`: the identity file, created 0600 and never over an existing file.
fn keygen(out: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let id = core::identity::FleetIdentity::generate();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("cannot create {} (it is never overwritten)", out.display()))?;
    f.write_all(id.to_file_text().as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", out.display()))?;
    println!("{}", id.recipient());
    Ok(())
}
