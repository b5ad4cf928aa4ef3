//! The shared, partial context-policy spec used by ContextPolicy, ClusterContextPolicy and Agent overrides.
//!
//! Every field is optional so that partial policies merge layer by layer; the built-in defaults
//! (see [`crate::effective::EffectivePolicy::default`]) fill whatever no layer sets.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

pub use strata_core::compaction::StateField;
pub use strata_core::entry::{RetentionClass, Role};
pub use strata_core::retention::{RetentionMatch, RetentionRule};

/// A partial context policy. Unset fields inherit from the layer below.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicySpec {
    /// Context budget: thresholds and reservations (seed 000's budget formula).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetSpec>,
    /// How large tool results are spilled off-window and elided as they age.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_results: Option<ToolResultsSpec>,
    /// Retention classes and time-to-live for journal entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionSpec>,
    /// When and how history is compacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionSpec>,
    /// Provider prompt-cache and response-cache behaviour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSpec>,
    /// Credential redaction before entries are persisted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redaction: Option<RedactionSpec>,
    /// How often the gateway reports context status to the Agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reporting: Option<ReportingSpec>,
    /// How long derived files on the agent's volume (artifacts, old generations, compaction
    /// records) are kept before the gateway's sweeper deletes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeSpec>,
    /// Lazy tool schemas: which tools get their full schema while the tools are over
    /// `budget.stages.toolsTokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<CapabilitiesSpec>,
    /// Delegation tools (sub-agents) whose results reach the parent as bounded digests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegation: Option<DelegationSpec>,
}

/// Per-section token ceilings, allocated after the output reserve in this order: system, tools,
/// memory, tool results, history. 0 means no ceiling of its own (the section takes what the
/// sections before it left).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageBudgetsSpec {
    /// The stable system prompt; over it is reported (a client's system prompt is never cut). Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10_000_000))]
    pub system_tokens: Option<u32>,
    /// Tool schemas; over it, tools the session has not needed are sent as one-line summaries
    /// (lazy schemas); 0 sends every schema in full. Default 8000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10_000_000))]
    pub tools_tokens: Option<u32>,
    /// Summaries of compacted and purged history; over it, two or more summaries are merged into one by a
    /// compaction (with automatic compaction on), and a single summary over it is reported. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10_000_000))]
    pub memory_tokens: Option<u32>,
    /// Tool results in the window; over it, the oldest are elided to their head and a data_ref. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10_000_000))]
    pub tool_results_tokens: Option<u32>,
    /// The rest of the conversation; over it, the history is compacted (with automatic compaction on). Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10_000_000))]
    pub history_tokens: Option<u32>,
}

/// Lazy tool schemas (GCS §17.14).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapabilitiesSpec {
    /// Tools given their full schema up front by a lexical ranking of names and descriptions
    /// against the request (besides every tool the session used). Default 6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1_000))]
    pub full_schema_tools: Option<u32>,
    /// A new request loads the schemas its ranking wants only when at least this many are still
    /// summarised: one cache rewrite per batch. Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000))]
    pub batch_tools: Option<u32>,
}

/// Delegation results (GCS §17.13).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DelegationSpec {
    /// Names of the tools that run a sub-agent. Default Task, task and delegate_task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub tools: Option<Vec<String>>,
    /// Tokens a delegation's digest may take in the parent's context; the full result stays
    /// readable by its data_ref. Default 2000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 64, max = 1_000_000))]
    pub return_tokens: Option<u32>,
}

/// Budget thresholds (percent of the context window) and token reservations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.warningPercent) || !has(self.highRiskPercent) || self.warningPercent < self.highRiskPercent")
        .message("budget.warningPercent must be lower than budget.highRiskPercent (defaults 80 < 90): lower warningPercent or raise highRiskPercent"),
    validation = Rule::new("!has(self.highRiskPercent) || !has(self.criticalPercent) || self.highRiskPercent < self.criticalPercent")
        .message("budget.highRiskPercent must be lower than budget.criticalPercent (defaults 90 < 95): lower highRiskPercent or raise criticalPercent"),
    validation = Rule::new("!has(self.warningPercent) || !has(self.criticalPercent) || self.warningPercent < self.criticalPercent")
        .message("budget.warningPercent must be lower than budget.criticalPercent (defaults 80 < 95): lower warningPercent or raise criticalPercent"),
)]
pub struct BudgetSpec {
    /// Context use (percent) at which Tier 3 warns the model. Default 80.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 98))]
    pub warning_percent: Option<u8>,
    /// Context use (percent) at which estimates become conservative. Default 90.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2, max = 99))]
    pub high_risk_percent: Option<u8>,
    /// Context use (percent) at which high-volume operations are blocked. Default 95.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 3, max = 100))]
    pub critical_percent: Option<u8>,
    /// Tokens kept free for the model's answer. Default 8192.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10_000_000))]
    pub reserved_completion_tokens: Option<u32>,
    /// Tokens kept free for request framing the tokenizer does not see. Default 512.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10_000_000))]
    pub protocol_overhead_tokens: Option<u32>,
    /// Extra tokens kept free against estimation error. Default 2048.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10_000_000))]
    pub safety_margin_tokens: Option<u32>,
    /// Per-section ceilings after the output reserve (`reservedCompletionTokens`, which also
    /// caps the client's max_tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stages: Option<StageBudgetsSpec>,
}

/// Spill and elision of tool results (seed 002 #5 and #6).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.previewChars) || !has(self.maxResultChars) || self.previewChars <= self.maxResultChars")
        .message("toolResults.previewChars must not exceed toolResults.maxResultChars: a preview is a part of the spilled result"),
    validation = Rule::new("!has(self.elideKeepChars) || !has(self.elideOverChars) || self.elideKeepChars < self.elideOverChars")
        .message("toolResults.elideKeepChars must be lower than toolResults.elideOverChars, or elision would not shorten anything"),
)]
pub struct ToolResultsSpec {
    /// Results longer than this many characters are spilled to the artifact store. Default 2000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 256, max = 10_000_000))]
    pub max_result_chars: Option<u32>,
    /// At most this many characters of a spilled result stay in the window. Default 250.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10_000_000))]
    pub preview_chars: Option<u32>,
    /// At most this many head lines of a spilled result stay in the window. Default 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100_000))]
    pub preview_lines: Option<u32>,
    /// Results older than this many rounds become candidates for elision. Default 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000))]
    pub elide_after_rounds: Option<u32>,
    /// Only results longer than this many characters are elided. Default 2000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10_000_000))]
    pub elide_over_chars: Option<u32>,
    /// An elided result keeps this many head characters plus a reference. Default 800.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10_000_000))]
    pub elide_keep_chars: Option<u32>,
}

/// How long entries of each class stay in the window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetentionSpec {
    /// Classification rules, merged across layers by name: a lower layer's rule with the same name
    /// replaces the higher one, and new names are added. The first matching rule classifies an entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub rules: Option<Vec<RetentionRule>>,
}

/// When and how history is compacted.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompactionSpec {
    /// Create a Budget CompactionJob when context use reaches triggerPercent. Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub automatic: Option<bool>,
    /// Context use (percent) that triggers automatic compaction. Default 85.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub trigger_percent: Option<u8>,
    /// Most recent entries kept verbatim after a compaction. Default 8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10_000))]
    pub keep_recent_entries: Option<u32>,
    /// Older journal generations kept for rollback. Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub retain_generations: Option<u32>,
    /// The model that writes summaries; without one, the extractive summariser is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summarizer: Option<SummarizerSpec>,
    /// CompactedState fields that must be non-empty whenever the source has signals for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub required_fields: Option<Vec<StateField>>,
}

/// The summariser model, and where it is reached (by default: the Agent's own provider, endpoint
/// and credentials).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.provider) || self.provider != 'OpenAICompatible' || has(self.endpoint)")
        .message("compaction.summarizer.endpoint is required when compaction.summarizer.provider is OpenAICompatible: set it to the server's base URL"),
)]
pub struct SummarizerSpec {
    /// Model name at the summariser's provider, e.g. gpt-4.1-mini. Empty means extractive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub model: Option<String>,
    /// Provider API of the summariser; default: each Agent's own provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<crate::agent::Provider>,
    /// Base URL of the summariser; default: the Agent's endpoint when the provider is the Agent's,
    /// else the provider's public endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://"))]
    pub endpoint: Option<String>,
    /// Secret key (in the Agent's namespace) holding the summariser's API key; default: the Agent's
    /// own credentials. Required when the provider differs from the Agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<crate::refs::LocalKeyRef>,
    /// Upper bound on the summary's length. Default 4096.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 256, max = 200_000))]
    pub max_summary_tokens: Option<u32>,
}

/// Cache behaviour.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheSpec {
    /// Identical tool-less requests are answered from a response cache for this long; 0 disables it. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86_400))]
    pub response_cache_ttl_seconds: Option<u32>,
    /// Where cache breakpoints go: Auto (the compiler places them) or None. Default Auto.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breakpoints: Option<BreakpointMode>,
    /// A purge or elision must save at least this fraction of the prompt to be worth a cache rewrite. Default 0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub purge_min_savings_ratio: Option<f64>,
}

/// Cache breakpoint placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum BreakpointMode {
    /// The compiler places breakpoints at tier boundaries.
    Auto,
    /// No breakpoints are sent.
    None,
}

/// Redaction of credentials before persistence.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedactionSpec {
    /// Redact known credential shapes (AWS keys, PEM keys, bearer tokens, API keys). Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Extra regular expressions whose matches are redacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub extra_patterns: Option<Vec<String>>,
}

/// Status reporting.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReportingSpec {
    /// Minimum seconds between status reports (a level change reports at once). Default 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 5, max = 3600))]
    pub interval_seconds: Option<u32>,
}

/// Lifecycle of the derived files on the agent's volume. The gateway's sweeper deletes what is past
/// its age or over its kind's bytes (oldest first), never anything the live generation, a kept
/// rollback target or a pending compaction references. Defaults fit a 1Gi volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.sweepIntervalSeconds) || !has(self.artifacts) || !has(self.artifacts.maxAgeSeconds) || self.artifacts.maxAgeSeconds >= self.sweepIntervalSeconds")
        .message("volume.artifacts.maxAgeSeconds must be at least volume.sweepIntervalSeconds: an artifact cannot expire between two sweeps; raise maxAgeSeconds or sweep more often"),
    validation = Rule::new("!has(self.sweepIntervalSeconds) || !has(self.generations) || !has(self.generations.maxAgeSeconds) || self.generations.maxAgeSeconds >= self.sweepIntervalSeconds")
        .message("volume.generations.maxAgeSeconds must be at least volume.sweepIntervalSeconds: a generation cannot expire between two sweeps; raise maxAgeSeconds or sweep more often"),
    validation = Rule::new("!has(self.sweepIntervalSeconds) || !has(self.compactionRecords) || !has(self.compactionRecords.maxAgeSeconds) || self.compactionRecords.maxAgeSeconds >= self.sweepIntervalSeconds")
        .message("volume.compactionRecords.maxAgeSeconds must be at least volume.sweepIntervalSeconds: a record cannot expire between two sweeps; raise maxAgeSeconds or sweep more often"),
)]
pub struct VolumeSpec {
    /// The artifact store: spilled tool outputs, elided, expired and deduplicated copies, and the
    /// archives of entries removed by compaction and purge. Age counts from when nothing kept
    /// references an artifact any more. Defaults: 7 days, 512 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<KeepLimitsSpec>,
    /// Superseded journal generations (rollback targets; `compaction.retainGenerations` is the most
    /// kept). Age counts from when a newer generation replaced one. Defaults: 7 days, 256 MiB
    /// (bytes include the live generation, which is never deleted: when it alone exceeds
    /// maxBytes, the sweep compacts it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generations: Option<KeepLimitsSpec>,
    /// Compaction records beside the journal. Defaults: 30 days, 16 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_records: Option<KeepLimitsSpec>,
    /// Seconds between sweeps. Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 86_400))]
    pub sweep_interval_seconds: Option<u32>,
}

/// How long one kind of derived file is kept, by age and by bytes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.maxAgeSeconds) || has(self.maxBytes)")
    .message("set maxAgeSeconds, maxBytes or both: an empty limit changes nothing"))]
pub struct KeepLimitsSpec {
    /// Seconds a file is kept once nothing needs it (1 minute to 1 year).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 31_536_000))]
    pub max_age_seconds: Option<u64>,
    /// Bytes this kind may take on the volume (1 MiB to 1 TiB); past it the oldest unneeded files go
    /// first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1_048_576, max = 1_099_511_627_776_u64))]
    pub max_bytes: Option<u64>,
}
