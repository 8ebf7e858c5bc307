//! kcp: one shared wildcard watch per resource type when many logical clusters need it.
//!
//! The shard's engine tells the hub which types each served logical cluster watches for counts.
//! Below `threshold` clusters a type is watched per cluster, as anywhere else. From
//! `threshold` clusters on, the hub runs **one** metadata-only wildcard watch of the type for
//! the whole shard (`<shard>/clusters/*/...`) and hands each controller its share, picked by the
//! `kcp.io/cluster` annotation (and namespace). Controllers switch when the hub's shared set
//! changes: they restart their watches of that type, which relists them from the other source.
//! A type stops being shared only below a lower mark (`threshold - threshold / 4`), so one
//! cluster coming and going at the threshold does not make every other one relist.
//!
//! Which subscriber gets what is decided by the pure [`Fanout`] (`crates/index/src/fanout.rs`,
//! with its property test): a controller subscribing before the shared watch's list has begun
//! is served by that list; one subscribing later gets its own list of its cluster's objects
//! (at resourceVersion L) and, of the shared events buffered meanwhile, only those newer than
//! L. A failed list is retried with backoff (2 s doubling up to 5 minutes), the buffer kept.
//! A relist of the shared watch is a relist for every subscriber. This module only runs the
//! watches and lists and passes their results in.
//!
//! Bounds: controllers hand the hub their demand and subscriptions through shared state (a
//! demand table and a list of pending subscriptions, sized by what is demanded, not by how
//! often), not a queue. Each subscriber may have at most [`MAX_PENDING`] events not yet read
//! by its controller, and a joining one at most [`MAX_PENDING`] buffered; beyond that the
//! subscriber **overflows**: its events are dropped and, once its controller has caught up, it
//! joins again with a list of its own — overflow turns into a relist, never into lost counts.
//! The hub's task ends when the last [`Hub`] handle is dropped (a lost Lease drops them all).
//!
//! Costs: one task for the hub; per shared type one watch (a stream over HTTP/2, a connection over HTTP/1.1) and the
//! metadata decoding of every event of that type on the shard, also of clusters nobody asked
//! for — which is why sharing starts at a threshold; per subscriber a channel (and, while it
//! joins, its buffered events). Nothing is stored: the objects live in each controller's store.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{
    StreamExt as _,
    channel::mpsc,
    future::BoxFuture,
    stream::{AbortHandle, BoxStream, FuturesUnordered, SelectAll},
};
use kube::{
    Api, Client, ResourceExt as _,
    api::{DynamicObject, ListParams, PartialObjectMeta},
    runtime::{WatchStreamExt as _, watcher},
};
use lazyquota_index::{
    engine::Projected,
    fanout::{self, Fanout, Join, Seen},
    keys::{ClusterName, GroupResource},
    resolver::ServedResource,
    sharing::Demand,
};
use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};

use crate::{
    controller::watch::{ObjectEvent, Tagged, WatchItem, WatchKey, api_resource, routed_api},
    kcp::shard::CLUSTER_ANNOTATION,
    operate::metrics::Metrics,
    transport::route::{Route, Routed},
};

/// Events a subscriber may have unread (and a joining one buffered) before it overflows.
pub const MAX_PENDING: usize = 16_384;

/// A handle on the shard's hub (cheap to clone), for one run of the shard's engine (an
/// engagement: an engine restarted after a failure is a new one).
#[derive(Clone)]
pub struct Hub {
    inbox: Arc<Inbox>,
    shared: watch::Receiver<BTreeSet<GroupResource>>,
    /// Which engagement this handle speaks for: an engine started again is a new one, and the
    /// old one's late messages must not count for it.
    engagement: u64,
    /// Types are shared from this many counting logical clusters on.
    threshold: usize,
    /// Aborts the hub's task when the last handle goes.
    _task: Arc<AbortOnDrop>,
}

/// What controllers tell the hub: state the hub reads when notified, so its size follows
/// what is demanded, however often demand changes.
#[derive(Default)]
struct Inbox {
    demand: Mutex<Demand>,
    subscriptions: Mutex<Vec<Subscription>>,
    changed: Notify,
}

struct Subscription {
    cluster: ClusterName,
    namespace: Option<String>,
    served: ServedResource,
    sink: Sink,
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The sending side of a subscriber's channel, counting what its controller has not read.
///
/// futures' unbounded channel, not tokio's: tokio's allocates its first block of 32 slots of
/// `WatchItem` with the channel and keeps it, which would be
/// the larger part of what an engaged logical cluster costs; futures' allocates a node per
/// item in flight and one empty node at rest. Bounded by [`MAX_PENDING`] unread all the same.
struct Sink {
    tx: mpsc::UnboundedSender<WatchItem>,
    unread: Arc<AtomicUsize>,
}

impl fanout::Sink for Sink {
    type Object = ObjectEvent;

    fn send(&mut self, item: WatchItem) {
        if self.tx.unbounded_send(item).is_ok() {
            self.unread.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn unread(&self) -> usize {
        self.unread.load(Ordering::Relaxed)
    }

    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

impl Hub {
    /// Starts the hub of `shard` (one task); types are shared from `threshold` clusters on.
    ///
    /// `root` is a client of the shard's root URL: the shared watches go to
    /// `/clusters/*/...` and a joining subscriber's list to `/clusters/<name>/...` through it
    /// ([`Routed`]), so no logical cluster costs a client (and its task) of its own.
    pub fn start(root: Client, threshold: usize, metrics: Metrics) -> Self {
        let inbox = Arc::new(Inbox::default());
        let (shared_tx, shared_rx) = watch::channel(BTreeSet::new());
        let task = tokio::spawn(run(root, threshold.max(1), inbox.clone(), shared_tx, metrics));
        Self {
            inbox,
            shared: shared_rx,
            engagement: 0,
            threshold: threshold.max(1),
            _task: Arc::new(AbortOnDrop(task.abort_handle())),
        }
    }

    /// The handle for one engagement of a logical cluster.
    #[must_use]
    pub fn for_engagement(&self, engagement: u64) -> Self {
        Self {
            engagement,
            ..self.clone()
        }
    }

    /// `cluster` does (`on`) or no longer does watch `resource` for counts.
    pub fn demand(&self, cluster: &ClusterName, resource: &GroupResource, on: bool) {
        lock(&self.inbox.demand).set(&(cluster.clone(), self.engagement), resource, on);
        self.inbox.changed.notify_one();
    }

    /// This engagement of `cluster` has ended: all its demand goes.
    pub fn withdraw(&self, cluster: &ClusterName) {
        lock(&self.inbox.demand).withdraw(&(cluster.clone(), self.engagement));
        self.inbox.changed.notify_one();
    }

    /// This engagement has ended (its engine stopped): all its demand goes, every cluster's.
    pub fn withdraw_all(&self) {
        lock(&self.inbox.demand).withdraw_engagement(self.engagement);
        self.inbox.changed.notify_one();
    }

    /// Whether `resource` is served by a shared watch now.
    pub fn is_shared(&self, resource: &GroupResource) -> bool {
        self.shared.borrow().contains(resource)
    }

    /// Why `resource` is served from the shared watch (`shared`) or from a watch of a logical
    /// cluster's own: how many logical clusters count it, against the threshold (`explain`).
    pub fn demand_of(&self, resource: &GroupResource, shared: bool) -> String {
        let clusters = lock(&self.inbox.demand).clusters(resource);
        let (threshold, low) = (self.threshold, self.threshold - self.threshold / 4);
        if shared {
            format!(
                "the shard's shared wildcard watch serves it: {clusters} logical cluster(s) count it (shared from {threshold}, until fewer than {low})"
            )
        } else {
            format!(
                "a watch of this logical cluster's own: {clusters} logical cluster(s) count it, the hub shares a type from {threshold}"
            )
        }
    }

    /// Changes of the shared set, for a controller's loop.
    pub fn changes(&self) -> watch::Receiver<BTreeSet<GroupResource>> {
        self.shared.clone()
    }

    /// The share of the shared watch of `served` for `key`'s cluster (and namespace): a watch
    /// stream like [`crate::controller::watch::open`]'s. Dropping or aborting it unsubscribes.
    pub fn subscribe<T: Clone + Send + 'static>(
        &self,
        served: &ServedResource,
        key: &WatchKey,
        tag: T,
    ) -> (Tagged<T>, AbortHandle) {
        let (tx, items) = mpsc::unbounded();
        let unread = Arc::new(AtomicUsize::new(0));
        lock(&self.inbox.subscriptions).push(Subscription {
            cluster: key.cluster.clone(),
            namespace: key.namespace.clone(),
            served: served.clone(),
            sink: Sink {
                tx,
                unread: unread.clone(),
            },
        });
        self.inbox.changed.notify_one();
        let stream = items.inspect(move |_| {
            unread.fetch_sub(1, Ordering::Relaxed);
        });
        let (stream, abort) = futures::stream::abortable(stream);
        (stream.map(move |item| (tag.clone(), item)).boxed(), abort)
    }
}

/// A poisoned lock only means a controller panicked mid-update of plain data; use it anyway.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A shared watch: one per (resource, version) — controllers of clusters serving another
/// version of the type subscribe to another one, and a version change empties the old one.
type SharedKey = (GroupResource, String);

struct Shared {
    served: ServedResource,
    abort: AbortHandle,
    fanout: Fanout<Sink>,
}

type Joined = (SharedKey, u64, kube::Result<(Option<u64>, Vec<ObjectEvent>)>);
type MetaEvent = Result<watcher::Event<Routed<PartialObjectMeta<DynamicObject>>>, watcher::Error>;

fn event_of(object: &PartialObjectMeta<DynamicObject>) -> ObjectEvent {
    ObjectEvent {
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
        object: Projected::Meta,
        revision: revision(object),
    }
}

fn revision(object: &PartialObjectMeta<DynamicObject>) -> Option<u64> {
    object.resource_version()?.parse().ok()
}

/// The hub's state; its task is a thin loop around it.
struct State {
    /// The shard's root: every request is routed ([`Routed`]).
    root: Client,
    watches: BTreeMap<SharedKey, Shared>,
    streams: SelectAll<BoxStream<'static, (SharedKey, MetaEvent)>>,
    joins: FuturesUnordered<BoxFuture<'static, Joined>>,
    /// Joins waiting for one of the [`MAX_JOINS`] slots, each with when it may start (its
    /// backoff): a shard engaging many logical clusters at once lists a few at a time. Bounded by
    /// the subscriptions: the fan-out asks for a join when a subscriber arrives, after a failed
    /// list and after an overflow, and ignores a superseded one when it ends.
    waiting: VecDeque<(tokio::time::Instant, SharedKey, Join)>,
}

/// Join lists running at once, at most (as many as the controller's fills).
pub const MAX_JOINS: usize = lazyquota_index::watches::MAX_FILLS;

impl State {
    fn subscribe(
        &mut self,
        cluster: ClusterName,
        namespace: Option<String>,
        served: &ServedResource,
        sink: Sink,
    ) {
        let key = (served.resource.clone(), served.version.clone());
        if !self.watches.contains_key(&key) {
            let api: Api<Routed<PartialObjectMeta<DynamicObject>>> =
                routed_api(&self.root, &Route::wildcard(), None, api_resource(served));
            let (stream, abort) =
                futures::stream::abortable(watcher(api, watcher::Config::default()).default_backoff());
            let tag = key.clone();
            self.streams.push(stream.map(move |e| (tag.clone(), e)).boxed());
            info!(resource = %served.resource.object_count_name(), version = %served.version, "shared wildcard watch started");
            self.watches.insert(
                key.clone(),
                Shared {
                    served: served.clone(),
                    abort,
                    fanout: Fanout::new(MAX_PENDING),
                },
            );
        }
        let entry = self.watches.get_mut(&key).expect("inserted above");
        if let Some(join) = entry.fanout.subscribe(cluster, namespace, sink) {
            self.start_join(&key, join);
        }
    }

    /// Queues a join: it starts once its backoff has passed and a slot is free.
    fn start_join(&mut self, key: &SharedKey, join: Join) {
        let ready = tokio::time::Instant::now() + join.after;
        self.waiting.push_back((ready, key.clone(), join));
        self.start_ready_joins();
    }

    /// Starts waiting joins whose backoff has passed while fewer than [`MAX_JOINS`] run; the
    /// loop calls it when a join ends and on its tick.
    fn start_ready_joins(&mut self) {
        let now = tokio::time::Instant::now();
        let mut i = 0;
        while self.joins.len() < MAX_JOINS && i < self.waiting.len() {
            if self.waiting[i].0 <= now
                && let Some((_, key, join)) = self.waiting.remove(i)
            {
                self.list_join(&key, join);
            } else {
                i += 1;
            }
        }
    }

    /// Lists one cluster's (namespace's) objects of the shared watch's type for a joining
    /// subscriber, with the list's resourceVersion.
    fn list_join(&mut self, key: &SharedKey, join: Join) {
        let (client, route) = (self.root.clone(), Route::cluster(&join.cluster));
        let api_resource = self.watches.get(key).map(|w| api_resource(&w.served));
        let key = key.clone();
        self.joins.push(Box::pin(async move {
            let listed = async {
                let api_resource =
                    api_resource.ok_or_else(|| kube::Error::Service("the shared watch is gone".into()))?;
                let api: Api<Routed<PartialObjectMeta<DynamicObject>>> =
                    routed_api(&client, &route, join.namespace.as_deref(), api_resource);
                let mut params = ListParams::default().limit(500);
                let mut objects = Vec::new();
                let mut at = None;
                for _ in 0..100_000 {
                    let page = api.list(&params).await?;
                    if at.is_none() {
                        at = page
                            .metadata
                            .resource_version
                            .as_deref()
                            .and_then(|v| v.parse().ok());
                    }
                    objects.extend(page.items.iter().map(|o| event_of(&o.0)));
                    match page.metadata.continue_ {
                        Some(token) if !token.is_empty() => params = params.continue_token(&token),
                        _ => break,
                    }
                }
                Ok((at, objects))
            }
            .await;
            (key, join.generation, listed)
        }));
    }

    fn on_event(&mut self, key: &SharedKey, event: MetaEvent) {
        let Some(entry) = self.watches.get_mut(key) else {
            return;
        };
        let fanout = &mut entry.fanout;
        let overflowed = match event {
            Ok(watcher::Event::Init) => {
                fanout.init();
                Vec::new()
            }
            Ok(watcher::Event::InitApply(o)) => {
                with_seen(&o.0, |seen| fanout.init_apply(seen));
                Vec::new()
            }
            Ok(watcher::Event::InitDone) => {
                fanout.init_done();
                Vec::new()
            }
            Ok(watcher::Event::Apply(o)) => with_seen(&o.0, |seen| fanout.apply(seen)).unwrap_or_default(),
            Ok(watcher::Event::Delete(o)) => with_seen(&o.0, |seen| fanout.delete(seen)).unwrap_or_default(),
            Err(error) => {
                warn!(resource = %key.0.object_count_name(), %error, "shared wildcard watch failed; retrying");
                fanout.failed(
                    crate::controller::watch::failure_reason(&error),
                    &error.to_string(),
                );
                Vec::new()
            }
        };
        for cluster in overflowed {
            warn!(%cluster, resource = %key.0.object_count_name(), "a shared-watch subscriber fell behind; dropping its events until it lists again");
        }
    }

    fn on_joined(
        &mut self,
        key: &SharedKey,
        generation: u64,
        listed: kube::Result<(Option<u64>, Vec<ObjectEvent>)>,
    ) {
        let Some(entry) = self.watches.get_mut(key) else {
            return;
        };
        let error = listed.as_ref().err().map(ToString::to_string);
        if let Some(retry) = entry.fanout.joined(generation, listed.map_err(|e| e.to_string())) {
            // Reported to the subscriber like a failing watch, and retried with backoff.
            warn!(cluster = %retry.cluster, resource = %key.0.object_count_name(), error = error.as_deref().unwrap_or_default(), failures = retry.failures, "listing a cluster's share failed; retrying");
            self.start_join(key, retry);
        }
    }

    /// Subscribers that overflowed and whose controllers have caught up join again.
    fn rejoin_caught_up(&mut self) {
        let mut joins = Vec::new();
        for (key, entry) in &mut self.watches {
            for join in entry.fanout.rejoin_caught_up() {
                info!(cluster = %join.cluster, resource = %key.0.object_count_name(), "a subscriber that fell behind lists again");
                joins.push((key.clone(), join));
            }
        }
        for (key, join) in joins {
            self.start_join(&key, join);
        }
    }

    /// Drops subscribers that left (their stream was dropped) and the shared watches nobody
    /// reads any more.
    fn prune(&mut self) {
        self.watches.retain(|(resource, version), entry| {
            if entry.fanout.prune() {
                true
            } else {
                entry.abort.abort();
                info!(resource = %resource.object_count_name(), %version, "shared wildcard watch stopped");
                false
            }
        });
    }
}

/// Calls `f` with the fan-out's view of a shared watch's object; `None` (and a log line) for
/// one without the `kcp.io/cluster` annotation, which no subscriber can claim.
fn with_seen<R>(
    object: &PartialObjectMeta<DynamicObject>,
    f: impl FnOnce(&Seen<'_, ObjectEvent>) -> R,
) -> Option<R> {
    let Some(cluster) = object.annotations().get(CLUSTER_ANNOTATION) else {
        warn!(name = %object.name_any(), "a shared-watch object without the kcp.io/cluster annotation; ignored");
        return None;
    };
    let event = event_of(object);
    let namespace = event.namespace.clone();
    Some(f(&Seen {
        cluster,
        namespace: &namespace,
        revision: revision(object),
        object: event,
    }))
}

async fn run(
    root: Client,
    threshold: usize,
    inbox: Arc<Inbox>,
    shared_tx: watch::Sender<BTreeSet<GroupResource>>,
    metrics: Metrics,
) {
    let mut state = State {
        root,
        watches: BTreeMap::new(),
        streams: SelectAll::new(),
        joins: FuturesUnordered::new(),
        waiting: VecDeque::new(),
    };
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            () = inbox.changed.notified() => {
                let subscriptions = std::mem::take(&mut *lock(&inbox.subscriptions));
                for Subscription { cluster, namespace, served, sink } in subscriptions {
                    if !fanout::Sink::is_closed(&sink) {
                        state.subscribe(cluster, namespace, &served, sink);
                    }
                }
                let now_shared = lock(&inbox.demand).shared(threshold, &shared_tx.borrow());
                if *shared_tx.borrow() != now_shared {
                    debug!(shared = ?now_shared, "shared types changed");
                    shared_tx.send_replace(now_shared);
                }
            }
            Some((key, event)) = state.streams.next(), if !state.streams.is_empty() => state.on_event(&key, event),
            Some((key, generation, listed)) = state.joins.next(), if !state.joins.is_empty() => {
                state.on_joined(&key, generation, listed);
                state.start_ready_joins();
            }
            _ = tick.tick() => {
                state.prune();
                state.rejoin_caught_up();
                state.start_ready_joins();
                metrics.kcp_shared_watches(state.watches.len());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn explain_names_how_many_clusters_count_a_type_against_the_threshold() {
        // No request is made: the hub only reads its demand here.
        let config = kube::Config::new("https://127.0.0.1:9".parse().expect("url"));
        let root = Client::try_from(config).expect("client");
        let hub = Hub::start(root, 4, Metrics::new());
        let widgets = GroupResource::new("example.io", "widgets");
        for cluster in ["a", "b"] {
            hub.demand(&ClusterName::new(cluster), &widgets, true);
        }
        assert_eq!(
            hub.demand_of(&widgets, false),
            "a watch of this logical cluster's own: 2 logical cluster(s) count it, the hub shares a type from 4"
        );
        assert_eq!(
            hub.demand_of(&widgets, true),
            "the shard's shared wildcard watch serves it: 2 logical cluster(s) count it (shared from 4, until fewer than 3)"
        );
    }
}
