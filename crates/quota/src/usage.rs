//! Per-object usage and the per-namespace aggregation of `generic.CalculateUsageStats`.

use std::collections::BTreeMap;
use std::fmt;

use crate::gates::FeatureGates;
use crate::quantity::{Format, Quantity};
use crate::scope::{QuotaScopes, ScopeError, ScopeRequirement};
use crate::time::Time;

/// A quota resource name mapped to a quantity, ordered by name.
pub type ResourceList = BTreeMap<String, Quantity>;

/// A usage key as `prefix + name + suffix`, so objects can emit keys such as
/// `requests.hugepages-2Mi` or `gold.storageclass.storage.k8s.io/requests.storage` without
/// allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsageKey<'a> {
    /// Leading constant part (may be empty).
    pub prefix: &'static str,
    /// Variable middle part.
    pub name: &'a str,
    /// Trailing constant part (may be empty).
    pub suffix: &'static str,
}

impl<'a> UsageKey<'a> {
    /// A key that is exactly `name`.
    pub const fn name(name: &'a str) -> Self {
        Self {
            prefix: "",
            name,
            suffix: "",
        }
    }

    /// A key `prefix + name + suffix`.
    pub const fn new(prefix: &'static str, name: &'a str, suffix: &'static str) -> Self {
        Self { prefix, name, suffix }
    }

    /// Whether this key spells `key`.
    ///
    /// The lengths first: most keys a sum compares against differ in length, and each
    /// comparison of bytes is a call to `memcmp` (an empty prefix or suffix is not compared).
    pub fn matches(&self, key: &str) -> bool {
        let (p, n) = (self.prefix.len(), self.name.len());
        let key = key.as_bytes();
        let same = |part: &[u8], of: &str| part.is_empty() || part == of.as_bytes();
        key.len() == p + n + self.suffix.len()
            && same(&key[p + n..], self.suffix)
            && same(&key[p..p + n], self.name)
            && same(&key[..p], self.prefix)
    }
}

impl fmt::Display for UsageKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{}", self.prefix, self.name, self.suffix)
    }
}

/// An object an evaluator can charge to a quota: a compact projection of a typed object.
pub trait QuotaObject {
    /// Whether the object matches one scope requirement (the evaluator's `MatchesScopeFunc`).
    fn matches_scope(&self, requirement: &ScopeRequirement, gates: FeatureGates) -> Result<bool, ScopeError>;

    /// Calls `emit` for each usage entry of the object at instant `now` (the evaluator's
    /// `Usage`). Keys are emitted at most once.
    fn for_each_usage(&self, now: Time, emit: &mut dyn FnMut(UsageKey<'_>, Quantity));

    /// The object's usage as a list (convenience; [`calculate_usage`] avoids building it).
    fn usage(&self, now: Time) -> ResourceList {
        let mut list = ResourceList::new();
        self.for_each_usage(now, &mut |key, quantity| {
            list.insert(key.to_string(), quantity);
        });
        list
    }

    /// Whether the object matches every requirement (AND, evaluating all of them like
    /// upstream, so a later invalid requirement still errors after an earlier mismatch).
    fn matches_scopes(&self, scopes: &QuotaScopes, gates: FeatureGates) -> Result<bool, ScopeError> {
        let mut matches = true;
        for requirement in scopes.requirements() {
            matches &= self.matches_scope(requirement, gates)?;
        }
        Ok(matches)
    }
}

/// What an object's scope matching reads, and nothing else, as a value: every object of one
/// class matches every scope requirement alike (errors included), so a partition can keep its
/// usage summed per class and match a quota's scopes once per class instead of once per object.
/// Each projection's [`QuotaObject::matches_scope`] is implemented through its class, so the
/// two cannot disagree.
pub trait ScopeClassed: QuotaObject {
    /// The fields scope matching reads (a pod's flags and priority class, a PVC's
    /// VolumeAttributesClass names, nothing for a Service).
    type Class: Clone + Eq + std::hash::Hash + fmt::Debug;

    /// This object's class.
    fn scope_class(&self) -> Self::Class;

    /// Whether this object is of `class` (without building its class: a lookup on every
    /// object event).
    fn is_of_class(&self, class: &Self::Class) -> bool {
        self.scope_class() == *class
    }

    /// Whether objects of `class` match one scope requirement.
    fn class_matches_scope(
        class: &Self::Class,
        requirement: &ScopeRequirement,
        gates: FeatureGates,
    ) -> Result<bool, ScopeError>;

    /// Whether objects of `class` match every requirement (evaluating all of them, as
    /// [`QuotaObject::matches_scopes`] does).
    fn class_matches_scopes(
        class: &Self::Class,
        scopes: &QuotaScopes,
        gates: FeatureGates,
    ) -> Result<bool, ScopeError> {
        let mut matches = true;
        for requirement in scopes.requirements() {
            matches &= Self::class_matches_scope(class, requirement, gates)?;
        }
        Ok(matches)
    }

    /// Whether the object's usage depends on the instant it is read at (a pod in its deletion
    /// grace period counts until the period ends): such an object is summed when read.
    fn usage_varies_with_time(&self) -> bool {
        false
    }
}

/// The result of [`calculate_usage`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageStats {
    /// Usage of every requested resource.
    pub used: ResourceList,
    /// Set when a scope could not be evaluated. Upstream then returns the partial sum
    /// accumulated so far **as success**; `used` is exactly that partial sum.
    pub scope_error: Option<ScopeError>,
}

/// `generic.CalculateUsageStats` over one namespace's objects of one evaluator.
///
/// Every requested resource starts at zero in DecimalSI; an object counts only if it matches
/// all scope requirements; its usage is added with the upstream rule that a zero accumulator
/// adopts the addend's format (so the printed format is that of the first non-zero addend
/// in iteration order). Usage keys that were not requested are ignored (upstream masks them
/// out afterwards).
pub fn calculate_usage<'o, T, I, S>(
    requested: &[S],
    scopes: &QuotaScopes,
    objects: I,
    now: Time,
    gates: FeatureGates,
) -> UsageStats
where
    T: QuotaObject + ?Sized + 'o,
    I: IntoIterator<Item = &'o T>,
    S: AsRef<str>,
{
    let mut accumulators: Vec<(&str, Quantity)> = Vec::with_capacity(requested.len());
    for key in requested {
        let key = key.as_ref();
        if !accumulators.iter().any(|(k, _)| *k == key) {
            accumulators.push((key, Quantity::zero(Format::DecimalSI)));
        }
    }
    let mut scope_error = None;
    for object in objects {
        match object.matches_scopes(scopes, gates) {
            Err(error) => {
                scope_error = Some(error);
                break;
            }
            Ok(false) => {}
            Ok(true) => object.for_each_usage(now, &mut |key, quantity| {
                if let Some((_, acc)) = accumulators.iter_mut().find(|(k, _)| key.matches(k)) {
                    *acc += quantity;
                }
            }),
        }
    }
    UsageStats {
        used: accumulators.into_iter().map(|(k, q)| (k.to_owned(), q)).collect(),
        scope_error,
    }
}
