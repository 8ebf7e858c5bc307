//! The shadow and withheld books: which keys lazyquota did not compute, which it withholds,
//! and where shadow mode disagrees with the stored status. Read by metrics and readiness.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use lazyquota_quota::StatusDecision;
use tracing::{info, warn};

use super::Reconciler;
use crate::{
    engine::same_value,
    keys::{GroupResource, QuotaKey},
};

/// What is reported per quota beyond its status, keyed by the quota's `cluster|ns/name`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Books {
    /// Shadow-mode disagreements now: (quota, key) → (ours, stored).
    pub disagreements: BTreeMap<(String, String), (String, String)>,
    /// Shadow mode: each quota's latest comparison (true: every key computed and agreed).
    pub shadow_verdicts: BTreeMap<String, bool>,
    /// Shadow mode: (quota, key) pairs lazyquota did not compute last time (unknown).
    pub shadow_unknown: BTreeSet<(String, String)>,
    /// (quota, key) pairs whose usage is unknown (an object carries a quantity beyond what
    /// lazyquota holds): withheld from status.used, never written lower.
    pub withheld: BTreeSet<(String, String)>,
    /// (quota, key) pairs not computed for [`super::UNRESOLVED_WARNING`] or longer (their
    /// type not served, or not listed): the quota was told with a Warning Event.
    pub unresolved: BTreeSet<(String, String)>,
    /// (quota, key) pairs not computed at their quota's last computation, and since when (the
    /// reconciler's milliseconds): they join `unresolved` once that is long enough ago.
    pub uncomputed_since: BTreeMap<(String, String), u64>,
}

impl Books {
    /// Drops what is reported about every quota `forget` names (by its `cluster|ns/name`):
    /// deleted, or of a logical cluster let go, it has no verdict or withheld key any more.
    pub fn forget_quotas(&mut self, forget: impl Fn(&str) -> bool) {
        self.disagreements.retain(|(q, _), _| !forget(q));
        self.withheld.retain(|(q, _)| !forget(q));
        self.unresolved.retain(|(q, _)| !forget(q));
        self.uncomputed_since.retain(|(q, _), _| !forget(q));
        self.shadow_unknown.retain(|(q, _)| !forget(q));
        self.shadow_verdicts.retain(|q, _| !forget(q));
    }
}

/// The keys `set` holds for `quota` (a range of the ordered set, not a scan of every quota).
fn keys_of(set: &BTreeSet<(String, String)>, quota: &str) -> Vec<String> {
    set.range((quota.to_owned(), String::new())..)
        .take_while(|(q, _)| q == quota)
        .map(|(_, k)| k.clone())
        .collect()
}

impl Reconciler {
    /// Tells a quota, once per change, which of its keys are withheld (log line, Event, and
    /// `lazyquota_withheld_keys`), and when one is computed again.
    pub(super) fn report_withheld(&mut self, key: &QuotaKey, withheld: &[String]) {
        let quota = key.to_string();
        let before = keys_of(&self.books.withheld, &quota);
        for name in withheld.iter().filter(|k| !before.contains(k)) {
            warn!(quota = %key, key = %name, "usage unknown: an object carries a quantity beyond what lazyquota holds; the key is withheld from status.used");
            let note = format!(
                "{name}: an object in namespace {} carries a quantity beyond what lazyquota holds exactly (about 1e1224); the key is removed from status.used, so quota admission refuses requests charging it until that object changes (the controller's log names it)",
                key.namespace
            );
            self.emit(key, true, "UsageWithheld", note);
            self.books.withheld.insert((quota.clone(), name.clone()));
        }
        for name in before.iter().filter(|k| !withheld.contains(k)) {
            self.books.withheld.remove(&(quota.clone(), name.clone()));
            self.emit(key, false, "UsageKnown", format!("{name}: computed again"));
        }
    }

    /// Tells a quota of each key left uncomputed for [`super::UNRESOLVED_WARNING`] (log line
    /// at info, Warning Event, `lazyquota_unresolved_keys`), saying why, and when one is
    /// computed again; computes the quota again when the first such key comes due.
    pub(super) fn report_unresolved(
        &mut self,
        key: &QuotaKey,
        uncomputed: &[String],
        unsynced: &[GroupResource],
        now_ms: u64,
    ) {
        let quota = key.to_string();
        let before: Vec<String> = self
            .books
            .uncomputed_since
            .range((quota.clone(), String::new())..)
            .take_while(|((q, _), _)| q == &quota)
            .map(|((_, k), _)| k.clone())
            .collect();
        let in_spec = |name: &String| {
            self.engine
                .index
                .get(key)
                .is_some_and(|e| e.payload.spec.hard_keys.contains(name))
        };
        let resolved: Vec<(String, bool)> = before
            .into_iter()
            .filter(|k| !uncomputed.contains(k))
            .map(|k| {
                let computed = in_spec(&k);
                (k, computed)
            })
            .collect();
        for (name, computed) in resolved {
            let pair = (quota.clone(), name.clone());
            self.books.uncomputed_since.remove(&pair);
            // A key taken out of spec.hard is not computed: nothing to tell.
            if self.books.unresolved.remove(&pair) && computed {
                info!(quota = %key, key = %name, "quota key computed again");
                self.emit(key, false, "UsageComputed", format!("{name}: computed again"));
            }
        }
        let mut due: Option<u64> = None;
        for name in uncomputed {
            let pair = (quota.clone(), name.clone());
            let since = *self.books.uncomputed_since.entry(pair.clone()).or_insert(now_ms);
            let at = since
                .saturating_add(u64::try_from(super::UNRESOLVED_WARNING.as_millis()).unwrap_or(u64::MAX));
            if self.books.unresolved.contains(&pair) {
                continue;
            }
            if now_ms < at {
                due = Some(due.map_or(at, |d| d.min(at)));
                continue;
            }
            let why = self.why_uncomputed(key, unsynced);
            let seconds = (now_ms - since) / 1000;
            info!(quota = %key, key = %name, %why, seconds, "quota key not computed: admission refuses what would charge it while status.used lacks it");
            let note = format!(
                "{name}: not computed for {seconds} s ({why}); while status.used lacks it, quota admission refuses every request that would charge it"
            );
            self.emit(key, true, "UsageUnresolved", note);
            self.books.unresolved.insert(pair);
        }
        if let Some(at) = due {
            let at = self.epoch + std::time::Duration::from_millis(at);
            self.queue.add_at(key.clone(), at);
        }
    }

    /// Why a quota's keys are not computed: the types it names that discovery did not find
    /// served, and those not listed (yet).
    fn why_uncomputed(&self, key: &QuotaKey, unsynced: &[GroupResource]) -> String {
        let Some(entry) = self.engine.index.get(key) else {
            return "the quota is gone".to_owned();
        };
        let mut missing: Vec<String> = entry
            .demands()
            .keys()
            .filter(|r| self.engine.resolver.get(&key.cluster, r).is_none())
            .map(GroupResource::object_count_name)
            .collect();
        missing.sort();
        let mut why = Vec::new();
        if !missing.is_empty() {
            why.push(format!("not served by the apiserver: {}", missing.join(", ")));
        }
        if !unsynced.is_empty() {
            let names: Vec<String> = unsynced.iter().map(GroupResource::object_count_name).collect();
            why.push(format!("not listed (yet, or failing): {}", names.join(", ")));
        }
        if why.is_empty() {
            why.push("no evaluator computes it".to_owned());
        }
        why.join("; ")
    }

    /// Compares our `used` with the stored one, key by key over both; returns the sync
    /// result. A key lazyquota did not compute (not synced, not served, forbidden, withheld,
    /// claimed by no evaluator) is **unknown**, never "agree": the stored value proves nothing
    /// about lazyquota.
    pub(super) fn report_shadow(
        &mut self,
        key: &QuotaKey,
        decision: &StatusDecision,
        uncomputed: &[String],
    ) -> &'static str {
        let stored = self
            .engine
            .index
            .get(key)
            .and_then(|e| e.payload.status_used.clone())
            .unwrap_or_default();
        let quota = key.to_string();
        let books = &mut self.books;
        books.disagreements.retain(|(q, _), _| q != &quota);
        let unknown: BTreeSet<&String> = uncomputed.iter().chain(&decision.withheld).collect();
        let before = keys_of(&books.shadow_unknown, &quota);
        for name in &before {
            books.shadow_unknown.remove(&(quota.clone(), name.clone()));
        }
        for name in &unknown {
            if !before.contains(*name) {
                info!(quota = %quota, key = %name, "shadow: lazyquota does not compute this key (yet); reported as unknown");
            }
            books.shadow_unknown.insert((quota.clone(), (*name).clone()));
        }
        let mut disagree = false;
        let names: BTreeSet<&String> = decision.used.keys().chain(stored.keys()).collect();
        for name in names.into_iter().filter(|n| !unknown.contains(n)) {
            let (ours, theirs) = (decision.used.get(name), stored.get(name));
            if let (Some(o), Some(t)) = (ours, theirs)
                && same_value(o, t)
            {
                continue;
            }
            disagree = true;
            let show = |q: Option<&K8sQuantity>| q.map_or_else(|| "<absent>".to_owned(), |q| q.0.clone());
            let (ours, theirs) = (show(ours), show(theirs));
            warn!(quota = %quota, key = %name, %ours, stored = %theirs, "shadow: status.used disagrees");
            books
                .disagreements
                .insert((quota.clone(), name.clone()), (ours, theirs));
        }
        books
            .shadow_verdicts
            .insert(quota, !disagree && unknown.is_empty());
        if disagree {
            "shadow_disagree"
        } else if unknown.is_empty() {
            "shadow_agree"
        } else {
            "shadow_unknown"
        }
    }
}
