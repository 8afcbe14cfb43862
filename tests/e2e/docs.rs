//! The documentation tells the truth and stays a front page plus a shelf: the configuration
//! reference (docs/settings.md) lists exactly the flags each binary's `--help` gives, with the
//! same environment variables and defaults; the README stays short and says what is supported;
//! every relative link leads to a file; and no user document cites development issues.

use anyhow::{Context as _, Result};
use hafleet_tests::bin_path;
use std::collections::BTreeMap;

/// A flag's environment variable and default, as `--help` or the reference gives them.
type Flags = BTreeMap<String, (String, String)>;

/// Flags of a long `--help`: `--flag`, its `[env: X=]` and `[default: Y]`.
fn from_help(text: &str) -> Flags {
    let mut out = Flags::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if (2..=6).contains(&indent) && (trimmed.starts_with("--") || trimmed.starts_with('-')) {
            let flag = trimmed
                .split([' ', ','])
                .find(|w| w.starts_with("--"))
                .unwrap_or_default()
                .to_owned();
            current = (!matches!(flag.as_str(), "--help" | "--version")).then_some(flag);
            if let Some(f) = &current {
                out.insert(f.clone(), Default::default());
            }
            continue;
        }
        let Some(flag) = &current else { continue };
        let entry = out.get_mut(flag).expect("inserted");
        if let Some(env) = trimmed.strip_prefix("[env: ") {
            // `[env: X=value]`, or `[env: X]` where the value is hidden.
            entry.0 = env.split(['=', ']']).next().unwrap_or_default().to_owned();
        }
        if let Some(default) = trimmed.strip_prefix("[default: ") {
            entry.1 = default.trim_end_matches(']').to_owned();
        }
    }
    out
}

/// The rows of the table headed by `**`title`**` in the "Configuration reference" section
/// (a heading of any level, up to the next heading of the same level or above).
fn from_reference(doc: &str, title: &str) -> Result<Flags> {
    let mut lines = doc.lines();
    let level = lines
        .by_ref()
        .find_map(|l| {
            let hashes = l.len() - l.trim_start_matches('#').len();
            (hashes > 0 && l[hashes..].trim() == "Configuration reference").then_some(hashes)
        })
        .context("no Configuration reference section")?;
    let section: Vec<&str> = lines
        .take_while(|l| {
            let hashes = l.len() - l.trim_start_matches('#').len();
            !(hashes > 0 && hashes <= level && l[hashes..].starts_with(' '))
        })
        .collect();
    let section = section.join("\n");
    let table = section
        .split(&format!("**`{title}`**"))
        .nth(1)
        .with_context(|| format!("no table for {title}"))?;
    let mut out = Flags::new();
    for line in table.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|'))
    {
        let cells: Vec<&str> = line.split(" | ").map(|c| c.trim_matches(['|', ' '])).collect();
        let Some(flag) = cells.first().and_then(|c| c.strip_prefix('`')) else { continue };
        let flag = flag.trim_end_matches('`');
        if !flag.starts_with("--") {
            continue;
        }
        let unquote = |c: &str| c.trim_matches('`').to_owned();
        let default = match cells.get(2).copied().unwrap_or_default() {
            "required" | "" => String::new(),
            d => unquote(d),
        };
        out.insert(flag.to_owned(), (unquote(cells.get(1).copied().unwrap_or_default()), default));
    }
    Ok(out)
}

/// Where the configuration reference lives.
const REFERENCE: &str = "docs/settings.md";

#[test]
fn the_docs_configuration_reference_matches_every_binarys_help() -> Result<()> {
    let reference = std::fs::read_to_string(hafleet_tests::stack::workspace_file(REFERENCE))?;
    for (title, binary, args) in [
        ("hafleet-watcher", "hafleet-watcher", &["--help"][..]),
        ("hafleet-renderer run", "hafleet-renderer", &["run", "--help"][..]),
        ("hafleet-applier", "hafleet-applier", &["--help"][..]),
    ] {
        let out = std::process::Command::new(bin_path(binary)).args(args).output()?;
        anyhow::ensure!(out.status.success(), "{binary} --help failed");
        let help = from_help(&String::from_utf8(out.stdout)?);
        anyhow::ensure!(help.len() > 5, "{binary}: could not read --help: {help:?}");
        let documented = from_reference(&reference, title)?;
        assert_eq!(documented, help, "{REFERENCE}'s reference for {title} differs from --help");
    }
    Ok(())
}

/// The user documents: the README and every Markdown file of docs/ (docs/cli.md among them,
/// which the CLI generates), each with its path from the workspace's root.
fn user_docs() -> Result<Vec<(String, String)>> {
    let mut paths = vec!["README.md".to_owned()];
    for entry in std::fs::read_dir(hafleet_tests::stack::workspace_file("docs"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            paths.push(format!("docs/{name}"));
        }
    }
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(hafleet_tests::stack::workspace_file(&p))
                .with_context(|| format!("reading {p}"))?;
            Ok((p, text))
        })
        .collect()
}

/// The targets of a document's Markdown links (`[text](target)`), outside fenced code blocks.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for (at, _) in line.match_indices("](") {
            let rest = &line[at + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].trim().to_owned());
            }
        }
    }
    out
}

/// The first mention of a development issue in `text`, as `[Ii]ssue \d+|#\d{2,}` would find it.
fn issue_mention(text: &str) -> Option<String> {
    let digit_at = |i: usize| text.as_bytes().get(i).is_some_and(u8::is_ascii_digit);
    let around = |i: usize| {
        let mut start = i.saturating_sub(30);
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = (i + 30).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        text[start..end].to_owned()
    };
    for (i, _) in text.match_indices("ssue ") {
        if i > 0 && matches!(text.as_bytes()[i - 1], b'I' | b'i') && digit_at(i + 5) {
            return Some(around(i));
        }
    }
    for (i, _) in text.match_indices('#') {
        if digit_at(i + 1) && digit_at(i + 2) {
            return Some(around(i));
        }
    }
    None
}

#[test]
fn the_readme_is_a_front_page_that_says_what_is_supported() -> Result<()> {
    let readme = std::fs::read_to_string(hafleet_tests::stack::workspace_file("README.md"))?;
    let lines = readme.lines().count();
    assert!(lines <= 220, "README.md has {lines} lines: a front page has at most 220");

    // The HAProxy versions the tests run: Debian 12's 2.6 (./tests/run.sh) and the 3.0 that
    // tests/setup.sh builds (./tests/run-haproxy30.sh).
    let setup = std::fs::read_to_string(hafleet_tests::stack::workspace_file("tests/setup.sh"))?;
    let built = setup
        .lines()
        .find_map(|l| l.strip_prefix("HAPROXY30_VERSION="))
        .context("tests/setup.sh names no HAPROXY30_VERSION")?;
    let built: Vec<&str> = built.trim().split('.').take(2).collect();
    let built = built.join(".");
    for version in ["2.6", built.as_str()] {
        assert!(
            readme.contains(&format!("HAProxy {version}")),
            "README.md does not name HAProxy {version}, which the tests run"
        );
    }
    // Both ways traffic reaches the cluster.
    let lower = readme.to_lowercase();
    for mode in ["nodeport services", "pod endpoints", "routable from the haproxy hosts"] {
        assert!(lower.contains(mode), "README.md does not say {mode:?}");
    }
    // The two set-up commands, and CI's test command is the README's.
    for command in [
        "./deploy/local/demo.sh      # the whole pipeline on loopback, with a sample app; Ctrl-C stops it",
        "./tests/run.sh              # every test, end-to-end included",
    ] {
        assert!(readme.lines().any(|l| l == command), "README.md lacks {command:?}");
    }
    let ci = std::fs::read_to_string(hafleet_tests::stack::workspace_file(".ci/run"))?;
    assert!(ci.lines().any(|l| l.trim() == "./tests/run.sh"), ".ci/run runs ./tests/run.sh");
    Ok(())
}

#[test]
fn every_relative_link_in_the_docs_leads_to_a_file() -> Result<()> {
    let root = hafleet_tests::stack::workspace_file("");
    let mut broken = Vec::new();
    let mut checked = 0;
    for (path, text) in user_docs()? {
        let dir = std::path::Path::new(&path).parent().unwrap_or(std::path::Path::new(""));
        for target in link_targets(&text) {
            let file = target.split('#').next().unwrap_or_default();
            if file.is_empty() || file.contains("://") || file.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            if !root.join(dir).join(file).exists() {
                broken.push(format!("{path}: {target}"));
            }
        }
    }
    assert!(checked > 20, "only {checked} relative links found: is the parser right?");
    assert!(broken.is_empty(), "links to files that do not exist:\n{}", broken.join("\n"));
    Ok(())
}

#[test]
fn user_docs_cite_no_development_issues() -> Result<()> {
    assert!(issue_mention("see issue 12 for").is_some() && issue_mention("fixed (#34)").is_some());
    assert!(issue_mention("an issue of 3 hosts, port 80 #1").is_none());
    let mut found = Vec::new();
    for (path, text) in user_docs()? {
        // The command reference is generated from the CLI's help.
        if path == "docs/cli.md" {
            continue;
        }
        if let Some(mention) = issue_mention(&text) {
            found.push(format!("{path}: …{mention}…"));
        }
    }
    assert!(found.is_empty(), "user docs cite development issues:\n{}", found.join("\n"));
    Ok(())
}
