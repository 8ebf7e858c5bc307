//! A kcp shard as lazyquota reaches it: its base URL and credentials, clients for one logical
//! cluster or for wildcard requests across all of them, and kcp's names and rules those
//! requests need (the cluster annotation, LogicalClusters and their phases). The rest of kcp
//! mode (which clusters to serve, the shared watches) builds on this module and never the
//! other way round.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ResourceQuota;
use kube::{
    Api, Client, ResourceExt as _,
    api::{DynamicObject, ListParams},
};
use lazyquota_index::keys::ClusterName;

use crate::{
    operate::source::Endpoint,
    transport::client::{Pool, Transport},
};

/// The annotation kcp puts on every object with its logical cluster's name.
pub use lazyquota_index::reconciler::CLUSTER_ANNOTATION;

pub use crate::controller::members::{PATH_ANNOTATION, logical_cluster_resource};

/// Why the shard cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The shard URL is not a URL.
    #[error("--kcp-shard-url {0:?} is not a URL")]
    BadUrl(String),
    /// A client could not be built.
    #[error("cannot build a client for the kcp shard: {0}")]
    Client(#[source] kube::Error),
    /// Listing the shard's quotas failed (one-shot commands).
    #[error("cannot list ResourceQuotas across the shard's logical clusters: {0}")]
    List(#[source] kube::Error),
}

/// A kcp shard: its base URL and the credentials to reach it (shard-level `system:masters`
/// or equivalent: wildcard requests are privileged and not served through the front-proxy).
#[derive(Clone)]
pub struct Shard {
    config: kube::Config,
    pool: Pool,
}

impl Shard {
    /// The shard at `url` (e.g. `https://shard-1.kcp.example:6443`; a `/clusters/...` path is
    /// dropped), with the TLS settings and credentials of `config`.
    pub fn new(mut config: kube::Config, url: &str, transport: Transport) -> Result<Self, Error> {
        let base = url
            .split("/clusters/")
            .next()
            .unwrap_or(url)
            .trim_end_matches('/');
        config.cluster_url = base.parse().map_err(|_| Error::BadUrl(url.to_owned()))?;
        let pool = Pool::new(&config, transport).map_err(Error::Client)?;
        Ok(Self { config, pool })
    }

    /// The shard's base URL.
    pub fn url(&self) -> &http::Uri {
        &self.config.cluster_url
    }

    fn at(&self, cluster: &str) -> Result<Client, Error> {
        let mut config = self.config.clone();
        let base = config.cluster_url.to_string();
        config.cluster_url = format!("{}/clusters/{cluster}", base.trim_end_matches('/'))
            .parse()
            .map_err(|_| Error::BadUrl(base))?;
        self.pool.client(config).map_err(Error::Client)
    }

    /// A client for one logical cluster (`<shard>/clusters/<name>`).
    pub fn cluster(&self, name: &ClusterName) -> Result<Client, Error> {
        self.at(name.as_str())
    }

    /// A client of the shard's root, for requests routed to a logical cluster
    /// ([`crate::transport::route::Routed`]): the shard's engine needs no client per cluster.
    pub fn root(&self) -> Result<Client, Error> {
        self.pool.client(self.config.clone()).map_err(Error::Client)
    }

    /// A client for wildcard lists and watches (`<shard>/clusters/*`).
    pub fn wildcard(&self) -> Result<Client, Error> {
        self.at("*")
    }

    /// One endpoint per logical cluster that has a ResourceQuota now (for `usage` and
    /// `explain`), from one wildcard list, with its workspace path from a wildcard list of the
    /// LogicalClusters.
    pub async fn endpoints(&self) -> Result<Vec<Endpoint>, Error> {
        let quotas = Api::<ResourceQuota>::all(self.wildcard()?)
            .list_metadata(&ListParams::default())
            .await
            .map_err(Error::List)?;
        let names: BTreeSet<String> = quotas
            .items
            .iter()
            .filter_map(|q| q.annotations().get(CLUSTER_ANNOTATION).cloned())
            .collect();
        let clusters = Api::<DynamicObject>::all_with(self.wildcard()?, &logical_cluster_resource())
            .list_metadata(&ListParams::default())
            .await
            .map_err(Error::List)?;
        let paths: BTreeMap<String, String> = clusters
            .items
            .iter()
            .filter_map(|c| {
                let annotations = c.annotations();
                Some((
                    annotations.get(CLUSTER_ANNOTATION)?.clone(),
                    annotations.get(PATH_ANNOTATION)?.clone(),
                ))
            })
            .collect();
        names
            .into_iter()
            .map(|name| {
                let workspace = paths.get(&name).cloned();
                let name = ClusterName::new(&name);
                Ok(Endpoint {
                    gates: lazyquota_quota::FeatureGates::default(),
                    client: self.cluster(&name)?,
                    name,
                    workspace,
                })
            })
            .collect()
    }
}
