//! Events on ResourceQuotas (events.k8s.io/v1), routed to the quota's logical cluster.
//!
//! kube-runtime's `Recorder` writes through a client bound to one cluster; the shard's engine
//! has one client for every logical cluster ([`crate::transport::route`]), so it records Events itself,
//! with the same shape and the same series rule: the same Event (quota, type, reason, note)
//! again within 6 minutes patches the first one's `series` instead of creating another.
//!
//! Cost: the series cache holds at most [`MAX_SERIES`] entries (about 300 bytes each); at the
//! bound, entries older than 6 minutes go first, and if none is, the cache starts again (a
//! repeat then creates a new Event: more objects, nothing lost).

use std::{collections::HashMap, time::Duration};

use futures::{FutureExt as _, future::BoxFuture};
use k8s_openapi::{
    api::{
        core::v1::ObjectReference,
        events::v1::{Event, EventSeries},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use lazyquota_index::keys::{ClusterName, QuotaKey};

use crate::transport::route::{Route, Routed};

/// Series entries kept at most.
pub const MAX_SERIES: usize = 1024;

/// How long a repeat counts as the same Event's series.
const SERIES_TTL: Duration = Duration::from_mins(6);

/// What identifies a repeat: the quota, the type, the reason and the note.
type SeriesKey = (QuotaKey, bool, String, String);

/// A recorded Event: its name, how often it happened, and when first.
struct Recorded {
    name: String,
    count: i32,
    first: Timestamp,
}

/// Records Events for one controller.
pub struct Recorder {
    client: Client,
    /// `reportingController`.
    controller: String,
    /// `reportingInstance` (a pod name).
    instance: String,
    /// kcp: requests go to the quota's logical cluster.
    routed: bool,
    series: HashMap<SeriesKey, Recorded>,
}

impl Recorder {
    /// A recorder writing through `client`; with `routed`, into each quota's logical cluster
    /// of the shard `client` points at.
    #[must_use]
    pub fn new(client: Client, instance: String, routed: bool) -> Self {
        Self {
            client,
            controller: "lazyquota".into(),
            instance,
            routed,
            series: HashMap::new(),
        }
    }

    /// The request recording one Event on `quota` (`uid`: the quota's, when known). The series
    /// bookkeeping happens now; the returned future only sends.
    pub fn record(
        &mut self,
        quota: &QuotaKey,
        uid: Option<String>,
        warning: bool,
        reason: &str,
        note: String,
    ) -> BoxFuture<'static, kube::Result<()>> {
        let now = Timestamp::now();
        let route = if self.routed {
            Route::cluster(&quota.cluster)
        } else {
            Route::direct()
        };
        let api: Api<Routed<Event>> =
            Api::namespaced_with(self.client.clone(), &quota.namespace, &(route, ()));
        let key: SeriesKey = (quota.clone(), warning, reason.to_owned(), note.clone());
        let ttl = i64::try_from(SERIES_TTL.as_secs()).unwrap_or(i64::MAX);
        let fresh = |r: &Recorded| now.as_second() - r.first.as_second() < ttl;
        if let Some(seen) = self.series.get_mut(&key).filter(|r| fresh(r)) {
            seen.count = seen.count.saturating_add(1);
            let name = seen.name.clone();
            let patch = serde_json::json!({
                "series": EventSeries { count: seen.count, last_observed_time: MicroTime(now) },
            });
            return async move {
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(drop)
            }
            .boxed();
        }
        if self.series.len() >= MAX_SERIES {
            self.series.retain(|_, r| fresh(r));
            if self.series.len() >= MAX_SERIES {
                self.series.clear();
            }
        }
        let name = format!("{}.{:x}", quota.name, now.as_nanosecond());
        let event = Event {
            action: Some("Reconcile".into()),
            reason: Some(reason.to_owned()),
            event_time: Some(MicroTime(now)),
            regarding: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("ResourceQuota".into()),
                namespace: Some(quota.namespace.to_string()),
                name: Some(quota.name.to_string()),
                uid,
                ..ObjectReference::default()
            }),
            note: Some(note),
            metadata: ObjectMeta {
                namespace: Some(quota.namespace.to_string()),
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            ..Event::default()
        };
        self.series.insert(
            key,
            Recorded {
                name,
                count: 1,
                first: now,
            },
        );
        async move { api.create(&PostParams::default(), &Routed(event)).await.map(drop) }.boxed()
    }

    /// Forgets the series of `cluster`'s quotas (a logical cluster no longer served).
    pub fn forget_cluster(&mut self, cluster: &ClusterName) {
        self.series.retain(|(q, ..), _| &q.cluster != cluster);
    }
}

/// An Event's note, at most (events.k8s.io/v1 allows 1024 bytes).
const MAX_NOTE_BYTES: usize = 1000;

/// An Event's note: on kcp it starts with the workspace path, so an Event read on the shard
/// (or exported) says where it happened; cut to what events.k8s.io/v1 accepts (error texts
/// can be longer).
pub(super) fn event_note(workspace: Option<&str>, note: &str) -> String {
    match workspace {
        Some(path) => truncate(&format!("[workspace {path}] {note}"), MAX_NOTE_BYTES),
        None => truncate(note, MAX_NOTE_BYTES),
    }
}

/// `text` cut to at most `max` bytes at a character boundary, marked with an ellipsis.
fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::{MAX_NOTE_BYTES, event_note, truncate};

    #[test]
    fn kcp_event_notes_start_with_the_workspace_path_and_still_fit() {
        assert_eq!(event_note(None, "x"), "x");
        assert_eq!(
            event_note(Some("root:org:team"), "x"),
            "[workspace root:org:team] x"
        );
        let long = event_note(Some("root:org:team"), &"y".repeat(5000));
        assert!(long.starts_with("[workspace root:org:team] ") && long.len() <= MAX_NOTE_BYTES);
    }

    #[test]
    fn event_notes_fit_the_api_limit_on_a_char_boundary() {
        let long = "é".repeat(2000);
        let cut = truncate(&long, 1000);
        assert!(cut.len() <= 1000 && cut.ends_with('…'), "{}", cut.len());
        assert_eq!(truncate("short", 1000), "short");
    }
}
