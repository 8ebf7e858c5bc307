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
    sorted::{SortedMap, SortedSet},
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
    /// Sorted, in a `Vec` of exactly their number (a B-tree set's first node is several
    /// hundred bytes; a quota's keys name a few resources).
    status_resources: Vec<GroupResource>,
    /// What this quota adds to the demand: resource → need.
    demands: Demands,
    /// The caller's parsed quota (spec, status, resourceVersion...).
    pub payload: T,
}

impl<T> QuotaEntry<T> {
    /// The resources this quota demands and how much of each object it needs.
    pub fn demands(&self) -> &Demands {
        &self.demands
    }

    /// The namespace its keys are computed over: its own, or [`ALL_NAMESPACES`].
    pub fn demand_namespace(&self) -> &Arc<str> {
        &self.namespace
    }
}

/// What one quota demands, resource → need, sorted by resource in a `Vec` of exactly its
/// entries: a quota's keys name a resource or a few, and a B-tree map's first node is several
/// hundred bytes whatever it holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Demands(Vec<(GroupResource, Need)>);

impl Demands {
    /// The need for `resource`, if demanded.
    pub fn get(&self, resource: &GroupResource) -> Option<&Need> {
        self.0
            .binary_search_by(|(r, _)| r.cmp(resource))
            .ok()
            .map(|i| &self.0[i].1)
    }

    /// Whether `resource` is demanded.
    pub fn contains_key(&self, resource: &GroupResource) -> bool {
        self.get(resource).is_some()
    }

    /// The resources demanded, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &GroupResource> {
        self.0.iter().map(|(r, _)| r)
    }
}

impl From<BTreeMap<GroupResource, Need>> for Demands {
    fn from(map: BTreeMap<GroupResource, Need>) -> Self {
        let mut entries: Vec<_> = map.into_iter().collect();
        entries.shrink_to_fit();
        Self(entries)
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

/// The references of each namespace demanding one (cluster, resource): on kcp that is one
/// namespace of one workspace, and a B-tree map's first node would be 320 bytes for it.
type NamespaceRefs = SortedMap<Arc<str>, Refs>;

/// The index. `T` is whatever the caller keeps per quota (the parsed spec and status).
#[derive(Debug)]
pub struct PolicyIndex<T> {
    gates: FeatureGates,
    quotas: HashMap<QuotaKey, QuotaEntry<T>>,
    /// The quotas of each (cluster, namespace): events are routed to a namespace's quotas
    /// without scanning every quota of every namespace.
    /// A cluster's namespaces and each one's keys in sorted `Vec`s: on kcp a workspace
    /// usually has one namespace with quotas and one quota or a few, where a hash map's first
    /// table is about 200 bytes and a B-tree's first node several hundred whatever it holds.
    by_namespace: HashMap<ClusterName, SortedMap<Arc<str>, SortedSet<QuotaKey>>>,
    demand: BTreeMap<(ClusterName, GroupResource), NamespaceRefs>,
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
        let demands = Demands::from(demands);
        let status_resources = self.status_resources(&policy.status_hard);
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
                self.adjust(
                    &key.cluster,
                    &namespace,
                    &Demands::default(),
                    &demands,
                    &mut changes,
                );
            }
            None => self.adjust(
                &key.cluster,
                &namespace,
                &Demands::default(),
                &demands,
                &mut changes,
            ),
        }
        self.by_namespace
            .entry(key.cluster.clone())
            .or_default()
            .get_or_default(&namespace)
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

    /// The resources whose changes replenish a quota with these `status.hard` keys.
    fn status_resources(&self, status_hard: &[String]) -> Vec<GroupResource> {
        let mut status_resources: Vec<GroupResource> = status_hard
            .iter()
            .flat_map(|k| replenished_by(k, self.gates))
            .collect();
        status_resources.sort_unstable();
        status_resources.dedup();
        status_resources.shrink_to_fit();
        status_resources
    }

    /// A quota's `status.hard` keys are now `status_hard` (its own write's answer, recorded
    /// before its event): replenishment routes on them from now on.
    pub fn set_status_hard(&mut self, key: &QuotaKey, status_hard: &[String]) {
        let status_resources = self.status_resources(status_hard);
        if let Some(entry) = self.quotas.get_mut(key) {
            entry.status_resources = status_resources;
        }
    }

    /// Removes a quota; returns the demand changes.
    pub fn delete(&mut self, key: &QuotaKey) -> Vec<DemandChange> {
        let mut changes = Vec::new();
        if let Some(old) = self.quotas.remove(key) {
            self.adjust(
                &key.cluster,
                &old.namespace,
                &old.demands,
                &Demands::default(),
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
        old: &Demands,
        new: &Demands,
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
            let refs = namespaces.get_or_default(namespace);
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

    /// The resources demanded in `cluster`, in order: a range of the demand map (the empty
    /// group and resource sort first), so a cluster's discovery or plan costs its own
    /// demands, not every cluster's.
    pub fn demanded_in<'a>(
        &'a self,
        cluster: &'a ClusterName,
    ) -> impl Iterator<Item = &'a GroupResource> + 'a {
        let first = (cluster.clone(), GroupResource::new("", ""));
        self.demand
            .range(first..)
            .take_while(move |((c, _), _)| c == cluster)
            .map(|((_, resource), _)| resource)
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
            .iter()
            .flat_map(|(ns, _)| self.in_namespace(cluster, ns))
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
mod tests;
