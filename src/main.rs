//! The `lazyquota` binary: CLI and wiring. The work happens in the library crates.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use lazyquota_index::keys::ClusterName;
use lazyquota_kube::{
    controller::{Config, Controller, Mode},
    report,
};
use lazyquota_quota::FeatureGates;
use tracing::info;

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
    Run(RunArgs),
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
    /// The controller's --namespace-watch-threshold, to show each watch's scope.
    #[arg(long, value_name = "N", default_value_t = 8)]
    namespace_watch_threshold: usize,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Table,
    Json,
}

/// Where the cluster is.
#[derive(Args)]
struct ClusterArgs {
    /// Path to a kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: the current context).
    #[arg(long, value_name = "NAME")]
    context: Option<String>,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Which resource types are watched: only those some ResourceQuota constrains (lazy), or
    /// every quotable type, as upstream KCM does (eager; kept for comparison).
    #[arg(long, value_enum, default_value_t = ModeArg::Lazy)]
    mode: ModeArg,
    /// Full recalculation of every quota (KCM: --resource-quota-sync-period). 0 disables.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    resync_period: Duration,
    /// Quotas computed and written at once (KCM: --concurrent-resource-quota-syncs).
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// Compute and report status.used (log lines and a metric per disagreeing key), never write.
    #[arg(long)]
    shadow: bool,
    /// Above this many namespaces demanding a resource type, watch it cluster-wide (filtered at
    /// ingest) instead of with one watch per namespace.
    #[arg(long, value_name = "N", default_value_t = 8)]
    namespace_watch_threshold: usize,
    /// Safety-net discovery poll; CRD and APIService changes trigger discovery at once.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    discovery_poll: Duration,
    /// Streaming lists (sendInitialEvents): probe the server once (auto), or force.
    #[arg(long, value_enum, default_value_t = StreamingLists::Auto)]
    streaming_lists: StreamingLists,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ModeArg {
    Lazy,
    Eager,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
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
        Command::Run(args) => run(args).await,
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
        cluster: ClusterArgs { kubeconfig, context },
        mode,
        resync_period,
        concurrency,
        shadow,
        namespace_watch_threshold,
        discovery_poll,
        streaming_lists,
        log_format,
    } = args;
    init_tracing(log_format);
    let client = lazyquota_kube::client::connect(kubeconfig.as_deref(), context.as_deref()).await?;
    let version = client
        .apiserver_version()
        .await
        .context("cannot reach the kube-apiserver")?;
    info!(version = %version.git_version, "connected");

    let config = Config {
        cluster: ClusterName::new(context.as_deref().unwrap_or("default")),
        mode: match mode {
            ModeArg::Lazy => Mode::Lazy,
            ModeArg::Eager => Mode::Eager,
        },
        resync_period,
        concurrency: usize::from(concurrency),
        shadow,
        namespace_watch_threshold,
        discovery_poll,
        streaming_lists: match streaming_lists {
            StreamingLists::Auto => None,
            StreamingLists::On => Some(true),
            StreamingLists::Off => Some(false),
        },
        ..Config::default()
    };
    let (controller, _snapshots) = Controller::new(client, config);
    controller.run(shutdown_signal()).await?;
    info!("stopped");
    Ok(())
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
        cluster: ClusterArgs { kubeconfig, context },
        namespace,
        output,
    } = args;
    let client = lazyquota_kube::client::connect(kubeconfig.as_deref(), context.as_deref()).await?;
    let report = report::usage(&client, namespace.as_deref(), FeatureGates::default()).await?;
    if output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let mut rows = vec![
        ["NAMESPACE", "QUOTA", "KEY", "HARD", "USED", "STORED", ""]
            .map(String::from)
            .to_vec(),
    ];
    for quota in &report {
        for key in &quota.keys {
            rows.push(vec![
                quota.namespace.clone(),
                quota.name.clone(),
                key.key.clone(),
                key.hard.clone(),
                key.computed.clone().unwrap_or_else(|| "-".into()),
                key.stored.clone().unwrap_or_else(|| "-".into()),
                if key.differs {
                    "differs".into()
                } else {
                    String::new()
                },
            ]);
        }
    }
    print_table(&rows);
    Ok(())
}

async fn explain(args: ExplainArgs) -> anyhow::Result<()> {
    let ExplainArgs {
        cluster: ClusterArgs { kubeconfig, context },
        namespace_watch_threshold,
        output,
    } = args;
    let client = lazyquota_kube::client::connect(kubeconfig.as_deref(), context.as_deref()).await?;
    let report = report::explain(&client, namespace_watch_threshold, FeatureGates::default()).await?;
    if output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "cluster {}: {} resource type(s) demanded",
        report.cluster,
        report.resources.len()
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
    Ok(())
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
