//! The admin server behind delegated authentication, HTTP/2 streams spread over connections,
//! and the process's start-up code unmapped once it is ready.

use super::*;

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

/// The `RssFile:` of a process, in KiB.
fn rss_file_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("RssFile:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("RssFile")
}

/// Once ready, lazyquota drops its executable's pages from its page tables (src/pages.rs):
/// its file-backed resident memory falls, and it goes on counting and writing, running code it
/// faults back in from the page cache. With `--keep-startup-pages` nothing is dropped.
#[tokio::test]
async fn the_start_up_code_is_unmapped_once_ready_and_the_controller_goes_on() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = ControlPlane::get(Flavor::LazyquotaOnly);
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "pages")
        .await
        .expect("namespace");
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(&PostParams::default(), &quota("q", &[("count/secrets", "10")]))
        .await
        .expect("quota");
    let dropped = "dropped the executable's start-up pages";
    let keeping = Lazyquota::start(cp.kubeconfig(), &["--keep-startup-pages"]);
    let process = Lazyquota::start(cp.kubeconfig(), &[]);
    used_becomes(&quotas, "q", "count/secrets", "0")
        .await
        .expect("the quota computed");
    let before = rss_file_kib(process.child.id());
    let logged = eventually(Duration::from_mins(1), || async {
        process.log().contains(dropped).then_some(())
    })
    .await;
    assert!(logged.is_some(), "no drop logged: {}", process.log());
    let after = rss_file_kib(process.child.id());
    assert!(
        after < before,
        "file-backed RSS {before} KiB when ready, {after} KiB after the drop"
    );
    assert!(
        !keeping.log().contains(dropped),
        "--keep-startup-pages dropped them: {}",
        keeping.log()
    );
    drop(keeping);
    ns.api::<k8s_openapi::api::core::v1::Secret>()
        .create(&PostParams::default(), &secret("after-the-drop"))
        .await
        .expect("secret");
    used_becomes(&quotas, "q", "count/secrets", "1")
        .await
        .expect("the secret counted after the drop");
    ns.delete().await.expect("delete namespace");
}
