//! Shared by the control-plane benchmarks: one control plane of their own, started and stopped
//! with the test scripts.

// Each benchmark uses part of it.
#![allow(dead_code)]

pub mod readings;
pub mod stats;

mod commit;
pub use commit::commit;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
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

/// The lazyquota binary a benchmark runs: `LAZYQUOTA_BIN` when set (CI points it at the release
/// build while the harness itself is built with the cheaper test profile), else the one cargo
/// built beside this benchmark with the same profile (`cargo bench`: the release settings).
pub fn lazyquota_binary() -> PathBuf {
    // `option_env!`: the heap benchmark of crates/index includes this module too, and cargo
    // defines the variable only for the root package's benchmarks.
    if let Some(path) = std::env::var_os("LAZYQUOTA_BIN") {
        return PathBuf::from(path);
    }
    match option_env!("CARGO_BIN_EXE_lazyquota") {
        Some(path) => PathBuf::from(path),
        None => {
            panic!("no lazyquota binary: set LAZYQUOTA_BIN (this benchmark is not the lazyquota package's)")
        }
    }
}

/// One sentence for a result file: which lazyquota binary was measured and how it was built.
/// A debug build's memory and latency are not lazyquota's: the sentence says so.
pub fn binary_note() -> String {
    let harness = if cfg!(debug_assertions) {
        "the harness is a test-profile build"
    } else {
        "the harness is a bench-profile build"
    };
    match std::env::var_os("LAZYQUOTA_BIN") {
        Some(path) => format!(
            "lazyquota: `{}` (`LAZYQUOTA_BIN`); {harness}",
            Path::new(&path).display()
        ),
        None if cfg!(debug_assertions) => format!(
            "lazyquota: a **debug build** (`CARGO_BIN_EXE_lazyquota` of the test profile) — its memory and \
             latency figures are not a release build's; {harness}"
        ),
        None => format!(
            "lazyquota: the bench profile's build of the working tree (`CARGO_BIN_EXE_lazyquota`, the \
             release settings); {harness}"
        ),
    }
}

/// Stops a child the benchmark started: SIGTERM, up to 10 s for it to exit, then SIGKILL. A
/// failed measurement must not leave a controller running.
pub fn stop_child(child: &mut Child) {
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    for _ in 0..100 {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}
