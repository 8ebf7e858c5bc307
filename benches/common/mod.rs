//! Shared by the control-plane benchmarks: one control plane of their own, started and stopped
//! with the test scripts.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

/// Starts a control plane (KCM's quota controller off) in `<repo>/.lazyquota/<name>` and
/// returns its state directory and the facts `start.sh` recorded.
///
/// # Panics
/// If it does not start: a benchmark cannot run without it.
pub fn start_control_plane(name: &str) -> (PathBuf, BTreeMap<String, String>) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let state = repo.join(".lazyquota").join(name);
    eprintln!("{name}: starting the control plane in {}", state.display());
    let status = Command::new("bash")
        .arg(repo.join("tests/control-plane/start.sh"))
        .env("LAZYQUOTA_CP_DIR", &state)
        .env("LAZYQUOTA_KCM_QUOTA", "off")
        .stdout(Stdio::null())
        .status()
        .expect("start.sh");
    assert!(status.success(), "the control plane did not start");
    let facts = std::fs::read_to_string(state.join("env"))
        .expect("facts")
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    (state, facts)
}

/// Stops what [`start_control_plane`] started.
pub fn stop_control_plane(state: &Path) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let _ = Command::new("bash")
        .arg(repo.join("tests/control-plane/stop.sh"))
        .arg(state)
        .status();
}

/// The commit the benchmark ran on: `abc1234`, or `abc1234-dirty (modified: paths)` when
/// tracked files other than `benches/results/` differ from it (result files name it).
pub fn commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim_end().to_owned())
            .unwrap_or_default()
    };
    let head = git(&["rev-parse", "--short", "HEAD"]);
    // Result files are what a benchmark writes, not what it measures: a tracked one rewritten
    // during the run would otherwise mark every re-run dirty.
    let dirty = git(&[
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ":(top)",
        ":(top,exclude)benches/results",
    ]);
    if dirty.is_empty() {
        head
    } else {
        let paths: Vec<&str> = dirty.lines().map(|l| l.get(3..).unwrap_or(l)).collect();
        format!("{head}-dirty (modified: {})", paths.join(", "))
    }
}
