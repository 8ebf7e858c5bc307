//! The checks at the end of a run: liveness and laziness.

use super::*;

impl World {
    // ---- final checks -----------------------------------------------------------------------

    pub(super) fn final_checks(&mut self) {
        // Liveness: every quota's used is the truth.
        let quotas: Vec<crate::model::Quota> = self.server.quotas.values().cloned().collect();
        for q in &quotas {
            for key in q.hard.keys() {
                let truth = self.server.stored(&q.namespace, &q.name, key);
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
                let name = format!("{}/{}", q.namespace, q.name);
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
        self.laziness(&quotas);
    }

    /// Laziness: exactly the demanded types are watched, one watch per namespace or one per
    /// cluster, none for a type no quota names; on kcp, a type counted in enough logical
    /// clusters is served by one shared watch and by no watch of a cluster's own.
    fn laziness(&mut self, quotas: &[crate::model::Quota]) {
        // (cluster, type) → the namespaces whose quotas name it.
        let mut demanded: BTreeMap<(String, Res), BTreeSet<String>> = BTreeMap::new();
        for q in quotas {
            let (cluster, ns) = split(&q.namespace);
            for res in q.hard.keys().filter_map(|k| Res::of_key(k)) {
                demanded
                    .entry((cluster.to_owned(), res))
                    .or_default()
                    .insert(ns.to_owned());
            }
        }
        let running: Vec<(lazyquota_index::planner::WatchKey, u64, bool)> = self
            .rec
            .watches()
            .iter()
            .map(|(k, r)| (k.clone(), r.id, r.shared))
            .collect();
        let shared_open = |w: &Self, res: Res| {
            w.watches
                .iter()
                .any(|(id, m)| matches!(id, Wid::Shared(_)) && m.res == res)
        };
        let mut seen = BTreeSet::new();
        for (id, w) in &self.watches {
            match id {
                Wid::Own(id) => {
                    let cluster = w.cluster.clone().unwrap_or_default();
                    if !seen.insert((cluster.clone(), w.res, w.namespace.clone(), w.need)) {
                        return self.violation(format!(
                            "laziness: two watches of {:?} in {cluster} {:?}",
                            w.res, w.namespace
                        ));
                    }
                    let Some(namespaces) = demanded.get(&(cluster.clone(), w.res)) else {
                        return self.violation(format!(
                            "laziness: {:?} watched in {cluster}, no quota there names it",
                            w.res
                        ));
                    };
                    if let Some(ns) = &w.namespace
                        && !namespaces.contains(ns)
                    {
                        return self.violation(format!(
                            "laziness: {:?} watched in {cluster} {ns}, no quota there names it",
                            w.res
                        ));
                    }
                    if !running.iter().any(|(_, r, shared)| r == id && !shared) {
                        return self.violation(format!(
                            "laziness: watch {id} left open, the reconciler dropped it"
                        ));
                    }
                }
                Wid::Shared(key) => {
                    let clusters = demanded.keys().filter(|(_, r)| *r == w.res).count();
                    let low = self.shared_low_mark();
                    if clusters < low {
                        return self.violation(format!(
                            "laziness: shared watch {key} open, {clusters} logical cluster(s) count it (kept from {low})"
                        ));
                    }
                }
            }
        }
        for ((cluster, res), namespaces) in &demanded {
            for ns in namespaces {
                let covered = running.iter().any(|(k, id, shared)| {
                    k.cluster.as_str() == cluster
                        && Res::of(&k.resource.resource) == Some(*res)
                        && k.namespace.as_ref().is_none_or(|n| n == ns)
                        && if *shared {
                            shared_open(self, *res)
                        } else {
                            self.watches.contains_key(&Wid::Own(*id))
                        }
                });
                if !covered {
                    return self.violation(format!(
                        "laziness: {res:?} demanded in {cluster} {ns}, not watched"
                    ));
                }
            }
        }
        // On kcp, a type counted (metadata only) in at least the threshold's logical clusters
        // is the shared watch's alone.
        if let Some(threshold) = self.kcp.as_ref().map(|k| k.threshold) {
            for res in [Res::ConfigMaps, Res::Widgets] {
                let clusters = demanded.keys().filter(|(_, r)| *r == res).count();
                if clusters >= threshold && clusters > 0 {
                    let own = self
                        .watches
                        .iter()
                        .any(|(id, w)| matches!(id, Wid::Own(_)) && w.res == res);
                    if !shared_open(self, res) || own {
                        return self.violation(format!(
                            "laziness: {res:?} counted in {clusters} logical clusters (threshold {threshold}): shared {}, own watches {own}",
                            shared_open(self, res)
                        ));
                    }
                }
            }
        }
    }
}
