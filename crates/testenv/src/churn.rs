//! Tenants writing against `hard`: writers that create and delete ConfigMaps as fast as they
//! can, an exact count of the namespace's objects from a watch in resourceVersion order, and
//! the quota controllers' status writes read from the apiserver's audit log. Shared by
//! `tests/hard_churn.rs` and the fault benchmark (`benches/faults`).

use std::{
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{DeleteParams, ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams},
};

use crate::fixtures::SplitMix64;

/// What the writers of one namespace did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// Creates the apiserver accepted.
    pub creates: u64,
    /// Deletes the apiserver accepted.
    pub deletes: u64,
    /// Creates refused by quota admission ("exceeded quota").
    pub denials: u64,
    /// Creates refused because a quota's status does not hold a key of its `hard` yet
    /// ("status unknown"): its controller has not computed it.
    pub unknown: u64,
    /// Any other error the writers got (an apiserver that is down, a timeout).
    pub other_errors: u64,
}

/// The most objects a namespace held at once, from a watch in resourceVersion order.
#[derive(Debug, Default, Clone, Copy)]
pub struct Peak {
    /// The most objects at once.
    pub peak: u64,
    /// Times the watch could not be resumed where it ended (410 Gone) and the count started
    /// again from a list: a peak inside such a gap can be missed, so the peak is exact only
    /// when this is 0.
    pub gaps: u64,
}

/// Counts the objects of `api` (one namespace's ConfigMaps) from a list and then its watch,
/// every event in order, until `stop` is set. A watch that ends or fails is resumed at the last
/// resourceVersion seen (an apiserver restart loses nothing); one that cannot be resumed (410)
/// is counted as a gap and started again from a list.
pub async fn count_exactly(api: Api<ConfigMap>, stop: Arc<AtomicBool>) -> Peak {
    let mut peak = Peak::default();
    let mut count = 0;
    let mut rv: Option<String> = None;
    let mut failures = 0_u32;
    while !stop.load(Ordering::SeqCst) {
        let resume = if let Some(rv) = rv.clone() {
            rv
        } else if let Ok(list) = api.list_metadata(&ListParams::default()).await {
            count = list.items.len() as u64;
            peak.peak = peak.peak.max(count);
            list.metadata.resource_version.unwrap_or_default()
        } else {
            failures += 1;
            back_off(failures).await;
            continue;
        };
        rv = Some(resume.clone());
        let params = WatchParams::default().timeout(5);
        let Ok(events) = api.watch_metadata(&params, &resume).await else {
            failures += 1;
            back_off(failures).await;
            continue;
        };
        let mut events = events.boxed();
        loop {
            let event = match events.try_next().await {
                Ok(Some(event)) => event,
                Ok(None) => break,
                Err(_) => {
                    failures += 1;
                    back_off(failures).await;
                    break;
                }
            };
            failures = 0;
            let seen = match event {
                WatchEvent::Added(o) => {
                    count += 1;
                    peak.peak = peak.peak.max(count);
                    o.metadata.resource_version
                }
                WatchEvent::Deleted(o) => {
                    count = count.saturating_sub(1);
                    o.metadata.resource_version
                }
                WatchEvent::Modified(o) => o.metadata.resource_version,
                WatchEvent::Bookmark(b) => Some(b.metadata.resource_version),
                WatchEvent::Error(e) => {
                    if e.code == 410 {
                        peak.gaps += 1;
                        rv = None;
                    }
                    break;
                }
            };
            if let Some(seen) = seen {
                rv = Some(seen);
            }
        }
    }
    peak
}

/// A growing wait (doubling from 100 ms, up to 16 times that), so that a watch against an
/// apiserver that is down does not spin.
async fn back_off(failures: u32) {
    tokio::time::sleep(Duration::from_millis(100 << failures.min(4))).await;
}

/// One writer: until `deadline`, create (60 %) or delete one of the ConfigMaps it made (40 %),
/// as fast as the apiserver answers. After an error other than quota admission's refusal it
/// waits 50 ms, so a writer against an apiserver that is down does not spin.
///
/// # Panics
/// If `tally`'s lock is poisoned (another writer panicked).
pub async fn write(api: Api<ConfigMap>, seed: u64, deadline: Instant, tally: Arc<Mutex<Tally>>) {
    let mut rng = SplitMix64::new(seed);
    let mut mine: Vec<String> = Vec::new();
    // A bound on the loop besides the deadline.
    for _ in 0..200_000 {
        if Instant::now() >= deadline {
            break;
        }
        if rng.chance(40) && !mine.is_empty() {
            let index = usize::try_from(rng.below(mine.len() as u64)).expect("an index");
            let name = mine.swap_remove(index);
            let result = api.delete(&name, &DeleteParams::default()).await;
            let failed = result.is_err();
            {
                let mut t = tally.lock().expect("tally");
                if failed {
                    t.other_errors += 1;
                } else {
                    t.deletes += 1;
                }
            }
            if failed {
                // Not deleted, or deleted and the answer lost: the object may still exist and
                // is not this writer's to delete again (a 404 would be counted as an error).
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            continue;
        }
        let cm = ConfigMap {
            metadata: ObjectMeta {
                generate_name: Some("w-".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let result = api.create(&PostParams::default(), &cm).await;
        let pause = {
            let mut t = tally.lock().expect("tally");
            match result {
                Ok(created) => {
                    t.creates += 1;
                    mine.push(created.metadata.name.expect("a generated name"));
                    false
                }
                Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("exceeded quota") => {
                    t.denials += 1;
                    false
                }
                Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("status unknown") => {
                    t.unknown += 1;
                    true
                }
                Err(e) => {
                    t.other_errors += 1;
                    if std::env::var("LAZYQUOTA_CHURN_ERRORS").is_ok() {
                        eprintln!("create failed: {e}");
                    }
                    true
                }
            }
        };
        if pause {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// ResourceQuota status writes in an apiserver's audit log (tests/control-plane/start.sh logs
/// them), by anyone but the apiserver itself (quota admission's charges): (successful, refused
/// — 409s and others). `namespace`: only that namespace's quotas.
///
/// # Panics
/// If the log cannot be read or holds a line that is not JSON.
pub fn status_writes(audit_log: &Path, namespace: Option<&str>) -> (u64, u64) {
    let (mut ok, mut refused) = (0, 0);
    for entry in audit_entries(audit_log) {
        if entry["stage"] != "ResponseComplete"
            || entry["objectRef"]["resource"] != "resourcequotas"
            || entry["objectRef"]["subresource"] != "status"
            || !matches!(entry["verb"].as_str(), Some("update" | "patch"))
            || entry["user"]["username"] == "system:apiserver"
            || namespace.is_some_and(|ns| entry["objectRef"]["namespace"] != ns)
        {
            continue;
        }
        if entry["responseStatus"]["code"].as_u64().is_some_and(|c| c < 300) {
            ok += 1;
        } else {
            refused += 1;
        }
    }
    (ok, refused)
}

/// The entries of an apiserver's audit log, in order (a watch has one when its response
/// starts and one when it completes).
///
/// # Panics
/// If the log cannot be read or holds a line that is not JSON.
pub fn audit_entries(audit_log: &Path) -> Vec<serde_json::Value> {
    let text =
        std::fs::read_to_string(audit_log).unwrap_or_else(|e| panic!("reading {}: {e}", audit_log.display()));
    text.lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("an audit entry"))
        .collect()
}
