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
    let Some(files) = expected_files(version, settings) else {
        return Err("the certificates' keys are being opened to work out their files".into());
    };
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
pub(super) fn expected_files(
    version: &ConfigVersion,
    settings: &RolloutSettings,
) -> Option<ExpectedFiles> {
    let mut cached = settings.drift_files.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((sha, files)) = cached.as_ref()
        && *sha == version.sha256
    {
        return Some(files.clone());
    }
    let files = std::sync::Arc::new(work_out_files(version, settings)?);
    *cached = Some((version.sha256.clone(), files.clone()));
    Some(files)
}

/// What a drift check expects of a host's files: (name, sha256).
pub(super) type ExpectedFiles = std::sync::Arc<Vec<(String, String)>>;

/// The sha256 of each certificate file a host should hold, by path (`None`: its key does not
/// open, and the file is not checked), and whether keys are being opened for it off the
/// applier's loop.
#[derive(Debug, Default)]
pub struct CertShas {
    known: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Option<String>>>>,
    opening: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Clears [`CertShas::opening`] when the task that opens keys ends, however it ends.
struct Opened(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for Opened {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// Most certificate keys a drift check opens in the applier's loop (a rotation's few); more
/// (every key after a start: about 2 s at 10,000) are opened by a blocking task while drift
/// checks wait for it, so a new version never waits behind them.
const OPENED_INLINE: usize = 16;

/// The files a host of `version` holds besides its config, with their sha256; `None` while
/// the certificate keys it needs are being opened off the loop (the drift check is put off).
fn work_out_files(
    version: &ConfigVersion,
    settings: &RolloutSettings,
) -> Option<Vec<(String, String)>> {
    let Some(bundle) = version.bundle() else { return Some(Vec::new()) };
    let mut files: Vec<(String, String)> = bundle
        .maps
        .iter()
        .map(|m| (m.name.as_str().to_owned(), m.name.digest().to_owned()))
        .collect();
    let Some(identity) = settings.tls_identity.as_ref() else { return Some(files) };
    let shas = &settings.cert_shas;
    let mut known = shas.known.lock().unwrap_or_else(|e| e.into_inner());
    let paths: Vec<(String, &hafleet_proto::SealedCert)> = bundle.cert_paths().collect();
    let unknown = || paths.iter().filter(|(path, _)| !known.contains_key(path));
    if unknown().count() > OPENED_INLINE {
        // Copied for the task only when one starts (not at every check while it runs).
        if !shas.opening.swap(true, std::sync::atomic::Ordering::AcqRel) {
            let certs: Vec<(String, hafleet_proto::SealedCert)> =
                unknown().map(|(path, cert)| (path.clone(), (*cert).clone())).collect();
            let (known, opened) = (shas.known.clone(), Opened(shas.opening.clone()));
            let identity = identity.clone();
            tokio::task::spawn_blocking(move || {
                let _opened = opened;
                let shas = open_shas(&identity, &certs);
                known.lock().unwrap_or_else(|e| e.into_inner()).extend(shas);
            });
        }
        return None;
    }
    let certs: Vec<(String, hafleet_proto::SealedCert)> =
        unknown().map(|(path, cert)| (path.clone(), (*cert).clone())).collect();
    known.extend(open_shas(identity, &certs));
    let wanted: std::collections::HashSet<&str> = paths.iter().map(|(p, _)| p.as_str()).collect();
    known.retain(|path, _| wanted.contains(path.as_str()));
    for (path, _) in paths {
        // A key that does not open: its file is not checked.
        if let Some(Some(sha)) = known.get(&path) {
            files.push((format!("../{path}"), sha.clone()));
        }
    }
    Some(files)
}

/// The sha256 of each certificate's file (chain and opened key), by path; `None` for those
/// whose key does not open (they are not tried again).
fn open_shas(
    identity: &crate::core::identity::FleetIdentity,
    certs: &[(String, hafleet_proto::SealedCert)],
) -> Vec<(String, Option<String>)> {
    certs
        .iter()
        .map(|(path, cert)| {
            let sha =
                identity.cert_file(cert).ok().map(|f| hafleet_proto::sha256_hex(f.as_bytes()));
            (path.clone(), sha)
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::identity::testing::{KEY, sealed_with};

    /// A version of `certs` certificates sealed to `identity`, the `n`th differing by `salt`.
    fn with_certs(
        identity: &crate::core::identity::FleetIdentity,
        certs: usize,
        salt: &str,
    ) -> ConfigVersion {
        let recipient = identity.recipient();
        let certs = (0..certs)
            .map(|i| sealed_with(&recipient, KEY, format!("cert {i} {salt}").as_bytes()))
            .collect();
        let bundle = hafleet_proto::Bundle::new("global\n".into(), vec![], certs);
        ConfigVersion::inline(hafleet_proto::FleetName::new("edge").unwrap(), 1, bundle)
    }

    /// The files of `version` once the task that opens its keys is done (5 s at most).
    async fn worked_out(version: &ConfigVersion, settings: &RolloutSettings) -> ExpectedFiles {
        for _ in 0..500 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if let Some(files) = expected_files(version, settings) {
                return files;
            }
        }
        panic!("the keys were not worked out within 5 s");
    }

    /// Many keys to open (as after a start) are opened off the loop: the drift check is put
    /// off until they are; a rotation's one new key is opened at once.
    #[tokio::test]
    async fn many_keys_are_opened_off_the_loop_a_few_at_once() {
        let identity = std::sync::Arc::new(crate::core::identity::FleetIdentity::generate());
        let mut settings = super::super::against_fake::settings_for_tests();
        settings.tls_identity = Some(identity.clone());
        let version = with_certs(&identity, OPENED_INLINE + 4, "a");
        assert!(expected_files(&version, &settings).is_none(), "put off");
        let files = worked_out(&version, &settings).await;
        let certs: Vec<&(String, String)> =
            files.iter().filter(|(name, _)| name.starts_with("../")).collect();
        assert_eq!(certs.len(), OPENED_INLINE + 4);
        let bundle = version.bundle().unwrap();
        for (path, cert) in bundle.cert_paths() {
            let sha = hafleet_proto::sha256_hex(identity.cert_file(cert).unwrap().as_bytes());
            assert!(certs.contains(&&(format!("../{path}"), sha)), "{path}");
        }
        // One certificate more: opened in the loop, the others known.
        let one = with_certs(&identity, 1, "b");
        let mut certs_now = version.bundle().unwrap().certs.clone();
        certs_now.extend(one.bundle().unwrap().certs.iter().cloned());
        let rotated = ConfigVersion::inline(
            version.fleet.clone(),
            2,
            hafleet_proto::Bundle::new("global\n# 2\n".into(), vec![], certs_now),
        );
        let files = expected_files(&rotated, &settings).expect("at once");
        assert_eq!(files.iter().filter(|(n, _)| n.starts_with("../")).count(), OPENED_INLINE + 5);

        // Keys sealed to another identity: tried once (off the loop), then known not to open;
        // their files are not checked, and the checks are not put off again.
        let other = crate::core::identity::FleetIdentity::generate();
        let foreign = with_certs(&other, OPENED_INLINE + 2, "c");
        assert!(expected_files(&foreign, &settings).is_none(), "put off");
        let files = worked_out(&foreign, &settings).await;
        assert!(files.iter().all(|(n, _)| !n.starts_with("../")), "{files:?}");
    }
}
