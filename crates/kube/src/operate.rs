//! What an operator sets and sees: which clusters are served, metrics and their delegated
//! authorization, leader election, and the `usage` and `explain` reports.

pub mod delegated;
pub mod lease;
pub mod metrics;
pub mod report;
pub mod source;
