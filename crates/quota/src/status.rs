//! `status` assembly exactly as `syncResourceQuota` writes it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use crate::quantity::Quantity;
use crate::usage::ResourceList;

/// What the controller would write.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusDecision {
    /// `status.hard`: a verbatim copy of `spec.hard`.
    pub hard: BTreeMap<String, K8sQuantity>,
    /// `status.used`: previous values overwritten by computed ones, masked to the hard keys.
    pub used: BTreeMap<String, K8sQuantity>,
    /// Whether a status update is due.
    pub dirty: bool,
    /// Keys whose usage is unknown (an object carries a quantity beyond
    /// [`crate::quantity::MAX_BITS`]): removed from `used`, never written lower. Quota
    /// admission then refuses every request that would charge them ("status unknown for
    /// quota") until the object is gone — it fails closed.
    pub withheld: Vec<String>,
}

/// Value equality of two quantity strings (`Cmp`), falling back to string equality for
/// strings that do not parse (never produced by the apiserver).
fn same_value(a: &K8sQuantity, b: &K8sQuantity) -> bool {
    match (Quantity::parse_k8s(a), Quantity::parse_k8s(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a.0 == b.0,
    }
}

/// `quota.Equals` / `Semantic.DeepEqual` on resource lists: same keys, values equal by `Cmp`.
fn lists_equal(a: &BTreeMap<String, K8sQuantity>, b: &BTreeMap<String, K8sQuantity>) -> bool {
    a.len() == b.len()
        && a.iter()
            .all(|(key, value)| b.get(key).is_some_and(|other| same_value(value, other)))
}

/// `syncResourceQuota` steps 1 to 7.
///
/// `new_usage` is the result of [`crate::evaluator::UsagePlan::merge`]: it holds only the keys
/// that were computed successfully, so every other key keeps its previous `status.used`
/// value (keys no evaluator matches, keys of an errored or unsynced evaluator).
///
/// An empty map reads back as absent (the API omits it), so empty `hard` or `used` count as
/// nil here, which makes such a quota dirty on every sync, exactly like upstream.
pub fn assemble_status(
    spec_hard: Option<&BTreeMap<String, K8sQuantity>>,
    status_hard: Option<&BTreeMap<String, K8sQuantity>>,
    status_used: Option<&BTreeMap<String, K8sQuantity>>,
    new_usage: &ResourceList,
) -> StatusDecision {
    let empty = BTreeMap::new();
    let spec_hard = spec_hard.unwrap_or(&empty);
    let status_hard_nil = status_hard.is_none_or(BTreeMap::is_empty);
    let status_used_nil = status_used.is_none_or(BTreeMap::is_empty);
    let previous_used = status_used.unwrap_or(&empty);
    let mut dirty =
        !lists_equal(spec_hard, status_hard.unwrap_or(&empty)) || status_hard_nil || status_used_nil;
    let mut used = previous_used.clone();
    let mut withheld = Vec::new();
    for (key, value) in new_usage {
        if value.is_unknown() {
            used.remove(key);
            if spec_hard.contains_key(key) {
                withheld.push(key.clone());
            }
        } else {
            used.insert(key.clone(), value.to_k8s());
        }
    }
    used.retain(|key, _| spec_hard.contains_key(key));
    dirty |= !lists_equal(&used, previous_used);
    StatusDecision {
        hard: spec_hard.clone(),
        used,
        dirty,
        withheld,
    }
}

/// [`assemble_status`] reading `spec.hard`, `status.hard` and `status.used` from a quota.
pub fn assemble_status_for(quota: &ResourceQuota, new_usage: &ResourceList) -> StatusDecision {
    let spec_hard = quota.spec.as_ref().and_then(|s| s.hard.as_ref());
    let status = quota.status.as_ref();
    assemble_status(
        spec_hard,
        status.and_then(|s| s.hard.as_ref()),
        status.and_then(|s| s.used.as_ref()),
        new_usage,
    )
}
