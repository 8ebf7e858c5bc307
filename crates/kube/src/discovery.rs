//! Discovery: what a cluster serves, in the terms of the pure
//! [`Resolver`](lazyquota_index::resolver::Resolver).
//!
//! Aggregated discovery (two requests: `/api` and `/apis`) where the server supports it,
//! the per-group walk otherwise. There is no discovery watch in Kubernetes; the controller
//! re-runs this when CustomResourceDefinitions or APIServices change, and on a slow poll.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIGroupList, APIResourceList, APIVersions};
use kube::Client;
use kube::client::APIGroupDiscoveryList;
use lazyquota_index::{keys::GroupResource, resolver::ServedResource};
use serde::de::DeserializeOwned;

use crate::route::Route;

/// One discovery run's results.
#[derive(Debug, Default)]
pub struct Discovered {
    /// Every resource served, at the version to watch.
    pub served: Vec<ServedResource>,
    /// Groups whose discovery failed in this run (their previous results are kept).
    pub failed_groups: Vec<String>,
}

/// Runs discovery against `client`'s cluster.
///
/// The version of each resource is its group's preferred version, or, for a resource the
/// preferred version does not serve, the first version (in the server's priority order)
/// that does — what client-go's `ServerPreferredResources` returns and KCM uses.
///
/// Aggregated discovery marks a group version whose APIService does not answer as `Stale`
/// (listed without resources): such a group is reported in `failed_groups`, so that what was
/// known of it is kept rather than taken as gone.
pub async fn discover(client: &Client, route: &Route) -> Result<Discovered, kube::Error> {
    let at = |path: &str| format!("{}{path}", route.prefix());
    let groups = match aggregated(client, &at("/apis")).await {
        Ok(Some(apis)) => match aggregated(client, &at("/api")).await? {
            Some(core) => core.items.into_iter().chain(apis.items).collect::<Vec<_>>(),
            None => return discover_per_group(client, route).await,
        },
        // Servers older than 1.26 lack aggregated discovery (an error or a legacy answer);
        // kcp answers every logical cluster's /api and /apis with the legacy lists.
        Ok(None) | Err(_) => return discover_per_group(client, route).await,
    };
    let mut found = Discovered::default();
    for group in groups {
        let name = group.metadata.and_then(|m| m.name).unwrap_or_default();
        if group
            .versions
            .iter()
            .any(|v| v.freshness.as_deref() == Some("Stale"))
        {
            found.failed_groups.push(name);
            continue;
        }
        let mut seen = std::collections::BTreeSet::new();
        // Versions come in the server's priority order: the first is the preferred one.
        for version in group.versions {
            let version_name = version.version.unwrap_or_default();
            for resource in version.resources {
                let Some(plural) = resource.resource else { continue };
                if plural.contains('/') || !seen.insert(plural.clone()) {
                    continue;
                }
                served_push(
                    &mut found.served,
                    &name,
                    &version_name,
                    plural,
                    resource.response_kind.and_then(|k| k.kind).unwrap_or_default(),
                    resource.scope.as_deref() == Some("Namespaced"),
                    resource.verbs,
                );
            }
        }
    }
    Ok(found)
}

/// What a server that supports aggregated discovery sends; the legacy lists are the fallback.
const ACCEPT_AGGREGATED: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";

/// The aggregated discovery document at `path` (`/api` or `/apis`), or `None` when the server
/// answered with the legacy `APIVersions`/`APIGroupList` instead. That answer must not be read
/// as an aggregated list: its `groups` are not `items`, so it would parse as "serves nothing".
async fn aggregated(client: &Client, path: &str) -> Result<Option<APIGroupDiscoveryList>, kube::Error> {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, ACCEPT_AGGREGATED)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let body: serde_json::Value = client.request(request).await?;
    if body.get("kind").and_then(serde_json::Value::as_str) != Some("APIGroupDiscoveryList") {
        return Ok(None);
    }
    serde_json::from_value(body)
        .map(Some)
        .map_err(kube::Error::SerdeError)
}

fn served_push(
    served: &mut Vec<ServedResource>,
    group: &str,
    version: &str,
    plural: String,
    kind: String,
    namespaced: bool,
    verbs: Vec<String>,
) {
    served.push(ServedResource {
        resource: GroupResource::new(group.to_owned(), plural),
        version: version.to_owned(),
        kind,
        namespaced,
        verbs,
    });
}

/// The per-group walk (one request per group version), for servers without aggregated
/// discovery: every version of every group, the preferred one first (ours rather than
/// kube's `Discovery`, which cannot put a logical cluster's route in front of its paths).
async fn discover_per_group(client: &Client, route: &Route) -> Result<Discovered, kube::Error> {
    let at = |path: &str| format!("{}{path}", route.prefix());
    let mut served = Vec::new();
    let core: APIVersions = get(client, &at("/api")).await?;
    let mut group_versions: Vec<(String, Vec<String>)> = vec![(
        String::new(),
        core.versions.iter().map(|v| format!("/api/{v}")).collect(),
    )];
    let groups: APIGroupList = get(client, &at("/apis")).await?;
    for group in groups.groups {
        let preferred = group.preferred_version.map(|p| p.group_version);
        let mut paths: Vec<String> = preferred.iter().map(|gv| format!("/apis/{gv}")).collect();
        paths.extend(
            group
                .versions
                .iter()
                .filter(|v| Some(&v.group_version) != preferred.as_ref())
                .map(|v| format!("/apis/{}", v.group_version)),
        );
        group_versions.push((group.name, paths));
    }
    for (group, paths) in group_versions {
        let mut seen = std::collections::BTreeSet::new();
        for path in paths {
            let list: APIResourceList = get(client, &at(&path)).await?;
            let version = list
                .group_version
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned();
            for resource in list.resources {
                // Subresources (`pods/status`) are not types of their own.
                if resource.name.contains('/') || !seen.insert(resource.name.clone()) {
                    continue;
                }
                served_push(
                    &mut served,
                    &group,
                    &version,
                    resource.name,
                    resource.kind,
                    resource.namespaced,
                    resource.verbs,
                );
            }
        }
    }
    Ok(Discovered {
        served,
        failed_groups: Vec::new(),
    })
}

/// GETs `path` and reads it as `T`.
async fn get<T: DeserializeOwned>(client: &Client, path: &str) -> Result<T, kube::Error> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    client.request(request).await
}
