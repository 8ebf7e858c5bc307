//! The admin HTTP server: `/metrics`, `/healthz`, `/readyz` on `--metrics-addr`.
//!
//! One accept task plus one task per open connection (axum on hyper, HTTP/1.1 only).

use axum::{Router, extract::State, http::StatusCode, routing::get};
use lazyquota_kube::{
    controller::{Snapshot, SnapshotHandle},
    metrics::Metrics,
};
use prometheus::IntGauge;
use tokio::sync::watch;

/// What the handlers read.
#[derive(Clone)]
pub struct Admin {
    /// The controllers to snapshot, one per served cluster, once they run (a standby has
    /// none).
    pub controllers: watch::Receiver<Vec<SnapshotHandle>>,
    /// The metrics.
    pub metrics: Metrics,
    /// Whether a standby is ready: it can reach the apiserver and the Lease.
    pub standby_ready: watch::Receiver<bool>,
    process: ProcessGauges,
}

#[derive(Clone)]
struct ProcessGauges {
    tasks: IntGauge,
    rss: IntGauge,
    fds: IntGauge,
    threads: IntGauge,
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    heap: [IntGauge; 4],
}

impl Admin {
    /// Registers the process-level gauges (read at scrape time) next to `metrics`.
    pub fn new(
        metrics: Metrics,
        controllers: watch::Receiver<Vec<SnapshotHandle>>,
        standby_ready: watch::Receiver<bool>,
    ) -> Self {
        use lazyquota_kube::metrics::gauge;
        let r = metrics.registry();
        let process = ProcessGauges {
            tasks: gauge(
                r,
                "lazyquota_tokio_alive_tasks",
                "Tokio tasks alive (all roles, including connections).",
            ),
            rss: gauge(r, "lazyquota_process_resident_memory_bytes", "Resident set size."),
            fds: gauge(r, "lazyquota_process_open_fds", "Open file descriptors."),
            threads: gauge(r, "lazyquota_process_threads", "OS threads."),
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            heap: [
                gauge(
                    r,
                    "lazyquota_jemalloc_allocated_bytes",
                    "Bytes allocated by the application (jemalloc).",
                ),
                gauge(
                    r,
                    "lazyquota_jemalloc_active_bytes",
                    "Bytes in active pages (jemalloc).",
                ),
                gauge(
                    r,
                    "lazyquota_jemalloc_resident_bytes",
                    "Bytes in physically resident pages (jemalloc).",
                ),
                gauge(
                    r,
                    "lazyquota_jemalloc_retained_bytes",
                    "Bytes retained for reuse, not returned to the OS (jemalloc).",
                ),
            ],
        };
        Self {
            controllers,
            metrics,
            standby_ready,
            process,
        }
    }

    fn observe_process(&self) {
        let runtime = tokio::runtime::Handle::current().metrics();
        self.process
            .tasks
            .set(i64::try_from(runtime.num_alive_tasks()).unwrap_or(i64::MAX));
        if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
            for line in status.lines() {
                let value = |l: &str| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse::<i64>().ok())
                        .unwrap_or(0)
                };
                if line.starts_with("VmRSS:") {
                    self.process.rss.set(value(line) * 1024);
                } else if line.starts_with("Threads:") {
                    self.process.threads.set(value(line));
                }
            }
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            self.process
                .fds
                .set(i64::try_from(fds.count()).unwrap_or(i64::MAX));
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            use tikv_jemalloc_ctl::{epoch, stats};
            // Statistics are cached by jemalloc until the epoch advances.
            let _ = epoch::advance();
            let read = [
                stats::allocated::read(),
                stats::active::read(),
                stats::resident::read(),
                stats::retained::read(),
            ];
            for (gauge, value) in self.process.heap.iter().zip(read) {
                gauge.set(value.ok().and_then(|v| i64::try_from(v).ok()).unwrap_or(0));
            }
        }
    }
}

/// Every controller's snapshot; `None` if one has stopped.
async fn snapshots(admin: &Admin) -> Option<Vec<Snapshot>> {
    let handles = admin.controllers.borrow().clone();
    let mut all = Vec::with_capacity(handles.len());
    for handle in handles {
        all.push(handle.get().await?);
    }
    Some(all)
}

async fn metrics(State(admin): State<Admin>) -> String {
    if let Some(all) = snapshots(&admin).await
        && !all.is_empty()
    {
        admin.metrics.observe_clusters(&all);
    }
    admin.observe_process();
    admin.metrics.encode()
}

async fn readyz(State(admin): State<Admin>) -> (StatusCode, String) {
    let leading = !admin.controllers.borrow().is_empty();
    if !leading {
        return if *admin.standby_ready.borrow() {
            (StatusCode::OK, "ok: standby\n".into())
        } else {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: waiting for the lease\n".into(),
            )
        };
    }
    match snapshots(&admin).await {
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: controller stopped\n".into(),
        ),
        Some(all) => {
            let listing: Vec<&str> = all
                .iter()
                .filter(|s| !s.quotas_synced)
                .map(|s| s.cluster.as_str())
                .collect();
            if listing.is_empty() {
                (StatusCode::OK, "ok: leading, quotas listed\n".into())
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: listing quotas in cluster(s) {}\n", listing.join(", ")),
                )
            }
        }
    }
}

/// Serves on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    admin: Admin,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(admin);
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    }
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}
