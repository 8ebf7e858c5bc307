//! The kcp report's exact-heap section: the series' readings, the slopes between them, the
//! least-squares cost per engaged workspace, and the further series (`--exact-baseline`,
//! `--exact-own-watches`) beside it.

use std::fmt::Write as _;

use super::{lq_row, mib};
use crate::common::{self, stats::slope};
use crate::plan::{Args, Config, ENGAGED, LqFigures, Plan, Reading, Results};

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
