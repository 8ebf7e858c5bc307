//! Shadow mode next to KCM's own quota controller, on the parity fixtures (every scope and
//! resource-name family): lazyquota computes every quota and agrees with what KCM wrote, key
//! for key, and writes nothing.

mod common;

use std::time::Duration;

use common::{controller, test_config};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::ListParams;
use lazyquota_kube::controller::Config;
use lazyquota_testenv::{Flavor, TestNamespace, eventually, fixtures};

const SEEDS: u64 = 3;

#[tokio::test]
async fn shadow_mode_agrees_with_kcm_on_the_parity_fixtures() {
    // A short resync so lazyquota compares again after KCM's final writes.
    let config = Config {
        shadow: true,
        resync_period: Duration::from_secs(3),
        ..test_config()
    };
    let shadow = controller(Flavor::KcmQuota, config);
    let mut compared = 0;
    for seed in 1..=SEEDS {
        let ns = TestNamespace::create(Flavor::KcmQuota, &format!("shadow-{seed}"))
            .await
            .expect("namespace");
        let fixture = fixtures::populate(&ns, 1000 + seed).await.expect("fixture");
        fixture
            .wait_for_status(&ns, Duration::from_mins(1))
            .await
            .expect("KCM syncs the quotas");
        fixture
            .force_recalculation(&ns, Duration::from_mins(1))
            .await
            .expect("KCM recalculates");
        let before: Vec<ResourceQuota> = ns
            .api::<ResourceQuota>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;

        let keys: Vec<String> = fixture
            .quotas
            .iter()
            .map(|q| format!("default|{}/{q}", ns.name()))
            .collect();
        // Agreement: every quota compared, no key disagreeing, and every key lazyquota did not
        // compute (the fixtures name types no API serves, and keys no evaluator claims) absent
        // from KCM's status too — KCM computed none of them either. Such keys are reported
        // unknown, never "agree".
        let kcm_used = |name: &str| {
            before
                .iter()
                .find(|q| q.metadata.name.as_deref() == Some(name))
                .and_then(|q| q.status.as_ref()?.used.clone())
                .unwrap_or_default()
        };
        let agreed = eventually(Duration::from_mins(1), || async {
            let snapshot = shadow.get().await?;
            let compared = keys.iter().all(|k| snapshot.shadow_verdicts.contains_key(k));
            let disagree = snapshot.disagreements.keys().any(|(q, _)| keys.contains(q));
            let unknown_ok = snapshot
                .shadow_unknown
                .iter()
                .filter(|(q, _)| keys.contains(q))
                .all(|(q, key)| {
                    let name = q.rsplit('/').next().unwrap_or_default();
                    !kcm_used(name).contains_key(key)
                });
            (compared && !disagree && unknown_ok).then_some(())
        })
        .await;
        if agreed.is_none() {
            let snapshot = shadow.get().await.expect("controller");
            let mine: Vec<_> = snapshot
                .disagreements
                .iter()
                .filter(|((q, _), _)| keys.contains(q))
                .collect();
            let unknown: Vec<_> = snapshot
                .shadow_unknown
                .iter()
                .filter(|(q, _)| keys.contains(q))
                .collect();
            panic!("seed {seed}: shadow mode disagrees with KCM: {mine:#?}; keys not computed: {unknown:#?}");
        }
        compared += keys.len();

        // Shadow mode writes nothing: the quotas' resourceVersions are KCM's.
        let after: Vec<ResourceQuota> = ns
            .api::<ResourceQuota>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        for quota in &after {
            let was = before
                .iter()
                .find(|q| q.metadata.name == quota.metadata.name)
                .expect("same quotas");
            let stored = |q: &ResourceQuota| q.status.as_ref().and_then(|s| s.used.clone());
            assert_eq!(
                stored(quota),
                stored(was),
                "status.used changed while only KCM writes"
            );
        }
        fixture.release(&ns).await.expect("release fixture");
        ns.delete().await.expect("delete namespace");
    }
    eprintln!("shadow mode agreed with KCM on {compared} quotas over {SEEDS} seeds");
}
