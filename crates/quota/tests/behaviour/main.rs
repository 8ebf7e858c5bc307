//! Evaluator matching, watch planning, update filters, spec parsing, status assembly,
//! projection sizes, and the namespace-sum property.

// Fixtures are JSON values built inline; tables of cases are long by nature.
#![allow(clippy::needless_pass_by_value, clippy::too_many_lines)]

mod matching;
mod projection;
mod status;
mod update_filter;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ResourceQuota, Service};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use lazyquota_quota::names::{self, QuotaResourceName, StorageClassResource};
use lazyquota_quota::{
    Evaluator, FeatureGates, Format, GroupResource, Interner, PodProjection, Projection, PvcProjection,
    Quantity, QuotaObject, QuotaScopes, QuotaSpec, Registry, ResourceList, ScopeRequirement,
    ServiceProjection, SpecProblem, Time, WatchNeed, assemble_status, calculate_usage, classify,
    counted_by_list, plan_key, pod_update_triggers, pvc_update_triggers, service_update_triggers,
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
