//! What a discovery's answer changes: the resolver, the watches of changed and newly served
//! types, and the Events on quotas whose API group is unavailable.

use std::collections::BTreeSet;

use tracing::{debug, warn};

use super::{Effect, Metric, Now, Reconciler};
use crate::{
    keys::{ClusterName, GroupResource, QuotaKey},
    planner,
    resolver::{ResolverChange, ServedResource},
};

/// What one discovery of a cluster found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Discovered {
    /// Every resource served, at the version to watch.
    pub served: Vec<ServedResource>,
    /// Groups whose discovery failed in this run (their previous results are kept).
    pub failed_groups: Vec<String>,
    /// Groups the server lists that this run did not ask for (an [`Effect::Discover`] with
    /// `groups`): their previous results are kept, and a full discovery follows.
    pub skipped_groups: Vec<String>,
}

/// After a discovery that skipped groups (a workspace's first, narrowed to its quotas'
/// groups), the full one: soon enough for a quota naming another group, late enough not to
/// compete with the first list and status write it made way for.
const FULL_AFTER_NARROWED: std::time::Duration = std::time::Duration::from_secs(1);

impl Reconciler {
    pub(super) fn on_discovery(
        &mut self,
        cluster: &ClusterName,
        result: Result<Discovered, String>,
        now: Now,
    ) {
        let discovered = match result {
            Ok(d) => d,
            Err(error) => {
                self.effects.push(Effect::Metric(Metric::Discovery("error")));
                warn!(%cluster, %error, "discovery failed; keeping what was known");
                return;
            }
        };
        self.effects.push(Effect::Metric(Metric::Discovery("ok")));
        if let Some(member) = self.members.get_mut(cluster) {
            if !discovered.failed_groups.is_empty() {
                warn!(%cluster, groups = ?discovered.failed_groups, "API groups unavailable; keys computed from them are not written lower until they are back");
            }
            member.unavailable_groups = discovered.failed_groups.iter().cloned().collect();
        }
        let first = !self.engine.resolver.knows(cluster);
        let mut kept = discovered.failed_groups.clone();
        kept.extend(discovered.skipped_groups.iter().cloned());
        if !discovered.skipped_groups.is_empty() {
            self.discoveries
                .incomplete(cluster, now.instant + FULL_AFTER_NARROWED);
        }
        let changes = self.engine.discovered(cluster, discovered.served, &kept);
        if self.shard.is_some() {
            // The types its quotas name, for guesses in workspaces engaged later.
            for resource in &self.demanded_in(cluster) {
                self.engine.resolver.remember(cluster, resource);
            }
        }
        let mut touched: BTreeSet<GroupResource> = BTreeSet::new();
        for change in changes {
            debug!(?change, "discovery change");
            let (ResolverChange::Served(r) | ResolverChange::Gone(r) | ResolverChange::Changed(r)) = &change;
            if let ResolverChange::Changed(_) | ResolverChange::Gone(_) = change {
                // A version change restarts the watch; a resource that is gone stops it.
                let mut out = Vec::new();
                self.watches.stop_all_of(&mut self.engine, cluster, r, &mut out);
                self.carry_out(out, now);
            }
            touched.insert(r.clone());
        }
        touched.extend(planner::eager_resources(
            &self.engine,
            &self.settings.plan(),
            cluster,
        ));
        for resource in &touched {
            self.sync_watches(cluster, resource, now);
            // A newly served resource gives its quotas an evaluator: compute them now.
            for key in self.engine.index.computing(cluster, resource) {
                self.queue.add(key, now.instant);
            }
        }
        if first {
            // The cluster's quotas were held back until now (see `sync_quota`).
            let mut keys: Vec<QuotaKey> = self
                .engine
                .index
                .quotas()
                .map(|(k, _)| k)
                .filter(|k| &k.cluster == cluster)
                .cloned()
                .collect();
            keys.sort_unstable();
            for key in keys {
                self.queue.add(key, now.instant);
            }
        }
        self.report_unavailable(cluster);
    }

    /// Tells each quota of `cluster` that names a resource of an unavailable API group, once
    /// per outage, with an Event (and, when the group is back, that it is available again).
    pub(super) fn report_unavailable(&mut self, cluster: &ClusterName) {
        let Some(member) = self.members.get(cluster) else {
            return;
        };
        let mut now_unavailable = BTreeSet::new();
        for resource in self.engine.index.demanded_in(cluster) {
            if member.unavailable_groups.contains(&resource.group) {
                for quota in self.engine.index.computing(cluster, resource) {
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
            self.emit(quota, true, "ResourceUnavailable", note);
        }
        for (quota, resource) in &back {
            if self.engine.index.get(quota).is_some() {
                let note = format!(
                    "{}: API group {:?} is available again",
                    resource.object_count_name(),
                    resource.group
                );
                self.emit(quota, false, "ResourceAvailable", note);
            }
        }
        if let Some(member) = self.members.get_mut(cluster) {
            member.told_unavailable = now_unavailable;
        }
    }
}
