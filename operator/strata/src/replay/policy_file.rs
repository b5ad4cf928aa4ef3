//! `--policy FILE`: a ContextPolicy YAML, resolved over the built-in defaults into replay settings.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use strata_api::ContextPolicy;
use strata_api::effective::{PolicyInputs, resolve};
use strata_core::budget::BudgetPolicy;
use strata_core::replay::ReplayOptions;
use strata_core::retention::RetentionRule;

/// Read `path` and apply its effective policy to `options`.
pub fn apply(path: &Path, context_window: u64, options: &mut ReplayOptions) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading the policy {}", path.display()))?;
    let policy: ContextPolicy = serde_saphyr::from_str(&text).with_context(|| {
        format!(
            "{} is not a ContextPolicy (apiVersion strata.dev/v1alpha1, kind ContextPolicy)",
            path.display()
        )
    })?;
    let window = u32::try_from(context_window).unwrap_or(u32::MAX);
    let resolution = resolve(&PolicyInputs {
        namespace_labels: &BTreeMap::new(),
        cluster_policies: &[],
        context_policy: Some(&policy),
        agent_overrides: None,
        context_window: Some(window),
    })
    .with_context(|| format!("resolving the policy {}", path.display()))?;
    let effective = resolution.policy;
    let b = &effective.budget;
    options.budget = BudgetPolicy {
        warning_percent: b.warning_percent,
        high_risk_percent: b.high_risk_percent,
        critical_percent: b.critical_percent,
        reserved_completion_tokens: u64::from(b.reserved_completion_tokens),
        protocol_overhead_tokens: u64::from(b.protocol_overhead_tokens),
        safety_margin_tokens: u64::from(b.safety_margin_tokens),
    };
    let t = &effective.tool_results;
    let strata = &mut options.strata;
    strata.spill.max_result_chars = t.max_result_chars as usize;
    strata.spill.preview_chars = t.preview_chars as usize;
    strata.spill.preview_lines = t.preview_lines as usize;
    strata.elision.elide_after_rounds = t.elide_after_rounds as usize;
    strata.elision.elide_over_chars = t.elide_over_chars as usize;
    strata.elision.elide_keep_chars = t.elide_keep_chars as usize;
    // The API's and the engine's retention rules share one JSON shape.
    let rules = serde_json::to_value(&effective.retention.rules).context("encoding retention rules")?;
    strata.retention_rules = serde_json::from_value::<Vec<RetentionRule>>(rules)
        .context("reading the policy's retention rules")?;
    strata.compaction_trigger_percent = effective.compaction.trigger_percent;
    strata.compaction.keep_recent_entries = effective.compaction.keep_recent_entries as usize;
    strata.compaction.max_summary_tokens = u64::from(effective.compaction.summarizer.max_summary_tokens);
    strata.redaction = effective.redaction.enabled;
    Ok(())
}
