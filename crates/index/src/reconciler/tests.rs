//! The reconciler's decisions one by one: what it writes and when, what a write's answer
//! leads to, shadow verdicts. Many seeds of everything at once: `crates/index/tests/sim`.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::{ResourceQuota, ResourceQuotaSpec, ResourceQuotaStatus},
    apimachinery::pkg::{api::resource::Quantity as K8sQuantity, apis::meta::v1::ObjectMeta},
};
use lazyquota_quota::Time;

use super::*;
use crate::{
    engine::Projected,
    keys::{Need, ObjectIds},
    watches::{Item, ObjectEvent},
};

const CM: &str = "count/configmaps";

struct Harness {
    rec: Reconciler,
    origin: Instant,
    ms: u64,
}

fn list(pairs: &[(&str, &str)]) -> BTreeMap<String, K8sQuantity> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), K8sQuantity((*v).to_owned())))
        .collect()
}

fn quota(rv: u64, hard: &[(&str, &str)], used: Option<&[(&str, &str)]>) -> ResourceQuota {
    ResourceQuota {
        metadata: ObjectMeta {
            name: Some("q".into()),
            namespace: Some("ns".into()),
            uid: Some("uid-q".into()),
            resource_version: Some(rv.to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(list(hard)),
            ..ResourceQuotaSpec::default()
        }),
        status: used.map(|used| ResourceQuotaStatus {
            hard: Some(list(hard)),
            used: Some(list(used)),
        }),
    }
}

fn configmap(name: &str, revision: u64) -> ObjectEvent {
    ObjectEvent {
        namespace: "ns".into(),
        name: name.into(),
        object: Projected::Meta,
        revision: Some(revision),
    }
}

fn key() -> QuotaKey {
    QuotaKey::new(&ClusterName::new("c"), "ns", "q")
}

impl Harness {
    fn new(shadow: bool) -> Self {
        let origin = Instant::now();
        let settings = Settings {
            cluster: ClusterName::new("c"),
            shadow,
            resync_period: Duration::ZERO,
            ..Settings::default()
        };
        Self {
            rec: Reconciler::new(settings, ObjectIds::new(std::hash::RandomState::new()), origin),
            origin,
            ms: 0,
        }
    }

    fn now(&self) -> Now {
        Now {
            instant: self.origin + Duration::from_millis(self.ms),
            time: Time::from_unix_nanos(1_800_000_000_000_000_000),
        }
    }

    fn feed(&mut self, input: Input) -> Vec<Effect> {
        self.rec.handle(input, self.now());
        self.rec.take_effects()
    }

    /// Moves time on by `ms` and ticks.
    fn tick(&mut self, ms: u64) -> Vec<Effect> {
        self.ms += ms;
        self.rec.tick(self.now());
        self.rec.take_effects()
    }

    /// The quota listed, discovery answered (configmaps served), the configmap watch synced
    /// with `objects`: returns the effects of the first sync (its status write).
    fn ready(&mut self, q: ResourceQuota, objects: &[(&str, u64)]) -> Vec<Effect> {
        let discover = self.tick(0);
        assert!(
            discover.contains(&Effect::Discover(ClusterName::new("c"))),
            "{discover:?}"
        );
        self.feed(Input::Quota(QuotaEvent::RelistStarted));
        self.feed(Input::Quota(QuotaEvent::Relisted(q)));
        self.feed(Input::Quota(QuotaEvent::RelistDone));
        assert!(
            !self.tick(1).iter().any(|e| matches!(e, Effect::WriteStatus(_))),
            "no write before the first discovery: admission would refuse every create"
        );
        let opened = self.feed(Input::Discovered {
            cluster: ClusterName::new("c"),
            result: Ok(Discovered {
                served: vec![crate::resolver::ServedResource::core_for_tests("configmaps")],
                failed_groups: Vec::new(),
            }),
        });
        let id = opened
            .iter()
            .find_map(|e| match e {
                Effect::OpenWatch { id, key, .. } if key.need == Need::Count => Some(*id),
                _ => None,
            })
            .expect("the constrained type is watched");
        self.feed(Input::Watch { id, item: Item::Init });
        for (name, rv) in objects {
            self.feed(Input::Watch {
                id,
                item: Item::InitApply(configmap(name, *rv)),
            });
        }
        self.feed(Input::Watch {
            id,
            item: Item::InitDone,
        });
        self.tick(1)
    }

    /// Discovery finds Services served too; returns the effects (a watch opened, if a quota
    /// names them).
    fn serve_services(&mut self) -> Vec<Effect> {
        self.feed(Input::Discovered {
            cluster: ClusterName::new("c"),
            result: Ok(Discovered {
                served: vec![
                    crate::resolver::ServedResource::core_for_tests("configmaps"),
                    crate::resolver::ServedResource::core_for_tests("services"),
                ],
                failed_groups: Vec::new(),
            }),
        })
    }

    /// The watch of `resource` that `opened` opened lists (empty) and syncs; returns the
    /// effects, a tick's included.
    fn list_opened(&mut self, opened: &[Effect], resource: &str) -> Vec<Effect> {
        let id = opened
            .iter()
            .find_map(|e| match e {
                Effect::OpenWatch { id, key, .. } if key.resource.resource == resource => Some(*id),
                _ => None,
            })
            .unwrap_or_else(|| panic!("a watch of {resource} opened: {opened:?}"));
        self.feed(Input::Watch { id, item: Item::Init });
        let mut effects = self.feed(Input::Watch {
            id,
            item: Item::InitDone,
        });
        effects.extend(self.tick(1));
        effects
    }

    fn watch_id(&self) -> u64 {
        self.rec
            .watches()
            .iter()
            .next()
            .map(|(_, r)| r.id)
            .expect("a watch")
    }
}

/// Two ConfigMaps counted and written: the quota is at resourceVersion 20.
fn written_at_20() -> (Harness, StatusWrite) {
    let mut h = Harness::new(false);
    let effects = h.ready(quota(5, &[(CM, "10")], None), &[("a", 2), ("b", 3)]);
    let w = writes(&effects)[0].clone();
    h.feed(Input::Written {
        key: key(),
        precondition: Some("5".into()),
        result: Ok(written(&w, 20)),
    });
    (h, w)
}

fn writes(effects: &[Effect]) -> Vec<&StatusWrite> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::WriteStatus(w) => Some(w),
            _ => None,
        })
        .collect()
}

fn written(w: &StatusWrite, rv: u64) -> ResourceQuota {
    let mut q = quota(rv, &[(CM, "10")], None);
    q.status = Some(ResourceQuotaStatus {
        hard: Some(w.hard.clone()),
        used: Some(w.used.clone()),
    });
    q
}

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

#[test]
fn a_conflict_with_nothing_newer_reads_the_quota_afresh() {
    let mut h = Harness::new(false);
    let effects = h.ready(quota(5, &[(CM, "10")], None), &[("a", 2)]);
    assert_eq!(writes(&effects).len(), 1);
    let conflict = Failure {
        code: Some(409),
        message: "conflict".into(),
    };
    let after = h.feed(Input::Written {
        key: key(),
        precondition: Some("5".into()),
        result: Err(conflict.clone()),
    });
    assert!(after.contains(&Effect::ReadQuota(key())), "{after:?}");

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
        result: Err(conflict),
    });
    assert!(!after.contains(&Effect::ReadQuota(key())), "{after:?}");
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
fn a_key_is_not_lowered_before_the_watch_has_caught_up_with_the_quota() {
    let (mut h, _) = written_at_20();
    let id = h.watch_id();
    // A delete the watch delivers late (rv 4 < 20): the caches may still lack objects stored
    // up to 20, so the key is not written lower yet...
    h.feed(Input::Watch {
        id,
        item: Item::Delete(configmap("b", 4)),
    });
    assert!(writes(&h.tick(1)).is_empty(), "held");
    // ...until the watch has come past the quota's version.
    h.feed(Input::Watch {
        id,
        item: Item::Apply(configmap("c", 21)),
    });
    h.feed(Input::Watch {
        id,
        item: Item::Delete(configmap("c", 22)),
    });
    let effects = h.tick(1);
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

#[test]
fn long_after_its_creation_a_quota_changed_by_someone_else_is_lowered_at_once() {
    let (mut h, w) = written_at_20();
    h.tick(crate::lowering::SETTLE_MS);
    // Another writer (or an edit of a label) moves the version on; the watch is quiet.
    h.feed(Input::Quota(QuotaEvent::Applied(written(&w, 30))));
    let id = h.watch_id();
    h.feed(Input::Watch {
        id,
        item: Item::Delete(configmap("b", 4)),
    });
    let effects = h.tick(1);
    let w = writes(&effects);
    assert_eq!(
        w.len(),
        1,
        "not held: every object since the quota's keys were set was charged"
    );
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
        result: Err(Failure {
            code: Some(409),
            message: "conflict".into(),
        }),
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
        result: Ok(stored),
    });

    // A key that leaves spec.hard while uncomputed goes without a word.
    let widgets = [(CM, "10"), ("count/widgets.example.com", "1")];
    h.feed(Input::Quota(QuotaEvent::Applied(quota(50, &widgets, None))));
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
    let charges = &h.rec.engine().index.get(&key()).unwrap().payload.charges;
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
