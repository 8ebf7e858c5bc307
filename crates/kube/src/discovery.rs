//! Discovery: what a cluster serves, in the terms of the pure
//! [`Resolver`](lazyquota_index::resolver::Resolver).
//!
//! Aggregated discovery (two requests: `/api` and `/apis`) where the server supports it,
//! the per-group walk otherwise. There is no discovery watch in Kubernetes; the controller
//! re-runs this when CustomResourceDefinitions or APIServices change, and on a slow poll.

use kube::client::APIGroupDiscoveryList;
use kube::{Client, discovery::Discovery};
use lazyquota_index::{keys::GroupResource, resolver::ServedResource};

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
pub async fn discover(client: &Client) -> Result<Discovered, kube::Error> {
    let groups = match aggregated(client, "/apis").await {
        Ok(Some(apis)) => match aggregated(client, "/api").await? {
            Some(core) => core.items.into_iter().chain(apis.items).collect::<Vec<_>>(),
            None => return discover_per_group(client).await,
        },
        // Servers older than 1.26 lack aggregated discovery (an error or a legacy answer);
        // kcp answers every logical cluster's /api and /apis with the legacy lists.
        Ok(None) | Err(_) => return discover_per_group(client).await,
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
/// discovery.
async fn discover_per_group(client: &Client) -> Result<Discovered, kube::Error> {
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut served = Vec::new();
    for group in discovery.groups() {
        let preferred = group.preferred_version_or_latest().to_owned();
        let mut seen = std::collections::BTreeSet::new();
        let versions = std::iter::once(preferred.clone())
            .chain(group.versions().filter(|v| *v != preferred).map(str::to_owned));
        for version in versions {
            for (resource, caps) in group.versioned_resources(&version) {
                if !seen.insert(resource.plural.clone()) {
                    continue;
                }
                served_push(
                    &mut served,
                    &resource.group,
                    &resource.version,
                    resource.plural.clone(),
                    resource.kind.clone(),
                    caps.scope == kube::discovery::Scope::Namespaced,
                    caps.operations.clone(),
                );
            }
        }
    }
    Ok(Discovered {
        served,
        failed_groups: Vec::new(),
    })
}
