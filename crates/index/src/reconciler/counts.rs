//! A new key whose watch is quiet, vouched for by a count of its objects.
//!
//! For [`crate::lowering::SETTLE_MS`] after a quota is created or gains a key, a key is
//! written for the first time only once the watches of its objects have delivered an object at
//! or past the quota's resourceVersion ([`crate::lowering::hold_until_caught_up`]): an object
//! stored before the quota was charged to nobody and may still be on its way. A quiet watch
//! delivers nothing, so a second quota on a type already watched waited the whole settling
//! time.
//!
//! Where a key's value is one per object of one resource, every object of it (`count/<r>`,
//! `configmaps`, …: [`lazyquota_quota::counted_by_list`]) and the quota is unscoped, a
//! consistent list says what the quiet watch cannot: how many objects there are at a
//! resourceVersion at or past the quota's. Every object stored by the quota's version is in
//! it, and while the key has no value admission maintained, no object was charged to it (quota
//! admission refuses what would charge a key of `status.hard` without a `used`, and does not
//! charge one `status.hard` lacks), so nothing the write must cover is outside the list or the
//! watch. The key is then written at once, at no less than that count. One list per quota
//! version, resource and scope (the namespace listed, carried back with the answer); at most
//! [`MAX_IN_FLIGHT`] at once; after a failed one the key waits out the settling time as before.
//!
//! While a count asked at the quota's version is in flight, the quota is not written
//! ([`Counts::waiting`]): any write moves the quota past the count's version, so the count
//! would vouch for nothing and a second one would be asked. On a quiet type the second waits
//! longer than the first: a consistent list is served once the apiserver's watch cache has
//! asked etcd for progress, and its cache asks at once when idle, then at most every 100 ms
//! (k8s.io/apiserver's `progressRequestPeriod`). The wait ends with the answer (or failure),
//! or with the quota's settling time, whichever comes first.

use std::collections::BTreeMap;

use crate::{
    keys::{ClusterName, GroupResource, QuotaKey},
    mutation::{Mutation, active},
};

/// Counts asked for and not yet answered, at most: beyond, a key waits out the settling time.
pub const MAX_IN_FLIGHT: usize = 16;

/// Counts kept at most (each only while its quota settles): beyond, none is asked for.
pub const MAX_KEPT: usize = 1024;

/// A count's answer: the list's resourceVersion and its objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counted {
    /// The list's resourceVersion: the count is of the objects stored by then.
    pub revision: u64,
    /// How many objects it had.
    pub objects: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Count {
    /// Asked for the quota at this resourceVersion.
    Asked(u64),
    /// Asked for the quota at this resourceVersion and failed: not asked again until the
    /// quota's counts are forgotten.
    Failed(u64),
    /// Answered.
    Known(Counted),
}

/// A count and the namespace it lists (`None`: every namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    namespace: Option<Box<str>>,
    count: Count,
}

impl Entry {
    /// Whether the count lists `namespace`: one of another scope says nothing of the quota's
    /// objects now (a kcp quota made cluster-scoped, or no longer, while it was in flight).
    fn lists(&self, namespace: Option<&str>) -> bool {
        self.namespace.as_deref() == namespace
    }
}

/// The counts asked for quotas still settling, per (quota, resource). An entry is small and
/// lives from a quota's change until its settling time ends or it goes.
#[derive(Debug, Default)]
pub struct Counts {
    counts: BTreeMap<(QuotaKey, GroupResource), Entry>,
}

impl Counts {
    /// How many objects of `resource` in `namespace` (the quota's scope now; `None`: every
    /// namespace) a count at or past `revision` (the quota's resourceVersion) found, if one did.
    pub fn vouching(
        &self,
        quota: &QuotaKey,
        resource: &GroupResource,
        revision: u64,
        namespace: Option<&str>,
    ) -> Option<u64> {
        let entry = self.counts.get(&(quota.clone(), resource.clone()))?;
        match entry.count {
            Count::Known(c)
                if entry.lists(namespace) && (c.revision >= revision || active(Mutation::StaleCount)) =>
            {
                Some(c.objects)
            }
            _ => None,
        }
    }

    /// Whether a count asked for the quota at `revision` (its resourceVersion) or later is in
    /// flight: writing the quota now would leave that count behind the quota.
    pub fn waiting(&self, quota: &QuotaKey, revision: u64) -> bool {
        let first = (quota.clone(), GroupResource::new("", ""));
        self.counts
            .range(first..)
            .take_while(|((q, _), _)| q == quota)
            .any(|(_, e)| matches!(e.count, Count::Asked(at) if at >= revision))
    }

    /// Whether to ask for a count of `resource` in `namespace` (`None`: every namespace) for
    /// the quota at `revision`: not asked at that version and scope already, never failed in
    /// that scope, and within the bounds. Records the ask (replacing one of another scope,
    /// whose answer is then ignored).
    pub fn ask(
        &mut self,
        quota: &QuotaKey,
        resource: &GroupResource,
        revision: u64,
        namespace: Option<&str>,
    ) -> bool {
        let key = (quota.clone(), resource.clone());
        match self.counts.get(&key) {
            Some(e) if e.lists(namespace) => match e.count {
                Count::Asked(at) if at >= revision => return false,
                // Not asked again while the quota settles: its own write of `status.hard`
                // moves it past the failed count's version, and a failing list would be asked
                // for again.
                Count::Failed(_) => return false,
                Count::Known(c) if c.revision >= revision => return false,
                _ => {}
            },
            None if self.counts.len() >= MAX_KEPT => return false,
            _ => {}
        }
        let in_flight = self
            .counts
            .values()
            .filter(|e| matches!(e.count, Count::Asked(_)))
            .count();
        if in_flight >= MAX_IN_FLIGHT {
            return false;
        }
        let entry = Entry {
            namespace: namespace.map(Box::from),
            count: Count::Asked(revision),
        };
        self.counts.insert(key, entry);
        true
    }

    /// Records an answer of a count of `namespace` (`None`: the count failed); returns
    /// whether the quota was waiting for it (asked in that scope and not answered yet), so
    /// that it is computed again: written with the key the count vouches for, or without it
    /// at once if the count failed.
    pub fn answered(
        &mut self,
        quota: &QuotaKey,
        resource: &GroupResource,
        namespace: Option<&str>,
        counted: Option<Counted>,
    ) -> bool {
        let Some(entry) = self.counts.get_mut(&(quota.clone(), resource.clone())) else {
            return false;
        };
        let Count::Asked(at) = entry.count else {
            return false;
        };
        if !entry.lists(namespace) {
            return false;
        }
        entry.count = counted.map_or(Count::Failed(at), Count::Known);
        true
    }

    /// Forgets the counts of a quota that settled, went, or was replaced.
    pub fn forget(&mut self, quota: &QuotaKey) {
        self.counts.retain(|(q, _), _| q != quota);
    }

    /// Forgets the counts of the quotas of a logical cluster let go.
    pub fn forget_cluster(&mut self, cluster: &ClusterName) {
        self.counts.retain(|(q, _), _| q.cluster != *cluster);
    }

    /// Counts kept now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether none is kept.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The namespace the tests' counts list.
    const NS: Option<&str> = Some("ns");

    fn quota(name: &str) -> QuotaKey {
        QuotaKey::new(&ClusterName::new("c"), "ns", name)
    }

    #[test]
    fn a_count_vouches_only_at_or_past_the_quotas_version_and_is_asked_once_per_version() {
        let (q, r) = (quota("q"), GroupResource::core("configmaps"));
        let mut counts = Counts::default();
        assert!(counts.ask(&q, &r, 10, NS));
        assert!(!counts.ask(&q, &r, 10, NS), "asked already at this version");
        assert_eq!(counts.vouching(&q, &r, 10, NS), None, "not answered yet");
        assert!(counts.answered(
            &q,
            &r,
            NS,
            Some(Counted {
                revision: 12,
                objects: 3
            })
        ));
        assert_eq!(counts.vouching(&q, &r, 12, NS), Some(3));
        assert_eq!(
            counts.vouching(&q, &r, 13, NS),
            None,
            "the quota moved past the list"
        );
        assert!(counts.ask(&q, &r, 13, NS), "asked again for the new version");
        assert!(counts.answered(&q, &r, NS, None), "a failure ends the wait too");
        assert!(!counts.answered(&q, &r, NS, None), "answered once");
        assert!(
            !counts.ask(&q, &r, 13, NS),
            "a failed count is not asked again at that version"
        );
        assert!(
            !counts.ask(&q, &r, 14, NS),
            "nor at a later one while the quota settles"
        );
        assert_eq!(counts.vouching(&q, &r, 13, NS), None);
        counts.forget(&q);
        assert!(counts.is_empty());
    }

    #[test]
    fn a_quota_waits_only_for_its_own_counts_in_flight_at_its_version() {
        let (q, r) = (quota("q"), GroupResource::core("configmaps"));
        let other = quota("other");
        let mut counts = Counts::default();
        assert!(!counts.waiting(&q, 10), "nothing asked");
        assert!(counts.ask(&other, &r, 10, NS));
        assert!(!counts.waiting(&q, 10), "another quota's count");
        assert!(counts.ask(&q, &GroupResource::new("apps", "deployments"), 10, NS));
        assert!(counts.ask(&q, &r, 10, NS));
        assert!(counts.waiting(&q, 10));
        assert!(!counts.waiting(&q, 11), "the quota moved past what was asked");
        counts.answered(&q, &GroupResource::new("apps", "deployments"), NS, None);
        assert!(counts.waiting(&q, 10), "one of its counts is still in flight");
        counts.answered(
            &q,
            &r,
            NS,
            Some(Counted {
                revision: 10,
                objects: 1,
            }),
        );
        assert!(!counts.waiting(&q, 10), "answered or failed: nothing in flight");
        assert!(counts.waiting(&other, 10));
    }

    #[test]
    fn counts_in_flight_and_kept_are_bounded() {
        let r = GroupResource::core("configmaps");
        let mut counts = Counts::default();
        for i in 0..MAX_IN_FLIGHT {
            assert!(counts.ask(&quota(&i.to_string()), &r, 1, NS));
        }
        assert!(!counts.ask(&quota("one more"), &r, 1, NS), "in flight is bounded");
        assert!(counts.answered(
            &quota("0"),
            &r,
            NS,
            Some(Counted {
                revision: 1,
                objects: 0
            })
        ));
        assert!(counts.ask(&quota("one more"), &r, 1, NS), "an answer makes room");
        let done = Some(Counted {
            revision: 1,
            objects: 0,
        });
        for i in 1..MAX_IN_FLIGHT {
            counts.answered(&quota(&i.to_string()), &r, NS, done);
        }
        counts.answered(&quota("one more"), &r, NS, done);
        for i in 0..MAX_KEPT {
            let q = quota(&format!("kept {i}"));
            if counts.ask(&q, &r, 1, NS) {
                counts.answered(
                    &q,
                    &r,
                    NS,
                    Some(Counted {
                        revision: 1,
                        objects: 0,
                    }),
                );
            }
        }
        assert_eq!(counts.len(), MAX_KEPT);
        assert!(!counts.ask(&quota("beyond"), &r, 1, NS), "kept is bounded");
        counts.forget_cluster(&ClusterName::new("c"));
        assert!(counts.is_empty());
    }

    #[test]
    fn a_count_of_another_scope_vouches_for_nothing_and_its_answer_is_ignored() {
        let (q, r) = (quota("q"), GroupResource::core("configmaps"));
        let mut counts = Counts::default();
        assert!(counts.ask(&q, &r, 10, NS));
        // The quota becomes cluster-scoped (kcp) while the count of its namespace is in flight.
        assert!(counts.ask(&q, &r, 10, None), "asked again for every namespace");
        let one = Some(Counted {
            revision: 12,
            objects: 1,
        });
        assert!(
            !counts.answered(&q, &r, NS, one),
            "the namespace's count answers nothing asked now"
        );
        assert_eq!(counts.vouching(&q, &r, 10, None), None);
        assert!(
            counts.waiting(&q, 10),
            "the count of every namespace is still in flight"
        );
        let three = Some(Counted {
            revision: 12,
            objects: 3,
        });
        assert!(counts.answered(&q, &r, None, three));
        assert_eq!(counts.vouching(&q, &r, 10, None), Some(3));
        assert_eq!(
            counts.vouching(&q, &r, 10, NS),
            None,
            "and it vouches for no other scope"
        );
    }
}
