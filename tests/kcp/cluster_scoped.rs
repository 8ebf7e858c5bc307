//! kcp's cluster-scoped quotas: counted over every namespace of the logical cluster, and
//! written by lazyquota as kcp's own controller writes them.

use super::*;

/// The key counting child workspaces, cluster-scoped objects.
const WORKSPACES: &str = "count/workspaces.tenancy.kcp.io";

/// A workspace with namespaces `admin`, `ns-a`, `ns-b`, `ns-c`: configmaps 2/1/0 of its own in
/// the three (plus the `kube-root-ca.crt` kcp puts in every namespace), bound widgets 2/1/0, one
/// child workspace, and kcp's cluster-scoped quota in `admin` (annotation
/// `experimental.quota.kcp.io/cluster-scoped: "true"`) on `count/configmaps`, the widgets and
/// `count/workspaces.tenancy.kcp.io`.
async fn cluster_scoped_fixture(shard: &KcpShard, tag: &str) -> (Bound, Client, String) {
    let fixture = Bound::new(shard, tag, &[0]).await;
    let client = fixture.consumers[0].1.clone();
    for ns in ["admin", "ns-a", "ns-b", "ns-c"] {
        namespace(&client, ns).await;
    }
    create_configmaps(&client, "ns-a", 2, "cm").await;
    create_configmaps(&client, "ns-b", 1, "cm").await;
    create_objects(&client, &fixture.ty, "ns-a", &["w-0", "w-1"]).await;
    create_objects(&client, &fixture.ty, "ns-b", &["w-0"]).await;
    // A child workspace: a cluster-scoped object the quota counts too.
    let parent = fixture.consumers[0].0.path.clone();
    shard
        .create_workspace(&parent, "child")
        .await
        .expect("child workspace");
    let key = fixture.ty.count_key();
    let mut q = quota(
        "cluster",
        &[("count/configmaps", "100"), (&key, "100"), (WORKSPACES, "10")],
    );
    q.metadata.annotations = Some(
        [(
            "experimental.quota.kcp.io/cluster-scoped".to_owned(),
            "true".to_owned(),
        )]
        .into(),
    );
    // The root CA publisher fills the new namespaces a moment later.
    let configmaps = Api::<ConfigMap>::all(client.clone());
    let published = eventually(WAIT, || async {
        let n = configmaps
            .list_metadata(&ListParams::default())
            .await
            .ok()?
            .items
            .len();
        (n >= 3 + 4).then_some(n)
    })
    .await;
    assert!(published.is_some(), "kube-root-ca.crt in the namespaces");
    Api::<ResourceQuota>::namespaced(client.clone(), "admin")
        .create(&PostParams::default(), &q)
        .await
        .expect("cluster-scoped quota");
    (fixture, client, key)
}

/// Every configmap of the workspace, as kcp counts them for a cluster-scoped quota.
async fn configmaps_in_workspace(client: &Client) -> usize {
    Api::<ConfigMap>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await
        .expect("list")
        .items
        .len()
}

/// kcp's cluster-scoped quota, next to kcp's own controller: it counts objects in every
/// namespace of the workspace, and lazyquota (shadow mode, and `usage`) computes what kcp wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_scoped_quota_counts_every_namespace_as_kcp_does() {
    let _one = OWN_QUOTA.lock().await;
    let shard = KcpShard::get(KcpFlavor::OwnQuota);
    remove_all_quotas(shard).await;
    let tag = unique_name("cs");
    let (fixture, client, key) = cluster_scoped_fixture(shard, &tag).await;
    let admin = Api::<ResourceQuota>::namespaced(client.clone(), "admin");
    let all = configmaps_in_workspace(&client).await.to_string();
    assert!(
        used_becomes(&admin, "cluster", "count/configmaps", &all)
            .await
            .is_some(),
        "kcp counts all {all} configmaps of the workspace"
    );
    assert!(
        used_becomes(&admin, "cluster", &key, "3").await.is_some(),
        "kcp: 3 widgets"
    );
    assert!(
        used_becomes(&admin, "cluster", WORKSPACES, "1").await.is_some(),
        "kcp: 1 child workspace"
    );

    let process = run_on(shard, &["--shadow"]);
    let out = lazyquota_cli(shard, &["usage", "-o", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let usage: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mine = usage
        .as_array()
        .expect("list")
        .iter()
        .find(|q| q["cluster"] == fixture.consumers[0].0.cluster.as_str() && q["name"] == "cluster")
        .expect("the cluster-scoped quota reported");
    for k in mine["keys"].as_array().expect("keys") {
        assert_eq!(
            k["computed"], k["stored"],
            "lazyquota computes what kcp wrote: {k}"
        );
    }
    assert!(
        shadow_agrees(&process, &[fixture.consumers[0].0.cluster.as_str()], 1.0).await,
        "shadow mode agrees with kcp on the cluster-scoped quota, no key unknown, nothing written; log:\n{}",
        process.log()
    );
    drop(process);
    fixture.delete(shard).await;
}

/// kcp's cluster-scoped quota with lazyquota as the only writer: every namespace counts,
/// deletes anywhere in the workspace move it at once (kcp's own controller sees deletes outside
/// `admin` only at its 5-minute resync), and kcp's admission refuses what it forbids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lazyquota_writes_kcps_cluster_scoped_quota() {
    let _one = LAZYQUOTA_ONLY.lock().await;
    let shard = KcpShard::get(KcpFlavor::LazyquotaOnly);
    remove_all_quotas(shard).await;
    let tag = unique_name("csw");
    let (fixture, client, key) = cluster_scoped_fixture(shard, &tag).await;
    let process = run_on(shard, &[]);
    let admin = Api::<ResourceQuota>::namespaced(client.clone(), "admin");
    let all = configmaps_in_workspace(&client).await;
    assert!(
        used_becomes(&admin, "cluster", "count/configmaps", &all.to_string())
            .await
            .is_some(),
        "every configmap of the workspace ({all}); log:\n{}",
        process.log()
    );
    assert!(
        used_becomes(&admin, "cluster", &key, "3").await.is_some(),
        "3 widgets"
    );
    assert!(
        used_becomes(&admin, "cluster", WORKSPACES, "1").await.is_some(),
        "the child workspace, a cluster-scoped object; log:\n{}",
        process.log()
    );
    Api::<ConfigMap>::namespaced(client.clone(), "ns-b")
        .delete("cm-0", &DeleteParams::default())
        .await
        .expect("delete");
    Api::<DynamicObject>::namespaced_with(client.clone(), "ns-a", &fixture.ty.resource())
        .delete("w-1", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        used_becomes(&admin, "cluster", "count/configmaps", &(all - 1).to_string())
            .await
            .is_some(),
        "a delete in another namespace counts at once"
    );
    assert!(
        used_becomes(&admin, "cluster", &key, "2").await.is_some(),
        "widgets: 2"
    );
    // The annotation goes: the quota counts its own namespace only (kube-root-ca.crt).
    admin
        .patch(
            "cluster",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                "experimental.quota.kcp.io/cluster-scoped": null}}})),
        )
        .await
        .expect("patch");
    assert!(
        used_becomes(&admin, "cluster", "count/configmaps", "1")
            .await
            .is_some(),
        "an ordinary quota again; log:\n{}",
        process.log()
    );
    assert!(used_becomes(&admin, "cluster", &key, "0").await.is_some());
    assert!(
        used_becomes(&admin, "cluster", WORKSPACES, "0").await.is_some(),
        "no workspace lives in a namespace"
    );
    drop(process);
    fixture.delete(shard).await;
}
