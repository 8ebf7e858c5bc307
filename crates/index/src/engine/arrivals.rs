//! Arrivals: what an object's watch event makes it count more for the quotas computed over
//! its partition, handed to each quota's charges to pay them ([`crate::charges`]).

use lazyquota_quota::{
    Evaluator, FeatureGates, Quantity, QuotaObject, QuotaScopes, Time, calculate_usage,
    evaluator_for_resource,
};

use crate::{keys::QuotaKey, store::PartitionKey};

use super::Engine;

/// What an object counts for `keys` under `scopes`, key by key (`None`: its scopes could not
/// be evaluated, so it pays nothing).
fn usage_of<T: QuotaObject>(
    object: &T,
    keys: &[String],
    scopes: &QuotaScopes,
    now: Time,
    gates: FeatureGates,
) -> Option<Vec<(String, Quantity)>> {
    let stats = calculate_usage(keys, scopes, std::iter::once(object), now, gates);
    stats
        .scope_error
        .is_none()
        .then(|| stats.used.into_iter().collect())
}

/// How much more `new` counts than `old` (absent: nothing) for `keys`, key by key; only what
/// grew. `None` if either could not be evaluated.
pub(super) fn growth<T: QuotaObject>(
    old: Option<&T>,
    new: &T,
    keys: &[String],
    scopes: &QuotaScopes,
    now: Time,
    gates: FeatureGates,
) -> Vec<(String, Quantity)> {
    let Some(after) = usage_of(new, keys, scopes, now, gates) else {
        return Vec::new();
    };
    let before = match old {
        Some(old) => match usage_of(old, keys, scopes, now, gates) {
            Some(before) => before,
            None => return Vec::new(),
        },
        None => Vec::new(),
    };
    after
        .into_iter()
        .filter_map(|(key, q)| {
            let grew = match before.iter().find(|(k, _)| *k == key) {
                Some((_, b)) => q.sub(b),
                None => q,
            };
            (grew.is_positive() == Some(true)).then_some((key, grew))
        })
        .collect()
}

/// What one more object of `evaluator`'s resource counts for those of `keys` whose value is
/// one per object of it, all of them ([`lazyquota_quota::counted_by_list`]): 1 each. What a
/// count-only store (or a claim, whose other keys join it with its pod) can pay.
pub(super) fn one_more(
    evaluator: &Evaluator,
    keys: &[String],
    scopes: &QuotaScopes,
    gates: FeatureGates,
) -> Vec<(String, Quantity)> {
    let resource = evaluator.group_resource();
    keys.iter()
        .filter(|k| lazyquota_quota::counted_by_list(k, scopes, gates).as_ref() == Some(&resource))
        .map(|k| (k.clone(), Quantity::from_count(1)))
        .collect()
}

/// What an object adds to the keys an evaluator matches (given those keys and the quota's
/// scopes), key by key.
pub(super) type Growth<'a> = dyn Fn(&Evaluator, &[String], &QuotaScopes) -> Vec<(String, Quantity)> + 'a;

impl Engine {
    /// An object arrived (`Added`, or `Updated` to count more) in partition `p` at `revision`:
    /// each quota computed over `p` that may owe a charge this pays — one made before
    /// `revision`, or one not seen yet (its view is before `revision`) — is handed what the
    /// object adds to its keys (`arrived`, given the quota's matching keys and scopes).
    /// Returns whether a charge was paid (the quota is then to be computed again).
    pub(super) fn account_arrival(
        &mut self,
        p: &PartitionKey,
        revision: Option<u64>,
        arrived: &Growth<'_>,
    ) -> bool {
        let gates = self.gates;
        let Some(revision) = revision else {
            return false;
        };
        // The quotas that may owe a charge this pays: one made before `revision`, or one not
        // seen yet (their view is before `revision`). Usually few or none.
        let owing: Vec<(QuotaKey, u64)> = self
            .index
            .in_namespace(&p.cluster, &p.namespace)
            .filter_map(|key| {
                let state = &self.index.get(key)?.payload;
                let view = state
                    .resource_version
                    .as_deref()
                    .and_then(|rv| rv.parse::<u64>().ok())
                    .unwrap_or(u64::MAX);
                let owes_before = state
                    .ledger
                    .charges
                    .iter()
                    .any(|c| c.since.is_some_and(|r| r < revision) && c.is_owed());
                (owes_before || view < revision).then(|| (key.clone(), view))
            })
            .collect();
        if owing.is_empty() {
            return false;
        }
        let Some(evaluator) = evaluator_for_resource(&p.resource, gates) else {
            return false;
        };
        let mut paid = false;
        for (key, view) in owing {
            let Some(state) = self.index.payload_mut(&key) else {
                continue;
            };
            let keys = evaluator.matching_resources(&state.spec.hard_keys, gates);
            if keys.is_empty() {
                continue;
            }
            let grew = arrived(&evaluator, &keys, &state.spec.scopes);
            if !grew.is_empty() {
                let paid_now = state.ledger.account(revision, view, grew);
                tracing::debug!(quota = %key, revision, view, paid = paid_now, credits = state.ledger.credits.len(), "arrival");
                paid |= paid_now;
            }
        }
        paid
    }
}
