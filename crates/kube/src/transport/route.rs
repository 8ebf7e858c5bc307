//! Routing requests to one of a kcp shard's logical clusters through one client.
//!
//! A kube `Client` is bound to one base URL and spawns a task (its request buffer) when it is
//! built, so a client per logical cluster would cost a task per engaged workspace. Instead the
//! shard's engine keeps one client for the shard's root and puts the logical cluster into each
//! request's path: [`Routed<K>`] is `K` with `/clusters/<name>` in front of its URL, and every
//! `Api` built over it (lists, watches, status patches, Events) goes there. On plain
//! Kubernetes the route is empty and the URL is `K`'s own.

use std::{borrow::Cow, sync::Arc};

use kube::{Resource, core::DynamicResourceScope};
use lazyquota_index::keys::ClusterName;
use serde::{Deserialize, Serialize};

/// The path prefix of a logical cluster (`/clusters/<name>`), or none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Route(Option<Arc<str>>);

impl Route {
    /// The client's own cluster: no prefix.
    #[must_use]
    pub fn direct() -> Self {
        Self(None)
    }

    /// The logical cluster `name` of the shard the client points at.
    #[must_use]
    pub fn cluster(name: &ClusterName) -> Self {
        Self(Some(format!("/clusters/{}", name.as_str()).into()))
    }

    /// Every logical cluster of the shard (`/clusters/*`: wildcard lists and watches).
    #[must_use]
    pub fn wildcard() -> Self {
        Self(Some("/clusters/*".into()))
    }

    /// The prefix to put in front of an API path (`""` for [`Route::direct`]).
    #[must_use]
    pub fn prefix(&self) -> &str {
        self.0.as_deref().unwrap_or_default()
    }
}

/// `K`, requested under a [`Route`]: same kind, same body, the route in front of its URL.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Routed<K>(pub K);

impl<K: Resource> Resource for Routed<K>
where
    K::DynamicType: Send + Sync + 'static,
{
    /// The route and `K`'s own dynamic type.
    type DynamicType = (Route, K::DynamicType);
    /// Any scope: `Api::namespaced_with` and `Api::all_with` both apply.
    type Scope = DynamicResourceScope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(&dt.1)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(&dt.1)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(&dt.1)
    }

    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(&dt.1)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(&dt.1)
    }

    fn url_path(dt: &Self::DynamicType, namespace: Option<&str>) -> String {
        format!("{}{}", dt.0.prefix(), K::url_path(&dt.1, namespace))
    }

    // Keeps `PartialObjectMeta<_>`'s metadata-only requests metadata-only.
    fn metadata_api() -> bool {
        K::metadata_api()
    }

    fn meta(&self) -> &kube::api::ObjectMeta {
        self.0.meta()
    }

    fn meta_mut(&mut self) -> &mut kube::api::ObjectMeta {
        self.0.meta_mut()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota};
    use kube::api::{ApiResource, DynamicObject, PartialObjectMeta};

    use super::*;

    #[test]
    fn a_routed_type_has_the_route_in_front_of_its_own_path() {
        let c = Route::cluster(&ClusterName::new("2abc"));
        assert_eq!(
            Routed::<ResourceQuota>::url_path(&(c.clone(), ()), Some("team")),
            "/clusters/2abc/api/v1/namespaces/team/resourcequotas"
        );
        assert_eq!(
            Routed::<ResourceQuota>::url_path(&(Route::wildcard(), ()), None),
            "/clusters/*/api/v1/resourcequotas"
        );
        assert_eq!(
            Routed::<ConfigMap>::url_path(&(Route::direct(), ()), Some("a")),
            ConfigMap::url_path(&(), Some("a")),
            "no route: the type's own path"
        );
        let widgets = ApiResource {
            group: "example.io".into(),
            version: "v1".into(),
            api_version: "example.io/v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
        };
        assert_eq!(
            Routed::<PartialObjectMeta<DynamicObject>>::url_path(&(c, widgets), None),
            "/clusters/2abc/apis/example.io/v1/widgets"
        );
    }

    #[test]
    fn metadata_only_requests_stay_metadata_only() {
        assert!(Routed::<PartialObjectMeta<DynamicObject>>::metadata_api());
        assert!(!Routed::<ResourceQuota>::metadata_api());
    }
}
