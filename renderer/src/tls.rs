//! Which certificate each TLS host of a fleet is served with, and the files that say so. Pure.
//!
//! ```text
//! crtlist-<sha>.map   (crt-list)  hafleet-certs/<id>.pem shop.example.com www.example.com
//! redirect-<sha>.map  (map_str)   shop.example.com 1      plain HTTP for it answers 308
//! ```
//! A host gets the certificate of the oldest Ingress (creation time, then namespace/name) that
//! has a TLS entry for it with a certificate: the same order routing conflicts are settled in,
//! and the watcher has already kept each host to the namespace that routes it. The crt-list
//! filters each certificate by the hosts it serves, so a client's SNI selects it and no other
//! tenant's; the bind line's `strict-sni` refuses names that no certificate is listed for.
//! The crt-list names certificate files by [`SealedCert::id`], so the config (which names the
//! crt-list by its digest) covers the sealed keys too.

use crate::state::Ingresses;
use hafleet_proto::{MapFile, MapName, SealedCert};
use std::collections::BTreeMap;

/// A fleet's TLS: the certificates to put on hosts and the two files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// Sorted by id, each once; empty when no host has a certificate (then no HTTPS bind).
    pub certs: Vec<SealedCert>,
    pub crt_list: Option<MapFile>,
    pub redirect: Option<MapFile>,
    /// `host: fingerprint (names, notAfter)` per TLS host, for the version's notes.
    pub notes: Vec<String>,
}

/// The TLS files of a fleet's Ingresses.
pub fn files(ingresses: &Ingresses) -> TlsFiles {
    let mut order: Vec<_> = ingresses.iter().filter(|(_, e)| !e.tls.is_empty()).collect();
    order.sort_by(|(ka, a), (kb, b)| (a.created_unix, ka).cmp(&(b.created_unix, kb)));
    // host -> (certificate, redirect plain HTTP)
    let mut hosts: BTreeMap<&str, (&SealedCert, bool)> = BTreeMap::new();
    for (_, entry) in order {
        let redirect =
            entry.routes.first().is_none_or(|r| r.backend.options.ssl_redirect != Some(false));
        for tls in &entry.tls {
            let Some(cert) = &tls.cert else { continue };
            for h in &tls.hosts {
                hosts.entry(h.as_str()).or_insert((cert, redirect));
            }
        }
    }
    if hosts.is_empty() {
        return TlsFiles::default();
    }
    let mut by_cert: BTreeMap<String, (&SealedCert, Vec<&str>)> = BTreeMap::new();
    let mut redirect = String::new();
    let mut notes = Vec::new();
    for (host, (cert, wants_redirect)) in &hosts {
        by_cert.entry(cert.id()).or_insert_with(|| (cert, Vec::new())).1.push(host);
        if *wants_redirect {
            redirect.push_str(host);
            redirect.push_str(" 1\n");
        }
        notes.push(format!(
            "tls {host}: {} ({}; notAfter {})",
            cert.fingerprint,
            cert.names.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(" "),
            cert.not_after_unix
        ));
    }
    let mut crt_list = String::new();
    let mut certs = Vec::new();
    for (cert, hosts) in by_cert.into_values() {
        crt_list.push_str(&cert.relative_path());
        for h in hosts {
            crt_list.push(' ');
            crt_list.push_str(h);
        }
        crt_list.push('\n');
        certs.push(cert.clone());
    }
    certs.sort_by_key(SealedCert::id);
    let file = |kind: &str, content: String| MapFile {
        name: MapName::for_content(kind, &content).expect("kinds are lowercase letters"),
        content,
    };
    TlsFiles {
        certs,
        crt_list: Some(file("crtlist", crt_list)),
        redirect: (!redirect.is_empty()).then(|| file("redirect", redirect)),
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::IngressEntry;
    use hafleet_proto::{HttpHost, IngressKey, ObjectName, TlsEntry};

    fn cert(tag: &str, names: &[&str]) -> SealedCert {
        let der = tag.as_bytes();
        SealedCert {
            fingerprint: hafleet_proto::sha256_hex(der),
            names: names.iter().map(|n| HttpHost::new(*n).unwrap()).collect(),
            not_after_unix: 2_000_000_000,
            chain_pem: hafleet_proto::tls::certificates_pem([der]),
            sealed_key: format!(
                "-----BEGIN AGE ENCRYPTED FILE-----\nYWJj{}\n-----END AGE ENCRYPTED FILE-----\n",
                tag.len()
            ),
        }
    }

    fn entry(
        created: i64,
        tls: Vec<(Vec<&str>, Option<SealedCert>)>,
        redirect: Option<bool>,
    ) -> IngressEntry {
        let mut route = crate::model::tests::route(
            Some("x.example.com"),
            "/",
            hafleet_proto::PathKind::Prefix,
            "web",
        );
        route.backend.options.ssl_redirect = redirect;
        IngressEntry {
            created_unix: created,
            resource_version: "1".into(),
            routes: vec![route],
            seq: 0,
            tls: tls
                .into_iter()
                .map(|(hosts, cert)| TlsEntry {
                    hosts: hosts.into_iter().map(|h| HttpHost::new(h).unwrap()).collect(),
                    secret: ObjectName::new("s").unwrap(),
                    cert,
                })
                .collect(),
        }
    }

    #[test]
    fn the_oldest_ingress_serves_a_host_and_each_cert_lists_its_hosts() {
        let (a, b) =
            (cert("a", &["a.example.com", "*.w.example.com"]), cert("b", &["a.example.com"]));
        let mut ing = Ingresses::new();
        ing.insert(
            IngressKey::new("team", "new").unwrap(),
            entry(20, vec![(vec!["a.example.com"], Some(b.clone()))], None),
        );
        ing.insert(
            IngressKey::new("team", "old").unwrap(),
            entry(
                10,
                vec![(vec!["a.example.com", "x.w.example.com"], Some(a.clone()))],
                Some(false),
            ),
        );
        ing.insert(
            IngressKey::new("team", "broken").unwrap(),
            entry(5, vec![(vec!["c.example.com"], None)], None),
        );
        let f = files(&ing);
        assert_eq!(f.certs, vec![a.clone()]);
        let list = f.crt_list.unwrap();
        assert_eq!(list.content, format!("{} a.example.com x.w.example.com\n", a.relative_path()));
        assert!(list.name.as_str().starts_with("crtlist-"));
        assert!(f.redirect.is_none(), "the owner said ssl-redirect: false");
        assert_eq!(f.notes.len(), 2);
        assert!(f.notes[0].starts_with(&format!("tls a.example.com: {}", a.fingerprint)));
    }

    #[test]
    fn no_certificate_no_files_and_redirects_by_default() {
        let mut ing = Ingresses::new();
        ing.insert(
            IngressKey::new("t", "a").unwrap(),
            entry(1, vec![(vec!["c.example.com"], None)], None),
        );
        assert_eq!(files(&ing), TlsFiles::default());
        let c = cert("c", &["c.example.com"]);
        ing.insert(
            IngressKey::new("t", "b").unwrap(),
            entry(2, vec![(vec!["c.example.com"], Some(c))], None),
        );
        let f = files(&ing);
        assert_eq!(f.redirect.unwrap().content, "c.example.com 1\n");
    }
}
