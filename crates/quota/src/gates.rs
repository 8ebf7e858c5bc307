//! Feature gates that change quota results. They must mirror the target
//! kube-controller-manager, whose gates are what upstream consults.

/// The feature gates the quota evaluators read.
///
/// [`Default`] is the Kubernetes v1.36 default set (`pkg/features/kube_features.go`).
/// Projections are extracted under a given set of gates: changing gates requires
/// re-extracting them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(clippy::struct_excessive_bools)] // one flag per upstream gate is the natural shape
pub struct FeatureGates {
    /// `InPlacePodVerticalScaling` (GA and locked on since 1.35): pod usage is the maximum of
    /// spec, allocated and actuated resources, and status resource changes replenish quota.
    pub in_place_pod_vertical_scaling: bool,
    /// `PodLevelResources` (beta, on since 1.34): `spec.resources` overrides the container
    /// aggregate for cpu, memory and hugepages, and decides the QoS class.
    pub pod_level_resources: bool,
    /// `InPlacePodLevelResourcesVerticalScaling` (beta, on in 1.36). Upstream's pod evaluator
    /// does not pass it to `PodRequests`, so it has no effect on quota; kept for completeness.
    pub in_place_pod_level_resources_vertical_scaling: bool,
    /// `VolumeAttributesClass` (GA, locked on in 1.36): enables the PVC scope of that name.
    pub volume_attributes_class: bool,
    /// `DynamicResourceAllocation` (GA, locked on since 1.35): registers the resourceclaims
    /// evaluator.
    pub dynamic_resource_allocation: bool,
    /// `DRAExtendedResource` (beta, on in 1.36): the resourceclaims evaluator also answers to
    /// `requests.deviceclass.resource.kubernetes.io/<class>` and mapped `requests.<ext>`.
    pub dra_extended_resource: bool,
    /// `DRANodeAllocatableResources` (alpha, off in 1.36). Not read by the pod evaluator.
    pub dra_node_allocatable_resources: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self::V1_36
    }
}

impl FeatureGates {
    /// Kubernetes v1.36 defaults.
    pub const V1_36: Self = Self {
        in_place_pod_vertical_scaling: true,
        pod_level_resources: true,
        in_place_pod_level_resources_vertical_scaling: true,
        volume_attributes_class: true,
        dynamic_resource_allocation: true,
        dra_extended_resource: true,
        dra_node_allocatable_resources: false,
    };
}
