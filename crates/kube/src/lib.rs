//! The IO side of lazyquota: clients, discovery, watches and status writes. Each component
//! is a thin loop around a pure state machine from `lazyquota-index` / `lazyquota-quota`.
//!
//! One folder per job. `transport` uses none of the others and every other uses it; the
//! executor and the metrics still call each other (it counts into them, they read its
//! snapshot):
//! - [`transport`]: the HTTP stack (deadlines, HTTP/2 connection spreading, kcp's path routing);
//! - [`controller`]: the executor that carries the Reconciler's effects out, and its IO helpers
//!   (watch streams, kcp's shared watches and LogicalClusters, discovery, Events, the snapshot
//!   it reports); it uses nothing of `kcp`;
//! - [`kcp`]: one engine per shard (the shard's clients, the restarts of its engine);
//! - [`operate`]: what an operator sees and sets (clusters served, metrics, delegated auth,
//!   leader election, `usage` and `explain` reports).

#![forbid(unsafe_code)]

pub mod controller;
pub mod kcp;
pub mod operate;
pub mod transport;

/// The wall clock as the quota crate takes time (it has no clock of its own).
pub fn now() -> lazyquota_quota::Time {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    lazyquota_quota::Time::from_unix_nanos(i128::try_from(nanos).unwrap_or(i128::MAX))
}

/// The store id of the object named `name`: keyed by a secret chosen once per process (see
/// [`lazyquota_index::keys::ObjectIds`]), the same for every controller of the process.
pub fn object_id(name: &str) -> u64 {
    object_ids().id(name)
}

/// The process's object ids (see [`object_id`]).
pub fn object_ids() -> &'static lazyquota_index::keys::ObjectIds {
    static IDS: std::sync::LazyLock<lazyquota_index::keys::ObjectIds> =
        std::sync::LazyLock::new(|| lazyquota_index::keys::ObjectIds::new(std::hash::RandomState::new()));
    &IDS
}
