//! The agent pods and their FailedMount events as the controller caches them: label- and
//! field-selected watches, each pod reduced to the few facts an Agent's status needs (a cached
//! `Pod` costs over 2 KiB even when trimmed, 20 MiB at 10,000 Agents), and a fingerprint of those
//! facts so only a change that matters wakes the Agent.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, PoisonError, RwLock};

use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference, Pod};
use kube::api::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use strata_api::Agent;

use crate::controller::agent::dereference::{
    PodObservation, foreign_journal_refusal, pod_name, secret_not_found,
};
use crate::controller::labels::{LABEL_AGENT, LABEL_COMPACTION_JOB, LABEL_MANAGED_BY, MANAGED_BY};

/// Label selector of agent pods: managed by Strata, and not a compaction Job's pod.
pub fn agent_pod_selector() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY},!{LABEL_COMPACTION_JOB}")
}

/// Field selector of the kubelet's mount failures of pods (an absent Secret shows there first).
pub const MOUNT_FAILURE_FIELDS: &str = "involvedObject.kind=Pod,reason=FailedMount";

/// What an Agent's status reads of its pod.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodFacts {
    /// Pod phase (absent before the first status).
    pub phase: Option<String>,
    /// Whether the Ready condition is True.
    pub ready: bool,
    /// The node it runs on.
    pub node_name: Option<String>,
    /// The gateway's refusal of a journal another Agent created (its last termination message).
    pub foreign_journal: Option<String>,
}

impl PodFacts {
    /// The facts of `pod`.
    pub fn of(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        PodFacts {
            phase: status.and_then(|status| status.phase.clone()),
            ready: status.and_then(|status| status.conditions.as_ref()).is_some_and(|conditions| {
                conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
            }),
            node_name: pod.spec.as_ref().and_then(|spec| spec.node_name.clone()),
            foreign_journal: status.and_then(foreign_journal_refusal),
        }
    }
}

type PodKey = (String, String);

#[derive(Default)]
struct PodIndexState {
    pods: HashMap<PodKey, PodFacts>,
    /// The pods of a list in progress (the watch's initial list or a relist), swapped in when done.
    relisting: Option<HashMap<PodKey, PodFacts>>,
    synced: bool,
}

/// The agent pods' facts by pod namespace and name, kept current by the pod watch's events.
#[derive(Clone, Default)]
pub struct PodIndex {
    state: Arc<RwLock<PodIndexState>>,
}

fn pod_key(pod: &Pod) -> Option<PodKey> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

impl PodIndex {
    /// An index whose initial list is done (tests: fill it with [`PodIndex::insert`]).
    pub fn new_synced() -> Self {
        let index = Self::default();
        index.write().synced = true;
        index
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, PodIndexState> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, PodIndexState> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `pod`'s facts.
    pub fn insert(&self, pod: &Pod) {
        if let Some(key) = pod_key(pod) {
            self.write().pods.insert(key, PodFacts::of(pod));
        }
    }

    /// Applies one event of the pod watch, as a reflector applies it to its store.
    pub fn apply_event(&self, event: &watcher::Event<Pod>) {
        let mut state = self.write();
        match event {
            watcher::Event::Apply(pod) => {
                if let Some(key) = pod_key(pod) {
                    state.pods.insert(key, PodFacts::of(pod));
                }
            }
            watcher::Event::Delete(pod) => {
                if let Some(key) = pod_key(pod) {
                    state.pods.remove(&key);
                }
            }
            watcher::Event::Init => state.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(pod) => {
                if let (Some(key), Some(relisting)) = (pod_key(pod), state.relisting.as_mut()) {
                    relisting.insert(key, PodFacts::of(pod));
                }
            }
            watcher::Event::InitDone => {
                if let Some(listed) = state.relisting.take() {
                    state.pods = listed;
                }
                state.synced = true;
            }
        }
    }

    /// Whether the initial list is done.
    pub fn is_synced(&self) -> bool {
        self.read().synced
    }

    /// The facts of pod `name` in `namespace`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<PodFacts> {
        self.read().pods.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    /// How many pods are indexed.
    pub fn len(&self) -> usize {
        self.read().pods.len()
    }

    /// Whether no pod is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Drop everything of a FailedMount event but the pod it is about and its message.
pub fn trim_event(event: &mut CoreEvent) {
    let meta = std::mem::take(&mut event.metadata);
    let involved = std::mem::take(&mut event.involved_object);
    *event = CoreEvent {
        metadata: ObjectMeta {
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            resource_version: meta.resource_version,
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            kind: involved.kind,
            name: involved.name,
            namespace: involved.namespace,
            ..ObjectReference::default()
        },
        reason: event.reason.take(),
        message: event.message.take(),
        ..CoreEvent::default()
    };
}

/// What the Agent's status reads of pod `pod_name` in `namespace`, with the Secret a FailedMount
/// event names.
pub fn observe(
    facts: PodFacts,
    mount_failures: &Store<CoreEvent>,
    namespace: &str,
    pod_name: &str,
) -> PodObservation {
    let phase = facts.phase.unwrap_or_else(|| "Pending".into());
    let missing_secret = if phase == "Pending" {
        mount_failures
            .state()
            .iter()
            .filter(|event| {
                event.involved_object.namespace.as_deref() == Some(namespace)
                    && event.involved_object.name.as_deref() == Some(pod_name)
            })
            .filter_map(|event| event.message.as_deref())
            .find_map(secret_not_found)
    } else {
        None
    };
    PodObservation {
        ready: facts.ready,
        node_name: facts.node_name,
        foreign_journal: facts.foreign_journal,
        missing_secret,
        phase,
    }
}

/// A fingerprint of what [`observe`] reads of a pod (without events): a pod event that leaves it
/// alone does not wake the Agent.
pub fn pod_fingerprint(pod: &Pod) -> Option<u64> {
    pod.status.as_ref()?;
    let mut hasher = DefaultHasher::new();
    PodFacts::of(pod).hash(&mut hasher);
    Some(hasher.finish())
}

/// The Agent whose pod this is.
pub fn agent_of_pod(pod: &Pod) -> Option<ObjectRef<Agent>> {
    let agent = pod.metadata.labels.as_ref()?.get(LABEL_AGENT)?;
    Some(ObjectRef::new(agent).within(pod.metadata.namespace.as_deref()?))
}

/// The Agent whose pod a FailedMount event is about (agent pods are named `<agent>-0`).
pub fn agent_of_event(event: &CoreEvent) -> Option<ObjectRef<Agent>> {
    let involved = &event.involved_object;
    let agent = involved.name.as_deref()?.strip_suffix("-0")?;
    let namespace = involved.namespace.as_deref().or(event.metadata.namespace.as_deref())?;
    (pod_name(agent) == involved.name.as_deref()?).then(|| ObjectRef::new(agent).within(namespace))
}

/// The cached pod of Agent `agent` in `namespace`, observed.
pub fn cached_observation(
    pods: &PodIndex,
    mount_failures: &Store<CoreEvent>,
    namespace: &str,
    agent: &str,
) -> Option<PodObservation> {
    let name = pod_name(agent);
    let facts = pods.get(namespace, &name)?;
    Some(observe(facts, mount_failures, namespace, &name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: &str, ready: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "builder-0", "namespace": "ns", "resourceVersion": "7",
                         "labels": {LABEL_AGENT: "builder", "other": "x"},
                         "annotations": {"big": "y"}, "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "agent", "image": "a"}]},
            "status": {"phase": phase, "podIP": "10.0.0.1",
                       "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }},
                                      {"type": "PodScheduled", "status": "True"}],
                       "containerStatuses": [
                           {"name": "agent", "image": "a", "imageID": "", "ready": ready, "restartCount": 0},
                           {"name": "gateway", "image": "g", "imageID": "", "ready": ready, "restartCount": 1,
                            "lastState": {"terminated": {"exitCode": 1, "message": "refusing to serve another agent's history"}}}]}
        }))
        .unwrap_or_default()
    }

    #[test]
    fn the_index_keeps_what_status_reads_and_follows_the_watch() {
        let empty = kube::runtime::reflector::store::<CoreEvent>().0;
        let index = PodIndex::default();
        assert!(!index.is_synced());
        index.apply_event(&watcher::Event::Init);
        index.apply_event(&watcher::Event::InitApply(pod("Running", true)));
        assert!(index.get("ns", "builder-0").is_none(), "a list in progress is not served");
        index.apply_event(&watcher::Event::InitDone);
        assert!(index.is_synced());
        let observed = cached_observation(&index, &empty, "ns", "builder").expect("indexed");
        assert_eq!(observed.phase, "Running");
        assert!(observed.ready);
        assert_eq!(observed.node_name.as_deref(), Some("n1"));
        assert!(observed.foreign_journal.is_some_and(|m| m.contains("another agent's history")));
        index.apply_event(&watcher::Event::Apply(pod("Pending", false)));
        assert_eq!(cached_observation(&index, &empty, "ns", "builder").expect("indexed").phase, "Pending");
        index.apply_event(&watcher::Event::Delete(pod("Pending", false)));
        assert!(index.is_empty());
        assert_eq!(agent_of_pod(&pod("Running", true)), Some(ObjectRef::new("builder").within("ns")));
    }

    #[test]
    fn only_a_change_status_reads_changes_the_fingerprint() {
        assert_ne!(pod_fingerprint(&pod("Running", true)), pod_fingerprint(&pod("Running", false)));
        assert_ne!(pod_fingerprint(&pod("Pending", false)), pod_fingerprint(&pod("Running", false)));
        let mut moved_ip = pod("Running", true);
        if let Some(status) = moved_ip.status.as_mut() {
            status.pod_ip = Some("10.0.0.2".into());
        }
        assert_eq!(pod_fingerprint(&moved_ip), pod_fingerprint(&pod("Running", true)));
    }

    #[test]
    fn a_mount_failure_wakes_the_agent_of_the_pod() {
        let mut event = CoreEvent {
            metadata: ObjectMeta {
                name: Some("e".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                kind: Some("Pod".into()),
                name: Some("builder-0".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            reason: Some("FailedMount".into()),
            message: Some("secret \"k\" not found".into()),
            ..Default::default()
        };
        trim_event(&mut event);
        assert_eq!(agent_of_event(&event), Some(ObjectRef::new("builder").within("ns")));
        event.involved_object.name = Some("worker-7".into());
        assert_eq!(agent_of_event(&event), None);
    }
}
