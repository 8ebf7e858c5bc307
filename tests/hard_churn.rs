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
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use common::{controller, env_u64, quota, test_config};
use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota};
use kube::api::{ListParams, PostParams};
use lazyquota_testenv::{
    ControlPlane, Flavor, TestNamespace,
    churn::{Tally, count_exactly, status_writes, write},
};

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
    /// What the writers did.
    tally: Tally,
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
            self.tally.creates,
            self.tally.deletes,
            self.tally.denials,
            self.tally.other_errors + self.tally.unknown,
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
    let stop = Arc::new(AtomicBool::new(false));
    let counter = tokio::spawn(count_exactly(configmaps.clone(), stop.clone()));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(write(configmaps.clone(), seed * 100 + w, deadline, tally.clone())))
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
    stop.store(true, Ordering::SeqCst);
    let peak = counter.await.expect("counter");
    assert_eq!(
        peak.gaps, 0,
        "the counting watch was resumed where it ended every time: the peak is exact"
    );
    let name = ns.name().to_owned();
    ns.delete().await.expect("delete namespace");
    let audit_log = cp.kubeconfig().with_file_name("kube-apiserver.audit.log");
    let (writes_ok, writes_refused) = status_writes(&audit_log, Some(&name));
    let mut f = Figures {
        tally: *tally.lock().unwrap(),
        ..Figures::default()
    };
    f.peak = peak.peak;
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
            f.tally.denials > 0,
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
