//! Logical clusters counting a bound type share one wildcard metadata watch of the shard.

use super::*;

/// With `--kcp-shared-watch-threshold 2` on a real shard, logical clusters counting a bound
/// type share one wildcard metadata watch: each cluster's count stays exact (objects of other
/// clusters and of other identities never leak in), a cluster joining while the shared watch
/// runs lists its own share at a resourceVersion of the shard's single sequence, and events
/// reach only their own cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logical_clusters_share_one_wildcard_watch_of_a_bound_type() {
    let _one = LAZYQUOTA_ONLY.lock().await;
    let shard = KcpShard::get(KcpFlavor::LazyquotaOnly);
    remove_all_quotas(shard).await;
    let tag = unique_name("s");
    let fixture = Bound::new(shard, &tag, &[3, 2, 1]).await;
    let key = fixture.ty.count_key();
    let pp = PostParams::default();
    let process = run_on(shard, &["--kcp-shared-watch-threshold", "2"]);
    let c = |i: usize| &fixture.consumers[i].1;

    quotas(c(0))
        .create(&pp, &quota("q", &[(&key, "10")]))
        .await
        .expect("quota");
    assert!(
        used_becomes(&quotas(c(0)), "q", &key, "3").await.is_some(),
        "c0 alone, own watch"
    );
    assert!(
        becomes(&process, "lazyquota_kcp_shared_watches", 0.0).await,
        "one cluster: nothing shared"
    );
    quotas(c(1))
        .create(&pp, &quota("q", &[(&key, "10")]))
        .await
        .expect("quota");
    assert!(
        becomes(&process, "lazyquota_kcp_shared_watches", 1.0).await,
        "two clusters: one shared wildcard watch; log:\n{}",
        process.log()
    );
    assert!(
        used_becomes(&quotas(c(1)), "q", &key, "2").await.is_some(),
        "c1 exact"
    );
    // `explain` with the run's flag names the type shared in both clusters (it applies the
    // hub's rule to the same demand); with a higher threshold, each cluster's own watch.
    let sources = |threshold: &str| -> Vec<String> {
        let out = lazyquota_cli(
            shard,
            &["explain", "-o", "json", "--kcp-shared-watch-threshold", threshold],
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let reports: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        reports
            .as_array()
            .expect("a list")
            .iter()
            .flat_map(|r| r["resources"].as_array().cloned().unwrap_or_default())
            .filter(|r| r["resource"] == key.as_str())
            .map(|r| r["source"].as_str().unwrap_or("none").to_owned())
            .collect()
    };
    assert_eq!(sources("2"), ["shared", "shared"], "explain agrees with the run");
    assert_eq!(sources("3"), ["own", "own"], "below a higher threshold");
    // The running engine answers the same at /debug/explain, from its own state, and shows the
    // open watches: each cluster's share of the one shared watch, synced.
    let out = lazyquota_cli(
        shard,
        &["explain", "-o", "json", "--kcp-shared-watch-threshold", "2"],
    );
    let offline: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let (status, body) = process.get("/debug/explain").await.expect("/debug/explain");
    assert_eq!(status, 200, "{body}");
    let live: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let by_cluster = |reports: &serde_json::Value| -> BTreeMap<String, serde_json::Value> {
        reports
            .as_array()
            .expect("a list")
            .iter()
            .map(|r| {
                let resource = r["resources"]
                    .as_array()
                    .expect("resources")
                    .iter()
                    .find(|x| x["resource"] == key.as_str())
                    .cloned()
                    .unwrap_or_default();
                (r["cluster"].as_str().unwrap_or_default().to_owned(), resource)
            })
            .collect()
    };
    let (offline, live) = (by_cluster(&offline), by_cluster(&live));
    assert_eq!(
        live.keys().collect::<Vec<_>>(),
        offline.keys().collect::<Vec<_>>(),
        "the same clusters"
    );
    for (cluster, ours) in &live {
        let theirs = &offline[cluster];
        for field in [
            "version",
            "watch",
            "scope",
            "scope_reason",
            "namespaces",
            "quotas",
            "source",
        ] {
            assert_eq!(
                ours[field], theirs[field],
                "{cluster}: {field} differs: {ours} vs {theirs}"
            );
        }
        assert_eq!(
            ours["running"],
            serde_json::json!(["team (synced, shared)"]),
            "{cluster}: its open watch, served by the shared one"
        );
    }
    // c2 joins the running shared watch: it lists its own share and takes only newer events.
    quotas(c(2))
        .create(&pp, &quota("q", &[(&key, "10")]))
        .await
        .expect("quota");
    assert!(
        used_becomes(&quotas(c(2)), "q", &key, "1").await.is_some(),
        "c2 exact after joining"
    );
    assert_eq!(metric(&process, "lazyquota_kcp_shared_watches").await, Some(1.0));

    // Deletes through the shared watch reach only their cluster.
    let widgets =
        |i: usize| Api::<DynamicObject>::namespaced_with(c(i).clone(), "team", &fixture.ty.resource());
    widgets(1)
        .delete("w-0", &DeleteParams::default())
        .await
        .expect("delete");
    widgets(0)
        .delete("w-0", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        used_becomes(&quotas(c(1)), "q", &key, "1").await.is_some(),
        "c1's delete"
    );
    assert!(
        used_becomes(&quotas(c(0)), "q", &key, "2").await.is_some(),
        "c0's delete"
    );
    assert!(
        used_becomes(&quotas(c(2)), "q", &key, "1").await.is_some(),
        "c2 untouched"
    );

    // Two leave: the last one goes back to a watch of its own and stays exact.
    quotas(c(0))
        .delete("q", &DeleteParams::default())
        .await
        .expect("delete quota");
    quotas(c(1))
        .delete("q", &DeleteParams::default())
        .await
        .expect("delete quota");
    assert!(
        becomes(&process, "lazyquota_kcp_shared_watches", 0.0).await,
        "below the threshold"
    );
    widgets(2)
        .delete("w-0", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        used_becomes(&quotas(c(2)), "q", &key, "0").await.is_some(),
        "c2 exact on its own watch; log:\n{}",
        process.log()
    );
    drop(process);
    fixture.delete(shard).await;
}
