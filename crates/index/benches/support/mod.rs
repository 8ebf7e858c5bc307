//! Fixtures shared by the engine benchmarks (`heap`, `throughput`).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        Container, ContainerStatus, Pod, PodSpec, PodStatus, ResourceQuota, ResourceQuotaSpec,
        ResourceRequirements,
    },
    apimachinery::pkg::{api::resource::Quantity as K8sQuantity, apis::meta::v1::ObjectMeta},
};
use lazyquota_index::{
    engine::{Engine, StoreKind, store_kind},
    keys::GroupResource,
    policy::DemandChange,
    resolver::ServedResource,
    store::PartitionKey,
};

/// Holds every partition `changes` (a quota update's demand changes) ask for, as the
/// controller does; returns each with its store.
pub fn hold_demanded(engine: &mut Engine, changes: Vec<DemandChange>) -> Vec<(StoreKind, PartitionKey)> {
    let mut held = Vec::new();
    for change in changes {
        let Some(need) = change.to else { continue };
        let kind = store_kind(&change.resource, need);
        let p = PartitionKey {
            cluster: change.cluster,
            resource: change.resource,
            namespace: change.namespace,
        };
        engine.hold(kind, p.clone());
        held.push((kind, p));
    }
    held
}

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

/// `1234567` → `1,234,567`.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
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

/// What discovery of a kcp v0.32.3 workspace returns, as (group, version, plural, kind,
/// namespaced, verbs): the root workspace's 40 types (`kubectl api-resources -o wide` against
/// the shard the tests build), before any APIBinding.
#[allow(dead_code)] // the heap benchmark's, not the throughput one's
const KCP_WORKSPACE_TYPES: &[(&str, &str, &str, &str, bool, &str)] = &[
    (
        "",
        "v1",
        "configmaps",
        "ConfigMap",
        true,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "",
        "v1",
        "events",
        "Event",
        true,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "",
        "v1",
        "namespaces",
        "Namespace",
        false,
        "create,delete,get,list,patch,update,watch",
    ),
    (
        "",
        "v1",
        "resourcequotas",
        "ResourceQuota",
        true,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "",
        "v1",
        "secrets",
        "Secret",
        true,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        true,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "mutatingadmissionpolicies",
        "MutatingAdmissionPolicy",
        false,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "mutatingadmissionpolicybindings",
        "MutatingAdmissionPolicyBinding",
        false,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        false,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
        "ValidatingAdmissionPolicy",
        false,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicybindings",
        "ValidatingAdmissionPolicyBinding",
        false,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        false,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "apis.kcp.io",
        "v1alpha2",
        "apibindings",
        "APIBinding",
        false,
        "delete,deletecollection,get,list,patch,create,update,watch",
    ),
    (
        "apis.kcp.io",
        "v1alpha1",
        "apiconversions",
        "APIConversion",
        false,
        "delete,deletecollection,get,list,patch,create,update,watch",
    ),
    (
        "apis.kcp.io",
        "v1alpha1",
        "apiexportendpointslices",
        "APIExportEndpointSlice",
        false,
        "delete,deletecollection,get,list,patch,create,update,watch",
    ),
    (
        "apis.kcp.io",
        "v1alpha2",
        "apiexports",
        "APIExport",
        false,
        "delete,deletecollection,get,list,patch,create,update,watch",
    ),
    (
        "apis.kcp.io",
        "v1alpha1",
        "apiresourceschemas",
        "APIResourceSchema",
        false,
        "delete,deletecollection,get,list,patch,create,update,watch",
    ),
    (
        "authentication.k8s.io",
        "v1",
        "selfsubjectreviews",
        "SelfSubjectReview",
        false,
        "create",
    ),
    (
        "authentication.k8s.io",
        "v1",
        "tokenreviews",
        "TokenReview",
        false,
        "create",
    ),
    (
        "authorization.k8s.io",
        "v1",
        "localsubjectaccessreviews",
        "LocalSubjectAccessReview",
        true,
        "create",
    ),
    (
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
        false,
        "create",
    ),
    (
        "authorization.k8s.io",
        "v1",
        "selfsubjectrulesreviews",
        "SelfSubjectRulesReview",
        false,
        "create",
    ),
    (
        "authorization.k8s.io",
        "v1",
        "subjectaccessreviews",
        "SubjectAccessReview",
        false,
        "create",
    ),
    (
        "cache.kcp.io",
        "v1alpha1",
        "cachedresourceendpointslices",
        "CachedResourceEndpointSlice",
        false,
        "delete,deletecollection,get,list,patch,create,update,watch",
    ),
    (
        "cache.kcp.io",
        "v1alpha1",
        "cachedresources",
        "CachedResource",
        false,
        "delete,deletecollection,get,list,patch,create,update,watch",
    ),
    (
        "certificates.k8s.io",
        "v1",
        "certificatesigningrequests",
        "CertificateSigningRequest",
        false,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "coordination.k8s.io",
        "v1",
        "leases",
        "Lease",
        true,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "core.kcp.io",
        "v1alpha1",
        "logicalclusters",
        "LogicalCluster",
        false,
        "delete,deletecollection,get,list,patch,create,update,watch",
    ),
    (
        "core.kcp.io",
        "v1alpha1",
        "shards",
        "Shard",
        false,
        "delete,deletecollection,get,list,patch,create,update,watch",
    ),
    (
        "events.k8s.io",
        "v1",
        "events",
        "Event",
        true,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        false,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "RoleBinding",
        true,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "Role",
        true,
        "create,delete,deletecollection,get,list,patch,update,watch",
    ),
    (
        "tenancy.kcp.io",
        "v1alpha1",
        "workspaceauthenticationconfigurations",
        "WorkspaceAuthenticationConfiguration",
        false,
        "delete,deletecollection,get,list,patch,create,update,watch",
    ),
    (
        "tenancy.kcp.io",
        "v1alpha1",
        "workspaces",
        "Workspace",
        false,
        "delete,deletecollection,get,list,patch,create,update,watch",
    ),
    (
        "tenancy.kcp.io",
        "v1alpha1",
        "workspacetypes",
        "WorkspaceType",
        false,
        "delete,deletecollection,get,list,patch,create,update,watch",
    ),
    (
        "topology.kcp.io",
        "v1alpha1",
        "partitions",
        "Partition",
        false,
        "delete,deletecollection,get,list,patch,create,update,watch",
    ),
    (
        "topology.kcp.io",
        "v1alpha1",
        "partitionsets",
        "PartitionSet",
        false,
        "delete,deletecollection,get,list,patch,create,update,watch",
    ),
];

/// A kcp workspace's served types: its own and, bound through APIBindings, `bound`.
#[allow(dead_code)] // the heap benchmark's, not the throughput one's
pub fn kcp_workspace(bound: &[GroupResource]) -> Vec<ServedResource> {
    let own =
        KCP_WORKSPACE_TYPES.iter().map(
            |(group, version, plural, kind, namespaced, verbs)| ServedResource {
                resource: GroupResource::new(*group, *plural),
                version: (*version).to_owned(),
                kind: (*kind).to_owned(),
                namespaced: *namespaced,
                verbs: verbs.split(',').map(str::to_owned).collect(),
            },
        );
    let bound = bound.iter().map(|r| served(r.clone(), "Widget"));
    own.chain(bound).collect()
}
