//! Discovery: what a cluster serves, in the terms of the pure
//! [`Resolver`](lazyquota_index::resolver::Resolver).
//!
//! Aggregated discovery (two requests: `/api` and `/apis`) where the server supports it, the
//! per-group walk for whichever of the two it answered with a legacy list, and on kcp the
//! legacy `/api/v1` as well (a workspace's aggregated `/api` leaves out core types bound
//! through an APIBinding). There is no
//! discovery watch in Kubernetes; the controller re-runs this when CustomResourceDefinitions
//! or APIServices change, and on a slow poll.

use std::collections::BTreeSet;

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
    let at = |path: &str| format!("{}{path}", route.prefix());
    // Both at once. Each answer is used as it comes: kcp answers a logical cluster's /api
    // aggregated and its /apis with the legacy group list, so only the groups of the legacy
    // answer are walked and neither document is asked for twice.
    let (apis, core) =
        futures::future::join(aggregated(client, &at("/apis")), aggregated(client, &at("/api"))).await;
    let core = or_legacy(client, at("/api"), core).await?;
    let apis = or_legacy(client, at("/apis"), apis).await?;
    let mut plan = Plan::new(core, apis).map_err(kube::Error::SerdeError)?;
    let skipped = groups.map(|g| plan.narrow(g)).unwrap_or_default();
    super::trace::walking(
        route.prefix(),
        plan.walk.iter().map(|(_, paths)| paths.len()).sum(),
    );
    let lists = walk_groups(client, route, &plan.walk).await?;
    let mut found = plan.read(lists);
    found.skipped_groups = skipped;
    Ok(found)
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
) -> Result<Vec<Vec<APIResourceList>>, kube::Error> {
    let at = |path: &str| format!("{}{path}", route.prefix());
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
mod tests {
    use super::*;

    /// kcp v0.32.3's answers for a workspace (`/clusters/root:ws1`), trimmed to two resources
    /// and two groups: `/api` aggregated, `/apis` the legacy group list.
    const KCP_API: &str = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[{"metadata":{},"versions":[{"version":"v1","resources":[{"resource":"configmaps","responseKind":{"group":"","version":"","kind":"ConfigMap"},"scope":"Namespaced","singularResource":"configmap","verbs":["create","delete","deletecollection","get","list","patch","update","watch"],"shortNames":["cm"]},{"resource":"namespaces","responseKind":{"group":"","version":"","kind":"Namespace"},"scope":"Cluster","singularResource":"namespace","verbs":["create","delete","get","list","patch","update","watch"],"shortNames":["ns"],"subresources":[{"subresource":"finalize","responseKind":{"group":"","version":"","kind":"Namespace"},"verbs":["update"]}]}],"freshness":"Current"}]}]}"#;
    const KCP_APIS: &str = r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"coordination.k8s.io","versions":[{"groupVersion":"coordination.k8s.io/v1","version":"v1"}],"preferredVersion":{"groupVersion":"coordination.k8s.io/v1","version":"v1"}},{"name":"apis.kcp.io","versions":[{"groupVersion":"apis.kcp.io/v1alpha2","version":"v1alpha2"},{"groupVersion":"apis.kcp.io/v1alpha1","version":"v1alpha1"}],"preferredVersion":{"groupVersion":"apis.kcp.io/v1alpha2","version":"v1alpha2"}}]}"#;
    const LEGACY_API: &str = r#"{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[]}"#;
    const AGGREGATED_APIS: &str = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[{"metadata":{"name":"apps"},"versions":[{"version":"v1","resources":[{"resource":"deployments","responseKind":{"group":"","version":"","kind":"Deployment"},"scope":"Namespaced","verbs":["list","watch"]}],"freshness":"Current"}]},{"metadata":{"name":"metrics.k8s.io"},"versions":[{"version":"v1beta1","freshness":"Stale"}]}]}"#;

    fn answer(body: &str) -> Answer {
        Answer::read(serde_json::from_str(body).unwrap()).unwrap()
    }

    fn walked(plan: &Plan) -> Vec<&str> {
        plan.walk
            .iter()
            .flat_map(|(_, paths)| paths.iter().map(String::as_str))
            .collect()
    }

    /// kcp v0.32.3's legacy `/api/v1` of a workspace with Services bound through an
    /// APIBinding (recorded, trimmed to two resources): it lists `services`, which the same
    /// workspace's aggregated `/api` leaves out (that listed configmaps, events, namespaces,
    /// resourcequotas, secrets and serviceaccounts).
    const KCP_API_V1: &str = r#"{"kind":"APIResourceList","groupVersion":"v1","resources":[{"name":"configmaps","singularName":"configmap","namespaced":true,"kind":"ConfigMap","verbs":["create","delete","deletecollection","get","list","patch","update","watch"],"shortNames":["cm"],"storageVersionHash":"BcsYVNKF43M="},{"name":"services","singularName":"service","namespaced":true,"kind":"Service","verbs":["delete","deletecollection","get","list","patch","create","update","watch"],"storageVersionHash":"LuZK7Vz7ufs="}]}"#;

    fn list(body: &str) -> APIResourceList {
        serde_json::from_str(body).unwrap()
    }

    #[test]
    fn kcp_answers_leave_the_legacy_groups_and_the_legacy_core_version_to_walk() {
        let plan = Plan::new(answer(KCP_API), answer(KCP_APIS)).unwrap();
        // What `discover` asks for after /api and /apis: the core group's legacy list (kcp's
        // aggregated one can be short), then one request per version of a group /apis listed.
        assert_eq!(
            walked(&plan),
            [
                "/api/v1",
                "/apis/coordination.k8s.io/v1",
                "/apis/apis.kcp.io/v1alpha2",
                "/apis/apis.kcp.io/v1alpha1",
            ]
        );
        let empty = |gv: &str| APIResourceList {
            group_version: gv.to_owned(),
            resources: Vec::new(),
        };
        let lists = vec![
            vec![list(KCP_API_V1)],
            vec![empty("coordination.k8s.io/v1")],
            vec![empty("apis.kcp.io/v1alpha2"), empty("apis.kcp.io/v1alpha1")],
        ];
        let found = plan.read(lists);
        let served: Vec<_> = found
            .served
            .iter()
            .map(|s| (s.resource.to_string(), s.version.as_str(), s.namespaced))
            .collect();
        assert_eq!(
            served,
            [
                ("configmaps".to_owned(), "v1", true),
                ("namespaces".to_owned(), "v1", false),
                ("services".to_owned(), "v1", true),
            ],
            "each core resource once, Services from the legacy list"
        );
    }

    #[test]
    fn a_narrowed_kcp_discovery_walks_the_core_group_and_the_groups_asked_for_only() {
        let mut plan = Plan::new(answer(KCP_API), answer(KCP_APIS)).unwrap();
        let skipped = plan.narrow(&BTreeSet::from(["coordination.k8s.io".to_owned()]));
        assert_eq!(walked(&plan), ["/api/v1", "/apis/coordination.k8s.io/v1"]);
        assert_eq!(skipped, ["apis.kcp.io"], "named, so what was known of it is kept");
        let mut none = Plan::new(answer(KCP_API), answer(KCP_APIS)).unwrap();
        assert_eq!(
            none.narrow(&BTreeSet::new()),
            ["coordination.k8s.io", "apis.kcp.io"]
        );
        assert_eq!(
            walked(&none),
            ["/api/v1"],
            "core types bound through an APIBinding still read"
        );
    }

    #[test]
    fn plain_kubernetes_answers_walk_no_core_version_twice() {
        let plan = Plan::new(answer(KCP_API), answer(AGGREGATED_APIS)).unwrap();
        assert!(
            plan.walk.is_empty(),
            "no kcp group: the aggregated /api is complete"
        );
    }

    #[test]
    fn an_aggregated_apis_with_a_legacy_api_walks_only_the_core_versions() {
        let plan = Plan::new(answer(LEGACY_API), answer(AGGREGATED_APIS)).unwrap();
        assert_eq!(walked(&plan), ["/api/v1"]);
        assert_eq!(plan.walk[0].0, "", "the core group's name is empty");
        let found = plan.read(vec![Vec::new()]);
        assert_eq!(found.served.len(), 1);
        assert_eq!(found.served[0].resource.to_string(), "deployments.apps");
        assert_eq!(
            found.failed_groups,
            ["metrics.k8s.io"],
            "a stale group is kept, not dropped"
        );
    }

    #[test]
    fn two_aggregated_answers_leave_nothing_to_walk_and_two_legacy_walk_everything() {
        let both = Plan::new(answer(KCP_API), answer(AGGREGATED_APIS)).unwrap();
        assert!(both.walk.is_empty());
        assert_eq!(both.aggregated.len(), 3, "core first, then the groups of /apis");
        let legacy = Plan::new(answer(LEGACY_API), answer(KCP_APIS)).unwrap();
        assert_eq!(walked(&legacy)[0], "/api/v1");
        assert_eq!(walked(&legacy).len(), 4);
        assert!(legacy.aggregated.is_empty());
    }

    #[test]
    fn a_legacy_answer_is_never_read_as_an_empty_aggregated_list() {
        assert!(matches!(answer(KCP_APIS), Answer::Legacy(_)));
        assert!(matches!(answer(KCP_API), Answer::Aggregated(_)));
        // A legacy /apis that does not parse is an error, not "serves nothing".
        let broken = Answer::read(serde_json::json!({"kind": "APIGroupList", "groups": 3})).unwrap();
        assert!(Plan::new(answer(LEGACY_API), broken).is_err());
    }
}
