//! Shared by the integration tests that run lazyquota's controller in-process.
//!
//! One controller per test binary: tests in a binary run in parallel and share it (two
//! controllers writing the same quotas would fight). Binaries run one after another, so each
//! binary can choose its own mode against the shared control plane.
#![allow(dead_code)] // each test binary uses a different part

pub mod process;

use std::{sync::OnceLock, time::Duration};

use k8s_openapi::{
    api::core::v1::ResourceQuota,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, ObjectMeta, PostParams},
};
use lazyquota_kube::{
    controller::{Config, Controller, SnapshotHandle},
    operate::metrics::Metrics,
};
use lazyquota_testenv::{ControlPlane, Flavor, eventually};

static CONTROLLER: OnceLock<SnapshotHandle> = OnceLock::new();

/// The metrics of this test binary's controller (once [`controller`] has started it).
static CONTROLLER_METRICS: std::sync::OnceLock<Metrics> = std::sync::OnceLock::new();

/// The value of counter `name` with label `label=value` in this test binary's controller's
/// metrics (0 when absent).
pub fn controller_counter(name: &str, label: &str, value: &str) -> f64 {
    controller_counter_with(name, &[(label, value)])
}

/// The value of counter `name` of this test binary's controller whose labels include every
/// pair of `labels` (0 when absent).
pub fn controller_counter_with(name: &str, labels: &[(&str, &str)]) -> f64 {
    let Some(metrics) = CONTROLLER_METRICS.get() else {
        return 0.0;
    };
    metrics
        .registry()
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter())
        .filter(|m| {
            labels
                .iter()
                .all(|(k, v)| m.get_label().iter().any(|l| l.name() == *k && l.value() == *v))
        })
        .map(|m| m.get_counter().get_value())
        .sum()
}

/// The controller of this test binary, started on first use with `config` against the
/// control plane of `flavor`, on a runtime of its own that lives as long as the process.
pub fn controller(flavor: Flavor, config: Config) -> SnapshotHandle {
    controller_as(flavor, config, None)
}

/// [`controller`] with the identity of `kubeconfig` instead of the administrator's.
pub fn controller_as(
    flavor: Flavor,
    config: Config,
    kubeconfig: Option<std::path::PathBuf>,
) -> SnapshotHandle {
    CONTROLLER
        .get_or_init(|| {
            // `LAZYQUOTA_TEST_LOG=<filter>` prints the controller's log (a failing test's
            // decisions), as `RUST_LOG` does for `lazyquota run`.
            if let Ok(filter) = std::env::var("LAZYQUOTA_TEST_LOG") {
                let _ = tracing_subscriber::fmt()
                    .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                    .with_writer(std::io::stderr)
                    .try_init();
            }
            let cp = ControlPlane::get(flavor);
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("controller runtime");
                runtime.block_on(async move {
                    let client = match kubeconfig {
                        Some(path) => client_from(&path).await,
                        None => cp.client().await.expect("controller client"),
                    };
                    let metrics = Metrics::new();
                    let _ = CONTROLLER_METRICS.set(metrics.clone());
                    let (controller, snapshots) = Controller::new(client, config, metrics);
                    tx.send(snapshots).expect("test waits for the controller");
                    controller
                        .run(std::future::pending())
                        .await
                        .expect("controller runs until the process ends");
                });
            });
            rx.recv().expect("controller started")
        })
        .clone()
}

/// Fast settings for tests: a short discovery poll; the periodic resync is left at its
/// default so tests see event-driven behaviour, not resyncs. The feature gates are those of
/// the test control plane's release, as `lazyquota run` picks them from the server.
pub fn test_config() -> Config {
    Config {
        discovery_poll: Duration::from_secs(30),
        gates: test_gates(),
        ..Config::default()
    }
}

/// A number from the environment (a test's bound, a seed), or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The gates of the pinned test control plane (`KUBE_VERSION` in
/// tests/control-plane/versions.env).
pub fn test_gates() -> lazyquota_quota::FeatureGates {
    let pinned = include_str!("../control-plane/versions.env")
        .lines()
        .find_map(|l| l.strip_prefix("KUBE_VERSION="))
        .expect("versions.env pins KUBE_VERSION");
    lazyquota_quota::FeatureGates::for_version(pinned).0
}

/// A quota with `hard`.
pub fn quota(name: &str, hard: &[(&str, &str)]) -> ResourceQuota {
    ResourceQuota {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::core::v1::ResourceQuotaSpec {
            hard: Some(
                hard.iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect(),
            ),
            ..Default::default()
        }),
        ..ResourceQuota::default()
    }
}

/// `status.used[key]` of a quota, once it equals `want` (None: gave up after 30 s).
pub async fn used_becomes(quotas: &Api<ResourceQuota>, name: &str, key: &str, want: &str) -> Option<()> {
    eventually(Duration::from_secs(30), || async {
        let q = quotas.get(name).await.ok()?;
        let used = q.status?.used?;
        (used.get(key)?.0 == want).then_some(())
    })
    .await
}

/// A namespaced CRD `<plural>.<group>` (v1, any fields), created and established.
pub async fn create_crd(client: &Client, group: &str, plural: &str) -> ApiResource {
    let kind = {
        let mut k = plural.trim_end_matches('s').to_owned();
        k[..1].make_ascii_uppercase();
        k
    };
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": plural.trim_end_matches('s'), "kind": kind},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .expect("valid CRD");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd)
        .await
        .expect("create CRD");
    let name = format!("{plural}.{group}");
    eventually(Duration::from_secs(30), || async {
        let crd = crds.get(&name).await.ok()?;
        let established = crd
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        established.then_some(())
    })
    .await
    .expect("CRD established");
    ApiResource {
        group: group.into(),
        version: "v1".into(),
        api_version: format!("{group}/v1"),
        kind,
        plural: plural.into(),
    }
}

/// Deletes a CRD (and with it all its objects).
pub async fn delete_crd(client: &Client, group: &str, plural: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let _ = crds
        .delete(&format!("{plural}.{group}"), &DeleteParams::default())
        .await;
}

/// Creates an object of a CRD.
pub async fn create_object(
    client: &Client,
    resource: &ApiResource,
    namespace: &str,
    name: &str,
) -> kube::Result<DynamicObject> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
    let object = DynamicObject::new(name, resource).within(namespace);
    api.create(&PostParams::default(), &object).await
}

/// Deletes an object of a CRD.
pub async fn delete_object(client: &Client, resource: &ApiResource, namespace: &str, name: &str) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
    api.delete(name, &DeleteParams::default())
        .await
        .expect("delete object");
}

/// Open watches the kube-apiserver itself reports for a resource
/// (`apiserver_longrunning_requests{verb="WATCH"}`), summed over scopes.
pub async fn apiserver_watches(cp: &ControlPlane, group: &str, resource: &str) -> u64 {
    let metrics = cp.apiserver_metrics().await.expect("apiserver /metrics");
    let group_label = format!("group=\"{group}\"");
    let resource_label = format!("resource=\"{resource}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_longrunning_requests{"))
        .filter(|l| l.contains(&group_label) && l.contains(&resource_label) && l.contains("verb=\"WATCH\""))
        // A gauge of open requests: always a whole number.
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Whether the controller has a synced watch for `<resource>.<group>` (`count/` name form).
pub async fn has_synced_watch(controller: &SnapshotHandle, count_name: &str) -> bool {
    let snapshot = controller.get().await.expect("controller running");
    snapshot
        .watches
        .iter()
        .any(|w| w.key.resource.object_count_name() == count_name && w.synced)
}

/// Whether the controller has any watch for the resource.
pub async fn has_watch(controller: &SnapshotHandle, count_name: &str) -> bool {
    let snapshot = controller.get().await.expect("controller running");
    snapshot
        .watches
        .iter()
        .any(|w| w.key.resource.object_count_name() == count_name)
}

/// A token of ServiceAccount `namespace/name` from the TokenRequest API (one hour).
pub async fn service_account_token(cp: &ControlPlane, namespace: &str, name: &str) -> String {
    use k8s_openapi::api::{
        authentication::v1::{TokenRequest, TokenRequestSpec},
        core::v1::ServiceAccount,
    };
    let client = cp.client().await.expect("admin client");
    let accounts: Api<ServiceAccount> = Api::namespaced(client, namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token: TokenRequest = accounts
        .create_subresource("token", name, &PostParams::default(), &request)
        .await
        .expect("TokenRequest");
    token.status.and_then(|s| s.token).expect("token issued")
}

/// A kubeconfig file for ServiceAccount `namespace/name`, with a token from the TokenRequest
/// API (one hour), for running lazyquota with exactly that account's RBAC.
pub async fn service_account_kubeconfig(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
) -> std::path::PathBuf {
    let token = service_account_token(cp, namespace, name).await;
    let facts = |k: &str| {
        cp.fact(k)
            .unwrap_or_else(|| panic!("control plane fact {k}"))
            .to_owned()
    };
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: '{}', certificate-authority: '{}'}}}}]\n\
         users: [{{name: {name}, user: {{token: '{token}'}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: {name}}}}}]\n\
         current-context: c\n",
        facts("LAZYQUOTA_APISERVER_URL"),
        facts("LAZYQUOTA_CA_FILE"),
    );
    let path = std::env::temp_dir().join(format!("{}.kubeconfig", lazyquota_testenv::unique_name(name)));
    std::fs::write(&path, kubeconfig).expect("write kubeconfig");
    path
}

/// A client from a kubeconfig file.
pub async fn client_from(kubeconfig: &std::path::Path) -> Client {
    lazyquota_kube::transport::client::connect(Some(kubeconfig), None)
        .await
        .expect("client from kubeconfig")
}

/// Applies a YAML document (one or more objects, `---` separated) with kubectl's server-side
/// apply, as an administrator.
pub fn kubectl_apply(cp: &ControlPlane, yaml: &str) -> std::process::Output {
    use std::io::Write as _;
    let kubectl = format!(
        "{}/kubectl",
        cp.fact("LAZYQUOTA_CP_BIN").expect("control plane binaries")
    );
    let mut child = std::process::Command::new(kubectl)
        .args([
            "--kubeconfig",
            cp.kubeconfig().to_str().unwrap(),
            "apply",
            "--server-side",
            "-f",
            "-",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl");
    child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
    child.wait_with_output().expect("kubectl finished")
}

/// Runs `create` until it succeeds. A create that quota admission refuses with a conflict on
/// a ResourceQuota (the quota's status changed under admission's charge more often than
/// admission retries, e.g. while the controller writes it) is tried again, as a client would,
/// at most 5 times, 200 ms apart; any other error panics naming `what`.
pub async fn create_retrying_quota_conflicts<T, F, Fut>(what: &str, mut create: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    for attempt in 1..=5 {
        match create().await {
            Ok(_) => return,
            Err(kube::Error::Api(status))
                if status.code == 409
                    && status
                        .details
                        .as_ref()
                        .is_some_and(|d| d.kind == "resourcequotas")
                    && attempt < 5 =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => panic!("create {what}: {e}"),
        }
    }
}

/// Creates an empty ConfigMap `name` in the test namespace, retrying quota admission's
/// conflicts ([`create_retrying_quota_conflicts`]).
pub async fn create_configmap(ns: &lazyquota_testenv::TestNamespace, name: &str) {
    use k8s_openapi::api::core::v1::ConfigMap;
    let cm = ConfigMap {
        metadata: meta(name),
        ..ConfigMap::default()
    };
    let api = ns.api::<ConfigMap>();
    let params = PostParams::default();
    create_retrying_quota_conflicts(&format!("configmap {name}"), || api.create(&params, &cm)).await;
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..ObjectMeta::default()
    }
}

/// Every quota of the namespace agrees, key by key, with a direct recomputation
/// (`lazyquota usage`), and there is at least one quota.
pub async fn converged(ns: &lazyquota_testenv::TestNamespace) -> Option<()> {
    let report = lazyquota_kube::operate::report::usage(
        &ns.client(),
        &lazyquota_index::keys::ClusterName::new("default"),
        Some(ns.name()),
        lazyquota_quota::FeatureGates::default(),
        false,
    )
    .await
    .ok()?;
    (!report.is_empty() && report.iter().all(|q| q.keys.iter().all(|k| !k.differs))).then_some(())
}

/// Deletes every ResourceQuota of a cluster. For the multi-cluster control plane, whose
/// clusters 1 and 2 run no namespace controller: quotas left by an earlier test in a namespace
/// that never finishes terminating would add demand to the next one.
pub async fn remove_all_quotas(client: &Client) {
    let all = Api::<ResourceQuota>::all(client.clone());
    let Ok(list) = all.list(&kube::api::ListParams::default()).await else {
        return;
    };
    for q in list.items {
        let ns = q.metadata.namespace.clone().unwrap_or_default();
        let name = q.metadata.name.clone().unwrap_or_default();
        let _ = Api::<ResourceQuota>::namespaced(client.clone(), &ns)
            .delete(&name, &DeleteParams::default())
            .await;
    }
}

/// The first Event in `ns` with `reason` whose note contains `note`, once there is one (None:
/// gave up after `wait`).
pub async fn event_with(
    ns: &lazyquota_testenv::TestNamespace,
    reason: &str,
    note: &str,
    wait: Duration,
) -> Option<k8s_openapi::api::events::v1::Event> {
    let events = ns.api::<k8s_openapi::api::events::v1::Event>();
    eventually(wait, || async {
        let list = events.list(&kube::api::ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some(reason) && e.note.as_deref().is_some_and(|n| n.contains(note))
        })
    })
    .await
}
