//! A partition's usage, kept summed as its objects arrive, change and go, so a quota's typed
//! keys are read without visiting every object: the computation no longer grows with the
//! namespace (upstream's `syncResourceQuota` sums every object at every sync).
//!
//! Objects are summed per *scope class* (what scope matching reads: a pod's flags and priority
//! class, a PVC's VolumeAttributesClass names; see [`ScopeClassed`]), so a quota's scopes are
//! matched once per class. An object whose usage depends on the instant it is read at (a pod in
//! its deletion grace period) is not summed but kept by id and evaluated when read. The full sum
//! ([`lazyquota_quota::calculate_usage`]) stays the reference: the reader falls back to it on a
//! scope error (upstream returns a partial, order-dependent sum there) or when a sum went beyond
//! what a quantity holds, and the property tests and the simulator compare the two.
//!
//! The printed format: upstream's sum takes the format of its first non-zero addend in the
//! informer's (unordered) iteration, so any addend's format is a possible upstream answer when
//! formats are mixed. A tally prints in the format most non-zero addends have (ties: DecimalSI,
//! then BinarySI, then DecimalExponent), which is the one upstream prints whenever the non-zero
//! addends share a format, and DecimalSI when there is none (a zero prints `0` in every format).
//!
//! Cost: per partition an empty `Vec` and an empty set (48 bytes inline); per class present in
//! it a [`ClassTally`] (its class, a member count, and per usage key the key's name and a
//! [`KeySum`]); per object in its deletion grace period one id in a hash set.

use std::collections::HashSet;
use std::hash::BuildHasherDefault;

use lazyquota_quota::{
    FeatureGates, Format, Quantity, QuotaScopes, ResourceList, ScopeClassed, ScopeError, Time,
};

use super::{IdHasher, Objects};

#[cfg(test)]
mod tests;
use crate::mutation::{Mutation, active};

/// One key's sum over the addends of one class (or, when read, of every matching class).
#[derive(Clone, Debug, Default)]
pub struct KeySum {
    /// The exact sum of the addends lazyquota holds.
    sum: Quantity,
    /// Addends it cannot hold ([`Quantity::unknown`]): while any is present the value is unknown.
    unknown: u32,
    /// Non-zero addends per format, in [`Format`]'s order (DecimalExponent, BinarySI, DecimalSI).
    formats: [u32; 3],
}

impl KeySum {
    fn add(&mut self, q: &Quantity) {
        if q.is_unknown() {
            self.unknown += 1;
            return;
        }
        self.sum = self.sum.add(q);
        if !q.is_zero() {
            self.formats[format_slot(q.format())] += 1;
        }
    }

    fn remove(&mut self, q: &Quantity) {
        if q.is_unknown() {
            self.unknown -= 1;
            return;
        }
        self.sum = self.sum.sub(q);
        if !q.is_zero() {
            self.formats[format_slot(q.format())] -= 1;
        }
    }

    fn merge(&mut self, other: &KeySum) {
        self.sum = self.sum.add(&other.sum);
        self.unknown += other.unknown;
        for (mine, theirs) in self.formats.iter_mut().zip(other.formats) {
            *mine += theirs;
        }
    }

    /// The value, or `None` when the running sum went beyond what a quantity holds (known
    /// addends only, so the value itself may fit: the reader then sums the objects).
    fn value(&self) -> Option<Quantity> {
        if self.unknown > 0 {
            return Some(Quantity::unknown());
        }
        if self.sum.is_unknown() {
            return None;
        }
        // Most addends' format; ties to the later slot (DecimalSI, then BinarySI).
        let slot = (0..3).max_by_key(|&i| (self.formats[i], i)).unwrap_or(2);
        let format = if self.formats[slot] == 0 {
            Format::DecimalSI
        } else {
            [Format::DecimalExponent, Format::BinarySI, Format::DecimalSI][slot]
        };
        Some(self.sum.clone().with_format(format))
    }
}

fn format_slot(format: Format) -> usize {
    match format {
        Format::DecimalExponent => 0,
        Format::BinarySI => 1,
        Format::DecimalSI => 2,
    }
}

/// The sums of the objects of one scope class.
#[derive(Debug)]
pub struct ClassTally<C> {
    class: C,
    /// Objects summed here; the class goes when the last one does.
    members: u32,
    /// Per usage key the objects emit.
    keys: Vec<(Box<str>, KeySum)>,
}

/// A partition's usage, per scope class, plus the objects read at the instant.
#[derive(Debug)]
pub struct UsageTally<C> {
    classes: Vec<ClassTally<C>>,
    /// Objects whose usage depends on the instant (read one by one).
    timed: HashSet<u64, BuildHasherDefault<IdHasher>>,
}

impl<C> Default for UsageTally<C> {
    fn default() -> Self {
        Self {
            classes: Vec::new(),
            timed: HashSet::default(),
        }
    }
}

/// Any instant: an object summed in a class has the same usage at every one.
const ANY_INSTANT: Time = Time::from_unix_seconds(0);

impl<C> UsageTally<C> {
    /// Adds `object` (id `id`) to the sums.
    pub fn add<P: ScopeClassed<Class = C>>(&mut self, id: u64, object: &P) {
        if object.usage_varies_with_time() {
            self.timed.insert(id);
            return;
        }
        let at = if let Some(at) = self.classes.iter().position(|c| object.is_of_class(&c.class)) {
            at
        } else {
            self.classes.push(ClassTally {
                class: object.scope_class(),
                members: 0,
                keys: Vec::new(),
            });
            self.classes.len() - 1
        };
        let tally = &mut self.classes[at];
        tally.members += 1;
        object.for_each_usage(ANY_INSTANT, &mut |key, q| {
            if let Some((_, sum)) = tally.keys.iter_mut().find(|(k, _)| key.matches(k)) {
                sum.add(&q);
            } else {
                let mut sum = KeySum::default();
                sum.add(&q);
                tally.keys.push((key.to_string().into_boxed_str(), sum));
            }
        });
    }

    /// Takes `object` (id `id`, as it was added) out of the sums.
    pub fn remove<P: ScopeClassed<Class = C>>(&mut self, id: u64, object: &P) {
        if object.usage_varies_with_time() {
            self.timed.remove(&id);
            return;
        }
        let Some(at) = self.classes.iter().position(|c| object.is_of_class(&c.class)) else {
            return;
        };
        let tally = &mut self.classes[at];
        tally.members -= 1;
        if tally.members == 0 {
            self.classes.swap_remove(at);
            return;
        }
        object.for_each_usage(ANY_INSTANT, &mut |key, q| {
            if let Some((_, sum)) = tally.keys.iter_mut().find(|(k, _)| key.matches(k)) {
                sum.remove(&q);
            }
        });
    }

    /// The usage of `requested` keys over the objects (those of `objects`) matching `scopes`
    /// at `now`, as [`lazyquota_quota::calculate_usage`] computes it. `Ok(None)` when a sum
    /// went beyond what a quantity holds; `Err` on a scope error — the caller sums the objects
    /// then.
    pub fn usage<P: ScopeClassed<Class = C>, S: AsRef<str>>(
        &self,
        objects: &Objects<P>,
        requested: &[S],
        scopes: &QuotaScopes,
        now: Time,
        gates: FeatureGates,
    ) -> Result<Option<ResourceList>, ScopeError> {
        let mut sums: Vec<(&str, KeySum)> = Vec::with_capacity(requested.len());
        for key in requested {
            let key = key.as_ref();
            if !sums.iter().any(|(k, _)| *k == key) {
                sums.push((key, KeySum::default()));
            }
        }
        for class in &self.classes {
            if !P::class_matches_scopes(&class.class, scopes, gates)? {
                continue;
            }
            for (key, sum) in &mut sums {
                if let Some((_, of_class)) = class.keys.iter().find(|(k, _)| &**k == *key) {
                    sum.merge(of_class);
                }
            }
        }
        for object in self.timed.iter().filter_map(|id| objects.get(*id)) {
            if !object.matches_scopes(scopes, gates)? {
                continue;
            }
            object.for_each_usage(now, &mut |key, q| {
                if let Some((_, sum)) = sums.iter_mut().find(|(k, _)| key.matches(k)) {
                    sum.add(&q);
                }
            });
        }
        Ok(sums
            .into_iter()
            .map(|(k, sum)| sum.value().map(|v| (k.to_owned(), v)))
            .collect())
    }

    /// Heap bytes the tally holds (its classes' own heap is counted as their inline size;
    /// interned names are shared).
    pub fn bytes(&self) -> usize {
        let classes = self.classes.capacity() * size_of::<ClassTally<C>>();
        let keys: usize = self
            .classes
            .iter()
            .map(|c| {
                c.keys.capacity() * size_of::<(Box<str>, KeySum)>()
                    + c.keys.iter().map(|(k, _)| k.len()).sum::<usize>()
            })
            .sum();
        classes + keys + super::hash_table_bytes(self.timed.capacity(), size_of::<u64>())
    }
}

/// A projection the store keeps a tally of (`()` for those it does not: count-only objects,
/// and DRA claims, whose usage is joined with their pods' when read).
pub trait Tallied: super::HeapSize + Sized {
    /// What each generation of a partition keeps beside its objects.
    type Tally: Default + std::fmt::Debug;

    /// Whether the tally is kept at all: an update of an object without one replaces it
    /// without looking up the old value first (count-only objects are the busiest).
    const KEEPS_TALLY: bool = false;

    /// `self` (id `id`) joined the generation.
    fn tally_add(&self, _id: u64, _tally: &mut Self::Tally) {}

    /// `self` (id `id`) left the generation.
    fn tally_remove(&self, _id: u64, _tally: &mut Self::Tally) {}

    /// Heap bytes of the tally.
    fn tally_bytes(_tally: &Self::Tally) -> usize {
        0
    }
}

impl Tallied for () {
    type Tally = ();
}

impl Tallied for lazyquota_quota::ClaimProjection {
    type Tally = ();
}

macro_rules! tallied {
    ($($projection:ty),*) => {$(
        impl Tallied for $projection {
            type Tally = UsageTally<<$projection as ScopeClassed>::Class>;

            const KEEPS_TALLY: bool = true;

            fn tally_add(&self, id: u64, tally: &mut Self::Tally) {
                tally.add(id, self);
            }

            fn tally_remove(&self, id: u64, tally: &mut Self::Tally) {
                tally.remove(id, self);
            }

            fn tally_bytes(tally: &Self::Tally) -> usize {
                tally.bytes()
            }
        }
    )*};
}

tallied!(
    lazyquota_quota::PodProjection,
    lazyquota_quota::ServiceProjection,
    lazyquota_quota::PvcProjection
);

/// A generation's objects with their tally, kept together by every insert and remove.
#[derive(Debug)]
pub struct Generation<P: Tallied> {
    pub(super) objects: Objects<P>,
    pub(super) tally: P::Tally,
}

impl<P: Tallied> Default for Generation<P> {
    fn default() -> Self {
        Self {
            objects: Objects::default(),
            tally: P::Tally::default(),
        }
    }
}

impl<P: Tallied> Generation<P> {
    /// Adds or replaces; returns the replaced value.
    pub fn insert(&mut self, id: u64, value: P) -> Option<P> {
        // The old value leaves the tally before the new one joins (an object's id may be in
        // the tally's set of timed objects before and after).
        if P::KEEPS_TALLY
            && let Some(old) = self.objects.get(id)
            && !active(Mutation::TallyDropsUpdate)
        {
            old.tally_remove(id, &mut self.tally);
        }
        value.tally_add(id, &mut self.tally);
        self.objects.insert(id, value)
    }

    /// Removes; returns the removed value.
    pub fn remove(&mut self, id: u64) -> Option<P> {
        let old = self.objects.remove(id)?;
        old.tally_remove(id, &mut self.tally);
        Some(old)
    }
}
