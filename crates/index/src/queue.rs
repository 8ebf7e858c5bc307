//! The reconciler's work queue, as a pure state machine: deduplicated keys, at most one
//! worker per key at a time, and per-key exponential backoff after failures.
//!
//! Semantics follow client-go's rate-limiting workqueue as KCM's quota controller uses it
//! (`DefaultTypedControllerRateLimiter`'s per-item part: 5 ms doubling to 1000 s): a key added
//! while it is being processed is processed again once, after the current run. The global
//! token bucket of client-go is not modelled: lazyquota bounds concurrency instead.
//!
//! Time is passed in (`Instant`s from the caller), so tests drive it without a clock.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    hash::Hash,
    time::{Duration, Instant},
};

/// Backoff after the first failure.
pub const BASE_DELAY: Duration = Duration::from_millis(5);
/// Maximum backoff.
pub const MAX_DELAY: Duration = Duration::from_secs(1000);

/// The queue.
#[derive(Debug)]
pub struct WorkQueue<K> {
    /// Keys waiting, by the time they become ready (ties broken by insertion order).
    waiting: BTreeSet<(Instant, u64, K)>,
    /// When each waiting key is due, to deduplicate and to move it earlier.
    due: HashMap<K, (Instant, u64)>,
    /// Keys handed to a worker and not yet done.
    processing: HashSet<K>,
    /// Keys added while processing: re-queued when done.
    again: HashMap<K, Instant>,
    /// Failures in a row per key.
    failures: HashMap<K, u32>,
    seq: u64,
}

impl<K: Clone + Eq + Hash + Ord> Default for WorkQueue<K> {
    fn default() -> Self {
        Self {
            waiting: BTreeSet::new(),
            due: HashMap::new(),
            processing: HashSet::new(),
            again: HashMap::new(),
            failures: HashMap::new(),
            seq: 0,
        }
    }
}

impl<K: Clone + Eq + Hash + Ord> WorkQueue<K> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `key`, ready at `at`. A key already waiting keeps the earlier of the two times.
    pub fn add_at(&mut self, key: K, at: Instant) {
        if self.processing.contains(&key) {
            let slot = self.again.entry(key).or_insert(at);
            *slot = (*slot).min(at);
            return;
        }
        if let Some(&(when, seq)) = self.due.get(&key) {
            if when <= at {
                return;
            }
            self.waiting.remove(&(when, seq, key.clone()));
        }
        self.seq += 1;
        self.waiting.insert((at, self.seq, key.clone()));
        self.due.insert(key, (at, self.seq));
    }

    /// Adds `key`, ready now.
    pub fn add(&mut self, key: K, now: Instant) {
        self.add_at(key, now);
    }

    /// Adds `key` after its backoff: 5 ms doubling per failure in a row, capped at 1000 s.
    pub fn add_rate_limited(&mut self, key: K, now: Instant) -> Duration {
        let failures = self.failures.entry(key.clone()).or_insert(0);
        let delay = backoff(*failures);
        *failures = failures.saturating_add(1);
        self.add_at(key, now + delay);
        delay
    }

    /// Clears a key's failure count (after a success).
    pub fn forget(&mut self, key: &K) {
        self.failures.remove(key);
    }

    /// Takes the next ready key and marks it processing.
    pub fn pop_ready(&mut self, now: Instant) -> Option<K> {
        let first = self.waiting.first()?;
        if first.0 > now {
            return None;
        }
        let (_, _, key) = self.waiting.pop_first()?;
        self.due.remove(&key);
        self.processing.insert(key.clone());
        Some(key)
    }

    /// Marks a key's processing finished; a key added meanwhile is queued again.
    pub fn done(&mut self, key: &K) {
        self.processing.remove(key);
        if let Some(at) = self.again.remove(key) {
            self.add_at(key.clone(), at);
        }
    }

    /// Drops a key entirely (its quota was deleted).
    pub fn remove(&mut self, key: &K) {
        if let Some((when, seq)) = self.due.remove(key) {
            self.waiting.remove(&(when, seq, key.clone()));
        }
        self.again.remove(key);
        self.failures.remove(key);
    }

    /// When the next waiting key becomes ready.
    pub fn next_ready(&self) -> Option<Instant> {
        self.waiting.first().map(|(at, _, _)| *at)
    }

    /// Keys waiting (not processing).
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Keys being processed.
    pub fn processing(&self) -> usize {
        self.processing.len()
    }
}

/// The per-item backoff after `failures` failures in a row.
pub fn backoff(failures: u32) -> Duration {
    let factor = 1u64.checked_shl(failures.min(63)).unwrap_or(u64::MAX);
    let millis = 5u64.saturating_mul(factor);
    Duration::from_millis(millis).min(MAX_DELAY)
}

/// `first` after the first failure, twice as long after each further one, at most `max`;
/// nothing before any failure: the backoff of the kcp hub's join lists, kcp's controller
/// restarts and a failing first discovery.
#[must_use]
pub fn doubling(first: Duration, failures: u32, max: Duration) -> Duration {
    match failures {
        0 => Duration::ZERO,
        n => first.saturating_mul(1 << (n - 1).min(16)).min(max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_deduplicated_and_ready_in_order() {
        let t0 = Instant::now();
        let mut q = WorkQueue::new();
        q.add("b", t0);
        q.add("a", t0);
        q.add("b", t0);
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop_ready(t0), Some("b"));
        assert_eq!(q.pop_ready(t0), Some("a"));
        assert_eq!(q.pop_ready(t0), None);
    }

    #[test]
    fn a_key_added_while_processing_runs_again_once_after() {
        let t0 = Instant::now();
        let mut q = WorkQueue::new();
        q.add("a", t0);
        assert_eq!(q.pop_ready(t0), Some("a"));
        q.add("a", t0);
        q.add("a", t0);
        assert_eq!(q.pop_ready(t0), None, "never two workers on one key");
        q.done(&"a");
        assert_eq!(q.pop_ready(t0), Some("a"));
        q.done(&"a");
        assert_eq!(q.pop_ready(t0), None);
    }

    #[test]
    fn failures_back_off_exponentially_to_the_cap_and_reset_on_forget() {
        let t0 = Instant::now();
        let mut q = WorkQueue::new();
        assert_eq!(q.add_rate_limited("a", t0), Duration::from_millis(5));
        assert_eq!(q.pop_ready(t0), None, "not ready before its backoff");
        assert_eq!(q.pop_ready(t0 + Duration::from_millis(5)), Some("a"));
        q.done(&"a");
        assert_eq!(q.add_rate_limited("a", t0), Duration::from_millis(10));
        q.forget(&"a");
        q.remove(&"a");
        assert_eq!(q.add_rate_limited("a", t0), Duration::from_millis(5));
        assert_eq!(backoff(40), MAX_DELAY);
        assert_eq!(backoff(u32::MAX), MAX_DELAY);
    }

    #[test]
    fn an_immediate_add_overrides_a_pending_backoff() {
        let t0 = Instant::now();
        let mut q = WorkQueue::new();
        q.add_rate_limited("a", t0);
        q.add_rate_limited("a", t0);
        q.add("a", t0);
        assert_eq!(q.pop_ready(t0), Some("a"));
        assert_eq!(q.next_ready(), None);
    }
}
