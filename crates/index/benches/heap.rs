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
    engine::{Engine, Projected, StoreKind, same_value, store_kind},
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

mod support;

// The root's benchmark helpers (std only): the commit a result file was measured at.
#[path = "../../../benches/common/commit.rs"]
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

// ---- fixtures -----------------------------------------------------------------------------

fn namespace(n: usize) -> String {
    format!("team-{n:03}")
}

/// A few pod shapes, cycled through: the objects differ in values and priority class.
fn pod_templates() -> Vec<Pod> {
    vec![
        pod(["100m", "128Mi"], ["500m", "256Mi"], "standard"),
        pod(["250m", "256Mi"], ["1", "512Mi"], "standard"),
        pod(["500m", "512Mi"], ["2", "1Gi"], "high"),
        pod(["50m", "64Mi"], ["200m", "128Mi"], "batch"),
    ]
}

/// An engine set up as the controller sets it up: one discovery run, one quota per
/// namespace, and every partition that the quotas' demand changes ask for held.
struct Setup {
    engine: Engine,
    kind: StoreKind,
    partitions: Vec<PartitionKey>,
    quotas: Vec<QuotaKey>,
}

fn setup(cluster: &ClusterName, served: ServedResource, hard: &[(&str, &str)], namespaces: usize) -> Setup {
    let mut engine = Engine::new(FeatureGates::default());
    engine.discovered(cluster, vec![served], &[]);
    let mut kinds = Vec::new();
    let mut partitions = Vec::new();
    let mut quotas = Vec::new();
    for n in 0..namespaces {
        let ns = namespace(n);
        let key = QuotaKey::new(cluster, &ns, "compute");
        let update = engine.apply_quota(key.clone(), &quota(&ns, "compute", hard));
        assert!(update.recompute && update.problems.is_empty(), "{update:?}");
        for change in update.changes {
            let Some(need) = change.to else { continue };
            let kind = store_kind(&change.resource, need);
            let p = PartitionKey {
                cluster: change.cluster,
                resource: change.resource,
                namespace: change.namespace,
            };
            engine.hold(kind, p.clone());
            kinds.push(kind);
            partitions.push(p);
        }
        quotas.push(key);
    }
    assert_eq!(partitions.len(), namespaces, "one held partition per namespace");
    let kind = kinds[0];
    assert!(kinds.iter().all(|k| *k == kind));
    Setup {
        engine,
        kind,
        partitions,
        quotas,
    }
}

/// An eager watch's list: every held partition relisted at once (the peak of a relist is
/// then both generations of everything), objects in the apiserver's order (by namespace).
fn list_pods(s: &mut Setup, spread: &[usize], templates: &mut [Pod], interner: &Interner) {
    let gates = s.engine.gates();
    for p in &s.partitions {
        s.engine.begin_relist(s.kind, p);
    }
    for (n, (p, count)) in s.partitions.iter().zip(spread).enumerate() {
        for i in 0..*count {
            let pod = &mut templates[i % templates.len()];
            let meta = &mut pod.metadata;
            let ns = meta.namespace.get_or_insert_with(String::new);
            ns.clear();
            ns.push_str(&p.namespace);
            let name = meta.name.get_or_insert_with(String::new);
            name.clear();
            write!(name, "web-{n:03}-7d9f8b6c5d-{i:06}").expect("writing to a String");
            let projected = PodProjection::from_pod(pod, gates, interner)
                .strict()
                .map(Projected::Pod)
                .expect("every generated pod projects");
            let id = object_id(pod.metadata.name.as_deref().unwrap_or_default());
            if let Some(reason) = s.engine.relist_apply(s.kind, p, id, projected) {
                panic!("pod not stored: {reason}");
            }
        }
    }
    for p in &s.partitions {
        s.engine.finish_relist(s.kind, p);
    }
}

/// A claim as the DRA examples write them: one request for one `gpu`, or (every third) a
/// `firstAvailable` choice between two and one devices of two classes.
fn claim_template(i: usize) -> ResourceClaim {
    let requests = if i % 3 == 2 {
        json!([{"name": "gpu", "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu", "allocationMode": "ExactCount", "count": 2},
            {"name": "small", "deviceClassName": "gpu-small", "allocationMode": "ExactCount", "count": 1}]}])
    } else {
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "allocationMode": "ExactCount", "count": 1}}])
    };
    serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": {"devices": {"requests": requests}}}))
        .expect("a valid claim")
}

fn list_claims(s: &mut Setup, spread: &[usize], interner: &Interner) {
    let templates: Vec<ResourceClaim> = (0..3).map(claim_template).collect();
    let mut name = String::with_capacity(64);
    for p in &s.partitions {
        s.engine.begin_relist(s.kind, p);
    }
    for (n, (p, count)) in s.partitions.iter().zip(spread).enumerate() {
        for i in 0..*count {
            name.clear();
            write!(name, "job-{n:03}-{i:06}-gpu").expect("writing to a String");
            let projected = Projected::Claim(ClaimProjection::from_claim(
                &templates[i % 3],
                interner,
                &object_id,
            ));
            if let Some(reason) = s.engine.relist_apply(s.kind, p, object_id(&name), projected) {
                panic!("claim not stored: {reason}");
            }
        }
    }
    for p in &s.partitions {
        s.engine.finish_relist(s.kind, p);
    }
}

fn list_counts(s: &mut Setup, spread: &[usize], name: &mut String) {
    for p in &s.partitions {
        s.engine.begin_relist(s.kind, p);
    }
    for (n, (p, count)) in s.partitions.iter().zip(spread).enumerate() {
        for i in 0..*count {
            name.clear();
            write!(name, "widget-{n:03}-{i:06}").expect("writing to a String");
            if let Some(reason) = s.engine.relist_apply(s.kind, p, object_id(name), Projected::Meta) {
                panic!("object not stored: {reason}");
            }
        }
    }
    for p in &s.partitions {
        s.engine.finish_relist(s.kind, p);
    }
}

// ---- measuring ----------------------------------------------------------------------------

/// What one case measured.
struct Measured {
    objects: usize,
    namespaces: usize,
    before: HeapStats,
    after_setup: HeapStats,
    after: HeapStats,
    /// Stats after a full relist of every object.
    relisted: HeapStats,
    /// The store's own accounting (`held_by_resource`): objects and bytes.
    store_estimate: (usize, usize),
    compute_first: Duration,
    compute_median: Duration,
    quotas: usize,
}

impl Measured {
    fn growth(&self) -> usize {
        self.after.curr_bytes - self.before.curr_bytes
    }

    fn per_object(&self) -> usize {
        self.growth() / self.objects
    }

    fn objects_only_per_object(&self) -> usize {
        (self.after.curr_bytes - self.after_setup.curr_bytes) / self.objects
    }

    fn blocks_per_object(&self) -> f64 {
        ratio(self.after.curr_blocks - self.before.curr_blocks, self.objects)
    }

    /// The relist's peak, if it was the highest point so far (it always is unless the
    /// objects are very few: then the initial list's transient tables may exceed it).
    fn relist_peak(&self) -> usize {
        self.relisted.max_bytes
    }
}

/// Computes every quota once (checking the result), then `COMPUTE_PASSES` more times;
/// returns the first pass's time and the median pass's.
fn time_compute(engine: &Engine, quotas: &[QuotaKey], key: &str, expected: &[usize]) -> (Duration, Duration) {
    let now = Time::from_unix_seconds(1_800_000_000);
    let start = Instant::now();
    let computed: Vec<_> = quotas.iter().map(|q| engine.compute(q, now)).collect();
    let first = start.elapsed();
    for ((q, c), want) in quotas.iter().zip(&computed).zip(expected) {
        let c = c.as_ref().unwrap_or_else(|| panic!("{q} unknown"));
        let used = c.decision.used.get(key);
        assert!(
            used.is_some_and(|v| same_value(v, &K8sQuantity(want.to_string()))),
            "{q}: {key} = {used:?}, not {want} (unsynced {:?})",
            c.unsynced
        );
    }
    drop(computed);
    let mut passes: Vec<Duration> = (0..COMPUTE_PASSES)
        .map(|_| {
            let start = Instant::now();
            for q in quotas {
                black_box(engine.compute(black_box(q), now));
            }
            start.elapsed()
        })
        .collect();
    passes.sort_unstable();
    (first, passes[passes.len() / 2])
}

fn measure_pods(cfg: &Config, cluster: &ClusterName) -> Measured {
    let spread = cfg.spread();
    let profiler = dhat::Profiler::builder().testing().build();
    // Scaffolding (the typed pods the watch would deserialize) is not the engine's: it is in
    // "before", and the engine's growth is measured from there.
    let mut templates = pod_templates();
    let before = HeapStats::get();
    let interner = Interner::new();
    let mut s = setup(
        cluster,
        served(GroupResource::core("pods"), "Pod"),
        &[
            ("pods", "2000"),
            ("requests.cpu", "500"),
            ("limits.memory", "2Ti"),
        ],
        cfg.namespaces,
    );
    assert_eq!(s.kind, StoreKind::Pods);
    let after_setup = HeapStats::get();
    list_pods(&mut s, &spread, &mut templates, &interner);
    let after = HeapStats::get();
    // A full relist (410 Gone, or a restarted eager watch): both generations side by side.
    list_pods(&mut s, &spread, &mut templates, &interner);
    let relisted = HeapStats::get();
    drop(profiler);
    assert!(interner.len() <= 3, "priority classes are interned once each");
    let store_estimate = s
        .engine
        .held_by_resource()
        .get("count/pods")
        .copied()
        .unwrap_or_default();
    let (compute_first, compute_median) = time_compute(&s.engine, &s.quotas, "pods", &spread);
    Measured {
        objects: cfg.objects,
        namespaces: cfg.namespaces,
        before,
        after_setup,
        after,
        relisted,
        store_estimate,
        compute_first,
        compute_median,
        quotas: s.quotas.len(),
    }
}

fn measure_claims(cfg: &Config, cluster: &ClusterName) -> Measured {
    let spread = cfg.spread();
    let profiler = dhat::Profiler::builder().testing().build();
    let before = HeapStats::get();
    let interner = Interner::new();
    let mut s = setup(
        cluster,
        served(
            GroupResource::new("resource.k8s.io", "resourceclaims"),
            "ResourceClaim",
        ),
        &[
            ("count/resourceclaims.resource.k8s.io", "5000"),
            (GPU_DEVICES_KEY, "5000"),
        ],
        cfg.namespaces,
    );
    assert_eq!(s.kind, StoreKind::Claims);
    let after_setup = HeapStats::get();
    list_claims(&mut s, &spread, &interner);
    let after = HeapStats::get();
    list_claims(&mut s, &spread, &interner);
    let relisted = HeapStats::get();
    drop(profiler);
    let store_estimate = s
        .engine
        .held_by_resource()
        .get("count/resourceclaims.resource.k8s.io")
        .copied()
        .unwrap_or_default();
    // Two of three claims charge one gpu, the third its worst case of two.
    let devices: Vec<usize> = spread.iter().map(|n| n / 3 * 4 + [0, 1, 2][n % 3]).collect();
    let (compute_first, compute_median) = time_compute(&s.engine, &s.quotas, GPU_DEVICES_KEY, &devices);
    Measured {
        objects: cfg.objects,
        namespaces: cfg.namespaces,
        before,
        after_setup,
        after,
        relisted,
        store_estimate,
        compute_first,
        compute_median,
        quotas: s.quotas.len(),
    }
}

fn measure_counts(cfg: &Config, cluster: &ClusterName) -> Measured {
    let spread = cfg.spread();
    let profiler = dhat::Profiler::builder().testing().build();
    let mut name = String::with_capacity(64);
    let before = HeapStats::get();
    let mut s = setup(
        cluster,
        served(GroupResource::new("example.io", "widgets"), "Widget"),
        &[(WIDGETS_COUNT_KEY, "5000")],
        cfg.namespaces,
    );
    assert_eq!(s.kind, StoreKind::Counts);
    let after_setup = HeapStats::get();
    list_counts(&mut s, &spread, &mut name);
    let after = HeapStats::get();
    list_counts(&mut s, &spread, &mut name);
    let relisted = HeapStats::get();
    drop(profiler);
    let store_estimate = s
        .engine
        .held_by_resource()
        .get(WIDGETS_COUNT_KEY)
        .copied()
        .unwrap_or_default();
    let (compute_first, compute_median) = time_compute(&s.engine, &s.quotas, WIDGETS_COUNT_KEY, &spread);
    Measured {
        objects: cfg.objects,
        namespaces: cfg.namespaces,
        before,
        after_setup,
        after,
        relisted,
        store_estimate,
        compute_first,
        compute_median,
        quotas: s.quotas.len(),
    }
}

// ---- watch bookkeeping ----------------------------------------------------------------------

/// Open watches (one per namespace, each with its quota) and kcp fan-out subscribers measured.
const WATCHES: usize = 1_000;

/// Heap per open watch (the watch set's entry and the empty partition it holds) and per
/// fan-out subscriber (its cluster name and sink; none buffered).
struct Bookkeeping {
    per_watch: usize,
    per_subscriber: usize,
}

/// A sink that drops what it is sent (a subscriber's channel is not the fan-out's cost).
struct Dropped;

impl Sink for Dropped {
    type Object = ();
    fn send(&mut self, _item: WatchItem<()>) {}
    fn unread(&self) -> usize {
        0
    }
    fn is_closed(&self) -> bool {
        false
    }
}

fn measure_bookkeeping(cluster: &ClusterName) -> Bookkeeping {
    let widgets = GroupResource::new("example.io", "widgets");
    let mut engine = Engine::new(FeatureGates::default());
    engine.discovered(cluster, vec![served(widgets.clone(), "Widget")], &[]);
    for n in 0..WATCHES {
        let ns = namespace(n);
        engine.apply_quota(
            QuotaKey::new(cluster, &ns, "q"),
            &quota(&ns, "q", &[(WIDGETS_COUNT_KEY, "5")]),
        );
    }
    let settings = PlanSettings {
        mode: Mode::Lazy,
        namespace_watch_threshold: usize::MAX,
        gates: FeatureGates::default(),
    };
    let profiler = dhat::Profiler::builder().testing().build();
    let mut watches = Watches::new(settings, false, ObjectIds::default());
    let mut out = Vec::new();
    let before = HeapStats::get();
    watches.sync(&mut engine, cluster, &widgets, &|_| false, &mut out);
    out.clear();
    out.shrink_to_fit();
    let after = HeapStats::get();
    assert_eq!(watches.iter().count(), WATCHES, "one watch per namespace");
    let mut fanout = Fanout::new(16_384);
    let subscribed = HeapStats::get();
    for n in 0..WATCHES {
        let _ = fanout.subscribe(ClusterName::new(&format!("2x7c{n:012}")), None, Dropped);
    }
    let all = HeapStats::get();
    drop(profiler);
    Bookkeeping {
        per_watch: after.curr_bytes.saturating_sub(before.curr_bytes) / WATCHES,
        per_subscriber: all.curr_bytes.saturating_sub(subscribed.curr_bytes) / WATCHES,
    }
}

// ---- engaged logical clusters (kcp) -------------------------------------------------------

/// Logical clusters engaged, one after another, in the engaged-cluster case.
const ENGAGED: usize = 200;
/// The namespace of each engaged cluster's quota (the kcp benchmark's).
const NS_KCP: &str = "bench";
/// APIExports of the kcp seed scenario; each workspace binds [`BOUND`] of them.
const EXPORTS: usize = 10;
const BOUND: usize = 5;
/// Rounds of letting every engaged cluster go and engaging it again: what stays allocated
/// must not grow from round to round.
const CYCLES: usize = 8;

/// Carries a watch set's `Demand` action to the hub's demand, as the Reconciler does.
fn record_demand(demand: &mut Demand, action: Action) {
    if let Action::Demand {
        cluster,
        resource,
        count,
    } = action
    {
        demand.set(&cluster, &resource, count);
    }
}

/// What engaging logical clusters cost the shard's engine, in dhat's live bytes.
struct EngagedCost {
    /// Per logical cluster the shard has, engaged or not (the LogicalCluster watch's entry).
    per_known: usize,
    /// Per engaged cluster, over all [`ENGAGED`] (the first one interns the shared types).
    per_engaged: usize,
    /// Per engaged cluster, over the second half only (what one more costs).
    per_engaged_marginal: usize,
    /// Of which the subscriber's fan-out entry (cluster name, phase, its [`Share`] sink).
    per_share: usize,
    /// Per engaged cluster by step: membership and discovery slot, discovery (resolver),
    /// quota (engine), watch (plan, hub demand, subscriber, its list).
    stages: [isize; 4],
    /// Bytes still allocated (above the start) after each of [`CYCLES`] rounds of letting
    /// every cluster go; every round but the last engages them all again.
    kept: Vec<isize>,
}

/// Engages [`ENGAGED`] logical clusters as the shard's engine does when a quota appears in
/// each: the membership learns the quota, the cluster gets a discovery slot and its first
/// discovery (a kcp workspace's 40 types and 5 bound ones), the engine takes its quota
/// (`count/<type>`, one bound type), the watch set plans the count watch (served by the hub's
/// shared watch), the hub records the demand and the fan-out takes the subscriber (its share
/// handed to the watch as the Reconciler does). No objects: those cost what the count-only case
/// says, per object.
fn measure_engaged() -> EngagedCost {
    let bound: Vec<GroupResource> = (0..EXPORTS)
        .map(|e| GroupResource::new(format!("e{e}.bench.example.io"), "widgets"))
        .collect();
    let settings = PlanSettings {
        mode: Mode::Lazy,
        namespace_watch_threshold: usize::MAX,
        gates: FeatureGates::default(),
    };
    let clusters: Vec<ClusterName> = (0..ENGAGED)
        .map(|n| ClusterName::new(&format!("2x7c{n:012}")))
        .collect();
    let t0 = std::time::Instant::now();
    let profiler = dhat::Profiler::builder().testing().build();
    let start = HeapStats::get();
    let mut membership = Membership::default();
    membership.clusters_listed(clusters.iter().map(|c| (c.clone(), "Ready".to_owned())));
    let known = HeapStats::get();
    let mut discoveries = Discoveries::new(Duration::from_mins(5), 4);
    // As the shard's engine has it (kcp's quota semantics: cluster-scoped types resolve too).
    let mut engine = Engine::new(FeatureGates::default()).with_kcp_semantics();
    let mut watches = Watches::new(settings, true, ObjectIds::default());
    let mut demand = Demand::default();
    let mut fanout: Fanout<Share> = Fanout::new(lazyquota_index::reconciler::MAX_PENDING);
    // The shared watch has listed (nobody subscribed yet): later subscribers join with lists.
    fanout.init();
    fanout.init_done();
    let mut out = Vec::new();
    let mut ignored = Vec::new();
    let now = Time::from_unix_seconds(1_800_000_000);
    let mut shares = 0;
    // Growth by step: membership and discovery slot, discovery, quota, watch and subscriber.
    let mut stages = [0_isize; 4];
    let before = HeapStats::get();
    let mut half = before.clone();
    let mut after = before.clone();
    // Bytes above `before` after each cycle's disengaging of every cluster.
    let mut kept = Vec::with_capacity(CYCLES);
    for cycle in 0..=CYCLES {
        for (n, cluster) in clusters.iter().enumerate() {
            if cycle == 0 && n == ENGAGED / 2 {
                half = HeapStats::get();
            }
            let mine: Vec<GroupResource> = (0..BOUND).map(|b| bound[(n + b) % EXPORTS].clone()).collect();
            let counted = &mine[0];
            let spec = quota(NS_KCP, "widgets", &[(&counted.object_count_name(), "100")]);
            let mut mark = HeapStats::get().curr_bytes;
            let mut stage = |i: usize| {
                let now = HeapStats::get().curr_bytes;
                if cycle == 0 {
                    stages[i] += now.cast_signed() - mark.cast_signed();
                }
                mark = now;
            };
            membership.quota_applied(cluster.clone(), NS_KCP, "widgets");
            discoveries.add(cluster.clone(), t0);
            assert_eq!(discoveries.start_due(t0), vec![cluster.clone()]);
            discoveries.finished(cluster, true, t0);
            stage(0);
            engine.discovered(cluster, support::kcp_workspace(&mine), &[]);
            stage(1);
            let update = engine.apply_quota(QuotaKey::new(cluster, NS_KCP, "widgets"), &spec);
            assert!(
                update.problems.is_empty() && update.changes.len() == 1,
                "{update:?}"
            );
            drop(update);
            stage(2);
            watches.sync(&mut engine, cluster, counted, &|_| true, &mut out);
            for action in out.drain(..) {
                match action {
                    Action::Demand { .. } => record_demand(&mut demand, action),
                    Action::Start { id, key, shared, .. } => {
                        assert!(shared, "a count watch of a shared type subscribes to the hub");
                        let ready = HeapStats::get();
                        let join = fanout
                            .subscribe(key.cluster.clone(), key.namespace.clone(), Share::new(id))
                            .expect("a subscriber after the shared watch's list joins with a list");
                        if cycle == 0 {
                            shares += HeapStats::get().curr_bytes - ready.curr_bytes;
                        }
                        // Its own list (no objects) ends the join; the Reconciler hands what the
                        // share got to the watch set at once: the subscriber is live.
                        assert!(
                            fanout
                                .joined(join.generation, Ok((Some(1), Vec::new())))
                                .is_none()
                        );
                        let mut items = Vec::new();
                        fanout.for_each_sink(|share| {
                            if share.watch() == id {
                                items = share.take();
                            }
                        });
                        for item in items {
                            watches.on_item(&mut engine, id, item, now, &mut ignored);
                        }
                        // What the controller would carry out: logs, metrics, the quota's computation.
                        assert!(
                            ignored.drain(..).all(|a| matches!(
                                a,
                                Action::Listing(_) | Action::Synced(_) | Action::Enqueue(_)
                            )),
                            "a list's items make a watch listing, synced, and its quota computed"
                        );
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            stage(3);
        }
        ignored.shrink_to_fit();
        out.shrink_to_fit();
        if cycle == 0 {
            after = HeapStats::get();
        }
        assert_eq!(membership.desired().len(), ENGAGED);
        assert_eq!(
            watches.iter().count(),
            ENGAGED,
            "one count watch per engaged cluster"
        );
        assert_eq!(demand.clusters(&bound[0]), ENGAGED / EXPORTS);
        let synced = watches.iter().filter(|(_, r)| r.synced).count();
        assert_eq!(synced, ENGAGED, "every engaged cluster's watch has synced");
        if cycle == CYCLES {
            break;
        }
        // Every quota deleted: each cluster let go as the shard's engine does it, its subscriber
        // left and pruned from the fan-out.
        for cluster in &clusters {
            drop(engine.delete_quota(&QuotaKey::new(cluster, NS_KCP, "widgets")));
            membership.quota_deleted(cluster, NS_KCP, "widgets");
            discoveries.remove(cluster);
            watches.forget_cluster(&mut engine, cluster, &|_| true, &mut out);
            for action in out.drain(..) {
                match action {
                    Action::Demand { .. } => record_demand(&mut demand, action),
                    Action::Stop { .. } => {}
                    other => panic!("unexpected {other:?} while letting a cluster go"),
                }
            }
        }
        fanout.for_each_sink(Share::leave);
        assert!(!fanout.prune(), "every subscriber gone");
        out.shrink_to_fit();
        assert!(membership.desired().is_empty() && watches.iter().count() == 0);
        kept.push(HeapStats::get().curr_bytes.cast_signed() - before.curr_bytes.cast_signed());
    }
    drop(ignored);
    drop(profiler);
    EngagedCost {
        per_known: (known.curr_bytes - start.curr_bytes) / ENGAGED,
        per_engaged: (after.curr_bytes - before.curr_bytes) / ENGAGED,
        per_engaged_marginal: (after.curr_bytes - half.curr_bytes) / (ENGAGED - ENGAGED / 2),
        per_share: shares / ENGAGED,
        stages: stages.map(|b| b / ENGAGED.cast_signed()),
        kept,
    }
}

// ---- reporting ----------------------------------------------------------------------------

#[allow(clippy::cast_precision_loss)] // display only
fn ratio(a: usize, b: usize) -> f64 {
    a as f64 / b as f64
}

/// `1234567` → `1,234,567`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn bytes(n: usize) -> String {
    format!("{} B ({:.1} MiB)", thousands(n), ratio(n, 1 << 20))
}

fn millis(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn verdict(value: usize, target: usize) -> String {
    if value <= target {
        format!("≤ {target} B: met")
    } else {
        format!("≤ {target} B: **missed**")
    }
}
fn report(cfg: &Config, pods: &Measured, claims: &Measured, counts: &Measured) -> String {
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

fn results_path(cfg: &Config) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/results");
    let file = if cfg.objects == DEFAULT_OBJECTS {
        "heap.md".to_owned()
    } else {
        format!("heap-{}.md", cfg.objects)
    };
    dir.join(file)
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
         | by step: the quota in the engine (spec, demand) | {} |\n\
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
