//! PolicyIndex under arbitrary sequences of quota applies, deletes and relists (resets), in
//! two clusters: after every sequence the demand, the namespaces → quotas routing and the
//! recompute routing equal those of an index built from scratch from the final quotas, and
//! replaying the emitted demand changes onto nothing reproduces the demand (no watch started
//! twice or lost).
#![no_main]

use std::collections::BTreeMap;
use std::sync::Arc;

use lazyquota_index::{
    keys::{ClusterName, GroupResource, Need, QuotaKey},
    policy::{PolicyIndex, QuotaPolicy},
};
use lazyquota_quota::{
    FeatureGates,
    scope::{QuotaScopes, ScopeRequirement},
};
use libfuzzer_sys::fuzz_target;

const KEYS: &[&str] = &[
    "pods",
    "count/pods",
    "requests.storage",
    "count/widgets.example.io",
    "configmaps",
    "services.loadbalancers",
    "requests.cpu",
    "foo",
];
const SCOPES: &[&[&str]] = &[&[], &["BestEffort"], &["Terminating"], &["PriorityClass"]];
const CLUSTERS: &[&str] = &["a", "b"];
const RESOURCES: &[(&str, &str)] = &[
    ("", "pods"),
    ("", "configmaps"),
    ("", "services"),
    ("", "persistentvolumeclaims"),
    ("example.io", "widgets"),
];

type Demand = BTreeMap<(ClusterName, GroupResource, Arc<str>), Need>;

/// Reads bytes as quota operations; a short input is a short sequence.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> Option<usize> {
        let (first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(usize::from(*first))
    }

    fn quota(&mut self) -> Option<(QuotaKey, QuotaPolicy)> {
        let cluster = CLUSTERS[self.next()? % CLUSTERS.len()];
        let (ns, name) = (self.next()? % 3, self.next()? % 3);
        let spec: Vec<String> = (0..self.next()? % 4)
            .map(|_| self.next().map(|k| KEYS[k % KEYS.len()].to_owned()))
            .collect::<Option<_>>()?;
        // status.hard usually follows spec.hard, sometimes lags behind it (a quota edited
        // but not yet written).
        let lag = self.next()?;
        let status = if lag % 4 == 0 { spec.iter().skip(1).cloned().collect() } else { spec.clone() };
        let scopes = SCOPES[lag / 4 % SCOPES.len()];
        let policy = QuotaPolicy {
            spec_hard: spec,
            status_hard: status,
            scopes: QuotaScopes::from_requirements(scopes.iter().map(|s| ScopeRequirement::from_scope(s)).collect()),
            cluster_scoped: false,
        };
        Some((QuotaKey::new(&ClusterName::new(cluster), &format!("ns{ns}"), &format!("q{name}")), policy))
    }
}

fn demand(index: &PolicyIndex<()>) -> Demand {
    let mut all = Demand::new();
    for (cluster, resource) in index.demanded() {
        for (ns, need) in index.demand_of(cluster, resource) {
            all.insert((cluster.clone(), resource.clone(), ns), need);
        }
    }
    all
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = Bytes(data);
    let mut index = PolicyIndex::new(FeatureGates::default());
    let mut truth: BTreeMap<QuotaKey, QuotaPolicy> = BTreeMap::new();
    let mut replayed = Demand::new();
    while let Some(op) = bytes.next() {
        let changes = match op % 8 {
            0..=4 => {
                let Some((key, policy)) = bytes.quota() else { break };
                truth.insert(key.clone(), policy.clone());
                index.apply(key, &policy, ())
            }
            5 | 6 => {
                let Some((key, _)) = bytes.quota() else { break };
                truth.remove(&key);
                index.delete(&key)
            }
            _ => {
                // A relist of one cluster's quotas.
                let Some(c) = bytes.next() else { break };
                let cluster = ClusterName::new(CLUSTERS[c % CLUSTERS.len()]);
                let mut listed = Vec::new();
                for _ in 0..bytes.next().unwrap_or(0) % 5 {
                    let Some((key, policy)) = bytes.quota() else { break };
                    let key = QuotaKey::new(&cluster, &key.namespace, &key.name);
                    listed.push((key, policy, ()));
                }
                truth.retain(|k, _| k.cluster != cluster);
                for (key, policy, ()) in &listed {
                    truth.insert(key.clone(), policy.clone());
                }
                index.reset(&cluster, listed)
            }
        };
        for change in changes {
            let slot = (change.cluster.clone(), change.resource.clone(), change.namespace.clone());
            assert_eq!(replayed.get(&slot).copied(), change.from, "{change:?} does not start from the replayed state");
            match change.to {
                Some(need) => replayed.insert(slot, need),
                None => replayed.remove(&slot),
            };
        }
    }

    let mut fresh = PolicyIndex::new(FeatureGates::default());
    for (key, policy) in &truth {
        fresh.apply(key.clone(), policy, ());
    }
    let expected = demand(&fresh);
    assert_eq!(demand(&index), expected, "demand differs from a recomputation");
    assert_eq!(replayed, expected, "replayed changes differ from the demand");
    assert_eq!(index.len(), fresh.len());
    for cluster in CLUSTERS.iter().map(|c| ClusterName::new(c)) {
        for (group, plural) in RESOURCES {
            let resource = GroupResource::new(*group, *plural);
            let sorted = |mut v: Vec<QuotaKey>| {
                v.sort();
                v
            };
            assert_eq!(
                sorted(index.computing(&cluster, &resource)),
                sorted(fresh.computing(&cluster, &resource))
            );
            for ns in ["ns0", "ns1", "ns2"] {
                assert_eq!(
                    sorted(index.dirtied_by(&cluster, ns, &resource)),
                    sorted(fresh.dirtied_by(&cluster, ns, &resource))
                );
            }
        }
    }
});
