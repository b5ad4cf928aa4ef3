//! The context policies replay compares: what each one sends on every call.
//!
//! The anchors are the policies people use today, implemented as published:
//! - **naive**: the full history, every call.
//! - **observation-masking** (JetBrains, "The Complexity Trap", 2025): tool observations older than
//!   the last `observation_keep` are replaced by a one-line placeholder; everything else is kept.
//! - **clear-tool-uses** (Anthropic context editing, `clear_tool_uses_20250919`): once the prompt
//!   exceeds `clear_trigger_tokens`, every tool result but the last `clear_keep` is replaced by a
//!   placeholder; cleared results stay cleared.
//! - **seed-002** (a production agent's optimisations): tool results over 8000 characters are spilled
//!   to a preview (60 lines / 4000 characters + a reference); results older than 4 rounds and over
//!   2000 characters are cut to their first 800 characters, re-evaluated every round.
//! - **strata**: the real engine (see [`super::simulate`]).
//! - **oracle**: not a policy anyone can run, but a bound: it knows which tool outputs the session
//!   will use later (see [`super::readback`]). Each output over `oracle_spill.max_result_chars` that
//!   no later call uses is spilled to a preview when it arrives. Each one that is used is kept
//!   whole, unless keeping it would cost more than reading it back. A repeat of an earlier output
//!   becomes a reference to it, as the engine's deduplication does. Replay runs it twice: the first
//!   pass spills every output and charges the read-backs. The second keeps the used outputs whose
//!   estimated cost kept (tokens beyond the preview, written once and read at 0.1x on every later
//!   call) is below their charged read-back. Then one sweep flips each used output's choice in turn,
//!   prices the whole session again, and keeps a flip that lowers the bill: that corrects the
//!   estimate where cache effects (the 1024-token minimum, one removal moving another's hits)
//!   decide. It shows what deciding each output's fate on arrival can reach with perfect foresight,
//!   without the engine's per-call overhead (memory-tool schemas, telemetry). It is not an exact
//!   minimum: the sweep tries each flip once (at most 128 a session, dearest read-backs first), not
//!   every combination, and the oracle never elides an output after its last use.
//!
//! Every policy places Anthropic cache breakpoints the way a well-configured client does: after
//! the system prompt and at the end of the prompt.

use std::collections::HashMap;

use serde::Serialize;

use crate::artifacts::ArtifactRef;
use crate::dedup::{MIN_DEDUP_CHARS, render_duplicate};
use crate::entry::{EntryId, EntryKind};
use crate::tool_output::spill::render_spilled;
use crate::tool_output::{SpillPolicy, render_elided};

use super::transcript::TranscriptMessage;

/// A context policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// The full history.
    Naive,
    /// JetBrains' observation masking.
    ObservationMasking,
    /// Anthropic's clear-tool-uses context editing.
    ClearToolUses,
    /// Seed 002's spill and sliding elision.
    Seed002,
    /// The Strata engine.
    Strata,
    /// The read-back-free bound: spills exactly the outputs no later call uses.
    Oracle,
}

impl PolicyKind {
    /// Every policy, in report order.
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Naive,
        PolicyKind::ObservationMasking,
        PolicyKind::ClearToolUses,
        PolicyKind::Seed002,
        PolicyKind::Strata,
        PolicyKind::Oracle,
    ];

    /// The report name.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Naive => "naive",
            PolicyKind::ObservationMasking => "observation-masking",
            PolicyKind::ClearToolUses => "clear-tool-uses",
            PolicyKind::Seed002 => "seed-002",
            PolicyKind::Strata => "strata",
            PolicyKind::Oracle => "oracle",
        }
    }
}

/// Knobs of the anchor policies.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicySettings {
    /// observation-masking: observations kept verbatim (JetBrains used the last 10 turns).
    pub observation_keep: usize,
    /// clear-tool-uses: input size that triggers clearing (Anthropic default 100,000).
    pub clear_trigger_tokens: u64,
    /// clear-tool-uses: tool uses kept (Anthropic default 3).
    pub clear_keep: usize,
    /// seed-002: spill settings (8000 / 4000 / 60).
    pub spill: SpillPolicy,
    /// seed-002: rounds before elision (4).
    pub elide_after_rounds: usize,
    /// seed-002: elide results over this many characters (2000).
    pub elide_over_chars: usize,
    /// seed-002: characters kept (800).
    pub elide_keep_chars: usize,
    /// oracle: outputs over `max_result_chars` (500) are candidates for spilling, with the engine's
    /// default preview (250 characters / 60 lines).
    pub oracle_spill: SpillPolicy,
}

impl Default for PolicySettings {
    fn default() -> Self {
        PolicySettings {
            observation_keep: 10,
            clear_trigger_tokens: 100_000,
            clear_keep: 3,
            // Seed 002's own numbers, not the engine's defaults (which the sweep moved).
            spill: SpillPolicy { max_result_chars: 8000, preview_chars: 4000, preview_lines: 60 },
            elide_after_rounds: 4,
            elide_over_chars: 2000,
            elide_keep_chars: 800,
            oracle_spill: SpillPolicy { max_result_chars: 500, ..SpillPolicy::default() },
        }
    }
}

/// Placeholder observation-masking puts in place of an old observation.
pub const MASKED_OBSERVATION: &str = "[Old tool output omitted for brevity.]";
/// Placeholder clear-tool-uses puts in place of a cleared result.
pub const CLEARED_TOOL_RESULT: &str = "[Tool result cleared to save context.]";

/// How an anchor policy renders one message on one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// As recorded.
    Full,
    /// Replaced by [`MASKED_OBSERVATION`].
    Masked,
    /// Replaced by [`CLEARED_TOOL_RESULT`].
    Cleared,
    /// seed-002: spilled to a preview and/or elided.
    Seed002 {
        /// Over the spill threshold.
        spilled: bool,
        /// Old and long enough to be elided.
        elided: bool,
    },
    /// oracle: spilled to a preview, since no later call uses it.
    OracleSpilled,
    /// oracle: a repeat of the earlier tool output at this message index.
    OracleDuplicate(usize),
}

/// Counts before each message, so a policy decides a message's variant in O(1).
pub struct MessageIndex {
    tool_results_before: Vec<usize>,
    assistants_before: Vec<usize>,
    /// For a tool result of at least [`MIN_DEDUP_CHARS`] characters that repeats an earlier one,
    /// the earliest.
    duplicate_of: Vec<Option<usize>>,
}

impl MessageIndex {
    /// Index `messages`.
    pub fn new(messages: &[TranscriptMessage]) -> Self {
        let mut tool_results_before = Vec::with_capacity(messages.len() + 1);
        let mut assistants_before = Vec::with_capacity(messages.len() + 1);
        let (mut tools, mut assistants) = (0, 0);
        let mut first_with_text: HashMap<&str, usize> = HashMap::new();
        let mut duplicate_of = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            let repeats = message.is_tool_result() && message.text.chars().count() >= MIN_DEDUP_CHARS;
            duplicate_of.push(
                repeats
                    .then(|| *first_with_text.entry(&message.text).or_insert(index))
                    .filter(|&first| first != index),
            );
            tool_results_before.push(tools);
            assistants_before.push(assistants);
            tools += usize::from(message.is_tool_result());
            assistants += usize::from(message.role == crate::entry::Role::Assistant);
        }
        tool_results_before.push(tools);
        assistants_before.push(assistants);
        MessageIndex { tool_results_before, assistants_before, duplicate_of }
    }
}

/// Which variant an anchor policy sends for message `index` when the prompt is `messages[..end]`.
///
/// `marked` is the policy's own per-message state: for clear-tool-uses the tool results it has
/// cleared so far, for the oracle the tool results a later call uses.
pub fn anchor_variant(
    kind: PolicyKind,
    settings: &PolicySettings,
    messages: &[TranscriptMessage],
    index_of: &MessageIndex,
    index: usize,
    end: usize,
    marked: &[bool],
) -> Variant {
    let message = &messages[index];
    if !message.is_tool_result() {
        return Variant::Full;
    }
    match kind {
        PolicyKind::Naive | PolicyKind::Strata => Variant::Full,
        PolicyKind::ObservationMasking => {
            let newer = index_of.tool_results_before[end] - index_of.tool_results_before[index + 1];
            if newer >= settings.observation_keep { Variant::Masked } else { Variant::Full }
        }
        PolicyKind::ClearToolUses => {
            if marked.get(index).copied().unwrap_or(false) {
                Variant::Cleared
            } else {
                Variant::Full
            }
        }
        PolicyKind::Seed002 => {
            let chars = message.text.chars().count();
            let spilled = chars > settings.spill.max_result_chars;
            let rounds = index_of.assistants_before[end] - index_of.assistants_before[index + 1];
            let shown = if spilled { settings.spill.preview_chars.min(chars) + 200 } else { chars };
            let elided = rounds >= settings.elide_after_rounds && shown > settings.elide_over_chars;
            if !spilled && !elided { Variant::Full } else { Variant::Seed002 { spilled, elided } }
        }
        PolicyKind::Oracle => {
            if let Some(first) = index_of.duplicate_of[index] {
                return Variant::OracleDuplicate(first);
            }
            let used_later = marked.get(index).copied().unwrap_or(false);
            if !used_later && message.text.chars().count() > settings.oracle_spill.max_result_chars {
                Variant::OracleSpilled
            } else {
                Variant::Full
            }
        }
    }
}

/// The text of a message in a variant.
pub fn variant_text(settings: &PolicySettings, message: &TranscriptMessage, variant: Variant) -> String {
    match variant {
        Variant::Full => message.text.clone(),
        Variant::Masked => MASKED_OBSERVATION.into(),
        Variant::Cleared => CLEARED_TOOL_RESULT.into(),
        Variant::Seed002 { spilled, elided } => {
            let data_ref = ArtifactRef::for_bytes(message.text.as_bytes());
            let text = if spilled {
                render_spilled(&message.text, &settings.spill, &data_ref)
            } else {
                message.text.clone()
            };
            if elided { render_elided(&text, settings.elide_keep_chars, &data_ref) } else { text }
        }
        Variant::OracleSpilled => {
            let data_ref = ArtifactRef::for_bytes(message.text.as_bytes());
            render_spilled(&message.text, &settings.oracle_spill, &data_ref)
        }
        Variant::OracleDuplicate(first) => {
            render_duplicate(EntryId::new(EntryKind::ToolResult, first as u64), &[])
        }
    }
}
