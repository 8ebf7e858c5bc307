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

use crate::common::{self, stats::median};
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
    let readings = Readings {
        kcm: kcm.reading().await,
        lazy: match &lazy {
            Some(process) => Some(process.reading().await),
            None => None,
        },
    };
    if let Some(process) = lazy {
        process.stop();
    }
    kcm.stop();
    readings
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

/// Where a saving measured at increasing N first turns positive: linear between the two N it
/// lies between; `None` when it is never positive.
fn break_even(points: &[(usize, f64)]) -> Option<String> {
    if let Some(&(n, s)) = points.first()
        && s > 0.0
    {
        return Some(format!("positive from the smallest N measured ({n})"));
    }
    points.windows(2).find_map(|w| {
        let ((n0, s0), (n1, s1)) = (w[0], w[1]);
        (s0 <= 0.0 && s1 > 0.0).then(|| {
            let at = n0 as f64 + (n1 - n0) as f64 * (-s0) / (s1 - s0);
            format!("about N = {at:.0} (between {n0} and {n1}, linear)")
        })
    })
}

pub(crate) fn write_results(args: &Args, results: &FullResults) {
    let mut md =
        String::from("# Full-KCM comparison: what switching KCM's quota controller to lazyquota saves\n\n");
    let _ = writeln!(
        md,
        "Generated by `cargo bench --bench scale -- {}` on {} CPU cores. Data: {} pods, {} services, {} PVCs over {} \
         namespaces; N namespaced CRDs with {} objects each; quotas constrain pods, services, PVCs and K = {} CRDs. \
         A: kube-controller-manager with every controller it enables by default (`--controllers '*'`); B: the same \
         with `--controllers '*,-resourcequota-controller'`; C: B and `lazyquota run --mode lazy` side by side. Each \
         configuration started fresh {} time(s) per N in a rotating order; {} s after its quotas were synced \
         (B: after KCM served /healthz) a pod was created and deleted in every namespace (refused under B, \
         whose quotas have no status), and the processes were read once the quotas said so again, KCM's garbage collected first (`/debug/pprof/heap?debug=1&gc=1`). Medians, with the range of RSS over the repeats. Tasks are \
         goroutines for KCM and tokio alive tasks for lazyquota; heap is Go's heap in use for KCM and jemalloc's \
         allocated bytes for lazyquota. {}. Commit: `{}`.\n",
        std::env::args()
            .skip(1)
            .filter(|a| a != "--bench")
            .collect::<Vec<_>>()
            .join(" "),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        args.pods,
        args.services,
        args.pvcs,
        args.namespaces,
        args.objects_per_crd,
        args.constrained,
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
             | N | KCM's quota controller: goroutines / RSS / anon MiB | lazyquota: tasks / RSS / anon MiB | saving RSS MiB | saving anon RSS MiB | beside: RSS / anon MiB |\n\
             |---|---|---|---|---|---|",
            config.name()
        );
        let (mut rss_points, mut anon_points) = (Vec::new(), Vec::new());
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
            rss_points.push((n, saving_rss));
            anon_points.push((n, saving_anon));
            let _ = writeln!(
                md,
                "| {n} | {:+.0} / {:+.1} / {:+.1} | {:.0} / {:.1} / {:.1} | {:+.1} | {:+.1} | {:+.1} / {:+.1} |",
                a.tasks - b.tasks,
                mib(a.rss - b.rss),
                mib(a.anon - b.anon),
                lazy.tasks,
                mib(lazy.rss),
                mib(lazy.anon),
                mib(saving_rss),
                mib(saving_anon),
                mib(a.rss - c.rss - lazy.rss),
                mib(a.anon - c.anon - lazy.anon),
            );
        }
        let say = |points: &[(usize, f64)]| {
            break_even(points).unwrap_or_else(|| {
                format!(
                    "not positive at any N measured (up to {})",
                    points.last().map_or(0, |p| p.0)
                )
            })
        };
        let _ = writeln!(
            md,
            "\nBreak-even (the N from which the saving is positive): RSS {}; anonymous RSS {}.",
            say(&rss_points),
            say(&anon_points)
        );
    }
    std::fs::write(args.out.join("full-kcm.md"), &md).expect("write full-kcm.md");
    println!("{md}");
}
