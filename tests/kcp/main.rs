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
//!
//! This file holds what the tests share (the shards, fixtures and readings); the tests sit by
//! job: `bindings` (types bound through APIBindings), `sharing` (one wildcard watch for many
//! logical clusters), `cuts` (connections cut under churn), `shadow` (next to kcp's own
//! controller), `cluster_scoped` (kcp's cluster-scoped quotas) and `events`.

#[path = "../common/mod.rs"]
mod common;

mod bindings;
mod cluster_scoped;
mod cuts;
mod events;
mod shadow;
mod shards;
mod sharing;

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

const WAIT: Duration = Duration::from_mins(1);

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
        // Gauges of whole requests: printed as integers.
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
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

/// Creates `names`, retrying quota admission's conflicts
/// ([`common::create_retrying_quota_conflicts`]).
async fn create_objects(client: &Client, ty: &ExportedType, ns: &str, names: &[&str]) {
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ty.resource());
    let params = PostParams::default();
    for name in names {
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": ty.api_version(), "kind": ty.kind,
            "metadata": {"name": name},
        }))
        .expect("object");
        common::create_retrying_quota_conflicts(&format!("{} {name}", ty.plural), || {
            api.create(&params, &object)
        })
        .await;
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
    Lazyquota::on_kcp_shard(shard, extra)
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

/// Whether shadow mode settles with every quota of `clusters` agreeing with the stored status:
/// no key of theirs disagreeing and none unknown (their latest verdict is "agree"), at least
/// `agreements` quota computations that agreed, and not one status write.
async fn shadow_agrees(process: &Lazyquota, clusters: &[&str], agreements: f64) -> bool {
    let ours = |line: &str| {
        clusters
            .iter()
            .any(|c| line.contains(&format!("cluster=\"{c}\"")))
    };
    eventually(WAIT, || async {
        let (_, metrics) = process.get("/metrics").await?;
        let open = |family: &str| {
            metrics
                .lines()
                .any(|l| l.starts_with(&format!("{family}{{")) && ours(l) && !l.ends_with(" 0"))
        };
        let agreed = metrics
            .lines()
            .find(|l| l.starts_with("lazyquota_quota_syncs_total{result=\"shadow_agree\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        let written = metrics
            .lines()
            .filter(|l| l.starts_with("lazyquota_status_writes_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
        assert!(written <= 0.0, "shadow mode wrote {written} statuses");
        (!open("lazyquota_shadow_disagreements")
            && !open("lazyquota_shadow_unknown_keys")
            && agreed >= agreements)
            .then_some(())
    })
    .await
    .is_some()
}

/// `lazyquota usage -o json` on `shard`: the quotas of `clusters` it reports, each checked key
/// for key — computed, and equal to the stored status (kcp's own controller's, next to shadow
/// mode).
fn usage_agrees(shard: &KcpShard, clusters: &[&str]) -> Vec<serde_json::Value> {
    let out = lazyquota_cli(shard, &["usage", "-o", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let usage: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mine: Vec<serde_json::Value> = usage
        .as_array()
        .expect("list")
        .iter()
        .filter(|q| clusters.iter().any(|c| q["cluster"] == *c))
        .cloned()
        .collect();
    for q in &mine {
        for k in q["keys"].as_array().expect("keys") {
            assert!(k["computed"].is_string(), "{}: computed {k}", q["cluster"]);
            assert_eq!(k["computed"], k["stored"], "{}: {k}", q["cluster"]);
        }
    }
    mine
}

async fn delete_workspace(shard: &KcpShard, ws: &Workspace) {
    let (parent, name) = ws.path.rsplit_once(':').expect("a child workspace");
    let api = Api::<DynamicObject>::all_with(
        shard.user_client(parent).await.expect("client"),
        &workspace_resource(),
    );
    let _ = api.delete(name, &DeleteParams::default()).await;
}

/// A provider workspace exporting `ty` and a consumer workspace (not bound yet) with a
/// namespace `team`: the consumer's client.
async fn provider_and_consumer(
    shard: &KcpShard,
    tag: &str,
    ty: &ExportedType,
) -> (Workspace, Workspace, Client) {
    let provider = shard
        .create_workspace("root", &format!("{tag}-p"))
        .await
        .expect("p");
    shard.export(&provider.path, ty).await.expect("export");
    let ws = shard
        .create_workspace("root", &format!("{tag}-c"))
        .await
        .expect("c");
    let client = shard.user_client(&ws.path).await.expect("client");
    namespace(&client, "team").await;
    (provider, ws, client)
}

/// A provider exporting `widgets.<tag>.example.io` at v1 and consumers bound to it, each with
/// namespace `team` holding `objects[i]` widgets.
struct Bound {
    ty: ExportedType,
    provider: Workspace,
    consumers: Vec<(Workspace, Client)>,
}

impl Bound {
    async fn new(shard: &KcpShard, tag: &str, objects: &[usize]) -> Self {
        let ty = ExportedType::new(&format!("{tag}.example.io"), "widgets", "v1");
        let provider = shard
            .create_workspace("root", &format!("{tag}-p"))
            .await
            .expect("provider");
        shard.export(&provider.path, &ty).await.expect("export");
        let mut consumers = Vec::new();
        for (i, count) in objects.iter().enumerate() {
            let ws = shard
                .create_workspace("root", &format!("{tag}-c{i}"))
                .await
                .expect("consumer");
            shard.bind(&ws.path, &provider.path, &ty).await.expect("bind");
            let client = shard.user_client(&ws.path).await.expect("client");
            namespace(&client, "team").await;
            let names: Vec<String> = (0..*count).map(|n| format!("w-{n}")).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            create_objects(&client, &ty, "team", &names).await;
            consumers.push((ws, client));
        }
        Self {
            ty,
            provider,
            consumers,
        }
    }

    async fn delete(self, shard: &KcpShard) {
        for (ws, _) in &self.consumers {
            // Children first (a workspace with children is not deleted).
            delete_workspace(
                shard,
                &Workspace {
                    path: format!("{}:child", ws.path),
                    cluster: String::new(),
                },
            )
            .await;
            delete_workspace(shard, ws).await;
        }
        delete_workspace(shard, &self.provider).await;
    }
}

fn quotas(client: &Client) -> Api<ResourceQuota> {
    Api::<ResourceQuota>::namespaced(client.clone(), "team")
}
