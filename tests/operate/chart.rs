//! The rendered chart and its ServiceAccount: enough for the whole job and no more; a real
//! Prometheus scrapes it.

use super::*;

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
        .create(&PostParams::default(), &secret("one"))
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
