//! The watch set's decisions one by one; `property.rs` drives them in any order.

mod property;

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{ResourceQuota, ResourceQuotaSpec},
    apimachinery::pkg::api::resource::Quantity,
};
use lazyquota_quota::{FeatureGates, Time};
use proptest::prelude::*;

use super::*;
use crate::engine::StoreKind;

fn quota(hard: &[&str]) -> ResourceQuota {
    ResourceQuota {
        spec: Some(ResourceQuotaSpec {
            hard: Some(
                hard.iter()
                    .map(|k| ((*k).to_owned(), Quantity("100".into())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    }
}

fn settings(mode: Mode, threshold: usize) -> PlanSettings {
    PlanSettings {
        mode,
        namespace_watch_threshold: threshold,
        gates: FeatureGates::default(),
    }
}

fn ids() -> ObjectIds {
    ObjectIds::new(std::hash::RandomState::new())
}

fn cluster() -> ClusterName {
    ClusterName::new("c")
}

fn engine() -> Engine {
    let mut engine = Engine::new(FeatureGates::default());
    engine.discovered(
        &cluster(),
        vec![
            ServedResource::core_for_tests("configmaps"),
            ServedResource::core_for_tests("secrets"),
        ],
        &[],
    );
    engine
}

fn configmaps() -> GroupResource {
    GroupResource::core("configmaps")
}

fn not_shared(_: &GroupResource) -> bool {
    false
}

fn event(namespace: &str, name: &str) -> ObjectEvent {
    ObjectEvent {
        namespace: namespace.into(),
        name: name.into(),
        object: Projected::Meta,
        revision: None,
    }
}

fn used(engine: &Engine, namespace: &str, quota: &str, key: &str) -> Option<String> {
    let computed = engine.compute(
        &QuotaKey::new(&cluster(), namespace, quota),
        Time::from_unix_nanos(0),
    )?;
    computed.decision.used.get(key).map(|q| q.0.clone())
}

fn started(actions: &[Action]) -> Vec<(u64, WatchKey)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Start { id, key, .. } => Some((*id, key.clone())),
            _ => None,
        })
        .collect()
}

/// The one watch `actions` start.
fn only_start(actions: &[Action]) -> (u64, WatchKey) {
    let mut started = started(actions);
    assert_eq!(started.len(), 1, "one watch started: {actions:?}");
    started.remove(0)
}

/// A quota, and (cluster, resource)'s watches brought to the plan.
fn add_quota(
    w: &mut Watches,
    engine: &mut Engine,
    namespace: &str,
    name: &str,
    hard: &[&str],
) -> Vec<Action> {
    let update = engine.apply_quota(QuotaKey::new(&cluster(), namespace, name), &quota(hard));
    let mut out = Vec::new();
    for change in update.changes {
        w.sync(engine, &change.cluster, &change.resource, &not_shared, &mut out);
    }
    out
}

#[test]
fn a_watch_lists_syncs_replenishes_and_stops_with_its_quota() {
    let mut e = engine();
    let mut w = Watches::new(settings(Mode::Lazy, 8), false, ids());
    let out = add_quota(&mut w, &mut e, "a", "q", &["count/configmaps"]);
    let (id, key) = only_start(&out);
    assert_eq!(key.namespace.as_deref(), Some("a"));
    let now = Time::from_unix_nanos(0);
    let mut out = Vec::new();
    w.on_item(&mut e, id, WatchItem::Init, now, &mut out);
    w.on_item(&mut e, id, WatchItem::InitApply(event("a", "x")), now, &mut out);
    w.on_item(&mut e, id, WatchItem::InitDone, now, &mut out);
    let q = QuotaKey::new(&cluster(), "a", "q");
    assert_eq!(
        out,
        vec![
            Action::Listing(key.clone()),
            Action::Synced(key.clone()),
            Action::Enqueue(q.clone())
        ]
    );
    assert_eq!(used(&e, "a", "q", "count/configmaps").as_deref(), Some("1"));
    let mut out = Vec::new();
    w.on_item(&mut e, id, WatchItem::Apply(event("a", "y")), now, &mut out);
    assert_eq!(
        out,
        vec![Action::Enqueue(q.clone())],
        "a new object replenishes its quota"
    );
    assert_eq!(used(&e, "a", "q", "count/configmaps").as_deref(), Some("2"));

    let mut out = Vec::new();
    for change in e.delete_quota(&q) {
        w.sync(&mut e, &change.cluster, &change.resource, &not_shared, &mut out);
    }
    assert_eq!(out, vec![Action::Stop { id, key: key.clone() }]);
    assert!(
        !e.holds(StoreKind::Counts, &partition(&key, "a")),
        "its partition is released"
    );
    let mut out = Vec::new();
    w.on_item(&mut e, id, WatchItem::Apply(event("a", "z")), now, &mut out);
    assert!(out.is_empty(), "a stopped watch's late items are ignored");
}

#[test]
fn namespaces_joining_a_cluster_wide_watch_are_filled_a_few_at_a_time() {
    let mut e = engine();
    let mut w = Watches::new(settings(Mode::Lazy, 0), false, ids());
    let out = add_quota(&mut w, &mut e, "ns0", "q", &["count/configmaps"]);
    let (_, key) = only_start(&out);
    assert_eq!(
        key.namespace, None,
        "threshold 0: cluster-wide from the first namespace"
    );
    let mut fills = Vec::new();
    for i in 1..=MAX_FILLS + 3 {
        for action in add_quota(&mut w, &mut e, &format!("ns{i}"), "q", &["count/configmaps"]) {
            match action {
                Action::Fill { namespace, .. } => fills.push(namespace),
                other => panic!("only fills expected, got {other:?}"),
            }
        }
    }
    assert_eq!(fills.len(), MAX_FILLS, "at most {MAX_FILLS} lists at once");
    // One fill returns: one queued fill starts.
    let mut out = Vec::new();
    let ns1 = fills.remove(0);
    w.on_fill(
        &mut e,
        &key,
        &ns1,
        Ok(vec![("x".into(), Projected::Meta)]),
        &not_shared,
        &mut out,
    );
    assert_eq!(out.iter().filter(|a| matches!(a, Action::Fill { .. })).count(), 1);
    // A failed fill restarts the watch: the exact, heavier path.
    let mut out = Vec::new();
    let ns2 = fills.remove(0);
    w.on_fill(&mut e, &key, &ns2, Err("refused".into()), &not_shared, &mut out);
    assert!(matches!(out[0], Action::FillFailed { .. }), "{out:?}");
    assert!(out.iter().any(|a| matches!(a, Action::Stop { .. })));
    assert_eq!(started(&out).len(), 1, "started again: {out:?}");
}

/// Simulator seed 132,441: a kcp subscriber waiting for its shared watch's list (held back by a
/// restart's wait) gained a namespace, whose fill then counted though no event after the fill's
/// list could arrive before the shared watch listed.
#[test]
fn a_namespace_filled_into_a_watch_still_listing_counts_only_once_its_list_ends() {
    let mut e = engine();
    let mut w = Watches::new(settings(Mode::Lazy, 0), false, ids());
    let (id, key) = only_start(&add_quota(&mut w, &mut e, "ns0", "q", &["count/configmaps"]));
    let out = add_quota(&mut w, &mut e, "ns1", "q", &["count/configmaps"]);
    assert!(matches!(out[..], [Action::Fill { .. }]), "{out:?}");
    let now = Time::from_unix_nanos(0);
    let mut out = Vec::new();
    let ns1: Arc<str> = Arc::from("ns1");
    let listed = Ok(vec![("x".into(), Projected::Meta)]);
    w.on_fill(&mut e, &key, &ns1, listed, &not_shared, &mut out);
    let q = QuotaKey::new(&cluster(), "ns1", "q");
    let cm = "count/configmaps".to_owned();
    assert!(
        e.compute(&q, now).unwrap().uncomputed.contains(&cm),
        "the watch has not listed: objects stored after the fill's list are not seen yet"
    );
    for item in [
        WatchItem::Init,
        WatchItem::InitApply(event("ns1", "x")),
        WatchItem::InitApply(event("ns1", "y")),
        WatchItem::InitDone,
    ] {
        w.on_item(&mut e, id, item, now, &mut out);
    }
    assert_eq!(used(&e, "ns1", "q", "count/configmaps").as_deref(), Some("2"));
}

/// A namespace that joins while the watch lists: the list's objects of it from before it
/// joined were dropped at ingest, so the list's end must not make it count before its fill.
#[test]
fn a_namespace_joining_during_a_list_counts_only_once_its_fill_ends() {
    let mut e = engine();
    let mut w = Watches::new(settings(Mode::Lazy, 0), false, ids());
    let (id, key) = only_start(&add_quota(&mut w, &mut e, "ns0", "q", &["count/configmaps"]));
    let now = Time::from_unix_nanos(0);
    let mut out = Vec::new();
    w.on_item(&mut e, id, WatchItem::Init, now, &mut out);
    w.on_item(&mut e, id, WatchItem::InitApply(event("ns1", "x")), now, &mut out);
    let joined = add_quota(&mut w, &mut e, "ns1", "q", &["count/configmaps"]);
    assert!(matches!(joined[..], [Action::Fill { .. }]), "{joined:?}");
    w.on_item(&mut e, id, WatchItem::InitDone, now, &mut out);
    let q = QuotaKey::new(&cluster(), "ns1", "q");
    let cm = "count/configmaps".to_owned();
    assert!(
        e.compute(&q, now).unwrap().uncomputed.contains(&cm),
        "x was dropped before ns1 joined: only the fill has it"
    );
    let ns1: Arc<str> = Arc::from("ns1");
    let listed = Ok(vec![("x".into(), Projected::Meta)]);
    w.on_fill(&mut e, &key, &ns1, listed, &not_shared, &mut out);
    assert_eq!(used(&e, "ns1", "q", "count/configmaps").as_deref(), Some("1"));
}

/// Quota `a/q` on `count/configmaps` and the one watch it starts (not yet listed).
fn one_configmap_watch() -> (Engine, Watches, u64, WatchKey, QuotaKey) {
    let mut e = engine();
    let mut w = Watches::new(settings(Mode::Lazy, 8), false, ids());
    let out = add_quota(&mut w, &mut e, "a", "q", &["count/configmaps"]);
    let (id, key) = only_start(&out);
    (e, w, id, key, QuotaKey::new(&cluster(), "a", "q"))
}

#[test]
fn a_failing_watch_tells_its_quotas_and_recovers_on_its_next_event() {
    let (mut e, mut w, id, key, q) = one_configmap_watch();
    let now = Time::from_unix_nanos(0);
    let mut out = Vec::new();
    w.on_item(
        &mut e,
        id,
        WatchItem::Failed("forbidden", "403".into()),
        now,
        &mut out,
    );
    assert!(
        matches!(&out[0], Action::Event { quota, warning: true, reason: "ResourceUnavailable", .. } if quota == &q)
    );
    assert!(matches!(&out[1], Action::Failing { new_reason: true, .. }));
    assert_eq!(
        out[2],
        Action::Enqueue(q.clone()),
        "written now rather than held for the first list"
    );
    assert_eq!(
        w.first_lists_pending(&q, &[configmaps()]).count(),
        0,
        "a failing watch holds nothing back"
    );
    let mut out = Vec::new();
    w.on_item(
        &mut e,
        id,
        WatchItem::Failed("forbidden", "403".into()),
        now,
        &mut out,
    );
    assert!(
        matches!(
            &out[..],
            [Action::Failing {
                new_reason: false,
                ..
            }]
        ),
        "told once per reason"
    );
    let mut out = Vec::new();
    w.on_item(&mut e, id, WatchItem::Init, now, &mut out);
    w.on_item(&mut e, id, WatchItem::InitDone, now, &mut out);
    assert!(out.contains(&Action::Recovered(key.clone())));
    assert!(out.iter().any(|a| matches!(
        a,
        Action::Event {
            warning: false,
            reason: "ResourceAvailable",
            ..
        }
    )));
}

#[test]
fn a_watch_failing_after_its_sync_stops_counting_until_it_delivers_again() {
    let (mut e, mut w, id, _, q) = one_configmap_watch();
    let now = Time::from_unix_nanos(0);
    let mut out = Vec::new();
    for item in [
        WatchItem::Init,
        WatchItem::InitApply(event("a", "x")),
        WatchItem::InitApply(event("a", "y")),
        WatchItem::InitDone,
    ] {
        w.on_item(&mut e, id, item, now, &mut out);
    }
    assert_eq!(used(&e, "a", "q", "count/configmaps").as_deref(), Some("2"));
    let cm = "count/configmaps".to_owned();

    // Cut (or 403 after an RBAC change): objects created meanwhile are not seen, so the two
    // held are not the truth — the key is not computed, it keeps the stored value. kube's
    // watcher would resume without an event to say so: the watch is reopened to list afresh,
    // once (a failure while it relists is left to kube's backoff).
    let restarts = |out: &[Action]| {
        out.iter()
            .filter(|a| matches!(a, Action::Restart { id: i, .. } if *i == id))
            .count()
    };
    let mut out = Vec::new();
    w.on_item(&mut e, id, WatchItem::Failed("cut", "eof".into()), now, &mut out);
    assert_eq!(restarts(&out), 1, "{out:?}");
    let mut out = Vec::new();
    w.on_item(
        &mut e,
        id,
        WatchItem::Failed("forbidden", "403".into()),
        now,
        &mut out,
    );
    assert_eq!(
        restarts(&out),
        0,
        "no second reopen before it has listed: {out:?}"
    );
    let computed = e.compute(&q, now).expect("known quota");
    assert!(computed.uncomputed.contains(&cm), "{computed:?}");
    assert_eq!(computed.unsynced, vec![configmaps()]);

    // A relist's old generation is not the truth either, until the relist ends.
    w.on_item(&mut e, id, WatchItem::Init, now, &mut out);
    w.on_item(&mut e, id, WatchItem::InitApply(event("a", "x")), now, &mut out);
    assert!(e.compute(&q, now).unwrap().uncomputed.contains(&cm));
    let mut out = Vec::new();
    w.on_item(&mut e, id, WatchItem::InitDone, now, &mut out);
    assert!(out.contains(&Action::Enqueue(q.clone())));
    assert_eq!(used(&e, "a", "q", "count/configmaps").as_deref(), Some("1"));

    // A watch that resumes without a relist counts again from its first event on.
    let mut out = Vec::new();
    w.on_item(&mut e, id, WatchItem::Failed("cut", "eof".into()), now, &mut out);
    assert_eq!(restarts(&out), 1, "listed since: reopened again");
    assert!(e.compute(&q, now).unwrap().uncomputed.contains(&cm));
    let mut out = Vec::new();
    w.on_item(&mut e, id, WatchItem::Apply(event("a", "z")), now, &mut out);
    assert!(out.contains(&Action::Enqueue(q.clone())), "{out:?}");
    assert_eq!(used(&e, "a", "q", "count/configmaps").as_deref(), Some("2"));
}

#[test]
fn eager_watches_hold_every_namespace_they_see() {
    let mut e = engine();
    let mut w = Watches::new(settings(Mode::Eager, 8), false, ids());
    let mut out = Vec::new();
    w.sync(&mut e, &cluster(), &configmaps(), &not_shared, &mut out);
    let (id, key) = only_start(&out);
    let now = Time::from_unix_nanos(0);
    let mut out = Vec::new();
    w.on_item(&mut e, id, WatchItem::Init, now, &mut out);
    w.on_item(&mut e, id, WatchItem::InitApply(event("b", "x")), now, &mut out);
    w.on_item(&mut e, id, WatchItem::InitDone, now, &mut out);
    assert!(e.holds(StoreKind::Counts, &partition(&key, "b")));
    // A quota arriving later reads what the eager watch already holds.
    add_quota(&mut w, &mut e, "b", "q", &["count/configmaps"]);
    assert_eq!(used(&e, "b", "q", "count/configmaps").as_deref(), Some("1"));
}

#[test]
fn forgetting_a_cluster_stops_its_watches_releases_their_partitions_and_tells_the_hub() {
    let mut e = engine();
    let other = ClusterName::new("other");
    e.discovered(&other, vec![ServedResource::core_for_tests("configmaps")], &[]);
    let mut w = Watches::new(settings(Mode::Lazy, 8), true, ids());
    let mut out = add_quota(&mut w, &mut e, "a", "q", &["count/configmaps", "count/secrets"]);
    let update = e.apply_quota(QuotaKey::new(&other, "a", "q"), &quota(&["count/configmaps"]));
    for change in update.changes {
        w.sync(&mut e, &change.cluster, &change.resource, &not_shared, &mut out);
    }
    assert_eq!(started(&out).len(), 3, "{out:?}");
    let mut out = Vec::new();
    w.forget_cluster(&mut e, &cluster(), &not_shared, &mut out);
    let stopped: BTreeSet<String> = out
        .iter()
        .filter_map(|a| match a {
            Action::Stop { key, .. } => Some(key.resource.object_count_name()),
            _ => None,
        })
        .collect();
    assert_eq!(
        stopped,
        BTreeSet::from(["count/configmaps".to_owned(), "count/secrets".to_owned()])
    );
    let demand_off = out
        .iter()
        .filter(|a| matches!(a, Action::Demand { cluster: c, count: false, .. } if c == &cluster()))
        .count();
    assert_eq!(
        demand_off, 2,
        "the hub hears both types are no longer wanted: {out:?}"
    );
    assert!(!e.resolver.knows(&cluster()), "discovery forgotten");
    assert_eq!(w.iter().count(), 1, "the other cluster's watch runs on");
    assert!(
        w.iter().all(|(k, _)| k.cluster == other),
        "only the other cluster's watch is left"
    );
    let held = e.held_by_resource();
    assert_eq!(held.values().map(|(objects, _)| objects).sum::<usize>(), 0);
    let mut out = Vec::new();
    let update = e.apply_quota(QuotaKey::new(&cluster(), "b", "q"), &quota(&["count/configmaps"]));
    for change in update.changes {
        w.sync(&mut e, &change.cluster, &change.resource, &not_shared, &mut out);
    }
    assert!(
        started(&out).is_empty(),
        "a forgotten cluster's quotas start nothing until it is discovered again"
    );
}
