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
use std::sync::Arc;

use k8s_openapi::{api::core::v1::ResourceQuota, apimachinery::pkg::api::resource::Quantity as K8sQuantity};
use lazyquota_quota::{
    ClaimProjection, DeviceClassMap, Evaluator, FeatureGates, PodProjection, PvcProjection, Quantity,
    QuotaObject, QuotaScopes, QuotaSpec, Registry, ResourceList, ServiceProjection, SpecProblem,
    StatusDecision, Time, assemble_status, calculate_object_count_usage, calculate_usage, claim_usage,
    pod_update_triggers, pvc_update_triggers, service_update_triggers, verified_owner,
};

use crate::{
    demand::device_classes,
    keys::{ALL_NAMESPACES, ClusterName, GroupResource, Need, QuotaKey},
    policy::{DemandChange, KCP_CLUSTER_SCOPED_ANNOTATION, PolicyIndex, QuotaPolicy, kcp_cluster_scoped},
    resolver::{Resolver, ResolverChange, ServedResource},
    store::{Change, HeapSize, PartitionKey, UsageStore},
};

/// What is kept per quota: parsed, never the full object (a few hundred bytes and the hard keys).
#[derive(Debug)]
pub struct QuotaState {
    /// Parsed spec (hard keys, scopes, problems).
    pub spec: QuotaSpec,
    /// `spec.hard` as the apiserver stores it (copied verbatim into `status.hard`).
    pub spec_hard: Option<BTreeMap<String, K8sQuantity>>,
    /// `status.hard` as last seen or written.
    pub status_hard: Option<BTreeMap<String, K8sQuantity>>,
    /// `status.used` as last seen or written: the previous values that unsynced keys keep.
    pub status_used: Option<BTreeMap<String, K8sQuantity>>,
    /// The resourceVersion a status write is guarded by.
    pub resource_version: Option<String>,
    /// The quota's uid, for Events about it.
    pub uid: Option<String>,
    /// Raises of `status.used` someone else made lately (quota admission charging creates
    /// whose objects may not be held yet): never written below ([`crate::lowering`]). Empty,
    /// and so free, on a quota nobody charges; at most [`crate::lowering::MAX_CHARGES`].
    pub charges: Vec<crate::lowering::Charge>,
    /// The resourceVersion the quota is at and when (the caller's milliseconds) lazyquota saw
    /// it first ([`crate::lowering::hold_until_caught_up`]).
    pub view: (u64, u64),
    /// When (the caller's milliseconds) the quota was first seen or its spec last changed
    /// (`hard` keys or values, scopes): for [`crate::lowering::SETTLE_MS`] after, objects
    /// admitted before a key existed, or outside the quota's old scope (uncharged), may still
    /// be on their way, so no key is written lower or for the first time until the watches
    /// have caught up with the quota's version.
    pub spec_ms: u64,
    /// Keys added to `spec.hard` since lazyquota last saw them there while `status.used`
    /// still has a value for them: nobody maintained that value meanwhile (admission charges
    /// only keys in `spec.hard`), so until lazyquota writes a computed value it is never
    /// copied as the key's previous value ([`crate::lowering::drop_unmaintained`]). Empty
    /// (no allocation) on a quota whose keys do not come back.
    pub fresh: Vec<String>,
}

impl QuotaState {
    /// Parses a quota into the index's policy and the kept state; with `kcp`, kcp's
    /// cluster-scoped quotas are recognised ([`kcp_cluster_scoped`]).
    pub fn from_quota(quota: &ResourceQuota, kcp: bool) -> (QuotaPolicy, Self) {
        let spec = QuotaSpec::from_resource_quota(quota);
        let status = quota.status.as_ref();
        let policy = QuotaPolicy {
            spec_hard: spec.hard_keys.iter().cloned().collect(),
            status_hard: status
                .and_then(|s| s.hard.as_ref())
                .map(|h| h.keys().cloned().collect())
                .unwrap_or_default(),
            scopes: spec.scopes.clone(),
            cluster_scoped: kcp
                && kcp_cluster_scoped(
                    quota.metadata.namespace.as_deref().unwrap_or_default(),
                    quota
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(KCP_CLUSTER_SCOPED_ANNOTATION))
                        .map(String::as_str),
                ),
        };
        let state = Self {
            spec,
            spec_hard: quota.spec.as_ref().and_then(|s| s.hard.clone()),
            status_hard: status.and_then(|s| s.hard.clone()),
            status_used: status.and_then(|s| s.used.clone()),
            resource_version: quota.metadata.resource_version.clone(),
            uid: quota.metadata.uid.clone(),
            charges: Vec::new(),
            view: (0, 0),
            spec_ms: 0,
            fresh: Vec::new(),
        };
        (policy, state)
    }

    /// Carries what is kept across events from `old`, the state this one replaces: recent
    /// charges, the view, and the keys added back to `spec.hard` ([`QuotaState::fresh`]).
    fn carry_from(&mut self, old: &QuotaState) {
        self.charges.clone_from(&old.charges);
        self.view = old.view;
        self.spec_ms = old.spec_ms;
        let used = self.status_used.as_ref();
        let before = &old.spec.hard_keys;
        let mut fresh: Vec<String> = old
            .fresh
            .iter()
            .filter(|k| self.spec.hard_keys.contains(*k))
            .cloned()
            .collect();
        for key in &self.spec.hard_keys {
            if !before.contains(key) && used.is_some_and(|u| u.contains_key(key)) && !fresh.contains(key) {
                fresh.push(key.clone());
            }
        }
        self.fresh = fresh;
    }
}

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

/// What applying a quota did.
#[derive(Debug)]
pub struct QuotaUpdate {
    /// Demand changes to turn into watch starts and stops.
    pub changes: Vec<DemandChange>,
    /// Whether the quota must be computed now: it is new, or its `spec.hard` (by value) or
    /// its scopes changed. Upstream enqueues only on new or `spec.hard` changes; lazyquota
    /// also recomputes at once on a `scopeSelector` change.
    pub recompute: bool,
    /// Whether someone else changed `status.used` (by value): the quota is to be checked
    /// again a little later (see [`Engine::apply_quota`]).
    pub recheck: bool,
    /// With `recheck`: what was raised, key by key (hand it to [`Engine::note_charge`]).
    pub raised: Vec<(String, Quantity)>,
    /// Problems of the spec, to report (only when `recompute`).
    pub problems: Vec<SpecProblem>,
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

    // ---- quotas ----------------------------------------------------------------------------

    /// Adds or updates a quota.
    pub fn apply_quota(&mut self, key: QuotaKey, quota: &ResourceQuota) -> QuotaUpdate {
        let (policy, mut state) = QuotaState::from_quota(quota, self.kcp);
        let old = self.index.get(&key).map(|old| &old.payload);
        if let Some(old) = old {
            state.carry_from(old);
        }
        let recompute = match self.index.get(&key) {
            None => true,
            Some(old) => {
                (&**old.demand_namespace() == ALL_NAMESPACES) != policy.cluster_scoped
                    || old.payload.spec.hard_keys != state.spec.hard_keys
                    || !same_quantities(old.payload.spec_hard.as_ref(), state.spec_hard.as_ref())
                    || old.payload.spec.scopes != state.spec.scopes
            }
        };
        // Unlike upstream: a status.used someone else changed (admission charging a create,
        // another writer) is checked against the objects again — later, not at once.
        // Admission charges before the object exists; when the quota's watch delivers that
        // charge *after* the object's watch delivered the object (watches resuming after a
        // cut, in any order), the computation at the object's add compared with the older
        // status, found it equal and wrote nothing, and the charge (too high, if the object
        // was deleted meanwhile) would stand until the resync. Checking at once would instead
        // write a lower value whenever the charge arrives before the object (the usual order):
        // a window in which admission under-charges, and a write racing admission's own. Our
        // own writes are usually recorded before their events arrive and then do not count as
        // a change (an event ahead of its write's response counts: too high for a moment).
        let recheck = !recompute
            && self.index.get(&key).is_some_and(|old| {
                !same_quantities(old.payload.status_used.as_ref(), state.status_used.as_ref())
            });
        // Raises are charges even when the spec changed too (a fresh read after a conflict can
        // jump over an edit and admission's charges at once).
        let raised = if self.index.get(&key).is_some() {
            crate::lowering::raised(
                self.index
                    .get(&key)
                    .and_then(|old| old.payload.status_used.as_ref()),
                state.status_used.as_ref(),
            )
        } else {
            Vec::new()
        };
        let problems = if recompute {
            state.spec.problems.clone()
        } else {
            Vec::new()
        };
        let changes = self.index.apply(key, &policy, state);
        QuotaUpdate {
            changes,
            recompute,
            recheck,
            raised,
            problems,
        }
    }

    /// Removes a quota.
    pub fn delete_quota(&mut self, key: &QuotaKey) -> Vec<DemandChange> {
        self.index.delete(key)
    }

    /// Replaces every quota of `cluster` (a relist of the quota watch): see [`Reset`]. Each quota still there
    /// keeps its recent charges ([`crate::lowering`]): a relist must not forget a charge whose
    /// object is still on its way. Returns the demand changes and, per quota, what someone
    /// else raised in `status.used` since the view held (charges the relist brought instead
    /// of the events missed): the caller notes them as charges, and the quotas new or at
    /// another resourceVersion (the caller notes their view).
    pub fn reset_quotas<'a>(
        &mut self,
        cluster: &ClusterName,
        quotas: impl IntoIterator<Item = (QuotaKey, &'a ResourceQuota)>,
    ) -> Reset {
        let kcp = self.kcp;
        let mut raised = Vec::new();
        let mut moved = Vec::new();
        let mut respecified = Vec::new();
        let entries: Vec<_> = quotas
            .into_iter()
            .map(|(key, quota)| {
                let (policy, mut state) = QuotaState::from_quota(quota, kcp);
                let old = self.index.get(&key).map(|e| &e.payload);
                if old.is_none_or(|old| old.resource_version != state.resource_version) {
                    moved.push(key.clone());
                }
                if old.is_none_or(|old| {
                    old.spec.hard_keys != state.spec.hard_keys
                        || !same_quantities(old.spec_hard.as_ref(), state.spec_hard.as_ref())
                        || old.spec.scopes != state.spec.scopes
                }) {
                    respecified.push(key.clone());
                }
                if let Some(old) = old {
                    state.carry_from(old);
                }
                if let Some(old) = old
                    && !crate::mutation::active(crate::mutation::Mutation::NoChargeHold)
                {
                    let by = crate::lowering::raised(old.status_used.as_ref(), state.status_used.as_ref());
                    if !by.is_empty() {
                        raised.push((key.clone(), by));
                    }
                }
                (key, policy, state)
            })
            .collect();
        Reset {
            changes: self.index.reset(cluster, entries),
            raised,
            moved,
            respecified,
        }
    }

    /// Notes what someone else raised in the quota's `status.used`, seen at `now_ms` (the
    /// caller's monotonic milliseconds): for a while no key is written below what is counted
    /// plus these ([`crate::lowering`]).
    pub fn note_charge(&mut self, key: &QuotaKey, raised: Vec<(String, Quantity)>, now_ms: u64) {
        if let Some(state) = self.index.payload_mut(key) {
            let revision = state.resource_version.as_deref().and_then(|rv| rv.parse().ok());
            crate::lowering::note(&mut state.charges, raised, revision, now_ms);
        }
    }

    /// A status write of the quota succeeded with `used`: the keys in it are lazyquota's own
    /// computation from then on, maintained by admission since ([`QuotaState::fresh`]), even
    /// when the write's response comes after its own event. Not when a newer version came
    /// first: a key added back to `spec.hard` meanwhile was not in the write.
    pub fn written_keys(&mut self, key: &QuotaKey, used: Option<&BTreeMap<String, K8sQuantity>>) {
        if let Some(state) = self.index.payload_mut(key) {
            state.fresh.retain(|k| used.is_none_or(|u| !u.contains_key(k)));
        }
    }

    /// Notes that the quota was created, or its spec changed, at `now_ms`: see
    /// [`QuotaState::spec_ms`].
    pub fn note_spec(&mut self, key: &QuotaKey, now_ms: u64) {
        if let Some(state) = self.index.payload_mut(key) {
            state.spec_ms = now_ms;
        }
    }

    /// Notes that the quota's resourceVersion changed at `now_ms`: see
    /// [`QuotaState::view`].
    pub fn note_view(&mut self, key: &QuotaKey, now_ms: u64) {
        if let Some(state) = self.index.payload_mut(key) {
            let rv = state
                .resource_version
                .as_deref()
                .and_then(|rv| rv.parse().ok())
                .unwrap_or(u64::MAX);
            state.view = (rv, now_ms);
        }
    }

    /// Whether a quota event at `resource_version` is older than the view already held (a
    /// write's response or a fresh read got ahead of the watch): applying it would put an
    /// older status and precondition back. resourceVersions are compared as the integers
    /// etcd (and so kube-apiserver and a kcp shard) makes them; one that is not an integer is
    /// never older.
    pub fn is_older_than_known(&self, key: &QuotaKey, resource_version: Option<&str>) -> bool {
        let known = self
            .index
            .get(key)
            .and_then(|e| e.payload.resource_version.as_deref())
            .and_then(|rv| rv.parse::<u64>().ok());
        let seen = resource_version.and_then(|rv| rv.parse::<u64>().ok());
        matches!((seen, known), (Some(seen), Some(known)) if seen < known)
    }

    /// Records the status a write returned, so the next computation compares against it —
    /// only if the quota is still at `precondition`, the resourceVersion the write was
    /// conditioned on. Otherwise the quota watch has already brought this write's own event or
    /// a newer one (admission charging right after the write), and a response arriving after
    /// those must not put the older view and precondition back: every later write would then
    /// conflict on a version that has passed.
    ///
    /// A response that comes after a newer version of the quota (its event skipped by a
    /// relist, say) leaves the view as it is, and returns what that version raised above the
    /// written `used`: charges made after the write, which the view's own history, jumping
    /// from before the write to after it, may not show (note them with
    /// [`Engine::note_charge`]).
    pub fn record_written(
        &mut self,
        key: &QuotaKey,
        precondition: Option<&str>,
        written: &ResourceQuota,
    ) -> Vec<(String, Quantity)> {
        let Some(state) = self.index.payload_mut(key) else {
            return Vec::new();
        };
        if state.resource_version.as_deref() != precondition {
            let newer = match (
                state.resource_version.as_deref().map(str::parse::<u64>),
                written
                    .metadata
                    .resource_version
                    .as_deref()
                    .map(str::parse::<u64>),
            ) {
                (Some(Ok(view)), Some(Ok(ours))) => view > ours,
                // Unreadable versions: the view is not the write's own; what it raises above
                // the written value is taken as a charge (too high at worst).
                (view, ours) => view.is_some() && view != ours,
            };
            if !newer || crate::mutation::active(crate::mutation::Mutation::NoChargeHold) {
                return Vec::new();
            }
            let used = written.status.as_ref().and_then(|s| s.used.as_ref());
            return crate::lowering::raised(used, state.status_used.as_ref());
        }
        {
            let status = written.status.as_ref();
            state.status_hard = status.and_then(|s| s.hard.clone());
            state.status_used = status.and_then(|s| s.used.clone());
            // A key written (computed) is maintained again; one left out stays fresh.
            let used = state.status_used.as_ref();
            state.fresh.retain(|k| used.is_none_or(|u| !u.contains_key(k)));
            state
                .resource_version
                .clone_from(&written.metadata.resource_version);
        }
        Vec::new()
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

    /// An added or modified object; says whether the namespace's quotas must be recomputed:
    /// on updates, when upstream's update filter says so; on **adds**, always — unlike
    /// upstream. The admission plugin charges a create before the object exists, so a
    /// recalculation from a cache that has not seen the object yet writes a lower value under
    /// a current resourceVersion (no conflict), and upstream keeps that undercount until its
    /// next full resync. kcp works around the same drift by turning adds into updates.
    /// Recomputing on adds costs one computation, coalesced by the work queue, and writes
    /// nothing when the values already agree.
    pub fn apply(
        &mut self,
        kind: StoreKind,
        p: &PartitionKey,
        id: u64,
        object: Projected,
        now: Time,
    ) -> Applied {
        if !self.holds(kind, p) {
            return Applied::NotHeld;
        }
        let gates = self.gates;
        let replenish = match (kind, object) {
            // Metadata-only updates never change a count (upstream's filter is false for them).
            (StoreKind::Counts, _) => matches!(self.counts.apply(p, id, ()), Change::Added),
            (StoreKind::Pods, Projected::Pod(new)) => match self.pods.apply(p, id, new.clone()) {
                Change::Updated(old) => pod_update_triggers(&old, &new, now, gates),
                _ => true,
            },
            (StoreKind::Services, Projected::Service(new)) => match self.services.apply(p, id, new) {
                Change::Updated(old) => service_update_triggers(&old, &new),
                _ => true,
            },
            (StoreKind::Pvcs, Projected::Pvc(new)) => match self.pvcs.apply(p, id, new.clone()) {
                Change::Updated(old) => pvc_update_triggers(&old, &new),
                _ => true,
            },
            // Upstream's update filter never replenishes on a claim update (its spec is
            // immutable).
            (StoreKind::Claims, Projected::Claim(new)) => {
                !matches!(self.claims.apply(p, id, new), Change::Updated(_))
            }
            // Not a quota monitor upstream (its mapping is read at the next sync); here a
            // changed mapping recomputes the quotas that read it.
            (StoreKind::DeviceClasses, Projected::DeviceClass(new)) => {
                match self.device_classes.apply(p, id, new.clone()) {
                    Change::Updated(old) => old != new,
                    _ => true,
                }
            }
            (kind, object) => {
                return Applied::Malformed(format!("{object:?} does not belong in the {kind:?} store"));
            }
        };
        if replenish {
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

    // ---- computing -------------------------------------------------------------------------

    /// `syncResourceQuota` minus the write: the status to write and whether it is due.
    /// `None` if the quota is unknown.
    pub fn compute(&self, key: &QuotaKey, now: Time) -> Option<Computed> {
        let entry = self.index.get(key)?;
        let state = &entry.payload;
        let registry = self.registry(&key.cluster);
        let hard_keys: Vec<&str> = state.spec.hard_keys.iter().map(String::as_str).collect();
        // The DeviceClasses, when this quota reads them; `None` while they are not synced.
        let classes = if entry.demands().contains_key(&device_classes()) {
            self.device_class_map(&key.cluster)
        } else {
            Some(DeviceClassMap::new())
        };
        let plan = registry.plan_with_classes(&hard_keys, classes.as_ref());
        let mut scope_errors = Vec::new();
        let results: Vec<(Evaluator, Option<ResourceList>)> = plan
            .per_evaluator
            .iter()
            .map(|(evaluator, keys)| {
                let need = entry.demands().get(&evaluator.group_resource()).copied();
                let used = match (evaluator, need) {
                    (Evaluator::ResourceClaims, Some(Need::Typed)) => classes.as_ref().and_then(|classes| {
                        self.claims_usage(key, entry.demand_namespace(), keys, &plan.matched, classes, now)
                    }),
                    _ => self.evaluate(
                        key,
                        entry.demand_namespace(),
                        need,
                        evaluator,
                        keys,
                        &state.spec.scopes,
                        now,
                        &mut scope_errors,
                    ),
                };
                (evaluator.clone(), used)
            })
            .collect();
        let unsynced = results
            .iter()
            .filter(|(_, r)| r.is_none())
            .map(|(e, _)| e.group_resource())
            .collect::<Vec<_>>();
        let claimed: BTreeSet<&str> = plan
            .per_evaluator
            .iter()
            .flat_map(|(_, keys)| keys.iter().map(String::as_str))
            .collect();
        let uncomputed = plan
            .per_evaluator
            .iter()
            .zip(&results)
            .filter(|(_, (_, r))| r.is_none())
            .flat_map(|((_, keys), _)| keys.iter().cloned())
            // `count/<resource>` of a type not served (yet): no evaluator exists to claim it,
            // but one would as soon as discovery finds the type.
            .chain(
                hard_keys
                    .iter()
                    .filter(|k| k.starts_with("count/") && !claimed.contains(*k))
                    .map(|k| (*k).to_owned()),
            )
            .collect();
        let unclaimed = hard_keys
            .iter()
            .filter(|k| !k.starts_with("count/") && !claimed.contains(*k))
            .map(|k| (*k).to_owned())
            .collect();
        let used = plan.merge(&results);
        let decision = assemble_status(
            state.spec_hard.as_ref(),
            state.status_hard.as_ref(),
            state.status_used.as_ref(),
            &used,
        );
        Some(Computed {
            decision,
            unsynced,
            scope_errors,
            uncomputed,
            unclaimed,
            sources: KeySources(plan.per_evaluator),
        })
    }

    /// One evaluator's usage in `namespace` (the quota's demand namespace), or `None` if it cannot be computed now
    /// (its resource is not synced): its keys then keep their previous values.
    #[allow(clippy::too_many_arguments)] // all of it is one evaluation's context
    fn evaluate(
        &self,
        quota: &QuotaKey,
        namespace: &Arc<str>,
        need: Option<Need>,
        evaluator: &Evaluator,
        keys: &[String],
        scopes: &QuotaScopes,
        now: Time,
        scope_errors: &mut Vec<String>,
    ) -> Option<ResourceList> {
        let gates = self.gates;
        let p = PartitionKey {
            cluster: quota.cluster.clone(),
            resource: evaluator.group_resource(),
            // Its own namespace, or every namespace for kcp's cluster-scoped quotas.
            namespace: namespace.clone(),
        };
        let none: [&PodProjection; 0] = [];
        match (need, evaluator) {
            // Computed by `claims_usage`; a claim count alone is counted like any other.
            (Some(Need::Typed), Evaluator::ResourceClaims) => None,
            // Nothing demanded: the scopes exclude every object, so the value is 0.
            (None, Evaluator::ObjectCount(_)) => Some(calculate_object_count_usage(keys, scopes, 0)),
            (None, _) => Some(calculate_usage(keys, scopes, none, now, gates).used),
            (Some(Need::Count), _) => {
                // Counted from whichever store holds the partition (a typed watch serves counts too).
                let count = synced_len(&self.counts, &p)
                    .or_else(|| synced_len(&self.pods, &p))
                    .or_else(|| synced_len(&self.services, &p))
                    .or_else(|| synced_len(&self.pvcs, &p))
                    .or_else(|| synced_len(&self.claims, &p))?;
                Some(calculate_object_count_usage(keys, scopes, count as u64))
            }
            (Some(Need::Typed), Evaluator::Pods) => {
                typed_usage(&self.pods, &p, keys, scopes, now, gates, scope_errors)
            }
            (Some(Need::Typed), Evaluator::Services) => {
                typed_usage(&self.services, &p, keys, scopes, now, gates, scope_errors)
            }
            (Some(Need::Typed), Evaluator::PersistentVolumeClaims) => {
                typed_usage(&self.pvcs, &p, keys, scopes, now, gates, scope_errors)
            }
            (Some(Need::Typed), Evaluator::ObjectCount(_)) => Some(calculate_object_count_usage(
                keys,
                scopes,
                synced_len(&self.counts, &p)? as u64,
            )),
        }
    }
}

impl Engine {
    /// The DeviceClasses of `cluster` as the resourceclaims evaluator maps them, if their
    /// (cluster-wide) watch is synced.
    fn device_class_map(&self, cluster: &ClusterName) -> Option<DeviceClassMap> {
        let p = PartitionKey {
            cluster: cluster.clone(),
            resource: device_classes(),
            namespace: Arc::from(ALL_NAMESPACES),
        };
        let partition = self.device_classes.partition(&p).filter(|x| x.is_current())?;
        let mut map = DeviceClassMap::new();
        for class in partition.objects().values() {
            map.apply(&class.name, class.extended_resource_name.as_deref());
        }
        Some(map)
    }

    /// The resourceclaims evaluator's `CalculateUsageStats` in `namespace`: `keys` (the ones it
    /// matches) start at 0, and each claim's usage is added to every key of `matched` (the
    /// quota's keys any evaluator matches) — upstream sums an evaluator's whole usage and
    /// masks it with `matched` only after adding the evaluators up, so a claim also charges a
    /// `requests.deviceclass.resource.kubernetes.io/<class>` key that only the pods evaluator
    /// matched. `None` while the claims (or, for an extended-resource claim, the pods) of the
    /// namespace are not synced.
    fn claims_usage(
        &self,
        quota: &QuotaKey,
        namespace: &Arc<str>,
        keys: &[String],
        matched: &[String],
        classes: &DeviceClassMap,
        now: Time,
    ) -> Option<ResourceList> {
        let gates = self.gates;
        let p = PartitionKey {
            cluster: quota.cluster.clone(),
            resource: GroupResource::new("resource.k8s.io", "resourceclaims"),
            namespace: namespace.clone(),
        };
        let claims = self.claims.partition(&p).filter(|x| x.is_current())?;
        let pods_key = PartitionKey {
            resource: GroupResource::core("pods"),
            ..p.clone()
        };
        let pods = self.pods.partition(&pods_key);
        let all = &**namespace == ALL_NAMESPACES;
        let mut used: ResourceList = keys
            .iter()
            .map(|k| (k.clone(), Quantity::zero(lazyquota_quota::Format::DecimalSI)))
            .collect();
        for claim in claims.objects().values() {
            let pod_usage = match claim.owner() {
                Some(owner) if gates.dra_extended_resource => match pods {
                    // The pods are not watched here: no key of this quota is charged by both
                    // a pod and its claim, so nothing is offset.
                    None => None,
                    Some(pods) if !pods.is_current() => return None,
                    Some(pods) => {
                        let pod = pods.objects().get(owner.pod_id(all));
                        let identity = pod.and_then(PodProjection::claim_identity);
                        verified_owner(claim, identity, claims.objects().values(), gates)
                            .then(|| pod.map(|pod| pod.usage(now)))
                            .flatten()
                    }
                },
                _ => None,
            };
            for (name, q) in claim_usage(claim, gates, classes, pod_usage.as_ref()) {
                if matched.contains(&name) {
                    *used.entry(name).or_default() += q;
                }
            }
        }
        Some(used)
    }
}

/// A computed quota.
#[derive(Debug)]
pub struct Computed {
    /// What to write.
    pub decision: StatusDecision,
    /// Resources whose evaluators could not compute (not synced): their keys kept their
    /// previous values.
    pub unsynced: Vec<GroupResource>,
    /// Scope-matching errors (upstream returns the partial sum; so does lazyquota).
    pub scope_errors: Vec<String>,
    /// Keys an evaluator claims (KCM would compute them) that were not computed this time —
    /// their evaluator's resource is not synced or not served, or the evaluator is not
    /// implemented: they keep their previous value, which is therefore not lazyquota's own.
    /// Keys no evaluator claims are not here: nobody computes them, upstream included.
    pub uncomputed: Vec<String>,
    /// Hard keys no evaluator claims (a typo, an extended resource no pod requests in that
    /// form): their stored value is copied as upstream copies it, but it is nobody's
    /// computation, so shadow mode calls them unknown, never agreeing.
    pub unclaimed: Vec<String>,
    /// Which evaluators compute which keys: the watches each key counts from.
    pub sources: KeySources,
}

/// The plan's evaluators and the keys each computes, moved out of the plan rather than
/// copied: only the catch-up rule reads it ([`KeySources::of`]).
#[derive(Debug, Default)]
pub struct KeySources(Vec<(Evaluator, Vec<String>)>);

impl KeySources {
    /// The resources of the evaluators that compute a key counting the same objects as `key`
    /// (`pods` for `count/pods`): the watches whose objects it counts. `None` when no evaluator
    /// computes such a key.
    pub fn of(&self, key: &str) -> Option<Vec<GroupResource>> {
        let resources: Vec<GroupResource> = self
            .0
            .iter()
            .filter(|(_, keys)| keys.iter().any(|k| crate::lowering::same_objects(k, key)))
            .map(|(evaluator, _)| evaluator.group_resource())
            .collect();
        (!resources.is_empty()).then_some(resources)
    }
}

/// What a relist of the quota watch changed ([`Engine::reset_quotas`]).
#[derive(Debug, Default)]
pub struct Reset {
    /// Demand changes.
    pub changes: Vec<DemandChange>,
    /// Per quota, what someone else raised in `status.used` since the view held.
    pub raised: Vec<(QuotaKey, Vec<(String, Quantity)>)>,
    /// Quotas new or at another resourceVersion than the view held.
    pub moved: Vec<QuotaKey>,
    /// Quotas new or whose spec changed (`hard` keys or values, scopes).
    pub respecified: Vec<QuotaKey>,
}

fn synced_len<P: HeapSize>(store: &UsageStore<P>, p: &PartitionKey) -> Option<usize> {
    store
        .partition(p)
        .filter(|x| x.is_current())
        .map(|x| x.objects().len())
}

fn typed_usage<P: HeapSize + QuotaObject>(
    store: &UsageStore<P>,
    p: &PartitionKey,
    keys: &[String],
    scopes: &QuotaScopes,
    now: Time,
    gates: FeatureGates,
    scope_errors: &mut Vec<String>,
) -> Option<ResourceList> {
    let partition = store.partition(p).filter(|x| x.is_current())?;
    let stats = calculate_usage(keys, scopes, partition.objects().values(), now, gates);
    if let Some(error) = stats.scope_error {
        // Upstream's CalculateUsageStats stops at the first object whose scope match fails
        // and returns the partial sum with a nil error; the same partial sum is used here.
        scope_errors.push(error.to_string());
    }
    Some(stats.used)
}

/// Value equality of two quantities (`Cmp`), string equality for unparsable ones.
pub fn same_value(a: &K8sQuantity, b: &K8sQuantity) -> bool {
    match (
        lazyquota_quota::Quantity::parse_k8s(a),
        lazyquota_quota::Quantity::parse_k8s(b),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => a.0 == b.0,
    }
}

/// Value equality of two resource lists (absent is empty).
pub(crate) fn same_quantities(
    a: Option<&BTreeMap<String, K8sQuantity>>,
    b: Option<&BTreeMap<String, K8sQuantity>>,
) -> bool {
    let empty = BTreeMap::new();
    let (a, b) = (a.unwrap_or(&empty), b.unwrap_or(&empty));
    a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| same_value(v, w)))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuotaSpec};

    use super::*;
    use crate::keys::ObjectIds;

    fn object_id(name: &str) -> u64 {
        static IDS: std::sync::LazyLock<ObjectIds> = std::sync::LazyLock::new(ObjectIds::default);
        IDS.id(name)
    }

    fn quota(hard: &[(&str, &str)], used: Option<&[(&str, &str)]>) -> ResourceQuota {
        let list = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| ((*k).to_owned(), K8sQuantity((*v).to_owned())))
                .collect()
        };
        ResourceQuota {
            spec: Some(ResourceQuotaSpec {
                hard: Some(list(hard)),
                ..ResourceQuotaSpec::default()
            }),
            status: used.map(|u| k8s_openapi::api::core::v1::ResourceQuotaStatus {
                hard: Some(list(hard)),
                used: Some(list(u)),
            }),
            ..ResourceQuota::default()
        }
    }

    fn served(resource: &str) -> ServedResource {
        ServedResource::core_for_tests(resource)
    }

    #[test]
    fn a_type_that_is_no_longer_served_keeps_its_evaluator_as_upstream_never_removes_one() {
        let cluster = ClusterName::new("c");
        let mut engine = Engine::new(FeatureGates::default());
        let widgets = ServedResource {
            resource: GroupResource::new("example.io", "widgets"),
            ..served("widgets")
        };
        let claimed = |engine: &Engine| {
            !engine
                .registry(&cluster)
                .plan(&["count/widgets.example.io"])
                .matched
                .is_empty()
        };
        assert!(!claimed(&engine), "before discovery: only the static evaluators");
        engine.discovered(&cluster, vec![served("configmaps"), widgets.clone()], &[]);
        assert!(claimed(&engine), "discovered: an object-count evaluator");
        engine.discovered(&cluster, vec![served("configmaps")], &[]);
        assert!(claimed(&engine), "gone from discovery: the evaluator stays");
        engine.discovered(&cluster, vec![served("configmaps"), widgets], &[]);
        assert!(claimed(&engine), "served again");
        engine.forget_cluster(&cluster);
        assert!(!claimed(&engine), "a forgotten cluster starts over");
    }

    #[test]
    fn unsynced_keys_keep_their_previous_value_and_synced_ones_are_computed() {
        let _ = ConfigMap::default();
        let cluster = ClusterName::new("c");
        let mut engine = Engine::new(FeatureGates::default());
        engine.discovered(&cluster, vec![served("configmaps"), served("secrets")], &[]);
        let key = QuotaKey::new(&cluster, "ns", "q");
        let q = quota(
            &[
                ("configmaps", "10"),
                ("secrets", "10"),
                ("limits.example.com/gpu", "1"),
                ("count/widgets.example.io", "1"),
            ],
            Some(&[("secrets", "7")]),
        );
        let update = engine.apply_quota(key.clone(), &q);
        assert!(update.recompute);
        assert_eq!(
            update.changes.len(),
            3,
            "configmaps, secrets and widgets demanded"
        );
        let cm = PartitionKey {
            cluster: cluster.clone(),
            resource: GroupResource::core("configmaps"),
            namespace: "ns".into(),
        };
        engine.hold(StoreKind::Counts, cm.clone());
        engine.begin_relist(StoreKind::Counts, &cm);
        for name in ["a", "b", "c"] {
            assert_eq!(
                engine.relist_apply(StoreKind::Counts, &cm, object_id(name), Projected::Meta),
                None
            );
        }
        engine.finish_relist(StoreKind::Counts, &cm);
        let computed = engine
            .compute(&key, Time::from_unix_seconds(0))
            .expect("known quota");
        let used = computed.decision.used;
        assert_eq!(used.get("configmaps").map(|q| q.0.as_str()), Some("3"));
        assert_eq!(
            used.get("secrets").map(|q| q.0.as_str()),
            Some("7"),
            "secrets are not synced: previous value"
        );
        assert!(
            !used.contains_key("limits.example.com/gpu"),
            "unmatched keys stay absent"
        );
        assert_eq!(computed.unsynced, vec![GroupResource::core("secrets")]);
        assert_eq!(
            computed.uncomputed,
            vec!["secrets".to_owned(), "count/widgets.example.io".to_owned()],
            "a key of an unsynced evaluator and the count of a type not served are not \
             lazyquota's own values; a key no evaluator claims is nobody's"
        );
        assert_eq!(
            computed.unclaimed,
            vec!["limits.example.com/gpu".to_owned()],
            "nobody's value is no agreement either: shadow mode calls it unknown"
        );
        assert!(computed.decision.dirty);

        assert_eq!(
            engine.delete(StoreKind::Counts, &cm, object_id("a")),
            Applied::Replenish
        );
        assert_eq!(
            engine.delete(StoreKind::Counts, &cm, object_id("a")),
            Applied::NotHeld,
            "deleted once only"
        );
        let used = engine
            .compute(&key, Time::from_unix_seconds(0))
            .unwrap()
            .decision
            .used;
        assert_eq!(used.get("configmaps").map(|q| q.0.as_str()), Some("2"));
    }

    #[test]
    fn spec_and_scope_changes_recompute_a_foreign_status_change_is_rechecked_our_write_neither() {
        let cluster = ClusterName::new("c");
        let mut engine = Engine::new(FeatureGates::default());
        let key = QuotaKey::new(&cluster, "ns", "q");
        let apply = |engine: &mut Engine, q: &ResourceQuota| {
            let u = engine.apply_quota(key.clone(), q);
            (u.recompute, u.recheck)
        };
        assert_eq!(
            apply(&mut engine, &quota(&[("pods", "1")], None)),
            (true, false),
            "new"
        );
        let status = quota(&[("pods", "1")], Some(&[("pods", "0")]));
        assert_eq!(
            apply(&mut engine, &status),
            (false, true),
            "someone else's status: checked later"
        );
        assert_eq!(
            apply(&mut engine, &status),
            (false, false),
            "the same status again"
        );
        assert_eq!(
            apply(&mut engine, &quota(&[("pods", "1000m")], Some(&[("pods", "0")]))),
            (false, false),
            "same hard by value"
        );
        // Our own write is recorded before its watch event arrives.
        let written = quota(&[("pods", "1")], Some(&[("pods", "1")]));
        engine.record_written(&key, None, &written);
        assert_eq!(
            apply(&mut engine, &written),
            (false, false),
            "the event of our own write"
        );
        // Admission charged a create: the object may not be in the store yet (checking at once
        // would write a lower value), or a delete may have passed it (the charge is too high).
        let charged = quota(&[("pods", "1")], Some(&[("pods", "2")]));
        assert_eq!(apply(&mut engine, &charged), (false, true));
        assert_eq!(
            apply(&mut engine, &quota(&[("pods", "2")], Some(&[("pods", "2")]))),
            (true, false),
            "hard"
        );
        let mut scoped = quota(&[("pods", "2")], Some(&[("pods", "2")]));
        scoped.spec.as_mut().unwrap().scopes = Some(vec!["BestEffort".into()]);
        assert_eq!(apply(&mut engine, &scoped), (true, false), "scopes");
    }

    #[test]
    fn a_write_response_older_than_the_watch_does_not_replace_its_view() {
        let cluster = ClusterName::new("c");
        let mut engine = Engine::new(FeatureGates::default());
        let key = QuotaKey::new(&cluster, "ns", "q");
        let at = |rv: &str, used: &str| {
            let mut q = quota(&[("count/configmaps", "30")], Some(&[("count/configmaps", used)]));
            q.metadata.resource_version = Some(rv.to_owned());
            q
        };
        let rv = |engine: &Engine| {
            engine
                .index
                .get(&key)
                .and_then(|e| e.payload.resource_version.clone())
        };
        engine.apply_quota(key.clone(), &at("11062", "29"));
        // Our write leaves conditioned on 11062; admission charges twice before its response.
        engine.apply_quota(key.clone(), &at("11065", "30"));
        engine.apply_quota(key.clone(), &at("11067", "30"));
        engine.record_written(&key, Some("11062"), &at("11063", "29"));
        assert_eq!(rv(&engine).as_deref(), Some("11067"), "the newer view stands");
        assert!(engine.is_older_than_known(&key, Some("11063")));
        assert!(!engine.is_older_than_known(&key, Some("11068")));
        assert!(!engine.is_older_than_known(&key, Some("not-a-number")));
        // A response to a write whose precondition is still the view is recorded.
        engine.record_written(&key, Some("11067"), &at("11070", "3"));
        assert_eq!(rv(&engine).as_deref(), Some("11070"));
        let used = engine
            .index
            .get(&key)
            .and_then(|e| e.payload.status_used.clone())
            .unwrap();
        assert_eq!(used["count/configmaps"].0, "3");
    }

    fn fill<F: FnOnce(&mut Engine, &PartitionKey)>(
        engine: &mut Engine,
        kind: StoreKind,
        p: &PartitionKey,
        objects: F,
    ) {
        engine.hold(kind, p.clone());
        engine.begin_relist(kind, p);
        objects(engine, p);
        engine.finish_relist(kind, p);
    }

    fn claim(json: serde_json::Value) -> Projected {
        let claim: k8s_openapi::api::resource::v1::ResourceClaim = serde_json::from_value(json).unwrap();
        Projected::Claim(ClaimProjection::from_claim(
            &claim,
            &lazyquota_quota::Interner::new(),
            &object_id,
        ))
    }

    fn gpu_claim(name: &str, count: i64, owner: Option<(&str, &str)>) -> Projected {
        let mut metadata = serde_json::json!({"name": name, "namespace": "ns",
            "creationTimestamp": "2026-01-01T00:00:00Z"});
        if let Some((pod, uid)) = owner {
            metadata["annotations"] =
                serde_json::json!({"resource.kubernetes.io/extended-resource-claim": "true"});
            metadata["ownerReferences"] = serde_json::json!([{"apiVersion": "v1", "kind": "Pod",
                "name": pod, "uid": uid, "controller": true}]);
        }
        claim(
            serde_json::json!({"metadata": metadata, "spec": {"devices": {"requests": [
            {"name": "r", "exactly": {"deviceClassName": "gpu", "allocationMode": "ExactCount", "count": count}}]}}}),
        )
    }

    #[test]
    fn resource_claims_are_computed_with_device_classes_and_their_pods() {
        let cluster = ClusterName::new("c");
        let gates = FeatureGates::for_minor(36);
        let mut engine = Engine::new(gates);
        let key = QuotaKey::new(&cluster, "ns", "q");
        let q = quota(
            &[
                ("count/resourceclaims.resource.k8s.io", "10"),
                ("gpu.deviceclass.resource.k8s.io/devices", "10"),
                ("requests.example.com/gpu", "10"),
                ("requests.deviceclass.resource.kubernetes.io/gpu", "10"),
            ],
            Some(&[]),
        );
        let update = engine.apply_quota(key.clone(), &q);
        let demanded: BTreeSet<(String, String, Option<Need>)> = update
            .changes
            .iter()
            .map(|c| (c.resource.object_count_name(), c.namespace.to_string(), c.to))
            .collect();
        assert_eq!(
            demanded,
            [
                ("count/pods".to_owned(), "ns".to_owned(), Some(Need::Typed)),
                (
                    "count/resourceclaims.resource.k8s.io".into(),
                    "ns".into(),
                    Some(Need::Typed)
                ),
                (
                    "count/deviceclasses.resource.k8s.io".into(),
                    ALL_NAMESPACES.into(),
                    Some(Need::Typed)
                ),
            ]
            .into(),
            "claims and pods typed in the namespace, DeviceClasses cluster-wide"
        );
        let now = Time::from_unix_seconds(0);
        let part = |resource: GroupResource, ns: &str| PartitionKey {
            cluster: cluster.clone(),
            resource,
            namespace: ns.into(),
        };
        let claims = part(GroupResource::new("resource.k8s.io", "resourceclaims"), "ns");
        fill(&mut engine, StoreKind::Claims, &claims, |e, p| {
            e.relist_apply(StoreKind::Claims, p, object_id("a"), gpu_claim("a", 2, None));
            e.relist_apply(
                StoreKind::Claims,
                p,
                object_id("b"),
                gpu_claim("b", 3, Some(("p", "uid-p"))),
            );
        });
        let pods = part(GroupResource::core("pods"), "ns");
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "uid-p"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"example.com/gpu": "1"}, "limits": {"example.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}))
        .unwrap();
        let pod = PodProjection::from_pod(&pod, gates, &lazyquota_quota::Interner::new()).projection;
        fill(&mut engine, StoreKind::Pods, &pods, |e, p| {
            e.relist_apply(StoreKind::Pods, p, object_id("p"), Projected::Pod(pod));
        });
        let computed = engine.compute(&key, now).unwrap();
        assert!(
            computed
                .uncomputed
                .contains(&"requests.example.com/gpu".to_owned()),
            "DeviceClasses not synced yet: {:?}",
            computed.uncomputed
        );
        let classes = part(device_classes(), ALL_NAMESPACES);
        fill(&mut engine, StoreKind::DeviceClasses, &classes, |e, p| {
            let gpu = DeviceClassEntry {
                name: "gpu".into(),
                extended_resource_name: Some("example.com/gpu".into()),
            };
            e.relist_apply(
                StoreKind::DeviceClasses,
                p,
                object_id("/gpu"),
                Projected::DeviceClass(gpu),
            );
        });
        let used = engine.compute(&key, now).unwrap().decision.used;
        let get = |k: &str| used.get(k).map(|q| q.0.clone());
        assert_eq!(get("count/resourceclaims.resource.k8s.io").as_deref(), Some("2"));
        assert_eq!(
            get("gpu.deviceclass.resource.k8s.io/devices").as_deref(),
            Some("5")
        );
        // The pod charges 1 example.com/gpu itself; its verified claim (3 devices) adds 3 - 1.
        assert_eq!(
            get("requests.example.com/gpu").as_deref(),
            Some("5"),
            "1 (pod) + 2 (a) + 2 (b beyond its pod)"
        );
        assert_eq!(
            get("requests.deviceclass.resource.kubernetes.io/gpu").as_deref(),
            Some("5"),
            "the pod does not charge the implicit name: both claims in full"
        );

        // A DeviceClass change recomputes the quotas that read it.
        assert_eq!(
            engine
                .index
                .dirtied_by(&cluster, ALL_NAMESPACES, &device_classes()),
            vec![key.clone()]
        );
        // Without the mapping, requests.example.com/gpu is the pod's alone.
        assert_eq!(
            engine.delete(StoreKind::DeviceClasses, &classes, object_id("/gpu")),
            Applied::Replenish
        );
        let used = engine.compute(&key, now).unwrap().decision.used;
        assert_eq!(
            used.get("requests.example.com/gpu").map(|q| q.0.as_str()),
            Some("1")
        );
        assert_eq!(
            used.get("requests.deviceclass.resource.kubernetes.io/gpu")
                .map(|q| q.0.as_str()),
            Some("5"),
            "still charged by the claims evaluator's usage, which only the pods evaluator matched"
        );
    }
}
