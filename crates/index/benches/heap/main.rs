//! Heap held per watched object, measured with dhat through the [`Engine`] exactly as the
//! controller drives it: discovery, one quota per namespace, the partitions its demand changes
//! ask for held, then an eager watch's initial list (`begin_relist` of every held partition,
//! `relist_apply` of every object, `finish_relist` of every partition).
//!
//! - (a) pods, each projected from a realistic typed pod with [`PodProjection::from_pod`]
//!   (one shared [`Interner`], as the controller has), into [`StoreKind::Pods`], under quotas
//!   demanding `pods`, `requests.cpu` and `limits.memory`;
//! - (b) DRA resource claims, each projected with [`ClaimProjection::from_claim`], into
//!   [`StoreKind::Claims`], under quotas of `count/resourceclaims.resource.k8s.io` and
//!   `gpu.deviceclass.resource.k8s.io/devices`;
//! - (c) count-only objects ([`Projected::Meta`]) into [`StoreKind::Counts`], under
//!   `count/widgets.example.io` quotas.
//!
//! Reported per case: heap before and after, bytes per object (all heap growth, setup
//! included, divided by the objects), the peak during a full relist (old and new generation
//! side by side), and the time to compute every quota once (measured with the profiler
//! stopped). Printed as a markdown table and written to `benches/results/heap.md` at the
//! repository root. The targets (≤ 256 B per pod, ≤ 64 B per count-only object) are
//! reported, not asserted.
//!
//! `LAZYQUOTA_BENCH_OBJECTS` sets the objects per case (default 100000, spread over at most
//! 100 namespaces); a run with another count writes `heap-<count>.md` instead, so a CI-sized
//! run (`LAZYQUOTA_BENCH_OBJECTS=10000`) leaves the reference results alone. Run without
//! `--bench` (`cargo test --benches`) it is a smoke test: 1000 objects, nothing written.

use std::{
    fmt::Write as _,
    hint::black_box,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use dhat::HeapStats;
use k8s_openapi::{
    api::{core::v1::Pod, resource::v1::ResourceClaim},
    apimachinery::pkg::api::resource::Quantity as K8sQuantity,
};
use lazyquota_index::{
    discoveries::Discoveries,
    engine::{Engine, Projected, StoreKind, same_value},
    fanout::{Fanout, Sink, WatchItem},
    keys::{ClusterName, GroupResource, ObjectIds, QuotaKey},
    membership::Membership,
    planner::{Mode, PlanSettings},
    reconciler::Share,
    resolver::ServedResource,
    sharing::Demand,
    store::PartitionKey,
    watches::{Action, Watches},
};
use lazyquota_quota::{ClaimProjection, FeatureGates, Interner, PodProjection, Time};
use serde_json::json;

/// Store ids as the controller makes them (keyed, one key per process).
fn object_id(name: &str) -> u64 {
    static IDS: std::sync::LazyLock<ObjectIds> = std::sync::LazyLock::new(ObjectIds::default);
    IDS.id(name)
}

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

#[path = "../support/mod.rs"]
mod support;

mod cases;
mod engaged;
mod report;

use cases::{Measured, measure_claims, measure_counts, measure_pods, namespace};
use engaged::{BOUND, CYCLES, ENGAGED, EXPORTS, WATCHES, measure_bookkeeping, measure_engaged};
use report::{ratio, report, results_path};

// The root's benchmark helpers (std only): the commit a result file was measured at.
#[path = "../../../../benches/common/commit.rs"]
mod commit;
use support::{pod, quota, served};

/// Objects per case when `LAZYQUOTA_BENCH_OBJECTS` is unset.
const DEFAULT_OBJECTS: usize = 100_000;
/// Objects per case in a smoke run (no `--bench` argument).
const SMOKE_OBJECTS: usize = 1_000;
/// Namespaces the objects are spread over (fewer if there are fewer objects).
const NAMESPACES: usize = 100;
/// Timed passes over all quotas after the first one; the median is reported.
const COMPUTE_PASSES: usize = 10;
/// Targets to compare against (reported, not asserted).
const POD_TARGET: usize = 256;
const COUNT_TARGET: usize = 64;

const WIDGETS_COUNT_KEY: &str = "count/widgets.example.io";
/// The claims case's key: devices of the `gpu` DeviceClass.
const GPU_DEVICES_KEY: &str = "gpu.deviceclass.resource.k8s.io/devices";

struct Config {
    objects: usize,
    namespaces: usize,
    /// A `cargo bench` run (not a `cargo test --benches` smoke run): results are written.
    bench: bool,
}

impl Config {
    fn from_env() -> Self {
        let bench = std::env::args().any(|a| a == "--bench");
        let objects = match std::env::var("LAZYQUOTA_BENCH_OBJECTS") {
            Ok(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .unwrap_or_else(|| panic!("LAZYQUOTA_BENCH_OBJECTS must be a positive integer, not {v:?}")),
            Err(_) if bench => DEFAULT_OBJECTS,
            Err(_) => SMOKE_OBJECTS,
        };
        Self {
            objects,
            namespaces: objects.min(NAMESPACES),
            bench,
        }
    }

    /// Objects in each namespace, in list order.
    fn spread(&self) -> Vec<usize> {
        let (each, rest) = (self.objects / self.namespaces, self.objects % self.namespaces);
        (0..self.namespaces)
            .map(|n| each + usize::from(n < rest))
            .collect()
    }
}

fn main() {
    let cfg = Config::from_env();
    let cluster = ClusterName::new("bench");
    eprintln!(
        "heap: {} objects per case over {} namespaces",
        cfg.objects, cfg.namespaces
    );
    let pods = measure_pods(&cfg, &cluster);
    let claims = measure_claims(&cfg, &cluster);
    let counts = measure_counts(&cfg, &cluster);
    let bookkeeping = measure_bookkeeping(&cluster);
    let engaged = measure_engaged();
    let mut table = report(&cfg, &pods, &claims, &counts);
    let _ = writeln!(
        table,
        "\n## Watch bookkeeping\n\n\
         | | bytes |\n| --- | ---: |\n\
         | per open watch (`watches::Watches` entry and id, the empty partition it holds), {WATCHES} namespaced watches | {} |\n\
         | per kcp fan-out subscriber (`fanout::Fanout`: cluster name, phase, a zero-sized sink), {WATCHES} subscribers | {} |\n\n\
         - The watches: {WATCHES} quotas of `{WIDGETS_COUNT_KEY}`, one per namespace, planned with a namespace \
         threshold above {WATCHES} (one watch each); growth of one `Watches::sync`. The quotas' own cost \
         is not included (see the index). A joining subscriber's buffer is not included either.",
        bookkeeping.per_watch, bookkeeping.per_subscriber,
    );
    let _ = writeln!(
        table,
        "\n## An engaged kcp logical cluster\n\n\
         | | bytes |\n| --- | ---: |\n\
         | per logical cluster of the shard, engaged or not (membership: name, phase) | {} |\n\
         | **per engaged logical cluster**, {ENGAGED} engaged (the first interns the shared types) | **{}** |\n\
         | per engaged logical cluster, the last {} only | {} |\n\
         | by step: the quota in the membership and a discovery slot | {} |\n\
         | by step: the first discovery (the resolver's list of interned types) | {} |\n\
         | by step: the quota in the engine (spec, status as after its first write, demand) | {} |\n\
         | by step: the count watch (plan, hub demand, fan-out subscriber, its list) | {} |\n\
         | of which the fan-out subscriber (cluster name, phase, its share: a watch id and an empty `Vec`) | {} |\n\
         | still allocated after letting all {ENGAGED} go, then engaging them again, {CYCLES} rounds (bytes above the start) | {} |\n\n\
         - Each cluster is engaged as the shard's engine does it when its first quota appears: the \
         membership takes the quota, the cluster gets a discovery slot and its first discovery (a kcp \
         v0.32.3 workspace's 40 types and {BOUND} bound ones of {EXPORTS}, interned), the engine takes \
         one quota (`count/widgets.<group>` of a bound type), the watch set plans its count watch, \
         the hub records the demand, the shared watch's fan-out takes the subscriber and its list \
         (no objects), and the watch set takes the list's items from its share until the watch is \
         synced. Objects are not included: each costs what the count-only case says. \
         Target: ≤ 16 KiB ({}).\n\
         - Not included (in `crates/kube`, so outside this pure measurement; counted by the kcp \
         benchmark's jemalloc slope): the controller's `Member` (the workspace path, two empty \
         sets), and Event series once a quota gets Events. A subscriber of a shared watch has no \
         stream, task or channel of its own in the executor: its share is delivered in the \
         Reconciler.",
        engaged.per_known,
        engaged.per_engaged,
        ENGAGED - ENGAGED / 2,
        engaged.per_engaged_marginal,
        engaged.stages[0],
        engaged.stages[1],
        engaged.stages[2],
        engaged.stages[3],
        engaged.per_share,
        engaged
            .kept
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        if engaged.per_engaged <= 16 * 1024 {
            "met"
        } else {
            "**missed**"
        },
    );
    println!("{table}");
    if cfg.bench {
        let path = results_path(&cfg);
        let dir = path.parent().expect("a results directory");
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        std::fs::write(&path, &table).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!("heap: wrote {}", path.canonicalize().unwrap_or(path).display());
    }
}
