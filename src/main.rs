//! The `lazyquota` binary: CLI and wiring. The work happens in the library crates.

mod cli;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod jemalloc;
#[cfg(target_os = "linux")]
mod pages;
#[cfg(test)]
mod readme_tables;
mod server;

use std::process::ExitCode;

use futures::future::{BoxFuture, FutureExt as _};

use anyhow::Context as _;
use clap::Parser as _;
use cli::{
    Cli, Command, ExplainArgs, LogFormat, MetricsAuth, Output, RunArgs, StreamingLists, TransportArg,
    UsageArgs,
};
use lazyquota_index::{keys::ClusterName, planner::PlanSettings};
use lazyquota_kube::{
    controller::{Config, Controller, SnapshotHandle},
    kcp::shard::Shard,
    operate::lease::{LeaseLock, Timing},
    operate::metrics::Metrics,
    operate::report,
    operate::source::Endpoint,
    transport::client::Transport,
};
use lazyquota_quota::FeatureGates;
use tokio::sync::watch;
use tracing::{Instrument as _, info, info_span, warn};

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
        apiserver_request_timeout,
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
        keep_startup_pages,
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
        charge_bound: apiserver_request_timeout,
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
            lazyquota_kube::operate::delegated::DelegatedAuth::new(endpoints[0].client.clone()),
        ));
    }
    let listener = tokio::net::TcpListener::bind(metrics_addr)
        .await
        .with_context(|| format!("cannot listen on --metrics-addr {metrics_addr}"))?;
    #[cfg(target_os = "linux")]
    let pages = (!keep_startup_pages).then(|| tokio::spawn(pages::release_when_ready(admin.clone())));
    #[cfg(not(target_os = "linux"))]
    let _ = keep_startup_pages;
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
    #[cfg(target_os = "linux")]
    if let Some(pages) = pages {
        pages.abort();
    }
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
