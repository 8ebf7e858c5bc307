//! Watch streams, reduced at once to what the store keeps.
//!
//! A count-only demand uses a metadata-only watch (`PartialObjectMetadata`); pods, services,
//! PVCs, ResourceClaims and DeviceClasses use a typed watch whose objects are turned into the quota crate's compact
//! projection as they arrive, so a full object never outlives its event.
//!
//! No task per watch: every stream is polled by the controller's single task (a
//! `SelectAll`). Over HTTP/2 (the default) a watch is one stream of a shared connection
//! (`crate::transport::client`, `crate::transport::spread`); over HTTP/1.1 it occupies a connection of its own for
//! its lifetime. Each open watch keeps kube's line buffer (`tokio_util`'s `FramedRead`) and its
//! watcher's state, most of an open watch's heap (`benches/results/watch-cost.md`), which is
//! why kcp shares a type's watch from two logical clusters on (the Reconciler's hub).

use std::{fmt, sync::Arc};

use futures::{
    StreamExt as _,
    stream::{AbortHandle, Abortable, BoxStream},
};
use k8s_openapi::api::{
    core::v1::{Namespace, PersistentVolumeClaim, Pod, Service},
    resource::v1::{DeviceClass, ResourceClaim},
};
use kube::{
    Api, Client, Resource, ResourceExt as _,
    api::{ApiResource, DynamicObject, ListParams, ObjectList, PartialObjectMeta, WatchParams},
    core::WatchEvent,
    runtime::{WatchStreamExt as _, watcher},
};
use lazyquota_index::{
    engine::{DeviceClassEntry, Projected},
    keys::{ALL_NAMESPACES, Need},
    resolver::ServedResource,
};
use lazyquota_quota::{
    ClaimProjection, Extracted, FeatureGates, Interner, PodProjection, PvcProjection, ServiceProjection,
};
use serde::de::DeserializeOwned;
use tracing::warn;

use crate::transport::route::{Route, Routed};

pub use lazyquota_index::planner::WatchKey;

pub use lazyquota_index::watches::ObjectEvent;

/// One event of a watch (a controller's own or its share of a kcp shared watch).
pub type WatchItem = lazyquota_index::watches::Item;

/// Per-watch options.
#[derive(Clone, Copy, Debug)]
pub struct WatchOptions {
    /// Use streaming lists (`sendInitialEvents`) instead of paginated list + watch.
    pub streaming_lists: bool,
    /// Feature gates for projections.
    pub gates: FeatureGates,
}

/// An abortable, tagged watch stream and its abort handle.
pub type Tagged<T> = BoxStream<'static, (T, WatchItem)>;

/// Opens the watch for `key` (not polled until the caller polls it). Dropping or aborting
/// it closes its connection.
pub fn open<T: Clone + Send + 'static>(
    client: &Client,
    route: &Route,
    served: &ServedResource,
    key: &WatchKey,
    options: WatchOptions,
    interner: &Arc<Interner>,
    tag: T,
) -> (Tagged<T>, AbortHandle) {
    let mut config = watcher::Config::default();
    if options.streaming_lists {
        config = config.streaming_lists();
    }
    let ns = key.namespace.as_deref();
    let gates = options.gates;
    let stream = match (
        key.need,
        served.resource.group.as_str(),
        served.resource.resource.as_str(),
    ) {
        (Need::Typed, "", "pods") => {
            let interner = interner.clone();
            typed::<Pod>(client, route, ns, config, move |p| {
                Projected::Pod(held(p, PodProjection::from_pod(p, gates, &interner)))
            })
        }
        (Need::Typed, "", "services") => typed::<Service>(client, route, ns, config, |s| {
            Projected::Service(ServiceProjection::from_service(s))
        }),
        (Need::Typed, "", "persistentvolumeclaims") => {
            let interner = interner.clone();
            typed::<PersistentVolumeClaim>(client, route, ns, config, move |c| {
                Projected::Pvc(held(c, PvcProjection::from_pvc(c, &interner)))
            })
        }
        (Need::Typed, "resource.k8s.io", "resourceclaims") => {
            let interner = interner.clone();
            typed::<ResourceClaim>(client, route, ns, config, move |c| {
                Projected::Claim(ClaimProjection::from_claim(c, &interner, &crate::object_id))
            })
        }
        (Need::Typed, "resource.k8s.io", "deviceclasses") => {
            let api: Api<Routed<DeviceClass>> = Api::all_with(client.clone(), &(route.clone(), ()));
            events(
                watcher(api, config)
                    .backoff(super::backoff::object_watch())
                    .boxed(),
                device_class,
            )
        }
        _ => metadata(client, route, served, ns, config),
    };
    let (stream, handle) = futures::stream::abortable(stream);
    let stream: Abortable<_> = stream;
    (stream.map(move |item| (tag.clone(), item)).boxed(), handle)
}

/// What the store keeps of a DeviceClass.
fn device_class(class: &DeviceClass) -> Projected {
    Projected::DeviceClass(DeviceClassEntry {
        name: class.name_any().into(),
        extended_resource_name: class
            .spec
            .as_ref()
            .and_then(|s| s.extended_resource_name.as_deref())
            .map(Into::into),
    })
}

fn typed<K>(
    client: &Client,
    route: &Route,
    namespace: Option<&str>,
    config: watcher::Config,
    project: impl Fn(&K) -> Projected + Send + 'static,
) -> BoxStream<'static, WatchItem>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + fmt::Debug
        + Send
        + 'static,
{
    let api: Api<Routed<K>> = routed_api(client, route, namespace, ());
    events(
        watcher(api, config)
            .backoff(super::backoff::object_watch())
            .boxed(),
        project,
    )
}

/// The API of `K` under `route`, in `namespace` or across all of them.
pub fn routed_api<K>(
    client: &Client,
    route: &Route,
    namespace: Option<&str>,
    dt: K::DynamicType,
) -> Api<Routed<K>>
where
    K: Resource,
    K::DynamicType: Send + Sync + 'static,
{
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &(route.clone(), dt)),
        None => Api::all_with(client.clone(), &(route.clone(), dt)),
    }
}

fn metadata(
    client: &Client,
    route: &Route,
    served: &ServedResource,
    namespace: Option<&str>,
    config: watcher::Config,
) -> BoxStream<'static, WatchItem> {
    let api: Api<Routed<PartialObjectMeta<DynamicObject>>> =
        routed_api(client, route, namespace, api_resource(served));
    events(
        watcher(api, config)
            .backoff(super::backoff::object_watch())
            .boxed(),
        |_| Projected::Meta,
    )
}

/// The dynamic type of a served resource.
pub fn api_resource(served: &ServedResource) -> ApiResource {
    let (group, version) = (&served.resource.group, &served.version);
    ApiResource {
        group: group.clone(),
        version: version.clone(),
        api_version: if group.is_empty() {
            version.clone()
        } else {
            format!("{group}/{version}")
        },
        kind: served.kind.clone(),
        plural: served.resource.resource.clone(),
    }
}

fn events<K: Resource + Send + 'static>(
    stream: BoxStream<'static, Result<watcher::Event<Routed<K>>, watcher::Error>>,
    project: impl Fn(&K) -> Projected + Send + 'static,
) -> BoxStream<'static, WatchItem> {
    stream
        .map(move |event| match event {
            Ok(watcher::Event::Init) => WatchItem::Init,
            Ok(watcher::Event::InitDone) => WatchItem::InitDone,
            Ok(watcher::Event::InitApply(o)) => WatchItem::InitApply(object_event(&o, &project)),
            Ok(watcher::Event::Apply(o)) => WatchItem::Apply(object_event(&o, &project)),
            Ok(watcher::Event::Delete(o)) => WatchItem::Delete(object_event(&o, &project)),
            Err(e) => WatchItem::Failed(failure_reason(&e), e.to_string()),
        })
        .boxed()
}

fn object_event<K: Resource>(object: &Routed<K>, project: &impl Fn(&K) -> Projected) -> ObjectEvent {
    ObjectEvent {
        namespace: object.0.namespace().unwrap_or_default(),
        name: object.0.name_any(),
        object: project(&object.0),
        revision: object.0.resource_version().and_then(|rv| rv.parse().ok()),
    }
}

/// A short, bounded label for a watch failure (metrics and Events).
pub(crate) fn failure_reason(error: &watcher::Error) -> &'static str {
    let api = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => Some(s.code),
        _ => None,
    };
    match api {
        Some(401) => "unauthorized",
        Some(403) => "forbidden",
        Some(404) => "not_found",
        Some(410) => "expired",
        Some(429) => "too_many_requests",
        Some(500..=599) => "server_error",
        Some(_) => "api_error",
        None => match error {
            watcher::Error::NoResourceVersion => "no_resource_version",
            _ => "transport",
        },
    }
}

/// Whether the apiserver serves streaming lists (`sendInitialEvents`, the `WatchList`
/// feature): asks once for a streaming watch of namespaces and looks at the first event.
/// Servers without the feature reject the request (422) or ignore the parameter.
pub async fn probe_streaming_lists(client: &Client) -> bool {
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
    let params = WatchParams::streaming_lists().timeout(5);
    let Ok(stream) = api.watch_metadata(&params, "0").await else {
        return false;
    };
    let mut stream = stream.boxed();
    // A server that honours sendInitialEvents ends the initial events with a bookmark
    // annotated `k8s.io/initial-events-end`; look at most at a bounded number of events.
    for _ in 0..10_000 {
        match stream.next().await {
            Some(Ok(WatchEvent::Bookmark(b))) => {
                return b.metadata.annotations.contains_key("k8s.io/initial-events-end");
            }
            Some(Ok(_)) => {}
            _ => return false,
        }
    }
    false
}

/// Lists everything `api` returns, 500 objects a page.
pub async fn list_all<K>(api: &Api<K>) -> kube::Result<Vec<K>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page: ObjectList<K> = api.list(&params).await?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// Lists one namespace of a resource, 500 objects a page, reduced at once to what the store
/// keeps (the typed objects of a page are dropped before the next page is requested).
///
/// [`ALL_NAMESPACES`] lists the whole cluster (kcp's cluster-scoped quotas); each object is
/// then named `<namespace>/<name>`, as that partition identifies them.
pub async fn list_namespace(
    client: &Client,
    route: &Route,
    served: &ServedResource,
    namespace: &str,
    need: Need,
    gates: FeatureGates,
    interner: &Interner,
) -> kube::Result<Vec<(String, Projected)>> {
    match (
        need,
        served.resource.group.as_str(),
        served.resource.resource.as_str(),
    ) {
        (Need::Typed, "", "pods") => {
            let api = scoped_api::<Pod>(client, route, namespace);
            list_pages(&api, namespace == ALL_NAMESPACES, |p| {
                Projected::Pod(held(p, PodProjection::from_pod(p, gates, interner)))
            })
            .await
        }
        (Need::Typed, "", "services") => {
            let api = scoped_api::<Service>(client, route, namespace);
            list_pages(&api, namespace == ALL_NAMESPACES, |s| {
                Projected::Service(ServiceProjection::from_service(s))
            })
            .await
        }
        (Need::Typed, "", "persistentvolumeclaims") => {
            let api = scoped_api::<PersistentVolumeClaim>(client, route, namespace);
            list_pages(&api, namespace == ALL_NAMESPACES, |c| {
                Projected::Pvc(held(c, PvcProjection::from_pvc(c, interner)))
            })
            .await
        }
        (Need::Typed, "resource.k8s.io", "resourceclaims") => {
            let api = scoped_api::<ResourceClaim>(client, route, namespace);
            list_pages(&api, namespace == ALL_NAMESPACES, |c| {
                Projected::Claim(ClaimProjection::from_claim(c, interner, &crate::object_id))
            })
            .await
        }
        (Need::Typed, "resource.k8s.io", "deviceclasses") => {
            let api: Api<Routed<DeviceClass>> = routed_api(client, route, None, ());
            list_pages(&api, true, device_class).await
        }
        _ => {
            let all = namespace == ALL_NAMESPACES;
            let api: Api<Routed<DynamicObject>> =
                routed_api(client, route, (!all).then_some(namespace), api_resource(served));
            let mut out = Vec::new();
            let mut params = ListParams::default().limit(500);
            loop {
                let page = api.list_metadata(&params).await?;
                out.extend(page.items.iter().map(|o| (listed_name(o, all), Projected::Meta)));
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => return Ok(out),
                }
            }
        }
    }
}

/// The API of `namespace`, or of the whole cluster for [`ALL_NAMESPACES`].
fn scoped_api<K>(client: &Client, route: &Route, namespace: &str) -> Api<Routed<K>>
where
    K: Resource<DynamicType = ()>,
{
    routed_api(
        client,
        route,
        (namespace != ALL_NAMESPACES).then_some(namespace),
        (),
    )
}

/// An object's name as its partition identifies it: `<namespace>/<name>` in the
/// [`ALL_NAMESPACES`] partition (names repeat across namespaces), the name elsewhere.
pub fn listed_name(object: &impl Resource, all: bool) -> String {
    if all {
        format!("{}/{}", object.namespace().unwrap_or_default(), object.name_any())
    } else {
        object.name_any()
    }
}

async fn list_pages<K>(
    api: &Api<Routed<K>>,
    all: bool,
    project: impl Fn(&K) -> Projected,
) -> kube::Result<Vec<(String, Projected)>>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug,
    K::DynamicType: Send + Sync + 'static,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        out.extend(page.items.iter().map(|o| (listed_name(&o.0, all), project(&o.0))));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// The projection of `object`, logging each quantity it could not hold. The object still
/// counts; the sums those quantities enter are unknown, and the controller withholds those
/// keys (with an Event on the quota) instead of writing them lower.
fn held<K: Resource, T>(object: &K, extracted: Extracted<T>) -> T {
    for problem in &extracted.problems {
        warn!(
            namespace = object.meta().namespace.as_deref().unwrap_or(""),
            name = object.meta().name.as_deref().unwrap_or(""),
            field = %problem.field,
            error = %problem.source,
            "quantity beyond what lazyquota holds: the object counts, usage keys it enters are withheld"
        );
    }
    extracted.projection
}
