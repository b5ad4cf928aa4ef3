//! The extractive summariser: deterministic, no network. It assembles the CompactedState from the
//! pattern findings and the previous state, and trims the oldest items to fit the size bound.

use super::findings::{MAX_ITEM_CHARS, clip};
use super::state::{CompactedState, EvidenceRefs, SourcedItem, ToolState};
use super::summarizer::{Summarizer, SummaryFuture, SummaryInput};

/// The service version recorded for extractive compactions.
pub const EXTRACTIVE_VERSION: &str = "strata-extractive/1";

/// Most entry IDs and artifact references listed as evidence.
const MAX_EVIDENCE: usize = 256;

/// The deterministic summariser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtractiveSummarizer {
    /// Upper bound on the state's size in tokens (estimated as JSON bytes / 4).
    pub max_summary_tokens: u64,
}

impl Default for ExtractiveSummarizer {
    fn default() -> Self {
        Self { max_summary_tokens: 4096 }
    }
}

impl Summarizer for ExtractiveSummarizer {
    fn version(&self) -> String {
        EXTRACTIVE_VERSION.to_owned()
    }

    fn summarize<'a>(&'a self, input: &'a SummaryInput) -> SummaryFuture<'a> {
        Box::pin(std::future::ready(Ok(self.summarize_now(input))))
    }
}

impl ExtractiveSummarizer {
    /// Summarises synchronously (the trait's future is this value, already complete).
    pub fn summarize_now(&self, input: &SummaryInput) -> CompactedState {
        let findings = &input.findings;
        let previous = input.previous.clone().unwrap_or_default();
        let active_objective = findings
            .objective
            .as_ref()
            .map(|item| item.text.clone())
            .filter(|text| !text.is_empty())
            .or_else(|| (!previous.active_objective.is_empty()).then(|| previous.active_objective.clone()))
            .or_else(|| findings.first_request.as_ref().map(|item| item.text.clone()))
            .unwrap_or_default();
        let current_request = findings
            .current_request
            .as_ref()
            .map(|item| item.text.clone())
            .unwrap_or_else(|| previous.current_request.clone());
        let mut entry_ids: Vec<String> = previous.evidence_refs.entry_ids.clone();
        entry_ids.extend(input.retained.iter().map(ToString::to_string));
        entry_ids.extend(findings.evidence_ids.iter().map(ToString::to_string));
        let mut artifact_refs = previous.evidence_refs.artifact_refs.clone();
        artifact_refs.extend(findings.artifact_refs.iter().map(ToString::to_string));
        let mut state = CompactedState {
            project_summary: project_summary(&previous.project_summary, input),
            active_objective,
            current_request,
            hard_constraints: findings.constraints.clone(),
            decisions: findings.decisions.clone(),
            completed_tasks: findings.done.clone(),
            current_tasks: findings.todos.clone(),
            blockers: findings.blockers.clone(),
            open_questions: findings.open_questions.clone(),
            affected_files: findings.files.clone(),
            tool_state: ToolState {
                pending_actions: findings.pending_actions.clone(),
                approvals: findings.approvals.clone(),
                side_effects: findings.side_effects.clone(),
            },
            evidence_refs: EvidenceRefs {
                entry_ids: newest_distinct(entry_ids, MAX_EVIDENCE),
                artifact_refs: newest_distinct(artifact_refs, MAX_EVIDENCE),
            },
            privacy_scope: input.privacy_scope.clone(),
            resume_instruction: input.resume_instruction.clone(),
        };
        fit_to_budget(&mut state, input, self.max_summary_tokens);
        state
    }
}

/// The last `max` distinct values, in their original order.
fn newest_distinct(values: Vec<String>, max: usize) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut kept: Vec<String> =
        values.into_iter().rev().filter(|v| seen.insert(v.clone())).take(max).collect();
    kept.reverse();
    kept
}

fn project_summary(previous: &str, input: &SummaryInput) -> String {
    let delta = &input.delta;
    let mut summary = String::new();
    if !previous.trim().is_empty() {
        summary.push_str(&clip(previous, 1500));
        summary.push(' ');
    }
    let (Some(first), Some(last)) = (delta.first(), delta.last()) else {
        summary.push_str("No new entries since the previous compaction.");
        return summary;
    };
    let tool_outputs = delta.iter().filter(|entry| super::signals::is_tool_output(entry)).count();
    let assistant = delta.iter().filter(|entry| entry.role == crate::entry::Role::Assistant).count();
    summary.push_str(&format!(
        "Compacted {} entries ({}..{}): {} assistant turns, {} tool outputs.",
        delta.len(),
        first.id,
        last.id,
        assistant,
        tool_outputs
    ));
    if !input.findings.diff_files.is_empty() {
        let files: Vec<&str> = input.findings.diff_files.iter().map(String::as_str).collect();
        summary.push_str(&format!(" Changed files: {}.", files.join(", ")));
    }
    if let Some(request) = &input.findings.current_request {
        summary.push_str(&format!(
            " Latest request ({}): {}",
            request.source_ids.join(","),
            clip(&request.text, MAX_ITEM_CHARS)
        ));
    }
    summary
}

/// Most items kept in a trimmable list before size fitting.
const MAX_LIST_ITEMS: usize = 200;

/// Drops the oldest trimmable items until the state's JSON fits `max_tokens` (bytes / 4). Open
/// questions, pending tool actions, the objective, the request and files changed by a diff are
/// never dropped; the project summary says how much was omitted.
fn fit_to_budget(state: &mut CompactedState, input: &SummaryInput, max_tokens: u64) {
    // Room for the sentence that reports the omission.
    const NOTE_BYTES: usize = 160;
    let limit =
        usize::try_from(max_tokens.saturating_mul(4)).unwrap_or(usize::MAX).saturating_sub(NOTE_BYTES);
    let protected_files = input.findings.diff_files.len().min(state.affected_files.len());
    let mut omitted = 0usize;
    for list in trimmable(state) {
        let excess = list.len().saturating_sub(MAX_LIST_ITEMS);
        list.drain(..excess);
        omitted += excess;
    }
    let file_cap = protected_files.max(MAX_LIST_ITEMS);
    omitted += state.affected_files.len().saturating_sub(file_cap);
    state.affected_files.truncate(file_cap);
    let mut current = serde_json::to_string(&*state).map(|json| json.len()).unwrap_or(0);
    while current > limit {
        let files_trimmable = state.affected_files.len() > protected_files.max(16);
        let evidence_trimmable = state.evidence_refs.entry_ids.len() > 32;
        let longest = trimmable(state).into_iter().max_by_key(|list| list.len());
        let removed = match longest {
            Some(list) if list.len() > 4 => item_len(&list.remove(0)),
            _ if files_trimmable => state.affected_files.pop().map_or(0, |file| file.len() + 3),
            _ if evidence_trimmable => state.evidence_refs.entry_ids.remove(0).len() + 3,
            Some(list) if !list.is_empty() => item_len(&list.remove(0)),
            _ => break,
        };
        omitted += 1;
        current = current.saturating_sub(removed);
        if current <= limit {
            current = serde_json::to_string(&*state).map(|json| json.len()).unwrap_or(0);
        }
    }
    if omitted > 0 {
        state.project_summary.push_str(&format!(
            " {omitted} older items were omitted to keep the state within {max_tokens} tokens; the raw entries stay in the archive."
        ));
    }
}

fn trimmable(state: &mut CompactedState) -> [&mut Vec<SourcedItem>; 7] {
    [
        &mut state.tool_state.side_effects,
        &mut state.decisions,
        &mut state.completed_tasks,
        &mut state.current_tasks,
        &mut state.blockers,
        &mut state.tool_state.approvals,
        &mut state.hard_constraints,
    ]
}

fn item_len(item: &SourcedItem) -> usize {
    serde_json::to_string(item).map(|json| json.len() + 1).unwrap_or(0)
}
