//! How the executor speaks to the apiserver about quotas: a quota watch event and a request's
//! failure as the Reconciler takes them (a status write's body is the Reconciler's,
//! `StatusWrite::patch`). Decides nothing.

use k8s_openapi::api::core::v1::ResourceQuota;
use kube::runtime::watcher;
use lazyquota_index::reconciler::{Failure, QuotaEvent};

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
