//! kcp: one shared wildcard watch per resource type when many logical clusters count it, inside
//! the Reconciler. Pure: the executor opens and closes the shared watches and runs the lists
//! this module asks for ([`Effect::OpenShared`], [`Effect::CloseShared`],
//! [`Effect::ListShare`]) and feeds their events and results back ([`Input::Shared`],
//! [`Input::ListedShare`]).
//!
//! Below `threshold` logical clusters a type is watched per cluster, as anywhere else. From
//! `threshold` clusters on, one metadata-only wildcard watch of the type serves the whole shard
//! (`<shard>/clusters/*/...`), and each subscribed watch gets its share, picked by the
//! `kcp.io/cluster` annotation (and namespace). A type stops being shared only below a lower
//! mark (`threshold - threshold / 4`), so one cluster coming and going at the threshold does
//! not make every other one relist ([`Demand::shared`]).
//!
//! Which subscriber gets what is the pure [`Fanout`]'s rule: a subscriber arriving before the
//! shared watch's list has begun is served by that list; one arriving later gets a list of its
//! own share at resourceVersion L and, of the shared events buffered meanwhile, only those newer
//! than L. Its share is delivered into its watch at once, in the same step as the shared
//! event ([`Hub::on_event`] returns the items): there is no channel between the hub and the
//! watches to fall behind. A joining subscriber buffers at most [`MAX_PENDING`] events; beyond
//! that it **overflows** and is told (its partitions stop counting) and lists again — an
//! overflow turns into a relist, never into lost counts.
//!
//! Bounds: at most [`MAX_JOINS`] share lists run at once; the others wait in a queue bounded by
//! the subscribers (one list per subscriber at most), each with its backoff after failed lists
//! (`fanout::join_backoff`). Costs: per shared type one watch (a stream over HTTP/2) and
//! its [`Fanout`]; per subscriber its cluster name, namespace, phase and watch id.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fmt,
    sync::Arc,
    time::Instant,
};

use tracing::{info, warn};

use super::{Effect, Metric, restarts::Restarts};
use crate::{
    fanout::{self, Fanout, Join, Seen},
    keys::{ClusterName, GroupResource},
    resolver::ServedResource,
    sharing::{Demand, low_mark},
    watches::{Item, ObjectEvent},
};

/// Events a joining subscriber may buffer before it overflows (and lists again), by default
/// ([`super::Settings::shared_buffer`]).
pub const MAX_PENDING: usize = 16_384;

/// Share lists running at once, at most (as many as the watches' fills).
pub const MAX_JOINS: usize = crate::watches::MAX_FILLS;

/// One shared watch: a type at one version — clusters serving another version of the type
/// subscribe to another one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedKey {
    /// The type.
    pub resource: GroupResource,
    /// The version watched.
    pub version: String,
}

impl fmt::Display for SharedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.resource.object_count_name(), self.version)
    }
}

/// An object of a shared watch, as the executor read it.
#[derive(Clone, Debug)]
pub struct SharedObject {
    /// Its logical cluster (the `kcp.io/cluster` annotation); `None` without one, which no
    /// subscriber can claim.
    pub cluster: Option<String>,
    /// The object (metadata only).
    pub object: ObjectEvent,
}

/// One event of a shared watch.
pub type SharedEvent = fanout::WatchItem<SharedObject>;

/// Where a subscriber's items go: collected here and handed to its watch by the Reconciler
/// right after the call that produced them, so nothing is ever left unread. At rest it holds
/// no allocation: a watch id, an empty `Vec` and a flag, inline in the fan-out's entry.
pub struct Share {
    watch: u64,
    items: Vec<Item>,
    left: bool,
}

impl Share {
    /// The sink of subscribed watch `watch`.
    #[must_use]
    pub fn new(watch: u64) -> Self {
        Self {
            watch,
            items: Vec::new(),
            left: false,
        }
    }

    /// The subscribed watch.
    #[must_use]
    pub fn watch(&self) -> u64 {
        self.watch
    }

    /// Takes what was sent since the last call, in order.
    pub fn take(&mut self) -> Vec<Item> {
        std::mem::take(&mut self.items)
    }

    /// Its watch stopped: the fan-out drops it at its next prune.
    pub fn leave(&mut self) {
        self.left = true;
    }
}

impl fanout::Sink for Share {
    type Object = ObjectEvent;

    fn send(&mut self, item: Item) {
        self.items.push(item);
    }

    fn unread(&self) -> usize {
        0
    }

    fn is_closed(&self) -> bool {
        self.left
    }
}

struct Shared {
    /// Its key, once: each subscriber points at it.
    key: Arc<SharedKey>,
    served: ServedResource,
    fanout: Fanout<Share>,
}

/// The shard's sharing: demand, shared set, shared watches and their subscribers, share lists.
pub struct Hub {
    /// Types are shared from this many counting logical clusters on; 0: never.
    threshold: usize,
    /// Events a joining subscriber may buffer.
    buffer: usize,
    demand: Demand,
    shared: BTreeSet<GroupResource>,
    watches: BTreeMap<SharedKey, Shared>,
    /// Which shared watch each subscribed watch id reads.
    subscribers: BTreeMap<u64, Arc<SharedKey>>,
    /// Share lists waiting for a slot, each with when it may start (its backoff).
    waiting: VecDeque<(Instant, SharedKey, Join)>,
    /// Share lists running (at most [`MAX_JOINS`]).
    running: BTreeSet<(SharedKey, u64)>,
    /// When shared watches failed after their list are reopened.
    restarts: Restarts<SharedKey, ServedResource>,
    /// The last share-list generation of a closed shared watch: a watch of the type opened
    /// again numbers its lists after it, so that an answer to a list of the closed one (still
    /// in flight: the executor does not abort share lists) is not taken for a new one's.
    generations: u64,
}

impl fmt::Debug for Hub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hub")
            .field("threshold", &self.threshold)
            .field("shared", &self.shared)
            .field("watches", &self.watches.keys().collect::<Vec<_>>())
            .field("subscribers", &self.subscribers.len())
            .field("waiting", &self.waiting.len())
            .field("running", &self.running.len())
            .finish_non_exhaustive()
    }
}

impl Hub {
    /// A hub sharing types from `threshold` counting logical clusters on (0: never), whose
    /// joining subscribers buffer at most `buffer` events each.
    #[must_use]
    pub fn new(threshold: usize, buffer: usize) -> Self {
        Self {
            threshold,
            buffer,
            demand: Demand::default(),
            shared: BTreeSet::new(),
            watches: BTreeMap::new(),
            subscribers: BTreeMap::new(),
            waiting: VecDeque::new(),
            running: BTreeSet::new(),
            restarts: Restarts::default(),
            generations: 0,
        }
    }

    /// Whether `resource` is served by a shared watch now.
    #[must_use]
    pub fn is_shared(&self, resource: &GroupResource) -> bool {
        self.shared.contains(resource)
    }

    /// The shared watches open now.
    #[must_use]
    pub fn shared_watches(&self) -> usize {
        self.watches.len()
    }

    /// Share lists running now.
    #[must_use]
    pub fn lists_running(&self) -> usize {
        self.running.len()
    }

    /// `cluster` does (`on`) or no longer does watch `resource` for counts.
    pub(super) fn set_demand(&mut self, cluster: &ClusterName, resource: &GroupResource, on: bool) {
        self.demand.set(cluster, resource, on);
    }

    /// `cluster` was let go: all its demand goes.
    pub(super) fn withdraw(&mut self, cluster: &ClusterName) {
        self.demand.withdraw(cluster);
    }

    /// Takes the shared set the demand now gives; whether it changed.
    pub(super) fn refresh_shared(&mut self) -> bool {
        if self.threshold == 0 {
            return false;
        }
        let now = self.demand.shared(self.threshold, &self.shared);
        if now == self.shared {
            return false;
        }
        self.shared = now;
        true
    }

    /// Why `resource` is served from the shared watch (`shared`) or from a watch of a logical
    /// cluster's own: how many logical clusters count it, against the threshold (`explain`).
    #[must_use]
    pub fn explain(&self, resource: &GroupResource, shared: bool) -> String {
        let clusters = self.demand.clusters(resource);
        let (threshold, low) = (self.threshold, low_mark(self.threshold));
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

    /// Watch `watch` of `cluster` (and `namespace`) reads its share of the shared watch of
    /// `served`, opened now if it is not yet.
    pub(super) fn subscribe(
        &mut self,
        watch: u64,
        cluster: ClusterName,
        namespace: Option<String>,
        served: &ServedResource,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let key = SharedKey {
            resource: served.resource.clone(),
            version: served.version.clone(),
        };
        if !self.watches.contains_key(&key) {
            if self.restarts.waits(&key, served.clone()) {
                // It failed soon after a restart and closed meanwhile: opened again by this
                // demand, it still waits for that reopen (its subscribers with it).
                info!(shared = %key, "shared wildcard watch started; opened once its restart's wait is over");
            } else {
                info!(shared = %key, "shared wildcard watch started");
                effects.push(Effect::OpenShared {
                    key: key.clone(),
                    served: served.clone(),
                });
            }
            self.watches.insert(
                key.clone(),
                Shared {
                    key: Arc::new(key.clone()),
                    served: served.clone(),
                    fanout: Fanout::new(self.buffer).after_generation(self.generations),
                },
            );
            effects.push(Effect::Metric(Metric::SharedWatches(self.watches.len())));
        }
        let entry = self.watches.get_mut(&key).expect("inserted above");
        self.subscribers.insert(watch, entry.key.clone());
        let share = Share::new(watch);
        if let Some(join) = entry.fanout.subscribe(cluster, namespace, share) {
            self.queue_join(key, join, now);
        }
        self.start_ready_joins(now, effects);
    }

    /// The subscribers (their watch ids) of the shared watch `key`.
    pub(super) fn subscribers_of(&self, key: &SharedKey) -> Vec<u64> {
        self.subscribers
            .iter()
            .filter(|(_, k)| ***k == *key)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Watch `watch` stopped; whether it was a subscriber (then the executor has nothing to
    /// close for it). The shared watch closes with its last subscriber.
    pub(super) fn unsubscribe(&mut self, watch: u64, effects: &mut Vec<Effect>) -> bool {
        let Some(key) = self.subscribers.remove(&watch) else {
            return false;
        };
        let key = SharedKey::clone(&key);
        let Some(entry) = self.watches.get_mut(&key) else {
            return true;
        };
        entry.fanout.for_each_sink(|share| {
            if share.watch == watch {
                share.leave();
            }
        });
        if !entry.fanout.prune() {
            self.generations = self.generations.max(entry.fanout.generation());
            self.watches.remove(&key);
            self.waiting.retain(|(_, k, _)| *k != key);
            // Its restart record stays (`Restarts::waits`).
            info!(shared = %key, "shared wildcard watch stopped");
            effects.push(Effect::CloseShared { key });
            effects.push(Effect::Metric(Metric::SharedWatches(self.watches.len())));
        }
        true
    }

    /// An event of the shared watch `key`: each subscriber's share, to hand to its watch.
    pub(super) fn on_event(
        &mut self,
        key: &SharedKey,
        event: SharedEvent,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) -> Vec<(u64, Item)> {
        let Some(entry) = self.watches.get_mut(key) else {
            return Vec::new();
        };
        let fanout = &mut entry.fanout;
        // A shared watch failing after its list is opened again: its list serves every
        // subscriber (one list of the type, not one per subscriber), and until it ends none
        // counts. Failing in its list, kube's watcher lists again by itself.
        let restart = matches!(event, fanout::WatchItem::Failed(..)) && !fanout.is_listing();
        let old_rule = crate::mutation::active(crate::mutation::Mutation::SharesRejoinFailedWatch);
        let overflowed = match event {
            fanout::WatchItem::Init => {
                fanout.init();
                Vec::new()
            }
            fanout::WatchItem::InitDone => {
                fanout.init_done();
                self.restarts.listed(key, now);
                Vec::new()
            }
            fanout::WatchItem::InitApply(o) => {
                with_seen(key, o, |seen| fanout.init_apply(seen));
                Vec::new()
            }
            fanout::WatchItem::Apply(o) => with_seen(key, o, |seen| fanout.apply(seen)).unwrap_or_default(),
            fanout::WatchItem::Delete(o) => with_seen(key, o, |seen| fanout.delete(seen)).unwrap_or_default(),
            fanout::WatchItem::Failed(reason, message) => {
                warn!(shared = %key, reason, error = %message, "shared wildcard watch failed; retrying");
                fanout.failed(reason, &message);
                Vec::new()
            }
        };
        for cluster in &overflowed {
            warn!(%cluster, shared = %key, "a joining subscriber buffered too many shared events; it lists again");
            let resource = crate::planner::resource_label(&key.resource);
            effects.push(Effect::Metric(Metric::ShareOverflow(resource)));
        }
        if restart && !old_rule {
            let served = entry.served.clone();
            // Share lists not started yet would serve nobody: the watch's list serves all.
            self.waiting.retain(|(_, k, _)| k != key);
            effects.push(Effect::CloseShared { key: key.clone() });
            if let Some(served) = self.restarts.restart(key.clone(), served, now) {
                info!(shared = %key, "shared wildcard watch failed after its list: opened again to list afresh");
                effects.push(Effect::OpenShared {
                    key: key.clone(),
                    served,
                });
            } else {
                info!(shared = %key, "shared wildcard watch failed again soon after a restart: opened again after a wait");
            }
        }
        // Only an overflow leaves subscribers to list their share again: an event's hot path
        // touches this shared watch's subscribers once, in the fan-out, and no other watch's.
        if !overflowed.is_empty() || (restart && old_rule) {
            self.rejoin(key, now);
            self.start_ready_joins(now, effects);
        }
        self.deliveries(key)
    }

    /// A share list asked for by [`Effect::ListShare`] ended.
    pub(super) fn on_listed(
        &mut self,
        key: &SharedKey,
        generation: u64,
        listed: Result<(Option<u64>, Vec<ObjectEvent>), String>,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) -> Vec<(u64, Item)> {
        self.running.remove(&(key.clone(), generation));
        if let Some(entry) = self.watches.get_mut(key) {
            let error = listed.as_ref().err().cloned();
            if let Some(retry) = entry.fanout.joined(generation, listed) {
                // Told to the subscriber like a failing watch, and retried with backoff.
                warn!(cluster = %retry.cluster, shared = %key, error = error.as_deref().unwrap_or_default(), failures = retry.failures, "listing a cluster's share failed; retrying");
                self.queue_join(key.clone(), retry, now);
            }
        }
        // A slot is free again.
        self.start_ready_joins(now, effects);
        self.deliveries(key)
    }

    /// When a shared watch's reopen is due or a waiting share list may start (if a slot is
    /// free), whichever is first.
    #[must_use]
    pub fn next_wakeup(&self) -> Option<Instant> {
        let join = if self.running.len() >= MAX_JOINS {
            None
        } else {
            self.waiting.iter().map(|(at, _, _)| *at).min()
        };
        join.into_iter().chain(self.restarts.next_due()).min()
    }

    /// Reopens the shared watches whose wait has passed; starts the share lists whose backoff
    /// has passed, within [`MAX_JOINS`].
    pub(super) fn tick(&mut self, now: Instant, effects: &mut Vec<Effect>) {
        for (key, served) in self.restarts.take_due(now) {
            if self.watches.contains_key(&key) {
                info!(shared = %key, "shared wildcard watch reopened after its restart's wait");
                effects.push(Effect::OpenShared { key, served });
            }
        }
        self.start_ready_joins(now, effects);
    }

    fn queue_join(&mut self, key: SharedKey, join: Join, now: Instant) {
        self.waiting.push_back((now + join.after, key, join));
    }

    /// Subscribers of `key` that overflowed list their share again (their watch reads
    /// everything at once, so they have always caught up).
    fn rejoin(&mut self, key: &SharedKey, now: Instant) {
        let Some(entry) = self.watches.get_mut(key) else {
            return;
        };
        for join in entry.fanout.rejoin_caught_up() {
            info!(cluster = %join.cluster, shared = %key, "a subscriber lists its share again");
            self.waiting.push_back((now + join.after, key.clone(), join));
        }
    }

    fn start_ready_joins(&mut self, now: Instant, effects: &mut Vec<Effect>) {
        let limit = if crate::mutation::active(crate::mutation::Mutation::UnboundedJoins) {
            usize::MAX
        } else {
            MAX_JOINS
        };
        let mut i = 0;
        while self.running.len() < limit && i < self.waiting.len() {
            if self.waiting[i].0 <= now
                && let Some((_, key, join)) = self.waiting.remove(i)
            {
                let Some(entry) = self.watches.get(&key) else {
                    continue;
                };
                if !entry.fanout.waits_for(join.generation) {
                    // Its subscriber left while the list waited for its backoff or a slot.
                    continue;
                }
                self.running.insert((key.clone(), join.generation));
                effects.push(Effect::ListShare {
                    key,
                    generation: join.generation,
                    cluster: join.cluster,
                    namespace: join.namespace,
                    served: entry.served.clone(),
                });
            } else {
                i += 1;
            }
        }
    }

    /// What shared watch `key`'s fan-out gave each subscriber since the last call, in order
    /// (only a call about `key` gives its subscribers anything).
    fn deliveries(&mut self, key: &SharedKey) -> Vec<(u64, Item)> {
        let mut out = Vec::new();
        if let Some(entry) = self.watches.get_mut(key) {
            entry.fanout.for_each_sink(|share| {
                let watch = share.watch;
                out.extend(share.take().into_iter().map(|item| (watch, item)));
            });
        }
        out
    }
}

/// Calls `f` with the fan-out's view of a shared watch's object; `None` (and a log line) for
/// one without the `kcp.io/cluster` annotation, which no subscriber can claim.
fn with_seen<R>(
    key: &SharedKey,
    shared: SharedObject,
    f: impl FnOnce(&Seen<'_, ObjectEvent>) -> R,
) -> Option<R> {
    let Some(cluster) = shared.cluster else {
        warn!(shared = %key, name = %shared.object.name, "a shared-watch object without the kcp.io/cluster annotation; ignored");
        return None;
    };
    let namespace = shared.object.namespace.clone();
    Some(f(&Seen {
        cluster: &cluster,
        namespace: &namespace,
        revision: shared.object.revision,
        object: shared.object,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widgets() -> ServedResource {
        ServedResource::core_for_tests("widgets")
    }

    fn list_generations(effects: &[Effect]) -> Vec<u64> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::ListShare { generation, .. } => Some(*generation),
                _ => None,
            })
            .collect()
    }

    /// Opens the shared watch with `first` subscribed and listed, then subscribes `late`
    /// (which lists its own share); the generations of the lists asked for.
    fn open_and_join(hub: &mut Hub, first: u64, late: u64, now: Instant) -> Vec<u64> {
        let mut effects = Vec::new();
        let c = |id: u64| ClusterName::new(&format!("c{id}"));
        hub.subscribe(first, c(first), None, &widgets(), now, &mut effects);
        let key = SharedKey {
            resource: widgets().resource,
            version: "v1".into(),
        };
        hub.on_event(&key, SharedEvent::Init, now, &mut effects);
        hub.on_event(&key, SharedEvent::InitDone, now, &mut effects);
        hub.subscribe(late, c(late), None, &widgets(), now, &mut effects);
        list_generations(&effects)
    }

    #[test]
    fn a_shared_watch_opened_again_does_not_take_a_list_of_the_closed_one_for_its_own() {
        let now = Instant::now();
        let mut hub = Hub::new(2, 16);
        let key = SharedKey {
            resource: widgets().resource,
            version: "v1".into(),
        };
        let before = open_and_join(&mut hub, 1, 2, now);
        assert_eq!(before.len(), 1, "the late subscriber lists its share");
        let mut effects = Vec::new();
        hub.unsubscribe(1, &mut effects);
        hub.unsubscribe(2, &mut effects);
        assert!(effects.iter().any(|e| matches!(e, Effect::CloseShared { .. })));

        let after = open_and_join(&mut hub, 3, 4, now);
        assert_eq!(after.len(), 1);
        assert!(after[0] > before[0], "{after:?} after {before:?}");
        // The closed watch's list answers late, with cluster 2's objects: not cluster 4's.
        let object = ObjectEvent {
            namespace: "ns".into(),
            name: "of-c2".into(),
            object: crate::engine::Projected::Meta,
            revision: Some(7),
        };
        let delivered = hub.on_listed(&key, before[0], Ok((Some(7), vec![object])), now, &mut effects);
        assert!(delivered.is_empty(), "{delivered:?}");
    }
}
