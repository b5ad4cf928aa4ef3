//! Stage budgets (GCS §17.11): the output reserve is taken from the limit first, then the system
//! prompt, the tools, memory (summaries), tool results and history each get their ceiling from
//! what is left, in that order. The client's `max_tokens` is clamped to the output reserve. Every
//! section but the client's system prompt is brought back under its ceiling: tools by lazy schemas,
//! memory by merging summaries, tool results by elision, history by compaction.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::BudgetPolicy;

/// Per-section ceilings in tokens; 0 means the section has no ceiling of its own and takes what
/// the sections before it left. The tools ceiling is the lazy-schema threshold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StageBudgets {
    /// The stable system prompt (Tier-1 system and constants sections).
    pub system_tokens: u64,
    /// Summaries of compacted and purged history.
    pub memory_tokens: u64,
    /// Tool results in the window.
    pub tool_results_tokens: u64,
    /// Everything else in the window: messages, tool calls, the volatile tail.
    pub history_tokens: u64,
}

/// A section of the prompt, in allocation order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The model's answer, with protocol overhead and the safety margin.
    OutputReserve,
    /// The stable system prompt.
    System,
    /// Tool schemas.
    Tools,
    /// Summaries.
    Memory,
    /// Tool results.
    ToolResults,
    /// The rest of the conversation.
    History,
}

impl Stage {
    /// Every stage, in declaration (allocation) order: `Stage::ALL[stage as usize] == stage`.
    pub const ALL: [Stage; 6] = [
        Stage::OutputReserve,
        Stage::System,
        Stage::Tools,
        Stage::Memory,
        Stage::ToolResults,
        Stage::History,
    ];

    /// Label value for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Stage::OutputReserve => "output_reserve",
            Stage::System => "system",
            Stage::Tools => "tools",
            Stage::Memory => "memory",
            Stage::ToolResults => "tool_results",
            Stage::History => "history",
        }
    }
}

/// How a section over its ceiling is brought back, or that it is only reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    /// Admission keeps the reserve free (a request that would eat into it is blocked or compacted
    /// first) and the client's `max_tokens` is clamped to it.
    ReservedAndClamped,
    /// The client's system prompt is never cut: an overrun is reported.
    Reported,
    /// Tool schemas over the ceiling are summarised (lazy schemas).
    LazySchemas,
    /// Tool results over the ceiling are elided, oldest first.
    Elision,
    /// History over the ceiling triggers a compaction.
    Compaction,
    /// Summaries over the ceiling are merged into one by a compaction when there are two or more
    /// (a compaction folds earlier summaries into its state); a single summary over it is reported.
    MergedByCompaction,
}

/// One section's budget and use at one call, as the Inspector shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StageUsage {
    /// The section.
    pub stage: Stage,
    /// Its configured ceiling (0: none of its own).
    pub ceiling: u64,
    /// Tokens it may take: its ceiling, or less when earlier sections left less.
    pub allocated: u64,
    /// Tokens it takes.
    pub used: u64,
    /// Whether it takes more than allocated.
    pub over: bool,
    /// What happens when it is over.
    pub enforcement: Enforcement,
}

/// Tokens each section takes, in allocation order after the reserve.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SectionTokens {
    /// System.
    pub system: u64,
    /// Tools.
    pub tools: u64,
    /// Memory.
    pub memory: u64,
    /// Tool results.
    pub tool_results: u64,
    /// History.
    pub history: u64,
}

/// The allocation of `limit` in stage order: the reserve first, then each section from what the
/// sections before it left (a section uses what it takes, even past its allocation).
pub fn allocate(
    limit: u64,
    policy: &BudgetPolicy,
    stages: &StageBudgets,
    tools_ceiling: u64,
    used: SectionTokens,
) -> Vec<StageUsage> {
    let reserve = policy.reservations(1);
    // One allocation of the final size: every request allocates its stages.
    let mut usages = Vec::with_capacity(Stage::ALL.len());
    usages.push(StageUsage {
        stage: Stage::OutputReserve,
        ceiling: policy.reserved_completion_tokens,
        allocated: reserve.min(limit),
        used: reserve,
        over: reserve > limit,
        enforcement: Enforcement::ReservedAndClamped,
    });
    let mut remaining = limit.saturating_sub(reserve);
    for (stage, ceiling, used, enforcement) in [
        (Stage::System, stages.system_tokens, used.system, Enforcement::Reported),
        (Stage::Tools, tools_ceiling, used.tools, Enforcement::LazySchemas),
        (Stage::Memory, stages.memory_tokens, used.memory, Enforcement::MergedByCompaction),
        (Stage::ToolResults, stages.tool_results_tokens, used.tool_results, Enforcement::Elision),
        (Stage::History, stages.history_tokens, used.history, Enforcement::Compaction),
    ] {
        let allocated = if ceiling == 0 { remaining } else { ceiling.min(remaining) };
        usages.push(StageUsage { stage, ceiling, allocated, used, over: used > allocated, enforcement });
        remaining = remaining.saturating_sub(used);
    }
    usages
}

/// A clamp of the client's `max_tokens` to the output reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MaxTokensClamp {
    /// What the client asked for.
    pub requested: u64,
    /// What was sent upstream (the reserve).
    pub applied: u64,
}

/// The completion-size fields providers read (`max_tokens`; OpenAI's `max_completion_tokens`).
const MAX_TOKEN_FIELDS: [&str; 2] = ["max_tokens", "max_completion_tokens"];

/// Clamps the request's completion-size fields to `reserve`; returns the clamp when one was
/// lowered (the largest requested value). A request without such a field is left alone.
pub fn clamp_max_tokens(params: &mut Map<String, Value>, reserve: u64) -> Option<MaxTokensClamp> {
    let mut clamp: Option<MaxTokensClamp> = None;
    for field in MAX_TOKEN_FIELDS {
        let Some(requested) = params.get(field).and_then(Value::as_u64) else { continue };
        if requested > reserve {
            params.insert(field.to_owned(), Value::from(reserve));
            let requested = clamp.map_or(requested, |c| c.requested.max(requested));
            clamp = Some(MaxTokensClamp { requested, applied: reserve });
        }
    }
    clamp
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn all_lists_every_stage_at_its_own_index() {
        for (index, stage) in Stage::ALL.into_iter().enumerate() {
            assert_eq!(stage as usize, index, "{stage:?}");
        }
    }

    #[test]
    fn sections_are_allocated_in_order_after_the_reserve() {
        let policy = BudgetPolicy {
            reserved_completion_tokens: 1_000,
            protocol_overhead_tokens: 0,
            safety_margin_tokens: 0,
            ..BudgetPolicy::default()
        };
        let stages =
            StageBudgets { system_tokens: 500, tool_results_tokens: 2_000, ..StageBudgets::default() };
        let used =
            SectionTokens { system: 600, tools: 1_000, memory: 0, tool_results: 2_500, history: 3_000 };
        let usages = allocate(10_000, &policy, &stages, 4_000, used);
        let view: Vec<(Stage, u64, bool)> = usages.iter().map(|u| (u.stage, u.allocated, u.over)).collect();
        assert_eq!(
            view,
            [
                (Stage::OutputReserve, 1_000, false),
                (Stage::System, 500, true),
                (Stage::Tools, 4_000, false),
                (Stage::Memory, 7_400, false),
                (Stage::ToolResults, 2_000, true),
                (Stage::History, 4_900, false),
            ]
        );
    }

    #[test]
    fn max_tokens_is_clamped_to_the_reserve_and_reported() {
        let mut params = Map::new();
        params.insert("max_tokens".into(), Value::from(64_000));
        let clamp = clamp_max_tokens(&mut params, 8_192).unwrap();
        assert_eq!(clamp, MaxTokensClamp { requested: 64_000, applied: 8_192 });
        assert_eq!(params["max_tokens"], 8_192);
        assert_eq!(clamp_max_tokens(&mut params, 8_192), None);
        let mut absent = Map::new();
        assert_eq!(clamp_max_tokens(&mut absent, 8_192), None);
        assert!(absent.is_empty());
    }
}
