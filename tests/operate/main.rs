//! Operating lazyquota as a platform team would, with the real binary on the real control
//! plane: the rendered chart applies server-side; the chart's ServiceAccount (token from the
//! TokenRequest API) is enough to do the whole job and no more; a real Prometheus scrapes
//! it; two replicas fail over through the Lease and never lead at once; SIGTERM exits 0.
//!
//! Tests here share one Lease and the chart's namespace, so they run one at a time.

#[path = "../common/mod.rs"]
mod common;

mod chart;
mod leader;
mod serving;

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use common::{
    create_crd, create_object, kubectl_apply,
    process::{Kill, Lazyquota, free_port, http_get},
    quota, service_account_kubeconfig, used_becomes,
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, ResourceQuota},
};
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, PostParams},
};
use lazyquota_testenv::{ControlPlane, Flavor, TestNamespace, eventually, unique_name};
use tokio::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());
const WAIT: Duration = Duration::from_secs(30);

/// A Secret named `name`, with nothing in it: an object any quota can count.
fn secret(name: &str) -> k8s_openapi::api::core::v1::Secret {
    k8s_openapi::api::core::v1::Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Default::default()
    }
}

/// Applies the plain manifests rendered from the chart (namespace `lazyquota`).
fn apply_chart(cp: &ControlPlane) {
    let manifests = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/manifests/lazyquota.yaml"
    ))
    .expect("rendered manifests");
    let out = kubectl_apply(cp, &manifests);
    assert!(
        out.status.success(),
        "server-side apply of the chart failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const CHART_FLAGS: &[&str] = &[
    "--leader-elect",
    "--leader-election-namespace",
    "lazyquota",
    "--leader-election-lease-name",
    "lazyquota",
    "--leader-election-lease-duration",
    "4s",
    "--leader-election-renew-deadline",
    "3s",
    "--leader-election-retry-period",
    "1s",
];

fn quotas_of(client: &kube::Client, namespace: &str) -> Api<ResourceQuota> {
    Api::namespaced(client.clone(), namespace)
}

/// Leader election with short timings (lease 4 s, renew deadline 3 s, retry 500 ms) on Lease
/// `default/<lease>` as `id`.
fn leader_flags<'a>(id: &'a str, lease: &'a str) -> [&'a str; 13] {
    [
        "--leader-elect",
        "--leader-election-namespace",
        "default",
        "--leader-election-lease-name",
        lease,
        "--leader-election-identity",
        id,
        "--leader-election-lease-duration",
        "4s",
        "--leader-election-renew-deadline",
        "3s",
        "--leader-election-retry-period",
        "500ms",
    ]
}

/// The port of `cp`'s apiserver (to count lazyquota's connections to it).
async fn apiserver_port(cp: &ControlPlane) -> u16 {
    cp.config()
        .await
        .expect("config")
        .cluster_url
        .port_u16()
        .expect("apiserver port")
}
