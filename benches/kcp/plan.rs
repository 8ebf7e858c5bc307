//! What a run is: its arguments, the plan of workspaces, exports and bindings they give, the
//! three configurations, and the figures and results each reading fills in.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use lazyquota_testenv::kcp::ExportedType;

use crate::latency::Samples;

/// The namespace every consumer keeps its objects and quotas in.
pub(crate) const NS: &str = "bench";
/// The quota of a quota'd consumer.
pub(crate) const STANDING: &str = "standing";
/// The latency samples' quota.
pub(crate) const SAMPLE: &str = "sample";
/// spec.hard of every quota: never reached.
pub(crate) const HARD: &str = "100000";
/// The quota of the exact-heap series.
pub(crate) const ENGAGED: &str = "engaged";
/// How long one latency sample may take before the run fails.
pub(crate) const LATENCY_PATIENCE: Duration = Duration::from_mins(2);
/// Samples in the stability window.
pub(crate) const WINDOW: usize = 5;

/// The command line's flags (each bool a flag of its own).
#[allow(clippy::struct_excessive_bools)]
pub(crate) struct Args {
    pub(crate) workspaces: usize,
    pub(crate) exports: usize,
    pub(crate) providers: usize,
    pub(crate) bindings_per_workspace: usize,
    pub(crate) objects: usize,
    pub(crate) quota_percent: usize,
    /// Latency samples per case (cold, shared, watched) at each sampled step.
    pub(crate) samples: usize,
    /// Only the last step, and only its first syncs and latency samples (no readings).
    pub(crate) latency_only: bool,
    /// Pairs of readings of kcp with and without its quota controller at the last step,
    /// interleaved (its cost's spread); 0: none.
    pub(crate) cost_runs: usize,
    pub(crate) concurrency: usize,
    pub(crate) settle: Duration,
    pub(crate) settle_max: Duration,
    /// The fixed part of a reading of lazyquota after it listed (first sync, latency samples):
    /// past the HTTP client's 90 s pool idle timeout, so that the connections of its initial
    /// lists are closed and the reading is lazyquota's steady state.
    pub(crate) lq_settle: Duration,
    pub(crate) poll: Duration,
    /// lazyquota's `--kcp-shared-watch-threshold`.
    pub(crate) shared_threshold: usize,
    /// Steps of the exact-heap series (engaged workspaces 0, W/n, …, W); 0 skips it.
    pub(crate) exact_steps: usize,
    /// `--exact-baseline LABEL=PATH`: the exact-heap series again with another lazyquota
    /// build (an earlier commit's), on the same shard and data right after the first.
    pub(crate) exact_baseline: Option<(String, PathBuf)>,
    /// `--exact-own-watches`: the exact-heap series again with `--kcp-shared-watch-threshold 0`
    /// (every engaged workspace its own watch, never a share of a shared one).
    pub(crate) exact_own_watches: bool,
    /// Before each configuration's samples, every sampled type listed once (see
    /// `latency::touch_types`).
    pub(crate) touch_types: bool,
    /// `--type-gap MS`: a sample waits until this long after the end of the previous sample of
    /// its type (both configurations alike); zero: no wait.
    pub(crate) type_gap: Duration,
    pub(crate) out: PathBuf,
    pub(crate) quick: bool,
    /// `--shards N` (N ≥ 2): the run across a sharded kcp (`crate::sharded`); 0: one shard.
    pub(crate) shards: usize,
}

pub(crate) fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

impl Args {
    pub(crate) fn parse() -> Self {
        let given: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
        let quick = given.iter().any(|a| a == "--quick");
        let latency_only = given.iter().any(|a| a == "--latency-only");
        let mut a = if quick {
            Self {
                workspaces: 10,
                exports: 3,
                providers: 3,
                bindings_per_workspace: 1,
                objects: 2,
                quota_percent: 10,
                samples: 3,
                latency_only: false,
                cost_runs: 0,
                concurrency: 8,
                settle: Duration::from_secs(2),
                settle_max: Duration::from_secs(30),
                lq_settle: Duration::from_secs(2),
                shared_threshold: 2,
                exact_steps: 2,
                exact_baseline: None,
                exact_own_watches: false,
                touch_types: false,
                type_gap: Duration::ZERO,
                poll: Duration::from_millis(500),
                out: std::env::temp_dir().join("lazyquota-bench-kcp-quick"),
                quick,
                shards: 0,
            }
        } else {
            Self {
                workspaces: 200,
                exports: 20,
                providers: 0, // = exports unless given
                bindings_per_workspace: 5,
                objects: 3,
                quota_percent: 10,
                samples: 100,
                latency_only: false,
                cost_runs: 0,
                concurrency: 12,
                settle: Duration::from_secs(20),
                settle_max: Duration::from_mins(3),
                lq_settle: Duration::from_secs(100),
                shared_threshold: 2,
                exact_steps: 4,
                exact_baseline: None,
                exact_own_watches: false,
                touch_types: false,
                type_gap: Duration::ZERO,
                poll: Duration::from_secs(2),
                out: repo().join("benches/results/kcp"),
                quick,
                shards: 0,
            }
        };
        let mut named = Vec::new();
        let mut it = given.into_iter();
        while let Some(flag) = it.next() {
            named.push(flag.clone());
            let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
            let num = |v: String| v.parse::<usize>().unwrap_or_else(|_| panic!("not a number: {v}"));
            match flag.as_str() {
                "--quick" | "--latency-only" => {}
                "--workspaces" => a.workspaces = num(value()),
                "--exports" => a.exports = num(value()),
                "--providers" => a.providers = num(value()),
                "--bindings-per-workspace" => a.bindings_per_workspace = num(value()),
                "--objects" => a.objects = num(value()),
                "--quota-percent" => a.quota_percent = num(value()),
                "--samples" => a.samples = num(value()),
                "--concurrency" => a.concurrency = num(value()).max(1),
                "--settle" => a.settle = Duration::from_secs(num(value()) as u64),
                "--settle-max" => a.settle_max = Duration::from_secs(num(value()) as u64),
                "--lq-settle" => a.lq_settle = Duration::from_secs(num(value()) as u64),
                "--out" => a.out = PathBuf::from(value()),
                "--shared-threshold" => a.shared_threshold = num(value()),
                "--exact-steps" => a.exact_steps = num(value()),
                "--exact-own-watches" => a.exact_own_watches = true,
                "--touch-types" => a.touch_types = true,
                "--type-gap" => a.type_gap = Duration::from_millis(num(value()) as u64),
                "--exact-baseline" => {
                    let value = value();
                    let (label, path) = value
                        .split_once('=')
                        .unwrap_or_else(|| panic!("--exact-baseline LABEL=PATH, got {value}"));
                    assert!(Path::new(path).is_file(), "--exact-baseline: no binary at {path}");
                    a.exact_baseline = Some((label.to_owned(), PathBuf::from(path)));
                }
                "--cost-runs" => a.cost_runs = num(value()),
                "--shards" => a.shards = num(value()),
                other => panic!(
                    "unknown flag {other} (--quick, --latency-only, --workspaces, --exports, --providers, \
                     --bindings-per-workspace, --objects, --quota-percent, --samples, --concurrency, \
                     --settle, --settle-max, --lq-settle, --shared-threshold, --exact-steps, --exact-baseline, \
                     --exact-own-watches, --touch-types, --type-gap, --cost-runs, --shards, --out)"
                ),
            }
        }
        a.latency_only = latency_only;
        if a.providers == 0 {
            a.providers = a.exports;
        }
        if a.shards > 0 {
            a.sharded_defaults(&named);
        }
        assert!(
            a.workspaces >= 1 && a.exports >= 1,
            "at least one workspace and one export"
        );
        assert!(
            (1..=a.exports).contains(&a.providers),
            "--providers must be between 1 and --exports"
        );
        assert!(
            (1..=a.exports).contains(&a.bindings_per_workspace),
            "--bindings-per-workspace must be between 1 and --exports (a workspace binds a type once)"
        );
        assert!(
            (1..=100).contains(&a.quota_percent),
            "--quota-percent between 1 and 100"
        );
        a
    }
}

impl Args {
    /// The run across shards has its own defaults for what was not given: the W = 300
    /// over the shards, about n = 100 latency samples per shard (over its three cases), and in
    /// the bounded run a quota'd consumer on every shard and a type no quota counts (a cold
    /// case) on each.
    fn sharded_defaults(&mut self, named: &[String]) {
        assert!(
            (2..=9).contains(&self.shards),
            "--shards must be 2 to 9 (start-sharded.sh's range; one shard is the default run)"
        );
        let given = |f: &str| named.iter().any(|n| n == f);
        let defaults: [(&str, &mut usize, usize, usize); 4] = [
            ("--workspaces", &mut self.workspaces, 12, 300),
            ("--exports", &mut self.exports, 4, 30),
            ("--quota-percent", &mut self.quota_percent, 25, 10),
            ("--samples", &mut self.samples, 2, 34),
        ];
        for (flag, value, quick, full) in defaults {
            if !given(flag) {
                *value = if self.quick { quick } else { full };
            }
        }
        if !given("--providers") {
            self.providers = self.exports;
        }
        if !given("--out") {
            self.out = if self.quick {
                std::env::temp_dir().join("lazyquota-bench-kcp-sharded-quick")
            } else {
                repo().join("benches/results/kcp-sharded")
            };
        }
        assert!(
            !self.latency_only
                && self.cost_runs == 0
                && !given("--exact-steps")
                && self.exact_baseline.is_none()
                && !self.exact_own_watches,
            "--latency-only, --cost-runs and --exact-* are the one-shard run's"
        );
    }
}

/// The data the run builds: who binds what, who has a quota.
pub(crate) struct Plan {
    pub(crate) consumers: Vec<String>,
    pub(crate) providers: Vec<String>,
    pub(crate) exports: Vec<ExportedType>,
    /// Bindings per consumer at each step (0, ⌈K/2⌉, K).
    pub(crate) steps: Vec<usize>,
    /// Quota'd consumers: (consumer, which of its bindings the quota counts).
    pub(crate) quotaed: Vec<(usize, usize)>,
    pub(crate) per_workspace: usize,
}

impl Plan {
    pub(crate) fn new(args: &Args) -> Self {
        let w = args.workspaces;
        let k = args.bindings_per_workspace;
        let mut steps = vec![0, k.div_ceil(2), k];
        steps.dedup();
        let q = (w * args.quota_percent).div_ceil(100).min(w);
        let quotaed: Vec<(usize, usize)> = (0..q).map(|n| (n * w / q, n % steps[1])).collect();
        Self {
            consumers: (0..w).map(|i| format!("c-{i:04}")).collect(),
            providers: (0..args.providers).map(|p| format!("p-{p:03}")).collect(),
            exports: (0..args.exports)
                .map(|e| ExportedType::new(&format!("e{e}.kcp-bench.lazyquota.test"), "widgets", "v1"))
                .collect(),
            steps,
            quotaed,
            per_workspace: k,
        }
    }

    /// The export consumer `i` binds as its `j`-th: consecutive, so every export is bound by
    /// about the same number of consumers.
    pub(crate) fn export_of(&self, i: usize, j: usize) -> usize {
        (i * self.per_workspace + j) % self.exports.len()
    }

    pub(crate) fn provider_of(&self, e: usize) -> &str {
        &self.providers[e % self.providers.len()]
    }

    pub(crate) fn key(&self, i: usize, j: usize) -> String {
        self.exports[self.export_of(i, j)].count_key()
    }

    /// The standing quotas that exist once step `s` has its data.
    pub(crate) fn standing(&self, s: usize) -> Vec<(usize, String)> {
        self.quotaed
            .iter()
            .filter(|(_, j)| *j < self.steps[s])
            .map(|&(i, j)| (i, self.key(i, j)))
            .collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Config {
    KcpQuota,
    KcpOnly,
    Lazyquota,
}

impl Config {
    pub(crate) const ALL: [Self; 3] = [Self::KcpQuota, Self::KcpOnly, Self::Lazyquota];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::KcpQuota => "1: kcp + its quota controller",
            Self::KcpOnly => "2: kcp, quota controller off",
            Self::Lazyquota => "3: kcp (off) + lazyquota",
        }
    }
}

/// The kcp process's figures.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KcpFigures {
    pub(crate) goroutines: f64,
    pub(crate) heap: f64,
    /// `go_gc_heap_live_bytes`: the heap marked live by the last GC (no garbage in it).
    pub(crate) live: f64,
    pub(crate) rss_metric: f64,
    pub(crate) vmrss: f64,
    pub(crate) anon: f64,
    pub(crate) watches: f64,
}

/// lazyquota's figures.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LqFigures {
    pub(crate) tasks: f64,
    pub(crate) heap: f64,
    pub(crate) vmrss: f64,
    pub(crate) anon: f64,
    pub(crate) connections: f64,
    pub(crate) watches: f64,
    pub(crate) engaged: f64,
    pub(crate) shared: f64,
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Reading {
    pub(crate) kcp: KcpFigures,
    pub(crate) lq: Option<LqFigures>,
    /// From the end of the fixed settle time's start to the stable window.
    pub(crate) settled: Duration,
    pub(crate) stable: bool,
}

/// A further exact-heap series (`--exact-baseline`, `--exact-own-watches`): what it ran, its
/// levels' readings, the reading after every quota was deleted.
pub(crate) type ExactSeries = (String, Vec<(usize, Reading)>, Option<Reading>);

#[derive(Default)]
pub(crate) struct Results {
    pub(crate) readings: BTreeMap<(usize, Config), Reading>,
    pub(crate) first_sync: BTreeMap<(usize, Config), Duration>,
    /// The latency samples of configurations 1 and 3 at each sampled step.
    pub(crate) latency: BTreeMap<(usize, Config), Samples>,
    /// Config 3 at the last step with fewer quotas: (engaged workspaces, reading).
    pub(crate) sweep: Vec<(usize, Reading)>,
    /// The exact-heap series: (workspaces given a quota, reading), then the reading after
    /// every one of those quotas was deleted.
    pub(crate) exact: Vec<(usize, Reading)>,
    pub(crate) exact_after: Option<Reading>,
    /// The same series again: with `--exact-baseline`'s build, with own watches.
    pub(crate) exact_more: Vec<ExactSeries>,
    /// `--cost-runs`: (kcp with its quota controller, without it), in the order read.
    pub(crate) cost: Vec<(Reading, Reading)>,
    pub(crate) timeline: Vec<(String, Duration)>,
    pub(crate) kcp_version: String,
    /// Whether kcp's profiling endpoint ran the GCs asked for before each sample.
    pub(crate) gc_forced: bool,
    pub(crate) machine: Vec<(String, String)>,
    pub(crate) done: bool,
}
