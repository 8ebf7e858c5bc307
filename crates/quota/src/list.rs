//! Resource lists (`spec.hard`, `status.hard`, `status.used`) as a quota keeps them between
//! syncs, and the read-only view [`assemble_status`](crate::assemble_status) takes of any list.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

/// A resource list read by key: the API's map, or a kept [`QuantityList`].
pub trait Quantities {
    /// Its entries, in key order.
    fn entries(&self) -> impl Iterator<Item = (&String, &K8sQuantity)>;
    /// The value of `key`.
    fn quantity(&self, key: &str) -> Option<&K8sQuantity>;
    /// How many keys it has.
    fn count(&self) -> usize;
}

impl Quantities for BTreeMap<String, K8sQuantity> {
    fn entries(&self) -> impl Iterator<Item = (&String, &K8sQuantity)> {
        self.iter()
    }
    fn quantity(&self, key: &str) -> Option<&K8sQuantity> {
        self.get(key)
    }
    fn count(&self) -> usize {
        self.len()
    }
}

/// A resource list kept per quota: its entries sorted by key in one exactly sized
/// allocation. A `BTreeMap` allocates a node with room for eleven entries however few it
/// holds (over 500 bytes for `String` keys and values), and a quota keeps three lists of
/// mostly one or two keys each.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuantityList(Box<[(String, K8sQuantity)]>);

impl QuantityList {
    /// The value of `key`.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&K8sQuantity> {
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| &self.0[i].1)
    }

    /// Whether it has `key`.
    #[must_use]
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Its keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(k, _)| k)
    }

    /// Its entries, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &K8sQuantity)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// How many keys it has.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it has no key (the API reads an empty list back as absent).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<BTreeMap<String, K8sQuantity>> for QuantityList {
    fn from(map: BTreeMap<String, K8sQuantity>) -> Self {
        // A map's entries come in key order: sorted, as `get` needs.
        Self(map.into_iter().collect())
    }
}

impl From<&BTreeMap<String, K8sQuantity>> for QuantityList {
    fn from(map: &BTreeMap<String, K8sQuantity>) -> Self {
        Self(map.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }
}

impl<'a> IntoIterator for &'a QuantityList {
    type Item = (&'a String, &'a K8sQuantity);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, K8sQuantity)>,
        fn(&'a (String, K8sQuantity)) -> (&'a String, &'a K8sQuantity),
    >;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl Quantities for QuantityList {
    fn entries(&self) -> impl Iterator<Item = (&String, &K8sQuantity)> {
        self.iter()
    }
    fn quantity(&self, key: &str) -> Option<&K8sQuantity> {
        self.get(key)
    }
    fn count(&self) -> usize {
        self.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, K8sQuantity> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), K8sQuantity((*v).to_owned())))
            .collect()
    }

    #[test]
    fn a_list_reads_as_the_map_it_was_made_from() {
        let m = map(&[("pods", "3"), ("count/configmaps", "1"), ("requests.cpu", "500m")]);
        let list = QuantityList::from(&m);
        assert_eq!(list.len(), 3);
        for (k, v) in &m {
            assert_eq!(list.get(k), Some(v), "{k}");
        }
        assert_eq!(list.get("limits.cpu"), None);
        assert!(!list.contains_key("limits.cpu"));
        assert_eq!(
            list.keys().cloned().collect::<Vec<_>>(),
            m.keys().cloned().collect::<Vec<_>>()
        );
        assert_eq!(QuantityList::from(m.clone()), list);
        assert!(QuantityList::from(BTreeMap::new()).is_empty());
    }
}
