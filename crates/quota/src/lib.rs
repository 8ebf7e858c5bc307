//! Pure ResourceQuota semantics, value-equal to the upstream kube-controller-manager.
//!
//! No IO, no kube client and no clock of its own: time is passed in.
