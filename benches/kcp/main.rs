//! The kcp seed scenario: one kcp shard (v0.32.3, embedded etcd, loopback), W consumer
//! workspaces, E APIExports of one namespaced type each in P provider workspaces, every consumer
//! binding K of them (B = W × K APIBindings), a ResourceQuota on one bound type
//! (`count/widgets.<group>`) in 10% of the consumers, a few objects of every bound type in every
//! consumer. At B = 0, ≈B/2 and B (bindings added in steps on the same shard), on the same data,
//! one after another:
//!
//! 1. kcp with its own quota controller (`LAZYQUOTA_KCP_QUOTA=on`),
//! 2. kcp without it (the process restarted on the same etcd data, `LAZYQUOTA_KCP_KEEP_DATA=1`),
//! 3. kcp without it plus `lazyquota run --kcp-shard-url`.
//!
//! 1 − 2 is what kcp's quota controller costs inside kcp (goroutines, Go heap, RSS); 3 gives
//! lazyquota's own figures and what it costs the shard (its connections and watches). The
//! slopes between the steps are the marginal cost per APIBinding; at the last step lazyquota's
//! quotas are deleted in two steps for the marginal cost per quota'd (engaged) workspace, and
//! then an exact-heap series (`exact_series`: a second lazyquota with jemalloc's thread caches
//! off, engaged in 0, W/n, …, W workspaces) gives that cost exactly. Latencies: quota created
//! → status.used written (kcp's controller in 1, lazyquota in 3) and, for lazyquota, quota
//! deleted → workspace disengaged → its watches released.
//!
//! ```text
//! cargo bench --bench kcp                               # W=200, E=20, K=5 (≈17 min)
//! cargo bench --bench kcp -- --quick --out /tmp/kcp     # bounded, the last step read only
//!                                                       # (CI: `cargo test --workspace --bench kcp -- --quick`)
//! cargo bench --bench kcp -- --workspaces 100 --exports 20 --latency-only --out /tmp/kcp-latency
//!                                                       # the latency samples alone, at the last step
//!                                                       # (`--touch-types`: every sampled type listed
//!                                                       # once before the samples, in 1 and 3 alike)
//! cargo bench --bench kcp -- --workspaces 100 --exports 20 --latency-only --samples 0 --cost-runs 4 \
//!     --out /tmp/kcp-cost                               # kcp's quota controller's cost, 4 on/off pairs
//! cargo bench --bench kcp -- --workspaces 1000 --exports 50 --bindings-per-workspace 5 --settle 15 \
//!     --out benches/results/kcp-seed                    # the seed's scale (≈53 min)
//! cargo bench --bench kcp -- --shards 3                 # across 3 shards, W=300 (`sharded`)
//! cargo bench --bench kcp -- --shards 3 --quick         # bounded (CI)
//! ```
//!
//! Writes `kcp.md`, `kcp.dat`, `kcp.gp` and, with gnuplot installed, `kcp.png` into
//! `benches/results/kcp/` (or `--out`). The shard lives in `<repo>/.lazyquota/bench-kcp*` and
//! is stopped at the end, also on failure. Every wait is bounded: a quota that never gets its
//! status, a binding that never binds, a workspace that never gets Ready fails the run.

// A measurement harness: counts become f64 for reporting, and each measurement reads best
// as one sequence of steps.
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

#[path = "../common/mod.rs"]
mod common;
mod latency;
mod plan;
mod report;
mod run;
mod scenario;
mod shard;
mod sharded;

use std::{path::PathBuf, process::Command, time::Instant};

use crate::plan::{Args, repo};
use crate::run::run;

/// Stops the kcp of a state directory when the run ends, however it ends.
struct KcpGuard(PathBuf);

impl Drop for KcpGuard {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo().join("tests/control-plane/kcp/stop.sh"))
            .arg(&self.0)
            .status();
    }
}

fn main() {
    let args = Args::parse();
    // The tree this run measures: read now, not when the report is written.
    let _ = common::commit();
    std::fs::create_dir_all(&args.out).expect("output directory");
    let dir = repo()
        .join(".lazyquota")
        .join(match (args.shards > 0, args.quick) {
            (false, true) => "bench-kcp-quick",
            (false, false) => "bench-kcp",
            (true, true) => "bench-kcp-shards-quick",
            (true, false) => "bench-kcp-shards",
        });
    // The binary cargo built, copied: a rebuild in the shared target directory during the run
    // must not change the lazyquota that later configurations start.
    let bin = dir.with_extension("lazyquota");
    std::fs::create_dir_all(repo().join(".lazyquota")).expect("state directory");
    std::fs::copy(common::lazyquota_binary(), &bin).expect("copy the lazyquota binary");
    let guard = KcpGuard(dir.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let started = Instant::now();
    if args.shards > 0 {
        runtime.block_on(sharded::run(&args, &dir, &bin, started));
    } else {
        runtime.block_on(run(&args, &dir, &bin, started));
    }
    drop(guard);
    eprintln!("kcp: done in {:.1} min", started.elapsed().as_secs_f64() / 60.0);
}
