//! Small JSON values written straight into a buffer sized for them, in serde_json's key order.
//!
//! The fragments of a request used to be built as `serde_json::Value` maps and then printed: each
//! one copied the entry's text into the map, allocated the map's keys, and printed into a string
//! that grew by doubling. These borrow the text and write it once. serde_json prints a `Value`'s
//! object keys in sorted order (the crate is built without `preserve_order`), so the structs below
//! declare their fields in that order and their bytes equal the maps' (tested).

use serde::Serialize;

/// Room added to a value's largest text for its keys, quotes and escapes.
const SYNTAX_ROOM: usize = 96;

/// `value` as JSON bytes, written into a buffer of `text_len` plus room for the syntax.
pub fn json_bytes(value: &impl Serialize, text_len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(text_len + SYNTAX_ROOM);
    write_json(&mut out, value);
    out
}

/// Appends `value` as JSON to `out`, a buffer in memory.
pub fn write_json(out: impl std::io::Write, value: &impl Serialize) {
    // Writing into memory fails only for a map key that is not a string; these types have none,
    // and `Value` maps have string keys only.
    if let Err(error) = serde_json::to_writer(out, value) {
        debug_assert!(false, "serialising into memory failed: {error}");
    }
}

/// An OpenAI chat message: `{"content":…,"role":…}`, with `tool_call_id` for a tool result and
/// `tool_calls` for an assistant's answered calls (each left out when absent).
#[derive(Serialize)]
pub struct ChatMessage<'a> {
    /// The text.
    pub content: &'a str,
    /// `user`, `system`, `assistant` or `tool`.
    pub role: &'static str,
    /// The call a tool result answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<&'a str>,
    /// An assistant's answered tool calls.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub tool_calls: &'a [OpenAiToolCall<'a>],
}

impl<'a> ChatMessage<'a> {
    /// A message of `content` alone.
    pub fn text(role: &'static str, content: &'a str) -> Self {
        Self { content, role, tool_call_id: None, tool_calls: &[] }
    }

    /// A tool result answering `call_id`.
    pub fn tool(content: &'a str, call_id: &'a str) -> Self {
        Self { content, role: "tool", tool_call_id: Some(call_id), tool_calls: &[] }
    }

    /// An assistant's answer with its answered `calls`.
    pub fn assistant(content: &'a str, calls: &'a [OpenAiToolCall<'a>]) -> Self {
        Self { content, role: "assistant", tool_call_id: None, tool_calls: calls }
    }
}

/// One OpenAI tool call: `{"function":{"arguments":…,"name":…},"id":…,"type":"function"}`.
#[derive(Serialize)]
pub struct OpenAiToolCall<'a> {
    /// The function called.
    pub function: OpenAiFunction<'a>,
    /// The call's ID.
    pub id: &'a str,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// The function of an OpenAI tool call.
#[derive(Serialize)]
pub struct OpenAiFunction<'a> {
    /// The arguments as the model wrote them (JSON text, sent as a string).
    pub arguments: &'a str,
    /// The function's name.
    pub name: &'a str,
}

/// An Anthropic text block: `{"text":…,"type":"text"}`.
#[derive(Serialize)]
pub struct TextBlock<'a> {
    /// The text.
    pub text: &'a str,
    /// Always `text`.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

impl<'a> TextBlock<'a> {
    /// A text block of `text`.
    pub fn of(text: &'a str) -> Self {
        Self { text, kind: "text" }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TEXTS: [&str; 5] = [
        "",
        "plain words",
        "quotes \" and \\ backslashes, a tab\t, a newline\n and a bell \u{7}",
        "non-ASCII: é, 漢字, 🦀 and a lone control \u{1f}",
        "{\"looks\": [\"like\", \"json\"]}",
    ];

    #[test]
    fn messages_print_the_bytes_of_the_maps_they_replace() {
        for text in TEXTS {
            let user = json_bytes(&ChatMessage::text("user", text), text.len());
            assert_eq!(user, json!({"role": "user", "content": text}).to_string().into_bytes());
            let tool = json_bytes(&ChatMessage::tool(text, "call_1"), 0);
            let expected = json!({"role": "tool", "tool_call_id": "call_1", "content": text});
            assert_eq!(tool, expected.to_string().into_bytes());
            let block = json_bytes(&TextBlock::of(text), 0);
            assert_eq!(block, json!({"type": "text", "text": text}).to_string().into_bytes());
        }
    }

    #[test]
    fn assistant_messages_print_the_bytes_of_the_maps_they_replace() {
        for text in TEXTS {
            let calls = [OpenAiToolCall {
                function: OpenAiFunction { arguments: text, name: "read_file" },
                id: "call_9",
                kind: "function",
            }];
            let with_calls = json_bytes(&ChatMessage::assistant(text, &calls), 0);
            let expected = json!({
                "role": "assistant",
                "content": text,
                "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "read_file", "arguments": text}}]
            });
            assert_eq!(with_calls, expected.to_string().into_bytes());
            let without = json_bytes(&ChatMessage::assistant(text, &[]), 0);
            assert_eq!(without, json!({"role": "assistant", "content": text}).to_string().into_bytes());
        }
    }
}
