//! The IO side of lazyquota: clients, discovery, watches and status writes. Each component
//! is a thin loop around a pure state machine from `lazyquota-index` / `lazyquota-quota`.

pub mod client;
pub mod controller;
pub mod discovery;
pub mod watch;
