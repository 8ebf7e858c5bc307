//! The controller's settings, and the reconciler's taken from them.

use std::time::Duration;

use lazyquota_index::{keys::ClusterName, planner::Mode, reconciler::Settings};
use lazyquota_quota::FeatureGates;

/// Controller settings. Defaults follow upstream KCM where it has one.
#[derive(Clone, Debug)]
pub struct Config {
    /// The logical cluster this controller serves.
    pub cluster: ClusterName,
    /// Lazy (constrained types only) or eager (everything, like upstream).
    pub mode: Mode,
    /// Full recalculation of every quota (`--resource-quota-sync-period`, 5m; zero disables).
    pub resync_period: Duration,
    /// Status computations and writes in flight at once (`--concurrent-resource-quota-syncs`).
    pub concurrency: usize,
    /// Compute and report, never write.
    pub shadow: bool,
    /// Above this many demanding namespaces, a resource is watched cluster-wide (filtered at
    /// ingest) instead of with one watch per namespace.
    pub namespace_watch_threshold: usize,
    /// Safety-net discovery poll (CRD and APIService changes trigger discovery at once).
    pub discovery_poll: Duration,
    /// How long a quota charge no stored object pays for is kept (kube-apiserver's
    /// `--request-timeout`; [`Settings::charge_bound`]).
    pub charge_bound: Duration,
    /// Feature gates of the KCM whose results are mirrored.
    pub gates: FeatureGates,
    /// Streaming lists: `Some(choice)`, or `None` to probe the server once. Off by default:
    /// kube-runtime asks for them at resourceVersion 0 ("any"), which an apiserver watch cache
    /// that cannot convert a CRD's objects answered with an empty list — a false `0` —
    /// where a paginated consistent list fails and withholds the key, as it should.
    pub streaming_lists: Option<bool>,
    /// This instance's name in Events it records (a pod name).
    pub instance: String,
    /// The cluster is a kcp logical cluster: discovery is re-run on APIBinding changes (kcp
    /// serves no APIServices).
    pub kcp: bool,
    /// kcp: the logical cluster's workspace path (`root:org:team`), named in Events.
    pub workspace: Option<String>,
    /// Report each quota's `used` and `hard` per key in the snapshot (for the opt-in
    /// `lazyquota_quota_used`/`_hard`/`_usage_ratio` gauges).
    pub quota_usage_metrics: bool,
    /// kcp shard: a type counted in this many logical clusters is served by one shared
    /// wildcard watch (`--kcp-shared-watch-threshold`); 0: never.
    pub shared_threshold: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cluster: ClusterName::new("default"),
            mode: Mode::Lazy,
            resync_period: Duration::from_mins(5),
            concurrency: 5,
            shadow: false,
            namespace_watch_threshold: 8,
            discovery_poll: Duration::from_mins(5),
            charge_bound: Duration::from_millis(lazyquota_index::charges::DEFAULT_BOUND_MS),
            gates: FeatureGates::default(),
            streaming_lists: Some(false),
            instance: "lazyquota".into(),
            kcp: false,
            workspace: None,
            quota_usage_metrics: false,
            shared_threshold: 0,
        }
    }
}

/// The reconciler's settings for a controller with `config` (`shard`: every logical cluster of
/// a kcp shard).
pub(super) fn settings(config: &Config, shard: bool) -> Settings {
    Settings {
        cluster: config.cluster.clone(),
        mode: config.mode,
        resync_period: config.resync_period,
        concurrency: config.concurrency,
        shadow: config.shadow,
        namespace_watch_threshold: config.namespace_watch_threshold,
        discovery_poll: config.discovery_poll,
        gates: config.gates,
        kcp: config.kcp,
        shard,
        shared_threshold: config.shared_threshold,
        shared_buffer: lazyquota_index::reconciler::MAX_PENDING,
        workspace: config.workspace.clone(),
        charge_bound: config.charge_bound,
        lower_pace: lazyquota_index::reconciler::LOWER_PACE,
    }
}
