//! The Agent kind: one always-on LLM agent, run as a StatefulSet with a journal volume and the gateway sidecar.
// Each `printcolumn(...)` repeats `type_ = ...`; clippy mistakes that for a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::policy::PolicySpec;
use crate::refs::{LocalKeyRef, LocalRef};

/// Desired state of an always-on agent.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "strata.dev",
    version = "v1alpha1",
    kind = "Agent",
    doc = "An always-on LLM agent: a StatefulSet with a journal volume and the Strata context gateway sidecar.",
    namespaced,
    status = "AgentStatus",
    shortname = "agt",
    category = "strata",
    cel,
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.model.name"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Context",
        type_ = "integer",
        json_path = ".status.context.percent",
        description = "Percent of the context window in use"
    ),
    printcolumn(name = "Level", type_ = "string", json_path = ".status.context.level"),
    printcolumn(
        name = "Volume",
        type_ = "integer",
        json_path = ".status.context.volumeBytes",
        description = "Bytes used on the agent's data volume",
        priority = 1
    ),
    printcolumn(
        name = "Generation",
        type_ = "integer",
        json_path = ".status.journal.generation",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "!has(self.overrides) || !has(self.overrides.budget) || \
     (has(self.overrides.budget.reservedCompletionTokens) ? self.overrides.budget.reservedCompletionTokens : 0) + \
     (has(self.overrides.budget.protocolOverheadTokens) ? self.overrides.budget.protocolOverheadTokens : 0) + \
     (has(self.overrides.budget.safetyMarginTokens) ? self.overrides.budget.safetyMarginTokens : 0) < self.model.contextWindow")
    .message("overrides.budget: reservedCompletionTokens + protocolOverheadTokens + safetyMarginTokens must be less than model.contextWindow, or no room is left for context: lower the reservations or raise contextWindow"))]
pub struct AgentSpec {
    /// The model the agent talks to, through the gateway sidecar.
    pub model: ModelSpec,
    /// The user's own agent container.
    pub runtime: RuntimeSpec,
    /// Tier-1 sources: the stable prefix every request starts with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_prefix: Option<StablePrefixSpec>,
    /// A ContextPolicy in this namespace. Without it, a ContextPolicy named `default` applies if present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_policy_ref: Option<LocalRef>,
    /// Agent-level policy overrides, applied after the namespace's ContextPolicy and before platform locks and bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides: Option<PolicySpec>,
    /// The journal volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.storage is immutable: a StatefulSet's volumeClaimTemplate cannot change; resize the PVC directly or create a new Agent"))]
    pub storage: Option<StorageSpec>,
    /// Co-locate agents that share a prompt prefix, so the provider-side cache is warm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_affinity: Option<CacheAffinitySpec>,
    /// How the agent talks to the gateway. Default Transparent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_mode: Option<SessionMode>,
    /// Scale the agent to zero; its journal is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
}

/// Model provider API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Provider {
    /// OpenAI's API.
    OpenAI,
    /// Anthropic's Messages API.
    Anthropic,
    /// Any server speaking the OpenAI chat-completions API (vLLM, SGLang, a router).
    OpenAICompatible,
}

/// Tokenizer used to count context tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Tokenizer {
    /// OpenAI o200k_base BPE (GPT-4o and later).
    O200kBase,
    /// OpenAI cl100k_base BPE (GPT-4, GPT-3.5).
    Cl100kBase,
    /// A BPE estimate calibrated per agent from provider-reported input tokens.
    Approximate,
}

impl Provider {
    /// The tokenizer used when `model.tokenizer` is not set.
    pub fn default_tokenizer(self) -> Tokenizer {
        match self {
            Provider::OpenAI => Tokenizer::O200kBase,
            Provider::Anthropic | Provider::OpenAICompatible => Tokenizer::Approximate,
        }
    }
}

/// The model behind the agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.provider != 'OpenAICompatible' || has(self.endpoint)")
        .message("model.endpoint is required when model.provider is OpenAICompatible: set it to the server's base URL, e.g. http://vllm.models.svc:8000/v1"),
)]
pub struct ModelSpec {
    /// Provider API.
    pub provider: Provider,
    /// Model name as the provider knows it.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Base URL of the upstream; required for OpenAICompatible, optional otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://"))]
    pub endpoint: Option<String>,
    /// Size of the model's context window, in tokens.
    #[schemars(range(min = 1024, max = 100_000_000))]
    pub context_window: u32,
    /// Tokenizer; defaults to O200kBase for OpenAI and Approximate otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<Tokenizer>,
    /// Secret key holding the provider API key. Mounted into the sidecar only, never the agent container.
    pub credentials_secret_ref: LocalKeyRef,
    /// How the gateway and compaction Jobs reach the endpoint from a network that allows egress only
    /// through a proxy, or that inspects TLS with a private authority. The agent container is left
    /// as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressSpec>,
}

/// The way out to the model's endpoint: a proxy and the authorities to trust.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.noProxy) || has(self.proxySecretRef)")
        .message("egress.noProxy lists exceptions to a proxy: set egress.proxySecretRef too, or remove noProxy"),
    validation = Rule::new("has(self.proxySecretRef) || has(self.trustedCAConfigMapRef)")
        .message("egress is empty: set proxySecretRef, trustedCAConfigMapRef or both, or remove egress"),
)]
pub struct EgressSpec {
    /// Secret key holding the proxy's URL, `http://host:port`, with `user:password@` before the host
    /// if the proxy needs credentials. `https` endpoints are reached through a CONNECT tunnel, and
    /// the credentials go to the proxy only. Mounted as a file; the URL never enters an environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_secret_ref: Option<LocalKeyRef>,
    /// Hosts reached without the proxy, as NO_PROXY lists them: a host, a domain with a leading dot
    /// (`.svc.cluster.local`), an IP address or a CIDR block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 253), regex(pattern = r"^[^,\s]+$")))]
    pub no_proxy: Option<Vec<String>>,
    /// ConfigMap key holding PEM certificates of authorities to trust in addition to the system's:
    /// for an endpoint, or a TLS-inspecting proxy, whose certificate a private authority issued. Read
    /// when the gateway starts; a changed bundle takes effect when the pod restarts.
    #[serde(default, rename = "trustedCAConfigMapRef", skip_serializing_if = "Option::is_none")]
    pub trusted_ca_config_map_ref: Option<LocalKeyRef>,
}

impl ModelSpec {
    /// The tokenizer in force: the explicit one, or the provider's default.
    pub fn effective_tokenizer(&self) -> Tokenizer {
        self.tokenizer.unwrap_or_else(|| self.provider.default_tokenizer())
    }
}

/// The user's agent container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeSpec {
    /// Container image of the agent.
    #[schemars(length(min = 1, max = 1024))]
    pub image: String,
    /// Entrypoint override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// Environment; OPENAI_BASE_URL and ANTHROPIC_BASE_URL are set by Strata and must not be given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.all(e, e.name != 'OPENAI_BASE_URL' && e.name != 'ANTHROPIC_BASE_URL')")
        .message("runtime.env must not set OPENAI_BASE_URL or ANTHROPIC_BASE_URL: Strata points them at the gateway sidecar"))]
    #[schemars(length(max = 128))]
    pub env: Option<Vec<EnvVar>>,
    /// Compute resources of the agent container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// Sources of the stable prompt prefix (Tier 1).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct StablePrefixSpec {
    /// The system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<TextSource>,
    /// A ConfigMap key holding a JSON array of tool schemas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<LocalKeyRef>,
    /// Project constants rendered, sorted by key, into the prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 256))]
    pub constants: Option<BTreeMap<String, String>>,
}

/// Text given inline or from a ConfigMap key: exactly one of the two.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.inline) != has(self.configMapKeyRef)")
    .message("systemPrompt needs exactly one of inline or configMapKeyRef"))]
pub struct TextSource {
    /// The text itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1_000_000))]
    pub inline: Option<String>,
    /// A ConfigMap key in this namespace holding the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<LocalKeyRef>,
}

/// The journal volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// Requested size. Default 1Gi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Quantity>,
    /// StorageClass; the cluster default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_class_name: Option<String>,
    /// Keep the journal claim when the Agent is deleted. Default false: the claim (the agent's
    /// whole history) is deleted with the Agent. A kept journal is bound to this Agent's UID; a new
    /// Agent uses it only with the annotation `strata.dev/adopt-journal-from-uid: <this UID>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_on_delete: Option<bool>,
}

/// Cache-affinity placement.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.weight) || !has(self.mode) || self.mode == 'Preferred'")
    .message("cacheAffinity.weight applies only to mode Preferred: remove weight or set mode: Preferred"))]
pub struct CacheAffinitySpec {
    /// Preferred (weighted), Required, or Disabled. Default Preferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<CacheAffinityMode>,
    /// Weight of the preferred affinity term, 1–100. Default 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub weight: Option<u8>,
}

/// Cache-affinity mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum CacheAffinityMode {
    /// A weighted preference for nodes running agents with the same prefix key.
    Preferred,
    /// Only schedule next to agents with the same prefix key.
    Required,
    /// No affinity.
    Disabled,
}

/// How the agent talks to the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum SessionMode {
    /// The client sends its whole message list; the gateway journals only what is new.
    Transparent,
    /// The client sends only new messages, with an `x-strata-session` header.
    Stateful,
}

/// Observed state of an Agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// Pending, Running, Suspended, Degraded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<AgentPhase>,
    /// Standard conditions: Ready, ReferencesResolved, PolicyResolved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The stable prefix and its cache identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<PrefixStatus>,
    /// Context use, written by the gateway sidecar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextStatus>,
    /// The effective policy and where each field came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_policy: Option<EffectivePolicyStatus>,
    /// The journal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal: Option<JournalStatus>,
    /// The most recent compaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_compaction: Option<LastCompaction>,
}

/// Agent lifecycle phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum AgentPhase {
    /// Children are being created or the pod is starting.
    Pending,
    /// The agent pod is running.
    Running,
    /// `suspend` is set.
    Suspended,
    /// Running, but a reference or the policy has a problem.
    Degraded,
    /// Cannot be reconciled until the spec or a reference is fixed.
    Failed,
}

/// The stable prefix.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrefixStatus {
    /// sha256 of the canonical prefix.
    pub hash: String,
    /// Short (16 hex) tenant-scoped cache key.
    pub cache_key: String,
    /// Canonicalisation version used.
    pub canonicalization_version: String,
    /// Tokens in the prefix.
    pub tokens: u64,
}

/// Context pressure level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum ContextLevel {
    /// Below the warning threshold.
    Normal,
    /// At or above warningPercent.
    Warning,
    /// At or above highRiskPercent.
    HighRisk,
    /// At or above criticalPercent.
    Critical,
}

/// Context use as reported by the gateway.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextStatus {
    /// Tokens in the compiled context.
    pub tokens: u64,
    /// The context window.
    pub limit: u64,
    /// Tokens available for the next operation after reservations.
    pub available: i64,
    /// Percent of the window in use.
    pub percent: u8,
    /// Pressure level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<ContextLevel>,
    /// Prompt tokens served from the provider cache, cumulative.
    #[serde(default)]
    pub cached_tokens: u64,
    /// Prompt tokens billed fresh, cumulative.
    #[serde(default)]
    pub fresh_tokens: u64,
    /// Bytes used on the agent's data volume (journal, artifacts, gateway state), as the gateway
    /// last measured them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_bytes: Option<u64>,
    /// When the gateway wrote this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<Time>,
}

/// The effective policy as applied.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EffectivePolicyStatus {
    /// sha256 of the effective policy.
    pub hash: String,
    /// The objects that contributed, in merge order, e.g. `ClusterContextPolicy/fleet-default`.
    #[serde(default)]
    pub sources: Vec<String>,
    /// Values that a platform lock or bound changed.
    #[serde(default)]
    pub clamped: Vec<crate::effective::Clamp>,
}

/// Journal state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JournalStatus {
    /// CURRENT generation of the journal.
    pub generation: u64,
}

/// Summary of the most recent compaction.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastCompaction {
    /// The CompactionJob that ran it.
    pub job_name: String,
    /// Its compaction id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_id: Option<String>,
    /// Tokens before.
    #[serde(default)]
    pub tokens_before: u64,
    /// Tokens after.
    #[serde(default)]
    pub tokens_after: u64,
    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
}
