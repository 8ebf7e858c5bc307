//! kcp: which resource types one wildcard watch serves for the whole shard. Pure: the
//! Reconciler's hub (`reconciler/hub.rs`) records each engaged logical cluster's count demand
//! here and runs a shared watch for every type [`Demand::shared`] names.

use std::collections::{BTreeMap, BTreeSet};

use crate::keys::{ClusterName, GroupResource};

/// Which resources are shared, from the logical clusters demanding each. Pure.
#[derive(Debug, Default)]
pub struct Demand {
    /// Per resource, the logical clusters demanding it.
    demanding: BTreeMap<GroupResource, BTreeSet<ClusterName>>,
}

impl Demand {
    /// Records a change.
    pub fn set(&mut self, cluster: &ClusterName, resource: &GroupResource, on: bool) {
        if on {
            self.demanding
                .entry(resource.clone())
                .or_default()
                .insert(cluster.clone());
        } else if let Some(set) = self.demanding.get_mut(resource) {
            set.remove(cluster);
            if set.is_empty() {
                self.demanding.remove(resource);
            }
        }
    }

    /// Removes every demand of `cluster`.
    pub fn withdraw(&mut self, cluster: &ClusterName) {
        self.demanding.retain(|_, set| {
            set.remove(cluster);
            !set.is_empty()
        });
    }

    /// How many logical clusters demand `resource`.
    pub fn clusters(&self, resource: &GroupResource) -> usize {
        self.demanding.get(resource).map_or(0, BTreeSet::len)
    }

    /// The resources to share: those at least `threshold` clusters demand, and those already
    /// shared that still have `threshold - threshold / 4` (hysteresis).
    pub fn shared(&self, threshold: usize, now: &BTreeSet<GroupResource>) -> BTreeSet<GroupResource> {
        let low = low_mark(threshold);
        self.demanding
            .iter()
            .filter(|(resource, set)| set.len() >= threshold || (now.contains(*resource) && set.len() >= low))
            .map(|(r, _)| r.clone())
            .collect()
    }
}

/// Below how many demanding clusters a shared type stops being shared: `threshold -
/// threshold / 4`, at least 1 (one cluster coming and going at the threshold makes no relist).
#[must_use]
pub fn low_mark(threshold: usize) -> usize {
    (threshold - threshold / 4).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(n: &str) -> ClusterName {
        ClusterName::new(n)
    }

    #[test]
    fn a_type_is_shared_from_the_threshold_on_and_kept_down_to_the_low_mark() {
        let widgets = GroupResource::new("example.io", "widgets");
        let pods = GroupResource::core("pods");
        let mut d = Demand::default();
        let none = BTreeSet::new();
        for i in 0..7 {
            d.set(&c(&format!("c{i}")), &widgets, true);
        }
        d.set(&c("c0"), &pods, true);
        assert!(d.shared(8, &none).is_empty());
        d.set(&c("c7"), &widgets, true);
        let shared = d.shared(8, &none);
        assert_eq!(shared, [widgets.clone()].into());
        d.set(&c("c7"), &widgets, true);
        assert_eq!(d.shared(8, &shared), shared, "idempotent");
        d.withdraw(&c("c7"));
        d.withdraw(&c("c6"));
        assert_eq!(d.shared(8, &shared), shared, "6 of 8: still above the low mark");
        d.withdraw(&c("c5"));
        assert!(d.shared(8, &shared).is_empty(), "5: below the low mark (6)");
        assert_eq!(d.shared(1, &none), [pods.clone(), widgets.clone()].into());
        d.set(&c("c0"), &pods, false);
        assert_eq!(d.shared(1, &none), [widgets.clone()].into());
    }

    #[test]
    fn a_withdrawn_cluster_takes_all_its_demand_with_it_and_nothing_else() {
        let widgets = GroupResource::new("example.io", "widgets");
        let pods = GroupResource::core("pods");
        let mut d = Demand::default();
        let none = BTreeSet::new();
        d.set(&c("a"), &widgets, true);
        d.set(&c("a"), &pods, true);
        d.set(&c("b"), &pods, true);
        d.withdraw(&c("a"));
        assert_eq!(d.shared(1, &none), [pods.clone()].into(), "b's demand stays");
        assert_eq!(d.clusters(&pods), 1);
        assert_eq!(d.clusters(&widgets), 0);
    }
}
