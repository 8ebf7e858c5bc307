//! Proves the test control plane is a real Kubernetes: the ResourceQuota admission plugin in
//! kube-apiserver enforces `count/configmaps`, and KCM's quota controller fills `status.used`.

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{ConfigMap, ResourceQuota, ResourceQuotaSpec},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::api::{ListParams, ObjectMeta, PostParams};
use lazyquota_testenv::{ControlPlane, Flavor, TestNamespace, eventually};

fn configmap(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

#[tokio::test]
async fn admission_enforces_count_quota_that_kcm_accounts() {
    let ns = TestNamespace::create(Flavor::KcmQuota, "cp-real")
        .await
        .expect("namespace");
    let quotas = ns.api::<ResourceQuota>();
    let configmaps = ns.api::<ConfigMap>();

    // The root-CA publisher puts kube-root-ca.crt into every new namespace. Upstream's quota
    // controller does not recompute on adds (admission charges creates), so a quota created
    // while that ConfigMap is racing in would stay stale until the 5-minute resync: wait for it.
    eventually(Duration::from_secs(30), || async {
        configmaps.get_opt("kube-root-ca.crt").await.ok().flatten()
    })
    .await
    .expect("the root CA ConfigMap is published");

    let quota = |hard: &str| ResourceQuota {
        metadata: ObjectMeta {
            name: Some("count-configmaps".into()),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some([("count/configmaps".to_owned(), Quantity(hard.into()))].into()),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    };
    quotas
        .create(&PostParams::default(), &quota("3"))
        .await
        .expect("create quota");
    eventually(Duration::from_mins(1), || async {
        quotas
            .get("count-configmaps")
            .await
            .ok()?
            .status?
            .used?
            .get("count/configmaps")
            .map(|_| ())
    })
    .await
    .expect("KCM's quota controller fills status.used");
    // A spec.hard change makes KCM recompute, now over a settled informer cache.
    quotas
        .replace("count-configmaps", &PostParams::default(), &{
            let mut q = quotas.get("count-configmaps").await.expect("quota");
            q.spec = quota("2").spec;
            q
        })
        .await
        .expect("lower the limit to 2");

    // KCM fills status.used with the number of ConfigMaps that exist.
    let used = eventually(Duration::from_mins(1), || async {
        let q = quotas.get("count-configmaps").await.ok()?;
        let status = q.status?;
        let hard = status.hard?.get("count/configmaps")?.0.clone();
        let used = status.used?.get("count/configmaps")?.0.clone();
        let actual = configmaps.list(&ListParams::default()).await.ok()?.items.len();
        (hard == "2" && used == actual.to_string()).then_some(actual)
    })
    .await
    .expect("KCM's quota controller fills status.used with the ConfigMap count");
    assert!(
        used <= 2,
        "a fresh namespace holds at most the root CA ConfigMap, found {used}"
    );

    // Admission charges each create; the one that would exceed 2 is rejected.
    for i in used..2 {
        configmaps
            .create(&PostParams::default(), &configmap(&format!("cm-{i}")))
            .await
            .expect("within quota");
    }
    let err = configmaps
        .create(&PostParams::default(), &configmap("one-too-many"))
        .await
        .expect_err("the third ConfigMap must be rejected by the ResourceQuota admission plugin");
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(
                status.message.contains("exceeded quota: count-configmaps"),
                "{}",
                status.message
            );
            assert!(
                status.message.contains("count/configmaps=2"),
                "{}",
                status.message
            );
        }
        other => panic!("expected a 403 from admission, got {other}"),
    }

    ns.delete().await.expect("delete namespace");
}

/// KCM's quota controller is switchable: its work queue shows in KCM's `/metrics` only where
/// it runs. This is what lets lazyquota be the only writer in the lazyquota-only flavour.
#[tokio::test]
async fn kcm_quota_controller_is_switchable_and_kcm_metrics_are_readable() {
    let queue = "name=\"resourcequota_primary\"";
    // KCM serves /metrics before it has started every controller (a controller's queue shows
    // once the controller is constructed): wait for the namespace controller's queue, which
    // both flavours run, before looking for the quota controller's.
    let settled = |flavor: Flavor, want_quota: bool| async move {
        eventually(Duration::from_mins(1), || async move {
            let metrics = ControlPlane::get(flavor).kcm_metrics().await.ok()?;
            let ready = metrics.contains("workqueue_adds_total") && metrics.contains("name=\"namespace\"");
            (ready && (!want_quota || metrics.contains(queue))).then_some(metrics)
        })
        .await
    };
    let with = settled(Flavor::KcmQuota, true).await;
    assert!(
        with.is_some(),
        "KCM with its quota controller shows no resourcequota_primary queue within 60 s"
    );
    let without = settled(Flavor::LazyquotaOnly, false)
        .await
        .expect("KCM /metrics (quota off) with its namespace controller's queue");
    assert!(
        !without.contains(queue),
        "KCM runs its quota controller in the lazyquota-only flavour"
    );
}

/// `start.sh` run twice on one state directory (`make demo` twice) stops the first control
/// plane before starting the second: none of its processes is left running. (It used to call
/// `stop.sh` directly, which had no execute bit, and hid the "Permission denied".)
#[test]
fn starting_twice_on_one_directory_stops_the_first_control_plane() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root
        .join(".lazyquota")
        .join(lazyquota_testenv::unique_name("twice"));
    let start = || {
        let out = std::process::Command::new("bash")
            .arg(root.join("tests/control-plane/start.sh"))
            .env("LAZYQUOTA_CP_DIR", &dir)
            .env("LAZYQUOTA_KCM", "off")
            .output()
            .expect("start.sh");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let pids = || -> Vec<u32> {
        ["etcd", "kube-apiserver"]
            .iter()
            .filter_map(|c| std::fs::read_to_string(dir.join(format!("{c}.pid"))).ok())
            .filter_map(|p| p.trim().parse().ok())
            .collect()
    };
    start();
    let first = pids();
    assert_eq!(first.len(), 2, "etcd and kube-apiserver started");
    start();
    let alive =
        |pid: &u32| std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z"));
    let left: Vec<&u32> = first.iter().filter(|p| alive(p)).collect();
    let stopped = std::process::Command::new("bash")
        .arg(root.join("tests/control-plane/stop.sh"))
        .arg(&dir)
        .status();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(left.is_empty(), "the first control plane's {left:?} still run");
    assert!(stopped.is_ok_and(|s| s.success()), "stop.sh");
}
