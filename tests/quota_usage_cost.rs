//! What the opt-in per-quota gauges (`--quota-usage-metrics`) cost in lazyquota's own memory,
//! measured with jemalloc's allocated bytes: 10,000 quota keys exported (three series each)
//! and the snapshot rows they are made from. `--nocapture` prints the figure the README cites.
#![cfg(all(target_os = "linux", target_env = "gnu"))]

use lazyquota_kube::{
    controller::{QuotaKeyUsage, Snapshot},
    operate::metrics::Metrics,
};
use tikv_jemalloc_ctl::{epoch, stats};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn allocated() -> f64 {
    epoch::advance().expect("jemalloc epoch");
    #[allow(clippy::cast_precision_loss)] // a byte count as a float, for a ratio
    let bytes = stats::allocated::read().expect("jemalloc stats") as f64;
    bytes
}

#[test]
fn per_quota_gauges_cost_under_four_kib_per_key() {
    const KEYS: usize = 10_000;
    let metrics = Metrics::new();
    let before = allocated();
    let snapshot = Snapshot {
        quota_usage: (0..KEYS)
            .map(|i| QuotaKeyUsage {
                cluster: "default".into(),
                namespace: format!("team-{:04}", i / 5),
                quota: "compute".into(),
                resource: [
                    "requests.cpu",
                    "requests.memory",
                    "pods",
                    "count/configmaps",
                    "limits.cpu",
                ][i % 5]
                    .into(),
                used: Some(1.0),
                hard: 10.0,
            })
            .collect(),
        ..Snapshot::default()
    };
    let with_rows = allocated();
    metrics.observe(&snapshot);
    let with_series = allocated();
    #[allow(clippy::cast_precision_loss)]
    let keys = KEYS as f64;
    let rows = (with_rows - before) / keys;
    let series = (with_series - with_rows) / keys;
    println!(
        "per quota key: snapshot row {rows:.0} B, three gauge series {series:.0} B, total {:.0} B",
        rows + series
    );
    // Measured here: 166 B + 2,256 B (the prometheus crate keeps ~750 B per labelled series).
    assert!(rows + series < 4096.0, "{rows} + {series} bytes per key");
    let exported = metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with("lazyquota_quota_used{"))
        .count();
    assert_eq!(exported, KEYS, "every key exported");
}
