//! What the host scripts answer, read in one place: each operation's stdout and exit code
//! become a typed value here, and nothing else in the applier splits a script's output or
//! matches its exit codes. (HAProxy's own answers inside them, such as `show proc`, are read
//! by [`crate::core::plan`] and [`crate::core::runtime_api`].)

use crate::core::plan::{self, HostFiles, NodeChecks, ProcState};
use hafleet_proto::ApplyStage;

/// The step a script that does several in one round trip failed at, from its exit code
/// (`EXIT_*` in `scripts/lib.sh`; no tool the scripts run exits with these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The files did not arrive whole (64).
    Upload,
    /// The upload could not be renamed over the live file (65): nothing changed.
    Swap,
    /// The master socket could not be asked for a reload (66).
    AskReload,
    /// The host's live file or loaded marker is not what it was when it was prepared (67):
    /// nothing was done.
    Stale,
    /// The master's `show proc` could not be read before the reload (68): nothing was done.
    NoProc,
}

impl Exit {
    const ALL: [Exit; 5] = [Exit::Upload, Exit::Swap, Exit::AskReload, Exit::Stale, Exit::NoProc];

    /// The step an exit code names; `None` for any other code.
    pub fn of(code: Option<i32>) -> Option<Exit> {
        Exit::ALL.into_iter().find(|e| Some(e.code()) == code)
    }

    pub fn code(self) -> i32 {
        match self {
            Exit::Upload => 64,
            Exit::Swap => 65,
            Exit::AskReload => 66,
            Exit::Stale => 67,
            Exit::NoProc => 68,
        }
    }

    /// The stage a failure at this step is reported at. Not being able to ask for a reload is
    /// a transient failure; only HAProxy refusing the config is a `Reload` failure, which the
    /// same config would meet again.
    pub fn stage(self) -> ApplyStage {
        match self {
            Exit::Upload => ApplyStage::Upload,
            Exit::Swap | Exit::Stale => ApplyStage::Swap,
            Exit::NoProc | Exit::AskReload => ApplyStage::Verify,
        }
    }

    /// Failed before it changed anything on the host (the swap, or what comes before it).
    pub fn changed_nothing(self) -> bool {
        matches!(self, Exit::Swap | Exit::Stale | Exit::NoProc)
    }
}

/// The sha256 of a host's live file and of the config its HAProxy last loaded, as
/// `live_shas` prints them (empty: unknown): what a host was prepared on, checked again
/// before it goes live.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveShas {
    pub live: String,
    pub loaded: String,
}

impl LiveShas {
    /// The first two lines of `text`; either may be missing (refresh.sh's part before `--`
    /// loses a trailing empty one).
    fn read(text: &str) -> LiveShas {
        let mut lines = text.lines().map(str::trim);
        let mut line = || lines.next().unwrap_or_default().to_owned();
        LiveShas { live: line(), loaded: line() }
    }

    pub fn live(&self) -> Option<&str> {
        Some(self.live.as_str()).filter(|s| !s.is_empty())
    }

    pub fn loaded(&self) -> Option<&str> {
        Some(self.loaded.as_str()).filter(|s| !s.is_empty())
    }
}

/// What live_state.sh prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveState {
    pub shas: LiveShas,
    /// The files named on its stdin that the host lacks (maps by name, certificate files as
    /// `../hafleet-certs/<id>.pem`).
    pub missing: Vec<String>,
}

impl LiveState {
    pub fn parse(out: &str) -> LiveState {
        let shas = LiveShas::read(out);
        let missing = out.lines().skip(2).map(str::trim).filter(|l| !l.is_empty());
        LiveState { shas, missing: missing.map(str::to_owned).collect() }
    }
}

/// What refresh.sh prints: the host's sha256 lines and its master's `show proc` now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refresh {
    pub shas: LiveShas,
    /// `None`: no `show proc` could be read (or no `--` came at all).
    pub proc: Option<ProcState>,
}

impl Refresh {
    pub fn parse(out: &str) -> Refresh {
        match out.split_once("\n--\n") {
            Some((files, proc)) => {
                Refresh { shas: LiveShas::read(files), proc: plan::parse_show_proc(proc) }
            }
            None => Refresh { shas: LiveShas::read(out), proc: None },
        }
    }
}

/// What upload_files.sh and upload_validate.sh print: the upload's sha256
/// and stat (the first two), then `show proc` (the last two).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uploaded {
    /// The upload's sha256 as the host hashed it.
    pub sha: Option<String>,
    /// The upload's stat (`%i %s %y`): a rename keeps it, so the live file having it later is
    /// the upload itself, and marking it loaded need not hash it again.
    pub stat: Option<String>,
    /// The master's `show proc` after the check, as printed (for a message if unreadable).
    pub proc: String,
}

impl Uploaded {
    pub fn parse(out: &str) -> Uploaded {
        let mut lines = out.lines().peekable();
        let is_sha = |l: &&str| l.len() == 64 && l.bytes().all(|b| b.is_ascii_hexdigit());
        let sha = lines.next_if(is_sha).map(str::to_owned);
        let stat = lines.next_if(|l| l.starts_with("hafleet-stat "));
        let stat = stat.map(|l| l["hafleet-stat ".len()..].to_owned());
        let proc: Vec<&str> = lines.collect();
        Uploaded { sha, stat, proc: proc.join("\n") }
    }

    /// The master's `show proc`, if it could be read.
    pub fn show_proc(&self) -> Option<ProcState> {
        plan::parse_show_proc(&self.proc)
    }
}

/// What an upload that went live in its own round trip printed (upload_files.sh with a
/// session): what the upload printed, and what the change printed after its `hafleet-live`
/// line. `None`: no such line (the upload or its check failed, or nothing went live).
pub fn went_live(out: &str) -> Option<(&str, &str)> {
    if let Some(after) = out.strip_prefix("hafleet-live\n") {
        return Some(("", after));
    }
    let at = out.find("\nhafleet-live\n")?;
    Some((&out[..at + 1], &out[at + "\nhafleet-live\n".len()..]))
}

/// What swap_runtime.sh printed after its swap: the runtime session's output, or that the
/// maps could not be prepared (`hafleet-runtime-skipped`), so nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwapRuntime {
    /// The session was sent; what it printed (read by `runtime::answers`).
    Sent(String),
    /// A map was not in `show map` once, a map to edit did not hold the entries its edits
    /// start from, or `prepare map` did not give a version: the swap stands and the caller
    /// reloads. Why, from the script's stderr.
    Skipped(String),
}

impl SwapRuntime {
    pub fn parse(stdout: &str, stderr: &str) -> SwapRuntime {
        match stdout.trim() == "hafleet-runtime-skipped" {
            true => SwapRuntime::Skipped(stderr.trim().to_owned()),
            false => SwapRuntime::Sent(stdout.to_owned()),
        }
    }
}

/// What the master answered to `reload`. HAProxy 3.1 and later answer once the new worker is
/// up or has failed: `Success=1` or `Success=0`, then `--` and the startup logs; 2.6 closes
/// the connection without a word as the master re-executes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MasterAnswer {
    /// No answer (HAProxy 2.6): only `show proc` tells how the reload went.
    Silent,
    /// `Success=1`: the new worker started. The startup logs (warnings, notices).
    Loaded { logs: String },
    /// `Success=0` because a reload still starting its worker held this one off: nothing
    /// was done; ask again.
    Busy,
    /// `Success=0`: the new worker did not start (the config was refused); the old ones
    /// still serve. The startup logs say why.
    Refused { logs: String },
    /// Anything else, kept for the log.
    Other(String),
}

impl MasterAnswer {
    pub fn parse(text: &str) -> MasterAnswer {
        let text = text.trim();
        if text.is_empty() {
            return MasterAnswer::Silent;
        }
        let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
        let logs = rest.strip_prefix("--\n").unwrap_or(rest).trim();
        let logs = if rest.trim() == "--" { "" } else { logs }.to_owned();
        match first.trim() {
            "Success=1" => MasterAnswer::Loaded { logs },
            "Success=0" if logs.contains("Another reload is still in progress") => {
                MasterAnswer::Busy
            }
            "Success=0" => MasterAnswer::Refused { logs },
            _ => MasterAnswer::Other(text.to_owned()),
        }
    }
}

/// What reload_wait.sh and swap_reload.sh print: `show proc` before the reload and `--`, the
/// master's answer to `reload` (`hafleet-answer ` lines), the last `show proc` the host saw,
/// `hafleet-looks <n>`, and `hafleet-marked-loaded` if it marked the file loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reload {
    /// `show proc` before the reload, as printed.
    pub before: String,
    pub master: MasterAnswer,
    /// The last `show proc` the host saw (`None`: pending, or it could not be read).
    pub after: Option<ProcState>,
    /// How many looks the host took before it stopped looking.
    pub looks: Option<u32>,
    /// The host saw the reload done, as ours, and marked the live file loaded.
    pub marked: bool,
}

impl Reload {
    pub fn parse(out: &str) -> Reload {
        let (before, rest) = out.split_once("\n--\n").unwrap_or_default();
        let mut answer = Vec::new();
        let mut after = Vec::new();
        let (mut looks, mut marked) = (None, false);
        for line in rest.lines() {
            if let Some(said) = line.strip_prefix("hafleet-answer ") {
                answer.push(said);
            } else if let Some(n) = line.strip_prefix("hafleet-looks ") {
                looks = n.trim().parse().ok();
            } else if line == "hafleet-marked-loaded" {
                marked = true;
            } else {
                after.push(line);
            }
        }
        Reload {
            before: before.to_owned(),
            master: MasterAnswer::parse(&answer.join("\n")),
            after: plan::parse_show_proc(&after.join("\n")),
            looks,
            marked,
        }
    }
}

/// `show proc` as the master printed it (`stdout`, `stderr`), or why it cannot be read from
/// `socket`.
pub fn show_proc(socket: &str, stdout: &str, stderr: &str) -> Result<ProcState, String> {
    plan::parse_show_proc(stdout).ok_or_else(|| {
        format!(
            "cannot read `show proc` from the master socket {socket}: {}{}",
            stdout.trim(),
            stderr.trim()
        )
    })
}

/// What drift_state.sh prints: the two sha256 lines (empty if unknown), the loaded marker's
/// second line (`reloads <count>`, empty if none), then `<name> <sha256 or ->` per file,
/// then `show proc` after a `--` line, then the node checks' `show stat` after another.
pub fn drift_state(out: &str) -> HostFiles {
    let (files, rest) = out.split_once("\n--\n").unwrap_or((out, ""));
    let (proc, stat) = rest.split_once("\n--\n").unwrap_or((rest, ""));
    let mut lines = files.lines().map(str::trim);
    let mut line = || lines.next().filter(|s| !s.is_empty()).map(str::to_owned);
    let (live, loaded, marked) = (line(), line(), line());
    let maps = lines
        .filter_map(|l| {
            let (name, sha) = l.split_once(' ')?;
            Some((name.to_owned(), (sha != "-").then(|| sha.to_owned())))
        })
        .collect();
    HostFiles {
        live,
        loaded,
        maps,
        reloads_marked: marked.and_then(|m| m.strip_prefix("reloads ")?.parse().ok()),
        reloads_now: plan::parse_show_proc(proc).map(|p| p.reloads),
        nodes: NodeChecks::parse(stat),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const SHA_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    // HAProxy 2.6.12's `show proc` (Debian bookworm), before and after a reload.
    const PROC_0: &str = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n20559           master          0 [failed: 0]   0d00h00m01s     2.6.12-1+deb12u4\n# workers\n20562           worker          0               0d00h00m01s     2.6.12-1+deb12u4\n# programs\n";
    const PROC_1: &str = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n20559           master          1 [failed: 0]   0d00h00m02s     2.6.12-1+deb12u4\n# workers\n20571           worker          0               0d00h00m01s     2.6.12-1+deb12u4\n# old workers\n20562           worker          1               0d00h00m02s     2.6.12-1+deb12u4\n# programs\n";

    #[test]
    fn exit_codes_are_the_scripts_and_name_their_step() {
        let lib = include_str!("scripts/lib.sh");
        for (name, exit) in [
            ("EXIT_UPLOAD", Exit::Upload),
            ("EXIT_SWAP", Exit::Swap),
            ("EXIT_ASK_RELOAD", Exit::AskReload),
            ("EXIT_STALE", Exit::Stale),
            ("EXIT_NO_PROC", Exit::NoProc),
        ] {
            assert!(lib.contains(&format!("\n{name}={}\n", exit.code())), "{name}");
            assert_eq!(Exit::of(Some(exit.code())), Some(exit));
        }
        assert_eq!(Exit::of(Some(1)), None);
        assert_eq!(Exit::of(None), None);
        assert_eq!(Exit::AskReload.stage(), ApplyStage::Verify);
        assert!(Exit::Stale.changed_nothing() && !Exit::AskReload.changed_nothing());
    }

    #[test]
    fn live_state_reads_two_sha_lines_then_the_missing_names() {
        let state =
            LiveState::parse(&format!("{SHA_A}\n{SHA_B}\nexact-1.map\n../hafleet-certs/c.pem\n"));
        assert_eq!(state.shas.live(), Some(SHA_A));
        assert_eq!(state.shas.loaded(), Some(SHA_B));
        assert_eq!(state.missing, ["exact-1.map", "../hafleet-certs/c.pem"]);
        // A host HAProxy never loaded a config of hafleet's on has no marker: its second line
        // is empty, in live_state.sh's answer and in refresh.sh's alike, and the two agree
        // (they did not once, and every new host was prepared twice).
        let new = LiveState::parse(&format!("{SHA_A}\n\n../hafleet-certs/a.pem\n"));
        let refresh = Refresh::parse(&format!("{SHA_A}\n\n--\n{PROC_0}"));
        assert_eq!(new.shas, refresh.shas);
        assert_eq!(new.shas.loaded(), None);
        assert_eq!(refresh.proc.unwrap().reloads, 0);
        assert_ne!(
            LiveState::parse(&format!("{SHA_A}\n\n")).shas,
            LiveState::parse(&format!("{SHA_A}\n{SHA_B}\n")).shas
        );
        assert_eq!(LiveState::parse("\n\n").shas, LiveShas::default());
        // No `--` (the script was cut short): no `show proc`, so the host is prepared again.
        assert_eq!(Refresh::parse(&format!("{SHA_A}\n{SHA_B}\n")).proc, None);
    }

    #[test]
    fn uploads_read_their_sha_stat_and_show_proc() {
        let stat = "1234 2800000 2026-11-26 21:00:00.123456789 +0000";
        let files = Uploaded::parse(&format!("{SHA_A}\nhafleet-stat {stat}\n"));
        assert_eq!(files.sha.as_deref(), Some(SHA_A));
        assert_eq!(files.stat.as_deref(), Some(stat));
        assert_eq!(files.show_proc(), None);
        let validated = Uploaded::parse(&format!("{SHA_A}\nhafleet-stat {stat}\n{PROC_0}"));
        assert_eq!(validated.stat.as_deref(), Some(stat));
        assert_eq!(validated.show_proc().unwrap().workers, [(20562, 0)]);
        // `show proc` alone; a master that cannot answer leaves what socat said, for the
        // message.
        let maps = Uploaded::parse(PROC_0);
        assert_eq!((&maps.sha, &maps.stat), (&None, &None));
        assert_eq!(maps.show_proc().unwrap().reloads, 0);
        let none = Uploaded::parse("2026/11/26 socat[1] E connect(): No such file or directory\n");
        assert!(none.show_proc().is_none() && none.proc.contains("No such file"));
    }

    // HAProxy 3.1's answers to `reload` on the master CLI, as its mworker code writes them
    // (`Success=%d`, `--`, then the startup-logs ring); no 3.1 runs here to record them from.
    const RELOADED_3_1: &str = "Success=1\n--\n[NOTICE]   (20559) : haproxy version is 3.1.2-1\n[NOTICE]   (20559) : path to executable is /usr/sbin/haproxy\n[WARNING]  (20559) : config : missing timeouts for backend 'be_a'.\n";
    const REFUSED_3_1: &str = "Success=0\n--\n[NOTICE]   (20559) : haproxy version is 3.1.2-1\n[ALERT]    (20559) : config : parsing [/etc/haproxy/haproxy.cfg:12] : unknown keyword 'bogus' in 'backend' section\n[ALERT]    (20559) : config : Fatal errors found in configuration.\n";
    const BUSY_3_1: &str = "Success=0\n--\nAnother reload is still in progress.\n";

    #[test]
    fn the_masters_answer_to_reload_reads_as_loaded_refused_busy_or_silent() {
        assert_eq!(MasterAnswer::parse(""), MasterAnswer::Silent);
        let MasterAnswer::Loaded { logs } = MasterAnswer::parse(RELOADED_3_1) else { panic!() };
        assert!(logs.starts_with("[NOTICE]") && logs.contains("missing timeouts"), "{logs}");
        let MasterAnswer::Refused { logs } = MasterAnswer::parse(REFUSED_3_1) else { panic!() };
        assert!(logs.contains("unknown keyword 'bogus'"), "{logs}");
        assert_eq!(MasterAnswer::parse(BUSY_3_1), MasterAnswer::Busy);
        // Startup logs are optional: a reload without a word to say.
        assert_eq!(
            MasterAnswer::parse("Success=1\n"),
            MasterAnswer::Loaded { logs: String::new() }
        );
        assert_eq!(
            MasterAnswer::parse("Success=1\n--\n"),
            MasterAnswer::Loaded { logs: String::new() }
        );
        assert_eq!(
            MasterAnswer::parse("Unknown command.\n"),
            MasterAnswer::Other("Unknown command.".into())
        );
    }

    /// reload_wait.sh's answer with each master: 2.6 (silent), 3.1 (its answer's lines
    /// prefixed, among them a `--` that must not split anything), and a mark.
    #[test]
    fn a_reloads_answer_reads_before_answer_after_looks_and_mark() {
        let silent = Reload::parse(&format!("{PROC_0}--\n{PROC_1}hafleet-looks 7\n"));
        assert_eq!(plan::parse_show_proc(&silent.before).unwrap().reloads, 0);
        assert_eq!(silent.master, MasterAnswer::Silent);
        assert_eq!(silent.after.as_ref().unwrap().reloads, 1);
        assert_eq!((silent.looks, silent.marked), (Some(7), false));
        let prefixed: String =
            RELOADED_3_1.lines().map(|l| format!("hafleet-answer {l}\n")).collect();
        let out = format!("{PROC_0}--\n{prefixed}{PROC_1}hafleet-looks 0\nhafleet-marked-loaded\n");
        let answered = Reload::parse(&out);
        assert!(matches!(answered.master, MasterAnswer::Loaded { .. }), "{:?}", answered.master);
        // Log lines such as `[NOTICE] (20559) : ...` never reach `show proc`'s reader.
        assert_eq!(answered.after.as_ref().unwrap().workers.len(), 2);
        assert_eq!((answered.looks, answered.marked), (Some(0), true));
        let busy: String = BUSY_3_1.lines().map(|l| format!("hafleet-answer {l}\n")).collect();
        let busy = Reload::parse(&format!("{PROC_0}--\n{busy}{PROC_0}hafleet-looks 1\n"));
        assert_eq!(busy.master, MasterAnswer::Busy);
        // A `show proc` the host could not read after: pending.
        assert_eq!(Reload::parse(&format!("{PROC_0}--\nhafleet-looks 150\n")).after, None);
    }

    #[test]
    fn drift_state_reads_files_reloads_and_node_checks() {
        let out = format!(
            "{SHA_A}\n{SHA_B}\nreloads 3\nexact-1.map {SHA_A}\nprefix-2.map -\n--\n{PROC_1}--\n# pxname,svname,status,check_status,last_chk\nhafleet_nodes,n1,DOWN,L4CON,Connection refused\n"
        );
        let files = drift_state(&out);
        assert_eq!(files.live.as_deref(), Some(SHA_A));
        assert_eq!(files.loaded.as_deref(), Some(SHA_B));
        assert_eq!(
            files.maps,
            [("exact-1.map".to_owned(), Some(SHA_A.to_owned())), ("prefix-2.map".to_owned(), None)]
        );
        assert_eq!((files.reloads_marked, files.reloads_now), (Some(3), Some(1)));
        assert_eq!(files.nodes.map(|n| (n.down, n.checked)), Some((1, 1)));
        assert_eq!(drift_state("aaa\nbbb\n\n--\n#<PID>\n").nodes, None);
    }
}
