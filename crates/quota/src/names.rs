//! Quota resource names: constants, classification and the helpers upstream uses to decide
//! which evaluator serves a name (`pkg/apis/core/v1/helper`, `pkg/quota/v1/evaluator/core`,
//! `pkg/quota/v1/install/registry.go`).

use std::fmt;

/// `pods`: pods in a non-terminal state.
pub const PODS: &str = "pods";
/// `cpu`: alias of `requests.cpu`.
pub const CPU: &str = "cpu";
/// `memory`: alias of `requests.memory`.
pub const MEMORY: &str = "memory";
/// `ephemeral-storage`: alias of `requests.ephemeral-storage`.
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
/// `storage`: the PVC request resource.
pub const STORAGE: &str = "storage";
/// `requests.cpu`.
pub const REQUESTS_CPU: &str = "requests.cpu";
/// `requests.memory`.
pub const REQUESTS_MEMORY: &str = "requests.memory";
/// `requests.ephemeral-storage`.
pub const REQUESTS_EPHEMERAL_STORAGE: &str = "requests.ephemeral-storage";
/// `requests.storage`: the sum of PVC storage requests.
pub const REQUESTS_STORAGE: &str = "requests.storage";
/// `limits.cpu`.
pub const LIMITS_CPU: &str = "limits.cpu";
/// `limits.memory`.
pub const LIMITS_MEMORY: &str = "limits.memory";
/// `limits.ephemeral-storage`.
pub const LIMITS_EPHEMERAL_STORAGE: &str = "limits.ephemeral-storage";
/// `services`.
pub const SERVICES: &str = "services";
/// `services.nodeports`.
pub const SERVICES_NODE_PORTS: &str = "services.nodeports";
/// `services.loadbalancers`.
pub const SERVICES_LOAD_BALANCERS: &str = "services.loadbalancers";
/// `persistentvolumeclaims`.
pub const PERSISTENT_VOLUME_CLAIMS: &str = "persistentvolumeclaims";
/// `configmaps` (legacy object-count alias).
pub const CONFIG_MAPS: &str = "configmaps";
/// `secrets` (legacy object-count alias).
pub const SECRETS: &str = "secrets";
/// `replicationcontrollers` (legacy object-count alias).
pub const REPLICATION_CONTROLLERS: &str = "replicationcontrollers";
/// `resourcequotas` (legacy object-count alias).
pub const RESOURCE_QUOTAS: &str = "resourcequotas";

/// `count/pods`.
pub const COUNT_PODS: &str = "count/pods";
/// `count/services`.
pub const COUNT_SERVICES: &str = "count/services";
/// `count/persistentvolumeclaims`.
pub const COUNT_PERSISTENT_VOLUME_CLAIMS: &str = "count/persistentvolumeclaims";
/// `count/resourceclaims.resource.k8s.io` (DRA evaluator).
pub const COUNT_RESOURCE_CLAIMS: &str = "count/resourceclaims.resource.k8s.io";

/// Prefix of object-count names.
pub const COUNT_PREFIX: &str = "count/";
/// `DefaultResourceRequestsPrefix`.
pub const REQUESTS_PREFIX: &str = "requests.";
/// Prefix of limit names.
pub const LIMITS_PREFIX: &str = "limits.";
/// `ResourceHugePagesPrefix`.
pub const HUGEPAGES_PREFIX: &str = "hugepages-";
/// `ResourceRequestsHugePagesPrefix`.
pub const REQUESTS_HUGEPAGES_PREFIX: &str = "requests.hugepages-";
/// `limits.hugepages-`: matched by no evaluator; the v1.36 apiserver rejects it in `spec.hard`
/// (neither a standard quota name nor fully qualified), so only invalid input carries it.
pub const LIMITS_HUGEPAGES_PREFIX: &str = "limits.hugepages-";
/// `ResourceDefaultNamespacePrefix`: names containing it are native.
pub const DEFAULT_NAMESPACE_PREFIX: &str = "kubernetes.io/";
/// Storage-class scoped names are `<class>` + this + `persistentvolumeclaims|requests.storage`.
pub const STORAGE_CLASS_SUFFIX: &str = ".storageclass.storage.k8s.io/";
/// `resourceapi.ResourceDeviceClassPrefix`: implicit extended resources backed by a DeviceClass.
pub const DEVICE_CLASS_RESOURCE_PREFIX: &str = "deviceclass.resource.kubernetes.io/";
/// `requests.deviceclass.resource.kubernetes.io/`.
pub const REQUESTS_DEVICE_CLASS_PREFIX: &str = "requests.deviceclass.resource.kubernetes.io/";
/// DRA device counts per class are `<class>` + this.
pub const DEVICE_CLASS_DEVICES_SUFFIX: &str = ".deviceclass.resource.k8s.io/devices";

/// A Kubernetes API group and resource, as the quota registry keys evaluators.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupResource {
    /// API group, empty for the core group.
    pub group: String,
    /// Plural resource name.
    pub resource: String,
}

impl GroupResource {
    /// A group and resource.
    pub fn new(group: impl Into<String>, resource: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            resource: resource.into(),
        }
    }

    /// A resource of the core (`""`) group.
    pub fn core(resource: impl Into<String>) -> Self {
        Self::new("", resource)
    }

    /// `generic.ObjectCountQuotaResourceNameFor`: `count/<r>` or `count/<r>.<g>`.
    pub fn object_count_name(&self) -> String {
        if self.group.is_empty() {
            format!("{COUNT_PREFIX}{}", self.resource)
        } else {
            format!("{COUNT_PREFIX}{}.{}", self.resource, self.group)
        }
    }

    /// Whether this is `group`/`resource`.
    pub fn is(&self, group: &str, resource: &str) -> bool {
        self.group == group && self.resource == resource
    }
}

impl fmt::Display for GroupResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

/// `DefaultIgnoredResources` (`pkg/quota/v1/install/registry.go`) as `(group, resource)`:
/// never monitored, never counted.
pub const DEFAULT_IGNORED_RESOURCES: &[(&str, &str)] = &[
    ("", "bindings"),
    ("", "componentstatuses"),
    ("authentication.k8s.io", "tokenreviews"),
    ("authentication.k8s.io", "selfsubjectreviews"),
    ("authorization.k8s.io", "subjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectaccessreviews"),
    ("authorization.k8s.io", "localsubjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectrulesreviews"),
    ("", "events"),
    ("events.k8s.io", "events"),
];

/// Whether quota ignores this resource entirely.
pub fn is_ignored_resource(gr: &GroupResource) -> bool {
    DEFAULT_IGNORED_RESOURCES
        .iter()
        .any(|(group, resource)| gr.is(group, resource))
}

/// `legacyObjectCountAliases` (`pkg/quota/v1/evaluator/core/registry.go`): core resources
/// whose object-count evaluator also answers to a bare name, as `(resource, alias)`.
pub const LEGACY_OBJECT_COUNT_ALIASES: &[(&str, &str)] = &[
    ("configmaps", CONFIG_MAPS),
    ("resourcequotas", RESOURCE_QUOTAS),
    ("replicationcontrollers", REPLICATION_CONTROLLERS),
    ("secrets", SECRETS),
];

/// The legacy alias of a core resource's object count, if it has one.
pub fn legacy_alias(gr: &GroupResource) -> Option<&'static str> {
    if !gr.group.is_empty() {
        return None;
    }
    LEGACY_OBJECT_COUNT_ALIASES
        .iter()
        .find(|(resource, _)| *resource == gr.resource)
        .map(|(_, alias)| *alias)
}

/// Parses `count/<resource>[.<group>]`. Resource names contain no dots, so the group is
/// everything after the first one.
pub fn parse_object_count_name(name: &str) -> Option<GroupResource> {
    let rest = name.strip_prefix(COUNT_PREFIX)?;
    let (resource, group) = rest.split_once('.').unwrap_or((rest, ""));
    if resource.is_empty() {
        return None;
    }
    Some(GroupResource::new(group, resource))
}

/// `helper.IsNativeResource`: no `/`, or inside `*kubernetes.io/`.
pub fn is_native_resource(name: &str) -> bool {
    !name.contains('/') || name.contains(DEFAULT_NAMESPACE_PREFIX)
}

/// `helper.IsHugePageResourceName`.
pub fn is_hugepages_resource(name: &str) -> bool {
    name.starts_with(HUGEPAGES_PREFIX)
}

/// `helper.IsExtendedResourceName`: not native, not `requests.`-prefixed, and
/// `requests.<name>` is a qualified name.
pub fn is_extended_resource_name(name: &str) -> bool {
    if is_native_resource(name) || name.starts_with(REQUESTS_PREFIX) {
        return false;
    }
    is_qualified_name(&format!("{REQUESTS_PREFIX}{name}"))
}

/// `schedutil.IsDRAExtendedResourceName` (pods evaluator from 1.35): an extended resource or
/// an implicit `deviceclass.resource.kubernetes.io/<class>` one; before 1.35 only
/// `helper.IsExtendedResourceName`. Pod requests of these map to `requests.<name>` in quota.
pub fn is_dra_extended_resource_name(name: &str, minor: u16) -> bool {
    is_extended_resource_name(name) || (minor >= 35 && name.starts_with(DEVICE_CLASS_RESOURCE_PREFIX))
}

/// `isExtendedResourceNameForQuota` (pods and resourceclaims evaluators): `requests.` names
/// that are not native, or (from 1.35) that use the implicit device-class prefix.
pub fn is_extended_resource_name_for_quota(name: &str, minor: u16) -> bool {
    let non_native = !is_native_resource(name);
    let implicit = minor >= 35 && name.starts_with(REQUESTS_DEVICE_CLASS_PREFIX);
    (non_native || implicit) && name.starts_with(REQUESTS_PREFIX)
}

/// `helper.IsQuotaHugePageResourceName`: `hugepages-*` or `requests.hugepages-*`.
pub fn is_quota_hugepages_resource(name: &str) -> bool {
    name.starts_with(HUGEPAGES_PREFIX) || name.starts_with(REQUESTS_HUGEPAGES_PREFIX)
}

/// `standardQuotaResources` of `pkg/apis/core/helper`.
pub const STANDARD_QUOTA_RESOURCES: &[&str] = &[
    CPU,
    MEMORY,
    EPHEMERAL_STORAGE,
    REQUESTS_CPU,
    REQUESTS_MEMORY,
    REQUESTS_STORAGE,
    REQUESTS_EPHEMERAL_STORAGE,
    LIMITS_CPU,
    LIMITS_MEMORY,
    LIMITS_EPHEMERAL_STORAGE,
    PODS,
    RESOURCE_QUOTAS,
    SERVICES,
    REPLICATION_CONTROLLERS,
    SECRETS,
    PERSISTENT_VOLUME_CLAIMS,
    CONFIG_MAPS,
    SERVICES_NODE_PORTS,
    SERVICES_LOAD_BALANCERS,
];

/// `IsStandardQuotaResourceName`: the standard names plus quota hugepages names.
pub fn is_standard_quota_resource_name(name: &str) -> bool {
    STANDARD_QUOTA_RESOURCES.contains(&name) || is_quota_hugepages_resource(name)
}

/// `validation.IsQualifiedName`: `[prefix/]name`, prefix a DNS-1123 subdomain, name at most
/// 63 characters of `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
pub fn is_qualified_name(value: &str) -> bool {
    let mut parts = value.split('/');
    let (prefix, name) = match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, None) => (None, name),
        (Some(prefix), Some(name), None) => (Some(prefix), name),
        _ => return false,
    };
    if let Some(prefix) = prefix
        && (prefix.is_empty() || !is_dns1123_subdomain(prefix))
    {
        return false;
    }
    !name.is_empty() && name.len() <= 63 && is_qualified_name_part(name)
}

fn is_alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, non-empty.
fn is_qualified_name_part(name: &str) -> bool {
    let bytes = name.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            is_alnum(first)
                && is_alnum(last)
                && bytes
                    .iter()
                    .all(|&b| is_alnum(b) || b == b'-' || b == b'_' || b == b'.')
        }
        _ => false,
    }
}

/// `validation.IsDNS1123Subdomain`.
pub fn is_dns1123_subdomain(value: &str) -> bool {
    value.len() <= 253
        && value.split('.').all(|label| {
            let bytes = label.as_bytes();
            let lower_alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
            match (bytes.first(), bytes.last()) {
                (Some(&first), Some(&last)) => {
                    lower_alnum(first)
                        && lower_alnum(last)
                        && bytes.iter().all(|&b| lower_alnum(b) || b == b'-')
                }
                _ => false,
            }
        })
}

/// `validation.IsValidLabelValue`: empty, or at most 63 characters of the qualified-name
/// alphabet starting and ending alphanumeric.
pub fn is_label_value(value: &str) -> bool {
    value.is_empty() || (value.len() <= 63 && is_qualified_name_part(value))
}

/// Which storage-class scoped resource a name refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageClassResource {
    /// `<class>.storageclass.storage.k8s.io/persistentvolumeclaims`.
    PersistentVolumeClaims,
    /// `<class>.storageclass.storage.k8s.io/requests.storage`.
    RequestsStorage,
}

/// What a quota resource name means, as far as quota evaluators are concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuotaResourceName<'a> {
    /// One of [`STANDARD_QUOTA_RESOURCES`].
    Standard(&'a str),
    /// `hugepages-<size>`.
    HugePages(&'a str),
    /// `requests.hugepages-<size>`.
    RequestsHugePages(&'a str),
    /// `limits.hugepages-<size>`: matched by no evaluator (and rejected by API validation).
    LimitsHugePages(&'a str),
    /// `count/<resource>[.<group>]`.
    ObjectCount(GroupResource),
    /// `requests.<domain>/<name>` for a non-native extended resource (the `<domain>/<name>`).
    RequestsExtended(&'a str),
    /// `requests.deviceclass.resource.kubernetes.io/<class>` (the class).
    RequestsDeviceClass(&'a str),
    /// `limits.<domain>/<name>`: matched by no evaluator.
    LimitsExtended(&'a str),
    /// `<class>.storageclass.storage.k8s.io/<resource>`.
    StorageClass {
        /// The storage class.
        class: &'a str,
        /// Which resource of that class.
        resource: StorageClassResource,
    },
    /// `<class>.deviceclass.resource.k8s.io/devices` (DRA evaluator).
    DeviceClassDevices(&'a str),
    /// Anything else, including bare extended resources such as `nvidia.com/gpu`.
    Other(&'a str),
}

/// Classifies a quota resource name.
pub fn classify(name: &str) -> QuotaResourceName<'_> {
    if STANDARD_QUOTA_RESOURCES.contains(&name) {
        return QuotaResourceName::Standard(name);
    }
    if let Some(size) = name.strip_prefix(HUGEPAGES_PREFIX) {
        return QuotaResourceName::HugePages(size);
    }
    if let Some(size) = name.strip_prefix(REQUESTS_HUGEPAGES_PREFIX) {
        return QuotaResourceName::RequestsHugePages(size);
    }
    if let Some(size) = name.strip_prefix(LIMITS_HUGEPAGES_PREFIX) {
        return QuotaResourceName::LimitsHugePages(size);
    }
    if let Some(gr) = parse_object_count_name(name) {
        return QuotaResourceName::ObjectCount(gr);
    }
    if let Some(class) = name.strip_prefix(REQUESTS_DEVICE_CLASS_PREFIX) {
        return QuotaResourceName::RequestsDeviceClass(class);
    }
    if let Some((class, resource)) = name.split_once(STORAGE_CLASS_SUFFIX) {
        match resource {
            PERSISTENT_VOLUME_CLAIMS => {
                return QuotaResourceName::StorageClass {
                    class,
                    resource: StorageClassResource::PersistentVolumeClaims,
                };
            }
            REQUESTS_STORAGE => {
                return QuotaResourceName::StorageClass {
                    class,
                    resource: StorageClassResource::RequestsStorage,
                };
            }
            _ => {}
        }
    }
    if let Some(class) = name.strip_suffix(DEVICE_CLASS_DEVICES_SUFFIX) {
        return QuotaResourceName::DeviceClassDevices(class);
    }
    if let Some(ext) = name.strip_prefix(REQUESTS_PREFIX)
        && !is_native_resource(name)
    {
        return QuotaResourceName::RequestsExtended(ext);
    }
    if let Some(ext) = name.strip_prefix(LIMITS_PREFIX)
        && !is_native_resource(name)
    {
        return QuotaResourceName::LimitsExtended(ext);
    }
    QuotaResourceName::Other(name)
}
