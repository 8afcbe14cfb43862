//! `hafleet history list|show|diff|why`, `rollback`, `resume` and `sweep status|confirm`. They
//! ask the running renderer (request/reply on `hafleet.history.<fleet>`), read large bundles
//! from the object store and what each host runs from the reports stream; they never open the
//! renderer's store.

use crate::output::Output;
use crate::session::Session;
use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use hafleet_proto::{
    ApplyOutcome, ApplyReport, Bundle, ConfigVersion, FleetName, HistoryReply, HistoryRequest,
    VersionSummary,
};
use hafleet_runtime::nats::Bus;
use std::collections::BTreeMap;
use std::io::IsTerminal as _;

#[derive(Debug, clap::Subcommand)]
pub enum HistoryCommand {
    /// Versions, newest first: number, time, sha256, parent, size, cause, and on how many
    /// hosts each is live.
    List {
        /// How many versions.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// A version's config and map files, byte for byte as published (-o json|yaml: the whole
    /// version, summary, causes and bundle, sealed keys blanked).
    Show {
        #[arg(value_name = "VERSION")]
        number: u64,
    },
    /// A unified diff between two versions' files (B defaults to the newest).
    Diff { a: u64, b: Option<u64> },
    /// The route changes that made a version: each Ingress, what changed, and its stream
    /// sequence.
    Why {
        #[arg(value_name = "VERSION")]
        number: u64,
    },
}

/// The mass-deletion guard's holds (see `hafleet-renderer run --sweep-guard-percent`).
#[derive(Debug, clap::Subcommand)]
pub enum SweepCommand {
    /// The sweeps held for the fleet, if any: the snapshot, since when, and each Ingress it
    /// would withdraw with its routes. Exits 0 either way.
    Status,
    /// Withdraw the Ingresses of the held sweep: the fleet stops serving them with the next
    /// version. Names the snapshot (from `sweep status`), so it never releases a hold that
    /// changed since it was looked at.
    Confirm {
        /// The held snapshot's routes stream sequence, as `sweep status` prints it.
        #[arg(long)]
        snapshot: u64,
    },
}

/// A session connected, and the fleet it acts on.
pub(crate) struct Fleet<'a> {
    pub session: &'a Session,
    pub bus: Bus,
    pub name: FleetName,
}

impl<'a> Fleet<'a> {
    /// Connects and settles on the fleet.
    pub async fn open(session: &'a Session) -> anyhow::Result<Fleet<'a>> {
        let bus = session.connect().await?;
        let name = session.fleet(&bus).await?;
        Ok(Fleet { session, bus, name })
    }

    /// Sends one request about the fleet to the renderer and returns its answer.
    async fn ask(&self, request: HistoryRequest) -> anyhow::Result<HistoryReply> {
        let subject = request.subject(&self.name);
        self.session.request(&self.bus, subject, request.encode()).await
    }

    /// A version with its bundle (fetched from the object store if the reply named it there).
    pub async fn version(&self, n: u64) -> anyhow::Result<(VersionSummary, ConfigVersion)> {
        match self.ask(HistoryRequest::Show { version: n }).await? {
            HistoryReply::Version { summary, version } => {
                Ok((summary, self.bus.fetch_bundle(*version).await?))
            }
            other => bail!("unexpected answer {other:?}"),
        }
    }

    /// The newest version's number.
    pub async fn newest(&self) -> anyhow::Result<u64> {
        match self.ask(HistoryRequest::List { limit: 1 }).await? {
            HistoryReply::List { versions, .. } => {
                versions.first().map(|v| v.number).context("the fleet has no versions")
            }
            other => bail!("unexpected answer {other:?}"),
        }
    }
}

/// Runs `hafleet sweep …`.
pub async fn sweep(session: &Session, command: SweepCommand) -> anyhow::Result<()> {
    let fleet = Fleet::open(session).await?;
    match command {
        SweepCommand::Status => {
            let HistoryReply::Held { sweep, more } = fleet.ask(HistoryRequest::HeldSweep).await?
            else {
                bail!("unexpected answer from the renderer");
            };
            let holds: Vec<_> = sweep.into_iter().chain(more).collect();
            if session.output != Output::Table {
                return session.output.print(&holds);
            }
            if holds.is_empty() {
                println!("fleet {}: no sweep held", fleet.name);
            }
            for held in holds {
                let routes: usize = held.ingresses.iter().map(|(_, n)| n).sum();
                let of = held.cluster.as_ref().map(|c| format!(" of cluster {c}"));
                println!(
                    "fleet {}: the snapshot{} at sequence {} (watcher epoch {}) would withdraw \
                     {} Ingresses ({routes} of {} routes) at once; held since {}.",
                    fleet.name,
                    of.unwrap_or_default(),
                    held.snapshot_seq,
                    held.epoch,
                    held.ingresses.len(),
                    held.fleet_routes,
                    hafleet_runtime::rfc3339_of_unix_ms(held.since_unix_ms),
                );
                for (key, n) in &held.ingresses {
                    println!("  {key}  ({n} routes)");
                }
                println!(
                    "If they are really gone: hafleet sweep confirm --fleet {} --snapshot {}",
                    fleet.name, held.snapshot_seq
                );
            }
            Ok(())
        }
        SweepCommand::Confirm { snapshot } => {
            session.announce_change("releasing a held sweep of", &fleet.name);
            let request = HistoryRequest::ConfirmSweep { snapshot_seq: snapshot };
            let HistoryReply::Confirmed { stream_seq } = fleet.ask(request).await? else {
                bail!("unexpected answer from the renderer");
            };
            let text = format!(
                "released: the renderer withdraws the held Ingresses of fleet {} when it reaches \
                 routes stream sequence {stream_seq}",
                fleet.name
            );
            let value = serde_json::json!({"fleet": fleet.name, "released": snapshot, "stream_seq": stream_seq});
            print_done(session.output, &text, &value)
        }
    }
}

/// Prints `text` for a table, else `value`.
pub(crate) fn print_done(
    output: Output,
    text: &str,
    value: &serde_json::Value,
) -> anyhow::Result<()> {
    match output {
        Output::Table => {
            println!("{text}");
            Ok(())
        }
        o => o.print(value),
    }
}

/// Each host's newest report for the fleet, from the reports stream.
pub(crate) async fn reports(bus: &Bus, fleet: &FleetName) -> anyhow::Result<Vec<ApplyReport>> {
    let Ok(stream) = bus.js.get_stream(hafleet_proto::REPORTS_STREAM).await else {
        return Ok(vec![]);
    };
    let filter = format!("hafleet.reports.{fleet}.*");
    let mut info = stream.info_with_subjects(filter).await?;
    let mut subjects = Vec::new();
    while let Some(item) = info.next().await {
        subjects.push(item?.0);
    }
    let mut out = Vec::new();
    for subject in subjects {
        if let Ok(m) = stream.get_last_raw_message_by_subject(&subject).await
            && let Ok(r) = ApplyReport::decode(&m.payload)
        {
            out.push(r);
        }
    }
    Ok(out)
}

/// Hosts whose newest report says they run `number`.
pub(crate) fn live_on(reports: &[ApplyReport], number: u64) -> usize {
    reports
        .iter()
        .filter(|r| {
            r.version == number
                && matches!(r.outcome, ApplyOutcome::Applied | ApplyOutcome::Unchanged)
        })
        .count()
}

/// Runs `hafleet history …`.
pub async fn history(session: &Session, command: HistoryCommand) -> anyhow::Result<()> {
    let fleet = Fleet::open(session).await?;
    let output = session.output;
    match command {
        HistoryCommand::List { limit } => {
            let HistoryReply::List { versions, pinned } =
                fleet.ask(HistoryRequest::List { limit }).await?
            else {
                bail!("unexpected answer");
            };
            let reports = reports(&fleet.bus, &fleet.name).await?;
            let hosts = reports.len();
            if output != Output::Table {
                let rows: Vec<serde_json::Value> = versions
                    .iter()
                    .map(|v| {
                        let live = live_on(&reports, v.number);
                        serde_json::json!({
                            "number": v.number, "time": hafleet_runtime::rfc3339_of_unix_ms(v.created_unix_ms),
                            "sha256": v.sha256, "parent": v.parent, "size": v.size,
                            "cause": v.cause, "held": v.held, "restores": v.restores,
                            "live": live > 0, "live_hosts": live, "hosts": hosts,
                            "pinned": pinned == Some(v.number),
                        })
                    })
                    .collect();
                return output.print(&rows);
            }
            let mut rows = vec![[
                "VERSION".to_owned(),
                "TIME".into(),
                "SHA256".into(),
                "PARENT".into(),
                "SIZE".into(),
                "LIVE".into(),
                "CAUSE".into(),
            ]];
            for v in &versions {
                let live = live_on(&reports, v.number);
                let mut state = if live > 0 { format!("{live}/{hosts}") } else { "-".into() };
                if v.held {
                    state = "held".into();
                }
                if pinned == Some(v.number) {
                    state.push_str(" pinned");
                }
                rows.push([
                    v.number.to_string(),
                    hafleet_runtime::rfc3339_of_unix_ms(v.created_unix_ms),
                    v.sha256.chars().take(12).collect(),
                    v.parent.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                    v.size.to_string(),
                    state,
                    v.cause.clone(),
                ]);
            }
            print!("{}", hafleet_runtime::table(&rows));
            // A pin to a version not listed: an older one, or (after a rebuilt store was held)
            // one published by an earlier store.
            if let Some(p) = pinned.filter(|p| versions.iter().all(|v| v.number != *p)) {
                println!(
                    "fleet pinned to version {p}: later versions are held until \
                     `hafleet resume --fleet {}`",
                    fleet.name
                );
            }
            Ok(())
        }
        HistoryCommand::Show { number: n } => {
            let (summary, v) = fleet.version(n).await?;
            if output != Output::Table {
                let mut out = serde_json::json!({"summary": summary, "version": v});
                hide_sealed_keys(&mut out, "/version/body/bundle/certs");
                return output.print(&out);
            }
            print_bundle(v.bundle().context("bundle missing")?);
            Ok(())
        }
        HistoryCommand::Diff { a, b } => {
            let b = match b {
                Some(b) => b,
                None => fleet.newest().await?,
            };
            let (_, va) = fleet.version(a).await?;
            let (_, vb) = fleet.version(b).await?;
            let text = diff(
                (&format!("v{a}"), va.bundle().context("bundle missing")?),
                (&format!("v{b}"), vb.bundle().context("bundle missing")?),
            );
            if output != Output::Table {
                return output.print(&serde_json::json!({"a": a, "b": b, "diff": text}));
            }
            print!("{}", colour(&text, std::io::stdout().is_terminal()));
            Ok(())
        }
        HistoryCommand::Why { number: n } => {
            let HistoryReply::Version { summary, version } =
                fleet.ask(HistoryRequest::Show { version: n }).await?
            else {
                bail!("unexpected answer");
            };
            if output != Output::Table {
                let causes: Vec<serde_json::Value> = version
                    .causes
                    .iter()
                    .map(|c| {
                        serde_json::json!({
                            "ingress": c.ingress.as_ref().map(|k| k.to_string()),
                            "what": c.what, "stream_seq": c.stream_seq,
                            "resource_version": c.resource_version,
                            "added": c.added, "removed": c.removed, "note": c.note,
                        })
                    })
                    .collect();
                let out = serde_json::json!({"version": n, "cause": summary.cause,
                    "restores": version.restores, "causes": causes, "notes": version.notes});
                return output.print(&out);
            }
            println!("version {n}: {}", summary.cause);
            for c in &version.causes {
                let who = c.ingress.as_ref().map(|k| k.to_string()).unwrap_or_else(|| "-".into());
                println!("  seq {:<8} {who} {}", c.stream_seq, c.what);
                for r in &c.added {
                    println!("      + {r}");
                }
                for r in &c.removed {
                    println!("      - {r}");
                }
                if let Some(note) = &c.note {
                    for line in note.lines() {
                        println!("      ! {line}");
                    }
                }
            }
            for note in &version.notes {
                println!("  note: {note}");
            }
            Ok(())
        }
    }
}

/// Runs `hafleet rollback N` or `resume`.
pub async fn rollback_or_resume(session: &Session, to: Option<u64>) -> anyhow::Result<()> {
    let fleet = Fleet::open(session).await?;
    let request = match to {
        Some(version) => HistoryRequest::Rollback { version },
        None => HistoryRequest::Resume,
    };
    let what = if to.is_some() { "rolling back" } else { "resuming" };
    session.announce_change(what, &fleet.name);
    let HistoryReply::Done { version, pinned } = fleet.ask(request).await? else {
        bail!("unexpected answer from the renderer");
    };
    let name = &fleet.name;
    let text = match (version, pinned) {
        (Some(v), Some(_)) => format!(
            "fleet {name} rolled back: version {v} republishes version {}; pinned until \
             `hafleet resume`",
            to.unwrap_or_default()
        ),
        (Some(v), None) => format!("fleet {name} resumed: version {v} published"),
        (None, _) => format!("fleet {name}: nothing to publish, it already runs its latest state"),
    };
    let value = serde_json::json!({"fleet": name, "published": version, "pinned": pinned});
    print_done(session.output, &text, &value)
}

/// Blanks the sealed key of each certificate in the array at `pointer` of `json`: of no use
/// to a reader, and not shown.
pub(crate) fn hide_sealed_keys(json: &mut serde_json::Value, pointer: &str) {
    if let Some(certs) = json.pointer_mut(pointer) {
        for c in certs.as_array_mut().into_iter().flatten() {
            c["sealed_key"] = serde_json::Value::String("(sealed, not shown)".into());
        }
    }
}

/// A bundle as `history show` and `replay` print it: the config, then each map file under a
/// line naming it, then its certificates (never a key).
pub(crate) fn print_bundle(bundle: &Bundle) {
    print!("{}", bundle.config);
    for m in &bundle.maps {
        println!("----- {} -----", m.name.relative_path());
        print!("{}", m.content);
    }
    print!("{}", certificates_text(bundle));
}

/// The version's certificate files, each by fingerprint, names and notAfter; never a key,
/// not even sealed.
fn certificates_text(bundle: &Bundle) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if bundle.certs.is_empty() {
        return out;
    }
    out.push_str("----- certificates (keys sealed to the fleet, not shown) -----\n");
    for c in &bundle.certs {
        let not_after = time::OffsetDateTime::from_unix_timestamp(c.not_after_unix)
            .ok()
            .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
            .unwrap_or_else(|| c.not_after_unix.to_string());
        let names: Vec<&str> = c.names.iter().map(|n| n.as_str()).collect();
        let _ = writeln!(
            out,
            "{} sha256:{} names:{} not-after:{not_after}",
            c.relative_path(),
            c.fingerprint,
            names.join(",")
        );
    }
    out
}

/// The certificate each TLS host is served with, by fingerprint: the hosts of the crt-list's
/// lines (not their `!` exclusions), and `(default)` for the HTTPS bind's own certificate.
fn tls_hosts(bundle: &Bundle) -> BTreeMap<String, String> {
    // By path, built once: a path is a sha256 of the chain and sealed key (1.5 KB), and a
    // walk a crt-list line hashed 15 MB a line at 10,000 certificates.
    let by_path: BTreeMap<String, &str> =
        bundle.certs.iter().map(|c| (c.relative_path(), c.fingerprint.as_str())).collect();
    let fingerprint = |path: &str| by_path.get(path).map(|fp| (*fp).to_owned());
    let mut hosts = BTreeMap::new();
    for m in bundle.maps.iter().filter(|m| m.name.kind() == "crtlist") {
        for line in m.content.lines() {
            let mut words = line.split_whitespace();
            let Some(fp) = words.next().and_then(fingerprint) else { continue };
            for host in words.filter(|w| !w.starts_with('!')) {
                hosts.insert(host.to_owned(), fp.clone());
            }
        }
    }
    let default =
        bundle.config.split(" ssl crt ").nth(1).and_then(|rest| rest.split_whitespace().next());
    if let Some(fp) = default.and_then(fingerprint) {
        hosts.insert("(default)".to_owned(), fp);
    }
    hosts
}

/// What changed in the certificates served: `host: <old fingerprint> → <new fingerprint>` for
/// a rotation, `+ host: <fingerprint>` and `- host: <fingerprint>` for hosts that got or lost
/// one. Empty when nothing changed.
fn tls_diff(ba: &Bundle, bb: &Bundle) -> String {
    let (old, new) = (tls_hosts(ba), tls_hosts(bb));
    let mut out = String::new();
    let hosts: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for host in hosts {
        match (old.get(host), new.get(host)) {
            (Some(o), Some(n)) if o != n => out.push_str(&format!("  {host}: {o} → {n}\n")),
            (None, Some(n)) => out.push_str(&format!("+ {host}: {n}\n")),
            (Some(o), None) => out.push_str(&format!("- {host}: {o}\n")),
            _ => {}
        }
    }
    if out.is_empty() {
        out
    } else {
        format!("certificates (sha256 of each served certificate):\n{out}")
    }
}

/// A unified diff of two bundles: the certificates that changed by host (if any), the config,
/// then each kind of map (`exact`, `prefix`, …), so a route change reads as one line in its
/// map rather than as a renamed file.
pub fn diff((a, ba): (&str, &Bundle), (b, bb): (&str, &Bundle)) -> String {
    let by_kind = |bundle: &Bundle| -> BTreeMap<String, String> {
        bundle
            .maps
            .iter()
            .map(|m| {
                let kind = m.name.as_str().split('-').next().unwrap_or_default().to_owned();
                (kind, m.content.clone())
            })
            .collect()
    };
    let mut out = tls_diff(ba, bb);
    let mut one = |name: &str, x: &str, y: &str| {
        let d = similar::TextDiff::from_lines(x, y);
        let text = d
            .unified_diff()
            .context_radius(3)
            .header(&format!("{a}/{name}"), &format!("{b}/{name}"))
            .to_string();
        out.push_str(&text);
    };
    one("haproxy.cfg", &ba.config, &bb.config);
    let (ma, mb) = (by_kind(ba), by_kind(bb));
    let kinds: std::collections::BTreeSet<&String> = ma.keys().chain(mb.keys()).collect();
    for kind in kinds {
        let empty = String::new();
        one(
            &format!("hafleet-maps/{kind}.map"),
            ma.get(kind).unwrap_or(&empty),
            mb.get(kind).unwrap_or(&empty),
        );
    }
    out
}

/// Colours a diff for a terminal: additions green, removals red, hunks cyan.
pub(crate) fn colour(text: &str, tty: bool) -> String {
    if !tty || std::env::var_os("NO_COLOR").is_some() {
        return text.to_owned();
    }
    text.lines()
        .map(|l| {
            let code = match l.as_bytes().first() {
                Some(b'+') if !l.starts_with("+++") => "32",
                Some(b'-') if !l.starts_with("---") => "31",
                Some(b'@') => "36",
                _ => return format!("{l}\n"),
            };
            format!("\x1b[{code}m{l}\x1b[0m\n")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hafleet_proto::{MapFile, MapName};

    fn bundle(config: &str, exact: &str) -> Bundle {
        let name = MapName::for_content("exact", exact).unwrap();
        Bundle {
            config: config.into(),
            maps: vec![MapFile { name, content: exact.into() }],
            certs: vec![],
            ..Default::default()
        }
    }

    #[test]
    fn a_diff_names_maps_by_kind_and_shows_the_route_that_changed() {
        let a = bundle("global\nx\n", "a.com/x be_a\n");
        let b = bundle("global\ny\n", "a.com/x be_a\nb.com/y be_b\n");
        let d = diff(("v1", &a), ("v2", &b));
        assert!(d.contains("--- v1/haproxy.cfg\n+++ v2/haproxy.cfg"), "{d}");
        assert!(d.contains("-x\n+y\n"), "{d}");
        assert!(d.contains("+++ v2/hafleet-maps/exact.map"), "{d}");
        assert!(d.contains("+b.com/y be_b\n"), "{d}");
        assert_eq!(diff(("v1", &a), ("v1", &a)), "", "no change, no diff");
    }

    #[test]
    fn tables_align_and_colour_only_on_a_terminal() {
        let row = |a: &str| {
            [a.to_owned(), "t".into(), "s".into(), "p".into(), "1".into(), "-".into(), "c".into()]
        };
        let t = hafleet_runtime::table(&[row("VERSION"), row("12")]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0].find('t'), lines[1].find('t'));
        assert_eq!(colour("+a\n", false), "+a\n");
        assert_eq!(
            colour("+a\n", true).contains("\x1b[32m"),
            std::env::var_os("NO_COLOR").is_none()
        );
    }

    #[test]
    fn a_rotation_reads_as_one_line_per_host() {
        let cert = |tag: &str| hafleet_proto::SealedCert {
            fingerprint: hafleet_proto::sha256_hex(tag.as_bytes()),
            names: vec![],
            not_after_unix: 0,
            chain_pem: hafleet_proto::tls::certificates_pem([tag.as_bytes()]).into(),
            sealed_key:
                "-----BEGIN AGE ENCRYPTED FILE-----\nYWJj\n-----END AGE ENCRYPTED FILE-----\n"
                    .into(),
            recipient: String::new(),
        };
        let (old, new, other, default) = (cert("old"), cert("new"), cert("other"), cert("default"));
        let with = |lines: String,
                    certs: Vec<hafleet_proto::SealedCert>,
                    default: Option<&hafleet_proto::SealedCert>| {
            let name = MapName::for_content("crtlist", &lines).unwrap();
            let crt = default.map(|d| format!("crt {} ", d.relative_path())).unwrap_or_default();
            Bundle {
                config: format!(
                    "frontend f\n    bind :443 ssl {crt}crt-list {}\n",
                    name.relative_path()
                ),
                maps: vec![MapFile { name, content: lines }],
                certs,
                ..Default::default()
            }
        };
        let a = with(
            format!(
                "{} a.example.com !x.example.com\n{} b.example.com\n",
                old.relative_path(),
                other.relative_path()
            ),
            vec![old.clone(), other.clone()],
            None,
        );
        let b = with(
            format!("{} a.example.com\n", new.relative_path()),
            vec![new.clone(), default.clone()],
            Some(&default),
        );
        let d = diff(("v1", &a), ("v2", &b));
        assert!(d.starts_with("certificates"), "{d}");
        assert!(
            d.contains(&format!("  a.example.com: {} → {}\n", old.fingerprint, new.fingerprint)),
            "{d}"
        );
        assert!(d.contains(&format!("- b.example.com: {}\n", other.fingerprint)), "{d}");
        assert!(d.contains(&format!("+ (default): {}\n", default.fingerprint)), "{d}");
        assert!(!d.contains("x.example.com:"), "exclusions are not hosts: {d}");
        assert!(!diff(("v1", &a), ("v1", &a)).contains("certificates"));
        // show: each certificate file by fingerprint, names and notAfter; never a key.
        let mut named = new.clone();
        named.names = vec![hafleet_proto::HttpHost::new("a.example.com").unwrap()];
        named.not_after_unix = 1_800_000_000;
        let shown = certificates_text(&Bundle { certs: vec![named], ..b.clone() });
        assert_eq!(
            shown.lines().nth(1),
            Some(
                format!(
                    "{} sha256:{} names:a.example.com not-after:2027-01-15T08:00:00Z",
                    new.relative_path(),
                    new.fingerprint
                )
                .as_str()
            ),
            "{shown}"
        );
        assert!(!shown.contains("AGE"), "{shown}");
        assert_eq!(certificates_text(&Bundle { certs: vec![], ..b }), "");
    }
}
