//! An index of the children the controller owns, fed by metadata-only watches: per Agent, which
//! objects exist, the spec hash each was last applied with, the UID of their controller owner, and
//! a fingerprint of the fields the controller owns there (from `managedFields`), so an edit by
//! anyone else shows as drift. Small (names, hashes and UIDs only).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, PoisonError, RwLock};

use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;

use crate::controller::context::FIELD_MANAGER;
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

    /// Whether the apiserver or the pods need this child before the others can be applied: the
    /// Role before its RoleBinding (the apiserver checks a binding against the Role it names and
    /// refuses it while the Role is missing), the ServiceAccount and the ConfigMap before the
    /// StatefulSet's pods. Everything but the RoleBinding and the StatefulSet goes first.
    pub fn applies_first(self) -> bool {
        !matches!(self, ChildKind::RoleBinding | ChildKind::StatefulSet)
    }

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

/// Who owns a child: the UID in its controller `ownerReference`, and who owns its fields, from its
/// `managedFields` (the server-side apply record of the apiserver). Anyone else who changes a field
/// the controller set (kubectl edit, patch, replace, a forced apply) takes that field from the
/// controller's field set, so the fingerprint changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ownership {
    /// UID of the object's controller owner (the `ownerReference` with `controller: true`), if any.
    pub controller_uid: Option<String>,
    /// Hash of the controller's own field set (`strata.dev/controller`, Apply), if it has one.
    pub owned_fields: Option<u64>,
    /// Whether any other manager holds fields of the object itself (not a subresource).
    pub other_managers: bool,
}

impl Ownership {
    /// Read the ownership record of an object's metadata.
    pub fn of(meta: &ObjectMeta) -> Self {
        let mut ownership = Ownership {
            controller_uid: meta
                .owner_references
                .iter()
                .flatten()
                .find(|owner| owner.controller == Some(true))
                .map(|owner| owner.uid.clone()),
            ..Ownership::default()
        };
        for entry in meta.managed_fields.iter().flatten() {
            if entry.subresource.as_deref().is_some_and(|s| !s.is_empty()) {
                continue;
            }
            let ours = entry.manager.as_deref() == Some(FIELD_MANAGER)
                && entry.operation.as_deref() == Some("Apply");
            if ours {
                let mut hasher = DefaultHasher::new();
                entry.fields_v1.as_ref().map(|f| f.0.to_string()).hash(&mut hasher);
                ownership.owned_fields = Some(hasher.finish());
            } else {
                ownership.other_managers = true;
            }
        }
        ownership
    }
}

/// A child's `strata.dev/spec-hash` annotation as the index keeps it: the sha256 the controller
/// writes, as its 32 bytes (not 64 hex characters on the heap), or whatever else someone wrote there.
/// At 10,000 Agents the index holds 70,000 of these.
#[derive(Clone, Debug, PartialEq, Eq)]
enum StoredHash {
    Sha256([u8; 32]),
    Other(Box<str>),
}

impl StoredHash {
    fn new(annotation: String) -> Self {
        let mut bytes = [0u8; 32];
        match hex::decode_to_slice(&annotation, &mut bytes) {
            Ok(()) if annotation.bytes().all(|b| !b.is_ascii_uppercase()) => StoredHash::Sha256(bytes),
            _ => StoredHash::Other(annotation.into_boxed_str()),
        }
    }

    fn to_annotation(&self) -> String {
        match self {
            StoredHash::Sha256(bytes) => hex::encode(bytes),
            StoredHash::Other(text) => text.to_string(),
        }
    }
}

/// What the index knows of one child.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ChildState {
    spec_hash: Option<StoredHash>,
    seen: Ownership,
    /// The controller's field-set hash right after its last apply of this child.
    applied_fields: Option<u64>,
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
    /// Whether someone else changed fields the controller set since its last apply (or, before the
    /// first apply by this process, whether any other manager holds fields of the object).
    pub drifted: bool,
    /// UID of its controller owner, if it has one: only an object whose controller is the Agent
    /// (by UID) is the Agent's to delete.
    pub controller_uid: Option<String>,
}

/// An Agent as (namespace, name).
pub type AgentKey = (String, String);
type ChildKey = (ChildKind, String);
/// One child from a relist: its agent, name, spec hash and ownership.
type Listed = (AgentKey, String, Option<String>, Ownership);

/// The children of one Agent, sorted by kind and name: a short vector (seven entries) rather than a
/// map, whose nodes would cost more than the entries.
#[derive(Clone, Debug, Default)]
struct AgentChildren(Vec<(ChildKey, ChildState)>);

impl AgentChildren {
    fn position(&self, key: &ChildKey) -> Result<usize, usize> {
        self.0.binary_search_by(|(have, _)| have.cmp(key))
    }

    fn get(&self, key: &ChildKey) -> Option<&ChildState> {
        self.position(key).ok().map(|at| &self.0[at].1)
    }

    fn entry(&mut self, key: ChildKey) -> &mut ChildState {
        let at = match self.position(&key) {
            Ok(at) => at,
            Err(at) => {
                // Room for exactly one more: the vector stays at its length, with no spare slots.
                self.0.reserve_exact(1);
                self.0.insert(at, (key, ChildState::default()));
                at
            }
        };
        &mut self.0[at].1
    }

    fn remove(&mut self, key: &ChildKey) {
        if let Ok(at) = self.position(key) {
            self.0.remove(at);
        }
    }

    fn iter(&self) -> impl Iterator<Item = &(ChildKey, ChildState)> {
        self.0.iter()
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[derive(Default)]
struct IndexState {
    by_agent: HashMap<AgentKey, AgentChildren>,
    relisting: HashMap<ChildKind, Vec<Listed>>,
    synced: HashSet<ChildKind>,
}

impl IndexState {
    /// The entry of one child, created empty when the index has not seen it yet.
    fn child_mut(&mut self, kind: ChildKind, namespace: &str, agent: &str, name: &str) -> &mut ChildState {
        self.by_agent
            .entry((namespace.to_string(), agent.to_string()))
            .or_default()
            .entry((kind, name.to_string()))
    }
}

impl ChildState {
    fn drifted(&self) -> bool {
        match self.applied_fields {
            Some(applied) => self.seen.owned_fields != Some(applied),
            None => self.seen.other_managers,
        }
    }
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
                    .map(|((kind, name), child)| ObservedChild {
                        kind: *kind,
                        name: name.clone(),
                        spec_hash: child.spec_hash.as_ref().map(StoredHash::to_annotation),
                        drifted: child.drifted(),
                        controller_uid: child.seen.controller_uid.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Record that a child exists with `spec_hash`, its ownership unknown (counted as undrifted).
    pub fn record(
        &self,
        kind: ChildKind,
        namespace: &str,
        agent: &str,
        name: &str,
        spec_hash: Option<String>,
    ) {
        self.observe(kind, namespace, agent, name, spec_hash, Ownership::default());
    }

    /// Record what a watch event showed of a child; keeps the fingerprint of the last apply.
    pub fn observe(
        &self,
        kind: ChildKind,
        namespace: &str,
        agent: &str,
        name: &str,
        spec_hash: Option<String>,
        seen: Ownership,
    ) {
        let mut state = self.write();
        let child = state.child_mut(kind, namespace, agent, name);
        child.spec_hash = spec_hash.map(StoredHash::new);
        child.seen = seen;
    }

    /// Record the object an apply returned: its field set becomes the baseline of drift detection.
    pub fn record_applied(
        &self,
        kind: ChildKind,
        namespace: &str,
        agent: &str,
        name: &str,
        spec_hash: Option<String>,
        applied: Ownership,
    ) {
        let mut state = self.write();
        let child = state.child_mut(kind, namespace, agent, name);
        let applied_fields = applied.owned_fields;
        *child = ChildState { spec_hash: spec_hash.map(StoredHash::new), seen: applied, applied_fields };
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
        self.read().by_agent.values().map(AgentChildren::len).sum()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Apply one metadata watch event of `kind`. Returns the Agents, as (namespace, name), the event
    /// shows something to act on: a child deleted, or one that is new to the index, changed its spec
    /// hash or drifted (or stopped drifting); after a relist, every Agent whose children of this kind
    /// differ from before it. Events that change nothing the controller owns (a status update, a
    /// label someone added) wake no one.
    pub fn apply_event<K: Resource>(
        &self,
        kind: ChildKind,
        event: &watcher::Event<PartialObjectMeta<K>>,
    ) -> Vec<AgentKey> {
        match event {
            watcher::Event::Init => {
                self.write().relisting.insert(kind, Vec::new());
                Vec::new()
            }
            watcher::Event::InitApply(object) => {
                if let Some((agent, name, hash)) = identify(object) {
                    let seen = Ownership::of(&object.metadata);
                    self.write().relisting.entry(kind).or_default().push((agent, name, hash, seen));
                }
                Vec::new()
            }
            watcher::Event::InitDone => self.finish_relist(kind),
            watcher::Event::Apply(object) => {
                let Some((agent, name, spec_hash)) = identify(object) else { return Vec::new() };
                let mut state = self.write();
                let before =
                    state.by_agent.get(&agent).and_then(|c| c.get(&(kind, name.clone()))).map(summary);
                let child = state.child_mut(kind, &agent.0, &agent.1, &name);
                child.spec_hash = spec_hash.map(StoredHash::new);
                child.seen = Ownership::of(&object.metadata);
                let after = summary(child);
                if before.as_ref() == Some(&after) { Vec::new() } else { vec![agent] }
            }
            watcher::Event::Delete(object) => {
                let Some(((namespace, agent), name, _)) = identify(object) else { return Vec::new() };
                self.forget(kind, &namespace, &agent, &name);
                vec![(namespace, agent)]
            }
        }
    }

    /// Replace the children of `kind` with the relisted ones; on a relist (not the first list),
    /// the Agents whose children of `kind` changed.
    fn finish_relist(&self, kind: ChildKind) -> Vec<AgentKey> {
        let mut state = self.write();
        let first_list = !state.synced.contains(&kind);
        let listed = state.relisting.remove(&kind).unwrap_or_default();
        let mut previous: HashMap<(AgentKey, String), ChildState> = HashMap::new();
        for (agent, children) in &mut state.by_agent {
            children.0.retain(|((child_kind, name), child)| {
                if *child_kind == kind {
                    previous.insert((agent.clone(), name.clone()), child.clone());
                }
                *child_kind != kind
            });
        }
        state.by_agent.retain(|_, children| !children.is_empty());
        let mut changed: HashSet<AgentKey> = HashSet::new();
        for (agent, name, spec_hash, seen) in listed {
            let before = previous.remove(&(agent.clone(), name.clone()));
            let applied_fields = before.as_ref().and_then(|child| child.applied_fields);
            let child = ChildState { spec_hash: spec_hash.map(StoredHash::new), seen, applied_fields };
            if before.as_ref().map(summary) != Some(summary(&child)) {
                changed.insert(agent.clone());
            }
            *state.by_agent.entry(agent).or_default().entry((kind, name)) = child;
        }
        changed.extend(previous.into_keys().map(|(agent, _)| agent));
        state.synced.insert(kind);
        if first_list { Vec::new() } else { changed.into_iter().collect() }
    }
}

/// What of a child decides whether the controller must look at it again.
fn summary(child: &ChildState) -> (Option<StoredHash>, bool) {
    (child.spec_hash.clone(), child.drifted())
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
    fn a_spec_hash_reads_back_exactly_as_the_annotation_was_written() {
        let sha = "3cd4809a4a0fe971008fef31b207db7d8b78b34f798117333618962880482bf6";
        assert!(matches!(StoredHash::new(sha.into()), StoredHash::Sha256(_)));
        for annotation in
            [sha, "3CD4809A4A0FE971008FEF31B207DB7D8B78B34F798117333618962880482BF6", "edited", ""]
        {
            let index = ChildIndex::new_synced();
            index.record(ChildKind::Role, "ns", "a", "a", Some(annotation.into()));
            assert_eq!(index.children_of("ns", "a")[0].spec_hash.as_deref(), Some(annotation));
        }
    }

    #[test]
    fn children_come_back_in_kind_order_whatever_order_they_were_seen_in() {
        let index = ChildIndex::new_synced();
        for kind in ChildKind::ALL.iter().rev() {
            index.record(*kind, "ns", "a", "a", None);
        }
        let kinds: Vec<ChildKind> = index.children_of("ns", "a").iter().map(|c| c.kind).collect();
        assert_eq!(kinds, ChildKind::ALL);
        index.forget(ChildKind::Role, "ns", "a", "a");
        assert_eq!(index.len(), 6);
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

    fn managed(entries: &[(&str, &str, &str)]) -> ObjectMeta {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
        ObjectMeta {
            managed_fields: Some(
                entries
                    .iter()
                    .map(|(manager, operation, field)| ManagedFieldsEntry {
                        manager: Some((*manager).into()),
                        operation: Some((*operation).into()),
                        fields_v1: Some(FieldsV1(serde_json::json!({ *field: {} }))),
                        ..ManagedFieldsEntry::default()
                    })
                    .collect(),
            ),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn a_field_taken_by_another_manager_is_drift_until_reapplied() {
        let index = ChildIndex::new_synced();
        let applied = Ownership::of(&managed(&[(FIELD_MANAGER, "Apply", "f:spec")]));
        index.record_applied(ChildKind::Role, "ns", "a", "a", Some("h".into()), applied);
        assert!(!index.children_of("ns", "a")[0].drifted);

        let annotated = Ownership::of(&managed(&[
            (FIELD_MANAGER, "Apply", "f:spec"),
            ("kubectl", "Update", "f:metadata"),
        ]));
        index.observe(ChildKind::Role, "ns", "a", "a", Some("h".into()), annotated);
        assert!(!index.children_of("ns", "a")[0].drifted, "a field Strata does not set is not drift");

        let edited = Ownership::of(&managed(&[
            (FIELD_MANAGER, "Apply", "f:other"),
            ("kubectl-edit", "Update", "f:spec"),
        ]));
        index.observe(ChildKind::Role, "ns", "a", "a", Some("h".into()), edited);
        assert!(index.children_of("ns", "a")[0].drifted, "kubectl edit took f:spec from the controller");
    }

    #[test]
    fn before_the_first_apply_only_other_managers_count_as_drift() {
        let index = ChildIndex::new_synced();
        let alone = Ownership::of(&managed(&[(FIELD_MANAGER, "Apply", "f:spec")]));
        index.observe(ChildKind::Role, "ns", "a", "a", Some("h".into()), alone);
        assert!(!index.children_of("ns", "a")[0].drifted);
        let touched =
            Ownership::of(&managed(&[(FIELD_MANAGER, "Apply", "f:spec"), ("kubectl", "Update", "f:x")]));
        index.observe(ChildKind::Role, "ns", "a", "a", Some("h".into()), touched);
        assert!(index.children_of("ns", "a")[0].drifted);
    }

    #[test]
    fn only_events_that_matter_wake_the_agent() {
        let index = ChildIndex::new();
        let agent = ("ns".to_string(), "a".to_string());
        index.apply_event::<ConfigMap>(ChildKind::ConfigMap, &watcher::Event::Init);
        index.apply_event(ChildKind::ConfigMap, &watcher::Event::InitApply(meta("a-gateway", "a", "h1")));
        let first = index.apply_event::<ConfigMap>(ChildKind::ConfigMap, &watcher::Event::InitDone);
        assert!(first.is_empty(), "the first list wakes no one: every Agent is reconciled at start");

        let applied = Ownership::of(&managed(&[(FIELD_MANAGER, "Apply", "f:data")]));
        index.record_applied(ChildKind::ConfigMap, "ns", "a", "a-gateway", Some("h1".into()), applied);
        let mut same = meta("a-gateway", "a", "h1");
        same.metadata.managed_fields = managed(&[(FIELD_MANAGER, "Apply", "f:data")]).managed_fields;
        assert!(index.apply_event(ChildKind::ConfigMap, &watcher::Event::Apply(same.clone())).is_empty());

        let mut labelled = same.clone();
        labelled.metadata.managed_fields =
            managed(&[(FIELD_MANAGER, "Apply", "f:data"), ("kubectl", "Update", "f:metadata")])
                .managed_fields;
        assert!(
            index.apply_event(ChildKind::ConfigMap, &watcher::Event::Apply(labelled)).is_empty(),
            "a field Strata does not set changes nothing it owns"
        );

        let mut edited = same.clone();
        edited.metadata.managed_fields =
            managed(&[(FIELD_MANAGER, "Apply", "f:other"), ("kubectl-edit", "Update", "f:data")])
                .managed_fields;
        assert_eq!(
            index.apply_event(ChildKind::ConfigMap, &watcher::Event::Apply(edited)),
            vec![agent.clone()]
        );

        let rehashed = meta("a-gateway", "a", "h2");
        assert_eq!(
            index.apply_event(ChildKind::ConfigMap, &watcher::Event::Apply(rehashed)),
            vec![agent.clone()]
        );
        assert_eq!(
            index.apply_event(ChildKind::ConfigMap, &watcher::Event::Delete(same)),
            vec![agent.clone()]
        );

        // A relist after a lost watch wakes the Agents whose children changed meanwhile.
        index.apply_event::<ConfigMap>(ChildKind::ConfigMap, &watcher::Event::Init);
        index.apply_event(ChildKind::ConfigMap, &watcher::Event::InitApply(meta("b-gateway", "b", "h")));
        let relisted = index.apply_event::<ConfigMap>(ChildKind::ConfigMap, &watcher::Event::InitDone);
        assert_eq!(relisted, [("ns".to_string(), "b".to_string())]);
    }
}
