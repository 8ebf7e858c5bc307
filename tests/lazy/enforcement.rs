//! What lazyquota writes is what admission enforces: deletes free quota, absurd values and
//! ten thousand keys break nothing, huge quantities count exactly or are withheld.

use super::*;

/// Admission enforces the status lazyquota writes, and a delete frees the quota again.
#[tokio::test]
async fn admission_enforces_our_status_and_deletes_free_quota() {
    let _snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "pods")
        .await
        .expect("namespace");
    default_service_account(&ns).await;
    let quotas = ns.api::<ResourceQuota>();
    quotas
        .create(
            &PostParams::default(),
            &quota(
                "compute",
                &[("pods", "5"), ("requests.cpu", "1"), ("limits.memory", "1Gi")],
            ),
        )
        .await
        .expect("quota");
    used_becomes(&quotas, "compute", "requests.cpu", "0")
        .await
        .expect("initial usage written");

    let pods = ns.api::<Pod>();
    pods.create(&PostParams::default(), &pod("a", "600m"))
        .await
        .expect("first pod fits");
    let err = pods
        .create(&PostParams::default(), &pod("b", "600m"))
        .await
        .expect_err("second pod exceeds requests.cpu");
    assert!(err.to_string().contains("exceeded quota: compute"), "{err}");
    used_becomes(&quotas, "compute", "requests.cpu", "600m")
        .await
        .expect("usage charged");

    pods.delete("a", &DeleteParams::default())
        .await
        .expect("delete pod");
    used_becomes(&quotas, "compute", "requests.cpu", "0")
        .await
        .expect("the delete freed the quota");
    used_becomes(&quotas, "compute", "pods", "0")
        .await
        .expect("pods lowered");
    // Quota admission reads quotas from its own informer, which may lag the status just read
    // by a moment: retried briefly while it still refuses for the old value.
    let fits = eventually(Duration::from_secs(5), || async {
        match pods.create(&PostParams::default(), &pod("b", "600m")).await {
            Ok(_) => Some(Ok(())),
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("exceeded quota") => None,
            Err(e) => Some(Err(e)),
        }
    })
    .await;
    fits.expect("admission saw the freed quota within 5 s")
        .expect("now the pod fits");
    used_becomes(&quotas, "compute", "limits.memory", "64Mi")
        .await
        .expect("limits counted");
    ns.delete().await.expect("delete namespace");
}

/// Bad input loses nothing: a quota with absurd values and 10,000 hard keys is computed (the
/// keys no evaluator knows stay absent), and a quota next to it keeps working.
#[tokio::test]
async fn absurd_values_and_ten_thousand_keys_break_nothing() {
    let snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "absurd")
        .await
        .expect("namespace");
    let quotas = ns.api::<ResourceQuota>();
    let mut hard: Vec<(String, String)> = (0..10_000)
        .map(|i| (format!("example.com/unknown-{i}"), "1".to_owned()))
        .collect();
    hard.push(("count/configmaps".into(), "1e18".into()));
    hard.push(("requests.cpu".into(), "999999999999999999".into()));
    hard.push(("limits.memory".into(), "8Ei".into()));
    let hard_refs: Vec<(&str, &str)> = hard.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    quotas
        .create(&PostParams::default(), &quota("huge", &hard_refs))
        .await
        .expect("the apiserver accepts it");
    quotas
        .create(
            &PostParams::default(),
            &quota("plain", &[("count/configmaps", "10")]),
        )
        .await
        .expect("plain");

    used_becomes(&quotas, "huge", "count/configmaps", "1")
        .await
        .expect("computed despite 10,000 keys");
    used_becomes(&quotas, "huge", "requests.cpu", "0")
        .await
        .expect("absurd limit, ordinary usage");
    used_becomes(&quotas, "plain", "count/configmaps", "1")
        .await
        .expect("the other quota is unaffected");
    let q = quotas.get("huge").await.expect("quota");
    let used = q.status.and_then(|s| s.used).unwrap_or_default();
    assert!(
        !used.keys().any(|k| k.starts_with("example.com/")),
        "keys no evaluator computes stay absent"
    );
    common::create_configmap(&ns, "one-more").await;
    used_becomes(&quotas, "plain", "count/configmaps", "2")
        .await
        .expect("still charged by admission");
    assert!(snapshots.get().await.is_some(), "the controller is alive");
    ns.delete().await.expect("delete namespace");
}

/// Tenants choose quantities, and the apiserver accepts `memory: 1e30` (KCM sums it with
/// arbitrary precision). Every pod counts in `pods` and `count/pods`, memory sums exactly far
/// beyond 64 bits (checked after a delete, which admission cannot compute), and a pod beyond
/// what lazyquota holds exactly (`1e2000`) makes only its key withheld — removed from
/// status.used with an Event, so admission refuses to charge it — never written lower; the
/// other keys stay exact, and the key is computed again once that pod is gone.
#[tokio::test]
async fn huge_quantities_count_exactly_and_beyond_range_keys_are_withheld() {
    let snapshots = controller(Flavor::LazyquotaOnly, test_config());
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "huge")
        .await
        .expect("namespace");
    default_service_account(&ns).await;
    let pods = ns.api::<Pod>();
    let pp = PostParams::default();
    // Created before any quota: admission would refuse it under requests.memory=1E40.
    pods.create(&pp, &memory_pod("beyond", "1e2000"))
        .await
        .expect("the apiserver accepts 1e2000");
    let quotas = ns.api::<ResourceQuota>();
    let hard = [("pods", "10"), ("count/pods", "10"), ("requests.memory", "1E40")];
    quotas.create(&pp, &quota("mem", &hard)).await.expect("quota");
    used_becomes(&quotas, "mem", "pods", "1")
        .await
        .expect("the pod beyond range counts in pods");
    used_becomes(&quotas, "mem", "count/pods", "1")
        .await
        .expect("and in count/pods");
    let event = common::event_with(&ns, "UsageWithheld", "requests.memory", WAIT).await;
    assert!(event.is_some(), "an Event names the withheld key");
    let q = quotas.get("mem").await.expect("quota");
    assert!(
        !q.status
            .and_then(|s| s.used)
            .unwrap_or_default()
            .contains_key("requests.memory"),
        "the unknown key is withheld, not written lower"
    );
    // Admission's own refusal of a key with no used ("status unknown for quota"), not any
    // error: its quota cache may lag the status just read by a moment, so a refusal for
    // another reason is tried again, briefly.
    let mut refusal = None;
    for _ in 0..50 {
        match pods.create(&pp, &memory_pod("refused", "1Mi")).await {
            Ok(_) => panic!("admission charged a withheld key"),
            Err(kube::Error::Api(s))
                if s.code == 403 && s.message.contains("status unknown for quota: mem") =>
            {
                refusal = Some(s.message);
                break;
            }
            Err(other) => {
                refusal = None;
                eprintln!("not yet admission's refusal of the withheld key: {other}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
    assert!(
        refusal.is_some(),
        "admission refuses to charge a withheld key (status unknown for quota: mem)"
    );

    pods.delete("beyond", &DeleteParams::default())
        .await
        .expect("delete");
    used_becomes(&quotas, "mem", "requests.memory", "0")
        .await
        .expect("computed again once the pod is gone");
    // Admission reads quotas from the apiserver's cache, which can lag the status just read
    // by a moment: until it has the written requests.memory it answers "status unknown".
    let small = eventually(WAIT, || {
        let pods = pods.clone();
        async move {
            pods.create(&PostParams::default(), &memory_pod("small", "64Mi"))
                .await
                .ok()
        }
    })
    .await;
    assert!(small.is_some(), "small: admitted once the key is written again");
    for i in 0..4 {
        pods.create(&pp, &memory_pod(&format!("big-{i}"), "1e30"))
            .await
            .expect("1e30 fits under 1E40");
    }
    pods.delete("big-0", &DeleteParams::default())
        .await
        .expect("delete");
    used_becomes(&quotas, "mem", "pods", "4")
        .await
        .expect("every pod counts, also at 1e30");
    if used_value_becomes(
        &quotas,
        "mem",
        "requests.memory",
        "3000000000000000000000067108864",
    )
    .await
    .is_none()
    {
        let status = quotas.get("mem").await.ok().and_then(|q| q.status);
        panic!("memory summed exactly: 3e30 + 64Mi; status {status:?}");
    }
    let snapshot = snapshots.get().await.expect("alive");
    assert!(snapshot.withheld.is_empty(), "nothing withheld any more");
    ns.delete().await.expect("delete namespace");
}
