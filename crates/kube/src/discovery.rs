//! Discovery: what a cluster serves, in the terms of the pure
//! [`Resolver`](lazyquota_index::resolver::Resolver).
//!
//! Aggregated discovery (two requests: `/api` and `/apis`) where the server supports it,
//! the per-group walk otherwise. There is no discovery watch in Kubernetes; the controller
//! re-runs this when CustomResourceDefinitions or APIServices change, and on a slow poll.

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
pub async fn discover(client: &Client) -> Result<Discovered, kube::Error> {
    let discovery = match Discovery::new(client.clone()).run_aggregated().await {
        Ok(discovery) => discovery,
        // Servers older than 1.26 lack aggregated discovery.
        Err(_) => Discovery::new(client.clone()).run().await?,
    };
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
                served.push(ServedResource {
                    resource: GroupResource::new(resource.group.clone(), resource.plural.clone()),
                    version: resource.version.clone(),
                    kind: resource.kind.clone(),
                    namespaced: caps.scope == kube::discovery::Scope::Namespaced,
                    verbs: caps.operations.clone(),
                });
            }
        }
    }
    Ok(Discovered {
        served,
        failed_groups: Vec::new(),
    })
}
