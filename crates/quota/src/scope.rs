//! Quota scopes (`spec.scopes` and `spec.scopeSelector`) and the label-selector semantics the
//! PriorityClass and VolumeAttributesClass scopes are evaluated with.

use std::fmt;

use k8s_openapi::api::core::v1::{ScopeSelector, ScopedResourceSelectorRequirement};

use crate::names::{is_label_value, is_qualified_name};

/// A `ResourceQuotaScope`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ScopeName {
    /// `Terminating`: pods with `activeDeadlineSeconds >= 0`.
    Terminating,
    /// `NotTerminating`.
    NotTerminating,
    /// `BestEffort`: pods of QoS class BestEffort.
    BestEffort,
    /// `NotBestEffort`.
    NotBestEffort,
    /// `PriorityClass`: selector over the pod's priority class name.
    PriorityClass,
    /// `CrossNamespacePodAffinity`.
    CrossNamespacePodAffinity,
    /// `VolumeAttributesClass`: selector over a PVC's VolumeAttributesClass names.
    VolumeAttributesClass,
    /// Any other name: matches no object.
    Other(String),
}

impl ScopeName {
    /// Parses a scope name (unknown names are kept as [`ScopeName::Other`]).
    pub fn parse(name: &str) -> Self {
        match name {
            "Terminating" => Self::Terminating,
            "NotTerminating" => Self::NotTerminating,
            "BestEffort" => Self::BestEffort,
            "NotBestEffort" => Self::NotBestEffort,
            "PriorityClass" => Self::PriorityClass,
            "CrossNamespacePodAffinity" => Self::CrossNamespacePodAffinity,
            "VolumeAttributesClass" => Self::VolumeAttributesClass,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The API spelling.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Terminating => "Terminating",
            Self::NotTerminating => "NotTerminating",
            Self::BestEffort => "BestEffort",
            Self::NotBestEffort => "NotBestEffort",
            Self::PriorityClass => "PriorityClass",
            Self::CrossNamespacePodAffinity => "CrossNamespacePodAffinity",
            Self::VolumeAttributesClass => "VolumeAttributesClass",
            Self::Other(name) => name,
        }
    }
}

impl fmt::Display for ScopeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `ScopeSelectorOperator`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ScopeOperator {
    /// `In`.
    In,
    /// `NotIn`.
    NotIn,
    /// `Exists`.
    Exists,
    /// `DoesNotExist`.
    DoesNotExist,
    /// No operator: only a `scopeSelector` expression written without one (API validation
    /// rejects it). For the PriorityClass and VolumeAttributesClass scopes the selector
    /// conversion then fails; the other scopes ignore the operator.
    Unset,
    /// Any other spelling (rejected by API validation; kept so matching fails like upstream).
    Invalid(String),
}

impl ScopeOperator {
    /// Parses an operator string.
    pub fn parse(operator: &str) -> Self {
        match operator {
            "In" => Self::In,
            "NotIn" => Self::NotIn,
            "Exists" => Self::Exists,
            "DoesNotExist" => Self::DoesNotExist,
            "" => Self::Unset,
            other => Self::Invalid(other.to_owned()),
        }
    }

    /// The API spelling (empty for [`ScopeOperator::Unset`]).
    pub fn as_str(&self) -> &str {
        match self {
            Self::In => "In",
            Self::NotIn => "NotIn",
            Self::Exists => "Exists",
            Self::DoesNotExist => "DoesNotExist",
            Self::Unset => "",
            Self::Invalid(op) => op,
        }
    }
}

/// One scope requirement: a `spec.scopes` entry or a `scopeSelector.matchExpressions` entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScopeRequirement {
    /// The scope.
    pub scope: ScopeName,
    /// The operator.
    pub operator: ScopeOperator,
    /// The values (for `In` and `NotIn`).
    pub values: Vec<String>,
}

impl ScopeRequirement {
    /// A requirement built from a `spec.scopes` entry, exactly as `CalculateUsageStats` builds
    /// it (k8s.io/apiserver v0.36 `generic/evaluator.go`): operator `Exists`, no values.
    pub fn from_scope(scope: &str) -> Self {
        Self {
            scope: ScopeName::parse(scope),
            operator: ScopeOperator::Exists,
            values: Vec::new(),
        }
    }

    /// A requirement from a typed selector expression.
    pub fn from_k8s(requirement: &ScopedResourceSelectorRequirement) -> Self {
        Self {
            scope: ScopeName::parse(&requirement.scope_name),
            operator: ScopeOperator::parse(&requirement.operator),
            values: requirement.values.clone().unwrap_or_default(),
        }
    }
}

/// Why a scope requirement could not be evaluated. Upstream's `CalculateUsageStats` then
/// stops and returns the partial sum **without** an error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// The operator is not In, NotIn, Exists or DoesNotExist.
    #[error("scope {scope}: {operator:?} is not a valid scope selector operator")]
    InvalidOperator {
        /// The scope.
        scope: String,
        /// The operator as written.
        operator: String,
    },
    /// The requirement does not convert into a valid label requirement.
    #[error("scope {scope}: invalid selector requirement ({operator} {values:?}): {reason}")]
    InvalidRequirement {
        /// The scope.
        scope: String,
        /// The operator.
        operator: String,
        /// The values.
        values: Vec<String>,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// `helper.ScopedResourceSelectorRequirementsAsSelector` followed by `Selector.Matches` against
/// a label set that is either empty or the single pair `{<scope name>: value}`.
pub fn selector_matches(requirement: &ScopeRequirement, value: Option<&str>) -> Result<bool, ScopeError> {
    let scope = requirement.scope.as_str();
    let invalid = |reason| ScopeError::InvalidRequirement {
        scope: scope.to_owned(),
        operator: requirement.operator.as_str().to_owned(),
        values: requirement.values.clone(),
        reason,
    };
    let needs_values = match &requirement.operator {
        ScopeOperator::In | ScopeOperator::NotIn => true,
        ScopeOperator::Exists | ScopeOperator::DoesNotExist => false,
        ScopeOperator::Unset | ScopeOperator::Invalid(_) => {
            return Err(ScopeError::InvalidOperator {
                scope: scope.to_owned(),
                operator: requirement.operator.as_str().to_owned(),
            });
        }
    };
    // labels.NewRequirement validates the key, the value count and every value.
    if !is_qualified_name(scope) {
        return Err(invalid("the scope name is not a valid label key"));
    }
    if needs_values && requirement.values.is_empty() {
        return Err(invalid("for 'in', 'notin' operators, values set can't be empty"));
    }
    if !needs_values && !requirement.values.is_empty() {
        return Err(invalid("values set must be empty for exists and does not exist"));
    }
    if !requirement.values.iter().all(|v| is_label_value(v)) {
        return Err(invalid("a value is not a valid label value"));
    }
    let contains = |v: &str| requirement.values.iter().any(|candidate| candidate == v);
    Ok(match requirement.operator {
        ScopeOperator::In => value.is_some_and(contains),
        ScopeOperator::NotIn => !value.is_some_and(contains),
        ScopeOperator::Exists => value.is_some(),
        _ => value.is_none(),
    })
}

/// All scope requirements of a quota, in upstream evaluation order: `spec.scopes` first (as
/// `Exists` requirements), then `spec.scopeSelector.matchExpressions`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct QuotaScopes {
    requirements: Vec<ScopeRequirement>,
}

impl QuotaScopes {
    /// No scopes: every object matches.
    pub fn none() -> Self {
        Self::default()
    }

    /// From typed `spec.scopes` and `spec.scopeSelector`.
    pub fn from_k8s(scopes: Option<&[String]>, selector: Option<&ScopeSelector>) -> Self {
        let mut requirements: Vec<ScopeRequirement> = scopes
            .unwrap_or_default()
            .iter()
            .map(|s| ScopeRequirement::from_scope(s))
            .collect();
        if let Some(expressions) = selector.and_then(|s| s.match_expressions.as_deref()) {
            requirements.extend(expressions.iter().map(ScopeRequirement::from_k8s));
        }
        Self { requirements }
    }

    /// From already-built requirements, in evaluation order.
    pub fn from_requirements(requirements: Vec<ScopeRequirement>) -> Self {
        Self { requirements }
    }

    /// The requirements in evaluation order.
    pub fn requirements(&self) -> &[ScopeRequirement] {
        &self.requirements
    }

    /// Whether the quota has neither scopes nor selector expressions.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}
