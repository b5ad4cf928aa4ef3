//! The engine's knobs: one value derived from the effective policy by the binary, the same for the
//! gateway, `strata compact` and `strata replay`.

use crate::budget::{BudgetPolicy, StageBudgets};
use crate::compaction::CompactionSettings;
use crate::compiler::BreakpointPlacement;
use crate::delegation::DelegationPolicy;
use crate::economics::CachePricing;
use crate::lifecycle::VolumeRetention;
use crate::prefix::StablePrefixSources;
use crate::redaction::Redactor;
use crate::retention::{Classifier, ExpiryPolicy};
use crate::tokens::TokenizerKind;
use crate::tool_output::{ElisionPolicy, SpillPolicy};

use super::capabilities::LazyToolsPolicy;
use super::turn::Api;

/// Everything the session engine needs to know about the agent's policy and model.
#[derive(Debug, Clone)]
pub struct SessionSettings {
    /// Distinguishes loaded versions of the settings (Tier 1 is rebuilt when it changes).
    pub revision: u64,
    /// The provider API the upstream speaks.
    pub api: Api,
    /// Tenant (the agent's namespace) for artifacts.
    pub tenant: String,
    /// Context limit in tokens.
    pub limit: u64,
    /// Budget thresholds and reservations.
    pub budget: BudgetPolicy,
    /// Spill thresholds.
    pub spill: SpillPolicy,
    /// Elision of old tool results.
    pub elision: ElisionPolicy,
    /// Whether a repeated tool output becomes a reference to the first (on in every policy;
    /// `strata replay --sweep` prices it off).
    pub deduplicate: bool,
    /// Batching of retention expiry.
    pub expiry: ExpiryPolicy,
    /// Redaction before persistence; `None` when disabled.
    pub redactor: Option<Redactor>,
    /// Retention classification.
    pub classifier: Classifier,
    /// Cache breakpoint placement.
    pub placement: BreakpointPlacement,
    /// Configured Tier-1 sources (the client's system text and tools are added per request).
    pub stable_prefix: StablePrefixSources,
    /// How a compaction runs.
    pub compaction: CompactionSettings,
    /// Whether the engine compacts on its own when the context reaches the trigger.
    pub automatic_compaction: bool,
    /// Context use (percent of the limit, reservations included) that triggers a compaction.
    pub compaction_trigger_percent: u8,
    /// The host runs a model summariser: Budget compactions at the trigger and the model's own
    /// compaction requests are asked of the host, which summarises off the engine
    /// ([`super::SessionEngine::take_compaction_ask`]); Emergency compactions stay extractive and
    /// in-process. Off, every compaction is extractive and in-process (and `strata replay`, which
    /// calls no model, prices that).
    pub model_summarizer: bool,
    /// Journal generations kept after a compaction.
    pub retain_generations: usize,
    /// The upstream model's tokenizer.
    pub tokenizer: TokenizerKind,
    /// How long derived files on the volume are kept (the artifact sweeper).
    pub volume: VolumeRetention,
    /// Delegation tools and their parent-return budget.
    pub delegation: DelegationPolicy,
    /// Lazy tool schemas (their threshold is the tools stage's ceiling).
    pub lazy_tools: LazyToolsPolicy,
    /// Per-section ceilings after the output reserve.
    pub stages: StageBudgets,
    /// The tenant's cache epoch: derived context made under another one is revoked and purged.
    pub cache_epoch: u64,
}

impl SessionSettings {
    /// The engine's built-in defaults for a model of `limit` tokens, without retention rules
    /// (tests); the binary derives the real settings, rules included, from the effective policy.
    pub fn defaults(api: Api, limit: u64) -> Self {
        SessionSettings {
            revision: 0,
            api,
            tenant: "replay".into(),
            limit,
            budget: BudgetPolicy::default(),
            spill: SpillPolicy::default(),
            elision: ElisionPolicy::default(),
            deduplicate: true,
            expiry: ExpiryPolicy::default(),
            redactor: Redactor::new(true, &[]).ok().flatten(),
            classifier: Classifier::default(),
            placement: BreakpointPlacement::Auto,
            stable_prefix: StablePrefixSources::default(),
            compaction: CompactionSettings::default(),
            automatic_compaction: true,
            compaction_trigger_percent: 85,
            model_summarizer: false,
            retain_generations: 3,
            tokenizer: TokenizerKind::O200kBase,
            volume: VolumeRetention::default(),
            delegation: DelegationPolicy::default(),
            lazy_tools: LazyToolsPolicy::default(),
            stages: StageBudgets::default(),
            cache_epoch: 0,
        }
    }

    /// Prefix-cache prices of the upstream provider.
    pub fn pricing(&self) -> CachePricing {
        match self.api {
            Api::Anthropic => CachePricing::ANTHROPIC,
            Api::OpenAi => CachePricing::OPENAI,
        }
    }

    /// Tokens reserved beside the prompt (completion, protocol overhead, safety margin).
    pub fn reserved_tokens(&self) -> u64 {
        self.budget.reserved_completion_tokens
            + self.budget.protocol_overhead_tokens
            + self.budget.safety_margin_tokens
    }

    /// New input this large (in tokens) counts as a high-volume operation: a result about the size
    /// of an unspilled tool output at the spill threshold (about 4 characters per token).
    pub fn high_volume_tokens(&self) -> u64 {
        (self.spill.max_result_chars as u64 / 4).max(1)
    }
}
