//! When a watch that failed after its sync is reopened: a logical cluster's own
//! ([`crate::watches::Action::Restart`]) or a kcp shard's shared wildcard watch ([`super::Hub`]).
//!
//! The first restart is at once: a watch cut after hours of good service should list afresh
//! without delay. Restarts that follow it closely wait, doubling from [`FIRST_WAIT`] to
//! [`MAX_WAIT`]: a watch whose list succeeds but whose watch cannot start (a kcp shard
//! answering 429 while its watch cache starts; RBAC granting `list` but not `watch`) would
//! otherwise list its partitions again on every turn — each reopened stream starts kube's
//! backoff from scratch, so that backoff never grows. A watch that runs for [`QUIET`] after its
//! last reopen counts from the start again.
//!
//! Cost: one record per watch restarted in the last [`QUIET`] (its key, a count, an instant,
//! and while a reopen waits, what reopening it takes); a stopped watch's record is dropped
//! with it.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use crate::queue::doubling;

/// The wait before the second of restarts in close succession.
pub const FIRST_WAIT: Duration = Duration::from_millis(100);

/// The longest wait between restarts of one watch.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// A watch that runs this long after a reopen counts its restarts from zero again.
pub const QUIET: Duration = Duration::from_mins(2);

#[derive(Debug)]
struct Record<T> {
    /// Restarts in close succession, this one included.
    count: u32,
    /// When it was last reopened (or, while a reopen waits, when that was asked for).
    last: Instant,
    /// A reopen waiting: when it is due, and what to open.
    pending: Option<(Instant, T)>,
}

/// Restarts per watch `K` (a watch id, a shared watch's key); `T` is what reopening it takes.
/// Pure: instants come in.
#[derive(Debug)]
pub struct Restarts<K, T> {
    records: BTreeMap<K, Record<T>>,
}

impl<K, T> Default for Restarts<K, T> {
    fn default() -> Self {
        Self {
            records: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone, T> Restarts<K, T> {
    /// Watch `watch` is to be reopened with `open`, asked at `now`: returns `open` to do now,
    /// or `None` if the reopen waits (it comes out of [`Restarts::take_due`] when due).
    pub fn restart(&mut self, watch: K, open: T, now: Instant) -> Option<T> {
        self.records
            .retain(|_, r| r.pending.is_some() || now.saturating_duration_since(r.last) < QUIET);
        let record = self.records.entry(watch).or_insert(Record {
            count: 0,
            last: now,
            pending: None,
        });
        record.count = record.count.saturating_add(1);
        record.last = now;
        // The first restart is at once; the n-th in close succession waits doubling(n - 1).
        let wait = if crate::mutation::active(crate::mutation::Mutation::RestartsWithoutBackoff) {
            Duration::ZERO
        } else {
            doubling(FIRST_WAIT, record.count - 1, MAX_WAIT)
        };
        if wait.is_zero() {
            record.pending = None;
            return Some(open);
        }
        record.pending = Some((now + wait, open));
        None
    }

    /// When the next waiting reopen is due.
    #[must_use]
    pub fn next_due(&self) -> Option<Instant> {
        self.records
            .values()
            .filter_map(|r| r.pending.as_ref().map(|p| p.0))
            .min()
    }

    /// The reopens due at `now`, in key order (the same inputs give the same effects).
    pub fn take_due(&mut self, now: Instant) -> Vec<(K, T)> {
        self.records
            .iter_mut()
            .filter(|(_, r)| r.pending.as_ref().is_some_and(|p| p.0 <= now))
            .filter_map(|(watch, r)| {
                // Quiet is counted from the reopen: the watch has run only since then.
                r.last = now;
                r.pending.take().map(|(_, open)| (watch.clone(), open))
            })
            .collect()
    }

    /// Watch `watch` stopped for good (a watch id is never used again): its record goes.
    pub fn forget(&mut self, watch: &K) {
        self.records.remove(watch);
    }

    /// Watch `watch` closed, but may be opened again under the same key (a kcp shared watch
    /// whose last subscriber left): a reopen it waited for is dropped, its count is kept, so
    /// that one opened again by new demand and failing again soon still waits.
    pub fn closed(&mut self, watch: &K) {
        if let Some(record) = self.records.get_mut(watch) {
            record.pending = None;
        }
    }

    /// Watches with a reopen waiting.
    #[cfg(test)]
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.records.values().filter(|r| r.pending.is_some()).count()
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
    fn a_watch_quiet_for_two_minutes_restarts_at_once_again() {
        let t0 = Instant::now();
        let mut r = Restarts::<u64, &str>::default();
        assert!(r.restart(1, "open", t0).is_some());
        assert!(r.restart(1, "open", t0).is_none());
        let due = r.next_due().unwrap();
        r.take_due(due);
        assert!(
            r.restart(
                1,
                "open",
                due + QUIET.checked_sub(Duration::from_millis(1)).unwrap()
            )
            .is_none()
        );
        let due = r.next_due().unwrap();
        r.take_due(due);
        assert!(r.restart(1, "open", due + QUIET).is_some(), "quiet long enough");
    }

    #[test]
    fn a_watch_closed_and_opened_again_keeps_its_count() {
        let t0 = Instant::now();
        let mut r = Restarts::<u64, &str>::default();
        assert!(r.restart(1, "open", t0).is_some());
        assert!(r.restart(1, "open", t0).is_none());
        r.closed(&1);
        assert_eq!(r.next_due(), None, "the waiting reopen is dropped");
        assert!(
            r.restart(1, "open", t0).is_none(),
            "the third restart still waits"
        );
        assert_eq!(r.next_due(), Some(t0 + FIRST_WAIT * 2));
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
