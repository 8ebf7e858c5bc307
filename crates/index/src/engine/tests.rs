//! Tests of the Engine: quotas, objects and watch events in, computed statuses out.

use k8s_openapi::{
    api::core::v1::{ConfigMap, ResourceQuota, ResourceQuotaSpec},
    apimachinery::pkg::api::resource::Quantity as K8sQuantity,
};

use super::*;
use crate::{
    demand::device_classes,
    keys::{ALL_NAMESPACES, ObjectIds, QuotaKey},
};

fn object_id(name: &str) -> u64 {
    static IDS: std::sync::LazyLock<ObjectIds> = std::sync::LazyLock::new(ObjectIds::default);
    IDS.id(name)
}

fn quota(hard: &[(&str, &str)], used: Option<&[(&str, &str)]>) -> ResourceQuota {
    let list = |kv: &[(&str, &str)]| {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), K8sQuantity((*v).to_owned())))
            .collect()
    };
    ResourceQuota {
        spec: Some(ResourceQuotaSpec {
            hard: Some(list(hard)),
            ..ResourceQuotaSpec::default()
        }),
        status: used.map(|u| k8s_openapi::api::core::v1::ResourceQuotaStatus {
            hard: Some(list(hard)),
            used: Some(list(u)),
        }),
        ..ResourceQuota::default()
    }
}

fn served(resource: &str) -> ServedResource {
    ServedResource::core_for_tests(resource)
}

#[test]
fn a_type_that_is_no_longer_served_keeps_its_evaluator_as_upstream_never_removes_one() {
    let cluster = ClusterName::new("c");
    let mut engine = Engine::new(FeatureGates::default());
    let widgets = ServedResource {
        resource: GroupResource::new("example.io", "widgets"),
        ..served("widgets")
    };
    let claimed = |engine: &Engine| {
        !engine
            .registry(&cluster)
            .plan(&["count/widgets.example.io"])
            .matched
            .is_empty()
    };
    assert!(!claimed(&engine), "before discovery: only the static evaluators");
    engine.discovered(&cluster, vec![served("configmaps"), widgets.clone()], &[]);
    assert!(claimed(&engine), "discovered: an object-count evaluator");
    engine.discovered(&cluster, vec![served("configmaps")], &[]);
    assert!(claimed(&engine), "gone from discovery: the evaluator stays");
    engine.discovered(&cluster, vec![served("configmaps"), widgets], &[]);
    assert!(claimed(&engine), "served again");
    engine.forget_cluster(&cluster);
    assert!(!claimed(&engine), "a forgotten cluster starts over");
}

#[test]
fn unsynced_keys_keep_their_previous_value_and_synced_ones_are_computed() {
    let _ = ConfigMap::default();
    let cluster = ClusterName::new("c");
    let mut engine = Engine::new(FeatureGates::default());
    engine.discovered(&cluster, vec![served("configmaps"), served("secrets")], &[]);
    let key = QuotaKey::new(&cluster, "ns", "q");
    let q = quota(
        &[
            ("configmaps", "10"),
            ("secrets", "10"),
            ("limits.example.com/gpu", "1"),
            ("count/widgets.example.io", "1"),
        ],
        Some(&[("secrets", "7")]),
    );
    let update = engine.apply_quota(key.clone(), &q);
    assert!(update.recompute);
    assert_eq!(
        update.changes.len(),
        3,
        "configmaps, secrets and widgets demanded"
    );
    let cm = PartitionKey {
        cluster: cluster.clone(),
        resource: GroupResource::core("configmaps"),
        namespace: "ns".into(),
    };
    engine.hold(StoreKind::Counts, cm.clone());
    engine.begin_relist(StoreKind::Counts, &cm);
    for name in ["a", "b", "c"] {
        assert_eq!(
            engine.relist_apply(StoreKind::Counts, &cm, object_id(name), Projected::Meta),
            None
        );
    }
    engine.finish_relist(StoreKind::Counts, &cm);
    let computed = engine
        .compute(&key, Time::from_unix_seconds(0))
        .expect("known quota");
    let used = computed.decision.used;
    assert_eq!(used.get("configmaps").map(|q| q.0.as_str()), Some("3"));
    assert_eq!(
        used.get("secrets").map(|q| q.0.as_str()),
        Some("7"),
        "secrets are not synced: previous value"
    );
    assert!(
        !used.contains_key("limits.example.com/gpu"),
        "unmatched keys stay absent"
    );
    assert_eq!(computed.unsynced, vec![GroupResource::core("secrets")]);
    assert_eq!(
        computed.uncomputed,
        vec!["secrets".to_owned(), "count/widgets.example.io".to_owned()],
        "a key of an unsynced evaluator and the count of a type not served are not \
         lazyquota's own values; a key no evaluator claims is nobody's"
    );
    assert_eq!(
        computed.unclaimed,
        vec!["limits.example.com/gpu".to_owned()],
        "nobody's value is no agreement either: shadow mode calls it unknown"
    );
    assert!(computed.decision.dirty);

    assert_eq!(
        engine.delete(StoreKind::Counts, &cm, object_id("a")),
        Applied::Replenish
    );
    assert_eq!(
        engine.delete(StoreKind::Counts, &cm, object_id("a")),
        Applied::NotHeld,
        "deleted once only"
    );
    let used = engine
        .compute(&key, Time::from_unix_seconds(0))
        .unwrap()
        .decision
        .used;
    assert_eq!(used.get("configmaps").map(|q| q.0.as_str()), Some("2"));
}

#[test]
fn spec_and_scope_changes_recompute_a_foreign_status_change_is_rechecked_our_write_neither() {
    let cluster = ClusterName::new("c");
    let mut engine = Engine::new(FeatureGates::default());
    let key = QuotaKey::new(&cluster, "ns", "q");
    let apply = |engine: &mut Engine, q: &ResourceQuota| {
        let u = engine.apply_quota(key.clone(), q);
        (u.recompute, u.recheck)
    };
    assert_eq!(
        apply(&mut engine, &quota(&[("pods", "1")], None)),
        (true, false),
        "new"
    );
    let status = quota(&[("pods", "1")], Some(&[("pods", "0")]));
    assert_eq!(
        apply(&mut engine, &status),
        (false, true),
        "someone else's status: checked later"
    );
    assert_eq!(
        apply(&mut engine, &status),
        (false, false),
        "the same status again"
    );
    assert_eq!(
        apply(&mut engine, &quota(&[("pods", "1000m")], Some(&[("pods", "0")]))),
        (false, false),
        "same hard by value"
    );
    // Our own write is recorded before its watch event arrives.
    let written = quota(&[("pods", "1")], Some(&[("pods", "1")]));
    engine.record_written(&key, None, &written);
    assert_eq!(
        apply(&mut engine, &written),
        (false, false),
        "the event of our own write"
    );
    // Admission charged a create: the object may not be in the store yet (checking at once
    // would write a lower value), or a delete may have passed it (the charge is too high).
    let charged = quota(&[("pods", "1")], Some(&[("pods", "2")]));
    assert_eq!(apply(&mut engine, &charged), (false, true));
    assert_eq!(
        apply(&mut engine, &quota(&[("pods", "2")], Some(&[("pods", "2")]))),
        (true, false),
        "hard"
    );
    let mut scoped = quota(&[("pods", "2")], Some(&[("pods", "2")]));
    scoped.spec.as_mut().unwrap().scopes = Some(vec!["BestEffort".into()]);
    assert_eq!(apply(&mut engine, &scoped), (true, false), "scopes");
}

/// A quota with a uid and resourceVersion, as the apiserver serves it.
fn object(uid: &str, rv: u64, hard: &[(&str, &str)], used: Option<&[(&str, &str)]>) -> ResourceQuota {
    let mut q = quota(hard, used);
    q.metadata.uid = Some(uid.to_owned());
    q.metadata.resource_version = Some(rv.to_string());
    q
}

#[test]
fn a_quota_created_again_under_its_name_carries_nothing_of_the_old_one() {
    let cluster = ClusterName::new("c");
    let mut engine = Engine::new(FeatureGates::default());
    let key = QuotaKey::new(&cluster, "ns", "q");
    let hard = [("pods", "10")];
    engine.apply_quota(key.clone(), &object("a", 10, &hard, Some(&[("pods", "0")])));
    // Admission charges the first object; lazyquota notes the charge and the view.
    let update = engine.apply_quota(key.clone(), &object("a", 11, &hard, Some(&[("pods", "1")])));
    assert!(!update.renewed && update.recheck, "a charge of the same quota");
    engine.note_charge(&key, update.raised, 1_000, crate::charges::DEFAULT_BOUND_MS);
    engine.note_spec(&key, 1_000);
    engine.note_view(&key, 1_000);
    let state = &engine.index.get(&key).unwrap().payload;
    assert_eq!(
        (state.ledger.charges.len(), state.view, state.spec_ms),
        (1, (11, 1_000), 1_000)
    );

    // Deleted and created again with the same spec while the quota watch was down: an event
    // (or a fresh read) brings the new object, with a new uid and no status yet.
    let update = engine.apply_quota(key.clone(), &object("b", 20, &hard, None));
    assert!(update.renewed, "another object");
    assert!(update.recompute, "computed at once, as a new quota is");
    assert!(
        !update.recheck && update.raised.is_empty(),
        "nothing raised: the old status is not its base"
    );
    let state = &engine.index.get(&key).unwrap().payload;
    assert!(
        state.ledger.charges.is_empty(),
        "the old quota's charges do not hold the new one"
    );
    assert_eq!(
        (state.view, state.spec_ms),
        ((0, 0), 0),
        "neither its view nor when its spec settled"
    );

    // The same through a relist of the quota watch.
    engine.note_charge(
        &key,
        vec![("pods".to_owned(), lazyquota_quota::Quantity::parse("3").unwrap())],
        2_000,
        crate::charges::DEFAULT_BOUND_MS,
    );
    engine.note_view(&key, 2_000);
    let again = object("c", 30, &hard, None);
    let reset = engine.reset_quotas(&cluster, [(key.clone(), &again)]);
    assert_eq!(reset.renewed, vec![key.clone()]);
    assert_eq!(reset.respecified, vec![key.clone()], "its spec settles afresh");
    assert_eq!(reset.moved, vec![key.clone()]);
    assert!(reset.raised.is_empty());
    let state = &engine.index.get(&key).unwrap().payload;
    assert!(state.ledger.charges.is_empty() && state.view == (0, 0));

    // The same object at a newer version is not renewed, and keeps its charges.
    engine.note_charge(
        &key,
        vec![("pods".to_owned(), lazyquota_quota::Quantity::parse("1").unwrap())],
        3_000,
        crate::charges::DEFAULT_BOUND_MS,
    );
    let update = engine.apply_quota(key.clone(), &object("c", 31, &hard, Some(&[("pods", "1")])));
    assert!(!update.renewed);
    assert_eq!(engine.index.get(&key).unwrap().payload.ledger.charges.len(), 1);
}

#[test]
fn a_write_response_older_than_the_watch_does_not_replace_its_view() {
    let cluster = ClusterName::new("c");
    let mut engine = Engine::new(FeatureGates::default());
    let key = QuotaKey::new(&cluster, "ns", "q");
    let at = |rv: &str, used: &str| {
        let mut q = quota(&[("count/configmaps", "30")], Some(&[("count/configmaps", used)]));
        q.metadata.resource_version = Some(rv.to_owned());
        q
    };
    let rv = |engine: &Engine| {
        engine
            .index
            .get(&key)
            .and_then(|e| e.payload.resource_version.clone())
    };
    engine.apply_quota(key.clone(), &at("11062", "29"));
    // Our write leaves conditioned on 11062; admission charges twice before its response.
    engine.apply_quota(key.clone(), &at("11065", "30"));
    engine.apply_quota(key.clone(), &at("11067", "30"));
    engine.record_written(&key, Some("11062"), &at("11063", "29"));
    assert_eq!(rv(&engine).as_deref(), Some("11067"), "the newer view stands");
    assert!(engine.is_older_than_known(&key, Some("11063")));
    assert!(!engine.is_older_than_known(&key, Some("11068")));
    assert!(!engine.is_older_than_known(&key, Some("not-a-number")));
    // A response to a write whose precondition is still the view is recorded.
    engine.record_written(&key, Some("11067"), &at("11070", "3"));
    assert_eq!(rv(&engine).as_deref(), Some("11070"));
    let used = engine
        .index
        .get(&key)
        .and_then(|e| e.payload.status_used.clone())
        .unwrap();
    assert_eq!(used.get("count/configmaps").unwrap().0, "3");
}

fn fill<F: FnOnce(&mut Engine, &PartitionKey)>(
    engine: &mut Engine,
    kind: StoreKind,
    p: &PartitionKey,
    objects: F,
) {
    engine.hold(kind, p.clone());
    engine.begin_relist(kind, p);
    objects(engine, p);
    engine.finish_relist(kind, p);
}

fn claim(json: serde_json::Value) -> Projected {
    let claim: k8s_openapi::api::resource::v1::ResourceClaim = serde_json::from_value(json).unwrap();
    Projected::Claim(ClaimProjection::from_claim(
        &claim,
        &lazyquota_quota::Interner::new(),
        &object_id,
    ))
}

fn gpu_claim(name: &str, count: i64, owner: Option<(&str, &str)>) -> Projected {
    let mut metadata = serde_json::json!({"name": name, "namespace": "ns",
        "creationTimestamp": "2026-01-01T00:00:00Z"});
    if let Some((pod, uid)) = owner {
        metadata["annotations"] =
            serde_json::json!({"resource.kubernetes.io/extended-resource-claim": "true"});
        metadata["ownerReferences"] = serde_json::json!([{"apiVersion": "v1", "kind": "Pod",
            "name": pod, "uid": uid, "controller": true}]);
    }
    claim(
        serde_json::json!({"metadata": metadata, "spec": {"devices": {"requests": [
        {"name": "r", "exactly": {"deviceClassName": "gpu", "allocationMode": "ExactCount", "count": count}}]}}}),
    )
}

#[test]
fn resource_claims_are_computed_with_device_classes_and_their_pods() {
    let cluster = ClusterName::new("c");
    let gates = FeatureGates::for_minor(36);
    let mut engine = Engine::new(gates);
    let key = QuotaKey::new(&cluster, "ns", "q");
    let q = quota(
        &[
            ("count/resourceclaims.resource.k8s.io", "10"),
            ("gpu.deviceclass.resource.k8s.io/devices", "10"),
            ("requests.example.com/gpu", "10"),
            ("requests.deviceclass.resource.kubernetes.io/gpu", "10"),
        ],
        Some(&[]),
    );
    let update = engine.apply_quota(key.clone(), &q);
    let demanded: BTreeSet<(String, String, Option<Need>)> = update
        .changes
        .iter()
        .map(|c| (c.resource.object_count_name(), c.namespace.to_string(), c.to))
        .collect();
    assert_eq!(
        demanded,
        [
            ("count/pods".to_owned(), "ns".to_owned(), Some(Need::Typed)),
            (
                "count/resourceclaims.resource.k8s.io".into(),
                "ns".into(),
                Some(Need::Typed)
            ),
            (
                "count/deviceclasses.resource.k8s.io".into(),
                ALL_NAMESPACES.into(),
                Some(Need::Typed)
            ),
        ]
        .into(),
        "claims and pods typed in the namespace, DeviceClasses cluster-wide"
    );
    let now = Time::from_unix_seconds(0);
    let part = |resource: GroupResource, ns: &str| PartitionKey {
        cluster: cluster.clone(),
        resource,
        namespace: ns.into(),
    };
    let claims = part(GroupResource::new("resource.k8s.io", "resourceclaims"), "ns");
    fill(&mut engine, StoreKind::Claims, &claims, |e, p| {
        e.relist_apply(StoreKind::Claims, p, object_id("a"), gpu_claim("a", 2, None));
        e.relist_apply(
            StoreKind::Claims,
            p,
            object_id("b"),
            gpu_claim("b", 3, Some(("p", "uid-p"))),
        );
    });
    let pods = part(GroupResource::core("pods"), "ns");
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "uid-p"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"example.com/gpu": "1"}, "limits": {"example.com/gpu": "1"}}}]},
        "status": {"phase": "Running"}}))
    .unwrap();
    let pod = PodProjection::from_pod(&pod, gates, &lazyquota_quota::Interner::new()).projection;
    fill(&mut engine, StoreKind::Pods, &pods, |e, p| {
        e.relist_apply(StoreKind::Pods, p, object_id("p"), Projected::Pod(pod));
    });
    let computed = engine.compute(&key, now).unwrap();
    assert!(
        computed
            .uncomputed
            .contains(&"requests.example.com/gpu".to_owned()),
        "DeviceClasses not synced yet: {:?}",
        computed.uncomputed
    );
    let classes = part(device_classes(), ALL_NAMESPACES);
    fill(&mut engine, StoreKind::DeviceClasses, &classes, |e, p| {
        let gpu = DeviceClassEntry {
            name: "gpu".into(),
            extended_resource_name: Some("example.com/gpu".into()),
        };
        e.relist_apply(
            StoreKind::DeviceClasses,
            p,
            object_id("/gpu"),
            Projected::DeviceClass(gpu),
        );
    });
    let used = engine.compute(&key, now).unwrap().decision.used;
    let get = |k: &str| used.get(k).map(|q| q.0.clone());
    assert_eq!(get("count/resourceclaims.resource.k8s.io").as_deref(), Some("2"));
    assert_eq!(
        get("gpu.deviceclass.resource.k8s.io/devices").as_deref(),
        Some("5")
    );
    // The pod charges 1 example.com/gpu itself; its verified claim (3 devices) adds 3 - 1.
    assert_eq!(
        get("requests.example.com/gpu").as_deref(),
        Some("5"),
        "1 (pod) + 2 (a) + 2 (b beyond its pod)"
    );
    assert_eq!(
        get("requests.deviceclass.resource.kubernetes.io/gpu").as_deref(),
        Some("5"),
        "the pod does not charge the implicit name: both claims in full"
    );

    // A DeviceClass change recomputes the quotas that read it.
    assert_eq!(
        engine
            .index
            .dirtied_by(&cluster, ALL_NAMESPACES, &device_classes()),
        vec![key.clone()]
    );
    // Without the mapping, requests.example.com/gpu is the pod's alone.
    assert_eq!(
        engine.delete(StoreKind::DeviceClasses, &classes, object_id("/gpu")),
        Applied::Replenish
    );
    let used = engine.compute(&key, now).unwrap().decision.used;
    assert_eq!(
        used.get("requests.example.com/gpu").map(|q| q.0.as_str()),
        Some("1")
    );
    assert_eq!(
        used.get("requests.deviceclass.resource.kubernetes.io/gpu")
            .map(|q| q.0.as_str()),
        Some("5"),
        "still charged by the claims evaluator's usage, which only the pods evaluator matched"
    );
}
