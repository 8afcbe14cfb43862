//! The safety net under every check the watcher makes: when `haproxy -c` refuses a fleet's
//! newest version, the lines it names are traced back to the Ingresses that made them, and
//! those Ingresses are taken out of the fleet ([`hafleet_proto::Quarantine`]), so the fleet
//! moves on without them instead of failing every later version the same way.
//!
//! ```text
//! report: failed at validate ─▶ [trace] HAProxy's alerts ─▶ config lines / proxy names
//!                                        ─▶ backend sections ─▶ Ingresses routing to them
//!                                        ─▶ certificate files ─▶ Ingresses serving them
//!         ─▶ Quarantine on hafleet.routes._quarantine ─▶ (routes stream) ─▶ a version without them
//! ```
//! [`trace`] is pure (the reports it reads and the quarantines it publishes are
//! [`crate::app::refusals`]'s). It explains a refusal only when every alert names a line in a backend
//! section (or a backend by name) that some Ingress of the fleet routes to, or a certificate
//! file some Ingress's TLS serves, when those
//! Ingresses are one namespace's or at most [`MAX_CULPRITS`], not every Ingress of the
//! fleet, and would not leave half of it quarantined. Anything else (a line in `global`,
//! `defaults` or the frontend, an alert naming nothing, a template whose backend macro breaks
//! every backend) is the template's, not a tenant's: the fleet halts as before, and the
//! operator is told.

use crate::core::state::Ingresses;
use hafleet_proto::IngressKey;
use std::collections::BTreeSet;

/// Most Ingresses of several namespaces one refused version may quarantine: more is taken
/// for a template error (one namespace's may be any number short of the fleet).
pub const MAX_CULPRITS: usize = 5;

/// What a refusal is traced to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Traced {
    /// These Ingresses, each with the resourceVersion it has in the fleet.
    Ingresses(Vec<(IngressKey, String)>),
    /// No Ingress explains it (why not).
    Unexplained(String),
}

/// The lines and proxies `haproxy -c`'s alerts name: `parsing [<file>:<line>]` (where
/// `<file>` is the config, not a map) and `proxy '<name>'` / `backend '<name>'`. `None` for an
/// alert that names neither.
fn alert_targets(message: &str) -> Vec<Option<Target>> {
    message
        .lines()
        .filter(|l| l.contains("[ALERT]"))
        // HAProxy's closing summary, after the alerts that say what is wrong.
        .filter(|l| {
            !l.contains("Error(s) found in configuration file")
                && !l.contains("Fatal errors found in configuration")
        })
        .map(|line| {
            // A certificate file HAProxy could not load (named by its id).
            let certs = format!("{}/", hafleet_proto::tls::CERTS_DIR);
            if let Some(at) = line.find(&certs) {
                let rest = &line[at + certs.len()..];
                if let Some(end) = rest.find(".pem") {
                    return Some(Target::Cert(rest[..end].to_owned()));
                }
            }
            let lower = line.to_ascii_lowercase();
            for word in ["proxy '", "backend '"] {
                if let Some(at) = lower.find(word) {
                    let rest = &line[at + word.len()..];
                    if let Some(end) = rest.find('\'') {
                        return Some(Target::Proxy(rest[..end].to_owned()));
                    }
                }
            }
            // `[<file>:<line>]` of the config (a map's lines are not the config's).
            let mut rest = line;
            while let Some(open) = rest.find('[') {
                let inner = &rest[open + 1..];
                let Some(close) = inner.find(']') else { break };
                if let Some((file, n)) = inner[..close].rsplit_once(':')
                    && !file.ends_with(".map")
                    && let Ok(n) = n.parse::<usize>()
                {
                    return Some(Target::Line(n));
                }
                rest = &inner[close + 1..];
            }
            None
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Line(usize),
    Proxy(String),
    /// A certificate's id ([`hafleet_proto::SealedCert::id`]).
    Cert(String),
}

/// The backend whose section holds line `n` (1-based) of `config`, if it is in one.
fn backend_at(config: &str, n: usize) -> Option<&str> {
    let lines: Vec<&str> = config.lines().take(n).collect();
    if n == 0 || lines.len() < n {
        return None;
    }
    let header = lines
        .into_iter()
        .rev()
        .find(|l| !l.is_empty() && !l.starts_with(char::is_whitespace) && !l.starts_with('#'))?;
    let mut words = header.split_whitespace();
    (words.next() == Some("backend")).then(|| words.next()).flatten()
}

/// Which Ingresses of the fleet (`ingresses`, as the refused `config` was rendered from)
/// made what `message` (`haproxy -c`'s output) refuses.
pub fn trace(config: &str, message: &str, ingresses: &Ingresses) -> Traced {
    let targets = alert_targets(message);
    if targets.is_empty() {
        return Traced::Unexplained("HAProxy's output has no alert but its summary".into());
    }
    let mut backends: BTreeSet<String> = BTreeSet::new();
    let mut certs: BTreeSet<String> = BTreeSet::new();
    for target in targets {
        let backend = match target {
            Some(Target::Cert(id)) => {
                certs.insert(id);
                continue;
            }
            Some(Target::Proxy(name)) => name,
            Some(Target::Line(n)) => match backend_at(config, n) {
                Some(b) => b.to_owned(),
                None => {
                    return Traced::Unexplained(format!(
                        "line {n} of the config is not in a backend section"
                    ));
                }
            },
            None => return Traced::Unexplained("an alert names no line and no proxy".into()),
        };
        backends.insert(backend);
    }
    let mut culprits: Vec<(IngressKey, String)> = Vec::new();
    for backend in &backends {
        let made: Vec<(IngressKey, String)> = ingresses
            .iter()
            .filter(|(_, e)| e.quarantined.is_none())
            .filter(|(_, e)| e.routes.iter().any(|r| crate::core::model::backend_of(r) == *backend))
            .map(|(k, e)| (k.clone(), e.resource_version.clone()))
            .collect();
        if made.is_empty() {
            return Traced::Unexplained(format!("no Ingress routes to backend {backend}"));
        }
        culprits.extend(made);
    }
    for id in &certs {
        let made: Vec<(IngressKey, String)> = ingresses
            .iter()
            .filter(|(_, e)| e.quarantined.is_none())
            .filter(|(_, e)| e.tls.iter().filter_map(|t| t.cert.as_ref()).any(|c| c.id() == *id))
            .map(|(k, e)| (k.clone(), e.resource_version.clone()))
            .collect();
        if made.is_empty() {
            // The fleet's default certificate, say: the operator's, not a tenant's.
            return Traced::Unexplained(format!("no Ingress has certificate {id}"));
        }
        culprits.extend(made);
    }
    culprits.sort();
    culprits.dedup();
    let live = ingresses.values().filter(|e| e.quarantined.is_none()).count();
    let namespaces: BTreeSet<&str> = culprits.iter().map(|(k, _)| k.namespace.as_str()).collect();
    // One namespace's Ingresses are one tenant's mistake, however many; several namespaces'
    // are the template's unless they are few.
    if culprits.len() >= live || (namespaces.len() > 1 && culprits.len() > MAX_CULPRITS) {
        return Traced::Unexplained(format!(
            "{} of the fleet's {live} Ingresses, in {} namespaces, made the refused lines: a \
             template error, not a tenant's",
            culprits.len(),
            namespaces.len()
        ));
    }
    // Nor, version after version, half of the fleet: a template error that shows a few
    // Ingresses at a time is not taken for tenants' mistakes until the fleet is empty.
    let held = ingresses.len() - live;
    if (held + culprits.len()) * 2 > ingresses.len() {
        return Traced::Unexplained(format!(
            "{held} Ingresses are quarantined already; {} more would take out half the fleet",
            culprits.len()
        ));
    }
    Traced::Ingresses(culprits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::state::IngressEntry;

    fn entry(service: &str, rv: &str) -> IngressEntry {
        let route: hafleet_proto::Route = serde_json::from_value(serde_json::json!({
            "host": format!("{service}.example.com"), "path": "/", "kind": "Prefix",
            "backend": {"service": {"namespace": "default", "name": service, "port": 80},
                        "node_port": 30080}
        }))
        .unwrap();
        IngressEntry {
            created_unix: 1,
            resource_version: rv.into(),
            routes: vec![route].into(),
            seq: 1,
            tls: vec![],
            quarantined: None,
        }
    }

    fn fleet() -> Ingresses {
        ["web", "api", "bad", "other"]
            .iter()
            .map(|s| (IngressKey::new("default", s).unwrap(), entry(s, &format!("rv-{s}"))))
            .collect()
    }

    const CONFIG: &str = "global\n    stats timeout 30s\n\nfrontend f\n    bind :80\n\n\
        backend be_default_web_80\n    server a 1.2.3.4:1\nbackend be_default_bad_80\n    # x\n\
        \n    no-such-directive on\n    server a 1.2.3.4:1\nbackend hafleet_no_route\n    \
        http-request deny\n";

    /// `haproxy -c`'s output for one alert, with the summary it closes with.
    fn alert(text: &str) -> String {
        format!(
            "[NOTICE]   (1) : haproxy version is 2.6.12\n[ALERT]    (1) : config : {text}\n\
             [ALERT]    (1) : config : Error(s) found in configuration file : /x/haproxy.cfg\n\
             [ALERT]    (1) : config : Fatal errors found in configuration.\n"
        )
    }

    #[test]
    fn a_line_in_a_backend_is_traced_to_the_ingresses_that_route_to_it() {
        let msg = alert(
            "parsing [/etc/haproxy/haproxy.cfg.hafleet-new-x:12] : unknown keyword \
             'no-such-directive' in 'backend' section",
        );
        let bad = IngressKey::new("default", "bad").unwrap();
        assert_eq!(trace(CONFIG, &msg, &fleet()), Traced::Ingresses(vec![(bad, "rv-bad".into())]));
        let by_name = alert("Proxy 'be_default_bad_80': unable to find required use_backend");
        assert!(matches!(trace(CONFIG, &by_name, &fleet()), Traced::Ingresses(v) if v.len() == 1));
    }

    #[test]
    fn what_no_ingress_explains_is_the_template_s() {
        for (msg, says) in [
            (alert("parsing [haproxy.cfg:2] : unknown keyword"), "line 2 of the config"),
            (alert("parsing [haproxy.cfg:16] : bad"), "line 16"),
            (alert("Proxy 'hafleet_no_route': broken"), "no Ingress routes to backend"),
            (alert("something else broke"), "names no line and no proxy"),
            ("[ALERT] (1) : config : Fatal errors found in configuration.\n".into(), "no alert"),
            ("[WARNING] (1) : config : something\n".into(), "no alert"),
        ] {
            let Traced::Unexplained(why) = trace(CONFIG, &msg, &fleet()) else {
                panic!("{msg}");
            };
            assert!(why.contains(says), "{msg}: {why}");
        }
        // Every Ingress of the fleet: the backend macro itself is broken.
        let mut two = fleet();
        two.retain(|k, _| k.name.as_str() == "bad");
        let msg = alert("parsing [haproxy.cfg:12] : unknown keyword");
        assert!(
            matches!(trace(CONFIG, &msg, &two), Traced::Unexplained(w) if w.contains("template"))
        );
    }

    /// In the desired state: a quarantined Ingress stays out while the watcher resends it as
    /// it was (a restart, a status write), and comes back once what it routes changed.
    #[test]
    fn a_quarantine_lasts_until_the_ingress_changes() {
        use crate::core::state::{Applied, Desired, SweepGuard, apply};
        use hafleet_proto::RouteMessage;
        let upsert = |rv: &str, epoch: u64| -> RouteMessage {
            serde_json::from_value(serde_json::json!({
                "type": "event", "schema": 3, "fleet": "edge",
                "ingress": {"namespace": "default", "name": "bad"},
                "created_unix": 1, "resource_version": rv, "epoch": epoch,
                "change": {"op": "upsert", "routes": [entry("bad", rv).routes[0]]}
            }))
            .unwrap()
        };
        let bad = IngressKey::new("default", "bad").unwrap();
        let edge = hafleet_proto::FleetName::new("edge").unwrap();
        let mut desired = Desired::default();
        let guard = SweepGuard::default();
        let mut step = |seq: u64, msg: RouteMessage| {
            let mut out = Applied::default();
            apply(&mut desired, seq, &msg, &guard, &mut out);
            let quarantined = desired.ingresses(&edge).get(&bad).map(|e| e.quarantined.is_some());
            (quarantined, out.causes.get(&edge).cloned().unwrap_or_default())
        };
        step(1, upsert("rv-1", 5));
        let q = |rv: &str| {
            RouteMessage::Quarantine(hafleet_proto::Quarantine {
                schema: hafleet_proto::PARTS_SCHEMA_VERSION,
                fleet: edge.clone(),
                version: 2,
                ingresses: vec![(bad.clone(), rv.into())],
                message: "unknown keyword".into(),
            })
        };
        // A quarantine of another resourceVersion (changed since) takes nothing out.
        assert_eq!(step(2, q("rv-0")), (Some(false), vec![]));
        let (out, causes) = step(3, q("rv-1"));
        assert_eq!(out, Some(true), "epoch 0: the renderer's own message is not fenced");
        assert_eq!((causes.len(), causes[0].what.as_str()), (1, "quarantine"));
        assert!(causes[0].note.as_deref().unwrap().contains("version 2 failed haproxy -c"));
        assert_eq!(step(4, upsert("rv-1", 6)).0, Some(true), "resent as it was: still out");
        assert_eq!(step(5, upsert("rv-2", 6)).0, Some(true), "a new resourceVersion, same routes");
        let mut changed = upsert("rv-3", 6);
        if let RouteMessage::Event(e) = &mut changed
            && let hafleet_proto::RouteChange::Upsert { routes, .. } = &mut e.change
        {
            routes[0].path = hafleet_proto::HttpPath::new("/v2").unwrap();
        }
        assert_eq!(step(6, changed).0, Some(false), "its routes changed: taken back");
    }

    /// Six Ingresses of one namespace on one backend are one tenant's mistake; six of two
    /// namespaces, or a refusal that would leave half the fleet out, are the template's.
    #[test]
    fn one_namespace_s_many_ingresses_are_quarantined_but_not_half_the_fleet() {
        let mut ingresses = fleet();
        for i in 0..6 {
            ingresses.insert(IngressKey::new("team", &format!("b{i}")).unwrap(), entry("bad", "1"));
        }
        for i in 0..10 {
            let name = format!("x{i}");
            ingresses.insert(IngressKey::new("other", &name).unwrap(), entry(&name, "1"));
        }
        let msg = alert("parsing [haproxy.cfg:12] : unknown keyword");
        // default/bad and team's six route to be_default_bad_80: two namespaces, 7 > 5.
        assert!(
            matches!(trace(CONFIG, &msg, &ingresses), Traced::Unexplained(w) if w.contains("2 namespaces"))
        );
        ingresses.remove(&IngressKey::new("default", "bad").unwrap());
        let Traced::Ingresses(out) = trace(CONFIG, &msg, &ingresses) else { panic!() };
        assert_eq!(out.len(), 6, "one namespace's six");
        // With 6 of 19 already out, 6 more would be more than half.
        for (k, e) in ingresses.iter_mut() {
            if k.namespace.as_str() == "other" && k.name.as_str() < "x6" {
                e.quarantined = Some("earlier".into());
            }
        }
        assert!(
            matches!(trace(CONFIG, &msg, &ingresses), Traced::Unexplained(w) if w.contains("half the fleet"))
        );
    }

    /// HAProxy 2.6's words for a certificate it cannot load (a key that is not the
    /// certificate's), taken from a real `haproxy -c`: the Ingress whose TLS serves it is
    /// the culprit; the fleet's default certificate is no tenant's.
    #[test]
    fn a_certificate_haproxy_cannot_load_is_traced_to_the_ingresses_that_serve_it() {
        let cert = hafleet_proto::SealedCert {
            fingerprint: "f".into(),
            names: vec![hafleet_proto::HttpHost::new("api.example.com").unwrap()],
            not_after_unix: 2_000_000_000,
            chain_pem: "chain".into(),
            sealed_key: "key".into(),
            recipient: String::new(),
        };
        let mut ingresses = fleet();
        ingresses.get_mut(&IngressKey::new("default", "api").unwrap()).unwrap().tls =
            vec![hafleet_proto::TlsEntry {
                hosts: cert.names.clone(),
                secret: hafleet_proto::ObjectName::new("api-tls").unwrap(),
                cert: Some(cert.clone()),
            }];
        let said = |id: &str| {
            alert(&format!(
                "parsing [haproxy.cfg:10] : 'bind :443' in section 'frontend' : 'crt-list' : \
                 inconsistencies between private key and certificate loaded \
                 'hafleet-certs/{id}.pem'."
            ))
        };
        let api = IngressKey::new("default", "api").unwrap();
        assert_eq!(
            trace(CONFIG, &said(&cert.id()), &ingresses),
            Traced::Ingresses(vec![(api, "rv-api".into())])
        );
        let other = said(&"0".repeat(64));
        assert!(
            matches!(trace(CONFIG, &other, &ingresses), Traced::Unexplained(w) if w.contains("no Ingress has certificate"))
        );
    }

    #[test]
    fn lines_of_a_map_are_not_lines_of_the_config() {
        let msg = alert("parsing [hafleet-maps/exact-x.map:12] : bad");
        assert!(matches!(trace(CONFIG, &msg, &fleet()), Traced::Unexplained(_)));
    }
}
