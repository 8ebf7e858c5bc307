//! The whole run: the steps in order, each configuration read at each, the latency samples
//! and the exact-heap series.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use futures::{StreamExt as _, stream};

use crate::latency::{sample, targets, touch_types};
use crate::plan::{Args, Config, ENGAGED, NS, Plan, Reading, Results, STANDING};
use crate::report::{machine_facts, write_results};
use crate::scenario::{
    bind_step, close, create_exports, create_quotas, create_workspaces, delete_quota, lq_until, reset_status,
    settle, synced,
};
use crate::shard::{Lazyquota, Shard, call, quota_body, start_kcp};

pub(crate) async fn run(args: &Args, dir: &Path, bin: &Path, started: Instant) {
    let plan = Plan::new(args);
    let mut res = Results {
        machine: machine_facts(),
        ..Results::default()
    };
    let last = plan.steps.len() - 1;
    eprintln!(
        "kcp: W={} consumers, E={} exports in P={} providers, K={} bindings each (steps {:?}), {} quota'd, state {}",
        args.workspaces,
        args.exports,
        args.providers,
        args.bindings_per_workspace,
        plan.steps,
        plan.quotaed.len(),
        dir.display()
    );

    let t = Instant::now();
    let mut shard = start_kcp(dir, false, false).await;
    res.timeline.push(("kcp started (empty)".into(), t.elapsed()));
    res.kcp_version = shard.version().await;
    res.gc_forced = shard.force_gc().await;

    let t = Instant::now();
    let providers = create_workspaces(&shard, &plan.providers, args.concurrency).await;
    create_exports(&shard, &plan, args.concurrency).await;
    res.timeline.push((
        format!(
            "{} provider workspaces and {} APIExports",
            providers.len(),
            plan.exports.len()
        ),
        t.elapsed(),
    ));
    let t = Instant::now();
    let by_name = create_workspaces(&shard, &plan.consumers, args.concurrency).await;
    let clusters: Vec<String> = plan.consumers.iter().map(|n| by_name[n].clone()).collect();
    res.timeline.push((
        format!("{} consumer workspaces Ready and serving", clusters.len()),
        t.elapsed(),
    ));
    eprintln!("kcp: workspaces ready after {:?}", started.elapsed());

    for s in 0..plan.steps.len() {
        let b = plan.steps[s] * plan.consumers.len();
        let standing = plan.standing(s);
        if s > 0 {
            // kcp runs without its quota controller and nothing else writes: the new data
            // first, then the new standing quotas (quota admission needs a status for them).
            let mut timeline = Vec::new();
            bind_step(
                &shard,
                &plan,
                &clusters,
                (plan.steps[s - 1], plan.steps[s]),
                args,
                &mut timeline,
            )
            .await;
            res.timeline.extend(timeline);
            for (i, key) in plan.standing(s).iter().skip(plan.standing(s - 1).len()) {
                call(
                    &shard.root,
                    "POST",
                    &format!("/clusters/{}/api/v1/namespaces/{NS}/resourcequotas", clusters[*i]),
                    Some(&quota_body(STANDING, key)),
                )
                .await
                .unwrap_or_else(|e| panic!("standing quota in root:c-{i:04}: {e}"));
            }
        }
        eprintln!("kcp: B={b}: data ready after {:?}", started.elapsed());
        // The bounded run (CI) reads the last step only: the earlier steps' restarts and
        // readings run the same code at a smaller B, and cost CI about 45 s.
        if (args.latency_only || args.quick) && s != last {
            continue;
        }
        reset_status(&shard, &clusters, &standing, args.concurrency).await;
        let targets = targets(&plan, s, (args.shared_threshold, args.samples), &shard);

        // 1: kcp with its quota controller, restarted on the data.
        let t = Instant::now();
        shard = start_kcp(dir, true, true).await;
        res.timeline
            .push((format!("B={b}: kcp restarted, quota on"), t.elapsed()));
        let patience = Duration::from_secs(300 + standing.len() as u64);
        let first = synced(
            &shard,
            &clusters,
            (STANDING, &standing),
            args.objects,
            patience,
            "kcp's quota controller",
            None,
        )
        .await;
        if !standing.is_empty() {
            res.first_sync.insert((s, Config::KcpQuota), first);
        }
        read(
            &mut shard,
            None,
            args,
            args.settle,
            (s, b, Config::KcpQuota),
            &mut res,
        )
        .await;
        if s > 0 {
            if args.touch_types {
                touch_types(&shard, &clusters, &targets).await;
            }
            let samples = sample(&shard, &clusters, &targets, args.objects, args.type_gap, None).await;
            res.latency.insert((s, Config::KcpQuota), samples);
        }

        // 2: the same data, kcp without its quota controller.
        let t = Instant::now();
        shard = start_kcp(dir, false, true).await;
        res.timeline
            .push((format!("B={b}: kcp restarted, quota off"), t.elapsed()));
        // The same writes as in 1 and 3 (kcp's quota admission keeps per-workspace state for
        // every workspace written to since the start): status.used to 0 for lazyquota's first sync.
        reset_status(&shard, &clusters, &standing, args.concurrency).await;
        read(
            &mut shard,
            None,
            args,
            args.settle,
            (s, b, Config::KcpOnly),
            &mut res,
        )
        .await;

        // 3: lazyquota on the shard (kcp's quota controller still off, nothing wrote since).
        let mut lq = Lazyquota::start(&shard, dir, bin, &format!("b{b}"), args.shared_threshold, None);
        let first = synced(
            &shard,
            &clusters,
            (STANDING, &standing),
            args.objects,
            patience,
            "lazyquota",
            Some(&mut lq),
        )
        .await;
        if !standing.is_empty() {
            res.first_sync.insert((s, Config::Lazyquota), first);
        }
        let quota_count = standing.len() as f64;
        lq_until(&mut lq, "engaging the quota'd workspaces", |e, _| {
            close(e, quota_count)
        })
        .await;
        let fixed = args.lq_settle.max(args.settle);
        read(
            &mut shard,
            Some(&mut lq),
            args,
            fixed,
            (s, b, Config::Lazyquota),
            &mut res,
        )
        .await;
        if s > 0 {
            if args.touch_types {
                touch_types(&shard, &clusters, &targets).await;
            }
            let samples = sample(
                &shard,
                &clusters,
                &targets,
                args.objects,
                args.type_gap,
                Some(&mut lq),
            )
            .await;
            res.latency.insert((s, Config::Lazyquota), samples);
        }
        if s == last && !args.latency_only {
            // Fewer quota'd workspaces, same bindings: lazyquota's cost per engaged workspace.
            // Read again after the latency samples: kcp's quota admission keeps per-workspace
            // state (evaluator goroutines) for the workspaces the samples touched.
            let again = settle(&mut shard, Some(&mut lq), args, args.lq_settle.max(args.settle)).await;
            eprintln!("kcp: B={b} lazyquota after the samples: {again:?}");
            res.sweep.push((standing.len(), again));
            let mut levels = vec![standing.len() / 2, 0];
            levels.dedup();
            let mut left = standing.len();
            for level in levels {
                if level >= left {
                    continue;
                }
                while left > level {
                    left -= 1;
                    delete_quota(&shard, &clusters[standing[left].0], STANDING).await;
                }
                let want = left as f64;
                lq_until(&mut lq, "disengaging deleted quotas' workspaces", |e, _| {
                    close(e, want)
                })
                .await;
                let reading = settle(&mut shard, Some(&mut lq), args, args.settle).await;
                eprintln!("kcp: B={b} lazyquota with {left} quota'd workspaces: {reading:?}");
                res.sweep.push((left, reading));
            }
        }
        drop(lq);
        if s == last && args.exact_steps > 0 && !args.latency_only {
            let t = Instant::now();
            (res.exact, res.exact_after) = exact_series(
                &mut shard,
                &plan,
                &clusters,
                args,
                dir,
                (bin, "exact", args.shared_threshold),
            )
            .await;
            res.timeline
                .push((format!("B={b}: exact-heap series"), t.elapsed()));
            let mut more: Vec<(String, &Path, usize)> = Vec::new();
            if let Some((label, baseline)) = &args.exact_baseline {
                more.push((label.clone(), baseline, args.shared_threshold));
            }
            if args.exact_own_watches {
                more.push(("own watches (--kcp-shared-watch-threshold 0)".into(), bin, 0));
            }
            for (i, (label, binary, threshold)) in more.into_iter().enumerate() {
                let t = Instant::now();
                let tag = format!("exact-{i}");
                let (levels, after) =
                    exact_series(&mut shard, &plan, &clusters, args, dir, (binary, &tag, threshold)).await;
                res.timeline
                    .push((format!("B={b}: exact-heap series, {label}"), t.elapsed()));
                res.exact_more.push((label, levels, after));
            }
        }
        if s == last && args.cost_runs > 0 {
            let t = Instant::now();
            cost_series(&mut shard, &clusters, &standing, args, dir, &mut res).await;
            res.timeline
                .push((format!("B={b}: {} on/off pairs", args.cost_runs), t.elapsed()));
        }
        res.done = s == last;
        write_results(args, &plan, &res, started);
    }
}

/// Reads configuration `config` at step `s` (B = `b`) into the results, unless the run only
/// samples latencies.
async fn read(
    shard: &mut Shard,
    lq: Option<&mut Lazyquota>,
    args: &Args,
    fixed: Duration,
    (s, b, config): (usize, usize, Config),
    res: &mut Results,
) {
    if args.latency_only {
        return;
    }
    let reading = settle(shard, lq, args, fixed).await;
    eprintln!("kcp: B={b} {}: {reading:?}", config.name());
    res.readings.insert((s, config), reading);
}

/// The exact-heap series, at the last step once the standing quotas are gone: a new lazyquota
/// with jemalloc's thread caches off (`_RJEM_MALLOC_CONF=tcache:false`), so that
/// `stats.allocated` counts exactly the bytes the program holds (with caches on, freed objects
/// parked in a thread's cache count as allocated, and how many are parked moves from one
/// reading to the next by more than the figure sought). One warm-up engagement (consumer 0,
/// then deleted), then a quota `engaged` in the first 0, W/n, …, W consumers (consumer i on
/// its binding i mod K, so the types are spread), read at each level; then every one deleted
/// and read again. Returns the levels' readings and the one after.
pub(crate) async fn exact_series(
    shard: &mut Shard,
    plan: &Plan,
    clusters: &[String],
    args: &Args,
    dir: &Path,
    (bin, label, shared_threshold): (&Path, &str, usize),
) -> (Vec<(usize, Reading)>, Option<Reading>) {
    let k = plan.per_workspace;
    let quotas: Vec<(usize, String)> = (0..clusters.len()).map(|i| (i, plan.key(i, i % k))).collect();
    let mut lq = Lazyquota::start(shard, dir, bin, label, shared_threshold, Some("tcache:false"));
    let patience = Duration::from_secs(300 + quotas.len() as u64);
    let who = "lazyquota (exact heap)";
    // The warm-up also proves lazyquota listed the shard before the first reading.
    create_quotas(shard, clusters, &quotas[..1], args.concurrency).await;
    synced(
        shard,
        clusters,
        (ENGAGED, &quotas[..1]),
        args.objects,
        patience,
        who,
        Some(&mut lq),
    )
    .await;
    delete_quota(shard, &clusters[0], ENGAGED).await;
    lq_until(&mut lq, "disengaging the warm-up workspace", |e, _| close(e, 0.0)).await;
    let fixed = args.lq_settle.max(args.settle);
    let mut done = 0;
    let mut levels = Vec::new();
    for step in 0..=args.exact_steps {
        let level = step * quotas.len() / args.exact_steps;
        create_quotas(shard, clusters, &quotas[done..level], args.concurrency).await;
        done = level;
        synced(
            shard,
            clusters,
            (ENGAGED, &quotas[..level]),
            args.objects,
            patience,
            who,
            Some(&mut lq),
        )
        .await;
        let want = level as f64;
        lq_until(&mut lq, "engaging the exact series' workspaces", |e, _| {
            close(e, want)
        })
        .await;
        let reading = settle(shard, Some(&mut lq), args, fixed).await;
        eprintln!("kcp: exact heap ({label}), {level} engaged: {reading:?}");
        levels.push((level, reading));
    }
    stream::iter(&quotas[..done])
        .for_each_concurrent(args.concurrency, |(i, _)| {
            delete_quota(shard, &clusters[*i], ENGAGED)
        })
        .await;
    lq_until(&mut lq, "disengaging the exact series' workspaces", |e, _| {
        close(e, 0.0)
    })
    .await;
    let after = settle(shard, Some(&mut lq), args, fixed).await;
    eprintln!("kcp: exact heap ({label}), all deleted again: {after:?}");
    (levels, Some(after))
}

/// kcp's quota controller's cost read again and again (`--cost-runs` pairs at the last step,
/// on then off, on the same data): one pair is one difference of two noisy readings, so the
/// spread over several says what the difference is worth. Each process sees the same status
/// writes as in configurations 1 and 2: every standing quota's status is reset to 0 before kcp
/// starts with its controller (which writes it back), and by the bench after kcp starts
/// without.
async fn cost_series(
    shard: &mut Shard,
    clusters: &[String],
    standing: &[(usize, String)],
    args: &Args,
    dir: &Path,
    res: &mut Results,
) {
    let patience = Duration::from_secs(300 + standing.len() as u64);
    for run in 1..=args.cost_runs {
        reset_status(shard, clusters, standing, args.concurrency).await;
        *shard = start_kcp(dir, true, true).await;
        synced(
            shard,
            clusters,
            (STANDING, standing),
            args.objects,
            patience,
            "kcp's quota controller",
            None,
        )
        .await;
        let on = settle(shard, None, args, args.settle).await;
        *shard = start_kcp(dir, false, true).await;
        reset_status(shard, clusters, standing, args.concurrency).await;
        let off = settle(shard, None, args, args.settle).await;
        eprintln!(
            "kcp: cost run {run}: Δ goroutines {:.0}, Δ live heap {:.1} MiB",
            on.kcp.goroutines - off.kcp.goroutines,
            (on.kcp.live - off.kcp.live) / 1_048_576.0
        );
        res.cost.push((on, off));
    }
}
