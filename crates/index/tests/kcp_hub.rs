//! The Reconciler's kcp hub on a modelled shard: many logical clusters, each with a quota on one
//! type, served by one shared wildcard watch. The executor is played by this test: it answers
//! discoveries, lists a watch's objects, runs the shared watch and the share lists the
//! Reconciler asks for — holding the share lists back to see how many it starts at once — and
//! answers status writes. Checks: at most `MAX_JOINS` share lists run at once; every cluster's
//! quota ends exactly at its objects; a burst of shared events far beyond the joining buffer's
//! bound reaches a live subscriber whole (nothing to overflow: its share is delivered in the
//! step that read it).
//!
//! The simulator's kcp seeds (`tests/sim`, `world/kcp.rs`) explore faults and interleavings on
//! a shard of a few clusters; this drives the same Reconciler at a larger scale.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::{ResourceQuota, ResourceQuotaSpec, ResourceQuotaStatus},
    apimachinery::pkg::{api::resource::Quantity as K8sQuantity, apis::meta::v1::ObjectMeta},
};
use lazyquota_index::{
    engine::Projected,
    fanout::WatchItem,
    keys::{ClusterName, GroupResource, ObjectIds},
    mutation::{self, Mutation},
    reconciler::{
        CLUSTER_ANNOTATION, ClusterEvent, Discovered, Effect, Input, MAX_JOINS, MAX_PENDING, Now, QuotaEvent,
        Reconciler, Settings, SharedEvent, SharedKey, SharedObject,
    },
    resolver::ServedResource,
    watches::ObjectEvent,
};
use lazyquota_quota::Time;

const KEY: &str = "count/widgets.example.io";
const CLUSTERS: usize = 40;

fn widgets() -> ServedResource {
    ServedResource {
        resource: GroupResource::new("example.io", "widgets"),
        version: "v1".into(),
        kind: "Widget".into(),
        namespaced: true,
        verbs: ["create", "delete", "get", "list", "watch"]
            .map(str::to_owned)
            .to_vec(),
    }
}

fn cluster(i: usize) -> ClusterName {
    ClusterName::new(&format!("c{i:03}"))
}

/// Cluster i holds 1 + i % 5 widgets at first.
fn objects_of(i: usize) -> usize {
    1 + i % 5
}

fn quota(i: usize, rv: u64, used: Option<&str>) -> ResourceQuota {
    let list = |v: &str| BTreeMap::from([(KEY.to_owned(), K8sQuantity(v.to_owned()))]);
    ResourceQuota {
        metadata: ObjectMeta {
            name: Some("q".into()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{i}")),
            resource_version: Some(rv.to_string()),
            annotations: Some(BTreeMap::from([(
                CLUSTER_ANNOTATION.to_owned(),
                cluster(i).to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(list("1000000")),
            ..ResourceQuotaSpec::default()
        }),
        status: used.map(|u| ResourceQuotaStatus {
            hard: Some(list("1000000")),
            used: Some(list(u)),
        }),
    }
}

/// The modelled shard and the executor around the Reconciler.
struct Shard {
    rec: Reconciler,
    origin: Instant,
    ms: u64,
    rv: u64,
    /// Per cluster, its widgets' names and resourceVersions.
    objects: BTreeMap<usize, Vec<(String, u64)>>,
    /// Share lists asked for and not answered yet.
    lists: VecDeque<(SharedKey, u64, ClusterName)>,
    most_lists: usize,
    /// The shared watch opened last.
    shared: Option<SharedKey>,
    /// Every shared watch open now (at most one per type and version).
    open_shared: BTreeSet<SharedKey>,
    /// The last `used` written per cluster.
    used: BTreeMap<String, String>,
    /// Every discovery asked for: the cluster and the groups asked for.
    discoveries: Vec<(ClusterName, Option<BTreeSet<String>>)>,
    /// Whether discoveries wait in `held` for [`Shard::answer_discovery`] (else answered at
    /// once).
    hold_discoveries: bool,
    held: Vec<ClusterName>,
    /// Every effect carried out, in order.
    log: Vec<Effect>,
    violations: Vec<String>,
}

impl Shard {
    fn new() -> Self {
        let origin = Instant::now();
        let settings = Settings {
            cluster: ClusterName::new("*"),
            kcp: true,
            shard: true,
            shared_threshold: 2,
            resync_period: Duration::ZERO,
            ..Settings::default()
        };
        let mut objects = BTreeMap::new();
        let mut rv = 100;
        for i in 0..CLUSTERS {
            let names = (0..objects_of(i))
                .map(|k| {
                    rv += 1;
                    (format!("w{k}"), rv)
                })
                .collect();
            objects.insert(i, names);
        }
        Self {
            rec: Reconciler::new(settings, ObjectIds::default(), origin),
            origin,
            ms: 0,
            rv,
            objects,
            lists: VecDeque::new(),
            most_lists: 0,
            shared: None,
            open_shared: BTreeSet::new(),
            used: BTreeMap::new(),
            discoveries: Vec::new(),
            hold_discoveries: false,
            held: Vec::new(),
            log: Vec::new(),
            violations: Vec::new(),
        }
    }

    fn now(&self) -> Now {
        Now {
            instant: self.origin + Duration::from_millis(self.ms),
            time: Time::from_unix_seconds(1_800_000_000),
        }
    }

    fn event(name: &str, rv: u64) -> ObjectEvent {
        ObjectEvent {
            namespace: "ns".into(),
            name: name.into(),
            object: Projected::Meta,
            revision: Some(rv),
        }
    }

    fn feed(&mut self, input: Input) {
        self.rec.handle(input, self.now());
        self.carry_out();
    }

    fn tick(&mut self, ms: u64) {
        self.ms += ms;
        self.rec.tick(self.now());
        self.carry_out();
    }

    /// Plays the executor: every effect answered at once, except share lists (held in
    /// `lists` until [`Shard::answer_lists`]).
    fn carry_out(&mut self) {
        let mut pending: VecDeque<Effect> = self.rec.take_effects().into();
        while let Some(effect) = pending.pop_front() {
            self.log.push(effect.clone());
            let input = match effect {
                Effect::Discover { cluster, groups } if self.hold_discoveries => {
                    self.discoveries.push((cluster.clone(), groups));
                    self.held.push(cluster);
                    None
                }
                Effect::Discover { cluster, groups } => {
                    // kcp lists its own groups besides the bound one: a narrowed discovery
                    // skips them.
                    let skipped_groups = match &groups {
                        Some(_) => vec!["apis.kcp.io".to_owned()],
                        None => Vec::new(),
                    };
                    let served = match &groups {
                        Some(g) if !g.contains("example.io") => Vec::new(),
                        _ => vec![widgets()],
                    };
                    self.discoveries.push((cluster.clone(), groups));
                    Some(Input::Discovered {
                        cluster,
                        result: Ok(Discovered {
                            served,
                            failed_groups: Vec::new(),
                            skipped_groups,
                        }),
                    })
                }
                Effect::OpenWatch { id, key, .. } => {
                    // A watch of the cluster's own: its list at once, as one input per item.
                    let i = Self::index_of(&key.cluster);
                    let mut items = vec![WatchItem::Init];
                    items.extend(
                        self.objects[&i]
                            .iter()
                            .map(|(n, rv)| WatchItem::InitApply(Self::event(n, *rv))),
                    );
                    items.push(WatchItem::InitDone);
                    for item in items {
                        self.rec.handle(Input::Watch { id, item }, self.now());
                    }
                    pending.extend(self.rec.take_effects());
                    None
                }
                Effect::OpenShared { key, .. } => {
                    if !self.open_shared.insert(key.clone()) {
                        self.violations.push(format!("a second shared watch of {key}"));
                    }
                    self.shared = Some(key.clone());
                    // The shared watch lists at once: every cluster's objects.
                    let mut events = vec![SharedEvent::Init];
                    for (i, names) in &self.objects {
                        events.extend(
                            names
                                .iter()
                                .map(|(n, rv)| SharedEvent::InitApply(Self::shared_object(*i, n, *rv))),
                        );
                    }
                    events.push(SharedEvent::InitDone);
                    for event in events {
                        self.rec.handle(
                            Input::Shared {
                                key: key.clone(),
                                event,
                            },
                            self.now(),
                        );
                    }
                    pending.extend(self.rec.take_effects());
                    None
                }
                Effect::ListShare {
                    key,
                    generation,
                    cluster,
                    ..
                } => {
                    self.lists.push_back((key, generation, cluster));
                    self.most_lists = self.most_lists.max(self.lists.len());
                    if self.lists.len() > MAX_JOINS {
                        self.violations.push(format!(
                            "bounds: {} share lists running at once, MAX_JOINS is {MAX_JOINS}",
                            self.lists.len()
                        ));
                    }
                    None
                }
                Effect::WriteStatus(write) => {
                    let i = Self::index_of(&write.key.cluster);
                    let used = write.used.get(KEY).map(|q| q.0.clone()).unwrap_or_default();
                    self.used.insert(write.key.cluster.to_string(), used.clone());
                    self.rv += 1;
                    Some(Input::Written {
                        key: write.key,
                        precondition: write.precondition,
                        result: Ok(quota(i, self.rv, Some(&used))),
                    })
                }
                Effect::CloseShared { key } => {
                    self.open_shared.remove(&key);
                    if self.shared.as_ref() == Some(&key) {
                        self.shared = None;
                    }
                    None
                }
                _ => None,
            };
            if let Some(input) = input {
                self.rec.handle(input, self.now());
                pending.extend(self.rec.take_effects());
            }
        }
    }

    fn shared_object(i: usize, name: &str, rv: u64) -> SharedObject {
        SharedObject {
            cluster: Some(cluster(i).to_string()),
            object: Self::event(name, rv),
        }
    }

    fn index_of(c: &ClusterName) -> usize {
        (0..CLUSTERS)
            .find(|i| cluster(*i) == *c)
            .expect("a modelled cluster")
    }

    /// Answers `cluster`'s held discovery: widgets served at `version`.
    fn answer_discovery(&mut self, cluster: &ClusterName, version: &str) {
        let at = self
            .held
            .iter()
            .position(|c| c == cluster)
            .expect("a held discovery");
        self.held.remove(at);
        let served = ServedResource {
            version: version.into(),
            ..widgets()
        };
        self.feed(Input::Discovered {
            cluster: cluster.clone(),
            result: Ok(Discovered {
                served: vec![served],
                failed_groups: Vec::new(),
                skipped_groups: vec!["apis.kcp.io".to_owned()],
            }),
        });
    }

    /// A shard whose LogicalCluster and quota watches have listed (nothing in either).
    fn listed() -> Self {
        let mut shard = Self::new();
        shard.feed(Input::LogicalCluster(ClusterEvent::RelistStarted));
        shard.feed(Input::LogicalCluster(ClusterEvent::RelistDone));
        shard.feed(Input::Quota(QuotaEvent::RelistStarted));
        shard.feed(Input::Quota(QuotaEvent::RelistDone));
        shard
    }

    /// A [`Shard::listed`] shard with clusters 0–2 engaged and written.
    fn with_three_engaged() -> Self {
        let mut shard = Self::listed();
        shard.engage(0..3);
        shard
    }

    /// Cluster `i`'s LogicalCluster turns Ready and its quota is created.
    fn add(&mut self, i: usize) {
        self.feed(Input::LogicalCluster(ClusterEvent::Applied {
            cluster: Some(cluster(i)),
            phase: "Ready".into(),
            path: Some(format!("root:c{i:03}")),
        }));
        self.rv += 1;
        self.feed(Input::Quota(QuotaEvent::Applied(quota(i, self.rv, None))));
    }

    /// Engages cluster `i` ([`Shard::add`]) and ticks once.
    fn engage_one(&mut self, i: usize) {
        self.add(i);
        self.tick(0);
    }

    /// Answers the share lists asked for so far, oldest first.
    fn answer_lists(&mut self) {
        while let Some((key, generation, c)) = self.lists.pop_front() {
            let i = Self::index_of(&c);
            let objects = self.objects[&i]
                .iter()
                .map(|(n, rv)| Self::event(n, *rv))
                .collect();
            self.feed(Input::ListedShare {
                key,
                generation,
                result: Ok((Some(self.rv), objects)),
            });
        }
    }

    /// Engages clusters `range` (LogicalClusters Ready, a quota each) and runs until quiet.
    fn engage(&mut self, range: std::ops::Range<usize>) {
        for i in range {
            self.add(i);
        }
        for _ in 0..200 {
            self.tick(100);
        }
    }
}

/// Runs the scenario: the first clusters engage before the shared watch lists (served by its
/// list), the rest after (each joins with a list of its share); the lists are held back so
/// the Reconciler's bound shows. Returns what went wrong.
fn run() -> Result<Shard, String> {
    let mut shard = Shard::listed();
    shard.engage(0..2);
    if shard.shared.is_none() {
        return Err("two clusters counting widgets did not open a shared watch".into());
    }
    shard.engage(2..CLUSTERS);
    for _ in 0..CLUSTERS {
        shard.answer_lists();
        for _ in 0..20 {
            shard.tick(100);
        }
    }
    if let Some(v) = shard.violations.first() {
        return Err(v.clone());
    }
    for i in 0..CLUSTERS {
        let want = objects_of(i).to_string();
        let got = shard.used.get(&cluster(i).to_string()).cloned();
        if got.as_deref() != Some(want.as_str()) {
            return Err(format!("{}: used {got:?}, {want} objects exist", cluster(i)));
        }
    }
    Ok(shard)
}

#[test]
fn share_lists_run_at_most_max_joins_at_once_and_every_workspace_counts_exactly() {
    mutation::set(None);
    let shard = run().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        shard.most_lists, MAX_JOINS,
        "the clusters joining after the shared list filled every slot, and no more"
    );
    assert_eq!(shard.rec.hub().shared_watches(), 1);
}

#[test]
fn mutation_unbounded_joins_is_caught() {
    mutation::set(Some(Mutation::UnboundedJoins));
    let outcome = run();
    mutation::set(None);
    let error = outcome.err().expect("share lists without a bound must be caught");
    assert!(error.starts_with("bounds:"), "{error}");
}

#[test]
fn a_burst_far_beyond_the_joining_buffer_reaches_a_live_subscriber_whole() {
    mutation::set(None);
    let mut shard = run().unwrap_or_else(|e| panic!("{e}"));
    let key = shard.shared.clone().expect("the shared watch");
    let burst = 3 * MAX_PENDING;
    let i = 7;
    for n in 0..burst {
        shard.rv += 1;
        let event = SharedEvent::Apply(Shard::shared_object(i, &format!("burst-{n}"), shard.rv));
        shard.rec.handle(
            Input::Shared {
                key: key.clone(),
                event,
            },
            shard.now(),
        );
    }
    let effects = shard.rec.take_effects();
    assert!(
        effects.iter().all(|e| !matches!(e, Effect::ListShare { .. })),
        "no overflow, so no list again"
    );
    for _ in 0..100 {
        shard.tick(100);
    }
    assert_eq!(
        shard.used.get(&cluster(i).to_string()).map(String::as_str),
        Some((objects_of(i) + burst).to_string().as_str()),
        "every event of the burst counted"
    );
}

#[test]
fn a_workspace_first_discovery_asks_only_for_its_quotas_groups_and_the_full_one_follows() {
    mutation::set(None);
    let shard = run().unwrap_or_else(|e| panic!("{e}"));
    for i in 0..CLUSTERS {
        let asked: Vec<&Option<BTreeSet<String>>> = shard
            .discoveries
            .iter()
            .filter(|(c, _)| *c == cluster(i))
            .map(|(_, groups)| groups)
            .collect();
        assert_eq!(
            asked.first(),
            Some(&&Some(BTreeSet::from(["example.io".to_owned()]))),
            "{}: the first discovery asks for the widgets' group alone: {asked:?}",
            cluster(i)
        );
        assert!(
            asked.iter().skip(1).any(|g| g.is_none()),
            "{}: a full discovery follows the narrowed one: {asked:?}",
            cluster(i)
        );
    }
}

/// The reads of widgets logged since `from` that serve `c`, by version: its own watch's, its
/// share's, or a shared watch opened (whose list serves the subscribers it has then).
fn versions_read(shard: &Shard, from: usize, c: &ClusterName) -> Vec<String> {
    shard.log[from..]
        .iter()
        .filter_map(|e| match e {
            Effect::OpenWatch { key, served, .. } if &key.cluster == c => Some(served.version.clone()),
            Effect::ListShare { key, cluster, .. } if cluster == c => Some(key.version.clone()),
            Effect::OpenShared { key, .. } => Some(format!("shared {}", key.version)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_workspace_first_list_runs_beside_its_discovery_on_what_the_others_serve_and_waits_for_it() {
    mutation::set(None);
    let mut shard = Shard::with_three_engaged();
    assert_eq!(
        shard.used.len(),
        3,
        "the first three are written: {:?}",
        shard.used
    );

    shard.hold_discoveries = true;
    let from = shard.log.len();
    shard.engage_one(3);
    assert_eq!(shard.held, vec![cluster(3)], "its first discovery asked for");
    assert_eq!(
        versions_read(&shard, from, &cluster(3)),
        vec!["v1".to_owned()],
        "its share listed in the same step, on the version the others serve"
    );
    shard.answer_lists();
    for _ in 0..5 {
        shard.tick(100);
    }
    assert!(
        !shard.used.contains_key(&cluster(3).to_string()),
        "nothing written before its discovery answers: {:?}",
        shard.used
    );
    shard.answer_discovery(&cluster(3), "v1");
    shard.tick(0);
    assert_eq!(
        shard.used.get(&cluster(3).to_string()).map(String::as_str),
        Some(objects_of(3).to_string().as_str()),
        "written as soon as the discovery confirms the guess, from the list already made"
    );
    assert_eq!(
        versions_read(&shard, from, &cluster(3)),
        vec!["v1".to_owned()],
        "a confirmed guess lists nothing again"
    );

    // A guess the discovery does not confirm: the workspace serves widgets at v2.
    let from = shard.log.len();
    shard.engage_one(4);
    shard.answer_lists();
    for _ in 0..5 {
        shard.tick(100);
    }
    assert!(
        !shard.used.contains_key(&cluster(4).to_string()),
        "nothing written before its discovery answers"
    );
    shard.answer_discovery(&cluster(4), "v2");
    assert_eq!(
        versions_read(&shard, from, &cluster(4)),
        vec!["v1".to_owned(), "shared v2".to_owned()],
        "the watch started on the guess restarts at the version discovered (the first of v2: \
         a shared watch of its own, whose list serves it)"
    );
    shard.answer_lists();
    for _ in 0..5 {
        shard.tick(100);
    }
    assert_eq!(
        shard.used.get(&cluster(4).to_string()).map(String::as_str),
        Some(objects_of(4).to_string().as_str()),
    );
    assert_eq!(shard.violations, Vec::<String>::new());
    assert_eq!(
        shard.open_shared.len(),
        2,
        "widgets at v1 and at v2: {:?}",
        shard.open_shared
    );
}

#[test]
fn a_guess_the_workspace_does_not_serve_tells_its_quota_nothing_and_its_discovery_stops_the_watch() {
    mutation::set(None);
    let mut shard = Shard::with_three_engaged();
    shard.hold_discoveries = true;
    shard.engage_one(3);
    let (key, generation, c) = shard.lists.pop_front().expect("the share listed on the guess");
    assert_eq!(c, cluster(3));
    let from = shard.log.len();
    // The workspace has no binding of widgets: kcp answers 404.
    shard.feed(Input::ListedShare {
        key,
        generation,
        result: Err("widgets.example.io \"\" not found".into()),
    });
    let told = |shard: &Shard, from: usize| -> Vec<&'static str> {
        shard.log[from..]
            .iter()
            .filter_map(|e| match e {
                Effect::Event { reason, .. } => Some(*reason),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        told(&shard, from),
        Vec::<&str>::new(),
        "no Event before the discovery answers"
    );
    let at = shard.held.iter().position(|h| *h == cluster(3)).expect("held");
    shard.held.remove(at);
    shard.feed(Input::Discovered {
        cluster: cluster(3),
        result: Ok(Discovered {
            served: Vec::new(),
            failed_groups: Vec::new(),
            skipped_groups: vec!["apis.kcp.io".to_owned()],
        }),
    });
    // Well past the failed list's retry backoff (2 s).
    for _ in 0..50 {
        shard.tick(100);
    }
    assert!(
        !told(&shard, from).contains(&"ResourceUnavailable"),
        "the type is not served, not unavailable: {:?}",
        told(&shard, from)
    );
    assert!(
        shard
            .used
            .get(&cluster(3).to_string())
            .is_none_or(String::is_empty),
        "no count of a type the workspace does not serve: {:?}",
        shard.used.get(&cluster(3).to_string())
    );
    assert!(
        shard.lists.iter().all(|(_, _, c)| *c != cluster(3)),
        "no share of widgets listed again for it: {:?}",
        shard.lists
    );
}
