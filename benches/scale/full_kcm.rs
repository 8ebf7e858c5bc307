//! The full-KCM comparison (`--full-kcm`): what an operator saves by switching KCM's resource
//! quota controller off and running lazyquota instead, where KCM runs every controller it enables
//! by default — its garbage collector then shares the metadata informers the quota controller
//! uses, so KCM's quota controller costs less there than when it runs alone. At each N, each
//! configuration is measured `--repeats` times in a rotating order, each from a fresh start:
//!
//! ```text
//! A  KCM (every default controller)
//! B  KCM (every default controller but resourcequota)
//! C  B and lazyquota --mode lazy, side by side
//! saving = (A − B) − lazyquota's own (read in C), in RSS and in anonymous RSS
//! ```
//!
//! Each `--lazy-binary LABEL=PATH` adds a configuration: B beside that build of lazyquota.
//!
//! Writes `full-kcm.md` into `benches/results/full-kcm/` (or `--out`).

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::Path,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, api::DeleteParams};

use crate::common::{
    self,
    stats::{median, slope},
};
use crate::data::{Data, create_core};
use crate::measure::{fresh_quotas, wait_synced};
use crate::plan::{Args, Controller};
use crate::process::{Process, Reading, start};

/// One configuration of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Config {
    All,
    AllButQuota,
    /// B beside a lazyquota: `Controller::Lazy` (C), or a `--lazy-binary` build.
    AllButQuotaAnd(Controller),
}

impl Config {
    /// Every configuration a run measures, C's variants last.
    fn every(args: &Args) -> Vec<Self> {
        let mut every = vec![
            Self::All,
            Self::AllButQuota,
            Self::AllButQuotaAnd(Controller::Lazy),
        ];
        every.extend(
            args.controllers
                .iter()
                .filter(|c| matches!(c, Controller::LazyBinary(..)))
                .map(|c| Self::AllButQuotaAnd(*c)),
        );
        every
    }

    fn name(self) -> String {
        match self {
            Self::All => "A: KCM, every default controller".into(),
            Self::AllButQuota => "B: KCM, every default controller but resourcequota".into(),
            Self::AllButQuotaAnd(Controller::Lazy) => "C: B + lazyquota --mode lazy".into(),
            Self::AllButQuotaAnd(other) => format!("C: B + {}", other.name()),
        }
    }
}

/// One configuration's processes, read at once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Readings {
    kcm: Reading,
    lazy: Option<Reading>,
}

/// Every reading, by N and configuration, in the order taken.
pub(crate) type FullResults = BTreeMap<(usize, Config), Vec<Readings>>;

/// Measures every configuration `args.repeats` times at `n` CRDs.
pub(crate) async fn measure_at(
    client: &Client,
    args: &Args,
    data: &Data,
    n: usize,
    kubeconfig: &Path,
    state: &Path,
    results: &mut FullResults,
) {
    for round in 0..args.repeats {
        // Each configuration first, second and third in turn, so none always meets a fresh or
        // a warm apiserver cache.
        let mut order = Config::every(args);
        let len = order.len();
        order.rotate_left((round + n / 100) % len);
        for config in order {
            let readings = measure_one(client, args, data, n, config, kubeconfig, state).await;
            eprintln!("scale --full-kcm: N={n} {}: {readings:?}", config.name());
            results.entry((n, config)).or_default().push(readings);
        }
    }
}

async fn measure_one(
    client: &Client,
    args: &Args,
    data: &Data,
    n: usize,
    config: Config,
    kubeconfig: &Path,
    state: &Path,
) -> Readings {
    let quotas = fresh_quotas(client, data, n).await;
    let started = Instant::now();
    let kcm = start(
        if config == Config::All {
            Controller::KcmAll
        } else {
            Controller::KcmAllButQuota
        },
        kubeconfig,
        state,
    );
    let lazy = match config {
        Config::AllButQuotaAnd(controller) => Some(start(controller, kubeconfig, state)),
        _ => None,
    };
    if config == Config::AllButQuota {
        // Nobody writes the quotas here: KCM serving is the start; the settle below lets its
        // informers list (A and C wait for the quotas, whose controllers wait for theirs).
        wait_serving(&kcm, started).await;
    } else {
        wait_synced(client, data, &quotas, &config.name(), started).await;
    }
    tokio::time::sleep(settle(args)).await;
    churn(client, data).await;
    if config == Config::AllButQuota {
        tokio::time::sleep(Duration::from_secs(2)).await;
    } else {
        wait_synced(client, data, &quotas, &config.name(), started).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Go's heap in use swings by tens of MiB with its collection cycle, more than the quota
    // controller's share: collect first, then read.
    kcm.collect_garbage().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Three readings 2 s apart, averaged: RSS moves within one process's life too.
    let mut taken = Vec::new();
    for i in 0..READINGS {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        taken.push((
            kcm.reading().await,
            match &lazy {
                Some(process) => Some(process.reading().await),
                None => None,
            },
        ));
    }
    let readings = Readings {
        kcm: average(taken.iter().map(|t| t.0)),
        lazy: lazy.as_ref().map(|_| average(taken.iter().filter_map(|t| t.1))),
    };
    if let Some(process) = lazy {
        process.stop();
    }
    kcm.stop();
    readings
}

/// Readings of each process per start, averaged.
const READINGS: usize = 3;

fn average(readings: impl Iterator<Item = Reading>) -> Reading {
    let all: Vec<Reading> = readings.collect();
    let n = all.len() as f64;
    let mean = |f: fn(&Reading) -> f64| all.iter().map(f).sum::<f64>() / n;
    Reading {
        tasks: mean(|r| r.tasks),
        heap_bytes: mean(|r| r.heap_bytes),
        rss_bytes: mean(|r| r.rss_bytes),
        anon_bytes: mean(|r| r.anon_bytes),
    }
}

/// How long after the first sync the processes are left alone: past lazyquota's drop of its
/// start-up pages (10 s after it is ready), so the reading is of what stays resident, except in
/// the bounded run, which only checks that everything runs.
fn settle(args: &Args) -> Duration {
    if args.quick {
        args.settle
    } else {
        args.settle.max(Duration::from_secs(15))
    }
}

/// The index of the pods [`churn`] creates and deletes, above any the data has.
const CHURN_POD: usize = 1_000_000;

/// Work for the controllers before the reading: a pod created and deleted in every namespace,
/// so that what is resident includes handling watch events and writing statuses, not only an
/// idle process's. Under B admission refuses the pods (nobody wrote the quotas' status), and
/// the deletes find nothing: its KCM sees no pod event.
async fn churn(client: &Client, data: &Data) {
    for ns in &data.namespaces {
        create_core(client, ns, "pod", CHURN_POD).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let gone = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for ns in &data.namespaces {
        let _ = Api::<Pod>::namespaced(client.clone(), ns)
            .delete(&format!("p{CHURN_POD}"), &gone)
            .await;
    }
}

async fn wait_serving(process: &Process, started: Instant) {
    while !process.serving().await {
        assert!(
            started.elapsed() < Duration::from_mins(5),
            "KCM never served /healthz"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The medians of one process's readings over the repeats, and RSS's and anonymous RSS's range.
struct Summary {
    tasks: f64,
    heap: f64,
    rss: f64,
    anon: f64,
    rss_range: (f64, f64),
    anon_range: (f64, f64),
}

fn summarize(readings: &[Reading]) -> Summary {
    let of = |f: fn(&Reading) -> f64| readings.iter().map(f).collect::<Vec<f64>>();
    let range = |v: &[f64]| {
        (
            v.iter().copied().fold(f64::INFINITY, f64::min),
            v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        )
    };
    let (rss, anon) = (of(|r| r.rss_bytes), of(|r| r.anon_bytes));
    Summary {
        tasks: median(of(|r| r.tasks)),
        heap: median(of(|r| r.heap_bytes)),
        rss: median(rss.clone()),
        anon: median(anon.clone()),
        rss_range: range(&rss),
        anon_range: range(&anon),
    }
}

fn mib(bytes: f64) -> f64 {
    bytes / 1_048_576.0
}

/// A least-squares line through `points`: (intercept, slope).
fn line(points: &[(f64, f64)]) -> (f64, f64) {
    let b = slope(points.iter().copied());
    let n = points.len() as f64;
    let (mx, my) = points
        .iter()
        .fold((0.0, 0.0), |(x, y), (px, py)| (x + px / n, y + py / n));
    (my - b * mx, b)
}

/// Where the saving `intercept + slope × N` turns positive, in words.
fn break_even((intercept, slope): (f64, f64)) -> String {
    match (intercept > 0.0, slope > 0.0) {
        (true, true) => format!("positive at every N (fitted {:+.1} MiB at N = 0)", mib(intercept)),
        (false, true) => format!("N = {:.0}", -intercept / slope),
        (true, false) => format!("positive up to N = {:.0} only", -intercept / slope),
        (false, false) => "never (the fitted saving does not grow with N)".into(),
    }
}

pub(crate) fn write_results(args: &Args, results: &FullResults) {
    let mut md =
        String::from("# Full-KCM comparison: what switching KCM's quota controller to lazyquota saves\n\n");
    let _ = writeln!(
        md,
        "{} \
         A: kube-controller-manager with every controller it enables by default (`--controllers '*'`); B: the same \
         with `--controllers '*,-resourcequota-controller'`; C: B and `lazyquota run --mode lazy` side by side. Each \
         configuration started fresh {} time(s) per N in a rotating order; {} s after its quotas were synced \
         (B: after KCM served /healthz) a pod was created and deleted in every namespace (refused under B, \
         whose quotas have no status), and the processes were read once the quotas said so again, KCM's garbage collected first (`/debug/pprof/heap?debug=1&gc=1`). Each process read three times 2 s apart and averaged; medians over the starts, with the range of RSS. Tasks are \
         goroutines for KCM and tokio alive tasks for lazyquota; heap is Go's heap in use for KCM and jemalloc's \
         allocated bytes for lazyquota. {}. Commit: `{}`.\n",
        args.generated_by(),
        args.repeats,
        settle(args).as_secs(),
        common::binary_note(),
        common::commit(),
    );
    md.push_str(
        "| N | configuration | process | tasks | heap MiB | RSS MiB (range) | anon RSS MiB (range) |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let row = |md: &mut String, n: usize, config: Config, process: &str, s: &Summary| {
        let _ = writeln!(
            md,
            "| {n} | {} | {process} | {:.0} | {:.1} | {:.1} ({:.1}–{:.1}) | {:.1} ({:.1}–{:.1}) |",
            config.name(),
            s.tasks,
            mib(s.heap),
            mib(s.rss),
            mib(s.rss_range.0),
            mib(s.rss_range.1),
            mib(s.anon),
            mib(s.anon_range.0),
            mib(s.anon_range.1),
        );
    };
    let kcm_of = |n: usize, c: Config| {
        results
            .get(&(n, c))
            .map(|v| summarize(&v.iter().map(|r| r.kcm).collect::<Vec<_>>()))
    };
    let lazy_of = |n: usize, c: Config| {
        results
            .get(&(n, c))
            .map(|v| summarize(&v.iter().filter_map(|r| r.lazy).collect::<Vec<_>>()))
    };
    let every = Config::every(args);
    for &n in &args.crds {
        for &config in &every {
            if let Some(s) = kcm_of(n, config) {
                row(&mut md, n, config, "kube-controller-manager", &s);
            }
            if let Some(s) = lazy_of(n, config).filter(|_| matches!(config, Config::AllButQuotaAnd(_))) {
                row(&mut md, n, config, "lazyquota", &s);
            }
        }
    }
    md.push_str(
        "\n## The saving\n\nKCM's quota controller is A − B; lazyquota's own cost is its process beside B; the \
         saving is the first minus the second (positive: switching saves memory). \"Beside\" repeats it with B's \
         KCM as read beside lazyquota.\n",
    );
    for &config in every.iter().filter(|c| matches!(c, Config::AllButQuotaAnd(_))) {
        let _ = writeln!(
            md,
            "\n### {}\n\n\
             | N | KCM's quota controller: goroutines / heap / RSS / anon MiB | lazyquota: tasks / heap / RSS / anon MiB | saving RSS MiB | saving anon RSS MiB | beside: RSS / anon MiB |\n\
             |---|---|---|---|---|---|",
            config.name()
        );
        for &n in &args.crds {
            let (Some(a), Some(b), Some(c), Some(lazy)) = (
                kcm_of(n, Config::All),
                kcm_of(n, Config::AllButQuota),
                kcm_of(n, config),
                lazy_of(n, config),
            ) else {
                continue;
            };
            let (saving_rss, saving_anon) = (a.rss - b.rss - lazy.rss, a.anon - b.anon - lazy.anon);
            let _ = writeln!(
                md,
                "| {n} | {:+.0} / {:+.1} / {:+.1} / {:+.1} | {:.0} / {:.1} / {:.1} / {:.1} | {:+.1} | {:+.1} | {:+.1} / {:+.1} |",
                a.tasks - b.tasks,
                mib(a.heap - b.heap),
                mib(a.rss - b.rss),
                mib(a.anon - b.anon),
                lazy.tasks,
                mib(lazy.heap),
                mib(lazy.rss),
                mib(lazy.anon),
                mib(saving_rss),
                mib(saving_anon),
                mib(a.rss - c.rss - lazy.rss),
                mib(a.anon - c.anon - lazy.anon),
            );
        }
        // Every reading, not the medians: one line per process, their difference the saving.
        let points = |c: Config, lazy: bool, f: fn(&Reading) -> f64| -> Vec<(f64, f64)> {
            results
                .iter()
                .filter(|((_, config), _)| *config == c)
                .flat_map(|((n, _), v)| {
                    v.iter()
                        .filter_map(move |r| if lazy { r.lazy } else { Some(r.kcm) })
                        .map(move |r| (*n as f64, f(&r)))
                })
                .collect()
        };
        for (what, f) in [
            ("RSS", (|r: &Reading| r.rss_bytes) as fn(&Reading) -> f64),
            ("Anonymous RSS", |r: &Reading| r.anon_bytes),
        ] {
            let (a, b, l) = (
                line(&points(Config::All, false, f)),
                line(&points(Config::AllButQuota, false, f)),
                line(&points(config, true, f)),
            );
            let saving = (a.0 - b.0 - l.0, a.1 - b.1 - l.1);
            if !saving.0.is_finite() || !saving.1.is_finite() {
                let _ = writeln!(
                    md,
                    "\n{what}: break-even unknown (a line needs readings at two N or more)."
                );
                continue;
            }
            let _ = writeln!(
                md,
                "\n{what}, least squares over every reading: KCM's quota controller {:+.1} MiB + {:.1} KiB per \
                 CRD, lazyquota {:.1} MiB + {:.1} KiB per CRD; the saving {:+.1} MiB + {:.1} KiB per CRD. \
                 Break-even: {}.",
                mib(a.0 - b.0),
                (a.1 - b.1) / 1024.0,
                mib(l.0),
                l.1 / 1024.0,
                mib(saving.0),
                saving.1 / 1024.0,
                break_even(saving),
            );
        }
    }
    std::fs::write(args.out.join("full-kcm.md"), &md).expect("write full-kcm.md");
    println!("{md}");
}
