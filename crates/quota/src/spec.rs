//! Parsing a `ResourceQuota` spec into what usage calculation needs, reporting every bad
//! entry separately so the rest keeps working.

use k8s_openapi::api::core::v1::ResourceQuota;

use crate::quantity::{Quantity, QuantityError};
use crate::scope::{QuotaScopes, ScopeName, ScopeOperator, ScopeRequirement, selector_matches};

/// One problem in a quota spec, naming the culprit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecProblem {
    /// A `spec.hard` value does not parse. The key is still computed (usage needs only the
    /// key), but its limit is unknown.
    #[error("spec.hard[{key}]: {source}")]
    HardQuantity {
        /// The hard key.
        key: String,
        /// Why the value was rejected (names the value).
        #[source]
        source: QuantityError,
    },
    /// A scope name Kubernetes does not know; it matches no object.
    #[error("unknown quota scope {scope:?}")]
    UnknownScope {
        /// The scope as written.
        scope: String,
    },
    /// A selector expression upstream cannot evaluate; usage calculation then stops at the
    /// first object, like upstream's `CalculateUsageStats`.
    #[error("scopeSelector {scope}: {reason}")]
    InvalidSelector {
        /// The scope of the expression.
        scope: String,
        /// What is wrong.
        reason: String,
    },
    /// A `scopeSelector` expression for a selector scope (PriorityClass,
    /// VolumeAttributesClass) without operator (API validation rejects it): upstream's selector
    /// conversion fails, so usage calculation stops at the first object. (`spec.scopes` entries
    /// are evaluated as `Exists` and never hit this.)
    #[error("scopeSelector {scope}: an expression without an operator cannot be evaluated")]
    ScopeWithoutOperator {
        /// The scope.
        scope: String,
    },
    /// Two scopes that exclude each other (`BestEffort` and `NotBestEffort`, ...).
    #[error("conflicting scopes {first} and {second}")]
    ConflictingScopes {
        /// One scope.
        first: String,
        /// The other.
        second: String,
    },
}

/// The parts of a `ResourceQuota` that usage calculation and status assembly need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaSpec {
    /// Every `spec.hard` key (parsed or not), sorted: these drive which usages are computed.
    /// A `Vec` of exactly the keys, not a B-tree: a quota has a handful of keys, and a tree's
    /// first node is a few hundred bytes whatever it holds. The values are not kept: only
    /// whether they parse (a [`SpecProblem`]), and `spec.hard` itself is copied verbatim.
    pub hard_keys: Vec<String>,
    /// `spec.scopes` and `spec.scopeSelector`, in evaluation order, kept even when invalid so
    /// results stay equal to upstream.
    pub scopes: QuotaScopes,
    /// Everything wrong with the spec, one entry per culprit.
    pub problems: Vec<SpecProblem>,
}

impl QuotaSpec {
    /// Parses the spec of a typed quota.
    pub fn from_resource_quota(quota: &ResourceQuota) -> Self {
        let spec = quota.spec.as_ref();
        let mut problems = Vec::new();
        let hard = spec.and_then(|s| s.hard.as_ref());
        // A B-tree map's keys: sorted and unique already.
        let hard_keys: Vec<String> = hard.into_iter().flat_map(|h| h.keys().cloned()).collect();
        for (key, value) in hard.into_iter().flatten() {
            if let Err(source) = Quantity::parse_k8s(value) {
                problems.push(SpecProblem::HardQuantity {
                    key: key.clone(),
                    source,
                });
            }
        }
        let scope_names = spec.and_then(|s| s.scopes.as_deref());
        let scopes = QuotaScopes::from_k8s(scope_names, spec.and_then(|s| s.scope_selector.as_ref()));
        for requirement in scopes.requirements() {
            problems.extend(check_requirement(requirement));
        }
        let names: Vec<ScopeName> = scopes.requirements().iter().map(|r| r.scope.clone()).collect();
        for (a, b) in [
            (ScopeName::BestEffort, ScopeName::NotBestEffort),
            (ScopeName::Terminating, ScopeName::NotTerminating),
        ] {
            if names.contains(&a) && names.contains(&b) {
                problems.push(SpecProblem::ConflictingScopes {
                    first: a.to_string(),
                    second: b.to_string(),
                });
            }
        }
        Self {
            hard_keys,
            scopes,
            problems,
        }
    }
}

fn check_requirement(requirement: &ScopeRequirement) -> Option<SpecProblem> {
    let scope = requirement.scope.as_str().to_owned();
    if let ScopeName::Other(_) = requirement.scope {
        return Some(SpecProblem::UnknownScope { scope });
    }
    let selector_scope = matches!(
        requirement.scope,
        ScopeName::PriorityClass | ScopeName::VolumeAttributesClass
    );
    match &requirement.operator {
        ScopeOperator::Unset if selector_scope => Some(SpecProblem::ScopeWithoutOperator { scope }),
        ScopeOperator::Unset => None,
        ScopeOperator::Invalid(op) => Some(SpecProblem::InvalidSelector {
            scope,
            reason: format!("{op:?} is not a valid scope selector operator"),
        }),
        ScopeOperator::Exists if selector_scope => None,
        _ if selector_scope => {
            selector_matches(requirement, None)
                .err()
                .map(|e| SpecProblem::InvalidSelector {
                    scope,
                    reason: e.to_string(),
                })
        }
        ScopeOperator::Exists => None,
        _ => Some(SpecProblem::InvalidSelector {
            scope,
            reason: "this scope only supports the Exists operator".to_owned(),
        }),
    }
}
