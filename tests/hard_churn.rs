//! Tenants writing against `hard` on the real control plane: six writers create and delete
//! ConfigMaps as fast as they can under a quota `count/configmaps: 30`, in one namespace and
//! then in a second one (the first deleted before). Quota admission charges every create in
//! `status.used` before the object is stored, so a status write computed from caches that do
//! not hold a charged object yet takes the charge back and lets the next create past `hard`
//! (kubernetes #123434), and a write response applied over a newer view of the quota leaves it
//! full while it is nearly empty.
//!
//! The objects are counted exactly, from a watch in resourceVersion order (a periodic list can
//! miss a peak). Asserted for lazyquota as the only writer: the namespace never holds more than
//! `hard`, the writers did reach `hard` (admission refused some creates), and `status.used`
//! equals the objects within 10 s after the writers stop. The same load runs first with KCM's
//! own controller in its control plane, and the figures of both are printed side by side;
//! status writes are counted from the apiserver's audit log (tests/control-plane/start.sh).
//!
//! Bounded: `LAZYQUOTA_CHURN_SECS` seconds of writing per namespace (default 15) and
//! `LAZYQUOTA_CHURN_RUNS` runs of the pair (default 1); `LAZYQUOTA_CHURN_OUT=FILE` also writes
//! the figures to FILE (markdown, naming the commit). The soak:
//! `LAZYQUOTA_CHURN_RUNS=10 LAZYQUOTA_CHURN_SECS=60 LAZYQUOTA_CHURN_OUT=benches/results/hard-churn/soak.md
//! cargo test --test hard_churn -- --nocapture`.

mod common;

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use common::{controller, env_u64, quota, test_config};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota};
use kube::{
    Api,
    api::{DeleteParams, ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams},
};
use lazyquota_testenv::{ControlPlane, Flavor, TestNamespace, fixtures::SplitMix64};

const HARD: u64 = 30;
const WRITERS: u64 = 6;
const KEY: &str = "count/configmaps";
/// After the writers stop, `status.used` must equal the objects within this, plus the charge
/// bound: a create admission charged and then refused (its retry path charges a request its
/// first pass refused) is held until the bound, as one still in flight would be.
const CONVERGE: Duration = Duration::from_secs(10);

/// What one run in one namespace showed.
#[derive(Debug, Default)]
struct Figures {
    /// Most ConfigMaps the namespace held at once (from the watch, in resourceVersion order).
    peak: u64,
    creates: u64,
    deletes: u64,
    /// Creates refused by quota admission ("exceeded quota").
    denials: u64,
    /// Any other error the writers got.
    other_errors: u64,
    /// From the writers' stop until `status.used` equalled the objects (None: not within
    /// [`CONVERGE`]).
    converged: Option<Duration>,
    /// Status writes by the quota controller (not admission) during the run: successful and
    /// refused (409 and others), from the audit log.
    writes_ok: u64,
    writes_refused: u64,
    /// lazyquota: charges no object paid for, dropped at the bound (creates admission charged
    /// and refused) — from the run's start until it converged; `None` for KCM, which keeps no
    /// such count.
    charges_expired: Option<u64>,
    seconds: f64,
}

impl Figures {
    fn line(&self, who: &str, ns: &str) -> String {
        format!(
            "{who:<9} {ns:<28} peak {:>2}/{HARD}  creates {:>5}  deletes {:>5}  denied {:>6}  other errors {:>3}  converged {:>9}  status writes {:>5} ok + {:>5} refused ({:.1}/s)  charges expired {:>3}",
            self.peak,
            self.creates,
            self.deletes,
            self.denials,
            self.other_errors,
            self.converged
                .map_or_else(|| "never".to_owned(), |d| format!("{:.2} s", d.as_secs_f64())),
            self.writes_ok,
            self.writes_refused,
            f64::from(u32::try_from(self.writes_ok + self.writes_refused).unwrap_or(u32::MAX)) / self.seconds,
            self.charges_expired
                .map_or_else(|| "-".to_string(), |n| n.to_string()),
        )
    }
}

/// Counts the namespace's ConfigMaps from a list and then its watch, every event in order;
/// returns the peak once `stop` is set.
async fn count_exactly(api: Api<ConfigMap>, stop: Arc<AtomicU64>) -> u64 {
    let list = api.list_metadata(&ListParams::default()).await.expect("list");
    let mut count = list.items.len() as u64;
    let mut peak = count;
    let mut rv = list.metadata.resource_version.expect("list resourceVersion");
    while stop.load(Ordering::SeqCst) == 0 {
        let params = WatchParams::default().timeout(5);
        let mut events = api.watch_metadata(&params, &rv).await.expect("watch").boxed();
        while let Some(event) = events.try_next().await.expect("watch stream") {
            match event {
                WatchEvent::Added(o) => {
                    count += 1;
                    peak = peak.max(count);
                    rv = o.metadata.resource_version.unwrap_or(rv);
                }
                WatchEvent::Deleted(o) => {
                    count -= 1;
                    rv = o.metadata.resource_version.unwrap_or(rv);
                }
                WatchEvent::Modified(o) => rv = o.metadata.resource_version.unwrap_or(rv),
                WatchEvent::Bookmark(b) => rv = b.metadata.resource_version,
                WatchEvent::Error(e) => {
                    panic!("the counting watch failed ({e:?}): the peak would not be exact")
                }
            }
        }
    }
    peak
}

/// One writer: until `deadline`, create (60 %) or delete one of the ConfigMaps it made (40 %).
async fn write(api: Api<ConfigMap>, seed: u64, deadline: Instant, figures: Arc<Mutex<Figures>>) {
    let mut rng = SplitMix64::new(seed);
    let mut mine: Vec<String> = Vec::new();
    // A bound on the loop besides the deadline.
    for _ in 0..200_000 {
        if Instant::now() >= deadline {
            break;
        }
        if rng.chance(40) && !mine.is_empty() {
            let name = mine.swap_remove(usize::try_from(rng.below(mine.len() as u64)).expect("an index"));
            let result = api.delete(&name, &DeleteParams::default()).await;
            let mut f = figures.lock().unwrap();
            match result {
                Ok(_) => f.deletes += 1,
                Err(_) => f.other_errors += 1,
            }
            continue;
        }
        let cm = ConfigMap {
            metadata: ObjectMeta {
                generate_name: Some("w-".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let result = api.create(&PostParams::default(), &cm).await;
        let mut f = figures.lock().unwrap();
        match result {
            Ok(created) => {
                f.creates += 1;
                mine.push(created.metadata.name.expect("a generated name"));
            }
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("exceeded quota") => {
                f.denials += 1;
            }
            Err(e) => {
                f.other_errors += 1;
                if std::env::var("LAZYQUOTA_CHURN_ERRORS").is_ok() {
                    eprintln!("create failed: {e}");
                }
            }
        }
    }
}

/// Status writes to quotas of `namespace` in the apiserver's audit log, by user other than
/// the apiserver itself (quota admission): (successful, refused).
fn controller_writes(cp: &ControlPlane, namespace: &str) -> (u64, u64) {
    let log = cp.kubeconfig().with_file_name("kube-apiserver.audit.log");
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("reading {}: {e}", log.display()));
    let (mut ok, mut refused) = (0, 0);
    for line in text.lines() {
        let entry: serde_json::Value = serde_json::from_str(line).expect("an audit entry");
        if entry["stage"] != "ResponseComplete"
            || entry["objectRef"]["namespace"] != namespace
            || entry["user"]["username"] == "system:apiserver"
        {
            continue;
        }
        if entry["responseStatus"]["code"].as_u64().is_some_and(|c| c < 300) {
            ok += 1;
        } else {
            refused += 1;
        }
    }
    (ok, refused)
}

/// The churn in a fresh namespace of `flavor`, which is deleted after.
async fn churn(flavor: Flavor, seconds: u64, seed: u64) -> (String, Figures) {
    let cp = ControlPlane::get(flavor);
    let ns = TestNamespace::create(flavor, "hard").await.expect("namespace");
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(&PostParams::default(), &quota("q", &[(KEY, &HARD.to_string())]))
        .await
        .expect("quota");
    let configmaps = ns.api::<ConfigMap>();
    let used_of = |q: ResourceQuota| -> Option<u64> { q.status?.used?.get(KEY)?.0.parse().ok() };
    let ready = lazyquota_testenv::eventually(Duration::from_secs(30), || async {
        used_of(quotas.get("q").await.ok()?)
    })
    .await;
    assert!(ready.is_some(), "the quota got a status.used");

    let expired = || common::controller_counter_with("lazyquota_charges_expired_total", &[]);
    let expired_before = expired();
    let stop = Arc::new(AtomicU64::new(0));
    let counter = tokio::spawn(count_exactly(configmaps.clone(), stop.clone()));
    let figures = Arc::new(Mutex::new(Figures::default()));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            tokio::spawn(write(
                configmaps.clone(),
                seed * 100 + w,
                deadline,
                figures.clone(),
            ))
        })
        .collect();
    for writer in writers {
        writer.await.expect("writer");
    }
    let stopped = Instant::now();
    let bound = if flavor == Flavor::LazyquotaOnly {
        Duration::from_millis(lazyquota_index::charges::DEFAULT_BOUND_MS)
    } else {
        Duration::ZERO
    };
    let converged = lazyquota_testenv::eventually(CONVERGE + bound, || async {
        let objects = configmaps
            .list_metadata(&ListParams::default())
            .await
            .ok()?
            .items
            .len() as u64;
        (used_of(quotas.get("q").await.ok()?)? == objects).then_some(())
    })
    .await
    .map(|()| stopped.elapsed());
    stop.store(1, Ordering::SeqCst);
    let peak = counter.await.expect("counter");
    let name = ns.name().to_owned();
    ns.delete().await.expect("delete namespace");
    let (writes_ok, writes_refused) = controller_writes(cp, &name);
    let mut f = Arc::into_inner(figures)
        .expect("writers done")
        .into_inner()
        .unwrap();
    f.peak = peak;
    f.converged = converged;
    f.writes_ok = writes_ok;
    f.writes_refused = writes_refused;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // a counter's value
    {
        f.charges_expired = (flavor == Flavor::LazyquotaOnly).then(|| (expired() - expired_before) as u64);
    }
    f.seconds = (stopped - started).as_secs_f64();
    (name, f)
}

/// The figures as a result file naming the commit they were measured at.
fn write_results(path: &str, seconds: u64, runs: u64, lines: &[String]) {
    let commit = std::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let text = format!(
        "# Writers racing against `hard`\n\nMeasured by `tests/hard_churn.rs` at commit `{commit}`: {runs} run(s), \
         {WRITERS} writers for {seconds} s per namespace, quota `{KEY}: {HARD}`, KCM's controller and then \
         lazyquota (the only writer) on Kubernetes v1.36.3, two namespaces each. Peak: most ConfigMaps \
         at once, from a watch in resourceVersion order. Status writes: the quota controller's (not \
         admission's), from the apiserver's audit log.\n\n```\n{}\n```\n",
        lines.join("\n")
    );
    if let Some(dir) = std::path::Path::new(path).parent() {
        std::fs::create_dir_all(dir).expect("result directory");
    }
    std::fs::write(path, text).expect("result file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_racing_against_hard_never_get_past_it_and_status_converges() {
    let seconds = env_u64("LAZYQUOTA_CHURN_SECS", 15);
    let runs = env_u64("LAZYQUOTA_CHURN_RUNS", 1);
    let (mut lines, mut all) = (Vec::new(), Vec::new());
    let mut lazy: BTreeMap<String, Figures> = BTreeMap::new();
    for run in 0..runs {
        // KCM's own controller first (its control plane runs no lazyquota), then lazyquota as
        // the only writer; each in a first namespace and then a second.
        for i in 0..2 {
            let (ns, f) = churn(Flavor::KcmQuota, seconds, 2 * run + i).await;
            lines.push(f.line("KCM", &ns));
        }
        let _lazyquota = controller(Flavor::LazyquotaOnly, test_config());
        for i in 0..2 {
            let (ns, f) = churn(Flavor::LazyquotaOnly, seconds, 2 * run + i).await;
            lines.push(f.line("lazyquota", &ns));
            lazy.insert(ns, f);
        }
        eprintln!("{}", lines.join("\n"));
        all.append(&mut lines);
    }
    if let Ok(path) = std::env::var("LAZYQUOTA_CHURN_OUT") {
        write_results(&path, seconds, runs, &all);
    }
    for (ns, f) in &lazy {
        assert!(
            f.denials > 0,
            "{ns}: the writers reached hard (admission refused creates): {f:?}"
        );
        assert!(
            f.peak <= HARD,
            "{ns}: the namespace held {} ConfigMaps, past hard {HARD}: {f:?}",
            f.peak
        );
        assert!(
            f.converged.is_some(),
            "{ns}: status.used equalled the objects within {CONVERGE:?} and the charge bound after the writers stopped: {f:?}"
        );
    }
}
