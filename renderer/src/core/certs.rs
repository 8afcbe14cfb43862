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

use crate::core::state::Ingresses;
use hafleet_proto::{HttpHost, MapFile, MapName, SealedCert};
use std::collections::{BTreeMap, BTreeSet};

/// A fleet's TLS: the certificates to put on hosts and the two files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// Sorted by id, each once; empty when no host has a certificate and the fleet has no
    /// default one (then no HTTPS bind).
    pub certs: Vec<SealedCert>,
    /// Each certificate's id, in the same order (worked out here once: the bundle keeps them).
    pub ids: std::sync::Arc<[String]>,
    /// The fleet's default certificate's file: what a name no certificate is listed for gets.
    pub default_cert: Option<String>,
    pub crt_list: Option<MapFile>,
    pub redirect: Option<MapFile>,
    /// What the crt-list could not say within HAProxy's line limits (for the version's notes).
    pub notes: Vec<String>,
}

/// HAProxy reads at most 2,048 words and 65,535 characters on a crt-list line, and refuses
/// the whole config beyond either; hafleet's lines stay well under both.
pub const MAX_LINE_WORDS: usize = 1000;
pub const MAX_LINE_BYTES: usize = 60_000;

/// Words and characters of a crt-list line naming `path`, `names` and `!excluded`.
fn line_size(path: &str, names: &[&HttpHost], excluded: &[&HttpHost]) -> (usize, usize) {
    let words = 1 + names.len() + excluded.len();
    let bytes = path.len()
        + names.iter().map(|h| h.as_str().len() + 1).sum::<usize>()
        + excluded.iter().map(|h| h.as_str().len() + 2).sum::<usize>();
    (words, bytes)
}

/// Appends the crt-list line `path names… !excluded…`.
fn push_line(out: &mut String, path: &str, names: &[&HttpHost], excluded: &[&HttpHost]) {
    out.push_str(path);
    for h in names {
        out.push(' ');
        out.push_str(h.as_str());
    }
    for h in excluded {
        out.push_str(" !");
        out.push_str(h.as_str());
    }
    out.push('\n');
}

/// Whether two certificates make the same file (what their ids compare, without hashing).
fn same_file(a: &SealedCert, b: &SealedCert) -> bool {
    a.chain_pem == b.chain_pem && a.sealed_key == b.sealed_key
}

/// The TLS files of a fleet's Ingresses.
///
/// A wildcard certificate line never catches an exact host it does not list: every exact host
/// the fleet routes that the wildcard covers, and that this line does not serve, is excluded
/// from it (`!host`), so another tenant's host under it is refused (strict-sni) rather than
/// served this certificate. The redirect map holds `1` (redirect) or `0` for each TLS host and
/// `0` for each such excluded host, and the template looks the wildcard form up only when the
/// exact host is not in it.
pub fn files(ingresses: &Ingresses, default_cert: Option<&SealedCert>) -> TlsFiles {
    let mut ids = IdMemo::default();
    files_with(ingresses, default_cert, &mut ids)
}

/// Certificate ids ([`SealedCert::id`]: a sha256 of the chain and sealed key, 1.5 KB) worked
/// out by earlier renders of a fleet, by fingerprint; one is used only for a certificate whose
/// chain and sealed key are the same bytes as those it was worked out from. At 10,000
/// certificates, hashing every one at every render was a sixth of a rotation's time in the
/// renderer. What a render does not use is dropped after it.
#[derive(Debug, Default)]
pub struct IdMemo {
    by_fingerprint: std::collections::HashMap<String, Vec<Known>>,
    render: u64,
}

#[derive(Debug)]
struct Known {
    chain_pem: std::sync::Arc<str>,
    sealed_key: std::sync::Arc<str>,
    id: String,
    render: u64,
}

impl IdMemo {
    /// `cert`'s id: kept, or worked out (and kept).
    pub fn id(&mut self, cert: &SealedCert) -> String {
        let render = self.render;
        // The same shared text is the same text, without comparing 1.5 KB.
        let same = |k: &&mut Known| {
            let same_text = |a: &std::sync::Arc<str>, b: &std::sync::Arc<str>| {
                std::sync::Arc::ptr_eq(a, b) || a == b
            };
            same_text(&k.chain_pem, &cert.chain_pem) && same_text(&k.sealed_key, &cert.sealed_key)
        };
        if let Some(known) = self.by_fingerprint.get_mut(&cert.fingerprint)
            && let Some(k) = known.iter_mut().find(same)
        {
            k.render = render;
            return k.id.clone();
        }
        let id = cert.id();
        let known = Known {
            chain_pem: cert.chain_pem.clone(),
            sealed_key: cert.sealed_key.clone(),
            id: id.clone(),
            render,
        };
        self.by_fingerprint.entry(cert.fingerprint.clone()).or_default().push(known);
        id
    }

    fn begin(&mut self) {
        self.render += 1;
    }

    fn end(&mut self) {
        let render = self.render;
        for known in self.by_fingerprint.values_mut() {
            known.retain(|k| k.render == render);
        }
        self.by_fingerprint.retain(|_, known| !known.is_empty());
    }
}

/// [`files`], with the ids earlier renders of the fleet worked out.
pub fn files_with(
    ingresses: &Ingresses,
    default_cert: Option<&SealedCert>,
    ids: &mut IdMemo,
) -> TlsFiles {
    ids.begin();
    let files = files_in(ingresses, default_cert, ids);
    ids.end();
    files
}

fn files_in(
    ingresses: &Ingresses,
    default_cert: Option<&SealedCert>,
    ids: &mut IdMemo,
) -> TlsFiles {
    let mut order: Vec<_> = ingresses.iter().filter(|(_, e)| !e.tls.is_empty()).collect();
    order.sort_by(|(ka, a), (kb, b)| (a.created_unix, ka).cmp(&(b.created_unix, kb)));
    // host -> (certificate, redirect plain HTTP)
    let mut hosts: BTreeMap<&HttpHost, (&SealedCert, bool)> = BTreeMap::new();
    for (_, entry) in order {
        let redirect =
            entry.routes.first().is_none_or(|r| r.backend.options.ssl_redirect != Some(false));
        for tls in &entry.tls {
            let Some(cert) = &tls.cert else { continue };
            for h in &tls.hosts {
                hosts.entry(h).or_insert((cert, redirect));
            }
        }
    }
    if hosts.is_empty() && default_cert.is_none() {
        return TlsFiles::default();
    }
    // Exact hosts the fleet routes: what a wildcard line must not catch unless it lists them.
    let routed: BTreeSet<&HttpHost> = ingresses
        .values()
        .flat_map(|e| e.routes.iter().filter(|r| !r.is_passthrough()))
        .filter_map(|r| r.host.as_ref())
        .filter(|h| !h.as_str().starts_with("*."))
        .collect();
    // The same hosts by the domain one label up (`a.example.com` under `example.com`): what a
    // wildcard `*.example.com` covers (`hafleet_proto::tls::name_covers`).
    let mut under: BTreeMap<&str, Vec<&HttpHost>> = BTreeMap::new();
    for exact in &routed {
        if let Some((label, parent)) = exact.as_str().split_once('.')
            && !label.is_empty()
            && label != "*"
        {
            under.entry(parent).or_default().push(exact);
        }
    }
    let mut by_cert: BTreeMap<String, (&SealedCert, Vec<&HttpHost>)> = BTreeMap::new();
    let mut redirect: BTreeMap<&str, bool> = BTreeMap::new();
    for (host, (cert, wants_redirect)) in &hosts {
        by_cert.entry(ids.id(cert)).or_insert_with(|| (cert, Vec::new())).1.push(host);
        redirect.insert(host.as_str(), *wants_redirect);
    }
    let mut crt_list = String::new();
    // Each certificate's id (a sha256 of its chain and sealed key, 1.5 KB) is computed once:
    // at 10,000 certificates, sorting by a recomputed id hashed 400 MB a render.
    let mut certs: Vec<(String, SealedCert)> = Vec::with_capacity(by_cert.len() + 1);
    let mut notes = Vec::new();
    for (id, (cert, listed)) in by_cert {
        let path = format!("{}/{id}.pem", hafleet_proto::tls::CERTS_DIR);
        let wildcards: Vec<&HttpHost> =
            listed.iter().copied().filter(|h| h.as_str().starts_with("*.")).collect();
        // Only a wildcard line has exclusions: the routed hosts one label under each of its
        // wildcards, in the routed order. (A walk over every routed host for each certificate
        // made a render at 10,000 certificates 10^8 steps, about 150 ms.)
        let mut excluded: Vec<&HttpHost> = wildcards
            .iter()
            .filter_map(|w| under.get(w.as_str().strip_prefix("*.")?))
            .flatten()
            .copied()
            .filter(|exact| {
                !listed.contains(exact) && hosts.get(exact).is_none_or(|(c, _)| !same_file(c, cert))
            })
            .collect();
        if wildcards.len() > 1 {
            excluded.sort();
            excluded.dedup();
        }
        let (words, bytes) = line_size(&path, &listed, &excluded);
        if words <= MAX_LINE_WORDS && bytes <= MAX_LINE_BYTES {
            push_line(&mut crt_list, &path, &listed, &excluded);
            for exact in &excluded {
                redirect.entry(exact.as_str()).or_insert(false);
            }
        } else {
            // Too long for one line. A line's `!` filters apply to that line's names only, so
            // the wildcards go on one line with all they exclude, or, if that is too long
            // too, are not served at all (rather than served to other tenants' hosts under
            // them, or written on a line HAProxy refuses, which would freeze the fleet). The
            // exact names go on as many lines as they need.
            let exact: Vec<&HttpHost> =
                listed.iter().copied().filter(|h| !h.as_str().starts_with("*.")).collect();
            let (words, bytes) = line_size(&path, &wildcards, &excluded);
            let fits = words <= MAX_LINE_WORDS && bytes <= MAX_LINE_BYTES;
            if !wildcards.is_empty() && fits {
                push_line(&mut crt_list, &path, &wildcards, &excluded);
                for exact in &excluded {
                    redirect.entry(exact.as_str()).or_insert(false);
                }
            } else if !wildcards.is_empty() {
                for w in &wildcards {
                    redirect.remove(w.as_str());
                }
                let names: Vec<&str> = wildcards.iter().map(|w| w.as_str()).collect();
                notes.push(format!(
                    "certificate {}: {} not served over HTTPS: {} hosts under it are other \
                     certificates' or have none, more than one crt-list line can exclude",
                    &id[..12],
                    names.join(", "),
                    excluded.len()
                ));
            }
            let mut from = 0;
            while from < exact.len() {
                let mut to = from;
                let (mut words, mut bytes) = (1, path.len());
                while to < exact.len()
                    && words < MAX_LINE_WORDS
                    && bytes + exact[to].as_str().len() < MAX_LINE_BYTES
                {
                    (words, bytes) = (words + 1, bytes + exact[to].as_str().len() + 1);
                    to += 1;
                }
                push_line(&mut crt_list, &path, &exact[from..to], &[]);
                from = to;
            }
        }
        certs.push((id, cert.clone()));
    }
    if let Some(d) = default_cert
        && !certs.iter().any(|(_, c)| same_file(c, d))
    {
        certs.push((ids.id(d), d.clone()));
    }
    certs.sort_by(|a, b| a.0.cmp(&b.0));
    let (ids, certs): (Vec<String>, Vec<SealedCert>) = certs.into_iter().unzip();
    let redirect: String =
        redirect.into_iter().map(|(h, on)| format!("{h} {}\n", u8::from(on))).collect();
    let file = |kind: &str, content: String| MapFile {
        name: MapName::for_content(kind, &content).expect("kinds are lowercase letters"),
        content,
    };
    TlsFiles {
        certs,
        ids: ids.into(),
        default_cert: default_cert.map(SealedCert::relative_path),
        crt_list: Some(file("crtlist", crt_list)),
        redirect: Some(file("redirect", redirect)),
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::state::IngressEntry;
    use hafleet_proto::{HttpHost, IngressKey, ObjectName, TlsEntry};

    fn cert(tag: &str, names: &[&str]) -> SealedCert {
        let der = tag.as_bytes();
        SealedCert {
            fingerprint: hafleet_proto::sha256_hex(der),
            names: names.iter().map(|n| HttpHost::new(*n).unwrap()).collect(),
            not_after_unix: 2_000_000_000,
            chain_pem: hafleet_proto::tls::certificates_pem([der]).into(),
            sealed_key: format!(
                "-----BEGIN AGE ENCRYPTED FILE-----\nYWJj{}\n-----END AGE ENCRYPTED FILE-----\n",
                tag.len()
            )
            .into(),
            recipient: String::new(),
        }
    }

    #[test]
    fn an_id_is_reused_only_for_the_same_chain_and_sealed_key_and_what_a_render_skips_goes() {
        let mut ids = IdMemo::default();
        let a = cert("a", &["a.example.com"]);
        ids.begin();
        assert_eq!(ids.id(&a), a.id());
        ids.end();
        // Sealed again (the same fingerprint, another key): its own id, not the kept one.
        let mut resealed = a.clone();
        resealed.sealed_key = format!("{}x", resealed.sealed_key).into();
        let mut other_chain = a.clone();
        other_chain.chain_pem = format!("{}\n", other_chain.chain_pem).into();
        ids.begin();
        assert_eq!(ids.id(&a), a.id());
        assert_eq!(ids.id(&resealed), resealed.id());
        assert_eq!(ids.id(&other_chain), other_chain.id());
        assert_ne!(resealed.id(), a.id());
        ids.end();
        assert_eq!(ids.by_fingerprint[&a.fingerprint].len(), 3);
        // A render that uses one drops the others.
        ids.begin();
        assert_eq!(ids.id(&resealed), resealed.id());
        ids.end();
        assert_eq!(ids.by_fingerprint[&a.fingerprint].len(), 1);
        // The same crt-list whether the ids are kept or worked out.
        let ing: Ingresses = [(
            IngressKey::new("t", "a").unwrap(),
            entry(1, vec![(vec!["a.example.com"], Some(a.clone()))], None),
        )]
        .into();
        let mut kept = IdMemo::default();
        let first = files_with(&ing, None, &mut kept);
        assert_eq!(files_with(&ing, None, &mut kept), first);
        assert_eq!(files(&ing, None), first);
    }

    fn entry(
        created: i64,
        tls: Vec<(Vec<&str>, Option<SealedCert>)>,
        redirect: Option<bool>,
    ) -> IngressEntry {
        let mut route = crate::core::model::tests::route(
            Some("x.example.com"),
            "/",
            hafleet_proto::PathKind::Prefix,
            "web",
        );
        route.backend.options.ssl_redirect = redirect;
        IngressEntry {
            created_unix: created,
            resource_version: "1".into(),
            routes: vec![route].into(),
            seq: 0,
            tls: tls
                .into_iter()
                .map(|(hosts, cert)| TlsEntry {
                    hosts: hosts.into_iter().map(|h| HttpHost::new(h).unwrap()).collect(),
                    secret: ObjectName::new("s").unwrap(),
                    cert,
                })
                .collect(),
            quarantined: None,
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
        let f = files(&ing, None);
        assert_eq!(f.certs, vec![a.clone()]);
        let list = f.crt_list.unwrap();
        assert_eq!(list.content, format!("{} a.example.com x.w.example.com\n", a.relative_path()));
        assert!(list.name.as_str().starts_with("crtlist-"));
        let redirect = f.redirect.unwrap().content;
        assert_eq!(
            redirect, "a.example.com 0\nx.w.example.com 0\n",
            "the owner said ssl-redirect: false"
        );
    }

    #[test]
    fn no_certificate_no_files_and_redirects_by_default() {
        let mut ing = Ingresses::new();
        ing.insert(
            IngressKey::new("t", "a").unwrap(),
            entry(1, vec![(vec!["c.example.com"], None)], None),
        );
        assert_eq!(files(&ing, None), TlsFiles::default());
        let c = cert("c", &["c.example.com"]);
        ing.insert(
            IngressKey::new("t", "b").unwrap(),
            entry(2, vec![(vec!["c.example.com"], Some(c))], None),
        );
        let f = files(&ing, None);
        assert_eq!(f.redirect.unwrap().content, "c.example.com 1\n");
    }

    #[test]
    fn a_wildcard_line_never_catches_an_exact_host_it_does_not_serve() {
        let wild = cert("w", &["*.example.com"]);
        let own = cert("o", &["b.example.com"]);
        let mut ing = Ingresses::new();
        // Team A's wildcard; team B routes c.example.com without TLS and b.example.com with
        // its own certificate.
        ing.insert(
            IngressKey::new("a", "wild").unwrap(),
            entry(1, vec![(vec!["*.example.com"], Some(wild.clone()))], None),
        );
        let mut plain = entry(2, vec![], None);
        std::sync::Arc::make_mut(&mut plain.routes)[0].host =
            Some(HttpHost::new("c.example.com").unwrap());
        ing.insert(IngressKey::new("b", "plain").unwrap(), plain);
        let mut b = entry(3, vec![(vec!["b.example.com"], Some(own.clone()))], None);
        std::sync::Arc::make_mut(&mut b.routes)[0].host =
            Some(HttpHost::new("b.example.com").unwrap());
        ing.insert(IngressKey::new("b", "own").unwrap(), b);
        let f = files(&ing, None);
        let list = f.crt_list.unwrap().content;
        let wild_line = list.lines().find(|l| l.starts_with(&wild.relative_path())).unwrap();
        assert!(wild_line.contains(" *.example.com"), "{list}");
        assert!(
            wild_line.contains(" !c.example.com") && wild_line.contains(" !b.example.com"),
            "{list}"
        );
        // Even its own Ingress's exact host: served by the wildcard only if its TLS entry
        // lists it (the conservative side: refused, never served by mistake).
        assert!(wild_line.contains(" !x.example.com"), "{list}");
        let redirect = f.redirect.unwrap().content;
        assert!(redirect.contains("c.example.com 0\n"), "{redirect}");
        assert!(redirect.contains("*.example.com 1\n") && redirect.contains("b.example.com 1\n"));
    }

    #[test]
    fn a_wildcard_line_excludes_exactly_the_routed_hosts_its_wildcards_cover_in_order() {
        let wild = cert("w", &["*.example.com", "*.example.org"]);
        let mut ing = Ingresses::new();
        let mut w = entry(1, vec![(vec!["*.example.com", "*.example.org"], Some(wild))], None);
        std::sync::Arc::make_mut(&mut w.routes)[0].host =
            Some(HttpHost::new("a.example.org").unwrap());
        ing.insert(IngressKey::new("a", "wild").unwrap(), w);
        let routed = [
            "z.example.com",
            "b.a.example.com",
            "example.com",
            "b.example.org",
            "m.example.com",
            "x.example.net",
            "a.example.com",
        ];
        for (i, host) in routed.iter().enumerate() {
            let mut plain = entry(2 + i as i64, vec![], None);
            std::sync::Arc::make_mut(&mut plain.routes)[0].host =
                Some(HttpHost::new(*host).unwrap());
            ing.insert(IngressKey::new("b", &format!("p{i}")).unwrap(), plain);
        }
        let list = files(&ing, None).crt_list.unwrap().content;
        let excluded: Vec<&str> =
            list.split_whitespace().filter_map(|w| w.strip_prefix('!')).collect();
        // What `name_covers` says, over every routed exact host in their sorted order.
        let mut want: Vec<HttpHost> = routed
            .iter()
            .chain(&["a.example.org"])
            .map(|h| HttpHost::new(*h).unwrap())
            .filter(|h| {
                ["*.example.com", "*.example.org"]
                    .iter()
                    .any(|w| hafleet_proto::tls::name_covers(&HttpHost::new(*w).unwrap(), h))
            })
            .collect();
        want.sort();
        let want: Vec<&str> = want.iter().map(|h| h.as_str()).collect();
        assert_eq!(excluded, want, "{list}");
        assert_eq!(
            want,
            ["a.example.com", "a.example.org", "b.example.org", "m.example.com", "z.example.com"]
        );
    }
}
