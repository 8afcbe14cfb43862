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
    entries: HashMap<(IngressKey, FleetName), Entry, foldhash::fast::RandomState>,
    /// The pass each entry was last used by: what a pass did not use is dropped after it.
    pass: u64,
    /// Objects sealed anew in the last pass (for the pass's debug log).
    fresh: usize,
}

struct Entry {
    routes: Arc<Vec<hafleet_proto::Route>>,
    spec: Vec<SpecEntry>,
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
        self.entries.len()
    }

    /// Starts a pass.
    pub(super) fn begin(&mut self) {
        self.pass += 1;
        self.fresh = 0;
    }

    /// Ends a pass: entries of objects it did not seal are dropped.
    pub(super) fn end(&mut self) {
        let pass = self.pass;
        self.entries.retain(|_, e| e.pass == pass);
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
        Subject::HttpRoute(_) => r.tls_spec.clone(),
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
    let spec = tls_spec(r, subject);
    if spec.is_empty() {
        return;
    }
    if !(tls.sealed_for)(&r.fleet) {
        let what = match subject {
            Subject::Ingress(_) => "spec.tls is",
            Subject::HttpRoute(_) => "its HTTPS listeners' certificates are",
        };
        let note = format!(
            "{what} not served: TLS is off on fleet {} (the watcher has no --seal-to for it)",
            r.fleet
        );
        told.push(Warning { reason: "TLSNotEnabled", note });
        return;
    }
    let warn_after = tls.now_unix + i64::from(rules.cert_expiry_warning_days) * 86_400;
    let fleet = &r.fleet;
    let pass = tls.memo.pass;
    let key = (r.key.clone(), fleet.clone());
    // The same inputs: the same lookups are made, in the same order.
    if let Some(e) = tls.memo.entries.get_mut(&key)
        && Arc::ptr_eq(&e.routes, &r.routes)
        && e.spec == spec
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
    let entry = Entry { routes: r.routes.clone(), spec, looked, tls: r.tls.clone(), said, pass };
    tls.memo.entries.insert(key, entry);
}
