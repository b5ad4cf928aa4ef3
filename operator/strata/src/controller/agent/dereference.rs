//! Step 1 of the Agent pipeline (IO): fetch everything the Agent refers to. Policies, namespaces,
//! the agent pod and its mount failures come from caches; a referenced ConfigMap is read only when
//! its watched version changed; Secret existence is learned from the pod's mount failures, so the
//! operator never reads tenant Secrets.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use strata_api::{Agent, ClusterContextPolicy, ContextPolicy};

use crate::controller::agent_pods::cached_observation;
use crate::controller::context::Context;
use crate::controller::error::{Error, Result, name_of, namespace_of};
use crate::controller::labels::ANNOTATION_CACHE_EPOCH;

/// The ContextPolicy that applies when an Agent names none.
pub const DEFAULT_POLICY_NAME: &str = "default";

/// Everything the Agent refers to, fetched.
#[derive(Clone, Debug)]
pub struct AgentInputs {
    /// The Agent's namespace.
    pub namespace: NamespaceInfo,
    /// Every ClusterContextPolicy (resolution skips the ones that do not select the namespace).
    pub cluster_policies: Vec<ClusterContextPolicy>,
    /// The namespace's ContextPolicy.
    pub context_policy: PolicyLookup,
    /// The system prompt, if the Agent has one.
    pub system_prompt: Option<Fetched>,
    /// The tools JSON, if the Agent has one.
    pub tools: Option<Fetched>,
    /// The PEM bundle of `spec.model.egress.trustedCAConfigMapRef`, if the Agent names one.
    pub trusted_authorities: Option<Fetched>,
    /// The agent pod, if it exists.
    pub pod: Option<PodObservation>,
}

/// The namespace as the caches see it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NamespaceInfo {
    /// Its name.
    pub name: String,
    /// Its UID: the tenant id of cache keys.
    pub uid: String,
    /// Its labels, for ClusterContextPolicy selectors.
    pub labels: BTreeMap<String, String>,
    /// The raw `strata.dev/cache-epoch` annotation.
    pub cache_epoch: Option<String>,
}

/// Outcome of looking up the namespace's ContextPolicy.
#[derive(Clone, Debug)]
pub enum PolicyLookup {
    /// Found.
    Found(Box<ContextPolicy>),
    /// No ref, and no policy named `default`: only cluster policies and defaults apply.
    NoDefault,
    /// The Agent names a policy that does not exist.
    Missing(String),
}

/// Outcome of reading one ConfigMap key.
#[derive(Clone, Debug, PartialEq)]
pub enum Fetched {
    /// The key's text.
    Text(String),
    /// The ConfigMap does not exist.
    MissingConfigMap(String),
    /// The ConfigMap exists but lacks the key.
    MissingKey {
        /// ConfigMap name.
        name: String,
        /// The key.
        key: String,
    },
}

/// What the controller needs to know about the agent pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodObservation {
    /// Pod phase, e.g. Running.
    pub phase: String,
    /// Whether the Ready condition is True.
    pub ready: bool,
    /// The node it runs on.
    pub node_name: Option<String>,
    /// A Secret the kubelet could not mount (from the pod's FailedMount events).
    pub missing_secret: Option<String>,
    /// The gateway's refusal of a journal another Agent created (its last termination message).
    pub foreign_journal: Option<String>,
}

/// Name of the gateway sidecar container.
pub const GATEWAY_CONTAINER: &str = "gateway";
/// Words of the gateway's refusal of a journal another Agent created (`OwnerError::Foreign`).
pub const FOREIGN_JOURNAL_MARKER: &str = "refusing to serve another agent's history";

/// The agent pod's name (a StatefulSet with one replica).
pub fn pod_name(agent: &str) -> String {
    format!("{agent}-0")
}

/// Fetch every input of `agent`.
pub async fn dereference(agent: &Agent, ctx: &Context) -> Result<AgentInputs> {
    let namespace = namespace_of(&agent.metadata, "Agent")?;
    let name = name_of(&agent.metadata, "Agent")?;
    let namespace_info = namespace_info(ctx, &namespace)?;
    let cluster_policies = ctx.caches.cluster_policies.state().iter().map(|p| (**p).clone()).collect();
    let context_policy = context_policy(ctx, agent, &namespace);

    let prefix = agent.spec.stable_prefix.as_ref();
    let system_prompt = match prefix.and_then(|p| p.system_prompt.as_ref()) {
        None => None,
        Some(source) => match (&source.inline, &source.config_map_key_ref) {
            (Some(text), _) => Some(Fetched::Text(text.clone())),
            (None, Some(key_ref)) => Some(read_key(ctx, &namespace, &key_ref.name, &key_ref.key).await?),
            (None, None) => None,
        },
    };
    let tools = match prefix.and_then(|p| p.tools.as_ref()) {
        None => None,
        Some(key_ref) => Some(read_key(ctx, &namespace, &key_ref.name, &key_ref.key).await?),
    };
    let trusted_authorities =
        match agent.spec.model.egress.as_ref().and_then(|e| e.trusted_ca_config_map_ref.as_ref()) {
            None => None,
            Some(key_ref) => Some(read_key(ctx, &namespace, &key_ref.name, &key_ref.key).await?),
        };
    let pod = cached_observation(&ctx.caches.pods, &ctx.caches.mount_failures, &namespace, &name);
    Ok(AgentInputs {
        namespace: namespace_info,
        cluster_policies,
        context_policy,
        system_prompt,
        tools,
        trusted_authorities,
        pod,
    })
}

fn namespace_info(ctx: &Context, namespace: &str) -> Result<NamespaceInfo> {
    let key = ObjectRef::<PartialObjectMeta<Namespace>>::new(namespace);
    let found = ctx.caches.namespaces.get(&key).ok_or(Error::CacheNotReady("Namespace"))?;
    let meta = &found.metadata;
    Ok(NamespaceInfo {
        name: namespace.to_string(),
        uid: meta.uid.clone().ok_or(Error::MissingField { kind: "Namespace", field: "metadata.uid" })?,
        labels: meta.labels.clone().unwrap_or_default(),
        cache_epoch: meta.annotations.as_ref().and_then(|a| a.get(ANNOTATION_CACHE_EPOCH)).cloned(),
    })
}

fn context_policy(ctx: &Context, agent: &Agent, namespace: &str) -> PolicyLookup {
    let (wanted, explicit) = match &agent.spec.context_policy_ref {
        Some(policy_ref) => (policy_ref.name.as_str(), true),
        None => (DEFAULT_POLICY_NAME, false),
    };
    match ctx.caches.context_policies.get(&ObjectRef::new(wanted).within(namespace)) {
        Some(policy) => PolicyLookup::Found(Box::new((*policy).clone())),
        None if explicit && wanted != DEFAULT_POLICY_NAME => PolicyLookup::Missing(wanted.to_string()),
        None => PolicyLookup::NoDefault,
    }
}

async fn read_key(ctx: &Context, namespace: &str, name: &str, key: &str) -> Result<Fetched> {
    let data = ctx.config_map_data.get(&ctx.client, &ctx.caches.config_maps, namespace, name).await?;
    Ok(match data {
        None => Fetched::MissingConfigMap(name.to_string()),
        Some(data) => match data.get(key) {
            Some(text) => Fetched::Text(text.clone()),
            None => Fetched::MissingKey { name: name.to_string(), key: key.to_string() },
        },
    })
}

/// The line of the gateway's last termination message that refuses another Agent's journal.
pub fn foreign_journal_refusal(status: &k8s_openapi::api::core::v1::PodStatus) -> Option<String> {
    let gateway = status.container_statuses.iter().flatten().find(|c| c.name == GATEWAY_CONTAINER)?;
    [gateway.state.as_ref(), gateway.last_state.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(|state| state.terminated.as_ref()?.message.as_deref())
        .flat_map(str::lines)
        .find(|line| line.contains(FOREIGN_JOURNAL_MARKER))
        .map(|line| line.trim().trim_start_matches("strata: ").to_string())
}

/// `secret "anthropic-api" not found` → `anthropic-api`.
pub fn secret_not_found(message: &str) -> Option<String> {
    let start = message.find("secret \"")? + "secret \"".len();
    let rest = &message[start..];
    let end = rest.find('"')?;
    rest[end..].starts_with("\" not found").then(|| rest[..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_read_from_failed_mount_messages() {
        let message =
            "MountVolume.SetUp failed for volume \"credentials\" : secret \"anthropic-api\" not found";
        assert_eq!(secret_not_found(message).as_deref(), Some("anthropic-api"));
        assert_eq!(secret_not_found("secret \"x\" is forbidden"), None);
        assert_eq!(secret_not_found("timed out"), None);
    }

    #[test]
    fn the_gateways_refusal_of_a_foreign_journal_is_read_from_its_last_termination() {
        let refusal = "strata: data dir /var/lib/strata: the journal in /var/lib/strata belongs to Agent rateright/builder (uid a), not to this Agent (uid b): refusing to serve another agent's history. Delete the claim";
        let status: k8s_openapi::api::core::v1::PodStatus = serde_json::from_value(serde_json::json!({
            "containerStatuses": [
                {"name": "agent", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"terminated": {"exitCode": 1, "message": "unrelated"}}},
                {"name": "gateway", "image": "x", "imageID": "", "ready": false, "restartCount": 3,
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                 "lastState": {"terminated": {"exitCode": 1, "message": format!("2026 INFO starting\n{refusal}\n")}}}]
        }))
        .unwrap_or_default();
        let found = foreign_journal_refusal(&status).unwrap_or_default();
        assert!(found.starts_with("data dir /var/lib/strata: the journal"), "{found}");
        assert_eq!(foreign_journal_refusal(&Default::default()), None);
    }
}
