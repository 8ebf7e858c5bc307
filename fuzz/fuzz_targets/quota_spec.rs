//! Arbitrary JSON as a ResourceQuota through the controller's whole sync path: spec parsing,
//! planning, usage over a few fixed objects (so arbitrary scopes and selectors are evaluated),
//! merge and status assembly. Nothing may panic, and the status keeps upstream's invariants.

#![no_main]

use std::sync::OnceLock;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ResourceQuota, Service};
use lazyquota_quota::{
    Evaluator, FeatureGates, GroupResource, Interner, PodProjection, PvcProjection, QuotaSpec, Registry,
    ServiceProjection, Time, assemble_status, assemble_status_for, calculate_object_count_usage,
    calculate_usage, classify, plan_key,
};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

struct Objects {
    pods: Vec<PodProjection>,
    services: Vec<ServiceProjection>,
    pvcs: Vec<PvcProjection>,
}

fn objects() -> &'static Objects {
    static OBJECTS: OnceLock<Objects> = OnceLock::new();
    OBJECTS.get_or_init(|| {
        let interner = Interner::new();
        let gates = FeatureGates::default();
        let pods = [
            json!({"spec": {"containers": [{"name": "a", "resources": {
                "requests": {"cpu": "250m", "memory": "64Mi", "example.com/foo": "1", "hugepages-2Mi": "2Mi"},
                "limits": {"cpu": "1", "memory": "128Mi", "example.com/foo": "1", "hugepages-2Mi": "2Mi"}}}],
                "priorityClassName": "high", "activeDeadlineSeconds": 30},
                "status": {"phase": "Running", "qosClass": "Burstable"}}),
            json!({"spec": {"containers": [{"name": "a"}], "affinity": {"podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "k", "namespaceSelector": {}}]}}},
                "status": {"phase": "Pending", "qosClass": "BestEffort"}}),
            json!({"spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}]},
                "status": {"phase": "Succeeded"}}),
        ];
        let pods = pods
            .into_iter()
            .map(|p| {
                let pod: Pod = serde_json::from_value(p).expect("fixed pod");
                PodProjection::from_pod(&pod, gates, &interner).expect("fixed pod projection")
            })
            .collect();
        let services = [
            json!({"spec": {"type": "NodePort", "ports": [{"port": 80}, {"port": 81}]}}),
            json!({"spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
                "ports": [{"port": 80, "nodePort": 30001}, {"port": 81}]}}),
        ]
        .into_iter()
        .map(|s| ServiceProjection::from_service(&serde_json::from_value::<Service>(s).expect("fixed service")))
        .collect();
        let pvcs = [
            json!({"metadata": {"annotations": {"volume.beta.kubernetes.io/storage-class": "gold"}},
                "spec": {"resources": {"requests": {"storage": "1.5Gi"}}, "volumeAttributesClassName": "fast"},
                "status": {"allocatedResources": {"storage": "2Gi"}}}),
            json!({"spec": {"storageClassName": "silver", "resources": {"requests": {"storage": "2500m"}}}}),
        ]
        .into_iter()
        .map(|c| {
            let pvc: PersistentVolumeClaim = serde_json::from_value(c).expect("fixed pvc");
            PvcProjection::from_pvc(&pvc, &interner).expect("fixed pvc projection")
        })
        .collect();
        Objects { pods, services, pvcs }
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(quota) = serde_json::from_slice::<ResourceQuota>(data) else {
        return;
    };
    let gates = FeatureGates::default();
    let objects = objects();
    let spec = QuotaSpec::from_resource_quota(&quota);
    let mut registry = Registry::new(gates);
    for (group, resource) in [("apps", "deployments"), ("", "serviceaccounts"), ("", "events")] {
        registry.add_discovered(GroupResource::new(group, resource));
    }
    let keys: Vec<&str> = spec.hard_keys.iter().map(String::as_str).collect();
    for key in &keys {
        let _ = classify(key);
        let _ = plan_key(key, &spec.scopes, gates);
    }
    let plan = registry.plan(&keys);
    let now = Time::from_unix_seconds(1_767_225_600);
    let results: Vec<_> = plan
        .per_evaluator
        .iter()
        .map(|(evaluator, requested)| {
            let used = match evaluator {
                Evaluator::Pods => calculate_usage(requested, &spec.scopes, &objects.pods, now, gates).used,
                Evaluator::Services => {
                    calculate_usage(requested, &spec.scopes, &objects.services, now, gates).used
                }
                Evaluator::PersistentVolumeClaims => {
                    calculate_usage(requested, &spec.scopes, &objects.pvcs, now, gates).used
                }
                Evaluator::ObjectCount(_) | Evaluator::ResourceClaims => {
                    calculate_object_count_usage(requested, &spec.scopes, 3)
                }
            };
            for key in used.keys() {
                assert!(
                    requested.contains(key),
                    "{evaluator:?} computed unrequested {key}"
                );
            }
            (evaluator.clone(), Some(used))
        })
        .collect();
    let usage = plan.merge(&results);
    for key in usage.keys() {
        assert!(plan.matched.contains(key), "merged usage has unmatched {key}");
    }
    let decision = assemble_status_for(&quota, &usage);
    let spec_hard = quota.spec.as_ref().and_then(|s| s.hard.as_ref());
    assert_eq!(Some(&decision.hard), spec_hard.or(Some(&Default::default())));
    for key in decision.used.keys() {
        assert!(
            spec.hard_keys.contains(key),
            "status.used has {key}, not in spec.hard"
        );
    }
    // Writing the decision and syncing again is a fixpoint: no further write is due.
    let again = assemble_status(
        Some(&decision.hard),
        Some(&decision.hard),
        Some(&decision.used),
        &usage,
    );
    assert_eq!(again.used, decision.used);
    assert!(
        !again.dirty || decision.hard.is_empty() || decision.used.is_empty(),
        "a second sync over the written status is dirty"
    );
});
