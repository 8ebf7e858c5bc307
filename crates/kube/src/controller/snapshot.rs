//! What a running controller reports — to metrics, readiness, `explain` and tests — and the
//! handle that asks its loop for it. Plain data, apart from the controller: [`crate::operate::metrics`]
//! reads it without depending on the controller.

use std::collections::{BTreeMap, BTreeSet};

use tokio::sync::{mpsc, oneshot};

use crate::{controller::watch::WatchKey, operate::report::Explain};

/// What the controller reports to metrics, readiness, `explain` and tests.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The cluster this controller serves (empty in a [`Snapshot::merged`] one).
    pub cluster: String,
    /// The ResourceQuota watch has completed its first list.
    pub quotas_synced: bool,
    /// Quotas known.
    pub quotas: usize,
    /// Open watches.
    pub watches: Vec<WatchInfo>,
    /// Objects and bytes held per resource (`count/` name).
    pub held: BTreeMap<String, (usize, usize)>,
    /// Demanded resources not served (yet): (`count/` name, demanding quotas).
    pub pending: Vec<(String, usize)>,
    /// Shadow-mode disagreements now: (quota, key) → (ours, stored).
    pub disagreements: BTreeMap<(String, String), (String, String)>,
    /// Shadow mode: each quota's latest comparison (true: every key computed and agreed).
    pub shadow_verdicts: BTreeMap<String, bool>,
    /// Shadow mode: (quota, key) pairs lazyquota did not compute last time (unknown).
    pub shadow_unknown: BTreeSet<(String, String)>,
    /// With `quota_usage_metrics`: per quota key, `status.used` and `spec.hard` in units.
    pub quota_usage: Vec<QuotaKeyUsage>,
    /// (quota, key) pairs whose usage is unknown (an object carries a quantity beyond what
    /// lazyquota holds): withheld from status.used, never written lower.
    pub withheld: BTreeSet<(String, String)>,
    /// (quota, key) pairs not computed for a while (their type not served, or not listed):
    /// the quota was told with a Warning Event.
    pub unresolved: BTreeSet<(String, String)>,
    /// Whether streaming lists are used.
    pub streaming_lists: bool,
    /// API groups whose discovery failed last time (their resources' keys keep their values).
    pub unavailable_groups: Vec<String>,
}

impl Snapshot {
    /// Several clusters' snapshots as one: counts summed, sets united (their keys already
    /// name the cluster), synced only if every cluster is.
    pub fn merged(parts: &[Snapshot]) -> Snapshot {
        let mut all = Snapshot {
            quotas_synced: !parts.is_empty(),
            ..Snapshot::default()
        };
        let mut pending: BTreeMap<String, usize> = BTreeMap::new();
        for part in parts {
            all.quotas_synced &= part.quotas_synced;
            all.quotas += part.quotas;
            all.watches.extend(part.watches.iter().cloned());
            for (resource, (objects, bytes)) in &part.held {
                let entry = all.held.entry(resource.clone()).or_default();
                entry.0 += objects;
                entry.1 += bytes;
            }
            for (resource, quotas) in &part.pending {
                *pending.entry(resource.clone()).or_default() += quotas;
            }
            all.disagreements
                .extend(part.disagreements.iter().map(|(k, v)| (k.clone(), v.clone())));
            all.shadow_verdicts
                .extend(part.shadow_verdicts.iter().map(|(k, v)| (k.clone(), *v)));
            all.withheld.extend(part.withheld.iter().cloned());
            all.unresolved.extend(part.unresolved.iter().cloned());
            all.shadow_unknown.extend(part.shadow_unknown.iter().cloned());
            all.quota_usage.extend(part.quota_usage.iter().cloned());
            all.streaming_lists |= part.streaming_lists;
            all.unavailable_groups
                .extend(part.unavailable_groups.iter().cloned());
        }
        all.unavailable_groups.sort();
        all.unavailable_groups.dedup();
        all.pending = pending.into_iter().collect();
        all
    }
}

/// One quota key's usage, for the opt-in per-quota gauges.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaKeyUsage {
    /// The cluster.
    pub cluster: String,
    /// The quota's namespace.
    pub namespace: String,
    /// The quota's name.
    pub quota: String,
    /// The key (`requests.cpu`, `count/widgets.example.io`).
    pub resource: String,
    /// `status.used[key]` in units (what admission enforces); absent until written.
    pub used: Option<f64>,
    /// `spec.hard[key]` in units.
    pub hard: f64,
}

/// One open watch, for metrics and `explain`.
#[derive(Clone, Debug)]
pub struct WatchInfo {
    /// The watch.
    pub key: WatchKey,
    /// Listed completely.
    pub synced: bool,
    /// Why it is failing, if it is.
    pub failure: Option<String>,
    /// Lists it has started: 1 plus its relists.
    pub lists: u32,
    /// Its identity: a restarted watch gets a new one.
    pub id: u64,
}

/// What a running controller is asked.
#[derive(Debug)]
pub(crate) enum Request {
    /// Its state now.
    Snapshot(oneshot::Sender<Snapshot>),
    /// Its explain report of every cluster it serves (`/debug/explain`).
    Explain(oneshot::Sender<Vec<Explain>>),
}

/// Asks a running controller for a [`Snapshot`] or its explain report.
#[derive(Clone, Debug)]
pub struct SnapshotHandle(mpsc::Sender<Request>);

impl SnapshotHandle {
    /// A handle whose requests arrive on the controller's side of `requests`.
    pub(crate) fn new(requests: mpsc::Sender<Request>) -> Self {
        Self(requests)
    }

    /// The controller's state now; `None` once the controller has stopped.
    pub async fn get(&self) -> Option<Snapshot> {
        let (tx, rx) = oneshot::channel();
        self.0.send(Request::Snapshot(tx)).await.ok()?;
        rx.await.ok()
    }

    /// What the controller watches now and why, per served cluster: the same report as
    /// `lazyquota explain`, from the running engine, with each type's open watches; `None` once
    /// the controller has stopped.
    pub async fn explain(&self) -> Option<Vec<Explain>> {
        let (tx, rx) = oneshot::channel();
        self.0.send(Request::Explain(tx)).await.ok()?;
        rx.await.ok()
    }
}
