//! The watch set's property: quotas, objects, lists, fills and failures in any order keep the
//! watch set the planner's, and every quota ends counting exactly its namespace's objects.

use super::*;

const NAMESPACES: [&str; 4] = ["n0", "n1", "n2", "n3"];
const TYPES: [&str; 2] = ["configmaps", "secrets"];

#[derive(Clone, Debug)]
enum Op {
    /// A quota in a namespace on one type (or its count key removed: deleted).
    Quota { ns: usize, ty: usize, on: bool },
    /// An object created or deleted in the world (a watch delivers it if it runs).
    Object {
        ns: usize,
        ty: usize,
        name: usize,
        on: bool,
    },
    /// Some running watch (picked by index) lists the world.
    List(usize),
    /// Some pending fill finishes, or fails.
    Fill(usize, bool),
    /// Some running watch fails.
    Fail(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..4usize, 0..2usize, any::<bool>()).prop_map(|(ns, ty, on)| Op::Quota { ns, ty, on }),
        4 => (0..4usize, 0..2usize, 0..3usize, any::<bool>()).prop_map(|(ns, ty, name, on)| Op::Object { ns, ty, name, on }),
        2 => (0..8usize).prop_map(Op::List),
        2 => (0..8usize, any::<bool>()).prop_map(|(i, ok)| Op::Fill(i, ok)),
        1 => (0..8usize).prop_map(Op::Fail),
    ]
}

/// The controller's IO, modelled: open watches, pending fills, and the world they read.
struct Model {
    engine: Engine,
    watches: Watches,
    /// (namespace, type) → object names.
    world: BTreeMap<(usize, usize), BTreeSet<usize>>,
    open: BTreeMap<u64, WatchKey>,
    /// Open watches that have listed once (a watch delivers changes only after its list).
    listed: BTreeSet<u64>,
    fills: Vec<(WatchKey, Arc<str>)>,
}

impl Model {
    fn carry_out(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Start { id, key, .. } => {
                    assert!(self.open.insert(id, key).is_none(), "a watch id started twice");
                }
                Action::Stop { id, .. } => {
                    assert!(
                        self.open.remove(&id).is_some(),
                        "stopped a watch that was not open"
                    );
                    self.listed.remove(&id);
                }
                Action::Fill { key, namespace, .. } => self.fills.push((key, namespace)),
                _ => {}
            }
        }
    }

    fn objects(&self, key: &WatchKey, namespace: Option<&str>) -> Vec<ObjectEvent> {
        let ty = TYPES
            .iter()
            .position(|t| *t == key.resource.resource)
            .expect("a known type");
        self.world
            .iter()
            .filter(|((ns, t), _)| *t == ty && namespace.is_none_or(|n| n == NAMESPACES[*ns]))
            .flat_map(|((ns, _), names)| names.iter().map(|n| event(NAMESPACES[*ns], &format!("o{n}"))))
            .collect()
    }

    fn list(&mut self, id: u64) {
        let key = self.open[&id].clone();
        let now = Time::from_unix_nanos(0);
        let mut out = Vec::new();
        self.watches
            .on_item(&mut self.engine, id, WatchItem::Init, now, &mut out);
        for object in self.objects(&key, key.namespace.as_deref()) {
            self.watches
                .on_item(&mut self.engine, id, WatchItem::InitApply(object), now, &mut out);
        }
        self.watches
            .on_item(&mut self.engine, id, WatchItem::InitDone, now, &mut out);
        self.listed.insert(id);
        self.carry_out(out);
    }

    fn fill(&mut self, i: usize, ok: bool) {
        let (key, namespace) = self.fills.remove(i);
        let listed = if ok {
            Ok(self
                .objects(&key, Some(&namespace))
                .into_iter()
                .map(|o| (o.name, o.object))
                .collect())
        } else {
            Err("refused".to_owned())
        };
        let mut out = Vec::new();
        self.watches
            .on_fill(&mut self.engine, &key, &namespace, listed, &not_shared, &mut out);
        self.carry_out(out);
    }

    fn step(&mut self, op: &Op) {
        let now = Time::from_unix_nanos(0);
        match *op {
            Op::Quota { ns, ty, on } => {
                let key = QuotaKey::new(&cluster(), NAMESPACES[ns], TYPES[ty]);
                let changes = if on {
                    self.engine
                        .apply_quota(key, &quota(&[&format!("count/{}", TYPES[ty])]))
                        .changes
                } else {
                    self.engine.delete_quota(&key)
                };
                let mut out = Vec::new();
                for change in changes {
                    self.watches.sync(
                        &mut self.engine,
                        &change.cluster,
                        &change.resource,
                        &not_shared,
                        &mut out,
                    );
                }
                self.carry_out(out);
            }
            Op::Object { ns, ty, name, on } => {
                let names = self.world.entry((ns, ty)).or_default();
                let changed = if on {
                    names.insert(name)
                } else {
                    names.remove(&name)
                };
                if !changed {
                    return;
                }
                let object = event(NAMESPACES[ns], &format!("o{name}"));
                let item = if on {
                    WatchItem::Apply(object)
                } else {
                    WatchItem::Delete(object)
                };
                // Every open watch of the type that covers the namespace sees it.
                let ids: Vec<u64> = self
                    .open
                    .iter()
                    .filter(|(id, k)| {
                        self.listed.contains(id)
                            && k.resource.resource == TYPES[ty]
                            && k.namespace.as_deref().is_none_or(|n| n == NAMESPACES[ns])
                    })
                    .map(|(id, _)| *id)
                    .collect();
                for id in ids {
                    let mut out = Vec::new();
                    self.watches
                        .on_item(&mut self.engine, id, item.clone(), now, &mut out);
                    self.carry_out(out);
                }
            }
            Op::List(i) => {
                if let Some(id) = self.open.keys().nth(i % self.open.len().max(1)).copied() {
                    self.list(id);
                }
            }
            Op::Fill(i, ok) => {
                if !self.fills.is_empty() {
                    self.fill(i % self.fills.len(), ok);
                }
            }
            Op::Fail(i) => {
                if let Some(id) = self.open.keys().nth(i % self.open.len().max(1)).copied() {
                    let mut out = Vec::new();
                    let item = WatchItem::Failed("test", "cut".into());
                    self.watches.on_item(&mut self.engine, id, item, now, &mut out);
                    self.carry_out(out);
                }
            }
        }
    }

    /// The watch set is the plan, and the held partitions are what the watches fill.
    fn check_plan(&self) -> Result<(), TestCaseError> {
        let c = cluster();
        for ty in TYPES {
            let resource = GroupResource::core(ty);
            let plan = planner::desired_watches(&self.engine, &self.watches.settings, &c, &resource);
            let running: BTreeMap<WatchKey, BTreeSet<Arc<str>>> = self
                .watches
                .iter()
                .filter(|(k, _)| k.resource == resource)
                .map(|(k, r)| (k.clone(), r.namespaces.iter().cloned().collect()))
                .collect();
            prop_assert_eq!(&running, &plan, "{} watches", ty);
            let held: BTreeSet<Arc<str>> = self
                .engine
                .held_namespaces(StoreKind::Counts, &c, &resource)
                .into_iter()
                .map(|p| p.namespace)
                .collect();
            let filled: BTreeSet<Arc<str>> = plan.values().flatten().cloned().collect();
            prop_assert_eq!(held, filled, "{} partitions held", ty);
        }
        let open: BTreeSet<u64> = self.open.keys().copied().collect();
        let ids: BTreeSet<u64> = self.watches.iter().map(|(_, r)| r.id).collect();
        prop_assert_eq!(open, ids, "the open watches are the running ones");
        Ok(())
    }

    /// Everything lists and every fill completes; a failing watch recovers by a relist, as
    /// kube's watcher does once the apiserver answers again (until then its partitions do not
    /// count).
    fn settle(&mut self) {
        for _ in 0..50 {
            while !self.fills.is_empty() {
                self.fill(0, true);
            }
            let unsynced: Vec<u64> = self
                .watches
                .iter()
                .filter(|(_, r)| !r.synced || r.failure.is_some())
                .map(|(_, r)| r.id)
                .collect();
            if unsynced.is_empty() {
                return;
            }
            for id in unsynced {
                self.list(id);
            }
        }
        panic!("did not settle");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Quotas coming and going across the namespace threshold, objects changing, lists,
    /// fills (some failing) and watch failures in any order: after every step the watch set
    /// is the planner's and holds exactly the partitions it fills; once every watch has
    /// listed and every fill returned, each quota counts exactly its namespace's objects.
    #[test]
    fn the_watch_set_follows_the_plan_and_every_quota_ends_exact(
        ops in proptest::collection::vec(op(), 0..60),
        threshold in 0..3usize,
        max_fills in 1..3usize,
    ) {
        let mut m = Model {
            engine: engine(),
            watches: Watches::new(settings(Mode::Lazy, threshold), false, ids()).with_max_fills(max_fills),
            world: BTreeMap::new(),
            open: BTreeMap::new(),
            listed: BTreeSet::new(),
            fills: Vec::new(),
        };
        for op in &ops {
            m.step(op);
            m.check_plan()?;
        }
        m.settle();
        m.check_plan()?;
        let quotas: Vec<QuotaKey> = m.engine.index.quotas().map(|(k, _)| k.clone()).collect();
        for q in quotas {
            let ty = TYPES.iter().position(|t| *t == &*q.name).expect("quotas are named by type");
            let ns = NAMESPACES.iter().position(|n| *n == &*q.namespace).expect("known namespace");
            let want = m.world.get(&(ns, ty)).map_or(0, BTreeSet::len).to_string();
            let key = format!("count/{}", TYPES[ty]);
            prop_assert_eq!(used(&m.engine, &q.namespace, &q.name, &key), Some(want), "{}", q);
        }
    }
}
