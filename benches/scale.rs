//! The side-by-side scale benchmark: on one real control plane and the same data, one after
//! another, (1) KCM running only its resource quota controller, (2) lazyquota --mode eager,
//! (3) lazyquota --mode lazy — at several numbers N of namespaced CRDs (standing for kcp
//! APIBindings), of which only K are constrained by a quota.
//!
//! ```text
//! cargo bench --bench scale                      # the full run (N = 0,100,400; minutes)
//! cargo bench --bench scale -- --quick           # a bounded run, as CI does
//! cargo bench --bench scale -- --crds 0,50 --pods 500 --out /tmp/x
//! cargo bench --bench scale -- --controllers kcm,lazy --lazy-binary lto=/path/to/lazyquota
//!                                                  # another build, side by side (benches/profile.sh)
//! ```
//!
//! Writes `scale.md` (tables), `scale.dat` and, with gnuplot installed, `scale.png` into
//! `benches/results/` (or `--out`).

// A measurement harness: counts become f64 for reporting, and each measurement reads best
// as one sequence of steps.
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::type_complexity
)]

mod common;
use common::stats::{ms, percentile};

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use futures::{StreamExt as _, stream};
use k8s_openapi::{
    api::core::v1::{Namespace, PersistentVolumeClaim, Pod, ResourceQuota, Service, ServiceAccount},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::api::resource::Quantity as K8sQuantity,
};
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use lazyquota_quota::Quantity;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Controller {
    Kcm,
    Eager,
    /// Lazy mode with the default transport (HTTP/2).
    Lazy,
    /// Lazy mode over HTTP/1.1 (`--transport http1`: a connection per watch).
    LazyHttp1,
    /// Lazy mode with another build of the binary (`--lazy-binary LABEL=PATH`): a release
    /// profile variant, compared in the same run. Label and path leak once per flag.
    LazyBinary(&'static str, &'static str),
}

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Self::Kcm => "KCM (resourcequota only)",
            Self::Eager => "lazyquota --mode eager",
            Self::Lazy => "lazyquota --mode lazy",
            Self::LazyHttp1 => "lazyquota --mode lazy --transport http1",
            Self::LazyBinary(label, _) => label,
        }
    }
}

struct Args {
    crds: Vec<usize>,
    namespaces: usize,
    pods: usize,
    services: usize,
    pvcs: usize,
    objects_per_crd: usize,
    constrained: usize,
    new_quota_samples: usize,
    /// Extra objects of each CRD used for the new-quota samples, in that sample's namespace.
    new_crd_objects: usize,
    deletes: usize,
    settle: Duration,
    out: PathBuf,
    controllers: Vec<Controller>,
}

impl Args {
    fn parse() -> Self {
        let mut a = Self {
            crds: vec![0, 100, 400],
            namespaces: 10,
            pods: 2000,
            services: 500,
            pvcs: 500,
            objects_per_crd: 20,
            constrained: 5,
            new_quota_samples: 50,
            new_crd_objects: 0,
            deletes: 200,
            settle: Duration::from_secs(10),
            out: Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results"),
            controllers: vec![Controller::Kcm, Controller::Eager, Controller::Lazy],
        };
        let mut it = std::env::args().skip(1);
        let mut extra = Vec::new();
        while let Some(flag) = it.next() {
            let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
            let num = |v: String| v.parse::<usize>().unwrap_or_else(|_| panic!("not a number: {v}"));
            match flag.as_str() {
                "--quick" => {
                    // Two points: CI's bounded run checks that everything runs (room for
                    // kcp's e2e quota suite), the full run measures the slope.
                    a.crds = vec![0, 20];
                    a.pods = 200;
                    a.services = 50;
                    a.pvcs = 50;
                    a.objects_per_crd = 10;
                    a.new_quota_samples = 10;
                    a.deletes = 20;
                    a.settle = Duration::from_secs(2);
                    a.out = std::env::temp_dir().join("lazyquota-bench-quick");
                }
                "--crds" => a.crds = value().split(',').map(|v| num(v.to_owned())).collect(),
                "--pods" => a.pods = num(value()),
                "--services" => a.services = num(value()),
                "--pvcs" => a.pvcs = num(value()),
                "--objects-per-crd" => a.objects_per_crd = num(value()),
                "--new-quota-samples" => a.new_quota_samples = num(value()),
                "--new-crd-objects" => a.new_crd_objects = num(value()),
                "--deletes" => a.deletes = num(value()),
                "--settle" => a.settle = Duration::from_secs(num(value()) as u64),
                "--out" => a.out = PathBuf::from(value()),
                "--constrained" => a.constrained = num(value()),
                "--controllers" => {
                    a.controllers = value()
                        .split(',')
                        .map(|c| match c {
                            "kcm" => Controller::Kcm,
                            "eager" => Controller::Eager,
                            "lazy" => Controller::Lazy,
                            "lazy-h1" => Controller::LazyHttp1,
                            other => panic!("unknown controller {other} (kcm, eager, lazy, lazy-h1)"),
                        })
                        .collect();
                }
                "--lazy-binary" => {
                    let value = value();
                    let (label, path) = value
                        .split_once('=')
                        .unwrap_or_else(|| panic!("--lazy-binary LABEL=PATH, got {value}"));
                    assert!(Path::new(path).is_file(), "--lazy-binary: no binary at {path}");
                    let label = format!("lazyquota --mode lazy ({label})");
                    extra.push(Controller::LazyBinary(
                        Box::leak(label.into_boxed_str()),
                        Box::leak(path.to_owned().into_boxed_str()),
                    ));
                }
                "--bench" => {} // cargo bench passes this
                other => panic!("unknown flag {other}"),
            }
        }
        a.controllers.extend(extra);
        a.crds.sort_unstable();
        a
    }
}

/// One controller's figures at one N.
#[derive(Clone, Debug, Default)]
struct Sample {
    tasks: f64,
    heap_bytes: f64,
    rss_bytes: f64,
    anon_bytes: f64,
    connections: f64,
    apiserver_watches: f64,
    first_sync: Duration,
    new_quota: Vec<Duration>,
    delete: Vec<Duration>,
}

fn main() {
    let args = Args::parse();
    std::fs::create_dir_all(&args.out).expect("output directory");
    let (state, facts) = common::start_control_plane("bench");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let results = runtime.block_on(run(&args, &state, &facts));
    common::stop_control_plane(&state);
    write_results(&args, &results);
}

type Results = BTreeMap<(usize, &'static str), Sample>;

async fn run(args: &Args, state: &Path, facts: &BTreeMap<String, String>) -> Results {
    let kubeconfig = state.join("admin.kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig).expect("kubeconfig"),
        &KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    let client = Client::try_from(config).expect("client");
    let data = Data::create(&client, args).await;
    let mut results = Results::new();
    let mut crds_made = 0;
    for &n in &args.crds {
        let t = Instant::now();
        data.create_crds(&client, crds_made, n).await;
        data.grow_new_crds(&client, args, crds_made, n).await;
        crds_made = n;
        eprintln!(
            "scale: N={n}: {n} CRDs with {} objects each ready in {:?}",
            args.objects_per_crd,
            t.elapsed()
        );
        // The order alternates per N (reversed at every other N), so neither side always runs
        // first on a fresh apiserver cache or last on a warm one.
        let mut order = args.controllers.clone();
        if args.crds.iter().position(|&x| x == n).unwrap_or(0) % 2 == 1 {
            order.reverse();
        }
        eprintln!(
            "scale: N={n}: order {:?}",
            order.iter().map(|c| c.name()).collect::<Vec<_>>()
        );
        for controller in order {
            let sample = measure(&client, args, &data, n, controller, &kubeconfig, facts, state).await;
            eprintln!("scale: N={n} {}: {sample:?}", controller.name());
            results.insert((n, controller.name()), sample);
        }
    }
    results
}

/// The objects the benchmark creates, and what the quotas must then say.
struct Data {
    namespaces: Vec<String>,
    group: String,
    pods_per_ns: usize,
    services_per_ns: usize,
    pvcs_per_ns: usize,
    objects_per_crd_per_ns: usize,
    constrained: usize,
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..ObjectMeta::default()
    }
}

fn crd_plural(i: usize) -> String {
    format!("bindings{i}s")
}

impl Data {
    async fn create(client: &Client, args: &Args) -> Self {
        let t = Instant::now();
        let namespaces: Vec<String> = (0..args.namespaces).map(|i| format!("bench-{i}")).collect();
        for ns in &namespaces {
            let _ = Api::<Namespace>::all(client.clone())
                .create(
                    &PostParams::default(),
                    &Namespace {
                        metadata: meta(ns),
                        ..Namespace::default()
                    },
                )
                .await;
            let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
            while accounts.get_opt("default").await.ok().flatten().is_none() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let data = Self {
            group: "scale.lazyquota.test".into(),
            pods_per_ns: args.pods / args.namespaces,
            services_per_ns: args.services / args.namespaces,
            pvcs_per_ns: args.pvcs / args.namespaces,
            objects_per_crd_per_ns: (args.objects_per_crd / args.namespaces).max(1),
            constrained: args.constrained,
            namespaces,
        };
        let mut creates = Vec::new();
        for ns in &data.namespaces {
            for i in 0..data.pods_per_ns {
                creates.push((ns.clone(), "pod", i));
            }
            for i in 0..data.services_per_ns {
                creates.push((ns.clone(), "svc", i));
            }
            for i in 0..data.pvcs_per_ns {
                creates.push((ns.clone(), "pvc", i));
            }
        }
        stream::iter(creates)
            .map(|(ns, kind, i)| {
                let client = client.clone();
                async move { create_core(&client, &ns, kind, i).await }
            })
            .buffer_unordered(32)
            .collect::<Vec<()>>()
            .await;
        eprintln!(
            "scale: {} pods, {} services, {} PVCs created in {:?}",
            args.pods,
            args.services,
            args.pvcs,
            t.elapsed()
        );
        data
    }

    fn resource(&self, i: usize) -> ApiResource {
        ApiResource {
            group: self.group.clone(),
            version: "v1".into(),
            api_version: format!("{}/v1", self.group),
            kind: format!("Binding{i}"),
            plural: crd_plural(i),
        }
    }

    async fn create_crds(&self, client: &Client, from: usize, to: usize) {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for i in from..to {
            let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("{}.{}", crd_plural(i), self.group)},
                "spec": {"group": self.group, "scope": "Namespaced",
                    "names": {"plural": crd_plural(i), "singular": format!("bindings{i}"), "kind": format!("Binding{i}")},
                    "versions": [{"name": "v1", "served": true, "storage": true,
                        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
            }))
            .expect("CRD");
            let _ = crds.create(&PostParams::default(), &crd).await;
        }
        // Objects can be created once each CRD is served.
        let mut creates = Vec::new();
        for i in from..to {
            for ns in &self.namespaces {
                for j in 0..self.objects_per_crd_per_ns {
                    creates.push((i, ns.clone(), j));
                }
            }
        }
        stream::iter(creates)
            .map(|(i, ns, j)| {
                let client = client.clone();
                let resource = self.resource(i);
                async move {
                    let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &resource);
                    let object = DynamicObject::new(&format!("o{j}"), &resource).within(&ns);
                    for _ in 0..300 {
                        match api.create(&PostParams::default(), &object).await {
                            Ok(_) => return,
                            Err(kube::Error::Api(s)) if s.code == 409 => return,
                            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await, // not served yet
                        }
                    }
                    panic!("could not create {}/{ns}/o{j}", resource.plural);
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<()>>()
            .await;
    }

    /// Gives each CRD that a new-quota sample will name `--new-crd-objects` more objects in
    /// that sample's namespace (only for CRDs created in this step).
    async fn grow_new_crds(&self, client: &Client, args: &Args, from: usize, to: usize) {
        let creates: Vec<(usize, String, usize)> = (0..args.new_quota_samples)
            .map(|j| (self.constrained + j, j))
            .filter(|(i, _)| (from..to).contains(i))
            .flat_map(|(i, j)| {
                let ns = self.namespaces[j % self.namespaces.len()].clone();
                (0..args.new_crd_objects).map(move |k| (i, ns.clone(), k))
            })
            .collect();
        stream::iter(creates)
            .map(|(i, ns, k)| {
                let client = client.clone();
                let resource = self.resource(i);
                async move {
                    let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &resource);
                    let object = DynamicObject::new(&format!("x{k}"), &resource).within(&ns);
                    match api.create(&PostParams::default(), &object).await {
                        Ok(_) | Err(kube::Error::Api(_)) => {}
                        Err(e) => panic!("creating {}/{ns}/x{k}: {e}", resource.plural),
                    }
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<()>>()
            .await;
    }

    /// The quotas of one namespace when `crds` CRDs exist, and what status.used must say.
    fn quotas(&self, crds: usize) -> Vec<(String, Vec<(String, String)>, Vec<(String, String)>)> {
        let n = |v: usize| v.to_string();
        let mut quotas = vec![
            (
                "compute".to_owned(),
                vec![
                    ("pods".into(), "100000".into()),
                    ("requests.cpu".into(), "1000".into()),
                    ("limits.memory".into(), "1Ti".into()),
                ],
                vec![
                    ("pods".into(), n(self.pods_per_ns)),
                    ("requests.cpu".into(), format!("{}m", 10 * self.pods_per_ns)),
                    ("limits.memory".into(), format!("{}Mi", 16 * self.pods_per_ns)),
                ],
            ),
            (
                "services".to_owned(),
                vec![
                    ("services".into(), "100000".into()),
                    ("services.loadbalancers".into(), "10".into()),
                ],
                vec![
                    ("services".into(), n(self.services_per_ns)),
                    ("services.loadbalancers".into(), "0".into()),
                ],
            ),
            (
                "storage".to_owned(),
                vec![
                    ("persistentvolumeclaims".into(), "100000".into()),
                    ("requests.storage".into(), "1Pi".into()),
                ],
                vec![
                    ("persistentvolumeclaims".into(), n(self.pvcs_per_ns)),
                    ("requests.storage".into(), format!("{}Gi", self.pvcs_per_ns)),
                ],
            ),
        ];
        let keys: Vec<String> = (0..self.constrained.min(crds))
            .map(|i| format!("count/{}.{}", crd_plural(i), self.group))
            .collect();
        if keys.is_empty() {
            return quotas;
        }
        quotas.push((
            "bindings".to_owned(),
            keys.iter().map(|k| (k.clone(), "100000".to_owned())).collect(),
            keys.iter()
                .map(|k| (k.clone(), n(self.objects_per_crd_per_ns)))
                .collect(),
        ));
        quotas
    }
}

async fn create_core(client: &Client, ns: &str, kind: &str, i: usize) {
    let pp = PostParams::default();
    let result = match kind {
        "pod" => {
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("p{i}")},
                "spec": {"containers": [{"name": "c", "image": "registry.invalid/none",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "10m", "memory": "16Mi"}}}]}
            }))
            .expect("pod");
            Api::<Pod>::namespaced(client.clone(), ns)
                .create(&pp, &pod)
                .await
                .map(|_| ())
        }
        "svc" => {
            let svc: Service = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("s{i}")}, "spec": {"ports": [{"port": 80}]}
            }))
            .expect("service");
            Api::<Service>::namespaced(client.clone(), ns)
                .create(&pp, &svc)
                .await
                .map(|_| ())
        }
        _ => {
            let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("v{i}")},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
            }))
            .expect("pvc");
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
                .create(&pp, &pvc)
                .await
                .map(|_| ())
        }
    };
    match result {
        Ok(()) | Err(kube::Error::Api(_)) => {} // 409 on a rerun
        Err(e) => panic!("creating {kind} {i} in {ns}: {e}"),
    }
}

fn quota_object(name: &str, hard: &[(String, String)]) -> ResourceQuota {
    ResourceQuota {
        metadata: meta(name),
        spec: Some(k8s_openapi::api::core::v1::ResourceQuotaSpec {
            hard: Some(
                hard.iter()
                    .map(|(k, v)| (k.clone(), K8sQuantity(v.clone())))
                    .collect(),
            ),
            ..Default::default()
        }),
        ..ResourceQuota::default()
    }
}

fn same(a: &str, b: &str) -> bool {
    match (Quantity::parse(a), Quantity::parse(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

async fn quota_matches(api: &Api<ResourceQuota>, name: &str, want: &[(String, String)]) -> bool {
    let Ok(q) = api.get(name).await else { return false };
    let used = q.status.and_then(|s| s.used).unwrap_or_default();
    want.iter()
        .all(|(k, v)| used.get(k).is_some_and(|u| same(&u.0, v)))
}

#[allow(clippy::too_many_arguments)] // one measurement's context
async fn measure(
    client: &Client,
    args: &Args,
    data: &Data,
    n: usize,
    controller: Controller,
    kubeconfig: &Path,
    facts: &BTreeMap<String, String>,
    state: &Path,
) -> Sample {
    // Fresh quotas (empty status) for every controller, so its first sync is measured.
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
    let apiserver_port = facts["LAZYQUOTA_APISERVER_URL"]
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let baseline_watches = apiserver_watch_count(client).await;
    let started = Instant::now();
    let process = start(controller, kubeconfig, state);

    // First complete sync: every quota of every namespace says what the data implies.
    loop {
        let mut all = true;
        for ns in &data.namespaces {
            let api: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
            for (name, _, want) in &quotas {
                if !quota_matches(&api, name, want).await {
                    all = false;
                    break;
                }
            }
            if !all {
                break;
            }
        }
        if all {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_mins(10),
            "{} never synced",
            controller.name()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_sync = started.elapsed();
    tokio::time::sleep(args.settle).await;

    let metrics = process.metrics().await;
    let (tasks, heap_bytes) = match controller {
        Controller::Kcm => (
            metric(&metrics, "go_goroutines"),
            metric(&metrics, "go_memstats_heap_inuse_bytes"),
        ),
        _ => (
            metric(&metrics, "lazyquota_tokio_alive_tasks"),
            metric(&metrics, "lazyquota_jemalloc_allocated_bytes"),
        ),
    };
    let mut sample = Sample {
        tasks,
        heap_bytes,
        rss_bytes: rss(process.child.id(), "VmRSS:"),
        anon_bytes: rss(process.child.id(), "RssAnon:"),
        connections: connections(process.child.id(), &apiserver_port),
        apiserver_watches: apiserver_watch_count(client).await - baseline_watches,
        first_sync,
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

struct Process {
    child: Child,
    metrics_url: String,
}

impl Drop for Process {
    /// A failed measurement must not leave a controller running.
    fn drop(&mut self) {
        self.terminate();
    }
}

impl Process {
    async fn metrics(&self) -> String {
        let mut config = kube::Config::new(self.metrics_url.parse().expect("url"));
        config.accept_invalid_certs = true;
        let client = Client::try_from(config).expect("metrics client");
        let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
        client.request_text(request).await.expect("metrics")
    }

    fn stop(mut self) {
        self.terminate();
    }

    fn terminate(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..100 {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn start(controller: Controller, kubeconfig: &Path, state: &Path) -> Process {
    let port = free_port();
    // A file name: a variant's label, never its path.
    let name: String = controller
        .name()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let log = std::fs::File::create(state.join(format!("logs/bench-{name}.log"))).expect("log");
    match controller {
        Controller::Kcm => {
            let bin = std::fs::read_to_string(state.join("env"))
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("LAZYQUOTA_CP_BIN=").map(str::to_owned))
                .expect("bin dir");
            let kcm_kubeconfig = state.join("kcm.kubeconfig");
            let pki = state.join("pki");
            let child = Command::new(format!("{bin}/kube-controller-manager"))
                .args(["--kubeconfig", kcm_kubeconfig.to_str().unwrap()])
                .args(["--authentication-kubeconfig", kcm_kubeconfig.to_str().unwrap()])
                .args(["--authorization-kubeconfig", kcm_kubeconfig.to_str().unwrap()])
                .args([
                    "--authorization-always-allow-paths",
                    "/healthz,/readyz,/livez,/metrics",
                ])
                .args(["--bind-address", "127.0.0.1", "--secure-port", &port.to_string()])
                .args([
                    "--controllers",
                    "resourcequota-controller",
                    "--use-service-account-credentials=true",
                ])
                // client-go's default (QPS 20, burst 30) would throttle KCM's lists and writes
                // while lazyquota has no client-side limiter; lift it so the two compare fairly.
                .args(["--kube-api-qps", "1000", "--kube-api-burst", "2000"])
                .args([
                    "--root-ca-file",
                    pki.join("ca.crt").to_str().unwrap(),
                    "--leader-elect=false",
                ])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("kube-controller-manager");
            Process {
                child,
                metrics_url: format!("https://127.0.0.1:{port}"),
            }
        }
        Controller::Eager | Controller::Lazy | Controller::LazyHttp1 | Controller::LazyBinary(..) => {
            let mode = if controller == Controller::Eager {
                "eager"
            } else {
                "lazy"
            };
            let transport = if controller == Controller::LazyHttp1 {
                "http1"
            } else {
                "http2"
            };
            let binary = match controller {
                Controller::LazyBinary(_, path) => std::path::PathBuf::from(path),
                _ => common::lazyquota_binary(),
            };
            let child = Command::new(binary)
                .args([
                    "run",
                    "--kubeconfig",
                    kubeconfig.to_str().unwrap(),
                    "--mode",
                    mode,
                ])
                .args(["--transport", transport])
                .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("lazyquota");
            Process {
                child,
                metrics_url: format!("http://127.0.0.1:{port}"),
            }
        }
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn rss(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))?
                .split_whitespace()
                .nth(1)?
                .parse::<f64>()
                .ok()
        })
        .map_or(f64::NAN, |kib| kib * 1024.0)
}

/// Established TCP connections from `pid` to `port`.
fn connections(pid: u32, port: &str) -> f64 {
    port.parse().map_or(f64::NAN, |port| {
        lazyquota_testenv::established_connections(pid, port) as f64
    })
}

/// Open watches the apiserver counts (all clients).
async fn apiserver_watch_count(client: &Client) -> f64 {
    let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
    let text = client.request_text(request).await.expect("apiserver metrics");
    text.lines()
        .filter(|l| l.starts_with("apiserver_longrunning_requests{") && l.contains("verb=\"WATCH\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn write_results(args: &Args, results: &Results) {
    let controllers = &args.controllers;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Scale benchmark: KCM's quota controller vs lazyquota eager vs lazy\n"
    );
    let _ = writeln!(
        md,
        "Generated by `cargo bench --bench scale -- {}` on {} CPU cores. Data: {} pods, {} services, {} PVCs over {} \
         namespaces; N namespaced CRDs with {} objects each; quotas constrain pods, services, PVCs and K = {} CRDs. \
         Tasks are goroutines for KCM and tokio alive tasks for lazyquota; \"heap\" is a different measure on each \
         side — Go's heap in use (`go_memstats_heap_inuse_bytes`) for KCM, jemalloc's allocated bytes for \
         lazyquota — so compare RSS and anonymous RSS (`VmRSS`, `RssAnon` from /proc) across them. KCM runs with \
         `--kube-api-qps 1000 --kube-api-burst 2000` (client-go's default 20/30 would throttle it; lazyquota has \
         no client-side limiter). The order of the controllers is reversed at every other N. {}. Commit: `{}`.\n",
        std::env::args()
            .skip(1)
            .filter(|a| a != "--bench")
            .collect::<Vec<_>>()
            .join(" "),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        args.pods,
        args.services,
        args.pvcs,
        args.namespaces,
        args.objects_per_crd,
        args.constrained,
        common::binary_note(),
        common::commit(),
    );
    let _ = writeln!(
        md,
        "| N | controller | tasks | heap MiB | RSS MiB | anon RSS MiB | watch conns (ss) | apiserver watches | first sync ms | new quota p50/p99 ms | delete p50/p99 ms |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|");
    let mib = |b: f64| b / 1_048_576.0;
    for &n in &args.crds {
        for c in controllers {
            let Some(s) = results.get(&(n, c.name())) else {
                continue;
            };
            let _ = writeln!(
                md,
                "| {n} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} | {} | {}/{} | {}/{} |",
                c.name(),
                s.tasks,
                mib(s.heap_bytes),
                mib(s.rss_bytes),
                mib(s.anon_bytes),
                s.connections,
                s.apiserver_watches,
                s.first_sync.as_millis(),
                ms(percentile(&s.new_quota, 50.0)),
                ms(percentile(&s.new_quota, 99.0)),
                ms(percentile(&s.delete, 50.0)),
                ms(percentile(&s.delete, 99.0)),
            );
        }
    }
    let slope_table = |md: &mut String, lo: usize, hi: usize, title: &str| {
        let _ = writeln!(md, "\n## {title} (slope from N = {lo} to N = {hi})\n");
        let _ = writeln!(
            md,
            "| controller | tasks / CRD | heap KiB / CRD | RSS KiB / CRD | watch conns / CRD | apiserver watches / CRD |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|");
        let dn = (hi - lo) as f64;
        for c in controllers {
            let (Some(a), Some(b)) = (results.get(&(lo, c.name())), results.get(&(hi, c.name()))) else {
                continue;
            };
            let _ = writeln!(
                md,
                "| {} | {:.3} | {:.2} | {:.2} | {:.3} | {:.3} |",
                c.name(),
                (b.tasks - a.tasks) / dn,
                (b.heap_bytes - a.heap_bytes) / dn / 1024.0,
                (b.rss_bytes - a.rss_bytes) / dn / 1024.0,
                (b.connections - a.connections) / dn,
                (b.apiserver_watches - a.apiserver_watches) / dn,
            );
        }
    };
    let ns = &args.crds;
    if let (Some(&lo), Some(&hi)) = (ns.first(), ns.last())
        && hi > lo
    {
        slope_table(&mut md, lo, hi, "Marginal cost per CRD, K of them constrained");
        // Between the two largest N, both with all K constrained CRDs present, every added
        // CRD is unconstrained: the cost the mission is about.
        let above: Vec<usize> = ns.iter().copied().filter(|n| *n >= args.constrained).collect();
        if let [.., a, b] = above[..] {
            slope_table(&mut md, a, b, "Marginal cost per unconstrained CRD");
        }
    }
    if let Some(&hi) = ns.last()
        && let (Some(kcm), Some(lazy)) = (
            results.get(&(hi, Controller::Kcm.name())),
            results.get(&(hi, Controller::Lazy.name())),
        )
    {
        let _ = writeln!(
            md,
            "\nAt N = {hi}: RSS lazy / KCM = {:.3}; anonymous (private) RSS lazy / KCM = {:.3}. File-backed RSS is \
             mostly each program's own binary pages, shared with the page cache.",
            lazy.rss_bytes / kcm.rss_bytes,
            lazy.anon_bytes / kcm.anon_bytes
        );
    }
    if let Some(&hi) = ns.last()
        && let Some(kcm) = results.get(&(hi, Controller::Kcm.name()))
    {
        for c in controllers {
            if let (Controller::LazyBinary(..), Some(variant)) = (c, results.get(&(hi, c.name()))) {
                let _ = writeln!(
                    md,
                    "At N = {hi}: RSS {} / KCM = {:.3}; anonymous RSS / KCM = {:.3}.",
                    c.name(),
                    variant.rss_bytes / kcm.rss_bytes,
                    variant.anon_bytes / kcm.anon_bytes
                );
            }
        }
    }
    std::fs::write(args.out.join("scale.md"), &md).expect("write scale.md");
    let mut dat =
        String::from("# N kcm_rss_mib eager_rss_mib lazy_rss_mib kcm_tasks eager_tasks lazy_tasks\n");
    for &n in &args.crds {
        let get = |c: Controller| results.get(&(n, c.name())).cloned().unwrap_or_default();
        let (k, e, l) = (
            get(Controller::Kcm),
            get(Controller::Eager),
            get(Controller::Lazy),
        );
        let _ = writeln!(
            dat,
            "{n} {:.2} {:.2} {:.2} {:.0} {:.0} {:.0}",
            mib(k.rss_bytes),
            mib(e.rss_bytes),
            mib(l.rss_bytes),
            k.tasks,
            e.tasks,
            l.tasks
        );
    }
    std::fs::write(args.out.join("scale.dat"), &dat).expect("write scale.dat");
    let plot = String::from(
        "set terminal pngcairo size 1200,500\nset output 'scale.png'\nset multiplot layout 1,2\n\
         set key top left\nset xlabel 'N (namespaced CRDs)'\nset grid\n\
         set title 'RSS (MiB)'\nplot 'scale.dat' u 1:2 w lp t 'KCM quota controller', '' u 1:3 w lp t 'lazyquota eager', '' u 1:4 w lp t 'lazyquota lazy'\n\
         set title 'goroutines (KCM) / tokio tasks (lazyquota)'\nplot 'scale.dat' u 1:5 w lp t 'KCM quota controller', '' u 1:6 w lp t 'lazyquota eager', '' u 1:7 w lp t 'lazyquota lazy'\n\
         unset multiplot\n",
    );
    let script = args.out.join("scale.gp");
    std::fs::write(&script, &plot).expect("write scale.gp");
    // Relative paths, so the committed script is the same wherever the repository lives.
    match Command::new("gnuplot")
        .current_dir(&args.out)
        .arg("scale.gp")
        .status()
    {
        Ok(s) if s.success() => eprintln!("scale: wrote {}/scale.png", args.out.display()),
        _ => eprintln!("scale: gnuplot not available; no PNG (apt-get install gnuplot-nox)"),
    }
    println!("{md}");
}
