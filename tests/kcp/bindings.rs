//! Types bound through APIExports and APIBindings: counted only in the logical clusters that
//! bound them and have a quota, discovered when a binding appears, core types bound as kcp's
//! e2e test binds them.

use super::*;

/// Providers export one group/resource twice (two identities; one serves v1, the other v2);
/// consumers bind one each. A logical cluster is engaged only while it has a quota, counts only
/// its own objects of the identity it bound, and is let go when its quota or workspace goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_types_are_counted_in_the_workspaces_that_have_a_quota() {
    let _one = LAZYQUOTA_ONLY.lock().await;
    let shard = KcpShard::get(KcpFlavor::LazyquotaOnly);
    remove_all_quotas(shard).await;
    let tag = unique_name("b");
    let ws = |name: &str| format!("{tag}-{name}");
    let group = format!("{tag}.example.io");
    let v1 = ExportedType::new(&group, "widgets", "v1");
    let v2 = ExportedType::new(&group, "widgets", "v2");
    let p1 = shard.create_workspace("root", &ws("p1")).await.expect("p1");
    let p2 = shard.create_workspace("root", &ws("p2")).await.expect("p2");
    shard.export(&p1.path, &v1).await.expect("export v1");
    shard.export(&p2.path, &v2).await.expect("export v2");
    let c1 = shard.create_workspace("root", &ws("c1")).await.expect("c1");
    let c2 = shard.create_workspace("root", &ws("c2")).await.expect("c2");
    let c3 = shard.create_workspace("root", &ws("c3")).await.expect("c3");
    let id1 = shard.bind(&c1.path, &p1.path, &v1).await.expect("bind c1");
    let id2 = shard.bind(&c2.path, &p2.path, &v2).await.expect("bind c2");
    shard.bind(&c3.path, &p1.path, &v1).await.expect("bind c3");
    assert_ne!(id1, id2, "two exports, two identities");
    let (a, b, c) = (
        shard.user_client(&c1.path).await.expect("c1"),
        shard.user_client(&c2.path).await.expect("c2"),
        shard.user_client(&c3.path).await.expect("c3"),
    );
    for cl in [&a, &b, &c] {
        namespace(cl, "team").await;
    }
    create_objects(&a, &v1, "team", &["a", "b", "c"]).await;
    create_objects(&b, &v2, "team", &["a", "b"]).await;
    create_objects(&c, &v1, "team", &["a"]).await;
    let baseline = shard_watches(shard, "widgets").await;

    let process = run_on(shard, &["--discovery-poll", "30s"]);
    assert!(
        becomes(&process, "lazyquota_kcp_engaged_clusters", 0.0).await,
        "no quota on the shard: nothing engaged; log:\n{}",
        process.log()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        shard_watches(shard, "widgets").await,
        baseline,
        "no quota: no watch of the bound type on the shard"
    );

    // Quotas in c1 and c2: each counts its own objects of the identity it bound, at the
    // version its binding serves (v1 in c1, v2 in c2); c3 has the type but no quota.
    let key = v1.count_key();
    let quotas = |cl: &Client| Api::<ResourceQuota>::namespaced(cl.clone(), "team");
    let pp = PostParams::default();
    quotas(&a)
        .create(&pp, &quota("q", &[(&key, "10")]))
        .await
        .expect("quota c1");
    quotas(&b)
        .create(&pp, &quota("q", &[(&key, "10")]))
        .await
        .expect("quota c2");
    assert!(
        used_becomes(&quotas(&a), "q", &key, "3").await.is_some(),
        "c1 counts its 3 widgets (v1); log:\n{}",
        process.log()
    );
    assert!(
        used_becomes(&quotas(&b), "q", &key, "2").await.is_some(),
        "c2 counts its 2 widgets (v2); log:\n{}",
        process.log()
    );
    assert!(
        becomes(&process, "lazyquota_kcp_engaged_clusters", 2.0).await,
        "c1 and c2 engaged"
    );
    let watching = eventually(WAIT, || async {
        (shard_watches(shard, "widgets").await == baseline + 2).then_some(())
    })
    .await;
    assert!(
        watching.is_some(),
        "one widgets watch per engaged cluster, none for c3"
    );

    // Deletes move the count (admission charges creates; only the controller sees deletes).
    Api::<DynamicObject>::namespaced_with(a.clone(), "team", &v1.resource())
        .delete("a", &DeleteParams::default())
        .await
        .expect("delete widget");
    assert!(
        used_becomes(&quotas(&a), "q", &key, "2").await.is_some(),
        "c1's delete counted"
    );

    // lazyquota is the only writer, and kcp's quota admission enforces what it wrote.
    quotas(&b)
        .patch(
            "q",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"hard": {&key: "2"}}})),
        )
        .await
        .expect("lower c2's hard");
    let refused = eventually(WAIT, || async {
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": format!("{}/{}", v2.group, v2.version), "kind": v2.kind,
            "metadata": {"name": "over"},
        }))
        .ok()?;
        match Api::<DynamicObject>::namespaced_with(b.clone(), "team", &v2.resource())
            .create(&pp, &object)
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("exceeded quota") => Some(()),
            Ok(_) => {
                // Admitted before the lowered hard reached admission: take it back, try again.
                let _ = Api::<DynamicObject>::namespaced_with(b.clone(), "team", &v2.resource())
                    .delete("over", &DeleteParams::default())
                    .await;
                None
            }
            Err(_) => None,
        }
    })
    .await;
    assert!(
        refused.is_some(),
        "kcp's admission refuses the third widget in c2"
    );

    // explain over the shard: the two engaged clusters, their workspace paths, the bound type
    // served (not pending).
    let out = lazyquota_cli(shard, &["explain", "-o", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let explain: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let reports: BTreeMap<&str, &serde_json::Value> = explain
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|r| Some((r["cluster"].as_str()?, r)))
        .collect();
    assert_eq!(
        reports.keys().copied().collect::<Vec<_>>(),
        {
            let mut v = vec![c1.cluster.as_str(), c2.cluster.as_str()];
            v.sort_unstable();
            v
        },
        "explain names the clusters with quotas"
    );
    assert_eq!(reports[c1.cluster.as_str()]["workspace"], c1.path.as_str());
    let text = out.stdout.clone();
    assert!(
        !String::from_utf8_lossy(&text).contains("not served"),
        "the bound type is served in both: {}",
        String::from_utf8_lossy(&text)
    );

    // c1's quota goes: c1 is let go and its watch stops.
    quotas(&a)
        .delete("q", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        becomes(&process, "lazyquota_kcp_engaged_clusters", 1.0).await,
        "c1 disengaged"
    );
    let released = eventually(WAIT, || async {
        (shard_watches(shard, "widgets").await == baseline + 1).then_some(())
    })
    .await;
    assert!(released.is_some(), "c1's widgets watch stopped");

    // c2's workspace is deleted (its LogicalCluster gets a deletionTimestamp and goes
    // Deleting): c2 is let go although its quota is still there until the content is gone.
    delete_workspace(shard, &c2).await;
    assert!(
        becomes(&process, "lazyquota_kcp_engaged_clusters", 0.0).await,
        "c2 disengaged with its workspace; log:\n{}",
        process.log()
    );
    let released = eventually(WAIT, || async {
        (shard_watches(shard, "widgets").await == baseline).then_some(())
    })
    .await;
    assert!(released.is_some(), "no widgets watch left");
    drop(process);
    for w in [&c1, &c3, &p1, &p2] {
        delete_workspace(shard, w).await;
    }
}

/// A quota naming a type no binding serves yet waits (pending); binding the type makes it
/// counted — discovery reruns on APIBinding changes — and kcp's own quota admission then
/// enforces the status lazyquota wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_apibinding_is_discovered_and_counted() {
    let _one = LAZYQUOTA_ONLY.lock().await;
    let shard = KcpShard::get(KcpFlavor::LazyquotaOnly);
    remove_all_quotas(shard).await;
    let tag = unique_name("nb");
    let ty = ExportedType::new(&format!("{tag}.example.io"), "gadgets", "v1");
    let (provider, ws, client) = provider_and_consumer(shard, &tag, &ty).await;
    let process = run_on(shard, &["--discovery-poll", "10m"]);
    let key = ty.count_key();
    quotas(&client)
        .create(&PostParams::default(), &quota("q", &[(&key, "10")]))
        .await
        .expect("quota");
    assert!(
        becomes(&process, "lazyquota_kcp_engaged_clusters", 1.0).await,
        "engaged by its quota"
    );
    let pending = format!("lazyquota_pending_resources{{resource=\"gadgets.{tag}.example.io\"}}");
    assert!(
        becomes(&process, &pending, 1.0).await,
        "the type is pending before the binding"
    );
    shard.bind(&ws.path, &provider.path, &ty).await.expect("bind");
    create_objects(&client, &ty, "team", &["a", "b"]).await;
    Api::<DynamicObject>::namespaced_with(client.clone(), "team", &ty.resource())
        .delete("b", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        used_becomes(&quotas(&client), "q", &key, "1").await.is_some(),
        "counted once bound (a delete, which admission cannot count); log:\n{}",
        process.log()
    );
    drop(process);
    delete_workspace(shard, &ws).await;
    delete_workspace(shard, &provider).await;
}

/// A core type bound through an APIBinding (Services, as kcp's own e2e test binds them) is
/// served by the legacy `/api/v1` while kcp's aggregated `/api` leaves it out: lazyquota counts
/// it (admission refused every Service create while its key had no `used`), kcp's admission
/// enforces the count, and after the binding goes the quota's other keys are still counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_type_bound_through_an_apibinding_is_counted_and_enforced() {
    let _one = LAZYQUOTA_ONLY.lock().await;
    let shard = KcpShard::get(KcpFlavor::LazyquotaOnly);
    remove_all_quotas(shard).await;
    let tag = unique_name("core");
    let services = ExportedType::new("", "services", "v1");
    let (provider, ws, client) = provider_and_consumer(shard, &tag, &services).await;
    let served = || async {
        Api::<DynamicObject>::namespaced_with(client.clone(), "team", &services.resource())
            .list(&ListParams::default().limit(1))
            .await
            .is_ok()
    };
    assert!(!served().await, "Services are not built into a kcp workspace");
    shard
        .bind(&ws.path, &provider.path, &services)
        .await
        .expect("bind");
    let process = run_on(shard, &["--discovery-poll", "10m"]);
    let key = services.count_key();
    quotas(&client)
        .create(&PostParams::default(), &quota("q", &[(&key, "1")]))
        .await
        .expect("quota");
    assert!(
        used_becomes(&quotas(&client), "q", &key, "0").await.is_some(),
        "{key} counted; log:\n{}",
        process.log()
    );
    create_objects(&client, &services, "team", &["a"]).await;
    let refused = Api::<DynamicObject>::namespaced_with(client.clone(), "team", &services.resource())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Service", "metadata": {"name": "b"},
            }))
            .expect("object"),
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("exceeded quota")),
        "the second Service is refused by kcp's quota admission: {refused:?}"
    );
    assert!(used_becomes(&quotas(&client), "q", &key, "1").await.is_some());

    // A second key, then the binding goes: the type is no longer served, the quota's other
    // keys are still counted.
    let mut q = quotas(&client).get("q").await.expect("quota");
    q.spec
        .as_mut()
        .and_then(|s| s.hard.as_mut())
        .expect("hard")
        .insert(
            "count/configmaps".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("100".into()),
        );
    quotas(&client)
        .replace("q", &PostParams::default(), &q)
        .await
        .expect("add count/configmaps");
    assert!(
        used_becomes(&quotas(&client), "q", "count/configmaps", "1")
            .await
            .is_some(),
        "kube-root-ca.crt counted"
    );
    let bindings = Api::<DynamicObject>::all_with(
        client.clone(),
        &kube::api::ApiResource {
            group: "apis.kcp.io".into(),
            version: "v1alpha2".into(),
            api_version: "apis.kcp.io/v1alpha2".into(),
            kind: "APIBinding".into(),
            plural: "apibindings".into(),
        },
    );
    bindings
        .delete("services", &DeleteParams::default())
        .await
        .expect("unbind");
    let gone = eventually(WAIT, || async { (!served().await).then_some(()) }).await;
    assert!(gone.is_some(), "Services no longer served once unbound");
    create_configmaps(&client, "team", 1, "after-unbind").await;
    assert!(
        used_becomes(&quotas(&client), "q", "count/configmaps", "2")
            .await
            .is_some(),
        "still counted after the binding went; log:\n{}",
        process.log()
    );
    drop(process);
    delete_workspace(shard, &ws).await;
    delete_workspace(shard, &provider).await;
}
