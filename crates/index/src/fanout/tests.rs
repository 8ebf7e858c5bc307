//! Tests of the kcp fan-out: a shared watch's events to each subscribed logical cluster.

use std::{
    cell::RefCell,
    collections::{BTreeMap, VecDeque},
    rc::Rc,
};

use proptest::prelude::*;

use super::*;

/// What a subscriber's store keeps: (namespace, name, resourceVersion).
type Obj = (String, String, u64);
type Item = WatchItem<Obj>;

/// A subscriber's reader: its unread items and the store it builds from those it read, the
/// way a controller's store does (a list replaces, events change one object).
#[derive(Default)]
struct Reader {
    queue: VecDeque<Item>,
    closed: bool,
    store: BTreeMap<(String, String), u64>,
    relist: Option<BTreeMap<(String, String), u64>>,
}

impl Reader {
    fn drain(&mut self) {
        self.read(usize::MAX);
    }

    /// Reads up to `n` items.
    fn read(&mut self, n: usize) {
        for _ in 0..n {
            let Some(item) = self.queue.pop_front() else {
                return;
            };
            match item {
                WatchItem::Init => self.relist = Some(BTreeMap::new()),
                WatchItem::InitApply((ns, name, rv)) => {
                    self.relist
                        .as_mut()
                        .expect("InitApply outside a list")
                        .insert((ns, name), rv);
                }
                WatchItem::InitDone => self.store = self.relist.take().expect("InitDone outside a list"),
                WatchItem::Apply((ns, name, rv)) => {
                    assert!(self.relist.is_none(), "an event inside a list");
                    self.store.insert((ns, name), rv);
                }
                WatchItem::Delete((ns, name, _)) => {
                    assert!(self.relist.is_none(), "an event inside a list");
                    self.store.remove(&(ns, name));
                }
                WatchItem::Failed(..) => {}
            }
        }
    }
}

#[derive(Clone, Default)]
struct TestSink(Rc<RefCell<Reader>>);

impl Sink for TestSink {
    type Object = Obj;
    fn send(&mut self, item: Item) {
        let mut reader = self.0.borrow_mut();
        if !reader.closed {
            reader.queue.push_back(item);
        }
    }
    fn unread(&self) -> usize {
        self.0.borrow().queue.len()
    }
    fn is_closed(&self) -> bool {
        self.0.borrow().closed
    }
}

fn seen<'a>(cluster: &'a str, ns: &'a str, name: &str, rv: u64) -> Seen<'a, Obj> {
    Seen {
        cluster,
        namespace: ns,
        revision: Some(rv),
        object: (ns.to_owned(), name.to_owned(), rv),
    }
}

fn subscribed(f: &mut Fanout<TestSink>, cluster: &str) -> (TestSink, Option<Join>) {
    let sink = TestSink::default();
    let join = f.subscribe(ClusterName::new(cluster), None, sink.clone());
    (sink, join)
}

fn live(f: &mut Fanout<TestSink>) {
    f.init();
    f.init_done();
}

#[test]
fn a_subscriber_before_the_shared_list_is_served_by_it() {
    let mut f = Fanout::new(100);
    let (a, join) = subscribed(&mut f, "a");
    assert_eq!(join, None);
    f.init();
    f.init_apply(&seen("a", "ns", "x", 1));
    f.init_apply(&seen("b", "ns", "y", 2));
    f.init_done();
    a.0.borrow_mut().drain();
    assert_eq!(a.0.borrow().store.len(), 1, "only its cluster's object");
}

#[test]
fn a_joining_subscriber_gets_only_buffered_events_newer_than_its_list() {
    let mut f = Fanout::new(100);
    live(&mut f);
    let (a, join) = subscribed(&mut f, "a");
    let join = join.expect("the shared list has passed: a list of its own");
    assert_eq!((join.after, join.failures), (Duration::ZERO, 0));
    f.apply(&seen("a", "ns", "old", 5));
    f.apply(&seen("b", "ns", "other", 6));
    assert_eq!(a.unread(), 0, "buffered while joining");
    let listed = vec![
        ("ns".to_owned(), "old".to_owned(), 5),
        ("ns".to_owned(), "mid".to_owned(), 6),
    ];
    assert_eq!(f.joined(join.generation, Ok((Some(6), listed))), None);
    // The shared watch lags behind the list: a change at or below the list's version is
    // already in it; the first newer one passes, and everything after it.
    f.apply(&seen("a", "ns", "mid", 6));
    f.apply(&seen("a", "ns", "later", 9));
    f.delete(&seen("a", "ns", "old", 10));
    let items: Vec<Item> = a.0.borrow().queue.iter().cloned().collect();
    assert_eq!(
        items,
        vec![
            WatchItem::Init,
            WatchItem::InitApply(("ns".into(), "old".into(), 5)),
            WatchItem::InitApply(("ns".into(), "mid".into(), 6)),
            WatchItem::InitDone,
            WatchItem::Apply(("ns".into(), "later".into(), 9)),
            WatchItem::Delete(("ns".into(), "old".into(), 10)),
        ]
    );
}

#[test]
fn a_failed_join_is_reported_and_retried_with_a_growing_backoff() {
    let mut f = Fanout::new(100);
    live(&mut f);
    let (a, join) = subscribed(&mut f, "a");
    let first = join.expect("joins");
    let second = f
        .joined(first.generation, Err("refused".into()))
        .expect("retried");
    assert_eq!((second.after, second.failures), (Duration::from_secs(2), 1));
    let third = f
        .joined(second.generation, Err("refused".into()))
        .expect("retried");
    assert_eq!((third.after, third.failures), (Duration::from_secs(4), 2));
    assert_eq!(
        f.joined(first.generation, Ok((None, Vec::new()))),
        None,
        "a stale result is ignored"
    );
    assert!(matches!(
        a.0.borrow().queue.front(),
        Some(WatchItem::Failed("join_list", _))
    ));
    assert_eq!(
        doubling(Duration::from_secs(2), 30, Duration::from_mins(5)),
        Duration::from_mins(5)
    );
}

#[test]
fn a_join_list_is_waited_for_only_while_its_subscriber_still_joins() {
    let mut f = Fanout::new(16);
    live(&mut f);
    let (a, join) = subscribed(&mut f, "a");
    let first = join.expect("joins");
    assert!(f.waits_for(first.generation));
    let retry = f
        .joined(first.generation, Err("refused".into()))
        .expect("retried");
    assert!(!f.waits_for(first.generation), "superseded by its retry");
    assert!(f.waits_for(retry.generation));
    a.0.borrow_mut().closed = true;
    f.prune();
    assert!(!f.waits_for(retry.generation), "its subscriber left");
}

#[test]
fn a_subscriber_that_falls_behind_overflows_instead_of_growing_without_bound() {
    const LIMIT: usize = 64;
    let mut f = Fanout::new(LIMIT);
    let (slow, _) = subscribed(&mut f, "a");
    let (other, _) = subscribed(&mut f, "b");
    live(&mut f);
    for s in [&slow, &other] {
        s.0.borrow_mut().drain(); // the shared list
    }
    let (joiner, join) = subscribed(&mut f, "c");
    assert!(join.is_some(), "joins with a list it never gets");
    let mut overflowed = Vec::new();
    for i in 0..=LIMIT as u64 {
        overflowed.extend(f.apply(&seen("a", "ns", &format!("o{i}"), i + 1)));
        overflowed.extend(f.apply(&seen("c", "ns", &format!("o{i}"), i + 1)));
    }
    f.apply(&seen("b", "ns", "x", 1_000));
    assert_eq!(overflowed, vec![ClusterName::new("a"), ClusterName::new("c")]);
    assert_eq!(
        slow.unread(),
        LIMIT + 1,
        "no more than the bound queued, and the overflow told"
    );
    assert!(matches!(
        slow.0.borrow().queue.back(),
        Some(WatchItem::Failed("overflowed", _))
    ));
    assert_eq!(
        joiner.unread(),
        1,
        "a join buffer is bounded too, never passed on; the overflow is told"
    );
    assert_eq!(other.unread(), 1, "others are unaffected");
    f.apply(&seen("a", "ns", "late", 2_000));
    assert_eq!(slow.unread(), LIMIT + 1, "dropped while overflowed");
    let first: Vec<ClusterName> = f.rejoin_caught_up().into_iter().map(|j| j.cluster).collect();
    assert_eq!(first, vec![ClusterName::new("c")], "'a' has not caught up yet");
    slow.0.borrow_mut().drain();
    let second: Vec<ClusterName> = f.rejoin_caught_up().into_iter().map(|j| j.cluster).collect();
    assert_eq!(second, vec![ClusterName::new("a")]);
}

#[test]
fn a_shared_watch_failing_leaves_every_subscriber_to_its_next_list() {
    let mut f = Fanout::new(64);
    let (a, _) = subscribed(&mut f, "a");
    live(&mut f);
    // 'b' subscribes late: its own list is in flight when the watch fails.
    let (b, join) = subscribed(&mut f, "b");
    let join = join.expect("a late subscriber lists its share");
    a.0.borrow_mut().drain();
    f.failed("cut", "eof");
    assert!(matches!(
        a.0.borrow().queue.back(),
        Some(WatchItem::Failed("cut", _))
    ));
    assert!(f.is_listing(), "the watch is opened again and lists");
    assert!(
        f.rejoin_caught_up().is_empty(),
        "no share lists: the watch's own list serves every subscriber"
    );
    // b's list ends while the watch is down: ignored, so b does not count from it while the
    // events after it wait for the watch.
    assert_eq!(f.joined(join.generation, Ok((Some(5), Vec::new()))), None);
    assert!(
        !b.0.borrow()
            .queue
            .iter()
            .any(|i| matches!(i, WatchItem::InitDone)),
        "b counts nothing before the watch lists again"
    );
    let (c, join) = subscribed(&mut f, "c");
    assert_eq!(
        join, None,
        "a subscriber arriving now is served by the coming list"
    );
    live(&mut f);
    for sink in [&a, &b, &c] {
        assert!(matches!(sink.0.borrow().queue.back(), Some(WatchItem::InitDone)));
    }
}

// ---- the property ------------------------------------------------------------------------

const CLUSTERS: [&str; 2] = ["a", "b"];
const NAMESPACES: [&str; 2] = ["n1", "n2"];

#[derive(Clone, Debug)]
enum Op {
    /// A write on the shard (create or update; or delete).
    Write {
        cluster: usize,
        ns: usize,
        name: usize,
        delete: bool,
    },
    /// The shared watch delivers up to this many changes it has not yet delivered.
    Deliver(usize),
    /// The shared watch relists (at the shard's current state).
    Relist,
    /// The shared watch fails (it resumes by itself).
    Fail,
    /// A subscriber of a cluster, of one namespace or all.
    Subscribe { cluster: usize, ns: Option<usize> },
    /// A pending join list finishes: failing, listed when it was asked for, or listed now.
    RunJoin { pick: usize, fail: bool, early: bool },
    /// A subscriber's reader reads up to this many unread items.
    Read(usize, usize),
    /// The hub's tick: caught-up overflowed subscribers join again.
    Rejoin,
    /// A subscriber leaves.
    Leave(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..2usize, 0..2usize, 0..2usize, any::<bool>())
            .prop_map(|(cluster, ns, name, delete)| Op::Write { cluster, ns, name, delete }),
        3 => (1..6usize).prop_map(Op::Deliver),
        1 => Just(Op::Relist),
        1 => Just(Op::Fail),
        2 => (0..2usize, proptest::option::of(0..2usize)).prop_map(|(cluster, ns)| Op::Subscribe { cluster, ns }),
        3 => (0..8usize, 0..4u8).prop_map(|(pick, how)| Op::RunJoin { pick, fail: how == 0, early: how == 1 }),
        3 => (0..8usize, 1..5usize).prop_map(|(i, n)| Op::Read(i, n)),
        1 => Just(Op::Rejoin),
        1 => (0..8usize).prop_map(Op::Leave),
    ]
}

type Key = (usize, usize, usize); // cluster, namespace, name

/// The shard and its shared watch, around the fan-out under test.
struct World {
    revision: u64,
    state: BTreeMap<Key, u64>,
    log: Vec<(u64, Key, bool)>,
    /// The shared watch has listed once; changes up to `cursor` in `log` are delivered.
    listed: bool,
    cursor: usize,
    fanout: Fanout<TestSink>,
    subscribers: Vec<(usize, Option<usize>, TestSink)>,
    /// The shard's state after each revision (index: the revision).
    history: Vec<BTreeMap<Key, u64>>,
    /// Per subscriber, the oldest revision its store may show next (stores never go back).
    seen_revision: Vec<usize>,
    /// Join lists asked for, with the shard's state and version when asked.
    pending: Vec<(Join, u64, BTreeMap<Key, u64>)>,
}

impl World {
    fn new(limit: usize) -> Self {
        Self {
            revision: 0,
            state: BTreeMap::new(),
            log: Vec::new(),
            listed: false,
            cursor: 0,
            fanout: Fanout::new(limit),
            subscribers: Vec::new(),
            history: vec![BTreeMap::new()],
            seen_revision: Vec::new(),
            pending: Vec::new(),
        }
    }

    fn asked(&mut self, joins: impl IntoIterator<Item = Join>) {
        for join in joins {
            self.pending.push((join, self.revision, self.state.clone()));
        }
    }

    fn listing(state: &BTreeMap<Key, u64>, join: &Join) -> Vec<Obj> {
        state
            .iter()
            .filter(|((c, ns, _), _)| {
                CLUSTERS[*c] == join.cluster.as_str()
                    && join.namespace.as_deref().is_none_or(|n| n == NAMESPACES[*ns])
            })
            .map(|((_, ns, name), rv)| (NAMESPACES[*ns].to_owned(), format!("o{name}"), *rv))
            .collect()
    }

    fn relist(&mut self) {
        self.fanout.init();
        for (&(c, ns, name), &rv) in &self.state {
            let name = format!("o{name}");
            self.fanout
                .init_apply(&seen(CLUSTERS[c], NAMESPACES[ns], &name, rv));
        }
        self.fanout.init_done();
        self.listed = true;
        self.cursor = self.log.len();
    }

    fn deliver(&mut self, n: usize) {
        if !self.listed {
            return; // a watch delivers changes only after its first list
        }
        for _ in 0..n {
            let Some(&(rv, (c, ns, name), delete)) = self.log.get(self.cursor) else {
                return;
            };
            self.cursor += 1;
            let name = format!("o{name}");
            let seen = seen(CLUSTERS[c], NAMESPACES[ns], &name, rv);
            if delete {
                self.fanout.delete(&seen);
            } else {
                self.fanout.apply(&seen);
            }
        }
    }

    fn run_join(&mut self, pick: usize, fail: bool, early: bool) {
        if self.pending.is_empty() {
            return;
        }
        let (join, at, state) = self.pending.remove(pick % self.pending.len());
        let listed = if fail {
            Err("refused".to_owned())
        } else if early {
            Ok((Some(at), Self::listing(&state, &join)))
        } else {
            Ok((Some(self.revision), Self::listing(&self.state, &join)))
        };
        let retry = self.fanout.joined(join.generation, listed);
        self.asked(retry);
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Write {
                cluster,
                ns,
                name,
                delete,
            } => {
                let key = (cluster, ns, name);
                if delete && !self.state.contains_key(&key) {
                    return;
                }
                self.revision += 1;
                if delete {
                    self.state.remove(&key);
                } else {
                    self.state.insert(key, self.revision);
                }
                self.log.push((self.revision, key, delete));
                self.history.push(self.state.clone());
            }
            Op::Deliver(n) => self.deliver(n),
            Op::Relist => self.relist(),
            Op::Fail => {
                // The hub opens a failed watch again: what comes next is its list.
                self.fanout.failed("test", "cut");
                self.listed = false;
            }
            Op::Subscribe { cluster, ns } => {
                if self.subscribers.len() >= 6 {
                    return;
                }
                let sink = TestSink::default();
                let join = self.fanout.subscribe(
                    ClusterName::new(CLUSTERS[cluster]),
                    ns.map(|n| NAMESPACES[n].to_owned()),
                    sink.clone(),
                );
                self.asked(join);
                self.subscribers.push((cluster, ns, sink));
                self.seen_revision.push(0);
            }
            Op::RunJoin { pick, fail, early } => self.run_join(pick, fail, early),
            Op::Read(i, n) => {
                if !self.subscribers.is_empty() {
                    self.read(i % self.subscribers.len(), n);
                }
            }
            Op::Rejoin => {
                let joins = self.fanout.rejoin_caught_up();
                self.asked(joins);
            }
            Op::Leave(i) => {
                if !self.subscribers.is_empty() {
                    let i = i % self.subscribers.len();
                    let (_, _, sink) = self.subscribers.remove(i);
                    self.seen_revision.remove(i);
                    sink.0.borrow_mut().closed = true;
                    self.fanout.prune();
                }
            }
        }
    }

    /// Subscriber `i` reads up to `n` unread items, one at a time. After each, outside a
    /// list, its store must be its share of the shard at some revision — a consistent state,
    /// never a mix of old and new — and not older than the one it showed before.
    fn read(&mut self, i: usize, n: usize) {
        let (cluster, ns, sink) = &self.subscribers[i];
        for _ in 0..n {
            if sink.0.borrow().queue.is_empty() {
                return;
            }
            sink.0.borrow_mut().read(1);
            if sink.0.borrow().relist.is_some() {
                continue;
            }
            let store = sink.0.borrow().store.clone();
            let from = self.seen_revision[i];
            let at = (from..self.history.len())
                .find(|r| Self::share(&self.history[*r], *cluster, *ns) == store)
                .unwrap_or_else(|| {
                    panic!(
                        "cluster {} namespace {ns:?}: store {store:?} is the shard's state at no revision from {from} on",
                        CLUSTERS[*cluster]
                    )
                });
            self.seen_revision[i] = at;
        }
    }

    fn share(
        state: &BTreeMap<Key, u64>,
        cluster: usize,
        ns: Option<usize>,
    ) -> BTreeMap<(String, String), u64> {
        state
            .iter()
            .filter(|((c, n, _), _)| *c == cluster && ns.is_none_or(|ns| ns == *n))
            .map(|((_, n, name), rv)| ((NAMESPACES[*n].to_owned(), format!("o{name}")), *rv))
            .collect()
    }

    /// Everything settles: the shared watch catches up, every list runs, every reader reads,
    /// overflowed subscribers join again.
    fn settle(&mut self) {
        for _ in 0..20 {
            if !self.listed {
                self.relist();
            }
            self.deliver(usize::MAX);
            while !self.pending.is_empty() {
                self.run_join(0, false, false);
            }
            for i in 0..self.subscribers.len() {
                self.read(i, usize::MAX);
            }
            let joins = self.fanout.rejoin_caught_up();
            if joins.is_empty() {
                return;
            }
            self.asked(joins);
        }
        panic!("did not settle");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Writes, lagging deliveries, relists, failures, subscriptions, join lists (failing,
    /// early or late), slow readers that overflow, and departures in any order: once it all
    /// settles, every subscriber's store holds exactly its share of the shard, each object
    /// once and at its latest version; and whenever a reader reads, its store is its share at
    /// some revision no older than the last it showed (never a mix, never going back).
    #[test]
    fn every_subscriber_ends_with_exactly_its_share(
        ops in proptest::collection::vec(op(), 0..80),
        limit in 2..8usize,
        listed_first in any::<bool>(),
    ) {
        let mut world = World::new(limit);
        if listed_first {
            world.relist();
        }
        for op in &ops {
            world.step(op);
        }
        world.settle();
        for (cluster, ns, sink) in &world.subscribers {
            let want = World::share(&world.state, *cluster, *ns);
            let reader = sink.0.borrow();
            prop_assert!(reader.relist.is_none(), "a list left open");
            prop_assert_eq!(&reader.store, &want, "cluster {} namespace {:?}", CLUSTERS[*cluster], ns);
        }
        prop_assert_eq!(world.fanout.len(), world.subscribers.len());
    }
}
