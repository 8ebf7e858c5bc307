//! Shadow verdicts and keys reported unresolved.

use super::*;

#[test]
fn shadow_mode_never_writes_and_calls_a_key_nobody_claims_unknown() {
    let mut h = Harness::new(true);
    let hard = [(CM, "10"), ("example.com/widgets", "5")];
    let effects = h.ready(
        quota(5, &hard, Some(&[(CM, "1"), ("example.com/widgets", "3")])),
        &[("a", 2)],
    );
    assert!(writes(&effects).is_empty(), "{effects:?}");
    let books = h.rec.books();
    let name = key().to_string();
    assert_eq!(books.shadow_verdicts.get(&name), Some(&false));
    assert!(
        books
            .shadow_unknown
            .contains(&(name.clone(), "example.com/widgets".to_owned()))
    );
    assert!(books.disagreements.is_empty(), "{:?}", books.disagreements);

    // Without the unclaimed key, the same counts agree.
    let mut h = Harness::new(true);
    h.ready(quota(5, &[(CM, "10")], Some(&[(CM, "1")])), &[("a", 2)]);
    assert_eq!(h.rec.books().shadow_verdicts.get(&name), Some(&true));
}

#[test]
fn a_key_of_a_type_not_served_is_reported_once_it_stays_uncomputed() {
    const SERVICES: &str = "count/services";
    let mut h = Harness::new(false);
    let hard = [(CM, "10"), (SERVICES, "5")];
    let effects = h.ready(quota(5, &hard, None), &[("a", 2)]);
    let w = writes(&effects)[0].clone();
    assert!(!w.used.contains_key(SERVICES), "not computed, not written");
    let mut stored = written(&w, 20);
    stored.spec = quota(20, &hard, None).spec;
    h.feed(Input::Written {
        key: key(),
        precondition: Some("5".into()),
        result: Ok(stored),
    });
    let unresolved = |effects: &[Effect]| {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Event {
                    reason: "UsageUnresolved",
                    warning: true,
                    note,
                    ..
                } => Some(note.clone()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let early = h.tick(1_000);
    assert!(unresolved(&early).is_empty(), "not yet: {early:?}");
    assert!(h.rec.books().unresolved.is_empty());
    let effects = h.tick(u64::try_from(UNRESOLVED_WARNING.as_millis()).unwrap());
    let notes = unresolved(&effects);
    assert_eq!(notes.len(), 1, "{effects:?}");
    assert!(
        notes[0].starts_with("count/services: not computed"),
        "{}",
        notes[0]
    );
    assert!(
        notes[0].contains("not served by the apiserver: count/services"),
        "{}",
        notes[0]
    );
    let pair = (key().to_string(), SERVICES.to_owned());
    assert!(h.rec.books().unresolved.contains(&pair));
    // Told once, not at every computation.
    h.feed(Input::Watch {
        id: h.watch_id(),
        item: Item::Apply(configmap("b", 30)),
    });
    let effects = h.tick(1);
    assert!(unresolved(&effects).is_empty());
    let w = writes(&effects)[0].clone();
    let mut stored = written(&w, 31);
    stored.spec = quota(31, &hard, None).spec;
    h.feed(Input::Written {
        key: key(),
        precondition: Some("20".into()),
        result: Ok(stored),
    });

    // The type comes to be served, is listed, and the key is computed: the quota is told.
    let opened = h.serve_services();
    let effects = h.list_opened(&opened, "services");
    assert!(
        effects.iter().any(|e| matches!(
            e,
            Effect::Event {
                reason: "UsageComputed",
                warning: false,
                ..
            }
        )),
        "{effects:?}"
    );
    assert!(h.rec.books().unresolved.is_empty());
    let w = writes(&effects).last().copied().expect("a write").clone();
    assert_eq!(w.used.get(SERVICES).map(|q| q.0.as_str()), Some("0"));
    let mut stored = written(&w, 45);
    stored.spec = quota(45, &hard, None).spec;
    h.feed(Input::Written {
        key: key(),
        precondition: Some("31".into()),
        result: Ok(stored.clone()),
    });

    // A key that leaves spec.hard while uncomputed goes without a word.
    let widgets = [(CM, "10"), ("count/widgets.example.com", "1")];
    let mut changed = quota(50, &widgets, None);
    changed.status = stored.status;
    h.feed(Input::Quota(QuotaEvent::Applied(changed)));
    let effects = h.tick(1);
    assert_eq!(h.rec.books().uncomputed_since.len(), 1);
    let w = writes(&effects)[0].clone();
    let mut stored = written(&w, 51);
    stored.spec = quota(51, &widgets, None).spec;
    h.feed(Input::Written {
        key: key(),
        precondition: Some("50".into()),
        result: Ok(stored),
    });
    h.feed(Input::Quota(QuotaEvent::Applied(quota(52, &[(CM, "10")], None))));
    let effects = h.tick(1);
    assert!(!effects.iter().any(|e| matches!(
        e,
        Effect::Event {
            reason: "UsageComputed",
            ..
        }
    )));
    assert!(h.rec.books().uncomputed_since.is_empty());
}
