//! Pure decisions for changes HAProxy can take without a reload: given the bundle a host's
//! HAProxy loaded and the next one, either the runtime API commands that make the running
//! process serve what the next bundle describes, or why it needs a reload.
//!
//! A change goes in through the runtime API when, comments and blank lines aside, the two
//! configs differ only in
//! - the map files' names and contents (each changed map is replaced atomically: `prepare map`,
//!   `add map @<ver>`, `commit map`);
//! - the server lines of backends both configs have: an address or port (`set server … addr`),
//!   a weight (`set server … weight`), a server gone (`set server … state maint`, then
//!   `del server`, which HAProxy may refuse while connections last: the server then stays in
//!   maintenance and takes no traffic), or a server added that tracks another server for its
//!   health (`add server … track`, `enable server`).
//!
//! Anything else (a backend added or removed, a server that needs its own health check, any
//! other line) needs a reload, and so does any command HAProxy refuses: the rollout then
//! reloads onto the files, which are written before any command is sent. The files on disk
//! always hold the next bundle, so a later reload or restart changes nothing.
//!
//! A reload whose only cause is new backends may be bridged ([`bridge`]): until it, the
//! running process serves them through empty spare backends the renderer keeps.

use hafleet_proto::Bundle;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

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
    /// Servers added to the spares, then the maps replaced with the new backends' entries
    /// naming their spares.
    pub steps: Vec<Step>,
}

/// The names of the spare backends start with this (renderer/src/model.rs, `SPARE_PREFIX`).
pub const SPARE_PREFIX: &str = "hafleet_spare_";

/// A config reduced to what HAProxy acts on.
#[derive(Debug, Default, PartialEq, Eq)]
struct Parsed<'a> {
    /// Sections other than backends, in order: header and directives.
    other: Vec<(&'a str, Vec<String>)>,
    backends: BTreeMap<&'a str, ParsedBackend<'a>>,
    /// Tokens of every `default-server` line of every `defaults` section.
    default_servers: Vec<Vec<&'a str>>,
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
/// the file.
const CHECK_TIMING: &[&str] = &["inter", "fastinter", "downinter", "fall", "rise"];

/// The parameters `add server` takes for a server line of the file, if it is one that
/// behaves the same when added at runtime: it tracks another server for its health (HAProxy
/// refuses `no-check` on `add server`; a server added at runtime checks nothing anyway), with
/// at most a weight besides.
fn dynamic_params(
    params: &[&str],
    backend_defaults: &[&str],
    defaults: &[Vec<&str>],
) -> Result<Vec<String>, String> {
    let mut checks_by_default = false;
    let inherited: Vec<&str> =
        defaults.iter().flatten().copied().chain(backend_defaults.iter().copied()).collect();
    let mut words = inherited.iter();
    while let Some(&w) = words.next() {
        match w {
            "check" => checks_by_default = true,
            "no-check" => checks_by_default = false,
            w if CHECK_TIMING.contains(&w) => {
                words.next();
            }
            w => {
                return Err(format!(
                    "default-server sets {w}, which a server added at runtime would not inherit"
                ));
            }
        }
    }
    let mut out = Vec::new();
    let (mut no_check, mut track) = (false, false);
    let mut words = params.iter();
    while let Some(&w) = words.next() {
        match w {
            "no-check" => no_check = true,
            "track" | "weight" => {
                let value = words.next().ok_or_else(|| format!("{w} without a value"))?;
                track |= w == "track";
                out.extend([w.to_owned(), (*value).to_owned()]);
            }
            other => return Err(format!("it sets {other}")),
        }
    }
    if !track {
        return Err("it runs its own health check (only servers that track another can be added at runtime)".into());
    }
    if checks_by_default && !no_check {
        return Err("it would run its own health check besides tracking".into());
    }
    Ok(out)
}

/// The servers of one backend present in both configs: what changed, as steps.
fn server_steps(
    name: &str,
    old: &ParsedBackend<'_>,
    new: &ParsedBackend<'_>,
    defaults: &[Vec<&str>],
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
            let params = dynamic_params(params, &backend_defaults, defaults).map_err(|why| {
                format!("server {name}/{server} cannot be added at runtime: {why}")
            })?;
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
/// its map entries naming the spare): servers added to the spare, then the maps replaced.
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
    let through_spares = Bundle { config: renamed, maps, certs: next.certs.clone() };
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
            .map(|(_, new)| Step::ReplaceMap {
                kind: new.name.kind().to_owned(),
                content: new.content.clone(),
            })
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
                &new.default_servers,
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

/// The map kind of the crt-list (renderer/src/tls.rs).
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
            matches!(s, Step::ReplaceMap { .. } | Step::AddCert { .. } | Step::RemoveCert { .. })
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
/// crt-list of 1,000 certificates half a second.
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
         global\n    {default_path}\n\
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
            Step::AddServer { .. } | Step::RemoveServer { .. } => 2,
            _ => 1,
        })
        .sum()
}

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
    /// Lines sent after `line <<`, ended by an empty line.
    pub payload: Option<String>,
    pub expect: Expect,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Command")
            .field("line", &self.line)
            .field("payload_bytes", &self.payload.as_ref().map(String::len))
            .field("expect", &self.expect)
            .finish()
    }
}

impl Command {
    fn new(line: String, expect: Expect) -> Self {
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

/// Where each changed map lives in the running process, by kind: the `#<id>` that `show map`
/// lists for it, and the version `prepare map` allocated.
pub type PreparedMaps = BTreeMap<String, (String, u32)>;

/// The kinds of map a plan replaces.
pub fn map_kinds(steps: &[Step]) -> Vec<&str> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::ReplaceMap { kind, .. } => Some(kind.as_str()),
            _ => None,
        })
        .collect()
}

/// From `show map`: the `#<id>` of the map file of each kind in `kinds`. The running process
/// knows a map by the name it loaded it under, which a runtime change before this one may have
/// made older than the live file's: it is found by kind. None if a kind is not there exactly
/// once.
pub fn map_ids(show_map: &str, kinds: &[&str]) -> Option<BTreeMap<String, String>> {
    let mut ids = BTreeMap::new();
    for kind in kinds {
        let mut found = show_map.lines().filter_map(|line| {
            // `<id> (<file>) pattern loaded from file …`
            let (id, rest) = line.split_once(' ')?;
            let file = rest.strip_prefix('(')?.split_once(')')?.0;
            let name = file.rsplit('/').next()?;
            let parsed = hafleet_proto::MapName::new(name.to_owned()).ok()?;
            (parsed.kind() == *kind && id.parse::<i64>().is_ok()).then(|| format!("#{id}"))
        });
        let id = found.next()?;
        if found.next().is_some() {
            return None;
        }
        ids.insert((*kind).to_owned(), id);
    }
    Some(ids)
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
/// each kind's map id and the version `prepare map` created.
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
            Ok((kind, (id, version)))
        })
        .collect()
}

/// What the certificate steps need from outside the plan: the running crt-list's name
/// ([`running_crt_list`]) and the content of each file [`added_certs`] names (chain and key).
#[derive(Default)]
pub struct CertInputs {
    pub crt_list: String,
    pub files: BTreeMap<String, zeroize::Zeroizing<String>>,
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
    maps: &PreparedMaps,
    certs: &CertInputs,
) -> Result<Vec<Command>, String> {
    let mut out = Vec::new();
    for step in steps {
        match step {
            Step::AddCert { path, filters } => {
                let file = certs.files.get(path).ok_or_else(|| format!("no file for {path}"))?;
                let list = &certs.crt_list;
                out.push(Command::new(
                    format!("new ssl cert {path}"),
                    Expect::OneOf(&["New empty certificate store"]),
                ));
                out.push(Command {
                    line: format!("set ssl cert {path}"),
                    // A payload's lines each end in a newline; `session` adds the empty line
                    // that ends it.
                    payload: Some(format!("{}\n", file.trim_end())),
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
                    payload: Some(line),
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
                out.push(Command::new(format!("enable server {backend}/{server}"), Expect::Empty));
            }
            Step::RemoveServer { backend, server } => {
                out.push(Command::new(
                    format!("set server {backend}/{server} state maint"),
                    Expect::Empty,
                ));
                out.push(Command::new(format!("del server {backend}/{server}"), Expect::Anything));
            }
            Step::ReplaceMap { kind, content } => {
                let (id, version) =
                    maps.get(kind).ok_or_else(|| format!("map {kind} was not prepared"))?;
                for chunk in payload_chunks(content) {
                    out.push(Command {
                        line: format!("add map @{version} {id}"),
                        payload: Some(chunk),
                        expect: Expect::Empty,
                    });
                }
                out.push(Command::new(format!("commit map @{version} {id}"), Expect::Empty));
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
/// each answer is followed by a prompt and can be told apart, and `quit` at the end.
pub fn session(pid: u32, commands: &[Command]) -> String {
    let mut s = String::from("prompt\n");
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

#[cfg(test)]
mod tests {
    use super::*;
    use hafleet_proto::{MapFile, MapName};

    /// A bundle shaped like the built-in template's: `nodes` are (name, ip) checked in
    /// hafleet_nodes; each backend lists (server, ip:port) tracking the node of that name.
    fn bundle(nodes: &[(&str, &str)], backends: &[(&str, &[(&str, &str)])], exact: &str) -> Bundle {
        let maps = vec![
            MapFile { name: MapName::for_content("exact", exact).unwrap(), content: exact.into() },
            MapFile {
                name: MapName::for_content("prefix", "/ be_a\n").unwrap(),
                content: "/ be_a\n".into(),
            },
        ];
        let mut c = format!(
            "# Generated for {} routes\nglobal\n    default-path config\n\ndefaults\n    mode http\n    \
             default-server check inter 2s fall 2 rise 2\n\nfrontend f\n    # {} rules\n    \
             http-request set-var(txn.backend) path,map_str({})\n    \
             http-request set-var(txn.backend) path,map_beg({})\n    \
             use_backend %[var(txn.backend)]\n\nbackend hafleet_nodes\n    option httpchk GET /healthz\n",
            exact.lines().count(),
            exact.lines().count(),
            maps[0].name.relative_path(),
            maps[1].name.relative_path()
        );
        for (n, ip) in nodes {
            c.push_str(&format!("    server {n} {ip}:10256\n"));
        }
        for (b, servers) in backends {
            c.push_str(&format!("\nbackend {b}\n    # a comment\n"));
            for (s, addr) in servers.iter() {
                c.push_str(&format!("    server {s} {addr} no-check track hafleet_nodes/{s}\n"));
            }
        }
        Bundle { config: c, maps, certs: vec![] }
    }

    const NODES: &[(&str, &str)] = &[("n1", "10.0.0.1"), ("n2", "10.0.0.2")];

    #[test]
    fn a_change_of_map_contents_and_comments_only_is_found_without_parsing() {
        let servers: &[(&str, &str)] = &[("n1", "10.0.0.1:30080")];
        let a = bundle(NODES, &[("be_a", servers)], "x be_a\n");
        // Another exact map (and with it the `# N rules` comments): map steps only.
        let b = bundle(NODES, &[("be_a", servers)], "x be_a\ny be_a\n");
        assert!(same_but_map_names(&a, &b));
        let Plan::Runtime(steps) = plan(&a, &b) else { panic!("a map change needs no reload") };
        assert!(matches!(steps.as_slice(), [Step::ReplaceMap { kind, .. }] if kind == "exact"));
        // A server changed as well: not the fast case, and the parsed plan sees it.
        let c = bundle(NODES, &[("be_a", &[("n2", "10.0.0.2:30080")])], "x be_a\ny be_a\n");
        assert!(!same_but_map_names(&a, &c));
        let Plan::Runtime(steps) = plan(&a, &c) else { panic!("a subset move needs no reload") };
        assert!(steps.iter().any(|s| matches!(s, Step::ReplaceMap { .. })));
        assert!(steps.iter().any(|s| matches!(s, Step::AddServer { .. })));
        // A line break next to a map name is a change, whatever the rest.
        let mut e = b.clone();
        let joined = format!("{})\n", e.maps[0].name.relative_path());
        e.config = e.config.replacen(&joined, &format!("{}) ", e.maps[0].name.relative_path()), 1);
        assert_ne!(e.config, b.config);
        assert!(!same_but_map_names(&b, &e));
        // A map name that is not one of the bundle's: never the fast case.
        let mut d = b.clone();
        d.config = d.config.replace(&d.maps[0].name.relative_path(), "hafleet-maps/exact-0.map");
        assert!(!same_but_map_names(&a, &d));
    }

    #[test]
    fn the_same_config_needs_nothing_and_a_comment_is_not_a_change() {
        let a = bundle(NODES, &[("be_a", &[("n1", "10.0.0.1:30080")])], "x be_a\n");
        assert_eq!(plan(&a, &a.clone()), Plan::Nothing);
        let mut b = a.clone();
        b.config = b.config.replace("# a comment", "# another comment");
        assert_eq!(plan(&a, &b), Plan::Nothing);
    }

    #[test]
    fn a_node_drained_is_servers_put_in_maintenance_and_deleted_without_a_reload() {
        let both: &[(&str, &str)] = &[("n1", "10.0.0.1:30080"), ("n2", "10.0.0.2:30080")];
        let one: &[(&str, &str)] = &[("n1", "10.0.0.1:30080")];
        let a = bundle(NODES, &[("be_a", both), ("be_b", both)], "x be_a\n");
        let b = bundle(&NODES[..1], &[("be_a", one), ("be_b", one)], "x be_a\n");
        let remove = |backend: &str, server: &str| Step::RemoveServer {
            backend: backend.into(),
            server: server.into(),
        };
        assert_eq!(
            plan(&a, &b),
            Plan::Runtime(vec![
                remove("be_a", "n2"),
                remove("be_b", "n2"),
                remove("hafleet_nodes", "n2")
            ])
        );
    }

    #[test]
    fn a_node_joining_needs_a_reload_because_its_own_check_cannot_be_tracked_at_runtime() {
        let one: &[(&str, &str)] = &[("n1", "10.0.0.1:30080")];
        let both: &[(&str, &str)] = &[("n1", "10.0.0.1:30080"), ("n2", "10.0.0.2:30080")];
        let a = bundle(&NODES[..1], &[("be_a", one)], "x be_a\n");
        let b = bundle(NODES, &[("be_a", both)], "x be_a\n");
        let Plan::Reload(why) = plan(&a, &b) else { panic!("a new checked server is a reload") };
        assert!(why.contains("hafleet_nodes/n2"), "{why}");
    }

    #[test]
    fn a_subset_moving_to_a_known_node_adds_a_tracking_server_before_removing_the_old() {
        let a = bundle(NODES, &[("be_a", &[("n1", "10.0.0.1:30080")])], "x be_a\n");
        let b = bundle(NODES, &[("be_a", &[("n2", "10.0.0.2:30080")])], "x be_a\n");
        assert_eq!(
            plan(&a, &b),
            Plan::Runtime(vec![
                Step::AddServer {
                    backend: "be_a".into(),
                    server: "n2".into(),
                    addr: "10.0.0.2:30080".into(),
                    // no-check is refused by `add server`, and means nothing there.
                    params: vec!["track".into(), "hafleet_nodes/n2".into()],
                },
                Step::RemoveServer { backend: "be_a".into(), server: "n1".into() },
            ])
        );
    }

    #[test]
    fn a_node_port_or_address_change_is_set_server_addr() {
        let a = bundle(NODES, &[("be_a", &[("n1", "10.0.0.1:30080")])], "x be_a\n");
        let b = bundle(
            &[("n1", "10.0.0.9"), NODES[1]],
            &[("be_a", &[("n1", "[fd00::1]:30081")])],
            "x be_a\n",
        );
        assert_eq!(
            plan(&a, &b),
            Plan::Runtime(vec![
                Step::SetAddr {
                    backend: "be_a".into(),
                    server: "n1".into(),
                    ip: "fd00::1".parse().unwrap(),
                    port: 30081
                },
                Step::SetAddr {
                    backend: "hafleet_nodes".into(),
                    server: "n1".into(),
                    ip: "10.0.0.9".parse().unwrap(),
                    port: 10256
                },
            ])
        );
    }

    #[test]
    fn map_entries_are_replaced_whole_and_the_renamed_map_file_is_not_a_change() {
        let servers: &[(&str, &str)] = &[("n1", "10.0.0.1:30080")];
        let a = bundle(NODES, &[("be_a", servers)], "x be_a\n");
        let b = bundle(NODES, &[("be_a", servers)], "x be_a\ny be_a\n");
        assert_eq!(
            plan(&a, &b),
            Plan::Runtime(vec![Step::ReplaceMap {
                kind: "exact".into(),
                content: "x be_a\ny be_a\n".into()
            }])
        );
    }

    /// Lays `check` out next to `bundle`'s maps as on a host and runs the real `haproxy -c`.
    fn haproxy_accepts(check: &str, maps: &[MapFile]) -> Result<(), String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("hafleet-maps")).unwrap();
        for m in maps {
            std::fs::write(dir.path().join(m.name.relative_path()), &m.content).unwrap();
        }
        let file = dir.path().join("haproxy.cfg.hafleet-mapcheck");
        std::fs::write(&file, check).unwrap();
        let out = std::process::Command::new("haproxy")
            .arg("-c")
            .arg("-f")
            .arg(&file)
            .output()
            .expect("haproxy is installed (bash tests/setup.sh)");
        match out.status.success() {
            true => Ok(()),
            false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        }
    }

    #[test]
    fn a_map_only_version_is_checked_by_loading_its_maps_as_its_config_uses_them() {
        let servers: &[(&str, &str)] = &[("n1", "10.0.0.1:30080")];
        let a = bundle(NODES, &[("be_a", servers)], "x be_a\n");
        let b = bundle(NODES, &[("be_a", servers)], "x be_a\ny be_a\n");
        assert!(files_only(&plan(&a, &b)));
        assert!(files_only(&plan(&a, &a)), "comments only");
        let moved = bundle(NODES, &[("be_a", &[("n2", "10.0.0.2:30080")])], "x be_a\n");
        assert!(!files_only(&plan(&a, &moved)), "servers change: the whole config is checked");
        assert!(!files_only(&Plan::Reload("x".into())));

        let check = map_check_config(&b, &[]).expect("the built-in shape has a quick check");
        for m in &b.maps {
            assert!(check.contains(&m.name.relative_path()), "{check}");
        }
        assert!(check.contains("path,map_str(hafleet-maps/exact-"), "{check}");
        assert!(check.contains("path,map_beg(hafleet-maps/prefix-"), "{check}");
        assert!(check.contains("default-path config"), "{check}");
        haproxy_accepts(&check, &b.maps).unwrap();
        // A map that is not on the host fails the check.
        let err = haproxy_accepts(&check, &b.maps[1..]).unwrap_err();
        assert!(err.contains("exact-"), "{err}");
        // Each converter the config applies is applied: a map read as regexes by a custom
        // template is refused for an entry that is not one.
        let mut regex = b.clone();
        regex.config = regex.config.replace("map_beg(", "map_reg(");
        regex.maps[1].content = "/( be_a\n".into();
        let check = map_check_config(&regex, &[]).unwrap();
        assert!(check.contains("map_reg("), "{check}");
        let err = haproxy_accepts(&check, &regex.maps).unwrap_err();
        assert!(err.contains("regex"), "{err}");
    }

    #[test]
    fn the_whole_config_is_checked_when_its_maps_cannot_be_checked_alone() {
        let b = bundle(NODES, &[("be_a", &[("n1", "10.0.0.1:30080")])], "x be_a\n");
        let mut no_default_path = b.clone();
        no_default_path.config = no_default_path.config.replace("default-path config", "");
        assert_eq!(map_check_config(&no_default_path, &[]), None);
        let mut named_otherwise = b.clone();
        named_otherwise.config.push_str(&format!(
            "\nfrontend g\n    acl a path -f {}\n",
            b.maps[0].name.relative_path()
        ));
        assert_eq!(map_check_config(&named_otherwise, &[]), None);
        let mut unused = b.clone();
        unused.config = unused
            .config
            .replace(&format!("path,map_beg({})", b.maps[1].name.relative_path()), "path");
        assert_eq!(map_check_config(&unused, &[]), None, "a map the config does not name");
    }

    #[test]
    fn backend_names_are_the_headers_parse_reads() {
        let config = "global\n    # backend not_a_header\n#backend commented\n\
                      backend be_a\n    server n1 10.0.0.1:1\n    use_backend be_x\n\
                      backend\tbe_b # trailing\nfrontend f\n    default_backend be_a\n\
                      backends_typo be_c\n";
        let parsed: BTreeSet<&str> = parse(config).unwrap().backends.keys().copied().collect();
        assert_eq!(backend_names(config), parsed);
        assert_eq!(parsed, BTreeSet::from(["be_a", "be_b"]));
        // A backend gone with another section changed: a reload either way, said as the first.
        let servers: &[(&str, &str)] = &[("n1", "10.0.0.1:30080")];
        let two = bundle(NODES, &[("be_a", servers), ("be_b", servers)], "x be_a\n");
        let mut one = bundle(NODES, &[("be_a", servers)], "x be_a\n");
        one.config = one.config.replace("mode http", "mode http\n    timeout client 5s");
        assert!(
            matches!(plan(&two, &one), Plan::Reload(w) if w.contains("0 backend(s) added and 1 removed"))
        );
    }

    #[test]
    fn new_backends_are_served_through_free_spares_ahead_of_their_reload() {
        let servers: &[(&str, &str)] = &[("n1", "10.0.0.1:30080"), ("n2", "10.0.0.2:30081")];
        let spare = |n: &str| (format!("{SPARE_PREFIX}{n}"), Vec::<(&str, &str)>::new());
        let (s0, s1) = (spare("0"), spare("1"));
        let with = |extra: &[(&str, &[(&str, &str)])], exact: &str| {
            let mut all: Vec<(&str, &[(&str, &str)])> = vec![("be_a", servers)];
            all.extend_from_slice(extra);
            all.push((&s0.0, &s0.1));
            all.push((&s1.0, &s1.1));
            bundle(NODES, &all, exact)
        };
        let a = with(&[], "x be_a\n");
        let b = with(&[("be_b", servers)], "x be_a\ny be_b\n");
        let Plan::Bridged { why, bridge } = plan(&a, &b) else { panic!("{:?}", plan(&a, &b)) };
        assert!(why.contains("1 backend(s) added"), "{why}");
        assert_eq!(bridge.spares, [("be_b".to_owned(), s0.0.clone())]);
        let add = |server: &str, addr: &str| Step::AddServer {
            backend: s0.0.clone(),
            server: server.into(),
            addr: addr.into(),
            params: vec!["track".into(), format!("hafleet_nodes/{server}")],
        };
        let replaced =
            Step::ReplaceMap { kind: "exact".into(), content: format!("x be_a\ny {}\n", s0.0) };
        assert_eq!(
            bridge.steps,
            [add("n1", "10.0.0.1:30080"), add("n2", "10.0.0.2:30081"), replaced]
        );
        // Two new backends take the two spares; a third finds none and only reloads.
        let c = with(&[("be_b", servers), ("be_c", servers)], "x be_a\ny be_b\nz be_c\n");
        let Plan::Bridged { bridge, .. } = plan(&a, &c) else { panic!("two spares, two backends") };
        let taken: Vec<&str> = bridge.spares.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(taken, [s0.0.as_str(), s1.0.as_str()]);
        let three = [("be_b", servers), ("be_c", servers), ("be_d", servers)];
        assert!(matches!(plan(&a, &with(&three, "x be_a\n")), Plan::Reload(_)));
        // A spare that has servers (a template's own) is not free.
        let busy = |bundle: &Bundle| {
            let mut busy = bundle.clone();
            busy.config = busy.config.replace(
                &format!("backend {}\n    # a comment\n", s0.0),
                &format!(
                    "backend {}\n    server n1 10.0.0.1:1 no-check track hafleet_nodes/n1\n",
                    s0.0
                ),
            );
            busy
        };
        let (busy, busy_next) = (busy(&a), busy(&b));
        let Plan::Bridged { bridge, .. } = plan(&busy, &busy_next) else {
            panic!("spare 1 is free")
        };
        assert_eq!(bridge.spares, [("be_b".to_owned(), s1.0.clone())]);
        // The running process is asked whether the spares are empty: one that lists a server,
        // or an answer that is no list, keeps the bridge from going on.
        let head = "1\n# be_id be_name srv_id srv_name srv_addr\n";
        let Plan::Bridged { bridge, .. } = plan(&a, &c) else { unreachable!() };
        let shows: Vec<String> = spare_checks(&bridge).iter().map(|c| c.line.clone()).collect();
        assert_eq!(
            shows,
            ["show servers state hafleet_spare_0", "show servers state hafleet_spare_1"]
        );
        assert_eq!(busy_spare(&bridge, &[head, head]), None);
        let held =
            format!("{head}7 hafleet_spare_1 1 n1 10.0.0.1 2 0 1 1 3 6 3 4 6 0 0 0 - 30080\n");
        assert_eq!(busy_spare(&bridge, &[head, held.as_str()]), Some("hafleet_spare_1"));
        assert_eq!(busy_spare(&bridge, &[head, "Can't find backend.\n"]), Some("hafleet_spare_1"));
        assert_eq!(busy_spare(&bridge, &[head]), Some("hafleet_spare_1"));
        let (adds, maps) = split_bridge(&bridge.steps);
        assert!(adds.iter().all(|s| matches!(s, Step::AddServer { .. })) && adds.len() == 4);
        assert!(matches!(maps.as_slice(), [Step::ReplaceMap { .. }]));
        // A new backend whose header says more than its name (`from`, a template's own).
        let mut from = b.clone();
        from.config = from.config.replace("backend be_b\n", "backend be_b from other\n");
        assert!(matches!(plan(&a, &from), Plan::Reload(_)));
        // No spares, a backend removed, or a new backend whose settings differ from a spare's:
        // a reload alone.
        let plain = bundle(NODES, &[("be_a", servers)], "x be_a\n");
        let plain_b = bundle(NODES, &[("be_a", servers), ("be_b", servers)], "x be_a\n");
        assert!(matches!(plan(&plain, &plain_b), Plan::Reload(_)));
        let swapped = with(&[("be_b", servers)], "y be_b\n")
            .config
            .replace("backend be_a\n", "backend be_z\n");
        let swapped = Bundle { config: swapped, ..b.clone() };
        assert!(matches!(plan(&a, &swapped), Plan::Reload(_)));
        let mut balanced = b.clone();
        balanced.config =
            balanced.config.replace("backend be_b\n", "backend be_b\n    balance leastconn\n");
        assert!(matches!(plan(&a, &balanced), Plan::Reload(_)));
        // Servers that check their own health cannot be added at runtime.
        let mut checked = b.clone();
        checked.config = checked.config.replace(
            "server n1 10.0.0.1:30080 no-check track hafleet_nodes/n1\n    server n2 10.0.0.2:30081 no-check track hafleet_nodes/n2\n\nbackend hafleet_spare_0",
            "server n1 10.0.0.1:30080\n\nbackend hafleet_spare_0",
        );
        assert_ne!(checked.config, b.config);
        assert!(matches!(plan(&a, &checked), Plan::Reload(_)));
    }

    #[test]
    fn new_backends_other_lines_and_unknown_server_settings_need_a_reload() {
        let servers: &[(&str, &str)] = &[("n1", "10.0.0.1:30080")];
        let a = bundle(NODES, &[("be_a", servers)], "x be_a\n");
        let added = bundle(NODES, &[("be_a", servers), ("be_b", servers)], "x be_a\n");
        assert!(matches!(plan(&a, &added), Plan::Reload(w) if w.contains("1 backend(s) added")));
        let mut timeout = a.clone();
        timeout.config = timeout.config.replace("mode http", "mode http\n    timeout client 5s");
        assert!(
            matches!(plan(&a, &timeout), Plan::Reload(w) if w.contains("other than a backend"))
        );
        let mut balance = a.clone();
        balance.config.push_str("    balance source\n");
        assert!(matches!(plan(&a, &balance), Plan::Reload(w) if w.contains("beyond its servers")));
        let mut maxconn = a.clone();
        maxconn.config = maxconn.config.replace("no-check track", "maxconn 5 no-check track");
        assert!(matches!(plan(&a, &maxconn), Plan::Reload(w) if w.contains("beyond its address")));
        // A server added at runtime inherits no default-server: one that sets more than check
        // timings makes an added server different from the file's.
        let moved = bundle(NODES, &[("be_a", &[("n2", "10.0.0.2:30080")])], "x be_a\n");
        let mut a_maxconn = a.clone();
        let mut moved_maxconn = moved.clone();
        for b in [&mut a_maxconn, &mut moved_maxconn] {
            b.config = b.config.replace("rise 2", "rise 2 maxconn 10");
        }
        assert!(
            matches!(plan(&a_maxconn, &moved_maxconn), Plan::Reload(w) if w.contains("maxconn"))
        );
        assert!(matches!(plan(&a, &moved), Plan::Runtime(_)));
    }

    #[test]
    fn weights_are_set_and_a_weight_removed_goes_back_to_one() {
        let a = bundle(NODES, &[("be_a", &[("n1", "10.0.0.1:30080")])], "x be_a\n");
        let mut b = a.clone();
        b.config = b.config.replace("no-check track", "weight 7 no-check track");
        let set = |weight| {
            Plan::Runtime(vec![Step::SetWeight {
                backend: "be_a".into(),
                server: "n1".into(),
                weight,
            }])
        };
        assert_eq!(plan(&a, &b), set(7));
        assert_eq!(plan(&b, &a), set(1));
    }

    #[test]
    fn commands_chunk_map_payloads_and_name_the_prepared_version() {
        let content: String = (0..2000).map(|i| format!("host{i}.example.com/ be_a\n")).collect();
        let steps = vec![
            Step::AddServer {
                backend: "be_a".into(),
                server: "n2".into(),
                addr: "10.0.0.2:30080".into(),
                params: vec!["track".into(), "hafleet_nodes/n2".into()],
            },
            Step::ReplaceMap { kind: "prefix".into(), content: content.clone() },
        ];
        let maps = PreparedMaps::from([("prefix".to_owned(), ("#1".to_owned(), 4))]);
        let cmds = commands(&steps, &maps, &CertInputs::default()).unwrap();
        assert_eq!(cmds[0].line, "add server be_a/n2 10.0.0.2:30080 track hafleet_nodes/n2");
        assert_eq!(cmds[1].line, "enable server be_a/n2");
        let adds: Vec<&Command> = cmds.iter().filter(|c| c.payload.is_some()).collect();
        assert!(adds.len() > 1, "{} bytes in one payload", content.len());
        assert!(adds.iter().all(|c| c.line == "add map @4 #1"));
        assert!(adds.iter().all(|c| c.payload.as_ref().unwrap().len() <= MAP_PAYLOAD_BYTES));
        let sent: String = adds.iter().map(|c| c.payload.clone().unwrap()).collect();
        assert_eq!(sent, content, "every entry once, in order");
        assert_eq!(cmds.last().unwrap().line, "commit map @4 #1");
        assert!(
            commands(&steps, &PreparedMaps::new(), &CertInputs::default()).is_err(),
            "an unprepared map"
        );
    }

    // Captured from HAProxy 2.6.12's master CLI: `prompt`, `set server … state maint` (empty
    // answer), `add map #1 <<` with one entry, `show map #1`, `set server … state ready`, `quit`.
    const SESSION: &str = "master> \nmaster> + + \nmaster> 0x562c94e2bc40 x y\n0x562c94e2bce0 z w\n0x7f39f804ced0 q r\n\nmaster> \nmaster> master> ";

    #[test]
    fn a_session_s_answers_are_told_apart_by_the_prompt() {
        let got = answers(SESSION, 4);
        assert_eq!(got.len(), 4);
        assert_eq!(got[0], "");
        assert_eq!(got[1], "+ + ");
        assert!(got[2].starts_with("0x562c94e2bc40 x y\n"));
        assert_eq!(got[3], "");
        let empty = Command::new("x".into(), Expect::Empty);
        assert!(empty.accepted(got[1]), "payload prompts are not an answer");
        assert!(!empty.accepted("No such server.\n"));
        // A connection that closed early leaves commands unanswered.
        let mut cmds = vec![empty.clone(); 6];
        cmds[2].expect = Expect::Anything;
        assert_eq!(first_refused(&cmds[..4], &got), None);
        assert_eq!(first_refused(&cmds, &answers(SESSION, 6)), Some(("x", "no answer".into())));
        cmds[2].expect = Expect::Empty;
        assert!(first_refused(&cmds, &got).unwrap().1.starts_with("0x562c94e2bc40 x y"));
        assert!(answers("", 2).is_empty());
    }

    #[test]
    fn sessions_prefix_the_worker_and_end_payloads_with_a_blank_line() {
        let cmds = vec![
            Command::new("set server a/b state maint".into(), Expect::Empty),
            Command {
                line: "add map @2 #0".into(),
                payload: Some("k v\n".into()),
                expect: Expect::Empty,
            },
        ];
        assert_eq!(
            session(42, &cmds),
            "prompt\n@!42 set server a/b state maint\n@!42 add map @2 #0 <<\nk v\n\nquit\n"
        );
    }

    #[test]
    fn maps_are_found_by_kind_under_the_name_they_were_loaded_with() {
        let show = "# id (file) description\n0 (hafleet-maps/exact-4842e04a7cca046ba124389aaebf24e07c6d1d810cf0823f5987f9be078eb896.map) pattern loaded from file 'x' used by map at file '/h/haproxy.cfg' line 36. curr_ver=0 next_ver=0 entry_cnt=1\n1 (hafleet-maps/prefix-852c4d26aa55d2ce637764c67c70f3d609789212de358fd5ab22aeff36f26f5c.map) pattern loaded from file 'y' used by map. curr_ver=0 next_ver=0 entry_cnt=3\n\n";
        let ids = map_ids(show, &["prefix", "exact"]).unwrap();
        assert_eq!(ids["exact"], "#0");
        assert_eq!(ids["prefix"], "#1");
        assert!(map_ids(show, &["host"]).is_none());
        assert_eq!(prepared_version("New version created: 3\n"), Some(3));
        assert_eq!(prepared_version("Unknown map identifier."), None);
        let ids: BTreeMap<String, String> = [("exact".into(), "#1".into())].into();
        let prepared = prepared_maps(ids.clone(), &["New version created: 3\n"]).unwrap();
        assert_eq!(prepared["exact"], ("#1".to_owned(), 3));
        assert!(prepared_maps(ids.clone(), &["Unknown map identifier."]).is_err());
        assert!(prepared_maps(ids, &[] as &[&str]).is_err(), "an answer missing");
    }

    /// A bundle with an HTTPS bind whose crt-list is `crt_list`.
    fn tls_bundle(crt_list: &str) -> Bundle {
        let name = MapName::for_content("crtlist", crt_list).unwrap();
        let config = format!(
            "global\n    default-path config\n\nfrontend f\n    bind :443 ssl crt-list {} strict-sni\n",
            name.relative_path()
        );
        Bundle { config, maps: vec![MapFile { name, content: crt_list.into() }], certs: vec![] }
    }

    #[test]
    fn a_rotated_certificate_is_loaded_listed_and_the_old_one_unlisted_without_a_reload() {
        let old =
            tls_bundle("hafleet-certs/aa.pem a.example.com\nhafleet-certs/bb.pem b.example.com\n");
        let new =
            tls_bundle("hafleet-certs/bb.pem b.example.com\nhafleet-certs/cc.pem a.example.com\n");
        let Plan::Runtime(steps) = plan(&old, &new) else { panic!("{:?}", plan(&old, &new)) };
        assert_eq!(
            steps,
            vec![
                Step::AddCert {
                    path: "hafleet-certs/cc.pem".into(),
                    filters: vec!["a.example.com".into()]
                },
                Step::RemoveCert { path: "hafleet-certs/aa.pem".into() },
            ]
        );
        assert!(files_only(&Plan::Runtime(steps.clone())), "checked by loading the new file");
        let mut inputs =
            CertInputs { crt_list: "hafleet-maps/crtlist-x.map".into(), ..Default::default() };
        assert!(commands(&steps, &PreparedMaps::new(), &inputs).is_err(), "no file, no commands");
        let pem = "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n-----BEGIN EC PRIVATE KEY-----\nSECRET\n-----END EC PRIVATE KEY-----\n";
        inputs.files.insert("hafleet-certs/cc.pem".into(), zeroize::Zeroizing::new(pem.into()));
        let cmds = commands(&steps, &PreparedMaps::new(), &inputs).unwrap();
        let lines: Vec<&str> = cmds.iter().map(|c| c.line.as_str()).collect();
        assert_eq!(
            lines,
            [
                "new ssl cert hafleet-certs/cc.pem",
                "set ssl cert hafleet-certs/cc.pem",
                "commit ssl cert hafleet-certs/cc.pem",
                "add ssl crt-list hafleet-maps/crtlist-x.map",
                "del ssl crt-list hafleet-maps/crtlist-x.map hafleet-certs/aa.pem",
                "del ssl cert hafleet-certs/aa.pem",
            ]
        );
        assert_eq!(cmds[3].payload.as_deref(), Some("hafleet-certs/cc.pem a.example.com\n"));
        // Each payload ends in a newline, so the session's empty line ends it.
        assert!(cmds.iter().filter_map(|c| c.payload.as_deref()).all(|p| p.ends_with('\n')));
        assert!(session(7, &cmds).contains("-----END EC PRIVATE KEY-----\n\n@!7 commit ssl cert"));
        assert!(cmds[1].payload.as_deref().unwrap().contains("SECRET"));
        assert!(!format!("{cmds:?}").contains("SECRET"), "Debug hides the key");
        assert!(!format!("{inputs:?}").contains("SECRET"));
        // The answers HAProxy 2.6 gives (seen on its master CLI).
        assert!(cmds[0].accepted("New empty certificate store 'hafleet-certs/cc.pem'!\n"));
        assert!(
            cmds[1].accepted("+ + Transaction created for certificate hafleet-certs/cc.pem!\n")
        );
        assert!(cmds[2].accepted("Committing hafleet-certs/cc.pem\nSuccess!\n"));
        assert!(!cmds[2].accepted("Committing hafleet-certs/cc.pem\nError: bad key\n"));
        assert!(cmds[3].accepted(
            "+ Inserting certificate 'hafleet-certs/cc.pem' in crt-list 'x'.\nSuccess!\n"
        ));
        assert!(cmds[4].accepted("Entry 'hafleet-certs/aa.pem' deleted in crtlist 'x'!\n"));
    }

    #[test]
    fn certificates_that_change_hosts_or_https_turned_on_need_a_reload() {
        let a = tls_bundle("hafleet-certs/aa.pem a.example.com\n");
        let more_hosts = tls_bundle("hafleet-certs/aa.pem a.example.com b.example.com\n");
        assert!(matches!(plan(&a, &more_hosts), Plan::Reload(why) if why.contains("other hosts")));
        let plain = Bundle {
            config: "global\n    default-path config\n".into(),
            maps: vec![],
            certs: vec![],
        };
        assert!(matches!(plan(&plain, &a), Plan::Reload(_)));
        assert_eq!(plan(&a, &a), Plan::Nothing);
    }

    /// The runtime API adds and deletes crt-list entries by certificate: one the renderer
    /// split over several lines (more hosts than a line holds) is reloaded instead.
    #[test]
    fn a_certificate_on_several_crt_list_lines_is_reloaded_not_changed_at_runtime() {
        let one = tls_bundle("hafleet-certs/aa.pem a.com\n");
        let split = tls_bundle("hafleet-certs/aa.pem a.com\nhafleet-certs/aa.pem b.com\n");
        let err = cert_steps(&one, &split).unwrap_err();
        assert!(err.contains("several crt-list lines"), "{err}");
        assert!(cert_steps(&split, &one).is_err());
        assert!(cert_steps(&one, &one).is_ok());
        // Left as it is, it changes nothing: another certificate still goes in at runtime.
        let more = tls_bundle(
            "hafleet-certs/aa.pem a.com\nhafleet-certs/aa.pem b.com\nhafleet-certs/bb.pem c.com\n",
        );
        let (adds, removes) = cert_steps(&split, &more).unwrap();
        assert_eq!(adds.len(), 1, "{adds:?}");
        assert!(removes.is_empty());
        assert!(cert_steps(&more, &split).is_ok(), "bb removed at runtime");
        assert!(cert_steps(&more, &tls_bundle("hafleet-certs/bb.pem c.com\n")).is_err());
    }

    #[test]
    fn the_running_crt_list_is_the_one_hafleet_named() {
        let name = MapName::for_content("crtlist", "x").unwrap().relative_path();
        assert_eq!(running_crt_list(&format!("{name}\n")), Some(name.clone()));
        assert_eq!(running_crt_list("/etc/haproxy/other.list\n"), None);
        assert_eq!(running_crt_list(&format!("{name}\n{name}\n")), None);
    }

    #[test]
    fn a_tls_fleet_keeps_the_map_only_check() {
        let mut b = tls_bundle("hafleet-certs/aa.pem a.example.com\n");
        let exact = MapFile {
            name: MapName::for_content("exact", "a.example.com/ be_a\n").unwrap(),
            content: "a.example.com/ be_a\n".into(),
        };
        b.config.push_str(&format!(
            "    http-request set-var(txn.b) path,map_str({})\n",
            exact.name.relative_path()
        ));
        b.maps.push(exact.clone());
        let check =
            map_check_config(&b, &[]).expect("the crt-list does not stop the map-only check");
        assert!(check.contains(&format!("map_str({})", exact.name.relative_path())), "{check}");
        assert!(!check.contains("crt-list") && !check.contains("crtlist-"), "{check}");
        // A rotation: only the new file is loaded, as a crt-list line loads it.
        let check = map_check_config(&b, &["hafleet-certs/cc.pem"]).unwrap();
        assert!(check.ends_with("bind 127.0.0.1:2 ssl crt hafleet-certs/cc.pem\n"), "{check}");
        assert!(!check.contains("aa.pem"), "{check}");
        assert_eq!(map_check_config(&b, &["../etc/x.pem"]), None);
    }

    /// The check of new certificate files, run by the real `haproxy -c` on real files: a
    /// hundred files pass (HAProxy reads at most 64 words a line), a key that is not the
    /// certificate's fails.
    #[test]
    fn haproxy_checks_new_certificate_files_alone() {
        let dir = tempfile::tempdir().unwrap();
        let b = tls_bundle("hafleet-certs/c0.pem a.example.com\n");
        std::fs::create_dir(dir.path().join(hafleet_proto::MAPS_DIR)).unwrap();
        std::fs::write(dir.path().join(b.maps[0].name.relative_path()), &b.maps[0].content)
            .unwrap();
        let certs = dir.path().join(hafleet_proto::tls::CERTS_DIR);
        std::fs::create_dir(&certs).unwrap();
        let openssl = |args: &[&str]| {
            let out = std::process::Command::new("openssl").args(args).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        };
        let key = |name: &str| {
            let path = certs.join(name).to_str().unwrap().to_owned();
            openssl(&["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", &path]);
            std::fs::read_to_string(&path).unwrap()
        };
        let (k1, k2) = (key("k1"), key("k2"));
        let crt = certs.join("crt").to_str().unwrap().to_owned();
        let k1_path = certs.join("k1").to_str().unwrap().to_owned();
        openssl(&["req", "-x509", "-new", "-key", &k1_path, "-out", &crt, "-subj", "/CN=a"]);
        let crt = std::fs::read_to_string(&crt).unwrap();
        let paths: Vec<String> = (0..100).map(|i| format!("hafleet-certs/c{i}.pem")).collect();
        for p in &paths {
            std::fs::write(dir.path().join(p), format!("{crt}{k1}")).unwrap();
        }
        let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
        let check = dir.path().join("check.cfg");
        std::fs::write(&check, map_check_config(&b, &refs).unwrap()).unwrap();
        let haproxy_c = || {
            std::process::Command::new("/usr/sbin/haproxy")
                .arg("-c")
                .arg("-f")
                .arg(&check)
                .output()
                .expect("haproxy (tests/setup.sh installs it)")
        };
        let out = haproxy_c();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        std::fs::write(dir.path().join(&paths[57]), format!("{crt}{k2}")).unwrap();
        assert!(!haproxy_c().status.success(), "a key of another certificate");
    }
}
