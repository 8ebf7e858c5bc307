//! Sharing of the few distinct strings that many projections repeat (priority classes,
//! storage classes, hugepages and extended resource names, VolumeAttributesClass names).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

/// A thread-safe string interner: equal strings extracted through the same interner share one
/// allocation, so a projection holds an 16-byte pointer instead of its own copy.
///
/// Strings stay alive while any projection uses them; [`Interner::prune`] drops the ones only
/// the interner still holds (call it now and then, e.g. after a resync).
#[derive(Debug, Default)]
pub struct Interner {
    strings: Mutex<HashSet<Arc<str>>>,
}

impl Interner {
    /// An empty interner.
    pub fn new() -> Self {
        Self::default()
    }

    /// The shared copy of `value`.
    pub fn intern(&self, value: &str) -> Arc<str> {
        // A panic while holding the lock cannot leave the set inconsistent (inserts are
        // atomic), so a poisoned lock is still safe to use.
        let mut strings = self.strings.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(existing) = strings.get(value) {
            return Arc::clone(existing);
        }
        let shared: Arc<str> = Arc::from(value);
        strings.insert(Arc::clone(&shared));
        shared
    }

    /// Drops strings no projection references any more; returns how many were dropped.
    pub fn prune(&self) -> usize {
        let mut strings = self.strings.lock().unwrap_or_else(PoisonError::into_inner);
        let before = strings.len();
        strings.retain(|s| Arc::strong_count(s) > 1);
        before - strings.len()
    }

    /// Number of distinct strings held.
    pub fn len(&self) -> usize {
        self.strings.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no string is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
