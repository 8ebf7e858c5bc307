//! lazyquota in lazy mode on the real control plane, as the only writer of quota status (KCM's
//! quota controller is off; the ResourceQuota admission plugin is on).

mod common;

use std::time::Duration;

use common::{
    apiserver_watches, controller, create_crd, create_object, delete_crd, delete_object, has_synced_watch,
    has_watch, quota, test_config, used_becomes,
};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota, ServiceAccount};
use kube::api::{DeleteParams, PostParams};
use lazyquota_testenv::{ControlPlane, Flavor, TestNamespace, eventually, unique_name};

const WAIT: Duration = Duration::from_secs(30);

/// 10 CRDs, one constrained: exactly one watch exists — seen by the apiserver itself and by
/// lazyquota — and it goes away with the quota. Deletes lower status.used.
#[tokio::test]
async fn watches_exactly_the_constrained_crd_and_stops_with_the_quota() {
    let snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "lifecycle")
        .await
        .expect("namespace");
    let client = ns.client();
    let group = format!("{}.lazyquota.test", unique_name("g"));
    let mut resources = Vec::new();
    for i in 0..10 {
        resources.push(create_crd(&client, &group, &format!("widget{i}s")).await);
    }
    let key = format!("count/widget3s.{group}");
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(&PostParams::default(), &quota("widgets", &[(&key, "5")]))
        .await
        .expect("quota");

    used_becomes(&quotas, "widgets", &key, "0")
        .await
        .expect("status.used filled for the constrained CRD");
    assert!(
        has_synced_watch(&snapshots, &key).await,
        "lazyquota reports a synced watch for widget3s"
    );
    let watched = eventually(WAIT, || async {
        (apiserver_watches(cp, &group, "widget3s").await == 1).then_some(())
    })
    .await;
    assert!(
        watched.is_some(),
        "the apiserver shows exactly one watch on widget3s"
    );
    for i in (0..10).filter(|i| *i != 3) {
        let plural = format!("widget{i}s");
        assert_eq!(
            apiserver_watches(cp, &group, &plural).await,
            0,
            "{plural} is not constrained and must not be watched"
        );
        assert!(!has_watch(&snapshots, &format!("count/{plural}.{group}")).await);
    }

    // Admission charges creates; the controller's replenishment lowers usage on delete.
    create_object(&client, &resources[3], ns.name(), "a")
        .await
        .expect("create a");
    create_object(&client, &resources[3], ns.name(), "b")
        .await
        .expect("create b");
    used_becomes(&quotas, "widgets", &key, "2")
        .await
        .expect("two widgets counted");
    delete_object(&client, &resources[3], ns.name(), "a").await;
    used_becomes(&quotas, "widgets", &key, "1")
        .await
        .expect("the delete lowered status.used");

    quotas
        .delete("widgets", &DeleteParams::default())
        .await
        .expect("delete quota");
    let stopped = eventually(WAIT, || async {
        (!has_watch(&snapshots, &key).await && apiserver_watches(cp, &group, "widget3s").await == 0)
            .then_some(())
    })
    .await;
    assert!(
        stopped.is_some(),
        "the watch stops once no quota constrains widget3s"
    );

    for i in 0..10 {
        delete_crd(&client, &group, &format!("widget{i}s")).await;
    }
    ns.delete().await.expect("delete namespace");
}

/// A quota naming a CRD that does not exist yet is pending; when the CRD is served its watch
/// starts and status.used is filled without waiting for a resync. Deleting the CRD stops it.
#[tokio::test]
async fn quota_on_a_crd_created_later_and_a_crd_deleted_while_watched() {
    let snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "pending")
        .await
        .expect("namespace");
    let client = ns.client();
    let group = format!("{}.lazyquota.test", unique_name("g"));
    let key = format!("count/gadgets.{group}");
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(
            &PostParams::default(),
            &quota("gadgets", &[(&key, "3"), ("count/configmaps", "10")]),
        )
        .await
        .expect("quota");

    // The other key is computed at once; the unknown resource stays absent and pending.
    used_becomes(&quotas, "gadgets", "count/configmaps", "1")
        .await
        .expect("configmaps counted");
    let pending = eventually(WAIT, || async {
        let snapshot = snapshots.get().await?;
        snapshot
            .pending
            .iter()
            .any(|(name, quotas)| name == &key && *quotas == 1)
            .then_some(())
    })
    .await;
    assert!(pending.is_some(), "{key} is reported pending");
    let q = quotas.get("gadgets").await.expect("quota");
    assert!(
        !q.status
            .and_then(|s| s.used)
            .is_some_and(|u| u.contains_key(&key)),
        "an unserved key stays absent"
    );

    let gadgets = create_crd(&client, &group, "gadgets").await;
    used_becomes(&quotas, "gadgets", &key, "0")
        .await
        .expect("status.used filled once the CRD is served");
    create_object(&client, &gadgets, ns.name(), "g1")
        .await
        .expect("create g1");
    create_object(&client, &gadgets, ns.name(), "g2")
        .await
        .expect("create g2");
    delete_object(&client, &gadgets, ns.name(), "g1").await;
    used_becomes(&quotas, "gadgets", &key, "1")
        .await
        .expect("one gadget left");

    delete_crd(&client, &group, "gadgets").await;
    let stopped = eventually(WAIT, || async {
        (!has_watch(&snapshots, &key).await && apiserver_watches(cp, &group, "gadgets").await == 0)
            .then_some(())
    })
    .await;
    assert!(stopped.is_some(), "deleting the CRD stops its watch");
    // The quota keeps working for its other key.
    common::create_configmap(&ns, "after-crd-delete").await;
    used_becomes(&quotas, "gadgets", "count/configmaps", "2")
        .await
        .expect("configmaps still counted");
    ns.delete().await.expect("delete namespace");
}

/// Waits for the namespace's `default` ServiceAccount: pods cannot be created before it.
async fn default_service_account(ns: &TestNamespace) {
    let accounts = ns.api::<ServiceAccount>();
    eventually(WAIT, || async { accounts.get("default").await.ok() })
        .await
        .expect("default service account");
}

fn pod(name: &str, cpu: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none",
            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}, "limits": {"cpu": cpu, "memory": "64Mi"}}}]}
    }))
    .expect("valid pod")
}

/// Admission enforces the status lazyquota writes, and a delete frees the quota again.
#[tokio::test]
async fn admission_enforces_our_status_and_deletes_free_quota() {
    let _snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "pods")
        .await
        .expect("namespace");
    default_service_account(&ns).await;
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(
            &PostParams::default(),
            &quota(
                "compute",
                &[("pods", "5"), ("requests.cpu", "1"), ("limits.memory", "1Gi")],
            ),
        )
        .await
        .expect("quota");
    used_becomes(&quotas, "compute", "requests.cpu", "0")
        .await
        .expect("initial usage written");

    let pods = ns.api::<Pod>();
    pods.create(&PostParams::default(), &pod("a", "600m"))
        .await
        .expect("first pod fits");
    let err = pods
        .create(&PostParams::default(), &pod("b", "600m"))
        .await
        .expect_err("second pod exceeds requests.cpu");
    assert!(err.to_string().contains("exceeded quota: compute"), "{err}");
    used_becomes(&quotas, "compute", "requests.cpu", "600m")
        .await
        .expect("usage charged");

    pods.delete("a", &DeleteParams::default())
        .await
        .expect("delete pod");
    used_becomes(&quotas, "compute", "requests.cpu", "0")
        .await
        .expect("the delete freed the quota");
    used_becomes(&quotas, "compute", "pods", "0")
        .await
        .expect("pods lowered");
    // Quota admission reads quotas from its own informer, which may lag the status just read
    // by a moment: retried briefly while it still refuses for the old value.
    let fits = eventually(Duration::from_secs(5), || async {
        match pods.create(&PostParams::default(), &pod("b", "600m")).await {
            Ok(_) => Some(Ok(())),
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("exceeded quota") => None,
            Err(e) => Some(Err(e)),
        }
    })
    .await;
    fits.expect("admission saw the freed quota within 5 s")
        .expect("now the pod fits");
    used_becomes(&quotas, "compute", "limits.memory", "64Mi")
        .await
        .expect("limits counted");
    ns.delete().await.expect("delete namespace");
}

/// Bad input loses nothing: a quota with absurd values and 10,000 hard keys is computed (the
/// keys no evaluator knows stay absent), and a quota next to it keeps working.
#[tokio::test]
async fn absurd_values_and_ten_thousand_keys_break_nothing() {
    let snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "absurd")
        .await
        .expect("namespace");
    let quotas = ns.api::<ResourceQuota>();
    let mut hard: Vec<(String, String)> = (0..10_000)
        .map(|i| (format!("example.com/unknown-{i}"), "1".to_owned()))
        .collect();
    hard.push(("count/configmaps".into(), "1e18".into()));
    hard.push(("requests.cpu".into(), "999999999999999999".into()));
    hard.push(("limits.memory".into(), "8Ei".into()));
    let hard_refs: Vec<(&str, &str)> = hard.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    quotas
        .create(&PostParams::default(), &quota("huge", &hard_refs))
        .await
        .expect("the apiserver accepts it");
    quotas
        .create(
            &PostParams::default(),
            &quota("plain", &[("count/configmaps", "10")]),
        )
        .await
        .expect("plain");

    used_becomes(&quotas, "huge", "count/configmaps", "1")
        .await
        .expect("computed despite 10,000 keys");
    used_becomes(&quotas, "huge", "requests.cpu", "0")
        .await
        .expect("absurd limit, ordinary usage");
    used_becomes(&quotas, "plain", "count/configmaps", "1")
        .await
        .expect("the other quota is unaffected");
    let q = quotas.get("huge").await.expect("quota");
    let used = q.status.and_then(|s| s.used).unwrap_or_default();
    assert!(
        !used.keys().any(|k| k.starts_with("example.com/")),
        "keys no evaluator computes stay absent"
    );
    common::create_configmap(&ns, "one-more").await;
    used_becomes(&quotas, "plain", "count/configmaps", "2")
        .await
        .expect("still charged by admission");
    assert!(snapshots.get().await.is_some(), "the controller is alive");
    ns.delete().await.expect("delete namespace");
}

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
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("brokens.{group}")},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"plural": "brokens", "singular": "broken", "kind": "Broken"},
            "versions": [
                {"name": "v1", "served": true, "storage": true,
                 "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
                {"name": "v2", "served": true, "storage": false,
                 "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}
            ],
            // Nothing listens on loopback port 1: every conversion fails.
            "conversion": {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {"url": "https://127.0.0.1:1/convert"}}}
        }
    }))
    .expect("CRD");
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

/// A quota edited from `count/<x>` to `count/<y>`: the watch moves from x to y, and status.used
/// holds y's count and no longer x's.
#[tokio::test]
async fn a_quota_edited_from_one_type_to_another_moves_the_watch() {
    let snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "edit")
        .await
        .expect("namespace");
    let client = ns.client();
    let group = format!("{}.lazyquota.test", unique_name("g"));
    let xs = create_crd(&client, &group, "xs").await;
    let ys = create_crd(&client, &group, "ys").await;
    for name in ["x1", "x2"] {
        create_object(&client, &xs, ns.name(), name).await.expect("x");
    }
    for name in ["y1", "y2", "y3"] {
        create_object(&client, &ys, ns.name(), name).await.expect("y");
    }
    let (x, y) = (format!("count/xs.{group}"), format!("count/ys.{group}"));
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(&PostParams::default(), &quota("q", &[(&x, "10")]))
        .await
        .expect("quota");
    used_becomes(&quotas, "q", &x, "2").await.expect("x counted");
    let group_ref = group.as_str();
    let watching = |xw: u64, yw: u64| async move {
        eventually(WAIT, || async {
            (apiserver_watches(cp, group_ref, "xs").await == xw
                && apiserver_watches(cp, group_ref, "ys").await == yw)
                .then_some(())
        })
        .await
    };
    assert!(watching(1, 0).await.is_some(), "x watched, y not");

    let mut edited = quotas.get("q").await.expect("quota");
    edited.spec = quota("q", &[(&y, "10")]).spec;
    quotas
        .replace("q", &PostParams::default(), &edited)
        .await
        .expect("edit quota");
    used_becomes(&quotas, "q", &y, "3").await.expect("y counted");
    let used = quotas
        .get("q")
        .await
        .expect("quota")
        .status
        .and_then(|s| s.used)
        .unwrap_or_default();
    assert!(
        !used.contains_key(&x),
        "x's key is gone from status.used: {used:?}"
    );
    assert!(watching(0, 1).await.is_some(), "the watch moved from x to y");
    assert!(!has_watch(&snapshots, &x).await, "lazyquota no longer watches x");
    delete_crd(&client, &group, "xs").await;
    delete_crd(&client, &group, "ys").await;
    ns.delete().await.expect("delete namespace");
}

/// A namespace deleted with its quotas in it: its watches stop once the namespace controller
/// has removed the quotas; a quota in another namespace on the same type keeps working.
#[tokio::test]
async fn a_namespace_deleted_with_quotas_releases_its_watches() {
    let snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let doomed = TestNamespace::create(Flavor::LazyquotaOnly, "doomed")
        .await
        .expect("namespace");
    let kept = TestNamespace::create(Flavor::LazyquotaOnly, "kept")
        .await
        .expect("namespace");
    let client = doomed.client();
    let group = format!("{}.lazyquota.test", unique_name("g"));
    let only = create_crd(&client, &group, "onlys").await;
    let shared = create_crd(&client, &group, "shareds").await;
    for name in ["a", "b"] {
        create_object(&client, &only, doomed.name(), name)
            .await
            .expect("object");
        create_object(&client, &shared, doomed.name(), name)
            .await
            .expect("object");
    }
    create_object(&client, &shared, kept.name(), "a")
        .await
        .expect("object");
    let (only_key, shared_key) = (format!("count/onlys.{group}"), format!("count/shareds.{group}"));
    let doomed_quotas = doomed.api::<ResourceQuota>();
    doomed_quotas
        .create(
            &PostParams::default(),
            &quota("q", &[(&only_key, "10"), (&shared_key, "10")]),
        )
        .await
        .expect("quota");
    let kept_quotas = kept.api::<ResourceQuota>();
    kept_quotas
        .create(&PostParams::default(), &quota("q", &[(&shared_key, "10")]))
        .await
        .expect("quota");
    used_becomes(&doomed_quotas, "q", &only_key, "2")
        .await
        .expect("counted");
    used_becomes(&kept_quotas, "q", &shared_key, "1")
        .await
        .expect("counted");
    // Its WATCH request starts right after the list that counted it.
    assert!(
        eventually(Duration::from_secs(10), || async {
            (apiserver_watches(cp, &group, "onlys").await == 1).then_some(())
        })
        .await
        .is_some(),
        "the apiserver sees one watch of onlys"
    );

    let kept_name = kept.name().to_owned();
    doomed.delete().await.expect("delete namespace");
    let released = eventually(Duration::from_mins(1), || async {
        (apiserver_watches(cp, &group, "onlys").await == 0 && !has_watch(&snapshots, &only_key).await)
            .then_some(())
    })
    .await;
    assert!(released.is_some(), "the deleted namespace's watch is released");
    create_object(&kept.client(), &shared, &kept_name, "b")
        .await
        .expect("object");
    used_becomes(&kept_quotas, "q", &shared_key, "2")
        .await
        .expect("the other namespace's quota keeps working");
    assert!(has_synced_watch(&snapshots, &shared_key).await);
    delete_crd(&client, &group, "onlys").await;
    delete_crd(&client, &group, "shareds").await;
    kept.delete().await.expect("delete namespace");
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
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "ghost"},
        "spec": {"ports": [{"port": 443, "protocol": "TCP"}]}
    }))
    .expect("service");
    ns.api::<Service>()
        .create(&PostParams::default(), &service)
        .await
        .expect("service without endpoints");
    let apiservice: APIService = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("v1alpha1.{group}")},
        "spec": {"group": group, "version": "v1alpha1", "groupPriorityMinimum": 1000,
                 "versionPriority": 15, "insecureSkipTLSVerify": true,
                 "service": {"namespace": ns.name(), "name": "ghost", "port": 443}}
    }))
    .expect("apiservice");
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

fn memory_pod(name: &str, memory: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none",
            "resources": {"requests": {"memory": memory}, "limits": {"memory": memory}}}]}
    }))
    .expect("valid pod")
}

/// `status.used[key]` once it equals `want` by value (the printed format of a sum depends on
/// which addend comes first, in KCM as here).
async fn used_value_becomes(
    quotas: &kube::Api<ResourceQuota>,
    name: &str,
    key: &str,
    want: &str,
) -> Option<()> {
    let want = lazyquota_quota::Quantity::parse(want).expect("expected value parses");
    eventually(WAIT, || async {
        let used = quotas.get(name).await.ok()?.status?.used?;
        let got = lazyquota_quota::Quantity::parse_k8s(used.get(key)?).ok()?;
        (got == want).then_some(())
    })
    .await
}

/// Tenants choose quantities, and the apiserver accepts `memory: 1e30` (KCM sums it with
/// arbitrary precision). Every pod counts in `pods` and `count/pods`, memory sums exactly far
/// beyond 64 bits (checked after a delete, which admission cannot compute), and a pod beyond
/// what lazyquota holds exactly (`1e2000`) makes only its key withheld — removed from
/// status.used with an Event, so admission refuses to charge it — never written lower; the
/// other keys stay exact, and the key is computed again once that pod is gone.
#[tokio::test]
async fn huge_quantities_count_exactly_and_beyond_range_keys_are_withheld() {
    let snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "huge")
        .await
        .expect("namespace");
    default_service_account(&ns).await;
    let pods = ns.api::<Pod>();
    let pp = PostParams::default();
    // Created before any quota: admission would refuse it under requests.memory=1E40.
    pods.create(&pp, &memory_pod("beyond", "1e2000"))
        .await
        .expect("the apiserver accepts 1e2000");
    let quotas = ns.api::<ResourceQuota>();
    let hard = [("pods", "10"), ("count/pods", "10"), ("requests.memory", "1E40")];
    quotas.create(&pp, &quota("mem", &hard)).await.expect("quota");
    used_becomes(&quotas, "mem", "pods", "1")
        .await
        .expect("the pod beyond range counts in pods");
    used_becomes(&quotas, "mem", "count/pods", "1")
        .await
        .expect("and in count/pods");
    let event = common::event_with(&ns, "UsageWithheld", "requests.memory", WAIT).await;
    assert!(event.is_some(), "an Event names the withheld key");
    let q = quotas.get("mem").await.expect("quota");
    assert!(
        !q.status
            .and_then(|s| s.used)
            .unwrap_or_default()
            .contains_key("requests.memory"),
        "the unknown key is withheld, not written lower"
    );
    // Admission's own refusal of a key with no used ("status unknown for quota"), not any
    // error: its quota cache may lag the status just read by a moment, so a refusal for
    // another reason is tried again, briefly.
    let mut refusal = None;
    for _ in 0..50 {
        match pods.create(&pp, &memory_pod("refused", "1Mi")).await {
            Ok(_) => panic!("admission charged a withheld key"),
            Err(kube::Error::Api(s))
                if s.code == 403 && s.message.contains("status unknown for quota: mem") =>
            {
                refusal = Some(s.message);
                break;
            }
            Err(other) => {
                refusal = None;
                eprintln!("not yet admission's refusal of the withheld key: {other}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
    assert!(
        refusal.is_some(),
        "admission refuses to charge a withheld key (status unknown for quota: mem)"
    );

    pods.delete("beyond", &DeleteParams::default())
        .await
        .expect("delete");
    used_becomes(&quotas, "mem", "requests.memory", "0")
        .await
        .expect("computed again once the pod is gone");
    // Admission reads quotas from the apiserver's cache, which can lag the status just read
    // by a moment: until it has the written requests.memory it answers "status unknown".
    let small = eventually(WAIT, || {
        let pods = pods.clone();
        async move {
            pods.create(&PostParams::default(), &memory_pod("small", "64Mi"))
                .await
                .ok()
        }
    })
    .await;
    assert!(small.is_some(), "small: admitted once the key is written again");
    for i in 0..4 {
        pods.create(&pp, &memory_pod(&format!("big-{i}"), "1e30"))
            .await
            .expect("1e30 fits under 1E40");
    }
    pods.delete("big-0", &DeleteParams::default())
        .await
        .expect("delete");
    used_becomes(&quotas, "mem", "pods", "4")
        .await
        .expect("every pod counts, also at 1e30");
    if used_value_becomes(
        &quotas,
        "mem",
        "requests.memory",
        "3000000000000000000000067108864",
    )
    .await
    .is_none()
    {
        let status = quotas.get("mem").await.ok().and_then(|q| q.status);
        panic!("memory summed exactly: 3e30 + 64Mi; status {status:?}");
    }
    let snapshot = snapshots.get().await.expect("alive");
    assert!(snapshot.withheld.is_empty(), "nothing withheld any more");
    ns.delete().await.expect("delete namespace");
}
