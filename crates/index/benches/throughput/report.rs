//! The throughput benchmark's final pass: fixed batches of every case timed with `Instant`,
//! rendered as the summary table its result file holds.

use super::*;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

#[allow(clippy::cast_precision_loss)] // display only
fn per_second(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// A rate, rounded, with thousands separators.
fn thousands(n: f64) -> String {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // a rounded, positive rate
    support::thousands(n.round() as usize)
}

/// Times fixed batches of every case with `Instant` and renders the summary table.
pub(super) fn summary(fixture: &mut Fixture, cases: &[Case]) -> String {
    let mut rows = Vec::new();
    for case in cases {
        let times = (0..SUMMARY_PASSES)
            .map(|_| {
                let events = clone_events(&case.events);
                let start = Instant::now();
                black_box(apply_all(&mut fixture.engine, &fixture.partitions, events));
                start.elapsed()
            })
            .collect();
        let t = median(times);
        rows.push((case.name.to_owned(), case.events.len(), "events", t));
    }
    let t = median(
        (0..SUMMARY_PASSES)
            .map(|_| {
                let start = Instant::now();
                fixture.project(SUMMARY_PROJECTIONS);
                start.elapsed()
            })
            .collect(),
    );
    rows.push((
        "pod_projection (`from_pod`, not an engine event)".to_owned(),
        SUMMARY_PROJECTIONS,
        "pods",
        t,
    ));
    let t = median(
        (0..SUMMARY_PASSES)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..COMPUTES_PER_BATCH {
                    black_box(fixture.engine.compute(black_box(&fixture.compute_quota), now()));
                }
                start.elapsed()
            })
            .collect(),
    );

    let mut out = String::new();
    let _ = writeln!(out, "# Watch-event throughput\n");
    let _ = writeln!(
        out,
        "`cargo bench -p lazyquota-index --bench throughput`: one thread, {NAMESPACES} namespaces of"
    );
    let _ = writeln!(
        out,
        "{PODS_PER_NAMESPACE} synced pods and {WIDGETS_PER_NAMESPACE} count-only objects each.\n"
    );
    let _ = writeln!(out, "Measured at commit `{}`.\n", commit::commit());
    let _ = writeln!(out, "| case | batch | median batch time | per second |");
    let _ = writeln!(out, "| --- | ---: | ---: | ---: |");
    for (name, n, unit, t) in &rows {
        let _ = writeln!(
            out,
            "| {name} | {n} {unit} | {:.2} ms | **{} {unit}/s** |",
            t.as_secs_f64() * 1e3,
            thousands(per_second(*n, *t))
        );
    }
    let per_compute = t / u32::try_from(COMPUTES_PER_BATCH).expect("a small batch");
    let _ = writeln!(
        out,
        "| compute: one quota over {PODS_PER_NAMESPACE} pods | {COMPUTES_PER_BATCH} computes | {:.2} ms | \
         **{} computes/s** ({:.1} µs each; {} pods/s) |",
        t.as_secs_f64() * 1e3,
        thousands(per_second(COMPUTES_PER_BATCH, t)),
        per_compute.as_secs_f64() * 1e6,
        thousands(per_second(COMPUTES_PER_BATCH * PODS_PER_NAMESPACE, t)),
    );
    let _ = writeln!(
        out,
        "\nMeasured by a final pass after criterion's, with `std::time::Instant`: each batch timed \
         {SUMMARY_PASSES} times, the median reported (cloning the pre-built events is not timed). \
         Criterion's own estimates for the same cases are in its console output and \
         `target/criterion/`.\n"
    );
    let _ = writeln!(
        out,
        "- `pod_modify_resized`: every event is an Apply of an existing pod with a changed projection"
    );
    let _ = writeln!(
        out,
        "  (in-place resize), which the update filter passes (replenish)."
    );
    let _ = writeln!(
        out,
        "- `pod_modify_unchanged`: Apply of an existing pod with an equal projection (status-only update)."
    );
    let _ = writeln!(
        out,
        "- `pod_delete_readd`: Delete of a pod, then its re-add (each counted as one event)."
    );
    let _ = writeln!(
        out,
        "- `count_add_delete`: `Projected::Meta` adds of new objects, then their deletes."
    );
    let _ = writeln!(
        out,
        "- `count_modify`: `Projected::Meta` applies of existing objects."
    );
    let _ = writeln!(
        out,
        "- compute: `Engine::compute` of a quota with `pods`, `requests.cpu`, `limits.memory` over its namespace."
    );
    sizes::table(&mut out, &sizes::measure(&fixture.shapes));
    out
}
