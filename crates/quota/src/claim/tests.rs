//! Tests of the resourceclaims evaluator: claims and device classes to the keys they charge.

use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceRequest, DeviceSubRequest, ExactDeviceRequest, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::*;

fn exact(class: &str, mode: &str, count: Option<i64>) -> DeviceRequest {
    DeviceRequest {
        name: "r".into(),
        exactly: Some(ExactDeviceRequest {
            device_class_name: class.into(),
            allocation_mode: Some(mode.into()),
            count,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn first_available(subs: &[(&str, &str, Option<i64>)]) -> DeviceRequest {
    DeviceRequest {
        name: "fa".into(),
        first_available: Some(
            subs.iter()
                .map(|(class, mode, count)| DeviceSubRequest {
                    name: "s".into(),
                    device_class_name: (*class).into(),
                    allocation_mode: Some((*mode).into()),
                    count: *count,
                    ..Default::default()
                })
                .collect(),
        ),
        ..Default::default()
    }
}

fn claim(name: &str, requests: Vec<DeviceRequest>) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests),
                ..Default::default()
            }),
        }),
        status: None,
    }
}

fn project(c: &ResourceClaim) -> ClaimProjection {
    ClaimProjection::from_claim(c, &Interner::new(), &|name| name.len() as u64)
}

fn get(list: &ResourceList, key: &str) -> Option<String> {
    list.get(key).map(|q| q.to_k8s().0)
}

#[test]
fn devices_are_charged_per_class_with_worst_cases() {
    let c = claim(
        "c",
        vec![
            exact("gpu", "ExactCount", Some(2)),
            exact("gpu", "ExactCount", Some(1)),
            exact("fpga", "All", None),
            exact("nic", "SomeFutureMode", Some(5)),
            first_available(&[
                ("gpu", "ExactCount", Some(4)),
                ("gpu", "ExactCount", Some(1)),
                ("tpu", "ExactCount", Some(2)),
            ]),
        ],
    );
    let used = claim_usage(
        &project(&c),
        FeatureGates::for_minor(35),
        &DeviceClassMap::new(),
        None,
    );
    assert_eq!(get(&used, COUNT_RESOURCE_CLAIMS).as_deref(), Some("1"));
    assert_eq!(
        get(&used, "gpu.deviceclass.resource.k8s.io/devices").as_deref(),
        Some("7")
    );
    assert_eq!(
        get(&used, "fpga.deviceclass.resource.k8s.io/devices").as_deref(),
        Some("32")
    );
    assert_eq!(
        get(&used, "tpu.deviceclass.resource.k8s.io/devices").as_deref(),
        Some("2")
    );
    assert_eq!(
        get(&used, "nic.deviceclass.resource.k8s.io/devices").as_deref(),
        Some("0")
    );
    // DRAExtendedResource is off in 1.35: no requests.* keys.
    assert!(used.keys().all(|k| !k.starts_with("requests.")), "{used:?}");
}

#[test]
fn extended_resource_keys_follow_the_device_class_mapping() {
    let mut classes = DeviceClassMap::new();
    classes.apply("gpu", Some("example.com/gpu"));
    classes.apply("fpga", None);
    let c = claim(
        "c",
        vec![
            exact("gpu", "ExactCount", Some(2)),
            exact("fpga", "ExactCount", Some(1)),
        ],
    );
    let used = claim_usage(&project(&c), FeatureGates::for_minor(36), &classes, None);
    assert_eq!(
        get(&used, "requests.deviceclass.resource.kubernetes.io/gpu").as_deref(),
        Some("2")
    );
    assert_eq!(
        get(&used, "requests.deviceclass.resource.kubernetes.io/fpga").as_deref(),
        Some("1")
    );
    assert_eq!(get(&used, "requests.example.com/gpu").as_deref(), Some("2"));

    let gates = FeatureGates::for_minor(36);
    assert!(claim_matches_key(
        "requests.deviceclass.resource.kubernetes.io/gpu",
        gates,
        &classes
    ));
    // A class without an extended resource name still answers to its implicit name.
    assert!(claim_matches_key(
        "requests.deviceclass.resource.kubernetes.io/fpga",
        gates,
        &classes
    ));
    assert!(!claim_matches_key(
        "requests.deviceclass.resource.kubernetes.io/none",
        gates,
        &classes
    ));
    assert!(claim_matches_key("requests.example.com/gpu", gates, &classes));
    assert!(!claim_matches_key("requests.example.com/other", gates, &classes));
    assert!(!claim_matches_key(
        "requests.example.com/gpu",
        FeatureGates::for_minor(35),
        &classes
    ));
    assert!(claim_matches_key(
        "x.deviceclass.resource.k8s.io/devices",
        FeatureGates::for_minor(34),
        &classes
    ));
}

fn owned(name: &str, uid: &str, created: i64) -> ClaimProjection {
    let mut c = claim(name, vec![exact("gpu", "ExactCount", Some(2))]);
    c.metadata.annotations =
        Some([(EXTENDED_RESOURCE_CLAIM_ANNOTATION.to_owned(), "true".to_owned())].into());
    c.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(created).unwrap(),
    ));
    c.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: "p".into(),
        uid: uid.into(),
        controller: Some(true),
        ..Default::default()
    }]);
    project(&c)
}

#[test]
fn a_verified_claim_is_charged_only_beyond_its_pods_own_charge() {
    let mut classes = DeviceClassMap::new();
    classes.apply("gpu", Some("example.com/gpu"));
    let c = owned("c", "u1", 100);
    assert_eq!(c.owner().unwrap().pod_id(false), 1, "the caller's id of pod p");
    assert_eq!(c.owner().unwrap().pod_id(true), 2, "and of /p");
    let pod_usage: ResourceList = [("requests.example.com/gpu".to_owned(), Quantity::from_count(2))].into();
    let used = claim_usage(&c, FeatureGates::for_minor(36), &classes, Some(&pod_usage));
    assert_eq!(
        get(&used, "requests.example.com/gpu"),
        None,
        "fully charged by the pod"
    );
    assert_eq!(
        get(&used, "requests.deviceclass.resource.kubernetes.io/gpu").as_deref(),
        Some("2")
    );
    assert_eq!(
        get(&used, "gpu.deviceclass.resource.k8s.io/devices").as_deref(),
        Some("2")
    );
}

#[test]
fn only_the_pods_own_first_claim_is_verified() {
    let gates = FeatureGates::for_minor(36);
    let pod = |claim| PodClaimIdentity {
        uid: "u1",
        extended_resource_claim: claim,
    };
    let a = owned("a", "u1", 100);
    let b = owned("b", "u1", 100);
    let early = owned("z", "u1", 50);
    assert!(verified_owner(&a, Some(pod(None)), [&a, &b], gates));
    assert!(
        !verified_owner(&b, Some(pod(None)), [&a, &b], gates),
        "same time, larger name"
    );
    assert!(
        !verified_owner(&a, Some(pod(None)), [&a, &early], gates),
        "an earlier sibling"
    );
    assert!(
        verified_owner(&a, Some(pod(None)), [&a, &early], FeatureGates::for_minor(35)),
        "no rule before 1.36"
    );
    assert!(
        verified_owner(&b, Some(pod(Some("b"))), [&a, &b], gates),
        "the status names it"
    );
    assert!(!verified_owner(&a, Some(pod(Some("b"))), [&a, &b], gates));
    assert!(
        !verified_owner(&owned("a", "other", 1), Some(pod(None)), [], gates),
        "uid differs"
    );
    assert!(!verified_owner(&a, None, [], gates), "no such pod");
    let plain = project(&claim("x", vec![]));
    assert!(
        !verified_owner(&plain, Some(pod(None)), [], gates),
        "not an extended-resource claim"
    );
}
