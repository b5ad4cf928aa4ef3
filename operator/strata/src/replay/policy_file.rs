//! `--policy FILE`: a ContextPolicy YAML, resolved over the built-in defaults into replay settings.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use strata_api::ContextPolicy;
use strata_api::effective::{PolicyInputs, resolve};
use strata_core::replay::ReplayOptions;

use crate::engine_policy;

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
    options.budget = engine_policy::budget_policy(&effective.budget);
    let strata = &mut options.strata;
    strata.spill = engine_policy::spill_policy(&effective.tool_results);
    strata.elision = engine_policy::elision_policy(&effective.tool_results);
    strata.retention_rules = engine_policy::retention_rules(&effective.retention)
        .context("reading the policy's retention rules")?;
    strata.automatic_compaction = effective.compaction.automatic;
    strata.compaction_trigger_percent = effective.compaction.trigger_percent;
    strata.compaction.keep_recent_entries = effective.compaction.keep_recent_entries as usize;
    strata.compaction.max_summary_tokens = u64::from(effective.compaction.summarizer.max_summary_tokens);
    strata.redaction = effective.redaction.enabled;
    Ok(())
}
