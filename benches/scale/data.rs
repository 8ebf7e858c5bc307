//! The benchmark's data: namespaces, pods, services, PVCs, CRDs and their objects, and the
//! quotas that constrain them.

use std::time::{Duration, Instant};

use futures::{StreamExt as _, stream};
use k8s_openapi::{
    api::core::v1::{Namespace, PersistentVolumeClaim, Pod, ResourceQuota, Service, ServiceAccount},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::api::resource::Quantity as K8sQuantity,
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ObjectMeta, PostParams},
};

use crate::plan::Args;

/// The objects the benchmark creates, and what the quotas must then say.
pub(crate) struct Data {
    pub(crate) namespaces: Vec<String>,
    pub(crate) group: String,
    pub(crate) pods_per_ns: usize,
    pub(crate) services_per_ns: usize,
    pub(crate) pvcs_per_ns: usize,
    pub(crate) objects_per_crd_per_ns: usize,
    pub(crate) constrained: usize,
}

/// Quotas by name: what `spec.hard` sets and what `status.used` must then say.
pub(crate) type Quotas = Vec<(String, Vec<(String, String)>, Vec<(String, String)>)>;

pub(crate) fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..ObjectMeta::default()
    }
}

pub(crate) fn crd_plural(i: usize) -> String {
    format!("bindings{i}s")
}

impl Data {
    pub(crate) async fn create(client: &Client, args: &Args) -> Self {
        let t = Instant::now();
        let namespaces: Vec<String> = (0..args.namespaces).map(|i| format!("bench-{i}")).collect();
        for ns in &namespaces {
            let _ = Api::<Namespace>::all(client.clone())
                .create(
                    &PostParams::default(),
                    &Namespace {
                        metadata: meta(ns),
                        ..Namespace::default()
                    },
                )
                .await;
            let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
            while accounts.get_opt("default").await.ok().flatten().is_none() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let data = Self {
            group: "scale.lazyquota.test".into(),
            pods_per_ns: args.pods / args.namespaces,
            services_per_ns: args.services / args.namespaces,
            pvcs_per_ns: args.pvcs / args.namespaces,
            objects_per_crd_per_ns: (args.objects_per_crd / args.namespaces).max(1),
            constrained: args.constrained,
            namespaces,
        };
        let mut creates = Vec::new();
        for ns in &data.namespaces {
            for i in 0..data.pods_per_ns {
                creates.push((ns.clone(), "pod", i));
            }
            for i in 0..data.services_per_ns {
                creates.push((ns.clone(), "svc", i));
            }
            for i in 0..data.pvcs_per_ns {
                creates.push((ns.clone(), "pvc", i));
            }
        }
        stream::iter(creates)
            .map(|(ns, kind, i)| {
                let client = client.clone();
                async move { create_core(&client, &ns, kind, i).await }
            })
            .buffer_unordered(32)
            .collect::<Vec<()>>()
            .await;
        eprintln!(
            "scale: {} pods, {} services, {} PVCs created in {:?}",
            args.pods,
            args.services,
            args.pvcs,
            t.elapsed()
        );
        data
    }

    pub(crate) fn resource(&self, i: usize) -> ApiResource {
        ApiResource {
            group: self.group.clone(),
            version: "v1".into(),
            api_version: format!("{}/v1", self.group),
            kind: format!("Binding{i}"),
            plural: crd_plural(i),
        }
    }

    pub(crate) async fn create_crds(&self, client: &Client, from: usize, to: usize) {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for i in from..to {
            let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("{}.{}", crd_plural(i), self.group)},
                "spec": {"group": self.group, "scope": "Namespaced",
                    "names": {"plural": crd_plural(i), "singular": format!("bindings{i}"), "kind": format!("Binding{i}")},
                    "versions": [{"name": "v1", "served": true, "storage": true,
                        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
            }))
            .expect("CRD");
            let _ = crds.create(&PostParams::default(), &crd).await;
        }
        // Objects can be created once each CRD is served.
        let mut creates = Vec::new();
        for i in from..to {
            for ns in &self.namespaces {
                for j in 0..self.objects_per_crd_per_ns {
                    creates.push((i, ns.clone(), j));
                }
            }
        }
        stream::iter(creates)
            .map(|(i, ns, j)| {
                let client = client.clone();
                let resource = self.resource(i);
                async move {
                    let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &resource);
                    let object = DynamicObject::new(&format!("o{j}"), &resource).within(&ns);
                    for _ in 0..300 {
                        match api.create(&PostParams::default(), &object).await {
                            Ok(_) => return,
                            Err(kube::Error::Api(s)) if s.code == 409 => return,
                            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await, // not served yet
                        }
                    }
                    panic!("could not create {}/{ns}/o{j}", resource.plural);
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<()>>()
            .await;
    }

    /// Gives each CRD that a new-quota sample will name `--new-crd-objects` more objects in
    /// that sample's namespace (only for CRDs created in this step).
    pub(crate) async fn grow_new_crds(&self, client: &Client, args: &Args, from: usize, to: usize) {
        let creates: Vec<(usize, String, usize)> = (0..args.new_quota_samples)
            .map(|j| (self.constrained + j, j))
            .filter(|(i, _)| (from..to).contains(i))
            .flat_map(|(i, j)| {
                let ns = self.namespaces[j % self.namespaces.len()].clone();
                (0..args.new_crd_objects).map(move |k| (i, ns.clone(), k))
            })
            .collect();
        stream::iter(creates)
            .map(|(i, ns, k)| {
                let client = client.clone();
                let resource = self.resource(i);
                async move {
                    let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &resource);
                    let object = DynamicObject::new(&format!("x{k}"), &resource).within(&ns);
                    match api.create(&PostParams::default(), &object).await {
                        Ok(_) | Err(kube::Error::Api(_)) => {}
                        Err(e) => panic!("creating {}/{ns}/x{k}: {e}", resource.plural),
                    }
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<()>>()
            .await;
    }

    /// The quotas of one namespace when `crds` CRDs exist, and what status.used must say.
    pub(crate) fn quotas(&self, crds: usize) -> Quotas {
        let n = |v: usize| v.to_string();
        let mut quotas = vec![
            (
                "compute".to_owned(),
                vec![
                    ("pods".into(), "100000".into()),
                    ("requests.cpu".into(), "1000".into()),
                    ("limits.memory".into(), "1Ti".into()),
                ],
                vec![
                    ("pods".into(), n(self.pods_per_ns)),
                    ("requests.cpu".into(), format!("{}m", 10 * self.pods_per_ns)),
                    ("limits.memory".into(), format!("{}Mi", 16 * self.pods_per_ns)),
                ],
            ),
            (
                "services".to_owned(),
                vec![
                    ("services".into(), "100000".into()),
                    ("services.loadbalancers".into(), "10".into()),
                ],
                vec![
                    ("services".into(), n(self.services_per_ns)),
                    ("services.loadbalancers".into(), "0".into()),
                ],
            ),
            (
                "storage".to_owned(),
                vec![
                    ("persistentvolumeclaims".into(), "100000".into()),
                    ("requests.storage".into(), "1Pi".into()),
                ],
                vec![
                    ("persistentvolumeclaims".into(), n(self.pvcs_per_ns)),
                    ("requests.storage".into(), format!("{}Gi", self.pvcs_per_ns)),
                ],
            ),
        ];
        let keys: Vec<String> = (0..self.constrained.min(crds))
            .map(|i| format!("count/{}.{}", crd_plural(i), self.group))
            .collect();
        if keys.is_empty() {
            return quotas;
        }
        quotas.push((
            "bindings".to_owned(),
            keys.iter().map(|k| (k.clone(), "100000".to_owned())).collect(),
            keys.iter()
                .map(|k| (k.clone(), n(self.objects_per_crd_per_ns)))
                .collect(),
        ));
        quotas
    }
}

pub(crate) async fn create_core(client: &Client, ns: &str, kind: &str, i: usize) {
    let pp = PostParams::default();
    let result = match kind {
        "pod" => {
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("p{i}")},
                "spec": {"containers": [{"name": "c", "image": "registry.invalid/none",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "10m", "memory": "16Mi"}}}]}
            }))
            .expect("pod");
            Api::<Pod>::namespaced(client.clone(), ns)
                .create(&pp, &pod)
                .await
                .map(|_| ())
        }
        "svc" => {
            let svc: Service = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("s{i}")}, "spec": {"ports": [{"port": 80}]}
            }))
            .expect("service");
            Api::<Service>::namespaced(client.clone(), ns)
                .create(&pp, &svc)
                .await
                .map(|_| ())
        }
        _ => {
            let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("v{i}")},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
            }))
            .expect("pvc");
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
                .create(&pp, &pvc)
                .await
                .map(|_| ())
        }
    };
    match result {
        Ok(()) | Err(kube::Error::Api(_)) => {} // 409 on a rerun
        Err(e) => panic!("creating {kind} {i} in {ns}: {e}"),
    }
}

pub(crate) fn quota_object(name: &str, hard: &[(String, String)]) -> ResourceQuota {
    ResourceQuota {
        metadata: meta(name),
        spec: Some(k8s_openapi::api::core::v1::ResourceQuotaSpec {
            hard: Some(
                hard.iter()
                    .map(|(k, v)| (k.clone(), K8sQuantity(v.clone())))
                    .collect(),
            ),
            ..Default::default()
        }),
        ..ResourceQuota::default()
    }
}
