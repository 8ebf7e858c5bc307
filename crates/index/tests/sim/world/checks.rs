//! The checks at the end of a run: liveness and laziness.

use super::*;

impl World {
    // ---- final checks -----------------------------------------------------------------------

    pub(super) fn final_checks(&mut self) {
        // Liveness: every quota's used is the truth.
        let quotas: Vec<crate::model::Quota> = self.server.quotas.values().cloned().collect();
        for q in &quotas {
            for key in q.hard.keys() {
                let truth = self.server.stored(&q.namespace, key);
                let used = q.used.as_ref().and_then(|u| u.get(key)).and_then(|v| milli(v));
                if used != Some(truth) {
                    self.violation(format!(
                        "liveness: {}/{} {key} is {:?} milli, the truth {truth}, {} s after tenants and faults stopped",
                        q.namespace,
                        q.name,
                        used,
                        LIVENESS_MS / 1000
                    ));
                    return;
                }
            }
        }
        // Shadow mode: a quota agrees only if lazyquota computes every key, and, converged,
        // every quota lazyquota computes whole agrees.
        if self.shadow {
            for q in &quotas {
                let name = format!("{CLUSTER}|{}/{}", q.namespace, q.name);
                let verdict = self.rec.books().shadow_verdicts.get(&name).copied();
                let unclaimed = q.hard.contains_key(UNCLAIMED);
                if unclaimed && verdict == Some(true) {
                    self.violation(format!(
                        "shadow: {name} agrees, but no evaluator claims {UNCLAIMED}"
                    ));
                    return;
                }
                if !unclaimed && verdict != Some(true) {
                    self.violation(format!(
                        "shadow: {name} does not agree after convergence ({verdict:?})"
                    ));
                    return;
                }
            }
        }
        // Laziness: exactly the demanded types are watched, one watch per namespace or one
        // cluster-wide, none for a type no quota names.
        let mut demanded: BTreeMap<Res, BTreeSet<String>> = BTreeMap::new();
        for q in &quotas {
            for key in q.hard.keys() {
                let res = match key.as_str() {
                    "count/configmaps" => Res::ConfigMaps,
                    "pods" | "count/pods" | "requests.cpu" => Res::Pods,
                    _ => continue, // no evaluator claims it: nothing to watch
                };
                demanded.entry(res).or_default().insert(q.namespace.clone());
            }
        }
        let mut seen: BTreeSet<(Res, Option<String>, Need)> = BTreeSet::new();
        for w in self.watches.values() {
            if !seen.insert((w.res, w.namespace.clone(), w.need)) {
                self.violation(format!(
                    "laziness: two watches of {:?} in {:?}",
                    w.res, w.namespace
                ));
                return;
            }
            let Some(namespaces) = demanded.get(&w.res) else {
                self.violation(format!("laziness: {:?} watched, no quota names it", w.res));
                return;
            };
            if let Some(ns) = &w.namespace
                && !namespaces.contains(ns)
            {
                self.violation(format!(
                    "laziness: {:?} watched in {ns}, no quota there names it",
                    w.res
                ));
                return;
            }
        }
        for (res, namespaces) in &demanded {
            for ns in namespaces {
                let covered = self
                    .watches
                    .values()
                    .any(|w| w.res == *res && w.namespace.as_ref().is_none_or(|n| n == ns));
                if !covered {
                    self.violation(format!("laziness: {res:?} demanded in {ns}, not watched"));
                    return;
                }
            }
            if namespaces.len() <= self.threshold
                && self
                    .watches
                    .values()
                    .any(|w| w.res == *res && w.namespace.is_none())
            {
                // Cluster-wide below the threshold is allowed only on the way down (the
                // planner's lower mark); it is still one watch, checked above.
            }
        }
    }
}
