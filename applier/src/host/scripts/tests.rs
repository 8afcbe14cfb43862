//! The host scripts run by each shell a host's `sh` may be (dash, busybox sh, bash in its
//! POSIX mode) against a temporary folder standing in for the host: the files they leave,
//! their exit codes and their answers, as [`crate::host::answer`] reads them. They run as the
//! applier runs them, `sh -c <text> hafleet ARG...`, without sshd. A shell that is not
//! installed is skipped, with a line on stderr saying so (tests/setup.sh installs them all).

use super::*;
use crate::core::plan;
use crate::host::answer::{self, Exit};
use crate::rollout::{Outgoing, cert_stream};
use hafleet_proto::{ApplyStage, Bundle};
use std::io::Write as _;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// A shell the scripts must run in.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shell {
    name: &'static str,
    argv: &'static [&'static str],
}

const SHELLS: [Shell; 3] = [
    Shell { name: "dash", argv: &["dash"] },
    Shell { name: "busybox sh", argv: &["busybox", "sh"] },
    Shell { name: "bash", argv: &["bash", "--posix"] },
];

impl Shell {
    /// `script` (the text the applier sends) ready to run in this shell, `$0` being
    /// `hafleet`; arguments follow.
    fn command(self, script: &Script) -> Command {
        let mut cmd = Command::new(self.argv[0]);
        cmd.args(&self.argv[1..]).args(["-c", script.text(), "hafleet"]);
        cmd
    }

    fn installed(self) -> bool {
        let mut cmd = Command::new(self.argv[0]);
        cmd.args(&self.argv[1..]).args(["-c", "true"]).stdout(Stdio::null()).stderr(Stdio::null());
        cmd.status().is_ok_and(|s| s.success())
    }
}

/// Runs `case` once in each installed shell, saying which ran and which were skipped (on
/// the process's stderr itself: a test's own output is shown only when it fails).
pub(super) fn in_each_shell(case: fn(Shell)) {
    for shell in SHELLS {
        if !shell.installed() {
            let _ = writeln!(std::io::stderr(), "skipping {}: not installed", shell.name);
            continue;
        }
        case(shell);
    }
}

/// Runs `cmd` with `stdin` written to it, and returns what it did.
pub(super) fn fed(cmd: &mut Command, stdin: &[u8]) -> Output {
    let mut child =
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// Runs `script` in `shell` with `args`, `stdin` written to it.
fn sh(shell: Shell, script: &Script, args: &[&str], stdin: &[u8]) -> Output {
    fed(shell.command(script).args(args), stdin)
}

/// The text sent is the source without comments, blank lines or indentation, and every
/// script passes `sh -n` (the sources pass shellcheck in CI). It goes with every command, as
/// one argument of the remote shell: it stays well under what one argument may hold (128 KiB
/// on Linux), and its size shows here when it grows (about 16 KB for the scripts that put a
/// change live through the runtime API, with `runtime.sh`; about 12 KB for the others).
#[test]
fn every_script_is_sent_without_comments_and_parses() {
    for script in ALL {
        let text = script.text();
        assert!(text.len() < 20_000, "{} sends {} bytes", script.name, text.len());
        assert!(text.lines().all(|l| !l.starts_with('#') && !l.starts_with(' ') && !l.is_empty()));
        assert!(text.len() < script.source().len() || script.name == "noop", "{}", script.name);
        let parsed = Command::new("sh").args(["-n", "-c", text]).status().unwrap();
        assert!(parsed.success(), "{} does not parse", script.name);
    }
}

/// drift_state.sh hashes every named map and certificate file in one go, marks
/// the missing ones, and its output reads back as what it found.
#[test]
fn drift_state_hashes_maps_and_certificate_files_named_on_stdin() {
    in_each_shell(drift_state_hashes_maps_and_certificate_files_named_on_stdin_in);
}

fn drift_state_hashes_maps_and_certificate_files_named_on_stdin_in(shell: Shell) {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("haproxy.cfg");
    std::fs::write(&live, "global\n").unwrap();
    let maps = dir.path().join("hafleet-maps");
    let certs = dir.path().join("hafleet-certs");
    std::fs::create_dir_all(&maps).unwrap();
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::write(maps.join("exact-aa.map"), "a.example.com be_a\n").unwrap();
    std::fs::write(certs.join("c1.pem"), "chain and key\n").unwrap();
    let names = "exact-aa.map\nprefix-gone.map\n../hafleet-certs/c1.pem\n../hafleet-certs/c2.pem\n";
    let live = live.to_str().unwrap();
    let socket = dir.path().join("no-master.sock");
    let out = sh(shell, &DRIFT_STATE, &[live, socket.to_str().unwrap()], names.as_bytes());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let found = answer::drift_state(&String::from_utf8_lossy(&out.stdout));
    let mut files = found.maps.clone();
    files.sort();
    let sha = |text: &str| Some(hafleet_proto::sha256_hex(text.as_bytes()));
    assert_eq!(
        files,
        [
            ("../hafleet-certs/c1.pem".to_owned(), sha("chain and key\n")),
            ("../hafleet-certs/c2.pem".to_owned(), None),
            ("exact-aa.map".to_owned(), sha("a.example.com be_a\n")),
            ("prefix-gone.map".to_owned(), None),
        ]
    );
    assert_eq!(found.live, sha("global\n"));
    // No maps folder at all: every file is missing, as drift reads it; the names are read
    // all the same (10,000 of them fill more than a pipe: unread, the sender would hang).
    std::fs::remove_dir_all(&maps).unwrap();
    let many: String = (0..10_000).map(|i| format!("../hafleet-certs/{i:064x}.pem\n")).collect();
    let out = sh(shell, &DRIFT_STATE, &[live, socket.to_str().unwrap()], many.as_bytes());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let found = answer::drift_state(&String::from_utf8_lossy(&out.stdout));
    assert!(found.maps.is_empty(), "{:?}", found.maps);
    let out = sh(shell, &DRIFT_STATE, &[live, socket.to_str().unwrap()], names.as_bytes());
    let found = answer::drift_state(&String::from_utf8_lossy(&out.stdout));
    assert!(found.maps.is_empty(), "{:?}", found.maps);
    let want = [("exact-aa.map", "x"), ("../hafleet-certs/c1.pem", "y")];
    let drift = plan::drift(found.live.as_deref().unwrap(), &want, &found).unwrap();
    assert_eq!(drift.files, ["exact-aa.map", "../hafleet-certs/c1.pem"]);
    assert!(drift.found.contains("certificate file hafleet-certs/c1.pem is missing"), "{drift:?}");
}

/// Files an upload script leaves next to the config `dir` and in `maps`: uploads, and
/// the temporary names, lists and scripts of a stream (dot files).
fn left_behind(dir: &std::path::Path, maps: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .chain(std::fs::read_dir(maps).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') || n.contains("hafleet-new"))
        .collect();
    names.sort();
    names
}

/// upload_validate.sh runs `haproxy -c` with glibc's huge-page tunable, unless the host's own
/// environment sets GLIBC_TUNABLES (even empty): a stand-in for HAProxy prints what it got.
#[test]
fn the_check_runs_with_huge_pages_unless_the_host_says_otherwise() {
    in_each_shell(the_check_runs_with_huge_pages_unless_the_host_says_otherwise_in);
}

fn the_check_runs_with_huge_pages_unless_the_host_says_otherwise_in(shell: Shell) {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("haproxy.cfg");
    let fake = dir.path().join("haproxy");
    std::fs::write(&fake, "#!/bin/sh\necho \"tunables=${GLIBC_TUNABLES-unset} $1\"\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let config = "global\n";
    let sha = hafleet_proto::sha256_hex(config.as_bytes());
    let stream = Outgoing::whole(&[], Some(config)).stream();
    let check = |host_env: Option<&str>| {
        let (fake, live) = (fake.to_str().unwrap(), live.to_str().unwrap());
        let args = [fake, live, "t1", "/nonexistent.sock", &sha, "0"];
        // The SSH session's environment, as the script finds it.
        let mut cmd = shell.command(&UPLOAD_VALIDATE);
        match host_env {
            Some(v) => cmd.env("GLIBC_TUNABLES", v),
            None => cmd.env_remove("GLIBC_TUNABLES"),
        };
        let out = fed(cmd.args(args), &stream);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stderr).unwrap()
    };
    assert!(check(None).starts_with("tunables=glibc.malloc.hugetlb=1 -c\n"), "{}", check(None));
    let own = check(Some("glibc.malloc.arena_max=2"));
    assert!(own.starts_with("tunables=glibc.malloc.arena_max=2 -c\n"), "{own}");
    assert!(check(Some("")).starts_with("tunables= -c\n"), "{}", check(Some("")));
}

/// upload_files.sh and upload_validate.sh (with `true` for HAProxy) with files sent
/// as edits of the host's own: the maps and the config come out byte for byte, whatever
/// their lines hold (blanks, tabs, backslashes, sed's own escapes); an edit of a file the
/// host does not have as it was lands nothing and leaves nothing behind, and the same
/// files sent whole again land.
#[test]
fn maps_and_config_sent_as_edits_of_the_hosts_own_land_byte_for_byte_or_not_at_all() {
    in_each_shell(
        maps_and_config_sent_as_edits_of_the_hosts_own_land_byte_for_byte_or_not_at_all_in,
    );
}

fn maps_and_config_sent_as_edits_of_the_hosts_own_land_byte_for_byte_or_not_at_all_in(
    shell: Shell,
) {
    use hafleet_proto::{MapFile, MapName};
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("haproxy.cfg");
    let live_s = live.to_str().unwrap();
    let map = |kind: &str, content: &str| MapFile {
        name: MapName::for_content(kind, content).unwrap(),
        content: content.to_owned(),
    };
    let entries: String = (0..200).map(|i| format!("h{i}.example.com/ be_{i}\n")).collect();
    let old_map = map("prefix", &entries);
    let new_map = map(
        "prefix",
        &entries
            .replace("h7.example.com/ be_7\n", "h7.example.com/ be_7\n\tx\\t.example.com/ be_x\n"),
    );
    let backends: String =
        (0..100).map(|i| format!("backend be_{i}\n    server s 10.0.0.1:{i}\n\n")).collect();
    let old = format!("global\n# 3 rules\n    map_beg(hafleet-maps/{})\n{backends}", old_map.name);
    let new = format!(
        "global\n# 4 rules \\t\\\\ \\n\n\t map_beg(hafleet-maps/{}) \\\n{}",
        new_map.name,
        backends.replace(
            "backend be_50\n",
            "backend be_49a\n    server s 10.0.0.2:1\n\nbackend be_50\n"
        )
    );
    let old_bundle = Bundle::new(old.clone(), vec![old_map.clone()], vec![]);
    std::fs::write(&live, &old).unwrap();
    let maps_dir = dir.path().join("hafleet-maps");
    std::fs::create_dir_all(&maps_dir).unwrap();
    std::fs::write(maps_dir.join(old_map.name.as_str()), &old_map.content).unwrap();
    let outgoing = Outgoing::edited(&[&new_map], &new, Some(&old_bundle));
    assert!(outgoing.maps[0].1.is_some() && outgoing.config.as_ref().unwrap().1.is_some());
    let stream = outgoing.stream();
    assert!(stream.len() < 1_000, "{} bytes", stream.len());
    let sha = hafleet_proto::sha256_hex(new.as_bytes());
    let upload = dir.path().join("haproxy.cfg.hafleet-new-t1");
    let left = || left_behind(dir.path(), &maps_dir);
    // The map-only path's upload: maps, config and the config that checks the maps, edits,
    // one round trip. (`haproxy` here: `false` refuses, `true` passes.)
    let mut checked = stream.clone();
    crate::rollout::stream_record(&mut checked, "hafleet-check", "global\n");
    let map_only = |haproxy: &str, stream: &[u8]| {
        let args = [haproxy, live_s, "t1", "/nonexistent.sock", &sha, "1"];
        sh(shell, &UPLOAD_FILES, &args, stream)
    };
    let out = map_only("false", &checked);
    assert_eq!(out.status.code(), Some(1), "the check refused: haproxy's status");
    assert_eq!(left(), Vec::<String>::new(), "neither the upload nor the check stays");
    let out = map_only("true", &stream);
    assert_eq!(out.status.code(), Some(Exit::Upload.code()), "no check: not whole");
    assert_eq!(left(), Vec::<String>::new());
    let out = map_only("true", &checked);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).unwrap();
    assert_eq!(printed.lines().next(), Some(sha.as_str()));
    assert!(answer::Uploaded::parse(&printed).stat.is_some());
    assert_eq!(std::fs::read_to_string(&upload).unwrap(), new);
    let landed = std::fs::read_to_string(maps_dir.join(new_map.name.as_str())).unwrap();
    assert_eq!(landed, new_map.content);
    assert_eq!(left(), ["haproxy.cfg.hafleet-new-t1"]);
    // The reload path's: the same, checked by UPLOAD_VALIDATE.
    std::fs::remove_file(maps_dir.join(new_map.name.as_str())).unwrap();
    std::fs::remove_file(&upload).unwrap();
    let validate = |stream: &[u8]| {
        let args = ["true", live_s, "t1", "/nonexistent.sock", &sha, "1"];
        sh(shell, &UPLOAD_VALIDATE, &args, stream)
    };
    let out = validate(&stream);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&upload).unwrap(), new);
    assert_eq!(
        std::fs::read_to_string(maps_dir.join(new_map.name.as_str())).unwrap(),
        new_map.content
    );
    std::fs::remove_file(maps_dir.join(new_map.name.as_str())).unwrap();
    std::fs::remove_file(&upload).unwrap();
    // The host's live file is not the one the edit was made from: refused, nothing left.
    std::fs::write(&live, old.replace("10.0.0.1:99\n", "10.0.0.9:99\n")).unwrap();
    let out = validate(&stream);
    assert_eq!(out.status.code(), Some(Exit::Upload.code()));
    assert!(String::from_utf8_lossy(&out.stderr).contains("instead of"), "{out:?}");
    std::fs::write(&live, &old).unwrap();
    // (The map came out whole: it stays, under the name that promises its content.)
    std::fs::remove_file(maps_dir.join(new_map.name.as_str())).unwrap();
    // Its map is gone: refused, nothing left behind, no map under the new name.
    std::fs::remove_file(maps_dir.join(old_map.name.as_str())).unwrap();
    let out = validate(&stream);
    assert_eq!(out.status.code(), Some(Exit::Upload.code()));
    assert!(String::from_utf8_lossy(&out.stderr).contains("another sha256"), "{out:?}");
    assert_eq!(left(), Vec::<String>::new(), "nothing left behind");
    assert!(!maps_dir.join(new_map.name.as_str()).exists());
    // Sent whole again, as the applier does then: it lands.
    let out = validate(&outgoing.whole_again().stream());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&upload).unwrap(), new);
    assert_eq!(
        std::fs::read_to_string(maps_dir.join(new_map.name.as_str())).unwrap(),
        new_map.content
    );
}

/// upload_files.sh with certificate files ahead of the maps (a rotation's one round trip): they
/// land 0600 in the 0700 folder before the check, or, cut short, changed on the way, sent
/// after a map or not counted, nothing lands (neither they nor the maps and config) and no
/// folder of the attempt stays.
#[test]
fn certificate_files_go_with_the_maps_in_one_round_trip_or_not_at_all() {
    in_each_shell(certificate_files_go_with_the_maps_in_one_round_trip_or_not_at_all_in);
}

fn certificate_files_go_with_the_maps_in_one_round_trip_or_not_at_all_in(shell: Shell) {
    use hafleet_proto::{MapFile, MapName};
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("haproxy.cfg");
    std::fs::write(&live, "global\n").unwrap();
    let maps_dir = dir.path().join("hafleet-maps");
    let certs = dir.path().join("hafleet-certs");
    let content = "a.example.com hafleet-certs/ab.pem\n";
    let map = MapFile {
        name: MapName::for_content("crtlist", content).unwrap(),
        content: content.to_owned(),
    };
    let config = format!("global\n# crt-list hafleet-maps/{}\n", map.name);
    let sha = hafleet_proto::sha256_hex(config.as_bytes());
    let pem = "-----BEGIN CERTIFICATE-----\nQQ==\n-----END CERTIFICATE-----\n\
               -----BEGIN PRIVATE KEY-----\nQg==\n-----END PRIVATE KEY-----\n";
    let cert = cert_stream(&[("ab.pem".to_owned(), zeroize::Zeroizing::new(pem.to_owned()))])
        .unwrap()
        .to_vec();
    let mut files = Outgoing::whole(&[&map], Some(&config)).stream();
    crate::rollout::stream_record(&mut files, "hafleet-check", "global\n");
    let upload = |stream: &[u8], certs: &str| {
        let args = ["true", live.to_str().unwrap(), "t1", "/nonexistent.sock", &sha, "1", certs];
        sh(shell, &UPLOAD_FILES, &args, stream)
    };
    let nothing = |case: &str| {
        let certs_left = std::fs::read_dir(&certs).map_or(0, |d| d.count());
        assert_eq!(certs_left, 0, "{case}: no certificate file or folder of the attempt");
        assert_eq!(left_behind(dir.path(), &maps_dir), Vec::<String>::new(), "{case}");
        assert_eq!(std::fs::read_dir(&maps_dir).unwrap().count(), 0, "{case}: no map");
    };
    let whole = [cert.as_slice(), &files].concat();
    // Cut short inside the certificate; its sha256 changed on the way; not counted; after a
    // map: nothing lands.
    let out = upload(&whole[..cert.len() - 10], "1");
    assert_eq!(out.status.code(), Some(Exit::Upload.code()));
    nothing("cut short");
    let mut bad = whole.clone();
    let at = bad.iter().position(|b| *b == b'Q').unwrap();
    bad[at] = b'R';
    let out = upload(&bad, "1");
    assert!(String::from_utf8_lossy(&out.stderr).contains("another sha256"), "{out:?}");
    nothing("changed");
    let out = upload(&whole, "0");
    assert_eq!(out.status.code(), Some(Exit::Upload.code()), "certificates not asked for");
    nothing("not asked for");
    let out = upload(&whole, "2");
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 of 2 certificate"), "{out:?}");
    nothing("not counted");
    let mut late = Outgoing::whole(&[&map], None).stream();
    late.extend_from_slice(&cert);
    late.extend_from_slice(&Outgoing::whole(&[], Some(&config)).stream());
    crate::rollout::stream_record(&mut late, "hafleet-check", "global\n");
    assert_eq!(upload(&late, "1").status.code(), Some(Exit::Upload.code()), "after a map");
    nothing("after a map");
    // Whole: the certificate in place, 0600 in a 0700 folder; the maps and the config land.
    let out = upload(&whole, "1");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(certs.join("ab.pem")).unwrap(), pem);
    assert_eq!(std::fs::metadata(&certs).unwrap().permissions().mode() & 0o777, 0o700);
    let mode = std::fs::metadata(certs.join("ab.pem")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(std::fs::read_dir(&certs).unwrap().count(), 1, "no folder of the attempt stays");
    assert_eq!(std::fs::read_to_string(maps_dir.join(map.name.as_str())).unwrap(), content);
    let upload = dir.path().join("haproxy.cfg.hafleet-new-t1");
    assert_eq!(std::fs::read_to_string(upload).unwrap(), config);
}

/// upload_certs.sh: every file of the stream lands under its own name, 0600 in
/// a 0700 folder, byte for byte; a stream cut short, cut between files or with a wrong
/// sha256 lands nothing.
#[test]
fn certificate_files_land_whole_in_one_round_trip_or_not_at_all() {
    in_each_shell(certificate_files_land_whole_in_one_round_trip_or_not_at_all_in);
}

fn certificate_files_land_whole_in_one_round_trip_or_not_at_all_in(shell: Shell) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("haproxy.cfg");
    let upload = |stream: &[u8], count: usize| {
        let count = count.to_string();
        sh(shell, &UPLOAD_CERTS, &[live.to_str().unwrap(), "t1", &count], stream)
    };
    let pem = |tag: &str| {
        zeroize::Zeroizing::new(format!(
            "-----BEGIN CERTIFICATE-----\n{tag}A==\n-----END CERTIFICATE-----\n\
             -----BEGIN PRIVATE KEY-----\n{tag}B==\n  x\\y \n-----END PRIVATE KEY-----\n"
        ))
    };
    let files: Vec<(String, zeroize::Zeroizing<String>)> =
        (0..300).map(|i| (format!("{i:04x}ab.pem"), pem(&i.to_string()))).collect();
    let stream = cert_stream(&files).unwrap();
    let certs = dir.path().join("hafleet-certs");
    // Cut short, or one file changed on the way: nothing lands.
    let out = upload(&stream[..stream.len() - 10], files.len());
    assert!(!out.status.success());
    let mut bad = stream.to_vec();
    let at = bad.iter().rposition(|b| *b == b'B').unwrap();
    bad[at] = b'C';
    let out = upload(&bad, files.len());
    assert!(String::from_utf8_lossy(&out.stderr).contains("another sha256"));
    assert_eq!(std::fs::read_dir(&certs).unwrap().count(), 0, "nothing left behind");
    // Cut between two files: every file that came is whole, but one is missing.
    let second = stream.windows(13).rposition(|w| w == b"hafleet-cert ").unwrap();
    let out = upload(&stream[..second], files.len());
    assert!(String::from_utf8_lossy(&out.stderr).contains("299 of 300 certificate files"));
    assert_eq!(std::fs::read_dir(&certs).unwrap().count(), 0, "nothing left behind");
    let out = upload(&stream, files.len());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::metadata(&certs).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(std::fs::read_dir(&certs).unwrap().count(), files.len());
    for (name, content) in &files {
        let path = certs.join(name);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), content.as_str());
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }
    // Names and contents the stream cannot carry are refused before anything is sent.
    let one = |name: &str, content: &str| {
        cert_stream(&[(name.to_owned(), zeroize::Zeroizing::new(content.to_owned()))])
    };
    assert!(one("../x.pem", "a\n").is_err());
    assert!(one("ab.pem", "a").is_err());
    assert!(one("ab.pem", "a\r\n").is_err());
}

/// upload_validate.sh (with `true` for HAProxy) and upload_maps.sh: the map files
/// the host lacks and the config go in one stream and land byte for byte, whatever their
/// lines hold (an empty map, one without a final newline, lines that look like the
/// stream's own headers); a stream cut short, a map changed on the way or data past the
/// config leave no upload and no file of the stream's behind, and a file under a map's
/// name is always that map.
#[test]
fn maps_and_config_land_whole_in_one_round_trip_or_not_at_all() {
    in_each_shell(maps_and_config_land_whole_in_one_round_trip_or_not_at_all_in);
}

fn maps_and_config_land_whole_in_one_round_trip_or_not_at_all_in(shell: Shell) {
    use hafleet_proto::{MapFile, MapName};
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("haproxy.cfg");
    let map = |kind: &str, content: &str| MapFile {
        name: MapName::for_content(kind, content).unwrap(),
        content: content.to_owned(),
    };
    let maps = [
        map("exact", "a.example.com/ be_a\nb.example.com/x be_b\n"),
        map("prefix", ""),
        map("crtlist", "hafleet-config 1 1\nhafleet-map x y 1 1\n  \\x\ty  "),
    ];
    let maps: Vec<&MapFile> = maps.iter().collect();
    let config = "global\n\tdefault-path config\n\nbackend be_a\n    server s 1.2.3.4:80\n";
    let sha = hafleet_proto::sha256_hex(config.as_bytes());
    let live_s = live.to_str().unwrap();
    let validate = |stream: &[u8]| {
        let args = ["true", live_s, "t1", "/nonexistent.sock", &sha, "3"];
        sh(shell, &UPLOAD_VALIDATE, &args, stream)
    };
    let maps_dir = dir.path().join("hafleet-maps");
    let left = || left_behind(dir.path(), &maps_dir);
    let maps_whole = || {
        for e in std::fs::read_dir(&maps_dir).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            let m = maps.iter().find(|m| m.name.as_str() == name).expect("a map's name");
            assert_eq!(std::fs::read_to_string(maps_dir.join(&name)).unwrap(), m.content);
        }
    };
    let stream = Outgoing::whole(&maps, Some(config)).stream();
    // Cut short, a map changed on the way, or more after the config: nothing lands.
    for bad in [
        stream[..stream.len() - 3].to_vec(),
        String::from_utf8(stream.clone()).unwrap().replacen("be_b", "be_c", 1).into_bytes(),
        [stream.as_slice(), b"extra\n"].concat(),
    ] {
        let out = validate(&bad);
        assert!(!out.status.success());
        assert_eq!(out.status.code(), Some(Exit::Upload.code()));
        assert_eq!(left(), Vec::<String>::new(), "nothing left behind");
        maps_whole();
    }
    let out = validate(&stream);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let uploaded = answer::Uploaded::parse(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(uploaded.sha.as_deref(), Some(sha.as_str()));
    assert!(uploaded.stat.is_some(), "{uploaded:?}");
    let upload = dir.path().join("haproxy.cfg.hafleet-new-t1");
    assert_eq!(std::fs::read_to_string(&upload).unwrap(), config);
    for m in &maps {
        assert_eq!(std::fs::read_to_string(maps_dir.join(m.name.as_str())).unwrap(), m.content);
    }
    assert_eq!(left(), ["haproxy.cfg.hafleet-new-t1"]);
    maps_whole();
    assert_eq!(std::fs::read_dir(&maps_dir).unwrap().count(), 3);
    // The maps alone, in their own round trip, as a version checked by its maps sends them.
    std::fs::remove_dir_all(&maps_dir).unwrap();
    let out = sh(shell, &UPLOAD_MAPS, &[live_s, "t2", "3"], &Outgoing::whole(&maps, None).stream());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for m in &maps {
        assert_eq!(std::fs::read_to_string(maps_dir.join(m.name.as_str())).unwrap(), m.content);
    }
    // Two of three announced: refused.
    let out =
        sh(shell, &UPLOAD_MAPS, &[live_s, "t3", "3"], &Outgoing::whole(&maps[..2], None).stream());
    assert_eq!(out.status.code(), Some(Exit::Upload.code()));
    // A directory where a map goes: refused, not moved into it (a put-back that would
    // "succeed" at every drift check), and the stream's files are gone.
    let blocked = maps_dir.join(maps[0].name.as_str());
    std::fs::remove_file(&blocked).unwrap();
    std::fs::create_dir(&blocked).unwrap();
    let out = sh(shell, &UPLOAD_MAPS, &[live_s, "t4", "3"], &Outgoing::whole(&maps, None).stream());
    assert_eq!(out.status.code(), Some(Exit::Upload.code()));
    assert!(String::from_utf8_lossy(&out.stderr).contains("a directory in the way"));
    assert_eq!(std::fs::read_dir(&blocked).unwrap().count(), 0, "nothing moved into it");
    assert_eq!(left(), ["haproxy.cfg.hafleet-new-t1"], "nothing of this stream left behind");
}

/// swap_reload.sh: a host whose live file or loaded marker is no longer what it
/// was prepared on, or whose master cannot say `show proc`, is left as it was, and the
/// exit code says so (the applier prepares a changed host again).
#[test]
fn a_reload_checks_the_host_is_as_prepared_and_changes_nothing_otherwise() {
    in_each_shell(a_reload_checks_the_host_is_as_prepared_and_changes_nothing_otherwise_in);
}

fn a_reload_checks_the_host_is_as_prepared_and_changes_nothing_otherwise_in(shell: Shell) {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("haproxy.cfg");
    std::fs::write(&live, "old\n").unwrap();
    std::fs::write(dir.path().join("haproxy.cfg.hafleet-new-t1"), "new\n").unwrap();
    let old_sha = hafleet_proto::sha256_hex(b"old\n");
    let swap_reload = |was_live: &str| {
        let live = live.to_str().unwrap();
        let args = [live, "t1", "/nonexistent.sock", "5", "1", "", "", "0", was_live, ""];
        let out = shell.command(&SWAP_RELOAD).args(args).output().unwrap();
        let exit = Exit::of(out.status.code()).expect("an exit code that names its step");
        assert!(exit.changed_nothing(), "{exit:?}");
        assert_eq!(std::fs::read_to_string(live).unwrap(), "old\n");
        assert!(dir.path().join("haproxy.cfg.hafleet-new-t1").exists(), "the upload stays");
        (exit, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (stale, said) = swap_reload(&hafleet_proto::sha256_hex(b"other\n"));
    assert_eq!((stale, stale.stage()), (Exit::Stale, ApplyStage::Swap));
    assert!(said.contains("changed since it was prepared"), "{said}");
    let (no_proc, said) = swap_reload(&old_sha);
    assert_eq!((no_proc, no_proc.stage()), (Exit::NoProc, ApplyStage::Verify));
    assert!(said.contains("cannot read `show proc`"), "{said}");
}

/// The names of the files in `dir`, sorted.
fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// mark_loaded.sh on a real directory: it records the file and its reload
/// count, keeps it as last-known-good, and deletes only map files that neither config names,
/// an hour old, or a few minutes old when more than MAPS_KEPT of them are.
#[test]
fn marking_loaded_records_the_file_and_sweeps_only_old_unnamed_maps() {
    in_each_shell(marking_loaded_records_the_file_and_sweeps_only_old_unnamed_maps_in);
}

fn marking_loaded_records_the_file_and_sweeps_only_old_unnamed_maps_in(shell: Shell) {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("haproxy.cfg");
    let maps = dir.path().join("hafleet-maps");
    std::fs::create_dir(&maps).unwrap();
    std::fs::write(&live, "x map_str(hafleet-maps/exact-aaa.map)\n").unwrap();
    for name in ["exact-aaa.map", "exact-bbb.map", "exact-ccc.map"] {
        std::fs::write(maps.join(name), "").unwrap();
    }
    let old = std::time::SystemTime::now() - Duration::from_secs(7200);
    for name in ["exact-aaa.map", "exact-bbb.map"] {
        let f = std::fs::File::options().write(true).open(maps.join(name)).unwrap();
        f.set_modified(old).unwrap();
    }
    let sha = hafleet_proto::sha256_hex(&std::fs::read(&live).unwrap());
    let mark = |expected: &str| {
        shell.command(&MARK_LOADED).arg(&live).args([expected, "7"]).output().unwrap()
    };
    let refused = mark("0000");
    assert!(!refused.status.success(), "another file than expected is not marked");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("another applier"));
    let out = mark(&sha);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let marker = std::fs::read_to_string(dir.path().join("haproxy.cfg.hafleet-loaded"));
    let marker = marker.unwrap();
    assert!(marker.starts_with(&format!("{sha}\nreloads 7\nstat ")), "{marker}");
    assert!(dir.path().join("haproxy.cfg.hafleet-last-good").exists());
    let left = names_in(&maps);
    assert_eq!(left, ["exact-aaa.map", "exact-ccc.map"], "named or new maps stay");

    // More unnamed map files than MAPS_KEPT a few minutes old (each version brings its own):
    // they go without waiting for the hour, and those just written stay.
    let minutes = std::time::SystemTime::now() - Duration::from_secs(300);
    // `n` map files written five minutes ago, none of them named.
    let unnamed = |n: usize| {
        for i in 0..n {
            let name = maps.join(format!("prefix-{i:03}.map"));
            std::fs::write(&name, "").unwrap();
            let f = std::fs::File::options().write(true).open(&name).unwrap();
            f.set_modified(minutes).unwrap();
        }
    };
    unnamed(70);
    std::fs::write(maps.join("prefix-new.map"), "").unwrap();
    let out = mark(&sha);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let left = names_in(&maps);
    assert_eq!(left, ["exact-aaa.map", "exact-ccc.map", "prefix-new.map"], "{} left", left.len());
    // As many as MAPS_KEPT (a named one among them) stay until they are an hour old.
    unnamed(63);
    let out = mark(&sha);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_dir(&maps).unwrap().count(), 3 + 63);
    for i in 0..63 {
        std::fs::remove_file(maps.join(format!("prefix-{i:03}.map"))).unwrap();
    }

    // Certificate files: kept while the config (a default certificate) or a crt-list it
    // names lists them, or while they are new; an old unnamed one (a rotated key, an
    // upload left behind) goes.
    let certs = dir.path().join("hafleet-certs");
    std::fs::create_dir(&certs).unwrap();
    std::fs::write(maps.join("crtlist-ddd.map"), "hafleet-certs/a1.pem a.example.com\n").unwrap();
    std::fs::write(
        &live,
        "x map_str(hafleet-maps/exact-aaa.map)\n bind ssl crt hafleet-certs/b2.pem crt-list hafleet-maps/crtlist-ddd.map\n",
    )
    .unwrap();
    for name in ["a1.pem", "b2.pem", "c3.pem", "d4.pem", ".e5.pem.v1-2-3"] {
        std::fs::write(certs.join(name), "").unwrap();
    }
    for name in ["a1.pem", "b2.pem", "c3.pem", ".e5.pem.v1-2-3"] {
        let f = std::fs::File::options().write(true).open(certs.join(name)).unwrap();
        f.set_modified(old).unwrap();
    }
    let sha = hafleet_proto::sha256_hex(&std::fs::read(&live).unwrap());
    let out = mark(&sha);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let left = names_in(&certs);
    assert_eq!(left, ["a1.pem", "b2.pem", "d4.pem"], "named or new certificate files stay");

    // LIVE_STATE: the marked file is known by its stat; an edit in place is hashed anew.
    let live_state = || {
        let out = shell.command(&LIVE_STATE).arg(&live).output().unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(live_state(), format!("{sha}\n{sha}\n"));
    // The names it is asked about come on stdin (10,000 would not fit a command line):
    // it prints those the host lacks.
    // Its stdin is a socket, as sshd gives a command: a script that opened /dev/fd/N on
    // its stdin (fine on a pipe) fails on one.
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let asked = shell
        .command(&LIVE_STATE)
        .arg(&live)
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let names: String = (0..10_000).map(|i| format!("../hafleet-certs/n{i}.pem\n")).collect();
    let names = format!("exact-aaa.map\n../hafleet-certs/a1.pem\n{names}");
    // Written while the answer is read, as the applier does: the answer is 300 KB.
    let feed = std::thread::spawn(move || {
        use std::io::Write as _;
        let mut ours = ours;
        ours.write_all(names.as_bytes())?;
        ours.shutdown(std::net::Shutdown::Write)
    });
    let asked = String::from_utf8(asked.wait_with_output().unwrap().stdout).unwrap();
    feed.join().unwrap().unwrap();
    let missing: Vec<&str> = asked.lines().skip(2).collect();
    assert_eq!(missing.len(), 10_000, "only the files the host lacks");
    assert_eq!(missing[0], "../hafleet-certs/n0.pem");
    let refresh =
        shell.command(&REFRESH).arg(&live).arg(dir.path().join("no-such.sock")).output().unwrap();
    let refresh = String::from_utf8(refresh.stdout).unwrap();
    assert!(refresh.starts_with(&format!("{sha}\n{sha}\n--\n")), "{refresh}");
    std::fs::write(&live, "x map_str(hafleet-maps/exact-ccc.map)\n").unwrap();
    let edited = hafleet_proto::sha256_hex(&std::fs::read(&live).unwrap());
    assert_eq!(live_state(), format!("{edited}\n{sha}\n"), "same size, new mtime");
}

/// A folder of stand-ins for commands, put first on the scripts' PATH.
pub(super) struct FakeBin(tempfile::TempDir);

impl FakeBin {
    /// `commands`: (name, sh script).
    pub(super) fn new(commands: &[(&str, &str)]) -> FakeBin {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for (name, body) in commands {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        FakeBin(dir)
    }

    /// `script` in `shell` with this folder first on its PATH.
    pub(super) fn command(&self, shell: Shell, script: &Script) -> Command {
        let path = format!("{}:{}", self.0.path().display(), std::env::var("PATH").unwrap());
        let mut cmd = shell.command(script);
        cmd.env("PATH", path);
        cmd
    }
}

/// Every rename that makes a file live comes after a `sync` of the new file's content and
/// before one of its folder, and each is one `sync` for a batch of files, not one a file (a
/// stand-in for `sync` records its calls; a `sync` that takes no paths is fallen back from).
#[test]
fn new_files_and_their_folder_are_synced_around_each_rename_once_per_batch() {
    in_each_shell(new_files_and_their_folder_are_synced_around_each_rename_once_per_batch_in);
}

fn new_files_and_their_folder_are_synced_around_each_rename_once_per_batch_in(shell: Shell) {
    use hafleet_proto::{MapFile, MapName};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let log = dir.path().join("sync.log");
    let fake = FakeBin::new(&[("sync", "printf '%s\\n' \"$*\" >> \"$SYNC_LOG\"")]);
    let calls = || {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        said.lines().map(str::to_owned).collect::<Vec<_>>()
    };
    let run = |script: &Script, args: &[&str], stdin: &[u8]| {
        let out = fed(fake.command(shell, script).env("SYNC_LOG", &log).args(args), stdin);
        assert!(out.status.success(), "{}: {}", script.name, String::from_utf8_lossy(&out.stderr));
        out
    };
    let live = format!("{d}/haproxy.cfg");
    std::fs::write(&live, "old\n").unwrap();
    let map = |content: &str| MapFile {
        name: MapName::for_content("exact", content).unwrap(),
        content: content.to_owned(),
    };
    let maps = [map("a.example.com/ be_a\n"), map("b.example.com/ be_b\n")];
    let maps: Vec<&MapFile> = maps.iter().collect();
    let tmp = |m: &MapFile| format!("{d}/hafleet-maps/.{}.t1", m.name);

    // Two maps and the config: one sync for the three files, one for the maps' folder.
    let mut stream = Outgoing::whole(&maps, Some("new\n")).stream();
    crate::rollout::stream_record(&mut stream, "hafleet-check", "global\n");
    let sha = hafleet_proto::sha256_hex(b"new\n");
    run(&UPLOAD_FILES, &["true", &live, "t1", "/nonexistent.sock", &sha, "2"], &stream);
    let want_files = format!("-- {live}.hafleet-new-t1 {} {}", tmp(maps[0]), tmp(maps[1]));
    assert_eq!(calls(), [want_files, format!("-- {d}/hafleet-maps")]);
    // The swap on a host without last-good: the kept file, then the folder.
    run(&SWAP, &[&live, "t1"], b"");
    assert_eq!(calls(), [format!("-- {live}.hafleet-last-good-t1"), format!("-- {d}")]);
    assert_eq!(std::fs::read_to_string(&live).unwrap(), "new\n");
    // Marked loaded: the marker and last-good in one, then the folder.
    run(&MARK_LOADED, &[&live, "", "3", ""], b"");
    let want_files = format!("-- {live}.hafleet-loaded.tmp {live}.hafleet-last-good.tmp");
    assert_eq!(calls(), [want_files, format!("-- {d}")]);
    // A restore: the copy, then the folder.
    run(&RESTORE, &[&live], b"");
    assert_eq!(calls(), [format!("-- {live}.hafleet-restore"), format!("-- {d}")]);
    // Certificate files: all of them in one, then their folder.
    let pem = |tag: &str| zeroize::Zeroizing::new(format!("-----BEGIN X-----\n{tag}\n"));
    let certs = [("a1.pem".to_owned(), pem("a")), ("b2.pem".to_owned(), pem("b"))];
    run(&UPLOAD_CERTS, &[&live, "t2", "2"], &cert_stream(&certs).unwrap());
    // (Named from the upload's own folder, where they are written.)
    assert_eq!(calls(), ["-- a1.pem b2.pem".to_owned(), format!("-- {d}/hafleet-certs")]);
    // Nothing to rename, nothing to sync.
    run(&UPLOAD_MAPS, &[&live, "t3", "0"], b"");
    assert_eq!(calls(), Vec::<String>::new());

    // A `sync` that takes no paths: everything is synced instead, as often.
    let old =
        FakeBin::new(&[("sync", "[ \"$#\" -eq 0 ] || exit 1\nprintf 'all\\n' >> \"$SYNC_LOG\"")]);
    let out = fed(old.command(shell, &SWAP).env("SYNC_LOG", &log).args([&live, "t9"]), b"");
    assert_eq!(out.status.code(), Some(Exit::Swap.code()), "no upload t9 to swap");
    std::fs::write(format!("{live}.hafleet-new-t9"), "newer\n").unwrap();
    let out = fed(old.command(shell, &SWAP).env("SYNC_LOG", &log).args([&live, "t9"]), b"");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(calls(), ["all"]);
}

/// A stand-in for `socat` on a master CLI: `show proc` answers `proc.before` until a reload,
/// `proc.after` from then on; `reload` answers `reload.answer` if there is one (HAProxy 3.1),
/// and does not reload while `busy` exists; what it is told of the version goes to `told`.
/// Reads its state from $FAKE_MASTER.
const FAKE_SOCAT: &str = r#"read -r cmd
case $cmd in
  reload)
    [ ! -f "$FAKE_MASTER/reload.answer" ] || cat "$FAKE_MASTER/reload.answer"
    [ -f "$FAKE_MASTER/busy" ] || touch "$FAKE_MASTER/reloaded"
    ;;
  "show proc")
    if [ -f "$FAKE_MASTER/reloaded" ]; then cat "$FAKE_MASTER/proc.after"; else cat "$FAKE_MASTER/proc.before"; fi
    ;;
  "experimental-mode on; @!"*" set var proc.hafleet_version str("*")")
    printf '%s\n' "$cmd" >> "$FAKE_MASTER/told"
    ;;
  *) exit 1 ;;
esac"#;

/// reload_wait.sh against a master that says nothing (2.6), one that answers (3.1) and one
/// that holds the reload off (another in progress): the answer reads as each, the host looks
/// once only when the master did not reload, and a reload that is ours is marked loaded in the
/// same round trip.
#[test]
fn a_reload_reads_the_masters_answer_and_marks_its_own_reload() {
    in_each_shell(a_reload_reads_the_masters_answer_and_marks_its_own_reload_in);
}

fn a_reload_reads_the_masters_answer_and_marks_its_own_reload_in(shell: Shell) {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("haproxy.cfg");
    std::fs::write(&live, "global\n").unwrap();
    let live = live.to_str().unwrap();
    let sha = hafleet_proto::sha256_hex(b"global\n");
    let master = dir.path().join("master");
    let fake = FakeBin::new(&[("socat", FAKE_SOCAT)]);
    let proc = |reloads: u32, workers: &str| {
        format!(
            "#<PID>          <type>          <reloads>       <uptime>        <version>\n\
             20559           master          {reloads} [failed: 0]   0d00h00m01s     2.6.12\n\
             # workers\n{workers}# programs\n"
        )
    };
    let reload = |answer: Option<&str>, busy: bool, first: &str| {
        let _ = std::fs::remove_dir_all(&master);
        std::fs::create_dir(&master).unwrap();
        let write = |name: &str, text: &str| std::fs::write(master.join(name), text).unwrap();
        write(
            "proc.before",
            &proc(0, "100             worker          0               0d00h00m01s     2.6.12\n"),
        );
        write(
            "proc.after",
            &proc(
                1,
                "200             worker          0               0d00h00m00s     2.6.12\n\
                 100             worker          1               0d00h00m01s     2.6.12\n",
            ),
        );
        if let Some(answer) = answer {
            write("reload.answer", answer);
        }
        if busy {
            write("busy", "");
        }
        let _ = std::fs::remove_file(format!("{live}.hafleet-loaded"));
        let args = [live, "/fake.sock", "150", "5", &sha, "", first, "42"];
        let started = std::time::Instant::now();
        let out =
            fed(fake.command(shell, &RELOAD_WAIT).env("FAKE_MASTER", &master).args(args), b"");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let read = answer::Reload::parse(&String::from_utf8_lossy(&out.stdout));
        (read, started.elapsed())
    };

    let (silent, took) = reload(None, false, "0.300");
    assert!(took >= Duration::from_millis(300), "the first look waits when nothing answers");
    assert_eq!(silent.master, answer::MasterAnswer::Silent);
    let before = plan::parse_show_proc(&silent.before).unwrap();
    let after = silent.after.clone().unwrap();
    assert_eq!(plan::check_reload(&before, &after), plan::ReloadCheck::Done);
    assert_eq!((silent.looks, silent.marked), (Some(0), true));
    let marker = std::fs::read_to_string(format!("{live}.hafleet-loaded")).unwrap();
    assert!(marker.starts_with(&format!("{sha}\nreloads 1\nstat ")), "{marker}");
    let told = std::fs::read_to_string(master.join("told")).unwrap_or_default();
    // The new worker (200), not the old one still finishing its connections (100).
    assert_eq!(told, "experimental-mode on; @!200 set var proc.hafleet_version str(42)\n");

    let logs = "[NOTICE]   (20559) : haproxy version is 3.1.2-1\n";
    let (loaded, took) = reload(Some(&format!("Success=1\n--\n{logs}")), false, "5");
    assert!(took < Duration::from_secs(5), "an answer comes once the reload is over: {took:?}");
    assert_eq!(loaded.master, answer::MasterAnswer::Loaded { logs: logs.trim().to_owned() });
    assert_eq!(loaded.after.unwrap().reloads, 1);
    assert!(loaded.marked);

    let (busy, took) =
        reload(Some("Success=0\n--\nAnother reload is still in progress.\n"), true, "0");
    assert_eq!(busy.master, answer::MasterAnswer::Busy);
    assert_eq!((busy.looks, busy.marked), (Some(1), false), "one look, no mark");
    assert_eq!(busy.after.unwrap().reloads, 0);
    assert!(took < Duration::from_secs(1), "did not wait for a reload that never came: {took:?}");
    assert!(!std::path::Path::new(&format!("{live}.hafleet-loaded")).exists());
}

/// Map content of lines that look like the stream's own records, backslashes, tabs, blanks
/// and sed's escapes, ending with a newline or not.
fn tricky_content() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::strategy::Strategy as _;
    let line = proptest::prop_oneof![
        proptest::sample::select(vec![
            "",
            " ",
            "\t x",
            "\\",
            "a\\tb\\n",
            "hafleet-map exact-0.map 0 1 1",
            "hafleet-config 3 1",
            "example.com/ be_x",
            "%[src] $HOME `id`",
        ])
        .prop_map(str::to_owned),
        "[ -~]{0,16}",
    ];
    (proptest::collection::vec(line, 0..12), proptest::bool::ANY).prop_map(|(lines, end)| {
        let mut text = lines.join("\n");
        if end && !text.is_empty() {
            text.push('\n');
        }
        text
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
    /// Whatever the maps hold (lines that look like the stream's own records, no final
    /// newline, nothing at all), upload_maps.sh unpacks the stream the applier sends into
    /// exactly those files, under their content names.
    #[test]
    fn the_upload_stream_unpacks_to_what_was_sent(
        contents in proptest::collection::vec(tricky_content(), 1..4),
    ) {
        use hafleet_proto::{MapFile, MapName};
        let Some(shell) = SHELLS.into_iter().find(|s| s.installed()) else { return Ok(()) };
        let maps: Vec<MapFile> = contents
            .iter()
            .zip(["exact", "prefix", "hosts"])
            .map(|(content, kind)| MapFile {
                name: MapName::for_content(kind, content).unwrap(),
                content: content.clone(),
            })
            .collect();
        let refs: Vec<&MapFile> = maps.iter().collect();
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("haproxy.cfg");
        let count = maps.len().to_string();
        let stream = Outgoing::whole(&refs, None).stream();
        let out = sh(shell, &UPLOAD_MAPS, &[live.to_str().unwrap(), "t1", &count], &stream);
        proptest::prop_assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let landed = dir.path().join("hafleet-maps");
        for m in &maps {
            let got = std::fs::read_to_string(landed.join(m.name.as_str())).unwrap();
            proptest::prop_assert_eq!(&got, &m.content);
        }
        proptest::prop_assert_eq!(std::fs::read_dir(&landed).unwrap().count(), maps.len());
    }
}
