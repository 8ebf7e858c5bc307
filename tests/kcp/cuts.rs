//! Every connection cut under churn, with paginated lists: counts exact once the cuts stop.

use super::*;

/// lazyquota talks to the shard through a proxy that cuts every connection after 0.1–2 s
/// (wildcard watches, per-cluster watches, lists and status writes alike) while objects are
/// created and deleted; a workspace holds more configmaps than one list page (500), so lists
/// are paginated. Over HTTP/2 (`LAZYQUOTA_TEST_TRANSPORT=http1`: HTTP/1.1). Once the cuts
/// stop, every count is exact.
///
/// It found two bugs (docs/kcp.md, "Watch cuts"): requests without deadlines (every watch of a
/// logical cluster silent for good, 2 of 7 runs), and a late admission charge left standing
/// when it arrived after the object's add (about 1 run of 13).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_stay_exact_through_watch_cuts_and_paginated_lists() {
    let _one = LAZYQUOTA_ONLY.lock().await;
    let shard = KcpShard::get(KcpFlavor::LazyquotaOnly);
    remove_all_quotas(shard).await;
    let tag = unique_name("cut");
    let fixture = Bound::new(shard, &tag, &[4, 2]).await;
    let (a, b) = (&fixture.consumers[0].1, &fixture.consumers[1].1);
    create_configmaps(a, "team", 620, "page").await;
    let target: std::net::SocketAddr = shard
        .url()
        .trim_start_matches("https://")
        .parse()
        .expect("loopback address");
    let proxy = lazyquota_testenv::proxy::CuttingProxy::start(target, 7)
        .await
        .expect("proxy");
    let kubeconfig = std::env::temp_dir().join(format!("{}.kubeconfig", unique_name("shard")));
    shard.shard_kubeconfig(&kubeconfig).expect("kubeconfig");
    let url = format!("https://{}", proxy.addr());
    let transport = std::env::var("LAZYQUOTA_TEST_TRANSPORT").unwrap_or_else(|_| "http2".into());
    let process = Lazyquota::start_logging(
        &kubeconfig,
        &["--kcp-shard-url", &url, "--transport", &transport],
        &std::env::var("LAZYQUOTA_TEST_LOG").unwrap_or_else(|_| "info,lazyquota_kube=debug".into()),
    );

    let key = fixture.ty.count_key();
    let pp = PostParams::default();
    let hard = [(key.as_str(), "1000"), ("count/configmaps", "1000")];
    quotas(a).create(&pp, &quota("q", &hard)).await.expect("quota");
    quotas(b).create(&pp, &quota("q", &hard)).await.expect("quota");
    // 620 + kube-root-ca.crt.
    assert!(
        used_becomes(&quotas(a), "q", "count/configmaps", "621")
            .await
            .is_some(),
        "a paginated list counts every configmap; log:\n{}",
        process.log()
    );
    proxy.set_cutting(true);
    let configmaps = Api::<ConfigMap>::namespaced(a.clone(), "team");
    for i in 0..40 {
        configmaps
            .delete(&format!("page-{i}"), &DeleteParams::default())
            .await
            .expect("delete");
        if i % 4 == 0 {
            let ws = if i % 8 == 0 { a } else { b };
            let n = format!("cut-{i}");
            create_objects(ws, &fixture.ty, "team", &[n.as_str()]).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Api::<DynamicObject>::namespaced_with(b.clone(), "team", &fixture.ty.resource())
        .delete("w-0", &DeleteParams::default())
        .await
        .expect("delete");
    // Cuts go on a little after the churn, as with an idle watch.
    tokio::time::sleep(Duration::from_secs(4)).await;
    proxy.set_cutting(false);
    // Over HTTP/2 everything shares one connection, re-made only when a request needs it after
    // the watches' backoff: on a loaded machine few connections live long enough to be cut.
    // Two cuts prove a cut while watches were open and one of the reconnection.
    assert!(proxy.cuts() >= 2, "the proxy cut connections ({})", proxy.cuts());
    // a: 621 − 40 configmaps; widgets 4 + 5 (i = 0, 8, 16, 24, 32); b: 2 + 5 − 1. The watches
    // retry with kube's backoff (up to 30 s between attempts after a run of failures), so the
    // wait is longer than a relist takes.
    let after_cuts = |client: &Client, key: &str, want: &str| {
        let (quotas, key, want) = (quotas(client), key.to_owned(), want.to_owned());
        async move {
            eventually(Duration::from_secs(90), || async {
                let used = quotas.get("q").await.ok()?.status?.used?;
                (used.get(&key)?.0 == want).then_some(())
            })
            .await
        }
    };
    for (client, cms, widgets) in [(a, "581", "9"), (b, "1", "6")] {
        assert!(
            after_cuts(client, "count/configmaps", cms).await.is_some(),
            "configmaps exact after the cuts; log:\n{}",
            process.log()
        );
        if after_cuts(client, &key, widgets).await.is_none() {
            let used = quotas(client).get("q").await.ok().and_then(|q| q.status);
            panic!(
                "widgets exact after the cuts: want {widgets}, status {used:?}; log:\n{}",
                process.log()
            );
        }
    }
    drop(process);
    fixture.delete(shard).await;
}
