//! Changes of what a cluster may serve, as one stream: the executor turns each into
//! `Input::ApiChanged`, and the reconciler runs discovery again.

use futures::{StreamExt as _, stream::BoxStream};
use k8s_openapi::{
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
};
use kube::{
    Client,
    api::{DynamicObject, PartialObjectMeta},
    runtime::{WatchStreamExt as _, watcher},
};
use lazyquota_index::keys::ClusterName;
use tracing::warn;

use crate::{
    controller::{members, watch::routed_api},
    operate::metrics::Metrics,
    transport::route::Route,
};

/// One item per change of what a cluster may serve: CRDs and APIServices on Kubernetes; CRDs
/// and APIBindings in kcp logical clusters (metadata-only watches: only the fact of a change
/// matters, discovery reads the rest). Under the wildcard route each item names the logical
/// cluster of the changed object; `None` means every served cluster (a change on Kubernetes,
/// or a relist of the watch, after which any change may have been missed).
pub fn api_change_stream(
    client: &Client,
    route: &Route,
    kcp: bool,
    metrics: &Metrics,
) -> BoxStream<'static, Option<ClusterName>> {
    /// Passes on changes; a failure is a log line and `lazyquota_watch_errors_total` (the
    /// watcher retries with backoff; discovery keeps its last answer meanwhile).
    fn changed<K: kube::Resource>(
        resource: &'static str,
        wildcard: bool,
        metrics: Metrics,
    ) -> impl FnMut(Result<watcher::Event<K>, watcher::Error>) -> futures::future::Ready<Option<Option<ClusterName>>>
    {
        move |event| {
            let of = |o: &K| if wildcard { members::cluster_of(o) } else { None };
            let changed = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => Some(of(&o)),
                Ok(watcher::Event::InitDone) => Some(None),
                Ok(_) => None,
                Err(error) => {
                    let reason = super::watch::failure_reason(&error);
                    warn!(resource, reason, %error, "watch of API changes failed; retrying (discovery keeps its last answer)");
                    metrics.watch_error(resource, reason);
                    None
                }
            };
            futures::future::ready(changed)
        }
    }
    let wildcard = route == &Route::wildcard();
    let watch = |resource: kube::api::ApiResource| {
        watcher(
            routed_api::<PartialObjectMeta<DynamicObject>>(client, route, None, resource),
            watcher::Config::default(),
        )
        .default_backoff()
    };
    let crds = watch(kube::api::ApiResource::erase::<CustomResourceDefinition>(&())).filter_map(changed(
        "customresourcedefinitions.apiextensions.k8s.io",
        wildcard,
        metrics.clone(),
    ));
    let other = if kcp {
        let bindings = kube::api::ApiResource {
            group: "apis.kcp.io".into(),
            version: "v1alpha1".into(),
            api_version: "apis.kcp.io/v1alpha1".into(),
            kind: "APIBinding".into(),
            plural: "apibindings".into(),
        };
        watch(bindings)
            .filter_map(changed("apibindings.apis.kcp.io", wildcard, metrics.clone()))
            .boxed()
    } else {
        watch(kube::api::ApiResource::erase::<APIService>(&()))
            .filter_map(changed(
                "apiservices.apiregistration.k8s.io",
                wildcard,
                metrics.clone(),
            ))
            .boxed()
    };
    futures::stream::select(crds, other).boxed()
}
