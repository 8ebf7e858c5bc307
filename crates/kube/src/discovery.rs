//! Discovery: what a cluster serves, in the terms of the pure
//! [`Resolver`](lazyquota_index::resolver::Resolver).
//!
//! Aggregated discovery (two requests: `/api` and `/apis`) where the server supports it,
//! the per-group walk otherwise. There is no discovery watch in Kubernetes; the controller
//! re-runs this when CustomResourceDefinitions or APIServices change, and on a slow poll.

use futures::{StreamExt as _, TryStreamExt as _};
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
    // Both at once; a server without aggregated discovery answers each with its legacy list,
    // which the per-group walk then starts from (kcp answers every logical cluster's /api and
    // /apis so: no round trip is spent asking again).
    let (apis, core) =
        futures::future::join(aggregated(client, &at("/apis")), aggregated(client, &at("/api"))).await;
    let groups = match (apis, core) {
        (Ok(Answer::Aggregated(apis)), core) => match core? {
            Answer::Aggregated(core) => core.items.into_iter().chain(apis.items).collect::<Vec<_>>(),
            Answer::Legacy(_) => return discover_per_group(client, route, None).await,
        },
        (Ok(Answer::Legacy(apis)), Ok(Answer::Legacy(core))) => {
            let legacy = serde_json::from_value(core)
                .and_then(|core| Ok((core, serde_json::from_value(apis)?)))
                .ok();
            return discover_per_group(client, route, legacy).await;
        }
        // Servers older than 1.26 lack aggregated discovery (an error or a legacy answer).
        _ => return discover_per_group(client, route, None).await,
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

/// An answer to a discovery request sent with [`ACCEPT_AGGREGATED`].
enum Answer {
    /// The aggregated document.
    Aggregated(APIGroupDiscoveryList),
    /// The legacy `APIVersions` (`/api`) or `APIGroupList` (`/apis`), unparsed.
    Legacy(serde_json::Value),
}

/// The discovery document at `path` (`/api` or `/apis`): aggregated, or the legacy list when
/// the server answered with that instead. A legacy answer must not be read as an aggregated
/// list: its `groups` are not `items`, so it would parse as "serves nothing".
async fn aggregated(client: &Client, path: &str) -> Result<Answer, kube::Error> {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, ACCEPT_AGGREGATED)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let body: serde_json::Value = client.request(request).await?;
    if body.get("kind").and_then(serde_json::Value::as_str) != Some("APIGroupDiscoveryList") {
        return Ok(Answer::Legacy(body));
    }
    serde_json::from_value(body)
        .map(Answer::Aggregated)
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
/// discovery (`legacy`: their `/api` and `/apis` answers, when already read): every version of
/// every group, the preferred one first (ours rather than
/// kube's `Discovery`, which cannot put a logical cluster's route in front of its paths).
async fn discover_per_group(
    client: &Client,
    route: &Route,
    legacy: Option<(APIVersions, APIGroupList)>,
) -> Result<Discovered, kube::Error> {
    let at = |path: &str| format!("{}{path}", route.prefix());
    let mut served = Vec::new();
    let (core, groups): (APIVersions, APIGroupList) = match legacy {
        Some(lists) => lists,
        None => futures::future::try_join(get(client, at("/api")), get(client, at("/apis"))).await?,
    };
    let mut group_versions: Vec<(String, Vec<String>)> = vec![(
        String::new(),
        core.versions.iter().map(|v| format!("/api/{v}")).collect(),
    )];
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
    // Every group version at once (over HTTP/2, streams of one connection): the walk costs
    // about one round trip more than /api and /apis, not one per group version — it is on the
    // path from a new kcp workspace's first quota to its first status.
    let requests: Vec<_> = group_versions
        .iter()
        .map(|(_, paths)| {
            let gets: Vec<_> = paths
                .iter()
                .map(|path| {
                    let (client, url) = (client.clone(), at(path));
                    async move { get::<APIResourceList>(&client, url).await }
                })
                .collect();
            futures::future::try_join_all(gets)
        })
        .collect();
    let lists: Vec<Vec<APIResourceList>> = futures::stream::iter(requests)
        .buffered(MAX_LISTS_AT_ONCE)
        .try_collect()
        .await?;
    for ((group, _), lists) in group_versions.into_iter().zip(lists) {
        let mut seen = std::collections::BTreeSet::new();
        for list in lists {
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

/// Groups whose versions the per-group walk asks for at once.
const MAX_LISTS_AT_ONCE: usize = 16;

/// GETs `path` and reads it as `T`.
async fn get<T: DeserializeOwned>(client: &Client, path: String) -> Result<T, kube::Error> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    client.request(request).await
}
