//! Merging evaluators into a status, when it is dirty, spec parsing and scope errors.

use super::*;

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
        None::<&BTreeMap<String, K8sQuantity>>,
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
