//! Quotas in the Engine: what is kept of each, and applying, deleting, resetting and
//! recording them (the quota watch's events, admission's charges, our own writes).

use k8s_openapi::{api::core::v1::ResourceQuota, apimachinery::pkg::api::resource::Quantity as K8sQuantity};
use lazyquota_quota::{Quantities, Quantity, QuantityList, QuotaSpec, SpecProblem};

use crate::{
    keys::{ALL_NAMESPACES, ClusterName, QuotaKey},
    policy::{DemandChange, KCP_CLUSTER_SCOPED_ANNOTATION, QuotaPolicy, kcp_cluster_scoped},
};

use super::{Engine, same_quantities};

/// What is kept per quota: parsed, never the full object (a few hundred bytes and the hard keys).
#[derive(Debug)]
pub struct QuotaState {
    /// Parsed spec (hard keys, scopes, problems).
    pub spec: QuotaSpec,
    /// `spec.hard` as the apiserver stores it (copied verbatim into `status.hard`).
    pub spec_hard: Option<QuantityList>,
    /// `status.hard` as last seen or written.
    pub status_hard: Option<QuantityList>,
    /// `status.used` as last seen or written: the previous values that unsynced keys keep.
    pub status_used: Option<QuantityList>,
    /// The resourceVersion a status write is guarded by.
    pub resource_version: Option<String>,
    /// The quota's uid, for Events about it.
    pub uid: Option<String>,
    /// Raises of `status.used` someone else made (quota admission charging creates whose
    /// objects may not be held yet) and the arrivals that pay for them: never written below
    /// what is still owed ([`crate::charges`]). Empty, and so free but for two empty `Vec`s,
    /// on a quota nobody charges.
    pub ledger: crate::charges::Ledger,
    /// The resourceVersion the quota is at and when (the caller's milliseconds) lazyquota saw
    /// it first ([`crate::lowering::hold_until_caught_up`]).
    pub view: (u64, u64),
    /// When (the caller's milliseconds) the quota was first seen, its spec last changed
    /// (`hard` keys or values, scopes) or its `status.hard` last gained a key: for
    /// [`crate::lowering::SETTLE_MS`] after, objects admitted before admission charged a key
    /// (it charges by `status.hard`), or outside the quota's old scope, may still be on their
    /// way, so no key is written lower, or for the first time, until the watches
    /// have caught up with the quota's version.
    pub spec_ms: u64,
}

impl QuotaState {
    /// Parses a quota into the index's policy and the kept state; with `kcp`, kcp's
    /// cluster-scoped quotas are recognised ([`kcp_cluster_scoped`]).
    pub fn from_quota(quota: &ResourceQuota, kcp: bool) -> (QuotaPolicy, Self) {
        let spec = QuotaSpec::from_resource_quota(quota);
        let status = quota.status.as_ref();
        let policy = QuotaPolicy {
            spec_hard: spec.hard_keys.clone(),
            status_hard: status
                .and_then(|s| s.hard.as_ref())
                .map(|h| h.keys().cloned().collect())
                .unwrap_or_default(),
            scopes: spec.scopes.clone(),
            cluster_scoped: kcp
                && kcp_cluster_scoped(
                    quota.metadata.namespace.as_deref().unwrap_or_default(),
                    quota
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(KCP_CLUSTER_SCOPED_ANNOTATION))
                        .map(String::as_str),
                ),
        };
        let state = Self {
            spec,
            spec_hard: quota
                .spec
                .as_ref()
                .and_then(|s| s.hard.as_ref())
                .map(QuantityList::from),
            status_hard: status.and_then(|s| s.hard.as_ref()).map(QuantityList::from),
            status_used: status.and_then(|s| s.used.as_ref()).map(QuantityList::from),
            resource_version: quota.metadata.resource_version.clone(),
            uid: quota.metadata.uid.clone(),
            ledger: crate::charges::Ledger::default(),
            view: (0, 0),
            spec_ms: 0,
        };
        (policy, state)
    }

    /// Whether `self` is another object than `old` under the same name: the quota was deleted
    /// and created again while lazyquota did not see it (a relist after a cut watch, a fresh
    /// read after a conflict). Nothing of the old one may carry over — its charges, its view,
    /// when its spec settled — and it is computed at once, as a new quota is. Without a uid on
    /// either side (a test's quota), they are taken as the same.
    fn replaces_another(&self, old: &QuotaState) -> bool {
        matches!((&self.uid, &old.uid), (Some(new), Some(old)) if new != old)
    }

    /// Carries what is kept across events from `old`, the state this one replaces: its
    /// charges and credits, the view, and when its spec settled.
    fn carry_from(&mut self, old: &QuotaState) {
        self.ledger.clone_from(&old.ledger);
        self.view = old.view;
        self.spec_ms = old.spec_ms;
    }

    /// Whether the stored `status.used` value of `key` is one quota admission has kept up:
    /// admission charges (and refuses) by the keys of `status.hard`, not `spec.hard`, so a
    /// value under a key that `status.hard` lacks was maintained by nobody (a key written
    /// by another hand) and may be below the objects created meanwhile. A value whose key is
    /// in `status.hard` was written together with it and charged for every create since.
    pub fn maintained(&self, key: &str) -> bool {
        self.status_hard.as_ref().is_some_and(|h| h.contains_key(key))
    }

    /// The stored `status.used` value of `key`, if admission maintained it ([`Self::maintained`]);
    /// `None`: the key is new to admission, and nothing was charged to it.
    pub fn maintained_used(&self, key: &str) -> Option<&K8sQuantity> {
        self.status_used
            .as_ref()
            .and_then(|s| s.get(key))
            .filter(|_| self.maintained(key))
    }

    /// Whether `status.hard` has a key `old` lacked: from then on admission charges the key,
    /// and objects admitted before — uncharged — may still be on their way to the watches
    /// ([`QuotaState::spec_ms`] starts again).
    pub fn hard_gained<O: Quantities, N: Quantities>(old: Option<&O>, new: Option<&N>) -> bool {
        new.is_some_and(|n| {
            n.entries()
                .any(|(k, _)| old.is_none_or(|o| o.quantity(k).is_none()))
        })
    }
}

/// What applying a quota did.
#[derive(Debug)]
#[allow(clippy::struct_excessive_bools)] // independent answers, each read once by the caller
pub struct QuotaUpdate {
    /// Demand changes to turn into watch starts and stops.
    pub changes: Vec<DemandChange>,
    /// Whether the quota must be computed now: it is new, or its `spec.hard` (by value) or
    /// its scopes changed. Upstream enqueues only on new or `spec.hard` changes; lazyquota
    /// also recomputes at once on a `scopeSelector` change.
    pub recompute: bool,
    /// Whether someone else changed `status.used` (by value): the quota is to be checked
    /// again a little later (see [`Engine::apply_quota`]).
    pub recheck: bool,
    /// With `recheck`: what was raised, key by key (hand it to [`Engine::note_charge`]).
    pub raised: Vec<(String, Quantity)>,
    /// Whether the quota is new, its spec changed or its `status.hard` gained a key: objects
    /// admitted uncharged may be on their way (note it with [`Engine::note_spec`]).
    pub settle: bool,
    /// Problems of the spec, to report (only when `recompute`).
    pub problems: Vec<SpecProblem>,
    /// The quota is another object than the one held under its name (a new uid): forget
    /// what was recorded about the old one ([`QuotaState::replaces_another`]).
    pub renewed: bool,
    /// New to lazyquota with a stored `status.used` admission maintains: what it holds, to be
    /// carried as a charge ([`crate::charges::Ledger::carry`]).
    pub carried: Vec<(String, Quantity)>,
}

impl Engine {
    // ---- quotas ----------------------------------------------------------------------------

    /// Adds or updates a quota.
    pub fn apply_quota(&mut self, key: QuotaKey, quota: &ResourceQuota) -> QuotaUpdate {
        let (policy, mut state) = QuotaState::from_quota(quota, self.kcp);
        let renewed = self
            .index
            .get(&key)
            .is_some_and(|old| state.replaces_another(&old.payload));
        // The entry this one follows; none when it replaces another object of the same name.
        let held = self.index.get(&key).filter(|_| !renewed);
        if let Some(old) = held {
            state.carry_from(&old.payload);
        }
        let recompute = match held {
            None => true,
            Some(old) => {
                (&**old.demand_namespace() == ALL_NAMESPACES) != policy.cluster_scoped
                    || old.payload.spec.hard_keys != state.spec.hard_keys
                    || !same_quantities(old.payload.spec_hard.as_ref(), state.spec_hard.as_ref())
                    || old.payload.spec.scopes != state.spec.scopes
            }
        };
        // Unlike upstream: a status.used someone else changed (admission charging a create,
        // another writer) is checked against the objects again — later, not at once.
        // Admission charges before the object exists; when the quota's watch delivers that
        // charge *after* the object's watch delivered the object (watches resuming after a
        // cut, in any order), the computation at the object's add compared with the older
        // status, found it equal and wrote nothing, and the charge (too high, if the object
        // was deleted meanwhile) would stand until the resync. Checking at once would instead
        // write a lower value whenever the charge arrives before the object (the usual order):
        // a window in which admission under-charges, and a write racing admission's own. Our
        // own writes are usually recorded before their events arrive and then do not count as
        // a change; an event ahead of its write's response counts until the response says
        // whose it was ([`Engine::forget_own_charge`]).
        let recheck = !recompute
            && held.is_some_and(|old| {
                !same_quantities(old.payload.status_used.as_ref(), state.status_used.as_ref())
            });
        // Raises are charges even when the spec changed too (a fresh read after a conflict can
        // jump over an edit and admission's charges at once).
        let raised = match held {
            Some(old) => crate::charges::raised(old.payload.status_used.as_ref(), state.status_used.as_ref()),
            None => Vec::new(),
        };
        let settle = recompute
            || held.is_some_and(|old| {
                QuotaState::hard_gained(old.payload.status_hard.as_ref(), state.status_hard.as_ref())
            });
        let problems = if recompute {
            state.spec.problems.clone()
        } else {
            Vec::new()
        };
        let carried = if held.is_none() {
            maintained_values(&state)
        } else {
            Vec::new()
        };
        // Most quota events are admission's charges: the keys, scopes and status.hard keys are
        // the same, and so is the demand — the payload alone is replaced.
        let same_policy = held.is_some_and(|old| {
            old.payload.spec.hard_keys == state.spec.hard_keys
                && old.payload.spec.scopes == state.spec.scopes
                && (&**old.demand_namespace() == ALL_NAMESPACES) == policy.cluster_scoped
                && same_keys(old.payload.status_hard.as_ref(), state.status_hard.as_ref())
        });
        let changes = match self.index.payload_mut(&key) {
            Some(payload) if same_policy => {
                *payload = state;
                Vec::new()
            }
            _ => self.index.apply(key, &policy, state),
        };
        QuotaUpdate {
            changes,
            recompute,
            recheck,
            raised,
            settle,
            problems,
            renewed,
            carried,
        }
    }

    /// Removes a quota.
    pub fn delete_quota(&mut self, key: &QuotaKey) -> Vec<DemandChange> {
        self.index.delete(key)
    }

    /// Replaces every quota of `cluster` (a relist of the quota watch): see [`Reset`]. Each quota still there
    /// keeps its recent charges ([`crate::lowering`]): a relist must not forget a charge whose
    /// object is still on its way — unless it is another object of the same name (a new uid),
    /// which starts afresh. Returns the demand changes and, per quota, what someone
    /// else raised in `status.used` since the view held (charges the relist brought instead
    /// of the events missed): the caller notes them as charges, and the quotas new or at
    /// another resourceVersion (the caller notes their view).
    pub fn reset_quotas<'a>(
        &mut self,
        cluster: &ClusterName,
        quotas: impl IntoIterator<Item = (QuotaKey, &'a ResourceQuota)>,
    ) -> Reset {
        let kcp = self.kcp;
        let mut raised = Vec::new();
        let mut moved = Vec::new();
        let mut respecified = Vec::new();
        let mut renewed = Vec::new();
        let mut carried = Vec::new();
        let entries: Vec<_> = quotas
            .into_iter()
            .map(|(key, quota)| {
                let (policy, mut state) = QuotaState::from_quota(quota, kcp);
                let held = self.index.get(&key).map(|e| &e.payload);
                let old = held.filter(|old| !state.replaces_another(old));
                if held.is_some() && old.is_none() {
                    renewed.push(key.clone());
                }
                if old.is_none_or(|old| old.resource_version != state.resource_version) {
                    moved.push(key.clone());
                }
                if old.is_none_or(|old| {
                    old.spec.hard_keys != state.spec.hard_keys
                        || !same_quantities(old.spec_hard.as_ref(), state.spec_hard.as_ref())
                        || old.spec.scopes != state.spec.scopes
                        || QuotaState::hard_gained(old.status_hard.as_ref(), state.status_hard.as_ref())
                }) {
                    respecified.push(key.clone());
                }
                if let Some(old) = old {
                    state.carry_from(old);
                } else {
                    let values = maintained_values(&state);
                    if !values.is_empty() {
                        carried.push((key.clone(), values));
                    }
                }
                if let Some(old) = old
                    && !crate::mutation::active(crate::mutation::Mutation::NoChargeHold)
                {
                    let by = crate::charges::raised(old.status_used.as_ref(), state.status_used.as_ref());
                    if !by.is_empty() {
                        raised.push((key.clone(), by));
                    }
                }
                (key, policy, state)
            })
            .collect();
        Reset {
            changes: self.index.reset(cluster, entries),
            raised,
            moved,
            respecified,
            renewed,
            carried,
        }
    }

    /// Notes what someone else raised in the quota's `status.used`, seen at `now_ms` (the
    /// caller's monotonic milliseconds): until objects stored after it pay for it, or
    /// `bound_ms` has passed, no key is written below what is counted plus what it owes
    /// ([`crate::charges`]).
    pub fn note_charge(
        &mut self,
        key: &QuotaKey,
        raised: Vec<(String, Quantity)>,
        now_ms: u64,
        bound_ms: u64,
    ) {
        self.note_jump(key, raised, None, now_ms, bound_ms);
    }

    /// [`Engine::note_charge`] for what a jump of the view from resourceVersion `since` (a
    /// relist, a fresh read, a late write response) brought ([`crate::charges::Charge::since`]);
    /// `None`: one event's.
    pub fn note_jump(
        &mut self,
        key: &QuotaKey,
        raised: Vec<(String, Quantity)>,
        since: Option<u64>,
        now_ms: u64,
        bound_ms: u64,
    ) {
        if let Some(state) = self.index.payload_mut(key) {
            let revision = state.resource_version.as_deref().and_then(|rv| rv.parse().ok());
            tracing::debug!(quota = %key, ?revision, ?since, raised = ?raised.iter().map(|(k, q)| format!("{k}={}", q.to_k8s().0)).collect::<Vec<_>>(), "charge noted");
            state
                .ledger
                .note_since(raised, revision, since.or(revision), now_ms, bound_ms);
        }
    }

    /// Notes what a write's late response found the view held raised above the write at
    /// `written`, less the charges already noted since that version
    /// ([`crate::charges::not_yet_noted`]).
    pub fn note_charge_after_write(
        &mut self,
        key: &QuotaKey,
        raised: Vec<(String, Quantity)>,
        written: Option<u64>,
        now_ms: u64,
        bound_ms: u64,
    ) {
        let state = self.index.get(key).map(|e| &e.payload);
        let view = state.and_then(|s| s.resource_version.as_deref()?.parse().ok());
        let raised = match (state, written, view) {
            (Some(state), Some(written), Some(view)) => {
                crate::charges::not_yet_noted(&state.ledger.charges, written, view, raised)
            }
            _ => raised,
        };
        self.note_jump(key, raised, written, now_ms, bound_ms);
    }

    /// Notes what a quota new to lazyquota holds, seen at `now_ms`
    /// ([`crate::charges::Ledger::carry`]).
    pub fn note_carried(
        &mut self,
        key: &QuotaKey,
        stored: Vec<(String, Quantity)>,
        now_ms: u64,
        bound_ms: u64,
    ) {
        if let Some(state) = self.index.payload_mut(key) {
            let revision = state.resource_version.as_deref().and_then(|rv| rv.parse().ok());
            state.ledger.carry(stored, revision, now_ms, bound_ms);
        }
    }

    /// Forgets what the quota's event at `written` raised, now that a response said that
    /// version was a write of ours conditioned on the one before it
    /// ([`crate::charges::Ledger::forget_own`]).
    pub fn forget_own_charge(&mut self, key: &QuotaKey, written: u64) {
        tracing::debug!(quota = %key, written, "own write forgotten as a charge");
        if let Some(state) = self.index.payload_mut(key) {
            let view = state.view.0;
            state.ledger.forget_own(written, view);
        }
    }

    /// Forgets the quota's charges paid in full, unless a status write of it is in flight
    /// (`writing`), and those past the create bound ([`crate::charges::Ledger`]).
    /// Returns how many charges went unpaid at the bound since the last call.
    pub fn tidy_charges(&mut self, key: &QuotaKey, writing: bool, now_ms: u64, bound_ms: u64) -> u32 {
        let Some(state) = self.index.payload_mut(key) else {
            return 0;
        };
        state.ledger.expire(now_ms, bound_ms);
        state.ledger.forget_paid(writing);
        state.ledger.take_expired()
    }

    /// Notes that the quota was created, its spec changed or its `status.hard` gained a key,
    /// at `now_ms`: see
    /// [`QuotaState::spec_ms`].
    pub fn note_spec(&mut self, key: &QuotaKey, now_ms: u64) {
        if let Some(state) = self.index.payload_mut(key) {
            state.spec_ms = now_ms;
        }
    }

    /// Notes that the quota's resourceVersion changed at `now_ms`: see
    /// [`QuotaState::view`].
    pub fn note_view(&mut self, key: &QuotaKey, now_ms: u64) {
        if let Some(state) = self.index.payload_mut(key) {
            let rv = state
                .resource_version
                .as_deref()
                .and_then(|rv| rv.parse().ok())
                .unwrap_or(u64::MAX);
            state.view = (rv, now_ms);
            // No charge older than the view can be seen from now on.
            state.ledger.seen_up_to(rv);
        }
    }

    /// Whether a quota event at `resource_version` is older than the view already held (a
    /// write's response or a fresh read got ahead of the watch): applying it would put an
    /// older status and precondition back. resourceVersions are compared as the integers
    /// etcd (and so kube-apiserver and a kcp shard) makes them; one that is not an integer is
    /// never older.
    pub fn is_older_than_known(&self, key: &QuotaKey, resource_version: Option<&str>) -> bool {
        let known = self
            .index
            .get(key)
            .and_then(|e| e.payload.resource_version.as_deref())
            .and_then(|rv| rv.parse::<u64>().ok());
        let seen = resource_version.and_then(|rv| rv.parse::<u64>().ok());
        matches!((seen, known), (Some(seen), Some(known)) if seen < known)
    }

    /// Records the status a write returned, so the next computation compares against it —
    /// only if the quota is still at `precondition`, the resourceVersion the write was
    /// conditioned on. Otherwise the quota watch has already brought this write's own event or
    /// a newer one (admission charging right after the write), and a response arriving after
    /// those must not put the older view and precondition back: every later write would then
    /// conflict on a version that has passed.
    ///
    /// A response that comes after a newer version of the quota (its event skipped by a
    /// relist, say) leaves the view as it is, and returns what that version raised above the
    /// written `used`: charges made after the write, which the view's own history, jumping
    /// from before the write to after it, may not show (note them with
    /// [`Engine::note_charge`]).
    pub fn record_written(
        &mut self,
        key: &QuotaKey,
        precondition: Option<&str>,
        written: &ResourceQuota,
    ) -> Vec<(String, Quantity)> {
        let Some(state) = self.index.payload_mut(key) else {
            return Vec::new();
        };
        if state.resource_version.as_deref() != precondition {
            let newer = match (
                state.resource_version.as_deref().map(str::parse::<u64>),
                written
                    .metadata
                    .resource_version
                    .as_deref()
                    .map(str::parse::<u64>),
            ) {
                (Some(Ok(view)), Some(Ok(ours))) => view > ours,
                // Unreadable versions: the view is not the write's own; what it raises above
                // the written value is taken as a charge (too high at worst).
                (view, ours) => view.is_some() && view != ours,
            };
            if !newer || crate::mutation::active(crate::mutation::Mutation::NoChargeHold) {
                return Vec::new();
            }
            let used = written.status.as_ref().and_then(|s| s.used.as_ref());
            return crate::charges::raised(used, state.status_used.as_ref());
        }
        let keys_before: Vec<String> = state
            .status_hard
            .iter()
            .flat_map(QuantityList::keys)
            .cloned()
            .collect();
        {
            let status = written.status.as_ref();
            state.status_hard = status.and_then(|s| s.hard.as_ref()).map(QuantityList::from);
            state.status_used = status.and_then(|s| s.used.as_ref()).map(QuantityList::from);
            state
                .resource_version
                .clone_from(&written.metadata.resource_version);
        }
        let keys_now: Vec<String> = state
            .status_hard
            .iter()
            .flat_map(QuantityList::keys)
            .cloned()
            .collect();
        if keys_now != keys_before {
            self.index.set_status_hard(key, &keys_now);
        }
        Vec::new()
    }
}

/// What a relist of the quota watch changed ([`Engine::reset_quotas`]).
#[derive(Debug, Default)]
pub struct Reset {
    /// Demand changes.
    pub changes: Vec<DemandChange>,
    /// Per quota, what someone else raised in `status.used` since the view held.
    pub raised: Vec<(QuotaKey, Vec<(String, Quantity)>)>,
    /// Quotas new or at another resourceVersion than the view held.
    pub moved: Vec<QuotaKey>,
    /// Quotas new, whose spec changed (`hard` keys or values, scopes) or whose `status.hard`
    /// gained a key; a quota that replaces another object of its name counts as new.
    pub respecified: Vec<QuotaKey>,
    /// Quotas that replace another object of their name (a new uid): what was recorded about
    /// the old one is to be forgotten.
    pub renewed: Vec<QuotaKey>,
    /// Per quota new to lazyquota, what its stored `status.used` holds where admission
    /// maintains it: carried as a charge ([`crate::charges::Ledger::carry`]).
    pub carried: Vec<(QuotaKey, Vec<(String, Quantity)>)>,
}

/// Whether two resource lists have the same keys (absent is empty).
fn same_keys(a: Option<&QuantityList>, b: Option<&QuantityList>) -> bool {
    let (a, b) = (
        a.into_iter().flat_map(QuantityList::keys),
        b.into_iter().flat_map(QuantityList::keys),
    );
    a.eq(b)
}

/// The positive values of `status.used` admission maintains (their keys in `status.hard`).
fn maintained_values(state: &QuotaState) -> Vec<(String, Quantity)> {
    state
        .status_used
        .iter()
        .flat_map(QuantityList::iter)
        .filter(|(k, _)| state.maintained(k))
        .filter_map(|(k, v)| {
            let q = Quantity::parse_k8s(v).unwrap_or_else(|_| Quantity::unknown());
            (q.is_unknown() || q.is_positive() == Some(true)).then(|| (k.clone(), q))
        })
        .collect()
}
