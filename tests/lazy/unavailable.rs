//! A type that cannot be read holds only its own keys: a broken conversion webhook, an
//! APIService without a backend; a quota past validation is reported and isolated.

use super::*;

/// A CRD whose preferred version needs a conversion webhook that does not answer cannot be
/// listed. Upstream KCM would stop accounting every quota until it syncs (kubernetes
/// #96066); lazyquota withholds only the key computed from it, reports it with an Event and
/// a failing watch, and keeps the other keys current.
#[tokio::test]
async fn a_crd_with_a_broken_conversion_webhook_withholds_only_its_key() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "broken-crd")
        .await
        .expect("namespace");
    let client = ns.client();
    let group = format!("{}.lazyquota.test", unique_name("g"));
    // Nothing listens on loopback port 1: every conversion fails.
    let crd = lazyquota_testenv::unavailable::broken_conversion_crd(&group, "https://127.0.0.1:1/convert");
    kube::Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd)
        .await
        .expect("create CRD");
    // Stored at v1 (writing it needs no conversion); v2, the preferred version, cannot be read.
    let v1 = kube::api::ApiResource {
        group: group.clone(),
        version: "v1".into(),
        api_version: format!("{group}/v1"),
        kind: "Broken".into(),
        plural: "brokens".into(),
    };
    let stored = eventually(WAIT, || async {
        create_object(&client, &v1, ns.name(), "b1").await.ok()
    })
    .await;
    assert!(stored.is_some(), "an object stored at v1");

    let key = format!("count/brokens.{group}");
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(
            &PostParams::default(),
            &quota("mixed", &[(&key, "5"), ("count/configmaps", "5")]),
        )
        .await
        .expect("quota");
    used_becomes(&quotas, "mixed", "count/configmaps", "1")
        .await
        .expect("the other key is current");
    let failing = eventually(WAIT, || async {
        let snapshot = snapshots.get().await?;
        snapshot
            .watches
            .iter()
            .find(|w| w.key.resource.object_count_name() == key)
            .and_then(|w| w.failure.clone())
    })
    .await
    .expect("the broken type's watch is reported failing");
    let q = quotas.get("mixed").await.expect("quota");
    assert!(
        !q.status
            .and_then(|s| s.used)
            .is_some_and(|u| u.contains_key(&key)),
        "its key is withheld, not counted as 0 (failure: {failing})"
    );
    assert!(
        common::event_with(&ns, "ResourceUnavailable", "brokens", WAIT)
            .await
            .is_some(),
        "a ResourceUnavailable Event names the resource"
    );

    common::create_configmap(&ns, "more").await;
    ns.api::<k8s_openapi::api::core::v1::ConfigMap>()
        .delete("more", &DeleteParams::default())
        .await
        .expect("delete configmap");
    used_becomes(&quotas, "mixed", "count/configmaps", "1")
        .await
        .expect("still current");
    delete_crd(&client, &group, "brokens").await;
    ns.delete().await.expect("delete namespace");
}

/// An APIService whose backend does not exist: aggregated discovery lists its group as
/// `Stale`. The key counting its resource keeps its previous value, the quota gets an Event
/// and the group is reported; the quota's other keys stay current.
#[tokio::test]
async fn an_unavailable_apiservice_holds_only_its_keys() {
    use k8s_openapi::api::core::v1::{ConfigMap, Service};
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
    let snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "apiservice")
        .await
        .expect("namespace");
    let client = ns.client();
    let group = format!("{}.lazyquota.test", unique_name("ghost"));
    let service = lazyquota_testenv::unavailable::ghost_service();
    ns.api::<Service>()
        .create(&PostParams::default(), &service)
        .await
        .expect("service without endpoints");
    let apiservice = lazyquota_testenv::unavailable::ghost_apiservice(&group, ns.name());
    let apiservices = kube::Api::<APIService>::all(client.clone());
    apiservices
        .create(&PostParams::default(), &apiservice)
        .await
        .expect("create APIService");

    let key = format!("count/widgets.{group}");
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(
            &PostParams::default(),
            &quota("q", &[(&key, "5"), ("count/configmaps", "10")]),
        )
        .await
        .expect("quota");
    used_becomes(&quotas, "q", "count/configmaps", "1")
        .await
        .expect("configmaps counted");
    // A value stored earlier (say, while the APIService answered) must be kept, not zeroed.
    let mut stored = quotas.get_status("q").await.expect("quota");
    let mut used = stored.status.clone().and_then(|s| s.used).unwrap_or_default();
    used.insert(
        key.clone(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("4".into()),
    );
    stored.status.get_or_insert_with(Default::default).used = Some(used);
    quotas
        .replace_status("q", &PostParams::default(), &stored)
        .await
        .expect("store a previous value");

    let event = common::event_with(&ns, "ResourceUnavailable", &group, Duration::from_mins(1)).await;
    assert!(event.is_some(), "an Event names the unavailable group");
    let reported = snapshots.get().await.expect("controller").unavailable_groups;
    assert!(reported.contains(&group), "the group is reported: {reported:?}");

    common::create_configmap(&ns, "more").await;
    used_becomes(&quotas, "q", "count/configmaps", "2")
        .await
        .expect("configmaps stay current");
    let used = quotas
        .get("q")
        .await
        .expect("quota")
        .status
        .and_then(|s| s.used)
        .unwrap_or_default();
    assert_eq!(
        used.get(&key).map(|q| q.0.as_str()),
        Some("4"),
        "the unavailable key keeps its value"
    );
    ns.api::<ConfigMap>()
        .delete("more", &DeleteParams::default())
        .await
        .expect("delete configmap");
    apiservices
        .delete(&format!("v1alpha1.{group}"), &DeleteParams::default())
        .await
        .expect("delete APIService");
    ns.delete().await.expect("delete namespace");
}

/// A quota that got past validation (written to etcd directly, as an older or buggy writer
/// could): an unknown scope and malformed hard keys. lazyquota reports it with an Event and a
/// log line, computes what it can, and the namespace's other quota is unaffected.
#[tokio::test]
async fn a_quota_that_got_past_validation_is_reported_and_isolated() {
    let snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "invalid")
        .await
        .expect("namespace");
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(
            &PostParams::default(),
            &quota("good", &[("count/configmaps", "10")]),
        )
        .await
        .expect("quota");
    let object = serde_json::json!({
        "kind": "ResourceQuota", "apiVersion": "v1",
        "metadata": {"name": "bad", "namespace": ns.name(),
                     "uid": "6f7c1f1e-0000-4000-8000-00000000000b",
                     "creationTimestamp": "2026-11-30T00:00:00Z"},
        "spec": {"hard": {"count/configmaps": "10", "count/": "1", "Not A Name!": "2"},
                 "scopes": ["Bogus"]}
    });
    // ByteString serialises as base64, which etcd's JSON gateway expects.
    let b64 = |s: &str| serde_json::to_value(k8s_openapi::ByteString(s.as_bytes().to_vec())).expect("base64");
    let put = serde_json::json!({
        "key": b64(&format!("/registry/resourcequotas/{}/bad", ns.name())),
        "value": b64(&object.to_string()),
    });
    let etcd = cp.fact("LAZYQUOTA_ETCD_URL").expect("etcd url");
    let out = tokio::process::Command::new("curl")
        .args(["-fsS", "--max-time", "5", "-X", "POST", "-d", &put.to_string()])
        .arg(format!("{etcd}/v3/kv/put"))
        .output()
        .await
        .expect("curl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    assert!(
        common::event_with(&ns, "InvalidSpec", "Bogus", WAIT)
            .await
            .is_some(),
        "an InvalidSpec Event on the bad quota names the scope"
    );
    // status.hard copies spec.hard, so the apiserver refuses any status for it (as it would
    // KCM's): reported on the quota, retried with backoff, nothing else held up.
    assert!(
        common::event_with(&ns, "StatusRejected", "Not A Name!", WAIT)
            .await
            .is_some(),
        "a StatusRejected Event names the key"
    );
    common::create_configmap(&ns, "more").await;
    used_becomes(&quotas, "good", "count/configmaps", "2")
        .await
        .expect("the create is counted");
    // A delete: admission never lowers `used`, only the controller does.
    ns.api::<k8s_openapi::api::core::v1::ConfigMap>()
        .delete("more", &kube::api::DeleteParams::default())
        .await
        .expect("delete");
    used_becomes(&quotas, "good", "count/configmaps", "1")
        .await
        .expect("the good quota keeps working: its delete is counted");
    assert!(snapshots.get().await.is_some(), "the controller is alive");
    ns.delete().await.expect("delete namespace");
}
