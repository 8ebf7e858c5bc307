//! Feature gates that change quota results, by Kubernetes release. They must mirror the
//! target kube-controller-manager, whose gates are what upstream consults; a cluster's release
//! picks the defaults ([`FeatureGates::for_version`]) and `--feature-gates` changes them the
//! way KCM's flag does ([`FeatureGates::set`]).
//!
//! The defaults are read from `pkg/features/kube_features.go` of each release (v1.33.13,
//! v1.34.12, v1.35.8, v1.36.5, v1.37.2): a gate's default in release `1.N` is its last
//! versioned entry at or before `1.N`.

use std::fmt;

/// The oldest Kubernetes minor whose defaults are known.
pub const OLDEST_MINOR: u16 = 33;
/// The newest Kubernetes minor whose defaults are known.
pub const NEWEST_MINOR: u16 = 37;

/// The feature gates the quota evaluators read, and the release whose evaluator code applies.
///
/// [`Default`] is the newest known release's defaults. Projections are extracted under a given
/// set of gates: changing gates requires re-extracting them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(clippy::struct_excessive_bools)] // one flag per upstream gate is the natural shape
pub struct FeatureGates {
    /// The Kubernetes minor (`1.N`) whose evaluator *code* applies, apart from gates: from 1.35
    /// the pods evaluator treats `deviceclass.resource.kubernetes.io/<class>` as an extended
    /// resource; from 1.36 an extended-resource claim is offset by its pod's usage only when it
    /// is the pod's first such claim.
    pub minor: u16,
    /// `InPlacePodVerticalScaling` (beta on in 1.33, GA and locked on since 1.35): pod usage is
    /// the maximum of spec, allocated and actuated resources, and status resource changes
    /// replenish quota.
    pub in_place_pod_vertical_scaling: bool,
    /// `PodLevelResources` (alpha off in 1.33, beta on since 1.34): `spec.resources` overrides
    /// the container aggregate for cpu, memory and hugepages, and decides the QoS class.
    pub pod_level_resources: bool,
    /// `InPlacePodLevelResourcesVerticalScaling` (alpha 1.35, beta on in 1.36). Upstream's pod
    /// evaluator does not pass it to `PodRequests`, so it has no effect on quota; kept for
    /// completeness.
    pub in_place_pod_level_resources_vertical_scaling: bool,
    /// `VolumeAttributesClass` (beta off in 1.33, GA on in 1.34, locked in 1.36): enables the
    /// PVC scope of that name.
    pub volume_attributes_class: bool,
    /// `DynamicResourceAllocation` (beta off in 1.33, GA on in 1.34, locked in 1.35):
    /// registers the resourceclaims evaluator.
    pub dynamic_resource_allocation: bool,
    /// `DRAExtendedResource` (alpha off in 1.34–1.35, beta on in 1.36, GA locked in 1.37): the
    /// resourceclaims evaluator also charges `requests.deviceclass.resource.kubernetes.io/<class>`
    /// and the `requests.<ext>` a DeviceClass maps, less what the claim's pod already charges.
    pub dra_extended_resource: bool,
    /// `DRANodeAllocatableResources` (alpha off in 1.36). Not read by the pod evaluator.
    pub dra_node_allocatable_resources: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self::for_minor(NEWEST_MINOR)
    }
}

/// One upstream gate: its name, the first minor that has it, and from which minor it is
/// locked to its default (KCM refuses to change it).
struct Gate {
    name: &'static str,
    since: u16,
    locked_since: Option<u16>,
    field: fn(&mut FeatureGates) -> &mut bool,
}

const GATES: &[Gate] = &[
    Gate {
        name: "InPlacePodVerticalScaling",
        since: 27,
        locked_since: Some(35),
        field: |g| &mut g.in_place_pod_vertical_scaling,
    },
    Gate {
        name: "PodLevelResources",
        since: 32,
        locked_since: None,
        field: |g| &mut g.pod_level_resources,
    },
    Gate {
        name: "InPlacePodLevelResourcesVerticalScaling",
        since: 35,
        locked_since: None,
        field: |g| &mut g.in_place_pod_level_resources_vertical_scaling,
    },
    Gate {
        name: "VolumeAttributesClass",
        since: 29,
        locked_since: Some(36),
        field: |g| &mut g.volume_attributes_class,
    },
    Gate {
        name: "DynamicResourceAllocation",
        since: 26,
        locked_since: Some(35),
        field: |g| &mut g.dynamic_resource_allocation,
    },
    Gate {
        name: "DRAExtendedResource",
        since: 34,
        locked_since: Some(37),
        field: |g| &mut g.dra_extended_resource,
    },
    Gate {
        name: "DRANodeAllocatableResources",
        since: 36,
        locked_since: None,
        field: |g| &mut g.dra_node_allocatable_resources,
    },
];

/// A `--feature-gates` entry KCM would refuse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// Not `Name=true|false`.
    #[error("feature gate {0:?} is not Name=true or Name=false")]
    Syntax(String),
    /// A gate this release does not have, or one that does not change quota.
    #[error(
        "unrecognized feature gate {name} for Kubernetes 1.{minor} (the gates that change quota: {known})"
    )]
    Unknown {
        /// The name given.
        name: String,
        /// The release.
        minor: u16,
        /// The gates that can be set.
        known: String,
    },
    /// A gate locked to its default in this release.
    #[error("cannot set feature gate {name} to {value}: it is locked to {} in Kubernetes 1.{minor}", !value)]
    Locked {
        /// The gate.
        name: &'static str,
        /// The value asked for.
        value: bool,
        /// The release.
        minor: u16,
    },
}

/// How a server's version string was mapped to a known release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionFit {
    /// A release whose defaults are known.
    Known,
    /// Newer than the newest known release: the newest defaults are used.
    Newer(u16),
    /// Older than the oldest known release: the oldest defaults are used.
    Older(u16),
    /// Not a `v1.N…` version (kcp built without version flags reports a placeholder): the
    /// newest defaults are used.
    Unparsed(String),
}

impl fmt::Display for VersionFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Known => f.write_str("known release"),
            Self::Newer(m) => write!(
                f,
                "Kubernetes 1.{m} is newer than the newest release lazyquota knows (1.{NEWEST_MINOR}): using 1.{NEWEST_MINOR}'s feature gates"
            ),
            Self::Older(m) => write!(
                f,
                "Kubernetes 1.{m} is older than the oldest release lazyquota knows (1.{OLDEST_MINOR}): using 1.{OLDEST_MINOR}'s feature gates"
            ),
            Self::Unparsed(v) => write!(
                f,
                "server version {v:?} is not a Kubernetes release: using 1.{NEWEST_MINOR}'s feature gates"
            ),
        }
    }
}

impl FeatureGates {
    /// Kubernetes v1.36 defaults.
    pub const V1_36: Self = Self::for_minor(36);

    /// The defaults of release `1.minor`, clamped to the known releases.
    pub const fn for_minor(minor: u16) -> Self {
        let minor = if minor < OLDEST_MINOR {
            OLDEST_MINOR
        } else if minor > NEWEST_MINOR {
            NEWEST_MINOR
        } else {
            minor
        };
        Self {
            minor,
            in_place_pod_vertical_scaling: true,
            pod_level_resources: minor >= 34,
            in_place_pod_level_resources_vertical_scaling: minor >= 36,
            volume_attributes_class: minor >= 34,
            dynamic_resource_allocation: minor >= 34,
            dra_extended_resource: minor >= 36,
            dra_node_allocatable_resources: false,
        }
    }

    /// The defaults for a server reporting `git_version` (`/version`'s `gitVersion`, e.g.
    /// `v1.36.3` or `v1.37.0-rc.1+k3s1`), and how well it fits.
    pub fn for_version(git_version: &str) -> (Self, VersionFit) {
        match parse_minor(git_version) {
            None => (Self::default(), VersionFit::Unparsed(git_version.to_owned())),
            Some(m) if m > NEWEST_MINOR => (Self::for_minor(m), VersionFit::Newer(m)),
            Some(m) if m < OLDEST_MINOR => (Self::for_minor(m), VersionFit::Older(m)),
            Some(m) => (Self::for_minor(m), VersionFit::Known),
        }
    }

    /// Sets one gate as KCM's `--feature-gates Name=value` would, refusing what KCM refuses:
    /// a gate this release lacks and a locked gate set away from its default.
    pub fn set(&mut self, name: &str, value: bool) -> Result<(), GateError> {
        let minor = self.minor;
        let Some(gate) = GATES.iter().find(|g| g.name == name && g.since <= minor) else {
            return Err(GateError::Unknown {
                name: name.to_owned(),
                minor,
                known: self.names().join(", "),
            });
        };
        let field = (gate.field)(self);
        if gate.locked_since.is_some_and(|l| l <= minor) && *field != value {
            return Err(GateError::Locked {
                name: gate.name,
                value,
                minor,
            });
        }
        *field = value;
        Ok(())
    }

    /// Applies `Name=bool,Name=bool` (KCM's `--feature-gates` syntax) in order.
    pub fn apply(&mut self, overrides: &[(String, bool)]) -> Result<(), GateError> {
        overrides
            .iter()
            .try_for_each(|(name, value)| self.set(name, *value))
    }

    /// The gates of this release and their values, in upstream's names.
    pub fn values(&self) -> Vec<(&'static str, bool)> {
        let mut copy = *self;
        GATES
            .iter()
            .filter(|g| g.since <= self.minor)
            .map(|g| (g.name, *(g.field)(&mut copy)))
            .collect()
    }

    /// `Name=true,Name=false,…` of the gates this release has (for logs and `explain`).
    pub fn describe(&self) -> String {
        self.values()
            .iter()
            .map(|(name, on)| format!("{name}={on}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn names(&self) -> Vec<&'static str> {
        self.values().into_iter().map(|(n, _)| n).collect()
    }
}

/// Parses `Name=true,Name=false` as KCM's `--feature-gates` does (names are checked later,
/// against the cluster's release).
pub fn parse_overrides(text: &str) -> Result<Vec<(String, bool)>, GateError> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| {
            let (name, value) = entry
                .split_once('=')
                .ok_or_else(|| GateError::Syntax(entry.to_owned()))?;
            let value = match value.trim().to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => return Err(GateError::Syntax(entry.to_owned())),
            };
            Ok((name.trim().to_owned(), value))
        })
        .collect()
}

/// The minor of a `v1.N[.P][-pre][+build]` version.
fn parse_minor(version: &str) -> Option<u16> {
    let rest = version.strip_prefix('v').unwrap_or(version).strip_prefix("1.")?;
    let digits: &str = &rest[..rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len())];
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_each_release() {
        let g33 = FeatureGates::for_minor(33);
        assert!(!g33.dynamic_resource_allocation && !g33.pod_level_resources && !g33.volume_attributes_class);
        let g34 = FeatureGates::for_minor(34);
        assert!(g34.dynamic_resource_allocation && g34.pod_level_resources && !g34.dra_extended_resource);
        assert!(!FeatureGates::for_minor(35).dra_extended_resource);
        assert!(FeatureGates::for_minor(36).dra_extended_resource);
        assert_eq!(FeatureGates::V1_36.minor, 36);
        assert_eq!(FeatureGates::default().minor, NEWEST_MINOR);
    }

    #[test]
    fn versions_map_to_releases_and_say_when_they_do_not_fit() {
        assert_eq!(
            FeatureGates::for_version("v1.34.12").0,
            FeatureGates::for_minor(34)
        );
        assert_eq!(FeatureGates::for_version("v1.35.0-rc.1+k3s1").0.minor, 35);
        assert_eq!(FeatureGates::for_version("v1.36.3").1, VersionFit::Known);
        assert_eq!(
            FeatureGates::for_version("v1.40.0"),
            (FeatureGates::for_minor(37), VersionFit::Newer(40))
        );
        assert_eq!(FeatureGates::for_version("v1.30.2").1, VersionFit::Older(30));
        let (gates, fit) = FeatureGates::for_version("v0.0.0-master+$Format:%H$");
        assert_eq!(gates, FeatureGates::default());
        assert!(matches!(fit, VersionFit::Unparsed(_)));
    }

    #[test]
    fn setting_gates_refuses_what_kcm_refuses() {
        let mut g = FeatureGates::for_minor(35);
        g.set("DRAExtendedResource", true).unwrap();
        assert!(g.dra_extended_resource);
        assert!(matches!(
            g.set("DynamicResourceAllocation", false),
            Err(GateError::Locked { .. })
        ));
        g.set("DynamicResourceAllocation", true).unwrap();
        assert!(matches!(
            g.set("DRANodeAllocatableResources", true),
            Err(GateError::Unknown { .. })
        ));
        assert!(matches!(
            g.set("NoSuchGate", true),
            Err(GateError::Unknown { .. })
        ));
        let mut g34 = FeatureGates::for_minor(34);
        g34.set("DynamicResourceAllocation", false).unwrap();
        assert!(!g34.dynamic_resource_allocation);
        assert!(matches!(
            FeatureGates::for_minor(37).set("DRAExtendedResource", false),
            Err(GateError::Locked { .. })
        ));
    }

    #[test]
    fn overrides_parse_like_kcms_flag() {
        assert_eq!(
            parse_overrides("DRAExtendedResource=true, PodLevelResources=False").unwrap(),
            vec![
                ("DRAExtendedResource".into(), true),
                ("PodLevelResources".into(), false)
            ]
        );
        assert!(matches!(
            parse_overrides("DRAExtendedResource"),
            Err(GateError::Syntax(_))
        ));
        assert!(matches!(parse_overrides("A=yes"), Err(GateError::Syntax(_))));
        assert_eq!(parse_overrides("").unwrap(), vec![]);
    }

    #[test]
    fn values_list_only_the_gates_a_release_has() {
        let names: Vec<_> = FeatureGates::for_minor(33)
            .values()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert!(!names.contains(&"DRAExtendedResource"));
        assert_eq!(FeatureGates::for_minor(36).values().len(), GATES.len());
    }
}
