//! The executor: one task that turns streams into the pure
//! [`Reconciler`](lazyquota_index::reconciler::Reconciler)'s inputs and carries out the
//! effects it returns. It decides nothing.
//!
//! ```text
//!  quota, LogicalCluster, API-change watches ─┐
//!  object watches (one SelectAll), fills      ├─► Input ─► Reconciler ─► Effect ─► watches opened
//!  discoveries, status writes, fresh reads   ─┤                                   and closed, lists,
//!  the reconciler's next wakeup (one timer)  ─┘                                   requests, Events,
//!                                                                                  hub demand, metrics
//! ```
//!
//! One controller serves one cluster, or on kcp every logical cluster of a shard that has a
//! quota ([`Controller::for_shard`]; every request through one client of the shard's root,
//! routed by path). Everything mutable lives in [`Controller`] and is touched only by its
//! `run` loop: no locks. Metrics and readiness ask the loop for a [`Snapshot`] through a
//! [`SnapshotHandle`]; gauges are computed then, at scrape time (`controller/view.rs`).

pub(crate) mod api_changes;
mod config;
pub mod discovery;
pub mod events;
pub mod snapshot;
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
use k8s_openapi::{api::core::v1::ResourceQuota, apimachinery::pkg::api::resource::Quantity};
use kube::{
    Client,
    api::{Patch, PatchParams},
    runtime::{WatchStreamExt as _, watcher},
};
use lazyquota_index::{
    engine::Projected,
    keys::{ClusterName, GroupResource, QuotaKey},
    reconciler::{Effect, Failure, Input, Metric, Now, QuotaEvent, Reconciler, StatusWrite},
};
use lazyquota_quota::Interner;
use tokio::sync::mpsc;
use tracing::{info, warn};

use api_changes::api_change_stream;
use discovery::{Discovered, discover};
use events::Recorder;
pub use snapshot::{QuotaKeyUsage, Snapshot, SnapshotHandle, WatchInfo};
use watch::{WatchItem, WatchKey, WatchOptions, routed_api};

use crate::{
    kcp::members,
    now,
    operate::metrics::Metrics,
    transport::route::{Route, Routed},
};

pub use lazyquota_index::planner::Mode;

/// An Event's note, at most (events.k8s.io/v1 allows 1024 bytes).
const MAX_NOTE_BYTES: usize = 1000;

/// An Event's note: on kcp it starts with the workspace path, so an Event read on the shard
/// (or exported) says where it happened; cut to what events.k8s.io/v1 accepts (error texts
/// can be longer).
fn event_note(workspace: Option<&str>, note: &str) -> String {
    match workspace {
        Some(path) => truncate(&format!("[workspace {path}] {note}"), MAX_NOTE_BYTES),
        None => truncate(note, MAX_NOTE_BYTES),
    }
}

/// `text` cut to at most `max` bytes at a character boundary, marked with an ellipsis.
fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

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
    stats: Snapshot,
    metrics: Metrics,
    recorder: Recorder,
    /// Events being published (at most [`MAX_PENDING_EVENTS`]).
    events: FuturesUnordered<BoxFuture<'static, ()>>,
    requests: mpsc::Receiver<snapshot::Request>,
    /// kcp: the shard's shared wildcard watches.
    hub: Option<crate::kcp::hub::Hub>,
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
            settings(&config, shard, false),
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
            hub: None,
        };
        (controller, SnapshotHandle::new(tx))
    }

    /// kcp: count-only watches of types the shard's hub shares come from its shared wildcard
    /// watch instead of a watch of their own.
    #[must_use]
    pub fn with_hub(mut self, hub: crate::kcp::hub::Hub) -> Self {
        let shard = self.reconciler.settings().shard;
        self.reconciler = Reconciler::new(
            settings(&self.config, shard, true),
            crate::object_ids().clone(),
            Instant::now(),
        );
        self.hub = Some(hub);
        self
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
        let mut shared_set = self.hub.as_ref().map(crate::kcp::hub::Hub::changes);
        if let Some(shared) = &mut shared_set {
            self.feed(Input::SharedChanged(shared.borrow_and_update().clone()));
        }
        let mut shutdown = std::pin::pin!(shutdown);

        let outcome = loop {
            let wakeup = self.reconciler.next_wakeup(Instant::now());
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
                Some(set) = next_shared(shared_set.as_mut()) => self.feed(Input::SharedChanged(set)),
                Some(changed) = api_changes.next() => self.feed(Input::ApiChanged(changed)),
                Some(answer) = self.answers.next(), if !self.answers.is_empty() => self.feed(answer),
                () = sleep_until(wakeup), if wakeup.is_some() => {
                    let started = Instant::now();
                    self.reconciler.tick(at_now());
                    self.carry_out(started);
                }
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
        let drain = async {
            while self.reconciler.writes_in_flight() > 0 {
                let Some(answer) = self.answers.next().await else {
                    break;
                };
                if matches!(answer, Input::Written { .. }) {
                    self.feed(answer);
                }
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), drain)
            .await
            .is_err()
        {
            warn!("status writes still in flight after 10s; exiting anyway");
        }
        outcome
    }

    /// Hands one input to the reconciler and carries out what it decided.
    fn feed(&mut self, input: Input) {
        let started = Instant::now();
        self.reconciler.handle(input, at_now());
        self.carry_out(started);
    }

    /// Carries out the reconciler's effects (`started`: when the input or tick that decided
    /// them began, for the sync-duration metric of syncs decided at once).
    fn carry_out(&mut self, started: Instant) {
        for effect in self.reconciler.take_effects() {
            match effect {
                Effect::OpenWatch {
                    id,
                    key,
                    served,
                    shared,
                } => self.open_watch(id, &key, &served, shared),
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
                Effect::Discover(cluster) => self.discover(cluster),
                Effect::WriteStatus(write) => self.write_status(write),
                Effect::ReadQuota(key) => self.read_quota(key),
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
                Effect::Demand {
                    cluster,
                    resource,
                    count,
                } => {
                    if let Some(hub) = &self.hub {
                        hub.demand(&cluster, &resource, count);
                    }
                }
                Effect::Disengaged(cluster) => {
                    self.recorder.forget_cluster(&cluster);
                    if let Some(hub) = &self.hub {
                        hub.withdraw(&cluster);
                    }
                }
                Effect::Metric(metric) => self.count(metric, started),
            }
        }
    }

    fn count(&self, metric: Metric, started: Instant) {
        match metric {
            Metric::QuotaSync { result, seconds } => self
                .metrics
                .quota_sync(result, seconds.unwrap_or_else(|| started.elapsed().as_secs_f64())),
            Metric::StatusWrite(result) => self.metrics.status_write(result),
            Metric::Relist(resource) => self.metrics.relist(&resource),
            Metric::WatchError { resource, reason } => self.metrics.watch_error(&resource, reason),
            Metric::Discovery(result) => self.metrics.discovery(result),
            Metric::Engaged(clusters) => self.metrics.kcp_engaged(clusters),
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

    fn open_watch(
        &mut self,
        id: u64,
        key: &WatchKey,
        served: &lazyquota_index::resolver::ServedResource,
        shared: bool,
    ) {
        let (stream, abort) = match &self.hub {
            Some(hub) if shared => hub.subscribe(served, key, id),
            _ => watch::open(
                &self.client,
                &self.route(&key.cluster),
                served,
                key,
                self.options,
                &self.interner,
                id,
            ),
        };
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

    fn discover(&mut self, cluster: ClusterName) {
        let client = self.client.clone();
        let route = self.route(&cluster);
        self.answers.push(
            async move {
                let result: Result<Discovered, kube::Error> = discover(&client, &route).await;
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
        let body = status_patch(&write);
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
        let note = event_note(workspace, note);
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

/// A request's failure as the reconciler reads it: the status code if the server answered.
#[allow(clippy::needless_pass_by_value)] // takes what `map_err` gives
fn failure(error: kube::Error) -> Failure {
    let code = match &error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    };
    Failure {
        code,
        message: error.to_string(),
    }
}

/// A quota watch event, typed for the reconciler.
fn quota_event(event: watcher::Event<Routed<ResourceQuota>>) -> QuotaEvent {
    match event {
        watcher::Event::Init => QuotaEvent::RelistStarted,
        watcher::Event::InitApply(Routed(q)) => QuotaEvent::Relisted(q),
        watcher::Event::InitDone => QuotaEvent::RelistDone,
        watcher::Event::Apply(Routed(q)) => QuotaEvent::Applied(q),
        watcher::Event::Delete(Routed(q)) => QuotaEvent::Deleted(q),
    }
}

/// The status write: a JSON merge patch of `status.hard` and `status.used` — the keys computed
/// now, and `null` for every key the stored status had that is no longer there — guarded by
/// the resourceVersion last seen (a precondition: 409 if the quota changed meanwhile).
///
/// Not a PUT of the status subresource with a body of our own: ResourceQuota's status strategy
/// keeps only the old `spec`, so a PUT whose metadata lacks the quota's labels and annotations
/// removes them (lazyquota keeps neither). That wiped `helm.sh` ownership annotations and kcp's
/// `experimental.quota.kcp.io/cluster-scoped` before this patch.
fn status_patch(write: &StatusWrite) -> serde_json::Value {
    fn merged(
        now: &std::collections::BTreeMap<String, Quantity>,
        removed: &[String],
    ) -> serde_json::Map<String, serde_json::Value> {
        let mut out: serde_json::Map<String, serde_json::Value> = now
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.0.clone())))
            .collect();
        for gone in removed {
            out.entry(gone.clone()).or_insert(serde_json::Value::Null);
        }
        out
    }
    let mut patch = serde_json::json!({
        "status": {
            "hard": merged(&write.hard, &write.removed_hard),
            "used": merged(&write.used, &write.removed_used),
        }
    });
    if let Some(rv) = &write.precondition {
        patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    }
    patch
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

/// The hub's next shared set (never, without a hub, or once the hub is gone).
async fn next_shared(
    changes: Option<&mut tokio::sync::watch::Receiver<BTreeSet<GroupResource>>>,
) -> Option<BTreeSet<GroupResource>> {
    let Some(changes) = changes else {
        return std::future::pending().await;
    };
    if changes.changed().await.is_err() {
        return std::future::pending().await;
    }
    Some(changes.borrow_and_update().clone())
}

#[cfg(test)]
mod tests {
    use super::{MAX_NOTE_BYTES, event_note, truncate};

    #[test]
    fn kcp_event_notes_start_with_the_workspace_path_and_still_fit() {
        assert_eq!(event_note(None, "x"), "x");
        assert_eq!(
            event_note(Some("root:org:team"), "x"),
            "[workspace root:org:team] x"
        );
        let long = event_note(Some("root:org:team"), &"y".repeat(5000));
        assert!(long.starts_with("[workspace root:org:team] ") && long.len() <= MAX_NOTE_BYTES);
    }

    #[test]
    fn event_notes_fit_the_api_limit_on_a_char_boundary() {
        let long = "é".repeat(2000);
        let cut = truncate(&long, 1000);
        assert!(cut.len() <= 1000 && cut.ends_with('…'), "{}", cut.len());
        assert_eq!(truncate("short", 1000), "short");
    }
}
