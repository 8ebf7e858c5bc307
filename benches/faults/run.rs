//! One fault against one controller on a fresh control plane: an unrelated namespace churning
//! against `count/configmaps: 30`, the fault injected a quarter into the window, five new
//! quotas in fresh namespaces during it, then how long until every status is there and right.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    core::v1::{ConfigMap, Namespace, ResourceQuota},
    events::v1::Event,
};
use kube::{
    Api, Client,
    api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use lazyquota_testenv::{
    ControlPlane, Flavor,
    churn::{Peak, Tally, count_exactly, status_writes, write},
    eventually_every,
    proxy::CuttingProxy,
};

use crate::common::readings::metric_sum;
use crate::controller::{Deployment, Who};
use crate::fault::{self, Fault};

/// The churning namespace's quota.
pub(crate) const HARD: u64 = 30;
const KEY: &str = "count/configmaps";
const WRITERS: u64 = 6;
/// New quotas created during each fault.
pub(crate) const NEW_QUOTAS: u32 = 5;
/// The clocks of a run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// The churn's length around the fault (a quarter before it, a quarter after).
    pub(crate) window: Duration,
    /// How long after a fault's end a quota may be without a status before it counts as none.
    pub(crate) after: Duration,
    /// kube-apiserver's `--request-timeout`, and lazyquota's `--apiserver-request-timeout` with
    /// it: how long lazyquota holds a charge no object paid for.
    pub(crate) request_timeout: Duration,
    /// How long the churning quota's first status is waited for before the churn starts.
    pub(crate) first_status: Duration,
    /// How much longer than the request timeout convergence is waited for.
    pub(crate) margin: Duration,
}

impl Timing {
    /// How long after the writers stop `status.used` may take to equal the objects: lazyquota
    /// holds a charge no object paid for up to the request timeout, plus a margin.
    pub(crate) fn converge(self) -> Duration {
        self.request_timeout + self.margin
    }
}

/// What one run showed.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) fault: Fault,
    pub(crate) who: Who,
    /// The churning namespace's quota first had a status this long after the controller
    /// started (None: not before the churn began).
    pub(crate) first_status: Option<Duration>,
    /// Each new quota's time from its creation to a status holding all its keys (None: none
    /// [`Timing::after`] the fault's end).
    pub(crate) new_quotas: Vec<Option<Duration>>,
    pub(crate) peak: Peak,
    pub(crate) tally: Tally,
    /// From the writers' stop until `status.used` equalled the objects (None: not within
    /// [`Timing::converge`]).
    pub(crate) converged: Option<Duration>,
    /// The controller's status writes (successful, refused) over the run, from the audit log.
    pub(crate) writes: (u64, u64),
    /// Lists of a whole resource type (every namespace) by the controller from the fault's
    /// start on, from the audit log: its relists.
    pub(crate) relists: u64,
    /// lazyquota's own count of watches ended by 410 Gone (None for KCM, which exports none).
    pub(crate) gone: Option<u64>,
    /// Lines of the controller's log, Events, and metric series naming the cause.
    pub(crate) named: (u64, u64, u64),
    /// Processes the harness started again after they exited on their own.
    pub(crate) restarts: u64,
    pub(crate) seconds: f64,
}

impl Outcome {
    /// New quotas without a status [`Timing::after`] the fault's end.
    pub(crate) fn stuck(&self) -> usize {
        self.new_quotas.iter().filter(|t| t.is_none()).count()
    }
}

/// Runs `fault` against `who` on a fresh control plane.
pub(crate) async fn run(fault: Fault, who: Who, timing: Timing) -> Outcome {
    let started = Instant::now();
    let (state, _) = crate::common::start_control_plane_with(
        "faults",
        // No controller manager of the control plane's own: the one under test is the only
        // KCM, so every list its users make is its own in the audit log. Nothing here needs
        // the others (no pods, no namespace deleted).
        &[
            ("LAZYQUOTA_KCM", "off"),
            // Lists and watches in the audit log too: the controller's relists are counted.
            ("LAZYQUOTA_AUDIT_LISTS", "on"),
            ("LAZYQUOTA_APISERVER_ARGS", fault.apiserver_args()),
        ],
    );
    let cp = ControlPlane::attach(&state, Flavor::LazyquotaOnly).expect("the control plane");
    let client = crate::client(&state.join("admin.kubeconfig")).await;
    let outcome = measure(fault, who, timing, &state, &cp, &client).await;
    crate::common::stop_control_plane(&state);
    Outcome {
        seconds: started.elapsed().as_secs_f64(),
        ..outcome
    }
}

async fn measure(
    fault: Fault,
    who: Who,
    timing: Timing,
    state: &Path,
    cp: &ControlPlane,
    client: &Client,
) -> Outcome {
    let window = timing.window;
    create_namespace(client, "churn", Duration::from_secs(10)).await;
    let quotas = Api::<ResourceQuota>::namespaced(client.clone(), "churn");
    quotas
        .create(&PostParams::default(), &quota("q", &churn_hard(fault, false)))
        .await
        .expect("the churning namespace's quota");
    create_namespace(client, "faults", Duration::from_secs(10)).await;
    let webhook = fault::silent_webhook().await;
    if fault.before_start() {
        fault::create_broken_crd(client, webhook, "faults").await;
    }

    // F8's controller reaches the apiserver through a proxy that can black-hole it.
    let proxy = if fault == Fault::F8 {
        let target = cp
            .fact("LAZYQUOTA_APISERVER_URL")
            .and_then(|u| u.strip_prefix("https://"))
            .expect("apiserver address")
            .parse()
            .expect("a socket address");
        let proxy = CuttingProxy::start(target, 1).await.expect("proxy");
        let original = match who {
            Who::Kcm => state.join("kcm.kubeconfig"),
            Who::Lazy => state.join("admin.kubeconfig"),
        };
        proxy
            .kubeconfig(&original, &state.join("proxied.kubeconfig"))
            .expect("proxied kubeconfig");
        Some(proxy)
    } else {
        None
    };
    let controller_start = Instant::now();
    let mut deployment = Deployment::start(
        who,
        state,
        proxy
            .as_ref()
            .map(|_| state.join("proxied.kubeconfig"))
            .as_deref(),
        fault == Fault::F7,
        timing.request_timeout,
    );
    if fault == Fault::F7 {
        // The first replica leads before the second starts.
        wait_for(Duration::from_secs(30), || async {
            deployment.leader().await.is_some()
        })
        .await;
        deployment.add_replica();
    }
    let first_status = wait_for(timing.first_status, || async {
        used_of(&quotas, "q", &[KEY]).await.is_some()
    })
    .await
    .then(|| controller_start.elapsed());

    // The churn, counted exactly.
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), "churn");
    let stop = Arc::new(AtomicBool::new(false));
    let counter = tokio::spawn(count_exactly(configmaps.clone(), stop.clone()));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let duration = fault.duration(window);
    let churn_start = Instant::now();
    let fault_start = churn_start + window / 4;
    let fault_end = fault_start + duration;
    let writers_stop = fault_end + window / 4;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(write(configmaps.clone(), w, writers_stop, tally.clone())))
        .collect();

    tokio::time::sleep_until(fault_start.into()).await;
    let audit_mark = crate::audit_len(state);
    let gone_before = gone(&deployment).await;
    // The new quotas, spread over the fault's window, each timed by a task of its own.
    let new_quotas: Vec<_> = (0..NEW_QUOTAS)
        .map(|i| {
            let client = client.clone();
            let at = fault_start + duration * i / NEW_QUOTAS;
            tokio::spawn(async move {
                tokio::time::sleep_until(at.into()).await;
                new_quota(&client, &format!("new-{i}"), fault_end + timing.after).await
            })
        })
        .collect();
    inject(
        fault,
        &mut deployment,
        cp,
        client,
        webhook,
        proxy.as_ref(),
        fault_end,
    )
    .await;
    if let Some(proxy) = &proxy {
        proxy.set_black_hole(false);
    }
    // Until the writers stop: processes that exited are started again.
    while Instant::now() < writers_stop {
        deployment.keep_running();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for writer in writers {
        writer.await.expect("writer");
    }
    let stopped = Instant::now();
    let converged = loop {
        deployment.keep_running();
        let objects = configmaps
            .list_metadata(&ListParams::default())
            .await
            .map(|l| l.items.len() as u64);
        if let (Ok(objects), Some(used)) = (objects, used_of(&quotas, "q", &[KEY]).await)
            && used[0] == objects
        {
            break Some(stopped.elapsed());
        }
        if stopped.elapsed() > timing.converge() {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    stop.store(true, Ordering::SeqCst);
    let peak = counter.await.expect("counter");
    let mut times = Vec::new();
    for task in new_quotas {
        times.push(task.await.expect("new quota"));
    }
    let audit = state.join("kube-apiserver.audit.log");
    // Before the harness lists Events in every namespace (as the controller's identity).
    let relists = crate::relists(&audit, audit_mark, who);
    let named = named(fault, &deployment, client).await;
    let gone_after = gone(&deployment).await;
    Outcome {
        fault,
        who,
        first_status,
        new_quotas: times,
        peak,
        tally: *tally.lock().expect("tally"),
        converged,
        writes: status_writes(&audit, None),
        relists,
        gone: (who == Who::Lazy).then(|| gone_after.saturating_sub(gone_before)),
        named,
        restarts: deployment.restarts,
        seconds: 0.0,
    }
}

/// Injects `fault` at once and returns when it is over (at `end`, or once the restarted
/// component is healthy if that is later).
async fn inject(
    fault: Fault,
    deployment: &mut Deployment,
    cp: &ControlPlane,
    client: &Client,
    webhook: u16,
    proxy: Option<&CuttingProxy>,
    end: Instant,
) {
    match fault {
        Fault::F1 => {}
        Fault::F2 => fault::create_broken_crd(client, webhook, "faults").await,
        Fault::F3 => fault::create_ghost_apiservice(client, "faults").await,
        Fault::F4 => cp.kill_and_restart("kube-apiserver").await,
        Fault::F5 | Fault::F5NoCache => {
            cp.compact_etcd().await.expect("etcd compacted");
            cp.kill_and_restart("etcd").await;
        }
        Fault::F6 => {
            deployment.kill(0, false);
            tokio::time::sleep(Duration::from_secs(1)).await;
            deployment.start_again(0);
        }
        Fault::F7 => {
            // The leader's pod is gone; a new one (a name of its own) comes 1 s later.
            let leader = deployment.leader().await.unwrap_or(0);
            deployment.kill(leader, true);
            tokio::time::sleep(Duration::from_secs(1)).await;
            deployment.add_replica();
        }
        Fault::F8 => proxy.expect("F8 runs behind the proxy").set_black_hole(true),
        Fault::F9 => {
            let quotas = Api::<ResourceQuota>::namespaced(client.clone(), "churn");
            let mut toggle = false;
            // Bounded by the fault's end: one edit per 100 ms.
            while Instant::now() < end {
                toggle = !toggle;
                let patch = serde_json::json!({"spec": {"hard": churn_hard(fault, toggle)}});
                let _ = quotas
                    .patch("q", &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    while Instant::now() < end {
        deployment.keep_running();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The churning quota's `hard`: F9 adds a second key it toggles.
fn churn_hard(fault: Fault, toggle: bool) -> BTreeMap<String, String> {
    let mut hard = BTreeMap::from([(KEY.to_owned(), HARD.to_string())]);
    if fault == Fault::F9 {
        hard.insert("count/secrets".into(), if toggle { "101" } else { "100" }.into());
    }
    hard
}

fn quota(name: &str, hard: &BTreeMap<String, String>) -> ResourceQuota {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"hard": hard}
    }))
    .expect("quota")
}

/// Creates a namespace, retrying until `within` (the apiserver may be restarting).
async fn create_namespace(client: &Client, name: &str, within: Duration) -> bool {
    let namespaces = Api::<Namespace>::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    wait_for(within, || async {
        match namespaces.create(&PostParams::default(), &ns).await {
            Ok(_) => true,
            Err(kube::Error::Api(s)) => s.code == 409,
            Err(_) => false,
        }
    })
    .await
}

/// A quota on `pods` and `count/configmaps` in a fresh namespace `name`: the time from its
/// creation until its status holds both keys, or None by `deadline`.
async fn new_quota(client: &Client, name: &str, deadline: Instant) -> Option<Duration> {
    let keys = ["pods", KEY];
    let hard = keys.iter().map(|k| ((*k).to_owned(), "10".to_owned())).collect();
    let within = deadline.saturating_duration_since(Instant::now());
    if !create_namespace(client, name, within).await {
        return None;
    }
    let quotas = Api::<ResourceQuota>::namespaced(client.clone(), name);
    let created = loop {
        if quotas
            .create(&PostParams::default(), &quota("q", &hard))
            .await
            .is_ok()
        {
            break Instant::now();
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let within = deadline.saturating_duration_since(Instant::now());
    wait_for(within, || async { used_of(&quotas, "q", &keys).await.is_some() })
        .await
        .then(|| created.elapsed())
}

/// The quota's `status.used` of `keys`, when it holds every one of them.
async fn used_of(quotas: &Api<ResourceQuota>, name: &str, keys: &[&str]) -> Option<Vec<u64>> {
    let used = quotas.get(name).await.ok()?.status?.used?;
    keys.iter()
        .map(|k| used.get(*k).and_then(|q| q.0.parse().ok()))
        .collect()
}

/// Polls `check` every 50 ms (the resolution of the times it measures) until it holds (true)
/// or `within` has passed (false).
async fn wait_for<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually_every(Duration::from_millis(50), within, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await
    .is_some()
}

/// lazyquota's watches ended by 410 Gone so far (every replica; 0 for KCM).
async fn gone(deployment: &Deployment) -> u64 {
    let metrics = deployment.metrics().await;
    crate::whole(metric_sum(
        &metrics,
        "lazyquota_watch_errors_total",
        "reason=\"expired\"",
    ))
}

/// Lines of the controller's log, Events and metric series that name the fault's cause.
async fn named(fault: Fault, deployment: &Deployment, client: &Client) -> (u64, u64, u64) {
    let culprit = fault.culprit();
    if culprit.is_empty() {
        return (0, 0, 0);
    }
    let names = |text: &str| {
        let text = text.to_lowercase();
        culprit.iter().any(|c| text.contains(&c.to_lowercase()))
    };
    let log = deployment.logs().lines().filter(|l| names(l)).count() as u64;
    let events = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|list| {
            list.items
                .iter()
                .filter(|e| {
                    names(e.note.as_deref().unwrap_or_default())
                        || names(e.reason.as_deref().unwrap_or_default())
                })
                .count() as u64
        })
        .unwrap_or_default();
    let metrics = deployment
        .metrics()
        .await
        .lines()
        .filter(|l| !l.starts_with('#') && names(l))
        .count() as u64;
    (log, events, metrics)
}
