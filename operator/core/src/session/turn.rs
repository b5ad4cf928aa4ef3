//! Provider-neutral request and response shapes shared by the OpenAI and Anthropic adapters.

use crate::entry::{Content, EntryKind, Role, ToolCall};
use crate::session::transparent::ChainHash;
use serde_json::{Map, Value};

/// Which client-facing API a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    OpenAi,
    /// `POST /v1/messages`.
    Anthropic,
}

/// One client message, split so that every tool result is its own turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    /// Producer.
    pub role: Role,
    /// Text and tool traffic exactly as the client sent it.
    pub content: Content,
}

impl Turn {
    /// Whether this is a user turn with text: the latest such turn is what the engine ranks lazy
    /// tools by, and what a transparent client's message memo keeps whole.
    pub fn has_user_text(&self) -> bool {
        self.role == Role::User && !self.content.text.trim().is_empty()
    }

    /// The journal kind of this turn.
    pub fn kind(&self) -> EntryKind {
        if !self.content.tool_results.is_empty() {
            EntryKind::ToolResult
        } else if !self.content.tool_calls.is_empty() {
            EntryKind::ToolCall
        } else {
            EntryKind::Message
        }
    }
}

/// A chat request in neutral form.
#[derive(Clone, Debug)]
pub struct ChatRequest {
    /// The API it came in on.
    pub api: Api,
    /// Whether the client asked for SSE.
    pub stream: bool,
    /// System text the client sent (joined), part of Tier 1.
    pub system_text: String,
    /// Non-system messages in order.
    pub turns: Vec<Turn>,
    /// Client tool schemas in the API's own shape, shared: the same block a client resends is
    /// the same value ([`crate::session::tool_block::ToolBlocks`]).
    pub tools: crate::session::tool_block::Tools,
    /// Other request fields, forwarded unchanged (temperature, max_tokens, tool_choice, …).
    pub params: Map<String, Value>,
    /// OpenAI streaming: whether the client asked for the usage chunk.
    pub wants_usage: bool,
    /// Transparent sessions: chain values of the leading turns that are already known (from a
    /// [`super::message_memo::MessageMemo`]); `known_chains[i]` is the value after `turns[i]`.
    pub known_chains: Vec<ChainHash>,
    /// Transparent sessions: how many leading turns may have come without their content (a memo
    /// keeps only the chain values of the assistant and tool turns it reuses). The engine never
    /// journals one of them: when it would have to, it answers
    /// [`super::engine::TurnOutcome::NeedsWholeHistory`] and changes nothing.
    pub hollow_turns: usize,
}

impl ChatRequest {
    /// A non-streaming request of `turns` under `system_text`, with no tools and no parameters (how
    /// replay, the tests and the benches speak to the engine).
    pub fn plain(api: Api, system_text: impl Into<String>, turns: Vec<Turn>) -> Self {
        ChatRequest {
            api,
            stream: false,
            system_text: system_text.into(),
            turns,
            tools: Default::default(),
            params: Map::new(),
            wants_usage: false,
            known_chains: Vec::new(),
            hollow_turns: 0,
        }
    }
}

/// Token usage as reported by the provider.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// All prompt tokens (fresh + cached + cache writes).
    pub prompt_tokens: u64,
    /// Prompt tokens read from the provider's cache.
    pub cached_tokens: u64,
    /// Prompt tokens written to the provider's cache (Anthropic).
    pub cache_write_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
}

impl Usage {
    /// Prompt tokens that were neither read from nor written to the cache.
    pub fn fresh_tokens(&self) -> u64 {
        self.prompt_tokens.saturating_sub(self.cached_tokens).saturating_sub(self.cache_write_tokens)
    }

    /// Adds another call's usage.
    pub fn add(&mut self, other: &Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.cached_tokens += other.cached_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
        self.completion_tokens += other.completion_tokens;
    }
}

/// What the model answered in one upstream call.
#[derive(Clone, Debug, Default)]
pub struct AssistantOutput {
    /// Upstream response id.
    pub id: String,
    /// Text.
    pub text: String,
    /// Tool calls in order (memory tools included).
    pub tool_calls: Vec<ToolCall>,
    /// `finish_reason` (OpenAI) or `stop_reason` (Anthropic).
    pub stop_reason: String,
    /// Usage, when reported.
    pub usage: Option<Usage>,
    /// The full upstream JSON (non-streaming), used to answer the client in the provider's shape.
    pub raw: Option<Value>,
}

impl AssistantOutput {
    /// A copy without the upstream's raw JSON, which only the client's answer is built from.
    pub fn without_raw(&self) -> AssistantOutput {
        AssistantOutput {
            id: self.id.clone(),
            text: self.text.clone(),
            tool_calls: self.tool_calls.clone(),
            stop_reason: self.stop_reason.clone(),
            usage: self.usage,
            raw: None,
        }
    }

    /// The assistant turn as the client sees it: memory tool calls removed.
    pub fn visible_turn(&self, is_memory_tool: impl Fn(&str) -> bool) -> Turn {
        Turn {
            role: Role::Assistant,
            content: Content {
                text: self.text.clone(),
                tool_calls: self.tool_calls.iter().filter(|c| !is_memory_tool(&c.name)).cloned().collect(),
                tool_results: Vec::new(),
            },
        }
    }
}

/// Text of a content value that is either a string or an array of `{type: "text", text}` parts.
/// Returns `Err(type)` naming the first part type that is not text.
pub fn text_of(content: &Value) -> Result<String, String> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") | Some("input_text") | Some("output_text") => {
                        texts.push(part.get("text").and_then(Value::as_str).unwrap_or_default().to_owned())
                    }
                    Some(other) => return Err(other.to_owned()),
                    None => return Err("(missing type)".to_owned()),
                }
            }
            Ok(texts.join("\n"))
        }
        other => Err(format!("{other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_without_raw_keeps_everything_else() {
        let output = AssistantOutput {
            id: "chatcmpl-1".into(),
            text: "done".into(),
            tool_calls: vec![ToolCall {
                call_id: "c1".into(),
                name: "grep".into(),
                arguments_json: "{}".into(),
            }],
            stop_reason: "tool_calls".into(),
            usage: Some(Usage { prompt_tokens: 10, completion_tokens: 2, ..Usage::default() }),
            raw: Some(serde_json::json!({"id": "chatcmpl-1"})),
        };
        let copy = output.without_raw();
        assert_eq!(copy.raw, None);
        assert_eq!(
            (copy.id, copy.text, copy.tool_calls, copy.stop_reason, copy.usage),
            (output.id, output.text, output.tool_calls, output.stop_reason, output.usage)
        );
    }
}
