//! The pod resource maths of `k8s.io/component-helpers/resource/helpers.go`: a pod's
//! requests and limits from its containers, init containers, overhead, pod-level resources and
//! (with in-place resize) their status, and whether it is best effort.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use crate::gates::FeatureGates;
use crate::names::{CPU, MEMORY, is_hugepages_resource};
use crate::quantity::Quantity;

use super::{ExtractError, List, parse_lossy};

pub(super) fn parse_list(
    map: Option<&BTreeMap<String, K8sQuantity>>,
    field: &dyn Fn() -> String,
    problems: &mut Vec<ExtractError>,
) -> Option<List> {
    let map = map?;
    Some(
        map.iter()
            .map(|(name, q)| {
                let q = parse_lossy(q, &|| format!("{}[{name}]", field()), problems);
                (name.clone(), q)
            })
            .collect(),
    )
}

/// `addResourceList`: absent entries are copied, present ones added (zero adopts format).
pub(super) fn add_list(list: &mut List, new: Option<&List>) {
    for (name, q) in new.into_iter().flatten() {
        list.entry(name.clone())
            .and_modify(|v| *v += q)
            .or_insert_with(|| q.clone());
    }
}

/// `maxResourceList`: replaces entries only where the new value is strictly greater.
pub(super) fn max_list(list: &mut List, new: Option<&List>) {
    for (name, q) in new.into_iter().flatten() {
        list.entry(name.clone())
            .and_modify(|v| {
                if *q > *v {
                    *v = q.clone();
                }
            })
            .or_insert_with(|| q.clone());
    }
}

/// `max(a, b...)`: a copy of `a` maxed with each of `others` in order.
pub(super) fn max_of(first: &List, others: &[&List]) -> List {
    let mut result = first.clone();
    for other in others {
        max_list(&mut result, Some(other));
    }
    result
}

/// The resource fields of one container.
pub(super) struct ContainerResources<'a> {
    pub(super) name: &'a str,
    pub(super) restartable: bool,
    pub(super) requests: Option<List>,
    pub(super) limits: Option<List>,
}

/// The resource fields of one container status.
pub(super) struct StatusResources<'a> {
    pub(super) name: &'a str,
    pub(super) allocated: Option<List>,
    /// `status.resources`: `None` when nil, else its requests and limits.
    pub(super) resources: Option<(Option<List>, Option<List>)>,
}

pub(super) fn container_resources<'a>(
    container: &'a Container,
    field: &str,
    problems: &mut Vec<ExtractError>,
) -> ContainerResources<'a> {
    let resources = container.resources.as_ref();
    let path = || format!("{field}[{}].resources", container.name);
    ContainerResources {
        name: &container.name,
        restartable: container.restart_policy.as_deref() == Some("Always"),
        requests: parse_list(
            resources.and_then(|r| r.requests.as_ref()),
            &|| format!("{}.requests", path()),
            problems,
        ),
        limits: parse_list(
            resources.and_then(|r| r.limits.as_ref()),
            &|| format!("{}.limits", path()),
            problems,
        ),
    }
}

pub(super) fn status_resources<'a>(
    status: &'a ContainerStatus,
    field: &str,
    problems: &mut Vec<ExtractError>,
) -> StatusResources<'a> {
    let path = || format!("{field}[{}]", status.name);
    let resources = status.resources.as_ref().map(|r| {
        (
            parse_list(
                r.requests.as_ref(),
                &|| format!("{}.resources.requests", path()),
                problems,
            ),
            parse_list(
                r.limits.as_ref(),
                &|| format!("{}.resources.limits", path()),
                problems,
            ),
        )
    });
    StatusResources {
        name: &status.name,
        allocated: parse_list(
            status.allocated_resources.as_ref(),
            &|| format!("{}.allocatedResources", path()),
            problems,
        ),
        resources,
    }
}

/// Which of a container's lists a v0.37 aggregate reads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    Spec,
    Allocated,
    Actuated,
}

/// Which list of a container `aggregateContainerResourcesByFn`-style sums read.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Requests,
    Limits,
}

/// Everything `PodRequests`/`PodLimits` read, parsed once.
pub(super) struct PodResources<'a> {
    pub(super) containers: Vec<ContainerResources<'a>>,
    pub(super) init_containers: Vec<ContainerResources<'a>>,
    /// Container statuses then init container statuses, in the order upstream fills its
    /// name-keyed map (a later entry with the same name wins).
    pub(super) statuses: Vec<StatusResources<'a>>,
    pub(super) infeasible: bool,
    pub(super) pod_requests: Option<List>,
    pub(super) pod_limits: Option<List>,
    /// Whether `spec.resources` is non-nil (decides QoS under pod-level resources).
    pub(super) spec_resources_set: bool,
    pub(super) overhead: Option<List>,
}

impl PodResources<'_> {
    /// The status upstream's `containerStatuses[name]` map yields: the last entry with that
    /// name, init container statuses after container statuses.
    pub(super) fn find_status(&self, name: &str) -> Option<&StatusResources<'_>> {
        self.statuses.iter().rev().find(|s| s.name == name)
    }

    /// One container's effective list in `AggregateContainerRequests` /
    /// `AggregateContainerLimits` (component-helpers v0.36): with `UseStatusResources`, an app
    /// container or a restartable init container whose status exists with non-nil
    /// `resources` uses `determineEffectiveRequests` (per resource `max(spec, actuated,
    /// allocated)`, or `max(actuated, allocated)` when the resize is infeasible) or
    /// `determineEffectiveLimits` (`max(spec, actuated)`, or `actuated` alone); every other
    /// container uses its spec. `allocatedResources` alone (nil `resources`) is ignored.
    pub(super) fn effective<'s>(
        &'s self,
        c: &'s ContainerResources<'_>,
        init: bool,
        use_status: bool,
        kind: Kind,
    ) -> Option<Cow<'s, List>> {
        let spec = match kind {
            Kind::Requests => c.requests.as_ref(),
            Kind::Limits => c.limits.as_ref(),
        };
        let status = (use_status && (!init || c.restartable))
            .then(|| self.find_status(c.name))
            .flatten();
        let Some((status, (actuated_requests, actuated_limits))) =
            status.and_then(|s| s.resources.as_ref().map(|r| (s, r)))
        else {
            return spec.map(Cow::Borrowed);
        };
        let empty = List::new();
        match kind {
            Kind::Requests => {
                let actuated = actuated_requests.as_ref().unwrap_or(&empty);
                let allocated = status.allocated.as_ref().unwrap_or(&empty);
                Some(Cow::Owned(if self.infeasible {
                    max_of(actuated, &[allocated])
                } else {
                    max_of(spec.unwrap_or(&empty), &[actuated, allocated])
                }))
            }
            Kind::Limits if self.infeasible => actuated_limits.as_ref().map(Cow::Borrowed),
            Kind::Limits => Some(Cow::Owned(max_of(
                spec.unwrap_or(&empty),
                &[actuated_limits.as_ref().unwrap_or(&empty)],
            ))),
        }
    }

    /// One container's list from one source, as component-helpers v0.37's
    /// `containerSpecRequests`, `containerAllocatedRequests`, `containerActuatedRequests`,
    /// `containerSpecLimits` and `containerActuatedLimits` read it: every container (init
    /// containers too) looks up its status (`findContainerStatus`: the first with its name,
    /// container statuses before init container statuses); a missing status value falls back
    /// to allocated, then to the spec — or to nothing when the resize is infeasible.
    pub(super) fn source<'s>(
        &'s self,
        c: &'s ContainerResources<'_>,
        source: Source,
        kind: Kind,
    ) -> Option<&'s List> {
        let spec = match kind {
            Kind::Requests => c.requests.as_ref(),
            Kind::Limits => c.limits.as_ref(),
        };
        if source == Source::Spec {
            return spec;
        }
        let status = self.statuses.iter().find(|s| s.name == c.name);
        let actuated = status
            .and_then(|s| s.resources.as_ref())
            .and_then(|(requests, limits)| match kind {
                Kind::Requests => requests.as_ref(),
                Kind::Limits => limits.as_ref(),
            });
        let allocated = status.and_then(|s| s.allocated.as_ref());
        let fallback = if self.infeasible { None } else { spec };
        match (source, kind) {
            (Source::Actuated, _) if actuated.is_some() => actuated,
            (Source::Actuated, Kind::Limits) => fallback,
            (Source::Actuated | Source::Allocated, Kind::Requests) => allocated.or(fallback),
            (Source::Allocated, Kind::Limits) | (Source::Spec, _) => spec,
        }
    }

    /// `AggregateContainerRequests` / `AggregateContainerLimits` of component-helpers v0.37
    /// (Kubernetes 1.37): with `UseStatusResources`, the per-source aggregates are maxed —
    /// `max(spec, actuated, allocated)` for requests and `max(spec, actuated)` for limits, or
    /// without the spec when the resize is infeasible — where v0.36 maxed per container.
    pub(super) fn aggregate_v37(&self, use_status: bool, kind: Kind) -> List {
        let sum =
            |source: Source| self.aggregate_with(|c, _| self.source(c, source, kind).map(Cow::Borrowed));
        if !use_status {
            return sum(Source::Spec);
        }
        let actuated = sum(Source::Actuated);
        match (kind, self.infeasible) {
            (Kind::Requests, true) => max_of(&actuated, &[&sum(Source::Allocated)]),
            (Kind::Requests, false) => max_of(&sum(Source::Spec), &[&actuated, &sum(Source::Allocated)]),
            (Kind::Limits, true) => actuated,
            (Kind::Limits, false) => max_of(&sum(Source::Spec), &[&actuated]),
        }
    }

    /// `AggregateContainerRequests` / `AggregateContainerLimits` of the release in `minor`.
    pub(super) fn aggregate(&self, use_status: bool, kind: Kind, minor: u16) -> List {
        if minor >= 37 {
            self.aggregate_v37(use_status, kind)
        } else {
            self.aggregate_with(|c, init| self.effective(c, init, use_status, kind))
        }
    }

    /// The sidecar formula over each container's list as `own` gives it: sum of app
    /// containers and sidecars, maxed with each init container's init-time usage (itself plus
    /// the sidecars started before it).
    pub(super) fn aggregate_with<'s>(
        &'s self,
        own: impl Fn(&'s ContainerResources<'_>, bool) -> Option<Cow<'s, List>>,
    ) -> List {
        let mut result = List::new();
        for c in &self.containers {
            add_list(&mut result, own(c, false).as_deref());
        }
        let mut sidecars = List::new();
        let mut init_max = List::new();
        for c in &self.init_containers {
            let own = own(c, true);
            if c.restartable {
                add_list(&mut result, own.as_deref());
                add_list(&mut sidecars, own.as_deref());
                max_list(&mut init_max, Some(&sidecars));
            } else {
                let mut combined = List::new();
                add_list(&mut combined, own.as_deref());
                add_list(&mut combined, Some(&sidecars));
                max_list(&mut init_max, Some(&combined));
            }
        }
        max_list(&mut result, Some(&init_max));
        result
    }

    /// `AggregateContainerRequests`.
    pub(super) fn container_requests(&self, use_status: bool, minor: u16) -> List {
        self.aggregate(use_status, Kind::Requests, minor)
    }

    /// `AggregateContainerLimits`.
    pub(super) fn container_limits(&self, use_status: bool, minor: u16) -> List {
        self.aggregate(use_status, Kind::Limits, minor)
    }

    /// `PodRequests` with the options the pods evaluator passes.
    pub(super) fn requests(&self, gates: FeatureGates) -> List {
        let mut requests = self.container_requests(gates.in_place_pod_vertical_scaling, gates.minor);
        if gates.pod_level_resources && has_supported_pod_level(self.pod_requests.as_ref()) {
            apply_pod_level(&mut requests, self.pod_requests.as_ref());
        }
        add_list(&mut requests, self.overhead.as_ref());
        requests
    }

    /// `PodLimits` with the options the pods evaluator passes.
    pub(super) fn limits(&self, gates: FeatureGates) -> List {
        let mut limits = self.container_limits(gates.in_place_pod_vertical_scaling, gates.minor);
        let pod_level_set = has_supported_pod_level(self.pod_requests.as_ref())
            || has_supported_pod_level(self.pod_limits.as_ref());
        if gates.pod_level_resources && pod_level_set {
            apply_pod_level(&mut limits, self.pod_limits.as_ref());
        }
        // Overhead is added only to limits that exist and are non-zero.
        for (name, q) in self.overhead.iter().flatten() {
            if let Some(limit) = limits.get_mut(name)
                && !limit.is_zero()
            {
                *limit += q;
            }
        }
        limits
    }
}

/// `IsSupportedPodLevelResource`: cpu, memory and hugepages.
pub(super) fn is_supported_pod_level(name: &str) -> bool {
    name == CPU || name == MEMORY || is_hugepages_resource(name)
}

pub(super) fn has_supported_pod_level(list: Option<&List>) -> bool {
    list.is_some_and(|l| l.keys().any(|k| is_supported_pod_level(k)))
}

/// `applyPodLevelResources`: pod-level values replace the aggregate per supported resource.
pub(super) fn apply_pod_level(result: &mut List, pod_level: Option<&List>) {
    for (name, q) in pod_level.into_iter().flatten() {
        if is_supported_pod_level(name) {
            result.insert(name.clone(), q.clone());
        }
    }
}

/// `IsPodResizeInfeasible`: the first `PodResizePending` condition has reason `Infeasible`.
pub(super) fn is_resize_infeasible(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "PodResizePending"))
        .is_some_and(|c| c.reason.as_deref() == Some("Infeasible"))
}

pub(super) fn parse_pod<'a>(pod: &'a Pod, problems: &mut Vec<ExtractError>) -> PodResources<'a> {
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let containers = spec
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| container_resources(c, "spec.containers", problems))
        .collect();
    let init_containers = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|c| container_resources(c, "spec.initContainers", problems))
        .collect();
    let mut statuses = Vec::new();
    for (list, field) in [
        (
            status.and_then(|s| s.container_statuses.as_deref()),
            "status.containerStatuses",
        ),
        (
            status.and_then(|s| s.init_container_statuses.as_deref()),
            "status.initContainerStatuses",
        ),
    ] {
        for cs in list.unwrap_or_default() {
            statuses.push(status_resources(cs, field, problems));
        }
    }
    let pod_resources = spec.and_then(|s| s.resources.as_ref());
    PodResources {
        containers,
        init_containers,
        statuses,
        infeasible: is_resize_infeasible(pod),
        pod_requests: parse_list(
            pod_resources.and_then(|r| r.requests.as_ref()),
            &|| "spec.resources.requests".to_owned(),
            problems,
        ),
        pod_limits: parse_list(
            pod_resources.and_then(|r| r.limits.as_ref()),
            &|| "spec.resources.limits".to_owned(),
            problems,
        ),
        spec_resources_set: pod_resources.is_some(),
        overhead: parse_list(
            spec.and_then(|s| s.overhead.as_ref()),
            &|| "spec.overhead".to_owned(),
            problems,
        ),
    }
}

/// Whether cpu and memory requests and limits are all zero or absent (a BestEffort set).
pub(super) fn is_best_effort_list(requests: Option<&List>, limits: Option<&List>) -> bool {
    [CPU, MEMORY].iter().all(|name| {
        requests.and_then(|l| l.get(*name)).is_none_or(Quantity::is_zero)
            && limits.and_then(|l| l.get(*name)).is_none_or(Quantity::is_zero)
    })
}

/// `qos.GetPodQOS(pod) == BestEffort`: `status.qosClass` when set, else `ComputePodQOS`.
/// Only BestEffort matters to quota, and a container is BestEffort exactly when its cpu and
/// memory requests and limits are all zero or absent.
pub(super) fn is_best_effort(pod: &Pod, parsed: &PodResources<'_>, gates: FeatureGates) -> bool {
    if let Some(class) = pod.status.as_ref().and_then(|s| s.qos_class.as_deref())
        && !class.is_empty()
    {
        return class == "BestEffort";
    }
    if gates.pod_level_resources && parsed.spec_resources_set {
        return is_best_effort_list(parsed.pod_requests.as_ref(), parsed.pod_limits.as_ref());
    }
    parsed
        .init_containers
        .iter()
        .chain(&parsed.containers)
        .all(|c| is_best_effort_list(c.requests.as_ref(), c.limits.as_ref()))
}
