use super::*;

fn opens(effects: &[Effect]) -> usize {
    effects
        .iter()
        .filter(|e| matches!(e, Effect::OpenWatch { .. }))
        .count()
}

fn closes(effects: &[Effect]) -> usize {
    effects
        .iter()
        .filter(|e| matches!(e, Effect::CloseWatch { .. }))
        .count()
}

fn fail(h: &mut Harness, id: u64) -> Vec<Effect> {
    h.feed(Input::Watch {
        id,
        item: Item::Failed("watch_start", "429 storage is (re)initializing".into()),
    })
}

/// The reopened watch lists again (its one ConfigMap) and syncs.
fn relist(h: &mut Harness, id: u64) {
    h.feed(Input::Watch { id, item: Item::Init });
    h.feed(Input::Watch {
        id,
        item: Item::InitApply(configmap("a", 2)),
    });
    h.feed(Input::Watch {
        id,
        item: Item::InitDone,
    });
}

#[test]
fn a_watch_that_lists_but_cannot_start_is_reopened_after_doubling_waits() {
    let mut h = Harness::new(false);
    h.ready(quota(5, &[(CM, "10")], None), &[("a", 2)]);
    let id = h.watch_id();

    let first = fail(&mut h, id);
    assert_eq!(
        (closes(&first), opens(&first)),
        (1, 1),
        "the first restart is at once: {first:?}"
    );
    let mut waits = Vec::new();
    for _ in 0..4 {
        relist(&mut h, id);
        let again = fail(&mut h, id);
        assert_eq!(closes(&again), 1, "closed at once: {again:?}");
        assert_eq!(
            opens(&again),
            0,
            "a restart close to the last one waits: {again:?}"
        );
        let mut waited = 0;
        loop {
            let effects = h.tick(10);
            waited += 10;
            for w in writes(&effects) {
                assert_eq!(
                    w.used.get(CM).map(|q| q.0.as_str()),
                    Some("1"),
                    "while the watch is closed its key keeps its value: {w:?}"
                );
            }
            if opens(&effects) > 0 {
                assert!(
                    effects.contains(&Effect::OpenWatch {
                        id,
                        key: h.rec.watches().iter().next().unwrap().0.clone(),
                        served: crate::resolver::ServedResource::core_for_tests("configmaps"),
                    }),
                    "the same watch reopens under its id: {effects:?}"
                );
                break;
            }
            assert!(waited < 60_000, "reopened within the cap");
        }
        waits.push(waited);
    }
    assert_eq!(waits, [100, 200, 400, 800], "the waits double");
}

#[test]
fn a_watch_stopped_while_its_reopen_waits_is_not_reopened() {
    let mut h = Harness::new(false);
    h.ready(quota(5, &[(CM, "10")], None), &[("a", 2)]);
    let id = h.watch_id();
    fail(&mut h, id);
    relist(&mut h, id);
    fail(&mut h, id);
    let mut gone = quota(6, &[(CM, "10")], None);
    gone.metadata.resource_version = Some("6".into());
    let stopped = h.feed(Input::Quota(QuotaEvent::Deleted(gone)));
    assert_eq!(closes(&stopped), 1, "the quota's watch closes again: {stopped:?}");
    assert_eq!(h.rec.restarts.waiting(), 0, "its reopen is dropped");
    assert_eq!(opens(&h.tick(60_000)), 0);
}

/// A hub sharing ConfigMaps from one cluster on, watch 1 of cluster `c` subscribed (the shared
/// watch opened).
fn shared_configmaps(t0: Instant) -> (Hub, SharedKey, crate::resolver::ServedResource) {
    let served = crate::resolver::ServedResource::core_for_tests("configmaps");
    let key = SharedKey {
        resource: served.resource.clone(),
        version: served.version.clone(),
    };
    let mut hub = Hub::new(1, 16);
    let mut effects = Vec::new();
    hub.subscribe(1, ClusterName::new("c"), None, &served, t0, &mut effects);
    let open = Effect::OpenShared {
        key: key.clone(),
        served: served.clone(),
    };
    assert!(effects.contains(&open), "{effects:?}");
    (hub, key, served)
}

/// The shared watch lists, then cannot start its watch (kcp's 429): the effects.
fn list_then_refuse(hub: &mut Hub, key: &SharedKey, at: Instant) -> Vec<Effect> {
    let mut effects = Vec::new();
    for event in [SharedEvent::Init, SharedEvent::InitDone] {
        hub.on_event(key, event, at, &mut effects);
    }
    let failed = SharedEvent::Failed("watch_start", "429 storage is (re)initializing".into());
    hub.on_event(key, failed, at, &mut effects);
    effects
}

/// The shared ConfigMap watch, refused twice after its list (its reopen waiting), then left
/// by its only subscriber; the effects of the leaving.
fn refused_twice_then_left(t0: Instant) -> (Hub, SharedKey, crate::resolver::ServedResource, Vec<Effect>) {
    let (mut hub, key, served) = shared_configmaps(t0);
    for _ in 0..2 {
        list_then_refuse(&mut hub, &key, t0);
    }
    let mut left = Vec::new();
    assert!(hub.unsubscribe(1, &mut left));
    (hub, key, served, left)
}

fn shared_opens(effects: &[Effect]) -> usize {
    effects
        .iter()
        .filter(|e| matches!(e, Effect::OpenShared { .. }))
        .count()
}

#[test]
fn a_shared_watch_that_lists_but_cannot_start_is_reopened_after_doubling_waits() {
    let t0 = Instant::now();
    let (mut hub, key, served) = shared_configmaps(t0);
    let reopen = Effect::OpenShared {
        key: key.clone(),
        served: served.clone(),
    };
    let mut at = t0;
    let first = list_then_refuse(&mut hub, &key, at);
    assert!(
        first.contains(&Effect::CloseShared { key: key.clone() }),
        "{first:?}"
    );
    assert!(first.contains(&reopen), "the first restart is at once: {first:?}");
    for wait in [100, 200, 400] {
        let again = list_then_refuse(&mut hub, &key, at);
        assert!(
            again.contains(&Effect::CloseShared { key: key.clone() }),
            "{again:?}"
        );
        assert!(!again.contains(&reopen), "a close restart waits: {again:?}");
        let due = at + Duration::from_millis(wait);
        assert_eq!(hub.next_wakeup(), Some(due));
        let mut early = Vec::new();
        hub.tick(at + Duration::from_millis(wait - 1), &mut early);
        assert!(!early.contains(&reopen), "not before its wait: {early:?}");
        let mut effects = Vec::new();
        hub.tick(due, &mut effects);
        assert!(effects.contains(&reopen), "reopened after {wait} ms: {effects:?}");
        at = due;
    }
}

#[test]
fn a_subscriber_joining_while_the_shared_reopen_waits_is_served_by_the_reopened_watchs_list() {
    let t0 = Instant::now();
    let (mut hub, key, served) = shared_configmaps(t0);
    // Listed, failed (reopened at once), listed, failed again: the reopen waits 100 ms.
    for _ in 0..2 {
        list_then_refuse(&mut hub, &key, t0);
    }
    let mut joined = Vec::new();
    hub.subscribe(2, ClusterName::new("d"), None, &served, t0, &mut joined);
    assert!(
        !joined
            .iter()
            .any(|e| matches!(e, Effect::OpenShared { .. } | Effect::ListShare { .. })),
        "no second watch and no share list of its own while the watch is down: {joined:?}"
    );
    let mut reopened = Vec::new();
    hub.tick(t0 + Duration::from_millis(100), &mut reopened);
    assert_eq!(shared_opens(&reopened), 1, "{reopened:?}");
    // The reopened watch's list serves both subscribers.
    let mut out = Vec::new();
    let items = hub.on_event(&key, SharedEvent::Init, t0, &mut out);
    let watches: std::collections::BTreeSet<u64> = items.iter().map(|(w, _)| *w).collect();
    assert_eq!(watches, [1, 2].into(), "{items:?}");
}

#[test]
fn a_shared_watch_left_and_subscribed_again_during_its_wait_opens_once_when_due_and_keeps_backing_off() {
    let t0 = Instant::now();
    let (mut hub, key, served, left) = refused_twice_then_left(t0);
    assert!(
        left.contains(&Effect::CloseShared { key: key.clone() }),
        "{left:?}"
    );
    let due = t0 + Duration::from_millis(100);
    assert_eq!(hub.next_wakeup(), Some(due), "the waiting reopen stays");
    let mut again = Vec::new();
    hub.subscribe(3, ClusterName::new("c"), None, &served, t0, &mut again);
    let opens = |e: &[Effect]| {
        e.iter()
            .filter(|e| matches!(e, Effect::OpenShared { .. }))
            .count()
    };
    assert_eq!(
        shared_opens(&again),
        0,
        "new demand does not open it before its reopen is due: {again:?}"
    );
    let mut later = Vec::new();
    hub.tick(due, &mut later);
    assert_eq!(shared_opens(&later), 1, "opened when due: {later:?}");
    let mut after = Vec::new();
    hub.tick(t0 + Duration::from_secs(1), &mut after);
    assert_eq!(shared_opens(&after), 0, "and only once: {after:?}");
    // Failing again soon after its list, it waits (its third restart in close succession).
    let now = t0 + Duration::from_secs(1);
    let mut out = Vec::new();
    hub.on_event(&key, SharedEvent::Init, now, &mut out);
    hub.on_event(&key, SharedEvent::InitDone, now, &mut out);
    hub.on_event(
        &key,
        SharedEvent::Failed("watch_start", "429".into()),
        now,
        &mut out,
    );
    assert_eq!(opens(&out), 0, "{out:?}");
    assert_eq!(hub.next_wakeup(), Some(now + Duration::from_millis(200)));
}

#[test]
fn a_shared_watch_whose_reopen_fell_due_while_it_was_closed_opens_at_once_on_new_demand() {
    let t0 = Instant::now();
    let (mut hub, key, served, _) = refused_twice_then_left(t0);
    let due = t0 + Duration::from_millis(100);
    let mut at_due = Vec::new();
    hub.tick(due, &mut at_due);
    assert_eq!(shared_opens(&at_due), 0, "no watch to reopen: {at_due:?}");
    assert_eq!(hub.next_wakeup(), None, "nothing waits any more");
    let mut again = Vec::new();
    hub.subscribe(3, ClusterName::new("c"), None, &served, due, &mut again);
    assert_eq!(
        shared_opens(&again),
        1,
        "its wait is over: new demand opens it at once: {again:?}"
    );
    // Failing again soon, it still backs off (its third restart in close succession).
    let out = list_then_refuse(&mut hub, &key, due);
    assert_eq!(shared_opens(&out), 0, "{out:?}");
    assert_eq!(hub.next_wakeup(), Some(due + Duration::from_millis(200)));
}
