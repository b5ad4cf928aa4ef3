//! The API's effective policy turned into the context engine's knobs, in one place for the
//! gateway, `strata compact`, `strata replay` and the controller.

use strata_api::agent::Tokenizer;
use strata_api::effective::{EffectiveBudget, EffectiveCompaction, EffectiveRetention, EffectiveToolResults};
use strata_core::budget::BudgetPolicy;
use strata_core::compaction::{CompactionSettings, StateField};
use strata_core::retention::RetentionRule;
use strata_core::tokens::TokenizerKind;
use strata_core::tool_output::{ElisionPolicy, SpillPolicy};

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

/// The retention rules; the API's and the engine's share one JSON shape.
pub fn retention_rules(retention: &EffectiveRetention) -> Result<Vec<RetentionRule>, serde_json::Error> {
    serde_json::from_value(serde_json::to_value(&retention.rules)?)
}

/// The fields a compaction must fill; the API's and the engine's names share one JSON shape.
pub fn required_fields(compaction: &EffectiveCompaction) -> Result<Vec<StateField>, serde_json::Error> {
    serde_json::from_value(serde_json::to_value(&compaction.required_fields)?)
}

/// Compaction settings for an agent of `privacy_scope`.
pub fn compaction_settings(
    compaction: &EffectiveCompaction,
    privacy_scope: &str,
) -> Result<CompactionSettings, serde_json::Error> {
    Ok(CompactionSettings {
        keep_recent_entries: compaction.keep_recent_entries as usize,
        required_fields: required_fields(compaction)?,
        privacy_scope: privacy_scope.to_owned(),
        max_summary_tokens: u64::from(compaction.summarizer.max_summary_tokens),
    })
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
        assert_eq!(retention_rules(&policy.retention).unwrap().len(), policy.retention.rules.len());
        let settings = compaction_settings(&policy.compaction, "tenant").unwrap();
        assert_eq!(settings.required_fields.len(), policy.compaction.required_fields.len());
        assert_eq!(settings.keep_recent_entries, 8);
    }
}
