//! Tests of the watch planner: which watches one (cluster, resource type) should have.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{ResourceQuota, ResourceQuotaSpec},
    apimachinery::pkg::api::resource::Quantity,
};
use proptest::prelude::*;

use super::*;
use crate::keys::QuotaKey;

fn served(resource: &str) -> ServedResource {
    ServedResource::core_for_tests(resource)
}

fn quota(hard: &[&str]) -> ResourceQuota {
    ResourceQuota {
        spec: Some(ResourceQuotaSpec {
            hard: Some(
                hard.iter()
                    .map(|k| ((*k).to_owned(), Quantity("10".into())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    }
}

fn engine_with(quotas: &[(&str, &[&str])]) -> (Engine, ClusterName) {
    let cluster = ClusterName::new("c");
    let mut engine = Engine::new(FeatureGates::default());
    engine.discovered(&cluster, vec![served("configmaps"), served("pods")], &[]);
    for (i, (namespace, hard)) in quotas.iter().enumerate() {
        engine.apply_quota(QuotaKey::new(&cluster, namespace, &format!("q{i}")), &quota(hard));
    }
    (engine, cluster)
}

fn settings(mode: Mode, threshold: usize) -> PlanSettings {
    PlanSettings {
        mode,
        namespace_watch_threshold: threshold,
        gates: FeatureGates::default(),
    }
}

#[test]
fn within_the_threshold_one_watch_per_namespace_with_the_largest_need() {
    let (engine, c) = engine_with(&[("a", &["count/pods"]), ("b", &["requests.cpu"])]);
    let pods = GroupResource::core("pods");
    let plan = desired_watches(&engine, &settings(Mode::Lazy, 2), &c, &pods);
    let keys: Vec<(Option<&str>, Need)> = plan.keys().map(|k| (k.namespace.as_deref(), k.need)).collect();
    assert_eq!(
        keys,
        [(Some("a"), Need::Typed), (Some("b"), Need::Typed)],
        "one quota needs the projection, so every watch of the type is typed"
    );
    let why = why(&engine, &settings(Mode::Lazy, 2), &c, &pods);
    assert_eq!(
        why.scope,
        Some(ScopeReason::WithinThreshold {
            namespaces: 2,
            threshold: 2
        })
    );
    assert_eq!((why.watch_kind(), why.scope_label()), ("typed", "namespaced"));
}

#[test]
fn above_the_threshold_one_cluster_wide_watch_fills_every_demanding_namespace() {
    let (engine, c) = engine_with(&[
        ("a", &["count/configmaps"]),
        ("b", &["count/configmaps"]),
        ("c", &["configmaps"]),
    ]);
    let configmaps = GroupResource::core("configmaps");
    let plan = desired_watches(&engine, &settings(Mode::Lazy, 2), &c, &configmaps);
    assert_eq!(plan.len(), 1);
    let (key, namespaces) = plan.iter().next().expect("one watch");
    assert_eq!((key.namespace.as_deref(), key.need), (None, Need::Count));
    assert_eq!(
        namespaces.iter().map(|n| &**n).collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
    let why = why(&engine, &settings(Mode::Lazy, 2), &c, &configmaps);
    assert_eq!(
        why.scope.as_ref().map(ToString::to_string).as_deref(),
        Some("3 namespaces demand it, above --namespace-watch-threshold 2")
    );
    assert_eq!(
        (why.watch_kind(), why.scope_label()),
        ("metadata", "cluster-wide")
    );
}

#[test]
fn nothing_is_planned_for_a_type_not_served_or_not_demanded_in_lazy_mode() {
    let (engine, c) = engine_with(&[("a", &["count/widgets.example.io"])]);
    let widgets = GroupResource::new("example.io", "widgets");
    assert!(desired_watches(&engine, &settings(Mode::Lazy, 8), &c, &widgets).is_empty());
    let pending = why(&engine, &settings(Mode::Lazy, 8), &c, &widgets);
    assert_eq!((pending.served.is_none(), pending.scope.is_none()), (true, true));
    assert_eq!(pending.demand.len(), 1, "demanded, but pending");
    let configmaps = GroupResource::core("configmaps");
    assert!(desired_watches(&engine, &settings(Mode::Lazy, 8), &c, &configmaps).is_empty());
}

#[test]
fn eager_mode_watches_every_served_type_cluster_wide_typed_where_upstream_is() {
    let (engine, c) = engine_with(&[]);
    for (resource, need) in [("pods", Need::Typed), ("configmaps", Need::Count)] {
        let plan = desired_watches(
            &engine,
            &settings(Mode::Eager, 8),
            &c,
            &GroupResource::core(resource),
        );
        let keys: Vec<(Option<&str>, Need)> = plan.keys().map(|k| (k.namespace.as_deref(), k.need)).collect();
        assert_eq!(keys, [(None, need)], "{resource}");
        let why = why(
            &engine,
            &settings(Mode::Eager, 8),
            &c,
            &GroupResource::core(resource),
        );
        assert_eq!(why.scope, Some(ScopeReason::Eager));
    }
}

const NAMESPACES: [&str; 6] = ["n0", "n1", "n2", "n3", "n4", "n5"];
const KEYS: [&str; 3] = ["count/pods", "pods", "requests.memory"];

proptest! {
    /// Whatever the quotas and the threshold: the planned watches fill exactly the demanding
    /// namespaces, each once; all ask for the largest need; namespaced watches exactly when
    /// no more namespaces than the threshold demand the type.
    #[test]
    fn the_plan_covers_the_demand_exactly(
        quotas in proptest::collection::vec((0..NAMESPACES.len(), 0..KEYS.len()), 0..12),
        threshold in 0usize..8,
    ) {
        let quotas: Vec<(&str, [&str; 1])> =
            quotas.iter().map(|&(n, k)| (NAMESPACES[n], [KEYS[k]])).collect();
        let refs: Vec<(&str, &[&str])> = quotas.iter().map(|(n, k)| (*n, &k[..])).collect();
        let (engine, c) = engine_with(&refs);
        let pods = GroupResource::core("pods");
        let plan = desired_watches(&engine, &settings(Mode::Lazy, threshold), &c, &pods);
        let demand = engine.index.demand_of(&c, &pods);
        let mut filled: Vec<&str> = plan.values().flatten().map(|n| &**n).collect();
        filled.sort_unstable();
        let demanded: Vec<&str> = demand.keys().map(|n| &**n).collect();
        prop_assert_eq!(filled, demanded, "every demanding namespace filled exactly once");
        let max = demand.values().copied().max();
        prop_assert!(plan.keys().all(|k| Some(k.need) == max));
        let namespaced = plan.keys().all(|k| k.namespace.is_some());
        if demand.is_empty() {
            prop_assert!(plan.is_empty());
        } else if demand.len() <= threshold {
            prop_assert!(namespaced && plan.len() == demand.len());
        } else {
            prop_assert!(plan.len() == 1 && plan.keys().all(|k| k.namespace.is_none()));
        }
    }
}
