//! The certificates a routed object is served with, sealed to its fleet: worked out again only
//! for the objects whose inputs changed.
//!
//! A pass at 10,000 TLS Ingresses sealed every one of them anew (looked each certificate up,
//! copied its chain and sealed key, 1.5 KB, into the object's entries and compared them with
//! what was published): about 100 ms of a certificate rotation's pass went there. The memo
//! keeps each object's entries, shared, with what they were worked out from: the same routes
//! (the same `Arc`), the same `spec.tls`, and each Secret looked up giving the same sealed
//! certificate (the same `Arc`) or the same reason, on the same side of the expiry warning.

use super::{Rules, Subject, Tls};
use crate::core::model::{Resolved, Warning};
use crate::core::tls_secrets::SpecEntry;
use hafleet_proto::{FleetName, IngressKey, SealedCert, TlsEntry};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// What a lookup of Secret (namespace, name) gave: its certificate sealed to the fleet, or why
/// not (`None`: nothing to tell, it was not read).
pub type Looked = Result<Arc<SealedCert>, Option<String>>;

/// The sealed entries of each routed object on each fleet, with what they came from.
#[derive(Default)]
pub struct SealMemo {
    /// By object, then fleet (looked up without making a key).
    entries: HashMap<IngressKey, Vec<(FleetName, Entry)>, foldhash::fast::RandomState>,
    /// The pass each entry was last used by: what a pass did not use is dropped after it.
    pass: u64,
    /// Objects sealed anew in the last pass (for the pass's debug log).
    fresh: usize,
}

struct Entry {
    routes: Arc<Vec<hafleet_proto::Route>>,
    source: Source,
    /// Each lookup in the order made, and whether its certificate was within the expiry
    /// warning.
    looked: Vec<((String, String), Looked, bool)>,
    tls: Arc<Vec<TlsEntry>>,
    said: Vec<Warning>,
    pass: u64,
}

impl SealMemo {
    /// Objects whose entries the last pass worked out anew.
    pub fn fresh(&self) -> usize {
        self.fresh
    }

    /// How many objects' entries it keeps.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.values().map(Vec::len).sum()
    }

    /// Starts a pass.
    pub(super) fn begin(&mut self) {
        self.pass += 1;
        self.fresh = 0;
    }

    /// Ends a pass: entries of objects it did not seal are dropped.
    pub(super) fn end(&mut self) {
        let pass = self.pass;
        for fleets in self.entries.values_mut() {
            fleets.retain(|(_, e)| e.pass == pass);
        }
        self.entries.retain(|_, fleets| !fleets.is_empty());
    }
}

/// What an object's certificates are asked for by.
enum Source {
    /// An Ingress's `spec.tls`: the same object (the watch cache's `Arc`) asks the same.
    Ingress(Arc<k8s_openapi::api::networking::v1::Ingress>),
    /// An HTTPRoute's listeners' Secrets, as resolved.
    Spec(Vec<SpecEntry>),
}

impl Source {
    fn is_of(&self, r: &Resolved, subject: &Subject) -> bool {
        match (self, subject) {
            (Source::Ingress(a), Subject::Ingress(b)) => Arc::ptr_eq(a, b),
            (Source::Spec(spec), Subject::Route(..)) => *spec == r.tls_spec,
            _ => false,
        }
    }

    fn of(subject: &Subject, spec: Vec<SpecEntry>) -> Source {
        match subject {
            Subject::Ingress(ing) => Source::Ingress(ing.clone()),
            Subject::Route(..) => Source::Spec(spec),
        }
    }
}

/// Whether a certificate that expires at `not_after` is within the warning at `warn_after`.
fn expiring(looked: &Looked, warn_after: i64) -> bool {
    looked.as_ref().is_ok_and(|c| c.not_after_unix < warn_after)
}

fn same(a: &Looked, b: &Looked) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => Arc::ptr_eq(a, b),
        (Err(a), Err(b)) => a == b,
        _ => false,
    }
}

/// What `r` asks certificates of: an Ingress's `spec.tls`, an HTTPRoute's HTTPS listeners.
pub(super) fn tls_spec(r: &Resolved, subject: &Subject) -> Vec<SpecEntry> {
    match subject {
        Subject::Ingress(ing) => SpecEntry::of(ing),
        Subject::Route(..) => r.tls_spec.clone(),
    }
}

/// Seals the certificates `r` asks for (its `spec.tls`, its HTTPS listeners') into `r` for
/// the hosts it routes, or says why they are not served.
pub(super) fn seal(
    r: &mut Resolved,
    subject: &Subject,
    tls: &mut Tls<'_>,
    rules: &Rules<'_>,
    told: &mut Vec<Warning>,
) {
    let warn_after = tls.now_unix + i64::from(rules.cert_expiry_warning_days) * 86_400;
    let fleet = &r.fleet;
    let pass = tls.memo.pass;
    // The same object on a fleet with TLS, the same routes, and each Secret looked up giving
    // what it gave: the same entries (the same lookups are made, in the same order).
    let kept = tls
        .memo
        .entries
        .get_mut(&r.key)
        .and_then(|fleets| fleets.iter_mut().find(|(f, _)| f == fleet).map(|(_, e)| e));
    if let Some(e) = kept
        && (tls.sealed_for)(fleet)
        && Arc::ptr_eq(&e.routes, &r.routes)
        && e.source.is_of(r, subject)
        && e.looked.iter().all(|((ns, name), was, warned)| {
            let now = (tls.lookup)(fleet, ns, name);
            same(was, &now) && *warned == expiring(&now, warn_after)
        })
    {
        e.pass = pass;
        r.tls = e.tls.clone();
        told.extend(e.said.iter().cloned());
        return;
    }
    let spec = tls_spec(r, subject);
    if spec.is_empty() {
        return;
    }
    if !(tls.sealed_for)(fleet) {
        let what = match subject {
            Subject::Ingress(_) => "spec.tls is",
            Subject::Route(..) => "its HTTPS listeners' certificates are",
        };
        let note = format!(
            "{what} not served: TLS is off on fleet {fleet} (the watcher has no --seal-to for it)"
        );
        told.push(Warning { reason: "TLSNotEnabled", note });
        return;
    }
    let hosts: BTreeSet<hafleet_proto::HttpHost> =
        r.routes.iter().filter_map(|route| route.host.clone()).collect();
    let ns = r.key.namespace.as_str();
    let mut looked = Vec::new();
    let mut lookup = |ns: &str, name: &str| {
        let got = (tls.lookup)(fleet, ns, name);
        let warned = expiring(&got, warn_after);
        looked.push(((ns.to_owned(), name.to_owned()), got.clone(), warned));
        got
    };
    let (entries, said) =
        crate::core::tls_secrets::entries(ns, &spec, &hosts, &mut lookup, warn_after);
    let said: Vec<Warning> =
        said.into_iter().map(|(reason, note)| Warning { reason, note }).collect();
    r.tls = Arc::new(entries);
    told.extend(said.iter().cloned());
    tls.memo.fresh += 1;
    let source = Source::of(subject, spec);
    let entry = Entry { routes: r.routes.clone(), source, looked, tls: r.tls.clone(), said, pass };
    let fleets = tls.memo.entries.entry(r.key.clone()).or_default();
    match fleets.iter_mut().find(|(f, _)| f == fleet) {
        Some((_, e)) => *e = entry,
        None => fleets.push((fleet.clone(), entry)),
    }
}
