//! lazyquota's kcp source against a kcp-shaped front (`lazyquota_testenv::kcp::KcpFront`) over
//! the three kube-apiservers of the multi-cluster control plane — **not kcp itself**, which
//! cannot be built here (`tests/control-plane/kcp/build.sh`). The front serves `/clusters/<name>/`
//! and the wildcard `/clusters/*/` (list and watch, objects annotated with `kcp.io/cluster`)
//! as a shard does; each apiserver holds one logical cluster with a LogicalCluster singleton.
//!
//! Checked: a logical cluster is served only while it has a ResourceQuota (and its
//! LogicalCluster is not deleted), each cluster's status is its own, watches exist only in
//! engaged clusters for the types their quotas constrain, and `explain` names the clusters.

mod common;

use std::{collections::BTreeMap, time::Duration};

use common::{process::Lazyquota, quota, used_becomes};
use k8s_openapi::{
    api::core::v1::{ConfigMap, Namespace, ResourceQuota},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, ObjectMeta, PostParams},
};
use lazyquota_testenv::{ControlPlane, Flavor, eventually, kcp::KcpFront, unique_name};

const WAIT: Duration = Duration::from_secs(30);

/// The tests share the multi-cluster control plane's quotas: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Open WATCH requests for configmaps that one apiserver reports.
async fn configmap_watches(client: &Client) -> u64 {
    let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
    let metrics = client.request_text(request).await.expect("apiserver /metrics");
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_longrunning_requests{"))
        .filter(|l| {
            l.contains("group=\"\"") && l.contains("resource=\"configmaps\"") && l.contains("verb=\"WATCH\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The LogicalCluster CRD and its singleton `cluster` (phase Ready), as kcp has in every
/// logical cluster.
async fn logical_cluster(client: &Client) {
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "logicalclusters.core.kcp.io"},
        "spec": {
            "group": "core.kcp.io", "scope": "Cluster",
            "names": {"plural": "logicalclusters", "singular": "logicalcluster", "kind": "LogicalCluster"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .expect("crd");
    let _ = Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd)
        .await;
    let resource = lazyquota_kube::kcp::logical_cluster_resource();
    let object: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "core.kcp.io/v1alpha1", "kind": "LogicalCluster",
        "metadata": {"name": "cluster"},
        "status": {"phase": "Ready"}
    }))
    .expect("object");
    let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
    let created = eventually(WAIT, || async {
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => Some(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Some(()),
            Err(_) => None, // the CRD is not served yet
        }
    })
    .await;
    assert!(created.is_some(), "LogicalCluster singleton");
}

async fn namespace_with_configmaps(client: &Client, ns: &str, count: usize) {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");
    let api = Api::<ConfigMap>::namespaced(client.clone(), ns);
    for i in 0..count {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("cm-{i}")),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &cm).await.expect("configmap");
    }
}

fn gauge(metrics: &str, name: &str) -> Option<u64> {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn engaged(metrics: &str) -> Option<u64> {
    gauge(metrics, "lazyquota_kcp_engaged_clusters")
}

/// The three apiservers as logical clusters root, team-a and team-b, each with its
/// LogicalCluster singleton, and no quota anywhere (see `remove_all_quotas`).
async fn shard_backends(cp: &ControlPlane) -> BTreeMap<String, Client> {
    let mut backends = BTreeMap::new();
    for (name, context) in [
        ("root", "cluster-0"),
        ("team-a", "cluster-1"),
        ("team-b", "cluster-2"),
    ] {
        let client = cp.cluster_client(context).await.expect("cluster client");
        logical_cluster(&client).await;
        common::remove_all_quotas(&client).await;
        backends.insert(name.to_owned(), client);
    }
    backends
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logical_cluster_is_served_only_while_it_has_a_quota() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = ControlPlane::get(Flavor::MultiCluster);
    let backends = shard_backends(cp).await;
    let (root, a, b) = (&backends["root"], &backends["team-a"], &backends["team-b"]);
    let ns = unique_name("kcp");
    namespace_with_configmaps(a, &ns, 3).await;
    namespace_with_configmaps(b, &ns, 2).await;
    let baseline = [configmap_watches(a).await, configmap_watches(b).await];

    let front = KcpFront::start(backends.clone()).await.expect("kcp front");
    let kubeconfig = std::env::temp_dir().join(format!("{}.kubeconfig", unique_name("shard")));
    front.kubeconfig(&kubeconfig).expect("kubeconfig");
    let process = Lazyquota::start(
        &kubeconfig,
        &["--kcp-shard-url", &front.url(), "--discovery-poll", "30s"],
    );
    let metrics = || async { process.get("/metrics").await.map(|(_, m)| m).unwrap_or_default() };
    let serving = |n: u64| async move {
        eventually(WAIT, || async {
            (engaged(&metrics().await) == Some(n)).then_some(())
        })
        .await
    };

    // No quota anywhere: no logical cluster is served, nothing is watched.
    assert!(
        serving(0).await.is_some(),
        "nothing served yet; log:\n{}",
        process.log()
    );
    assert_eq!(configmap_watches(a).await, baseline[0]);
    assert_eq!(
        process.get("/readyz").await.map(|r| r.0),
        Some(200),
        "ready while leading a shard without quotas"
    );

    // A quota in team-a: team-a alone is engaged and counts its own objects.
    let quotas = |c: &Client| Api::<ResourceQuota>::namespaced(c.clone(), &ns);
    quotas(a)
        .create(&PostParams::default(), &quota("q", &[("count/configmaps", "10")]))
        .await
        .expect("quota");
    assert!(
        used_becomes(&quotas(a), "q", "count/configmaps", "3")
            .await
            .is_some(),
        "team-a's quota counts team-a's configmaps; log:\n{}",
        process.log()
    );
    assert!(serving(1).await.is_some(), "one logical cluster served");
    let watched = eventually(WAIT, || async {
        (configmap_watches(a).await == baseline[0] + 1 && configmap_watches(b).await == baseline[1])
            .then_some(())
    })
    .await;
    assert!(watched.is_some(), "a configmaps watch in team-a only");

    // team-b gets a quota: engaged too, with its own count.
    quotas(b)
        .create(&PostParams::default(), &quota("q", &[("count/configmaps", "10")]))
        .await
        .expect("quota");
    assert!(
        used_becomes(&quotas(b), "q", "count/configmaps", "2")
            .await
            .is_some(),
        "team-b's own count"
    );
    assert!(serving(2).await.is_some(), "two logical clusters served");

    // explain over the shard names the clusters that have quotas.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lazyquota"))
        .args([
            "explain",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--kcp-shard-url",
            &front.url(),
            "-o",
            "json",
        ])
        .output()
        .expect("explain");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let explain: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let clusters: Vec<&str> = explain
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|r| r["cluster"].as_str())
        .collect();
    assert_eq!(clusters, ["team-a", "team-b"]);

    // team-a's last quota goes: team-a is let go and its watch stops.
    quotas(a)
        .delete("q", &DeleteParams::default())
        .await
        .expect("delete quota");
    assert!(serving(1).await.is_some(), "team-a disengaged");
    let released = eventually(WAIT, || async {
        (configmap_watches(a).await == baseline[0]).then_some(())
    })
    .await;
    assert!(released.is_some(), "team-a's configmaps watch stopped");

    // team-b's LogicalCluster is deleted: team-b is let go although its quota is still there.
    Api::<DynamicObject>::all_with(b.clone(), &lazyquota_kube::kcp::logical_cluster_resource())
        .delete("cluster", &DeleteParams::default())
        .await
        .expect("delete LogicalCluster");
    assert!(
        serving(0).await.is_some(),
        "team-b disengaged with its LogicalCluster"
    );
    logical_cluster(b).await;
    assert!(serving(1).await.is_some(), "and served again when it comes back");
    assert!(root.apiserver_version().await.is_ok(), "root untouched");
    drop(process);
    for client in [a, b] {
        let _ = Api::<Namespace>::all(client.clone())
            .delete(&ns, &DeleteParams::default())
            .await;
    }
}

/// With `--kcp-shared-watch-threshold 2`, two logical clusters counting configmaps share one
/// wildcard watch: counts stay exact through the switch, events reach only their cluster, and
/// when one cluster leaves the other goes back to a watch of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_share_one_wildcard_watch_from_the_threshold_on() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = ControlPlane::get(Flavor::MultiCluster);
    let backends = shard_backends(cp).await;
    let (a, b) = (&backends["team-a"], &backends["team-b"]);
    let ns = unique_name("kcp-shared");
    namespace_with_configmaps(a, &ns, 3).await;
    namespace_with_configmaps(b, &ns, 2).await;

    let front = KcpFront::start(backends.clone()).await.expect("kcp front");
    let kubeconfig = std::env::temp_dir().join(format!("{}.kubeconfig", unique_name("shard")));
    front.kubeconfig(&kubeconfig).expect("kubeconfig");
    let process = Lazyquota::start(
        &kubeconfig,
        &[
            "--kcp-shard-url",
            &front.url(),
            "--kcp-shared-watch-threshold",
            "2",
        ],
    );
    let metrics = || async { process.get("/metrics").await.map(|(_, m)| m).unwrap_or_default() };
    let shared = |n: u64| async move {
        eventually(WAIT, || async {
            (gauge(&metrics().await, "lazyquota_kcp_shared_watches") == Some(n)).then_some(())
        })
        .await
    };
    let quotas = |c: &Client| Api::<ResourceQuota>::namespaced(c.clone(), &ns);
    let configmaps = |c: &Client| Api::<ConfigMap>::namespaced(c.clone(), &ns);
    let pp = PostParams::default();
    let cm = |name: &str| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };

    quotas(a)
        .create(&pp, &quota("q", &[("count/configmaps", "10")]))
        .await
        .expect("quota");
    assert!(
        used_becomes(&quotas(a), "q", "count/configmaps", "3")
            .await
            .is_some(),
        "own watch first"
    );
    assert!(shared(0).await.is_some(), "one cluster: nothing shared");

    quotas(b)
        .create(&pp, &quota("q", &[("count/configmaps", "10")]))
        .await
        .expect("quota");
    assert!(
        shared(1).await.is_some(),
        "two clusters: one shared wildcard watch; log:\n{}",
        process.log()
    );
    assert!(
        used_becomes(&quotas(b), "q", "count/configmaps", "2")
            .await
            .is_some(),
        "team-b exact"
    );
    // Changes through the shared watch reach only their own cluster.
    configmaps(b).create(&pp, &cm("more")).await.expect("create");
    configmaps(a)
        .delete("cm-0", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        used_becomes(&quotas(b), "q", "count/configmaps", "3")
            .await
            .is_some(),
        "team-b counts its new configmap; log:\n{}",
        process.log()
    );
    assert!(
        used_becomes(&quotas(a), "q", "count/configmaps", "2")
            .await
            .is_some(),
        "team-a its delete"
    );

    // team-a leaves: team-b is alone again and goes back to a watch of its own.
    quotas(a)
        .delete("q", &DeleteParams::default())
        .await
        .expect("delete quota");
    assert!(shared(0).await.is_some(), "below the threshold: not shared");
    configmaps(b)
        .delete("more", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        used_becomes(&quotas(b), "q", "count/configmaps", "2")
            .await
            .is_some(),
        "team-b exact on its own watch again"
    );
    drop(process);
    for client in [a, b] {
        common::remove_all_quotas(client).await;
        let _ = Api::<Namespace>::all(client.clone())
            .delete(&ns, &DeleteParams::default())
            .await;
    }
}
