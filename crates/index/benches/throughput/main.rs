//! Watch-event throughput of the pure pipeline, on one thread: pre-built projected events fed
//! to [`Engine::apply`] / [`Engine::delete`] as the controller feeds them (store, update
//! filter, replenish decision), and [`Engine::compute`] of a quota over a namespace of 1000
//! pods.
//!
//! Cases (10 namespaces; 1000 pods and 1000 count-only widgets in each, all synced):
//! - `pod_modify_resized`: an Apply of every existing pod with a changed projection (an
//!   in-place resize: requests and container-status resources changed), then back; every
//!   event passes the update filter and replenishes.
//! - `pod_modify_unchanged`: an Apply of every pod with an equal projection (the common
//!   status-only update); the filter says no.
//! - `pod_delete_readd`: a Delete of every pod, each followed by its re-add.
//! - `count_add_delete`: Meta applies of 10,000 new count-only objects, then their deletes.
//! - `count_modify`: Meta applies of every existing count-only object (metadata updates).
//! - `pod_projection`: `PodProjection::from_pod` of a typed pod (the work the watch does
//!   before an event reaches the engine), for scale.
//! - `compute/quota_over_1000_pods`: `Engine::compute` of one quota (`pods`, `requests.cpu`,
//!   `limits.memory`); its throughput is in pods evaluated per second.
//!
//! Criterion measures each case (`Throughput::Elements` = events per batch), with
//! `sample_size(10)` and short warm-up and measurement times so the whole run takes about a
//! minute. Then a final pass, not criterion's, times a fixed batch of each case with
//! `std::time::Instant` (median of 7) and writes events per second to
//! `benches/results/throughput.md` at the repository root. Without `--bench`
//! (`cargo test --benches`) criterion runs each case once and nothing is written.

use std::{
    fmt::Write as _,
    hint::black_box,
    path::Path,
    time::{Duration, Instant},
};

use criterion::{BatchSize, Criterion, Throughput};
use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::api::resource::Quantity as K8sQuantity};
use lazyquota_index::{
    engine::{Applied, Engine, Projected, StoreKind, same_value},
    keys::{ClusterName, GroupResource, ObjectIds, QuotaKey},
    store::PartitionKey,
};
use lazyquota_quota::{FeatureGates, Interner, PodProjection, Time};

/// Store ids as the controller makes them (keyed, one key per process).
fn object_id(name: &str) -> u64 {
    static IDS: std::sync::LazyLock<ObjectIds> = std::sync::LazyLock::new(ObjectIds::default);
    IDS.id(name)
}

#[path = "../support/mod.rs"]
mod support;

// The root's benchmark helpers (std only): the commit a result file was measured at.
#[path = "../../../../benches/common/commit.rs"]
mod commit;

mod report;
mod sizes;
use report::summary;
use support::{pod, quota, served};

const NAMESPACES: usize = 10;
const PODS_PER_NAMESPACE: usize = 1_000;
const WIDGETS_PER_NAMESPACE: usize = 1_000;
/// Batches timed per case in the final pass; the median is reported.
const SUMMARY_PASSES: usize = 7;
/// Projections per criterion iteration and per final-pass batch.
const BENCH_PROJECTIONS: usize = 1_000;
const SUMMARY_PROJECTIONS: usize = 10_000;
/// Computes per timed batch in the final pass.
const COMPUTES_PER_BATCH: usize = 200;

const WIDGETS_COUNT_KEY: &str = "count/widgets.example.io";

fn now() -> Time {
    Time::from_unix_seconds(1_800_000_000)
}

// ---- typed objects (as in benches/heap/cases.rs) -------------------------------------------------

/// Pod shapes, each with its resized twin (the app container's cpu request doubled).
fn pod_shapes() -> Vec<(Pod, Pod)> {
    [
        (
            ["100m", "128Mi"],
            ["200m", "128Mi"],
            ["500m", "256Mi"],
            "standard",
        ),
        (["250m", "256Mi"], ["500m", "256Mi"], ["1", "512Mi"], "standard"),
        (["500m", "512Mi"], ["1", "512Mi"], ["2", "1Gi"], "high"),
        (["50m", "64Mi"], ["100m", "64Mi"], ["200m", "128Mi"], "batch"),
    ]
    .into_iter()
    .map(|(requests, resized, limits, class)| (pod(requests, limits, class), pod(resized, limits, class)))
    .collect()
}

// ---- events ---------------------------------------------------------------------------------

enum Op {
    Apply(Projected),
    Delete,
}

/// A watch event, projected: what the controller hands the engine.
struct Event {
    kind: StoreKind,
    partition: usize,
    id: u64,
    op: Op,
}

fn clone_projected(p: &Projected) -> Projected {
    match p {
        Projected::Meta => Projected::Meta,
        Projected::Pod(p) => Projected::Pod(p.clone()),
        Projected::Service(s) => Projected::Service(*s),
        Projected::Pvc(p) => Projected::Pvc(p.clone()),
        Projected::Claim(c) => Projected::Claim(c.clone()),
        Projected::DeviceClass(d) => Projected::DeviceClass(d.clone()),
    }
}

fn clone_events(events: &[Event]) -> Vec<Event> {
    events
        .iter()
        .map(|e| Event {
            kind: e.kind,
            partition: e.partition,
            id: e.id,
            op: match &e.op {
                Op::Apply(p) => Op::Apply(clone_projected(p)),
                Op::Delete => Op::Delete,
            },
        })
        .collect()
}

/// What a batch of events did.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    replenish: usize,
    stored: usize,
    other: usize,
}

fn apply_all(engine: &mut Engine, partitions: &[PartitionKey], events: Vec<Event>) -> Tally {
    let now = now();
    let mut tally = Tally::default();
    // Each event at a resourceVersion of its own, as a watch delivers them (so arrivals are
    // handed to the quotas' charges as they would be).
    for (revision, e) in (1_u64..).zip(events) {
        let p = &partitions[e.partition];
        let applied = match e.op {
            Op::Apply(object) => engine.apply(e.kind, p, e.id, object, Some(revision), now),
            Op::Delete => engine.delete(e.kind, p, e.id),
        };
        match applied {
            Applied::Replenish => tally.replenish += 1,
            Applied::Stored => tally.stored += 1,
            Applied::NotHeld | Applied::Malformed(_) => tally.other += 1,
        }
    }
    tally
}

// ---- the fixture ------------------------------------------------------------------------------

struct Fixture {
    engine: Engine,
    partitions: Vec<PartitionKey>,
    /// Every pod: partition, id, projection as stored, resized projection.
    pods: Vec<(usize, u64, PodProjection, PodProjection)>,
    /// Every count-only object: partition, id.
    widgets: Vec<(usize, u64)>,
    /// The pods quota of the first namespace.
    compute_quota: QuotaKey,
    shapes: Vec<(Pod, Pod)>,
    interner: Interner,
}

impl Fixture {
    fn new() -> Self {
        let cluster = ClusterName::new("bench");
        let mut engine = Engine::new(FeatureGates::default());
        engine.discovered(
            &cluster,
            vec![
                served(GroupResource::core("pods"), "Pod"),
                served(GroupResource::new("example.io", "widgets"), "Widget"),
            ],
            &[],
        );
        // Partitions as the controller holds them: from the quotas' demand changes.
        let mut partitions = Vec::new();
        let mut pod_partitions = Vec::new();
        let mut widget_partitions = Vec::new();
        for n in 0..NAMESPACES {
            let ns = format!("team-{n:03}");
            for (name, hard) in [
                (
                    "compute",
                    &[
                        ("pods", "5000"),
                        ("requests.cpu", "5000"),
                        ("limits.memory", "20Ti"),
                    ][..],
                ),
                ("widgets", &[(WIDGETS_COUNT_KEY, "5000")][..]),
            ] {
                let update = engine.apply_quota(QuotaKey::new(&cluster, &ns, name), &quota(&ns, name, hard));
                for (kind, p) in support::hold_demanded(&mut engine, update.changes) {
                    match kind {
                        StoreKind::Pods => pod_partitions.push(partitions.len()),
                        StoreKind::Counts => widget_partitions.push(partitions.len()),
                        other => panic!("unexpected store {other:?}"),
                    }
                    partitions.push(p);
                }
            }
        }
        assert_eq!(
            (pod_partitions.len(), widget_partitions.len()),
            (NAMESPACES, NAMESPACES)
        );

        let shapes = pod_shapes();
        let interner = Interner::new();
        let gates = engine.gates();
        let project = |pod: &Pod| {
            PodProjection::from_pod(pod, gates, &interner)
                .strict()
                .expect("a valid pod")
        };
        let projections: Vec<(PodProjection, PodProjection)> = shapes
            .iter()
            .map(|(pod, resized)| (project(pod), project(resized)))
            .collect();

        // The initial lists.
        let mut pods = Vec::new();
        let mut widgets = Vec::new();
        for (n, (&pp, &wp)) in pod_partitions.iter().zip(&widget_partitions).enumerate() {
            engine.begin_relist(StoreKind::Pods, &partitions[pp]);
            for i in 0..PODS_PER_NAMESPACE {
                let id = object_id(&format!("web-{n:03}-7d9f8b6c5d-{i:06}"));
                let (original, resized) = &projections[i % projections.len()];
                let stored = Projected::Pod(original.clone());
                assert_eq!(
                    engine.relist_apply(StoreKind::Pods, &partitions[pp], id, stored),
                    None
                );
                pods.push((pp, id, original.clone(), resized.clone()));
            }
            engine.finish_relist(StoreKind::Pods, &partitions[pp]);
            engine.begin_relist(StoreKind::Counts, &partitions[wp]);
            for i in 0..WIDGETS_PER_NAMESPACE {
                let id = object_id(&format!("widget-{n:03}-{i:06}"));
                assert_eq!(
                    engine.relist_apply(StoreKind::Counts, &partitions[wp], id, Projected::Meta),
                    None
                );
                widgets.push((wp, id));
            }
            engine.finish_relist(StoreKind::Counts, &partitions[wp]);
        }
        let compute_quota = QuotaKey::new(&cluster, "team-000", "compute");
        Self {
            engine,
            partitions,
            pods,
            widgets,
            compute_quota,
            shapes,
            interner,
        }
    }

    /// The event batches, each with the tally it must produce. Every batch leaves the store
    /// as it found it, so batches can be replayed.
    fn cases(&self) -> Vec<Case> {
        let pod =
            |(p, id, _, _): &(usize, u64, PodProjection, PodProjection), projection: &PodProjection| Event {
                kind: StoreKind::Pods,
                partition: *p,
                id: *id,
                op: Op::Apply(Projected::Pod(projection.clone())),
            };
        let resized = self
            .pods
            .iter()
            .map(|x| pod(x, &x.3))
            .chain(self.pods.iter().map(|x| pod(x, &x.2)));
        let unchanged = self.pods.iter().map(|x| pod(x, &x.2));
        let delete_readd = self.pods.iter().flat_map(|x| {
            [
                Event {
                    kind: StoreKind::Pods,
                    partition: x.0,
                    id: x.1,
                    op: Op::Delete,
                },
                pod(x, &x.2),
            ]
        });
        let meta = |p: usize, id: u64| Event {
            kind: StoreKind::Counts,
            partition: p,
            id,
            op: Op::Apply(Projected::Meta),
        };
        let fresh: Vec<(usize, u64)> = self
            .widgets
            .iter()
            .map(|(p, id)| (*p, object_id(&format!("new-{id:016x}"))))
            .collect();
        let add_delete = fresh
            .iter()
            .map(|(p, id)| meta(*p, *id))
            .chain(fresh.iter().map(|(p, id)| Event {
                kind: StoreKind::Counts,
                partition: *p,
                id: *id,
                op: Op::Delete,
            }));
        let count_modify = self.widgets.iter().map(|(p, id)| meta(*p, *id));
        let (n_pods, n_widgets) = (self.pods.len(), self.widgets.len());
        vec![
            Case::new(
                "pod_modify_resized",
                resized,
                Tally {
                    replenish: 2 * n_pods,
                    ..Tally::default()
                },
            ),
            Case::new(
                "pod_modify_unchanged",
                unchanged,
                Tally {
                    stored: n_pods,
                    ..Tally::default()
                },
            ),
            Case::new(
                "pod_delete_readd",
                delete_readd,
                // Deletes and adds both recompute (adds: see Engine::apply).
                Tally {
                    replenish: 2 * n_pods,
                    ..Tally::default()
                },
            ),
            Case::new(
                "count_add_delete",
                add_delete,
                Tally {
                    replenish: 2 * n_widgets,
                    ..Tally::default()
                },
            ),
            Case::new(
                "count_modify",
                count_modify,
                Tally {
                    stored: n_widgets,
                    ..Tally::default()
                },
            ),
        ]
    }

    /// `PodProjection::from_pod` of the pod shapes, `n` times in all.
    fn project(&self, n: usize) {
        let gates = self.engine.gates();
        for i in 0..n {
            let (pod, _) = &self.shapes[i % self.shapes.len()];
            black_box(
                PodProjection::from_pod(black_box(pod), gates, &self.interner)
                    .strict()
                    .ok(),
            );
        }
    }
}

struct Case {
    name: &'static str,
    events: Vec<Event>,
    expected: Tally,
}

impl Case {
    fn new(name: &'static str, events: impl Iterator<Item = Event>, expected: Tally) -> Self {
        Self {
            name,
            events: events.collect(),
            expected,
        }
    }
}

// ---- criterion ------------------------------------------------------------------------------

fn elements(n: usize) -> Throughput {
    Throughput::Elements(u64::try_from(n).expect("a batch size fits in u64"))
}

fn criterion_pass(c: &mut Criterion, fixture: &mut Fixture, cases: &[Case]) {
    let mut group = c.benchmark_group("watch_events");
    for case in cases {
        group.throughput(elements(case.events.len()));
        group.bench_function(case.name, |b| {
            b.iter_batched(
                || clone_events(&case.events),
                |events| apply_all(&mut fixture.engine, &fixture.partitions, events),
                BatchSize::PerIteration,
            );
        });
    }
    group.throughput(elements(BENCH_PROJECTIONS));
    group.bench_function("pod_projection", |b| {
        b.iter(|| fixture.project(BENCH_PROJECTIONS));
    });
    group.finish();

    let mut group = c.benchmark_group("compute");
    group.throughput(elements(PODS_PER_NAMESPACE));
    group.bench_function("quota_over_1000_pods", |b| {
        b.iter(|| black_box(fixture.engine.compute(black_box(&fixture.compute_quota), now())));
    });
    group.finish();
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let mut fixture = Fixture::new();
    let cases = fixture.cases();
    // Every batch does what it should, and leaves the store as it found it.
    for case in &cases {
        for _ in 0..2 {
            let tally = apply_all(
                &mut fixture.engine,
                &fixture.partitions,
                clone_events(&case.events),
            );
            assert_eq!(tally, case.expected, "{}", case.name);
        }
    }
    let computed = fixture
        .engine
        .compute(&fixture.compute_quota, now())
        .expect("a known quota");
    let used = computed.decision.used.get("pods");
    assert!(
        used.is_some_and(|v| same_value(v, &K8sQuantity(PODS_PER_NAMESPACE.to_string()))),
        "pods = {used:?} (unsynced {:?})",
        computed.unsynced
    );

    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    criterion_pass(&mut criterion, &mut fixture, &cases);
    criterion.final_summary();

    if bench {
        let table = summary(&mut fixture, &cases);
        println!("\n{table}");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/results");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let path = dir.join("throughput.md");
        std::fs::write(&path, table).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!(
            "throughput: wrote {}",
            path.canonicalize().unwrap_or(path).display()
        );
    }
}
