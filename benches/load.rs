//! Load and soak: many quotas, many objects, a steady delete rate, then churn for a while —
//! on the real control plane, with the real `lazyquota` binary as the only quota writer.
//!
//! ```text
//! cargo bench --bench load                 # 5,000 quotas / 500 namespaces / 50,000 objects,
//!                                          # 200 deletes/s for 60 s, a 10-minute soak
//! cargo bench --bench load -- --quick      # bounded (CI: `cargo test --workspace --bench load -- --quick`)
//! cargo bench --bench load -- --quotas 1000 --namespaces 100 --objects 10000 --soak 120
//! ```
//!
//! Phases: namespaces and objects (ConfigMaps) are created first, then lazyquota starts and
//! the quotas are created (10 per namespace, on `count/configmaps`, `configmaps` and
//! `count/secrets`); every quota must converge to a direct count. Then deletes at a fixed
//! rate; every quota must converge again. Then a soak: creates and deletes at a steady rate
//! while lazyquota's RSS and jemalloc heap are sampled; the memory slope is reported. Every
//! loop is bounded in count and time. Writes `load.md` into `benches/results/` (or `--out`).

#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::too_many_lines
)]

mod common;
use common::stats::slope;
#[allow(dead_code)] // the benchmark uses its HTTP helpers, not the process wrapper
#[path = "../tests/common/process.rs"]
mod process;

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use futures::{StreamExt as _, stream};
use k8s_openapi::{
    api::core::v1::{ConfigMap, Namespace, ResourceQuota, ResourceQuotaSpec},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, ObjectMeta, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};

struct Args {
    quotas: usize,
    namespaces: usize,
    objects: usize,
    delete_rate: usize,
    delete_seconds: u64,
    soak_seconds: u64,
    soak_rate: usize,
    out: PathBuf,
}

impl Args {
    fn parse() -> Self {
        let mut args = Self {
            quotas: 5_000,
            namespaces: 500,
            objects: 50_000,
            delete_rate: 200,
            delete_seconds: 60,
            soak_seconds: 600,
            soak_rate: 50,
            out: Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results"),
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            let mut value = || it.next().expect("flag value");
            match arg.as_str() {
                "--quick" => {
                    args.quotas = 500;
                    args.namespaces = 50;
                    args.objects = 5_000;
                    args.delete_rate = 50;
                    args.delete_seconds = 10;
                    args.soak_seconds = 30;
                    args.soak_rate = 20;
                    args.out = std::env::temp_dir().join("lazyquota-load-quick");
                }
                "--quotas" => args.quotas = value().parse().expect("--quotas N"),
                "--namespaces" => args.namespaces = value().parse().expect("--namespaces N"),
                "--objects" => args.objects = value().parse().expect("--objects N"),
                "--delete-rate" => args.delete_rate = value().parse().expect("--delete-rate N"),
                "--delete-seconds" => args.delete_seconds = value().parse().expect("--delete-seconds N"),
                "--soak" => args.soak_seconds = value().parse().expect("--soak SECONDS"),
                "--soak-rate" => args.soak_rate = value().parse().expect("--soak-rate N"),
                "--out" => args.out = PathBuf::from(value()),
                // cargo bench passes --bench to every harness.
                "--bench" => {}
                other => panic!("unknown flag {other}"),
            }
        }
        assert!(
            args.namespaces > 0 && args.quotas >= args.namespaces,
            "quotas ≥ namespaces > 0"
        );
        args
    }
}

fn main() {
    let args = Args::parse();
    std::fs::create_dir_all(&args.out).expect("output directory");
    let (state, _) = common::start_control_plane("bench-load");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let report = runtime.block_on(run(&args, &state));
    common::stop_control_plane(&state);
    let path = args.out.join("load.md");
    std::fs::write(&path, &report).expect("write report");
    println!("{report}");
    eprintln!("load: wrote {}", path.display());
    if NOT_CONVERGED.load(std::sync::atomic::Ordering::SeqCst) {
        eprintln!("load: error: some quotas did not converge to a direct count (see the report)");
        std::process::exit(1);
    }
}

/// Kills lazyquota when the run ends, however it ends.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const KEYS: [&str; 3] = ["count/configmaps", "configmaps", "count/secrets"];

async fn run(args: &Args, state: &Path) -> String {
    let kubeconfig = state.join("admin.kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig).expect("kubeconfig"),
        &KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    let client = Client::try_from(config).expect("client");
    let mut report = String::from("# Load and soak\n\n");
    let _ = writeln!(
        report,
        "`cargo bench --bench load -- --quotas {} --namespaces {} --objects {} --delete-rate {} --delete-seconds {} --soak {} --soak-rate {}` on the test control plane (kube-apiserver v1.36.3 and etcd on loopback), {}, {} cores, commit `{}`.\n",
        args.quotas,
        args.namespaces,
        args.objects,
        args.delete_rate,
        args.delete_seconds,
        args.soak_seconds,
        args.soak_rate,
        common::binary_note(),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        common::commit(),
    );

    // ---- namespaces and objects -------------------------------------------------------------
    let names: Vec<String> = (0..args.namespaces).map(|i| format!("load-{i}")).collect();
    let started = Instant::now();
    stream::iter(names.clone())
        .for_each_concurrent(16, |name| {
            let client = client.clone();
            async move {
                let ns = Namespace {
                    metadata: ObjectMeta {
                        name: Some(name),
                        ..ObjectMeta::default()
                    },
                    ..Namespace::default()
                };
                let _ = Api::<Namespace>::all(client)
                    .create(&PostParams::default(), &ns)
                    .await;
            }
        })
        .await;
    let per_ns = args.objects / args.namespaces;
    let objects: Vec<(String, String)> = names
        .iter()
        .flat_map(|ns| (0..per_ns).map(move |i| (ns.clone(), format!("cm-{i}"))))
        .collect();
    let created = create_configmaps(&client, &objects, 32).await;
    let setup = started.elapsed();
    let _ = writeln!(
        report,
        "Set-up: {} namespaces and {created} ConfigMaps in {:.0} s.\n",
        args.namespaces,
        setup.as_secs_f64()
    );

    // ---- lazyquota, then the quotas --------------------------------------------------------------
    let port = process::free_port();
    let log = std::fs::File::create(state.join("logs/lazyquota-load.log")).expect("log");
    let process = Process(
        Command::new(common::lazyquota_binary())
            .args(["run", "--kubeconfig", kubeconfig.to_str().unwrap()])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("lazyquota"),
    );
    let pid = process.0.id();
    let per_quota_ns = args.quotas / args.namespaces;
    let quotas: Vec<(String, String, &str)> = names
        .iter()
        .flat_map(|ns| (0..per_quota_ns).map(move |i| (ns.clone(), format!("q-{i}"), KEYS[i % KEYS.len()])))
        .collect();
    let started = Instant::now();
    stream::iter(quotas.clone())
        .for_each_concurrent(16, |(ns, name, key)| {
            let client = client.clone();
            async move {
                let quota = ResourceQuota {
                    metadata: ObjectMeta {
                        name: Some(name),
                        ..ObjectMeta::default()
                    },
                    spec: Some(ResourceQuotaSpec {
                        hard: Some([(key.to_owned(), Quantity("1000000".into()))].into()),
                        ..ResourceQuotaSpec::default()
                    }),
                    ..ResourceQuota::default()
                };
                let _ = Api::<ResourceQuota>::namespaced(client, &ns)
                    .create(&PostParams::default(), &quota)
                    .await;
            }
        })
        .await;
    let converged = converge(&client, Duration::from_mins(10)).await;
    let first = started.elapsed();
    let _ = writeln!(
        report,
        "| phase | result | time to converge |\n|---|---|---|\n| {} quotas created (lazyquota running) | {} | {:.1} s after the first create |",
        quotas.len(),
        verdict(&converged),
        first.as_secs_f64()
    );
    let after_quotas = sample(port, pid).await;

    // ---- deletes at a fixed rate -----------------------------------------------------------------
    let planned = (args.delete_rate as u64 * args.delete_seconds) as usize;
    // Spread over every namespace: the last objects of each, round-robin.
    let mut victims = Vec::with_capacity(planned);
    'outer: for i in (0..per_ns).rev() {
        for ns in &names {
            if victims.len() == planned {
                break 'outer;
            }
            victims.push((ns.clone(), format!("cm-{i}")));
        }
    }
    let started = Instant::now();
    let deleted = paced(&client, &victims, args.delete_rate, Op::Delete).await;
    let pace = started.elapsed();
    let settle = Instant::now();
    let converged = converge(&client, Duration::from_mins(10)).await;
    let _ = writeln!(
        report,
        "| {deleted} deletes at {}/s ({:.1} s) | {} | {:.1} s after the last delete |",
        args.delete_rate,
        pace.as_secs_f64(),
        verdict(&converged),
        settle.elapsed().as_secs_f64()
    );

    // ---- soak ---------------------------------------------------------------------------------------
    let mut samples = vec![(0.0, sample(port, pid).await)];
    let soak_start = Instant::now();
    let mut round = 0_usize;
    while soak_start.elapsed() < Duration::from_secs(args.soak_seconds) && round < 100_000 {
        // One second of churn: create then delete the same objects.
        let batch: Vec<(String, String)> = (0..args.soak_rate / 2)
            .map(|i| {
                (
                    names[(round * 7 + i) % names.len()].clone(),
                    format!("soak-{round}-{i}"),
                )
            })
            .collect();
        paced(&client, &batch, args.soak_rate, Op::Create).await;
        paced(&client, &batch, args.soak_rate, Op::Delete).await;
        round += 1;
        if round.is_multiple_of(10) {
            samples.push((soak_start.elapsed().as_secs_f64(), sample(port, pid).await));
        }
    }
    let converged = converge(&client, Duration::from_mins(5)).await;
    let _ = writeln!(
        report,
        "| soak: {round} s-rounds of {} creates + deletes | {} | after {:.0} s |\n",
        args.soak_rate / 2,
        verdict(&converged),
        soak_start.elapsed().as_secs_f64()
    );
    samples.push((soak_start.elapsed().as_secs_f64(), sample(port, pid).await));

    let _ = writeln!(
        report,
        "lazyquota after the quotas: RSS {:.1} MiB, jemalloc allocated {:.1} MiB, {} tasks, {} open watches.\n",
        after_quotas.rss / 1_048_576.0,
        after_quotas.heap / 1_048_576.0,
        after_quotas.tasks,
        after_quotas.watches
    );
    let _ = writeln!(
        report,
        "Soak samples (seconds into the soak):\n\n| s | RSS MiB | heap MiB | tasks |\n|---|---|---|---|"
    );
    for (t, s) in &samples {
        let _ = writeln!(
            report,
            "| {t:.0} | {:.2} | {:.2} | {} |",
            s.rss / 1_048_576.0,
            s.heap / 1_048_576.0,
            s.tasks
        );
    }
    let second_half: Vec<(f64, f64, f64)> = samples
        .iter()
        .filter(|(t, _)| *t >= args.soak_seconds as f64 / 2.0)
        .map(|(t, s)| (*t, s.rss, s.heap))
        .collect();
    let _ = writeln!(
        report,
        "\nMemory slope over the second half of the soak (least squares): RSS {:+.1} KiB/min, heap {:+.1} KiB/min ({} samples).",
        slope(second_half.iter().map(|(t, r, _)| (*t, *r))) * 60.0 / 1024.0,
        slope(second_half.iter().map(|(t, _, h)| (*t, *h))) * 60.0 / 1024.0,
        second_half.len()
    );
    drop(process);
    report
}

/// Set when some phase did not converge: the report is still written, then the run fails.
static NOT_CONVERGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn verdict(converged: &Result<usize, String>) -> String {
    match converged {
        Ok(n) => format!("all {n} quotas equal a direct count"),
        Err(e) => {
            NOT_CONVERGED.store(true, std::sync::atomic::Ordering::SeqCst);
            format!("NOT converged: {e}")
        }
    }
}

#[derive(Clone, Copy)]
enum Op {
    Create,
    Delete,
}

/// Runs `op` on each object at `rate` per second (bounded: as many as given, ~32 in flight).
async fn paced(client: &Client, objects: &[(String, String)], rate: usize, op: Op) -> usize {
    let interval = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for (ns, name) in objects {
        ticker.tick().await;
        while tasks.len() >= 32 {
            tasks.join_next().await;
        }
        let (client, ns, name, done) = (client.clone(), ns.clone(), name.clone(), done.clone());
        tasks.spawn(async move {
            let api = Api::<ConfigMap>::namespaced(client, &ns);
            let ok = match op {
                Op::Create => api
                    .create(&PostParams::default(), &configmap(&name))
                    .await
                    .is_ok(),
                Op::Delete => api.delete(&name, &DeleteParams::default()).await.is_ok(),
            };
            if ok {
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    done.load(std::sync::atomic::Ordering::Relaxed)
}

fn configmap(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

async fn create_configmaps(client: &Client, objects: &[(String, String)], concurrency: usize) -> usize {
    stream::iter(objects.iter().cloned())
        .map(|(ns, name)| {
            let client = client.clone();
            async move {
                Api::<ConfigMap>::namespaced(client, &ns)
                    .create(&PostParams::default(), &configmap(&name))
                    .await
                    .is_ok()
            }
        })
        .buffer_unordered(concurrency)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await
}

/// Waits (at most `limit`) until every quota's `status.used` equals a direct count of its
/// namespace's ConfigMaps (`count/configmaps`, `configmaps`) or Secrets (`count/secrets`).
async fn converge(client: &Client, limit: Duration) -> Result<usize, String> {
    let deadline = Instant::now() + limit;
    let mut last = String::new();
    while Instant::now() < deadline {
        match mismatches(client).await {
            Ok((0, n)) => return Ok(n),
            Ok((bad, n)) => last = format!("{bad} of {n} quotas differ"),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Err(last)
}

async fn mismatches(client: &Client) -> Result<(usize, usize), String> {
    let count = |items: Vec<Option<String>>| {
        let mut by_ns: BTreeMap<String, u64> = BTreeMap::new();
        for ns in items.into_iter().flatten() {
            *by_ns.entry(ns).or_default() += 1;
        }
        by_ns
    };
    let lp = ListParams::default().limit(5_000);
    let configmaps = count(
        list_all(&Api::<ConfigMap>::all(client.clone()), &lp)
            .await?
            .into_iter()
            .map(|c| c.metadata.namespace)
            .collect(),
    );
    let secrets = count(
        list_all(
            &Api::<k8s_openapi::api::core::v1::Secret>::all(client.clone()),
            &lp,
        )
        .await?
        .into_iter()
        .map(|c| c.metadata.namespace)
        .collect(),
    );
    let quotas = list_all(&Api::<ResourceQuota>::all(client.clone()), &lp).await?;
    let mut bad = 0;
    for quota in &quotas {
        let ns = quota.metadata.namespace.clone().unwrap_or_default();
        let used = quota
            .status
            .as_ref()
            .and_then(|s| s.used.clone())
            .unwrap_or_default();
        for key in KEYS {
            let Some(value) = used.get(key) else {
                if quota
                    .spec
                    .as_ref()
                    .and_then(|s| s.hard.as_ref())
                    .is_some_and(|h| h.contains_key(key))
                {
                    bad += 1;
                }
                continue;
            };
            let want = if key == "count/secrets" {
                secrets.get(&ns)
            } else {
                configmaps.get(&ns)
            };
            if value.0 != want.copied().unwrap_or(0).to_string() {
                bad += 1;
            }
        }
    }
    Ok((bad, quotas.len()))
}

async fn list_all<K>(api: &Api<K>, lp: &ListParams) -> Result<Vec<K>, String>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut lp = lp.clone();
    for _ in 0..1_000 {
        let page = api.list(&lp).await.map_err(|e| e.to_string())?;
        items.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => return Ok(items),
        }
    }
    Err("too many pages".into())
}

struct Sample {
    rss: f64,
    heap: f64,
    tasks: f64,
    watches: f64,
}

async fn sample(port: u16, pid: u32) -> Sample {
    let metrics = process::http_get(port, "/metrics")
        .await
        .map(|(_, body)| body)
        .unwrap_or_default();
    let value = |name: &str| common::readings::metric_sum(&metrics, name, "");
    let rss = common::readings::proc_status(pid, "VmRSS:");
    Sample {
        rss,
        heap: value("lazyquota_jemalloc_allocated_bytes"),
        tasks: value("lazyquota_tokio_alive_tasks"),
        watches: value("lazyquota_active_watches"),
    }
}
