//! The command line: `lazyquota run`, `usage` and `explain`, their flags (clap derive) and how
//! each flag becomes the library's settings. README.md's flags table is checked against these
//! definitions (`readme_tables`).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use lazyquota_kube::{
    controller::Mode,
    kcp::shard::Shard,
    operate::source::{ClusterFlags, ClusterSource, Endpoint},
    transport::client::Transport,
};
use lazyquota_quota::FeatureGates;
use tracing::{info, warn};

/// A Kubernetes ResourceQuota controller that watches a resource type only while some
/// ResourceQuota constrains it.
#[derive(Parser)]
#[command(name = "lazyquota", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
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
pub(crate) struct UsageArgs {
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,
    /// Only quotas in this namespace (default: all namespaces).
    #[arg(short, long)]
    pub(crate) namespace: Option<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub(crate) output: Output,
}

#[derive(Args)]
pub(crate) struct ExplainArgs {
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,
    /// The watch flags of the `run` being explained.
    #[command(flatten)]
    pub(crate) watch: WatchArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub(crate) output: Output,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Output {
    Table,
    Json,
}

/// Where the clusters are. Without a cluster flag: one cluster, the kubeconfig's current
/// context (or the in-cluster service account).
#[derive(Args)]
pub(crate) struct ClusterArgs {
    /// Path to a kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// A kubeconfig context to serve, named after the context. Repeat it to serve several
    /// clusters from one process.
    #[arg(long, value_name = "NAME")]
    pub(crate) context: Vec<String>,
    /// Serve every context of the kubeconfig, each as its own cluster.
    #[arg(long)]
    pub(crate) all_contexts: bool,
    /// A kubeconfig file to serve as one more cluster (its current context), named NAME or
    /// after that context. Repeatable.
    #[arg(long, value_name = "[NAME=]FILE")]
    pub(crate) cluster_kubeconfig: Vec<String>,
    /// kcp: serve every logical cluster of this shard that has a ResourceQuota (wildcard
    /// watches; credentials from --kubeconfig/--context, which must allow wildcard list/watch
    /// on the shard). One lazyquota per shard.
    #[arg(
        long,
        env = "LAZYQUOTA_KCP_SHARD_URL",
        value_name = "URL",
        conflicts_with_all = ["all_contexts", "cluster_kubeconfig"]
    )]
    pub(crate) kcp_shard_url: Option<String>,
    /// kcp: the logical cluster holding the leader-election Lease and answering /metrics
    /// reviews.
    #[arg(long, value_name = "NAME", default_value = "root", requires = "kcp_shard_url")]
    pub(crate) kcp_home_cluster: String,
    /// kcp: from this many logical clusters watching a type for counts on, one shared wildcard
    /// metadata watch serves them all (0: never share). The default, 2, is where sharing stops
    /// costing lazyquota memory and starts saving the shard watches: at two workspaces per type
    /// the same heap as their own watches and half the watches on the shard
    /// (benches/results/kcp-threshold-89a5124/threshold.md); from 2.5 on less heap as well
    /// (benches/results/kcp-exact/kcp.md: 8.08 KiB per engaged workspace against 21.48).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub(crate) kcp_shared_watch_threshold: usize,
    /// Feature gates as KCM's flag of that name sets them (`Name=true,Name=false`), over the
    /// defaults of each cluster's Kubernetes release (read from its /version). Only the gates
    /// that change quota are known: InPlacePodVerticalScaling, PodLevelResources,
    /// InPlacePodLevelResourcesVerticalScaling, VolumeAttributesClass,
    /// DynamicResourceAllocation, DRAExtendedResource, DRANodeAllocatableResources.
    #[arg(long, value_name = "GATES", value_parser = parse_feature_gates, default_value = "")]
    pub(crate) feature_gates: FeatureGateOverrides,
}

/// `--feature-gates`, parsed (the names are checked against each cluster's release).
#[derive(Clone, Debug, Default)]
pub(crate) struct FeatureGateOverrides(pub(crate) Vec<(String, bool)>);

pub(crate) fn parse_feature_gates(text: &str) -> Result<FeatureGateOverrides, String> {
    lazyquota_quota::gates::parse_overrides(text)
        .map(FeatureGateOverrides)
        .map_err(|e| e.to_string())
}

impl ClusterArgs {
    /// Reads each endpoint's version and sets its gates: the release's defaults, then
    /// `--feature-gates`. An endpoint that cannot be reached keeps the newest defaults (with
    /// the flag) and a warning; `single` makes that an error instead.
    /// On kcp every logical cluster is of the shard's release: the first one is asked.
    pub(crate) async fn set_gates(&self, endpoints: &mut [Endpoint], single: bool) -> anyhow::Result<()> {
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

    pub(crate) fn source(&self) -> anyhow::Result<ClusterSource> {
        Ok(ClusterSource::from_flags(&ClusterFlags {
            kubeconfig: self.kubeconfig.as_deref(),
            contexts: &self.context,
            all_contexts: self.all_contexts,
            cluster_kubeconfigs: &self.cluster_kubeconfig,
        })?)
    }

    /// One client per cluster (HTTP/1.1, for the one-shot commands); with kcp, one per
    /// logical cluster that has a ResourceQuota.
    pub(crate) async fn endpoints(&self) -> anyhow::Result<Vec<Endpoint>> {
        if let Some(shard) = self.shard(Transport::Http1).await? {
            return Ok(shard.endpoints().await?);
        }
        Ok(self.source()?.connect(Transport::Http1).await?)
    }

    /// The kcp shard, when `--kcp-shard-url` is given.
    pub(crate) async fn shard(&self, transport: Transport) -> anyhow::Result<Option<Shard>> {
        let Some(url) = &self.kcp_shard_url else {
            return Ok(None);
        };
        if self.context.len() > 1 {
            anyhow::bail!("--kcp-shard-url serves one shard: give at most one --context (its credentials)");
        }
        let config = lazyquota_kube::transport::client::load_config(
            self.kubeconfig.as_deref(),
            self.context.first().map(String::as_str),
        )
        .await?;
        Ok(Some(Shard::new(config, url, transport)?))
    }
}

#[derive(Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,
    #[command(flatten)]
    pub(crate) watch: WatchArgs,
    /// Full recalculation of every quota (KCM: --resource-quota-sync-period). 0 disables.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub(crate) resync_period: Duration,
    /// Quotas computed and written at once (KCM: --concurrent-resource-quota-syncs).
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) concurrency: u16,
    /// Compute and report status.used (log lines and a metric per disagreeing key), never write.
    #[arg(long)]
    pub(crate) shadow: bool,
    /// Safety-net discovery poll; CRD and APIService changes trigger discovery at once.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub(crate) discovery_poll: Duration,
    /// kube-apiserver's --request-timeout: a quota charge of admission's that no stored object
    /// pays for is kept this long (its create failed after admission, or outlived its request).
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = parse_duration)]
    pub(crate) apiserver_request_timeout: Duration,
    /// Streaming lists (sendInitialEvents): off (paginated, consistent lists), probe the server
    /// once (auto), or force (on). Off by default: kube-runtime streams at resourceVersion 0,
    /// which a failing apiserver watch cache can answer with a stale empty list.
    #[arg(long, value_enum, default_value_t = StreamingLists::Off)]
    pub(crate) streaming_lists: StreamingLists,
    /// How to talk to the apiserver: HTTP/2 (watches multiplexed on one connection, another
    /// one opened per --http2-streams-per-connection open streams) or HTTP/1.1 (one connection
    /// per open watch).
    #[arg(long, value_enum, default_value_t = TransportArg::Http2)]
    pub(crate) transport: TransportArg,
    /// HTTP/2: streams opened on one connection before another is opened. Keep it below the
    /// server's limit (SETTINGS_MAX_CONCURRENT_STREAMS: 100 in a generic apiserver unless
    /// --http2-max-streams-per-connection says otherwise), else requests queue behind watches.
    #[arg(long, value_name = "N", default_value_t = lazyquota_kube::transport::spread::DEFAULT_STREAMS_PER_CONNECTION, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) http2_streams_per_connection: u16,
    /// Where to serve /metrics, /healthz and /readyz.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9090")]
    pub(crate) metrics_addr: SocketAddr,
    /// Who may read /metrics: anyone who reaches it (none), or a bearer token checked with
    /// TokenReview and SubjectAccessReview (get on the path /metrics), as KCM's secure port;
    /// delegated serves HTTPS. /healthz and /readyz stay open.
    #[arg(long, value_enum, default_value_t = MetricsAuth::None)]
    pub(crate) metrics_auth: MetricsAuth,
    /// Export each quota key's used, hard and used/hard as lazyquota_quota_used,
    /// lazyquota_quota_hard and lazyquota_quota_usage_ratio (labels cluster, namespace, quota,
    /// resource): three series per quota key (their memory per key:
    /// benches/results/quota-usage-cost.md).
    #[arg(long)]
    pub(crate) quota_usage_metrics: bool,
    /// With --quota-usage-metrics: at most this many quota keys are exported (the first in
    /// cluster, namespace, quota, key order); the rest are counted in
    /// lazyquota_quota_usage_series_dropped.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 2_000,
        requires = "quota_usage_metrics"
    )]
    pub(crate) quota_usage_metrics_max_series: usize,
    /// PEM certificate for HTTPS on --metrics-addr (default with delegated auth: self-signed).
    #[arg(long, value_name = "FILE", requires = "metrics_tls_key_file")]
    pub(crate) metrics_tls_cert_file: Option<PathBuf>,
    /// PEM private key of --metrics-tls-cert-file.
    #[arg(long, value_name = "FILE", requires = "metrics_tls_cert_file")]
    pub(crate) metrics_tls_key_file: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) leader: LeaderArgs,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// Keep the program's start-up code mapped (by default, once the quotas are listed, the
    /// executable's pages are dropped from lazyquota's page tables and only what runs faults
    /// back in; Linux only).
    #[arg(long)]
    pub(crate) keep_startup_pages: bool,
}

/// Leader election on a coordination.k8s.io Lease (KCM's --leader-elect-* flags).
#[derive(Args)]
#[allow(clippy::struct_field_names)] // the fields are the flags' names, which mirror KCM's
pub(crate) struct LeaderArgs {
    /// Run as one of several replicas: only the Lease holder computes and writes.
    #[arg(long)]
    pub(crate) leader_elect: bool,
    /// Namespace of the Lease (default: $POD_NAMESPACE, else "default").
    #[arg(long, env = "POD_NAMESPACE", value_name = "NS", default_value = "default")]
    pub(crate) leader_election_namespace: String,
    /// Name of the Lease.
    #[arg(long, value_name = "NAME", default_value = "lazyquota")]
    pub(crate) leader_election_lease_name: String,
    /// This replica's identity in the Lease (default: $POD_NAME, else the host name).
    #[arg(long, env = "POD_NAME", value_name = "ID")]
    pub(crate) leader_election_identity: Option<String>,
    /// How long a standby waits on an unchanged Lease before taking over.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    pub(crate) leader_election_lease_duration: Duration,
    /// How long the leader tries to renew before giving up leadership (and exiting).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub(crate) leader_election_renew_deadline: Duration,
    /// How often candidates retry and the leader renews.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub(crate) leader_election_retry_period: Duration,
}

/// What the watch planner takes from the command line: `run` and `explain` share these flags,
/// so `explain` answers for the `run` it is given.
#[derive(Args, Clone, Copy)]
pub(crate) struct WatchArgs {
    /// Which resource types are watched: only those some ResourceQuota constrains (lazy), or
    /// every quotable type, as upstream KCM does (eager; kept for comparison).
    #[arg(long, value_enum, default_value_t = ModeArg::Lazy)]
    pub(crate) mode: ModeArg,
    /// Above this many namespaces demanding a resource type, watch it cluster-wide (filtered at
    /// ingest) instead of with one watch per namespace.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub(crate) namespace_watch_threshold: usize,
}

impl WatchArgs {
    pub(crate) fn mode(self) -> Mode {
        match self.mode {
            ModeArg::Lazy => Mode::Lazy,
            ModeArg::Eager => Mode::Eager,
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum ModeArg {
    Lazy,
    Eager,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum MetricsAuth {
    None,
    Delegated,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum TransportArg {
    Http1,
    Http2,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum StreamingLists {
    Auto,
    On,
    Off,
}

/// Parses `90s`, `5m`, `1h`, `250ms` or a plain number of seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
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
pub(crate) enum LogFormat {
    Text,
    Json,
}
