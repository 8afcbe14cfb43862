//! What the pure steps hand each other: an Ingress resolved for its fleet ([`Resolved`]), what
//! to tell its owner ([`Warning`]) and whom it shares its hosts with ([`Sharing`]). One module
//! that [`crate::core::annotations`], [`crate::core::resolve`], [`crate::core::tenancy`] and the
//! later steps import, so none of them imports another for its types.

use hafleet_proto::{FleetName, IngressKey, Route};
use std::collections::BTreeSet;

/// An Ingress's routes for its fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub fleet: FleetName,
    pub key: IngressKey,
    pub created_unix: i64,
    pub resource_version: String,
    /// Shared, so that a pass that finds an Ingress unchanged copies and compares none of
    /// its routes (`Arc`'s `==` compares the pointers first).
    pub routes: std::sync::Arc<Vec<Route>>,
    /// Things worth telling the Ingress's owner that do not stop it from being routed.
    pub warnings: Vec<Warning>,
    /// Which other namespaces may route the hosts this Ingress's namespace owns
    /// ([`SHARE_ANNOTATION`]).
    pub sharing: Sharing,
    /// The certificates of its `spec.tls` for the hosts it routes (set after tenancy, when
    /// TLS is on).
    /// Shared, as `routes` are: a pass that finds them unchanged neither copies nor compares
    /// them.
    pub tls: std::sync::Arc<Vec<hafleet_proto::TlsEntry>>,
    /// An HTTPRoute's certificates to be: its HTTPS listeners' Secrets for the hosts it routes
    /// through them (an Ingress's are read from its `spec.tls`).
    pub tls_spec: Vec<crate::core::tls_secrets::SpecEntry>,
}

impl Resolved {
    /// The routes of the object `meta` describes (an Ingress or an HTTPRoute) on `fleet`,
    /// without certificates yet.
    pub fn of(
        (fleet, key): (FleetName, IngressKey),
        meta: &kube::api::ObjectMeta,
        routes: Vec<Route>,
        warnings: Vec<Warning>,
        sharing: Sharing,
    ) -> Resolved {
        Resolved {
            fleet,
            key,
            created_unix: created_unix(meta),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            routes: std::sync::Arc::new(routes),
            warnings,
            sharing,
            tls: Default::default(),
            tls_spec: Vec::new(),
        }
    }
}

/// An object's creation time in Unix seconds (0: unknown).
pub fn created_unix(meta: &kube::api::ObjectMeta) -> i64 {
    meta.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second())
}

/// Something worth telling an Ingress's owner that does not stop it from being routed: the
/// reason of its Warning Event and the note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub reason: &'static str,
    pub note: String,
}

/// The annotation with which a host's owning namespace lets other namespaces route it: a
/// comma-separated list of namespaces, or `*` for every namespace.
pub const SHARE_ANNOTATION: &str = "hafleet.io/share-hosts-with";

/// Which namespaces an Ingress lets route the hosts its namespace owns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Sharing {
    #[default]
    Nobody,
    Namespaces(BTreeSet<String>),
    Everyone,
}

impl Sharing {
    /// Parses the annotation's value: namespaces (RFC 1123 labels) separated by commas, or `*`.
    pub fn parse(value: &str) -> Result<Sharing, String> {
        if value.trim() == "*" {
            return Ok(Sharing::Everyone);
        }
        let mut namespaces = BTreeSet::new();
        for ns in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            hafleet_proto::Namespace::new(ns).map_err(|e| e.to_string())?;
            namespaces.insert(ns.to_owned());
        }
        Ok(Sharing::Namespaces(namespaces))
    }

    /// Also lets in whom `other` lets in.
    pub(crate) fn widen(&mut self, other: &Sharing) {
        match (&mut *self, other) {
            (Sharing::Everyone, _) | (_, Sharing::Nobody) => {}
            (_, Sharing::Everyone) => *self = Sharing::Everyone,
            (Sharing::Nobody, Sharing::Namespaces(ns)) => *self = Sharing::Namespaces(ns.clone()),
            (Sharing::Namespaces(mine), Sharing::Namespaces(ns)) => mine.extend(ns.iter().cloned()),
        }
    }

    pub(crate) fn allows(&self, namespace: &str) -> bool {
        match self {
            Sharing::Nobody => false,
            Sharing::Namespaces(ns) => ns.contains(namespace),
            Sharing::Everyone => true,
        }
    }
}
