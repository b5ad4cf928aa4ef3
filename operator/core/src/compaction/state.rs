//! The CompactedState: the typed, schema-described summary that replaces compacted history.

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::artifacts::ArtifactRef;
use crate::entry::EntryId;

/// Everything an agent needs to resume after its history was compacted (seed 000 step 2, seed 001
/// §17.15.2). Every field is required in JSON, so a summariser that forgets one is caught by the
/// schema, not silently defaulted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompactedState {
    /// Dense summary of the project and the context established so far.
    pub project_summary: String,
    /// What the agent is trying to achieve overall.
    pub active_objective: String,
    /// The most recent request the agent is serving.
    pub current_request: String,
    /// Hard constraints and policies that must keep holding.
    pub hard_constraints: Vec<SourcedItem>,
    /// Confirmed decisions.
    pub decisions: Vec<SourcedItem>,
    /// Tasks already done.
    pub completed_tasks: Vec<SourcedItem>,
    /// Tasks in progress or next.
    pub current_tasks: Vec<SourcedItem>,
    /// Active blockers and errors.
    pub blockers: Vec<SourcedItem>,
    /// Questions not yet answered.
    pub open_questions: Vec<SourcedItem>,
    /// Files and components touched or discussed.
    pub affected_files: Vec<String>,
    /// Tool calls in flight, approvals and side effects already performed.
    pub tool_state: ToolState,
    /// Entry IDs and artifact references that back the state.
    pub evidence_refs: EvidenceRefs,
    /// Privacy and authorization scope of the material summarised.
    pub privacy_scope: String,
    /// How the agent resumes.
    pub resume_instruction: String,
}

/// One statement with the journal entries it came from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SourcedItem {
    /// The statement.
    pub text: String,
    /// Entry IDs it was taken from, e.g. `msg_12`.
    pub source_ids: Vec<String>,
}

impl SourcedItem {
    /// An item from one entry.
    pub fn new(text: impl Into<String>, source: EntryId) -> Self {
        Self { text: text.into(), source_ids: vec![source.to_string()] }
    }
}

/// Tool state that must survive a compaction.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolState {
    /// Tool calls requested but not yet answered.
    pub pending_actions: Vec<PendingAction>,
    /// Approvals granted (or requested) for actions.
    pub approvals: Vec<SourcedItem>,
    /// Side effects already performed: do not repeat them.
    pub side_effects: Vec<SourcedItem>,
}

/// A tool call without a result yet.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PendingAction {
    /// The provider call ID the result will echo.
    pub call_id: String,
    /// Tool name.
    pub tool: String,
    /// Arguments as JSON text (possibly shortened).
    pub arguments: String,
    /// The entry holding the call.
    pub source_id: String,
}

/// References that back the state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvidenceRefs {
    /// Journal entry IDs.
    pub entry_ids: Vec<String>,
    /// Artifact references, `art:sha256:<hex>`.
    pub artifact_refs: Vec<String>,
}

/// A field of the CompactedState that a policy can require (`compaction.requiredFields`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum StateField {
    /// `active_objective`.
    ActiveObjective,
    /// `current_request`.
    CurrentRequest,
    /// `hard_constraints`.
    HardConstraints,
    /// `decisions`.
    Decisions,
    /// `open_questions`.
    OpenQuestions,
    /// `tool_state`.
    ToolState,
    /// `evidence_refs`.
    EvidenceRefs,
    /// `privacy_scope`.
    PrivacyScope,
}

impl StateField {
    /// Every field, in schema order.
    pub const ALL: [StateField; 8] = [
        StateField::ActiveObjective,
        StateField::CurrentRequest,
        StateField::HardConstraints,
        StateField::Decisions,
        StateField::OpenQuestions,
        StateField::ToolState,
        StateField::EvidenceRefs,
        StateField::PrivacyScope,
    ];

    /// The JSON name of the field in the CompactedState.
    pub fn json_name(self) -> &'static str {
        match self {
            StateField::ActiveObjective => "active_objective",
            StateField::CurrentRequest => "current_request",
            StateField::HardConstraints => "hard_constraints",
            StateField::Decisions => "decisions",
            StateField::OpenQuestions => "open_questions",
            StateField::ToolState => "tool_state",
            StateField::EvidenceRefs => "evidence_refs",
            StateField::PrivacyScope => "privacy_scope",
        }
    }

    /// Whether the field holds anything in `state`.
    pub fn is_filled(self, state: &CompactedState) -> bool {
        match self {
            StateField::ActiveObjective => !state.active_objective.trim().is_empty(),
            StateField::CurrentRequest => !state.current_request.trim().is_empty(),
            StateField::HardConstraints => !state.hard_constraints.is_empty(),
            StateField::Decisions => !state.decisions.is_empty(),
            StateField::OpenQuestions => !state.open_questions.is_empty(),
            StateField::ToolState => {
                let tools = &state.tool_state;
                !(tools.pending_actions.is_empty()
                    && tools.approvals.is_empty()
                    && tools.side_effects.is_empty())
            }
            StateField::EvidenceRefs => {
                !(state.evidence_refs.entry_ids.is_empty() && state.evidence_refs.artifact_refs.is_empty())
            }
            StateField::PrivacyScope => !state.privacy_scope.trim().is_empty(),
        }
    }
}

/// Why a summariser's output is not a usable CompactedState.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateValidationError {
    /// Empty output.
    #[error("the output is empty; return one JSON object that matches the CompactedState schema")]
    Empty,
    /// Not JSON, or JSON that does not match the schema.
    #[error("the output does not match the CompactedState schema: {0}")]
    Schema(String),
    /// An entry ID that is not of the form `msg_12`.
    #[error("{field} holds {value:?}, which is not an entry ID such as msg_12")]
    BadEntryId {
        /// Where.
        field: &'static str,
        /// The rejected text.
        value: String,
    },
    /// An artifact reference that is not `art:sha256:<hex>`.
    #[error(
        "evidence_refs.artifact_refs holds {0:?}, which is not an artifact reference art:sha256:<64 hex>"
    )]
    BadArtifactRef(String),
    /// A list item without text.
    #[error("{0} has an item with empty text; drop it or fill it")]
    EmptyItem(&'static str),
}

impl CompactedState {
    /// The JSON Schema (draft 2020-12) of the state, as given to LLM summarisers.
    pub fn json_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(CompactedState)).unwrap_or_default()
    }

    /// Parses summariser output: tolerates a Markdown code fence or prose around one JSON object,
    /// then checks the schema and the ID and reference formats.
    pub fn parse_validated(output: &str) -> Result<Self, StateValidationError> {
        let json = extract_json_object(output).ok_or(if output.trim().is_empty() {
            StateValidationError::Empty
        } else {
            StateValidationError::Schema("no JSON object found".into())
        })?;
        let state: CompactedState =
            serde_json::from_str(json).map_err(|error| StateValidationError::Schema(error.to_string()))?;
        state.validate()?;
        Ok(state)
    }

    /// Checks what the schema cannot: entry IDs, artifact references and non-empty items.
    pub fn validate(&self) -> Result<(), StateValidationError> {
        let lists: [(&'static str, &Vec<SourcedItem>); 8] = [
            ("hard_constraints", &self.hard_constraints),
            ("decisions", &self.decisions),
            ("completed_tasks", &self.completed_tasks),
            ("current_tasks", &self.current_tasks),
            ("blockers", &self.blockers),
            ("open_questions", &self.open_questions),
            ("tool_state.approvals", &self.tool_state.approvals),
            ("tool_state.side_effects", &self.tool_state.side_effects),
        ];
        for (field, items) in lists {
            for item in items {
                if item.text.trim().is_empty() {
                    return Err(StateValidationError::EmptyItem(field));
                }
                check_ids(field, &item.source_ids)?;
            }
        }
        for action in &self.tool_state.pending_actions {
            check_ids("tool_state.pending_actions.source_id", std::slice::from_ref(&action.source_id))?;
        }
        check_ids("evidence_refs.entry_ids", &self.evidence_refs.entry_ids)?;
        for reference in &self.evidence_refs.artifact_refs {
            reference
                .parse::<ArtifactRef>()
                .map_err(|_| StateValidationError::BadArtifactRef(reference.clone()))?;
        }
        Ok(())
    }

    /// Every entry ID the state mentions anywhere.
    pub fn mentioned_entry_ids(&self) -> BTreeSet<String> {
        let mut ids: BTreeSet<String> = self.evidence_refs.entry_ids.iter().cloned().collect();
        let lists = [
            &self.hard_constraints,
            &self.decisions,
            &self.completed_tasks,
            &self.current_tasks,
            &self.blockers,
            &self.open_questions,
            &self.tool_state.approvals,
            &self.tool_state.side_effects,
        ];
        for item in lists.into_iter().flatten() {
            ids.extend(item.source_ids.iter().cloned());
        }
        ids.extend(self.tool_state.pending_actions.iter().map(|action| action.source_id.clone()));
        ids
    }
}

fn check_ids(field: &'static str, ids: &[String]) -> Result<(), StateValidationError> {
    for id in ids {
        id.parse::<EntryId>().map_err(|_| StateValidationError::BadEntryId { field, value: id.clone() })?;
    }
    Ok(())
}

/// The outermost `{ … }` of `text`, which may be wrapped in a code fence or prose.
fn extract_json_object(text: &str) -> Option<&str> {
    let start = text.find('{')?;
    let end = text.rfind('}')?;
    (end > start).then(|| &text[start..=end])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn schema_requires_every_field_and_forbids_others() {
        let schema = CompactedState::json_schema();
        let required: Vec<&str> =
            schema["required"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        for field in StateField::ALL {
            assert!(required.contains(&field.json_name()), "{} not required", field.json_name());
        }
        assert!(required.contains(&"resume_instruction"));
        assert_eq!(schema["additionalProperties"], serde_json::Value::Bool(false));
    }

    #[test]
    fn parse_accepts_fenced_json_and_rejects_bad_ids() {
        let mut state = CompactedState { active_objective: "ship".into(), ..Default::default() };
        state.decisions.push(SourcedItem { text: "use redis".into(), source_ids: vec!["msg_3".into()] });
        let fenced = format!("```json\n{}\n```", serde_json::to_string(&state).unwrap());
        assert_eq!(CompactedState::parse_validated(&fenced).unwrap(), state);
        state.decisions[0].source_ids[0] = "message 3".into();
        let error = CompactedState::parse_validated(&serde_json::to_string(&state).unwrap()).unwrap_err();
        assert!(matches!(error, StateValidationError::BadEntryId { field: "decisions", .. }));
        assert_eq!(CompactedState::parse_validated("  ").unwrap_err(), StateValidationError::Empty);
        assert!(matches!(
            CompactedState::parse_validated("{\"project_summary\": \"x\"").unwrap_err(),
            StateValidationError::Schema(_)
        ));
    }
}
