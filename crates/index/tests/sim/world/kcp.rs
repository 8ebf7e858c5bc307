//! kcp seeds: the reconciler serves a whole shard. Several logical clusters, each with its
//! namespaces and quotas; the wildcard LogicalCluster watch (workspaces initializing, made
//! inactive and ready again, deleted, relisted); APIBindings binding the Widget type into a
//! cluster (its discovery serves it from then on; in half the seeds `c1`'s at `v2`, so that a
//! version guessed from the other clusters is wrong there); shared wildcard watches of a type counted in
//! enough clusters, with the share lists of clusters joining one late, cut and gone like any
//! watch, and a joining buffer small enough to overflow.
//!
//! What kcp does that the model follows: a request to a logical cluster that is not ready
//! (`Inactive`, deleted) is answered 403; a workspace's deletion deletes its objects and quotas;
//! resourceVersions are one sequence across the shard's logical clusters.

use lazyquota_index::{reconciler::MAX_JOINS, sharing::low_mark};

use super::*;

/// Whether `seed` models a kcp shard: three seeds in ten, by the seed alone (the run's
/// generator draws nothing for it).
pub fn is_kcp_seed(seed: u64) -> bool {
    matches!(seed % 10, 1 | 3 | 7)
}

/// The shard as the model keeps it.
#[derive(Debug)]
pub struct Kcp {
    /// Every logical cluster ever on the shard.
    pub clusters: Vec<String>,
    /// The LogicalCluster phase of each that exists (`Initializing`, `Ready`, `Inactive`).
    pub phases: BTreeMap<String, &'static str>,
    /// Clusters whose APIBinding of widgets is bound.
    pub bound: BTreeSet<String>,
    /// A cluster whose binding serves widgets at `v2` (the others at `v1`), in some seeds: a
    /// guess from the others (`Resolver::guess`) is wrong there, and its watch restarts at
    /// the version its discovery finds.
    pub serves_v2: Option<String>,
    /// Sharing starts at this many logical clusters counting a type.
    pub threshold: usize,
    /// When the LogicalCluster watch delivered last (it delivers in order).
    last_at: u64,
    /// Share lists asked for and not served yet.
    lists: usize,
    deleted_one: bool,
}

impl Kcp {
    /// A shard of 3–5 logical clusters; `settings` become a shard's. In half the seeds (by
    /// the seed alone: the generator draws nothing for it) `c1` serves widgets at `v2`.
    pub fn new(seed: u64, rng: &mut Rng, settings: &mut Settings) -> Self {
        let count = rng.range(3, 5);
        let clusters: Vec<String> = (0..count).map(|i| format!("c{i}")).collect();
        let mut phases = BTreeMap::new();
        let mut bound = BTreeSet::new();
        for c in &clusters {
            let phase = if rng.percent(20) { "Initializing" } else { "Ready" };
            phases.insert(c.clone(), phase);
            if rng.percent(50) {
                bound.insert(c.clone());
            }
        }
        let threshold = usize::try_from(rng.range(1, 3)).unwrap();
        settings.cluster = ClusterName::new("*");
        settings.kcp = true;
        settings.shard = true;
        settings.shared_threshold = threshold;
        // A few events only, so that a cluster joining a busy shared watch overflows.
        settings.shared_buffer = usize::try_from(rng.range(1, 3)).unwrap();
        Self {
            clusters,
            phases,
            bound,
            serves_v2: (seed % 20 >= 10).then(|| "c1".to_owned()),
            threshold,
            last_at: 0,
            lists: 0,
            deleted_one: false,
        }
    }

    /// Every namespace of every logical cluster.
    pub fn places(&self) -> Vec<String> {
        self.clusters
            .iter()
            .flat_map(|c| NAMESPACES.iter().map(move |ns| place(c, ns)))
            .collect()
    }

    fn relisted(&self) -> Vec<ClusterEvent> {
        let mut events = vec![ClusterEvent::RelistStarted];
        events.extend(self.phases.iter().map(|(c, phase)| ClusterEvent::Relisted {
            cluster: Some(ClusterName::new(c)),
            phase: (*phase).to_owned(),
            path: Some(format!("root:{c}")),
        }));
        events.push(ClusterEvent::RelistDone);
        events
    }
}

fn applied(cluster: &str, phase: &str) -> ClusterEvent {
    ClusterEvent::Applied {
        cluster: Some(ClusterName::new(cluster)),
        phase: phase.to_owned(),
        path: Some(format!("root:{cluster}")),
    }
}

impl World {
    /// Whether kcp serves requests to `cluster` (it exists and is not `Inactive`). Off kcp:
    /// always.
    pub(super) fn serves(&self, cluster: &str) -> bool {
        self.kcp
            .as_ref()
            .is_none_or(|k| k.phases.get(cluster).is_some_and(|p| *p != "Inactive"))
    }

    /// Whether tenants work in `cluster` now (a `Ready` one).
    pub(super) fn open_to_tenants(&self, cluster: &str) -> bool {
        self.kcp
            .as_ref()
            .is_none_or(|k| k.phases.get(cluster) == Some(&"Ready"))
    }

    /// The places tenants work in now (every place off kcp).
    pub(super) fn open_places(&self) -> Vec<String> {
        self.places
            .iter()
            .filter(|p| self.open_to_tenants(split(p).0))
            .cloned()
            .collect()
    }

    /// Whether `cluster` serves widgets.
    pub(super) fn bound(&self, cluster: &str) -> bool {
        self.kcp.as_ref().is_some_and(|k| k.bound.contains(cluster))
    }

    /// Whether `place`'s logical cluster was deleted.
    pub(super) fn cluster_gone(&self, place: &str) -> bool {
        self.kcp
            .as_ref()
            .is_some_and(|k| !k.phases.contains_key(split(place).0))
    }

    /// The LogicalCluster watch's first list.
    pub(super) fn start_kcp(&mut self) {
        if let Some(k) = &self.kcp {
            let events = k.relisted();
            let line = format!("kcp shard: {:?}, bound {:?}", k.phases, k.bound);
            self.trace_line(|| line);
            for event in events {
                self.cluster_event(event);
            }
        }
    }

    /// Delivers an event of the LogicalCluster watch (in order, with its lag).
    fn cluster_event(&mut self, event: ClusterEvent) {
        let lag = self.lag();
        let Some(k) = &mut self.kcp else { return };
        let at = k.last_at.max(self.now + lag);
        k.last_at = at;
        self.at(at - self.now, Ev::Cluster(event));
    }

    /// An APIBinding of widgets into `cluster` is bound: its discovery serves them from now.
    fn bind(&mut self, cluster: &str) {
        let Some(k) = &mut self.kcp else { return };
        if k.bound.insert(cluster.to_owned()) {
            self.fired("binding");
            let lag = self.lag();
            let input = Input::ApiChanged(Some(ClusterName::new(cluster)));
            self.at(lag, Ev::Answer(self.epoch, input));
        }
    }

    fn set_phase(&mut self, cluster: &str, phase: &'static str) {
        let Some(k) = &mut self.kcp else { return };
        k.phases.insert(cluster.to_owned(), phase);
        self.cluster_event(applied(cluster, phase));
        if phase == "Inactive" {
            // kcp answers 403 to everything in it: its open watches fail.
            let ids: Vec<Wid> = self
                .watches
                .iter()
                .filter(|(id, w)| {
                    matches!(id, Wid::Own(_)) && w.live && w.cluster.as_deref() == Some(cluster)
                })
                .map(|(id, _)| id.clone())
                .collect();
            for id in ids {
                self.fail(&id, "forbidden", true);
            }
        }
    }

    /// A kcp fault: a workspace changes phase, an APIBinding binds, a workspace is deleted, the
    /// LogicalCluster watch relists, or a tenant creates a burst of objects.
    pub(super) fn kcp_fault(&mut self) {
        let Some(k) = &self.kcp else { return };
        let existing: Vec<(String, &'static str)> = k.phases.iter().map(|(c, p)| (c.clone(), *p)).collect();
        let unbound: Vec<String> = existing
            .iter()
            .map(|(c, _)| c.clone())
            .filter(|c| !k.bound.contains(c))
            .collect();
        let can_delete = !k.deleted_one && existing.len() >= 3;
        match self.rng.range(0, 11) {
            9 | 10 => {
                let open = self.open_places();
                if let Some(ns) = self.rng.pick(&open).cloned() {
                    self.burst(&ns);
                }
            }
            0..4 => {
                let Some((cluster, phase)) = self.rng.pick(&existing).cloned() else {
                    return;
                };
                let next = if phase == "Ready" {
                    self.fired("workspace_inactive");
                    "Inactive"
                } else {
                    self.fired("workspace_ready");
                    "Ready"
                };
                self.set_phase(&cluster, next);
            }
            4..7 => {
                if let Some(cluster) = self.rng.pick(&unbound).cloned() {
                    self.bind(&cluster);
                }
            }
            7 if can_delete => {
                let (cluster, _) = self.rng.pick(&existing).cloned().expect("three at least");
                self.delete_cluster(&cluster);
            }
            _ => {
                self.fired("cluster_relist");
                let events = self.kcp.as_ref().map(Kcp::relisted).unwrap_or_default();
                for event in events {
                    self.cluster_event(event);
                }
            }
        }
    }

    /// A tenant creates many objects of a shared type in one place at once (enough to fill a
    /// joining subscriber's buffer).
    pub(super) fn burst(&mut self, ns: &str) {
        if !self.main || !self.open_to_tenants(split(ns).0) {
            return;
        }
        self.fired("burst");
        let res = if self.bound(split(ns).0) && self.rng.percent(50) {
            Res::Widgets
        } else {
            Res::ConfigMaps
        };
        for _ in 0..self.rng.range(3, 8) {
            self.create(res, ns);
        }
    }

    /// A workspace is deleted: it terminates, its objects and quotas go, its LogicalCluster
    /// goes.
    fn delete_cluster(&mut self, cluster: &str) {
        self.fired("workspace_deleted");
        self.cluster_event(applied(cluster, "Terminating"));
        let Some(k) = &mut self.kcp else { return };
        k.phases.remove(cluster);
        k.deleted_one = true;
        let objects: Vec<(Res, String, String)> = self
            .server
            .objects
            .keys()
            .filter(|(_, p, _)| split(p).0 == cluster)
            .cloned()
            .collect();
        for (res, p, name) in objects {
            if let Some((rv, obj)) = self.server.delete(res, &p, &name) {
                self.object_changed(&obj, rv, true);
            }
        }
        let quotas: Vec<(String, String)> = self
            .server
            .quotas
            .keys()
            .filter(|(p, _)| split(p).0 == cluster)
            .cloned()
            .collect();
        for key in quotas {
            if let Some(q) = self.server.quotas.remove(&key) {
                self.server.bump();
                self.quota_changed(&key.0, &key.1, Some(q));
            }
        }
        self.cluster_event(ClusterEvent::Deleted(Some(ClusterName::new(cluster))));
    }

    /// Before quiescence every workspace is ready and every APIBinding bound, so that every
    /// quota can converge.
    pub(super) fn end_kcp_faults(&mut self) {
        let Some(k) = &self.kcp else { return };
        let waiting: Vec<String> = k
            .phases
            .iter()
            .filter(|(_, p)| **p != "Ready")
            .map(|(c, _)| c.clone())
            .collect();
        let unbound: Vec<String> = k
            .phases
            .keys()
            .filter(|c| !k.bound.contains(*c))
            .cloned()
            .collect();
        for cluster in waiting {
            self.set_phase(&cluster, "Ready");
        }
        for cluster in unbound {
            self.bind(&cluster);
        }
    }

    /// The reconciler asks for a share list: it runs after a while (while the shared watch
    /// goes on, so a joining subscriber buffers).
    pub(super) fn list_share(
        &mut self,
        key: SharedKey,
        generation: u64,
        cluster: ClusterName,
        namespace: Option<String>,
    ) {
        let Some(k) = &mut self.kcp else { return };
        k.lists += 1;
        let lists = k.lists;
        *self.report.fired.entry("share_list").or_default() += 1;
        if lists > MAX_JOINS {
            self.violation(format!(
                "bounds: {lists} share lists running at once, MAX_JOINS is {MAX_JOINS}"
            ));
        }
        // Most lists are quick; some take long enough for a busy cluster to overflow the
        // joining buffer.
        let delay = if self.rng.percent(30) {
            self.rng.range(100, 600)
        } else {
            self.rng.range(1, 60)
        };
        if self.rng.percent(40) {
            // A tenant busy in the cluster while it joins: its subscriber buffers.
            let ns = namespace.clone().unwrap_or_else(|| NAMESPACES[0].to_owned());
            let at = self.rng.range(0, delay);
            self.at(at, Ev::Burst(place(cluster.as_str(), &ns)));
        }
        self.at(
            delay,
            Ev::ServeShare {
                key,
                generation,
                cluster,
                namespace,
            },
        );
    }

    /// A share list is served: one cluster's (namespace's) objects of the type at the shard's
    /// resourceVersion now.
    pub(super) fn serve_share(
        &mut self,
        key: SharedKey,
        generation: u64,
        cluster: &ClusterName,
        namespace: Option<&str>,
    ) {
        if let Some(k) = &mut self.kcp {
            k.lists -= 1;
        }
        let res = Res::of(&key.resource.resource).expect("a shared type");
        let forbidden = self
            .forbidden_until
            .get(&res)
            .is_some_and(|until| *until > self.now);
        let result = if self.main && self.rng.percent(10) {
            self.fired("share_list_error");
            Err("list: 500".to_owned())
        } else if forbidden || !self.serves(cluster.as_str()) {
            Err("list: 403".to_owned())
        } else {
            let objects: Vec<ObjectEvent> = self
                .server
                .objects
                .values()
                .filter(|o| {
                    let (c, ns) = split(&o.namespace);
                    o.res == res && c == cluster.as_str() && namespace.is_none_or(|n| n == ns)
                })
                .map(|o| {
                    let (_, ns) = split(&o.namespace);
                    ObjectEvent {
                        namespace: ns.to_owned(),
                        name: o.name.clone(),
                        object: Projected::Meta,
                        revision: Some(o.rv),
                    }
                })
                .collect();
            Ok((Some(self.server.rv), objects))
        };
        let input = Input::ListedShare {
            key,
            generation,
            result,
        };
        self.trace_line(|| format!("share list {cluster} {namespace:?}: {}", describe_input(&input)));
        self.rec.handle(input, self.now());
    }

    /// The sharing threshold's lower mark, for the laziness check.
    pub(super) fn shared_low_mark(&self) -> usize {
        self.kcp.as_ref().map_or(1, |k| low_mark(k.threshold))
    }
}
