//! kcp: one lazyquota engine per shard, serving every logical cluster on it that has a
//! ResourceQuota.
//!
//! ```text
//!  GET /clusters/*/api/v1/resourcequotas?watch ──────────────────┐
//!  GET /clusters/*/apis/core.kcp.io/v1alpha1/logicalclusters?watch ┴► Membership ─► serve / let go
//!  GET /clusters/*/apis/{apiextensions.k8s.io,apis.kcp.io}/…?watch (metadata) ─► discovery of that cluster
//!  per served cluster c: discovery, lazy watches, status writes and Events at /clusters/c/…
//!  (one client for the shard's root: the route is in each request's path)
//! ```
//!
//! One [`Controller`] — one task — serves the whole shard: its quotas, CRDs, APIBindings and
//! LogicalClusters come from wildcard watches and are routed by the `kcp.io/cluster`
//! annotation. A logical cluster costs nothing until a ResourceQuota appears in it, and then
//! costs map entries (its quotas, its discovery, its watches), not a task or a connection:
//! every request goes through one client of the shard's root ([`crate::transport::route`]; over HTTP/2,
//! the default, one connection per 64 open streams). When at least `shared_threshold` served
//! clusters watch a type for counts, one shared wildcard metadata watch serves them all (the
//! Reconciler's hub, `lazyquota_index::reconciler::Hub`; the executor's side is
//! `controller/shared.rs`).

pub mod shard;

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    time::{Duration, Instant},
};

use futures::FutureExt as _;
use lazyquota_index::keys::ClusterName;
use tokio::sync::oneshot;
use tracing::{Instrument as _, info, info_span, warn};

use crate::{
    controller::{self, Controller, SnapshotHandle},
    kcp::shard::{Error, Shard},
    operate::metrics::Metrics,
};

/// When an engine that failed may start again. Pure: the caller passes the time. Keyed by
/// cluster (the shard's engine uses `*`).
///
/// The first restart waits 1 s, each further one twice as long, up to 5 minutes; an engine
/// that had run for 5 minutes before failing starts the count again.
#[derive(Debug, Default)]
pub struct Restarts {
    /// Per cluster: consecutive failures and the earliest next engagement.
    waiting: BTreeMap<ClusterName, (u32, Instant)>,
}

impl Restarts {
    const FIRST: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_mins(5);

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

/// Serves the shard until `shutdown` completes: one [`Controller`] for all its logical
/// clusters, its snapshot handle published to `controllers`. Dropping this future (a lost
/// Lease) stops everything at once: the controller, its shared watches included, runs inside
/// it. A controller that fails (or panics) starts again after a backoff ([`Restarts`]), with
/// shared watches of its own.
pub async fn run(
    shard: &Shard,
    base: &controller::Config,
    shared_threshold: usize,
    metrics: &Metrics,
    controllers: &tokio::sync::watch::Sender<Vec<SnapshotHandle>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let root = shard.root()?;
    let all = ClusterName::new("*");
    let mut restarts = Restarts::default();
    let mut shutdown = std::pin::pin!(shutdown);
    info!(shard = %shard.url(), "serving the kcp shard's logical clusters");
    for engagement in 1_u64.. {
        let config = controller::Config {
            cluster: all.clone(),
            kcp: true,
            workspace: None,
            // 0 disables sharing: every logical cluster watches its types itself.
            shared_threshold,
            ..base.clone()
        };
        let (controller, handle) = Controller::for_shard(root.clone(), config, metrics.clone());
        controllers.send_replace(vec![handle]);
        let (stop, stopped) = oneshot::channel::<()>();
        let started = Instant::now();
        let span = info_span!("shard", engagement);
        // Boxed: the controller's future is large, and this one lives in the leader's.
        let mut run = Box::pin(
            std::panic::AssertUnwindSafe(controller.run(async {
                let _ = stopped.await;
            }))
            .catch_unwind()
            .instrument(span),
        );
        let ended = tokio::select! {
            ended = &mut run => ended,
            () = &mut shutdown => {
                // The controller drains its status writes (at most 10 s).
                let _ = stop.send(());
                let _ = run.await;
                return Ok(());
            }
        };
        let result = match ended {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err("the controller panicked".to_owned()),
        };
        controllers.send_replace(Vec::new());
        metrics.kcp_engaged(0);
        metrics.kcp_shared_watches(0);
        let wait = restarts.failed(&all, started.elapsed(), Instant::now());
        warn!(
            ?result,
            ?wait,
            "the shard's controller stopped; restarting it after a backoff"
        );
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = &mut shutdown => return Ok(()),
        }
    }
    Ok(())
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
        assert_eq!(waits[11], Duration::from_mins(5), "capped at 5 minutes");
        assert!(!r.allowed(&c("a"), t0 + Duration::from_secs(299)));
        assert!(r.allowed(&c("a"), t0 + Duration::from_mins(5)));
        assert!(r.allowed(&c("b"), t0), "other clusters are not held back");
        assert_eq!(r.next_due(t0), Some(t0 + Duration::from_mins(5)));
        assert_eq!(
            r.failed(&c("a"), Duration::from_mins(10), t0),
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
