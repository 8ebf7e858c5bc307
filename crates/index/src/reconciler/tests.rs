//! The reconciler's decisions one by one: what it writes and when, what a write's answer
//! leads to, shadow verdicts. Many seeds of everything at once: `crates/index/tests/sim`.

mod lowering;
mod reports;
mod restarts;
mod writes;

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
            // The tests of other rules lower at once; pacing has a test of its own.
            lower_pace: Duration::ZERO,
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
            discover.contains(&Effect::Discover {
                cluster: ClusterName::new("c"),
                groups: None
            }),
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
                skipped_groups: Vec::new(),
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
                skipped_groups: Vec::new(),
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

/// A write's answer when the quota moved past its precondition.
fn conflict() -> Failure {
    Failure {
        code: Some(409),
        message: "conflict".into(),
    }
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
