//! Building a kube client from a kubeconfig, the way `kubectl` finds one.

use std::path::{Path, PathBuf};

use crate::{
    transport::deadline::{DeadlineLayer, Deadlines},
    transport::spread::Spread,
};
use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

/// What lazyquota's requests say they come from. kube's client sends no `User-Agent`, and the
/// apiserver names a writer's `managedFields` entry and its audit events after it: without one,
/// every status lazyquota wrote was managed by "unknown".
pub const USER_AGENT: &str = concat!("lazyquota/", env!("CARGO_PKG_VERSION"));

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

/// Builds a client from [`load_config`] (HTTP/1.1).
pub async fn connect(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client, Error> {
    connect_with(kubeconfig, context, Transport::Http1).await
}

/// How the client talks to the apiserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// HTTP/1.1: one connection (and one hyper task) per open watch, as kube-client does.
    Http1,
    /// HTTP/2 negotiated by ALPN: requests and watches multiplexed over one connection, as
    /// client-go does, and another connection each time every open one carries
    /// `streams_per_connection` streams ([`crate::transport::spread`]), so no request queues behind
    /// watches at the server's stream limit.
    Http2 {
        /// Streams opened on one connection before another is opened.
        streams_per_connection: usize,
    },
}

impl Default for Transport {
    /// HTTP/2 with [`crate::transport::spread::DEFAULT_STREAMS_PER_CONNECTION`] streams per connection.
    fn default() -> Self {
        Self::Http2 {
            streams_per_connection: usize::from(crate::transport::spread::DEFAULT_STREAMS_PER_CONNECTION),
        }
    }
}

/// Builds a client from [`load_config`] with the chosen transport.
pub async fn connect_with(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    transport: Transport,
) -> Result<Client, Error> {
    let config = load_config(kubeconfig, context).await?;
    build(config, transport).map_err(Error::Client)
}

/// kube's default service stack (base URI, auth, extra headers) over our own hyper client,
/// with a deadline on every request ([`crate::transport::deadline`]):
/// HTTP/1.1 only, or HTTP/2 offered by ALPN (with HTTP/2 keep-alive pings). Either way with
/// `TCP_NODELAY`: hyper's connector leaves Nagle's algorithm on, and a request written as
/// headers then body on a fresh connection then waits for the server's delayed ACK.
fn build(config: Config, transport: Transport) -> Result<Client, kube::Error> {
    let pool = Pool::new(&config, transport)?;
    pool.client(config)
}

/// How many concurrent streams the server at `uri` allows on one HTTP/2 connection
/// (`SETTINGS_MAX_CONCURRENT_STREAMS`), asked on a connection of its own that is closed after:
/// the HTTP/2 handshake and one PING, whose answer comes after the server's SETTINGS. `None`
/// when the server does not speak HTTP/2 (ALPN chose HTTP/1.1), or does not answer within 10 s.
/// No request is sent, so no credentials are needed.
async fn server_max_streams(
    connector: hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    uri: http::Uri,
) -> Option<usize> {
    use tower::ServiceExt as _;
    let ask = async {
        let io = connector.oneshot(uri).await.ok()?;
        let (send, mut connection) = h2::client::handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .ok()?;
        let mut pinger = connection.ping_pong()?;
        tokio::select! {
            _ = &mut connection => None,
            answer = pinger.ping(h2::Ping::opaque()) => answer.ok().map(|_| send.current_max_send_streams()),
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), ask)
        .await
        .ok()
        .flatten()
}

type Hyper = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    kube::client::Body,
>;

/// One connection pool shared by clients of several base URLs on one server — a kcp shard's
/// logical clusters (`<shard>/clusters/<name>`): over HTTP/2 they all share one connection
/// (more once it carries its share of streams: [`crate::transport::spread`]), over HTTP/1.1 idle
/// connections are reused across them. TLS settings and credentials come from the
/// configuration the pool was made with.
#[derive(Clone)]
pub struct Pool {
    hyper: Spread<Hyper>,
    deadlines: Deadlines,
}

impl Pool {
    /// A pool speaking `transport`, trusting and presenting what `config` says.
    pub fn new(config: &Config, transport: Transport) -> Result<Self, kube::Error> {
        use hyper_util::{
            client::legacy::{Builder, connect::HttpConnector},
            rt::{TokioExecutor, TokioTimer},
        };
        use kube::client::ConfigExt as _;

        let tls = config.rustls_client_config()?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(config.connect_timeout);
        // A peer that vanishes (a black-holed route) is noticed in about a minute even on an
        // idle HTTP/1.1 watch connection: 30 s idle, then 3 probes 10 s apart.
        http.set_keepalive(Some(std::time::Duration::from_secs(30)));
        http.set_keepalive_interval(Some(std::time::Duration::from_secs(10)));
        http.set_keepalive_retries(Some(3));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let (https, per_connection) = match transport {
            // hyper's own pool opens a connection per request in flight.
            Transport::Http1 => (https.enable_http1().wrap_connector(http), usize::MAX),
            Transport::Http2 {
                streams_per_connection,
            } => (
                https.enable_all_versions().wrap_connector(http),
                streams_per_connection,
            ),
        };
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(std::time::Duration::from_secs(30))
            .http2_keep_alive_timeout(std::time::Duration::from_secs(10))
            .http2_keep_alive_while_idle(true);
        let probe = https.clone();
        let spread = Spread::new(per_connection, move || builder.build(https.clone()));
        if matches!(transport, Transport::Http2 { .. })
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // One task, once: the streams opened before it answers (a round trip) use the
            // configured share.
            let (spread, uri) = (spread.clone(), config.cluster_url.clone());
            runtime.spawn(async move {
                if let Some(server_max) = server_max_streams(probe, uri.clone()).await {
                    let share = spread.limit_to(server_max);
                    tracing::debug!(server = %uri, server_max, share, "the server's HTTP/2 stream limit");
                    if share < per_connection {
                        tracing::info!(server = %uri, server_max, share, "the server allows fewer HTTP/2 streams per connection than --http2-streams-per-connection: a new connection opens every {share} streams");
                    }
                }
            });
        }
        Ok(Self {
            hyper: spread,
            deadlines: Deadlines::default(),
        })
    }

    /// A client for `config`'s base URL over this pool's connections, naming itself
    /// [`USER_AGENT`] unless the configuration names another agent.
    pub fn client(&self, mut config: Config) -> Result<Client, kube::Error> {
        use kube::client::ConfigExt as _;
        use tower::ServiceBuilder;
        if !config
            .headers
            .iter()
            .any(|(name, _)| name == http::header::USER_AGENT)
        {
            config.headers.push((
                http::header::USER_AGENT,
                http::HeaderValue::from_static(USER_AGENT),
            ));
        }
        let service = ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .option_layer(config.auth_layer()?)
            .layer(config.extra_headers_layer()?)
            .layer(DeadlineLayer(self.deadlines))
            .service(self.hyper.clone());
        Ok(Client::new(service, config.default_namespace))
    }
}
