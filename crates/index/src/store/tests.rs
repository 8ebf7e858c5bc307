//! Tests of the UsageStore: identities and projections per partition.

use proptest::prelude::*;

use super::*;
use crate::keys::ObjectIds;

fn object_id(name: &str) -> u64 {
    static IDS: std::sync::LazyLock<ObjectIds> = std::sync::LazyLock::new(ObjectIds::default);
    IDS.id(name)
}

fn key(ns: &str) -> PartitionKey {
    PartitionKey {
        cluster: ClusterName::new("c"),
        resource: GroupResource::core("configmaps"),
        namespace: ns.into(),
    }
}

#[test]
fn unheld_partitions_hold_nothing() {
    let mut store = UsageStore::<()>::new();
    assert_eq!(store.apply(&key("a"), 1, ()), Change::None);
    assert_eq!(store.objects(), 0);
}

#[test]
fn relist_replaces_the_generation_and_marks_synced() {
    let mut store = UsageStore::<()>::new();
    store.hold(key("a"));
    store.apply(&key("a"), 1, ());
    store.apply(&key("a"), 2, ());
    store.begin_relist(&key("a"));
    store.relist_apply(&key("a"), 2, ());
    store.relist_apply(&key("a"), 3, ());
    // During the relist the old generation is still what readers see.
    assert_eq!(store.partition(&key("a")).unwrap().objects().len(), 2);
    assert!(!store.partition(&key("a")).unwrap().is_synced());
    store.finish_relist(&key("a"));
    let p = store.partition(&key("a")).unwrap();
    assert!(p.is_synced());
    let mut ids: Vec<u64> = p.objects().ids().collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![2, 3]);
}

/// The per-object cost of count-only objects, as the design states: ≤ 24 bytes at any
/// load factor (the benchmark target is 64 B per watched count-only object).
#[test]
fn count_only_objects_cost_at_most_24_bytes_each() {
    let mut store = UsageStore::<()>::new();
    store.hold(key("a"));
    store.begin_relist(&key("a"));
    for i in 0..100_000 {
        store.relist_apply(&key("a"), object_id(&format!("cm-{i}")), ());
    }
    store.finish_relist(&key("a"));
    let per_object = store.bytes() / 100_000;
    assert!(per_object <= 24, "{per_object} bytes per count-only object");
    assert_eq!(store.objects(), 100_000);
}

proptest! {
    /// The dense layout (large projections) behaves as a map under any inserts and removes.
    #[test]
    fn dense_objects_behave_as_a_map(ops in prop::collection::vec((any::<bool>(), 0..50u64, any::<u64>()), 0..300)) {
        let mut objects: Objects<[u64; 4]> = Objects::default();
        let dense = matches!(objects, Objects::Dense { .. });
        prop_assert!(dense, "large projections use the dense layout");
        let mut model = std::collections::BTreeMap::new();
        for (insert, id, v) in ops {
            if insert {
                prop_assert_eq!(objects.insert(id, [v; 4]), model.insert(id, [v; 4]));
            } else {
                prop_assert_eq!(objects.remove(id), model.remove(&id));
            }
            prop_assert_eq!(objects.len(), model.len());
        }
        let mut held: Vec<(u64, [u64; 4])> = objects.ids().zip(objects.values().copied()).collect();
        held.sort_unstable();
        prop_assert_eq!(held, model.into_iter().collect::<Vec<_>>());
    }

    /// A fill converges to exactly the objects that exist, however the namespace's list
    /// snapshot (server state at `t`) and the watch's delivery (at `b` when the list
    /// returns) are ordered, once the watch has delivered everything.
    #[test]
    fn fills_converge_whatever_the_list_snapshot(
        events in prop::collection::vec((any::<bool>(), 0..12u64), 0..60),
        a in 0..60usize, t in 0..60usize, b in 0..60usize,
    ) {
        let n = events.len();
        let (a, t, b) = (a.min(n), t.min(n), b.min(n));
        let t = t.max(a); // the list is served after the partition is held
        // Server states after each event.
        let mut states = vec![std::collections::BTreeSet::new()];
        for (add, id) in &events {
            let mut next = states.last().unwrap().clone();
            if *add { next.insert(*id); } else { next.remove(id); }
            states.push(next);
        }
        let mut store = UsageStore::<()>::new();
        let p = key("a");
        // Events before `a` went by while the namespace was not held.
        for (i, (add, id)) in events.iter().enumerate() {
            if i == a {
                store.begin_fill(p.clone());
            }
            if i == b.max(a) {
                store.finish_fill(&p, states[t].iter().map(|id| (*id, ())));
            }
            if i >= a {
                if *add { store.apply(&p, *id, ()); } else { store.delete(&p, *id); }
            }
        }
        if a == n { store.begin_fill(p.clone()); }
        if b.max(a) == n { store.finish_fill(&p, states[t].iter().map(|id| (*id, ()))); }
        let held: std::collections::BTreeSet<u64> = store.partition(&p).unwrap().objects().ids().collect();
        prop_assert_eq!(&held, states.last().unwrap());
        prop_assert!(store.partition(&p).unwrap().is_synced());
    }

    /// Whatever interleaving of watch events and relists, the store ends holding exactly
    /// the objects that exist (never counting one twice).
    #[test]
    fn relists_never_double_count(events in prop::collection::vec((0..4u8, 0..20u64), 0..200)) {
        let mut store = UsageStore::<()>::new();
        store.hold(key("a"));
        let mut truth = std::collections::BTreeSet::new();
        let mut relisting = false;
        for (kind, id) in events {
            match kind {
                0 => { store.apply(&key("a"), id, ()); truth.insert(id); }
                1 => { store.delete(&key("a"), id); truth.remove(&id); }
                2 => {
                    // A relist: the server sends every object that exists now.
                    store.begin_relist(&key("a"));
                    for id in &truth { store.relist_apply(&key("a"), *id, ()); }
                    relisting = true;
                }
                _ => { if relisting { store.finish_relist(&key("a")); relisting = false; } }
            }
        }
        store.finish_relist(&key("a"));
        let held: std::collections::BTreeSet<u64> = store.partition(&key("a")).unwrap().objects().ids().collect();
        prop_assert_eq!(held, truth);
    }
}
