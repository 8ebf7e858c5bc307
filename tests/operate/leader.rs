//! Two replicas through the Lease: a standby takes over from a dead or black-holed leader, and
//! never leads at once with it.

use super::*;

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
