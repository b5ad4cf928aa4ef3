//! The API's effective policy turned into the context engine's knobs, in one place for the
//! gateway, `strata compact`, `strata replay` and the controller.

use strata_api::agent::{Provider, Tokenizer};
use strata_api::effective::{EffectiveBudget, EffectiveCompaction, EffectivePolicy, EffectiveToolResults};
use strata_api::policy::BreakpointMode;
use strata_core::budget::{BudgetError, BudgetPolicy, StageBudgets};
use strata_core::compaction::CompactionSettings;
use strata_core::compiler::BreakpointPlacement;
use strata_core::delegation::DelegationPolicy;
use strata_core::prefix::StablePrefixSources;
use strata_core::redaction::{PatternError, Redactor};
use strata_core::retention::{Classifier, ExpiryPolicy, RetentionRuleError};
use strata_core::session::capabilities::LazyToolsPolicy;
use strata_core::session::{Api, SessionSettings};
use strata_core::tokens::TokenizerKind;
use strata_core::tool_output::{ElisionPolicy, SpillPolicy};

/// An effective policy that does not translate to engine settings.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The budget does not fit the context window.
    #[error("policy.budget: {0}")]
    Budget(#[source] BudgetError),
    /// A redaction pattern does not compile.
    #[error("policy.redaction.extraPatterns: {0}")]
    Redaction(#[source] PatternError),
    /// A retention rule does not compile.
    #[error("policy.retention: {0}")]
    Retention(#[source] RetentionRuleError),
}

/// The provider API an upstream speaks.
pub fn api_of(provider: Provider) -> Api {
    match provider {
        Provider::Anthropic => Api::Anthropic,
        Provider::OpenAI | Provider::OpenAICompatible => Api::OpenAi,
    }
}

/// The session engine's settings for an agent (no configured Tier-1 sources; revision 0).
pub fn session_settings(
    policy: &EffectivePolicy,
    provider: Provider,
    context_window: u32,
    tokenizer: Tokenizer,
    tenant: &str,
    privacy_scope: &str,
) -> Result<SessionSettings, PolicyError> {
    let budget = budget_policy(&policy.budget);
    let limit = u64::from(context_window);
    budget.validate(limit).map_err(PolicyError::Budget)?;
    let redactor = Redactor::new(policy.redaction.enabled, &policy.redaction.extra_patterns)
        .map_err(PolicyError::Redaction)?;
    let classifier = Classifier::new(policy.retention.rules.clone()).map_err(PolicyError::Retention)?;
    let placement = match policy.cache.breakpoints {
        BreakpointMode::Auto => BreakpointPlacement::Auto,
        BreakpointMode::None => BreakpointPlacement::Off,
    };
    Ok(SessionSettings {
        revision: 0,
        api: api_of(provider),
        tenant: tenant.to_owned(),
        limit,
        budget,
        spill: spill_policy(&policy.tool_results),
        elision: elision_policy(&policy.tool_results),
        deduplicate: true,
        expiry: ExpiryPolicy::default(),
        redactor,
        classifier,
        placement,
        stable_prefix: StablePrefixSources::default(),
        compaction: compaction_settings(&policy.compaction, privacy_scope),
        automatic_compaction: policy.compaction.automatic,
        compaction_trigger_percent: policy.compaction.trigger_percent,
        model_summarizer: policy.compaction.summarizer.model.is_some(),
        retain_generations: policy.compaction.retain_generations as usize,
        tokenizer: tokenizer_kind(tokenizer),
        volume: policy.volume,
        delegation: DelegationPolicy {
            tools: policy.delegation.tools.clone(),
            return_tokens: u64::from(policy.delegation.return_tokens),
        },
        lazy_tools: lazy_tools_policy(policy),
        stages: stage_budgets(&policy.budget),
        cache_epoch: 0,
    })
}

/// Lazy tool schemas: the tools stage's ceiling is the threshold.
pub fn lazy_tools_policy(policy: &EffectivePolicy) -> LazyToolsPolicy {
    LazyToolsPolicy {
        threshold_tokens: u64::from(policy.budget.stages.tools_tokens),
        full_schema_tools: policy.capabilities.full_schema_tools as usize,
        batch_tools: policy.capabilities.batch_tools as usize,
    }
}

/// The per-section ceilings (the tools ceiling travels as the lazy-schema threshold).
pub fn stage_budgets(budget: &EffectiveBudget) -> StageBudgets {
    StageBudgets {
        system_tokens: u64::from(budget.stages.system_tokens),
        memory_tokens: u64::from(budget.stages.memory_tokens),
        tool_results_tokens: u64::from(budget.stages.tool_results_tokens),
        history_tokens: u64::from(budget.stages.history_tokens),
    }
}

/// The core tokenizer matching the API's.
pub fn tokenizer_kind(tokenizer: Tokenizer) -> TokenizerKind {
    match tokenizer {
        Tokenizer::O200kBase => TokenizerKind::O200kBase,
        Tokenizer::Cl100kBase => TokenizerKind::Cl100kBase,
        Tokenizer::Approximate => TokenizerKind::Approximate,
    }
}

/// Thresholds and reservations.
pub fn budget_policy(budget: &EffectiveBudget) -> BudgetPolicy {
    BudgetPolicy {
        warning_percent: budget.warning_percent,
        high_risk_percent: budget.high_risk_percent,
        critical_percent: budget.critical_percent,
        reserved_completion_tokens: u64::from(budget.reserved_completion_tokens),
        protocol_overhead_tokens: u64::from(budget.protocol_overhead_tokens),
        safety_margin_tokens: u64::from(budget.safety_margin_tokens),
    }
}

/// When tool results are spilled, and how much of them stays in the window.
pub fn spill_policy(tool_results: &EffectiveToolResults) -> SpillPolicy {
    SpillPolicy {
        max_result_chars: tool_results.max_result_chars as usize,
        preview_chars: tool_results.preview_chars as usize,
        preview_lines: tool_results.preview_lines as usize,
    }
}

/// When old tool results are elided (the batching ratio keeps the engine's default).
pub fn elision_policy(tool_results: &EffectiveToolResults) -> ElisionPolicy {
    ElisionPolicy {
        elide_after_rounds: tool_results.elide_after_rounds as usize,
        elide_over_chars: tool_results.elide_over_chars as usize,
        elide_keep_chars: tool_results.elide_keep_chars as usize,
        ..ElisionPolicy::default()
    }
}

/// Compaction settings for an agent of `privacy_scope`.
pub fn compaction_settings(compaction: &EffectiveCompaction, privacy_scope: &str) -> CompactionSettings {
    CompactionSettings {
        keep_recent_entries: compaction.keep_recent_entries as usize,
        required_fields: compaction.required_fields.clone(),
        privacy_scope: privacy_scope.to_owned(),
        max_summary_tokens: u64::from(compaction.summarizer.max_summary_tokens),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use strata_api::effective::EffectivePolicy;

    use super::*;

    #[test]
    fn defaults_translate_to_the_engines_defaults() {
        let policy = EffectivePolicy::default();
        assert_eq!(budget_policy(&policy.budget), BudgetPolicy::default());
        assert_eq!(spill_policy(&policy.tool_results), SpillPolicy::default());
        assert_eq!(elision_policy(&policy.tool_results), ElisionPolicy::default());
        assert!(Classifier::new(policy.retention.rules.clone()).is_ok());
        let settings = compaction_settings(&policy.compaction, "tenant");
        assert_eq!(settings.required_fields.len(), policy.compaction.required_fields.len());
        assert_eq!(settings.keep_recent_entries, 8);
        assert_eq!(lazy_tools_policy(&policy), LazyToolsPolicy::default());
        assert_eq!(stage_budgets(&policy.budget), StageBudgets::default());
        let session =
            session_settings(&policy, Provider::OpenAI, 100_000, Tokenizer::O200kBase, "ns", "t").unwrap();
        assert_eq!(session.delegation, DelegationPolicy::default());
    }

    #[test]
    fn session_settings_follow_the_policy_and_the_provider() {
        let mut policy = EffectivePolicy::default();
        policy.compaction.automatic = false;
        policy.compaction.trigger_percent = 70;
        let settings =
            session_settings(&policy, Provider::Anthropic, 100_000, Tokenizer::Cl100kBase, "ns", "tenant")
                .unwrap();
        assert_eq!(settings.api, Api::Anthropic);
        assert_eq!(settings.limit, 100_000);
        assert!(!settings.automatic_compaction);
        assert_eq!(settings.compaction_trigger_percent, 70);
        assert_eq!(settings.tokenizer, TokenizerKind::Cl100kBase);
        assert_eq!(settings.tenant, "ns");
        assert_eq!(settings.compaction.privacy_scope, "tenant");
        let openai =
            session_settings(&policy, Provider::OpenAICompatible, 100_000, Tokenizer::O200kBase, "ns", "t")
                .unwrap();
        assert_eq!(openai.api, Api::OpenAi);
        policy.redaction.extra_patterns = vec!["(".into()];
        let error = session_settings(&policy, Provider::OpenAI, 100_000, Tokenizer::O200kBase, "ns", "t")
            .unwrap_err();
        assert!(matches!(error, PolicyError::Redaction(_)), "{error}");
    }
}
