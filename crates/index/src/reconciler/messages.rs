//! What goes into the reconciler and what comes out: [`Input`]s the executor feeds it,
//! [`Effect`]s it returns, and the time each input comes with.

use std::{collections::BTreeSet, sync::Arc, time::Instant};

use k8s_openapi::api::core::v1::ResourceQuota;
use lazyquota_quota::Time;

use super::{ClusterEvent, Discovered, Failure, QuotaEvent, SharedEvent, SharedKey, StatusWrite};
use crate::{
    engine::Projected,
    keys::{ClusterName, GroupResource, QuotaKey},
    planner::WatchKey,
    reconciler::proofs::Listed,
    resolver::ServedResource,
    watches::{Item, ObjectEvent},
};

/// The time of an input: a monotonic instant for timers, the wall time for evaluators.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    /// For timers and backoff.
    pub instant: Instant,
    /// For comparisons with object timestamps.
    pub time: Time,
}

/// What happened, as the executor saw it.
#[derive(Debug)]
pub enum Input {
    /// An event of the ResourceQuota watch (wildcard on a kcp shard).
    Quota(QuotaEvent),
    /// kcp: an event of the wildcard LogicalCluster watch.
    LogicalCluster(ClusterEvent),
    /// What a cluster may serve changed (a CRD, APIService or APIBinding); `None`: any
    /// served cluster (a change on Kubernetes, or a relist of the watch).
    ApiChanged(Option<ClusterName>),
    /// A discovery ended.
    Discovered {
        /// Of this cluster.
        cluster: ClusterName,
        /// What it found, or the error.
        result: Result<Discovered, String>,
    },
    /// An item of watch `id`.
    Watch {
        /// The watch.
        id: u64,
        /// The item.
        item: Item,
    },
    /// A list filling a namespace that joined a cluster-wide watch ended.
    Filled {
        /// The watch.
        key: WatchKey,
        /// The namespace.
        namespace: Arc<str>,
        /// What it listed, or the error.
        listed: Result<Vec<(String, Projected)>, String>,
    },
    /// A status write ([`Effect::WriteStatus`]) was answered.
    Written {
        /// The quota.
        key: QuotaKey,
        /// The resourceVersion the write was conditioned on.
        precondition: Option<String>,
        /// The quota as written, or the failure.
        result: Result<ResourceQuota, Failure>,
    },
    /// A fresh read ([`Effect::ReadQuota`]) was answered.
    Read {
        /// The quota.
        key: QuotaKey,
        /// The quota, or the failure.
        result: Result<ResourceQuota, Failure>,
    },
    /// A list for a proof ([`Effect::ListForProof`]) was answered.
    Listed {
        /// The quota it was asked for.
        key: QuotaKey,
        /// The resource listed.
        resource: GroupResource,
        /// The namespace listed, as asked (`None`: every namespace): a list of another scope
        /// than the quota's now (a kcp quota that became cluster-scoped meanwhile) proves
        /// nothing.
        namespace: Option<String>,
        /// The list's resourceVersion, how many objects it had and the newest one's
        /// resourceVersion, or the error.
        result: Result<Listed, String>,
    },
    /// kcp: an event of a shared wildcard watch ([`Effect::OpenShared`]).
    Shared {
        /// The shared watch.
        key: SharedKey,
        /// The event.
        event: SharedEvent,
    },
    /// kcp: a share list ([`Effect::ListShare`]) ended.
    ListedShare {
        /// The shared watch.
        key: SharedKey,
        /// The list's generation, as asked.
        generation: u64,
        /// The list's resourceVersion and objects, or the error.
        result: Result<(Option<u64>, Vec<ObjectEvent>), String>,
    },
}

/// What the executor is to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Open watch `id`.
    OpenWatch {
        /// Tags its items.
        id: u64,
        /// What it watches.
        key: WatchKey,
        /// The version and scope served.
        served: ServedResource,
    },
    /// Close watch `id`.
    CloseWatch {
        /// Its id.
        id: u64,
    },
    /// List one namespace joining a cluster-wide watch; answer with [`Input::Filled`].
    Fill {
        /// The watch.
        key: WatchKey,
        /// The namespace.
        namespace: Arc<str>,
        /// The version and scope served.
        served: ServedResource,
    },
    /// Run discovery of a cluster; answer with [`Input::Discovered`].
    Discover {
        /// The cluster.
        cluster: ClusterName,
        /// Where a server lists its API groups without their resources (kcp's `/apis`) and
        /// each must be asked for on its own: only these groups (and the core group) are
        /// asked for, the others reported in [`Discovered::skipped_groups`]. A kcp workspace's
        /// first discovery asks only for the groups its quotas name (one request instead of
        /// about twenty on the path to its first status); `None`: every group.
        groups: Option<BTreeSet<String>>,
    },
    /// Write a quota's status; answer with [`Input::Written`].
    WriteStatus(StatusWrite),
    /// Read a quota afresh; answer with [`Input::Read`].
    ReadQuota(QuotaKey),
    /// List the objects of `served` a quota's key is computed from (one namespace's, or every
    /// namespace's of the cluster) with a consistent list, metadata only, paged; answer with
    /// [`Input::Listed`]: its resourceVersion, how many objects and the newest one's
    /// resourceVersion ([`super::proofs`]).
    ListForProof {
        /// The quota it is for (its cluster is the one listed).
        key: QuotaKey,
        /// The type and version.
        served: ServedResource,
        /// The namespace; `None`: every namespace.
        namespace: Option<String>,
    },
    /// Record an Event on a quota.
    Event {
        /// The quota.
        quota: QuotaKey,
        /// Its uid, if known.
        uid: Option<String>,
        /// kcp: its workspace path.
        workspace: Option<String>,
        /// Warning (else Normal).
        warning: bool,
        /// The reason.
        reason: &'static str,
        /// The note.
        note: String,
    },
    /// kcp: open a metadata-only wildcard watch of `served` for the whole shard; answer with
    /// [`Input::Shared`], tagged `key`.
    OpenShared {
        /// Tags its events.
        key: SharedKey,
        /// The type and version.
        served: ServedResource,
    },
    /// kcp: close the shared watch `key`.
    CloseShared {
        /// Its key.
        key: SharedKey,
    },
    /// kcp: list one logical cluster's (namespace's) share of a shared watch, metadata only,
    /// with the list's resourceVersion; answer with [`Input::ListedShare`].
    ListShare {
        /// The shared watch.
        key: SharedKey,
        /// Handed back with the answer.
        generation: u64,
        /// The logical cluster.
        cluster: ClusterName,
        /// Its namespace, when the subscriber watches one only.
        namespace: Option<String>,
        /// The type and version.
        served: ServedResource,
    },
    /// kcp: a logical cluster was let go (its Event series go).
    Disengaged(ClusterName),
    /// Count something.
    Metric(Metric),
}

/// A metric to count.
#[derive(Clone, Debug, PartialEq)]
pub enum Metric {
    /// A quota sync ended (`written`, `conflict`, `error`, `unchanged`, `shadow_*`).
    QuotaSync {
        /// The result label.
        result: &'static str,
        /// How long it took since its write started; `None`: decided within the input or
        /// tick that produced this effect (the executor times that: the reconciler has no
        /// clock).
        seconds: Option<f64>,
    },
    /// A status write was answered (`ok`, `conflict`, `not_found`, `invalid`, `error`).
    StatusWrite(&'static str),
    /// A watch (re)lists: its resource label.
    Relist(String),
    /// A watch failed.
    WatchError {
        /// Its resource label.
        resource: String,
        /// The reason label.
        reason: &'static str,
    },
    /// A discovery ended (`ok`, `error`).
    Discovery(&'static str),
    /// kcp: logical clusters served now.
    Engaged(usize),
    /// kcp: shared wildcard watches open now.
    SharedWatches(usize),
    /// A list for a proof that the store caught up with a quota: `matched` (the store is the
    /// state the list shows: its keys are written at once), `differed` (the watch has events to
    /// deliver: compared again as it does), `failed`.
    CatchUpList {
        /// Its resource label.
        resource: String,
        /// What came of it.
        result: &'static str,
    },
    /// Charges no object paid for, dropped at the create bound: creates admission charged and
    /// then refused (its retry path does), or stored later than the bound.
    ChargesExpired(u32),
    /// A key was written without proof that the watch of this resource (label) had caught up
    /// with its quota: the list failed or went unanswered, and the settling time ended the
    /// wait.
    SettleWaitEnded(String),
    /// kcp: a joining subscriber of the shared watch of this resource (label) buffered more
    /// than its bound and lists its share again.
    ShareOverflow(String),
}
