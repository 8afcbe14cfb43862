//! The README tells the truth about the binaries: its configuration reference lists exactly
//! the flags each one's `--help` gives, with the same environment variables and defaults.

use anyhow::{Context as _, Result};
use hafleet_tests::bin_path;
use std::collections::BTreeMap;

/// A flag's environment variable and default, as `--help` or the README gives them.
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

/// The rows of the README's table headed by `**`title`**` in "Configuration reference".
fn from_readme(readme: &str, title: &str) -> Result<Flags> {
    let section = readme.split("### Configuration reference").nth(1).context("no reference")?;
    let section = section.split("\n## ").next().unwrap_or(section);
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

#[test]
fn the_readme_configuration_reference_matches_every_binarys_help() -> Result<()> {
    let readme = std::fs::read_to_string(hafleet_tests::stack::workspace_file("README.md"))?;
    for (title, binary, args) in [
        ("hafleet-watcher", "hafleet-watcher", &["--help"][..]),
        ("hafleet-renderer run", "hafleet-renderer", &["run", "--help"][..]),
        ("hafleet-applier", "hafleet-applier", &["--help"][..]),
    ] {
        let out = std::process::Command::new(bin_path(binary)).args(args).output()?;
        anyhow::ensure!(out.status.success(), "{binary} --help failed");
        let help = from_help(&String::from_utf8(out.stdout)?);
        anyhow::ensure!(help.len() > 5, "{binary}: could not read --help: {help:?}");
        let documented = from_readme(&readme, title)?;
        assert_eq!(documented, help, "README's reference for {title} differs from --help");
    }
    Ok(())
}
