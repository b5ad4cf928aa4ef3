//! One deterministic pass over the entries being compacted that collects what must survive:
//! requests, objective, constraints, decisions, tasks, questions, tool state, files and references.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::artifacts::ArtifactRef;
use crate::entry::{Entry, EntryId, Role};

use super::signals::{self, CommandEffect, LineSignal};
use super::state::{CompactedState, PendingAction, SourcedItem};

/// Longest text kept for one extracted line.
pub const MAX_ITEM_CHARS: usize = 320;
/// Longest text kept for a request or objective.
pub const MAX_REQUEST_CHARS: usize = 1200;

/// What the pattern pass found in a delta (plus what carries over from the previous state).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    /// The latest explicit `Objective:` line.
    pub objective: Option<SourcedItem>,
    /// The first request from the user (the task the agent was given).
    pub first_request: Option<SourcedItem>,
    /// The latest request from the user.
    pub current_request: Option<SourcedItem>,
    /// Constraint lines, oldest first, deduplicated.
    pub constraints: Vec<SourcedItem>,
    /// Decision lines.
    pub decisions: Vec<SourcedItem>,
    /// TODO and next-step lines.
    pub todos: Vec<SourcedItem>,
    /// Done lines and milestones (final patch, submission).
    pub done: Vec<SourcedItem>,
    /// Blocker lines and the errors of the latest failing tool output.
    pub blockers: Vec<SourcedItem>,
    /// Approvals.
    pub approvals: Vec<SourcedItem>,
    /// Questions still open: previous ones not resolved, plus new ones.
    pub open_questions: Vec<SourcedItem>,
    /// Tool calls without a result: previous ones not answered, plus new ones.
    pub pending_actions: Vec<PendingAction>,
    /// Commands and tool calls that changed something.
    pub side_effects: Vec<SourcedItem>,
    /// Files, most important first: changed by a diff, then edited, then mentioned.
    pub files: Vec<String>,
    /// Files changed by a diff in the source.
    pub diff_files: BTreeSet<String>,
    /// Artifact references carried by the entries.
    pub artifact_refs: Vec<ArtifactRef>,
    /// Entries whose text yielded at least one finding.
    pub evidence_ids: Vec<EntryId>,
}

/// Accumulates items, merging repeats of the same text (by normalised words).
#[derive(Default)]
struct ItemList {
    items: Vec<SourcedItem>,
    index: HashMap<String, usize>,
}

impl ItemList {
    fn seeded(items: &[SourcedItem]) -> Self {
        let mut list = Self::default();
        for item in items {
            for id in &item.source_ids {
                list.push_raw(&item.text, id);
            }
            if item.source_ids.is_empty() {
                list.push_raw(&item.text, "");
            }
        }
        list
    }

    fn push(&mut self, text: &str, source: EntryId) {
        self.push_raw(text, &source.to_string());
    }

    fn push_raw(&mut self, text: &str, source: &str) {
        let key = signals::words(text).join(" ");
        if key.is_empty() {
            return;
        }
        let position = *self.index.entry(key).or_insert_with(|| {
            self.items.push(SourcedItem { text: clip(text, MAX_ITEM_CHARS), source_ids: Vec::new() });
            self.items.len() - 1
        });
        let sources = &mut self.items[position].source_ids;
        if !source.is_empty() && !sources.iter().any(|s| s == source) {
            sources.push(source.to_owned());
        }
    }
}

/// `text` cut to at most `max` characters at a character boundary, marked with `…` when cut.
pub fn clip(text: &str, max: usize) -> String {
    let trimmed = text.trim();
    match trimmed.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &trimmed[..cut]),
        None => trimmed.to_owned(),
    }
}

/// Runs the pattern pass over `delta` (the entries since the previous state, in journal order),
/// starting from `previous`. `answered_calls` are call IDs answered anywhere in the snapshot.
pub fn find(
    previous: Option<&CompactedState>,
    delta: &[&Entry],
    answered_calls: &HashSet<String>,
) -> Findings {
    let empty = CompactedState::default();
    let previous_state = previous.unwrap_or(&empty);
    let mut constraints = ItemList::seeded(&previous_state.hard_constraints);
    let mut decisions = ItemList::seeded(&previous_state.decisions);
    let mut todos = ItemList::seeded(&previous_state.current_tasks);
    let mut done = ItemList::seeded(&previous_state.completed_tasks);
    let mut blockers = ItemList::seeded(&previous_state.blockers);
    let mut approvals = ItemList::seeded(&previous_state.tool_state.approvals);
    let mut questions = ItemList::seeded(&previous_state.open_questions);
    let mut side_effects = ItemList::seeded(&previous_state.tool_state.side_effects);
    let mut resolutions: Vec<String> = Vec::new();
    let mut findings = Findings::default();
    let mut evidence: BTreeSet<EntryId> = BTreeSet::new();
    let mut diff_files: Vec<String> = Vec::new();
    let mut edited_files: Vec<String> = Vec::new();
    let mut mentioned_files: Vec<String> = previous_state.affected_files.clone();
    let mut artifact_refs: BTreeSet<ArtifactRef> = BTreeSet::new();
    let mut pending: Vec<PendingAction> = previous_state
        .tool_state
        .pending_actions
        .iter()
        .filter(|action| !answered_calls.contains(&action.call_id))
        .cloned()
        .collect();
    let mut latest_tool_output: Option<&Entry> = None;
    let mut last_user_question: Option<(EntryId, Vec<String>)> = None;

    for entry in delta {
        let tool_output = signals::is_tool_output(entry);
        artifact_refs.extend(entry.artifact_refs.iter().cloned());
        let files = signals::diff_files(&entry.content.text);
        if !files.is_empty() {
            evidence.insert(entry.id);
            diff_files.extend(files);
        }
        if tool_output {
            latest_tool_output = Some(entry);
            for result in &entry.content.tool_results {
                let files = signals::diff_files(&result.output);
                if !files.is_empty() {
                    evidence.insert(entry.id);
                    diff_files.extend(files);
                }
                for question in signals::envelope_open_questions(&result.output) {
                    questions.push(&question, entry.id);
                    evidence.insert(entry.id);
                }
            }
            for question in signals::envelope_open_questions(&entry.content.text) {
                questions.push(&question, entry.id);
                evidence.insert(entry.id);
            }
        } else if entry.role == Role::User {
            let item = SourcedItem::new(clip(&entry.content.text, MAX_REQUEST_CHARS), entry.id);
            if !item.text.is_empty() {
                if findings.first_request.is_none() && previous_state.active_objective.is_empty() {
                    findings.first_request = Some(item.clone());
                }
                findings.current_request = Some(item);
            }
            let asks: Vec<String> = entry
                .content
                .text
                .lines()
                .map(signals::strip_bullet)
                .filter(|line| line.ends_with('?') && line.len() > 3)
                .map(str::to_owned)
                .collect();
            last_user_question = (!asks.is_empty()).then_some((entry.id, asks));
        } else if entry.role == Role::Assistant && last_user_question.is_some() {
            last_user_question = None;
        }
        if !tool_output {
            mentioned_files.extend(signals::file_paths(&entry.content.text));
        }
        for call in &entry.content.tool_calls {
            let command = format!("{} {}", call.name, call.arguments_json);
            if !answered_calls.contains(&call.call_id) {
                pending.push(PendingAction {
                    call_id: call.call_id.clone(),
                    tool: call.name.clone(),
                    arguments: clip(&call.arguments_json, MAX_ITEM_CHARS),
                    source_id: entry.id.to_string(),
                });
            }
            match signals::command_effect(&command) {
                Some(CommandEffect::SideEffect) => {
                    side_effects.push(&command, entry.id);
                    edited_files.extend(signals::file_paths(&call.arguments_json));
                }
                Some(CommandEffect::Milestone) => done.push(&command, entry.id),
                None => {}
            }
        }
        if entry.role == Role::Assistant {
            for command in signals::fenced_commands(&entry.content.text) {
                match signals::command_effect(command) {
                    Some(CommandEffect::SideEffect) => {
                        side_effects.push(&format!("ran `{command}`"), entry.id);
                        edited_files.extend(signals::file_paths(command));
                        evidence.insert(entry.id);
                    }
                    Some(CommandEffect::Milestone) => {
                        done.push(&format!("ran `{command}`"), entry.id);
                        evidence.insert(entry.id);
                    }
                    None => {}
                }
            }
        }
        for line in entry.content.text.lines() {
            let Some(signal) = signals::classify(entry.role, tool_output, line) else { continue };
            let text = signals::strip_bullet(line);
            evidence.insert(entry.id);
            match signal {
                LineSignal::Objective => {
                    findings.objective = Some(SourcedItem::new(clip(text, MAX_ITEM_CHARS), entry.id))
                }
                LineSignal::Decision => decisions.push(text, entry.id),
                LineSignal::Constraint => constraints.push(text, entry.id),
                LineSignal::Question => questions.push(text, entry.id),
                LineSignal::Resolution => resolutions.push(text.to_owned()),
                LineSignal::Todo => todos.push(text, entry.id),
                LineSignal::Done => done.push(text, entry.id),
                LineSignal::Blocker => blockers.push(text, entry.id),
                LineSignal::Approval => approvals.push(text, entry.id),
            }
        }
    }
    if let Some((id, asks)) = last_user_question {
        for ask in asks {
            questions.push(&ask, id);
        }
    }
    if let Some(entry) = latest_tool_output
        && let Some(error) = failure_summary(entry)
    {
        blockers.push(&error, entry.id);
        evidence.insert(entry.id);
    }

    findings.constraints = constraints.items;
    findings.decisions = decisions.items;
    findings.todos = todos.items;
    findings.done = done.items;
    findings.blockers = blockers.items;
    findings.approvals = approvals.items;
    findings.side_effects = side_effects.items;
    findings.open_questions = questions
        .items
        .into_iter()
        .filter(|question| !resolutions.iter().any(|answer| resolves(answer, &question.text)))
        .collect();
    let mut seen_calls = HashSet::new();
    pending.retain(|action| seen_calls.insert(action.call_id.clone()));
    findings.pending_actions = pending;
    findings.diff_files = diff_files.iter().cloned().collect();
    findings.files = rank_files(diff_files, edited_files, mentioned_files);
    findings.artifact_refs = artifact_refs.into_iter().collect();
    findings.evidence_ids = evidence.into_iter().collect();
    findings
}

/// Whether a `Resolved:` line answers `question`: it quotes most of the question's words.
fn resolves(answer: &str, question: &str) -> bool {
    let body = answer.split_once(':').map_or(answer, |(_, rest)| rest);
    let question_body = question.split_once(':').map_or(question, |(_, rest)| rest);
    signals::represented_in(question_body, body)
}

/// The error lines of a failing tool output (non-zero `<returncode>`, a traceback or `error:`).
fn failure_summary(entry: &Entry) -> Option<String> {
    let text = if entry.content.text.trim().is_empty() {
        entry.content.tool_results.iter().map(|r| r.output.as_str()).collect::<Vec<_>>().join("\n")
    } else {
        entry.content.text.clone()
    };
    let nonzero = text
        .trim_start()
        .strip_prefix("<returncode>")
        .and_then(|rest| rest.split_once("</returncode>"))
        .is_some_and(|(code, _)| code.trim() != "0");
    let error_lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|line| {
            let lower = line.to_ascii_lowercase();
            lower.starts_with("error")
                || lower.contains("error:")
                || lower.contains("exception:")
                || lower.starts_with("traceback")
                || lower.starts_with("failed")
        })
        .collect();
    if !nonzero && error_lines.is_empty() {
        return None;
    }
    let detail = error_lines.last().copied().unwrap_or("non-zero exit status");
    Some(clip(&format!("last tool output failed: {detail}"), MAX_ITEM_CHARS))
}

/// Files changed by diffs first, then edited files, then the most recently mentioned; no repeats.
fn rank_files(diff: Vec<String>, edited: Vec<String>, mentioned: Vec<String>) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut ranked = Vec::new();
    for file in diff.into_iter().chain(edited).chain(mentioned.into_iter().rev()) {
        if seen.insert(file.clone()) {
            ranked.push(file);
        }
    }
    ranked
}
