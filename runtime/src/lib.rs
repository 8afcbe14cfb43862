//! What the three hafleet binaries share at run time: connecting to NATS, creating the streams
//! proto names, publishing with de-duplication ids, logging and the shutdown signal.
//!
//! This is code sharing, not coupling: each binary still talks to the others only through
//! NATS subjects and proto's message types.

pub mod nats;

pub use nats::NatsArgs;

/// Milliseconds since the Unix epoch, for timestamps in messages.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Resolves on SIGTERM or Ctrl-C: the one shutdown path of every binary.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
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
