//! Resource types that cannot be read, for fault tests and the fault benchmark: a CRD whose
//! conversion webhook does not answer, and an APIService whose backend is gone.

use k8s_openapi::{
    api::core::v1::Service, apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
};

/// The CRD `brokens.<group>` (kind `Broken`, namespaced): stored at v1, and v2 — the version
/// discovery prefers — needs the conversion webhook at `url` (https), so reading v2 fails
/// once an object is stored at v1 (writing at v1 needs no conversion).
///
/// # Panics
/// Never: the manifest is fixed.
pub fn broken_conversion_crd(group: &str, url: &str) -> CustomResourceDefinition {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("brokens.{group}")},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"plural": "brokens", "singular": "broken", "kind": "Broken"},
            "versions": [
                {"name": "v1", "served": true, "storage": true,
                 "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
                {"name": "v2", "served": true, "storage": false,
                 "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}
            ],
            "conversion": {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {"url": url}}}
        }
    }))
    .expect("a valid CRD")
}

/// The Service `ghost` (port 443) an APIService can name: with no pods, it has no endpoints.
///
/// # Panics
/// Never: the manifest is fixed.
pub fn ghost_service() -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "ghost"},
        "spec": {"ports": [{"port": 443, "protocol": "TCP"}]}
    }))
    .expect("a valid Service")
}

/// The APIService `v1alpha1.<group>` served by [`ghost_service`] in `namespace`: aggregated
/// discovery lists its group as `Stale`.
///
/// # Panics
/// Never: the manifest is fixed.
pub fn ghost_apiservice(group: &str, namespace: &str) -> APIService {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("v1alpha1.{group}")},
        "spec": {"group": group, "version": "v1alpha1", "groupPriorityMinimum": 1000,
                 "versionPriority": 15, "insecureSkipTLSVerify": true,
                 "service": {"namespace": namespace, "name": "ghost", "port": 443}}
    }))
    .expect("a valid APIService")
}
