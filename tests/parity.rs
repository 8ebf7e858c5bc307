//! Differential parity: `status.used` as lazyquota computes it against what the real
//! kube-controller-manager (its own resourcequota controller, of whichever release the test
//! control plane runs) wrote, value for value.
//!
//! Per seed, [`fixtures::populate`] fills a fresh namespace with objects and then quotas over
//! every scope and resource name family (DRA included where served); once KCM has synced every
//! quota, each quota's spec is touched to force one final recalculation over settled objects.
//! The test then computes every quota as `lazyquota usage` does — discovery, the Engine (every
//! evaluator, the DeviceClass mapping) over direct lists, with the feature gates of the
//! server's release — and compares with KCM's `status.used` by value, key sets included, and
//! checks that KCM's status is a fixpoint (no write would be due).
//!
//! Environment: `LAZYQUOTA_PARITY_SEEDS` (number of seeds, default 20),
//! `LAZYQUOTA_PARITY_SEED` (first seed, default 1; replay one failing seed with
//! `LAZYQUOTA_PARITY_SEED=<seed> LAZYQUOTA_PARITY_SEEDS=1`), `LAZYQUOTA_PARITY_KEEP=1` (keep the
//! namespaces of seeds that failed, for inspection).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use lazyquota_index::keys::ClusterName;
use lazyquota_kube::operate::report;
use lazyquota_quota::{Evaluator, FeatureGates, Interner, PodProjection, Quantity, Time, evaluators_for_key};
use lazyquota_testenv::fixtures::{self, Fixture};
use lazyquota_testenv::{ControlPlane, Flavor, TestNamespace};

mod common;
use common::{env_u64, process::Lazyquota};

/// Seeds run at the same time (each in its own namespace).
const PARALLEL: usize = 4;
/// Bound on each wait for KCM.
const SYNC_TIMEOUT: Duration = Duration::from_mins(1);

/// The evaluators that compute a key, as the matrix in docs/parity.md groups pairs:
/// `pods`, `services`, `persistentvolumeclaims`, `resourceclaims`, `object count`, joined
/// with `+` when several do, `none` when none does (the key stays absent).
fn family(key: &str, gates: FeatureGates) -> String {
    let names: BTreeSet<&str> = evaluators_for_key(key, gates)
        .iter()
        .map(|e| match e {
            Evaluator::Pods => "pods",
            Evaluator::Services => "services",
            Evaluator::PersistentVolumeClaims => "persistentvolumeclaims",
            Evaluator::ResourceClaims => "resourceclaims",
            Evaluator::ObjectCount(_) => "object count",
        })
        .collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.into_iter().collect::<Vec<_>>().join("+")
    }
}

/// The feature gates of the server's release, as `lazyquota run` picks them.
async fn server_gates(client: &Client) -> FeatureGates {
    let version = client.apiserver_version().await.expect("server version");
    let (gates, _) = FeatureGates::for_version(&version.git_version);
    println!(
        "parity: Kubernetes {} (semantics of 1.{}; {})",
        version.git_version,
        gates.minor,
        gates.describe()
    );
    gates
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
    by_evaluator: BTreeMap<String, (usize, usize)>,
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
    /// Pairs and mismatches per evaluator family of the key (see [`family`]).
    by_evaluator: BTreeMap<String, (usize, usize)>,
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

/// Computes every quota of the namespace as `lazyquota usage` does (discovery, the Engine
/// over direct lists) and compares with the status KCM wrote.
async fn compare(client: &Client, gates: FeatureGates, fixture: &Fixture) -> Comparison {
    let ns = fixture.namespace.as_str();
    let interner = Interner::new();
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list pods");
    let now = now();
    let past_grace = pods
        .items
        .iter()
        .map(|p| PodProjection::from_pod(p, gates, &interner).projection)
        .filter(|p| !p.is_charged(now) && p.is_charged(Time::from_unix_seconds(0)))
        .count();
    let ours = report::usage(client, &ClusterName::new("parity"), Some(ns), gates, false)
        .await
        .expect("lazyquota usage");
    let quotas = Api::<ResourceQuota>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list quotas")
        .items;
    let mut pairs = 0;
    let mut nonzero = 0;
    let mut mismatches = Vec::new();
    let mut by_evaluator = BTreeMap::new();
    for quota in &quotas {
        let name = quota.metadata.name.clone().unwrap_or_default();
        let mine = ours
            .iter()
            .find(|q| q.name == name)
            .expect("usage reports every quota");
        let empty = BTreeMap::new();
        let kcm = quota
            .status
            .as_ref()
            .and_then(|s| s.used.as_ref())
            .unwrap_or(&empty);
        let mut all_keys: BTreeSet<&String> = kcm.keys().collect();
        all_keys.extend(mine.keys.iter().map(|k| &k.key));
        let mut quota_ok = true;
        for key in all_keys {
            pairs += 1;
            let tally = by_evaluator.entry(family(key, gates)).or_insert((0, 0));
            tally.0 += 1;
            let computed = mine.keys.iter().find(|k| &k.key == key);
            let a = computed.and_then(|k| k.computed.clone());
            let b = kcm.get(key);
            nonzero += usize::from(b.and_then(parse).is_some_and(|q| !q.is_zero()));
            let equal = match (&a, b) {
                (None, None) => true,
                (Some(a), Some(b)) => {
                    let a = parse(&K8sQuantity(a.clone()));
                    a.is_some() && a == parse(b)
                }
                _ => false,
            };
            if !equal {
                quota_ok = false;
                tally.1 += 1;
                mismatches.push(Mismatch {
                    seed: fixture.seed,
                    namespace: ns.to_owned(),
                    quota: name.clone(),
                    key: key.clone(),
                    ours: a.or_else(|| {
                        computed
                            .and_then(|k| k.unknown.clone())
                            .map(|u| format!("unknown: {u}"))
                    }),
                    kcm: b.map(|q| q.0.clone()),
                });
            }
        }
        // And KCM's status must be a fixpoint: our sync over it would not write.
        if quota_ok && mine.write_due {
            mismatches.push(Mismatch {
                seed: fixture.seed,
                namespace: ns.to_owned(),
                quota: name.clone(),
                key: "<status.hard or status.used>".into(),
                ours: Some("a status write would be due".into()),
                kcm: Some(format!("{:?}", quota.status)),
            });
        }
    }
    Comparison {
        quotas: quotas.len(),
        pairs,
        by_evaluator,
        nonzero,
        past_grace,
        mismatches,
    }
}

/// A seed's namespace, kept for the end-to-end phase.
struct Kept {
    ns: TestNamespace,
    fixture: Fixture,
}

async fn run_seed(client: Client, gates: FeatureGates, seed: u64) -> (SeedReport, Option<Kept>) {
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
    let comparison = compare(&client, gates, &fixture).await;
    let namespace = fixture.namespace.clone();
    let summary = fixture.summary.to_string();
    let keep = !comparison.mismatches.is_empty() && std::env::var_os("LAZYQUOTA_PARITY_KEEP").is_some();
    let kept = if keep {
        std::mem::forget(ns);
        None
    } else {
        Some(Kept { ns, fixture })
    };
    let report = SeedReport {
        by_evaluator: comparison.by_evaluator,
        seed,
        namespace,
        summary,
        quotas: comparison.quotas,
        pairs: comparison.pairs,
        nonzero: comparison.nonzero,
        past_grace: comparison.past_grace,
        timings: [populated, synced, resynced],
        mismatches: comparison.mismatches,
    };
    (report, kept)
}

/// KCM's `status.used` of every quota of the kept namespaces: (namespace, quota) → used.
type UsedByQuota = BTreeMap<(String, String), BTreeMap<String, K8sQuantity>>;

async fn used_by_quota(client: &Client, kept: &[Kept]) -> UsedByQuota {
    let mut out = BTreeMap::new();
    for k in kept {
        let quotas = Api::<ResourceQuota>::namespaced(client.clone(), &k.fixture.namespace)
            .list(&ListParams::default())
            .await
            .expect("list quotas");
        for q in quotas.items {
            let used = q.status.and_then(|s| s.used).unwrap_or_default();
            out.insert(
                (k.fixture.namespace.clone(), q.metadata.name.unwrap_or_default()),
                used,
            );
        }
    }
    out
}

/// The (namespace, quota, key) triples where `got` (lazyquota's writes) differs from `want`
/// (KCM's) by value or presence; `seed_of` names each namespace's seed.
fn differences(want: &UsedByQuota, got: &UsedByQuota, seed_of: &dyn Fn(&str) -> u64) -> Vec<Mismatch> {
    let empty = BTreeMap::new();
    let mut out = Vec::new();
    for ((ns, quota), expected) in want {
        let actual = got.get(&(ns.clone(), quota.clone())).unwrap_or(&empty);
        let keys: BTreeSet<&String> = expected.keys().chain(actual.keys()).collect();
        for key in keys {
            let (a, b) = (actual.get(key), expected.get(key));
            let equal = match (a, b) {
                (Some(a), Some(b)) => parse(a).is_some() && parse(a) == parse(b),
                (None, None) => true,
                _ => false,
            };
            if !equal {
                out.push(Mismatch {
                    seed: seed_of(ns),
                    namespace: ns.clone(),
                    quota: format!("{quota} (through the controller)"),
                    key: key.clone(),
                    ours: a.map(|q| q.0.clone()),
                    kcm: b.map(|q| q.0.clone()),
                });
            }
        }
    }
    out
}

/// Parity end to end, through the controller: with KCM frozen, every `status.used` of the
/// kept namespaces is blanked, `lazyquota run` (lazy mode, the real binary) writes them
/// again, and every (quota, key) must equal what KCM had written. Returns the differences
/// that remain after `SYNC_TIMEOUT` twice over, and how many pairs were compared.
async fn through_the_controller(client: &Client, kept: &[Kept]) -> (usize, Vec<Mismatch>) {
    let want = used_by_quota(client, kept).await;
    let pairs = want.values().map(BTreeMap::len).sum();
    let control_plane = ControlPlane::get(Flavor::KcmQuota);
    let _paused = control_plane.pause("kube-controller-manager");
    for (ns, quota) in want.keys() {
        Api::<ResourceQuota>::namespaced(client.clone(), ns)
            .patch_status(
                quota,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"used": null}})),
            )
            .await
            .expect("blank status.used");
    }
    let blanked = used_by_quota(client, kept).await;
    assert!(
        blanked.values().all(BTreeMap::is_empty),
        "every status.used is blank before lazyquota runs"
    );
    let seed_of = |ns: &str| {
        kept.iter()
            .find(|k| k.fixture.namespace == ns)
            .map_or(0, |k| k.fixture.seed)
    };
    let lazyquota = Lazyquota::start(control_plane.kubeconfig(), &[]);
    let started = Instant::now();
    let mut left = Vec::new();
    while started.elapsed() < 2 * SYNC_TIMEOUT {
        left = differences(&want, &used_by_quota(client, kept).await, &seed_of);
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "parity through the controller: {pairs} (quota, key) pairs written by lazyquota run in {:.1}s, {} differ",
        started.elapsed().as_secs_f64(),
        left.len()
    );
    if !left.is_empty() {
        println!("lazyquota's log:\n{}", lazyquota.log());
    }
    drop(lazyquota);
    (pairs, left)
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
    let gates = server_gates(&client).await;

    let outcomes: Vec<(SeedReport, Option<Kept>)> = stream::iter(first..first + seeds)
        .map(|seed| run_seed(client.clone(), gates, seed))
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let (mut reports, kept): (Vec<SeedReport>, Vec<Option<Kept>>) = outcomes.into_iter().unzip();
    let kept: Vec<Kept> = kept.into_iter().flatten().collect();
    let (e2e_pairs, e2e_mismatches) = through_the_controller(&client, &kept).await;
    for k in kept {
        k.fixture.release(&k.ns).await.unwrap_or_else(|e| panic!("{e}"));
        k.ns.delete().await.expect("delete namespace");
    }
    reports.sort_by_key(|r| r.seed);
    let mut pairs = 0;
    let mut quotas = 0;
    let mut mismatches = Vec::new();
    let mut by_evaluator: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for report in reports {
        for (family, (p, m)) in &report.by_evaluator {
            let tally = by_evaluator.entry(family.clone()).or_default();
            tally.0 += p;
            tally.1 += m;
        }
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
         {} mismatches; through the controller: {e2e_pairs} pairs, {} mismatches; {:.1}s",
        mismatches.len(),
        e2e_mismatches.len(),
        started.elapsed().as_secs_f64()
    );
    // One line per evaluator family, read by scripts/parity-matrix.sh.
    for (family, (p, m)) in &by_evaluator {
        println!("parity by evaluator: {family}: {p} pairs, {m} mismatches");
    }
    mismatches.extend(e2e_mismatches);

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
    assert!(
        e2e_pairs >= pairs / 2,
        "too few pairs written by the controller: {e2e_pairs}"
    );
}
