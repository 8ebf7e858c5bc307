//! The controller: one task that owns every pure state machine and drives the IO around it.
//!
//! ```text
//!  ResourceQuota watch ─► PolicyIndex ─► demand changes ─► watch set (start / stop)
//!  CRD/APIService watch ─► discovery ─► Resolver ─────────┘        │
//!  object watches (SelectAll, one task) ─► UsageStore ─► replenish ─► WorkQueue
//!  WorkQueue ─► compute (quota crate) ─► status PUT (bounded concurrency) or shadow report
//! ```
//!
//! Everything mutable lives in [`Controller`] and is touched only by its `run` loop, so there
//! are no locks on the hot path. The only other tasks are hyper's, one per open connection.
//! A snapshot for metrics and readiness is published through a `watch` channel.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    future::Future,
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use futures::{
    FutureExt as _, StreamExt as _,
    future::BoxFuture,
    stream::{AbortHandle, BoxStream, FuturesUnordered, SelectAll},
};
use k8s_openapi::{
    api::core::v1::{ResourceQuota, ResourceQuotaStatus},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::api::resource::Quantity as K8sQuantity,
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
};
use kube::{
    Api, Client, ResourceExt as _,
    api::{ObjectMeta, PartialObjectMeta, PostParams},
    runtime::{WatchStreamExt as _, watcher},
};
use lazyquota_index::{
    keys::{ClusterName, GroupResource, Need, QuotaKey, object_id},
    policy::{DemandChange, PolicyIndex, QuotaPolicy},
    queue::WorkQueue,
    resolver::{Resolver, ResolverChange},
    store::{Change, HeapSize, PartitionKey, UsageStore},
};
use lazyquota_quota::{
    Evaluator, FeatureGates, Interner, PodProjection, PvcProjection, QuotaSpec, Registry, ResourceList,
    ServiceProjection, StatusDecision, Time, assemble_status, calculate_object_count_usage, calculate_usage,
    pod_update_triggers, pvc_update_triggers, service_update_triggers,
};
use tracing::{debug, info, warn};

use crate::{
    discovery::{Discovered, discover},
    watch::{ObjectEvent, Projected, WatchItem, WatchKey, WatchOptions},
};

/// Which resource types are watched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Only the types some ResourceQuota constrains (the point of lazyquota).
    Lazy,
    /// Every quotable type discovery returns, as upstream KCM does (for comparison).
    Eager,
}

/// Controller settings. Defaults follow upstream KCM where it has one.
#[derive(Clone, Debug)]
pub struct Config {
    /// The logical cluster this controller serves.
    pub cluster: ClusterName,
    /// Lazy (constrained types only) or eager (everything, like upstream).
    pub mode: Mode,
    /// Full recalculation of every quota (`--resource-quota-sync-period`, 5m; zero disables).
    pub resync_period: Duration,
    /// Status computations and writes in flight at once (`--concurrent-resource-quota-syncs`).
    pub concurrency: usize,
    /// Compute and report, never write.
    pub shadow: bool,
    /// Above this many demanding namespaces, a resource is watched cluster-wide (filtered at
    /// ingest) instead of with one watch per namespace.
    pub namespace_watch_threshold: usize,
    /// Safety-net discovery poll (CRD and APIService changes trigger discovery at once).
    pub discovery_poll: Duration,
    /// Feature gates of the KCM whose results are mirrored.
    pub gates: FeatureGates,
    /// Streaming lists: `Some(choice)`, or `None` to probe the server once.
    pub streaming_lists: Option<bool>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cluster: ClusterName::new("default"),
            mode: Mode::Lazy,
            resync_period: Duration::from_secs(300),
            concurrency: 5,
            shadow: false,
            namespace_watch_threshold: 8,
            discovery_poll: Duration::from_secs(300),
            gates: FeatureGates::default(),
            streaming_lists: None,
        }
    }
}

/// Fatal controller errors (everything else is retried).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The ResourceQuota watch could not be established at all.
    #[error("watching ResourceQuotas: {0}")]
    QuotaWatch(#[source] watcher::Error),
}

/// What the controller keeps per quota: parsed, never the full object.
#[derive(Debug)]
pub struct QuotaState {
    /// Parsed spec (hard keys, scopes, problems).
    pub spec: QuotaSpec,
    /// `spec.hard` as the apiserver stores it (copied verbatim into `status.hard`).
    pub spec_hard: Option<BTreeMap<String, K8sQuantity>>,
    /// `status.hard` as last seen or written.
    pub status_hard: Option<BTreeMap<String, K8sQuantity>>,
    /// `status.used` as last seen or written: the previous values that unsynced keys keep.
    pub status_used: Option<BTreeMap<String, K8sQuantity>>,
    /// The resourceVersion the status write is guarded by.
    pub resource_version: Option<String>,
}

impl QuotaState {
    fn from_quota(quota: &ResourceQuota) -> (QuotaPolicy, Self) {
        let spec = QuotaSpec::from_resource_quota(quota);
        let status = quota.status.as_ref();
        let policy = QuotaPolicy {
            spec_hard: spec.hard_keys.iter().cloned().collect(),
            status_hard: status
                .and_then(|s| s.hard.as_ref())
                .map(|h| h.keys().cloned().collect())
                .unwrap_or_default(),
            scopes: spec.scopes.clone(),
        };
        let state = Self {
            spec,
            spec_hard: quota.spec.as_ref().and_then(|s| s.hard.clone()),
            status_hard: status.and_then(|s| s.hard.clone()),
            status_used: status.and_then(|s| s.used.clone()),
            resource_version: quota.resource_version(),
        };
        (policy, state)
    }
}

/// One open watch.
struct Running {
    id: u64,
    abort: AbortHandle,
    /// Namespaces whose partitions this watch fills.
    namespaces: BTreeSet<Arc<str>>,
    /// Eager mode: every namespace's objects are held.
    hold_all: bool,
    synced: bool,
    relisting: bool,
    /// The last failure, until the next successful list.
    failure: Option<(&'static str, String)>,
}

/// Counters and gauges the runtime exports. Cheap to clone; published after every loop turn
/// that changed something.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The ResourceQuota watch has completed its first list.
    pub quotas_synced: bool,
    /// Quotas known.
    pub quotas: usize,
    /// Open watches: (watch description, resource `count/` name, synced, failure reason).
    pub watches: Vec<WatchInfo>,
    /// Objects held per resource (`count/` name): (objects, bytes).
    pub held: BTreeMap<String, (usize, usize)>,
    /// Watch events processed per resource.
    pub events: BTreeMap<String, u64>,
    /// Relists per resource.
    pub relists: BTreeMap<String, u64>,
    /// Watch errors per (resource, reason).
    pub watch_errors: BTreeMap<(String, String), u64>,
    /// Quota syncs by result (`unchanged`, `written`, `conflict`, `error`, `shadow_agree`, `shadow_disagree`).
    pub syncs: BTreeMap<&'static str, u64>,
    /// Discovery runs by result.
    pub discovery_runs: BTreeMap<&'static str, u64>,
    /// Demanded resources not served (yet): (`count/` name, demanding quotas).
    pub pending: Vec<(String, usize)>,
    /// Shadow-mode disagreements now: (quota, key) → (ours, stored).
    pub disagreements: BTreeMap<(String, String), (String, String)>,
    /// Durations of quota syncs (compute + write), seconds, since the last snapshot read.
    pub sync_seconds: Vec<f64>,
    /// Whether streaming lists are used.
    pub streaming_lists: bool,
}

/// One open watch, for metrics and `explain`.
#[derive(Clone, Debug)]
pub struct WatchInfo {
    /// The watch.
    pub key: WatchKey,
    /// Listed completely.
    pub synced: bool,
    /// Why it is failing, if it is.
    pub failure: Option<String>,
}

type WriteResult = (QuotaKey, Instant, Result<ResourceQuota, kube::Error>);

/// The controller state.
pub struct Controller {
    client: Client,
    config: Config,
    options: WatchOptions,
    interner: Arc<Interner>,
    index: PolicyIndex<QuotaState>,
    resolver: Resolver,
    registries: HashMap<ClusterName, Registry>,
    counts: UsageStore<()>,
    pods: UsageStore<PodProjection>,
    services: UsageStore<ServiceProjection>,
    pvcs: UsageStore<PvcProjection>,
    watches: BTreeMap<WatchKey, Running>,
    by_id: HashMap<u64, WatchKey>,
    streams: SelectAll<BoxStream<'static, (u64, WatchItem)>>,
    next_id: u64,
    queue: WorkQueue<QuotaKey>,
    writes: FuturesUnordered<BoxFuture<'static, WriteResult>>,
    stats: Snapshot,
    publish: tokio::sync::watch::Sender<Snapshot>,
}

/// Handle to read the controller's published snapshot.
pub type SnapshotReceiver = tokio::sync::watch::Receiver<Snapshot>;

impl Controller {
    /// A controller for `client`'s cluster.
    pub fn new(client: Client, config: Config) -> (Self, SnapshotReceiver) {
        let (publish, receiver) = tokio::sync::watch::channel(Snapshot::default());
        let options = WatchOptions {
            streaming_lists: config.streaming_lists.unwrap_or(false),
            gates: config.gates,
        };
        let controller = Self {
            client,
            options,
            interner: Arc::new(Interner::new()),
            index: PolicyIndex::new(config.gates),
            resolver: Resolver::new(),
            registries: HashMap::new(),
            counts: UsageStore::new(),
            pods: UsageStore::new(),
            services: UsageStore::new(),
            pvcs: UsageStore::new(),
            watches: BTreeMap::new(),
            by_id: HashMap::new(),
            streams: SelectAll::new(),
            next_id: 0,
            queue: WorkQueue::new(),
            writes: FuturesUnordered::new(),
            stats: Snapshot::default(),
            publish,
            config,
        };
        (controller, receiver)
    }

    /// Runs until `shutdown` completes; then stops all watches and waits (bounded) for the
    /// status writes in flight.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        if self.config.streaming_lists.is_none() {
            self.options.streaming_lists = crate::watch::probe_streaming_lists(&self.client).await;
        }
        self.stats.streaming_lists = self.options.streaming_lists;
        info!(streaming_lists = self.options.streaming_lists, mode = ?self.config.mode, shadow = self.config.shadow, "controller starting");

        let mut quota_events = watcher(
            Api::<ResourceQuota>::all(self.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .boxed();
        let mut api_changes = api_change_stream(&self.client);
        let mut quota_relist: Option<Vec<ResourceQuota>> = None;
        let mut discovery: Option<BoxFuture<'static, Result<Discovered, kube::Error>>> =
            Some(discover_owned(self.client.clone()));
        let mut next_discovery = tokio::time::Instant::now() + self.config.discovery_poll;
        // After a CRD or APIService change, discovery runs again a few times: a new CRD is
        // served a moment after its object appears.
        let mut discovery_retries: Vec<tokio::time::Instant> = Vec::new();
        let resync = (!self.config.resync_period.is_zero()).then_some(self.config.resync_period);
        let mut next_resync = resync.map(|p| tokio::time::Instant::now() + p);
        let mut shutdown = std::pin::pin!(shutdown);

        loop {
            let queue_ready = self.queue.next_ready().map(tokio::time::Instant::from_std);
            let can_start = self.writes.len() < self.config.concurrency.max(1);
            let next_retry = discovery_retries.iter().min().copied();
            tokio::select! {
                () = &mut shutdown => break,
                event = quota_events.next() => match event {
                    Some(Ok(event)) => self.on_quota_event(event, &mut quota_relist),
                    Some(Err(error)) => warn!(%error, "ResourceQuota watch failed; retrying"),
                    None => break,
                },
                Some((id, item)) = self.streams.next(), if !self.streams.is_empty() => self.on_watch_item(id, item),
                Some(()) = api_changes.next() => {
                    let now = tokio::time::Instant::now();
                    discovery_retries = [300, 1_000, 3_000, 8_000].iter().map(|ms| now + Duration::from_millis(*ms)).collect();
                }
                Some(result) = futures::future::OptionFuture::from(discovery.as_mut()), if discovery.is_some() => {
                    discovery = None;
                    self.on_discovery(result);
                }
                () = tokio::time::sleep_until(next_discovery), if discovery.is_none() => {
                    next_discovery = tokio::time::Instant::now() + self.config.discovery_poll;
                    discovery = Some(discover_owned(self.client.clone()));
                }
                () = tokio::time::sleep_until(next_retry.unwrap_or_else(far_future)), if next_retry.is_some() && discovery.is_none() => {
                    let now = tokio::time::Instant::now();
                    discovery_retries.retain(|t| *t > now);
                    discovery = Some(discover_owned(self.client.clone()));
                }
                () = tokio::time::sleep_until(next_resync.unwrap_or_else(far_future)), if next_resync.is_some() => {
                    next_resync = resync.map(|p| tokio::time::Instant::now() + p);
                    self.enqueue_all();
                }
                () = tokio::time::sleep_until(queue_ready.unwrap_or_else(far_future)), if queue_ready.is_some() && can_start => {
                    self.start_syncs();
                }
                Some((key, started, result)) = self.writes.next(), if !self.writes.is_empty() => {
                    self.on_write(&key, started, result);
                }
            }
            self.publish_snapshot();
        }

        info!(
            in_flight = self.writes.len(),
            "shutting down: stopping watches, finishing status writes"
        );
        for running in self.watches.values() {
            running.abort.abort();
        }
        let drain = async {
            while let Some((key, started, result)) = self.writes.next().await {
                self.on_write(&key, started, result);
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), drain)
            .await
            .is_err()
        {
            warn!("status writes still in flight after 10s; exiting anyway");
        }
        Ok(())
    }

    // ---- quotas ----------------------------------------------------------------------------

    fn on_quota_event(
        &mut self,
        event: watcher::Event<ResourceQuota>,
        relist: &mut Option<Vec<ResourceQuota>>,
    ) {
        let cluster = self.config.cluster.clone();
        match event {
            watcher::Event::Init => *relist = Some(Vec::new()),
            watcher::Event::InitApply(quota) => match relist {
                Some(list) => list.push(quota),
                None => self.apply_quota(&quota),
            },
            watcher::Event::InitDone => {
                let quotas = relist.take().unwrap_or_default();
                let entries: Vec<_> = quotas
                    .iter()
                    .map(|q| {
                        let key = QuotaKey::new(&cluster, &q.namespace().unwrap_or_default(), &q.name_any());
                        let (policy, state) = QuotaState::from_quota(q);
                        report_spec_problems(&key, &state.spec);
                        (key, policy, state)
                    })
                    .collect();
                let changes = self.index.reset(&cluster, entries);
                self.apply_demand(&changes);
                self.stats.quotas_synced = true;
                // Like upstream's first enqueueAll: every quota is computed once at start.
                self.enqueue_all();
                info!(quotas = self.index.len(), "ResourceQuotas listed");
            }
            watcher::Event::Apply(quota) => self.apply_quota(&quota),
            watcher::Event::Delete(quota) => {
                let key = QuotaKey::new(
                    &cluster,
                    &quota.namespace().unwrap_or_default(),
                    &quota.name_any(),
                );
                let changes = self.index.delete(&key);
                self.queue.remove(&key);
                self.stats.disagreements.retain(|(q, _), _| q != &key.to_string());
                self.apply_demand(&changes);
                debug!(quota = %key, "quota deleted");
            }
        }
    }

    fn apply_quota(&mut self, quota: &ResourceQuota) {
        let key = QuotaKey::new(
            &self.config.cluster,
            &quota.namespace().unwrap_or_default(),
            &quota.name_any(),
        );
        let (policy, state) = QuotaState::from_quota(quota);
        // Upstream enqueues a quota when it is new or its spec.hard changed; lazyquota also
        // recomputes at once when the scopeSelector changes (upstream waits for a resync).
        let recompute = match self.index.get(&key) {
            None => true,
            Some(old) => {
                old.payload.spec.hard_keys != state.spec.hard_keys
                    || !same_quantities(old.payload.spec_hard.as_ref(), state.spec_hard.as_ref())
                    || old.payload.spec.scopes != state.spec.scopes
            }
        };
        if recompute {
            report_spec_problems(&key, &state.spec);
        }
        let changes = self.index.apply(key.clone(), &policy, state);
        self.apply_demand(&changes);
        if recompute {
            self.queue.add(key, Instant::now());
        }
    }

    fn enqueue_all(&mut self) {
        let now = Instant::now();
        let keys: Vec<QuotaKey> = self.index.quotas().map(|(k, _)| k.clone()).collect();
        for key in keys {
            self.queue.add(key, now);
        }
    }

    // ---- discovery -------------------------------------------------------------------------

    fn on_discovery(&mut self, result: Result<Discovered, kube::Error>) {
        let cluster = self.config.cluster.clone();
        let discovered = match result {
            Ok(d) => d,
            Err(error) => {
                *self.stats.discovery_runs.entry("error").or_default() += 1;
                warn!(%error, "discovery failed; keeping what was known");
                return;
            }
        };
        *self.stats.discovery_runs.entry("ok").or_default() += 1;
        let changes = self
            .resolver
            .replace(&cluster, discovered.served, &discovered.failed_groups);
        let registry = self
            .registries
            .entry(cluster.clone())
            .or_insert_with(|| Registry::new(self.config.gates));
        for served in self.resolver.quotable(&cluster) {
            registry.add_discovered(served.resource.clone());
        }
        let mut touched: BTreeSet<GroupResource> = BTreeSet::new();
        for change in changes {
            let (ResolverChange::Served(r) | ResolverChange::Gone(r) | ResolverChange::Changed(r)) = &change;
            debug!(?change, "discovery change");
            if let ResolverChange::Changed(_) | ResolverChange::Gone(_) = change {
                // A version change restarts the watch; a resource that is gone stops it.
                self.stop_watches_of(&cluster, r);
            }
            touched.insert(r.clone());
        }
        if self.config.mode == Mode::Eager {
            let all: Vec<GroupResource> = self
                .resolver
                .quotable(&cluster)
                .map(|s| s.resource.clone())
                .collect();
            touched.extend(all);
        }
        for resource in &touched {
            self.sync_watches(&cluster, resource);
            // A newly served resource gives its quotas an evaluator: compute them now.
            let now = Instant::now();
            for key in self.index.computing(&cluster, resource) {
                self.queue.add(key, now);
            }
        }
    }

    // ---- demand → watches --------------------------------------------------------------------

    fn apply_demand(&mut self, changes: &[DemandChange]) {
        let touched: BTreeSet<(ClusterName, GroupResource)> = changes
            .iter()
            .map(|c| (c.cluster.clone(), c.resource.clone()))
            .collect();
        for (cluster, resource) in touched {
            self.sync_watches(&cluster, &resource);
        }
    }

    /// The watches (cluster, resource) should have now.
    fn desired_watches(
        &self,
        cluster: &ClusterName,
        resource: &GroupResource,
    ) -> BTreeMap<WatchKey, BTreeSet<Arc<str>>> {
        let mut desired = BTreeMap::new();
        if self.resolver.get(cluster, resource).is_none() {
            return desired; // pending: not served (yet)
        }
        if self.config.mode == Mode::Eager {
            let typed = resource.group.is_empty()
                && ["pods", "services", "persistentvolumeclaims"].contains(&resource.resource.as_str());
            let need = if typed { Need::Typed } else { Need::Count };
            desired.insert(
                WatchKey {
                    cluster: cluster.clone(),
                    resource: resource.clone(),
                    namespace: None,
                    need,
                },
                BTreeSet::new(),
            );
            return desired;
        }
        let demand = self.index.demand_of(cluster, resource);
        if demand.is_empty() {
            return desired;
        }
        let need = demand.values().copied().max().unwrap_or(Need::Count);
        if demand.len() > self.config.namespace_watch_threshold {
            desired.insert(
                WatchKey {
                    cluster: cluster.clone(),
                    resource: resource.clone(),
                    namespace: None,
                    need,
                },
                demand.keys().cloned().collect(),
            );
        } else {
            for ns in demand.keys() {
                desired.insert(
                    WatchKey {
                        cluster: cluster.clone(),
                        resource: resource.clone(),
                        namespace: Some(ns.to_string()),
                        need,
                    },
                    BTreeSet::from([ns.clone()]),
                );
            }
        }
        desired
    }

    fn sync_watches(&mut self, cluster: &ClusterName, resource: &GroupResource) {
        let desired = self.desired_watches(cluster, resource);
        let current: Vec<WatchKey> = self
            .watches
            .keys()
            .filter(|k| &k.cluster == cluster && &k.resource == resource)
            .cloned()
            .collect();
        for key in current {
            match desired.get(&key) {
                None => self.stop_watch(&key),
                Some(namespaces) => {
                    let running = self.watches.get(&key).expect("listed above");
                    let added = namespaces.iter().any(|ns| !running.namespaces.contains(ns));
                    let removed: Vec<Arc<str>> = running
                        .namespaces
                        .iter()
                        .filter(|ns| !namespaces.contains(*ns))
                        .cloned()
                        .collect();
                    for ns in removed {
                        self.release(&key, &ns);
                        if let Some(r) = self.watches.get_mut(&key) {
                            r.namespaces.remove(&ns);
                        }
                    }
                    if added {
                        // A cluster-wide watch cannot fill a joining namespace exactly without
                        // a list of its own; restarting it relists into a fresh generation.
                        self.stop_watch(&key);
                    }
                }
            }
        }
        for (key, namespaces) in desired {
            if !self.watches.contains_key(&key) {
                self.start_watch(key, namespaces);
            }
        }
    }

    fn start_watch(&mut self, key: WatchKey, namespaces: BTreeSet<Arc<str>>) {
        let Some(served) = self.resolver.get(&key.cluster, &key.resource).cloned() else {
            return;
        };
        self.next_id += 1;
        let id = self.next_id;
        let (stream, abort) =
            crate::watch::open(&self.client, &served, &key, self.options, &self.interner, id);
        for ns in &namespaces {
            self.hold(&key, ns);
        }
        info!(watch = %key, version = %served.version, "watch started");
        self.streams.push(stream);
        self.by_id.insert(id, key.clone());
        let hold_all = self.config.mode == Mode::Eager;
        self.watches.insert(
            key,
            Running {
                id,
                abort,
                namespaces,
                hold_all,
                synced: false,
                relisting: false,
                failure: None,
            },
        );
    }

    fn stop_watch(&mut self, key: &WatchKey) {
        let Some(running) = self.watches.remove(key) else {
            return;
        };
        running.abort.abort();
        self.by_id.remove(&running.id);
        if running.hold_all {
            self.release_all(key);
        } else {
            for ns in &running.namespaces {
                self.release(key, ns);
            }
        }
        info!(watch = %key, "watch stopped");
    }

    fn stop_watches_of(&mut self, cluster: &ClusterName, resource: &GroupResource) {
        let keys: Vec<WatchKey> = self
            .watches
            .keys()
            .filter(|k| &k.cluster == cluster && &k.resource == resource)
            .cloned()
            .collect();
        for key in keys {
            self.stop_watch(&key);
        }
    }

    // ---- partitions ----------------------------------------------------------------------------

    fn partition(key: &WatchKey, namespace: &str) -> PartitionKey {
        PartitionKey {
            cluster: key.cluster.clone(),
            resource: key.resource.clone(),
            namespace: Arc::from(namespace),
        }
    }

    fn hold(&mut self, key: &WatchKey, ns: &str) {
        let p = Self::partition(key, ns);
        match store_kind(key) {
            StoreKind::Counts => self.counts.hold(p),
            StoreKind::Pods => self.pods.hold(p),
            StoreKind::Services => self.services.hold(p),
            StoreKind::Pvcs => self.pvcs.hold(p),
        }
    }

    fn release(&mut self, key: &WatchKey, ns: &str) {
        let p = Self::partition(key, ns);
        match store_kind(key) {
            StoreKind::Counts => self.counts.release(&p),
            StoreKind::Pods => self.pods.release(&p),
            StoreKind::Services => self.services.release(&p),
            StoreKind::Pvcs => self.pvcs.release(&p),
        }
    }

    fn release_all(&mut self, key: &WatchKey) {
        let partitions: Vec<PartitionKey> = match store_kind(key) {
            StoreKind::Counts => self.counts.partition_stats().map(|(p, _, _)| p.clone()).collect(),
            StoreKind::Pods => self.pods.partition_stats().map(|(p, _, _)| p.clone()).collect(),
            StoreKind::Services => self
                .services
                .partition_stats()
                .map(|(p, _, _)| p.clone())
                .collect(),
            StoreKind::Pvcs => self.pvcs.partition_stats().map(|(p, _, _)| p.clone()).collect(),
        };
        for p in partitions
            .iter()
            .filter(|p| p.cluster == key.cluster && p.resource == key.resource)
        {
            self.release(key, &p.namespace);
        }
    }

    // ---- watch events ----------------------------------------------------------------------------

    fn on_watch_item(&mut self, id: u64, item: WatchItem) {
        let Some(key) = self.by_id.get(&id).cloned() else {
            return;
        }; // a stopped watch's last item
        let name = key.resource.object_count_name();
        *self.stats.events.entry(name.clone()).or_default() += 1;
        match item {
            WatchItem::Init => {
                *self.stats.relists.entry(name).or_default() += 1;
                let namespaces = self.partitions_of(&key);
                let running = self.watches.get_mut(&key).expect("by_id and watches agree");
                running.relisting = true;
                for ns in namespaces {
                    self.with_store(&key, |s| s.begin_relist(&Self::partition(&key, &ns)));
                }
            }
            WatchItem::InitApply(ObjectEvent {
                namespace,
                name,
                object,
            }) => {
                self.ensure_held(&key, &namespace, true);
                let p = Self::partition(&key, &namespace);
                self.relist_apply(&key, &p, object_id(&name), object);
            }
            WatchItem::InitDone => {
                let namespaces = self.partitions_of(&key);
                for ns in &namespaces {
                    self.with_store(&key, |s| {
                        s.finish_relist(&Self::partition(&key, ns));
                    });
                }
                let running = self.watches.get_mut(&key).expect("by_id and watches agree");
                let first = !running.synced;
                running.synced = true;
                running.relisting = false;
                if running.failure.take().is_some() {
                    info!(watch = %key, "watch recovered");
                }
                if first {
                    info!(watch = %key, "watch synced");
                }
                // A newly synced (or relisted) resource: its quotas can be computed now.
                let now = Instant::now();
                for quota in self.index.computing(&key.cluster, &key.resource) {
                    if namespaces.iter().any(|ns| **ns == *quota.namespace) {
                        self.queue.add(quota, now);
                    }
                }
            }
            WatchItem::Apply(ObjectEvent {
                namespace,
                name,
                object,
            }) => {
                if !self.ensure_held(&key, &namespace, false) {
                    return; // another namespace's object on a cluster-wide watch: dropped at ingest
                }
                let p = Self::partition(&key, &namespace);
                let triggers = self.apply_object(&key, &p, object_id(&name), object);
                if triggers {
                    self.replenish(&key, &namespace);
                }
            }
            WatchItem::Delete(ObjectEvent { namespace, name, .. }) => {
                let p = Self::partition(&key, &namespace);
                let removed = self.with_store(&key, |s| s.delete(&p, object_id(&name)));
                if removed {
                    self.replenish(&key, &namespace);
                }
            }
            WatchItem::Failed(reason, message) => {
                *self
                    .stats
                    .watch_errors
                    .entry((name, reason.to_owned()))
                    .or_default() += 1;
                let running = self.watches.get_mut(&key).expect("by_id and watches agree");
                if running.failure.as_ref().is_none_or(|(r, _)| *r != reason) {
                    // Only the keys computed from this resource keep their previous values;
                    // every other quota and key stays current.
                    warn!(watch = %key, reason, error = %message, "watch failing; quotas keep previous values for keys computed from it");
                }
                running.failure = Some((reason, message));
            }
        }
    }

    /// The namespaces whose partitions this watch fills (for eager watches, every held one).
    fn partitions_of(&self, key: &WatchKey) -> Vec<Arc<str>> {
        let Some(running) = self.watches.get(key) else {
            return Vec::new();
        };
        if !running.hold_all {
            return running.namespaces.iter().cloned().collect();
        }
        let matches = |p: &PartitionKey| p.cluster == key.cluster && p.resource == key.resource;
        match store_kind(key) {
            StoreKind::Counts => self
                .counts
                .partition_stats()
                .filter(|(p, _, _)| matches(p))
                .map(|(p, _, _)| p.namespace.clone())
                .collect(),
            StoreKind::Pods => self
                .pods
                .partition_stats()
                .filter(|(p, _, _)| matches(p))
                .map(|(p, _, _)| p.namespace.clone())
                .collect(),
            StoreKind::Services => self
                .services
                .partition_stats()
                .filter(|(p, _, _)| matches(p))
                .map(|(p, _, _)| p.namespace.clone())
                .collect(),
            StoreKind::Pvcs => self
                .pvcs
                .partition_stats()
                .filter(|(p, _, _)| matches(p))
                .map(|(p, _, _)| p.namespace.clone())
                .collect(),
        }
    }

    /// Whether the object's partition is held; eager watches hold every namespace they see.
    fn ensure_held(&mut self, key: &WatchKey, namespace: &str, in_relist: bool) -> bool {
        let p = Self::partition(key, namespace);
        if self.with_store(key, |s| s.holds(&p)) {
            return true;
        }
        let Some(running) = self.watches.get(key) else {
            return false;
        };
        if !running.hold_all {
            return false;
        }
        let relisting = running.relisting;
        self.hold(key, namespace);
        if in_relist && relisting {
            self.with_store(key, |s| s.begin_relist(&p));
        } else if !relisting {
            self.with_store(key, |s| {
                s.finish_relist(&p);
            });
        }
        true
    }

    fn with_store<R>(&mut self, key: &WatchKey, f: impl FnOnce(&mut dyn StoreOps) -> R) -> R {
        match store_kind(key) {
            StoreKind::Counts => f(&mut self.counts),
            StoreKind::Pods => f(&mut self.pods),
            StoreKind::Services => f(&mut self.services),
            StoreKind::Pvcs => f(&mut self.pvcs),
        }
    }

    fn relist_apply(&mut self, key: &WatchKey, p: &PartitionKey, id: u64, object: Projected) {
        match (store_kind(key), object) {
            (StoreKind::Counts, _) => self.counts.relist_apply(p, id, ()),
            (StoreKind::Pods, Projected::Pod(o)) => self.pods.relist_apply(p, id, o),
            (StoreKind::Services, Projected::Service(o)) => self.services.relist_apply(p, id, o),
            (StoreKind::Pvcs, Projected::Pvc(o)) => self.pvcs.relist_apply(p, id, o),
            (_, object) => malformed(key, p, &object),
        }
    }

    /// Applies an object; returns whether upstream's update filter would replenish.
    fn apply_object(&mut self, key: &WatchKey, p: &PartitionKey, id: u64, object: Projected) -> bool {
        let now = now();
        let gates = self.config.gates;
        match (store_kind(key), object) {
            // Metadata-only updates never change a count (upstream's filter is false for them).
            (StoreKind::Counts, _) => {
                self.counts.apply(p, id, ());
                false
            }
            (StoreKind::Pods, Projected::Pod(new)) => match self.pods.apply(p, id, new.clone()) {
                Change::Updated(old) => pod_update_triggers(&old, &new, now, gates),
                _ => false,
            },
            (StoreKind::Services, Projected::Service(new)) => match self.services.apply(p, id, new) {
                Change::Updated(old) => service_update_triggers(&old, &new),
                _ => false,
            },
            (StoreKind::Pvcs, Projected::Pvc(new)) => match self.pvcs.apply(p, id, new.clone()) {
                Change::Updated(old) => pvc_update_triggers(&old, &new),
                _ => false,
            },
            (_, object) => {
                malformed(key, p, &object);
                false
            }
        }
    }

    fn replenish(&mut self, key: &WatchKey, namespace: &str) {
        let now = Instant::now();
        for quota in self.index.dirtied_by(&key.cluster, namespace, &key.resource) {
            self.queue.add(quota, now);
        }
    }

    // ---- computing and writing status ------------------------------------------------------------

    fn start_syncs(&mut self) {
        let now = Instant::now();
        while self.writes.len() < self.config.concurrency.max(1) {
            let Some(key) = self.queue.pop_ready(now) else {
                break;
            };
            self.sync_quota(key, now);
        }
    }

    fn sync_quota(&mut self, key: QuotaKey, started: Instant) {
        let Some(decision) = self.compute(&key) else {
            self.queue.done(&key);
            return;
        };
        let entry = self.index.get(&key).expect("computed from the index");
        if self.config.shadow {
            self.report_shadow(&key, &decision);
            self.queue.forget(&key);
            self.queue.done(&key);
            self.stats.sync_seconds.push(started.elapsed().as_secs_f64());
            return;
        }
        if !decision.dirty {
            *self.stats.syncs.entry("unchanged").or_default() += 1;
            self.queue.forget(&key);
            self.queue.done(&key);
            self.stats.sync_seconds.push(started.elapsed().as_secs_f64());
            return;
        }
        let body = ResourceQuota {
            metadata: ObjectMeta {
                name: Some(key.name.to_string()),
                namespace: Some(key.namespace.to_string()),
                resource_version: entry.payload.resource_version.clone(),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(ResourceQuotaStatus {
                hard: Some(decision.hard),
                used: Some(decision.used),
            }),
        };
        let api: Api<ResourceQuota> = Api::namespaced(self.client.clone(), &key.namespace);
        let write = async move {
            let result = api.replace_status(&key.name, &PostParams::default(), &body).await;
            (key, started, result)
        };
        self.writes.push(write.boxed());
    }

    /// `syncResourceQuota` minus the write: `None` if the quota is gone.
    fn compute(&self, key: &QuotaKey) -> Option<StatusDecision> {
        let entry = self.index.get(key)?;
        let state = &entry.payload;
        let registry = self
            .registries
            .get(&key.cluster)
            .cloned()
            .unwrap_or_else(|| Registry::new(self.config.gates));
        let hard_keys: Vec<&str> = state.spec.hard_keys.iter().map(String::as_str).collect();
        let plan = registry.plan(&hard_keys);
        let now = now();
        let results: Vec<(Evaluator, Option<ResourceList>)> = plan
            .per_evaluator
            .iter()
            .map(|(evaluator, keys)| {
                let used = self.evaluate(
                    key,
                    entry.demands().get(&evaluator.group_resource()).copied(),
                    evaluator,
                    keys,
                    state,
                    now,
                );
                (evaluator.clone(), used)
            })
            .collect();
        let used = plan.merge(&results);
        Some(assemble_status(
            state.spec_hard.as_ref(),
            state.status_hard.as_ref(),
            state.status_used.as_ref(),
            &used,
        ))
    }

    /// One evaluator's usage in the quota's namespace, or `None` if it cannot be computed now
    /// (its resource is not synced): its keys then keep their previous values.
    fn evaluate(
        &self,
        quota: &QuotaKey,
        need: Option<Need>,
        evaluator: &Evaluator,
        keys: &[String],
        state: &QuotaState,
        now: Time,
    ) -> Option<ResourceList> {
        let scopes = &state.spec.scopes;
        let gates = self.config.gates;
        let resource = evaluator.group_resource();
        let p = PartitionKey {
            cluster: quota.cluster.clone(),
            resource: resource.clone(),
            namespace: quota.namespace.clone(),
        };
        match (need, evaluator) {
            (_, Evaluator::ResourceClaims) => None,
            // Nothing demanded: every object is excluded by the scopes, so the value is 0.
            (None, Evaluator::ObjectCount(_)) => Some(calculate_object_count_usage(keys, scopes, 0)),
            (None, Evaluator::Pods) => {
                Some(calculate_usage::<PodProjection, _, _>(keys, scopes, [], now, gates).used)
            }
            (None, Evaluator::Services) => {
                Some(calculate_usage::<ServiceProjection, _, _>(keys, scopes, [], now, gates).used)
            }
            (None, Evaluator::PersistentVolumeClaims) => {
                Some(calculate_usage::<PvcProjection, _, _>(keys, scopes, [], now, gates).used)
            }
            (Some(Need::Count), _) => {
                // Counted from whichever store holds the partition (a typed watch serves counts too).
                let count = Self::synced_len(&self.counts, &p)
                    .or_else(|| Self::synced_len(&self.pods, &p))
                    .or_else(|| Self::synced_len(&self.services, &p))
                    .or_else(|| Self::synced_len(&self.pvcs, &p))?;
                Some(calculate_object_count_usage(keys, scopes, count as u64))
            }
            (Some(Need::Typed), Evaluator::Pods) => {
                typed_usage(&self.pods, &p, keys, scopes, now, gates, quota)
            }
            (Some(Need::Typed), Evaluator::Services) => {
                typed_usage(&self.services, &p, keys, scopes, now, gates, quota)
            }
            (Some(Need::Typed), Evaluator::PersistentVolumeClaims) => {
                typed_usage(&self.pvcs, &p, keys, scopes, now, gates, quota)
            }
            (Some(Need::Typed), Evaluator::ObjectCount(_)) => Some(calculate_object_count_usage(
                keys,
                scopes,
                Self::synced_len(&self.counts, &p)? as u64,
            )),
        }
    }

    fn synced_len<P: HeapSize>(store: &UsageStore<P>, p: &PartitionKey) -> Option<usize> {
        store
            .partition(p)
            .filter(|x| x.is_synced())
            .map(|x| x.objects().len())
    }

    fn report_shadow(&mut self, key: &QuotaKey, decision: &StatusDecision) {
        let state = &self.index.get(key).expect("computed").payload;
        let stored = state.status_used.clone().unwrap_or_default();
        let quota = key.to_string();
        self.stats.disagreements.retain(|(q, _), _| q != &quota);
        let mut disagree = false;
        for (name, ours) in &decision.used {
            let theirs = stored.get(name);
            let same = theirs.is_some_and(|t| same_value(ours, t));
            if !same {
                disagree = true;
                let theirs = theirs.map_or_else(|| "<absent>".to_owned(), |t| t.0.clone());
                warn!(quota = %quota, key = %name, ours = %ours.0, stored = %theirs, "shadow: status.used disagrees");
                self.stats
                    .disagreements
                    .insert((quota.clone(), name.clone()), (ours.0.clone(), theirs));
            }
        }
        *self
            .stats
            .syncs
            .entry(if disagree {
                "shadow_disagree"
            } else {
                "shadow_agree"
            })
            .or_default() += 1;
    }

    fn on_write(&mut self, key: &QuotaKey, started: Instant, result: Result<ResourceQuota, kube::Error>) {
        self.queue.done(key);
        self.stats.sync_seconds.push(started.elapsed().as_secs_f64());
        match result {
            Ok(written) => {
                *self.stats.syncs.entry("written").or_default() += 1;
                self.queue.forget(key);
                if let Some(state) = self.index.payload_mut(key) {
                    let status = written.status.as_ref();
                    state.status_hard = status.and_then(|s| s.hard.clone());
                    state.status_used = status.and_then(|s| s.used.clone());
                    state.resource_version = written.resource_version();
                }
                debug!(quota = %key, "status written");
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                *self.stats.syncs.entry("conflict").or_default() += 1;
                // The quota watch brings the newer version; retry after backoff.
                let delay = self.queue.add_rate_limited(key.clone(), Instant::now());
                debug!(quota = %key, ?delay, "status write conflicted; retrying");
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                self.queue.forget(key);
            }
            Err(error) => {
                *self.stats.syncs.entry("error").or_default() += 1;
                let delay = self.queue.add_rate_limited(key.clone(), Instant::now());
                warn!(quota = %key, %error, ?delay, "status write failed; retrying");
            }
        }
    }

    // ---- snapshot -------------------------------------------------------------------------------

    fn publish_snapshot(&mut self) {
        self.stats.quotas = self.index.len();
        self.stats.watches = self
            .watches
            .iter()
            .map(|(k, r)| WatchInfo {
                key: k.clone(),
                synced: r.synced,
                failure: r.failure.as_ref().map(|(reason, _)| (*reason).to_owned()),
            })
            .collect();
        let mut held: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        let mut add = |p: &PartitionKey, n: usize, b: usize| {
            let e = held.entry(p.resource.object_count_name()).or_default();
            e.0 += n;
            e.1 += b;
        };
        self.counts.partition_stats().for_each(|(p, n, b)| add(p, n, b));
        self.pods.partition_stats().for_each(|(p, n, b)| add(p, n, b));
        self.services.partition_stats().for_each(|(p, n, b)| add(p, n, b));
        self.pvcs.partition_stats().for_each(|(p, n, b)| add(p, n, b));
        self.stats.held = held;
        let mut pending: BTreeMap<String, usize> = BTreeMap::new();
        for (cluster, resource) in self.index.demanded() {
            if self.resolver.knows(cluster) && self.resolver.get(cluster, resource).is_none() {
                *pending.entry(resource.object_count_name()).or_default() +=
                    self.index.computing(cluster, resource).len();
            }
        }
        self.stats.pending = pending.into_iter().collect();
        let snapshot = self.stats.clone();
        self.stats.sync_seconds.clear();
        self.publish.send_replace(snapshot);
    }
}

/// The object-safe part of [`UsageStore`] the event loop needs regardless of projection.
trait StoreOps {
    fn holds(&self, p: &PartitionKey) -> bool;
    fn begin_relist(&mut self, p: &PartitionKey);
    fn finish_relist(&mut self, p: &PartitionKey) -> bool;
    fn delete(&mut self, p: &PartitionKey, id: u64) -> bool;
}

impl<P: HeapSize> StoreOps for UsageStore<P> {
    fn holds(&self, p: &PartitionKey) -> bool {
        UsageStore::holds(self, p)
    }
    fn begin_relist(&mut self, p: &PartitionKey) {
        UsageStore::begin_relist(self, p);
    }
    fn finish_relist(&mut self, p: &PartitionKey) -> bool {
        UsageStore::finish_relist(self, p)
    }
    fn delete(&mut self, p: &PartitionKey, id: u64) -> bool {
        !matches!(UsageStore::delete(self, p, id), Change::None)
    }
}

#[derive(Clone, Copy)]
enum StoreKind {
    Counts,
    Pods,
    Services,
    Pvcs,
}

fn store_kind(key: &WatchKey) -> StoreKind {
    match (
        key.need,
        key.resource.group.as_str(),
        key.resource.resource.as_str(),
    ) {
        (Need::Typed, "", "pods") => StoreKind::Pods,
        (Need::Typed, "", "services") => StoreKind::Services,
        (Need::Typed, "", "persistentvolumeclaims") => StoreKind::Pvcs,
        _ => StoreKind::Counts,
    }
}

fn typed_usage<P>(
    store: &UsageStore<P>,
    p: &PartitionKey,
    keys: &[String],
    scopes: &lazyquota_quota::QuotaScopes,
    now: Time,
    gates: FeatureGates,
    quota: &QuotaKey,
) -> Option<ResourceList>
where
    P: HeapSize + lazyquota_quota::QuotaObject,
{
    let partition = store.partition(p).filter(|x| x.is_synced())?;
    let stats = calculate_usage(keys, scopes, partition.objects().values(), now, gates);
    if let Some(error) = stats.scope_error {
        // Upstream's CalculateUsageStats stops at the first object whose scope match fails
        // and returns the partial sum with a nil error; the same partial sum is written here.
        warn!(quota = %quota, %error, "scope matching failed; usage is the partial sum, as upstream");
    }
    Some(stats.used)
}

fn malformed(key: &WatchKey, p: &PartitionKey, object: &Projected) {
    if let Projected::Malformed(reason) = object {
        warn!(watch = %key, namespace = %p.namespace, %reason, "object could not be projected; left out of usage");
    }
}

fn report_spec_problems(key: &QuotaKey, spec: &QuotaSpec) {
    for problem in &spec.problems {
        warn!(quota = %key, %problem, "quota spec problem; other keys and quotas are unaffected");
    }
}

fn same_value(a: &K8sQuantity, b: &K8sQuantity) -> bool {
    match (
        lazyquota_quota::Quantity::parse_k8s(a),
        lazyquota_quota::Quantity::parse_k8s(b),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => a.0 == b.0,
    }
}

fn same_quantities(
    a: Option<&BTreeMap<String, K8sQuantity>>,
    b: Option<&BTreeMap<String, K8sQuantity>>,
) -> bool {
    let empty = BTreeMap::new();
    let (a, b) = (a.unwrap_or(&empty), b.unwrap_or(&empty));
    a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| same_value(v, w)))
}

fn now() -> Time {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    Time::from_unix_nanos(i128::try_from(nanos).unwrap_or(i128::MAX))
}

fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400 * 365)
}

fn discover_owned(client: Client) -> BoxFuture<'static, Result<Discovered, kube::Error>> {
    async move { discover(&client).await }.boxed()
}

/// One item per change of a CustomResourceDefinition or APIService (metadata-only watches:
/// only the fact of a change matters, discovery reads the rest).
fn api_change_stream(client: &Client) -> BoxStream<'static, ()> {
    #[allow(clippy::needless_pass_by_value)] // filter_map hands each item over by value
    fn changed<K>(event: Result<watcher::Event<K>, watcher::Error>) -> futures::future::Ready<Option<()>> {
        let changed = matches!(
            event,
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)
        );
        futures::future::ready(changed.then_some(()))
    }
    let crds: Api<PartialObjectMeta<CustomResourceDefinition>> = Api::all(client.clone());
    let services: Api<PartialObjectMeta<APIService>> = Api::all(client.clone());
    futures::stream::select(
        watcher(crds, watcher::Config::default())
            .default_backoff()
            .filter_map(changed),
        watcher(services, watcher::Config::default())
            .default_backoff()
            .filter_map(changed),
    )
    .boxed()
}
