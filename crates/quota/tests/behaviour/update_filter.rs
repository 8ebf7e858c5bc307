//! Which object updates change usage (the update filter), case by case.

use super::*;

#[test]
fn update_filter_table() {
    let base = |extra: Value, status: Value| {
        let mut spec = json!({"containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}}}]});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        json!({"metadata": {"name": "p"}, "spec": spec, "status": status})
    };
    let with_status_resources = |cpu: Option<&str>| {
        let mut cs = json!({"name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0});
        if let Some(cpu) = cpu {
            cs["resources"] = json!({"requests": {"cpu": cpu}});
        }
        base(json!({}), json!({"phase": "Running", "containerStatuses": [cs]}))
    };
    let deleting = |grace_end: i64| {
        let mut p = base(json!({}), json!({"phase": "Running"}));
        p["metadata"]["deletionTimestamp"] = json!(
            k8s_openapi::jiff::Timestamp::from_second(grace_end - 30)
                .unwrap()
                .to_string()
        );
        p["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        p
    };
    let running = base(json!({}), json!({"phase": "Running"}));
    let rows: Vec<(&str, Value, Value, bool)> = vec![
        ("no change", running.clone(), running.clone(), false),
        (
            "charged -> Succeeded",
            running.clone(),
            base(json!({}), json!({"phase": "Succeeded"})),
            true,
        ),
        (
            "charged -> Failed",
            running.clone(),
            base(json!({}), json!({"phase": "Failed"})),
            true,
        ),
        (
            "Succeeded -> Succeeded",
            base(json!({}), json!({"phase": "Succeeded"})),
            base(json!({}), json!({"phase": "Succeeded"})),
            false,
        ),
        (
            "deletion started, grace not over",
            running.clone(),
            deleting(NOW + 10),
            false,
        ),
        (
            "deletion past grace at event time",
            running.clone(),
            deleting(NOW - 10),
            true,
        ),
        (
            "activeDeadlineSeconds set: Terminating flips",
            running.clone(),
            base(json!({"activeDeadlineSeconds": 60}), json!({"phase": "Running"})),
            true,
        ),
        (
            "status resources appear for the first time",
            with_status_resources(None),
            with_status_resources(Some("1")),
            true,
        ),
        (
            "status resources change",
            with_status_resources(Some("1")),
            with_status_resources(Some("2")),
            true,
        ),
        (
            "status resources equal by value",
            with_status_resources(Some("1")),
            with_status_resources(Some("1000m")),
            false,
        ),
        (
            "new container status without resources",
            running.clone(),
            with_status_resources(None),
            false,
        ),
        (
            "new container status with resources",
            running.clone(),
            with_status_resources(Some("1")),
            true,
        ),
        (
            "spec request change alone does not trigger",
            running.clone(),
            base(
                json!({"containers": [{"name": "app", "resources": {"requests": {"cpu": "2"}}}]}),
                json!({"phase": "Running"}),
            ),
            false,
        ),
    ];
    let now = Time::from_unix_seconds(NOW);
    for (rule, old, new, expected) in rows {
        let (old, new) = (pod_projection(old), pod_projection(new));
        assert_eq!(
            pod_update_triggers(&old, &new, now, gates()),
            expected,
            "pods: {rule}"
        );
    }
    let mut no_ippvs = gates();
    no_ippvs.in_place_pod_vertical_scaling = false;
    let interner = Interner::new();
    let project = |v: Value| {
        PodProjection::from_pod(&serde_json::from_value::<Pod>(v).unwrap(), no_ippvs, &interner)
            .strict()
            .unwrap()
    };
    assert!(!pod_update_triggers(
        &project(with_status_resources(Some("1"))),
        &project(with_status_resources(Some("2"))),
        now,
        no_ippvs
    ));

    let svc = |spec: Value| {
        ServiceProjection::from_service(
            &serde_json::from_value::<Service>(json!({"metadata": {}, "spec": spec})).unwrap(),
        )
    };
    let rows = vec![
        (
            "ClusterIP -> NodePort",
            json!({"type": "ClusterIP"}),
            json!({"type": "NodePort"}),
            true,
        ),
        (
            "NodePort -> LoadBalancer",
            json!({"type": "NodePort"}),
            json!({"type": "LoadBalancer"}),
            true,
        ),
        (
            "ClusterIP -> ExternalName (both untracked)",
            json!({"type": "ClusterIP"}),
            json!({"type": "ExternalName"}),
            false,
        ),
        (
            "port count change does not trigger",
            json!({"type": "NodePort", "ports": [{"port": 1}]}),
            json!({"type": "NodePort", "ports": [{"port": 1}, {"port": 2}]}),
            false,
        ),
        (
            "allocateLoadBalancerNodePorts change does not trigger",
            json!({"type": "LoadBalancer"}),
            json!({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false}),
            false,
        ),
    ];
    for (rule, old, new, expected) in rows {
        assert_eq!(
            service_update_triggers(&svc(old), &svc(new)),
            expected,
            "services: {rule}"
        );
    }
    let claim = PvcProjection::from_pvc(&PersistentVolumeClaim::default(), &interner)
        .strict()
        .unwrap();
    assert!(
        pvc_update_triggers(&claim, &claim),
        "PVC updates always trigger (pointer comparison bug)"
    );
}
