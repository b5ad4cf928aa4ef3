//! Preparing a compaction from a snapshot: the previous state, the delta since it, the entries kept
//! verbatim (Critical, recent, tool pairs, unanswered calls) and the summariser's input.

use std::collections::{BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::entry::{Entry, EntryId, EntryKind, RetentionClass};
use crate::journal::Snapshot;

use super::findings::{self, MAX_ITEM_CHARS, clip};
use super::state::{CompactedState, StateField};
use super::summarizer::SummaryInput;

/// Compaction mode (seed 001 §17.15.1, plus rollback and purge); also the API's `spec.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum CompactionMode {
    /// After a completed task or phase.
    TaskBoundary,
    /// Because the budget requires it.
    Budget,
    /// To avoid failure; falls back to the extractive summariser.
    Emergency,
    /// Restore a retained generation.
    Rollback,
    /// Remove specific entries, replaced by a summary.
    Purge,
}

impl CompactionMode {
    /// The mode's name as written in JSON and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            CompactionMode::TaskBoundary => "TaskBoundary",
            CompactionMode::Budget => "Budget",
            CompactionMode::Emergency => "Emergency",
            CompactionMode::Rollback => "Rollback",
            CompactionMode::Purge => "Purge",
        }
    }

    /// Whether the mode summarises history (TaskBoundary, Budget, Emergency).
    pub fn summarizes(self) -> bool {
        matches!(self, CompactionMode::TaskBoundary | CompactionMode::Budget | CompactionMode::Emergency)
    }
}

impl std::str::FromStr for CompactionMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        [
            CompactionMode::TaskBoundary,
            CompactionMode::Budget,
            CompactionMode::Emergency,
            CompactionMode::Rollback,
            CompactionMode::Purge,
        ]
        .into_iter()
        .find(|mode| mode.as_str().eq_ignore_ascii_case(text))
        .ok_or_else(|| {
            format!("unknown mode {text:?}; use TaskBoundary, Budget, Emergency, Rollback or Purge")
        })
    }
}

/// Policy knobs of a summarising compaction (the effective policy's `compaction` section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionSettings {
    /// Most recent (non-Ephemeral) entries kept verbatim.
    pub keep_recent_entries: usize,
    /// Fields that must be non-empty whenever the source has signals for them.
    pub required_fields: Vec<StateField>,
    /// Privacy scope recorded in the state and the record.
    pub privacy_scope: String,
    /// Upper bound on the state's size in tokens.
    pub max_summary_tokens: u64,
}

impl Default for CompactionSettings {
    /// The built-in policy defaults: keep 8 entries, 4096 summary tokens, and require the objective,
    /// constraints, decisions, open questions and tool state.
    fn default() -> Self {
        Self {
            keep_recent_entries: 8,
            required_fields: vec![
                StateField::ActiveObjective,
                StateField::HardConstraints,
                StateField::Decisions,
                StateField::OpenQuestions,
                StateField::ToolState,
            ],
            privacy_scope: "tenant".into(),
            max_summary_tokens: 4096,
        }
    }
}

/// A summarising compaction request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionRequest {
    /// TaskBoundary, Budget or Emergency.
    pub mode: CompactionMode,
    /// Why it runs (recorded).
    pub reason: Option<String>,
    /// How the agent resumes; generated from the state when absent.
    pub resume_instruction: Option<String>,
    /// Policy knobs.
    pub settings: CompactionSettings,
    /// The clock, unix milliseconds.
    pub now_ms: u64,
}

/// A compaction worked out against a snapshot, waiting for its summary.
#[derive(Debug, Clone)]
pub struct PreparedCompaction {
    pub(crate) snapshot: Snapshot,
    pub(crate) request: CompactionRequest,
    pub(crate) input: SummaryInput,
    pub(crate) retained: HashSet<EntryId>,
    pub(crate) removed: Vec<EntryId>,
    pub(crate) critical: Vec<EntryId>,
}

impl PreparedCompaction {
    /// Works out what to keep and what to summarise. Pure.
    pub fn new(snapshot: Snapshot, request: CompactionRequest) -> Self {
        let entries = &snapshot.entries;
        let previous_position = entries.iter().rposition(is_state_entry);
        let previous = previous_position.and_then(|position| {
            serde_json::from_str::<CompactedState>(&entries[position].content.text).ok()
        });
        let delta_start = previous_position.map_or(0, |position| position + 1);
        let delta: Vec<&Entry> = entries[delta_start..]
            .iter()
            .filter(|entry| entry.retention != RetentionClass::Ephemeral)
            .collect();
        let answered: HashSet<String> = entries
            .iter()
            .flat_map(|entry| entry.content.tool_results.iter().map(|result| result.call_id.clone()))
            .collect();
        let retained =
            retained_entries(entries, previous_position, &answered, request.settings.keep_recent_entries);
        let critical: Vec<EntryId> = entries
            .iter()
            .enumerate()
            .filter(|(position, entry)| {
                entry.retention == RetentionClass::Critical && Some(*position) != previous_position
            })
            .map(|(_, entry)| entry.id)
            .collect();
        let removed: Vec<EntryId> =
            entries.iter().map(|entry| entry.id).filter(|id| !retained.contains(id)).collect();
        let findings = findings::find(previous.as_ref(), &delta, &answered);
        let resume_instruction = request
            .resume_instruction
            .clone()
            .filter(|text| !text.trim().is_empty())
            .unwrap_or_else(|| default_resume_instruction(&findings));
        let retained_in_order: Vec<EntryId> =
            entries.iter().map(|entry| entry.id).filter(|id| retained.contains(id)).collect();
        let input = SummaryInput {
            previous,
            delta: delta.into_iter().cloned().collect(),
            retained: retained_in_order,
            findings,
            resume_instruction,
            privacy_scope: request.settings.privacy_scope.clone(),
        };
        Self { snapshot, request, input, retained, removed, critical }
    }

    /// What the summariser works from.
    pub fn summary_input(&self) -> &SummaryInput {
        &self.input
    }

    /// The snapshot the compaction reads.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The request.
    pub fn request(&self) -> &CompactionRequest {
        &self.request
    }

    /// Entries removed from the window (archived, reopenable).
    pub fn removed(&self) -> &[EntryId] {
        &self.removed
    }

    /// Entries kept verbatim, in journal order.
    pub fn retained(&self) -> &[EntryId] {
        &self.input.retained
    }

    /// Whether the compaction would remove nothing.
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty()
    }
}

/// Whether an entry is a previous compaction's state (a `summary_N` holding CompactedState JSON).
pub fn is_state_entry(entry: &Entry) -> bool {
    entry.id.kind() == EntryKind::Summary
        && entry.content.text.trim_start().starts_with('{')
        && serde_json::from_str::<CompactedState>(&entry.content.text).is_ok()
}

/// Critical entries, the last `keep_recent` non-Ephemeral entries, unanswered tool calls, and the
/// other half of every kept tool call/result pair (a provider rejects a result without its call).
fn retained_entries(
    entries: &[Entry],
    previous_position: Option<usize>,
    answered: &HashSet<String>,
    keep_recent: usize,
) -> HashSet<EntryId> {
    let mut retained: HashSet<EntryId> = HashSet::new();
    for (position, entry) in entries.iter().enumerate() {
        let unanswered = entry.content.tool_calls.iter().any(|call| !answered.contains(&call.call_id));
        if (entry.retention == RetentionClass::Critical && Some(position) != previous_position) || unanswered
        {
            retained.insert(entry.id);
        }
    }
    retained.extend(
        entries
            .iter()
            .enumerate()
            .rev()
            .filter(|(position, entry)| {
                entry.retention != RetentionClass::Ephemeral && Some(*position) != previous_position
            })
            .take(keep_recent)
            .map(|(_, entry)| entry.id),
    );
    let mut call_holder: HashMap<&str, EntryId> = HashMap::new();
    let mut result_holders: HashMap<&str, Vec<EntryId>> = HashMap::new();
    for entry in entries {
        for call in &entry.content.tool_calls {
            call_holder.insert(call.call_id.as_str(), entry.id);
        }
        for result in &entry.content.tool_results {
            result_holders.entry(result.call_id.as_str()).or_default().push(entry.id);
        }
    }
    let by_id: HashMap<EntryId, &Entry> = entries.iter().map(|entry| (entry.id, entry)).collect();
    let mut frontier: Vec<EntryId> = retained.iter().copied().collect();
    while let Some(id) = frontier.pop() {
        let Some(entry) = by_id.get(&id) else { continue };
        let partners =
            entry
                .content
                .tool_results
                .iter()
                .filter_map(|result| call_holder.get(result.call_id.as_str()).copied())
                .chain(
                    entry.content.tool_calls.iter().flat_map(|call| {
                        result_holders.get(call.call_id.as_str()).cloned().unwrap_or_default()
                    }),
                );
        let new: BTreeSet<EntryId> = partners.filter(|partner| !retained.contains(partner)).collect();
        for partner in new {
            retained.insert(partner);
            frontier.push(partner);
        }
    }
    retained
}

fn default_resume_instruction(findings: &findings::Findings) -> String {
    let next = findings
        .todos
        .last()
        .or(findings.current_request.as_ref())
        .map(|item| clip(&item.text, MAX_ITEM_CHARS))
        .unwrap_or_else(|| "the active objective".into());
    format!(
        "The history above was compacted into the state. Resume where you left off: {next}. Check the open \
         questions and pending tool actions before acting, and do not repeat side effects already performed."
    )
}
