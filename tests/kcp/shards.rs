//! kcp as the seed ran it: a root shard and two more, a cache server and a front-proxy
//! (`lazyquota_testenv::kcp::sharded`), one lazyquota per shard. An APIExport lives in a
//! provider workspace on the root shard; consumers on every shard bind it, so its identity, its
//! schema and the bound CRD reach the other shards through the cache server. Workspaces are made
//! through the front-proxy and placed by kcp's shard selection.

use std::collections::BTreeSet;

use kube::api::ApiResource;
use lazyquota_testenv::kcp::sharded::ShardedKcp;

use super::*;

/// The key of kcp's cluster-scoped quota annotation.
const CLUSTER_SCOPED: &str = "experimental.quota.kcp.io/cluster-scoped";

/// A provider on the root shard exporting `widgets.<tag>.example.io` at v1, and one consumer
/// on each shard (placed there by `spec.location`), bound to it, each with namespaces `team`
/// (`widgets[i]` widgets and two configmaps) and `admin`.
struct Spread {
    ty: ExportedType,
    provider: Workspace,
    /// Per shard, in [`ShardedKcp::shards`]' order: the consumer and its client.
    consumers: Vec<(Workspace, Client)>,
}

impl Spread {
    async fn new(kcp: &ShardedKcp, tag: &str, widgets: &[usize]) -> Self {
        let front = kcp.front();
        let ty = ExportedType::new(&format!("{tag}.example.io"), "widgets", "v1");
        let provider = front
            .create_workspace_on("root", &format!("{tag}-p"), Some("root"))
            .await
            .expect("provider on the root shard");
        front.export(&provider.path, &ty).await.expect("export");
        let mut consumers = Vec::new();
        for (shard, count) in kcp.shards().iter().zip(widgets) {
            let ws = front
                .create_workspace_on("root", &format!("{tag}-{}", shard.name()), Some(shard.name()))
                .await
                .expect("consumer");
            assert!(
                clusters_on(shard).await.contains(&ws.cluster),
                "kcp placed {} on shard {}",
                ws.path,
                shard.name()
            );
            front.bind(&ws.path, &provider.path, &ty).await.expect("bind");
            let client = front.user_client(&ws.path).await.expect("client");
            namespace(&client, "team").await;
            namespace(&client, "admin").await;
            let names: Vec<String> = (0..*count).map(|n| format!("w-{n}")).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            create_objects(&client, &ty, "team", &names).await;
            create_configmaps(&client, "team", 2, "cm").await;
            consumers.push((ws, client));
        }
        Self {
            ty,
            provider,
            consumers,
        }
    }

    /// In every consumer: `team/q` on the widgets and configmaps, and kcp's cluster-scoped
    /// quota `admin/cluster` on the same keys, over every namespace of the workspace.
    async fn quotas(&self, widgets_hard: &str) {
        let key = self.ty.count_key();
        let pp = PostParams::default();
        for (_, client) in &self.consumers {
            quotas(client)
                .create(
                    &pp,
                    &quota("q", &[(&key, widgets_hard), ("count/configmaps", "100")]),
                )
                .await
                .expect("team quota");
            let mut cluster = quota("cluster", &[(&key, "100"), ("count/configmaps", "100")]);
            cluster.metadata.annotations = Some([(CLUSTER_SCOPED.to_owned(), "true".to_owned())].into());
            Api::<ResourceQuota>::namespaced(client.clone(), "admin")
                .create(&pp, &cluster)
                .await
                .expect("cluster-scoped quota");
        }
    }

    async fn delete(self, kcp: &ShardedKcp) {
        for (ws, _) in &self.consumers {
            delete_workspace(kcp.front(), ws).await;
        }
        delete_workspace(kcp.front(), &self.provider).await;
    }
}

/// The logical clusters stored on `shard` (a wildcard list with its shard admin).
async fn clusters_on(shard: &KcpShard) -> BTreeSet<String> {
    let resource = ApiResource {
        group: "core.kcp.io".into(),
        version: "v1alpha1".into(),
        api_version: "core.kcp.io/v1alpha1".into(),
        kind: "LogicalCluster".into(),
        plural: "logicalclusters".into(),
    };
    let client = shard.client("*").await.expect("wildcard client");
    Api::<DynamicObject>::all_with(client, &resource)
        .list_metadata(&ListParams::default())
        .await
        .expect("logical clusters")
        .items
        .iter()
        .filter_map(|lc| lc.annotations().get(CLUSTER_ANNOTATION).cloned())
        .collect()
}

/// The logical clusters a lazyquota serves quotas of: those of its `lazyquota_quota_hard`
/// series (`--quota-usage-metrics`).
async fn served(process: &Lazyquota) -> BTreeSet<String> {
    // Nothing while its metrics server is not up yet.
    let (_, metrics) = process.get("/metrics").await.unwrap_or_default();
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("lazyquota_quota_hard{cluster=\""))
        .filter_map(|l| Some(l.split_once('"')?.0.to_owned()))
        .collect()
}

/// Each process serves its own shard's consumer, and no logical cluster of another shard.
async fn each_serves_only_its_shard(kcp: &ShardedKcp, processes: &[Lazyquota], spread: &Spread) {
    for ((shard, process), (ws, _)) in kcp.shards().iter().zip(processes).zip(&spread.consumers) {
        let own = clusters_on(shard).await;
        let serving = eventually(WAIT, || async {
            let served = served(process).await;
            served.contains(&ws.cluster).then_some(served)
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "{}'s lazyquota serves {}; log:\n{}",
                shard.name(),
                ws.path,
                process.log()
            )
        });
        assert!(
            serving.is_subset(&own),
            "{}'s lazyquota serves only its shard's logical clusters: {serving:?} of {own:?}",
            shard.name()
        );
        assert!(
            becomes(process, "lazyquota_kcp_engaged_clusters", 1.0).await,
            "{}'s lazyquota engages its consumer alone (the provider has no quota)",
            shard.name()
        );
    }
}

/// The objects of `resource` in `namespace` (all namespaces when `None`), by a list.
async fn count(client: &Client, resource: &ApiResource, namespace: Option<&str>) -> String {
    let api = match namespace {
        Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, resource),
        None => Api::<DynamicObject>::all_with(client.clone(), resource),
    };
    let list = api.list_metadata(&ListParams::default()).await.expect("list");
    list.items.len().to_string()
}

fn configmaps() -> ApiResource {
    ApiResource::erase::<ConfigMap>(&())
}

/// Every consumer's two quotas hold the truth: `team/q` its namespace's widgets and
/// configmaps, `admin/cluster` those of every namespace (kcp puts a `kube-root-ca.crt` in each).
async fn every_quota_holds_the_truth(spread: &Spread, processes: &[Lazyquota]) {
    let key = spread.ty.count_key();
    for ((ws, client), process) in spread.consumers.iter().zip(processes) {
        let admin = Api::<ResourceQuota>::namespaced(client.clone(), "admin");
        for (quotas, name, namespace) in [(quotas(client), "q", Some("team")), (admin, "cluster", None)] {
            for (k, resource) in [
                (key.as_str(), spread.ty.resource()),
                ("count/configmaps", configmaps()),
            ] {
                let truth = count(client, &resource, namespace).await;
                assert!(
                    used_becomes(&quotas, name, k, &truth).await.is_some(),
                    "{}: {name} {k} = {truth}; log:\n{}",
                    ws.path,
                    process.log()
                );
            }
        }
    }
}

/// Shadow mode, one lazyquota per shard, next to kcp's own quota controller on every shard:
/// each engages only its own shard's consumer, and agrees with kcp on every key of both quotas
/// (namespaced and cluster-scoped, bound type and configmaps) without writing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lazyquota_per_shard_in_shadow_mode_agrees_with_kcp_on_every_shard() {
    let kcp = ShardedKcp::get(KcpFlavor::OwnQuota);
    for shard in kcp.shards() {
        remove_all_quotas(shard).await;
    }
    let tag = unique_name("shs");
    let spread = Spread::new(kcp, &tag, &[3, 2, 1]).await;
    spread.quotas("10").await;
    let key = spread.ty.count_key();
    // kcp's controllers write first (lazyquota is not running yet).
    for ((ws, client), want) in spread.consumers.iter().zip(["3", "2", "1"]) {
        assert!(
            used_becomes(&quotas(client), "q", &key, want).await.is_some(),
            "kcp counts {}'s widgets",
            ws.path
        );
    }

    let processes: Vec<Lazyquota> = kcp
        .shards()
        .iter()
        .map(|s| run_on(s, &["--shadow", "--quota-usage-metrics"]))
        .collect();
    each_serves_only_its_shard(kcp, &processes, &spread).await;
    for ((shard, process), (ws, _)) in kcp.shards().iter().zip(&processes).zip(&spread.consumers) {
        assert!(
            shadow_agrees(process, &[ws.cluster.as_str()], 2.0).await,
            "{}'s lazyquota agrees with kcp on both quotas of {}, nothing unknown, nothing written; log:\n{}",
            shard.name(),
            ws.path,
            process.log()
        );
        // Value for value: every key of both quotas, computed = kcp's status.
        let mine = usage_agrees(shard, &[ws.cluster.as_str()]);
        assert_eq!(mine.len(), 2, "{}: both quotas reported", ws.path);
    }
    drop(processes);
    spread.delete(kcp).await;
}

/// One lazyquota per shard as the only writer (kcp's quota controller off on every shard):
/// exact counts on every shard, kcp's admission enforcing them, a schema update on the root
/// shard reaching a consumer shard, a shard restarted while the others keep counting, and a
/// workspace deleted on one shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lazyquota_per_shard_counts_exactly_through_restarts_schema_updates_and_deletes() {
    let kcp = ShardedKcp::get(KcpFlavor::LazyquotaOnly);
    for shard in kcp.shards() {
        remove_all_quotas(shard).await;
    }
    let tag = unique_name("shw");
    let spread = Spread::new(kcp, &tag, &[3, 2, 1]).await;
    let processes: Vec<Lazyquota> = kcp
        .shards()
        .iter()
        .map(|s| run_on(s, &["--quota-usage-metrics"]))
        .collect();
    spread.quotas("5").await;
    each_serves_only_its_shard(kcp, &processes, &spread).await;
    every_quota_holds_the_truth(&spread, &processes).await;

    // kcp's admission enforces what lazyquota wrote, on a shard other than the root: shard-2's
    // consumer has 1 widget of 5.
    let ty = &spread.ty;
    let key = ty.count_key();
    let (c0, c1, c2) = (
        &spread.consumers[0].1,
        &spread.consumers[1].1,
        &spread.consumers[2].1,
    );
    create_objects(c2, ty, "team", &["x-1", "x-2", "x-3", "x-4"]).await;
    let object: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": ty.api_version(), "kind": ty.kind, "metadata": {"name": "over"},
    }))
    .expect("object");
    let over = Api::<DynamicObject>::namespaced_with(c2.clone(), "team", &ty.resource())
        .create(&PostParams::default(), &object)
        .await;
    assert!(
        matches!(&over, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("exceeded quota")),
        "kcp's admission on shard-2 refuses the sixth widget: {over:?}"
    );

    // The export's schema is updated on the root shard (a new APIResourceSchema serving v1 and
    // v2, v2 stored): every consumer serves v2, and a widget made at v2 on shard-1 is counted.
    let v2 = kcp
        .front()
        .update_export(&spread.provider.path, ty, "v2")
        .await
        .expect("schema update");
    // The new version reaches every consumer shard, the root one included.
    for ((ws, client), shard) in spread.consumers.iter().zip(kcp.shards()) {
        let served_v2 = eventually(WAIT, || async {
            Api::<DynamicObject>::namespaced_with(client.clone(), "team", &v2.resource())
                .list_metadata(&ListParams::default())
                .await
                .ok()
                .map(|_| ())
        })
        .await;
        assert!(served_v2.is_some(), "{} on {} serves v2", ws.path, shard.name());
    }
    create_objects(c1, &v2, "team", &["at-v2"]).await;
    assert!(
        used_becomes(&quotas(c1), "q", &key, "3").await.is_some(),
        "shard-1: the widget made at v2 counted"
    );
    Api::<DynamicObject>::namespaced_with(c1.clone(), "team", &v2.resource())
        .delete("w-0", &DeleteParams::default())
        .await
        .expect("delete at v2");
    assert!(
        used_becomes(&quotas(c1), "q", &key, "2").await.is_some(),
        "shard-1: a delete after the schema update counted; log:\n{}",
        processes[1].log()
    );

    // shard-1 restarts; the other shards' lazyquotas keep counting deletes (only the
    // controller sees those) meanwhile, and shard-1's converges once its shard is back.
    let restart = tokio::task::spawn_blocking(|| kcp.restart("shard-1"));
    let delete = |client: &Client, name: &str| {
        let api = Api::<DynamicObject>::namespaced_with(client.clone(), "team", &ty.resource());
        let name = name.to_owned();
        async move { api.delete(&name, &DeleteParams::default()).await.expect("delete") }
    };
    delete(c0, "w-0").await;
    delete(c2, "x-1").await;
    assert!(
        used_becomes(&quotas(c0), "q", &key, "2").await.is_some(),
        "root: a delete counted during shard-1's restart"
    );
    assert!(
        used_becomes(&quotas(c2), "q", &key, "4").await.is_some(),
        "shard-2: a delete counted during shard-1's restart"
    );
    restart.await.expect("join").expect("shard-1 restarted");
    delete(c1, "w-1").await;
    assert!(
        used_becomes(&quotas(c1), "q", &key, "1").await.is_some(),
        "shard-1's lazyquota counts a delete after its shard's restart; log:\n{}",
        processes[1].log()
    );
    every_quota_holds_the_truth(&spread, &processes).await;

    // shard-2's consumer workspace is deleted: its lazyquota lets it go, the others keep it.
    delete_workspace(kcp.front(), &spread.consumers[2].0).await;
    assert!(
        becomes(&processes[2], "lazyquota_kcp_engaged_clusters", 0.0).await,
        "shard-2's lazyquota lets the deleted workspace go; log:\n{}",
        processes[2].log()
    );
    delete(c0, "w-1").await;
    assert!(
        used_becomes(&quotas(c0), "q", &key, "1").await.is_some(),
        "root still counted after shard-2's workspace went"
    );
    for (shard, process) in kcp.shards().iter().zip(&processes).take(2) {
        assert!(
            becomes(process, "lazyquota_kcp_engaged_clusters", 1.0).await,
            "{}'s lazyquota keeps its consumer",
            shard.name()
        );
    }
    drop(processes);
    spread.delete(kcp).await;
}
