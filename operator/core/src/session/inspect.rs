//! What the Context Inspector shows of a session beyond its packet: the context events of each model
//! call (spill, elision, expiry, deduplication, compaction, purge) and one entry's journaled content.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use regex::Regex;
use serde::Serialize;

use super::engine::{AdmittedTurn, AnswerEffects, SessionEngine};
use crate::artifacts::ArtifactRef;
use crate::compiler::InclusionReason;
use crate::entry::{Entry, RetentionClass, Role};

/// Something Strata did to the context at one model call, as the timeline marks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextEvent {
    /// A large tool output moved to the artifact store.
    Spill,
    /// A repeated tool output replaced by a reference to the first copy.
    Dedup,
    /// A batch of old results cut to their head plus a `data_ref`.
    Elision,
    /// A batch of entries past their retention TTL left the window.
    Expiry,
    /// History replaced by a compacted state.
    Compaction,
    /// Entries purged by the model.
    Purge,
    /// The journal rewound to the client's history (a transparent client edited, retried or
    /// restarted its conversation).
    Rewind,
    /// A delegation's result entered as a bounded digest (the full result in the artifact store).
    Digest,
    /// Full tool schemas loaded on the model's demand (lazy schemas).
    SchemaLoad,
}

impl AdmittedTurn {
    /// The events of admitting the turn: spills, deduplication and any compaction made to fit it.
    pub fn events(&self) -> Vec<ContextEvent> {
        let mut events = Vec::new();
        if self.spilled_outputs > 0 {
            events.push(ContextEvent::Spill);
        }
        if self.deduplicated_outputs > 0 {
            events.push(ContextEvent::Dedup);
        }
        if self.compactions > 0 {
            events.push(ContextEvent::Compaction);
        }
        if self.rewind.is_some() {
            events.push(ContextEvent::Rewind);
        }
        if !self.digests.is_empty() {
            events.push(ContextEvent::Digest);
        }
        events
    }
}

impl AnswerEffects {
    /// The events of recording an answer: elision and expiry batches, and the memory tools' purges
    /// and compactions.
    pub fn events(&self) -> Vec<ContextEvent> {
        let mut events = Vec::new();
        if self.elided_entries > 0 {
            events.push(ContextEvent::Elision);
        }
        if self.expired_entries > 0 {
            events.push(ContextEvent::Expiry);
        }
        if self.purges > 0 {
            events.push(ContextEvent::Purge);
        }
        if self.compactions > 0 {
            events.push(ContextEvent::Compaction);
        }
        if self.tools_loaded > 0 {
            events.push(ContextEvent::SchemaLoad);
        }
        events
    }
}

/// One journal entry as the Inspector opens it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryDetail {
    /// Entry ID.
    pub id: String,
    /// Producer.
    pub role: Role,
    /// Retention class.
    pub retention: RetentionClass,
    /// Journaled tokens.
    pub tokens: u64,
    /// Why it is (not) in the window.
    pub reason: InclusionReason,
    /// The content as journaled (after redaction): text, tool calls and tool results.
    pub text: String,
    /// Artifacts that hold this entry's full output: spilled bodies named in the text, and the
    /// elided copy when the window shows only its head.
    pub data_refs: Vec<String>,
}

fn artifact_ref_pattern() -> &'static Regex {
    static PATTERN: OnceLock<Regex> = OnceLock::new();
    PATTERN
        .get_or_init(|| Regex::new(r"art:sha256:[0-9a-f]{64}").expect("constant artifact pattern compiles"))
}

fn entry_text(entry: &Entry) -> String {
    let mut parts = Vec::new();
    if !entry.content.text.is_empty() {
        parts.push(entry.content.text.clone());
    }
    for call in &entry.content.tool_calls {
        parts.push(format!("→ tool call {} {}({})", call.call_id, call.name, call.arguments_json));
    }
    for result in &entry.content.tool_results {
        parts.push(format!("← result of {}:\n{}", result.call_id, result.output));
    }
    parts.join("\n")
}

/// The artifacts that hold an entry's full output: its spilled bodies, and the stored copy when the
/// window shows only its head (elided), a stub (expired) or a reference (duplicate).
pub(crate) fn data_refs(entry: &Entry, reason: InclusionReason) -> BTreeSet<String> {
    let mut refs: BTreeSet<String> = entry.artifact_refs.iter().map(ToString::to_string).collect();
    if matches!(reason, InclusionReason::Elided | InclusionReason::Expired | InclusionReason::Duplicate) {
        for result in &entry.content.tool_results {
            refs.insert(ArtifactRef::for_bytes(result.output.as_bytes()).to_string());
        }
    }
    refs
}

impl SessionEngine {
    /// The journaled content of entry `id` of the live generation, or `None` when there is no such
    /// entry.
    pub fn entry_detail(&self, id: &str) -> Option<EntryDetail> {
        let entry = self.journal().entries().iter().find(|entry| entry.id.to_string() == id)?;
        let reason = self
            .decisions()
            .into_iter()
            .find(|decision| decision.tier == 2 && decision.id == id)
            .map_or(InclusionReason::Journal, |decision| decision.reason);
        let text = entry_text(entry);
        let mut refs = data_refs(entry, reason);
        refs.extend(artifact_ref_pattern().find_iter(&text).map(|found| found.as_str().to_owned()));
        Some(EntryDetail {
            id: id.to_owned(),
            role: entry.role,
            retention: entry.retention,
            tokens: entry.tokens,
            reason,
            text,
            data_refs: refs.into_iter().collect(),
        })
    }
}
