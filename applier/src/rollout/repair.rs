//! Drift: what a host's files should be and how they differ, and putting back files that went
//! missing.

use super::*;

/// How `host`'s files differ from `version` (`None`: they do not), and how its HAProxy sees
/// the nodes it checks (`None`: node health checks off, or no worker answered); `Err` when
/// the host cannot be read (a drift check skips it: the retry loop deals with unreachable
/// hosts).
pub async fn drift_of(
    host: &Host,
    version: &ConfigVersion,
    settings: &RolloutSettings,
) -> Result<(Option<plan::Drift>, Option<plan::NodeChecks>), String> {
    let files = expected_files(version, settings);
    let files: Vec<(&str, &str)> = files.iter().map(|(n, s)| (n.as_str(), s.as_str())).collect();
    let names: String = files.iter().map(|(name, _)| format!("{name}\n")).collect();
    let found = settings.hosts.drift_state(host, names.as_bytes()).await?;
    Ok((plan::drift(&version.sha256, &files, &found), found.nodes))
}

/// The files besides the config a host of `version` holds, as drift checks name them (maps
/// by name, certificate files as `../hafleet-certs/<id>.pem`), each with the sha256 it must
/// have; worked out once per version. A certificate file's is known only by opening its key
/// (once per certificate): without `--tls-identity` (or a key that does not open)
/// certificate files are not checked.
pub(super) fn expected_files(version: &ConfigVersion, settings: &RolloutSettings) -> ExpectedFiles {
    let mut cached = settings.drift_files.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((sha, files)) = cached.as_ref()
        && *sha == version.sha256
    {
        return files.clone();
    }
    let files = std::sync::Arc::new(work_out_files(version, settings));
    *cached = Some((version.sha256.clone(), files.clone()));
    files
}

/// What a drift check expects of a host's files: (name, sha256).
pub(super) type ExpectedFiles = std::sync::Arc<Vec<(String, String)>>;

pub(super) fn work_out_files(
    version: &ConfigVersion,
    settings: &RolloutSettings,
) -> Vec<(String, String)> {
    let Some(bundle) = version.bundle() else { return Vec::new() };
    let mut files: Vec<(String, String)> = bundle
        .maps
        .iter()
        .map(|m| (m.name.as_str().to_owned(), m.name.digest().to_owned()))
        .collect();
    let Some(identity) = settings.tls_identity.as_deref() else { return files };
    let mut known = settings.cert_shas.lock().unwrap_or_else(|e| e.into_inner());
    let paths: Vec<(String, &hafleet_proto::SealedCert)> = bundle.cert_paths().collect();
    let wanted: std::collections::HashSet<&str> = paths.iter().map(|(p, _)| p.as_str()).collect();
    known.retain(|path, _| wanted.contains(path.as_str()));
    for (path, cert) in paths {
        let sha = match known.get(&path) {
            Some(sha) => sha.clone(),
            None => match identity.cert_file(cert) {
                Ok(file) => {
                    let sha = hafleet_proto::sha256_hex(file.as_bytes());
                    known.insert(path.clone(), sha.clone());
                    sha
                }
                Err(_) => continue,
            },
        };
        files.push((format!("../{path}"), sha));
    }
    files
}

/// Puts the files `names` of `version` (maps, and certificate files as
/// `../hafleet-certs/<id>.pem`) back on `host` as the version has them: the maps in one
/// round trip (UPLOAD_MAPS), the certificates opened with `--tls-identity` (UPLOAD_CERTS),
/// each checked on arrival and renamed over what is there only once all arrived whole, so
/// HAProxy never finds one half written or missing. The repair of a drift in those files
/// alone: HAProxy holds the maps and certificates it loaded, so nothing reloads. `Applied`,
/// or where it failed.
pub async fn put_back_files(
    host: &Host,
    version: &ConfigVersion,
    names: &[String],
    settings: &RolloutSettings,
) -> ApplyOutcome {
    let Some(bundle) = version.bundle() else {
        return failed(fail(ApplyStage::Upload, "the applier does not hold the version's files"));
    };
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    // A connection from the pool (a no-op checks it), then the uploads on it: each writes
    // under this attempt's own token, never run twice.
    let (conn, mut done) = match settings.hosts.open_checked(host).await {
        Ok(running) => running,
        Err(failure) => return failed(failure),
    };
    if done.is_ok() {
        let (token, identity) = (attempt_token(version.version), settings.tls_identity.as_deref());
        done = put_files(&*conn, bundle, &names, &token, identity).await;
    }
    conn.give_back(done.is_ok()).await;
    match done {
        Ok(()) => ApplyOutcome::Applied,
        Err(f) => failed(f),
    }
}

/// Writes the map and certificate files of `bundle` that `names` lists (LIVE_STATE's and
/// DRIFT_STATE's names) on the host, each checked on arrival and renamed over in place: maps in
/// one round trip, then certificates opened with `identity`.
pub(super) async fn put_files(
    conn: &dyn HostOps,
    bundle: &Bundle,
    names: &[&str],
    token: &str,
    identity: Option<&crate::core::identity::FleetIdentity>,
) -> Result<(), Failure> {
    upload_maps(conn, &missing_maps(bundle, names), token).await?;
    upload_certs(conn, bundle, names, token, identity).await.map(|_| ())
}
