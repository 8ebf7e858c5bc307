//! The PolicyIndex: every ResourceQuota (per logical cluster and namespace), and from them the
//! **demand** — which (cluster, resource, namespace) some quota needs watched, and how much of
//! each object it needs. Demand is reference-counted across quotas, and every mutation
//! returns the demand changes it caused, so the monitor manager never rescans.
//!
//! ```text
//!  QuotaKey ──► QuotaEntry { demands: resource → need, status_hard resources, payload T }
//!                   │ from each spec.hard key (demand::needs)
//!                   ▼
//!  (cluster, resource) ──► namespace ──► { count refs, typed refs }   = demand
//! ```
//!
//! Cost: per quota, one map entry per demanded and per replenishing resource and the
//! caller's payload; per demanded (cluster, resource, namespace), one map entry.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

use lazyquota_quota::{FeatureGates, QuotaScopes};

use crate::{
    demand::{is_cluster_wide, needs, replenished_by},
    keys::{ALL_NAMESPACES, ClusterName, GroupResource, Need, QuotaKey},
};

/// What the index needs to know of a ResourceQuota.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaPolicy {
    /// The keys of `spec.hard`: what is computed.
    pub spec_hard: Vec<String>,
    /// The keys of `status.hard`: what replenishment matches on, as upstream does.
    pub status_hard: Vec<String>,
    /// `spec.scopes` and `spec.scopeSelector`.
    pub scopes: QuotaScopes,
    /// kcp's cluster-scoped quota (see [`kcp_cluster_scoped`]): its keys are computed over
    /// every namespace of the logical cluster, so its demand is for [`ALL_NAMESPACES`].
    pub cluster_scoped: bool,
}

/// The annotation that makes a kcp ResourceQuota in namespace [`KCP_ADMIN_NAMESPACE`]
/// cluster-scoped (kcp's `experimental.quota.kcp.io/cluster-scoped`).
pub const KCP_CLUSTER_SCOPED_ANNOTATION: &str = "experimental.quota.kcp.io/cluster-scoped";

/// The namespace a kcp cluster-scoped quota must live in.
pub const KCP_ADMIN_NAMESPACE: &str = "admin";

/// Whether a quota in `namespace` with `annotation` (the value of
/// [`KCP_CLUSTER_SCOPED_ANNOTATION`], if any) is one of kcp's cluster-scoped quotas: in the
/// `admin` namespace, with a value Go's `strconv.ParseBool` reads as true (kcp parses it so).
pub fn kcp_cluster_scoped(namespace: &str, annotation: Option<&str>) -> bool {
    namespace == KCP_ADMIN_NAMESPACE && matches!(annotation, Some("1" | "t" | "T" | "TRUE" | "true" | "True"))
}

/// One quota in the index.
#[derive(Debug)]
pub struct QuotaEntry<T> {
    /// The namespace its demand is for: its own, or [`ALL_NAMESPACES`] if cluster-scoped.
    namespace: Arc<str>,
    /// The resources of the `status.hard` keys' evaluators (replenishment routing).
    status_resources: BTreeSet<GroupResource>,
    /// What this quota adds to the demand: resource → need.
    demands: BTreeMap<GroupResource, Need>,
    /// The caller's parsed quota (spec, status, resourceVersion...).
    pub payload: T,
}

impl<T> QuotaEntry<T> {
    /// The resources this quota demands and how much of each object it needs.
    pub fn demands(&self) -> &BTreeMap<GroupResource, Need> {
        &self.demands
    }

    /// The namespace its keys are computed over: its own, or [`ALL_NAMESPACES`].
    pub fn demand_namespace(&self) -> &Arc<str> {
        &self.namespace
    }
}

/// A change of demand for one (cluster, resource, namespace).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DemandChange {
    /// The logical cluster.
    pub cluster: ClusterName,
    /// The resource.
    pub resource: GroupResource,
    /// The namespace.
    pub namespace: Arc<str>,
    /// The need before (`None`: not demanded).
    pub from: Option<Need>,
    /// The need after (`None`: no longer demanded).
    pub to: Option<Need>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Refs {
    count: u32,
    typed: u32,
}

impl Refs {
    fn need(self) -> Option<Need> {
        if self.typed > 0 {
            Some(Need::Typed)
        } else if self.count > 0 {
            Some(Need::Count)
        } else {
            None
        }
    }

    fn slot(&mut self, need: Need) -> &mut u32 {
        match need {
            Need::Count => &mut self.count,
            Need::Typed => &mut self.typed,
        }
    }
}

/// Demand of one resource in one cluster, per namespace.
pub type NamespaceDemand = BTreeMap<Arc<str>, Need>;

/// The index. `T` is whatever the caller keeps per quota (the parsed spec and status).
#[derive(Debug)]
pub struct PolicyIndex<T> {
    gates: FeatureGates,
    quotas: HashMap<QuotaKey, QuotaEntry<T>>,
    /// The quotas of each (cluster, namespace): events are routed to a namespace's quotas
    /// without scanning every quota of every namespace.
    by_namespace: HashMap<ClusterName, HashMap<Arc<str>, BTreeSet<QuotaKey>>>,
    demand: BTreeMap<(ClusterName, GroupResource), BTreeMap<Arc<str>, Refs>>,
}

impl<T> PolicyIndex<T> {
    /// An empty index; `gates` decide which evaluators match which keys, as in the target KCM.
    pub fn new(gates: FeatureGates) -> Self {
        Self {
            gates,
            quotas: HashMap::new(),
            by_namespace: HashMap::new(),
            demand: BTreeMap::new(),
        }
    }

    /// Adds or replaces a quota; returns the demand changes.
    pub fn apply(&mut self, key: QuotaKey, policy: &QuotaPolicy, payload: T) -> Vec<DemandChange> {
        let mut demands = BTreeMap::new();
        for key in &policy.spec_hard {
            for (resource, need) in needs(key, &policy.scopes, self.gates) {
                let slot = demands.entry(resource).or_insert(need);
                *slot = (*slot).max(need);
            }
        }
        let status_resources = policy
            .status_hard
            .iter()
            .flat_map(|k| replenished_by(k, self.gates))
            .collect();
        let namespace: Arc<str> = if policy.cluster_scoped {
            Arc::from(ALL_NAMESPACES)
        } else {
            key.namespace.clone()
        };
        let mut changes = Vec::new();
        match self.quotas.get(&key) {
            // The same namespace: only the net change of demand.
            Some(old) if old.namespace == namespace => {
                let old_demands = old.demands.clone();
                self.adjust(&key.cluster, &namespace, &old_demands, &demands, &mut changes);
            }
            // New, or it became (or stopped being) cluster-scoped: out of the old namespace.
            Some(_) => {
                changes = self.delete(&key);
                self.adjust(&key.cluster, &namespace, &BTreeMap::new(), &demands, &mut changes);
            }
            None => self.adjust(&key.cluster, &namespace, &BTreeMap::new(), &demands, &mut changes),
        }
        self.by_namespace
            .entry(key.cluster.clone())
            .or_default()
            .entry(namespace.clone())
            .or_default()
            .insert(key.clone());
        self.quotas.insert(
            key,
            QuotaEntry {
                namespace,
                status_resources,
                demands,
                payload,
            },
        );
        changes
    }

    /// Removes a quota; returns the demand changes.
    pub fn delete(&mut self, key: &QuotaKey) -> Vec<DemandChange> {
        let mut changes = Vec::new();
        if let Some(old) = self.quotas.remove(key) {
            self.adjust(
                &key.cluster,
                &old.namespace,
                &old.demands,
                &BTreeMap::new(),
                &mut changes,
            );
            if let Some(namespaces) = self.by_namespace.get_mut(&key.cluster)
                && let Some(keys) = namespaces.get_mut(&*old.namespace)
            {
                keys.remove(key);
                if keys.is_empty() {
                    namespaces.remove(&*old.namespace);
                }
                if namespaces.is_empty() {
                    self.by_namespace.remove(&key.cluster);
                }
            }
        }
        changes
    }

    /// Replaces every quota of `cluster` with `quotas` (a relist); returns the net demand
    /// changes, so a relist that finds the same quotas changes nothing.
    pub fn reset(
        &mut self,
        cluster: &ClusterName,
        quotas: impl IntoIterator<Item = (QuotaKey, QuotaPolicy, T)>,
    ) -> Vec<DemandChange> {
        let before = self.cluster_demand(cluster);
        let stale: Vec<QuotaKey> = self
            .quotas
            .keys()
            .filter(|k| &k.cluster == cluster)
            .cloned()
            .collect();
        for key in &stale {
            self.delete(key);
        }
        for (key, policy, payload) in quotas {
            self.apply(key, &policy, payload);
        }
        let after = self.cluster_demand(cluster);
        diff(cluster, &before, &after)
    }

    fn adjust(
        &mut self,
        cluster: &ClusterName,
        namespace: &Arc<str>,
        old: &BTreeMap<GroupResource, Need>,
        new: &BTreeMap<GroupResource, Need>,
        changes: &mut Vec<DemandChange>,
    ) {
        let resources: BTreeSet<&GroupResource> = old.keys().chain(new.keys()).collect();
        let all_namespaces: Arc<str> = Arc::from(ALL_NAMESPACES);
        for resource in resources {
            let (was, will) = (old.get(resource), new.get(resource));
            if was == will {
                continue;
            }
            // A cluster-wide resource is demanded for every namespace at once.
            let namespace = if is_cluster_wide(resource) {
                &all_namespaces
            } else {
                namespace
            };
            let namespaces = self
                .demand
                .entry((cluster.clone(), resource.clone()))
                .or_default();
            let refs = namespaces.entry(namespace.clone()).or_default();
            let from = refs.need();
            if let Some(need) = was {
                *refs.slot(*need) -= 1;
            }
            if let Some(need) = will {
                *refs.slot(*need) += 1;
            }
            let to = refs.need();
            if to.is_none() {
                namespaces.remove(namespace);
                if namespaces.is_empty() {
                    self.demand.remove(&(cluster.clone(), resource.clone()));
                }
            }
            if from != to {
                changes.push(DemandChange {
                    cluster: cluster.clone(),
                    resource: resource.clone(),
                    namespace: namespace.clone(),
                    from,
                    to,
                });
            }
        }
    }

    fn cluster_demand(&self, cluster: &ClusterName) -> BTreeMap<(GroupResource, Arc<str>), Need> {
        self.demand
            .range((cluster.clone(), GroupResource::new("", ""))..)
            .take_while(|((c, _), _)| c == cluster)
            .flat_map(|((_, resource), namespaces)| {
                namespaces
                    .iter()
                    .filter_map(|(ns, refs)| Some(((resource.clone(), ns.clone()), refs.need()?)))
            })
            .collect()
    }

    /// A quota, if known.
    pub fn get(&self, key: &QuotaKey) -> Option<&QuotaEntry<T>> {
        self.quotas.get(key)
    }

    /// A quota's payload, mutably (for recording the status the controller wrote).
    pub fn payload_mut(&mut self, key: &QuotaKey) -> Option<&mut T> {
        self.quotas.get_mut(key).map(|e| &mut e.payload)
    }

    /// All quotas.
    pub fn quotas(&self) -> impl Iterator<Item = (&QuotaKey, &QuotaEntry<T>)> {
        self.quotas.iter()
    }

    /// Number of quotas.
    pub fn len(&self) -> usize {
        self.quotas.len()
    }

    /// Whether the index holds no quota.
    pub fn is_empty(&self) -> bool {
        self.quotas.is_empty()
    }

    /// The namespaces that demand `resource` in `cluster`, with their need.
    pub fn demand_of(&self, cluster: &ClusterName, resource: &GroupResource) -> NamespaceDemand {
        self.demand
            .get(&(cluster.clone(), resource.clone()))
            .map(|namespaces| {
                namespaces
                    .iter()
                    .filter_map(|(ns, r)| Some((ns.clone(), r.need()?)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every demanded (cluster, resource).
    pub fn demanded(&self) -> impl Iterator<Item = &(ClusterName, GroupResource)> {
        self.demand.keys()
    }

    /// The need for (cluster, resource, namespace), if demanded.
    pub fn need(&self, cluster: &ClusterName, resource: &GroupResource, namespace: &str) -> Option<Need> {
        self.demand
            .get(&(cluster.clone(), resource.clone()))?
            .get(namespace)?
            .need()
    }

    /// The quotas that a change to an object of `resource` in (cluster, namespace) dirties:
    /// those whose `status.hard` has a key computed from `resource` (upstream's
    /// `replenishQuota` matches on status.hard), and those whose `spec.hard` computes from it.
    ///
    /// The second set is lazyquota's: a new quota has no `status.hard` until its first status
    /// write lands, admission charges nothing meanwhile (it skips quotas without
    /// `status.hard`), and an object created between the computation and that write would be
    /// neither charged nor counted — an undercount until the next resync (upstream shares it).
    pub fn dirtied_by(
        &self,
        cluster: &ClusterName,
        namespace: &str,
        resource: &GroupResource,
    ) -> Vec<QuotaKey> {
        if is_cluster_wide(resource) {
            return self.demanding(cluster, resource);
        }
        // kcp's cluster-scoped quotas count objects of every namespace.
        let everywhere = (namespace != ALL_NAMESPACES)
            .then(|| self.in_namespace(cluster, ALL_NAMESPACES))
            .into_iter()
            .flatten();
        self.in_namespace(cluster, namespace)
            .chain(everywhere)
            .filter(|k| {
                self.quotas.get(*k).is_some_and(|e| {
                    e.status_resources.contains(resource) || e.demands.contains_key(resource)
                })
            })
            .cloned()
            .collect()
    }

    /// The quotas that compute some key from `resource` (by `spec.hard`) in `cluster`: the
    /// quotas to recompute when that resource's watch becomes synced. Only the namespaces
    /// that demand the resource are looked at.
    pub fn computing(&self, cluster: &ClusterName, resource: &GroupResource) -> Vec<QuotaKey> {
        if is_cluster_wide(resource) {
            return self.demanding(cluster, resource);
        }
        let Some(namespaces) = self.demand.get(&(cluster.clone(), resource.clone())) else {
            return Vec::new();
        };
        namespaces
            .keys()
            .flat_map(|ns| self.in_namespace(cluster, ns))
            .filter(|k| self.demands(k, resource))
            .cloned()
            .collect()
    }

    /// Every quota of `cluster` that demands `resource`, in any namespace (a scan of the
    /// cluster's quotas: only for cluster-wide resources, whose demand has no namespaces).
    fn demanding(&self, cluster: &ClusterName, resource: &GroupResource) -> Vec<QuotaKey> {
        self.by_namespace
            .get(cluster)
            .into_iter()
            .flat_map(|n| n.values().flatten())
            .filter(|k| self.demands(k, resource))
            .cloned()
            .collect()
    }

    /// Whether the quota `key` demands `resource`.
    fn demands(&self, key: &QuotaKey, resource: &GroupResource) -> bool {
        self.quotas
            .get(key)
            .is_some_and(|e| e.demands.contains_key(resource))
    }

    /// The quotas of `namespace` in `cluster`.
    pub fn in_namespace<'a>(
        &'a self,
        cluster: &ClusterName,
        namespace: &str,
    ) -> impl Iterator<Item = &'a QuotaKey> {
        self.by_namespace
            .get(cluster)
            .and_then(|n| n.get(namespace))
            .into_iter()
            .flatten()
    }
}

fn diff(
    cluster: &ClusterName,
    before: &BTreeMap<(GroupResource, Arc<str>), Need>,
    after: &BTreeMap<(GroupResource, Arc<str>), Need>,
) -> Vec<DemandChange> {
    let keys: BTreeSet<&(GroupResource, Arc<str>)> = before.keys().chain(after.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let (from, to) = (before.get(k).copied(), after.get(k).copied());
            (from != to).then(|| DemandChange {
                cluster: cluster.clone(),
                resource: k.0.clone(),
                namespace: k.1.clone(),
                from,
                to,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn policy(keys: &[&str], scopes: &[&str]) -> QuotaPolicy {
        QuotaPolicy {
            spec_hard: keys.iter().map(|k| (*k).to_owned()).collect(),
            status_hard: keys.iter().map(|k| (*k).to_owned()).collect(),
            scopes: QuotaScopes::from_requirements(
                scopes
                    .iter()
                    .map(|s| lazyquota_quota::scope::ScopeRequirement::from_scope(s))
                    .collect(),
            ),
            cluster_scoped: false,
        }
    }

    #[test]
    fn kcps_cluster_scoped_quotas_are_recognised_as_kcp_parses_the_annotation() {
        assert!(kcp_cluster_scoped("admin", Some("true")));
        assert!(kcp_cluster_scoped("admin", Some("1")));
        assert!(kcp_cluster_scoped("admin", Some("True")));
        assert!(!kcp_cluster_scoped("admin", Some("yes")), "ParseBool rejects yes");
        assert!(!kcp_cluster_scoped("admin", Some("false")));
        assert!(!kcp_cluster_scoped("admin", None));
        assert!(
            !kcp_cluster_scoped("team", Some("true")),
            "only in the admin namespace"
        );
    }

    /// A cluster-scoped quota demands its resources in every namespace; objects anywhere
    /// dirty it; toggling the annotation moves its demand between its namespace and all.
    #[test]
    fn a_cluster_scoped_quota_demands_every_namespace() {
        let mut index = PolicyIndex::new(FeatureGates::default());
        let cm = GroupResource::core("configmaps");
        let mut p = policy(&["count/configmaps"], &[]);
        p.cluster_scoped = true;
        let changes = index.apply(key("admin", "q"), &p, ());
        assert_eq!(changes.len(), 1);
        assert_eq!(&*changes[0].namespace, ALL_NAMESPACES);
        let c = ClusterName::new("c");
        assert_eq!(
            index
                .demand_of(&c, &cm)
                .keys()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            [ALL_NAMESPACES]
        );
        assert_eq!(
            index.dirtied_by(&c, "team-x", &cm),
            [key("admin", "q")],
            "any namespace"
        );
        assert_eq!(index.computing(&c, &cm), [key("admin", "q")]);
        // The annotation goes: back to its own namespace only.
        let changes = index.apply(key("admin", "q"), &policy(&["count/configmaps"], &[]), ());
        let moved: BTreeSet<(String, Option<Need>)> =
            changes.iter().map(|c| (c.namespace.to_string(), c.to)).collect();
        assert_eq!(
            moved,
            [("*".to_owned(), None), ("admin".to_owned(), Some(Need::Count))].into()
        );
        assert!(index.dirtied_by(&c, "team-x", &cm).is_empty());
        assert_eq!(index.delete(&key("admin", "q")).len(), 1);
        assert!(index.demand_of(&c, &cm).is_empty());
    }

    fn key(ns: &str, name: &str) -> QuotaKey {
        QuotaKey::new(&ClusterName::new("c"), ns, name)
    }

    fn pods() -> GroupResource {
        GroupResource::core("pods")
    }

    #[test]
    fn demand_is_reference_counted_across_quotas() {
        let mut index = PolicyIndex::new(FeatureGates::default());
        let start = index.apply(key("a", "q1"), &policy(&["pods"], &[]), ());
        assert_eq!(start.len(), 1);
        assert_eq!((start[0].from, start[0].to), (None, Some(Need::Typed)));
        assert!(
            index
                .apply(key("a", "q2"), &policy(&["requests.cpu"], &[]), ())
                .is_empty()
        );
        assert!(index.delete(&key("a", "q1")).is_empty(), "q2 still needs pods");
        let stop = index.delete(&key("a", "q2"));
        assert_eq!((stop[0].from, stop[0].to), (Some(Need::Typed), None));
        assert!(index.demanded().next().is_none());
    }

    #[test]
    fn count_and_typed_needs_upgrade_and_downgrade() {
        let mut index = PolicyIndex::new(FeatureGates::default());
        index.apply(key("a", "q1"), &policy(&["count/pods"], &[]), ());
        let up = index.apply(key("a", "q2"), &policy(&["pods"], &[]), ());
        assert_eq!((up[0].from, up[0].to), (Some(Need::Count), Some(Need::Typed)));
        let down = index.delete(&key("a", "q2"));
        assert_eq!((down[0].from, down[0].to), (Some(Need::Typed), Some(Need::Count)));
    }

    #[test]
    fn only_demanding_namespaces_are_demanded() {
        let mut index = PolicyIndex::new(FeatureGates::default());
        index.apply(key("ns-7", "q"), &policy(&["pods"], &[]), ());
        let demand = index.demand_of(&ClusterName::new("c"), &pods());
        assert_eq!(demand.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["ns-7"]);
    }

    #[test]
    fn editing_count_x_to_count_y_moves_the_demand() {
        let mut index = PolicyIndex::new(FeatureGates::default());
        index.apply(key("a", "q"), &policy(&["count/x.example.io"], &[]), ());
        let mut changes = index.apply(key("a", "q"), &policy(&["count/y.example.io"], &[]), ());
        changes.sort();
        assert_eq!(changes.len(), 2);
        assert!(
            changes
                .iter()
                .any(|c| c.resource.resource == "x" && c.to.is_none())
        );
        assert!(
            changes
                .iter()
                .any(|c| c.resource.resource == "y" && c.to == Some(Need::Count))
        );
    }

    #[test]
    fn replenishment_routes_by_status_hard_and_spec_hard() {
        let mut index = PolicyIndex::new(FeatureGates::default());
        // Before its first status write: spec.hard alone routes it (an object created while
        // that write is in flight must still reach it).
        let mut p = policy(&["pods"], &[]);
        p.status_hard = vec![];
        index.apply(key("a", "q"), &p, ());
        assert_eq!(
            index.dirtied_by(&ClusterName::new("c"), "a", &pods()),
            vec![key("a", "q")]
        );
        // status.hard alone routes it too (a key left spec.hard but is still in the status).
        let mut p = policy(&[], &[]);
        p.status_hard = vec!["pods".into()];
        index.apply(key("a", "q"), &p, ());
        assert_eq!(
            index.dirtied_by(&ClusterName::new("c"), "a", &pods()),
            vec![key("a", "q")]
        );
        p.status_hard = vec!["pods".into()];
        index.apply(key("a", "q"), &p, ());
        assert_eq!(
            index.dirtied_by(&ClusterName::new("c"), "a", &pods()),
            vec![key("a", "q")]
        );
        assert!(index.dirtied_by(&ClusterName::new("c"), "b", &pods()).is_empty());
    }

    #[derive(Clone, Debug)]
    enum Op {
        Apply(usize, usize, Vec<usize>, bool),
        Delete(usize, usize),
        Reset(Vec<(usize, usize, Vec<usize>, bool)>),
    }

    const KEYS: &[&str] = &[
        "pods",
        "count/pods",
        "requests.storage",
        "count/widgets.example.io",
        "configmaps",
        "foo",
    ];

    fn op() -> impl Strategy<Value = Op> {
        let quota = (
            0..3usize,
            0..3usize,
            prop::collection::vec(0..KEYS.len(), 0..4),
            any::<bool>(),
        );
        prop_oneof![
            4 => quota.clone().prop_map(|(n, q, k, s)| Op::Apply(n, q, k, s)),
            2 => (0..3usize, 0..3usize).prop_map(|(n, q)| Op::Delete(n, q)),
            1 => prop::collection::vec(quota, 0..5).prop_map(Op::Reset),
        ]
    }

    fn quota_of(n: usize, q: usize, k: &[usize], scoped: bool) -> (QuotaKey, QuotaPolicy, ()) {
        let keys: Vec<&str> = k.iter().map(|i| KEYS[*i]).collect();
        (
            key(&format!("ns{n}"), &format!("q{q}")),
            policy(&keys, if scoped { &["BestEffort"] } else { &[] }),
            (),
        )
    }

    proptest! {
        /// After any sequence of apply/delete/reset, the demand equals the demand computed
        /// from scratch from the final quotas, and replaying the emitted changes onto an empty
        /// demand reproduces it (nothing lost, nothing started twice).
        #[test]
        fn demand_equals_recomputation_from_scratch(ops in prop::collection::vec(op(), 0..40)) {
            let cluster = ClusterName::new("c");
            let mut index = PolicyIndex::new(FeatureGates::default());
            let mut replayed: BTreeMap<(GroupResource, Arc<str>), Need> = BTreeMap::new();
            let mut truth: BTreeMap<QuotaKey, QuotaPolicy> = BTreeMap::new();
            for op in ops {
                let changes = match op {
                    Op::Apply(n, q, k, s) => {
                        let (key, policy, ()) = quota_of(n, q, &k, s);
                        truth.insert(key.clone(), policy.clone());
                        index.apply(key, &policy, ())
                    }
                    Op::Delete(n, q) => {
                        let key = key(&format!("ns{n}"), &format!("q{q}"));
                        truth.remove(&key);
                        index.delete(&key)
                    }
                    Op::Reset(quotas) => {
                        let quotas: Vec<_> = quotas.iter().map(|(n, q, k, s)| quota_of(*n, *q, k, *s)).collect();
                        truth = quotas.iter().map(|(k, p, ())| (k.clone(), p.clone())).collect();
                        index.reset(&cluster, quotas)
                    }
                };
                for c in changes {
                    let slot = (c.resource.clone(), c.namespace.clone());
                    prop_assert_eq!(replayed.get(&slot).copied(), c.from, "change {:?} does not start from the replayed state", c);
                    match c.to {
                        Some(need) => { replayed.insert(slot, need); }
                        None => { replayed.remove(&slot); }
                    }
                }
            }
            let mut fresh = PolicyIndex::new(FeatureGates::default());
            for (key, policy) in &truth {
                fresh.apply(key.clone(), policy, ());
            }
            let expected = fresh.cluster_demand(&cluster);
            prop_assert_eq!(&index.cluster_demand(&cluster), &expected);
            prop_assert_eq!(&replayed, &expected);
            // Routing by namespace answers as a scan of every quota would.
            for resource in [GroupResource::core("pods"), GroupResource::core("configmaps"), GroupResource::new("example.io", "widgets")] {
                let mut computing = index.computing(&cluster, &resource);
                computing.sort();
                let mut scanned: Vec<QuotaKey> = index.quotas().filter(|(_, e)| e.demands.contains_key(&resource)).map(|(k, _)| k.clone()).collect();
                scanned.sort();
                prop_assert_eq!(computing, scanned);
                for n in 0..3 {
                    let ns = format!("ns{n}");
                    let mut dirtied = index.dirtied_by(&cluster, &ns, &resource);
                    dirtied.sort();
                    let mut scanned: Vec<QuotaKey> = index
                        .quotas()
                        .filter(|(k, e)| {
                            *k.namespace == *ns
                                && (e.status_resources.contains(&resource) || e.demands.contains_key(&resource))
                        })
                        .map(|(k, _)| k.clone())
                        .collect();
                    scanned.sort();
                    prop_assert_eq!(dirtied, scanned);
                }
            }
        }
    }
}
