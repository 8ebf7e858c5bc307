//! The command lines of the controllers the benchmarks compare: kube-controller-manager
//! running only the controllers asked for, and a lazyquota binary. Callers add their own
//! flags, standard streams and environment.

use std::{path::Path, process::Command};

/// KCM from the control plane's build (`LAZYQUOTA_CP_BIN` in `state/env`), running
/// `controllers` only, serving `/metrics` and pprof on `127.0.0.1:port` to anyone, with
/// `kubeconfig` for its requests (the control plane's `kcm.kubeconfig`, or a copy pointing
/// elsewhere) and leader election off.
///
/// # Panics
/// If the control plane's facts do not name its binaries.
pub fn kcm_command(state: &Path, kubeconfig: &Path, port: u16, controllers: &str) -> Command {
    let bin = std::fs::read_to_string(state.join("env"))
        .expect("the control plane's facts")
        .lines()
        .find_map(|l| l.strip_prefix("LAZYQUOTA_CP_BIN=").map(str::to_owned))
        .expect("bin dir");
    // Its own identity for serving: the control plane's, whatever `kubeconfig` points at.
    let own = state.join("kcm.kubeconfig");
    let pki = state.join("pki");
    let mut command = Command::new(format!("{bin}/kube-controller-manager"));
    command
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(["--authentication-kubeconfig", own.to_str().unwrap()])
        .args(["--authorization-kubeconfig", own.to_str().unwrap()])
        .args([
            "--authorization-always-allow-paths",
            "/healthz,/readyz,/livez,/metrics,/debug/pprof/*",
        ])
        .args(["--bind-address", "127.0.0.1", "--secure-port", &port.to_string()])
        .args([
            "--controllers",
            controllers,
            "--use-service-account-credentials=true",
        ])
        // As the control plane's own KCM: every default controller includes the
        // service-account token controller, which needs the key.
        .args([
            "--service-account-private-key-file",
            pki.join("sa.key").to_str().unwrap(),
        ])
        // client-go's default (QPS 20, burst 30) would throttle KCM's lists and writes while
        // lazyquota has no client-side limiter; lift it so the two compare fairly.
        .args(["--kube-api-qps", "1000", "--kube-api-burst", "2000"])
        .args(["--root-ca-file", pki.join("ca.crt").to_str().unwrap()])
        .arg("--leader-elect=false");
    command
}

/// `lazyquota run` of `binary` against `kubeconfig`, serving `/metrics` on `127.0.0.1:port`,
/// logging at `LAZYQUOTA_BENCH_LOG` (default `warn`; `debug`, say, to read the decisions
/// behind a figure).
pub fn lazyquota_command(binary: &Path, kubeconfig: &Path, port: u16) -> Command {
    let mut command = Command::new(binary);
    command
        .args(["run", "--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .env(
            "RUST_LOG",
            std::env::var("LAZYQUOTA_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        );
    command
}
