//! The controller: one task that drives the pure [`Engine`], the pure watch set
//! ([`Watches`]) and the work queue, and carries out what they decide.
//!
//! ```text
//!  ResourceQuota watch ─► Engine.apply_quota ─► demand changes ─► Watches.sync ─► Start / Stop / Fill
//!  CRD/APIService watch ─► discovery ─► Engine.discovered ─────────┘
//!  object watches (one SelectAll, polled by this task) ─► Watches.on_item ─► Engine stores ─► Enqueue
//!  WorkQueue ─► Engine.compute ─► status PUT (bounded concurrency) or shadow report
//! ```
//!
//! Which watches run, what each fills and what its events do is decided by
//! `crates/index/src/watches.rs` (unit and property tests, no IO); this file opens and
//! closes streams and lists, writes status and Events, and counts metrics.
//!
//! One controller serves one cluster, or on kcp every logical cluster of a shard that has a
//! quota ([`Controller::for_shard`]: quotas, CRDs, APIBindings and LogicalClusters from wildcard
//! watches; each served cluster a [`Member`] and map entries in the engine and watch set;
//! every request through one client of the shard's root, routed by path).
//!
//! Everything mutable lives in [`Controller`] and is touched only by its `run` loop: no locks.
//! The only other tasks are hyper's, one per open connection, and the client's request buffer. Metrics and readiness ask the
//! loop for a [`Snapshot`] through a [`SnapshotHandle`]; gauges are computed then, at scrape
//! time, not on every event.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{
    FutureExt as _, StreamExt as _,
    future::BoxFuture,
    stream::{AbortHandle, BoxStream, FuturesUnordered, SelectAll},
};
use k8s_openapi::{
    api::core::v1::ResourceQuota,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
};
use kube::{
    Client, ResourceExt as _,
    api::{DynamicObject, PartialObjectMeta, Patch, PatchParams},
    runtime::{WatchStreamExt as _, events::EventType, watcher},
};
use lazyquota_index::{
    discoveries::Discoveries,
    engine::{Engine, Projected, same_value},
    keys::{ClusterName, GroupResource, QuotaKey},
    lowering,
    membership::Membership,
    planner::{self, PlanSettings},
    policy::DemandChange,
    queue::WorkQueue,
    resolver::{ResolverChange, ServedResource},
    watches::{Action, Watches},
};
use lazyquota_quota::{FeatureGates, Interner, StatusDecision};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

pub use crate::snapshot::{QuotaKeyUsage, Snapshot, SnapshotHandle, WatchInfo};
use crate::{
    discovery::{Discovered, discover},
    events::Recorder,
    members::{self, Member},
    metrics::Metrics,
    now,
    route::{Route, Routed},
    watch::{WatchItem, WatchKey, WatchOptions, routed_api},
};

pub use lazyquota_index::planner::Mode;

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
    /// Streaming lists: `Some(choice)`, or `None` to probe the server once. Off by default:
    /// kube-runtime asks for them at resourceVersion 0 ("any"), which an apiserver watch cache
    /// that cannot convert a CRD's objects answered with an empty list — a false `0` —
    /// where a paginated consistent list fails and withholds the key, as it should.
    pub streaming_lists: Option<bool>,
    /// This instance's name in Events it records (a pod name).
    pub instance: String,
    /// The cluster is a kcp logical cluster: discovery is re-run on APIBinding changes (kcp
    /// serves no APIServices).
    pub kcp: bool,
    /// kcp: the logical cluster's workspace path (`root:org:team`), named in Events.
    pub workspace: Option<String>,
    /// Report each quota's `used` and `hard` per key in the snapshot (for the opt-in
    /// `lazyquota_quota_used`/`_hard`/`_usage_ratio` gauges).
    pub quota_usage_metrics: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cluster: ClusterName::new("default"),
            mode: Mode::Lazy,
            resync_period: Duration::from_mins(5),
            concurrency: 5,
            shadow: false,
            namespace_watch_threshold: 8,
            discovery_poll: Duration::from_mins(5),
            gates: FeatureGates::default(),
            streaming_lists: Some(false),
            instance: "lazyquota".into(),
            kcp: false,
            workspace: None,
            quota_usage_metrics: false,
        }
    }
}

/// The keys `set` holds for `quota` (a range of the ordered set, not a scan of every quota).
fn keys_of(set: &BTreeSet<(String, String)>, quota: &str) -> Vec<String> {
    set.range((quota.to_owned(), String::new())..)
        .take_while(|(q, _)| q == quota)
        .map(|(_, k)| k.clone())
        .collect()
}

/// How long after someone else changed a quota's status.used lazyquota checks it again.
const STATUS_RECHECK_DELAY: Duration = Duration::from_secs(5);

/// A status write in flight this long no longer counts against `--concurrency`: a write that
/// hangs (until its request deadline, 30 s) must not hold back the other quotas' writes.
const WRITE_STALL: Duration = Duration::from_secs(5);

/// Of writes started at `started`, how many still count against the concurrency at `now`, and
/// when the next of them stops counting (for the loop's timer).
fn busy_writes(started: impl Iterator<Item = Instant>, now: Instant) -> (usize, Option<Instant>) {
    let mut busy = 0;
    let mut next = None::<Instant>;
    for at in started {
        let stalls_at = at + WRITE_STALL;
        if stalls_at > now {
            busy += 1;
            next = Some(next.map_or(stalls_at, |n| n.min(stalls_at)));
        }
    }
    (busy, next)
}

/// An Event's note, at most (events.k8s.io/v1 allows 1024 bytes).
const MAX_NOTE_BYTES: usize = 1000;

/// An Event's note: on kcp it starts with the workspace path, so an Event read on the shard
/// (or exported) says where it happened; cut to what events.k8s.io/v1 accepts (error texts
/// can be longer).
fn event_note(workspace: Option<&str>, note: &str) -> String {
    match workspace {
        Some(path) => truncate(&format!("[workspace {path}] {note}"), MAX_NOTE_BYTES),
        None => truncate(note, MAX_NOTE_BYTES),
    }
}

/// `text` cut to at most `max` bytes at a character boundary, marked with an ellipsis.
fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Events published at once, at most (a burst beyond is dropped and logged).
const MAX_PENDING_EVENTS: usize = 256;

/// How long a quota's first write waits for a watch still on its first list.
const FIRST_LIST_GRACE: Duration = Duration::from_secs(30);

/// Fatal controller errors (everything else is retried).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The ResourceQuota watch ended, which the watcher never does on its own.
    #[error("the ResourceQuota watch ended unexpectedly")]
    QuotaWatchEnded,
}

/// The IO side of one open watch (its state is the pure watch set's).
struct Handle {
    abort: AbortHandle,
    /// This watch's event counter (cached: one atomic add per event).
    events: prometheus::IntCounter,
    /// When it was opened.
    started: Instant,
}

/// A status write's outcome: the quota, when its sync started, the resourceVersion the write
/// was conditioned on, and the answer.
type WriteResult = (
    QuotaKey,
    Instant,
    Option<String>,
    Result<ResourceQuota, kube::Error>,
);
type ReadResult = (QuotaKey, Result<ResourceQuota, kube::Error>);
type FillResult = (WatchKey, Arc<str>, kube::Result<Vec<(String, Projected)>>);
type DiscoveryResult = (ClusterName, Result<Discovered, kube::Error>);

/// Discoveries run at once, at most (a kcp shard engaging many logical clusters at start).
const MAX_DISCOVERIES: usize = 4;

/// The controller.
pub struct Controller {
    /// The cluster's client; on kcp, the shard's root, every request routed ([`Route`]).
    client: Client,
    /// kcp: which logical clusters of the shard to serve (`None`: the one cluster of `client`).
    shard: Option<Membership>,
    /// The clusters served now.
    members: BTreeMap<ClusterName, Member>,
    /// When each served cluster's discovery runs.
    discoveries: Discoveries,
    /// Discoveries running (at most [`MAX_DISCOVERIES`]).
    discovering: FuturesUnordered<BoxFuture<'static, DiscoveryResult>>,
    config: Config,
    options: WatchOptions,
    interner: Arc<Interner>,
    engine: Engine,
    /// What is watched and why: the pure watch set.
    watches: Watches,
    /// Each open watch's abort handle, counter and start.
    handles: HashMap<u64, Handle>,
    streams: SelectAll<BoxStream<'static, (u64, WatchItem)>>,
    queue: WorkQueue<QuotaKey>,
    writes: FuturesUnordered<BoxFuture<'static, WriteResult>>,
    /// When each status write in flight started (one per quota at most: the queue does not
    /// hand out a quota being written).
    writing: HashMap<QuotaKey, Instant>,
    /// Fresh reads of quotas whose write conflicted while the watch had nothing newer.
    reads: FuturesUnordered<BoxFuture<'static, ReadResult>>,
    /// The origin of the milliseconds the pure side is given ([`Controller::now_ms`]).
    epoch: Instant,
    stats: Snapshot,
    metrics: Metrics,
    recorder: Recorder,
    /// Lists filling namespaces that joined a cluster-wide watch (polled by the loop; the
    /// watch set starts at most [`lazyquota_index::watches::MAX_FILLS`] at once).
    fills: FuturesUnordered<BoxFuture<'static, FillResult>>,
    /// Events being published (polled by the loop; at most [`MAX_PENDING_EVENTS`]).
    events: FuturesUnordered<BoxFuture<'static, ()>>,
    requests: mpsc::Receiver<crate::snapshot::Request>,
    /// kcp: the shard's shared wildcard watches.
    hub: Option<crate::hub::Hub>,
}

impl Controller {
    /// A controller for `client`'s cluster, counting into `metrics`, and the handle to ask
    /// it for snapshots.
    pub fn new(client: Client, config: Config, metrics: Metrics) -> (Self, SnapshotHandle) {
        let member = Member {
            workspace: config.workspace.clone(),
            ..Member::default()
        };
        let cluster = config.cluster.clone();
        let (mut controller, handle) = Self::build(client, config, metrics, None);
        controller.members.insert(cluster.clone(), member);
        controller.discoveries.add(cluster, Instant::now());
        (controller, handle)
    }

    /// One controller for every logical cluster of the kcp shard whose root `root` points at
    /// that has a ResourceQuota (engaged and let go as quotas and LogicalClusters come and go).
    pub fn for_shard(root: Client, config: Config, metrics: Metrics) -> (Self, SnapshotHandle) {
        let config = Config { kcp: true, ..config };
        Self::build(root, config, metrics, Some(Membership::default()))
    }

    fn build(
        client: Client,
        config: Config,
        metrics: Metrics,
        shard: Option<Membership>,
    ) -> (Self, SnapshotHandle) {
        let (tx, requests) = mpsc::channel(16);
        let options = WatchOptions {
            streaming_lists: config.streaming_lists.unwrap_or(false),
            gates: config.gates,
        };
        let recorder = Recorder::new(client.clone(), config.instance.clone(), shard.is_some());
        let controller = Self {
            discoveries: Discoveries::new(config.discovery_poll, MAX_DISCOVERIES),
            discovering: FuturesUnordered::new(),
            members: BTreeMap::new(),
            shard,
            recorder,
            fills: FuturesUnordered::new(),
            events: FuturesUnordered::new(),
            client,
            options,
            interner: Arc::new(Interner::new()),
            engine: if config.kcp {
                Engine::new(config.gates).with_kcp_semantics()
            } else {
                Engine::new(config.gates)
            },
            watches: Watches::new(Self::plan_settings(&config), false, crate::object_ids().clone()),
            handles: HashMap::new(),
            streams: SelectAll::new(),
            queue: WorkQueue::new(),
            writes: FuturesUnordered::new(),
            writing: HashMap::new(),
            reads: FuturesUnordered::new(),
            epoch: Instant::now(),
            stats: Snapshot::default(),
            metrics,
            requests,
            config,
            hub: None,
        };
        (controller, SnapshotHandle::new(tx))
    }

    /// kcp: count-only watches of types the shard's hub shares come from its shared wildcard
    /// watch instead of a watch of their own.
    #[must_use]
    pub fn with_hub(mut self, hub: crate::hub::Hub) -> Self {
        self.hub = Some(hub);
        self.watches = Watches::new(
            Self::plan_settings(&self.config),
            true,
            crate::object_ids().clone(),
        );
        self
    }

    /// Runs until `shutdown` completes; then stops all watches and waits (at most 10 s) for
    /// the status writes in flight.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        if self.config.streaming_lists.is_none() && self.shard.is_none() {
            self.options.streaming_lists = crate::watch::probe_streaming_lists(&self.client).await;
        }
        self.stats.streaming_lists = self.options.streaming_lists;
        self.stats.cluster = self.config.cluster.to_string();
        info!(streaming_lists = self.options.streaming_lists, mode = ?self.config.mode, shadow = self.config.shadow, kcp_shard = self.shard.is_some(), "controller starting");

        // On kcp the quotas of every logical cluster, from one wildcard watch.
        let wide = if self.shard.is_some() {
            Route::wildcard()
        } else {
            Route::direct()
        };
        let mut quota_events = watcher(
            routed_api::<ResourceQuota>(&self.client, &wide, None, ()),
            watcher::Config::default(),
        )
        .default_backoff()
        .boxed();
        let mut logical_clusters = self
            .shard
            .as_ref()
            .map(|_| members::logical_clusters(&self.client));
        let mut api_changes = api_change_stream(&self.client, &wide, self.config.kcp, &self.metrics);
        let mut quota_relist: Option<Vec<ResourceQuota>> = None;
        let mut shared_changes = self.hub.as_ref().map(crate::hub::Hub::changes);
        let resync = (!self.config.resync_period.is_zero()).then_some(self.config.resync_period);
        let mut next_resync = resync.map(|p| tokio::time::Instant::now() + p);
        let mut shutdown = std::pin::pin!(shutdown);

        let outcome = loop {
            let queue_ready = self.queue.next_ready().map(tokio::time::Instant::from_std);
            let (busy, next_stall) = busy_writes(self.writing.values().copied(), Instant::now());
            let can_start = busy < self.config.concurrency.max(1);
            let discovery_due = self.discoveries.next_due().map(tokio::time::Instant::from_std);
            tokio::select! {
                () = &mut shutdown => break Ok(()),
                event = quota_events.next() => match event {
                    Some(Ok(event)) => self.on_quota_event(event, &mut quota_relist),
                    Some(Err(error)) => warn!(%error, "ResourceQuota watch failed; retrying"),
                    None => break Err(Error::QuotaWatchEnded),
                },
                Some(event) = next_of(logical_clusters.as_mut()) => match event {
                    Ok(event) => self.on_logical_cluster(&event),
                    Err(error) => warn!(%error, "wildcard LogicalCluster watch failed; retrying"),
                },
                Some((id, item)) = self.streams.next(), if !self.streams.is_empty() => self.on_watch_item(id, item),
                Ok(()) = async {
                    match shared_changes.as_mut() {
                        Some(changes) => changes.changed().await,
                        None => std::future::pending().await,
                    }
                } => self.on_shared_changed(),
                Some(changed) = api_changes.next() => match (changed, self.shard.is_some()) {
                    (Some(cluster), _) => self.discoveries.api_changed(&cluster, Instant::now()),
                    // One cluster: a change (or a relist) asks for the runs over 8 s.
                    (None, false) => self.discoveries.api_changed(&self.config.cluster, Instant::now()),
                    (None, true) => self.discoveries.all_changed(Instant::now()),
                },
                () = tokio::time::sleep_until(discovery_due.unwrap_or_else(far_future)), if discovery_due.is_some() => {
                    self.start_discoveries();
                }
                Some((cluster, result)) = self.discovering.next(), if !self.discovering.is_empty() => {
                    self.discoveries.finished(&cluster, result.is_ok(), Instant::now());
                    if self.members.contains_key(&cluster) {
                        self.on_discovery(&cluster, result);
                    }
                }
                () = tokio::time::sleep_until(next_resync.unwrap_or_else(far_future)), if next_resync.is_some() => {
                    next_resync = resync.map(|p| tokio::time::Instant::now() + p);
                    self.enqueue_all();
                }
                // A write in flight becomes stalled: its slot is free for another quota.
                () = tokio::time::sleep_until(next_stall.map_or_else(far_future, tokio::time::Instant::from_std)), if !can_start && next_stall.is_some() => {}
                () = tokio::time::sleep_until(queue_ready.unwrap_or_else(far_future)), if queue_ready.is_some() && can_start => {
                    self.start_syncs();
                }
                Some((key, started, precondition, result)) = self.writes.next(), if !self.writes.is_empty() => {
                    self.on_write(&key, started, precondition.as_deref(), result);
                }
                Some((key, result)) = self.reads.next(), if !self.reads.is_empty() => self.on_read(&key, result),
                Some(()) = self.events.next(), if !self.events.is_empty() => {}
                Some((key, namespace, listed)) = self.fills.next(), if !self.fills.is_empty() => {
                    self.on_fill(&key, &namespace, listed);
                }
                Some(request) = self.requests.recv() => match request {
                    crate::snapshot::Request::Snapshot(reply) => {
                        let _ = reply.send(self.snapshot());
                    }
                    crate::snapshot::Request::Explain(reply) => {
                        let _ = reply.send(self.explain());
                    }
                },
            }
        };

        info!(
            in_flight = self.writes.len(),
            "stopping watches, finishing status writes"
        );
        for handle in self.handles.values() {
            handle.abort.abort();
        }
        let drain = async {
            while let Some((key, started, precondition, result)) = self.writes.next().await {
                self.on_write(&key, started, precondition.as_deref(), result);
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), drain)
            .await
            .is_err()
        {
            warn!("status writes still in flight after 10s; exiting anyway");
        }
        outcome
    }

    // ---- quotas ----------------------------------------------------------------------------

    /// The quota's key: in this controller's cluster, or on kcp in the logical cluster its
    /// `kcp.io/cluster` annotation names (`None` without one).
    fn quota_key(&self, quota: &ResourceQuota) -> Option<QuotaKey> {
        let cluster = if self.shard.is_some() {
            members::cluster_of(quota)?
        } else {
            self.config.cluster.clone()
        };
        Some(QuotaKey::new(
            &cluster,
            &quota.namespace().unwrap_or_default(),
            &quota.name_any(),
        ))
    }

    fn on_quota_event(
        &mut self,
        event: watcher::Event<Routed<ResourceQuota>>,
        relist: &mut Option<Vec<ResourceQuota>>,
    ) {
        if let Some(membership) = &mut self.shard {
            members::on_quota(membership, &event);
        }
        match event {
            watcher::Event::Init => *relist = Some(Vec::new()),
            watcher::Event::InitApply(Routed(quota)) => match relist {
                Some(list) => list.push(quota),
                None => self.apply_quota(&quota),
            },
            watcher::Event::InitDone => {
                let quotas = relist.take().unwrap_or_default();
                let mut by_cluster: BTreeMap<ClusterName, Vec<(QuotaKey, &ResourceQuota)>> = self
                    .engine
                    .index
                    .quotas()
                    .map(|(k, _)| (k.cluster.clone(), Vec::new()))
                    .collect();
                by_cluster.entry(self.config.cluster.clone()).or_default();
                for quota in &quotas {
                    let Some(key) = self.quota_key(quota) else {
                        warn!(quota = %quota.name_any(), "a wildcard ResourceQuota without the kcp.io/cluster annotation; ignored");
                        continue;
                    };
                    by_cluster
                        .entry(key.cluster.clone())
                        .or_default()
                        .push((key, quota));
                }
                let mut changes = Vec::new();
                for (cluster, keyed) in by_cluster {
                    changes.extend(self.engine.reset_quotas(&cluster, keyed));
                }
                for (key, entry) in self.engine.index.quotas() {
                    report_spec_problems(key, &entry.payload.spec.problems);
                }
                self.apply_demand(&changes);
                self.stats.quotas_synced = true;
                // Like upstream's first enqueueAll: every quota is computed once at start.
                self.enqueue_all();
                info!(quotas = self.engine.index.len(), "ResourceQuotas listed");
            }
            watcher::Event::Apply(Routed(quota)) => {
                debug!(quota = ?self.quota_key(&quota), resource_version = ?quota.metadata.resource_version, "quota event");
                self.apply_quota(&quota);
            }
            watcher::Event::Delete(Routed(quota)) => {
                if let Some(key) = self.quota_key(&quota) {
                    self.delete_quota(&key);
                }
            }
        }
        self.engage();
    }

    fn delete_quota(&mut self, key: &QuotaKey) {
        let changes = self.engine.delete_quota(key);
        self.queue.remove(key);
        let name = key.to_string();
        self.stats.forget_quotas(|q| q == name);
        self.apply_demand(&changes);
        debug!(quota = %key, "quota deleted");
    }

    // ---- kcp: which logical clusters are served ---------------------------------------------

    fn on_logical_cluster(&mut self, event: &watcher::Event<members::LogicalCluster>) {
        if let Some(membership) = &mut self.shard {
            members::on_cluster(membership, event);
        }
        self.engage();
    }

    /// Brings the served logical clusters to what the membership wants: a cluster with a quota
    /// is discovered and served; one whose last quota (or LogicalCluster) went is let go.
    fn engage(&mut self) {
        let Some(membership) = &self.shard else { return };
        if !membership.clusters_known() {
            return;
        }
        let desired = membership.desired();
        let gone: Vec<ClusterName> = self
            .members
            .keys()
            .filter(|c| !desired.contains(*c))
            .cloned()
            .collect();
        let mut new = Vec::new();
        for cluster in desired {
            if !self.members.contains_key(&cluster) {
                let path = membership.path(&cluster);
                info!(%cluster, workspace = path, quotas = membership.quotas_in(&cluster), "ResourceQuota found: serving the logical cluster");
                let member = Member {
                    workspace: (!path.is_empty()).then(|| path.to_owned()),
                    ..Member::default()
                };
                new.push((cluster, member));
            }
        }
        let changed = !gone.is_empty() || !new.is_empty();
        for cluster in gone {
            self.disengage(&cluster);
        }
        let now = Instant::now();
        for (cluster, member) in new {
            self.discoveries.add(cluster.clone(), now);
            self.members.insert(cluster, member);
        }
        if changed {
            self.metrics.kcp_engaged(self.members.len());
        }
    }

    /// Lets `cluster` go: its watches stop, its discovery and Event series are forgotten; its
    /// quotas stay known (the wildcard watch keeps them) but are neither computed nor written.
    fn disengage(&mut self, cluster: &ClusterName) {
        let workspace = self.members.remove(cluster).and_then(|m| m.workspace);
        info!(%cluster, workspace = workspace.as_deref().unwrap_or_default(), "no ResourceQuota left (or the logical cluster is going): letting it go");
        self.discoveries.remove(cluster);
        let shared = shared_by(self.hub.as_ref());
        let mut out = Vec::new();
        self.watches
            .forget_cluster(&mut self.engine, cluster, &shared, &mut out);
        self.carry_out(out);
        // Its quotas (if the logical cluster is going) are no longer computed: no verdict of
        // theirs stands.
        let prefix = format!("{cluster}|");
        self.stats.forget_quotas(|q| q.starts_with(&prefix));
        self.recorder.forget_cluster(cluster);
        if let Some(hub) = &self.hub {
            hub.withdraw(cluster);
        }
    }

    fn apply_quota(&mut self, quota: &ResourceQuota) {
        let Some(key) = self.quota_key(quota) else {
            warn!(quota = %quota.name_any(), "a wildcard ResourceQuota without the kcp.io/cluster annotation; ignored");
            return;
        };
        if self
            .engine
            .is_older_than_known(&key, quota.metadata.resource_version.as_deref())
        {
            // A write's response or a fresh read is ahead of the watch: this event is in it.
            debug!(quota = %key, resource_version = ?quota.metadata.resource_version, "older than the status held; skipped");
            return;
        }
        let update = self.engine.apply_quota(key.clone(), quota);
        report_spec_problems(&key, &update.problems);
        for problem in &update.problems {
            self.emit(&key, EventType::Warning, "InvalidSpec", &problem.to_string());
        }
        let demand_changed = !update.changes.is_empty();
        self.apply_demand(&update.changes);
        if demand_changed
            && self
                .members
                .get(&key.cluster)
                .is_some_and(|m| !m.unavailable_groups.is_empty())
        {
            self.report_unavailable(&key.cluster);
        }
        if update.recompute {
            self.queue.add(key, Instant::now());
        } else if update.recheck {
            // Someone else changed status.used: check it once the watches have caught up (a
            // burst of admission charges makes one check); meanwhile no key of it is lowered
            // (lazyquota_index::lowering).
            let now_ms = self.now_ms();
            self.engine.note_charge(&key, update.raised, now_ms);
            self.queue.add_at(key, Instant::now() + STATUS_RECHECK_DELAY);
        }
    }

    fn enqueue_all(&mut self) {
        let now = Instant::now();
        let keys: Vec<QuotaKey> = self.engine.index.quotas().map(|(k, _)| k.clone()).collect();
        for key in keys {
            self.queue.add(key, now);
        }
    }

    // ---- discovery -------------------------------------------------------------------------

    /// Starts the discoveries that are due (within [`MAX_DISCOVERIES`] running at once).
    fn start_discoveries(&mut self) {
        for cluster in self.discoveries.start_due(Instant::now()) {
            let client = self.client.clone();
            let route = self.route(&cluster);
            self.discovering.push(
                async move {
                    let result = discover(&client, &route).await;
                    (cluster, result)
                }
                .boxed(),
            );
        }
    }

    /// Where requests for `cluster` go: through the shard's root to the logical cluster on
    /// kcp, straight to the client's cluster otherwise.
    fn route(&self, cluster: &ClusterName) -> Route {
        if self.shard.is_some() {
            Route::cluster(cluster)
        } else {
            Route::direct()
        }
    }

    fn on_discovery(&mut self, cluster: &ClusterName, result: Result<Discovered, kube::Error>) {
        let discovered = match result {
            Ok(d) => d,
            Err(error) => {
                self.metrics.discovery("error");
                warn!(%cluster, %error, "discovery failed; keeping what was known");
                return;
            }
        };
        self.metrics.discovery("ok");
        if let Some(member) = self.members.get_mut(cluster) {
            if !discovered.failed_groups.is_empty() {
                warn!(%cluster, groups = ?discovered.failed_groups, "API groups unavailable; keys computed from them keep their previous values");
            }
            member.unavailable_groups = discovered.failed_groups.iter().cloned().collect();
        }
        let first = !self.engine.resolver.knows(cluster);
        let changes = self
            .engine
            .discovered(cluster, discovered.served, &discovered.failed_groups);
        let mut touched: BTreeSet<GroupResource> = BTreeSet::new();
        for change in changes {
            debug!(?change, "discovery change");
            let (ResolverChange::Served(r) | ResolverChange::Gone(r) | ResolverChange::Changed(r)) = &change;
            if let ResolverChange::Changed(_) | ResolverChange::Gone(_) = change {
                // A version change restarts the watch; a resource that is gone stops it.
                let mut out = Vec::new();
                self.watches.stop_all_of(&mut self.engine, cluster, r, &mut out);
                self.carry_out(out);
            }
            touched.insert(r.clone());
        }
        touched.extend(planner::eager_resources(
            &self.engine,
            &Self::plan_settings(&self.config),
            cluster,
        ));
        let now = Instant::now();
        for resource in &touched {
            self.sync_watches(cluster, resource);
            // A newly served resource gives its quotas an evaluator: compute them now.
            for key in self.engine.index.computing(cluster, resource) {
                self.queue.add(key, now);
            }
        }
        if first {
            // The cluster's quotas were held back until now (see `sync_quota`).
            let keys: Vec<QuotaKey> = self
                .engine
                .index
                .quotas()
                .map(|(k, _)| k)
                .filter(|k| &k.cluster == cluster)
                .cloned()
                .collect();
            for key in keys {
                self.queue.add(key, now);
            }
        }
        self.report_unavailable(cluster);
    }

    /// Tells each quota of `cluster` that names a resource of an unavailable API group, once
    /// per outage, with an Event (and, when the group is back, that it is available again).
    fn report_unavailable(&mut self, cluster: &ClusterName) {
        let Some(member) = self.members.get(cluster) else {
            return;
        };
        let mut now_unavailable = BTreeSet::new();
        for (c, resource) in self.engine.index.demanded() {
            if c == cluster && member.unavailable_groups.contains(&resource.group) {
                for quota in self.engine.index.computing(c, resource) {
                    now_unavailable.insert((quota, resource.clone()));
                }
            }
        }
        let back: Vec<_> = member
            .told_unavailable
            .difference(&now_unavailable)
            .cloned()
            .collect();
        let new: Vec<_> = now_unavailable
            .difference(&member.told_unavailable)
            .cloned()
            .collect();
        for (quota, resource) in &new {
            let note = format!(
                "{}: API group {:?} is unavailable (its APIService does not answer discovery); the key keeps its previous value",
                resource.object_count_name(),
                resource.group
            );
            warn!(quota = %quota, resource = %resource.object_count_name(), "API group unavailable");
            self.emit(quota, EventType::Warning, "ResourceUnavailable", &note);
        }
        for (quota, resource) in &back {
            if self.engine.index.get(quota).is_some() {
                let note = format!(
                    "{}: API group {:?} is available again",
                    resource.object_count_name(),
                    resource.group
                );
                self.emit(quota, EventType::Normal, "ResourceAvailable", &note);
            }
        }
        if let Some(member) = self.members.get_mut(cluster) {
            member.told_unavailable = now_unavailable;
        }
    }

    // ---- demand → watches: the pure watch set decides, this carries out -------------------

    fn apply_demand(&mut self, changes: &[DemandChange]) {
        let touched: BTreeSet<(ClusterName, GroupResource)> = changes
            .iter()
            .map(|c| (c.cluster.clone(), c.resource.clone()))
            .collect();
        for (cluster, resource) in touched {
            self.sync_watches(&cluster, &resource);
        }
    }

    /// The settings the planner takes from this run's configuration.
    fn plan_settings(config: &Config) -> PlanSettings {
        PlanSettings {
            mode: config.mode,
            namespace_watch_threshold: config.namespace_watch_threshold,
            gates: config.gates,
        }
    }

    fn sync_watches(&mut self, cluster: &ClusterName, resource: &GroupResource) {
        let shared = shared_by(self.hub.as_ref());
        let mut out = Vec::new();
        self.watches
            .sync(&mut self.engine, cluster, resource, &shared, &mut out);
        self.carry_out(out);
    }

    /// The hub's shared set changed: watches whose source no longer matches restart from the
    /// other one.
    fn on_shared_changed(&mut self) {
        let shared = shared_by(self.hub.as_ref());
        let mut out = Vec::new();
        self.watches
            .on_shared_changed(&mut self.engine, &shared, &mut out);
        self.carry_out(out);
    }

    fn on_watch_item(&mut self, id: u64, item: WatchItem) {
        if let Some(handle) = self.handles.get(&id) {
            handle.events.inc();
        }
        let mut out = Vec::new();
        self.watches.on_item(&mut self.engine, id, item, now(), &mut out);
        self.carry_out(out);
    }

    fn on_fill(
        &mut self,
        key: &WatchKey,
        namespace: &Arc<str>,
        listed: kube::Result<Vec<(String, Projected)>>,
    ) {
        let shared = shared_by(self.hub.as_ref());
        let mut out = Vec::new();
        let listed = listed.map_err(|e| e.to_string());
        self.watches
            .on_fill(&mut self.engine, key, namespace, listed, &shared, &mut out);
        self.carry_out(out);
    }

    /// Does what the watch set decided.
    fn carry_out(&mut self, actions: Vec<Action>) {
        let now = Instant::now();
        for action in actions {
            match action {
                Action::Start {
                    id,
                    key,
                    served,
                    shared,
                } => self.open_watch(id, &key, &served, shared),
                Action::Restart { id, key, served } => {
                    if let Some(handle) = self.handles.remove(&id) {
                        handle.abort.abort();
                    }
                    info!(watch = %key, "watch failed after its sync: reopened to list afresh");
                    self.open_watch(id, &key, &served, false);
                }
                Action::Stop { id, key } => {
                    if let Some(handle) = self.handles.remove(&id) {
                        handle.abort.abort();
                    }
                    info!(watch = %key, "watch stopped");
                }
                Action::Fill {
                    key,
                    namespace,
                    served,
                } => self.start_fill(key, namespace, served),
                Action::Enqueue(quota) => self.queue.add(quota, now),
                Action::Event {
                    quota,
                    warning,
                    reason,
                    note,
                } => {
                    let type_ = if warning {
                        EventType::Warning
                    } else {
                        EventType::Normal
                    };
                    self.emit(&quota, type_, reason, &note);
                }
                Action::Demand {
                    cluster,
                    resource,
                    count,
                } => {
                    if let Some(hub) = &self.hub {
                        hub.demand(&cluster, &resource, count);
                    }
                }
                Action::Listing(key) => self.metrics.relist(&key.resource_label()),
                Action::Synced(key) => info!(watch = %key, "watch synced"),
                Action::Recovered(key) => info!(watch = %key, "watch recovered"),
                Action::Failing {
                    key,
                    reason,
                    message,
                    new_reason,
                } => {
                    self.metrics.watch_error(&key.resource_label(), reason);
                    if new_reason {
                        warn!(watch = %key, reason, error = %message, "watch failing; until it delivers again, keys computed from it keep the value status.used has");
                    }
                }
                Action::Malformed {
                    key,
                    namespace,
                    name,
                    reason,
                } => {
                    warn!(watch = %key, %namespace, %name, %reason, "object could not be projected; left out of usage");
                }
                Action::FillFailed {
                    key,
                    namespace,
                    error,
                } => {
                    warn!(watch = %key, %namespace, %error, "listing a joining namespace failed; restarting the watch");
                }
            }
        }
    }

    fn open_watch(&mut self, id: u64, key: &WatchKey, served: &ServedResource, shared: bool) {
        let (stream, abort) = match &self.hub {
            Some(hub) if shared => hub.subscribe(served, key, id),
            _ => crate::watch::open(
                &self.client,
                &self.route(&key.cluster),
                served,
                key,
                self.options,
                &self.interner,
                id,
            ),
        };
        info!(watch = %key, version = %served.version, shared, "watch started");
        self.streams.push(stream);
        self.handles.insert(
            id,
            Handle {
                abort,
                events: self.metrics.watch_events(&key.resource_label()),
                started: Instant::now(),
            },
        );
    }

    fn start_fill(&mut self, key: WatchKey, namespace: Arc<str>, served: ServedResource) {
        let (client, gates, interner) = (self.client.clone(), self.config.gates, self.interner.clone());
        let route = self.route(&key.cluster);
        debug!(watch = %key, %namespace, "filling a joining namespace from a list");
        self.fills.push(
            async move {
                let listed = crate::watch::list_namespace(
                    &client, &route, &served, &namespace, key.need, gates, &interner,
                )
                .await;
                (key, namespace, listed)
            }
            .boxed(),
        );
    }

    /// Records an Event on a quota (published by the loop; dropped, with a log line, if too
    /// many are already in flight).
    fn emit(&mut self, quota: &QuotaKey, type_: EventType, reason: &str, note: &str) {
        if self.events.len() >= MAX_PENDING_EVENTS {
            warn!(quota = %quota, reason, "too many Events in flight; dropping one");
            return;
        }
        let uid = self.engine.index.get(quota).and_then(|e| e.payload.uid.clone());
        let workspace = self
            .members
            .get(&quota.cluster)
            .and_then(|m| m.workspace.as_deref());
        let note = event_note(workspace, note);
        let warning = matches!(type_, EventType::Warning);
        let publish = self.recorder.record(quota, uid, warning, reason, note);
        let quota = quota.clone();
        self.events.push(
            async move {
                if let Err(error) = publish.await {
                    warn!(quota = %quota, %error, "recording an Event failed");
                }
            }
            .boxed(),
        );
    }

    // ---- computing and writing status ------------------------------------------------------

    fn start_syncs(&mut self) {
        let now = Instant::now();
        while busy_writes(self.writing.values().copied(), now).0 < self.config.concurrency.max(1) {
            let Some(key) = self.queue.pop_ready(now) else {
                break;
            };
            self.sync_quota(key, now);
        }
    }

    fn sync_quota(&mut self, key: QuotaKey, started: Instant) {
        if !self.engine.resolver.knows(&key.cluster) {
            // Before the first discovery no watch can run, so a status written now would lack
            // every watched key, and quota admission refuses creates while a key of
            // `status.hard` has no `used` ("status unknown"); KCM writes nothing before its
            // informers sync either. The first discovery enqueues every quota.
            self.queue.done(&key);
            return;
        }
        let Some(computed) = self.engine.compute(&key, now()) else {
            self.queue.done(&key);
            return;
        };
        if self.first_list_pending(&key, &computed.unsynced) {
            // Its InitDone enqueues the quota again; writing now would only be overwritten.
            self.queue.done(&key);
            return;
        }
        for error in &computed.scope_errors {
            warn!(quota = %key, %error, "scope matching failed; usage is the partial sum, as upstream");
        }
        let mut decision = computed.decision;
        if let Some(held) = self
            .engine
            .index
            .get(&key)
            .and_then(|e| lowering::hold_lowering(&e.payload, &mut decision, self.now_ms()))
        {
            debug!(quota = %key, keys = ?held.keys, "recent charges added to what is counted");
            self.queue
                .add_at(key.clone(), self.epoch + Duration::from_millis(held.until_ms));
        }
        self.report_withheld(&key, &decision.withheld);
        if self.config.shadow || !decision.dirty {
            let result = if self.config.shadow {
                let unknown: Vec<String> = computed
                    .uncomputed
                    .iter()
                    .chain(&computed.unclaimed)
                    .cloned()
                    .collect();
                self.report_shadow(&key, &decision, &unknown)
            } else {
                "unchanged"
            };
            self.metrics.quota_sync(result, started.elapsed().as_secs_f64());
            self.queue.forget(&key);
            self.queue.done(&key);
            return;
        }
        let (body, precondition) = self
            .engine
            .index
            .get(&key)
            .map(|e| {
                (
                    status_patch(&e.payload, &decision),
                    e.payload.resource_version.clone(),
                )
            })
            .unwrap_or_default();
        let api =
            routed_api::<ResourceQuota>(&self.client, &self.route(&key.cluster), Some(&key.namespace), ());
        let key_of_write = key.clone();
        let write = async move {
            let result = api
                .patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&body))
                .await
                .map(|Routed(written)| written);
            (key, started, precondition, result)
        };
        self.writing.insert(key_of_write, started);
        self.writes.push(write.boxed());
    }

    /// Whether a resource the quota needs is still on its first list (not failing, opened less
    /// than [`FIRST_LIST_GRACE`] ago). Writing then would write a status that the list's end
    /// overwrites a moment later; upstream avoids that by waiting for all its informers.
    fn first_list_pending(&self, key: &QuotaKey, unsynced: &[GroupResource]) -> bool {
        self.watches.first_lists_pending(key, unsynced).any(|id| {
            self.handles
                .get(&id)
                .is_some_and(|h| h.started.elapsed() < FIRST_LIST_GRACE)
        })
    }

    /// Tells a quota, once per change, which of its keys are withheld (log line, Event, and
    /// `lazyquota_withheld_keys`), and when one is computed again.
    fn report_withheld(&mut self, key: &QuotaKey, withheld: &[String]) {
        let quota = key.to_string();
        let before = keys_of(&self.stats.withheld, &quota);
        for name in withheld.iter().filter(|k| !before.contains(k)) {
            warn!(quota = %key, key = %name, "usage unknown: an object carries a quantity beyond what lazyquota holds; the key is withheld from status.used");
            let note = format!(
                "{name}: an object in namespace {} carries a quantity beyond what lazyquota holds exactly (about 1e1224); the key is removed from status.used, so quota admission refuses requests charging it until that object changes (the controller's log names it)",
                key.namespace
            );
            self.emit(key, EventType::Warning, "UsageWithheld", &note);
            self.stats.withheld.insert((quota.clone(), name.clone()));
        }
        for name in before.iter().filter(|k| !withheld.contains(k)) {
            self.stats.withheld.remove(&(quota.clone(), name.clone()));
            self.emit(
                key,
                EventType::Normal,
                "UsageKnown",
                &format!("{name}: computed again"),
            );
        }
    }

    /// Compares our `used` with the stored one, key by key over both; returns the sync
    /// result. A key lazyquota did not compute (not synced, not served, forbidden, withheld,
    /// claimed by no evaluator) is **unknown**, never "agree": the stored value proves nothing
    /// about lazyquota.
    fn report_shadow(
        &mut self,
        key: &QuotaKey,
        decision: &StatusDecision,
        uncomputed: &[String],
    ) -> &'static str {
        let stored = self
            .engine
            .index
            .get(key)
            .and_then(|e| e.payload.status_used.clone())
            .unwrap_or_default();
        let quota = key.to_string();
        self.stats.disagreements.retain(|(q, _), _| q != &quota);
        let unknown: BTreeSet<&String> = uncomputed.iter().chain(&decision.withheld).collect();
        let before = keys_of(&self.stats.shadow_unknown, &quota);
        for name in &before {
            self.stats.shadow_unknown.remove(&(quota.clone(), name.clone()));
        }
        for name in &unknown {
            if !before.contains(*name) {
                info!(quota = %quota, key = %name, "shadow: lazyquota does not compute this key (yet); reported as unknown");
            }
            self.stats.shadow_unknown.insert((quota.clone(), (*name).clone()));
        }
        let mut disagree = false;
        let names: BTreeSet<&String> = decision.used.keys().chain(stored.keys()).collect();
        for name in names.into_iter().filter(|n| !unknown.contains(n)) {
            let (ours, theirs) = (decision.used.get(name), stored.get(name));
            if let (Some(o), Some(t)) = (ours, theirs)
                && same_value(o, t)
            {
                continue;
            }
            disagree = true;
            let show = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
                q.map_or_else(|| "<absent>".to_owned(), |q| q.0.clone())
            };
            let (ours, theirs) = (show(ours), show(theirs));
            warn!(quota = %quota, key = %name, %ours, stored = %theirs, "shadow: status.used disagrees");
            self.stats
                .disagreements
                .insert((quota.clone(), name.clone()), (ours, theirs));
        }
        self.stats
            .shadow_verdicts
            .insert(quota, !disagree && unknown.is_empty());
        if disagree {
            "shadow_disagree"
        } else if unknown.is_empty() {
            "shadow_agree"
        } else {
            "shadow_unknown"
        }
    }

    fn on_write(
        &mut self,
        key: &QuotaKey,
        started: Instant,
        precondition: Option<&str>,
        result: Result<ResourceQuota, kube::Error>,
    ) {
        self.writing.remove(key);
        self.queue.done(key);
        let seconds = started.elapsed().as_secs_f64();
        match result {
            Ok(written) => {
                self.metrics.quota_sync("written", seconds);
                self.metrics.status_write("ok");
                self.queue.forget(key);
                self.engine.record_written(key, precondition, &written);
                debug!(quota = %key, resource_version = ?written.metadata.resource_version, "status written");
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                self.metrics.quota_sync("conflict", seconds);
                self.metrics.status_write("conflict");
                let held = self
                    .engine
                    .index
                    .get(key)
                    .and_then(|e| e.payload.resource_version.clone());
                if held.as_deref() == precondition {
                    // Nothing newer has come yet, and it may have passed already (a response
                    // older than the watch): read the quota afresh, then compute again.
                    debug!(quota = %key, resource_version = ?held, "status write conflicted; reading the quota");
                    self.read_quota(key);
                } else {
                    // The watch brought the newer version meanwhile: compute from it now.
                    debug!(quota = %key, resource_version = ?held, "status write conflicted; the newer version is here");
                    self.queue.add(key.clone(), Instant::now());
                }
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                self.metrics.status_write("not_found");
                self.queue.forget(key);
            }
            Err(kube::Error::Api(status)) if status.code == 422 => {
                // The apiserver refuses the status itself: status.hard copies spec.hard, so a
                // quota that got past validation (an invalid key) cannot be written — upstream
                // fails the same way. Say so on the quota; retry with backoff (an edit of the
                // quota triggers a new computation anyway).
                self.metrics.quota_sync("error", seconds);
                self.metrics.status_write("invalid");
                let delay = self.queue.add_rate_limited(key.clone(), Instant::now());
                warn!(quota = %key, error = %status.message, ?delay, "the apiserver rejected the status as invalid");
                let note = format!("status update rejected as invalid: {}", status.message);
                self.emit(key, EventType::Warning, "StatusRejected", &note);
            }
            Err(error) => {
                self.metrics.quota_sync("error", seconds);
                self.metrics.status_write("error");
                let delay = self.queue.add_rate_limited(key.clone(), Instant::now());
                warn!(quota = %key, %error, ?delay, "status write failed; retrying");
            }
        }
    }

    /// Reads a quota afresh after a conflict (its requests carry the client's deadline).
    fn read_quota(&mut self, key: &QuotaKey) {
        let api =
            routed_api::<ResourceQuota>(&self.client, &self.route(&key.cluster), Some(&key.namespace), ());
        let key = key.clone();
        self.reads.push(
            async move {
                let result = api.get_status(&key.name).await.map(|Routed(quota)| quota);
                (key, result)
            }
            .boxed(),
        );
    }

    fn on_read(&mut self, key: &QuotaKey, result: Result<ResourceQuota, kube::Error>) {
        match result {
            Ok(quota) => {
                let held = self
                    .engine
                    .index
                    .get(key)
                    .and_then(|e| e.payload.resource_version.clone());
                if held == quota.metadata.resource_version {
                    // Nothing newer after all: retry with backoff rather than at once.
                    self.queue.add_rate_limited(key.clone(), Instant::now());
                } else {
                    self.apply_quota(&quota);
                    self.queue.add(key.clone(), Instant::now());
                }
            }
            // Deleted meanwhile: its watch event removes it.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => {
                let delay = self.queue.add_rate_limited(key.clone(), Instant::now());
                warn!(quota = %key, %error, ?delay, "reading the quota after a conflict failed; retrying");
            }
        }
    }

    /// Milliseconds since the controller was built: the pure side's monotonic time.
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    // ---- snapshot --------------------------------------------------------------------------

    /// The state now; gauges are computed here, at scrape time.
    fn snapshot(&mut self) -> Snapshot {
        self.stats.quotas = self.engine.index.len();
        self.stats.watches = self
            .watches
            .iter()
            .map(|(k, r)| WatchInfo {
                key: k.clone(),
                synced: r.synced,
                failure: r.failure.as_ref().map(|(reason, _)| (*reason).to_owned()),
                lists: r.lists,
                id: r.id,
            })
            .collect();
        self.stats.held = self.engine.held_by_resource();
        let mut pending: BTreeMap<String, usize> = BTreeMap::new();
        for (cluster, resource) in self.engine.index.demanded() {
            if self.engine.resolver.knows(cluster) && self.engine.resolver.get(cluster, resource).is_none() {
                *pending.entry(resource.object_count_name()).or_default() +=
                    self.engine.index.computing(cluster, resource).len();
            }
        }
        self.stats.pending = pending.into_iter().collect();
        let unavailable: BTreeSet<&String> = self
            .members
            .values()
            .flat_map(|m| &m.unavailable_groups)
            .collect();
        self.stats.unavailable_groups = unavailable.into_iter().cloned().collect();
        self.stats.quota_usage = if self.config.quota_usage_metrics {
            self.quota_usage()
        } else {
            Vec::new()
        };
        self.stats.clone()
    }
}

impl Controller {
    /// The explain report of every served cluster from this engine (the planner's answer, as
    /// `lazyquota explain` gives it), with each type's open watches and, on kcp, whether the
    /// shard's shared watch or the cluster's own serves it now.
    fn explain(&self) -> Vec<crate::report::Explain> {
        let settings = Self::plan_settings(&self.config);
        let mut reports = Vec::with_capacity(self.members.len());
        for (cluster, member) in &self.members {
            let mut report = crate::report::explain_engine(&self.engine, &settings, cluster, None);
            report.workspace.clone_from(&member.workspace);
            for resource in &mut report.resources {
                let open: Vec<(&WatchKey, &lazyquota_index::watches::Running)> = self
                    .watches
                    .iter()
                    .filter(|(k, _)| &k.cluster == cluster && &k.resource == resource.group_resource())
                    .collect();
                resource.running = open
                    .iter()
                    .map(|(key, running)| {
                        let scope = key.namespace.as_deref().unwrap_or("cluster-wide");
                        let state = match (&running.failure, running.synced) {
                            (Some((reason, _)), _) => format!("failing: {reason}"),
                            (None, true) => "synced".to_owned(),
                            (None, false) => "listing".to_owned(),
                        };
                        let source = if running.shared { "shared" } else { "own" };
                        format!("{scope} ({state}, {source})")
                    })
                    .collect();
                if let Some(hub) = &self.hub
                    && open
                        .iter()
                        .any(|(k, _)| k.need == lazyquota_index::keys::Need::Count)
                {
                    let shared = open.iter().any(|(_, r)| r.shared);
                    resource.source = Some(if shared { "shared" } else { "own" });
                    resource.source_reason = Some(hub.demand_of(resource.group_resource(), shared));
                }
            }
            reports.push(report);
        }
        reports
    }

    /// Every quota key's stored `used` and its `hard`, in units.
    fn quota_usage(&self) -> Vec<QuotaKeyUsage> {
        let units = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
            lazyquota_quota::Quantity::parse_k8s(q).map_or(f64::NAN, |q| q.to_f64())
        };
        let mut out = Vec::new();
        for (key, entry) in self.engine.index.quotas() {
            let state = &entry.payload;
            for (resource, hard) in state.spec_hard.iter().flatten() {
                let used = state
                    .status_used
                    .as_ref()
                    .and_then(|u| u.get(resource))
                    .map(units);
                out.push(QuotaKeyUsage {
                    cluster: key.cluster.to_string(),
                    namespace: key.namespace.to_string(),
                    quota: key.name.to_string(),
                    resource: resource.clone(),
                    used,
                    hard: units(hard),
                });
            }
        }
        out
    }
}

/// The status write: a JSON merge patch of `status.hard` and `status.used` — the keys computed
/// now, and `null` for every key the quota's status had that is no longer there — guarded by
/// the resourceVersion last seen (a precondition: 409 if the quota changed meanwhile).
///
/// Not a PUT of the status subresource with a body of our own: ResourceQuota's status strategy
/// keeps only the old `spec`, so a PUT whose metadata lacks the quota's labels and annotations
/// removes them (lazyquota keeps neither). That wiped `helm.sh` ownership annotations and kcp's
/// `experimental.quota.kcp.io/cluster-scoped` before this patch.
fn status_patch(state: &lazyquota_index::engine::QuotaState, decision: &StatusDecision) -> serde_json::Value {
    fn merged(
        now: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        before: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    ) -> serde_json::Map<String, serde_json::Value> {
        let mut out: serde_json::Map<String, serde_json::Value> = now
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.0.clone())))
            .collect();
        for gone in before.into_iter().flat_map(BTreeMap::keys) {
            out.entry(gone.clone()).or_insert(serde_json::Value::Null);
        }
        out
    }
    let mut patch = serde_json::json!({
        "status": {
            "hard": merged(&decision.hard, state.status_hard.as_ref()),
            "used": merged(&decision.used, state.status_used.as_ref()),
        }
    });
    if let Some(rv) = &state.resource_version {
        patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    }
    patch
}

/// Whether the kcp hub (if any) serves a type from its shared watch now: the watch set's view
/// of the hub.
fn shared_by(hub: Option<&crate::hub::Hub>) -> impl Fn(&GroupResource) -> bool + Copy + '_ {
    move |r| hub.is_some_and(|h| h.is_shared(r))
}

fn report_spec_problems(key: &QuotaKey, problems: &[lazyquota_quota::SpecProblem]) {
    for problem in problems {
        warn!(quota = %key, %problem, "quota spec problem; other keys and quotas are unaffected");
    }
}

fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_hours(8760)
}

/// The next item of an optional stream (never, without one).
async fn next_of<S: futures::Stream + Unpin>(stream: Option<&mut S>) -> Option<S::Item> {
    match stream {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

/// One item per change of what a cluster may serve: CRDs and APIServices on Kubernetes; CRDs
/// and APIBindings in kcp logical clusters (metadata-only watches: only the fact of a change
/// matters, discovery reads the rest). Under the wildcard route each item names the logical
/// cluster of the changed object; `None` means every served cluster (a change on Kubernetes,
/// or a relist of the watch, after which any change may have been missed).
fn api_change_stream(
    client: &Client,
    route: &Route,
    kcp: bool,
    metrics: &Metrics,
) -> BoxStream<'static, Option<ClusterName>> {
    /// Passes on changes; a failure is a log line and `lazyquota_watch_errors_total` (the
    /// watcher retries with backoff; discovery keeps its last answer meanwhile).
    fn changed<K: kube::Resource>(
        resource: &'static str,
        wildcard: bool,
        metrics: Metrics,
    ) -> impl FnMut(Result<watcher::Event<K>, watcher::Error>) -> futures::future::Ready<Option<Option<ClusterName>>>
    {
        move |event| {
            let of = |o: &K| if wildcard { members::cluster_of(o) } else { None };
            let changed = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => Some(of(&o)),
                Ok(watcher::Event::InitDone) => Some(None),
                Ok(_) => None,
                Err(error) => {
                    let reason = crate::watch::failure_reason(&error);
                    warn!(resource, reason, %error, "watch of API changes failed; retrying (discovery keeps its last answer)");
                    metrics.watch_error(resource, reason);
                    None
                }
            };
            futures::future::ready(changed)
        }
    }
    let wildcard = route == &Route::wildcard();
    let watch = |resource: kube::api::ApiResource| {
        watcher(
            routed_api::<PartialObjectMeta<DynamicObject>>(client, route, None, resource),
            watcher::Config::default(),
        )
        .default_backoff()
    };
    let crds = watch(kube::api::ApiResource::erase::<CustomResourceDefinition>(&())).filter_map(changed(
        "customresourcedefinitions.apiextensions.k8s.io",
        wildcard,
        metrics.clone(),
    ));
    let other = if kcp {
        let bindings = kube::api::ApiResource {
            group: "apis.kcp.io".into(),
            version: "v1alpha1".into(),
            api_version: "apis.kcp.io/v1alpha1".into(),
            kind: "APIBinding".into(),
            plural: "apibindings".into(),
        };
        watch(bindings)
            .filter_map(changed("apibindings.apis.kcp.io", wildcard, metrics.clone()))
            .boxed()
    } else {
        watch(kube::api::ApiResource::erase::<APIService>(&()))
            .filter_map(changed(
                "apiservices.apiregistration.k8s.io",
                wildcard,
                metrics.clone(),
            ))
            .boxed()
    };
    futures::stream::select(crds, other).boxed()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{MAX_NOTE_BYTES, WRITE_STALL, busy_writes, event_note, truncate};

    #[test]
    fn a_hung_status_write_stops_counting_against_the_concurrency() {
        let hung = Instant::now();
        let fresh = hung + WRITE_STALL + Duration::from_secs(1);
        let now = fresh + Duration::from_secs(1);
        assert_eq!(busy_writes([fresh, fresh].into_iter(), now).0, 2);
        let (busy, next) = busy_writes([hung, hung, hung, hung, hung, fresh].into_iter(), now);
        assert_eq!(busy, 1, "five hung writes leave four of five slots free");
        assert_eq!(
            next,
            Some(fresh + WRITE_STALL),
            "the loop wakes when the fresh one stalls"
        );
        assert_eq!(busy_writes(std::iter::empty(), now), (0, None));
    }

    #[test]
    fn kcp_event_notes_start_with_the_workspace_path_and_still_fit() {
        assert_eq!(event_note(None, "x"), "x");
        assert_eq!(
            event_note(Some("root:org:team"), "x"),
            "[workspace root:org:team] x"
        );
        let long = event_note(Some("root:org:team"), &"y".repeat(5000));
        assert!(long.starts_with("[workspace root:org:team] ") && long.len() <= MAX_NOTE_BYTES);
    }

    #[test]
    fn event_notes_fit_the_api_limit_on_a_char_boundary() {
        let long = "é".repeat(2000);
        let cut = truncate(&long, 1000);
        assert!(cut.len() <= 1000 && cut.ends_with('…'), "{}", cut.len());
        assert_eq!(truncate("short", 1000), "short");
    }
}
