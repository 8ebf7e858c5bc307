//! Shadow mode next to kcp's own quota controller.

use super::*;

/// Shadow mode next to kcp's own quota controller on the same workspaces: once both have
/// settled, lazyquota computes exactly what kcp wrote, key for key (configmaps and a bound type,
/// after creates and deletes), and reports no disagreement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_agrees_with_kcps_own_quota_controller() {
    let _one = OWN_QUOTA.lock().await;
    let shard = KcpShard::get(KcpFlavor::OwnQuota);
    remove_all_quotas(shard).await;
    let tag = unique_name("sh");
    let fixture = Bound::new(shard, &tag, &[3, 2]).await;
    let key = fixture.ty.count_key();
    let pp = PostParams::default();
    for (_, client) in &fixture.consumers {
        create_configmaps(client, "team", 2, "cm").await;
        quotas(client)
            .create(&pp, &quota("q", &[(&key, "10"), ("count/configmaps", "10")]))
            .await
            .expect("quota");
    }
    let (a, b) = (&fixture.consumers[0].1, &fixture.consumers[1].1);
    // kcp's controller writes first (lazyquota is not running yet).
    assert!(
        used_becomes(&quotas(a), "q", &key, "3").await.is_some(),
        "kcp counts a's widgets"
    );
    assert!(
        used_becomes(&quotas(b), "q", "count/configmaps", "3")
            .await
            .is_some(),
        "kcp counts b's configmaps"
    );

    let process = run_on(shard, &["--shadow"]);
    // Changes after the start: a create (admission charges it) and deletes in the quotas'
    // namespaces (kcp's controller replenishes them).
    create_objects(a, &fixture.ty, "team", &["new"]).await;
    Api::<ConfigMap>::namespaced(b.clone(), "team")
        .delete("cm-0", &DeleteParams::default())
        .await
        .expect("delete");
    Api::<DynamicObject>::namespaced_with(b.clone(), "team", &fixture.ty.resource())
        .delete("w-0", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        used_becomes(&quotas(a), "q", &key, "4").await.is_some(),
        "kcp: a's create"
    );
    assert!(
        used_becomes(&quotas(b), "q", &key, "1").await.is_some(),
        "kcp: b's delete"
    );
    assert!(
        used_becomes(&quotas(b), "q", "count/configmaps", "2")
            .await
            .is_some(),
        "kcp: b's delete"
    );

    let clusters: Vec<&str> = fixture
        .consumers
        .iter()
        .map(|(ws, _)| ws.cluster.as_str())
        .collect();
    assert!(
        shadow_agrees(&process, &clusters, 2.0).await,
        "shadow mode agrees with kcp on every quota, none unknown, nothing written; log:\n{}",
        process.log()
    );

    // Value for value: every key of both quotas, lazyquota's direct computation = kcp's status.
    let mine = usage_agrees(shard, &clusters);
    assert_eq!(mine.len(), 2, "both quotas reported");
    for q in mine {
        assert_eq!(
            q["workspace"].as_str().map(|w| w.starts_with("root:")),
            Some(true)
        );
    }
    drop(process);
    fixture.delete(shard).await;
}
