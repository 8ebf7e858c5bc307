//! The reconciler's effects carried out against the model: watches opened and closed, lists,
//! discoveries, status writes and reads, and on kcp the shared watches and share lists.

use super::*;

/// A watch opened more than this often within [`REOPENS_WINDOW`] ms is reopened without backoff:
/// restarts in close succession wait 0, 100, 200, 400, 800 ms (`reconciler/restarts.rs`), so
/// at most five fit in a second besides its first open.
const MAX_REOPENS: usize = 6;
const REOPENS_WINDOW: u64 = 1_000;

impl World {
    /// Carries out what the last step asked for.
    pub(super) fn carry_out(&mut self) {
        let effects = self.rec.take_effects();
        if effects.len() > 10_000 {
            self.violation(format!("bounds: {} effects from one step", effects.len()));
        }
        for effect in effects {
            self.trace_line(|| format!("  → {}", describe_effect(&effect)));
            match effect {
                Effect::OpenWatch { id, key, served } => {
                    self.note_wrong_guess(key.cluster.as_str(), &key.resource, &served.version);
                    let Some(res) = Res::of(&key.resource.resource) else {
                        self.violation(format!(
                            "laziness: a watch of {} nobody demands",
                            key.resource.resource
                        ));
                        continue;
                    };
                    let cluster = Some(key.cluster.to_string());
                    self.open(Wid::Own(id), res, cluster, key.namespace.clone(), key.need);
                }
                Effect::CloseWatch { id } => {
                    self.watches.remove(&Wid::Own(id));
                }
                Effect::Fill { key, namespace, .. } => {
                    let delay = self.rng.range(2, 40);
                    let input = Input::Filled {
                        key,
                        namespace,
                        listed: Ok(Vec::new()),
                    };
                    let epoch = self.epoch;
                    self.at(delay, Ev::ServeFill { input, epoch });
                }
                Effect::Discover { cluster, groups } => {
                    let result = if self.main && self.rng.percent(10) {
                        self.fired("discovery_error");
                        Err("discovery: 503".to_owned())
                    } else if !self.serves(cluster.as_str()) {
                        Err("discovery: 403".to_owned())
                    } else {
                        let mut types = vec![
                            served(Res::ConfigMaps),
                            served(Res::Pods),
                            served(Res::Services),
                            served(Res::Pvcs),
                        ];
                        if self
                            .kcp
                            .as_ref()
                            .is_some_and(|k| k.bound.contains(cluster.as_str()))
                        {
                            let mut widgets = served(Res::Widgets);
                            if self.kcp.as_ref().and_then(|k| k.serves_v2.as_deref())
                                == Some(cluster.as_str())
                            {
                                widgets.version = "v2".into();
                            }
                            types.push(widgets);
                        }
                        // A narrowed discovery (a workspace's first) leaves out the groups
                        // not asked for and says so.
                        let mut skipped_groups = Vec::new();
                        if let Some(groups) = &groups {
                            types.retain(|t| {
                                let group = &t.resource.group;
                                let asked = group.is_empty() || groups.contains(group);
                                if !asked {
                                    skipped_groups.push(group.clone());
                                }
                                asked
                            });
                        }
                        Ok(Discovered {
                            served: types,
                            failed_groups: Vec::new(),
                            skipped_groups,
                        })
                    };
                    let delay = self.rng.range(2, 50);
                    self.at(
                        delay,
                        Ev::Answer(self.epoch, Input::Discovered { cluster, result }),
                    );
                }
                Effect::WriteStatus(write) if self.shadow => {
                    self.violation(format!("shadow: lazyquota wrote the status of {}", write.key));
                }
                Effect::WriteStatus(write) => {
                    // The tallies the write was computed from agree with the objects summed
                    // one by one (`store::tally`).
                    let now = self.now().time;
                    let differing = self.rec.engine().tally_disagreements(&write.key, now);
                    if !differing.is_empty() {
                        self.violation(format!(
                            "tally: {} computed from a tally that differs from its objects: {differing:?}",
                            write.key
                        ));
                    }
                    let fault = if !self.main {
                        WriteFault::None
                    } else if self.rng.percent(6) {
                        WriteFault::ServerError
                    } else if self.rng.percent(3) {
                        let applied = self.rng.percent(50);
                        WriteFault::Hung { applied }
                    } else {
                        WriteFault::None
                    };
                    let delay = self.rng.range(1, 20);
                    let epoch = self.epoch;
                    self.at(delay, Ev::ServerWrite { write, fault, epoch });
                }
                Effect::ReadQuota(key) => {
                    let result = if self.serves(key.cluster.as_str()) {
                        self.server
                            .quotas
                            .get(&(place(key.cluster.as_str(), &key.namespace), key.name.to_string()))
                            .map(crate::model::Quota::to_k8s)
                            .ok_or(Failure {
                                code: Some(404),
                                message: "not found".into(),
                            })
                    } else {
                        Err(Failure {
                            code: Some(403),
                            message: "the logical cluster is not ready".into(),
                        })
                    };
                    let delay = self.rng.range(1, 20);
                    self.at(delay, Ev::Answer(self.epoch, Input::Read { key, result }));
                }
                Effect::ListForProof {
                    key,
                    served,
                    namespace,
                } => {
                    // A consistent list of a quiet type waits for the watch cache's next
                    // progress request from etcd: at once when idle, else within 100 ms.
                    let delay = self.rng.range(1, 120);
                    let resource = served.resource;
                    self.at(
                        delay,
                        Ev::ServeProofList {
                            key,
                            resource,
                            namespace,
                            epoch: self.epoch,
                        },
                    );
                }
                Effect::Metric(Metric::ShareOverflow(_)) => {
                    *self.report.fired.entry("share_overflow").or_default() += 1;
                }
                Effect::Event { .. } | Effect::Disengaged(_) | Effect::Metric(_) => {}
                Effect::OpenShared { .. } | Effect::CloseShared { .. } | Effect::ListShare { .. }
                    if self.kcp.is_none() =>
                {
                    self.violation(format!(
                        "a shared-watch effect from a one-cluster reconciler: {effect:?}"
                    ));
                }
                Effect::OpenShared { key, .. } => {
                    let Some(res) = Res::of(&key.resource.resource) else {
                        self.violation(format!("laziness: a shared watch of {key} nobody demands"));
                        continue;
                    };
                    if self
                        .watches
                        .keys()
                        .any(|w| matches!(w, Wid::Shared(k) if *k == key))
                    {
                        self.violation(format!("laziness: a second shared watch of {key}"));
                    }
                    self.open(Wid::Shared(key), res, None, None, Need::Count);
                }
                Effect::CloseShared { key } => {
                    self.watches.remove(&Wid::Shared(key));
                }
                Effect::ListShare {
                    key,
                    generation,
                    cluster,
                    namespace,
                    ..
                } => {
                    self.note_wrong_guess(cluster.as_str(), &key.resource, &key.version);
                    self.list_share(key, generation, cluster, namespace);
                }
            }
        }
    }

    /// Counts a read of widgets in the cluster that serves them at `v2` made at another
    /// version: on a guess from the other clusters, before its discovery said otherwise.
    fn note_wrong_guess(&mut self, cluster: &str, resource: &GroupResource, version: &str) {
        if self.kcp.as_ref().and_then(|k| k.serves_v2.as_deref()) == Some(cluster)
            && Res::of(&resource.resource) == Some(Res::Widgets)
            && version != "v2"
        {
            self.fired("wrong_guess");
        }
    }

    /// Opens the model side of a watch and serves its list soon.
    fn open(&mut self, id: Wid, res: Res, cluster: Option<String>, namespace: Option<String>, need: Need) {
        self.next_generation += 1;
        let generation = self.next_generation;
        let watch = Watch {
            generation,
            res,
            cluster,
            namespace,
            need,
            live: false,
            delivered_rv: 0,
            last_at: self.now,
        };
        self.watches.insert(id.clone(), watch);
        let now = self.now;
        let opened = self.opened.entry(id.clone()).or_default();
        opened.retain(|at| at + REOPENS_WINDOW > now);
        opened.push(now);
        if opened.len() > MAX_REOPENS {
            let n = opened.len();
            self.violation(format!(
                "bounds: watch {id:?} opened {n} times within {REOPENS_WINDOW} ms: its restarts do not back off"
            ));
        }
        let delay = self.rng.range(1, 30);
        self.at(delay, Ev::ServeList { id, generation });
    }
}
