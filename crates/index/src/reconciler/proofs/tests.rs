use super::*;

/// The namespace the tests' lists list.
const NS: Option<&str> = Some("ns");

fn quota(name: &str) -> QuotaKey {
    QuotaKey::new(&ClusterName::new("c"), "ns", name)
}

fn listed(revision: u64, objects: u64, newest: u64) -> Listed {
    Listed {
        revision,
        objects,
        newest,
    }
}

#[test]
fn a_list_matches_a_store_holding_as_many_objects_none_newer_than_its_watch_delivered() {
    let l = Listed {
        revision: 20,
        objects: 3,
        newest: 12,
    };
    assert!(l.matches(3, 12), "the store is the state at 20");
    assert!(l.matches(3, 15));
    assert!(!l.matches(2, 15), "an object the watch has not delivered");
    assert!(!l.matches(4, 15), "an object deleted after the watch's position");
    assert!(!l.matches(3, 11), "an object changed after the watch's position");
}

#[test]
fn a_list_proves_only_at_or_past_the_quotas_version_and_is_asked_once_per_version() {
    let (q, r) = (quota("q"), GroupResource::core("configmaps"));
    let mut proofs = Proofs::default();
    assert_eq!(proofs.proof(&q, &r, 10, NS), Proof::None);
    assert!(proofs.ask(&q, &r, 10, NS));
    assert!(!proofs.ask(&q, &r, 10, NS), "asked already at this version");
    assert_eq!(proofs.proof(&q, &r, 10, NS), Proof::Pending);
    assert!(proofs.answered(&q, &r, NS, Some(listed(12, 3, 9))));
    assert_eq!(proofs.proof(&q, &r, 12, NS), Proof::Listed(listed(12, 3, 9)));
    assert!(!proofs.ask(&q, &r, 12, NS), "answered at or past this version");
    assert_eq!(
        proofs.proof(&q, &r, 13, NS),
        Proof::None,
        "the quota moved past the list"
    );
    assert!(proofs.ask(&q, &r, 13, NS), "asked again for the new version");
    assert!(proofs.answered(&q, &r, NS, None), "a failure ends the wait too");
    assert!(!proofs.answered(&q, &r, NS, None), "answered once");
    assert_eq!(proofs.proof(&q, &r, 13, NS), Proof::Failed);
    assert!(
        !proofs.ask(&q, &r, 13, NS),
        "a failed list is not asked again at that version"
    );
    assert!(proofs.ask(&q, &r, 14, NS), "but at a later one");
    proofs.forget(&q);
    assert!(proofs.is_empty());
}

#[test]
fn a_quota_waits_only_for_its_own_lists_in_flight_at_its_version() {
    let (q, r) = (quota("q"), GroupResource::core("configmaps"));
    let other = quota("other");
    let deployments = GroupResource::new("apps", "deployments");
    let mut proofs = Proofs::default();
    assert!(!proofs.waiting(&q, 10), "nothing asked");
    assert!(proofs.ask(&other, &r, 10, NS));
    assert!(!proofs.waiting(&q, 10), "another quota's list");
    assert!(proofs.ask(&q, &deployments, 10, NS));
    assert!(proofs.ask(&q, &r, 10, NS));
    assert!(proofs.waiting(&q, 10));
    assert!(!proofs.waiting(&q, 11), "the quota moved past what was asked");
    proofs.answered(&q, &deployments, NS, None);
    assert!(proofs.waiting(&q, 10), "one of its lists is still in flight");
    proofs.answered(&q, &r, NS, Some(listed(10, 1, 1)));
    assert!(!proofs.waiting(&q, 10), "answered or failed: nothing in flight");
    assert!(proofs.waiting(&other, 10));
    assert_eq!(proofs.listing(&ClusterName::new("c"), &r), vec![q.clone()]);
    assert!(
        proofs.listing(&ClusterName::new("c"), &deployments).is_empty(),
        "failed"
    );
}

#[test]
fn lists_in_flight_and_kept_are_bounded() {
    let r = GroupResource::core("configmaps");
    let mut proofs = Proofs::default();
    for i in 0..MAX_IN_FLIGHT {
        assert!(proofs.ask(&quota(&i.to_string()), &r, 1, NS));
    }
    assert!(!proofs.ask(&quota("one more"), &r, 1, NS), "in flight is bounded");
    assert!(proofs.answered(&quota("0"), &r, NS, Some(listed(1, 0, 0))));
    assert!(proofs.ask(&quota("one more"), &r, 1, NS), "an answer makes room");
    for i in 1..MAX_IN_FLIGHT {
        proofs.answered(&quota(&i.to_string()), &r, NS, Some(listed(1, 0, 0)));
    }
    proofs.answered(&quota("one more"), &r, NS, Some(listed(1, 0, 0)));
    for i in 0..MAX_KEPT {
        let q = quota(&format!("kept {i}"));
        if proofs.ask(&q, &r, 1, NS) {
            proofs.answered(&q, &r, NS, Some(listed(1, 0, 0)));
        }
    }
    assert_eq!(proofs.len(), MAX_KEPT);
    assert!(!proofs.ask(&quota("beyond"), &r, 1, NS), "kept is bounded");
    proofs.forget_cluster(&ClusterName::new("c"));
    assert!(proofs.is_empty());
}

#[test]
fn a_list_of_another_scope_proves_nothing_and_its_answer_is_ignored() {
    let (q, r) = (quota("q"), GroupResource::core("configmaps"));
    let mut proofs = Proofs::default();
    assert!(proofs.ask(&q, &r, 10, NS));
    // The quota becomes cluster-scoped (kcp) while the list of its namespace is in flight.
    assert!(proofs.ask(&q, &r, 10, None), "asked again for every namespace");
    assert!(
        !proofs.answered(&q, &r, NS, Some(listed(12, 1, 5))),
        "the namespace's list answers nothing asked now"
    );
    assert_eq!(proofs.proof(&q, &r, 10, None), Proof::Pending);
    assert!(
        proofs.waiting(&q, 10),
        "the list of every namespace is still in flight"
    );
    assert!(proofs.answered(&q, &r, None, Some(listed(12, 3, 5))));
    assert_eq!(proofs.proof(&q, &r, 10, None), Proof::Listed(listed(12, 3, 5)));
    assert_eq!(
        proofs.proof(&q, &r, 10, NS),
        Proof::None,
        "and it proves no other scope"
    );
}
