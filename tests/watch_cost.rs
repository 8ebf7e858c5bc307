//! What an open watch costs in lazyquota's own heap, layer by layer, against the real
//! kube-apiserver: jemalloc's allocated bytes around `WATCHES` watches of each kind, all kept
//! open at once. `--nocapture` prints the figures docs/design.md cites. It answers whether a
//! watch loop of our own would pay: only what lies above the HTTP/2 stream could be saved.
#![cfg(all(target_os = "linux", target_env = "gnu"))]

mod common;

use std::{sync::Arc, time::Duration};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PartialObjectMeta, WatchParams};
use lazyquota_index::{
    keys::{ClusterName, Need},
    planner::WatchKey,
    resolver::ServedResource,
};
use lazyquota_kube::{
    controller::watch::{self, WatchItem},
    transport::client::{Pool, Transport},
    transport::route::Route,
};
use lazyquota_quota::{FeatureGates, Interner, names::GroupResource};
use lazyquota_testenv::{ControlPlane, Flavor, TestNamespace};
use tikv_jemalloc_ctl::{epoch, stats};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Watches of each kind measured together.
const WATCHES: usize = 300;
/// Watches of each kind opened first and kept, so that one-time costs (interned names, the
/// connection, buffers that grow once) are not counted.
const WARM_UP: usize = 20;

fn allocated() -> f64 {
    epoch::advance().expect("jemalloc epoch");
    #[allow(clippy::cast_precision_loss)] // a byte count as a float, for a ratio
    let bytes = stats::allocated::read().expect("jemalloc stats") as f64;
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_watch_costs_under_16_kib_of_heap() {
    #[allow(clippy::cast_precision_loss)]
    let per = |bytes: f64| bytes / WATCHES as f64;
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "watch-cost")
        .await
        .expect("namespace");
    let config = ControlPlane::get(Flavor::LazyquotaOnly)
        .config()
        .await
        .expect("config");
    // The controller's own client stack: HTTP/2, every watch a stream of one connection.
    let pool = Pool::new(
        &config,
        Transport::Http2 {
            streams_per_connection: 1_000,
        },
    )
    .expect("pool");
    let client = pool.client(config).expect("client");
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    for name in ["a", "b", "c"] {
        common::create_configmap(&ns, name).await;
    }
    let served = ServedResource {
        resource: GroupResource::core("configmaps"),
        version: "v1".into(),
        kind: "ConfigMap".into(),
        namespaced: true,
        verbs: vec!["list".into(), "watch".into()],
    };
    let key = WatchKey {
        cluster: ClusterName::new("default"),
        resource: served.resource.clone(),
        namespace: Some(ns.name().to_owned()),
        need: Need::Count,
    };
    let interner = Arc::new(Interner::default());
    let options = watch::WatchOptions {
        streaming_lists: false,
        gates: FeatureGates::default(),
    };

    // 1. What the controller opens (`watch::open`: kube's watcher, its list, then its watch
    //    request with kube's line buffer): listed to InitDone, then open until an event
    //    arrives on every one of them.
    let mut opened = Vec::new();
    let mut open = async |count: usize| {
        for i in 0..count {
            let (mut stream, handle) =
                watch::open(&client, &Route::direct(), &served, &key, options, &interner, i);
            while !matches!(stream.next().await.expect("watch item").1, WatchItem::InitDone) {}
            opened.push((stream, handle));
        }
    };
    open(WARM_UP).await;
    let before = allocated();
    open(WATCHES).await;
    common::create_configmap(&ns, "d").await;
    for (stream, _) in &mut opened {
        let item = tokio::time::timeout(Duration::from_secs(30), stream.next()).await;
        assert!(
            matches!(item, Ok(Some((_, WatchItem::Apply(_))))),
            "every watch is open and sees the new object"
        );
    }
    let controller_watch = per(allocated() - before);

    // 2. kube's watch stream alone (its request, line buffer and decoding; no watcher).
    let metadata: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client.clone(), ns.name());
    let mut streams = Vec::new();
    let mut open = async |count: usize| {
        for _ in 0..count {
            let mut stream = metadata
                .watch_metadata(&WatchParams::default().timeout(290), "0")
                .await
                .expect("watch")
                .boxed();
            for _ in 0..4 {
                stream.next().await.expect("event").expect("event");
            }
            streams.push(stream);
        }
    };
    open(WARM_UP).await;
    let before = allocated();
    open(WATCHES).await;
    let kube_stream = per(allocated() - before);

    // 3. The HTTP/2 stream alone: the response of a watch request through our client stack
    //    (deadline layer included), its body kept. It starts at the resourceVersion of a list,
    //    so no event is waiting unread in it.
    let mut bodies = Vec::new();
    let listed = configmaps
        .list_metadata(&ListParams::default())
        .await
        .expect("list");
    let path = format!(
        "/api/v1/namespaces/{}/configmaps?watch=true&resourceVersion={}&timeoutSeconds=290",
        ns.name(),
        listed.metadata.resource_version.expect("resourceVersion")
    );
    let mut open = async |count: usize| {
        for _ in 0..count {
            let request = http::Request::get(&path)
                .body(kube::client::Body::from(Vec::new()))
                .expect("request");
            bodies.push(client.send(request).await.expect("watch response").into_body());
        }
    };
    open(WARM_UP).await;
    let before = allocated();
    open(WATCHES).await;
    let http2_stream = per(allocated() - before);

    println!(
        "per open watch: as the controller opens it {controller_watch:.0} B; kube's watch \
         stream alone {kube_stream:.0} B; the HTTP/2 response stream alone, idle, \
         {http2_stream:.0} B"
    );
    assert!(
        controller_watch < 16_384.0,
        "{controller_watch} bytes per watch::open"
    );
    assert!(
        http2_stream < controller_watch,
        "the stream is part of the watch ({http2_stream} vs {controller_watch})"
    );
    drop((opened, streams, bodies));
}
