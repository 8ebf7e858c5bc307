//! Discovery: what a cluster serves, in the terms of the pure
//! [`Resolver`](lazyquota_index::resolver::Resolver).
//!
//! Aggregated discovery (two requests: `/api` and `/apis`) where the server supports it, the
//! per-group walk for whichever of the two it answered with a legacy list, and on kcp the
//! legacy `/api/v1` as well (a workspace's aggregated `/api` leaves out core types bound
//! through an APIBinding). There is no
//! discovery watch in Kubernetes; the controller re-runs this when CustomResourceDefinitions
//! or APIServices change, and on a slow poll.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIGroupList, APIResourceList, APIVersions};
use kube::Client;
use kube::client::{APIGroupDiscovery, APIGroupDiscoveryList};
use lazyquota_index::{keys::GroupResource, resolver::ServedResource};
use serde::de::DeserializeOwned;

use crate::transport::route::Route;

pub use lazyquota_index::reconciler::Discovered;

/// Runs discovery against `client`'s cluster.
///
/// The version of each resource is its group's preferred version, or, for a resource the
/// preferred version does not serve, the first version (in the server's priority order)
/// that does — what client-go's `ServerPreferredResources` returns and KCM uses.
///
/// Aggregated discovery marks a group version whose APIService does not answer as `Stale`
/// (listed without resources): such a group is reported in `failed_groups`, so that what was
/// known of it is kept rather than taken as gone.
///
/// With `groups`, only those groups (and the core group) are walked one by one; the other
/// groups a legacy list names are reported in `skipped_groups` (aggregated answers carry every
/// group's resources at no extra request, so nothing of them is skipped).
pub async fn discover(
    client: &Client,
    route: &Route,
    groups: Option<&BTreeSet<String>>,
) -> Result<Discovered, kube::Error> {
    discover_guessing(client, route, groups, &WalkGuesses::default()).await
}

/// [`discover`], with the group versions earlier discoveries walked for `groups` asked for
/// together with `/api` and `/apis` (see [`WalkGuesses`]), and this discovery's walk learnt.
pub async fn discover_guessing(
    client: &Client,
    route: &Route,
    groups: Option<&BTreeSet<String>>,
    guesses: &WalkGuesses,
) -> Result<Discovered, kube::Error> {
    let at = |path: &str| format!("{}{path}", route.prefix());
    let mut asked_early = groups.map(|g| guesses.paths(g)).unwrap_or_default();
    asked_early.truncate(MAX_EARLY);
    // A guess not answered within EARLY_PATIENCE is dropped (the walk asks for it, if /apis
    // lists it): a stalled guess delays a discovery by that much, not by a request's deadline.
    let early = futures::future::join_all(asked_early.iter().map(|path| {
        let (client, url) = (client.clone(), at(path));
        async move {
            tokio::time::timeout(EARLY_PATIENCE, get::<APIResourceList>(&client, url))
                .await
                .ok()?
                .ok()
        }
    }));
    // All at once. Each answer is used as it comes: kcp answers a logical cluster's /api
    // aggregated and its /apis with the legacy group list, so only the groups of the legacy
    // answer are walked and neither document is asked for twice.
    let ((apis, core), early) = futures::future::join(
        futures::future::join(aggregated(client, &at("/apis")), aggregated(client, &at("/api"))),
        early,
    )
    .await;
    let mut early: BTreeMap<String, APIResourceList> = asked_early
        .into_iter()
        .zip(early)
        .filter_map(|(path, answer)| Some((path, answer?)))
        .collect();
    let core = or_legacy(client, at("/api"), core).await?;
    let apis = or_legacy(client, at("/apis"), apis).await?;
    let mut plan = Plan::new(core, apis).map_err(kube::Error::SerdeError)?;
    let skipped = groups.map(|g| plan.narrow(g)).unwrap_or_default();
    super::trace::walking(
        route.prefix(),
        plan.walk
            .iter()
            .flat_map(|(_, paths)| paths)
            .filter(|path| !early.contains_key(*path))
            .count(),
    );
    let lists = walk_groups(client, route, &plan.walk, &mut early).await?;
    guesses.learn(&plan.walk);
    let mut found = plan.read(lists);
    found.skipped_groups = skipped;
    Ok(found)
}

/// The group versions earlier discoveries walked, by group (the core group as `""`), shared by
/// every discovery of one controller. kcp lists a workspace's groups without their resources,
/// so a discovery walks the groups it needs after `/apis` answers: two round trips before a
/// workspace's first quota can be listed. A narrowed discovery asks for the guessed versions
/// of its groups (at most [`MAX_EARLY`] paths) together with `/api` and `/apis` instead; the
/// walk then takes an early answer only for a path it planned from `/api` and `/apis`, and
/// asks for the others as before. A wrong guess costs one request and at most
/// [`EARLY_PATIENCE`] of waiting; what is found is what the same answers would give without
/// guesses. A walk that succeeded is learnt. Cost: per group, its name and its version paths
/// (about 200 bytes on kcp), at most [`MAX_GUESSED_GROUPS`] groups; no eviction (a group learnt
/// first stays, which only costs speed).
#[derive(Clone, Default)]
pub struct WalkGuesses(Arc<Mutex<BTreeMap<String, Vec<String>>>>);

/// Groups [`WalkGuesses`] remembers; past it, groups it does not know are not learnt.
const MAX_GUESSED_GROUPS: usize = 1024;

/// Guessed paths one discovery asks for early, at most (the walk's own bound on groups at once).
const MAX_EARLY: usize = MAX_LISTS_AT_ONCE;

/// How long a discovery waits for a guessed path's early answer before it walks without it.
const EARLY_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

impl WalkGuesses {
    /// The paths walked last time for the core group and `groups`.
    fn paths(&self, groups: &BTreeSet<String>) -> Vec<String> {
        let known = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        std::iter::once("")
            .chain(groups.iter().map(String::as_str))
            .filter_map(|group| known.get(group))
            .flatten()
            .cloned()
            .collect()
    }

    /// Remembers `walk`'s paths for each of its groups.
    fn learn(&self, walk: &[(String, Vec<String>)]) {
        let mut known = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (group, paths) in walk {
            if known.len() < MAX_GUESSED_GROUPS || known.contains_key(group) {
                known.insert(group.clone(), paths.clone());
            }
        }
    }
}

/// What the answers to `/api` and `/apis` leave to do: groups already described (aggregated
/// answers) and group versions still to ask for one by one (legacy answers).
#[derive(Debug)]
struct Plan {
    /// Groups with their resources, from aggregated answers.
    aggregated: Vec<APIGroupDiscovery>,
    /// Each group from a legacy answer with the paths of its versions, the preferred first.
    walk: Vec<(String, Vec<String>)>,
}

impl Plan {
    /// The plan for the answers to `/api` (`core`) and `/apis`, in that order: the core group
    /// comes first, as the server lists it.
    fn new(core: Answer, apis: Answer) -> Result<Self, serde_json::Error> {
        let mut plan = Self {
            aggregated: Vec::new(),
            walk: Vec::new(),
        };
        match core {
            Answer::Aggregated(list) => plan.aggregated.extend(list.items),
            Answer::Legacy(body) => {
                let core: APIVersions = serde_json::from_value(body)?;
                let paths = core.versions.iter().map(|v| format!("/api/{v}")).collect();
                plan.walk.push((String::new(), paths));
            }
        }
        let core_aggregated = !plan.aggregated.is_empty();
        let kcp = match apis {
            Answer::Aggregated(list) => {
                let kcp = list
                    .items
                    .iter()
                    .any(|g| g.metadata.as_ref().and_then(|m| m.name.as_deref()) == Some(KCP_GROUP));
                plan.aggregated.extend(list.items);
                kcp
            }
            Answer::Legacy(body) => {
                let groups: APIGroupList = serde_json::from_value(body)?;
                let kcp = groups.groups.iter().any(|g| g.name == KCP_GROUP);
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
                    plan.walk.push((group.name, paths));
                }
                kcp
            }
        };
        if kcp && core_aggregated {
            // kcp (v0.32.3) leaves core types bound through an APIBinding (Services, say)
            // out of a workspace's aggregated /api, while its legacy /api/v1 lists them:
            // read that too, in the same round of requests as the group walk.
            plan.walk.insert(0, (String::new(), vec!["/api/v1".to_owned()]));
        }
        Ok(plan)
    }

    /// Walks only the core group and `groups`; returns the other groups it no longer walks.
    fn narrow(&mut self, groups: &BTreeSet<String>) -> Vec<String> {
        let mut skipped = Vec::new();
        self.walk.retain(|(group, _)| {
            let keep = group.is_empty() || groups.contains(group);
            if !keep {
                skipped.push(group.clone());
            }
            keep
        });
        skipped
    }

    /// What the cluster serves: the aggregated groups, then the walked ones (`lists`: the
    /// answers to `walk`'s paths, group by group). A resource found twice (kcp's core group
    /// is read both ways) counts once, as first found.
    fn read(self, lists: Vec<Vec<APIResourceList>>) -> Discovered {
        let mut found = Discovered::default();
        read_aggregated(self.aggregated, &mut found);
        for ((group, _), lists) in self.walk.into_iter().zip(lists) {
            read_lists(&group, lists, &mut found.served);
        }
        let mut seen = std::collections::BTreeSet::new();
        found.served.retain(|s| seen.insert(s.resource.clone()));
        found
    }
}

/// The group every kcp workspace serves (APIBindings, APIExports): its presence in `/apis`
/// says the server is kcp.
const KCP_GROUP: &str = "apis.kcp.io";

/// The resources of aggregated groups, each at its first (preferred) version that serves it;
/// a group with a `Stale` version goes to `failed_groups`.
fn read_aggregated(groups: Vec<APIGroupDiscovery>, found: &mut Discovered) {
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
    Answer::read(body).map_err(kube::Error::SerdeError)
}

/// `answer`, or, if the aggregated request failed, the legacy list at `path` asked for once
/// more, plainly (servers older than 1.26 may refuse the aggregated media type).
async fn or_legacy(
    client: &Client,
    path: String,
    answer: Result<Answer, kube::Error>,
) -> Result<Answer, kube::Error> {
    match answer {
        Ok(answer) => Ok(answer),
        Err(error) => {
            tracing::debug!(%error, path, "aggregated discovery refused; asking for the legacy list");
            get(client, path).await.map(Answer::Legacy)
        }
    }
}

impl Answer {
    /// Which of the two documents `body` is.
    fn read(body: serde_json::Value) -> Result<Self, serde_json::Error> {
        if body.get("kind").and_then(serde_json::Value::as_str) != Some("APIGroupDiscoveryList") {
            return Ok(Self::Legacy(body));
        }
        serde_json::from_value(body).map(Self::Aggregated)
    }
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

/// The per-group walk (one request per group version) for the groups a legacy answer listed:
/// every version of every group, the preferred one first (ours rather than kube's
/// `Discovery`, which cannot put a logical cluster's route in front of its paths). Returns
/// the answers group by group, in `group_versions`' order.
async fn walk_groups(
    client: &Client,
    route: &Route,
    group_versions: &[(String, Vec<String>)],
    early: &mut BTreeMap<String, APIResourceList>,
) -> Result<Vec<Vec<APIResourceList>>, kube::Error> {
    let at = |path: &str| format!("{}{path}", route.prefix());
    // Every group version at once (over HTTP/2, streams of one connection): the walk costs
    // about one round trip more than /api and /apis, not one per group version — it is on the
    // path from a new kcp workspace's first quota to its first status. A path answered early
    // (a guess) is not asked again.
    let requests: Vec<_> = group_versions
        .iter()
        .map(|(_, paths)| {
            let gets: Vec<_> = paths
                .iter()
                .map(|path| {
                    let (client, url) = (client.clone(), at(path));
                    let answered = early.remove(path);
                    async move {
                        match answered {
                            Some(list) => Ok(list),
                            None => get::<APIResourceList>(&client, url).await,
                        }
                    }
                })
                .collect();
            futures::future::try_join_all(gets)
        })
        .collect();
    futures::stream::iter(requests)
        .buffered(MAX_LISTS_AT_ONCE)
        .try_collect()
        .await
}

/// The resources of one walked group (`lists`: its versions, the preferred first), each at
/// the first version that serves it.
fn read_lists(group: &str, lists: Vec<APIResourceList>, served: &mut Vec<ServedResource>) {
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
                served,
                group,
                &version,
                resource.name,
                resource.kind,
                resource.namespaced,
                resource.verbs,
            );
        }
    }
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

#[cfg(test)]
mod tests;
