//! The applier's loop: take the fleet's newest config version, roll it out, report per host.
//!
//! HAProxy only ever needs the newest config: at start-up the applier rolls out the newest
//! version on its subject, and any version older than the newest is acked and skipped. Hosts
//! that failed in a way that may pass (unreachable, a dropped upload, a slow reload) get the
//! same version again after `--retry`, until a newer one arrives. Hosts that could not be
//! reached are retried with the same version after `--retry`, until a newer one arrives.

use super::inventory_watch::{self, InventoryWatch};
use crate::adapters::bus;
use crate::core::inventory::{self, Host};
use crate::host::conn::{ConnPool, SshSettings};
use crate::host::ssh::SshHosts;
use crate::rollout::{self, RolloutSettings};
use anyhow::Context as _;
use async_nats::jetstream;
use futures::StreamExt;
use hafleet_proto::{
    ApplyOutcome, ApplyReport, ApplyStage, ConfigVersion, FleetName, SCHEMA_VERSION,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;
use tracing::{debug, error, info, warn};

/// Settings of `hafleet-applier`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The fleet this applier owns; it applies `hafleet.configs.<fleet>` to the inventory's hosts.
    #[arg(long, env = "HAFLEET_FLEET")]
    pub fleet: FleetName,
    /// TOML file listing the fleet's HAProxy hosts (see docs/install.md for its fields). Read
    /// again on SIGHUP and whenever it changes: hosts put in get the current version at once,
    /// hosts taken out get no more; a text that does not parse is refused and logged.
    #[arg(long, env = "HAFLEET_INVENTORY")]
    pub inventory: PathBuf,
    #[command(flatten)]
    pub nats: hafleet_runtime::NatsArgs,
    #[command(flatten)]
    pub health: hafleet_runtime::health::HealthArgs,
    /// Private key the applier logs in to hosts with.
    #[arg(long, env = "HAFLEET_SSH_IDENTITY")]
    pub ssh_identity: PathBuf,
    /// known_hosts file holding every host's key. Checked strictly: a host whose key is missing
    /// or different is refused, never added.
    #[arg(long, env = "HAFLEET_SSH_KNOWN_HOSTS")]
    pub ssh_known_hosts: PathBuf,
    /// The renderer's ed25519 public key (PEM, `openssl pkey -in signing.pem -pubout`); may be
    /// given more than once (comma-separated in the environment) while the renderer's key is
    /// being replaced. A version not signed by one of these keys is refused before any host is
    /// touched, and reported at stage `signature`.
    #[arg(
        long = "verify-key",
        env = "HAFLEET_VERIFY_KEY",
        value_delimiter = ',',
        required_unless_present = "verify_keys_old"
    )]
    pub verify_keys: Vec<PathBuf>,
    /// Deprecated: HAFLEET_VERIFY_KEY's old name.
    #[arg(
        long = "verify-keys",
        env = "HAFLEET_VERIFY_KEYS",
        value_delimiter = ',',
        hide = true,
        conflicts_with = "verify_keys"
    )]
    pub verify_keys_old: Vec<PathBuf>,
    /// How long to wait for an SSH connection (a bare number of seconds is deprecated).
    #[arg(long, env = "HAFLEET_SSH_CONNECT_TIMEOUT", default_value = "10s",
          value_parser = hafleet_runtime::settings::duration_or_seconds)]
    pub ssh_connect_timeout: hafleet_runtime::settings::OrSeconds,
    /// How long any one remote command (upload, `haproxy -c`, a master CLI session…) may take
    /// before it counts as failed.
    #[arg(long, env = "HAFLEET_REMOTE_TIMEOUT", default_value = "2m",
          value_parser = hafleet_runtime::settings::duration)]
    pub remote_timeout: Duration,
    /// Deprecated: --remote-timeout in seconds.
    #[arg(
        long,
        env = "HAFLEET_REMOTE_TIMEOUT_SECS",
        hide = true,
        conflicts_with = "remote_timeout"
    )]
    pub remote_timeout_secs: Option<u64>,
    /// Hosts updated at once after the canary (the first host in inventory order that can be
    /// reached) succeeded.
    #[arg(long, env = "HAFLEET_PARALLELISM", default_value_t = 2)]
    pub parallelism: usize,
    /// How long a reload may take before it counts as failed and is rolled back.
    #[arg(long, env = "HAFLEET_RELOAD_TIMEOUT", default_value = "10s",
          value_parser = hafleet_runtime::settings::duration)]
    pub reload_timeout: Duration,
    /// Deprecated: --reload-timeout in milliseconds.
    #[arg(long, env = "HAFLEET_RELOAD_TIMEOUT_MS", hide = true, conflicts_with = "reload_timeout")]
    pub reload_timeout_ms: Option<u64>,
    /// How long a host's HTTP probes (inventory `probes`) may take to pass after a version
    /// goes live there, before the host is rolled back to last-known-good.
    #[arg(long, env = "HAFLEET_PROBE_TIMEOUT", default_value = "10s",
          value_parser = hafleet_runtime::settings::duration)]
    pub probe_timeout: Duration,
    /// Deprecated: --probe-timeout in seconds.
    #[arg(long, env = "HAFLEET_PROBE_TIMEOUT_SECS", hide = true, conflicts_with = "probe_timeout")]
    pub probe_timeout_secs: Option<u64>,
    /// How often to check that each host still runs the version it was given: its live
    /// config, the config HAProxy last loaded, its map files and its certificate files. 0s:
    /// never check.
    #[arg(long, env = "HAFLEET_DRIFT_CHECK", default_value = "30s",
          value_parser = hafleet_runtime::settings::duration)]
    pub drift_check: Duration,
    /// Deprecated: --drift-check in seconds.
    #[arg(long, env = "HAFLEET_DRIFT_CHECK_SECS", hide = true, conflicts_with = "drift_check")]
    pub drift_check_secs: Option<u64>,
    /// What to do with a host that drifted: `repair` puts the version back (through the
    /// runtime API, or a reload, as for any version) and reports what it found; `report` only
    /// reports it (outcome failed at stage drift), once per finding.
    #[arg(long, env = "HAFLEET_DRIFT_POLICY", value_enum, default_value_t = DriftPolicy::Repair)]
    pub drift_policy: DriftPolicy,
    /// How long before hosts that failed in a way that may pass (unreachable, dropped
    /// connection, slow reload) get the current version again.
    #[arg(long, env = "HAFLEET_RETRY", default_value = "30s",
          value_parser = hafleet_runtime::settings::duration)]
    pub retry: Duration,
    /// Deprecated: --retry in seconds.
    #[arg(long, env = "HAFLEET_RETRY_SECS", hide = true, conflicts_with = "retry")]
    pub retry_secs: Option<u64>,
    /// The fleet's TLS identity (`hafleet keygen --out FILE`; keep it 0600): opens the
    /// private keys the watcher sealed to this fleet, to write each certificate's file on the
    /// hosts (0600, next to the config in hafleet-certs/). Without it a version that has
    /// certificates fails at upload on every host, and nothing changes.
    #[arg(long, env = "HAFLEET_TLS_IDENTITY")]
    pub tls_identity: Option<PathBuf>,
}

impl RunArgs {
    /// Takes the deprecated spellings of settings into the current ones; returns what was
    /// used, to log.
    pub fn settle(&mut self) -> hafleet_runtime::settings::Deprecations {
        let (ms, s) = (Duration::from_millis(1), Duration::from_secs(1));
        let mut d = hafleet_runtime::settings::Deprecations::default();
        let connect = d.seconds(self.ssh_connect_timeout, "ssh-connect-timeout");
        self.ssh_connect_timeout =
            hafleet_runtime::settings::OrSeconds { value: connect, bare: false };
        let names = ("remote-timeout-secs", "remote-timeout");
        d.renamed(self.remote_timeout_secs.take(), s, &mut self.remote_timeout, names);
        let names = ("reload-timeout-ms", "reload-timeout");
        d.renamed(self.reload_timeout_ms.take(), ms, &mut self.reload_timeout, names);
        let names = ("probe-timeout-secs", "probe-timeout");
        d.renamed(self.probe_timeout_secs.take(), s, &mut self.probe_timeout, names);
        let names = ("drift-check-secs", "drift-check");
        d.renamed(self.drift_check_secs.take(), s, &mut self.drift_check, names);
        d.renamed(self.retry_secs.take(), s, &mut self.retry, ("retry-secs", "retry"));
        let old = std::mem::take(&mut self.verify_keys_old);
        d.renamed_env(&old, &mut self.verify_keys, ("HAFLEET_VERIFY_KEYS", "HAFLEET_VERIFY_KEY"));
        d
    }
}

pub async fn run(mut args: RunArgs) -> anyhow::Result<()> {
    args.settle().log();
    hafleet_runtime::install_shutdown_handler();
    let health = hafleet_runtime::health::start(
        &args.health,
        "starting: inventory, streams, start-up convergence",
    )
    .await?;
    let (mut inventory, mut hosts) = InventoryWatch::start(args.inventory.clone())?;
    for path in [&args.ssh_identity, &args.ssh_known_hosts] {
        anyhow::ensure!(path.is_file(), "{} does not exist or is not a file", path.display());
    }
    let verifier = load_verifier(&args.verify_keys)?;
    // One applier per fleet: its series say which, so two fleets' `lb-1` never collide.
    hafleet_runtime::health::Health::global().label_all("fleet", args.fleet.as_str());
    let tls_identity = match &args.tls_identity {
        Some(path) => {
            let text = zeroize::Zeroizing::new(
                std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read the TLS identity {}", path.display()))?,
            );
            let id = crate::core::identity::FleetIdentity::from_text(&text)
                .map_err(|e| anyhow::anyhow!("TLS identity {}: {e}", path.display()))?;
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path)?.permissions().mode();
            if mode & 0o077 != 0 {
                warn!(path = %path.display(), mode = format!("{:o}", mode & 0o777),
                      "the TLS identity is readable by others than its owner: chmod 600 it");
            }
            info!(recipient = %id.recipient(), "opening TLS keys sealed to this recipient");
            Some(std::sync::Arc::new(id))
        }
        None => None,
    };
    info!(keys = ?verifier.key_ids(), "applying only versions signed by these keys");
    let control_dir = tempfile::Builder::new().prefix("hafleet-applier-ssh").tempdir()?;
    let mut settings = RolloutSettings {
        hosts: Box::new(SshHosts::new(ConnPool::new(
            SshSettings::new(
                args.ssh_identity.clone(),
                args.ssh_known_hosts.clone(),
                args.ssh_connect_timeout.value,
                control_dir.path().to_owned(),
            )
            .context("cannot write the applier's ssh_config")?
            .with_command_timeout(args.remote_timeout.max(Duration::from_secs(1))),
        ))),
        parallelism: args.parallelism,
        reload_timeout: args.reload_timeout,
        probe_timeout: args.probe_timeout,
        fleet_hosts: hosts.len(),
        tls_identity,
        reload_times: Default::default(),
        cert_shas: Default::default(),
        drift_files: Default::default(),
        plans: Default::default(),
        applied: Default::default(),
    };

    let bus = args.nats.connect_as_applier(&args.fleet).await?;
    bus.ensure_stream(hafleet_proto::REPORTS).await?;
    // Only the renderer may create the configs stream: an applier that could would choose how
    // it is configured (one that republishes every fleet's configs, say).
    let configs = bus.open_stream(hafleet_proto::CONFIGS).await?;
    let consumer = bus::configs_consumer(&configs, &args.fleet).await?;
    let mut messages = consumer.messages().await.context("cannot pull from the configs stream")?;
    info!(fleet = %args.fleet, hosts = hosts.len(), "applier running");

    let retry_every = args.retry.max(Duration::from_secs(1));
    let mut retry: Option<(ConfigVersion, Vec<usize>)> = None;
    // The last versions rolled out, whole: a host that runs one of them may take the next
    // through HAProxy's runtime API instead of a reload.
    let mut known = Known::default();
    // The newest version rolled out; anything older that arrives later is superseded.
    let mut done: u64 = 0;
    // Hosts whose last apply of the newest version succeeded: the ones a drift check compares
    // with it (a host that refused or rolled back that version is not expected to run it).
    let mut in_sync: BTreeSet<usize> = BTreeSet::new();

    // Converge at once on start-up, whatever a previous run left in flight: hosts already on
    // the newest version just report Unchanged.
    let newest =
        hafleet_runtime::nats::retrying("JetStream to read the fleet's newest version", || {
            bus::latest_version(&configs, &args.fleet)
        })
        .await?;
    if let Some((version, Err(e))) = newest.as_ref().map(|v| (v, verifier.verify(&args.fleet, v))) {
        refuse(&bus, &hosts, version, &e).await;
    } else if let Some(version) = newest {
        // A bundle that cannot be read (a body that does not match, chunks gone) must not stop
        // the applier: the consumer brings the versions that can.
        match bus.fetch_bundle(version).await {
            Ok(version) => {
                info!(version = version.version, "converging on the newest version at start-up");
                let rolled =
                    apply_and_report(&bus, &hosts, &version, &known, &settings, None).await;
                done = version.version;
                known.push(version.clone());
                in_sync = rolled.live.into_iter().collect();
                retry = (!rolled.retry.is_empty()).then_some((version, rolled.retry));
            }
            Err(e) => error!(error = ?anyhow::Error::from(e),
                             "cannot read the newest version's bundle; waiting for the next"),
        }
    }

    health.ready();
    let shutdown = hafleet_runtime::shutdown_signal();
    tokio::pin!(shutdown);
    let drift_every = args.drift_check.max(Duration::from_secs(1));
    let mut drift_timer =
        tokio::time::interval_at(tokio::time::Instant::now() + drift_every, drift_every);
    drift_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut drift_reported = BTreeMap::new();
    // A timer of its own: a sleep made anew at each turn of the loop would never end while
    // drift checks (every --drift-check, 30 s by default like --retry) come first.
    let mut retry_timer =
        tokio::time::interval_at(tokio::time::Instant::now() + retry_every, retry_every);
    retry_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The hosts a drift check has yet to read this round, the next one last. One host is
    // checked per turn of the loop, after anything else that is ready (`biased`): a version
    // that comes during a round waits for at most one host's read (about 0.75 s at 10,000
    // certificates), not the round's, and ends the round (the hosts it goes to are read anew
    // at the next one).
    let mut drift_due: Vec<usize> = Vec::new();
    loop {
        let next = tokio::select! {
            biased;
            m = messages.next() => {
                drift_due.clear();
                m
            }
            _ = drift_timer.tick(), if !args.drift_check.is_zero() && !known.0.is_empty() => {
                drift_due = in_sync.iter().rev().copied().collect();
                continue;
            }
            _ = retry_timer.tick(), if retry.is_some() => {
                let (version, unreached) = retry.take().expect("guarded by if");
                let subset = rollout::followers(unreached.iter().map(|&i| hosts[i].clone()));
                info!(version = version.version, hosts = subset.len(), "retrying hosts");
                let rolled = apply_and_report(&bus, &subset, &version, &known, &settings, None).await;
                if Some(version.version) == known.0.last().map(|v| v.version) {
                    in_sync.extend(rolled.live.iter().map(|&i| unreached[i]));
                }
                let left: Vec<usize> = rolled.retry.into_iter().map(|i| unreached[i]).collect();
                if !left.is_empty() {
                    retry = Some((version, left));
                }
                continue;
            }
            new_hosts = inventory.next() => {
                let change = inventory::reread(&hosts, &new_hosts);
                if !change.changes_anything() {
                    continue;
                }
                inventory_watch::count("applied");
                let fresh: Vec<&str> = change.fresh.iter().map(|&i| new_hosts[i].name.as_str()).collect();
                info!(hosts = new_hosts.len(), ?fresh, removed = ?change.removed, "inventory re-read");
                for gone in &change.removed {
                    hafleet_runtime::health::Health::global().forget("host", gone.as_str());
                }
                let moved = |i: &usize| change.moved[*i];
                in_sync = in_sync.iter().filter_map(moved).collect();
                drift_reported = std::mem::take(&mut drift_reported)
                    .into_iter()
                    .filter_map(|(i, found)| moved(&i).map(|j| (j, found)))
                    .collect();
                retry = retry.take().and_then(|(version, left)| {
                    let left: Vec<usize> = left.iter().filter_map(moved).collect();
                    (!left.is_empty()).then_some((version, left))
                });
                hosts = new_hosts;
                settings.fleet_hosts = hosts.len();
                settings.hosts.keep_only(&hosts).await;
                // New and changed hosts get the fleet's current version now.
                if let Some(current) = known.0.last().cloned().filter(|_| !change.fresh.is_empty()) {
                    let subset = rollout::followers(change.fresh.iter().map(|&i| hosts[i].clone()));
                    let rolled = apply_and_report(&bus, &subset, &current, &known, &settings, None).await;
                    in_sync.extend(rolled.live.iter().map(|&i| change.fresh[i]));
                    let left: Vec<usize> = rolled.retry.into_iter().map(|i| change.fresh[i]).collect();
                    match &mut retry {
                        Some((v, pending)) if v.version == current.version => pending.extend(left),
                        _ if left.is_empty() => {}
                        _ => retry = Some((current, left)),
                    }
                }
                continue;
            }
            _ = &mut shutdown => break,
            _ = std::future::ready(()), if !drift_due.is_empty() && !known.0.is_empty() => {
                let i = drift_due.pop().expect("guarded by if");
                let current = known.0.last().expect("guarded by if");
                let context = (args.drift_policy, &mut in_sync, &mut drift_reported);
                check_drift(&bus, &hosts, current, &known, &settings, context, i).await;
                continue;
            }
        };
        let msg = match next {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                warn!(error = %e, "configs stream hiccup; continuing");
                continue;
            }
            None => break,
        };
        let decoded = ConfigVersion::decode(&msg.payload).map(|v| {
            let signed = verifier.verify(&args.fleet, &v);
            (v, signed)
        });
        match decoded {
            Ok((version, _)) if version.fleet != args.fleet => {
                warn!(got = %version.fleet, "config of another fleet on this fleet's subject; skipped");
            }
            Ok((version, _)) if version.version <= done => {
                info!(version = version.version, done, "already rolled out or superseded; skipped");
            }
            Ok((version, Err(e))) => refuse(&bus, &hosts, &version, &e).await,
            Ok((version, Ok(()))) => {
                // Only a version the renderer signed can supersede another: a forged newer
                // one must not hold the fleet back.
                // Unreadable for now (a stream between leaders): this one is not known to be
                // superseded, so it goes out.
                let newest = match bus::latest_version(&configs, &args.fleet).await {
                    Ok(newest) => newest.filter(|n| verifier.verify(&args.fleet, n).is_ok()),
                    Err(e) => {
                        warn!(error = ?anyhow::Error::from(e), "cannot read the newest version; going on");
                        None
                    }
                };
                let version = if newest.as_ref().is_some_and(|n| n.version > version.version) {
                    info!(version = version.version, "superseded by a newer version; skipped");
                    None
                } else {
                    match bus.fetch_bundle(version).await {
                        Ok(v) => Some(v),
                        Err(e) => {
                            // Not acked: it comes again after the ack wait, or a newer one does.
                            error!(error = ?anyhow::Error::from(e), "cannot fetch the version's bundle; will retry");
                            let _ = msg.ack_with(jetstream::AckKind::Nak(Some(retry_every))).await;
                            continue;
                        }
                    }
                };
                if let Some(version) = version {
                    let rolled = {
                        let work =
                            apply_and_report(&bus, &hosts, &version, &known, &settings, None);
                        tokio::pin!(work);
                        // Keep the message ours while the rollout runs.
                        let mut progress = tokio::time::interval(bus::ACK_WAIT / 4);
                        progress.tick().await;
                        loop {
                            tokio::select! {
                                rolled = &mut work => break rolled,
                                _ = progress.tick() => {
                                    let _ = msg.ack_with(jetstream::AckKind::Progress).await;
                                }
                            }
                        }
                    };
                    done = version.version;
                    known.push(version.clone());
                    in_sync = rolled.live.into_iter().collect();
                    retry = (!rolled.retry.is_empty()).then_some((version, rolled.retry));
                }
            }
            Err(e) => error!(error = %e, "config message refused"),
        }
        if let Err(e) = msg.ack().await {
            warn!(error = %e, "ack failed; the version will come again and be skipped");
        }
    }
    info!("applier stopping");
    settings.hosts.close_all().await;
    bus.drain().await;
    Ok(())
}

/// The trusted public keys from their files.
fn load_verifier(paths: &[PathBuf]) -> anyhow::Result<hafleet_proto::Verifier> {
    let texts = paths
        .iter()
        .map(|p| {
            std::fs::read_to_string(p)
                .with_context(|| format!("cannot read the verify key {}", p.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    hafleet_proto::Verifier::from_pems(texts.iter().map(String::as_str)).with_context(|| {
        let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        format!("cannot use the verify keys {}", names.join(", "))
    })
}

/// Reports `version` refused on every host, which none of them was touched for.
async fn refuse(
    bus: &bus::Bus,
    hosts: &[Host],
    version: &ConfigVersion,
    why: &hafleet_proto::SignatureError,
) {
    error!(fleet = %version.fleet, version = version.version, error = %why, "version refused");
    if let hafleet_proto::SignatureError::OtherFleet { .. } = why {
        // Reports name the version's fleet, whose subjects are not this applier's.
        return;
    }
    let outcome = ApplyOutcome::Failed {
        stage: ApplyStage::Signature,
        message: why.to_string(),
        restored: false,
    };
    for host in hosts {
        let now = (hafleet_runtime::now_unix_ms(), Duration::ZERO, Default::default());
        let report = report_of(host, version, outcome.clone(), now, None, hosts.len());
        send_report(bus, &report).await;
    }
}

/// Counts `report` in the metrics and publishes it; `false` if it was lost (logged).
async fn send_report(bus: &bus::Bus, report: &ApplyReport) -> bool {
    count_report(report);
    match bus::publish_report(bus, report).await {
        Ok(()) => true,
        Err(e) => {
            warn!(host = %report.host, version = report.version, error = ?anyhow::Error::from(e), "report lost");
            false
        }
    }
}

/// What the applier does about a host that drifted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DriftPolicy {
    Repair,
    Report,
}

/// Checks host `i` against `version` if it is in `in_sync` (its last apply of `version`
/// succeeded); repairs or reports what differs, as `policy` says. A repair that fails takes
/// the host out of `in_sync`. `reported` keeps what was last reported per host, so a finding
/// left as it is is reported once.
async fn check_drift(
    bus: &bus::Bus,
    hosts: &[Host],
    version: &ConfigVersion,
    known: &Known,
    settings: &RolloutSettings,
    (policy, in_sync, reported): (DriftPolicy, &mut BTreeSet<usize>, &mut BTreeMap<usize, String>),
    i: usize,
) {
    if !in_sync.contains(&i) || i >= hosts.len() {
        return;
    }
    let host = &hosts[i];
    let drift = match rollout::drift_of(host, version, settings).await {
        Ok((drift, nodes)) => {
            node_checks_seen(host.name.as_str(), nodes.as_ref());
            match drift {
                Some(drift) => drift,
                None => {
                    reported.remove(&i);
                    return;
                }
            }
        }
        Err(e) => {
            debug!(host = %host.name, error = %e, "drift check skipped: host not readable");
            return;
        }
    };
    let found = &drift.found;
    match policy {
        DriftPolicy::Repair => {
            warn!(host = %host.name, version = version.version, %found, "drift; repairing");
            // Map and certificate files first, renamed over in place: an apply finds
            // missing files, not changed ones.
            let started = std::time::Instant::now();
            let outcome = if drift.files.is_empty() {
                ApplyOutcome::Applied
            } else {
                rollout::put_back_files(host, version, &drift.files, settings).await
            };
            let put_back = !matches!(outcome, ApplyOutcome::Failed { .. });
            // An apply uploads missing files only: after a failed put-back it could load a
            // changed one.
            if drift.beyond_files && put_back {
                let one = std::slice::from_ref(host);
                let rolled =
                    apply_and_report(bus, one, version, known, settings, Some(found)).await;
                if rolled.live.is_empty() {
                    in_sync.remove(&i);
                }
                return;
            }
            match &outcome {
                ApplyOutcome::Failed { message, .. } => {
                    warn!(host = %host.name, version = version.version, %message, "files not put back; the host waits for the next version")
                }
                _ => {
                    info!(host = %host.name, version = version.version, files = drift.files.len(), "files put back; no reload")
                }
            }
            let now = (hafleet_runtime::now_unix_ms(), started.elapsed(), Default::default());
            let report = report_of(host, version, outcome, now, Some(found), settings.fleet_hosts);
            send_report(bus, &report).await;
            if !put_back {
                in_sync.remove(&i);
            }
        }
        DriftPolicy::Report if reported.get(&i) != Some(found) => {
            warn!(host = %host.name, version = version.version, %found, "drift; reporting only");
            let outcome = ApplyOutcome::Failed {
                stage: ApplyStage::Drift,
                message: found.clone(),
                restored: false,
            };
            let now = (hafleet_runtime::now_unix_ms(), Duration::ZERO, Default::default());
            let report = report_of(host, version, outcome, now, Some(found), settings.fleet_hosts);
            if send_report(bus, &report).await {
                reported.insert(i, found.clone());
            }
        }
        DriftPolicy::Report => {}
    }
}

/// Sets `host`'s node-check gauges from what its drift check read, and warns when every node
/// it checks fails: then every `Cluster` Service answers 503 there, and the likely cause is a
/// host that cannot reach the nodes' health port, not the nodes.
fn node_checks_seen(host: &str, nodes: Option<&crate::core::plan::NodeChecks>) {
    let m = hafleet_runtime::health::Health::global();
    let (down, checked) = nodes.map_or((f64::NAN, f64::NAN), |n| (n.down as f64, n.checked as f64));
    m.gauge(
        (
            "hafleet_applier_nodes_checked",
            "Nodes each host health-checks (NaN: node health checks off), as its last drift \
             check read them.",
        ),
        &[("host", host)],
        checked,
    );
    m.gauge(
        (
            "hafleet_applier_nodes_down",
            "Nodes whose health check fails on each host, as its last drift check read them; \
             alert when it equals hafleet_applier_nodes_checked.",
        ),
        &[("host", host)],
        down,
    );
    match nodes {
        Some(n) if n.checked > 0 && n.down == n.checked => warn!(
            host = %host,
            down = n.down,
            example = n.example.as_deref().unwrap_or_default(),
            "every node's health check fails on this host, so every Cluster Service answers 503 \
             there: can it reach the nodes' health port (the renderer's --node-health-port; 0 \
             turns node health checks off)?"
        ),
        Some(n) if n.down > 0 => debug!(
            host = %host,
            down = n.down,
            checked = n.checked,
            example = n.example.as_deref().unwrap_or_default(),
            "nodes failing their health check"
        ),
        _ => {}
    }
}

/// The two versions rolled out last, bundles included (a few MB each at 10,000 Ingresses).
#[derive(Debug, Default)]
struct Known(Vec<ConfigVersion>);

impl Known {
    fn push(&mut self, version: ConfigVersion) {
        self.0.retain(|v| v.sha256 != version.sha256);
        self.0.push(version);
        if self.0.len() > 2 {
            self.0.remove(0);
        }
    }
}

/// Sets, for `host`, the earliest notAfter among the certificates of `version` (which it now
/// runs); NaN when the version has none.
fn tls_expiry_gauge(host: &str, version: &ConfigVersion) {
    let earliest = version.bundle().and_then(|b| b.certs.iter().map(|c| c.not_after_unix).min());
    hafleet_runtime::health::Health::global().gauge(
        (
            "hafleet_applier_tls_earliest_not_after_seconds",
            "The earliest notAfter (Unix seconds) of the certificates each host serves, as last \
             applied (NaN: none); alert on it minus time().",
        ),
        &[("host", host)],
        earliest.map_or(f64::NAN, |t| t as f64),
    );
}

/// Notes that `version` was rolled out (and, with `host`, that the host runs it), and sets
/// each host's `hafleet_applier_host_behind_versions`: how many versions older than the newest
/// rolled out is what it runs (0: the newest; unset until it ran one).
fn behind(host: Option<&str>, version: u64) {
    static LIVE: std::sync::Mutex<(u64, BTreeMap<String, u64>)> =
        std::sync::Mutex::new((0, BTreeMap::new()));
    let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    live.0 = live.0.max(version);
    if let Some(host) = host {
        live.1.insert(host.to_owned(), version);
    }
    let m = hafleet_runtime::health::Health::global();
    for (host, runs) in &live.1 {
        m.gauge(
            (
                "hafleet_applier_host_behind_versions",
                "How many versions older than the newest rolled out each host runs (0: the \
                 newest); alert when it stays above 0.",
            ),
            &[("host", host)],
            live.0.saturating_sub(*runs) as f64,
        );
    }
}

/// Counts a report in the applier's metrics.
fn count_report(r: &ApplyReport) {
    let m = hafleet_runtime::health::Health::global();
    let host = r.host.as_str();
    behind(None, r.version);
    let outcome = match &r.outcome {
        ApplyOutcome::Applied => "applied".to_owned(),
        ApplyOutcome::Unchanged => "unchanged".to_owned(),
        ApplyOutcome::Failed { stage, .. } => format!("failed_{}", stage.as_str()),
    };
    m.count(
        ("hafleet_applier_outcomes_total", "Applies by host and outcome (failed_<stage>)."),
        &[("host", host), ("outcome", &outcome)],
        1.0,
    );
    m.count(
        ("hafleet_applier_reloads_total", "HAProxy reloads asked for, by host."),
        &[("host", host)],
        f64::from(r.reloads),
    );
    m.count(
        ("hafleet_applier_runtime_commands_total", "Runtime API commands sent, by host."),
        &[("host", host)],
        f64::from(r.runtime_commands),
    );
    m.count(
        (
            "hafleet_applier_bridged_backends_total",
            "New backends served through spare backends ahead of their reload, by host.",
        ),
        &[("host", host)],
        f64::from(r.bridged),
    );
    m.count(
        (
            "hafleet_applier_sent_bytes_total",
            "Bytes of config, map and certificate files sent, by host.",
        ),
        &[("host", host)],
        r.sent_bytes as f64,
    );
    if r.drift.is_some() {
        m.count(("hafleet_applier_drift_total", "Drift found, by host."), &[("host", host)], 1.0);
    }
    match &r.outcome {
        ApplyOutcome::Applied | ApplyOutcome::Unchanged => {
            m.gauge(
                ("hafleet_applier_live_version", "The version each host runs, as last applied."),
                &[("host", host)],
                r.version as f64,
            );
            behind(Some(host), r.version);
            m.observe(
                ("hafleet_applier_apply_seconds", "Time to put a version live, by host."),
                &[("host", host)],
                Duration::from_millis(r.duration_ms),
            );
        }
        ApplyOutcome::Failed { restored: true, .. } => m.count(
            ("hafleet_applier_rollbacks_total", "Hosts put back to last-known-good, by host."),
            &[("host", host)],
            1.0,
        ),
        ApplyOutcome::Failed {
            stage: stage @ (ApplyStage::Connect | ApplyStage::HostKey), ..
        } => m.count(
            ("hafleet_applier_ssh_errors_total", "SSH connections failed, by host and stage."),
            &[("host", host), ("stage", stage.as_str())],
            1.0,
        ),
        ApplyOutcome::Failed { .. } => {}
    }
}

/// The report of `host` for `version`: `outcome`, finished at that time after `took` and
/// `effort`, and what a drift check found before, if it ran.
fn report_of(
    host: &Host,
    version: &ConfigVersion,
    outcome: ApplyOutcome,
    (finished_unix_ms, took, effort): (u64, Duration, rollout::Effort),
    drift: Option<&str>,
    fleet_hosts: usize,
) -> ApplyReport {
    ApplyReport {
        schema: SCHEMA_VERSION,
        fleet: version.fleet.clone(),
        host: host.name.clone(),
        version: version.version,
        sha256: version.sha256.clone(),
        outcome,
        finished_unix_ms,
        duration_ms: took.as_millis() as u64,
        reloads: effort.reloads,
        runtime_commands: effort.runtime_commands,
        bridged: effort.bridged,
        sent_bytes: effort.sent_bytes,
        drift: drift.map(str::to_owned),
        fleet_hosts: u32::try_from(fleet_hosts).unwrap_or(u32::MAX),
        quarantined: version.quarantined.clone(),
    }
}

/// What a rollout left, as indexes into the hosts it was given.
struct Rolled {
    /// Worth another try with the same version (see [`rollout::RolloutResult::to_retry`]).
    retry: Vec<usize>,
    /// Run the version now (applied or unchanged).
    live: Vec<usize>,
}

/// Rolls out and publishes one report per host attempted.
async fn apply_and_report(
    bus: &bus::Bus,
    hosts: &[Host],
    version: &ConfigVersion,
    known: &Known,
    settings: &RolloutSettings,
    drift: Option<&str>,
) -> Rolled {
    info!(fleet = %version.fleet, version = version.version, sha256 = %version.sha256, "rolling out");
    let known: Vec<&ConfigVersion> = known.0.iter().collect();
    let result = rollout::roll_out(hosts, version, &known, settings).await;
    let reloads: u32 = result.outcomes.iter().map(|r| r.effort.reloads).sum();
    info!(version = version.version, hosts = result.outcomes.len(), reloads, "rollout done");
    for rollout::HostResult { host: i, outcome, took, finished_unix_ms, effort } in
        result.outcomes.iter().cloned()
    {
        let host = &hosts[i];
        match &outcome {
            ApplyOutcome::Applied | ApplyOutcome::Unchanged => {
                info!(fleet = %version.fleet, host = %host.name, version = version.version, outcome = ?outcome, ms = took.as_millis() as u64, reloads = effort.reloads, runtime_commands = effort.runtime_commands, bridged = effort.bridged, sent_bytes = effort.sent_bytes, "host done");
                tls_expiry_gauge(host.name.as_str(), version);
            }
            ApplyOutcome::Failed { stage, message, restored } => {
                warn!(fleet = %version.fleet, host = %host.name, version = version.version, ?stage, restored, message = %message, "host failed")
            }
        }
        let when = (finished_unix_ms, took, effort);
        let report = report_of(host, version, outcome, when, drift, settings.fleet_hosts);
        send_report(bus, &report).await;
    }
    let live = result
        .outcomes
        .iter()
        .filter(|r| matches!(r.outcome, ApplyOutcome::Applied | ApplyOutcome::Unchanged))
        .map(|r| r.host)
        .collect();
    Rolled { retry: result.to_retry(), live }
}
