//! The commit a benchmark measured, for its result file (also included by crates/index's
//! benchmarks, which need nothing else of `common`).

use std::process::Command;

/// The commit the benchmark ran on: `abc1234`, or `abc1234-dirty (modified: paths)` when
/// tracked files other than `benches/results/` differ from it (result files name it). Read at
/// the first call and repeated after: a benchmark that calls it as it starts names the tree it
/// was built from, not commits made while it ran (a seed-scale kcp run takes most of an hour).
pub fn commit() -> String {
    static AT_START: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    AT_START.get_or_init(read_commit).clone()
}

fn read_commit() -> String {
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
