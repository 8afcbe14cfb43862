//! Making a host ready for a version without changing what it serves: its state read, the
//! files it lacks uploaded (as edits where they can be) and checked, the config validated.

use super::*;

/// A host made ready for a version by [`prepare`]: connected, its state read, the version's
/// files uploaded and validated under an attempt's own names, nothing live changed yet.
/// [`finish`] puts it live; [`abandon`] removes the upload.
pub struct Prepared<'a> {
    pub(super) host: &'a Host,
    /// The session with the host; `None` if none could be opened.
    pub(super) conn: Option<Box<dyn HostOps>>,
    pub(super) step: Next,
    /// When preparing began.
    pub started: std::time::Instant,
    /// The live and loaded sha256 lines live_state.sh printed when it was prepared.
    pub(super) state: LiveShas,
}

impl Prepared<'_> {
    /// Staged for a change that swaps in the reload's own round trip, which checks that the
    /// host is as it was prepared. A reload that may be bridged to spares swaps first, on its
    /// own, and sends runtime commands to the worker of now: such a host is read again
    /// ([`refresh`]) like one taking a change through the runtime API.
    pub(super) fn reloads(&self) -> bool {
        matches!(&self.step, Next::Staged { change, bridge: None, .. } if matches!(**change, runtime::Plan::Reload(_)))
    }

    /// Whether going live checks, in its own round trip, that the host is as it was
    /// prepared: a reload that swaps in its round trip ([`Prepared::reloads`]), or a change
    /// whose runtime commands do (swap_runtime.sh, which checks the worker too).
    pub(super) fn checks_when_live(&self) -> bool {
        self.reloads()
            || matches!(&self.step, Next::Staged { change, .. } if runtime::swaps_with_commands(change))
    }
}

/// What [`finish`] has left to do.
pub(super) enum Next {
    /// Nothing: this is the outcome (unchanged, or a failure while preparing).
    Done(Result<ApplyOutcome, Failure>),
    /// The live file is the version, but HAProxy never loaded it: reload.
    ReloadOnly,
    /// The upload `token` passed its check: swap it in and make HAProxy take it, as `change`
    /// says.
    Staged {
        token: String,
        uploaded: Uploaded,
        change: std::sync::Arc<runtime::Plan>,
        bridge: Option<PendingBridge>,
    },
}

/// Whether a host being prepared goes live as soon as it can ([`prepare`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Nothing HAProxy serves changes: the host waits for its turn (a wave prepared while
    /// the canary goes live).
    Wait,
    /// The host goes live next (the canary, a lone host): a change the runtime API takes goes
    /// live in the upload's own round trip, once the upload passed its check.
    GoLive,
}

/// Connects to `host`, reads its state and uploads and validates what `version` needs there,
/// changing nothing HAProxy serves: a rollout prepares the first wave while the canary goes
/// live. Never fails: a failure is kept for [`finish`] to report. With [`Then::GoLive`], a
/// change the runtime API takes is live when this returns, and [`finish`] reads how it went.
#[tracing::instrument(skip_all, fields(host = %host.name, version = version.version))]
pub async fn prepare<'a>(
    host: &'a Host,
    version: &ConfigVersion,
    known: &[&ConfigVersion],
    settings: &RolloutSettings,
    then: Then,
) -> Prepared<'a> {
    let started = std::time::Instant::now();
    let left = prepare_as_left(host, version, known, settings, started, then).await;
    if let Some(prepared) = left {
        return prepared;
    }
    let mut names = String::new();
    for name in version.bundle().into_iter().flat_map(file_names) {
        names.push_str(&name);
        names.push('\n');
    }
    let (conn, state) = match settings.hosts.open(host, names.as_bytes()).await {
        Ok(c) => c,
        Err(failure) => {
            let step = Next::Done(Err(failure));
            return Prepared { host, conn: None, step, started, state: LiveShas::default() };
        }
    };
    let (step, state) = match state {
        Ok(state) => match stage(&*conn, host, version, &state, (known, settings), then).await {
            Ok(step) => (step, state.shas),
            Err(f) => (Next::Done(Err(f)), LiveShas::default()),
        },
        Err(f) => (Next::Done(Err(f)), LiveShas::default()),
    };
    Prepared { host, conn: Some(conn), step, started, state }
}

/// [`prepare`] without reading the host first, on the kept session, when the applier's last
/// apply there left a version it holds live and loaded with all of its files
/// ([`RolloutSettings::applied`]): the host is taken to be as that apply left it, so the files
/// it lacks are the new version's that the old one did not have, sent as edits of the old
/// one's. Going live checks that assumption as it checks any host prepared earlier (the
/// live and loaded sha256 in the swap's round trip: a host changed since is prepared again);
/// a host that does not take the upload (a file of the old version gone by hand, a session
/// that died) is prepared again at once, the usual way. `None`: no such apply, or a version
/// that is the one left there.
async fn prepare_as_left<'a>(
    host: &'a Host,
    version: &ConfigVersion,
    known: &[&ConfigVersion],
    settings: &RolloutSettings,
    started: std::time::Instant,
    then: Then,
) -> Option<Prepared<'a>> {
    let left = settings.applied.lock().unwrap_or_else(|e| e.into_inner()).remove(&host.name)?;
    let was = known.iter().find(|v| v.sha256 == left && v.sha256 != version.sha256)?.bundle()?;
    let bundle = version.bundle()?;
    let conn = settings.hosts.take_kept(host).await?;
    let missing = new_files(was, bundle);
    let shas = LiveShas { live: left.clone(), loaded: left };
    let state = LiveState { shas, missing };
    match stage(&*conn, host, version, &state, (known, settings), then).await {
        Ok(step) => Some(Prepared { host, conn: Some(conn), step, started, state: state.shas }),
        Err(failure) => {
            info!(stage = ?failure.stage, message = %failure.message,
                  "the host is not as the last apply left it; reading it first");
            conn.give_back(false).await;
            None
        }
    }
}

/// The names live_state.sh is asked about for `bundle`: its map files, and its certificate
/// files as paths from the maps' folder.
pub(super) fn file_names(bundle: &Bundle) -> impl Iterator<Item = String> + '_ {
    let maps = bundle.maps.iter().map(|m| m.name.as_str().to_owned());
    maps.chain(bundle.cert_paths().map(|(path, _)| format!("../{path}")))
}

/// The names of [`file_names`] that `bundle` has and `was` has not. Worked out from the maps'
/// names and the certificates' ids, with a name made only for what is new: a host of 10,000
/// certificates has one new a rotation.
pub(super) fn new_files(was: &Bundle, bundle: &Bundle) -> Vec<String> {
    use std::collections::HashSet;
    let maps: HashSet<&str> = was.maps.iter().map(|m| m.name.as_str()).collect();
    let maps = bundle.maps.iter().map(|m| m.name.as_str()).filter(|n| !maps.contains(n));
    let (had, ids) = (was.cert_ids(), bundle.cert_ids());
    let had: HashSet<&str> = had.iter().map(String::as_str).collect();
    let certs = ids.iter().filter(|id| !had.contains(id.as_str()));
    let certs = certs.map(|id| format!("../{}/{id}.pem", hafleet_proto::tls::CERTS_DIR));
    maps.map(str::to_owned).chain(certs).collect()
}

/// A host prepared ahead for the runtime API, made current when the rollout turns to it: its
/// files must still be what they were (else it is prepared again), and its `show proc` is
/// read again, so that the runtime API's worker is that of now, not of before the canary. (A
/// host prepared for a reload checks both in the reload's round trip: swap_reload.sh.)
pub(super) async fn refresh<'a>(
    mut prepared: Prepared<'a>,
    version: &ConfigVersion,
    known: &[&ConfigVersion],
    settings: &RolloutSettings,
) -> Prepared<'a> {
    let host = prepared.host;
    let (Some(conn), Next::Staged { .. }) = (&prepared.conn, &prepared.step) else {
        return prepared;
    };
    let before = match conn.refresh().await {
        Some(now) if now.shas == prepared.state => now.proc,
        _ => None,
    };
    match (before, &mut prepared.step) {
        (Some(before), Next::Staged { uploaded, .. }) => {
            uploaded.before = before;
            prepared
        }
        _ => {
            warn!(host = %host.name, "the host changed while the canary went live; preparing it again");
            abandon(prepared).await;
            prepare(host, version, known, settings, Then::GoLive).await
        }
    }
}

/// Drops a prepared host that must not go live (its rollout halted): removes its upload and
/// gives its connection back.
#[tracing::instrument(skip_all, fields(host = %prepared.host.name))]
pub async fn abandon(prepared: Prepared<'_>) {
    let Prepared { conn, step, .. } = prepared;
    let Some(conn) = conn else { return };
    if let Next::Staged { token, .. } = &step {
        conn.discard(token).await;
    }
    let healthy = !matches!(step, Next::Done(Err(_)));
    conn.give_back(healthy).await;
}

/// [`prepare`]'s work once `state` (what live_state.sh printed) is known.
pub(super) async fn stage(
    conn: &dyn HostOps,
    host: &Host,
    version: &ConfigVersion,
    state: &LiveState,
    (known, settings): (&[&ConfigVersion], &RolloutSettings),
    then: Then,
) -> Result<Next, Failure> {
    let tls_identity = settings.tls_identity.as_deref();
    let (live_sha, loaded_sha) = (state.shas.live(), state.shas.loaded());
    let missing: Vec<&str> = state.missing.iter().map(String::as_str).collect();
    match plan::host_plan(live_sha, loaded_sha, &version.sha256) {
        HostPlan::Unchanged => {
            // HAProxy runs this version, but files it loaded may be gone from the disk (a
            // restore, a hand): put them back, so that its next reload or restart finds them.
            // Nothing reloads.
            let Some(bundle) = version.bundle().filter(|_| !missing.is_empty()) else {
                return Ok(Next::Done(Ok(ApplyOutcome::Unchanged)));
            };
            let token = attempt_token(version.version);
            put_files(conn, bundle, &missing, &token, tls_identity).await?;
            info!(files = missing.len(), "files of the version were missing; put back, no reload");
            return Ok(Next::Done(Ok(ApplyOutcome::Applied)));
        }
        HostPlan::ReloadOnly => return Ok(Next::ReloadOnly),
        HostPlan::Full => {}
    }
    // What the change takes, when the applier holds the bundle HAProxy runs there.
    let loaded =
        known.iter().find(|v| live_sha == Some(v.sha256.as_str()) && loaded_sha == live_sha);
    let (change, bridge) =
        loaded.and_then(|loaded| settings.plans.get(loaded, version)).unwrap_or_else(|| {
            let why = "the applier does not hold the config HAProxy runs";
            (std::sync::Arc::new(runtime::Plan::Reload(why.into())), None)
        });
    let bridge = bridge.filter(|_| worth_bridging(settings, host));
    let loaded = loaded.and_then(|v| v.bundle());

    // A name of this attempt's own: a second applier (a rolling update, say) can never swap in
    // a file this one validated, or the other way round.
    let token = attempt_token(version.version);
    // A version that changes only map files and certificates (the config is the loaded one
    // but for their names) is checked by loading its maps and new certificate files alone:
    // the rest passed `haproxy -c` and loaded.
    let map_check = match (&*change, runtime::files_only(&change)) {
        (runtime::Plan::Runtime(steps), true) => version
            .bundle()
            .and_then(|b| runtime::map_check_config(b, &runtime::added_certs(steps))),
        (_, true) => version.bundle().and_then(|b| runtime::map_check_config(b, &[])),
        (_, false) => None,
    };
    // Going live next, a change whose runtime commands swap it in goes in the upload's round
    // trip: for the worker the host finds current, checked there as swap_runtime.sh checks.
    let swap = match (then, &*change) {
        (Then::GoLive, runtime::Plan::Runtime(steps)) if runtime::swaps_with_commands(&change) => {
            SwapPlan::new(steps).ok()
        }
        _ => None,
    };
    let session = swap.as_ref().map(|s| runtime::session(runtime::ANY_WORKER, &s.commands));
    let validate = UploadCheck {
        missing_maps: &missing,
        map_check: map_check.as_deref(),
        live: loaded,
        tls_identity,
        then: swap.as_ref().zip(session.as_ref()).map(|(swap, session)| ops::RuntimeSwap {
            token: &token,
            prepared: &state.shas,
            pid: None,
            maps: &swap.kinds,
            edited: &swap.edited,
            crt_list: swap.crt_list,
            session: session.as_bytes(),
        }),
    };
    match upload_and_validate(conn, host, version, &validate, &token).await {
        Ok(uploaded) => Ok(Next::Staged { token, uploaded, change, bridge }),
        Err(failure) => {
            // Leave no copy of a config that is not live behind (best effort).
            conn.discard(&token).await;
            Err(failure)
        }
    }
}

/// What an upload sends and how it is checked.
pub(super) struct UploadCheck<'a> {
    /// The version's map files the host does not have yet.
    pub(super) missing_maps: &'a [&'a str],
    /// A config that loads only the maps and new certificate files
    /// ([`runtime::map_check_config`]), for a version whose config HAProxy runs but for its
    /// maps and crt-list; `None`: `haproxy -c` on the whole config.
    pub(super) map_check: Option<&'a str>,
    /// The bundle whose config is the host's live file, if the applier holds it: a version
    /// that changes a few of its lines is sent as an edit of it.
    pub(super) live: Option<&'a Bundle>,
    /// Opens the version's certificate keys.
    pub(super) tls_identity: Option<&'a crate::core::identity::FleetIdentity>,
    /// A change that goes live in the upload's round trip, once the upload passed its check.
    pub(super) then: Option<ops::RuntimeSwap<'a>>,
}

/// What an upload leaves for the rest of the apply.
pub(super) struct Uploaded {
    /// `show proc` before the change.
    pub(super) before: plan::ProcState,
    /// The upload's stat (`%i %s %y`): a rename keeps it, so the live file having it later
    /// is the upload itself, and marking it loaded need not hash it again.
    pub(super) stat: Option<String>,
    /// Bytes sent (see [`Effort::sent_bytes`]).
    pub(super) sent: u64,
    /// What the change that went live with the upload answered ([`UploadCheck::then`]).
    pub(super) went_live: Option<ops::WentLive>,
}

/// Uploads the version under this attempt's name, checks what landed, validates it with
/// `haproxy -c`, and reads `show proc` for the reload check to come.
pub(super) async fn upload_and_validate(
    conn: &dyn HostOps,
    host: &Host,
    version: &ConfigVersion,
    check: &UploadCheck<'_>,
    token: &str,
) -> Result<Uploaded, Failure> {
    let missing = check.missing_maps;
    let Some(bundle) = version.bundle() else {
        return Err(fail(ApplyStage::Upload, "the version's bundle was not fetched"));
    };
    let maps = missing_maps(bundle, missing);
    // The certificate files the host lacks go in the same round trip as the maps when their
    // check is the maps' (a rotation: one file); many (a host joining) or with a whole
    // config to check, in round trips of their own first.
    let certs = missing_certs(bundle, missing);
    let fold = check.map_check.is_some() && certs.len() <= CERTS_PER_UPLOAD;
    let (prefix, certs_sent) = match fold && !certs.is_empty() {
        true => (open_certs(&certs, check.tls_identity)?, 0),
        false => {
            let sent = upload_certs(conn, bundle, missing, token, check.tls_identity).await?;
            (zeroize::Zeroizing::new(Vec::new()), sent)
        }
    };
    let folded = if fold { certs.len() } else { 0 };
    // The maps and the config in one round trip, as edits of the host's own where the applier
    // holds the bundle its live file is.
    let diffed = std::time::Instant::now();
    let outgoing = Outgoing::edited(&maps, &bundle.config, check.live);
    tracing::debug!(diff_ms = diffed.elapsed().as_secs_f64() * 1e3, "files to send worked out");
    let count = maps.len();
    // The upload's stat, the bytes sent, and `show proc`.
    let (sha256, then) = (version.sha256.as_str(), check.then);
    let check = match check.map_check {
        Some(check) => {
            info!(
                "the config is the running one but for its maps and certificates: checking \
                 those alone"
            );
            ops::UploadCheck::Maps { sha256, check, certs: folded, then }
        }
        None => ops::UploadCheck::Validated { sha256, then },
    };
    let ((out, went_live), bytes) = send(conn, token, check, count, (&prefix, &outgoing)).await?;
    let (stat, proc) = (out.stat, out.proc);
    let before = parse_show_proc(host, &proc, "").map_err(|m| fail(ApplyStage::Verify, m))?;
    Ok(Uploaded { before, stat, sent: certs_sent + bytes, went_live })
}

/// The map files of `bundle` that the host does not have yet (`missing` names them, among
/// certificate files).
pub(super) fn missing_maps<'a>(
    bundle: &'a Bundle,
    missing: &[&str],
) -> Vec<&'a hafleet_proto::MapFile> {
    let missing: std::collections::HashSet<&str> = missing.iter().copied().collect();
    bundle.maps.iter().filter(|m| missing.contains(m.name.as_str())).collect()
}

/// Uploads `maps` whole in one round trip (UPLOAD_MAPS), each checked on arrival.
pub(super) async fn upload_maps(
    conn: &dyn HostOps,
    maps: &[&hafleet_proto::MapFile],
    token: &str,
) -> Result<(), Failure> {
    if maps.is_empty() {
        return Ok(());
    }
    let stream = Outgoing::whole(maps, None).stream();
    conn.upload_maps(token, maps.len(), &stream).await
}

/// Uploads `outgoing` (its config and `maps` map files) under `token`, after `certs` (the
/// certificate files [`ops::UploadCheck::Maps`] counts, [`cert_stream`]'s records), checked as
/// `check` says. Files sent as edits that do not come out as the version's on the host (its
/// own file was not the one the edit was made from) are sent again whole, at once: the same
/// round trip again. Returns the host's answer and the bytes sent.
pub(super) async fn send(
    conn: &dyn HostOps,
    token: &str,
    check: ops::UploadCheck<'_>,
    maps: usize,
    (certs, outgoing): (&[u8], &Outgoing<'_>),
) -> Result<((answer::Uploaded, Option<ops::WentLive>), u64), Failure> {
    let run = |stream: Vec<u8>| async move {
        if certs.is_empty() {
            return conn.upload(token, check, maps, &stream).await;
        }
        // Sized once and zeroed after: the certificates' keys are in it.
        let mut all = zeroize::Zeroizing::new(Vec::with_capacity(certs.len() + stream.len()));
        all.extend_from_slice(certs);
        all.extend_from_slice(&stream);
        conn.upload(token, check, maps, &all).await
    };
    let stream = outgoing.stream();
    let bytes = (certs.len() + stream.len()) as u64;
    tracing::debug!(bytes, edits = outgoing.has_edits(), "files sent");
    match run(stream).await {
        Err(f) if f.exit == Some(Exit::Upload) && outgoing.has_edits() => {
            warn!(error = %f.message, "files sent as edits did not come out as the version's; sending them whole");
            let whole = outgoing.whole_again().stream();
            let more = (certs.len() + whole.len()) as u64;
            Ok((run(whole).await?, bytes + more))
        }
        done => Ok((done?, bytes)),
    }
}

/// A version's files on their way to a host: the map files it lacks and the config, each
/// whole or as an edit of the host's own (a map of the same kind, the live file), where the
/// applier holds the bundle the host's live file is and the edit is smaller (see
/// [`crate::core::patch`]).
pub(crate) struct Outgoing<'a> {
    /// Each map, and the map of the host's it is an edit of with the `sed` script.
    pub(crate) maps:
        Vec<(&'a hafleet_proto::MapFile, Option<(&'a hafleet_proto::MapName, String)>)>,
    /// The config, and the `sed` script that makes it from the live file.
    pub(crate) config: Option<(&'a str, Option<String>)>,
}

impl<'a> Outgoing<'a> {
    pub(crate) fn whole(maps: &[&'a hafleet_proto::MapFile], config: Option<&'a str>) -> Self {
        Outgoing {
            maps: maps.iter().map(|m| (*m, None)).collect(),
            config: config.map(|c| (c, None)),
        }
    }

    /// `maps` and `config`, as edits of what `live` (the bundle of the host's live file) has
    /// where that is smaller.
    pub(crate) fn edited(
        maps: &[&'a hafleet_proto::MapFile],
        config: &'a str,
        live: Option<&'a Bundle>,
    ) -> Self {
        let Some(live) = live else { return Self::whole(maps, Some(config)) };
        let base = |m: &hafleet_proto::MapFile| {
            live.maps.iter().find(|b| b.name.kind() == m.name.kind() && b.name != m.name)
        };
        let maps = maps
            .iter()
            .map(|m| {
                let edit = base(m).and_then(|b| {
                    crate::core::patch::sed_script(&b.content, &m.content)
                        .map(|script| (&b.name, script))
                });
                (*m, edit)
            })
            .collect();
        let edit = crate::core::patch::sed_script(&live.config, config);
        Outgoing { maps, config: Some((config, edit)) }
    }

    pub(super) fn has_edits(&self) -> bool {
        self.maps.iter().any(|(_, e)| e.is_some())
            || self.config.as_ref().is_some_and(|(_, e)| e.is_some())
    }

    /// The same files, all whole.
    pub(crate) fn whole_again(&self) -> Self {
        let maps: Vec<_> = self.maps.iter().map(|(m, _)| *m).collect();
        Self::whole(&maps, self.config.as_ref().map(|(c, _)| *c))
    }

    /// What upload_files.sh, upload_validate.sh and upload_maps.sh unpack: for each map,
    /// `hafleet-map <name> <sha256> <lines> <1 if it ends in a newline, else 0>` and its
    /// content, or `hafleet-map-edit <name> <sha256> <the host's map it edits> <lines> 1` and
    /// the `sed` script; then, with a config, `hafleet-config <lines> <1|0>` and the config, or
    /// `hafleet-config-edit <lines> 1` and the script that edits the live file. Lines are
    /// counted as awk reads them, so any text goes through whole; a map's sha256 is the one
    /// its name promises (the bundle was checked against it), and the config's is checked on
    /// arrival by the caller.
    pub(crate) fn stream(&self) -> Vec<u8> {
        let record = stream_record;
        let size = |text: &str, edit: Option<&String>| edit.map_or(text.len(), String::len) + 160;
        let size: usize = self
            .maps
            .iter()
            .map(|(m, e)| size(&m.content, e.as_ref().map(|(_, s)| s)))
            .sum::<usize>()
            + self.config.as_ref().map_or(0, |(c, e)| size(c, e.as_ref()));
        let mut out = Vec::with_capacity(size);
        for (map, edit) in &self.maps {
            let (name, digest) = (map.name.as_str(), map.name.digest());
            match edit {
                Some((base, script)) => {
                    let head = format!("hafleet-map-edit {name} {digest} {base}");
                    record(&mut out, &head, script);
                }
                None => record(&mut out, &format!("hafleet-map {name} {digest}"), &map.content),
            }
        }
        match &self.config {
            Some((_, Some(script))) => record(&mut out, "hafleet-config-edit", script),
            Some((config, None)) => record(&mut out, "hafleet-config", config),
            None => {}
        }
        out
    }
}

/// The certificates of `bundle` whose files `missing` names (`../hafleet-certs/<id>.pem`,
/// among map files): those the host does not have yet.
pub(super) fn missing_certs<'a>(
    bundle: &'a Bundle,
    missing: &[&str],
) -> Vec<&'a hafleet_proto::SealedCert> {
    if !missing.iter().any(|name| name.starts_with("../")) {
        return Vec::new();
    }
    missing
        .iter()
        .filter_map(|name| name.strip_prefix("../"))
        .filter_map(|path| bundle.cert_by_path(path))
        .collect()
}

/// The files of `certs` (chain and key, the key opened with `identity`) as UPLOAD_CERTS's
/// records ([`cert_stream`]). The opened keys exist only in this process's memory (zeroed
/// after) and in the files on the host.
pub(super) fn open_certs(
    certs: &[&hafleet_proto::SealedCert],
    identity: Option<&crate::core::identity::FleetIdentity>,
) -> Result<zeroize::Zeroizing<Vec<u8>>, Failure> {
    let Some(identity) = identity else {
        return Err(fail(
            ApplyStage::Upload,
            "the version has TLS certificates and this applier has no --tls-identity to open \
             their keys",
        ));
    };
    let mut files = Vec::with_capacity(certs.len());
    for cert in certs {
        let file = identity.cert_file(cert).map_err(|e| fail(ApplyStage::Upload, e.to_string()))?;
        files.push((format!("{}.pem", cert.id()), file));
    }
    cert_stream(&files).map_err(|e| fail(ApplyStage::Upload, e))
}

/// Writes the certificate files of `bundle` that the host does not have yet (`missing` names
/// them `../hafleet-certs/<id>.pem`) in round trips of their own (UPLOAD_CERTS), at most
/// [`CERTS_PER_UPLOAD`] keys opened in memory at once: each sent over SSH, written 0600 in a
/// 0700 folder and checked on arrival. Returns the bytes sent.
pub(super) async fn upload_certs(
    conn: &dyn HostOps,
    bundle: &Bundle,
    missing: &[&str],
    token: &str,
    identity: Option<&crate::core::identity::FleetIdentity>,
) -> Result<u64, Failure> {
    let mut sent = 0;
    for batch in missing_certs(bundle, missing).chunks(CERTS_PER_UPLOAD) {
        let stream = open_certs(batch, identity)?;
        conn.upload_certs(token, batch.len(), &stream).await?;
        sent += stream.len() as u64;
    }
    Ok(sent)
}

/// Certificate files sent in one UPLOAD_CERTS round trip, at most.
pub(super) const CERTS_PER_UPLOAD: usize = 1000;

/// UPLOAD_CERTS's input: for each (name, content), `hafleet-cert <name> <sha256> <lines>` and
/// the content. Contents are PEM text: lines ending in a newline, no carriage return.
pub(crate) fn cert_stream(
    files: &[(String, zeroize::Zeroizing<String>)],
) -> Result<zeroize::Zeroizing<Vec<u8>>, String> {
    // Sized once: a Vec that grows leaves copies of the keys in the memory it gives back.
    let headers: usize = files.iter().map(|(name, _)| name.len() + 64 + 40).sum();
    let bodies: usize = files.iter().map(|(_, content)| content.len()).sum();
    let mut out = zeroize::Zeroizing::new(Vec::with_capacity(headers + bodies));
    let capacity = out.capacity();
    for (name, content) in files {
        let is_name = name.strip_suffix(".pem").is_some_and(|id| {
            !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if !is_name || !content.ends_with('\n') || content.contains('\r') {
            return Err(format!("certificate file {name} is not PEM lines"));
        }
        let sha = hafleet_proto::sha256_hex(content.as_bytes());
        let lines = content.lines().count();
        out.extend_from_slice(format!("hafleet-cert {name} {sha} {lines}\n").as_bytes());
        out.extend_from_slice(content.as_bytes());
    }
    debug_assert_eq!(out.capacity(), capacity, "never reallocated");
    Ok(out)
}

/// `v<version>-<pid>-<nanoseconds>`: unique per attempt, and only `[a-z0-9-]`.
pub(super) fn attempt_token(version: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("v{version}-{}-{nanos}", std::process::id())
}

/// Appends a record of the upload stream (see [`Outgoing::stream`]) to `out`: `<head> <lines>
/// <1 if `content` ends in a newline, else 0>`, then `content`. Lines are counted as awk reads
/// them, so any text goes through whole.
pub(crate) fn stream_record(out: &mut Vec<u8>, head: &str, content: &str) {
    let lines = content.matches('\n').count()
        + usize::from(!content.ends_with('\n') && !content.is_empty());
    let newline = u8::from(content.ends_with('\n'));
    out.extend_from_slice(format!("{head} {lines} {newline}\n").as_bytes());
    out.extend_from_slice(content.as_bytes());
    if !content.is_empty() && newline == 0 {
        out.push(b'\n');
    }
}
