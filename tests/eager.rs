//! lazyquota in eager mode (upstream's behaviour, kept for comparison): every quotable
//! resource type is watched, whether or not a quota constrains it.

mod common;

use std::time::Duration;

use common::{apiserver_watches, controller, create_crd, delete_crd, quota, test_config, used_becomes};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::PostParams;
use lazyquota_kube::{controller::Mode, controller::discovery::discover};
use lazyquota_testenv::{ControlPlane, Flavor, TestNamespace, eventually, unique_name};

#[tokio::test]
async fn eager_mode_watches_every_quotable_type() {
    let config = lazyquota_kube::controller::Config {
        mode: Mode::Eager,
        ..test_config()
    };
    let snapshots = controller(Flavor::LazyquotaOnly, config);
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "eager")
        .await
        .expect("namespace");
    let client = ns.client();
    // A CRD nobody constrains is watched too, as upstream would.
    let group = format!("{}.lazyquota.test", unique_name("g"));
    create_crd(&client, &group, "sprockets").await;

    let sprockets = format!("count/sprockets.{group}");
    let expected = eventually(Duration::from_mins(1), || async {
        let discovered = discover(&client, &lazyquota_kube::transport::route::Route::direct(), None)
            .await
            .ok()?;
        let quotable: Vec<String> = discovered
            .served
            .iter()
            .filter(|s| s.quotable())
            .map(|s| s.resource.object_count_name())
            .collect();
        let snapshot = snapshots.get().await?;
        let watched: Vec<String> = snapshot
            .watches
            .iter()
            .filter(|w| w.synced)
            .map(|w| w.key.resource.object_count_name())
            .collect();
        // Discovery serves a CRD a moment after it is Established: until it does, the CRD
        // is neither expected nor watched, and the check would pass without it.
        (quotable.contains(&sprockets) && quotable.iter().all(|q| watched.contains(q))).then_some(quotable)
    })
    .await
    .expect("the CRD is discovered, and every quotable resource is watched and synced");
    assert!(
        expected.len() > 20,
        "a v1.36 apiserver serves many quotable types, found {}",
        expected.len()
    );
    // A watch counts as synced once its list is done; its WATCH request starts right after.
    let seen = eventually(Duration::from_secs(10), || async {
        let sprockets = apiserver_watches(cp, &group, "sprockets").await;
        let revisions = apiserver_watches(cp, "apps", "controllerrevisions").await;
        (sprockets == 1 && revisions >= 1).then_some(())
    })
    .await;
    assert!(
        seen.is_some(),
        "the apiserver sees one watch of the unconstrained CRD and one of controllerrevisions (now {} and {})",
        apiserver_watches(cp, &group, "sprockets").await,
        apiserver_watches(cp, "apps", "controllerrevisions").await
    );

    // Eager mode still computes quotas.
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(&PostParams::default(), &quota("q", &[("count/configmaps", "5")]))
        .await
        .expect("quota");
    used_becomes(&quotas, "q", "count/configmaps", "1")
        .await
        .expect("eager mode computes usage");

    delete_crd(&client, &group, "sprockets").await;
    ns.delete().await.expect("delete namespace");
}
