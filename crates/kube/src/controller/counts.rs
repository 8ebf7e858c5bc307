//! The IO of `Effect::CountObjects`: one consistent list, metadata only, that says how many
//! objects of a type a namespace (or a cluster) holds and at which resourceVersion. Whether
//! the count vouches for anything is the Reconciler's (`lazyquota_index::reconciler::Counts`).

use kube::{
    Api, Client,
    api::{DynamicObject, ListParams, PartialObjectMeta},
};
use lazyquota_index::{
    keys::{GroupResource, QuotaKey},
    reconciler::{Counted, Input},
    resolver::ServedResource,
};

use super::watch::{api_resource, routed_api};
use crate::transport::route::{Route, Routed};

/// A list's items: object metadata, routed so kcp's paths carry the logical cluster.
type Metadata = Routed<PartialObjectMeta<DynamicObject>>;

/// Objects asked for in the one page: a server that gives `remainingItemCount` (Kubernetes
/// and kcp do for a list without selectors) counts any number from it; one that does not
/// still counts up to this many.
const PAGE: u32 = 50;

/// Where the count of `Effect::CountObjects` lists: `served` in `namespace` (`None`: every
/// namespace) of the cluster `route` leads to.
pub(super) fn api(
    client: &Client,
    route: &Route,
    served: &ServedResource,
    namespace: Option<&str>,
) -> Api<Metadata> {
    routed_api(client, route, namespace, api_resource(served))
}

/// Carries out `Effect::CountObjects` for `key` with `api` (listing `namespace`): one page,
/// and what remains.
pub(super) async fn count(
    api: Api<Metadata>,
    key: QuotaKey,
    resource: GroupResource,
    namespace: Option<String>,
) -> Input {
    let result = match api.list(&ListParams::default().limit(PAGE)).await {
        Ok(page) => counted(&page.metadata, page.items.len()),
        Err(error) => Err(error.to_string()),
    };
    Input::Counted {
        key,
        resource,
        namespace,
        result,
    }
}

/// The count a first page of `items` objects and its list metadata give.
fn counted(meta: &kube::core::ListMeta, items: usize) -> Result<Counted, String> {
    let revision = meta
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .ok_or("the list has no numeric resourceVersion")?;
    let more = meta.continue_.as_deref().is_some_and(|c| !c.is_empty());
    let remaining = match (more, meta.remaining_item_count) {
        (false, _) => 0,
        (true, Some(n)) => u64::try_from(n).map_err(|_| format!("remainingItemCount {n}"))?,
        (true, None) => return Err("more than one page and no remainingItemCount".to_owned()),
    };
    Ok(Counted {
        revision,
        objects: items as u64 + remaining,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::ListMeta;

    fn meta(rv: Option<&str>, cont: Option<&str>, remaining: Option<i64>) -> ListMeta {
        ListMeta {
            resource_version: rv.map(str::to_owned),
            continue_: cont.map(str::to_owned),
            remaining_item_count: remaining,
            ..ListMeta::default()
        }
    }

    #[test]
    fn a_count_is_the_page_plus_what_remains_or_an_error_when_unknown() {
        assert_eq!(
            counted(&meta(Some("42"), None, None), 3),
            Ok(Counted {
                revision: 42,
                objects: 3
            })
        );
        assert_eq!(
            counted(&meta(Some("42"), Some("token"), Some(950)), 50),
            Ok(Counted {
                revision: 42,
                objects: 1000
            })
        );
        assert!(
            counted(&meta(Some("42"), Some("token"), None), 50).is_err(),
            "unknown, not low"
        );
        assert!(
            counted(&meta(None, None, None), 3).is_err(),
            "no version to compare with"
        );
        assert!(counted(&meta(Some("x"), None, None), 3).is_err());
    }
}
