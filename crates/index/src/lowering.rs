//! When a computed `used` may be written **below** the stored one.
//!
//! Two things can be missing from what lazyquota holds when it computes a quota, and each has
//! its rule here:
//!
//! - objects admission charged whose events have not arrived yet: a key is never written below
//!   what is counted plus what its charges still owe ([`hold_lowering`]; the charges and what
//!   pays them: [`crate::charges`]);
//! - objects stored before the quota's resourceVersion that the watches have not delivered
//!   yet, some admitted before admission charged the key: a key is written lower, or for the
//!   first time, only once the watches it is computed from have caught up with that version
//!   ([`hold_until_caught_up`]).
//!
//! Capped at the stored value, the first floor assumes the stored value holds every object
//! counted; it does not when a write of lazyquota's was lost (a conflict with a tenant's edit)
//! while it raised the key for an object admitted uncharged (before the quota or key existed).
//! One order is certain, though: a charge at resourceVersion C is made before its object is
//! stored, at some R > C; so while the watches feeding the key have delivered nothing past C,
//! that object is not counted, and what the charge owes is added **uncapped**
//! ([`Charge::revision`]).

use lazyquota_quota::{Quantity, QuantityList, StatusDecision};

use crate::{
    charges::Charge,
    engine::{QuotaState, same_quantities},
};

/// How long after a quota is created, its keys change or its `status.hard` gains a key, a key
/// waits at most for a proof that the watches it is computed from have caught up with the
/// quota when the proof cannot be had (a list that fails or is not answered): objects
/// admitted before admission charged the key take milliseconds to be stored on a healthy
/// apiserver.
pub const SETTLE_MS: u64 = 500;

/// Keys a computation wanted lower that are written higher for now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The keys.
    pub keys: Vec<String>,
    /// When (in the caller's milliseconds) the first charge still owed on them reaches the
    /// create bound: compute the quota again then. Arrivals that pay a charge compute it again
    /// sooner.
    pub until_ms: u64,
}

/// Writes every key of `decision` no lower than what is counted plus what the charges of that
/// key still owe — the charges seen on **any** quota of the quota's namespace (`charges`: they
/// are charges for objects of that namespace, which this quota counts too, whether it was
/// charged or created a moment later) — and no higher than the stored value, where there is
/// one, except for the charges made at or after `observed(key)` (how far the watches the key
/// is computed from have delivered): their objects are certainly not counted yet, so what
/// they owe is added whatever is stored. A key with no stored value (a quota or key just
/// added) is written at the floor, or left out (admission then refuses what would charge it:
/// closed, not open) if a charge's amount is unknown. Clears `dirty` when nothing is left to
/// write. Keys in `kept` were not computed (their watches are not synced) and keep the stored
/// value, which holds every charge of this quota up to the version a write is conditioned on
/// (admission's charges are conditioned updates): adding them again would write them twice.
/// The kept value may lack objects admission never charged to this quota; so may the stored
/// value whenever nothing is owed — a key lazyquota cannot compute keeps what admission
/// maintains (and, left uncomputed, is reported). `bound_ms` is the create bound
/// ([`crate::charges::DEFAULT_BOUND_MS`]), for [`Held::until_ms`].
pub fn hold_lowering(
    state: &QuotaState,
    charges: &[&Charge],
    observed: &dyn Fn(&str) -> u64,
    kept: &[String],
    decision: &mut StatusDecision,
    bound_ms: u64,
) -> Option<Held> {
    let owing: Vec<&Charge> = charges.iter().copied().filter(|c| c.is_owed()).collect();
    if owing.is_empty() {
        return None;
    }
    let stored = state.status_used.as_ref();
    let mut held = Held {
        keys: Vec::new(),
        until_ms: u64::MAX,
    };
    let mut unknown = Vec::new();
    for (key, ours) in &mut decision.used {
        if kept.contains(key) {
            continue;
        }
        let Ok(counted) = Quantity::parse_k8s(ours) else {
            continue;
        };
        let theirs = stored.and_then(|s| s.get(key));
        let stored_value = match theirs.map(Quantity::parse_k8s) {
            Some(Ok(v)) => Some(v),
            Some(Err(_)) => continue,
            None => None,
        };
        // Everything still owed (perhaps counted already) and what is certainly not counted.
        let (mut all, mut unseen) = (counted.clone(), counted.clone());
        let observed = observed(key);
        let mut until_ms = None;
        for charge in &owing {
            // Carried (the stored value at first sight) is within the stored value: never
            // added above it.
            let carried = charge.raised.iter().any(|r| r.carried);
            let certain = !carried && charge.revision.is_some_and(|r| r >= observed);
            for (_, owed) in charge.owed().filter(|(k, _)| same_objects(k, key)) {
                all = all.add(&owed);
                if certain {
                    unseen = unseen.add(&owed);
                }
                let expires = charge.at_ms.saturating_add(bound_ms);
                until_ms = Some(until_ms.map_or(expires, |u: u64| u.min(expires)));
            }
        }
        let Some(until_ms) = until_ms else {
            continue;
        };
        let floor = match &stored_value {
            _ if unseen.is_unknown() => None,
            Some(v) if !all.is_unknown() && all < *v => Some(std::cmp::max(unseen, all)),
            Some(v) => Some(std::cmp::max(unseen, v.clone())),
            None if all.is_unknown() => None,
            None => Some(all),
        };
        match (floor, theirs) {
            (Some(floor), _) if floor <= counted => continue,
            (Some(floor), Some(theirs)) if stored_value.as_ref() == Some(&floor) => *ours = theirs.clone(),
            (Some(floor), _) => *ours = floor.to_k8s(),
            (None, Some(theirs)) if stored_value.as_ref().is_some_and(|v| *v > counted) => {
                *ours = theirs.clone();
            }
            (None, _) => unknown.push(key.clone()),
        }
        held.until_ms = held.until_ms.min(until_ms);
        held.keys.push(key.clone());
    }
    for key in unknown {
        decision.used.remove(&key);
    }
    if held.keys.is_empty() {
        return None;
    }
    decision.dirty = hard_dirty(state) || !same_quantities(Some(&decision.used), stored);
    Some(held)
}

/// Leaves out of `decision` each key that was not computed this time (`uncomputed`) and whose
/// stored value admission did not maintain ([`QuotaState::maintained`]: its key is not in
/// `status.hard`): upstream copies such a value as the previous one, which can be below the
/// objects created meanwhile. Left out, admission refuses what would charge it until it is
/// computed (closed, not open). Returns whether a key was left out.
pub fn drop_unmaintained(state: &QuotaState, uncomputed: &[String], decision: &mut StatusDecision) -> bool {
    let mut dropped = false;
    for key in uncomputed.iter().filter(|k| !state.maintained(k)) {
        dropped |= decision.used.remove(key).is_some();
    }
    if dropped {
        decision.dirty =
            hard_dirty(state) || !same_quantities(Some(&decision.used), state.status_used.as_ref());
    }
    dropped
}

/// Until the watches a quota is computed from have caught up with its resourceVersion (each
/// delivered an object at or past it, or listed after lazyquota saw it), a key is written
/// neither lower than stored nor for the first time: an object stored before — uncharged if
/// it was admitted before admission charged the key — may still be on its way. A raise is
/// written: it only brings the stored value closer to the objects that exist. The caller
/// applies this for [`SETTLE_MS`] after the quota was created, its keys changed or
/// `status.hard` gained one.
/// Keeps each such key (`behind`: those whose own watches have not caught up) at its stored
/// value, or leaves a new one out (admission refuses what would charge it: closed, not
/// open). Returns whether a key was held; clears `dirty` when nothing is left to write.
pub fn hold_until_caught_up(
    state: &QuotaState,
    behind: impl Fn(&str) -> bool,
    decision: &mut StatusDecision,
) -> bool {
    let stored = state.status_used.as_ref();
    let mut held = false;
    let mut new = Vec::new();
    for (key, ours) in decision.used.iter_mut().filter(|(k, _)| behind(k)) {
        // A key admission did not charge is new too: its stored value is nobody's.
        match state.maintained_used(key) {
            None => new.push(key.clone()),
            Some(theirs) => match (Quantity::parse_k8s(ours), Quantity::parse_k8s(theirs)) {
                (Ok(o), Ok(t)) if o < t => {
                    *ours = theirs.clone();
                    held = true;
                }
                _ => {}
            },
        }
    }
    held |= !new.is_empty();
    for key in new {
        decision.used.remove(&key);
    }
    if held {
        // Written only for what is new (a `spec.hard` to copy, a key to raise): not for the
        // held keys themselves — an empty `used` is "dirty" to upstream, and each write would
        // move the quota's version on and hold its keys again, for ever.
        decision.dirty = !same_quantities(state.spec_hard.as_ref(), state.status_hard.as_ref())
            || !same_quantities(Some(&decision.used), stored);
    }
    held
}

/// Whether two quota keys count the same objects by the same amount (`pods` and
/// `count/pods`, `cpu` and `requests.cpu`): a charge of one, seen on a neighbouring quota,
/// is a charge of the other.
pub(crate) fn same_objects(a: &str, b: &str) -> bool {
    fn canonical(key: &str) -> &str {
        match key {
            "cpu" => "requests.cpu",
            "memory" => "requests.memory",
            "ephemeral-storage" => "requests.ephemeral-storage",
            "count/pods" => "pods",
            "count/services" => "services",
            "count/configmaps" => "configmaps",
            "count/secrets" => "secrets",
            "count/persistentvolumeclaims" => "persistentvolumeclaims",
            "count/replicationcontrollers" => "replicationcontrollers",
            "count/resourcequotas" => "resourcequotas",
            other => other,
        }
    }
    canonical(a) == canonical(b)
}

/// `assemble_status`'s reasons to write that are not `used`: `status.hard` differs from
/// `spec.hard`, or either status list is empty.
fn hard_dirty(state: &QuotaState) -> bool {
    state.status_hard.as_ref().is_none_or(QuantityList::is_empty)
        || state.status_used.as_ref().is_none_or(QuantityList::is_empty)
        || !same_quantities(state.spec_hard.as_ref(), state.status_hard.as_ref())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaSpec, ResourceQuotaStatus};

    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

    use super::*;
    use crate::charges::{DEFAULT_BOUND_MS as BOUND, raised};

    const CM: &str = "count/configmaps";

    fn list(pairs: &[(&str, &str)]) -> BTreeMap<String, K8sQuantity> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), K8sQuantity((*v).to_owned())))
            .collect()
    }

    fn cm(by: u64) -> Vec<(String, Quantity)> {
        vec![(CM.to_owned(), Quantity::from_count(by))]
    }

    /// A quota stored with `used`, and the charges seen (each: when, at which revision,
    /// configmaps raised by).
    fn state(used: &[(&str, &str)], charges: &[(u64, u64, u64)]) -> QuotaState {
        let hard = list(&[(CM, "30"), ("pods", "10")]);
        let quota = ResourceQuota {
            spec: Some(ResourceQuotaSpec {
                hard: Some(hard.clone()),
                ..Default::default()
            }),
            status: Some(ResourceQuotaStatus {
                hard: Some(hard),
                used: Some(list(used)),
            }),
            ..Default::default()
        };
        let mut state = QuotaState::from_quota(&quota, false).1;
        for (at_ms, revision, by) in charges {
            state.ledger.note(cm(*by), Some(*revision), *at_ms, BOUND);
        }
        state
    }

    fn own(state: &QuotaState) -> Vec<&Charge> {
        state.ledger.charges.iter().collect()
    }

    fn decision(used: &[(&str, &str)]) -> StatusDecision {
        StatusDecision {
            hard: list(&[(CM, "30"), ("pods", "10")]),
            used: list(used),
            dirty: true,
            withheld: Vec::new(),
        }
    }

    #[test]
    fn a_key_is_not_written_below_what_is_counted_plus_what_its_charges_owe() {
        // 24 counted; 3 charged at 10.0 s (revision 10) and 2 at 10.2 s (revision 20).
        let mut state = state(&[(CM, "30"), ("pods", "2")], &[(10_000, 10, 3), (10_200, 20, 2)]);
        let mut d = decision(&[(CM, "24"), ("pods", "2")]);
        let held = hold_lowering(&state, &own(&state), &|_| 0, &[], &mut d, BOUND).expect("held");
        assert_eq!(held.keys, vec![CM.to_owned()]);
        assert_eq!(held.until_ms, 10_000 + BOUND, "the first charge's bound");
        assert_eq!(d.used[CM].0, "29", "24 + 3 + 2");
        assert!(d.dirty);

        // Two ConfigMaps stored after both charges arrive: they pay the newest charge first.
        state.ledger.account(21, 0, cm(2));
        let mut d = decision(&[(CM, "24"), ("pods", "2")]);
        hold_lowering(&state, &own(&state), &|_| 0, &[], &mut d, BOUND).expect("held");
        assert_eq!(d.used[CM].0, "27", "24 + the first charge's 3");

        // The rest arrive: written as counted, however recent the charges.
        state.ledger.account(22, 0, cm(3));
        let mut d = decision(&[(CM, "24"), ("pods", "2")]);
        assert_eq!(
            hold_lowering(&state, &own(&state), &|_| 0, &[], &mut d, BOUND),
            None
        );
        assert_eq!(d.used[CM].0, "24");
    }

    #[test]
    fn a_charge_nothing_pays_holds_until_the_create_bound() {
        let mut state = state(&[(CM, "30"), ("pods", "2")], &[(10_000, 10, 1)]);
        // An object stored before the charge pays nothing.
        state.ledger.account(9, 0, cm(1));
        let mut d = decision(&[(CM, "24"), ("pods", "2")]);
        hold_lowering(&state, &own(&state), &|_| 0, &[], &mut d, BOUND).expect("held");
        assert_eq!(d.used[CM].0, "25");
        // Past the bound it goes: its create failed after admission, or outlived its request.
        state.ledger.expire(10_000 + BOUND, BOUND);
        let mut d = decision(&[(CM, "24"), ("pods", "2")]);
        assert_eq!(
            hold_lowering(&state, &own(&state), &|_| 0, &[], &mut d, BOUND),
            None
        );
        assert_eq!(d.used[CM].0, "24");
    }

    #[test]
    fn never_above_the_stored_value_and_nothing_written_when_it_stands() {
        // The watches are past the charge (at 10): its object may be counted already.
        let state = state(&[(CM, "30"), ("pods", "2")], &[(10_000, 10, 8)]);
        let mut d = decision(&[(CM, "28"), ("pods", "2")]);
        hold_lowering(&state, &own(&state), &|_| 11, &[], &mut d, BOUND).expect("held");
        assert_eq!(d.used[CM].0, "30", "28 + 8 is past what admission charged");
        assert!(!d.dirty, "nothing else to write");
    }

    #[test]
    fn raising_and_keys_nothing_owed_on_are_written_as_computed() {
        let charged = state(&[(CM, "30"), ("pods", "5")], &[(10_000, 10, 1)]);
        let mut d = decision(&[(CM, "31"), ("pods", "3")]);
        assert_eq!(
            hold_lowering(&charged, &own(&charged), &|_| 11, &[], &mut d, BOUND),
            None
        );
        assert_eq!((d.used[CM].0.as_str(), d.used["pods"].0.as_str()), ("31", "3"));
        let uncharged = state(&[(CM, "30"), ("pods", "2")], &[]);
        let mut d = decision(&[(CM, "1"), ("pods", "2")]);
        assert_eq!(
            hold_lowering(&uncharged, &own(&uncharged), &|_| 0, &[], &mut d, BOUND),
            None
        );
        assert_eq!(d.used[CM].0, "1");
    }

    #[test]
    fn a_charge_no_watch_has_come_past_is_added_whatever_is_stored() {
        // Counted 5, stored 5 (an uncharged object counted, a charge on a stale value): the
        // charge at 85 is for an object stored after 85, and the watches delivered up to 80.
        let state = state(&[(CM, "5"), ("pods", "2")], &[(1_000, 85, 1)]);
        let mut d = decision(&[(CM, "5"), ("pods", "2")]);
        let held = hold_lowering(&state, &own(&state), &|_| 80, &[], &mut d, BOUND).expect("held");
        assert_eq!(held.keys, vec![CM.to_owned()]);
        assert_eq!(d.used[CM].0, "6");
        assert!(d.dirty);
        // Stored above that: counted plus what is owed, as before (the stored 7 may hold a
        // delete).
        let mut stored_7 = self::state(&[(CM, "7"), ("pods", "2")], &[]);
        stored_7.ledger.clone_from(&state.ledger);
        let mut d = decision(&[(CM, "5"), ("pods", "2")]);
        hold_lowering(&stored_7, &own(&stored_7), &|_| 80, &[], &mut d, BOUND).expect("held");
        assert_eq!(d.used[CM].0, "6");
        // A watch past 85 may have delivered it: capped at the stored value, as counted.
        let mut d = decision(&[(CM, "5"), ("pods", "2")]);
        assert_eq!(
            hold_lowering(&state, &own(&state), &|_| 86, &[], &mut d, BOUND),
            None
        );
        assert_eq!(d.used[CM].0, "5");

        // Kept (its watch not synced, so the decision carries the stored 5): the charge at 85
        // is in the stored 5 already — the view is at or past it, or the write conflicts.
        let mut d = decision(&[(CM, "5"), ("pods", "2")]);
        assert_eq!(
            hold_lowering(&state, &own(&state), &|_| 80, &[CM.to_owned()], &mut d, BOUND),
            None
        );
        assert_eq!(d.used[CM].0, "5");
    }

    #[test]
    fn equal_values_in_other_forms_are_not_lower() {
        let state = state(&[(CM, "30"), ("pods", "2")], &[(5, 1, 1)]);
        let mut d = decision(&[(CM, "30000m"), ("pods", "2")]);
        assert_eq!(
            hold_lowering(&state, &own(&state), &|_| 2, &[], &mut d, BOUND),
            None
        );
    }

    #[test]
    fn an_unreadable_raise_holds_the_key_at_the_stored_value() {
        let mut state = state(&[(CM, "30"), ("pods", "2")], &[]);
        let odd = raised(None::<&QuantityList>, Some(&list(&[(CM, "not-a-quantity")])));
        state.ledger.note(odd, Some(7), 100, BOUND);
        // Nothing pays an unknown amount.
        state.ledger.account(8, 0, cm(50));
        let mut d = decision(&[(CM, "2"), ("pods", "2")]);
        hold_lowering(&state, &own(&state), &|_| 0, &[], &mut d, BOUND).expect("held");
        assert_eq!(d.used[CM].0, "30");
    }

    #[test]
    fn a_charge_counts_for_every_key_of_the_same_objects() {
        assert!(same_objects("count/pods", "pods"));
        assert!(same_objects("cpu", "requests.cpu"));
        assert!(same_objects(CM, "configmaps"));
        assert!(!same_objects("pods", "requests.cpu"));
        assert!(!same_objects("limits.cpu", "requests.cpu"));
    }
}
