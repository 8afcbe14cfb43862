//! A whole pass decided on objects written here: what is published, kept, held and told.

use super::*;
use crate::core::resolve::Services;
use k8s_openapi::api::core::v1::Service;
use serde_json::json;

/// Ingress `ns/name` on fleet `edge` routing `host` to Service `web`, created `created` seconds
/// into 2026; `path` "" makes it invalid (an empty path of type Prefix).
fn ingress(ns: &str, name: &str, host: &str, path: &str, created: u32) -> Arc<Ingress> {
    let at = format!("2026-01-01T00:{:02}:{:02}Z", created / 60, created % 60);
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "generation": 1, "creationTimestamp": at,
                         "annotations": {"hafleet.io/fleet": "edge"}},
            "spec": {"rules": [{"host": host, "http": {"paths": [
                {"path": path, "pathType": "Prefix",
                 "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}],
                     "tls": [{"hosts": [host], "secretName": "cert"}]}
        }))
        .unwrap(),
    )
}

fn services(namespaces: &[&str]) -> Services {
    namespaces
        .iter()
        .map(|ns| {
            let svc: Service = serde_json::from_value(json!({
                "metadata": {"name": "web", "namespace": ns},
                "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}
            }))
            .unwrap();
            ((ns.to_string(), "web".to_owned()), Arc::new(svc))
        })
        .collect()
}

/// The objects of a pass of `ingresses` on `services`, nothing else.
fn objects<'a>(ingresses: &'a [Arc<Ingress>], services: &'a Services) -> Objects<'a> {
    Objects { ingresses, gateway: None, services, endpoints: None, policy: None }
}

fn rules() -> Rules<'static> {
    Rules {
        resolve: Default::default(),
        namespaces_own_hosts: true,
        limits: IngressLimits { max_paths: 100, max_bytes: 1 << 20, cluster: None },
        payload_limit: 1 << 20,
        max_kept_per_namespace: 10,
        cert_expiry_warning_days: 14,
        bulk_delete_threshold: 0,
    }
}

/// One pass without TLS and without a churn budget.
fn plan(ingresses: &[Arc<Ingress>], rules: &Rules<'_>, published: &Published) -> Plan {
    plan_with(ingresses, rules, published, None, &mut Budget::default())
}

fn plan_with(
    ingresses: &[Arc<Ingress>],
    rules: &Rules<'_>,
    published: &Published,
    policy: Option<&Policy>,
    churn: &mut Budget,
) -> Plan {
    let services = services(&["shop", "blog"]);
    let objects =
        Objects { ingresses, gateway: None, services: &services, endpoints: None, policy };
    let res = resolve(&objects, rules, &mut Memo::default(), published, false);
    finish(res, None, rules, published, churn, tokio::time::Instant::now())
}

fn upserts(plan: &Plan) -> Vec<String> {
    let keys = plan.actions.iter().filter_map(|a| match a {
        Action::Upsert(r) => Some(r.key.to_string()),
        Action::Delete { .. } => None,
    });
    keys.collect()
}

fn told(plan: &Plan) -> Vec<(String, &'static str)> {
    plan.tells.iter().map(|t| (t.key.to_string(), t.reason)).collect()
}

fn key(s: &str) -> IngressKey {
    let (ns, name) = s.split_once('/').unwrap();
    IngressKey::new(ns, name).unwrap()
}

/// What a pass publishes, recorded as acked.
fn record_all(plan: &Plan, published: &mut Published) {
    for action in &plan.actions {
        index::record(published, action);
    }
}

#[test]
fn valid_ingresses_are_published_invalid_ones_kept_and_told_and_unselected_ones_ignored() {
    let mut unselected = (*ingress("shop", "other", "o.com", "/", 3)).clone();
    unselected.metadata.annotations = None;
    let all = [
        ingress("shop", "web", "a.com", "/", 1),
        ingress("shop", "bad", "b.com", "", 2),
        Arc::new(unselected),
    ];
    let p = plan(&all, &rules(), &Published::default());
    assert_eq!(upserts(&p), ["shop/web"]);
    assert_eq!(p.kept, BTreeSet::from([key("shop/bad")]));
    assert_eq!(told(&p), [("shop/bad".to_owned(), "InvalidIngress")]);
    assert_eq!((p.tells[0].rv.as_str(), p.tells[0].what), ("g1", "ingress refused"));
    let routed: Vec<String> = p.routed(|_| true).map(|(k, ..)| k.to_string()).collect();
    assert_eq!(routed, ["shop/web"]);
    assert_eq!(p.routed(|_| false).count(), 0, "only fleets with addresses");
    assert!(p.held.is_empty() && p.held_new.is_empty() && p.bulk.is_empty());

    // Published and unchanged: the next pass publishes nothing and tells the same (the loop
    // says each warning once).
    let mut published = Published::default();
    record_all(&p, &mut published);
    let again = plan(&all, &rules(), &published);
    assert!(again.actions.is_empty(), "{:?}", again.actions);
    assert_eq!(told(&again), told(&p));
}

#[test]
fn a_host_another_namespace_owns_is_dropped_with_a_caveat_and_the_owner_keeps_it() {
    let all = [ingress("blog", "late", "a.com", "/", 9), ingress("shop", "first", "a.com", "/", 1)];
    let p = plan(&all, &rules(), &Published::default());
    let routes = |k: &str| match p
        .actions
        .iter()
        .find(|a| matches!(a, Action::Upsert(r) if r.key == key(k)))
    {
        Some(Action::Upsert(r)) => r.routes.len(),
        _ => usize::MAX,
    };
    assert_eq!((routes("shop/first"), routes("blog/late")), (1, 0));
    assert!(
        p.tells
            .iter()
            .all(|t| t.key == key("blog/late") && t.what == "ingress routed with a caveat")
    );
    assert!(!p.tells.is_empty());
    // With no routes left, its status shows no addresses.
    assert!(p.routed(|_| true).all(|(k, ..)| *k == key("shop/first")));
}

#[test]
fn an_ingress_over_its_budget_is_refused_alone_and_keeps_what_it_had() {
    let rules = Rules { limits: IngressLimits { max_paths: 0, ..rules().limits }, ..rules() };
    let p = plan(&[ingress("shop", "web", "a.com", "/", 1)], &rules, &Published::default());
    assert!(p.actions.is_empty());
    assert_eq!(p.kept, BTreeSet::from([key("shop/web")]));
    assert_eq!(told(&p), [("shop/web".to_owned(), "RoutesTooLarge")]);
    assert!(p.tells[0].note.contains("--max-paths-per-ingress"), "{}", p.tells[0].note);
}

#[test]
fn outside_the_policy_an_ingress_is_withdrawn_and_told() {
    let policy = Policy::parse("namespaces: {blog: {fleets: ['*'], hosts: ['*']}}").unwrap();
    let web = ingress("shop", "web", "a.com", "/", 1);
    // Published before the policy came: withdrawn now.
    let mut published = Published::default();
    record_all(&plan(std::slice::from_ref(&web), &rules(), &published), &mut published);
    let p = plan_with(&[web], &rules(), &published, Some(&policy), &mut Budget::default());
    assert_eq!(
        p.actions,
        [Action::Delete { fleet: FleetName::new("edge").unwrap(), key: key("shop/web") }]
    );
    assert_eq!(told(&p), [("shop/web".to_owned(), "NotAllowed")]);
    assert!(p.kept.is_empty());
}

#[test]
fn refused_ingresses_beyond_the_cap_lose_their_routes_the_oldest_first() {
    let rules = Rules { max_kept_per_namespace: 1, ..rules() };
    let all = [
        ingress("shop", "old", "a.com", "", 1),
        ingress("shop", "new", "b.com", "", 5),
        ingress("shop", "mid", "c.com", "", 3),
    ];
    let p = plan(&all, &rules, &Published::default());
    assert_eq!(p.kept, BTreeSet::from([key("shop/new")]));
    let not_kept: Vec<String> = p
        .tells
        .iter()
        .filter(|t| t.reason == "RefusedNotKept")
        .map(|t| t.key.to_string())
        .collect();
    assert_eq!(not_kept, ["shop/mid", "shop/old"]);
}

#[test]
fn the_churn_budget_holds_a_namespace_s_changes_beyond_its_burst_and_says_so() {
    // 6 a minute: a burst of one pass's changes per namespace and fleet.
    let mut churn = Budget::new(6);
    let all: Vec<_> =
        (0..3).map(|i| ingress("shop", &format!("w{i}"), &format!("{i}.com"), "/", i)).collect();
    let mut published = Published::default();
    let first = plan_with(&all[..1], &rules(), &published, None, &mut churn);
    assert_eq!(upserts(&first), ["shop/w0"]);
    record_all(&first, &mut published);
    let p = plan_with(&all, &rules(), &published, None, &mut churn);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(p.held.len(), 2);
    assert_eq!(p.held_new, BTreeSet::from([key("shop/w1"), key("shop/w2")]));
    let throttled = p.tells.iter().filter(|t| t.reason == "Throttled").count();
    assert_eq!(throttled, 2);
}

#[test]
fn tls_is_two_phases_the_secrets_named_then_the_certificates_sealed_in() {
    let all = [ingress("shop", "web", "a.com", "/", 1)];
    let services = services(&["shop"]);
    let objects = objects(&all, &services);
    let published = Published::default();
    let res = resolve(&objects, &rules(), &mut Memo::default(), &published, false);
    let edge = |f: &FleetName| f.as_str() == "edge";
    assert_eq!(res.secrets(edge), BTreeSet::from([("shop".to_owned(), "cert".to_owned())]));
    assert!(res.secrets(|_| false).is_empty(), "only fleets with TLS on");

    // The Secret could not be used: routed without a certificate, and told why.
    let mut asked = Vec::new();
    let mut lookup = |f: &FleetName, ns: &str, name: &str| {
        asked.push(format!("{f} {ns}/{name}"));
        Err(Some("expired".to_owned()))
    };
    let memo = &mut SealMemo::default();
    let tls = Tls { sealed_for: &edge, lookup: &mut lookup, now_unix: 0, memo };
    let now = tokio::time::Instant::now();
    let p = finish(res, Some(tls), &rules(), &published, &mut Budget::default(), now);
    assert_eq!(asked, ["edge shop/cert"]);
    assert_eq!(upserts(&p), ["shop/web"]);
    let Action::Upsert(r) = &p.actions[0] else { unreachable!() };
    assert!(r.tls.iter().all(|e| e.cert.is_none()), "{:?}", r.tls);
    assert_eq!(p.tells.len(), 1);
    assert!(p.tells[0].note.contains("expired"), "{}", p.tells[0].note);

    // A fleet without TLS: not served, and told.
    let res = resolve(&objects, &rules(), &mut Memo::default(), &published, false);
    let mut lookup = |_: &FleetName, _: &str, _: &str| -> Looked {
        panic!("nothing is sealed for a fleet without TLS")
    };
    let off = |_: &FleetName| false;
    let memo = &mut SealMemo::default();
    let tls = Tls { sealed_for: &off, lookup: &mut lookup, now_unix: 0, memo };
    let p = finish(res, Some(tls), &rules(), &published, &mut Budget::default(), now);
    assert_eq!(told(&p), [("shop/web".to_owned(), "TLSNotEnabled")]);
}

/// A certificate as the watcher seals it, for the memo's tests (none of it is opened).
fn sealed_cert(fingerprint: &str, not_after_unix: i64) -> Arc<hafleet_proto::SealedCert> {
    Arc::new(hafleet_proto::SealedCert {
        fingerprint: fingerprint.to_owned(),
        names: vec![hafleet_proto::HttpHost::new("a.com").unwrap()],
        not_after_unix,
        chain_pem: format!("chain {fingerprint}").into(),
        sealed_key: format!("key {fingerprint}").into(),
        recipient: "age1".to_owned(),
    })
}

#[test]
fn certificates_are_sealed_in_again_only_when_what_they_came_from_changed() {
    let all = [ingress("shop", "web", "a.com", "/", 1)];
    let services = services(&["shop"]);
    let objects = objects(&all, &services);
    let edge = |f: &FleetName| f.as_str() == "edge";
    let (mut memo, mut seals, mut published) =
        (Memo::default(), SealMemo::default(), Published::default());
    let now = tokio::time::Instant::now();
    let day = 86_400;
    // One pass with the Secret's certificate as `cert` at `now_unix`: the plan, and how many
    // lookups it made.
    let mut pass = |cert: &Arc<hafleet_proto::SealedCert>, now_unix: i64, published: &Published| {
        let res = resolve(&objects, &rules(), &mut memo, published, false);
        let mut asked = 0;
        let mut lookup = |_: &FleetName, _: &str, _: &str| -> Looked {
            asked += 1;
            Ok(cert.clone())
        };
        let tls = Tls { sealed_for: &edge, lookup: &mut lookup, now_unix, memo: &mut seals };
        let p = finish(res, Some(tls), &rules(), published, &mut Budget::default(), now);
        (p, asked, seals.fresh(), seals.len())
    };
    let served = |p: &Plan| match p.actions.as_slice() {
        [Action::Upsert(r)] => r.tls[0].cert.as_ref().map(|c| c.fingerprint.clone()),
        other => panic!("one upsert, not {other:?}"),
    };
    let first = sealed_cert("aa", 100 * day);
    let (p, asked, fresh, kept) = pass(&first, 0, &published);
    assert_eq!((served(&p).as_deref(), asked, fresh, kept), (Some("aa"), 1, 1, 1));
    record_all(&p, &mut published);

    // Nothing changed: the entries are the memo's (the Secret is still looked up, to know).
    let (p, asked, fresh, kept) = pass(&first, 0, &published);
    assert_eq!((p.actions.len(), asked, fresh, kept), (0, 1, 0, 1), "{:?}", p.actions);

    // The Secret's certificate is another (a rotation): sealed in anew and published.
    let second = sealed_cert("bb", 100 * day);
    let (p, _, fresh, _) = pass(&second, 0, &published);
    assert_eq!((served(&p).as_deref(), fresh), (Some("bb"), 1));
    record_all(&p, &mut published);

    // The same certificate, now within the expiry warning: worked out again, and told.
    let warn_days = i64::from(rules().cert_expiry_warning_days);
    let (p, _, fresh, _) = pass(&second, (100 - warn_days + 1) * day, &published);
    assert_eq!(fresh, 1);
    assert!(p.actions.is_empty(), "the entries are the same: {:?}", p.actions);
    assert_eq!(told(&p), [("shop/web".to_owned(), "CertificateExpiring")]);

    // A pass that seals nothing for it (TLS off on its fleet) drops its entry.
    let res = resolve(&objects, &rules(), &mut memo, &published, false);
    let off = |_: &FleetName| false;
    let mut lookup = |_: &FleetName, _: &str, _: &str| -> Looked { Err(None) };
    let tls = Tls { sealed_for: &off, lookup: &mut lookup, now_unix: 0, memo: &mut seals };
    finish(res, Some(tls), &rules(), &published, &mut Budget::default(), now);
    assert_eq!(seals.len(), 0);
}

#[test]
fn warnings_about_ingresses_that_changed_or_went_can_be_forgotten() {
    let all = [ingress("shop", "web", "a.com", "/", 1)];
    let services = services(&["shop"]);
    let objects = objects(&all, &services);
    let published = Published::default();
    let res = resolve(&objects, &rules(), &mut Memo::default(), &published, true);
    let p = finish(
        res,
        None,
        &rules(),
        &published,
        &mut Budget::default(),
        tokio::time::Instant::now(),
    );
    assert_eq!(p.current, Some(BTreeSet::from([(key("shop/web"), "g1".to_owned())])));
    let res = resolve(&objects, &rules(), &mut Memo::default(), &published, false);
    assert!(
        finish(
            res,
            None,
            &rules(),
            &published,
            &mut Budget::default(),
            tokio::time::Instant::now()
        )
        .current
        .is_none()
    );
}
