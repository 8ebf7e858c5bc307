//! A namespace per test, deleted when the test ends (or panics).

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::{DeleteParams, ObjectMeta, PostParams},
};

use crate::{ControlPlane, Error, Flavor, TEST_NAMESPACE_LABEL, eventually, unique_name};

/// A namespace created for one test and deleted when the test ends.
///
/// Deletion happens in [`TestNamespace::delete`] or, if the test panics first, on drop (on a
/// helper thread with its own runtime and client, since drop cannot await).
pub struct TestNamespace {
    name: String,
    client: Client,
    flavor: Flavor,
    kubeconfig: PathBuf,
    deleted: bool,
}

impl TestNamespace {
    /// Creates a fresh namespace named `lq-<prefix>-<unique>` in the control plane of `flavor`,
    /// and returns once it is as a real cluster makes it: KCM's root-CA publisher has put
    /// `kube-root-ca.crt` into it (tests count ConfigMaps, and a quota created while that
    /// ConfigMap races in would be a different test).
    pub async fn create(flavor: Flavor, prefix: &str) -> Result<Self, Error> {
        let cp = ControlPlane::get(flavor);
        let client = cp.client().await?;
        let name = unique_name(prefix);
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([(TEST_NAMESPACE_LABEL.to_owned(), "true".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .map_err(|source| Error::Kube {
                what: format!("creating namespace {name}"),
                source,
            })?;
        let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &name);
        let published = eventually(Duration::from_secs(30), || async {
            configmaps.get_opt("kube-root-ca.crt").await.ok().flatten()
        })
        .await;
        if published.is_none() {
            return Err(Error::Missing(
                "root CA ConfigMap in a new namespace within 30 s (is KCM running?)",
            ));
        }
        Ok(Self {
            name,
            client,
            flavor,
            kubeconfig: cp.kubeconfig.clone(),
            deleted: false,
        })
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// An admin client.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// A namespaced API for `K` in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Deletes the namespace (the namespace controller finishes the job in the background).
    pub async fn delete(mut self) -> Result<(), Error> {
        self.deleted = true;
        delete_namespace(&self.client, &self.name).await
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let name = std::mem::take(&mut self.name);
        let kubeconfig = self.kubeconfig.clone();
        let flavor = self.flavor;
        // The test's runtime may be shutting down; use a private one on a private thread.
        let cleanup = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            runtime.block_on(async move {
                let cp = ControlPlane {
                    flavor,
                    kubeconfig,
                    facts: BTreeMap::new(),
                };
                if let Ok(client) = cp.client().await {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(10), delete_namespace(&client, &name)).await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

async fn delete_namespace(client: &Client, name: &str) -> Result<(), Error> {
    match Api::<Namespace>::all(client.clone())
        .delete(name, &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(Error::Kube {
            what: format!("deleting namespace {name}"),
            source,
        }),
    }
}
