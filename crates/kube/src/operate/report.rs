//! One-shot reports over the live cluster, computed with the same [`Engine`] the controller
//! runs, from direct lists instead of watches:
//!
//! - [`usage`]: what `status.used` should be for each quota, and where the stored value differs.
//! - [`explain`]: which resource types lazyquota watches, in which scope, for which quotas and
//!   keys; which names are pending and why; which keys are never computed.

use std::collections::{BTreeMap, BTreeSet};

use futures::future::try_join_all;
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::{Api, Client, ResourceExt as _};
use lazyquota_index::{
    demand::{needs, replenished_by},
    engine::{Engine, same_value, store_kind},
    keys::{ALL_NAMESPACES, ClusterName, GroupResource, Need, QuotaKey},
    planner::{self, PlanSettings},
    resolver::ServedResource,
    sharing::Demand,
    store::PartitionKey,
};
use lazyquota_quota::{FeatureGates, Interner};

use crate::{now, object_id};
use serde::Serialize;

use crate::controller::discovery::{Discovered, discover};

/// What went wrong in a report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Discovery failed.
    #[error("discovery: {0}")]
    Discovery(#[source] kube::Error),
    /// Listing something failed.
    #[error("listing {what}: {source}")]
    List {
        /// What was listed.
        what: String,
        /// Why it failed.
        #[source]
        source: kube::Error,
    },
}

/// One key of a quota in the usage report.
#[derive(Debug, Serialize)]
pub struct KeyUsage {
    /// The hard key.
    pub key: String,
    /// `spec.hard[key]`.
    pub hard: String,
    /// What `status.used[key]` should be (`None`: not computed, see `unknown`).
    pub computed: Option<String>,
    /// What `status.used[key]` holds now.
    pub stored: Option<String>,
    /// Whether stored and computed differ by value (or by presence); never set for a key
    /// that was not computed.
    pub differs: bool,
    /// Why the key was not computed (the stored value is then neither confirmed nor refuted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
}

/// One quota in the usage report.
#[derive(Debug, Serialize)]
pub struct QuotaUsage {
    /// The cluster.
    pub cluster: String,
    /// kcp: the cluster's workspace path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Its keys.
    pub keys: Vec<KeyUsage>,
    /// Whether `run` would write its status now (a computed key, or `status.hard`, differs).
    pub write_due: bool,
}

/// Computes every quota's `status.used` (in `namespace`, or all) from direct lists.
///
/// With `kcp`, kcp's cluster-scoped quotas count every namespace, as `run` does on a shard.
pub async fn usage(
    client: &Client,
    cluster: &ClusterName,
    namespace: Option<&str>,
    gates: FeatureGates,
    kcp: bool,
) -> Result<Vec<QuotaUsage>, Error> {
    let cluster = cluster.clone();
    let (engine, quotas) = load(client, &cluster, namespace, gates, kcp).await?;
    let now = now();
    let mut report = Vec::new();
    for quota in &quotas {
        let key = QuotaKey::new(
            &cluster,
            &quota.namespace().unwrap_or_default(),
            &quota.name_any(),
        );
        let Some(computed) = engine.compute(&key, now) else {
            continue;
        };
        let stored = quota
            .status
            .as_ref()
            .and_then(|s| s.used.clone())
            .unwrap_or_default();
        let hard = quota
            .spec
            .as_ref()
            .and_then(|s| s.hard.clone())
            .unwrap_or_default();
        let keys = hard
            .iter()
            .map(|(name, limit)| {
                // status.used carries a stored value forward for a key no evaluator computed;
                // that value is not lazyquota's, so it is not shown as computed.
                let unknown = if computed.decision.withheld.contains(name) {
                    Some("withheld: an object carries a quantity beyond what lazyquota holds exactly".to_owned())
                } else if computed.uncomputed.contains(name) {
                    Some("not computed: its type is not served or could not be listed, or its evaluator is not implemented".to_owned())
                } else {
                    None
                };
                let ours = computed.decision.used.get(name).filter(|_| unknown.is_none());
                let theirs = stored.get(name);
                let differs = unknown.is_none()
                    && match (ours, theirs) {
                        (Some(a), Some(b)) => !same_value(a, b),
                        (a, b) => a.is_some() != b.is_some(),
                    };
                KeyUsage {
                    key: name.clone(),
                    hard: limit.0.clone(),
                    computed: ours.map(|q| q.0.clone()),
                    stored: theirs.map(|q| q.0.clone()),
                    differs,
                    unknown,
                }
            })
            .collect();
        report.push(QuotaUsage {
            cluster: cluster.to_string(),
            workspace: None,
            namespace: key.namespace.to_string(),
            name: key.name.to_string(),
            keys,
            write_due: computed.decision.dirty,
        });
    }
    Ok(report)
}

/// One resource type in the explain report.
#[derive(Debug, Serialize)]
pub struct WatchedResource {
    /// `count/<resource>.<group>` form of the resource.
    pub resource: String,
    /// The version watched, if served.
    pub version: Option<String>,
    /// `metadata` (counts only) or `typed` (projection of pods, services, PVCs).
    pub watch: &'static str,
    /// `namespaced` (one watch per namespace), `cluster-wide` (filtered at ingest), or `-`
    /// (nothing watched: pending).
    pub scope: &'static str,
    /// Why that scope (the threshold, eager mode, a cluster-scoped type or quota).
    pub scope_reason: Option<String>,
    /// Namespaces that demand it.
    pub namespaces: Vec<String>,
    /// Demanding quotas, as `namespace/name: key, key`.
    pub quotas: Vec<String>,
    /// Why it is not watched, when it is pending.
    pub pending: Option<String>,
    /// kcp, for a type watched for counts: `shared` (the shard's one wildcard watch serves it)
    /// or `own` (a watch of this logical cluster's own). Set by [`mark_shared`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'static str>,
    /// Why that source: how many logical clusters of the shard watch it for counts, against
    /// `--kcp-shared-watch-threshold`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_reason: Option<String>,
    /// A running controller's answer (`/debug/explain`): its open watches of the type, each
    /// as `<scope> (synced|listing|failing: reason, own|shared)`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub running: Vec<String>,
    /// The type itself, and whether its planned watches count only (the hub's demand).
    #[serde(skip)]
    group_resource: GroupResource,
    #[serde(skip)]
    counted: bool,
}

/// The explain report.
#[derive(Debug, Serialize)]
pub struct Explain {
    /// The cluster.
    pub cluster: String,
    /// kcp: the cluster's workspace path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// Resource types demanded by some quota.
    pub resources: Vec<WatchedResource>,
    /// Keys that no evaluator computes (they stay as stored, normally absent): `namespace/quota: key`.
    pub never_computed: Vec<String>,
    /// Keys always `0` under their quota's scopes (nothing watched for them).
    pub always_zero: Vec<String>,
    /// The Kubernetes release whose quota semantics apply (`1.36`).
    pub release: String,
    /// The feature gates in use, `Name=true,Name=false`.
    pub gates: String,
}

/// What lazyquota, run with `settings` (the mode and threshold flags `run` takes, the
/// cluster's gates), watches for the cluster's quotas now, and why: the watch planner's answer
/// ([`lazyquota_index::planner::why`]), the same function the controller plans with. With
/// `kcp`, kcp's cluster-scoped quotas demand every namespace (`*`).
pub async fn explain(
    client: &Client,
    cluster: &ClusterName,
    settings: PlanSettings,
    kcp: bool,
) -> Result<Explain, Error> {
    let discovered = discover(client, &crate::transport::route::Route::direct())
        .await
        .map_err(Error::Discovery)?;
    let served_all: BTreeMap<GroupResource, ServedResource> = discovered
        .served
        .iter()
        .map(|s| (s.resource.clone(), s.clone()))
        .collect();
    let (engine, _) = load_with(client, cluster, None, settings.gates, discovered, false, kcp).await?;
    Ok(explain_engine(&engine, &settings, cluster, Some(&served_all)))
}

/// The explain report of `cluster` from an engine's state: what [`explain`] prints, and what a
/// running controller answers at `/debug/explain` from its own engine (`served_all`: every type
/// discovery returned, quotable or not, to say why a pending one is pending; `None` when only
/// the engine's quotable types are known).
#[must_use]
pub fn explain_engine(
    engine: &Engine,
    settings: &PlanSettings,
    cluster: &ClusterName,
    served_all: Option<&BTreeMap<GroupResource, ServedResource>>,
) -> Explain {
    let gates = settings.gates;
    let c = cluster;
    let mut resources = Vec::new();
    for resource in planner::considered(engine, settings, c) {
        let why = planner::why(engine, settings, c, &resource);
        let pending = why.served.is_none().then(|| match served_all.map(|all| all.get(&resource)) {
            None => "not served as a quotable type by the last discovery".to_owned(),
            Some(None) => "not served by the apiserver (yet): its watch starts when discovery sees it".to_owned(),
            Some(Some(s)) if !s.namespaced && !s.context() => {
                "cluster-scoped: quota counts only namespaced resources".to_owned()
            }
            Some(Some(s)) if s.context() => "not listable and watchable".to_owned(),
            Some(Some(s)) if !s.quotable() => format!(
                "not quotable: verbs {:?} lack one of create, list, watch, delete, or upstream ignores it",
                s.verbs
            ),
            Some(Some(_)) => "not quotable".to_owned(),
        });
        let mut demanding = Vec::new();
        for (key, entry) in engine.index.quotas() {
            if &key.cluster != c || !entry.demands().contains_key(&resource) {
                continue;
            }
            let keys: Vec<&str> = entry
                .payload
                .spec
                .hard_keys
                .iter()
                .filter(|k| {
                    needs(k, &entry.payload.spec.scopes, gates)
                        .iter()
                        .any(|(r, _)| r == &resource)
                })
                .map(String::as_str)
                .collect();
            demanding.push(format!("{}/{}: {}", key.namespace, key.name, keys.join(", ")));
        }
        demanding.sort();
        resources.push(WatchedResource {
            resource: resource.object_count_name(),
            version: why.served.as_ref().map(|s| s.version.clone()),
            watch: why.watch_kind(),
            scope: why.scope_label(),
            scope_reason: why.scope.as_ref().map(ToString::to_string),
            namespaces: why.demand.keys().map(ToString::to_string).collect(),
            quotas: demanding,
            pending,
            source: None,
            source_reason: None,
            running: Vec::new(),
            counted: why.watches.iter().any(|w| w.need == Need::Count),
            group_resource: resource,
        });
    }
    let mut never_computed = Vec::new();
    let mut always_zero = Vec::new();
    for (key, entry) in engine.index.quotas().filter(|(k, _)| &k.cluster == c) {
        let spec = &entry.payload.spec;
        for hard in &spec.hard_keys {
            if replenished_by(hard, gates).is_empty() {
                never_computed.push(format!("{}/{}: {hard}", key.namespace, key.name));
            } else if needs(hard, &spec.scopes, gates).is_empty() {
                always_zero.push(format!("{}/{}: {hard}", key.namespace, key.name));
            }
        }
    }
    Explain {
        cluster: cluster.to_string(),
        workspace: None,
        resources,
        never_computed,
        always_zero,
        release: format!("1.{}", gates.minor),
        gates: gates.describe(),
    }
}

impl WatchedResource {
    /// The type this entry is about.
    #[must_use]
    pub fn group_resource(&self) -> &GroupResource {
        &self.group_resource
    }
}

/// kcp: which of the shard's types one shared wildcard watch would serve, from every engaged
/// logical cluster's count demand (`reports`: one per logical cluster with a quota) — the rule
/// of the hub a `lazyquota run` with the same `threshold` applies ([`Demand::shared`]; 0: never
/// shared). Marks each counted type `shared` or `own`, with the reason. Computed from scratch:
/// a running lazyquota that already shares a type keeps sharing it down to
/// `threshold - threshold / 4` clusters, which the reason says.
pub fn mark_shared(reports: &mut [Explain], threshold: usize) {
    let mut demand = Demand::default();
    for report in reports.iter() {
        let cluster = ClusterName::new(&report.cluster);
        for r in report.resources.iter().filter(|r| r.counted) {
            demand.set(&cluster, &r.group_resource, true);
        }
    }
    let shared = if threshold == 0 {
        BTreeSet::new()
    } else {
        demand.shared(threshold, &BTreeSet::new())
    };
    for report in reports.iter_mut() {
        for r in report.resources.iter_mut().filter(|r| r.counted) {
            let clusters = demand.clusters(&r.group_resource);
            let is_shared = shared.contains(&r.group_resource);
            r.source = Some(if is_shared { "shared" } else { "own" });
            r.source_reason = Some(if threshold == 0 {
                "--kcp-shared-watch-threshold 0: nothing is shared".to_owned()
            } else if is_shared {
                format!(
                    "{clusters} logical clusters of the shard watch it for counts, at least --kcp-shared-watch-threshold {threshold}"
                )
            } else {
                let low = lazyquota_index::sharing::low_mark(threshold);
                let keep = if clusters >= low {
                    format!(" (a running lazyquota already sharing it keeps sharing down to {low})")
                } else {
                    String::new()
                };
                format!(
                    "{clusters} logical cluster(s) of the shard watch it for counts, below --kcp-shared-watch-threshold {threshold}{keep}"
                )
            });
        }
    }
}

async fn load(
    client: &Client,
    cluster: &ClusterName,
    namespace: Option<&str>,
    gates: FeatureGates,
    kcp: bool,
) -> Result<(Engine, Vec<ResourceQuota>), Error> {
    let discovered = discover(client, &crate::transport::route::Route::direct())
        .await
        .map_err(Error::Discovery)?;
    load_with(client, cluster, namespace, gates, discovered, true, kcp).await
}

/// Builds an engine from the cluster's quotas and, if `fill`, the objects they demand.
async fn load_with(
    client: &Client,
    cluster: &ClusterName,
    namespace: Option<&str>,
    gates: FeatureGates,
    discovered: Discovered,
    fill: bool,
    kcp: bool,
) -> Result<(Engine, Vec<ResourceQuota>), Error> {
    let mut engine = if kcp {
        Engine::new(gates).with_kcp_semantics()
    } else {
        Engine::new(gates)
    };
    engine.discovered(cluster, discovered.served, &discovered.failed_groups);
    let api: Api<ResourceQuota> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let quotas = crate::controller::watch::list_all(&api)
        .await
        .map_err(|source| Error::List {
            what: "resourcequotas".into(),
            source,
        })?;
    for quota in &quotas {
        let key = QuotaKey::new(cluster, &quota.namespace().unwrap_or_default(), &quota.name_any());
        engine.apply_quota(key, quota);
    }
    if !fill {
        return Ok((engine, quotas));
    }
    let interner = Interner::new();
    let demanded: Vec<(ClusterName, GroupResource)> = engine.index.demanded().cloned().collect();
    for (c, resource) in demanded {
        let Some(served) = engine.resolver.get(&c, &resource).cloned() else {
            continue;
        };
        let demand = engine.index.demand_of(&c, &resource);
        let need = demand.values().copied().max().unwrap_or(Need::Count);
        let kind = store_kind(&resource, need);
        let lists = demand.keys().map(|ns| {
            let (served, interner) = (&served, &interner);
            async move {
                if !served.namespaced && &**ns != ALL_NAMESPACES {
                    // A namespace holds no cluster-scoped object (kcp only resolves these).
                    return Ok(Vec::new());
                }
                crate::controller::watch::list_namespace(
                    client,
                    &crate::transport::route::Route::direct(),
                    served,
                    ns,
                    need,
                    gates,
                    interner,
                )
                .await
            }
        });
        let lists = try_join_all(lists).await.map_err(|source| Error::List {
            what: resource.object_count_name(),
            source,
        })?;
        for (ns, objects) in demand.keys().zip(lists) {
            let p = PartitionKey {
                cluster: c.clone(),
                resource: resource.clone(),
                namespace: ns.clone(),
            };
            engine.hold(kind, p.clone());
            engine.begin_relist(kind, &p);
            for (name, object) in objects {
                engine.relist_apply(kind, &p, object_id(&name), object);
            }
            engine.finish_relist(kind, &p);
        }
    }
    Ok((engine, quotas))
}
