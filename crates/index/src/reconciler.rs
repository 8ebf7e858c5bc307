//! The reconciler: every decision of one controller, pure — fed [`Input`]s, it returns
//! [`Effect`]s, in the shape of quinn-proto's `Connection`.
//!
//! ```text
//!  executor (crates/kube/src/controller.rs)          Reconciler (this module, no IO, no clock)
//!  quota / LogicalCluster / API-change watch ─► Input ─► Engine, Membership, Discoveries
//!  object watches, fills, discoveries         ─► Input ─► Watches ─► Engine stores ─► WorkQueue
//!  status writes and reads answered           ─► Input ─► record, conflict policy, backoff
//!  the timer (next_wakeup)                    ─► tick  ─► discoveries due, resync, syncs
//!                       Effect ◄─ open/close watches, fills, discoveries, status writes
//!                                 (each with its precondition and the keys it may lower),
//!                                 reads, Events, shared watches and share lists, metrics
//! ```
//!
//! The executor turns streams into inputs and effects into requests; it decides nothing. The
//! same reconciler runs under the deterministic simulator (`crates/index/tests/sim`), which
//! drives it against a model apiserver with faults and checks that no write lowers a `used`
//! below the objects that exist.
//!
//! Time comes in: `Instant`s for timers (the reconciler never reads a clock; the simulator
//! makes them from one origin) and a wall [`Time`] for what evaluators compare with
//! timestamps (a pod's deletion grace).

mod books;
mod discovery;
mod hub;
mod messages;
mod proofs;
mod quotas;
mod restarts;
mod status;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ResourceQuota;
use lazyquota_quota::FeatureGates;
use tracing::{debug, info, warn};

pub use books::Books;
pub use discovery::Discovered;
pub use hub::{Hub, MAX_JOINS, MAX_PENDING, Share, SharedEvent, SharedKey, SharedObject};
pub use messages::{Effect, Input, Metric, Now};
pub use proofs::{Listed, Proof, Proofs};
pub use quotas::{ClusterEvent, QuotaEvent};
use restarts::Restarts;
pub use status::{Failure, StatusWrite};

use crate::{
    discoveries::Discoveries,
    engine::Engine,
    keys::{ClusterName, GroupResource, ObjectIds, QuotaKey},
    membership::Membership,
    planner::{Mode, PlanSettings},
    policy::DemandChange,
    queue::WorkQueue,
    watches::{Action, Watches},
};

/// The annotation naming the logical cluster of an object read through a kcp wildcard watch.
pub const CLUSTER_ANNOTATION: &str = "kcp.io/cluster";

/// How long after someone else changed a quota's status.used the quota is checked again.
pub const STATUS_RECHECK_DELAY: Duration = Duration::from_secs(5);

/// After a status write conflicted and the quota watch has brought nothing newer yet, how long
/// its newer version is waited for before the quota is read afresh: the watch brings it in
/// milliseconds, and a read jumps over the versions in between, whose charges are then noted
/// at the read's version (paid only by objects stored after it).
pub const CONFLICT_WAIT: Duration = Duration::from_secs(1);

/// A write that lowers a quota's `used` goes out at most this often per quota, by default: the
/// deletes of a busy namespace are written down together (as KCM's workers coalesce them), and
/// every write lowering a quota while admission charges it makes admission retry its update —
/// whose retry charges creates it then refuses (k8s.io/apiserver's `checkQuotas` keeps a first
/// pass's error for a request the retry admits and charges), which are held until the bound.
pub const LOWER_PACE: Duration = Duration::from_millis(100);

/// A status write in flight this long no longer counts against the concurrency: a write that
/// hangs (until its request deadline) must not hold back the other quotas' writes.
pub const WRITE_STALL: Duration = Duration::from_secs(5);

/// How long a quota's first write waits for a watch still on its first list.
pub const FIRST_LIST_GRACE: Duration = Duration::from_secs(30);

/// How long a key of `spec.hard` may stay uncomputed (its type not served, or not listed)
/// before its quota gets a Warning Event: meanwhile admission refuses every create that would
/// charge it if `status.used` lacks it. Longer than a first list, a CRD's establishing or an
/// APIBinding's binding usually take.
pub const UNRESOLVED_WARNING: Duration = Duration::from_secs(30);

/// Discoveries run at once, at most (a kcp shard engaging many logical clusters at start).
pub const MAX_DISCOVERIES: usize = 4;

/// What the reconciler is configured with. Defaults follow upstream KCM where it has one.
#[derive(Clone, Debug)]
#[allow(clippy::struct_excessive_bools)] // independent switches
pub struct Settings {
    /// The cluster served (on a kcp shard: the name quotas without a cluster fall under).
    pub cluster: ClusterName,
    /// Lazy (constrained types only) or eager (everything, like upstream).
    pub mode: Mode,
    /// Full recalculation of every quota (zero disables).
    pub resync_period: Duration,
    /// Status writes in flight at once.
    pub concurrency: usize,
    /// Compute and report, never write.
    pub shadow: bool,
    /// Above this many demanding namespaces, a resource is watched cluster-wide.
    pub namespace_watch_threshold: usize,
    /// Safety-net discovery poll.
    pub discovery_poll: Duration,
    /// Feature gates of the KCM whose results are mirrored.
    pub gates: FeatureGates,
    /// kcp semantics (the engine's kcp rules; Events name the workspace).
    pub kcp: bool,
    /// Serve every logical cluster of a kcp shard that has a quota (else the one `cluster`).
    pub shard: bool,
    /// kcp: a type counted in this many logical clusters of the shard is served by one
    /// shared wildcard watch ([`Hub`]); 0: never (each cluster watches it itself).
    pub shared_threshold: usize,
    /// kcp: shared events a subscriber joining a shared watch may buffer while its share is
    /// listed; past this it overflows and lists again.
    pub shared_buffer: usize,
    /// The one cluster's workspace path, named in Events.
    pub workspace: Option<String>,
    /// How long a charge of admission's that no object pays for is kept: kube-apiserver's
    /// `--request-timeout`, past which a create's request has ended ([`crate::charges`]).
    pub charge_bound: Duration,
    /// A write lowering a quota goes out at most this often per quota ([`LOWER_PACE`]).
    pub lower_pace: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            cluster: ClusterName::new("default"),
            mode: Mode::Lazy,
            resync_period: Duration::from_mins(5),
            concurrency: 5,
            shadow: false,
            namespace_watch_threshold: 8,
            discovery_poll: Duration::from_mins(5),
            gates: FeatureGates::default(),
            kcp: false,
            shard: false,
            shared_threshold: 0,
            shared_buffer: MAX_PENDING,
            workspace: None,
            charge_bound: Duration::from_millis(crate::charges::DEFAULT_BOUND_MS),
            lower_pace: LOWER_PACE,
        }
    }
}

impl Settings {
    /// What the planner takes from these settings.
    #[must_use]
    pub fn plan(&self) -> PlanSettings {
        PlanSettings {
            mode: self.mode,
            namespace_watch_threshold: self.namespace_watch_threshold,
            gates: self.gates,
        }
    }
}

/// Of writes started at `started`, how many still count against the concurrency at `now`,
/// and when the next of them stops counting ([`WRITE_STALL`]).
fn busy_writes(started: impl Iterator<Item = Instant>, now: Instant) -> (usize, Option<Instant>) {
    let mut busy = 0;
    let mut next = None::<Instant>;
    for at in started {
        let stalls_at = at + WRITE_STALL;
        if stalls_at > now {
            busy += 1;
            next = Some(next.map_or(stalls_at, |n| n.min(stalls_at)));
        }
    }
    (busy, next)
}

/// What the reconciler keeps per served cluster beyond the engine's and the watch set's
/// entries: the workspace path and the API groups discovery found unavailable.
#[derive(Debug, Default)]
pub struct Member {
    /// kcp: the workspace path (`root:org:team`), named in Events.
    pub workspace: Option<String>,
    /// API groups the last discovery found unavailable (an APIService that does not answer).
    pub unavailable_groups: BTreeSet<String>,
    /// (quota, resource) pairs already told, by an Event, that their API group is unavailable.
    pub told_unavailable: BTreeSet<(QuotaKey, GroupResource)>,
}

/// Every decision of one controller. See the module documentation.
#[derive(Debug)]
pub struct Reconciler {
    settings: Settings,
    engine: Engine,
    watches: Watches,
    queue: WorkQueue<QuotaKey>,
    discoveries: Discoveries,
    /// kcp: which logical clusters of the shard to serve.
    shard: Option<Membership>,
    /// The clusters served now.
    members: BTreeMap<ClusterName, Member>,
    /// When each status write in flight started (one per quota at most: the queue does not
    /// hand out a quota being written).
    writing: HashMap<QuotaKey, Instant>,
    /// When each open watch was opened (its first list's grace).
    opened: HashMap<u64, Instant>,
    /// When each quota's last status write went out ([`LOWER_PACE`]).
    last_write: HashMap<QuotaKey, Instant>,
    /// Quotas whose write conflicted, waiting until then for the quota watch to bring the
    /// newer version ([`CONFLICT_WAIT`]).
    conflicted: HashMap<QuotaKey, Instant>,
    /// kcp: the shard's shared watches.
    hub: Hub,
    /// When watches failed after their sync are reopened (by watch id).
    restarts: Restarts<u64, (crate::planner::WatchKey, crate::resolver::ServedResource)>,
    /// A relist of the quota watch in progress: the quotas so far.
    quota_relist: Option<Vec<ResourceQuota>>,
    quotas_synced: bool,
    books: Books,
    /// Lists asked to prove that quiet watches have caught up with quotas.
    proofs: Proofs,
    /// The origin of the milliseconds given to the lowering rule.
    epoch: Instant,
    next_resync: Option<Instant>,
    effects: Vec<Effect>,
}

impl Reconciler {
    /// A reconciler with `settings`, naming objects with `ids`, started at `now`.
    #[must_use]
    pub fn new(settings: Settings, ids: ObjectIds, now: Instant) -> Self {
        let engine = if settings.kcp {
            Engine::new(settings.gates).with_kcp_semantics()
        } else {
            Engine::new(settings.gates)
        };
        // Sharing is a shard's: one cluster's own watches are never shared.
        let shared_threshold = if settings.shard {
            settings.shared_threshold
        } else {
            0
        };
        let mut reconciler = Self {
            watches: Watches::new(settings.plan(), shared_threshold > 0, ids),
            engine,
            queue: WorkQueue::new(),
            discoveries: Discoveries::new(settings.discovery_poll, MAX_DISCOVERIES),
            shard: settings.shard.then(Membership::default),
            members: BTreeMap::new(),
            writing: HashMap::new(),
            opened: HashMap::new(),
            conflicted: HashMap::new(),
            last_write: HashMap::new(),
            hub: Hub::new(shared_threshold, settings.shared_buffer.max(1)),
            restarts: Restarts::default(),
            quota_relist: None,
            quotas_synced: false,
            books: Books::default(),
            proofs: Proofs::default(),
            epoch: now,
            next_resync: (!settings.resync_period.is_zero()).then(|| now + settings.resync_period),
            effects: Vec::new(),
            settings,
        };
        if !reconciler.settings.shard {
            let cluster = reconciler.settings.cluster.clone();
            let member = Member {
                workspace: reconciler.settings.workspace.clone(),
                ..Member::default()
            };
            reconciler.members.insert(cluster.clone(), member);
            reconciler.discoveries.add(cluster, now);
        }
        reconciler
    }

    /// Feeds one input.
    pub fn handle(&mut self, input: Input, now: Now) {
        match input {
            Input::Quota(event) => self.on_quota_event(event, now),
            Input::LogicalCluster(event) => self.on_logical_cluster(event, now),
            Input::ApiChanged(Some(cluster)) => self.discoveries.api_changed(&cluster, now.instant),
            Input::ApiChanged(None) if self.shard.is_none() => {
                let cluster = self.settings.cluster.clone();
                self.discoveries.api_changed(&cluster, now.instant);
            }
            Input::ApiChanged(None) => self.discoveries.all_changed(now.instant),
            Input::Discovered { cluster, result } => {
                self.discoveries.finished(&cluster, result.is_ok(), now.instant);
                if self.members.contains_key(&cluster) {
                    self.on_discovery(&cluster, result, now);
                }
            }
            Input::Watch { id, item } => self.on_watch_item(id, item, now),
            Input::Filled {
                key,
                namespace,
                listed,
            } => {
                let hub = &self.hub;
                let mut out = Vec::new();
                self.watches.on_fill(
                    &mut self.engine,
                    &key,
                    &namespace,
                    listed,
                    &|r: &GroupResource| hub.is_shared(r),
                    &mut out,
                );
                self.carry_out(out, now);
            }
            Input::Written {
                key,
                precondition,
                result,
            } => self.on_write(&key, precondition.as_deref(), result, now),
            Input::Read { key, result } => self.on_read(&key, result, now),
            Input::Listed {
                key,
                resource,
                namespace,
                result,
            } => {
                let answer = match &result {
                    Ok(listed) => self.proof_answered(&key, &resource, listed),
                    Err(error) => {
                        warn!(quota = %key, %resource, %error, "listing to prove a watch caught up with a quota failed: its keys wait for the watch, or the settling time");
                        "failed"
                    }
                };
                self.effects.push(Effect::Metric(Metric::CatchUpList {
                    resource: crate::planner::resource_label(&resource),
                    result: answer,
                }));
                if self
                    .proofs
                    .answered(&key, &resource, namespace.as_deref(), result.ok())
                {
                    self.queue.add(key, now.instant);
                }
            }
            Input::Shared { key, event } => {
                if matches!(event, crate::fanout::WatchItem::Init) {
                    // The shared watch lists afresh (kube's watcher says so before it lists, and
                    // the list is consistent): every subscriber's share will be the state at or
                    // past now, as if its watch were opened now. Without this, a subscriber
                    // whose quota's version came before the relist, on a type quiet since, had
                    // no event at or past that version and a proof list that never matched
                    // again: its new key was never written (simulator seed 14,391).
                    for id in self.hub.subscribers_of(&key) {
                        self.opened.insert(id, now.instant);
                    }
                }
                let shares = self.hub.on_event(&key, event, now.instant, &mut self.effects);
                for (id, item) in shares {
                    self.on_watch_item(id, item, now);
                }
            }
            Input::ListedShare {
                key,
                generation,
                result,
            } => {
                let shares = self
                    .hub
                    .on_listed(&key, generation, result, now.instant, &mut self.effects);
                for (id, item) in shares {
                    self.on_watch_item(id, item, now);
                }
            }
        }
    }

    fn on_watch_item(&mut self, id: u64, item: crate::watches::Item, now: Now) {
        if matches!(item, crate::watches::Item::InitDone) {
            self.restarts.listed(&id, now.instant);
        }
        let mut out = Vec::new();
        self.watches
            .on_item(&mut self.engine, id, item, now.time, &mut out);
        self.carry_out(out, now);
        // A quota whose list at its version differed from the store is compared again as the
        // watch delivers.
        if !self.proofs.is_empty()
            && let Some(key) = self.watches.key_of(id)
        {
            let resource = key.resource.clone();
            for quota in self.proofs.listing(&key.cluster, &resource) {
                let Some(entry) = self.engine.index.get(&quota) else {
                    continue;
                };
                let namespace = (&**entry.demand_namespace() != crate::keys::ALL_NAMESPACES)
                    .then(|| entry.demand_namespace().to_string());
                let at_version = matches!(
                    self.proofs
                        .proof(&quota, &resource, entry.payload.view.0, namespace.as_deref()),
                    Proof::Listed(_)
                );
                if at_version {
                    self.queue.add(quota, now.instant);
                }
            }
        }
    }

    /// Does what is due at `now`: discoveries, the periodic resync, quota syncs (within the
    /// concurrency).
    pub fn tick(&mut self, now: Now) {
        for cluster in self.discoveries.start_due(now.instant) {
            let groups = self.discovery_groups(&cluster);
            let first = groups.is_some();
            self.effects.push(Effect::Discover {
                cluster: cluster.clone(),
                groups,
            });
            if first {
                self.start_on_guesses(&cluster, now);
            }
        }
        self.hub.tick(now.instant, &mut self.effects);
        for (id, (key, served)) in self.restarts.take_due(now.instant) {
            if self.watches.is_running(id) {
                info!(watch = %key, "watch reopened after its restart's wait");
                self.effects.push(Effect::OpenWatch { id, key, served });
            }
        }
        if self.next_resync.is_some_and(|at| at <= now.instant) {
            self.next_resync = Some(now.instant + self.settings.resync_period);
            self.enqueue_all(now.instant);
        }
        while self.busy_writes(now.instant).0 < self.settings.concurrency.max(1) {
            let Some(key) = self.queue.pop_ready(now.instant) else {
                break;
            };
            self.sync_quota(key, now);
        }
    }

    /// The groups a discovery of `cluster` asks for ([`Effect::Discover`]): on a kcp shard in
    /// lazy mode, a workspace's first discovery asks only for the groups its quotas name —
    /// what its first statuses wait for — and the full one follows
    /// ([`Discovered::skipped_groups`]). Every other discovery asks for everything.
    fn discovery_groups(&self, cluster: &ClusterName) -> Option<BTreeSet<String>> {
        if self.shard.is_none() || self.settings.mode != Mode::Lazy || self.engine.resolver.knows(cluster) {
            return None;
        }
        Some(
            self.engine
                .index
                .demanded_in(cluster)
                .filter(|r| !r.group.is_empty())
                .map(|r| r.group.clone())
                .collect(),
        )
    }

    /// kcp: a workspace's first discovery has just been asked for; the watches its quotas
    /// need start at once on what the shard's other workspaces serve ([`Resolver::guess`]),
    /// so that its first list runs beside the discovery instead of after it. Nothing is
    /// written before the discovery answers (`sync_quota`).
    ///
    /// [`Resolver::guess`]: crate::resolver::Resolver::guess
    fn start_on_guesses(&mut self, cluster: &ClusterName, now: Now) {
        let demanded = self.demanded_in(cluster);
        let guessed = self.engine.resolver.guess(cluster, &demanded);
        if !guessed.is_empty() {
            debug!(%cluster, resources = ?guessed, "watching on what other workspaces serve until the discovery answers");
        }
        for resource in &guessed {
            self.sync_watches(cluster, resource, now);
        }
    }

    /// The types the quotas of `cluster` name.
    fn demanded_in(&self, cluster: &ClusterName) -> Vec<GroupResource> {
        self.engine.index.demanded_in(cluster).cloned().collect()
    }

    /// When [`Reconciler::tick`] has something to do next (`None`: only an input can bring
    /// work).
    #[must_use]
    pub fn next_wakeup(&self, now: Instant) -> Option<Instant> {
        let (busy, next_stall) = self.busy_writes(now);
        let syncs = if busy < self.settings.concurrency.max(1) {
            self.queue.next_ready()
        } else {
            next_stall
        };
        [
            syncs,
            self.discoveries.next_due(),
            self.next_resync,
            self.hub.next_wakeup(),
            self.restarts.next_due(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The effects decided since the last call, in order.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// Status writes not answered yet (the executor's shutdown drains them).
    #[must_use]
    pub fn writes_in_flight(&self) -> usize {
        self.writing.len()
    }

    /// The engine (read-only: reports and `explain`).
    #[must_use]
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The watch set (read-only: reports and `explain`).
    #[must_use]
    pub fn watches(&self) -> &Watches {
        &self.watches
    }

    /// kcp: the shard's shared watches (read-only: reports and `explain`).
    #[must_use]
    pub fn hub(&self) -> &Hub {
        &self.hub
    }

    /// The shadow and withheld books.
    #[must_use]
    pub fn books(&self) -> &Books {
        &self.books
    }

    /// The clusters served now.
    #[must_use]
    pub fn members(&self) -> &BTreeMap<ClusterName, Member> {
        &self.members
    }

    /// The settings.
    #[must_use]
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The quota watch has completed its first list.
    #[must_use]
    pub fn quotas_synced(&self) -> bool {
        self.quotas_synced
    }

    /// Of the writes in flight, how many still count against the concurrency at `now`, and
    /// when the next of them stops counting.
    fn busy_writes(&self, now: Instant) -> (usize, Option<Instant>) {
        busy_writes(self.writing.values().copied(), now)
    }

    fn enqueue_all(&mut self, now: Instant) {
        let mut keys: Vec<QuotaKey> = self.engine.index.quotas().map(|(k, _)| k.clone()).collect();
        // In key order, not the index's hash order: the same inputs give the same effects
        // (the simulator replays a seed).
        keys.sort_unstable();
        for key in keys {
            self.queue.add(key, now);
        }
    }

    /// Milliseconds since the reconciler started: the lowering rule's time.
    fn ms(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// The create bound in milliseconds ([`Settings::charge_bound`]).
    fn bound_ms(&self) -> u64 {
        if crate::mutation::active(crate::mutation::Mutation::ChargeReleasedByTime) {
            return crate::lowering::SETTLE_MS;
        }
        u64::try_from(self.settings.charge_bound.as_millis()).unwrap_or(u64::MAX)
    }

    // ---- demand → watches: the watch set decides, this passes its actions on ---------------

    fn apply_demand(&mut self, changes: &[DemandChange], now: Now) {
        let touched: BTreeSet<(ClusterName, GroupResource)> = changes
            .iter()
            .map(|c| (c.cluster.clone(), c.resource.clone()))
            .collect();
        for (cluster, resource) in touched {
            self.sync_watches(&cluster, &resource, now);
        }
    }

    fn sync_watches(&mut self, cluster: &ClusterName, resource: &GroupResource, now: Now) {
        let hub = &self.hub;
        let mut out = Vec::new();
        self.watches.sync(
            &mut self.engine,
            cluster,
            resource,
            &|r: &GroupResource| hub.is_shared(r),
            &mut out,
        );
        self.carry_out(out, now);
    }

    /// kcp: the demand changed; if that changes which types are shared, the watches of those
    /// types move to or from their shared watch.
    fn reshare(&mut self, now: Now) {
        if !self.hub.refresh_shared() {
            return;
        }
        debug!("shared types changed");
        let hub = &self.hub;
        let mut out = Vec::new();
        self.watches
            .on_shared_changed(&mut self.engine, &|r: &GroupResource| hub.is_shared(r), &mut out);
        self.carry_out(out, now);
    }

    /// Turns the watch set's actions into effects (and log lines).
    fn carry_out(&mut self, actions: Vec<Action>, now: Now) {
        let mut demand_changed = false;
        for action in actions {
            match action {
                Action::Start {
                    id,
                    key,
                    served,
                    shared,
                } => {
                    info!(watch = %key, version = %served.version, shared, "watch started");
                    self.opened.insert(id, now.instant);
                    if shared {
                        let (cluster, namespace) = (key.cluster.clone(), key.namespace.clone());
                        self.hub
                            .subscribe(id, cluster, namespace, &served, now.instant, &mut self.effects);
                    } else {
                        self.effects.push(Effect::OpenWatch { id, key, served });
                    }
                }
                Action::Restart { id, key, served } => {
                    self.opened.insert(id, now.instant);
                    if !self.hub.unsubscribe(id, &mut self.effects) {
                        self.effects.push(Effect::CloseWatch { id });
                    }
                    match self.restarts.restart(id, (key.clone(), served), now.instant) {
                        Some((key, served)) => {
                            info!(watch = %key, "watch failed after its sync: reopened to list afresh");
                            self.effects.push(Effect::OpenWatch { id, key, served });
                        }
                        None => {
                            info!(watch = %key, "watch failed again soon after a restart: reopened after a wait");
                        }
                    }
                }
                Action::Stop { id, key } => {
                    info!(watch = %key, "watch stopped");
                    self.opened.remove(&id);
                    self.restarts.forget(&id);
                    if !self.hub.unsubscribe(id, &mut self.effects) {
                        self.effects.push(Effect::CloseWatch { id });
                    }
                }
                Action::Fill {
                    key,
                    namespace,
                    served,
                } => {
                    debug!(watch = %key, %namespace, "filling a joining namespace from a list");
                    self.effects.push(Effect::Fill {
                        key,
                        namespace,
                        served,
                    });
                }
                Action::Enqueue(quota) => self.queue.add(quota, now.instant),
                Action::Event {
                    quota,
                    warning,
                    reason,
                    note,
                } => self.emit(&quota, warning, reason, note),
                Action::Demand {
                    cluster,
                    resource,
                    count,
                } => {
                    self.hub.set_demand(&cluster, &resource, count);
                    demand_changed = true;
                }
                Action::Listing(key) => self
                    .effects
                    .push(Effect::Metric(Metric::Relist(key.resource_label()))),
                Action::Synced(key) => info!(watch = %key, "watch synced"),
                Action::Recovered(key) => info!(watch = %key, "watch recovered"),
                Action::Failing {
                    key,
                    reason,
                    message,
                    new_reason,
                } => {
                    if new_reason {
                        warn!(watch = %key, reason, error = %message, "watch failing; until it lists again, keys computed from it are not written lower");
                    }
                    self.effects.push(Effect::Metric(Metric::WatchError {
                        resource: key.resource_label(),
                        reason,
                    }));
                }
                Action::Malformed {
                    key,
                    namespace,
                    name,
                    reason,
                } => {
                    warn!(watch = %key, %namespace, %name, %reason, "object could not be projected; left out of usage");
                }
                Action::FillFailed {
                    key,
                    namespace,
                    error,
                } => {
                    warn!(watch = %key, %namespace, %error, "listing a joining namespace failed; restarting the watch");
                }
            }
        }
        if demand_changed {
            self.reshare(now);
        }
    }

    /// Records an Event on a quota.
    fn emit(&mut self, quota: &QuotaKey, warning: bool, reason: &'static str, note: String) {
        let uid = self.engine.index.get(quota).and_then(|e| e.payload.uid.clone());
        let workspace = self.members.get(&quota.cluster).and_then(|m| m.workspace.clone());
        self.effects.push(Effect::Event {
            quota: quota.clone(),
            uid,
            workspace,
            warning,
            reason,
            note,
        });
    }
}
