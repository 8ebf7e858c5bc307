//! Watch scope follows demand: namespaced watches while few namespaces demand a resource,
//! one cluster-wide watch filtered at ingest above `--namespace-watch-threshold` (1 here), and
//! a namespace that joins the cluster-wide watch is filled by a list of its own — the shared
//! watch does not relist.

mod common;

use std::time::Duration;

use common::{
    controller, create_crd, create_object, delete_crd, delete_object, quota, test_config, used_becomes,
};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{ApiResource, PostParams};
use lazyquota_kube::controller::{Config, SnapshotHandle, WatchInfo};
use lazyquota_testenv::{Flavor, TestNamespace, eventually, unique_name};

/// The controller's watches of `count_name` (this test's own CRD, so that quotas left by
/// other tests in terminating namespaces cannot add demand).
async fn watches_of(controller: &SnapshotHandle, count_name: &str) -> Vec<WatchInfo> {
    let snapshot = controller.get().await.expect("controller running");
    snapshot
        .watches
        .into_iter()
        .filter(|w| w.key.resource.object_count_name() == count_name)
        .collect()
}

async fn objects(ns: &TestNamespace, resource: &ApiResource, names: &[&str]) {
    for name in names {
        create_object(&ns.client(), resource, ns.name(), name)
            .await
            .expect("object");
    }
}

#[tokio::test]
async fn a_namespace_joining_a_cluster_wide_watch_is_filled_without_a_relist() {
    let config = Config {
        namespace_watch_threshold: 1,
        ..test_config()
    };
    let lazy = controller(Flavor::LazyquotaOnly, config);
    let a = TestNamespace::create(Flavor::LazyquotaOnly, "scope-a")
        .await
        .expect("namespace a");
    let b = TestNamespace::create(Flavor::LazyquotaOnly, "scope-b")
        .await
        .expect("namespace b");
    let c = TestNamespace::create(Flavor::LazyquotaOnly, "scope-c")
        .await
        .expect("namespace c");
    let group = format!("{}.lazyquota.test", unique_name("g"));
    let scopes = create_crd(&a.client(), &group, "scopes").await;
    let key = format!("count/scopes.{group}");
    objects(&a, &scopes, &["s0"]).await;
    objects(&b, &scopes, &["s0", "s1"]).await;
    objects(&c, &scopes, &["s0", "s1", "s2"]).await;
    let hard = [(key.as_str(), "100")];

    // One namespace: a namespaced watch.
    a.api::<ResourceQuota>()
        .create(&PostParams::default(), &quota("q", &hard))
        .await
        .expect("quota a");
    used_becomes(&a.api(), "q", &key, "1").await.expect("a counted");
    let watches = watches_of(&lazy, &key).await;
    assert_eq!(watches.len(), 1);
    assert_eq!(
        watches[0].key.namespace.as_deref(),
        Some(a.name()),
        "namespaced while under the threshold"
    );

    // Two namespaces: above the threshold, one cluster-wide watch.
    b.api::<ResourceQuota>()
        .create(&PostParams::default(), &quota("q", &hard))
        .await
        .expect("quota b");
    used_becomes(&b.api(), "q", &key, "2").await.expect("b counted");
    let cluster_wide = eventually(Duration::from_secs(30), || async {
        let w = watches_of(&lazy, &key).await;
        (w.len() == 1 && w[0].key.namespace.is_none() && w[0].synced).then(|| w[0].clone())
    })
    .await
    .expect("one synced cluster-wide watch");
    assert_eq!(cluster_wide.lists, 1);

    // A third namespace joins: filled by its own list, the shared watch keeps running.
    c.api::<ResourceQuota>()
        .create(&PostParams::default(), &quota("q", &hard))
        .await
        .expect("quota c");
    used_becomes(&c.api(), "q", &key, "3")
        .await
        .expect("c filled from its own list");
    let after = watches_of(&lazy, &key).await;
    assert_eq!(after.len(), 1, "still one watch");
    assert_eq!(
        after[0].id, cluster_wide.id,
        "the cluster-wide watch was not restarted"
    );
    assert_eq!(
        after[0].lists, 1,
        "the cluster-wide watch did not relist to fill the new namespace"
    );

    // And it is exact afterwards: events for the joined namespace count.
    objects(&c, &scopes, &["later"]).await;
    delete_object(&c.client(), &scopes, c.name(), "s0").await;
    delete_object(&c.client(), &scopes, c.name(), "s1").await;
    used_becomes(&c.api(), "q", &key, "2")
        .await
        .expect("c follows the shared watch");
    // Namespace a still counts through the same watch.
    delete_object(&a.client(), &scopes, a.name(), "s0").await;
    used_becomes(&a.api(), "q", &key, "0")
        .await
        .expect("a follows the shared watch");

    delete_crd(&a.client(), &group, "scopes").await;
    for ns in [a, b, c] {
        ns.delete().await.expect("delete namespace");
    }
}
