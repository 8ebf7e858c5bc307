//! Evaluator matching, watch planning, update filters, spec parsing, status assembly,
//! projection sizes, and the namespace-sum property.

// Fixtures are JSON values built inline; tables of cases are long by nature.
#![allow(clippy::needless_pass_by_value, clippy::too_many_lines)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ResourceQuota, Service};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use lazyquota_quota::names::{self, QuotaResourceName, StorageClassResource};
use lazyquota_quota::{
    Evaluator, FeatureGates, Format, GroupResource, Interner, PodProjection, Projection, PvcProjection,
    Quantity, QuotaObject, QuotaScopes, QuotaSpec, Registry, ResourceList, ScopeRequirement,
    ServiceProjection, SpecProblem, Time, WatchNeed, assemble_status, calculate_usage, classify, plan_key,
    pod_update_triggers, pvc_update_triggers, service_update_triggers,
};
use proptest::prelude::*;
use serde_json::{Value, json};

const NOW: i64 = 1_767_225_600;

fn gates() -> FeatureGates {
    FeatureGates::default()
}

fn pod_projection(value: Value) -> PodProjection {
    let pod: Pod = serde_json::from_value(value).unwrap();
    PodProjection::from_pod(&pod, gates(), &Interner::new())
        .strict()
        .unwrap()
}

fn k8s(map: &[(&str, &str)]) -> BTreeMap<String, K8sQuantity> {
    map.iter()
        .map(|(k, v)| ((*k).to_owned(), K8sQuantity((*v).to_owned())))
        .collect()
}

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
fn registry_plan_and_merge_keep_previous_values_of_failed_evaluators() {
    let mut registry = Registry::new(gates());
    assert!(registry.add_discovered(GroupResource::new("example.io", "widgets")));
    assert!(
        !registry.add_discovered(GroupResource::core("pods")),
        "pods has a static evaluator"
    );
    assert!(
        !registry.add_discovered(GroupResource::core("events")),
        "events is ignored"
    );
    let plan = registry.plan(&["pods", "cpu", "services", "count/widgets.example.io", "foo"]);
    assert_eq!(
        plan.matched,
        ["count/widgets.example.io", "cpu", "pods", "services"]
    );
    let used = |pairs: &[(&str, &str)]| -> ResourceList {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Quantity::parse(v).unwrap()))
            .collect()
    };
    let results = vec![
        (Evaluator::Pods, Some(used(&[("pods", "2"), ("cpu", "1500m")]))),
        (Evaluator::Services, None),
        (
            Evaluator::ObjectCount(GroupResource::new("example.io", "widgets")),
            Some(used(&[("count/widgets.example.io", "4")])),
        ),
    ];
    let merged = plan.merge(&results);
    assert_eq!(
        merged,
        used(&[("pods", "2"), ("cpu", "1500m"), ("count/widgets.example.io", "4")])
    );

    // syncResourceQuota: the failed evaluator's key keeps its previous value, the unmatched
    // key keeps its previous (absent) value, keys removed from spec.hard disappear.
    let spec_hard = k8s(&[
        ("pods", "10"),
        ("cpu", "4"),
        ("services", "5"),
        ("count/widgets.example.io", "9"),
        ("foo", "1"),
    ]);
    let status_used = k8s(&[("pods", "1"), ("services", "3"), ("memory", "1Gi")]);
    let decision = assemble_status(Some(&spec_hard), Some(&spec_hard), Some(&status_used), &merged);
    assert_eq!(decision.hard, spec_hard);
    assert_eq!(
        decision.used,
        k8s(&[
            ("pods", "2"),
            ("cpu", "1500m"),
            ("services", "3"),
            ("count/widgets.example.io", "4")
        ])
    );
    assert!(decision.dirty);
}

#[test]
fn status_dirty_rules() {
    type List = Option<BTreeMap<String, K8sQuantity>>;
    let hard = k8s(&[("pods", "10")]);
    let rows: Vec<(&str, List, List, &str, bool)> = vec![
        (
            "unchanged: not dirty",
            Some(hard.clone()),
            Some(k8s(&[("pods", "2")])),
            "2",
            false,
        ),
        (
            "format-only change is not dirty",
            Some(hard.clone()),
            Some(k8s(&[("pods", "2000m")])),
            "2",
            false,
        ),
        (
            "hard value compared by value",
            Some(k8s(&[("pods", "10000m")])),
            Some(k8s(&[("pods", "2")])),
            "2",
            false,
        ),
        (
            "used value changed",
            Some(hard.clone()),
            Some(k8s(&[("pods", "1")])),
            "2",
            true,
        ),
        (
            "status.hard differs from spec.hard",
            Some(k8s(&[("pods", "5")])),
            Some(k8s(&[("pods", "2")])),
            "2",
            true,
        ),
        ("status.hard nil", None, Some(k8s(&[("pods", "2")])), "2", true),
        ("status.used nil", Some(hard.clone()), None, "2", true),
    ];
    for (rule, status_hard, status_used, computed, dirty) in rows {
        let usage: ResourceList = [("pods".to_owned(), Quantity::parse(computed).unwrap())].into();
        let decision = assemble_status(Some(&hard), status_hard.as_ref(), status_used.as_ref(), &usage);
        assert_eq!(decision.dirty, dirty, "{rule}");
    }
    // Empty hard (or empty used) reads back as nil: dirty on every sync.
    let empty = BTreeMap::new();
    let decision = assemble_status(Some(&empty), Some(&empty), Some(&empty), &ResourceList::new());
    assert!(decision.dirty);
    assert!(decision.used.is_empty());
    // Kept previous values are copied verbatim, computed ones are canonical.
    let decision = assemble_status(
        Some(&k8s(&[("a", "1"), ("b", "1")])),
        None,
        Some(&k8s(&[("a", "1.500")])),
        &[("b".to_owned(), Quantity::parse("1536Mi").unwrap())].into(),
    );
    assert_eq!(decision.used, k8s(&[("a", "1.500"), ("b", "1536Mi")]));
}

#[test]
fn spec_parsing_reports_each_culprit() {
    let rq: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "q"},
        "spec": {
            "hard": {"pods": "10", "cpu": "4x", "memory": "1Gi"},
            "scopes": ["BestEffort", "NotBestEffort", "Bogus", "PriorityClass"],
            "scopeSelector": {"matchExpressions": [
                {"scopeName": "PriorityClass", "operator": "In"},
                {"scopeName": "PriorityClass", "operator": "Near", "values": ["x"]},
                {"scopeName": "Terminating", "operator": "In", "values": ["x"]},
                {"scopeName": "PriorityClass", "operator": "NotIn", "values": ["ok"]},
                {"scopeName": "PriorityClass", "operator": ""}]}
        }
    }))
    .unwrap();
    let spec = QuotaSpec::from_resource_quota(&rq);
    assert_eq!(spec.hard_keys.len(), 3, "the bad key is still computed");
    assert_eq!(spec.hard.len(), 2);
    assert_eq!(
        spec.scopes.requirements().len(),
        9,
        "kept even when invalid, like upstream"
    );
    let messages: Vec<String> = spec.problems.iter().map(ToString::to_string).collect();
    assert!(matches!(&spec.problems[0], SpecProblem::HardQuantity { key, .. } if key == "cpu"));
    assert!(messages[0].contains("\"4x\""), "{messages:?}");
    for needle in [
        "Bogus",
        "without an operator",
        "can't be empty",
        "\"Near\"",
        "only supports the Exists",
        "conflicting",
    ] {
        assert!(
            messages.iter().any(|m| m.contains(needle)),
            "{needle}: {messages:?}"
        );
    }
    assert_eq!(spec.problems.len(), 7, "{messages:?}");
}

#[test]
fn update_filter_table() {
    let base = |extra: Value, status: Value| {
        let mut spec = json!({"containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}}}]});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        json!({"metadata": {"name": "p"}, "spec": spec, "status": status})
    };
    let with_status_resources = |cpu: Option<&str>| {
        let mut cs = json!({"name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0});
        if let Some(cpu) = cpu {
            cs["resources"] = json!({"requests": {"cpu": cpu}});
        }
        base(json!({}), json!({"phase": "Running", "containerStatuses": [cs]}))
    };
    let deleting = |grace_end: i64| {
        let mut p = base(json!({}), json!({"phase": "Running"}));
        p["metadata"]["deletionTimestamp"] = json!(
            k8s_openapi::jiff::Timestamp::from_second(grace_end - 30)
                .unwrap()
                .to_string()
        );
        p["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        p
    };
    let running = base(json!({}), json!({"phase": "Running"}));
    let rows: Vec<(&str, Value, Value, bool)> = vec![
        ("no change", running.clone(), running.clone(), false),
        (
            "charged -> Succeeded",
            running.clone(),
            base(json!({}), json!({"phase": "Succeeded"})),
            true,
        ),
        (
            "charged -> Failed",
            running.clone(),
            base(json!({}), json!({"phase": "Failed"})),
            true,
        ),
        (
            "Succeeded -> Succeeded",
            base(json!({}), json!({"phase": "Succeeded"})),
            base(json!({}), json!({"phase": "Succeeded"})),
            false,
        ),
        (
            "deletion started, grace not over",
            running.clone(),
            deleting(NOW + 10),
            false,
        ),
        (
            "deletion past grace at event time",
            running.clone(),
            deleting(NOW - 10),
            true,
        ),
        (
            "activeDeadlineSeconds set: Terminating flips",
            running.clone(),
            base(json!({"activeDeadlineSeconds": 60}), json!({"phase": "Running"})),
            true,
        ),
        (
            "status resources appear for the first time",
            with_status_resources(None),
            with_status_resources(Some("1")),
            true,
        ),
        (
            "status resources change",
            with_status_resources(Some("1")),
            with_status_resources(Some("2")),
            true,
        ),
        (
            "status resources equal by value",
            with_status_resources(Some("1")),
            with_status_resources(Some("1000m")),
            false,
        ),
        (
            "new container status without resources",
            running.clone(),
            with_status_resources(None),
            false,
        ),
        (
            "new container status with resources",
            running.clone(),
            with_status_resources(Some("1")),
            true,
        ),
        (
            "spec request change alone does not trigger",
            running.clone(),
            base(
                json!({"containers": [{"name": "app", "resources": {"requests": {"cpu": "2"}}}]}),
                json!({"phase": "Running"}),
            ),
            false,
        ),
    ];
    let now = Time::from_unix_seconds(NOW);
    for (rule, old, new, expected) in rows {
        let (old, new) = (pod_projection(old), pod_projection(new));
        assert_eq!(
            pod_update_triggers(&old, &new, now, gates()),
            expected,
            "pods: {rule}"
        );
    }
    let mut no_ippvs = gates();
    no_ippvs.in_place_pod_vertical_scaling = false;
    let interner = Interner::new();
    let project = |v: Value| {
        PodProjection::from_pod(&serde_json::from_value::<Pod>(v).unwrap(), no_ippvs, &interner)
            .strict()
            .unwrap()
    };
    assert!(!pod_update_triggers(
        &project(with_status_resources(Some("1"))),
        &project(with_status_resources(Some("2"))),
        now,
        no_ippvs
    ));

    let svc = |spec: Value| {
        ServiceProjection::from_service(
            &serde_json::from_value::<Service>(json!({"metadata": {}, "spec": spec})).unwrap(),
        )
    };
    let rows = vec![
        (
            "ClusterIP -> NodePort",
            json!({"type": "ClusterIP"}),
            json!({"type": "NodePort"}),
            true,
        ),
        (
            "NodePort -> LoadBalancer",
            json!({"type": "NodePort"}),
            json!({"type": "LoadBalancer"}),
            true,
        ),
        (
            "ClusterIP -> ExternalName (both untracked)",
            json!({"type": "ClusterIP"}),
            json!({"type": "ExternalName"}),
            false,
        ),
        (
            "port count change does not trigger",
            json!({"type": "NodePort", "ports": [{"port": 1}]}),
            json!({"type": "NodePort", "ports": [{"port": 1}, {"port": 2}]}),
            false,
        ),
        (
            "allocateLoadBalancerNodePorts change does not trigger",
            json!({"type": "LoadBalancer"}),
            json!({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false}),
            false,
        ),
    ];
    for (rule, old, new, expected) in rows {
        assert_eq!(
            service_update_triggers(&svc(old), &svc(new)),
            expected,
            "services: {rule}"
        );
    }
    let claim = PvcProjection::from_pvc(&PersistentVolumeClaim::default(), &interner)
        .strict()
        .unwrap();
    assert!(
        pvc_update_triggers(&claim, &claim),
        "PVC updates always trigger (pointer comparison bug)"
    );
}

#[test]
fn scope_error_returns_the_partial_sum() {
    // Upstream stops at the first object whose scope cannot be evaluated and returns what it
    // has so far (zeros here) as success.
    let pods = [
        pod_projection(json!({"metadata": {}, "spec": {"containers": [{"name": "a"}]}})),
        pod_projection(json!({"metadata": {}, "spec": {"containers": [{"name": "a"}]}})),
    ];
    // (A `spec.scopes` entry is evaluated as `Exists`; only an expression without operator,
    // which validation rejects, fails the selector conversion.)
    let no_operator = json!({"matchExpressions": [{"scopeName": "PriorityClass", "operator": ""}]});
    let scopes = QuotaScopes::from_k8s(None, Some(&serde_json::from_value(no_operator).unwrap()));
    let stats = calculate_usage(&["pods"], &scopes, &pods, Time::from_unix_seconds(NOW), gates());
    assert!(stats.scope_error.is_some());
    assert_eq!(stats.used["pods"], Quantity::zero(Format::DecimalSI));
    // A value that is no valid label value fails the selector conversion too.
    let long = "x".repeat(64);
    let scopes = QuotaScopes::from_k8s(
        None,
        Some(&serde_json::from_value(json!({"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": [long]}]})).unwrap()),
    );
    assert!(
        calculate_usage(&["pods"], &scopes, &pods, Time::from_unix_seconds(NOW), gates())
            .scope_error
            .is_some()
    );
}

#[test]
fn projection_sizes() {
    use std::mem::size_of;
    assert_eq!(size_of::<Option<lazyquota_quota::CompactQuantity>>(), 16);
    assert_eq!(size_of::<PodProjection>(), 168);
    assert_eq!(size_of::<lazyquota_quota::ClaimProjection>(), 24);
    assert_eq!(size_of::<ServiceProjection>(), 8);
    assert_eq!(size_of::<PvcProjection>(), 48);
    // A typical running pod: two containers with cpu/memory requests and limits, a priority
    // class, status resources reported by the kubelet (InPlacePodVerticalScaling).
    let resources =
        json!({"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}});
    let status = |name: &str| {
        json!({"name": name, "image": "i", "imageID": "", "ready": true, "restartCount": 0,
        "allocatedResources": {"cpu": "250m", "memory": "256Mi"}, "resources": resources.clone()})
    };
    let pod = pod_projection(json!({
        "metadata": {"name": "p"},
        "spec": {"priorityClassName": "high", "containers": [
            {"name": "app", "resources": resources.clone()}, {"name": "proxy", "resources": resources.clone()}]},
        "status": {"phase": "Running", "qosClass": "Burstable", "containerStatuses": [status("app"), status("proxy")]}
    }));
    let total = size_of::<PodProjection>() + pod.heap_bytes();
    assert_eq!(pod.heap_bytes(), 32);
    assert!(total <= 256, "typical pod takes {total} bytes");
    let interner = Interner::new();
    let claim: PersistentVolumeClaim =
        serde_json::from_value(json!({"metadata": {}, "spec": {"storageClassName": "gold",
        "resources": {"requests": {"storage": "10Gi"}}}}))
        .unwrap();
    assert_eq!(
        PvcProjection::from_pvc(&claim, &interner)
            .strict()
            .unwrap()
            .heap_bytes(),
        0
    );
}

#[test]
fn extraction_errors_name_the_field_and_value() {
    let pod: Pod = serde_json::from_value(json!({"metadata": {}, "spec": {"containers": [
        {"name": "app", "resources": {"requests": {"cpu": "lots"}}}]}}))
    .unwrap();
    let err = PodProjection::from_pod(&pod, gates(), &Interner::new())
        .strict()
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("spec.containers[app].resources.requests[cpu]"),
        "{message}"
    );
    assert!(message.contains("\"lots\""), "{message}");
}

/// A tenant's quantity beyond what lazyquota holds (`1e2000`, which the apiserver accepts)
/// must not drop the pod — that would let it exceed `pods` — nor lower a sum: the pod counts,
/// the sums it enters are unknown, and the status withholds those keys (absent, so quota
/// admission refuses to charge them) instead of writing a lower value.
#[test]
fn a_pod_beyond_range_still_counts_and_its_sums_are_withheld_never_lowered() {
    let pod: Pod = serde_json::from_value(json!({"metadata": {}, "spec": {"containers": [
        {"name": "app", "resources": {"requests": {"memory": "1e2000", "cpu": "1"}}}]}}))
    .unwrap();
    let extracted = PodProjection::from_pod(&pod, gates(), &Interner::new());
    assert_eq!(extracted.problems.len(), 1, "{:?}", extracted.problems);
    assert!(extracted.problems[0].field.contains("requests[memory]"));
    let other = pod_projection(json!({"metadata": {}, "spec": {"containers": [
        {"name": "app", "resources": {"requests": {"memory": "64Mi", "cpu": "500m"}}}]}}));
    let pods = [extracted.projection, other];
    let keys = ["pods", "requests.memory", "requests.cpu"];
    let stats = calculate_usage(
        &keys,
        &QuotaScopes::none(),
        &pods,
        Time::from_unix_seconds(NOW),
        gates(),
    );
    assert_eq!(stats.used["pods"], Quantity::from_count(2), "both pods count");
    assert_eq!(
        stats.used["requests.cpu"].to_string(),
        "1500m",
        "other sums stay exact"
    );
    assert!(stats.used["requests.memory"].is_unknown());
    let hard: BTreeMap<String, K8sQuantity> = keys
        .iter()
        .map(|k| ((*k).to_owned(), K8sQuantity("1E40".into())))
        .collect();
    let before: BTreeMap<String, K8sQuantity> =
        [("requests.memory".to_owned(), K8sQuantity("64Mi".into()))].into();
    let decision = assemble_status(Some(&hard), Some(&hard), Some(&before), &stats.used);
    assert_eq!(decision.withheld, vec!["requests.memory".to_owned()]);
    assert!(
        !decision.used.contains_key("requests.memory"),
        "withheld, not the old 64Mi"
    );
    assert_eq!(decision.used["pods"].0, "2");
    assert!(decision.dirty);
}

#[test]
fn pod_projection_accessors() {
    let pod = pod_projection(
        json!({"metadata": {}, "spec": {"priorityClassName": "high", "containers": [
        {"name": "app", "resources": {"requests": {"cpu": "1", "hugepages-2Mi": "2Mi", "example.com/fpga": "1"},
            "limits": {"cpu": "2"}}}]}}),
    );
    assert_eq!(pod.request("cpu"), Some(Quantity::parse("1").unwrap()));
    assert_eq!(
        pod.request("hugepages-2Mi"),
        Some(Quantity::parse("2Mi").unwrap())
    );
    assert_eq!(pod.limit("cpu"), Some(Quantity::parse("2").unwrap()));
    assert_eq!(pod.priority_class(), Some("high"));
    let usage = pod.usage(Time::from_unix_seconds(NOW));
    let keys: Vec<&str> = usage.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "count/pods",
            "cpu",
            "hugepages-2Mi",
            "limits.cpu",
            "pods",
            "requests.cpu",
            "requests.example.com/fpga",
            "requests.hugepages-2Mi"
        ]
    );
}

fn cpu_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u32..4000).prop_map(|m| format!("{m}m")),
        (0u32..8).prop_map(|c| c.to_string()),
        (1u32..2048).prop_map(|m| format!("{m}Mi")),
        (1u32..2000).prop_map(|k| format!("{k}k")),
    ]
}

proptest! {
    #[test]
    fn namespace_usage_is_the_sum_of_object_usage(
        pods in proptest::collection::vec((cpu_strategy(), cpu_strategy(), any::<bool>(), any::<bool>()), 0..12),
    ) {
        let projections: Vec<PodProjection> = pods
            .iter()
            .map(|(cpu, memory, terminal, deadline)| {
                let mut spec = json!({"containers": [{"name": "a", "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}}}]});
                if *deadline {
                    spec["activeDeadlineSeconds"] = json!(5);
                }
                let phase = if *terminal { "Succeeded" } else { "Running" };
                pod_projection(json!({"metadata": {}, "spec": spec, "status": {"phase": phase}}))
            })
            .collect();
        let keys = ["pods", "count/pods", "cpu", "requests.memory", "limits.memory", "limits.cpu"];
        let now = Time::from_unix_seconds(NOW);
        for scopes in [QuotaScopes::none(), QuotaScopes::from_requirements(vec![ScopeRequirement::from_scope("NotTerminating")])] {
            let stats = calculate_usage(&keys, &scopes, &projections, now, gates());
            let mut expected: ResourceList = keys.iter().map(|k| ((*k).to_owned(), Quantity::zero(Format::DecimalSI))).collect();
            for p in &projections {
                if !p.matches_scopes(&scopes, gates()).unwrap() {
                    continue;
                }
                for (key, q) in p.usage(now) {
                    if let Some(acc) = expected.get_mut(&key) {
                        *acc += q;
                    }
                }
            }
            prop_assert_eq!(&stats.used, &expected);
            for (key, q) in &stats.used {
                prop_assert_eq!(q.to_string(), expected[key].to_string());
            }
        }
    }
}
