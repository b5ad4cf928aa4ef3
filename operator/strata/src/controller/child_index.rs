//! An index of the children the controller owns, fed by metadata-only watches: per Agent, which
//! objects exist and the spec hash each was last applied with. Small (names and hashes only).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, PoisonError, RwLock};

use kube::Resource;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;

use crate::controller::labels::{ANNOTATION_SPEC_HASH, LABEL_AGENT};

/// Every kind of child an Agent has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChildKind {
    /// core/v1 ServiceAccount.
    ServiceAccount,
    /// rbac/v1 Role.
    Role,
    /// rbac/v1 RoleBinding.
    RoleBinding,
    /// core/v1 ConfigMap with gateway.json.
    ConfigMap,
    /// core/v1 Service for metrics.
    Service,
    /// networking/v1 NetworkPolicy.
    NetworkPolicy,
    /// apps/v1 StatefulSet.
    StatefulSet,
}

impl ChildKind {
    /// Every kind, in the order children are applied (RBAC and config before the workload).
    pub const ALL: [ChildKind; 7] = [
        ChildKind::ServiceAccount,
        ChildKind::Role,
        ChildKind::RoleBinding,
        ChildKind::ConfigMap,
        ChildKind::Service,
        ChildKind::NetworkPolicy,
        ChildKind::StatefulSet,
    ];

    /// The Kubernetes kind name.
    pub fn as_str(self) -> &'static str {
        match self {
            ChildKind::ServiceAccount => "ServiceAccount",
            ChildKind::Role => "Role",
            ChildKind::RoleBinding => "RoleBinding",
            ChildKind::ConfigMap => "ConfigMap",
            ChildKind::Service => "Service",
            ChildKind::NetworkPolicy => "NetworkPolicy",
            ChildKind::StatefulSet => "StatefulSet",
        }
    }
}

/// One observed child of an Agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedChild {
    /// Its kind.
    pub kind: ChildKind,
    /// Its name.
    pub name: String,
    /// The `strata.dev/spec-hash` annotation it carries, if any.
    pub spec_hash: Option<String>,
}

type AgentKey = (String, String);
type ChildKey = (ChildKind, String);

#[derive(Default)]
struct IndexState {
    by_agent: HashMap<AgentKey, BTreeMap<ChildKey, Option<String>>>,
    relisting: HashMap<ChildKind, Vec<(AgentKey, String, Option<String>)>>,
    synced: HashSet<ChildKind>,
}

/// Shared, cheap-to-clone index of observed children.
#[derive(Clone, Default)]
pub struct ChildIndex {
    state: Arc<RwLock<IndexState>>,
}

impl ChildIndex {
    /// An empty index that is not synced until every kind has finished its initial list.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty index that counts as synced (for tests and benchmarks that feed it directly).
    pub fn new_synced() -> Self {
        let index = Self::default();
        index.write().synced.extend(ChildKind::ALL);
        index
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, IndexState> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, IndexState> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether every kind has completed its initial list.
    pub fn is_synced(&self) -> bool {
        let state = self.read();
        ChildKind::ALL.iter().all(|kind| state.synced.contains(kind))
    }

    /// The children of one Agent, in kind order.
    pub fn children_of(&self, namespace: &str, agent: &str) -> Vec<ObservedChild> {
        let state = self.read();
        let key = (namespace.to_string(), agent.to_string());
        state
            .by_agent
            .get(&key)
            .map(|children| {
                children
                    .iter()
                    .map(|((kind, name), spec_hash)| ObservedChild {
                        kind: *kind,
                        name: name.clone(),
                        spec_hash: spec_hash.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Record that a child exists with `spec_hash` (after an apply, or from a watch event).
    pub fn record(
        &self,
        kind: ChildKind,
        namespace: &str,
        agent: &str,
        name: &str,
        spec_hash: Option<String>,
    ) {
        let mut state = self.write();
        state
            .by_agent
            .entry((namespace.to_string(), agent.to_string()))
            .or_default()
            .insert((kind, name.to_string()), spec_hash);
    }

    /// Forget a child (after a delete, or from a watch event).
    pub fn forget(&self, kind: ChildKind, namespace: &str, agent: &str, name: &str) {
        let mut state = self.write();
        let key = (namespace.to_string(), agent.to_string());
        if let Some(children) = state.by_agent.get_mut(&key) {
            children.remove(&(kind, name.to_string()));
            if children.is_empty() {
                state.by_agent.remove(&key);
            }
        }
    }

    /// Number of children indexed.
    pub fn len(&self) -> usize {
        self.read().by_agent.values().map(BTreeMap::len).sum()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Apply one metadata watch event of `kind`.
    pub fn apply_event<K: Resource>(&self, kind: ChildKind, event: &watcher::Event<PartialObjectMeta<K>>) {
        match event {
            watcher::Event::Init => {
                self.write().relisting.insert(kind, Vec::new());
            }
            watcher::Event::InitApply(object) => {
                if let Some((agent, name, hash)) = identify(object) {
                    self.write().relisting.entry(kind).or_default().push((agent, name, hash));
                }
            }
            watcher::Event::InitDone => {
                let mut state = self.write();
                let listed = state.relisting.remove(&kind).unwrap_or_default();
                for children in state.by_agent.values_mut() {
                    children.retain(|(child_kind, _), _| *child_kind != kind);
                }
                state.by_agent.retain(|_, children| !children.is_empty());
                for (agent, name, hash) in listed {
                    state.by_agent.entry(agent).or_default().insert((kind, name), hash);
                }
                state.synced.insert(kind);
            }
            watcher::Event::Apply(object) => {
                if let Some(((namespace, agent), name, hash)) = identify(object) {
                    self.record(kind, &namespace, &agent, &name, hash);
                }
            }
            watcher::Event::Delete(object) => {
                if let Some(((namespace, agent), name, _)) = identify(object) {
                    self.forget(kind, &namespace, &agent, &name);
                }
            }
        }
    }
}

fn identify<K: Resource>(object: &PartialObjectMeta<K>) -> Option<(AgentKey, String, Option<String>)> {
    let meta = &object.metadata;
    let agent = meta.labels.as_ref()?.get(LABEL_AGENT)?.clone();
    let hash = meta.annotations.as_ref().and_then(|a| a.get(ANNOTATION_SPEC_HASH)).cloned();
    Some(((meta.namespace.clone()?, agent), meta.name.clone()?, hash))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    fn meta(name: &str, agent: &str, hash: &str) -> PartialObjectMeta<ConfigMap> {
        PartialObjectMeta {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                labels: Some([(LABEL_AGENT.to_string(), agent.to_string())].into()),
                annotations: Some([(ANNOTATION_SPEC_HASH.to_string(), hash.to_string())].into()),
                ..ObjectMeta::default()
            },
            _phantom: std::marker::PhantomData,
        }
    }

    #[test]
    fn relist_replaces_only_its_kind_and_marks_it_synced() {
        let index = ChildIndex::new();
        index.record(ChildKind::ConfigMap, "ns", "a", "stale", None);
        index.record(ChildKind::Service, "ns", "a", "a", Some("s".into()));
        index.apply_event::<ConfigMap>(ChildKind::ConfigMap, &watcher::Event::Init);
        index.apply_event(ChildKind::ConfigMap, &watcher::Event::InitApply(meta("a-gateway", "a", "h1")));
        assert!(!index.is_synced());
        index.apply_event::<ConfigMap>(ChildKind::ConfigMap, &watcher::Event::InitDone);
        let children = index.children_of("ns", "a");
        assert_eq!(children.len(), 2);
        assert!(children.iter().any(|c| c.name == "a-gateway" && c.spec_hash.as_deref() == Some("h1")));
        assert!(!children.iter().any(|c| c.name == "stale"));
        index.apply_event(ChildKind::ConfigMap, &watcher::Event::Delete(meta("a-gateway", "a", "h1")));
        assert_eq!(index.children_of("ns", "a").len(), 1);
    }
}
