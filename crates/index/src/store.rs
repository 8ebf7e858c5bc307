//! The UsageStore: per (cluster, resource, namespace) partition, the identity of every object
//! and, for pods, services and PVCs, the compact projection the evaluators need. Never a full
//! object.
//!
//! Identity is a 64-bit hash of the object's name ([`object_id`](crate::keys::object_id)), so
//! a delete removes exactly what an add put in, and a relist cannot count an object twice.
//!
//! Cost per object ([`Objects`]): small values live in a `hashbrown` slot of
//! `8 + size_of::<P>()` bytes plus one control byte, at a load factor of 7/8 to 7/16 (the
//! table doubles when full). For count-only objects (`P = ()`) that is 9 bytes per slot:
//! 10–21 bytes per object. Large projections are packed densely (`8 + size_of::<P>()` bytes)
//! with a 13-byte table slot per object pointing at them, so a half-empty table no longer
//! wastes whole projections. Plus the projection's own heap. [`UsageStore::bytes`] reports it
//! from the real capacities.
//!
//! A relist (watch start, or 410 Gone) fills a fresh generation beside the current one and
//! swaps it in when the list is complete, so readers never see a half list and nothing is
//! counted twice; the peak is both generations of the relisted partitions.

use std::{
    collections::{HashMap, HashSet},
    hash::{BuildHasherDefault, Hasher},
    sync::Arc,
};

use crate::keys::{ClusterName, GroupResource};

mod tally;
pub use tally::{Generation, KeySum, Tallied, UsageTally};

/// Heap bytes a projection owns beyond its inline size.
pub trait HeapSize {
    /// Bytes on the heap owned by this value.
    fn heap_bytes(&self) -> usize {
        0
    }
}

impl HeapSize for () {}

impl HeapSize for lazyquota_quota::PodProjection {
    fn heap_bytes(&self) -> usize {
        lazyquota_quota::PodProjection::heap_bytes(self)
    }
}

impl HeapSize for lazyquota_quota::ServiceProjection {}

impl HeapSize for lazyquota_quota::PvcProjection {
    fn heap_bytes(&self) -> usize {
        lazyquota_quota::PvcProjection::heap_bytes(self)
    }
}

impl HeapSize for lazyquota_quota::ClaimProjection {
    fn heap_bytes(&self) -> usize {
        lazyquota_quota::ClaimProjection::heap_bytes(self)
    }
}

/// A partition: one resource in one namespace of one cluster.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct PartitionKey {
    /// The logical cluster.
    pub cluster: ClusterName,
    /// The resource.
    pub resource: GroupResource,
    /// The namespace.
    pub namespace: Arc<str>,
}

/// Object ids are already well-mixed hashes: hashing them again would waste time.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = id;
    }
}

type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Objects of one partition by id.
///
/// Two layouts, chosen by the projection's size. Small values (count-only `()`, 8-byte
/// service projections) sit in the hash table itself. Large ones (a pod projection, see `crates/quota/tests/behaviour/projection.rs`)
/// would waste up to half the table's slots at low load, so they are packed densely in a
/// vector, with the table mapping id → position; a remove moves the last
/// element into the hole.
#[derive(Debug)]
pub enum Objects<P> {
    /// Values inline in the table.
    Inline(IdMap<P>),
    /// Values packed in a vector, the table holding positions.
    Dense {
        /// id → position in `values`.
        index: IdMap<u32>,
        /// (id, value), densely packed.
        values: Vec<(u64, P)>,
    },
}

/// Values up to this size live in the hash table.
const INLINE_MAX: usize = 16;

impl<P> Default for Objects<P> {
    fn default() -> Self {
        if std::mem::size_of::<P>() <= INLINE_MAX {
            Self::Inline(IdMap::default())
        } else {
            Self::Dense {
                index: IdMap::default(),
                values: Vec::new(),
            }
        }
    }
}

impl<P> Objects<P> {
    /// Number of objects.
    pub fn len(&self) -> usize {
        match self {
            Self::Inline(map) => map.len(),
            Self::Dense { values, .. } => values.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The projections, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &P> {
        let (inline, dense) = match self {
            Self::Inline(map) => (Some(map.values()), None),
            Self::Dense { values, .. } => (None, Some(values.iter().map(|(_, v)| v))),
        };
        inline.into_iter().flatten().chain(dense.into_iter().flatten())
    }

    /// The projection of an object, if present.
    pub fn get(&self, id: u64) -> Option<&P> {
        match self {
            Self::Inline(map) => map.get(&id),
            Self::Dense { index, values } => index.get(&id).map(|at| &values[*at as usize].1),
        }
    }

    /// The object ids.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        let (inline, dense) = match self {
            Self::Inline(map) => (Some(map.keys().copied()), None),
            Self::Dense { values, .. } => (None, Some(values.iter().map(|(id, _)| *id))),
        };
        inline.into_iter().flatten().chain(dense.into_iter().flatten())
    }

    /// Adds or replaces; returns the replaced value.
    ///
    /// # Panics
    /// With 2³² objects in one partition (a namespace): far beyond any apiserver's limits.
    pub fn insert(&mut self, id: u64, value: P) -> Option<P> {
        match self {
            Self::Inline(map) => map.insert(id, value),
            Self::Dense { index, values } => {
                if let Some(&at) = index.get(&id) {
                    return Some(std::mem::replace(&mut values[at as usize].1, value));
                }
                let at = u32::try_from(values.len()).expect("fewer than 2^32 objects in one namespace");
                index.insert(id, at);
                values.push((id, value));
                None
            }
        }
    }

    /// Removes; returns the removed value.
    ///
    /// # Panics
    /// Never: positions always fit, as [`Objects::insert`] checked.
    pub fn remove(&mut self, id: u64) -> Option<P> {
        match self {
            Self::Inline(map) => map.remove(&id),
            Self::Dense { index, values } => {
                let at = index.remove(&id)? as usize;
                let (_, value) = values.swap_remove(at);
                if let Some((moved, _)) = values.get(at) {
                    index.insert(*moved, u32::try_from(at).expect("position fits"));
                }
                Some(value)
            }
        }
    }

    fn shrink_to_fit(&mut self) {
        match self {
            Self::Inline(map) => map.shrink_to_fit(),
            Self::Dense { index, values } => {
                index.shrink_to_fit();
                values.shrink_to_fit();
            }
        }
    }
}

/// One partition's objects.
#[derive(Debug)]
pub struct Partition<P: Tallied> {
    objects: Generation<P>,
    /// A relist in progress: the next generation.
    next: Option<Generation<P>>,
    /// A fill in progress (see [`UsageStore::begin_fill`]): ids the watch deleted meanwhile.
    fill_tombstones: Option<HashSet<u64, BuildHasherDefault<IdHasher>>>,
    /// Whether a complete list has been seen since the partition was created.
    synced: bool,
    /// Its watch failed and has not delivered since: what it holds may miss objects created
    /// meanwhile (see [`UsageStore::set_stale`]).
    stale: bool,
}

impl<P: Tallied> Default for Partition<P> {
    fn default() -> Self {
        Self {
            objects: Generation::default(),
            next: None,
            fill_tombstones: None,
            synced: false,
            stale: false,
        }
    }
}

impl<P: Tallied> Partition<P> {
    /// The current objects.
    pub fn objects(&self) -> &Objects<P> {
        &self.objects.objects
    }

    /// The current objects' tally ([`UsageTally`] for pods, services and PVCs).
    pub fn tally(&self) -> &P::Tally {
        &self.objects.tally
    }

    /// Whether the partition has been listed completely at least once.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Whether the objects are the truth as far as the watch has delivered it: listed
    /// completely, no relist in progress (the old generation may lack what was created while
    /// the watch was down) and the watch not failing. Only a current partition is counted; a
    /// quota's keys computed from any other keep the value they have.
    pub fn is_current(&self) -> bool {
        self.synced
            && self.next.is_none()
            && (!self.stale || crate::mutation::active(crate::mutation::Mutation::StaleCounts))
    }
}

/// What an apply or delete did, for the update filter and replenishment.
#[derive(Debug, PartialEq, Eq)]
pub enum Change<P> {
    /// A new object.
    Added,
    /// An object replaced; the old projection.
    Updated(P),
    /// An object removed; its projection.
    Deleted(P),
    /// Nothing changed (delete of an unknown object, or the partition is not held).
    None,
}

/// The store.
#[derive(Debug)]
pub struct UsageStore<P: Tallied> {
    partitions: HashMap<PartitionKey, Partition<P>>,
}

impl<P: Tallied> Default for UsageStore<P> {
    fn default() -> Self {
        Self {
            partitions: HashMap::new(),
        }
    }
}

impl<P: Tallied> UsageStore<P> {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts holding a partition (empty, not synced). No-op if held.
    pub fn hold(&mut self, key: PartitionKey) {
        self.partitions.entry(key).or_default();
    }

    /// Stops holding a partition and frees its objects.
    pub fn release(&mut self, key: &PartitionKey) {
        self.partitions.remove(key);
    }

    /// Whether the partition is held.
    pub fn holds(&self, key: &PartitionKey) -> bool {
        self.partitions.contains_key(key)
    }

    /// Starts a relist of a held partition: later [`UsageStore::relist_apply`] calls fill a
    /// fresh generation. Restarting a relist drops the unfinished one.
    pub fn begin_relist(&mut self, key: &PartitionKey) {
        if let Some(p) = self.partitions.get_mut(key) {
            p.next = Some(Generation::default());
            // A relist is complete by itself: it supersedes a fill in progress.
            p.fill_tombstones = None;
        }
    }

    /// Starts holding a partition that a watch **already running** over more namespaces
    /// (a cluster-wide watch) now also fills, from a separate list of this namespace.
    ///
    /// Until [`UsageStore::finish_fill`], the watch's events apply as usual and its deletes
    /// are remembered; the list's objects are then added unless the watch already applied or
    /// deleted them. Events are ordered, so whether the list's snapshot is older or newer
    /// than what the watch has delivered, once the watch has caught up the partition holds
    /// exactly the objects that exist — without relisting the whole resource.
    pub fn begin_fill(&mut self, key: PartitionKey) {
        let p = self.partitions.entry(key).or_default();
        p.fill_tombstones = Some(HashSet::default());
        p.synced = false;
    }

    /// Completes a fill with the namespace's list; returns whether a fill was in progress
    /// (a relist since then superseded it, or the partition was released, if not).
    pub fn finish_fill(&mut self, key: &PartitionKey, listed: impl IntoIterator<Item = (u64, P)>) -> bool {
        let Some(p) = self.partitions.get_mut(key) else {
            return false;
        };
        let Some(tombstones) = p.fill_tombstones.take() else {
            return false;
        };
        for (id, projection) in listed {
            if !tombstones.contains(&id) && p.objects.objects.get(id).is_none() {
                p.objects.insert(id, projection);
            }
        }
        p.synced = true;
        true
    }

    /// Adds an object to the relist in progress (ignored if the partition is not held, or
    /// no relist is in progress — then it is a plain apply).
    pub fn relist_apply(&mut self, key: &PartitionKey, id: u64, projection: P) {
        if let Some(p) = self.partitions.get_mut(key) {
            match &mut p.next {
                Some(next) => {
                    next.insert(id, projection);
                }
                None => {
                    p.objects.insert(id, projection);
                }
            }
        }
    }

    /// Completes a relist: the new generation replaces the old one and the partition is
    /// synced. Returns whether the partition is held.
    ///
    /// A partition whose fill began after the list did (a namespace that joined a
    /// cluster-wide watch while it listed) has no generation of its own: the list's objects
    /// of that namespace from before it joined were dropped at ingest, so it counts only once
    /// its fill ends ([`UsageStore::finish_fill`]).
    pub fn finish_relist(&mut self, key: &PartitionKey) -> bool {
        let Some(p) = self.partitions.get_mut(key) else {
            return false;
        };
        if let Some(mut next) = p.next.take() {
            next.objects.shrink_to_fit();
            p.objects = next;
            p.synced = true;
        } else if p.fill_tombstones.is_none() {
            p.synced = true;
        }
        p.stale = false;
        true
    }

    /// Adds or replaces an object seen by the watch.
    pub fn apply(&mut self, key: &PartitionKey, id: u64, projection: P) -> Change<P> {
        let Some(p) = self.partitions.get_mut(key) else {
            return Change::None;
        };
        // During a relist the watch has not started yet, so applies belong to the relist.
        let objects = p.next.as_mut().unwrap_or(&mut p.objects);
        match objects.insert(id, projection) {
            Some(old) => Change::Updated(old),
            None => Change::Added,
        }
    }

    /// Removes an object.
    pub fn delete(&mut self, key: &PartitionKey, id: u64) -> Change<P> {
        let Some(p) = self.partitions.get_mut(key) else {
            return Change::None;
        };
        if let Some(tombstones) = &mut p.fill_tombstones {
            tombstones.insert(id);
        }
        let objects = p.next.as_mut().unwrap_or(&mut p.objects);
        objects.remove(id).map_or(Change::None, Change::Deleted)
    }

    /// Marks a held partition's watch as failing (`true`) or delivering again (`false`).
    pub fn set_stale(&mut self, key: &PartitionKey, stale: bool) {
        if let Some(p) = self.partitions.get_mut(key) {
            p.stale = stale;
        }
    }

    /// A partition, if held.
    pub fn partition(&self, key: &PartitionKey) -> Option<&Partition<P>> {
        self.partitions.get(key)
    }

    /// Number of objects held in all partitions (current generations).
    pub fn objects(&self) -> usize {
        self.partitions.values().map(|p| p.objects.objects.len()).sum()
    }

    /// Number of partitions held.
    pub fn partitions(&self) -> usize {
        self.partitions.len()
    }

    /// Partitions held, with their object count and bytes, for metrics and `explain`.
    pub fn partition_stats(&self) -> impl Iterator<Item = (&PartitionKey, usize, usize)> {
        self.partitions
            .iter()
            .map(|(k, p)| (k, p.objects.objects.len(), partition_bytes(p)))
    }

    /// Bytes the partitions' tallies hold (both generations; see [`UsageTally::bytes`]).
    pub fn tally_bytes(&self) -> usize {
        self.partitions
            .values()
            .map(|p| {
                P::tally_bytes(&p.objects.tally) + p.next.as_ref().map_or(0, |g| P::tally_bytes(&g.tally))
            })
            .sum()
    }

    /// Bytes held by the object tables (both generations) and the projections' heap,
    /// computed from the tables' real capacity.
    pub fn bytes(&self) -> usize {
        self.partitions.values().map(partition_bytes).sum()
    }
}

/// hashbrown's memory for `capacity` entries of `slot` bytes: buckets are the capacity
/// rounded up to a power of two at 7/8 load, each with one control byte, plus a group.
fn hash_table_bytes(capacity: usize, slot: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = (capacity * 8 / 7).next_power_of_two();
    buckets * (slot + 1) + 16
}

fn table_bytes<P: HeapSize>(objects: &Objects<P>) -> usize {
    let heap: usize = objects.values().map(HeapSize::heap_bytes).sum();
    heap + match objects {
        Objects::Inline(map) => hash_table_bytes(map.capacity(), std::mem::size_of::<(u64, P)>()),
        Objects::Dense { index, values } => {
            hash_table_bytes(index.capacity(), std::mem::size_of::<(u64, u32)>())
                + values.capacity() * std::mem::size_of::<(u64, P)>()
        }
    }
}

fn partition_bytes<P: Tallied>(p: &Partition<P>) -> usize {
    let generation = |g: &Generation<P>| table_bytes(&g.objects) + P::tally_bytes(&g.tally);
    generation(&p.objects) + p.next.as_ref().map_or(0, generation)
}

#[cfg(test)]
mod tests;
