//! What one hard key of a ResourceQuota needs watched, following upstream's evaluators
//! (`pkg/quota/v1/evaluator/core` and the generic object-count evaluator):
//!
//! | key | evaluator | watches |
//! |---|---|---|
//! | `pods`, `cpu`, `memory`, `ephemeral-storage`, `requests.*`, `limits.{cpu,memory,ephemeral-storage}`, `hugepages-*`, `requests.hugepages-*` | pods | pods, typed |
//! | `count/pods` | pods | pods, metadata |
//! | `services`, `services.nodeports`, `services.loadbalancers` | services | services, typed |
//! | `count/services` | services | services, metadata |
//! | `persistentvolumeclaims`, `requests.storage`, `<class>.storageclass.storage.k8s.io/{requests.storage,persistentvolumeclaims}` | PVCs | PVCs, typed |
//! | `count/persistentvolumeclaims` | PVCs | PVCs, metadata |
//! | `configmaps`, `secrets`, `replicationcontrollers`, `resourcequotas` | object count (legacy alias) | that resource, metadata |
//! | `count/<resource>[.<group>]` | object count | that resource, metadata |
//! | anything else (`limits.nvidia.com/gpu`, `limits.hugepages-2Mi`, ...) | none: stays absent | nothing |
//!
//! Scopes: an object matches a quota only if it matches every scope and selector
//! requirement. Object-count and service evaluators match no scope, PVCs match only
//! `VolumeAttributesClass`, pods only the pod scopes. A key whose evaluator cannot match one of
//! the quota's scopes always computes `0`: upstream still writes that `0`, but nothing needs
//! watching for it.

use crate::keys::{GroupResource, Need};

/// The evaluator upstream uses for a key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Evaluator {
    /// `core/pods`.
    Pods,
    /// `core/services`.
    Services,
    /// `core/persistentvolumeclaims`.
    PersistentVolumeClaims,
    /// The generic object-count evaluator of some other resource.
    ObjectCount,
}

/// What a hard key needs.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum KeyPlan {
    /// No evaluator matches the key: upstream never computes it, so it keeps whatever
    /// `status.used` held (normally nothing).
    Unmatched,
    /// An evaluator matches and computes the key from the objects of `resource`.
    Computed {
        /// The resource whose objects are counted or summed.
        resource: GroupResource,
        /// The evaluator.
        evaluator: Evaluator,
        /// How much of each object is needed; `None` when the quota's scopes exclude every
        /// object of this evaluator, so the value is always `0` and nothing is watched.
        need: Option<Need>,
    },
}

/// Scope names that the pods evaluator understands (`pods.go:podMatchesScopeFunc`).
const POD_SCOPES: &[&str] = &[
    "Terminating",
    "NotTerminating",
    "BestEffort",
    "NotBestEffort",
    "PriorityClass",
    "CrossNamespacePodAffinity",
];
/// Scope names that the PVC evaluator understands.
const PVC_SCOPES: &[&str] = &["VolumeAttributesClass"];

fn pod_compute_key(key: &str) -> bool {
    const EXACT: &[&str] = &[
        "pods",
        "cpu",
        "memory",
        "ephemeral-storage",
        "requests.cpu",
        "requests.memory",
        "requests.ephemeral-storage",
        "limits.cpu",
        "limits.memory",
        "limits.ephemeral-storage",
    ];
    if EXACT.contains(&key) || key.starts_with("hugepages-") || key.starts_with("requests.hugepages-") {
        return true;
    }
    // Extended resources are quotable only as `requests.<domain>/<name>` where the name is
    // not in the `kubernetes.io/` namespace (`isExtendedResourceNameForQuota`).
    key.strip_prefix("requests.").is_some_and(|rest| {
        rest.contains('/') && !rest.starts_with("kubernetes.io/") && !rest.contains(".deviceclass.")
    })
}

fn service_key(key: &str) -> bool {
    matches!(key, "services" | "services.nodeports" | "services.loadbalancers")
}

fn pvc_key(key: &str) -> bool {
    if matches!(key, "persistentvolumeclaims" | "requests.storage") {
        return true;
    }
    key.split_once(".storageclass.storage.k8s.io/")
        .is_some_and(|(class, rest)| {
            !class.is_empty() && matches!(rest, "requests.storage" | "persistentvolumeclaims")
        })
}

/// Parses `count/<resource>[.<group>]`.
fn object_count(key: &str) -> Option<GroupResource> {
    let rest = key.strip_prefix("count/")?;
    if rest.is_empty() {
        return None;
    }
    Some(match rest.split_once('.') {
        Some((resource, group)) if !resource.is_empty() && !group.is_empty() => {
            GroupResource::new(group, resource)
        }
        Some(_) => return None,
        None => GroupResource::core(rest),
    })
}

/// The plan for one hard key of a quota whose scopes (from `spec.scopes` and
/// `spec.scopeSelector.matchExpressions[].scopeName`) are `scopes`.
pub fn plan(key: &str, scopes: &[String]) -> KeyPlan {
    let (resource, evaluator, need) = if pod_compute_key(key) {
        (GroupResource::core("pods"), Evaluator::Pods, Need::Typed)
    } else if service_key(key) {
        (GroupResource::core("services"), Evaluator::Services, Need::Typed)
    } else if pvc_key(key) {
        (
            GroupResource::core("persistentvolumeclaims"),
            Evaluator::PersistentVolumeClaims,
            Need::Typed,
        )
    } else if matches!(
        key,
        "configmaps" | "secrets" | "replicationcontrollers" | "resourcequotas"
    ) {
        (GroupResource::core(key), Evaluator::ObjectCount, Need::Count)
    } else if let Some(resource) = object_count(key) {
        let evaluator = match (resource.group.as_str(), resource.resource.as_str()) {
            ("", "pods") => Evaluator::Pods,
            ("", "services") => Evaluator::Services,
            ("", "persistentvolumeclaims") => Evaluator::PersistentVolumeClaims,
            _ => Evaluator::ObjectCount,
        };
        (resource, evaluator, Need::Count)
    } else {
        return KeyPlan::Unmatched;
    };
    let understood: &[&str] = match evaluator {
        Evaluator::Pods => POD_SCOPES,
        Evaluator::PersistentVolumeClaims => PVC_SCOPES,
        Evaluator::Services | Evaluator::ObjectCount => &[],
    };
    // Upstream's count evaluator matches no scope even for count/pods (the pods evaluator's
    // own `count/pods` is computed with the scope, so only the generic one is excluded).
    let all_scopes_matchable = scopes.iter().all(|s| understood.contains(&s.as_str()));
    let need = all_scopes_matchable.then_some(need);
    KeyPlan::Computed {
        resource,
        evaluator,
        need,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn computed(key: &str, scopes: &[&str]) -> (String, Evaluator, Option<Need>) {
        let scopes: Vec<String> = scopes.iter().map(|s| (*s).to_owned()).collect();
        match plan(key, &scopes) {
            KeyPlan::Computed {
                resource,
                evaluator,
                need,
            } => (resource.object_count_name(), evaluator, need),
            KeyPlan::Unmatched => panic!("{key} should be computed"),
        }
    }

    #[test]
    fn keys_map_to_the_resources_upstream_evaluators_read() {
        use Evaluator::*;
        let rows: &[(&str, &str, Evaluator, Need)] = &[
            ("pods", "count/pods", Pods, Need::Typed),
            ("requests.cpu", "count/pods", Pods, Need::Typed),
            ("limits.memory", "count/pods", Pods, Need::Typed),
            ("hugepages-2Mi", "count/pods", Pods, Need::Typed),
            ("requests.nvidia.com/gpu", "count/pods", Pods, Need::Typed),
            ("count/pods", "count/pods", Pods, Need::Count),
            ("services.nodeports", "count/services", Services, Need::Typed),
            ("count/services", "count/services", Services, Need::Count),
            (
                "requests.storage",
                "count/persistentvolumeclaims",
                PersistentVolumeClaims,
                Need::Typed,
            ),
            (
                "gold.storageclass.storage.k8s.io/persistentvolumeclaims",
                "count/persistentvolumeclaims",
                PersistentVolumeClaims,
                Need::Typed,
            ),
            ("configmaps", "count/configmaps", ObjectCount, Need::Count),
            (
                "count/widgets.example.io",
                "count/widgets.example.io",
                ObjectCount,
                Need::Count,
            ),
            (
                "count/deployments.apps",
                "count/deployments.apps",
                ObjectCount,
                Need::Count,
            ),
        ];
        for (key, resource, evaluator, need) in rows {
            assert_eq!(
                computed(key, &[]),
                ((*resource).to_owned(), *evaluator, Some(*need)),
                "key {key}"
            );
        }
    }

    #[test]
    fn unmatched_keys_demand_nothing() {
        for key in [
            "limits.nvidia.com/gpu",
            "limits.hugepages-2Mi",
            "count/",
            "count/.apps",
            "foo",
            "requests.kubernetes.io/x",
        ] {
            assert_eq!(plan(key, &[]), KeyPlan::Unmatched, "key {key}");
        }
    }

    #[test]
    fn scopes_that_exclude_every_object_demand_no_watch() {
        assert_eq!(
            computed("count/widgets.example.io", &["BestEffort"]).2,
            None,
            "count/* under a scope is 0"
        );
        assert_eq!(
            computed("services", &["Terminating"]).2,
            None,
            "services match no scope"
        );
        assert_eq!(computed("pods", &["BestEffort"]).2, Some(Need::Typed));
        assert_eq!(
            computed("requests.cpu", &["PriorityClass", "NotTerminating"]).2,
            Some(Need::Typed)
        );
        assert_eq!(computed("pods", &["VolumeAttributesClass"]).2, None);
        assert_eq!(
            computed("requests.storage", &["VolumeAttributesClass"]).2,
            Some(Need::Typed)
        );
        assert_eq!(computed("requests.storage", &["BestEffort"]).2, None);
    }
}
