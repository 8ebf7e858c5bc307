//! Proves the test control plane is a real Kubernetes: the ResourceQuota admission plugin in
//! kube-apiserver enforces `count/configmaps`, and KCM's quota controller fills `status.used`.

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{ConfigMap, ResourceQuota, ResourceQuotaSpec},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::api::{ListParams, ObjectMeta, PostParams};
use lazyquota_testenv::{ControlPlane, Flavor, TestNamespace, eventually};

fn configmap(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

#[tokio::test]
async fn admission_enforces_count_quota_that_kcm_accounts() {
    let ns = TestNamespace::create(Flavor::KcmQuota, "cp-real")
        .await
        .expect("namespace");
    let quotas = ns.api::<ResourceQuota>();
    let configmaps = ns.api::<ConfigMap>();

    // The root-CA publisher puts kube-root-ca.crt into every new namespace. Upstream's quota
    // controller does not recompute on adds (admission charges creates), so a quota created
    // while that ConfigMap is racing in would stay stale until the 5-minute resync: wait for it.
    eventually(Duration::from_secs(30), || async {
        configmaps.get_opt("kube-root-ca.crt").await.ok().flatten()
    })
    .await
    .expect("the root CA ConfigMap is published");

    let quota = |hard: &str| ResourceQuota {
        metadata: ObjectMeta {
            name: Some("count-configmaps".into()),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some([("count/configmaps".to_owned(), Quantity(hard.into()))].into()),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    };
    quotas
        .create(&PostParams::default(), &quota("3"))
        .await
        .expect("create quota");
    eventually(Duration::from_secs(60), || async {
        quotas
            .get("count-configmaps")
            .await
            .ok()?
            .status?
            .used?
            .get("count/configmaps")
            .map(|_| ())
    })
    .await
    .expect("KCM's quota controller fills status.used");
    // A spec.hard change makes KCM recompute, now over a settled informer cache.
    quotas
        .replace("count-configmaps", &PostParams::default(), &{
            let mut q = quotas.get("count-configmaps").await.expect("quota");
            q.spec = quota("2").spec;
            q
        })
        .await
        .expect("lower the limit to 2");

    // KCM fills status.used with the number of ConfigMaps that exist.
    let used = eventually(Duration::from_secs(60), || async {
        let q = quotas.get("count-configmaps").await.ok()?;
        let status = q.status?;
        let hard = status.hard?.get("count/configmaps")?.0.clone();
        let used = status.used?.get("count/configmaps")?.0.clone();
        let actual = configmaps.list(&ListParams::default()).await.ok()?.items.len();
        (hard == "2" && used == actual.to_string()).then_some(actual)
    })
    .await
    .expect("KCM's quota controller fills status.used with the ConfigMap count");
    assert!(
        used <= 2,
        "a fresh namespace holds at most the root CA ConfigMap, found {used}"
    );

    // Admission charges each create; the one that would exceed 2 is rejected.
    for i in used..2 {
        configmaps
            .create(&PostParams::default(), &configmap(&format!("cm-{i}")))
            .await
            .expect("within quota");
    }
    let err = configmaps
        .create(&PostParams::default(), &configmap("one-too-many"))
        .await
        .expect_err("the third ConfigMap must be rejected by the ResourceQuota admission plugin");
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(
                status.message.contains("exceeded quota: count-configmaps"),
                "{}",
                status.message
            );
            assert!(
                status.message.contains("count/configmaps=2"),
                "{}",
                status.message
            );
        }
        other => panic!("expected a 403 from admission, got {other}"),
    }

    ns.delete().await.expect("delete namespace");
}

/// KCM's quota controller is switchable: its work queue shows in KCM's `/metrics` only where
/// it runs. This is what lets lazyquota be the only writer in the lazyquota-only flavour.
#[tokio::test]
async fn kcm_quota_controller_is_switchable_and_kcm_metrics_are_readable() {
    let queue = "name=\"resourcequota_primary\"";
    let with = ControlPlane::get(Flavor::KcmQuota)
        .kcm_metrics()
        .await
        .expect("KCM /metrics (quota on)");
    assert!(
        with.contains("workqueue_adds_total"),
        "KCM /metrics has no workqueue metrics"
    );
    assert!(
        with.contains(queue),
        "KCM with its quota controller has no resourcequota_primary queue"
    );
    let without = ControlPlane::get(Flavor::LazyquotaOnly)
        .kcm_metrics()
        .await
        .expect("KCM /metrics (quota off)");
    assert!(
        without.contains("workqueue_adds_total"),
        "KCM /metrics has no workqueue metrics"
    );
    assert!(
        !without.contains(queue),
        "KCM runs its quota controller in the lazyquota-only flavour"
    );
}
