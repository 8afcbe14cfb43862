//! docs/cli.md and docs/man/hafleet.1 are what the CLI itself says: a change to a command or
//! its help fails here until the files are written anew (`HAFLEET_BLESS=1 cargo test -p
//! hafleet --test reference`).

use std::path::Path;

fn in_step(file: &str, made: &[u8]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file);
    if std::env::var_os("HAFLEET_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, made).unwrap();
        return;
    }
    let shipped = std::fs::read(&path).unwrap_or_default();
    assert!(
        shipped == made,
        "{file} is not what the CLI says; write it anew with \
         HAFLEET_BLESS=1 cargo test -p hafleet --test reference"
    );
}

#[test]
fn the_cli_reference_is_the_help() {
    let reference = hafleet_cli::commands::docs::reference();
    for command in ["## `hafleet fleets`", "## `hafleet history diff`", "## `hafleet context set`"]
    {
        assert!(reference.contains(command), "{command} missing");
    }
    assert!(!reference.contains("## `hafleet man`"), "hidden commands stay out");
    in_step("docs/cli.md", reference.as_bytes());
}

#[test]
fn the_man_page_is_the_help() {
    let page = hafleet_cli::commands::docs::man_page().unwrap();
    assert!(String::from_utf8_lossy(&page).contains(".TH hafleet"));
    in_step("docs/man/hafleet.1", &page);
}
