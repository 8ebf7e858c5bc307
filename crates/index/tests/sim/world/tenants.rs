//! Tenants creating, updating and deleting objects and editing quotas, and the faults.

use super::*;
use crate::model::{Scope, SvcType};

/// How far above what exists a tenant sets a key it adds to a quota: two objects' worth.
fn headroom(key: &str) -> i64 {
    match key {
        // Two PVCs of two Gi.
        "requests.storage" => 4 * GI * 1000,
        // Two objects, or two cores.
        _ => 2_000,
    }
}

impl World {
    // ---- tenants ----------------------------------------------------------------------------

    pub(super) fn tenant(&mut self) {
        if !self.main {
            return;
        }
        let open = self.open_places();
        if let Some(ns) = self.rng.pick(&open).cloned() {
            if self.wide {
                self.wide_tenant(&ns);
            } else {
                match (self.kcp.is_some(), self.rng.range(0, 99)) {
                    (false, 0..40) | (true, 0..30) => self.create(Res::ConfigMaps, &ns),
                    (false, 40..60) | (true, 30..45) => self.delete_one(Res::ConfigMaps, &ns),
                    (false, 60..75) | (true, 45..57) => self.create(Res::Pods, &ns),
                    (false, 75..87) | (true, 57..66) => self.delete_one(Res::Pods, &ns),
                    (true, 66..78) if self.bound(split(&ns).0) => self.create(Res::Widgets, &ns),
                    (true, 78..86) => self.delete_one(Res::Widgets, &ns),
                    (false, 87..92) | (true, 86..91) => self.edit_quota(&ns),
                    (false, 92..95) | (true, 91..95) => self.toggle_second_quota(&ns),
                    (_, 95..98) => self.label_quota(&ns),
                    _ => {}
                }
            }
        }
        let next = self.rng.range(5, 120);
        self.at(next, Ev::Tenant);
    }

    /// A wide seed's tenant: every type, and updates.
    fn wide_tenant(&mut self, ns: &str) {
        match self.rng.range(0, 99) {
            0..20 => self.create(Res::ConfigMaps, ns),
            20..28 => self.delete_one(Res::ConfigMaps, ns),
            28..40 => self.create(Res::Pods, ns),
            40..48 => self.delete_one(Res::Pods, ns),
            48..54 => self.create(Res::Services, ns),
            54..58 => self.delete_one(Res::Services, ns),
            58..63 => self.create(Res::Pvcs, ns),
            63..66 => self.delete_one(Res::Pvcs, ns),
            66..82 => self.update_one(ns),
            82..90 => self.edit_quota(ns),
            90..95 => self.toggle_second_quota(ns),
            95..97 => self.label_quota(ns),
            97..99 => self.roll_out_terminating_quota(ns),
            _ => {}
        }
    }

    /// A platform team rolls out a quota on running jobs: deadlines set on a few pods (no
    /// admission checks that), then a Terminating-scoped quota over them created at once —
    /// while the pods' watch may not have delivered the deadlines yet.
    fn roll_out_terminating_quota(&mut self, ns: &str) {
        self.fired("terminating_rollout");
        let pods: Vec<Obj> = self
            .server
            .objects
            .values()
            .filter(|o| o.namespace == ns && o.res == Res::Pods && !o.deadline && o.deleting_ms.is_none())
            .filter(|o| !self.server.pending(o.res, &o.namespace, &o.name))
            .take(2)
            .cloned()
            .collect();
        for old in pods {
            let mut new = old.clone();
            new.deadline = true;
            // Stored at once, before the quota: its watch event is on its way.
            if self.server.admit(&mut new, Some(&old), false).is_ok() {
                self.server.admitted(&new, Some(&old));
                if let Some(rv) = self.server.store(new.clone()) {
                    new.rv = rv;
                    self.object_changed(&new, rv, false);
                }
            }
        }
        let key = (ns.to_owned(), "q2".to_owned());
        if let Some(q) = self.server.quotas.remove(&key) {
            self.server.bump();
            self.quota_changed(ns, "q2", Some(q));
        }
        let scopes = vec![Scope::Terminating];
        let hard: BTreeMap<String, i64> = ["pods", "requests.cpu"]
            .into_iter()
            .map(|k| {
                (
                    k.to_owned(),
                    self.server.stored_under(ns, k, &scopes) + headroom(k) * 3 / 2,
                )
            })
            .collect();
        self.server.put_scoped_quota(ns, "q2", hard, scopes);
        self.trace_line(|| format!("quota {ns}/q2 rolled out over Terminating pods"));
        self.quota_changed(ns, "q2", None);
        self.kcm_soon(ns);
    }

    pub(super) fn create(&mut self, res: Res, ns: &str) {
        self.names += 1;
        let prefix = match res {
            Res::ConfigMaps => "cm",
            Res::Pods => "pod",
            Res::Services => "svc",
            Res::Pvcs => "pvc",
            Res::Widgets => "widget",
        };
        let mut obj = Obj::new(res, ns, format!("{prefix}-{}", self.names));
        match res {
            Res::Pods => {
                obj.cpu_m = 100 * self.rng.range(1, 4).cast_signed();
                obj.deadline = self.wide && self.rng.percent(30);
            }
            Res::Services => {
                obj.svc = *self
                    .rng
                    .pick(&[SvcType::ClusterIp, SvcType::NodePort, SvcType::LoadBalancer])
                    .unwrap();
            }
            Res::Pvcs => obj.storage_gi = self.rng.range(1, 3).cast_signed(),
            Res::ConfigMaps | Res::Widgets => {}
        }
        self.write(obj, None, true);
    }

    /// A write of `obj` — a create, or an update of `prev` — through quota admission (`checked`:
    /// one admission evaluates) and, if admitted, to storage a moment later; in wide seeds some
    /// are refused after their charge, and with slow storage some take seconds.
    #[allow(clippy::needless_pass_by_value)] // the write's payload, handed on to storage
    fn write(&mut self, mut obj: Obj, prev: Option<Obj>, checked: bool) {
        let what = if prev.is_some() { "update" } else { "create" };
        match self.server.admit(&mut obj, prev.as_ref(), checked) {
            Err(why) => {
                *self.report.fired.entry("denied").or_default() += 1;
                self.trace_line(|| format!("{what} {}/{} refused: {why}", obj.namespace, obj.name));
            }
            Ok(charged) => {
                self.trace_line(|| {
                    format!(
                        "{what} {}/{} admitted, charged {charged:?}",
                        obj.namespace, obj.name
                    )
                });
                for (qns, name) in charged {
                    self.quota_changed(&qns, &name, None);
                }
                self.server.admitted(&obj, prev.as_ref());
                if self.wide && self.rng.percent(4) {
                    let delay = self.rng.range(1, 40);
                    self.at(delay, Ev::Refused(obj));
                    return;
                }
                let delay = if self.slow_storage && self.rng.percent(25) {
                    self.fired("slow_storage");
                    self.rng.range(500, 5_000)
                } else {
                    self.rng.range(1, 40)
                };
                self.at(delay, Ev::Store(obj));
            }
        }
    }

    /// A wide seed's update of one object: a pod resized (charged for what it grows), given a
    /// deadline, finished or deleted with a grace period (none charged: upstream's pod
    /// evaluator handles creates and resizes only); a Service's type changed, a PVC expanded
    /// (both charged for what they grow).
    fn update_one(&mut self, ns: &str) {
        let candidates: Vec<Obj> = self
            .server
            .objects
            .values()
            .filter(|o| o.namespace == ns && matches!(o.res, Res::Pods | Res::Services | Res::Pvcs))
            .filter(|o| o.deleting_ms.is_none() && !self.server.pending(o.res, &o.namespace, &o.name))
            .cloned()
            .collect();
        let Some(old) = self.rng.pick(&candidates).cloned() else {
            return;
        };
        let mut new = old.clone();
        let checked = match old.res {
            Res::Pods => match self.rng.range(0, 3) {
                0 if !old.terminal => {
                    new.cpu_m = 100 * self.rng.range(1, 5).cast_signed();
                    self.fired("pod_resize");
                    true
                }
                1 if !old.deadline => {
                    new.deadline = true;
                    self.fired("pod_deadline");
                    false
                }
                2 if !old.terminal => {
                    new.terminal = true;
                    self.fired("pod_terminal");
                    false
                }
                _ => {
                    new.deleting_ms = Some(self.now);
                    self.fired("pod_grace");
                    let later = crate::model::GRACE_MS + self.rng.range(50, 500);
                    self.at(later, Ev::KubeletDelete(old.namespace.clone(), old.name.clone()));
                    false
                }
            },
            Res::Services => {
                new.svc = match old.svc {
                    SvcType::ClusterIp => SvcType::NodePort,
                    SvcType::NodePort => SvcType::LoadBalancer,
                    SvcType::LoadBalancer => SvcType::ClusterIp,
                };
                self.fired("service_type");
                true
            }
            _ => {
                new.storage_gi += self.rng.range(1, 2).cast_signed();
                self.fired("pvc_expand");
                true
            }
        };
        self.write(new, Some(old), checked);
    }

    pub(super) fn delete_one(&mut self, res: Res, ns: &str) {
        let names: Vec<String> = self
            .server
            .objects
            .values()
            .filter(|o| o.res == res && o.namespace == ns)
            .map(|o| o.name.clone())
            .collect();
        let Some(name) = self.rng.pick(&names).cloned() else {
            return;
        };
        if let Some((rv, obj)) = self.server.delete(res, ns, &name) {
            self.trace_line(|| format!("deleted {ns}/{name}"));
            self.object_changed(&obj, rv, true);
            self.kcm_soon(ns);
        }
    }

    /// A spec change: a key added or removed (the same value each time, so `hard` never
    /// drops below what admission let in).
    pub(super) fn edit_quota(&mut self, ns: &str) {
        let key = (ns.to_owned(), "q".to_owned());
        let Some(q) = self.server.quotas.get(&key) else {
            let hard = self.random_hard();
            self.server.put_quota(ns, "q", hard);
            self.trace_line(|| format!("quota {ns}/q created"));
            self.quota_changed(ns, "q", None);
            self.kcm_soon(ns);
            return;
        };
        let mut hard = q.hard.clone();
        let keys: &[&str] = if self.kcp.is_some() {
            &["pods", "requests.cpu", WIDGETS_KEY]
        } else if self.wide {
            &[
                "pods",
                "requests.cpu",
                "services.loadbalancers",
                "requests.storage",
                "count/pods",
            ]
        } else {
            &["pods", "requests.cpu"]
        };
        let k = *self.rng.pick(keys).unwrap();
        if hard.remove(k).is_none() {
            let now = self.server.stored(ns, "q", k);
            hard.insert(k.to_owned(), now.max(headroom(k) / 2) + headroom(k));
        }
        if hard.is_empty() {
            return;
        }
        self.trace_line(|| format!("quota {ns}/q now {hard:?}"));
        self.server.put_quota(ns, "q", hard);
        self.quota_changed(ns, "q", None);
        self.kcm_soon(ns);
    }

    /// A change of the quota's metadata only (a label, as `kubectl label` or a GitOps tool
    /// makes): a new resourceVersion, the same spec.
    pub(super) fn label_quota(&mut self, ns: &str) {
        let Some(hard) = self
            .server
            .quotas
            .get(&(ns.to_owned(), "q".to_owned()))
            .map(|q| q.hard.clone())
        else {
            return;
        };
        self.trace_line(|| format!("quota {ns}/q labelled"));
        self.server.put_quota(ns, "q", hard);
        self.quota_changed(ns, "q", None);
    }

    pub(super) fn toggle_second_quota(&mut self, ns: &str) {
        let key = (ns.to_owned(), "q2".to_owned());
        if let Some(q) = self.server.quotas.remove(&key) {
            self.server.bump();
            self.trace_line(|| format!("quota {ns}/q2 deleted"));
            self.quota_changed(ns, "q2", Some(q));
        } else {
            let first = self.server.quotas.get(&(ns.to_owned(), "q".to_owned()));
            let terminating_or_not = self.wide && self.rng.percent(50);
            let keys: Vec<String> = match first {
                _ if terminating_or_not => vec![
                    "pods".to_owned(),
                    "requests.cpu".to_owned(),
                    "count/pods".to_owned(),
                ],
                Some(q) if self.twins || self.wide => q.hard.keys().cloned().collect(),
                _ => vec!["count/configmaps".to_owned()],
            };
            let scopes = if terminating_or_not {
                vec![
                    *self
                        .rng
                        .pick(&[Scope::Terminating, Scope::NotTerminating])
                        .unwrap(),
                ]
            } else {
                Vec::new()
            };
            let hard: BTreeMap<String, i64> = keys
                .into_iter()
                .map(|k| {
                    let now = self.server.stored_under(ns, &k, &scopes);
                    let room = if self.wide { headroom(&k) * 3 / 2 } else { 3000 };
                    (k, now + room)
                })
                .collect();
            self.server.put_scoped_quota(ns, "q2", hard, scopes);
            self.trace_line(|| format!("quota {ns}/q2 created"));
            self.quota_changed(ns, "q2", None);
            self.kcm_soon(ns);
        }
    }

    // ---- faults -----------------------------------------------------------------------------

    pub(super) fn fault(&mut self) {
        if !self.main {
            return;
        }
        let live: Vec<Wid> = self
            .watches
            .iter()
            .filter(|(_, w)| w.live)
            .map(|(id, _)| id.clone())
            .collect();
        let kinds = if self.kcp.is_some() { 7 } else { 5 };
        match self.rng.range(0, kinds) {
            0 => {
                if let Some(id) = self.rng.pick(&live).cloned() {
                    let shared = matches!(id, Wid::Shared(_));
                    self.fired(if shared { "shared_cut" } else { "watch_cut" });
                    self.fail(&id, "cut", false);
                }
            }
            1 => {
                if let Some(id) = self.rng.pick(&live).cloned() {
                    let shared = matches!(id, Wid::Shared(_));
                    self.fired(if shared { "shared_gone" } else { "watch_gone" });
                    self.fail(&id, "gone", true);
                }
            }
            2 => {
                let types: &[Res] = if self.kcp.is_some() {
                    &[Res::ConfigMaps, Res::Pods, Res::Widgets]
                } else {
                    &[Res::ConfigMaps, Res::Pods]
                };
                let res = *self.rng.pick(types).unwrap();
                let until = self.now + self.rng.range(2_000, 12_000);
                let refuse = self.rng.percent(30);
                let ids: Vec<Wid> = live
                    .into_iter()
                    .filter(|id| self.watches[id].res == res)
                    .collect();
                if refuse {
                    // Lists of the type succeed but its watches cannot start: every watch of
                    // it that fails or opens meanwhile lists, then fails again.
                    self.fired("watch_refused");
                    self.watch_refused_until.insert(res, until);
                    for id in ids {
                        self.fail(&id, "cut", false);
                    }
                } else {
                    self.fired("forbidden");
                    self.forbidden_until.insert(res, until);
                    for id in ids {
                        self.fail(&id, "forbidden", true);
                    }
                }
            }
            3 => {
                self.fired("quota_relist");
                // A 410 on the quota watch: what was not delivered yet is replaced by a relist.
                self.quota_generation += 1;
                self.quota_gap = true;
                self.quota_last_at = self.now;
                let backoff = self.rng.range(50, 800);
                self.schedule_quota_relist(backoff);
            }
            4 => {
                self.fired("api_change");
                self.rec.handle(Input::ApiChanged(None), self.now());
            }
            6 | 7 => self.kcp_fault(),
            _ => {
                let watched: Vec<Wid> = self.watches.keys().cloned().collect();
                if let Some(id) = self.rng.pick(&watched).cloned() {
                    // A slow watch: its next items come late.
                    self.fired("slow_watch");
                    let w = self.watches.get_mut(&id).unwrap();
                    w.last_at = w.last_at.max(self.now) + 150;
                }
            }
        }
        let next = self.rng.range(150, 1200);
        self.at(next, Ev::Fault);
    }
}
