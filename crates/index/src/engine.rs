//! The Engine: everything lazyquota knows, as one pure state machine — quotas and their
//! demand ([`PolicyIndex`]), what each cluster serves ([`Resolver`]), the evaluators
//! (`Registry`), and the objects held ([`UsageStore`]s) — and the computation of a quota's
//! `status` from them, as upstream's `syncResourceQuota` does.
//!
//! The controller (crates/kube) is the IO loop around it: it feeds watch events in and
//! writes the decisions out. `lazyquota usage` feeds it one direct list instead.
//!
//! Stores: count-only objects in one `UsageStore<()>`; pods, services, PVCs and
//! ResourceClaims watched for their projections in a store each; DeviceClasses (name and
//! extended resource name) in one more, for the resourceclaims evaluator. Which store a partition lives in follows the need of
//! the watch that fills it ([`store_kind`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use lazyquota_quota::{
    ClaimProjection, FeatureGates, PodProjection, PvcProjection, Registry, ServiceProjection, Time,
    pod_update_triggers, pvc_update_triggers, service_update_triggers,
};

use crate::{
    keys::{ClusterName, GroupResource, Need},
    policy::PolicyIndex,
    resolver::{Resolver, ResolverChange, ServedResource},
    store::{Change, HeapSize, PartitionKey, UsageStore},
};

mod arrivals;
mod compute;
mod quotas;

pub use compute::{Computed, KeySources};
pub use quotas::{QuotaState, QuotaUpdate, Reset};

/// What the store keeps of one object, as extracted by the watch.
#[derive(Clone, Debug)]
pub enum Projected {
    /// Existence only.
    Meta,
    /// A pod's projection.
    Pod(PodProjection),
    /// A service's projection.
    Service(ServiceProjection),
    /// A PVC's projection.
    Pvc(PvcProjection),
    /// A ResourceClaim's projection.
    Claim(ClaimProjection),
    /// A DeviceClass: what the resourceclaims evaluator's mapping reads.
    DeviceClass(DeviceClassEntry),
}

/// Which store a partition lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StoreKind {
    /// Count-only objects.
    Counts,
    /// Pod projections.
    Pods,
    /// Service projections.
    Services,
    /// PVC projections.
    Pvcs,
    /// ResourceClaim projections.
    Claims,
    /// DeviceClasses.
    DeviceClasses,
}

/// A DeviceClass as the store keeps it: its name and `spec.extendedResourceName`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceClassEntry {
    /// `metadata.name`.
    pub name: Box<str>,
    /// `spec.extendedResourceName`.
    pub extended_resource_name: Option<Box<str>>,
}

/// DeviceClasses are read whole, never summed.
impl crate::store::Tallied for DeviceClassEntry {
    type Tally = ();
}

impl HeapSize for DeviceClassEntry {
    fn heap_bytes(&self) -> usize {
        self.name.len() + self.extended_resource_name.as_deref().map_or(0, str::len)
    }
}

/// The store that objects of `resource` watched with `need` go to.
pub fn store_kind(resource: &GroupResource, need: Need) -> StoreKind {
    match (need, resource.group.as_str(), resource.resource.as_str()) {
        (Need::Typed, "", "pods") => StoreKind::Pods,
        (Need::Typed, "", "services") => StoreKind::Services,
        (Need::Typed, "", "persistentvolumeclaims") => StoreKind::Pvcs,
        (Need::Typed, "resource.k8s.io", "resourceclaims") => StoreKind::Claims,
        (Need::Typed, "resource.k8s.io", "deviceclasses") => StoreKind::DeviceClasses,
        _ => StoreKind::Counts,
    }
}

/// The outcome of applying an object event.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    /// The partition is not held: the object was dropped at ingest.
    NotHeld,
    /// Stored; the quotas need no recalculation (an update upstream's filter
    /// ignores).
    Stored,
    /// Stored or removed, and the namespace's quotas must be recomputed (a delete or a
    /// filtered update, as upstream; or an add, see [`Engine::apply`]).
    Replenish,
    /// The object could not be projected; the reason.
    Malformed(String),
}

/// The engine.
#[derive(Debug)]
pub struct Engine {
    gates: FeatureGates,
    /// kcp semantics: cluster-scoped quotas in `admin` count every namespace.
    kcp: bool,
    /// Quotas and demand.
    pub index: PolicyIndex<QuotaState>,
    /// What each cluster serves.
    pub resolver: Resolver,
    /// Per cluster, the quotable types discovery served once and serves no more: upstream
    /// never removes an evaluator, so their keys are still computed. A cluster's evaluators
    /// are the static ones, its quotable types now (the Resolver's) and these — built per
    /// computation rather than kept per cluster (a kcp shard's engine serves many).
    gone: HashMap<ClusterName, BTreeSet<GroupResource>>,
    counts: UsageStore<()>,
    pods: UsageStore<PodProjection>,
    services: UsageStore<ServiceProjection>,
    pvcs: UsageStore<PvcProjection>,
    claims: UsageStore<ClaimProjection>,
    device_classes: UsageStore<DeviceClassEntry>,
}

/// Dispatches `$body` with `$s` bound to the store of kind `$kind`.
macro_rules! with_store {
    ($self:ident, $kind:expr, |$s:ident| $body:expr) => {
        match $kind {
            StoreKind::Counts => {
                let $s = &mut $self.counts;
                $body
            }
            StoreKind::Pods => {
                let $s = &mut $self.pods;
                $body
            }
            StoreKind::Services => {
                let $s = &mut $self.services;
                $body
            }
            StoreKind::Pvcs => {
                let $s = &mut $self.pvcs;
                $body
            }
            StoreKind::Claims => {
                let $s = &mut $self.claims;
                $body
            }
            StoreKind::DeviceClasses => {
                let $s = &mut $self.device_classes;
                $body
            }
        }
    };
}

impl Engine {
    /// An empty engine for a KCM with `gates`.
    pub fn new(gates: FeatureGates) -> Self {
        Self {
            gates,
            kcp: false,
            index: PolicyIndex::new(gates),
            resolver: Resolver::new(),
            gone: HashMap::new(),
            counts: UsageStore::new(),
            pods: UsageStore::new(),
            services: UsageStore::new(),
            pvcs: UsageStore::new(),
            claims: UsageStore::new(),
            device_classes: UsageStore::new(),
        }
    }

    /// The engine with kcp's quota semantics: a ResourceQuota in namespace `admin` annotated
    /// `experimental.quota.kcp.io/cluster-scoped: "true"` computes its keys over every
    /// namespace of its logical cluster, as kcp's own quota controller does.
    #[must_use]
    pub fn with_kcp_semantics(mut self) -> Self {
        self.kcp = true;
        self.resolver = std::mem::take(&mut self.resolver).with_cluster_scoped();
        self
    }

    /// The feature gates.
    pub fn gates(&self) -> FeatureGates {
        self.gates
    }

    // ---- discovery -------------------------------------------------------------------------

    /// Takes a discovery run's results for `cluster`: updates what resolves and registers a
    /// generic object-count evaluator for every quotable resource (upstream's `SyncMonitors`;
    /// like upstream, evaluators are never removed).
    pub fn discovered(
        &mut self,
        cluster: &ClusterName,
        served: Vec<ServedResource>,
        failed_groups: &[String],
    ) -> Vec<ResolverChange> {
        let before: BTreeSet<GroupResource> = self
            .resolver
            .quotable(cluster)
            .map(|s| s.resource.clone())
            .collect();
        let changes = self.resolver.replace(cluster, served, failed_groups);
        let gone = self.gone.entry(cluster.clone()).or_default();
        for change in &changes {
            match change {
                ResolverChange::Gone(r) if before.contains(r) => {
                    gone.insert(r.clone());
                }
                ResolverChange::Served(r) => {
                    gone.remove(r);
                }
                _ => {}
            }
        }
        if gone.is_empty() {
            self.gone.remove(cluster);
        }
        changes
    }

    /// The evaluators of `cluster` (upstream's registry after `SyncMonitors`): the static ones,
    /// and an object count for every quotable type its discovery has served. Before the first
    /// discovery only the static ones exist, as in upstream.
    fn registry(&self, cluster: &ClusterName) -> Registry {
        let mut registry = Registry::new(self.gates);
        let gone = self.gone.get(cluster).into_iter().flatten();
        for resource in self.resolver.quotable(cluster).map(|s| &s.resource).chain(gone) {
            registry.add_discovered(resource.clone());
        }
        registry
    }

    /// Forgets what discovery found in `cluster` (a kcp logical cluster no longer served):
    /// nothing resolves there until it is discovered again, so no watch is planned and no
    /// status written. Its quotas stay (the quota watch keeps them current).
    pub fn forget_cluster(&mut self, cluster: &ClusterName) {
        self.resolver.remove_cluster(cluster);
        self.gone.remove(cluster);
    }

    // ---- partitions ------------------------------------------------------------------------

    /// Starts holding a partition (empty, unsynced).
    pub fn hold(&mut self, kind: StoreKind, p: PartitionKey) {
        with_store!(self, kind, |s| s.hold(p));
    }

    /// Stops holding a partition and frees its objects.
    pub fn release(&mut self, kind: StoreKind, p: &PartitionKey) {
        with_store!(self, kind, |s| s.release(p));
    }

    /// Whether a partition is held.
    pub fn holds(&self, kind: StoreKind, p: &PartitionKey) -> bool {
        match kind {
            StoreKind::Counts => self.counts.holds(p),
            StoreKind::Pods => self.pods.holds(p),
            StoreKind::Services => self.services.holds(p),
            StoreKind::Pvcs => self.pvcs.holds(p),
            StoreKind::Claims => self.claims.holds(p),
            StoreKind::DeviceClasses => self.device_classes.holds(p),
        }
    }

    /// Starts a relist of a partition.
    pub fn begin_relist(&mut self, kind: StoreKind, p: &PartitionKey) {
        with_store!(self, kind, |s| s.begin_relist(p));
    }

    /// Completes a relist: the partition is synced.
    pub fn finish_relist(&mut self, kind: StoreKind, p: &PartitionKey) {
        with_store!(self, kind, |s| {
            s.finish_relist(p);
        });
    }

    /// Marks a partition's watch as failing (`true`: its keys keep their values, see
    /// [`crate::store::Partition::is_current`]) or delivering again (`false`).
    pub fn set_stale(&mut self, kind: StoreKind, p: &PartitionKey, stale: bool) {
        with_store!(self, kind, |s| s.set_stale(p, stale));
    }

    /// Starts filling a partition that a running cluster-wide watch now also serves, from a
    /// list of its own (see [`UsageStore::begin_fill`]).
    pub fn begin_fill(&mut self, kind: StoreKind, p: PartitionKey) {
        with_store!(self, kind, |s| s.begin_fill(p));
    }

    /// Completes a fill with the namespace's list. Returns the reasons of objects that could
    /// not be projected, or `None` if no fill was in progress (superseded or released).
    pub fn finish_fill(
        &mut self,
        kind: StoreKind,
        p: &PartitionKey,
        listed: Vec<(u64, Projected)>,
    ) -> Option<Vec<String>> {
        let mut malformed = Vec::new();
        macro_rules! typed {
            ($store:expr, $variant:path) => {{
                let objects: Vec<_> = listed
                    .into_iter()
                    .filter_map(|(id, o)| match o {
                        $variant(v) => Some((id, v)),
                        other => {
                            malformed.push(format!("{other:?}"));
                            None
                        }
                    })
                    .collect();
                $store.finish_fill(p, objects)
            }};
        }
        let filled = match kind {
            StoreKind::Counts => self
                .counts
                .finish_fill(p, listed.into_iter().map(|(id, _)| (id, ()))),
            StoreKind::Pods => typed!(self.pods, Projected::Pod),
            StoreKind::Services => typed!(self.services, Projected::Service),
            StoreKind::Pvcs => typed!(self.pvcs, Projected::Pvc),
            StoreKind::Claims => typed!(self.claims, Projected::Claim),
            StoreKind::DeviceClasses => typed!(self.device_classes, Projected::DeviceClass),
        };
        filled.then_some(malformed)
    }

    /// An object of a relist. Returns the reason if it could not be projected.
    pub fn relist_apply(
        &mut self,
        kind: StoreKind,
        p: &PartitionKey,
        id: u64,
        object: Projected,
    ) -> Option<String> {
        match (kind, object) {
            (StoreKind::Counts, _) => self.counts.relist_apply(p, id, ()),
            (StoreKind::Pods, Projected::Pod(o)) => self.pods.relist_apply(p, id, o),
            (StoreKind::Services, Projected::Service(o)) => self.services.relist_apply(p, id, o),
            (StoreKind::Pvcs, Projected::Pvc(o)) => self.pvcs.relist_apply(p, id, o),
            (StoreKind::Claims, Projected::Claim(o)) => self.claims.relist_apply(p, id, o),
            (StoreKind::DeviceClasses, Projected::DeviceClass(o)) => {
                self.device_classes.relist_apply(p, id, o);
            }
            (kind, object) => return Some(format!("{object:?} does not belong in the {kind:?} store")),
        }
        None
    }

    /// An added or modified object, stored at `revision` (`None`: not a number, and then it
    /// pays no charge); says whether the namespace's quotas
    /// must be recomputed: on updates, when upstream's update filter says so; on **adds**,
    /// always — unlike upstream. The admission plugin charges a create before the object
    /// exists, so a recalculation from a cache that has not seen the object yet writes a lower
    /// value under a current resourceVersion (no conflict), and upstream keeps that undercount
    /// until its next full resync. kcp works around the same drift by turning adds into
    /// updates. Recomputing on adds costs one computation, coalesced by the work queue, and
    /// writes nothing when the values already agree. What the object adds to the quotas of
    /// its partition pays their charges ([`crate::charges`]); a paid charge recomputes them
    /// too.
    pub fn apply(
        &mut self,
        kind: StoreKind,
        p: &PartitionKey,
        id: u64,
        object: Projected,
        revision: Option<u64>,
        now: Time,
    ) -> Applied {
        if !self.holds(kind, p) {
            return Applied::NotHeld;
        }
        let gates = self.gates;
        let counted = |added: bool| {
            move |e: &lazyquota_quota::Evaluator, keys: &[String], scopes: &lazyquota_quota::QuotaScopes| {
                if added {
                    arrivals::one_more(e, keys, scopes, gates)
                } else {
                    Vec::new()
                }
            }
        };
        let (replenish, paid) = match (kind, object) {
            // Metadata-only updates never change a count (upstream's filter is false for them).
            (StoreKind::Counts, _) => {
                let added = matches!(self.counts.apply(p, id, ()), Change::Added);
                (added, added && self.account_arrival(p, revision, &counted(true)))
            }
            (StoreKind::Pods, Projected::Pod(new)) => {
                let change = self.pods.apply(p, id, new.clone());
                let old = match &change {
                    Change::Updated(old) => Some(old),
                    _ => None,
                };
                let grew = |_: &lazyquota_quota::Evaluator,
                            keys: &[String],
                            scopes: &lazyquota_quota::QuotaScopes| {
                    arrivals::growth(old, &new, keys, scopes, now, gates)
                };
                let replenish = old.is_none_or(|old| pod_update_triggers(old, &new, now, gates));
                (replenish, self.account_arrival(p, revision, &grew))
            }
            (StoreKind::Services, Projected::Service(new)) => {
                let change = self.services.apply(p, id, new);
                let old = match &change {
                    Change::Updated(old) => Some(old),
                    _ => None,
                };
                let grew = |_: &lazyquota_quota::Evaluator,
                            keys: &[String],
                            scopes: &lazyquota_quota::QuotaScopes| {
                    arrivals::growth(old, &new, keys, scopes, now, gates)
                };
                let replenish = old.is_none_or(|old| service_update_triggers(old, &new));
                (replenish, self.account_arrival(p, revision, &grew))
            }
            (StoreKind::Pvcs, Projected::Pvc(new)) => {
                let change = self.pvcs.apply(p, id, new.clone());
                let old = match &change {
                    Change::Updated(old) => Some(old),
                    _ => None,
                };
                let grew = |_: &lazyquota_quota::Evaluator,
                            keys: &[String],
                            scopes: &lazyquota_quota::QuotaScopes| {
                    arrivals::growth(old, &new, keys, scopes, now, gates)
                };
                let replenish = old.is_none_or(|old| pvc_update_triggers(old, &new));
                (replenish, self.account_arrival(p, revision, &grew))
            }
            // Upstream's update filter never replenishes on a claim update (its spec is
            // immutable). A claim pays only its count: its other keys join it with its pod.
            (StoreKind::Claims, Projected::Claim(new)) => {
                let added = !matches!(self.claims.apply(p, id, new), Change::Updated(_));
                (added, added && self.account_arrival(p, revision, &counted(true)))
            }
            // Not a quota monitor upstream (its mapping is read at the next sync); here a
            // changed mapping recomputes the quotas that read it.
            (StoreKind::DeviceClasses, Projected::DeviceClass(new)) => {
                let replenish = match self.device_classes.apply(p, id, new.clone()) {
                    Change::Updated(old) => old != new,
                    _ => true,
                };
                (replenish, false)
            }
            (kind, object) => {
                return Applied::Malformed(format!("{object:?} does not belong in the {kind:?} store"));
            }
        };
        if replenish || paid {
            Applied::Replenish
        } else {
            Applied::Stored
        }
    }

    /// A deleted object: upstream always replenishes on delete.
    pub fn delete(&mut self, kind: StoreKind, p: &PartitionKey, id: u64) -> Applied {
        let removed = with_store!(self, kind, |s| !matches!(s.delete(p, id), Change::None));
        if removed {
            Applied::Replenish
        } else {
            Applied::NotHeld
        }
    }

    /// Namespaces held for (cluster, resource) in a store.
    pub fn held_namespaces(
        &self,
        kind: StoreKind,
        cluster: &ClusterName,
        resource: &GroupResource,
    ) -> Vec<PartitionKey> {
        let matches = |p: &&PartitionKey| &p.cluster == cluster && &p.resource == resource;
        match kind {
            StoreKind::Counts => self
                .counts
                .partition_stats()
                .map(|(p, _, _)| p)
                .filter(matches)
                .cloned()
                .collect(),
            StoreKind::Pods => self
                .pods
                .partition_stats()
                .map(|(p, _, _)| p)
                .filter(matches)
                .cloned()
                .collect(),
            StoreKind::Services => self
                .services
                .partition_stats()
                .map(|(p, _, _)| p)
                .filter(matches)
                .cloned()
                .collect(),
            StoreKind::Pvcs => self
                .pvcs
                .partition_stats()
                .map(|(p, _, _)| p)
                .filter(matches)
                .cloned()
                .collect(),
            StoreKind::Claims => self
                .claims
                .partition_stats()
                .map(|(p, _, _)| p)
                .filter(matches)
                .cloned()
                .collect(),
            StoreKind::DeviceClasses => self
                .device_classes
                .partition_stats()
                .map(|(p, _, _)| p)
                .filter(matches)
                .cloned()
                .collect(),
        }
    }

    /// Bytes the typed stores' tallies hold (pods, services, PVCs; `store::tally`), beside
    /// the objects' own bytes in [`Engine::held_by_resource`].
    pub fn tally_bytes(&self) -> usize {
        self.pods.tally_bytes() + self.services.tally_bytes() + self.pvcs.tally_bytes()
    }

    /// Objects and bytes held per resource (`count/` name), computed now (scrape time).
    pub fn held_by_resource(&self) -> BTreeMap<String, (usize, usize)> {
        let mut held: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        let mut add = |p: &PartitionKey, n: usize, b: usize| {
            let e = held.entry(p.resource.object_count_name()).or_default();
            e.0 += n;
            e.1 += b;
        };
        self.counts.partition_stats().for_each(|(p, n, b)| add(p, n, b));
        self.pods.partition_stats().for_each(|(p, n, b)| add(p, n, b));
        self.services.partition_stats().for_each(|(p, n, b)| add(p, n, b));
        self.pvcs.partition_stats().for_each(|(p, n, b)| add(p, n, b));
        self.claims.partition_stats().for_each(|(p, n, b)| add(p, n, b));
        self.device_classes
            .partition_stats()
            .for_each(|(p, n, b)| add(p, n, b));
        held
    }
}

/// Value equality of two resource lists (absent is empty).
pub(crate) use lazyquota_quota::lists_equal as same_quantities;
/// Value equality of two quantities (`Cmp`), string equality for unparsable ones.
pub use lazyquota_quota::same_value;

#[cfg(test)]
mod tests;
