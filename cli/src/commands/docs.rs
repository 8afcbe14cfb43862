//! What documents the CLI itself: shell completions, the man page, the Markdown reference in
//! docs/ (kept in step with `--help` by a test), the version.

use crate::output::Output;
use clap::CommandFactory as _;

/// `hafleet completion SHELL`.
pub fn completion(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let mut command = crate::Cli::command();
    clap_complete::generate(shell, &mut command, "hafleet", &mut std::io::stdout());
    Ok(())
}

/// `hafleet man`: the man page, in roff.
pub fn man() -> anyhow::Result<()> {
    use std::io::Write as _;
    std::io::stdout().write_all(&man_page()?)?;
    Ok(())
}

/// `hafleet version`.
pub fn version(output: Output) -> anyhow::Result<()> {
    let commit = env!("HAFLEET_GIT_COMMIT");
    match output {
        Output::Table => println!("hafleet {} (commit {commit})", env!("CARGO_PKG_VERSION")),
        o => {
            o.print(&serde_json::json!({"version": env!("CARGO_PKG_VERSION"), "commit": commit}))?
        }
    }
    Ok(())
}

/// The man page, in roff.
pub fn man_page() -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    // The release alone, not the commit: the page is the same for every build of a release.
    let command = without_env_values(crate::Cli::command()).version(env!("CARGO_PKG_VERSION"));
    clap_mangen::Man::new(command).render(&mut out)?;
    Ok(out)
}

/// `command` with no environment variable's value shown: the reference and the man page are
/// the same whatever the environment of whoever made them.
fn without_env_values(command: clap::Command) -> clap::Command {
    command.mut_args(|a| a.hide_env_values(true)).mut_subcommands(without_env_values)
}

/// The CLI reference as Markdown: every command's `--help`, as docs/cli.md holds it.
pub fn reference() -> String {
    let mut out = String::from(
        "# `hafleet` command reference\n\nEvery command's `--help`, generated from the CLI \
         itself: a test fails when this file differs from it (`HAFLEET_BLESS=1 cargo test -p \
         hafleet --test reference` writes it anew). The global options, which every command \
         takes, are listed once, under `hafleet`.\n",
    );
    let mut command = without_env_values(crate::Cli::command());
    command.build();
    section(&mut out, &mut command, "hafleet");
    out
}

fn section(out: &mut String, command: &mut clap::Command, path: &str) {
    if command.is_hide_set() {
        return;
    }
    // The global options once, under `hafleet`; each command's own below.
    let help = match path.contains(' ') {
        true => {
            let mut own = command.clone().mut_args(|a| match a.is_global_set() {
                true => a.hide(true),
                false => a,
            });
            own.render_long_help().to_string()
        }
        false => command.render_long_help().to_string(),
    };
    out.push_str(&format!("\n## `{path}`\n\n```text\n{}\n```\n", help.trim_end()));
    let names: Vec<String> = command.get_subcommands().map(|s| s.get_name().to_owned()).collect();
    for name in names {
        if name == "help" {
            continue;
        }
        if let Some(sub) = command.find_subcommand_mut(&name) {
            section(out, sub, &format!("{path} {name}"));
        }
    }
}
