//! kcp: one shared wildcard watch per resource type when many logical clusters need it.
//!
//! Each engaged logical cluster's controller tells the hub which types it watches for counts.
//! Below `threshold` clusters a type is watched per cluster, as anywhere else. From
//! `threshold` clusters on, the hub runs **one** metadata-only wildcard watch of the type for
//! the whole shard (`<shard>/clusters/*/...`) and hands each controller its share, picked by the
//! `kcp.io/cluster` annotation (and namespace). Controllers switch when the hub's shared set
//! changes: they restart their watches of that type, which relists them from the other source.
//!
//! A controller joining a running shared watch gets its own list of its cluster's objects first
//! (at resourceVersion L); the shared events that arrive meanwhile are buffered and only those
//! newer than L are passed on, so nothing is counted twice or missed (resourceVersions of one
//! shard are comparable across its logical clusters). A relist of the shared watch is a relist
//! for every subscriber.
//!
//! Costs: one task for the hub; per shared type one watch (one connection over HTTP/1.1) and the
//! metadata decoding of every event of that type on the shard, also of clusters nobody asked
//! for — which is why sharing starts at a threshold; per subscriber a channel (and, while it
//! joins, its buffered events). Nothing is stored: the objects live in each controller's store.

use std::collections::{BTreeMap, BTreeSet};

use futures::{
    StreamExt as _,
    stream::{AbortHandle, BoxStream, FuturesUnordered, SelectAll},
};
use kube::{
    Api, ResourceExt as _,
    api::{DynamicObject, ListParams, PartialObjectMeta},
    runtime::{WatchStreamExt as _, watcher},
};
use lazyquota_index::{
    engine::Projected,
    keys::{ClusterName, GroupResource},
    resolver::ServedResource,
};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::{
    kcp::{CLUSTER_ANNOTATION, Shard},
    metrics::Metrics,
    watch::{ObjectEvent, Tagged, WatchItem, WatchKey, api_resource},
};

/// A handle on the shard's hub (cheap to clone).
#[derive(Clone)]
pub struct Hub {
    commands: mpsc::UnboundedSender<Command>,
    shared: watch::Receiver<BTreeSet<GroupResource>>,
}

enum Command {
    Demand {
        cluster: ClusterName,
        resource: GroupResource,
        on: bool,
    },
    Withdraw(ClusterName),
    Subscribe {
        cluster: ClusterName,
        namespace: Option<String>,
        served: ServedResource,
        sink: mpsc::UnboundedSender<WatchItem>,
    },
}

impl Hub {
    /// Starts the hub of `shard` (one task); types are shared from `threshold` clusters on.
    pub fn start(shard: Shard, threshold: usize, metrics: Metrics) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        let (shared_tx, shared_rx) = watch::channel(BTreeSet::new());
        tokio::spawn(run(shard, threshold.max(1), rx, shared_tx, metrics));
        Self {
            commands,
            shared: shared_rx,
        }
    }

    /// `cluster` does (`on`) or no longer does watch `resource` for counts.
    pub fn demand(&self, cluster: &ClusterName, resource: &GroupResource, on: bool) {
        let _ = self.commands.send(Command::Demand {
            cluster: cluster.clone(),
            resource: resource.clone(),
            on,
        });
    }

    /// `cluster` is no longer served: all its demand goes.
    pub fn withdraw(&self, cluster: &ClusterName) {
        let _ = self.commands.send(Command::Withdraw(cluster.clone()));
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
        let (sink, items) = mpsc::unbounded_channel();
        let _ = self.commands.send(Command::Subscribe {
            cluster: key.cluster.clone(),
            namespace: key.namespace.clone(),
            served: served.clone(),
            sink,
        });
        let stream = futures::stream::unfold(items, |mut items| async move {
            items.recv().await.map(|item| (item, items))
        });
        let (stream, abort) = futures::stream::abortable(stream);
        (stream.map(move |item| (tag.clone(), item)).boxed(), abort)
    }
}

/// Which resources are shared, from the clusters demanding each. Pure.
#[derive(Debug, Default)]
pub struct Demand {
    clusters: BTreeMap<GroupResource, BTreeSet<ClusterName>>,
}

impl Demand {
    /// Records a change.
    pub fn set(&mut self, cluster: &ClusterName, resource: &GroupResource, on: bool) {
        if on {
            self.clusters
                .entry(resource.clone())
                .or_default()
                .insert(cluster.clone());
        } else if let Some(set) = self.clusters.get_mut(resource) {
            set.remove(cluster);
            if set.is_empty() {
                self.clusters.remove(resource);
            }
        }
    }

    /// Removes every demand of `cluster`.
    pub fn withdraw(&mut self, cluster: &ClusterName) {
        self.clusters.retain(|_, set| {
            set.remove(cluster);
            !set.is_empty()
        });
    }

    /// The resources at least `threshold` clusters demand.
    pub fn shared(&self, threshold: usize) -> BTreeSet<GroupResource> {
        self.clusters
            .iter()
            .filter(|(_, set)| set.len() >= threshold)
            .map(|(r, _)| r.clone())
            .collect()
    }
}

enum Phase {
    /// Waiting for its own list (at the list's resourceVersion), buffering shared events.
    Joining {
        generation: u64,
        buffer: Vec<(Option<u64>, WatchItem)>,
    },
    /// Part of a relist of the shared watch in progress.
    Relisting,
    /// Receives shared events as they come.
    Live,
}

struct Subscriber {
    cluster: ClusterName,
    namespace: Option<String>,
    sink: mpsc::UnboundedSender<WatchItem>,
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

struct Shared {
    abort: AbortHandle,
    /// The shared watch is in its first list or a relist.
    listing: bool,
    subscribers: Vec<Subscriber>,
}

type Joined = (GroupResource, u64, kube::Result<(Option<u64>, Vec<ObjectEvent>)>);
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

#[allow(clippy::too_many_lines)] // one select loop over the hub's inputs
async fn run(
    shard: Shard,
    threshold: usize,
    mut commands: mpsc::UnboundedReceiver<Command>,
    shared_tx: watch::Sender<BTreeSet<GroupResource>>,
    metrics: Metrics,
) {
    let mut demand = Demand::default();
    let mut watches: BTreeMap<GroupResource, Shared> = BTreeMap::new();
    let mut streams: SelectAll<BoxStream<'static, (GroupResource, MetaEvent)>> = SelectAll::new();
    let mut joins: FuturesUnordered<futures::future::BoxFuture<'static, Joined>> = FuturesUnordered::new();
    let mut generation = 0_u64;
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        tokio::select! {
            command = commands.recv() => {
                let Some(command) = command else { break };
                match command {
                    Command::Demand { cluster, resource, on } => demand.set(&cluster, &resource, on),
                    Command::Withdraw(cluster) => demand.withdraw(&cluster),
                    Command::Subscribe { cluster, namespace, served, sink } => {
                        let resource = served.resource.clone();
                        let entry = watches.entry(resource.clone()).or_insert_with(|| {
                            let wildcard = shard.wildcard().expect("the shard's wildcard client was built before");
                            let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(wildcard, &api_resource(&served));
                            let tagged = resource.clone();
                            let (stream, abort) = futures::stream::abortable(
                                watcher(api, watcher::Config::default()).default_backoff(),
                            );
                            streams.push(stream.map(move |e| (tagged.clone(), e)).boxed());
                            info!(resource = %resource.object_count_name(), "shared wildcard watch started");
                            Shared { abort, listing: true, subscribers: Vec::new() }
                        });
                        let phase = if entry.listing {
                            // Joins the list in progress (its Init is now).
                            let _ = sink.send(WatchItem::Init);
                            Phase::Relisting
                        } else {
                            generation += 1;
                            joins.push(join(&shard, &served, &cluster, namespace.clone(), generation));
                            Phase::Joining { generation, buffer: Vec::new() }
                        };
                        entry.subscribers.push(Subscriber { cluster, namespace, sink, phase });
                    }
                }
                let now_shared = demand.shared(threshold);
                if *shared_tx.borrow() != now_shared {
                    debug!(shared = ?now_shared, "shared types changed");
                    shared_tx.send_replace(now_shared);
                }
            }
            Some((resource, event)) = streams.next(), if !streams.is_empty() => {
                let Some(entry) = watches.get_mut(&resource) else { continue };
                match event {
                    Ok(watcher::Event::Init) => {
                        entry.listing = true;
                        for s in &mut entry.subscribers {
                            let _ = s.sink.send(WatchItem::Init);
                            s.phase = Phase::Relisting;
                        }
                    }
                    Ok(watcher::Event::InitApply(o)) => {
                        for s in entry.subscribers.iter().filter(|s| matches!(s.phase, Phase::Relisting) && s.wants(&o)) {
                            let _ = s.sink.send(WatchItem::InitApply(event_of(&o)));
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        entry.listing = false;
                        for s in &mut entry.subscribers {
                            if matches!(s.phase, Phase::Relisting) {
                                let _ = s.sink.send(WatchItem::InitDone);
                                s.phase = Phase::Live;
                            }
                        }
                    }
                    Ok(watcher::Event::Apply(o)) => route(entry, &o, false),
                    Ok(watcher::Event::Delete(o)) => route(entry, &o, true),
                    Err(error) => {
                        warn!(resource = %resource.object_count_name(), %error, "shared wildcard watch failed; retrying");
                        let reason = crate::watch::failure_reason(&error);
                        for s in &entry.subscribers {
                            let _ = s.sink.send(WatchItem::Failed(reason, error.to_string()));
                        }
                    }
                }
            }
            Some((resource, generation, listed)) = joins.next(), if !joins.is_empty() => {
                let Some(entry) = watches.get_mut(&resource) else { continue };
                let Some(s) = entry.subscribers.iter_mut().find(|s| matches!(&s.phase, Phase::Joining { generation: g, .. } if *g == generation)) else {
                    continue; // a relist took it over, or it left
                };
                match listed {
                    Ok((at, objects)) => {
                        let _ = s.sink.send(WatchItem::Init);
                        for object in objects {
                            let _ = s.sink.send(WatchItem::InitApply(object));
                        }
                        let _ = s.sink.send(WatchItem::InitDone);
                        if let Phase::Joining { buffer, .. } = std::mem::replace(&mut s.phase, Phase::Live) {
                            for (rv, item) in buffer {
                                // Only what the list did not already see.
                                if rv.zip(at).is_none_or(|(rv, at)| rv > at) {
                                    let _ = s.sink.send(item);
                                }
                            }
                        }
                    }
                    Err(error) => {
                        // Reported like a failing watch; the controller restarts it.
                        let _ = s.sink.send(WatchItem::Failed("join_list", error.to_string()));
                        s.phase = Phase::Live;
                    }
                }
            }
            _ = tick.tick() => {}
        }
        // Subscribers that left (their stream was dropped); shared watches nobody reads.
        watches.retain(|resource, entry| {
            entry.subscribers.retain(|s| !s.sink.is_closed());
            if entry.subscribers.is_empty() {
                entry.abort.abort();
                info!(resource = %resource.object_count_name(), "shared wildcard watch stopped");
                false
            } else {
                true
            }
        });
        metrics.kcp_shared_watches(watches.len());
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
            Phase::Live => {
                let _ = s.sink.send(item);
            }
            Phase::Joining { buffer, .. } => buffer.push((rv, item)),
            // A relist in progress delivers the object's state itself.
            Phase::Relisting => {}
        }
    }
}

/// Lists one cluster's (namespace's) objects of `served` for a joining subscriber, with the
/// list's resourceVersion.
fn join(
    shard: &Shard,
    served: &ServedResource,
    cluster: &ClusterName,
    namespace: Option<String>,
    generation: u64,
) -> futures::future::BoxFuture<'static, Joined> {
    let resource = served.resource.clone();
    let client = shard.cluster(cluster);
    let api_resource = api_resource(served);
    Box::pin(async move {
        let listed = async {
            let client = client.map_err(|e| kube::Error::Service(Box::new(e)))?;
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
        (resource, generation, listed)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(n: &str) -> ClusterName {
        ClusterName::new(n)
    }

    #[test]
    fn a_type_is_shared_from_the_threshold_on() {
        let widgets = GroupResource::new("example.io", "widgets");
        let pods = GroupResource::core("pods");
        let mut d = Demand::default();
        d.set(&c("a"), &widgets, true);
        d.set(&c("b"), &widgets, true);
        d.set(&c("a"), &pods, true);
        assert!(d.shared(3).is_empty());
        d.set(&c("c"), &widgets, true);
        assert_eq!(d.shared(3), [widgets.clone()].into());
        d.set(&c("c"), &widgets, true);
        assert_eq!(d.shared(3), [widgets.clone()].into(), "idempotent");
        d.withdraw(&c("b"));
        assert!(d.shared(3).is_empty(), "a cluster leaving drops it below");
        assert_eq!(d.shared(1), [pods.clone(), widgets.clone()].into());
        d.set(&c("a"), &pods, false);
        assert_eq!(d.shared(1), [widgets].into());
    }
}
