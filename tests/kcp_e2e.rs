//! kcp's own e2e quota tests (kcp v0.32.3's `test/e2e/quota`, built from the same source as
//! the shard by `tests/control-plane/kcp/build.sh quota-e2e`) against a **real kcp shard** with
//! kcp's quota controller off and lazyquota as the only writer of ResourceQuota status: every
//! test function must pass, as it does with kcp's own controller.
//!
//! For comparison, the same suite against kcp's own controller (no lazyquota):
//! `LAZYQUOTA_KCP_E2E_AGAINST=kcp cargo test --test kcp_e2e -- --nocapture`.

mod common;

use std::{
    fmt::Write as _,
    process::{Command, Stdio},
    time::Duration,
};

use common::process::Lazyquota;
use lazyquota_testenv::kcp::{KcpFlavor, KcpShard};

/// kcp v0.32.3's `test/e2e/quota/quota_test.go`: its test functions, all of which must pass.
const FUNCTIONS: [&str; 8] = [
    "TestKubeQuotaBuiltInCoreV1Types",
    "TestKubeQuotaCrossWorkspaceIsolation",
    "TestKubeQuotaNamespaceIsolation",
    "TestKubeQuotaCoreV1TypesFromBinding",
    "TestKubeQuotaNormalCRDs",
    "TestClusterScopedQuota",
    "TestKubeQuotaCRDChurn",
    "TestKubeQuotaQuotaLifecycle",
];

/// The whole suite's bound (its waits are 30 s each, workspaces' 120 s).
const SUITE_TIMEOUT: Duration = Duration::from_mins(15);

fn e2e_binary() -> std::path::PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/control-plane/kcp/build.sh");
    let out = Command::new("bash")
        .args([script, "quota-e2e"])
        .stderr(Stdio::inherit())
        .output()
        .expect("bash");
    assert!(out.status.success(), "building kcp's e2e quota tests failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout.lines().last().expect("the binary's path").into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcps_own_quota_e2e_suite_passes_with_lazyquota_as_the_only_writer() {
    let against_kcp = std::env::var("LAZYQUOTA_KCP_E2E_AGAINST").is_ok_and(|v| v == "kcp");
    let (shard, process) = if against_kcp {
        (KcpShard::get(KcpFlavor::OwnQuota), None)
    } else {
        let shard = KcpShard::get(KcpFlavor::LazyquotaOnly);
        // The reconciler's decisions at debug (discovery's changes, hundreds a run, not) and
        // the IO's trace (each status write sent and answered: a stall seen in CI wrote nothing
        // for 30 s, and without it the log cannot say whether a write was in flight): a
        // failure prints those of its workspaces.
        let filter = std::env::var("LAZYQUOTA_TEST_LOG").unwrap_or_else(|_| {
            "info,lazyquota_index::reconciler=debug,lazyquota_index::reconciler::discovery=info,lazyquota_kube::controller::trace=debug"
                .into()
        });
        (shard, Some(Lazyquota::on_kcp_shard_logging(shard, &[], &filter)))
    };
    let binary = e2e_binary();
    // The framework looks for kcp's source tree when it starts; an external server needs
    // none of it (the binary is built with -trimpath), any directory will do.
    let repo_dir = std::env::temp_dir();
    let kubeconfig = format!("--kcp-kubeconfig={}", shard.kubeconfig().display());
    let timeout = format!("{}s", SUITE_TIMEOUT.as_secs());
    let run = tokio::process::Command::new(&binary)
        .args([
            "-test.v",
            "-test.timeout",
            &timeout,
            "-test.parallel",
            "2",
            &kubeconfig,
        ])
        .env("KCP_REPO_DIR", &repo_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    // Its own -test.timeout ends it; this bounds a binary that would not stop.
    let out = tokio::time::timeout(SUITE_TIMEOUT + Duration::from_mins(1), run)
        .await
        .expect("the e2e suite ended within its bound")
        .expect("the e2e binary ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let passed: Vec<&str> = FUNCTIONS
        .iter()
        .copied()
        .filter(|f| {
            stdout.lines().any(|l| {
                l.trim_start() == format!("--- PASS: {f}").as_str()
                    || l.trim_start().starts_with(&format!("--- PASS: {f} ("))
            })
        })
        .collect();
    let failed: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("--- FAIL:"))
        .collect();
    let log = process.as_ref().map(Lazyquota::log).unwrap_or_default();
    let last = |text: &str, n: usize| {
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    };
    assert!(
        out.status.success() && failed.is_empty() && passed.len() == FUNCTIONS.len(),
        "kcp's e2e quota suite: {} of {} functions passed, failures: {failed:#?}\n--- the suite's last lines ---\n{}\n{}\n--- lazyquota's log (last lines) ---\n{}\n--- lazyquota's log of the failed tests' logical clusters ---\n{}",
        passed.len(),
        FUNCTIONS.len(),
        last(&stdout, 150),
        last(&String::from_utf8_lossy(&out.stderr), 30),
        last(&log, 80),
        failed_clusters_log(&stdout, &log),
    );
    println!(
        "kcp's e2e quota suite against {}: {} of {} test functions passed",
        if against_kcp {
            "kcp's own quota controller"
        } else {
            "lazyquota as the only writer"
        },
        passed.len(),
        FUNCTIONS.len()
    );
}

/// The logical clusters each test of `go test -v` output created (`... as /clusters/<name>`),
/// by test name: output of parallel tests is interleaved under `=== NAME` (`RUN`, `CONT`)
/// headers.
fn clusters_by_test(stdout: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut by_test: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
    let mut current = String::new();
    for line in stdout.lines() {
        let trimmed = line.trim_start();
        if let Some(rest) = ["=== RUN", "=== NAME", "=== CONT"]
            .iter()
            .find_map(|h| trimmed.strip_prefix(h))
        {
            rest.trim().clone_into(&mut current);
        } else if let Some((_, after)) = trimmed.split_once(" as /clusters/") {
            let name: String = after.chars().take_while(char::is_ascii_alphanumeric).collect();
            by_test.entry(current.clone()).or_default().push(name);
        }
    }
    by_test
}

/// lazyquota's log lines naming a logical cluster of a failed test (discovery's lines left
/// out), the last 200 per cluster: what the reconciler decided for the workspace that failed.
fn failed_clusters_log(stdout: &str, log: &str) -> String {
    let by_test = clusters_by_test(stdout);
    let mut out = String::new();
    for line in stdout.lines() {
        let Some(test) = line.trim_start().strip_prefix("--- FAIL: ") else {
            continue;
        };
        let test = test.split(' ').next().unwrap_or_default();
        for cluster in by_test.get(test).into_iter().flatten() {
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| l.contains(cluster.as_str()) && !l.contains("discovery change"))
                .collect();
            let shown = lines[lines.len().saturating_sub(200)..].join("\n");
            let _ = writeln!(out, "--- {test}: {cluster} ({} lines) ---\n{shown}", lines.len());
        }
    }
    out
}

#[test]
fn the_clusters_of_a_failed_test_are_found_in_interleaved_output() {
    let stdout = "=== RUN   TestA/tc3\n    x.go:1: Created root:universal workspace root:w:user as /clusters/abc123 on shard \"root\"\n=== NAME  TestA/tc4\n    x.go:1: Created root:universal workspace root:v:user as /clusters/def456 on shard \"root\"\n    --- FAIL: TestA/tc4 (1.00s)\n";
    let log = "a line about abc123\nwatch started def456|configmaps\ndiscovery change def456\n";
    let found = failed_clusters_log(stdout, log);
    assert!(found.contains("TestA/tc4: def456 (1 lines)"), "{found}");
    assert!(found.contains("watch started def456|configmaps"), "{found}");
    assert!(!found.contains("abc123"), "{found}");
}
