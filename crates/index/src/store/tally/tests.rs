//! The tally against the full sum (`calculate_usage`, upstream's way) over random histories of
//! pods: adds, updates that move a pod between keys and scopes, deletions with a grace period,
//! deletes, and readings at instants before and after the grace ends.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Container, Pod, PodSpec, PodStatus, ResourceRequirements},
    apimachinery::pkg::{
        api::resource::Quantity as K8sQuantity,
        apis::meta::v1::{ObjectMeta, Time as K8sTime},
    },
    jiff::Timestamp,
};
use lazyquota_quota::{
    FeatureGates, Format, Interner, PodProjection, QuotaScopes, ScopeName, ScopeOperator, ScopeRequirement,
    Time, calculate_usage,
};
use proptest::prelude::*;

use super::Generation;

/// One pod as a test draws it.
#[derive(Clone, Debug)]
struct Drawn {
    cpu: Option<&'static str>,
    memory: Option<&'static str>,
    limit_memory: Option<&'static str>,
    deadline: bool,
    priority: Option<&'static str>,
    terminal: bool,
    /// Seconds after the epoch its deletion grace ends.
    deleting_until: Option<i64>,
}

fn drawn() -> impl Strategy<Value = Drawn> {
    let cpu = prop::option::of(prop::sample::select(vec!["100m", "0.25", "1", "2e3m", "0"]));
    let memory = prop::option::of(prop::sample::select(vec!["64Mi", "1G", "1Gi", "500e6", "0"]));
    let limit = prop::option::of(prop::sample::select(vec!["128Mi", "2G", "1.5Gi"]));
    let priority = prop::option::of(prop::sample::select(vec!["high", "low"]));
    let deleting = prop::option::of(10_i64..30);
    (
        cpu,
        memory,
        limit,
        any::<bool>(),
        priority,
        prop::bool::weighted(0.1),
        deleting,
    )
        .prop_map(
            |(cpu, memory, limit_memory, deadline, priority, terminal, deleting_until)| Drawn {
                cpu,
                memory,
                limit_memory,
                deadline,
                priority,
                terminal,
                deleting_until,
            },
        )
}

fn pod(d: &Drawn) -> Pod {
    let list = |pairs: &[(&str, Option<&str>)]| {
        let map: BTreeMap<String, K8sQuantity> = pairs
            .iter()
            .filter_map(|(k, v)| v.map(|v| ((*k).to_owned(), K8sQuantity(v.to_owned()))))
            .collect();
        (!map.is_empty()).then_some(map)
    };
    Pod {
        metadata: ObjectMeta {
            name: Some("p".to_owned()),
            namespace: Some("ns".to_owned()),
            deletion_timestamp: d
                .deleting_until
                .map(|s| K8sTime(Timestamp::from_second(s - 5).expect("in range"))),
            deletion_grace_period_seconds: d.deleting_until.map(|_| 5),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".to_owned(),
                resources: Some(ResourceRequirements {
                    requests: list(&[("cpu", d.cpu), ("memory", d.memory)]),
                    limits: list(&[("memory", d.limit_memory)]),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            active_deadline_seconds: d.deadline.then_some(60),
            priority_class_name: d.priority.map(str::to_owned),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some(if d.terminal { "Succeeded" } else { "Running" }.to_owned()),
            ..PodStatus::default()
        }),
    }
}

/// One step of a history: put pod `n` (an add or an update), or delete it.
#[derive(Clone, Debug)]
enum Step {
    Put(u64, Drawn),
    Delete(u64),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => (0_u64..12, drawn()).prop_map(|(n, d)| Step::Put(n, d)),
        1 => (0_u64..12).prop_map(Step::Delete),
    ];
    prop::collection::vec(step, 1..60)
}

fn scope_sets() -> Vec<QuotaScopes> {
    let exists = |s: &str| ScopeRequirement::from_scope(s);
    let priority = |operator, values: &[&str]| ScopeRequirement {
        scope: ScopeName::PriorityClass,
        operator,
        values: values.iter().map(|v| (*v).to_owned()).collect(),
    };
    vec![
        QuotaScopes::none(),
        QuotaScopes::from_requirements(vec![exists("Terminating")]),
        QuotaScopes::from_requirements(vec![exists("NotTerminating"), exists("NotBestEffort")]),
        QuotaScopes::from_requirements(vec![exists("BestEffort")]),
        QuotaScopes::from_requirements(vec![priority(ScopeOperator::In, &["high"])]),
        QuotaScopes::from_requirements(vec![
            priority(ScopeOperator::NotIn, &["high"]),
            exists("NotTerminating"),
        ]),
        QuotaScopes::from_requirements(vec![priority(ScopeOperator::DoesNotExist, &[])]),
    ]
}

const KEYS: [&str; 9] = [
    "pods",
    "count/pods",
    "requests.cpu",
    "cpu",
    "requests.memory",
    "memory",
    "limits.memory",
    "limits.cpu",
    "requests.storage",
];

/// The format every non-zero addend of `key` has, if they share one (then the sum must print
/// in it, as upstream's does whatever its order).
fn shared_format<'a>(
    objects: impl Iterator<Item = &'a PodProjection>,
    key: &str,
    now: Time,
) -> Option<Format> {
    use lazyquota_quota::QuotaObject;
    let mut formats = Vec::new();
    for object in objects {
        object.for_each_usage(now, &mut |k, q| {
            if k.matches(key) && !q.is_zero() {
                formats.push(q.format());
            }
        });
    }
    formats.dedup();
    match formats.as_slice() {
        [one] => Some(*one),
        [first, rest @ ..] if rest.iter().all(|f| f == first) => Some(*first),
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_tally_reads_what_the_objects_sum_to(history in steps()) {
        let gates = FeatureGates::for_minor(37);
        let interner = Interner::default();
        let mut generation: Generation<PodProjection> = Generation::default();
        let instants = [Time::from_unix_seconds(0), Time::from_unix_seconds(20), Time::from_unix_seconds(40)];
        for step in history {
            match step {
                Step::Put(n, d) => {
                    let projection = PodProjection::from_pod(&pod(&d), gates, &interner).projection;
                    generation.insert(n, projection);
                }
                Step::Delete(n) => {
                    generation.remove(n);
                }
            }
            for scopes in scope_sets() {
                for now in instants {
                    let tallied = generation
                        .tally
                        .usage(&generation.objects, &KEYS, &scopes, now, gates)
                        .expect("no scope error")
                        .expect("no overflow");
                    let summed = calculate_usage(&KEYS, &scopes, generation.objects.values(), now, gates).used;
                    prop_assert_eq!(&tallied, &summed, "scopes {:?} at {:?}", scopes, now);
                    for key in KEYS {
                        let matching = generation.objects.values().filter(|o| {
                            lazyquota_quota::QuotaObject::matches_scopes(*o, &scopes, gates).unwrap_or(false)
                        });
                        if let Some(format) = shared_format(matching, key, now) {
                            prop_assert_eq!(tallied[key].format(), format, "{} under {:?}", key, scopes);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn an_empty_partition_reads_zero_in_decimal_si() {
    let generation: Generation<PodProjection> = Generation::default();
    let used = generation
        .tally
        .usage(
            &generation.objects,
            &["pods", "requests.cpu"],
            &QuotaScopes::none(),
            Time::from_unix_seconds(0),
            FeatureGates::for_minor(37),
        )
        .unwrap()
        .unwrap();
    assert!(
        used.values()
            .all(|q| q.is_zero() && q.format() == Format::DecimalSI)
    );
    assert_eq!(generation.tally.bytes(), 0);
}

#[test]
fn a_scope_error_is_left_to_the_full_sum() {
    let gates = FeatureGates::for_minor(37);
    let mut generation: Generation<PodProjection> = Generation::default();
    let d = Drawn {
        cpu: Some("1"),
        memory: None,
        limit_memory: None,
        deadline: false,
        priority: Some("high"),
        terminal: false,
        deleting_until: None,
    };
    generation.insert(
        1,
        PodProjection::from_pod(&pod(&d), gates, &Interner::default()).projection,
    );
    let invalid = QuotaScopes::from_requirements(vec![ScopeRequirement {
        scope: ScopeName::PriorityClass,
        operator: ScopeOperator::In,
        values: Vec::new(),
    }]);
    assert!(
        generation
            .tally
            .usage(
                &generation.objects,
                &["pods"],
                &invalid,
                Time::from_unix_seconds(0),
                gates
            )
            .is_err()
    );
}
