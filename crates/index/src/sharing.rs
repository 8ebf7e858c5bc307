//! kcp: which resource types one wildcard watch serves for the whole shard. Pure: the hub
//! (`crates/kube/src/kcp/hub.rs`) records each engaged logical cluster's count demand here and runs
//! a shared watch for every type [`Demand::shared`] names.

use std::collections::{BTreeMap, BTreeSet};

use crate::keys::{ClusterName, GroupResource};

/// Which resources are shared, from the logical clusters demanding each. Pure.
#[derive(Debug, Default)]
pub struct Demand {
    /// Per resource, the (cluster, engagement) pairs demanding it.
    demanding: BTreeMap<GroupResource, BTreeSet<(ClusterName, u64)>>,
}

impl Demand {
    /// Records a change.
    pub fn set(&mut self, who: &(ClusterName, u64), resource: &GroupResource, on: bool) {
        if on {
            self.demanding
                .entry(resource.clone())
                .or_default()
                .insert(who.clone());
        } else if let Some(set) = self.demanding.get_mut(resource) {
            set.remove(who);
            if set.is_empty() {
                self.demanding.remove(resource);
            }
        }
    }

    /// Removes every demand of one engagement.
    pub fn withdraw(&mut self, who: &(ClusterName, u64)) {
        self.demanding.retain(|_, set| {
            set.remove(who);
            !set.is_empty()
        });
    }

    /// Removes every demand of `engagement`, whatever the cluster (an engine that ended).
    pub fn withdraw_engagement(&mut self, engagement: u64) {
        self.demanding.retain(|_, set| {
            set.retain(|(_, e)| *e != engagement);
            !set.is_empty()
        });
    }

    /// How many logical clusters demand `resource`.
    pub fn clusters(&self, resource: &GroupResource) -> usize {
        self.demanding
            .get(resource)
            .map_or(0, |set| set.iter().map(|(c, _)| c).collect::<BTreeSet<_>>().len())
    }

    /// The resources to share: those at least `threshold` clusters demand, and those already
    /// shared that still have `threshold - threshold / 4` (hysteresis).
    pub fn shared(&self, threshold: usize, now: &BTreeSet<GroupResource>) -> BTreeSet<GroupResource> {
        let low = (threshold - threshold / 4).max(1);
        self.demanding
            .iter()
            .filter(|(resource, _)| {
                let clusters = self.clusters(resource);
                clusters >= threshold || (now.contains(*resource) && clusters >= low)
            })
            .map(|(r, _)| r.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(n: &str, e: u64) -> (ClusterName, u64) {
        (ClusterName::new(n), e)
    }

    #[test]
    fn a_type_is_shared_from_the_threshold_on_and_kept_down_to_the_low_mark() {
        let widgets = GroupResource::new("example.io", "widgets");
        let pods = GroupResource::core("pods");
        let mut d = Demand::default();
        let none = BTreeSet::new();
        for i in 0..7 {
            d.set(&c(&format!("c{i}"), 1), &widgets, true);
        }
        d.set(&c("c0", 1), &pods, true);
        assert!(d.shared(8, &none).is_empty());
        d.set(&c("c7", 1), &widgets, true);
        let shared = d.shared(8, &none);
        assert_eq!(shared, [widgets.clone()].into());
        d.set(&c("c7", 1), &widgets, true);
        assert_eq!(d.shared(8, &shared), shared, "idempotent");
        d.withdraw(&c("c7", 1));
        d.withdraw(&c("c6", 1));
        assert_eq!(d.shared(8, &shared), shared, "6 of 8: still above the low mark");
        d.withdraw(&c("c5", 1));
        assert!(d.shared(8, &shared).is_empty(), "5: below the low mark (6)");
        assert_eq!(d.shared(1, &none), [pods.clone(), widgets.clone()].into());
        d.set(&c("c0", 1), &pods, false);
        assert_eq!(d.shared(1, &none), [widgets.clone()].into());
    }

    #[test]
    fn a_late_message_of_an_old_engagement_does_not_count_for_the_new_one() {
        let widgets = GroupResource::new("example.io", "widgets");
        let mut d = Demand::default();
        let none = BTreeSet::new();
        d.set(&c("a", 1), &widgets, true);
        d.set(&c("a", 2), &widgets, true); // engaged again before the old one ended
        d.withdraw(&c("a", 1));
        assert_eq!(
            d.shared(1, &none),
            [widgets.clone()].into(),
            "the new engagement still counts"
        );
        d.set(&c("b", 1), &widgets, true);
        d.set(&c("a", 2), &widgets, true);
        assert!(
            d.shared(3, &none).is_empty(),
            "one cluster counts once: 2 clusters"
        );
        assert_eq!(d.shared(2, &none), [widgets].into());
    }

    #[test]
    fn an_ended_engine_takes_all_its_demand_with_it_and_nothing_else() {
        let widgets = GroupResource::new("example.io", "widgets");
        let pods = GroupResource::core("pods");
        let mut d = Demand::default();
        let none = BTreeSet::new();
        d.set(&c("a", 1), &widgets, true);
        d.set(&c("b", 1), &pods, true);
        d.set(&c("a", 2), &pods, true);
        d.withdraw_engagement(1);
        assert_eq!(d.shared(1, &none), [pods.clone()].into(), "engagement 2 stays");
        assert_eq!(d.clusters(&pods), 1);
        assert_eq!(d.clusters(&widgets), 0);
    }
}
