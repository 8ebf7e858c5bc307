//! When a computed `used` may be written **below** the stored one.
//!
//! Quota admission charges a create in `status.used` *before* the object is stored: between
//! the charge and the object's arrival on lazyquota's watch, the stored value is right and
//! the objects lazyquota holds are one short. A status write computed in that window, even one
//! conditioned on the quota's latest resourceVersion, takes the charge back, and the next
//! create is admitted past `hard` (kubernetes #123434). No resourceVersion closes the window:
//! the charge is at some R and the object lands after R, so caches that observed R may still
//! lack it. Time does: the object is stored within the same request, and both watches deliver
//! it within milliseconds.
//!
//! So every raise of a quota's `status.used` that lazyquota did not write (a [`Charge`]) is
//! kept for [`SETTLE_MS`], and a key is never written below the objects counted **plus the
//! charges of that key still in that window**: a charge whose object is already counted is
//! counted twice for a moment (too high, which is safe and undone when it ages out), one whose
//! object is still on its way is not lost. A key no recent charge touched is written as
//! computed; raising is never held back. The quota is computed again when the last of its
//! charges ages out ([`Held::until_ms`]).
//!
//! Capped at the stored value, that floor assumes the stored value holds every object
//! counted; it does not when a write of lazyquota's was lost (a conflict with a tenant's edit)
//! while it raised the key for an object admitted uncharged (before the quota or key existed).
//! One order is certain, though: a charge at resourceVersion C is made before its object is
//! stored, at some R > C; so while the watches feeding the key have delivered nothing past C,
//! that object is not counted, and the charge is added **uncapped** ([`Charge::revision`]).

use lazyquota_quota::{Quantities, Quantity, QuantityList, StatusDecision};

use crate::engine::{QuotaState, same_quantities};

/// How long a charge someone else made is added to what lazyquota counts: far longer than a
/// create takes from its charge to its watch event (milliseconds), far shorter than what a
/// tenant waits for after deleting.
pub const SETTLE_MS: u64 = 500;

/// Charges kept per quota, at most: beyond, the two oldest are merged into one at the later
/// time (it then ages out later: higher for longer, never lower).
pub const MAX_CHARGES: usize = 32;

/// One raise of a quota's `status.used` by someone else (quota admission), per key.
#[derive(Clone, Debug, PartialEq)]
pub struct Charge {
    /// When it was seen, in the caller's monotonic milliseconds.
    pub at_ms: u64,
    /// The quota's resourceVersion when it was seen: the charge was made at or before it, so
    /// its object is stored after it (unknown: `None`, then never taken as certainly unseen).
    pub revision: Option<u64>,
    /// The keys raised and by how much (unknown if a value did not parse).
    pub raised: Vec<(String, Quantity)>,
    /// Whether older charges were merged into it ([`MAX_CHARGES`]): it is then not one
    /// version's raise, and is never taken for an own write's echo ([`forget_own`]).
    pub merged: bool,
}

/// Keys a computation wanted lower that are written higher for now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The keys.
    pub keys: Vec<String>,
    /// When (in the caller's milliseconds) the last charge on them ages out: compute the
    /// quota again then.
    pub until_ms: u64,
}

/// What someone else raised from `before` to `after`, key by key (a key new in `after` counts
/// whole).
pub fn raised<B: Quantities, A: Quantities>(
    before: Option<&B>,
    after: Option<&A>,
) -> Vec<(String, Quantity)> {
    let Some(after) = after else {
        return Vec::new();
    };
    after
        .entries()
        .filter_map(|(key, now)| {
            let now = Quantity::parse_k8s(now).unwrap_or_else(|_| Quantity::unknown());
            let then = match before.and_then(|b| b.quantity(key)) {
                None => Quantity::from_count(0),
                Some(q) => Quantity::parse_k8s(q).unwrap_or_else(|_| Quantity::unknown()),
            };
            let by = now.sub(&then);
            (by.is_unknown() || by.is_positive() == Some(true)).then(|| (key.clone(), by))
        })
        .collect()
}

/// Adds a charge seen at `now_ms` on the quota at `revision` to `charges`, dropping those
/// aged out and merging the oldest beyond [`MAX_CHARGES`] (at the later revision: certainly
/// unseen for longer, never less).
pub fn note(charges: &mut Vec<Charge>, raised: Vec<(String, Quantity)>, revision: Option<u64>, now_ms: u64) {
    charges.retain(|c| c.at_ms.saturating_add(SETTLE_MS) > now_ms);
    if !raised.is_empty() {
        charges.push(Charge {
            at_ms: now_ms,
            revision,
            raised,
            merged: false,
        });
    }
    while charges.len() > MAX_CHARGES {
        let oldest = charges.remove(0);
        charges[0].raised.extend(oldest.raised);
        charges[0].revision = charges[0].revision.max(oldest.revision);
        charges[0].merged = true;
    }
}

/// Forgets the charge noted at `written`, the resourceVersion a status write of lazyquota's
/// made, when the write was conditioned on the version before it: the watch delivered the
/// write's own event before its response, and what that event raised was the write, whose
/// values are counted — not a charge for objects on their way. Kept, it would be counted
/// twice for [`SETTLE_MS`] (a key just written whole, written again at double) and admission
/// would refuse creates under `hard` meanwhile.
pub fn forget_own(charges: &mut Vec<Charge>, written: u64) {
    charges.retain(|c| c.merged || c.revision != Some(written));
}

/// What a late response's raise still adds to the charges noted: `raised` is what the view
/// held (at `view`) has above a write of lazyquota's (at `written`), and the charges still
/// kept at `now_ms` that were noted at versions after the write and up to the view are that
/// raise's history, seen event by event when the watch delivered them. Only what they fall
/// short of, key by key, is noted again (all of it when there are none: a relist jumped over
/// those versions); noted twice, a charge whose object is on its way would be added twice,
/// above every object there is. Merged charges are not one version's and do not count here
/// (noted again: higher, never lower).
#[must_use]
pub fn not_yet_noted(
    charges: &[Charge],
    written: u64,
    view: u64,
    raised: Vec<(String, Quantity)>,
    now_ms: u64,
) -> Vec<(String, Quantity)> {
    let since_write: Vec<&Charge> = charges
        .iter()
        .filter(|c| c.at_ms.saturating_add(SETTLE_MS) > now_ms)
        .filter(|c| !c.merged && c.revision.is_some_and(|r| r > written && r <= view))
        .collect();
    raised
        .into_iter()
        .filter_map(|(key, by)| {
            let noted = since_write
                .iter()
                .flat_map(|c| c.raised.iter())
                .filter(|(k, _)| *k == key)
                .fold(Quantity::from_count(0), |sum, (_, q)| sum.add(q));
            let rest = by.sub(&noted);
            (rest.is_unknown() || rest.is_positive() == Some(true)).then_some((key, rest))
        })
        .collect()
}

/// Writes every key of `decision` no lower than what is counted plus the charges of that key
/// younger than [`SETTLE_MS`] at `now_ms` — the charges seen on **any** quota of the quota's
/// namespace (`charges`: they are charges for objects of that namespace, which this quota
/// counts too, whether it was charged or created a moment later) — and no higher than the
/// stored value, where there is one, except for the charges made at or after `observed` (the
/// highest resourceVersion the watches feeding the quota delivered): their objects are
/// certainly not counted yet, so they are added whatever is stored. A key with no stored
/// value (a quota or key just added) is written at the floor, or left out (admission then
/// refuses what would charge it: closed, not open) if a charge's amount is unknown. Clears
/// `dirty` when nothing is left to write. Keys in `kept` were not computed (their watches are
/// not synced) and keep the stored value, which holds every charge of this quota up to the
/// version a write is conditioned on (admission's charges are conditioned updates): adding
/// them again would write them twice. The kept value may lack objects admission never
/// charged to this quota; so may the stored value whenever no charge is recent — a key
/// lazyquota cannot compute keeps what admission maintains (and, left uncomputed, is reported).
pub fn hold_lowering(
    state: &QuotaState,
    charges: &[&Charge],
    observed: u64,
    kept: &[String],
    decision: &mut StatusDecision,
    now_ms: u64,
) -> Option<Held> {
    let recent: Vec<&Charge> = charges
        .iter()
        .copied()
        .filter(|c| c.at_ms.saturating_add(SETTLE_MS) > now_ms)
        .collect();
    if recent.is_empty() {
        return None;
    }
    let stored = state.status_used.as_ref();
    let mut held = Held {
        keys: Vec::new(),
        until_ms: 0,
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
        // Every recent charge (perhaps counted already) and those certainly not counted yet.
        let (mut all, mut unseen) = (counted.clone(), counted.clone());
        let mut until_ms = 0;
        for charge in &recent {
            let certain = charge.revision.is_some_and(|r| r >= observed);
            for (_, by) in charge.raised.iter().filter(|(k, _)| same_objects(k, key)) {
                all = all.add(by);
                if certain {
                    unseen = unseen.add(by);
                }
                until_ms = until_ms.max(charge.at_ms.saturating_add(SETTLE_MS));
            }
        }
        if until_ms == 0 {
            continue;
        }
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
        held.until_ms = held.until_ms.max(until_ms);
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

    const CM: &str = "count/configmaps";

    fn list(pairs: &[(&str, &str)]) -> BTreeMap<String, K8sQuantity> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), K8sQuantity((*v).to_owned())))
            .collect()
    }

    /// A quota stored with `used`, and the charges seen (each: when, configmaps raised by).
    fn state(used: &[(&str, &str)], charges: &[(u64, u64)]) -> QuotaState {
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
        for (at_ms, by) in charges {
            note(
                &mut state.charges,
                vec![(CM.to_owned(), Quantity::from_count(*by))],
                None,
                *at_ms,
            );
        }
        state
    }

    fn own(state: &QuotaState) -> Vec<&Charge> {
        state.charges.iter().collect()
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
    fn a_key_is_not_written_below_what_is_counted_plus_its_recent_charges() {
        // 24 counted; 3 charged at 10.0 s and 2 at 10.2 s (their objects may be on the way).
        let state = state(&[(CM, "30"), ("pods", "2")], &[(10_000, 3), (10_200, 2)]);
        let mut d = decision(&[(CM, "24"), ("pods", "2")]);
        let held = hold_lowering(&state, &own(&state), 0, &[], &mut d, 10_300).expect("held");
        assert_eq!(held.keys, vec![CM.to_owned()]);
        assert_eq!(held.until_ms, 10_200 + SETTLE_MS);
        assert_eq!(d.used[CM].0, "29", "24 + 3 + 2");
        assert!(d.dirty);

        // The first charge aged out: 24 + 2.
        let mut d = decision(&[(CM, "24"), ("pods", "2")]);
        hold_lowering(&state, &own(&state), 0, &[], &mut d, 10_000 + SETTLE_MS).expect("held");
        assert_eq!(d.used[CM].0, "26");

        // Every charge aged out: as counted.
        let mut d = decision(&[(CM, "24"), ("pods", "2")]);
        assert_eq!(
            hold_lowering(&state, &own(&state), 0, &[], &mut d, 10_200 + SETTLE_MS),
            None
        );
        assert_eq!(d.used[CM].0, "24");
    }

    /// `state` with `pods` in `spec.hard` and `status.used` but not in `status.hard`: a value
    /// someone else wrote, which admission (charging by `status.hard`) never kept up.
    fn pods_not_enforced(used: &[(&str, &str)]) -> QuotaState {
        let mut state = state(used, &[]);
        state.status_hard = Some(list(&[(CM, "30")]).into());
        state
    }

    #[test]
    fn a_stored_value_whose_key_admission_does_not_enforce_is_never_copied() {
        let state = pods_not_enforced(&[(CM, "4"), ("pods", "1")]);
        assert!(state.maintained(CM) && !state.maintained("pods"));
        // Not computed (its watch is not synced): upstream would copy the stored 1.
        let mut d = decision(&[(CM, "4"), ("pods", "1")]);
        assert!(drop_unmaintained(&state, &["pods".to_owned()], &mut d));
        assert_eq!(
            d.used.keys().collect::<Vec<_>>(),
            vec![CM],
            "pods left out: closed, not open"
        );
        assert!(d.dirty);
        // A key admission enforces keeps its stored value when not computed.
        let mut d = decision(&[(CM, "4"), ("pods", "1")]);
        assert!(!drop_unmaintained(&state, &[CM.to_owned()], &mut d));
        assert_eq!(d.used[CM].0, "4");
    }

    #[test]
    fn behind_the_quota_a_key_admission_does_not_enforce_is_new_and_left_out() {
        // Both keys' watches are behind the quota: the enforced key is not written lower
        // than stored, the other is left out as a new key would be, whatever is stored.
        let state = pods_not_enforced(&[(CM, "4"), ("pods", "9")]);
        let mut d = decision(&[(CM, "3"), ("pods", "2")]);
        assert!(hold_until_caught_up(&state, |_| true, &mut d));
        assert_eq!(d.used[CM].0, "4", "not lower than stored");
        assert!(!d.used.contains_key("pods"), "its stored 9 is nobody's");
        // A raise of an enforced key is written while behind: it only comes closer.
        let mut d = decision(&[(CM, "6")]);
        assert!(!hold_until_caught_up(&state, |k| k == CM, &mut d));
        assert_eq!(d.used[CM].0, "6");
    }

    #[test]
    fn never_above_the_stored_value_and_nothing_written_when_it_stands() {
        let state = state(&[(CM, "30"), ("pods", "2")], &[(10_000, 8)]);
        let mut d = decision(&[(CM, "28"), ("pods", "2")]);
        hold_lowering(&state, &own(&state), 0, &[], &mut d, 10_001).expect("held");
        assert_eq!(d.used[CM].0, "30", "28 + 8 is past what admission charged");
        assert!(!d.dirty, "nothing else to write");
    }

    #[test]
    fn raising_and_keys_no_recent_charge_touched_are_written_as_computed() {
        let charged = state(&[(CM, "30"), ("pods", "5")], &[(10_000, 1)]);
        let mut d = decision(&[(CM, "31"), ("pods", "3")]);
        assert_eq!(
            hold_lowering(&charged, &own(&charged), 0, &[], &mut d, 10_001),
            None
        );
        assert_eq!((d.used[CM].0.as_str(), d.used["pods"].0.as_str()), ("31", "3"));
        let uncharged = state(&[(CM, "30"), ("pods", "2")], &[]);
        let mut d = decision(&[(CM, "1"), ("pods", "2")]);
        assert_eq!(
            hold_lowering(&uncharged, &own(&uncharged), 0, &[], &mut d, 0),
            None
        );
        assert_eq!(d.used[CM].0, "1");
    }

    #[test]
    fn a_charge_no_watch_has_come_past_is_added_whatever_is_stored() {
        // Counted 5, stored 5 (an uncharged object counted, a charge on a stale value): the
        // charge at 85 is for an object stored after 85, and the watches delivered up to 80.
        let mut state = state(&[(CM, "5"), ("pods", "2")], &[]);
        note(
            &mut state.charges,
            vec![(CM.to_owned(), Quantity::from_count(1))],
            Some(85),
            1_000,
        );
        let mut d = decision(&[(CM, "5"), ("pods", "2")]);
        let held = hold_lowering(&state, &own(&state), 80, &[], &mut d, 1_001).expect("held");
        assert_eq!(held.keys, vec![CM.to_owned()]);
        assert_eq!(d.used[CM].0, "6");
        assert!(d.dirty);
        // Stored above that: counted plus charges, as before (the stored 7 may hold a delete).
        let mut stored_7 = self::state(&[(CM, "7"), ("pods", "2")], &[]);
        stored_7.charges.clone_from(&state.charges);
        let mut d = decision(&[(CM, "5"), ("pods", "2")]);
        hold_lowering(&stored_7, &own(&stored_7), 80, &[], &mut d, 1_001).expect("held");
        assert_eq!(d.used[CM].0, "6");
        // A watch past 85 may have delivered it: capped at the stored value, as counted.
        let mut d = decision(&[(CM, "5"), ("pods", "2")]);
        assert_eq!(hold_lowering(&state, &own(&state), 86, &[], &mut d, 1_001), None);
        assert_eq!(d.used[CM].0, "5");

        // Kept (its watch not synced, so the decision carries the stored 5): the charge at 85
        // is in the stored 5 already — the view is at or past it, or the write conflicts.
        let mut d = decision(&[(CM, "5"), ("pods", "2")]);
        assert_eq!(
            hold_lowering(&state, &own(&state), 80, &[CM.to_owned()], &mut d, 1_001),
            None
        );
        assert_eq!(d.used[CM].0, "5");
    }

    #[test]
    fn a_late_responses_raise_is_noted_only_beyond_the_charges_its_events_brought() {
        let one = |n| vec![(CM.to_owned(), Quantity::from_count(n))];
        let at = |revision, raised| Charge {
            at_ms: 100,
            revision: Some(revision),
            raised,
            merged: false,
        };
        // Written at 6; the events at 7 and 9 charged 1 each; the view (9) holds 2 above the
        // write: noted already.
        let charges = vec![at(6, one(1)), at(7, one(1)), at(9, one(1))];
        assert_eq!(not_yet_noted(&charges, 6, 9, one(2), 200), vec![]);
        // Those charges aged out: all of it again.
        assert_eq!(
            not_yet_noted(&charges, 6, 9, one(2), 100 + SETTLE_MS)[0]
                .1
                .to_k8s()
                .0,
            "2"
        );
        // A relist jumped from 5 to 9 and noted 1: the rest of the raise is noted.
        let charges = vec![at(9, one(1))];
        let rest = not_yet_noted(&charges, 6, 9, one(3), 200);
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].1.to_k8s().0, "2");
        // No charge since the write (a charge at the write's own version or past the view is
        // not this raise's): all of it.
        let charges = vec![at(6, one(1)), at(10, one(1))];
        assert_eq!(not_yet_noted(&charges, 6, 9, one(2), 200)[0].1.to_k8s().0, "2");
        // A merged charge is not one version's: it does not count.
        let mut merged = at(8, one(2));
        merged.merged = true;
        assert_eq!(not_yet_noted(&[merged], 6, 9, one(2), 200)[0].1.to_k8s().0, "2");
    }

    #[test]
    fn equal_values_in_other_forms_are_not_lower() {
        let state = state(&[(CM, "30"), ("pods", "2")], &[(5, 1)]);
        let mut d = decision(&[(CM, "30000m"), ("pods", "2")]);
        assert_eq!(hold_lowering(&state, &own(&state), 0, &[], &mut d, 6), None);
    }

    #[test]
    fn raises_are_read_key_by_key_and_an_unreadable_one_holds_the_key() {
        let before = list(&[(CM, "3"), ("pods", "2"), ("requests.cpu", "1")]);
        let after = list(&[
            (CM, "4"),
            ("pods", "1"),
            ("requests.cpu", "1500m"),
            ("services", "1"),
        ]);
        let got: Vec<(String, String)> = raised(Some(&before), Some(&after))
            .into_iter()
            .map(|(k, q)| (k, q.to_k8s().0))
            .collect();
        let want = [(CM, "1"), ("requests.cpu", "500m"), ("services", "1")];
        assert_eq!(got, want.map(|(k, v)| (k.to_owned(), v.to_owned())));

        let mut state = state(&[(CM, "30"), ("pods", "2")], &[]);
        let odd = raised(None::<&QuantityList>, Some(&list(&[(CM, "not-a-quantity")])));
        note(&mut state.charges, odd, None, 100);
        let mut d = decision(&[(CM, "2"), ("pods", "2")]);
        hold_lowering(&state, &own(&state), 0, &[], &mut d, 101).expect("held");
        assert_eq!(d.used[CM].0, "30");
    }

    #[test]
    fn charges_are_bounded_and_merging_never_lowers() {
        let mut charges = Vec::new();
        for i in 0..(MAX_CHARGES as u64 + 10) {
            note(
                &mut charges,
                vec![(CM.to_owned(), Quantity::from_count(1))],
                Some(i),
                1_000 + i,
            );
        }
        assert_eq!(charges.len(), MAX_CHARGES);
        let total: usize = charges.iter().map(|c| c.raised.len()).sum();
        assert_eq!(total, MAX_CHARGES + 10, "every raise is still there");
        note(&mut charges, Vec::new(), None, 10_000);
        assert!(charges.is_empty(), "aged out");
    }

    #[test]
    fn a_charge_counts_for_every_key_of_the_same_objects() {
        assert!(same_objects("count/pods", "pods"));
        assert!(same_objects("cpu", "requests.cpu"));
        assert!(same_objects(CM, "configmaps"));
        assert!(!same_objects("pods", "requests.cpu"));
        assert!(!same_objects("limits.cpu", "requests.cpu"));
    }

    #[test]
    fn only_the_unmerged_charge_at_the_written_version_is_forgotten() {
        let raise = |by| vec![(CM.to_owned(), Quantity::from_count(by))];
        let mut charges = Vec::new();
        note(&mut charges, raise(1), Some(21), 0);
        note(&mut charges, raise(2), Some(22), 1);
        note(&mut charges, raise(3), Some(23), 2);
        forget_own(&mut charges, 22);
        let left: Vec<Option<u64>> = charges.iter().map(|c| c.revision).collect();
        assert_eq!(
            left,
            vec![Some(21), Some(23)],
            "the charges before and after the write stay"
        );

        // Merged beyond the bound, a charge at the written version holds older raises too.
        let mut charges = Vec::new();
        for i in 0..=MAX_CHARGES as u64 {
            note(&mut charges, raise(1), Some(100 + i), 0);
        }
        assert!(charges[0].merged);
        let merged_at = charges[0].revision.expect("a revision");
        forget_own(&mut charges, merged_at);
        assert_eq!(charges.len(), MAX_CHARGES, "the merged charge stays");
        assert_eq!(charges[0].revision, Some(merged_at));
    }
}
