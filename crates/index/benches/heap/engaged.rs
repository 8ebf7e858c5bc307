//! Bookkeeping per open watch and per fan-out subscriber, and the cost of an engaged kcp
//! logical cluster (engaged, let go and engaged again).

use k8s_openapi::{
    api::core::v1::ResourceQuotaStatus, apimachinery::pkg::api::resource::Quantity as K8sQuantity,
};

use super::{
    Action, ClusterName, Demand, Discoveries, Duration, Engine, Fanout, FeatureGates, GroupResource,
    HeapStats, Membership, Mode, ObjectIds, PlanSettings, QuotaKey, Share, Sink, Time, WIDGETS_COUNT_KEY,
    WatchItem, Watches, namespace, quota, served, support,
};

/// Open watches (one per namespace, each with its quota) and kcp fan-out subscribers measured.
pub(crate) const WATCHES: usize = 1_000;

/// Heap per open watch (the watch set's entry and the empty partition it holds) and per
/// fan-out subscriber (its cluster name and sink; none buffered).
pub(crate) struct Bookkeeping {
    pub(crate) per_watch: usize,
    pub(crate) per_subscriber: usize,
}

/// A sink that drops what it is sent (a subscriber's channel is not the fan-out's cost).
pub(crate) struct Dropped;

impl Sink for Dropped {
    type Object = ();
    fn send(&mut self, _item: WatchItem<()>) {}
    fn unread(&self) -> usize {
        0
    }
    fn is_closed(&self) -> bool {
        false
    }
}

pub(crate) fn measure_bookkeeping(cluster: &ClusterName) -> Bookkeeping {
    let widgets = GroupResource::new("example.io", "widgets");
    let mut engine = Engine::new(FeatureGates::default());
    engine.discovered(cluster, vec![served(widgets.clone(), "Widget")], &[]);
    for n in 0..WATCHES {
        let ns = namespace(n);
        engine.apply_quota(
            QuotaKey::new(cluster, &ns, "q"),
            &quota(&ns, "q", &[(WIDGETS_COUNT_KEY, "5")]),
        );
    }
    let settings = PlanSettings {
        mode: Mode::Lazy,
        namespace_watch_threshold: usize::MAX,
        gates: FeatureGates::default(),
    };
    let profiler = dhat::Profiler::builder().testing().build();
    let mut watches = Watches::new(settings, false, ObjectIds::default());
    let mut out = Vec::new();
    let before = HeapStats::get();
    watches.sync(&mut engine, cluster, &widgets, &|_| false, &mut out);
    out.clear();
    out.shrink_to_fit();
    let after = HeapStats::get();
    assert_eq!(watches.iter().count(), WATCHES, "one watch per namespace");
    let mut fanout = Fanout::new(16_384);
    let subscribed = HeapStats::get();
    for n in 0..WATCHES {
        let _ = fanout.subscribe(ClusterName::new(&format!("2x7c{n:012}")), None, Dropped);
    }
    let all = HeapStats::get();
    drop(profiler);
    Bookkeeping {
        per_watch: after.curr_bytes.saturating_sub(before.curr_bytes) / WATCHES,
        per_subscriber: all.curr_bytes.saturating_sub(subscribed.curr_bytes) / WATCHES,
    }
}

// ---- engaged logical clusters (kcp) -------------------------------------------------------

/// Logical clusters engaged, one after another, in the engaged-cluster case.
pub(crate) const ENGAGED: usize = 200;
/// The namespace of each engaged cluster's quota (the kcp benchmark's).
pub(crate) const NS_KCP: &str = "bench";
/// APIExports of the kcp seed scenario; each workspace binds [`BOUND`] of them.
pub(crate) const EXPORTS: usize = 10;
pub(crate) const BOUND: usize = 5;
/// Rounds of letting every engaged cluster go and engaging it again: what stays allocated
/// must not grow from round to round.
pub(crate) const CYCLES: usize = 8;

/// Carries a watch set's `Demand` action to the hub's demand, as the Reconciler does.
pub(crate) fn record_demand(demand: &mut Demand, action: Action) {
    if let Action::Demand {
        cluster,
        resource,
        count,
    } = action
    {
        demand.set(&cluster, &resource, count);
    }
}

/// What engaging logical clusters cost the shard's engine, in dhat's live bytes.
pub(crate) struct EngagedCost {
    /// Per logical cluster the shard has, engaged or not (the LogicalCluster watch's entry).
    pub(crate) per_known: usize,
    /// Per engaged cluster, over all [`ENGAGED`] (the first one interns the shared types).
    pub(crate) per_engaged: usize,
    /// Per engaged cluster, over the second half only (what one more costs).
    pub(crate) per_engaged_marginal: usize,
    /// Of which the subscriber's fan-out entry (cluster name, phase, its [`Share`] sink).
    pub(crate) per_share: usize,
    /// Per engaged cluster by step: membership and discovery slot, discovery (resolver),
    /// quota (engine), watch (plan, hub demand, subscriber, its list).
    pub(crate) stages: [isize; 4],
    /// Bytes still allocated (above the start) after each of [`CYCLES`] rounds of letting
    /// every cluster go; every round but the last engages them all again.
    pub(crate) kept: Vec<isize>,
}

/// Engages [`ENGAGED`] logical clusters as the shard's engine does when a quota appears in
/// each: the membership learns the quota, the cluster gets a discovery slot and its first
/// discovery (a kcp workspace's 40 types and 5 bound ones), the engine takes its quota
/// (`count/<type>`, one bound type), the watch set plans the count watch (served by the hub's
/// shared watch), the hub records the demand and the fan-out takes the subscriber (its share
/// handed to the watch as the Reconciler does). No objects: those cost what the count-only case
/// says, per object.
pub(crate) fn measure_engaged() -> EngagedCost {
    let bound: Vec<GroupResource> = (0..EXPORTS)
        .map(|e| GroupResource::new(format!("e{e}.bench.example.io"), "widgets"))
        .collect();
    let settings = PlanSettings {
        mode: Mode::Lazy,
        namespace_watch_threshold: usize::MAX,
        gates: FeatureGates::default(),
    };
    let clusters: Vec<ClusterName> = (0..ENGAGED)
        .map(|n| ClusterName::new(&format!("2x7c{n:012}")))
        .collect();
    let t0 = std::time::Instant::now();
    let profiler = dhat::Profiler::builder().testing().build();
    let start = HeapStats::get();
    let mut membership = Membership::default();
    membership.clusters_listed(clusters.iter().map(|c| (c.clone(), "Ready".to_owned())));
    let known = HeapStats::get();
    let mut discoveries = Discoveries::new(Duration::from_mins(5), 4);
    // As the shard's engine has it (kcp's quota semantics: cluster-scoped types resolve too).
    let mut engine = Engine::new(FeatureGates::default()).with_kcp_semantics();
    let mut watches = Watches::new(settings, true, ObjectIds::default());
    let mut demand = Demand::default();
    let mut fanout: Fanout<Share> = Fanout::new(lazyquota_index::reconciler::MAX_PENDING);
    // The shared watch has listed (nobody subscribed yet): later subscribers join with lists.
    fanout.init();
    fanout.init_done();
    let mut out = Vec::new();
    let mut ignored = Vec::new();
    let now = Time::from_unix_seconds(1_800_000_000);
    let mut shares = 0;
    // Growth by step: membership and discovery slot, discovery, quota, watch and subscriber.
    let mut stages = [0_isize; 4];
    let before = HeapStats::get();
    let mut half = before.clone();
    let mut after = before.clone();
    // Bytes above `before` after each cycle's disengaging of every cluster.
    let mut kept = Vec::with_capacity(CYCLES);
    for cycle in 0..=CYCLES {
        for (n, cluster) in clusters.iter().enumerate() {
            if cycle == 0 && n == ENGAGED / 2 {
                half = HeapStats::get();
            }
            let mine: Vec<GroupResource> = (0..BOUND).map(|b| bound[(n + b) % EXPORTS].clone()).collect();
            let counted = &mine[0];
            let key = counted.object_count_name();
            let mut spec = quota(NS_KCP, "widgets", &[(&key, "100")]);
            // As after its first status write: what a quota keeps from then on.
            spec.status = Some(ResourceQuotaStatus {
                hard: spec.spec.as_ref().and_then(|s| s.hard.clone()),
                used: Some([(key.clone(), K8sQuantity("3".to_owned()))].into()),
            });
            let mut mark = HeapStats::get().curr_bytes;
            let mut stage = |i: usize| {
                let now = HeapStats::get().curr_bytes;
                if cycle == 0 {
                    stages[i] += now.cast_signed() - mark.cast_signed();
                }
                mark = now;
            };
            membership.quota_applied(cluster.clone(), NS_KCP, "widgets");
            discoveries.add(cluster.clone(), t0);
            assert_eq!(discoveries.start_due(t0), vec![cluster.clone()]);
            discoveries.finished(cluster, true, t0);
            stage(0);
            engine.discovered(cluster, support::kcp_workspace(&mine), &[]);
            stage(1);
            let update = engine.apply_quota(QuotaKey::new(cluster, NS_KCP, "widgets"), &spec);
            assert!(
                update.problems.is_empty() && update.changes.len() == 1,
                "{update:?}"
            );
            drop(update);
            stage(2);
            watches.sync(&mut engine, cluster, counted, &|_| true, &mut out);
            for action in out.drain(..) {
                match action {
                    Action::Demand { .. } => record_demand(&mut demand, action),
                    Action::Start { id, key, shared, .. } => {
                        assert!(shared, "a count watch of a shared type subscribes to the hub");
                        let ready = HeapStats::get();
                        let join = fanout
                            .subscribe(key.cluster.clone(), key.namespace.clone(), Share::new(id))
                            .expect("a subscriber after the shared watch's list joins with a list");
                        if cycle == 0 {
                            shares += HeapStats::get().curr_bytes - ready.curr_bytes;
                        }
                        // Its own list (no objects) ends the join; the Reconciler hands what the
                        // share got to the watch set at once: the subscriber is live.
                        assert!(
                            fanout
                                .joined(join.generation, Ok((Some(1), Vec::new())))
                                .is_none()
                        );
                        let mut items = Vec::new();
                        fanout.for_each_sink(|share| {
                            if share.watch() == id {
                                items = share.take();
                            }
                        });
                        for item in items {
                            watches.on_item(&mut engine, id, item, now, &mut ignored);
                        }
                        // What the controller would carry out: logs, metrics, the quota's computation.
                        assert!(
                            ignored.drain(..).all(|a| matches!(
                                a,
                                Action::Listing(_) | Action::Synced(_) | Action::Enqueue(_)
                            )),
                            "a list's items make a watch listing, synced, and its quota computed"
                        );
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            stage(3);
        }
        ignored.shrink_to_fit();
        out.shrink_to_fit();
        if cycle == 0 {
            after = HeapStats::get();
        }
        assert_eq!(membership.desired().len(), ENGAGED);
        assert_eq!(
            watches.iter().count(),
            ENGAGED,
            "one count watch per engaged cluster"
        );
        assert_eq!(demand.clusters(&bound[0]), ENGAGED / EXPORTS);
        let synced = watches.iter().filter(|(_, r)| r.synced).count();
        assert_eq!(synced, ENGAGED, "every engaged cluster's watch has synced");
        if cycle == CYCLES {
            break;
        }
        // Every quota deleted: each cluster let go as the shard's engine does it, its subscriber
        // left and pruned from the fan-out.
        for cluster in &clusters {
            drop(engine.delete_quota(&QuotaKey::new(cluster, NS_KCP, "widgets")));
            membership.quota_deleted(cluster, NS_KCP, "widgets");
            discoveries.remove(cluster);
            watches.forget_cluster(&mut engine, cluster, &|_| true, &mut out);
            for action in out.drain(..) {
                match action {
                    Action::Demand { .. } => record_demand(&mut demand, action),
                    Action::Stop { .. } => {}
                    other => panic!("unexpected {other:?} while letting a cluster go"),
                }
            }
        }
        fanout.for_each_sink(Share::leave);
        assert!(!fanout.prune(), "every subscriber gone");
        out.shrink_to_fit();
        assert!(membership.desired().is_empty() && watches.iter().count() == 0);
        kept.push(HeapStats::get().curr_bytes.cast_signed() - before.curr_bytes.cast_signed());
    }
    drop(ignored);
    drop(profiler);
    EngagedCost {
        per_known: (known.curr_bytes - start.curr_bytes) / ENGAGED,
        per_engaged: (after.curr_bytes - before.curr_bytes) / ENGAGED,
        per_engaged_marginal: (after.curr_bytes - half.curr_bytes) / (ENGAGED - ENGAGED / 2),
        per_share: shares / ENGAGED,
        stages: stages.map(|b| b / ENGAGED.cast_signed()),
        kept,
    }
}
