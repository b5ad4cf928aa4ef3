//! OpenAI chat messages as turns: the one reading of `messages` shared by the gateway's
//! `/v1/chat/completions` adapter and `strata replay`, so both journal exactly the same turns.

use serde_json::Value;

use crate::entry::{Content, Role, ToolCall, ToolResult};

use super::turn::{Turn, text_of};

/// The system text (system and developer messages, joined) and the other messages as turns.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ParsedMessages {
    /// System texts in order.
    pub system: Vec<String>,
    /// Every other message.
    pub turns: Vec<Turn>,
}

fn message_text(index: usize, message: &Value) -> Result<String, String> {
    text_of(message.get("content").unwrap_or(&Value::Null)).map_err(|part| {
        format!(
            "messages[{index}].content: part type {part} is not supported; the gateway journals text only"
        )
    })
}

/// The tool calls of an assistant message.
fn tool_calls(index: usize, message: &Value) -> Result<Vec<ToolCall>, String> {
    let mut out = Vec::new();
    for (call_index, call) in
        message.get("tool_calls").and_then(Value::as_array).into_iter().flatten().enumerate()
    {
        let field = |name: &str| {
            call.get(name)
                .or_else(|| call.get("function").and_then(|f| f.get(name)))
                .and_then(Value::as_str)
                .ok_or_else(|| format!("messages[{index}].tool_calls[{call_index}]: missing string `{name}`"))
        };
        out.push(ToolCall {
            call_id: field("id")?.to_owned(),
            name: field("name")?.to_owned(),
            arguments_json: field("arguments")?.to_owned(),
        });
    }
    Ok(out)
}

/// Reads one message at position `index`: `Ok(None)` for a system message (its text goes to
/// `system`).
pub fn parse_message(
    index: usize,
    message: &Value,
    system: &mut Vec<String>,
) -> Result<Option<Turn>, String> {
    let role = message.get("role").and_then(Value::as_str).unwrap_or_default();
    Ok(Some(match role {
        "system" | "developer" => {
            system.push(message_text(index, message)?);
            return Ok(None);
        }
        "user" => Turn { role: Role::User, content: Content::text(message_text(index, message)?) },
        "assistant" => {
            let mut content = Content::text(message_text(index, message)?);
            content.tool_calls = tool_calls(index, message)?;
            Turn { role: Role::Assistant, content }
        }
        "tool" => {
            let call_id = message
                .get("tool_call_id")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("messages[{index}]: a tool message needs `tool_call_id`"))?;
            let output = message_text(index, message)?;
            Turn {
                role: Role::Tool,
                content: Content {
                    tool_results: vec![ToolResult { call_id: call_id.to_owned(), name: None, output }],
                    ..Content::default()
                },
            }
        }
        other => return Err(format!("messages[{index}]: role {other:?} is not supported")),
    }))
}

/// Reads a `messages` array.
pub fn parse_messages(messages: &[Value]) -> Result<ParsedMessages, String> {
    let mut parsed = ParsedMessages { system: Vec::new(), turns: Vec::with_capacity(messages.len()) };
    for (index, message) in messages.iter().enumerate() {
        if let Some(turn) = parse_message(index, message, &mut parsed.system)? {
            parsed.turns.push(turn);
        }
    }
    Ok(parsed)
}

/// An assistant turn as an OpenAI message (what a client resends as history, and what an
/// upstream answers).
pub fn assistant_message(content: &Content) -> Value {
    let mut message = serde_json::Map::new();
    message.insert("role".into(), "assistant".into());
    message.insert("content".into(), content.text.clone().into());
    if !content.tool_calls.is_empty() {
        let calls = content
            .tool_calls
            .iter()
            .map(|call| {
                serde_json::json!({
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments_json}
                })
            })
            .collect();
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    Value::Object(message)
}
