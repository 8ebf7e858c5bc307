//! The faults, each set up, injected and lifted the same way for both controllers.

use std::{fmt, time::Duration};

use k8s_openapi::{
    api::core::v1::Service, apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, PostParams},
};
use lazyquota_testenv::unavailable;

/// The group of the broken CRD (F1, F2): what a controller's logs, Events and metrics should
/// name.
pub(crate) const BROKEN_GROUP: &str = "broken.faults.lazyquota.test";
/// The group of the APIService without a backend (F3).
pub(crate) const GHOST_GROUP: &str = "ghost.faults.lazyquota.test";

/// One fault of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Fault {
    /// A CRD whose conversion webhook does not answer, present when the controller starts.
    F1,
    /// The same CRD appearing while the controller runs.
    F2,
    /// An APIService whose backend is gone.
    F3,
    /// kube-apiserver killed and started again.
    F4,
    /// etcd compacted at its current revision and restarted (the watch cache on).
    F5,
    /// As F5 with the apiserver's watch cache off: every watch is served by etcd, so a watch
    /// resumed below the compaction gets 410 Gone.
    F5NoCache,
    /// The controller killed (SIGKILL) and started again.
    F6,
    /// Two replicas with leader election; the leader killed (and started again, as a standby).
    F7,
    /// The controller's connection to the apiserver black-holed for 30 s.
    F8,
    /// A tenant editing the quota's spec every 100 ms while its namespace churns.
    F9,
}

impl Fault {
    pub(crate) const ALL: [Self; 10] = [
        Self::F1,
        Self::F2,
        Self::F3,
        Self::F4,
        Self::F5,
        Self::F5NoCache,
        Self::F6,
        Self::F7,
        Self::F8,
        Self::F9,
    ];

    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|f| f.to_string().eq_ignore_ascii_case(name))
    }

    /// What the fault is, for the result file.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::F1 => {
                "a CRD whose conversion webhook does not answer (stored v1, served v2), present when the controller starts; it stays broken"
            }
            Self::F2 => "the same CRD appearing while the controller runs; it stays broken",
            Self::F3 => "an APIService whose backend is gone (its Service has no endpoints); it stays",
            Self::F4 => "kube-apiserver killed (SIGKILL) and started again",
            Self::F5 => "etcd compacted at its current revision, killed and started again (watch cache on)",
            Self::F5NoCache => "as F5 with kube-apiserver's watch cache off (`--watch-cache=false`)",
            Self::F6 => "the controller killed (SIGKILL) in the middle of churn and started again 1 s later",
            Self::F7 => {
                "two replicas with leader election; the leader killed (SIGKILL) under churn, its pod gone, a new replica (a name of its own) started 1 s later"
            }
            Self::F8 => {
                "the controller's connection to kube-apiserver black-holed for 30 s (a loopback proxy that forwards nothing and closes nothing), then restored"
            }
            Self::F9 => {
                "a tenant editing the churning namespace's quota spec every 100 ms (a second key toggled between 100 and 101; `hard` never below the objects)"
            }
        }
    }

    /// Whether the fault is there before the controller starts.
    pub(crate) fn before_start(self) -> bool {
        self == Self::F1
    }

    /// Whether the fault stays after its window (a broken webhook stays broken until someone
    /// fixes it).
    pub(crate) fn persists(self) -> bool {
        matches!(self, Self::F1 | Self::F2 | Self::F3)
    }

    /// How long the fault lasts, given the run's window.
    pub(crate) fn duration(self, window: Duration) -> Duration {
        match self {
            Self::F8 => Duration::from_secs(30),
            _ => window / 2,
        }
    }

    /// kube-apiserver flags of the control plane.
    pub(crate) fn apiserver_args(self) -> &'static str {
        if self == Self::F5NoCache {
            "--watch-cache=false"
        } else {
            ""
        }
    }

    /// Text that names the cause, searched (case-insensitively) in each controller's log, the
    /// Events and the metrics; none where the cause is the controller's own process.
    pub(crate) fn culprit(self) -> &'static [&'static str] {
        match self {
            Self::F1 | Self::F2 => &[BROKEN_GROUP],
            Self::F3 => &[GHOST_GROUP],
            Self::F4 => &[
                "connection refused",
                "connection reset",
                "error trying to connect",
            ],
            // Not "410": it matches timestamps.
            Self::F5 | Self::F5NoCache => &["too old resource version", "expired", "gone"],
            Self::F8 => &["timed out", "timeout", "deadline"],
            Self::F6 | Self::F7 | Self::F9 => &[],
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::F5NoCache => f.write_str("F5-nocache"),
            other => write!(f, "{other:?}"),
        }
    }
}

/// Creates the CRD whose served version v2 needs a conversion webhook that never answers (a
/// loopback listener that accepts and says nothing, kept by the caller), and one object stored
/// at v1, so that listing v2 needs a conversion.
pub(crate) async fn create_broken_crd(client: &Client, webhook_port: u16, namespace: &str) {
    let crd = unavailable::broken_conversion_crd(
        BROKEN_GROUP,
        &format!("https://127.0.0.1:{webhook_port}/convert"),
    );
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd)
        .await
        .expect("create the broken CRD");
    let v1 = ApiResource {
        group: BROKEN_GROUP.into(),
        version: "v1".into(),
        api_version: format!("{BROKEN_GROUP}/v1"),
        kind: "Broken".into(),
        plural: "brokens".into(),
    };
    let object: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": format!("{BROKEN_GROUP}/v1"), "kind": "Broken",
        "metadata": {"name": "stored-at-v1"}
    }))
    .expect("object");
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &v1);
    // The CRD's v1 is served a moment after it is created.
    for _ in 0..100 {
        if api.create(&PostParams::default(), &object).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no object could be stored at v1 of the broken CRD");
}

/// A loopback listener that accepts connections and never answers: a conversion webhook that
/// hangs. Runs until the process ends.
pub(crate) async fn silent_webhook() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        // Bounded: a few thousand held connections is far more than any run makes.
        while held.len() < 4_096 {
            let Ok((stream, _)) = listener.accept().await else {
                break;
            };
            held.push(stream);
        }
    });
    port
}

/// Creates an APIService for [`GHOST_GROUP`] whose Service (in `namespace`) has no endpoints.
pub(crate) async fn create_ghost_apiservice(client: &Client, namespace: &str) {
    let service = unavailable::ghost_service();
    Api::<Service>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &service)
        .await
        .expect("a Service without endpoints");
    let apiservice = unavailable::ghost_apiservice(GHOST_GROUP, namespace);
    Api::<APIService>::all(client.clone())
        .create(&PostParams::default(), &apiservice)
        .await
        .expect("create the APIService");
}
