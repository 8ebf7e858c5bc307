//! The result files: `scale.md`, `scale.dat` and, with gnuplot, `scale.png`.

use std::{fmt::Write as _, process::Command};

use crate::common::{
    self,
    stats::{ms, percentile},
};
use crate::plan::{Args, Controller, Results};

pub(crate) fn write_results(args: &Args, results: &Results) {
    let controllers = &args.controllers;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Scale benchmark: KCM's quota controller vs lazyquota eager vs lazy\n"
    );
    let _ = writeln!(
        md,
        "{} \
         Tasks are goroutines for KCM and tokio alive tasks for lazyquota; \"heap\" is a different measure on each \
         side — Go's heap in use (`go_memstats_heap_inuse_bytes`) for KCM, jemalloc's allocated bytes for \
         lazyquota — so compare RSS and anonymous RSS (`VmRSS`, `RssAnon` from /proc) across them. KCM runs with \
         `--kube-api-qps 1000 --kube-api-burst 2000` (client-go's default 20/30 would throttle it; lazyquota has \
         no client-side limiter). The order of the controllers is reversed at every other N. {}. Commit: `{}`.\n",
        args.generated_by(),
        common::binary_note(),
        common::commit(),
    );
    let _ = writeln!(
        md,
        "| N | controller | tasks | heap MiB | RSS MiB | anon RSS MiB | watch conns (ss) | apiserver watches | first sync ms | new quota p50/p99 ms | second quota on watched pods, requests.cpu, p50/p99 ms | … requests.memory and limits.memory | … requests.cpu, NotTerminating | delete p50/p99 ms |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mib = |b: f64| b / 1_048_576.0;
    // Every measured (N, controller) in the table's order.
    let rows = || {
        args.crds.iter().flat_map(move |&n| {
            controllers
                .iter()
                .filter_map(move |c| results.get(&(n, c.name())).map(|s| (n, c, s)))
        })
    };
    for (n, c, s) in rows() {
        let _ = writeln!(
            md,
            "| {n} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} | {} | {}/{} | {}/{} | {}/{} | {}/{} | {}/{} |",
            c.name(),
            s.tasks,
            mib(s.heap_bytes),
            mib(s.rss_bytes),
            mib(s.anon_bytes),
            s.connections,
            s.apiserver_watches,
            s.first_sync.as_millis(),
            ms(percentile(&s.new_quota, 50.0)),
            ms(percentile(&s.new_quota, 99.0)),
            ms(percentile(&s.typed_quota, 50.0)),
            ms(percentile(&s.typed_quota, 99.0)),
            ms(percentile(&s.memory_quota, 50.0)),
            ms(percentile(&s.memory_quota, 99.0)),
            ms(percentile(&s.scoped_quota, 50.0)),
            ms(percentile(&s.scoped_quota, 99.0)),
            ms(percentile(&s.delete, 50.0)),
            ms(percentile(&s.delete, 99.0)),
        );
    }
    let _ = writeln!(md, "\n## CPU and bytes of the first sync\n");
    let _ = writeln!(
        md,
        "From the controller's start until every quota of the data has its status: the controller's CPU \
         seconds and kube-apiserver's (user + system, /proc/<pid>/stat; the apiserver's include the \
         harness polling the quotas, the same for each controller), and the bytes the controller had \
         received from the apiserver over its open connections once settled (`ss -ti`, `bytes_received`).\n"
    );
    let _ = writeln!(
        md,
        "| N | controller | controller CPU s | kube-apiserver CPU s | received MiB |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|");
    for (n, c, s) in rows() {
        let _ = writeln!(
            md,
            "| {n} | {} | {:.2} | {:.2} | {:.2} |",
            c.name(),
            s.sync_cpu,
            s.sync_apiserver_cpu,
            mib(s.received_bytes),
        );
    }
    let slope_table = |md: &mut String, lo: usize, hi: usize, title: &str| {
        let _ = writeln!(md, "\n## {title} (slope from N = {lo} to N = {hi})\n");
        let _ = writeln!(
            md,
            "| controller | tasks / CRD | heap KiB / CRD | RSS KiB / CRD | watch conns / CRD | apiserver watches / CRD |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|");
        let dn = (hi - lo) as f64;
        for c in controllers {
            let (Some(a), Some(b)) = (results.get(&(lo, c.name())), results.get(&(hi, c.name()))) else {
                continue;
            };
            let _ = writeln!(
                md,
                "| {} | {:.3} | {:.2} | {:.2} | {:.3} | {:.3} |",
                c.name(),
                (b.tasks - a.tasks) / dn,
                (b.heap_bytes - a.heap_bytes) / dn / 1024.0,
                (b.rss_bytes - a.rss_bytes) / dn / 1024.0,
                (b.connections - a.connections) / dn,
                (b.apiserver_watches - a.apiserver_watches) / dn,
            );
        }
    };
    let ns = &args.crds;
    if let (Some(&lo), Some(&hi)) = (ns.first(), ns.last())
        && hi > lo
    {
        slope_table(&mut md, lo, hi, "Marginal cost per CRD, K of them constrained");
        // Between the two largest N, both with all K constrained CRDs present, every added
        // CRD is unconstrained: the cost the mission is about.
        let above: Vec<usize> = ns.iter().copied().filter(|n| *n >= args.constrained).collect();
        if let [.., a, b] = above[..] {
            slope_table(&mut md, a, b, "Marginal cost per unconstrained CRD");
        }
    }
    if let Some(&hi) = ns.last()
        && let (Some(kcm), Some(lazy)) = (
            results.get(&(hi, Controller::Kcm.name())),
            results.get(&(hi, Controller::Lazy.name())),
        )
    {
        let _ = writeln!(
            md,
            "\nAt N = {hi}: RSS lazy / KCM = {:.3}; anonymous (private) RSS lazy / KCM = {:.3}. File-backed RSS is \
             mostly each program's own binary pages, shared with the page cache.",
            lazy.rss_bytes / kcm.rss_bytes,
            lazy.anon_bytes / kcm.anon_bytes
        );
    }
    if let Some(&hi) = ns.last()
        && let Some(kcm) = results.get(&(hi, Controller::Kcm.name()))
    {
        for c in controllers {
            if let (Controller::LazyBinary(..), Some(variant)) = (c, results.get(&(hi, c.name()))) {
                let _ = writeln!(
                    md,
                    "At N = {hi}: RSS {} / KCM = {:.3}; anonymous RSS / KCM = {:.3}.",
                    c.name(),
                    variant.rss_bytes / kcm.rss_bytes,
                    variant.anon_bytes / kcm.anon_bytes
                );
            }
        }
    }
    std::fs::write(args.out.join("scale.md"), &md).expect("write scale.md");
    let mut dat =
        String::from("# N kcm_rss_mib eager_rss_mib lazy_rss_mib kcm_tasks eager_tasks lazy_tasks\n");
    for &n in &args.crds {
        let get = |c: Controller| results.get(&(n, c.name())).cloned().unwrap_or_default();
        let (k, e, l) = (
            get(Controller::Kcm),
            get(Controller::Eager),
            get(Controller::Lazy),
        );
        let _ = writeln!(
            dat,
            "{n} {:.2} {:.2} {:.2} {:.0} {:.0} {:.0}",
            mib(k.rss_bytes),
            mib(e.rss_bytes),
            mib(l.rss_bytes),
            k.tasks,
            e.tasks,
            l.tasks
        );
    }
    std::fs::write(args.out.join("scale.dat"), &dat).expect("write scale.dat");
    let plot = String::from(
        "set terminal pngcairo size 1200,500\nset output 'scale.png'\nset multiplot layout 1,2\n\
         set key top left\nset xlabel 'N (namespaced CRDs)'\nset grid\n\
         set title 'RSS (MiB)'\nplot 'scale.dat' u 1:2 w lp t 'KCM quota controller', '' u 1:3 w lp t 'lazyquota eager', '' u 1:4 w lp t 'lazyquota lazy'\n\
         set title 'goroutines (KCM) / tokio tasks (lazyquota)'\nplot 'scale.dat' u 1:5 w lp t 'KCM quota controller', '' u 1:6 w lp t 'lazyquota eager', '' u 1:7 w lp t 'lazyquota lazy'\n\
         unset multiplot\n",
    );
    let script = args.out.join("scale.gp");
    std::fs::write(&script, &plot).expect("write scale.gp");
    // Relative paths, so the committed script is the same wherever the repository lives.
    match Command::new("gnuplot")
        .current_dir(&args.out)
        .arg("scale.gp")
        .status()
    {
        Ok(s) if s.success() => eprintln!("scale: wrote {}/scale.png", args.out.display()),
        _ => eprintln!("scale: gnuplot not available; no PNG (apt-get install gnuplot-nox)"),
    }
    println!("{md}");
}
