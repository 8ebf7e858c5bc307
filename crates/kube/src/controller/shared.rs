//! kcp: the IO of the Reconciler's shared watches — a metadata-only wildcard watch of a type for
//! the whole shard (`/clusters/*/...`), and a list of one logical cluster's share of it. Which
//! watch is shared, who gets which event and when a share is listed is the Reconciler's
//! (`lazyquota_index::reconciler::Hub`); this module only makes the requests and reads their
//! answers.

use futures::{
    StreamExt as _,
    stream::{AbortHandle, BoxStream},
};
use kube::{
    Api, Client, ResourceExt as _,
    api::{DynamicObject, ListParams, PartialObjectMeta},
    runtime::{WatchStreamExt as _, watcher},
};
use lazyquota_index::{
    engine::Projected,
    keys::ClusterName,
    reconciler::{CLUSTER_ANNOTATION, Effect, Input, SharedEvent, SharedKey, SharedObject},
    resolver::ServedResource,
};

use super::watch::{ObjectEvent, api_resource, failure_reason, routed_api};
use crate::transport::route::{Route, Routed};

/// Pages of a share list, at most (500 objects each): a bound, not an expected size.
const MAX_PAGES: usize = 100_000;

/// Opens the shared wildcard watch of `served` through the shard's `root` client; its events
/// come tagged with `key`. Aborting the handle closes it.
pub(super) fn open(
    root: &Client,
    served: &ServedResource,
    key: SharedKey,
) -> (BoxStream<'static, (SharedKey, SharedEvent)>, AbortHandle) {
    let api: Api<Routed<PartialObjectMeta<DynamicObject>>> =
        routed_api(root, &Route::wildcard(), None, api_resource(served));
    let events = watcher(api, watcher::Config::default())
        .backoff(super::backoff::object_watch())
        .map(move |event| (key.clone(), shared_event(event)));
    let (events, abort) = futures::stream::abortable(events);
    (events.boxed(), abort)
}

/// Carries out [`Effect::ListShare`]: lists a logical cluster's (or one namespace's) share of
/// a shared watch, metadata only, with the list's resourceVersion; answers with
/// [`Input::ListedShare`].
pub(super) async fn list_share(root: Client, effect: Effect) -> Input {
    let Effect::ListShare {
        key,
        generation,
        cluster,
        namespace,
        served,
    } = effect
    else {
        unreachable!("only share lists are carried out here")
    };
    let result = list(&root, &cluster, namespace.as_deref(), &served).await;
    Input::ListedShare {
        key,
        generation,
        result,
    }
}

async fn list(
    root: &Client,
    cluster: &ClusterName,
    namespace: Option<&str>,
    served: &ServedResource,
) -> Result<(Option<u64>, Vec<ObjectEvent>), String> {
    let api: Api<Routed<PartialObjectMeta<DynamicObject>>> =
        routed_api(root, &Route::cluster(cluster), namespace, api_resource(served));
    let mut params = ListParams::default().limit(500);
    let mut objects = Vec::new();
    let mut at = None;
    for _ in 0..MAX_PAGES {
        let page = api.list(&params).await.map_err(|e| e.to_string())?;
        if at.is_none() {
            at = page
                .metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse().ok());
        }
        objects.extend(page.items.iter().map(|o| object_event(&o.0)));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    Ok((at, objects))
}

type MetaEvent = Result<watcher::Event<Routed<PartialObjectMeta<DynamicObject>>>, watcher::Error>;

fn shared_event(event: MetaEvent) -> SharedEvent {
    match event {
        Ok(watcher::Event::Init) => SharedEvent::Init,
        Ok(watcher::Event::InitApply(o)) => SharedEvent::InitApply(shared_object(&o.0)),
        Ok(watcher::Event::InitDone) => SharedEvent::InitDone,
        Ok(watcher::Event::Apply(o)) => SharedEvent::Apply(shared_object(&o.0)),
        Ok(watcher::Event::Delete(o)) => SharedEvent::Delete(shared_object(&o.0)),
        Err(error) => SharedEvent::Failed(failure_reason(&error), error.to_string()),
    }
}

fn shared_object(object: &PartialObjectMeta<DynamicObject>) -> SharedObject {
    SharedObject {
        cluster: object.annotations().get(CLUSTER_ANNOTATION).cloned(),
        object: object_event(object),
    }
}

fn object_event(object: &PartialObjectMeta<DynamicObject>) -> ObjectEvent {
    ObjectEvent {
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
        object: Projected::Meta,
        revision: object.resource_version().and_then(|rv| rv.parse().ok()),
    }
}
