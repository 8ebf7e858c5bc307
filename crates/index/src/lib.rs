//! Pure state for lazyquota: which resource types some ResourceQuota demands, and the compact
//! per-object usage needed to recompute `status.used`. No IO and no kube client.
//!
//! ```text
//!  ResourceQuota events ──► PolicyIndex ──► DemandChange (cluster, resource, namespace, need)
//!                                                  │
//!  watch events ──► UsageStore partitions ◄────────┘ held only while demanded
//! ```
//!
//! - [`engine`]: all of the above plus the evaluators, and the computation of a quota.
//! - [`demand`]: what one hard key needs watched (upstream's evaluator matching).
//! - [`policy`]: quotas and the reference-counted demand, mutations return diffs.
//! - [`store`]: object identities and projections per (cluster, resource, namespace).
//! - [`lowering`]: when a computed `used` may be written below the stored one.
//! - [`queue`]: the reconciler's work queue (dedup, per-key backoff).
//! - [`resolver`]: which resources each cluster serves and can be quota'd (discovery).
//! - [`keys`]: identities, all carrying the logical cluster.
//! - [`planner`]: which watches to run and why; [`watches`]: the running ones, and what their
//!   events do (the controller only carries out its actions).
//! - [`membership`], [`sharing`], [`fanout`]: kcp's shard-level decisions.

#![forbid(unsafe_code)]

pub mod charges;
pub mod demand;
pub mod discoveries;
pub mod engine;
pub mod fanout;
pub mod keys;
pub mod lowering;
pub mod membership;
pub mod mutation;
pub mod planner;
pub mod policy;
pub mod queue;
pub mod reconciler;
pub mod resolver;
pub mod sharing;
pub mod sorted;
pub mod store;
pub mod watches;
