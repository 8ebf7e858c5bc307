//! The `lazyquota` binary: CLI and wiring. The work happens in the library crates.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::{
    Api, ResourceExt as _,
    runtime::{WatchStreamExt as _, watcher},
};
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
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
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
            // One clear line: the error and its causes, no backtrace.
            eprintln!("lazyquota: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run(args).await,
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
        log_format,
    } = args;
    init_tracing(log_format);
    let client = lazyquota_kube::client::connect(kubeconfig.as_deref(), context.as_deref()).await?;
    let version = client
        .apiserver_version()
        .await
        .context("cannot reach the kube-apiserver")?;
    info!(version = %version.git_version, "connected");

    let quotas: Api<ResourceQuota> = Api::all(client);
    let mut events = watcher(quotas, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    loop {
        tokio::select! {
            quota = events.try_next() => {
                let Some(quota) = quota.context("watching ResourceQuotas")? else { break };
                let hard = quota.spec.as_ref().and_then(|s| s.hard.as_ref()).map(|h| h.keys().cloned().collect::<Vec<_>>());
                info!(namespace = quota.namespace().unwrap_or_default(), name = quota.name_any(), ?hard, "quota");
            }
            _ = tokio::signal::ctrl_c() => {
                info!("shutting down");
                break;
            }
        }
    }
    Ok(())
}
