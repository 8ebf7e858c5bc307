//! The controller under test as a child process: KCM or a lazyquota build, started with a
//! metrics port of its own and stopped at the end, also on failure.

use std::{
    path::Path,
    process::{Child, Stdio},
};

use kube::Client;

use crate::common::{
    self, controllers,
    readings::{metric, proc_status},
};
use crate::plan::Controller;

pub(crate) struct Process {
    pub(crate) child: Child,
    pub(crate) metrics_url: String,
    /// A kube-controller-manager (read as a Go program), else lazyquota.
    pub(crate) kcm: bool,
}

/// One process's figures, read at once.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Reading {
    /// Goroutines (KCM) or tokio alive tasks (lazyquota).
    pub(crate) tasks: f64,
    /// Go's heap in use (KCM) or jemalloc's allocated bytes (lazyquota).
    pub(crate) heap_bytes: f64,
    pub(crate) rss_bytes: f64,
    pub(crate) anon_bytes: f64,
}

impl Drop for Process {
    /// A failed measurement must not leave a controller running.
    fn drop(&mut self) {
        self.terminate();
    }
}

impl Process {
    /// GET `path` on the process's admin port (its serving certificate is self-signed).
    async fn get(&self, path: &str) -> Result<String, kube::Error> {
        let mut config = kube::Config::new(self.metrics_url.parse().expect("url"));
        config.accept_invalid_certs = true;
        let client = Client::try_from(config)?;
        let request = http::Request::get(path).body(Vec::new()).expect("request");
        client.request_text(request).await
    }

    pub(crate) async fn metrics(&self) -> String {
        self.get("/metrics").await.expect("metrics")
    }

    /// Whether the process answers `/healthz` with 200.
    pub(crate) async fn serving(&self) -> bool {
        self.get("/healthz").await.is_ok()
    }

    /// A KCM's Go heap collected now (its profiling endpoint's `gc=1`), so that its heap in use
    /// is its live heap plus what was allocated since, not whatever the last cycle left.
    pub(crate) async fn collect_garbage(&self) {
        self.get("/debug/pprof/heap?debug=1&gc=1")
            .await
            .expect("KCM's /debug/pprof/heap?gc=1");
    }

    /// Tasks and heap from the process's metrics, RSS from /proc.
    pub(crate) async fn reading(&self) -> Reading {
        let metrics = self.metrics().await;
        let (tasks, heap) = if self.kcm {
            ("go_goroutines", "go_memstats_heap_inuse_bytes")
        } else {
            (
                "lazyquota_tokio_alive_tasks",
                "lazyquota_jemalloc_allocated_bytes",
            )
        };
        let pid = self.child.id();
        Reading {
            tasks: metric(&metrics, tasks),
            heap_bytes: metric(&metrics, heap),
            rss_bytes: proc_status(pid, "VmRSS:"),
            anon_bytes: proc_status(pid, "RssAnon:"),
        }
    }

    pub(crate) fn stop(mut self) {
        self.terminate();
    }

    pub(crate) fn terminate(&mut self) {
        common::stop_child(&mut self.child);
    }
}

pub(crate) fn start(controller: Controller, kubeconfig: &Path, state: &Path) -> Process {
    let port = common::free_port();
    // A file name: a variant's label, never its path.
    let name: String = controller
        .name()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let log = std::fs::File::create(state.join(format!("logs/bench-{name}.log"))).expect("log");
    match controller {
        Controller::Kcm | Controller::KcmAll | Controller::KcmAllButQuota => {
            let child = controllers::kcm_command(
                state,
                &state.join("kcm.kubeconfig"),
                port,
                controller.kcm_controllers().expect("a KCM configuration"),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("kube-controller-manager");
            Process {
                child,
                metrics_url: format!("https://127.0.0.1:{port}"),
                kcm: true,
            }
        }
        Controller::Eager | Controller::Lazy | Controller::LazyHttp1 | Controller::LazyBinary(..) => {
            let mode = if controller == Controller::Eager {
                "eager"
            } else {
                "lazy"
            };
            let transport = if controller == Controller::LazyHttp1 {
                "http1"
            } else {
                "http2"
            };
            let binary = match controller {
                Controller::LazyBinary(_, path) => std::path::PathBuf::from(path),
                _ => common::lazyquota_binary(),
            };
            let child = controllers::lazyquota_command(&binary, kubeconfig, port)
                .args(["--mode", mode, "--transport", transport])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("lazyquota");
            Process {
                child,
                metrics_url: format!("http://127.0.0.1:{port}"),
                kcm: false,
            }
        }
    }
}
