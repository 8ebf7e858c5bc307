//! `DefaultUpdateFilter` (`pkg/quota/v1/install/update_filter.go`): which update events of
//! monitored objects trigger a replenishment. Deletes always do; adds never do.

use crate::gates::FeatureGates;
use crate::names::GroupResource;
use crate::pod::PodProjection;
use crate::pvc::PvcProjection;
use crate::service::ServiceProjection;
use crate::time::Time;

/// Pods: a container status' resources changed (with `InPlacePodVerticalScaling`), the
/// Terminating scope flipped, or the pod went from charged to uncharged at `now` (the
/// event time; upstream uses the real clock).
pub fn pod_update_triggers(old: &PodProjection, new: &PodProjection, now: Time, gates: FeatureGates) -> bool {
    if gates.in_place_pod_vertical_scaling && new.status_resources_changed_since(old) {
        return true;
    }
    if old.is_terminating() != new.is_terminating() {
        return true;
    }
    old.is_charged(now) && !new.is_charged(now)
}

/// Services: the quota service type (NodePort, LoadBalancer or other) changed. Port count
/// and `allocateLoadBalancerNodePorts` changes do not trigger.
pub fn service_update_triggers(old: &ServiceProjection, new: &ServiceProjection) -> bool {
    old.service_type() != new.service_type()
}

/// PVCs: always. `RequiresQuotaReplenish` compares two freshly allocated `*Quantity`
/// pointers from `ResourceList.Storage()`, which are never equal, so every update
/// (informer resyncs included) triggers.
pub fn pvc_update_triggers(_old: &PvcProjection, _new: &PvcProjection) -> bool {
    true
}

/// Whether updates of a resource without a projection trigger: never (upstream's default
/// branch), e.g. custom resources counted with `count/<r>.<g>`.
pub fn other_update_triggers(_gr: &GroupResource) -> bool {
    false
}
