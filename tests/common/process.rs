//! The real `lazyquota` binary as a child process, and a minimal HTTP client for its admin
//! server (tests need no HTTP client crate for this).

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use lazyquota_testenv::unique_name;

/// A `lazyquota run` process, killed when dropped.
pub struct Lazyquota {
    /// The process.
    pub child: Child,
    /// Its --metrics-addr port.
    pub port: u16,
    log: PathBuf,
}

impl Lazyquota {
    /// Starts `lazyquota run --kubeconfig <kubeconfig> <extra>` on a free metrics port.
    pub fn start(kubeconfig: &Path, extra: &[&str]) -> Self {
        Self::start_logging(kubeconfig, extra, "info")
    }

    /// `lazyquota run --kcp-shard-url <shard> <extra>` with the shard admin's credentials, as
    /// one process per shard is deployed.
    pub fn on_kcp_shard(shard: &lazyquota_testenv::kcp::KcpShard, extra: &[&str]) -> Self {
        Self::on_kcp_shard_logging(shard, extra, "info")
    }

    /// [`Lazyquota::on_kcp_shard`] with `RUST_LOG` set to `filter`.
    pub fn on_kcp_shard_logging(
        shard: &lazyquota_testenv::kcp::KcpShard,
        extra: &[&str],
        filter: &str,
    ) -> Self {
        let kubeconfig = std::env::temp_dir().join(format!("{}.kubeconfig", unique_name("shard")));
        shard.shard_kubeconfig(&kubeconfig).expect("kubeconfig");
        let mut args = vec!["--kcp-shard-url", shard.url()];
        args.extend_from_slice(extra);
        Self::start_logging(&kubeconfig, &args, filter)
    }

    /// [`Lazyquota::start`] with `RUST_LOG` set to `filter`.
    pub fn start_logging(kubeconfig: &Path, extra: &[&str], filter: &str) -> Self {
        let port = free_port();
        let log = std::env::temp_dir().join(format!("{}.log", unique_name("lazyquota")));
        let out = std::fs::File::create(&log).expect("log file");
        // LAZYQUOTA_TEST_BIN: a copy of the binary, so a long test loop is not disturbed by
        // a rebuild of the debug binary.
        let bin = std::env::var("LAZYQUOTA_TEST_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_lazyquota").to_owned());
        let child = Command::new(bin)
            .args([
                "run",
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--metrics-addr",
                &format!("127.0.0.1:{port}"),
            ])
            .args(extra)
            .env("RUST_LOG", filter)
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start lazyquota");
        Self { child, port, log }
    }

    /// GET on its admin server.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.port, path).await
    }

    /// `lazyquota_leader` as this process reports it.
    pub async fn leader(&self) -> Option<bool> {
        let (_, metrics) = self.get("/metrics").await?;
        let line = metrics.lines().find(|l| l.starts_with("lazyquota_leader "))?;
        Some(line.ends_with(" 1"))
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Lazyquota {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kills a helper process (Prometheus) when the test ends, however it ends.
pub struct Kill(pub Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free loopback port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A minimal HTTP/1.1 GET on loopback (the test needs no HTTP client crate for this).
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((status, body))
}
