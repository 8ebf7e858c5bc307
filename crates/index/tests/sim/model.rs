//! The model apiserver: objects, quotas and one global resourceVersion like etcd's, quota
//! admission that charges `status.used` before an object is stored (by the keys of the quota's
//! `status.hard`, as upstream's `checkRequest`), and the truth every
//! invariant is checked against — computed here from the model's own objects, never through
//! the Engine or its stores.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{ResourceQuota, ResourceQuotaSpec, ResourceQuotaStatus},
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
};
use lazyquota_index::reconciler::CLUSTER_ANNOTATION;

/// The resources tenants create: built-in ConfigMaps and Pods, and on kcp Widgets, a type a
/// logical cluster serves once its APIBinding is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Res {
    ConfigMaps,
    Pods,
    Widgets,
}

/// The quota key counting widgets.
pub const WIDGETS_KEY: &str = "count/widgets.example.io";

impl Res {
    pub fn of(resource: &str) -> Option<Res> {
        match resource {
            "configmaps" => Some(Res::ConfigMaps),
            "pods" => Some(Res::Pods),
            "widgets" => Some(Res::Widgets),
            _ => None,
        }
    }

    /// The resource a quota key is computed from (`None`: no evaluator claims it).
    pub fn of_key(key: &str) -> Option<Res> {
        match key {
            "count/configmaps" => Some(Res::ConfigMaps),
            "pods" | "count/pods" | "requests.cpu" => Some(Res::Pods),
            WIDGETS_KEY => Some(Res::Widgets),
            _ => None,
        }
    }
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

/// One object: a ConfigMap, a Widget, or a running pod requesting `cpu_m` millicores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Obj {
    pub res: Res,
    /// Its place ([`place`]).
    pub namespace: String,
    pub name: String,
    pub cpu_m: i64,
    /// The resourceVersion it was stored at (0 until then).
    pub rv: u64,
    /// The quotas admission charged for it, each with the resourceVersion of the charge.
    pub charged: Vec<(String, u64)>,
    /// The (quota, key) pairs admission charged it for: the quota existed and had the key in
    /// its `status.hard`. An object missing here for a pair (admitted before the quota, or
    /// before the key was enforced) is the one shortfall a raise may have
    /// ([`Server::truth_at`]).
    pub enforced: Vec<(String, &'static str)>,
}

impl Obj {
    /// What this object adds to each quota key it is charged against (in milli-units).
    pub fn charges(&self) -> Vec<(&'static str, i64)> {
        match self.res {
            Res::ConfigMaps => vec![("count/configmaps", 1000)],
            Res::Pods => vec![("pods", 1000), ("count/pods", 1000), ("requests.cpu", self.cpu_m)],
            Res::Widgets => vec![(WIDGETS_KEY, 1000)],
        }
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
    /// `status.hard` as last written (strings as written).
    pub status_hard: Option<BTreeMap<String, String>>,
    /// `status.used` as last written or charged (strings).
    pub used: Option<BTreeMap<String, String>>,
}

/// A quantity string as milli-units: `"3"`, `"1500m"`, `"1.5"`. `None` for anything else —
/// the reconciler never writes another form for these keys, so that is a finding too.
pub fn milli(s: &str) -> Option<i64> {
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

/// A value in milli-units written the way `spec.hard` says it: counts whole, cpu in `m`.
pub fn quantity_string(key: &str, milli: i64) -> String {
    if key == "requests.cpu" {
        format!("{milli}m")
    } else {
        (milli / 1000).to_string()
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

/// The model apiserver's state.
#[derive(Debug, Default)]
pub struct Server {
    pub rv: u64,
    pub objects: BTreeMap<(Res, String, String), Obj>,
    pub quotas: BTreeMap<(String, String), Quota>,
    /// Admitted, not stored yet.
    pub in_flight: Vec<Obj>,
    /// Deleted objects, each with the resourceVersion of its deletion.
    pub deleted: Vec<(Obj, u64)>,
    pub log: Vec<(u64, Change)>,
    next_uid: u64,
}

impl Server {
    pub fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// The true usage of `key` for quota `quota` of `namespace`, for a status write
    /// conditioned on resourceVersion `at` and applied now: the objects that exist now and
    /// were stored by `at`, plus those (stored or still in flight, not deleted) whose create
    /// admission had charged to this quota by `at` (the write must not take those charges
    /// back) for `key`. An object admitted without a charge to this quota (before it existed,
    /// or before its `status.hard` had the key) and stored after `at` is not counted: no write
    /// conditioned on `at` could know of it.
    /// With `enforced_only`, only objects admission charged to `quota` for `key` are counted.
    pub fn truth_at(&self, namespace: &str, quota: &str, key: &str, at: u64, enforced_only: bool) -> i64 {
        let alive = self
            .objects
            .values()
            .map(|o| (o, None))
            .chain(self.deleted.iter().map(|(o, d)| (o, Some(*d))));
        let mut sum = 0;
        for (obj, deleted_at) in alive.chain(self.in_flight.iter().map(|o| (o, None))) {
            let enforced = obj.enforced.iter().any(|(q, k)| q == quota && *k == key);
            if obj.namespace != namespace || (enforced_only && !enforced) {
                continue;
            }
            let stored_by_then = obj.rv != 0 && obj.rv <= at;
            // A charge tells of an object on its way only for the keys it was charged for.
            let charged_by_then = enforced && obj.charged.iter().any(|(q, rv)| q == quota && *rv <= at);
            if deleted_at.is_none() && (stored_by_then || charged_by_then) {
                sum += obj
                    .charges()
                    .iter()
                    .filter(|(k, _)| *k == key)
                    .map(|(_, v)| v)
                    .sum::<i64>();
            }
        }
        sum
    }

    /// What `key` would count if every object of `namespace` that existed at any moment after
    /// `since` (stored, admitted and on its way, or deleted after it) existed at once: no
    /// computation from the objects since then can come to more.
    pub fn ever_since(&self, namespace: &str, key: &str, since: u64) -> i64 {
        let deleted_after = self.deleted.iter().filter(|(_, d)| *d > since).map(|(o, _)| o);
        self.objects
            .values()
            .chain(self.in_flight.iter())
            .chain(deleted_after)
            .filter(|o| o.namespace == namespace)
            .flat_map(Obj::charges)
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| v)
            .sum()
    }

    /// What `key` counts in `namespace` now (stored objects).
    pub fn stored(&self, namespace: &str, key: &str) -> i64 {
        self.objects
            .values()
            .filter(|o| o.namespace == namespace)
            .flat_map(Obj::charges)
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| v)
            .sum()
    }

    /// Creates (or replaces) a quota; returns its new resourceVersion.
    pub fn put_quota(&mut self, namespace: &str, name: &str, hard: BTreeMap<String, i64>) -> u64 {
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
                    status_hard: None,
                    used: None,
                },
            );
        }
        rv
    }

    /// Quota admission for a create of `obj`: `Err` names why it is refused; `Ok` charged
    /// every quota of the namespace (each a resourceVersion-conditional update, here one
    /// step) and returns the quotas charged.
    pub fn admit(&mut self, obj: &mut Obj) -> Result<Vec<(String, String)>, &'static str> {
        let charges = obj.charges();
        let quotas: Vec<(String, String)> = self
            .quotas
            .keys()
            .filter(|(ns, _)| *ns == obj.namespace)
            .cloned()
            .collect();
        // As upstream's admission: a quota constrains and is charged for the keys of its
        // `status.hard` (what its controller last wrote), not of its `spec.hard`.
        let status_hard = |q: &Quota, k: &str| q.status_hard.as_ref().and_then(|h| h.get(k)).cloned();
        for key in &quotas {
            let q = &self.quotas[key];
            for (k, by) in &charges {
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
        for key in &quotas {
            let q = &self.quotas[key];
            for (k, _) in &charges {
                if status_hard(q, k).is_some() {
                    obj.enforced.push((key.1.clone(), *k));
                }
            }
        }
        let mut charged_quotas = Vec::new();
        for key in quotas {
            let rv = self.bump();
            let q = self.quotas.get_mut(&key).expect("listed");
            let mut any = false;
            for (k, by) in &charges {
                if status_hard(q, k).is_some() {
                    let used = q.used.as_mut().expect("checked");
                    let now = milli(&used[*k]).expect("checked") + by;
                    used.insert((*k).to_owned(), quantity_string(k, now));
                    any = true;
                }
            }
            if any {
                q.rv = rv;
                obj.charged.push((key.1.clone(), rv));
                charged_quotas.push(key);
            }
        }
        self.in_flight.push(obj.clone());
        Ok(charged_quotas)
    }

    /// Stores an admitted object (its charge is no longer in flight).
    pub fn store(&mut self, mut obj: Obj) -> u64 {
        self.in_flight
            .retain(|o| !(o.namespace == obj.namespace && o.name == obj.name));
        let rv = self.bump();
        obj.rv = rv;
        self.objects
            .insert((obj.res, obj.namespace.clone(), obj.name.clone()), obj.clone());
        self.log.push((rv, Change::Object { obj, deleted: false }));
        rv
    }

    /// Deletes an object.
    pub fn delete(&mut self, res: Res, namespace: &str, name: &str) -> Option<(u64, Obj)> {
        let obj = self
            .objects
            .remove(&(res, namespace.to_owned(), name.to_owned()))?;
        let rv = self.bump();
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
