//! Fixtures shared by the engine benchmarks (`heap`, `throughput`).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        Container, ContainerStatus, Pod, PodSpec, PodStatus, ResourceQuota, ResourceQuotaSpec,
        ResourceRequirements,
    },
    apimachinery::pkg::{api::resource::Quantity as K8sQuantity, apis::meta::v1::ObjectMeta},
};
use lazyquota_index::{keys::GroupResource, resolver::ServedResource};

/// A resource list from (name, quantity) pairs.
pub fn list(pairs: &[(&str, &str)]) -> BTreeMap<String, K8sQuantity> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), K8sQuantity((*v).to_owned())))
        .collect()
}

/// cpu/memory requests and limits.
pub fn requirements(requests: [&str; 2], limits: [&str; 2]) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(list(&[("cpu", requests[0]), ("memory", requests[1])])),
        limits: Some(list(&[("cpu", limits[0]), ("memory", limits[1])])),
        ..ResourceRequirements::default()
    }
}

/// A running Burstable pod: an app container and a proxy sidecar with cpu/memory requests
/// and limits, a priority class, and container statuses with allocated and actuated
/// resources.
pub fn pod(app_requests: [&str; 2], app_limits: [&str; 2], priority_class: &str) -> Pod {
    let containers = [
        ("app", app_requests, app_limits),
        ("proxy", ["50m", "64Mi"], ["200m", "128Mi"]),
    ];
    Pod {
        metadata: ObjectMeta {
            name: Some("web-7d9f8b6c5d-x2k4q".to_owned()),
            namespace: Some("team-000".to_owned()),
            labels: Some(BTreeMap::from([
                ("app".to_owned(), "web".to_owned()),
                ("pod-template-hash".to_owned(), "7d9f8b6c5d".to_owned()),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: containers
                .iter()
                .map(|(name, requests, limits)| Container {
                    name: (*name).to_owned(),
                    image: Some(format!("registry.example/{name}:1.4.2")),
                    resources: Some(requirements(*requests, *limits)),
                    ..Container::default()
                })
                .collect(),
            priority_class_name: Some(priority_class.to_owned()),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".to_owned()),
            qos_class: Some("Burstable".to_owned()),
            container_statuses: Some(
                containers
                    .iter()
                    .map(|(name, requests, limits)| ContainerStatus {
                        name: (*name).to_owned(),
                        ready: true,
                        allocated_resources: Some(list(&[("cpu", requests[0]), ("memory", requests[1])])),
                        resources: Some(requirements(*requests, *limits)),
                        ..ContainerStatus::default()
                    })
                    .collect(),
            ),
            ..PodStatus::default()
        }),
    }
}

/// A namespaced, quotable served resource.
pub fn served(resource: GroupResource, kind: &str) -> ServedResource {
    ServedResource {
        resource,
        version: "v1".to_owned(),
        kind: kind.to_owned(),
        namespaced: true,
        verbs: ["create", "delete", "get", "list", "patch", "update", "watch"]
            .map(String::from)
            .to_vec(),
    }
}

/// A ResourceQuota as the apiserver serves it (with a resourceVersion and a uid).
pub fn quota(namespace: &str, name: &str, hard: &[(&str, &str)]) -> ResourceQuota {
    ResourceQuota {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            resource_version: Some("4242".to_owned()),
            uid: Some(format!("uid-{namespace}-{name}")),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(list(hard)),
            ..ResourceQuotaSpec::default()
        }),
        status: None,
    }
}
