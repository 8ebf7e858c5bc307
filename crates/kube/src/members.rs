//! The clusters one controller serves, and the little it keeps per served cluster.
//!
//! On Kubernetes a controller serves one cluster, always. On kcp one controller serves every
//! logical cluster of its shard that has a ResourceQuota (the pure [`Membership`] decides,
//! fed here from the wildcard ResourceQuota and LogicalCluster watches); a cluster joining or
//! leaving adds or removes a [`Member`], its discovery slot and its watches — map entries,
//! no task, no connection.

use std::collections::BTreeSet;

use futures::{StreamExt as _, stream::BoxStream};
use kube::{
    Client, Resource, ResourceExt as _,
    api::DynamicObject,
    runtime::{WatchStreamExt as _, watcher},
};
use lazyquota_index::{
    keys::{ClusterName, GroupResource, QuotaKey},
    membership::Membership,
};

use crate::{
    route::{Route, Routed},
    shard::{CLUSTER_ANNOTATION, PATH_ANNOTATION, logical_cluster_resource},
    watch::routed_api,
};

/// What a controller keeps per served cluster, beyond the engine's and the watch set's
/// entries: about 100 bytes and the workspace path.
#[derive(Debug, Default)]
pub struct Member {
    /// kcp: the workspace path (`root:org:team`), named in Events.
    pub workspace: Option<String>,
    /// API groups the last discovery found unavailable (an APIService that does not answer).
    pub unavailable_groups: BTreeSet<String>,
    /// (quota, resource) pairs already told, by an Event, that their API group is unavailable.
    pub told_unavailable: BTreeSet<(QuotaKey, GroupResource)>,
}

/// The logical cluster a wildcard object belongs to (its `kcp.io/cluster` annotation).
pub fn cluster_of(object: &impl Resource) -> Option<ClusterName> {
    object
        .meta()
        .annotations
        .as_ref()?
        .get(CLUSTER_ANNOTATION)
        .map(|c| ClusterName::new(c))
}

/// Feeds one event of the wildcard quota watch to `m`.
pub fn on_quota<K: Resource>(m: &mut Membership, event: &watcher::Event<K>) {
    let key = |q: &K| Some((cluster_of(q)?, q.namespace().unwrap_or_default(), q.name_any()));
    match event {
        watcher::Event::Init => m.quota_relist_started(),
        watcher::Event::InitApply(q) => {
            if let Some((c, ns, name)) = key(q) {
                m.quota_relisted(c, ns, name);
            }
        }
        watcher::Event::InitDone => m.quota_relist_done(),
        // One without the annotation is logged where the controller skips it.
        watcher::Event::Apply(q) => {
            if let Some((c, ns, name)) = key(q) {
                m.quota_applied(c, &ns, &name);
            }
        }
        watcher::Event::Delete(q) => {
            if let Some((c, ns, name)) = key(q) {
                m.quota_deleted(&c, &ns, &name);
            }
        }
    }
}

/// A LogicalCluster of the wildcard watch.
pub type LogicalCluster = Routed<DynamicObject>;

/// The wildcard LogicalCluster watch of the shard `root` points at.
pub fn logical_clusters(
    root: &Client,
) -> BoxStream<'static, Result<watcher::Event<LogicalCluster>, watcher::Error>> {
    watcher(
        routed_api::<DynamicObject>(root, &Route::wildcard(), None, logical_cluster_resource()),
        watcher::Config::default(),
    )
    .default_backoff()
    .boxed()
}

/// Feeds one event of the wildcard LogicalCluster watch to `m`.
pub fn on_cluster(m: &mut Membership, event: &watcher::Event<LogicalCluster>) {
    let key = |o: &LogicalCluster| {
        let phase = o.0.data["status"]["phase"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        Some((cluster_of(o)?, phase))
    };
    match event {
        watcher::Event::Init => m.cluster_relist_started(),
        watcher::Event::InitApply(o) => {
            record_path(m, o);
            if let Some((c, phase)) = key(o) {
                m.cluster_relisted(c, phase);
            }
        }
        watcher::Event::InitDone => m.cluster_relist_done(),
        watcher::Event::Apply(o) => {
            record_path(m, o);
            if let Some((c, phase)) = key(o) {
                m.cluster_applied(c, phase);
            }
        }
        watcher::Event::Delete(o) => {
            if let Some((c, _)) = key(o) {
                m.cluster_deleted(c);
            }
        }
    }
}

/// Records a LogicalCluster's workspace path, when it has one.
fn record_path(m: &mut Membership, o: &LogicalCluster) {
    if let (Some(cluster), Some(path)) = (cluster_of(o), o.annotations().get(PATH_ANNOTATION)) {
        m.record_path(cluster, path.clone());
    }
}
