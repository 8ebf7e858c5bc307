//! Pure ResourceQuota semantics, value-equal to the upstream kube-controller-manager.
//!
//! No IO, no kube client and no clock of its own: time is passed in as [`Time`].
//!
//! The flow of one quota sync, mirroring `syncResourceQuota`:
//! 1. [`QuotaSpec::from_resource_quota`] reads the hard keys and scopes.
//! 2. [`Registry::plan`] picks the evaluators and the keys each computes
//!    (`quota.CalculateUsage`, first half).
//! 3. Per evaluator, [`calculate_usage`] over the namespace's projections
//!    ([`PodProjection`], [`ServiceProjection`], [`PvcProjection`]), [`claim_usage`] over
//!    [`ClaimProjection`]s with the cluster's [`DeviceClassMap`], or
//!    [`calculate_object_count_usage`] for metadata-only counts (`CalculateUsageStats`).
//! 4. [`UsagePlan::merge`] sums them and drops the keys of failed evaluators.
//! 5. [`assemble_status`] decides the new `status` and whether to write it.
//!
//! [`plan_key`] tells an index what to watch for a key; the `*_update_triggers` functions are
//! upstream's update filter.

#![forbid(unsafe_code)]

pub mod claim;
pub mod evaluator;
pub mod gates;
pub mod intern;
pub mod list;
pub mod names;
pub mod pod;
pub mod pvc;
pub mod quantity;
pub mod scope;
pub mod service;
pub mod spec;
pub mod status;
pub mod time;
pub mod update_filter;
pub mod usage;

pub use claim::{ClaimProjection, DeviceClassMap, claim_matches_key, claim_usage, verified_owner};
pub use evaluator::{
    Evaluator, KeyPlan, Projection, Registry, UsagePlan, WatchNeed, calculate_object_count_usage,
    counted_by_list, evaluator_for_resource, evaluators_for_key, plan_key,
};
pub use gates::FeatureGates;
pub use intern::Interner;
pub use list::{Quantities, QuantityList};
pub use names::{GroupResource, QuotaResourceName, classify};
pub use pod::{ExtractError, Extracted, PodClaimIdentity, PodProjection, PodScopeClass};
pub use pvc::PvcProjection;
pub use quantity::{CompactQuantity, Format, Quantity, QuantityError};
pub use scope::{QuotaScopes, ScopeError, ScopeName, ScopeOperator, ScopeRequirement};
pub use service::{QuotaServiceType, ServiceProjection};
pub use spec::{QuotaSpec, SpecProblem};
pub use status::{StatusDecision, assemble_status, assemble_status_for, lists_equal, same_value};
pub use time::Time;
pub use update_filter::{
    other_update_triggers, pod_update_triggers, pvc_update_triggers, service_update_triggers,
};
pub use usage::{QuotaObject, ResourceList, ScopeClassed, UsageKey, UsageStats, calculate_usage};
