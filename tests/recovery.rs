//! Converging after the control plane itself fails: kube-apiserver killed with SIGKILL and
//! restarted, twice, then etcd. After each, changes made while lazyquota's watches were
//! broken are reflected: every quota's status.used equals what `lazyquota usage` computes
//! from a direct list of the cluster.
//!
//! The only test of this binary: the outages would disturb any other test sharing the
//! control plane.

mod common;

use std::time::Duration;

use common::{controller, converged, create_configmap, quota, test_config, used_becomes};
use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota, Secret};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use lazyquota_testenv::{ControlPlane, Flavor, TestNamespace, eventually};

async fn secret(ns: &TestNamespace, name: &str) {
    let s = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Secret::default()
    };
    ns.api::<Secret>()
        .create(&PostParams::default(), &s)
        .await
        .expect("secret");
}

#[tokio::test]
async fn quotas_converge_after_apiserver_and_etcd_restarts() {
    let lazy = controller(Flavor::LazyquotaOnly, test_config());
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "recovery")
        .await
        .expect("namespace");
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(
            &PostParams::default(),
            &quota("q", &[("count/configmaps", "100"), ("count/secrets", "100")]),
        )
        .await
        .expect("quota");
    for i in 0..5 {
        secret(&ns, &format!("s{i}")).await;
    }
    if used_becomes(&quotas, "q", "count/secrets", "5").await.is_none() {
        let q = quotas.get("q").await.expect("quota");
        let snapshot = lazy.get().await.expect("controller");
        panic!(
            "initial usage not reached: status {:?}; watches {:#?}",
            q.status,
            snapshot
                .watches
                .iter()
                .filter(|w| w.key.resource.resource == "secrets")
                .collect::<Vec<_>>()
        );
    }

    for (round, component) in ["kube-apiserver", "kube-apiserver", "etcd"]
        .into_iter()
        .enumerate()
    {
        cp.kill_and_restart(component).await;
        // While lazyquota's watches reconnect: deletes (which it must see to lower usage)
        // and creates (which admission charges).
        let client_ready = eventually(Duration::from_mins(1), || async {
            ns.api::<Secret>()
                .delete(&format!("s{round}"), &DeleteParams::default())
                .await
                .ok()
        })
        .await;
        assert!(
            client_ready.is_some(),
            "round {round}: the apiserver answers after restarting {component}"
        );
        create_configmap(&ns, &format!("after-{round}")).await;
        let converged = eventually(Duration::from_mins(1), || converged(&ns)).await;
        assert!(
            converged.is_some(),
            "round {round}: status.used converges after restarting {component}"
        );
        let expected = (4 - round).to_string();
        used_becomes(&quotas, "q", "count/secrets", &expected)
            .await
            .expect("the deletes were seen");
    }
    let configmaps = ns
        .api::<ConfigMap>()
        .list(&kube::api::ListParams::default())
        .await
        .expect("list")
        .items
        .len();
    used_becomes(&quotas, "q", "count/configmaps", &configmaps.to_string())
        .await
        .expect("configmaps counted");
    let snapshot = lazy.get().await.expect("the controller survived");
    assert!(
        snapshot.watches.iter().all(|w| w.failure.is_none()),
        "every watch recovered: {:?}",
        snapshot.watches
    );
    ns.delete().await.expect("delete namespace");
}
