//! The IO of `Effect::ListForProof`: one consistent list, metadata only and paged, that says
//! how many objects of a type a namespace (or a cluster) holds, the newest one's
//! resourceVersion, and the list's. Whether it proves anything is the Reconciler's
//! (`lazyquota_index::reconciler::Proofs`); only those three numbers are kept of it.

use kube::{
    Api, Client,
    api::{DynamicObject, ListParams, PartialObjectMeta},
};
use lazyquota_index::{
    keys::{GroupResource, QuotaKey},
    reconciler::{Input, Listed},
    resolver::ServedResource,
};

use super::watch::{api_resource, routed_api};
use crate::transport::route::{Route, Routed};

/// A list's items: object metadata, routed so kcp's paths carry the logical cluster.
type Metadata = Routed<PartialObjectMeta<DynamicObject>>;

/// Objects asked for per page: metadata only, a few hundred bytes each.
const PAGE: u32 = 500;

/// Where the list of `Effect::ListForProof` lists: `served` in `namespace` (`None`: every
/// namespace) of the cluster `route` leads to.
pub(super) fn api(
    client: &Client,
    route: &Route,
    served: &ServedResource,
    namespace: Option<&str>,
) -> Api<Metadata> {
    routed_api(client, route, namespace, api_resource(served))
}

/// Carries out `Effect::ListForProof` for `key` with `api` (listing `namespace`): every page of
/// one consistent list (the continue token keeps the first page's snapshot; each request has
/// the client's deadline).
pub(super) async fn list(
    api: Api<Metadata>,
    key: QuotaKey,
    resource: GroupResource,
    namespace: Option<String>,
) -> Input {
    Input::Listed {
        key,
        resource,
        namespace,
        result: listed(&api).await,
    }
}

async fn listed(api: &Api<Metadata>) -> Result<Listed, String> {
    let mut params = ListParams::default().limit(PAGE);
    let mut tally = Tally::default();
    loop {
        let page = api.list(&params).await.map_err(|e| e.to_string())?;
        tally.page(
            &page.metadata,
            page.items
                .iter()
                .map(|o| o.0.metadata.resource_version.as_deref()),
        )?;
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return tally.done(),
        }
    }
}

/// What the pages of one list have shown so far.
#[derive(Debug, Default)]
struct Tally {
    revision: Option<u64>,
    objects: u64,
    newest: u64,
}

impl Tally {
    /// One page: its list metadata and its items' resourceVersions.
    fn page<'a>(
        &mut self,
        meta: &kube::core::ListMeta,
        versions: impl Iterator<Item = Option<&'a str>>,
    ) -> Result<(), String> {
        let revision: u64 = meta
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .ok_or("the list has no numeric resourceVersion")?;
        // Every page of one list is at the first page's resourceVersion.
        self.revision.get_or_insert(revision);
        for version in versions {
            let version: u64 = version
                .and_then(|v| v.parse().ok())
                .ok_or("an object without a numeric resourceVersion")?;
            self.objects += 1;
            self.newest = self.newest.max(version);
        }
        Ok(())
    }

    fn done(self) -> Result<Listed, String> {
        Ok(Listed {
            revision: self.revision.ok_or("no page")?,
            objects: self.objects,
            newest: self.newest,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::ListMeta;

    fn meta(rv: Option<&str>) -> ListMeta {
        ListMeta {
            resource_version: rv.map(str::to_owned),
            ..ListMeta::default()
        }
    }

    #[test]
    fn a_list_is_its_first_pages_version_its_objects_and_the_newest_of_them() {
        let mut tally = Tally::default();
        tally
            .page(&meta(Some("42")), [Some("7"), Some("40")].into_iter())
            .expect("a page");
        tally
            .page(&meta(Some("42")), [Some("12")].into_iter())
            .expect("a page");
        assert_eq!(
            tally.done(),
            Ok(Listed {
                revision: 42,
                objects: 3,
                newest: 40
            })
        );
        let mut empty = Tally::default();
        empty.page(&meta(Some("9")), std::iter::empty()).expect("a page");
        assert_eq!(
            empty.done(),
            Ok(Listed {
                revision: 9,
                objects: 0,
                newest: 0
            })
        );
    }

    #[test]
    fn a_version_that_is_not_a_number_makes_it_an_error_not_a_proof() {
        let mut tally = Tally::default();
        assert!(
            tally.page(&meta(None), std::iter::empty()).is_err(),
            "no version to compare with"
        );
        assert!(tally.page(&meta(Some("x")), std::iter::empty()).is_err());
        assert!(tally.page(&meta(Some("5")), [Some("abc")].into_iter()).is_err());
        assert!(tally.page(&meta(Some("5")), [None].into_iter()).is_err());
        assert!(Tally::default().done().is_err());
    }
}
