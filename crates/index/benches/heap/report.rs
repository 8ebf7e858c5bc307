//! The markdown report and where it is written.

use super::*;

#[allow(clippy::cast_precision_loss)] // display only
pub(crate) fn ratio(a: usize, b: usize) -> f64 {
    a as f64 / b as f64
}

pub(crate) use crate::support::thousands;

pub(crate) fn bytes(n: usize) -> String {
    format!("{} B ({:.1} MiB)", thousands(n), ratio(n, 1 << 20))
}

pub(crate) fn millis(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

pub(crate) fn verdict(value: usize, target: usize) -> String {
    if value <= target {
        format!("≤ {target} B: met")
    } else {
        format!("≤ {target} B: **missed**")
    }
}
pub(crate) fn report(cfg: &Config, pods: &Measured, claims: &Measured, counts: &Measured) -> String {
    let mut rows: Vec<(String, String, String, String)> = Vec::new();
    let mut row = |label: &str, f: &dyn Fn(&Measured) -> String| {
        rows.push((label.to_owned(), f(pods), f(claims), f(counts)));
    };
    row("objects / namespaces", &|m| {
        format!("{} / {}", thousands(m.objects), m.namespaces)
    });
    row(
        "heap before (scaffolding: typed pod templates, name buffer)",
        &|m| bytes(m.before.curr_bytes),
    );
    row(
        "heap after setup (engine, discovery, quotas, held partitions)",
        &|m| bytes(m.after_setup.curr_bytes),
    );
    row("heap after the objects", &|m| bytes(m.after.curr_bytes));
    row("heap growth", &|m| bytes(m.growth()));
    row("**bytes per object** (growth / objects)", &|m| {
        format!("**{} B**", m.per_object())
    });
    row("bytes per object, objects only (setup excluded)", &|m| {
        format!("{} B", m.objects_only_per_object())
    });
    row("heap blocks per object", &|m| {
        format!("{:.2}", m.blocks_per_object())
    });
    row("store's own estimate (`held_by_resource`) per object", &|m| {
        format!("{} B", m.store_estimate.1 / m.store_estimate.0.max(1))
    });
    row("target", &|m| {
        if std::ptr::eq(m, pods) {
            verdict(m.per_object(), POD_TARGET)
        } else if std::ptr::eq(m, counts) {
            verdict(m.per_object(), COUNT_TARGET)
        } else {
            "none set (measured)".to_owned()
        }
    });
    row("relist peak (old + new generation)", &|m| bytes(m.relist_peak()));
    row("relist peak / heap after the objects", &|m| {
        format!("{:.2}×", ratio(m.relist_peak(), m.after.curr_bytes))
    });
    row("heap after the relist", &|m| bytes(m.relisted.curr_bytes));
    row("compute every quota once (first pass)", &|m| {
        format!("{} ({} quotas)", millis(m.compute_first), m.quotas)
    });
    row("compute every quota once (median of 10 passes)", &|m| {
        millis(m.compute_median)
    });

    let mut out = String::new();
    let _ = writeln!(out, "# Heap per watched object\n");
    let _ = writeln!(out, "Measured at commit `{}`.\n", commit::commit());
    let _ = writeln!(
        out,
        "`{}cargo bench -p lazyquota-index --bench heap` ({} objects per case, spread over {} namespaces){}.\n",
        if cfg.objects == DEFAULT_OBJECTS {
            String::new()
        } else {
            format!("LAZYQUOTA_BENCH_OBJECTS={} ", cfg.objects)
        },
        thousands(cfg.objects),
        cfg.namespaces,
        // Bytes do not depend on the profile; compute times do.
        if cfg!(debug_assertions) {
            "; a test-profile build (`cargo test --bench heap`): its compute times are not a release build's"
        } else {
            ""
        },
    );
    let _ = writeln!(
        out,
        "| | pods (`StoreKind::Pods`) | resource claims (`StoreKind::Claims`) | count-only (`StoreKind::Counts`) |"
    );
    let _ = writeln!(out, "| --- | ---: | ---: | ---: |");
    for (label, a, b, c) in &rows {
        let _ = writeln!(out, "| {label} | {a} | {b} | {c} |");
    }
    let _ = writeln!(
        out,
        "\n- Pods: realistic running Burstable pods (2 containers with cpu/memory requests and limits, \
         a priority class out of 3, container statuses with allocated and actuated resources), each \
         projected with `PodProjection::from_pod` (one shared `Interner`), stored with `relist_apply`; \
         quotas demand `pods`, `requests.cpu`, `limits.memory`. `size_of::<PodProjection>()` = {} B, \
         a table slot (`(u64, PodProjection)`) = {} B.",
        size_of::<PodProjection>(),
        size_of::<(u64, PodProjection)>(),
    );
    let _ = writeln!(
        out,
        "- Resource claims: DRA claims for one device of class `gpu`, every third a `firstAvailable` \
         choice of two `gpu` or one `gpu-small` (charged its worst case per class), each projected with \
         `ClaimProjection::from_claim` (class names interned), under a quota of \
         `count/resourceclaims.resource.k8s.io` and `{GPU_DEVICES_KEY}` per namespace. \
         `size_of::<ClaimProjection>()` = {} B, a table slot = {} B.",
        size_of::<ClaimProjection>(),
        size_of::<(u64, ClaimProjection)>(),
    );
    let _ = writeln!(
        out,
        "- Count-only: `Projected::Meta` objects under a `{WIDGETS_COUNT_KEY}` quota per namespace; a \
         table slot (`(u64, ())`) = {} B plus one control byte.",
        size_of::<(u64, ())>(),
    );
    let _ = writeln!(
        out,
        "- Bytes are dhat's live heap bytes (requested sizes: the allocator's own per-block overhead is \
         not included), counted from a profiler started at the beginning of each case. Growth includes everything the engine keeps: projections and their heap, \
         interned strings, hash tables at their real capacity, quotas, discovery and partition keys. \
         The typed pods themselves are transient and not kept.",
    );
    let _ = writeln!(
        out,
        "- The initial list and the relist are an eager watch's: `begin_relist` of every held \
         partition, `relist_apply` of every object, `finish_relist` of every partition; the relist \
         peak is dhat's global maximum after it.",
    );
    let _ = writeln!(
        out,
        "- Compute times are measured after the profiler has stopped (`Engine::compute` of every \
         quota, one thread); the first pass's results are checked (`pods` / `{WIDGETS_COUNT_KEY}` = \
         the objects in the namespace).",
    );
    out
}

pub(crate) fn results_path(cfg: &Config) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/results");
    let file = if cfg.objects == DEFAULT_OBJECTS {
        "heap.md".to_owned()
    } else {
        format!("heap-{}.md", cfg.objects)
    };
    dir.join(file)
}
