//! kcp: one shared wildcard watch per resource type when many logical clusters need it.
//!
//! Each engaged logical cluster's controller tells the hub which types it watches for counts.
//! Below `threshold` clusters a type is watched per cluster, as anywhere else. From
//! `threshold` clusters on, the hub runs **one** metadata-only wildcard watch of the type for
//! the whole shard (`<shard>/clusters/*/...`) and hands each controller its share, picked by the
//! `kcp.io/cluster` annotation (and namespace). Controllers switch when the hub's shared set
//! changes: they restart their watches of that type, which relists them from the other source.
//! A type stops being shared only below a lower mark (`threshold - threshold / 4`), so one
//! cluster coming and going at the threshold does not make every other one relist.
//!
//! A controller subscribing before the shared watch's list has begun is served by that list.
//! One subscribing later gets its own list of its cluster's objects (at resourceVersion L);
//! the shared events that arrive meanwhile are buffered and only those newer than L are passed
//! on, so nothing is counted twice or missed (resourceVersions of one shard are comparable
//! across its logical clusters; and a shared list begun before the subscription is at or below
//! L). A failed list is retried with backoff (2 s doubling up to 5 minutes), the buffer kept.
//! A relist of the shared watch is a relist for every subscriber.
//!
//! Bounds: controllers hand the hub their demand and subscriptions through shared state (a
//! demand table and a list of pending subscriptions, sized by what is demanded, not by how
//! often), not a queue. Each subscriber may have at most [`MAX_PENDING`] events not yet read
//! by its controller, and a joining one at most [`MAX_PENDING`] buffered; beyond that the
//! subscriber **overflows**: its events are dropped and, once its controller has caught up, it
//! joins again with a list of its own — overflow turns into a relist, never into lost counts.
//! The hub's task ends when the last [`Hub`] handle is dropped (a lost Lease drops them all).
//!
//! Costs: one task for the hub; per shared type one watch (one connection over HTTP/1.1) and the
//! metadata decoding of every event of that type on the shard, also of clusters nobody asked
//! for — which is why sharing starts at a threshold; per subscriber a channel (and, while it
//! joins, its buffered events). Nothing is stored: the objects live in each controller's store.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{
    StreamExt as _,
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
    keys::{ClusterName, GroupResource},
    resolver::ServedResource,
    sharing::Demand,
};
use tokio::sync::{Notify, mpsc, watch};
use tracing::{debug, info, warn};

use crate::{
    metrics::Metrics,
    shard::{CLUSTER_ANNOTATION, Shard},
    watch::{ObjectEvent, Tagged, WatchItem, WatchKey, api_resource},
};

/// Events a subscriber may have unread (and a joining one buffered) before it overflows.
pub const MAX_PENDING: usize = 16_384;

/// A handle on the shard's hub (cheap to clone), for one engagement of one logical cluster.
#[derive(Clone)]
pub struct Hub {
    inbox: Arc<Inbox>,
    shared: watch::Receiver<BTreeSet<GroupResource>>,
    /// Which engagement this handle speaks for: a cluster disengaged and engaged again is a
    /// new one, and the old one's late messages must not count for it.
    engagement: u64,
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
struct Sink {
    tx: mpsc::UnboundedSender<WatchItem>,
    unread: Arc<AtomicUsize>,
}

impl Sink {
    fn send(&self, item: WatchItem) {
        if self.tx.send(item).is_ok() {
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
    pub fn start(shard: Shard, wildcard: Client, threshold: usize, metrics: Metrics) -> Self {
        let inbox = Arc::new(Inbox::default());
        let (shared_tx, shared_rx) = watch::channel(BTreeSet::new());
        let task = tokio::spawn(run(
            shard,
            wildcard,
            threshold.max(1),
            inbox.clone(),
            shared_tx,
            metrics,
        ));
        Self {
            inbox,
            shared: shared_rx,
            engagement: 0,
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

    /// Whether `resource` is served by a shared watch now.
    pub fn is_shared(&self, resource: &GroupResource) -> bool {
        self.shared.borrow().contains(resource)
    }

    /// Changes of the shared set, for a controller's loop.
    pub fn changes(&self) -> watch::Receiver<BTreeSet<GroupResource>> {
        self.shared.clone()
    }

    /// The share of the shared watch of `served` for `key`'s cluster (and namespace): a watch
    /// stream like [`crate::watch::open`]'s. Dropping or aborting it unsubscribes.
    pub fn subscribe<T: Clone + Send + 'static>(
        &self,
        served: &ServedResource,
        key: &WatchKey,
        tag: T,
    ) -> (Tagged<T>, AbortHandle) {
        let (tx, items) = mpsc::unbounded_channel();
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
        let stream = futures::stream::unfold((items, unread), |(mut items, unread)| async move {
            let item = items.recv().await?;
            unread.fetch_sub(1, Ordering::Relaxed);
            Some((item, (items, unread)))
        });
        let (stream, abort) = futures::stream::abortable(stream);
        (stream.map(move |item| (tag.clone(), item)).boxed(), abort)
    }
}

/// A poisoned lock only means a controller panicked mid-update of plain data; use it anyway.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

enum Phase {
    /// Waiting for its own list (at the list's resourceVersion), buffering shared events.
    Joining {
        generation: u64,
        buffer: Vec<(Option<u64>, WatchItem)>,
        /// Failed lists so far (the next waits longer).
        failures: u32,
    },
    /// Part of a list of the shared watch in progress.
    Relisting,
    /// Receives shared events as they come.
    Live,
    /// Fell [`MAX_PENDING`] behind: events are dropped until its controller has caught up,
    /// then it joins again with a list of its own.
    Overflowed,
}

struct Subscriber {
    cluster: ClusterName,
    namespace: Option<String>,
    sink: Sink,
    phase: Phase,
}

impl Subscriber {
    fn wants(&self, object: &PartialObjectMeta<DynamicObject>) -> bool {
        object.annotations().get(CLUSTER_ANNOTATION).map(String::as_str) == Some(self.cluster.as_str())
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| object.namespace().as_deref() == Some(ns))
    }
}

/// A shared watch: one per (resource, version) — controllers of clusters serving another
/// version of the type subscribe to another one, and a version change empties the old one.
type SharedKey = (GroupResource, String);

struct Shared {
    served: ServedResource,
    abort: AbortHandle,
    /// The shared watch is in its first list or a relist.
    listing: bool,
    /// The current list has begun (its `Init` was passed on): a subscriber arriving now
    /// missed part of it and lists on its own.
    init_seen: bool,
    subscribers: Vec<Subscriber>,
}

type Joined = (SharedKey, u64, kube::Result<(Option<u64>, Vec<ObjectEvent>)>);
type MetaEvent = Result<watcher::Event<PartialObjectMeta<DynamicObject>>, watcher::Error>;

fn event_of(object: &PartialObjectMeta<DynamicObject>) -> ObjectEvent {
    ObjectEvent {
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
        object: Projected::Meta,
    }
}

fn revision(object: &PartialObjectMeta<DynamicObject>) -> Option<u64> {
    object.resource_version()?.parse().ok()
}

/// The hub's state; its task is a thin loop around it.
struct State {
    shard: Shard,
    wildcard: Client,
    watches: BTreeMap<SharedKey, Shared>,
    streams: SelectAll<BoxStream<'static, (SharedKey, MetaEvent)>>,
    joins: FuturesUnordered<BoxFuture<'static, Joined>>,
    generation: u64,
    /// Per-cluster clients for join lists, built once per cluster.
    clients: BTreeMap<ClusterName, Client>,
}

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
            let api: Api<PartialObjectMeta<DynamicObject>> =
                Api::all_with(self.wildcard.clone(), &api_resource(served));
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
                    listing: true,
                    init_seen: false,
                    subscribers: Vec::new(),
                },
            );
        }
        let entry = self.watches.get(&key).expect("inserted above");
        let phase = if entry.listing && !entry.init_seen {
            // The shared list has not begun: its Init and objects will come.
            Phase::Relisting
        } else {
            self.start_join(&key, &cluster, namespace.clone(), 0)
        };
        if let Some(entry) = self.watches.get_mut(&key) {
            entry.subscribers.push(Subscriber {
                cluster,
                namespace,
                sink,
                phase,
            });
        }
    }

    /// Starts a subscriber's own list (after a backoff for its `failures` so far); returns
    /// its phase meanwhile.
    fn start_join(
        &mut self,
        key: &SharedKey,
        cluster: &ClusterName,
        namespace: Option<String>,
        failures: u32,
    ) -> Phase {
        self.generation += 1;
        let join = self.join(key, cluster, namespace, self.generation, join_retry(failures));
        self.joins.push(join);
        Phase::Joining {
            generation: self.generation,
            buffer: Vec::new(),
            failures,
        }
    }

    /// Subscribers that overflowed and whose controllers have caught up join again.
    fn rejoin_caught_up(&mut self) {
        let mut rejoin = Vec::new();
        for (key, entry) in &self.watches {
            for (i, s) in entry.subscribers.iter().enumerate() {
                if matches!(s.phase, Phase::Overflowed) && s.sink.unread() < MAX_PENDING / 4 {
                    rejoin.push((key.clone(), i, s.cluster.clone(), s.namespace.clone()));
                }
            }
        }
        for (key, i, cluster, namespace) in rejoin {
            let phase = self.start_join(&key, &cluster, namespace, 0);
            if let Some(s) = self.watches.get_mut(&key).and_then(|e| e.subscribers.get_mut(i)) {
                info!(cluster = %s.cluster, resource = %key.0.object_count_name(), "a subscriber that fell behind lists again");
                s.phase = phase;
            }
        }
    }

    /// Lists one cluster's (namespace's) objects of the shared watch's type for a joining
    /// subscriber, after `delay`, with the list's resourceVersion.
    fn join(
        &mut self,
        key: &SharedKey,
        cluster: &ClusterName,
        namespace: Option<String>,
        generation: u64,
        delay: Duration,
    ) -> BoxFuture<'static, Joined> {
        let client = match self.clients.get(cluster) {
            Some(client) => Ok(client.clone()),
            None => self.shard.cluster(cluster).inspect(|c| {
                self.clients.insert(cluster.clone(), c.clone());
            }),
        };
        let api_resource = self.watches.get(key).map(|w| api_resource(&w.served));
        let key = key.clone();
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            let listed = async {
                let client = client.map_err(|e| kube::Error::Service(Box::new(e)))?;
                let api_resource =
                    api_resource.ok_or_else(|| kube::Error::Service("the shared watch is gone".into()))?;
                let api: Api<PartialObjectMeta<DynamicObject>> = match &namespace {
                    Some(ns) => Api::namespaced_with(client, ns, &api_resource),
                    None => Api::all_with(client, &api_resource),
                };
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
                    objects.extend(page.items.iter().map(event_of));
                    match page.metadata.continue_ {
                        Some(token) if !token.is_empty() => params = params.continue_token(&token),
                        _ => break,
                    }
                }
                Ok((at, objects))
            }
            .await;
            (key, generation, listed)
        })
    }

    fn on_event(&mut self, key: &SharedKey, event: MetaEvent) {
        let Some(entry) = self.watches.get_mut(key) else {
            return;
        };
        match event {
            Ok(watcher::Event::Init) => {
                entry.listing = true;
                entry.init_seen = true;
                for s in &mut entry.subscribers {
                    // A joining subscriber's own list is superseded by the relist.
                    s.sink.send(WatchItem::Init);
                    s.phase = Phase::Relisting;
                }
            }
            Ok(watcher::Event::InitApply(o)) => {
                for s in entry
                    .subscribers
                    .iter()
                    .filter(|s| matches!(s.phase, Phase::Relisting) && s.wants(&o))
                {
                    s.sink.send(WatchItem::InitApply(event_of(&o)));
                }
            }
            Ok(watcher::Event::InitDone) => {
                entry.listing = false;
                for s in &mut entry.subscribers {
                    if matches!(s.phase, Phase::Relisting) {
                        s.sink.send(WatchItem::InitDone);
                        s.phase = Phase::Live;
                    }
                }
            }
            Ok(watcher::Event::Apply(o)) => route(entry, &o, false),
            Ok(watcher::Event::Delete(o)) => route(entry, &o, true),
            Err(error) => {
                warn!(resource = %key.0.object_count_name(), %error, "shared wildcard watch failed; retrying");
                let reason = crate::watch::failure_reason(&error);
                for s in &entry.subscribers {
                    s.sink.send(WatchItem::Failed(reason, error.to_string()));
                }
            }
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
        let Some(s) = entry
            .subscribers
            .iter_mut()
            .find(|s| matches!(&s.phase, Phase::Joining { generation: g, .. } if *g == generation))
        else {
            return; // a relist took it over, or it left
        };
        match listed {
            Ok((at, objects)) => {
                s.sink.send(WatchItem::Init);
                for object in objects {
                    s.sink.send(WatchItem::InitApply(object));
                }
                s.sink.send(WatchItem::InitDone);
                if let Phase::Joining { buffer, .. } = std::mem::replace(&mut s.phase, Phase::Live) {
                    for (rv, item) in buffer {
                        // Only what the list did not already see.
                        if rv.zip(at).is_none_or(|(rv, at)| rv > at) {
                            s.sink.send(item);
                        }
                    }
                }
            }
            Err(error) => {
                // Reported like a failing watch, and retried with backoff; the buffer is kept.
                let failures = match &mut s.phase {
                    Phase::Joining { failures, .. } => {
                        *failures += 1;
                        *failures
                    }
                    _ => 1,
                };
                warn!(cluster = %s.cluster, resource = %key.0.object_count_name(), %error, failures, "listing a cluster's share failed; retrying");
                s.sink.send(WatchItem::Failed("join_list", error.to_string()));
                let (cluster, namespace) = (s.cluster.clone(), s.namespace.clone());
                let join = self.join(key, &cluster, namespace, generation, join_retry(failures));
                self.joins.push(join);
            }
        }
    }

    /// Drops subscribers that left (their stream was dropped) and the shared watches nobody
    /// reads any more.
    fn prune(&mut self) {
        self.watches.retain(|(resource, version), entry| {
            entry.subscribers.retain(|s| !s.sink.is_closed());
            if entry.subscribers.is_empty() {
                entry.abort.abort();
                info!(resource = %resource.object_count_name(), %version, "shared wildcard watch stopped");
                false
            } else {
                true
            }
        });
    }
}

async fn run(
    shard: Shard,
    wildcard: Client,
    threshold: usize,
    inbox: Arc<Inbox>,
    shared_tx: watch::Sender<BTreeSet<GroupResource>>,
    metrics: Metrics,
) {
    let mut state = State {
        shard,
        wildcard,
        watches: BTreeMap::new(),
        streams: SelectAll::new(),
        joins: FuturesUnordered::new(),
        generation: 0,
        clients: BTreeMap::new(),
    };
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            () = inbox.changed.notified() => {
                let subscriptions = std::mem::take(&mut *lock(&inbox.subscriptions));
                for Subscription { cluster, namespace, served, sink } in subscriptions {
                    if !sink.is_closed() {
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
            }
            _ = tick.tick() => {
                state.prune();
                state.rejoin_caught_up();
                state.clients.retain(|c, _| state.watches.values().any(|w| w.subscribers.iter().any(|s| &s.cluster == c)));
                metrics.kcp_shared_watches(state.watches.len());
            }
        }
    }
}

/// Passes a shared watch's change to the subscribers it concerns (buffered for those joining).
fn route(entry: &mut Shared, object: &PartialObjectMeta<DynamicObject>, delete: bool) {
    let rv = revision(object);
    for s in entry.subscribers.iter_mut().filter(|s| s.wants(object)) {
        let item = if delete {
            WatchItem::Delete(event_of(object))
        } else {
            WatchItem::Apply(event_of(object))
        };
        match &mut s.phase {
            Phase::Live if s.sink.unread() >= MAX_PENDING => overflow(s),
            Phase::Live => s.sink.send(item),
            Phase::Joining { buffer, .. } if buffer.len() >= MAX_PENDING => overflow(s),
            Phase::Joining { buffer, .. } => buffer.push((rv, item)),
            // A relist in progress delivers the object's state itself; an overflowed
            // subscriber lists again once caught up.
            Phase::Relisting | Phase::Overflowed => {}
        }
    }
}

/// How long a join list waits after `failures` failed ones: none at first, then 2 s doubling
/// up to 5 minutes.
fn join_retry(failures: u32) -> Duration {
    doubling(Duration::from_secs(2), failures, Duration::from_secs(300))
}

/// `first` after the first failure, twice as long after each further one, at most `max`;
/// nothing before any failure (shared by the hub's join lists and kcp's controller restarts).
pub(crate) fn doubling(first: Duration, failures: u32, max: Duration) -> Duration {
    match failures {
        0 => Duration::ZERO,
        n => first.saturating_mul(1 << (n - 1).min(16)).min(max),
    }
}

/// A subscriber fell too far behind: drop its events (and buffer) until it can list again.
fn overflow(s: &mut Subscriber) {
    warn!(cluster = %s.cluster, unread = s.sink.unread(), "a shared-watch subscriber fell behind; dropping its events until it lists again");
    s.phase = Phase::Overflowed;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(cluster: &str, name: &str, rv: u64) -> PartialObjectMeta<DynamicObject> {
        PartialObjectMeta {
            types: None,
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("team".into()),
                resource_version: Some(rv.to_string()),
                annotations: Some([(CLUSTER_ANNOTATION.to_owned(), cluster.to_owned())].into()),
                ..Default::default()
            },
            _phantom: std::marker::PhantomData,
        }
    }

    fn shared(subscribers: Vec<Subscriber>) -> Shared {
        Shared {
            served: ServedResource {
                resource: GroupResource::core("configmaps"),
                version: "v1".into(),
                kind: "ConfigMap".into(),
                namespaced: true,
                verbs: vec![],
            },
            abort: AbortHandle::new_pair().0,
            listing: false,
            init_seen: true,
            subscribers,
        }
    }

    fn subscriber(cluster: &str, phase: Phase) -> (Subscriber, mpsc::UnboundedReceiver<WatchItem>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let sink = Sink {
            tx,
            unread: Arc::new(AtomicUsize::new(0)),
        };
        let s = Subscriber {
            cluster: ClusterName::new(cluster),
            namespace: None,
            sink,
            phase,
        };
        (s, rx)
    }

    #[test]
    fn a_subscriber_that_falls_behind_overflows_instead_of_growing_without_bound() {
        let (slow, _rx) = subscriber("a", Phase::Live);
        let (other, mut other_rx) = subscriber("b", Phase::Live);
        let joining = Phase::Joining {
            generation: 1,
            buffer: Vec::new(),
            failures: 0,
        };
        let (joiner, _rx3) = subscriber("c", joining);
        let mut entry = shared(vec![slow, other, joiner]);
        for i in 0..=MAX_PENDING as u64 {
            route(&mut entry, &object("a", &format!("o{i}"), i), false);
            route(&mut entry, &object("c", &format!("o{i}"), i), false);
        }
        route(&mut entry, &object("b", "x", 1), false);
        assert!(matches!(entry.subscribers[0].phase, Phase::Overflowed));
        assert_eq!(
            entry.subscribers[0].sink.unread(),
            MAX_PENDING,
            "no more than the bound queued"
        );
        assert!(
            matches!(entry.subscribers[2].phase, Phase::Overflowed),
            "a join buffer is bounded too"
        );
        assert!(
            matches!(entry.subscribers[1].phase, Phase::Live),
            "others are unaffected"
        );
        assert!(matches!(other_rx.try_recv(), Ok(WatchItem::Apply(_))));
        route(&mut entry, &object("a", "late", 1), false);
        assert_eq!(
            entry.subscribers[0].sink.unread(),
            MAX_PENDING,
            "dropped while overflowed"
        );
    }
}
