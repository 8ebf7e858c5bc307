//! Tests of the PolicyIndex: quotas in, reference-counted demand out.

use proptest::prelude::*;

use super::*;

fn policy(keys: &[&str], scopes: &[&str]) -> QuotaPolicy {
    QuotaPolicy {
        spec_hard: keys.iter().map(|k| (*k).to_owned()).collect(),
        status_hard: keys.iter().map(|k| (*k).to_owned()).collect(),
        scopes: QuotaScopes::from_requirements(
            scopes
                .iter()
                .map(|s| lazyquota_quota::scope::ScopeRequirement::from_scope(s))
                .collect(),
        ),
        cluster_scoped: false,
    }
}

#[test]
fn kcps_cluster_scoped_quotas_are_recognised_as_kcp_parses_the_annotation() {
    assert!(kcp_cluster_scoped("admin", Some("true")));
    assert!(kcp_cluster_scoped("admin", Some("1")));
    assert!(kcp_cluster_scoped("admin", Some("True")));
    assert!(!kcp_cluster_scoped("admin", Some("yes")), "ParseBool rejects yes");
    assert!(!kcp_cluster_scoped("admin", Some("false")));
    assert!(!kcp_cluster_scoped("admin", None));
    assert!(
        !kcp_cluster_scoped("team", Some("true")),
        "only in the admin namespace"
    );
}

/// A cluster-scoped quota demands its resources in every namespace; objects anywhere
/// dirty it; toggling the annotation moves its demand between its namespace and all.
#[test]
fn a_cluster_scoped_quota_demands_every_namespace() {
    let mut index = PolicyIndex::new(FeatureGates::default());
    let cm = GroupResource::core("configmaps");
    let mut p = policy(&["count/configmaps"], &[]);
    p.cluster_scoped = true;
    let changes = index.apply(key("admin", "q"), &p, ());
    assert_eq!(changes.len(), 1);
    assert_eq!(&*changes[0].namespace, ALL_NAMESPACES);
    let c = ClusterName::new("c");
    assert_eq!(
        index
            .demand_of(&c, &cm)
            .keys()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [ALL_NAMESPACES]
    );
    assert_eq!(
        index.dirtied_by(&c, "team-x", &cm),
        [key("admin", "q")],
        "any namespace"
    );
    assert_eq!(index.computing(&c, &cm), [key("admin", "q")]);
    // The annotation goes: back to its own namespace only.
    let changes = index.apply(key("admin", "q"), &policy(&["count/configmaps"], &[]), ());
    let moved: BTreeSet<(String, Option<Need>)> =
        changes.iter().map(|c| (c.namespace.to_string(), c.to)).collect();
    assert_eq!(
        moved,
        [("*".to_owned(), None), ("admin".to_owned(), Some(Need::Count))].into()
    );
    assert!(index.dirtied_by(&c, "team-x", &cm).is_empty());
    assert_eq!(index.delete(&key("admin", "q")).len(), 1);
    assert!(index.demand_of(&c, &cm).is_empty());
}

fn key(ns: &str, name: &str) -> QuotaKey {
    QuotaKey::new(&ClusterName::new("c"), ns, name)
}

fn pods() -> GroupResource {
    GroupResource::core("pods")
}

#[test]
fn demand_is_reference_counted_across_quotas() {
    let mut index = PolicyIndex::new(FeatureGates::default());
    let start = index.apply(key("a", "q1"), &policy(&["pods"], &[]), ());
    assert_eq!(start.len(), 1);
    assert_eq!((start[0].from, start[0].to), (None, Some(Need::Typed)));
    assert!(
        index
            .apply(key("a", "q2"), &policy(&["requests.cpu"], &[]), ())
            .is_empty()
    );
    assert!(index.delete(&key("a", "q1")).is_empty(), "q2 still needs pods");
    let stop = index.delete(&key("a", "q2"));
    assert_eq!((stop[0].from, stop[0].to), (Some(Need::Typed), None));
    assert!(index.demanded().next().is_none());
}

/// A cluster's demanded resources are its own, whatever the names around it sort to (a
/// cluster whose name another one's begins with, the core group sorting first).
#[test]
fn demanded_in_names_one_clusters_resources_only() {
    let mut index = PolicyIndex::new(FeatureGates::default());
    for (cluster, keys) in [
        ("a", &["count/configmaps", "count/widgets.example.io"][..]),
        ("ab", &["pods"][..]),
        ("", &["count/secrets"][..]),
        ("b", &["count/configmaps"][..]),
    ] {
        let c = ClusterName::new(cluster);
        index.apply(QuotaKey::new(&c, "ns", "q"), &policy(keys, &[]), ());
    }
    let of = |cluster: &str| {
        index
            .demanded_in(&ClusterName::new(cluster))
            .map(GroupResource::object_count_name)
            .collect::<Vec<_>>()
    };
    assert_eq!(of("a"), ["count/configmaps", "count/widgets.example.io"]);
    assert_eq!(of("ab"), ["count/pods"]);
    assert_eq!(of(""), ["count/secrets"]);
    assert_eq!(of("b"), ["count/configmaps"]);
    assert!(of("c").is_empty());
    assert!(of("aa").is_empty(), "between a and ab");
}

#[test]
fn count_and_typed_needs_upgrade_and_downgrade() {
    let mut index = PolicyIndex::new(FeatureGates::default());
    index.apply(key("a", "q1"), &policy(&["count/pods"], &[]), ());
    let up = index.apply(key("a", "q2"), &policy(&["pods"], &[]), ());
    assert_eq!((up[0].from, up[0].to), (Some(Need::Count), Some(Need::Typed)));
    let down = index.delete(&key("a", "q2"));
    assert_eq!((down[0].from, down[0].to), (Some(Need::Typed), Some(Need::Count)));
}

#[test]
fn only_demanding_namespaces_are_demanded() {
    let mut index = PolicyIndex::new(FeatureGates::default());
    index.apply(key("ns-7", "q"), &policy(&["pods"], &[]), ());
    let demand = index.demand_of(&ClusterName::new("c"), &pods());
    assert_eq!(demand.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["ns-7"]);
}

#[test]
fn editing_count_x_to_count_y_moves_the_demand() {
    let mut index = PolicyIndex::new(FeatureGates::default());
    index.apply(key("a", "q"), &policy(&["count/x.example.io"], &[]), ());
    let mut changes = index.apply(key("a", "q"), &policy(&["count/y.example.io"], &[]), ());
    changes.sort();
    assert_eq!(changes.len(), 2);
    assert!(
        changes
            .iter()
            .any(|c| c.resource.resource == "x" && c.to.is_none())
    );
    assert!(
        changes
            .iter()
            .any(|c| c.resource.resource == "y" && c.to == Some(Need::Count))
    );
}

#[test]
fn replenishment_routes_by_status_hard_and_spec_hard() {
    let mut index = PolicyIndex::new(FeatureGates::default());
    // Before its first status write: spec.hard alone routes it (an object created while
    // that write is in flight must still reach it).
    let mut p = policy(&["pods"], &[]);
    p.status_hard = vec![];
    index.apply(key("a", "q"), &p, ());
    assert_eq!(
        index.dirtied_by(&ClusterName::new("c"), "a", &pods()),
        vec![key("a", "q")]
    );
    // status.hard alone routes it too (a key left spec.hard but is still in the status).
    let mut p = policy(&[], &[]);
    p.status_hard = vec!["pods".into()];
    index.apply(key("a", "q"), &p, ());
    assert_eq!(
        index.dirtied_by(&ClusterName::new("c"), "a", &pods()),
        vec![key("a", "q")]
    );
    p.status_hard = vec!["pods".into()];
    index.apply(key("a", "q"), &p, ());
    assert_eq!(
        index.dirtied_by(&ClusterName::new("c"), "a", &pods()),
        vec![key("a", "q")]
    );
    assert!(index.dirtied_by(&ClusterName::new("c"), "b", &pods()).is_empty());
}

#[derive(Clone, Debug)]
enum Op {
    Apply(usize, usize, Vec<usize>, bool),
    Delete(usize, usize),
    Reset(Vec<(usize, usize, Vec<usize>, bool)>),
}

const KEYS: &[&str] = &[
    "pods",
    "count/pods",
    "requests.storage",
    "count/widgets.example.io",
    "configmaps",
    "foo",
];

fn op() -> impl Strategy<Value = Op> {
    let quota = (
        0..3usize,
        0..3usize,
        prop::collection::vec(0..KEYS.len(), 0..4),
        any::<bool>(),
    );
    prop_oneof![
        4 => quota.clone().prop_map(|(n, q, k, s)| Op::Apply(n, q, k, s)),
        2 => (0..3usize, 0..3usize).prop_map(|(n, q)| Op::Delete(n, q)),
        1 => prop::collection::vec(quota, 0..5).prop_map(Op::Reset),
    ]
}

fn quota_of(n: usize, q: usize, k: &[usize], scoped: bool) -> (QuotaKey, QuotaPolicy, ()) {
    let keys: Vec<&str> = k.iter().map(|i| KEYS[*i]).collect();
    (
        key(&format!("ns{n}"), &format!("q{q}")),
        policy(&keys, if scoped { &["BestEffort"] } else { &[] }),
        (),
    )
}

proptest! {
    /// After any sequence of apply/delete/reset, the demand equals the demand computed
    /// from scratch from the final quotas, and replaying the emitted changes onto an empty
    /// demand reproduces it (nothing lost, nothing started twice).
    #[test]
    fn demand_equals_recomputation_from_scratch(ops in prop::collection::vec(op(), 0..40)) {
        let cluster = ClusterName::new("c");
        let mut index = PolicyIndex::new(FeatureGates::default());
        let mut replayed: BTreeMap<(GroupResource, Arc<str>), Need> = BTreeMap::new();
        let mut truth: BTreeMap<QuotaKey, QuotaPolicy> = BTreeMap::new();
        for op in ops {
            let changes = match op {
                Op::Apply(n, q, k, s) => {
                    let (key, policy, ()) = quota_of(n, q, &k, s);
                    truth.insert(key.clone(), policy.clone());
                    index.apply(key, &policy, ())
                }
                Op::Delete(n, q) => {
                    let key = key(&format!("ns{n}"), &format!("q{q}"));
                    truth.remove(&key);
                    index.delete(&key)
                }
                Op::Reset(quotas) => {
                    let quotas: Vec<_> = quotas.iter().map(|(n, q, k, s)| quota_of(*n, *q, k, *s)).collect();
                    truth = quotas.iter().map(|(k, p, ())| (k.clone(), p.clone())).collect();
                    index.reset(&cluster, quotas)
                }
            };
            for c in changes {
                let slot = (c.resource.clone(), c.namespace.clone());
                prop_assert_eq!(replayed.get(&slot).copied(), c.from, "change {:?} does not start from the replayed state", c);
                match c.to {
                    Some(need) => { replayed.insert(slot, need); }
                    None => { replayed.remove(&slot); }
                }
            }
        }
        let mut fresh = PolicyIndex::new(FeatureGates::default());
        for (key, policy) in &truth {
            fresh.apply(key.clone(), policy, ());
        }
        let expected = fresh.cluster_demand(&cluster);
        prop_assert_eq!(&index.cluster_demand(&cluster), &expected);
        prop_assert_eq!(&replayed, &expected);
        // Routing by namespace answers as a scan of every quota would.
        for resource in [GroupResource::core("pods"), GroupResource::core("configmaps"), GroupResource::new("example.io", "widgets")] {
            let mut computing = index.computing(&cluster, &resource);
            computing.sort();
            let mut scanned: Vec<QuotaKey> = index.quotas().filter(|(_, e)| e.demands.contains_key(&resource)).map(|(k, _)| k.clone()).collect();
            scanned.sort();
            prop_assert_eq!(computing, scanned);
            for n in 0..3 {
                let ns = format!("ns{n}");
                let mut dirtied = index.dirtied_by(&cluster, &ns, &resource);
                dirtied.sort();
                let mut scanned: Vec<QuotaKey> = index
                    .quotas()
                    .filter(|(k, e)| {
                        *k.namespace == *ns
                            && (e.status_resources.contains(&resource) || e.demands.contains_key(&resource))
                    })
                    .map(|(k, _)| k.clone())
                    .collect();
                scanned.sort();
                prop_assert_eq!(dirtied, scanned);
            }
        }
    }
}
