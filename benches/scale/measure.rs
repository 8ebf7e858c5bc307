//! One measurement of one controller at one N: first sync, the steady state, and the latency
//! samples (a new quota, a delete), each timed from a watch or a poll of the quota.

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use futures::{StreamExt as _, TryStreamExt as _, stream};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams},
};
use lazyquota_quota::Quantity;

use crate::common::readings::{bytes_received, connections, cpu_seconds};
use crate::data::{Data, Quotas, crd_plural, create_core, quota_object};
use crate::plan::{Args, Controller, Sample};
use crate::process::start;

pub(crate) fn same(a: &str, b: &str) -> bool {
    match (Quantity::parse(a), Quantity::parse(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

pub(crate) async fn quota_matches(api: &Api<ResourceQuota>, name: &str, want: &[(String, String)]) -> bool {
    let Ok(q) = api.get(name).await else { return false };
    let used = q.status.and_then(|s| s.used).unwrap_or_default();
    want.iter()
        .all(|(k, v)| used.get(k).is_some_and(|u| same(&u.0, v)))
}

#[allow(clippy::too_many_arguments)] // one measurement's context
pub(crate) async fn measure(
    client: &Client,
    args: &Args,
    data: &Data,
    n: usize,
    controller: Controller,
    kubeconfig: &Path,
    facts: &BTreeMap<String, String>,
    state: &Path,
) -> Sample {
    let quotas = fresh_quotas(client, data, n).await;
    let apiserver_port = facts["LAZYQUOTA_APISERVER_URL"]
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let baseline_watches = apiserver_watch_count(client).await;
    let apiserver_pid: u32 = std::fs::read_to_string(state.join("kube-apiserver.pid"))
        .expect("kube-apiserver's pid file")
        .trim()
        .parse()
        .expect("a pid");
    let apiserver_cpu = cpu_seconds(apiserver_pid);
    let started = Instant::now();
    let process = start(controller, kubeconfig, state);
    wait_synced(client, data, &quotas, controller.name(), started).await;
    let first_sync = started.elapsed();
    let sync_cpu = cpu_seconds(process.child.id());
    let sync_apiserver_cpu = cpu_seconds(apiserver_pid) - apiserver_cpu;
    tokio::time::sleep(args.settle).await;

    let reading = process.reading().await;
    let mut sample = Sample {
        tasks: reading.tasks,
        heap_bytes: reading.heap_bytes,
        rss_bytes: reading.rss_bytes,
        anon_bytes: reading.anon_bytes,
        connections: connections(process.child.id(), &apiserver_port),
        apiserver_watches: apiserver_watch_count(client).await - baseline_watches,
        first_sync,
        sync_cpu,
        sync_apiserver_cpu,
        received_bytes: bytes_received(process.child.id(), &apiserver_port),
        ..Sample::default()
    };

    // Quota created on a type not constrained before → correct status.used.
    let first_new = data.constrained;
    if n >= first_new + args.new_quota_samples {
        for j in 0..args.new_quota_samples {
            let ns = &data.namespaces[j % data.namespaces.len()];
            let api: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
            let key = format!("count/{}.{}", crd_plural(first_new + j), data.group);
            let want = vec![(
                key.clone(),
                (data.objects_per_crd_per_ns + args.new_crd_objects).to_string(),
            )];
            let t = Instant::now();
            api.create(
                &PostParams::default(),
                &quota_object(&format!("new-{j}"), &[(key, "100000".into())]),
            )
            .await
            .expect("new quota");
            while !quota_matches(&api, &format!("new-{j}"), &want).await {
                assert!(t.elapsed() < Duration::from_mins(2), "new quota never computed");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            sample.new_quota.push(t.elapsed());
        }
    }

    // A second quota on a type already watched and quiet (the namespace's `compute` quota
    // keeps its pods), with keys computed from the pods' specs, not a count of them: requests.cpu;
    // requests.memory and limits.memory; requests.cpu under the NotTerminating scope. Timed from
    // a watch of the quota, create request to the event with its status. Each after a pause
    // (`--second-quota-gap-ms`), as a tenant's quota comes alone.
    for (j, kind) in (0..args.new_quota_samples).flat_map(|j| SecondQuota::ALL.map(|k| (j, k))) {
        tokio::time::sleep(args.second_quota_gap).await;
        let ns = &data.namespaces[j % data.namespaces.len()];
        let api: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
        let name = format!("{}-{j}", kind.name());
        let (quota, want) = kind.quota(&name, data.pods_per_ns);
        let took = time_to_status(&api, &quota, &want).await;
        match kind {
            SecondQuota::Cpu => sample.typed_quota.push(took),
            SecondQuota::Memory => sample.memory_quota.push(took),
            SecondQuota::Scoped => sample.scoped_quota.push(took),
        }
        api.delete(&name, &DeleteParams::default())
            .await
            .expect("delete the second quota");
    }

    // Object deleted → status.used lowered.
    let mut deleted = Vec::new();
    for i in 0..args.deletes.min(data.pods_per_ns * data.namespaces.len()) {
        let ns = &data.namespaces[i % data.namespaces.len()];
        let pod = format!("p{}", i / data.namespaces.len());
        let quotas_api: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
        let before = data.pods_per_ns - deleted.iter().filter(|(n, _)| n == ns).count();
        let want = vec![("pods".to_owned(), (before - 1).to_string())];
        let t = Instant::now();
        Api::<Pod>::namespaced(client.clone(), ns)
            .delete(
                &pod,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                },
            )
            .await
            .expect("delete pod");
        while !quota_matches(&quotas_api, "compute", &want).await {
            assert!(t.elapsed() < Duration::from_mins(10), "delete never replenished");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        sample.delete.push(t.elapsed());
        deleted.push((ns.clone(), pod));
    }
    process.stop();
    // Put the data back for the next controller.
    for ns in &data.namespaces {
        let api: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
        let _ = api
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
    }
    stream::iter(deleted)
        .map(|(ns, pod)| {
            let client = client.clone();
            async move {
                let i: usize = pod[1..].parse().expect("pod index");
                create_core(&client, &ns, "pod", i).await;
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    sample
}

/// A second quota beside the namespace's `compute` quota, on its watched, quiet pods.
#[derive(Clone, Copy, Debug)]
enum SecondQuota {
    /// `requests.cpu`.
    Cpu,
    /// `requests.memory` and `limits.memory`.
    Memory,
    /// `requests.cpu` under the NotTerminating scope (every pod of the data matches it).
    Scoped,
}

impl SecondQuota {
    const ALL: [Self; 3] = [Self::Cpu, Self::Memory, Self::Scoped];

    fn name(self) -> &'static str {
        match self {
            Self::Cpu => "typed",
            Self::Memory => "memory",
            Self::Scoped => "scoped",
        }
    }

    /// The quota named `name` and the `used` it must get with `pods` pods of 10m CPU and
    /// 16Mi of memory (requests and limits) in its namespace.
    fn quota(self, name: &str, pods: usize) -> (ResourceQuota, Vec<(String, String)>) {
        let cpu = ("requests.cpu".to_owned(), format!("{}m", 10 * pods));
        let memory = |key: &str| (key.to_owned(), format!("{}Mi", 16 * pods));
        let (hard, want): (Vec<(String, String)>, _) = match self {
            Self::Cpu | Self::Scoped => (vec![("requests.cpu".into(), "1000".into())], vec![cpu]),
            Self::Memory => (
                vec![
                    ("requests.memory".into(), "1Ti".into()),
                    ("limits.memory".into(), "1Ti".into()),
                ],
                vec![memory("requests.memory"), memory("limits.memory")],
            ),
        };
        let mut quota = quota_object(name, &hard);
        if let (Self::Scoped, Some(spec)) = (self, quota.spec.as_mut()) {
            spec.scopes = Some(vec!["NotTerminating".into()]);
        }
        (quota, want)
    }
}

/// Creates `quota` and waits, on a watch of it opened before, for the event whose status has
/// `want` in `used`: the time from the create request to that event (at most 2 minutes).
async fn time_to_status(
    api: &Api<ResourceQuota>,
    quota: &ResourceQuota,
    want: &[(String, String)],
) -> Duration {
    let name = quota.metadata.name.clone().expect("a name");
    let version = api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .expect("list quotas")
        .metadata
        .resource_version
        .expect("a list version");
    let params = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(120);
    let mut events = api.watch(&params, &version).await.expect("watch quotas").boxed();
    let t = Instant::now();
    api.create(&PostParams::default(), quota)
        .await
        .expect("second quota");
    while let Some(event) = events.try_next().await.expect("quota watch") {
        if let WatchEvent::Added(q) | WatchEvent::Modified(q) = event {
            let used = q.status.and_then(|s| s.used).unwrap_or_default();
            if want
                .iter()
                .all(|(k, v)| used.get(k).is_some_and(|u| same(&u.0, v)))
            {
                return t.elapsed();
            }
        }
        assert!(t.elapsed() < Duration::from_mins(2), "{name} never computed");
    }
    panic!("the watch of {name} ended before its status came");
}

/// The quotas of every namespace at `n` CRDs, deleted and created again with an empty status, so
/// the next controller's first sync is measured.
pub(crate) async fn fresh_quotas(client: &Client, data: &Data, n: usize) -> Quotas {
    let quotas = data.quotas(n);
    for ns in &data.namespaces {
        let api: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
        let _ = api
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
        while !api
            .list(&ListParams::default())
            .await
            .is_ok_and(|l| l.items.is_empty())
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (name, hard, _) in &quotas {
            api.create(&PostParams::default(), &quota_object(name, hard))
                .await
                .expect("create quota");
        }
    }
    quotas
}

/// Waits until every quota of every namespace says what the data implies (the first complete
/// sync of the controller started at `started`).
pub(crate) async fn wait_synced(client: &Client, data: &Data, quotas: &Quotas, who: &str, started: Instant) {
    loop {
        let mut all = true;
        'namespaces: for ns in &data.namespaces {
            let api: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
            for (name, _, want) in quotas {
                if !quota_matches(&api, name, want).await {
                    all = false;
                    break 'namespaces;
                }
            }
        }
        if all {
            return;
        }
        assert!(started.elapsed() < Duration::from_mins(10), "{who} never synced");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Open watches the apiserver counts (all clients).
pub(crate) async fn apiserver_watch_count(client: &Client) -> f64 {
    let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
    let text = client.request_text(request).await.expect("apiserver metrics");
    text.lines()
        .filter(|l| l.starts_with("apiserver_longrunning_requests{") && l.contains("verb=\"WATCH\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
