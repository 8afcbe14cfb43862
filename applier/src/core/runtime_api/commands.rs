//! The runtime API commands of a plan, the master CLI session that sends them and how its
//! answers read.

use super::*;

/// What HAProxy must answer to a command for it to count as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Nothing (or only the payload's continuation prompts).
    Empty,
    /// An answer starting with one of these.
    OneOf(&'static [&'static str]),
    /// An answer that holds this (`Success!` after a line saying what was done).
    Contains(&'static str),
    /// Whatever it answers: a refusal leaves a state that serves as well (a server in
    /// maintenance that HAProxy keeps while connections last).
    Anything,
}

/// One command for HAProxy's CLI, without the master CLI's `@!<pid>` prefix. Its `Debug`
/// shows the payload's size only (a `set ssl cert` payload holds a private key).
#[derive(Clone, PartialEq, Eq)]
pub struct Command {
    pub line: String,
    /// Lines sent after `line <<`, ended by an empty line (a certificate's key, for `set ssl
    /// cert`: zeroed when dropped).
    pub payload: Option<zeroize::Zeroizing<String>>,
    pub expect: Expect,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Command")
            .field("line", &self.line)
            .field("payload_bytes", &self.payload.as_ref().map(|p| p.len()))
            .field("expect", &self.expect)
            .finish()
    }
}

impl Command {
    pub(super) fn new(line: String, expect: Expect) -> Self {
        Command { line, payload: None, expect }
    }

    /// Whether `answer` says the command was done.
    pub fn accepted(&self, answer: &str) -> bool {
        // A payload's continuation prompts come back before the answer.
        let mut answer = answer.trim_start();
        while let Some(rest) = answer.strip_prefix('+') {
            answer = rest.trim_start();
        }
        let answer = answer.trim();
        match self.expect {
            Expect::Empty => answer.is_empty(),
            Expect::OneOf(prefixes) => prefixes.iter().any(|p| answer.starts_with(p)),
            Expect::Contains(part) => answer.contains(part),
            Expect::Anything => true,
        }
    }
}

/// Each map replaced whole, by kind, as the commands address it: `@<version> #<id>`, the
/// `#<id>` that `show map` lists for it and the version `prepare map` allocated
/// ([`prepared_maps`]).
pub type PreparedMaps = BTreeMap<String, String>;

/// How the commands address each changed map, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapRefs {
    /// Each map replaced whole: `@<version> #<id>` ([`PreparedMaps`]), or `{map:<kind>}`.
    pub prepared: PreparedMaps,
    /// Each map edited in place: its `#<id>` ([`map_ids`]), or `{mapid:<kind>}`.
    pub ids: BTreeMap<String, String>,
}

/// Each map a plan changes addressed by a placeholder that swap_runtime.sh fills in on the
/// host, after it found (and for a map replaced whole, prepared) the map in the same round
/// trip: `{map:<kind>}` for `@<version> #<id>`, `{mapid:<kind>}` for `#<id>`.
pub fn map_placeholders(steps: &[Step]) -> MapRefs {
    MapRefs {
        prepared: map_kinds(steps)
            .iter()
            .map(|k| ((*k).to_owned(), format!("{{map:{k}}}")))
            .collect(),
        ids: edited_maps(steps)
            .iter()
            .map(|(k, _)| ((*k).to_owned(), format!("{{mapid:{k}}}")))
            .collect(),
    }
}

/// The kinds of map a plan replaces whole.
pub fn map_kinds(steps: &[Step]) -> Vec<&str> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::ReplaceMap { kind, .. } => Some(kind.as_str()),
            _ => None,
        })
        .collect()
}

/// Whether a plan changes any map, replaced or edited: `show map` is read first
/// ([`locate_maps`]).
pub fn changes_maps(steps: &[Step]) -> bool {
    steps.iter().any(|s| matches!(s, Step::ReplaceMap { .. } | Step::EditMap { .. }))
}

/// The kinds of map a plan edits in place, each with the number of entries it must hold first.
pub fn edited_maps(steps: &[Step]) -> Vec<(&str, usize)> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::EditMap { kind, before, .. } => Some((kind.as_str(), *before)),
            _ => None,
        })
        .collect()
}

/// The maps of `show map`'s answer: (kind, `#<id>`, `entry_cnt`) for each map loaded from a
/// file of hafleet's.
fn shown_maps(show_map: &str) -> impl Iterator<Item = (String, String, Option<usize>)> + '_ {
    show_map.lines().filter_map(|line| {
        // `<id> (<file>) pattern loaded from file … curr_ver=0 next_ver=0 entry_cnt=1`
        let (id, rest) = line.split_once(' ')?;
        let file = rest.strip_prefix('(')?.split_once(')')?.0;
        let name = file.rsplit('/').next()?;
        let parsed = hafleet_proto::MapName::new(name.to_owned()).ok()?;
        id.parse::<i64>().ok()?;
        let count = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("entry_cnt="))
            .and_then(|n| n.parse().ok());
        Some((parsed.kind().to_owned(), format!("#{id}"), count))
    })
}

/// From `show map`: the `#<id>` of the map file of each kind in `kinds`. The running process
/// knows a map by the name it loaded it under, which a runtime change before this one may have
/// made older than the live file's: it is found by kind. None if a kind is not there exactly
/// once.
pub fn map_ids(show_map: &str, kinds: &[&str]) -> Option<BTreeMap<String, String>> {
    let mut ids = BTreeMap::new();
    for kind in kinds {
        let mut found = shown_maps(show_map).filter(|(k, _, _)| k == kind);
        let (_, id, _) = found.next()?;
        if found.next().is_some() {
            return None;
        }
        ids.insert((*kind).to_owned(), id);
    }
    Some(ids)
}

/// From `show map`: the first map of `edited` ([`edited_maps`]) that does not hold the number
/// of entries its edits start from, and what it holds (`None`: not said); such a map is not
/// the file it was last brought to, and only replacing it whole (or a reload) can mend it.
pub fn miscounted<'a>(
    show_map: &str,
    edited: &[(&'a str, usize)],
) -> Option<(&'a str, Option<usize>)> {
    edited.iter().find_map(|(kind, before)| {
        let count = shown_maps(show_map).find(|(k, _, _)| k == kind).and_then(|(_, _, n)| n);
        (count != Some(*before)).then_some((*kind, count))
    })
}

/// From `show map`: the maps `steps` change, found by kind ([`map_ids`]). Returns the ids of
/// those replaced whole, for [`prepare_commands`], and the [`MapRefs`] addressing those edited
/// in place, each checked to hold the number of entries its edits start from.
pub fn locate_maps(
    show_map: &str,
    steps: &[Step],
) -> Result<(BTreeMap<String, String>, MapRefs), String> {
    let edited = edited_maps(steps);
    let all: Vec<&str> =
        map_kinds(steps).into_iter().chain(edited.iter().map(|(k, _)| *k)).collect();
    let mut ids = map_ids(show_map, &all)
        .ok_or_else(|| format!("`show map` does not list one map of each kind {all:?}"))?;
    if let Some((kind, holds)) = miscounted(show_map, &edited) {
        return Err(format!("the running {kind} map holds {holds:?} entries, not its file's"));
    }
    let edited_ids = edited.iter().filter_map(|(k, _)| ids.remove_entry(*k)).collect();
    Ok((ids, MapRefs { prepared: PreparedMaps::new(), ids: edited_ids }))
}

/// `prepare map` for each id.
pub fn prepare_commands(ids: &BTreeMap<String, String>) -> Vec<Command> {
    ids.values()
        .map(|id| {
            Command::new(format!("prepare map {id}"), Expect::OneOf(&["New version created:"]))
        })
        .collect()
}

/// The version number in `prepare map`'s answer.
pub fn prepared_version(answer: &str) -> Option<u32> {
    answer.trim().strip_prefix("New version created:")?.trim().parse().ok()
}

/// The maps prepared by [`prepare_commands`]`(ids)`, from HAProxy's answers to them in order:
/// each kind's map as `@<version> #<id>`.
pub fn prepared_maps<S: AsRef<str>>(
    ids: BTreeMap<String, String>,
    answers: &[S],
) -> Result<PreparedMaps, String> {
    if answers.len() != ids.len() {
        return Err(format!("{} answers to {} `prepare map`", answers.len(), ids.len()));
    }
    ids.into_iter()
        .zip(answers)
        .map(|((kind, id), answer)| {
            let answer = answer.as_ref();
            let version = prepared_version(answer)
                .ok_or_else(|| format!("prepare map {id}: {}", answer.trim()))?;
            Ok((kind, format!("@{version} {id}")))
        })
        .collect()
}

/// What the certificate steps need from outside the plan: the running crt-list's name
/// ([`running_crt_list`]) and the content of each file [`added_certs`] names (chain and key),
/// or placeholders the host fills in ([`CertInputs::on_host`]).
#[derive(Default)]
pub struct CertInputs {
    pub crt_list: String,
    pub files: BTreeMap<String, zeroize::Zeroizing<String>>,
    /// A file not in `files` goes as [`cert_file_on_host`], read on the host.
    pub on_host: bool,
}

impl CertInputs {
    /// Placeholders that swap_runtime (scripts/lib.sh, asked with `+crtlist`) fills in on the
    /// host: [`CRT_LIST_ON_HOST`] for the running crt-list's name (from `show ssl crt-list`)
    /// and, as a payload, each certificate file the upload put there. No key goes in the
    /// session, and the applier opens none for it.
    pub fn on_host() -> Self {
        CertInputs { crt_list: CRT_LIST_ON_HOST.to_owned(), files: BTreeMap::new(), on_host: true }
    }
}

/// In place of the running crt-list's name in a session: filled in on the host.
pub const CRT_LIST_ON_HOST: &str = "{crtlist}";

/// A payload line the host replaces with the lines of the certificate file at `path`
/// (`hafleet-certs/<id>.pem`, beside the config).
pub fn cert_file_on_host(path: &str) -> String {
    format!("{{certfile:{path}}}")
}

impl std::fmt::Debug for CertInputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertInputs")
            .field("crt_list", &self.crt_list)
            .field("files", &self.files.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The commands that carry out `steps`, given the prepared maps and the certificates' inputs.
/// A `set ssl cert` command's payload holds a key: whoever logs commands logs their `line`.
pub fn commands(
    steps: &[Step],
    maps: &MapRefs,
    certs: &CertInputs,
) -> Result<Vec<Command>, String> {
    let mut out = Vec::new();
    for step in steps {
        match step {
            Step::AddCert { path, filters } => {
                let file = match certs.files.get(path) {
                    Some(file) => file.trim_end().to_owned().into(),
                    None if certs.on_host => zeroize::Zeroizing::new(cert_file_on_host(path)),
                    None => return Err(format!("no file for {path}")),
                };
                let list = &certs.crt_list;
                out.push(Command::new(
                    format!("new ssl cert {path}"),
                    Expect::OneOf(&["New empty certificate store"]),
                ));
                out.push(Command {
                    line: format!("set ssl cert {path}"),
                    // A payload's lines each end in a newline; `session` adds the empty line
                    // that ends it.
                    payload: Some(format!("{}\n", file.as_str()).into()),
                    expect: Expect::OneOf(&["Transaction created", "Transaction updated"]),
                });
                out.push(Command::new(
                    format!("commit ssl cert {path}"),
                    Expect::Contains("Success!"),
                ));
                let mut line = path.clone();
                for f in filters {
                    line.push(' ');
                    line.push_str(f);
                }
                line.push('\n');
                out.push(Command {
                    line: format!("add ssl crt-list {list}"),
                    payload: Some(line.into()),
                    expect: Expect::Contains("Success!"),
                });
            }
            Step::RemoveCert { path } => {
                out.push(Command::new(
                    format!("del ssl crt-list {} {path}", certs.crt_list),
                    Expect::OneOf(&["Entry "]),
                ));
                out.push(Command::new(format!("del ssl cert {path}"), Expect::Anything));
            }
            Step::SetAddr { backend, server, ip, port } => out.push(Command::new(
                format!("set server {backend}/{server} addr {ip} port {port}"),
                Expect::OneOf(&["IP changed from", "no need to change the addr"]),
            )),
            Step::SetWeight { backend, server, weight } => out.push(Command::new(
                format!("set server {backend}/{server} weight {weight}"),
                Expect::Empty,
            )),
            Step::AddServer { backend, server, addr, params } => {
                let mut line = format!("add server {backend}/{server} {addr}");
                for p in params {
                    line.push(' ');
                    line.push_str(p);
                }
                out.push(Command::new(line, Expect::OneOf(&["New server registered."])));
                // A server added at runtime starts with its check stopped, and in maintenance.
                if params.iter().any(|p| p == "check") {
                    out.push(Command::new(
                        format!("enable health {backend}/{server}"),
                        Expect::Empty,
                    ));
                }
                out.push(Command::new(format!("enable server {backend}/{server}"), Expect::Empty));
            }
            Step::RemoveServer { backend, server } => {
                out.push(Command::new(
                    format!("set server {backend}/{server} state maint"),
                    Expect::Empty,
                ));
                out.push(Command::new(format!("del server {backend}/{server}"), Expect::Anything));
            }
            Step::EditMap { kind, edits, .. } => {
                let map = maps.ids.get(kind).ok_or_else(|| format!("map {kind} was not found"))?;
                for edit in edits {
                    let line = match edit {
                        MapEdit::Add { key, value } => format!("add map {map} {key} {value}"),
                        MapEdit::Set { key, value } => format!("set map {map} {key} {value}"),
                        MapEdit::Del { key } => format!("del map {map} {key}"),
                    };
                    out.push(Command::new(line, Expect::Empty));
                }
            }
            Step::ReplaceMap { kind, content } => {
                let map = maps
                    .prepared
                    .get(kind)
                    .ok_or_else(|| format!("map {kind} was not prepared"))?;
                for chunk in payload_chunks(content) {
                    out.push(Command {
                        line: format!("add map {map}"),
                        payload: Some(chunk.into()),
                        expect: Expect::Empty,
                    });
                }
                out.push(Command::new(format!("commit map {map}"), Expect::Empty));
            }
        }
    }
    Ok(out)
}

/// A map file's entries in payloads of at most [`MAP_PAYLOAD_BYTES`] (a longer single entry
/// goes alone). Comment and blank lines are left out: a blank line ends a payload.
fn payload_chunks(content: &str) -> Vec<String> {
    let mut chunks = Vec::new();
    let mut chunk = String::new();
    for line in content.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if !chunk.is_empty() && chunk.len() + line.len() + 1 > MAP_PAYLOAD_BYTES {
            chunks.push(std::mem::take(&mut chunk));
        }
        chunk.push_str(line);
        chunk.push('\n');
    }
    if !chunk.is_empty() {
        chunks.push(chunk);
    }
    chunks
}

/// The master CLI session that sends `commands` to the worker `pid`: interactive mode, so that
/// each answer is followed by a prompt and can be told apart, and `quit` at the end. `pid` is
/// the worker's pid, or [`ANY_WORKER`] for the one the host finds current.
pub fn session(pid: impl std::fmt::Display, commands: &[Command]) -> zeroize::Zeroizing<String> {
    let mut s = zeroize::Zeroizing::new(String::from("prompt\n"));
    for c in commands {
        s.push_str(&format!("@!{pid} {}", c.line));
        match &c.payload {
            Some(payload) => {
                s.push_str(" <<\n");
                s.push_str(payload);
                s.push('\n');
            }
            None => s.push('\n'),
        }
    }
    s.push_str("quit\n");
    s
}

/// In place of a pid in a [`session`]: the master's current worker, whose pid the host fills
/// in (swap_runtime in scripts/lib.sh, with PID `-`).
pub const ANY_WORKER: &str = "{pid}";

/// Splits what a [`session`] printed into one answer per command. The first thing printed is
/// the prompt itself (the answer to `prompt`); after that every answer ends with a newline and
/// the prompt. Answers missing at the end (the connection closed early) are absent.
pub fn answers(output: &str, commands: usize) -> Vec<&str> {
    let Some(end) = output.find("> ") else { return Vec::new() };
    let prompt = &output[..end + 2];
    let separator = format!("\n{prompt}");
    let rest = &output[prompt.len()..];
    let mut parts: Vec<&str> = rest.split(separator.as_str()).collect();
    // The last part is what followed the last prompt: never a whole answer.
    parts.pop();
    parts.truncate(commands);
    parts
}

/// The first command HAProxy did not accept, and its answer.
pub fn first_refused<'a>(
    commands: &'a [Command],
    answers: &[&'a str],
) -> Option<(&'a str, String)> {
    for (i, c) in commands.iter().enumerate() {
        match answers.get(i) {
            None => return Some((c.line.as_str(), "no answer".to_owned())),
            Some(a) if !c.accepted(a) => return Some((c.line.as_str(), a.trim().to_owned())),
            Some(_) => {}
        }
    }
    None
}
