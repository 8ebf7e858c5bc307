//! One-shot reports over the live cluster, computed by the same
//! [`Reconciler`] the controller runs (in shadow mode: it writes nothing), fed direct lists as
//! the first lists of the watches it asks for:
//!
//! - [`usage`]: what `status.used` should be for each quota, and where the stored value differs.
//! - [`explain`]: which resource types lazyquota watches, in which scope, for which quotas and
//!   keys; which names are pending and why; which keys are never computed.

use std::collections::{BTreeMap, BTreeSet};

use std::time::{Duration, Instant};

use futures::future::try_join_all;
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::{Api, Client, ResourceExt as _};
use lazyquota_index::{
    demand::{needs, replenished_by},
    engine::same_value,
    keys::{ALL_NAMESPACES, ClusterName, GroupResource, Need, QuotaKey},
    planner::{self, PlanSettings, WatchKey},
    reconciler::{Effect, Input, Now, QuotaEvent, Reconciler, Settings},
    resolver::ServedResource,
    sharing::Demand,
    watches::{Item, ObjectEvent},
};
use lazyquota_quota::{FeatureGates, Interner};

use crate::{
    controller::{
        discovery::{Discovered, discover},
        watch::{list_all, list_namespace},
    },
    now,
    transport::route::Route,
};
use serde::Serialize;

/// Rounds of watches opened and listed for a report, at most (the plan is made at once when
/// the quotas are listed; a second round would be a namespace joining a cluster-wide watch).
const MAX_ROUNDS: usize = 4;

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
    let plan = PlanSettings {
        gates,
        ..Settings::default().plan()
    };
    let discovered = discover(client, &Route::direct(), None)
        .await
        .map_err(Error::Discovery)?;
    let (reconciler, quotas) = load(client, &cluster, namespace, plan, discovered, true, kcp).await?;
    let now = now();
    let mut report = Vec::new();
    for quota in &quotas {
        let key = QuotaKey::new(
            &cluster,
            &quota.namespace().unwrap_or_default(),
            &quota.name_any(),
        );
        let Some(computed) = reconciler.engine().compute(&key, now) else {
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
                // that value is not lazyquota's, so it is not shown as computed (the keys
                // shadow mode calls unknown, `Computed::not_computed`, and withheld ones).
                let unknown = if computed.decision.withheld.contains(name) {
                    Some("withheld: an object carries a quantity beyond what lazyquota holds exactly".to_owned())
                } else if computed.unclaimed.contains(name) {
                    Some("not computed: no evaluator claims this key (a typo, or a resource no object requests in this form); its stored value is another writer's".to_owned())
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
    let discovered = discover(client, &Route::direct(), None)
        .await
        .map_err(Error::Discovery)?;
    let served_all: BTreeMap<GroupResource, ServedResource> = discovered
        .served
        .iter()
        .map(|s| (s.resource.clone(), s.clone()))
        .collect();
    let (reconciler, _) = load(client, cluster, None, settings, discovered, false, kcp).await?;
    Ok(explain_cluster(&reconciler, cluster, Some(&served_all)))
}

/// The explain report of `cluster` from a reconciler's state, with its settings: what
/// [`explain`] prints, and what a running controller answers at `/debug/explain` from its own
/// reconciler (`served_all`: every type discovery returned, quotable or not, to say why a
/// pending one is pending; `None` when only the quotable types are known).
#[must_use]
pub fn explain_cluster(
    reconciler: &Reconciler,
    cluster: &ClusterName,
    served_all: Option<&BTreeMap<GroupResource, ServedResource>>,
) -> Explain {
    let (engine, settings) = (reconciler.engine(), &reconciler.settings().plan());
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

/// A reconciler in shadow mode fed what `cluster` holds now, as its executor would feed it:
/// its discovery, its quotas (those of `namespace`, or all) as the quota watch's first list, and
/// with `fill` every watch it then opens answered by a list of what that watch would see.
async fn load(
    client: &Client,
    cluster: &ClusterName,
    namespace: Option<&str>,
    plan: PlanSettings,
    discovered: Discovered,
    fill: bool,
    kcp: bool,
) -> Result<(Reconciler, Vec<ResourceQuota>), Error> {
    let settings = Settings {
        cluster: cluster.clone(),
        mode: plan.mode,
        namespace_watch_threshold: plan.namespace_watch_threshold,
        gates: plan.gates,
        kcp,
        shadow: true,
        resync_period: Duration::ZERO,
        ..Settings::default()
    };
    let at = || Now {
        instant: Instant::now(),
        time: now(),
    };
    let mut reconciler = Reconciler::new(settings, crate::object_ids().clone(), Instant::now());
    reconciler.tick(at()); // asks for the discovery answered here
    let cluster = cluster.clone();
    let result = Ok(discovered);
    reconciler.handle(Input::Discovered { cluster, result }, at());
    let api: Api<ResourceQuota> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let quotas = list_all(&api).await.map_err(|source| Error::List {
        what: "resourcequotas".into(),
        source,
    })?;
    reconciler.handle(Input::Quota(QuotaEvent::RelistStarted), at());
    for quota in &quotas {
        reconciler.handle(Input::Quota(QuotaEvent::Relisted(quota.clone())), at());
    }
    reconciler.handle(Input::Quota(QuotaEvent::RelistDone), at());
    if !fill {
        return Ok((reconciler, quotas));
    }
    let interner = Interner::new();
    for _ in 0..MAX_ROUNDS {
        let opened: Vec<(u64, WatchKey, ServedResource)> = reconciler
            .take_effects()
            .into_iter()
            .filter_map(|effect| match effect {
                Effect::OpenWatch { id, key, served } => Some((id, key, served)),
                _ => None,
            })
            .collect();
        if opened.is_empty() {
            break;
        }
        let lists = opened
            .iter()
            .map(|(_, key, served)| first_list(client, key, served, plan.gates, &interner));
        let lists = try_join_all(lists).await?;
        for ((id, _, _), objects) in opened.iter().zip(lists) {
            let id = *id;
            reconciler.handle(Input::Watch { id, item: Item::Init }, at());
            for object in objects {
                let item = Item::InitApply(object);
                reconciler.handle(Input::Watch { id, item }, at());
            }
            reconciler.handle(
                Input::Watch {
                    id,
                    item: Item::InitDone,
                },
                at(),
            );
        }
    }
    Ok((reconciler, quotas))
}

/// What watch `key`'s first list would deliver: its namespace's objects, or the whole
/// cluster's for a cluster-wide watch (filtered by the reconciler at ingest, as a watch is).
async fn first_list(
    client: &Client,
    key: &WatchKey,
    served: &ServedResource,
    gates: FeatureGates,
    interner: &Interner,
) -> Result<Vec<ObjectEvent>, Error> {
    let namespace = key.namespace.as_deref().unwrap_or(ALL_NAMESPACES);
    if !served.namespaced && namespace != ALL_NAMESPACES {
        // A namespace holds no cluster-scoped object (kcp only resolves these).
        return Ok(Vec::new());
    }
    let listed = list_namespace(
        client,
        &Route::direct(),
        served,
        namespace,
        key.need,
        gates,
        interner,
    )
    .await
    .map_err(|source| Error::List {
        what: key.resource.object_count_name(),
        source,
    })?;
    Ok(listed
        .into_iter()
        .map(|(name, object)| {
            // A list of every namespace names its objects `<namespace>/<name>`.
            let (ns, name) = match key.namespace.as_deref() {
                Some(ns) => (ns.to_owned(), name),
                None => match name.split_once('/') {
                    Some((ns, name)) => (ns.to_owned(), name.to_owned()),
                    None => (String::new(), name),
                },
            };
            ObjectEvent {
                namespace: ns,
                name,
                object,
                revision: None,
            }
        })
        .collect())
}
