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
//! no watch keeps current. Cost per open watch: 1,303 bytes of heap with the empty partition
//! it holds (its key twice, by key and by id, its namespaces, a few flags; `cargo bench -p
//! lazyquota-index --bench heap`, 1,000 namespaced watches).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    sync::Arc,
};

use lazyquota_quota::Time;

use crate::{
    demand::is_cluster_wide,
    engine::{Applied, Engine, Projected, StoreKind, store_kind},
    fanout::WatchItem,
    keys::{ALL_NAMESPACES, ClusterName, GroupResource, Need, ObjectIds, QuotaKey},
    planner::{self, Mode, PlanSettings, WatchKey},
    resolver::ServedResource,
    store::PartitionKey,
};

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
    pub namespaces: BTreeSet<Arc<str>>,
    /// Eager mode: it holds every namespace it sees.
    pub hold_all: bool,
    /// Listed completely at least once.
    pub synced: bool,
    /// A (re)list is in progress.
    pub relisting: bool,
    /// The last failure (a metric label and the error), until the next list or event.
    pub failure: Option<(&'static str, String)>,
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
            let added: Vec<Arc<str>> = namespaces.difference(&running.namespaces).cloned().collect();
            let removed: Vec<Arc<str>> = running.namespaces.difference(namespaces).cloned().collect();
            if added.iter().chain(&removed).any(|ns| &**ns == ALL_NAMESPACES) {
                // Every namespace joins (or leaves) at once: a relist, not a fill per namespace.
                self.stop(engine, &key, out);
                continue;
            }
            for ns in &removed {
                running.namespaces.remove(ns);
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
                namespaces,
                hold_all,
                synced: false,
                relisting: false,
                failure: None,
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

    /// One item of watch `id` (a stopped watch's last items are ignored); `now` stamps changes
    /// that upstream's filters time.
    pub fn on_item(&mut self, engine: &mut Engine, id: u64, item: Item, now: Time, out: &mut Vec<Action>) {
        let Some(key) = self.by_id.get(&id).cloned() else {
            return;
        };
        let kind = store_kind(&key.resource, key.need);
        if matches!(item, WatchItem::Apply(_) | WatchItem::Delete(_))
            && self.running.get(&key).is_some_and(|r| r.failure.is_some())
        {
            // The watch resumed where it broke off (no relist): an event proves it.
            self.recovered(engine, &key, out);
        }
        let Some(running) = self.running.get(&key) else {
            return;
        };
        match item {
            WatchItem::Init => {
                out.push(Action::Listing(key.clone()));
                for p in Self::partitions_of(engine, &key, running) {
                    engine.begin_relist(kind, &p);
                }
                if let Some(running) = self.running.get_mut(&key) {
                    running.relisting = true;
                    running.lists += 1;
                }
            }
            WatchItem::InitApply(ObjectEvent {
                namespace,
                name,
                object,
                revision,
            }) => {
                self.observe(&key, revision);
                for (p, id, object) in self.targets(&key, &namespace, &name, object) {
                    if self.ensure_held(engine, &key, kind, &p)
                        && let Some(reason) = engine.relist_apply(kind, &p, id, object)
                    {
                        out.push(Action::Malformed {
                            key: key.clone(),
                            namespace: namespace.clone(),
                            name: name.clone(),
                            reason,
                        });
                    }
                }
            }
            WatchItem::InitDone => {
                for p in &Self::partitions_of(engine, &key, running) {
                    engine.finish_relist(kind, p);
                }
                let Some(running) = self.running.get_mut(&key) else {
                    return;
                };
                let first = !running.synced;
                running.synced = true;
                running.relisting = false;
                running.restarting = false;
                if running.failure.is_some() {
                    self.recovered(engine, &key, out);
                } else if first {
                    out.push(Action::Synced(key.clone()));
                }
                // A newly synced (or relisted) resource: its quotas can be computed now.
                out.extend(
                    self.quotas_served_by(engine, &key)
                        .into_iter()
                        .map(Action::Enqueue),
                );
            }
            WatchItem::Apply(ObjectEvent {
                namespace,
                name,
                object,
                revision,
            }) => {
                self.observe(&key, revision);
                for (p, id, object) in self.targets(&key, &namespace, &name, object) {
                    if !self.ensure_held(engine, &key, kind, &p) {
                        continue; // another namespace's object on a cluster-wide watch: dropped at ingest
                    }
                    match engine.apply(kind, &p, id, object, now) {
                        Applied::Replenish => Self::replenish(engine, &key, &p.namespace, out),
                        Applied::Malformed(reason) => out.push(Action::Malformed {
                            key: key.clone(),
                            namespace: namespace.clone(),
                            name: name.clone(),
                            reason,
                        }),
                        Applied::Stored | Applied::NotHeld => {}
                    }
                }
            }
            WatchItem::Delete(ObjectEvent {
                namespace,
                name,
                object,
                revision,
            }) => {
                self.observe(&key, revision);
                for (p, id, _) in self.targets(&key, &namespace, &name, object) {
                    if engine.delete(kind, &p, id) == Applied::Replenish {
                        Self::replenish(engine, &key, &p.namespace, out);
                    }
                }
            }
            WatchItem::Failed(reason, message) => {
                // Objects created while it is down are missing: its partitions stop counting
                // until it delivers again (an event, or a relist's end).
                for p in &Self::partitions_of(engine, &key, running) {
                    engine.set_stale(kind, p, true);
                }
                let Some(running) = self.running.get_mut(&key) else {
                    return;
                };
                let first_failure = running.failure.is_none() && !running.synced;
                let new_reason = running.failure.as_ref().is_none_or(|(r, _)| *r != reason);
                running.failure = Some((reason, message.clone()));
                // A shared watch's subscribers list their share again by themselves (fanout).
                let restart = running.synced && !running.shared && !running.restarting;
                if restart {
                    running.restarting = true;
                    if let Some(served) = engine.resolver.get(&key.cluster, &key.resource) {
                        out.push(Action::Restart {
                            id: running.id,
                            key: key.clone(),
                            served: served.clone(),
                        });
                    }
                }
                if new_reason {
                    // Only the keys computed from this resource keep their stored values;
                    // every other quota and key stays current.
                    let note = format!(
                        "cannot watch {} ({reason}): {message}; until it delivers again, keys computed from it keep the value status.used has (quota admission still charges creates to it)",
                        key.resource_label()
                    );
                    self.emit_for_resource(engine, &key, true, "ResourceUnavailable", &note, out);
                }
                out.push(Action::Failing {
                    key: key.clone(),
                    reason,
                    message,
                    new_reason,
                });
                if first_failure {
                    // Quotas held back for this watch's first list are written now.
                    out.extend(
                        self.quotas_served_by(engine, &key)
                            .into_iter()
                            .map(Action::Enqueue),
                    );
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
        let (ids, running) = (&self.ids, self.running.get(key));
        if !running.is_some_and(|r| r.namespaces.contains(ALL_NAMESPACES)) {
            return vec![(partition(key, namespace), ids.id(name), object)];
        }
        let all = (
            partition(key, ALL_NAMESPACES),
            ids.id(&format!("{namespace}/{name}")),
        );
        if running.is_some_and(|r| r.namespaces.contains(namespace)) {
            // Also demanded in its own namespace (a second quota there): kept twice, once per
            // partition (8 bytes for a count, a second projection for a typed object).
            vec![
                (partition(key, namespace), ids.id(name), object.clone()),
                (all.0, all.1, object),
            ]
        } else {
            vec![(all.0, all.1, object)]
        }
    }

    /// Whether the object's partition is held; eager watches hold every namespace they see.
    fn ensure_held(&self, engine: &mut Engine, key: &WatchKey, kind: StoreKind, p: &PartitionKey) -> bool {
        if engine.holds(kind, p) {
            return true;
        }
        let Some(running) = self.running.get(key) else {
            return false;
        };
        if !running.hold_all {
            return false;
        }
        engine.hold(kind, p.clone());
        if running.relisting {
            engine.begin_relist(kind, p);
        } else {
            engine.finish_relist(kind, p);
        }
        true
    }

    fn replenish(engine: &Engine, key: &WatchKey, namespace: &str, out: &mut Vec<Action>) {
        out.extend(
            engine
                .index
                .dirtied_by(&key.cluster, namespace, &key.resource)
                .into_iter()
                .map(Action::Enqueue),
        );
    }

    /// A fill list finished (its slot is free again): store the namespace's objects, or
    /// restart the watch when the list failed (the heavier, exact path: a relist).
    pub fn on_fill(
        &mut self,
        engine: &mut Engine,
        key: &WatchKey,
        namespace: &Arc<str>,
        listed: Result<Vec<(String, Projected)>, String>,
        shared: &dyn Fn(&GroupResource) -> bool,
        out: &mut Vec<Action>,
    ) {
        self.filling = self.filling.saturating_sub(1);
        self.store_fill(engine, key, namespace, listed, shared, out);
        while self.filling < self.max_fills {
            let Some((key, namespace)) = self.fill_queue.pop_front() else {
                break;
            };
            self.fill(engine, key, namespace, out);
        }
    }

    fn store_fill(
        &mut self,
        engine: &mut Engine,
        key: &WatchKey,
        namespace: &Arc<str>,
        listed: Result<Vec<(String, Projected)>, String>,
        shared: &dyn Fn(&GroupResource) -> bool,
        out: &mut Vec<Action>,
    ) {
        let Some(running) = self.running.get(key) else {
            return; // stopped meanwhile
        };
        if !running.namespaces.contains(namespace) {
            return; // no longer demanded
        }
        let kind = store_kind(&key.resource, key.need);
        let p = partition(key, namespace);
        let failing = running.failure.is_some();
        match listed {
            Ok(objects) => {
                let objects = objects
                    .into_iter()
                    .map(|(name, o)| (self.ids.id(&name), o))
                    .collect();
                let filled = engine.finish_fill(kind, &p, objects);
                if failing {
                    // Exact as listed, but the watch that keeps it current is down: it
                    // counts once the watch delivers again (`recovered`).
                    engine.set_stale(kind, &p, true);
                }
                if let Some(malformed) = filled {
                    for reason in malformed {
                        out.push(Action::Malformed {
                            key: key.clone(),
                            namespace: namespace.to_string(),
                            name: String::new(),
                            reason,
                        });
                    }
                    for quota in engine.index.computing(&key.cluster, &key.resource) {
                        let demand_ns = engine.index.get(&quota).map(|e| e.demand_namespace().clone());
                        if demand_ns.as_ref() == Some(namespace) {
                            out.push(Action::Enqueue(quota));
                        }
                    }
                }
            }
            Err(error) => {
                out.push(Action::FillFailed {
                    key: key.clone(),
                    namespace: namespace.clone(),
                    error,
                });
                self.stop(engine, key, out);
                let (cluster, resource) = (key.cluster.clone(), key.resource.clone());
                self.sync(engine, &cluster, &resource, shared, out);
            }
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
                        .is_some_and(|e| running.namespaces.contains(e.demand_namespace()))
            })
            .collect()
    }

    /// A failing watch delivers again: clear its failure, say so on its quotas.
    fn recovered(&mut self, engine: &mut Engine, key: &WatchKey, out: &mut Vec<Action>) {
        if let Some(running) = self.running.get(key) {
            let kind = store_kind(&key.resource, key.need);
            for p in &Self::partitions_of(engine, key, running) {
                engine.set_stale(kind, p, false);
            }
        }
        if let Some(running) = self.running.get_mut(key) {
            running.failure = None;
        }
        out.push(Action::Recovered(key.clone()));
        // Its keys count again.
        out.extend(
            self.quotas_served_by(engine, key)
                .into_iter()
                .map(Action::Enqueue),
        );
        let note = format!("{} is watched again; its keys are current", key.resource_label());
        self.emit_for_resource(engine, key, false, "ResourceAvailable", &note, out);
    }

    fn emit_for_resource(
        &self,
        engine: &Engine,
        key: &WatchKey,
        warning: bool,
        reason: &'static str,
        note: &str,
        out: &mut Vec<Action>,
    ) {
        for quota in self.quotas_served_by(engine, key) {
            out.push(Action::Event {
                quota,
                warning,
                reason,
                note: note.to_owned(),
            });
        }
    }

    fn observe(&mut self, key: &WatchKey, revision: Option<u64>) {
        if let (Some(running), Some(revision)) = (self.running.get_mut(key), revision) {
            running.observed = running.observed.max(revision);
        }
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
