//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it:
//!
//! - A candidate takes the Lease when it does not exist, is released (no holder), or its
//!   record has not changed for `lease_duration` **as observed locally** — remote timestamps
//!   are never compared with the local clock, so clock skew between nodes does not matter.
//! - The leader renews every `retry_period`; if it cannot renew for `renew_deadline`, it has
//!   lost the lease and must stop writing at once (the binary exits).
//! - On shutdown the leader releases the Lease (clears the holder), so a standby takes over
//!   at its next retry instead of after the lease duration.
//!
//! Every write is guarded by the Lease's resourceVersion, so two candidates never both win.
//! [`decide`] is the pure core; [`LeaseLock`] is the IO around it.
//!
//! kube-lease-manager (the one lease crate on kube 5) was considered; it compares the remote
//! renewTime with the local clock, which is what client-go avoids, so this module is ours.

use std::time::{Duration, Instant};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tracing::{info, warn};

/// What the candidate last saw of the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The holder, if any.
    pub holder: Option<String>,
    /// The record's resourceVersion (changes on every renewal).
    pub resource_version: String,
    /// When this candidate first saw this exact record.
    pub since: Instant,
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Create the Lease with us as holder.
    Create,
    /// Write us as holder over the current record (expired or released).
    TakeOver,
    /// We hold it: renew.
    Renew,
    /// Someone else holds a live lease: wait.
    Wait,
}

/// The pure decision: given what was seen (`None`: no Lease exists), who we are, and now.
pub fn decide(observed: Option<&Observed>, identity: &str, lease_duration: Duration, now: Instant) -> Action {
    match observed {
        None => Action::Create,
        Some(o) => match o.holder.as_deref() {
            Some(h) if h == identity => Action::Renew,
            None | Some("") => Action::TakeOver,
            Some(_) if now.duration_since(o.since) >= lease_duration => Action::TakeOver,
            Some(_) => Action::Wait,
        },
    }
}

/// Lease timing, as KCM's `--leader-elect-*` flags.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// How long a record must stay unchanged before a standby takes over.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up leadership.
    pub renew_deadline: Duration,
    /// How often candidates retry and leaders renew.
    pub retry_period: Duration,
}

/// The leadership has been lost; the holder must stop writing.
#[derive(Debug, thiserror::Error)]
#[error("lost the leader lease {namespace}/{name}: could not renew it for {deadline:?}")]
pub struct Lost {
    namespace: String,
    name: String,
    deadline: Duration,
}

/// A Lease-based lock.
pub struct LeaseLock {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    timing: Timing,
    observed: Option<Observed>,
    /// When the last write that made us holder was **sent**: the apiserver cannot have
    /// recorded it earlier, so the leader's renew deadline counts from here.
    held_since_sent: Option<Instant>,
}

impl LeaseLock {
    /// A lock on Lease `namespace/name` for candidate `identity`.
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str, timing: Timing) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            timing,
            observed: None,
            held_since_sent: None,
        }
    }

    /// Tries once; returns whether we hold the lease afterwards. `reachable` is set to
    /// whether the apiserver answered (a standby that can reach it is ready).
    async fn try_once(&mut self, reachable: &mut bool) -> bool {
        let sent = Instant::now();
        let current = match self.api.get_opt(&self.name).await {
            Ok(lease) => {
                *reachable = true;
                lease
            }
            Err(error) => {
                *reachable = false;
                warn!(%error, lease = %self.name, "reading the leader lease failed");
                return false;
            }
        };
        let now = Instant::now();
        self.observe(current.as_ref(), now);
        let action = decide(
            self.observed.as_ref(),
            &self.identity,
            self.timing.lease_duration,
            now,
        );
        let result = match action {
            Action::Wait => return false,
            Action::Create => {
                self.api
                    .create(&PostParams::default(), &self.record(None, 0))
                    .await
            }
            Action::TakeOver | Action::Renew => {
                let lease = current.expect("an observed lease exists");
                let spec = lease.spec.clone().unwrap_or_default();
                let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(action == Action::TakeOver);
                let mut record = self.record(lease.metadata.resource_version.clone(), transitions);
                if action == Action::Renew {
                    record.spec.as_mut().expect("set").acquire_time = spec.acquire_time;
                }
                self.api
                    .replace(&self.name, &PostParams::default(), &record)
                    .await
            }
        };
        match result {
            Ok(written) => {
                if action != Action::Renew {
                    info!(lease = %self.name, identity = %self.identity, "acquired the leader lease");
                }
                self.observe(Some(&written), Instant::now());
                self.held_since_sent = Some(sent);
                true
            }
            Err(error) => {
                // 409: someone else wrote first; they win this round.
                warn!(%error, lease = %self.name, ?action, "writing the leader lease failed");
                false
            }
        }
    }

    fn observe(&mut self, lease: Option<&Lease>, now: Instant) {
        let Some(lease) = lease else {
            self.observed = None;
            return;
        };
        let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
        let resource_version = lease.metadata.resource_version.clone().unwrap_or_default();
        let unchanged = self
            .observed
            .as_ref()
            .is_some_and(|o| o.resource_version == resource_version);
        if !unchanged {
            self.observed = Some(Observed {
                holder,
                resource_version,
                since: now,
            });
        }
    }

    fn record(&self, resource_version: Option<String>, transitions: i32) -> Lease {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                resource_version,
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(
                    i32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(i32::MAX),
                ),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(transitions),
                ..LeaseSpec::default()
            }),
        }
    }

    /// Waits until this candidate holds the lease. `standby_ready` is told whether the
    /// apiserver (and so the Lease) is reachable meanwhile.
    pub async fn acquire(&mut self, standby_ready: &tokio::sync::watch::Sender<bool>) {
        loop {
            let mut reachable = false;
            let held = self.try_once(&mut reachable).await;
            standby_ready.send_replace(reachable);
            if held {
                return;
            }
            tokio::time::sleep(self.timing.retry_period).await;
        }
    }

    /// Renews while leading; returns when the lease is lost (not renewed for the renew
    /// deadline, or taken by someone else).
    ///
    /// Each renewal attempt is cut off at the renew deadline, counted from when the last
    /// successful write was *sent* (client-go bounds a renewal the same way): a black-holed
    /// connection cannot keep a leader leading. A standby takes over only after seeing the
    /// record unchanged for the lease duration (longer than the renew deadline), so the
    /// leader has stopped by then.
    pub async fn hold(&mut self) -> Lost {
        let deadline = self.timing.renew_deadline;
        loop {
            tokio::time::sleep(self.timing.retry_period).await;
            let since = self.held_since_sent.unwrap_or_else(Instant::now);
            let left = deadline.saturating_sub(since.elapsed());
            let mut reachable = false;
            let renewed = tokio::time::timeout(left, self.try_once(&mut reachable))
                .await
                .unwrap_or_else(|_| {
                    warn!(lease = %self.name, ?deadline, "renewing the leader lease did not finish before the renew deadline");
                    false
                });
            if !renewed
                && (self
                    .observed
                    .as_ref()
                    .is_some_and(|o| o.holder.as_deref() != Some(self.identity.as_str()))
                    || self.held_since_sent.unwrap_or(since).elapsed() >= deadline)
            {
                return Lost {
                    namespace: self.namespace.clone(),
                    name: self.name.clone(),
                    deadline: self.timing.renew_deadline,
                };
            }
        }
    }

    /// Releases the lease (clears the holder) so a standby takes over at once.
    pub async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => info!(lease = %self.name, "released the leader lease"),
            Err(error) => warn!(%error, lease = %self.name, "releasing the leader lease failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(holder: Option<&str>, since: Instant) -> Observed {
        Observed {
            holder: holder.map(str::to_owned),
            resource_version: "1".into(),
            since,
        }
    }

    #[test]
    fn candidates_follow_client_go_rules() {
        let t0 = Instant::now();
        let d = Duration::from_secs(15);
        assert_eq!(decide(None, "me", d, t0), Action::Create);
        assert_eq!(decide(Some(&seen(Some("me"), t0)), "me", d, t0), Action::Renew);
        assert_eq!(
            decide(Some(&seen(None, t0)), "me", d, t0),
            Action::TakeOver,
            "released"
        );
        assert_eq!(
            decide(Some(&seen(Some(""), t0)), "me", d, t0),
            Action::TakeOver,
            "released"
        );
        assert_eq!(
            decide(
                Some(&seen(Some("other"), t0)),
                "me",
                d,
                t0 + Duration::from_secs(14)
            ),
            Action::Wait
        );
        assert_eq!(
            decide(Some(&seen(Some("other"), t0)), "me", d, t0 + d),
            Action::TakeOver,
            "unchanged for the lease duration, as observed locally"
        );
    }
}
