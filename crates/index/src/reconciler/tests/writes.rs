//! Status writes and their answers: the first write, conflicts, late responses, errors, hung
//! writes.

use super::*;

#[test]
fn the_first_write_carries_the_count_and_the_quotas_version() {
    let mut h = Harness::new(false);
    let effects = h.ready(quota(5, &[(CM, "10")], None), &[("a", 2), ("b", 3)]);
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!(w[0].precondition.as_deref(), Some("5"));
    assert_eq!(w[0].used, list(&[(CM, "2")]));
    assert!(w[0].lowers.is_empty());
}

/// One ConfigMap counted, the first write (on version 5) answered 409 with nothing newer
/// seen: the newer version is waited for, and when the watch does not bring it in
/// [`CONFLICT_WAIT`], the quota is read afresh.
fn first_write_conflicted() -> Harness {
    let mut h = Harness::new(false);
    let effects = h.ready(quota(5, &[(CM, "10")], None), &[("a", 2)]);
    assert_eq!(writes(&effects).len(), 1);
    let after = h.feed(Input::Written {
        key: key(),
        precondition: Some("5".into()),
        result: Err(conflict()),
    });
    assert!(!after.contains(&Effect::ReadQuota(key())), "{after:?}");
    let wait = u64::try_from(CONFLICT_WAIT.as_millis()).expect("ms");
    assert!(h.tick(wait - 1).is_empty(), "waiting for the watch");
    let after = h.tick(1);
    assert!(after.contains(&Effect::ReadQuota(key())), "{after:?}");
    h
}

#[test]
fn a_conflict_is_computed_again_as_soon_as_the_watch_brings_the_newer_version() {
    let mut h = Harness::new(false);
    let effects = h.ready(quota(5, &[(CM, "10")], None), &[("a", 2)]);
    let w = writes(&effects)[0].clone();
    h.feed(Input::Written {
        key: key(),
        precondition: Some("5".into()),
        result: Err(conflict()),
    });
    // Admission charged a ConfigMap at 6; its event comes: computed again at once, no read.
    h.feed(Input::Quota(QuotaEvent::Applied(quota(
        6,
        &[(CM, "10")],
        Some(&[(CM, "1")]),
    ))));
    let effects = h.tick(1);
    assert!(!effects.contains(&Effect::ReadQuota(key())), "{effects:?}");
    let written = writes(&effects);
    assert_eq!(written.len(), 1, "{effects:?}");
    assert_eq!(written[0].precondition.as_deref(), Some("6"));
    assert_eq!(written[0].hard, w.hard);
    assert!(h.tick(2_000).iter().all(|e| *e != Effect::ReadQuota(key())));
}

#[test]
fn a_conflict_with_nothing_newer_reads_the_quota_afresh() {
    let mut h = first_write_conflicted();

    // The watch brings a newer version first: no read, computed again from it at once.
    let effects = h.tick(1_000);
    assert!(writes(&effects).is_empty(), "waits for the read: {effects:?}");
    h.feed(Input::Read {
        key: key(),
        result: Ok(quota(9, &[(CM, "10")], Some(&[(CM, "0")]))),
    });
    let effects = h.tick(1);
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!(
        w[0].precondition.as_deref(),
        Some("9"),
        "written on the version read"
    );
    h.feed(Input::Quota(QuotaEvent::Applied(quota(
        11,
        &[(CM, "10")],
        Some(&[(CM, "2")]),
    ))));
    let after = h.feed(Input::Written {
        key: key(),
        precondition: Some("9".into()),
        result: Err(conflict()),
    });
    assert!(!after.contains(&Effect::ReadQuota(key())), "{after:?}");
}

#[test]
fn a_read_answered_after_the_quotas_delete_does_not_bring_it_back() {
    // Simulator seed 85,114: the read after a conflict was served before the quota was
    // deleted and answered after the delete's event; applied, the quota stayed for good (its
    // watch open, its writes answered 404).
    let mut h = first_write_conflicted();
    let deleted = h.feed(Input::Quota(QuotaEvent::Deleted(quota(
        7,
        &[(CM, "10")],
        Some(&[(CM, "1")]),
    ))));
    assert!(
        deleted.iter().any(|e| matches!(e, Effect::CloseWatch { .. })),
        "{deleted:?}"
    );
    let effects = h.feed(Input::Read {
        key: key(),
        result: Ok(quota(7, &[(CM, "10")], Some(&[(CM, "1")]))),
    });
    assert!(
        !effects.iter().any(|e| matches!(e, Effect::OpenWatch { .. })),
        "{effects:?}"
    );
    assert!(writes(&h.tick(1_000)).is_empty());
    assert!(h.rec.watches().iter().next().is_none(), "no watch left");
}

#[test]
fn a_late_response_does_not_replace_a_newer_view() {
    let mut h = Harness::new(false);
    let effects = h.ready(quota(5, &[(CM, "10")], None), &[("a", 2)]);
    let w = writes(&effects)[0].clone();
    // Admission charges right after the write; its event comes before the write's response.
    h.feed(Input::Quota(QuotaEvent::Applied(quota(
        7,
        &[(CM, "10")],
        Some(&[(CM, "2")]),
    ))));
    h.feed(Input::Written {
        key: key(),
        precondition: Some("5".into()),
        result: Ok(written(&w, 6)),
    });
    let state = &h.rec.engine().index.get(&key()).unwrap().payload;
    assert_eq!(state.resource_version.as_deref(), Some("7"));
    // And an event older than the view held is skipped.
    h.feed(Input::Quota(QuotaEvent::Applied(written(&w, 6))));
    let state = &h.rec.engine().index.get(&key()).unwrap().payload;
    assert_eq!(state.resource_version.as_deref(), Some("7"));
}

#[test]
fn not_found_is_not_retried_invalid_is_reported_and_retried_and_errors_back_off() {
    let mut h = Harness::new(false);
    h.ready(quota(5, &[(CM, "10")], None), &[]);
    let gone = h.feed(Input::Written {
        key: key(),
        precondition: Some("5".into()),
        result: Err(Failure {
            code: Some(404),
            message: "not found".into(),
        }),
    });
    assert!(writes(&gone).is_empty());
    assert!(
        writes(&h.tick(60_000)).is_empty(),
        "a deleted quota is not written again"
    );

    let mut h = Harness::new(false);
    h.ready(quota(5, &[(CM, "10")], None), &[]);
    let invalid = h.feed(Input::Written {
        key: key(),
        precondition: Some("5".into()),
        result: Err(Failure {
            code: Some(422),
            message: "bad key".into(),
        }),
    });
    assert!(invalid.iter().any(|e| matches!(
        e,
        Effect::Event {
            reason: "StatusRejected",
            warning: true,
            ..
        }
    )));
    assert_eq!(writes(&h.tick(1_000)).len(), 1, "retried after its backoff");

    let mut h = Harness::new(false);
    h.ready(quota(5, &[(CM, "10")], None), &[]);
    h.feed(Input::Written {
        key: key(),
        precondition: Some("5".into()),
        result: Err(Failure {
            code: Some(500),
            message: "etcd".into(),
        }),
    });
    assert!(writes(&h.tick(0)).is_empty(), "not at once");
    let next = h.rec.next_wakeup(h.now().instant).expect("a retry");
    assert!(next > h.now().instant);
    assert_eq!(writes(&h.tick(1_000)).len(), 1);
}

#[test]
fn a_hung_status_write_stops_counting_against_the_concurrency() {
    let hung = Instant::now();
    let fresh = hung + WRITE_STALL + Duration::from_secs(1);
    let now = fresh + Duration::from_secs(1);
    assert_eq!(busy_writes([fresh, fresh].into_iter(), now).0, 2);
    let (busy, next) = busy_writes([hung, hung, hung, hung, hung, fresh].into_iter(), now);
    assert_eq!(busy, 1, "five hung writes leave four of five slots free");
    assert_eq!(
        next,
        Some(fresh + WRITE_STALL),
        "the loop wakes when the fresh one stalls"
    );
    assert_eq!(busy_writes(std::iter::empty(), now), (0, None));
}

/// A key whose type is not served (so not computed) keeps the stored value, charges and all:
/// admission's charge at 7 is in the stored 4, and the write is conditioned on 7. Returns
/// the write that a ConfigMap raising the other key brings.
fn kept_key_after_a_charge() -> StatusWrite {
    const SERVICES: &str = "count/services";
    let mut h = Harness::new(false);
    let hard = [(CM, "10"), (SERVICES, "10")];
    h.ready(
        quota(5, &hard, Some(&[(CM, "2"), (SERVICES, "3")])),
        &[("a", 2), ("b", 3)],
    );
    let id = h.watch_id();
    h.feed(Input::Watch {
        id,
        item: Item::Apply(configmap("c", 6)),
    });
    // Admission charges a Service at 7, past all the ConfigMap watch delivered.
    h.feed(Input::Quota(QuotaEvent::Applied(quota(
        7,
        &hard,
        Some(&[(CM, "2"), (SERVICES, "4")]),
    ))));
    let effects = h.tick(1);
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!(w[0].precondition.as_deref(), Some("7"));
    w[0].clone()
}

#[test]
fn a_key_not_computed_keeps_the_stored_value_without_its_charges_added_again() {
    let w = kept_key_after_a_charge();
    assert_eq!(w.used, list(&[(CM, "3"), ("count/services", "4")]));
}

#[test]
fn mutation_a_kept_key_charged_again_writes_the_charge_twice() {
    crate::mutation::set(Some(crate::mutation::Mutation::KeptKeyChargedAgain));
    let w = kept_key_after_a_charge();
    crate::mutation::set(None);
    assert_eq!(
        w.used,
        list(&[(CM, "3"), ("count/services", "5")]),
        "the old rule adds the charge at 7 to the stored 4 that holds it"
    );
}

#[test]
fn lowerings_of_one_quota_go_out_at_most_once_per_pace() {
    let mut h = Harness::new(false);
    h.rec.settings.lower_pace = LOWER_PACE;
    let effects = h.ready(quota(5, &[(CM, "10")], None), &[("a", 2), ("b", 3), ("c", 4)]);
    let w = writes(&effects)[0].clone();
    assert_eq!(w.used, list(&[(CM, "3")]));
    h.feed(Input::Written {
        key: key(),
        precondition: Some("5".into()),
        result: Ok(written(&w, 20)),
    });
    let id = h.watch_id();
    let pace = u64::try_from(LOWER_PACE.as_millis()).expect("ms");
    // Two deletes after the first write, then a third: one lowering write, at the pace.
    h.feed(Input::Watch {
        id,
        item: Item::Delete(configmap("c", 21)),
    });
    assert!(writes(&h.tick(1)).is_empty(), "within the pace of the last write");
    h.feed(Input::Watch {
        id,
        item: Item::Delete(configmap("b", 22)),
    });
    assert!(writes(&h.tick(pace / 2)).is_empty());
    let effects = h.tick(pace);
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!(w[0].used, list(&[(CM, "1")]), "both deletes in one write");
}
