//! What one hard key of a ResourceQuota needs watched. The evaluator matching itself is the
//! quota crate's ([`lazyquota_quota::plan_key`], upstream's `MatchingResources`); this module
//! turns it into watch demand:
//!
//! | key | evaluator | watches |
//! |---|---|---|
//! | `pods`, `cpu`, `memory`, `ephemeral-storage`, `requests.*`, `limits.{cpu,memory,ephemeral-storage}`, `hugepages-*`, `requests.hugepages-*` | pods | pods, typed |
//! | `count/pods` | pods | pods, metadata |
//! | `services.nodeports`, `services.loadbalancers` | services | services, typed |
//! | `services`, `count/services` | services | services, metadata |
//! | `requests.storage`, `<class>.storageclass.storage.k8s.io/{requests.storage,persistentvolumeclaims}` | PVCs | PVCs, typed |
//! | `persistentvolumeclaims`, `count/persistentvolumeclaims` | PVCs | PVCs, metadata |
//! | `configmaps`, `secrets`, `replicationcontrollers`, `resourcequotas` | object count (legacy alias) | that resource, metadata |
//! | `count/<resource>[.<group>]` | object count | that resource, metadata |
//! | `count/resourceclaims.resource.k8s.io` | resourceclaims | resourceclaims, metadata |
//! | `<class>.deviceclass.resource.k8s.io/devices` | resourceclaims | resourceclaims, typed |
//! | `requests.deviceclass.resource.kubernetes.io/<class>`, `requests.<ext>` with `DRAExtendedResource` | pods and resourceclaims | pods, resourceclaims (typed) and DeviceClasses (cluster-wide) |
//! | anything else (`limits.nvidia.com/gpu`, `limits.hugepages-2Mi`, ...) | none: stays absent | nothing |
//!
//! Scopes: object-count, service and resource-claim evaluators match no scope, so under any
//! scope their keys always compute `0`: upstream still writes that `0`, but nothing needs
//! watching for it. Under a scope, counts of pods and PVCs need the typed projection (the
//! scope is evaluated per object).

use lazyquota_quota::{Evaluator, FeatureGates, Projection, QuotaScopes, names::REQUESTS_PREFIX, plan_key};

use crate::keys::{GroupResource, Need};

/// DeviceClasses (`resource.k8s.io`, cluster-scoped): the mapping from a class to its extended
/// resource name, which the resourceclaims evaluator reads under `DRAExtendedResource`.
pub fn device_classes() -> GroupResource {
    GroupResource::new("resource.k8s.io", "deviceclasses")
}

/// Whether a demanded resource is watched cluster-wide whatever the namespace of the quota
/// demanding it (a cluster-scoped resource read as context, not counted): its demand is
/// recorded under [`crate::keys::ALL_NAMESPACES`].
pub fn is_cluster_wide(resource: &GroupResource) -> bool {
    resource.is("resource.k8s.io", "deviceclasses")
}

/// The resources one hard key needs watched, and how much of each object. Empty for a key
/// no evaluator matches (it stays absent) and for one that is always `0` under the quota's
/// scopes. A `requests.*` key the resourceclaims evaluator could match (with
/// `DRAExtendedResource`) also needs the cluster's DeviceClasses.
pub fn needs(key: &str, scopes: &QuotaScopes, gates: FeatureGates) -> Vec<(GroupResource, Need)> {
    let plan = plan_key(key, scopes, gates);
    let mut needs: Vec<(GroupResource, Need)> = plan
        .needs
        .iter()
        .map(|n| {
            let need = match n.projection {
                Projection::Metadata => Need::Count,
                Projection::Pod
                | Projection::Service
                | Projection::PersistentVolumeClaim
                | Projection::ResourceClaim => Need::Typed,
            };
            (n.group_resource.clone(), need)
        })
        .collect();
    let claims_map_it = plan
        .needs
        .iter()
        .any(|n| n.projection == Projection::ResourceClaim)
        && plan.evaluators.contains(&Evaluator::ResourceClaims)
        && key.starts_with(REQUESTS_PREFIX);
    if claims_map_it {
        needs.push((device_classes(), Need::Typed));
    }
    needs
}

/// The resources whose changes replenish a quota that has `key` in `status.hard`: those of
/// every evaluator matching the key, whatever the scopes (upstream's `replenishQuota`).
pub fn replenished_by(key: &str, gates: FeatureGates) -> Vec<GroupResource> {
    plan_key(key, &QuotaScopes::none(), gates)
        .evaluators
        .iter()
        .map(lazyquota_quota::Evaluator::group_resource)
        .collect()
}

#[cfg(test)]
mod tests {
    use lazyquota_quota::scope::ScopeRequirement;

    use super::*;

    fn scopes(names: &[&str]) -> QuotaScopes {
        QuotaScopes::from_requirements(names.iter().map(|s| ScopeRequirement::from_scope(s)).collect())
    }

    /// The one need of a key on 1.35 (before `DRAExtendedResource`, which adds claims and
    /// DeviceClasses to every `requests.<extended>` key; see the test below).
    fn one(key: &str, names: &[&str]) -> Option<(String, Need)> {
        let mut needs = needs(key, &scopes(names), FeatureGates::for_minor(35));
        assert!(needs.len() <= 1, "{key}: {needs:?}");
        needs.pop().map(|(r, n)| (r.object_count_name(), n))
    }

    #[test]
    fn keys_map_to_the_resources_upstream_evaluators_read() {
        let rows: &[(&str, &str, Need)] = &[
            ("pods", "count/pods", Need::Typed),
            ("requests.cpu", "count/pods", Need::Typed),
            ("limits.memory", "count/pods", Need::Typed),
            ("hugepages-2Mi", "count/pods", Need::Typed),
            ("requests.nvidia.com/gpu", "count/pods", Need::Typed),
            ("count/pods", "count/pods", Need::Count),
            ("services.nodeports", "count/services", Need::Typed),
            ("services", "count/services", Need::Count),
            ("count/services", "count/services", Need::Count),
            ("requests.storage", "count/persistentvolumeclaims", Need::Typed),
            (
                "gold.storageclass.storage.k8s.io/persistentvolumeclaims",
                "count/persistentvolumeclaims",
                Need::Typed,
            ),
            (
                "persistentvolumeclaims",
                "count/persistentvolumeclaims",
                Need::Count,
            ),
            ("configmaps", "count/configmaps", Need::Count),
            (
                "count/widgets.example.io",
                "count/widgets.example.io",
                Need::Count,
            ),
            ("count/deployments.apps", "count/deployments.apps", Need::Count),
        ];
        for (key, resource, need) in rows {
            assert_eq!(one(key, &[]), Some(((*resource).to_owned(), *need)), "key {key}");
        }
    }

    #[test]
    fn dra_keys_need_claims_and_extended_ones_also_pods_and_device_classes() {
        let all = |key: &str, minor: u16| -> Vec<(String, Need)> {
            needs(key, &QuotaScopes::none(), FeatureGates::for_minor(minor))
                .into_iter()
                .map(|(r, n)| (r.object_count_name(), n))
                .collect()
        };
        let claims = ("count/resourceclaims.resource.k8s.io".to_owned(), Need::Typed);
        let pods = ("count/pods".to_owned(), Need::Typed);
        let classes = ("count/deviceclasses.resource.k8s.io".to_owned(), Need::Typed);
        assert_eq!(
            all("count/resourceclaims.resource.k8s.io", 36),
            vec![("count/resourceclaims.resource.k8s.io".to_owned(), Need::Count)]
        );
        assert_eq!(
            all("gpu.deviceclass.resource.k8s.io/devices", 34),
            vec![claims.clone()]
        );
        assert_eq!(
            all("requests.nvidia.com/gpu", 36),
            vec![pods.clone(), claims.clone(), classes.clone()]
        );
        assert_eq!(
            all("requests.deviceclass.resource.kubernetes.io/gpu", 37),
            vec![pods.clone(), claims, classes]
        );
        assert_eq!(all("requests.nvidia.com/gpu", 35), vec![pods]);
        assert!(
            all("gpu.deviceclass.resource.k8s.io/devices", 33).is_empty(),
            "no resourceclaims evaluator without DynamicResourceAllocation (1.33)"
        );
        assert_eq!(
            all("count/resourceclaims.resource.k8s.io", 33),
            vec![("count/resourceclaims.resource.k8s.io".to_owned(), Need::Count)],
            "then a generic object count, as SyncMonitors adds one"
        );
        assert!(
            needs(
                "gpu.deviceclass.resource.k8s.io/devices",
                &scopes(&["BestEffort"]),
                FeatureGates::default()
            )
            .is_empty(),
            "claims match no scope"
        );
    }

    #[test]
    fn unmatched_keys_demand_nothing() {
        for key in [
            "limits.nvidia.com/gpu",
            "limits.hugepages-2Mi",
            "foo",
            "count/events",
        ] {
            assert_eq!(one(key, &[]), None, "key {key}");
        }
    }

    #[test]
    fn scopes_that_exclude_every_object_demand_no_watch() {
        assert_eq!(
            one("count/widgets.example.io", &["BestEffort"]),
            None,
            "count/* under a scope is 0"
        );
        assert_eq!(one("services", &["Terminating"]), None, "services match no scope");
        assert_eq!(
            one("pods", &["BestEffort"]),
            Some(("count/pods".into(), Need::Typed))
        );
        assert_eq!(
            one("count/pods", &["NotTerminating"]),
            Some(("count/pods".into(), Need::Typed))
        );
    }

    #[test]
    fn replenishment_follows_every_matching_evaluator() {
        let gates = FeatureGates::default();
        assert_eq!(
            replenished_by("configmaps", gates),
            vec![GroupResource::core("configmaps")]
        );
        assert_eq!(
            replenished_by("requests.cpu", gates),
            vec![GroupResource::core("pods")]
        );
        assert!(replenished_by("limits.nvidia.com/gpu", gates).is_empty());
    }
}
