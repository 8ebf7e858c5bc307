//! Connection cuts and watch expiry under churn, on the real control plane.
//!
//! lazyquota talks to the apiserver through a loopback TCP proxy that cuts its connections
//! at random (watches, lists and status writes in flight). The apiserver runs without its
//! watch cache ([`Flavor::Compacting`]), so watches come from etcd, and the test compacts etcd
//! twice a second: a watch resumed at a compacted revision gets `410 Gone` and relists. The
//! test's own writes go directly to the apiserver. After each phase, with the faults stopped,
//! every quota must converge to `lazyquota usage`'s direct recomputation, and the racing
//! creates and deletes must be counted exactly.

mod common;

use std::{
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::{Duration, Instant},
};

use common::{controller_as, converged, create_crd, create_object, quota, test_config, used_becomes};
use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use lazyquota_testenv::{ControlPlane, Flavor, TestNamespace, eventually, proxy::CuttingProxy, unique_name};

const FLAVOR: Flavor = Flavor::Compacting;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuts_and_compaction_under_racing_churn_lose_nothing() {
    let cp = ControlPlane::get(FLAVOR);
    let url = cp.fact("LAZYQUOTA_APISERVER_URL").expect("apiserver url");
    let target = url
        .trim_start_matches("https://")
        .parse()
        .expect("apiserver address");
    let proxy = CuttingProxy::start(target, 20_261_130).await.expect("proxy");
    let kubeconfig = std::env::temp_dir().join(format!("{}.kubeconfig", unique_name("proxied")));
    proxy
        .kubeconfig(cp.kubeconfig(), &kubeconfig)
        .expect("proxied kubeconfig");
    let config = test_config();
    let snapshots = controller_as(FLAVOR, config.clone(), Some(kubeconfig));

    // ---- phase 1: connection cuts while objects come and go --------------------------------
    let ns = TestNamespace::create(FLAVOR, "cuts").await.expect("namespace");
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(
            &PostParams::default(),
            &quota("q", &[("count/configmaps", "1000")]),
        )
        .await
        .expect("quota");
    used_becomes(&quotas, "q", "count/configmaps", "1")
        .await
        .expect("filled");
    proxy.set_cutting(true);
    let configmaps = ns.api::<ConfigMap>();
    for i in 0..150 {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("cm-{i}")),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        configmaps
            .create(&PostParams::default(), &cm)
            .await
            .expect("create");
        if i % 3 == 0 {
            configmaps
                .delete(&format!("cm-{i}"), &DeleteParams::default())
                .await
                .expect("delete");
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let cut = proxy.cuts();
    proxy.set_cutting(false);
    assert!(cut >= 3, "the proxy cut connections during the phase ({cut})");
    assert!(
        eventually(Duration::from_secs(90), || converged(&ns))
            .await
            .is_some(),
        "after {cut} cuts every quota converges to the direct recomputation"
    );
    used_becomes(&quotas, "q", "count/configmaps", "101")
        .await
        .expect("1 root CA + 150 created − 50 deleted");

    // ---- phase 2: 1,000 racing creates and deletes, compaction and cuts ----------------------
    let racing = TestNamespace::create(FLAVOR, "racing").await.expect("namespace");
    let client = racing.client();
    let group = format!("{}.lazyquota.test", unique_name("g"));
    let races = create_crd(&client, &group, "races").await;
    let key = format!("count/races.{group}");
    let racing_quotas = racing.api::<ResourceQuota>();
    racing_quotas
        .create(&PostParams::default(), &quota("q", &[(&key, "100000")]))
        .await
        .expect("quota");
    used_becomes(&racing_quotas, "q", &key, "0")
        .await
        .expect("filled");
    let lists_before = lists_of(&snapshots, &key).await;

    proxy.set_cutting(true);
    let alive = Arc::new(AtomicI64::new(0));
    let mut workers = Vec::new();
    // 10 workers × 100 operations: 70 creates and 30 deletes of their own earlier objects.
    for w in 0..10 {
        let (client, races, ns, alive) = (
            client.clone(),
            races.clone(),
            racing.name().to_owned(),
            alive.clone(),
        );
        workers.push(tokio::spawn(async move {
            for i in 0..70 {
                let name = format!("r-{w}-{i}");
                if create_object(&client, &races, &ns, &name).await.is_ok() {
                    alive.fetch_add(1, Ordering::SeqCst);
                }
                // Deleted right after its create: the two events race in every watch.
                if i % 7 < 3 && delete(&client, &races, &ns, &name).await {
                    alive.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }));
    }
    let mut compactions = 0;
    while workers.iter().any(|w| !w.is_finished()) && compactions < 400 {
        if cp.compact_etcd().await.is_some() {
            compactions += 1;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for worker in workers {
        worker.await.expect("worker");
    }
    // Faults go on a little after the churn: an idle watch falls behind the compacted revision,
    // and the next cut makes it resume from there (bounded: 40 rounds).
    for _ in 0..40 {
        if lists_of(&snapshots, &key).await > lists_before {
            break;
        }
        if cp.compact_etcd().await.is_some() {
            compactions += 1;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let cut = proxy.cuts();
    proxy.set_cutting(false);
    let expected = alive.load(Ordering::SeqCst);
    let listed =
        kube::Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), racing.name(), &races)
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len();
    assert_eq!(
        i64::try_from(listed).unwrap(),
        expected,
        "the test's own bookkeeping"
    );
    assert!(
        compactions >= 3,
        "etcd was compacted during the churn ({compactions})"
    );
    // A create and its delete both inside a relist's gap are never delivered, so the charge
    // admission made for it is paid by no arrival: it is held until the create bound (the
    // apiserver's request timeout) and released then. Waiting that long is the rule's cost.
    let settled = Instant::now();
    let want = expected.to_string();
    let waited = eventually(config.charge_bound + Duration::from_secs(30), || async {
        let used = used_of(&racing_quotas, &key).await;
        (used.as_deref() == Some(want.as_str())).then_some(())
    })
    .await;
    let seen = used_of(&racing_quotas, &key).await;
    assert!(
        waited.is_some(),
        "exactly {expected} after {cut} cuts and {compactions} compactions (used is {seen:?})"
    );
    eprintln!(
        "churn: used reached {expected} {:.1} s after the faults stopped",
        settled.elapsed().as_secs_f64()
    );
    assert!(
        eventually(Duration::from_mins(1), || converged(&racing))
            .await
            .is_some(),
        "converged"
    );
    let lists_after = lists_of(&snapshots, &key).await;
    eprintln!(
        "churn: {cut} cuts, {compactions} compactions, {expected} objects, lists of the watch {lists_before} → {lists_after}"
    );
    assert!(
        lists_after > lists_before,
        "watch expiry made the watch relist ({lists_before} → {lists_after})"
    );
    common::delete_crd(&client, &group, "races").await;
}

/// The quota's `used` under `key`, as stored.
async fn used_of(quotas: &kube::Api<ResourceQuota>, key: &str) -> Option<String> {
    let quota = quotas.get("q").await.ok()?;
    Some(quota.status?.used?.get(key)?.0.clone())
}

/// Lists (initial + relists) of the watches serving `key`.
async fn lists_of(snapshots: &lazyquota_kube::controller::SnapshotHandle, key: &str) -> u32 {
    let snapshot = snapshots.get().await.expect("controller");
    snapshot
        .watches
        .iter()
        .filter(|w| w.key.resource.object_count_name() == key)
        .map(|w| w.lists)
        .sum()
}

/// Deletes an object; whether this call deleted it.
async fn delete(client: &kube::Client, resource: &kube::api::ApiResource, ns: &str, name: &str) -> bool {
    kube::Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), ns, resource)
        .delete(name, &DeleteParams::default())
        .await
        .is_ok()
}
