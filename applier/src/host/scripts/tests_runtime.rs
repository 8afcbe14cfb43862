//! swap_runtime.sh in each shell a host's `sh` may be, against a stand-in for the master CLI:
//! the change through the runtime API in one round trip (checks, swap, `show map`, `prepare
//! map`, the commands), and what it leaves when the host is not as it was prepared.

use super::tests::{FakeBin, Shell, fed, in_each_shell};
use super::*;
use crate::core::runtime_api as runtime;
use crate::host::answer::{self, Exit};

/// A stand-in for `socat` on a master CLI in interactive sessions (`prompt` first, then each
/// answer followed by the prompt `master> `), its state in $FAKE_MASTER: `show proc` answers
/// `proc`, `@!100 show map` answers `maps`, `prepare map` version 7, `set server … addr` the
/// change, anything else nothing. It appends what it was sent to `sessions`.
const FAKE_SOCAT: &str = r#"read -r first
case $first in
  prompt)
    printf 'master> '
    payload=0
    while IFS= read -r line; do
      printf '%s\n' "$line" >> "$FAKE_MASTER/sessions"
      if [ "$payload" = 1 ]; then
        [ -n "$line" ] || { payload=0; printf '\nmaster> '; }
        continue
      fi
      case $line in
        quit) break ;;
        "show proc") cat "$FAKE_MASTER/proc"; printf '\nmaster> ' ;;
        "@!100 show map") cat "$FAKE_MASTER/maps"; printf '\nmaster> ' ;;
        "@!100 show ssl crt-list") cat "$FAKE_MASTER/crtlists"; printf '\nmaster> ' ;;
        *" prepare map #"*) printf 'New version created: 7\n\nmaster> ' ;;
        *" set server "*" addr "*) printf 'IP changed from 10.0.0.1 to 10.0.0.2\n\nmaster> ' ;;
        *" <<") payload=1 ;;
        *) printf '\nmaster> ' ;;
      esac
    done
    ;;
  "show proc") cat "$FAKE_MASTER/proc" ;;
  *) exit 1 ;;
esac"#;

/// `show proc` with the one current worker `pid`.
fn worker(pid: u32) -> String {
    format!(
        "#<PID>          <type>          <reloads>       <uptime>        <version>\n\
         1               master          2 [failed: 0]   0d00h00m01s     2.6.12\n\
         # workers\n{pid}             worker          0               0d00h00m01s     2.6.12\n\
         # programs\n"
    )
}

/// A stand-in master's state in `master`: worker 100's `show map` (an exact map, id 3 with 1
/// entry; a prefix map, id 5 with 3).
fn stand_in_master(master: &std::path::Path) {
    std::fs::create_dir(master).unwrap();
    let hex = |c: char| c.to_string().repeat(64);
    std::fs::write(
        master.join("maps"),
        format!(
            "# id (file) description\n\
             3 (hafleet-maps/exact-{}.map) pattern loaded from file 'x' used by map. curr_ver=0 next_ver=0 entry_cnt=1\n\
             5 (hafleet-maps/prefix-{}.map) pattern loaded from file 'y' used by map. curr_ver=0 next_ver=0 entry_cnt=3\n\n",
            hex('a'),
            hex('b')
        ),
    )
    .unwrap();
    std::fs::write(master.join("proc"), worker(100)).unwrap();
}

/// A change of a server's address, the exact map replaced whole and two entries of the prefix
/// map edited; swap_runtime's MAP arguments for it.
fn change() -> ([runtime::Step; 3], Vec<String>) {
    let steps = [
        runtime::Step::SetAddr {
            backend: "be_a".into(),
            server: "n1".into(),
            ip: [10, 0, 0, 2].into(),
            port: 30080,
        },
        runtime::Step::ReplaceMap {
            kind: "exact".into(),
            content: "a.example.com/{map:exact} be_a\n".into(),
        },
        runtime::Step::EditMap {
            kind: "prefix".into(),
            edits: vec![
                runtime::MapEdit::Set { key: "b.example.com/".into(), value: "be_b".into() },
                runtime::MapEdit::Del { key: "c.example.com/".into() },
            ],
            before: 3,
        },
    ];
    let edited: Vec<String> =
        runtime::edited_maps(&steps).iter().map(|(k, n)| format!("={k}:{n}")).collect();
    let kinds = runtime::map_kinds(&steps).into_iter().map(str::to_owned).chain(edited).collect();
    (steps, kinds)
}

/// What the worker was sent for [`change`] (pid 100), command lines filled in.
const CHANGE_SENT: [&str; 7] = [
    "@!100 prepare map #3",
    "@!100 set server be_a/n1 addr 10.0.0.2 port 30080",
    "@!100 add map @7 #3 <<",
    "a.example.com/{map:exact} be_a",
    "@!100 commit map @7 #3",
    "@!100 set map #5 b.example.com/ be_b",
    "@!100 del map #5 c.example.com/",
];

/// A change of two maps and a server's address goes live in one run: the upload swapped in,
/// each map found by kind and prepared, its placeholder filled in on command lines only (a
/// payload is sent as it is), and the session's answers read as the rollout reads them. A host
/// whose files or worker are not those it was prepared on is left as it was; a map the worker
/// does not hold once leaves the swap standing and sends no command.
#[test]
fn runtime_commands_go_with_the_swap_in_one_round_trip() {
    in_each_shell(runtime_commands_go_with_the_swap_in_one_round_trip_in);
}

fn runtime_commands_go_with_the_swap_in_one_round_trip_in(shell: Shell) {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("haproxy.cfg");
    let upload = dir.path().join("haproxy.cfg.hafleet-new-t1");
    let master = dir.path().join("master");
    stand_in_master(&master);
    let old_sha = hafleet_proto::sha256_hex(b"old\n");
    let (steps, kinds) = change();
    let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
    let maps = runtime::map_placeholders(&steps);
    let commands = runtime::commands(&steps, &maps, &Default::default()).unwrap();
    let session = runtime::session(100, &commands);
    let fake = FakeBin::new(&[("socat", FAKE_SOCAT)]);
    // The loaded marker says the old file (no stat line: the live file is hashed).
    let marker = dir.path().join("haproxy.cfg.hafleet-loaded");
    let run_session = |was_live: &str, pid: u32, kinds: &[&str], session: &[u8]| {
        std::fs::write(&live, "old\n").unwrap();
        std::fs::write(&upload, "new\n").unwrap();
        std::fs::write(&marker, format!("{old_sha}\n")).unwrap();
        std::fs::write(master.join("proc"), worker(pid)).unwrap();
        let _ = std::fs::remove_file(master.join("sessions"));
        let mut args =
            vec![live.to_str().unwrap(), "t1", "/fake.sock", "100", was_live, old_sha.as_str()];
        args.extend(kinds);
        let mut cmd = fake.command(shell, &SWAP_RUNTIME);
        let out = fed(cmd.env("FAKE_MASTER", &master).args(args), session);
        let sent = std::fs::read_to_string(master.join("sessions")).unwrap_or_default();
        (out, std::fs::read_to_string(&live).unwrap(), sent)
    };
    let run = |was_live: &str, pid: u32, kinds: &[&str]| {
        run_session(was_live, pid, kinds, session.as_bytes())
    };

    let (out, now, sent) = run(&old_sha, 100, &kinds);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(now, "new\n", "swapped in");
    // What the worker runs is not known until the rollout marks it: a failure on the way
    // leaves no marker, and the next apply reloads.
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "", "the marker emptied");
    let said = answer::SwapRuntime::parse(
        &String::from_utf8_lossy(&out.stdout),
        &String::from_utf8_lossy(&out.stderr),
    );
    let answer::SwapRuntime::Sent(said) = said else { panic!("not sent: {said:?}") };
    let answers = runtime::answers(&said, commands.len());
    assert_eq!(answers.len(), commands.len(), "{said:?}");
    assert_eq!(runtime::first_refused(&commands, &answers), None);
    for line in CHANGE_SENT {
        assert!(sent.lines().any(|l| l == line), "{line:?} not sent in {sent}");
    }
    assert!(!sent.contains("@7 #3 be_a"), "a payload is not filled in: {sent}");
    assert!(!sent.contains("prepare map #5"), "a map edited is not prepared: {sent}");

    // The files changed since the host was prepared, or another worker is current: nothing
    // is done, and the exit code says so.
    for (was_live, pid) in [(hafleet_proto::sha256_hex(b"other\n"), 100), (old_sha.clone(), 200)] {
        let (out, now, sent) = run(&was_live, pid, &kinds);
        assert_eq!(Exit::of(out.status.code()), Some(Exit::Stale), "{pid}");
        assert_eq!(now, "old\n");
        assert!(!sent.contains("prepare") && !sent.contains("set server"), "{sent}");
        assert!(upload.exists(), "the upload stays");
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), format!("{old_sha}\n"));
    }

    // Only maps edited: none is prepared, and every placeholder is filled in.
    let edit_only = &steps[2..];
    let maps = runtime::map_placeholders(edit_only);
    let commands = runtime::commands(edit_only, &maps, &Default::default()).unwrap();
    let edit_session = runtime::session(100, &commands);
    let (out, _, sent) = run_session(&old_sha, 100, &["=prefix:3"], edit_session.as_bytes());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!sent.contains("prepare") && !sent.contains("{map"), "{sent}");
    assert!(sent.lines().any(|l| l == "@!100 del map #5 c.example.com/"), "{sent}");

    // A kind of map the worker does not hold, or a map edited that does not hold the entries
    // its edits start from: swapped, nothing sent, the caller reloads.
    for kinds in [&["exact", "host"][..], &["exact", "=prefix:2"], &["=host:1"]] {
        let (out, now, sent) = run(&old_sha, 100, kinds);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(now, "new\n");
        assert!(!sent.contains("prepare") && !sent.contains("set server"), "{kinds:?}: {sent}");
        let said = answer::SwapRuntime::parse(
            &String::from_utf8_lossy(&out.stdout),
            &String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            matches!(&said, answer::SwapRuntime::Skipped(why) if why.contains("show map")),
            "{kinds:?}: {said:?}"
        );
    }
    // A `show map` that says no entry count: nothing is edited.
    let shown = std::fs::read_to_string(master.join("maps")).unwrap();
    std::fs::write(master.join("maps"), shown.replace(" entry_cnt=3", "")).unwrap();
    let (out, _, sent) = run_session(&old_sha, 100, &["=prefix:3"], edit_session.as_bytes());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!sent.contains("del map"), "{sent}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("hafleet-runtime-skipped"));
}

/// An upload that goes live in its own round trip (upload_files.sh with the sha256 lines the
/// host was prepared on, its stream ending with the session): the upload lands and is
/// checked, `show proc` is printed, then, after `hafleet-live`, the change goes as
/// swap_runtime.sh sends it, for the worker the host finds current (`{pid}` filled in). A
/// refused check sends nothing and leaves nothing; a host changed since it was prepared keeps
/// its live file (the exit says Stale); a stream without its session lands nothing. The
/// session's file never stays.
#[test]
fn an_upload_goes_live_in_its_own_round_trip() {
    in_each_shell(an_upload_goes_live_in_its_own_round_trip_in);
}

fn an_upload_goes_live_in_its_own_round_trip_in(shell: Shell) {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("haproxy.cfg");
    let master = dir.path().join("master");
    stand_in_master(&master);
    let marker = dir.path().join("haproxy.cfg.hafleet-loaded");
    let old_sha = hafleet_proto::sha256_hex(b"old\n");
    let new_sha = hafleet_proto::sha256_hex(b"new\n");
    let (steps, kinds) = change();
    let maps = runtime::map_placeholders(&steps);
    let commands = runtime::commands(&steps, &maps, &Default::default()).unwrap();
    let session = runtime::session(runtime::ANY_WORKER, &commands);
    let mut stream = crate::rollout::Outgoing::whole(&[], Some("new\n")).stream();
    crate::rollout::stream_record(&mut stream, "hafleet-check", "global\n");
    let without_session = stream.clone();
    crate::rollout::stream_record(&mut stream, "hafleet-session", &session);
    let fake = FakeBin::new(&[("socat", FAKE_SOCAT)]);
    let run = |haproxy: &str, was_live: &str, stream: &[u8]| {
        std::fs::write(&live, "old\n").unwrap();
        std::fs::write(&marker, format!("{old_sha}\n")).unwrap();
        let _ = std::fs::remove_file(master.join("sessions"));
        let live_s = live.to_str().unwrap();
        let mut args =
            vec![haproxy, live_s, "t1", "/fake.sock", &new_sha, "0", "0", was_live, &old_sha];
        args.extend(kinds.iter().map(String::as_str));
        let mut cmd = fake.command(shell, &UPLOAD_FILES);
        let out = fed(cmd.env("FAKE_MASTER", &master).args(args), stream);
        let sent = std::fs::read_to_string(master.join("sessions")).unwrap_or_default();
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("hafleet-session") || n.contains("hafleet-mapcheck"))
            .collect();
        left.sort();
        (out, std::fs::read_to_string(&live).unwrap(), sent, left)
    };

    let (out, now, sent, left) = run("true", &old_sha, &stream);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!((now.as_str(), left), ("new\n", vec![]), "swapped in, nothing of the trip left");
    let printed = String::from_utf8(out.stdout).unwrap();
    let (uploaded, after) = answer::went_live(&printed).expect("a hafleet-live line");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.lines().any(|l| l == "hafleet-live"), "what the check said ends: {said}");
    let uploaded = answer::Uploaded::parse(uploaded);
    assert_eq!(uploaded.sha.as_deref(), Some(new_sha.as_str()));
    let proc = uploaded.show_proc().expect("show proc before the change");
    assert_eq!(crate::core::plan::current_worker(&proc), Some(100));
    let answer::SwapRuntime::Sent(said) = answer::SwapRuntime::parse(after, "") else {
        panic!("not sent: {after:?}")
    };
    let answers = runtime::answers(&said, commands.len());
    assert_eq!(answers.len(), commands.len(), "{said:?}");
    assert_eq!(runtime::first_refused(&commands, &answers), None);
    for line in CHANGE_SENT {
        assert!(sent.lines().any(|l| l == line), "{line:?} not sent in {sent}");
    }
    assert!(!sent.contains("{pid}"), "{sent}");

    // The check refused: haproxy's status, nothing sent, nothing left but the live file.
    let (out, now, sent, left) = run("false", &old_sha, &stream);
    assert_eq!(out.status.code(), Some(1));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hafleet-live"));
    assert_eq!((now.as_str(), sent.as_str(), left), ("old\n", "", vec![]));
    assert!(!dir.path().join("haproxy.cfg.hafleet-new-t1").exists());

    // The host changed since it was prepared: the live file stays, the exit says so.
    let other = hafleet_proto::sha256_hex(b"other\n");
    let (out, now, sent, left) = run("true", &other, &stream);
    assert_eq!(Exit::of(out.status.code()), Some(Exit::Stale));
    assert_eq!((now.as_str(), left), ("old\n", vec![]));
    assert!(!sent.contains("set server"), "{sent}");

    // A stream that lacks its session is not whole: nothing lands.
    let (out, now, _, left) = run("true", &old_sha, &without_session);
    assert_eq!(Exit::of(out.status.code()), Some(Exit::Upload));
    assert_eq!((now.as_str(), left), ("old\n", vec![]));
    assert!(!dir.path().join("haproxy.cfg.hafleet-new-t1").exists());
}

/// A change of certificates goes as any other through swap_runtime: the worker's one crt-list
/// of hafleet's found in `show ssl crt-list` fills in the session's `{crtlist}`, and each
/// certificate's payload is read from the file the upload put beside the config, so no key
/// travels in the session. Not one crt-list of hafleet's: swapped, nothing sent, the caller
/// reloads.
#[test]
fn certificates_go_live_with_the_swap_their_files_read_on_the_host() {
    in_each_shell(certificates_go_live_with_the_swap_their_files_read_on_the_host_in);
}

fn certificates_go_live_with_the_swap_their_files_read_on_the_host_in(shell: Shell) {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("haproxy.cfg");
    let master = dir.path().join("master");
    stand_in_master(&master);
    let list = format!("hafleet-maps/crtlist-{}.map", "c".repeat(64));
    let crtlists = master.join("crtlists");
    std::fs::create_dir(dir.path().join("hafleet-certs")).unwrap();
    let pem = "-----BEGIN CERTIFICATE-----\nQ0VSVA==\n-----END CERTIFICATE-----\n\
               -----BEGIN PRIVATE KEY-----\nS0VZ\n-----END PRIVATE KEY-----\n";
    std::fs::write(dir.path().join("hafleet-certs/ab12.pem"), pem).unwrap();
    let marker = dir.path().join("haproxy.cfg.hafleet-loaded");
    let old_sha = hafleet_proto::sha256_hex(b"old\n");
    let steps = [
        runtime::Step::AddCert {
            path: "hafleet-certs/ab12.pem".into(),
            filters: vec!["www.example.com".into()],
        },
        runtime::Step::RemoveCert { path: "hafleet-certs/0ld1.pem".into() },
    ];
    let maps = runtime::map_placeholders(&steps);
    let commands = runtime::commands(&steps, &maps, &runtime::CertInputs::on_host()).unwrap();
    let session = runtime::session(100, &commands);
    assert!(!session.contains("S0VZ"), "no key in the session");
    let fake = FakeBin::new(&[("socat", FAKE_SOCAT)]);
    let run_with = |shown: &str, session: &[u8]| {
        std::fs::write(&live, "old\n").unwrap();
        std::fs::write(dir.path().join("haproxy.cfg.hafleet-new-t1"), "new\n").unwrap();
        std::fs::write(&marker, format!("{old_sha}\n")).unwrap();
        std::fs::write(&crtlists, shown).unwrap();
        let _ = std::fs::remove_file(master.join("sessions"));
        let args =
            [live.to_str().unwrap(), "t1", "/fake.sock", "100", &old_sha, &old_sha, "+crtlist"];
        let mut cmd = fake.command(shell, &SWAP_RUNTIME);
        let out = fed(cmd.env("FAKE_MASTER", &master).args(args), session);
        let sent = std::fs::read_to_string(master.join("sessions")).unwrap_or_default();
        (out, std::fs::read_to_string(&live).unwrap(), sent)
    };
    let run = |shown: &str| run_with(shown, session.as_bytes());

    let (out, now, sent) = run(&format!("# filename\n/etc/ssl/other.list\n{list}\n"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(now, "new\n", "swapped in");
    let lines: Vec<&str> = sent.lines().collect();
    let at = lines.iter().position(|l| *l == "@!100 set ssl cert hafleet-certs/ab12.pem <<");
    let at = at.unwrap_or_else(|| panic!("no set ssl cert in {sent}"));
    let payload: Vec<&str> = pem.lines().collect();
    assert_eq!(lines[at + 1..at + 1 + payload.len()], payload[..], "the file, line for line");
    assert_eq!(lines[at + 1 + payload.len()], "", "then the payload's end");
    for line in [
        "@!100 show ssl crt-list".to_owned(),
        "@!100 new ssl cert hafleet-certs/ab12.pem".to_owned(),
        format!("@!100 add ssl crt-list {list} <<"),
        "hafleet-certs/ab12.pem www.example.com".to_owned(),
        format!("@!100 del ssl crt-list {list} hafleet-certs/0ld1.pem"),
    ] {
        assert!(lines.contains(&line.as_str()), "{line:?} not sent in {sent}");
    }
    assert!(!sent.contains("{crtlist}") && !sent.contains("{certfile"), "{sent}");
    let said = answer::SwapRuntime::parse(&String::from_utf8_lossy(&out.stdout), "");
    let answer::SwapRuntime::Sent(said) = said else { panic!("not sent: {said:?}") };
    assert_eq!(runtime::answers(&said, commands.len()).len(), commands.len(), "{said:?}");

    // Only a `set ssl cert` payload reads a file: the same line in another payload is sent as
    // it is (no key pulled into a map, where `show map` would show it).
    let other =
        "prompt\n@!100 add ssl crt-list {crtlist} <<\n{certfile:hafleet-certs/ab12.pem}\n\nquit\n";
    let (out, _, sent) = run_with(&format!("{list}\n"), other.as_bytes());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(sent.lines().any(|l| l == "{certfile:hafleet-certs/ab12.pem}"), "{sent}");
    assert!(!sent.contains("S0VZ"), "{sent}");

    // Two crt-lists of hafleet's, or none: swapped, nothing sent, the caller reloads.
    for shown in [format!("{list}\n{list}\n"), "/etc/ssl/other.list\n".to_owned()] {
        let (out, now, sent) = run(&shown);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(now, "new\n");
        assert!(!sent.contains("ssl cert"), "{shown:?}: {sent}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("hafleet-runtime-skipped"));
    }
}
