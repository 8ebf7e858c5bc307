//! Watches follow the quotas: a constrained CRD watched and let go, a CRD created or deleted
//! while demanded, a quota moved from one type to another, a namespace deleted with its quotas.

use super::*;

/// 10 CRDs, one constrained: exactly one watch exists — seen by the apiserver itself and by
/// lazyquota — and it goes away with the quota. Deletes lower status.used.
#[tokio::test]
async fn watches_exactly_the_constrained_crd_and_stops_with_the_quota() {
    let snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "lifecycle")
        .await
        .expect("namespace");
    let client = ns.client();
    let group = format!("{}.lazyquota.test", unique_name("g"));
    let mut resources = Vec::new();
    for i in 0..10 {
        resources.push(create_crd(&client, &group, &format!("widget{i}s")).await);
    }
    let key = format!("count/widget3s.{group}");
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(&PostParams::default(), &quota("widgets", &[(&key, "5")]))
        .await
        .expect("quota");

    used_becomes(&quotas, "widgets", &key, "0")
        .await
        .expect("status.used filled for the constrained CRD");
    assert!(
        has_synced_watch(&snapshots, &key).await,
        "lazyquota reports a synced watch for widget3s"
    );
    let watched = eventually(WAIT, || async {
        (apiserver_watches(cp, &group, "widget3s").await == 1).then_some(())
    })
    .await;
    assert!(
        watched.is_some(),
        "the apiserver shows exactly one watch on widget3s"
    );
    for i in (0..10).filter(|i| *i != 3) {
        let plural = format!("widget{i}s");
        assert_eq!(
            apiserver_watches(cp, &group, &plural).await,
            0,
            "{plural} is not constrained and must not be watched"
        );
        assert!(!has_watch(&snapshots, &format!("count/{plural}.{group}")).await);
    }

    // Admission charges creates; the controller's replenishment lowers usage on delete.
    create_object(&client, &resources[3], ns.name(), "a")
        .await
        .expect("create a");
    create_object(&client, &resources[3], ns.name(), "b")
        .await
        .expect("create b");
    used_becomes(&quotas, "widgets", &key, "2")
        .await
        .expect("two widgets counted");
    delete_object(&client, &resources[3], ns.name(), "a").await;
    used_becomes(&quotas, "widgets", &key, "1")
        .await
        .expect("the delete lowered status.used");

    quotas
        .delete("widgets", &DeleteParams::default())
        .await
        .expect("delete quota");
    let stopped = eventually(WAIT, || async {
        (!has_watch(&snapshots, &key).await && apiserver_watches(cp, &group, "widget3s").await == 0)
            .then_some(())
    })
    .await;
    assert!(
        stopped.is_some(),
        "the watch stops once no quota constrains widget3s"
    );

    for i in 0..10 {
        delete_crd(&client, &group, &format!("widget{i}s")).await;
    }
    ns.delete().await.expect("delete namespace");
}

/// A quota naming a CRD that does not exist yet is pending; when the CRD is served its watch
/// starts and status.used is filled without waiting for a resync. Deleting the CRD stops it.
#[tokio::test]
async fn quota_on_a_crd_created_later_and_a_crd_deleted_while_watched() {
    let snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "pending")
        .await
        .expect("namespace");
    let client = ns.client();
    let group = format!("{}.lazyquota.test", unique_name("g"));
    let key = format!("count/gadgets.{group}");
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(
            &PostParams::default(),
            &quota("gadgets", &[(&key, "3"), ("count/configmaps", "10")]),
        )
        .await
        .expect("quota");

    // The other key is computed at once; the unknown resource stays absent and pending.
    used_becomes(&quotas, "gadgets", "count/configmaps", "1")
        .await
        .expect("configmaps counted");
    let pending = eventually(WAIT, || async {
        let snapshot = snapshots.get().await?;
        snapshot
            .pending
            .iter()
            .any(|(name, quotas)| name == &key && *quotas == 1)
            .then_some(())
    })
    .await;
    assert!(pending.is_some(), "{key} is reported pending");
    let q = quotas.get("gadgets").await.expect("quota");
    assert!(
        !q.status
            .and_then(|s| s.used)
            .is_some_and(|u| u.contains_key(&key)),
        "an unserved key stays absent"
    );

    let gadgets = create_crd(&client, &group, "gadgets").await;
    used_becomes(&quotas, "gadgets", &key, "0")
        .await
        .expect("status.used filled once the CRD is served");
    create_object(&client, &gadgets, ns.name(), "g1")
        .await
        .expect("create g1");
    create_object(&client, &gadgets, ns.name(), "g2")
        .await
        .expect("create g2");
    delete_object(&client, &gadgets, ns.name(), "g1").await;
    used_becomes(&quotas, "gadgets", &key, "1")
        .await
        .expect("one gadget left");

    delete_crd(&client, &group, "gadgets").await;
    let stopped = eventually(WAIT, || async {
        (!has_watch(&snapshots, &key).await && apiserver_watches(cp, &group, "gadgets").await == 0)
            .then_some(())
    })
    .await;
    assert!(stopped.is_some(), "deleting the CRD stops its watch");
    // The quota keeps working for its other key.
    common::create_configmap(&ns, "after-crd-delete").await;
    used_becomes(&quotas, "gadgets", "count/configmaps", "2")
        .await
        .expect("configmaps still counted");
    ns.delete().await.expect("delete namespace");
}

/// A quota edited from `count/<x>` to `count/<y>`: the watch moves from x to y, and status.used
/// holds y's count and no longer x's.
#[tokio::test]
async fn a_quota_edited_from_one_type_to_another_moves_the_watch() {
    let snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "edit")
        .await
        .expect("namespace");
    let client = ns.client();
    let group = format!("{}.lazyquota.test", unique_name("g"));
    let xs = create_crd(&client, &group, "xs").await;
    let ys = create_crd(&client, &group, "ys").await;
    for name in ["x1", "x2"] {
        create_object(&client, &xs, ns.name(), name).await.expect("x");
    }
    for name in ["y1", "y2", "y3"] {
        create_object(&client, &ys, ns.name(), name).await.expect("y");
    }
    let (x, y) = (format!("count/xs.{group}"), format!("count/ys.{group}"));
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(&PostParams::default(), &quota("q", &[(&x, "10")]))
        .await
        .expect("quota");
    used_becomes(&quotas, "q", &x, "2").await.expect("x counted");
    let group_ref = group.as_str();
    let watching = |xw: u64, yw: u64| async move {
        eventually(WAIT, || async {
            (apiserver_watches(cp, group_ref, "xs").await == xw
                && apiserver_watches(cp, group_ref, "ys").await == yw)
                .then_some(())
        })
        .await
    };
    assert!(watching(1, 0).await.is_some(), "x watched, y not");

    let mut edited = quotas.get("q").await.expect("quota");
    edited.spec = quota("q", &[(&y, "10")]).spec;
    quotas
        .replace("q", &PostParams::default(), &edited)
        .await
        .expect("edit quota");
    used_becomes(&quotas, "q", &y, "3").await.expect("y counted");
    let used = quotas
        .get("q")
        .await
        .expect("quota")
        .status
        .and_then(|s| s.used)
        .unwrap_or_default();
    assert!(
        !used.contains_key(&x),
        "x's key is gone from status.used: {used:?}"
    );
    assert!(watching(0, 1).await.is_some(), "the watch moved from x to y");
    assert!(!has_watch(&snapshots, &x).await, "lazyquota no longer watches x");
    delete_crd(&client, &group, "xs").await;
    delete_crd(&client, &group, "ys").await;
    ns.delete().await.expect("delete namespace");
}

/// A namespace deleted with its quotas in it: its watches stop once the namespace controller
/// has removed the quotas; a quota in another namespace on the same type keeps working.
#[tokio::test]
async fn a_namespace_deleted_with_quotas_releases_its_watches() {
    let snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let doomed = TestNamespace::create(Flavor::LazyquotaOnly, "doomed")
        .await
        .expect("namespace");
    let kept = TestNamespace::create(Flavor::LazyquotaOnly, "kept")
        .await
        .expect("namespace");
    let client = doomed.client();
    let group = format!("{}.lazyquota.test", unique_name("g"));
    let only = create_crd(&client, &group, "onlys").await;
    let shared = create_crd(&client, &group, "shareds").await;
    for name in ["a", "b"] {
        create_object(&client, &only, doomed.name(), name)
            .await
            .expect("object");
        create_object(&client, &shared, doomed.name(), name)
            .await
            .expect("object");
    }
    create_object(&client, &shared, kept.name(), "a")
        .await
        .expect("object");
    let (only_key, shared_key) = (format!("count/onlys.{group}"), format!("count/shareds.{group}"));
    let doomed_quotas = doomed.api::<ResourceQuota>();
    doomed_quotas
        .create(
            &PostParams::default(),
            &quota("q", &[(&only_key, "10"), (&shared_key, "10")]),
        )
        .await
        .expect("quota");
    let kept_quotas = kept.api::<ResourceQuota>();
    kept_quotas
        .create(&PostParams::default(), &quota("q", &[(&shared_key, "10")]))
        .await
        .expect("quota");
    used_becomes(&doomed_quotas, "q", &only_key, "2")
        .await
        .expect("counted");
    used_becomes(&kept_quotas, "q", &shared_key, "1")
        .await
        .expect("counted");
    // Its WATCH request starts right after the list that counted it.
    assert!(
        eventually(Duration::from_secs(10), || async {
            (apiserver_watches(cp, &group, "onlys").await == 1).then_some(())
        })
        .await
        .is_some(),
        "the apiserver sees one watch of onlys"
    );

    let kept_name = kept.name().to_owned();
    doomed.delete().await.expect("delete namespace");
    let released = eventually(Duration::from_mins(1), || async {
        (apiserver_watches(cp, &group, "onlys").await == 0 && !has_watch(&snapshots, &only_key).await)
            .then_some(())
    })
    .await;
    assert!(released.is_some(), "the deleted namespace's watch is released");
    create_object(&kept.client(), &shared, &kept_name, "b")
        .await
        .expect("object");
    used_becomes(&kept_quotas, "q", &shared_key, "2")
        .await
        .expect("the other namespace's quota keeps working");
    assert!(has_synced_watch(&snapshots, &shared_key).await);
    delete_crd(&client, &group, "onlys").await;
    delete_crd(&client, &group, "shareds").await;
    kept.delete().await.expect("delete namespace");
}

/// A second quota on a type already watched, created while that watch is quiet and its
/// neighbour's charges are fresh: a consistent list of the type's objects, compared with the
/// store, proves the watch has caught up with the new quota, and its key is written at once
/// from the store instead of after the settling time.
#[tokio::test]
async fn a_second_quota_on_a_quiet_watch_is_written_once_a_list_proves_the_store() {
    let _snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "proved")
        .await
        .expect("namespace");
    let client = ns.client();
    let group = format!("{}.lazyquota.test", unique_name("g"));
    let widgets = create_crd(&client, &group, "widgets").await;
    let key = format!("count/widgets.{group}");
    let label = format!("widgets.{group}");
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(&PostParams::default(), &quota("first", &[(&key, "100")]))
        .await
        .expect("quota");
    used_becomes(&quotas, "first", &key, "0")
        .await
        .expect("first quota written");
    for i in 0..55 {
        create_object(&client, &widgets, ns.name(), &format!("w{i}"))
            .await
            .expect("create");
    }
    used_becomes(&quotas, "first", &key, "55")
        .await
        .expect("55 counted");
    let lists = |result: &str| {
        common::controller_counter_with(
            "lazyquota_catch_up_lists_total",
            &[("resource", &label), ("result", result)],
        )
    };
    assert!(lists("matched") < 1.0, "no new key yet");
    quotas
        .create(&PostParams::default(), &quota("second", &[(&key, "100")]))
        .await
        .expect("second quota");
    used_becomes(&quotas, "second", &key, "55")
        .await
        .expect("the second quota counts what exists");
    assert!(lists("failed") < 1.0, "the list failed on a real apiserver");
    assert!(
        lists("matched") >= 1.0,
        "the new key was written on a list that matched the store, not after the settling time"
    );
    delete_crd(&client, &group, "widgets").await;
    ns.delete().await.expect("delete namespace");
}
