//! Who a command asks and how: the global flags, each over its `HAFLEET_*` environment
//! variable, over the context file's current context, over the defaults.

use crate::context::{ContextFile, Settings};
use crate::output::Output;
use anyhow::{Context as _, bail};
use hafleet_proto::{FleetName, FleetSummary, HistoryErrorKind, HistoryReply};
use hafleet_runtime::NatsArgs;
use hafleet_runtime::nats::Bus;
use std::path::PathBuf;
use std::time::Duration;

/// The NATS server a command asks when nothing names one.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

/// Flags every command takes (before or after its name).
#[derive(Debug, Clone, clap::Args)]
pub struct GlobalArgs {
    /// Output format: `table` (text for people), `json` or `yaml` (for programs; every
    /// command's fields, stable across releases).
    #[arg(short, long, global = true, env = "HAFLEET_OUTPUT", value_enum, default_value_t)]
    pub output: Output,
    /// The context to use instead of the context file's current one.
    #[arg(long, global = true, env = "HAFLEET_CONTEXT")]
    pub context: Option<String>,
    /// The context file (default: $XDG_CONFIG_HOME/hafleet/config.yaml, else
    /// ~/.config/hafleet/config.yaml).
    #[arg(long, global = true, env = "HAFLEET_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The fleet to read or change (default: the context's, else the only fleet there is).
    #[arg(long, global = true, env = "HAFLEET_FLEET")]
    pub fleet: Option<FleetName>,
    /// NATS server URL: `tls://host:4222` or `nats://host:4222`, several comma-separated
    /// (default: the context's, else nats://127.0.0.1:4222). Keep credentials out of it: use
    /// --nats-creds.
    #[arg(long, global = true, env = "HAFLEET_NATS_URL", hide_env_values = true)]
    pub nats_url: Option<String>,
    /// CA certificates (PEM) that the server's certificate must chain to; given, the
    /// connection is TLS or nothing.
    #[arg(long, global = true, env = "HAFLEET_NATS_CA", value_name = "FILE")]
    pub nats_ca: Option<PathBuf>,
    /// A client certificate (PEM), for servers that verify clients (with --nats-key).
    #[arg(long, global = true, env = "HAFLEET_NATS_CERT", value_name = "FILE")]
    pub nats_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, global = true, env = "HAFLEET_NATS_KEY", value_name = "FILE")]
    pub nats_key: Option<PathBuf>,
    /// Who you are to NATS: a `.creds` file or a file holding an NKEY user seed (`SU…`),
    /// as an operator user (see `hafleet nats-permissions --operator`). Never shown.
    #[arg(long, global = true, env = "HAFLEET_NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// How long to wait for the renderer's answer or a stream (e.g. 10s, 1m).
    #[arg(long, global = true, env = "HAFLEET_TIMEOUT", default_value = "10s",
          value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

impl GlobalArgs {
    /// The connection settings these flags (or their environment variables) give.
    pub fn settings(&self) -> Settings {
        Settings {
            nats_url: self.nats_url.clone(),
            nats_ca: self.nats_ca.clone(),
            nats_cert: self.nats_cert.clone(),
            nats_key: self.nats_key.clone(),
            nats_creds: self.nats_creds.clone(),
            fleet: self.fleet.clone(),
        }
    }

    /// Those of them given on the command line itself, not by the environment (what
    /// `hafleet context set` writes).
    pub fn given_on_command_line(&self, matches: &clap::ArgMatches) -> Settings {
        let given =
            |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        let s = self.settings();
        Settings {
            nats_url: s.nats_url.filter(|_| given("nats_url")),
            nats_ca: s.nats_ca.filter(|_| given("nats_ca")),
            nats_cert: s.nats_cert.filter(|_| given("nats_cert")),
            nats_key: s.nats_key.filter(|_| given("nats_key")),
            nats_creds: s.nats_creds.filter(|_| given("nats_creds")),
            fleet: s.fleet.filter(|_| given("fleet")),
        }
    }
}

/// What a command that talks to NATS needs.
#[derive(Debug)]
pub struct Session {
    pub nats: NatsArgs,
    pub fleet: Option<FleetName>,
    pub timeout: Duration,
    pub output: Output,
    /// The context the settings came from, to name in errors.
    pub context: Option<String>,
}

impl Session {
    /// The settings of `global` over its context's.
    pub fn new(global: &GlobalArgs) -> anyhow::Result<Session> {
        let file = ContextFile::load(global.config.as_deref(), true)?;
        let (context, base) = match file.chosen(global.context.as_deref())? {
            Some((name, settings)) => (Some(name.to_owned()), settings.clone()),
            None => (None, Settings::default()),
        };
        let s = global.settings().over(&base);
        if s.nats_cert.is_some() != s.nats_key.is_some() {
            bail!("--nats-cert and --nats-key go together: give both or neither");
        }
        Ok(Session {
            nats: NatsArgs {
                nats_url: s.nats_url.unwrap_or_else(|| DEFAULT_NATS_URL.to_owned()),
                nats_ca: s.nats_ca,
                nats_cert: s.nats_cert,
                nats_key: s.nats_key,
                nats_creds: s.nats_creds,
                nats_replicas: 1,
            },
            fleet: s.fleet,
            timeout: global.timeout,
            output: global.output,
            context,
        })
    }

    /// Connects to NATS once; a failure says where the address came from.
    pub async fn connect(&self) -> anyhow::Result<Bus> {
        self.nats.connect().await.with_context(|| match &self.context {
            Some(c) => format!("context {c:?}: check its NATS settings (`hafleet context list`)"),
            None => "give --nats-url (and --nats-creds), or set up a context: \
                     `hafleet context set NAME --nats-url URL --nats-creds FILE`"
                .to_owned(),
        })
    }

    /// Says on stderr what a change is about to act on (fleet, NATS, context): settings can
    /// come from flags, the environment and the context, each filling what the other leaves.
    pub fn announce_change(&self, what: &str, fleet: &FleetName) {
        let url = hafleet_runtime::nats::redact(&self.nats.nats_url);
        match &self.context {
            Some(c) => eprintln!("{what} fleet {fleet} at {url} (context {c})"),
            None => eprintln!("{what} fleet {fleet} at {url}"),
        }
    }

    /// The fleet to act on: the one given, the context's, or the only one the renderer knows.
    pub async fn fleet(&self, bus: &Bus) -> anyhow::Result<FleetName> {
        if let Some(fleet) = &self.fleet {
            return Ok(fleet.clone());
        }
        let known = self.fleets(bus).await.context("no fleet given (--fleet NAME)")?;
        match known.as_slice() {
            [one] => Ok(one.name.clone()),
            [] => bail!("the renderer knows no fleet yet: nothing to show"),
            many => bail!(
                "which fleet? the renderer knows {}; give --fleet NAME, or set a default with \
                 `hafleet context set NAME --fleet FLEET`",
                names(many)
            ),
        }
    }

    /// Every fleet the running renderer knows.
    pub async fn fleets(&self, bus: &Bus) -> anyhow::Result<Vec<FleetSummary>> {
        let subject = hafleet_proto::FLEETS_SUBJECT.to_owned();
        match self.request(bus, subject, Vec::new()).await? {
            HistoryReply::Fleets { fleets } => Ok(fleets),
            other => bail!("unexpected answer from the renderer: {other:?}"),
        }
    }

    /// Sends `payload` to the renderer on `subject` and returns its answer; error replies
    /// become errors (an unknown fleet's names the fleets there are).
    pub async fn request(
        &self,
        bus: &Bus,
        subject: String,
        payload: Vec<u8>,
    ) -> anyhow::Result<HistoryReply> {
        let reply = request_reply(bus, subject, payload, self.timeout).await?;
        let HistoryReply::Error { kind, message } = reply else { return Ok(reply) };
        let what = match kind {
            HistoryErrorKind::UnknownFleet => {
                let known = match Box::pin(self.fleets(bus)).await {
                    Ok(known) if !known.is_empty() => format!(" (fleets: {})", names(&known)),
                    _ => String::new(),
                };
                bail!("unknown fleet: {message}{known}");
            }
            HistoryErrorKind::NoSuchVersion => "no such version",
            HistoryErrorKind::NoSuchSweep => "no such sweep",
            HistoryErrorKind::NoSuchMessage => "no such parked message",
            HistoryErrorKind::BadRequest => "bad request",
            HistoryErrorKind::Internal => "the renderer failed",
        };
        bail!("{what}: {message}")
    }
}

/// `core, edge`.
fn names(fleets: &[FleetSummary]) -> String {
    let names: Vec<&str> = fleets.iter().map(|f| f.name.as_str()).collect();
    names.join(", ")
}

/// One request and its reply, within `timeout`.
async fn request_reply(
    bus: &Bus,
    subject: String,
    payload: Vec<u8>,
    timeout: Duration,
) -> anyhow::Result<HistoryReply> {
    let sent = bus.client.request(subject, payload.into());
    let answer = tokio::time::timeout(timeout, sent)
        .await
        .map_err(|_| anyhow::anyhow!("no answer from the renderer within {timeout:?}"))?
        .context("the renderer did not answer (is `hafleet-renderer run` running?)")?;
    serde_json::from_slice(&answer.payload).context("the renderer's answer is unreadable")
}
