//! Tenants creating and deleting objects and editing quotas, and the faults.

use super::*;

impl World {
    // ---- tenants ----------------------------------------------------------------------------

    pub(super) fn tenant(&mut self) {
        if !self.main {
            return;
        }
        let open = self.open_places();
        if let Some(ns) = self.rng.pick(&open).cloned() {
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
        let next = self.rng.range(5, 120);
        self.at(next, Ev::Tenant);
    }

    pub(super) fn create(&mut self, res: Res, ns: &str) {
        self.names += 1;
        let prefix = match res {
            Res::ConfigMaps => "cm",
            Res::Pods => "pod",
            Res::Widgets => "widget",
        };
        let obj = Obj {
            res,
            namespace: ns.to_owned(),
            name: format!("{prefix}-{}", self.names),
            cpu_m: if res == Res::Pods {
                100 * self.rng.range(1, 4).cast_signed()
            } else {
                0
            },
            rv: 0,
            charged: Vec::new(),
            enforced: Vec::new(),
        };
        let mut obj = obj;
        match self.server.admit(&mut obj) {
            Err(why) => {
                *self.report.fired.entry("denied").or_default() += 1;
                self.trace_line(|| format!("create {ns}/{} refused: {why}", obj.name));
            }
            Ok(charged) => {
                self.trace_line(|| format!("create {ns}/{} admitted, charged {charged:?}", obj.name));
                for (qns, name) in charged {
                    self.quota_changed(&qns, &name, None);
                }
                let delay = self.rng.range(1, 40);
                self.at(delay, Ev::Store(obj));
            }
        }
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
        } else {
            &["pods", "requests.cpu"]
        };
        let k = *self.rng.pick(keys).unwrap();
        if hard.remove(k).is_none() {
            let now = self.server.stored(ns, k);
            hard.insert(k.to_owned(), now.max(1000) + 2000);
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
            let keys: Vec<String> = match first {
                Some(q) if self.twins => q.hard.keys().cloned().collect(),
                _ => vec!["count/configmaps".to_owned()],
            };
            let hard: BTreeMap<String, i64> = keys
                .into_iter()
                .map(|k| {
                    let now = self.server.stored(ns, &k);
                    (k, now + 3000)
                })
                .collect();
            self.server.put_quota(ns, "q2", hard);
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
