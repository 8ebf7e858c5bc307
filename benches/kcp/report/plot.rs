//! The plot: `kcp.dat` (the steps, then the quota'd-workspace sweep), `kcp.gp` and, with
//! gnuplot installed, `kcp.png`.

use std::{fmt::Write as _, process::Command};

use super::mib;
use crate::plan::{Args, Config, Results};

/// Writes the data and, when the run finished, the script and the PNG.
pub(crate) fn write(args: &Args, r: &Results, bs: &[usize]) {
    let mut dat = String::from(
        "# B kcpq_goroutines kcp_goroutines kcp_with_lq_goroutines kcpq_live_mib kcp_live_mib \
         kcp_with_lq_live_mib kcpq_heap_inuse_mib kcp_heap_inuse_mib kcpq_rss_mib kcp_rss_mib lq_tasks \
         lq_heap_mib lq_rss_mib lq_watches kcp_watches_3_minus_2\n",
    );
    for (s, b) in bs.iter().enumerate() {
        // A step without all three readings (a `--latency-only` run reads none; a run that
        // stopped early lacks the last ones) has no row: zeros would plot as measured.
        let get = |c| r.readings.get(&(s, c)).copied();
        let (Some(one), Some(two), Some(three)) = (
            get(Config::KcpQuota),
            get(Config::KcpOnly),
            get(Config::Lazyquota),
        ) else {
            continue;
        };
        let Some(l) = three.lq else { continue };
        let _ = writeln!(
            dat,
            "{b} {:.0} {:.0} {:.0} {:.2} {:.2} {:.2} {:.2} {:.2} {:.2} {:.2} {:.0} {:.3} {:.2} {:.0} {:.0}",
            one.kcp.goroutines,
            two.kcp.goroutines,
            three.kcp.goroutines,
            mib(one.kcp.live),
            mib(two.kcp.live),
            mib(three.kcp.live),
            mib(one.kcp.heap),
            mib(two.kcp.heap),
            mib(one.kcp.rss_metric),
            mib(two.kcp.rss_metric),
            l.tasks,
            mib(l.heap),
            mib(l.vmrss),
            l.watches,
            three.kcp.watches - two.kcp.watches,
        );
    }
    let base = r
        .readings
        .get(&(bs.len() - 1, Config::KcpOnly))
        .copied()
        .unwrap_or_default();
    let _ = writeln!(
        dat,
        "\n\n# quotad_workspaces lq_tasks lq_heap_mib lq_rss_mib lq_watches lq_connections kcp_watches_3_minus_2"
    );
    for (n, x) in r.sweep.iter().rev() {
        let l = x.lq.unwrap_or_default();
        let _ = writeln!(
            dat,
            "{n} {:.0} {:.3} {:.2} {:.0} {:.0} {:.0}",
            l.tasks,
            mib(l.heap),
            mib(l.vmrss),
            l.watches,
            l.connections,
            x.kcp.watches - base.kcp.watches,
        );
    }
    std::fs::write(args.out.join("kcp.dat"), &dat).expect("write kcp.dat");
    if !r.done {
        return;
    }
    let plot = "set terminal pngcairo size 1500,450\nset output 'kcp.png'\nset multiplot layout 1,3\n\
         set key top left\nset grid\nset xlabel 'B (APIBindings)'\n\
         set title 'goroutines (kcp) / tokio tasks (lazyquota)'\n\
         plot 'kcp.dat' index 0 u 1:($2-$3) w lp t 'kcp quota controller (1-2)', \
         '' index 0 u 1:12 w lp t 'lazyquota tasks', '' index 0 u 1:($4-$3) w lp t 'kcp serving lazyquota (3-2)'\n\
         set title 'heap MiB (Go live heap / jemalloc allocated)'\n\
         plot 'kcp.dat' index 0 u 1:($5-$6) w lp t 'kcp quota controller (1-2)', \
         '' index 0 u 1:13 w lp t 'lazyquota', '' index 0 u 1:($7-$6) w lp t 'kcp serving lazyquota (3-2)'\n\
         set title 'lazyquota at the largest B'\nset xlabel 'quota''d (engaged) workspaces'\n\
         plot 'kcp.dat' index 1 u 1:2 w lp t 'lazyquota tasks', '' index 1 u 1:6 w lp t 'TCP connections', \
         '' index 1 u 1:7 w lp t 'kcp WATCHes (3-2)'\n\
         unset multiplot\n";
    std::fs::write(args.out.join("kcp.gp"), plot).expect("write kcp.gp");
    // Relative paths, so the committed script is the same wherever the repository lives.
    match Command::new("gnuplot")
        .current_dir(&args.out)
        .arg("kcp.gp")
        .status()
    {
        Ok(s) if s.success() => eprintln!("kcp: wrote {}/kcp.png", args.out.display()),
        _ => eprintln!("kcp: gnuplot not available; no PNG (apt-get install gnuplot-nox)"),
    }
}
