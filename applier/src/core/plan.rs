//! Pure rollout decisions: what a canary's outcome means, what a host needs, and reading
//! HAProxy's master CLI to tell whether a reload took.

use hafleet_proto::{ApplyOutcome, ApplyStage};

/// What the canary's outcome says about the rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CanaryVerdict {
    /// The host could not be reached: it says nothing about the config; try the next host as
    /// canary.
    Unreachable,
    /// The version runs there: go on with the others.
    Passed,
    /// The version failed on a reachable host: stop.
    Failed,
}

pub fn canary_verdict(outcome: &ApplyOutcome) -> CanaryVerdict {
    match outcome {
        ApplyOutcome::Applied | ApplyOutcome::Unchanged => CanaryVerdict::Passed,
        // A host that cannot be reached, or cannot be trusted, is passed over: its trouble is
        // its own, not the version's, and the rest of the fleet must not freeze behind it.
        ApplyOutcome::Failed { stage: ApplyStage::Connect | ApplyStage::HostKey, .. } => {
            CanaryVerdict::Unreachable
        }
        ApplyOutcome::Failed { .. } => CanaryVerdict::Failed,
    }
}

/// What a drift check reads on a host (read by [`crate::host::answer::drift_state`]): the
/// live config's sha256, the one HAProxy last loaded (the applier's marker), and each of the
/// version's map files' sha256 (`None`: missing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFiles {
    pub live: Option<String>,
    pub loaded: Option<String>,
    pub maps: Vec<(String, Option<String>)>,
    /// The master's reload count when the applier marked the config loaded, and now.
    pub reloads_marked: Option<u64>,
    pub reloads_now: Option<u64>,
    /// How the running worker sees the nodes it checks, when it checks them.
    pub nodes: Option<NodeChecks>,
}

/// How a host's HAProxy sees the nodes it health-checks (the `hafleet_nodes` backend).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeChecks {
    /// Nodes whose check fails (`DOWN`, also while going back up).
    pub down: usize,
    /// Nodes checked (servers not in maintenance).
    pub checked: usize,
    /// One failing node and why, e.g. `node-2: L4CON Connection refused`.
    pub example: Option<String>,
}

impl NodeChecks {
    /// Reads `show stat hafleet_nodes 4 -1` (CSV, its header first; columns found by name);
    /// `None` when it is not that, e.g. `No such proxy.` (node health checks off).
    pub fn parse(csv: &str) -> Option<NodeChecks> {
        let mut lines = csv.lines();
        let header: Vec<&str> = lines.next()?.strip_prefix("# ")?.split(',').collect();
        let col = |name: &str| header.iter().position(|h| *h == name);
        let (px, sv, status) = (col("pxname")?, col("svname")?, col("status")?);
        let (check, last) = (col("check_status"), col("last_chk"));
        let mut checks = NodeChecks { down: 0, checked: 0, example: None };
        for fields in lines.map(|l| l.split(',').collect::<Vec<_>>()) {
            let at = |i: usize| fields.get(i).copied().unwrap_or("");
            let state = at(status);
            if at(px) != "hafleet_nodes"
                || matches!(at(sv), "" | "BACKEND" | "FRONTEND")
                || state.starts_with("MAINT")
            {
                continue;
            }
            checks.checked += 1;
            if state.starts_with("DOWN") {
                checks.down += 1;
                let why = format!("{} {}", check.map_or("", at), last.map_or("", at));
                checks.example.get_or_insert_with(|| format!("{}: {}", at(sv), why.trim()));
            }
        }
        Some(checks)
    }
}

/// How a host differs from its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    /// Every finding, `; `-separated: for the log and the report.
    pub found: String,
    /// The version's map and certificate files that are missing there or hold other
    /// content, as drift checks name them (`../hafleet-certs/<id>.pem` for certificates).
    pub files: Vec<String>,
    /// Whether anything besides those files drifted (the live config, or what HAProxy
    /// loaded): then only an apply repairs it. Files alone are put back, without a reload
    /// (HAProxy holds the maps and certificates it loaded; the files matter to the next
    /// reload or restart).
    pub beyond_files: bool,
}

/// How a drift finding names a file: `map <name>`, or `certificate file hafleet-certs/<id>.pem`.
fn file_named(name: &str) -> String {
    match name.strip_prefix("../") {
        Some(cert) => format!("certificate file {cert}"),
        None => format!("map {name}"),
    }
}

/// How a host's files differ from the version `sha256` whose other files are `maps` (maps
/// and certificate files: the name, the sha256 it must have); `None` when the host runs
/// exactly that version.
pub fn drift(sha256: &str, maps: &[(&str, &str)], files: &HostFiles) -> Option<Drift> {
    let mut found = Vec::new();
    match files.live.as_deref() {
        None => found.push("the live config is missing".to_owned()),
        Some(live) if live != sha256 => found.push(format!(
            "the live config has sha256 {}, not the version's {}",
            short(live),
            short(sha256)
        )),
        Some(_) => {}
    }
    if files.loaded.is_some() && files.loaded != files.live {
        found.push("HAProxy last loaded a config other than the live file".to_owned());
    }
    if let (Some(marked), Some(now)) = (files.reloads_marked, files.reloads_now)
        && now != marked
    {
        found.push(format!(
            "HAProxy was reloaded outside hafleet (reload {now}, hafleet's last was {marked})"
        ));
    }
    let beyond_files = !found.is_empty();
    // By name: a host with 10,000 certificate files lists 10,000 lines.
    let on_host: std::collections::HashMap<&str, Option<&str>> =
        files.maps.iter().map(|(n, sha)| (n.as_str(), sha.as_deref())).collect();
    let mut bad = Vec::new();
    for (name, want) in maps {
        let what = file_named(name);
        match on_host.get(name).copied().flatten() {
            None => found.push(format!("{what} is missing")),
            Some(sha) if sha != *want => {
                found.push(format!("{what} was changed (sha256 {})", short(sha)))
            }
            Some(_) => continue,
        }
        bad.push((*name).to_owned());
    }
    (!found.is_empty()).then(|| Drift { found: found.join("; "), files: bad, beyond_files })
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

/// Whether what `ssh` said when it would not connect is about the host's key (unknown or
/// changed against the pinned known_hosts) rather than about reaching the host.
pub fn is_host_key_refusal(ssh_said: &str) -> bool {
    [
        "Host key verification failed",
        "REMOTE HOST IDENTIFICATION HAS CHANGED",
        "host key is known for",
        "Host key for",
    ]
    .iter()
    .any(|s| ssh_said.contains(s))
}

/// The fingerprints in `ssh-keygen -lf -` output (`256 SHA256:… host (ED25519)`), as
/// `SHA256:… (ED25519)`.
pub fn fingerprints(keygen_said: &str) -> Vec<String> {
    keygen_said
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let _bits = parts.next()?;
            let fp = parts.next().filter(|f| f.starts_with("SHA256:"))?;
            let kind = l.rsplit_once(' ').map(|(_, k)| k).filter(|k| k.starts_with('('))?;
            Some(format!("{fp} {kind}"))
        })
        .collect()
}

/// The hosts of `rest` after wave `wave` (0-based) when `rest` goes in waves of `parallelism`:
/// those a rollout halted in that wave never attempted. Empty after the last wave.
pub fn not_yet_attempted(rest: &[usize], parallelism: usize, wave: usize) -> &[usize] {
    let start = (wave + 1).saturating_mul(parallelism.max(1));
    rest.get(start..).unwrap_or_default()
}

/// What a host needs to run a version, from the sha256 of its live file and of the config its
/// HAProxy last loaded (recorded by the applier after every verified reload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPlan {
    /// Running it already.
    Unchanged,
    /// The live file is the version but HAProxy was never reloaded onto it (an applier stopped
    /// between the swap and the reload): reload and verify only.
    ReloadOnly,
    /// Upload, validate, swap, reload, verify.
    Full,
}

pub fn host_plan(live_sha: Option<&str>, loaded_sha: Option<&str>, target: &str) -> HostPlan {
    match (live_sha == Some(target), loaded_sha == Some(target)) {
        (true, true) => HostPlan::Unchanged,
        (true, false) => HostPlan::ReloadOnly,
        (false, _) => HostPlan::Full,
    }
}

/// What `show proc` on HAProxy's master CLI says (HAProxy 2.6 format):
///
/// ```text
/// #<PID>          <type>          <reloads>       <uptime>        <version>
/// 20559           master          1 [failed: 0]   0d00h00m02s     2.6.12-1+deb12u4
/// # workers
/// 20571           worker          0               0d00h00m01s     2.6.12-1+deb12u4
/// # programs
/// ```
/// A worker's `<reloads>` counts the reloads it has lived through: the newest worker shows 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcState {
    pub reloads: u64,
    pub failed: u64,
    /// (pid, reloads lived through)
    pub workers: Vec<(u32, u64)>,
}

pub fn parse_show_proc(text: &str) -> Option<ProcState> {
    let mut master = None;
    let mut workers = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [_, "master", reloads, "[failed:", failed, ..] => {
                master = Some((reloads.parse().ok()?, failed.trim_end_matches(']').parse().ok()?));
            }
            [pid, "worker", reloads, ..] => {
                workers.push((pid.parse().ok()?, reloads.parse().ok()?))
            }
            _ => {}
        }
    }
    let (reloads, failed) = master?;
    Some(ProcState { reloads, failed, workers })
}

/// The worker that serves new connections: the one that has lived through no reload. None if
/// `show proc` lists no such worker, or more than one.
pub fn current_worker(state: &ProcState) -> Option<u32> {
    let mut current = state.workers.iter().filter(|(_, reloads)| *reloads == 0);
    let (pid, _) = current.next()?;
    current.next().is_none().then_some(*pid)
}

/// Where a reload stands, comparing `show proc` before and after asking for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadCheck {
    /// A new worker runs the new config, after exactly one reload: ours.
    Done,
    /// More than one reload happened since ours was asked for: someone else reloaded too, so
    /// the newest worker cannot be attributed to this apply. Reload again.
    Raced,
    /// HAProxy refused the config on reload; the old workers still serve.
    Failed,
    /// The master has not finished reloading yet: ask again.
    Pending,
}

pub fn check_reload(before: &ProcState, after: &ProcState) -> ReloadCheck {
    if after.failed > before.failed {
        return ReloadCheck::Failed;
    }
    let new_worker = after
        .workers
        .iter()
        .any(|(pid, reloads)| *reloads == 0 && !before.workers.iter().any(|(p, _)| p == pid));
    match (after.reloads.saturating_sub(before.reloads), new_worker) {
        (1, true) => ReloadCheck::Done,
        (n, _) if n > 1 => ReloadCheck::Raced,
        _ => ReloadCheck::Pending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from HAProxy 2.6.12 (Debian bookworm): start, reload, reload of a broken file.
    const START: &str = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n20559           master          0 [failed: 0]   0d00h00m01s     2.6.12-1+deb12u4\n# workers\n20562           worker          0               0d00h00m01s     2.6.12-1+deb12u4\n# programs\n\n";
    const RELOADED: &str = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n20559           master          1 [failed: 0]   0d00h00m02s     2.6.12-1+deb12u4\n# workers\n20571           worker          0               0d00h00m01s     2.6.12-1+deb12u4\n# programs\n\n";
    const BROKEN: &str = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n20559           master          2 [failed: 1]   0d00h00m02s     2.6.12-1+deb12u4\n# workers\n20571           worker          1               0d00h00m01s     2.6.12-1+deb12u4\n# programs\n\n";

    #[test]
    fn show_proc_of_haproxy_2_6_parses() {
        let s = parse_show_proc(START).unwrap();
        assert_eq!(s, ProcState { reloads: 0, failed: 0, workers: vec![(20562, 0)] });
        assert!(parse_show_proc("Unknown command").is_none());
    }

    #[test]
    fn a_reload_is_done_failed_or_pending() {
        let start = parse_show_proc(START).unwrap();
        let reloaded = parse_show_proc(RELOADED).unwrap();
        let broken = parse_show_proc(BROKEN).unwrap();
        assert_eq!(check_reload(&start, &reloaded), ReloadCheck::Done);
        assert_eq!(check_reload(&reloaded, &broken), ReloadCheck::Failed);
        assert_eq!(check_reload(&start, &start), ReloadCheck::Pending);
        // Two reloads since ours was asked for: the newest worker may be someone else's.
        let twice = ProcState { reloads: start.reloads + 2, ..reloaded.clone() };
        assert_eq!(check_reload(&start, &twice), ReloadCheck::Raced);
    }

    #[test]
    fn the_current_worker_is_the_one_that_lived_through_no_reload() {
        let mut state = parse_show_proc(RELOADED).unwrap();
        assert_eq!(current_worker(&state), Some(20571));
        state.workers.push((20559, 1));
        assert_eq!(current_worker(&state), Some(20571), "an old worker still draining");
        state.workers.push((20600, 0));
        assert_eq!(current_worker(&state), None);
        assert_eq!(current_worker(&parse_show_proc(BROKEN).unwrap()), None);
    }

    #[test]
    fn hosts_after_a_halted_wave_include_none_past_the_end() {
        let rest = [1, 2, 3, 4, 5];
        assert_eq!(not_yet_attempted(&rest, 2, 0), [3, 4, 5]);
        assert_eq!(not_yet_attempted(&rest, 2, 1), [5]);
        // The last wave is partial: halting in it leaves nothing (this once panicked).
        assert!(not_yet_attempted(&rest, 2, 2).is_empty());
        assert!(not_yet_attempted(&[1], 2, 0).is_empty());
        assert_eq!(not_yet_attempted(&rest, 0, 0), [2, 3, 4, 5]);
    }

    #[test]
    fn a_live_file_haproxy_never_loaded_is_reloaded_not_skipped() {
        assert_eq!(host_plan(Some("a"), Some("a"), "a"), HostPlan::Unchanged);
        assert_eq!(host_plan(Some("a"), Some("old"), "a"), HostPlan::ReloadOnly);
        assert_eq!(host_plan(Some("a"), None, "a"), HostPlan::ReloadOnly);
        assert_eq!(host_plan(Some("old"), Some("old"), "a"), HostPlan::Full);
        assert_eq!(host_plan(None, None, "a"), HostPlan::Full);
    }

    #[test]
    fn drift_names_every_file_that_is_not_the_version_s() {
        let maps = [("exact-aa.map", "aa"), ("prefix-bb.map", "bb")];
        let files = |out: &str| crate::host::answer::drift_state(out);
        let proc = |reloads: u64| {
            format!(
                "\n--\n#<PID> <type> <reloads> <uptime>\n1 master {reloads} [failed: 0] 0d00h00m01s 2.6.12\n"
            )
        };
        let same = files(&format!(
            "v1sha\nv1sha\nreloads 3\nexact-aa.map aa\nprefix-bb.map bb{}",
            proc(3)
        ));
        assert_eq!((same.reloads_marked, same.reloads_now), (Some(3), Some(3)));
        assert_eq!(drift("v1sha", &maps, &same), None);
        let maps_only =
            files(&format!("v1sha\nv1sha\nreloads 3\nexact-aa.map -\nprefix-bb.map 0b{}", proc(3)));
        let found = drift("v1sha", &maps, &maps_only).unwrap();
        assert_eq!(found.files, ["exact-aa.map", "prefix-bb.map"]);
        assert!(!found.beyond_files, "{found:?}");
        let foreign = files(&format!(
            "v1sha\nv1sha\nreloads 3\nexact-aa.map aa\nprefix-bb.map bb{}",
            proc(4)
        ));
        let found = drift("v1sha", &maps, &foreign).unwrap();
        assert!(found.beyond_files && found.files.is_empty(), "{found:?}");
        let found = found.found;
        assert!(
            found.contains("reloaded outside hafleet (reload 4, hafleet's last was 3)"),
            "{found}"
        );
        let edited = files("0123456789abcdef\nv1sha\n\nexact-aa.map aa\nprefix-bb.map -\n");
        let found = drift("v1sha", &maps, &edited).unwrap();
        assert!(found.beyond_files && found.files == ["prefix-bb.map"], "{found:?}");
        let found = found.found;
        assert!(
            found.contains("live config has sha256 0123456789ab, not the version's v1sha"),
            "{found}"
        );
        assert!(found.contains("HAProxy last loaded a config other than the live file"), "{found}");
        assert!(found.contains("map prefix-bb.map is missing"), "{found}");
        let changed = files("v1sha\nv1sha\n\nexact-aa.map ff\nprefix-bb.map bb\n");
        let found = drift("v1sha", &maps, &changed).unwrap();
        assert!(found.found.contains("map exact-aa.map was changed"), "{found:?}");
        assert!(!found.beyond_files && found.files == ["exact-aa.map"], "{found:?}");
        let gone = files("\n\n\n");
        assert!(drift("v1sha", &[], &gone).unwrap().found.contains("the live config is missing"));
    }

    #[test]
    fn host_key_refusals_are_told_from_unreachable_hosts_and_fingerprints_read() {
        assert!(is_host_key_refusal(
            "No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict \
             checking.\r\nHost key verification failed."
        ));
        assert!(is_host_key_refusal("@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @"));
        assert!(!is_host_key_refusal("ssh: connect to host 10.0.0.1 port 22: Connection refused"));
        assert!(!is_host_key_refusal("Permission denied (publickey)."));
        let said =
            "256 SHA256:AbC+/1 [127.0.0.1]:2222 (ED25519)\n3072 SHA256:xyz= lb-1 (RSA)\nnoise\n";
        assert_eq!(fingerprints(said), ["SHA256:AbC+/1 (ED25519)", "SHA256:xyz= (RSA)"]);
    }

    #[test]
    fn an_unreachable_canary_passes_the_role_on_and_a_refusal_stops_the_rollout() {
        let failed =
            |stage| ApplyOutcome::Failed { stage, message: String::new(), restored: false };
        assert_eq!(canary_verdict(&failed(ApplyStage::Connect)), CanaryVerdict::Unreachable);
        assert_eq!(canary_verdict(&failed(ApplyStage::HostKey)), CanaryVerdict::Unreachable);
        assert_eq!(canary_verdict(&failed(ApplyStage::Validate)), CanaryVerdict::Failed);
        assert_eq!(canary_verdict(&failed(ApplyStage::Verify)), CanaryVerdict::Failed);
        assert_eq!(canary_verdict(&ApplyOutcome::Applied), CanaryVerdict::Passed);
        assert_eq!(canary_verdict(&ApplyOutcome::Unchanged), CanaryVerdict::Passed);
    }

    #[test]
    fn node_checks_count_the_failing_nodes_of_a_real_show_stat() {
        // `show stat hafleet_nodes 4 -1` of HAProxy 2.6.12, its columns as it prints them.
        let header = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,weight,act,bck,chkfail,chkdown,lastchg,downtime,qlimit,pid,iid,sid,throttle,lbtot,tracked,type,rate,rate_lim,rate_max,check_status,check_code,check_duration,hrsp_1xx,hrsp_2xx,hrsp_3xx,hrsp_4xx,hrsp_5xx,hrsp_other,hanafail,req_rate,req_rate_max,req_tot,cli_abrt,srv_abrt,comp_in,comp_out,comp_byp,comp_rsp,lastsess,last_chk,last_agt,qtime,ctime,rtime,ttime,agent_status,agent_code,agent_duration,check_desc,agent_desc,check_rise,check_fall,check_health,agent_rise,agent_fall,agent_health,addr,cookie,mode,algo,conn_rate,conn_rate_max,conn_tot,intercepted,dcon,dses,wrew,connect,reuse,cache_lookups,cache_hits,srv_icur,src_ilim,qtime_max,ctime_max,rtime_max,ttime_max,eint,idle_conn_cur,safe_conn_cur,used_conn_cur,need_conn_est,uweight,agg_server_status,agg_server_check_status,agg_check_status,-,ssl_sess,ssl_reused_sess,ssl_failed_handshake,h2_headers_rcvd,h2_data_rcvd,h2_settings_rcvd,h2_rst_stream_rcvd,h2_goaway_rcvd,h2_detected_conn_protocol_errors,h2_detected_strm_protocol_errors,h2_rst_stream_resp,h2_goaway_resp,h2_open_connections,h2_backend_open_streams,h2_total_connections,h2_backend_total_streams,h1_open_connections,h1_open_streams,h1_total_connections,h1_total_streams,h1_bytes_in,h1_bytes_out,h1_spliced_bytes_in,h1_spliced_bytes_out,";
        let down = "hafleet_nodes,node-1,0,0,0,0,,0,0,0,,0,,0,0,0,0,DOWN,1,1,0,1,1,5,5,,1,3,1,,0,,2,0,,0,L4CON,,0,0,0,0,0,0,0,,,,0,0,0,,,,,-1,Connection refused,,0,0,0,0,,,,Layer4 connection problem,,2,2,0,,,,127.100.67.98:10256,,http,,,,,,,,0,0,0,,,0,,0,0,0,0,0,0,0,0,1,1,,,,-,0,0,0,,,,,,,,,,,,,,,,,,,,,,";
        let up = "hafleet_nodes,node-2,0,0,0,0,,0,0,0,,0,,0,0,0,0,UP,1,1,0,1,1,5,5,,1,3,1,,0,,2,0,,0,L7OK,,0,0,0,0,0,0,0,,,,0,0,0,,,,,-1,HTTP status check returned code <200>,,0,0,0,0,,,,Layer4 connection problem,,2,2,0,,,,127.100.67.98:10256,,http,,,,,,,,0,0,0,,,0,,0,0,0,0,0,0,0,0,1,1,,,,-,0,0,0,,,,,,,,,,,,,,,,,,,,,,";
        let maint = "hafleet_nodes,node-3,0,0,0,0,,0,0,0,,0,,0,0,0,0,MAINT,1,1,0,1,1,5,5,,1,3,1,,0,,2,0,,0,L4CON,,0,0,0,0,0,0,0,,,,0,0,0,,,,,-1,Connection refused,,0,0,0,0,,,,Layer4 connection problem,,2,2,0,,,,127.100.67.98:10256,,http,,,,,,,,0,0,0,,,0,,0,0,0,0,0,0,0,0,1,1,,,,-,0,0,0,,,,,,,,,,,,,,,,,,,,,,";
        let csv = format!("{header}\n{down}\n{up}\n{maint}\n\n");
        let checks = NodeChecks::parse(&csv).expect("a show stat");
        assert_eq!(checks.down, 1);
        assert_eq!(checks.checked, 2, "the node in maintenance is not checked");
        assert_eq!(checks.example.as_deref(), Some("node-1: L4CON Connection refused"));
        let all_up = NodeChecks::parse(&format!("{header}\n{up}\n")).expect("a show stat");
        assert_eq!((all_up.down, all_up.checked, all_up.example), (0, 1, None));
        // Node health checks off: the backend does not exist.
        assert_eq!(NodeChecks::parse("No such proxy.\n"), None);
        assert_eq!(NodeChecks::parse(""), None);
        // drift_state.sh's output carries it after show proc.
        let out = format!("aaa\nbbb\nreloads 3\n--\n#<PID> <type>\n--\n{header}\n{down}\n");
        let read = crate::host::answer::drift_state(&out);
        assert_eq!(read.nodes.map(|n| (n.down, n.checked)), Some((1, 1)));
    }
}
