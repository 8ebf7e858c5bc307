//! The pods evaluator (`pkg/quota/v1/evaluator/core/pods.go`) over a compact projection, with
//! the pod resource maths of `k8s.io/component-helpers/resource/helpers.go`.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodAffinityTerm, ResourceRequirements, WeightedPodAffinityTerm};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use crate::gates::FeatureGates;
use crate::intern::Interner;
use crate::names::{
    COUNT_PODS, CPU, EPHEMERAL_STORAGE, LIMITS_CPU, LIMITS_EPHEMERAL_STORAGE, LIMITS_MEMORY, MEMORY, PODS,
    REQUESTS_CPU, REQUESTS_EPHEMERAL_STORAGE, REQUESTS_MEMORY, REQUESTS_PREFIX,
    is_dra_extended_resource_name, is_hugepages_resource,
};
use crate::quantity::{CompactQuantity, Quantity, QuantityError};
use crate::scope::{ScopeError, ScopeName, ScopeOperator, ScopeRequirement, selector_matches};
use crate::time::Time;
use crate::usage::{QuotaObject, ScopeClassed, UsageKey};

mod resources;

use resources::{is_best_effort, parse_pod};

/// A quantity in a typed object that does not parse, named by its field path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {source}")]
pub struct ExtractError {
    /// Field path of the offending value, e.g. `spec.containers[app].resources.requests[cpu]`.
    pub field: String,
    /// Why its quantity was rejected (names the value).
    #[source]
    pub source: QuantityError,
}

/// A projection, and the quantities of the object it could not hold. Each of those is
/// [`Quantity::unknown`] in the projection: the object still counts (dropping it would let a
/// tenant exceed `pods` with an absurd request), and the sums it enters are unknown.
#[derive(Clone, Debug)]
pub struct Extracted<T> {
    /// The projection.
    pub projection: T,
    /// The quantities that did not parse or are beyond the supported range, by field.
    pub problems: Vec<ExtractError>,
}

impl<T> Extracted<T> {
    /// The projection if every quantity was held, else the first problem.
    pub fn strict(self) -> Result<T, ExtractError> {
        match self.problems.into_iter().next() {
            None => Ok(self.projection),
            Some(problem) => Err(problem),
        }
    }
}

/// A resource list during extraction: resource name to quantity.
type List = BTreeMap<String, Quantity>;

/// Parses one quantity of an object; one that does not parse is unknown and recorded.
pub(crate) fn parse_lossy(
    q: &K8sQuantity,
    field: &dyn Fn() -> String,
    problems: &mut Vec<ExtractError>,
) -> Quantity {
    Quantity::parse_k8s(q).unwrap_or_else(|source| {
        problems.push(ExtractError {
            field: field(),
            source,
        });
        Quantity::unknown()
    })
}

fn cross_namespace_term(term: &PodAffinityTerm) -> bool {
    term.namespaces.as_ref().is_some_and(|n| !n.is_empty()) || term.namespace_selector.is_some()
}

fn cross_namespace_terms(
    required: Option<&[PodAffinityTerm]>,
    preferred: Option<&[WeightedPodAffinityTerm]>,
) -> bool {
    required.unwrap_or_default().iter().any(cross_namespace_term)
        || preferred
            .unwrap_or_default()
            .iter()
            .any(|t| cross_namespace_term(&t.pod_affinity_term))
}

/// `usesCrossNamespacePodAffinity`: any affinity or anti-affinity term, required or
/// preferred, with namespaces or a non-nil (even empty) namespace selector.
fn uses_cross_namespace_pod_affinity(pod: &Pod) -> bool {
    let Some(affinity) = pod.spec.as_ref().and_then(|s| s.affinity.as_ref()) else {
        return false;
    };
    affinity.pod_affinity.as_ref().is_some_and(|a| {
        cross_namespace_terms(
            a.required_during_scheduling_ignored_during_execution.as_deref(),
            a.preferred_during_scheduling_ignored_during_execution.as_deref(),
        )
    }) || affinity.pod_anti_affinity.as_ref().is_some_and(|a| {
        cross_namespace_terms(
            a.required_during_scheduling_ignored_during_execution.as_deref(),
            a.preferred_during_scheduling_ignored_during_execution.as_deref(),
        )
    })
}

/// A value-based fingerprint of a container status' `resources`, for the update filter's
/// `Semantic.DeepEqual` comparison: 0 for nil; quantities compare by value and empty maps
/// equal nil maps, as in `equality.Semantic`.
fn resources_fingerprint(resources: Option<&ResourceRequirements>) -> u64 {
    let Some(resources) = resources else { return 0 };
    let mut hasher = DefaultHasher::new();
    for (tag, list) in [(0u8, &resources.requests), (1u8, &resources.limits)] {
        tag.hash(&mut hasher);
        for (name, q) in list.iter().flatten() {
            name.hash(&mut hasher);
            match Quantity::parse_k8s(q) {
                Ok(q) => q.hash(&mut hasher),
                Err(_) => q.0.hash(&mut hasher),
            }
        }
    }
    2u8.hash(&mut hasher);
    for claim in resources.claims.iter().flatten() {
        claim.name.hash(&mut hasher);
        claim.request.as_deref().unwrap_or_default().hash(&mut hasher);
    }
    // Reserve 0 for nil.
    hasher.finish().max(1)
}

fn status_key(kind: u8, name: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    kind.hash(&mut hasher);
    name.hash(&mut hasher);
    hasher.finish()
}

/// Requests of hugepages and extended resources (interned name and quantity), and, for a pod
/// that has them, what a DRA extended-resource claim is checked against: one allocation, only
/// for pods that request such resources.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Extended {
    requests: Box<[(Arc<str>, CompactQuantity)]>,
    /// `metadata.uid`.
    uid: Box<str>,
    /// `status.extendedResourceClaimStatus.resourceClaimName`, when set.
    claim: Option<Box<str>>,
}

type ExtendedRequests = Option<Box<Extended>>;

/// What a ResourceClaim's pod owner is checked against (upstream's `getVerifiedPodUsage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodClaimIdentity<'a> {
    /// The pod's `metadata.uid`.
    pub uid: &'a str,
    /// `status.extendedResourceClaimStatus.resourceClaimName`, when the status is set.
    pub extended_resource_claim: Option<&'a str>,
}

/// Indexes of the three compute resources in [`PodProjection`]'s fixed slots.
const COMPUTE: [(&str, &str, &str); 3] = [
    (CPU, REQUESTS_CPU, LIMITS_CPU),
    (MEMORY, REQUESTS_MEMORY, LIMITS_MEMORY),
    (
        EPHEMERAL_STORAGE,
        REQUESTS_EPHEMERAL_STORAGE,
        LIMITS_EPHEMERAL_STORAGE,
    ),
];

const FLAG_TERMINAL: u8 = 1;
const FLAG_TERMINATING: u8 = 1 << 1;
const FLAG_BEST_EFFORT: u8 = 1 << 2;
const FLAG_CROSS_NAMESPACE_AFFINITY: u8 = 1 << 3;

/// What quota needs of a pod, extracted once.
///
/// The effective requests and limits (`PodRequests`/`PodLimits` with sidecars, init maximum,
/// pod-level resources, overhead and in-place resize) are time-independent and precomputed.
/// What depends on `now` (terminal phase, deletion grace) is kept raw.
///
/// Size: 168 bytes inline on 64-bit targets; no heap for a typical pod except the status
/// fingerprints (16 bytes per container status, only under `InPlacePodVerticalScaling`). A pod
/// requesting hugepages or extended resources keeps them, its uid and its extended-resource
/// claim name in one more allocation.
/// Interned names are shared and not counted (see [`PodProjection::heap_bytes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodProjection {
    /// Effective requests of cpu, memory and ephemeral-storage.
    requests: [Option<CompactQuantity>; 3],
    /// Effective limits of cpu, memory and ephemeral-storage.
    limits: [Option<CompactQuantity>; 3],
    /// Requests of hugepages and (DRA) extended resources, by pod resource name.
    extended_requests: ExtendedRequests,
    priority_class: Option<Arc<str>>,
    /// `(hash(list, name), fingerprint(resources))` per container status, for the update
    /// filter; `None` unless extracted under `InPlacePodVerticalScaling`.
    status_resources: Option<Box<[(u64, u64)]>>,
    /// `deletionTimestamp + deletionGracePeriodSeconds` when both are set.
    deletion_deadline: Option<Time>,
    flags: u8,
}

impl PodProjection {
    /// Extracts the projection of a typed pod under `gates`.
    pub fn from_pod(pod: &Pod, gates: FeatureGates, interner: &Interner) -> Extracted<Self> {
        let mut problems = Vec::new();
        let parsed = parse_pod(pod, &mut problems);
        let requests = parsed.requests(gates);
        let limits = parsed.limits(gates);
        let slot = |list: &List, name: &str| list.get(name).map(|q| CompactQuantity::from(q.clone()));
        let mut extended = Vec::new();
        for (name, q) in &requests {
            if is_hugepages_resource(name) || is_dra_extended_resource_name(name, gates.minor) {
                extended.push((interner.intern(name), CompactQuantity::from(q.clone())));
            }
        }
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        let mut flags = 0;
        if matches!(
            status.and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        ) {
            flags |= FLAG_TERMINAL;
        }
        if spec
            .and_then(|s| s.active_deadline_seconds)
            .is_some_and(|d| d >= 0)
        {
            flags |= FLAG_TERMINATING;
        }
        if is_best_effort(pod, &parsed, gates) {
            flags |= FLAG_BEST_EFFORT;
        }
        if uses_cross_namespace_pod_affinity(pod) {
            flags |= FLAG_CROSS_NAMESPACE_AFFINITY;
        }
        let status_resources = gates.in_place_pod_vertical_scaling.then(|| {
            let mut entries = Vec::new();
            for (kind, list) in [
                (0u8, status.and_then(|s| s.container_statuses.as_deref())),
                (1u8, status.and_then(|s| s.init_container_statuses.as_deref())),
            ] {
                for cs in list.unwrap_or_default() {
                    entries.push((
                        status_key(kind, &cs.name),
                        resources_fingerprint(cs.resources.as_ref()),
                    ));
                }
            }
            entries.into_boxed_slice()
        });
        let metadata = &pod.metadata;
        let deletion_deadline = match (
            &metadata.deletion_timestamp,
            metadata.deletion_grace_period_seconds,
        ) {
            (Some(ts), Some(grace)) => Some(Time::from_k8s(ts).saturating_add_seconds(grace)),
            _ => None,
        };
        let projection = Self {
            requests: COMPUTE.map(|(name, _, _)| slot(&requests, name)),
            limits: COMPUTE.map(|(name, _, _)| slot(&limits, name)),
            extended_requests: (!extended.is_empty()).then(|| {
                Box::new(Extended {
                    requests: extended.into_boxed_slice(),
                    uid: metadata.uid.as_deref().unwrap_or_default().into(),
                    claim: status
                        .and_then(|s| s.extended_resource_claim_status.as_ref())
                        .map(|c| c.resource_claim_name.as_str().into()),
                })
            }),
            priority_class: spec
                .and_then(|s| s.priority_class_name.as_deref())
                .filter(|p| !p.is_empty())
                .map(|p| interner.intern(p)),
            status_resources,
            deletion_deadline,
            flags,
        };
        Extracted { projection, problems }
    }

    /// `QuotaV1Pod`: charged unless the phase is Succeeded or Failed, or `now` is after
    /// `deletionTimestamp + deletionGracePeriodSeconds`.
    pub fn is_charged(&self, now: Time) -> bool {
        if self.flags & FLAG_TERMINAL != 0 {
            return false;
        }
        self.deletion_deadline.is_none_or(|deadline| now <= deadline)
    }

    /// `IsTerminating`: `activeDeadlineSeconds >= 0`.
    pub fn is_terminating(&self) -> bool {
        self.flags & FLAG_TERMINATING != 0
    }

    /// Whether the QoS class is BestEffort.
    pub fn is_best_effort(&self) -> bool {
        self.flags & FLAG_BEST_EFFORT != 0
    }

    /// Whether the pod uses cross-namespace pod affinity.
    pub fn uses_cross_namespace_pod_affinity(&self) -> bool {
        self.flags & FLAG_CROSS_NAMESPACE_AFFINITY != 0
    }

    /// The priority class name, if set.
    pub fn priority_class(&self) -> Option<&str> {
        self.priority_class.as_deref()
    }

    /// The effective request of a resource (cpu, memory, ephemeral-storage, hugepages-*,
    /// or extended), as `PodRequests` computed it.
    pub fn request(&self, resource: &str) -> Option<Quantity> {
        if let Some(i) = COMPUTE.iter().position(|(name, _, _)| *name == resource) {
            return self.requests[i].as_ref().map(CompactQuantity::get);
        }
        self.extended_requests()
            .iter()
            .find(|(name, _)| &**name == resource)
            .map(|(_, q)| q.get())
    }

    /// The effective limit of cpu, memory or ephemeral-storage (the only limits quota uses).
    pub fn limit(&self, resource: &str) -> Option<Quantity> {
        COMPUTE
            .iter()
            .position(|(name, _, _)| *name == resource)
            .and_then(|i| self.limits[i].as_ref().map(CompactQuantity::get))
    }

    /// Whether a container status' `resources` changed between `old` and `self`, as the
    /// newest `DefaultUpdateFilter` checks it: a status new in `self` counts when its
    /// resources are set; statuses that disappeared do not count.
    pub fn status_resources_changed_since(&self, old: &Self) -> bool {
        let old_entries = old.status_resources.as_deref().unwrap_or_default();
        self.status_resources.iter().flatten().any(|(key, fingerprint)| {
            match old_entries.iter().rev().find(|(k, _)| k == key) {
                None => *fingerprint != 0,
                Some((_, old_fingerprint)) => old_fingerprint != fingerprint,
            }
        })
    }

    fn extended_requests(&self) -> &[(Arc<str>, CompactQuantity)] {
        self.extended_requests.as_deref().map_or(&[], |e| &e.requests)
    }

    /// The pod's identity for a DRA extended-resource claim it may own; `None` for a pod
    /// without extended-resource requests (its usage of them is 0, so no claim is offset).
    pub fn claim_identity(&self) -> Option<PodClaimIdentity<'_>> {
        self.extended_requests.as_deref().map(|e| PodClaimIdentity {
            uid: &e.uid,
            extended_resource_claim: e.claim.as_deref(),
        })
    }

    /// Heap bytes owned by this projection. Interned strings are shared through the
    /// [`Interner`] and not counted.
    pub fn heap_bytes(&self) -> usize {
        let compact = self
            .requests
            .iter()
            .chain(&self.limits)
            .flatten()
            .map(CompactQuantity::heap_bytes)
            .sum::<usize>();
        let extended = self.extended_requests.as_deref().map_or(0, |e| {
            size_of::<Extended>()
                + std::mem::size_of_val(&*e.requests)
                + e.requests.iter().map(|(_, q)| q.heap_bytes()).sum::<usize>()
                + e.uid.len()
                + e.claim.as_deref().map_or(0, str::len)
        });
        let statuses = self.status_resources.as_deref().map_or(0, std::mem::size_of_val);
        compact + extended + statuses
    }
}

impl QuotaObject for PodProjection {
    /// `podMatchesScopeFunc`.
    fn matches_scope(
        &self,
        requirement: &ScopeRequirement,
        _gates: FeatureGates,
    ) -> Result<bool, ScopeError> {
        pod_matches_scope(self.flags & SCOPE_FLAGS, self.priority_class(), requirement)
    }

    /// `PodUsageFunc` + `podComputeUsageHelper`.
    fn for_each_usage(&self, now: Time, emit: &mut dyn FnMut(UsageKey<'_>, Quantity)) {
        // count/pods counts every pod in storage, terminal ones included.
        emit(UsageKey::name(COUNT_PODS), Quantity::from_count(1));
        if !self.is_charged(now) {
            return;
        }
        emit(UsageKey::name(PODS), Quantity::from_count(1));
        for (i, (name, requests_name, limits_name)) in COMPUTE.iter().enumerate() {
            if let Some(q) = &self.requests[i] {
                emit(UsageKey::name(name), q.get());
                emit(UsageKey::name(requests_name), q.get());
            }
            if let Some(q) = &self.limits[i] {
                emit(UsageKey::name(limits_name), q.get());
            }
        }
        for (name, q) in self.extended_requests() {
            if is_hugepages_resource(name) {
                emit(UsageKey::name(name), q.get());
            }
            // Extended resources are quota'd as requests.<name> only.
            emit(UsageKey::new(REQUESTS_PREFIX, name, ""), q.get());
        }
    }
}

/// The flags scope matching reads (not the terminal phase: it decides usage, not scope).
const SCOPE_FLAGS: u8 = FLAG_TERMINATING | FLAG_BEST_EFFORT | FLAG_CROSS_NAMESPACE_AFFINITY;

/// What a pod's scope matching reads: whether it is terminating, BestEffort, uses
/// cross-namespace affinity, and its priority class (interned, so a clone is a count).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodScopeClass {
    flags: u8,
    priority_class: Option<Arc<str>>,
}

impl ScopeClassed for PodProjection {
    type Class = PodScopeClass;

    fn scope_class(&self) -> PodScopeClass {
        PodScopeClass {
            flags: self.flags & SCOPE_FLAGS,
            priority_class: self.priority_class.clone(),
        }
    }

    fn is_of_class(&self, class: &PodScopeClass) -> bool {
        self.flags & SCOPE_FLAGS == class.flags && self.priority_class == class.priority_class
    }

    fn class_matches_scope(
        class: &PodScopeClass,
        requirement: &ScopeRequirement,
        _gates: FeatureGates,
    ) -> Result<bool, ScopeError> {
        pod_matches_scope(class.flags, class.priority_class.as_deref(), requirement)
    }

    /// A pod in its deletion grace period counts until the period ends.
    fn usage_varies_with_time(&self) -> bool {
        self.flags & FLAG_TERMINAL == 0 && self.deletion_deadline.is_some()
    }
}

/// `podMatchesScopeFunc` over what it reads: `flags` (of [`SCOPE_FLAGS`]) and the priority
/// class.
fn pod_matches_scope(
    flags: u8,
    priority_class: Option<&str>,
    requirement: &ScopeRequirement,
) -> Result<bool, ScopeError> {
    let terminating = flags & FLAG_TERMINATING != 0;
    let best_effort = flags & FLAG_BEST_EFFORT != 0;
    Ok(match requirement.scope {
        ScopeName::Terminating => terminating,
        ScopeName::NotTerminating => !terminating,
        ScopeName::BestEffort => best_effort,
        ScopeName::NotBestEffort => !best_effort,
        ScopeName::PriorityClass => {
            if requirement.operator == ScopeOperator::Exists {
                priority_class.is_some()
            } else {
                // Matched against {PriorityClass: name}, or an empty set when unset.
                selector_matches(requirement, priority_class)?
            }
        }
        ScopeName::CrossNamespacePodAffinity => flags & FLAG_CROSS_NAMESPACE_AFFINITY != 0,
        ScopeName::VolumeAttributesClass | ScopeName::Other(_) => false,
    })
}
