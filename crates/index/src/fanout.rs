//! kcp: one shared wildcard watch's events handed to the logical clusters subscribed to it.
//! Pure: the Reconciler's hub (`reconciler/hub.rs`) feeds a [`Fanout`] the shared watch's events
//! and the results of subscribers' own lists, and has the lists it asks for run ([`Join`]).
//!
//! A subscriber is in one of four phases:
//!
//! ```text
//!  subscribe ──► Relisting (the shared list has not begun: it serves this one too)
//!            └─► Joining ── own list at resourceVersion L ──► Live (buffered events > L passed on)
//!  Init of the shared watch: every subscriber ──► Relisting ── InitDone ──► Live
//!  the shared watch fails: every subscriber (told: Failed) ──► Relisting (its caller opens it again)
//!  more than `limit` unread (or buffered) ──► Overflowed (told: Failed) ── reader caught up ──► Joining
//! ```
//!
//! The resourceVersion rule: resourceVersions of one shard are comparable across its logical
//! clusters, and the shared watch delivers them in order. A subscriber's own list at L already
//! holds every change up to L, so the shared events buffered while it listed pass on only if
//! newer than L, and so do the first events after it goes live (the shared watch may lag behind
//! the list). Nothing is counted twice, nothing is missed: the property test below drives
//! writes, lagging deliveries, relists, joins (some failing), overflows and readers in any
//! order and checks every subscriber ends up with exactly its cluster's objects.
//!
//! Costs: per subscriber its cluster name, namespace, phase and sink — 113 bytes of heap with a
//! zero-sized sink (`cargo bench -p lazyquota-index --bench heap`; the Reconciler's sink, a watch
//! id and an empty `Vec`, adds nothing allocated) —
//! and, while it joins, the events buffered (at most `limit`).

use std::time::Duration;

use crate::{keys::ClusterName, queue::doubling};

/// One item of a watch stream as lazyquota's controllers take it, whether from a watch of
/// their own or from a share of a shared one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchItem<O> {
    /// A (re)list starts: a fresh generation follows.
    Init,
    /// An object of the (re)list.
    InitApply(O),
    /// The (re)list is complete.
    InitDone,
    /// An object was added or modified.
    Apply(O),
    /// An object was deleted.
    Delete(O),
    /// The watch failed and retries with backoff: a short `reason` label for metrics, and
    /// the error's text.
    Failed(&'static str, String),
}

/// Where one subscriber's items go (the Reconciler's `Share`: handed to its watch at once).
pub trait Sink {
    /// What the store keeps of an object.
    type Object: Clone;
    /// Passes one item on.
    fn send(&mut self, item: WatchItem<Self::Object>);
    /// Items sent that the reader has not taken yet.
    fn unread(&self) -> usize;
    /// The reader is gone (the subscriber left).
    fn is_closed(&self) -> bool;
}

/// One object of the shared watch, with what routing needs.
#[derive(Clone, Debug)]
pub struct Seen<'a, O> {
    /// Its logical cluster (the `kcp.io/cluster` annotation).
    pub cluster: &'a str,
    /// Its namespace (empty for a cluster-scoped object).
    pub namespace: &'a str,
    /// Its resourceVersion, when it is a number.
    pub revision: Option<u64>,
    /// What the store keeps of it.
    pub object: O,
}

/// A list of one subscriber's share the hub is to run, `after` a backoff, and hand back to
/// [`Fanout::joined`] with `generation`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Join {
    /// Identifies this list among the fan-out's (a stale result is ignored).
    pub generation: u64,
    /// The subscriber's logical cluster.
    pub cluster: ClusterName,
    /// Its namespace, when it watches one only.
    pub namespace: Option<String>,
    /// How long to wait first (the backoff after failed lists).
    pub after: Duration,
    /// Lists of this share that failed in a row before this one.
    pub failures: u32,
}

enum Phase<O> {
    /// Waiting for its own list, buffering shared events with their resourceVersions.
    Joining {
        generation: u64,
        buffer: Vec<(Option<u64>, WatchItem<O>)>,
        failures: u32,
    },
    /// Part of a list of the shared watch in progress.
    Relisting,
    /// Receives shared events as they come, except those at or below `floor` (its own
    /// list's resourceVersion, until a newer event arrives).
    Live { floor: Option<u64> },
    /// Fell `limit` behind: its events are dropped until its reader has caught up.
    Overflowed,
}

struct Subscriber<S: Sink> {
    cluster: ClusterName,
    namespace: Option<String>,
    sink: S,
    phase: Phase<S::Object>,
}

impl<S: Sink> Subscriber<S> {
    fn wants(&self, cluster: &str, namespace: &str) -> bool {
        self.cluster.as_str() == cluster && self.namespace.as_deref().is_none_or(|ns| ns == namespace)
    }
}

/// The subscribers of one shared watch and what each has been given. Pure.
pub struct Fanout<S: Sink> {
    /// Unread (or buffered) items beyond which a subscriber overflows.
    limit: usize,
    /// The shared watch is in its first list or a relist.
    listing: bool,
    /// The current list has begun (its `Init` was passed on): a subscriber arriving now
    /// missed part of it and lists on its own.
    init_seen: bool,
    subscribers: Vec<Subscriber<S>>,
    generation: u64,
}

/// How long a join list waits after `failures` failed ones: none at first, then 2 s doubling
/// up to 5 minutes.
fn join_backoff(failures: u32) -> Duration {
    doubling(Duration::from_secs(2), failures, Duration::from_mins(5))
}

impl<S: Sink> Fanout<S> {
    /// The fan-out of a shared watch just opened (its first list still to come); a
    /// subscriber overflows beyond `limit` unread or buffered items.
    #[must_use]
    pub fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            listing: true,
            init_seen: false,
            subscribers: Vec::new(),
            generation: 0,
        }
    }

    /// A subscriber for `cluster` (and `namespace`) joins; the list it needs, if the shared
    /// watch's own list cannot serve it.
    pub fn subscribe(&mut self, cluster: ClusterName, namespace: Option<String>, sink: S) -> Option<Join> {
        let (phase, join) = if self.listing && !self.init_seen {
            (Phase::Relisting, None)
        } else {
            let join = self.join(cluster.clone(), namespace.clone(), 0);
            (Self::joining(&join), Some(join))
        };
        self.subscribers.push(Subscriber {
            cluster,
            namespace,
            sink,
            phase,
        });
        join
    }

    fn join(&mut self, cluster: ClusterName, namespace: Option<String>, failures: u32) -> Join {
        self.generation += 1;
        Join {
            generation: self.generation,
            cluster,
            namespace,
            after: join_backoff(failures),
            failures,
        }
    }

    fn joining(join: &Join) -> Phase<S::Object> {
        Phase::Joining {
            generation: join.generation,
            buffer: Vec::new(),
            failures: join.failures,
        }
    }

    /// The shared watch starts a (re)list: it supersedes every subscriber's own list.
    pub fn init(&mut self) {
        self.listing = true;
        self.init_seen = true;
        for s in &mut self.subscribers {
            s.sink.send(WatchItem::Init);
            s.phase = Phase::Relisting;
        }
    }

    /// An object of the shared watch's (re)list.
    pub fn init_apply(&mut self, seen: &Seen<'_, S::Object>) {
        for s in &mut self.subscribers {
            if matches!(s.phase, Phase::Relisting) && s.wants(seen.cluster, seen.namespace) {
                s.sink.send(WatchItem::InitApply(seen.object.clone()));
            }
        }
    }

    /// The shared watch's (re)list is complete.
    pub fn init_done(&mut self) {
        self.listing = false;
        for s in &mut self.subscribers {
            if matches!(s.phase, Phase::Relisting) {
                s.sink.send(WatchItem::InitDone);
                s.phase = Phase::Live { floor: None };
            }
        }
    }

    /// An object was added or modified; the clusters of subscribers that overflowed now.
    pub fn apply(&mut self, seen: &Seen<'_, S::Object>) -> Vec<ClusterName> {
        self.route(seen, false)
    }

    /// An object was deleted; the clusters of subscribers that overflowed now.
    pub fn delete(&mut self, seen: &Seen<'_, S::Object>) -> Vec<ClusterName> {
        self.route(seen, true)
    }

    fn route(&mut self, seen: &Seen<'_, S::Object>, delete: bool) -> Vec<ClusterName> {
        let mut overflowed = Vec::new();
        for s in self
            .subscribers
            .iter_mut()
            .filter(|s| s.wants(seen.cluster, seen.namespace))
        {
            let item = if delete {
                WatchItem::Delete(seen.object.clone())
            } else {
                WatchItem::Apply(seen.object.clone())
            };
            let full = match &mut s.phase {
                Phase::Live { floor } => {
                    if floor.zip(seen.revision).is_some_and(|(at, rv)| rv <= at) {
                        false // its own list already holds this change
                    } else {
                        *floor = None;
                        s.sink.unread() >= self.limit || {
                            s.sink.send(item);
                            false
                        }
                    }
                }
                Phase::Joining { buffer, .. } => {
                    buffer.len() >= self.limit || {
                        buffer.push((seen.revision, item));
                        false
                    }
                }
                // A relist in progress delivers the object's state itself; an overflowed
                // subscriber lists again once caught up.
                Phase::Relisting | Phase::Overflowed => false,
            };
            if full {
                s.phase = Phase::Overflowed;
                // Told at once, one item past the bound: its partitions stop counting until it
                // has listed again, rather than reading as synced while events are dropped.
                s.sink.send(WatchItem::Failed(
                    "overflowed",
                    format!(
                        "fell {} events behind the shared watch; listing again once caught up",
                        self.limit
                    ),
                ));
                overflowed.push(s.cluster.clone());
            }
        }
        overflowed
    }

    /// Whether the shared watch is in its first list or a relist (not delivering changes).
    #[must_use]
    pub fn is_listing(&self) -> bool {
        self.listing
    }

    /// The shared watch failed. Every subscriber is told (its partitions stop counting) and
    /// waits for a list of the shared watch, whatever it was doing: the caller opens the
    /// watch again when it was live (kube's watcher resumes a broken watch without an event
    /// to say so, so a subscriber whose cluster is quiet would otherwise never count again),
    /// and a watch failing in its list lists again by itself. A subscriber's own list would
    /// not do: it would count as current while the events after it wait for the shared
    /// watch to come back.
    pub fn failed(&mut self, reason: &'static str, message: &str) {
        let old_rule = crate::mutation::active(crate::mutation::Mutation::SharesRejoinFailedWatch);
        if !old_rule {
            self.listing = true;
            self.init_seen = false;
        }
        for s in &mut self.subscribers {
            s.sink.send(WatchItem::Failed(reason, message.to_owned()));
            if !old_rule {
                s.phase = Phase::Relisting;
            } else if matches!(s.phase, Phase::Live { .. }) {
                s.phase = Phase::Overflowed;
            }
        }
    }

    /// Its lists' generations start after `generation` (a hub reopening a shared watch of a
    /// type whose earlier lists may still be answered).
    #[must_use]
    pub fn after_generation(mut self, generation: u64) -> Self {
        self.generation = generation;
        self
    }

    /// The last generation given to a list.
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether a subscriber still waits for its own list `generation` (not once it left or a
    /// relist of the shared watch took over).
    #[must_use]
    pub fn waits_for(&self, generation: u64) -> bool {
        self.subscribers
            .iter()
            .any(|s| matches!(&s.phase, Phase::Joining { generation: g, .. } if *g == generation))
    }

    /// A subscriber's own list finished: at resourceVersion `at` with its objects, or with
    /// an error (told to the subscriber as a failure, and retried: the list returned). A
    /// result no subscriber waits for any more (a relist took over, or it left) is ignored.
    pub fn joined(
        &mut self,
        generation: u64,
        listed: Result<(Option<u64>, Vec<S::Object>), String>,
    ) -> Option<Join> {
        let i = self
            .subscribers
            .iter()
            .position(|s| matches!(&s.phase, Phase::Joining { generation: g, .. } if *g == generation))?;
        match listed {
            Ok((at, objects)) => {
                let s = &mut self.subscribers[i];
                s.sink.send(WatchItem::Init);
                for object in objects {
                    s.sink.send(WatchItem::InitApply(object));
                }
                s.sink.send(WatchItem::InitDone);
                let Phase::Joining { buffer, .. } =
                    std::mem::replace(&mut s.phase, Phase::Live { floor: at })
                else {
                    unreachable!("found joining above")
                };
                for (rv, item) in buffer {
                    // Only what the list did not already see.
                    if rv.zip(at).is_none_or(|(rv, at)| rv > at) {
                        s.sink.send(item);
                        s.phase = Phase::Live { floor: None };
                    }
                }
                None
            }
            Err(error) => {
                let s = &mut self.subscribers[i];
                s.sink.send(WatchItem::Failed("join_list", error));
                let failures = match &s.phase {
                    Phase::Joining { failures, .. } => failures + 1,
                    _ => 1,
                };
                let (cluster, namespace) = (s.cluster.clone(), s.namespace.clone());
                let join = self.join(cluster, namespace, failures);
                if let Phase::Joining {
                    generation,
                    failures: f,
                    ..
                } = &mut self.subscribers[i].phase
                {
                    *generation = join.generation;
                    *f = join.failures;
                }
                Some(join)
            }
        }
    }

    /// Subscribers that overflowed and whose readers have caught up (below a quarter of the
    /// limit) join again: the lists to run.
    pub fn rejoin_caught_up(&mut self) -> Vec<Join> {
        let mut joins = Vec::new();
        for i in 0..self.subscribers.len() {
            let s = &self.subscribers[i];
            if matches!(s.phase, Phase::Overflowed) && s.sink.unread() <= self.limit / 4 {
                let join = self.join(s.cluster.clone(), s.namespace.clone(), 0);
                self.subscribers[i].phase = Self::joining(&join);
                joins.push(join);
            }
        }
        joins
    }

    /// Drops subscribers whose readers are gone; whether any is left.
    pub fn prune(&mut self) -> bool {
        self.subscribers.retain(|s| !s.sink.is_closed());
        !self.subscribers.is_empty()
    }

    /// Calls `f` with every subscriber's sink (to read or mark it).
    pub fn for_each_sink(&mut self, mut f: impl FnMut(&mut S)) {
        for s in &mut self.subscribers {
            f(&mut s.sink);
        }
    }

    /// Subscribers now.
    pub fn len(&self) -> usize {
        self.subscribers.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.subscribers.is_empty()
    }
}

#[cfg(test)]
mod tests;
