//! Prometheus metrics. All names start with `lazyquota_`, carry their unit, and counters end
//! in `_total`.
//!
//! Counters and the sync-latency histogram are updated as things happen (the controller
//! caches the per-resource counter handles, so counting an event is one atomic add). Gauges
//! that the controller's state already knows — watches, objects and bytes held, pending
//! names, disagreements — are computed at scrape time from a [`Snapshot`].

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicUsize, Ordering},
};

use prometheus::{
    Encoder as _, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder, core::Collector,
};

use lazyquota_index::reconciler::Metric;

use crate::controller::snapshot::Snapshot;

/// A metric family as registered: what the README's metrics table is checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Family {
    /// Its name.
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Its label names, in order.
    pub labels: Vec<String>,
}

/// A registry that remembers every family registered in it: `Registry::gather` leaves out a
/// labelled family until it has a series, so it cannot list them all.
#[derive(Clone, Default)]
pub struct Registrar {
    registry: Registry,
    families: Arc<Mutex<Vec<Family>>>,
}

impl Registrar {
    /// Registers `collector`, a `kind` of metric.
    ///
    /// # Panics
    /// If a name is invalid or already registered: a programming error caught by any test
    /// that builds the metrics.
    pub fn register<C: Collector + Clone + 'static>(&self, kind: &'static str, collector: &C) {
        let mut families = self.families.lock().expect("not poisoned");
        for desc in collector.desc() {
            families.push(Family {
                name: desc.fq_name.clone(),
                kind,
                labels: desc.variable_labels.clone(),
            });
        }
        self.registry
            .register(Box::new(collector.clone()))
            .expect("registered once");
    }

    /// What a scrape reads now (families without a series left out).
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.registry.gather()
    }

    /// Every family registered so far.
    ///
    /// # Panics
    /// Never: the lock is only held to copy.
    pub fn families(&self) -> Vec<Family> {
        self.families.lock().expect("not poisoned").clone()
    }
}

/// The metrics of one lazyquota process.
#[derive(Clone)]
pub struct Metrics {
    registry: Registrar,
    watch_events: IntCounterVec,
    relists: IntCounterVec,
    watch_errors: IntCounterVec,
    quota_syncs: IntCounterVec,
    status_writes: IntCounterVec,
    sync_duration: Histogram,
    discovery_runs: IntCounterVec,
    active_watches: IntGaugeVec,
    watch_clusters: IntGaugeVec,
    watch_failing: IntGaugeVec,
    held_objects: IntGaugeVec,
    held_bytes: IntGaugeVec,
    pending: IntGaugeVec,
    disagreements: IntGaugeVec,
    withheld: IntGaugeVec,
    unresolved: IntGaugeVec,
    shadow_unknown: IntGaugeVec,
    quotas: IntGauge,
    ready: IntGauge,
    cluster_quotas: IntGaugeVec,
    cluster_ready: IntGaugeVec,
    unavailable_groups: IntGaugeVec,
    kcp_engaged: IntGauge,
    kcp_shared: IntGauge,
    kcp_share_overflows: IntCounterVec,
    catch_up_lists: IntCounterVec,
    settle_waits_ended: IntCounterVec,
    charges_expired: IntCounter,
    quota_used: GaugeVec,
    quota_hard: GaugeVec,
    quota_ratio: GaugeVec,
    quota_series_dropped: IntGauge,
    /// Per-quota series at most (of each of used, hard and ratio).
    quota_series_cap: Arc<AtomicUsize>,
    /// 1 while this process leads (or leader election is off), else 0.
    pub leader: IntGauge,
}

/// The per-quota gauges' labels.
const QUOTA_LABELS: &[&str] = &["cluster", "namespace", "quota", "resource"];

fn float_gauge_vec(registry: &Registrar, name: &str, help: &str) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), QUOTA_LABELS).expect("valid metric");
    registry.register("gauge", &g);
    g
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn counter(registry: &Registrar, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry.register("counter", &c);
    c
}

fn int_counter(registry: &Registrar, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric");
    registry.register("counter", &c);
    c
}

fn gauge_vec(registry: &Registrar, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry.register("gauge", &g);
    g
}

/// Registers a plain gauge in `registry`.
///
/// # Panics
/// If the name is invalid or already registered: a programming error caught by any test
/// that builds the metrics.
pub fn gauge(registry: &Registrar, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid metric");
    registry.register("gauge", &g);
    g
}

impl Metrics {
    /// A fresh registry with every lazyquota metric.
    ///
    /// # Panics
    /// If a metric definition is invalid: a programming error caught by any test.
    pub fn new() -> Self {
        let r = Registrar::default();
        let sync_duration = Histogram::with_opts(
            HistogramOpts::new(
                "lazyquota_quota_sync_duration_seconds",
                "Time from taking a quota off the queue to its status being written (or found unchanged).",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
        )
        .expect("valid metric");
        r.register("histogram", &sync_duration);
        Self {
            watch_events: counter(
                &r,
                "lazyquota_watch_events_total",
                "Watch events processed.",
                &["resource"],
            ),
            relists: counter(
                &r,
                "lazyquota_relists_total",
                "Lists (initial and after expiry) started.",
                &["resource"],
            ),
            watch_errors: counter(
                &r,
                "lazyquota_watch_errors_total",
                "Watch failures.",
                &["resource", "reason"],
            ),
            quota_syncs: counter(
                &r,
                "lazyquota_quota_syncs_total",
                "Quota computations by result: unchanged, written, conflict, error, shadow_agree, shadow_disagree, shadow_unknown (some key not computed).",
                &["result"],
            ),
            status_writes: counter(
                &r,
                "lazyquota_status_writes_total",
                "ResourceQuota status writes.",
                &["result"],
            ),
            sync_duration,
            discovery_runs: counter(
                &r,
                "lazyquota_discovery_runs_total",
                "Discovery runs.",
                &["result"],
            ),
            active_watches: gauge_vec(
                &r,
                "lazyquota_active_watches",
                "Open watches by resource and scope (namespaced or cluster).",
                &["resource", "scope"],
            ),
            watch_clusters: gauge_vec(
                &r,
                "lazyquota_watch_clusters",
                "Logical clusters in which a resource is watched.",
                &["resource"],
            ),
            watch_failing: gauge_vec(
                &r,
                "lazyquota_watch_failing",
                "Watches currently failing to sync, by resource and reason; their keys keep previous values.",
                &["resource", "reason"],
            ),
            held_objects: gauge_vec(
                &r,
                "lazyquota_held_objects",
                "Objects held by the usage store.",
                &["resource"],
            ),
            held_bytes: gauge_vec(
                &r,
                "lazyquota_held_bytes",
                "Bytes held by the usage store.",
                &["resource"],
            ),
            pending: gauge_vec(
                &r,
                "lazyquota_pending_resources",
                "Resources some quota names but no API serves (yet), with the number of quotas naming them.",
                &["resource"],
            ),
            disagreements: gauge_vec(
                &r,
                "lazyquota_shadow_disagreements",
                "Shadow mode: 1 for each quota key whose stored status.used differs from lazyquota's.",
                &["cluster", "namespace", "quota", "key"],
            ),
            withheld: gauge_vec(
                &r,
                "lazyquota_withheld_keys",
                "1 for each quota key whose usage is unknown (an object carries a quantity beyond what lazyquota holds): removed from status.used, never written lower.",
                &["cluster", "namespace", "quota", "key"],
            ),
            unresolved: gauge_vec(
                &r,
                "lazyquota_unresolved_keys",
                "1 for each quota key not computed for 30 s or longer (its type not served, or not listed): while status.used lacks it, admission refuses what would charge it.",
                &["cluster", "namespace", "quota", "key"],
            ),
            shadow_unknown: gauge_vec(
                &r,
                "lazyquota_shadow_unknown_keys",
                "Shadow mode: 1 for each quota key lazyquota did not compute (not synced, not served, forbidden, withheld): neither agree nor disagree.",
                &["cluster", "namespace", "quota", "key"],
            ),
            quotas: gauge(&r, "lazyquota_quotas", "ResourceQuotas known."),
            ready: gauge(
                &r,
                "lazyquota_ready",
                "1 once the ResourceQuota watch of every served cluster has listed.",
            ),
            cluster_quotas: gauge_vec(
                &r,
                "lazyquota_cluster_quotas",
                "ResourceQuotas known per served cluster.",
                &["cluster"],
            ),
            kcp_engaged: gauge(
                &r,
                "lazyquota_kcp_engaged_clusters",
                "kcp: logical clusters of the shard served now (those with a ResourceQuota).",
            ),
            kcp_shared: gauge(
                &r,
                "lazyquota_kcp_shared_watches",
                "kcp: shared wildcard watches held (one per type and version that enough logical clusters watch), open or waiting to reopen after a failure.",
            ),
            kcp_share_overflows: counter(
                &r,
                "lazyquota_kcp_share_overflows_total",
                "kcp: subscribers joining a shared watch that buffered more events than their bound while their share was listed, and list it again.",
                &["resource"],
            ),
            catch_up_lists: counter(
                &r,
                "lazyquota_catch_up_lists_total",
                "Consistent lists asked to prove a quiet watch caught up with a quota, by what came of them: matched (the store is the list's state: the keys are written at once), differed (compared again as the watch delivers), failed.",
                &["resource", "result"],
            ),
            charges_expired: int_counter(
                &r,
                "lazyquota_charges_expired_total",
                "Quota charges no object paid for, dropped at --apiserver-request-timeout: creates quota admission charged and then refused (its retry path does), or stored later than that.",
            ),
            settle_waits_ended: counter(
                &r,
                "lazyquota_settle_waits_ended_total",
                "Keys written without proof that the watch of their objects caught up with the quota: the proving list failed or went unanswered, and the settling time ended the wait.",
                &["resource"],
            ),
            quota_used: float_gauge_vec(
                &r,
                "lazyquota_quota_used",
                "Opt-in (--quota-usage-metrics): status.used of each quota key, in units (cores, bytes, objects).",
            ),
            quota_hard: float_gauge_vec(
                &r,
                "lazyquota_quota_hard",
                "Opt-in (--quota-usage-metrics): spec.hard of each quota key, in units.",
            ),
            quota_ratio: float_gauge_vec(
                &r,
                "lazyquota_quota_usage_ratio",
                "Opt-in (--quota-usage-metrics): used / hard of each quota key (absent when hard is 0).",
            ),
            quota_series_dropped: gauge(
                &r,
                "lazyquota_quota_usage_series_dropped",
                "Quota keys left out of the per-quota gauges by --quota-usage-metrics-max-series.",
            ),
            quota_series_cap: Arc::new(AtomicUsize::new(usize::MAX)),
            unavailable_groups: gauge_vec(
                &r,
                "lazyquota_unavailable_api_groups",
                "1 for each API group whose discovery failed (an APIService that does not answer); keys computed from it keep their previous values.",
                &["group"],
            ),
            cluster_ready: gauge_vec(
                &r,
                "lazyquota_cluster_ready",
                "1 once the cluster's ResourceQuota watch has listed.",
                &["cluster"],
            ),
            leader: gauge(
                &r,
                "lazyquota_leader",
                "1 while this process leads (or leader election is off).",
            ),
            registry: r,
        }
    }

    /// The registry, to add process-level metrics.
    pub fn registry(&self) -> &Registrar {
        &self.registry
    }

    /// The event counter of a resource (cache it: one atomic add per event).
    pub fn watch_events(&self, resource: &str) -> IntCounter {
        self.watch_events.with_label_values(&[resource])
    }

    /// Counts a (re)list of a resource.
    pub fn relist(&self, resource: &str) {
        self.relists.with_label_values(&[resource]).inc();
    }

    /// Counts a watch failure.
    pub fn watch_error(&self, resource: &str, reason: &str) {
        self.watch_errors.with_label_values(&[resource, reason]).inc();
    }

    /// Counts a quota sync and observes its duration.
    pub fn quota_sync(&self, result: &str, seconds: f64) {
        self.quota_syncs.with_label_values(&[result]).inc();
        self.sync_duration.observe(seconds);
    }

    /// Counts a status write.
    pub fn status_write(&self, result: &str) {
        self.status_writes.with_label_values(&[result]).inc();
    }

    /// kcp: how many logical clusters are served now.
    pub fn kcp_engaged(&self, clusters: usize) {
        self.kcp_engaged.set(i64::try_from(clusters).unwrap_or(i64::MAX));
    }

    /// kcp: how many shared wildcard watches run now.
    pub fn kcp_shared_watches(&self, watches: usize) {
        self.kcp_shared.set(i64::try_from(watches).unwrap_or(i64::MAX));
    }

    /// Counts what the reconciler asks to be counted (`started`: when the input or tick that
    /// decided it began, for a sync decided at once).
    pub fn count(&self, metric: Metric, started: std::time::Instant) {
        match metric {
            Metric::QuotaSync { result, seconds } => {
                self.quota_sync(result, seconds.unwrap_or_else(|| started.elapsed().as_secs_f64()));
            }
            Metric::StatusWrite(result) => self.status_write(result),
            Metric::Relist(resource) => self.relist(&resource),
            Metric::WatchError { resource, reason } => self.watch_error(&resource, reason),
            Metric::Discovery(result) => self.discovery(result),
            Metric::Engaged(clusters) => self.kcp_engaged(clusters),
            Metric::SharedWatches(watches) => self.kcp_shared_watches(watches),
            Metric::ShareOverflow(resource) => self.kcp_share_overflow(&resource),
            Metric::CatchUpList { resource, result } => {
                self.catch_up_lists
                    .with_label_values(&[resource.as_str(), result])
                    .inc();
            }
            Metric::ChargesExpired(n) => self.charges_expired.inc_by(u64::from(n)),
            Metric::SettleWaitEnded(resource) => {
                self.settle_waits_ended
                    .with_label_values(&[resource.as_str()])
                    .inc();
            }
        }
    }

    /// kcp: counts a joining subscriber's overflow.
    pub fn kcp_share_overflow(&self, resource: &str) {
        self.kcp_share_overflows.with_label_values(&[resource]).inc();
    }

    /// Counts a discovery run.
    pub fn discovery(&self, result: &str) {
        self.discovery_runs.with_label_values(&[result]).inc();
    }

    /// Sets the scrape-time gauges from the controllers' states, one per served cluster.
    pub fn observe_clusters(&self, snapshots: &[Snapshot]) {
        self.cluster_quotas.reset();
        self.cluster_ready.reset();
        for part in snapshots {
            self.cluster_quotas
                .with_label_values(&[part.cluster.as_str()])
                .set(i64::try_from(part.quotas).unwrap_or(i64::MAX));
            self.cluster_ready
                .with_label_values(&[part.cluster.as_str()])
                .set(i64::from(part.quotas_synced));
        }
        self.observe(&Snapshot::merged(snapshots));
    }

    /// Sets the scrape-time gauges from one (possibly merged) controller state.
    pub fn observe(&self, snapshot: &Snapshot) {
        self.observe_quota_usage(snapshot);
        self.quotas
            .set(i64::try_from(snapshot.quotas).unwrap_or(i64::MAX));
        self.ready.set(i64::from(snapshot.quotas_synced));
        self.active_watches.reset();
        self.watch_clusters.reset();
        self.watch_failing.reset();
        let mut clusters: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
            std::collections::BTreeMap::new();
        for watch in &snapshot.watches {
            let resource = watch.key.resource_label();
            let scope = if watch.key.namespace.is_some() {
                "namespaced"
            } else {
                "cluster"
            };
            self.active_watches
                .with_label_values(&[resource.as_str(), scope])
                .inc();
            clusters
                .entry(resource.clone())
                .or_default()
                .insert(watch.key.cluster.to_string());
            if let Some(reason) = &watch.failure {
                self.watch_failing
                    .with_label_values(&[resource.as_str(), reason.as_str()])
                    .inc();
            }
        }
        for (resource, set) in clusters {
            self.watch_clusters
                .with_label_values(&[resource.as_str()])
                .set(i64::try_from(set.len()).unwrap_or(0));
        }
        self.held_objects.reset();
        self.held_bytes.reset();
        for (resource, (objects, bytes)) in &snapshot.held {
            let resource = resource.trim_start_matches("count/");
            self.held_objects
                .with_label_values(&[resource])
                .set(i64::try_from(*objects).unwrap_or(i64::MAX));
            self.held_bytes
                .with_label_values(&[resource])
                .set(i64::try_from(*bytes).unwrap_or(i64::MAX));
        }
        self.unavailable_groups.reset();
        for group in &snapshot.unavailable_groups {
            self.unavailable_groups
                .with_label_values(&[group.as_str()])
                .set(1);
        }
        self.pending.reset();
        for (resource, quotas) in &snapshot.pending {
            let resource = resource.trim_start_matches("count/");
            self.pending
                .with_label_values(&[resource])
                .set(i64::try_from(*quotas).unwrap_or(i64::MAX));
        }
        for (gauge, pairs) in [
            (
                &self.disagreements,
                snapshot.disagreements.keys().collect::<Vec<_>>(),
            ),
            (&self.withheld, snapshot.withheld.iter().collect()),
            (&self.unresolved, snapshot.unresolved.iter().collect()),
            (&self.shadow_unknown, snapshot.shadow_unknown.iter().collect()),
        ] {
            gauge.reset();
            for (quota, key) in pairs {
                // QuotaKey displays as cluster|namespace/name.
                let (cluster, quota) = quota.rsplit_once('|').unwrap_or(("", quota.as_str()));
                let (namespace, name) = quota.split_once('/').unwrap_or(("", quota));
                gauge
                    .with_label_values(&[cluster, namespace, name, key.as_str()])
                    .set(1);
            }
        }
    }

    /// Caps the per-quota gauges at `max` quota keys (the first `max` in cluster, namespace,
    /// quota, key order; the rest are counted in `lazyquota_quota_usage_series_dropped`).
    pub fn set_quota_series_cap(&self, max: usize) {
        self.quota_series_cap.store(max, Ordering::Relaxed);
    }

    /// The opt-in per-quota gauges from `snapshot.quota_usage`.
    fn observe_quota_usage(&self, snapshot: &Snapshot) {
        self.quota_used.reset();
        self.quota_hard.reset();
        self.quota_ratio.reset();
        let mut samples: Vec<_> = snapshot.quota_usage.iter().collect();
        samples.sort_by(|a, b| {
            (&a.cluster, &a.namespace, &a.quota, &a.resource).cmp(&(
                &b.cluster,
                &b.namespace,
                &b.quota,
                &b.resource,
            ))
        });
        let cap = self.quota_series_cap.load(Ordering::Relaxed);
        let dropped = samples.len().saturating_sub(cap);
        self.quota_series_dropped
            .set(i64::try_from(dropped).unwrap_or(i64::MAX));
        for sample in samples.into_iter().take(cap) {
            let labels = [
                sample.cluster.as_str(),
                sample.namespace.as_str(),
                sample.quota.as_str(),
                sample.resource.as_str(),
            ];
            self.quota_hard.with_label_values(&labels).set(sample.hard);
            if let Some(used) = sample.used {
                self.quota_used.with_label_values(&labels).set(used);
                if sample.hard > 0.0 {
                    self.quota_ratio
                        .with_label_values(&labels)
                        .set(used / sample.hard);
                }
            }
        }
    }

    /// The text exposition of every metric.
    ///
    /// # Panics
    /// Never in practice: encoding to memory cannot fail and the format is UTF-8.
    pub fn encode(&self) -> String {
        let mut buffer = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buffer)
            .expect("text encoding to memory");
        String::from_utf8(buffer).expect("the text format is UTF-8")
    }
}

#[cfg(test)]
mod tests;
