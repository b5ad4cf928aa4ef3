//! The agent pods and their FailedMount events as the controller caches them: label- and
//! field-selected watches, each object trimmed to the few fields an Agent's status needs, and a
//! fingerprint of those fields so only a change that matters wakes the Agent.

use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Event as CoreEvent, ObjectReference, Pod,
    PodCondition, PodSpec, PodStatus,
};
use kube::api::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use strata_api::Agent;

use crate::controller::agent::dereference::{
    GATEWAY_CONTAINER, PodObservation, foreign_journal_refusal, pod_name, secret_not_found,
};
use crate::controller::labels::{LABEL_AGENT, LABEL_COMPACTION_JOB, LABEL_MANAGED_BY, MANAGED_BY};

/// Label selector of agent pods: managed by Strata, and not a compaction Job's pod.
pub fn agent_pod_selector() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY},!{LABEL_COMPACTION_JOB}")
}

/// Field selector of the kubelet's mount failures of pods (an absent Secret shows there first).
pub const MOUNT_FAILURE_FIELDS: &str = "involvedObject.kind=Pod,reason=FailedMount";

/// Drop everything of an agent pod but what [`observe`] reads and the watch needs.
pub fn trim_pod(pod: &mut Pod) {
    let meta = std::mem::take(&mut pod.metadata);
    pod.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        labels: meta.labels.map(|labels| labels.into_iter().filter(|(key, _)| key == LABEL_AGENT).collect()),
        ..ObjectMeta::default()
    };
    let node_name = pod.spec.take().and_then(|spec| spec.node_name);
    pod.spec = Some(PodSpec { node_name, ..PodSpec::default() });
    let status = pod.status.take().unwrap_or_default();
    pod.status = Some(PodStatus {
        phase: status.phase,
        conditions: status.conditions.map(|conditions| {
            conditions.into_iter().filter(|c| c.type_ == "Ready").map(trim_condition).collect()
        }),
        container_statuses: status.container_statuses.map(|statuses| {
            statuses.into_iter().filter(|c| c.name == GATEWAY_CONTAINER).map(trim_container).collect()
        }),
        ..PodStatus::default()
    });
}

fn trim_condition(condition: PodCondition) -> PodCondition {
    PodCondition { type_: condition.type_, status: condition.status, ..PodCondition::default() }
}

fn trim_container(status: ContainerStatus) -> ContainerStatus {
    let terminated = |state: Option<ContainerState>| {
        let message = state?.terminated?.message?;
        Some(ContainerState {
            terminated: Some(ContainerStateTerminated { message: Some(message), ..Default::default() }),
            ..ContainerState::default()
        })
    };
    ContainerStatus {
        name: status.name,
        state: terminated(status.state),
        last_state: terminated(status.last_state),
        ..ContainerStatus::default()
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

/// What the Agent's status reads of its pod, with the Secret a FailedMount event names.
pub fn observe(pod: &Pod, mount_failures: &Store<CoreEvent>) -> PodObservation {
    let status = pod.status.clone().unwrap_or_default();
    let phase = status.phase.clone().unwrap_or_else(|| "Pending".into());
    let missing_secret = if phase == "Pending" {
        let namespace = pod.metadata.namespace.as_deref();
        let name = pod.metadata.name.as_deref();
        mount_failures
            .state()
            .iter()
            .filter(|event| {
                event.involved_object.namespace.as_deref() == namespace
                    && event.involved_object.name.as_deref() == name
            })
            .filter_map(|event| event.message.as_deref())
            .find_map(secret_not_found)
    } else {
        None
    };
    PodObservation {
        ready: status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True"),
        node_name: pod.spec.as_ref().and_then(|spec| spec.node_name.clone()),
        foreign_journal: foreign_journal_refusal(&status),
        missing_secret,
        phase,
    }
}

/// A fingerprint of what [`observe`] reads of a pod (without events): a pod event that leaves it
/// alone does not wake the Agent.
pub fn pod_fingerprint(pod: &Pod) -> Option<u64> {
    let status = pod.status.as_ref()?;
    let mut hasher = DefaultHasher::new();
    status.phase.hash(&mut hasher);
    status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True").hash(&mut hasher);
    pod.spec.as_ref().and_then(|spec| spec.node_name.as_ref()).hash(&mut hasher);
    foreign_journal_refusal(status).hash(&mut hasher);
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
    pods: &Store<Pod>,
    mount_failures: &Store<CoreEvent>,
    namespace: &str,
    agent: &str,
) -> Option<PodObservation> {
    let pod = pods.get(&ObjectRef::new(&pod_name(agent)).within(namespace))?;
    Some(observe(&pod, mount_failures))
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
    fn a_trimmed_pod_keeps_what_status_reads_and_nothing_else() {
        let mut trimmed = pod("Running", true);
        trim_pod(&mut trimmed);
        let empty = kube::runtime::reflector::store::<CoreEvent>().0;
        assert_eq!(observe(&trimmed, &empty), observe(&pod("Running", true), &empty));
        assert_eq!(pod_fingerprint(&trimmed), pod_fingerprint(&pod("Running", true)));
        assert!(trimmed.metadata.annotations.is_none() && trimmed.metadata.managed_fields.is_none());
        assert_eq!(trimmed.spec.as_ref().map(|s| s.containers.len()), Some(0));
        assert_eq!(
            trimmed.status.as_ref().and_then(|s| s.container_statuses.as_ref()).map(Vec::len),
            Some(1)
        );
        assert_eq!(agent_of_pod(&trimmed), Some(ObjectRef::new("builder").within("ns")));
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
