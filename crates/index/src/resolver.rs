//! The ResourceResolver: which resources each logical cluster serves and can be quota'd, from
//! discovery results. A demanded resource that is not served yet (a CRD not created yet) is
//! **pending**; it resolves the moment a discovery run sees it.
//!
//! Quotable, as upstream's `GetQuotableResources`: namespaced, at the group's preferred
//! version, supporting all of create, list, watch and delete, and not in the upstream ignored
//! list (`DefaultIgnoredResources`).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

use crate::{
    demand::is_cluster_wide,
    keys::{ClusterName, GroupResource},
};

/// A served resource, as discovery reports it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServedResource {
    /// API group and plural resource name.
    pub resource: GroupResource,
    /// The version to watch (the group's preferred version that serves it).
    pub version: String,
    /// The kind.
    pub kind: String,
    /// Whether the resource is namespaced.
    pub namespaced: bool,
    /// The verbs it supports.
    pub verbs: Vec<String>,
}

impl ServedResource {
    /// A namespaced, quotable core resource served at `v1` (for tests).
    #[cfg(test)]
    pub(crate) fn core_for_tests(resource: &str) -> Self {
        Self {
            resource: GroupResource::core(resource),
            version: "v1".into(),
            kind: "Kind".into(),
            namespaced: true,
            verbs: ["create", "delete", "list", "watch"].map(String::from).to_vec(),
        }
    }

    /// Whether upstream would monitor it for quota.
    pub fn quotable(&self) -> bool {
        self.namespaced && self.countable()
    }

    /// Whether quotas read it as context, watched cluster-wide (DeviceClasses): it must be
    /// listable and watchable.
    pub fn context(&self) -> bool {
        is_cluster_wide(&self.resource)
            && ["list", "watch"]
                .iter()
                .all(|v| self.verbs.iter().any(|have| have == v))
    }

    /// Whether it could be counted at all: the verbs a monitor needs, and not ignored. kcp
    /// counts cluster-scoped resources such as these for its cluster-scoped quotas.
    pub fn countable(&self) -> bool {
        const NEEDED: [&str; 4] = ["create", "list", "watch", "delete"];
        NEEDED.iter().all(|v| self.verbs.iter().any(|have| have == v))
            && !lazyquota_quota::names::is_ignored_resource(&self.resource)
    }
}

/// What changed between two discovery runs of a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolverChange {
    /// A quotable resource appeared (a CRD became served).
    Served(GroupResource),
    /// A resource is no longer served or no longer quotable (a CRD was deleted).
    Gone(GroupResource),
    /// A resource's preferred version or kind changed: its watches must restart.
    Changed(GroupResource),
}

/// Types [`Resolver::remember`] keeps, at most: each costs its name and a pointer, and keeps
/// one interned [`ServedResource`] (about 600 bytes) alive.
pub const MAX_REMEMBERED: usize = 4096;

/// The resolver for all clusters.
///
/// Cost: a kcp shard's engine holds one entry per served cluster, and its workspaces mostly
/// serve the same types, so each distinct [`ServedResource`] is kept once (interned) and a
/// cluster holds a sorted list of pointers to them: 8 bytes per type it serves, instead of
/// ~600 (strings and verbs) each. Clusters that serve exactly the same types (workspaces with
/// the same bindings) share one list, so such a cluster costs its map entry only.
#[derive(Debug, Default)]
pub struct Resolver {
    /// Per cluster, what it serves, sorted by resource.
    clusters: HashMap<ClusterName, Arc<[Arc<ServedResource>]>>,
    /// kcp: per cluster not discovered yet, what it is taken to serve until its first
    /// discovery answers ([`Resolver::guess`]), sorted by resource. Its watches may start on
    /// it; nothing is written for the cluster before the discovery ([`Resolver::knows`] stays
    /// false), which replaces it as it would an earlier discovery's result.
    guessed: HashMap<ClusterName, Arc<[Arc<ServedResource>]>>,
    /// kcp: how the last discovery that found it served each type a quota named
    /// ([`Resolver::remember`]), kept after that cluster is let go: what a guess falls back
    /// on when no discovered cluster serves the type. At most [`MAX_REMEMBERED`] types.
    remembered: HashMap<GroupResource, Arc<ServedResource>>,
    /// Every list some cluster holds, once.
    lists: HashSet<Arc<[Arc<ServedResource>]>>,
    /// Every served resource some cluster holds, once.
    interned: HashSet<Arc<ServedResource>>,
    /// kcp: cluster-scoped resources resolve too (its cluster-scoped quotas count them, e.g.
    /// `count/workspaces.tenancy.kcp.io`); upstream monitors namespaced resources only.
    cluster_scoped: bool,
}

impl Resolver {
    /// An empty resolver (nothing resolves until the first discovery run).
    pub fn new() -> Self {
        Self::default()
    }

    /// A resolver that also resolves cluster-scoped resources (kcp's quota semantics).
    #[must_use]
    pub fn with_cluster_scoped(mut self) -> Self {
        self.cluster_scoped = true;
        self
    }

    /// Replaces what `cluster` serves with a discovery run's results; keeps only quotable
    /// resources and the cluster-wide ones quotas read as context (DeviceClasses, see
    /// [`is_cluster_wide`]); returns what changed.
    ///
    /// `failed_groups` are API groups whose discovery failed in this run (an unavailable
    /// aggregated API): as upstream does, their previously known resources are kept rather
    /// than dropped, so one broken APIService does not stop the watches of its resources.
    pub fn replace(
        &mut self,
        cluster: &ClusterName,
        served: impl IntoIterator<Item = ServedResource>,
        failed_groups: &[String],
    ) -> Vec<ResolverChange> {
        // A first discovery is compared with what was guessed: a guess it confirms changes
        // nothing, one it does not restarts or stops the watch started on it.
        let discovered = self.clusters.remove(cluster);
        let was_discovered = discovered.is_some();
        let old = discovered
            .or_else(|| self.guessed.remove(cluster))
            .unwrap_or_else(|| Arc::from(Vec::new()));
        let cluster_scoped = self.cluster_scoped;
        let mut new: BTreeMap<GroupResource, ServedResource> = served
            .into_iter()
            .filter(|s| s.quotable() || (cluster_scoped && s.countable()) || s.context())
            .map(|s| (s.resource.clone(), s))
            .collect();
        for served in old.iter() {
            let resource = &served.resource;
            // Only what a discovery found is kept so; a guess is not.
            if was_discovered
                && failed_groups.iter().any(|g| g == &resource.group)
                && !new.contains_key(resource)
            {
                new.insert(resource.clone(), (**served).clone());
            }
        }
        let mut changes = Vec::new();
        for was in old.iter() {
            let resource = &was.resource;
            match new.get(resource) {
                None => changes.push(ResolverChange::Gone(resource.clone())),
                // A guess that differs in anything (scope, verbs) is not what the watch on
                // it should have been.
                Some(now)
                    if now.version != was.version
                        || now.kind != was.kind
                        || (!was_discovered && now != &**was) =>
                {
                    changes.push(ResolverChange::Changed(resource.clone()));
                }
                Some(_) => {}
            }
        }
        changes.extend(
            new.keys()
                .filter(|r| find(&old, r).is_none())
                .cloned()
                .map(ResolverChange::Served),
        );
        // In the map's order: sorted by resource.
        let held: Vec<Arc<ServedResource>> = new.into_values().map(|s| self.intern(s)).collect();
        let held = if let Some(list) = self.lists.get(held.as_slice()) {
            list.clone()
        } else {
            let list: Arc<[Arc<ServedResource>]> = Arc::from(held);
            self.lists.insert(list.clone());
            list
        };
        self.clusters.insert(cluster.clone(), held);
        drop(old);
        self.prune();
        changes
    }

    /// The one shared copy of `served`.
    fn intern(&mut self, served: ServedResource) -> Arc<ServedResource> {
        if let Some(held) = self.interned.get(&served) {
            return held.clone();
        }
        let held = Arc::new(served);
        self.interned.insert(held.clone());
        held
    }

    /// Drops the lists and copies no cluster holds any more.
    fn prune(&mut self) {
        self.lists.retain(|l| Arc::strong_count(l) > 1);
        self.interned.retain(|s| Arc::strong_count(s) > 1);
    }

    /// Distinct served resources held for all clusters (what interning keeps).
    pub fn distinct(&self) -> usize {
        self.interned.len()
    }

    /// Forgets a cluster.
    pub fn remove_cluster(&mut self, cluster: &ClusterName) {
        self.clusters.remove(cluster);
        self.guessed.remove(cluster);
        self.prune();
    }

    /// kcp: takes `cluster`, not discovered yet, to serve each of `resources` as the clusters
    /// of the shard that serve it do — when they all serve it alike (one version, kind, scope
    /// and verbs; one such cluster is enough) — until its first discovery answers. Returns the
    /// resources guessed (none for a cluster discovered already).
    ///
    /// Why: a workspace's first quota on a type otherwise waits for the workspace's discovery
    /// before its list starts; with the guess both run at once, and the discovery still decides
    /// (a different version restarts the watch, a type not served stops it). A wrong guess
    /// costs requests, never a count: the watch reads only the cluster's own objects (they
    /// are none, or the list fails, where it does not serve the type), and nothing of the
    /// cluster is written before its discovery answers ([`Resolver::knows`]).
    pub fn guess<'a>(
        &mut self,
        cluster: &ClusterName,
        resources: impl IntoIterator<Item = &'a GroupResource>,
    ) -> Vec<GroupResource> {
        if self.knows(cluster) {
            return Vec::new();
        }
        let mut held: Vec<Arc<ServedResource>> = self
            .guessed
            .get(cluster)
            .map(|list| list.to_vec())
            .unwrap_or_default();
        let mut guessed = Vec::new();
        for resource in resources {
            if find(&held, resource).is_some() {
                continue;
            }
            // From what discovered clusters hold (`lists`), not from `interned`, which guesses
            // keep alive too: a guess is never made from another guess.
            let mut alike: Option<&Arc<ServedResource>> = None;
            let mut ambiguous = false;
            for list in &self.lists {
                if let Ok(i) = list.binary_search_by(|s| s.resource.cmp(resource)) {
                    match alike {
                        None => alike = Some(&list[i]),
                        Some(seen) if **seen == *list[i] => {}
                        Some(_) => ambiguous = true,
                    }
                }
            }
            let only = match (alike, ambiguous) {
                (Some(only), false) => Some(only),
                // Served by no discovered cluster now: as it was last found.
                (None, _) => self.remembered.get(resource),
                (Some(_), true) => None,
            };
            if let Some(only) = only {
                held.push(only.clone());
                guessed.push(resource.clone());
            }
        }
        if !guessed.is_empty() {
            held.sort_by(|a, b| a.resource.cmp(&b.resource));
            self.guessed.insert(cluster.clone(), Arc::from(held));
        }
        guessed
    }

    /// Whether discovery has run at least once for `cluster`.
    pub fn knows(&self, cluster: &ClusterName) -> bool {
        self.clusters.contains_key(cluster)
    }

    /// kcp: keeps how `cluster`'s discovery found `resource` served (a type one of its quotas
    /// names), for later guesses in other clusters ([`Resolver::guess`]) — also once no
    /// discovered cluster serves it any more. Nothing when the cluster does not serve it, or
    /// [`MAX_REMEMBERED`] other types are kept already.
    pub fn remember(&mut self, cluster: &ClusterName, resource: &GroupResource) {
        let Some(list) = self.clusters.get(cluster) else {
            return;
        };
        let Ok(i) = list.binary_search_by(|s| s.resource.cmp(resource)) else {
            return;
        };
        if self.remembered.len() < MAX_REMEMBERED || self.remembered.contains_key(resource) {
            self.remembered.insert(resource.clone(), list[i].clone());
        }
    }

    /// The served, quotable resource, if any (before a cluster's first discovery, what was
    /// guessed: [`Resolver::guess`]).
    pub fn get(&self, cluster: &ClusterName, resource: &GroupResource) -> Option<&ServedResource> {
        let held = self.clusters.get(cluster).or_else(|| self.guessed.get(cluster))?;
        find(held, resource)
    }

    /// Every quotable resource of a cluster (eager mode watches them all; each gets an
    /// object-count evaluator). Not the context resources.
    pub fn quotable(&self, cluster: &ClusterName) -> impl Iterator<Item = &ServedResource> {
        let cluster_scoped = self.cluster_scoped;
        self.clusters
            .get(cluster)
            .into_iter()
            .flat_map(|list| list.iter())
            .map(|s| &**s)
            .filter(move |s| s.quotable() || (cluster_scoped && s.countable()))
    }
}

/// `resource` in a list sorted by resource.
fn find<'a>(held: &'a [Arc<ServedResource>], resource: &GroupResource) -> Option<&'a ServedResource> {
    held.binary_search_by(|s| s.resource.cmp(resource))
        .ok()
        .map(|i| &*held[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(group: &str, resource: &str, version: &str) -> ServedResource {
        ServedResource {
            resource: GroupResource::new(group, resource),
            version: version.into(),
            kind: "Kind".into(),
            namespaced: true,
            verbs: ["create", "delete", "get", "list", "watch", "update"]
                .map(String::from)
                .to_vec(),
        }
    }

    #[test]
    fn clusters_serving_the_same_types_share_one_list_until_one_changes() {
        let (a, b) = (ClusterName::new("a"), ClusterName::new("b"));
        let mut resolver = Resolver::new();
        let same = || [served("", "pods", "v1"), served("example.io", "widgets", "v1")];
        resolver.replace(&a, same(), &[]);
        resolver.replace(&b, same(), &[]);
        assert_eq!(resolver.lists.len(), 1);
        assert!(Arc::ptr_eq(&resolver.clusters[&a], &resolver.clusters[&b]));
        resolver.replace(&b, [served("", "pods", "v1")], &[]);
        assert_eq!(resolver.lists.len(), 2);
        assert!(
            resolver
                .get(&a, &GroupResource::new("example.io", "widgets"))
                .is_some()
        );
        assert!(
            resolver
                .get(&b, &GroupResource::new("example.io", "widgets"))
                .is_none()
        );
        resolver.remove_cluster(&a);
        assert_eq!(
            (resolver.lists.len(), resolver.distinct()),
            (1, 1),
            "what no cluster holds goes"
        );
    }

    #[test]
    fn only_quotable_resources_resolve() {
        let cluster = ClusterName::new("c");
        let mut resolver = Resolver::new();
        let mut cluster_scoped = served("", "namespaces", "v1");
        cluster_scoped.namespaced = false;
        let mut no_watch = served("example.io", "reviews", "v1");
        no_watch.verbs.retain(|v| v != "watch");
        resolver.replace(
            &cluster,
            [
                served("", "pods", "v1"),
                served("", "events", "v1"),
                cluster_scoped,
                no_watch,
            ],
            &[],
        );
        assert!(resolver.get(&cluster, &GroupResource::core("pods")).is_some());
        assert!(
            resolver.get(&cluster, &GroupResource::core("events")).is_none(),
            "events are ignored upstream"
        );
        assert!(
            resolver
                .get(&cluster, &GroupResource::core("namespaces"))
                .is_none()
        );
        assert!(
            resolver
                .get(&cluster, &GroupResource::new("example.io", "reviews"))
                .is_none()
        );
    }

    #[test]
    fn crds_appear_change_and_go() {
        let cluster = ClusterName::new("c");
        let mut resolver = Resolver::new();
        assert_eq!(
            resolver.replace(&cluster, [served("", "pods", "v1")], &[]).len(),
            1
        );
        let widgets = GroupResource::new("example.io", "widgets");
        let appear = resolver.replace(
            &cluster,
            [served("", "pods", "v1"), served("example.io", "widgets", "v1")],
            &[],
        );
        assert_eq!(appear, vec![ResolverChange::Served(widgets.clone())]);
        let change = resolver.replace(
            &cluster,
            [served("", "pods", "v1"), served("example.io", "widgets", "v2")],
            &[],
        );
        assert_eq!(change, vec![ResolverChange::Changed(widgets.clone())]);
        let kept = resolver.replace(&cluster, [served("", "pods", "v1")], &["example.io".to_owned()]);
        assert!(
            kept.is_empty(),
            "a group whose discovery failed keeps its resources"
        );
        let gone = resolver.replace(&cluster, [served("", "pods", "v1")], &[]);
        assert_eq!(gone, vec![ResolverChange::Gone(widgets)]);
    }

    #[test]
    fn a_guess_is_what_every_other_cluster_serves_alike_and_its_first_discovery_replaces_it() {
        let (a, b, c, d) = (
            ClusterName::new("a"),
            ClusterName::new("b"),
            ClusterName::new("c"),
            ClusterName::new("d"),
        );
        let widgets = GroupResource::new("x.io", "widgets");
        let gadgets = GroupResource::new("y.io", "gadgets");
        let mut resolver = Resolver::new();
        resolver.replace(
            &a,
            [served("x.io", "widgets", "v1"), served("y.io", "gadgets", "v1")],
            &[],
        );
        resolver.replace(
            &b,
            [served("x.io", "widgets", "v1"), served("y.io", "gadgets", "v2")],
            &[],
        );
        assert_eq!(
            resolver.guess(&c, [&widgets, &gadgets]),
            vec![widgets.clone()],
            "gadgets are served two ways: no guess"
        );
        assert!(!resolver.knows(&c), "a guess is not a discovery");
        assert_eq!(resolver.get(&c, &widgets).map(|s| s.version.as_str()), Some("v1"));
        assert!(resolver.get(&c, &gadgets).is_none());
        assert_eq!(resolver.quotable(&c).count(), 0, "no evaluator from a guess");
        assert!(
            resolver.guess(&a, [&widgets]).is_empty(),
            "a discovered cluster is not guessed"
        );

        let confirmed = resolver.replace(&c, [served("x.io", "widgets", "v1")], &[]);
        assert!(
            confirmed.is_empty(),
            "a confirmed guess changes nothing: {confirmed:?}"
        );
        assert!(resolver.knows(&c));

        resolver.guess(&d, [&widgets]);
        let mut scoped = served("x.io", "widgets", "v1");
        scoped.namespaced = false;
        let mut cluster_scoped = Resolver::new().with_cluster_scoped();
        cluster_scoped.replace(&a, [served("x.io", "widgets", "v1")], &[]);
        cluster_scoped.guess(&d, [&widgets]);
        assert_eq!(
            cluster_scoped.replace(&d, [scoped], &[]),
            vec![ResolverChange::Changed(widgets.clone())],
            "a guess that differs in scope restarts its watch"
        );
        assert_eq!(
            resolver.replace(&d, [served("y.io", "gadgets", "v1")], &["x.io".to_owned()]),
            vec![
                ResolverChange::Gone(widgets.clone()),
                ResolverChange::Served(gadgets.clone())
            ],
            "a guess is not kept for a group whose discovery failed"
        );
        resolver.guess(&ClusterName::new("e"), [&widgets]);
        resolver.remove_cluster(&ClusterName::new("e"));
        assert!(resolver.get(&ClusterName::new("e"), &widgets).is_none());

        let mut alone = Resolver::new();
        alone.replace(&a, [served("x.io", "widgets", "v1")], &[]);
        assert_eq!(
            alone.guess(&ClusterName::new("f"), [&widgets]),
            vec![widgets.clone()]
        );
        alone.remove_cluster(&a);
        assert!(
            alone.guess(&ClusterName::new("g"), [&widgets]).is_empty(),
            "no guess from another guess, once no discovered cluster serves the type"
        );
        alone.replace(&a, [served("x.io", "widgets", "v2")], &[]);
        alone.remember(&a, &widgets);
        alone.remember(&a, &gadgets);
        alone.remove_cluster(&a);
        let later = ClusterName::new("h");
        assert_eq!(
            alone.guess(&later, [&widgets, &gadgets]),
            vec![widgets.clone()],
            "a type a quota named, as the last discovery that served it found it"
        );
        assert_eq!(
            alone.get(&later, &widgets).map(|s| s.version.as_str()),
            Some("v2")
        );
    }

    #[test]
    fn clusters_serving_the_same_types_share_one_copy_until_none_holds_it() {
        let (a, b) = (ClusterName::new("a"), ClusterName::new("b"));
        let mut resolver = Resolver::new();
        let common = || [served("", "pods", "v1"), served("", "secrets", "v1")];
        resolver.replace(&a, common(), &[]);
        resolver.replace(
            &b,
            common().into_iter().chain([served("x.io", "widgets", "v1")]),
            &[],
        );
        assert_eq!(resolver.distinct(), 3, "pods and secrets once for both");
        assert_eq!(
            resolver
                .get(&b, &GroupResource::new("x.io", "widgets"))
                .map(|s| s.version.as_str()),
            Some("v1")
        );
        assert!(resolver.get(&a, &GroupResource::new("x.io", "widgets")).is_none());
        assert_eq!(resolver.quotable(&b).count(), 3);
        resolver.replace(&b, common(), &[]);
        assert_eq!(resolver.distinct(), 2, "widgets dropped with its last holder");
        resolver.remove_cluster(&a);
        resolver.remove_cluster(&b);
        assert_eq!(resolver.distinct(), 0);
    }
}
