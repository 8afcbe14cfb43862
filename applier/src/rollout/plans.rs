//! The plans between versions, worked out once per pair for all hosts of a rollout, with
//! the bridge a reload may have.

use super::*;

/// The plans from one bundle to another worked out lately, by their sha256s. The hosts of a
/// fleet almost always run the same version, so a rollout works out each plan once instead of
/// once per host: a node drained at 10,000 backends takes 40 to 50 ms to plan (two configs of
/// 2.8 MB parsed), in the rollout's one task, which 20 hosts would otherwise wait on in turn.
#[derive(Debug, Default)]
pub struct Plans(pub(super) std::sync::Mutex<Vec<PlanEntry>>);

/// (the loaded bundle's sha256, the next one's, the plan between them, and for a reload,
/// the [`runtime::bridge`] being looked for).
pub(super) type PlanEntry = (String, String, std::sync::Arc<runtime::Plan>, Option<PendingBridge>);

/// A [`runtime::bridge`] worked out on a blocking thread, awaited by every host that needs it.
pub type PendingBridge = futures::future::Shared<
    futures::future::BoxFuture<'static, Option<std::sync::Arc<runtime::Bridge>>>,
>;

impl Plans {
    /// Plans kept: those of the last few versions, from the one or two versions hosts run.
    pub(super) const KEEP: usize = 4;

    /// The plan from `loaded` to `next`, worked out once for each pair of versions; for a
    /// reload, also the bridge (new backends served through spares ahead of it), looked for
    /// on a blocking thread from now on, while the hosts upload and check the version.
    pub fn get(
        &self,
        loaded: &ConfigVersion,
        next: &ConfigVersion,
    ) -> Option<(std::sync::Arc<runtime::Plan>, Option<PendingBridge>)> {
        use futures::FutureExt as _;
        let (Some(from), Some(to)) = (loaded.bundle(), next.bundle()) else { return None };
        // Held while planning, with no await inside: a rollout prepares its hosts in one task,
        // so nothing contends for it.
        let mut plans = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = |e: &PlanEntry| e.0 == loaded.sha256 && e.1 == next.sha256;
        if let Some(entry) = plans.iter().find(|e| key(e)) {
            return Some((entry.2.clone(), entry.3.clone()));
        }
        let plan = std::sync::Arc::new(runtime::plan_alone(from, to));
        let bridge = matches!(*plan, runtime::Plan::Reload(_)).then(|| {
            let (from, to) = (from.clone(), to.clone());
            let task = tokio::task::spawn_blocking(move || {
                runtime::bridge(&from, &to).map(std::sync::Arc::new)
            });
            async move { task.await.ok().flatten() }.boxed().shared()
        });
        if plans.len() >= Self::KEEP {
            plans.remove(0);
        }
        plans.push((loaded.sha256.clone(), next.sha256.clone(), plan.clone(), bridge.clone()));
        Some((plan, bridge))
    }
}
