use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use lazyquota_quota::QuantityList;

use super::*;

const CM: &str = "count/configmaps";
const BOUND: u64 = DEFAULT_BOUND_MS;

fn cm(by: u64) -> Vec<(String, Quantity)> {
    vec![(CM.to_owned(), Quantity::from_count(by))]
}

/// What the ledger still owes for configmaps, in all.
fn owed(ledger: &Ledger) -> String {
    ledger
        .charges
        .iter()
        .flat_map(Charge::owed)
        .fold(Quantity::from_count(0), |sum, (_, q)| sum.add(&q))
        .to_k8s()
        .0
}

#[test]
fn an_arrival_pays_the_newest_charge_made_before_it() {
    let mut ledger = Ledger::default();
    ledger.note(cm(1), Some(10), 0, BOUND);
    ledger.note(cm(1), Some(20), 1, BOUND);
    // Stored at 15: only the charge at 10 is older.
    assert!(ledger.account(15, 20, cm(1)));
    assert!(!ledger.charges[0].is_owed() && ledger.charges[1].is_owed());
    // Stored at 25: pays the charge at 20.
    assert!(ledger.account(25, 20, cm(1)));
    assert_eq!(owed(&ledger), "0");
    // A third arrival finds nothing owed; the view is past it, so no credit is kept.
    assert!(!ledger.account(26, 30, cm(1)));
    assert!(ledger.credits.is_empty());
}

#[test]
fn newest_first_leaves_a_charge_nothing_pays_to_the_bound() {
    // The charge at 10 never lands (its create failed after admission); creates keep coming.
    let mut ledger = Ledger::default();
    ledger.note(cm(1), Some(10), 0, BOUND);
    for (i, rev) in (20..40).step_by(2).enumerate() {
        ledger.note(cm(1), Some(rev), i as u64 + 1, BOUND);
        assert!(ledger.account(rev + 1, rev, cm(1)));
    }
    assert_eq!(owed(&ledger), "1", "one unit owed, the first charge's");
    assert_eq!(ledger.next_expiry(BOUND), Some(BOUND));
    ledger.forget_paid(false);
    assert_eq!(ledger.charges.len(), 1);
    ledger.expire(BOUND, BOUND);
    assert!(ledger.charges.is_empty());
}

#[test]
fn an_arrival_before_its_charge_is_a_credit_spent_by_an_older_charge() {
    let mut ledger = Ledger::default();
    // The object (stored at 11) arrives before the quota's charge at 10 is delivered.
    assert!(!ledger.account(11, 5, cm(1)));
    assert_eq!(ledger.credits.len(), 1);
    // And a second, stored at 21.
    ledger.account(21, 5, cm(1));
    // The charge at 10 takes the oldest credit after it, the one at 20 the next.
    ledger.note(cm(1), Some(10), 0, BOUND);
    ledger.note(cm(1), Some(20), 0, BOUND);
    assert_eq!(owed(&ledger), "0");
    assert!(ledger.credits.is_empty());
}

#[test]
fn a_credit_pays_no_charge_made_after_it_and_goes_once_the_view_passes_it() {
    let mut ledger = Ledger::default();
    ledger.account(11, 5, cm(1));
    // A charge at 12 is for an object stored after 12: the arrival at 11 is not it.
    ledger.note(cm(1), Some(12), 0, BOUND);
    assert_eq!(owed(&ledger), "1");
    assert!(
        ledger.credits.is_empty(),
        "no charge seen from now on is older than 11"
    );
    // A credit past the view stays until the view passes it.
    let mut ledger = Ledger::default();
    ledger.account(30, 12, cm(1));
    ledger.seen_up_to(29);
    assert_eq!(ledger.credits.len(), 1);
    ledger.seen_up_to(30);
    assert!(ledger.credits.is_empty());
}

#[test]
fn amounts_are_paid_key_by_key_and_in_part() {
    let mut ledger = Ledger::default();
    let cpu = |m: i128| Quantity::from_nanos(m * 1_000_000, lazyquota_quota::Format::DecimalSI);
    ledger.note(
        vec![
            ("pods".into(), Quantity::from_count(2)),
            ("requests.cpu".into(), cpu(500)),
        ],
        Some(10),
        0,
        BOUND,
    );
    // One pod of 200m: pays a pod and 200m, leaving a pod and 300m.
    ledger.account(
        11,
        10,
        vec![
            ("pods".into(), Quantity::from_count(1)),
            ("requests.cpu".into(), cpu(200)),
        ],
    );
    let left: Vec<(String, String)> = ledger.charges[0]
        .owed()
        .map(|(k, q)| (k.to_owned(), q.to_k8s().0))
        .collect();
    assert_eq!(
        left,
        vec![
            ("pods".to_owned(), "1".to_owned()),
            ("requests.cpu".to_owned(), "300m".to_owned())
        ]
    );
    // A key the charge did not raise pays nothing.
    ledger.account(12, 10, vec![("limits.cpu".into(), cpu(300))]);
    assert!(ledger.charges[0].is_owed());
}

#[test]
fn charges_are_bounded_and_merging_never_lowers() {
    let mut ledger = Ledger::default();
    for i in 0..(MAX_CHARGES as u64 + 10) {
        ledger.note(cm(1), Some(i), 1_000 + i, BOUND);
    }
    assert_eq!(ledger.charges.len(), MAX_CHARGES);
    assert_eq!(
        owed(&ledger),
        (MAX_CHARGES + 10).to_string(),
        "every raise is still owed"
    );
    assert!(ledger.charges[0].merged);
    // Paid ones go first, before any merge.
    let mut ledger = Ledger::default();
    for i in 0..MAX_CHARGES as u64 {
        ledger.note(cm(1), Some(2 * i), 0, BOUND);
        ledger.account(2 * i + 1, 2 * i, cm(1));
    }
    ledger.note(cm(1), Some(1_000), 0, BOUND);
    assert!(ledger.charges.iter().all(|c| !c.merged));
    assert_eq!(owed(&ledger), "1");
    ledger.note(Vec::new(), None, BOUND + 1_000, BOUND);
    assert!(ledger.charges.is_empty(), "past the bound");
}

#[test]
fn paid_charges_stay_while_a_write_is_in_flight() {
    let mut ledger = Ledger::default();
    ledger.note(cm(1), Some(10), 0, BOUND);
    ledger.account(11, 10, cm(1));
    ledger.forget_paid(true);
    assert_eq!(ledger.charges.len(), 1, "its answer reads the history");
    ledger.forget_paid(false);
    assert!(ledger.charges.is_empty());
}

#[test]
fn an_own_writes_echo_is_forgotten_and_what_paid_it_pays_the_others() {
    let mut ledger = Ledger::default();
    ledger.note(cm(1), Some(21), 0, BOUND);
    // Our write at 22, its event come before its response, taken for a charge.
    ledger.note(cm(1), Some(22), 1, BOUND);
    // The object of the charge at 21 arrives: newest first, it pays the echo.
    ledger.account(23, 22, cm(1));
    assert!(ledger.charges[0].is_owed());
    // The response says 22 was ours: the arrival pays the charge at 21 after all.
    ledger.forget_own(22, 22);
    assert_eq!(ledger.charges.len(), 1);
    assert_eq!(owed(&ledger), "0");

    // Merged beyond the bound, a charge at the written version holds older raises too.
    let mut ledger = Ledger::default();
    for i in 0..=MAX_CHARGES as u64 {
        ledger.note(cm(1), Some(100 + i), 0, BOUND);
    }
    assert!(ledger.charges[0].merged);
    let merged_at = ledger.charges[0].revision.expect("a revision");
    ledger.forget_own(merged_at, merged_at);
    assert_eq!(ledger.charges.len(), MAX_CHARGES, "the merged charge stays");
}

#[test]
fn a_late_responses_raise_is_noted_only_beyond_the_charges_its_events_brought() {
    let at = |revision, by| Charge {
        at_ms: 100,
        revision: Some(revision),
        since: Some(revision),
        raised: vec![Raise::new(CM.to_owned(), Quantity::from_count(by))],
        merged: false,
    };
    let first = |v: Vec<(String, Quantity)>| v[0].1.to_k8s().0;
    // Written at 6; the events at 7 and 9 charged 1 each; the view (9) holds 2 above the
    // write: noted already, paid or not.
    let mut paid = at(9, 1);
    paid.raised[0].paid.push((10, Quantity::from_count(1)));
    let charges = vec![at(6, 1), at(7, 1), paid];
    assert_eq!(not_yet_noted(&charges, 6, 9, cm(2)), vec![]);
    // A relist jumped from 5 to 9 and noted 1: the rest of the raise is noted.
    let charges = vec![at(9, 1)];
    assert_eq!(first(not_yet_noted(&charges, 6, 9, cm(3))), "2");
    // No charge since the write (a charge at the write's own version or past the view is
    // not this raise's): all of it.
    let charges = vec![at(6, 1), at(10, 1)];
    assert_eq!(first(not_yet_noted(&charges, 6, 9, cm(2))), "2");
    // A merged charge is not one version's: it does not count.
    let mut merged = at(8, 2);
    merged.merged = true;
    assert_eq!(first(not_yet_noted(&[merged], 6, 9, cm(2))), "2");
}

#[test]
fn raises_are_read_key_by_key() {
    let list = |pairs: &[(&str, &str)]| -> BTreeMap<String, K8sQuantity> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), K8sQuantity((*v).to_owned())))
            .collect()
    };
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
    let odd = raised(None::<&QuantityList>, Some(&list(&[(CM, "not-a-quantity")])));
    assert!(odd[0].1.is_unknown());
}

#[test]
fn charges_a_jump_of_the_view_brought_are_paid_by_arrivals_after_where_it_jumped_from() {
    let mut ledger = Ledger::default();
    // A fresh read jumped from 10 to 20 over two charges; their objects were stored at 12
    // and 15, before the read, and arrive now.
    ledger.note_since(cm(2), Some(20), Some(10), 0, BOUND);
    ledger.account(12, 20, cm(1));
    ledger.account(15, 20, cm(1));
    assert_eq!(
        owed(&ledger),
        "0",
        "paid by objects stored after the view it jumped from"
    );
    // One event's charge at 20 is paid only by an object stored after 20.
    let mut ledger = Ledger::default();
    ledger.note(cm(1), Some(20), 0, BOUND);
    ledger.account(15, 20, cm(1));
    assert_eq!(owed(&ledger), "1");
}
