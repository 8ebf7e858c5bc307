//! kcp: which logical clusters of a shard to serve. Pure: the shard supervisor
//! (`crates/kube/src/kcp.rs`) feeds it the events of two wildcard watches (ResourceQuotas and
//! LogicalClusters) and engages a controller for each cluster [`Membership::desired`] names.

use std::collections::{BTreeMap, BTreeSet};

use crate::{keys::ClusterName, sorted::SortedSet};

/// Whether a logical cluster in LogicalCluster `phase` is served (kcp v0.32.3's phases):
///
/// | phase | served | why |
/// |---|---|---|
/// | `Scheduling`, `Initializing` | yes | its objects and quotas exist and are enforced by admission |
/// | `Ready` | yes | |
/// | `Unavailable` | yes | no kcp controller sets it; its objects may still change, so keep counting (writes that fail are retried) |
/// | `Inactive` | no | kcp answers every request to it with 403, even the shard admin's; counted again when it is Ready |
/// | `Terminating`, `Deleting` | no | the workspace is being deleted; its content goes |
///
/// An unknown phase (a newer kcp) is served.
pub fn serves_phase(phase: &str) -> bool {
    !matches!(phase, "Inactive" | "Terminating" | "Deleting")
}

/// The (namespace, name) of a cluster's quotas.
type QuotaNames = SortedSet<(Box<str>, Box<str>)>;

/// Which logical clusters to serve: those with a ResourceQuota whose LogicalCluster is not
/// being deleted. Pure; fed from the two wildcard watches.
#[derive(Debug, Default)]
pub struct Membership {
    /// The quotas (namespace, name) of each cluster that has one, sorted, in a `Vec` of exactly
    /// their number: a workspace usually has one quota or a few, and a B-tree set's first node
    /// is 544 bytes (640 allocated) for one.
    quotas: BTreeMap<ClusterName, QuotaNames>,
    /// Phase of each known LogicalCluster.
    phases: BTreeMap<ClusterName, String>,
    /// LogicalClusters seen deleted (until one appears again).
    deleted: BTreeSet<ClusterName>,
    /// Workspace path of each known LogicalCluster that has one (for logs).
    paths: BTreeMap<ClusterName, String>,
    /// Whether the LogicalCluster watch has listed once: until then a quota's cluster might be
    /// one being deleted, and its workspace path is unknown.
    clusters_known: bool,
    /// The quotas of a relist in progress (its end replaces what is known).
    quota_relist: Option<Vec<(ClusterName, String, String)>>,
    /// The LogicalClusters of a relist in progress.
    cluster_relist: Option<Vec<(ClusterName, String)>>,
}

impl Membership {
    /// A quota exists (or changed).
    pub fn quota_applied(&mut self, cluster: ClusterName, namespace: &str, name: &str) {
        self.quotas
            .entry(cluster)
            .or_default()
            .insert((namespace.into(), name.into()));
    }

    /// A quota was deleted.
    pub fn quota_deleted(&mut self, cluster: &ClusterName, namespace: &str, name: &str) {
        if let Some(quotas) = self.quotas.get_mut(cluster) {
            quotas.remove(&(namespace.into(), name.into()));
            if quotas.is_empty() {
                self.quotas.remove(cluster);
                // Logical cluster names are not reused: forget a deleted one once nothing of
                // it is left (else workspace churn would grow this set for ever).
                self.deleted.remove(cluster);
            }
        }
    }

    /// The quota watch (re)lists: what it lists replaces what was known.
    pub fn quotas_listed(&mut self, quotas: impl IntoIterator<Item = (ClusterName, String, String)>) {
        self.quotas.clear();
        for (cluster, namespace, name) in quotas {
            self.quota_applied(cluster, &namespace, &name);
        }
        self.deleted.retain(|c| self.quotas.contains_key(c));
    }

    /// A LogicalCluster exists (or changed), in `phase`.
    pub fn cluster_applied(&mut self, cluster: ClusterName, phase: String) {
        self.deleted.remove(&cluster);
        self.phases.insert(cluster, phase);
    }

    /// A LogicalCluster was deleted.
    pub fn cluster_deleted(&mut self, cluster: ClusterName) {
        self.phases.remove(&cluster);
        self.paths.remove(&cluster);
        self.deleted.insert(cluster);
    }

    /// The LogicalCluster watch (re)lists: clusters known before and not listed are gone.
    pub fn clusters_listed(&mut self, clusters: impl IntoIterator<Item = (ClusterName, String)>) {
        let listed: BTreeMap<ClusterName, String> = clusters.into_iter().collect();
        for gone in self.phases.keys().filter(|c| !listed.contains_key(*c)) {
            self.deleted.insert(gone.clone());
        }
        self.deleted.retain(|c| !listed.contains_key(c));
        self.paths.retain(|c, _| listed.contains_key(c));
        self.phases = listed;
        self.clusters_known = true;
    }

    /// The clusters to serve now: those with a quota, unless their LogicalCluster is gone or
    /// in a phase where nothing can be counted or written (see [`serves_phase`]).
    pub fn desired(&self) -> BTreeSet<ClusterName> {
        self.quotas
            .keys()
            .filter(|c| !self.deleted.contains(*c))
            .filter(|c| self.phases.get(*c).is_none_or(|p| serves_phase(p)))
            .cloned()
            .collect()
    }

    /// Whether the LogicalClusters have been listed (nothing is engaged before).
    pub fn clusters_known(&self) -> bool {
        self.clusters_known
    }

    /// The workspace path of `cluster`, if its LogicalCluster has one (`kcp.io/path`).
    pub fn path(&self, cluster: &ClusterName) -> &str {
        self.paths.get(cluster).map_or("", String::as_str)
    }

    /// Quotas known in `cluster`.
    pub fn quotas_in(&self, cluster: &ClusterName) -> usize {
        self.quotas.get(cluster).map_or(0, SortedSet::len)
    }

    /// The workspace path of `cluster` (its LogicalCluster's `kcp.io/path` annotation).
    pub fn record_path(&mut self, cluster: ClusterName, path: String) {
        self.paths.insert(cluster, path);
    }

    /// The quota watch starts a relist: what it lists until [`Self::quota_relist_done`]
    /// replaces what is known.
    pub fn quota_relist_started(&mut self) {
        self.quota_relist = Some(Vec::new());
    }

    /// One quota of the relist in progress (ignored when none is).
    pub fn quota_relisted(&mut self, cluster: ClusterName, namespace: String, name: String) {
        if let Some(list) = self.quota_relist.as_mut() {
            list.push((cluster, namespace, name));
        }
    }

    /// The quota relist is complete.
    pub fn quota_relist_done(&mut self) {
        let listed = self.quota_relist.take().unwrap_or_default();
        self.quotas_listed(listed);
    }

    /// The LogicalCluster watch starts a relist.
    pub fn cluster_relist_started(&mut self) {
        self.cluster_relist = Some(Vec::new());
    }

    /// One LogicalCluster of the relist in progress (ignored when none is).
    pub fn cluster_relisted(&mut self, cluster: ClusterName, phase: String) {
        if let Some(list) = self.cluster_relist.as_mut() {
            list.push((cluster, phase));
        }
    }

    /// The LogicalCluster relist is complete.
    pub fn cluster_relist_done(&mut self) {
        let listed = self.cluster_relist.take().unwrap_or_default();
        self.clusters_listed(listed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str) -> ClusterName {
        ClusterName::new(name)
    }

    #[test]
    fn a_cluster_is_served_while_it_has_a_quota_and_is_not_going() {
        let mut m = Membership::default();
        assert!(m.desired().is_empty());
        m.cluster_applied(c("a"), "Ready".into());
        m.cluster_applied(c("b"), "Ready".into());
        assert!(m.desired().is_empty(), "no quota, no controller");
        m.quota_applied(c("a"), "ns", "q1");
        m.quota_applied(c("a"), "ns", "q2");
        assert_eq!(m.desired(), [c("a")].into());
        m.quota_deleted(&c("a"), "ns", "q1");
        assert_eq!(m.desired(), [c("a")].into(), "one quota left");
        m.quota_deleted(&c("a"), "ns", "q2");
        assert!(m.desired().is_empty(), "the last quota went");

        m.quota_applied(c("b"), "ns", "q");
        m.cluster_applied(c("b"), "Terminating".into());
        assert!(m.desired().is_empty(), "a terminating cluster is let go");
        for (phase, served) in [
            ("Scheduling", true),
            ("Initializing", true),
            ("Unavailable", true),
            ("Inactive", false),
            ("Deleting", false),
            ("SomethingNew", true),
        ] {
            m.cluster_applied(c("b"), phase.into());
            assert_eq!(m.desired().contains(&c("b")), served, "phase {phase}");
        }
        m.cluster_applied(c("b"), "Ready".into());
        assert_eq!(m.desired(), [c("b")].into());
        m.cluster_deleted(c("b"));
        assert!(m.desired().is_empty(), "a deleted cluster is let go");
        // A quota seen before its LogicalCluster (watch order is not guaranteed): served.
        m.quota_applied(c("new"), "ns", "q");
        assert_eq!(m.desired(), [c("new")].into());
    }

    #[test]
    fn relists_replace_what_was_known() {
        let mut m = Membership::default();
        m.clusters_listed([(c("a"), "Ready".into()), (c("b"), "Ready".into())]);
        m.quotas_listed([
            (c("a"), "ns".into(), "q".into()),
            (c("b"), "ns".into(), "q".into()),
        ]);
        assert_eq!(m.desired(), [c("a"), c("b")].into());
        m.quotas_listed([(c("b"), "ns".into(), "q".into())]);
        assert_eq!(m.desired(), [c("b")].into(), "a's quota is gone after the relist");
        m.clusters_listed([(c("a"), "Ready".into())]);
        assert!(m.desired().is_empty(), "b is no longer listed: deleted");
        m.quotas_listed([
            (c("a"), "ns".into(), "q".into()),
            (c("b"), "ns".into(), "q".into()),
        ]);
        assert_eq!(m.desired(), [c("a")].into());
    }
}

#[cfg(test)]
mod convergence {
    use proptest::prelude::*;

    use super::*;

    const CLUSTERS: [&str; 5] = ["a", "b", "c", "d", "e"];
    const PHASES: [&str; 5] = ["Ready", "Initializing", "Inactive", "Terminating", "Unavailable"];

    #[derive(Clone, Debug)]
    enum Op {
        QuotaApplied(usize, usize),
        QuotaDeleted(usize, usize),
        ClusterApplied(usize, usize),
        ClusterDeleted(usize),
        /// A relist of either watch cut short by the next one (Init without InitDone).
        AbandonedRelist(bool, Vec<usize>),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..5usize, 0..3usize).prop_map(|(c, q)| Op::QuotaApplied(c, q)),
            (0..5usize, 0..3usize).prop_map(|(c, q)| Op::QuotaDeleted(c, q)),
            (0..5usize, 0..5usize).prop_map(|(c, p)| Op::ClusterApplied(c, p)),
            (0..5usize).prop_map(Op::ClusterDeleted),
            (any::<bool>(), proptest::collection::vec(0..5usize, 0..4))
                .prop_map(|(q, cs)| Op::AbandonedRelist(q, cs)),
        ]
    }

    fn apply(m: &mut Membership, op: &Op) {
        let c = |i: usize| ClusterName::new(CLUSTERS[i]);
        match op {
            Op::QuotaApplied(i, q) => m.quota_applied(c(*i), "ns", &format!("q{q}")),
            Op::QuotaDeleted(i, q) => m.quota_deleted(&c(*i), "ns", &format!("q{q}")),
            Op::ClusterApplied(i, p) => m.cluster_applied(c(*i), PHASES[*p].into()),
            Op::ClusterDeleted(i) => m.cluster_deleted(c(*i)),
            Op::AbandonedRelist(quotas, clusters) => {
                if *quotas {
                    m.quota_relist_started();
                    for i in clusters {
                        m.quota_relisted(c(*i), "ns".into(), "stale".into());
                    }
                } else {
                    m.cluster_relist_started();
                    for i in clusters {
                        m.cluster_relisted(c(*i), "Ready".into());
                    }
                }
            }
        }
    }

    proptest! {
        /// Whatever happened before (events in any order, relists cut short), once both
        /// watches have relisted a consistent world, in either order, the clusters served are
        /// exactly the world's clusters that have a quota and a phase that is served.
        #[test]
        fn after_both_relists_membership_is_the_worlds_truth(
            history in proptest::collection::vec(op(), 0..40),
            world in proptest::collection::vec((0..5usize, 0..3usize), 0..5),
            quotas_first in any::<bool>(),
        ) {
            let mut m = Membership::default();
            for op in &history {
                apply(&mut m, op);
            }
            // The world: each listed cluster once, with a phase and 0..3 quotas.
            let mut clusters: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
            for (i, (phase, quotas)) in world.iter().enumerate() {
                clusters.entry(i % CLUSTERS.len()).or_insert((*phase, *quotas));
            }
            let c = |i: usize| ClusterName::new(CLUSTERS[i]);
            let relist_quotas = |m: &mut Membership| {
                m.quota_relist_started();
                for (&i, &(_, quotas)) in &clusters {
                    for q in 0..quotas {
                        m.quota_relisted(c(i), "ns".into(), format!("q{q}"));
                    }
                }
                m.quota_relist_done();
            };
            let relist_clusters = |m: &mut Membership| {
                m.cluster_relist_started();
                for (&i, &(phase, _)) in &clusters {
                    m.cluster_relisted(c(i), PHASES[phase].into());
                }
                m.cluster_relist_done();
            };
            if quotas_first {
                relist_quotas(&mut m);
                relist_clusters(&mut m);
            } else {
                relist_clusters(&mut m);
                relist_quotas(&mut m);
            }
            let truth: BTreeSet<ClusterName> = clusters
                .iter()
                .filter(|(_, (phase, quotas))| *quotas > 0 && serves_phase(PHASES[*phase]))
                .map(|(&i, _)| c(i))
                .collect();
            prop_assert_eq!(m.desired(), truth);
            prop_assert!(m.clusters_known());
            for (&i, &(_, quotas)) in &clusters {
                prop_assert_eq!(m.quotas_in(&c(i)), quotas);
            }
        }
    }
}
