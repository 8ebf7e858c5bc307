//! When each served cluster's discovery runs, as a pure schedule (time is passed in).
//!
//! Kubernetes has no discovery watch: a controller re-runs discovery when CRDs, APIServices
//! (or kcp APIBindings) change, and on a slow safety-net poll. One engine serving a kcp shard
//! runs it for every engaged logical cluster, so the schedule is one structure for all of them:
//!
//! - a cluster's first discovery is due when it is added;
//! - an API change in it asks for runs 300, 1,000, 3,000 and 8,000 ms later (a new CRD is served a moment
//!   after its object appears; the later runs catch it);
//! - until a first discovery succeeds, a failure asks for another run after 1 s, doubling up to
//!   the poll period (no status is written before one succeeds); a first discovery narrowed to
//!   some groups asks for the full one a second later, retried the same way;
//! - otherwise the next run is one poll period after the last one started;
//! - at most `max_running` discoveries run at once (engaging 1,000 workspaces at start does not
//!   send 1,000 walks at once), the earliest due first.
//!
//! Cost: per cluster one slot (its poll time, at most five pending retries, two flags; about
//! 120 bytes with its entry in the due index).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use crate::{keys::ClusterName, queue::doubling};

/// Runs after an API change, from the change.
const AFTER_CHANGE_MS: [u64; 4] = [300, 1_000, 3_000, 8_000];

/// The first retry of a failed first discovery.
const FIRST_RETRY: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Slot {
    /// The next safety-net poll.
    poll_at: Instant,
    /// Runs asked for, ascending.
    retries: Vec<Instant>,
    running: bool,
    /// Whether a discovery has succeeded.
    known: bool,
    /// Failed first discoveries in a row.
    failures: u32,
}

impl Slot {
    /// Asks for a run at `at`, in order, keeping at most one more than an API change asks for.
    fn retry_at(&mut self, at: Instant) {
        let i = self.retries.partition_point(|r| *r < at);
        self.retries.insert(i, at);
        self.retries.truncate(AFTER_CHANGE_MS.len() + 1);
    }

    fn due(&self) -> Instant {
        self.retries
            .first()
            .map_or(self.poll_at, |r| (*r).min(self.poll_at))
    }
}

/// The schedule.
#[derive(Debug)]
pub struct Discoveries {
    poll: Duration,
    max_running: usize,
    clusters: BTreeMap<ClusterName, Slot>,
    /// Clusters not running, by when they are due.
    due: BTreeSet<(Instant, ClusterName)>,
    running: usize,
}

impl Discoveries {
    /// A schedule polling every `poll`, running at most `max_running` (at least 1) at once.
    #[must_use]
    pub fn new(poll: Duration, max_running: usize) -> Self {
        Self {
            poll,
            max_running: max_running.max(1),
            clusters: BTreeMap::new(),
            due: BTreeSet::new(),
            running: 0,
        }
    }

    /// Adds `cluster`: its first discovery is due at `now`. Adding a known cluster does nothing.
    pub fn add(&mut self, cluster: ClusterName, now: Instant) {
        if self.clusters.contains_key(&cluster) {
            return;
        }
        self.due.insert((now, cluster.clone()));
        self.clusters.insert(
            cluster,
            Slot {
                poll_at: now,
                retries: Vec::new(),
                running: false,
                known: false,
                failures: 0,
            },
        );
    }

    /// Forgets `cluster` (a discovery of it still running is not counted any more).
    pub fn remove(&mut self, cluster: &ClusterName) {
        if let Some(slot) = self.clusters.remove(cluster) {
            if slot.running {
                self.running -= 1;
            } else {
                self.due.remove(&(slot.due(), cluster.clone()));
            }
        }
    }

    /// Whether `cluster` is scheduled.
    #[must_use]
    pub fn contains(&self, cluster: &ClusterName) -> bool {
        self.clusters.contains_key(cluster)
    }

    /// The types served in `cluster` may have changed at `now`: runs 300, 1,000, 3,000 and 8,000 ms later.
    pub fn api_changed(&mut self, cluster: &ClusterName, now: Instant) {
        let retries = AFTER_CHANGE_MS.map(|ms| now + Duration::from_millis(ms)).to_vec();
        self.update(cluster, |slot| slot.retries = retries);
    }

    /// The run of `cluster` that just finished succeeded but skipped groups (a narrowed first
    /// discovery): the full one is due at `at`, and until one succeeds a failure is retried
    /// soon, as a failed first discovery is.
    pub fn incomplete(&mut self, cluster: &ClusterName, at: Instant) {
        self.update(cluster, |slot| {
            slot.known = false;
            slot.retry_at(at);
        });
    }

    /// Every cluster's types may have changed (the API watches listed again): one run each,
    /// 300 ms from `now`.
    pub fn all_changed(&mut self, now: Instant) {
        let at = now + Duration::from_millis(AFTER_CHANGE_MS[0]);
        let clusters: Vec<ClusterName> = self.clusters.keys().cloned().collect();
        for cluster in clusters {
            self.update(&cluster, |slot| {
                if slot.retries.first().is_none_or(|r| *r > at) {
                    slot.retries.insert(0, at);
                }
            });
        }
    }

    /// Changes a slot, keeping the due index right.
    fn update(&mut self, cluster: &ClusterName, change: impl FnOnce(&mut Slot)) {
        let Some(slot) = self.clusters.get_mut(cluster) else {
            return;
        };
        if !slot.running {
            self.due.remove(&(slot.due(), cluster.clone()));
        }
        change(slot);
        if !slot.running {
            self.due.insert((slot.due(), cluster.clone()));
        }
    }

    /// The earliest time a discovery not yet running is due (whether or not a run may start
    /// then), for the caller's timer.
    #[must_use]
    pub fn next_due(&self) -> Option<Instant> {
        if self.running >= self.max_running {
            return None;
        }
        self.due.first().map(|(at, _)| *at)
    }

    /// The discoveries to start at `now` (due, earliest first, within `max_running`); they
    /// count as running until [`Discoveries::finished`].
    pub fn start_due(&mut self, now: Instant) -> Vec<ClusterName> {
        let mut started = Vec::new();
        while self.running < self.max_running {
            if self.due.first().is_none_or(|(at, _)| *at > now) {
                break;
            }
            let Some((_, cluster)) = self.due.pop_first() else {
                break;
            };
            let Some(slot) = self.clusters.get_mut(&cluster) else {
                continue;
            };
            slot.running = true;
            slot.retries.retain(|r| *r > now);
            if slot.retries.is_empty() {
                // Most clusters spend their life with no retry pending: no capacity kept.
                slot.retries = Vec::new();
            }
            slot.poll_at = now + self.poll;
            self.running += 1;
            started.push(cluster);
        }
        started
    }

    /// `cluster`'s discovery that started last ended at `now`, successfully or not.
    pub fn finished(&mut self, cluster: &ClusterName, succeeded: bool, now: Instant) {
        let poll = self.poll;
        let Some(slot) = self.clusters.get_mut(cluster) else {
            return; // removed while it ran
        };
        if !slot.running {
            return;
        }
        slot.running = false;
        self.running -= 1;
        if succeeded {
            slot.known = true;
            slot.failures = 0;
        } else if !slot.known {
            // Until a first discovery succeeds nothing is written: try again soon.
            slot.failures = slot.failures.saturating_add(1);
            slot.retry_at(now + doubling(FIRST_RETRY, slot.failures, poll));
        }
        self.due.insert((slot.due(), cluster.clone()));
    }
}

#[cfg(test)]
mod tests;
