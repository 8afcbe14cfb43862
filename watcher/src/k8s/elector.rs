//! Leader election on a `coordination.k8s.io/v1` Lease, so that two watchers can run and only
//! one publishes. The leader renews the lease every third of its duration; a standby takes it
//! once it has not been renewed for a whole duration (the leader died or was cut off). The
//! leader publishes only while its lease is valid by its own clock with a margin, and a leader
//! that cannot renew in time exits (to come back as a standby), so two never publish at once.
//!
//! [`next`] is the decision (pure); [`Elector`] talks to the API server, with the lease's
//! resourceVersion making every take or renewal conditional on nobody else having written it.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use std::time::Duration;
use tokio::sync::watch;
use tracing::{info, warn};

/// Leader election settings of `hafleet-watcher`.
#[derive(Debug, Clone, clap::Args)]
pub struct LeaseArgs {
    /// Run as one of several replicas: publish only while holding the Lease below; otherwise
    /// stand by with warm caches and take over when the holder stops renewing it.
    #[arg(long, env = "HAFLEET_LEADER_ELECTION")]
    pub leader_election: bool,
    /// Namespace of the Lease (where the watcher runs).
    #[arg(long, env = "HAFLEET_LEASE_NAMESPACE", default_value = "hafleet")]
    pub lease_namespace: String,
    #[arg(long, env = "HAFLEET_LEASE_NAME", default_value = "hafleet-watcher")]
    pub lease_name: String,
    /// How long a lease holds without renewal: how long a standby waits after the leader dies
    /// (whole seconds, at least 3).
    #[arg(long, env = "HAFLEET_LEASE_DURATION", default_value = "15s",
          value_parser = hafleet_runtime::settings::duration)]
    pub lease_duration: Duration,
    /// Deprecated: --lease-duration in seconds.
    #[arg(
        long,
        env = "HAFLEET_LEASE_DURATION_SECS",
        hide = true,
        conflicts_with = "lease_duration"
    )]
    pub lease_duration_secs: Option<u64>,
    /// This replica's name in the Lease (default: host name and process id).
    #[arg(long, env = "HAFLEET_IDENTITY")]
    pub identity: Option<String>,
}

/// What a replica does about the lease as it stands. Pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nobody holds it, or its holder let it expire: take it.
    Take,
    /// It is ours: renew it.
    Renew,
    /// Someone else holds it until about this long from now.
    Wait(Duration),
}

pub fn next(
    holder: Option<&str>,
    renewed: Option<Timestamp>,
    duration: Duration,
    me: &str,
    now: Timestamp,
) -> Next {
    match (holder.filter(|h| !h.is_empty()), renewed) {
        (Some(h), _) if h == me => Next::Renew,
        (Some(_), Some(renewed)) => {
            let age = now.duration_since(renewed).unsigned_abs();
            match duration.checked_sub(age) {
                Some(left) if !left.is_zero() => Next::Wait(left),
                _ => Next::Take,
            }
        }
        _ => Next::Take,
    }
}

/// The leadership this replica holds: valid until a deadline the renewals push back.
#[derive(Debug, Clone)]
pub struct Leadership {
    valid_until: watch::Receiver<tokio::time::Instant>,
    /// How long before the lease runs out this replica stops publishing.
    margin: Duration,
    /// When this replica took the lease (nanoseconds since the epoch): its publishing epoch.
    pub since_unix_nanos: u64,
}

impl Leadership {
    /// Whether publishing now is safe: the lease holds for at least a fifth of its duration
    /// more, by this replica's own clock.
    pub fn holds(&self) -> bool {
        tokio::time::Instant::now() + self.margin < *self.valid_until.borrow()
    }

    /// Resolves once the lease has run out without renewal.
    pub async fn lost(&mut self) {
        loop {
            let until = *self.valid_until.borrow_and_update();
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {
                    if *self.valid_until.borrow() <= tokio::time::Instant::now() {
                        return;
                    }
                }
                changed = self.valid_until.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Takes and renews the lease.
#[derive(Clone)]
pub struct Elector {
    api: Api<Lease>,
    name: String,
    me: String,
    duration: Duration,
}

impl Elector {
    pub fn new(client: kube::Client, args: &LeaseArgs) -> Elector {
        let me = args.identity.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "watcher".into());
            format!("{host}-{}", std::process::id())
        });
        Elector {
            api: Api::namespaced(client, &args.lease_namespace),
            name: args.lease_name.clone(),
            me,
            duration: Duration::from_secs(args.lease_duration.as_secs().max(3)),
        }
    }

    /// One attempt: `Ok(true)` if this replica holds the lease afterwards, with the lease's
    /// epoch.
    async fn try_once(&self, floor: Option<u64>) -> Result<(bool, Duration, u64), kube::Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.name).await?;
        let spec = current.as_ref().and_then(|l| l.spec.clone()).unwrap_or_default();
        let decision = next(
            spec.holder_identity.as_deref(),
            spec.renew_time.as_ref().map(|t| t.0),
            spec.lease_duration_seconds
                .map(|s| Duration::from_secs(s.max(1) as u64))
                .unwrap_or(self.duration),
            &self.me,
            now,
        );
        let taking = match decision {
            Next::Wait(left) => return Ok((false, left, 0)),
            Next::Take => true,
            Next::Renew => false,
        };
        let mut lease = current.unwrap_or_else(|| Lease {
            metadata: kube::api::ObjectMeta { name: Some(self.name.clone()), ..Default::default() },
            spec: None,
        });
        // The epoch every message of this leadership carries: above the last holder's, whatever
        // the clocks say, so the renderer can fence a deposed leader off.
        let annotations = lease.metadata.annotations.get_or_insert_with(Default::default);
        let last = annotations.get(EPOCH_ANNOTATION).and_then(|e| e.parse::<u64>().ok());
        let epoch = match (taking, last) {
            (false, Some(epoch)) => epoch,
            (_, last) => next_epoch(last.max(floor), now.as_nanosecond().max(0) as u64),
        };
        annotations.insert(EPOCH_ANNOTATION.to_owned(), epoch.to_string());
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.me.clone()),
            lease_duration_seconds: Some(self.duration.as_secs() as i32),
            renew_time: Some(MicroTime(now)),
            acquire_time: if taking { Some(MicroTime(now)) } else { spec.acquire_time },
            lease_transitions: Some(
                spec.lease_transitions.unwrap_or(0)
                    + i32::from(taking && spec.holder_identity.is_some()),
            ),
            ..Default::default()
        });
        // Conditional on the resourceVersion read above: a replica that lost the race gets a
        // conflict, never a second holder.
        let written = match lease.metadata.resource_version {
            Some(_) => self.api.replace(&self.name, &PostParams::default(), &lease).await,
            None => self.api.create(&PostParams::default(), &lease).await,
        };
        match written {
            Ok(_) => Ok((true, self.duration, epoch)),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok((false, self.duration / 3, 0)),
            Err(e) => Err(e),
        }
    }

    /// Waits (standing by) until this replica holds the lease, then keeps renewing it in the
    /// background for as long as it can.
    ///
    /// `floor`: the newest epoch already in the routes stream; this leadership's is above it
    /// and above the Lease's last.
    pub async fn lead(&self, floor: Option<u64>) -> Leadership {
        let mut announced = false;
        let since_unix_nanos = loop {
            match self.try_once(floor).await {
                Ok((true, _, epoch)) => break epoch,
                Ok((false, left, _)) => {
                    if !announced {
                        info!(me = %self.me, lease = %self.name, "standing by: another watcher holds the lease");
                        announced = true;
                    }
                    tokio::time::sleep(left.min(self.duration / 3).max(Duration::from_millis(200)))
                        .await;
                }
                Err(e) => {
                    warn!(error = %e, "cannot read or write the lease; trying again");
                    tokio::time::sleep(self.duration / 3).await;
                }
            }
        };
        info!(me = %self.me, lease = %self.name, epoch = since_unix_nanos, "took the lease: publishing");
        let (tx, rx) = watch::channel(tokio::time::Instant::now() + self.duration);
        let renewer = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(renewer.duration / 3).await;
                let asked = tokio::time::Instant::now();
                match renewer.try_once(None).await {
                    Ok((true, _, _)) => {
                        let _ = tx.send(asked + renewer.duration);
                    }
                    Ok((false, _, _)) => {
                        warn!("the lease was taken by another watcher");
                        let _ = tx.send(tokio::time::Instant::now());
                        return;
                    }
                    Err(e) => warn!(error = %e, "cannot renew the lease; trying again"),
                }
            }
        });
        Leadership { valid_until: rx, margin: self.duration / 5, since_unix_nanos }
    }
}

/// Annotation on the Lease holding the epoch of its current leadership.
pub const EPOCH_ANNOTATION: &str = "hafleet.io/epoch";

/// A new leadership's epoch: the time in nanoseconds, but always above the last one. Pure.
pub fn next_epoch(last: Option<u64>, now_nanos: u64) -> u64 {
    match last {
        Some(last) => now_nanos.max(last.saturating_add(1)),
        None => now_nanos,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn epochs_only_grow_whatever_the_new_leaders_clock_says() {
        use super::next_epoch;
        assert_eq!(next_epoch(None, 500), 500);
        assert_eq!(next_epoch(Some(400), 500), 500);
        assert_eq!(next_epoch(Some(900), 500), 901, "a clock behind the last leader's");
        assert_eq!(next_epoch(Some(u64::MAX), 5), u64::MAX);
    }

    use super::*;

    #[test]
    fn a_lease_is_taken_when_free_or_expired_renewed_when_ours_and_waited_for_otherwise() {
        let now: Timestamp = "2026-11-24T01:00:00Z".parse().unwrap();
        let d = Duration::from_secs(15);
        let ago = |s: i64| Some(now - k8s_openapi::jiff::SignedDuration::from_secs(s));
        assert_eq!(next(None, None, d, "me", now), Next::Take);
        assert_eq!(next(Some(""), ago(1), d, "me", now), Next::Take);
        assert_eq!(next(Some("me"), ago(100), d, "me", now), Next::Renew);
        assert_eq!(next(Some("other"), ago(5), d, "me", now), Next::Wait(Duration::from_secs(10)));
        assert_eq!(next(Some("other"), ago(15), d, "me", now), Next::Take);
        assert_eq!(next(Some("other"), ago(60), d, "me", now), Next::Take);
        assert_eq!(next(Some("other"), None, d, "me", now), Next::Take);
    }
}
