//! The services evaluator (`pkg/quota/v1/evaluator/core/services.go`).

use k8s_openapi::api::core::v1::Service;

use crate::gates::FeatureGates;
use crate::names::{COUNT_SERVICES, SERVICES, SERVICES_LOAD_BALANCERS, SERVICES_NODE_PORTS};
use crate::quantity::{Format, Quantity};
use crate::scope::{ScopeError, ScopeRequirement};
use crate::time::Time;
use crate::usage::{QuotaObject, ScopeClassed, UsageKey};

/// `GetQuotaServiceType`: the service types quota distinguishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuotaServiceType {
    /// `NodePort`.
    NodePort,
    /// `LoadBalancer`.
    LoadBalancer,
    /// Anything else (`ClusterIP`, `ExternalName`): upstream's `""`.
    Other,
}

/// What quota needs of a service: 8 bytes, no heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServiceProjection {
    service_type: QuotaServiceType,
    /// The `services.nodeports` charge, precomputed.
    node_ports: u32,
}

impl ServiceProjection {
    /// Extracts the projection of a typed service.
    pub fn from_service(service: &Service) -> Self {
        let spec = service.spec.as_ref();
        let ports = spec.and_then(|s| s.ports.as_deref()).unwrap_or_default();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let service_type = match spec.and_then(|s| s.type_.as_deref()) {
            Some("NodePort") => QuotaServiceType::NodePort,
            Some("LoadBalancer") => QuotaServiceType::LoadBalancer,
            _ => QuotaServiceType::Other,
        };
        let suppressed = spec.and_then(|s| s.allocate_load_balancer_node_ports) == Some(false);
        let node_ports = match service_type {
            // With node port allocation suppressed only explicit node ports are charged:
            // they are the intent, the allocated ones may not exist yet.
            QuotaServiceType::LoadBalancer if suppressed => count(
                ports
                    .iter()
                    .filter(|p| p.node_port.is_some_and(|n| n != 0))
                    .count(),
            ),
            QuotaServiceType::NodePort | QuotaServiceType::LoadBalancer => count(ports.len()),
            QuotaServiceType::Other => 0,
        };
        Self {
            service_type,
            node_ports,
        }
    }

    /// The quota service type (what the update filter compares).
    pub fn service_type(&self) -> QuotaServiceType {
        self.service_type
    }

    /// The `services.nodeports` charge.
    pub fn node_ports(&self) -> u32 {
        self.node_ports
    }
}

impl QuotaObject for ServiceProjection {
    /// `MatchesNoScopeFunc`: services match no scope.
    fn matches_scope(&self, requirement: &ScopeRequirement, gates: FeatureGates) -> Result<bool, ScopeError> {
        Self::class_matches_scope(&(), requirement, gates)
    }

    fn for_each_usage(&self, _now: Time, emit: &mut dyn FnMut(UsageKey<'_>, Quantity)) {
        emit(UsageKey::name(COUNT_SERVICES), Quantity::from_count(1));
        emit(UsageKey::name(SERVICES), Quantity::from_count(1));
        let load_balancers = if self.service_type == QuotaServiceType::LoadBalancer {
            Quantity::from_count(1)
        } else {
            Quantity::zero(Format::DecimalSI)
        };
        emit(UsageKey::name(SERVICES_LOAD_BALANCERS), load_balancers);
        emit(
            UsageKey::name(SERVICES_NODE_PORTS),
            Quantity::from_count(u64::from(self.node_ports)),
        );
    }
}

impl ScopeClassed for ServiceProjection {
    /// Services match no scope: one class.
    type Class = ();

    fn scope_class(&self) {}

    fn class_matches_scope((): &(), _: &ScopeRequirement, _: FeatureGates) -> Result<bool, ScopeError> {
        Ok(false)
    }
}
