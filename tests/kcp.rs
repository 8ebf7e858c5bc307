//! lazyquota's kcp source against a **real kcp shard** (kcp v0.32.3 built from source by
//! `tests/control-plane/kcp/build.sh`, started on loopback by `lazyquota_testenv::kcp`).
//!
//! Workspaces are made through the tenancy API, types are bound through APIExports and
//! APIBindings (with identity hashes), and lazyquota runs with `--kcp-shard-url` as a user would
//! deploy it: one process per shard, wildcard watches with the shard admin's credentials.
//!
//! Two shards: [`KcpFlavor::LazyquotaOnly`] (kcp's quota controller off, so lazyquota is the only
//! writer and kcp's quota admission enforces what it writes) and [`KcpFlavor::OwnQuota`] (kcp's
//! own controller on, for shadow mode next to it). Tests on one shard run one at a time: each
//! starts from a shard without ResourceQuotas, so the clusters lazyquota engages are its own.

mod common;

use std::{collections::BTreeMap, time::Duration};

use common::{process::Lazyquota, quota, used_becomes};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ResourceQuota};
use kube::{
    Api, Client, ResourceExt as _,
    api::{DeleteParams, DynamicObject, ListParams, ObjectMeta, PostParams},
};
use lazyquota_testenv::{
    eventually,
    kcp::{CLUSTER_ANNOTATION, ExportedType, KcpFlavor, KcpShard, Workspace, workspace_resource},
    unique_name,
};

const WAIT: Duration = Duration::from_secs(60);

/// Tests of one shard share its quotas: one at a time per shard.
static LAZYQUOTA_ONLY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
static OWN_QUOTA: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn gauge(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Open WATCH requests for `resource` the shard itself reports (kcp's own informers included:
/// compare before and after).
async fn shard_watches(shard: &KcpShard, resource: &str) -> u64 {
    let metrics = shard.metrics().await.expect("kcp /metrics");
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_longrunning_requests{"))
        .filter(|l| l.contains(&format!("resource=\"{resource}\"")) && l.contains("verb=\"WATCH\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Deletes every ResourceQuota on the shard (a wildcard list, deletes per logical cluster).
async fn remove_all_quotas(shard: &KcpShard) {
    let all = Api::<ResourceQuota>::all(shard.client("*").await.expect("wildcard client"));
    let quotas = all
        .list_metadata(&ListParams::default())
        .await
        .expect("wildcard list");
    for q in quotas.items {
        let Some(cluster) = q.annotations().get(CLUSTER_ANNOTATION) else {
            continue;
        };
        let client = shard.client(cluster).await.expect("cluster client");
        let _ = Api::<ResourceQuota>::namespaced(client, &q.namespace().unwrap_or_default())
            .delete(&q.name_any(), &DeleteParams::default())
            .await;
    }
    let gone = eventually(WAIT, || async {
        all.list_metadata(&ListParams::default())
            .await
            .ok()
            .filter(|l| l.items.is_empty())
            .map(|_| ())
    })
    .await;
    assert!(gone.is_some(), "quotas of earlier tests removed");
}

async fn namespace(client: &Client, name: &str) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("namespace {name}: {e}"),
    }
}

async fn create_objects(client: &Client, ty: &ExportedType, ns: &str, names: &[&str]) {
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ty.resource());
    for name in names {
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": format!("{}/{}", ty.group, ty.version), "kind": ty.kind,
            "metadata": {"name": name},
        }))
        .expect("object");
        api.create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("create {} {name}: {e}", ty.plural));
    }
}

async fn create_configmaps(client: &Client, ns: &str, count: usize, prefix: &str) {
    let api = Api::<ConfigMap>::namespaced(client.clone(), ns);
    for i in 0..count {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("{prefix}-{i}")),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &cm).await.expect("configmap");
    }
}

/// `lazyquota run --kcp-shard-url <shard>` with the shard admin's credentials.
fn run_on(shard: &KcpShard, extra: &[&str]) -> Lazyquota {
    let kubeconfig = std::env::temp_dir().join(format!("{}.kubeconfig", unique_name("shard")));
    shard.shard_kubeconfig(&kubeconfig).expect("kubeconfig");
    let mut args = vec!["--kcp-shard-url", shard.url()];
    args.extend_from_slice(extra);
    Lazyquota::start(&kubeconfig, &args)
}

fn lazyquota_cli(shard: &KcpShard, args: &[&str]) -> std::process::Output {
    let kubeconfig = std::env::temp_dir().join(format!("{}.kubeconfig", unique_name("shard")));
    shard.shard_kubeconfig(&kubeconfig).expect("kubeconfig");
    std::process::Command::new(env!("CARGO_BIN_EXE_lazyquota"))
        .args(args)
        .args([
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--kcp-shard-url",
            shard.url(),
        ])
        .output()
        .expect("lazyquota")
}

async fn metric(process: &Lazyquota, name: &str) -> Option<f64> {
    let (_, metrics) = process.get("/metrics").await?;
    gauge(&metrics, name)
}

async fn becomes(process: &Lazyquota, name: &str, want: f64) -> bool {
    eventually(WAIT, || async {
        (metric(process, name).await == Some(want)).then_some(())
    })
    .await
    .is_some()
}

async fn delete_workspace(shard: &KcpShard, ws: &Workspace) {
    let (parent, name) = ws.path.rsplit_once(':').expect("a child workspace");
    let api = Api::<DynamicObject>::all_with(
        shard.user_client(parent).await.expect("client"),
        &workspace_resource(),
    );
    let _ = api.delete(name, &DeleteParams::default()).await;
}

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
