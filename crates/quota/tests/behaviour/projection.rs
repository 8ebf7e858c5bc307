//! What a projection holds and costs, and a quantity beyond range.

use super::*;

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
