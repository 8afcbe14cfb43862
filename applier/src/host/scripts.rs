//! The scripts hafleet runs on HAProxy hosts: POSIX sh files in `scripts/`, one per operation,
//! each opening with what it takes as `$1`, `$2`, … and what it prints. Those that call
//! functions of `scripts/lib.sh` have it joined before them at compile time, and those that put
//! a change live through the runtime API `scripts/runtime.sh` after it. Each runs as
//! `sh -c <text> hafleet ARG...` (see [`crate::host::conn::HostConn::run`]); what it prints is read
//! by [`super::answer`] alone.

use std::sync::OnceLock;

/// One operation's script.
#[derive(Debug)]
pub struct Script {
    /// The operation (its file's name), for logs.
    pub name: &'static str,
    source: &'static str,
    text: OnceLock<String>,
}

impl Script {
    /// A script named `name` (for logs) made of `source`; the operations' own are the statics
    /// below.
    pub const fn new(name: &'static str, source: &'static str) -> Self {
        Script { name, source, text: OnceLock::new() }
    }

    /// The script as its files have it, comments and all.
    pub fn source(&self) -> &'static str {
        self.source
    }

    /// What is sent to the host: the source without comment lines, blank lines and
    /// indentation (a third of lib.sh is comments, sent with every command otherwise). The
    /// scripts keep no text that spans lines but awk programs, where neither matters.
    pub fn text(&self) -> &str {
        self.text.get_or_init(|| {
            let lines = self.source.lines().map(str::trim_start);
            let code: Vec<&str> = lines.filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
            code.join("\n") + "\n"
        })
    }
}

/// An operation's file with the library before it.
macro_rules! with_lib {
    ($file:literal) => {
        concat!(include_str!("scripts/lib.sh"), include_str!(concat!("scripts/", $file)))
    };
}

/// An operation's file with the library and its runtime API part (`scripts/runtime.sh`) before
/// it.
macro_rules! with_runtime_lib {
    ($file:literal) => {
        concat!(
            include_str!("scripts/lib.sh"),
            include_str!("scripts/runtime.sh"),
            include_str!(concat!("scripts/", $file))
        )
    };
}

/// See `scripts/live_state.sh`.
pub static LIVE_STATE: Script = Script::new("live_state", with_lib!("live_state.sh"));
/// See `scripts/refresh.sh`.
pub static REFRESH: Script = Script::new("refresh", with_lib!("refresh.sh"));
/// See `scripts/mark_loaded.sh`.
pub static MARK_LOADED: Script = Script::new("mark_loaded", with_lib!("mark_loaded.sh"));
/// See `scripts/drift_state.sh`.
pub static DRIFT_STATE: Script = Script::new("drift_state", with_lib!("drift_state.sh"));
/// See `scripts/discard.sh`.
pub static DISCARD: Script = Script::new("discard", include_str!("scripts/discard.sh"));
/// See `scripts/upload_files.sh`.
pub static UPLOAD_FILES: Script = Script::new("upload_files", with_runtime_lib!("upload_files.sh"));
/// See `scripts/upload_validate.sh`.
pub static UPLOAD_VALIDATE: Script =
    Script::new("upload_validate", with_runtime_lib!("upload_validate.sh"));
/// See `scripts/swap.sh`.
pub static SWAP: Script = Script::new("swap", with_lib!("swap.sh"));
/// See `scripts/reload_wait.sh`.
pub static RELOAD_WAIT: Script = Script::new("reload_wait", with_lib!("reload_wait.sh"));
/// See `scripts/swap_reload.sh`.
pub static SWAP_RELOAD: Script = Script::new("swap_reload", with_lib!("swap_reload.sh"));
/// See `scripts/swap_runtime.sh`.
pub static SWAP_RUNTIME: Script = Script::new("swap_runtime", with_runtime_lib!("swap_runtime.sh"));
/// See `scripts/restore.sh`.
pub static RESTORE: Script = Script::new("restore", with_lib!("restore.sh"));
/// See `scripts/upload_maps.sh`.
pub static UPLOAD_MAPS: Script = Script::new("upload_maps", with_lib!("upload_maps.sh"));
/// See `scripts/upload_certs.sh`.
pub static UPLOAD_CERTS: Script = Script::new("upload_certs", with_lib!("upload_certs.sh"));
/// See `scripts/master_cli.sh`.
pub static MASTER_CLI: Script = Script::new("master_cli", include_str!("scripts/master_cli.sh"));
/// See `scripts/master_session.sh`.
pub static MASTER_SESSION: Script =
    Script::new("master_session", include_str!("scripts/master_session.sh"));
/// Does nothing: checks that a pooled connection still runs commands.
pub static NOOP: Script = Script::new("noop", "true\n");

/// Every script, for tests.
#[cfg(test)]
pub(crate) static ALL: [&Script; 17] = [
    &LIVE_STATE,
    &REFRESH,
    &MARK_LOADED,
    &DRIFT_STATE,
    &DISCARD,
    &UPLOAD_FILES,
    &UPLOAD_VALIDATE,
    &SWAP,
    &RELOAD_WAIT,
    &SWAP_RELOAD,
    &SWAP_RUNTIME,
    &RESTORE,
    &UPLOAD_MAPS,
    &UPLOAD_CERTS,
    &MASTER_CLI,
    &MASTER_SESSION,
    &NOOP,
];

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_runtime;
