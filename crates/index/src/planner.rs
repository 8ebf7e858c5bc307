//! The watch planner: which watches one (cluster, resource type) should have now, and why.
//!
//! A pure function of the run's settings ([`PlanSettings`]: the mode and the namespace watch
//! threshold, the flags `lazyquota run` and `lazyquota explain` share), the Resolver (is the
//! type served, is it namespaced) and the PolicyIndex's demand (which namespaces need it, for
//! counts or typed). The controller starts and stops watches to match [`desired_watches`];
//! `explain` prints [`why`], which is built from the same function, so the two cannot
//! disagree.
//!
//! The running watches' bookkeeping (fills, relists, failures) is [`crate::watches`], which
//! asks this module for the plan; kcp's shared wildcard watches are [`crate::sharing`] (which
//! types) and [`crate::fanout`] (which events go to whom).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    sync::Arc,
};

use lazyquota_quota::FeatureGates;

use crate::{
    demand::{device_classes, is_cluster_wide},
    engine::Engine,
    keys::{ALL_NAMESPACES, ClusterName, GroupResource, Need},
    resolver::ServedResource,
};

/// What one watch is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchKey {
    /// The logical cluster.
    pub cluster: ClusterName,
    /// The resource.
    pub resource: GroupResource,
    /// One namespace, or `None` for a cluster-wide watch filtered at ingest.
    pub namespace: Option<String>,
    /// Metadata only, or the typed projection.
    pub need: Need,
}

/// A resource as metrics label it: `pods`, `widgets.example.io`.
pub fn resource_label(resource: &GroupResource) -> String {
    resource
        .object_count_name()
        .trim_start_matches("count/")
        .to_owned()
}

impl WatchKey {
    /// The resource as metrics label it: `pods`, `widgets.example.io`.
    pub fn resource_label(&self) -> String {
        resource_label(&self.resource)
    }
}

impl fmt::Display for WatchKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let resource = self.resource_label();
        match &self.namespace {
            Some(ns) => write!(f, "{}|{resource} in {ns} ({:?})", self.cluster, self.need),
            None => write!(f, "{}|{resource} cluster-wide ({:?})", self.cluster, self.need),
        }
    }
}

/// Which resource types are watched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Only the types some ResourceQuota constrains (the point of lazyquota).
    #[default]
    Lazy,
    /// Every quotable type discovery returns, as upstream KCM does (for comparison).
    Eager,
}

/// The settings a plan depends on: the flags `run` and `explain` share, and the release's
/// feature gates (which types eager mode watches typed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanSettings {
    /// Lazy or eager.
    pub mode: Mode,
    /// Above this many namespaces demanding a type, one cluster-wide watch instead of one per
    /// namespace.
    pub namespace_watch_threshold: usize,
    /// The cluster's feature gates.
    pub gates: FeatureGates,
}

/// The watches one (cluster, resource) should have, each with the namespaces it fills.
pub type Plan = BTreeMap<WatchKey, BTreeSet<Arc<str>>>;

/// Why a watch is namespaced or cluster-wide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScopeReason {
    /// Eager mode watches every quotable type cluster-wide, as KCM's informers do.
    Eager,
    /// The type is cluster-scoped (kcp only serves such quotable types).
    ClusterScopedResource,
    /// A quota demands every namespace (kcp's cluster-scoped quotas; DeviceClasses, read as
    /// context by every claim).
    AllNamespaces,
    /// More namespaces demand it than the threshold.
    AboveThreshold {
        /// Namespaces demanding it.
        namespaces: usize,
        /// `--namespace-watch-threshold`.
        threshold: usize,
    },
    /// At most the threshold: one watch per namespace.
    WithinThreshold {
        /// Namespaces demanding it.
        namespaces: usize,
        /// `--namespace-watch-threshold`.
        threshold: usize,
    },
}

impl fmt::Display for ScopeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Eager => f.write_str("eager mode watches every quotable type cluster-wide"),
            Self::ClusterScopedResource => f.write_str("the resource is cluster-scoped"),
            Self::AllNamespaces => f.write_str("a quota demands every namespace"),
            Self::AboveThreshold {
                namespaces,
                threshold,
            } => write!(
                f,
                "{namespaces} namespaces demand it, above --namespace-watch-threshold {threshold}"
            ),
            Self::WithinThreshold {
                namespaces,
                threshold,
            } => write!(
                f,
                "{namespaces} namespace(s) demand it, within --namespace-watch-threshold {threshold}"
            ),
        }
    }
}

/// The answer to "why is this resource type watched (or not) in this cluster?".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Why {
    /// How the cluster serves it; `None`: pending, nothing is watched.
    pub served: Option<ServedResource>,
    /// Namespaces demanding it and how much of each object (lazy mode's input).
    pub demand: BTreeMap<Arc<str>, Need>,
    /// The watches planned (empty while pending or undemanded in lazy mode).
    pub watches: Vec<WatchKey>,
    /// Why those watches have their scope (absent when nothing is planned).
    pub scope: Option<ScopeReason>,
}

impl Why {
    /// `metadata` (counts only) or `typed`, from the planned watches (the demand when none).
    pub fn watch_kind(&self) -> &'static str {
        let need = self
            .watches
            .iter()
            .map(|w| w.need)
            .max()
            .or_else(|| self.demand.values().copied().max())
            .unwrap_or(Need::Count);
        match need {
            Need::Count => "metadata",
            Need::Typed => "typed",
        }
    }

    /// `namespaced` or `cluster-wide`, from the planned watches (`-` when none is).
    pub fn scope_label(&self) -> &'static str {
        match self.scope {
            None => "-",
            Some(ScopeReason::WithinThreshold { .. }) => "namespaced",
            Some(_) => "cluster-wide",
        }
    }
}

/// Whether eager mode watches `resource` typed: the types upstream reads with typed informers
/// (its evaluators' objects); every other type is watched for metadata.
fn eager_typed(resource: &GroupResource, gates: FeatureGates) -> bool {
    (resource.group.is_empty()
        && ["pods", "services", "persistentvolumeclaims"].contains(&resource.resource.as_str()))
        || (resource.is("resource.k8s.io", "resourceclaims") && gates.dynamic_resource_allocation)
        || (resource.is("resource.k8s.io", "deviceclasses") && gates.dra_extended_resource)
}

/// The plan and its scope reason: [`desired_watches`] and [`why`] share this.
fn plan(
    engine: &Engine,
    settings: &PlanSettings,
    cluster: &ClusterName,
    resource: &GroupResource,
) -> (Plan, Option<ScopeReason>) {
    let mut desired = Plan::new();
    let Some(served) = engine.resolver.get(cluster, resource) else {
        return (desired, None); // pending: not served (yet)
    };
    let key = |namespace: Option<String>, need| WatchKey {
        cluster: cluster.clone(),
        resource: resource.clone(),
        namespace,
        need,
    };
    if settings.mode == Mode::Eager {
        // A cluster-wide context resource fills the one all-namespaces partition, as in
        // lazy mode; every other eager watch holds each namespace it sees.
        let namespaces = if is_cluster_wide(resource) {
            BTreeSet::from([Arc::from(ALL_NAMESPACES)])
        } else {
            BTreeSet::new()
        };
        let need = if eager_typed(resource, settings.gates) {
            Need::Typed
        } else {
            Need::Count
        };
        desired.insert(key(None, need), namespaces);
        return (desired, Some(ScopeReason::Eager));
    }
    let demand = engine.index.demand_of(cluster, resource);
    let Some(need) = demand.values().copied().max() else {
        return (desired, None);
    };
    let threshold = settings.namespace_watch_threshold;
    let reason = if !served.namespaced {
        ScopeReason::ClusterScopedResource
    } else if demand.contains_key(ALL_NAMESPACES) {
        ScopeReason::AllNamespaces
    } else if demand.len() > threshold {
        ScopeReason::AboveThreshold {
            namespaces: demand.len(),
            threshold,
        }
    } else {
        ScopeReason::WithinThreshold {
            namespaces: demand.len(),
            threshold,
        }
    };
    if matches!(reason, ScopeReason::WithinThreshold { .. }) {
        for ns in demand.keys() {
            desired.insert(key(Some(ns.to_string()), need), BTreeSet::from([ns.clone()]));
        }
    } else {
        desired.insert(key(None, need), demand.keys().cloned().collect());
    }
    (desired, Some(reason))
}

/// The watches (cluster, resource) should have now, with the namespaces each fills.
///
/// Lazy mode: nothing unless the type is served and demanded; one watch per demanding
/// namespace up to the threshold, else one cluster-wide watch (also for a cluster-scoped type
/// or a demand of every namespace); the watch asks for the most any namespace needs (typed if
/// any quota needs the projection). Eager mode: one cluster-wide watch of every served type.
pub fn desired_watches(
    engine: &Engine,
    settings: &PlanSettings,
    cluster: &ClusterName,
    resource: &GroupResource,
) -> Plan {
    plan(engine, settings, cluster, resource).0
}

/// The resource types eager mode watches in `cluster` whether or not a quota demands them:
/// every quotable type discovery returned, and DeviceClasses where upstream's resourceclaims
/// evaluator keeps an informer of them (`DRAExtendedResource`). Empty in lazy mode.
pub fn eager_resources(
    engine: &Engine,
    settings: &PlanSettings,
    cluster: &ClusterName,
) -> BTreeSet<GroupResource> {
    if settings.mode != Mode::Eager {
        return BTreeSet::new();
    }
    let mut resources: BTreeSet<GroupResource> = engine
        .resolver
        .quotable(cluster)
        .map(|s| s.resource.clone())
        .collect();
    let classes = device_classes();
    if settings.gates.dra_extended_resource && engine.resolver.get(cluster, &classes).is_some() {
        resources.insert(classes);
    }
    resources
}

/// Every resource type a plan may watch in `cluster`: those demanded by a quota, and in eager
/// mode [`eager_resources`].
pub fn considered(
    engine: &Engine,
    settings: &PlanSettings,
    cluster: &ClusterName,
) -> BTreeSet<GroupResource> {
    let mut resources = eager_resources(engine, settings, cluster);
    resources.extend(engine.index.demanded_in(cluster).cloned());
    resources
}

/// Every reason behind [`desired_watches`] for (cluster, resource).
pub fn why(engine: &Engine, settings: &PlanSettings, cluster: &ClusterName, resource: &GroupResource) -> Why {
    let (planned, scope) = plan(engine, settings, cluster, resource);
    Why {
        served: engine.resolver.get(cluster, resource).cloned(),
        demand: engine.index.demand_of(cluster, resource),
        watches: planned.into_keys().collect(),
        scope,
    }
}

#[cfg(test)]
mod tests;
