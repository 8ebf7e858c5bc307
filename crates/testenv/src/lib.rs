//! Test support for lazyquota's integration tests: a **real** control plane (etcd,
//! kube-apiserver and kube-controller-manager built from the published Go modules by
//! `tests/control-plane/build.sh`), a fresh namespace per test, and clients.
//!
//! Two flavours exist, because two controllers must never write the same quota status:
//! [`Flavor::KcmQuota`] runs KCM's own resourcequota controller (the upstream reference for
//! differential tests), [`Flavor::LazyquotaOnly`] runs KCM without it, so lazyquota is the
//! only writer. Admission (the ResourceQuota plugin) is on in both. [`Flavor::MultiCluster`] is
//! lazyquota-only with two more kube-apiservers on the same etcd (each its own cluster, by
//! `--etcd-prefix`), for one lazyquota process serving several clusters.
//!
//! Two ways to get a control plane of a flavour:
//! - **attach**: the flavour's environment variable (`LAZYQUOTA_CP_DIR` for lazyquota-only,
//!   `LAZYQUOTA_CP_DIR_KCM` for KCM-quota) names the state directory of a control plane
//!   started by `tests/control-plane/start.sh`; its `admin.kubeconfig` and `env` facts are used.
//! - **start**: otherwise the first test to ask starts one under
//!   `<repo>/.lazyquota/testenv-<flavour>`, guarded by a file lock so that every test binary of
//!   a `cargo test` run shares it. It is left running for the next binary; `make test` stops
//!   it at the end (`make cp-stop` does too).

#![forbid(unsafe_code)]

pub mod churn;
pub mod fixtures;
pub mod kcp;
mod namespace;
pub mod proxy;
mod start;
pub mod unavailable;

pub use namespace::TestNamespace;
use start::{apiserver_ready, start_shared};

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

/// Label put on every namespace a test creates, so leftovers can be found and removed.
pub const TEST_NAMESPACE_LABEL: &str = "lazyquota.dev/test";

/// What can go wrong while providing the test environment.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The control plane could not be started; the message carries the script's output.
    #[error("starting the control plane with {script}: {message}")]
    Start {
        /// The script that was run.
        script: PathBuf,
        /// What it printed.
        message: String,
    },
    /// A file of the control plane (kubeconfig, facts) could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig could not be turned into a client configuration.
    #[error("loading kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The kubeconfig.
        path: PathBuf,
        /// The error from kube.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// A request to the control plane failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The error from kube.
        #[source]
        source: kube::Error,
    },
    /// A fact the test needs is not known for this control plane.
    #[error("the control plane has no {0} (see $LAZYQUOTA_CP_DIR/env)")]
    Missing(&'static str),
}

/// Which controllers write ResourceQuota status in a control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// KCM runs its resourcequota controller: the upstream reference.
    KcmQuota,
    /// KCM runs without it: lazyquota is the only writer of quota status.
    LazyquotaOnly,
    /// As [`Flavor::LazyquotaOnly`], plus two more kube-apiservers sharing etcd under their
    /// own prefixes: three clusters, contexts `cluster-0..2` of [`ControlPlane::clusters_kubeconfig`].
    MultiCluster,
    /// As [`Flavor::LazyquotaOnly`], with a harsh apiserver: its watch cache off, so every watch
    /// is served by etcd and a watch resumed at a compacted revision gets `410 Gone` and relists
    /// — the harshest form of watch expiry, for compaction tests ([`ControlPlane::compact_etcd`]);
    /// and at most 8 concurrent HTTP/2 streams per connection (`--http2-max-streams-per-connection`,
    /// below lazyquota's default share of 64).
    Compacting,
}

impl Flavor {
    fn env_var(self) -> &'static str {
        match self {
            Self::KcmQuota => "LAZYQUOTA_CP_DIR_KCM",
            Self::LazyquotaOnly => "LAZYQUOTA_CP_DIR",
            Self::MultiCluster => "LAZYQUOTA_CP_DIR_MULTI",
            Self::Compacting => "LAZYQUOTA_CP_DIR_COMPACTING",
        }
    }

    fn dir_name(self) -> &'static str {
        match self {
            Self::KcmQuota => "testenv-kcm-quota",
            Self::LazyquotaOnly => "testenv-lazyquota-only",
            Self::MultiCluster => "testenv-multi-cluster",
            Self::Compacting => "testenv-compacting",
        }
    }

    fn kcm_quota(self) -> &'static str {
        match self {
            Self::KcmQuota => "on",
            Self::LazyquotaOnly | Self::MultiCluster | Self::Compacting => "off",
        }
    }

    fn extra_apiservers(self) -> &'static str {
        match self {
            Self::MultiCluster => "2",
            Self::KcmQuota | Self::LazyquotaOnly | Self::Compacting => "0",
        }
    }

    fn apiserver_args(self) -> &'static str {
        match self {
            Self::Compacting => "--watch-cache=false --http2-max-streams-per-connection=8",
            Self::KcmQuota | Self::LazyquotaOnly | Self::MultiCluster => "",
        }
    }
}

/// A running control plane the tests can use.
#[derive(Debug)]
pub struct ControlPlane {
    flavor: Flavor,
    kubeconfig: PathBuf,
    facts: BTreeMap<String, String>,
}

static KCM_QUOTA: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
static LAZYQUOTA_ONLY: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
static MULTI_CLUSTER: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
static COMPACTING: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

impl ControlPlane {
    /// The control plane of `flavor`: attached if its environment variable names one, else
    /// the shared one of this checkout, started on first use.
    ///
    /// Blocking (it may run the start script); memoised per test binary.
    ///
    /// # Panics
    /// Panics with the start script's error when no control plane can be had: every
    /// integration test needs one, and there is no meaningful way to continue without it.
    pub fn get(flavor: Flavor) -> &'static ControlPlane {
        let cell = match flavor {
            Flavor::KcmQuota => &KCM_QUOTA,
            Flavor::LazyquotaOnly => &LAZYQUOTA_ONLY,
            Flavor::MultiCluster => &MULTI_CLUSTER,
            Flavor::Compacting => &COMPACTING,
        };
        match cell.get_or_init(|| Self::attach_or_start(flavor).map_err(|e| e.to_string())) {
            Ok(cp) => cp,
            Err(message) => panic!("no {flavor:?} control plane for the integration tests: {message}"),
        }
    }

    fn attach_or_start(flavor: Flavor) -> Result<Self, Error> {
        if let Some(dir) = std::env::var_os(flavor.env_var()) {
            let dir = PathBuf::from(dir);
            let facts = read_facts(&dir.join("env"))?;
            return Ok(Self {
                flavor,
                kubeconfig: dir.join("admin.kubeconfig"),
                facts,
            });
        }
        start_shared(flavor)
    }

    /// The control plane `tests/control-plane/start.sh` started in `dir` (a benchmark's own,
    /// not shared), for its fault helpers ([`Self::kill_and_restart`], [`Self::compact_etcd`]).
    /// `flavor` says which controllers write quota status there.
    pub fn attach(dir: &Path, flavor: Flavor) -> Result<Self, Error> {
        Ok(Self {
            flavor,
            kubeconfig: dir.join("admin.kubeconfig"),
            facts: read_facts(&dir.join("env"))?,
        })
    }

    /// Which controllers write quota status here.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// Path of the admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A fact recorded by `start.sh` (for example `LAZYQUOTA_CP_BIN`), if known.
    pub fn fact(&self, key: &str) -> Option<&str> {
        self.facts.get(key).map(String::as_str)
    }

    /// A client with the admin identity.
    pub async fn client(&self) -> Result<Client, Error> {
        let config = self.config().await?;
        Client::try_from(config).map_err(|source| Error::Kube {
            what: "building the admin client".into(),
            source,
        })
    }

    /// The kubeconfig with one context per cluster (`cluster-0`, `cluster-1`, ...) of a
    /// [`Flavor::MultiCluster`] control plane.
    pub fn clusters_kubeconfig(&self) -> Result<PathBuf, Error> {
        self.fact("LAZYQUOTA_CLUSTERS_KUBECONFIG")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .ok_or(Error::Missing("LAZYQUOTA_CLUSTERS_KUBECONFIG"))
    }

    /// An admin client for one cluster (`cluster-N`) of a [`Flavor::MultiCluster`] control
    /// plane.
    pub async fn cluster_client(&self, context: &str) -> Result<Client, Error> {
        let config = context_config(&self.clusters_kubeconfig()?, context).await?;
        Client::try_from(config).map_err(|source| Error::Kube {
            what: format!("building the client of {context}"),
            source,
        })
    }

    /// Compacts etcd at its current revision (through etcd's JSON gateway): every older
    /// revision is gone, so watches resumed from one get `410 Gone`. Returns the revision.
    pub async fn compact_etcd(&self) -> Option<u64> {
        let url = self.fact("LAZYQUOTA_ETCD_URL")?;
        let post = |path: &str, body: String| {
            tokio::process::Command::new("curl")
                .args([
                    "-fsS",
                    "--max-time",
                    "5",
                    "-X",
                    "POST",
                    "-d",
                    &body,
                    &format!("{url}{path}"),
                ])
                .output()
        };
        // Any key: the response header carries the store's current revision.
        let range = post("/v3/kv/range", r#"{"key":"AA=="}"#.into()).await.ok()?;
        let reply: serde_json::Value = serde_json::from_slice(&range.stdout).ok()?;
        let revision: u64 = reply["header"]["revision"].as_str()?.parse().ok()?;
        let compact = post("/v3/kv/compaction", format!(r#"{{"revision":"{revision}"}}"#))
            .await
            .ok()?;
        compact.status.success().then_some(revision)
    }

    /// The admin client configuration (for tests that build their own clients).
    pub async fn config(&self) -> Result<Config, Error> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).map_err(|source| Error::Kubeconfig {
            path: self.kubeconfig.clone(),
            source,
        })?;
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|source| Error::Kubeconfig {
                path: self.kubeconfig.clone(),
                source,
            })
    }

    /// Freezes a component of this control plane (`SIGSTOP`; e.g. `kube-controller-manager`)
    /// until the returned guard is dropped (`SIGCONT`), however the test ends. Other test
    /// binaries share the control plane, so such a test resumes it before it returns.
    ///
    /// # Panics
    /// If the component's pid file is missing or the signal cannot be sent.
    pub fn pause(&self, component: &str) -> Paused {
        let dir = PathBuf::from(
            self.fact("LAZYQUOTA_CP_DIR")
                .expect("a control plane started by start.sh"),
        );
        let pid = std::fs::read_to_string(dir.join(format!("{component}.pid")))
            .expect("pid file")
            .trim()
            .to_owned();
        let ok = Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "cannot stop {component} (pid {pid})");
        Paused { pid }
    }

    /// Kills a component (`etcd` or `kube-apiserver`) with SIGKILL and starts it again with the
    /// same command line (same ports, certificates and data), appending to its log; returns
    /// once it is healthy again. For fault tests: other tests sharing this control plane see
    /// the outage, so such tests live in a test binary of their own.
    ///
    /// # Panics
    /// If the component cannot be found, killed, restarted, or is not healthy within 60 s.
    pub async fn kill_and_restart(&self, component: &str) {
        let dir = PathBuf::from(
            self.fact("LAZYQUOTA_CP_DIR")
                .expect("a control plane started by start.sh"),
        );
        let pid_file = dir.join(format!("{component}.pid"));
        let pid: u32 = std::fs::read_to_string(&pid_file)
            .expect("pid file")
            .trim()
            .parse()
            .expect("pid");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("the component is running");
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .expect("kill");
        while std::path::Path::new(&format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_default()
                .contains(") Z")
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let log_path = dir.join(format!("logs/{component}.log"));
        let spawn = || {
            let log = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&log_path)
                .expect("log");
            Command::new("setsid")
                .args(&args)
                .stdin(std::process::Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("restart")
        };
        let mut child = spawn();
        let healthy = eventually(Duration::from_mins(1), || {
            // The killed process can hold its ports for a moment after SIGKILL: a restart that
            // exits at once (address in use) is started again.
            if child.try_wait().ok().flatten().is_some() {
                child = spawn();
            }
            let ok = match component {
                "etcd" => Command::new("curl")
                    .args(["-fsS", "--max-time", "2"])
                    .arg(format!(
                        "{}/health",
                        self.fact("LAZYQUOTA_ETCD_URL").expect("etcd url")
                    ))
                    .output()
                    .is_ok_and(|o| o.status.success()),
                _ => apiserver_ready(
                    self.fact("LAZYQUOTA_APISERVER_URL").expect("apiserver url"),
                    &self.facts,
                ),
            };
            async move { ok.then_some(()) }
        })
        .await;
        // Not waited for: the component outlives this process, like the rest of the control
        // plane; stop.sh stops it through the pid file.
        std::fs::write(&pid_file, child.id().to_string()).expect("pid file");
        drop(child);
        assert!(healthy.is_some(), "{component} is not healthy again within 60 s");
    }

    /// The kube-apiserver's own `/metrics` text.
    pub async fn apiserver_metrics(&self) -> Result<String, Error> {
        let client = self.client().await?;
        get_text(&client, "/metrics").await
    }

    /// kube-controller-manager's `/metrics` text (its secure port allows `/metrics` to anyone
    /// in the test control plane, see `start.sh`).
    pub async fn kcm_metrics(&self) -> Result<String, Error> {
        let url = self
            .fact("LAZYQUOTA_KCM_URL")
            .filter(|u| !u.is_empty())
            .ok_or(Error::Missing("KCM URL"))?;
        let mut config = Config::new(url.parse().map_err(|_| Error::Missing("valid KCM URL"))?);
        // KCM serves a self-signed certificate of its own; this is loopback test traffic only.
        config.accept_invalid_certs = true;
        let client = Client::try_from(config).map_err(|source| Error::Kube {
            what: "building a KCM client".into(),
            source,
        })?;
        get_text(&client, "/metrics").await
    }
}

async fn get_text(client: &Client, path: &str) -> Result<String, Error> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .expect("a GET request without a body is valid");
    client.request_text(request).await.map_err(|source| Error::Kube {
        what: format!("GET {path}"),
        source,
    })
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The client configuration of `context` in the kubeconfig at `path`.
async fn context_config(path: &Path, context: &str) -> Result<Config, Error> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
        path: path.to_owned(),
        source,
    })?;
    let options = KubeConfigOptions {
        context: Some(context.to_owned()),
        ..KubeConfigOptions::default()
    };
    Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(|source| Error::Kubeconfig {
            path: path.to_owned(),
            source,
        })
}

fn read_facts(path: &Path) -> Result<BTreeMap<String, String>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    Ok(text
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect())
}

/// The state directory `<repo>/.lazyquota/<name>` of a shared server, and a file lock held
/// while it is checked or started: it serialises test binaries, so the first starts the server
/// and the others find it running. The lock is released when the file is dropped.
fn lock_state(name: &str) -> Result<(PathBuf, std::fs::File), Error> {
    let state = repo_root().join(".lazyquota");
    std::fs::create_dir_all(&state).map_err(|source| Error::Read {
        path: state.clone(),
        source,
    })?;
    let lock_path = state.join(format!("{name}.lock"));
    let lock = std::fs::File::create(&lock_path).map_err(|source| Error::Read {
        path: lock_path.clone(),
        source,
    })?;
    lock.lock().map_err(|source| Error::Read {
        path: lock_path,
        source,
    })?;
    Ok((state.join(name), lock))
}

/// A component frozen by [`ControlPlane::pause`]; resumed when dropped.
#[derive(Debug)]
pub struct Paused {
    pid: String,
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.pid]).status();
    }
}

/// A DNS-1123 label unique within this machine for the life of the test run.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tag = format!("{:x}{:x}{n:x}", std::process::id() & 0xffff, nanos & 0xffff);
    let mut prefix: String = prefix
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    prefix.make_ascii_lowercase();
    prefix.truncate(63 - 4 - tag.len());
    format!("lq-{prefix}-{tag}")
}

/// Polls `check` every 200 ms until it returns `Some`, or gives up after `timeout`.
///
/// Tests wait on observable state this way instead of sleeping for fixed times.
pub async fn eventually<T, F, Fut>(timeout: Duration, check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_every(Duration::from_millis(200), timeout, check).await
}

/// As [`eventually`], polling every `interval` (a benchmark timing what it waits for polls
/// more often: the interval bounds the figure's resolution).
pub async fn eventually_every<T, F, Fut>(interval: Duration, timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(interval).await;
    }
}

/// Established TCP connections from process `pid` to a peer on `port` (`ss` from iproute2),
/// for tests and benchmarks that count a controller's connections to a server.
///
/// # Panics
///
/// If `ss` cannot be run.
pub fn established_connections(pid: u32, port: u16) -> usize {
    let out = std::process::Command::new("ss")
        .args(["-tnpH", "state", "established"])
        .output()
        .expect("ss (iproute2)");
    let (needle, port) = (format!("pid={pid},"), format!(":{port}"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            l.contains(&needle)
                && l.split_whitespace()
                    .nth(3)
                    .is_some_and(|peer| peer.ends_with(&port))
        })
        .count()
}
