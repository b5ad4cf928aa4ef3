//! The strata policy's engine settings: a ContextPolicy YAML (`--policy`) or the built-in
//! defaults, resolved into the effective policy and translated exactly as the gateway does.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use strata_api::ContextPolicy;
use strata_api::agent::{Provider as UpstreamProvider, Tokenizer};
use strata_api::effective::{EffectivePolicy, PolicyInputs, resolve};
use strata_core::replay::Provider;
use strata_core::retention::RetentionRule;
use strata_core::session::SessionSettings;

use crate::engine_policy;

/// Tenant of replay artifacts.
const REPLAY_TENANT: &str = "replay";

/// The engine settings for `provider` and `context_window` under the policy at `path` (the
/// built-in defaults without one).
pub fn session_settings(
    path: Option<&Path>,
    provider: Provider,
    context_window: u64,
) -> anyhow::Result<SessionSettings> {
    let window = u32::try_from(context_window).unwrap_or(u32::MAX);
    let effective = effective_policy(path, window)?;
    let upstream = match provider {
        Provider::Anthropic => UpstreamProvider::Anthropic,
        Provider::OpenAi => UpstreamProvider::OpenAI,
    };
    let settings = engine_policy::session_settings(
        &effective,
        upstream,
        window,
        Tokenizer::O200kBase,
        REPLAY_TENANT,
        REPLAY_TENANT,
    )
    .context("translating the policy into engine settings")?;
    // Replay calls no model: every compaction is priced as the extractive one, in-process.
    Ok(SessionSettings { model_summarizer: false, ..settings })
}

/// The retention rules of the policy at `path` (the built-in defaults' without one), in match order.
pub fn retention_rules(path: Option<&Path>, context_window: u64) -> anyhow::Result<Vec<RetentionRule>> {
    let window = u32::try_from(context_window).unwrap_or(u32::MAX);
    Ok(effective_policy(path, window)?.retention.rules)
}

fn effective_policy(path: Option<&Path>, window: u32) -> anyhow::Result<EffectivePolicy> {
    match path {
        Some(path) => read_policy(path, window),
        None => Ok(EffectivePolicy::default()),
    }
}

fn read_policy(path: &Path, window: u32) -> anyhow::Result<EffectivePolicy> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading the policy {}", path.display()))?;
    let policy: ContextPolicy = serde_saphyr::from_str(&text).with_context(|| {
        format!(
            "{} is not a ContextPolicy (apiVersion strata.dev/v1alpha1, kind ContextPolicy)",
            path.display()
        )
    })?;
    let resolution = resolve(&PolicyInputs {
        namespace_labels: &BTreeMap::new(),
        cluster_policies: &[],
        context_policy: Some(&policy),
        agent_overrides: None,
        context_window: Some(window),
    })
    .with_context(|| format!("resolving the policy {}", path.display()))?;
    Ok(resolution.policy)
}
