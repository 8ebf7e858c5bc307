//! Discovery's plan from recorded kcp and Kubernetes answers, and the walk guesses against a
//! fake kcp.

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

/// kcp's `/apis/coordination.k8s.io/v1` of a workspace, trimmed to one resource.
const LEASES_V1: &str = r#"{"kind":"APIResourceList","groupVersion":"coordination.k8s.io/v1","resources":[{"name":"leases","singularName":"lease","namespaced":true,"kind":"Lease","verbs":["get","list","watch"]}]}"#;

/// The paths a fake server was asked for, each with the (paused) time it was asked at.
type Asked = Mutex<Vec<(String, tokio::time::Instant)>>;

/// A version of the group that /apis does not list, served anyway.
const LEASES_V2: &str = r#"{"kind":"APIResourceList","groupVersion":"coordination.k8s.io/v2","resources":[{"name":"leasecandidates","singularName":"leasecandidate","namespaced":true,"kind":"LeaseCandidate","verbs":["get","list","watch"]}]}"#;

/// The workspace prefix the guessing tests route under.
const WORKSPACE: &str = "/clusters/ws";

fn workspace() -> Route {
    Route::cluster(&lazyquota_index::keys::ClusterName::new("ws"))
}

/// How long the fake kcp takes to answer `/apis`.
const APIS_DELAY: std::time::Duration = std::time::Duration::from_millis(50);

/// A client whose server answers discovery as kcp's workspace above, under [`WORKSPACE`] or
/// without it (`/apis` after [`APIS_DELAY`], a path it does not serve with 404, the first
/// request for `stall_first` never), and the log of the paths it was asked for (without the
/// workspace), each with the (paused) time it was asked at.
fn fake_kcp(stall_first: Option<&'static str>) -> (Client, Arc<Asked>) {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = asked.clone();
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let full = request.uri().path();
        let path = full.strip_prefix(WORKSPACE).unwrap_or(full).to_owned();
        let first = {
            let mut log = log.lock().unwrap();
            let first = log.iter().all(|(p, _)| *p != path);
            log.push((path.clone(), tokio::time::Instant::now()));
            first
        };
        async move {
            if first && Some(path.as_str()) == stall_first {
                std::future::pending::<()>().await;
            }
            let body = match path.as_str() {
                "/api" => KCP_API,
                "/apis" => {
                    tokio::time::sleep(APIS_DELAY).await;
                    KCP_APIS
                }
                "/api/v1" => KCP_API_V1,
                "/apis/coordination.k8s.io/v1" => LEASES_V1,
                // Served, but not a version /apis lists: nothing may be read from it.
                "/apis/coordination.k8s.io/v2" => LEASES_V2,
                _ => {
                    let status = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#;
                    return Ok::<_, std::convert::Infallible>(
                        http::Response::builder()
                            .status(404)
                            .body(kube::client::Body::from(status.as_bytes().to_vec()))
                            .unwrap(),
                    );
                }
            };
            Ok(http::Response::new(kube::client::Body::from(
                body.as_bytes().to_vec(),
            )))
        }
    });
    (Client::new(service, "default"), asked)
}

/// Guesses that know one path of the coordination group, as if an earlier walk had asked it.
fn guessing(path: &str) -> WalkGuesses {
    let guesses = WalkGuesses::default();
    guesses.learn(&[("coordination.k8s.io".to_owned(), vec![path.to_owned()])]);
    guesses
}

fn coordination() -> BTreeSet<String> {
    BTreeSet::from(["coordination.k8s.io".to_owned()])
}

fn served(found: &Discovered) -> Vec<String> {
    found
        .served
        .iter()
        .map(|s| format!("{:?}@{}", s.resource, s.version))
        .collect()
}

/// When each path was first asked for, since `start`; every path asked for once.
fn asked_once(asked: &Asked, start: tokio::time::Instant) -> BTreeMap<String, std::time::Duration> {
    let asked = std::mem::take(&mut *asked.lock().unwrap());
    let mut when = BTreeMap::new();
    for (path, at) in asked {
        assert!(
            when.insert(path.clone(), at - start).is_none(),
            "{path} asked twice"
        );
    }
    when
}

#[tokio::test(start_paused = true)]
async fn a_narrowed_discovery_asks_for_the_versions_walked_before_with_api_and_apis() {
    let (client, asked) = fake_kcp(None);
    let guesses = WalkGuesses::default();
    let groups = coordination();

    // Each discovery asks for the same four paths, once each.
    let discover_once = async || {
        let start = tokio::time::Instant::now();
        let found = discover_guessing(&client, &workspace(), Some(&groups), &guesses)
            .await
            .unwrap();
        let when = asked_once(&asked, start);
        assert_eq!(
            when.keys().map(String::as_str).collect::<Vec<_>>(),
            ["/api", "/api/v1", "/apis", "/apis/coordination.k8s.io/v1"]
        );
        (found, when)
    };

    let (first, when) = discover_once().await;
    // Nothing guessed yet: the walk waits for /apis.
    assert!(when["/apis/coordination.k8s.io/v1"] >= APIS_DELAY);
    assert!(when["/api/v1"] >= APIS_DELAY);

    let (second, when) = discover_once().await;
    // Guessed: asked together with /api and /apis, and not again after.
    assert_eq!(when["/apis/coordination.k8s.io/v1"], std::time::Duration::ZERO);
    assert_eq!(when["/api/v1"], std::time::Duration::ZERO);
    assert_eq!(served(&second), served(&first));
    assert!(
        served(&first)
            .iter()
            .any(|s| s.contains("leases") && s.ends_with("@v1"))
    );
    assert!(served(&first).iter().any(|s| s.contains("services")));
}

#[tokio::test(start_paused = true)]
async fn a_wrong_guess_costs_one_request_and_changes_nothing_found() {
    let (client, asked) = fake_kcp(None);
    let groups = coordination();
    let unguessed = discover(&client, &workspace(), Some(&groups)).await.unwrap();
    asked.lock().unwrap().clear();

    // v2 is served but not listed by /apis: its early answer must not be read.
    let guesses = guessing("/apis/coordination.k8s.io/v2");
    let start = tokio::time::Instant::now();
    let found = discover_guessing(&client, &workspace(), Some(&groups), &guesses)
        .await
        .unwrap();
    let when = asked_once(&asked, start);
    assert_eq!(when["/apis/coordination.k8s.io/v2"], std::time::Duration::ZERO);
    assert!(when["/apis/coordination.k8s.io/v1"] >= APIS_DELAY);
    assert_eq!(served(&found), served(&unguessed));
    assert!(!served(&found).iter().any(|s| s.contains("leasecandidates")));
    // What the walk found replaces the wrong guess.
    assert_eq!(
        guesses.paths(&groups),
        ["/api/v1", "/apis/coordination.k8s.io/v1"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_stalled_guess_delays_a_discovery_by_its_patience_and_the_walk_asks_again() {
    let (client, asked) = fake_kcp(Some("/apis/coordination.k8s.io/v1"));
    let groups = coordination();
    let guesses = guessing("/apis/coordination.k8s.io/v1");
    let start = tokio::time::Instant::now();
    let found = discover_guessing(&client, &workspace(), Some(&groups), &guesses)
        .await
        .unwrap();
    assert_eq!(tokio::time::Instant::now() - start, EARLY_PATIENCE);
    let leases: Vec<_> = asked
        .lock()
        .unwrap()
        .iter()
        .filter(|(path, _)| path == "/apis/coordination.k8s.io/v1")
        .map(|(_, at)| *at - start)
        .collect();
    assert_eq!(leases, [std::time::Duration::ZERO, EARLY_PATIENCE]);
    assert!(
        served(&found)
            .iter()
            .any(|s| s.contains("leases") && s.ends_with("@v1"))
    );
}

#[test]
fn guesses_stop_learning_new_groups_at_their_bound_but_keep_updating_known_ones() {
    let guesses = WalkGuesses::default();
    let walk: Vec<(String, Vec<String>)> = (0..MAX_GUESSED_GROUPS + 10)
        .map(|i| (format!("g{i}"), vec![format!("/apis/g{i}/v1")]))
        .collect();
    guesses.learn(&walk);
    assert_eq!(guesses.0.lock().unwrap().len(), MAX_GUESSED_GROUPS);
    guesses.learn(&[("g0".to_owned(), vec!["/apis/g0/v2".to_owned()])]);
    assert_eq!(guesses.paths(&BTreeSet::from(["g0".to_owned()])), ["/apis/g0/v2"]);
    let last = format!("g{}", MAX_GUESSED_GROUPS + 9);
    assert!(guesses.paths(&BTreeSet::from([last])).is_empty());
}
