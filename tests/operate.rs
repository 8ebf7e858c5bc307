//! Operating lazyquota as a platform team would, with the real binary on the real control
//! plane: the rendered chart applies server-side; the chart's ServiceAccount (token from the
//! TokenRequest API) is enough to do the whole job and no more; a real Prometheus scrapes
//! it; two replicas fail over through the Lease and never lead at once; SIGTERM exits 0.
//!
//! Tests here share one Lease and the chart's namespace, so they run one at a time.

mod common;

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use common::{
    create_crd, create_object, kubectl_apply,
    process::{Kill, Lazyquota, free_port, http_get},
    quota, service_account_kubeconfig, used_becomes,
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, ResourceQuota},
};
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, PostParams},
};
use lazyquota_testenv::{ControlPlane, Flavor, TestNamespace, eventually, unique_name};
use tokio::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());
const WAIT: Duration = Duration::from_secs(30);

/// Applies the plain manifests rendered from the chart (namespace `lazyquota`).
fn apply_chart(cp: &ControlPlane) {
    let manifests = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/manifests/lazyquota.yaml"
    ))
    .expect("rendered manifests");
    let out = kubectl_apply(cp, &manifests);
    assert!(
        out.status.success(),
        "server-side apply of the chart failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const CHART_FLAGS: &[&str] = &[
    "--leader-elect",
    "--leader-election-namespace",
    "lazyquota",
    "--leader-election-lease-name",
    "lazyquota",
    "--leader-election-lease-duration",
    "4s",
    "--leader-election-renew-deadline",
    "3s",
    "--leader-election-retry-period",
    "1s",
];

/// The chart's RBAC is enough for the whole job — leases, watches of a CRD named by a quota,
/// status writes — and a write it does not allow is refused.
#[tokio::test]
async fn the_charts_service_account_does_the_whole_job_and_no_more() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    apply_chart(cp);
    let kubeconfig = service_account_kubeconfig(cp, "lazyquota", "lazyquota").await;
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "chart-rbac")
        .await
        .expect("namespace");
    let client = ns.client();
    let group = format!("{}.lazyquota.test", unique_name("g"));
    let gizmos = create_crd(&client, &group, "gizmos").await;
    create_object(&client, &gizmos, ns.name(), "one")
        .await
        .expect("gizmo");
    let quotas = ns.api::<ResourceQuota>();
    let key = format!("count/gizmos.{group}");
    quotas
        .create(
            &PostParams::default(),
            &quota("rbac", &[(&key, "5"), ("pods", "3"), ("count/configmaps", "9")]),
        )
        .await
        .expect("quota");

    // Debug logs: even there, the token must not appear.
    let process = Lazyquota::start_logging(&kubeconfig, CHART_FLAGS, "debug");
    let done = used_becomes(&quotas, "rbac", &key, "1").await;
    assert!(
        done.is_some(),
        "status written with the chart's RBAC; log:\n{}",
        process.log()
    );
    used_becomes(&quotas, "rbac", "pods", "0")
        .await
        .expect("pods computed");
    assert!(
        !process.log().contains("forbidden"),
        "no 403 with the chart's RBAC; log:\n{}",
        process.log()
    );

    // The same identity may not write what the chart does not grant.
    let restricted = common::client_from(&kubeconfig).await;
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("nope".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    let err = Api::<ConfigMap>::namespaced(restricted.clone(), ns.name())
        .create(&PostParams::default(), &cm)
        .await
        .expect_err("the chart grants no configmap writes");
    assert!(matches!(&err, kube::Error::Api(s) if s.code == 403), "{err}");
    let err = quotas_of(&restricted, ns.name())
        .delete("rbac", &DeleteParams::default())
        .await
        .expect_err("no deletes");
    assert!(matches!(&err, kube::Error::Api(s) if s.code == 403), "{err}");

    let token = std::fs::read_to_string(&kubeconfig)
        .expect("kubeconfig")
        .split("token: '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .map(str::to_owned)
        .expect("the token in the kubeconfig");
    let log = process.log();
    drop(process);
    assert!(log.lines().count() > 10, "a debug log was written");
    assert!(
        !log.contains(&token),
        "the ServiceAccount token appears in the debug log"
    );
    assert!(
        !log.contains(&token[token.len() - 16..]),
        "no part of the token in the log"
    );
    common::delete_crd(&client, &group, "gizmos").await;
    ns.delete().await.expect("delete namespace");
}

fn quotas_of(client: &kube::Client, namespace: &str) -> Api<ResourceQuota> {
    Api::namespaced(client.clone(), namespace)
}

/// A real Prometheus scrapes /metrics; PromQL over its HTTP API returns the active-watch gauge.
#[tokio::test]
async fn prometheus_scrapes_the_active_watch_gauge() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "prom")
        .await
        .expect("namespace");
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(&PostParams::default(), &quota("q", &[("count/secrets", "5")]))
        .await
        .expect("quota");
    let process = Lazyquota::start(cp.kubeconfig(), &["--quota-usage-metrics"]);
    used_becomes(&quotas, "q", "count/secrets", "0")
        .await
        .expect("controller running");
    ns.api::<k8s_openapi::api::core::v1::Secret>()
        .create(
            &PostParams::default(),
            &k8s_openapi::api::core::v1::Secret {
                metadata: ObjectMeta {
                    name: Some("one".into()),
                    ..ObjectMeta::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("secret");
    used_becomes(&quotas, "q", "count/secrets", "1")
        .await
        .expect("a secret counted");

    let dir = std::env::temp_dir().join(unique_name("prometheus"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        "global: {{scrape_interval: 1s}}\nscrape_configs:\n- job_name: lazyquota\n  static_configs: [{{targets: ['127.0.0.1:{}']}}]\n",
        process.port
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let web = free_port();
    let prometheus = Command::new("prometheus")
        .args([
            &format!("--config.file={}", dir.join("prometheus.yml").display()),
            &format!("--storage.tsdb.path={}", dir.join("data").display()),
            &format!("--web.listen-address=127.0.0.1:{web}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus is installed (Debian package prometheus; .ci/run installs it)");
    let _prometheus = Kill(prometheus);

    let query = "/api/v1/query?query=lazyquota_active_watches%7Bresource%3D%22secrets%22%7D";
    let result = eventually(Duration::from_mins(1), || async {
        let (status, body) = http_get(web, query).await?;
        let json: serde_json::Value = serde_json::from_str(&body).ok()?;
        let value = json["data"]["result"][0]["value"][1].as_str()?.to_owned();
        (status == 200).then_some(value)
    })
    .await
    .expect("Prometheus returns lazyquota_active_watches for secrets");
    // At least ours (quotas of other tests in terminating namespaces may add watches).
    assert!(
        result.parse::<f64>().is_ok_and(|v| v >= 1.0),
        "a watch on secrets, got {result}"
    );
    // What users alert on: the chart's "quota nearly full" rule is this ratio over a threshold.
    let ratio = format!(
        "/api/v1/query?query=lazyquota_quota_usage_ratio%7Bnamespace%3D%22{}%22%2Cquota%3D%22q%22%2Cresource%3D%22count%2Fsecrets%22%7D",
        ns.name()
    );
    let value = eventually(Duration::from_mins(1), || async {
        let (_, body) = http_get(web, &ratio).await?;
        let json: serde_json::Value = serde_json::from_str(&body).ok()?;
        json["data"]["result"][0]["value"][1].as_str().map(str::to_owned)
    })
    .await
    .expect("Prometheus returns the quota's usage ratio");
    assert_eq!(value, "0.2", "1 of 5 secrets");
    drop(process);
    ns.delete().await.expect("delete namespace");
}

/// Leader election with short timings (lease 4 s, renew deadline 3 s, retry 500 ms) on Lease
/// `default/<lease>` as `id`.
fn leader_flags<'a>(id: &'a str, lease: &'a str) -> [&'a str; 13] {
    [
        "--leader-elect",
        "--leader-election-namespace",
        "default",
        "--leader-election-lease-name",
        lease,
        "--leader-election-identity",
        id,
        "--leader-election-lease-duration",
        "4s",
        "--leader-election-renew-deadline",
        "3s",
        "--leader-election-retry-period",
        "500ms",
    ]
}

/// Two replicas: one leads and writes; kill it, the other takes over within the lease
/// duration; they never lead at once; SIGTERM releases the Lease and exits 0.
#[tokio::test]
async fn a_standby_takes_over_when_the_leader_dies_and_never_both_lead() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "failover")
        .await
        .expect("namespace");
    let lease_name = unique_name("lease");
    let a = Lazyquota::start(cp.kubeconfig(), &leader_flags("replica-a", &lease_name));
    let b = Lazyquota::start(cp.kubeconfig(), &leader_flags("replica-b", &lease_name));

    let a_leads = eventually(WAIT, || async {
        match (a.leader().await?, b.leader().await?) {
            (true, false) => Some(true),
            (false, true) => Some(false),
            _ => None,
        }
    })
    .await
    .expect("one replica leads");
    let (mut leader, standby, standby_id) = if a_leads {
        (a, b, "replica-b")
    } else {
        (b, a, "replica-a")
    };
    // Readiness: the leader after listing quotas, the standby as a standby.
    let ready = eventually(WAIT, || async {
        (leader.get("/readyz").await?.0 == 200).then_some(())
    })
    .await;
    assert!(ready.is_some(), "the leader becomes ready");
    assert_eq!(
        standby.get("/readyz").await.map(|r| r.0),
        Some(200),
        "a standby is ready"
    );
    assert_eq!(standby.get("/healthz").await.map(|r| r.0), Some(200));

    // Never both: sample both replicas' leader gauge for a while.
    for _ in 0..10 {
        let (x, y) = (
            leader.leader().await.unwrap_or(false),
            standby.leader().await.unwrap_or(false),
        );
        assert!(!(x && y), "two leaders at once");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Writes in flight: a quota whose namespace churns, so the leader keeps writing.
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(
            &PostParams::default(),
            &quota("during", &[("count/configmaps", "1000")]),
        )
        .await
        .expect("quota");
    used_becomes(&quotas, "during", "count/configmaps", "1")
        .await
        .expect("the leader writes");
    let churn = {
        let configmaps = ns.api::<ConfigMap>();
        tokio::spawn(async move {
            for i in 0..120 {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(format!("churn-{i}")),
                        ..ObjectMeta::default()
                    },
                    ..ConfigMap::default()
                };
                let _ = configmaps.create(&PostParams::default(), &cm).await;
                if i % 2 == 0 {
                    let _ = configmaps
                        .delete(&format!("churn-{i}"), &DeleteParams::default())
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = |metrics: &str| -> u64 {
        metrics
            .lines()
            .filter(|l| l.starts_with("lazyquota_status_writes_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let (_, leader_metrics) = leader.get("/metrics").await.expect("leader metrics");
    let (_, standby_metrics) = standby.get("/metrics").await.expect("standby metrics");
    assert!(writes(&leader_metrics) > 0, "the leader is writing");
    assert_eq!(
        writes(&standby_metrics),
        0,
        "the standby never writes while the leader leads"
    );

    // Kill the leader hard, mid-writes; the standby takes over within the lease duration
    // (+ retries).
    leader.child.kill().expect("kill leader");
    let _ = leader.child.wait();
    let taken = eventually(Duration::from_secs(10), || async {
        standby.leader().await?.then_some(())
    })
    .await;
    assert!(
        taken.is_some(),
        "the standby leads after the leader died; log:\n{}",
        standby.log()
    );
    let leases: Api<Lease> = Api::namespaced(cp.client().await.unwrap(), "default");
    let lease = leases.get(&lease_name).await.expect("lease");
    assert_eq!(
        lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()),
        Some(standby_id)
    );

    // The churn ends; the new leader's status converges to a direct recomputation.
    churn.await.expect("churn");
    assert!(
        eventually(Duration::from_mins(1), || common::converged(&ns))
            .await
            .is_some(),
        "converged after the leader died mid-writes; log:\n{}",
        standby.log()
    );
    used_becomes(&quotas, "during", "count/configmaps", "61")
        .await
        .expect("1 root CA + 120 created − 60 deleted");

    // The new leader writes.
    quotas
        .create(
            &PostParams::default(),
            &quota("after", &[("count/configmaps", "1000")]),
        )
        .await
        .expect("quota");
    used_becomes(&quotas, "after", "count/configmaps", "61")
        .await
        .expect("the new leader writes");

    // SIGTERM: exits 0 promptly and releases the Lease.
    let mut b = standby;
    let pid = b.child.id().to_string();
    Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill -TERM");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = b.child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "exits within 15 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "exit status {status}; log:\n{}", b.log());
    let lease = leases.get(&lease_name).await.expect("lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity),
        None,
        "the Lease was released"
    );
    ns.delete().await.expect("delete namespace");
}

/// A leader whose connection to the apiserver is black-holed (a proxy that stops forwarding
/// and closes nothing, so only deadlines can notice) gives up at its renew deadline — each
/// renewal is bounded — and exits before the standby, which reaches the apiserver directly,
/// takes over after the lease duration: never two leaders.
#[tokio::test]
async fn a_black_holed_leader_stops_before_the_standby_takes_over() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let url = cp.fact("LAZYQUOTA_APISERVER_URL").expect("apiserver url");
    let target = url
        .trim_start_matches("https://")
        .parse()
        .expect("apiserver address");
    let proxy = lazyquota_testenv::proxy::CuttingProxy::start(target, 11)
        .await
        .expect("proxy");
    let proxied = std::env::temp_dir().join(format!("{}.kubeconfig", unique_name("hole")));
    proxy
        .kubeconfig(cp.kubeconfig(), &proxied)
        .expect("proxied kubeconfig");
    let lease = unique_name("lease");
    let mut leader = Lazyquota::start(&proxied, &leader_flags("behind-proxy", &lease));
    let leads = eventually(WAIT, || async { leader.leader().await?.then_some(()) }).await;
    assert!(
        leads.is_some(),
        "the proxied replica leads first; log:\n{}",
        leader.log()
    );
    let standby = Lazyquota::start(cp.kubeconfig(), &leader_flags("direct", &lease));
    let ready = eventually(WAIT, || async {
        (standby.get("/readyz").await?.0 == 200).then_some(())
    })
    .await;
    assert!(ready.is_some(), "the standby is ready as a standby");
    assert_eq!(standby.leader().await, Some(false), "one leader");

    proxy.set_black_hole(true);
    let holed = tokio::time::Instant::now();
    // Sample both every 20 ms until the standby leads: the old leader must be gone (exited,
    // or at least no longer claiming leadership) in every sample where the standby leads.
    let end = holed + Duration::from_secs(30);
    let mut leader_gone = None;
    loop {
        let exited = leader.child.try_wait().expect("wait").is_some();
        let claims = !exited && leader.leader().await.unwrap_or(false);
        if !claims && leader_gone.is_none() {
            leader_gone = Some(holed.elapsed());
        }
        if standby.leader().await == Some(true) {
            assert!(
                !claims,
                "two leaders: the standby leads while the black-holed leader still does; log:\n{}",
                leader.log()
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "the standby took over within 30 s; leader log:\n{}",
            leader.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gone = leader_gone.expect("the old leader stopped first");
    eprintln!("black-holed leader stopped claiming after {gone:?}");
    let end = tokio::time::Instant::now() + WAIT;
    let exit = loop {
        if let Some(status) = leader.child.try_wait().expect("wait") {
            break status;
        }
        assert!(tokio::time::Instant::now() < end, "the old leader exits");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        !exit.success(),
        "the old leader exits with an error (lost the lease)"
    );
    assert!(leader.log().contains("lost the leader lease"), "{}", leader.log());
    proxy.set_black_hole(false);
}

/// `--metrics-auth delegated`: /metrics over HTTPS answers 401 without a token, 403 to a
/// ServiceAccount without `get` on the path, 200 to one with it (TokenReview +
/// SubjectAccessReview, as KCM's secure port); /healthz stays open. No token reaches the log.
#[tokio::test]
async fn metrics_behind_delegated_authentication_and_authorization() {
    use k8s_openapi::api::{
        core::v1::ServiceAccount,
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "metrics-auth")
        .await
        .expect("namespace");
    let client = ns.client();
    let pp = PostParams::default();
    for name in ["scraper", "nobody"] {
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        };
        ns.api::<ServiceAccount>()
            .create(&pp, &sa)
            .await
            .expect("service account");
    }
    let role_name = unique_name("metrics-reader");
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "metadata": {"name": role_name},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    }))
    .expect("role");
    Api::<ClusterRole>::all(client.clone())
        .create(&pp, &role)
        .await
        .expect("role");
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": role_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": ns.name()}]
    }))
    .expect("binding");
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&pp, &binding)
        .await
        .expect("binding");
    let scraper = common::service_account_token(cp, ns.name(), "scraper").await;
    let nobody = common::service_account_token(cp, ns.name(), "nobody").await;

    let process = Lazyquota::start_logging(cp.kubeconfig(), &["--metrics-auth", "delegated"], "debug");
    // curl -k: the certificate is the self-signed one made at start.
    let status = |path: &'static str, token: Option<String>| {
        let port = process.port;
        async move {
            let mut args = vec![
                "-ks".to_owned(),
                "--max-time".into(),
                "5".into(),
                "-o".into(),
                "/dev/null".into(),
                "-w".into(),
                "%{http_code}".into(),
            ];
            if let Some(token) = token {
                args.extend(["-H".into(), format!("Authorization: Bearer {token}")]);
            }
            args.push(format!("https://127.0.0.1:{port}{path}"));
            let out = tokio::process::Command::new("curl")
                .args(&args)
                .output()
                .await
                .ok()?;
            String::from_utf8_lossy(&out.stdout)
                .parse::<u16>()
                .ok()
                .filter(|c| *c != 0)
        }
    };
    let healthy = eventually(WAIT, || status("/healthz", None)).await;
    assert_eq!(
        healthy,
        Some(200),
        "/healthz needs no token; log:\n{}",
        process.log()
    );
    assert_eq!(status("/metrics", None).await, Some(401), "no token");
    assert_eq!(
        status("/metrics", Some("not-a-token".into())).await,
        Some(401),
        "a bad token"
    );
    assert_eq!(
        status("/metrics", Some(nobody.clone())).await,
        Some(403),
        "not allowed"
    );
    let allowed = eventually(WAIT, || async {
        (status("/metrics", Some(scraper.clone())).await == Some(200)).then_some(())
    })
    .await;
    assert!(
        allowed.is_some(),
        "the scraper may read /metrics; log:\n{}",
        process.log()
    );
    // Cached decisions answer the same.
    assert_eq!(status("/metrics", Some(nobody.clone())).await, Some(403));
    assert_eq!(status("/metrics", Some(scraper.clone())).await, Some(200));

    let log = process.log();
    drop(process);
    for token in [&scraper, &nobody] {
        assert!(
            !log.contains(token.as_str()),
            "a bearer token appears in the debug log"
        );
    }
    let _ = Api::<ClusterRoleBinding>::all(client.clone())
        .delete(&role_name, &DeleteParams::default())
        .await;
    let _ = Api::<ClusterRole>::all(client.clone())
        .delete(&role_name, &DeleteParams::default())
        .await;
    ns.delete().await.expect("delete namespace");
}

/// HTTP/2 is the default, and a connection carries at most `--http2-streams-per-connection`
/// streams: with 2, the quota, CRD and APIService watches and the watches of the five types a
/// quota constrains spread over at least four connections to the apiserver, and status writes
/// still go through (none queues behind the watches). With the default (64) they all share
/// one connection.
#[tokio::test]
async fn http2_streams_spread_over_connections_at_the_per_connection_limit() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let port = apiserver_port(cp).await;
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "spread")
        .await
        .expect("namespace");
    let quotas = ns.api::<ResourceQuota>();
    let keys = [
        "count/configmaps",
        "count/secrets",
        "services",
        "count/serviceaccounts",
        "persistentvolumeclaims",
    ];
    let hard: Vec<(&str, &str)> = keys.iter().map(|k| (*k, "10")).collect();
    quotas
        .create(&PostParams::default(), &quota("q", &hard))
        .await
        .expect("quota");
    let secrets = ns.api::<k8s_openapi::api::core::v1::Secret>();
    let secret = |name: &str| k8s_openapi::api::core::v1::Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Default::default()
    };

    for (per_connection, secret_name, count, want) in
        [("2", "one", "1", 4..usize::MAX), ("64", "two", "2", 1..2)]
    {
        let process = Lazyquota::start(
            cp.kubeconfig(),
            &["--http2-streams-per-connection", per_connection],
        );
        let pid = process.child.id();
        let all_keys = eventually(WAIT, || async {
            let q = quotas.get("q").await.ok()?;
            let used = q.status?.used?;
            keys.iter().all(|k| used.contains_key(*k)).then_some(())
        })
        .await;
        assert!(
            all_keys.is_some(),
            "every key computed with {per_connection} streams per connection"
        );
        secrets
            .create(&PostParams::default(), &secret(secret_name))
            .await
            .expect("secret");
        used_becomes(&quotas, "q", "count/secrets", count)
            .await
            .unwrap_or_else(|| {
                panic!("a status write went through with {per_connection} streams per connection")
            });
        let seen = eventually(WAIT, || async {
            let n = lazyquota_testenv::established_connections(pid, port);
            want.contains(&n).then_some(n)
        })
        .await;
        assert!(
            seen.is_some(),
            "{per_connection} streams per connection: {} connections to the apiserver, want {want:?}",
            lazyquota_testenv::established_connections(pid, port)
        );
        drop(process);
    }
    ns.delete().await.expect("delete namespace");
}

/// The port of `cp`'s apiserver (to count lazyquota's connections to it).
async fn apiserver_port(cp: &ControlPlane) -> u16 {
    cp.config()
        .await
        .expect("config")
        .cluster_url
        .port_u16()
        .expect("apiserver port")
}

/// A server that allows fewer concurrent HTTP/2 streams on one connection than lazyquota's
/// share (the Compacting control plane's apiserver: 8, against the default 64). hyper would
/// queue every request beyond the server's limit on the one connection, behind watches that
/// never end; lazyquota reads the server's limit at start and opens a new connection every 6
/// streams, so its 19 watches (16 namespaces' configmaps, quotas, CRDs, APIServices) all run
/// and every status write goes through.
#[tokio::test]
async fn a_server_allowing_fewer_streams_than_our_share_gets_more_connections_and_nothing_queues() {
    let cp = ControlPlane::get(Flavor::Compacting);
    let port = apiserver_port(cp).await;
    let mut namespaces = Vec::new();
    for _ in 0..16 {
        let ns = TestNamespace::create(Flavor::Compacting, "streams")
            .await
            .expect("namespace");
        ns.api::<ResourceQuota>()
            .create(&PostParams::default(), &quota("q", &[("count/configmaps", "10")]))
            .await
            .expect("quota");
        namespaces.push(ns);
    }
    let process = Lazyquota::start(cp.kubeconfig(), &["--namespace-watch-threshold", "100"]);
    let pid = process.child.id();
    for ns in &namespaces {
        // The value is the namespace's configmaps (KCM publishes kube-root-ca.crt in each);
        // what matters here is that the status write went through at all.
        let written = eventually(WAIT, || async {
            let used = ns.api::<ResourceQuota>().get("q").await.ok()?.status?.used?;
            used.contains_key("count/configmaps").then_some(())
        })
        .await;
        assert!(
            written.is_some(),
            "{}: status written (no request queued behind the watches); log:\n{}",
            ns.name(),
            process.log()
        );
    }
    let connections = eventually(WAIT, || async {
        let n = lazyquota_testenv::established_connections(pid, port);
        (n >= 4).then_some(n)
    })
    .await;
    assert!(
        connections.is_some(),
        "19 streams at 6 a connection: at least 4 connections, saw {}",
        lazyquota_testenv::established_connections(pid, port)
    );
    assert!(
        process
            .log()
            .contains("the server allows fewer HTTP/2 streams per connection"),
        "the lowered share is logged"
    );
    drop(process);
    for ns in namespaces {
        ns.delete().await.expect("delete namespace");
    }
}
