//! kcp: the wildcard LogicalCluster watch, read down to the events the reconciler's
//! membership takes (`lazyquota_index::reconciler::ClusterEvent`), and the logical cluster an
//! object read through a wildcard watch belongs to.

use futures::{StreamExt as _, stream::BoxStream};
use kube::{
    Client, Resource, ResourceExt as _,
    api::{ApiResource, DynamicObject},
    runtime::{WatchStreamExt as _, watcher},
};
use lazyquota_index::{
    keys::ClusterName,
    reconciler::{CLUSTER_ANNOTATION, ClusterEvent},
};

use crate::{
    controller::watch::routed_api,
    transport::route::{Route, Routed},
};

/// The annotation of a LogicalCluster with its workspace's canonical path (`root:org:team`);
/// absent on `root` and `system:*` clusters.
pub const PATH_ANNOTATION: &str = "kcp.io/path";

/// `core.kcp.io/v1alpha1` LogicalCluster: one singleton (`cluster`) per logical cluster.
pub fn logical_cluster_resource() -> ApiResource {
    ApiResource {
        group: "core.kcp.io".into(),
        version: "v1alpha1".into(),
        api_version: "core.kcp.io/v1alpha1".into(),
        kind: "LogicalCluster".into(),
        plural: "logicalclusters".into(),
    }
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

/// One event of the wildcard LogicalCluster watch, read down to what membership needs.
pub fn cluster_event(event: watcher::Event<LogicalCluster>) -> ClusterEvent {
    let read = |o: &LogicalCluster| {
        let phase = o.0.data["status"]["phase"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let path = o.annotations().get(PATH_ANNOTATION).cloned();
        (cluster_of(o), phase, path)
    };
    match event {
        watcher::Event::Init => ClusterEvent::RelistStarted,
        watcher::Event::InitApply(o) => {
            let (cluster, phase, path) = read(&o);
            ClusterEvent::Relisted { cluster, phase, path }
        }
        watcher::Event::InitDone => ClusterEvent::RelistDone,
        watcher::Event::Apply(o) => {
            let (cluster, phase, path) = read(&o);
            ClusterEvent::Applied { cluster, phase, path }
        }
        watcher::Event::Delete(o) => ClusterEvent::Deleted(cluster_of(&o)),
    }
}
