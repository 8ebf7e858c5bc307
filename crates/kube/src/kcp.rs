//! kcp: one lazyquota per shard, serving every logical cluster on it that has a ResourceQuota.
//!
//! ```text
//!  GET /clusters/*/api/v1/resourcequotas?watch   (metadata only) ─┐
//!  GET /clusters/*/apis/core.kcp.io/v1alpha1/logicalclusters?watch ┴► Membership ─► engage / disengage
//!  engaged cluster c: a Controller over <shard>/clusters/c  (its own quota, CRD and APIBinding
//!  watches, lazy watches of what its quotas constrain, status writes and Events there)
//! ```
//!
//! A logical cluster costs nothing until a ResourceQuota appears in it: no controller, no
//! watch, no discovery — the workspace-level form of lazyquota's rule, on top of the per-type
//! rule each engaged controller applies. All clients share one connection pool to the shard
//! ([`crate::client::Pool`]; over HTTP/2, the default, one connection per 64 open streams). The
//! cluster of every wildcard object is its `kcp.io/cluster` annotation.
//!
//! When at least `shared_threshold` engaged clusters watch a type for counts, one shared
//! wildcard metadata watch serves them all ([`crate::hub`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    time::{Duration, Instant},
};

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::{
    Api, ResourceExt as _,
    api::{DynamicObject, PartialObjectMeta},
    runtime::{WatchStreamExt as _, watcher},
};
use lazyquota_index::{keys::ClusterName, membership::Membership};
use tokio::{sync::oneshot, task::JoinSet};
use tracing::{Instrument as _, info, info_span, warn};

use crate::{
    controller::{self, Controller, SnapshotHandle},
    hub::Hub,
    metrics::Metrics,
    shard::{CLUSTER_ANNOTATION, Error, PATH_ANNOTATION, Shard, logical_cluster_resource},
};

/// Feeds one event of the wildcard quota watch to `m`.
fn on_quota(m: &mut Membership, event: watcher::Event<PartialObjectMeta<ResourceQuota>>) {
    let key = |q: &PartialObjectMeta<ResourceQuota>| {
        let cluster = q.annotations().get(CLUSTER_ANNOTATION)?;
        Some((
            ClusterName::new(cluster),
            q.namespace().unwrap_or_default(),
            q.name_any(),
        ))
    };
    match event {
        watcher::Event::Init => m.quota_relist_started(),
        watcher::Event::InitApply(q) => {
            if let Some((c, ns, name)) = key(&q) {
                m.quota_relisted(c, ns, name);
            }
        }
        watcher::Event::InitDone => m.quota_relist_done(),
        watcher::Event::Apply(q) => match key(&q) {
            Some((c, ns, name)) => m.quota_applied(c, &ns, &name),
            None => {
                warn!(quota = %q.name_any(), "a wildcard ResourceQuota without the kcp.io/cluster annotation; ignored");
            }
        },
        watcher::Event::Delete(q) => {
            if let Some((c, ns, name)) = key(&q) {
                m.quota_deleted(&c, &ns, &name);
            }
        }
    }
}

/// Feeds one event of the wildcard LogicalCluster watch to `m`.
fn on_cluster(m: &mut Membership, event: watcher::Event<DynamicObject>) {
    let key = |o: &DynamicObject| {
        let cluster = o.annotations().get(CLUSTER_ANNOTATION)?;
        let phase = o.data["status"]["phase"].as_str().unwrap_or_default().to_owned();
        Some((ClusterName::new(cluster), phase))
    };
    match event {
        watcher::Event::Init => m.cluster_relist_started(),
        watcher::Event::InitApply(o) => {
            record_path(m, &o);
            if let Some((c, phase)) = key(&o) {
                m.cluster_relisted(c, phase);
            }
        }
        watcher::Event::InitDone => m.cluster_relist_done(),
        watcher::Event::Apply(o) => {
            record_path(m, &o);
            if let Some((c, phase)) = key(&o) {
                m.cluster_applied(c, phase);
            }
        }
        watcher::Event::Delete(o) => {
            if let Some((c, _)) = key(&o) {
                m.cluster_deleted(c);
            }
        }
    }
}

/// Records a LogicalCluster's workspace path, when it has one.
fn record_path(m: &mut Membership, o: &DynamicObject) {
    if let (Some(cluster), Some(path)) = (
        o.annotations().get(CLUSTER_ANNOTATION),
        o.annotations().get(PATH_ANNOTATION),
    ) {
        m.record_path(ClusterName::new(cluster), path.clone());
    }
}

struct Engaged {
    /// Which engagement (a cluster disengaged and engaged again gets a new one).
    id: u64,
    stop: oneshot::Sender<()>,
    handle: SnapshotHandle,
}

/// When a logical cluster whose controller failed may be engaged again. Pure: the caller
/// passes the time.
///
/// The first restart waits 1 s, each further one twice as long, up to 5 minutes; a controller
/// that had run for 5 minutes before failing starts the count again, and a cluster no longer
/// wanted is forgotten.
#[derive(Debug, Default)]
pub struct Restarts {
    /// Per cluster: consecutive failures and the earliest next engagement.
    waiting: BTreeMap<ClusterName, (u32, Instant)>,
}

impl Restarts {
    const FIRST: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(300);

    /// `cluster`'s controller failed at `now` after running for `ran`; returns the wait.
    pub fn failed(&mut self, cluster: &ClusterName, ran: Duration, now: Instant) -> Duration {
        let failures = match self.waiting.get(cluster) {
            Some((n, _)) if ran < Self::MAX => n.saturating_add(1),
            _ => 1,
        };
        let wait = lazyquota_index::queue::doubling(Self::FIRST, failures, Self::MAX);
        self.waiting.insert(cluster.clone(), (failures, now + wait));
        wait
    }

    /// Whether `cluster` may be engaged at `now`.
    pub fn allowed(&self, cluster: &ClusterName, now: Instant) -> bool {
        self.waiting.get(cluster).is_none_or(|(_, at)| *at <= now)
    }

    /// Forgets clusters not in `wanted` (their count starts again if they come back).
    pub fn retain(&mut self, wanted: &BTreeSet<ClusterName>) {
        self.waiting.retain(|c, _| wanted.contains(c));
    }

    /// The earliest time a waiting cluster may be engaged, for the loop's timer.
    pub fn next_due(&self, now: Instant) -> Option<Instant> {
        self.waiting
            .values()
            .map(|(_, at)| *at)
            .filter(|at| *at > now)
            .min()
    }
}

/// Serves the shard until `shutdown` completes: engages a [`Controller`] for each logical
/// cluster with a ResourceQuota, disengages it when the last quota or the cluster goes, and
/// publishes the running controllers' snapshot handles to `controllers`. The controllers run in
/// a `JoinSet` (each its own task, nothing spawned beside it): dropping this future (a lost
/// Lease) aborts them all, and the hub's task with the last handle on it. A controller that
/// fails is engaged again after a backoff ([`Restarts`]).
pub async fn run(
    shard: &Shard,
    base: &controller::Config,
    shared_threshold: usize,
    metrics: &Metrics,
    controllers: &tokio::sync::watch::Sender<Vec<SnapshotHandle>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let wildcard = shard.wildcard()?;
    let mut quotas = watcher(
        Api::<PartialObjectMeta<ResourceQuota>>::all(wildcard.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .boxed();
    let mut clusters = watcher(
        Api::<DynamicObject>::all_with(wildcard.clone(), &logical_cluster_resource()),
        watcher::Config::default(),
    )
    .default_backoff()
    .boxed();
    let mut membership = Membership::default();
    // 0 disables sharing: every logical cluster watches its types itself.
    let hub = (shared_threshold > 0)
        .then(|| Hub::start(shard.clone(), wildcard, shared_threshold, metrics.clone()));
    let mut engaged: BTreeMap<ClusterName, Engaged> = BTreeMap::new();
    let mut next_id = 0_u64;
    // Each task returns its cluster and engagement, however the controller ended (a panic
    // included: the task's wrapper reports it).
    let mut tasks: JoinSet<(ClusterName, u64, Duration, Result<(), String>)> = JoinSet::new();
    let mut restarts = Restarts::default();
    let mut shutdown = std::pin::pin!(shutdown);
    info!(shard = %shard.url(), "serving the kcp shard's logical clusters");
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(event) = quotas.next() => match event {
                Ok(event) => on_quota(&mut membership, event),
                Err(error) => warn!(%error, "wildcard ResourceQuota watch failed; retrying"),
            },
            Some(event) = clusters.next() => match event {
                Ok(event) => on_cluster(&mut membership, event),
                Err(error) => warn!(%error, "wildcard LogicalCluster watch failed; retrying"),
            },
            () = sleep_until_due(restarts.next_due(Instant::now())) => {}
            Some(ended) = tasks.join_next(), if !tasks.is_empty() => {
                let Ok((cluster, id, ran, result)) = ended else { continue };
                // That engagement can send nothing more: its demand goes now (not at stop,
                // when it might still be sending).
                if let Some(hub) = &hub {
                    hub.for_engagement(id).withdraw(&cluster);
                }
                // A controller that stopped on its own (not disengaged): engage it again.
                if engaged.get(&cluster).is_some_and(|e| e.id == id) {
                    let wait = restarts.failed(&cluster, ran, Instant::now());
                    warn!(%cluster, ?result, ?wait, "a logical cluster's controller stopped; restarting it after a backoff");
                    engaged.remove(&cluster);
                    controllers.send_replace(engaged.values().map(|e| e.handle.clone()).collect());
                }
            }
        }
        if !membership.clusters_known() {
            continue;
        }
        let desired = membership.desired();
        restarts.retain(&desired);
        let mut changed = false;
        for cluster in engaged
            .keys()
            .filter(|c| !desired.contains(*c))
            .cloned()
            .collect::<Vec<_>>()
        {
            if let Some(e) = engaged.remove(&cluster) {
                info!(%cluster, workspace = membership.path(&cluster), "no ResourceQuota left (or the logical cluster is going): disengaging");
                let _ = e.stop.send(());
                changed = true;
            }
        }
        let now = Instant::now();
        let new: Vec<ClusterName> = desired
            .into_iter()
            .filter(|c| !engaged.contains_key(c) && restarts.allowed(c, now))
            .collect();
        for cluster in new {
            let client = match shard.cluster(&cluster) {
                Ok(client) => client,
                Err(error) => {
                    warn!(%cluster, %error, "cannot build the logical cluster's client");
                    continue;
                }
            };
            info!(%cluster, workspace = membership.path(&cluster), quotas = membership.quotas_in(&cluster), "ResourceQuota found: engaging the logical cluster");
            next_id += 1;
            let id = next_id;
            let path = membership.path(&cluster);
            let config = controller::Config {
                cluster: cluster.clone(),
                kcp: true,
                workspace: (!path.is_empty()).then(|| path.to_owned()),
                ..base.clone()
            };
            let (controller, handle) = Controller::new(client, config, metrics.clone());
            let controller = match &hub {
                Some(hub) => controller.with_hub(hub.for_engagement(id)),
                None => controller,
            };
            let (stop, stopped) = oneshot::channel::<()>();
            let name = cluster.clone();
            let span = info_span!("cluster", cluster = %cluster, workspace = membership.path(&cluster));
            tasks.spawn(
                async move {
                    let started = Instant::now();
                    let run = controller.run(async {
                        let _ = stopped.await;
                    });
                    // A panic ends this engagement only; the loop engages the cluster again.
                    let result = match std::panic::AssertUnwindSafe(run).catch_unwind().await {
                        Ok(result) => result.map_err(|e| e.to_string()),
                        Err(_) => Err("the controller panicked".to_owned()),
                    };
                    (name, id, started.elapsed(), result)
                }
                .instrument(span),
            );
            engaged.insert(cluster, Engaged { id, stop, handle });
            changed = true;
        }
        if changed {
            controllers.send_replace(engaged.values().map(|e| e.handle.clone()).collect());
            metrics.kcp_engaged(engaged.len());
        }
    }
    // Shutdown: every controller drains its writes (each bounds that by 10 s).
    for (_, e) in std::mem::take(&mut engaged) {
        let _ = e.stop.send(());
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Sleeps until `due`, or for ever if nothing is due.
async fn sleep_until_due(due: Option<Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str) -> ClusterName {
        ClusterName::new(name)
    }

    #[test]
    fn a_failing_controller_is_engaged_again_after_a_growing_capped_backoff() {
        let mut r = Restarts::default();
        let t0 = Instant::now();
        let short = Duration::from_secs(1);
        assert!(r.allowed(&c("a"), t0));
        let waits: Vec<Duration> = (0..12).map(|_| r.failed(&c("a"), short, t0)).collect();
        assert_eq!(waits[..4], [1, 2, 4, 8].map(Duration::from_secs));
        assert_eq!(waits[11], Duration::from_secs(300), "capped at 5 minutes");
        assert!(!r.allowed(&c("a"), t0 + Duration::from_secs(299)));
        assert!(r.allowed(&c("a"), t0 + Duration::from_secs(300)));
        assert!(r.allowed(&c("b"), t0), "other clusters are not held back");
        assert_eq!(r.next_due(t0), Some(t0 + Duration::from_secs(300)));
        assert_eq!(
            r.failed(&c("a"), Duration::from_secs(600), t0),
            Duration::from_secs(1),
            "after a long run the count starts again"
        );
        r.retain(&BTreeSet::new());
        assert!(
            r.allowed(&c("a"), t0) && r.next_due(t0).is_none(),
            "forgotten when not wanted"
        );
    }
}
