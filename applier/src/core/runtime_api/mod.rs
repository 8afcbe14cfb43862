//! Pure decisions for changes HAProxy can take without a reload: given the bundle a host's
//! HAProxy loaded and the next one, either the runtime API commands that make the running
//! process serve what the next bundle describes, or why it needs a reload.
//!
//! A change goes in through the runtime API when, comments and blank lines aside, the two
//! configs differ only in
//! - the map files' names and contents (a few entries changed are a command each on the
//!   running map, [`map_edits`]; more, and the map is replaced atomically: `prepare map`, `add
//!   map @<ver>`, `commit map`);
//! - the server lines of backends both configs have: an address or port (`set server … addr`),
//!   a weight (`set server … weight`; a pod draining is weight 0), a server gone (`set server
//!   … state maint`, then `del server`, which HAProxy may refuse while connections last: the
//!   server then stays in maintenance and takes no traffic, and its open connections finish),
//!   or a server added: one that tracks another server for its health (`add server … track`,
//!   `enable server`), or a pod's endpoint that checks itself (`add server … check`, `enable
//!   health`, `enable server`).
//!
//! Anything else (a backend added or removed, a server option `add server` does not take, any
//! other line) needs a reload, and so does any command HAProxy refuses: the rollout then
//! reloads onto the files, which are written before any command is sent. The files on disk
//! always hold the next bundle, so a later reload or restart changes nothing.
//!
//! A reload whose only cause is new backends may be bridged ([`bridge`]): until it, the
//! running process serves them through empty spare backends the renderer keeps.

use hafleet_proto::Bundle;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

mod commands;
pub use commands::*;
pub mod map_edits;
pub use map_edits::MapEdit;

/// More commands than this and a reload is the cheaper way (and the easier one to reason about).
pub const MAX_COMMANDS: usize = 100_000;

/// Bytes of map entries per `add map` command: HAProxy reads a command's payload into one
/// buffer (16 kB by default).
const MAP_PAYLOAD_BYTES: usize = 8 * 1024;

/// One change to the running process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    SetAddr {
        backend: String,
        server: String,
        ip: IpAddr,
        port: u16,
    },
    SetWeight {
        backend: String,
        server: String,
        weight: u32,
    },
    /// `add server <backend>/<server> <addr> <params>`, then `enable server` (a server added
    /// at runtime starts in maintenance).
    AddServer {
        backend: String,
        server: String,
        addr: String,
        params: Vec<String>,
    },
    /// `set server … state maint`, then `del server` (whose refusal is tolerated).
    RemoveServer {
        backend: String,
        server: String,
    },
    /// Replace every entry of the map of this kind with `content`'s.
    ReplaceMap {
        kind: String,
        content: String,
    },
    /// Change these entries of the running map of this kind, one command each; `before` is
    /// how many entries it holds first (the loaded file's), which the host checks.
    EditMap {
        kind: String,
        edits: Vec<MapEdit>,
        before: usize,
    },
    /// Load the certificate file `path` (on disk already: chain and key) and list it in the
    /// running crt-list for `filters`: `new ssl cert`, `set ssl cert` with the file's content
    /// (given by whoever builds the commands: the plan never holds a key), `commit ssl cert`,
    /// `add ssl crt-list`.
    AddCert {
        path: String,
        filters: Vec<String>,
    },
    /// `del ssl crt-list`, then `del ssl cert` (whose refusal is tolerated).
    RemoveCert {
        path: String,
    },
}

/// What a change needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The two bundles are the same config.
    Nothing,
    /// These steps, in order: servers added first, servers removed last, so a backend never
    /// runs out of servers in between.
    Runtime(Vec<Step>),
    /// A reload, and why.
    Reload(String),
    /// A reload, and why; but first, the backends the next config adds are served through
    /// spare backends of the running process (see [`bridge`]).
    Bridged { why: String, bridge: Bridge },
}

/// Backends a config adds, served through spare backends at runtime ahead of the reload
/// that adds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bridge {
    /// (the new backend, the spare that serves it until the reload), by backend name.
    pub spares: Vec<(String, String)>,
    /// Servers added to the spares, then the maps changed (edited or replaced) so that the
    /// new backends' entries name their spares.
    pub steps: Vec<Step>,
}

/// The names of the spare backends start with this (renderer/src/core/model.rs, `SPARE_PREFIX`).
pub const SPARE_PREFIX: &str = "hafleet_spare_";

/// A config reduced to what HAProxy acts on.
#[derive(Debug, Default, PartialEq, Eq)]
struct Parsed<'a> {
    /// Sections other than backends, in order: header and directives.
    other: Vec<(&'a str, Vec<String>)>,
    backends: BTreeMap<&'a str, ParsedBackend<'a>>,
    /// Tokens of every `default-server` line of every `defaults` section.
    default_servers: Vec<Vec<&'a str>>,
    /// `backend/server` of every server another one tracks.
    tracked: BTreeSet<String>,
}

#[derive(Debug, Default, PartialEq, Eq)]
struct ParsedBackend<'a> {
    /// Directives other than `server`, in order.
    lines: Vec<&'a str>,
    /// Servers by name: (address, parameters).
    servers: BTreeMap<&'a str, (&'a str, Vec<&'a str>)>,
    /// Server names in the order the config lists them.
    order: Vec<&'a str>,
}

/// Where a config names map files: for each name, the text before it (from, to) and the
/// map's kind; then where the text after the last name starts.
type MapNamePieces = (Vec<(usize, usize, String)>, usize);

/// Whether the two bundles' configs are the same text but for the names of their map files
/// (each the same kind at the same place): what [`normalize_map_names`] would make equal, found
/// by comparing the text between map names in place.
fn same_but_map_names(a: &Bundle, b: &Bundle) -> bool {
    let prefix = format!("{}/", hafleet_proto::bundle::MAPS_DIR);
    // (text before, the map's kind) for each map name, then the text after the last.
    let pieces = |bundle: &'_ Bundle| -> Option<MapNamePieces> {
        let config = bundle.config.as_str();
        let mut out = Vec::new();
        let mut from = 0;
        for (at, _) in config.match_indices(&prefix) {
            if at < from {
                continue;
            }
            let rest = &config[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '.' | '_')))
                .unwrap_or(rest.len());
            let path = &rest[..end];
            let map = bundle.maps.iter().find(|m| m.name.relative_path() == path)?;
            out.push((from, at, map.name.kind().to_owned()));
            from = at + end;
        }
        Some((out, from))
    };
    let (Some((pa, ta)), Some((pb, tb))) = (pieces(a), pieces(b)) else { return false };
    pa.len() == pb.len()
        && pa.iter().zip(&pb).all(|((fa, aa, ka), (fb, ab, kb))| {
            // Every piece but the first starts right after a map name.
            ka == kb && same_piece(&a.config[*fa..*aa], &b.config[*fb..*ab], *fa > 0, true)
        })
        && same_piece(&a.config[ta..], &b.config[tb..], !pa.is_empty(), false)
}

/// Whether two pieces of config around map names are the same: a partial line next to a map
/// name (the first line if `after_name`, the last if `before_name`) byte for byte, the other
/// lines but for comments. A line break moved next to a map name is a change.
fn same_piece(a: &str, b: &str, after_name: bool, before_name: bool) -> bool {
    // (the piece's first line with its newline, the middle, the last line from its newline)
    let split = |s: &'_ str| -> Option<(usize, usize)> { Some((s.find('\n')?, s.rfind('\n')?)) };
    match (split(a), split(b)) {
        (None, None) => a == b,
        (Some((first_a, last_a)), Some((first_b, last_b))) => {
            let (start_a, start_b) = if after_name { (first_a + 1, first_b + 1) } else { (0, 0) };
            let (end_a, end_b) = if before_name { (last_a, last_b) } else { (a.len(), b.len()) };
            (!after_name || a[..start_a] == b[..start_b])
                && (!before_name || a[end_a..] == b[end_b..])
                && same_but_comments(
                    a.get(start_a..end_a.max(start_a)).unwrap_or_default(),
                    b.get(start_b..end_b.max(start_b)).unwrap_or_default(),
                )
        }
        // A line break on one side only, where the other has none.
        _ => false,
    }
}

/// Whether two pieces of config are the same but for comment lines, blank lines and trailing
/// blanks (none of which HAProxy acts on). Equal bytes are the fast case.
fn same_but_comments(a: &str, b: &str) -> bool {
    a == b || acted_on(a).eq(acted_on(b))
}

/// The lines of `s` HAProxy acts on, without trailing blanks.
fn acted_on(s: &str) -> impl Iterator<Item = &str> {
    s.lines().map(str::trim_end).filter(|l| !l.is_empty() && !l.trim_start().starts_with('#'))
}

/// `config` with every map file name of `maps` replaced by `<map:kind>`, so that configs that
/// differ only in their maps' contents compare equal.
fn normalize_map_names(config: &str, bundle: &Bundle) -> String {
    let mut out = config.to_owned();
    for map in &bundle.maps {
        out = out.replace(&map.name.relative_path(), &format!("<map:{}>", map.name.kind()));
    }
    out
}

fn parse(config: &str) -> Result<Parsed<'_>, String> {
    let mut parsed = Parsed::default();
    // The section being read: None before the first header.
    enum Current<'a> {
        None,
        Other(usize),
        Backend(&'a str),
    }
    let mut current = Current::None;
    for raw in config.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let indented = raw.starts_with([' ', '\t']);
        if !indented {
            let mut words = line.split_whitespace();
            let keyword = words.next().unwrap_or_default();
            if keyword == "backend" {
                let name = words.next().ok_or("a backend without a name")?;
                if parsed.backends.insert(name, ParsedBackend::default()).is_some() {
                    return Err(format!("backend {name} appears twice"));
                }
                current = Current::Backend(name);
            } else {
                parsed.other.push((line, Vec::new()));
                current = Current::Other(parsed.other.len() - 1);
            }
            continue;
        }
        match current {
            Current::None => return Err(format!("a directive before any section: {line}")),
            Current::Other(i) => {
                if parsed.other[i].0.starts_with("defaults") && line.starts_with("default-server") {
                    parsed.default_servers.push(line.split_whitespace().skip(1).collect());
                }
                parsed.other[i].1.push(line.to_owned());
            }
            Current::Backend(name) => {
                let backend = parsed.backends.get_mut(name).expect("inserted at its header");
                let words: Vec<&str> = line.split_whitespace().collect();
                if let ["server", server, addr, params @ ..] = words.as_slice() {
                    if let Some(at) = params.iter().position(|w| *w == "track")
                        && let Some(target) = params.get(at + 1)
                    {
                        parsed.tracked.insert(match target.contains('/') {
                            true => (*target).to_owned(),
                            false => format!("{name}/{target}"),
                        });
                    }
                    if backend.servers.insert(server, (addr, params.to_vec())).is_some() {
                        return Err(format!("server {name}/{server} appears twice"));
                    }
                    backend.order.push(server);
                } else {
                    backend.lines.push(line);
                }
            }
        }
    }
    Ok(parsed)
}

/// The names of `config`'s backend sections, read from their header lines as [`parse`] reads
/// them (a line that does not start with a blank, whose first word is `backend`), without
/// looking at any other line's words.
fn backend_names(config: &str) -> BTreeSet<&str> {
    config
        .lines()
        .filter(|raw| !raw.starts_with([' ', '\t']))
        .filter_map(|raw| {
            let mut words = raw.split_whitespace();
            (words.next() == Some("backend")).then(|| words.next()).flatten()
        })
        .collect()
}

/// `ip:port` or `[ipv6]:port`.
fn ip_port(addr: &str) -> Option<(IpAddr, u16)> {
    let (ip, port) = addr.rsplit_once(':')?;
    let ip = ip.strip_prefix('[').and_then(|i| i.strip_suffix(']')).unwrap_or(ip);
    Some((ip.parse().ok()?, port.parse().ok()?))
}

/// A server's parameters without its `weight`, and the weight (None: not set).
fn split_weight<'a>(params: &[&'a str]) -> (Vec<&'a str>, Option<&'a str>) {
    let mut rest = Vec::new();
    let mut weight = None;
    let mut words = params.iter();
    while let Some(&w) = words.next() {
        if w == "weight" {
            weight = words.next().copied();
        } else {
            rest.push(w);
        }
    }
    (rest, weight)
}

/// Keywords of `default-server` (besides `check` and `no-check`) that only time a server's own
/// health checks, each with a value. A server with `no-check` and `track` runs none, so added
/// at runtime (where it inherits no `default-server`) it behaves as the same line read from
/// the file; a server that checks itself is given them explicitly.
const CHECK_TIMING: &[&str] = &["inter", "fastinter", "downinter", "fall", "rise"];

/// Keywords of a server line (each with a value, but for the flags) that `add server` takes
/// and that act the same on a server added at runtime.
const RUNTIME_KEYWORDS: &[&str] = &["weight", "maxconn"];
const RUNTIME_FLAGS: &[&str] = &["send-proxy", "send-proxy-v2"];

/// The parameters `add server` takes for a server line of the file, if it is one that
/// behaves the same when added at runtime, where it inherits no `default-server`:
/// - one that tracks another server for its health (HAProxy refuses `no-check` on `add
///   server`; a server added at runtime checks nothing anyway), with at most a weight besides;
/// - one that runs its own health check (a pod's endpoint), given the check's timing it
///   would inherit, with at most a weight, a maxconn and the PROXY protocol besides. Its check
///   is started after it is added ([`commands`]: `enable health`).
fn dynamic_params(
    params: &[&str],
    backend_defaults: &[&str],
    defaults: &[Vec<&str>],
) -> Result<Vec<String>, String> {
    let mut checks_by_default = false;
    // The check's timing, as the server would inherit it (a later default wins).
    let mut timing: BTreeMap<&str, &str> = BTreeMap::new();
    let inherited: Vec<&str> =
        defaults.iter().flatten().copied().chain(backend_defaults.iter().copied()).collect();
    let mut words = inherited.iter();
    while let Some(&w) = words.next() {
        match w {
            "check" => checks_by_default = true,
            "no-check" => checks_by_default = false,
            w if CHECK_TIMING.contains(&w) => {
                let value =
                    words.next().ok_or_else(|| format!("default-server {w} without a value"))?;
                timing.insert(w, value);
            }
            w => {
                return Err(format!(
                    "default-server sets {w}, which a server added at runtime would not inherit"
                ));
            }
        }
    }
    let mut out = Vec::new();
    let (mut no_check, mut check, mut track) = (false, false, false);
    let mut words = params.iter();
    while let Some(&w) = words.next() {
        match w {
            "no-check" => no_check = true,
            "check" => check = true,
            w if CHECK_TIMING.contains(&w) => {
                let value = words.next().ok_or_else(|| format!("{w} without a value"))?;
                timing.insert(w, value);
            }
            "track" => {
                let value = words.next().ok_or("track without a value")?;
                track = true;
                out.extend([w.to_owned(), (*value).to_owned()]);
            }
            w if RUNTIME_KEYWORDS.contains(&w) => {
                let value = words.next().ok_or_else(|| format!("{w} without a value"))?;
                out.extend([w.to_owned(), (*value).to_owned()]);
            }
            w if RUNTIME_FLAGS.contains(&w) => out.push(w.to_owned()),
            other => return Err(format!("it sets {other}")),
        }
    }
    let own_check = (check || checks_by_default) && !no_check;
    if track {
        if own_check {
            return Err("it would run its own health check besides tracking".into());
        }
        if out.len() > 2 && !matches!(out.as_slice(), [_, _, w, _] if w == "weight") {
            return Err("a server that tracks another takes at most a weight at runtime".into());
        }
        return Ok(out);
    }
    if own_check {
        out.push("check".to_owned());
        for (w, value) in timing {
            out.extend([w.to_owned(), value.to_owned()]);
        }
    }
    Ok(out)
}

/// The servers of one backend present in both configs (`config` the next one): what changed,
/// as steps.
fn server_steps(
    name: &str,
    old: &ParsedBackend<'_>,
    new: &ParsedBackend<'_>,
    config: &Parsed<'_>,
    added: &mut Vec<Step>,
    changed: &mut Vec<Step>,
    removed: &mut Vec<Step>,
) -> Result<(), String> {
    if old.lines != new.lines {
        return Err(format!("backend {name} changed beyond its servers"));
    }
    let backend_defaults: Vec<&str> = new
        .lines
        .iter()
        .filter_map(|l| l.strip_prefix("default-server"))
        .flat_map(str::split_whitespace)
        .collect();
    for server in &new.order {
        let (addr, params) = &new.servers[server];
        let Some((old_addr, old_params)) = old.servers.get(server) else {
            let cannot =
                |why: &str| format!("server {name}/{server} cannot be added at runtime: {why}");
            // HAProxy lets no server track one added at runtime.
            if config.tracked.contains(&format!("{name}/{server}")) {
                return Err(cannot("other servers track it"));
            }
            let params = dynamic_params(params, &backend_defaults, &config.default_servers)
                .map_err(|why| cannot(&why))?;
            if ip_port(addr).is_none() {
                return Err(format!("server {name}/{server} has no ip:port address"));
            }
            added.push(Step::AddServer {
                backend: name.to_owned(),
                server: (*server).to_owned(),
                addr: (*addr).to_owned(),
                params,
            });
            continue;
        };
        let (rest, weight) = split_weight(params);
        let (old_rest, old_weight) = split_weight(old_params);
        if rest != old_rest {
            return Err(format!("server {name}/{server} changed beyond its address and weight"));
        }
        if addr != old_addr {
            let (ip, port) = ip_port(addr)
                .ok_or_else(|| format!("server {name}/{server} has no ip:port address"))?;
            changed.push(Step::SetAddr {
                backend: name.to_owned(),
                server: (*server).to_owned(),
                ip,
                port,
            });
        }
        if weight != old_weight {
            let weight = match weight {
                None => 1,
                Some(w) => w.parse().map_err(|_| format!("server {name}/{server}: weight {w}"))?,
            };
            changed.push(Step::SetWeight {
                backend: name.to_owned(),
                server: (*server).to_owned(),
                weight,
            });
        }
    }
    for server in &old.order {
        if !new.servers.contains_key(server) {
            removed.push(Step::RemoveServer {
                backend: name.to_owned(),
                server: (*server).to_owned(),
            });
        }
    }
    Ok(())
}

/// What it takes to go from `loaded` (the bundle the host's HAProxy runs) to `next`.
pub fn plan(loaded: &Bundle, next: &Bundle) -> Plan {
    match plan_alone(loaded, next) {
        Plan::Reload(why) => match bridge(loaded, next) {
            Some(bridge) => Plan::Bridged { why, bridge },
            None => Plan::Reload(why),
        },
        plan => plan,
    }
}

/// [`plan`] without looking for a [`bridge`] for a reload: that parses both configs (60 ms
/// at 10,000 backends), which a rollout does while its hosts check the new config, not
/// before it sends them anything.
pub fn plan_alone(loaded: &Bundle, next: &Bundle) -> Plan {
    match try_plan(loaded, next) {
        Ok(steps) if steps.is_empty() => Plan::Nothing,
        Ok(steps) if command_count(&steps) > MAX_COMMANDS => {
            Plan::Reload(format!("the change takes more than {MAX_COMMANDS} runtime commands"))
        }
        Ok(steps) => Plan::Runtime(steps),
        Err(why) => Plan::Reload(why),
    }
}

/// How the running process can serve `next`'s new backends before the reload that adds
/// them, if it can: when the only change HAProxy cannot take at runtime is backends added
/// (none removed), each with the settings of an empty spare backend `loaded` has
/// (`hafleet_spare_<n>`, as the renderer writes them) and servers that can be added at
/// runtime (they track a node's check), and there are spares enough for all of them. The
/// steps are those from `loaded` to `next` with each new backend renamed to its spare (and
/// its map entries naming the spare): servers added to the spare, then the maps changed.
///
/// The reload that follows loads the files, where the spares are empty again and each new
/// backend has its own name: the spare's servers serve only until then.
pub fn bridge(loaded: &Bundle, next: &Bundle) -> Option<Bridge> {
    let (old_names, new_names) = (backend_names(&loaded.config), backend_names(&next.config));
    if !old_names.is_subset(&new_names) {
        return None;
    }
    let added: Vec<&str> = new_names.difference(&old_names).copied().collect();
    if added.is_empty() || added.iter().any(|a| a.starts_with(SPARE_PREFIX)) {
        return None;
    }
    let empty = empty_backends(&loaded.config);
    let free: Vec<&str> = old_names
        .iter()
        .copied()
        .filter(|n| n.starts_with(SPARE_PREFIX) && empty.contains(n))
        .collect();
    if free.len() < added.len() {
        return None;
    }
    let spares: BTreeMap<&str, &str> = added.iter().copied().zip(free.iter().copied()).collect();
    let renamed = rename_backends(&next.config, &spares)?;
    let maps = next
        .maps
        .iter()
        .map(|m| hafleet_proto::MapFile {
            name: m.name.clone(),
            content: match m.name.kind() {
                CRT_LIST => m.content.clone(),
                _ => rename_map_values(&m.content, &spares),
            },
        })
        .collect();
    let through_spares = Bundle::new(renamed, maps, next.certs.clone());
    let steps = try_plan(loaded, &through_spares).ok()?;
    if steps.is_empty() || command_count(&steps) > MAX_COMMANDS {
        return None;
    }
    let spares = spares.into_iter().map(|(b, s)| (b.to_owned(), s.to_owned())).collect();
    Some(Bridge { spares, steps })
}

/// The commands that show each spare `bridge` takes as the running process has it.
pub fn spare_checks(bridge: &Bridge) -> Vec<Command> {
    let show = |spare: &str| Command::new(format!("show servers state {spare}"), Expect::Anything);
    bridge.spares.iter().map(|(_, spare)| show(spare)).collect()
}

/// The first spare of `bridge` whose answer to [`spare_checks`] (in order) lists a server, or
/// is not a list of servers at all.
pub fn busy_spare<'a, S: AsRef<str>>(bridge: &'a Bridge, answers: &[S]) -> Option<&'a str> {
    let empty = |spare: &str, answer: Option<&S>| {
        answer.map(AsRef::as_ref).is_some_and(|a| {
            a.contains("# be_id") && !a.lines().any(|l| l.split_whitespace().nth(1) == Some(spare))
        })
    };
    let mut spares = bridge.spares.iter().enumerate();
    spares.find(|(i, (_, spare))| !empty(spare, answers.get(*i))).map(|(_, (_, s))| s.as_str())
}

/// A bridge's steps: the servers it adds to spares, then the rest (the maps).
pub fn split_bridge(steps: &[Step]) -> (Vec<Step>, Vec<Step>) {
    steps.iter().cloned().partition(|s| matches!(s, Step::AddServer { .. }))
}

/// The backends of `config` with no `server` line, read as [`parse`] reads sections.
fn empty_backends(config: &str) -> BTreeSet<&str> {
    let mut empty = BTreeSet::new();
    let mut current: Option<&str> = None;
    for raw in config.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if !raw.starts_with([' ', '\t']) {
            let mut words = line.split_whitespace();
            current = match (words.next(), words.next()) {
                (Some("backend"), Some(name)) => {
                    empty.insert(name);
                    Some(name)
                }
                _ => None,
            };
        } else if let Some(name) = current
            && line.split_whitespace().next() == Some("server")
        {
            empty.remove(name);
        }
    }
    empty
}

/// `config` with each backend named in `spares` renamed to its spare, and the spares' own
/// (empty) sections left out; `None` if a renamed backend's header says more than its name
/// (`from <defaults>`, say: a spare has the header's settings of neither).
fn rename_backends(config: &str, spares: &BTreeMap<&str, &str>) -> Option<String> {
    let used: BTreeSet<&str> = spares.values().copied().collect();
    let mut out = String::with_capacity(config.len());
    let mut skipping = false;
    for raw in config.split_inclusive('\n') {
        let line = raw.trim();
        let header = !line.is_empty() && !line.starts_with('#') && !raw.starts_with([' ', '\t']);
        if header {
            let mut words = line.split_whitespace();
            let name = (words.next() == Some("backend")).then(|| words.next()).flatten();
            skipping = name.is_some_and(|n| used.contains(n));
            if let Some(spare) = name.and_then(|n| spares.get(n)) {
                if words.next().is_some() {
                    return None;
                }
                out.push_str("backend ");
                out.push_str(spare);
                out.push('\n');
                continue;
            }
        }
        if !skipping {
            out.push_str(raw);
        }
    }
    Some(out)
}

/// A map's content (`key value` lines) with each value named in `spares` replaced by its
/// spare.
fn rename_map_values(content: &str, spares: &BTreeMap<&str, &str>) -> String {
    let mut out = String::with_capacity(content.len());
    for raw in content.split_inclusive('\n') {
        let line = raw.strip_suffix('\n').unwrap_or(raw);
        match line.rsplit_once(' ').and_then(|(key, value)| Some((key, spares.get(value)?))) {
            Some((key, spare)) => {
                out.push_str(key);
                out.push(' ');
                out.push_str(spare);
                out.push('\n');
            }
            None => out.push_str(raw),
        }
    }
    out
}

fn try_plan(loaded: &Bundle, next: &Bundle) -> Result<Vec<Step>, String> {
    // The crt-list is not a map: its changes are certificates loaded and listed, or unlisted.
    let (cert_adds, cert_removes) = cert_steps(loaded, next)?;
    let kinds = |b: &Bundle| b.maps.iter().map(|m| m.name.kind().to_owned()).collect::<Vec<_>>();
    let (old_kinds, new_kinds) = (kinds(loaded), kinds(next));
    if old_kinds != new_kinds || new_kinds.iter().collect::<BTreeSet<_>>().len() != new_kinds.len()
    {
        return Err("the set of map files changed".into());
    }
    let replaced_maps = || {
        loaded
            .maps
            .iter()
            .zip(&next.maps)
            .filter(|(old, new)| old.name != new.name && new.name.kind() != CRT_LIST)
            .map(|(old, new)| map_edits::map_step(new.name.kind(), &old.content, &new.content))
    };
    // The common change at scale, a route added or moved, changes map files only: found
    // without rewriting and parsing two configs of megabytes (80 ms at 10,000 backends).
    if same_but_map_names(loaded, next) {
        let mut steps = cert_adds;
        steps.extend(replaced_maps());
        steps.extend(cert_removes);
        return Ok(steps);
    }
    // A backend added or removed (a new Service, the common reload) needs a reload whatever
    // else changed: found from the section headers alone, not by parsing two configs of
    // megabytes (40 ms a host at 10,000 backends, before anything is sent).
    let (old_names, new_names) = (backend_names(&loaded.config), backend_names(&next.config));
    if old_names != new_names {
        let gone = old_names.difference(&new_names).count();
        let added = new_names.difference(&old_names).count();
        return Err(format!("{added} backend(s) added and {gone} removed"));
    }
    let (old_text, new_text) =
        (normalize_map_names(&loaded.config, loaded), normalize_map_names(&next.config, next));
    let (old, new) = (parse(&old_text)?, parse(&new_text)?);
    if old.other != new.other {
        return Err("a section other than a backend changed".into());
    }
    // Equal above for any config the renderer makes; read again from what was parsed, as a
    // backend name that held a map's path would differ once map names are normalized.
    if !old.backends.keys().eq(new.backends.keys()) {
        return Err("the backends changed".into());
    }
    let (mut added, mut changed, mut removed) = (Vec::new(), Vec::new(), Vec::new());
    for (name, new_backend) in &new.backends {
        let old_backend = &old.backends[name];
        if old_backend != new_backend {
            server_steps(
                name,
                old_backend,
                new_backend,
                &new,
                &mut added,
                &mut changed,
                &mut removed,
            )?;
        }
    }
    let mut steps = cert_adds;
    steps.append(&mut added);
    steps.append(&mut changed);
    steps.extend(replaced_maps());
    steps.append(&mut removed);
    steps.extend(cert_removes);
    Ok(steps)
}

/// The map kind of the crt-list (renderer/src/core/certs.rs).
pub const CRT_LIST: &str = "crtlist";

/// The certificate steps from `loaded`'s crt-list to `next`'s: certificates listed now and not
/// before are added (before anything else changes), those no longer listed are removed (after
/// everything else). A certificate listed in both for other hosts, or a crt-list that appears or
/// goes (the HTTPS bind with it), needs a reload.
fn cert_steps(loaded: &Bundle, next: &Bundle) -> Result<(Vec<Step>, Vec<Step>), String> {
    /// Each certificate's lines (their filters). The renderer splits a certificate that
    /// serves more hosts than a line holds; the runtime API adds and deletes crt-list entries
    /// by certificate, so adding, changing or removing such a one is a reload (an unchanged
    /// one is not).
    type Lines<'a> = BTreeMap<&'a str, Vec<Vec<&'a str>>>;
    fn lines(b: &Bundle) -> Option<Lines<'_>> {
        let list = b.maps.iter().find(|m| m.name.kind() == CRT_LIST)?;
        let mut out: Lines<'_> = BTreeMap::new();
        for l in list.content.lines() {
            let mut words = l.split_whitespace();
            let Some(path) = words.next() else { continue };
            out.entry(path).or_default().push(words.collect());
        }
        Some(out)
    }
    let (old, new) = match (lines(loaded), lines(next)) {
        (None, None) => return Ok((vec![], vec![])),
        (Some(old), Some(new)) => (old, new),
        _ => return Err("HTTPS was turned on or off".into()),
    };
    let several = |path: &str| format!("certificate {path} is on several crt-list lines");
    let mut adds = Vec::new();
    for (path, filters) in &new {
        match old.get(path) {
            Some(before) if before == filters => {}
            _ if filters.len() > 1 => return Err(several(path)),
            Some(_) => return Err(format!("certificate {path} serves other hosts now")),
            None => adds.push(Step::AddCert {
                path: (*path).to_owned(),
                filters: filters[0].iter().map(|f| (*f).to_owned()).collect(),
            }),
        }
    }
    if let Some((path, _)) = old.iter().find(|(p, l)| l.len() > 1 && !new.contains_key(*p)) {
        return Err(several(path));
    }
    let removes = old
        .keys()
        .filter(|p| !new.contains_key(*p))
        .map(|p| Step::RemoveCert { path: (*p).to_owned() })
        .collect();
    Ok((adds, removes))
}

/// Whether `steps` add or remove a certificate: those need the running crt-list's name and
/// the certificates' files (chain and key), which the host fills in ([`CertInputs::on_host`]).
pub fn touches_certs(steps: &[Step]) -> bool {
    steps.iter().any(|s| matches!(s, Step::AddCert { .. } | Step::RemoveCert { .. }))
}

/// Whether a host taking `plan` swaps in the round trip of its runtime commands
/// (swap_runtime.sh), which checks that the host is as it was prepared: every change through
/// the runtime API, certificates included.
pub fn swaps_with_commands(plan: &Plan) -> bool {
    matches!(plan, Plan::Runtime(_))
}

/// The paths of the certificate files a plan loads.
pub fn added_certs(steps: &[Step]) -> Vec<&str> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::AddCert { path, .. } => Some(path.as_str()),
            _ => None,
        })
        .collect()
}

/// From `show ssl crt-list`: the crt-list the running process has (the one of the config it
/// last loaded, whatever versions went in through the runtime API since). `None` unless there
/// is exactly one.
pub fn running_crt_list(show: &str) -> Option<String> {
    let found: Vec<&str> = show
        .lines()
        .map(str::trim)
        .filter(|l| {
            l.strip_prefix(&format!("{}/", hafleet_proto::MAPS_DIR))
                .and_then(|name| hafleet_proto::MapName::new(name.to_owned()).ok())
                .is_some_and(|n| n.kind() == CRT_LIST)
        })
        .collect();
    match found.as_slice() {
        [one] => Some((*one).to_owned()),
        _ => None,
    }
}

/// Whether `plan` changes map files only (or nothing HAProxy acts on): the next config is then
/// the loaded one but for its map files' names and its comments.
pub fn files_only(plan: &Plan) -> bool {
    match plan {
        Plan::Nothing => true,
        Plan::Runtime(steps) => steps.iter().all(|s| {
            matches!(
                s,
                Step::ReplaceMap { .. }
                    | Step::EditMap { .. }
                    | Step::AddCert { .. }
                    | Step::RemoveCert { .. }
            )
        }),
        Plan::Reload(_) | Plan::Bridged { .. } => false,
    }
}

/// A config for `haproxy -c` that loads every map file of `bundle` with each converter its
/// config applies to that map, and the certificate files `certs` (paths as the crt-list names
/// them, relative to the config's folder), and nothing else. For a version whose config
/// HAProxy already runs but for its maps and the certificates of its crt-list
/// ([`files_only`]), checking this is checking the version: the rest of the config, and every
/// other certificate file, is what passed `haproxy -c` and loaded before. It takes
/// milliseconds where the whole config of 10,000 backends takes most of a second, and a
/// crt-list of 1,000 certificates half a second. Its `global` says
/// `httpclient.ssl.verify none`, as the built-in template does: without it HAProxy 2.6 loads
/// the system's CA store at each start for an HTTP client this check never uses (28 ms
/// instead of 7 for `haproxy -c` on one map, BENCHMARKS.md).
///
/// `None` (check the whole config) when the config names a map other than as the first
/// argument of a `map*` converter, does not name one of the bundle's maps, or has no
/// `default-path` (then relative map paths depend on HAProxy's working directory, which this
/// check could not reproduce).
pub fn map_check_config(bundle: &Bundle, certs: &[&str]) -> Option<String> {
    let default_path = bundle
        .config
        .lines()
        .map(str::trim)
        .find(|l| l.split_whitespace().next() == Some("default-path"))?;
    let prefix = format!("{}/", hafleet_proto::bundle::MAPS_DIR);
    let mut uses = BTreeSet::new();
    for (at, _) in bundle.config.match_indices(&prefix) {
        // The crt-list is no map: a version that only changes maps keeps it, and the
        // certificates it names were loaded before.
        if bundle.config[..at].ends_with("crt-list ") {
            continue;
        }
        let before = bundle.config[..at].strip_suffix('(')?;
        let start =
            before.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
        let converter = &before[start..];
        let rest = &bundle.config[at..];
        let path = &rest[..rest.find([')', ','])?];
        if !converter.starts_with("map") || path.contains(char::is_whitespace) {
            return None;
        }
        uses.insert((converter, path));
    }
    for map in bundle.maps.iter().filter(|m| m.name.kind() != CRT_LIST) {
        let path = map.name.relative_path();
        if !uses.iter().any(|(_, p)| *p == path) {
            return None;
        }
    }
    let mut out = format!(
        "# hafleet: the map files of a version whose config HAProxy runs but for its maps\n\
         global\n    {default_path}\n    httpclient.ssl.verify none\n\
         defaults\n    mode http\n    timeout connect 1s\n    timeout client 1s\n    \
         timeout server 1s\n\
         frontend hafleet_map_check\n    bind 127.0.0.1:1\n"
    );
    for (converter, path) in uses {
        out.push_str(&format!(
            "    http-request set-var(txn.hafleet_map_check) path,{converter}({path})\n"
        ));
    }
    if !certs.is_empty() {
        // Each file loaded as HAProxy loads a crt-list's: chain, key, and that they match.
        // HAProxy reads at most 64 words a line: 30 files a bind line.
        out.push_str("frontend hafleet_cert_check\n");
        for chunk in certs.chunks(30) {
            out.push_str("    bind 127.0.0.1:2 ssl");
            for path in chunk {
                if !path.starts_with(&format!("{}/", hafleet_proto::tls::CERTS_DIR))
                    || path.contains(char::is_whitespace)
                {
                    return None;
                }
                out.push_str(&format!(" crt {path}"));
            }
            out.push('\n');
        }
    }
    Some(out)
}

fn command_count(steps: &[Step]) -> usize {
    steps
        .iter()
        .map(|s| match s {
            Step::ReplaceMap { content, .. } => 2 + content.len() / MAP_PAYLOAD_BYTES,
            Step::EditMap { edits, .. } => edits.len(),
            Step::AddServer { params, .. } => 2 + usize::from(params.iter().any(|p| p == "check")),
            Step::RemoveServer { .. } => 2,
            _ => 1,
        })
        .sum()
}

#[cfg(test)]
mod tests;
