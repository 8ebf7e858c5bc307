//! Computing a quota and writing its status: when to write, what a write's answer means (the
//! 409/404/422 policy), and the shadow and withheld reports.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{api::core::v1::ResourceQuota, apimachinery::pkg::api::resource::Quantity as K8sQuantity};
use lazyquota_quota::{Quantity, QuantityList};
use tracing::{debug, warn};

use super::{Effect, FIRST_LIST_GRACE, Listed, Metric, Now, Proof, Reconciler};
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

impl StatusWrite {
    /// The request's body: a JSON merge patch of `status.hard` and `status.used` — the keys
    /// computed now, and `null` for every key the stored status had that is no longer there —
    /// and the resourceVersion it is conditioned on (409 if the quota changed meanwhile).
    ///
    /// Not a PUT of the status subresource with a body of our own: ResourceQuota's status
    /// strategy keeps only the old `spec`, so a PUT whose metadata lacks the quota's labels and
    /// annotations removes them (lazyquota keeps neither). That wiped `helm.sh` ownership
    /// annotations and kcp's `experimental.quota.kcp.io/cluster-scoped` before this patch.
    #[must_use]
    pub fn patch(&self) -> serde_json::Value {
        fn merged(
            now: &BTreeMap<String, K8sQuantity>,
            removed: &[String],
        ) -> serde_json::Map<String, serde_json::Value> {
            let mut out: serde_json::Map<String, serde_json::Value> = now
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.0.clone())))
                .collect();
            for gone in removed {
                out.entry(gone.clone()).or_insert(serde_json::Value::Null);
            }
            out
        }
        let mut patch = serde_json::json!({
            "status": {
                "hard": merged(&self.hard, &self.removed_hard),
                "used": merged(&self.used, &self.removed_used),
            }
        });
        if let Some(rv) = &self.precondition {
            patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
        }
        patch
    }
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
        if let Some(&until) = self.conflicted.get(&key) {
            self.queue.done(&key);
            if now.instant < until {
                // A write conflicted: computing again before the newer version is here would
                // conflict again.
                self.queue.add_at(key, until);
            } else {
                // The watch has not brought it in `CONFLICT_WAIT`: read it.
                debug!(quota = %key, "the version a write conflicted with has not come: reading the quota");
                self.conflicted.remove(&key);
                self.effects.push(Effect::ReadQuota(key));
            }
            return;
        }
        if !self.engine.resolver.knows(&key.cluster) {
            // Before the first discovery no watch can run, so a status written now would lack
            // every watched key, and quota admission refuses creates while a key of
            // `status.hard` has no `used`; KCM writes nothing before its informers sync
            // either. The first discovery enqueues every quota.
            self.queue.done(&key);
            return;
        }
        // Charges paid in full are forgotten (no write of the quota is in flight when it is
        // synced), and those past the create bound.
        let writing = self.writing.contains_key(&key);
        let expired = self
            .engine
            .tidy_charges(&key, writing, self.ms(now.instant), self.bound_ms());
        if expired > 0 {
            debug!(quota = %key, expired, "charges no object paid dropped at the bound");
            self.effects.push(Effect::Metric(Metric::ChargesExpired(expired)));
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
        self.refine_carried(&key, &computed);
        // The keys shadow mode calls unknown, taken before the decision moves out.
        let unknown: Vec<String> = if self.settings.shadow {
            computed
                .not_computed()
                .filter(|k| !active(Mutation::UnclaimedAgrees) || !computed.unclaimed.contains(k))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
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
        if let Some(held) = self.hold_lowering(&key, &computed.sources, &kept, &mut decision, now) {
            debug!(quota = %key, keys = ?held.keys, "charges still owed added to what is counted");
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
        if let Some(until) = self.proof_in_flight(&key, now) {
            // Writing now would move the quota past the list's version: the list's answer (or
            // failure) enqueues the quota again.
            debug!(quota = %key, "a list to prove a watch caught up is in flight: the write waits for it");
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
        if !write.lowers.is_empty()
            && let Some(at) = self.last_write.get(&key).map(|at| *at + self.settings.lower_pace)
            && now.instant < at
        {
            // Lowered again soon after the last write: written together with what follows.
            self.queue.done(&key);
            self.queue.add_at(key, at);
            return;
        }
        debug!(quota = %key, precondition = ?write.precondition, used = ?write.used.values().map(|q| q.0.clone()).collect::<Vec<_>>(), "writing");
        self.last_write.insert(key.clone(), now.instant);
        self.writing.insert(key, now.instant);
        self.effects.push(Effect::WriteStatus(write));
    }

    /// What a quota first seen with a status carries ([`crate::charges::Ledger::carry`]) is
    /// cut, key by key, to what the store does not explain, once the store has caught up with
    /// the quota (or counts at least the stored value).
    fn refine_carried(&mut self, key: &QuotaKey, computed: &crate::engine::Computed) {
        let Some(entry) = self.engine.index.get(key) else {
            return;
        };
        let state = &entry.payload;
        let carried: Vec<String> = computed
            .decision
            .used
            .keys()
            .filter(|k| state.ledger.carries(k) && !computed.uncomputed.contains(*k))
            .cloned()
            .collect();
        if carried.is_empty() {
            return;
        }
        let mut refined = Vec::new();
        for name in carried {
            let (Some(stored), Ok(counted)) = (
                state.maintained_used(&name).map(Quantity::parse_k8s),
                Quantity::parse_k8s(&computed.decision.used[&name]),
            ) else {
                continue;
            };
            let Ok(stored) = stored else { continue };
            let unexplained = stored
                .sub(&counted)
                .sub(&state.ledger.owed_besides_carried(&name));
            let caught_up = counted >= stored
                || self
                    .behind_the_quota(key, &computed.sources, std::slice::from_ref(&name))
                    .is_empty();
            if caught_up {
                refined.push((name, unexplained));
            }
        }
        if let Some(state) = self.engine.index.payload_mut(key) {
            for (name, unexplained) in refined {
                debug!(quota = %key, key = %name, unexplained = %unexplained.to_k8s().0, "what the quota held when first seen, cut to what the store does not explain");
                state.ledger.refine_carried(&name, &unexplained);
            }
        }
    }

    /// Holds back lowering `key` below what is counted plus what the charges of its
    /// namespace still owe (every quota of it: they charge for the same objects).
    fn hold_lowering(
        &self,
        key: &QuotaKey,
        sources: &KeySources,
        kept: &[String],
        decision: &mut lazyquota_quota::StatusDecision,
        now: Now,
    ) -> Option<lowering::Held> {
        if active(Mutation::NoChargeHold) {
            return None;
        }
        let entry = self.engine.index.get(key)?;
        let charges = self.namespace_charges(key, now);
        // How far the watches a key is computed from have delivered: a charge at or past it is
        // for an object certainly not counted yet. The least of them, where several feed it.
        let every: Vec<GroupResource> = entry.demands().keys().cloned().collect();
        let all = &**entry.demand_namespace() == crate::keys::ALL_NAMESPACES;
        let observed = |name: &str| {
            let own = sources.of(name);
            let resources = own.as_deref().unwrap_or(&every);
            self.watches
                .feeding(key, all, resources)
                .map(|w| w.observed)
                .min()
                .unwrap_or(0)
        };
        lowering::hold_lowering(
            &entry.payload,
            &charges,
            &observed,
            kept,
            decision,
            self.bound_ms(),
        )
    }

    /// The charges seen on the quota and its neighbours in its namespace — and in the namespace
    /// it is computed over (a kcp cluster-scoped quota's is `*`: filed there, not in its own):
    /// they are charges for objects it counts too.
    fn namespace_charges(&self, key: &QuotaKey, now: Now) -> Vec<&crate::charges::Charge> {
        let Some(entry) = self.engine.index.get(key) else {
            return Vec::new();
        };
        let (now_ms, bound_ms) = (self.ms(now.instant), self.bound_ms());
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
            .flat_map(|e| &e.payload.ledger.charges)
            .filter(|c| c.is_owed() && c.at_ms.saturating_add(bound_ms) > now_ms)
            .collect()
    }

    /// Holds back keys written lower or for the first time while a watch the quota is computed
    /// from has not caught up with the quota's resourceVersion ([`lowering::hold_until_caught_up`]):
    /// an object stored before it — admitted before admission charged the key, so no charge
    /// tells of it — may still be on its way. A watch has caught up once it delivered an event
    /// at or past that version, opened after lazyquota saw it, or a consistent list at or past
    /// it matched the store ([`super::proofs`], asked for here). Where the list fails or is not
    /// answered, a key admission maintains is written once the quota's settling time
    /// ([`lowering::SETTLE_MS`] after lazyquota saw its version) is over; one admission never
    /// charged waits for its watch. Returns when to compute again, if anything is held that no
    /// event will bring back.
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
        let state = &entry.payload;
        // Only a key written lower or for the first time needs the watches: a raise only
        // brings the stored value closer to the objects that exist.
        let candidates: Vec<String> = decision
            .used
            .iter()
            .filter(|(name, ours)| match state.maintained_used(name) {
                None => true,
                // The common case, unchanged, costs no parse.
                Some(theirs) if theirs.0 == ours.0 => false,
                Some(theirs) => match (Quantity::parse_k8s(ours), Quantity::parse_k8s(theirs)) {
                    (Ok(o), Ok(t)) => o < t,
                    _ => true,
                },
            })
            .map(|(name, _)| name.clone())
            .collect();
        if candidates.is_empty() {
            // The common case: nothing lowered. No look at the watches, no list kept.
            self.proofs.forget(key);
            return None;
        }
        let rv = state.view.0;
        let settled = self.settles_at(state);
        let behind = self.behind_the_quota(key, sources, &candidates);
        if behind.is_empty() {
            self.proofs.forget(key);
            return None;
        }
        let namespace = self.counted_namespace(key);
        let mut held = BTreeSet::new();
        let mut again = None;
        for (name, resources) in &behind {
            let maintained = self
                .engine
                .index
                .get(key)
                .is_some_and(|e| e.payload.maintained(name));
            if active(Mutation::CatchUpOnlyWhileSettling) && now.instant >= settled {
                // The old rule: once settled, a key is lowered without a look at the watches.
                continue;
            }
            let mut waits = false;
            for resource in resources {
                match self.proofs.proof(key, resource, rv, namespace.as_deref()) {
                    Proof::None => {
                        self.ask_proof(key, resource, rv);
                        waits = true;
                    }
                    Proof::Pending | Proof::Failed
                        if now.instant >= settled
                            && (maintained || active(Mutation::UnenforcedAfterSettling)) =>
                    {
                        debug!(quota = %key, key = %name, %resource, "no proof the watch caught up with the quota: the settling time ended the wait");
                        self.effects.push(Effect::Metric(Metric::SettleWaitEnded(
                            crate::planner::resource_label(resource),
                        )));
                    }
                    // A list that differed is compared again as the watch delivers
                    // ([`super::proofs::Proofs::listing`]).
                    Proof::Listed(_) | Proof::Pending | Proof::Failed => waits = true,
                }
            }
            if waits {
                held.insert(name.clone());
                // The settling time may end the wait for a maintained key; one never charged
                // is looked at again now and then (its watch's events bring it back too).
                let at = if maintained && now.instant < settled {
                    settled
                } else {
                    now.instant + std::time::Duration::from_millis(lowering::SETTLE_MS)
                };
                again = Some(again.map_or(at, |a: std::time::Instant| a.min(at)));
            }
        }
        let entry = self.engine.index.get(key)?;
        lowering::hold_until_caught_up(&entry.payload, |name| held.contains(name), decision)
            .then_some(again)
            .flatten()
    }

    /// Whether a list asked at the quota's version is still in flight, or answered and not yet
    /// matched by the store (the watch has events to deliver up to it), and until when the
    /// quota's write waits for it at most: its settling time's end. Any write moves the quota
    /// past the list, and another would be asked.
    fn proof_in_flight(&self, key: &QuotaKey, now: Now) -> Option<std::time::Instant> {
        let entry = self.engine.index.get(key)?;
        let settled = self.settles_at(&entry.payload);
        if now.instant >= settled {
            return None;
        }
        let rv = entry.payload.view.0;
        if self.proofs.waiting(key, rv) {
            return Some(settled);
        }
        let namespace = self.counted_namespace(key);
        let demand_namespace = entry.demand_namespace().clone();
        let all = &*demand_namespace == crate::keys::ALL_NAMESPACES;
        let unmatched = self.proofs.listing_of(key).any(|resource| {
            let resources = [resource.clone()];
            matches!(
                self.proofs.proof(key, resource, rv, namespace.as_deref()),
                Proof::Listed(_)
            ) && self.watches.feeding(key, all, &resources).any(|w| {
                w.observed < rv
                    && !self.proved(
                        key,
                        resource,
                        rv,
                        namespace.as_deref(),
                        &demand_namespace,
                        w.observed,
                    )
            })
        });
        unmatched.then_some(settled)
    }

    /// When the quota's settling time ends: [`lowering::SETTLE_MS`] after lazyquota saw its
    /// version (or its spec last changed, if later).
    fn settles_at(&self, state: &crate::engine::QuotaState) -> std::time::Instant {
        let since = state.view.1.max(state.spec_ms);
        self.epoch + std::time::Duration::from_millis(since + lowering::SETTLE_MS)
    }

    /// Of `candidates` (keys of the quota to be written lower or for the first time), those
    /// a watch of their own objects has not caught up for, with those watches' resources:
    /// not delivered an event at or past the quota's version, not opened after lazyquota saw
    /// it, and no list at or past it matching the store ([`super::proofs`]).
    fn behind_the_quota(
        &self,
        key: &QuotaKey,
        sources: &KeySources,
        candidates: &[String],
    ) -> BTreeMap<String, Vec<GroupResource>> {
        let mut behind = BTreeMap::new();
        let Some(entry) = self.engine.index.get(key) else {
            return behind;
        };
        let (rv, at_ms) = entry.payload.view;
        let changed = self.epoch + std::time::Duration::from_millis(at_ms);
        let demand_namespace = entry.demand_namespace().clone();
        let all = &*demand_namespace == crate::keys::ALL_NAMESPACES;
        let namespace = self.counted_namespace(key);
        let every: Vec<GroupResource> = entry.demands().keys().cloned().collect();
        for name in candidates {
            // Only the watches of a key's own objects can hold it back (a new key of another
            // type is not kept waiting for a quiet watch it does not read).
            let own = sources.of(name);
            let resources = own.as_deref().unwrap_or(&every);
            let mut waiting: Vec<GroupResource> = Vec::new();
            for w in self.watches.feeding(key, all, resources) {
                let Some(watched) = self.watches.key_of(w.id) else {
                    continue;
                };
                let caught_up = w.observed >= rv
                    || self.opened.get(&w.id).is_some_and(|at| *at >= changed)
                    || self.proved(
                        key,
                        &watched.resource,
                        rv,
                        namespace.as_deref(),
                        &demand_namespace,
                        w.observed,
                    );
                if !caught_up && !waiting.contains(&watched.resource) {
                    waiting.push(watched.resource.clone());
                }
            }
            if !waiting.is_empty() {
                behind.insert(name.clone(), waiting);
            }
        }
        behind
    }

    /// Whether a list of `resource` at or past the quota's version `rv` shows what the store
    /// holds for the quota, its watch having delivered up to `observed`.
    fn proved(
        &self,
        key: &QuotaKey,
        resource: &GroupResource,
        rv: u64,
        namespace: Option<&str>,
        demand_namespace: &std::sync::Arc<str>,
        observed: u64,
    ) -> bool {
        let Proof::Listed(listed) = self.proofs.proof(key, resource, rv, namespace) else {
            return false;
        };
        let p = crate::store::PartitionKey {
            cluster: key.cluster.clone(),
            resource: resource.clone(),
            namespace: demand_namespace.clone(),
        };
        self.engine
            .held_len(&p)
            .is_some_and(|held| listed.matches(held, observed))
    }

    /// The namespace a list for the quota lists (`None`: every namespace, a kcp
    /// cluster-scoped quota's).
    fn counted_namespace(&self, key: &QuotaKey) -> Option<String> {
        let namespace = self.engine.index.get(key)?.demand_namespace();
        (&**namespace != crate::keys::ALL_NAMESPACES).then(|| namespace.to_string())
    }

    /// Asks for a list of `resource` for the quota at `revision`, once, within the bounds.
    fn ask_proof(&mut self, key: &QuotaKey, resource: &GroupResource, revision: u64) {
        if self.engine.index.get(key).is_none() {
            return;
        }
        let Some(served) = self.engine.resolver.get(&key.cluster, resource).cloned() else {
            return;
        };
        let namespace = self.counted_namespace(key);
        if self.proofs.ask(key, resource, revision, namespace.as_deref()) {
            debug!(quota = %key, %resource, revision, "a watch behind the quota: listing its objects to compare with the store");
            self.effects.push(Effect::ListForProof {
                key: key.clone(),
                served,
                namespace,
            });
        }
    }

    /// A list for a proof was answered: what it says of the store now (`matched`,
    /// `differed`), for the metric.
    pub(super) fn proof_answered(
        &self,
        key: &QuotaKey,
        resource: &GroupResource,
        listed: &Listed,
    ) -> &'static str {
        let Some(entry) = self.engine.index.get(key) else {
            return "differed";
        };
        let demand_namespace = entry.demand_namespace().clone();
        let all = &*demand_namespace == crate::keys::ALL_NAMESPACES;
        let resources = [resource.clone()];
        let observed = self
            .watches
            .feeding(key, all, &resources)
            .map(|w| w.observed)
            .min();
        let p = crate::store::PartitionKey {
            cluster: key.cluster.clone(),
            resource: resource.clone(),
            namespace: demand_namespace,
        };
        match (observed, self.engine.held_len(&p)) {
            (Some(observed), Some(held)) if listed.matches(held, observed) => "matched",
            _ => "differed",
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
                    self.engine
                        .note_charge_after_write(key, raised, written_rv, at, self.bound_ms());
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
                    // Nothing newer has come yet: the watch brings it in a moment (its event
                    // recomputes the quota); failing that, the quota is read afresh.
                    debug!(quota = %key, resource_version = ?held, "status write conflicted; waiting for the newer version");
                    let until = now.instant + super::CONFLICT_WAIT;
                    self.conflicted.insert(key.clone(), until);
                    self.queue.add_at(key.clone(), until);
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
        // The write is answered: the charges paid in full while it was in flight go.
        let expired = self
            .engine
            .tidy_charges(key, false, self.ms(now.instant), self.bound_ms());
        if expired > 0 {
            self.effects.push(Effect::Metric(Metric::ChargesExpired(expired)));
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
