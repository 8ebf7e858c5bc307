//! `Engine::compute` of one quota over namespaces of growing size: the quota's typed keys are
//! read from the partition's tally, so the time should not grow with the pods; beside it, the
//! same pods summed one by one (`calculate_usage`, what every computation did before the
//! tally, and what upstream's `syncResourceQuota` does).

use super::*;

use lazyquota_quota::{QuotaScopes, calculate_usage};

/// Pods per namespace measured.
pub(super) const SIZES: [usize; 3] = [100, 1_000, 10_000];

/// Full sums per timed batch (each of 10,000 pods takes tens of milliseconds).
const SUMS_PER_BATCH: u32 = 10;

/// One size's medians: a compute from the tally, and the full sum of the same keys; and the
/// bytes the partition's tally holds.
pub(super) struct Sized {
    pub pods: usize,
    pub compute: Duration,
    pub summed: Duration,
    pub tally_bytes: usize,
}

fn median_of(mut run: impl FnMut() -> Duration) -> Duration {
    let mut samples: Vec<Duration> = (0..SUMMARY_PASSES).map(|_| run()).collect();
    samples.sort_unstable();
    samples[samples.len() / 2]
}

/// Times one quota's compute (and the full sum) at each of [`SIZES`], per compute.
pub(super) fn measure(shapes: &[(Pod, Pod)]) -> Vec<Sized> {
    SIZES
        .iter()
        .map(|&n| {
            let cluster = ClusterName::new("sizes");
            let mut engine = Engine::new(FeatureGates::default());
            engine.discovered(&cluster, vec![served(GroupResource::core("pods"), "Pod")], &[]);
            let hard = [
                ("pods", "50000"),
                ("requests.cpu", "50000"),
                ("limits.memory", "200Ti"),
            ];
            let key = QuotaKey::new(&cluster, "big", "compute");
            let update = engine.apply_quota(key.clone(), &quota("big", "compute", &hard));
            let held = support::hold_demanded(&mut engine, update.changes);
            let [(kind, p)] = held.as_slice() else {
                panic!("the quota demands one partition: {held:?}")
            };
            let (kind, p) = (*kind, p.clone());
            let interner = Interner::new();
            let projections: Vec<PodProjection> = shapes
                .iter()
                .map(|(pod, _)| {
                    PodProjection::from_pod(pod, engine.gates(), &interner)
                        .strict()
                        .expect("valid")
                })
                .collect();
            engine.begin_relist(kind, &p);
            let mut stored = Vec::with_capacity(n);
            for i in 0..n {
                let projection = projections[i % projections.len()].clone();
                let id = object_id(&format!("big-{n}-{i:06}"));
                engine.relist_apply(kind, &p, id, Projected::Pod(projection.clone()));
                stored.push(projection);
            }
            engine.finish_relist(kind, &p);
            let used = engine.compute(&key, now()).expect("known").decision.used;
            assert!(
                used.get("pods")
                    .is_some_and(|v| same_value(v, &K8sQuantity(n.to_string())))
            );
            let computes = u32::try_from(COMPUTES_PER_BATCH).expect("small");
            let compute = median_of(|| {
                let start = Instant::now();
                for _ in 0..COMPUTES_PER_BATCH {
                    black_box(engine.compute(black_box(&key), now()));
                }
                start.elapsed() / computes
            });
            let keys = ["pods", "requests.cpu", "limits.memory"];
            let summed = median_of(|| {
                let start = Instant::now();
                for _ in 0..SUMS_PER_BATCH {
                    black_box(calculate_usage(
                        &keys,
                        &QuotaScopes::none(),
                        stored.iter(),
                        now(),
                        engine.gates(),
                    ));
                }
                start.elapsed() / SUMS_PER_BATCH
            });
            Sized {
                pods: n,
                compute,
                summed,
                tally_bytes: engine.tally_bytes(),
            }
        })
        .collect()
}

/// The table of [`measure`]'s results.
pub(super) fn table(out: &mut String, sized: &[Sized]) {
    let _ = writeln!(out, "\n## One quota's compute by namespace size\n");
    let _ = writeln!(
        out,
        "`Engine::compute` of a quota (`pods`, `requests.cpu`, `limits.memory`) in a namespace of N pods \
         (the same shapes as above), its typed keys read from the partition's tally; beside it the same \
         keys summed over the N pods one by one (`calculate_usage`: every compute before the tally, and \
         upstream's sync; median of {SUMMARY_PASSES} batches of {COMPUTES_PER_BATCH} computes and of \
         {SUMS_PER_BATCH} sums, per compute). The tally's bytes: the partition's `UsageTally` \
         (these pods are of three priority classes, so three scope classes).\n"
    );
    let _ = writeln!(
        out,
        "| pods in the namespace | compute | against 100 pods | pods summed one by one | tally bytes |"
    );
    let _ = writeln!(out, "| ---: | ---: | ---: | ---: | ---: |");
    let base = sized.first().map_or(Duration::ZERO, |s| s.compute);
    for s in sized {
        let _ = writeln!(
            out,
            "| {} | {:.1} µs | {:.2}× | {:.1} µs | {} |",
            support::thousands(s.pods),
            s.compute.as_secs_f64() * 1e6,
            s.compute.as_secs_f64() / base.as_secs_f64(),
            s.summed.as_secs_f64() * 1e6,
            s.tally_bytes,
        );
    }
}
