//! Spreading a big batch of independent, pure work over the machine's cores: a fresh render of
//! 10,000 backends (each backend's subset of nodes, each backend's section) is that, while one
//! change is a handful of items and stays on the caller's thread.

/// Fewer items than this run on the caller's thread: a thread costs more than they do.
const MIN_ITEMS: usize = 512;

/// At most this many threads, whatever the machine has.
const MAX_THREADS: usize = 8;

/// For each item, in the items' order: the key and value `reuse` finds kept from an earlier
/// run, or, for the items it has none for, what `build` makes of them ([`map_chunks`] over
/// those items alone: on every core when many miss, as after a start; not at all when none
/// does).
pub fn reuse_or_build<T: Sync, K: Send, V: Send, E: Send>(
    items: &[T],
    reuse: impl FnMut(&T) -> Option<(K, V)>,
    build: impl Fn(&[&T]) -> Result<Vec<(K, V)>, E> + Sync,
) -> Result<Vec<(K, V)>, E> {
    let found: Vec<Option<(K, V)>> = items.iter().map(reuse).collect();
    let missing: Vec<&T> =
        items.iter().zip(&found).filter(|(_, f)| f.is_none()).map(|(item, _)| item).collect();
    // Nothing missing, nothing built: `build` may have a fixed cost (a template render).
    let built = match missing.is_empty() {
        true => Vec::new(),
        false => map_chunks(&missing, |part| build(part))?,
    };
    let mut built = built.into_iter();
    Ok(found
        .into_iter()
        .map(|hit| hit.unwrap_or_else(|| built.next().expect("one built per item missing")))
        .collect())
}

/// `f` of consecutive chunks of the items (one per thread, or all of them on the caller's
/// thread when there are few), concatenated in the items' order; the first error in that
/// order, if any.
fn map_chunks<T: Sync, R: Send, E: Send>(
    items: &[T],
    f: impl Fn(&[T]) -> Result<Vec<R>, E> + Sync,
) -> Result<Vec<R>, E> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS);
    if items.len() < MIN_ITEMS || threads < 2 {
        return f(items);
    }
    let chunk = items.len().div_ceil(threads);
    let f = &f;
    std::thread::scope(|scope| {
        let rest: Vec<_> =
            items[chunk..].chunks(chunk).map(|part| scope.spawn(move || f(part))).collect();
        let mut out = f(&items[..chunk]);
        for handle in rest {
            let part = handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            match (&mut out, part) {
                (Ok(all), Ok(part)) => all.extend(part),
                (Ok(_), Err(e)) => out = Err(e),
                (Err(_), _) => {}
            }
        }
        out
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn keeps_the_order_of_the_items_small_or_large() {
        for n in [0, 3, super::MIN_ITEMS, 10_007] {
            let items: Vec<usize> = (0..n).collect();
            let doubled = super::map_chunks(&items, |part| {
                Ok::<_, std::convert::Infallible>(part.iter().map(|i| i * 2).collect())
            });
            assert_eq!(doubled, Ok(items.iter().map(|i| i * 2).collect::<Vec<_>>()));
        }
    }

    #[test]
    fn reuses_what_it_finds_and_builds_the_rest_in_order() {
        let items: Vec<usize> = (0..2000).collect();
        let Ok(all) = super::reuse_or_build(
            &items,
            |i| (i % 3 == 0).then_some((*i, "kept")),
            |part| Ok::<_, std::convert::Infallible>(part.iter().map(|i| (**i, "built")).collect()),
        );
        assert_eq!(all.len(), items.len());
        for (i, (key, how)) in all.iter().enumerate() {
            assert_eq!((*key, *how), (i, if i % 3 == 0 { "kept" } else { "built" }));
        }
    }
}
