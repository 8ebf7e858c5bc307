//! Events land in the quota's own logical cluster and repeats make a series.

use super::*;

/// The shard's engine has one client for every logical cluster: an Event on a quota must land
/// in that quota's logical cluster (its route in the request path), not in another one or at
/// the shard's root, and a repeat within the series window must patch the first one's series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_go_to_the_quotas_logical_cluster_and_repeats_make_a_series() {
    let shard = KcpShard::get(KcpFlavor::LazyquotaOnly);
    let tag = unique_name("ev");
    let a = shard
        .create_workspace("root", &format!("{tag}-a"))
        .await
        .expect("a");
    let b = shard
        .create_workspace("root", &format!("{tag}-b"))
        .await
        .expect("b");
    let (ca, cb) = (
        shard.user_client(&a.path).await.expect("a"),
        shard.user_client(&b.path).await.expect("b"),
    );
    namespace(&ca, "team").await;
    namespace(&cb, "team").await;

    let kubeconfig = std::env::temp_dir().join(format!("{}.kubeconfig", unique_name("shard")));
    shard.shard_kubeconfig(&kubeconfig).expect("kubeconfig");
    let config = lazyquota_kube::transport::client::load_config(Some(&kubeconfig), None)
        .await
        .expect("config");
    let root = lazyquota_kube::kcp::shard::Shard::new(
        config,
        shard.url(),
        lazyquota_kube::transport::client::Transport::default(),
    )
    .expect("shard")
    .root()
    .expect("root client");
    let mut recorder = lazyquota_kube::controller::events::Recorder::new(root, "test".into(), true);
    let quota = lazyquota_index::keys::QuotaKey::new(
        &lazyquota_index::keys::ClusterName::new(&a.cluster),
        "team",
        "q",
    );
    for _ in 0..3 {
        recorder
            .record(
                &quota,
                None,
                true,
                "Probe",
                format!("[workspace {}] probe", a.path),
            )
            .await
            .expect("recorded");
    }
    let events = |c: &Client| Api::<k8s_openapi::api::events::v1::Event>::namespaced(c.clone(), "team");
    let in_a = events(&ca).list(&ListParams::default()).await.expect("list a");
    let probes: Vec<_> = in_a
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Probe"))
        .collect();
    assert_eq!(probes.len(), 1, "one Event in a: {probes:?}");
    let probe = probes[0];
    assert_eq!(
        probe.series.as_ref().map(|s| s.count),
        Some(3),
        "two repeats patched its series"
    );
    assert_eq!(
        probe.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("q")
    );
    assert_eq!(probe.reporting_instance.as_deref(), Some("test"));
    let in_b = events(&cb).list(&ListParams::default()).await.expect("list b");
    assert!(
        in_b.items.iter().all(|e| e.reason.as_deref() != Some("Probe")),
        "nothing in the other workspace"
    );
    for w in [&a, &b] {
        delete_workspace(shard, w).await;
    }
}
