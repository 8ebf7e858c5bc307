//! Debug lines on the path from a new quota to its first status: the quota seen, discovery,
//! the watch's list, a share's list and the status write, each when it starts and ends. With
//! `RUST_LOG=lazyquota_kube::controller::trace=debug` their timestamps show where a first
//! status's time goes; off, they cost one level check per input.

use lazyquota_index::{
    fanout::WatchItem,
    reconciler::{CLUSTER_ANNOTATION, Effect, Input, QuotaEvent},
};
use tracing::debug;

/// An input on that path.
pub(super) fn input(input: &Input) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    match input {
        Input::Quota(QuotaEvent::Applied(q)) => debug!(
            quota = q.metadata.name.as_deref().unwrap_or_default(),
            cluster = q
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CLUSTER_ANNOTATION))
                .map_or("", String::as_str),
            uid = q.metadata.uid.as_deref().unwrap_or_default(),
            "quota seen"
        ),
        Input::Discovered { cluster, result } => debug!(%cluster, ok = result.is_ok(), "discovered"),
        Input::Watch {
            id,
            item: WatchItem::Init,
        } => debug!(id, "list started"),
        Input::Watch {
            id,
            item: WatchItem::InitDone,
        } => debug!(id, "listed"),
        Input::ListedShare { key, result, .. } => {
            debug!(resource = %key.resource, ok = result.is_ok(), "share listed");
        }
        Input::Written { key, result, .. } => debug!(%key, ok = result.is_ok(), "status written"),
        _ => {}
    }
}

/// An effect on that path.
pub(super) fn effect(effect: &Effect) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    match effect {
        Effect::Discover { cluster, groups } => debug!(%cluster, ?groups, "discovering"),
        Effect::OpenWatch { id, key, .. } => {
            debug!(id, cluster = %key.cluster, resource = %key.resource_label(), "opening watch");
        }
        Effect::ListShare { key, cluster, .. } => debug!(%cluster, resource = %key.resource, "listing share"),
        Effect::WriteStatus(write) => debug!(key = %write.key, "writing status"),
        _ => {}
    }
}

/// A discovery's group walk starting (after `/api` and `/apis` answered), under `prefix`.
pub(super) fn walking(prefix: &str, group_versions: usize) {
    debug!(prefix, group_versions, "discovery: walking the groups");
}
