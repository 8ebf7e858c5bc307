//! The IO side of lazyquota: clients, discovery, watches and status writes. Each component
//! is a thin loop around a pure state machine from `lazyquota-index` / `lazyquota-quota`.

mod api_changes;
pub mod client;
pub mod controller;
pub mod deadline;
pub mod delegated;
pub mod discovery;
pub mod events;
pub mod hub;
pub mod kcp;
pub mod lease;
pub mod members;
pub mod metrics;
pub mod report;
pub mod route;
pub mod shard;
pub mod snapshot;
pub mod source;
pub mod spread;
pub mod watch;

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
