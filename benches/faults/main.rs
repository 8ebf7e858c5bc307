//! The fault benchmark: each fault once against KCM's quota controller and once against
//! lazyquota, each on a fresh control plane from tests/control-plane, the same script and
//! data for both (run.rs says what one run does; fault.rs, each fault).
//!
//! ```text
//! cargo bench --bench faults                         # every fault, a 60-s window (about 50 minutes)
//! cargo bench --bench faults -- --quick              # bounded (CI): F1, F4, F6, a 20-s window,
//!                                                    # 30 s after each fault, 15-s request timeout
//! cargo bench --bench faults -- --faults F2,F8 --controllers lazy --window 40 --out /tmp/f
//! ```
//!
//! Writes `faults.md` and `faults.tsv` (read by scripts/reliability.sh) into
//! `benches/results/faults/` (or `--out`; `--quick` writes into `target/faults-quick/`).
//! Exits non-zero when lazyquota left a new quota without a status 60 s (bounded: 30 s) after a
//! fault's end, let the namespace past `hard` (by an exact count), or did not converge within
//! the request timeout and 15 s (bounded: 10 s) after the writers stopped: behaviour, never a
//! time.

#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

#[path = "../common/mod.rs"]
mod common;
mod controller;
mod fault;
mod report;
mod run;

use std::{path::Path, time::Duration};

use kube::{
    Client,
    config::{KubeConfigOptions, Kubeconfig},
};
use lazyquota_kube::transport::client::{Pool, Transport};

use crate::controller::Who;
use crate::fault::Fault;
use crate::run::Timing;

struct Args {
    faults: Vec<Fault>,
    controllers: Vec<Who>,
    timing: Timing,
    out: String,
    quick: bool,
}

impl Args {
    fn parse() -> Self {
        let mut args = Self {
            faults: Fault::ALL.to_vec(),
            controllers: vec![Who::Kcm, Who::Lazy],
            timing: Timing {
                window: Duration::from_mins(1),
                after: Duration::from_mins(1),
                // kube-apiserver's default.
                request_timeout: Duration::from_mins(1),
                first_status: Duration::from_secs(20),
                margin: Duration::from_secs(15),
            },
            out: "benches/results/faults".into(),
            quick: false,
        };
        let mut given = std::env::args().skip(1).filter(|a| a != "--bench");
        let mut out = None;
        let mut window = None;
        let mut faults = None;
        while let Some(arg) = given.next() {
            let mut value = || {
                given
                    .next()
                    .unwrap_or_else(|| usage(&format!("{arg} needs a value")))
            };
            match arg.as_str() {
                "--quick" => args.quick = true,
                "--faults" => {
                    faults = Some(
                        value()
                            .split(',')
                            .map(|f| Fault::parse(f).unwrap_or_else(|| usage(&format!("no fault {f}"))))
                            .collect(),
                    );
                }
                "--controllers" => {
                    args.controllers = value()
                        .split(',')
                        .map(|c| Who::parse(c).unwrap_or_else(|| usage(&format!("no controller {c}"))))
                        .collect();
                }
                "--window" => {
                    let secs = value()
                        .parse()
                        .unwrap_or_else(|_| usage("--window takes seconds"));
                    window = Some(Duration::from_secs(secs));
                }
                "--out" => out = Some(value()),
                other => usage(&format!("unknown argument {other}")),
            }
        }
        if args.quick {
            // Within 5 minutes: three faults, shorter clocks, and a request timeout of 15 s on
            // both sides of the wire (the apiserver's and lazyquota's, kept equal).
            args.faults = vec![Fault::F1, Fault::F4, Fault::F6];
            args.timing = Timing {
                window: Duration::from_secs(20),
                after: Duration::from_secs(30),
                request_timeout: Duration::from_secs(15),
                first_status: Duration::from_secs(5),
                margin: Duration::from_secs(10),
            };
            args.out = "target/faults-quick".into();
        }
        args.faults = faults.unwrap_or(args.faults);
        args.timing.window = window.unwrap_or(args.timing.window);
        args.out = out.unwrap_or(args.out);
        args
    }
}

fn usage(message: &str) -> ! {
    eprintln!("error: {message}");
    eprintln!(
        "usage: cargo bench --bench faults -- [--quick] [--faults F1,F2,...] [--controllers kcm,lazy] [--window SECS] [--out DIR]"
    );
    std::process::exit(2);
}

fn main() {
    let args = Args::parse();
    // The tree this run measures, read before it starts (commits made meanwhile are not it).
    let _ = common::commit();
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join(&args.out);
    std::fs::create_dir_all(&out).expect("output directory");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut outcomes = Vec::new();
    for &fault in &args.faults {
        // Alternating which controller goes first, so neither always meets a colder machine.
        let mut order = args.controllers.clone();
        if outcomes.len() / args.controllers.len().max(1) % 2 == 1 {
            order.reverse();
        }
        for who in order {
            eprintln!("faults: {fault} against {who}: {}", fault.describe());
            let outcome = runtime.block_on(run::run(fault, who, args.timing));
            eprintln!("faults: {fault} against {who}: {outcome:?}");
            outcomes.push(outcome);
            // What is written so far survives a later run's failure.
            report::write(&out, &args, &outcomes);
        }
    }
    let failures = report::lazyquota_failures(&args, &outcomes);
    for failure in &failures {
        eprintln!("faults: FAILED: {failure}");
    }
    eprintln!("faults: wrote {}", out.join("faults.md").display());
    if !failures.is_empty() {
        std::process::exit(1);
    }
}

/// A client on lazyquota's transport (HTTP/2, no Nagle), as kubectl's would be.
async fn client(kubeconfig: &Path) -> Client {
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig).expect("kubeconfig"),
        &KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    Pool::new(&config, Transport::default())
        .and_then(|pool| pool.client(config))
        .expect("client")
}

/// Entries in the control plane's audit log so far (one a line).
fn audit_len(state: &Path) -> usize {
    std::fs::read_to_string(state.join("kube-apiserver.audit.log")).map_or(0, |t| t.lines().count())
}

/// Lists of a whole resource type (no namespace) by the controller, after the first `from`
/// entries of the audit log: its relists. A watch that sends its initial events (client-go's
/// WatchListClient) stands for a list and counts too.
fn relists(audit_log: &Path, from: usize, who: Who) -> u64 {
    let by_controller = |user: &str| match who {
        Who::Kcm => {
            user.starts_with("system:kube-controller-manager")
                || user.starts_with("system:serviceaccount:kube-system:")
        }
        // The harness uses the same identity, but lists no resource type in every namespace.
        Who::Lazy => user == "lazyquota-admin",
    };
    lazyquota_testenv::churn::audit_entries(audit_log)
        .iter()
        .skip(from)
        .filter(|e| by_controller(e["user"]["username"].as_str().unwrap_or_default()))
        .filter(|e| e["objectRef"]["namespace"].is_null())
        .filter(|e| {
            let uri = e["requestURI"].as_str().unwrap_or_default();
            (e["verb"] == "list" && e["stage"] == "ResponseComplete")
                || (e["verb"] == "watch"
                    && e["stage"] == "ResponseStarted"
                    && uri.contains("sendInitialEvents=true"))
        })
        .count() as u64
}

/// A counter's value as a whole number.
fn whole(value: f64) -> u64 {
    value.max(0.0).round() as u64
}
