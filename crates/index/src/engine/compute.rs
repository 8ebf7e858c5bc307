//! Computing a quota's status from what the Engine holds, as upstream's `syncResourceQuota`
//! does, and what a computation leaves behind (which keys it computed and from which watches).

use std::{collections::BTreeSet, sync::Arc};

use lazyquota_quota::{
    DeviceClassMap, Evaluator, FeatureGates, PodProjection, Quantity, QuotaObject, QuotaScopes, ResourceList,
    ScopeClassed, ScopeError, StatusDecision, Time, assemble_status, calculate_object_count_usage,
    calculate_usage, claim_usage, verified_owner,
};

use crate::{
    demand::device_classes,
    keys::{ALL_NAMESPACES, ClusterName, GroupResource, Need, QuotaKey},
    store::{Partition, PartitionKey, Tallied, UsageStore, UsageTally},
};

use super::Engine;

impl Engine {
    // ---- computing -------------------------------------------------------------------------

    /// `syncResourceQuota` minus the write: the status to write and whether it is due.
    /// `None` if the quota is unknown.
    pub fn compute(&self, key: &QuotaKey, now: Time) -> Option<Computed> {
        let entry = self.index.get(key)?;
        let state = &entry.payload;
        let registry = self.registry(&key.cluster);
        let hard_keys: Vec<&str> = state.spec.hard_keys.iter().map(String::as_str).collect();
        // The DeviceClasses, when this quota reads them; `None` while they are not synced.
        let classes = if entry.demands().contains_key(&device_classes()) {
            self.device_class_map(&key.cluster)
        } else {
            Some(DeviceClassMap::new())
        };
        let plan = registry.plan_with_classes(&hard_keys, classes.as_ref());
        let mut scope_errors = Vec::new();
        let results: Vec<(Evaluator, Option<ResourceList>)> = plan
            .per_evaluator
            .iter()
            .map(|(evaluator, keys)| {
                let need = entry.demands().get(&evaluator.group_resource()).copied();
                let used = match (evaluator, need) {
                    (Evaluator::ResourceClaims, Some(Need::Typed)) => classes.as_ref().and_then(|classes| {
                        self.claims_usage(key, entry.demand_namespace(), keys, &plan.matched, classes, now)
                    }),
                    _ => self.evaluate(
                        key,
                        entry.demand_namespace(),
                        need,
                        evaluator,
                        keys,
                        &state.spec.scopes,
                        now,
                        &mut scope_errors,
                    ),
                };
                (evaluator.clone(), used)
            })
            .collect();
        let unsynced = results
            .iter()
            .filter(|(_, r)| r.is_none())
            .map(|(e, _)| e.group_resource())
            .collect::<Vec<_>>();
        let claimed: BTreeSet<&str> = plan
            .per_evaluator
            .iter()
            .flat_map(|(_, keys)| keys.iter().map(String::as_str))
            .collect();
        let uncomputed = plan
            .per_evaluator
            .iter()
            .zip(&results)
            .filter(|(_, (_, r))| r.is_none())
            .flat_map(|((_, keys), _)| keys.iter().cloned())
            // `count/<resource>` of a type not served (yet): no evaluator exists to claim it,
            // but one would as soon as discovery finds the type.
            .chain(
                hard_keys
                    .iter()
                    .filter(|k| k.starts_with("count/") && !claimed.contains(*k))
                    .map(|k| (*k).to_owned()),
            )
            .collect();
        let unclaimed = hard_keys
            .iter()
            .filter(|k| !k.starts_with("count/") && !claimed.contains(*k))
            .map(|k| (*k).to_owned())
            .collect();
        let used = plan.merge(&results);
        let decision = assemble_status(
            state.spec_hard.as_ref(),
            state.status_hard.as_ref(),
            state.status_used.as_ref(),
            &used,
        );
        Some(Computed {
            decision,
            unsynced,
            scope_errors,
            uncomputed,
            unclaimed,
            sources: KeySources(plan.per_evaluator),
        })
    }

    /// One evaluator's usage in `namespace` (the quota's demand namespace), or `None` if it cannot be computed now
    /// (its resource is not synced): its keys then keep their previous values.
    #[allow(clippy::too_many_arguments)] // all of it is one evaluation's context
    fn evaluate(
        &self,
        quota: &QuotaKey,
        namespace: &Arc<str>,
        need: Option<Need>,
        evaluator: &Evaluator,
        keys: &[String],
        scopes: &QuotaScopes,
        now: Time,
        scope_errors: &mut Vec<String>,
    ) -> Option<ResourceList> {
        let gates = self.gates;
        let p = PartitionKey {
            cluster: quota.cluster.clone(),
            resource: evaluator.group_resource(),
            // Its own namespace, or every namespace for kcp's cluster-scoped quotas.
            namespace: namespace.clone(),
        };
        let none: [&PodProjection; 0] = [];
        let reading = Reading {
            keys,
            scopes,
            now,
            gates,
        };
        match (need, evaluator) {
            // Computed by `claims_usage`; a claim count alone is counted like any other.
            (Some(Need::Typed), Evaluator::ResourceClaims) => None,
            // Nothing demanded: the scopes exclude every object, so the value is 0.
            (None, Evaluator::ObjectCount(_)) => Some(calculate_object_count_usage(keys, scopes, 0)),
            (None, _) => Some(calculate_usage(keys, scopes, none, now, gates).used),
            (Some(Need::Count), _) => {
                // Counted from whichever store holds the partition (a typed watch serves counts too).
                let count = synced_len(&self.counts, &p)
                    .or_else(|| synced_len(&self.pods, &p))
                    .or_else(|| synced_len(&self.services, &p))
                    .or_else(|| synced_len(&self.pvcs, &p))
                    .or_else(|| synced_len(&self.claims, &p))?;
                Some(calculate_object_count_usage(keys, scopes, count as u64))
            }
            (Some(Need::Typed), Evaluator::Pods) => typed_usage(&self.pods, &p, &reading, scope_errors),
            (Some(Need::Typed), Evaluator::Services) => {
                typed_usage(&self.services, &p, &reading, scope_errors)
            }
            (Some(Need::Typed), Evaluator::PersistentVolumeClaims) => {
                typed_usage(&self.pvcs, &p, &reading, scope_errors)
            }
            (Some(Need::Typed), Evaluator::ObjectCount(_)) => Some(calculate_object_count_usage(
                keys,
                scopes,
                synced_len(&self.counts, &p)? as u64,
            )),
        }
    }
}

impl Engine {
    /// The typed keys of quota `key` whose value read from their partition's tally differs (by
    /// value) from the objects summed one by one — empty when they agree. The full sum is the
    /// reference the tallies are checked against (the simulator, at every write).
    pub fn tally_disagreements(&self, key: &QuotaKey, now: Time) -> Vec<String> {
        let Some(entry) = self.index.get(key) else {
            return Vec::new();
        };
        let state = &entry.payload;
        let hard_keys: Vec<&str> = state.spec.hard_keys.iter().map(String::as_str).collect();
        let plan = self.registry(&key.cluster).plan_with_classes(&hard_keys, None);
        let mut differing = Vec::new();
        for (evaluator, keys) in &plan.per_evaluator {
            if entry.demands().get(&evaluator.group_resource()).copied() != Some(Need::Typed) {
                continue;
            }
            let p = PartitionKey {
                cluster: key.cluster.clone(),
                resource: evaluator.group_resource(),
                namespace: entry.demand_namespace().clone(),
            };
            let reading = Reading {
                keys,
                scopes: &state.spec.scopes,
                now,
                gates: self.gates,
            };
            let pair = match evaluator {
                Evaluator::Pods => both_ways(&self.pods, &p, &reading),
                Evaluator::Services => both_ways(&self.services, &p, &reading),
                Evaluator::PersistentVolumeClaims => both_ways(&self.pvcs, &p, &reading),
                _ => None,
            };
            if let Some((tallied, summed)) = pair {
                differing.extend(
                    summed
                        .iter()
                        .filter(|(k, v)| tallied.get(*k) != Some(*v))
                        .map(|(k, v)| format!("{k}: tally {:?}, sum {v:?}", tallied.get(k))),
                );
            }
        }
        differing
    }
}

impl Engine {
    /// How many objects partition `p` holds, if it is current (listed, its watch not failing),
    /// in whichever store holds it.
    #[must_use]
    pub fn held_len(&self, p: &PartitionKey) -> Option<usize> {
        synced_len(&self.counts, p)
            .or_else(|| synced_len(&self.pods, p))
            .or_else(|| synced_len(&self.services, p))
            .or_else(|| synced_len(&self.pvcs, p))
            .or_else(|| synced_len(&self.claims, p))
    }

    /// The DeviceClasses of `cluster` as the resourceclaims evaluator maps them, if their
    /// (cluster-wide) watch is synced.
    fn device_class_map(&self, cluster: &ClusterName) -> Option<DeviceClassMap> {
        let p = PartitionKey {
            cluster: cluster.clone(),
            resource: device_classes(),
            namespace: Arc::from(ALL_NAMESPACES),
        };
        let partition = self.device_classes.partition(&p).filter(|x| x.is_current())?;
        let mut map = DeviceClassMap::new();
        for class in partition.objects().values() {
            map.apply(&class.name, class.extended_resource_name.as_deref());
        }
        Some(map)
    }

    /// The resourceclaims evaluator's `CalculateUsageStats` in `namespace`: `keys` (the ones it
    /// matches) start at 0, and each claim's usage is added to every key of `matched` (the
    /// quota's keys any evaluator matches) — upstream sums an evaluator's whole usage and
    /// masks it with `matched` only after adding the evaluators up, so a claim also charges a
    /// `requests.deviceclass.resource.kubernetes.io/<class>` key that only the pods evaluator
    /// matched. `None` while the claims (or, for an extended-resource claim, the pods) of the
    /// namespace are not synced.
    fn claims_usage(
        &self,
        quota: &QuotaKey,
        namespace: &Arc<str>,
        keys: &[String],
        matched: &[String],
        classes: &DeviceClassMap,
        now: Time,
    ) -> Option<ResourceList> {
        let gates = self.gates;
        let p = PartitionKey {
            cluster: quota.cluster.clone(),
            resource: GroupResource::new("resource.k8s.io", "resourceclaims"),
            namespace: namespace.clone(),
        };
        let claims = self.claims.partition(&p).filter(|x| x.is_current())?;
        let pods_key = PartitionKey {
            resource: GroupResource::core("pods"),
            ..p.clone()
        };
        let pods = self.pods.partition(&pods_key);
        let all = &**namespace == ALL_NAMESPACES;
        let mut used: ResourceList = keys
            .iter()
            .map(|k| (k.clone(), Quantity::zero(lazyquota_quota::Format::DecimalSI)))
            .collect();
        for claim in claims.objects().values() {
            let pod_usage = match claim.owner() {
                Some(owner) if gates.dra_extended_resource => match pods {
                    // The pods are not watched here: no key of this quota is charged by both
                    // a pod and its claim, so nothing is offset.
                    None => None,
                    Some(pods) if !pods.is_current() => return None,
                    Some(pods) => {
                        let pod = pods.objects().get(owner.pod_id(all));
                        let identity = pod.and_then(PodProjection::claim_identity);
                        verified_owner(claim, identity, claims.objects().values(), gates)
                            .then(|| pod.map(|pod| pod.usage(now)))
                            .flatten()
                    }
                },
                _ => None,
            };
            for (name, q) in claim_usage(claim, gates, classes, pod_usage.as_ref()) {
                if matched.contains(&name) {
                    *used.entry(name).or_default() += q;
                }
            }
        }
        Some(used)
    }
}

/// A computed quota.
#[derive(Debug)]
pub struct Computed {
    /// What to write.
    pub decision: StatusDecision,
    /// Resources whose evaluators could not compute (not synced): their keys kept their
    /// previous values.
    pub unsynced: Vec<GroupResource>,
    /// Scope-matching errors (upstream returns the partial sum; so does lazyquota).
    pub scope_errors: Vec<String>,
    /// Keys an evaluator claims (KCM would compute them) that were not computed this time —
    /// their evaluator's resource is not synced or not served, or the evaluator is not
    /// implemented: they keep their previous value, which is therefore not lazyquota's own.
    /// Keys no evaluator claims are not here: nobody computes them, upstream included.
    pub uncomputed: Vec<String>,
    /// Hard keys no evaluator claims (a typo, an extended resource no pod requests in that
    /// form): their stored value is copied as upstream copies it, but it is nobody's
    /// computation, so shadow mode calls them unknown, never agreeing.
    pub unclaimed: Vec<String>,
    /// Which evaluators compute which keys: the watches each key counts from.
    pub sources: KeySources,
}

impl Computed {
    /// Keys whose value is not lazyquota's own computation: an evaluator claims them but they
    /// were not computed this time, or no evaluator claims them. Shadow mode and `lazyquota
    /// usage` call them unknown, never agreeing.
    pub fn not_computed(&self) -> impl Iterator<Item = &String> {
        self.uncomputed.iter().chain(&self.unclaimed)
    }
}

/// The plan's evaluators and the keys each computes, moved out of the plan rather than
/// copied: only the catch-up rule reads it ([`KeySources::of`]).
#[derive(Debug, Default)]
pub struct KeySources(Vec<(Evaluator, Vec<String>)>);

impl KeySources {
    /// The resources of the evaluators that compute a key counting the same objects as `key`
    /// (`pods` for `count/pods`): the watches whose objects it counts. `None` when no evaluator
    /// computes such a key.
    pub fn of(&self, key: &str) -> Option<Vec<GroupResource>> {
        let resources: Vec<GroupResource> = self
            .0
            .iter()
            .filter(|(_, keys)| keys.iter().any(|k| crate::lowering::same_objects(k, key)))
            .map(|(evaluator, _)| evaluator.group_resource())
            .collect();
        (!resources.is_empty()).then_some(resources)
    }
}

fn synced_len<P: crate::store::Tallied>(store: &UsageStore<P>, p: &PartitionKey) -> Option<usize> {
    store
        .partition(p)
        .filter(|x| x.is_current())
        .map(|x| x.objects().len())
}

/// What one typed evaluator's usage is read with.
struct Reading<'a> {
    keys: &'a [String],
    scopes: &'a QuotaScopes,
    now: Time,
    gates: FeatureGates,
}

/// A projection whose partitions keep a [`UsageTally`] (pods, services, PVCs).
trait TalliedTyped: ScopeClassed + Tallied<Tally = UsageTally<<Self as ScopeClassed>::Class>> {}

impl<P: ScopeClassed + Tallied<Tally = UsageTally<<P as ScopeClassed>::Class>>> TalliedTyped for P {}

/// What a tally answers: `Err` on a scope error, `Ok(None)` for a sum beyond what a quantity
/// holds.
type TallyAnswer = Result<Option<ResourceList>, ScopeError>;

/// Partition `p` if current, and what its tally answers.
fn tallied<'s, P: TalliedTyped>(
    store: &'s UsageStore<P>,
    p: &PartitionKey,
    r: &Reading<'_>,
) -> Option<(&'s Partition<P>, TallyAnswer)> {
    let partition = store.partition(p).filter(|x| x.is_current())?;
    let answer = partition
        .tally()
        .usage(partition.objects(), r.keys, r.scopes, r.now, r.gates);
    Some((partition, answer))
}

/// A typed evaluator's usage in partition `p`, read from its tally; the objects summed one by
/// one (`calculate_usage`, upstream's way) where the tally cannot answer: a scope error, whose
/// partial sum upstream returns as success, or a sum beyond what a quantity holds.
fn typed_usage<P: TalliedTyped>(
    store: &UsageStore<P>,
    p: &PartitionKey,
    r: &Reading<'_>,
    scope_errors: &mut Vec<String>,
) -> Option<ResourceList> {
    let (partition, answer) = tallied(store, p, r)?;
    if let Ok(Some(used)) = answer {
        return Some(used);
    }
    let stats = calculate_usage(r.keys, r.scopes, partition.objects().values(), r.now, r.gates);
    if let Some(error) = stats.scope_error {
        // Upstream's CalculateUsageStats stops at the first object whose scope match fails
        // and returns the partial sum with a nil error; the same partial sum is used here.
        scope_errors.push(error.to_string());
    }
    Some(stats.used)
}

/// A partition's usage read from its tally and summed one by one; `None` if the partition is
/// not current, or the tally does not answer (a scope error: the sum is used then anyway).
fn both_ways<P: TalliedTyped>(
    store: &UsageStore<P>,
    p: &PartitionKey,
    r: &Reading<'_>,
) -> Option<(ResourceList, ResourceList)> {
    let (partition, Ok(Some(tallied))) = tallied(store, p, r)? else {
        return None;
    };
    let summed = calculate_usage(r.keys, r.scopes, partition.objects().values(), r.now, r.gates).used;
    Some((tallied, summed))
}
