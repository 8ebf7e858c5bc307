//! When a key may be written lower: after the watches caught up, after charges settle.

use super::*;
use crate::mutation::Mutation;

/// The watch delivers ConfigMap b's delete late (rv 4, behind a quota at 20), and a tick; then
/// an object added and deleted at 21 and 22 (the watch past the quota), and a tick. Returns
/// each tick's effects.
fn late_delete_then_caught_up(h: &mut Harness) -> (Vec<Effect>, Vec<Effect>) {
    let id = h.watch_id();
    h.feed(Input::Watch {
        id,
        item: Item::Delete(configmap("b", 4)),
    });
    let held = h.tick(1);
    h.feed(Input::Watch {
        id,
        item: Item::Apply(configmap("c", 21)),
    });
    h.feed(Input::Watch {
        id,
        item: Item::Delete(configmap("c", 22)),
    });
    (held, h.tick(1))
}

#[test]
fn a_key_is_not_lowered_before_the_watch_has_caught_up_with_the_quota() {
    let (mut h, _) = written_at_20();
    // A delete the watch delivers late (rv 4 < 20): the caches may still lack objects stored
    // up to 20, so the key is not written lower yet, until the watch has come past the
    // quota's version.
    let (held, effects) = late_delete_then_caught_up(&mut h);
    assert!(writes(&held).is_empty(), "held: {held:?}");
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!(w[0].used, list(&[(CM, "1")]));
    assert_eq!(w[0].lowers, vec![CM.to_owned()]);
}

#[test]
fn a_quiet_watch_lets_the_key_go_lower_once_settled() {
    let (mut h, _) = written_at_20();
    let id = h.watch_id();
    h.feed(Input::Watch {
        id,
        item: Item::Delete(configmap("b", 4)),
    });
    assert!(writes(&h.tick(1)).is_empty(), "held");
    let w = writes(&h.tick(crate::lowering::SETTLE_MS))
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].used, list(&[(CM, "1")]));
}

#[test]
fn long_after_its_creation_a_quota_changed_by_someone_else_is_lowered_once_a_list_proves_the_store() {
    let (mut h, w) = written_at_20();
    h.tick(crate::lowering::SETTLE_MS);
    // Another writer (or an edit of a label) moves the version on; the watch is quiet. An
    // object stored before 30 may not have reached it, charged or not: a list at 30 says.
    h.feed(Input::Quota(QuotaEvent::Applied(written(&w, 30))));
    let id = h.watch_id();
    h.feed(Input::Watch {
        id,
        item: Item::Delete(configmap("b", 4)),
    });
    let effects = h.tick(1);
    assert!(writes(&effects).is_empty(), "held: {effects:?}");
    assert_eq!(lists_asked(&effects).len(), 1, "{effects:?}");
    let effects = [h.feed(listed_for(key(), 30, 1, 2)), h.tick(1)].concat();
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!(w[0].used, list(&[(CM, "1")]));
}

#[test]
fn a_charge_after_all_the_watch_delivered_is_added_even_to_a_stored_value_already_short() {
    // Simulator seed 94,780: a ConfigMap stored uncharged (admitted before the quota) raises
    // the count to 3; that write is lost to a tenant's edit of spec.hard; admission then
    // charges a fourth on top of the stale 2. Counted 3, stored 3, truth 4.
    let (mut h, _) = written_at_20();
    h.tick(crate::lowering::SETTLE_MS);
    let id = h.watch_id();
    h.feed(Input::Watch {
        id,
        item: Item::Apply(configmap("c", 21)),
    });
    let effects = h.tick(1);
    assert_eq!(writes(&effects)[0].used, list(&[(CM, "3")]));
    h.feed(Input::Quota(QuotaEvent::Applied(quota(
        22,
        &[(CM, "11")],
        Some(&[(CM, "2")]),
    ))));
    h.feed(Input::Written {
        key: key(),
        precondition: Some("20".into()),
        result: Err(conflict()),
    });
    h.feed(Input::Quota(QuotaEvent::Applied(quota(
        23,
        &[(CM, "11")],
        Some(&[(CM, "3")]),
    ))));
    let effects = h.tick(1);
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!(w[0].precondition.as_deref(), Some("23"));
    assert_eq!(
        w[0].used,
        list(&[(CM, "4")]),
        "the charge at 23 is for an object the watch (at 21) has not delivered"
    );

    // Once the watch delivers it, the charge may be counted already: back to the count.
    h.feed(Input::Written {
        key: key(),
        precondition: Some("23".into()),
        result: Ok(quota(24, &[(CM, "11")], Some(&[(CM, "4")]))),
    });
    h.feed(Input::Watch {
        id,
        item: Item::Apply(configmap("d", 25)),
    });
    assert!(writes(&h.tick(1)).is_empty(), "4 counted, 4 stored");
}

#[test]
fn a_charge_behind_a_late_write_response_and_a_relist_is_not_lost() {
    // Simulator seed 95,145: a write lowers the key; a relist jumps over its event and over
    // the charge that follows it (stored 3, then 2 by the write, then 3 by admission: the
    // relist shows 3 → 3); the write's response comes last.
    let (mut h, _) = written_at_20();
    let id = h.watch_id();
    h.feed(Input::Quota(QuotaEvent::Applied(quota(
        22,
        &[(CM, "10")],
        Some(&[(CM, "3")]),
    ))));
    h.feed(Input::Watch {
        id,
        item: Item::Apply(configmap("c", 23)),
    });
    h.tick(crate::lowering::SETTLE_MS);
    h.feed(Input::Watch {
        id,
        item: Item::Delete(configmap("a", 24)),
    });
    let effects = h.tick(1);
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!(w[0].used, list(&[(CM, "2")]));
    let lowered = w[0].clone();
    h.feed(Input::Quota(QuotaEvent::RelistStarted));
    h.feed(Input::Quota(QuotaEvent::Relisted(quota(
        26,
        &[(CM, "10")],
        Some(&[(CM, "3")]),
    ))));
    h.feed(Input::Quota(QuotaEvent::RelistDone));
    h.feed(Input::Written {
        key: key(),
        precondition: Some("22".into()),
        result: Ok(written(&lowered, 25)),
    });
    let effects = h.tick(1);
    for w in writes(&effects) {
        assert_eq!(
            w.used,
            list(&[(CM, "3")]),
            "the charge at 26 (for an object the watch, at 24, has not delivered) stands: {w:?}"
        );
    }
    let charges = &h.rec.engine().index.get(&key()).unwrap().payload.ledger.charges;
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(charges[0].revision, Some(26));
}

#[test]
fn a_new_key_waits_only_for_the_watch_of_its_own_objects() {
    // kcp's e2e TestKubeQuotaCoreV1TypesFromBinding: count/configmaps joins a quota whose
    // other type's watch is quiet, and a ConfigMap create follows within a second; held until
    // the quiet watch caught up, the key was missing and admission refused the create.
    let (mut h, w) = written_at_20();
    h.tick(crate::lowering::SETTLE_MS);
    h.serve_services();
    let hard = [(CM, "10"), ("count/services", "5")];
    let mut q = quota(30, &hard, None);
    q.status = written(&w, 30).status;
    let opened = h.feed(Input::Quota(QuotaEvent::Applied(q)));
    let effects = h.list_opened(&opened, "services");
    let w = writes(&effects);
    assert_eq!(
        w.len(),
        1,
        "written at once, not after the settling time: {effects:?}"
    );
    assert_eq!(w[0].used, list(&[(CM, "2"), ("count/services", "0")]));
}

#[test]
fn a_neighbours_charge_holds_no_new_key_whose_watch_has_caught_up() {
    // A new quota on Services while admission has just charged the neighbour: a Service of
    // that charge stored before the new quota's version is in the watch's list (opened after
    // the quota was seen); one stored after it is not the new quota's to count yet (no write
    // conditioned on that version could know of it), and it is counted when it arrives.
    for charged_key in [CM, "count/services"] {
        let (mut h, w) = written_at_20();
        h.tick(crate::lowering::SETTLE_MS);
        h.serve_services();
        let mut charged = written(&w, 25);
        let status = charged.status.as_mut().expect("written");
        let mut used = status.used.clone().expect("used");
        used.insert(charged_key.to_owned(), K8sQuantity("3".into()));
        status.used = Some(used);
        h.feed(Input::Quota(QuotaEvent::Applied(charged)));
        let mut services = quota(30, &[("count/services", "5")], None);
        services.metadata.name = Some("s".into());
        services.metadata.uid = Some("uid-s".into());
        let opened = h.feed(Input::Quota(QuotaEvent::Applied(services)));
        let effects = h.list_opened(&opened, "services");
        let new_key_written = writes(&effects)
            .iter()
            .any(|w| &*w.key.name == "s" && w.used.contains_key("count/services"));
        assert!(
            new_key_written,
            "charge on {charged_key}: the new key written at once: {effects:?}"
        );
    }
}

#[test]
fn a_key_first_enforced_long_after_the_quota_appeared_settles_from_its_first_write() {
    // Admission charges by status.hard: until the first write puts the key there, creates
    // are admitted uncharged, and some may reach the watch after the write. Here discovery
    // takes longer than the settling time, so only the write can start it.
    let mut h = Harness::new(false);
    h.tick(0);
    h.feed(Input::Quota(QuotaEvent::RelistStarted));
    h.feed(Input::Quota(QuotaEvent::Relisted(quota(5, &[(CM, "10")], None))));
    h.feed(Input::Quota(QuotaEvent::RelistDone));
    h.tick(crate::lowering::SETTLE_MS + 100);
    let opened = h.feed(Input::Discovered {
        cluster: ClusterName::new("c"),
        result: Ok(Discovered {
            served: vec![crate::resolver::ServedResource::core_for_tests("configmaps")],
            failed_groups: Vec::new(),
            skipped_groups: Vec::new(),
        }),
    });
    assert!(!opened.is_empty(), "{opened:?}");
    let id = h.watch_id();
    h.feed(Input::Watch { id, item: Item::Init });
    for (name, rv) in [("a", 2), ("b", 3)] {
        h.feed(Input::Watch {
            id,
            item: Item::InitApply(configmap(name, rv)),
        });
    }
    h.feed(Input::Watch {
        id,
        item: Item::InitDone,
    });
    let effects = h.tick(1);
    let w = writes(&effects)[0].clone();
    assert_eq!(w.used, list(&[(CM, "2")]));
    h.feed(Input::Written {
        key: key(),
        precondition: Some("5".into()),
        result: Ok(written(&w, 20)),
    });
    // A delete the watch delivers late: objects stored before 20 may still be on their way.
    h.feed(Input::Watch {
        id,
        item: Item::Delete(configmap("b", 4)),
    });
    assert!(
        writes(&h.tick(1)).is_empty(),
        "held: the key is enforced from version 20 only"
    );
    let effects = h.tick(crate::lowering::SETTLE_MS);
    assert_eq!(writes(&effects).len(), 1, "lowered once settled: {effects:?}");
}

/// A second quota counting ConfigMaps, created at resourceVersion 30 while the ConfigMap
/// watch (synced at 3, two objects) is quiet; returns the effects of its first sync: a list
/// asked for at 30, and nothing written while it is in flight (a write would move the quota
/// past it).
fn second_quota_on_a_quiet_watch(h: &mut Harness) -> Vec<Effect> {
    h.tick(crate::lowering::SETTLE_MS);
    let effects = [
        h.feed(Input::Quota(QuotaEvent::Applied(second_quota(30)))),
        h.tick(1),
    ]
    .concat();
    assert!(
        writes(&effects).is_empty(),
        "the write waits for the list: {effects:?}"
    );
    effects
}

/// The second quota's write `w` (made over 30) answered at 31, and the quota watch
/// delivering it.
fn second_written_at_31(h: &mut Harness, w: &StatusWrite) {
    let mut answer = written(w, 31);
    answer.metadata.name = Some("s".into());
    answer.metadata.uid = Some("uid-s".into());
    h.feed(Input::Written {
        key: second(),
        precondition: Some("30".into()),
        result: Ok(answer.clone()),
    });
    h.feed(Input::Quota(QuotaEvent::Applied(answer)));
}

/// The second quota (no status) at resourceVersion `rv`.
fn second_quota(rv: u64) -> ResourceQuota {
    let mut q = quota(rv, &[(CM, "10")], None);
    q.metadata.name = Some("s".into());
    q.metadata.uid = Some("uid-s".into());
    q
}

fn second() -> QuotaKey {
    QuotaKey::new(&ClusterName::new("c"), "ns", "s")
}

/// A list of the namespace's ConfigMaps for `quota`'s proof, answered.
fn listed_for(quota: QuotaKey, revision: u64, objects: u64, newest: u64) -> Input {
    Input::Listed {
        key: quota,
        resource: GroupResource::core("configmaps"),
        namespace: Some("ns".into()),
        result: Ok(Listed {
            revision,
            objects,
            newest,
        }),
    }
}

fn failed_for(quota: QuotaKey) -> Input {
    Input::Listed {
        key: quota,
        resource: GroupResource::core("configmaps"),
        namespace: Some("ns".into()),
        result: Err("list: 403".into()),
    }
}

fn lists_asked(effects: &[Effect]) -> Vec<(&QuotaKey, &str, Option<&str>)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::ListForProof {
                key,
                served,
                namespace,
            } => Some((key, &*served.resource.resource, namespace.as_deref())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_new_key_on_a_quiet_watch_is_written_at_once_when_a_list_at_the_quotas_version_matches_the_store() {
    let (mut h, _) = written_at_20();
    let effects = second_quota_on_a_quiet_watch(&mut h);
    let second_key = second();
    assert_eq!(
        lists_asked(&effects),
        vec![(&second_key, "configmaps", Some("ns"))]
    );
    // Two objects at 30, the newest stored at 3, as the watch delivered: the store is the
    // state at 30, and the key is written from it.
    let effects = [h.feed(listed_for(second(), 30, 2, 3)), h.tick(1)].concat();
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!((&w[0].key, &w[0].used), (&second(), &list(&[(CM, "2")])));
    assert!(w[0].hard.contains_key(CM), "{:?}", w[0]);
    assert_eq!(w[0].precondition.as_deref(), Some("30"));
}

#[test]
fn a_list_that_differs_from_the_store_holds_the_key_until_the_watch_delivers_what_it_showed() {
    let (mut h, _) = written_at_20();
    second_quota_on_a_quiet_watch(&mut h);
    // Three objects at 30, one stored at 25 that the watch has not delivered.
    let effects = [h.feed(listed_for(second(), 30, 3, 25)), h.tick(1)].concat();
    assert!(writes(&effects).is_empty(), "differed: held, {effects:?}");
    assert!(lists_asked(&effects).is_empty(), "not asked again: {effects:?}");
    // The watch delivers it: compared again, the store is the state at 30.
    let id = h.watch_id();
    let effects = [
        h.feed(Input::Watch {
            id,
            item: Item::Apply(configmap("c", 25)),
        }),
        h.tick(1),
    ]
    .concat();
    let w: Vec<&StatusWrite> = writes(&effects)
        .into_iter()
        .filter(|w| w.key == second())
        .collect();
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!(w[0].used, list(&[(CM, "3")]));
    assert_eq!(w[0].precondition.as_deref(), Some("30"));
}

#[test]
fn a_list_of_as_many_objects_but_one_the_watch_has_not_delivered_proves_nothing() {
    // A ConfigMap deleted and another created after the watch's position (3): as many
    // objects, but the newest is past what the watch delivered.
    let (mut h, _) = written_at_20();
    second_quota_on_a_quiet_watch(&mut h);
    let effects = [h.feed(listed_for(second(), 30, 2, 26)), h.tick(1)].concat();
    assert!(writes(&effects).is_empty(), "{effects:?}");
}

#[test]
fn mutation_a_list_compared_without_versions_is_caught() {
    assert!(
        fails_with(
            Mutation::ProofIgnoresVersions,
            a_list_of_as_many_objects_but_one_the_watch_has_not_delivered_proves_nothing
        ),
        "a list compared by count alone proved the store, and the test passed"
    );
}

#[test]
fn a_list_left_behind_by_a_change_of_the_quota_proves_nothing_and_is_asked_again() {
    let (mut h, _) = written_at_20();
    second_quota_on_a_quiet_watch(&mut h);
    // Someone changes the quota (its metadata) while the list is in flight: objects stored
    // between 30 and 31 are not in a list at 30.
    let mut changed = second_quota(31);
    changed
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert("team".into(), "a".into());
    h.feed(Input::Quota(QuotaEvent::Applied(changed)));
    let effects = [h.feed(listed_for(second(), 30, 2, 3)), h.tick(1)].concat();
    assert!(
        writes(&effects).is_empty(),
        "a list older than the quota, and one asked at its version in flight: {effects:?}"
    );
    assert_eq!(lists_asked(&effects).len(), 1, "{effects:?}");
    let effects = [h.feed(listed_for(second(), 32, 2, 3)), h.tick(1)].concat();
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!((&w[0].key, &w[0].used), (&second(), &list(&[(CM, "2")])));
    assert_eq!(w[0].precondition.as_deref(), Some("31"));
}

/// Since the quota's own write waits for the list, only someone else's change of the quota
/// leaves a list behind it: the rule is checked here, by the test above.
#[test]
fn mutation_a_list_older_than_the_quota_proving_is_caught() {
    assert!(
        fails_with(
            Mutation::StaleProof,
            a_list_left_behind_by_a_change_of_the_quota_proves_nothing_and_is_asked_again
        ),
        "a list older than the quota proved, and the test passed"
    );
}

#[test]
fn a_new_key_on_a_quiet_watch_whose_list_failed_waits_for_its_watch() {
    let (mut h, _) = written_at_20();
    let effects = second_quota_on_a_quiet_watch(&mut h);
    assert_eq!(lists_asked(&effects).len(), 1);
    h.feed(failed_for(second()));
    // The failure ends the wait: status.hard is written at once, without the held key
    // (admission then refuses what would charge it).
    let effects = h.tick(1);
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert!(w[0].used.is_empty() && w[0].hard.contains_key(CM), "{:?}", w[0]);
    assert!(
        lists_asked(&effects).is_empty(),
        "a failure is not retried at its version: {effects:?}"
    );
    // The quota watch delivers the write: at its new version a list is asked again, and the
    // key is written once it matches.
    second_written_at_31(&mut h, w[0]);
    let effects = h.tick(crate::lowering::SETTLE_MS);
    assert!(writes(&effects).is_empty(), "the key is held: {effects:?}");
    assert_eq!(lists_asked(&effects).len(), 1, "{effects:?}");
    let effects = [h.feed(listed_for(second(), 31, 2, 3)), h.tick(1)].concat();
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!(w[0].used, list(&[(CM, "2")]));
    // Had it failed again, the key admission never charged would wait for its watch.
}

#[test]
fn a_list_that_never_answers_holds_the_write_no_longer_than_the_settling_time_and_the_key_waits_for_its_own()
{
    let (mut h, _) = written_at_20();
    second_quota_on_a_quiet_watch(&mut h);
    assert!(
        writes(&h.tick(crate::lowering::SETTLE_MS - 10)).is_empty(),
        "still settling, the list in flight"
    );
    // Settled: the write goes, status.hard gains the key; its value waits for the watch,
    // as admission has never charged it.
    let effects = h.tick(10);
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!(w[0].key, second());
    assert!(w[0].hard.contains_key(CM) && w[0].used.is_empty(), "{:?}", w[0]);
    assert_eq!(w[0].precondition.as_deref(), Some("30"));
    second_written_at_31(&mut h, w[0]);
    // The watch delivers past the quota (an object added and deleted): written from it.
    let id = h.watch_id();
    h.feed(Input::Watch {
        id,
        item: Item::Apply(configmap("c", 32)),
    });
    h.feed(Input::Watch {
        id,
        item: Item::Delete(configmap("c", 33)),
    });
    let effects = h.tick(1);
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!((&w[0].key, &w[0].used), (&second(), &list(&[(CM, "2")])));
    assert_eq!(w[0].precondition.as_deref(), Some("31"));
}

#[test]
fn a_key_lowered_on_a_quiet_watch_is_written_once_a_list_proves_the_store() {
    // The first quota's key lowered on a quiet watch (a late delete, behind the quota at 20):
    // a list at 20 holding the one object left, the newest stored at 2, proves the store.
    let (mut h, _) = written_at_20();
    let id = h.watch_id();
    h.feed(Input::Watch {
        id,
        item: Item::Delete(configmap("b", 4)),
    });
    let effects = h.tick(1);
    assert!(writes(&effects).is_empty(), "held");
    let key = key();
    assert_eq!(lists_asked(&effects), vec![(&key, "configmaps", Some("ns"))]);
    let effects = [h.feed(listed_for(self::key(), 20, 1, 2)), h.tick(1)].concat();
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!(w[0].used, list(&[(CM, "1")]));
}

#[test]
fn a_key_lowered_long_after_the_quotas_last_change_still_waits_for_its_watch() {
    // The quota moved on to 30 (another writer), long settled; then a delete the watch
    // delivers late (at 4): objects stored before 30 may not have reached the watch.
    let (mut h, w) = written_at_20();
    h.feed(Input::Quota(QuotaEvent::Applied(written(&w, 30))));
    h.tick(2 * crate::lowering::SETTLE_MS);
    let id = h.watch_id();
    h.feed(Input::Watch {
        id,
        item: Item::Delete(configmap("b", 4)),
    });
    let effects = h.tick(1);
    assert!(writes(&effects).is_empty(), "held: {effects:?}");
    assert_eq!(lists_asked(&effects).len(), 1, "{effects:?}");
}

/// The simulator's seeds do not find these two in 3,000 (their shape needs a lowering
/// computed, after the settling time, while a watch is behind an object admitted uncharged):
/// the rules are checked here instead.
#[test]
fn mutation_catch_up_only_while_settling_is_caught() {
    assert!(
        fails_with(
            Mutation::CatchUpOnlyWhileSettling,
            a_key_lowered_long_after_the_quotas_last_change_still_waits_for_its_watch
        ),
        "lowered without the watch caught up, and the test passed"
    );
}

#[test]
fn mutation_a_key_unenforced_after_the_settling_time_is_caught() {
    assert!(
        fails_with(
            Mutation::UnenforcedAfterSettling,
            a_key_the_status_lacks_waits_for_its_watches_even_once_the_quota_has_settled
        ),
        "a key never charged written without its watch, and the test passed"
    );
}

#[test]
fn a_key_the_status_lacks_waits_for_its_watches_even_once_the_quota_has_settled() {
    // A key added to a settled quota (`configmaps`, counted by the quiet ConfigMap watch);
    // its list fails, so status.hard is written at once without it, and that write meets a
    // conflict. The write that follows comes after the settling time, and status.hard still
    // lacks the key: admission has charged nothing to it, so an object stored before the
    // quota's version may not have reached the watch. Its first value waits for the watch.
    let (mut h, _) = written_at_20();
    h.tick(crate::lowering::SETTLE_MS);
    let hard = [(CM, "10"), ("configmaps", "10")];
    let mut changed = quota(30, &hard, Some(&[(CM, "2")]));
    changed.status.as_mut().unwrap().hard = Some(list(&[(CM, "10")]));
    let effects = [h.feed(Input::Quota(QuotaEvent::Applied(changed))), h.tick(1)].concat();
    assert_eq!(lists_asked(&effects).len(), 1, "{effects:?}");
    assert!(
        writes(&effects).is_empty(),
        "the write waits for the list: {effects:?}"
    );
    h.feed(failed_for(key()));
    let effects = h.tick(1);
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert!(
        !w[0].used.contains_key("configmaps"),
        "held while settling: {:?}",
        w[0]
    );
    h.feed(Input::Written {
        key: key(),
        precondition: Some("30".into()),
        result: Err(conflict()),
    });
    // A label moved the quota on (31); its event comes after the settling time.
    let effects = h.tick(crate::lowering::SETTLE_MS);
    assert!(writes(&effects).is_empty(), "{effects:?}");
    let mut labelled = quota(31, &hard, Some(&[(CM, "2")]));
    labelled.status.as_mut().unwrap().hard = Some(list(&[(CM, "10")]));
    let fed = h.feed(Input::Quota(QuotaEvent::Applied(labelled)));
    let effects = [fed, h.tick(1)].concat();
    assert_eq!(
        lists_asked(&effects).len(),
        1,
        "asked at the new version: {effects:?}"
    );
    h.feed(failed_for(key()));
    // Computed once the settling time of that version is over too.
    let effects = h.tick(crate::lowering::SETTLE_MS + 1);
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert!(
        w[0].hard.contains_key("configmaps") && !w[0].used.contains_key("configmaps"),
        "status.hard gains the key, its first value waits for the watch: {:?}",
        w[0]
    );
}

#[test]
fn an_own_write_whose_event_comes_before_its_response_is_not_a_charge() {
    // kcp's e2e (`TestKubeQuotaCoreV1TypesFromBinding`): the first write's event, raising the
    // key from nothing to 2, came ahead of its response and was held as admission's charge;
    // a sync within the settling time, with the watch behind the quota, added it again and
    // wrote 4 for two ConfigMaps (and admission refused creates under `hard` meanwhile).
    let mut h = Harness::new(false);
    let effects = h.ready(quota(5, &[(CM, "10")], None), &[("a", 2), ("b", 3)]);
    let w = writes(&effects)[0].clone();
    assert_eq!(w.used, list(&[(CM, "2")]));
    h.feed(Input::Quota(QuotaEvent::Applied(written(&w, 20))));
    h.feed(Input::Written {
        key: key(),
        precondition: Some("5".into()),
        result: Ok(written(&w, 20)),
    });
    // A delete the watch delivers late (rv 4 < 20): nothing is written lower before the
    // watch has caught up, and nothing higher either.
    let (held, effects) = late_delete_then_caught_up(&mut h);
    assert!(writes(&held).is_empty(), "{held:?}");
    let w = writes(&effects);
    assert_eq!(w.len(), 1, "{effects:?}");
    assert_eq!(w[0].used, list(&[(CM, "1")]), "the count, no charge on top");
}

/// Whether `test` fails with `mutation` put back (the rule it checks taken out).
fn fails_with(mutation: Mutation, test: fn()) -> bool {
    crate::mutation::set(Some(mutation));
    let failed = std::panic::catch_unwind(test).is_err();
    crate::mutation::set(None);
    failed
}
