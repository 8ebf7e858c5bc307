//! The side-by-side scale benchmark: on one real control plane and the same data, one after
//! another, (1) KCM running only its resource quota controller, (2) lazyquota --mode eager,
//! (3) lazyquota --mode lazy — at several numbers N of namespaced CRDs (standing for kcp
//! APIBindings), of which only K are constrained by a quota.
//!
//! ```text
//! cargo bench --bench scale                      # the full run (N = 0,100,400; minutes)
//! cargo bench --bench scale -- --quick           # bounded (CI: `cargo test --workspace --bench scale -- --quick`)
//! cargo bench --bench scale -- --crds 0,50 --pods 500 --out /tmp/x
//! cargo bench --bench scale -- --controllers kcm,lazy --lazy-binary lto=/path/to/lazyquota
//!                                                  # another build, side by side (benches/profile.sh)
//! cargo bench --bench scale -- --full-kcm        # against a KCM with every default controller
//!                                                  # (N = 0,100,200,400, 3 repeats; full_kcm.rs)
//! cargo bench --bench scale -- --full-kcm --quick  # bounded (CI)
//! ```
//!
//! Writes `scale.md` (tables), `scale.dat` and, with gnuplot installed, `scale.png` into
//! `benches/results/` (or `--out`); `--full-kcm` writes `full-kcm.md` into
//! `benches/results/full-kcm/` (or `--out`).

// A measurement harness: counts become f64 for reporting, and each measurement reads best
// as one sequence of steps.
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::type_complexity
)]

#[path = "../common/mod.rs"]
mod common;
mod data;
mod full_kcm;
mod measure;
mod plan;
mod process;
mod report;

use std::{collections::BTreeMap, path::Path, time::Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use lazyquota_kube::transport::client::{Pool, Transport};

use crate::data::Data;
use crate::full_kcm::FullResults;
use crate::measure::measure;
use crate::plan::{Args, Results};
use crate::report::write_results;

fn main() {
    let args = Args::parse();
    std::fs::create_dir_all(&args.out).expect("output directory");
    let (state, facts) = common::start_control_plane("bench");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (results, full) = runtime.block_on(run(&args, &state, &facts));
    common::stop_control_plane(&state);
    if args.full_kcm {
        full_kcm::write_results(&args, &full);
    } else {
        write_results(&args, &results);
    }
}

async fn run(args: &Args, state: &Path, facts: &BTreeMap<String, String>) -> (Results, FullResults) {
    let kubeconfig = state.join("admin.kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig).expect("kubeconfig"),
        &KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    // lazyquota's transport (HTTP/2, TCP_NODELAY), as kubectl's would be (client-go: HTTP/2,
    // Go's sockets without Nagle), not kube's default client (HTTP/1.1, Nagle on), whose
    // delayed small writes slowed every sample timed from a watch (`second-quota-64072df`), as
    // they did the kcp benchmark's (`kcp-latency-dd59adc`).
    let client = Pool::new(&config, Transport::default())
        .and_then(|pool| pool.client(config))
        .expect("client");
    let data = Data::create(&client, args).await;
    let mut results = Results::new();
    let mut full = FullResults::new();
    let mut crds_made = 0;
    for &n in &args.crds {
        let t = Instant::now();
        data.create_crds(&client, crds_made, n).await;
        data.grow_new_crds(&client, args, crds_made, n).await;
        crds_made = n;
        eprintln!(
            "scale: N={n}: {n} CRDs with {} objects each ready in {:?}",
            args.objects_per_crd,
            t.elapsed()
        );
        if args.full_kcm {
            full_kcm::measure_at(&client, args, &data, n, &kubeconfig, state, &mut full).await;
            continue;
        }
        // The order alternates per N (reversed at every other N), so neither side always runs
        // first on a fresh apiserver cache or last on a warm one.
        let mut order = args.controllers.clone();
        if args.crds.iter().position(|&x| x == n).unwrap_or(0) % 2 == 1 {
            order.reverse();
        }
        eprintln!(
            "scale: N={n}: order {:?}",
            order.iter().map(|c| c.name()).collect::<Vec<_>>()
        );
        for controller in order {
            let sample = measure(&client, args, &data, n, controller, &kubeconfig, facts, state).await;
            eprintln!("scale: N={n} {}: {sample:?}", controller.name());
            results.insert((n, controller.name()), sample);
        }
    }
    (results, full)
}
