//! The model's watches: lists, items in order per watch at its own speed, cuts, resumes and
//! relists, and the lists filling a namespace.

use k8s_openapi::{
    api::core::v1::{
        Container, PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod, PodSpec, PodStatus,
        ResourceRequirements, Service, ServicePort, ServiceSpec, VolumeResourceRequirements,
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{ObjectMeta, Time},
    },
};
use lazyquota_quota::{PvcProjection, ServiceProjection};

use crate::model::SvcType;

use lazyquota_index::reconciler::{SharedEvent, SharedObject};

use super::*;

/// An object of the model as the apiserver sends it: its namespace alone; and its cluster.
fn unplaced(mut o: ObjectEvent) -> (String, ObjectEvent) {
    let (cluster, namespace) = split(&o.namespace);
    let (cluster, namespace) = (cluster.to_owned(), namespace.to_owned());
    o.namespace = namespace;
    (cluster, o)
}

/// An item of a cluster's own watch as the apiserver sends it.
pub fn as_served(item: Item) -> Item {
    let strip = |o| unplaced(o).1;
    match item {
        Item::InitApply(o) => Item::InitApply(strip(o)),
        Item::Apply(o) => Item::Apply(strip(o)),
        Item::Delete(o) => Item::Delete(strip(o)),
        other => other,
    }
}

/// An item of a shared wildcard watch as the executor reads it: each object with its logical
/// cluster (the `kcp.io/cluster` annotation).
pub fn as_shared(item: Item) -> SharedEvent {
    let annotated = |o| {
        let (cluster, object) = unplaced(o);
        SharedObject {
            cluster: Some(cluster),
            object,
        }
    };
    match item {
        Item::Init => SharedEvent::Init,
        Item::InitApply(o) => SharedEvent::InitApply(annotated(o)),
        Item::InitDone => SharedEvent::InitDone,
        Item::Apply(o) => SharedEvent::Apply(annotated(o)),
        Item::Delete(o) => SharedEvent::Delete(annotated(o)),
        Item::Failed(reason, message) => SharedEvent::Failed(reason, message),
    }
}

impl World {
    pub(super) fn serve_fill(&mut self, input: Input) {
        let Input::Filled { key, namespace, .. } = input else {
            unreachable!("only fills are served here")
        };
        let at = place(key.cluster.as_str(), &namespace);
        let listed = if self.main && self.rng.percent(10) {
            self.fired("fill_error");
            Err("list: 500".to_owned())
        } else if !self.serves(key.cluster.as_str()) {
            Err("list: 403".to_owned())
        } else {
            let res = Res::of(&key.resource.resource).expect("a watched resource");
            let objects: Vec<Obj> = self
                .server
                .objects
                .values()
                .filter(|o| o.res == res && o.namespace == at)
                .cloned()
                .collect();
            Ok(objects
                .iter()
                .map(|o| (o.name.clone(), self.project(o, key.need)))
                .collect())
        };
        let delay = self.rng.range(1, 10);
        self.at(
            delay,
            Ev::Answer(
                self.epoch,
                Input::Filled {
                    key,
                    namespace,
                    listed,
                },
            ),
        );
    }

    pub(super) fn project(&self, obj: &Obj, need: Need) -> Projected {
        if need == Need::Count {
            return Projected::Meta;
        }
        let metadata = ObjectMeta {
            name: Some(obj.name.clone()),
            namespace: Some(split(&obj.namespace).1.to_owned()),
            ..ObjectMeta::default()
        };
        match obj.res {
            Res::Pods => Projected::Pod(self.pod(obj, metadata)),
            Res::Services => {
                let type_ = match obj.svc {
                    SvcType::ClusterIp => "ClusterIP",
                    SvcType::NodePort => "NodePort",
                    SvcType::LoadBalancer => "LoadBalancer",
                };
                let service = Service {
                    metadata,
                    spec: Some(ServiceSpec {
                        type_: Some(type_.into()),
                        ports: Some(vec![ServicePort {
                            port: 80,
                            ..ServicePort::default()
                        }]),
                        ..ServiceSpec::default()
                    }),
                    status: None,
                };
                Projected::Service(ServiceProjection::from_service(&service))
            }
            Res::Pvcs => {
                let requests =
                    BTreeMap::from([("storage".to_owned(), Quantity(format!("{}Gi", obj.storage_gi)))]);
                let pvc = PersistentVolumeClaim {
                    metadata,
                    spec: Some(PersistentVolumeClaimSpec {
                        resources: Some(VolumeResourceRequirements {
                            requests: Some(requests),
                            ..VolumeResourceRequirements::default()
                        }),
                        ..PersistentVolumeClaimSpec::default()
                    }),
                    status: None,
                };
                Projected::Pvc(PvcProjection::from_pvc(&pvc, &self.interner).projection)
            }
            Res::ConfigMaps | Res::Widgets => Projected::Meta,
        }
    }

    /// A pod of the model as the apiserver serves it: its CPU request, its deadline, its phase
    /// and its deletion.
    fn pod(&self, obj: &Obj, mut metadata: ObjectMeta) -> PodProjection {
        let requests = BTreeMap::from([("cpu".to_owned(), Quantity(format!("{}m", obj.cpu_m)))]);
        if let Some(at) = obj.deleting_ms {
            metadata.deletion_timestamp = Some(Time(Self::wall(at)));
            metadata.deletion_grace_period_seconds = Some((crate::model::GRACE_MS / 1000).cast_signed());
        }
        let pod = Pod {
            metadata,
            spec: Some(PodSpec {
                active_deadline_seconds: obj.deadline.then_some(30),
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some(requests),
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(if obj.terminal { "Succeeded" } else { "Running" }.into()),
                ..PodStatus::default()
            }),
        };
        PodProjection::from_pod(&pod, FeatureGates::default(), &self.interner).projection
    }

    /// An object's event, naming its place (made what the apiserver sends on delivery).
    pub(super) fn event_of(&self, obj: &Obj, need: Need, revision: u64) -> ObjectEvent {
        ObjectEvent {
            namespace: obj.namespace.clone(),
            name: obj.name.clone(),
            object: self.project(obj, need),
            revision: Some(revision),
        }
    }

    // ---- watches ----------------------------------------------------------------------------

    pub(super) fn lag(&mut self) -> u64 {
        if self.wide && self.rng.percent(40) {
            // A watch behind by hundreds of milliseconds: the store lags the quotas for long
            // enough to matter, though within the settling time (what a list that fails or
            // goes unanswered falls back on).
            self.rng.range(200, 450)
        } else if self.rng.percent(10) {
            self.rng.range(30, 150)
        } else {
            self.rng.range(0, 30)
        }
    }

    pub(super) fn deliver(&mut self, id: &Wid, item: Item, lag: u64) {
        let now = self.now;
        let Some(w) = self.watches.get_mut(id) else {
            return;
        };
        let at = w.last_at.max(now + lag);
        w.last_at = at;
        let generation = w.generation;
        let id = id.clone();
        self.at(at - now, Ev::Item { id, generation, item });
    }

    /// Whether a list or watch of `w` is refused: its type is forbidden, or (kcp) its logical
    /// cluster is not ready (kcp answers 403 then).
    pub(super) fn forbidden(&self, w: &Watch) -> bool {
        self.forbidden_until
            .get(&w.res)
            .is_some_and(|until| *until > self.now)
            || w.cluster.as_ref().is_some_and(|c| !self.serves(c))
    }

    pub(super) fn serve_list(&mut self, id: &Wid, generation: u64) {
        let Some(w) = self.watches.get(id).filter(|w| w.generation == generation) else {
            return;
        };
        let need = w.need;
        if self.forbidden(w) {
            self.fail(id, "forbidden", true);
            return;
        }
        let objects: Vec<Obj> = self
            .server
            .objects
            .values()
            .filter(|o| w.sees(o))
            .cloned()
            .collect();
        self.deliver(id, Item::Init, 0);
        for obj in &objects {
            let event = self.event_of(obj, need, obj.rv);
            let gap = self.rng.range(0, 3);
            self.deliver(id, Item::InitApply(event), gap);
        }
        self.deliver(id, Item::InitDone, 0);
        let rv = self.server.rv;
        let refused = self.watch_refused(id);
        if let Some(w) = self.watches.get_mut(id) {
            w.live = true;
            w.delivered_rv = rv;
        }
        if refused {
            // Listed, but the watch from the list's resourceVersion is refused: kube's
            // watcher retries the watch (not the list) after its backoff.
            self.fail(id, "watch_start", false);
        }
    }

    /// Whether a watch of `id`'s type cannot start now (its list can).
    fn watch_refused(&self, id: &Wid) -> bool {
        self.watches.get(id).is_some_and(|w| {
            self.watch_refused_until
                .get(&w.res)
                .is_some_and(|until| *until > self.now)
        })
    }

    /// The watch fails; kube's watcher retries after a backoff, resuming (or relisting).
    pub(super) fn fail(&mut self, id: &Wid, reason: &'static str, relist: bool) {
        self.deliver(id, Item::Failed(reason, format!("model: {reason}")), 0);
        let Some(w) = self.watches.get_mut(id) else {
            return;
        };
        w.live = false;
        let generation = w.generation;
        let backoff = self.rng.range(100, 1500);
        let id = id.clone();
        self.at(
            backoff,
            Ev::Resume {
                id,
                generation,
                relist,
            },
        );
    }

    pub(super) fn resume(&mut self, id: &Wid, generation: u64, relist: bool) {
        let Some(w) = self.watches.get(id).filter(|w| w.generation == generation) else {
            return;
        };
        if self.forbidden(w) {
            self.fail(id, "forbidden", true);
            return;
        }
        if relist {
            self.serve_list(id, generation);
            return;
        }
        if self.watch_refused(id) {
            self.fail(id, "watch_start", false);
            return;
        }
        let from = w.delivered_rv;
        let need = w.need;
        let missed: Vec<(u64, Obj, bool)> = self
            .server
            .log
            .iter()
            .filter(|(rv, _)| *rv > from)
            .map(|(rv, crate::model::Change::Object { obj, deleted })| (*rv, obj.clone(), *deleted))
            .filter(|(_, obj, _)| w.sees(obj))
            .collect();
        for (rv, obj, deleted) in missed {
            let event = self.event_of(&obj, need, rv);
            let item = if deleted {
                Item::Delete(event)
            } else {
                Item::Apply(event)
            };
            let lag = self.lag();
            self.deliver(id, item, lag);
        }
        let rv = self.server.rv;
        if let Some(w) = self.watches.get_mut(id) {
            w.live = true;
            w.delivered_rv = rv;
        }
    }

    pub(super) fn object_changed(&mut self, obj: &Obj, rv: u64, deleted: bool) {
        let ids: Vec<Wid> = self
            .watches
            .iter()
            .filter(|(_, w)| w.live && w.sees(obj))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            let need = self.watches[&id].need;
            let event = self.event_of(obj, need, rv);
            let item = if deleted {
                Item::Delete(event)
            } else {
                Item::Apply(event)
            };
            let lag = self.lag();
            self.deliver(&id, item, lag);
            if let Some(w) = self.watches.get_mut(&id) {
                w.delivered_rv = rv;
            }
        }
    }
}
