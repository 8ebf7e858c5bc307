//! The persistentvolumeclaims evaluator
//! (`pkg/quota/v1/evaluator/core/persistent_volume_claims.go`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::gates::FeatureGates;
use crate::intern::Interner;
use crate::names::{
    COUNT_PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUME_CLAIMS, REQUESTS_STORAGE, STORAGE, STORAGE_CLASS_SUFFIX,
};
use crate::pod::{Extracted, parse_lossy};
use crate::quantity::{CompactQuantity, Quantity};
use crate::scope::{ScopeError, ScopeName, ScopeOperator, ScopeRequirement, selector_matches};
use crate::time::Time;
use crate::usage::{QuotaObject, ScopeClassed, UsageKey};

/// The beta storage-class annotation, which wins over `spec.storageClassName`.
pub const BETA_STORAGE_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

/// What quota needs of a PVC: 48 bytes inline; heap only for VolumeAttributesClass names
/// (the names themselves are interned).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PvcProjection {
    storage_class: Option<Arc<str>>,
    /// The `requests.storage` charge (`getStorageUsage`), absent without a spec request.
    storage: Option<CompactQuantity>,
    /// Referenced VolumeAttributesClass names, deduplicated.
    volume_attributes_classes: Option<Box<[Arc<str>]>>,
}

impl PvcProjection {
    /// Extracts the projection of a typed PVC.
    pub fn from_pvc(pvc: &PersistentVolumeClaim, interner: &Interner) -> Extracted<Self> {
        let spec = pvc.spec.as_ref();
        let status = pvc.status.as_ref();
        // GetPersistentVolumeClaimClass: the annotation wins whenever present, even empty.
        let class = match pvc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(BETA_STORAGE_CLASS_ANNOTATION))
        {
            Some(class) => Some(class.as_str()),
            None => spec.and_then(|s| s.storage_class_name.as_deref()),
        };
        let mut problems = Vec::new();
        let mut parse = |q, field: &'static str| parse_lossy(q, &|| field.to_owned(), &mut problems);
        let requested = spec
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(STORAGE))
            .map(|q| parse(q, "spec.resources.requests[storage]"));
        let allocated = status
            .and_then(|s| s.allocated_resources.as_ref())
            .and_then(|r| r.get(STORAGE))
            .map(|q| parse(q, "status.allocatedResources[storage]"));
        // getStorageUsage: whole bytes (issue 94313); the allocated value wins when it is
        // larger than the rounded request (RecoverVolumeExpansionFailure), but only when a
        // request exists at all.
        let storage = requested.map(|requested| {
            let rounded = requested.round_up_to_integer().0;
            match allocated {
                Some(allocated) if allocated > rounded => allocated.round_up_to_integer().0,
                _ => rounded,
            }
        });
        let mut names: Vec<&str> = Vec::new();
        let candidates = [
            spec.and_then(|s| s.volume_attributes_class_name.as_deref()),
            status.and_then(|s| s.current_volume_attributes_class_name.as_deref()),
            status
                .and_then(|s| s.modify_volume_status.as_ref())
                .and_then(|m| m.target_volume_attributes_class_name.as_deref()),
        ];
        for name in candidates.into_iter().flatten() {
            if !name.is_empty() && !names.contains(&name) {
                names.push(name);
            }
        }
        let projection = Self {
            storage_class: class.filter(|c| !c.is_empty()).map(|c| interner.intern(c)),
            storage: storage.map(CompactQuantity::from),
            volume_attributes_classes: (!names.is_empty())
                .then(|| names.iter().map(|n| interner.intern(n)).collect()),
        };
        Extracted { projection, problems }
    }

    /// The storage class quota charges, if any.
    pub fn storage_class(&self) -> Option<&str> {
        self.storage_class.as_deref()
    }

    /// The `requests.storage` charge.
    pub fn storage(&self) -> Option<Quantity> {
        self.storage.as_ref().map(CompactQuantity::get)
    }

    /// Referenced VolumeAttributesClass names (spec, current, modification target).
    pub fn volume_attributes_classes(&self) -> impl Iterator<Item = &str> {
        self.volume_attributes_classes.iter().flatten().map(|n| &**n)
    }

    /// Heap bytes owned (interned names are shared and not counted).
    pub fn heap_bytes(&self) -> usize {
        self.storage.as_ref().map_or(0, CompactQuantity::heap_bytes)
            + self
                .volume_attributes_classes
                .as_deref()
                .map_or(0, std::mem::size_of_val)
    }
}

impl QuotaObject for PvcProjection {
    /// `pvcMatchesScopeFunc` with `VolumeAttributesClass` on, `MatchesNoScopeFunc` without.
    fn matches_scope(&self, requirement: &ScopeRequirement, gates: FeatureGates) -> Result<bool, ScopeError> {
        let names = self.volume_attributes_classes.as_deref().unwrap_or_default();
        volume_attributes_class_matches(names, requirement, gates)
    }

    fn for_each_usage(&self, _now: Time, emit: &mut dyn FnMut(UsageKey<'_>, Quantity)) {
        emit(UsageKey::name(PERSISTENT_VOLUME_CLAIMS), Quantity::from_count(1));
        emit(
            UsageKey::name(COUNT_PERSISTENT_VOLUME_CLAIMS),
            Quantity::from_count(1),
        );
        if let Some(class) = self.storage_class.as_deref() {
            emit(
                UsageKey::new("", class, STORAGE_CLASS_SUFFIX_PVCS),
                Quantity::from_count(1),
            );
        }
        if let Some(storage) = self.storage() {
            if let Some(class) = self.storage_class.as_deref() {
                emit(
                    UsageKey::new("", class, STORAGE_CLASS_SUFFIX_STORAGE),
                    storage.clone(),
                );
            }
            emit(UsageKey::name(REQUESTS_STORAGE), storage);
        }
    }
}

/// `.storageclass.storage.k8s.io/persistentvolumeclaims`.
const STORAGE_CLASS_SUFFIX_PVCS: &str = ".storageclass.storage.k8s.io/persistentvolumeclaims";
/// `.storageclass.storage.k8s.io/requests.storage`.
const STORAGE_CLASS_SUFFIX_STORAGE: &str = ".storageclass.storage.k8s.io/requests.storage";

// The suffixes above are spelled out because `concat!` cannot take constants; keep them in
// sync with the shared pieces.
const _: () = {
    assert!(STORAGE_CLASS_SUFFIX.len() + PERSISTENT_VOLUME_CLAIMS.len() == STORAGE_CLASS_SUFFIX_PVCS.len());
    assert!(STORAGE_CLASS_SUFFIX.len() + REQUESTS_STORAGE.len() == STORAGE_CLASS_SUFFIX_STORAGE.len());
};

impl ScopeClassed for PvcProjection {
    /// The VolumeAttributesClass names it references: all that scope matching reads.
    type Class = Option<Box<[Arc<str>]>>;

    fn scope_class(&self) -> Self::Class {
        self.volume_attributes_classes.clone()
    }

    fn is_of_class(&self, class: &Self::Class) -> bool {
        self.volume_attributes_classes == *class
    }

    fn class_matches_scope(
        class: &Self::Class,
        requirement: &ScopeRequirement,
        gates: FeatureGates,
    ) -> Result<bool, ScopeError> {
        volume_attributes_class_matches(class.as_deref().unwrap_or_default(), requirement, gates)
    }
}

/// `pvcMatchesScopeFunc` over a PVC's VolumeAttributesClass names.
fn volume_attributes_class_matches(
    names: &[Arc<str>],
    requirement: &ScopeRequirement,
    gates: FeatureGates,
) -> Result<bool, ScopeError> {
    if !gates.volume_attributes_class || requirement.scope != ScopeName::VolumeAttributesClass {
        return Ok(false);
    }
    if requirement.operator == ScopeOperator::Exists {
        return Ok(!names.is_empty());
    }
    if names.is_empty() {
        return selector_matches(requirement, None);
    }
    for name in names {
        if selector_matches(requirement, Some(name))? {
            return Ok(true);
        }
    }
    Ok(false)
}
