//! `hafleet keygen --out FILE`: a fleet's TLS identity.

use anyhow::Context as _;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;

/// Writes a new identity to `out`, created 0600 and never over an existing file, and prints
/// its public half.
pub fn keygen(out: &std::path::Path) -> anyhow::Result<()> {
    let id = hafleet_applier::core::identity::FleetIdentity::generate();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("cannot create {} (it is never overwritten)", out.display()))?;
    f.write_all(id.to_file_text().as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", out.display()))?;
    println!("{}", id.recipient());
    Ok(())
}
