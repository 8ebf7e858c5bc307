//! Pure state for lazyquota: which resource types some ResourceQuota demands, and the compact
//! per-object usage needed to recompute `status.used`. No IO and no kube client.
