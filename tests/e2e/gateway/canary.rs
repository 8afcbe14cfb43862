//! hafleet's own case beyond the peers: an HTTPRoute's change rolls out as every version does,
//! to the canary host first; one that breaks what the probes check never leaves it.

use super::{ANY, Bed, V1, V2, backend, expect_cases, get_, http_route};
use anyhow::Result;
use hafleet_proto::{ApplyOutcome, ApplyStage};
use hafleet_tests::gateway_api::{INFRA_NS, create, patch};
use serde_json::json;

/// A new generation of an HTTPRoute goes to the canary first (it is done there before the
/// other host finishes); a generation whose backend cannot be resolved (its requests answer
/// 500, as the specification says) fails the fleet's probe on the canary, which goes back to
/// what it served, and the other host never gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_route_change_goes_to_the_canary_first_and_a_bad_one_stays_there() -> Result<()> {
    let mut bed = Bed::start().await?;
    let spec = |service: &str| {
        json!({"parentRefs": [{"name": "same-namespace"}],
               "rules": [{"backendRefs": backend(service)}]})
    };
    create(&bed.client, http_route(INFRA_NS, "canary", spec("infra-backend-v1"))).await?;
    bed.accepted_and_resolved((INFRA_NS, "canary"), "same-namespace").await?;
    expect_cases(&bed, &[(get_("/"), V1)]).await?;
    let probes = format!("[[probes]]\npath = \"/\"\nhost = \"{ANY}\"\nstatus = 200\n");
    bed.world.stack.restart_applier_with_inventory(&probes, &[("HAFLEET_PROBE_TIMEOUT", "2s")])?;

    // Generation 2: to the canary, then the other host.
    let change = |service: &str| json!({"spec": spec(service)});
    patch(&bed.client, "HTTPRoute", (INFRA_NS, "canary"), change("infra-backend-v2")).await?;
    expect_cases(&bed, &[(get_("/"), V2)]).await?;
    let good = bed.world.stack.latest_version().await?.expect("a version").version;
    let (lb1, lb2) = (bed.world.report("lb-1", good).await?, bed.world.report("lb-2", good).await?);
    assert_eq!((&lb1.outcome, &lb2.outcome), (&ApplyOutcome::Applied, &ApplyOutcome::Applied));
    assert!(lb1.finished_unix_ms <= lb2.finished_unix_ms, "{lb1:?} {lb2:?}");

    // Generation 3 names a Service that does not exist: 500 on the canary, its probe fails, it
    // goes back, and the rollout stops there.
    patch(&bed.client, "HTTPRoute", (INFRA_NS, "canary"), change("nonexistent")).await?;
    let stack = &bed.world.stack;
    let bad = hafleet_tests::eventually(crate::CONVERGE, "generation 3's version", || async move {
        let v = stack.latest_version().await?.expect("a version").version;
        anyhow::ensure!(v > good, "still version {v}");
        Ok(v)
    })
    .await?;
    let report = bed.world.report("lb-1", bad).await?;
    let ApplyOutcome::Failed { stage, restored, .. } = &report.outcome else {
        panic!("version {bad} should fail its probe on the canary: {report:?}");
    };
    assert_eq!((*stage, *restored), (ApplyStage::Probe, true));
    assert_eq!(stack.last_report("lb-2").await?.map(|r| r.version), Some(good));
    expect_cases(&bed, &[(get_("/"), V2)]).await
}
