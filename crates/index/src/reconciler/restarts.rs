//! When a watch that failed after its sync is reopened: a logical cluster's own
//! ([`crate::watches::Action::Restart`]) or a kcp shard's shared wildcard watch ([`super::Hub`]).
//!
//! The first restart is at once: a watch cut after a long good run (a load balancer's idle
//! timeout, an apiserver restart) should list afresh without delay. Restarts that follow it
//! closely wait, doubling from [`FIRST_WAIT`] to [`MAX_WAIT`]: a watch whose list succeeds but
//! whose watch cannot start (a kcp shard answering 429 while its watch cache starts; RBAC
//! granting `list` but not `watch`) would otherwise list its partitions again on every turn —
//! each reopened stream starts kube's backoff from scratch, so that backoff never grows. A watch
//! that runs for [`QUIET`] after its list ended (or, if it never listed, after its reopen)
//! counts from the start again: a list of any length does not count against it.
//!
//! Cost: one record per watch restarted within the last [`QUIET`] or so (its key, a count, an
//! instant, and while a reopen waits, what reopening it takes, plus an entry in the set of
//! waiting reopens); records are pruned in amortised constant time per restart and a stopped
//! watch's record is dropped with it. Every operation is logarithmic in the records, so a
//! storm (every watch failing at once when an apiserver restarts) stays cheap.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use crate::queue::doubling;

/// The wait before the second of restarts in close succession.
pub const FIRST_WAIT: Duration = Duration::from_millis(100);

/// The longest wait between restarts of one watch.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// A watch that runs this long after its list ended counts its restarts from zero again.
pub const QUIET: Duration = Duration::from_secs(30);

/// Records kept before the first prune (then twice what a prune left).
const PRUNE_FROM: usize = 64;

#[derive(Debug)]
struct Record<T> {
    /// Restarts in close succession, this one included.
    count: u32,
    /// Since when it has run: its list's end, else its reopen, else when its restart was asked.
    since: Instant,
    /// A reopen waiting: when it is due, and what to open.
    pending: Option<(Instant, T)>,
}

/// Restarts per watch `K` (a watch id, a shared watch's key); `T` is what reopening it takes.
/// Pure: instants come in.
#[derive(Debug)]
pub struct Restarts<K, T> {
    records: BTreeMap<K, Record<T>>,
    /// The waiting reopens, by when they are due.
    due: BTreeSet<(Instant, K)>,
    /// Records kept before the next prune.
    prune_at: usize,
}

impl<K, T> Default for Restarts<K, T> {
    fn default() -> Self {
        Self {
            records: BTreeMap::new(),
            due: BTreeSet::new(),
            prune_at: PRUNE_FROM,
        }
    }
}

impl<K: Ord + Clone, T> Restarts<K, T> {
    /// Watch `watch` is to be reopened with `open`, asked at `now`: returns `open` to do now,
    /// or `None` if the reopen waits (it comes out of [`Restarts::take_due`] when due).
    pub fn restart(&mut self, watch: K, open: T, now: Instant) -> Option<T> {
        self.prune(now);
        let record = self.records.entry(watch.clone()).or_insert(Record {
            count: 0,
            since: now,
            pending: None,
        });
        if now.saturating_duration_since(record.since) >= QUIET {
            record.count = 0;
        }
        record.count = record.count.saturating_add(1);
        record.since = now;
        if let Some((at, _)) = record.pending.take() {
            self.due.remove(&(at, watch.clone()));
        }
        // The first restart is at once; the n-th in close succession waits doubling(n - 1).
        let wait = if crate::mutation::active(crate::mutation::Mutation::RestartsWithoutBackoff) {
            Duration::ZERO
        } else {
            doubling(FIRST_WAIT, record.count - 1, MAX_WAIT)
        };
        if wait.is_zero() {
            return Some(open);
        }
        record.pending = Some((now + wait, open));
        self.due.insert((now + wait, watch));
        None
    }

    /// Watch `watch` finished a list at `now`: it runs from here.
    pub fn listed(&mut self, watch: &K, now: Instant) {
        if let Some(record) = self.records.get_mut(watch) {
            record.since = now;
        }
    }

    /// When the next waiting reopen is due.
    #[must_use]
    pub fn next_due(&self) -> Option<Instant> {
        self.due.first().map(|(at, _)| *at)
    }

    /// The reopens due at `now`, in the order they fell due.
    pub fn take_due(&mut self, now: Instant) -> Vec<(K, T)> {
        let mut out = Vec::new();
        while let Some((at, watch)) = self.due.first().cloned() {
            if at > now {
                break;
            }
            self.due.pop_first();
            if let Some(record) = self.records.get_mut(&watch)
                && let Some((_, open)) = record.pending.take()
            {
                record.since = now;
                out.push((watch, open));
            }
        }
        out
    }

    /// Watch `watch` stopped for good (a watch id is never used again): its record goes.
    pub fn forget(&mut self, watch: &K) {
        if let Some(Record {
            pending: Some((at, _)),
            ..
        }) = self.records.remove(watch)
        {
            self.due.remove(&(at, watch.clone()));
        }
    }

    /// Whether watch `watch`, to be opened now with `open`, must wait for a reopen still due:
    /// a kcp shared watch that failed soon after a restart and closed (its last subscriber
    /// left) keeps its record — its count, so that opened again by new demand and failing
    /// again soon it still waits, and the reopen it waited for, so that opened again before
    /// that is due it waits for it (else that reopen comes out of [`Restarts::take_due`] for a
    /// watch no longer there, which the hub skips). Then `open` replaces what the reopen
    /// opens.
    pub fn waits(&mut self, watch: &K, open: T) -> bool {
        match self.records.get_mut(watch) {
            Some(Record {
                pending: Some((_, pending)),
                ..
            }) => {
                *pending = open;
                true
            }
            _ => false,
        }
    }

    /// Drops the records of watches that have run [`QUIET`] and wait for nothing, once the
    /// records have doubled since the last prune.
    fn prune(&mut self, now: Instant) {
        if self.records.len() < self.prune_at {
            return;
        }
        self.records
            .retain(|_, r| r.pending.is_some() || now.saturating_duration_since(r.since) < QUIET);
        self.prune_at = (self.records.len() * 2).max(PRUNE_FROM);
    }

    /// Watches with a reopen waiting.
    #[cfg(test)]
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.due.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_restart_is_at_once_and_close_ones_wait_doubling_to_the_cap() {
        let t0 = Instant::now();
        let mut r = Restarts::<u64, &str>::default();
        assert!(r.restart(1, "open", t0).is_some(), "the first restart is at once");
        assert_eq!(r.next_due(), None);
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..12 {
            assert!(r.restart(1, "open", now).is_none(), "a close restart waits");
            let due = r.next_due().expect("a reopen waits");
            assert!(
                r.take_due(due.checked_sub(Duration::from_millis(1)).unwrap())
                    .is_empty(),
                "not before it is due"
            );
            assert_eq!(r.take_due(due).len(), 1);
            assert_eq!(r.waiting(), 0);
            waits.push(due - now);
            now = due;
        }
        assert_eq!(waits[0], FIRST_WAIT);
        assert_eq!(waits[1], FIRST_WAIT * 2);
        assert_eq!(waits[2], FIRST_WAIT * 4);
        assert_eq!(*waits.last().unwrap(), MAX_WAIT, "{waits:?}");
    }

    #[test]
    fn a_watch_that_ran_quiet_after_its_list_restarts_at_once_again_however_long_it_listed() {
        let t0 = Instant::now();
        let mut r = Restarts::<u64, &str>::default();
        assert!(r.restart(1, "open", t0).is_some());
        assert!(r.restart(1, "open", t0).is_none());
        let reopened = r.next_due().unwrap();
        r.take_due(reopened);
        // Its list takes three times QUIET; the watch start fails right after it.
        let listed = reopened + QUIET * 3;
        r.listed(&1, listed);
        assert!(
            r.restart(1, "open", listed).is_none(),
            "a long list is not a quiet run"
        );
        assert_eq!(r.next_due(), Some(listed + FIRST_WAIT * 2));
        let reopened = r.next_due().unwrap();
        r.take_due(reopened);
        r.listed(&1, reopened);
        let ms = Duration::from_millis(1);
        assert!(
            r.restart(1, "open", reopened + QUIET.checked_sub(ms).unwrap())
                .is_none()
        );
        let reopened = r.next_due().unwrap();
        r.take_due(reopened);
        r.listed(&1, reopened);
        assert!(
            r.restart(1, "open", reopened + QUIET).is_some(),
            "ran QUIET after its list"
        );
    }

    #[test]
    fn records_of_watches_long_quiet_are_pruned_as_restarts_come() {
        let t0 = Instant::now();
        let mut r = Restarts::<u64, &str>::default();
        for id in 0..1_000 {
            assert!(r.restart(id, "open", t0).is_some());
        }
        assert_eq!(r.records.len(), 1_000);
        let later = t0 + QUIET;
        for id in 1_000..2_000 {
            assert!(r.restart(id, "open", later).is_some());
        }
        assert!(
            r.records.len() < 1_100,
            "the first thousand ran QUIET and were dropped: {}",
            r.records.len()
        );
    }

    #[test]
    fn a_watch_opened_again_while_its_reopen_waits_waits_for_it_and_keeps_its_count() {
        let t0 = Instant::now();
        let mut r = Restarts::<u64, &str>::default();
        assert!(!r.waits(&1, "open"), "nothing to wait for");
        assert!(r.restart(1, "open", t0).is_some());
        assert!(r.restart(1, "old", t0).is_none());
        // Closed, then opened again by new demand before the reopen is due.
        assert!(r.waits(&1, "new"), "opened again: it waits for the reopen due");
        assert_eq!(r.take_due(t0 + FIRST_WAIT), vec![(1, "new")]);
        assert!(!r.waits(&1, "open"), "once reopened, nothing waits");
        assert!(
            r.restart(1, "open", t0 + FIRST_WAIT).is_none(),
            "the third restart still waits"
        );
        assert_eq!(r.next_due(), Some(t0 + FIRST_WAIT * 3));
    }

    #[test]
    fn watches_count_apart_and_a_stopped_watch_reopens_nothing() {
        let t0 = Instant::now();
        let mut r = Restarts::<u64, &str>::default();
        assert!(r.restart(1, "open", t0).is_some());
        assert!(
            r.restart(2, "open", t0).is_some(),
            "another watch's first restart"
        );
        assert!(r.restart(1, "open", t0).is_none());
        assert_eq!(r.waiting(), 1);
        r.forget(&1);
        assert_eq!(r.next_due(), None);
        assert!(r.take_due(t0 + MAX_WAIT).is_empty());
        assert!(
            r.restart(1, "open", t0).is_some(),
            "a forgotten watch starts afresh"
        );
    }
}
