//! The resourceclaims evaluator (`pkg/quota/v1/evaluator/core/resource_claims.go`, DRA) over a
//! compact projection of each ResourceClaim, with the DeviceClass mapping it reads.
//!
//! Per claim, upstream charges (the same in v1.34–v1.37; v1.33 has the v1beta1 shape):
//! - `count/resourceclaims.resource.k8s.io`: 1;
//! - `<class>.deviceclass.resource.k8s.io/devices`: per request, its device count by class —
//!   `ExactCount` its `count`, `All` the worst case ([`ALLOCATION_RESULTS_MAX_SIZE`]), an
//!   unknown mode 0; for a `firstAvailable` request, per class the maximum over its
//!   subrequests. Admin-access requests are charged like any other (the evaluator does not
//!   look at `adminAccess` in any of these releases).
//! - with `DRAExtendedResource`: per class charged above, `requests.deviceclass.resource.
//!   kubernetes.io/<class>` and, if a DeviceClass maps the class to an extended resource `E`
//!   (`spec.extendedResourceName`), `requests.E` — each less what the claim's pod already
//!   charges for it when the claim is the pod's verified extended-resource claim, and only
//!   when positive.
//!
//! The evaluator matches no scope. It matches `count/resourceclaims.resource.k8s.io`, every
//! `*.deviceclass.resource.k8s.io/devices`, and with `DRAExtendedResource`
//! `requests.deviceclass.resource.kubernetes.io/<class>` when the class exists and
//! `requests.E` when some DeviceClass maps `E`.
//!
//! Cost: [`ClaimProjection`] is 24 bytes inline plus 32 bytes per requested class (the class
//! name is interned and shared); an extended-resource claim adds its pod's name and uid and its
//! own name (one allocation).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::gates::FeatureGates;
use crate::intern::Interner;
use crate::names::{
    COUNT_RESOURCE_CLAIMS, DEVICE_CLASS_DEVICES_SUFFIX, DEVICE_CLASS_RESOURCE_PREFIX,
    REQUESTS_DEVICE_CLASS_PREFIX, REQUESTS_PREFIX, is_extended_resource_name_for_quota,
};
use crate::pod::PodClaimIdentity;
use crate::quantity::{Format, Quantity};
use crate::time::Time;
use crate::usage::ResourceList;

/// `resourceapi.AllocationResultsMaxSize`: what a request for `All` devices is charged.
pub const ALLOCATION_RESULTS_MAX_SIZE: i64 = 32;
/// `resourceapi.ExtendedResourceClaimAnnotation`: marks a claim the scheduler made for a pod's
/// extended-resource requests.
pub const EXTENDED_RESOURCE_CLAIM_ANNOTATION: &str = "resource.kubernetes.io/extended-resource-claim";

/// The pod an extended-resource claim belongs to (its controller reference), and what the
/// first-claim rule compares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimOwner {
    /// The store ids of the owning pod: in its namespace's partition (by name) and in the
    /// all-namespaces partition (by `<namespace>/<name>`), from the caller's id function.
    pub pod_ids: [u64; 2],
    /// The controller reference's uid.
    pub pod_uid: Box<str>,
    /// The claim's own name.
    pub claim_name: Box<str>,
    /// The claim's `creationTimestamp`.
    pub created: Option<Time>,
}

impl ClaimOwner {
    /// The owning pod's store id in a partition of one namespace, or (`all`) of every one.
    pub fn pod_id(&self, all: bool) -> u64 {
        self.pod_ids[usize::from(all)]
    }
}

/// What quota needs of a ResourceClaim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimProjection {
    /// Devices charged per DeviceClass (interned class name), summed over requests, sorted by
    /// class.
    devices: Box<[(Arc<str>, i128)]>,
    /// Set only for an annotated claim whose controller is a `v1` Pod.
    owner: Option<Box<ClaimOwner>>,
}

fn mode_count(mode: Option<&str>, count: Option<i64>) -> i64 {
    // Defaulting sets the mode (and a count of 1), so a stored object has both; Go reads a
    // missing one as "" or 0, as here.
    match mode {
        Some("ExactCount") => count.unwrap_or(0),
        Some("All") => ALLOCATION_RESULTS_MAX_SIZE,
        // Could happen after a downgrade: upstream charges nothing for an unknown mode.
        Some(_) | None => 0,
    }
}

impl ClaimProjection {
    /// Extracts the projection of a claim. `pod_id` maps a pod's name (or `<namespace>/<name>`)
    /// to its store id.
    pub fn from_claim(claim: &ResourceClaim, interner: &Interner, pod_id: &dyn Fn(&str) -> u64) -> Self {
        let mut devices: BTreeMap<Arc<str>, i128> = BTreeMap::new();
        let requests = claim
            .spec
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.requests.as_deref())
            .unwrap_or_default();
        for request in requests {
            match (&request.first_available, &request.exactly) {
                (Some(subrequests), _) if !subrequests.is_empty() => {
                    // The worst case per class over the alternatives.
                    let mut worst: BTreeMap<&str, i64> = BTreeMap::new();
                    for sub in subrequests {
                        let n = mode_count(sub.allocation_mode.as_deref(), sub.count);
                        let slot = worst.entry(&sub.device_class_name).or_insert(0);
                        *slot = (*slot).max(n);
                    }
                    for (class, n) in worst {
                        *devices.entry(interner.intern(class)).or_insert(0) += i128::from(n);
                    }
                }
                (_, Some(exactly)) => {
                    let n = mode_count(exactly.allocation_mode.as_deref(), exactly.count);
                    *devices
                        .entry(interner.intern(&exactly.device_class_name))
                        .or_insert(0) += i128::from(n);
                }
                // Some unknown, future request type: upstream cannot quota it either.
                _ => {}
            }
        }
        let metadata = &claim.metadata;
        let annotated = metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION))
            .is_some_and(|v| v == "true");
        let controller = metadata
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true))
            .filter(|r| r.kind == "Pod" && r.api_version == "v1");
        let owner = controller.filter(|_| annotated).map(|r| {
            Box::new(ClaimOwner {
                pod_ids: [
                    pod_id(&r.name),
                    pod_id(&format!(
                        "{}/{}",
                        metadata.namespace.as_deref().unwrap_or_default(),
                        r.name
                    )),
                ],
                pod_uid: r.uid.as_str().into(),
                claim_name: metadata.name.as_deref().unwrap_or_default().into(),
                created: metadata.creation_timestamp.as_ref().map(Time::from_k8s),
            })
        });
        Self {
            devices: devices.into_iter().collect(),
            owner,
        }
    }

    /// Devices charged per class.
    pub fn devices(&self) -> &[(Arc<str>, i128)] {
        &self.devices
    }

    /// The owning pod, for an extended-resource claim.
    pub fn owner(&self) -> Option<&ClaimOwner> {
        self.owner.as_deref()
    }

    /// Heap bytes owned (interned class names are shared and not counted).
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.devices)
            + self.owner.as_deref().map_or(0, |o| {
                size_of::<ClaimOwner>() + o.pod_uid.len() + o.claim_name.len()
            })
    }
}

/// One DeviceClass as the mapping needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ClassEntry {
    extended: Option<Box<str>>,
}

/// The DeviceClasses of a cluster as upstream's `ExtendedResourceCache` maps them: class to
/// its `spec.extendedResourceName`, and every resource name a class answers to (its own
/// `deviceclass.resource.kubernetes.io/<class>` and its extended resource name).
///
/// Upstream's cache is updated event by event: when two classes name the same extended
/// resource and the one it kept is deleted, it forgets the name until the other class is
/// updated. This map is a function of the classes that exist, so it still maps the name then.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceClassMap {
    classes: BTreeMap<Box<str>, ClassEntry>,
}

impl DeviceClassMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a class by name.
    pub fn apply(&mut self, name: &str, extended_resource_name: Option<&str>) {
        self.classes.insert(
            name.into(),
            ClassEntry {
                extended: extended_resource_name.map(Into::into),
            },
        );
    }

    /// Removes a class.
    pub fn remove(&mut self, name: &str) {
        self.classes.remove(name);
    }

    /// Replaces every class (a relist).
    pub fn reset<'a>(&mut self, classes: impl IntoIterator<Item = (&'a str, Option<&'a str>)>) {
        self.classes.clear();
        for (name, extended) in classes {
            self.apply(name, extended);
        }
    }

    /// `GetExtendedResource`: the extended resource name a class maps to.
    pub fn extended_resource(&self, class: &str) -> Option<&str> {
        self.classes.get(class).and_then(|c| c.extended.as_deref())
    }

    /// `GetDeviceClass(name) != nil`: whether some class answers to a resource name.
    pub fn maps_resource(&self, resource: &str) -> bool {
        if let Some(class) = resource.strip_prefix(DEVICE_CLASS_RESOURCE_PREFIX)
            && self.classes.contains_key(class)
        {
            return true;
        }
        self.classes
            .values()
            .any(|c| c.extended.as_deref() == Some(resource))
    }

    /// Number of classes held.
    pub fn len(&self) -> usize {
        self.classes.len()
    }

    /// Whether no class is held.
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }

    /// Heap bytes held (names and entries; the tree's nodes estimated at their payload).
    pub fn heap_bytes(&self) -> usize {
        self.classes
            .iter()
            .map(|(k, v)| {
                k.len() + size_of::<(Box<str>, ClassEntry)>() + v.extended.as_deref().map_or(0, str::len)
            })
            .sum()
    }
}

/// `claimEvaluator.MatchingResources` with the DeviceClass mapping: whether the evaluator
/// matches `key`.
pub fn claim_matches_key(key: &str, gates: FeatureGates, classes: &DeviceClassMap) -> bool {
    if key == COUNT_RESOURCE_CLAIMS || key.ends_with(DEVICE_CLASS_DEVICES_SUFFIX) {
        return true;
    }
    if !gates.dra_extended_resource {
        return false;
    }
    if let Some(class) = key.strip_prefix(REQUESTS_DEVICE_CLASS_PREFIX)
        && classes.extended_resource(class).is_some()
    {
        return true;
    }
    is_extended_resource_name_for_quota(key, gates.minor)
        && classes.maps_resource(&key[REQUESTS_PREFIX.len()..])
}

/// A claim's usage (`claimEvaluator.Usage`): `pod_usage` is what its pod charges, when the
/// claim is the pod's verified extended-resource claim ([`verified_owner`]).
pub fn claim_usage(
    claim: &ClaimProjection,
    gates: FeatureGates,
    classes: &DeviceClassMap,
    pod_usage: Option<&ResourceList>,
) -> ResourceList {
    let mut result = ResourceList::new();
    result.insert(COUNT_RESOURCE_CLAIMS.to_owned(), Quantity::from_count(1));
    for (class, n) in claim.devices() {
        result.insert(
            format!("{class}{DEVICE_CLASS_DEVICES_SUFFIX}"),
            devices_quantity(*n),
        );
    }
    if gates.dra_extended_resource {
        let mut extended: BTreeMap<String, Quantity> = BTreeMap::new();
        for (class, n) in claim.devices().iter().filter(|(c, _)| !c.is_empty()) {
            let q = devices_quantity(*n);
            extended.insert(format!("{REQUESTS_DEVICE_CLASS_PREFIX}{class}"), q.clone());
            if let Some(name) = classes.extended_resource(class) {
                // Two classes naming the same resource: upstream keeps one of them, in Go's
                // random map order; the first class by name is kept here.
                extended.entry(format!("{REQUESTS_PREFIX}{name}")).or_insert(q);
            }
        }
        for (name, q) in extended {
            let q = match pod_usage.and_then(|u| u.get(&name)) {
                Some(charged) => q.sub(charged),
                None => q,
            };
            // Unknown (the pod's charge could not be held) is kept: every sum it enters is
            // unknown, so the key is withheld rather than undercounted.
            if q.is_positive() != Some(false) {
                result.insert(name, q);
            }
        }
    }
    result
}

fn devices_quantity(n: i128) -> Quantity {
    n.checked_mul(1_000_000_000).map_or_else(
        || Quantity::from_big_nanos(num_bigint::BigInt::from(n) * 1_000_000_000, Format::DecimalSI),
        |nanos| Quantity::from_nanos(nanos, Format::DecimalSI),
    )
}

/// `getVerifiedPodUsage`'s checks: the claim's owning pod exists with the referenced uid, its
/// `extendedResourceClaimStatus` names this claim when set and — from 1.36, when it is not
/// set — no other claim owned by the same pod uid was created earlier (or at the same time
/// with a smaller name). `pod` is the pod found by the owner's id; `siblings` every claim of
/// the partition.
pub fn verified_owner<'c>(
    claim: &ClaimProjection,
    pod: Option<PodClaimIdentity<'_>>,
    siblings: impl IntoIterator<Item = &'c ClaimProjection>,
    gates: FeatureGates,
) -> bool {
    let (Some(owner), Some(pod)) = (claim.owner(), pod) else {
        return false;
    };
    if *owner.pod_uid != *pod.uid {
        return false;
    }
    match pod.extended_resource_claim {
        Some(name) => name == &*owner.claim_name,
        None if gates.minor < 36 => true,
        None => siblings
            .into_iter()
            .filter_map(ClaimProjection::owner)
            .filter(|o| o.pod_uid == owner.pod_uid)
            .all(|o| match o.created.cmp(&owner.created) {
                std::cmp::Ordering::Less => false,
                std::cmp::Ordering::Equal => o.claim_name >= owner.claim_name,
                std::cmp::Ordering::Greater => true,
            }),
    }
}

#[cfg(test)]
mod tests;
