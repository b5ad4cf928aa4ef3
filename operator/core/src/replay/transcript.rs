//! The format-independent session: messages in order, and which of them a model call produced.

use serde::Serialize;

use crate::entry::Role;

/// One message of a recorded session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TranscriptMessage {
    /// Who said it.
    pub role: Role,
    /// Its text (for tool results: the output).
    pub text: String,
    /// Name of the tool whose result this is, or whose call the assistant made.
    pub tool_name: Option<String>,
    /// When it was recorded, if the format has times (unix milliseconds).
    pub at_ms: Option<u64>,
}

impl TranscriptMessage {
    /// Whether this message is a tool result.
    pub fn is_tool_result(&self) -> bool {
        self.role == Role::Tool
    }
}

/// What the provider reported for one call, when the input has it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RecordedUsage {
    /// Prompt (input) tokens billed.
    pub prompt_tokens: u64,
    /// Of which served from the cache.
    pub cached_tokens: u64,
}

/// A recorded session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Transcript {
    /// Where it came from (file name).
    pub name: String,
    /// Every message, in order.
    pub messages: Vec<TranscriptMessage>,
    /// Model calls: the index of the assistant message each produced (its prompt is every message
    /// before it), with the recorded usage when present.
    pub calls: Vec<(usize, Option<RecordedUsage>)>,
}

impl Transcript {
    /// Build the call list from the assistant messages.
    pub fn new(name: String, messages: Vec<TranscriptMessage>, usage: Vec<Option<RecordedUsage>>) -> Self {
        let calls: Vec<(usize, Option<RecordedUsage>)> = messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m.role == Role::Assistant)
            .map(|(index, _)| index)
            .zip(usage.into_iter().chain(std::iter::repeat(None)))
            .collect();
        Transcript { name, messages, calls }
    }
}
