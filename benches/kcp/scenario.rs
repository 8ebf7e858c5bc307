//! The scenario's steps on a running shard: workspaces, exports, bindings, objects, quotas,
//! and the bounded waits that time them (settling, first sync, create → status).

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    time::{Duration, Instant},
};

use futures::{StreamExt as _, stream};
use serde_json::json;

use crate::common::stats::{median, spread};
use crate::plan::{
    Args, ENGAGED, HARD, KcpFigures, LATENCY_PATIENCE, LqFigures, NS, Plan, Reading, STANDING, WINDOW,
};
use crate::shard::{Lazyquota, Shard, call, create, quota_body, quota_path, used};

/// Waits `fixed` (`--settle`, or `--lq-settle` after lazyquota listed), then samples every `poll` until the last [`WINDOW`] samples of kcp's
/// goroutines are within max(5, 1%) of each other (and lazyquota's tasks within 2), or until
/// `--settle-max`; the reading is the median of each figure over that window.
pub(crate) async fn settle(
    shard: &mut Shard,
    mut lq: Option<&mut Lazyquota>,
    args: &Args,
    fixed: Duration,
) -> Reading {
    let start = Instant::now();
    shard.refresh().await;
    tokio::time::sleep(fixed).await;
    let mut window: VecDeque<(KcpFigures, Option<LqFigures>)> = VecDeque::new();
    loop {
        let kcp = shard.figures().await;
        let lqf = match lq.as_deref_mut() {
            Some(p) => {
                p.alive();
                Some(p.figures(shard).await)
            }
            None => None,
        };
        window.push_back((kcp, lqf));
        if window.len() > WINDOW {
            window.pop_front();
        }
        let goroutines = window.iter().map(|(k, _)| k.goroutines);
        let tasks = window.iter().filter_map(|(_, l)| l.map(|l| l.tasks));
        let stable = window.len() == WINDOW
            && spread(goroutines.clone()) <= (0.01 * median(goroutines.collect())).max(5.0)
            && (lq.is_none() || spread(tasks) <= 2.0);
        if stable || start.elapsed() >= args.settle_max {
            if !stable {
                eprintln!(
                    "kcp: not stable within {:?}: reading the medians of the last {} samples",
                    args.settle_max,
                    window.len()
                );
            }
            let k = |f: fn(&KcpFigures) -> f64| median(window.iter().map(|(k, _)| f(k)).collect());
            let l = |f: fn(&LqFigures) -> f64| {
                median(window.iter().filter_map(|(_, l)| l.as_ref().map(f)).collect())
            };
            return Reading {
                kcp: KcpFigures {
                    goroutines: k(|f| f.goroutines),
                    heap: k(|f| f.heap),
                    live: k(|f| f.live),
                    rss_metric: k(|f| f.rss_metric),
                    vmrss: k(|f| f.vmrss),
                    anon: k(|f| f.anon),
                    watches: k(|f| f.watches),
                },
                lq: lq.is_some().then(|| LqFigures {
                    tasks: l(|f| f.tasks),
                    heap: l(|f| f.heap),
                    vmrss: l(|f| f.vmrss),
                    anon: l(|f| f.anon),
                    connections: l(|f| f.connections),
                    watches: l(|f| f.watches),
                    engaged: l(|f| f.engaged),
                    shared: l(|f| f.shared),
                }),
                settled: start.elapsed(),
                stable,
            };
        }
        tokio::time::sleep(args.poll).await;
    }
}

/// Creates the workspaces `names` under root (as kcp-admin; on the shard when it is one of
/// several), each waited for until Ready and serving, `concurrency` at a time; returns name →
/// logical cluster.
pub(crate) async fn create_workspaces(
    shard: &Shard,
    names: &[String],
    concurrency: usize,
) -> BTreeMap<String, String> {
    stream::iter(names)
        .map(|name| async move {
            let path = "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces";
            let mut body = json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
                                  "metadata": {"name": name}});
            if let Some(shard) = &shard.name {
                body["spec"] = json!({"location": {"selector": {"matchLabels": {"name": shard}}}});
            }
            create(&shard.admin, path, &body, Duration::from_mins(1))
                .await
                .unwrap_or_else(|e| panic!("workspace {name}: {e}"));
            let deadline = Instant::now() + Duration::from_mins(3);
            let cluster = loop {
                if let Ok(ws) = call(&shard.admin, "GET", &format!("{path}/{name}"), None).await
                    && ws["status"]["phase"] == "Ready"
                    && let Some(c) = ws["spec"]["cluster"].as_str()
                {
                    break c.to_owned();
                }
                assert!(
                    Instant::now() < deadline,
                    "workspace root:{name} not Ready within 180 s"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            };
            // Served once its namespace can be made (every workspace gets one for the objects).
            create(
                &shard.admin,
                &format!("/clusters/root:{name}/api/v1/namespaces"),
                &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
                Duration::from_mins(1),
            )
            .await
            .unwrap_or_else(|e| panic!("workspace root:{name} not serving within 60 s: {e}"));
            (name.clone(), cluster)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

pub(crate) async fn create_exports(shard: &Shard, plan: &Plan, concurrency: usize) {
    stream::iter(0..plan.exports.len())
        .for_each_concurrent(concurrency, |e| async move {
            let ty = &plan.exports[e];
            let provider = plan.provider_of(e);
            let schema = format!("{}.{}.{}", ty.version, ty.plural, ty.group);
            let base = format!("/clusters/root:{provider}/apis/apis.kcp.io");
            create(
                &shard.admin,
                &format!("{base}/v1alpha1/apiresourceschemas"),
                &json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIResourceSchema",
                    "metadata": {"name": schema},
                    "spec": {"group": ty.group, "scope": "Namespaced",
                        "names": {"kind": ty.kind, "listKind": format!("{}List", ty.kind),
                                  "plural": ty.plural, "singular": ty.kind.to_ascii_lowercase()},
                        "versions": [{"name": ty.version, "served": true, "storage": true,
                            "schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}]}}),
                Duration::from_mins(1),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
            create(
                &shard.admin,
                &format!("{base}/v1alpha2/apiexports"),
                &json!({"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport",
                    "metadata": {"name": format!("e{e}")},
                    "spec": {"resources": [{"name": ty.plural, "group": ty.group, "schema": schema,
                                            "storage": {"crd": {}}}]}}),
                Duration::from_mins(1),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        })
        .await;
}

/// Binds the shard's consumers' bindings `from..to` (as kcp-admin), waits until every one is Bound (one
/// wildcard list per second), then creates `--objects` objects of each newly bound type.
pub(crate) async fn bind_step(
    shard: &Shard,
    plan: &Plan,
    clusters: &[String],
    (from, to): (usize, usize),
    args: &Args,
    timeline: &mut Vec<(String, Duration)>,
) {
    let t = Instant::now();
    let wanted: Vec<(usize, usize)> = (0..plan.consumers.len())
        .filter(|&i| shard.hosts(i))
        .flat_map(|i| (from..to).map(move |j| (i, j)))
        .collect();
    stream::iter(&wanted)
        .for_each_concurrent(args.concurrency, |&(i, j)| async move {
            let e = plan.export_of(i, j);
            create(
                &shard.admin,
                &format!(
                    "/clusters/root:{}/apis/apis.kcp.io/v1alpha2/apibindings",
                    plan.consumers[i]
                ),
                &json!({"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIBinding",
                        "metadata": {"name": format!("e{e}")},
                        "spec": {"reference": {"export": {"path": format!("root:{}", plan.provider_of(e)),
                                                          "name": format!("e{e}")}}}}),
                Duration::from_mins(1),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        })
        .await;
    let mut missing: BTreeSet<(String, String)> = wanted
        .iter()
        .map(|&(i, j)| (clusters[i].clone(), format!("e{}", plan.export_of(i, j))))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120 + wanted.len() as u64 / 5);
    while !missing.is_empty() {
        if let Ok(list) = call(
            &shard.root,
            "GET",
            "/clusters/*/apis/apis.kcp.io/v1alpha2/apibindings",
            None,
        )
        .await
        {
            for b in list["items"].as_array().into_iter().flatten() {
                if b["status"]["phase"] == "Bound"
                    && let (Some(c), Some(n)) = (
                        b["metadata"]["annotations"]["kcp.io/cluster"].as_str(),
                        b["metadata"]["name"].as_str(),
                    )
                {
                    missing.remove(&(c.to_owned(), n.to_owned()));
                }
            }
        }
        assert!(
            missing.is_empty() || Instant::now() < deadline,
            "{} of {} APIBindings not Bound in time, e.g. {:?}",
            missing.len(),
            wanted.len(),
            missing.iter().next()
        );
        if !missing.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    timeline.push((
        format!("{} APIBindings created and Bound", wanted.len()),
        t.elapsed(),
    ));
    let t = Instant::now();
    let objects: Vec<(usize, usize, usize)> = wanted
        .iter()
        .flat_map(|&(i, j)| (0..args.objects).map(move |o| (i, j, o)))
        .collect();
    stream::iter(&objects)
        .for_each_concurrent(args.concurrency, |&(i, j, o)| async move {
            let ty = &plan.exports[plan.export_of(i, j)];
            // Retried while the bound type is not served yet (a moment after Bound).
            create(
                &shard.admin,
                &format!(
                    "/clusters/root:{}/apis/{}/{}/namespaces/{NS}/{}",
                    plan.consumers[i], ty.group, ty.version, ty.plural
                ),
                &json!({"apiVersion": format!("{}/{}", ty.group, ty.version), "kind": ty.kind,
                        "metadata": {"name": format!("o{o}")}}),
                Duration::from_mins(1),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        })
        .await;
    timeline.push((format!("{} objects created", objects.len()), t.elapsed()));
}

/// Sets status.used of every standing quota to 0 (while nothing writes quota status), so
/// that the next controller's first sync is visible.
pub(crate) async fn reset_status(
    shard: &Shard,
    clusters: &[String],
    standing: &[(usize, String)],
    concurrency: usize,
) {
    stream::iter(standing)
        .for_each_concurrent(concurrency, |(i, key)| async move {
            let path = quota_path(&clusters[*i], STANDING);
            for _ in 0..20 {
                let mut q = call(&shard.root, "GET", &path, None)
                    .await
                    .unwrap_or_else(|e| panic!("GET {path}: {e}"));
                q["status"] = json!({"hard": {key: HARD}, "used": {key: "0"}});
                match call(&shard.root, "PUT", &format!("{path}/status"), Some(&q)).await {
                    Ok(_) => return,
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => panic!("PUT {path}/status: {e}"),
                }
            }
            panic!("PUT {path}/status: conflicts");
        })
        .await;
}

/// Waits until every quota `name` of `standing` says `objects` for its key (one wildcard list per 200 ms);
/// fails after `patience` naming a quota that did not.
pub(crate) async fn synced(
    shard: &Shard,
    clusters: &[String],
    (name, standing): (&str, &[(usize, String)]),
    objects: usize,
    patience: Duration,
    who: &str,
    mut lq: Option<&mut Lazyquota>,
) -> Duration {
    let t = Instant::now();
    loop {
        if let Some(p) = lq.as_deref_mut() {
            p.alive();
        }
        let quotas = shard.all_quotas().await;
        let wrong: Vec<String> = standing
            .iter()
            .filter(|(i, key)| {
                quotas
                    .get(&(clusters[*i].clone(), NS.to_owned(), name.to_owned()))
                    .and_then(|q| used(q, key))
                    != Some(objects as u64)
            })
            .map(|(i, key)| format!("root:c-{i:04} ({}) {key}", clusters[*i]))
            .collect();
        if wrong.is_empty() {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < patience,
            "{who}: {} of {} quotas never got status.used = {objects} within {patience:?}, e.g. {}",
            wrong.len(),
            standing.len(),
            wrong[0]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) async fn delete_quota(shard: &Shard, cluster: &str, name: &str) {
    let path = quota_path(cluster, name);
    call(&shard.root, "DELETE", &path, None)
        .await
        .unwrap_or_else(|e| panic!("DELETE {path}: {e}"));
}

pub(crate) async fn gone(shard: &Shard, cluster: &str, name: &str) {
    let path = quota_path(cluster, name);
    let t = Instant::now();
    while call(&shard.root, "GET", &path, None).await.is_ok() {
        assert!(t.elapsed() < LATENCY_PATIENCE, "{path} not deleted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until lazyquota's (engaged, watches) satisfy `done`; the time it took.
pub(crate) async fn lq_until(lq: &mut Lazyquota, what: &str, done: impl Fn(f64, f64) -> bool) -> Duration {
    let t = Instant::now();
    loop {
        lq.alive();
        if let Some((engaged, watches)) = lq.engagement().await
            && done(engaged, watches)
        {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < LATENCY_PATIENCE,
            "lazyquota: {what} not within {LATENCY_PATIENCE:?} (now {:?})",
            lq.engagement().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 0.5
}

/// Creates a quota [`ENGAGED`] on each (consumer, key), `concurrency` at a time.
pub(crate) async fn create_quotas(
    shard: &Shard,
    clusters: &[String],
    quotas: &[(usize, String)],
    concurrency: usize,
) {
    stream::iter(quotas)
        .for_each_concurrent(concurrency, |(i, key)| async move {
            let path = format!("/clusters/{}/api/v1/namespaces/{NS}/resourcequotas", clusters[*i]);
            create(
                &shard.root,
                &path,
                &quota_body(ENGAGED, key),
                Duration::from_mins(1),
            )
            .await
            .unwrap_or_else(|e| panic!("quota {ENGAGED} in root:c-{i:04}: {e}"));
        })
        .await;
}
