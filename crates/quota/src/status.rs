//! `status` assembly exactly as `syncResourceQuota` writes it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use crate::list::Quantities;
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
pub fn same_value(a: &K8sQuantity, b: &K8sQuantity) -> bool {
    match (Quantity::parse_k8s(a), Quantity::parse_k8s(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a.0 == b.0,
    }
}

/// `quota.Equals` / `Semantic.DeepEqual` on resource lists: same keys, values equal by `Cmp`;
/// an absent list is an empty one.
pub fn lists_equal<A: Quantities, B: Quantities>(a: Option<&A>, b: Option<&B>) -> bool {
    a.map_or(0, Quantities::count) == b.map_or(0, Quantities::count)
        && entries(a).all(|(key, value)| {
            b.and_then(|b| b.quantity(key))
                .is_some_and(|other| same_value(value, other))
        })
}

fn entries<L: Quantities>(list: Option<&L>) -> impl Iterator<Item = (&String, &K8sQuantity)> {
    list.into_iter().flat_map(Quantities::entries)
}

/// `syncResourceQuota` steps 1 to 7.
///
/// `new_usage` is the result of [`crate::evaluator::UsagePlan::merge`]: it holds only the keys
/// that were computed successfully, so every other key keeps its previous `status.used`
/// value (keys no evaluator matches, keys of an errored or unsynced evaluator).
///
/// An empty map reads back as absent (the API omits it), so empty `hard` or `used` count as
/// nil here, which makes such a quota dirty on every sync, exactly like upstream.
pub fn assemble_status<H: Quantities, S: Quantities, U: Quantities>(
    spec_hard: Option<&H>,
    status_hard: Option<&S>,
    status_used: Option<&U>,
    new_usage: &ResourceList,
) -> StatusDecision {
    let status_hard_nil = status_hard.is_none_or(|h| h.count() == 0);
    let status_used_nil = status_used.is_none_or(|u| u.count() == 0);
    let mut dirty = !lists_equal(spec_hard, status_hard) || status_hard_nil || status_used_nil;
    let hard: BTreeMap<String, K8sQuantity> =
        entries(spec_hard).map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut used: BTreeMap<String, K8sQuantity> = entries(status_used)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut withheld = Vec::new();
    for (key, value) in new_usage {
        if value.is_unknown() {
            used.remove(key);
            if hard.contains_key(key) {
                withheld.push(key.clone());
            }
        } else {
            used.insert(key.clone(), value.to_k8s());
        }
    }
    used.retain(|key, _| hard.contains_key(key));
    dirty |= !lists_equal(Some(&used), status_used);
    StatusDecision {
        hard,
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
