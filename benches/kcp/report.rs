//! The result files: `kcp.md` (this module) and the plot data and script (`plot`).

mod plot;

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    time::{Duration, Instant},
};

use crate::common::{
    self,
    stats::{ms, percentile, slope},
};
use crate::latency::{Case, Samples};
use crate::plan::{
    Args, Config, ENGAGED, HARD, KcpFigures, LATENCY_PATIENCE, LqFigures, NS, Plan, Reading, Results, SAMPLE,
    STANDING, WINDOW,
};

/// One row of lazyquota's figures in configuration 3 (`base`: configuration 2 at that step).
pub(crate) fn lq_row(md: &mut String, label: &str, x: &Reading, base: Option<&Reading>) {
    let Some(l) = x.lq else { return };
    let (dw, dg, dh) = base.map_or((f64::NAN, f64::NAN, f64::NAN), |b| {
        (
            x.kcp.watches - b.kcp.watches,
            x.kcp.goroutines - b.kcp.goroutines,
            x.kcp.live - b.kcp.live,
        )
    });
    let _ = writeln!(
        md,
        "| {label}{} | {:.0} | {:.0} | {:.2} | {:.1} | {:.1} | {:.0} | {:.0}{} | {:.0} | {dw:.0} | {dg:.0} | {:.1} |",
        if x.stable { "" } else { " (not stable)" },
        l.engaged,
        l.tasks,
        mib(l.heap),
        mib(l.vmrss),
        mib(l.anon),
        l.connections,
        l.watches,
        // src/server.rs refreshes the per-cluster gauges only while some cluster is served.
        if l.engaged < 0.5 && l.watches > 0.5 {
            " (stale)"
        } else {
            ""
        },
        l.shared,
        mib(dh),
    );
}

/// The exact-heap series' section: its readings, the slopes between them and the
/// least-squares slope over all of them.
pub(crate) fn exact_section(md: &mut String, args: &Args, plan: &Plan, r: &Results) {
    if r.exact.len() < 2 {
        return;
    }
    let step = plan.steps.len() - 1;
    let bindings = plan.steps[step] * plan.consumers.len();
    let base = r.readings.get(&(step, Config::KcpOnly));
    let _ = writeln!(
        md,
        "\n## Cost per engaged workspace, exact heap (B = {bindings}, a second lazyquota with `tcache:false`)\n\n\
         After the series above, with no standing quota left, a new lazyquota is started with \
         jemalloc's thread caches off (`_RJEM_MALLOC_CONF=tcache:false`): `stats.allocated` then \
         counts exactly the bytes the program holds. With the caches on (as lazyquota runs, and as in \
         the series above), freed objects parked in a thread's cache count as allocated, and how many \
         are parked moves between readings by more than a few hundred engaged workspaces cost. The \
         option also leaves lazyquota on jemalloc's defaults (several arenas, 10 s decay), so RSS \
         here is not lazyquota's production RSS; the heap and the counts are. One warm-up engagement \
         (a quota in consumer 0, synced, deleted), then a quota `{ENGAGED}` (`count/widgets.<group>` \
         of consumer i's binding i mod {}) in the first n consumers, n = 0, W/{}, …, W; each level is \
         read once every quota has its status.used and lazyquota says that many engaged, after \
         {:?} and the stable window as above.\n",
        plan.per_workspace,
        args.exact_steps,
        args.lq_settle.max(args.settle),
    );
    let (heap, tasks) = exact_tables(md, &r.exact, r.exact_after.as_ref(), base);
    let verdict = |ok: bool| if ok { "met" } else { "**missed**" };
    let _ = writeln!(
        md,
        "\nTargets per engaged workspace: ≤ 6 KiB ({}: {heap:.2} KiB), ≤ 0.1 tokio task ({}: {tasks:.3}). \
         The slope includes the shared watches' own cost ({:.0} open at the top level), spread \
         over {:.0} engaged workspaces: the fewer workspaces, the more it weighs.",
        verdict(heap <= 6.0),
        verdict(tasks <= 0.1),
        r.exact
            .last()
            .and_then(|(_, x)| x.lq)
            .map_or(f64::NAN, |l| l.shared),
        r.exact.last().map_or(f64::NAN, |(n, _)| *n as f64),
    );
    for (label, levels, after) in r.exact_more.iter().filter(|(_, levels, _)| levels.len() >= 2) {
        let _ = writeln!(
            md,
            "\n### The same series with {label}\n\nRight after the one above, on the same shard and data, \
             by the same steps.\n"
        );
        let (base_heap, base_tasks) = exact_tables(md, levels, after.as_ref(), base);
        let _ = writeln!(
            md,
            "\nPer engaged workspace, least squares: **{heap:.2} KiB** and {tasks:.3} tasks with the build \
             measured (`{}`), against **{base_heap:.2} KiB** and {base_tasks:.3} tasks with {label}.",
            common::commit(),
        );
    }
}

/// One exact-heap series' tables: the readings, the slopes between them and the least-squares
/// slope over all of them, and what deleting every quota released. Returns the least-squares
/// KiB and tasks per engaged workspace.
fn exact_tables(
    md: &mut String,
    levels: &[(usize, Reading)],
    after: Option<&Reading>,
    base: Option<&Reading>,
) -> (f64, f64) {
    let _ = writeln!(
        md,
        "| workspaces with a quota | engaged workspaces | tasks | jemalloc allocated MiB | VmRSS MiB | RssAnon MiB | TCP conns to the shard | lazyquota watches | shared watches | kcp WATCHes 3 − 2 | kcp goroutines 3 − 2 | kcp live heap MiB 3 − 2 |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (n, x) in levels {
        lq_row(md, &n.to_string(), x, base);
    }
    if let Some(after) = after {
        lq_row(md, "0 (all deleted again)", after, base);
    }
    let _ = writeln!(
        md,
        "\n| engaged workspaces from → to | tasks / ws | jemalloc KiB / ws | RSS KiB / ws | RssAnon KiB / ws | TCP conns / ws | lazyquota watches / ws |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    let points: Vec<(f64, LqFigures)> = levels
        .iter()
        .filter_map(|(n, x)| Some((*n as f64, x.lq?)))
        .collect();
    let fit = |f: fn(&LqFigures) -> f64| slope(points.iter().map(|(n, l)| (*n, f(l))));
    for pair in points.windows(2) {
        let ((lo, from), (hi, to)) = (pair[0], pair[1]);
        let d = hi - lo;
        let _ = writeln!(
            md,
            "| {lo} → {hi} | {:.3} | {:.2} | {:.1} | {:.1} | {:.3} | {:.2} |",
            (to.tasks - from.tasks) / d,
            (to.heap - from.heap) / d / 1024.0,
            (to.vmrss - from.vmrss) / d / 1024.0,
            (to.anon - from.anon) / d / 1024.0,
            (to.connections - from.connections) / d,
            (to.watches - from.watches) / d,
        );
    }
    let heap = fit(|l| l.heap) / 1024.0;
    let tasks = fit(|l| l.tasks);
    let _ = writeln!(
        md,
        "| **least squares, all {} levels** | **{tasks:.3}** | **{heap:.2}** | {:.1} | {:.1} | {:.3} | {:.2} |",
        points.len(),
        fit(|l| l.vmrss) / 1024.0,
        fit(|l| l.anon) / 1024.0,
        fit(|l| l.connections),
        fit(|l| l.watches),
    );
    if let (Some(after), Some((top, x)), Some((_, zero))) =
        (after.and_then(|a| a.lq), levels.last(), points.first())
        && let Some(top_lq) = x.lq
        && *top > 0
    {
        let _ = writeln!(
            md,
            "After all {top} quotas were deleted: jemalloc allocated {:.2} MiB, {:.2} KiB per workspace \
             of the top level above the level-0 reading ({:.2} KiB per workspace released).",
            mib(after.heap),
            (after.heap - zero.heap) / *top as f64 / 1024.0,
            (top_lq.heap - after.heap) / *top as f64 / 1024.0,
        );
    }
    (heap, tasks)
}

pub(crate) fn machine_facts() -> Vec<(String, String)> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let mem = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:").map(|v| v.trim().to_owned()))
        .unwrap_or_default();
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_owned();
    let others = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "kcp"))
        .count();
    vec![
        (
            "CPU".into(),
            format!(
                "{} × {cpu}",
                std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
            ),
        ),
        ("memory".into(), mem),
        ("kernel".into(), kernel),
        (
            "load average at start".into(),
            read("/proc/loadavg")
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        ),
        ("other kcp processes running at start".into(), others.to_string()),
    ]
}

pub(crate) fn p50_p99(samples: Option<&Vec<Duration>>) -> String {
    let Some(s) = samples.filter(|s| !s.is_empty()) else {
        return "–".into();
    };
    format!(
        "{} / {} (n={})",
        ms(percentile(s, 50.0)),
        ms(percentile(s, 99.0)),
        s.len()
    )
}

pub(crate) fn mib(b: f64) -> f64 {
    b / 1_048_576.0
}

/// Writes `kcp.md`, `kcp.dat` and `kcp.gp` (and `kcp.png` with gnuplot) into `--out`, and
/// prints the report.
pub(crate) fn write_results(args: &Args, plan: &Plan, r: &Results, started: Instant) {
    let w = plan.consumers.len();
    let bs: Vec<usize> = plan.steps.iter().map(|k| k * w).collect();
    let mut md = String::new();
    header(&mut md, args, plan, r, started, &bs);
    kcp_tables(&mut md, r, &bs);
    cost_table(&mut md, r, &bs);
    lazyquota_tables(&mut md, r, &bs);
    sweep_tables(&mut md, r, &bs);
    exact_section(&mut md, args, plan, r);
    latencies(&mut md, r, &bs);
    std::fs::write(args.out.join("kcp.md"), &md).expect("write kcp.md");
    plot::write(args, r, &bs);
    println!("{md}");
}

/// The title, the command and commit, the machine, the scenario and how it was measured.
fn header(md: &mut String, args: &Args, plan: &Plan, r: &Results, started: Instant, bs: &[usize]) {
    let w = plan.consumers.len();
    let _ = writeln!(
        md,
        "# kcp seed scenario: kcp's quota controller vs lazyquota on one shard\n"
    );
    if !r.done {
        let _ = writeln!(
            md,
            "**Partial: the run has not finished (or failed) after these steps.**\n"
        );
    }
    let cmd: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let _ = writeln!(
        md,
        "Generated by `cargo bench --bench kcp -- {}` at commit `{}`; wall time {:.1} min. kcp {} \
         (`tests/control-plane/kcp`, embedded etcd, loopback); {} (copied at the start; its \
         defaults: HTTP/2 since `103fa7b`, HTTP/1.1 before).\n",
        cmd.join(" "),
        common::commit(),
        started.elapsed().as_secs_f64() / 60.0,
        r.kcp_version,
        common::binary_note()
    );
    let _ = writeln!(md, "Machine:");
    for (k, v) in &r.machine {
        let _ = writeln!(md, "- {k}: {v}");
    }
    let types: BTreeMap<usize, usize> = plan.quotaed.iter().fold(BTreeMap::new(), |mut m, &(i, j)| {
        *m.entry(plan.export_of(i, j)).or_insert(0) += 1;
        m
    });
    let _ = writeln!(
        md,
        "\n## Scenario\n\n\
         - W = {w} consumer workspaces and {} provider workspaces (all children of `root`); E = {} \
         APIExports (`apis.kcp.io/v1alpha2`, each exporting one namespaced type `widgets` of its own \
         group, schemaless), export e in provider e mod {}.\n\
         - Consumer i binds exports (i·K + j) mod E for j < K = {}: B = {} APIBindings at the end, added \
         in steps of bindings per consumer {:?} → B = {:?}.\n\
         - {} objects of every bound type in every consumer (namespace `{NS}`): {} objects at B = {}.\n\
         - Q = {} consumers ({}%) have one ResourceQuota `{STANDING}` with `count/widgets.<group>` = \
         {HARD} on one type they bind from the first step on (consumer n·W/Q, its binding n mod {}), \
         created when that step's bindings are; they are on {} distinct types, at most {} per type \
         (lazyquota runs with `--kcp-shared-watch-threshold {}`: a type counted in that many \
         engaged workspaces is served by one shared watch).",
        plan.providers.len(),
        plan.exports.len(),
        plan.providers.len(),
        plan.per_workspace,
        bs.last().copied().unwrap_or(0),
        plan.steps,
        bs,
        args.objects,
        args.objects * bs.last().copied().unwrap_or(0),
        bs.last().copied().unwrap_or(0),
        plan.quotaed.len(),
        args.quota_percent,
        plan.steps.get(1).copied().unwrap_or(1),
        types.len(),
        types.values().max().copied().unwrap_or(0),
        args.shared_threshold,
    );
    let _ = writeln!(
        md,
        "\n## How it was measured\n\n\
         At every step, after the step's bindings are Bound and its objects and quotas exist (created \
         while kcp runs without its quota controller and nothing writes quota status), every standing \
         quota's status.used is set to 0 and then:\n\n\
         1. kcp is restarted on the same data (`LAZYQUOTA_KCP_KEEP_DATA=1`) **with** its quota \
         controller; first sync = from kcp's /readyz until every standing quota says status.used = {} \
         again;\n\
         2. kcp is restarted on the same data **without** it (`LAZYQUOTA_KCP_QUOTA=off`), and status.used \
         is set to 0 again (the same writes to the same workspaces as in 1 and 3: kcp's quota admission \
         keeps per-workspace state, evaluator goroutines included, for every workspace written to since \
         kcp started);\n\
         3. lazyquota is started against that shard; first sync as in 1, from lazyquota's start.\n\n\
         Each reading: a fixed {:?} after the start or the first sync ({:?} for lazyquota's readings \
         after it listed: past the HTTP client's 90 s pool idle timeout, so that the idle connections \
         of its initial lists are closed), then a sample every {:?} \
         until the last {WINDOW} samples of kcp's `go_goroutines` are within max(5, 1%) of each other \
         (and lazyquota's `lazyquota_tokio_alive_tasks` within 2), at most {:?}; every figure is the \
         median of those {WINDOW} samples. The bench's own clients are rebuilt before each reading \
         (their idle connections closed), and before each kcp sample a GC is run in kcp through its \
         profiling endpoint (`/debug/pprof/heap?gc=1`; {}), so that Go heap figures are post-GC. \
         kcp: `go_goroutines`, `go_memstats_heap_inuse_bytes`, `go_gc_heap_live_bytes` (live heap \
         after that GC), `process_resident_memory_bytes`, VmRSS and RssAnon of /proc/<pid>/status, and the sum of \
         `apiserver_longrunning_requests{{verb=\"WATCH\"}}` (every open watch the shard serves, kcp's \
         own informers included). lazyquota: `lazyquota_tokio_alive_tasks`, \
         `lazyquota_jemalloc_allocated_bytes`, VmRSS and RssAnon, established TCP connections to the \
         shard's port (`ss`), the sum of `lazyquota_active_watches`, `lazyquota_kcp_engaged_clusters`, \
         `lazyquota_kcp_shared_watches`.\n\n\
         Latencies ({} samples per case, step and configuration, one at a time, the cases \
         interleaved): a watch on quota `{SAMPLE}` is opened, the quota is created, and the time from \
         the create until the watch delivers it with status.used equal to the objects is taken. The \
         cases differ in what lazyquota has when the quota appears: *cold* — a consumer without a \
         standing quota, on a bound type no quota of the shard counts (lazyquota engages the \
         workspace, discovers it and opens a watch of its own); *warm, shared watch* — a consumer \
         without a standing quota, on a type counted in at least the threshold's workspaces \
         (lazyquota engages and joins the shared watch); *watched, engaged workspace* — a consumer \
         with a standing quota, on its type (nothing to open). kcp's controller is sampled on the \
         same targets. In 3 each sample is then deleted and the time until \
         `lazyquota_kcp_engaged_clusters` is back where it was (disengaged) and until \
         `lazyquota_active_watches` is back (watch released) is taken (polled every 20 ms), so the \
         next cold sample is cold again. Every wait is bounded ({LATENCY_PATIENCE:?} per sample); a \
         timeout fails the run.\n\n\
         At the last step the quota'd-workspace series is read in 3 after the latency samples (kcp's \
         quota admission keeps per-workspace state, goroutines included, for every workspace a sample \
         touched), then after deleting half of the standing quotas, then all of them.",
        args.objects,
        args.settle,
        args.lq_settle.max(args.settle),
        args.poll,
        args.settle_max,
        if r.gc_forced {
            "it answered"
        } else {
            "**it did not answer: heap figures are wherever the GC cycle was**"
        },
        args.samples,
    );
}

/// kcp's figures in each configuration, and what its quota controller costs (1 − 2).
fn kcp_tables(md: &mut String, r: &Results, bs: &[usize]) {
    let _ = writeln!(md, "\n## kcp in each configuration\n");
    let _ = writeln!(
        md,
        "| B | configuration | goroutines | heap in use MiB | live heap MiB | RSS MiB (metric) | VmRSS MiB | RssAnon MiB | open WATCHes | first sync s | settled s |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|");
    for (s, b) in bs.iter().enumerate() {
        for c in Config::ALL {
            let Some(x) = r.readings.get(&(s, c)) else {
                continue;
            };
            let k = x.kcp;
            let _ = writeln!(
                md,
                "| {b} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {} | {:.0}{} |",
                c.name(),
                k.goroutines,
                mib(k.heap),
                mib(k.live),
                mib(k.rss_metric),
                mib(k.vmrss),
                mib(k.anon),
                k.watches,
                r.first_sync
                    .get(&(s, c))
                    .map_or_else(|| "–".into(), |d| format!("{:.1}", d.as_secs_f64())),
                x.settled.as_secs_f64(),
                if x.stable { "" } else { " (not stable)" },
            );
        }
    }

    let _ = writeln!(md, "\n## Cost of kcp's quota controller (1 − 2, same data)\n");
    let _ = writeln!(
        md,
        "| B | Δ goroutines | Δ heap in use MiB | Δ live heap MiB | Δ RSS MiB (metric) | Δ VmRSS MiB | Δ RssAnon MiB | Δ open WATCHes |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for (s, b) in bs.iter().enumerate() {
        let Some(d) = kcp_delta(r, s) else { continue };
        let _ = writeln!(
            md,
            "| {b} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} |",
            d.goroutines,
            mib(d.heap),
            mib(d.live),
            mib(d.rss_metric),
            mib(d.vmrss),
            mib(d.anon),
            d.watches
        );
    }
}

/// What kcp's quota controller costs at step `s`: configuration 1 minus 2.
fn kcp_delta(r: &Results, s: usize) -> Option<KcpFigures> {
    let a = r.readings.get(&(s, Config::KcpQuota))?.kcp;
    let b = r.readings.get(&(s, Config::KcpOnly))?.kcp;
    Some(minus(a, b))
}

fn minus(a: KcpFigures, b: KcpFigures) -> KcpFigures {
    KcpFigures {
        goroutines: a.goroutines - b.goroutines,
        heap: a.heap - b.heap,
        live: a.live - b.live,
        rss_metric: a.rss_metric - b.rss_metric,
        vmrss: a.vmrss - b.vmrss,
        anon: a.anon - b.anon,
        watches: a.watches - b.watches,
    }
}

/// `--cost-runs`: each on/off pair's difference, then the range and median of each column.
fn cost_table(md: &mut String, r: &Results, bs: &[usize]) {
    if r.cost.is_empty() {
        return;
    }
    let b = bs.last().copied().unwrap_or_default();
    let _ = writeln!(
        md,
        "\n## Cost of kcp's quota controller, read {} times (B = {b}; on − off, interleaved, same data)\n",
        r.cost.len()
    );
    let _ = writeln!(
        md,
        "| pair | Δ goroutines | Δ heap in use MiB | Δ live heap MiB | Δ RSS MiB (metric) | Δ RssAnon MiB | on: stable | off: stable |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let deltas: Vec<KcpFigures> = r.cost.iter().map(|(on, off)| minus(on.kcp, off.kcp)).collect();
    for (n, ((on, off), d)) in r.cost.iter().zip(&deltas).enumerate() {
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} |",
            n + 1,
            d.goroutines,
            mib(d.heap),
            mib(d.live),
            mib(d.rss_metric),
            mib(d.anon),
            on.stable,
            off.stable
        );
    }
    let column = |f: fn(&KcpFigures) -> f64, scale: f64, digits: usize| {
        let values: Vec<f64> = deltas.iter().map(|d| f(d) / scale).collect();
        let (lo, hi) = values
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(*v), hi.max(*v))
            });
        format!(
            "{lo:.digits$} to {hi:.digits$} (median {:.digits$})",
            common::stats::median(values)
        )
    };
    let _ = writeln!(
        md,
        "| range | {} | {} | {} | {} | {} | | |",
        column(|d| d.goroutines, 1.0, 0),
        column(|d| d.heap, 1_048_576.0, 1),
        column(|d| d.live, 1_048_576.0, 1),
        column(|d| d.rss_metric, 1_048_576.0, 1),
        column(|d| d.anon, 1_048_576.0, 1),
    );
}

/// lazyquota's own figures at each step, and the marginal cost per APIBinding.
fn lazyquota_tables(md: &mut String, r: &Results, bs: &[usize]) {
    let _ = writeln!(md, "\n## lazyquota (configuration 3)\n");
    let _ = writeln!(
        md,
        "| B | engaged workspaces | tasks | jemalloc allocated MiB | VmRSS MiB | RssAnon MiB | TCP conns to the shard | lazyquota watches | shared watches | kcp WATCHes 3 − 2 | kcp goroutines 3 − 2 | kcp live heap MiB 3 − 2 |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (s, b) in bs.iter().enumerate() {
        if let Some(x) = r.readings.get(&(s, Config::Lazyquota)) {
            lq_row(md, &b.to_string(), x, r.readings.get(&(s, Config::KcpOnly)));
        }
    }

    let _ = writeln!(
        md,
        "\n## Marginal cost per APIBinding (slopes between the steps)\n"
    );
    let _ = writeln!(
        md,
        "kcp's quota controller: the slope of 1 − 2. lazyquota: the slope of its own figures in 3; \
         \"kcp serving lazyquota\": the slope of kcp's 3 − 2. From B = 0 the slope also includes \
         engaging the Q quota'd workspaces (no quota exists at B = 0); between the later steps the \
         quotas are the same and only bindings (and their objects) are added.\n"
    );
    let _ = writeln!(
        md,
        "| from → to | kcp quota ctrl goroutines / binding | kcp quota ctrl heap in use KiB / binding | kcp quota ctrl live heap KiB / binding | kcp quota ctrl RSS KiB / binding | lazyquota tasks / binding | lazyquota jemalloc KiB / binding | lazyquota RSS KiB / binding | kcp serving lazyquota: goroutines / binding | kcp serving lazyquota: WATCHes / binding |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    let mut pairs: Vec<(usize, usize)> = (1..bs.len()).map(|s| (s - 1, s)).collect();
    if bs.len() > 2 {
        pairs.push((0, bs.len() - 1));
    }
    for (a, b) in pairs {
        let db = (bs[b] - bs[a]) as f64;
        let (Some(da), Some(dbb)) = (kcp_delta(r, a), kcp_delta(r, b)) else {
            continue;
        };
        let (Some(la), Some(lb)) = (
            r.readings.get(&(a, Config::Lazyquota)),
            r.readings.get(&(b, Config::Lazyquota)),
        ) else {
            continue;
        };
        let (Some(oa), Some(ob)) = (
            r.readings.get(&(a, Config::KcpOnly)),
            r.readings.get(&(b, Config::KcpOnly)),
        ) else {
            continue;
        };
        let (Some(lqa), Some(lqb)) = (la.lq, lb.lq) else {
            continue;
        };
        let _ = writeln!(
            md,
            "| {} → {} | {:.3} | {:.2} | {:.2} | {:.2} | {:.4} | {:.3} | {:.2} | {:.3} | {:.4} |",
            bs[a],
            bs[b],
            (dbb.goroutines - da.goroutines) / db,
            (dbb.heap - da.heap) / db / 1024.0,
            (dbb.live - da.live) / db / 1024.0,
            (dbb.rss_metric - da.rss_metric) / db / 1024.0,
            (lqb.tasks - lqa.tasks) / db,
            (lqb.heap - lqa.heap) / db / 1024.0,
            (lqb.vmrss - lqa.vmrss) / db / 1024.0,
            ((lb.kcp.goroutines - ob.kcp.goroutines) - (la.kcp.goroutines - oa.kcp.goroutines)) / db,
            ((lb.kcp.watches - ob.kcp.watches) - (la.kcp.watches - oa.kcp.watches)) / db,
        );
    }
}

/// The marginal cost per quota'd workspace, from the sweep at the last step.
fn sweep_tables(md: &mut String, r: &Results, bs: &[usize]) {
    if let (Some(first), Some(lastl)) = (r.sweep.first(), r.sweep.last())
        && first.0 > lastl.0
    {
        let s = bs.len() - 1;
        let _ = writeln!(
            md,
            "\n## Marginal cost per quota'd workspace (configuration 3 at B = {}; standing quotas deleted)\n",
            bs[s]
        );
        let _ = writeln!(
            md,
            "| quota'd workspaces | engaged workspaces | tasks | jemalloc allocated MiB | VmRSS MiB | RssAnon MiB | TCP conns to the shard | lazyquota watches | shared watches | kcp WATCHes 3 − 2 | kcp goroutines 3 − 2 | kcp live heap MiB 3 − 2 |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        let base = r.readings.get(&(s, Config::KcpOnly));
        for (n, x) in &r.sweep {
            lq_row(md, &n.to_string(), x, base);
        }
        let _ = writeln!(
            md,
            "\n| quota'd workspaces from → to | tasks / ws | jemalloc KiB / ws | RSS KiB / ws | RssAnon KiB / ws | TCP conns / ws | lazyquota watches / ws | kcp WATCHes / ws | kcp goroutines / ws | kcp live heap KiB / ws |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
        let mut levels: Vec<&(usize, Reading)> = r.sweep.iter().rev().collect();
        levels.dedup_by_key(|(n, _)| *n);
        let mut pairs: Vec<(usize, usize)> = (1..levels.len()).map(|i| (i - 1, i)).collect();
        if levels.len() > 2 {
            pairs.push((0, levels.len() - 1));
        }
        for (lo, hi) in pairs {
            let ((nl, xl), (nh, xh)) = (levels[lo], levels[hi]);
            let (Some(lo_lq), Some(hi_lq)) = (xl.lq, xh.lq) else {
                continue;
            };
            let dq = (nh - nl) as f64;
            let stale = lo_lq.engaged < 0.5 && lo_lq.watches > 0.5;
            let _ = writeln!(
                md,
                "| {nl} → {nh} | {:.2} | {:.1} | {:.1} | {:.1} | {:.2} | {} | {:.2} | {:.2} | {:.1} |",
                (hi_lq.tasks - lo_lq.tasks) / dq,
                (hi_lq.heap - lo_lq.heap) / dq / 1024.0,
                (hi_lq.vmrss - lo_lq.vmrss) / dq / 1024.0,
                (hi_lq.anon - lo_lq.anon) / dq / 1024.0,
                (hi_lq.connections - lo_lq.connections) / dq,
                if stale {
                    "– (stale at 0)".to_owned()
                } else {
                    format!("{:.2}", (hi_lq.watches - lo_lq.watches) / dq)
                },
                (xh.kcp.watches - xl.kcp.watches) / dq,
                (xh.kcp.goroutines - xl.kcp.goroutines) / dq,
                (xh.kcp.live - xl.kcp.live) / dq / 1024.0,
            );
        }
    }
}

fn created(samples: Option<&Samples>, case: Case) -> Option<&Vec<Duration>> {
    samples.and_then(|x| x.create.get(&case))
}

/// Latency percentiles per step and case, and the run's timeline.
fn latencies(md: &mut String, r: &Results, bs: &[usize]) {
    let _ = writeln!(md, "\n## Latencies (p50 / p99 ms)\n");
    let _ = writeln!(
        md,
        "| B | case | create → status.used, kcp's controller (1) | create → status.used, lazyquota (3) | delete → disengaged (3) | delete → watches released (3) | samples that opened a watch |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for (s, b) in bs.iter().enumerate().skip(1) {
        let kcp = r.latency.get(&(s, Config::KcpQuota));
        let lq = r.latency.get(&(s, Config::Lazyquota));
        if kcp.is_none() && lq.is_none() {
            continue;
        }
        for case in Case::ALL {
            let (kcp_create, lq_create) = (created(kcp, case), created(lq, case));
            if kcp_create.is_none() && lq_create.is_none() {
                continue;
            }
            let _ = writeln!(
                md,
                "| {b} | {} | {} | {} | {} | {} | {} |",
                case.name(),
                p50_p99(kcp_create),
                p50_p99(lq_create),
                p50_p99(lq.and_then(|x| x.disengage.get(&case))),
                p50_p99(lq.and_then(|x| x.release.get(&case))),
                lq.map_or_else(
                    || "–".into(),
                    |x| x.opened.get(&case).copied().unwrap_or(0).to_string()
                ),
            );
        }
    }

    let _ = writeln!(md, "\n## Timeline\n\n| phase | s |\n|---|---|");
    for (what, d) in &r.timeline {
        let _ = writeln!(md, "| {what} | {:.1} |", d.as_secs_f64());
    }
}
