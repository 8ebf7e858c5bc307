//! The seed's shape across a sharded kcp (`--shards N`): a root shard and N − 1 more, a cache
//! server and a front-proxy (`tests/control-plane/kcp/start-sharded.sh`); the provider
//! workspaces and their APIExports on the root shard, consumer i on shard i mod N, its
//! APIBindings served through the cache server. At the last step only (every binding made),
//! with every shard restarted on its data for 1 and 2:
//!
//! 1. every shard with kcp's own quota controller,
//! 2. every shard without it,
//! 3. every shard without it plus one lazyquota per shard (`--kcp-shard-url` of that shard),
//!
//! each shard read (goroutines, heap, RSS, open watches; lazyquota's tasks, heap, RSS,
//! connections and watches) and sampled (quota create → status.used, from a watch) one shard at
//! a time.

mod report;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use futures::future::join_all;

use crate::latency::{Samples, sample, targets};
use crate::plan::{Args, Config, NS, Plan, Reading, STANDING, repo};
use crate::report::machine_facts;
use crate::scenario::{
    bind_step, close, create_exports, create_workspaces, lq_until, reset_status, settle, synced,
};
use crate::shard::{Lazyquota, Shard, call, facts, quota_body};

/// What the run measured; per configuration, one entry per shard in the shards' order.
#[derive(Default)]
pub(crate) struct Results {
    pub(crate) shards: Vec<String>,
    pub(crate) readings: BTreeMap<Config, Vec<Reading>>,
    pub(crate) first_sync: BTreeMap<Config, Vec<Duration>>,
    pub(crate) latency: BTreeMap<Config, Vec<Samples>>,
    /// Standing quotas on each shard.
    pub(crate) standing: Vec<usize>,
    pub(crate) timeline: Vec<(String, Duration)>,
    pub(crate) kcp_version: String,
    pub(crate) gc_forced: bool,
    pub(crate) machine: Vec<(String, String)>,
    pub(crate) done: bool,
}

/// Starts a sharded kcp of `n` shards in `dir` afresh, kcp's quota controller `quota`.
async fn start(dir: &Path, n: usize, quota: bool) -> Vec<Shard> {
    script(
        "start-sharded.sh",
        &[],
        &[
            ("LAZYQUOTA_KCP_DIR", dir.to_str().expect("UTF-8 state dir")),
            ("LAZYQUOTA_KCP_SHARDS", &n.to_string()),
            ("LAZYQUOTA_KCP_QUOTA", if quota { "on" } else { "off" }),
        ],
    )
    .await;
    open(dir).await
}

/// Restarts every shard on its data with kcp's quota controller `quota`: the root shard first
/// (the others read it), then the others at once.
async fn restart(dir: &Path, shards: &mut Vec<Shard>, quota: bool) {
    let quota = if quota { "on" } else { "off" };
    let d = dir.to_str().expect("UTF-8 state dir");
    let names: Vec<String> = shards.iter().filter_map(|s| s.name.clone()).collect();
    let env = [("LAZYQUOTA_KCP_QUOTA", quota)];
    let args: Vec<[&str; 2]> = names.iter().map(|n| [d, n.as_str()]).collect();
    script("restart-shard.sh", &args[0], &env).await;
    join_all(args[1..].iter().map(|a| script("restart-shard.sh", a, &env))).await;
    *shards = open(dir).await;
}

async fn script(name: &str, args: &[&str], env: &[(&str, &str)]) {
    let out = tokio::process::Command::new("bash")
        .arg(repo().join("tests/control-plane/kcp").join(name))
        .args(args)
        .envs(env.iter().copied())
        .env("LAZYQUOTA_KCP_TIMEOUT", "900")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(
        out.status.success(),
        "{name} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The shards of the sharded kcp in `dir`, from its env facts; kcp-admin through the front-proxy.
async fn open(dir: &Path) -> Vec<Shard> {
    let f = facts(dir);
    let n: usize = f["LAZYQUOTA_KCP_SHARDS"].parse().expect("shard count");
    let front = (
        PathBuf::from(&f["LAZYQUOTA_KCP_KUBECONFIG"]),
        f["LAZYQUOTA_KCP_URL"].clone(),
    );
    let mut shards = Vec::new();
    for i in 0..n {
        let fact = |k: &str| f[&format!("LAZYQUOTA_KCP_SHARD_{i}_{k}")].clone();
        shards.push(
            Shard::open(
                PathBuf::from(fact("KUBECONFIG")),
                fact("URL"),
                fact("PID").parse().expect("pid"),
                Some(front.clone()),
                (Some(fact("NAME")), (i, n)),
            )
            .await,
        );
    }
    shards
}

pub(crate) async fn run(args: &Args, dir: &Path, bin: &Path, started: Instant) {
    let plan = Plan::new(args);
    let n = args.shards;
    let k = plan.per_workspace;
    let mut res = Results {
        machine: machine_facts(),
        ..Results::default()
    };
    eprintln!(
        "kcp-sharded: {n} shards, W={} consumers, E={} exports in P={} providers on the root shard, K={k}, {} quota'd, state {}",
        args.workspaces,
        args.exports,
        args.providers,
        plan.quotaed.len(),
        dir.display()
    );
    let t = Instant::now();
    // The bounded run (CI) makes its data with kcp's quota controller already on and reads 1
    // without restarting every shard: a restart of them all costs CI about 45 s, and the
    // restart code runs anyway for 2.
    let mut shards = start(dir, n, args.quick).await;
    res.timeline.push((
        format!("{n} shards, cache server and front-proxy started (empty)"),
        t.elapsed(),
    ));
    res.shards = shards.iter().filter_map(|s| s.name.clone()).collect();
    res.kcp_version = shards[0].version().await;
    res.gc_forced = shards[0].force_gc().await;

    let t = Instant::now();
    create_workspaces(&shards[0], &plan.providers, args.concurrency).await;
    create_exports(&shards[0], &plan, args.concurrency).await;
    res.timeline.push((
        format!(
            "{} provider workspaces and {} APIExports on the root shard",
            plan.providers.len(),
            plan.exports.len()
        ),
        t.elapsed(),
    ));
    let mut by_name = BTreeMap::new();
    for shard in &shards {
        let t = Instant::now();
        let names: Vec<String> = (0..plan.consumers.len())
            .filter(|&i| shard.hosts(i))
            .map(|i| plan.consumers[i].clone())
            .collect();
        by_name.extend(create_workspaces(shard, &names, args.concurrency).await);
        placed(shard, &names, &by_name).await;
        res.timeline.push((
            format!("{} consumer workspaces on {}", names.len(), name(shard)),
            t.elapsed(),
        ));
    }
    let clusters: Vec<String> = plan.consumers.iter().map(|c| by_name[c].clone()).collect();
    let last = plan.steps.len() - 1;
    for shard in &shards {
        let mut timeline = Vec::new();
        bind_step(shard, &plan, &clusters, (0, k), args, &mut timeline).await;
        res.timeline.extend(
            timeline
                .into_iter()
                .map(|(what, d)| (format!("{}: {what}", name(shard)), d)),
        );
    }
    let standing = plan.standing(last);
    let mine: Vec<Vec<(usize, String)>> = shards
        .iter()
        .map(|s| standing.iter().filter(|(i, _)| s.hosts(*i)).cloned().collect())
        .collect();
    res.standing = mine.iter().map(Vec::len).collect();
    for (shard, quotas) in shards.iter().zip(&mine) {
        for (i, key) in quotas {
            call(
                &shard.root,
                "POST",
                &format!("/clusters/{}/api/v1/namespaces/{NS}/resourcequotas", clusters[*i]),
                Some(&quota_body(STANDING, key)),
            )
            .await
            .unwrap_or_else(|e| panic!("standing quota in root:c-{i:04} on {}: {e}", name(shard)));
        }
    }
    eprintln!("kcp-sharded: data ready after {:?}", started.elapsed());
    let patience = Duration::from_secs(300 + standing.len() as u64);
    let reset = async |shards: &[Shard]| {
        for (shard, quotas) in shards.iter().zip(&mine) {
            reset_status(shard, &clusters, quotas, args.concurrency).await;
        }
    };

    // 1: every shard with kcp's quota controller.
    if !args.quick {
        reset(&shards).await;
        let t = Instant::now();
        restart(dir, &mut shards, true).await;
        res.timeline
            .push(("every shard restarted, quota on".into(), t.elapsed()));
    }
    let who = "kcp's quota controller";
    let first = join_all(shards.iter().zip(&mine).map(|(shard, quotas)| {
        synced(
            shard,
            &clusters,
            (STANDING, quotas),
            args.objects,
            patience,
            who,
            None,
        )
    }))
    .await;
    res.first_sync.insert(Config::KcpQuota, first);
    let readings = join_all(shards.iter_mut().map(|s| settle(s, None, args, args.settle))).await;
    res.readings.insert(Config::KcpQuota, readings);
    let mut samples = Vec::new();
    for shard in &shards {
        let targets = targets(&plan, last, (args.shared_threshold, args.samples), shard);
        samples.push(sample(shard, &clusters, &targets, args.objects, args.type_gap, None).await);
    }
    res.latency.insert(Config::KcpQuota, samples);
    report::write(args, &plan, &res, started);

    // 2: every shard without it, the same status writes as in 1 and 3.
    let t = Instant::now();
    restart(dir, &mut shards, false).await;
    res.timeline
        .push(("every shard restarted, quota off".into(), t.elapsed()));
    reset(&shards).await;
    let readings = join_all(shards.iter_mut().map(|s| settle(s, None, args, args.settle))).await;
    res.readings.insert(Config::KcpOnly, readings);

    // 3: one lazyquota per shard.
    let mut lqs: Vec<Lazyquota> = shards
        .iter()
        .map(|s| {
            Lazyquota::start(
                s,
                dir,
                bin,
                &format!("shard-{}", name(s)),
                args.shared_threshold,
                None,
            )
        })
        .collect();
    let t = Instant::now();
    let first = join_all(
        shards
            .iter()
            .zip(&mine)
            .zip(lqs.iter_mut())
            .map(|((shard, quotas), lq)| {
                synced(
                    shard,
                    &clusters,
                    (STANDING, quotas),
                    args.objects,
                    patience,
                    "lazyquota",
                    Some(lq),
                )
            }),
    )
    .await;
    res.first_sync.insert(Config::Lazyquota, first);
    res.timeline
        .push(("one lazyquota per shard synced".into(), t.elapsed()));
    for (lq, quotas) in lqs.iter_mut().zip(&mine) {
        let want = quotas.len() as f64;
        lq_until(lq, "engaging the quota'd workspaces", |e, _| close(e, want)).await;
    }
    let fixed = args.lq_settle.max(args.settle);
    let readings = join_all(
        shards
            .iter_mut()
            .zip(lqs.iter_mut())
            .map(|(s, lq)| settle(s, Some(lq), args, fixed)),
    )
    .await;
    res.readings.insert(Config::Lazyquota, readings);
    let mut samples = Vec::new();
    for (shard, lq) in shards.iter().zip(lqs.iter_mut()) {
        let targets = targets(&plan, last, (args.shared_threshold, args.samples), shard);
        samples.push(sample(shard, &clusters, &targets, args.objects, args.type_gap, Some(lq)).await);
    }
    res.latency.insert(Config::Lazyquota, samples);
    drop(lqs);
    res.done = true;
    report::write(args, &plan, &res, started);
}

fn name(shard: &Shard) -> &str {
    shard.name.as_deref().unwrap_or("the shard")
}

/// Checks kcp placed each of `names` on `shard`: its LogicalCluster is in the shard's own
/// wildcard list.
async fn placed(shard: &Shard, names: &[String], by_name: &BTreeMap<String, String>) {
    let list = call(
        &shard.root,
        "GET",
        "/clusters/*/apis/core.kcp.io/v1alpha1/logicalclusters",
        None,
    )
    .await
    .unwrap_or_else(|e| panic!("LogicalClusters of {}: {e}", name(shard)));
    let here: Vec<&str> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["metadata"]["annotations"]["kcp.io/cluster"].as_str())
        .collect();
    for n in names {
        assert!(
            here.contains(&by_name[n].as_str()),
            "workspace root:{n} ({}) is not on shard {}",
            by_name[n],
            name(shard)
        );
    }
}
