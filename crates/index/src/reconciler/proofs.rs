//! Proofs that the store has caught up with a quota: a consistent list compared with it.
//!
//! A key is written lower, or for the first time, only from a store that holds every object
//! stored by the quota's resourceVersion ([`crate::lowering::hold_until_caught_up`]): an
//! object stored before it — uncharged, if it was admitted before admission charged the key —
//! may still be on its way to the watch. A watch that has delivered an event at or past that
//! version has delivered everything before it (watches are in resourceVersion order). A quiet
//! watch delivers nothing, so a second quota on a type already watched, or a delete of a type
//! whose quota moved on with another type's charges, would wait for it.
//!
//! A consistent list says what the quiet watch cannot. Listed at L, at or past the quota's
//! version, with `n` objects whose newest resourceVersion is M: if the store's partition holds
//! `n` objects and M is at most what the watch has delivered (O), the store **is** the state at
//! L. Every listed object is unchanged since M ≤ O, so the watch delivered it as listed and it
//! is in the store; as many as the store holds, so the store holds nothing else (an object
//! deleted between O and L would be one more). So the key is written at once from the store,
//! whatever its evaluator or scopes. If they differ, the watch has events to deliver up to L,
//! and the comparison is made again as it delivers ([`Proofs::listing`]). The list is of
//! metadata, paged, and kept by the executor as those three numbers only.
//!
//! One list per quota version, resource and scope (the namespace listed, carried back with
//! the answer); at most [`MAX_IN_FLIGHT`] at once. While one asked at the quota's version is in
//! flight the quota is not written ([`Proofs::waiting`]): any write moves the quota past the
//! list's version, and a second list would be asked. The apiserver serves a consistent list
//! once its watch cache for the type has asked etcd for progress, which it does at once when
//! idle and then at most every 100 ms (k8s.io/apiserver's `progressRequestPeriod`). A list that
//! fails or is not answered within [`crate::lowering::SETTLE_MS`] of the quota's change lets a
//! key admission maintains be written without it (as a watch delivers within milliseconds;
//! counted by a metric); a key admission never charged waits for its watch.

use std::collections::BTreeMap;

use crate::{
    keys::{ClusterName, GroupResource, QuotaKey},
    mutation::{Mutation, active},
};

/// Lists asked for and not yet answered, at most: beyond, a key waits for its watch (or the
/// settling time).
pub const MAX_IN_FLIGHT: usize = 16;

/// Lists kept at most (each only while its quota waits for its watches): beyond, none is
/// asked for.
pub const MAX_KEPT: usize = 1024;

/// A consistent list's answer, all the executor keeps of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The list's resourceVersion: the state it shows.
    pub revision: u64,
    /// How many objects it had.
    pub objects: u64,
    /// The highest resourceVersion of an object in it (0: none).
    pub newest: u64,
}

impl Listed {
    /// Whether a store partition holding `held` objects, filled by a watch that has delivered
    /// every change up to `observed`, is the state this list shows.
    #[must_use]
    pub fn matches(&self, held: usize, observed: u64) -> bool {
        self.objects == held as u64 && (self.newest <= observed || active(Mutation::ProofIgnoresVersions))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Asked for the quota at this resourceVersion.
    Asked(u64),
    /// Asked for the quota at this resourceVersion and failed: not asked again at that version.
    Failed(u64),
    /// Answered.
    Known(Listed),
}

/// A list and the namespace it lists (`None`: every namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    namespace: Option<Box<str>>,
    state: State,
}

impl Entry {
    /// Whether the list is of `namespace`: one of another scope says nothing of the quota's
    /// objects now (a kcp quota made cluster-scoped, or no longer, while it was in flight).
    fn lists(&self, namespace: Option<&str>) -> bool {
        self.namespace.as_deref() == namespace
    }
}

/// What a list at the quota's version says, if anything yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proof {
    /// None asked at or past the version (or of another scope).
    None,
    /// Asked and not answered yet.
    Pending,
    /// It failed.
    Failed,
    /// Answered.
    Listed(Listed),
}

/// The lists asked for quotas waiting for their watches, per (quota, resource). An entry is
/// small (the keys, a namespace and 24 bytes) and lives until its quota needs no list any more
/// or goes.
#[derive(Debug, Default)]
pub struct Proofs {
    lists: BTreeMap<(QuotaKey, GroupResource), Entry>,
}

impl Proofs {
    /// What the list of `resource` in `namespace` (`None`: every namespace) says for the quota
    /// at `revision`.
    #[must_use]
    pub fn proof(
        &self,
        quota: &QuotaKey,
        resource: &GroupResource,
        revision: u64,
        namespace: Option<&str>,
    ) -> Proof {
        let Some(entry) = self.lists.get(&(quota.clone(), resource.clone())) else {
            return Proof::None;
        };
        if !entry.lists(namespace) {
            return Proof::None;
        }
        match entry.state {
            State::Asked(at) if at >= revision => Proof::Pending,
            State::Failed(at) if at >= revision => Proof::Failed,
            State::Known(l) if l.revision >= revision || active(Mutation::StaleProof) => Proof::Listed(l),
            _ => Proof::None,
        }
    }

    /// Whether a list asked for the quota at `revision` (its resourceVersion) or later is in
    /// flight: writing the quota now would leave that list behind the quota.
    #[must_use]
    pub fn waiting(&self, quota: &QuotaKey, revision: u64) -> bool {
        self.of(quota)
            .any(|(_, e)| matches!(e.state, State::Asked(at) if at >= revision))
    }

    fn of<'a>(&'a self, quota: &'a QuotaKey) -> impl Iterator<Item = (&'a GroupResource, &'a Entry)> + 'a {
        let first = (quota.clone(), GroupResource::new("", ""));
        self.lists
            .range(first..)
            .take_while(move |((q, _), _)| q == quota)
            .map(|((_, r), e)| (r, e))
    }

    /// Whether to ask for a list of `resource` in `namespace` (`None`: every namespace) for
    /// the quota at `revision`: none asked at that version and scope already (a list that
    /// differed from the store may be asked again at a later version), and within the bounds.
    /// Records the ask (replacing one of another scope, whose answer is then ignored).
    pub fn ask(
        &mut self,
        quota: &QuotaKey,
        resource: &GroupResource,
        revision: u64,
        namespace: Option<&str>,
    ) -> bool {
        let key = (quota.clone(), resource.clone());
        match self.lists.get(&key) {
            Some(e) if e.lists(namespace) => match e.state {
                State::Asked(at) | State::Failed(at) if at >= revision => return false,
                State::Known(l) if l.revision >= revision => return false,
                _ => {}
            },
            None if self.lists.len() >= MAX_KEPT => return false,
            _ => {}
        }
        let in_flight = self
            .lists
            .values()
            .filter(|e| matches!(e.state, State::Asked(_)))
            .count();
        if in_flight >= MAX_IN_FLIGHT {
            return false;
        }
        let entry = Entry {
            namespace: namespace.map(Box::from),
            state: State::Asked(revision),
        };
        self.lists.insert(key, entry);
        true
    }

    /// Records an answer of a list of `namespace` (`None`: it failed); returns whether the
    /// quota was waiting for it (asked in that scope and not answered yet), so that it is
    /// computed again.
    pub fn answered(
        &mut self,
        quota: &QuotaKey,
        resource: &GroupResource,
        namespace: Option<&str>,
        listed: Option<Listed>,
    ) -> bool {
        let Some(entry) = self.lists.get_mut(&(quota.clone(), resource.clone())) else {
            return false;
        };
        let State::Asked(at) = entry.state else {
            return false;
        };
        if !entry.lists(namespace) {
            return false;
        }
        entry.state = listed.map_or(State::Failed(at), State::Known);
        true
    }

    /// The quotas in `cluster` holding an answered list of `resource`: to compute again when
    /// its watch delivers, since the store may now be what the list showed.
    #[must_use]
    pub fn listing(&self, cluster: &ClusterName, resource: &GroupResource) -> Vec<QuotaKey> {
        self.lists
            .iter()
            .filter(|((q, r), e)| {
                q.cluster == *cluster && r == resource && matches!(e.state, State::Known(_))
            })
            .map(|((q, _), _)| q.clone())
            .collect()
    }

    /// The resources of the quota's answered lists.
    pub fn listing_of<'a>(&'a self, quota: &'a QuotaKey) -> impl Iterator<Item = &'a GroupResource> + 'a {
        self.of(quota)
            .filter(|(_, e)| matches!(e.state, State::Known(_)))
            .map(|(r, _)| r)
    }

    /// Forgets the lists of a quota that needs none any more, went, or was replaced.
    pub fn forget(&mut self, quota: &QuotaKey) {
        self.lists.retain(|(q, _), _| q != quota);
    }

    /// Forgets the lists of the quotas of a logical cluster let go.
    pub fn forget_cluster(&mut self, cluster: &ClusterName) {
        self.lists.retain(|(q, _), _| q.cluster != *cluster);
    }

    /// Lists kept now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lists.len()
    }

    /// Whether none is kept.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.lists.is_empty()
    }
}

#[cfg(test)]
mod tests;
