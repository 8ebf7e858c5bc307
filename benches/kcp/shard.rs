//! The shard and the lazyquota under test: starting them, talking to them, reading their
//! figures (metrics, /proc, sockets).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use kube::{
    Client,
    config::{KubeConfigOptions, Kubeconfig},
};
use lazyquota_kube::transport::client::{Pool, Transport};
use serde_json::{Value, json};

use crate::common::{
    self,
    readings::{connections, metric, metric_sum, proc_status},
};
use crate::plan::{HARD, KcpFigures, LqFigures, NS, repo};

/// A started shard: its facts and two clients at its root (paths carry `/clusters/<c>`).
pub(crate) struct Shard {
    pub(crate) url: String,
    pub(crate) port: String,
    pub(crate) pid: u32,
    pub(crate) kubeconfig: PathBuf,
    /// Where kcp-admin's requests go when the shard is one of several: the front-proxy
    /// (kubeconfig, URL), which routes a workspace's path to the shard it is on.
    pub(crate) front: Option<(PathBuf, String)>,
    /// The shard's name when it is one of several: its workspaces are placed on it by the
    /// `name` label kcp gives each Shard.
    pub(crate) name: Option<String>,
    /// (n, of): the shard hosts consumer i when i mod `of` = n.
    pub(crate) hosts: (usize, usize),
    /// kcp-admin (context `base`): creates workspaces, exports, bindings, objects.
    pub(crate) admin: Client,
    /// shard-admin (context `shard-base`): wildcard lists, /metrics, quotas and their status.
    pub(crate) root: Client,
}

pub(crate) fn facts(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(dir.join("env"))
        .unwrap_or_else(|e| panic!("{}/env: {e}", dir.display()))
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}

pub(crate) async fn root_client(kubeconfig: &Path, context: &str, url: &str) -> Client {
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
    // Its requests apart from lazyquota's in the shard's audit log (the transport below would
    // name them lazyquota's).
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static("lazyquota-bench"),
    ));
    // lazyquota's transport (HTTP/2, TCP_NODELAY), as a user's kubectl would be (client-go:
    // HTTP/2, Go's sockets without Nagle), not kube's default client (HTTP/1.1, Nagle on), with
    // which a sample's create request took over ten times the shard's own part of it (the shard's
    // audit log: benches/results/kcp-latency-dd59adc).
    Pool::new(&config, Transport::default())
        .and_then(|pool| pool.client(config))
        .expect("client")
}

/// kcp-admin's client: through the front-proxy when there is one, else at the shard.
async fn admin_client(front: Option<&(PathBuf, String)>, kubeconfig: &Path, url: &str) -> Client {
    match front {
        Some((k, u)) => root_client(k, "base", u).await,
        None => root_client(kubeconfig, "base", url).await,
    }
}

/// (Re)starts the shard of `dir` with start.sh and returns it with fresh clients (a restart
/// changes the port and the kcp-admin token).
pub(crate) async fn start_kcp(dir: &Path, quota: bool, keep: bool) -> Shard {
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
    let pid = f["LAZYQUOTA_KCP_PID"].parse().expect("pid");
    Shard::open(
        PathBuf::from(&f["LAZYQUOTA_KCP_KUBECONFIG"]),
        f["LAZYQUOTA_KCP_URL"].clone(),
        pid,
        None,
        (None, (0, 1)),
    )
    .await
}

pub(crate) async fn call(
    client: &Client,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Value, kube::Error> {
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
pub(crate) async fn create(
    client: &Client,
    path: &str,
    body: &Value,
    patience: Duration,
) -> Result<(), String> {
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

impl Shard {
    /// The shard at `url` (its admin kubeconfig has contexts `base` and `shard-base`, or only
    /// `shard-base` when kcp-admin goes through `front`).
    pub(crate) async fn open(
        kubeconfig: PathBuf,
        url: String,
        pid: u32,
        front: Option<(PathBuf, String)>,
        (name, hosts): (Option<String>, (usize, usize)),
    ) -> Self {
        let admin = admin_client(front.as_ref(), &kubeconfig, &url).await;
        Self {
            port: url.rsplit(':').next().expect("port").to_owned(),
            pid,
            root: root_client(&kubeconfig, "shard-base", &url).await,
            admin,
            kubeconfig,
            url,
            front,
            name,
            hosts,
        }
    }

    /// kcp's `gitVersion` (empty when /version does not answer).
    pub(crate) async fn version(&self) -> String {
        call(&self.root, "GET", "/version", None)
            .await
            .ok()
            .and_then(|v| v["gitVersion"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// Whether consumer `i` is on this shard.
    pub(crate) fn hosts(&self, i: usize) -> bool {
        i % self.hosts.1 == self.hosts.0
    }

    pub(crate) async fn metrics(&self) -> String {
        let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
        self.root.request_text(request).await.expect("kcp /metrics")
    }

    /// Runs a garbage collection in kcp (`/debug/pprof/heap?gc=1`, the apiserver's profiling
    /// endpoint), so that heap figures are read right after a GC rather than wherever the GC
    /// cycle happens to be. Whether it answered.
    pub(crate) async fn force_gc(&self) -> bool {
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
    pub(crate) async fn refresh(&mut self) {
        self.admin = admin_client(self.front.as_ref(), &self.kubeconfig, &self.url).await;
        self.root = root_client(&self.kubeconfig, "shard-base", &self.url).await;
    }

    pub(crate) async fn figures(&self) -> KcpFigures {
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
    pub(crate) async fn all_quotas(&self) -> BTreeMap<(String, String, String), Value> {
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

pub(crate) fn quota_path(cluster: &str, name: &str) -> String {
    format!("/clusters/{cluster}/api/v1/namespaces/{NS}/resourcequotas/{name}")
}

pub(crate) fn quota_body(name: &str, key: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name},
           "spec": {"hard": {key: HARD}}})
}

pub(crate) fn used(quota: &Value, key: &str) -> Option<u64> {
    quota["status"]["used"][key].as_str()?.parse().ok()
}

/// lazyquota against the shard, stopped when dropped.
pub(crate) struct Lazyquota {
    pub(crate) child: Child,
    pub(crate) metrics: Client,
    pub(crate) log: PathBuf,
}

impl Drop for Lazyquota {
    fn drop(&mut self) {
        common::stop_child(&mut self.child);
    }
}

impl Lazyquota {
    /// Starts lazyquota against the shard; `malloc_conf`, if given, is jemalloc's
    /// `_RJEM_MALLOC_CONF` (lazyquota then keeps jemalloc's defaults plus that).
    pub(crate) fn start(
        shard: &Shard,
        dir: &Path,
        bin: &Path,
        label: &str,
        shared_threshold: usize,
        malloc_conf: Option<&str>,
    ) -> Self {
        // The admin kubeconfig with the shard admin as its current context (wildcard requests).
        let kubeconfig = dir.join(format!("lazyquota-{label}.kubeconfig"));
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
            // LAZYQUOTA_BENCH_LOG: lazyquota's RUST_LOG, to trace a run (its log is in the state dir).
            .env(
                "RUST_LOG",
                std::env::var("LAZYQUOTA_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
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

    pub(crate) fn alive(&mut self) {
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

    pub(crate) async fn text(&self) -> Option<String> {
        let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
        self.metrics.request_text(request).await.ok()
    }

    pub(crate) async fn figures(&self, shard: &Shard) -> LqFigures {
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
    pub(crate) async fn engagement(&self) -> Option<(f64, f64)> {
        let text = self.text().await?;
        let engaged = metric(&text, "lazyquota_kcp_engaged_clusters");
        (!engaged.is_nan()).then(|| (engaged, metric_sum(&text, "lazyquota_active_watches", "")))
    }
}
