//! The running watches of one controller: which are open, what each fills, and where each is
//! (listing, synced, failing); and what to do on each of their events. Pure: the controller
//! (`crates/kube/src/controller.rs`) opens and closes watches and lists as the [`Action`]s
//! returned here say, and feeds every watch item and list result back in.
//!
//! ```text
//!  demand or discovery changed ─► sync(cluster, resource) ─► planner::desired_watches
//!        └─► Start / Stop / Fill (a namespace joining a cluster-wide watch), Demand (kcp hub)
//!  watch item ─► on_item ─► Engine stores ─► Enqueue (replenishment, list done), Event
//!  fill listed ─► on_fill ─► Engine store ─► Enqueue, or Stop + Start (relist on failure)
//! ```
//!
//! The store's partitions follow the watches: a watch holds the partitions of the namespaces
//! it fills while it runs and releases them when it stops, so a quota never reads a partition
//! no watch keeps current. Cost per open watch: 1,332 bytes of heap with the empty partition
//! it holds (its key twice, by key and by id, its namespaces, a few flags; `cargo bench -p
//! lazyquota-index --bench heap`, 1,000 namespaced watches).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    sync::Arc,
};

use crate::{
    demand::is_cluster_wide,
    engine::{Engine, Projected, store_kind},
    fanout::WatchItem,
    keys::{ALL_NAMESPACES, ClusterName, GroupResource, Need, ObjectIds, QuotaKey},
    planner::{self, Mode, PlanSettings, WatchKey},
    resolver::ServedResource,
    sorted::SortedSet,
    store::PartitionKey,
};

mod items;

/// Lists filling joining namespaces at once; more wait in a queue.
pub const MAX_FILLS: usize = 8;

/// One object of a watch event.
#[derive(Clone, Debug)]
pub struct ObjectEvent {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// What the store keeps of it.
    pub object: Projected,
    /// Its resourceVersion, when it is a number (etcd's): how far the watch has come.
    pub revision: Option<u64>,
}

/// One event of a watch (a controller's own or its share of a kcp shared watch).
pub type Item = WatchItem<ObjectEvent>;

/// One open watch.
#[derive(Clone, Debug)]
#[allow(clippy::struct_excessive_bools)] // independent facts about one watch
pub struct Running {
    /// Its identity: items arrive tagged with it; a restarted watch gets a new one.
    pub id: u64,
    /// Namespaces whose partitions it fills (lazy mode).
    pub namespaces: SortedSet<Arc<str>>,
    /// Eager mode: it holds every namespace it sees.
    pub hold_all: bool,
    /// Listed completely at least once.
    pub synced: bool,
    /// A (re)list is in progress.
    pub relisting: bool,
    /// The last failure (a metric label and the error), until the next list or event.
    pub failure: Option<(&'static str, String)>,
    /// Its quotas were told of that failure (an Event): not while the watch runs on a guess
    /// before its cluster's first discovery, which says whether the type is served at all.
    pub failure_told: bool,
    /// Lists started: 1 plus its relists.
    pub lists: u32,
    /// Served by the kcp hub's shared wildcard watch (not a watch of its own).
    pub shared: bool,
    /// Reopened after failing past its sync ([`Action::Restart`]); until its list ends a
    /// failure is left to kube's backoff.
    pub restarting: bool,
    /// The highest resourceVersion of an object it delivered: it has delivered every change
    /// up to there (a watch is in resourceVersion order), so a quota at a resourceVersion not
    /// above it is computed from objects at least that new ([`crate::lowering`]).
    pub observed: u64,
}

/// What the controller is to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Open a watch (`shared`: subscribe to the kcp hub's shared watch instead).
    Start {
        /// Tags its items.
        id: u64,
        /// What it watches.
        key: WatchKey,
        /// The version and scope the cluster serves.
        served: ServedResource,
        /// From the kcp hub's shared watch.
        shared: bool,
    },
    /// Reopen watch `id` under the same id: it failed after its sync, and kube's watcher
    /// resumes a broken watch without an event to say so, so a quiet partition would never
    /// count again. The reopened watch lists afresh (its `InitDone` makes it count).
    Restart {
        /// Its id.
        id: u64,
        /// What it watches.
        key: WatchKey,
        /// The version and scope the cluster serves.
        served: ServedResource,
    },
    /// Close a watch.
    Stop {
        /// Its id.
        id: u64,
        /// What it watched.
        key: WatchKey,
    },
    /// List the objects of one namespace joining a cluster-wide watch, and hand them to
    /// [`Watches::on_fill`].
    Fill {
        /// The watch it joins.
        key: WatchKey,
        /// The namespace.
        namespace: Arc<str>,
        /// The version and scope served.
        served: ServedResource,
    },
    /// Compute this quota (its usage may have changed).
    Enqueue(QuotaKey),
    /// Record an Event on a quota.
    Event {
        /// The quota.
        quota: QuotaKey,
        /// Warning (else Normal).
        warning: bool,
        /// Its reason.
        reason: &'static str,
        /// Its note.
        note: String,
    },
    /// kcp: tell the hub whether `cluster` watches `resource` for counts.
    Demand {
        /// The logical cluster.
        cluster: ClusterName,
        /// The type.
        resource: GroupResource,
        /// Watched for counts.
        count: bool,
    },
    /// A watch starts a (re)list (a metric).
    Listing(WatchKey),
    /// A watch listed completely for the first time (a log line).
    Synced(WatchKey),
    /// A failing watch delivers again (a log line).
    Recovered(WatchKey),
    /// A watch failed and retries by itself (a metric; a log line when `new_reason`).
    Failing {
        /// The watch.
        key: WatchKey,
        /// A metric label.
        reason: &'static str,
        /// The error.
        message: String,
        /// Not the reason it was already failing for.
        new_reason: bool,
    },
    /// An object could not be projected and is left out of usage (a log line).
    Malformed {
        /// The watch.
        key: WatchKey,
        /// Its namespace.
        namespace: String,
        /// Its name (empty for a fill, whose reasons name it).
        name: String,
        /// Why.
        reason: String,
    },
    /// Listing a joining namespace failed; the watch restarts (a log line).
    FillFailed {
        /// The watch.
        key: WatchKey,
        /// The namespace.
        namespace: Arc<str>,
        /// The error.
        error: String,
    },
}

/// The running watches. Pure.
#[derive(Debug)]
pub struct Watches {
    settings: PlanSettings,
    running: BTreeMap<WatchKey, Running>,
    by_id: HashMap<u64, WatchKey>,
    next_id: u64,
    /// Fill lists in flight, and how many may be.
    filling: usize,
    max_fills: usize,
    /// Fills waiting for a slot (one entry per watch and namespace at most).
    fill_queue: VecDeque<(WatchKey, Arc<str>)>,
    /// kcp: demand goes to a hub.
    hub: bool,
    /// Names objects in the store.
    ids: ObjectIds,
}

fn partition(key: &WatchKey, namespace: &str) -> PartitionKey {
    PartitionKey {
        cluster: key.cluster.clone(),
        resource: key.resource.clone(),
        namespace: Arc::from(namespace),
    }
}

impl Watches {
    /// No watches yet, planned with `settings`; `hub`: kcp, where count demand is told to the
    /// shard's hub and shared types come from it; `ids` names objects in the store.
    #[must_use]
    pub fn new(settings: PlanSettings, hub: bool, ids: ObjectIds) -> Self {
        Self {
            settings,
            running: BTreeMap::new(),
            by_id: HashMap::new(),
            next_id: 0,
            filling: 0,
            max_fills: MAX_FILLS,
            fill_queue: VecDeque::new(),
            hub,
            ids,
        }
    }

    /// At most `n` fill lists at once (at least 1; [`MAX_FILLS`] by default).
    #[must_use]
    pub fn with_max_fills(self, n: usize) -> Self {
        Self {
            max_fills: n.max(1),
            ..self
        }
    }

    /// Watch `id` is open (not stopped).
    #[must_use]
    pub fn is_running(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    /// What watch `id` watches, while it is open.
    #[must_use]
    pub fn key_of(&self, id: u64) -> Option<&WatchKey> {
        self.by_id.get(&id)
    }

    /// The open watches.
    pub fn iter(&self) -> impl Iterator<Item = (&WatchKey, &Running)> {
        self.running.iter()
    }

    /// Brings (cluster, resource)'s watches to the planner's answer: stops those no longer
    /// planned, starts new ones, fills namespaces joining a cluster-wide watch and releases
    /// those leaving it. `shared`: whether the kcp hub serves a type now.
    pub fn sync(
        &mut self,
        engine: &mut Engine,
        cluster: &ClusterName,
        resource: &GroupResource,
        shared: &dyn Fn(&GroupResource) -> bool,
        out: &mut Vec<Action>,
    ) {
        let desired = planner::desired_watches(engine, &self.settings, cluster, resource);
        for key in self.keys_of(cluster, resource) {
            let Some(namespaces) = desired.get(&key) else {
                self.stop(engine, &key, out);
                continue;
            };
            let Some(running) = self.running.get_mut(&key) else {
                continue;
            };
            if running.hold_all {
                continue;
            }
            let added: Vec<Arc<str>> = namespaces
                .iter()
                .filter(|ns| !running.namespaces.contains(&***ns))
                .cloned()
                .collect();
            let removed: Vec<Arc<str>> = running
                .namespaces
                .iter()
                .filter(|ns| !namespaces.contains(*ns))
                .cloned()
                .collect();
            if added.iter().chain(&removed).any(|ns| &**ns == ALL_NAMESPACES) {
                // Every namespace joins (or leaves) at once: a relist, not a fill per namespace.
                self.stop(engine, &key, out);
                continue;
            }
            for ns in &removed {
                running.namespaces.remove(&**ns);
            }
            running.namespaces.extend(added.iter().cloned());
            let kind = store_kind(&key.resource, key.need);
            for ns in removed {
                engine.release(kind, &partition(&key, &ns));
            }
            let cluster_scoped_resource = !engine
                .resolver
                .get(cluster, resource)
                .is_some_and(|s| s.namespaced);
            for ns in added {
                let p = partition(&key, &ns);
                engine.begin_fill(kind, p.clone());
                if cluster_scoped_resource {
                    // A namespace holds no cluster-scoped object: nothing to list.
                    engine.finish_fill(kind, &p, Vec::new());
                } else {
                    // A namespace joining a cluster-wide watch is filled by a list of its own;
                    // the watch keeps running (no relist of the whole resource).
                    self.fill(engine, key.clone(), ns, out);
                }
            }
        }
        if self.hub {
            out.push(Action::Demand {
                cluster: cluster.clone(),
                resource: resource.clone(),
                count: desired.keys().any(|k| k.need == Need::Count),
            });
        }
        for (key, namespaces) in desired {
            if !self.running.contains_key(&key) {
                self.start(engine, key, namespaces, shared, out);
            }
        }
    }

    fn fill(&mut self, engine: &Engine, key: WatchKey, namespace: Arc<str>, out: &mut Vec<Action>) {
        if self.filling >= self.max_fills {
            // A burst of namespaces joining (a new quota in each of 1,000) lists a few at a
            // time; a queued fill no longer demanded when its turn comes is dropped on arrival.
            if !self.fill_queue.iter().any(|(k, n)| k == &key && n == &namespace) {
                self.fill_queue.push_back((key, namespace));
            }
            return;
        }
        let Some(served) = engine.resolver.get(&key.cluster, &key.resource).cloned() else {
            return;
        };
        self.filling += 1;
        out.push(Action::Fill {
            key,
            namespace,
            served,
        });
    }

    fn start(
        &mut self,
        engine: &mut Engine,
        key: WatchKey,
        namespaces: BTreeSet<Arc<str>>,
        shared: &dyn Fn(&GroupResource) -> bool,
        out: &mut Vec<Action>,
    ) {
        let Some(served) = engine.resolver.get(&key.cluster, &key.resource).cloned() else {
            return;
        };
        self.next_id += 1;
        let id = self.next_id;
        let shared = self.hub && key.need == Need::Count && shared(&key.resource);
        let kind = store_kind(&key.resource, key.need);
        for ns in &namespaces {
            engine.hold(kind, partition(&key, ns));
        }
        let hold_all = self.settings.mode == Mode::Eager && !is_cluster_wide(&key.resource);
        self.by_id.insert(id, key.clone());
        out.push(Action::Start {
            id,
            key: key.clone(),
            served,
            shared,
        });
        self.running.insert(
            key,
            Running {
                id,
                namespaces: namespaces.into_iter().collect(),
                hold_all,
                synced: false,
                relisting: false,
                failure: None,
                failure_told: false,
                lists: 0,
                shared,
                restarting: false,
                observed: 0,
            },
        );
    }

    /// Stops a watch and releases what it filled.
    pub fn stop(&mut self, engine: &mut Engine, key: &WatchKey, out: &mut Vec<Action>) {
        let Some(running) = self.running.remove(key) else {
            return;
        };
        self.by_id.remove(&running.id);
        let kind = store_kind(&key.resource, key.need);
        for p in Self::partitions_of(engine, key, &running) {
            engine.release(kind, &p);
        }
        out.push(Action::Stop {
            id: running.id,
            key: key.clone(),
        });
    }

    /// Stops every watch of (cluster, resource): a version change or a type gone.
    pub fn stop_all_of(
        &mut self,
        engine: &mut Engine,
        cluster: &ClusterName,
        resource: &GroupResource,
        out: &mut Vec<Action>,
    ) {
        for key in self.keys_of(cluster, resource) {
            self.stop(engine, &key, out);
        }
    }

    /// Stops serving `cluster` (a kcp logical cluster disengaged): forgets its discovery in
    /// the engine and stops every watch of it, telling the hub its demand is gone.
    pub fn forget_cluster(
        &mut self,
        engine: &mut Engine,
        cluster: &ClusterName,
        shared: &dyn Fn(&GroupResource) -> bool,
        out: &mut Vec<Action>,
    ) {
        engine.forget_cluster(cluster);
        let resources: BTreeSet<GroupResource> = self
            .running
            .keys()
            .filter(|k| &k.cluster == cluster)
            .map(|k| k.resource.clone())
            .collect();
        // Nothing resolves now: the planner wants no watch, so each sync stops them all.
        for resource in resources {
            self.sync(engine, cluster, &resource, shared, out);
        }
    }

    /// The open watches of (cluster, resource).
    fn keys_of(&self, cluster: &ClusterName, resource: &GroupResource) -> Vec<WatchKey> {
        self.running
            .keys()
            .filter(|k| &k.cluster == cluster && &k.resource == resource)
            .cloned()
            .collect()
    }

    /// The kcp hub's shared set changed: count watches whose source no longer matches
    /// restart from the other one (a relist, from this controller's view).
    pub fn on_shared_changed(
        &mut self,
        engine: &mut Engine,
        shared: &dyn Fn(&GroupResource) -> bool,
        out: &mut Vec<Action>,
    ) {
        let moved: BTreeSet<(ClusterName, GroupResource)> = self
            .running
            .iter()
            .filter(|(k, r)| k.need == Need::Count && r.shared != shared(&k.resource))
            .map(|(k, _)| (k.cluster.clone(), k.resource.clone()))
            .collect();
        for (cluster, resource) in moved {
            self.stop_all_of(engine, &cluster, &resource, out);
            self.sync(engine, &cluster, &resource, shared, out);
        }
    }

    /// The partitions a watch fills (an eager watch: every one held for its resource).
    fn partitions_of(engine: &Engine, key: &WatchKey, running: &Running) -> Vec<PartitionKey> {
        if running.hold_all {
            engine.held_namespaces(store_kind(&key.resource, key.need), &key.cluster, &key.resource)
        } else {
            running.namespaces.iter().map(|ns| partition(key, ns)).collect()
        }
    }

    /// The quotas whose keys are computed from the objects this watch fills.
    pub fn quotas_served_by(&self, engine: &Engine, key: &WatchKey) -> Vec<QuotaKey> {
        let Some(running) = self.running.get(key) else {
            return Vec::new();
        };
        engine
            .index
            .computing(&key.cluster, &key.resource)
            .into_iter()
            .filter(|q| {
                running.hold_all
                    || is_cluster_wide(&key.resource)
                    || engine
                        .index
                        .get(q)
                        .is_some_and(|e| running.namespaces.contains(&**e.demand_namespace()))
            })
            .collect()
    }

    /// The open watches that feed `quota`'s `resources` (in its namespace, or cluster-wide).
    pub fn feeding<'a>(
        &'a self,
        quota: &'a QuotaKey,
        all_namespaces: bool,
        resources: &'a [GroupResource],
    ) -> impl Iterator<Item = &'a Running> + 'a {
        self.running
            .iter()
            .filter(move |(w, _)| {
                w.cluster == quota.cluster
                    && resources.contains(&w.resource)
                    && (all_namespaces || w.namespace.as_deref().is_none_or(|ns| ns == &*quota.namespace))
            })
            .map(|(_, r)| r)
    }

    /// Ids of the watches `quota` reads (among `unsynced` resources) that are still on their
    /// first list and not failing: writing its status now would be overwritten a moment
    /// later (the controller also bounds that wait by how long ago each watch opened).
    pub fn first_lists_pending<'a>(
        &'a self,
        quota: &'a QuotaKey,
        unsynced: &'a [GroupResource],
    ) -> impl Iterator<Item = u64> + 'a {
        self.running
            .iter()
            .filter(move |(w, r)| {
                w.cluster == quota.cluster
                    && unsynced.contains(&w.resource)
                    && w.namespace.as_deref().is_none_or(|ns| ns == &*quota.namespace)
                    && !r.synced
                    && r.failure.is_none()
            })
            .map(|(_, r)| r.id)
    }
}

#[cfg(test)]
mod tests;
