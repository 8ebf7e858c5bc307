//! Quotas and, on a kcp shard, which logical clusters are served: the quota watch's events,
//! engaging a logical cluster that gained a quota and letting one go.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceQuota;
use tracing::{debug, info, warn};

use super::{CLUSTER_ANNOTATION, Effect, Member, Metric, Now, Reconciler, STATUS_RECHECK_DELAY};
use crate::keys::{ClusterName, QuotaKey};

/// An event of the ResourceQuota watch (kube-runtime's watcher events, typed).
#[derive(Debug)]
pub enum QuotaEvent {
    /// A relist starts: the quotas that follow replace what is known.
    RelistStarted,
    /// A quota of the relist.
    Relisted(ResourceQuota),
    /// The relist ended.
    RelistDone,
    /// A quota was created or changed.
    Applied(ResourceQuota),
    /// A quota was deleted.
    Deleted(ResourceQuota),
}

/// kcp: an event of the wildcard LogicalCluster watch, read down to what membership needs.
#[derive(Debug)]
pub enum ClusterEvent {
    /// A relist starts.
    RelistStarted,
    /// A LogicalCluster of the relist.
    Relisted {
        /// Its name (`None`: without the cluster annotation).
        cluster: Option<ClusterName>,
        /// Its phase.
        phase: String,
        /// Its workspace path, if annotated.
        path: Option<String>,
    },
    /// The relist ended.
    RelistDone,
    /// A LogicalCluster was created or changed.
    Applied {
        /// Its name (`None`: without the cluster annotation).
        cluster: Option<ClusterName>,
        /// Its phase.
        phase: String,
        /// Its workspace path, if annotated.
        path: Option<String>,
    },
    /// A LogicalCluster was deleted.
    Deleted(Option<ClusterName>),
}

/// The logical cluster a wildcard quota belongs to.
fn cluster_of(quota: &ResourceQuota) -> Option<ClusterName> {
    quota
        .metadata
        .annotations
        .as_ref()?
        .get(CLUSTER_ANNOTATION)
        .map(|c| ClusterName::new(c))
}

fn namespace_and_name(quota: &ResourceQuota) -> (String, String) {
    (
        quota.metadata.namespace.clone().unwrap_or_default(),
        quota.metadata.name.clone().unwrap_or_default(),
    )
}

impl Reconciler {
    /// The quota's key: in the served cluster, or on a kcp shard in the logical cluster its
    /// `kcp.io/cluster` annotation names (`None` without one).
    fn quota_key(&self, quota: &ResourceQuota) -> Option<QuotaKey> {
        let cluster = if self.shard.is_some() {
            cluster_of(quota)?
        } else {
            self.settings.cluster.clone()
        };
        let (namespace, name) = namespace_and_name(quota);
        Some(QuotaKey::new(&cluster, &namespace, &name))
    }

    fn track_membership(&mut self, event: &QuotaEvent) {
        let Some(membership) = &mut self.shard else { return };
        let key = |q: &ResourceQuota| {
            let (ns, name) = namespace_and_name(q);
            Some((cluster_of(q)?, ns, name))
        };
        match event {
            QuotaEvent::RelistStarted => membership.quota_relist_started(),
            QuotaEvent::Relisted(q) => {
                if let Some((c, ns, name)) = key(q) {
                    membership.quota_relisted(c, ns, name);
                }
            }
            QuotaEvent::RelistDone => membership.quota_relist_done(),
            QuotaEvent::Applied(q) => {
                if let Some((c, ns, name)) = key(q) {
                    membership.quota_applied(c, &ns, &name);
                }
            }
            QuotaEvent::Deleted(q) => {
                if let Some((c, ns, name)) = key(q) {
                    membership.quota_deleted(&c, &ns, &name);
                }
            }
        }
    }

    pub(super) fn on_quota_event(&mut self, event: QuotaEvent, now: Now) {
        self.track_membership(&event);
        match event {
            QuotaEvent::RelistStarted => self.quota_relist = Some(Vec::new()),
            QuotaEvent::Relisted(quota) => match &mut self.quota_relist {
                Some(list) => list.push(quota),
                None => self.apply_quota(&quota, now),
            },
            QuotaEvent::RelistDone => self.quotas_listed(now),
            QuotaEvent::Applied(quota) => {
                debug!(quota = ?self.quota_key(&quota), resource_version = ?quota.metadata.resource_version, "quota event");
                self.apply_quota(&quota, now);
            }
            QuotaEvent::Deleted(quota) => {
                if let Some(key) = self.quota_key(&quota) {
                    self.delete_quota(&key, now);
                }
            }
        }
        self.engage(now);
    }

    /// A relist of the quota watch ended: what it listed replaces what was known, cluster by
    /// cluster; every quota is computed once (like upstream's first `enqueueAll`).
    fn quotas_listed(&mut self, now: Now) {
        let quotas = self.quota_relist.take().unwrap_or_default();
        let before: Vec<QuotaKey> = self.engine.index.quotas().map(|(k, _)| k.clone()).collect();
        let mut by_cluster: BTreeMap<ClusterName, Vec<(QuotaKey, &ResourceQuota)>> = self
            .engine
            .index
            .quotas()
            .map(|(k, _)| (k.cluster.clone(), Vec::new()))
            .collect();
        by_cluster.entry(self.settings.cluster.clone()).or_default();
        for quota in &quotas {
            let Some(key) = self.quota_key(quota) else {
                warn!(quota = ?quota.metadata.name, "a wildcard ResourceQuota without the kcp.io/cluster annotation; ignored");
                continue;
            };
            by_cluster
                .entry(key.cluster.clone())
                .or_default()
                .push((key, quota));
        }
        let mut changes = Vec::new();
        let at = self.ms(now.instant);
        for (cluster, keyed) in by_cluster {
            let reset = self.engine.reset_quotas(&cluster, keyed);
            changes.extend(reset.changes);
            // Noted at the relist's version, as a fresh read's jump is (see `apply_quota_from`).
            for (key, by) in reset.raised {
                self.engine.note_charge(&key, by, at, self.bound_ms());
            }
            for (key, stored) in reset.carried {
                if !crate::mutation::active(crate::mutation::Mutation::LateObjectNotCounted) {
                    self.engine.note_carried(&key, stored, at, self.bound_ms());
                }
            }
            for key in reset.moved {
                self.engine.note_view(&key, at);
            }
            for key in reset.respecified {
                self.engine.note_spec(&key, at);
            }
            for key in reset.renewed {
                self.forget_books(&key);
            }
        }
        for (key, entry) in self.engine.index.quotas() {
            for problem in &entry.payload.spec.problems {
                warn!(quota = %key, %problem, "quota spec problem; other keys and quotas are unaffected");
            }
        }
        for key in before {
            if self.engine.index.get(&key).is_none() {
                // Deleted while the watch was down: as `delete_quota` forgets it.
                self.queue.remove(&key);
                self.forget_books(&key);
            }
        }
        self.apply_demand(&changes, now);
        self.quotas_synced = true;
        self.enqueue_all(now.instant);
        info!(quotas = self.engine.index.len(), "ResourceQuotas listed");
    }

    pub(super) fn delete_quota(&mut self, key: &QuotaKey, now: Now) {
        let changes = self.engine.delete_quota(key);
        self.queue.remove(key);
        self.forget_books(key);
        self.apply_demand(&changes, now);
        debug!(quota = %key, "quota deleted");
    }

    /// Forgets the shadow verdicts and withheld keys recorded for a quota that is gone or
    /// was replaced by another object of its name.
    fn forget_books(&mut self, key: &QuotaKey) {
        let name = key.to_string();
        self.books.forget_quotas(|q| q == name);
        self.proofs.forget(key);
        self.conflicted.remove(key);
        self.last_write.remove(key);
    }

    pub(super) fn apply_quota(&mut self, quota: &ResourceQuota, now: Now) {
        let Some(key) = self.quota_key(quota) else {
            warn!(quota = ?quota.metadata.name, "a wildcard ResourceQuota without the kcp.io/cluster annotation; ignored");
            return;
        };
        if self
            .engine
            .is_older_than_known(&key, quota.metadata.resource_version.as_deref())
            && !crate::mutation::active(crate::mutation::Mutation::OldWritePolicy)
        {
            // A write's response or a fresh read is ahead of the watch: this event is in it.
            debug!(quota = %key, resource_version = ?quota.metadata.resource_version, "older than the status held; skipped");
            return;
        }
        let before = self
            .engine
            .index
            .get(&key)
            .and_then(|e| e.payload.resource_version.clone());
        let update = self.engine.apply_quota(key.clone(), quota);
        if update.renewed {
            debug!(quota = %key, uid = ?quota.metadata.uid, "another object under a known quota's name; nothing of the old one carries over");
            self.forget_books(&key);
        }
        // Charges first: credits of arrivals before the new version may pay them.
        if !update.carried.is_empty()
            && !crate::mutation::active(crate::mutation::Mutation::LateObjectNotCounted)
        {
            // New to lazyquota with a status: charges made before it watched may be in it.
            let at = self.ms(now.instant);
            self.engine
                .note_carried(&key, update.carried, at, self.bound_ms());
        }
        if !update.raised.is_empty() {
            // Someone else raised status.used (admission charging creates): until objects pay
            // it, no key of it is lowered below what is counted plus this (crate::charges).
            let at = self.ms(now.instant);
            // A fresh read's jump over versions the watch has not delivered is noted at its
            // version: objects stored before it may be counted already, so only arrivals
            // after it pay it (or the bound drops it) — higher for a while, never lower.
            self.engine.note_charge(&key, update.raised, at, self.bound_ms());
        }
        if quota.metadata.resource_version != before {
            // A change (our own write's echo is recorded already).
            let at = self.ms(now.instant);
            self.engine.note_view(&key, at);
            if self.conflicted.remove(&key).is_some() {
                // The version a write conflicted with is here: computed again from it.
                self.queue.add(key.clone(), now.instant);
            }
        }
        if update.settle {
            // New, its spec changed or status.hard gained a key: objects admitted before
            // admission charged a key may be on their way.
            let at = self.ms(now.instant);
            self.engine.note_spec(&key, at);
        }
        for problem in &update.problems {
            warn!(quota = %key, %problem, "quota spec problem; other keys and quotas are unaffected");
            self.emit(&key, true, "InvalidSpec", problem.to_string());
        }
        let demand_changed = !update.changes.is_empty();
        self.apply_demand(&update.changes, now);
        if demand_changed
            && self
                .members
                .get(&key.cluster)
                .is_some_and(|m| !m.unavailable_groups.is_empty())
        {
            self.report_unavailable(&key.cluster);
        }
        if update.recompute {
            self.queue.add(key, now.instant);
        } else if update.recheck {
            // Check it once the watches have caught up (a burst of charges makes one check).
            self.queue.add_at(key, now.instant + STATUS_RECHECK_DELAY);
        }
    }

    // ---- kcp: which logical clusters are served ---------------------------------------------

    pub(super) fn on_logical_cluster(&mut self, event: ClusterEvent, now: Now) {
        if let Some(membership) = &mut self.shard {
            match event {
                ClusterEvent::RelistStarted => membership.cluster_relist_started(),
                ClusterEvent::Relisted { cluster, phase, path } => {
                    if let Some(cluster) = cluster {
                        if let Some(path) = path {
                            membership.record_path(cluster.clone(), path);
                        }
                        membership.cluster_relisted(cluster, phase);
                    }
                }
                ClusterEvent::RelistDone => membership.cluster_relist_done(),
                ClusterEvent::Applied { cluster, phase, path } => {
                    if let Some(cluster) = cluster {
                        if let Some(path) = path {
                            membership.record_path(cluster.clone(), path);
                        }
                        membership.cluster_applied(cluster, phase);
                    }
                }
                ClusterEvent::Deleted(cluster) => {
                    if let Some(cluster) = cluster {
                        membership.cluster_deleted(cluster);
                    }
                }
            }
        }
        self.engage(now);
    }

    /// Brings the served logical clusters to what the membership wants: a cluster with a quota
    /// is discovered and served; one whose last quota (or LogicalCluster) went is let go.
    fn engage(&mut self, now: Now) {
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
            self.disengage(&cluster, now);
        }
        for (cluster, member) in new {
            self.discoveries.add(cluster.clone(), now.instant);
            self.members.insert(cluster, member);
        }
        if changed {
            self.effects
                .push(Effect::Metric(Metric::Engaged(self.members.len())));
        }
    }

    /// Lets `cluster` go: its watches stop, its discovery and Event series are forgotten; its
    /// quotas stay known (the wildcard watch keeps them) but are neither computed nor written.
    fn disengage(&mut self, cluster: &ClusterName, now: Now) {
        let workspace = self.members.remove(cluster).and_then(|m| m.workspace);
        info!(%cluster, workspace = workspace.as_deref().unwrap_or_default(), "no ResourceQuota left (or the logical cluster is going): letting it go");
        self.discoveries.remove(cluster);
        let hub = &self.hub;
        let mut out = Vec::new();
        self.watches.forget_cluster(
            &mut self.engine,
            cluster,
            &|r: &crate::keys::GroupResource| hub.is_shared(r),
            &mut out,
        );
        self.carry_out(out, now);
        // Whatever demand its stopped watches did not withdraw goes with it.
        self.hub.withdraw(cluster);
        self.reshare(now);
        // Its quotas (if the logical cluster is going) are no longer computed: no verdict of
        // theirs stands.
        let prefix = format!("{cluster}|");
        self.books.forget_quotas(|q| q.starts_with(&prefix));
        self.proofs.forget_cluster(cluster);
        self.conflicted.retain(|q, _| q.cluster != *cluster);
        self.last_write.retain(|q, _| q.cluster != *cluster);
        self.effects.push(Effect::Disengaged(cluster.clone()));
    }
}
