//! Effective-policy resolution: defaults, cluster policies, the namespace policy and agent overrides,
//! merged in that order, then platform locks, bounds and threshold ordering applied.
//!
//! The merge works on policy *fields* (see [`PolicyField`]): each layer sets the fields it names and
//! leaves the rest alone, so every field has exactly one provenance. Retention rules merge by name.
//! Locks fix a field to the value the cluster layers produced; bounds clamp a numeric field into the
//! intersection of every matching cluster policy's range; finally thresholds are pulled into order
//! (a lower threshold is lowered, never a higher one raised, so repairs only ever tighten).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::cluster_policy::ClusterContextPolicy;
use crate::context_policy::ContextPolicy;
use crate::fields::{NumericField, PolicyField};
use crate::policy::{BreakpointMode, PolicySpec, RetentionClass, RetentionMatch, RetentionRule, StateField};
use crate::selector::{SelectorError, selector_matches};
use strata_core::lifecycle::VolumeRetention;

/// The fully resolved policy: every field has a value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectivePolicy {
    /// Budget thresholds and reservations.
    pub budget: EffectiveBudget,
    /// Spill and elision.
    pub tool_results: EffectiveToolResults,
    /// Retention rules.
    pub retention: EffectiveRetention,
    /// Compaction.
    pub compaction: EffectiveCompaction,
    /// Caching.
    pub cache: EffectiveCache,
    /// Redaction.
    pub redaction: EffectiveRedaction,
    /// Reporting.
    pub reporting: EffectiveReporting,
    /// Lifecycle of the derived files on the volume (absent in older files: the defaults).
    #[serde(default)]
    pub volume: VolumeRetention,
    /// Lazy tool schemas (absent in older files: the defaults).
    #[serde(default)]
    pub capabilities: EffectiveCapabilities,
    /// Delegation digests (absent in older files: the defaults).
    #[serde(default)]
    pub delegation: EffectiveDelegation,
}

/// Resolved stage budgets (0: no ceiling of its own).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveStages {
    /// System prompt ceiling.
    pub system_tokens: u32,
    /// Tool-schema ceiling: the lazy-schema threshold (0: schemas always in full).
    pub tools_tokens: u32,
    /// Summaries ceiling.
    pub memory_tokens: u32,
    /// Tool-results ceiling.
    pub tool_results_tokens: u32,
    /// History ceiling.
    pub history_tokens: u32,
}

impl Default for EffectiveStages {
    fn default() -> Self {
        EffectiveStages {
            system_tokens: 0,
            tools_tokens: 8_000,
            memory_tokens: 0,
            tool_results_tokens: 0,
            history_tokens: 0,
        }
    }
}

/// Resolved lazy-schema selection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveCapabilities {
    /// Tools ranked into full schemas up front.
    pub full_schema_tools: u32,
    /// Smallest batch a new request loads.
    pub batch_tools: u32,
}

impl Default for EffectiveCapabilities {
    fn default() -> Self {
        EffectiveCapabilities { full_schema_tools: 6, batch_tools: 3 }
    }
}

/// Resolved delegation digests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveDelegation {
    /// Delegation tool names.
    pub tools: Vec<String>,
    /// Parent-return budget in tokens.
    pub return_tokens: u32,
}

impl Default for EffectiveDelegation {
    fn default() -> Self {
        EffectiveDelegation {
            tools: vec!["Task".into(), "task".into(), "delegate_task".into()],
            return_tokens: 2_000,
        }
    }
}

/// Resolved budget.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveBudget {
    /// Warning threshold, percent.
    pub warning_percent: u8,
    /// High-risk threshold, percent.
    pub high_risk_percent: u8,
    /// Critical threshold, percent.
    pub critical_percent: u8,
    /// Tokens reserved for the completion.
    pub reserved_completion_tokens: u32,
    /// Tokens reserved for protocol framing.
    pub protocol_overhead_tokens: u32,
    /// Safety margin tokens.
    pub safety_margin_tokens: u32,
    /// Per-section ceilings after the output reserve (absent in older files: the defaults).
    #[serde(default)]
    pub stages: EffectiveStages,
}

/// Resolved tool-result handling.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveToolResults {
    /// Spill threshold, characters.
    pub max_result_chars: u32,
    /// Preview size, characters.
    pub preview_chars: u32,
    /// Preview size, lines.
    pub preview_lines: u32,
    /// Rounds before elision.
    pub elide_after_rounds: u32,
    /// Elision threshold, characters.
    pub elide_over_chars: u32,
    /// Characters kept when eliding.
    pub elide_keep_chars: u32,
}

/// Resolved retention.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveRetention {
    /// Rules in match order.
    pub rules: Vec<RetentionRule>,
}

/// Resolved compaction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveCompaction {
    /// Budget-triggered compaction on or off.
    pub automatic: bool,
    /// Trigger, percent.
    pub trigger_percent: u8,
    /// Recent entries kept verbatim.
    pub keep_recent_entries: u32,
    /// Generations retained for rollback.
    pub retain_generations: u32,
    /// Summariser.
    pub summarizer: EffectiveSummarizer,
    /// Fields that must be non-empty when the source has signals.
    pub required_fields: Vec<StateField>,
}

/// Resolved summariser.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveSummarizer {
    /// Model; `None` means the extractive summariser.
    pub model: Option<String>,
    /// Summary size bound.
    pub max_summary_tokens: u32,
    /// Provider; `None` means the Agent's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<crate::agent::Provider>,
    /// Base URL; `None` means the Agent's (same provider) or the provider's public endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// API key Secret; `None` means the Agent's own credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<crate::refs::LocalKeyRef>,
}

/// Resolved caching.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveCache {
    /// Response-cache TTL; 0 disables.
    pub response_cache_ttl_seconds: u32,
    /// Breakpoint placement.
    pub breakpoints: BreakpointMode,
    /// Minimum savings ratio for a cache-busting rewrite.
    pub purge_min_savings_ratio: f64,
}

/// Resolved redaction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveRedaction {
    /// On or off.
    pub enabled: bool,
    /// Extra patterns.
    pub extra_patterns: Vec<String>,
}

/// Resolved reporting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveReporting {
    /// Seconds between reports.
    pub interval_seconds: u32,
}

impl Default for EffectivePolicy {
    /// The built-in defaults, from seeds 000 and 002.
    fn default() -> Self {
        EffectivePolicy {
            budget: EffectiveBudget {
                warning_percent: 80,
                high_risk_percent: 90,
                critical_percent: 95,
                reserved_completion_tokens: 8192,
                protocol_overhead_tokens: 512,
                safety_margin_tokens: 2048,
                stages: EffectiveStages::default(),
            },
            tool_results: EffectiveToolResults {
                max_result_chars: 2000,
                preview_chars: 250,
                preview_lines: 60,
                elide_after_rounds: 4,
                elide_over_chars: 2000,
                elide_keep_chars: 800,
            },
            retention: EffectiveRetention {
                rules: vec![RetentionRule {
                    name: "heartbeats".into(),
                    class: RetentionClass::Ephemeral,
                    matcher: RetentionMatch {
                        roles: None,
                        tool_names: None,
                        content_regex: Some(r"(?i)^\s*(heartbeat|HEARTBEAT_OK|status check|ping)\b".into()),
                    },
                    ttl_seconds: Some(3600),
                }],
            },
            compaction: EffectiveCompaction {
                automatic: true,
                trigger_percent: 85,
                keep_recent_entries: 8,
                retain_generations: 3,
                summarizer: EffectiveSummarizer {
                    model: None,
                    max_summary_tokens: 4096,
                    provider: None,
                    endpoint: None,
                    credentials_secret_ref: None,
                },
                required_fields: vec![
                    StateField::ActiveObjective,
                    StateField::HardConstraints,
                    StateField::Decisions,
                    StateField::OpenQuestions,
                    StateField::ToolState,
                ],
            },
            cache: EffectiveCache {
                response_cache_ttl_seconds: 0,
                breakpoints: BreakpointMode::Auto,
                purge_min_savings_ratio: 0.1,
            },
            redaction: EffectiveRedaction { enabled: true, extra_patterns: Vec::new() },
            reporting: EffectiveReporting { interval_seconds: 30 },
            volume: VolumeRetention::default(),
            capabilities: EffectiveCapabilities::default(),
            delegation: EffectiveDelegation::default(),
        }
    }
}

/// Which object set a field.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// `Default`, `ClusterContextPolicy`, `ContextPolicy` or `Agent`.
    pub kind: String,
    /// Object name (`builtin` for defaults).
    pub name: String,
}

impl Source {
    fn new(kind: &str, name: &str) -> Self {
        Source { kind: kind.into(), name: name.into() }
    }
    /// The built-in defaults.
    pub fn builtin() -> Self {
        Source::new("Default", "builtin")
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

/// Why a value was changed after merging.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum ClampReason {
    /// A platform lock fixed the value.
    Locked,
    /// A platform bound clamped the value into range.
    Bound,
    /// A threshold was lowered to keep warning < highRisk < critical (or a preview within its limit).
    Ordering,
}

/// One value a lock, bound or ordering repair changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Clamp {
    /// The field's path.
    pub field: String,
    /// The merged value, as JSON.
    pub requested: String,
    /// The value applied, as JSON.
    pub applied: String,
    /// Why.
    pub reason: ClampReason,
    /// The object whose lock or bound applied (for Ordering, the object that set the higher threshold).
    pub by: String,
}

/// Everything resolution needs, already fetched.
#[derive(Clone, Copy, Debug)]
pub struct PolicyInputs<'a> {
    /// Labels of the agent's namespace, for cluster-policy selectors.
    pub namespace_labels: &'a BTreeMap<String, String>,
    /// Every ClusterContextPolicy; non-matching ones are skipped.
    pub cluster_policies: &'a [ClusterContextPolicy],
    /// The namespace's ContextPolicy, if any.
    pub context_policy: Option<&'a ContextPolicy>,
    /// The agent's name and overrides, if any.
    pub agent_overrides: Option<(&'a str, &'a PolicySpec)>,
    /// The model's context window, to check that reservations leave room.
    pub context_window: Option<u32>,
}

/// The result of resolution.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolution {
    /// The effective policy.
    pub policy: EffectivePolicy,
    /// Field path → the object that set it (retention rules as `retention.rules[name]`).
    pub provenance: BTreeMap<String, Source>,
    /// Contributing objects in merge order.
    pub sources: Vec<Source>,
    /// Values changed by locks, bounds and ordering.
    pub clamps: Vec<Clamp>,
    /// Non-fatal problems, e.g. conflicting bounds or an invalid selector.
    pub warnings: Vec<String>,
    /// sha256 (hex) of the effective policy's JSON.
    pub hash: String,
}

/// A policy that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PolicyError {
    /// The reservations leave no room for context.
    #[error(
        "budget reservations ({reserved} tokens: reservedCompletionTokens + protocolOverheadTokens + safetyMarginTokens) \
         must be less than the context window ({window}); lower them in the Agent's overrides or its ContextPolicy"
    )]
    ReservationsExceedWindow {
        /// Sum of the reservations.
        reserved: u64,
        /// The context window.
        window: u32,
    },
    /// A merged layer produced a value of the wrong type (only possible with hand-built specs).
    #[error("policy field {field} set by {source_object} has an invalid value: {message}")]
    InvalidValue {
        /// Field path.
        field: String,
        /// Object that set it.
        source_object: String,
        /// What was wrong.
        message: String,
    },
}

/// One layer of the merge.
struct Layer<'a> {
    source: Source,
    spec: &'a PolicySpec,
}

/// Resolve the effective policy for one agent.
pub fn resolve(inputs: &PolicyInputs<'_>) -> Result<Resolution, PolicyError> {
    let mut warnings = Vec::new();
    let matching = matching_cluster_policies(inputs, &mut warnings);

    let defaults = EffectivePolicy::default();
    let mut state = MergeState::from_defaults(&defaults)?;

    for policy in &matching {
        state.apply(&Layer { source: cluster_source(policy), spec: &policy.spec.policy })?;
    }
    let platform_values = state.values.clone();
    let platform_provenance = state.provenance.clone();

    if let Some(policy) = inputs.context_policy {
        let name = policy.metadata.name.as_deref().unwrap_or("default");
        state.apply(&Layer { source: Source::new("ContextPolicy", name), spec: &policy.spec.policy })?;
    }
    if let Some((name, overrides)) = inputs.agent_overrides {
        state.apply(&Layer { source: Source::new("Agent", name), spec: overrides })?;
    }

    state.apply_locks(&matching, &platform_values, &platform_provenance);
    let bounds = intersect_bounds(&matching, &mut warnings);
    state.apply_bounds(&bounds);
    state.repair_ordering(&bounds, &mut warnings);

    let policy = state.build()?;
    check_reservations(&policy, inputs.context_window)?;
    let hash = policy_hash(&policy);
    Ok(Resolution {
        policy,
        provenance: state.provenance,
        sources: state.sources,
        clamps: state.clamps,
        warnings,
        hash,
    })
}

/// sha256 (hex) of a policy's canonical JSON (struct fields serialize in a fixed order).
pub fn policy_hash(policy: &EffectivePolicy) -> String {
    let bytes = serde_json::to_vec(policy).unwrap_or_default();
    hex::encode(Sha256::digest(&bytes))
}

fn cluster_source(policy: &ClusterContextPolicy) -> Source {
    Source::new("ClusterContextPolicy", policy.metadata.name.as_deref().unwrap_or(""))
}

/// Cluster policies whose selector matches, in merge order: ascending priority, then name.
fn matching_cluster_policies<'a>(
    inputs: &PolicyInputs<'a>,
    warnings: &mut Vec<String>,
) -> Vec<&'a ClusterContextPolicy> {
    let mut matching: Vec<&ClusterContextPolicy> = Vec::new();
    for policy in inputs.cluster_policies {
        match policy.spec.namespace_selector.as_ref() {
            None => matching.push(policy),
            Some(selector) => match selector_matches(selector, inputs.namespace_labels) {
                Ok(true) => matching.push(policy),
                Ok(false) => {}
                Err(SelectorError(message)) => warnings.push(format!(
                    "{} is skipped: its namespaceSelector is invalid: {message}",
                    cluster_source(policy)
                )),
            },
        }
    }
    matching.sort_by(|a, b| {
        (a.spec.priority.unwrap_or(0), a.metadata.name.as_deref())
            .cmp(&(b.spec.priority.unwrap_or(0), b.metadata.name.as_deref()))
    });
    matching
}

/// A numeric range, with the object that set each end.
#[derive(Clone, Debug)]
struct Bound {
    min: Option<(f64, Source)>,
    max: Option<(f64, Source)>,
}

/// Intersect the bounds of all matching cluster policies (they arrive in ascending priority).
fn intersect_bounds(
    matching: &[&ClusterContextPolicy],
    warnings: &mut Vec<String>,
) -> BTreeMap<NumericField, Bound> {
    let mut bounds: BTreeMap<NumericField, Bound> = BTreeMap::new();
    for policy in matching {
        let source = cluster_source(policy);
        for bound in policy.spec.bounds.iter().flatten() {
            let entry = bounds.entry(bound.field).or_insert(Bound { min: None, max: None });
            let mut candidate = entry.clone();
            if let Some(min) = bound.min
                && candidate.min.as_ref().is_none_or(|(m, _)| min > *m)
            {
                candidate.min = Some((min, source.clone()));
            }
            if let Some(max) = bound.max
                && candidate.max.as_ref().is_none_or(|(m, _)| max < *m)
            {
                candidate.max = Some((max, source.clone()));
            }
            if let (Some((min, _)), Some((max, _))) = (&candidate.min, &candidate.max)
                && min > max
            {
                warnings.push(format!(
                    "bounds on {} conflict (min {min} > max {max}); {source} has the higher priority and its bound alone applies",
                    bound.field
                ));
                candidate = Bound {
                    min: bound.min.map(|v| (v, source.clone())),
                    max: bound.max.map(|v| (v, source.clone())),
                };
            }
            *entry = candidate;
        }
    }
    bounds
}

fn check_reservations(policy: &EffectivePolicy, window: Option<u32>) -> Result<(), PolicyError> {
    let Some(window) = window else { return Ok(()) };
    let budget = &policy.budget;
    let reserved = u64::from(budget.reserved_completion_tokens)
        + u64::from(budget.protocol_overhead_tokens)
        + u64::from(budget.safety_margin_tokens);
    if reserved >= u64::from(window) {
        return Err(PolicyError::ReservationsExceedWindow { reserved, window });
    }
    Ok(())
}

/// The merge in progress: field values as JSON, with provenance.
struct MergeState {
    values: BTreeMap<PolicyField, Value>,
    provenance: BTreeMap<String, Source>,
    sources: Vec<Source>,
    clamps: Vec<Clamp>,
}

impl MergeState {
    fn from_defaults(defaults: &EffectivePolicy) -> Result<Self, PolicyError> {
        let json = serde_json::to_value(defaults).map_err(|e| invalid("*", &Source::builtin(), e))?;
        let mut values = BTreeMap::new();
        let mut provenance = BTreeMap::new();
        for field in PolicyField::ALL {
            let value = lookup(&json, field.path()).cloned().unwrap_or(Value::Null);
            provenance.insert(field.path().to_string(), Source::builtin());
            values.insert(*field, value);
        }
        let mut state =
            MergeState { values, provenance, sources: vec![Source::builtin()], clamps: Vec::new() };
        state.record_rule_provenance(&Source::builtin());
        Ok(state)
    }

    fn record_rule_provenance(&mut self, source: &Source) {
        for name in rule_names(self.values.get(&PolicyField::RetentionRules)) {
            self.provenance.insert(format!("retention.rules[{name}]"), source.clone());
        }
    }

    fn apply(&mut self, layer: &Layer<'_>) -> Result<(), PolicyError> {
        let json = serde_json::to_value(layer.spec).map_err(|e| invalid("*", &layer.source, e))?;
        let mut touched = false;
        for field in PolicyField::ALL {
            let Some(value) = lookup(&json, field.path()).filter(|v| !v.is_null()) else { continue };
            touched = true;
            if *field == PolicyField::RetentionRules {
                let merged = merge_rules(self.values.get(field), value);
                for name in rule_names(Some(value)) {
                    self.provenance.insert(format!("retention.rules[{name}]"), layer.source.clone());
                }
                self.values.insert(*field, merged);
            } else {
                self.values.insert(*field, value.clone());
            }
            self.provenance.insert(field.path().to_string(), layer.source.clone());
        }
        if touched {
            self.sources.push(layer.source.clone());
        }
        Ok(())
    }

    /// Fix every locked field to the value the platform (defaults + cluster policies) produced.
    fn apply_locks(
        &mut self,
        matching: &[&ClusterContextPolicy],
        platform_values: &BTreeMap<PolicyField, Value>,
        platform_provenance: &BTreeMap<String, Source>,
    ) {
        for policy in matching {
            let locker = cluster_source(policy);
            for field in policy.spec.locks.iter().flatten() {
                let locked = platform_values.get(field).cloned().unwrap_or(Value::Null);
                let current = self.values.get(field).cloned().unwrap_or(Value::Null);
                if current != locked {
                    self.clamps.push(Clamp {
                        field: field.path().into(),
                        requested: current.to_string(),
                        applied: locked.to_string(),
                        reason: ClampReason::Locked,
                        by: locker.to_string(),
                    });
                    self.values.insert(*field, locked);
                    let origin =
                        platform_provenance.get(field.path()).cloned().unwrap_or_else(|| locker.clone());
                    self.provenance.insert(field.path().into(), origin);
                    if *field == PolicyField::RetentionRules {
                        self.provenance.retain(|k, _| !k.starts_with("retention.rules["));
                        for (k, v) in
                            platform_provenance.iter().filter(|(k, _)| k.starts_with("retention.rules["))
                        {
                            self.provenance.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
        }
    }

    fn number(&self, field: NumericField) -> Option<f64> {
        self.values.get(&field.as_policy_field()).and_then(Value::as_f64)
    }

    fn set_number(&mut self, field: NumericField, value: f64, reason: ClampReason, by: &Source) {
        let key = field.as_policy_field();
        let requested = self.values.get(&key).cloned().unwrap_or(Value::Null);
        let applied = if field == NumericField::PurgeMinSavingsRatio {
            serde_json::Number::from_f64(value).map(Value::Number).unwrap_or(Value::Null)
        } else {
            Value::from(value.max(0.0).round() as u64)
        };
        if requested == applied {
            return;
        }
        self.clamps.push(Clamp {
            field: field.path().into(),
            requested: requested.to_string(),
            applied: applied.to_string(),
            reason,
            by: by.to_string(),
        });
        self.values.insert(key, applied);
        self.provenance.insert(field.path().into(), by.clone());
    }

    fn apply_bounds(&mut self, bounds: &BTreeMap<NumericField, Bound>) {
        for (field, bound) in bounds {
            let Some(value) = self.number(*field) else { continue };
            if let Some((min, by)) = &bound.min
                && value < *min
            {
                let min = if *field == NumericField::PurgeMinSavingsRatio { *min } else { min.ceil() };
                self.set_number(*field, min, ClampReason::Bound, by);
                continue;
            }
            if let Some((max, by)) = &bound.max
                && value > *max
            {
                let max = if *field == NumericField::PurgeMinSavingsRatio { *max } else { max.floor() };
                self.set_number(*field, max, ClampReason::Bound, by);
            }
        }
    }

    /// Keep warning < highRisk < critical ≤ 100, previewChars ≤ maxResultChars and
    /// elideKeepChars < elideOverChars, by lowering the lower value.
    fn repair_ordering(&mut self, bounds: &BTreeMap<NumericField, Bound>, warnings: &mut Vec<String>) {
        use NumericField as F;
        // Floors that leave room for three distinct thresholds; only a platform bound can go below them.
        for (field, floor) in [(F::WarningPercent, 1.0), (F::HighRiskPercent, 2.0), (F::CriticalPercent, 3.0)]
        {
            if let Some(value) = self.number(field)
                && value < floor
            {
                let by = self.provenance.get(field.path()).cloned().unwrap_or_else(Source::builtin);
                self.set_number(field, floor, ClampReason::Ordering, &by);
                warnings.push(format!(
                    "{field} was raised to {floor}: three ordered thresholds need at least 1 < 2 < 3"
                ));
            }
        }
        if let Some(critical) = self.number(F::CriticalPercent)
            && critical > 100.0
        {
            let by = self.provenance.get(F::CriticalPercent.path()).cloned().unwrap_or_else(Source::builtin);
            self.set_number(F::CriticalPercent, 100.0, ClampReason::Ordering, &by);
        }
        let pairs = [
            (F::HighRiskPercent, F::CriticalPercent, 1.0),
            (F::WarningPercent, F::HighRiskPercent, 1.0),
            (F::PreviewChars, F::MaxResultChars, 0.0),
            (F::ElideKeepChars, F::ElideOverChars, 1.0),
        ];
        for (lower, upper, gap) in pairs {
            let (Some(low), Some(high)) = (self.number(lower), self.number(upper)) else { continue };
            if low + gap <= high {
                continue;
            }
            let by = self.provenance.get(upper.path()).cloned().unwrap_or_else(Source::builtin);
            let repaired = (high - gap).max(0.0);
            self.set_number(lower, repaired, ClampReason::Ordering, &by);
            if let Some((min, _)) = bounds.get(&lower).and_then(|b| b.min.as_ref())
                && repaired < *min
            {
                warnings.push(format!(
                    "{lower} was lowered to {repaired} to stay below {upper} ({high}), below its platform minimum {min}: \
                     the bounds on these fields cannot all hold; fix the ClusterContextPolicy bounds"
                ));
            }
        }
    }

    fn build(&self) -> Result<EffectivePolicy, PolicyError> {
        let mut root = Value::Object(Map::new());
        for (field, value) in &self.values {
            insert_path(&mut root, field.path(), value.clone());
        }
        serde_json::from_value(root).map_err(|e| PolicyError::InvalidValue {
            field: "*".into(),
            source_object: self.sources.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
            message: e.to_string(),
        })
    }
}

fn invalid(field: &str, source: &Source, error: serde_json::Error) -> PolicyError {
    PolicyError::InvalidValue {
        field: field.into(),
        source_object: source.to_string(),
        message: error.to_string(),
    }
}

fn lookup<'v>(root: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(root, |node, key| node.get(key))
}

fn insert_path(root: &mut Value, path: &str, value: Value) {
    let mut node = root;
    let mut keys = path.split('.').peekable();
    while let Some(key) = keys.next() {
        let Value::Object(map) = node else { return };
        if keys.peek().is_none() {
            map.insert(key.to_string(), value);
            return;
        }
        node = map.entry(key.to_string()).or_insert_with(|| Value::Object(Map::new()));
    }
}

fn rule_names(rules: Option<&Value>) -> Vec<String> {
    rules
        .and_then(Value::as_array)
        .map(|rules| {
            rules.iter().filter_map(|r| r.get("name").and_then(Value::as_str).map(str::to_string)).collect()
        })
        .unwrap_or_default()
}

/// Merge retention rules by name: same-named rules are replaced in place, new names appended.
fn merge_rules(existing: Option<&Value>, incoming: &Value) -> Value {
    let mut merged: Vec<Value> = existing.and_then(Value::as_array).cloned().unwrap_or_default();
    for rule in incoming.as_array().into_iter().flatten() {
        let name = rule.get("name");
        match merged.iter_mut().find(|r| r.get("name") == name) {
            Some(slot) => *slot = rule.clone(),
            None => merged.push(rule.clone()),
        }
    }
    Value::Array(merged)
}
