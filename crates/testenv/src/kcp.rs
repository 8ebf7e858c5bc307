//! A kcp-shaped front for the multi-cluster control plane, for testing lazyquota's kcp source
//! where kcp itself cannot be built (see `tests/control-plane/kcp/build.sh`).
//!
//! **This is not kcp.** It serves the part of a kcp shard's HTTP surface lazyquota uses, over
//! real kube-apiservers that share one etcd (so resourceVersions are comparable across them,
//! as on one kcp shard), and holds no objects itself:
//!
//! - `/clusters/<name>/...` is forwarded to the apiserver backing logical cluster `<name>`,
//!   request and (streaming) response untouched;
//! - `GET /clusters/*/...` (the wildcard, list and watch only, as in kcp) is fanned out to
//!   every backend: a list reads all of them at one etcd revision (`resourceVersionMatch=Exact`
//!   on all but the first) and returns one list at that revision; a watch merges the backends'
//!   watch streams. Every object gets the `kcp.io/cluster` annotation kcp adds. Bookmarks are
//!   dropped (each backend's would promise only its own progress); any backend's stream ending
//!   ends the merged one, and the client resumes, as from a shard. Unlike a shard's, the
//!   merged stream is not in resourceVersion order across backends, so a resume could skip a
//!   backend's undelivered older event: tests keep their watches open (no cuts through it).
//!
//! Plain HTTP on loopback, no authentication: the backends' own clients carry the credentials.

use std::{collections::BTreeMap, convert::Infallible, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use futures::StreamExt as _;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use kube::Client;
use tokio::{net::TcpListener, task::JoinHandle};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

/// The annotation kcp puts on every object it returns.
pub const CLUSTER_ANNOTATION: &str = "kcp.io/cluster";

/// A running front; stops when dropped.
#[derive(Debug)]
pub struct KcpFront {
    addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl KcpFront {
    /// Serves `backends` (logical cluster name → a client of the apiserver backing it) on a
    /// free loopback port.
    pub async fn start(backends: BTreeMap<String, Client>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let backends = Arc::new(backends);
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let backends = backends.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let backends = backends.clone();
                        async move { Ok::<_, Infallible>(route(&backends, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, accept })
    }

    /// The shard's base URL (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig for the shard (no credentials: the front needs none).
    pub fn kubeconfig(&self, path: &std::path::Path) -> std::io::Result<()> {
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: shard, cluster: {{server: '{}'}}}}]\n\
                 users: [{{name: u, user: {{}}}}]\ncontexts: [{{name: shard, context: {{cluster: shard, user: u}}}}]\n\
                 current-context: shard\n",
                self.url()
            ),
        )
    }
}

impl Drop for KcpFront {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn text(status: StatusCode, message: &str) -> Response<Body> {
    let status_json = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": message, "code": status.as_u16()
    });
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(full(status_json.to_string().into_bytes()))
        .expect("response")
}

fn full(bytes: Vec<u8>) -> Body {
    Full::new(Bytes::from(bytes))
        .map_err(|never| match never {})
        .boxed_unsync()
}

async fn route(backends: &BTreeMap<String, Client>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    let Some((cluster, rest)) = path.strip_prefix("/clusters/").and_then(|p| p.split_once('/')) else {
        return text(StatusCode::NOT_FOUND, "only /clusters/<name>/... is served");
    };
    let rest = format!("/{rest}");
    if cluster == "*" {
        if req.method() != Method::GET {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                "only list and watch are allowed in the `*` logical cluster",
            );
        }
        let accept = req.headers().get(http::header::ACCEPT).cloned();
        return wildcard(backends, &rest, query.as_deref(), accept).await;
    }
    let Some(client) = backends.get(cluster) else {
        return text(
            StatusCode::NOT_FOUND,
            &format!("logical cluster {cluster:?} not found"),
        );
    };
    forward(client, req, &rest, query.as_deref()).await
}

/// Passes a request to one backend and streams its answer back.
async fn forward(client: &Client, req: Request<Incoming>, path: &str, query: Option<&str>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(http_body_util::Collected::to_bytes) else {
        return text(StatusCode::BAD_REQUEST, "unreadable request body");
    };
    let uri = match query {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    let mut request = Request::builder().method(parts.method).uri(uri);
    for (name, value) in &parts.headers {
        if matches!(name.as_str(), "accept" | "content-type") {
            request = request.header(name, value);
        }
    }
    let Ok(request) = request.body(kube::client::Body::from(body.to_vec())) else {
        return text(StatusCode::BAD_REQUEST, "bad request");
    };
    match client.send(request).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            Response::from_parts(parts, body.map_err(|e| Box::new(e) as BoxError).boxed_unsync())
        }
        Err(error) => text(StatusCode::BAD_GATEWAY, &error.to_string()),
    }
}

fn with_params(path: &str, query: Option<&str>, drop: &[&str], add: &[(&str, String)]) -> String {
    let mut params: Vec<String> = query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| !drop.iter().any(|d| p.split('=').next() == Some(*d)))
        .map(str::to_owned)
        .collect();
    params.extend(add.iter().map(|(k, v)| format!("{k}={v}")));
    if params.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", params.join("&"))
    }
}

fn annotate(object: &mut serde_json::Value, cluster: &str) {
    if let Some(meta) = object.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        let annotations = meta.entry("annotations").or_insert_with(|| serde_json::json!({}));
        if !annotations.is_object() {
            *annotations = serde_json::json!({});
        }
        annotations[CLUSTER_ANNOTATION] = serde_json::Value::String(cluster.to_owned());
    }
}

async fn get(
    client: &Client,
    uri: &str,
    accept: Option<&http::HeaderValue>,
) -> Result<Response<kube::client::Body>, String> {
    let mut request = Request::get(uri);
    if let Some(accept) = accept {
        request = request.header(http::header::ACCEPT, accept);
    }
    let request = request
        .body(kube::client::Body::from(Vec::new()))
        .map_err(|e| e.to_string())?;
    client.send(request).await.map_err(|e| e.to_string())
}

async fn wildcard(
    backends: &BTreeMap<String, Client>,
    path: &str,
    query: Option<&str>,
    accept: Option<http::HeaderValue>,
) -> Response<Body> {
    let watching = query
        .unwrap_or_default()
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    if watching {
        return merged_watch(backends, path, query, accept).await;
    }
    // One list at one revision: the first backend's consistent list sets it, the others are
    // read exactly there. Pagination is not offered (the whole list in one page).
    let mut revision = String::new();
    let mut merged: Option<serde_json::Value> = None;
    let mut items = Vec::new();
    for (cluster, client) in backends {
        let uri = if revision.is_empty() {
            with_params(
                path,
                query,
                &["limit", "continue", "resourceVersion", "resourceVersionMatch"],
                &[],
            )
        } else {
            with_params(
                path,
                query,
                &["limit", "continue", "resourceVersion", "resourceVersionMatch"],
                &[
                    ("resourceVersion", revision.clone()),
                    ("resourceVersionMatch", "Exact".to_owned()),
                ],
            )
        };
        let response = match get(client, &uri, accept.as_ref()).await {
            Ok(r) => r,
            Err(e) => return text(StatusCode::BAD_GATEWAY, &e),
        };
        let status = response.status();
        let Ok(body) = response
            .into_body()
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
        else {
            return text(StatusCode::BAD_GATEWAY, "backend body");
        };
        if !status.is_success() {
            // The backend's own error (404 for an unknown type, 410...) is the answer.
            return Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(full(body.to_vec()))
                .expect("response");
        }
        let Ok(mut list) = serde_json::from_slice::<serde_json::Value>(&body) else {
            return text(StatusCode::BAD_GATEWAY, "backend list is not JSON");
        };
        // A list (`...List`, its items null when empty); a named object is not served here.
        if !list["kind"].as_str().is_some_and(|k| k.ends_with("List")) {
            return text(
                StatusCode::BAD_REQUEST,
                "the wildcard serves collections only (list and watch)",
            );
        }
        if revision.is_empty() {
            list["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .clone_into(&mut revision);
        }
        if let Some(array) = list.get_mut("items").and_then(|i| i.as_array_mut()) {
            for mut item in array.drain(..) {
                annotate(&mut item, cluster);
                items.push(item);
            }
        }
        merged.get_or_insert(list);
    }
    let mut list = merged.unwrap_or_else(|| serde_json::json!({"kind": "List", "apiVersion": "v1"}));
    list["items"] = serde_json::Value::Array(items);
    list["metadata"] = serde_json::json!({"resourceVersion": revision});
    Response::builder()
        .header("content-type", "application/json")
        .body(full(list.to_string().into_bytes()))
        .expect("response")
}

async fn merged_watch(
    backends: &BTreeMap<String, Client>,
    path: &str,
    query: Option<&str>,
    accept: Option<http::HeaderValue>,
) -> Response<Body> {
    let uri = with_params(path, query, &["allowWatchBookmarks"], &[]);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(64);
    let mut streams = Vec::new();
    for (cluster, client) in backends {
        let response = match get(client, &uri, accept.as_ref()).await {
            Ok(r) => r,
            Err(e) => return text(StatusCode::BAD_GATEWAY, &e),
        };
        if !response.status().is_success() {
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().to_vec())
                .unwrap_or_default();
            return Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(full(body))
                .expect("response");
        }
        streams.push((cluster.clone(), response.into_body()));
    }
    let tasks: Vec<JoinHandle<()>> = streams
        .into_iter()
        .map(|(cluster, body)| {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut body = body.into_data_stream();
                let mut buffer = Vec::new();
                while let Some(Ok(chunk)) = body.next().await {
                    buffer.extend_from_slice(&chunk);
                    while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = buffer.drain(..=end).collect();
                        let Ok(mut event) = serde_json::from_slice::<serde_json::Value>(&line) else {
                            continue;
                        };
                        if !event.is_object() || !event["object"].is_object() {
                            continue;
                        }
                        match event["type"].as_str() {
                            Some("BOOKMARK") => continue,
                            Some("ERROR") => {}
                            _ => annotate(&mut event["object"], &cluster),
                        }
                        let mut out = event.to_string().into_bytes();
                        out.push(b'\n');
                        if tx.send(Ok(Frame::data(Bytes::from(out)))).await.is_err() {
                            return;
                        }
                    }
                }
            })
        })
        .collect();
    drop(tx);
    // The merged stream ends when any backend's does (the client then resumes from its last
    // resourceVersion on every backend).
    let (end_tx, end_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (_, _, rest) = futures::future::select_all(tasks).await;
        for task in rest {
            task.abort();
        }
        let _ = end_tx.send(());
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(UnsyncBoxBody::new(StreamBody::new(frames(rx, end_rx))))
        .expect("response")
}

/// The receiver as a stream that also ends when `end` fires.
fn frames(
    rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
    end: tokio::sync::oneshot::Receiver<()>,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, BoxError>> + Send + 'static {
    futures::stream::unfold((rx, end, false), |(mut rx, mut end, ended)| async move {
        if ended {
            // Drain what the backends sent before one of them ended.
            return rx.try_recv().ok().map(|i| (i, (rx, end, true)));
        }
        tokio::select! {
            biased;
            item = rx.recv() => item.map(|i| (i, (rx, end, false))),
            _ = &mut end => rx.try_recv().ok().map(|i| (i, (rx, end, true))),
        }
    })
}
