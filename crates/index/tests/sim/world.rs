//! One seeded run: the real Reconciler against the model apiserver, every delay and fault
//! drawn from the seed, invariants checked after every step.
//!
//! Time is simulated (milliseconds from the run's origin): the run jumps from one scheduled
//! event — a watch item, an answer, a tenant's request, a fault — or the reconciler's next
//! wakeup to the next. Watches deliver in order per watch, at independent speeds across
//! watches.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use lazyquota_index::{
    engine::Projected,
    keys::{ClusterName, GroupResource, Need, ObjectIds, QuotaKey},
    mutation::{self, Mutation},
    planner::Mode,
    reconciler::{
        ClusterEvent, Discovered, Effect, Failure, Input, Listed, Metric, Now, QuotaEvent, Reconciler,
        Settings, SharedKey, StatusWrite,
    },
    resolver::ServedResource,
    watches::{Item, ObjectEvent},
};
use lazyquota_quota::{FeatureGates, Interner, PodProjection, Time};

use crate::model::{GI, Obj, Res, Server, WIDGETS_KEY, milli, place, split};

mod checks;
mod effects;
mod kcp;
mod server;
mod tenants;
mod trace;
mod watches;

use kcp::Kcp;

use trace::{describe, describe_effect, describe_input, describe_quota};

/// Nanoseconds since the unix epoch of model millisecond `ms`.
fn wall_nanos(ms: u64) -> i128 {
    1_800_000_000_000_000_000 + i128::from(ms) * 1_000_000
}

/// What a run is given.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub seed: u64,
    pub mutation: Option<Mutation>,
    pub trace: bool,
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Report {
    pub steps: u64,
    pub fired: BTreeMap<&'static str, u64>,
    pub violation: Option<String>,
    pub trace: Vec<String>,
}

/// splitmix64: a few lines, no crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// In `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    fn percent(&mut self, p: u64) -> bool {
        self.next() % 100 < p
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            None
        } else {
            items.get(usize::try_from(self.next() % items.len() as u64).unwrap())
        }
    }
}

/// A watch the model serves: one of a cluster's own (by the reconciler's id), or on kcp a
/// shared wildcard watch of a type.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Wid {
    Own(u64),
    Shared(SharedKey),
}

#[derive(Debug)]
enum Ev {
    Tenant,
    /// Storage takes an admitted write (a create, or an update).
    Store(Obj),
    /// Storage refuses an admitted write after its charge (a name taken, a conflict).
    Refused(Obj),
    /// The kubelet removes a pod whose deletion grace is over.
    KubeletDelete(String, String),
    /// The controller is killed and started again: a new reconciler, nothing of the old one
    /// kept, while writes are in flight.
    Restart,
    /// An item of a watch; its objects name their place (`cluster|namespace`), made into
    /// what the apiserver sends when delivered.
    Item {
        id: Wid,
        generation: u64,
        item: Item,
    },
    Quota {
        generation: u64,
        event: QuotaEvent,
    },
    /// An answer to the reconciler of this epoch (one restarted since never gets it).
    Answer(u64, Input),
    /// A status write lands on the server (a write of a reconciler restarted since lands too;
    /// its answer goes nowhere).
    ServerWrite {
        write: StatusWrite,
        fault: WriteFault,
        epoch: u64,
    },
    ServeList {
        id: Wid,
        generation: u64,
    },
    ServeFill {
        input: Input,
        epoch: u64,
    },
    Resume {
        id: Wid,
        generation: u64,
        relist: bool,
    },
    Fault,
    QuotaRelist,
    /// Shadow mode: the model's KCM writes the namespace's quotas.
    Kcm(String),
    /// kcp: an event of the LogicalCluster watch.
    Cluster(ClusterEvent),
    /// kcp: a tenant creates several objects in a place at once.
    Burst(String),
    /// kcp: the list of one logical cluster's share of a shared watch runs.
    ServeShare {
        key: SharedKey,
        generation: u64,
        cluster: ClusterName,
        namespace: Option<String>,
    },
    /// A list proving a watch caught up with a quota runs on the server.
    ServeProofList {
        key: QuotaKey,
        resource: GroupResource,
        namespace: Option<String>,
        epoch: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteFault {
    None,
    ServerError,
    Hung { applied: bool },
}

/// The model side of one open watch.
#[derive(Debug)]
struct Watch {
    generation: u64,
    res: Res,
    /// The logical cluster watched; `None`: every one (a shared wildcard watch).
    cluster: Option<String>,
    namespace: Option<String>,
    need: Need,
    live: bool,
    delivered_rv: u64,
    last_at: u64,
}

impl Watch {
    fn sees(&self, obj: &Obj) -> bool {
        let (cluster, namespace) = split(&obj.namespace);
        obj.res == self.res
            && self.cluster.as_ref().is_none_or(|c| c == cluster)
            && self.namespace.as_ref().is_none_or(|ns| ns == namespace)
    }
}

/// The one cluster of a seed that is not kcp's.
pub const CLUSTER: &str = "default";
/// A quota key no evaluator claims (shadow seeds only).
pub const UNCLAIMED: &str = "example.com/widgets";
const NAMESPACES: [&str; 3] = ["ns-0", "ns-1", "ns-2"];
/// Steps of the phase with tenants and faults, at least.
pub const MIN_STEPS: u64 = 300;
/// After tenants and faults stop, every quota converges within this (two resyncs).
const LIVENESS_MS: u64 = 120_000;
const RESYNC: Duration = Duration::from_mins(1);

#[allow(clippy::struct_excessive_bools)] // independent facts about the model's state
pub struct World {
    rng: Rng,
    now: u64,
    origin: Instant,
    seq: u64,
    queue: BTreeMap<(u64, u64), Ev>,
    server: Server,
    rec: Reconciler,
    /// The reconciler's settings (a restarted one gets the same).
    settings: Settings,
    /// How many times the reconciler was restarted: answers to an earlier one go nowhere.
    epoch: u64,
    /// Restarted, and the new reconciler's first list of quotas is still to be served.
    restarted: bool,
    watches: BTreeMap<Wid, Watch>,
    next_generation: u64,
    quota_generation: u64,
    /// Between a 410 on the quota watch and its relist: the watch is down, so changes made
    /// meanwhile reach lazyquota only through the relist, as on a real server.
    quota_gap: bool,
    quota_last_at: u64,
    /// When the reconciler's view of quotas last jumped over versions (a relist of the quota
    /// watch: everywhere; a fresh read: in that place): what the jump raised is noted as
    /// charges at its newest version, certainly not counted yet, though some of its objects
    /// may be (too high, by design, for the charges' settling time).
    jumped: BTreeMap<String, u64>,
    relisted: u64,
    forbidden_until: BTreeMap<Res, u64>,
    /// Until then a list of the type succeeds but its watch cannot start (a kcp shard's 429
    /// while its watch cache starts; RBAC granting `list` but not `watch`).
    watch_refused_until: BTreeMap<Res, u64>,
    /// When each watch was opened within the last second (reopens without backoff show here).
    opened: BTreeMap<Wid, Vec<u64>>,
    /// The phase with tenants and faults ends at this time (and after [`MIN_STEPS`]).
    main_until: u64,
    main: bool,
    /// Shadow mode: lazyquota never writes; the model's KCM does.
    shadow: bool,
    interner: Interner,
    names: u64,
    /// The places tenants may use: every namespace of every logical cluster.
    places: Vec<String>,
    /// kcp seeds: the shard's logical clusters, bindings and shared watches.
    kcp: Option<Kcp>,
    /// Twin seeds: the second quota of a namespace takes the first one's keys, so a new quota
    /// often has a neighbour with its keys, settled or just changed.
    twins: bool,
    /// Wide seeds ([`is_wide_seed`]): Services, PVCs and scoped quotas besides ConfigMaps and
    /// Pods; updates that move objects in or out of a key or scope; writes refused after their
    /// charge.
    wide: bool,
    /// Wide seeds, most of them: a quarter of the writes take 0.5–5 s from admission to
    /// storage, longer than a watch takes to deliver and than the settling time.
    slow_storage: bool,
    report: Report,
}

/// Whether `seed` is a wide seed ([`World`]'s `wide`): three in twenty, by the seed alone,
/// none of them a kcp or twin seed.
pub fn is_wide_seed(seed: u64) -> bool {
    seed % 10 == 2 || seed % 20 == 15
}

/// Whether `seed` is a twin seed ([`World`]'s `twins`): two in ten, by the seed alone, none of
/// them a kcp seed or one of the soak's finds (so those run as they did).
pub fn is_twin_seed(seed: u64) -> bool {
    matches!(seed % 10, 6 | 8)
}

fn served(res: Res) -> ServedResource {
    let (resource, kind) = match res {
        Res::ConfigMaps => (GroupResource::core("configmaps"), "ConfigMap"),
        Res::Pods => (GroupResource::core("pods"), "Pod"),
        Res::Services => (GroupResource::core("services"), "Service"),
        Res::Pvcs => (
            GroupResource::core("persistentvolumeclaims"),
            "PersistentVolumeClaim",
        ),
        Res::Widgets => (GroupResource::new("example.io", "widgets"), "Widget"),
    };
    ServedResource {
        resource,
        version: "v1".into(),
        kind: kind.into(),
        namespaced: true,
        verbs: ["create", "delete", "get", "list", "patch", "update", "watch"]
            .map(String::from)
            .to_vec(),
    }
}

impl World {
    pub fn new(options: Options) -> Self {
        let mut rng = Rng(options.seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5EED);
        let threshold = if rng.percent(40) { 1 } else { 8 };
        let shadow = rng.percent(15);
        let origin = Instant::now();
        let mut settings = Settings {
            cluster: ClusterName::new(CLUSTER),
            mode: Mode::Lazy,
            resync_period: RESYNC,
            concurrency: 2,
            namespace_watch_threshold: threshold,
            shadow,
            ..Settings::default()
        };
        // Three seeds in ten model a kcp shard (drawn apart from the run's generator, so every
        // other seed runs as it did before kcp was modelled).
        let kcp = kcp::is_kcp_seed(options.seed).then(|| Kcp::new(options.seed, &mut rng, &mut settings));
        let places = match &kcp {
            Some(k) => k.places(),
            None => NAMESPACES.iter().map(|ns| place(CLUSTER, ns)).collect(),
        };
        let rec = Reconciler::new(
            settings.clone(),
            ObjectIds::new(std::hash::RandomState::new()),
            origin,
        );
        let main_until = rng.range(4_000, 10_000);
        let mut world = Self {
            rng,
            now: 0,
            origin,
            seq: 0,
            queue: BTreeMap::new(),
            server: Server::default(),
            rec,
            settings,
            epoch: 0,
            restarted: false,
            watches: BTreeMap::new(),
            next_generation: 0,
            quota_generation: 0,
            quota_gap: false,
            quota_last_at: 0,
            jumped: BTreeMap::new(),
            relisted: 0,
            forbidden_until: BTreeMap::new(),
            watch_refused_until: BTreeMap::new(),
            opened: BTreeMap::new(),
            main_until,
            main: true,
            shadow,
            interner: Interner::new(),
            names: 0,
            places,
            kcp,
            twins: is_twin_seed(options.seed),
            wide: is_wide_seed(options.seed),
            slow_storage: false,
            report: Report {
                trace: Vec::new(),
                ..Report::default()
            },
        };
        if world.wide {
            // Drawn apart from the run's generator: every other seed runs as it did.
            world.slow_storage = !options.seed.is_multiple_of(4);
        }
        for p in world.places.clone() {
            if world.rng.percent(80) {
                let hard = world.random_hard();
                world.server.put_quota(&p, "q", hard);
            }
        }
        world.trace_line(|| format!("threshold {threshold}, tenants until {main_until} ms"));
        if world.shadow {
            for p in world.places.clone() {
                world.kcm_soon(&p);
            }
        }
        world.start_kcp();
        world.schedule_quota_relist(1);
        world.at(5, Ev::Tenant);
        world.at(50, Ev::Fault);
        if world.wide && world.kcp.is_none() && !options.seed.is_multiple_of(3) {
            // Drawn apart from the run's generator, as the wide seeds are.
            let at = 1_000 + (options.seed.wrapping_mul(7_919) % 3_000);
            world.at(at, Ev::Restart);
        }
        world
    }

    fn random_hard(&mut self) -> BTreeMap<String, i64> {
        let mut hard = BTreeMap::new();
        if self.rng.percent(80) {
            hard.insert(
                "count/configmaps".into(),
                1000 * self.rng.range(2, 8).cast_signed(),
            );
        }
        if self.rng.percent(50) {
            hard.insert("pods".into(), 1000 * self.rng.range(1, 4).cast_signed());
        }
        if self.rng.percent(40) {
            hard.insert("requests.cpu".into(), 100 * self.rng.range(4, 15).cast_signed());
        }
        if self.kcp.is_some() && self.rng.percent(50) {
            hard.insert(WIDGETS_KEY.into(), 1000 * self.rng.range(2, 6).cast_signed());
        }
        if self.wide {
            for key in [
                "services",
                "services.loadbalancers",
                "services.nodeports",
                "persistentvolumeclaims",
                "requests.storage",
            ] {
                if self.rng.percent(35) {
                    let n = self.rng.range(2, 6).cast_signed();
                    let value = if key == "requests.storage" {
                        n * 2 * GI * 1000
                    } else {
                        n * 1000
                    };
                    hard.insert(key.into(), value);
                }
            }
        }
        if hard.is_empty() {
            hard.insert("count/configmaps".into(), 3000);
        }
        if self.shadow && self.rng.percent(50) {
            // A key no evaluator claims: shadow mode must call it unknown, never agreeing.
            hard.insert(UNCLAIMED.into(), 5000);
        }
        hard
    }

    fn fired(&mut self, kind: &'static str) {
        *self.report.fired.entry(kind).or_default() += 1;
        self.trace_line(|| format!("fault {kind}"));
    }

    fn trace_line(&mut self, line: impl FnOnce() -> String) {
        if self.report.violation.is_none() && TRACE.with(std::cell::Cell::get) {
            let line = format!("{:>7} ms  {}", self.now, line());
            self.report.trace.push(line);
        }
    }

    fn at(&mut self, delay: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((self.now + delay, self.seq), ev);
    }

    fn now(&self) -> Now {
        Now {
            instant: self.origin + Duration::from_millis(self.now),
            time: Time::from_unix_nanos(wall_nanos(self.now)),
        }
    }

    /// The wall time of model millisecond `ms`, as an object's timestamp carries it.
    fn wall(ms: u64) -> k8s_openapi::jiff::Timestamp {
        k8s_openapi::jiff::Timestamp::from_nanosecond(wall_nanos(ms)).expect("in range")
    }

    fn violation(&mut self, message: String) {
        if self.report.violation.is_none() {
            self.report
                .trace
                .push(format!("{:>7} ms  VIOLATION {message}", self.now));
            self.report.violation = Some(message);
        }
    }

    /// Runs to the end: the phase with tenants and faults, then quiescence, then the final
    /// checks.
    pub fn run(mut self) -> Report {
        let deadline = |w: &Self| w.main_until + LIVENESS_MS;
        loop {
            if self.report.violation.is_some() {
                break;
            }
            if self.main && self.now >= self.main_until && self.report.steps >= MIN_STEPS {
                self.end_main();
            }
            let wakeup = self
                .rec
                .next_wakeup(self.now().instant)
                .map(|at| u64::try_from(at.saturating_duration_since(self.origin).as_millis()).unwrap());
            let next_event = self.queue.keys().next().map(|(t, _)| *t);
            let next = match (wakeup, next_event) {
                (Some(w), Some(e)) => w.min(e),
                (Some(w), None) => w,
                (None, Some(e)) => e,
                (None, None) => break,
            };
            if !self.main && next > deadline(&self) {
                break;
            }
            self.now = self.now.max(next);
            self.server.now_ms = self.now;
            self.report.steps += 1;
            if next_event == Some(next) && wakeup.is_none_or(|w| w >= next) {
                let key = *self.queue.keys().next().unwrap();
                let ev = self.queue.remove(&key).unwrap();
                self.step(ev);
            } else {
                self.trace_line(|| "tick".into());
                self.rec.tick(self.now());
            }
            self.carry_out();
            if !self.main && self.now > deadline(&self) {
                break;
            }
        }
        if self.report.violation.is_none() {
            self.final_checks();
        }
        self.report
    }

    /// The controller is killed and started again: a new reconciler starts from the quota
    /// watch's list, its watches and requests are the new one's, and what the old one had
    /// asked is answered to nobody.
    fn restart(&mut self) {
        if !self.main {
            return;
        }
        self.fired("restart");
        self.restarted = true;
        self.epoch += 1;
        self.rec = Reconciler::new(
            self.settings.clone(),
            ObjectIds::new(std::hash::RandomState::new()),
            self.now().instant,
        );
        self.watches.clear();
        self.opened.clear();
        self.quota_generation += 1;
        self.quota_gap = true;
        self.quota_last_at = self.now;
        let delay = self.rng.range(10, 200);
        self.schedule_quota_relist(delay);
    }

    fn end_main(&mut self) {
        self.main = false;
        self.trace_line(|| "tenants and faults stop".into());
        let lifted: Vec<Res> = self.forbidden_until.keys().copied().collect();
        for res in lifted {
            self.forbidden_until.insert(res, self.now);
        }
        self.watch_refused_until.clear();
        self.end_kcp_faults();
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Tenant => self.tenant(),
            Ev::Store(obj) if self.cluster_gone(&obj.namespace) => {
                // Its logical cluster was deleted while the create was in flight.
                self.server.refuse(&obj);
            }
            Ev::Store(mut obj) => match self.server.store(obj.clone()) {
                Some(rv) => {
                    self.trace_line(|| format!("stored {}/{} at {rv}", obj.namespace, obj.name));
                    obj.rv = rv;
                    self.object_changed(&obj, rv, false);
                    let ns = obj.namespace.clone();
                    self.kcm_soon(&ns);
                }
                None => self.trace_line(|| {
                    format!(
                        "update of {}/{} refused: deleted meanwhile",
                        obj.namespace, obj.name
                    )
                }),
            },
            Ev::Refused(obj) => {
                self.fired("refused_after_charge");
                self.trace_line(|| {
                    format!("write of {}/{} refused after its charge", obj.namespace, obj.name)
                });
                self.server.refuse(&obj);
                // KCM takes the charge back at its next sync.
                let ns = obj.namespace.clone();
                self.kcm_soon(&ns);
            }
            Ev::Restart => self.restart(),
            Ev::KubeletDelete(ns, name) => {
                if let Some((rv, obj)) = self.server.delete(Res::Pods, &ns, &name) {
                    self.trace_line(|| format!("kubelet deleted {ns}/{name}"));
                    self.object_changed(&obj, rv, true);
                    self.kcm_soon(&ns);
                }
            }
            Ev::Item { id, generation, item } => {
                if self.watches.get(&id).is_some_and(|w| w.generation == generation) {
                    self.trace_line(|| format!("watch {id:?} ← {}", describe(&item)));
                    if let Item::Apply(o) | Item::Delete(o) | Item::InitApply(o) = &item
                        && let (Some(res), Some(rv)) = (self.watches.get(&id).map(|w| w.res), o.revision)
                    {
                        self.server.delivered(&o.namespace, res, rv);
                    }
                    let input = match id {
                        Wid::Own(id) => Input::Watch {
                            id,
                            item: watches::as_served(item),
                        },
                        Wid::Shared(key) => Input::Shared {
                            key,
                            event: watches::as_shared(item),
                        },
                    };
                    self.rec.handle(input, self.now());
                }
            }
            Ev::Quota { generation, event } => {
                if generation == self.quota_generation {
                    if matches!(event, QuotaEvent::Relisted(_)) {
                        self.relisted = self.now;
                    }
                    self.trace_line(|| format!("quota watch ← {}", describe_quota(&event)));
                    self.rec.handle(Input::Quota(event), self.now());
                    let origin = self.origin;
                    let wakeup = self
                        .rec
                        .next_wakeup(self.now().instant)
                        .map(|w| w.saturating_duration_since(origin).as_millis());
                    self.trace_line(|| format!("  next wakeup {wakeup:?}"));
                }
            }
            Ev::Answer(epoch, _) if epoch != self.epoch => {}
            Ev::Answer(_, input) => {
                self.trace_line(|| format!("answer {}", describe_input(&input)));
                if let Input::Read { key, result: Ok(_) } = &input {
                    self.jumped
                        .insert(place(key.cluster.as_str(), &key.namespace), self.now);
                }
                self.rec.handle(input, self.now());
            }
            Ev::ServerWrite { write, fault, epoch } => self.server_write(write, fault, epoch),
            Ev::ServeList { id, generation } => self.serve_list(&id, generation),
            Ev::ServeFill { epoch, .. } | Ev::ServeProofList { epoch, .. } if epoch != self.epoch => {}
            Ev::ServeFill { input, .. } => self.serve_fill(input),
            Ev::Resume {
                id,
                generation,
                relist,
            } => self.resume(&id, generation, relist),
            Ev::Fault => self.fault(),
            Ev::QuotaRelist => self.quota_relist(),
            Ev::Kcm(ns) => self.kcm(&ns),
            Ev::Cluster(event) => {
                self.trace_line(|| format!("logical cluster watch ← {event:?}"));
                self.rec.handle(Input::LogicalCluster(event), self.now());
            }
            Ev::Burst(ns) => self.burst(&ns),
            Ev::ServeShare {
                key,
                generation,
                cluster,
                namespace,
            } => self.serve_share(key, generation, &cluster, namespace.as_deref()),
            Ev::ServeProofList {
                key,
                resource,
                namespace,
                ..
            } => self.serve_proof_list(key, resource, namespace.as_deref()),
        }
    }
}

thread_local! {
    /// Whether this thread's runs keep a trace (a replay, or a failing seed run again).
    static TRACE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs one seed.
pub fn run(options: Options) -> Report {
    TRACE.with(|t| t.set(options.trace));
    mutation::set(options.mutation);
    let report = World::new(options).run();
    mutation::set(None);
    TRACE.with(|t| t.set(false));
    report
}
