//! Computing a quota and writing its status: when to write, what a write's answer means (the
//! 409/404/422 policy), and the shadow and withheld reports.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{api::core::v1::ResourceQuota, apimachinery::pkg::api::resource::Quantity as K8sQuantity};
use lazyquota_quota::{Quantity, QuantityList};
use tracing::{debug, warn};

use super::{Effect, FIRST_LIST_GRACE, Metric, Now, Reconciler};
use crate::{
    engine::KeySources,
    keys::{GroupResource, QuotaKey},
    lowering,
    mutation::{Mutation, active},
};

/// A status write: a JSON merge patch of `status.hard` and `status.used` guarded by the
/// quota's resourceVersion (409 if the quota changed meanwhile).
#[derive(Clone, Debug, PartialEq)]
pub struct StatusWrite {
    /// The quota.
    pub key: QuotaKey,
    /// The resourceVersion the write is conditioned on.
    pub precondition: Option<String>,
    /// `status.hard` as written.
    pub hard: BTreeMap<String, K8sQuantity>,
    /// `status.used` as written.
    pub used: BTreeMap<String, K8sQuantity>,
    /// Keys of the stored `status.hard` this write removes.
    pub removed_hard: Vec<String>,
    /// Keys of the stored `status.used` this write removes.
    pub removed_used: Vec<String>,
    /// Keys whose `used` this write lowers (below the stored value, or removed): the keys it
    /// may take an admission charge back from, if its view is behind.
    pub lowers: Vec<String>,
}

/// Why a request failed: the HTTP status code if the server answered, and the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The server's status code (`None`: no answer — a timeout, a cut connection).
    pub code: Option<u16>,
    /// The error.
    pub message: String,
}

fn removed(now: &BTreeMap<String, K8sQuantity>, before: Option<&QuantityList>) -> Vec<String> {
    before
        .into_iter()
        .flat_map(QuantityList::keys)
        .filter(|k| !now.contains_key(*k))
        .cloned()
        .collect()
}

fn lowers(now: &BTreeMap<String, K8sQuantity>, before: Option<&QuantityList>) -> Vec<String> {
    let Some(before) = before else { return Vec::new() };
    before
        .iter()
        .filter(|(key, theirs)| match now.get(*key) {
            None => true,
            Some(ours) => match (Quantity::parse_k8s(ours), Quantity::parse_k8s(theirs)) {
                (Ok(ours), Ok(theirs)) => ours < theirs,
                _ => ours.0 != theirs.0,
            },
        })
        .map(|(k, _)| k.clone())
        .collect()
}

impl Reconciler {
    pub(super) fn sync_quota(&mut self, key: QuotaKey, now: Now) {
        if !self.engine.resolver.knows(&key.cluster) {
            // Before the first discovery no watch can run, so a status written now would lack
            // every watched key, and quota admission refuses creates while a key of
            // `status.hard` has no `used`; KCM writes nothing before its informers sync
            // either. The first discovery enqueues every quota.
            self.queue.done(&key);
            return;
        }
        let Some(computed) = self.engine.compute(&key, now.time) else {
            self.queue.done(&key);
            return;
        };
        if let Some(grace_ends) = self.first_list_pending(&key, &computed.unsynced, now) {
            // Its list's end enqueues the quota again; writing now would only be overwritten.
            // Unless the list outlasts its grace: then the quota is written without it.
            self.queue.done(&key);
            self.queue.add_at(key, grace_ends);
            return;
        }
        for error in &computed.scope_errors {
            warn!(quota = %key, %error, "scope matching failed; usage is the partial sum, as upstream");
        }
        let mut decision = computed.decision;
        if let Some(e) = self.engine.index.get(&key)
            && !active(Mutation::StaleCounts)
            && lowering::drop_unmaintained(&e.payload, &computed.uncomputed, &mut decision)
        {
            debug!(quota = %key, "a key admission did not maintain is not computed yet: left out");
        }
        let now_ms = self.ms(now.instant);
        // Keys not computed keep the stored value; where admission maintains them, it holds
        // every charge of this quota up to the version the write is conditioned on, so none is
        // added to it again.
        let kept: Vec<String> = match self.engine.index.get(&key) {
            Some(e) if !active(Mutation::KeptKeyChargedAgain) => computed
                .uncomputed
                .iter()
                .filter(|k| e.payload.maintained(k))
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        if let Some(held) = self.hold_lowering(&key, &kept, &mut decision, now_ms) {
            debug!(quota = %key, keys = ?held.keys, "recent charges added to what is counted");
            let at = self.epoch + std::time::Duration::from_millis(held.until_ms);
            self.queue.add_at(key.clone(), at);
        }
        if let Some(settled) = self.hold_until_caught_up(&key, &computed.sources, &mut decision, now) {
            debug!(quota = %key, "watches behind the quota's last change: nothing written lower yet");
            self.queue.add_at(key.clone(), settled);
        }
        self.report_withheld(&key, &decision.withheld);
        self.report_unresolved(&key, &computed.uncomputed, &computed.unsynced, now_ms);
        if self.settings.shadow || !decision.dirty {
            let result = if self.settings.shadow {
                let unknown: Vec<String> = computed
                    .uncomputed
                    .iter()
                    .chain(
                        computed
                            .unclaimed
                            .iter()
                            .filter(|_| !active(Mutation::UnclaimedAgrees)),
                    )
                    .cloned()
                    .collect();
                self.report_shadow(&key, &decision, &unknown)
            } else {
                "unchanged"
            };
            self.effects.push(Effect::Metric(Metric::QuotaSync {
                result,
                seconds: None,
            }));
            self.queue.forget(&key);
            self.queue.done(&key);
            return;
        }
        if let Some(until) = self.count_in_flight(&key, now) {
            // Writing now would move the quota past the count's version: the count's answer
            // (or failure) enqueues the quota again.
            debug!(quota = %key, "a count of a new key's objects is in flight: the write waits for it");
            self.queue.done(&key);
            self.queue.add_at(key, until);
            return;
        }
        let Some(state) = self.engine.index.get(&key).map(|e| &e.payload) else {
            self.queue.done(&key);
            return;
        };
        let write = StatusWrite {
            precondition: state.resource_version.clone(),
            removed_hard: removed(&decision.hard, state.status_hard.as_ref()),
            removed_used: removed(&decision.used, state.status_used.as_ref()),
            lowers: lowers(&decision.used, state.status_used.as_ref()),
            key: key.clone(),
            hard: decision.hard,
            used: decision.used,
        };
        self.writing.insert(key, now.instant);
        self.effects.push(Effect::WriteStatus(write));
    }

    /// Holds back lowering `key` below what is counted plus the recent charges of its
    /// namespace (every quota of it: they charge for the same objects).
    fn hold_lowering(
        &self,
        key: &QuotaKey,
        kept: &[String],
        decision: &mut lazyquota_quota::StatusDecision,
        now_ms: u64,
    ) -> Option<lowering::Held> {
        if active(Mutation::NoChargeHold) {
            return None;
        }
        let entry = self.engine.index.get(key)?;
        let charges = self.namespace_charges(key);
        // What the watches it is computed from delivered: a charge at or past it is for an
        // object not counted yet.
        let resources: Vec<GroupResource> = entry.demands().keys().cloned().collect();
        let all = &**entry.demand_namespace() == crate::keys::ALL_NAMESPACES;
        let observed = self
            .watches
            .feeding(key, all, &resources)
            .map(|w| w.observed)
            .max()
            .unwrap_or(0);
        lowering::hold_lowering(&entry.payload, &charges, observed, kept, decision, now_ms)
    }

    /// The charges seen on the quota and its neighbours in its namespace — and in the namespace
    /// it is computed over (a kcp cluster-scoped quota's is `*`: filed there, not in its own):
    /// they are charges for objects it counts too.
    fn namespace_charges(&self, key: &QuotaKey) -> Vec<&lowering::Charge> {
        let Some(entry) = self.engine.index.get(key) else {
            return Vec::new();
        };
        let mut quotas: Vec<&QuotaKey> = vec![key];
        quotas.extend(self.engine.index.in_namespace(&key.cluster, &key.namespace));
        quotas.extend(
            self.engine
                .index
                .in_namespace(&key.cluster, entry.demand_namespace()),
        );
        quotas.sort_unstable();
        quotas.dedup();
        quotas
            .into_iter()
            .filter_map(|k| self.engine.index.get(k))
            .flat_map(|e| &e.payload.charges)
            .collect()
    }

    /// For [`lowering::SETTLE_MS`] after a quota is created or its keys change (and after it,
    /// for keys its `status.hard` lacks), holds back
    /// keys written lower or for the first time while a watch the quota is computed from has
    /// not come as far as the quota's resourceVersion ([`lowering::hold_until_caught_up`]):
    /// an object admitted before a key existed is not charged to it, so only the watch can
    /// tell of it — or, for a new key that counts every object of one resource, a count at or
    /// past that version ([`super::counts`]), asked for here. Returns when to compute again.
    fn hold_until_caught_up(
        &mut self,
        key: &QuotaKey,
        sources: &KeySources,
        decision: &mut lazyquota_quota::StatusDecision,
        now: Now,
    ) -> Option<std::time::Instant> {
        if active(Mutation::NoCatchUp) {
            return None;
        }
        let entry = self.engine.index.get(key)?;
        let settled = self.settles_at(&entry.payload);
        if now.instant >= settled {
            // Every object stored since has been charged to the quota for the keys of its
            // `status.hard`, so the charges (`hold_lowering`) cover what the watches have not
            // delivered yet. Not for a key `status.hard` lacks: admission never charged it, and
            // its first write may come long after the quota changed (a discovery that failed,
            // a hung write holding the concurrency, conflicts). It waits for its watches as in
            // the settling time; the write that puts it into `status.hard` starts that again.
            self.counts.forget(key);
            let unenforced = decision.used.keys().any(|k| !entry.payload.maintained(k));
            if !unenforced || active(Mutation::UnenforcedAfterSettling) {
                // The common case, a settled quota whose keys are all enforced, costs no
                // look at the watches.
                return None;
            }
            let (behind, _) = self.behind_the_quota(key, sources, decision, now);
            let entry = self.engine.index.get(key)?;
            let state = &entry.payload;
            let held = lowering::hold_until_caught_up(
                state,
                |name| behind.contains(name) && !state.maintained(name),
                decision,
            );
            // Computed again once the settling time this write starts is over.
            return held.then(|| now.instant + std::time::Duration::from_millis(lowering::SETTLE_MS));
        }
        let rv = entry.payload.view.0;
        let (mut behind, countable) = self.behind_the_quota(key, sources, decision, now);
        let namespace = if countable.is_empty() {
            None
        } else {
            self.counted_namespace(key)
        };
        for (name, resource) in countable {
            match self.counts.vouching(key, &resource, rv, namespace.as_deref()) {
                Some(objects) => {
                    if let Some(ours) = decision.used.get_mut(&name) {
                        let counted = Quantity::from_count(objects);
                        if Quantity::parse_k8s(ours).is_ok_and(|o| o < counted) {
                            *ours = counted.to_k8s();
                        }
                    }
                    debug!(quota = %key, key = %name, objects, "a count past the quota's version vouches for a new key");
                    self.effects.push(Effect::Metric(Metric::ObjectCount {
                        resource: crate::planner::resource_label(&resource),
                        result: "vouched",
                    }));
                    behind.remove(&name);
                }
                None => self.ask_count(key, &resource, rv),
            }
        }
        let entry = self.engine.index.get(key)?;
        lowering::hold_until_caught_up(&entry.payload, |name| behind.contains(name), decision)
            .then_some(settled)
    }

    /// Whether a count asked at the quota's version is still in flight ([`super::counts`]), and
    /// until when the quota's write waits for it at most: its settling time's end, when the
    /// counts are forgotten.
    fn count_in_flight(&self, key: &QuotaKey, now: Now) -> Option<std::time::Instant> {
        let entry = self.engine.index.get(key)?;
        let settled = self.settles_at(&entry.payload);
        (now.instant < settled && self.counts.waiting(key, entry.payload.view.0)).then_some(settled)
    }

    /// When the quota's settling time ([`lowering::SETTLE_MS`] after its last change) ends.
    fn settles_at(&self, state: &crate::engine::QuotaState) -> std::time::Instant {
        self.epoch + std::time::Duration::from_millis(state.spec_ms + lowering::SETTLE_MS)
    }

    /// The keys of `decision` the watches have not caught up with (see
    /// [`Self::hold_until_caught_up`]), and of them the new ones that only a quiet watch holds
    /// back and that a count of one resource computes (with that resource).
    fn behind_the_quota(
        &self,
        key: &QuotaKey,
        sources: &KeySources,
        decision: &lazyquota_quota::StatusDecision,
        now: Now,
    ) -> (BTreeSet<String>, Vec<(String, GroupResource)>) {
        let (mut behind, mut countable) = (BTreeSet::new(), Vec::new());
        let Some(entry) = self.engine.index.get(key) else {
            return (behind, countable);
        };
        let (rv, at_ms) = entry.payload.view;
        let changed = self.epoch + std::time::Duration::from_millis(at_ms);
        let all = &**entry.demand_namespace() == crate::keys::ALL_NAMESPACES;
        let every: Vec<GroupResource> = entry.demands().keys().cloned().collect();
        // A charge younger than SETTLE_MS on a key of the same objects may be for an object
        // admitted before this key existed (charged for the others, not for it) and stored
        // after the quota's version: no watch position tells of it.
        let now_ms = self.ms(now.instant);
        let recent: Vec<&str> = self
            .namespace_charges(key)
            .into_iter()
            .filter(|c| c.at_ms.saturating_add(lowering::SETTLE_MS) > now_ms)
            .flat_map(|c| c.raised.iter().map(|(k, _)| k.as_str()))
            .collect();
        // A neighbour's key that this quota does not compute counts the objects of its own
        // evaluators (admission charges a key only for objects of those types); a key no
        // evaluator claims could count anything.
        let gates = self.settings.gates;
        let recently_charged = |resources: &[GroupResource]| {
            recent.iter().any(|raised| {
                let theirs = sources
                    .of(raised)
                    .unwrap_or_else(|| crate::demand::replenished_by(raised, gates));
                theirs.is_empty() || theirs.iter().any(|r| resources.contains(r))
            })
        };
        let state = &entry.payload;
        for name in decision.used.keys() {
            // Otherwise only the watches of a key's own objects can hold it back (a new key of
            // another type is not kept waiting for a quiet watch it does not read).
            let own = sources.of(name);
            let resources = own.as_deref().unwrap_or(&every);
            if recently_charged(resources) {
                behind.insert(name.clone());
                continue;
            }
            let caught_up = self
                .watches
                .feeding(key, all, resources)
                .all(|w| w.observed >= rv || self.opened.get(&w.id).is_some_and(|at| *at >= changed));
            if caught_up {
                continue;
            }
            behind.insert(name.clone());
            // New: no value admission maintained, so nothing was charged to it.
            if let Some(resource) = lazyquota_quota::counted_by_list(name, &state.spec.scopes, gates)
                && state.maintained_used(name).is_none()
                && own.as_deref() == Some(std::slice::from_ref(&resource))
            {
                countable.push((name.clone(), resource));
            }
        }
        (behind, countable)
    }

    /// The namespace a count for the quota lists (`None`: every namespace, a kcp
    /// cluster-scoped quota's).
    fn counted_namespace(&self, key: &QuotaKey) -> Option<String> {
        let namespace = self.engine.index.get(key)?.demand_namespace();
        (&**namespace != crate::keys::ALL_NAMESPACES).then(|| namespace.to_string())
    }

    /// Asks for a count of `resource` for the quota at `revision`, once, within the bounds.
    fn ask_count(&mut self, key: &QuotaKey, resource: &GroupResource, revision: u64) {
        if self.engine.index.get(key).is_none() {
            return;
        }
        let Some(served) = self.engine.resolver.get(&key.cluster, resource).cloned() else {
            return;
        };
        let namespace = self.counted_namespace(key);
        if self.counts.ask(key, resource, revision, namespace.as_deref()) {
            debug!(quota = %key, %resource, revision, "a new key on a quiet watch: counting its objects");
            self.effects.push(Effect::CountObjects {
                key: key.clone(),
                served,
                namespace,
            });
        }
    }

    /// Whether a resource the quota needs is still on its first list (not failing, opened less
    /// than [`FIRST_LIST_GRACE`] ago). Writing then would write a status that the list's end
    /// overwrites a moment later; upstream avoids that by waiting for all its informers.
    /// Returns when the last such grace ends.
    fn first_list_pending(
        &self,
        key: &QuotaKey,
        unsynced: &[GroupResource],
        now: Now,
    ) -> Option<std::time::Instant> {
        self.watches
            .first_lists_pending(key, unsynced)
            .filter_map(|id| self.opened.get(&id).map(|at| *at + FIRST_LIST_GRACE))
            .filter(|ends| *ends > now.instant)
            .max()
    }

    /// The seconds since the write of `key` started (its sync's duration, for the metric).
    fn write_seconds(&mut self, key: &QuotaKey, now: Now) -> Option<f64> {
        self.writing
            .remove(key)
            .map(|at| now.instant.saturating_duration_since(at).as_secs_f64())
    }

    pub(super) fn on_write(
        &mut self,
        key: &QuotaKey,
        precondition: Option<&str>,
        result: Result<ResourceQuota, Failure>,
        now: Now,
    ) {
        let seconds = self.write_seconds(key, now);
        self.queue.done(key);
        let (sync, write) = match &result {
            Ok(_) => ("written", "ok"),
            Err(Failure { code: Some(409), .. }) => ("conflict", "conflict"),
            Err(Failure { code: Some(404), .. }) => ("", "not_found"),
            Err(Failure { code: Some(422), .. }) => ("error", "invalid"),
            Err(_) => ("error", "error"),
        };
        if !sync.is_empty() {
            self.effects.push(Effect::Metric(Metric::QuotaSync {
                result: sync,
                seconds,
            }));
        }
        self.effects.push(Effect::Metric(Metric::StatusWrite(write)));
        match result {
            Ok(written) => {
                self.queue.forget(key);
                let precondition = if active(Mutation::OldWritePolicy) {
                    self.engine
                        .index
                        .get(key)
                        .and_then(|e| e.payload.resource_version.clone())
                } else {
                    precondition.map(str::to_owned)
                };
                // Whether this write gives admission keys to charge that it lacked before (its
                // event may have come first: then the event noted it).
                let gains_hard = self.engine.index.get(key).is_some_and(|e| {
                    crate::engine::QuotaState::hard_gained(
                        e.payload.status_hard.as_ref(),
                        written.status.as_ref().and_then(|s| s.hard.as_ref()),
                    )
                });
                let raised = self.engine.record_written(key, precondition.as_deref(), &written);
                let written_rv = written
                    .metadata
                    .resource_version
                    .as_deref()
                    .and_then(|rv| rv.parse::<u64>().ok());
                if let Some(before) = precondition.as_deref().and_then(|p| p.parse::<u64>().ok())
                    && let Some(rv) = written_rv
                    && rv > before
                    && !active(Mutation::OwnWriteIsACharge)
                {
                    // Its event may have come first and been taken for a charge.
                    self.engine.forget_own_charge(key, rv);
                }
                if !raised.is_empty() {
                    // Charges made after the write, behind the newer version already held
                    // (those its events brought are noted already).
                    let at = self.ms(now.instant);
                    self.engine.note_charge_after_write(key, raised, written_rv, at);
                }
                if self
                    .engine
                    .index
                    .get(key)
                    .and_then(|e| e.payload.resource_version.as_ref())
                    == written.metadata.resource_version.as_ref()
                {
                    // Objects stored up to this version (some admitted without a charge to
                    // this quota) must reach the caches before a key is written lower.
                    let at = self.ms(now.instant);
                    self.engine.note_view(key, at);
                    if gains_hard {
                        // Admission charges the new keys from this version on only.
                        self.engine.note_spec(key, at);
                    }
                }
                debug!(quota = %key, resource_version = ?written.metadata.resource_version, "status written");
            }
            Err(Failure { code: Some(409), .. }) => {
                let held = self
                    .engine
                    .index
                    .get(key)
                    .and_then(|e| e.payload.resource_version.clone());
                if active(Mutation::OldWritePolicy) {
                    self.queue.add_rate_limited(key.clone(), now.instant);
                } else if held.as_deref() == precondition {
                    // Nothing newer has come yet, and it may have passed already (a response
                    // older than the watch): read the quota afresh, then compute again.
                    debug!(quota = %key, resource_version = ?held, "status write conflicted; reading the quota");
                    self.effects.push(Effect::ReadQuota(key.clone()));
                } else {
                    // The watch brought the newer version meanwhile: compute from it now.
                    debug!(quota = %key, resource_version = ?held, "status write conflicted; the newer version is here");
                    self.queue.add(key.clone(), now.instant);
                }
            }
            Err(Failure { code: Some(404), .. }) => self.queue.forget(key),
            Err(Failure {
                code: Some(422),
                message,
            }) => {
                // The apiserver refuses the status itself: status.hard copies spec.hard, so a
                // quota that got past validation (an invalid key) cannot be written — upstream
                // fails the same way. Say so on the quota; retry with backoff (an edit of the
                // quota triggers a new computation anyway).
                let delay = self.queue.add_rate_limited(key.clone(), now.instant);
                warn!(quota = %key, error = %message, ?delay, "the apiserver rejected the status as invalid");
                let note = format!("status update rejected as invalid: {message}");
                self.emit(key, true, "StatusRejected", note);
            }
            Err(Failure { message, .. }) => {
                let delay = self.queue.add_rate_limited(key.clone(), now.instant);
                warn!(quota = %key, error = %message, ?delay, "status write failed; retrying");
            }
        }
    }

    pub(super) fn on_read(&mut self, key: &QuotaKey, result: Result<ResourceQuota, Failure>, now: Now) {
        match result {
            // Deleted while the read was on its way (its watch event came first): the read is
            // older than the delete, and applying it would bring the quota back for good.
            Ok(_) if self.engine.index.get(key).is_none() => {
                debug!(quota = %key, "read answered for a quota deleted meanwhile; ignored");
            }
            Ok(quota) => {
                let held = self
                    .engine
                    .index
                    .get(key)
                    .and_then(|e| e.payload.resource_version.clone());
                if held == quota.metadata.resource_version {
                    // Nothing newer after all: retry with backoff rather than at once.
                    self.queue.add_rate_limited(key.clone(), now.instant);
                } else {
                    self.apply_quota(&quota, now);
                    self.queue.add(key.clone(), now.instant);
                }
            }
            // Deleted meanwhile: its watch event removes it.
            Err(Failure { code: Some(404), .. }) => {}
            Err(Failure { message, .. }) => {
                let delay = self.queue.add_rate_limited(key.clone(), now.instant);
                warn!(quota = %key, error = %message, ?delay, "reading the quota after a conflict failed; retrying");
            }
        }
    }
}
