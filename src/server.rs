//! The admin HTTP server: `/metrics`, `/healthz`, `/readyz` on `--metrics-addr`.
//!
//! One accept task plus one task per open connection (axum on hyper, HTTP/1.1 only).

use axum::{Router, extract::State, http::StatusCode, routing::get};
use lazyquota_kube::{controller::SnapshotHandle, metrics::Metrics};
use prometheus::IntGauge;
use tokio::sync::watch;

/// What the handlers read.
#[derive(Clone)]
pub struct Admin {
    /// The controller to snapshot, once it runs (a standby has none).
    pub controller: watch::Receiver<Option<SnapshotHandle>>,
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
        controller: watch::Receiver<Option<SnapshotHandle>>,
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
            controller,
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

async fn metrics(State(admin): State<Admin>) -> String {
    let handle = admin.controller.borrow().clone();
    if let Some(handle) = handle
        && let Some(snapshot) = handle.get().await
    {
        admin.metrics.observe(&snapshot);
    }
    admin.observe_process();
    admin.metrics.encode()
}

async fn readyz(State(admin): State<Admin>) -> (StatusCode, &'static str) {
    let handle = admin.controller.borrow().clone();
    match handle {
        Some(handle) => match handle.get().await {
            Some(s) if s.quotas_synced => (StatusCode::OK, "ok: leading, quotas listed\n"),
            Some(_) => (StatusCode::SERVICE_UNAVAILABLE, "not ready: listing quotas\n"),
            None => (StatusCode::SERVICE_UNAVAILABLE, "not ready: controller stopped\n"),
        },
        None if *admin.standby_ready.borrow() => (StatusCode::OK, "ok: standby\n"),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: waiting for the lease\n",
        ),
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
