//! Identity of things in the index. Every key carries its logical cluster: in kcp, two
//! workspaces can hold a namespace and a quota of the same name.

use std::{fmt, sync::Arc};

pub use lazyquota_quota::names::GroupResource;

/// A logical cluster: the one cluster of a kubeconfig, a kubeconfig context, or a kcp
/// workspace. Cheap to clone (shared string).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ClusterName(Arc<str>);

impl ClusterName {
    /// A cluster named `name`.
    pub fn new(name: &str) -> Self {
        Self(Arc::from(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A ResourceQuota: (cluster, namespace, name).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct QuotaKey {
    /// Its logical cluster.
    pub cluster: ClusterName,
    /// Its namespace.
    pub namespace: Arc<str>,
    /// Its name.
    pub name: Arc<str>,
}

impl QuotaKey {
    /// A key from its parts.
    pub fn new(cluster: &ClusterName, namespace: &str, name: &str) -> Self {
        Self {
            cluster: cluster.clone(),
            namespace: Arc::from(namespace),
            name: Arc::from(name),
        }
    }
}

impl fmt::Display for QuotaKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}|{}/{}", self.cluster, self.namespace, self.name)
    }
}

/// A namespace in a logical cluster.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct NamespaceKey {
    /// Its logical cluster.
    pub cluster: ClusterName,
    /// The namespace.
    pub namespace: Arc<str>,
}

/// The namespace of a demand that covers every namespace of a logical cluster and its
/// cluster-scoped objects: kcp's cluster-scoped quotas ([`crate::policy::QuotaPolicy::cluster_scoped`]).
/// No namespace can be named so. Objects in a partition of this namespace are identified by
/// `<namespace>/<name>`, since names repeat across namespaces.
pub const ALL_NAMESPACES: &str = "*";

/// How much of each object a demand needs. Ordered: `Typed` serves `Count` too.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Need {
    /// Only the object's existence (`count/...` and the legacy bare count names): a
    /// metadata-only watch is enough.
    Count,
    /// A compact projection of the typed object (pods, services, PVCs).
    Typed,
}

/// Turns object names into the 64-bit ids the store keeps instead of the names (8 bytes
/// instead of ~40 with the string's heap block), with a secret key chosen once per process.
///
/// Names are chosen by tenants, and two names with one id count as one object: with an
/// unkeyed hash a tenant could search offline for colliding names (a birthday search of ~2³²
/// hashes for 64 bits) and exceed a count quota. Keyed SipHash-1-3 (`std`'s `RandomState`,
/// keys from the OS at start) gives them nothing to search: the key is never exposed, and ids
/// change with every process. What is left is chance: ~n²/2⁶⁵ for n objects in one namespace
/// (3·10⁻⁸ for a million). Cost: ~20 ns per name, against ~10 ns for the unkeyed FNV-1a used
/// before; no memory beyond the 16-byte key.
///
/// Ids are stable within one process (relists and deletes map names identically); nothing
/// persists them.
#[derive(Clone, Debug, Default)]
pub struct ObjectIds(std::hash::RandomState);

impl ObjectIds {
    /// Ids under `key` (a fresh `RandomState::new()` for a new secret key).
    pub fn new(key: std::hash::RandomState) -> Self {
        Self(key)
    }

    /// The id of the object named `name` (its namespace and resource are the store's
    /// partition, so they are not part of the id).
    pub fn id(&self, name: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.0, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_ids_are_stable_and_distinct() {
        let ids = ObjectIds::default();
        assert_eq!(ids.id("a"), ids.id("a"));
        let distinct: std::collections::HashSet<u64> =
            (0..100_000).map(|i| ids.id(&format!("pod-{i}"))).collect();
        assert_eq!(distinct.len(), 100_000);
    }

    /// A collision found offline must not carry over to the running process: the id depends
    /// on a key the tenant never sees. (With the unkeyed hash, every process mapped a name to
    /// the same id, so one offline birthday search served against every lazyquota.)
    #[test]
    fn object_ids_depend_on_a_secret_key() {
        let names: Vec<String> = (0..64).map(|i| format!("tenant-chosen-{i}")).collect();
        let a = ObjectIds::new(std::hash::RandomState::new());
        let b = ObjectIds::new(std::hash::RandomState::new());
        let differing = names.iter().filter(|n| a.id(n) != b.id(n)).count();
        // Two independent 128-bit keys agree on a name with probability 2⁻⁶⁴.
        assert_eq!(differing, names.len(), "ids must change with the key");
    }
}
