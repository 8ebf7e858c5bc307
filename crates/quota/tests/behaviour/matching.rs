//! Which evaluator matches which resource and key, and what each needs watched.

use super::*;

#[test]
fn feature_gate_defaults_are_v1_36() {
    let g = FeatureGates::default();
    assert!(g.in_place_pod_vertical_scaling);
    assert!(g.pod_level_resources);
    assert!(g.in_place_pod_level_resources_vertical_scaling);
    assert!(g.volume_attributes_class);
    assert!(g.dynamic_resource_allocation);
    assert!(g.dra_extended_resource);
    assert!(!g.dra_node_allocatable_resources);
}

#[test]
fn matching_resources_table() {
    let input = [
        "pods",
        "count/pods",
        "cpu",
        "limits.memory",
        "hugepages-1Gi",
        "requests.hugepages-1Gi",
        "limits.hugepages-1Gi",
        "requests.example.com/fpga",
        "limits.example.com/fpga",
        "example.com/fpga",
        "requests.kubernetes.io/foo",
        "requests.deviceclass.resource.kubernetes.io/gpu",
        "services",
        "services.nodeports",
        "count/services",
        "requests.storage",
        "persistentvolumeclaims",
        "count/persistentvolumeclaims",
        "gold.storageclass.storage.k8s.io/requests.storage",
        "gold.storageclass.storage.k8s.io/persistentvolumeclaims",
        "gold.storageclass.storage.k8s.io/limits.storage",
        "configmaps",
        "count/configmaps",
        "count/widgets.example.io",
        "count/resourceclaims.resource.k8s.io",
        "gpu.deviceclass.resource.k8s.io/devices",
    ];
    let rows: Vec<(&str, Evaluator, Vec<&str>)> = vec![
        (
            "pods evaluator: fixed names sorted, then prefixes and requests.<ext> in input order",
            Evaluator::Pods,
            vec![
                "count/pods",
                "cpu",
                "limits.memory",
                "pods",
                "hugepages-1Gi",
                "requests.hugepages-1Gi",
                "requests.example.com/fpga",
                "requests.deviceclass.resource.kubernetes.io/gpu",
            ],
        ),
        (
            "services evaluator",
            Evaluator::Services,
            vec!["count/services", "services", "services.nodeports"],
        ),
        (
            "PVC evaluator, including storage-class scoped names",
            Evaluator::PersistentVolumeClaims,
            vec![
                "requests.storage",
                "persistentvolumeclaims",
                "count/persistentvolumeclaims",
                "gold.storageclass.storage.k8s.io/requests.storage",
                "gold.storageclass.storage.k8s.io/persistentvolumeclaims",
            ],
        ),
        (
            "legacy object count: count name and bare alias",
            Evaluator::ObjectCount(GroupResource::core("configmaps")),
            vec!["configmaps", "count/configmaps"],
        ),
        (
            "generic object count",
            Evaluator::ObjectCount(GroupResource::new("example.io", "widgets")),
            vec!["count/widgets.example.io"],
        ),
        (
            "resourceclaims evaluator without DeviceClasses: every name it could match",
            Evaluator::ResourceClaims,
            vec![
                "requests.example.com/fpga",
                "requests.deviceclass.resource.kubernetes.io/gpu",
                "count/resourceclaims.resource.k8s.io",
                "gpu.deviceclass.resource.k8s.io/devices",
            ],
        ),
    ];
    for (rule, evaluator, expected) in rows {
        assert_eq!(evaluator.matching_resources(&input, gates()), expected, "{rule}");
    }
}

#[test]
fn classification_table() {
    let rows: Vec<(&str, QuotaResourceName<'_>)> = vec![
        ("requests.cpu", QuotaResourceName::Standard("requests.cpu")),
        ("hugepages-2Mi", QuotaResourceName::HugePages("2Mi")),
        (
            "requests.hugepages-2Mi",
            QuotaResourceName::RequestsHugePages("2Mi"),
        ),
        ("limits.hugepages-2Mi", QuotaResourceName::LimitsHugePages("2Mi")),
        (
            "count/pods",
            QuotaResourceName::ObjectCount(GroupResource::core("pods")),
        ),
        (
            "count/deployments.apps",
            QuotaResourceName::ObjectCount(GroupResource::new("apps", "deployments")),
        ),
        (
            "count/widgets.example.io",
            QuotaResourceName::ObjectCount(GroupResource::new("example.io", "widgets")),
        ),
        (
            "requests.nvidia.com/gpu",
            QuotaResourceName::RequestsExtended("nvidia.com/gpu"),
        ),
        (
            "limits.nvidia.com/gpu",
            QuotaResourceName::LimitsExtended("nvidia.com/gpu"),
        ),
        (
            "requests.deviceclass.resource.kubernetes.io/gpu",
            QuotaResourceName::RequestsDeviceClass("gpu"),
        ),
        (
            "gold.storageclass.storage.k8s.io/requests.storage",
            QuotaResourceName::StorageClass {
                class: "gold",
                resource: StorageClassResource::RequestsStorage,
            },
        ),
        (
            "gold.storageclass.storage.k8s.io/persistentvolumeclaims",
            QuotaResourceName::StorageClass {
                class: "gold",
                resource: StorageClassResource::PersistentVolumeClaims,
            },
        ),
        (
            "gpu.deviceclass.resource.k8s.io/devices",
            QuotaResourceName::DeviceClassDevices("gpu"),
        ),
        ("nvidia.com/gpu", QuotaResourceName::Other("nvidia.com/gpu")),
    ];
    for (name, expected) in rows {
        assert_eq!(classify(name), expected, "{name}");
    }
    assert!(names::is_extended_resource_name("nvidia.com/gpu"));
    assert!(!names::is_extended_resource_name("kubernetes.io/foo"));
    assert!(!names::is_extended_resource_name("requests.nvidia.com/gpu"));
    assert!(!names::is_extended_resource_name("Nvidia.com/gpu"));
    assert!(names::is_dra_extended_resource_name(
        "deviceclass.resource.kubernetes.io/gpu",
        35
    ));
    // Before 1.35 the implicit device-class names were native (kubernetes.io) names.
    assert!(!names::is_dra_extended_resource_name(
        "deviceclass.resource.kubernetes.io/gpu",
        34
    ));
    assert!(names::is_extended_resource_name_for_quota(
        "requests.deviceclass.resource.kubernetes.io/gpu",
        35
    ));
    assert!(!names::is_extended_resource_name_for_quota(
        "requests.deviceclass.resource.kubernetes.io/gpu",
        34
    ));
    assert!(names::is_ignored_resource(&GroupResource::new(
        "events.k8s.io",
        "events"
    )));
    assert!(names::is_standard_quota_resource_name("requests.hugepages-2Mi"));
    assert!(!names::is_standard_quota_resource_name("count/pods"));
    assert_eq!(
        GroupResource::new("apps", "deployments").object_count_name(),
        "count/deployments.apps"
    );
}

#[test]
fn watch_needs_table() {
    let none = QuotaScopes::none();
    let scoped = QuotaScopes::from_requirements(vec![ScopeRequirement::from_scope("NotTerminating")]);
    let need = |group: &str, resource: &str, projection| WatchNeed {
        group_resource: GroupResource::new(group, resource),
        projection,
    };
    let rows: Vec<(&str, &str, &QuotaScopes, Vec<WatchNeed>, bool)> = vec![
        (
            "pods needs the typed pod",
            "pods",
            &none,
            vec![need("", "pods", Projection::Pod)],
            true,
        ),
        (
            "count/pods counts every pod: metadata suffices",
            "count/pods",
            &none,
            vec![need("", "pods", Projection::Metadata)],
            true,
        ),
        (
            "count/pods under a scope needs pods for scope matching",
            "count/pods",
            &scoped,
            vec![need("", "pods", Projection::Pod)],
            true,
        ),
        (
            "requests.storage needs PVCs",
            "requests.storage",
            &none,
            vec![need(
                "",
                "persistentvolumeclaims",
                Projection::PersistentVolumeClaim,
            )],
            true,
        ),
        (
            "count/widgets.example.io watches example.io/widgets metadata",
            "count/widgets.example.io",
            &none,
            vec![need("example.io", "widgets", Projection::Metadata)],
            true,
        ),
        (
            "configmaps (legacy) watches configmaps metadata",
            "configmaps",
            &none,
            vec![need("", "configmaps", Projection::Metadata)],
            true,
        ),
        (
            "services.nodeports needs typed services",
            "services.nodeports",
            &none,
            vec![need("", "services", Projection::Service)],
            true,
        ),
        (
            "services under a scope is a constant 0",
            "services",
            &scoped,
            vec![],
            true,
        ),
        (
            "count/events is ignored: no evaluator",
            "count/events",
            &none,
            vec![],
            false,
        ),
        (
            "limits.nvidia.com/gpu has no evaluator",
            "limits.nvidia.com/gpu",
            &none,
            vec![],
            false,
        ),
    ];
    for (rule, key, scopes, needs, matched) in rows {
        let plan = plan_key(key, scopes, gates());
        assert_eq!(plan.needs, needs, "{rule}");
        assert_eq!(!plan.evaluators.is_empty(), matched, "{rule}");
    }
}

#[test]
fn a_key_is_counted_by_a_list_only_where_its_value_is_every_object_once() {
    let none = QuotaScopes::none();
    let scoped = QuotaScopes::from_k8s(Some(&["BestEffort".to_owned()]), None);
    let counted = |key: &str, scopes: &QuotaScopes| counted_by_list(key, scopes, gates());
    let widgets = GroupResource::new("example.io", "widgets");
    assert_eq!(counted("count/widgets.example.io", &none), Some(widgets));
    assert_eq!(
        counted("configmaps", &none),
        Some(GroupResource::core("configmaps"))
    );
    assert_eq!(counted("services", &none), Some(GroupResource::core("services")));
    // count/pods counts terminal pods too; pods does not.
    assert_eq!(counted("count/pods", &none), Some(GroupResource::core("pods")));
    assert_eq!(counted("pods", &none), None, "pods leaves terminal pods out");
    assert_eq!(counted("requests.cpu", &none), None, "a sum, not a count");
    assert_eq!(
        counted("services.loadbalancers", &none),
        None,
        "some services only"
    );
    assert_eq!(
        counted("count/pods", &scoped),
        None,
        "a scope matches some objects only"
    );
    assert_eq!(counted("count/events", &none), None, "no evaluator");
}
