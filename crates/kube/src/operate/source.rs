//! Where the clusters are: the sources of the clusters one lazyquota process serves.
//!
//! - one kubeconfig (and context): plain Kubernetes, one cluster;
//! - several contexts of one kubeconfig, or several kubeconfig files: one process serving many
//!   clusters (hosted control planes), one [`crate::controller::Controller`] each.
//!
//! Every cluster gets its own client (its own connections: they are different servers) and its
//! own controller loop — one task per cluster, never one per resource type. All state inside
//! is keyed by [`ClusterName`] already, so names must be unique: a duplicate is an error, not
//! a silent merge.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use kube::{Client, config::Kubeconfig};
use lazyquota_index::keys::ClusterName;

use crate::transport::client::{self, Transport};

/// Why the clusters could not be determined or reached.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A kubeconfig named for a cluster list could not be read.
    #[error("cannot read kubeconfig {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// `--all-contexts` found no context.
    #[error("kubeconfig {0} has no contexts")]
    NoContexts(String),
    /// Two clusters would share one name.
    #[error("two clusters are both named {0:?}: cluster names must be unique (use NAME=FILE)")]
    Duplicate(String),
    /// A `--cluster-kubeconfig` value is malformed.
    #[error("--cluster-kubeconfig {0:?}: expected FILE or NAME=FILE")]
    BadClusterFlag(String),
    /// A client could not be built for one cluster.
    #[error("cluster {cluster:?}: {source}")]
    Client {
        /// The cluster.
        cluster: String,
        /// Why.
        #[source]
        source: client::Error,
    },
}

/// One cluster: its name in lazyquota's state, metrics and Events, and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterRef {
    /// The name the cluster's quotas are keyed by.
    pub name: String,
    /// The kubeconfig file (`None`: the usual search, then in-cluster).
    pub kubeconfig: Option<PathBuf>,
    /// The context (`None`: the file's current context).
    pub context: Option<String>,
}

/// The clusters to serve, as the flags name them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSource {
    clusters: Vec<ClusterRef>,
}

/// A reachable cluster: its name and client.
#[derive(Clone)]
pub struct Endpoint {
    /// The cluster's name.
    pub name: ClusterName,
    /// Its client.
    pub client: Client,
    /// kcp: the workspace path of the logical cluster (`kcp.io/path` of its LogicalCluster),
    /// shown next to the name; `None` elsewhere (and for clusters without a path annotation,
    /// such as `root`).
    pub workspace: Option<String>,
    /// The feature gates its evaluators follow: its release's defaults and `--feature-gates`
    /// (set by the binary once it has read the server's version; the newest defaults before).
    pub gates: lazyquota_quota::FeatureGates,
}

/// What the flags say about clusters (see the binary's `--help`).
#[derive(Clone, Debug, Default)]
pub struct ClusterFlags<'a> {
    /// `--kubeconfig` (or `$KUBECONFIG`).
    pub kubeconfig: Option<&'a Path>,
    /// `--context`, repeatable: each a cluster.
    pub contexts: &'a [String],
    /// `--all-contexts`: every context of the kubeconfig is a cluster.
    pub all_contexts: bool,
    /// `--cluster-kubeconfig [NAME=]FILE`, repeatable: each file a cluster.
    pub cluster_kubeconfigs: &'a [String],
}

impl ClusterSource {
    /// The clusters the flags name. Without any cluster flag: one cluster, the kubeconfig's
    /// current context (or in-cluster), named after the context or `default`.
    pub fn from_flags(flags: &ClusterFlags<'_>) -> Result<Self, Error> {
        let mut clusters = Vec::new();
        let named = |context: &str| ClusterRef {
            name: context.to_owned(),
            kubeconfig: flags.kubeconfig.map(Path::to_path_buf),
            context: Some(context.to_owned()),
        };
        if flags.all_contexts {
            let (file, shown) = match flags.kubeconfig {
                Some(path) => (Kubeconfig::read_from(path), path.display().to_string()),
                None => (
                    Kubeconfig::read(),
                    "from $KUBECONFIG or ~/.kube/config".to_owned(),
                ),
            };
            let file = file.map_err(|source| Error::Read {
                path: PathBuf::from(&shown),
                source,
            })?;
            if file.contexts.is_empty() {
                return Err(Error::NoContexts(shown));
            }
            clusters.extend(file.contexts.iter().map(|c| named(&c.name)));
        }
        clusters.extend(flags.contexts.iter().map(|c| named(c)));
        for value in flags.cluster_kubeconfigs {
            clusters.push(cluster_kubeconfig(value)?);
        }
        if clusters.is_empty() {
            clusters.push(ClusterRef {
                name: "default".into(),
                kubeconfig: flags.kubeconfig.map(Path::to_path_buf),
                context: None,
            });
        }
        let mut seen = BTreeSet::new();
        let mut unique = Vec::with_capacity(clusters.len());
        for cluster in clusters {
            // `--all-contexts --context a` names `a` twice on purpose: keep one.
            if unique.iter().any(|c: &ClusterRef| c == &cluster) {
                continue;
            }
            if !seen.insert(cluster.name.clone()) {
                return Err(Error::Duplicate(cluster.name));
            }
            unique.push(cluster);
        }
        Ok(Self { clusters: unique })
    }

    /// The clusters, in flag order.
    pub fn clusters(&self) -> &[ClusterRef] {
        &self.clusters
    }

    /// Builds one client per cluster. Builds only: nothing is contacted yet.
    pub async fn connect(&self, transport: Transport) -> Result<Vec<Endpoint>, Error> {
        let mut endpoints = Vec::with_capacity(self.clusters.len());
        for cluster in &self.clusters {
            let client = client::connect_with(
                cluster.kubeconfig.as_deref(),
                cluster.context.as_deref(),
                transport,
            )
            .await
            .map_err(|source| Error::Client {
                cluster: cluster.name.clone(),
                source,
            })?;
            endpoints.push(Endpoint {
                gates: lazyquota_quota::FeatureGates::default(),
                name: ClusterName::new(&cluster.name),
                client,
                workspace: None,
            });
        }
        Ok(endpoints)
    }
}

/// `[NAME=]FILE`: without a name, the file's current context names the cluster (else the
/// file's stem).
fn cluster_kubeconfig(value: &str) -> Result<ClusterRef, Error> {
    let (name, file) = match value.split_once('=') {
        Some((name, file)) if !name.is_empty() && !file.is_empty() => (Some(name), file),
        Some(_) => return Err(Error::BadClusterFlag(value.to_owned())),
        None if value.is_empty() => return Err(Error::BadClusterFlag(value.to_owned())),
        None => (None, value),
    };
    let path = PathBuf::from(file);
    let name = if let Some(name) = name {
        name.to_owned()
    } else {
        let config = Kubeconfig::read_from(&path).map_err(|source| Error::Read {
            path: path.clone(),
            source,
        })?;
        config
            .current_context
            .filter(|c| !c.is_empty())
            .or_else(|| path.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| file.to_owned())
    };
    Ok(ClusterRef {
        name,
        kubeconfig: Some(path),
        context: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(dir: &Path, name: &str, contexts: &[&str]) -> PathBuf {
        use std::fmt::Write as _;
        let mut text = String::from("apiVersion: v1\nkind: Config\nclusters:\n");
        for c in contexts {
            let _ = write!(text, "- name: {c}\n  cluster:\n    server: https://127.0.0.1:1\n");
        }
        text.push_str("users:\n- name: u\n  user:\n    token: t\ncontexts:\n");
        for c in contexts {
            let _ = write!(text, "- name: {c}\n  context:\n    cluster: {c}\n    user: u\n");
        }
        if let Some(first) = contexts.first() {
            let _ = writeln!(text, "current-context: {first}");
        }
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A fresh directory for one test (no tempfile crate for this).
    fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lazyquota-source-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn names(source: &ClusterSource) -> Vec<&str> {
        source.clusters().iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn no_cluster_flag_is_one_default_cluster() {
        let source = ClusterSource::from_flags(&ClusterFlags::default()).unwrap();
        assert_eq!(names(&source), ["default"]);
        assert_eq!(source.clusters()[0].context, None);
    }

    #[test]
    fn contexts_and_files_name_clusters_and_duplicates_are_refused() {
        let dir = scratch("names");
        let multi = kubeconfig(&dir, "multi", &["a", "b", "c"]);
        let one = kubeconfig(&dir, "one", &["d"]);
        let contexts = ["b".to_owned()];
        let all = ClusterSource::from_flags(&ClusterFlags {
            kubeconfig: Some(&multi),
            contexts: &contexts,
            all_contexts: true,
            ..ClusterFlags::default()
        })
        .unwrap();
        assert_eq!(names(&all), ["a", "b", "c"], "b named twice is kept once");

        let files = [one.display().to_string(), format!("e={}", one.display())];
        let source = ClusterSource::from_flags(&ClusterFlags {
            kubeconfig: Some(&multi),
            contexts: &contexts,
            cluster_kubeconfigs: &files,
            ..ClusterFlags::default()
        })
        .unwrap();
        assert_eq!(names(&source), ["b", "d", "e"]);
        assert_eq!(source.clusters()[1].kubeconfig.as_deref(), Some(one.as_path()));

        let clash = [format!("b={}", one.display())];
        let error = ClusterSource::from_flags(&ClusterFlags {
            kubeconfig: Some(&multi),
            contexts: &contexts,
            cluster_kubeconfigs: &clash,
            ..ClusterFlags::default()
        })
        .unwrap_err();
        assert!(matches!(error, Error::Duplicate(ref n) if n == "b"), "{error}");
        for bad in ["=x", "x=", ""] {
            let error = ClusterSource::from_flags(&ClusterFlags {
                cluster_kubeconfigs: &[bad.to_owned()],
                ..ClusterFlags::default()
            })
            .unwrap_err();
            assert!(matches!(error, Error::BadClusterFlag(_)), "{bad}: {error}");
        }
    }

    #[tokio::test]
    async fn connect_builds_one_client_per_cluster_without_contacting_it() {
        let dir = scratch("connect");
        let multi = kubeconfig(&dir, "multi", &["a", "b"]);
        let source = ClusterSource::from_flags(&ClusterFlags {
            kubeconfig: Some(&multi),
            all_contexts: true,
            ..ClusterFlags::default()
        })
        .unwrap();
        let endpoints = source.connect(Transport::Http1).await.unwrap();
        let names: Vec<String> = endpoints.iter().map(|e| e.name.to_string()).collect();
        assert_eq!(names, ["a", "b"]);
        let missing = ClusterSource::from_flags(&ClusterFlags {
            cluster_kubeconfigs: &["x=/nonexistent/kubeconfig".to_owned()],
            ..ClusterFlags::default()
        })
        .unwrap();
        let error = missing
            .connect(Transport::Http1)
            .await
            .err()
            .expect("no such file");
        assert!(
            error
                .to_string()
                .starts_with("cluster \"x\": cannot read kubeconfig"),
            "{error}"
        );
    }
}
