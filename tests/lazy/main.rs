//! lazyquota in lazy mode on the real control plane, as the only writer of quota status (KCM's
//! quota controller is off; the ResourceQuota admission plugin is on).

#[path = "../common/mod.rs"]
mod common;

mod enforcement;
mod unavailable;
mod watches;

use std::time::Duration;

use common::{
    apiserver_watches, controller, create_crd, create_object, delete_crd, delete_object, has_synced_watch,
    has_watch, quota, test_config, used_becomes,
};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota, ServiceAccount};
use kube::api::{DeleteParams, PostParams};
use lazyquota_testenv::{ControlPlane, Flavor, TestNamespace, eventually, unique_name};

const WAIT: Duration = Duration::from_secs(30);

/// Waits for the namespace's `default` ServiceAccount: pods cannot be created before it.
async fn default_service_account(ns: &TestNamespace) {
    let accounts = ns.api::<ServiceAccount>();
    eventually(WAIT, || async { accounts.get("default").await.ok() })
        .await
        .expect("default service account");
}

fn pod(name: &str, cpu: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none",
            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}, "limits": {"cpu": cpu, "memory": "64Mi"}}}]}
    }))
    .expect("valid pod")
}

fn memory_pod(name: &str, memory: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none",
            "resources": {"requests": {"memory": memory}, "limits": {"memory": memory}}}]}
    }))
    .expect("valid pod")
}

/// `status.used[key]` once it equals `want` by value (the printed format of a sum depends on
/// which addend comes first, in KCM as here).
async fn used_value_becomes(
    quotas: &kube::Api<ResourceQuota>,
    name: &str,
    key: &str,
    want: &str,
) -> Option<()> {
    let want = lazyquota_quota::Quantity::parse(want).expect("expected value parses");
    eventually(WAIT, || async {
        let used = quotas.get(name).await.ok()?.status?.used?;
        let got = lazyquota_quota::Quantity::parse_k8s(used.get(key)?).ok()?;
        (got == want).then_some(())
    })
    .await
}
