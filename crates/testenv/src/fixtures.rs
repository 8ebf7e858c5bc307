//! Seeded, reproducible quota fixtures: one namespace full of objects that exercise every corner
//! of upstream's quota evaluators, then ResourceQuotas over every scope and resource name family.
//!
//! [`populate`] is deterministic per seed (a tiny splitmix64 generator, no `rand`): the same seed
//! gives the same objects and quotas, so a failing seed can be replayed on its own. Objects are
//! created **before** the quotas, as the ResourceQuota admission plugin would otherwise charge
//! (or reject) them, and KCM only recomputes a quota when it is added, its `spec.hard` changes,
//! an object event replenishes it, or the 5m resync fires.
//!
//! What a namespace gets (each item only with some probability, so seeds differ):
//! - pods with app containers, init containers and restartable sidecars; cpu, memory and
//!   ephemeral-storage in mixed formats (`m`, decimals, exponents, `Mi`/`M`/`Ki`/plain bytes);
//!   hugepages; an extended resource (`example.com/foo`); pod-level resources; overhead through
//!   a RuntimeClass; priority classes; (cross-namespace) pod affinity; `activeDeadlineSeconds`;
//!   terminal phases, in-place resize status (allocated and actuated resources, the
//!   `PodResizePending=Infeasible` condition) set through `/status`; pods being deleted, kept by
//!   a finalizer, both past their deletion grace (unscheduled pods get grace 0) and within it
//!   (a `nodeName` and a long grace period);
//! - services of every type, node ports explicit and allocated, load balancers with and
//!   without node port allocation;
//! - PVCs with and without storage class, the beta class annotation, fractional requests,
//!   `status.allocatedResources` above and below the request, VolumeAttributesClass names in
//!   spec, status and modification target, one being deleted;
//! - configmaps, secrets and deployments (no controllers act on the latter);
//! - quotas: unscoped, Terminating, NotTerminating, BestEffort, NotBestEffort, PriorityClass
//!   (In, NotIn, Exists, DoesNotExist, and bare in `spec.scopes`), CrossNamespacePodAffinity,
//!   VolumeAttributesClass, combinations, listing compute, extended, hugepages, storage,
//!   storage-class, object-count (also under scopes), ignored and unknown names.
//!
//! - DRA (where `resource.k8s.io/v1` is served): ResourceClaims with exact and `All`
//!   requests, `firstAvailable` alternatives, several requests per claim, classes with and
//!   without an extended resource name and one that does not exist; pods requesting
//!   `example.com/foo` with extended-resource claims they own (the scheduler's annotation and
//!   controller reference), some named by the pod's `status.extendedResourceClaimStatus`; a
//!   quota over every DRA key family.
//!
//! Cluster-scoped helpers (PriorityClasses, RuntimeClasses, DeviceClasses) are created
//! idempotently with fixed, prefixed names and fixed specs, so concurrent tests and repeated
//! runs share them.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, ResourceQuota, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::serde::{Serialize, de::DeserializeOwned};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::{TestNamespace, eventually};

/// The finalizer that keeps deleted fixture pods around (removed by [`Fixture::release`]).
pub const FINALIZER: &str = "lazyquota.dev/fixture";

/// The priority classes fixture pods use (created cluster-wide, idempotently).
pub const PRIORITY_CLASSES: [&str; 3] = ["lq-fixture-low", "lq-fixture-mid", "lq-fixture-high"];

/// The RuntimeClasses with overhead fixture pods use (created cluster-wide, idempotently).
pub const RUNTIME_CLASSES: [&str; 2] = ["lq-fixture-overhead", "lq-fixture-overhead-decimal"];

/// DeviceClasses fixture claims use: one mapped to the extended resource `example.com/foo`
/// (which fixture pods request), one not mapped, and one that is never created.
pub const DEVICE_CLASSES: [&str; 3] = ["lq-fixture-foo", "lq-fixture-gpu", "lq-fixture-missing"];

/// The extended resource [`DEVICE_CLASSES`]`[0]` maps.
pub const DRA_EXTENDED_RESOURCE: &str = "example.com/foo";

/// Storage classes fixture PVCs name (they need not exist).
pub const STORAGE_CLASSES: [&str; 3] = ["lq-fast", "lq-slow", "lq-beta"];

/// VolumeAttributesClass names fixture PVCs reference (they need not exist).
pub const VOLUME_ATTRIBUTES_CLASSES: [&str; 2] = ["lq-gold", "lq-silver"];

/// The hard key [`Fixture::force_recalculation`] adds: a valid name no evaluator matches.
pub const RESYNC_KEY: &str = "count/resync.fixtures.lazyquota.dev";

const IMAGE: &str = "registry.k8s.io/pause:3.10";
const FAKE_NODE: &str = "lq-fixture-node";

/// What can go wrong while populating or settling a fixture.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request failed.
    #[error("seed {seed}: {what}: {source}")]
    Kube {
        /// The fixture's seed.
        seed: u64,
        /// What was being done.
        what: String,
        /// The error from kube.
        #[source]
        source: kube::Error,
    },
    /// Something did not happen in time.
    #[error("seed {seed}: timed out waiting for {what}")]
    Timeout {
        /// The fixture's seed.
        seed: u64,
        /// What was awaited.
        what: String,
    },
}

/// A tiny seeded PRNG (splitmix64): reproducible, dependency-free, good enough for fixtures.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        let len = u64::try_from(items.len()).unwrap_or(u64::MAX);
        &items[usize::try_from(self.below(len)).unwrap_or(0)]
    }

    /// Each element kept with probability `percent`/100, in order; never empty for a non-empty
    /// input (the first element is kept if nothing else was).
    pub fn subset<T: Clone>(&mut self, items: &[T], percent: u64) -> Vec<T> {
        let mut kept: Vec<T> = items.iter().filter(|_| self.chance(percent)).cloned().collect();
        if kept.is_empty()
            && let Some(first) = items.first()
        {
            kept.push(first.clone());
        }
        kept
    }
}

/// How many objects of each kind a fixture created.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Pods (including terminal and terminating ones).
    pub pods: usize,
    /// Pods left with a deletion timestamp.
    pub terminating_pods: usize,
    /// Pods set to Succeeded or Failed.
    pub terminal_pods: usize,
    /// Services.
    pub services: usize,
    /// PersistentVolumeClaims.
    pub pvcs: usize,
    /// ConfigMaps created by the fixture (the root CA one comes on top).
    pub configmaps: usize,
    /// Secrets.
    pub secrets: usize,
    /// Deployments.
    pub deployments: usize,
    /// ResourceClaims (extended-resource ones included).
    pub claims: usize,
    /// ResourceQuotas.
    pub quotas: usize,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} pods ({} terminal, {} terminating), {} services, {} pvcs, {} configmaps, {} secrets, \
             {} deployments, {} resource claims, {} quotas",
            self.pods,
            self.terminal_pods,
            self.terminating_pods,
            self.services,
            self.pvcs,
            self.configmaps,
            self.secrets,
            self.deployments,
            self.claims,
            self.quotas
        )
    }
}

/// A populated namespace.
#[derive(Clone, Debug)]
pub struct Fixture {
    /// The seed it was generated from.
    pub seed: u64,
    /// The namespace.
    pub namespace: String,
    /// Names of the quotas, in creation order.
    pub quotas: Vec<String>,
    /// What was created.
    pub summary: Summary,
    finalized_pods: Vec<String>,
    pvcs: Vec<String>,
}

impl Fixture {
    fn kube_error(&self, what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let seed = self.seed;
        let what = what.into();
        move |source| Error::Kube { seed, what, source }
    }

    /// Waits until every quota's `status.hard` equals its `spec.hard` by value (key sets
    /// included): the quota controller has synced the current spec at least once.
    pub async fn wait_for_status(&self, ns: &TestNamespace, timeout: Duration) -> Result<(), Error> {
        let api = ns.api::<ResourceQuota>();
        let synced = eventually(timeout, || {
            let api = api.clone();
            async move {
                let list = api.list(&kube::api::ListParams::default()).await.ok()?;
                let all = self.quotas.iter().all(|name| {
                    list.items
                        .iter()
                        .find(|q| q.metadata.name.as_deref() == Some(name))
                        .is_some_and(status_synced)
                });
                all.then_some(())
            }
        })
        .await;
        synced.ok_or_else(|| Error::Timeout {
            seed: self.seed,
            what: format!("the quota controller to sync the quotas of {}", self.namespace),
        })
    }

    /// Forces a full recalculation of every quota after all objects have settled, by adding
    /// [`RESYNC_KEY`] to each quota's `spec.hard` (a spec change enqueues the quota in KCM and
    /// in lazyquota alike), then waits for the controller to sync the new spec.
    ///
    /// The key stays: no evaluator matches it, so it must stay absent from `status.used`.
    pub async fn force_recalculation(&self, ns: &TestNamespace, timeout: Duration) -> Result<(), Error> {
        let api = ns.api::<ResourceQuota>();
        let patch = json!({ "spec": { "hard": { RESYNC_KEY: "1" } } });
        for name in &self.quotas {
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(self.kube_error(format!("adding {RESYNC_KEY} to quota {name}")))?;
        }
        self.wait_for_status(ns, timeout).await
    }

    /// Lets the namespace go away: removes the fixture's finalizers (deleted pods, PVC
    /// protection) and force-deletes the pods it bound to its fake node (no kubelet will ever
    /// confirm their termination). Objects already gone are fine.
    pub async fn release(&self, ns: &TestNamespace) -> Result<(), Error> {
        let clear = json!({ "metadata": { "finalizers": null } });
        let pods = ns.api::<Pod>();
        let force = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        for name in &self.finalized_pods {
            ignore_not_found(
                pods.patch(name, &PatchParams::default(), &Patch::Merge(&clear))
                    .await,
            )
            .map_err(self.kube_error(format!("removing the finalizer of pod {name}")))?;
            ignore_not_found(pods.delete(name, &force).await)
                .map_err(self.kube_error(format!("force-deleting pod {name}")))?;
        }
        let pvcs = ns.api::<PersistentVolumeClaim>();
        for name in &self.pvcs {
            ignore_not_found(
                pvcs.patch(name, &PatchParams::default(), &Patch::Merge(&clear))
                    .await,
            )
            .map_err(self.kube_error(format!("removing the finalizers of pvc {name}")))?;
        }
        Ok(())
    }
}

fn ignore_not_found<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether `status.hard` equals `spec.hard` by value, with the same keys (the controller writes
/// `hard` and `used` together; `used` may be absent when no hard key is computed).
fn status_synced(quota: &ResourceQuota) -> bool {
    let empty = BTreeMap::new();
    let spec = quota
        .spec
        .as_ref()
        .and_then(|s| s.hard.as_ref())
        .unwrap_or(&empty);
    let Some(status) = quota.status.as_ref() else {
        return false;
    };
    let hard = status.hard.as_ref().unwrap_or(&empty);
    spec.len() == hard.len()
        && spec
            .iter()
            .all(|(k, v)| hard.get(k).is_some_and(|h| same_value(v, h)))
}

/// Value equality of two API quantities (the apiserver stores them canonically, so equal
/// values have equal strings except across formats, which the canonical forms below cover).
fn same_value(a: &Quantity, b: &Quantity) -> bool {
    a.0 == b.0 || canonical_number(&a.0).is_some_and(|x| canonical_number(&b.0) == Some(x))
}

/// A crude exact value for the integer quantities fixtures use (`1k`, `1Gi`, `1000`).
fn canonical_number(s: &str) -> Option<u128> {
    const SUFFIXES: [(&str, u128); 9] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("", 1),
    ];
    SUFFIXES.iter().find_map(|(suffix, factor)| {
        let digits = s.strip_suffix(suffix)?;
        digits.parse::<u128>().ok().map(|n| n * factor)
    })
}

// ---------------------------------------------------------------------------------------------
// Quantities in many spellings.

/// A cpu quantity of `millis`, spelled in one of its valid forms.
fn cpu(rng: &mut SplitMix64, millis: u64) -> String {
    let mut forms = vec![format!("{millis}m")];
    if millis.is_multiple_of(1000) {
        forms.push((millis / 1000).to_string());
    }
    if millis.is_multiple_of(100) {
        forms.push(format!("{}.{}", millis / 1000, (millis % 1000) / 100));
    }
    if millis.is_multiple_of(10) && millis > 0 {
        forms.push(format!("{}e-2", millis / 10));
    }
    rng.pick(&forms).clone()
}

/// A byte quantity, spelled in one of its exact forms (plain, binary, decimal SI, exponent,
/// half binary units).
fn bytes(rng: &mut SplitMix64, value: u64) -> String {
    let mut forms = vec![value.to_string()];
    for (div, suffix) in [
        (1u64 << 10, "Ki"),
        (1 << 20, "Mi"),
        (1 << 30, "Gi"),
        (1_000, "k"),
        (1_000_000, "M"),
        (1_000_000_000, "G"),
    ] {
        if value.is_multiple_of(div) && value > 0 {
            forms.push(format!("{}{suffix}", value / div));
        }
    }
    if value.is_multiple_of(1_000_000) && value > 0 {
        forms.push(format!("{}e6", value / 1_000_000));
    }
    if value.is_multiple_of(1 << 19) && !value.is_multiple_of(1 << 20) {
        forms.push(format!("{}.5Mi", value >> 20));
    }
    rng.pick(&forms).clone()
}

/// A memory-like byte count whose spellings vary: multiples of 16Mi, of 10M, of 8 * 1024000
/// (both `k` and `Ki`), of 512Ki (half `Mi`), or an odd plain number.
fn memory_bytes(rng: &mut SplitMix64) -> u64 {
    match rng.below(5) {
        0 => rng.range(1, 64) * (16 << 20),
        1 => rng.range(1, 50) * 10_000_000,
        2 => rng.range(1, 40) * 8 * 1_024_000,
        3 => (2 * rng.range(1, 200) + 1) * (1 << 19),
        _ => rng.range(1_000_000, 900_000_000),
    }
}

fn cpu_millis(rng: &mut SplitMix64) -> u64 {
    match rng.below(4) {
        0 => rng.range(1, 20) * 50,
        1 => rng.range(1, 4) * 1000,
        2 => rng.range(1, 999),
        _ => rng.range(1, 30) * 100,
    }
}

// ---------------------------------------------------------------------------------------------
// Pods.

/// Effective cpu (millis) and memory (bytes) of the containers, for pod-level validation
/// (pod-level requests must cover the aggregate, container limits must fit the pod limit).
#[derive(Clone, Copy, Default)]
struct Tally {
    cpu_requests: u64,
    memory_requests: u64,
    cpu_limit_max: u64,
    memory_limit_max: u64,
}

/// One resource of a container: request and limit in numbers plus their spellings.
fn resource_pair(
    rng: &mut SplitMix64,
    requests: &mut serde_json::Map<String, Value>,
    limits: &mut serde_json::Map<String, Value>,
    name: &str,
    gen_value: fn(&mut SplitMix64) -> u64,
    spell: fn(&mut SplitMix64, u64) -> String,
) -> (u64, Option<u64>) {
    // A zero request now and then (with a zero or absent limit): "0" stays a present value.
    if rng.chance(6) {
        requests.insert(name.to_owned(), json!("0"));
        if rng.chance(50) {
            limits.insert(name.to_owned(), json!("0"));
            return (0, Some(0));
        }
        return (0, None);
    }
    let request = gen_value(rng);
    match rng.below(4) {
        // Request only.
        0 | 1 => {
            requests.insert(name.to_owned(), json!(spell(rng, request)));
            (request, None)
        }
        // Request and a limit at least as large.
        2 => {
            let limit = if rng.chance(40) {
                request
            } else {
                request + gen_value(rng)
            };
            requests.insert(name.to_owned(), json!(spell(rng, request)));
            limits.insert(name.to_owned(), json!(spell(rng, limit)));
            (request, Some(limit))
        }
        // Limit only: the apiserver defaults the request to it.
        _ => {
            limits.insert(name.to_owned(), json!(spell(rng, request)));
            (request, Some(request))
        }
    }
}

fn container_resources(rng: &mut SplitMix64, tally: &mut Tally) -> Value {
    if rng.chance(20) {
        return json!({});
    }
    let mut requests = serde_json::Map::new();
    let mut limits = serde_json::Map::new();
    let mut has_cpu_or_memory = false;
    if rng.chance(70) {
        let (request, limit) = resource_pair(rng, &mut requests, &mut limits, "cpu", cpu_millis, cpu);
        tally.cpu_requests += request;
        tally.cpu_limit_max = tally.cpu_limit_max.max(limit.unwrap_or(0));
        has_cpu_or_memory = true;
    }
    if rng.chance(70) {
        let (request, limit) = resource_pair(rng, &mut requests, &mut limits, "memory", memory_bytes, bytes);
        tally.memory_requests += request;
        tally.memory_limit_max = tally.memory_limit_max.max(limit.unwrap_or(0));
        has_cpu_or_memory = true;
    }
    if rng.chance(30) {
        resource_pair(
            rng,
            &mut requests,
            &mut limits,
            "ephemeral-storage",
            memory_bytes,
            bytes,
        );
    }
    if rng.chance(12) {
        // Hugepages cannot be overcommitted (request == limit) and need cpu or memory.
        let (name, value) = if rng.chance(70) {
            ("hugepages-2Mi", rng.range(1, 8) * (2 << 20))
        } else {
            ("hugepages-1Gi", rng.range(1, 2) << 30)
        };
        let spelled = bytes(rng, value);
        requests.insert(name.to_owned(), json!(spelled));
        limits.insert(name.to_owned(), json!(spelled));
        if !has_cpu_or_memory {
            let memory = memory_bytes(rng);
            requests.insert("memory".to_owned(), json!(bytes(rng, memory)));
            tally.memory_requests += memory;
        }
    }
    if rng.chance(15) {
        // Extended resources: integers, request == limit (or limit only).
        let n = rng.range(1, 4).to_string();
        if rng.chance(70) {
            requests.insert("example.com/foo".to_owned(), json!(n));
        }
        limits.insert("example.com/foo".to_owned(), json!(n));
    }
    let mut resources = serde_json::Map::new();
    if !requests.is_empty() {
        resources.insert("requests".to_owned(), Value::Object(requests));
    }
    if !limits.is_empty() {
        resources.insert("limits".to_owned(), Value::Object(limits));
    }
    Value::Object(resources)
}

fn affinity(rng: &mut SplitMix64) -> Value {
    let mut term = json!({
        "labelSelector": { "matchLabels": { "app": format!("peer-{}", rng.below(3)) } },
        "topologyKey": "kubernetes.io/hostname",
    });
    match rng.below(5) {
        0 => term["namespaces"] = json!(["other", "kube-system"]),
        1 => term["namespaceSelector"] = json!({}),
        2 => term["namespaceSelector"] = json!({ "matchLabels": { "team": "a" } }),
        // An explicitly empty namespaces list is same-namespace.
        3 => term["namespaces"] = json!([]),
        _ => {}
    }
    let kind = if rng.chance(50) {
        "podAffinity"
    } else {
        "podAntiAffinity"
    };
    let terms = if rng.chance(50) {
        json!({ "requiredDuringSchedulingIgnoredDuringExecution": [term] })
    } else {
        json!({ "preferredDuringSchedulingIgnoredDuringExecution": [
            { "weight": rng.range(1, 100), "podAffinityTerm": term }
        ] })
    };
    json!({ kind: terms })
}

/// How a pod ends up being deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Deletion {
    /// Not deleted.
    No,
    /// Deleted while unscheduled: grace 0, so it is past its deletion grace at once
    /// (kept by the finalizer).
    PastGrace,
    /// Scheduled to a (fake) node and deleted with a long grace period: still charged.
    WithinGrace,
}

struct PodPlan {
    name: String,
    body: Value,
    status: Option<Value>,
    deletion: Deletion,
    terminal: bool,
}

/// Resize status for the named containers: allocated and actuated resources that differ from
/// the spec, sometimes larger, sometimes smaller.
fn resize_statuses(rng: &mut SplitMix64, names: &[String]) -> Vec<Value> {
    let chosen: Vec<&String> = names.iter().filter(|_| rng.chance(70)).collect();
    chosen
        .into_iter()
        .map(|name| {
            let mut status = json!({
                "name": name, "image": IMAGE, "imageID": "", "ready": false, "restartCount": 0,
            });
            if rng.chance(80) {
                let millis = cpu_millis(rng);
                let memory = memory_bytes(rng);
                status["allocatedResources"] =
                    json!({ "cpu": cpu(rng, millis), "memory": bytes(rng, memory) });
            }
            if rng.chance(70) {
                let mut resources = json!({});
                if rng.chance(80) {
                    let millis = cpu_millis(rng);
                    let memory = memory_bytes(rng);
                    resources["requests"] = json!({ "cpu": cpu(rng, millis), "memory": bytes(rng, memory) });
                }
                if rng.chance(60) {
                    let millis = cpu_millis(rng) * 2;
                    resources["limits"] = json!({ "cpu": cpu(rng, millis) });
                }
                status["resources"] = resources;
            }
            status
        })
        .collect()
}

#[allow(clippy::too_many_lines)] // one place that lists every pod feature
fn pod_plan(rng: &mut SplitMix64, index: usize) -> PodPlan {
    let name = format!("pod-{index:02}");
    let mut tally = Tally::default();
    let mut container_names = Vec::new();
    let mut containers = Vec::new();
    for i in 0..rng.range(1, 3) {
        let cname = format!("app-{i}");
        containers.push(json!({
            "name": cname, "image": IMAGE, "resources": container_resources(rng, &mut tally),
        }));
        container_names.push(cname);
    }
    let mut init_names = Vec::new();
    let mut init_containers = Vec::new();
    if rng.chance(45) {
        for i in 0..rng.range(1, 3) {
            let cname = format!("init-{i}");
            let mut container = json!({
                "name": cname, "image": IMAGE, "resources": container_resources(rng, &mut tally),
            });
            if rng.chance(50) {
                container["restartPolicy"] = json!("Always");
            }
            init_containers.push(container);
            init_names.push(cname);
        }
    }
    let best_effort_layout = rng.chance(12);
    if best_effort_layout {
        // A BestEffort pod: no cpu or memory anywhere (ephemeral-storage may stay).
        tally = Tally::default();
        for c in containers.iter_mut().chain(init_containers.iter_mut()) {
            c["resources"] = json!({});
        }
    }
    let mut spec = json!({ "containers": containers });
    if !init_containers.is_empty() {
        spec["initContainers"] = Value::Array(init_containers);
    }
    if !best_effort_layout && rng.chance(20) {
        // Pod-level resources: requests cover the container aggregate, limits cover every
        // container limit and the pod request.
        let mut requests = serde_json::Map::new();
        let mut limits = serde_json::Map::new();
        if rng.chance(75) {
            let request = tally.cpu_requests + cpu_millis(rng);
            requests.insert("cpu".into(), json!(cpu(rng, request)));
            if rng.chance(50) {
                let limit = request.max(tally.cpu_limit_max) + cpu_millis(rng);
                limits.insert("cpu".into(), json!(cpu(rng, limit)));
            }
        }
        if rng.chance(75) {
            let request = tally.memory_requests + memory_bytes(rng);
            requests.insert("memory".into(), json!(bytes(rng, request)));
            if rng.chance(50) {
                let limit = request.max(tally.memory_limit_max) + memory_bytes(rng);
                limits.insert("memory".into(), json!(bytes(rng, limit)));
            }
        }
        if !requests.is_empty() || !limits.is_empty() {
            let mut resources = json!({});
            if !requests.is_empty() {
                resources["requests"] = Value::Object(requests);
            }
            if !limits.is_empty() {
                resources["limits"] = Value::Object(limits);
            }
            spec["resources"] = resources;
        }
    }
    if rng.chance(25) {
        spec["runtimeClassName"] = json!(rng.pick(&RUNTIME_CLASSES));
    }
    if rng.chance(60) {
        spec["priorityClassName"] = json!(rng.pick(&PRIORITY_CLASSES));
    }
    if rng.chance(25) {
        spec["affinity"] = affinity(rng);
    }
    if rng.chance(30) {
        spec["activeDeadlineSeconds"] = json!(rng.range(1, 100_000));
    }
    if rng.chance(20) {
        spec["restartPolicy"] = json!(rng.pick(&["Never", "OnFailure"]));
    }

    let deletion = match rng.below(10) {
        0 => Deletion::PastGrace,
        1 => Deletion::WithinGrace,
        _ => Deletion::No,
    };
    if deletion == Deletion::WithinGrace {
        spec["nodeName"] = json!(FAKE_NODE);
    }
    let mut metadata = json!({ "name": name, "labels": { "app": format!("peer-{}", index % 3) } });
    if deletion != Deletion::No {
        metadata["finalizers"] = json!([FINALIZER]);
    }

    let mut status = serde_json::Map::new();
    let terminal = rng.chance(15);
    if terminal {
        status.insert("phase".into(), json!(rng.pick(&["Succeeded", "Failed"])));
    }
    if rng.chance(30) {
        let statuses = resize_statuses(rng, &container_names);
        if !statuses.is_empty() {
            status.insert("containerStatuses".into(), Value::Array(statuses));
        }
        let statuses = resize_statuses(rng, &init_names);
        if !statuses.is_empty() {
            status.insert("initContainerStatuses".into(), Value::Array(statuses));
        }
        if rng.chance(40) {
            let reason = rng.pick(&["Infeasible", "Deferred"]);
            status.insert(
                "conditions".into(),
                json!([{ "type": "PodResizePending", "status": "True", "reason": reason }]),
            );
        }
    }
    PodPlan {
        name,
        body: json!({ "apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec }),
        status: (!status.is_empty()).then(|| json!({ "status": status })),
        deletion,
        terminal,
    }
}

// ---------------------------------------------------------------------------------------------
// Services.

fn node_port(rng: &mut SplitMix64) -> u64 {
    rng.range(30_000, 32_767)
}

/// After a clash, new explicit node ports for the ports that had one (or none at all on the
/// last attempt: the apiserver allocates them).
fn repick_node_ports(body: &mut Value, rng: &mut SplitMix64, explicit: bool) {
    let mut used = Vec::new();
    for port in body["spec"]["ports"].as_array_mut().into_iter().flatten() {
        let Some(port) = port.as_object_mut() else {
            continue;
        };
        if port.contains_key("nodePort") {
            if explicit {
                let mut p = node_port(rng);
                while used.contains(&p) {
                    p = node_port(rng);
                }
                used.push(p);
                port.insert("nodePort".into(), json!(p));
            } else {
                port.remove("nodePort");
            }
        }
    }
}

fn service_body(rng: &mut SplitMix64, name: &str, service_type: &str) -> Value {
    let port_count = rng.range(1, 3);
    let mut used = Vec::new();
    let mut ports = Vec::new();
    for i in 0..port_count {
        let mut port = json!({ "name": format!("p{i}"), "port": 80 + i, "protocol": "TCP" });
        if matches!(service_type, "NodePort" | "LoadBalancer") && rng.chance(50) {
            let mut p = node_port(rng);
            while used.contains(&p) {
                p = node_port(rng);
            }
            used.push(p);
            port["nodePort"] = json!(p);
        }
        ports.push(port);
    }
    let mut spec = json!({ "type": service_type, "ports": ports });
    match service_type {
        "ExternalName" => {
            spec["externalName"] = json!("db.example.com");
            if rng.chance(50) {
                spec.as_object_mut().map(|s| s.remove("ports"));
            }
        }
        "ClusterIP" if rng.chance(30) => spec["clusterIP"] = json!("None"),
        "LoadBalancer" => match rng.below(3) {
            0 => spec["allocateLoadBalancerNodePorts"] = json!(false),
            1 => spec["allocateLoadBalancerNodePorts"] = json!(true),
            _ => {}
        },
        _ => {}
    }
    json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": name }, "spec": spec })
}

// ---------------------------------------------------------------------------------------------
// PVCs.

struct PvcPlan {
    body: Value,
    status: Option<Value>,
    delete: bool,
}

fn storage_request(rng: &mut SplitMix64) -> String {
    if rng.below(3) == 0 {
        (*rng.pick(&[
            "1Gi", "1.5Gi", "500M", "2500m", "1.1Ki", "0.5Gi", "1e3", "100Mi", "3G", "1234567", "0.3",
        ]))
        .to_owned()
    } else {
        let value = memory_bytes(rng) * rng.range(1, 8);
        bytes(rng, value)
    }
}

fn pvc_plan(rng: &mut SplitMix64, name: &str) -> PvcPlan {
    let mut metadata = json!({ "name": name });
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": { "requests": { "storage": storage_request(rng) } },
    });
    match rng.below(6) {
        0 => {}
        1 | 2 => spec["storageClassName"] = json!(rng.pick(&STORAGE_CLASSES[..2])),
        // The beta annotation alone.
        3 => {
            metadata["annotations"] =
                json!({ "volume.beta.kubernetes.io/storage-class": STORAGE_CLASSES[2] });
        }
        // The annotation wins over a different storageClassName.
        4 => {
            metadata["annotations"] =
                json!({ "volume.beta.kubernetes.io/storage-class": STORAGE_CLASSES[2] });
            spec["storageClassName"] = json!(STORAGE_CLASSES[0]);
        }
        // An explicitly empty class: no class.
        _ => spec["storageClassName"] = json!(""),
    }
    if rng.chance(30) {
        spec["volumeAttributesClassName"] = json!(rng.pick(&VOLUME_ATTRIBUTES_CLASSES));
    }
    let mut status = serde_json::Map::new();
    if rng.chance(40) {
        status.insert(
            "allocatedResources".into(),
            json!({ "storage": storage_request(rng) }),
        );
    }
    if rng.chance(15) {
        status.insert(
            "currentVolumeAttributesClassName".into(),
            json!(rng.pick(&VOLUME_ATTRIBUTES_CLASSES)),
        );
    }
    if rng.chance(15) {
        status.insert(
            "modifyVolumeStatus".into(),
            json!({
                "status": rng.pick(&["Pending", "InProgress", "Infeasible"]),
                "targetVolumeAttributesClassName": rng.pick(&VOLUME_ATTRIBUTES_CLASSES),
            }),
        );
    }
    PvcPlan {
        body: json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec,
        }),
        status: (!status.is_empty()).then(|| json!({ "status": status })),
        delete: rng.chance(10),
    }
}

// ---------------------------------------------------------------------------------------------
// Quotas.

/// Names valid under every pod scope (standard names the scopes allow).
const POD_SCOPED: &[&str] = &[
    "pods",
    "cpu",
    "memory",
    "requests.cpu",
    "requests.memory",
    "limits.cpu",
    "limits.memory",
];

/// Standard pod names that no scope allows. (`limits.hugepages-*` is rejected by validation:
/// neither standard nor fully qualified.)
const POD_UNSCOPED: &[&str] = &[
    "ephemeral-storage",
    "requests.ephemeral-storage",
    "limits.ephemeral-storage",
    "hugepages-2Mi",
    "requests.hugepages-2Mi",
    "hugepages-1Gi",
    "requests.hugepages-1Gi",
];

/// Non-standard names about pods: allowed under any scope.
const POD_NON_STANDARD: &[&str] = &[
    "count/pods",
    "requests.example.com/foo",
    "requests.example.com/bar",
    "limits.example.com/foo",
    "limits.example.com/bar",
    "example.com/foo",
];

/// Non-standard object counts: allowed under any scope (where they compute 0), some ignored or
/// never discovered (absent).
const COUNTS: &[&str] = &[
    "count/configmaps",
    "count/secrets",
    "count/services",
    "count/persistentvolumeclaims",
    "count/deployments.apps",
    "count/replicasets.apps",
    "count/serviceaccounts",
    "count/replicationcontrollers",
    "count/events",
    "count/widgets.example.com",
];

/// Standard object names: only unscoped quotas may list them.
const OBJECTS: &[&str] = &[
    "services",
    "services.nodeports",
    "services.loadbalancers",
    "persistentvolumeclaims",
    "requests.storage",
    "configmaps",
    "secrets",
    "replicationcontrollers",
];

fn storage_class_keys() -> Vec<String> {
    STORAGE_CLASSES
        .iter()
        .chain(&["lq-none"])
        .flat_map(|class| {
            [
                format!("{class}.storageclass.storage.k8s.io/persistentvolumeclaims"),
                format!("{class}.storageclass.storage.k8s.io/requests.storage"),
            ]
        })
        .collect()
}

fn owned(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

/// One scope requirement: a scope name, an operator and values.
#[derive(Clone, Debug)]
struct Requirement {
    scope: &'static str,
    operator: &'static str,
    values: Vec<String>,
}

impl Requirement {
    fn exists(scope: &'static str) -> Self {
        Self {
            scope,
            operator: "Exists",
            values: Vec::new(),
        }
    }
}

struct QuotaPlan {
    name: String,
    hard: Vec<String>,
    /// `spec.scopes` entries.
    scopes: Vec<&'static str>,
    /// `spec.scopeSelector.matchExpressions`.
    selector: Vec<Requirement>,
}

impl QuotaPlan {
    fn body(&self, rng: &mut SplitMix64) -> Value {
        let hard: serde_json::Map<String, Value> = self
            .hard
            .iter()
            .map(|key| (key.clone(), json!(rng.pick(&["1000", "20", "100k", "1Gi", "5M"]))))
            .collect();
        let mut spec = json!({ "hard": hard });
        if !self.scopes.is_empty() {
            spec["scopes"] = json!(self.scopes);
        }
        if !self.selector.is_empty() {
            let expressions: Vec<Value> = self
                .selector
                .iter()
                .map(|r| {
                    let mut e = json!({ "scopeName": r.scope, "operator": r.operator });
                    if !r.values.is_empty() {
                        e["values"] = json!(r.values);
                    }
                    e
                })
                .collect();
            spec["scopeSelector"] = json!({ "matchExpressions": expressions });
        }
        json!({
            "apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": { "name": self.name }, "spec": spec,
        })
    }
}

/// A scope given either in `spec.scopes` or as an `Exists` selector expression.
fn exists_scope(rng: &mut SplitMix64, scope: &'static str, plan: &mut QuotaPlan) {
    if rng.chance(50) {
        plan.scopes.push(scope);
    } else {
        plan.selector.push(Requirement::exists(scope));
    }
}

fn priority_requirement(rng: &mut SplitMix64) -> Requirement {
    let mut values = rng.subset(&owned(&PRIORITY_CLASSES), 50);
    if rng.chance(30) {
        values.push("no-such-class".into());
    }
    match rng.below(4) {
        0 => Requirement {
            scope: "PriorityClass",
            operator: "In",
            values,
        },
        1 => Requirement {
            scope: "PriorityClass",
            operator: "NotIn",
            values,
        },
        2 => Requirement::exists("PriorityClass"),
        _ => Requirement {
            scope: "PriorityClass",
            operator: "DoesNotExist",
            values: Vec::new(),
        },
    }
}

/// Hard keys for a pod-scoped quota; `best_effort` restricts standard names to `pods`.
fn pod_scoped_keys(rng: &mut SplitMix64, best_effort: bool) -> Vec<String> {
    let mut keys = if best_effort {
        vec!["pods".to_owned()]
    } else {
        rng.subset(&owned(POD_SCOPED), 65)
    };
    keys.extend(owned(POD_NON_STANDARD).into_iter().filter(|_| rng.chance(45)));
    keys.extend(owned(COUNTS).into_iter().filter(|_| rng.chance(12)));
    keys
}

#[allow(clippy::too_many_lines)] // the catalogue of quota shapes
fn quota_plans(rng: &mut SplitMix64) -> Vec<QuotaPlan> {
    let mut plans = Vec::new();
    let plan = |name: &str, hard: Vec<String>| QuotaPlan {
        name: name.to_owned(),
        hard,
        scopes: Vec::new(),
        selector: Vec::new(),
    };

    // Unscoped compute, hugepages, extended and unknown names.
    let mut keys = rng.subset(&owned(POD_SCOPED), 70);
    keys.extend(rng.subset(&owned(POD_UNSCOPED), 60));
    keys.extend(rng.subset(&owned(POD_NON_STANDARD), 60));
    plans.push(plan("compute", keys));

    // Unscoped objects, storage and counts.
    let mut keys = rng.subset(&owned(OBJECTS), 70);
    keys.extend(rng.subset(&storage_class_keys(), 50));
    keys.extend(rng.subset(&owned(COUNTS), 50));
    plans.push(plan("objects", keys));

    // Every pod scope on its own.
    for (name, scope) in [
        ("terminating", "Terminating"),
        ("not-terminating", "NotTerminating"),
        ("best-effort", "BestEffort"),
        ("not-best-effort", "NotBestEffort"),
        ("cross-namespace", "CrossNamespacePodAffinity"),
    ] {
        let mut p = plan(name, pod_scoped_keys(rng, scope == "BestEffort"));
        exists_scope(rng, scope, &mut p);
        plans.push(p);
    }

    // PriorityClass with every operator, and bare in spec.scopes (no operator).
    for (name, operator) in [
        ("priority-in", "In"),
        ("priority-notin", "NotIn"),
        ("priority-exists", "Exists"),
        ("priority-dne", "DoesNotExist"),
    ] {
        let mut p = plan(name, pod_scoped_keys(rng, false));
        let mut requirement = priority_requirement(rng);
        requirement.operator = operator;
        if matches!(operator, "Exists" | "DoesNotExist") {
            requirement.values.clear();
        } else if requirement.values.is_empty() {
            requirement.values.push(PRIORITY_CLASSES[0].into());
        }
        p.selector.push(requirement);
        plans.push(p);
    }
    let mut p = plan("priority-bare", pod_scoped_keys(rng, false));
    p.scopes.push("PriorityClass");
    plans.push(p);

    // Random combinations of pod scopes.
    for i in 0..2 {
        let best_effort = rng.chance(30);
        let mut p = plan(&format!("combo-{i}"), pod_scoped_keys(rng, best_effort));
        let terminating = *rng.pick(&["Terminating", "NotTerminating"]);
        exists_scope(rng, terminating, &mut p);
        exists_scope(
            rng,
            if best_effort {
                "BestEffort"
            } else {
                "NotBestEffort"
            },
            &mut p,
        );
        if rng.chance(60) {
            p.selector.push(priority_requirement(rng));
        }
        if rng.chance(30) {
            exists_scope(rng, "CrossNamespacePodAffinity", &mut p);
        }
        plans.push(p);
    }

    // VolumeAttributesClass: PVC names plus non-standard ones.
    let mut keys = rng.subset(&owned(&["persistentvolumeclaims", "requests.storage"]), 80);
    keys.extend(rng.subset(&storage_class_keys(), 40));
    keys.extend(
        owned(&["count/persistentvolumeclaims", "count/pods", "count/configmaps"])
            .into_iter()
            .filter(|_| rng.chance(50)),
    );
    let mut p = plan("volume-attributes", keys);
    p.selector.push(match rng.below(4) {
        0 => Requirement {
            scope: "VolumeAttributesClass",
            operator: "In",
            values: rng.subset(&owned(&VOLUME_ATTRIBUTES_CLASSES), 50),
        },
        1 => Requirement {
            scope: "VolumeAttributesClass",
            operator: "NotIn",
            values: rng.subset(&owned(&VOLUME_ATTRIBUTES_CLASSES), 50),
        },
        2 => Requirement::exists("VolumeAttributesClass"),
        _ => Requirement {
            scope: "VolumeAttributesClass",
            operator: "DoesNotExist",
            values: Vec::new(),
        },
    });
    plans.push(p);

    // Last, so that no other quota exists yet when it counts quotas... and so that creating
    // the others is never charged against it.
    let mut keys = owned(&["resourcequotas", "count/resourcequotas"]);
    keys.extend(rng.subset(
        &owned(&["configmaps", "secrets", "count/serviceaccounts", "pods", "cpu"]),
        50,
    ));
    plans.push(plan("last", keys));
    plans
}

// ---------------------------------------------------------------------------------------------
// Creation.

async fn create_idempotent<K>(api: &Api<K>, body: Value, seed: u64, what: &str) -> Result<(), Error>
where
    K: kube::Resource + Clone + fmt::Debug + DeserializeOwned + Serialize,
{
    let object: K = serde_json::from_value(body).expect("fixture bodies are valid objects");
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(source) => Err(Error::Kube {
            seed,
            what: what.to_owned(),
            source,
        }),
    }
}

async fn create<K>(api: &Api<K>, body: &Value, seed: u64) -> Result<K, Error>
where
    K: kube::Resource + Clone + fmt::Debug + DeserializeOwned + Serialize,
{
    let object: K = serde_json::from_value(body.clone()).expect("fixture bodies are valid objects");
    api.create(&PostParams::default(), &object)
        .await
        .map_err(|source| Error::Kube {
            seed,
            what: format!("creating {body}"),
            source,
        })
}

/// Creates the cluster-scoped helpers (priority classes, runtime classes with overhead) if
/// they do not exist yet.
pub async fn ensure_cluster_objects(client: &kube::Client, seed: u64) -> Result<(), Error> {
    let priority_classes = Api::<PriorityClass>::all(client.clone());
    for (name, value) in PRIORITY_CLASSES.iter().zip([10, 100, 1000]) {
        let body = json!({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": { "name": name }, "value": value,
        });
        create_idempotent(
            &priority_classes,
            body,
            seed,
            &format!("creating priority class {name}"),
        )
        .await?;
    }
    let runtime_classes = Api::<RuntimeClass>::all(client.clone());
    for (name, overhead) in RUNTIME_CLASSES.iter().zip([
        json!({ "cpu": "250m", "memory": "120Mi" }),
        json!({ "cpu": "0.1", "memory": "100M" }),
    ]) {
        let body = json!({
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
            "metadata": { "name": name }, "handler": "lqfixture",
            "overhead": { "podFixed": overhead },
        });
        create_idempotent(
            &runtime_classes,
            body,
            seed,
            &format!("creating runtime class {name}"),
        )
        .await?;
    }
    if dra_served(client).await {
        let device_classes = Api::<DeviceClass>::all(client.clone());
        for (name, extended) in DEVICE_CLASSES[..2]
            .iter()
            .zip([Some(DRA_EXTENDED_RESOURCE), None])
        {
            // Before DRAExtendedResource the server drops `extendedResourceName`.
            let mut spec = json!({});
            if let Some(extended) = extended {
                spec["extendedResourceName"] = json!(extended);
            }
            let body = json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": { "name": name }, "spec": spec,
            });
            create_idempotent(
                &device_classes,
                body,
                seed,
                &format!("creating device class {name}"),
            )
            .await?;
        }
    }
    Ok(())
}

/// Whether the server serves `resource.k8s.io/v1` (DRA; GA from 1.34).
pub async fn dra_served(client: &kube::Client) -> bool {
    Api::<DeviceClass>::all(client.clone())
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
        .is_ok()
}

/// A device request: exactly one class, or `firstAvailable` alternatives.
fn device_request(rng: &mut SplitMix64, name: &str) -> Value {
    let exact = |rng: &mut SplitMix64| {
        let mut request = json!({ "deviceClassName": rng.pick(&DEVICE_CLASSES) });
        if rng.chance(20) {
            request["allocationMode"] = json!("All");
        } else {
            request["allocationMode"] = json!("ExactCount");
            request["count"] = json!(rng.range(1, 5));
        }
        request
    };
    if rng.chance(30) {
        let subrequests: Vec<Value> = (0..rng.range(1, 4))
            .map(|i| {
                let mut sub = exact(rng);
                sub["name"] = json!(format!("alt{i}"));
                sub
            })
            .collect();
        json!({ "name": name, "firstAvailable": subrequests })
    } else {
        json!({ "name": name, "exactly": exact(rng) })
    }
}

/// ResourceClaims, and pods requesting `example.com/foo` that own extended-resource claims.
async fn dra_objects(ns: &TestNamespace, seed: u64, fixture: &mut Fixture) -> Result<(), Error> {
    // A generator of its own: the other objects of a seed do not depend on whether DRA is served.
    let mut rng = SplitMix64::new(seed ^ 0xD7A0_0000);
    let kube_error = |what: String| move |source: kube::Error| Error::Kube { seed, what, source };
    let claims = ns.api::<ResourceClaim>();
    for index in 0..rng.range(2, 7) {
        let requests: Vec<Value> = (0..rng.range(1, 4))
            .map(|i| device_request(&mut rng, &format!("r{i}")))
            .collect();
        let body = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": { "name": format!("claim-{index:02}") },
            "spec": { "devices": { "requests": requests } },
        });
        create::<ResourceClaim>(&claims, &body, seed).await?;
        fixture.summary.claims += 1;
    }
    let pods = ns.api::<Pod>();
    for index in 0..rng.range(1, 4) {
        let name = format!("dra-pod-{index}");
        let devices = rng.range(1, 4);
        let body = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name },
            "spec": { "containers": [{ "name": "app", "image": IMAGE, "resources": {
                "requests": { DRA_EXTENDED_RESOURCE: devices.to_string() },
                "limits": { DRA_EXTENDED_RESOURCE: devices.to_string() },
            }}]},
        });
        let pod = create::<Pod>(&pods, &body, seed).await?;
        fixture.summary.pods += 1;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        // One or two claims, as the scheduler makes them; created in the same second, so
        // the first-claim rule falls back to their names.
        let owned = rng.range(1, 3);
        for claim_index in 0..owned {
            let claim_name = format!("{name}-extended-{claim_index}");
            let body = json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {
                    "name": claim_name,
                    "annotations": { "resource.kubernetes.io/extended-resource-claim": "true" },
                    "ownerReferences": [{ "apiVersion": "v1", "kind": "Pod", "name": name,
                        "uid": uid, "controller": rng.chance(85) }],
                },
                "spec": { "devices": { "requests": [{ "name": "container-0-request-0",
                    "exactly": { "deviceClassName": *rng.pick(&DEVICE_CLASSES[..2]),
                        "allocationMode": "ExactCount", "count": rng.range(1, 5) } }] } },
            });
            create::<ResourceClaim>(&claims, &body, seed).await?;
            fixture.summary.claims += 1;
        }
        if rng.chance(50) {
            let named = format!("{name}-extended-{}", rng.below(owned));
            let status = json!({ "status": { "extendedResourceClaimStatus": {
                "resourceClaimName": named,
                "requestMappings": [{ "containerName": "app", "resourceName": DRA_EXTENDED_RESOURCE,
                    "requestName": "container-0-request-0" }],
            }}});
            // Dropped by servers without DRAExtendedResource; that is fine.
            pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .map_err(kube_error(format!("setting the status of pod {name}: {status}")))?;
        }
    }
    Ok(())
}

/// A quota over the DRA key families (its own generator, like [`dra_objects`]).
fn dra_quota_plan(seed: u64) -> QuotaPlan {
    let mut rng = SplitMix64::new(seed ^ 0xD7A0_0001);
    let mut keys = vec!["count/resourceclaims.resource.k8s.io".to_owned()];
    for class in DEVICE_CLASSES {
        keys.extend(rng.subset(
            &[
                format!("{class}.deviceclass.resource.k8s.io/devices"),
                format!("requests.deviceclass.resource.kubernetes.io/{class}"),
            ],
            70,
        ));
    }
    keys.extend(rng.subset(
        &owned(&[
            "requests.example.com/foo",
            "requests.example.com/bar",
            "count/pods",
        ]),
        70,
    ));
    QuotaPlan {
        name: "dra".to_owned(),
        hard: keys,
        scopes: Vec::new(),
        selector: Vec::new(),
    }
}

/// Waits for what KCM puts in every new namespace (the `default` ServiceAccount, needed to
/// create pods, and the root CA ConfigMap, which must not appear after the quotas).
async fn wait_for_namespace_defaults(ns: &TestNamespace, seed: u64) -> Result<(), Error> {
    let accounts = ns.api::<ServiceAccount>();
    let configmaps = ns.api::<ConfigMap>();
    eventually(Duration::from_secs(30), || {
        let (accounts, configmaps) = (accounts.clone(), configmaps.clone());
        async move {
            accounts.get_opt("default").await.ok()??;
            configmaps.get_opt("kube-root-ca.crt").await.ok()??;
            Some(())
        }
    })
    .await
    .ok_or_else(|| Error::Timeout {
        seed,
        what: format!(
            "the default ServiceAccount and root CA ConfigMap in {}",
            ns.name()
        ),
    })
}

/// Populates `ns` from `seed`: objects first (with their statuses and deletions), then quotas.
///
/// The quotas are created but not awaited: see [`Fixture::wait_for_status`] and
/// [`Fixture::force_recalculation`]. Call [`Fixture::release`] before deleting the namespace.
#[allow(clippy::too_many_lines)] // a linear script of object creation
pub async fn populate(ns: &TestNamespace, seed: u64) -> Result<Fixture, Error> {
    let mut rng = SplitMix64::new(seed);
    let client = ns.client();
    ensure_cluster_objects(&client, seed).await?;
    wait_for_namespace_defaults(ns, seed).await?;
    let mut fixture = Fixture {
        seed,
        namespace: ns.name().to_owned(),
        quotas: Vec::new(),
        summary: Summary::default(),
        finalized_pods: Vec::new(),
        pvcs: Vec::new(),
    };
    let kube_error = |what: String| move |source: kube::Error| Error::Kube { seed, what, source };

    // Pods.
    let pods = ns.api::<Pod>();
    for index in 0..usize::try_from(rng.range(10, 18)).unwrap_or(10) {
        let plan = pod_plan(&mut rng, index);
        create::<Pod>(&pods, &plan.body, seed).await?;
        if let Some(status) = &plan.status {
            pods.patch_status(&plan.name, &PatchParams::default(), &Patch::Merge(status))
                .await
                .map_err(kube_error(format!(
                    "setting the status of pod {}: {status}",
                    plan.name
                )))?;
        }
        match plan.deletion {
            Deletion::No => {}
            Deletion::PastGrace | Deletion::WithinGrace => {
                let grace = if plan.deletion == Deletion::WithinGrace {
                    3600
                } else {
                    0
                };
                let params = DeleteParams {
                    grace_period_seconds: Some(grace),
                    ..DeleteParams::default()
                };
                pods.delete(&plan.name, &params)
                    .await
                    .map_err(kube_error(format!("deleting pod {}", plan.name)))?;
                fixture.finalized_pods.push(plan.name.clone());
                fixture.summary.terminating_pods += 1;
            }
        }
        fixture.summary.pods += 1;
        fixture.summary.terminal_pods += usize::from(plan.terminal);
    }

    // Services: one of each type, then random ones. Explicit node ports are cluster-wide, so
    // a clash with another namespace is retried with other ports, then with allocated ones.
    let services = ns.api::<Service>();
    let types = ["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"];
    let extra = rng.range(1, 5);
    for index in 0..4 + extra {
        let service_type = if index < 4 {
            types[usize::try_from(index).unwrap_or(0)]
        } else {
            *rng.pick(&types)
        };
        let name = format!("svc-{index:02}");
        let mut body = service_body(&mut rng, &name, service_type);
        // Retries draw from their own generator, so a clash does not change the rest of the
        // fixture: the seed still determines every other object.
        let mut retry_rng = SplitMix64::new(seed ^ (index << 32) ^ 0x5EED);
        let mut attempt = 0;
        loop {
            match create::<Service>(&services, &body, seed).await {
                Ok(_) => break,
                Err(Error::Kube {
                    source: kube::Error::Api(status),
                    ..
                }) if status.code == 422 && status.message.contains("already allocated") && attempt < 8 => {
                    attempt += 1;
                    repick_node_ports(&mut body, &mut retry_rng, attempt < 8);
                }
                Err(e) => return Err(e),
            }
        }
        fixture.summary.services += 1;
    }

    // PVCs.
    let pvcs = ns.api::<PersistentVolumeClaim>();
    for index in 0..rng.range(3, 8) {
        let name = format!("pvc-{index:02}");
        let plan = pvc_plan(&mut rng, &name);
        create::<PersistentVolumeClaim>(&pvcs, &plan.body, seed).await?;
        if let Some(status) = &plan.status {
            pvcs.patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                .await
                .map_err(kube_error(format!("setting the status of pvc {name}: {status}")))?;
        }
        if plan.delete {
            pvcs.delete(&name, &DeleteParams::default())
                .await
                .map_err(kube_error(format!("deleting pvc {name}")))?;
        }
        fixture.pvcs.push(name);
        fixture.summary.pvcs += 1;
    }

    // ConfigMaps, secrets, deployments.
    let configmaps = ns.api::<ConfigMap>();
    for index in 0..rng.below(5) {
        let body = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": format!("cm-{index}") }, "data": { "k": "v" },
        });
        create::<ConfigMap>(&configmaps, &body, seed).await?;
        fixture.summary.configmaps += 1;
    }
    let secrets = ns.api::<Secret>();
    for index in 0..rng.below(5) {
        let body = json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": { "name": format!("secret-{index}") }, "stringData": { "k": "v" },
        });
        create::<Secret>(&secrets, &body, seed).await?;
        fixture.summary.secrets += 1;
    }
    let deployments = ns.api::<Deployment>();
    for index in 0..rng.below(3) {
        let body = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": { "name": format!("deploy-{index}") },
            "spec": {
                "replicas": 0,
                "selector": { "matchLabels": { "deploy": format!("d{index}") } },
                "template": {
                    "metadata": { "labels": { "deploy": format!("d{index}") } },
                    "spec": { "containers": [{ "name": "app", "image": IMAGE }] },
                },
            },
        });
        create::<Deployment>(&deployments, &body, seed).await?;
        fixture.summary.deployments += 1;
    }

    let dra = dra_served(&client).await;
    if dra {
        dra_objects(ns, seed, &mut fixture).await?;
    }

    // Quotas, last.
    let quotas = ns.api::<ResourceQuota>();
    let mut plans = quota_plans(&mut rng);
    if dra {
        // Before "last", which counts the quotas.
        plans.insert(plans.len() - 1, dra_quota_plan(seed));
    }
    for plan in plans {
        let body = plan.body(&mut rng);
        create::<ResourceQuota>(&quotas, &body, seed).await?;
        fixture.quotas.push(plan.name);
        fixture.summary.quotas += 1;
    }
    Ok(fixture)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generator_is_deterministic() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let plans_a: Vec<Value> = (0..20).map(|i| pod_plan(&mut a, i).body).collect();
        let plans_b: Vec<Value> = (0..20).map(|i| pod_plan(&mut b, i).body).collect();
        assert_eq!(plans_a, plans_b);
    }

    #[test]
    fn every_body_deserializes() {
        let mut rng = SplitMix64::new(1);
        for i in 0..200 {
            let plan = pod_plan(&mut rng, i);
            serde_json::from_value::<Pod>(plan.body).expect("pod");
            let pvc = pvc_plan(&mut rng, "p");
            serde_json::from_value::<PersistentVolumeClaim>(pvc.body).expect("pvc");
            let service = service_body(&mut rng, "s", "LoadBalancer");
            serde_json::from_value::<Service>(service).expect("service");
        }
        for plan in quota_plans(&mut rng) {
            serde_json::from_value::<ResourceQuota>(plan.body(&mut rng)).expect("quota");
        }
    }

    #[test]
    fn spellings_are_exact() {
        let mut rng = SplitMix64::new(3);
        for _ in 0..500 {
            let value = memory_bytes(&mut rng);
            let spelled = bytes(&mut rng, value);
            assert!(!spelled.is_empty());
            let millis = cpu_millis(&mut rng);
            assert!(!cpu(&mut rng, millis).is_empty());
        }
        assert_eq!(canonical_number("1Gi"), Some(1 << 30));
        assert_eq!(canonical_number("100k"), Some(100_000));
    }
}
