//! Evaluators: which one serves which quota names (`MatchingResources`), the registry the
//! controller builds (`NewEvaluators` + `SyncMonitors`), and `quota.CalculateUsage`.

use std::collections::BTreeSet;

use crate::claim::{DeviceClassMap, claim_matches_key};
use crate::gates::FeatureGates;
use crate::names::{
    COUNT_PERSISTENT_VOLUME_CLAIMS, COUNT_PODS, COUNT_RESOURCE_CLAIMS, COUNT_SERVICES, CPU,
    DEVICE_CLASS_DEVICES_SUFFIX, EPHEMERAL_STORAGE, GroupResource, HUGEPAGES_PREFIX,
    LEGACY_OBJECT_COUNT_ALIASES, LIMITS_CPU, LIMITS_EPHEMERAL_STORAGE, LIMITS_MEMORY, MEMORY,
    PERSISTENT_VOLUME_CLAIMS, PODS, REQUESTS_CPU, REQUESTS_DEVICE_CLASS_PREFIX, REQUESTS_EPHEMERAL_STORAGE,
    REQUESTS_HUGEPAGES_PREFIX, REQUESTS_MEMORY, REQUESTS_STORAGE, SERVICES, SERVICES_LOAD_BALANCERS,
    SERVICES_NODE_PORTS, STORAGE_CLASS_SUFFIX, is_extended_resource_name_for_quota, is_ignored_resource,
    legacy_alias, parse_object_count_name,
};
use crate::quantity::{Format, Quantity};
use crate::scope::QuotaScopes;
use crate::usage::ResourceList;

/// `podResources`: the fixed names the pods evaluator matches.
pub const POD_RESOURCES: &[&str] = &[
    COUNT_PODS,
    CPU,
    MEMORY,
    EPHEMERAL_STORAGE,
    REQUESTS_CPU,
    REQUESTS_MEMORY,
    REQUESTS_EPHEMERAL_STORAGE,
    LIMITS_CPU,
    LIMITS_MEMORY,
    LIMITS_EPHEMERAL_STORAGE,
    PODS,
];

/// `serviceResources`.
pub const SERVICE_RESOURCES: &[&str] = &[
    COUNT_SERVICES,
    SERVICES,
    SERVICES_NODE_PORTS,
    SERVICES_LOAD_BALANCERS,
];

/// An evaluator of the upstream registry.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Evaluator {
    /// `core/pods`.
    Pods,
    /// `core/services`.
    Services,
    /// `core/persistentvolumeclaims`.
    PersistentVolumeClaims,
    /// `resource.k8s.io/resourceclaims`, registered with `DynamicResourceAllocation`
    /// ([`crate::claim`]).
    ResourceClaims,
    /// `generic.objectCountEvaluator` for a resource: `count/<r>[.<g>]`, plus the legacy bare
    /// alias for configmaps, secrets, replicationcontrollers and resourcequotas.
    ObjectCount(GroupResource),
}

/// `quota.Intersection`: deduplicated, sorted members of `input` that are in `names`.
fn intersection<S: AsRef<str>>(input: &[S], names: &[&str]) -> Vec<String> {
    let set: BTreeSet<&str> = input
        .iter()
        .map(AsRef::as_ref)
        .filter(|name| names.contains(name))
        .collect();
    set.into_iter().map(str::to_owned).collect()
}

impl Evaluator {
    /// The resource whose objects the evaluator lists.
    pub fn group_resource(&self) -> GroupResource {
        match self {
            Self::Pods => GroupResource::core("pods"),
            Self::Services => GroupResource::core("services"),
            Self::PersistentVolumeClaims => GroupResource::core("persistentvolumeclaims"),
            Self::ResourceClaims => GroupResource::new("resource.k8s.io", "resourceclaims"),
            Self::ObjectCount(gr) => gr.clone(),
        }
    }

    /// The names an object-count evaluator charges 1 per object (empty for the others).
    pub fn object_count_names(&self) -> Vec<String> {
        match self {
            Self::ObjectCount(gr) => {
                let mut names = vec![gr.object_count_name()];
                names.extend(legacy_alias(gr).map(str::to_owned));
                names
            }
            _ => Vec::new(),
        }
    }

    /// `MatchingResources`: the subset of `input` this evaluator computes, in upstream order.
    ///
    /// Pods: the fixed names, then (in input order) `hugepages-*`, `requests.hugepages-*` and
    /// `requests.<extended>`; never `limits.hugepages-*`, `limits.<ext>` or a bare `<ext>`.
    /// The resourceclaims evaluator cannot see DeviceClass mappings here: it reports every
    /// name it could match.
    pub fn matching_resources<S: AsRef<str>>(&self, input: &[S], gates: FeatureGates) -> Vec<String> {
        match self {
            Self::Pods => {
                let mut result = intersection(input, POD_RESOURCES);
                for name in input.iter().map(AsRef::as_ref) {
                    if name.starts_with(HUGEPAGES_PREFIX) || name.starts_with(REQUESTS_HUGEPAGES_PREFIX) {
                        result.push(name.to_owned());
                    }
                    if is_extended_resource_name_for_quota(name, gates.minor) {
                        result.push(name.to_owned());
                    }
                }
                result
            }
            Self::Services => intersection(input, SERVICE_RESOURCES),
            Self::PersistentVolumeClaims => input
                .iter()
                .map(AsRef::as_ref)
                .filter(|name| {
                    *name == COUNT_PERSISTENT_VOLUME_CLAIMS
                        || *name == PERSISTENT_VOLUME_CLAIMS
                        || *name == REQUESTS_STORAGE
                        || [PERSISTENT_VOLUME_CLAIMS, REQUESTS_STORAGE].iter().any(|r| {
                            name.strip_suffix(r)
                                .is_some_and(|rest| rest.ends_with(STORAGE_CLASS_SUFFIX))
                        })
                })
                .map(str::to_owned)
                .collect(),
            // Without the DeviceClasses: every name it could match (see `claim_matches_key`
            // for the exact rule, which `Registry::plan_with_classes` applies).
            Self::ResourceClaims => input
                .iter()
                .map(AsRef::as_ref)
                .filter(|name| {
                    *name == COUNT_RESOURCE_CLAIMS
                        || name.ends_with(DEVICE_CLASS_DEVICES_SUFFIX)
                        || (gates.dra_extended_resource
                            && (name.starts_with(REQUESTS_DEVICE_CLASS_PREFIX)
                                || is_extended_resource_name_for_quota(name, gates.minor)))
                })
                .map(str::to_owned)
                .collect(),
            Self::ObjectCount(_) => {
                let names = self.object_count_names();
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                intersection(input, &names)
            }
        }
    }

    /// Whether the evaluator can match any scope at all. Object counts, services and
    /// resourceclaims use `MatchesNoScopeFunc`, so under any scope they compute 0; PVCs match
    /// only the VolumeAttributesClass scope, and only with that gate.
    pub fn supports_scopes(&self, gates: FeatureGates) -> bool {
        match self {
            Self::Pods => true,
            Self::PersistentVolumeClaims => gates.volume_attributes_class,
            Self::Services | Self::ResourceClaims | Self::ObjectCount(_) => false,
        }
    }
}

/// Whether a static evaluator already owns this resource, so `SyncMonitors` adds no
/// generic object-count evaluator for it.
fn has_static_evaluator(gr: &GroupResource, gates: FeatureGates) -> bool {
    (gr.group.is_empty()
        && (["pods", "services", "persistentvolumeclaims"].contains(&gr.resource.as_str())
            || LEGACY_OBJECT_COUNT_ALIASES.iter().any(|(r, _)| *r == gr.resource)))
        || (gates.dynamic_resource_allocation && gr.is("resource.k8s.io", "resourceclaims"))
}

/// The evaluator that would serve `gr` once discovered: a static one, or a generic object
/// count; `None` for ignored resources.
pub fn evaluator_for_resource(gr: &GroupResource, gates: FeatureGates) -> Option<Evaluator> {
    if is_ignored_resource(gr) {
        return None;
    }
    Some(match (gr.group.as_str(), gr.resource.as_str()) {
        ("", "pods") => Evaluator::Pods,
        ("", "services") => Evaluator::Services,
        ("", "persistentvolumeclaims") => Evaluator::PersistentVolumeClaims,
        ("resource.k8s.io", "resourceclaims") if gates.dynamic_resource_allocation => {
            Evaluator::ResourceClaims
        }
        _ => Evaluator::ObjectCount(gr.clone()),
    })
}

/// All evaluators that would match `key`, assuming any `count/<r>.<g>` resource is
/// discovered (upstream only has that evaluator once discovery saw the resource).
/// Empty means no evaluator matches: the key stays as it was in `status.used`.
pub fn evaluators_for_key(key: &str, gates: FeatureGates) -> Vec<Evaluator> {
    let mut candidates = vec![
        Evaluator::Pods,
        Evaluator::Services,
        Evaluator::PersistentVolumeClaims,
    ];
    if gates.dynamic_resource_allocation {
        candidates.push(Evaluator::ResourceClaims);
    }
    if let Some(gr) = parse_object_count_name(key)
        && !has_static_evaluator(&gr, gates)
        && !is_ignored_resource(&gr)
    {
        candidates.push(Evaluator::ObjectCount(gr));
    }
    for (resource, alias) in LEGACY_OBJECT_COUNT_ALIASES {
        if key == *alias || parse_object_count_name(key).is_some_and(|gr| gr.is("", resource)) {
            candidates.push(Evaluator::ObjectCount(GroupResource::core(*resource)));
        }
    }
    candidates.retain(|e| !e.matching_resources(&[key], gates).is_empty());
    candidates
}

/// How much of an object a computation needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Projection {
    /// Object metadata suffices: the value is a count of objects.
    Metadata,
    /// A [`crate::pod::PodProjection`].
    Pod,
    /// A [`crate::service::ServiceProjection`].
    Service,
    /// A [`crate::pvc::PvcProjection`].
    PersistentVolumeClaim,
    /// A [`crate::claim::ClaimProjection`].
    ResourceClaim,
}

/// A resource that must be watched, and how much of its objects must be kept.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchNeed {
    /// The resource to watch.
    pub group_resource: GroupResource,
    /// What to keep per object.
    pub projection: Projection,
}

/// What computing one hard key takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPlan {
    /// Evaluators matching the key. Empty: the key is never computed (stays absent).
    pub evaluators: Vec<Evaluator>,
    /// Resources to watch. Empty while `evaluators` is not: the value is a constant 0
    /// (an evaluator that matches no scope, under a scoped quota).
    pub needs: Vec<WatchNeed>,
}

/// For one hard key of a quota with `scopes`: which evaluators compute it and what must be
/// watched, with metadata-only watches where a count of objects is all that is needed.
pub fn plan_key(key: &str, scopes: &QuotaScopes, gates: FeatureGates) -> KeyPlan {
    let evaluators = evaluators_for_key(key, gates);
    let mut needs = Vec::new();
    for evaluator in &evaluators {
        if !scopes.is_empty() && !evaluator.supports_scopes(gates) {
            continue;
        }
        let unscoped = scopes.is_empty();
        let projection = match evaluator {
            Evaluator::Pods if unscoped && key == COUNT_PODS => Projection::Metadata,
            Evaluator::Pods => Projection::Pod,
            Evaluator::Services if key == COUNT_SERVICES || key == SERVICES => Projection::Metadata,
            Evaluator::Services => Projection::Service,
            Evaluator::PersistentVolumeClaims
                if unscoped && (key == COUNT_PERSISTENT_VOLUME_CLAIMS || key == PERSISTENT_VOLUME_CLAIMS) =>
            {
                Projection::Metadata
            }
            Evaluator::PersistentVolumeClaims => Projection::PersistentVolumeClaim,
            Evaluator::ResourceClaims if key == COUNT_RESOURCE_CLAIMS => Projection::Metadata,
            Evaluator::ResourceClaims => Projection::ResourceClaim,
            Evaluator::ObjectCount(_) => Projection::Metadata,
        };
        needs.push(WatchNeed {
            group_resource: evaluator.group_resource(),
            projection,
        });
    }
    KeyPlan { evaluators, needs }
}

/// The resource whose objects `key` counts one each, all of them, under a quota with
/// `scopes`: a count any list of that resource gives, whatever the objects hold. `None` when
/// the value needs more than a count (compute resources, `pods`, which leaves out terminal
/// pods), the quota has scopes, or no one evaluator computes the key.
pub fn counted_by_list(key: &str, scopes: &QuotaScopes, gates: FeatureGates) -> Option<GroupResource> {
    if !scopes.is_empty() {
        return None;
    }
    match plan_key(key, scopes, gates).needs.as_slice() {
        [need] if need.projection == Projection::Metadata => Some(need.group_resource.clone()),
        _ => None,
    }
}

/// The evaluators of a controller: the static ones of `NewEvaluators` and a generic object
/// count for every discovered resource without one (`SyncMonitors`). Like upstream,
/// evaluators are never removed.
#[derive(Clone, Debug)]
pub struct Registry {
    gates: FeatureGates,
    discovered: BTreeSet<GroupResource>,
}

impl Registry {
    /// The static evaluators for `gates`.
    pub fn new(gates: FeatureGates) -> Self {
        Self {
            gates,
            discovered: BTreeSet::new(),
        }
    }

    /// The gates the registry was built with.
    pub fn gates(&self) -> FeatureGates {
        self.gates
    }

    /// Records a discovered quotable resource. Returns whether a new generic object-count
    /// evaluator was added (not for ignored resources or those a static evaluator owns).
    pub fn add_discovered(&mut self, gr: GroupResource) -> bool {
        if is_ignored_resource(&gr) || has_static_evaluator(&gr, self.gates) {
            return false;
        }
        self.discovered.insert(gr)
    }

    /// All evaluators: pods, services, PVCs, resourceclaims (with DRA), the four legacy
    /// object counts, then the discovered object counts.
    pub fn evaluators(&self) -> Vec<Evaluator> {
        let mut evaluators = vec![
            Evaluator::Pods,
            Evaluator::Services,
            Evaluator::PersistentVolumeClaims,
        ];
        if self.gates.dynamic_resource_allocation {
            evaluators.push(Evaluator::ResourceClaims);
        }
        for (resource, _) in LEGACY_OBJECT_COUNT_ALIASES {
            evaluators.push(Evaluator::ObjectCount(GroupResource::core(*resource)));
        }
        evaluators.extend(self.discovered.iter().cloned().map(Evaluator::ObjectCount));
        evaluators
    }

    /// First half of `quota.CalculateUsage`: the hard keys some evaluator matches, and for each
    /// evaluator matching any of them, the keys it must compute (`UsageStatsOptions.Resources`).
    /// The resourceclaims evaluator is given every name it could match (no DeviceClasses).
    pub fn plan<S: AsRef<str>>(&self, hard_keys: &[S]) -> UsagePlan {
        self.plan_with_classes(hard_keys, None)
    }

    /// [`Registry::plan`] with the cluster's DeviceClasses, so the resourceclaims evaluator
    /// matches exactly what upstream's does.
    pub fn plan_with_classes<S: AsRef<str>>(
        &self,
        hard_keys: &[S],
        classes: Option<&DeviceClassMap>,
    ) -> UsagePlan {
        let gates = self.gates;
        let matching = |evaluator: &Evaluator, input: &[&str]| -> Vec<String> {
            match (evaluator, classes) {
                (Evaluator::ResourceClaims, Some(classes)) => input
                    .iter()
                    .filter(|k| claim_matches_key(k, gates, classes))
                    .map(|k| (*k).to_owned())
                    .collect(),
                _ => evaluator.matching_resources(input, gates),
            }
        };
        let hard_keys: Vec<&str> = hard_keys.iter().map(AsRef::as_ref).collect();
        let evaluators = self.evaluators();
        let mut potential: Vec<String> = Vec::new();
        for evaluator in &evaluators {
            potential.extend(matching(evaluator, &hard_keys));
        }
        let potential: Vec<&str> = potential.iter().map(String::as_str).collect();
        let matched = intersection(&hard_keys, &potential);
        let matched_refs: Vec<&str> = matched.iter().map(String::as_str).collect();
        let mut per_evaluator = Vec::new();
        for evaluator in evaluators {
            let keys = matching(&evaluator, &matched_refs);
            if !keys.is_empty() {
                per_evaluator.push((evaluator, keys));
            }
        }
        UsagePlan {
            matched,
            per_evaluator,
        }
    }
}

/// The evaluators to run for one quota and the keys each computes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsagePlan {
    /// Hard keys matched by at least one evaluator, sorted.
    pub matched: Vec<String>,
    /// Each evaluator to run with the keys it must compute.
    pub per_evaluator: Vec<(Evaluator, Vec<String>)>,
}

impl UsagePlan {
    /// Second half of `quota.CalculateUsage`: sums the evaluators' results (`None` for an
    /// evaluator that errored, e.g. an unsynced informer) and masks to the matched keys,
    /// dropping every key of an errored evaluator so its previous `used` value is kept.
    pub fn merge(&self, results: &[(Evaluator, Option<ResourceList>)]) -> ResourceList {
        let mut matched: BTreeSet<&str> = self.matched.iter().map(String::as_str).collect();
        let mut usage = ResourceList::new();
        for (evaluator, keys) in &self.per_evaluator {
            let result = results
                .iter()
                .find(|(e, _)| e == evaluator)
                .and_then(|(_, r)| r.as_ref());
            match result {
                None => {
                    for key in keys {
                        matched.remove(key.as_str());
                    }
                }
                Some(used) => {
                    for (key, q) in used {
                        usage
                            .entry(key.clone())
                            .and_modify(|v| *v += q)
                            .or_insert_with(|| q.clone());
                    }
                }
            }
        }
        usage.retain(|key, _| matched.contains(key.as_str()));
        usage
    }
}

/// `CalculateUsageStats` of an object-count evaluator over a namespace holding
/// `object_count` objects: each requested name counts every object, terminating ones
/// included, and everything is 0 under any scope (`MatchesNoScopeFunc`).
pub fn calculate_object_count_usage<S: AsRef<str>>(
    requested: &[S],
    scopes: &QuotaScopes,
    object_count: u64,
) -> ResourceList {
    requested
        .iter()
        .map(|key| {
            let value = if scopes.is_empty() && object_count > 0 {
                Quantity::from_count(object_count)
            } else {
                Quantity::zero(Format::DecimalSI)
            };
            (key.as_ref().to_owned(), value)
        })
        .collect()
}
