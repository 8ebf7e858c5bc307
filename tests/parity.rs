//! Differential parity: `status.used` as computed by `lazyquota-quota` against what the real
//! kube-controller-manager (v1.36, its own resourcequota controller) wrote, value for value.
//!
//! Per seed, [`fixtures::populate`] fills a fresh namespace with objects and then quotas over
//! every scope and resource name family; once KCM has synced every quota, each quota's spec is
//! touched to force one final recalculation over settled objects. The test then lists the
//! namespace itself and recomputes every quota exactly as the controller does (`Registry` from
//! discovery, `plan`, per evaluator `calculate_usage` or `calculate_object_count_usage`,
//! `merge`, `assemble_status`), and compares with KCM's `status.used` by value, key sets
//! included.
//!
//! Environment: `LAZYQUOTA_PARITY_SEEDS` (number of seeds, default 20),
//! `LAZYQUOTA_PARITY_SEED` (first seed, default 1; replay one failing seed with
//! `LAZYQUOTA_PARITY_SEED=<seed> LAZYQUOTA_PARITY_SEEDS=1`), `LAZYQUOTA_PARITY_KEEP=1` (keep the
//! namespaces of seeds that failed, for inspection).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ResourceQuota, Service};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::discovery::{Discovery, Scope, verbs};
use kube::{Api, Client};
use lazyquota_quota::{
    Evaluator, FeatureGates, GroupResource, Interner, PodProjection, PvcProjection, Quantity, QuotaSpec,
    Registry, ResourceList, ServiceProjection, Time, assemble_status, assemble_status_for,
    calculate_object_count_usage, calculate_usage,
};
use lazyquota_testenv::fixtures::{self, Fixture};
use lazyquota_testenv::{Flavor, TestNamespace};

/// Seeds run at the same time (each in its own namespace).
const PARALLEL: usize = 4;
/// Bound on each wait for KCM.
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What KCM's registry is built from: the quotable resources of discovery
/// (`ServerPreferredNamespacedResources`, verbs create, list, watch and delete), with the
/// API resource to list each one's objects.
struct Discovered {
    registry: Registry,
    resources: BTreeMap<GroupResource, ApiResource>,
}

async fn discover(client: &Client) -> Discovered {
    let discovery = Discovery::new(client.clone())
        .run_aggregated()
        .await
        .expect("discovery");
    let mut registry = Registry::new(FeatureGates::default());
    let mut resources = BTreeMap::new();
    for group in discovery.groups() {
        let version = group.preferred_version_or_latest().to_owned();
        for (resource, caps) in group.versioned_resources(&version) {
            let quotable = caps.scope == Scope::Namespaced
                && [verbs::CREATE, verbs::LIST, verbs::WATCH, verbs::DELETE]
                    .iter()
                    .all(|verb| caps.supports_operation(verb));
            if !quotable {
                continue;
            }
            let gr = GroupResource::new(resource.group.clone(), resource.plural.clone());
            registry.add_discovered(gr.clone());
            resources.insert(gr, resource);
        }
    }
    Discovered { registry, resources }
}

/// One (quota, key) pair where lazyquota and KCM disagree.
struct Mismatch {
    seed: u64,
    namespace: String,
    quota: String,
    key: String,
    ours: Option<String>,
    kcm: Option<String>,
}

struct SeedReport {
    seed: u64,
    namespace: String,
    summary: String,
    quotas: usize,
    pairs: usize,
    /// Pairs whose value is non-zero (a sanity check that the fixtures charge something).
    nonzero: usize,
    /// Pods with a deletion timestamp already past their grace (charged only to `count/pods`).
    past_grace: usize,
    /// Seconds spent populating, waiting for KCM's first sync, and for the forced resync.
    timings: [f64; 3],
    mismatches: Vec<Mismatch>,
}

/// What [`compare`] found.
struct Comparison {
    quotas: usize,
    pairs: usize,
    nonzero: usize,
    past_grace: usize,
    mismatches: Vec<Mismatch>,
}

fn now() -> Time {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_nanos();
    Time::from_unix_nanos(i128::try_from(nanos).expect("nanoseconds fit in i128"))
}

fn parse(q: &K8sQuantity) -> Option<Quantity> {
    Quantity::parse_k8s(q).ok()
}

/// Lists the namespace and recomputes every quota as `syncResourceQuota` would, comparing
/// with the status KCM wrote.
#[allow(clippy::too_many_lines)] // the controller's whole sync, spelled out
async fn compare(client: &Client, discovered: &Discovered, fixture: &Fixture) -> Comparison {
    let ns = fixture.namespace.as_str();
    let gates = discovered.registry.gates();
    let interner = Interner::new();
    let lp = ListParams::default();

    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .expect("list pods");
    let pods: Vec<PodProjection> = pods
        .items
        .iter()
        .map(|p| {
            PodProjection::from_pod(p, gates, &interner)
                .strict()
                .expect("pod quantities parse")
        })
        .collect();
    let now = now();
    let past_grace = pods
        .iter()
        .filter(|p| !p.is_charged(now) && p.is_charged(Time::from_unix_seconds(0)))
        .count();
    let services = Api::<Service>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .expect("list services");
    let services: Vec<ServiceProjection> = services
        .items
        .iter()
        .map(ServiceProjection::from_service)
        .collect();
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .expect("list pvcs");
    let pvcs: Vec<PvcProjection> = pvcs
        .items
        .iter()
        .map(|p| {
            PvcProjection::from_pvc(p, &interner)
                .strict()
                .expect("pvc quantities parse")
        })
        .collect();
    let quotas = Api::<ResourceQuota>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .expect("list quotas")
        .items;

    // Object counts per resource, listed on demand (metadata only, like KCM's count monitors).
    let mut counts: BTreeMap<GroupResource, u64> = BTreeMap::new();
    let mut pairs = 0;
    let mut nonzero = 0;
    let mut mismatches = Vec::new();
    for quota in &quotas {
        let name = quota.metadata.name.clone().unwrap_or_default();
        let spec = QuotaSpec::from_resource_quota(quota);
        let keys: Vec<&str> = spec.hard_keys.iter().map(String::as_str).collect();
        let plan = discovered.registry.plan(&keys);
        let mut results: Vec<(Evaluator, Option<ResourceList>)> = Vec::new();
        for (evaluator, requested) in &plan.per_evaluator {
            let used = match evaluator {
                Evaluator::Pods => calculate_usage(requested, &spec.scopes, pods.iter(), now, gates).used,
                Evaluator::Services => {
                    calculate_usage(requested, &spec.scopes, services.iter(), now, gates).used
                }
                Evaluator::PersistentVolumeClaims => {
                    calculate_usage(requested, &spec.scopes, pvcs.iter(), now, gates).used
                }
                Evaluator::ObjectCount(gr) => {
                    if !counts.contains_key(gr) {
                        let resource = discovered
                            .resources
                            .get(gr)
                            .unwrap_or_else(|| panic!("{gr} has an evaluator, so discovery served it"));
                        let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, resource);
                        let list = api.list_metadata(&lp).await.expect("list for a count");
                        counts.insert(gr.clone(), list.items.len() as u64);
                    }
                    calculate_object_count_usage(requested, &spec.scopes, counts[gr])
                }
                Evaluator::ResourceClaims => {
                    panic!("fixture quota {name} lists a resourceclaims name: {requested:?}")
                }
            };
            results.push((evaluator.clone(), Some(used)));
        }
        let new_usage = plan.merge(&results);
        let spec_hard = quota.spec.as_ref().and_then(|s| s.hard.as_ref());
        // A fresh quota only ever had status written by the controller: what it would write
        // from scratch must be exactly what is there.
        let ours = assemble_status(spec_hard, None, None, &new_usage).used;
        let empty = BTreeMap::new();
        let kcm = quota
            .status
            .as_ref()
            .and_then(|s| s.used.as_ref())
            .unwrap_or(&empty);
        let mut all_keys: BTreeSet<&String> = ours.keys().chain(kcm.keys()).collect();
        all_keys.extend(spec.hard_keys.iter());
        let mut quota_ok = true;
        for key in all_keys {
            pairs += 1;
            let (a, b) = (ours.get(key), kcm.get(key));
            nonzero += usize::from(b.and_then(parse).is_some_and(|q| !q.is_zero()));
            let equal = match (a, b) {
                (None, None) => true,
                (Some(a), Some(b)) => parse(a).is_some() && parse(a) == parse(b),
                _ => false,
            };
            if !equal {
                quota_ok = false;
                mismatches.push(Mismatch {
                    seed: fixture.seed,
                    namespace: ns.to_owned(),
                    quota: name.clone(),
                    key: key.clone(),
                    ours: a.map(|q| q.0.clone()),
                    kcm: b.map(|q| q.0.clone()),
                });
            }
        }
        // And KCM's status must be a fixpoint: our sync over it would not write.
        let decision = assemble_status_for(quota, &new_usage);
        if quota_ok && decision.dirty {
            mismatches.push(Mismatch {
                seed: fixture.seed,
                namespace: ns.to_owned(),
                quota: name.clone(),
                key: "<status.hard or status.used>".into(),
                ours: Some(format!("a status write would be due: {:?}", decision.hard)),
                kcm: Some(format!("{:?}", quota.status)),
            });
        }
    }
    Comparison {
        quotas: quotas.len(),
        pairs,
        nonzero,
        past_grace,
        mismatches,
    }
}

async fn run_seed(client: Client, discovered: &Discovered, seed: u64) -> SeedReport {
    let ns = TestNamespace::create(Flavor::KcmQuota, &format!("parity-{seed}"))
        .await
        .expect("namespace");
    let mut clock = Instant::now();
    let mut lap = || {
        let elapsed = clock.elapsed().as_secs_f64();
        clock = Instant::now();
        elapsed
    };
    let fixture = fixtures::populate(&ns, seed)
        .await
        .unwrap_or_else(|e| panic!("populating seed {seed}: {e}"));
    let populated = lap();
    fixture
        .wait_for_status(&ns, SYNC_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let synced = lap();
    fixture
        .force_recalculation(&ns, SYNC_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let resynced = lap();
    let comparison = compare(&client, discovered, &fixture).await;
    let keep = !comparison.mismatches.is_empty() && std::env::var_os("LAZYQUOTA_PARITY_KEEP").is_some();
    if keep {
        std::mem::forget(ns);
    } else {
        fixture.release(&ns).await.unwrap_or_else(|e| panic!("{e}"));
        ns.delete().await.expect("delete namespace");
    }
    SeedReport {
        seed,
        namespace: fixture.namespace.clone(),
        summary: fixture.summary.to_string(),
        quotas: comparison.quotas,
        pairs: comparison.pairs,
        nonzero: comparison.nonzero,
        past_grace: comparison.past_grace,
        timings: [populated, synced, resynced],
        mismatches: comparison.mismatches,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_used_matches_kcm_for_seeded_fixtures() {
    let started = Instant::now();
    let seeds = env_u64("LAZYQUOTA_PARITY_SEEDS", 20);
    let first = env_u64("LAZYQUOTA_PARITY_SEED", 1);

    // The control plane (and its client) first: the namespaces below share it.
    let probe = TestNamespace::create(Flavor::KcmQuota, "parity-probe")
        .await
        .expect("namespace");
    let client = probe.client();
    probe.delete().await.expect("delete namespace");
    let discovered = discover(&client).await;

    let discovered = &discovered;
    let reports: Vec<SeedReport> = stream::iter(first..first + seeds)
        .map(|seed| run_seed(client.clone(), discovered, seed))
        .buffer_unordered(PARALLEL)
        .collect()
        .await;

    let mut reports = reports;
    reports.sort_by_key(|r| r.seed);
    let mut pairs = 0;
    let mut quotas = 0;
    let mut mismatches = Vec::new();
    for report in reports {
        let [populated, synced, resynced] = report.timings;
        println!(
            "seed {:>3} ({}): {} quotas, {} (quota, key) pairs ({} non-zero), {} mismatches; {}, \
             {} past deletion grace; populate {populated:.1}s, sync {synced:.1}s, resync {resynced:.1}s",
            report.seed,
            report.namespace,
            report.quotas,
            report.pairs,
            report.nonzero,
            report.mismatches.len(),
            report.summary,
            report.past_grace,
        );
        pairs += report.pairs;
        quotas += report.quotas;
        mismatches.extend(report.mismatches);
    }
    println!(
        "parity: {seeds} seeds, {quotas} quotas, {pairs} (quota, key) pairs compared with KCM, \
         {} mismatches, {:.1}s",
        mismatches.len(),
        started.elapsed().as_secs_f64()
    );

    if !mismatches.is_empty() {
        let mut diff = String::new();
        for m in &mismatches {
            let _ = writeln!(
                diff,
                "  seed {} ns {} quota {} key {}: ours {} kcm {}",
                m.seed,
                m.namespace,
                m.quota,
                m.key,
                m.ours.as_deref().unwrap_or("<absent>"),
                m.kcm.as_deref().unwrap_or("<absent>"),
            );
        }
        panic!(
            "{} (quota, key) pairs differ from KCM (replay one with LAZYQUOTA_PARITY_SEED=<seed> \
             LAZYQUOTA_PARITY_SEEDS=1):\n{diff}",
            mismatches.len()
        );
    }
    assert!(
        pairs >= 50 * usize::try_from(seeds).unwrap_or(usize::MAX).min(20),
        "too few (quota, key) pairs compared: {pairs}"
    );
}
