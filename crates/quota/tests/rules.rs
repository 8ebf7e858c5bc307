//! One row per behaviour of the checklist (§11) and fixture (§10) of the upstream reference,
//! each run end to end: quota spec → plan → per-evaluator usage → merge → status.

// Fixtures are JSON values built inline; tables of cases are long by nature.
#![allow(clippy::needless_pass_by_value, clippy::too_many_lines)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ResourceQuota, Service};
use lazyquota_quota::{
    Evaluator, FeatureGates, GroupResource, Interner, PodProjection, PvcProjection, QuotaSpec, Registry,
    ServiceProjection, StatusDecision, Time, assemble_status_for, calculate_object_count_usage,
    calculate_usage,
};
use serde_json::{Value, json};

/// 2026-01-01T00:00:00Z.
const NOW: i64 = 1_767_225_600;

fn pod(name: &str, spec: Value, status: Value) -> Value {
    json!({"kind": "Pod", "metadata": {"name": name, "namespace": "ns"}, "spec": spec, "status": status})
}

fn app(requests: Value, limits: Value) -> Value {
    json!({"containers": [{"name": "app", "resources": {"requests": requests, "limits": limits}}]})
}

fn running(spec: Value) -> Value {
    pod("p", spec, json!({"phase": "Running"}))
}

fn service(spec: Value) -> Value {
    json!({"kind": "Service", "metadata": {"name": "s", "namespace": "ns"}, "spec": spec})
}

fn pvc(metadata: Value, spec: Value, status: Value) -> Value {
    let mut metadata = metadata;
    metadata["name"] = json!("c");
    metadata["namespace"] = json!("ns");
    json!({"kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec, "status": status})
}

fn object(api_version: &str, kind: &str, metadata: Value) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "metadata": metadata})
}

fn rfc3339(unix: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(unix)
        .unwrap()
        .to_string()
}

/// Runs one quota sync over the namespace's objects.
fn sync(gates: FeatureGates, quota: &Value, objects: &[Value], now: Time) -> StatusDecision {
    let rq: ResourceQuota = serde_json::from_value(quota.clone()).expect("quota");
    let spec = QuotaSpec::from_resource_quota(&rq);
    let interner = Interner::new();
    let mut pods = Vec::new();
    let mut services = Vec::new();
    let mut pvcs = Vec::new();
    let mut counts: BTreeMap<GroupResource, u64> = BTreeMap::new();
    for o in objects {
        match o["kind"].as_str().unwrap() {
            "Pod" => {
                let p: Pod = serde_json::from_value(o.clone()).expect("pod");
                pods.push(
                    PodProjection::from_pod(&p, gates, &interner)
                        .strict()
                        .expect("pod projection"),
                );
            }
            "Service" => {
                let s: Service = serde_json::from_value(o.clone()).expect("service");
                services.push(ServiceProjection::from_service(&s));
            }
            "PersistentVolumeClaim" => {
                let c: PersistentVolumeClaim = serde_json::from_value(o.clone()).expect("pvc");
                pvcs.push(
                    PvcProjection::from_pvc(&c, &interner)
                        .strict()
                        .expect("pvc projection"),
                );
            }
            kind => {
                let group = o["apiVersion"]
                    .as_str()
                    .unwrap_or("v1")
                    .rsplit_once('/')
                    .map_or("", |(g, _)| g);
                let resource = format!("{}s", kind.to_lowercase());
                *counts.entry(GroupResource::new(group, resource)).or_default() += 1;
            }
        }
    }
    let mut registry = Registry::new(gates);
    for gr in counts.keys() {
        registry.add_discovered(gr.clone());
    }
    let keys: Vec<&String> = spec.hard_keys.iter().collect();
    let plan = registry.plan(&keys);
    let results: Vec<_> = plan
        .per_evaluator
        .iter()
        .map(|(evaluator, keys)| {
            let used = match evaluator {
                Evaluator::Pods => Some(calculate_usage(keys, &spec.scopes, &pods, now, gates).used),
                Evaluator::Services => Some(calculate_usage(keys, &spec.scopes, &services, now, gates).used),
                Evaluator::PersistentVolumeClaims => {
                    Some(calculate_usage(keys, &spec.scopes, &pvcs, now, gates).used)
                }
                Evaluator::ObjectCount(gr) => Some(calculate_object_count_usage(
                    keys,
                    &spec.scopes,
                    counts.get(gr).copied().unwrap_or(0),
                )),
                // The test namespace holds no resource claims.
                Evaluator::ResourceClaims => Some(calculate_object_count_usage(keys, &spec.scopes, 0)),
            };
            (evaluator.clone(), used)
        })
        .collect();
    let usage = plan.merge(&results);
    assemble_status_for(&rq, &usage)
}

fn quota(hard: &[&str]) -> Value {
    let hard: serde_json::Map<String, Value> =
        hard.iter().map(|k| ((*k).to_owned(), json!("1000"))).collect();
    json!({"metadata": {"name": "q", "namespace": "ns"}, "spec": {"hard": hard}})
}

fn scoped(hard: &[&str], scopes: &[&str], selector: Value) -> Value {
    let mut q = quota(hard);
    if !scopes.is_empty() {
        q["spec"]["scopes"] = json!(scopes);
    }
    if !selector.is_null() {
        q["spec"]["scopeSelector"] = json!({"matchExpressions": selector});
    }
    q
}

struct Case {
    rule: &'static str,
    gates: FeatureGates,
    quota: Value,
    objects: Vec<Value>,
    now: i64,
    /// Key → expected `status.used` string (compared exactly and by value); `None` = absent.
    expected: Vec<(&'static str, Option<&'static str>)>,
}

fn case(
    rule: &'static str,
    quota: Value,
    objects: Vec<Value>,
    expected: &[(&'static str, Option<&'static str>)],
) -> Case {
    Case {
        rule,
        // Kubernetes 1.36's rules; the rows of other releases set their gates.
        gates: FeatureGates::V1_36,
        quota,
        objects,
        now: NOW,
        expected: expected.to_vec(),
    }
}

fn cases() -> Vec<Case> {
    // Pods whose resize rows differ between releases (1.36 and 1.37 rows share them).
    let two_resized = || {
        vec![pod(
            "r",
            json!({"containers": [
                {"name": "a", "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}},
                {"name": "b", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}}]}),
            json!({"phase": "Running", "containerStatuses": [
                {"name": "a", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                 "allocatedResources": {"cpu": "1"},
                 "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}},
                {"name": "b", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                 "allocatedResources": {"cpu": "1"},
                 "resources": {"requests": {"cpu": "3"}, "limits": {"cpu": "3"}}}]}),
        )]
    };
    let allocated_only = || {
        vec![pod(
            "r",
            app(json!({"cpu": "1"}), json!({})),
            json!({"phase": "Running", "containerStatuses": [
                {"name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                 "allocatedResources": {"cpu": "4"}}]}),
        )]
    };
    let init_resized = || {
        vec![pod(
            "r",
            json!({"containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}}}],
                   "initContainers": [
                {"name": "init", "resources": {"requests": {"cpu": "1"}}},
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}}]}),
            json!({"phase": "Running", "initContainerStatuses": [
                {"name": "init", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                 "resources": {"requests": {"cpu": "7"}}},
                {"name": "side", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                 "resources": {"requests": {"cpu": "2"}}}]}),
        )]
    };
    let gates_off = |f: fn(&mut FeatureGates)| {
        let mut g = FeatureGates::V1_36;
        f(&mut g);
        g
    };
    let deleted = |grace_end: i64| {
        json!({"kind": "Pod", "metadata": {"name": "d", "namespace": "ns",
            "deletionTimestamp": rfc3339(grace_end - 30), "deletionGracePeriodSeconds": 30},
            "spec": app(json!({"cpu": "1"}), json!({})), "status": {"phase": "Running"}})
    };
    let resize = |spec_cpu: &str, allocated: &str, actual: &str, infeasible: bool| {
        let mut status = json!({"phase": "Running", "containerStatuses": [{
            "name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
            "allocatedResources": {"cpu": allocated},
            "resources": {"requests": {"cpu": actual}, "limits": {"cpu": actual}}}]});
        if infeasible {
            status["conditions"] =
                json!([{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}]);
        }
        pod(
            "r",
            app(json!({"cpu": spec_cpu}), json!({"cpu": spec_cpu})),
            status,
        )
    };
    let with_class = |class: Option<&str>| {
        let mut spec = app(json!({"cpu": "1"}), json!({}));
        if let Some(class) = class {
            spec["priorityClassName"] = json!(class);
        }
        pod("p", spec, json!({"phase": "Running", "qosClass": "Burstable"}))
    };
    let classes = || {
        vec![
            with_class(None),
            with_class(Some("low")),
            with_class(Some("high")),
        ]
    };
    let widget = |name: &str, deleting: bool| {
        let mut metadata = json!({"name": name, "namespace": "ns"});
        if deleting {
            metadata["deletionTimestamp"] = json!(rfc3339(NOW - 3600));
        }
        object("example.io/v1", "Widget", metadata)
    };
    let configmap = |name: &str| object("v1", "ConfigMap", json!({"name": name, "namespace": "ns"}));
    vec![
        case(
            "ignored resources (DefaultIgnoredResources): count/events is never computed",
            quota(&["count/events", "count/events.events.k8s.io", "pods"]),
            vec![
                object("v1", "Event", json!({"name": "e"})),
                object("events.k8s.io/v1", "Event", json!({"name": "e"})),
            ],
            &[
                ("count/events", None),
                ("count/events.events.k8s.io", None),
                ("pods", Some("0")),
            ],
        ),
        case(
            "generic count evaluator: count/<r>.<g> counts all objects, terminating ones included",
            quota(&["count/widgets.example.io"]),
            vec![widget("a", false), widget("b", true)],
            &[("count/widgets.example.io", Some("2"))],
        ),
        case(
            "generic count evaluator: an undiscovered resource has no evaluator (key absent)",
            quota(&["count/gadgets.example.io"]),
            vec![],
            &[("count/gadgets.example.io", None)],
        ),
        case(
            "legacy names (legacyObjectCountAliases): bare configmaps and secrets count too",
            quota(&[
                "configmaps",
                "count/configmaps",
                "secrets",
                "count/secrets",
                "resourcequotas",
            ]),
            vec![
                configmap("a"),
                configmap("b"),
                configmap("c"),
                object("v1", "Secret", json!({"name": "s"})),
            ],
            &[
                ("configmaps", Some("3")),
                ("count/configmaps", Some("3")),
                ("secrets", Some("1")),
                ("count/secrets", Some("1")),
                ("resourcequotas", Some("0")),
            ],
        ),
        case(
            "usage computation: keys no evaluator matches stay absent (unknown hard keys)",
            quota(&[
                "limits.nvidia.com/gpu",
                "limits.hugepages-2Mi",
                "nvidia.com/gpu",
                "foo",
                "pods",
            ]),
            vec![running(app(
                json!({"nvidia.com/gpu": "1"}),
                json!({"nvidia.com/gpu": "1"}),
            ))],
            &[
                ("limits.nvidia.com/gpu", None),
                ("limits.hugepages-2Mi", None),
                ("nvidia.com/gpu", None),
                ("foo", None),
                ("pods", Some("1")),
            ],
        ),
        case(
            "usage computation: matched keys with nothing to count are \"0\", not absent",
            quota(&[
                "pods",
                "cpu",
                "requests.memory",
                "services",
                "requests.storage",
                "count/widgets.example.io",
            ]),
            vec![widget("a", false)],
            &[
                ("pods", Some("0")),
                ("cpu", Some("0")),
                ("requests.memory", Some("0")),
                ("services", Some("0")),
                ("requests.storage", Some("0")),
            ],
        ),
        case(
            "pod names matched: requests.<ext> and hugepages yes; limits.<ext>, limits.hugepages no",
            quota(&[
                "requests.nvidia.com/gpu",
                "limits.nvidia.com/gpu",
                "hugepages-2Mi",
                "requests.hugepages-2Mi",
                "limits.hugepages-2Mi",
                "requests.deviceclass.resource.kubernetes.io/gpu",
            ]),
            vec![running(app(
                json!({"nvidia.com/gpu": "2", "hugepages-2Mi": "4Mi", "deviceclass.resource.kubernetes.io/gpu": "1"}),
                json!({"nvidia.com/gpu": "2", "hugepages-2Mi": "4Mi"}),
            ))],
            &[
                ("requests.nvidia.com/gpu", Some("2")),
                ("limits.nvidia.com/gpu", None),
                ("hugepages-2Mi", Some("4Mi")),
                ("requests.hugepages-2Mi", Some("4Mi")),
                ("limits.hugepages-2Mi", None),
                ("requests.deviceclass.resource.kubernetes.io/gpu", Some("1")),
            ],
        ),
        case(
            "pod charged or not (QuotaV1Pod): terminal pods count only in count/pods",
            quota(&["count/pods", "pods", "cpu", "limits.cpu"]),
            vec![
                pod(
                    "done",
                    app(json!({"cpu": "1"}), json!({"cpu": "1"})),
                    json!({"phase": "Succeeded"}),
                ),
                pod(
                    "failed",
                    app(json!({"cpu": "1"}), json!({"cpu": "1"})),
                    json!({"phase": "Failed"}),
                ),
                running(app(json!({"cpu": "250m"}), json!({"cpu": "500m"}))),
            ],
            &[
                ("count/pods", Some("3")),
                ("pods", Some("1")),
                ("cpu", Some("250m")),
                ("limits.cpu", Some("500m")),
            ],
        ),
        case(
            "pod charged or not: past deletion grace (now > deletionTimestamp + grace) is uncharged",
            quota(&["count/pods", "pods", "cpu"]),
            vec![deleted(NOW - 1)],
            &[("count/pods", Some("1")), ("pods", Some("0")), ("cpu", Some("0"))],
        ),
        case(
            "pod charged or not: exactly at the end of the grace period is still charged",
            quota(&["count/pods", "pods", "cpu"]),
            vec![deleted(NOW)],
            &[("count/pods", Some("1")), ("pods", Some("1")), ("cpu", Some("1"))],
        ),
        case(
            "pod maths: a regular init container after a sidecar runs alongside it",
            quota(&["requests.cpu"]),
            vec![running(json!({
                "containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}}}],
                "initContainers": [
                    {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
                    {"name": "init", "resources": {"requests": {"cpu": "2"}}}]}))],
            &[("requests.cpu", Some("2500m"))],
        ),
        case(
            "pod maths: a sidecar after an init container adds to the app sum only",
            quota(&["requests.cpu"]),
            vec![running(json!({
                "containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}}}],
                "initContainers": [
                    {"name": "init", "resources": {"requests": {"cpu": "2"}}},
                    {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}}]}))],
            &[("requests.cpu", Some("2"))],
        ),
        case(
            "pod maths: max over init containers versus the app sum",
            quota(&["requests.cpu", "requests.memory"]),
            vec![running(json!({
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}}}],
                "initContainers": [
                    {"name": "i1", "resources": {"requests": {"cpu": "300m", "memory": "64Mi"}}},
                    {"name": "i2", "resources": {"requests": {"cpu": "200m"}}}]}))],
            &[("requests.cpu", Some("300m")), ("requests.memory", Some("2Gi"))],
        ),
        case(
            "pod-level resources: spec.resources overrides cpu/memory, not ephemeral-storage",
            quota(&[
                "requests.cpu",
                "requests.memory",
                "requests.ephemeral-storage",
                "limits.cpu",
                "limits.memory",
            ]),
            vec![running(json!({
                "resources": {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "4"}},
                "containers": [{"name": "app", "resources": {
                    "requests": {"cpu": "500m", "memory": "256Mi", "ephemeral-storage": "1Gi"},
                    "limits": {"memory": "512Mi"}}}]}))],
            &[
                ("requests.cpu", Some("2")),
                ("requests.memory", Some("1Gi")),
                ("requests.ephemeral-storage", Some("1Gi")),
                ("limits.cpu", Some("4")),
                ("limits.memory", Some("512Mi")),
            ],
        ),
        Case {
            gates: gates_off(|g| g.pod_level_resources = false),
            ..case(
                "pod-level resources: ignored without the PodLevelResources gate",
                quota(&["requests.cpu", "limits.cpu"]),
                vec![running(json!({
                    "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "4"}},
                    "containers": [{"name": "app", "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "1"}}}]}))],
                &[("requests.cpu", Some("500m")), ("limits.cpu", Some("1"))],
            )
        },
        case(
            "overhead: added to all requests, to limits only where the limit is non-zero",
            quota(&["requests.cpu", "requests.memory", "limits.cpu", "limits.memory"]),
            vec![
                running(json!({"overhead": {"cpu": "250m", "memory": "120Mi"},
                    "containers": [{"name": "app", "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2"}}}]})),
                running(json!({"overhead": {"cpu": "250m", "memory": "120Mi"},
                    "containers": [{"name": "app", "resources": {"limits": {"cpu": "0", "memory": "0"}}}]})),
            ],
            &[
                ("requests.cpu", Some("1500m")),
                ("requests.memory", Some("1264Mi")),
                ("limits.cpu", Some("2250m")),
                ("limits.memory", Some("0")),
            ],
        ),
        case(
            "resize: usage is max(spec, allocated, actuated) while a resize is in flight",
            quota(&["requests.cpu", "limits.cpu"]),
            vec![resize("1", "1500m", "2", false), resize("3", "1", "1", false)],
            &[("requests.cpu", Some("5")), ("limits.cpu", Some("5"))],
        ),
        case(
            "resize: with PodResizePending=Infeasible the spec term is dropped",
            quota(&["requests.cpu", "limits.cpu"]),
            vec![resize("3", "1", "1", true)],
            &[("requests.cpu", Some("1")), ("limits.cpu", Some("1"))],
        ),
        case(
            "resize: the max is taken per container, before summing (component-helpers v0.36)",
            quota(&["requests.cpu", "limits.cpu"]),
            two_resized(),
            &[("requests.cpu", Some("5")), ("limits.cpu", Some("5"))],
        ),
        case(
            "resize: a status without resources is ignored, allocatedResources included",
            quota(&["requests.cpu"]),
            allocated_only(),
            &[("requests.cpu", Some("1"))],
        ),
        case(
            "resize: only sidecars among init containers use their status",
            quota(&["requests.cpu"]),
            init_resized(),
            &[("requests.cpu", Some("3"))],
        ),
        Case {
            gates: FeatureGates::for_minor(37),
            ..case(
                "resize (1.37): the max is taken over the per-source sums (component-helpers v0.37)",
                quota(&["requests.cpu", "limits.cpu"]),
                two_resized(),
                &[("requests.cpu", Some("4")), ("limits.cpu", Some("4"))],
            )
        },
        Case {
            gates: FeatureGates::for_minor(37),
            ..case(
                "resize (1.37): allocatedResources counts without resources",
                quota(&["requests.cpu"]),
                allocated_only(),
                &[("requests.cpu", Some("4"))],
            )
        },
        Case {
            gates: FeatureGates::for_minor(37),
            ..case(
                "resize (1.37): every init container uses its status",
                quota(&["requests.cpu"]),
                init_resized(),
                &[("requests.cpu", Some("7"))],
            )
        },
        Case {
            gates: gates_off(|g| g.in_place_pod_vertical_scaling = false),
            ..case(
                "resize: without InPlacePodVerticalScaling only the spec counts",
                quota(&["requests.cpu"]),
                vec![resize("1", "1500m", "2", false)],
                &[("requests.cpu", Some("1"))],
            )
        },
        case(
            "pod scopes: BestEffort is decided by status.qosClass when set",
            scoped(&["pods", "count/pods"], &["BestEffort"], Value::Null),
            vec![
                pod(
                    "labelled",
                    app(json!({"cpu": "100m"}), json!({})),
                    json!({"phase": "Running", "qosClass": "BestEffort"}),
                ),
                pod(
                    "computed",
                    json!({"containers": [{"name": "app"}]}),
                    json!({"phase": "Pending"}),
                ),
                pod(
                    "burstable",
                    app(json!({"cpu": "100m"}), json!({})),
                    json!({"phase": "Running"}),
                ),
                pod(
                    "zero",
                    app(json!({"cpu": "0"}), json!({"memory": "0"})),
                    json!({"phase": "Running"}),
                ),
            ],
            &[("pods", Some("3")), ("count/pods", Some("3"))],
        ),
        case(
            "pod scopes: NotBestEffort",
            scoped(&["pods"], &["NotBestEffort"], Value::Null),
            vec![
                pod(
                    "labelled",
                    app(json!({"cpu": "100m"}), json!({})),
                    json!({"qosClass": "BestEffort"}),
                ),
                pod("burstable", app(json!({"cpu": "100m"}), json!({})), json!({})),
            ],
            &[("pods", Some("1"))],
        ),
        case(
            "pod scopes: Terminating is activeDeadlineSeconds >= 0",
            scoped(&["pods"], &["Terminating"], Value::Null),
            vec![
                running(json!({"activeDeadlineSeconds": 0, "containers": [{"name": "a"}]})),
                running(json!({"containers": [{"name": "a"}]})),
            ],
            &[("pods", Some("1"))],
        ),
        case(
            "pod scopes: NotTerminating",
            scoped(&["pods"], &["NotTerminating"], Value::Null),
            vec![
                running(json!({"activeDeadlineSeconds": 30, "containers": [{"name": "a"}]})),
                running(json!({"containers": [{"name": "a"}]})),
                running(json!({"containers": [{"name": "a"}]})),
            ],
            &[("pods", Some("2"))],
        ),
        case(
            "pod scopes: PriorityClass NotIn matches pods without a class",
            scoped(
                &["pods"],
                &[],
                json!([{"scopeName": "PriorityClass", "operator": "NotIn", "values": ["high"]}]),
            ),
            classes(),
            &[("pods", Some("2"))],
        ),
        case(
            "pod scopes: PriorityClass DoesNotExist matches only pods without a class",
            scoped(
                &["pods"],
                &[],
                json!([{"scopeName": "PriorityClass", "operator": "DoesNotExist"}]),
            ),
            classes(),
            &[("pods", Some("1"))],
        ),
        case(
            "pod scopes: PriorityClass In",
            scoped(
                &["pods"],
                &[],
                json!([{"scopeName": "PriorityClass", "operator": "In", "values": ["high", "low"]}]),
            ),
            classes(),
            &[("pods", Some("2"))],
        ),
        case(
            "pod scopes: PriorityClass Exists",
            scoped(
                &["pods"],
                &[],
                json!([{"scopeName": "PriorityClass", "operator": "Exists"}]),
            ),
            classes(),
            &[("pods", Some("2"))],
        ),
        case(
            "pod scopes: scopes and selector expressions are ANDed",
            scoped(
                &["pods"],
                &["NotBestEffort"],
                json!([{"scopeName": "PriorityClass", "operator": "In", "values": ["high", "low"]},
                       {"scopeName": "PriorityClass", "operator": "NotIn", "values": ["low"]}]),
            ),
            classes(),
            &[("pods", Some("1"))],
        ),
        case(
            "pod scopes: PriorityClass in spec.scopes is evaluated as Exists",
            scoped(&["pods", "cpu"], &["PriorityClass"], Value::Null),
            classes(),
            &[("pods", Some("2")), ("cpu", Some("2"))],
        ),
        case(
            "pod scopes: CrossNamespacePodAffinity (an empty namespaceSelector counts)",
            scoped(&["pods"], &["CrossNamespacePodAffinity"], Value::Null),
            vec![
                running(
                    json!({"containers": [{"name": "a"}], "affinity": {"podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {"topologyKey": "zone", "namespaceSelector": {}}]}}}),
                ),
                running(
                    json!({"containers": [{"name": "a"}], "affinity": {"podAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm":
                        {"topologyKey": "zone", "namespaces": ["other"]}}]}}}),
                ),
                running(
                    json!({"containers": [{"name": "a"}], "affinity": {"podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]}}}),
                ),
            ],
            &[("pods", Some("2"))],
        ),
        case(
            "scope validity: count/* and no-scope evaluators compute 0 under any scope",
            scoped(
                &[
                    "count/configmaps",
                    "configmaps",
                    "count/services",
                    "services",
                    "count/widgets.example.io",
                    "count/pods",
                ],
                &["NotTerminating"],
                Value::Null,
            ),
            vec![
                configmap("a"),
                widget("w", false),
                service(json!({"type": "ClusterIP"})),
                running(json!({"containers": [{"name": "a"}]})),
                running(json!({"activeDeadlineSeconds": 5, "containers": [{"name": "a"}]})),
            ],
            &[
                ("count/configmaps", Some("0")),
                ("configmaps", Some("0")),
                ("count/services", Some("0")),
                ("services", Some("0")),
                ("count/widgets.example.io", Some("0")),
                ("count/pods", Some("1")),
            ],
        ),
        case(
            "service usage: NodePort counts ports; LB counts 1 LB and its ports; allocateLoadBalancerNodePorts=false counts explicit nodePorts",
            quota(&[
                "services",
                "count/services",
                "services.nodeports",
                "services.loadbalancers",
            ]),
            vec![
                service(json!({"type": "NodePort", "ports": [{"port": 80}, {"port": 443}]})),
                service(
                    json!({"type": "LoadBalancer", "ports": [{"port": 80}, {"port": 443}, {"port": 8080}]}),
                ),
                service(
                    json!({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
                    "ports": [{"port": 80, "nodePort": 30001}, {"port": 443}]}),
                ),
                service(json!({"type": "ClusterIP", "ports": [{"port": 80}]})),
                service(json!({"type": "ExternalName", "externalName": "x.example"})),
            ],
            &[
                ("services", Some("5")),
                ("count/services", Some("5")),
                ("services.nodeports", Some("6")),
                ("services.loadbalancers", Some("2")),
            ],
        ),
        case(
            "PVC usage: the beta storage-class annotation wins over storageClassName",
            quota(&[
                "persistentvolumeclaims",
                "count/persistentvolumeclaims",
                "gold.storageclass.storage.k8s.io/persistentvolumeclaims",
                "gold.storageclass.storage.k8s.io/requests.storage",
                "silver.storageclass.storage.k8s.io/requests.storage",
            ]),
            vec![pvc(
                json!({"annotations": {"volume.beta.kubernetes.io/storage-class": "gold"}}),
                json!({"storageClassName": "silver", "resources": {"requests": {"storage": "10Gi"}}}),
                json!({}),
            )],
            &[
                ("persistentvolumeclaims", Some("1")),
                ("count/persistentvolumeclaims", Some("1")),
                (
                    "gold.storageclass.storage.k8s.io/persistentvolumeclaims",
                    Some("1"),
                ),
                ("gold.storageclass.storage.k8s.io/requests.storage", Some("10Gi")),
                ("silver.storageclass.storage.k8s.io/requests.storage", Some("0")),
            ],
        ),
        case(
            "PVC usage: allocated storage greater than requested wins; smaller does not",
            quota(&["requests.storage"]),
            vec![
                pvc(
                    json!({}),
                    json!({"resources": {"requests": {"storage": "1Gi"}}}),
                    json!({"allocatedResources": {"storage": "2Gi"}}),
                ),
                pvc(
                    json!({}),
                    json!({"resources": {"requests": {"storage": "1Gi"}}}),
                    json!({"allocatedResources": {"storage": "512Mi"}}),
                ),
            ],
            &[("requests.storage", Some("3Gi"))],
        ),
        case(
            "PVC usage: fractional storage requests round up to whole bytes",
            quota(&["requests.storage"]),
            vec![
                pvc(
                    json!({}),
                    json!({"resources": {"requests": {"storage": "1.5"}}}),
                    json!({}),
                ),
                pvc(
                    json!({}),
                    json!({"resources": {"requests": {"storage": "2500m"}}}),
                    json!({}),
                ),
            ],
            &[("requests.storage", Some("5"))],
        ),
        case(
            "PVC usage: no spec request means no storage charge, even with an allocated value",
            quota(&["requests.storage", "persistentvolumeclaims"]),
            vec![pvc(
                json!({}),
                json!({}),
                json!({"allocatedResources": {"storage": "5Gi"}}),
            )],
            &[
                ("requests.storage", Some("0")),
                ("persistentvolumeclaims", Some("1")),
            ],
        ),
        case(
            "PVC scope: VolumeAttributesClass over spec, current and target names",
            scoped(
                &["persistentvolumeclaims", "requests.storage"],
                &[],
                json!([{"scopeName": "VolumeAttributesClass", "operator": "In", "values": ["fast"]}]),
            ),
            vec![
                pvc(
                    json!({}),
                    json!({"volumeAttributesClassName": "fast", "resources": {"requests": {"storage": "1Gi"}}}),
                    json!({}),
                ),
                pvc(
                    json!({}),
                    json!({"volumeAttributesClassName": "slow", "resources": {"requests": {"storage": "1Gi"}}}),
                    json!({"modifyVolumeStatus": {"status": "InProgress", "targetVolumeAttributesClassName": "fast"}}),
                ),
                pvc(
                    json!({}),
                    json!({"resources": {"requests": {"storage": "1Gi"}}}),
                    json!({}),
                ),
            ],
            &[
                ("persistentvolumeclaims", Some("2")),
                ("requests.storage", Some("2Gi")),
            ],
        ),
        Case {
            gates: gates_off(|g| g.volume_attributes_class = false),
            ..case(
                "PVC scope: without the VolumeAttributesClass gate no scope matches",
                scoped(
                    &["persistentvolumeclaims"],
                    &[],
                    json!([{"scopeName": "VolumeAttributesClass", "operator": "Exists"}]),
                ),
                vec![pvc(
                    json!({}),
                    json!({"volumeAttributesClassName": "fast"}),
                    json!({}),
                )],
                &[("persistentvolumeclaims", Some("0"))],
            )
        },
        case(
            "quantity format: mixed memory formats print in the first non-zero addend's format (BinarySI first)",
            quota(&["requests.memory"]),
            vec![
                running(app(json!({"memory": "1000Ki"}), json!({}))),
                running(app(json!({"memory": "24k"}), json!({}))),
            ],
            &[("requests.memory", Some("1048000"))],
        ),
        case(
            "quantity format: mixed memory formats print in the first non-zero addend's format (DecimalSI first)",
            quota(&["requests.memory"]),
            vec![
                running(app(json!({"memory": "24k"}), json!({}))),
                running(app(json!({"memory": "1000Ki"}), json!({}))),
            ],
            &[("requests.memory", Some("1048k"))],
        ),
    ]
}

#[test]
fn checklist_rules() {
    let mut failures = Vec::new();
    for case in cases() {
        let decision = sync(
            case.gates,
            &case.quota,
            &case.objects,
            Time::from_unix_seconds(case.now),
        );
        for (key, expected) in &case.expected {
            let got = decision.used.get(*key).map(|q| q.0.as_str());
            if got != *expected {
                failures.push(format!(
                    "[{}] {key}: expected {expected:?}, got {got:?}",
                    case.rule
                ));
            }
        }
        if decision
            .hard
            .keys()
            .ne(case.quota["spec"]["hard"].as_object().unwrap().keys())
        {
            failures.push(format!("[{}] status.hard must equal spec.hard", case.rule));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
