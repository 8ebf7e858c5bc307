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

/// How much of each object a demand needs. Ordered: `Typed` serves `Count` too.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Need {
    /// Only the object's existence (`count/...` and the legacy bare count names): a
    /// metadata-only watch is enough.
    Count,
    /// A compact projection of the typed object (pods, services, PVCs).
    Typed,
}

/// A 64-bit identity for an object name within one (cluster, resource, namespace) partition.
///
/// The store keeps this instead of the name (8 bytes instead of ~40 with the string's heap
/// block). Two names colliding in one namespace has probability ~n²/2⁶⁵ (about 3·10⁻¹⁰ for
/// a million objects in one namespace). FNV-1a is used because it is stable across runs and
/// processes (no random seed), so relists and restarts map names identically.
pub fn object_id(name: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    // FNV's low bits mix poorly for short keys; a final avalanche (from splitmix64) fixes
    // that for the hash table that stores these ids.
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_ids_are_stable_and_distinct() {
        assert_eq!(object_id("a"), object_id("a"));
        let ids: std::collections::HashSet<u64> =
            (0..100_000).map(|i| object_id(&format!("pod-{i}"))).collect();
        assert_eq!(ids.len(), 100_000);
    }
}
