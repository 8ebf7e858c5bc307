//! Another writer fighting over the same quota status: lazyquota's writes conflict (409),
//! are retried with backoff, and once the other writer stops, status.used converges to the
//! truth once the create bound has released the other writer's raises (lazyquota takes them
//! for charges) and the next recalculation comes (here a 2 s resync; KCM's default is 5 min).
//! The writer is bounded: 30 writes.

mod common;

use std::{collections::BTreeMap, time::Duration};

use common::{controller, quota, test_config, used_becomes};
use k8s_openapi::{
    api::core::v1::{ResourceQuota, ResourceQuotaStatus},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::api::PostParams;
use lazyquota_kube::controller::Config;
use lazyquota_testenv::{Flavor, TestNamespace};

/// The binary's one controller. The other writer's raises are charges to lazyquota (a raise
/// of `status.used` it did not write, as admission's are) and nothing pays them: they are held
/// until the create bound. No create is in flight here, so the bound is short (the default is
/// the apiserver's 1-minute request timeout), which keeps the wait for the truth short.
fn config() -> Config {
    Config {
        resync_period: Duration::from_secs(2),
        charge_bound: Duration::from_secs(5),
        ..test_config()
    }
}

#[tokio::test]
async fn a_concurrent_status_writer_does_not_win() {
    let _lazy = controller(Flavor::LazyquotaOnly, config());
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "conflicts")
        .await
        .expect("namespace");
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(&PostParams::default(), &quota("q", &[("count/configmaps", "50")]))
        .await
        .expect("quota");
    used_becomes(&quotas, "q", "count/configmaps", "1")
        .await
        .expect("computed");

    // The other writer: 30 status updates with a wrong value, 200 ms apart, each on the version
    // its own last write returned — so every write lazyquota slips in between (its 2 s resync
    // puts at least two into the 6 s) makes the other writer's next one conflict.
    let mut conflicts = 0;
    let mut q = quotas.get("q").await.expect("quota");
    for i in 0..30 {
        let hard = q.spec.as_ref().and_then(|s| s.hard.clone());
        q.status = Some(ResourceQuotaStatus {
            hard,
            used: Some(BTreeMap::from([(
                "count/configmaps".to_owned(),
                Quantity(format!("{}", 40 + i % 7)),
            )])),
        });
        match quotas.replace_status("q", &PostParams::default(), &q).await {
            Ok(written) => q = written,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                conflicts += 1;
                q = quotas.get("q").await.expect("quota");
            }
            Err(e) => panic!("status write: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("the other writer met {conflicts} conflicts in 30 writes");
    let ours = common::controller_counter("lazyquota_status_writes_total", "result", "conflict");
    eprintln!("lazyquota met {ours} conflicts");
    assert!(
        conflicts > 0 || ours > 0.0,
        "the two writers never conflicted: the test did not exercise a 409"
    );
    used_becomes(&quotas, "q", "count/configmaps", "1")
        .await
        .expect("lazyquota's value wins back");
    ns.delete().await.expect("delete namespace");
}

/// A status write changes only the status: the quota's labels and annotations (Helm's
/// ownership annotations, kcp's cluster-scoped annotation) stay, and a key dropped from
/// `spec.hard` leaves `status.hard` and `status.used`. (Before, a PUT of the status subresource
/// with a body of lazyquota's own removed every label and annotation: ResourceQuota's status
/// strategy keeps only the old spec.)
#[tokio::test]
async fn a_status_write_keeps_labels_and_annotations() {
    let _lazy = controller(Flavor::LazyquotaOnly, config());
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "keep-meta")
        .await
        .expect("namespace");
    let quotas = ns.api::<ResourceQuota>();
    let mut q = quota("q", &[("count/configmaps", "50"), ("count/secrets", "5")]);
    q.metadata.labels = Some(BTreeMap::from([(
        "app.kubernetes.io/managed-by".to_owned(),
        "Helm".to_owned(),
    )]));
    q.metadata.annotations = Some(BTreeMap::from([(
        "meta.helm.sh/release-name".to_owned(),
        "team-quota".to_owned(),
    )]));
    quotas.create(&PostParams::default(), &q).await.expect("quota");
    used_becomes(&quotas, "q", "count/configmaps", "1")
        .await
        .expect("computed");
    let written = quotas.get("q").await.expect("quota");
    assert_eq!(
        written
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/managed-by")),
        Some(&"Helm".to_owned()),
        "labels kept"
    );
    assert_eq!(
        written
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("meta.helm.sh/release-name")),
        Some(&"team-quota".to_owned()),
        "annotations kept"
    );
    // A key leaves spec.hard: it leaves the status too.
    quotas
        .patch(
            "q",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"hard": {"count/secrets": null}}})),
        )
        .await
        .expect("patch");
    let dropped = lazyquota_testenv::eventually(Duration::from_secs(30), || async {
        let status = quotas.get("q").await.ok()?.status?;
        let gone = !status.hard?.contains_key("count/secrets") && !status.used?.contains_key("count/secrets");
        gone.then_some(())
    })
    .await;
    assert!(
        dropped.is_some(),
        "count/secrets left status.hard and status.used"
    );
    ns.delete().await.expect("delete namespace");
}
