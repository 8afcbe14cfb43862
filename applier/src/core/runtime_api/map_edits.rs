//! A changed map as the few entries that changed, when that is what it is: at 10,000 routes a
//! map is half a megabyte, and replacing it whole (`prepare map`, its entries again in `add
//! map` payloads, `commit map`) for one route that moved costs each host about a hundred
//! commands and most of a rollout's time on the host. One entry's change is one command on the
//! running version (`add map`, `set map`, `del map`), atomic as a commit is. Pure.
//!
//! The edits rest on the running map holding the entries of the file it was last brought to.
//! Any command refused, or a session cut short, and the host reloads; and every swap empties
//! the host's loaded marker until the rollout marks what HAProxy runs, so a worker left
//! running a change taken in part (its reload failed too) is reloaded at the next apply, not
//! edited. The host checks the count besides: the map must hold as many entries as that file
//! (`entry_cnt` in `show map`, which counts a version prepared and not committed too; it
//! counts each entry once per match method the config looks the file up with, and each map
//! of hafleet's is looked up with one), else nothing is sent and the host reloads
//! (swap_runtime.sh).
//!
//! Several entries' changes go one command each, one after the other in the same session:
//! in each map additions and new values first, removals last, so a request in between sees a
//! map's old and new routes side by side, never neither. Maps change one after the other, as
//! when they are replaced whole. More than [`MAX_MAP_EDITS`] of them, or any entry the CLI
//! could read as something else, and the whole map is replaced.

use super::Step;
use std::collections::HashMap;

/// One entry's change on the running version of a map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapEdit {
    /// `add map <map> <key> <value>`: a key the map did not have.
    Add { key: String, value: String },
    /// `set map <map> <key> <value>`: a key the map had, with another value.
    Set { key: String, value: String },
    /// `del map <map> <key>`: a key the map no longer has.
    Del { key: String },
}

/// More entries' changes than this in one map, and the map is replaced whole.
pub const MAX_MAP_EDITS: usize = 16;

/// The longest key or value sent on a command line (a map payload takes longer ones).
const MAX_EDIT_WORD: usize = 1024;

/// The step that makes the running map of `kind`, whose entries are `old`'s, hold `new`'s:
/// its entries' changes ([`edits`]) if there are few, else the whole map again.
pub(super) fn map_step(kind: &str, old: &str, new: &str) -> Step {
    match counted_edits(old, new) {
        Some((edits, before)) => Step::EditMap { kind: kind.to_owned(), edits, before },
        None => Step::ReplaceMap { kind: kind.to_owned(), content: new.to_owned() },
    }
}

/// The changes that take a map whose file was `old` to `new`, entry by entry; `None` when
/// there are more than [`MAX_MAP_EDITS`], or either map holds a key twice (HAProxy keeps both,
/// and `set map` or `del map` would act on both), or a key or value is not one the CLI passes
/// as one word unchanged ([`cli_word`]).
pub fn edits(old: &str, new: &str) -> Option<Vec<MapEdit>> {
    counted_edits(old, new).map(|(edits, _)| edits)
}

/// [`edits`], with the number of entries `old` holds (each file read once).
fn counted_edits(old: &str, new: &str) -> Option<(Vec<MapEdit>, usize)> {
    let (old_entries, new_entries) = (entries(old)?, entries(new)?);
    // The same number of entries on both sides with few changes is the common case; a map
    // whose size moved by more than the limit cannot be within it.
    if old_entries.len().abs_diff(new_entries.len()) > MAX_MAP_EDITS {
        return None;
    }
    let mut out = Vec::new();
    let mut dels = Vec::new();
    let old_map: HashMap<&str, &str> = old_entries.iter().copied().collect();
    let new_map: HashMap<&str, &str> = new_entries.iter().copied().collect();
    // A key twice: fewer keys than entries.
    if old_map.len() != old_entries.len() || new_map.len() != new_entries.len() {
        return None;
    }
    for &(key, value) in &new_entries {
        let edit = match old_map.get(key) {
            Some(was) if *was == value => continue,
            Some(_) => MapEdit::Set { key: key.to_owned(), value: value.to_owned() },
            None => MapEdit::Add { key: key.to_owned(), value: value.to_owned() },
        };
        if out.len() == MAX_MAP_EDITS || !cli_word(key) || !cli_word(value) {
            return None;
        }
        out.push(edit);
    }
    for &(key, _) in &old_entries {
        if !new_map.contains_key(key) {
            if out.len() + dels.len() == MAX_MAP_EDITS || !cli_word(key) {
                return None;
            }
            dels.push(MapEdit::Del { key: key.to_owned() });
        }
    }
    out.append(&mut dels);
    Some((out, old_entries.len()))
}

/// A map file's entries: `key value` lines as the renderer writes them (a key, blanks, the
/// rest of the line as the value), comment lines (`#` first) and empty lines left out; `None`
/// if a key has no value, or a line is of another shape HAProxy might read otherwise than this
/// (a leading or trailing blank, a carriage return).
fn entries(content: &str) -> Option<Vec<(&str, &str)>> {
    let mut out = Vec::new();
    for line in content.split('\n').filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if line.starts_with([' ', '\t']) || line.ends_with([' ', '\t']) || line.contains('\r') {
            return None;
        }
        let (key, value) = line.split_once([' ', '\t'])?;
        out.push((key, value.trim_start_matches([' ', '\t'])));
    }
    Some(out)
}

/// Whether `word` reaches HAProxy unchanged as one argument of a CLI command line: not empty,
/// not `#…` (which `set map` and `del map` read as an entry's reference), of letters, digits
/// and `-._~/*:%+=,@` only (no blank, `;` or `\`, which the CLI splits or unescapes on, and no
/// `{`, which the host's placeholders start with), and not longer than [`MAX_EDIT_WORD`].
pub fn cli_word(word: &str) -> bool {
    !word.is_empty()
        && word.len() <= MAX_EDIT_WORD
        && !word.starts_with('#')
        && word.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~/*:%+=,@".contains(&b))
}

/// The map of entries `content` holds with `edits` carried out as HAProxy carries them out
/// (for tests: what the running map holds afterwards).
#[cfg(test)]
pub(super) fn carried_out(
    content: &str,
    edits: &[MapEdit],
) -> std::collections::BTreeMap<String, String> {
    let mut map: std::collections::BTreeMap<String, String> = entries(content)
        .expect("lines of the renderer's shape")
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    for edit in edits {
        match edit {
            MapEdit::Add { key, value } => {
                assert!(map.insert(key.clone(), value.clone()).is_none(), "{key} added twice");
            }
            MapEdit::Set { key, value } => {
                assert!(map.insert(key.clone(), value.clone()).is_some(), "{key} set, not there");
            }
            MapEdit::Del { key } => assert!(map.remove(key).is_some(), "{key} deleted, not there"),
        }
    }
    map
}

/// `content`'s entries as a map (for tests).
#[cfg(test)]
pub(super) fn entry_map(content: &str) -> std::collections::BTreeMap<String, String> {
    carried_out(content, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moved_added_and_removed_entry_are_one_command_each_removals_last() {
        let old = "# 3 rules\na.example.com/ be_a\nb.example.com/ be_b\nc.example.com/x/ be_c\n";
        let new = "# 3 rules\nc.example.com/x/ be_c\nd.example.com/ be_d\na.example.com/ be_b\n";
        assert_eq!(
            edits(old, new).unwrap(),
            [
                MapEdit::Add { key: "d.example.com/".into(), value: "be_d".into() },
                MapEdit::Set { key: "a.example.com/".into(), value: "be_b".into() },
                MapEdit::Del { key: "b.example.com/".into() },
            ]
        );
        assert_eq!(edits(old, old).unwrap(), []);
        assert_eq!(carried_out(old, &edits(old, new).unwrap()), entry_map(new));
    }

    #[test]
    fn many_changes_duplicate_keys_and_words_the_cli_would_read_otherwise_replace_the_map() {
        let many: String = (0..=MAX_MAP_EDITS).map(|i| format!("h{i}.example.com/ be\n")).collect();
        assert_eq!(edits("", &many), None, "one more than the limit");
        let limit: String = (0..MAX_MAP_EDITS).map(|i| format!("h{i}.example.com/ be\n")).collect();
        assert_eq!(edits("", &limit).map(|e| e.len()), Some(MAX_MAP_EDITS));
        assert_eq!(edits(&limit, "").map(|e| e.len()), Some(MAX_MAP_EDITS));
        // Changes beyond the limit among entries that stay in number.
        assert_eq!(edits(&many, &many.replace(" be\n", " be_b\n")), None);
        assert_eq!(edits(&limit, &limit.replace(" be\n", " be_b\n")).map(|e| e.len()), Some(16));
        assert_eq!(edits("a be\n", "a be\na be_b\n"), None, "a key twice");
        assert_eq!(edits("a be\n", "a\n"), None, "no value");
        for odd in [" a be\n", "a be \n", "a be\r\n", "  # a comment?\n"] {
            assert_eq!(edits("", odd), None, "{odd:?}");
        }
        assert_eq!(edits("# rules\n\na be\n", "# other\na be\n"), Some(vec![]));
        // (A line that starts with `#` is a comment: no key does; a value never is read as
        // a reference, but goes as no other word either.)
        assert_eq!(edits("", "k #1\n"), None, "a value of a word outside the allowlist");
        for word in ["a;b", "a\\b", "{map:exact}", "a'b", "a\"b", "a$b"] {
            assert_eq!(edits("", &format!("{word} be\n")), None, "{word}");
            assert_eq!(edits("", &format!("k {word}\n")), None, "value {word}");
            assert_eq!(edits(&format!("{word} be\n"), ""), None, "removed {word}");
        }
        assert!(edits("", &format!("{} be\n", "a".repeat(MAX_EDIT_WORD + 1))).is_none());
        let fine = "*.example.com/a-b_c.d~e:80/%20+x=1,y@z/ hafleet_b_1\n";
        assert_eq!(edits("", fine).map(|e| e.len()), Some(1));
    }

    #[test]
    fn a_map_step_is_edits_when_few_else_the_whole_map() {
        let big: String = (0..100).map(|i| format!("h{i}.example.com/ be\n")).collect();
        let one_more = format!("{big}new.example.com/ be\n");
        assert!(
            matches!(map_step("prefix", &big, &one_more), Step::EditMap { kind, edits, before }
            if kind == "prefix" && edits.len() == 1 && before == 100)
        );
        let all_moved = big.replace(" be\n", " be_b\n");
        assert_eq!(
            map_step("prefix", &big, &all_moved),
            Step::ReplaceMap { kind: "prefix".into(), content: all_moved.clone() }
        );
    }
}
