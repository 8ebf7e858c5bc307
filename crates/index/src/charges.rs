//! Charges: what quota admission added to a quota's `status.used`, and the objects that
//! account for them.
//!
//! Quota admission charges a create (or an update that grows an object's usage) in
//! `status.used` *before* the object is stored: between the charge and the object's arrival
//! on lazyquota's watch, the stored value is right and the objects lazyquota holds are short.
//! A status write computed in that window takes the charge back and lets the next create past
//! `hard` (kubernetes #123434). So every raise of `status.used` lazyquota did not write is a
//! [`Charge`], and a key is never written below what is counted plus what its charges still
//! owe ([`crate::lowering::hold_lowering`]).
//!
//! A charge is paid by evidence, not by time. The charge is made at the quota's
//! resourceVersion C and its object is stored later, at some R > C, in the same request; the
//! object's watch delivers events in resourceVersion order. So an **arrival** — a watch event
//! at R that makes the object count more for one of the quota's keys under the quota's scopes
//! (a create, or an update that grows it) — pays, amount for amount, the newest charge of that
//! key on that quota made before R ([`account`]). An arrival that comes before the quota
//! watch has delivered the charge it pays is kept as a [`Credit`] until a charge older than
//! it is noted, or the quota's view passes it (no charge older than it can come then). A
//! charge nothing pays is dropped after the create bound (`bound_ms`, kube-apiserver's
//! request timeout by default): its create failed after admission (a name taken, storage
//! refusing it) or outlived its request.
//!
//! What this guarantees, and what it does not: a charge is paid only by an object stored
//! after it, so while the arrivals are objects of this quota's charges, what stays owed is at
//! least the charged creates still in flight. An object admission did **not** charge to the
//! quota (admitted before the quota or key was enforced, or moved into its scope by an update
//! admission does not check) may pay for a charge whose own object is still on its way: the
//! written value then lacks one charged create per such object until that create arrives, so a
//! tenant can hold at most `hard` plus the creates admission let in uncharged — the bound those
//! uncharged creates set anyway, with or without lazyquota. A create stored later than the
//! bound after its charge is not waited for.
//!
//! Costs: per quota two `Vec`s (empty on a quota nobody charges); per charge its keys, amounts
//! and what paid them, gone once paid (or while a status write of the quota is in flight, once
//! that write is answered: its answer reads the charges' history, [`not_yet_noted`]); at most
//! [`MAX_CHARGES`] charges and [`MAX_CREDITS`] credits per quota.

use lazyquota_quota::{Quantities, Quantity};

/// How long a charge nothing pays for is kept by default: kube-apiserver's default
/// `--request-timeout` (1m), past which a create's request has ended one way or the other.
pub const DEFAULT_BOUND_MS: u64 = 60_000;

/// Charges kept per quota, at most: beyond, paid ones are forgotten first, then the two oldest
/// are merged into one at the later resourceVersion (paid only by later arrivals: higher for
/// longer, never lower).
pub const MAX_CHARGES: usize = 64;

/// Credits kept per quota, at most: beyond, the oldest is dropped (a charge it would have
/// paid stays owed: higher, never lower).
pub const MAX_CREDITS: usize = 32;

/// What one charge raised one key by, and the arrivals that paid for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Raise {
    /// The quota key.
    pub key: String,
    /// How much it was raised (unknown if a value did not parse: never paid).
    pub by: Quantity,
    /// The arrivals that paid for it: their resourceVersion and amount (0: what the store
    /// showed was not in flight, [`Ledger::refine_carried`]).
    pub paid: Vec<(u64, Quantity)>,
    /// Carried: the stored value when lazyquota first saw the quota, which may hold charges
    /// whose objects are in flight — made before lazyquota watched — until the store has
    /// caught up and says how much of it the objects do not explain.
    pub carried: bool,
}

impl Raise {
    fn new(key: String, by: Quantity) -> Self {
        Self {
            key,
            by,
            paid: Vec::new(),
            carried: false,
        }
    }

    /// What is still owed: the raise less what paid for it (unknown stays unknown).
    #[must_use]
    pub fn owed(&self) -> Quantity {
        self.paid.iter().fold(self.by.clone(), |left, (_, q)| left.sub(q))
    }

    /// Whether anything is still owed (an unknown amount always is).
    #[must_use]
    pub fn is_owed(&self) -> bool {
        self.owed().is_positive() != Some(false)
    }
}

/// One raise of a quota's `status.used` by someone else (quota admission), key by key.
#[derive(Clone, Debug, PartialEq)]
pub struct Charge {
    /// When it was seen, in the caller's monotonic milliseconds (for the create bound).
    pub at_ms: u64,
    /// The quota's resourceVersion when it was seen: the charge was made at or before it, so
    /// its objects are stored after it (unknown: `None`, then never paid and never taken as
    /// certainly unseen).
    pub revision: Option<u64>,
    /// The quota's resourceVersion before it: the charge was made after it, so its objects
    /// are stored after it, and an arrival after it may pay it. The same as `revision` for a
    /// charge one event brought; older where a jump of the view (a relist, a fresh read, a
    /// late write response) brought several charges at once, whose objects may have arrived
    /// before the jump's version already.
    pub since: Option<u64>,
    /// The keys raised.
    pub raised: Vec<Raise>,
    /// Whether older charges were merged into it ([`MAX_CHARGES`]): it is then not one
    /// version's raise, and is never taken for an own write's echo ([`forget_own`]).
    pub merged: bool,
}

impl Charge {
    /// What it still owes, key by key.
    pub fn owed(&self) -> impl Iterator<Item = (&str, Quantity)> {
        self.raised
            .iter()
            .filter(|r| r.is_owed())
            .map(|r| (r.key.as_str(), r.owed()))
    }

    /// Whether it still owes anything.
    #[must_use]
    pub fn is_owed(&self) -> bool {
        self.raised.iter().any(Raise::is_owed)
    }
}

/// An arrival that came before the charge it pays was seen: kept for a charge older than it.
#[derive(Clone, Debug, PartialEq)]
pub struct Credit {
    /// The arrival's resourceVersion.
    pub revision: u64,
    /// What it brought, key by key, not yet spent.
    pub left: Vec<(String, Quantity)>,
}

/// A quota's charges and credits.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ledger {
    /// Raises someone else made, in the order seen.
    pub charges: Vec<Charge>,
    /// Arrivals not spent yet, in resourceVersion order.
    pub credits: Vec<Credit>,
    /// Charges dropped at the bound while still owed, since last taken
    /// ([`Ledger::take_expired`]).
    pub expired: u32,
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

/// Whether `q` is more than nothing (an unknown amount counts).
fn positive(q: &Quantity) -> bool {
    q.is_positive() != Some(false)
}

/// The smaller of what is owed and what is left to spend (both known and positive).
fn smaller(owed: &Quantity, left: &Quantity) -> Quantity {
    if owed < left { owed.clone() } else { left.clone() }
}

impl Ledger {
    /// Whether nothing is kept (a quota nobody charges).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.charges.is_empty() && self.credits.is_empty()
    }

    /// Notes a charge seen at `now_ms` on the quota at `revision` (after dropping charges past
    /// the create bound), paid at once from the credits of arrivals after `revision` (oldest
    /// first: a later charge can only be paid by later arrivals). Credits at or before
    /// `revision` can pay no charge seen from now on, and go.
    pub fn note(
        &mut self,
        raised: Vec<(String, Quantity)>,
        revision: Option<u64>,
        now_ms: u64,
        bound_ms: u64,
    ) {
        self.note_since(raised, revision, revision, now_ms, bound_ms);
    }

    /// [`Ledger::note`] for what a jump of the quota's view from `since` to `revision` (a
    /// relist, a fresh read, a late write response) brought: the charges were made after
    /// `since`, and arrivals after it may pay them ([`Charge::since`]).
    pub fn note_since(
        &mut self,
        raised: Vec<(String, Quantity)>,
        revision: Option<u64>,
        since: Option<u64>,
        now_ms: u64,
        bound_ms: u64,
    ) {
        self.expire(now_ms, bound_ms);
        if raised.is_empty() {
            return;
        }
        let since = match (since, revision) {
            (Some(s), Some(r)) => Some(s.min(r)),
            _ => revision,
        };
        let mut charge = Charge {
            at_ms: now_ms,
            revision,
            since,
            raised: raised.into_iter().map(|(k, by)| Raise::new(k, by)).collect(),
            merged: false,
        };
        if let Some(c) = since {
            for credit in self.credits.iter_mut().filter(|cr| cr.revision > c) {
                for raise in &mut charge.raised {
                    spend(raise, credit);
                }
            }
            self.credits
                .retain(|cr| cr.revision > c && cr.left.iter().any(|(_, q)| positive(q)));
        }
        self.charges.push(charge);
        self.bound();
    }

    /// Notes what a quota lazyquota had not seen before holds (`stored`, at `revision`, seen at
    /// `now_ms`): charges may be in it whose objects are still in flight, made before it was
    /// watched. Carried as one charge until the store has caught up with the quota
    /// ([`Ledger::refine_carried`]), then paid by arrivals as any charge, or dropped at the
    /// bound.
    pub fn carry(
        &mut self,
        stored: Vec<(String, Quantity)>,
        revision: Option<u64>,
        now_ms: u64,
        bound_ms: u64,
    ) {
        let before = self.charges.len();
        self.note(stored, revision, now_ms, bound_ms);
        if self.charges.len() > before
            && let Some(carried) = self.charges.last_mut()
        {
            for raise in &mut carried.raised {
                raise.carried = true;
            }
        }
    }

    /// Whether a raise of `key` is still carried (not refined yet).
    #[must_use]
    pub fn carries(&self, key: &str) -> bool {
        self.charges
            .iter()
            .flat_map(|c| &c.raised)
            .any(|r| r.carried && r.key == key && r.is_owed())
    }

    /// The store has caught up with the quota: of what was carried for `key`, at most
    /// `unexplained` (the stored value less what is counted and what the other charges owe)
    /// can be in flight; the rest is taken as paid.
    pub fn refine_carried(&mut self, key: &str, unexplained: &Quantity) {
        for raise in self
            .charges
            .iter_mut()
            .flat_map(|c| c.raised.iter_mut())
            .filter(|r| r.carried && r.key == key)
        {
            raise.carried = false;
            let owed = raise.owed();
            if owed.is_unknown() || unexplained.is_unknown() || owed <= *unexplained {
                continue;
            }
            let floor = if unexplained.is_positive() == Some(true) {
                unexplained.clone()
            } else {
                Quantity::from_count(0)
            };
            raise.paid.push((0, owed.sub(&floor)));
        }
    }

    /// What the charges still owe for `key`, but for what is carried.
    #[must_use]
    pub fn owed_besides_carried(&self, key: &str) -> Quantity {
        self.charges
            .iter()
            .flat_map(|c| &c.raised)
            .filter(|r| !r.carried && r.key == key && r.is_owed())
            .fold(Quantity::from_count(0), |sum, r| sum.add(&r.owed()))
    }

    /// An arrival at `revision`: what an object's event made it count more for the quota's
    /// keys (`arrived`, key by key). Pays the newest charges made before `revision` first —
    /// the oldest ones are those nothing may ever pay, and go at the bound. What is left is
    /// kept as a credit while the quota's view (`view`, its resourceVersion as seen) is
    /// before `revision`: the charge it pays may not have been seen yet. Returns whether a
    /// charge was paid.
    pub fn account(&mut self, revision: u64, view: u64, arrived: Vec<(String, Quantity)>) -> bool {
        let mut paid_any = false;
        let mut credit = Credit {
            revision,
            left: arrived
                .into_iter()
                .filter(|(_, q)| q.is_positive() == Some(true))
                .collect(),
        };
        for charge in self
            .charges
            .iter_mut()
            .rev()
            .filter(|c| c.since.is_some_and(|c| c < revision))
        {
            for raise in &mut charge.raised {
                paid_any |= spend(raise, &mut credit);
            }
        }
        credit.left.retain(|(_, q)| q.is_positive() == Some(true));
        if view < revision && !credit.left.is_empty() {
            if self.credits.len() >= MAX_CREDITS {
                self.credits.remove(0);
            }
            let at = self.credits.partition_point(|c| c.revision <= revision);
            self.credits.insert(at, credit);
        }
        paid_any
    }

    /// Drops credits no charge can be older than any more: the quota's view is at `view`, so
    /// every charge before it has been seen.
    pub fn seen_up_to(&mut self, view: u64) {
        self.credits.retain(|c| c.revision > view);
    }

    /// Drops charges seen `bound_ms` or more before `now_ms`: nothing paid them in the time a
    /// create's request may take.
    pub fn expire(&mut self, now_ms: u64, bound_ms: u64) {
        let before = self.charges.iter().filter(|c| c.is_owed()).count();
        self.charges.retain(|c| c.at_ms.saturating_add(bound_ms) > now_ms);
        let after = self.charges.iter().filter(|c| c.is_owed()).count();
        self.expired = self
            .expired
            .saturating_add(u32::try_from(before - after).unwrap_or(u32::MAX));
    }

    /// How many charges were dropped at the bound still owed since the last call: creates
    /// admission charged and refused, or stored later than the bound.
    pub fn take_expired(&mut self) -> u32 {
        std::mem::take(&mut self.expired)
    }

    /// Forgets charges paid in full — not while a status write of the quota is in flight
    /// (`writing`): its answer reads what was charged since it was sent ([`not_yet_noted`]).
    pub fn forget_paid(&mut self, writing: bool) {
        if !writing {
            self.charges.retain(Charge::is_owed);
        }
    }

    /// When the next charge still owed reaches the create bound (the caller's milliseconds).
    #[must_use]
    pub fn next_expiry(&self, bound_ms: u64) -> Option<u64> {
        self.charges
            .iter()
            .filter(|c| c.is_owed())
            .map(|c| c.at_ms.saturating_add(bound_ms))
            .min()
    }

    /// Keeps at most [`MAX_CHARGES`]: paid ones go first, then the two oldest are merged (at
    /// the later revision: paid only by arrivals after it).
    fn bound(&mut self) {
        while self.charges.len() > MAX_CHARGES {
            if let Some(at) = self.charges.iter().position(|c| !c.is_owed()) {
                self.charges.remove(at);
                continue;
            }
            let oldest = self.charges.remove(0);
            let next = &mut self.charges[0];
            next.raised.extend(oldest.raised);
            next.revision = next.revision.max(oldest.revision);
            next.since = next.since.max(oldest.since);
            next.merged = true;
        }
    }

    /// Forgets the charge noted at `written`, the resourceVersion a status write of
    /// lazyquota's made, when the write was conditioned on the version before it: the watch
    /// delivered the write's own event before its response, and what that event raised was
    /// the write, whose values are counted — not a charge for objects on their way. Kept, it
    /// would be counted twice until the bound. What arrivals paid to it is paid again to the
    /// other charges (or kept as credits), as those arrivals would have been.
    pub fn forget_own(&mut self, written: u64, view: u64) {
        let Some(at) = self
            .charges
            .iter()
            .position(|c| !c.merged && c.revision == Some(written))
        else {
            return;
        };
        let own = self.charges.remove(at);
        let mut refunds: Vec<(u64, String, Quantity)> = own
            .raised
            .into_iter()
            .flat_map(|r| {
                let key = r.key;
                r.paid.into_iter().map(move |(rev, q)| (rev, key.clone(), q))
            })
            .collect();
        refunds.sort_by_key(|(rev, _, _)| *rev);
        for (revision, key, q) in refunds {
            self.account(revision, view, vec![(key, q)]);
        }
    }
}

/// Pays what `raise` still owes from what `credit` has left of its key; returns whether
/// anything was paid.
fn spend(raise: &mut Raise, credit: &mut Credit) -> bool {
    let owed = raise.owed();
    if owed.is_positive() != Some(true) {
        return false;
    }
    let Some((_, left)) = credit
        .left
        .iter_mut()
        .find(|(k, q)| *k == raise.key && q.is_positive() == Some(true))
    else {
        return false;
    };
    let paid = smaller(&owed, left);
    *left = left.sub(&paid);
    raise.paid.push((credit.revision, paid));
    true
}

/// What a late response's raise still adds to the charges noted: `raised` is what the view
/// held (at `view`) has above a write of lazyquota's (at `written`), and the charges kept that
/// were noted at versions after the write and up to the view are that raise's history, seen
/// event by event when the watch delivered them (paid or not: paid charges are kept while the
/// write is in flight, [`Ledger::forget_paid`]). Only what they fall short of, key by key, is
/// noted again (all of it when there are none: a relist jumped over those versions); noted
/// twice, a charge whose object is on its way would be added twice, above every object there
/// is. Merged charges are not one version's and do not count here (noted again: higher, never
/// lower).
#[must_use]
pub fn not_yet_noted(
    charges: &[Charge],
    written: u64,
    view: u64,
    raised: Vec<(String, Quantity)>,
) -> Vec<(String, Quantity)> {
    let since_write: Vec<&Charge> = charges
        .iter()
        .filter(|c| !c.merged && c.revision.is_some_and(|r| r > written && r <= view))
        .collect();
    raised
        .into_iter()
        .filter_map(|(key, by)| {
            let noted = since_write
                .iter()
                .flat_map(|c| c.raised.iter())
                .filter(|r| r.key == key)
                .fold(Quantity::from_count(0), |sum, r| sum.add(&r.by));
            let rest = by.sub(&noted);
            (rest.is_unknown() || rest.is_positive() == Some(true)).then_some((key, rest))
        })
        .collect()
}

#[cfg(test)]
mod tests;
