//! Test-only mutations: an old, wrong rule put back, so the simulator can show it would catch
//! it (`crates/index/tests/sim`, the `mutations_*` tests). Compiled in only with the
//! `mutations` feature, which only this crate's own tests enable; without it
//! [`active`] is `false` and the checks fold away.
//!
//! A thread-local, not a setting: the simulator runs seeds on many test threads at once, each
//! with its own mutation, and production code carries no field for it.

/// A defect the simulator must find (numbered as in the issue that fixed them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// 1: a partition whose watch failed after its sync still counts as current.
    StaleCounts,
    /// 4: a hard key no evaluator claims is compared in shadow mode, not called unknown.
    UnclaimedAgrees,
    /// 5: a key is lowered right after admission charged it (no hold for charges in flight).
    NoChargeHold,
    /// Found by the simulator: a key written lower, or for the first time, while the
    /// watches it is computed from had not caught up with the quota's last change.
    NoCatchUp,
    /// A list proves the store caught up with a quota whatever the list's resourceVersion,
    /// though the quota moved past it (objects stored meanwhile are not in it).
    StaleProof,
    /// 6: the old write policy — a write's response replaces the view held even when newer
    /// events came meanwhile, a quota event older than the view held replaces it, and a
    /// conflict waits (with backoff) for the quota watch instead of reading the quota afresh.
    OldWritePolicy,
    /// 3: share lists run with no bound on how many at once.
    UnboundedJoins,
    /// Found by the simulator's kcp seeds: a shared watch that failed has its subscribers list
    /// their share again while it is still down, so a share listed meanwhile counts as
    /// current although the events after its list do not come until the watch is back.
    SharesRejoinFailedWatch,
    /// Found by the simulator once tenants label quotas: once the settling time is over, a
    /// key the stored `status.hard` lacks (never charged by admission) is written for the
    /// first time without waiting for its watches, though its first write came late (now:
    /// the settling time ends its wait when the list proving its watch fails).
    UnenforcedAfterSettling,
    /// Found by reading a failed kcp e2e run's etcd: a status write's own event, come before
    /// its response, is taken for admission's charge and added on top of a later count.
    OwnWriteIsACharge,
    /// Withdrawn once on review, put back since: a key whose watch is not synced keeps the
    /// stored value and has the namespace's recent charges added to it again, although that
    /// value holds this quota's already (too high, never lower).
    KeptKeyChargedAgain,
    /// A watch failing after its sync is reopened at once every time, so one whose list
    /// succeeds but whose watch cannot start lists again and again without backoff.
    RestartsWithoutBackoff,
    /// A list compared with the store by its number of objects alone, not their
    /// resourceVersions: a delete and a create the watch has not delivered cancel out.
    ProofIgnoresVersions,
    /// The old rule: a charge is released [`crate::lowering::SETTLE_MS`] after it was seen,
    /// whether or not its objects have arrived.
    ChargeReleasedByTime,
    /// A quota lazyquota sees for the first time (at its start, or come back in a relist)
    /// carries nothing of its stored `status.used`, so a write admission charged before
    /// lazyquota watched it and stored late is not waited for.
    LateObjectNotCounted,
    /// The old rule: once the settling time is over, a key is lowered without waiting for its
    /// watches, so an object stored before the quota's version that a watch has not delivered
    /// yet (admitted uncharged, or moved into its scope) is taken off.
    CatchUpOnlyWhileSettling,
    /// A partition's tally keeps an updated object's old usage beside its new one (an update
    /// dropped from the running sums), so a typed key read from it is off.
    TallyDropsUpdate,
}

#[cfg(feature = "mutations")]
thread_local! {
    static ACTIVE: std::cell::Cell<Option<Mutation>> = const { std::cell::Cell::new(None) };
}

/// Whether `m` is put back on this thread.
#[must_use]
#[inline]
pub fn active(m: Mutation) -> bool {
    #[cfg(feature = "mutations")]
    {
        ACTIVE.with(|a| a.get() == Some(m))
    }
    #[cfg(not(feature = "mutations"))]
    {
        let _ = m;
        false
    }
}

/// Puts `m` back on this thread (`None`: the rules as they are).
#[cfg(feature = "mutations")]
pub fn set(m: Option<Mutation>) {
    ACTIVE.with(|a| a.set(m));
}
