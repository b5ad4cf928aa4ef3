//! The format-independent session: messages in order, and which of them a model call produced.

use serde::Serialize;
use serde_json::{Value, json};

use crate::entry::Role;

/// One message of a recorded session.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TranscriptMessage {
    /// Who said it.
    pub role: Role,
    /// Its text (for tool results: the output).
    pub text: String,
    /// Name of the tool whose result this is, or whose call the assistant made.
    pub tool_name: Option<String>,
    /// When it was recorded, if the format has times (unix milliseconds).
    pub at_ms: Option<u64>,
    /// The message as an OpenAI chat client sends it (and, for an assistant message, as the
    /// upstream answered it): what the strata policy feeds the session engine.
    #[serde(skip)]
    pub wire: Value,
}

impl TranscriptMessage {
    /// A message without tool calls; `index` names a tool result's call (`call_<index>`), which
    /// no assistant message issued.
    pub fn plain(
        role: Role,
        text: String,
        tool_name: Option<String>,
        at_ms: Option<u64>,
        index: usize,
    ) -> Self {
        let wire = match role {
            Role::System => json!({"role": "system", "content": text}),
            Role::User => json!({"role": "user", "content": text}),
            Role::Assistant => json!({"role": "assistant", "content": text}),
            Role::Tool => json!({"role": "tool", "tool_call_id": format!("call_{index}"), "content": text}),
        };
        TranscriptMessage { role, text, tool_name, at_ms, wire }
    }

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
#[derive(Clone, Debug, PartialEq, Serialize)]
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
