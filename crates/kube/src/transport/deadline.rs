//! Every request to the apiserver has a deadline; every watch has an idle limit.
//!
//! lazyquota builds its own hyper stack (for HTTP/2 and a pool shared by a kcp shard's logical
//! clusters), so kube's own read timeout does not apply. Without a deadline a black-holed
//! connection, or an HTTP/2 connection whose streams stall after a cut, stalls a list, a
//! status write or a lease renewal for ever and nothing retries: seen on a real kcp shard
//! behind a cutting proxy, where every watch of two logical clusters went silent for good.
//!
//! - A request that is not a watch must deliver its response, body included, within
//!   [`Deadlines::request`] (client-go has no default; kubectl's `--request-timeout` is the
//!   same idea). Lists are paginated, so one page is one request.
//! - A watch (`watch=true`/`watch=1`) must deliver its response headers within
//!   [`Deadlines::request`], then some bytes at least every [`Deadlines::watch_idle`]. The
//!   server ends a watch after `timeoutSeconds` (290 s by default from kube's watcher), so
//!   the idle limit only fires on a stream that is gone.
//!
//! A timeout is an error like any transport error: the caller retries with its backoff.
//! Cost: one boxed future per request and one timer per response body.

use std::{
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service};
use tracing::debug;

/// How long requests and watches may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// A whole request (not a watch), and a watch's response headers.
    pub request: Duration,
    /// The longest a watch may go without delivering a byte.
    pub watch_idle: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            request: Duration::from_secs(30),
            // kube's own read timeout: just above the watcher's 290 s server-side timeout.
            watch_idle: Duration::from_secs(295),
        }
    }
}

/// The timeout error, naming which limit fired.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Elapsed(&'static str);

/// A [`Layer`] applying [`Deadlines`].
#[derive(Clone, Copy, Debug)]
pub struct DeadlineLayer(pub Deadlines);

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Deadline {
            inner,
            deadlines: self.0,
        }
    }
}

/// The service [`DeadlineLayer`] builds.
#[derive(Clone, Debug)]
pub struct Deadline<S> {
    inner: S,
    deadlines: Deadlines,
}

/// Whether the request opens a watch.
fn is_watch(uri: &http::Uri) -> bool {
    uri.query()
        .is_some_and(|q| q.split('&').any(|pair| pair == "watch=true" || pair == "watch=1"))
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Deadline<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<TimedBody<ResBody>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let watch = is_watch(request.uri());
        let Deadlines {
            request: limit,
            watch_idle,
        } = self.deadlines;
        // Debug level: every request's path and how long its headers took (no credentials
        // are in a URI).
        let (method, path) = (request.method().clone(), request.uri().path_and_query().cloned());
        let response = self.inner.call(request);
        Box::pin(async move {
            let started = Instant::now();
            let deadline = started + limit;
            let Ok(response) = tokio::time::timeout_at(deadline, response).await else {
                debug!(%method, ?path, "no response headers within the request deadline");
                return Err(Elapsed("no response from the apiserver within the request deadline").into());
            };
            let response = response.map_err(Into::into)?;
            debug!(%method, ?path, status = %response.status(), elapsed = ?started.elapsed(), watch, "response headers");
            Ok(response.map(|body| {
                let (limit, idle) = if watch {
                    (Instant::now() + watch_idle, Some(watch_idle))
                } else {
                    (deadline, None)
                };
                TimedBody {
                    body: Box::pin(body),
                    timer: Box::pin(tokio::time::sleep_until(limit)),
                    idle,
                }
            }))
        })
    }
}

/// A response body that fails once its deadline passes (a watch's moves with each frame).
pub struct TimedBody<B> {
    body: Pin<Box<B>>,
    timer: Pin<Box<Sleep>>,
    /// Set for watches: the idle limit, renewed by every frame.
    idle: Option<Duration>,
}

impl<B> Body for TimedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Poll::Ready(frame) = self.body.as_mut().poll_frame(cx) {
            if let (Some(idle), Some(Ok(f))) = (self.idle, &frame) {
                self.timer.as_mut().reset(Instant::now() + idle);
                // Trace level: what a watch delivers, event type and resourceVersion included
                // (to tell a lost event from a lost bookmark when a watch resumes).
                if tracing::enabled!(tracing::Level::TRACE)
                    && let Some(data) = f.data_ref()
                {
                    tracing::trace!(bytes = data.len(), head = %String::from_utf8_lossy(&data[..data.len().min(240)]), "watch frame");
                }
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(Elapsed(if self.idle.is_some() {
                "the watch delivered nothing within its idle limit"
            } else {
                "the response body did not complete within the request deadline"
            }))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    /// A body that yields one frame after `delay`, then ends.
    struct Slow {
        delay: Pin<Box<Sleep>>,
        done: bool,
    }

    impl Body for Slow {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            if self.done {
                return Poll::Ready(None);
            }
            match self.delay.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.done = true;
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
                }
                Poll::Pending => Poll::Pending,
            }
        }
    }

    type SlowFuture = BoxFuture<'static, Result<Response<Slow>, Infallible>>;

    fn service(
        header_delay: Duration,
        body_delay: Duration,
    ) -> Deadline<tower::util::ServiceFn<impl FnMut(Request<()>) -> SlowFuture>> {
        let inner = tower::service_fn(
            move |_: Request<()>| -> BoxFuture<'static, Result<Response<Slow>, Infallible>> {
                Box::pin(async move {
                    tokio::time::sleep(header_delay).await;
                    Ok(Response::new(Slow {
                        delay: Box::pin(tokio::time::sleep(body_delay)),
                        done: false,
                    }))
                })
            },
        );
        DeadlineLayer(Deadlines {
            request: Duration::from_secs(30),
            watch_idle: Duration::from_secs(295),
        })
        .layer(inner)
    }

    async fn collect(response: Response<TimedBody<Slow>>) -> Result<(), BoxError> {
        let mut body = response.into_body();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            frame?;
        }
        Ok(())
    }

    fn get(uri: &str) -> Request<()> {
        Request::builder().uri(uri).body(()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_without_an_answer_fails_at_its_deadline() {
        let mut svc = service(Duration::from_hours(1), Duration::ZERO);
        let error = svc.call(get("/api/v1/pods")).await.err().expect("times out");
        assert!(error.to_string().contains("request deadline"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_body_that_stalls_fails_at_the_same_deadline() {
        let mut svc = service(Duration::from_secs(10), Duration::from_secs(25));
        let response = svc
            .call(get("/api/v1/pods?limit=500"))
            .await
            .expect("headers in time");
        let error = collect(response).await.expect_err("body past the 30 s deadline");
        assert!(error.to_string().contains("request deadline"), "{error}");
        let mut svc = service(Duration::from_secs(10), Duration::from_secs(15));
        let response = svc.call(get("/api/v1/pods")).await.expect("headers");
        collect(response)
            .await
            .expect("25 s in all is within the deadline");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_may_run_long_but_not_go_silent() {
        let mut svc = service(Duration::from_secs(1), Duration::from_secs(200));
        let response = svc
            .call(get("/api/v1/pods?watch=true&timeoutSeconds=290"))
            .await
            .expect("headers");
        collect(response)
            .await
            .expect("200 s of silence is within the idle limit");
        let mut svc = service(Duration::from_secs(1), Duration::from_secs(400));
        let response = svc.call(get("/api/v1/pods?watch=1")).await.expect("headers");
        let error = collect(response).await.expect_err("400 s of silence");
        assert!(error.to_string().contains("idle limit"), "{error}");
    }

    #[test]
    fn watches_are_told_apart_by_their_query() {
        assert!(is_watch(&"/api/v1/pods?watch=true".parse().unwrap()));
        assert!(is_watch(&"/api/v1/pods?limit=1&watch=1".parse().unwrap()));
        assert!(!is_watch(&"/api/v1/pods?watchx=true".parse().unwrap()));
        assert!(!is_watch(&"/api/v1/watch-things".parse().unwrap()));
    }
}
