//! The controller: one task that drives the pure [`Engine`] and the work queue.
//!
//! ```text
//!  ResourceQuota watch ─► Engine.apply_quota ─► demand changes ─► watch set (start / stop)
//!  CRD/APIService watch ─► discovery ─► Engine.discovered ─────────┘        │
//!  object watches (one SelectAll, polled by this task) ─► Engine stores ─► replenish ─► WorkQueue
//!  WorkQueue ─► Engine.compute ─► status PUT (bounded concurrency) or shadow report
//! ```
//!
//! Everything mutable lives in [`Controller`] and is touched only by its `run` loop: no locks.
//! The only other tasks are hyper's, one per open connection. Metrics and readiness ask the
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
    api::core::v1::{ObjectReference, ResourceQuota},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
};
use kube::{
    Api, Client, ResourceExt as _,
    api::{PartialObjectMeta, Patch, PatchParams},
    runtime::{
        WatchStreamExt as _,
        events::{Event, EventType, Recorder, Reporter},
        watcher,
    },
};
use lazyquota_index::{
    demand::is_cluster_wide,
    engine::{Applied, Engine, Projected, StoreKind, same_value, store_kind},
    keys::{ALL_NAMESPACES, ClusterName, GroupResource, Need, QuotaKey},
    planner::{self, Plan, PlanSettings},
    policy::DemandChange,
    queue::WorkQueue,
    resolver::ResolverChange,
    store::PartitionKey,
};
use lazyquota_quota::{FeatureGates, Interner, StatusDecision};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

pub use crate::snapshot::{QuotaKeyUsage, Snapshot, SnapshotHandle, WatchInfo};
use crate::{
    discovery::{Discovered, discover},
    metrics::Metrics,
    now, object_id,
    watch::{ObjectEvent, WatchItem, WatchKey, WatchOptions},
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
            resync_period: Duration::from_secs(300),
            concurrency: 5,
            shadow: false,
            namespace_watch_threshold: 8,
            discovery_poll: Duration::from_secs(300),
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

/// Namespace fills (lists of one namespace joining a cluster-wide watch) running at once.
const MAX_FILLS: usize = 8;

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

/// One open watch.
#[allow(clippy::struct_excessive_bools)] // independent facts about one watch
struct Running {
    id: u64,
    abort: AbortHandle,
    /// Namespaces whose partitions this watch fills (lazy mode).
    namespaces: BTreeSet<Arc<str>>,
    /// Eager mode: every namespace's objects are held.
    hold_all: bool,
    synced: bool,
    relisting: bool,
    /// The last failure, until the next successful list.
    failure: Option<(&'static str, String)>,
    /// This watch's event counter (cached: one atomic add per event).
    events: prometheus::IntCounter,
    /// When it was opened.
    started: Instant,
    /// Lists (initial and relists) it has started.
    lists: u32,
    /// Served by the kcp hub's shared wildcard watch (not a watch of its own).
    shared: bool,
}

type WriteResult = (QuotaKey, Instant, Result<ResourceQuota, kube::Error>);
type FillResult = (WatchKey, Arc<str>, kube::Result<Vec<(String, Projected)>>);

/// The controller.
pub struct Controller {
    client: Client,
    config: Config,
    options: WatchOptions,
    interner: Arc<Interner>,
    engine: Engine,
    watches: BTreeMap<WatchKey, Running>,
    by_id: HashMap<u64, WatchKey>,
    streams: SelectAll<BoxStream<'static, (u64, WatchItem)>>,
    next_id: u64,
    queue: WorkQueue<QuotaKey>,
    writes: FuturesUnordered<BoxFuture<'static, WriteResult>>,
    /// When each status write in flight started (one per quota at most: the queue does not
    /// hand out a quota being written).
    writing: HashMap<QuotaKey, Instant>,
    stats: Snapshot,
    metrics: Metrics,
    recorder: Recorder,
    /// Lists filling namespaces that joined a cluster-wide watch (polled by the loop; at most
    /// [`MAX_FILLS`] at once).
    fills: FuturesUnordered<BoxFuture<'static, FillResult>>,
    /// Fills waiting for a free slot (one entry per demanded watch and namespace at most).
    fill_queue: std::collections::VecDeque<(WatchKey, Arc<str>)>,
    /// Events being published (polled by the loop; at most [`MAX_PENDING_EVENTS`]).
    events: FuturesUnordered<BoxFuture<'static, ()>>,
    requests: mpsc::Receiver<oneshot::Sender<Snapshot>>,
    /// API groups the last discovery found unavailable (an APIService that does not answer).
    unavailable_groups: BTreeSet<String>,
    /// (quota, resource) pairs already told, by an Event, that their API group is unavailable.
    told_unavailable: BTreeSet<(QuotaKey, GroupResource)>,
    /// kcp: the shard's shared wildcard watches.
    hub: Option<crate::hub::Hub>,
}

impl Controller {
    /// A controller for `client`'s cluster, counting into `metrics`, and the handle to ask
    /// it for snapshots.
    pub fn new(client: Client, config: Config, metrics: Metrics) -> (Self, SnapshotHandle) {
        let (tx, requests) = mpsc::channel(16);
        let options = WatchOptions {
            streaming_lists: config.streaming_lists.unwrap_or(false),
            gates: config.gates,
        };
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "lazyquota".into(),
                instance: Some(config.instance.clone()),
            },
        );
        let controller = Self {
            recorder,
            fills: FuturesUnordered::new(),
            fill_queue: std::collections::VecDeque::new(),
            events: FuturesUnordered::new(),
            client,
            options,
            interner: Arc::new(Interner::new()),
            engine: if config.kcp {
                Engine::new(config.gates).with_kcp_semantics()
            } else {
                Engine::new(config.gates)
            },
            watches: BTreeMap::new(),
            by_id: HashMap::new(),
            streams: SelectAll::new(),
            next_id: 0,
            queue: WorkQueue::new(),
            writes: FuturesUnordered::new(),
            writing: HashMap::new(),
            stats: Snapshot::default(),
            metrics,
            requests,
            config,
            unavailable_groups: BTreeSet::new(),
            told_unavailable: BTreeSet::new(),
            hub: None,
        };
        (controller, SnapshotHandle::new(tx))
    }

    /// kcp: count-only watches of types the shard's hub shares come from its shared wildcard
    /// watch instead of a watch of their own.
    #[must_use]
    pub fn with_hub(mut self, hub: crate::hub::Hub) -> Self {
        self.hub = Some(hub);
        self
    }

    /// Runs until `shutdown` completes; then stops all watches and waits (at most 10 s) for
    /// the status writes in flight.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        if self.config.streaming_lists.is_none() {
            self.options.streaming_lists = crate::watch::probe_streaming_lists(&self.client).await;
        }
        self.stats.streaming_lists = self.options.streaming_lists;
        self.stats.cluster = self.config.cluster.to_string();
        info!(streaming_lists = self.options.streaming_lists, mode = ?self.config.mode, shadow = self.config.shadow, "controller starting");

        let mut quota_events = watcher(
            Api::<ResourceQuota>::all(self.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .boxed();
        let mut api_changes = api_change_stream(&self.client, self.config.kcp, &self.metrics);
        let mut quota_relist: Option<Vec<ResourceQuota>> = None;
        let mut discovery = Some(discover_owned(self.client.clone()));
        let mut next_discovery = tokio::time::Instant::now() + self.config.discovery_poll;
        // After a CRD or APIService change, discovery runs again a few times: a new CRD is
        // served a moment after its object appears.
        let mut discovery_retries: Vec<tokio::time::Instant> = Vec::new();
        let mut shared_changes = self.hub.as_ref().map(crate::hub::Hub::changes);
        let resync = (!self.config.resync_period.is_zero()).then_some(self.config.resync_period);
        let mut next_resync = resync.map(|p| tokio::time::Instant::now() + p);
        let mut shutdown = std::pin::pin!(shutdown);

        let outcome = loop {
            let queue_ready = self.queue.next_ready().map(tokio::time::Instant::from_std);
            let (busy, next_stall) = busy_writes(self.writing.values().copied(), Instant::now());
            let can_start = busy < self.config.concurrency.max(1);
            let next_retry = discovery_retries.iter().min().copied();
            tokio::select! {
                () = &mut shutdown => break Ok(()),
                event = quota_events.next() => match event {
                    Some(Ok(event)) => self.on_quota_event(event, &mut quota_relist),
                    Some(Err(error)) => warn!(%error, "ResourceQuota watch failed; retrying"),
                    None => break Err(Error::QuotaWatchEnded),
                },
                Some((id, item)) = self.streams.next(), if !self.streams.is_empty() => self.on_watch_item(id, item),
                Ok(()) = async {
                    match shared_changes.as_mut() {
                        Some(changes) => changes.changed().await,
                        None => std::future::pending().await,
                    }
                } => self.on_shared_changed(),
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
                // A write in flight becomes stalled: its slot is free for another quota.
                () = tokio::time::sleep_until(next_stall.map_or_else(far_future, tokio::time::Instant::from_std)), if !can_start && next_stall.is_some() => {}
                () = tokio::time::sleep_until(queue_ready.unwrap_or_else(far_future)), if queue_ready.is_some() && can_start => {
                    self.start_syncs();
                }
                Some((key, started, result)) = self.writes.next(), if !self.writes.is_empty() => {
                    self.on_write(&key, started, result);
                }
                Some(()) = self.events.next(), if !self.events.is_empty() => {}
                Some((key, namespace, listed)) = self.fills.next(), if !self.fills.is_empty() => {
                    self.on_fill(&key, &namespace, listed);
                    while self.fills.len() < MAX_FILLS {
                        let Some((key, namespace)) = self.fill_queue.pop_front() else { break };
                        self.start_fill(key, namespace);
                    }
                }
                Some(reply) = self.requests.recv() => {
                    let _ = reply.send(self.snapshot());
                }
            }
        };

        info!(
            in_flight = self.writes.len(),
            "stopping watches, finishing status writes"
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
        outcome
    }

    // ---- quotas ----------------------------------------------------------------------------

    fn quota_key(&self, quota: &ResourceQuota) -> QuotaKey {
        QuotaKey::new(
            &self.config.cluster,
            &quota.namespace().unwrap_or_default(),
            &quota.name_any(),
        )
    }

    fn on_quota_event(
        &mut self,
        event: watcher::Event<ResourceQuota>,
        relist: &mut Option<Vec<ResourceQuota>>,
    ) {
        match event {
            watcher::Event::Init => *relist = Some(Vec::new()),
            watcher::Event::InitApply(quota) => match relist {
                Some(list) => list.push(quota),
                None => self.apply_quota(&quota),
            },
            watcher::Event::InitDone => {
                let quotas = relist.take().unwrap_or_default();
                let keyed: Vec<(QuotaKey, &ResourceQuota)> =
                    quotas.iter().map(|q| (self.quota_key(q), q)).collect();
                let cluster = self.config.cluster.clone();
                let changes = self.engine.reset_quotas(&cluster, keyed);
                for (key, entry) in self.engine.index.quotas() {
                    report_spec_problems(key, &entry.payload.spec.problems);
                }
                self.apply_demand(&changes);
                self.stats.quotas_synced = true;
                // Like upstream's first enqueueAll: every quota is computed once at start.
                self.enqueue_all();
                info!(quotas = self.engine.index.len(), "ResourceQuotas listed");
            }
            watcher::Event::Apply(quota) => {
                debug!(quota = %self.quota_key(&quota), resource_version = ?quota.metadata.resource_version, "quota event");
                self.apply_quota(&quota);
            }
            watcher::Event::Delete(quota) => {
                let key = self.quota_key(&quota);
                let changes = self.engine.delete_quota(&key);
                self.queue.remove(&key);
                let name = key.to_string();
                self.stats.disagreements.retain(|(q, _), _| q != &name);
                self.stats.withheld.retain(|(q, _)| q != &name);
                self.stats.shadow_unknown.retain(|(q, _)| q != &name);
                self.stats.shadow_verdicts.remove(&name);
                self.apply_demand(&changes);
                debug!(quota = %key, "quota deleted");
            }
        }
    }

    fn apply_quota(&mut self, quota: &ResourceQuota) {
        let key = self.quota_key(quota);
        let update = self.engine.apply_quota(key.clone(), quota);
        report_spec_problems(&key, &update.problems);
        for problem in &update.problems {
            self.emit(&key, EventType::Warning, "InvalidSpec", &problem.to_string());
        }
        let demand_changed = !update.changes.is_empty();
        self.apply_demand(&update.changes);
        if update.recompute {
            self.queue.add(key, Instant::now());
        } else if update.recheck {
            // Someone else changed status.used: check it once the watches have caught up (a
            // burst of admission charges makes one check).
            self.queue.add_at(key, Instant::now() + STATUS_RECHECK_DELAY);
        }
        if demand_changed && !self.unavailable_groups.is_empty() {
            self.report_unavailable();
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

    fn on_discovery(&mut self, result: Result<Discovered, kube::Error>) {
        let cluster = self.config.cluster.clone();
        let discovered = match result {
            Ok(d) => d,
            Err(error) => {
                self.metrics.discovery("error");
                warn!(%error, "discovery failed; keeping what was known");
                return;
            }
        };
        self.metrics.discovery("ok");
        if discovered.failed_groups.is_empty() {
            self.unavailable_groups.clear();
        } else {
            warn!(groups = ?discovered.failed_groups, "API groups unavailable; keys computed from them keep their previous values");
            self.unavailable_groups = discovered.failed_groups.iter().cloned().collect();
        }
        let changes = self
            .engine
            .discovered(&cluster, discovered.served, &discovered.failed_groups);
        let mut touched: BTreeSet<GroupResource> = BTreeSet::new();
        for change in changes {
            debug!(?change, "discovery change");
            let (ResolverChange::Served(r) | ResolverChange::Gone(r) | ResolverChange::Changed(r)) = &change;
            if let ResolverChange::Changed(_) | ResolverChange::Gone(_) = change {
                // A version change restarts the watch; a resource that is gone stops it.
                self.stop_watches_of(&cluster, r);
            }
            touched.insert(r.clone());
        }
        touched.extend(planner::eager_resources(
            &self.engine,
            &self.plan_settings(),
            &cluster,
        ));
        let now = Instant::now();
        for resource in &touched {
            self.sync_watches(&cluster, resource);
            // A newly served resource gives its quotas an evaluator: compute them now.
            for key in self.engine.index.computing(&cluster, resource) {
                self.queue.add(key, now);
            }
        }
        self.report_unavailable();
    }

    /// Tells each quota that names a resource of an unavailable API group, once per outage,
    /// with an Event (and, when the group is back, that it is available again).
    fn report_unavailable(&mut self) {
        let cluster = self.config.cluster.clone();
        let mut now_unavailable = BTreeSet::new();
        for (c, resource) in self.engine.index.demanded() {
            if c == &cluster && self.unavailable_groups.contains(&resource.group) {
                for quota in self.engine.index.computing(c, resource) {
                    now_unavailable.insert((quota, resource.clone()));
                }
            }
        }
        let back: Vec<_> = self
            .told_unavailable
            .difference(&now_unavailable)
            .cloned()
            .collect();
        let new: Vec<_> = now_unavailable
            .difference(&self.told_unavailable)
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
        self.told_unavailable = now_unavailable;
    }

    // ---- demand → watches ------------------------------------------------------------------

    fn apply_demand(&mut self, changes: &[DemandChange]) {
        let touched: BTreeSet<(ClusterName, GroupResource)> = changes
            .iter()
            .map(|c| (c.cluster.clone(), c.resource.clone()))
            .collect();
        for (cluster, resource) in touched {
            self.sync_watches(&cluster, &resource);
        }
    }

    /// The watches (cluster, resource) should have now, with the namespaces each fills: the
    /// planner's answer for this run's settings.
    fn desired_watches(&self, cluster: &ClusterName, resource: &GroupResource) -> Plan {
        planner::desired_watches(&self.engine, &self.plan_settings(), cluster, resource)
    }

    /// The settings the planner takes from this run's configuration.
    fn plan_settings(&self) -> PlanSettings {
        PlanSettings {
            mode: self.config.mode,
            namespace_watch_threshold: self.config.namespace_watch_threshold,
            gates: self.config.gates,
        }
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
            let Some(namespaces) = desired.get(&key) else {
                self.stop_watch(&key);
                continue;
            };
            let running = self.watches.get_mut(&key).expect("listed above");
            if running.hold_all {
                continue;
            }
            let added: Vec<Arc<str>> = namespaces.difference(&running.namespaces).cloned().collect();
            let removed: Vec<Arc<str>> = running.namespaces.difference(namespaces).cloned().collect();
            if added.iter().chain(&removed).any(|ns| &**ns == ALL_NAMESPACES) {
                // Every namespace joins (or leaves) at once: a relist, not a fill per namespace.
                self.stop_watch(&key);
                continue;
            }
            for ns in &removed {
                running.namespaces.remove(ns);
            }
            running.namespaces.extend(added.iter().cloned());
            let kind = store_kind(&key.resource, key.need);
            for ns in removed {
                self.engine.release(kind, &partition(&key, &ns));
            }
            let cluster_scoped_resource = !self
                .engine
                .resolver
                .get(cluster, resource)
                .is_some_and(|s| s.namespaced);
            for ns in added {
                if cluster_scoped_resource {
                    // A namespace holds no cluster-scoped object: nothing to list.
                    let p = partition(&key, &ns);
                    self.engine.begin_fill(kind, p.clone());
                    self.engine.finish_fill(kind, &p, Vec::new());
                    continue;
                }
                // A namespace joining a cluster-wide watch is filled by a list of its own; the
                // shared watch keeps running (no relist of the whole resource).
                self.engine.begin_fill(kind, partition(&key, &ns));
                self.start_fill(key.clone(), ns);
            }
        }
        if let Some(hub) = &self.hub {
            hub.demand(cluster, resource, desired.keys().any(|k| k.need == Need::Count));
        }
        for (key, namespaces) in desired {
            if !self.watches.contains_key(&key) {
                self.start_watch(key, namespaces);
            }
        }
    }

    fn start_fill(&mut self, key: WatchKey, namespace: Arc<str>) {
        if self.fills.len() >= MAX_FILLS {
            // A burst of namespaces joining (a new quota in each of 1,000) lists a few at a
            // time; a queued fill no longer demanded when its turn comes is dropped on arrival.
            if !self.fill_queue.iter().any(|(k, n)| k == &key && n == &namespace) {
                self.fill_queue.push_back((key, namespace));
            }
            return;
        }
        let Some(served) = self.engine.resolver.get(&key.cluster, &key.resource).cloned() else {
            return;
        };
        let (client, gates, interner) = (self.client.clone(), self.config.gates, self.interner.clone());
        debug!(watch = %key, %namespace, "filling a joining namespace from a list");
        self.fills.push(
            async move {
                let listed =
                    crate::watch::list_namespace(&client, &served, &namespace, key.need, gates, &interner)
                        .await;
                (key, namespace, listed)
            }
            .boxed(),
        );
    }

    fn on_fill(
        &mut self,
        key: &WatchKey,
        namespace: &Arc<str>,
        listed: kube::Result<Vec<(String, Projected)>>,
    ) {
        let Some(running) = self.watches.get(key) else {
            return;
        }; // stopped meanwhile
        if !running.namespaces.contains(namespace) {
            return; // no longer demanded
        }
        let kind = store_kind(&key.resource, key.need);
        let p = partition(key, namespace);
        match listed {
            Ok(objects) => {
                let objects = objects
                    .into_iter()
                    .map(|(name, o)| (object_id(&name), o))
                    .collect();
                if let Some(malformed) = self.engine.finish_fill(kind, &p, objects) {
                    for reason in malformed {
                        warn!(watch = %key, %namespace, %reason, "object could not be projected; left out of usage");
                    }
                    let now = Instant::now();
                    for quota in self.engine.index.computing(&key.cluster, &key.resource) {
                        let demand_ns = self
                            .engine
                            .index
                            .get(&quota)
                            .map(|e| e.demand_namespace().clone());
                        if demand_ns.as_ref() == Some(namespace) {
                            self.queue.add(quota, now);
                        }
                    }
                }
            }
            Err(error) => {
                // Fall back to the exact, heavier path: relist the whole resource.
                warn!(watch = %key, %namespace, %error, "listing a joining namespace failed; restarting the watch");
                self.stop_watch(key);
                let (cluster, resource) = (key.cluster.clone(), key.resource.clone());
                self.sync_watches(&cluster, &resource);
            }
        }
    }

    fn start_watch(&mut self, key: WatchKey, namespaces: BTreeSet<Arc<str>>) {
        let Some(served) = self.engine.resolver.get(&key.cluster, &key.resource).cloned() else {
            return;
        };
        self.next_id += 1;
        let id = self.next_id;
        let shared = key.need == Need::Count && self.hub.as_ref().is_some_and(|h| h.is_shared(&key.resource));
        let (stream, abort) = match &self.hub {
            Some(hub) if shared => hub.subscribe(&served, &key, id),
            _ => crate::watch::open(&self.client, &served, &key, self.options, &self.interner, id),
        };
        let kind = store_kind(&key.resource, key.need);
        for ns in &namespaces {
            self.engine.hold(kind, partition(&key, ns));
        }
        info!(watch = %key, version = %served.version, shared, "watch started");
        self.streams.push(stream);
        self.by_id.insert(id, key.clone());
        let hold_all = self.config.mode == Mode::Eager && !is_cluster_wide(&key.resource);
        let key_label = key.resource_label();
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
                events: self.metrics.watch_events(&key_label),
                started: Instant::now(),
                lists: 0,
                shared,
            },
        );
    }

    /// The hub's shared set changed: watches whose source no longer matches restart from the
    /// other one (a relist, from this controller's view).
    fn on_shared_changed(&mut self) {
        let Some(hub) = self.hub.clone() else { return };
        let moved: BTreeSet<(ClusterName, GroupResource)> = self
            .watches
            .iter()
            .filter(|(k, r)| k.need == Need::Count && r.shared != hub.is_shared(&k.resource))
            .map(|(k, _)| (k.cluster.clone(), k.resource.clone()))
            .collect();
        for (cluster, resource) in moved {
            info!(resource = %resource.object_count_name(), shared = hub.is_shared(&resource), "switching the watch source");
            self.stop_watches_of(&cluster, &resource);
            self.sync_watches(&cluster, &resource);
        }
    }

    fn stop_watch(&mut self, key: &WatchKey) {
        let Some(running) = self.watches.remove(key) else {
            return;
        };
        running.abort.abort();
        self.by_id.remove(&running.id);
        let kind = store_kind(&key.resource, key.need);
        for p in self.partitions_of(key, &running) {
            self.engine.release(kind, &p);
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

    /// The partitions a watch fills (eager watches: every one held for its resource).
    fn partitions_of(&self, key: &WatchKey, running: &Running) -> Vec<PartitionKey> {
        if running.hold_all {
            self.engine
                .held_namespaces(store_kind(&key.resource, key.need), &key.cluster, &key.resource)
        } else {
            running.namespaces.iter().map(|ns| partition(key, ns)).collect()
        }
    }

    // ---- watch events ----------------------------------------------------------------------

    fn on_watch_item(&mut self, id: u64, item: WatchItem) {
        let Some(key) = self.by_id.get(&id).cloned() else {
            return;
        }; // a stopped watch's last item
        let Some(running) = self.watches.get(&key) else {
            return;
        };
        let kind = store_kind(&key.resource, key.need);
        running.events.inc();
        if matches!(item, WatchItem::Apply(_) | WatchItem::Delete(_)) && running.failure.is_some() {
            // The watch resumed where it broke off (no relist): an event proves it.
            self.recovered(&key);
        }
        let Some(running) = self.watches.get(&key) else {
            return;
        };
        match item {
            WatchItem::Init => {
                self.metrics.relist(&key.resource_label());
                for p in self.partitions_of(&key, running) {
                    self.engine.begin_relist(kind, &p);
                }
                let running = self.watches.get_mut(&key).expect("present");
                running.relisting = true;
                running.lists += 1;
            }
            WatchItem::InitApply(ObjectEvent {
                namespace,
                name,
                object,
            }) => {
                for (p, id, object) in self.targets(&key, &namespace, &name, object) {
                    if self.ensure_held(&key, kind, &p)
                        && let Some(reason) = self.engine.relist_apply(kind, &p, id, object)
                    {
                        warn!(watch = %key, %namespace, %name, %reason, "object could not be projected; left out of usage");
                    }
                }
            }
            WatchItem::InitDone => {
                let partitions = self.partitions_of(&key, running);
                for p in &partitions {
                    self.engine.finish_relist(kind, p);
                }
                let running = self.watches.get_mut(&key).expect("present");
                let first = !running.synced;
                running.synced = true;
                running.relisting = false;
                if running.failure.is_some() {
                    self.recovered(&key);
                } else if first {
                    info!(watch = %key, "watch synced");
                }
                // A newly synced (or relisted) resource: its quotas can be computed now.
                let now = Instant::now();
                for quota in self.quotas_served_by(&key) {
                    self.queue.add(quota, now);
                }
            }
            WatchItem::Apply(ObjectEvent {
                namespace,
                name,
                object,
            }) => {
                for (p, id, object) in self.targets(&key, &namespace, &name, object) {
                    if !self.ensure_held(&key, kind, &p) {
                        continue; // another namespace's object on a cluster-wide watch: dropped at ingest
                    }
                    match self.engine.apply(kind, &p, id, object, now()) {
                        Applied::Replenish => self.replenish(&key, &p.namespace),
                        Applied::Malformed(reason) => {
                            warn!(watch = %key, %namespace, %name, %reason, "object could not be projected; left out of usage");
                        }
                        Applied::Stored | Applied::NotHeld => {}
                    }
                }
            }
            WatchItem::Delete(ObjectEvent {
                namespace,
                name,
                object,
            }) => {
                for (p, id, _) in self.targets(&key, &namespace, &name, object) {
                    if self.engine.delete(kind, &p, id) == Applied::Replenish {
                        self.replenish(&key, &p.namespace);
                    }
                }
            }
            WatchItem::Failed(reason, message) => {
                self.metrics.watch_error(&key.resource_label(), reason);
                let running = self.watches.get_mut(&key).expect("present");
                let first_failure = running.failure.is_none() && !running.synced;
                let new_reason = running.failure.as_ref().is_none_or(|(r, _)| *r != reason);
                running.failure = Some((reason, message.clone()));
                if new_reason {
                    // Only the keys computed from this resource keep their previous values;
                    // every other quota and key stays current.
                    warn!(watch = %key, reason, error = %message, "watch failing; keys computed from it keep their previous values");
                    let note = format!(
                        "cannot watch {} ({reason}): {message}; keys computed from it keep their previous values",
                        key.resource_label()
                    );
                    self.emit_for_resource(&key, EventType::Warning, "ResourceUnavailable", &note);
                }
                if first_failure {
                    // Quotas held back for this watch's first list are written now.
                    let now = Instant::now();
                    for quota in self.quotas_served_by(&key) {
                        self.queue.add(quota, now);
                    }
                }
            }
        }
    }

    /// The partitions an object of a watch goes to, each with the object's id there: its
    /// namespace's and, while some kcp cluster-scoped quota demands every namespace, the
    /// all-namespaces partition (where `<namespace>/<name>` identifies it). Held or not is the
    /// caller's check.
    fn targets(
        &self,
        key: &WatchKey,
        namespace: &str,
        name: &str,
        object: Projected,
    ) -> Vec<(PartitionKey, u64, Projected)> {
        let everywhere = self
            .watches
            .get(key)
            .is_some_and(|r| r.namespaces.contains(ALL_NAMESPACES));
        if !everywhere {
            return vec![(partition(key, namespace), object_id(name), object)];
        }
        let all = (
            partition(key, ALL_NAMESPACES),
            object_id(&format!("{namespace}/{name}")),
        );
        if self
            .watches
            .get(key)
            .is_some_and(|r| r.namespaces.contains(namespace))
        {
            // Also demanded in its own namespace (a second quota there): kept twice, once per
            // partition (8 bytes for a count, a second projection for a typed object).
            vec![
                (partition(key, namespace), object_id(name), object.clone()),
                (all.0, all.1, object),
            ]
        } else {
            vec![(all.0, all.1, object)]
        }
    }

    /// The quotas whose keys are computed from the objects this watch fills.
    fn quotas_served_by(&self, key: &WatchKey) -> Vec<QuotaKey> {
        let Some(running) = self.watches.get(key) else {
            return Vec::new();
        };
        self.engine
            .index
            .computing(&key.cluster, &key.resource)
            .into_iter()
            .filter(|q| {
                running.hold_all
                    || is_cluster_wide(&key.resource)
                    || self
                        .engine
                        .index
                        .get(q)
                        .is_some_and(|e| running.namespaces.contains(e.demand_namespace()))
            })
            .collect()
    }

    /// A failing watch delivers again: clear its failure, say so in the log and on its quotas.
    fn recovered(&mut self, key: &WatchKey) {
        if let Some(running) = self.watches.get_mut(key) {
            running.failure = None;
        }
        info!(watch = %key, "watch recovered");
        let note = format!("{} is watched again; its keys are current", key.resource_label());
        self.emit_for_resource(key, EventType::Normal, "ResourceAvailable", &note);
    }

    /// Records an Event on every quota whose keys are computed from the watch's resource in
    /// the namespaces it serves.
    fn emit_for_resource(&mut self, key: &WatchKey, type_: EventType, reason: &str, note: &str) {
        for quota in self.quotas_served_by(key) {
            self.emit(&quota, type_, reason, note);
        }
    }

    /// Records an Event on a quota (published by the loop; dropped, with a log line, if too
    /// many are already in flight).
    fn emit(&mut self, quota: &QuotaKey, type_: EventType, reason: &str, note: &str) {
        if self.events.len() >= MAX_PENDING_EVENTS {
            warn!(quota = %quota, reason, "too many Events in flight; dropping one");
            return;
        }
        let uid = self.engine.index.get(quota).and_then(|e| e.payload.uid.clone());
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ResourceQuota".into()),
            namespace: Some(quota.namespace.to_string()),
            name: Some(quota.name.to_string()),
            uid,
            ..ObjectReference::default()
        };
        let note = event_note(self.config.workspace.as_deref(), note);
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        let recorder = self.recorder.clone();
        let quota = quota.clone();
        self.events.push(
            async move {
                if let Err(error) = recorder.publish(&event, &reference).await {
                    warn!(quota = %quota, %error, "recording an Event failed");
                }
            }
            .boxed(),
        );
    }

    /// Whether the object's partition is held; eager watches hold every namespace they see.
    fn ensure_held(&mut self, key: &WatchKey, kind: StoreKind, p: &PartitionKey) -> bool {
        if self.engine.holds(kind, p) {
            return true;
        }
        let Some(running) = self.watches.get(key) else {
            return false;
        };
        if !running.hold_all {
            return false;
        }
        let relisting = running.relisting;
        self.engine.hold(kind, p.clone());
        if relisting {
            self.engine.begin_relist(kind, p);
        } else {
            self.engine.finish_relist(kind, p);
        }
        true
    }

    fn replenish(&mut self, key: &WatchKey, namespace: &str) {
        let now = Instant::now();
        for quota in self
            .engine
            .index
            .dirtied_by(&key.cluster, namespace, &key.resource)
        {
            self.queue.add(quota, now);
        }
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
        let decision = computed.decision;
        self.report_withheld(&key, &decision.withheld);
        if self.config.shadow || !decision.dirty {
            let result = if self.config.shadow {
                self.report_shadow(&key, &decision, &computed.uncomputed)
            } else {
                "unchanged"
            };
            self.metrics.quota_sync(result, started.elapsed().as_secs_f64());
            self.queue.forget(&key);
            self.queue.done(&key);
            return;
        }
        let body = self
            .engine
            .index
            .get(&key)
            .map(|e| status_patch(&e.payload, &decision))
            .unwrap_or_default();
        let api: Api<ResourceQuota> = Api::namespaced(self.client.clone(), &key.namespace);
        let key_of_write = key.clone();
        let write = async move {
            let result = api
                .patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&body))
                .await;
            (key, started, result)
        };
        self.writing.insert(key_of_write, started);
        self.writes.push(write.boxed());
    }

    /// Whether a resource the quota needs is still on its first list (not failing, opened less
    /// than [`FIRST_LIST_GRACE`] ago). Writing then would write a status that the list's end
    /// overwrites a moment later; upstream avoids that by waiting for all its informers.
    fn first_list_pending(&self, key: &QuotaKey, unsynced: &[GroupResource]) -> bool {
        self.watches.iter().any(|(w, r)| {
            w.cluster == key.cluster
                && unsynced.contains(&w.resource)
                && w.namespace.as_deref().is_none_or(|ns| ns == &*key.namespace)
                && !r.synced
                && r.failure.is_none()
                && r.started.elapsed() < FIRST_LIST_GRACE
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
    /// result. A key lazyquota did not compute (not synced, not served, forbidden, withheld)
    /// is **unknown**, never "agree": the stored value proves nothing about lazyquota.
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

    fn on_write(&mut self, key: &QuotaKey, started: Instant, result: Result<ResourceQuota, kube::Error>) {
        self.writing.remove(key);
        self.queue.done(key);
        let seconds = started.elapsed().as_secs_f64();
        match result {
            Ok(written) => {
                self.metrics.quota_sync("written", seconds);
                self.metrics.status_write("ok");
                self.queue.forget(key);
                self.engine.record_written(key, &written);
                debug!(quota = %key, resource_version = ?written.metadata.resource_version, "status written");
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                self.metrics.quota_sync("conflict", seconds);
                self.metrics.status_write("conflict");
                // The quota watch brings the newer version; retry after backoff.
                let delay = self.queue.add_rate_limited(key.clone(), Instant::now());
                let ours = self
                    .engine
                    .index
                    .get(key)
                    .and_then(|e| e.payload.resource_version.clone());
                debug!(quota = %key, ?delay, resource_version = ?ours, "status write conflicted; retrying");
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
        self.stats.unavailable_groups = self.unavailable_groups.iter().cloned().collect();
        self.stats.quota_usage = if self.config.quota_usage_metrics {
            self.quota_usage()
        } else {
            Vec::new()
        };
        self.stats.clone()
    }
}

impl Controller {
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

fn partition(key: &WatchKey, namespace: &str) -> PartitionKey {
    PartitionKey {
        cluster: key.cluster.clone(),
        resource: key.resource.clone(),
        namespace: Arc::from(namespace),
    }
}

fn report_spec_problems(key: &QuotaKey, problems: &[lazyquota_quota::SpecProblem]) {
    for problem in problems {
        warn!(quota = %key, %problem, "quota spec problem; other keys and quotas are unaffected");
    }
}

fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400 * 365)
}

fn discover_owned(client: Client) -> BoxFuture<'static, Result<Discovered, kube::Error>> {
    async move { discover(&client).await }.boxed()
}

/// One item per change of a CustomResourceDefinition or APIService (metadata-only watches:
/// only the fact of a change matters, discovery reads the rest).
/// Fires when the set of served types may have changed: CRDs and APIServices on Kubernetes;
/// CRDs and APIBindings in a kcp logical cluster.
fn api_change_stream(client: &Client, kcp: bool, metrics: &Metrics) -> BoxStream<'static, ()> {
    /// Passes on changes; a failure is a log line and `lazyquota_watch_errors_total` (the
    /// watcher retries with backoff; discovery keeps its last answer meanwhile).
    fn changed<K>(
        resource: &'static str,
        metrics: Metrics,
    ) -> impl FnMut(Result<watcher::Event<K>, watcher::Error>) -> futures::future::Ready<Option<()>> {
        move |event| {
            let changed = match event {
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => true,
                Ok(_) => false,
                Err(error) => {
                    let reason = crate::watch::failure_reason(&error);
                    warn!(resource, reason, %error, "watch of API changes failed; retrying (discovery keeps its last answer)");
                    metrics.watch_error(resource, reason);
                    false
                }
            };
            futures::future::ready(changed.then_some(()))
        }
    }
    let crds: Api<PartialObjectMeta<CustomResourceDefinition>> = Api::all(client.clone());
    let crd_changes = watcher(crds, watcher::Config::default())
        .default_backoff()
        .filter_map(changed(
            "customresourcedefinitions.apiextensions.k8s.io",
            metrics.clone(),
        ));
    if kcp {
        let bindings = kube::api::ApiResource {
            group: "apis.kcp.io".into(),
            version: "v1alpha1".into(),
            api_version: "apis.kcp.io/v1alpha1".into(),
            kind: "APIBinding".into(),
            plural: "apibindings".into(),
        };
        let bindings: Api<PartialObjectMeta<kube::api::DynamicObject>> =
            Api::all_with(client.clone(), &bindings);
        return futures::stream::select(
            crd_changes,
            watcher(bindings, watcher::Config::default())
                .default_backoff()
                .filter_map(changed("apibindings.apis.kcp.io", metrics.clone())),
        )
        .boxed();
    }
    let services: Api<PartialObjectMeta<APIService>> = Api::all(client.clone());
    futures::stream::select(
        crd_changes,
        watcher(services, watcher::Config::default())
            .default_backoff()
            .filter_map(changed("apiservices.apiregistration.k8s.io", metrics.clone())),
    )
    .boxed()
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
