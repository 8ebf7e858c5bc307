//! A resource type lazyquota may not list (403) blocks nothing: only the keys computed from
//! it keep their previous values; the quota gets an Event, the failing resource is reported;
//! every other key and quota stays current.
//!
//! The controller of this binary runs as a ServiceAccount whose RBAC allows everything it
//! needs except list/watch on one CRD group.

mod common;

use std::time::Duration;

use common::{
    controller_as, create_crd, create_object, delete_crd, kubectl_apply, quota, service_account_kubeconfig,
    test_config, used_becomes,
};
use k8s_openapi::api::{
    core::v1::{ConfigMap, ResourceQuota},
    events::v1::Event,
};
use kube::api::{ListParams, PostParams};
use lazyquota_testenv::{ControlPlane, Flavor, TestNamespace, eventually, unique_name};

const WAIT: Duration = Duration::from_secs(30);

/// RBAC for the restricted controller: what lazyquota needs, but only for core resources.
fn restricted_rbac(namespace: &str, name: &str) -> String {
    format!(
        r"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: {name}, namespace: {namespace}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {name}}}
rules:
- {{apiGroups: [''], resources: [resourcequotas], verbs: [get, list, watch]}}
- {{apiGroups: [''], resources: [resourcequotas/status], verbs: [patch]}}
- {{apiGroups: ['', events.k8s.io], resources: [events], verbs: [create, patch]}}
- {{apiGroups: [apiextensions.k8s.io], resources: [customresourcedefinitions], verbs: [list, watch]}}
- {{apiGroups: [apiregistration.k8s.io], resources: [apiservices], verbs: [list, watch]}}
- {{apiGroups: [''], resources: [configmaps, secrets, pods, services, persistentvolumeclaims, namespaces], verbs: [list, watch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {name}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {name}}}
subjects: [{{kind: ServiceAccount, name: {name}, namespace: {namespace}}}]
"
    )
}

#[tokio::test]
async fn a_forbidden_resource_type_withholds_only_its_own_keys() {
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "forbidden")
        .await
        .expect("namespace");
    let account = unique_name("restricted");
    let applied = kubectl_apply(cp, &restricted_rbac(ns.name(), &account));
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let kubeconfig = service_account_kubeconfig(cp, ns.name(), &account).await;
    let controller = controller_as(Flavor::LazyquotaOnly, test_config(), Some(kubeconfig));

    let client = ns.client();
    let group = format!("{}.lazyquota.test", unique_name("g"));
    let things = create_crd(&client, &group, "things").await;
    create_object(&client, &things, ns.name(), "t1")
        .await
        .expect("a thing");
    let forbidden_key = format!("count/things.{group}");
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(
            &PostParams::default(),
            &quota("mixed", &[(&forbidden_key, "5"), ("count/configmaps", "5")]),
        )
        .await
        .expect("mixed quota");
    quotas
        .create(
            &PostParams::default(),
            &quota("plain", &[("count/configmaps", "5")]),
        )
        .await
        .expect("plain quota");

    // The allowed key is current; the forbidden one keeps its previous value (none).
    used_becomes(&quotas, "mixed", "count/configmaps", "1")
        .await
        .expect("configmaps computed despite the 403");
    used_becomes(&quotas, "plain", "count/configmaps", "1")
        .await
        .expect("the other quota is unaffected");
    let q = quotas.get("mixed").await.expect("quota");
    assert!(
        !q.status
            .and_then(|s| s.used)
            .is_some_and(|u| u.contains_key(&forbidden_key)),
        "forbidden key not computed"
    );

    // The failing resource is named by the controller (the metric lazyquota_watch_failing
    // is computed from this) and an Event lands on the quota.
    let failing = eventually(WAIT, || async {
        let snapshot = controller.get().await?;
        snapshot
            .watches
            .iter()
            .any(|w| {
                w.key.resource.object_count_name() == forbidden_key
                    && w.failure.as_deref() == Some("forbidden")
            })
            .then_some(())
    })
    .await;
    assert!(
        failing.is_some(),
        "the watch on things.{group} is reported failing with reason forbidden"
    );
    let events = ns.api::<Event>();
    let event = eventually(WAIT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("ResourceUnavailable")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("mixed")
        })
    })
    .await
    .expect("a ResourceUnavailable Event on the quota");
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains(&format!("things.{group}")) && note.contains("forbidden"),
        "{note}"
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));

    // Replenishment keeps working for the allowed key.
    common::create_configmap(&ns, "more").await;
    ns.api::<ConfigMap>()
        .delete("more", &kube::api::DeleteParams::default())
        .await
        .expect("delete configmap");
    used_becomes(&quotas, "mixed", "count/configmaps", "1")
        .await
        .expect("still current after a delete");

    delete_crd(&client, &group, "things").await;
    ns.delete().await.expect("delete namespace");
}
