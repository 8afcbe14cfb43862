//! What one namespace can and cannot do to another (docs/ingress.md, "Tenants"), and what one
//! Ingress can and cannot do to its fleet: each sentence of that section has its test here or
//! in `refusals`.

use crate::refusals::warning_event_in;
use crate::{World, expect_everywhere, ingress};
use anyhow::Result;
use hafleet_tests::fixtures::IngressBuilder;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// An Ingress named `name` on fleet `edge`.
fn edge(name: &str) -> IngressBuilder {
    IngressBuilder::new(name).fleet("edge")
}

/// Namespace `default` routes `*.example.com` and every host (a host-less rule); `team-b` owns
/// `shop.example.com` and `*.b.test`, and routes one path of each. A request for a path of
/// theirs that team-b does not route is a 404: never `default`'s wildcard or host-less rule,
/// however the host is spelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owned_host_is_answered_by_its_owner_s_rules_only() -> Result<()> {
    let world = World::start().await?;
    let stack = &world.stack;
    let catch = edge("catch").route("*.example.com", "/", "api").path(None, "/", "Prefix", "web");
    let catch = catch.build();
    world.ingresses.create(&PostParams::default(), &catch).await?;
    expect_everywhere(stack, "shop.example.com", "/login", 200, "api@").await?;

    stack.kube.ensure_namespace("team-b").await?;
    let team_b: Api<Ingress> = Api::namespaced(stack.kube.client().await?, "team-b");
    // Its Service does not exist: its routes answer 503, which nothing else here does.
    let shop = edge("shop").route("shop.example.com", "/api", "missing");
    let shop = shop.route("*.b.test", "/only", "missing").build();
    team_b.create(&PostParams::default(), &shop).await?;
    expect_everywhere(stack, "shop.example.com", "/api/x", 503, "").await?;
    for (host, path, status, body) in [
        ("shop.example.com", "/login", 404, ""),
        ("shop.example.com", "/", 404, ""),
        ("SHOP.Example.com.:80", "/login", 404, ""), // case, port and a final dot
        ("shop.example.com.", "/api", 503, ""),
        ("x.b.test", "/only", 503, ""),
        ("x.b.test", "/other", 404, ""), // an owned wildcard: not the host-less rule
        ("other.example.com", "/login", 200, "api@"), // default's wildcard still
        ("a.shop.example.com", "/", 200, "web@"), // *.example.com is one label deep
        ("unknown.test", "/login", 200, "web@"), // default's host-less rule still
        ("x.y.b.test", "/other", 200, "web@"), // … for hosts no rule names
    ] {
        expect_everywhere(stack, host, path, status, body).await?;
    }
    Ok(())
}

/// `/admin` is restricted by `hafleet.io/allow-source` (another Ingress of the same namespace
/// routes `/`): no spelling of `/admin` reaches the open `/` rule, and a Host that is no host
/// name is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_path_gets_the_answer_of_the_rule_its_normal_form_matches() -> Result<()>
{
    let world = World::start().await?;
    let stack = &world.stack;
    let host = "adm.example.com";
    world.route("root", host, "/", "web").await?;
    world.route("admin", host, "/admin", "api").await?;
    const SPELLINGS: [&str; 7] =
        ["/admin", "/%61dmin", "//admin", "/x/../admin", "/./admin", "/admin/", "/%2e/admin"];
    for path in SPELLINGS {
        expect_everywhere(stack, host, path, 200, "api@").await?;
    }
    // Only 10.0.0.0/8 may see /admin; this test comes from 127.x.
    let only_ten = json!({"metadata": {"annotations": {"hafleet.io/allow-source": "10.0.0.0/8"}}});
    world.ingresses.patch("admin", &PatchParams::default(), &Patch::Merge(&only_ten)).await?;
    expect_everywhere(stack, host, "/admin", 403, "").await?;
    for path in SPELLINGS.iter().chain(&["/admin/x", "//admin//x", "/a/b/../../admin"]) {
        expect_everywhere(stack, host, path, 403, "").await?;
    }
    for path in ["/", "/administrator", "/x/admin", "/admin%2fx"] {
        expect_everywhere(stack, host, path, 200, "web@").await?;
    }
    // Spellings of the host: case, port and a final dot are the same host; what is no host
    // name, or two Host headers, is refused.
    expect_everywhere(stack, "ADM.example.com.:80", "//admin", 403, "").await?;
    for bad in ["adm_example.com", "adm..example.com", "adm.example.com:x", "a b"] {
        expect_everywhere(stack, bad, "/", 400, "").await?;
    }
    expect_everywhere(stack, "adm.example.com\r\nHost: other.test", "/", 400, "").await?;
    Ok(())
}

/// An allow-source list as long as the annotation allows goes live (over several HAProxy
/// lines); a longer one is refused alone with an Event; an Ingress named with 200 characters
/// (Kubernetes allows 253, with no limit between dots) is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_lists_and_long_names_cannot_freeze_the_fleet() -> Result<()> {
    let world = World::start().await?;
    let stack = &world.stack;
    // 255 networks this test does not come from, then its own.
    let mut nets: Vec<String> = (0..255).map(|i| format!("10.{i}.0.0/16")).collect();
    nets.push("127.0.0.0/8".into());
    let wide = edge("wide").annotate("allow-source", &nets.join(","));
    let wide = wide.route("wide.example.com", "/", "web").build();
    world.ingresses.create(&PostParams::default(), &wide).await?;
    expect_everywhere(stack, "wide.example.com", "/", 200, "web@").await?;
    for h in &stack.hosts {
        let live = h.live_config();
        assert_eq!(live.matches("acl hafleet_allowed src ").count(), 8, "{live}");
    }

    let mut more: Vec<String> =
        (0..300).map(|i| format!("10.{}.{}.0/24", i / 256, i % 256)).collect();
    more.push("127.0.0.0/8".into());
    let too_wide = edge("too-wide").annotate("allow-source", &more.join(","));
    let too_wide = too_wide.route("too-wide.example.com", "/", "web").build();
    world.ingresses.create(&PostParams::default(), &too_wide).await?;
    let event = warning_event_in(stack, "default", "too-wide", "InvalidIngress").await?;
    let note = event.note.unwrap_or_default();
    assert!(note.contains("more than 256 networks"), "{note}");

    let long = format!("l{}", "o".repeat(198)) + "ng";
    assert_eq!(long.len(), 201);
    world
        .ingresses
        .create(
            &PostParams::default(),
            &ingress(&long, Some("edge"), "long.example.com", "/", "api"),
        )
        .await?;
    expect_everywhere(stack, "long.example.com", "/", 200, "api@").await?;
    expect_everywhere(stack, "too-wide.example.com", "/", 404, "").await?;
    // Still served, and nothing refused it.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(stack.kube.client().await?, "default");
    let refused = events.list(&Default::default()).await?.items.into_iter().any(|e| {
        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(long.as_str())
            && e.type_.as_deref() == Some("Warning")
    });
    assert!(!refused, "the long-named Ingress was warned about");
    Ok(())
}

/// The admin's tenancy policy (a ConfigMap the watcher reads live): a namespace uses only the
/// fleets, claims only the hosts and writes host-less rules only as it says; an Ingress outside
/// it is not routed (what it had is withdrawn) and is told; a broken policy keeps the last
/// good one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_s_tenancy_policy_says_who_may_claim_what() -> Result<()> {
    use hafleet_tests::stack::Component;
    use k8s_openapi::api::core::v1::ConfigMap;
    let mut world = World::start().await?;
    // Before any policy: a host-less rule catches any host.
    let any = edge("any").path(None, "/", "Prefix", "web").build();
    world.ingresses.create(&PostParams::default(), &any).await?;
    world.route("mine", "a.example.com", "/", "api").await?;
    expect_everywhere(&world.stack, "unknown.test", "/", 200, "web@").await?;
    expect_everywhere(&world.stack, "a.example.com", "/", 200, "api@").await?;

    let client = world.stack.kube.client().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "hafleet");
    let policy = |yaml: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": "hafleet-tenancy"},
                                      "data": {"policy.yaml": yaml}}))
        .unwrap()
    };
    let first = "namespaces:\n  default: {fleets: [edge], hosts: [.example.com]}\n  \
                 team-b: {fleets: [edge], hosts: [shop.team-b.test]}\n";
    cms.create(&PostParams::default(), &policy(first)).await?;
    world.stack.restart_with(
        Component::Watcher,
        &[("HAFLEET_TENANCY_POLICY", "hafleet/hafleet-tenancy")],
    )?;
    let stack = &world.stack;
    // The host-less rule is withdrawn and told; what the policy allows stays.
    expect_everywhere(stack, "unknown.test", "/", 404, "").await?;
    let told = warning_event_in(stack, "default", "any", "NotAllowed").await?;
    assert!(told.note.unwrap_or_default().contains("rules without a host"));
    expect_everywhere(stack, "a.example.com", "/", 200, "api@").await?;

    world.route("elsewhere", "x.other.test", "/", "web").await?;
    let told = warning_event_in(stack, "default", "elsewhere", "NotAllowed").await?;
    let note = told.note.unwrap_or_default();
    assert!(note.contains("does not let namespace default claim host x.other.test"), "{note}");
    stack.kube.ensure_namespace("team-b").await?;
    stack.kube.ensure_namespace("team-c").await?;
    let ns = |n: &str| Api::<Ingress>::namespaced(client.clone(), n);
    let to_missing = |fleet: &str, name: &str, host: &str| {
        IngressBuilder::new(name).fleet(fleet).route(host, "/", "missing").build()
    };
    let post = PostParams::default();
    ns("team-b").create(&post, &to_missing("edge", "shop", "shop.team-b.test")).await?;
    ns("team-b").create(&post, &to_missing("core", "core", "core.team-b.test")).await?;
    ns("team-c").create(&post, &to_missing("edge", "c", "c.example.com")).await?;
    expect_everywhere(stack, "shop.team-b.test", "/", 503, "").await?;
    for (namespace, name, says) in [
        ("team-b", "core", "does not let namespace team-b use fleet core"),
        ("team-c", "c", "gives namespace team-c no fleet"),
    ] {
        let told = warning_event_in(stack, namespace, name, "NotAllowed").await?;
        let note = told.note.unwrap_or_default();
        assert!(note.contains(says), "{note}");
    }
    expect_everywhere(stack, "c.example.com", "/", 404, "").await?;
    expect_everywhere(stack, "x.other.test", "/", 404, "").await?;

    // Read live: default may now claim .other.test too.
    let wider = first.replace("[.example.com]", "[.example.com, .other.test]");
    cms.replace("hafleet-tenancy", &PostParams::default(), &{
        let mut p = policy(&wider);
        p.metadata.resource_version = cms.get("hafleet-tenancy").await?.metadata.resource_version;
        p
    })
    .await?;
    expect_everywhere(stack, "x.other.test", "/", 200, "web@").await?;
    // A broken policy keeps the last good one in force.
    let broken = json!({"data": {"policy.yaml": "namespaces: [not, a, map]"}});
    cms.patch("hafleet-tenancy", &PatchParams::default(), &Patch::Merge(&broken)).await?;
    world.route("later", "later.example.com", "/", "api").await?;
    expect_everywhere(stack, "later.example.com", "/", 200, "api@").await?;
    expect_everywhere(stack, "x.other.test", "/", 200, "web@").await?;
    expect_everywhere(stack, "unknown.test", "/", 404, "").await?;

    // A refused Ingress keeps its last good routes only while the policy allows them: `mine`
    // is made invalid (kept, still served), then the admin takes .example.com away.
    let invalid = json!({"metadata": {"annotations": {"hafleet.io/balance": "fastest"}}});
    world.ingresses.patch("mine", &PatchParams::default(), &Patch::Merge(&invalid)).await?;
    warning_event_in(stack, "default", "mine", "InvalidIngress").await?;
    expect_everywhere(stack, "a.example.com", "/", 200, "api@").await?;
    let narrower = json!({"data": {"policy.yaml": wider.replace(".example.com, ", "")}});
    cms.patch("hafleet-tenancy", &PatchParams::default(), &Patch::Merge(&narrower)).await?;
    expect_everywhere(stack, "a.example.com", "/", 404, "").await?;
    expect_everywhere(stack, "x.other.test", "/", 200, "web@").await?;
    Ok(())
}

/// The safety net: a version HAProxy refuses because of the lines one Ingress made (here a
/// template whose backend macro breaks only for that Ingress's settings) is traced back to
/// that Ingress, which is quarantined with an Event; the fleet moves on without it, serves
/// the next change, and takes it back once its owner changes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingress_whose_lines_haproxy_refuses_is_quarantined_and_the_fleet_moves_on() -> Result<()>
{
    let mut world = World::start().await?;
    world.route("good", "good.example.com", "/", "web").await?;
    // Any host no rule names: what a quarantined Ingress's host must not fall through to.
    let any = edge("any").path(None, "/", "Prefix", "web").build();
    world.ingresses.create(&PostParams::default(), &any).await?;
    let bad = edge("bad").annotate("max-conn", "77").route("bad.example.com", "/", "api").build();
    world.ingresses.create(&PostParams::default(), &bad).await?;
    expect_everywhere(&world.stack, "bad.example.com", "/", 200, "api@").await?;
    let before = world.stack.latest_version().await?.map(|v| v.version).unwrap_or(0);

    // A template that writes a line HAProxy refuses into the backend of maxconn 77 only.
    let marker = "# quarantine test template";
    crate::render_with(
        &mut world,
        "breaks-77.j2",
        |t| {
            let t = t.replace(
                "{%- if b.cookie %}\n    cookie",
                "{%- if b.max_conn == 77 %}\n    no-such-directive on\n{%- endif %}\n{%- if b.cookie %}\n    cookie",
            );
            format!("{t}{marker}\n")
        },
        marker,
    )
    .await?;
    let stack = &world.stack;
    let told = warning_event_in(stack, "default", "bad", "Quarantined")
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))?;
    let note = told.note.unwrap_or_default();
    assert!(note.contains("no-such-directive"), "HAProxy's words reach the owner: {note}");
    // 404: its host stays its own, not caught by the host-less rule.
    expect_everywhere(stack, "bad.example.com", "/", 404, "").await?;
    expect_everywhere(stack, "good.example.com", "/", 200, "web@").await?;
    expect_everywhere(stack, "nobody.example.com", "/", 200, "web@").await?;
    // The fleet serves the next change; the version that took it out says why.
    world.route("next", "next.example.com", "/", "web").await?;
    expect_everywhere(stack, "next.example.com", "/", 200, "web@").await?;
    let quarantines: Vec<_> = stack
        .versions()
        .await?
        .into_iter()
        .filter(|v| v.version > before)
        .flat_map(|v| v.causes.into_iter().filter(|c| c.what == "quarantine"))
        .collect();
    assert_eq!(quarantines.len(), 1, "{quarantines:?}");
    let who = quarantines[0].ingress.as_ref().map(|k| k.to_string());
    assert_eq!(who.as_deref(), Some("default/bad"));
    assert!(quarantines[0].note.as_deref().unwrap_or_default().contains("no-such-directive"));
    for h in &stack.hosts {
        let live = h.live_config();
        assert!(!live.contains("no-such-directive"), "{live}");
        assert!(live.contains("#   default/bad: quarantined"), "named in the notes: {live}");
        // … and in the applier's report of that version (published a moment after).
        let what = format!("{}'s report naming default/bad", h.name());
        hafleet_tests::eventually(crate::CONVERGE, &what, || async move {
            let report = stack.last_report(h.name()).await?.expect("a report");
            let out: Vec<String> = report.quarantined.iter().map(|k| k.to_string()).collect();
            anyhow::ensure!(out == ["default/bad"], "{report:?}");
            Ok(())
        })
        .await?;
    }

    // Its owner changes it (another max-conn): it is taken back and served.
    let fixed = json!({"metadata": {"annotations": {"hafleet.io/max-conn": "78"}}});
    world.ingresses.patch("bad", &PatchParams::default(), &Patch::Merge(&fixed)).await?;
    expect_everywhere(&world.stack, "bad.example.com", "/", 200, "api@").await?;
    // A host serves the version a moment before its report of it is published.
    let stack = &world.stack;
    hafleet_tests::eventually(crate::CONVERGE, "lb-1's report without quarantine", || async move {
        let report = stack.last_report("lb-1").await?.expect("a report");
        anyhow::ensure!(report.quarantined.is_empty(), "{report:?}");
        Ok(())
    })
    .await?;
    Ok(())
}
