//! What a watch's items and its fills do: objects into the Engine's stores (each to its
//! partitions, held or not), a list's end, a failure and a recovery, and the quotas to
//! compute again.

use std::sync::Arc;

use lazyquota_quota::Time;

use crate::{
    engine::{Applied, Engine, Projected, StoreKind, store_kind},
    fanout::WatchItem,
    keys::{ALL_NAMESPACES, GroupResource},
    planner::WatchKey,
    store::PartitionKey,
};

use super::{Action, Item, ObjectEvent, Watches, partition};

impl Watches {
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
                    match engine.apply(kind, &p, id, object, revision, now) {
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
                // Before its cluster's first discovery the watch runs on a guess
                // (`Resolver::guess`): a failure may only mean the type is not served there,
                // which the discovery is about to say. Told at its first failure after the
                // discovery answered (a failing watch keeps failing as it retries).
                let told =
                    running.failure_told && running.failure.as_ref().is_some_and(|(r, _)| *r == reason);
                let new_reason = !told && engine.resolver.knows(&key.cluster);
                running.failure = Some((reason, message.clone()));
                running.failure_told |= new_reason;
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
        // A fill is exact as listed, but only the watch keeps it current: while the watch is
        // failing, or has not finished its (re)list (a new kcp subscriber waiting for its
        // shared watch's list, which a restart's wait can hold back for seconds), objects
        // stored after the fill's list would be missing. Its partition counts once the watch
        // delivers (`recovered`) or its list ends (`finish_relist`).
        let failing = running.failure.is_some() || !running.synced || running.relisting;
        match listed {
            Ok(objects) => {
                let objects = objects
                    .into_iter()
                    .map(|(name, o)| (self.ids.id(&name), o))
                    .collect();
                let filled = engine.finish_fill(kind, &p, objects);
                if failing {
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

    /// A failing watch delivers again: clear its failure, say so on its quotas.
    fn recovered(&mut self, engine: &mut Engine, key: &WatchKey, out: &mut Vec<Action>) {
        if let Some(running) = self.running.get(key) {
            let kind = store_kind(&key.resource, key.need);
            for p in &Self::partitions_of(engine, key, running) {
                engine.set_stale(kind, p, false);
            }
        }
        let told = self.running.get_mut(key).is_some_and(|running| {
            running.failure = None;
            std::mem::take(&mut running.failure_told)
        });
        out.push(Action::Recovered(key.clone()));
        // Its keys count again.
        out.extend(
            self.quotas_served_by(engine, key)
                .into_iter()
                .map(Action::Enqueue),
        );
        if told {
            let note = format!("{} is watched again; its keys are current", key.resource_label());
            self.emit_for_resource(engine, key, false, "ResourceAvailable", &note, out);
        }
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
}
