//! Bounded churn: how often one namespace may change what a fleet runs
//! (`--namespace-changes-per-minute`). Pure: the clock is a parameter.
//!
//! ```text
//! index::diff ──actions──▶ Budget::admit ──go──▶ publish
//!                              │
//!                              └─held──▶ not published, not recorded: the next diff finds them
//!                                        again, in their latest state; next_due says when
//! ```
//! Each (fleet, namespace) has a token bucket: `per_minute` tokens a minute, holding at most ten
//! seconds' worth (at least one), full to begin with. A pass that publishes changes of a
//! namespace on a fleet costs that pair one token, however many of its Ingresses changed (the
//! renderer makes one version of them: one reload). Without a token, the pass holds all of the
//! pair's upserts; the fleet keeps what was last published of them, and once a token is due they
//! go together, each in its latest state. An Ingress toggled back meanwhile goes nowhere and
//! costs nothing.
//!
//! Deletions are never held: holding one would keep serving what its owner has removed (a
//! leaked or abandoned site), and a namespace can only delete what it made. They are paid for
//! all the same, going into debt (at most a minute's worth), so that a create/delete loop makes
//! no more reloads than the budget either. A fleet change is a delete on one fleet and an upsert
//! on the other: it is held whole while the upsert is, so the Ingress stays on its old fleet.
//! An upsert whose last publish failed (recorded as unknown) is a resend, not a change: it goes.
//!
//! The bucket is kept as the instant it is full again (GCRA's theoretical arrival time), so the
//! arithmetic is exact in `Duration`s, and a pair whose bucket is full is forgotten.

use crate::core::index::{Action, Published};
use hafleet_proto::{FleetName, IngressKey, Namespace};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;
use tokio::time::Instant;

/// A namespace on a fleet: what a budget is kept for.
pub type Pair = (FleetName, Namespace);

/// The budgets of every (fleet, namespace) that spent some lately.
#[derive(Debug, Default)]
pub struct Budget {
    /// Changes a minute per pair; 0: off, everything goes.
    per_minute: u32,
    /// Time between two tokens.
    interval: Duration,
    /// How far a pair's full-again instant may lie ahead and a change still go: one token
    /// fewer than the burst.
    tolerance: Duration,
    /// How far it may lie ahead at most, deletions' debt included: the burst and a minute.
    ceiling: Duration,
    /// Per pair, the instant its bucket is full again (only pairs for which it is ahead).
    full_at: HashMap<Pair, Instant>,
    /// The pairs whose changes the last pass held, with the instant their next token is due.
    held: BTreeMap<Pair, Instant>,
}

/// What a pass may publish and what it holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Admitted {
    /// In the order they came.
    pub go: Vec<Action>,
    /// The held upserts' (fleet, Ingress), in the order they came.
    pub held: Vec<(FleetName, IngressKey)>,
}

impl Budget {
    /// A budget of `per_minute` changes a minute for each (fleet, namespace); 0 turns it off.
    pub fn new(per_minute: u32) -> Budget {
        if per_minute == 0 {
            return Budget::default();
        }
        let interval = Duration::from_secs(60) / per_minute;
        let burst = Budget::burst_of(per_minute);
        let tolerance = interval * (burst - 1);
        Budget {
            per_minute,
            interval,
            tolerance,
            ceiling: interval * burst + Duration::from_secs(60),
            ..Budget::default()
        }
    }

    /// Changes that go at once on a full bucket: ten seconds' worth, at least one.
    pub fn burst_of(per_minute: u32) -> u32 {
        (per_minute / 6).max(1)
    }

    /// Splits `actions` (a pass's, from [`crate::core::index::diff`] against `published`) into what
    /// goes now and what waits, and spends the tokens of what goes.
    pub fn admit(&mut self, actions: Vec<Action>, published: &Published, now: Instant) -> Admitted {
        self.held.clear();
        self.full_at.retain(|_, full| *full > now);
        if self.per_minute == 0 {
            return Admitted { go: actions, held: vec![] };
        }
        let pair = |fleet: &FleetName, key: &IngressKey| (fleet.clone(), key.namespace.clone());
        // A resend of what may already have been stored changes nothing new.
        let resend = |r: &crate::core::model::Resolved| {
            matches!(crate::core::index::published_on(published, &r.key, &r.fleet), Some(None))
        };
        let wanting: BTreeSet<Pair> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Upsert(r) if !resend(r) => Some(pair(&r.fleet, &r.key)),
                _ => None,
            })
            .collect();
        let mut paid: BTreeSet<Pair> = BTreeSet::new();
        for p in wanting {
            let full = self.full_at.get(&p).copied().unwrap_or(now).max(now);
            if full <= now + self.tolerance {
                self.full_at.insert(p.clone(), full + self.interval);
                paid.insert(p);
            } else {
                // When it is due is known once this pass's deletions are paid for.
                self.held.insert(p, now);
            }
        }
        let mut out = Admitted::default();
        // The upserts held, (fleet, object).
        let mut held: BTreeSet<(FleetName, IngressKey)> = BTreeSet::new();
        for a in &actions {
            if let Action::Upsert(r) = a
                && !resend(r)
                && self.held.contains_key(&pair(&r.fleet, &r.key))
            {
                out.held.push((r.fleet.clone(), r.key.clone()));
                held.insert((r.fleet.clone(), r.key.clone()));
            }
        }
        // Objects whose every fleet this pass deletes them from, while their upsert elsewhere
        // is held: a move, whose old half waits with the new one.
        let moves = moves(&actions, &held, published);
        let mut go = Vec::with_capacity(actions.len());
        for a in actions {
            match &a {
                Action::Upsert(r)
                    if !held.is_empty() && held.contains(&(r.fleet.clone(), r.key.clone())) =>
                {
                    continue;
                }
                // The old half of a held move: the object stays where it is.
                Action::Delete { key, .. } if moves.contains(key) => continue,
                Action::Delete { fleet, key } => {
                    let p = pair(fleet, key);
                    if !paid.contains(&p) {
                        let full = self.full_at.get(&p).copied().unwrap_or(now).max(now);
                        let most = now + self.ceiling;
                        self.full_at.insert(p.clone(), (full + self.interval).min(most));
                        paid.insert(p);
                    }
                }
                Action::Upsert(_) => {}
            }
            go.push(a);
        }
        out.go = go;
        for (p, due) in self.held.iter_mut() {
            *due = self.full_at[p] - self.tolerance;
        }
        out
    }

    /// When the next of the held changes may go (none held: `None`). Only instants after
    /// `now`: one that passed without a pass reaching [`Budget::admit`] (a pass that failed
    /// first) waits for the next change or resync rather than waking the loop at once, again
    /// and again.
    pub fn next_due(&self, now: Instant) -> Option<Instant> {
        self.held.values().copied().filter(|due| *due > now).min()
    }

    /// Whether any change is held.
    pub fn holds(&self) -> bool {
        !self.held.is_empty()
    }

    /// The note of the `Throttled` Warning Event on a held Ingress of `ns` on `fleet` (the same
    /// every time, so that it is said once per generation).
    pub fn note(&self, fleet: &FleetName, ns: &Namespace) -> String {
        format!(
            "this change is held: namespace {ns} changes what fleet {fleet} runs more often than \
             the watcher allows (--namespace-changes-per-minute {}: one change every {} s after \
             a burst of {}); the fleet serves what was last published of this Ingress, and its \
             latest state goes out with the namespace's next allowed change",
            self.per_minute,
            self.interval.as_secs_f64(),
            Budget::burst_of(self.per_minute),
        )
    }
}

/// The objects of `actions` with a `held` upsert that would be published nowhere once the
/// pass's deletes and the upserts that go are done: moved, not withdrawn.
fn moves(
    actions: &[Action],
    held: &BTreeSet<(FleetName, IngressKey)>,
    published: &Published,
) -> BTreeSet<IngressKey> {
    let mut out = BTreeSet::new();
    for (_, key) in held {
        let deleted: BTreeSet<&FleetName> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Delete { fleet, key: k } if k == key => Some(fleet),
                _ => None,
            })
            .collect();
        let stays = published
            .get(key)
            .is_some_and(|fleets| fleets.iter().any(|(f, _)| !deleted.contains(f)));
        let goes = actions.iter().any(|a| {
            matches!(a, Action::Upsert(r) if r.key == *key
                && !held.contains(&(r.fleet.clone(), r.key.clone())))
        });
        if !deleted.is_empty() && !stays && !goes {
            out.insert(key.clone());
        }
    }
    out
}

/// Sleeps until `due`; with none, forever (a branch of the watcher's `select!`).
pub async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::index::{self, Desired, Wanted};
    use crate::core::model::Resolved;

    use crate::core::resolve::tests_support::resolved;

    /// One pass as the watcher makes it: diff, admit, record what went.
    fn pass(
        budget: &mut Budget,
        published: &mut Published,
        want: &[Resolved],
        at: Instant,
    ) -> Admitted {
        // One entry per object, with its routes on each fleet.
        let mut desired = Wanted::default();
        for r in want {
            match desired.entry(r.key.clone()).or_insert_with(|| Desired::Routed(vec![])) {
                Desired::Routed(rs) => rs.push(r.clone()),
                Desired::Keep(_) => unreachable!(),
            }
        }
        let admitted = budget.admit(index::diff(published, &desired), published, at);
        for a in &admitted.go {
            index::record(published, a);
        }
        admitted
    }

    fn names(admitted: &Admitted) -> (Vec<String>, Vec<String>) {
        let go = admitted
            .go
            .iter()
            .map(|a| match a {
                Action::Upsert(r) => format!("+{}/{}@{}", r.key.namespace, r.key.name, r.fleet),
                Action::Delete { fleet, key } => format!("-{}/{}@{fleet}", key.namespace, key.name),
            })
            .collect();
        let held = admitted.held.iter().map(|(f, k)| format!("{}/{}@{f}", k.namespace, k.name));
        (go, held.collect())
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn off_lets_everything_go() {
        let t0 = Instant::now();
        let mut budget = Budget::new(0);
        let mut published = Published::default();
        for i in 1..=100 {
            let a = pass(&mut budget, &mut published, &[resolved("a", "x", "edge", i)], t0);
            assert_eq!(a.go.len(), 1);
            assert!(a.held.is_empty());
        }
        assert_eq!(budget.next_due(t0), None);
    }

    #[test]
    fn over_budget_changes_are_held_and_go_together_in_their_latest_state_when_a_token_is_due() {
        let t0 = Instant::now();
        // 12 a minute: a token every 5 s, a burst of 2.
        let mut budget = Budget::new(12);
        let mut published = Published::default();
        let x = |n| resolved("a", "x", "edge", n);
        let y = |n| resolved("a", "y", "edge", n);
        assert_eq!(pass(&mut budget, &mut published, &[x(1)], t0).go.len(), 1);
        assert_eq!(pass(&mut budget, &mut published, &[x(2)], t0 + S).go.len(), 1);
        // The burst is spent: the third change waits, and so does a new Ingress of the namespace.
        let held = pass(&mut budget, &mut published, &[x(3), y(1)], t0 + 2 * S);
        assert_eq!(names(&held), (vec![], vec!["a/x@edge".into(), "a/y@edge".into()]));
        assert!(budget.holds());
        assert_eq!(published[&x(1).key][0].1.as_ref().unwrap().0.len(), 2, "x stays as published");
        assert!(!published.contains_key(&y(1).key), "y is not published, nor recorded");
        // Tokens came at 0 + 5 s and 1 + 5 s: the next is due when the bucket holds one again.
        assert_eq!(budget.next_due(t0 + 2 * S), Some(t0 + 5 * S));
        // Changed again meanwhile: still held, still due at the same time.
        let held = pass(&mut budget, &mut published, &[x(4), y(2)], t0 + 4 * S);
        assert_eq!(held.held.len(), 2);
        assert_eq!(budget.next_due(t0 + 4 * S), Some(t0 + 5 * S));
        // Due: both go in one pass, as they stand now, for one token.
        let went = pass(&mut budget, &mut published, &[x(5), y(3)], t0 + 5 * S);
        assert_eq!(names(&went), (vec!["+a/x@edge".into(), "+a/y@edge".into()], vec![]));
        assert_eq!(published[&x(1).key][0].1.as_ref().unwrap().0.len(), 5);
        assert!(!budget.holds());
        assert_eq!(budget.next_due(t0 + 5 * S), None);
        // Unchanged since: nothing to publish, nothing spent; the next change waits 5 s.
        assert!(pass(&mut budget, &mut published, &[x(5), y(3)], t0 + 5 * S).go.is_empty());
        assert_eq!(pass(&mut budget, &mut published, &[x(6), y(3)], t0 + 5 * S).held.len(), 1);
        assert_eq!(budget.next_due(t0 + 5 * S), Some(t0 + 10 * S));
        // Toggled back to what was published: nothing held, nothing to wake for.
        assert!(
            pass(&mut budget, &mut published, &[x(5), y(3)], t0 + 5 * S) == Admitted::default()
        );
        assert_eq!(budget.next_due(t0 + 5 * S), None);
    }

    #[test]
    fn each_namespace_and_fleet_has_its_own_budget() {
        let t0 = Instant::now();
        let mut budget = Budget::new(6);
        let mut published = Published::default();
        let loud = |n| resolved("loud", "x", "edge", n);
        assert_eq!(pass(&mut budget, &mut published, &[loud(1)], t0).go.len(), 1);
        let mixed =
            [loud(2), resolved("quiet", "q", "edge", 1), resolved("loud", "elsewhere", "core", 1)];
        let a = pass(&mut budget, &mut published, &mixed, t0 + S);
        assert_eq!(
            names(&a),
            (
                vec!["+loud/elsewhere@core".into(), "+quiet/q@edge".into()],
                vec!["loud/x@edge".into()]
            )
        );
        assert_eq!(budget.next_due(t0 + S), Some(t0 + 10 * S));
    }

    #[test]
    fn deletions_go_at_once_and_are_paid_for_with_at_most_a_minute_of_debt() {
        let t0 = Instant::now();
        // A token every 10 s, a burst of 1.
        let mut budget = Budget::new(6);
        let mut published = Published::default();
        let many: Vec<Resolved> =
            (0..20).map(|i| resolved("a", &format!("i{i}"), "edge", 1)).collect();
        // Made before the budget counted (the watcher's first pass is not throttled).
        pass(&mut Budget::new(0), &mut published, &many, t0);
        // Deleted one by one, a second apart: none waits.
        for i in 0..20 {
            let a = pass(&mut budget, &mut published, &many[i + 1..], t0 + S * i as u32);
            assert_eq!(names(&a).0, [format!("-a/i{i}@edge")]);
        }
        assert!(published.is_empty());
        // The namespace owes: its next change waits until the debt is paid, at most a minute
        // (and a token) after the last deletion.
        let new = resolved("a", "new", "edge", 1);
        assert_eq!(
            pass(&mut budget, &mut published, std::slice::from_ref(&new), t0 + 19 * S).held.len(),
            1
        );
        assert_eq!(budget.next_due(t0 + 19 * S), Some(t0 + 19 * S + 70 * S));
        // Another namespace owes nothing.
        let other = resolved("b", "new", "edge", 1);
        assert_eq!(
            pass(&mut budget, &mut published, &[new.clone(), other], t0 + 20 * S).go.len(),
            1
        );
        assert_eq!(
            pass(&mut budget, &mut published, std::slice::from_ref(&new), t0 + 88 * S).held.len(),
            1
        );
        assert_eq!(pass(&mut budget, &mut published, &[new], t0 + 89 * S).go.len(), 1);
    }

    #[test]
    fn a_create_delete_loop_makes_no_more_changes_than_the_budget() {
        let t0 = Instant::now();
        let mut budget = Budget::new(6);
        let mut published = Published::default();
        let x = resolved("a", "x", "edge", 1);
        let mut went = 0;
        // Created and deleted every 500 ms for a minute.
        for step in 0..120u32 {
            let want = if step % 2 == 0 { vec![x.clone()] } else { vec![] };
            went += pass(&mut budget, &mut published, &want, t0 + step * S / 2).go.len();
        }
        // A burst of 1 and a token every 10 s: 7 tokens in the minute, some paying for deletes.
        assert!(went <= 7, "{went} changes went");
        assert!(went >= 4, "{went} changes went");
    }

    /// An HTTPRoute on several fleets: the budget of one fleet holds its change there only;
    /// its upsert on another fleet goes, and so does its withdrawal from a third.
    #[test]
    fn a_route_on_several_fleets_is_held_only_where_its_budget_is_spent() {
        let t0 = Instant::now();
        // 12 a minute: a burst of 2.
        let mut budget = Budget::new(12);
        let mut published = Published::default();
        let on = |fleet: &str, n| resolved("a", "r", fleet, n);
        pass(&mut budget, &mut published, &[on("edge", 1), on("gone", 1)], t0);
        pass(&mut budget, &mut published, &[on("edge", 2), on("gone", 1)], t0 + S);
        // edge's burst is spent; new's is not, and r leaves fleet gone.
        let a = pass(&mut budget, &mut published, &[on("edge", 3), on("new", 1)], t0 + 2 * S);
        assert_eq!(
            names(&a),
            (vec!["-a/r@gone".into(), "+a/r@new".into()], vec!["a/r@edge".into()])
        );
        let fleets: Vec<&str> =
            published[&on("edge", 1).key].iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(fleets, ["edge", "new"]);
    }

    #[test]
    fn a_held_move_stays_on_its_old_fleet_and_a_resend_goes() {
        let t0 = Instant::now();
        let mut budget = Budget::new(6);
        let mut published = Published::default();
        pass(&mut budget, &mut published, &[resolved("a", "x", "edge", 1)], t0);
        let moved = resolved("a", "x", "core", 1);
        // A move is paid on the fleet it goes to (core's budget is full): it goes, and the
        // delete on edge with it, paid on edge.
        let a = pass(&mut budget, &mut published, std::slice::from_ref(&moved), t0 + S);
        assert_eq!(names(&a).0, ["-a/x@edge", "+a/x@core"]);
        // Back to edge, where a's token is spent: held whole, the Ingress stays on core.
        let a = pass(&mut budget, &mut published, &[resolved("a", "x", "edge", 1)], t0 + 2 * S);
        assert_eq!(names(&a), (vec![], vec!["a/x@edge".into()]));
        assert_eq!(published[&moved.key][0].0.as_str(), "core");
        // A publish that failed may or may not have been stored: sending it again is no change.
        let y = resolved("a", "y", "edge", 1);
        index::record_unknown(&mut published, &Action::Upsert(y.clone()));
        let a = pass(&mut budget, &mut published, &[moved, y], t0 + 3 * S);
        assert_eq!(names(&a).0, ["+a/y@edge"]);
    }

    #[test]
    fn pairs_with_a_full_bucket_are_forgotten() {
        let t0 = Instant::now();
        let mut budget = Budget::new(60);
        let mut published = Published::default();
        let many: Vec<Resolved> =
            (0..50).map(|i| resolved(&format!("ns{i}"), "x", "edge", 1)).collect();
        pass(&mut budget, &mut published, &many, t0);
        assert_eq!(budget.full_at.len(), 50);
        pass(&mut budget, &mut published, &many, t0 + S);
        assert_eq!(budget.full_at.len(), 0);
    }

    #[test]
    fn a_note_is_the_same_every_time() {
        let budget = Budget::new(30);
        let (edge, ns) = (FleetName::new("edge").unwrap(), Namespace::new("team-a").unwrap());
        let note = budget.note(&edge, &ns);
        assert_eq!(note, budget.note(&edge, &ns));
        assert!(note.contains("one change every 2 s after a burst of 5"), "{note}");
    }

    /// The watcher's loop in small: a namespace toggles an Ingress every 600 ms for a minute;
    /// each toggle makes a pass, and so does each instant `next_due` names. The changes that go
    /// stay within the budget, the last state goes out on time, and the loop wakes for it
    /// without another change.
    #[tokio::test(start_paused = true)]
    async fn a_toggling_namespace_changes_its_fleet_no_more_than_its_budget() {
        let t0 = Instant::now();
        let mut budget = Budget::new(6);
        let mut published = Published::default();
        // Two states in turn, and a third at the end, so that the last one is news.
        let state =
            |i: u32| resolved("loud", "x", "edge", if i == 99 { 3 } else { 1 + i as usize % 2 });
        let mut went = Vec::new();
        let mut i = 0u32;
        let mut next_toggle = t0;
        let last_toggle = t0 + Duration::from_millis(600) * 99;
        loop {
            let due = budget.next_due(Instant::now());
            tokio::select! {
                _ = tokio::time::sleep_until(next_toggle), if i < 100 => {
                    i += 1;
                    next_toggle += Duration::from_millis(600);
                }
                _ = sleep_until(due) => {}
                _ = tokio::time::sleep(Duration::from_secs(120)) => break,
            }
            let now = Instant::now();
            let a = pass(&mut budget, &mut published, &[state(i - 1)], now);
            if !a.go.is_empty() {
                went.push(now - t0);
            }
        }
        // 59.4 s of toggling: the burst's one and a token every 10 s after it, then the last
        // state within 10 s of the last toggle.
        assert!(went.len() <= 1 + 6 + 1, "{went:?}");
        assert_eq!(published[&state(0).key][0].1.as_ref().unwrap().0.len(), 3, "the last state");
        let last = *went.last().unwrap();
        assert!(last >= last_toggle - t0 && last <= last_toggle - t0 + 10 * S, "{went:?}");
        for pair in went.windows(2) {
            assert!(pair[1] - pair[0] >= 10 * S, "{went:?}");
        }
    }
}
