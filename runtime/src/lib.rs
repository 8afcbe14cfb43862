//! What the three hafleet binaries share at run time: connecting to NATS, creating the streams
//! proto names, publishing with de-duplication ids, logging and the shutdown signal.
//!
//! This is code sharing, not coupling: each binary still talks to the others only through
//! NATS subjects and proto's message types.

pub mod health;
pub mod nats;
pub mod settings;

pub use nats::NatsArgs;

/// Milliseconds since the Unix epoch, for timestamps in messages.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A time given in milliseconds since the Unix epoch, as RFC 3339 in UTC
/// (`2026-11-24T00:28:33.250Z`); the number itself if it is out of range.
pub fn rfc3339_of_unix_ms(unix_ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(unix_ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| unix_ms.to_string())
}

/// Rows as aligned columns for a terminal, two spaces apart, the last column left as it is
/// (so a long cause or message does not widen the others).
pub fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One line of text per event, for a terminal.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message`, and every field
    /// (`fleet`, `version`, `host`, `ingress`, …) at the top level, for a log pipeline.
    Json,
}

/// The logging flags every binary takes (`#[command(flatten)]`).
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log format on stderr: `text` or `json`. Text is coloured only on a terminal, and never
    /// with `NO_COLOR` set.
    #[arg(long, global = true, env = "HAFLEET_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,
    /// What to log: a level (`error`, `warn`, `info`, `debug`, `trace`) or per-module
    /// directives (`hafleet_applier=debug,info`). Unset: `RUST_LOG`, else `info`.
    #[arg(long, global = true, env = "HAFLEET_LOG_LEVEL", value_parser = log_level)]
    pub log_level: Option<String>,
}

/// A `--log-level` that tracing can read.
fn log_level(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(s).map(|_| s.to_owned()).map_err(|e| {
        format!("not a level or list of directives ({e}); try info or hafleet_applier=debug,info")
    })
}

/// Whether log text may carry colour codes: only to a terminal, and not with `NO_COLOR` set
/// (to anything but the empty string, as no-color.org says).
fn colour() -> bool {
    use std::io::IsTerminal as _;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Logs to stderr in `args`' format, filtered by `--log-level`, else `RUST_LOG` (default
/// `info`). Fields never hold secrets: NATS URLs are logged without their credentials, and key
/// material never reaches a log line.
pub fn init_tracing(args: &LogArgs) {
    let filter = match &args.log_level {
        Some(level) => tracing_subscriber::EnvFilter::new(level),
        None => {
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into())
        }
    };
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour());
    match args.log_format {
        LogFormat::Text => fmt.init(),
        LogFormat::Json => fmt.json().flatten_event(true).with_current_span(false).init(),
    }
}

/// Installs the SIGTERM and SIGINT handlers, once per process. Each binary's run calls it
/// first, so a signal during start-up (a start-up rollout, say) is noted and honoured once
/// that work is done, instead of killing the process half way.
pub fn install_shutdown_handler() -> tokio::sync::watch::Receiver<bool> {
    static SHUTDOWN: std::sync::OnceLock<tokio::sync::watch::Receiver<bool>> =
        std::sync::OnceLock::new();
    SHUTDOWN
        .get_or_init(|| {
            use tokio::signal::unix::{SignalKind, signal};
            let (tx, rx) = tokio::sync::watch::channel(false);
            let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
            let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
            tokio::spawn(async move {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                tracing::info!("stop asked for (SIGTERM or Ctrl-C); finishing work in flight");
                let _ = tx.send(true);
            });
            rx
        })
        .clone()
}

/// Resolves once SIGTERM or Ctrl-C came: the one shutdown path of every binary.
pub async fn shutdown_signal() {
    let mut rx = install_shutdown_handler();
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Tries `attempt` until it succeeds, waiting 0.5 s after the first failure and twice as long
/// after each next one (at most 30 s). Each failure is logged as what the component waits for
/// and why, and keeps it not ready with that reason. A stop asked for meanwhile ends the wait
/// with an error.
pub async fn wait_for<T, E, F>(what: &str, mut attempt: impl FnMut() -> F) -> anyhow::Result<T>
where
    E: std::fmt::Display,
    F: std::future::Future<Output = Result<T, E>>,
{
    let mut delay = std::time::Duration::from_millis(500);
    let stop = shutdown_signal();
    tokio::pin!(stop);
    loop {
        let error = match attempt().await {
            Ok(value) => {
                health::Health::global().clear_blocker("start-up");
                return Ok(value);
            }
            Err(e) => e.to_string(),
        };
        let why = format!("waiting for {what}");
        tracing::warn!(error = %error, retry_in = ?delay, "{why}");
        health::Health::global().block("start-up", &format!("{why}: {error}"));
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = &mut stop => anyhow::bail!("stopped while {why}"),
        }
        delay = (delay * 2).min(std::time::Duration::from_secs(30));
    }
}

/// Turns the result of a binary's run into its exit code, printing a failure as one line of
/// causes (`error: cannot read inventory edge.toml: No such file or directory`) rather than a
/// debug dump.
pub fn exit_code(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The operator's commands that moved from the component binaries to `hafleet`.
const MOVED: &[&str] = &[
    "history",
    "rollback",
    "resume",
    "replay",
    "sweep",
    "deadletter",
    "status",
    "keygen",
    "nats-permissions",
];

/// Refuses a command a component binary no longer has: a moved one says where it went.
pub fn moved_to_cli(binary: &str, args: &[String]) -> anyhow::Result<()> {
    let name = args.first().map(String::as_str).unwrap_or_default();
    if MOVED.contains(&name) {
        anyhow::bail!(
            "`{binary} {name}` moved to the operator CLI: run `hafleet {name} …` (its --fleet \
             and NATS flags are the same; --json is now -o json)"
        );
    }
    anyhow::bail!("{binary} has no command {name:?} (see `{binary} --help`)")
}

/// Parses a byte size for a flag: a whole number with an optional unit, `B`, `KB`/`MB`/`GB`/`TB`
/// (powers of 1000) or `KiB`/`MiB`/`GiB`/`TiB` (powers of 1024): `1GiB`, `500MB`, `0`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| format!("{text:?} is not a byte size (e.g. 1GiB)"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use B, KB, MB, GB, KiB, MiB or GiB"
            ));
        }
    };
    n.checked_mul(scale).ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod bytes_tests {
    use super::parse_bytes;

    #[test]
    fn byte_sizes_parse_with_both_kinds_of_unit_and_refuse_the_rest() {
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("500MB"), Ok(500_000_000));
        assert_eq!(parse_bytes("64 KiB"), Ok(65_536));
        assert!(parse_bytes("1.5GB").is_err());
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("99999999999TiB").is_err());
    }
}

#[cfg(test)]
mod log_tests {
    #[test]
    fn a_log_level_is_a_level_or_directives_and_nothing_else() {
        assert!(super::log_level("debug").is_ok());
        assert!(super::log_level("hafleet_applier=debug,info").is_ok());
        let e = super::log_level("hafleet=loud").unwrap_err();
        assert!(e.contains("try info"), "{e}");
    }
}
