//! The model apiserver: objects, quotas and one global resourceVersion like etcd's, quota
//! admission that charges `status.used` before a write is stored (by the keys of the quota's
//! `status.hard`, under its scopes, as upstream's `checkRequest`: a create in whole, an update
//! by what it grows), and the truth every invariant is checked against — computed here from
//! the model's own objects and their history, never through the Engine or its stores.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{ResourceQuota, ResourceQuotaSpec, ResourceQuotaStatus},
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
};
use lazyquota_index::reconciler::CLUSTER_ANNOTATION;

/// The resources tenants create: built-in ConfigMaps, Pods, Services and PVCs, and on kcp
/// Widgets, a type a logical cluster serves once its APIBinding is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Res {
    ConfigMaps,
    Pods,
    Services,
    Pvcs,
    Widgets,
}

/// The quota key counting widgets.
pub const WIDGETS_KEY: &str = "count/widgets.example.io";

/// A pod's deletion grace period: it counts until this long after its deletion began, then
/// the kubelet's delete removes it.
pub const GRACE_MS: u64 = 2_000;

/// Bytes in a Gi, for PVC storage.
pub const GI: i64 = 1 << 30;

impl Res {
    pub fn of(resource: &str) -> Option<Res> {
        match resource {
            "configmaps" => Some(Res::ConfigMaps),
            "pods" => Some(Res::Pods),
            "services" => Some(Res::Services),
            "persistentvolumeclaims" => Some(Res::Pvcs),
            "widgets" => Some(Res::Widgets),
            _ => None,
        }
    }

    /// The resource a quota key is computed from (`None`: no evaluator claims it).
    pub fn of_key(key: &str) -> Option<Res> {
        match key {
            "count/configmaps" => Some(Res::ConfigMaps),
            "pods" | "count/pods" | "requests.cpu" => Some(Res::Pods),
            "services" | "count/services" | "services.nodeports" | "services.loadbalancers" => {
                Some(Res::Services)
            }
            "persistentvolumeclaims" | "count/persistentvolumeclaims" | "requests.storage" => Some(Res::Pvcs),
            WIDGETS_KEY => Some(Res::Widgets),
            _ => None,
        }
    }
}

/// A quota scope the model's scoped quotas use (pods only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Pods with `activeDeadlineSeconds`.
    Terminating,
    /// Pods without it.
    NotTerminating,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Terminating => "Terminating",
            Scope::NotTerminating => "NotTerminating",
        }
    }
}

/// A Service's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SvcType {
    ClusterIp,
    NodePort,
    LoadBalancer,
}

/// Where an object or quota lives: a namespace of a logical cluster, written `cluster|namespace`
/// (as the reconciler names a quota: `cluster|namespace/name`). Admission and the truth are
/// per place, as kcp's quota admission is per logical cluster's namespace.
pub fn place(cluster: &str, namespace: &str) -> String {
    format!("{cluster}|{namespace}")
}

/// A place's logical cluster and namespace.
pub fn split(place: &str) -> (&str, &str) {
    place.split_once('|').expect("a place is cluster|namespace")
}

/// One object: a ConfigMap, a Widget, a pod, a Service or a PVC, as stored (or to be stored).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Obj {
    pub res: Res,
    /// Its place ([`place`]).
    pub namespace: String,
    pub name: String,
    /// Pods: the CPU its one container requests (and runs with: a resize is applied at once).
    pub cpu_m: i64,
    /// Pods: `activeDeadlineSeconds` is set (the Terminating scope).
    pub deadline: bool,
    /// Pods: in a terminal phase (Succeeded).
    pub terminal: bool,
    /// Pods: when (model milliseconds) its deletion began; it counts for [`GRACE_MS`] more.
    pub deleting_ms: Option<u64>,
    /// Services: the type.
    pub svc: SvcType,
    /// PVCs: the storage requested, in Gi.
    pub storage_gi: i64,
    /// The resourceVersion it was stored at (0 until then).
    pub rv: u64,
    /// The quotas (by uid) admission charged for its latest write (its create, or an update
    /// that grew it), each with the resourceVersion of the charge.
    pub charged: Vec<(String, u64)>,
    /// The (quota uid, key) pairs its latest write was charged for.
    pub charged_for: Vec<(String, &'static str)>,
    /// The (quota uid, key) pairs admission charged it for whenever it grew: the quota existed,
    /// had the key in its `status.hard` and the object in its scope. An object missing here for
    /// a pair (admitted before the quota, or before the key was enforced, or moved into the
    /// quota's scope by an update admission does not check) is the one shortfall a raise may
    /// have ([`Server::truth_at`]).
    pub enforced: Vec<(String, &'static str)>,
    /// The resourceVersion of its latest change that made it count more (its create included).
    pub grew_at: u64,
}

impl Obj {
    /// A new object of `res` at `place`, named `name`, with nothing stored yet.
    pub fn new(res: Res, place: &str, name: String) -> Self {
        Obj {
            res,
            namespace: place.to_owned(),
            name,
            cpu_m: 0,
            deadline: false,
            terminal: false,
            deleting_ms: None,
            svc: SvcType::ClusterIp,
            storage_gi: 0,
            rv: 0,
            charged: Vec::new(),
            charged_for: Vec::new(),
            enforced: Vec::new(),
            grew_at: 0,
        }
    }

    fn matches(&self, scopes: &[Scope]) -> bool {
        scopes.iter().all(|s| match s {
            Scope::Terminating => self.res == Res::Pods && self.deadline,
            Scope::NotTerminating => self.res == Res::Pods && !self.deadline,
        })
    }

    /// Whether a pod counts for compute keys and `pods` at `now_ms` (upstream's `QuotaV1Pod`).
    fn counts(&self, now_ms: u64) -> bool {
        !self.terminal && self.deleting_ms.is_none_or(|d| now_ms <= d + GRACE_MS)
    }

    /// What this object adds to each quota key of a quota with `scopes` at `now_ms`, in
    /// milli-units (object-count, service and PVC keys count nothing under any scope).
    pub fn usage(&self, scopes: &[Scope], now_ms: u64) -> Vec<(&'static str, i64)> {
        if !self.matches(scopes) {
            return Vec::new();
        }
        match self.res {
            Res::ConfigMaps => vec![("count/configmaps", 1000)],
            Res::Widgets => vec![(WIDGETS_KEY, 1000)],
            Res::Pods if self.counts(now_ms) => {
                vec![("count/pods", 1000), ("pods", 1000), ("requests.cpu", self.cpu_m)]
            }
            Res::Pods => vec![("count/pods", 1000)],
            Res::Services => {
                let ports = if self.svc == SvcType::ClusterIp { 0 } else { 1000 };
                let lbs = if self.svc == SvcType::LoadBalancer {
                    1000
                } else {
                    0
                };
                vec![
                    ("count/services", 1000),
                    ("services", 1000),
                    ("services.nodeports", ports),
                    ("services.loadbalancers", lbs),
                ]
            }
            Res::Pvcs => vec![
                ("count/persistentvolumeclaims", 1000),
                ("persistentvolumeclaims", 1000),
                ("requests.storage", self.storage_gi * GI * 1000),
            ],
        }
    }

    /// What it adds to `key` under `scopes`.
    pub fn usage_of(&self, key: &str, scopes: &[Scope], now_ms: u64) -> i64 {
        self.usage(scopes, now_ms)
            .into_iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| v)
            .sum()
    }

    fn enforced_for(&self, quota: &str, key: &str) -> bool {
        self.enforced.iter().any(|(q, k)| q == quota && *k == key)
    }
}

/// A quota as the model stores it.
#[derive(Clone, Debug)]
pub struct Quota {
    /// Its place ([`place`]).
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub rv: u64,
    /// The resourceVersion it was created at.
    pub created: u64,
    /// `spec.hard`, in milli-units.
    pub hard: BTreeMap<String, i64>,
    /// `spec.scopes`.
    pub scopes: Vec<Scope>,
    /// `status.hard` as last written (strings as written).
    pub status_hard: Option<BTreeMap<String, String>>,
    /// `status.used` as last written or charged (strings).
    pub used: Option<BTreeMap<String, String>>,
}

/// A quantity string as milli-units: `"3"`, `"1500m"`, `"1.5"`, `"3Gi"`. `None` for anything
/// else — the reconciler never writes another form for these keys, so that is a finding too.
pub fn milli(s: &str) -> Option<i64> {
    if let Some(gi) = s.strip_suffix("Gi") {
        return gi.parse::<i64>().ok().map(|n| n * GI * 1000);
    }
    if let Some(m) = s.strip_suffix('m') {
        return m.parse().ok();
    }
    match s.split_once('.') {
        Some((whole, frac)) if frac.len() <= 3 && !frac.is_empty() => {
            let whole: i64 = whole.parse().ok()?;
            let frac: i64 = format!("{frac:0<3}").parse().ok()?;
            Some(whole * 1000 + frac)
        }
        Some(_) => None,
        None => s.parse::<i64>().ok().map(|n| n * 1000),
    }
}

/// A value in milli-units written the way `spec.hard` says it: counts whole, cpu in `m`,
/// storage in `Gi`.
pub fn quantity_string(key: &str, milli: i64) -> String {
    match key {
        "requests.cpu" => format!("{milli}m"),
        "requests.storage" => format!("{}Gi", milli / 1000 / GI),
        _ => (milli / 1000).to_string(),
    }
}

impl Quota {
    /// The quota as the apiserver serves it.
    pub fn to_k8s(&self) -> ResourceQuota {
        let quantities = |m: &BTreeMap<String, String>| -> BTreeMap<String, Quantity> {
            m.iter().map(|(k, v)| (k.clone(), Quantity(v.clone()))).collect()
        };
        let hard = self
            .hard
            .iter()
            .map(|(k, v)| (k.clone(), Quantity(quantity_string(k, *v))))
            .collect();
        let (cluster, namespace) = split(&self.namespace);
        // On a kcp shard a wildcard watch names each quota's logical cluster so.
        let annotations = (cluster != crate::world::CLUSTER)
            .then(|| BTreeMap::from([(CLUSTER_ANNOTATION.to_owned(), cluster.to_owned())]));
        ResourceQuota {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(namespace.to_owned()),
                uid: Some(self.uid.clone()),
                resource_version: Some(self.rv.to_string()),
                annotations,
                ..ObjectMeta::default()
            },
            spec: Some(ResourceQuotaSpec {
                hard: Some(hard),
                scopes: (!self.scopes.is_empty())
                    .then(|| self.scopes.iter().map(|s| s.name().to_owned()).collect()),
                ..ResourceQuotaSpec::default()
            }),
            status: Some(ResourceQuotaStatus {
                hard: self.status_hard.as_ref().map(quantities),
                used: self.used.as_ref().map(quantities),
            }),
        }
    }
}

/// A change, logged at its resourceVersion (what a watch resumed from an older one replays).
#[derive(Clone, Debug)]
pub enum Change {
    /// An object was stored (`Some`) or deleted (`None`, with what it was).
    Object { obj: Obj, deleted: bool },
}

/// A write admission let through and storage has not taken yet: a create (`prev: None`) or
/// an update of `prev` to `obj`.
#[derive(Clone, Debug)]
pub struct Pending {
    pub obj: Obj,
    pub prev: Option<Obj>,
}

impl Pending {
    /// What its charge to `quota` for `key` is for: what it makes the object count more, if
    /// admission charged it by `at`.
    fn charged_by(&self, quota: &str, key: &str, scopes: &[Scope], at: u64, now_ms: u64) -> i64 {
        let charged = self.obj.charged.iter().any(|(q, rv)| q == quota && *rv <= at);
        if !charged || !self.obj.charged_for.iter().any(|(q, k)| q == quota && *k == key) {
            return 0;
        }
        let before = self.prev.as_ref().map_or(0, |p| p.usage_of(key, scopes, now_ms));
        (self.obj.usage_of(key, scopes, now_ms) - before).max(0)
    }
}

/// An object's identity: its resource, place and name.
pub type ObjectId = (Res, String, String);

/// What a write makes an object count more, per quota (its namespace and name).
type Growths = Vec<((String, String), Vec<(&'static str, i64)>)>;

/// The model apiserver's state.
#[derive(Debug, Default)]
pub struct Server {
    pub rv: u64,
    /// The model's clock (milliseconds), for pods' deletion grace.
    pub now_ms: u64,
    pub objects: BTreeMap<(Res, String, String), Obj>,
    pub quotas: BTreeMap<(String, String), Quota>,
    /// Admitted, not stored yet.
    pub in_flight: Vec<Pending>,
    /// Deleted objects, each with the resourceVersion of its deletion.
    pub deleted: Vec<(Obj, u64)>,
    /// Every version each object was stored at (`None`: its deletion).
    pub history: BTreeMap<ObjectId, Vec<(u64, Option<Obj>)>>,
    pub log: Vec<(u64, Change)>,
    /// Per (quota uid, key): what objects admission did not charge for it counted when they came
    /// in while a charged write of it was in flight, until none is ([`Server::standin_allowance`]).
    pub standin_debt: BTreeMap<(String, String), i64>,
    /// Per debt whose charged writes have all landed: the resourceVersion they had by then.
    debt_drained: BTreeMap<(String, String), u64>,
    next_uid: u64,
}

/// Why admission refused a write.
pub type Refusal = &'static str;

impl Server {
    pub fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// The lowest that object `key` counted for `key_name` under `scopes` from `at` on: in its
    /// version stored at or before `at` (0 if it did not exist then) and in every version
    /// stored since (0 while deleted). A dip after `at` followed by a rise admission did not
    /// charge is a change after `at` no write conditioned on it can know of (seed 60,392: a
    /// Service's type changed away and back).
    fn lowest_since(&self, key: &ObjectId, at: u64, key_name: &str, scopes: &[Scope], now: u64) -> i64 {
        let Some(versions) = self.history.get(key) else {
            return 0;
        };
        let first = versions.iter().rposition(|(rv, _)| *rv <= at);
        let Some(first) = first else { return 0 };
        versions[first..]
            .iter()
            .map(|(_, o)| o.as_ref().map_or(0, |o| o.usage_of(key_name, scopes, now)))
            .min()
            .unwrap_or(0)
    }

    /// The true usage of `key` for quota `quota` of `namespace`, for a status write
    /// conditioned on resourceVersion `at` and applied now: each object that exists now, at
    /// the lowest it counted from `at` on ([`Server::lowest_since`]: what changed after `at`
    /// need not be known to the write, and what went down since need not be counted), plus
    /// what admission charged to this quota by `at` for writes not stored yet (the write must
    /// not take those charges back). An object admitted without a charge to this quota (before
    /// it existed, or before its `status.hard` had the key) and stored after `at` is not
    /// counted: no write conditioned on `at` could know of it.
    /// With `enforced_only`, only objects admission charged to `quota` for `key` whenever they
    /// grew are counted.
    pub fn truth_at(&self, namespace: &str, quota: &str, key: &str, at: u64, enforced_only: bool) -> i64 {
        let scopes = self.scopes_of(namespace, quota);
        let quota = &self.uid_of(namespace, quota);
        let now = self.now_ms;
        let mut sum = 0;
        for (id, obj) in self.objects.iter().filter(|(_, o)| o.namespace == namespace) {
            if enforced_only && !obj.enforced_for(quota, key) {
                continue;
            }
            sum += self.lowest_since(id, at, key, &scopes, now);
        }
        for pending in self.in_flight.iter().filter(|p| p.obj.namespace == namespace) {
            // An update of an object deleted meanwhile never lands.
            let gone = pending.prev.is_some()
                && !self.objects.contains_key(&(
                    pending.obj.res,
                    pending.obj.namespace.clone(),
                    pending.obj.name.clone(),
                ));
            if !gone {
                sum += pending.charged_by(quota, key, &scopes, at, now);
            }
        }
        sum
    }

    /// How far a write may fall below [`Server::truth_at`] because objects admission did not
    /// charge to `quota` for `key` came in (created, or moved into its scope) while charged
    /// writes were in flight, and paid for those charges in their place
    /// (`lazyquota_index::charges`): what they counted, from their arrival until no charged
    /// write of that quota and key is in flight any more ([`Server::standin_debt`]).
    pub fn standin_allowance(&self, namespace: &str, quota: &str, key: &str) -> i64 {
        let uid = self.uid_of(namespace, quota);
        self.standin_debt
            .get(&(uid, key.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// Whether a charged write for `key` of the quota `uid` is in flight, charged before `rv`.
    fn charged_in_flight(&self, uid: &str, key: &str, before: u64) -> bool {
        self.in_flight.iter().any(|p| {
            p.obj.charged_for.iter().any(|(q, k)| q == uid && *k == key)
                && p.obj.charged.iter().any(|(q, c)| q == uid && *c < before)
        })
    }

    /// Books `obj`, stored at `rv` over `old`, into the stand-in debts: what it grew by that
    /// admission did not charge, for each quota with a charged write of that key in flight.
    fn book_standins(&mut self, obj: &Obj, old: Option<&Obj>, rv: u64) {
        let now = self.now_ms;
        let quotas: Vec<(String, Vec<Scope>)> = self
            .quotas
            .values()
            .filter(|q| q.namespace == obj.namespace)
            .map(|q| (q.uid.clone(), q.scopes.clone()))
            .collect();
        for (uid, scopes) in quotas {
            for (key, value) in obj.usage(&scopes, now) {
                let grew = value - old.map_or(0, |o| o.usage_of(key, &scopes, now));
                let charged = obj.charged_for.iter().any(|(q, k)| *q == uid && *k == key);
                if grew > 0 && !charged && self.charged_in_flight(&uid, key, rv) {
                    *self
                        .standin_debt
                        .entry((uid.clone(), key.to_owned()))
                        .or_default() += grew;
                }
            }
        }
    }

    /// The restarted controller's first list of quotas is taken: what it first sees of a quota
    /// carries the charges in flight,
    /// until its store says how much of the stored value the objects do not explain — and
    /// objects admission did not charge for a key explain some of it in their place: for each
    /// quota and key with a charged write in flight, they become a debt as stand-ins do.
    pub fn restarted(&mut self) {
        let now = self.now_ms;
        let quotas: Vec<(String, String, Vec<Scope>)> = self
            .quotas
            .values()
            .map(|q| (q.uid.clone(), q.namespace.clone(), q.scopes.clone()))
            .collect();
        for (uid, namespace, scopes) in quotas {
            for key in self
                .objects
                .values()
                .filter(|o| o.namespace == namespace)
                .flat_map(|o| o.usage(&scopes, now))
                .map(|(k, _)| k)
                .collect::<std::collections::BTreeSet<_>>()
            {
                if !self.charged_in_flight(&uid, key, u64::MAX) {
                    continue;
                }
                let uncharged: i64 = self
                    .objects
                    .values()
                    .filter(|o| o.namespace == namespace && !o.enforced_for(&uid, key))
                    .map(|o| o.usage_of(key, &scopes, now))
                    .sum();
                if uncharged > 0 {
                    *self
                        .standin_debt
                        .entry((uid.clone(), key.to_owned()))
                        .or_default() += uncharged;
                    self.debt_drained.remove(&(uid.clone(), key.to_owned()));
                }
            }
        }
    }

    /// Marks the debts of quotas and keys no charged write is in flight for any more as
    /// drained at the resourceVersion now: they go once a watch has delivered that far
    /// ([`Server::delivered`]), when lazyquota holds the objects that were in flight.
    fn settle_standins(&mut self) {
        let debts: Vec<(String, String)> = self.standin_debt.keys().cloned().collect();
        for (uid, key) in debts {
            if self.charged_in_flight(&uid, &key, u64::MAX) {
                self.debt_drained.remove(&(uid, key));
            } else {
                let rv = self.rv;
                self.debt_drained.entry((uid, key)).or_insert(rv);
            }
        }
    }

    /// A watch delivered to lazyquota an event of `res` in `namespace` at `rv`: debts drained
    /// by then go.
    pub fn delivered(&mut self, namespace: &str, res: Res, rv: u64) {
        let uids: Vec<String> = self
            .quotas
            .values()
            .filter(|q| q.namespace == namespace)
            .map(|q| q.uid.clone())
            .collect();
        let gone: Vec<(String, String)> = self
            .debt_drained
            .iter()
            .filter(|((uid, key), drained)| {
                uids.contains(uid) && Res::of_key(key) == Some(res) && **drained <= rv
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.debt_drained.remove(&k);
            self.standin_debt.remove(&k);
        }
    }

    /// A quota's uid: charges and the pairs objects are enforced for name it, so that a quota
    /// deleted and created again under its name is another one.
    fn uid_of(&self, namespace: &str, quota: &str) -> String {
        self.quotas
            .get(&(namespace.to_owned(), quota.to_owned()))
            .map(|q| q.uid.clone())
            .unwrap_or_default()
    }

    fn scopes_of(&self, namespace: &str, quota: &str) -> Vec<Scope> {
        self.quotas
            .get(&(namespace.to_owned(), quota.to_owned()))
            .map(|q| q.scopes.clone())
            .unwrap_or_default()
    }

    /// What `key` of a quota with `scopes` would count if every object of `namespace` that
    /// existed at any moment after `since` (stored, admitted and on its way, or deleted after
    /// it) existed at once, at the most it counted: no computation from the objects since then
    /// can come to more.
    pub fn ever_since(&self, namespace: &str, key: &str, scopes: &[Scope], since: u64) -> i64 {
        let now = self.now_ms;
        let mut most: BTreeMap<(Res, String), i64> = BTreeMap::new();
        let mut count = |o: &Obj, v: i64| {
            let e = most.entry((o.res, o.name.clone())).or_default();
            *e = (*e).max(v);
        };
        for (_, versions) in self.history.iter().filter(|(id, _)| id.1 == namespace) {
            let alive_since = versions
                .iter()
                .enumerate()
                .filter(|(i, (rv, _))| {
                    *rv > since || versions.get(i + 1).is_none_or(|(next, _)| *next > since)
                })
                .filter_map(|(_, (_, o))| o.as_ref());
            for o in alive_since {
                // A pod past its grace counted until then: at most what it counts at its best.
                let v = o.usage_of(key, scopes, 0).max(o.usage_of(key, scopes, now));
                count(o, v);
            }
        }
        for p in self.in_flight.iter().filter(|p| p.obj.namespace == namespace) {
            count(&p.obj, p.obj.usage_of(key, scopes, 0));
        }
        most.values().sum()
    }

    /// What `key` of `quota` counts now (stored objects).
    pub fn stored(&self, namespace: &str, quota: &str, key: &str) -> i64 {
        let scopes = self.scopes_of(namespace, quota);
        self.stored_under(namespace, key, &scopes)
    }

    /// What `key` counts in `namespace` now under `scopes` (stored objects).
    pub fn stored_under(&self, namespace: &str, key: &str, scopes: &[Scope]) -> i64 {
        self.objects
            .values()
            .filter(|o| o.namespace == namespace)
            .map(|o| o.usage_of(key, scopes, self.now_ms))
            .sum()
    }

    /// Creates (or replaces) a quota; returns its new resourceVersion.
    pub fn put_quota(&mut self, namespace: &str, name: &str, hard: BTreeMap<String, i64>) -> u64 {
        self.put_scoped_quota(namespace, name, hard, Vec::new())
    }

    /// Creates (or replaces) a quota with `scopes` (kept as they are on a replaced one: scopes
    /// are immutable).
    pub fn put_scoped_quota(
        &mut self,
        namespace: &str,
        name: &str,
        hard: BTreeMap<String, i64>,
        scopes: Vec<Scope>,
    ) -> u64 {
        let rv = self.bump();
        let key = (namespace.to_owned(), name.to_owned());
        if let Some(q) = self.quotas.get_mut(&key) {
            q.hard = hard;
            q.rv = rv;
        } else {
            self.next_uid += 1;
            let uid = format!("uid-{}", self.next_uid);
            self.quotas.insert(
                key,
                Quota {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    uid,
                    rv,
                    created: rv,
                    hard,
                    scopes,
                    status_hard: None,
                    used: None,
                },
            );
        }
        rv
    }

    /// Quota admission for a create of `obj` (`prev: None`) or an update of `prev` to `obj`:
    /// `Err` names why it is refused; `Ok` charged every quota of the namespace what the write
    /// makes the object count more for the keys of its `status.hard` (each a
    /// resourceVersion-conditional update, here one step) and returns the quotas charged. An
    /// update admission does not check (`checked: false`: a pod's deadline, phase or deletion,
    /// which upstream's pod evaluator does not handle) charges nothing and refuses nothing.
    pub fn admit(
        &mut self,
        obj: &mut Obj,
        prev: Option<&Obj>,
        checked: bool,
    ) -> Result<Vec<(String, String)>, Refusal> {
        let now = self.now_ms;
        // What the write makes the object count more, per quota of the namespace (upstream
        // charges an update's growth, key by key, never a decrease).
        let growths: Growths = self
            .quotas
            .iter()
            .filter(|((ns, _), _)| *ns == obj.namespace)
            .map(|(key, q)| {
                let grown = obj
                    .usage(&q.scopes, now)
                    .into_iter()
                    .map(|(k, v)| (k, v - prev.map_or(0, |p| p.usage_of(k, &q.scopes, now))))
                    .filter(|(_, by)| *by > 0)
                    .collect();
                (key.clone(), grown)
            })
            .collect();
        obj.charged.clear();
        obj.charged_for.clear();
        let status_hard = |q: &Quota, k: &str| q.status_hard.as_ref().and_then(|h| h.get(k)).cloned();
        let uid = |key: &(String, String)| self.quotas[key].uid.clone();
        if !checked {
            // Uncharged growth: the object is no longer covered by charges for those keys.
            for (key, grown) in &growths {
                let uid = uid(key);
                for (k, _) in grown {
                    obj.enforced.retain(|(q, kk)| !(*q == uid && kk == k));
                }
            }
            return Ok(Vec::new());
        }
        // As upstream's admission: a quota constrains and is charged for the keys of its
        // `status.hard` (what its controller last wrote), not of its `spec.hard`.
        for (key, grown) in &growths {
            let q = &self.quotas[key];
            for (k, by) in grown {
                let Some(hard) = status_hard(q, k) else { continue };
                let Some(hard) = milli(&hard) else {
                    return Err("hard unparseable");
                };
                let Some(used) = q.used.as_ref().and_then(|u| u.get(*k)) else {
                    return Err("status unknown");
                };
                let Some(used) = milli(used) else {
                    return Err("status unparseable");
                };
                if used + by > hard {
                    return Err("exceeded");
                }
            }
        }
        if prev.is_none() {
            // Charged whole: every key the quota enforces covers the object from now on.
            for (key, _) in &growths {
                let q = &self.quotas[key];
                for (k, _) in obj.usage(&q.scopes, now) {
                    if status_hard(q, k).is_some() {
                        obj.enforced.push((q.uid.clone(), k));
                    }
                }
            }
        }
        let mut charged_quotas = Vec::new();
        for (key, grown) in growths {
            let rv = self.bump();
            let q = self.quotas.get_mut(&key).expect("listed");
            let uid = q.uid.clone();
            let mut any = false;
            for (k, by) in grown {
                if status_hard(q, k).is_some() {
                    let used = q.used.as_mut().expect("checked");
                    let now = milli(&used[k]).expect("checked") + by;
                    used.insert(k.to_owned(), quantity_string(k, now));
                    obj.charged_for.push((uid.clone(), k));
                    any = true;
                } else {
                    // Grown where the quota does not enforce the key: not covered by charges.
                    obj.enforced.retain(|(qq, kk)| !(*qq == uid && *kk == k));
                }
            }
            if any {
                q.rv = rv;
                obj.charged.push((uid.clone(), rv));
                charged_quotas.push(key);
            }
        }
        Ok(charged_quotas)
    }

    /// `key` left the `status.hard` of quota `uid`: admission no longer charges it, and a key
    /// added back later is a new one — nothing charged before covers an object for it.
    pub fn key_dropped(&mut self, uid: &str, key: &str) {
        let strip = |o: &mut Obj| {
            o.enforced.retain(|(q, k)| !(q == uid && *k == key));
            o.charged_for.retain(|(q, k)| !(q == uid && *k == key));
        };
        self.objects.values_mut().for_each(strip);
        self.in_flight.iter_mut().for_each(|p| strip(&mut p.obj));
    }

    /// Records an admitted write as in flight.
    pub fn admitted(&mut self, obj: &Obj, prev: Option<&Obj>) {
        self.in_flight.push(Pending {
            obj: obj.clone(),
            prev: prev.cloned(),
        });
    }

    /// Whether a write of the object is in flight (tenants wait for it before the next).
    pub fn pending(&self, res: Res, namespace: &str, name: &str) -> bool {
        self.in_flight
            .iter()
            .any(|p| p.obj.res == res && p.obj.namespace == namespace && p.obj.name == name)
    }

    /// Drops an admitted write storage refused (its charge stays until the controller finds
    /// it never landed).
    pub fn refuse(&mut self, obj: &Obj) {
        self.in_flight.retain(|p| {
            !(p.obj.res == obj.res && p.obj.namespace == obj.namespace && p.obj.name == obj.name)
        });
        self.settle_standins();
    }

    /// Stores an admitted write (its charge is no longer in flight); `None` for an update of an
    /// object deleted meanwhile (refused).
    pub fn store(&mut self, mut obj: Obj) -> Option<u64> {
        let pending = self.in_flight.iter().position(|p| {
            p.obj.res == obj.res && p.obj.namespace == obj.namespace && p.obj.name == obj.name
        })?;
        let pending = self.in_flight.remove(pending);
        // What admission's charges cover is the pending write's, not the caller's copy: a key
        // dropped from `status.hard` while the write was in flight no longer covers it (seed
        // 187,255: a pod charged for `pods`, the key dropped and added back before it was
        // stored, is the new key's uncharged object).
        obj.enforced = pending.obj.enforced;
        obj.charged_for = pending.obj.charged_for;
        let id = (obj.res, obj.namespace.clone(), obj.name.clone());
        if pending.prev.is_some() && !self.objects.contains_key(&id) {
            self.settle_standins();
            return None;
        }
        let rv = self.bump();
        obj.rv = rv;
        let old = self.objects.get(&id).cloned();
        self.book_standins(&obj, old.as_ref(), rv);
        self.settle_standins();
        let grew = match self.objects.get(&id) {
            None => true,
            Some(old) => {
                let keys = obj.usage(&[], self.now_ms);
                keys.iter().any(|(k, v)| *v > old.usage_of(k, &[], self.now_ms))
                    || old.deadline != obj.deadline
            }
        };
        if grew {
            obj.grew_at = rv;
        }
        self.objects.insert(id.clone(), obj.clone());
        self.history.entry(id).or_default().push((rv, Some(obj.clone())));
        self.log.push((rv, Change::Object { obj, deleted: false }));
        Some(rv)
    }

    /// Deletes an object.
    pub fn delete(&mut self, res: Res, namespace: &str, name: &str) -> Option<(u64, Obj)> {
        let id = (res, namespace.to_owned(), name.to_owned());
        let obj = self.objects.remove(&id)?;
        let rv = self.bump();
        self.history.entry(id).or_default().push((rv, None));
        self.log.push((
            rv,
            Change::Object {
                obj: obj.clone(),
                deleted: true,
            },
        ));
        self.deleted.push((obj.clone(), rv));
        Some((rv, obj))
    }
}
