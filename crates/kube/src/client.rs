//! Building a kube client from a kubeconfig, the way `kubectl` finds one.

use std::path::{Path, PathBuf};

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

/// Why no client could be built. Each variant names the file or context at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig file could not be read or parsed.
    #[error("cannot read kubeconfig {path}: {source}")]
    ReadKubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The kubeconfig (or the in-cluster environment) does not give a usable configuration.
    #[error("cannot use kubeconfig{}: {source}", context.as_deref().map(|c| format!(" context {c:?}")).unwrap_or_default())]
    Config {
        /// The context asked for, if any.
        context: Option<String>,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No kubeconfig was given and none was found in the environment or the cluster.
    #[error("no kubeconfig: pass --kubeconfig, set KUBECONFIG, or run in a cluster ({0})")]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be constructed from the configuration (TLS set-up, for example).
    #[error("cannot build a client: {0}")]
    Client(#[source] kube::Error),
}

/// Loads the client configuration: an explicit kubeconfig file (and context), or else what
/// `kube` infers (`$KUBECONFIG`, `~/.kube/config`, then the in-cluster service account).
pub async fn load_config(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Config, Error> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(|source| Error::ReadKubeconfig {
                path: path.to_owned(),
                source,
            })?;
            Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|source| Error::Config {
                    context: options.context.clone(),
                    source,
                })
        }
        None if context.is_some() => {
            Config::from_kubeconfig(&options)
                .await
                .map_err(|source| Error::Config {
                    context: options.context.clone(),
                    source,
                })
        }
        None => Config::infer().await.map_err(Error::Infer),
    }
}

/// Builds a client from [`load_config`].
pub async fn connect(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client, Error> {
    let config = load_config(kubeconfig, context).await?;
    Client::try_from(config).map_err(Error::Client)
}
