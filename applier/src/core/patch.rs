//! Sending a file as an edit of one the host already has: a `sed` script of the lines that
//! differ, addressed by the line numbers of the host's file. A version that adds one Service
//! to a fleet of 10,000 changes a few lines of a 3 MB config and of a 550 KB map; sent as
//! edits, a host gets a few hundred bytes instead of 3.6 MB. Pure: what arrives is checked
//! against the version's sha256 on the host, and sent whole if it is not that.

use similar::{Algorithm, DiffTag};
use std::ops::Range;
use std::time::{Duration, Instant};

/// Longer than this, the diff settles for a correct script that may not be the shortest.
const DIFF_DEADLINE: Duration = Duration::from_millis(100);

/// A `sed` script that turns `old` into `new`, or `None` when sending `new` whole is as good:
/// the script would be more than half of `new`, or either file has a carriage return or lacks
/// a final newline (what `sed` would not keep byte for byte), or `old` is empty (nothing to
/// address). Each run of changed lines is one command: `N,Md`, `N,Mc\`, `Na\` or `1i\`, with
/// the new lines as its text, every backslash doubled (so GNU sed's escapes never apply), a
/// line that starts with a blank or a tab led by a backslash (so it is kept), and each line
/// but the last ended by a backslash.
pub fn sed_script(old: &str, new: &str) -> Option<String> {
    let plain = |s: &str| s.ends_with('\n') && !s.contains('\r');
    if old.is_empty() || !plain(old) || !plain(new) {
        return None;
    }
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let deadline = Some(Instant::now() + DIFF_DEADLINE);
    let ops = similar::capture_diff_slices_deadline(Algorithm::Myers, &a, &b, deadline);
    let mut script = String::new();
    let budget = new.len() / 2;
    // Changes next to each other make one command: an `a` after a line that a `d` or `c`
    // removed would never run.
    let mut hunk: Option<(Range<usize>, Range<usize>)> = None;
    // Where each op is, counted from the ops' lengths: `similar` may report an insertion that
    // follows an equal run at the run's start (an `a` after a line a `d` just removed, which
    // sed never runs), so its indices are not trusted.
    let (mut at_old, mut at_new) = (0, 0);
    for op in ops {
        let (tag, old_range, new_range) = op.as_tag_tuple();
        let old_range = at_old..at_old + old_range.len();
        let new_range = at_new..at_new + new_range.len();
        (at_old, at_new) = (old_range.end, new_range.end);
        if tag == DiffTag::Equal {
            if let Some((o, n)) = hunk.take() {
                command(&mut script, o, &b[n]);
            }
        } else {
            hunk = Some(match hunk {
                Some((o, n)) => (o.start..old_range.end, n.start..new_range.end),
                None => (old_range, new_range),
            });
        }
        if script.len() > budget {
            return None;
        }
    }
    if let Some((o, n)) = hunk {
        command(&mut script, o, &b[n]);
    }
    (script.len() <= budget).then_some(script)
}

/// Appends the command that puts `text` where `old` (0-based lines of the host's file) was.
fn command(script: &mut String, old: Range<usize>, text: &[&str]) {
    let verb = match (old.is_empty(), text.is_empty()) {
        (true, true) => return,
        (true, false) if old.start == 0 => "1i".to_owned(),
        (true, false) => format!("{}a", old.start),
        (false, true) => format!("{},{}d", old.start + 1, old.end),
        (false, false) => format!("{},{}c", old.start + 1, old.end),
    };
    script.push_str(&verb);
    if text.is_empty() {
        script.push('\n');
        return;
    }
    script.push_str("\\\n");
    for (i, line) in text.iter().enumerate() {
        if line.starts_with([' ', '\t']) {
            script.push('\\');
        }
        script.push_str(&line.replace('\\', "\\\\"));
        script.push_str(if i + 1 < text.len() { "\\\n" } else { "\n" });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy as _;

    /// Runs `sed -f script` on `old` as the upload scripts do.
    fn sed(old: &str, script: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let (file, edit) = (dir.path().join("old"), dir.path().join("edit.sed"));
        std::fs::write(&file, old).unwrap();
        std::fs::write(&edit, script).unwrap();
        let out = std::process::Command::new("sed").arg("-f").arg(&edit).arg(&file).output();
        let out = out.unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// Lines of the kinds that trip `sed` up: blanks, leading blanks and tabs, backslashes and
    /// sed's own escapes, a lone backslash, text that looks like a command.
    const LINES: &[&str] = &[
        "",
        "backend be_default_web_80",
        "    server node-1 10.0.0.1:30080 track hafleet_nodes/node-1",
        "\tserver tab",
        "    # default/web:80",
        "\\",
        "a\\tb\\nc \\\\ end\\",
        " ",
        "1d",
        "$a\\",
        "}",
        "example.com/ be_x",
    ];

    /// A small pseudo-random generator, so that the cases are the same on every run.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    fn text(lines: &[String]) -> String {
        lines.iter().map(|l| format!("{l}\n")).collect()
    }

    /// Whatever the edit (lines inserted first, last, in runs; deleted; replaced; all of it at
    /// once), the script makes the new file byte for byte.
    #[test]
    fn sed_makes_the_new_file_from_the_old_one_byte_for_byte() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut edited = 0;
        for case in 0..300 {
            let len = 1 + rng.below(60);
            let old: Vec<String> =
                (0..len).map(|i| format!("{} {i}", LINES[rng.below(LINES.len())])).collect();
            let mut new = old.clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(new.len() + 1);
                let line = LINES[rng.below(LINES.len())].to_owned();
                match rng.below(3) {
                    0 => new.insert(at, line),
                    1 if at < new.len() && new.len() > 1 => {
                        new.remove(at);
                    }
                    _ if at < new.len() => new[at] = line,
                    _ => new.push(line),
                }
            }
            let (old, new) = (text(&old), text(&new));
            // Only small edits of long enough files are worth a script; the rest go whole.
            let Some(script) = sed_script(&old, &new) else { continue };
            edited += 1;
            assert_eq!(sed(&old, &script), new, "case {case}: script\n{script}");
        }
        assert!(edited > 100, "only {edited} of 300 cases made a script");
        // A new file that is only blank lines, or that replaces every line.
        let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
        for new in ["a\nb\nc\nd\ne\nf\ng\n\n\nh\n", "\na\nb\nc\nd\ne\nf\ng\nh\n"] {
            let script = sed_script(old, new).unwrap();
            assert_eq!(sed(old, &script), new, "{script}");
        }
    }

    #[test]
    fn a_backend_added_to_a_big_config_is_a_few_lines_of_script() {
        let backend = |i: usize| {
            format!(
                "backend be_{i}\n    # ns/svc-{i}:80\n    server n1 10.0.0.1:{i} track hafleet_nodes/n1\n\n"
            )
        };
        let old: String = (0..10_000).filter(|i| i % 2 == 0).map(backend).collect();
        let new: String = (0..10_000).filter(|i| i % 2 == 0 || *i == 5_001).map(backend).collect();
        let script = sed_script(&old, &new).unwrap();
        assert_eq!(script.lines().count(), 5, "{script}");
        assert!(script.contains("backend be_5001\\\n"), "{script}");
        assert_eq!(sed(&old, &script), new);
        // A file rewritten from top to bottom goes whole.
        assert_eq!(sed_script(&old, &old.replace("ns/", "other/")), None);
    }

    #[test]
    fn what_sed_would_not_keep_goes_whole() {
        assert_eq!(sed_script("", "a\n"), None);
        assert_eq!(sed_script("a\nb\n", "a\nb"), None);
        assert_eq!(sed_script("a\nb", "a\nb\n"), None);
        assert_eq!(sed_script("a\r\nb\n", "a\r\nc\n"), None);
    }

    /// The case the property below found: a line deleted, then, after an equal line, one
    /// inserted, which `similar` reports at the equal line's start (`10,10d` then `10a`,
    /// whose text sed never wrote).
    #[test]
    fn an_insertion_after_an_equal_line_after_a_deletion_lands() {
        let mut old: Vec<String> = vec![String::new(); 7];
        old.extend(["b", "b", "b", "", "b"].map(String::from));
        old.extend(vec![String::new(); 14]);
        let mut new = old.clone();
        new.insert(9, String::new());
        new.remove(10);
        let (old, new) = (text(&old), text(&new));
        assert_eq!(sed(&old, &sed_script(&old, &new).unwrap()), new);
    }

    /// A line of the kinds that trip `sed` up, or any printable ASCII.
    fn any_line() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::prop_oneof![
            proptest::sample::select(LINES).prop_map(str::to_owned),
            "[ -~]{0,12}",
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// A file of the lines that trip `sed` up (and printable ASCII besides), edited a few
        /// times (lines inserted, deleted, replaced anywhere): the script makes the new file
        /// from the old one byte for byte, and a failing case shrinks to the fewest lines and
        /// edits that show it.
        #[test]
        fn an_edit_script_round_trips_through_sed(
            old in proptest::collection::vec(any_line(), 4..40),
            edits in proptest::collection::vec((0u8..3, 0usize..64, any_line()), 1..4),
        ) {
            let mut new = old.clone();
            for (op, at, line) in edits {
                let at = at % (new.len() + 1);
                match op {
                    0 => new.insert(at, line),
                    1 if at < new.len() => {
                        new.remove(at);
                    }
                    _ if at < new.len() => new[at] = line,
                    _ => new.push(line),
                }
            }
            let (old, new) = (text(&old), text(&new));
            let script = sed_script(&old, &new);
            proptest::prop_assume!(script.is_some(), "sent whole: nothing to check");
            proptest::prop_assert_eq!(sed(&old, &script.unwrap()), new);
        }
    }
}
