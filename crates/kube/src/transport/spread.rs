//! HTTP/2: every watch multiplexed over one connection, and another connection opened when
//! one carries its share of streams.
//!
//! A watch holds its HTTP/2 stream for its whole life, and a server limits the streams open
//! at once on one connection (`SETTINGS_MAX_CONCURRENT_STREAMS`: 100 by default in a generic
//! Kubernetes apiserver, 250 in Go's `net/http`, 1000 in aggregated apiservers). hyper's pool
//! keeps one HTTP/2 connection per server and, at the limit, *queues* further requests on it
//! — so with that many open watches a status write or a lease renewal would wait for a watch
//! to end. hyper does not expose the limit the server announced, so [`Spread`] counts the
//! streams it has opened on each connection itself and opens another connection (another
//! hyper client, so another pool) when every one carries `streams_per_connection`. The
//! default, [`DEFAULT_STREAMS_PER_CONNECTION`], stays well below the smallest server default
//! we know, leaving room for streams the server has not yet seen closed. A server configured
//! lower (kube-apiserver's `--http2-max-streams-per-connection`) is asked once, at start, on a
//! connection of its own (`crate::transport::client`'s probe reads its SETTINGS); [`Spread::limit_to`]
//! then lowers the share to three quarters of what it allows.
//!
//! A stream is counted from the request until its response body is dropped (for a watch: the
//! watch's end). Connections are never handed back: their number follows the most streams
//! ever open at once, and a connection idle for hyper's idle timeout (90 s) is closed by hyper
//! and opened again when next needed. Cost: per connection one hyper client (its pool and
//! connection task: the transport forces a task per connection) and one counter.

use std::{
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tower::Service;

/// Streams lazyquota opens on one HTTP/2 connection before it opens another.
pub const DEFAULT_STREAMS_PER_CONNECTION: u16 = 64;

/// Builds one more connection's client.
type Make<C> = Arc<dyn Fn() -> C + Send + Sync>;

/// A [`Service`] spreading requests over as many clients (connections) as the streams open at
/// once need. Cheap to clone: clones share the connections.
pub struct Spread<C> {
    lanes: Arc<Mutex<Vec<Lane<C>>>>,
    make: Make<C>,
    /// Streams per connection now: the configured share, or less once the server said so.
    per_connection: Arc<AtomicUsize>,
}

impl<C> Clone for Spread<C> {
    fn clone(&self) -> Self {
        Self {
            lanes: self.lanes.clone(),
            make: self.make.clone(),
            per_connection: self.per_connection.clone(),
        }
    }
}

struct Lane<C> {
    client: C,
    streams: Arc<AtomicUsize>,
}

impl<C: Clone> Spread<C> {
    /// Spreads over clients `make` builds, at most `per_connection` streams on each (at least 1).
    pub fn new(per_connection: usize, make: impl Fn() -> C + Send + Sync + 'static) -> Self {
        Self {
            lanes: Arc::new(Mutex::new(Vec::new())),
            make: Arc::new(make),
            per_connection: Arc::new(AtomicUsize::new(per_connection.max(1))),
        }
    }

    /// The server allows `server_max` concurrent streams per connection: from now on at most
    /// three quarters of that go on one connection (room for streams the server has not yet
    /// seen closed), if that is below the configured share. Returns the share now.
    pub fn limit_to(&self, server_max: usize) -> usize {
        let cap = (server_max - server_max / 4).max(1);
        let before = self.per_connection.fetch_min(cap, Ordering::Relaxed);
        before.min(cap)
    }

    /// The first client with room for one more stream (a new one if none has), and the
    /// stream's place on it.
    fn pick(&self) -> (C, Stream) {
        let mut lanes = self
            .lanes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let per_connection = self.per_connection.load(Ordering::Relaxed);
        let free = lanes
            .iter()
            .position(|l| l.streams.load(Ordering::Relaxed) < per_connection);
        let i = free.unwrap_or_else(|| {
            lanes.push(Lane {
                client: (self.make)(),
                streams: Arc::new(AtomicUsize::new(0)),
            });
            lanes.len() - 1
        });
        let lane = &lanes[i];
        lane.streams.fetch_add(1, Ordering::Relaxed);
        (lane.client.clone(), Stream(lane.streams.clone()))
    }

    /// Streams open now on each connection's client.
    pub fn streams(&self) -> Vec<usize> {
        let lanes = self
            .lanes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        lanes.iter().map(|l| l.streams.load(Ordering::Relaxed)).collect()
    }
}

/// One stream's place on a connection, given back when dropped.
struct Stream(Arc<AtomicUsize>);

impl Drop for Stream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<C, ReqBody, ResBody> Service<Request<ReqBody>> for Spread<C>
where
    C: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    C::Future: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<Counted<ResBody>>;
    type Error = C::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is the picked client's; hyper's clients are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (mut client, stream) = self.pick();
        let response = client.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| Counted {
                body: Box::pin(body),
                _stream: stream,
            }))
        })
    }
}

/// A response body holding its stream's place until it is dropped.
pub struct Counted<B> {
    body: Pin<Box<B>>,
    _stream: Stream,
}

impl<B: Body<Data = Bytes>> Body for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.body.as_mut().poll_frame(cx)
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
    use std::{convert::Infallible, sync::atomic::AtomicUsize};

    use super::*;

    /// A client that answers at once, numbered by the order it was built in.
    #[derive(Clone)]
    struct Numbered(usize);

    impl Service<Request<()>> for Numbered {
        type Response = Response<String>;
        type Error = Infallible;
        type Future = futures::future::Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _request: Request<()>) -> Self::Future {
            futures::future::ready(Ok(Response::new(self.0.to_string())))
        }
    }

    fn spread(per_connection: usize) -> Spread<Numbered> {
        let built = AtomicUsize::new(0);
        Spread::new(per_connection, move || {
            Numbered(built.fetch_add(1, Ordering::Relaxed))
        })
    }

    #[tokio::test]
    async fn a_new_connection_opens_only_when_every_one_is_full_and_streams_are_given_back() {
        let mut s = spread(2);
        let mut open = Vec::new();
        for _ in 0..5 {
            open.push(s.call(Request::new(())).await.unwrap());
        }
        assert_eq!(
            s.streams(),
            vec![2, 2, 1],
            "two per connection, a third connection for the fifth"
        );
        open.remove(0); // one stream of the first connection ends
        let mut next = s.call(Request::new(())).await.unwrap().into_body();
        assert_eq!(
            s.streams(),
            vec![2, 2, 1],
            "the freed place is reused, no fourth connection"
        );
        let frame = futures::future::poll_fn(|cx| Pin::new(&mut next).poll_frame(cx)).await;
        let data = frame.expect("a frame").unwrap().into_data().unwrap();
        assert_eq!(data, "0", "served by the first connection");
        drop(next);
        drop(open);
        assert_eq!(s.streams(), vec![0, 0, 0]);
    }

    #[tokio::test]
    async fn a_server_allowing_fewer_streams_lowers_the_share_to_three_quarters_of_its_limit() {
        let mut s = spread(64);
        assert_eq!(s.limit_to(100), 64, "a higher server limit changes nothing");
        assert_eq!(s.limit_to(8), 6);
        assert_eq!(s.limit_to(1), 1, "at least one");
        assert_eq!(s.limit_to(100), 1, "never raised again");
        let mut open = Vec::new();
        for _ in 0..3 {
            open.push(s.call(Request::new(())).await.unwrap());
        }
        assert_eq!(s.streams(), vec![1, 1, 1]);
    }
}
