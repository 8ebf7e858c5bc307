//! The admin HTTP server: `/metrics`, `/healthz`, `/readyz` on `--metrics-addr`.
//!
//! One accept task plus one task per open connection (axum on hyper, HTTP/1.1 only), at most
//! [`MAX_CONNECTIONS`] open at once, each closed when it sends no request headers for 10 s; a
//! scrape asks every controller for its state at once, each bounded by [`SNAPSHOT_TIMEOUT`]. With
//! `--metrics-auth delegated`, `/metrics` asks for a bearer token checked by TokenReview and
//! SubjectAccessReview, and the server speaks TLS (given files, or a self-signed certificate);
//! `/healthz` and `/readyz` stay open for kubelet probes, as KCM's always-allowed paths.

use std::sync::Arc;

use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode, header::AUTHORIZATION},
    response::{IntoResponse as _, Response},
    routing::get,
};
use lazyquota_kube::operate::delegated::{Decision, DelegatedAuth};
use lazyquota_kube::{
    controller::{Snapshot, SnapshotHandle},
    operate::metrics::Metrics,
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
    /// Delegated authentication and authorization for `/metrics`, if enabled.
    pub auth: Option<Arc<DelegatedAuth>>,
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
        use lazyquota_kube::operate::metrics::gauge;
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
            auth: None,
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

/// Open admin connections, at most (a scraper, probes and a few humans need far fewer).
pub const MAX_CONNECTIONS: usize = 64;

/// How long a scrape or probe waits for one controller's state (a controller busy that long
/// counts as not answering).
pub const SNAPSHOT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Every controller's snapshot, asked for all at once; `None` if one has stopped or does not
/// answer in time (with `skip_stopped`, those are left out instead: the others' gauges still
/// update).
async fn snapshots(admin: &Admin, skip_stopped: bool) -> Option<Vec<Snapshot>> {
    let handles = admin.controllers.borrow().clone();
    let answers = futures::future::join_all(handles.iter().map(|handle| async move {
        tokio::time::timeout(SNAPSHOT_TIMEOUT, handle.get())
            .await
            .ok()
            .flatten()
    }))
    .await;
    let mut all = Vec::with_capacity(answers.len());
    for answer in answers {
        match answer {
            Some(snapshot) => all.push(snapshot),
            None if skip_stopped => {}
            None => return None,
        }
    }
    Some(all)
}

/// With delegated auth on, the refusal of a request for `path` (None: allowed, or auth off).
async fn refused(admin: &Admin, headers: &HeaderMap, path: &str) -> Option<Response> {
    let auth = admin.auth.as_ref()?;
    let header = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok());
    match auth.check(header, path).await {
        Decision::Allowed => None,
        Decision::Unauthenticated => Some((StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response()),
        Decision::Forbidden(user) => {
            tracing::debug!(%user, path, "forbidden");
            let body = format!("forbidden: user {user:?} cannot get path \"{path}\"\n");
            Some((StatusCode::FORBIDDEN, body).into_response())
        }
        Decision::Unavailable => Some(
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "authentication or authorization unavailable\n",
            )
                .into_response(),
        ),
    }
}

async fn metrics(State(admin): State<Admin>, headers: HeaderMap) -> Response {
    if let Some(refusal) = refused(&admin, &headers, "/metrics").await {
        return refusal;
    }
    if let Some(all) = snapshots(&admin, true).await
        && !all.is_empty()
    {
        admin.metrics.observe_clusters(&all);
    }
    admin.observe_process();
    admin.metrics.encode().into_response()
}

/// What the running controllers watch and why (`lazyquota explain -o json`'s report, from the
/// running engine, with each type's open watches); `?cluster=NAME` for one served cluster.
/// Behind the same auth as /metrics: it names tenants' namespaces and quotas.
async fn debug_explain(State(admin): State<Admin>, headers: HeaderMap, uri: axum::http::Uri) -> Response {
    if let Some(refusal) = refused(&admin, &headers, "/debug/explain").await {
        return refusal;
    }
    let handles = admin.controllers.borrow().clone();
    let mut reports = Vec::new();
    for handle in handles {
        match tokio::time::timeout(SNAPSHOT_TIMEOUT, handle.explain()).await {
            Ok(Some(part)) => reports.extend(part),
            _ => {
                return (StatusCode::SERVICE_UNAVAILABLE, "a controller did not answer\n").into_response();
            }
        }
    }
    let cluster = uri
        .query()
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("cluster="));
    if let Some(cluster) = cluster {
        reports.retain(|r| r.cluster == cluster);
    }
    match serde_json::to_vec_pretty(&reports) {
        Ok(body) => ([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response(),
    }
}

async fn readyz(State(admin): State<Admin>) -> (StatusCode, String) {
    let (ready, why) = ready(&admin).await;
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, why)
}

/// Whether lazyquota is ready (`/readyz`), and why: leading with every served cluster's quotas
/// listed (or nothing to serve), or standing by with the apiserver and the Lease in reach.
pub async fn ready(admin: &Admin) -> (bool, String) {
    let serving = !admin.controllers.borrow().is_empty();
    if !serving && admin.metrics.leader.get() == 1 {
        // Leading with nothing to serve: a kcp shard without ResourceQuotas.
        return (true, "ok: leading, no cluster with quotas yet\n".into());
    }
    if !serving {
        return if *admin.standby_ready.borrow() {
            (true, "ok: standby\n".into())
        } else {
            (false, "not ready: waiting for the lease\n".into())
        };
    }
    match snapshots(admin, false).await {
        None => (false, "not ready: controller stopped\n".into()),
        Some(all) => {
            let listing: Vec<&str> = all
                .iter()
                .filter(|s| !s.quotas_synced)
                .map(|s| s.cluster.as_str())
                .collect();
            if listing.is_empty() {
                (true, "ok: leading, quotas listed\n".into())
            } else {
                (
                    false,
                    format!("not ready: listing quotas in cluster(s) {}\n", listing.join(", ")),
                )
            }
        }
    }
}

fn router(admin: Admin) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/debug/explain", get(debug_explain))
        .with_state(admin)
}

/// Serves on `listener` until `shutdown` completes: plain HTTP, or TLS with `tls`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    admin: Admin,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(admin);
    if let Ok(addr) = listener.local_addr() {
        let scheme = if tls.is_some() { "https" } else { "http" };
        tracing::info!(%addr, scheme, "serving /metrics, /healthz, /readyz");
    }
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // A free slot first: beyond MAX_CONNECTIONS, new connections wait in the backlog.
        let slot = tokio::select! {
            () = &mut shutdown => return Ok(()),
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        let accepted = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => accepted,
        };
        let Ok((tcp, _)) = accepted else {
            // Out of file descriptors, say: do not spin on it.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let _slot = slot;
            match acceptor {
                None => serve_connection(tcp, app).await,
                // A handshake gets 10 s.
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(tcp));
                    if let Ok(Ok(stream)) = handshake.await {
                        serve_connection(stream, app).await;
                    }
                }
            }
        });
    }
}

/// HTTP/1.1 on one connection; it is closed when it sends no request headers for 10 s (an
/// idle keep-alive connection, or a client that never finishes its headers).
async fn serve_connection<S>(stream: S, app: Router)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(app);
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(std::time::Duration::from_secs(10))
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
}

/// The TLS configuration of the admin server: the given PEM files, or a self-signed
/// certificate for `localhost` and the loopback addresses made now (as KCM does when no
/// certificate is given; scrapers then skip verification or pin it).
pub fn tls_config(
    files: Option<(&std::path::Path, &std::path::Path)>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use anyhow::Context as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
    let (certs, key) = if let Some((cert, key)) = files {
        let certs = CertificateDer::pem_file_iter(cert)
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .with_context(|| format!("cannot read --metrics-tls-cert-file {}", cert.display()))?;
        let key = PrivateKeyDer::from_pem_file(key)
            .with_context(|| format!("cannot read --metrics-tls-key-file {}", key.display()))?;
        (certs, key)
    } else {
        let names = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
        let made =
            rcgen::generate_simple_self_signed(names).context("cannot make a self-signed certificate")?;
        let key = PrivateKeyDer::try_from(made.signing_key.serialize_der())
            .map_err(|e| anyhow::anyhow!("self-signed key: {e}"))?;
        (vec![made.cert.der().clone()], key)
    };
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .context("the metrics TLS certificate and key do not match")?;
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    async fn healthz(addr: std::net::SocketAddr) -> std::io::Result<String> {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        Ok(answer)
    }

    /// Idle connections cannot starve the admin port for long: at most MAX_CONNECTIONS are
    /// served at once, and one that sends no request headers is closed after 10 s.
    #[tokio::test]
    async fn connections_are_capped_and_idle_ones_closed() {
        let (_tx, controllers) = watch::channel(Vec::new());
        let (_ready_tx, ready) = watch::channel(true);
        let admin = Admin::new(Metrics::new(), controllers, ready);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, admin, None, std::future::pending()));
        assert!(healthz(addr).await.unwrap().ends_with("ok\n"));
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let waiting = tokio::spawn(healthz(addr));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            !waiting.is_finished(),
            "no slot while {MAX_CONNECTIONS} connections are open"
        );
        let answer = tokio::time::timeout(Duration::from_secs(20), waiting)
            .await
            .expect("idle connections closed after 10 s free the slots")
            .unwrap()
            .unwrap();
        assert!(answer.ends_with("ok\n"), "{answer}");
        for mut stream in idle {
            let mut buf = [0_u8; 1];
            assert!(
                matches!(stream.read(&mut buf).await, Ok(0) | Err(_)),
                "closed by the server"
            );
        }
    }
}
