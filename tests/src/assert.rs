//! Waiting for what must become true on every HAProxy host of a fleet.

use crate::HaproxyHost;
use crate::stack::Stack;
use anyhow::Result;
use std::future::Future;
use std::time::Duration;

/// Retries `check` on each of `hosts` in turn until it passes there (each within `timeout`),
/// and returns what it gave for each; the first host where it never passes fails the whole,
/// with what it said last and the stack's logs.
pub async fn on_hosts<'a, T, F, Fut>(
    stack: &Stack,
    hosts: &'a [HaproxyHost],
    timeout: Duration,
    what: &str,
    check: F,
) -> Result<Vec<T>>
where
    F: Fn(&'a HaproxyHost) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut out = Vec::with_capacity(hosts.len());
    for h in hosts {
        let what = format!("{}: {what}", h.name());
        let got = crate::eventually(timeout, &what, || check(h))
            .await
            .map_err(|e| anyhow::anyhow!("{e:#}\n{}", stack.logs()))?;
        out.push(got);
    }
    Ok(out)
}

/// [`on_hosts`] on every host of `stack`.
pub async fn on_every_host<'a, T, F, Fut>(
    stack: &'a Stack,
    timeout: Duration,
    what: &str,
    check: F,
) -> Result<Vec<T>>
where
    F: Fn(&'a HaproxyHost) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    on_hosts(stack, &stack.hosts, timeout, what, check).await
}
