//! The executor: one task that turns streams into the pure
//! [`Reconciler`](lazyquota_index::reconciler::Reconciler)'s inputs and carries out the
//! effects it returns. It decides nothing.
//!
//! ```text
//!  quota, LogicalCluster, API-change watches ─┐
//!  object watches (one SelectAll), fills      ├─► Input ─► Reconciler ─► Effect ─► watches opened
//!  discoveries, status writes, fresh reads   ─┤                                   and closed, lists,
//!  kcp: shared watches, share lists           ─┤                                   requests, Events,
//!  the reconciler's next wakeup (one timer)  ─┘                                   metrics
//! ```
//!
//! One controller serves one cluster, or on kcp every logical cluster of a shard that has a
//! quota ([`Controller::for_shard`]; every request through one client of the shard's root,
//! routed by path). Everything mutable lives in [`Controller`] and is touched only by its
//! `run` loop: no locks. Metrics and readiness ask the loop for a [`Snapshot`] through a
//! [`SnapshotHandle`]; gauges are computed then, at scrape time (`controller/view.rs`).

pub(crate) mod api_changes;
mod backoff;
mod config;
pub mod discovery;
pub mod events;
pub mod members;
mod proofs;
mod quotas;
mod shared;
pub mod snapshot;
mod trace;
mod view;
pub mod watch;

pub use config::Config;
use config::settings;

use std::{
    collections::{BTreeSet, HashMap},
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{
    FutureExt as _, StreamExt as _,
    future::BoxFuture,
    stream::{AbortHandle, BoxStream, FuturesUnordered, SelectAll},
};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::{
    Client,
    api::{Patch, PatchParams},
    runtime::{WatchStreamExt as _, watcher},
};
use lazyquota_index::{
    engine::Projected,
    keys::{ClusterName, QuotaKey},
    reconciler::{Effect, Input, Now, Reconciler, SharedEvent, SharedKey, StatusWrite},
};
use lazyquota_quota::Interner;
use tokio::sync::mpsc;
use tracing::{info, warn};

use api_changes::api_change_stream;
use discovery::{Discovered, WalkGuesses, discover_guessing};
use events::Recorder;
use quotas::{failure, quota_event};
pub use snapshot::{QuotaKeyUsage, Snapshot, SnapshotHandle, WatchInfo};
use watch::{WatchItem, WatchKey, WatchOptions, routed_api};

use crate::{
    now,
    operate::metrics::Metrics,
    transport::route::{Route, Routed},
};

pub use lazyquota_index::planner::Mode;

/// Events published at once, at most (a burst beyond is dropped and logged).
const MAX_PENDING_EVENTS: usize = 256;

/// Fatal controller errors (everything else is retried).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The ResourceQuota watch ended, which the watcher never does on its own.
    #[error("the ResourceQuota watch ended unexpectedly")]
    QuotaWatchEnded,
}

type Answer = BoxFuture<'static, Input>;

/// The controller: the reconciler and the IO it asks for.
pub struct Controller {
    /// The cluster's client; on kcp, the shard's root, every request routed ([`Route`]).
    client: Client,
    config: Config,
    options: WatchOptions,
    interner: Arc<Interner>,
    reconciler: Reconciler,
    /// Each open watch's abort handle and event counter.
    handles: HashMap<u64, (AbortHandle, prometheus::IntCounter)>,
    streams: SelectAll<BoxStream<'static, (u64, WatchItem)>>,
    /// Requests whose answers are inputs: discoveries, fills, status writes, fresh reads.
    answers: FuturesUnordered<Answer>,
    /// What every snapshot starts from: the cluster and the settings reported.
    stats: Snapshot,
    metrics: Metrics,
    recorder: Recorder,
    /// Events being published (at most [`MAX_PENDING_EVENTS`]).
    events: FuturesUnordered<BoxFuture<'static, ()>>,
    requests: mpsc::Receiver<snapshot::Request>,
    /// kcp: the shard's shared wildcard watches, and each one's abort handle.
    shared: SelectAll<BoxStream<'static, (SharedKey, SharedEvent)>>,
    shared_handles: HashMap<SharedKey, AbortHandle>,
    /// The group versions earlier discoveries walked (kcp: a workspace's first discovery in
    /// one round trip instead of two).
    walk_guesses: WalkGuesses,
}

fn at_now() -> Now {
    Now {
        instant: Instant::now(),
        time: now(),
    }
}

impl Controller {
    /// A controller for `client`'s cluster, counting into `metrics`, and the handle to ask
    /// it for snapshots.
    pub fn new(client: Client, config: Config, metrics: Metrics) -> (Self, SnapshotHandle) {
        Self::build(client, config, metrics, false)
    }

    /// One controller for every logical cluster of the kcp shard whose root `root` points at
    /// that has a ResourceQuota (engaged and let go as quotas and LogicalClusters come and go).
    pub fn for_shard(root: Client, config: Config, metrics: Metrics) -> (Self, SnapshotHandle) {
        let config = Config { kcp: true, ..config };
        Self::build(root, config, metrics, true)
    }

    fn build(client: Client, config: Config, metrics: Metrics, shard: bool) -> (Self, SnapshotHandle) {
        let (tx, requests) = mpsc::channel(16);
        let options = WatchOptions {
            streaming_lists: config.streaming_lists.unwrap_or(false),
            gates: config.gates,
        };
        let reconciler = Reconciler::new(
            settings(&config, shard),
            crate::object_ids().clone(),
            Instant::now(),
        );
        let controller = Self {
            recorder: Recorder::new(client.clone(), config.instance.clone(), shard),
            events: FuturesUnordered::new(),
            client,
            options,
            interner: Arc::new(Interner::new()),
            reconciler,
            handles: HashMap::new(),
            streams: SelectAll::new(),
            answers: FuturesUnordered::new(),
            stats: Snapshot::default(),
            metrics,
            requests,
            config,
            shared: SelectAll::new(),
            shared_handles: HashMap::new(),
            walk_guesses: WalkGuesses::default(),
        };
        (controller, SnapshotHandle::new(tx))
    }

    /// Runs until `shutdown` completes; then stops all watches and waits (at most 10 s) for
    /// the status writes in flight.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        let shard = self.reconciler.settings().shard;
        if self.config.streaming_lists.is_none() && !shard {
            self.options.streaming_lists = watch::probe_streaming_lists(&self.client).await;
        }
        self.stats.streaming_lists = self.options.streaming_lists;
        self.stats.cluster = self.config.cluster.to_string();
        info!(streaming_lists = self.options.streaming_lists, mode = ?self.config.mode, shadow = self.config.shadow, kcp_shard = shard, "controller starting");

        // On kcp the quotas of every logical cluster, from one wildcard watch.
        let wide = if shard { Route::wildcard() } else { Route::direct() };
        let mut quota_events = watcher(
            routed_api::<ResourceQuota>(&self.client, &wide, None, ()),
            watcher::Config::default(),
        )
        .default_backoff()
        .boxed();
        let mut logical_clusters = shard.then(|| members::logical_clusters(&self.client));
        let mut api_changes = api_change_stream(&self.client, &wide, self.config.kcp, &self.metrics);
        let mut shutdown = std::pin::pin!(shutdown);

        let outcome = loop {
            let mut wakeup = self.reconciler.next_wakeup(Instant::now());
            if wakeup.is_some_and(|at| at <= Instant::now()) {
                // Due already (a quota an input queued, a discovery of a cluster just engaged):
                // at once, not at the timer's next millisecond tick.
                self.tick();
                wakeup = self.reconciler.next_wakeup(Instant::now());
            }
            tokio::select! {
                () = &mut shutdown => break Ok(()),
                event = quota_events.next() => match event {
                    Some(Ok(event)) => self.feed(Input::Quota(quota_event(event))),
                    Some(Err(error)) => warn!(%error, "ResourceQuota watch failed; retrying"),
                    None => break Err(Error::QuotaWatchEnded),
                },
                Some(event) = next_of(logical_clusters.as_mut()) => match event {
                    Ok(event) => self.feed(Input::LogicalCluster(members::cluster_event(event))),
                    Err(error) => warn!(%error, "wildcard LogicalCluster watch failed; retrying"),
                },
                Some((id, item)) = self.streams.next(), if !self.streams.is_empty() => {
                    if let Some((_, events)) = self.handles.get(&id) {
                        events.inc();
                    }
                    self.feed(Input::Watch { id, item });
                }
                Some((key, event)) = self.shared.next(), if !self.shared.is_empty() => {
                    self.feed(Input::Shared { key, event });
                }
                Some(changed) = api_changes.next() => self.feed(Input::ApiChanged(changed)),
                Some(answer) = self.answers.next(), if !self.answers.is_empty() => self.feed(answer),
                () = sleep_until(wakeup), if wakeup.is_some() => self.tick(),
                Some(()) = self.events.next(), if !self.events.is_empty() => {}
                Some(request) = self.requests.recv() => match request {
                    snapshot::Request::Snapshot(reply) => {
                        let _ = reply.send(self.snapshot());
                    }
                    snapshot::Request::Explain(reply) => {
                        let _ = reply.send(self.explain());
                    }
                },
            }
        };

        info!(
            in_flight = self.reconciler.writes_in_flight(),
            "stopping watches, finishing status writes"
        );
        for (abort, _) in self.handles.values() {
            abort.abort();
        }
        for abort in self.shared_handles.values() {
            abort.abort();
        }
        // The writes in flight are answered, and the Events already recorded — and those their
        // answers record (a refused write's Warning) — are published, within the same 10 s.
        let drain = async {
            loop {
                tokio::select! {
                    Some(answer) = self.answers.next(), if self.reconciler.writes_in_flight() > 0 => {
                        if matches!(answer, Input::Written { .. }) {
                            self.feed(answer);
                        }
                    }
                    Some(()) = self.events.next(), if !self.events.is_empty() => {}
                    else => break,
                }
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), drain)
            .await
            .is_err()
        {
            warn!(
                writes = self.reconciler.writes_in_flight(),
                events = self.events.len(),
                "status writes or Events still in flight after 10s; exiting anyway"
            );
        }
        outcome
    }

    /// Lets the reconciler do what is due and carries out what it decided.
    fn tick(&mut self) {
        let started = Instant::now();
        self.reconciler.tick(at_now());
        self.carry_out(started);
    }

    /// Hands one input to the reconciler and carries out what it decided.
    fn feed(&mut self, input: Input) {
        let started = Instant::now();
        trace::input(&input);
        self.reconciler.handle(input, at_now());
        self.carry_out(started);
    }

    /// Carries out the reconciler's effects (`started`: when the input or tick that decided
    /// them began, for the sync-duration metric of syncs decided at once).
    fn carry_out(&mut self, started: Instant) {
        for effect in self.reconciler.take_effects() {
            trace::effect(&effect);
            match effect {
                Effect::OpenWatch { id, key, served } => self.open_watch(id, &key, &served),
                Effect::CloseWatch { id } => {
                    if let Some((abort, _)) = self.handles.remove(&id) {
                        abort.abort();
                    }
                }
                Effect::Fill {
                    key,
                    namespace,
                    served,
                } => self.fill(key, namespace, served),
                Effect::Discover { cluster, groups } => self.discover(cluster, groups),
                Effect::WriteStatus(write) => self.write_status(write),
                Effect::ReadQuota(key) => self.read_quota(key),
                Effect::ListForProof {
                    key,
                    served,
                    namespace,
                } => {
                    let api = proofs::api(
                        &self.client,
                        &self.route(&key.cluster),
                        &served,
                        namespace.as_deref(),
                    );
                    self.answers
                        .push(proofs::list(api, key, served.resource, namespace).boxed());
                }
                Effect::Event {
                    quota,
                    uid,
                    workspace,
                    warning,
                    reason,
                    note,
                } => {
                    self.emit(&quota, uid, workspace.as_deref(), warning, reason, &note);
                }
                Effect::OpenShared { key, served } => {
                    let (events, abort) = shared::open(&self.client, &served, key.clone());
                    self.shared.push(events);
                    self.shared_handles.insert(key, abort);
                }
                Effect::CloseShared { key } => {
                    if let Some(abort) = self.shared_handles.remove(&key) {
                        abort.abort();
                    }
                }
                effect @ Effect::ListShare { .. } => {
                    self.answers
                        .push(shared::list_share(self.client.clone(), effect).boxed());
                }
                Effect::Disengaged(cluster) => self.recorder.forget_cluster(&cluster),
                Effect::Metric(metric) => self.metrics.count(metric, started),
            }
        }
    }

    /// Where requests for `cluster` go: through the shard's root to the logical cluster on
    /// kcp, straight to the client's cluster otherwise.
    fn route(&self, cluster: &ClusterName) -> Route {
        if self.reconciler.settings().shard {
            Route::cluster(cluster)
        } else {
            Route::direct()
        }
    }

    fn open_watch(&mut self, id: u64, key: &WatchKey, served: &lazyquota_index::resolver::ServedResource) {
        let (stream, abort) = watch::open(
            &self.client,
            &self.route(&key.cluster),
            served,
            key,
            self.options,
            &self.interner,
            id,
        );
        self.streams.push(stream);
        let events = self.metrics.watch_events(&key.resource_label());
        self.handles.insert(id, (abort, events));
    }

    fn fill(
        &mut self,
        key: WatchKey,
        namespace: Arc<str>,
        served: lazyquota_index::resolver::ServedResource,
    ) {
        let (client, gates, interner) = (self.client.clone(), self.config.gates, self.interner.clone());
        let route = self.route(&key.cluster);
        self.answers.push(
            async move {
                let listed: kube::Result<Vec<(String, Projected)>> =
                    watch::list_namespace(&client, &route, &served, &namespace, key.need, gates, &interner)
                        .await;
                let listed = listed.map_err(|e| e.to_string());
                Input::Filled {
                    key,
                    namespace,
                    listed,
                }
            }
            .boxed(),
        );
    }

    fn discover(&mut self, cluster: ClusterName, groups: Option<BTreeSet<String>>) {
        let client = self.client.clone();
        let route = self.route(&cluster);
        let guesses = self.walk_guesses.clone();
        self.answers.push(
            async move {
                let result: Result<Discovered, kube::Error> =
                    discover_guessing(&client, &route, groups.as_ref(), &guesses).await;
                let result = result.map_err(|e| e.to_string());
                Input::Discovered { cluster, result }
            }
            .boxed(),
        );
    }

    fn write_status(&mut self, write: StatusWrite) {
        let api = routed_api::<ResourceQuota>(
            &self.client,
            &self.route(&write.key.cluster),
            Some(&write.key.namespace),
            (),
        );
        let body = write.patch();
        self.answers.push(
            async move {
                let result = api
                    .patch_status(&write.key.name, &PatchParams::default(), &Patch::Merge(&body))
                    .await
                    .map(|Routed(written)| written)
                    .map_err(failure);
                Input::Written {
                    key: write.key,
                    precondition: write.precondition,
                    result,
                }
            }
            .boxed(),
        );
    }

    /// Reads a quota afresh after a conflict (its requests carry the client's deadline).
    fn read_quota(&mut self, key: QuotaKey) {
        let api =
            routed_api::<ResourceQuota>(&self.client, &self.route(&key.cluster), Some(&key.namespace), ());
        self.answers.push(
            async move {
                let result = api
                    .get_status(&key.name)
                    .await
                    .map(|Routed(quota)| quota)
                    .map_err(failure);
                Input::Read { key, result }
            }
            .boxed(),
        );
    }

    /// Records an Event on a quota (published by the loop; dropped, with a log line, if too
    /// many are already in flight).
    fn emit(
        &mut self,
        quota: &QuotaKey,
        uid: Option<String>,
        workspace: Option<&str>,
        warning: bool,
        reason: &'static str,
        note: &str,
    ) {
        if self.events.len() >= MAX_PENDING_EVENTS {
            warn!(quota = %quota, reason, "too many Events in flight; dropping one");
            return;
        }
        let note = events::event_note(workspace, note);
        let publish = self.recorder.record(quota, uid, warning, reason, note);
        let quota = quota.clone();
        self.events.push(
            async move {
                if let Err(error) = publish.await {
                    warn!(quota = %quota, %error, "recording an Event failed");
                }
            }
            .boxed(),
        );
    }
}

/// Sleeps until `at` (forever without one; the select arm is disabled then anyway).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// The next item of an optional stream (never, without one).
async fn next_of<S: futures::Stream + Unpin>(stream: Option<&mut S>) -> Option<S::Item> {
    match stream {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}
