//! The three cases of objects held: fixtures (pods, claims, count-only objects) and their
//! measurement through the Engine.

use super::*;

pub(crate) fn namespace(n: usize) -> String {
    format!("team-{n:03}")
}

/// A few pod shapes, cycled through: the objects differ in values and priority class.
pub(crate) fn pod_templates() -> Vec<Pod> {
    vec![
        pod(["100m", "128Mi"], ["500m", "256Mi"], "standard"),
        pod(["250m", "256Mi"], ["1", "512Mi"], "standard"),
        pod(["500m", "512Mi"], ["2", "1Gi"], "high"),
        pod(["50m", "64Mi"], ["200m", "128Mi"], "batch"),
    ]
}

/// An engine set up as the controller sets it up: one discovery run, one quota per
/// namespace, and every partition that the quotas' demand changes ask for held.
pub(crate) struct Setup {
    pub(crate) engine: Engine,
    pub(crate) kind: StoreKind,
    pub(crate) partitions: Vec<PartitionKey>,
    pub(crate) quotas: Vec<QuotaKey>,
}

pub(crate) fn setup(
    cluster: &ClusterName,
    served: ServedResource,
    hard: &[(&str, &str)],
    namespaces: usize,
) -> Setup {
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
        for (kind, p) in support::hold_demanded(&mut engine, update.changes) {
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
pub(crate) fn list_pods(s: &mut Setup, spread: &[usize], templates: &mut [Pod], interner: &Interner) {
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
pub(crate) fn claim_template(i: usize) -> ResourceClaim {
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

pub(crate) fn list_claims(s: &mut Setup, spread: &[usize], interner: &Interner) {
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

pub(crate) fn list_counts(s: &mut Setup, spread: &[usize], name: &mut String) {
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
pub(crate) struct Measured {
    pub(crate) objects: usize,
    pub(crate) namespaces: usize,
    pub(crate) before: HeapStats,
    pub(crate) after_setup: HeapStats,
    pub(crate) after: HeapStats,
    /// Stats after a full relist of every object.
    pub(crate) relisted: HeapStats,
    /// The store's own accounting (`held_by_resource`): objects and bytes.
    pub(crate) store_estimate: (usize, usize),
    pub(crate) compute_first: Duration,
    pub(crate) compute_median: Duration,
    pub(crate) quotas: usize,
}

impl Measured {
    pub(crate) fn growth(&self) -> usize {
        self.after.curr_bytes - self.before.curr_bytes
    }

    pub(crate) fn per_object(&self) -> usize {
        self.growth() / self.objects
    }

    pub(crate) fn objects_only_per_object(&self) -> usize {
        (self.after.curr_bytes - self.after_setup.curr_bytes) / self.objects
    }

    pub(crate) fn blocks_per_object(&self) -> f64 {
        ratio(self.after.curr_blocks - self.before.curr_blocks, self.objects)
    }

    /// The relist's peak, if it was the highest point so far (it always is unless the
    /// objects are very few: then the initial list's transient tables may exceed it).
    pub(crate) fn relist_peak(&self) -> usize {
        self.relisted.max_bytes
    }
}

/// Computes every quota once (checking the result), then `COMPUTE_PASSES` more times;
/// returns the first pass's time and the median pass's.
pub(crate) fn time_compute(
    engine: &Engine,
    quotas: &[QuotaKey],
    key: &str,
    expected: &[usize],
) -> (Duration, Duration) {
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

pub(crate) fn measure_pods(cfg: &Config, cluster: &ClusterName) -> Measured {
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

pub(crate) fn measure_claims(cfg: &Config, cluster: &ClusterName) -> Measured {
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

pub(crate) fn measure_counts(cfg: &Config, cluster: &ClusterName) -> Measured {
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
