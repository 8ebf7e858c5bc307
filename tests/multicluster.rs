//! One lazyquota process serving three clusters: three kube-apiservers sharing one etcd, each
//! with its own `--etcd-prefix` (started by `tests/control-plane/start.sh` with
//! `LAZYQUOTA_EXTRA_APISERVERS=2`), served by `lazyquota run --all-contexts`.
//!
//! The same namespace name exists in every cluster with different objects and quotas: each
//! cluster's status must be its own, and each apiserver must see watches only for what its own
//! quotas constrain (read from that apiserver's `apiserver_longrunning_requests`).

mod common;

use std::time::Duration;

use common::{process::Lazyquota, quota, used_becomes};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ResourceQuota, Secret};
use kube::{
    Api, Client,
    api::{DeleteParams, ObjectMeta, PostParams},
};
use lazyquota_testenv::{ControlPlane, Flavor, eventually, unique_name};

/// Open WATCH requests for core `resource` that one apiserver reports.
async fn watches(client: &Client, resource: &str) -> u64 {
    let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
    let metrics = client.request_text(request).await.expect("apiserver /metrics");
    let resource = format!("resource=\"{resource}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_longrunning_requests{"))
        .filter(|l| l.contains("group=\"\"") && l.contains(&resource) && l.contains("verb=\"WATCH\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

async fn namespace(client: &Client, name: &str) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..ObjectMeta::default()
    }
}

async fn secrets(client: &Client, ns: &str, names: &[&str]) {
    let api = Api::<Secret>::namespaced(client.clone(), ns);
    for name in names {
        let secret = Secret {
            metadata: meta(name),
            ..Secret::default()
        };
        api.create(&PostParams::default(), &secret)
            .await
            .expect("create secret");
    }
}

async fn configmaps(client: &Client, ns: &str, names: &[&str]) {
    let api = Api::<ConfigMap>::namespaced(client.clone(), ns);
    for name in names {
        let cm = ConfigMap {
            metadata: meta(name),
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &cm)
            .await
            .expect("create configmap");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_serves_three_clusters_independently() {
    let cp = ControlPlane::get(Flavor::MultiCluster);
    let kubeconfig = cp.clusters_kubeconfig().expect("multi-cluster control plane");
    let mut clusters = Vec::new();
    for context in ["cluster-0", "cluster-1", "cluster-2"] {
        clusters.push(cp.cluster_client(context).await.expect("cluster client"));
    }
    let [c0, c1, c2] = [&clusters[0], &clusters[1], &clusters[2]];
    for client in &clusters {
        common::remove_all_quotas(client).await;
    }

    // The same namespace name in all three clusters; none has a quota yet.
    let ns = unique_name("mc");
    for client in &clusters {
        namespace(client, &ns).await;
    }
    // Nothing constrains secrets or configmaps anywhere yet. Each apiserver watches some of
    // them through its own loopback client (and KCM watches on cluster-0): the baseline.
    let seen = || async {
        [
            watches(c0, "secrets").await,
            watches(c1, "configmaps").await,
            watches(c1, "secrets").await,
            watches(c2, "secrets").await,
            watches(c2, "configmaps").await,
        ]
    };
    // KCM (cluster-0 only) may still be starting its informers when this binary has just
    // started the control plane: wait until its root-CA publisher has served the new namespace
    // (its informers run), then until three samples a second apart agree, so a watch that
    // reconnects or starts late is not mistaken for lazyquota's.
    let root_ca = Api::<ConfigMap>::namespaced(c0.clone(), &ns);
    let published = eventually(Duration::from_secs(30), || async {
        root_ca.get_opt("kube-root-ca.crt").await.ok().flatten()
    })
    .await;
    assert!(published.is_some(), "KCM publishes the root CA in cluster-0");
    let mut samples = vec![seen().await];
    let deadline = tokio::time::Instant::now() + Duration::from_mins(1);
    let baseline = loop {
        let last = &samples[samples.len().saturating_sub(3)..];
        if last.len() == 3 && last.iter().all(|s| *s == last[0]) {
            break last[0];
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "apiserver watch counts never settled: {samples:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.push(seen().await);
    };

    let process = Lazyquota::start(&kubeconfig, &["--all-contexts", "--discovery-poll", "30s"]);

    // cluster-0: count/secrets over two secrets; cluster-1: count/configmaps over three
    // configmaps; cluster-2: count/secrets over one secret.
    secrets(c0, &ns, &["a", "b"]).await;
    configmaps(c1, &ns, &["a", "b", "c"]).await;
    secrets(c2, &ns, &["a"]).await;
    // Secrets exist in cluster-1 and configmaps in cluster-2 too: no quota there counts them.
    secrets(c1, &ns, &["x"]).await;
    configmaps(c2, &ns, &["x"]).await;
    let q = |client: &Client| Api::<ResourceQuota>::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    q(c0)
        .create(&pp, &quota("q", &[("count/secrets", "10")]))
        .await
        .expect("quota 0");
    q(c1)
        .create(&pp, &quota("q", &[("count/configmaps", "10")]))
        .await
        .expect("quota 1");
    q(c2)
        .create(&pp, &quota("q", &[("count/secrets", "10")]))
        .await
        .expect("quota 2");

    let log = || process.log();
    assert!(
        used_becomes(&q(c0), "q", "count/secrets", "2").await.is_some(),
        "cluster-0 counts its own two secrets\n{}",
        log()
    );
    assert!(
        used_becomes(&q(c1), "q", "count/configmaps", "3").await.is_some(),
        "cluster-1 counts its own three configmaps\n{}",
        log()
    );
    assert!(
        used_becomes(&q(c2), "q", "count/secrets", "1").await.is_some(),
        "cluster-2 counts its own secret, not cluster-0's\n{}",
        log()
    );
    // The apiserver names the status's manager after the writer's User-Agent.
    let written = q(c2).get("q").await.expect("quota 2");
    let managers: Vec<(Option<String>, Option<String>)> = written
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .map(|m| (m.manager, m.subresource))
        .collect();
    assert!(
        managers.contains(&(Some("lazyquota".to_owned()), Some("status".to_owned()))),
        "status managed by lazyquota: {managers:?}"
    );

    // Watches only where demanded, seen by each apiserver: one more for cluster-0 secrets,
    // cluster-1 configmaps and cluster-2 secrets; none for the others.
    let want = [
        baseline[0] + 1,
        baseline[1] + 1,
        baseline[2],
        baseline[3] + 1,
        baseline[4],
    ];
    let demanded = eventually(Duration::from_secs(30), || async {
        (seen().await == want).then_some(())
    })
    .await;
    assert!(
        demanded.is_some(),
        "watches [c0 secrets, c1 configmaps, c1 secrets, c2 secrets, c2 configmaps]: baseline {baseline:?}, want {want:?}, now {:?}",
        seen().await
    );

    // A delete in one cluster moves only that cluster's quota.
    Api::<Secret>::namespaced(c2.clone(), &ns)
        .delete("a", &DeleteParams::default())
        .await
        .expect("delete secret");
    assert!(
        used_becomes(&q(c2), "q", "count/secrets", "0").await.is_some(),
        "cluster-2 drops to 0"
    );
    let c0_quota = q(c0).get("q").await.expect("quota 0");
    let used = c0_quota.status.and_then(|s| s.used).unwrap_or_default();
    assert_eq!(
        used.get("count/secrets").map(|v| v.0.as_str()),
        Some("2"),
        "cluster-0 untouched"
    );

    // The process reports every cluster.
    let (_, metrics) = process.get("/metrics").await.expect("metrics");
    for cluster in ["cluster-0", "cluster-1", "cluster-2"] {
        assert!(
            metrics.contains(&format!("lazyquota_cluster_ready{{cluster=\"{cluster}\"}} 1")),
            "{cluster} ready in /metrics:\n{metrics}"
        );
    }
    assert!(
        metrics.contains("lazyquota_watch_clusters{resource=\"secrets\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("lazyquota_watch_clusters{resource=\"configmaps\"} 1"),
        "{metrics}"
    );

    // explain names each cluster.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lazyquota"))
        .args([
            "explain",
            "--all-contexts",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "-o",
            "json",
        ])
        .output()
        .expect("run explain");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let explain: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let names: Vec<&str> = explain
        .as_array()
        .expect("one report per cluster")
        .iter()
        .filter_map(|r| r["cluster"].as_str())
        .collect();
    assert_eq!(names, ["cluster-0", "cluster-1", "cluster-2"]);

    // The quota in cluster-1 goes: its configmaps watch stops; the others stay.
    q(c1)
        .delete("q", &DeleteParams::default())
        .await
        .expect("delete quota 1");
    let stopped = eventually(Duration::from_secs(30), || async {
        (watches(c1, "configmaps").await == baseline[1]).then_some(())
    })
    .await;
    assert!(
        stopped.is_some(),
        "cluster-1's configmaps watch stops with its quota\n{}",
        log()
    );
    assert_eq!(
        watches(c2, "secrets").await,
        baseline[3] + 1,
        "cluster-2's watch stays"
    );

    for client in &clusters {
        common::remove_all_quotas(client).await;
        let _ = Api::<Namespace>::all(client.clone())
            .delete(&ns, &DeleteParams::default())
            .await;
    }
}
