//! The `lazyquota` binary: CLI and wiring. The work happens in the library crates.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod jemalloc;
mod server;

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use futures::future::{BoxFuture, FutureExt as _};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use lazyquota_index::{keys::ClusterName, planner::PlanSettings};
use lazyquota_kube::{
    client::Transport,
    controller::{Config, Controller, Mode, SnapshotHandle},
    lease::{LeaseLock, Timing},
    metrics::Metrics,
    report,
    shard::Shard,
    source::{ClusterFlags, ClusterSource, Endpoint},
};
use lazyquota_quota::FeatureGates;
use tokio::sync::watch;
use tracing::{Instrument as _, info, info_span, warn};

/// A Kubernetes ResourceQuota controller that watches a resource type only while some
/// ResourceQuota constrains it.
#[derive(Parser)]
#[command(name = "lazyquota", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller.
    Run(Box<RunArgs>),
    /// Compute what status.used should be, from a direct list (no writes), and show where the
    /// stored value differs.
    Usage(UsageArgs),
    /// Show which resource types lazyquota watches for the cluster's quotas, in which scope,
    /// for which quotas and keys; which names are pending and why.
    Explain(ExplainArgs),
}

#[derive(Args)]
struct UsageArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Only quotas in this namespace (default: all namespaces).
    #[arg(short, long)]
    namespace: Option<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Args)]
struct ExplainArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The watch flags of the `run` being explained.
    #[command(flatten)]
    watch: WatchArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Table,
    Json,
}

/// Where the clusters are. Without a cluster flag: one cluster, the kubeconfig's current
/// context (or the in-cluster service account).
#[derive(Args)]
struct ClusterArgs {
    /// Path to a kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// A kubeconfig context to serve, named after the context. Repeat it to serve several
    /// clusters from one process.
    #[arg(long, value_name = "NAME")]
    context: Vec<String>,
    /// Serve every context of the kubeconfig, each as its own cluster.
    #[arg(long)]
    all_contexts: bool,
    /// A kubeconfig file to serve as one more cluster (its current context), named NAME or
    /// after that context. Repeatable.
    #[arg(long, value_name = "[NAME=]FILE")]
    cluster_kubeconfig: Vec<String>,
    /// kcp: serve every logical cluster of this shard that has a ResourceQuota (wildcard
    /// watches; credentials from --kubeconfig/--context, which must allow wildcard list/watch
    /// on the shard). One lazyquota per shard.
    #[arg(
        long,
        env = "LAZYQUOTA_KCP_SHARD_URL",
        value_name = "URL",
        conflicts_with_all = ["all_contexts", "cluster_kubeconfig"]
    )]
    kcp_shard_url: Option<String>,
    /// kcp: the logical cluster holding the leader-election Lease and answering /metrics
    /// reviews.
    #[arg(long, value_name = "NAME", default_value = "root", requires = "kcp_shard_url")]
    kcp_home_cluster: String,
    /// kcp: from this many logical clusters watching a type for counts on, one shared wildcard
    /// metadata watch serves them all (0: never share). The default, 2, is where sharing costs
    /// less memory: a watch of its own costs an engaged cluster about 34 KiB; a share of a
    /// shared watch about 9 KiB, the shared watch about 25 KiB (`benches/results/kcp-engine`).
    #[arg(long, value_name = "N", default_value_t = 2)]
    kcp_shared_watch_threshold: usize,
    /// Feature gates as KCM's flag of that name sets them (`Name=true,Name=false`), over the
    /// defaults of each cluster's Kubernetes release (read from its /version). Only the gates
    /// that change quota are known: InPlacePodVerticalScaling, PodLevelResources,
    /// InPlacePodLevelResourcesVerticalScaling, VolumeAttributesClass,
    /// DynamicResourceAllocation, DRAExtendedResource, DRANodeAllocatableResources.
    #[arg(long, value_name = "GATES", value_parser = parse_feature_gates, default_value = "")]
    feature_gates: FeatureGateOverrides,
}

/// `--feature-gates`, parsed (the names are checked against each cluster's release).
#[derive(Clone, Debug, Default)]
struct FeatureGateOverrides(Vec<(String, bool)>);

fn parse_feature_gates(text: &str) -> Result<FeatureGateOverrides, String> {
    lazyquota_quota::gates::parse_overrides(text)
        .map(FeatureGateOverrides)
        .map_err(|e| e.to_string())
}

impl ClusterArgs {
    /// Reads each endpoint's version and sets its gates: the release's defaults, then
    /// `--feature-gates`. An endpoint that cannot be reached keeps the newest defaults (with
    /// the flag) and a warning; `single` makes that an error instead.
    /// On kcp every logical cluster is of the shard's release: the first one is asked.
    async fn set_gates(&self, endpoints: &mut [Endpoint], single: bool) -> anyhow::Result<()> {
        let ask = if self.kcp_shard_url.is_some() {
            endpoints.len().min(1)
        } else {
            endpoints.len()
        };
        for endpoint in &mut endpoints[..ask] {
            let version = match endpoint.client.apiserver_version().await {
                Ok(version) => {
                    info!(cluster = %endpoint.name, version = %version.git_version, "connected");
                    Some(version.git_version)
                }
                Err(error) if single => {
                    return Err(anyhow::Error::from(error).context("cannot reach the kube-apiserver"));
                }
                Err(error) => {
                    warn!(cluster = %endpoint.name, %error, "cannot reach the cluster yet (its controller keeps retrying); until its version is known, the newest release's feature gates apply");
                    None
                }
            };
            let (mut gates, fit) = match &version {
                Some(v) => FeatureGates::for_version(v),
                None => (FeatureGates::default(), lazyquota_quota::gates::VersionFit::Known),
            };
            if fit != lazyquota_quota::gates::VersionFit::Known {
                warn!(cluster = %endpoint.name, "{fit}");
            }
            gates
                .apply(&self.feature_gates.0)
                .with_context(|| format!("--feature-gates for cluster {}", endpoint.name))?;
            info!(cluster = %endpoint.name, release = %format!("1.{}", gates.minor), gates = %gates.describe(), "feature gates");
            endpoint.gates = gates;
        }
        if let Some(first) = endpoints.first().map(|e| e.gates) {
            for endpoint in &mut endpoints[ask..] {
                endpoint.gates = first;
            }
        }
        Ok(())
    }

    fn source(&self) -> anyhow::Result<ClusterSource> {
        Ok(ClusterSource::from_flags(&ClusterFlags {
            kubeconfig: self.kubeconfig.as_deref(),
            contexts: &self.context,
            all_contexts: self.all_contexts,
            cluster_kubeconfigs: &self.cluster_kubeconfig,
        })?)
    }

    /// One client per cluster (HTTP/1.1, for the one-shot commands); with kcp, one per
    /// logical cluster that has a ResourceQuota.
    async fn endpoints(&self) -> anyhow::Result<Vec<Endpoint>> {
        if let Some(shard) = self.shard(Transport::Http1).await? {
            return Ok(shard.endpoints().await?);
        }
        Ok(self.source()?.connect(Transport::Http1).await?)
    }

    /// The kcp shard, when `--kcp-shard-url` is given.
    async fn shard(&self, transport: Transport) -> anyhow::Result<Option<Shard>> {
        let Some(url) = &self.kcp_shard_url else {
            return Ok(None);
        };
        if self.context.len() > 1 {
            anyhow::bail!("--kcp-shard-url serves one shard: give at most one --context (its credentials)");
        }
        let config = lazyquota_kube::client::load_config(
            self.kubeconfig.as_deref(),
            self.context.first().map(String::as_str),
        )
        .await?;
        Ok(Some(Shard::new(config, url, transport)?))
    }
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    watch: WatchArgs,
    /// Full recalculation of every quota (KCM: --resource-quota-sync-period). 0 disables.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    resync_period: Duration,
    /// Quotas computed and written at once (KCM: --concurrent-resource-quota-syncs).
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// Compute and report status.used (log lines and a metric per disagreeing key), never write.
    #[arg(long)]
    shadow: bool,
    /// Safety-net discovery poll; CRD and APIService changes trigger discovery at once.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    discovery_poll: Duration,
    /// Streaming lists (sendInitialEvents): off (paginated, consistent lists), probe the server
    /// once (auto), or force (on). Off by default: kube-runtime streams at resourceVersion 0,
    /// which a failing apiserver watch cache can answer with a stale empty list.
    #[arg(long, value_enum, default_value_t = StreamingLists::Off)]
    streaming_lists: StreamingLists,
    /// How to talk to the apiserver: HTTP/2 (watches multiplexed on one connection, another
    /// one opened per --http2-streams-per-connection open streams) or HTTP/1.1 (one connection
    /// per open watch).
    #[arg(long, value_enum, default_value_t = TransportArg::Http2)]
    transport: TransportArg,
    /// HTTP/2: streams opened on one connection before another is opened. Keep it below the
    /// server's limit (SETTINGS_MAX_CONCURRENT_STREAMS: 100 in a generic apiserver unless
    /// --http2-max-streams-per-connection says otherwise), else requests queue behind watches.
    #[arg(long, value_name = "N", default_value_t = lazyquota_kube::spread::DEFAULT_STREAMS_PER_CONNECTION, value_parser = clap::value_parser!(u16).range(1..))]
    http2_streams_per_connection: u16,
    /// Where to serve /metrics, /healthz and /readyz.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9090")]
    metrics_addr: SocketAddr,
    /// Who may read /metrics: anyone who reaches it (none), or a bearer token checked with
    /// TokenReview and SubjectAccessReview (get on the path /metrics), as KCM's secure port;
    /// delegated serves HTTPS. /healthz and /readyz stay open.
    #[arg(long, value_enum, default_value_t = MetricsAuth::None)]
    metrics_auth: MetricsAuth,
    /// Export each quota key's used, hard and used/hard as lazyquota_quota_used,
    /// lazyquota_quota_hard and lazyquota_quota_usage_ratio (labels cluster, namespace, quota,
    /// resource): three series per quota key, ~2.4 KiB of process memory per key (measured:
    /// tests/quota_usage_cost.rs).
    #[arg(long)]
    quota_usage_metrics: bool,
    /// With --quota-usage-metrics: at most this many quota keys are exported (the first in
    /// cluster, namespace, quota, key order); the rest are counted in
    /// lazyquota_quota_usage_series_dropped.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 2_000,
        requires = "quota_usage_metrics"
    )]
    quota_usage_metrics_max_series: usize,
    /// PEM certificate for HTTPS on --metrics-addr (default with delegated auth: self-signed).
    #[arg(long, value_name = "FILE", requires = "metrics_tls_key_file")]
    metrics_tls_cert_file: Option<PathBuf>,
    /// PEM private key of --metrics-tls-cert-file.
    #[arg(long, value_name = "FILE", requires = "metrics_tls_cert_file")]
    metrics_tls_key_file: Option<PathBuf>,
    #[command(flatten)]
    leader: LeaderArgs,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// Leader election on a coordination.k8s.io Lease (KCM's --leader-elect-* flags).
#[derive(Args)]
#[allow(clippy::struct_field_names)] // the fields are the flags' names, which mirror KCM's
struct LeaderArgs {
    /// Run as one of several replicas: only the Lease holder computes and writes.
    #[arg(long)]
    leader_elect: bool,
    /// Namespace of the Lease (default: $POD_NAMESPACE, else "default").
    #[arg(long, env = "POD_NAMESPACE", value_name = "NS", default_value = "default")]
    leader_election_namespace: String,
    /// Name of the Lease.
    #[arg(long, value_name = "NAME", default_value = "lazyquota")]
    leader_election_lease_name: String,
    /// This replica's identity in the Lease (default: $POD_NAME, else the host name).
    #[arg(long, env = "POD_NAME", value_name = "ID")]
    leader_election_identity: Option<String>,
    /// How long a standby waits on an unchanged Lease before taking over.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    leader_election_lease_duration: Duration,
    /// How long the leader tries to renew before giving up leadership (and exiting).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    leader_election_renew_deadline: Duration,
    /// How often candidates retry and the leader renews.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    leader_election_retry_period: Duration,
}

/// What the watch planner takes from the command line: `run` and `explain` share these flags,
/// so `explain` answers for the `run` it is given.
#[derive(Args, Clone, Copy)]
struct WatchArgs {
    /// Which resource types are watched: only those some ResourceQuota constrains (lazy), or
    /// every quotable type, as upstream KCM does (eager; kept for comparison).
    #[arg(long, value_enum, default_value_t = ModeArg::Lazy)]
    mode: ModeArg,
    /// Above this many namespaces demanding a resource type, watch it cluster-wide (filtered at
    /// ingest) instead of with one watch per namespace.
    #[arg(long, value_name = "N", default_value_t = 8)]
    namespace_watch_threshold: usize,
}

impl WatchArgs {
    fn mode(self) -> Mode {
        match self.mode {
            ModeArg::Lazy => Mode::Lazy,
            ModeArg::Eager => Mode::Eager,
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ModeArg {
    Lazy,
    Eager,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum MetricsAuth {
    None,
    Delegated,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum TransportArg {
    Http1,
    Http2,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum StreamingLists {
    Auto,
    On,
    Off,
}

/// Parses `90s`, `5m`, `1h`, `250ms` or a plain number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 30s, 5m or 1h"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(number)),
        "ms" => Ok(Duration::from_millis(number)),
        "m" => Ok(Duration::from_secs(number * 60)),
        "h" => Ok(Duration::from_secs(number * 3600)),
        _ => Err(format!("{text:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The multi-threaded runtime everything runs on; with `on_thread_start`, a hook each of its
/// threads runs first.
fn runtime(on_thread_start: Option<fn()>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(hook) = on_thread_start {
        builder.on_thread_start(hook);
    }
    builder.enable_all().build()
}

fn main() -> ExitCode {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    let on_thread_start = jemalloc::tune();
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let on_thread_start = None;
    let cli = Cli::parse();
    let runtime = match runtime(on_thread_start) {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("lazyquota: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("lazyquota: {}", one_line(&error));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, no backtrace. Many errors already include their
/// source in their message; a cause whose text the line already holds is not repeated.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line.replace('\n', " ")
}

async fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run(*args).await,
        Command::Usage(args) => usage(args).await,
        Command::Explain(args) => explain(args).await,
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let RunArgs {
        cluster,
        watch,
        resync_period,
        concurrency,
        shadow,
        discovery_poll,
        streaming_lists,
        transport,
        http2_streams_per_connection,
        metrics_addr,
        metrics_auth,
        quota_usage_metrics,
        quota_usage_metrics_max_series,
        metrics_tls_cert_file,
        metrics_tls_key_file,
        leader,
        log_format,
    } = args;
    init_tracing(log_format);
    let transport = match transport {
        TransportArg::Http1 => Transport::Http1,
        TransportArg::Http2 => Transport::Http2 {
            streams_per_connection: usize::from(http2_streams_per_connection),
        },
    };
    let shard = cluster.shard(transport).await?;
    let endpoints = match &shard {
        // kcp: the home cluster carries the Lease and answers /metrics reviews; the logical
        // clusters served are found on the shard.
        Some(shard) => vec![Endpoint {
            gates: FeatureGates::default(),
            name: ClusterName::new(&cluster.kcp_home_cluster),
            client: shard.cluster(&ClusterName::new(&cluster.kcp_home_cluster))?,
            workspace: None,
        }],
        None => cluster.source()?.connect(transport).await?,
    };
    // One cluster: unreachable is a start-up error. Several (hosted control planes): one
    // that is down must not keep the others from being served; its controller retries.
    let single = endpoints.len() == 1 && shard.is_none();
    let mut endpoints = endpoints;
    cluster.set_gates(&mut endpoints, single).await?;

    let identity = match &leader.leader_election_identity {
        Some(id) => id.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_or_else(|_| "lazyquota".into(), |h| h.trim().to_owned()),
    };
    let config = Config {
        instance: identity.clone(),
        mode: watch.mode(),
        resync_period,
        concurrency: usize::from(concurrency),
        shadow,
        namespace_watch_threshold: watch.namespace_watch_threshold,
        discovery_poll,
        streaming_lists: match streaming_lists {
            StreamingLists::Auto => None,
            StreamingLists::On => Some(true),
            StreamingLists::Off => Some(false),
        },
        quota_usage_metrics,
        // kcp: every logical cluster of the shard is of the shard's release.
        gates: endpoints[0].gates,
        ..Config::default()
    };

    // One shutdown signal for everything: SIGTERM or SIGINT.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };

    let metrics = Metrics::new();
    metrics.set_quota_series_cap(quota_usage_metrics_max_series);
    let (controller_tx, controller_rx) = watch::channel(Vec::new());
    let (standby_tx, standby_rx) = watch::channel(!leader.leader_elect);
    let mut admin = server::Admin::new(metrics.clone(), controller_rx, standby_rx);
    let tls_files = metrics_tls_cert_file
        .as_deref()
        .zip(metrics_tls_key_file.as_deref());
    let tls = if metrics_auth == MetricsAuth::Delegated || tls_files.is_some() {
        Some(server::tls_config(tls_files)?)
    } else {
        None
    };
    if metrics_auth == MetricsAuth::Delegated {
        // Reviews go to the first cluster named: the one lazyquota runs in.
        admin.auth = Some(std::sync::Arc::new(
            lazyquota_kube::delegated::DelegatedAuth::new(endpoints[0].client.clone()),
        ));
    }
    let listener = tokio::net::TcpListener::bind(metrics_addr)
        .await
        .with_context(|| format!("cannot listen on --metrics-addr {metrics_addr}"))?;
    let server = tokio::spawn(server::serve(listener, admin, tls, stopped()));

    let result = if leader.leader_elect {
        let timing = Timing {
            lease_duration: leader.leader_election_lease_duration,
            renew_deadline: leader.leader_election_renew_deadline,
            retry_period: leader.leader_election_retry_period,
        };
        let namespace = &leader.leader_election_namespace;
        let name = &leader.leader_election_lease_name;
        // The Lease lives in the first cluster named (the only one, usually).
        let lock = LeaseLock::new(endpoints[0].client.clone(), namespace, name, &identity, timing);
        info!(%identity, lease = %name, %namespace, cluster = %endpoints[0].name, "waiting for the leader lease");
        run_leader_elected(
            shard.map(|s| (s, cluster.kcp_shared_watch_threshold)),
            endpoints,
            config,
            metrics,
            lock,
            &controller_tx,
            &standby_tx,
            stopped,
        )
        .await
    } else {
        metrics.leader.set(1);
        serve(
            shard.map(|s| (s, cluster.kcp_shared_watch_threshold)),
            endpoints,
            &config,
            &metrics,
            &controller_tx,
            stopped,
        )
        .await
    };
    server.abort();
    info!("stopped");
    result
}

/// Waits for the Lease, then runs the controller while holding it. Losing the Lease ends
/// the process with an error (Kubernetes restarts it as a standby): no write happens after.
#[allow(clippy::too_many_arguments)] // the run's parts, each used once
async fn run_leader_elected<F, Fut>(
    shard: Option<(Shard, usize)>,
    endpoints: Vec<Endpoint>,
    config: Config,
    metrics: Metrics,
    mut lock: LeaseLock,
    controller_tx: &watch::Sender<Vec<SnapshotHandle>>,
    standby_tx: &watch::Sender<bool>,
    stopped: F,
) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    metrics.leader.set(0);
    tokio::select! {
        () = lock.acquire(standby_tx) => {}
        () = stopped() => return Ok(()),
    }
    metrics.leader.set(1);
    let outcome = tokio::select! {
        result = serve(shard, endpoints, &config, &metrics, controller_tx, &stopped) => result,
        lost = lock.hold() => {
            metrics.leader.set(0);
            return Err(anyhow::Error::from(lost));
        }
    };
    lock.release().await;
    metrics.leader.set(0);
    outcome
}

/// Serves the kcp shard, or else the clusters of `endpoints`.
async fn serve<F, Fut>(
    shard: Option<(Shard, usize)>,
    endpoints: Vec<Endpoint>,
    config: &Config,
    metrics: &Metrics,
    controller_tx: &watch::Sender<Vec<SnapshotHandle>>,
    stopped: F,
) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    match shard {
        Some((shard, threshold)) => {
            Ok(
                lazyquota_kube::kcp::run(&shard, config, threshold, metrics, controller_tx, stopped())
                    .await?,
            )
        }
        None => run_clusters(endpoints, config, metrics, controller_tx, stopped).await,
    }
}

/// Runs one controller per cluster, each in its own task (its logs carry the cluster), until
/// `stopped` completes; the first controller error ends them all.
async fn run_clusters<F, Fut>(
    endpoints: Vec<Endpoint>,
    config: &Config,
    metrics: &Metrics,
    controller_tx: &watch::Sender<Vec<SnapshotHandle>>,
    stopped: F,
) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut handles = Vec::with_capacity(endpoints.len());
    // A JoinSet: dropping this future (a lost Lease) aborts every controller at once.
    let mut tasks = tokio::task::JoinSet::new();
    for Endpoint {
        name, client, gates, ..
    } in endpoints
    {
        let span = info_span!("cluster", cluster = %name);
        let config = Config {
            cluster: name,
            gates,
            ..config.clone()
        };
        let (controller, handle) = Controller::new(client, config, metrics.clone());
        handles.push(handle);
        let run: BoxFuture<'static, _> = controller.run(stopped()).instrument(span).boxed();
        tasks.spawn(run);
    }
    controller_tx.send_replace(handles);
    let outcome = match tasks.join_next().await {
        Some(Ok(result)) => result.map_err(anyhow::Error::from),
        Some(Err(error)) => Err(anyhow::anyhow!("a controller task failed: {error}")),
        None => Ok(()),
    };
    if outcome.is_err() {
        tasks.abort_all();
    }
    // Shutdown: every controller drains its writes; wait for all of them.
    while let Some(ended) = tasks.join_next().await {
        if let Ok(Err(error)) = ended {
            warn!(%error, "controller stopped with an error");
        }
    }
    outcome
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        Some(()) = async { match term.as_mut() { Some(t) => t.recv().await, None => std::future::pending().await } } => {}
    }
    info!("shutdown signal received");
}

async fn usage(args: UsageArgs) -> anyhow::Result<()> {
    let UsageArgs {
        cluster,
        namespace,
        output,
    } = args;
    let kcp = cluster.kcp_shard_url.is_some();
    let mut endpoints = cluster.endpoints().await?;
    let single = endpoints.len() == 1;
    cluster.set_gates(&mut endpoints, single).await?;
    let mut report = Vec::new();
    for Endpoint {
        name,
        client,
        workspace,
        gates,
    } in &endpoints
    {
        let quotas = report::usage(client, name, namespace.as_deref(), *gates, kcp)
            .await
            .with_context(|| in_cluster(&endpoints, name))?;
        report.extend(quotas.into_iter().map(|q| report::QuotaUsage {
            workspace: workspace.clone(),
            ..q
        }));
    }
    if output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    // The cluster column only when there is more than one; the workspace path next to it on kcp.
    let many = endpoints.len() > 1;
    let workspaces = endpoints.iter().any(|e| e.workspace.is_some());
    let mut header = vec!["NAMESPACE", "QUOTA", "KEY", "HARD", "USED", "STORED", ""];
    if workspaces {
        header.insert(0, "WORKSPACE");
    }
    if many || workspaces {
        header.insert(0, "CLUSTER");
    }
    let mut rows = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    for quota in &report {
        for key in &quota.keys {
            let mut row = vec![
                quota.namespace.clone(),
                quota.name.clone(),
                key.key.clone(),
                key.hard.clone(),
                key.computed.clone().unwrap_or_else(|| "-".into()),
                key.stored.clone().unwrap_or_else(|| "-".into()),
                match (&key.unknown, key.differs) {
                    (Some(why), _) => format!("unknown ({why})"),
                    (None, true) => "differs".into(),
                    (None, false) => String::new(),
                },
            ];
            if workspaces {
                row.insert(0, quota.workspace.clone().unwrap_or_else(|| "-".into()));
            }
            if many || workspaces {
                row.insert(0, quota.cluster.clone());
            }
            rows.push(row);
        }
    }
    print_table(&rows);
    Ok(())
}

/// The context of an error in one of several clusters (none when there is one).
fn in_cluster(endpoints: &[Endpoint], name: &ClusterName) -> String {
    if endpoints.len() > 1 {
        format!("cluster {name}")
    } else {
        String::new()
    }
}

async fn explain(args: ExplainArgs) -> anyhow::Result<()> {
    let ExplainArgs {
        cluster,
        watch,
        output,
    } = args;
    let kcp = cluster.kcp_shard_url.is_some();
    let mut endpoints = cluster.endpoints().await?;
    let single = endpoints.len() == 1;
    cluster.set_gates(&mut endpoints, single).await?;
    let mut reports = Vec::with_capacity(endpoints.len());
    for Endpoint {
        name,
        client,
        workspace,
        gates,
    } in &endpoints
    {
        let settings = PlanSettings {
            mode: watch.mode(),
            namespace_watch_threshold: watch.namespace_watch_threshold,
            gates: *gates,
        };
        let report = report::explain(client, name, settings, kcp)
            .await
            .with_context(|| in_cluster(&endpoints, name))?;
        reports.push(report::Explain {
            workspace: workspace.clone(),
            ..report
        });
    }
    if kcp {
        report::mark_shared(&mut reports, cluster.kcp_shared_watch_threshold);
    }
    if output == Output::Json {
        // One report per cluster, always a list.
        println!("{}", serde_json::to_string_pretty(&reports)?);
        return Ok(());
    }
    for (i, report) in reports.iter().enumerate() {
        if i > 0 {
            println!();
        }
        print_explain(report);
    }
    Ok(())
}

fn print_explain(report: &report::Explain) {
    let workspace = report
        .workspace
        .as_ref()
        .map(|w| format!(" (workspace {w})"))
        .unwrap_or_default();
    println!(
        "cluster {}{workspace}: {} resource type(s) demanded",
        report.cluster,
        report.resources.len()
    );
    println!(
        "semantics of Kubernetes {}; feature gates: {}",
        report.release, report.gates
    );
    let mut rows = vec![
        [
            "RESOURCE",
            "VERSION",
            "WATCH",
            "SCOPE",
            "NAMESPACES",
            "QUOTAS: KEYS",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for r in &report.resources {
        rows.push(vec![
            r.resource.clone(),
            r.version.clone().unwrap_or_else(|| "pending".into()),
            r.watch.into(),
            r.scope.into(),
            r.namespaces.join(","),
            r.quotas.join("; "),
        ]);
    }
    print_table(&rows);
    for r in &report.resources {
        if let Some(reason) = &r.scope_reason {
            println!("{} {}: {reason}", r.scope, r.resource);
        }
        if let (Some(source), Some(reason)) = (r.source, &r.source_reason) {
            println!("{source} watch {}: {reason}", r.resource);
        }
    }
    for r in report.resources.iter().filter(|r| r.pending.is_some()) {
        println!(
            "pending {}: {}",
            r.resource,
            r.pending.as_deref().unwrap_or_default()
        );
    }
    for key in &report.always_zero {
        println!("always 0 under its scopes (nothing watched): {key}");
    }
    for key in &report.never_computed {
        println!("never computed (no evaluator; stays as stored): {key}");
    }
}

fn print_table(rows: &[Vec<String>]) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(String::len)
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
}
