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

mod create;
mod pods;
mod pvcs;
mod quantities;
mod quotas;
mod services;

use create::{
    create, dra_objects, dra_quota_plan, dra_served, ensure_cluster_objects, wait_for_namespace_defaults,
};
use pods::{Deletion, pod_plan};
use pvcs::pvc_plan;
use quantities::{bytes, cpu, cpu_millis, memory_bytes};
use quotas::{QuotaPlan, owned, quota_plans};
use services::{repick_node_ports, service_body};

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
