//! How the executor speaks to the apiserver about quotas: the status write's body, a quota
//! watch event and a request's failure as the Reconciler takes them. Decides nothing.

use k8s_openapi::{api::core::v1::ResourceQuota, apimachinery::pkg::api::resource::Quantity};
use kube::runtime::watcher;
use lazyquota_index::reconciler::{Failure, QuotaEvent, StatusWrite};

use crate::transport::route::Routed;

/// A request's failure as the reconciler reads it: the status code if the server answered.
#[allow(clippy::needless_pass_by_value)] // takes what `map_err` gives
pub(super) fn failure(error: kube::Error) -> Failure {
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
pub(super) fn quota_event(event: watcher::Event<Routed<ResourceQuota>>) -> QuotaEvent {
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
pub(super) fn status_patch(write: &StatusWrite) -> serde_json::Value {
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
