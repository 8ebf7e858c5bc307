//! What the controller reports — the snapshot behind metrics and readiness, the `explain`
//! report and per-key usage — read from the reconciler's state at request time.

use std::collections::{BTreeMap, BTreeSet};

use lazyquota_index::keys::Need;

use super::{Controller, QuotaKeyUsage, Snapshot, WatchInfo};

impl Controller {
    /// The state now; gauges are computed here, at scrape time. Built afresh on what the
    /// controller keeps (its cluster and settings): nothing of it stays between scrapes.
    pub(super) fn snapshot(&self) -> Snapshot {
        let r = &self.reconciler;
        let mut snapshot = self.stats.clone();
        let engine = r.engine();
        let books = r.books();
        snapshot.quotas_synced = r.quotas_synced();
        snapshot.quotas = engine.index.len();
        snapshot.watches = r
            .watches()
            .iter()
            .map(|(k, w)| WatchInfo {
                key: k.clone(),
                synced: w.synced,
                failure: w.failure.as_ref().map(|(reason, _)| (*reason).to_owned()),
                lists: w.lists,
                id: w.id,
            })
            .collect();
        snapshot.held = engine.held_by_resource();
        let mut pending: BTreeMap<String, usize> = BTreeMap::new();
        for (cluster, resource) in engine.index.demanded() {
            if engine.resolver.knows(cluster) && engine.resolver.get(cluster, resource).is_none() {
                *pending.entry(resource.object_count_name()).or_default() +=
                    engine.index.computing(cluster, resource).len();
            }
        }
        snapshot.pending = pending.into_iter().collect();
        let unavailable: BTreeSet<&String> =
            r.members().values().flat_map(|m| &m.unavailable_groups).collect();
        snapshot.unavailable_groups = unavailable.into_iter().cloned().collect();
        snapshot.disagreements.clone_from(&books.disagreements);
        snapshot.shadow_verdicts.clone_from(&books.shadow_verdicts);
        snapshot.shadow_unknown.clone_from(&books.shadow_unknown);
        snapshot.withheld.clone_from(&books.withheld);
        snapshot.unresolved.clone_from(&books.unresolved);
        snapshot.quota_usage = if self.config.quota_usage_metrics {
            self.quota_usage()
        } else {
            Vec::new()
        };
        snapshot.clone()
    }

    /// The explain report of every served cluster (the planner's answer, as `lazyquota
    /// explain` gives it), with each type's open watches and, on kcp, whether the shard's
    /// shared watch or the cluster's own serves it now.
    pub(super) fn explain(&self) -> Vec<crate::operate::report::Explain> {
        let r = &self.reconciler;
        let mut reports = Vec::with_capacity(r.members().len());
        for (cluster, member) in r.members() {
            let mut report = crate::operate::report::explain_cluster(r, cluster, None);
            report.workspace.clone_from(&member.workspace);
            for resource in &mut report.resources {
                let open: Vec<_> = r
                    .watches()
                    .iter()
                    .filter(|(k, _)| &k.cluster == cluster && &k.resource == resource.group_resource())
                    .collect();
                resource.running = open
                    .iter()
                    .map(|(key, running)| {
                        let scope = key.namespace.as_deref().unwrap_or("cluster-wide");
                        let state = match (&running.failure, running.synced) {
                            (Some((reason, _)), _) => format!("failing: {reason}"),
                            (None, true) => "synced".to_owned(),
                            (None, false) => "listing".to_owned(),
                        };
                        let source = if running.shared { "shared" } else { "own" };
                        format!("{scope} ({state}, {source})")
                    })
                    .collect();
                if self.config.shared_threshold > 0
                    && self.reconciler.settings().shard
                    && open.iter().any(|(k, _)| k.need == Need::Count)
                {
                    let shared = open.iter().any(|(_, w)| w.shared);
                    resource.source = Some(if shared { "shared" } else { "own" });
                    resource.source_reason =
                        Some(self.reconciler.hub().explain(resource.group_resource(), shared));
                }
            }
            reports.push(report);
        }
        reports
    }

    /// Every quota key's stored `used` and its `hard`, in units.
    fn quota_usage(&self) -> Vec<QuotaKeyUsage> {
        let units = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
            lazyquota_quota::Quantity::parse_k8s(q).map_or(f64::NAN, |q| q.to_f64())
        };
        let mut out = Vec::new();
        for (key, entry) in self.reconciler.engine().index.quotas() {
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
