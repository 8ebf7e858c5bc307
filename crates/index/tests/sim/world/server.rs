//! The model apiserver's side of quotas: the quota watch, relists, and status writes with
//! their precondition — where the safety invariant is checked.

use super::*;

impl World {
    // ---- quotas -----------------------------------------------------------------------------

    pub(super) fn quota_changed(
        &mut self,
        namespace: &str,
        name: &str,
        deleted: Option<crate::model::Quota>,
    ) {
        if self.quota_gap {
            return;
        }
        let event = match deleted {
            Some(q) => QuotaEvent::Deleted(q.to_k8s()),
            None => {
                QuotaEvent::Applied(self.server.quotas[&(namespace.to_owned(), name.to_owned())].to_k8s())
            }
        };
        let lag = self.lag();
        let at = self.quota_last_at.max(self.now + lag);
        self.quota_last_at = at;
        let generation = self.quota_generation;
        self.at(at - self.now, Ev::Quota { generation, event });
    }

    pub(super) fn schedule_quota_relist(&mut self, delay: u64) {
        self.at(delay, Ev::QuotaRelist);
    }

    pub(super) fn quota_relist(&mut self) {
        self.quota_gap = false;
        if std::mem::take(&mut self.restarted) {
            // What the restarted reconciler first sees of each quota carries the charges in
            // flight now.
            self.server.restarted();
        }
        let mut events = vec![QuotaEvent::RelistStarted];
        events.extend(
            self.server
                .quotas
                .values()
                .map(|q| QuotaEvent::Relisted(q.to_k8s())),
        );
        events.push(QuotaEvent::RelistDone);
        self.quota_last_at = self.quota_last_at.max(self.now);
        for event in events {
            let at = self.quota_last_at + self.rng.range(0, 2);
            self.quota_last_at = at;
            let generation = self.quota_generation;
            self.at(at - self.now, Ev::Quota { generation, event });
        }
    }

    #[allow(clippy::needless_pass_by_value)] // an event's payload, consumed by the answer
    pub(super) fn server_write(&mut self, write: StatusWrite, fault: WriteFault, epoch: u64) {
        let key = write.key.clone();
        let answer = |w: &mut Self, delay: u64, result| {
            let input = Input::Written {
                key: key.clone(),
                precondition: write.precondition.clone(),
                result,
            };
            w.at(delay, Ev::Answer(epoch, input));
        };
        if fault == WriteFault::ServerError {
            self.fired("write_5xx");
            let delay = self.rng.range(1, 5);
            answer(
                self,
                delay,
                Err(Failure {
                    code: Some(500),
                    message: "etcd timeout".into(),
                }),
            );
            return;
        }
        if fault == (WriteFault::Hung { applied: false }) {
            self.fired("write_hung");
            answer(
                self,
                30_000,
                Err(Failure {
                    code: None,
                    message: "deadline".into(),
                }),
            );
            return;
        }
        if !self.serves(key.cluster.as_str()) {
            let delay = self.rng.range(1, 20);
            answer(
                self,
                delay,
                Err(Failure {
                    code: Some(403),
                    message: "the logical cluster is not ready".into(),
                }),
            );
            return;
        }
        let qkey = (place(key.cluster.as_str(), &key.namespace), key.name.to_string());
        let Some(q) = self.server.quotas.get(&qkey) else {
            self.fired("write_404");
            let delay = self.rng.range(1, 20);
            answer(
                self,
                delay,
                Err(Failure {
                    code: Some(404),
                    message: "not found".into(),
                }),
            );
            return;
        };
        if write.precondition.as_deref() != Some(q.rv.to_string().as_str()) {
            self.fired("write_409");
            let delay = self.rng.range(1, 20);
            answer(
                self,
                delay,
                Err(Failure {
                    code: Some(409),
                    message: "conflict".into(),
                }),
            );
            return;
        }
        // The request's body, as the executor sends it: a JSON merge patch of the status.
        let patch = write.patch();
        let (hard, used) = apply_merge_patch(q, &patch);
        let dropped: Vec<String> = q
            .status_hard
            .iter()
            .flat_map(|h| h.keys())
            .filter(|k| !hard.contains_key(*k))
            .cloned()
            .collect();
        let uid = q.uid.clone();
        // Every key of spec.hard in status.hard, no other (upstream copies spec.hard); no
        // `used` beside them: a key left behind in status.hard would go on being enforced.
        let spec_keys: Vec<&String> = q.hard.keys().collect();
        if hard.keys().collect::<Vec<_>>() != spec_keys || used.keys().any(|k| !hard.contains_key(k)) {
            self.violation(format!(
                "safety: {key} written with status.hard {:?} and used keys {:?}, spec.hard has {spec_keys:?}",
                hard.keys().collect::<Vec<_>>(),
                used.keys().collect::<Vec<_>>()
            ));
            return;
        }
        // Safety: no key written below the objects that exist (and those charged in flight).
        // One shortfall is the server's, not the writer's: objects admitted while the quota did
        // not enforce the key (before the quota existed, or before its status.hard had the key:
        // upstream admission neither charges nor refuses them). A raise may lack them until
        // the watches deliver them, and a value kept while a watch is not synced may lack them
        // even if a watch delivered them before it failed (lazyquota cannot know they still
        // exist, so it keeps what admission maintains); either holds every charged one. This
        // check does not see the watches' positions, so it excuses any such raise or kept
        // value. The other: such an object, come in after a charged write still in flight, may
        // pay for that charge in its place (`lazyquota_index::charges`), so any value may lack
        // as much as those objects count ([`crate::model::Server::standin_allowance`]).
        let mut shortfalls = 0;
        let mut standins = 0;
        for (k, v) in &used {
            let truth = self.server.truth_at(&qkey.0, &key.name, k, q.rv, false);
            let enforced = self.server.truth_at(&qkey.0, &key.name, k, q.rv, true);
            let allowance = self.server.standin_allowance(&qkey.0, &key.name, k);
            let stored = q.used.as_ref().and_then(|u| u.get(k)).cloned();
            let raises_or_keeps =
                |written: i64| stored.as_deref().and_then(milli).is_some_and(|s| written >= s);
            match milli(v) {
                Some(written) if written >= truth => {}
                Some(written) if written >= enforced && raises_or_keeps(written) => shortfalls += 1,
                Some(written) if written + allowance >= truth => standins += 1,
                Some(written) => {
                    self.violation(format!(
                        "safety: {key} written {k} = {v} ({written} milli) below the truth {truth} milli ({enforced} charged for it, {allowance} stand-ins; stored was {stored:?}, precondition {:?})",
                        write.precondition
                    ));
                    return;
                }
                None => {
                    self.violation(format!("safety: {k} written as {v:?}, not a quantity"));
                    return;
                }
            }
        }
        // Precision, counted (not a violation: a charge lazyquota cannot place — one a jump of
        // its view of quotas brought, one admission made on two quotas for one object, one
        // whose write storage refused — is added whole while its object may be counted, too
        // high by design until an object pays it or the create bound passes): a key raised
        // above what it stored and above every object that existed at some moment since the
        // quota was created (or is on its way). Keeping the stored value is not counted
        // (admission charged it), nor a write within the settling time after the view of
        // quotas there jumped.
        let jumped = self.relisted.max(self.jumped.get(&qkey.0).copied().unwrap_or(0));
        let after_jump = jumped > 0 && self.now < jumped + lazyquota_index::lowering::SETTLE_MS;
        let overcounts = used
            .iter()
            .filter(|_| !after_jump)
            .filter(|(k, v)| {
                let stored = q.used.as_ref().and_then(|u| u.get(*k)).and_then(|s| milli(s));
                let ever = self.server.ever_since(&qkey.0, k, &q.scopes, q.created);
                milli(v).is_some_and(|w| w > ever && stored.is_none_or(|s| w > s))
            })
            .count();
        for _ in 0..overcounts {
            self.fired("overcount");
        }
        for _ in 0..shortfalls {
            self.fired("unenforced_shortfall");
        }
        for _ in 0..standins {
            self.fired("uncharged_standin");
        }
        for k in dropped {
            self.server.key_dropped(&uid, &k);
        }
        let rv = self.server.bump();
        let q = self.server.quotas.get_mut(&qkey).expect("looked up");
        q.rv = rv;
        q.status_hard = Some(hard);
        q.used = Some(used);
        let written = q.to_k8s();
        self.quota_changed(&qkey.0, &qkey.1, None);
        if let WriteFault::Hung { applied: true } = fault {
            self.fired("write_hung");
            answer(
                self,
                30_000,
                Err(Failure {
                    code: None,
                    message: "deadline".into(),
                }),
            );
        } else if self.main && self.rng.percent(8) {
            // The response comes late (the client's connection is busy): events after the
            // write, admission's charges among them, arrive before it.
            self.fired("slow_response");
            let delay = self.rng.range(50, 400);
            answer(self, delay, Ok(written));
        } else {
            let delay = self.rng.range(1, 20);
            answer(self, delay, Ok(written));
        }
    }

    /// Shadow mode: the model's KCM recomputes the namespace's quotas a moment after a change.
    pub(super) fn kcm_soon(&mut self, ns: &str) {
        if self.shadow {
            let delay = self.rng.range(20, 200);
            self.at(delay, Ev::Kcm(ns.to_owned()));
        }
    }

    /// The model's KCM: every quota of `ns` written with the true usage (a key no evaluator
    /// claims keeps its value, or 0).
    pub(super) fn kcm(&mut self, ns: &str) {
        let keys: Vec<(String, String)> = self
            .server
            .quotas
            .keys()
            .filter(|(n, _)| n == ns)
            .cloned()
            .collect();
        for key in keys {
            let q = &self.server.quotas[&key];
            let mut used = BTreeMap::new();
            for k in q.hard.keys() {
                let value = if k == UNCLAIMED {
                    q.used
                        .as_ref()
                        .and_then(|u| u.get(k))
                        .cloned()
                        .unwrap_or_else(|| "0".into())
                } else {
                    crate::model::quantity_string(k, self.server.stored(ns, &key.1, k))
                };
                used.insert(k.clone(), value);
            }
            let hard: BTreeMap<String, String> = q
                .hard
                .iter()
                .map(|(k, v)| (k.clone(), crate::model::quantity_string(k, *v)))
                .collect();
            if q.used.as_ref() == Some(&used) && q.status_hard.as_ref() == Some(&hard) {
                continue;
            }
            let rv = self.server.bump();
            let q = self.server.quotas.get_mut(&key).expect("listed");
            q.rv = rv;
            q.used = Some(used);
            q.status_hard = Some(hard);
            self.trace_line(|| format!("kcm wrote {}/{}", key.0, key.1));
            self.quota_changed(&key.0, &key.1, None);
        }
    }

    /// A list proving a watch caught up runs: the objects of `resource` stored now in the
    /// quota's cluster (and `namespace`), at the server's resourceVersion now, with the newest
    /// one's resourceVersion; answered a moment later.
    pub(super) fn serve_proof_list(
        &mut self,
        key: QuotaKey,
        resource: GroupResource,
        namespace: Option<&str>,
    ) {
        let res = Res::of(&resource.resource);
        let forbidden = res.is_some_and(|r| {
            self.forbidden_until
                .get(&r)
                .is_some_and(|until| *until > self.now)
        });
        let result = if self.main && self.rng.percent(10) {
            self.fired("proof_list_error");
            Err("list: 500".to_owned())
        } else if forbidden || !self.serves(key.cluster.as_str()) {
            Err("list: 403".to_owned())
        } else {
            let listed: Vec<u64> = self
                .server
                .objects
                .values()
                .filter(|o| {
                    let (c, ns) = split(&o.namespace);
                    Some(o.res) == res && c == key.cluster.as_str() && namespace.is_none_or(|n| n == ns)
                })
                .map(|o| o.rv)
                .collect();
            self.fired("proof_list");
            Ok(Listed {
                revision: self.server.rv,
                objects: listed.len() as u64,
                newest: listed.iter().copied().max().unwrap_or(0),
            })
        };
        let delay = self.rng.range(1, 30);
        self.at(
            delay,
            Ev::Answer(
                self.epoch,
                Input::Listed {
                    key,
                    resource,
                    namespace: namespace.map(str::to_owned),
                    result,
                },
            ),
        );
    }
}

/// What a JSON merge patch of the status makes of the quota's `status.hard` and `status.used`:
/// a key set to a string is set, one set to `null` is removed, one absent is kept.
fn apply_merge_patch(
    q: &crate::model::Quota,
    patch: &serde_json::Value,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let merged = |before: Option<&BTreeMap<String, String>>, field: &str| {
        let mut out = before.cloned().unwrap_or_default();
        if let Some(entries) = patch["status"][field].as_object() {
            for (k, v) in entries {
                match v {
                    serde_json::Value::Null => {
                        out.remove(k);
                    }
                    serde_json::Value::String(s) => {
                        out.insert(k.clone(), s.clone());
                    }
                    other => panic!("status.{field}.{k} patched to {other}: not a quantity string"),
                }
            }
        }
        out
    };
    (
        merged(q.status_hard.as_ref(), "hard"),
        merged(q.used.as_ref(), "used"),
    )
}
