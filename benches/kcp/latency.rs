//! The latency samples: a quota created → its status.used written, timed from a watch on the
//! quota, in three cases that differ in what lazyquota already has (kcp's own controller is
//! sampled on the same targets), and for lazyquota the delete → disengaged → watch released.

use std::{
    collections::BTreeMap,
    pin::pin,
    time::{Duration, Instant},
};

use futures::StreamExt as _;
use kube::core::WatchEvent;
use serde_json::Value;

use crate::plan::{LATENCY_PATIENCE, NS, Plan, SAMPLE};
use crate::scenario::{close, delete_quota, gone, lq_until};
use crate::shard::{Lazyquota, Shard, call, quota_body, quota_path, used};

/// What lazyquota has when a sample's quota is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Case {
    /// A workspace without a quota, on a type no quota of the shard counts: lazyquota engages
    /// the workspace (discovery) and opens a watch of its own.
    Cold,
    /// A workspace without a quota, on a type served by a shared watch: lazyquota engages the
    /// workspace and joins the share (the workspace's objects listed once).
    Shared,
    /// A workspace whose standing quota counts the type already: nothing to open.
    Watched,
}

impl Case {
    pub(crate) const ALL: [Self; 3] = [Self::Cold, Self::Shared, Self::Watched];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Cold => "cold",
            Self::Shared => "warm, shared watch",
            Self::Watched => "watched, engaged workspace",
        }
    }
}

/// The (consumer, key) each case samples at step `s` among the consumers shard `on` hosts,
/// cycled to `n` samples per case; a case the data cannot give (no unwatched type bound, no
/// shared type) is left out.
pub(crate) fn targets(
    plan: &Plan,
    s: usize,
    (threshold, n): (usize, usize),
    on: &Shard,
) -> Vec<(Case, Vec<(usize, String)>)> {
    let standing: Vec<(usize, String)> = plan
        .standing(s)
        .into_iter()
        .filter(|(i, _)| on.hosts(*i))
        .collect();
    let mut per_key: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, key) in &standing {
        *per_key.entry(key.as_str()).or_default() += 1;
    }
    let quotaed: Vec<usize> = plan.quotaed.iter().map(|(i, _)| *i).collect();
    let free: Vec<usize> = (0..plan.consumers.len())
        .filter(|i| on.hosts(*i) && !quotaed.contains(i))
        .collect();
    let first = |want: &dyn Fn(&str) -> bool| -> Vec<(usize, String)> {
        free.iter()
            .filter_map(|&i| {
                (0..plan.steps[s])
                    .map(|j| plan.key(i, j))
                    .find(|k| want(k))
                    .map(|k| (i, k))
            })
            .collect()
    };
    let cold = first(&|k| !per_key.contains_key(k));
    let shared = first(&|k| per_key.get(k).is_some_and(|c| *c >= threshold));
    let cycle = |all: Vec<(usize, String)>| -> Vec<(usize, String)> {
        if all.is_empty() {
            return all;
        }
        // Spread over the candidates when there are more than n, cycled when fewer.
        let pick = |m: usize| {
            if all.len() >= n {
                m * all.len() / n
            } else {
                m % all.len()
            }
        };
        (0..n).map(|m| all[pick(m)].clone()).collect()
    };
    [
        (Case::Cold, cycle(cold)),
        (Case::Shared, cycle(shared)),
        (Case::Watched, cycle(standing)),
    ]
    .into_iter()
    .filter(|(_, t)| !t.is_empty())
    .collect()
}

/// Lists every type `targets` sample once (`limit=1`, in the first workspace that samples it),
/// so that the shard has served each since it started, as a shard in use has: kcp builds a
/// bound type's serving storage at the type's first request after a start, which kcp's
/// controller's informers make when the shard starts and a lazy controller would otherwise
/// meet inside its first sample of the type. Both configurations alike (`--touch-types`).
pub(crate) async fn touch_types(
    shard: &Shard,
    clusters: &[String],
    targets: &[(Case, Vec<(usize, String)>)],
) {
    let mut touched = std::collections::BTreeSet::new();
    for (i, key) in targets.iter().flat_map(|(_, list)| list) {
        let group = key
            .strip_prefix("count/widgets.")
            .unwrap_or_else(|| panic!("a sampled key names no widgets type: {key}"));
        if !touched.insert(group) {
            continue;
        }
        let path = format!("/clusters/{}/apis/{group}/v1/widgets?limit=1", clusters[*i]);
        call(&shard.root, "GET", &path, None)
            .await
            .unwrap_or_else(|e| panic!("listing {path}: {e}"));
    }
}

/// What the samples of one configuration measured, per case.
#[derive(Default)]
pub(crate) struct Samples {
    pub(crate) create: BTreeMap<Case, Vec<Duration>>,
    /// Of `create`, the create request itself (kcp's admission of the quota, before any
    /// controller can see it).
    pub(crate) post: BTreeMap<Case, Vec<Duration>>,
    /// lazyquota only: delete → its engaged-workspace count back where it was.
    pub(crate) disengage: BTreeMap<Case, Vec<Duration>>,
    /// lazyquota only: delete → its open watches back where they were.
    pub(crate) release: BTreeMap<Case, Vec<Duration>>,
    /// lazyquota only: samples during which lazyquota had more watches open than before.
    pub(crate) opened: BTreeMap<Case, usize>,
    /// Every sample in the order taken: its case, its workspace, create → status and the
    /// create request (`latency.tsv`, so a tail can be traced to its samples).
    pub(crate) each: Vec<(Case, String, Duration, Duration)>,
}

/// Every target's sample, one at a time, the cases interleaved (a drift of the shard over the
/// run touches every case alike). With `lq`, lazyquota's disengagement and watch release after
/// each delete are waited for and timed, so the next cold sample is cold again. A sample starts
/// no sooner than `type_gap` after the previous sample of its type ended: the shard's cache of a
/// type asks etcd for progress at most once per period, so a list of the type soon after the
/// previous one waits for the period to run out (`docs/kcp.md`).
pub(crate) async fn sample(
    shard: &Shard,
    clusters: &[String],
    targets: &[(Case, Vec<(usize, String)>)],
    objects: usize,
    type_gap: Duration,
    mut lq: Option<&mut Lazyquota>,
) -> Samples {
    let mut out = Samples::default();
    let mut last_of_type: BTreeMap<String, Instant> = BTreeMap::new();
    let rounds = targets.iter().map(|(_, t)| t.len()).max().unwrap_or(0);
    let who = if lq.is_some() { "lazyquota" } else { "kcp" };
    for round in 0..rounds {
        for (case, list) in targets {
            let Some((i, key)) = list.get(round) else { continue };
            if let Some(ended) = last_of_type.get(key) {
                tokio::time::sleep(type_gap.saturating_sub(ended.elapsed())).await;
            }
            let before = match lq.as_deref() {
                Some(lq) => Some(lq.engagement().await.expect("lazyquota metrics")),
                None => None,
            };
            let (took, post) = create_to_status(shard, &clusters[*i], key, objects, who).await;
            out.create.entry(*case).or_default().push(took);
            out.post.entry(*case).or_default().push(post);
            out.each.push((*case, clusters[*i].clone(), took, post));
            let t = Instant::now();
            delete_quota(shard, &clusters[*i], SAMPLE).await;
            if let (Some(lq), Some((engaged, watches))) = (lq.as_deref_mut(), before) {
                if lq.engagement().await.is_some_and(|(_, w)| w > watches) {
                    *out.opened.entry(*case).or_default() += 1;
                }
                lq_until(lq, "disengaging a workspace whose quota was deleted", |e, _| {
                    close(e, engaged)
                })
                .await;
                out.disengage.entry(*case).or_default().push(t.elapsed());
                lq_until(lq, "releasing the watch of a disengaged workspace", |_, w| {
                    w <= watches + 0.5
                })
                .await;
                out.release.entry(*case).or_default().push(t.elapsed());
            }
            gone(shard, &clusters[*i], SAMPLE).await;
            last_of_type.insert(key.clone(), Instant::now());
        }
    }
    out
}

/// One sample: quota [`SAMPLE`] created in `cluster` → a watch on it delivers the quota with
/// status.used `key` = `objects`. The watch is open before the create, so the time is when the
/// status arrived, not when a poll happened to look. Also how long the create request took.
pub(crate) async fn create_to_status(
    shard: &Shard,
    cluster: &str,
    key: &str,
    objects: usize,
    who: &str,
) -> (Duration, Duration) {
    let path = quota_path(cluster, SAMPLE);
    let list = format!("/clusters/{cluster}/api/v1/namespaces/{NS}/resourcequotas");
    let patience = LATENCY_PATIENCE.as_secs();
    let request = http::Request::get(format!(
        "{list}?watch=true&fieldSelector=metadata.name%3D{SAMPLE}&timeoutSeconds={patience}"
    ))
    .body(Vec::new())
    .expect("request");
    let events = shard
        .root
        .request_events::<Value>(request)
        .await
        .unwrap_or_else(|e| panic!("watching {path}: {e}"));
    let mut events = pin!(events);
    let t = Instant::now();
    call(&shard.root, "POST", &list, Some(&quota_body(SAMPLE, key)))
        .await
        .unwrap_or_else(|e| panic!("creating {path}: {e}"));
    let post = t.elapsed();
    let deadline = tokio::time::Instant::from_std(t + LATENCY_PATIENCE);
    loop {
        let event = tokio::time::timeout_at(deadline, events.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{who}: quota {path} never got status.used {key} = {objects} within {LATENCY_PATIENCE:?}"
                )
            });
        match event {
            Some(Ok(WatchEvent::Added(q) | WatchEvent::Modified(q)))
                if used(&q, key) == Some(objects as u64) =>
            {
                return (t.elapsed(), post);
            }
            Some(Ok(WatchEvent::Error(e))) => panic!("{who}: the watch on {path} failed: {e:?}"),
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("{who}: the watch on {path} failed: {e}"),
            None => panic!("{who}: the watch on {path} ended before status.used {key} = {objects}"),
        }
    }
}
