//! The kcp seed scenario: one kcp shard (v0.32.3, embedded etcd, loopback), W consumer
//! workspaces, E APIExports of one namespaced type each in P provider workspaces, every consumer
//! binding K of them (B = W × K APIBindings), a ResourceQuota on one bound type
//! (`count/widgets.<group>`) in 10% of the consumers, a few objects of every bound type in every
//! consumer. At B = 0, ≈B/2 and B (bindings added in steps on the same shard), on the same data,
//! one after another:
//!
//! 1. kcp with its own quota controller (`LAZYQUOTA_KCP_QUOTA=on`),
//! 2. kcp without it (the process restarted on the same etcd data, `LAZYQUOTA_KCP_KEEP_DATA=1`),
//! 3. kcp without it plus `lazyquota run --kcp-shard-url`.
//!
//! 1 − 2 is what kcp's quota controller costs inside kcp (goroutines, Go heap, RSS); 3 gives
//! lazyquota's own figures and what it costs the shard (its connections and watches). The
//! slopes between the steps are the marginal cost per APIBinding; at the last step lazyquota's
//! quotas are deleted in two steps for the marginal cost per quota'd (engaged) workspace, and
//! then an exact-heap series (`exact_series`: a second lazyquota with jemalloc's thread caches
//! off, engaged in 0, W/n, …, W workspaces) gives that cost exactly. Latencies: quota created
//! → status.used written (kcp's controller in 1, lazyquota in 3) and, for lazyquota, quota
//! deleted → workspace disengaged → its watches released.
//!
//! ```text
//! cargo bench --bench kcp                               # W=200, E=20, K=5 (≈17 min)
//! cargo bench --bench kcp -- --quick --out /tmp/kcp     # bounded (≈3-4 min), as CI does
//! cargo bench --bench kcp -- --workspaces 1000 --exports 50 --bindings-per-workspace 5 --settle 15 \
//!     --out benches/results/kcp-seed                    # the seed's scale (≈53 min)
//! ```
//!
//! Writes `kcp.md`, `kcp.dat`, `kcp.gp` and, with gnuplot installed, `kcp.png` into
//! `benches/results/kcp/` (or `--out`). The shard lives in `<repo>/.lazyquota/bench-kcp*` and
//! is stopped at the end, also on failure. Every wait is bounded: a quota that never gets its
//! status, a binding that never binds, a workspace that never gets Ready fails the run.

// A measurement harness: counts become f64 for reporting, and each measurement reads best
// as one sequence of steps.
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

// Only `commit` is used here; the control-plane helpers serve the other benchmarks.
#[allow(dead_code)]
mod common;

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use futures::{StreamExt as _, stream};
use kube::{
    Client,
    config::{KubeConfigOptions, Kubeconfig},
};
use lazyquota_testenv::kcp::ExportedType;
use serde_json::{Value, json};

/// The namespace every consumer keeps its objects and quotas in.
const NS: &str = "bench";
/// The quota of a quota'd consumer.
const STANDING: &str = "standing";
/// The latency samples' quota.
const SAMPLE: &str = "sample";
/// spec.hard of every quota: never reached.
const HARD: &str = "100000";
/// Samples in the stability window.
const WINDOW: usize = 5;

struct Args {
    workspaces: usize,
    exports: usize,
    providers: usize,
    bindings_per_workspace: usize,
    objects: usize,
    quota_percent: usize,
    samples: usize,
    concurrency: usize,
    settle: Duration,
    settle_max: Duration,
    /// The fixed part of a reading of lazyquota after it listed (first sync, latency samples):
    /// past the HTTP client's 90 s pool idle timeout, so that the connections of its initial
    /// lists are closed and the reading is lazyquota's steady state.
    lq_settle: Duration,
    poll: Duration,
    /// lazyquota's `--kcp-shared-watch-threshold`.
    shared_threshold: usize,
    /// Steps of the exact-heap series (engaged workspaces 0, W/n, …, W); 0 skips it.
    exact_steps: usize,
    out: PathBuf,
    quick: bool,
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

impl Args {
    fn parse() -> Self {
        let given: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
        let quick = given.iter().any(|a| a == "--quick");
        let mut a = if quick {
            Self {
                workspaces: 10,
                exports: 3,
                providers: 3,
                bindings_per_workspace: 2,
                objects: 2,
                quota_percent: 10,
                samples: 3,
                concurrency: 8,
                settle: Duration::from_secs(2),
                settle_max: Duration::from_secs(30),
                lq_settle: Duration::from_secs(2),
                shared_threshold: 2,
                exact_steps: 2,
                poll: Duration::from_millis(500),
                out: std::env::temp_dir().join("lazyquota-bench-kcp-quick"),
                quick,
            }
        } else {
            Self {
                workspaces: 200,
                exports: 20,
                providers: 0, // = exports unless given
                bindings_per_workspace: 5,
                objects: 3,
                quota_percent: 10,
                samples: 20,
                concurrency: 12,
                settle: Duration::from_secs(20),
                settle_max: Duration::from_mins(3),
                lq_settle: Duration::from_secs(100),
                shared_threshold: 2,
                exact_steps: 4,
                poll: Duration::from_secs(2),
                out: repo().join("benches/results/kcp"),
                quick,
            }
        };
        let mut it = given.into_iter();
        while let Some(flag) = it.next() {
            let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
            let num = |v: String| v.parse::<usize>().unwrap_or_else(|_| panic!("not a number: {v}"));
            match flag.as_str() {
                "--quick" => {}
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
                other => panic!(
                    "unknown flag {other} (--quick, --workspaces, --exports, --providers, \
                     --bindings-per-workspace, --objects, --quota-percent, --samples, --concurrency, \
                     --settle, --settle-max, --lq-settle, --shared-threshold, --exact-steps, --out)"
                ),
            }
        }
        if a.providers == 0 {
            a.providers = a.exports;
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

/// The data the run builds: who binds what, who has a quota.
struct Plan {
    consumers: Vec<String>,
    providers: Vec<String>,
    exports: Vec<ExportedType>,
    /// Bindings per consumer at each step (0, ⌈K/2⌉, K).
    steps: Vec<usize>,
    /// Quota'd consumers: (consumer, which of its bindings the quota counts).
    quotaed: Vec<(usize, usize)>,
    /// Consumers without a standing quota that the latency samples use (their binding 0).
    samplers: Vec<usize>,
    per_workspace: usize,
}

impl Plan {
    fn new(args: &Args) -> Self {
        let w = args.workspaces;
        let k = args.bindings_per_workspace;
        let mut steps = vec![0, k.div_ceil(2), k];
        steps.dedup();
        let q = (w * args.quota_percent).div_ceil(100).min(w);
        let quotaed: Vec<(usize, usize)> = (0..q).map(|n| (n * w / q, n % steps[1])).collect();
        let has_quota: BTreeSet<usize> = quotaed.iter().map(|(i, _)| *i).collect();
        let free: Vec<usize> = (0..w).filter(|i| !has_quota.contains(i)).collect();
        let s = args.samples.min(free.len());
        let samplers = (0..s).map(|n| free[n * free.len() / s]).collect();
        Self {
            consumers: (0..w).map(|i| format!("c-{i:04}")).collect(),
            providers: (0..args.providers).map(|p| format!("p-{p:03}")).collect(),
            exports: (0..args.exports)
                .map(|e| ExportedType::new(&format!("e{e}.kcp-bench.lazyquota.test"), "widgets", "v1"))
                .collect(),
            steps,
            quotaed,
            samplers,
            per_workspace: k,
        }
    }

    /// The export consumer `i` binds as its `j`-th: consecutive, so every export is bound by
    /// about the same number of consumers.
    fn export_of(&self, i: usize, j: usize) -> usize {
        (i * self.per_workspace + j) % self.exports.len()
    }

    fn provider_of(&self, e: usize) -> &str {
        &self.providers[e % self.providers.len()]
    }

    fn key(&self, i: usize, j: usize) -> String {
        self.exports[self.export_of(i, j)].count_key()
    }

    /// The standing quotas that exist once step `s` has its data.
    fn standing(&self, s: usize) -> Vec<(usize, String)> {
        self.quotaed
            .iter()
            .filter(|(_, j)| *j < self.steps[s])
            .map(|&(i, j)| (i, self.key(i, j)))
            .collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Config {
    KcpQuota,
    KcpOnly,
    Lazyquota,
}

impl Config {
    const ALL: [Self; 3] = [Self::KcpQuota, Self::KcpOnly, Self::Lazyquota];

    fn name(self) -> &'static str {
        match self {
            Self::KcpQuota => "1: kcp + its quota controller",
            Self::KcpOnly => "2: kcp, quota controller off",
            Self::Lazyquota => "3: kcp (off) + lazyquota",
        }
    }
}

/// The kcp process's figures.
#[derive(Clone, Copy, Debug, Default)]
struct KcpFigures {
    goroutines: f64,
    heap: f64,
    /// `go_gc_heap_live_bytes`: the heap marked live by the last GC (no garbage in it).
    live: f64,
    rss_metric: f64,
    vmrss: f64,
    anon: f64,
    watches: f64,
}

/// lazyquota's figures.
#[derive(Clone, Copy, Debug, Default)]
struct LqFigures {
    tasks: f64,
    heap: f64,
    vmrss: f64,
    anon: f64,
    connections: f64,
    watches: f64,
    engaged: f64,
    shared: f64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Reading {
    kcp: KcpFigures,
    lq: Option<LqFigures>,
    /// From the end of the fixed settle time's start to the stable window.
    settled: Duration,
    stable: bool,
}

#[derive(Default)]
struct Results {
    readings: BTreeMap<(usize, Config), Reading>,
    first_sync: BTreeMap<(usize, Config), Duration>,
    create: BTreeMap<(usize, Config), Vec<Duration>>,
    disengage: BTreeMap<usize, Vec<Duration>>,
    release: BTreeMap<usize, Vec<Duration>>,
    opened: BTreeMap<usize, usize>,
    /// Config 3 at the last step with fewer quotas: (engaged workspaces, reading).
    sweep: Vec<(usize, Reading)>,
    /// The exact-heap series: (workspaces given a quota, reading), then the reading after
    /// every one of those quotas was deleted.
    exact: Vec<(usize, Reading)>,
    exact_after: Option<Reading>,
    timeline: Vec<(String, Duration)>,
    kcp_version: String,
    /// Whether kcp's profiling endpoint ran the GCs asked for before each sample.
    gc_forced: bool,
    machine: Vec<(String, String)>,
    done: bool,
}

/// Stops the kcp of a state directory when the run ends, however it ends.
struct KcpGuard(PathBuf);

impl Drop for KcpGuard {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo().join("tests/control-plane/kcp/stop.sh"))
            .arg(&self.0)
            .status();
    }
}

fn main() {
    let args = Args::parse();
    std::fs::create_dir_all(&args.out).expect("output directory");
    let dir = repo().join(".lazyquota").join(if args.quick {
        "bench-kcp-quick"
    } else {
        "bench-kcp"
    });
    // The binary cargo built, copied: a rebuild in the shared target directory during the run
    // must not change the lazyquota that later configurations start.
    let bin = dir.with_extension("lazyquota");
    std::fs::create_dir_all(repo().join(".lazyquota")).expect("state directory");
    std::fs::copy(env!("CARGO_BIN_EXE_lazyquota"), &bin).expect("copy the lazyquota binary");
    let guard = KcpGuard(dir.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let started = Instant::now();
    runtime.block_on(run(&args, &dir, &bin, started));
    drop(guard);
    eprintln!("kcp: done in {:.1} min", started.elapsed().as_secs_f64() / 60.0);
}

/// A started shard: its facts and two clients at its root (paths carry `/clusters/<c>`).
struct Shard {
    url: String,
    port: String,
    pid: u32,
    kubeconfig: PathBuf,
    /// kcp-admin (context `base`): creates workspaces, exports, bindings, objects.
    admin: Client,
    /// shard-admin (context `shard-base`): wildcard lists, /metrics, quotas and their status.
    root: Client,
}

fn facts(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(dir.join("env"))
        .unwrap_or_else(|e| panic!("{}/env: {e}", dir.display()))
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}

async fn root_client(kubeconfig: &Path, context: &str, url: &str) -> Client {
    let options = KubeConfigOptions {
        context: Some(context.to_owned()),
        ..KubeConfigOptions::default()
    };
    let mut config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig).expect("kcp's admin kubeconfig"),
        &options,
    )
    .await
    .expect("client configuration");
    config.cluster_url = url.parse().expect("shard URL");
    Client::try_from(config).expect("client")
}

/// (Re)starts the shard of `dir` with start.sh and returns it with fresh clients (a restart
/// changes the port and the kcp-admin token).
async fn start_kcp(dir: &Path, quota: bool, keep: bool) -> Shard {
    let out = tokio::process::Command::new("bash")
        .arg(repo().join("tests/control-plane/kcp/start.sh"))
        .env("LAZYQUOTA_KCP_DIR", dir)
        .env("LAZYQUOTA_KCP_QUOTA", if quota { "on" } else { "off" })
        .env("LAZYQUOTA_KCP_KEEP_DATA", if keep { "1" } else { "0" })
        .env("LAZYQUOTA_KCP_TIMEOUT", "900")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("start.sh");
    assert!(
        out.status.success(),
        "kcp did not start in {}:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let f = facts(dir);
    let url = f["LAZYQUOTA_KCP_URL"].clone();
    let kubeconfig = PathBuf::from(&f["LAZYQUOTA_KCP_KUBECONFIG"]);
    Shard {
        port: url.rsplit(':').next().expect("port").to_owned(),
        pid: f["LAZYQUOTA_KCP_PID"].parse().expect("pid"),
        admin: root_client(&kubeconfig, "base", &url).await,
        root: root_client(&kubeconfig, "shard-base", &url).await,
        kubeconfig,
        url,
    }
}

async fn call(client: &Client, method: &str, path: &str, body: Option<&Value>) -> Result<Value, kube::Error> {
    let builder = http::Request::builder().method(method).uri(path);
    let request = match body {
        Some(b) => builder
            .header("content-type", "application/json")
            .body(serde_json::to_vec(b).expect("JSON")),
        None => builder.body(Vec::new()),
    }
    .expect("request");
    client.request::<Value>(request).await
}

/// POST that treats "already exists" as done, retried on other errors for up to `patience`.
async fn create(client: &Client, path: &str, body: &Value, patience: Duration) -> Result<(), String> {
    let deadline = Instant::now() + patience;
    loop {
        let error = match call(client, "POST", path, Some(body)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(format!("POST {path}: {error}"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn metric_sum(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b)
}

fn proc_status(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))?
                .split_whitespace()
                .nth(1)?
                .parse::<f64>()
                .ok()
        })
        .map_or(f64::NAN, |kib| kib * 1024.0)
}

/// Established TCP connections from `pid` to `port`.
fn connections(pid: u32, port: &str) -> f64 {
    port.parse().map_or(f64::NAN, |port| {
        lazyquota_testenv::established_connections(pid, port) as f64
    })
}

impl Shard {
    async fn metrics(&self) -> String {
        let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
        self.root.request_text(request).await.expect("kcp /metrics")
    }

    /// Runs a garbage collection in kcp (`/debug/pprof/heap?gc=1`, the apiserver's profiling
    /// endpoint), so that heap figures are read right after a GC rather than wherever the GC
    /// cycle happens to be. Whether it answered.
    async fn force_gc(&self) -> bool {
        let request = http::Request::get("/debug/pprof/heap?gc=1")
            .body(kube::client::Body::from(Vec::new()))
            .expect("request");
        match self.root.send(request).await {
            Ok(response) => {
                let ok = response.status().is_success();
                let _ = response.into_body().collect_bytes().await;
                ok
            }
            Err(_) => false,
        }
    }

    /// New clients: the old ones' idle connections (each a goroutine in kcp) closed before a
    /// reading.
    async fn refresh(&mut self) {
        self.admin = root_client(&self.kubeconfig, "base", &self.url).await;
        self.root = root_client(&self.kubeconfig, "shard-base", &self.url).await;
    }

    async fn figures(&self) -> KcpFigures {
        self.force_gc().await;
        let text = self.metrics().await;
        KcpFigures {
            goroutines: metric(&text, "go_goroutines"),
            heap: metric(&text, "go_memstats_heap_inuse_bytes"),
            live: metric(&text, "go_gc_heap_live_bytes"),
            rss_metric: metric(&text, "process_resident_memory_bytes"),
            vmrss: proc_status(self.pid, "VmRSS:"),
            anon: proc_status(self.pid, "RssAnon:"),
            watches: metric_sum(&text, "apiserver_longrunning_requests", "verb=\"WATCH\""),
        }
    }

    /// Every ResourceQuota of the shard: (logical cluster, namespace, name) → the quota.
    async fn all_quotas(&self) -> BTreeMap<(String, String, String), Value> {
        let list = call(&self.root, "GET", "/clusters/*/api/v1/resourcequotas", None)
            .await
            .expect("wildcard list of ResourceQuotas");
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|q| {
                let m = &q["metadata"];
                Some((
                    (
                        m["annotations"]["kcp.io/cluster"].as_str()?.to_owned(),
                        m["namespace"].as_str()?.to_owned(),
                        m["name"].as_str()?.to_owned(),
                    ),
                    q.clone(),
                ))
            })
            .collect()
    }
}

fn quota_path(cluster: &str, name: &str) -> String {
    format!("/clusters/{cluster}/api/v1/namespaces/{NS}/resourcequotas/{name}")
}

fn quota_body(name: &str, key: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name},
           "spec": {"hard": {key: HARD}}})
}

fn used(quota: &Value, key: &str) -> Option<u64> {
    quota["status"]["used"][key].as_str()?.parse().ok()
}

/// lazyquota against the shard, stopped when dropped.
struct Lazyquota {
    child: Child,
    metrics: Client,
    log: PathBuf,
}

impl Drop for Lazyquota {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..100 {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Lazyquota {
    /// Starts lazyquota against the shard; `malloc_conf`, if given, is jemalloc's
    /// `_RJEM_MALLOC_CONF` (lazyquota then keeps jemalloc's defaults plus that).
    fn start(
        shard: &Shard,
        dir: &Path,
        bin: &Path,
        label: &str,
        shared_threshold: usize,
        malloc_conf: Option<&str>,
    ) -> Self {
        // The admin kubeconfig with the shard admin as its current context (wildcard requests).
        let kubeconfig = dir.join("lazyquota.kubeconfig");
        lazyquota_testenv::kcp::write_shard_kubeconfig(&shard.kubeconfig, &kubeconfig)
            .expect("lazyquota kubeconfig");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let log = dir.join(format!("logs/lazyquota-{label}.log"));
        let mut command = Command::new(bin);
        if let Some(conf) = malloc_conf {
            command.env("_RJEM_MALLOC_CONF", conf);
        }
        let child = command
            .arg("run")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--kcp-shard-url", &shard.url])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .args(["--kcp-shared-watch-threshold", &shared_threshold.to_string()])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("lazyquota log"))
            .spawn()
            .expect("lazyquota");
        let metrics = Client::try_from(kube::Config::new(
            format!("http://127.0.0.1:{port}").parse().expect("url"),
        ))
        .expect("metrics client");
        Self { child, metrics, log }
    }

    fn alive(&mut self) {
        if let Some(status) = self.child.try_wait().ok().flatten() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!(
                "lazyquota exited ({status}); last lines of {}:\n{}",
                self.log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }

    async fn text(&self) -> Option<String> {
        let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
        self.metrics.request_text(request).await.ok()
    }

    async fn figures(&self, shard: &Shard) -> LqFigures {
        let text = self.text().await.unwrap_or_default();
        let pid = self.child.id();
        LqFigures {
            tasks: metric(&text, "lazyquota_tokio_alive_tasks"),
            heap: metric(&text, "lazyquota_jemalloc_allocated_bytes"),
            vmrss: proc_status(pid, "VmRSS:"),
            anon: proc_status(pid, "RssAnon:"),
            connections: connections(pid, &shard.port),
            watches: metric_sum(&text, "lazyquota_active_watches", ""),
            engaged: metric(&text, "lazyquota_kcp_engaged_clusters"),
            shared: metric(&text, "lazyquota_kcp_shared_watches"),
        }
    }

    /// (engaged clusters, open watches) now.
    async fn engagement(&self) -> Option<(f64, f64)> {
        let text = self.text().await?;
        let engaged = metric(&text, "lazyquota_kcp_engaged_clusters");
        (!engaged.is_nan()).then(|| (engaged, metric_sum(&text, "lazyquota_active_watches", "")))
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn spread(values: impl Iterator<Item = f64> + Clone) -> f64 {
    let max = values.clone().fold(f64::MIN, f64::max);
    let min = values.fold(f64::MAX, f64::min);
    max - min
}

/// Waits `fixed` (`--settle`, or `--lq-settle` after lazyquota listed), then samples every `poll` until the last [`WINDOW`] samples of kcp's
/// goroutines are within max(5, 1%) of each other (and lazyquota's tasks within 2), or until
/// `--settle-max`; the reading is the median of each figure over that window.
async fn settle(shard: &mut Shard, mut lq: Option<&mut Lazyquota>, args: &Args, fixed: Duration) -> Reading {
    let start = Instant::now();
    shard.refresh().await;
    tokio::time::sleep(fixed).await;
    let mut window: VecDeque<(KcpFigures, Option<LqFigures>)> = VecDeque::new();
    loop {
        let kcp = shard.figures().await;
        let lqf = match lq.as_deref_mut() {
            Some(p) => {
                p.alive();
                Some(p.figures(shard).await)
            }
            None => None,
        };
        window.push_back((kcp, lqf));
        if window.len() > WINDOW {
            window.pop_front();
        }
        let goroutines = window.iter().map(|(k, _)| k.goroutines);
        let tasks = window.iter().filter_map(|(_, l)| l.map(|l| l.tasks));
        let stable = window.len() == WINDOW
            && spread(goroutines.clone()) <= (0.01 * median(goroutines.collect())).max(5.0)
            && (lq.is_none() || spread(tasks) <= 2.0);
        if stable || start.elapsed() >= args.settle_max {
            if !stable {
                eprintln!(
                    "kcp: not stable within {:?}: reading the medians of the last {} samples",
                    args.settle_max,
                    window.len()
                );
            }
            let k = |f: fn(&KcpFigures) -> f64| median(window.iter().map(|(k, _)| f(k)).collect());
            let l = |f: fn(&LqFigures) -> f64| {
                median(window.iter().filter_map(|(_, l)| l.as_ref().map(f)).collect())
            };
            return Reading {
                kcp: KcpFigures {
                    goroutines: k(|f| f.goroutines),
                    heap: k(|f| f.heap),
                    live: k(|f| f.live),
                    rss_metric: k(|f| f.rss_metric),
                    vmrss: k(|f| f.vmrss),
                    anon: k(|f| f.anon),
                    watches: k(|f| f.watches),
                },
                lq: lq.is_some().then(|| LqFigures {
                    tasks: l(|f| f.tasks),
                    heap: l(|f| f.heap),
                    vmrss: l(|f| f.vmrss),
                    anon: l(|f| f.anon),
                    connections: l(|f| f.connections),
                    watches: l(|f| f.watches),
                    engaged: l(|f| f.engaged),
                    shared: l(|f| f.shared),
                }),
                settled: start.elapsed(),
                stable,
            };
        }
        tokio::time::sleep(args.poll).await;
    }
}

/// Creates the workspaces `names` under root (as kcp-admin), each waited for until Ready and
/// serving, `concurrency` at a time; returns name → logical cluster.
async fn create_workspaces(shard: &Shard, names: &[String], concurrency: usize) -> BTreeMap<String, String> {
    stream::iter(names)
        .map(|name| async move {
            let path = "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces";
            let body = json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
                              "metadata": {"name": name}});
            create(&shard.admin, path, &body, Duration::from_mins(1))
                .await
                .unwrap_or_else(|e| panic!("workspace {name}: {e}"));
            let deadline = Instant::now() + Duration::from_mins(3);
            let cluster = loop {
                if let Ok(ws) = call(&shard.admin, "GET", &format!("{path}/{name}"), None).await
                    && ws["status"]["phase"] == "Ready"
                    && let Some(c) = ws["spec"]["cluster"].as_str()
                {
                    break c.to_owned();
                }
                assert!(
                    Instant::now() < deadline,
                    "workspace root:{name} not Ready within 180 s"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            };
            // Served once its namespace can be made (every workspace gets one for the objects).
            create(
                &shard.admin,
                &format!("/clusters/root:{name}/api/v1/namespaces"),
                &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
                Duration::from_mins(1),
            )
            .await
            .unwrap_or_else(|e| panic!("workspace root:{name} not serving within 60 s: {e}"));
            (name.clone(), cluster)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

async fn create_exports(shard: &Shard, plan: &Plan, concurrency: usize) {
    stream::iter(0..plan.exports.len())
        .for_each_concurrent(concurrency, |e| async move {
            let ty = &plan.exports[e];
            let provider = plan.provider_of(e);
            let schema = format!("{}.{}.{}", ty.version, ty.plural, ty.group);
            let base = format!("/clusters/root:{provider}/apis/apis.kcp.io");
            create(
                &shard.admin,
                &format!("{base}/v1alpha1/apiresourceschemas"),
                &json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIResourceSchema",
                    "metadata": {"name": schema},
                    "spec": {"group": ty.group, "scope": "Namespaced",
                        "names": {"kind": ty.kind, "listKind": format!("{}List", ty.kind),
                                  "plural": ty.plural, "singular": ty.kind.to_ascii_lowercase()},
                        "versions": [{"name": ty.version, "served": true, "storage": true,
                            "schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}]}}),
                Duration::from_mins(1),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
            create(
                &shard.admin,
                &format!("{base}/v1alpha2/apiexports"),
                &json!({"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport",
                    "metadata": {"name": format!("e{e}")},
                    "spec": {"resources": [{"name": ty.plural, "group": ty.group, "schema": schema,
                                            "storage": {"crd": {}}}]}}),
                Duration::from_mins(1),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        })
        .await;
}

/// Binds consumers' bindings `from..to` (as kcp-admin), waits until every one is Bound (one
/// wildcard list per second), then creates `--objects` objects of each newly bound type.
async fn bind_step(
    shard: &Shard,
    plan: &Plan,
    clusters: &[String],
    (from, to): (usize, usize),
    args: &Args,
    timeline: &mut Vec<(String, Duration)>,
) {
    let t = Instant::now();
    let wanted: Vec<(usize, usize)> = (0..plan.consumers.len())
        .flat_map(|i| (from..to).map(move |j| (i, j)))
        .collect();
    stream::iter(&wanted)
        .for_each_concurrent(args.concurrency, |&(i, j)| async move {
            let e = plan.export_of(i, j);
            create(
                &shard.admin,
                &format!(
                    "/clusters/root:{}/apis/apis.kcp.io/v1alpha2/apibindings",
                    plan.consumers[i]
                ),
                &json!({"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIBinding",
                        "metadata": {"name": format!("e{e}")},
                        "spec": {"reference": {"export": {"path": format!("root:{}", plan.provider_of(e)),
                                                          "name": format!("e{e}")}}}}),
                Duration::from_mins(1),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        })
        .await;
    let mut missing: BTreeSet<(String, String)> = wanted
        .iter()
        .map(|&(i, j)| (clusters[i].clone(), format!("e{}", plan.export_of(i, j))))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120 + wanted.len() as u64 / 5);
    while !missing.is_empty() {
        if let Ok(list) = call(
            &shard.root,
            "GET",
            "/clusters/*/apis/apis.kcp.io/v1alpha2/apibindings",
            None,
        )
        .await
        {
            for b in list["items"].as_array().into_iter().flatten() {
                if b["status"]["phase"] == "Bound"
                    && let (Some(c), Some(n)) = (
                        b["metadata"]["annotations"]["kcp.io/cluster"].as_str(),
                        b["metadata"]["name"].as_str(),
                    )
                {
                    missing.remove(&(c.to_owned(), n.to_owned()));
                }
            }
        }
        assert!(
            missing.is_empty() || Instant::now() < deadline,
            "{} of {} APIBindings not Bound in time, e.g. {:?}",
            missing.len(),
            wanted.len(),
            missing.iter().next()
        );
        if !missing.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    timeline.push((
        format!("{} APIBindings created and Bound", wanted.len()),
        t.elapsed(),
    ));
    let t = Instant::now();
    let objects: Vec<(usize, usize, usize)> = wanted
        .iter()
        .flat_map(|&(i, j)| (0..args.objects).map(move |o| (i, j, o)))
        .collect();
    stream::iter(&objects)
        .for_each_concurrent(args.concurrency, |&(i, j, o)| async move {
            let ty = &plan.exports[plan.export_of(i, j)];
            // Retried while the bound type is not served yet (a moment after Bound).
            create(
                &shard.admin,
                &format!(
                    "/clusters/root:{}/apis/{}/{}/namespaces/{NS}/{}",
                    plan.consumers[i], ty.group, ty.version, ty.plural
                ),
                &json!({"apiVersion": format!("{}/{}", ty.group, ty.version), "kind": ty.kind,
                        "metadata": {"name": format!("o{o}")}}),
                Duration::from_mins(1),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        })
        .await;
    timeline.push((format!("{} objects created", objects.len()), t.elapsed()));
}

/// Sets status.used of every standing quota to 0 (while nothing writes quota status), so
/// that the next controller's first sync is visible.
async fn reset_status(shard: &Shard, clusters: &[String], standing: &[(usize, String)], concurrency: usize) {
    stream::iter(standing)
        .for_each_concurrent(concurrency, |(i, key)| async move {
            let path = quota_path(&clusters[*i], STANDING);
            for _ in 0..20 {
                let mut q = call(&shard.root, "GET", &path, None)
                    .await
                    .unwrap_or_else(|e| panic!("GET {path}: {e}"));
                q["status"] = json!({"hard": {key: HARD}, "used": {key: "0"}});
                match call(&shard.root, "PUT", &format!("{path}/status"), Some(&q)).await {
                    Ok(_) => return,
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => panic!("PUT {path}/status: {e}"),
                }
            }
            panic!("PUT {path}/status: conflicts");
        })
        .await;
}

/// Waits until every quota `name` of `standing` says `objects` for its key (one wildcard list per 200 ms);
/// fails after `patience` naming a quota that did not.
async fn synced(
    shard: &Shard,
    clusters: &[String],
    (name, standing): (&str, &[(usize, String)]),
    objects: usize,
    patience: Duration,
    who: &str,
    mut lq: Option<&mut Lazyquota>,
) -> Duration {
    let t = Instant::now();
    loop {
        if let Some(p) = lq.as_deref_mut() {
            p.alive();
        }
        let quotas = shard.all_quotas().await;
        let wrong: Vec<String> = standing
            .iter()
            .filter(|(i, key)| {
                quotas
                    .get(&(clusters[*i].clone(), NS.to_owned(), name.to_owned()))
                    .and_then(|q| used(q, key))
                    != Some(objects as u64)
            })
            .map(|(i, key)| format!("root:c-{i:04} ({}) {key}", clusters[*i]))
            .collect();
        if wrong.is_empty() {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < patience,
            "{who}: {} of {} quotas never got status.used = {objects} within {patience:?}, e.g. {}",
            wrong.len(),
            standing.len(),
            wrong[0]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

const LATENCY_PATIENCE: Duration = Duration::from_mins(2);

/// One sample: a quota created in a consumer without one → status.used = objects.
async fn create_to_status(shard: &Shard, cluster: &str, key: &str, objects: usize, who: &str) -> Duration {
    let path = quota_path(cluster, SAMPLE);
    let t = Instant::now();
    call(
        &shard.root,
        "POST",
        &format!("/clusters/{cluster}/api/v1/namespaces/{NS}/resourcequotas"),
        Some(&quota_body(SAMPLE, key)),
    )
    .await
    .unwrap_or_else(|e| panic!("creating {path}: {e}"));
    loop {
        if let Ok(q) = call(&shard.root, "GET", &path, None).await
            && used(&q, key) == Some(objects as u64)
        {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < LATENCY_PATIENCE,
            "{who}: quota {path} never got status.used {key} = {objects} within {LATENCY_PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn delete_quota(shard: &Shard, cluster: &str, name: &str) {
    let path = quota_path(cluster, name);
    call(&shard.root, "DELETE", &path, None)
        .await
        .unwrap_or_else(|e| panic!("DELETE {path}: {e}"));
}

async fn gone(shard: &Shard, cluster: &str, name: &str) {
    let path = quota_path(cluster, name);
    let t = Instant::now();
    while call(&shard.root, "GET", &path, None).await.is_ok() {
        assert!(t.elapsed() < LATENCY_PATIENCE, "{path} not deleted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until lazyquota's (engaged, watches) satisfy `done`; the time it took.
async fn lq_until(lq: &mut Lazyquota, what: &str, done: impl Fn(f64, f64) -> bool) -> Duration {
    let t = Instant::now();
    loop {
        lq.alive();
        if let Some((engaged, watches)) = lq.engagement().await
            && done(engaged, watches)
        {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < LATENCY_PATIENCE,
            "lazyquota: {what} not within {LATENCY_PATIENCE:?} (now {:?})",
            lq.engagement().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 0.5
}

async fn run(args: &Args, dir: &Path, bin: &Path, started: Instant) {
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
    res.kcp_version = call(&shard.root, "GET", "/version", None)
        .await
        .ok()
        .and_then(|v| v["gitVersion"].as_str().map(str::to_owned))
        .unwrap_or_default();
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
        reset_status(&shard, &clusters, &standing, args.concurrency).await;
        eprintln!("kcp: B={b}: data ready after {:?}", started.elapsed());

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
        let reading = settle(&mut shard, None, args, args.settle).await;
        eprintln!("kcp: B={b} {}: {reading:?}", Config::KcpQuota.name());
        res.readings.insert((s, Config::KcpQuota), reading);
        if s > 0 {
            let mut samples = Vec::new();
            for &i in &plan.samplers {
                samples
                    .push(create_to_status(&shard, &clusters[i], &plan.key(i, 0), args.objects, "kcp").await);
                delete_quota(&shard, &clusters[i], SAMPLE).await;
                gone(&shard, &clusters[i], SAMPLE).await;
            }
            res.create.insert((s, Config::KcpQuota), samples);
        }

        // 2: the same data, kcp without its quota controller.
        let t = Instant::now();
        shard = start_kcp(dir, false, true).await;
        res.timeline
            .push((format!("B={b}: kcp restarted, quota off"), t.elapsed()));
        // The same writes as in 1 and 3 (kcp's quota admission keeps per-workspace state for
        // every workspace written to since the start): status.used to 0 for lazyquota's first sync.
        reset_status(&shard, &clusters, &standing, args.concurrency).await;
        let reading = settle(&mut shard, None, args, args.settle).await;
        eprintln!("kcp: B={b} {}: {reading:?}", Config::KcpOnly.name());
        res.readings.insert((s, Config::KcpOnly), reading);

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
        let reading = settle(&mut shard, Some(&mut lq), args, args.lq_settle.max(args.settle)).await;
        eprintln!("kcp: B={b} {}: {reading:?}", Config::Lazyquota.name());
        res.readings.insert((s, Config::Lazyquota), reading);
        if s > 0 {
            let (mut creates, mut disengages, mut releases, mut opened) = (vec![], vec![], vec![], 0);
            for &i in &plan.samplers {
                let (engaged, watches) = lq.engagement().await.expect("lazyquota metrics");
                creates.push(
                    create_to_status(&shard, &clusters[i], &plan.key(i, 0), args.objects, "lazyquota").await,
                );
                if lq.engagement().await.is_some_and(|(_, w)| w > watches) {
                    opened += 1;
                }
                let t = Instant::now();
                delete_quota(&shard, &clusters[i], SAMPLE).await;
                lq_until(
                    &mut lq,
                    "disengaging a workspace whose quota was deleted",
                    |e, _| close(e, engaged),
                )
                .await;
                disengages.push(t.elapsed());
                lq_until(
                    &mut lq,
                    "releasing the watch of a disengaged workspace",
                    |_, w| w <= watches + 0.5,
                )
                .await;
                releases.push(t.elapsed());
                gone(&shard, &clusters[i], SAMPLE).await;
            }
            res.create.insert((s, Config::Lazyquota), creates);
            res.disengage.insert(s, disengages);
            res.release.insert(s, releases);
            res.opened.insert(s, opened);
        }
        if s == last {
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
        if s == last && args.exact_steps > 0 {
            let t = Instant::now();
            exact_series(&mut shard, &plan, &clusters, args, dir, bin, &mut res).await;
            res.timeline
                .push((format!("B={b}: exact-heap series"), t.elapsed()));
        }
        res.done = s == last;
        write_results(args, &plan, &res, started);
    }
}

/// The quota of the exact-heap series.
const ENGAGED: &str = "engaged";

/// The exact-heap series, at the last step once the standing quotas are gone: a new lazyquota
/// with jemalloc's thread caches off (`_RJEM_MALLOC_CONF=tcache:false`), so that
/// `stats.allocated` counts exactly the bytes the program holds (with caches on, freed objects
/// parked in a thread's cache count as allocated, and how many are parked moves from one
/// reading to the next by more than the figure sought). One warm-up engagement (consumer 0,
/// then deleted), then a quota `engaged` in the first 0, W/n, …, W consumers (consumer i on
/// its binding i mod K, so the types are spread), read at each level; then every one deleted
/// and read again.
async fn exact_series(
    shard: &mut Shard,
    plan: &Plan,
    clusters: &[String],
    args: &Args,
    dir: &Path,
    bin: &Path,
    res: &mut Results,
) {
    let k = plan.per_workspace;
    let quotas: Vec<(usize, String)> = (0..clusters.len()).map(|i| (i, plan.key(i, i % k))).collect();
    let mut lq = Lazyquota::start(
        shard,
        dir,
        bin,
        "exact",
        args.shared_threshold,
        Some("tcache:false"),
    );
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
        eprintln!("kcp: exact heap, {level} engaged: {reading:?}");
        res.exact.push((level, reading));
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
    eprintln!("kcp: exact heap, all deleted again: {after:?}");
    res.exact_after = Some(after);
}

/// Creates a quota [`ENGAGED`] on each (consumer, key), `concurrency` at a time.
async fn create_quotas(shard: &Shard, clusters: &[String], quotas: &[(usize, String)], concurrency: usize) {
    stream::iter(quotas)
        .for_each_concurrent(concurrency, |(i, key)| async move {
            let path = format!("/clusters/{}/api/v1/namespaces/{NS}/resourcequotas", clusters[*i]);
            create(
                &shard.root,
                &path,
                &quota_body(ENGAGED, key),
                Duration::from_mins(1),
            )
            .await
            .unwrap_or_else(|e| panic!("quota {ENGAGED} in root:c-{i:04}: {e}"));
        })
        .await;
}

/// The least-squares slope of y over x.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (mx, my) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x / n, b + y / n));
    let (sxy, sxx) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
    });
    sxy / sxx
}

/// One row of lazyquota's figures in configuration 3 (`base`: configuration 2 at that step).
fn lq_row(md: &mut String, label: &str, x: &Reading, base: Option<&Reading>) {
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
fn exact_section(md: &mut String, args: &Args, plan: &Plan, r: &Results) {
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
    let _ = writeln!(
        md,
        "| workspaces with a quota | engaged workspaces | tasks | jemalloc allocated MiB | VmRSS MiB | RssAnon MiB | TCP conns to the shard | lazyquota watches | shared watches | kcp WATCHes 3 − 2 | kcp goroutines 3 − 2 | kcp live heap MiB 3 − 2 |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (n, x) in &r.exact {
        lq_row(md, &n.to_string(), x, base);
    }
    if let Some(after) = &r.exact_after {
        lq_row(md, "0 (all deleted again)", after, base);
    }
    let _ = writeln!(
        md,
        "\n| engaged workspaces from → to | tasks / ws | jemalloc KiB / ws | RSS KiB / ws | RssAnon KiB / ws | TCP conns / ws | lazyquota watches / ws |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    let points: Vec<(f64, LqFigures)> = r
        .exact
        .iter()
        .filter_map(|(n, x)| Some((*n as f64, x.lq?)))
        .collect();
    let fit = |f: fn(&LqFigures) -> f64| slope(&points.iter().map(|(n, l)| (*n, f(l))).collect::<Vec<_>>());
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
    let verdict = |ok: bool| if ok { "met" } else { "**missed**" };
    let _ = writeln!(
        md,
        "\nTargets per engaged workspace: ≤ 16 KiB ({}: {heap:.2} KiB), ≤ 0.1 tokio task ({}: {tasks:.3}). \
         The slope includes the shared watches' own cost ({:.0} open at the top level), spread \
         over {:.0} engaged workspaces: the fewer workspaces, the more it weighs.",
        verdict(heap <= 16.0),
        verdict(tasks <= 0.1),
        points.last().map_or(f64::NAN, |(_, l)| l.shared),
        points.last().map_or(f64::NAN, |(n, _)| *n),
    );
    if let (Some(after), Some((top, x)), Some((_, zero))) =
        (r.exact_after.and_then(|a| a.lq), r.exact.last(), points.first())
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
}

fn machine_facts() -> Vec<(String, String)> {
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

fn percentile(samples: &[Duration], p: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut s = samples.to_vec();
    s.sort_unstable();
    let index = ((p / 100.0) * (s.len() - 1) as f64).round() as usize;
    Some(s[index])
}

fn p50_p99(samples: Option<&Vec<Duration>>) -> String {
    let Some(s) = samples.filter(|s| !s.is_empty()) else {
        return "–".into();
    };
    let ms =
        |d: Option<Duration>| d.map_or_else(|| "–".into(), |d| format!("{:.0}", d.as_secs_f64() * 1000.0));
    format!(
        "{} / {} (n={})",
        ms(percentile(s, 50.0)),
        ms(percentile(s, 99.0)),
        s.len()
    )
}

fn mib(b: f64) -> f64 {
    b / 1_048_576.0
}

fn write_results(args: &Args, plan: &Plan, r: &Results, started: Instant) {
    let w = plan.consumers.len();
    let bs: Vec<usize> = plan.steps.iter().map(|k| k * w).collect();
    let mut md = String::new();
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
         (`tests/control-plane/kcp`, embedded etcd, loopback); lazyquota: the bench profile's build \
         of the working tree (`CARGO_BIN_EXE_lazyquota`, copied at the start; its defaults: HTTP/2 since `103fa7b`, HTTP/1.1 before).\n",
        cmd.join(" "),
        common::commit(),
        started.elapsed().as_secs_f64() / 60.0,
        r.kcp_version
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
         Latencies ({} samples per step and configuration, one at a time, in consumers without a \
         standing quota, on their first bound type): a quota `{SAMPLE}` is created and the time until \
         its status.used equals the objects is taken (polled every 10 ms); in 3 it is then deleted and \
         the time until `lazyquota_kcp_engaged_clusters` is back where it was (disengaged) and until \
         `lazyquota_active_watches` is back (watch released) is taken (polled every 20 ms). Every wait \
         is bounded ({LATENCY_PATIENCE:?} per sample); a timeout fails the run.\n\n\
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
        plan.samplers.len(),
    );

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
    let delta = |s: usize| -> Option<KcpFigures> {
        let a = r.readings.get(&(s, Config::KcpQuota))?.kcp;
        let b = r.readings.get(&(s, Config::KcpOnly))?.kcp;
        Some(KcpFigures {
            goroutines: a.goroutines - b.goroutines,
            heap: a.heap - b.heap,
            live: a.live - b.live,
            rss_metric: a.rss_metric - b.rss_metric,
            vmrss: a.vmrss - b.vmrss,
            anon: a.anon - b.anon,
            watches: a.watches - b.watches,
        })
    };
    for (s, b) in bs.iter().enumerate() {
        let Some(d) = delta(s) else { continue };
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

    let _ = writeln!(md, "\n## lazyquota (configuration 3)\n");
    let _ = writeln!(
        md,
        "| B | engaged workspaces | tasks | jemalloc allocated MiB | VmRSS MiB | RssAnon MiB | TCP conns to the shard | lazyquota watches | shared watches | kcp WATCHes 3 − 2 | kcp goroutines 3 − 2 | kcp live heap MiB 3 − 2 |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (s, b) in bs.iter().enumerate() {
        if let Some(x) = r.readings.get(&(s, Config::Lazyquota)) {
            lq_row(&mut md, &b.to_string(), x, r.readings.get(&(s, Config::KcpOnly)));
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
        let (Some(da), Some(dbb)) = (delta(a), delta(b)) else {
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
            lq_row(&mut md, &n.to_string(), x, base);
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

    exact_section(&mut md, args, plan, r);

    let _ = writeln!(md, "\n## Latencies (p50 / p99 ms)\n");
    let _ = writeln!(
        md,
        "| B | create → status.used, kcp's controller (1) | create → status.used, lazyquota (3) | delete → disengaged (3) | delete → watches released (3) | samples that opened a watch |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    for (s, b) in bs.iter().enumerate().skip(1) {
        if !r.create.contains_key(&(s, Config::KcpQuota)) {
            continue;
        }
        let _ = writeln!(
            md,
            "| {b} | {} | {} | {} | {} | {} |",
            p50_p99(r.create.get(&(s, Config::KcpQuota))),
            p50_p99(r.create.get(&(s, Config::Lazyquota))),
            p50_p99(r.disengage.get(&s)),
            p50_p99(r.release.get(&s)),
            r.opened.get(&s).map_or_else(|| "–".into(), ToString::to_string),
        );
    }

    let _ = writeln!(md, "\n## Timeline\n\n| phase | s |\n|---|---|");
    for (what, d) in &r.timeline {
        let _ = writeln!(md, "| {what} | {:.1} |", d.as_secs_f64());
    }
    std::fs::write(args.out.join("kcp.md"), &md).expect("write kcp.md");

    // Plot data: the steps, then (second block) the quota'd-workspace sweep.
    let mut dat = String::from(
        "# B kcpq_goroutines kcp_goroutines kcp_with_lq_goroutines kcpq_live_mib kcp_live_mib \
         kcp_with_lq_live_mib kcpq_heap_inuse_mib kcp_heap_inuse_mib kcpq_rss_mib kcp_rss_mib lq_tasks \
         lq_heap_mib lq_rss_mib lq_watches kcp_watches_3_minus_2\n",
    );
    for (s, b) in bs.iter().enumerate() {
        let get = |c| r.readings.get(&(s, c)).copied().unwrap_or_default();
        let (one, two, three) = (
            get(Config::KcpQuota),
            get(Config::KcpOnly),
            get(Config::Lazyquota),
        );
        let l = three.lq.unwrap_or_default();
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
    println!("{md}");
}
