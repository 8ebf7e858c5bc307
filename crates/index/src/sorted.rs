//! A set and a map kept as sorted `Vec`s: one member costs its own size, where a B-tree's
//! first node is a few hundred bytes whatever it holds. For the per-watch and per-workspace
//! sets and maps that mostly hold one member (a watch's namespace, a workspace's quotas, the
//! namespaces demanding a type); thousands pay a shift per insert, and bulk changes to a set
//! go through [`SortedSet::extend`], which sorts once.

use std::borrow::Borrow;

/// A sorted, deduplicated `Vec` used as a set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SortedSet<T>(Vec<T>);

// By hand: a derived `Default` would ask `T: Default` of the members.
impl<T> Default for SortedSet<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T: Ord> SortedSet<T> {
    /// An empty set (nothing allocated).
    #[must_use]
    pub fn new() -> Self {
        Self(Vec::new())
    }

    fn find<Q: Ord + ?Sized>(&self, value: &Q) -> Result<usize, usize>
    where
        T: Borrow<Q>,
    {
        self.0.binary_search_by(|m| m.borrow().cmp(value))
    }

    /// Adds `value`; whether it was new.
    pub fn insert(&mut self, value: T) -> bool {
        match self.find(&value) {
            Ok(_) => false,
            Err(at) => {
                insert_exact(&mut self.0, at, value);
                true
            }
        }
    }

    /// Removes `value`; whether it was there.
    pub fn remove<Q: Ord + ?Sized>(&mut self, value: &Q) -> bool
    where
        T: Borrow<Q>,
    {
        let Ok(at) = self.find(value) else { return false };
        self.0.remove(at);
        if self.0.is_empty() {
            self.0 = Vec::new();
        }
        true
    }

    /// Whether `value` is a member.
    pub fn contains<Q: Ord + ?Sized>(&self, value: &Q) -> bool
    where
        T: Borrow<Q>,
    {
        self.find(value).is_ok()
    }

    /// The members, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }

    /// How many members.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Inserts at `at`, growing by exactly one slot while the `Vec` is small (most hold one).
fn insert_exact<T>(members: &mut Vec<T>, at: usize, value: T) {
    if members.len() < 4 {
        members.reserve_exact(1);
    }
    members.insert(at, value);
}

/// A sorted `Vec` of (key, value) used as a map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SortedMap<K, V>(Vec<(K, V)>);

impl<K, V> Default for SortedMap<K, V> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<K: Ord, V> SortedMap<K, V> {
    fn find<Q: Ord + ?Sized>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
    {
        self.0.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    /// The value of `key`, if any.
    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|at| &self.0[at].1)
    }

    /// The value of `key` to change, if any.
    pub fn get_mut<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|at| &mut self.0[at].1)
    }

    /// The value of `key`, made with `V::default()` if absent.
    pub fn get_or_default(&mut self, key: &K) -> &mut V
    where
        K: Clone,
        V: Default,
    {
        let at = match self.find(key) {
            Ok(at) => at,
            Err(at) => {
                insert_exact(&mut self.0, at, (key.clone(), V::default()));
                at
            }
        };
        &mut self.0[at].1
    }

    /// Removes `key`; its value, if it was there.
    pub fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let at = self.find(key).ok()?;
        let (_, value) = self.0.remove(at);
        if self.0.is_empty() {
            self.0 = Vec::new();
        }
        Some(value)
    }

    /// Whether it has no key.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// The values, in key order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }
}

impl<T: Ord> Extend<T> for SortedSet<T> {
    /// Adds every value, sorting once.
    fn extend<I: IntoIterator<Item = T>>(&mut self, values: I) {
        self.0.extend(values);
        self.0.sort_unstable();
        self.0.dedup();
        self.0.shrink_to_fit();
    }
}

impl<T: Ord> FromIterator<T> for SortedSet<T> {
    fn from_iter<I: IntoIterator<Item = T>>(values: I) -> Self {
        let mut set = Self::new();
        set.extend(values);
        set
    }
}

impl<'a, T> IntoIterator for &'a SortedSet<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sorted_set_holds_each_member_once_in_order_and_exactly_while_small() {
        let mut set: SortedSet<String> = ["b", "a", "b"].map(String::from).into_iter().collect();
        assert_eq!(set.iter().map(String::as_str).collect::<Vec<_>>(), ["a", "b"]);
        assert!(set.insert("c".into()));
        assert!(!set.insert("a".into()));
        assert!(set.contains("c") && !set.contains("d"));
        assert!(set.remove("a") && !set.remove("a"));
        assert_eq!(set.len(), 2);
        let mut one = SortedSet::new();
        one.insert(1_u8);
        assert_eq!(one.0.capacity(), 1, "one member, one slot");
        assert!(one.remove(&1) && one.is_empty() && one.0.capacity() == 0);
    }

    #[test]
    fn a_sorted_map_keeps_one_value_per_key_in_order() {
        let mut map: SortedMap<String, u32> = SortedMap::default();
        *map.get_or_default(&"b".to_owned()) += 1;
        *map.get_or_default(&"a".to_owned()) += 2;
        *map.get_or_default(&"b".to_owned()) += 1;
        assert_eq!(
            map.iter().map(|(k, v)| (k.as_str(), *v)).collect::<Vec<_>>(),
            [("a", 2), ("b", 2)]
        );
        assert_eq!(map.get("b"), Some(&2));
        *map.get_mut("b").expect("b") += 1;
        assert_eq!(map.values().copied().collect::<Vec<_>>(), [2, 3]);
        *map.get_mut("b").expect("b") -= 1;
        assert_eq!(map.remove("a"), Some(2));
        assert_eq!((map.remove("a"), map.get("a")), (None, None));
        assert_eq!(map.remove("b"), Some(2));
        assert!(map.is_empty() && map.0.capacity() == 0);
    }
}
