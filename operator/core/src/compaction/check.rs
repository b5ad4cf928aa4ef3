//! The preservation check (§17.15.5): deterministic, run before a compacted state may replace the
//! active context. It names every item that is missing.

use super::plan::PreparedCompaction;
use super::signals;
use super::state::{CompactedState, StateField};

/// The outcome of the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QualityReport {
    /// Fields of the state that hold something (JSON names).
    pub preserved_fields: Vec<String>,
    /// What is missing, one readable line each; empty when the check passed.
    pub missing_items: Vec<String>,
}

impl QualityReport {
    /// Whether nothing is missing.
    pub fn passed(&self) -> bool {
        self.missing_items.is_empty()
    }
}

/// Checks that `state` preserves what the source holds:
/// * every Critical entry is kept verbatim, named by ID, or quoted verbatim in the state;
/// * every open question and every pending tool action of the source appears;
/// * every required field is non-empty when the source has signals for it.
pub fn check_preservation(prepared: &PreparedCompaction, state: &CompactedState) -> QualityReport {
    let findings = &prepared.input.findings;
    let state_json = serde_json::to_string(state).unwrap_or_default();
    let mentioned = state.mentioned_entry_ids();
    let mut missing = Vec::new();

    for id in &prepared.critical {
        let kept = prepared.retained.contains(id);
        let named = mentioned.contains(&id.to_string());
        let quoted = prepared.snapshot.entries.iter().find(|entry| entry.id == *id).is_some_and(|entry| {
            !entry.content.text.is_empty() && state_json.contains(&json_escaped(&entry.content.text))
        });
        if !(kept || named || quoted) {
            missing.push(format!("critical entry {id} is neither kept, referenced by ID, nor quoted"));
        }
    }
    let open_text: Vec<String> = state.open_questions.iter().map(|item| item.text.clone()).collect();
    let open_text = open_text.join("\n");
    for question in &findings.open_questions {
        if !signals::represented_in(&question.text, &open_text) {
            missing.push(format!(
                "open question {:?} ({}) is missing from open_questions",
                question.text,
                question.source_ids.join(",")
            ));
        }
    }
    for action in &findings.pending_actions {
        let present =
            state.tool_state.pending_actions.iter().any(|candidate| candidate.call_id == action.call_id);
        if !present {
            missing.push(format!(
                "pending tool action {} ({} in {}) is missing from tool_state.pending_actions",
                action.call_id, action.tool, action.source_id
            ));
        }
    }
    for field in &prepared.request.settings.required_fields {
        if has_signal(prepared, *field) && !field.is_filled(state) {
            missing.push(format!(
                "required field {} is empty but the source has signals for it",
                field.json_name()
            ));
        }
    }
    if state.resume_instruction.trim().is_empty() {
        missing.push("resume_instruction is empty".into());
    }
    let preserved_fields = StateField::ALL
        .iter()
        .filter(|field| field.is_filled(state))
        .map(|field| field.json_name().to_owned())
        .collect();
    QualityReport { preserved_fields, missing_items: missing }
}

/// `text` as it appears inside a JSON string.
fn json_escaped(text: &str) -> String {
    let quoted = serde_json::to_string(text).unwrap_or_default();
    quoted.get(1..quoted.len().saturating_sub(1)).unwrap_or_default().to_owned()
}

/// Whether the source (delta and previous state) has material for `field`.
fn has_signal(prepared: &PreparedCompaction, field: StateField) -> bool {
    let input = &prepared.input;
    let findings = &input.findings;
    let previous = input.previous.as_ref();
    match field {
        StateField::ActiveObjective => {
            findings.objective.is_some()
                || findings.first_request.is_some()
                || previous.is_some_and(|state| !state.active_objective.trim().is_empty())
        }
        StateField::CurrentRequest => {
            findings.current_request.is_some()
                || previous.is_some_and(|state| !state.current_request.trim().is_empty())
        }
        StateField::HardConstraints => !findings.constraints.is_empty(),
        StateField::Decisions => !findings.decisions.is_empty(),
        StateField::OpenQuestions => !findings.open_questions.is_empty(),
        StateField::ToolState => {
            !(findings.pending_actions.is_empty()
                && findings.side_effects.is_empty()
                && findings.approvals.is_empty())
        }
        StateField::EvidenceRefs => !input.delta.is_empty(),
        StateField::PrivacyScope => !input.privacy_scope.trim().is_empty(),
    }
}
