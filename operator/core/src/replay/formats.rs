//! Input formats: mini-swe-agent trajectories, pi-style session JSONL, and plain OpenAI `messages`.

use serde_json::{Value, json};

use crate::entry::{Content, Role, ToolCall};
use crate::session::openai_messages::assistant_message;

use super::transcript::{RecordedUsage, Transcript, TranscriptMessage};

/// A supported input format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputFormat {
    /// Detect from the content.
    Auto,
    /// mini-swe-agent trajectory JSON (`messages`, tool output as `<returncode>` user messages).
    MiniSweAgent,
    /// pi-style session JSONL (`type: session | message | ...`).
    PiSession,
    /// A JSON array of OpenAI chat messages, or an object with `messages`.
    OpenAiMessages,
}

impl InputFormat {
    /// Parse the command-line name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "auto" => Some(InputFormat::Auto),
            "mini-swe-agent" => Some(InputFormat::MiniSweAgent),
            "pi-session" => Some(InputFormat::PiSession),
            "openai-messages" => Some(InputFormat::OpenAiMessages),
            _ => None,
        }
    }
}

/// Input that cannot be read as a session.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    /// Not JSON / JSONL at the given place.
    #[error("{name}: invalid JSON at {location}: {message}")]
    Json {
        /// Input name.
        name: String,
        /// Line and column, or `line N` for JSONL.
        location: String,
        /// Parser message.
        message: String,
    },
    /// JSON of an unknown shape.
    #[error(
        "{name}: not a recognised session ({reason}); expected a mini-swe-agent trajectory, pi-session JSONL or OpenAI messages (see --format)"
    )]
    Unrecognised {
        /// Input name.
        name: String,
        /// What was found.
        reason: String,
    },
    /// A message without the fields its format requires.
    #[error("{name}: {location}: {message}")]
    BadMessage {
        /// Input name.
        name: String,
        /// Where (e.g. `messages[4]` or `line 12`).
        location: String,
        /// What is wrong.
        message: String,
    },
    /// No model call in the session.
    #[error("{name}: the session has no assistant message, so there is no model call to replay")]
    NoCalls {
        /// Input name.
        name: String,
    },
}

/// Parse `text` (the content of the file `name`) as a session.
pub fn parse_transcript(name: &str, text: &str, format: InputFormat) -> Result<Transcript, FormatError> {
    let format = match format {
        InputFormat::Auto => detect(name, text)?,
        other => other,
    };
    let transcript = match format {
        InputFormat::PiSession => parse_pi_session(name, text)?,
        InputFormat::MiniSweAgent | InputFormat::OpenAiMessages | InputFormat::Auto => {
            let value = parse_json(name, text)?;
            parse_messages_document(name, &value, format == InputFormat::MiniSweAgent)?
        }
    };
    if transcript.calls.is_empty() {
        return Err(FormatError::NoCalls { name: name.into() });
    }
    Ok(transcript)
}

fn parse_json(name: &str, text: &str) -> Result<Value, FormatError> {
    serde_json::from_str(text).map_err(|e| FormatError::Json {
        name: name.into(),
        location: format!("line {}, column {}", e.line(), e.column()),
        message: e.to_string(),
    })
}

fn detect(name: &str, text: &str) -> Result<InputFormat, FormatError> {
    let trimmed = text.trim_start();
    if let Some(first_line) = trimmed.lines().next()
        && let Ok(Value::Object(first)) = serde_json::from_str::<Value>(first_line)
        && first.get("type").and_then(Value::as_str) == Some("session")
    {
        return Ok(InputFormat::PiSession);
    }
    let value = parse_json(name, text)?;
    match &value {
        Value::Object(map) if map.contains_key("messages") => {
            let mini = map.contains_key("info")
                || map["messages"].as_array().is_some_and(|m| {
                    m.iter().any(|msg| {
                        msg.get("content")
                            .and_then(Value::as_str)
                            .is_some_and(|c| c.starts_with("<returncode>"))
                    })
                });
            Ok(if mini { InputFormat::MiniSweAgent } else { InputFormat::OpenAiMessages })
        }
        Value::Array(_) => Ok(InputFormat::OpenAiMessages),
        _ => Err(FormatError::Unrecognised { name: name.into(), reason: "no `messages` array".into() }),
    }
}

fn role_of(name: &str, location: &str, role: Option<&str>) -> Result<Role, FormatError> {
    match role {
        Some("system") | Some("developer") => Ok(Role::System),
        Some("user") => Ok(Role::User),
        Some("assistant") => Ok(Role::Assistant),
        Some("tool") | Some("toolResult") | Some("function") => Ok(Role::Tool),
        other => Err(FormatError::BadMessage {
            name: name.into(),
            location: location.into(),
            message: format!("unknown role {other:?}: expected system, user, assistant or tool"),
        }),
    }
}

/// Text of an OpenAI-style `content`: a string, or an array of parts with `text`.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str).or_else(|| p.as_str()))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn parse_messages_document(
    name: &str,
    value: &Value,
    mini_swe_agent: bool,
) -> Result<Transcript, FormatError> {
    let messages = match value {
        Value::Array(items) => items,
        Value::Object(map) => map.get("messages").and_then(Value::as_array).ok_or_else(|| {
            FormatError::Unrecognised { name: name.into(), reason: "`messages` is not an array".into() }
        })?,
        _ => {
            return Err(FormatError::Unrecognised {
                name: name.into(),
                reason: "not an object or array".into(),
            });
        }
    };
    let mut out = Vec::with_capacity(messages.len());
    let mut usage = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        let location = format!("messages[{index}]");
        let mut role = role_of(name, &location, message.get("role").and_then(Value::as_str))?;
        let mut text = content_text(message.get("content").unwrap_or(&Value::Null));
        let mut tool_name = None;
        if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
            for call in calls {
                let function = &call["function"];
                tool_name = function.get("name").and_then(Value::as_str).map(str::to_string);
                text.push_str(&format!(
                    "\n{}({})",
                    tool_name.as_deref().unwrap_or("tool"),
                    function.get("arguments").and_then(Value::as_str).unwrap_or_default()
                ));
            }
        }
        let mut wire = message.clone();
        if mini_swe_agent && role == Role::User && text.starts_with("<returncode>") {
            role = Role::Tool;
            tool_name = Some("bash".into());
            // The observation goes to the engine as the tool result it is. Its call was never
            // issued as a tool call, so the gateway renders it upstream as the user message
            // mini-swe-agent sends.
            wire = json!({"role": "tool", "tool_call_id": format!("call_{index}"), "content": text});
        }
        let response = message.pointer("/extra/response");
        let at_ms = response.and_then(|r| r.get("created")).and_then(Value::as_u64).map(|s| s * 1000);
        if role == Role::Assistant {
            usage.push(response.and_then(|r| r.get("usage")).and_then(|u| {
                Some(RecordedUsage {
                    prompt_tokens: u.get("prompt_tokens")?.as_u64()?,
                    cached_tokens: u
                        .pointer("/prompt_tokens_details/cached_tokens")
                        .and_then(Value::as_u64)
                        .unwrap_or(0),
                })
            }));
        }
        if tool_name.is_none() {
            tool_name = message.get("name").and_then(Value::as_str).map(str::to_string);
        }
        out.push(TranscriptMessage { role, text, tool_name, at_ms, wire });
    }
    Ok(Transcript::new(name.into(), out, usage))
}

fn parse_pi_session(name: &str, text: &str) -> Result<Transcript, FormatError> {
    let mut out = Vec::new();
    let mut usage = Vec::new();
    for (number, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let location = format!("line {}", number + 1);
        let record: Value = serde_json::from_str(line).map_err(|e| FormatError::Json {
            name: name.into(),
            location: location.clone(),
            message: e.to_string(),
        })?;
        if record.get("type").and_then(Value::as_str) != Some("message") {
            continue;
        }
        let message = record.get("message").ok_or_else(|| FormatError::BadMessage {
            name: name.into(),
            location: location.clone(),
            message: "a `message` record without `message`".into(),
        })?;
        let role = role_of(name, &location, message.get("role").and_then(Value::as_str))?;
        let at_ms = message.get("timestamp").and_then(Value::as_u64);
        let mut text = String::new();
        let mut calls = Vec::new();
        let mut tool_name = message.get("toolName").and_then(Value::as_str).map(str::to_string);
        for block in message.get("content").and_then(Value::as_array).into_iter().flatten() {
            match block.get("type").and_then(Value::as_str) {
                Some("text") | Some("thinking") => {
                    let part = block.get("text").or_else(|| block.get("thinking")).and_then(Value::as_str);
                    if let Some(part) = part {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(part);
                    }
                }
                Some("toolCall") => {
                    let call_name = block.get("name").and_then(Value::as_str).unwrap_or("tool");
                    tool_name = Some(call_name.to_string());
                    let arguments = block.get("arguments").cloned().unwrap_or(Value::Null).to_string();
                    let id = block
                        .get("id")
                        .and_then(Value::as_str)
                        .map_or_else(|| format!("call_{}_{}", out.len(), calls.len()), str::to_string);
                    calls.push(ToolCall {
                        call_id: id,
                        name: call_name.to_string(),
                        arguments_json: arguments,
                    });
                }
                _ => {}
            }
        }
        if let Some(content) = message.get("content").and_then(Value::as_str) {
            text.push_str(content);
        }
        let wire = match role {
            Role::Assistant => assistant_message(&Content {
                text: text.clone(),
                tool_calls: calls.clone(),
                ..Content::default()
            }),
            Role::Tool => {
                let call_id = message
                    .get("toolCallId")
                    .and_then(Value::as_str)
                    .map_or_else(|| format!("call_{}", out.len()), str::to_string);
                json!({"role": "tool", "tool_call_id": call_id, "content": text})
            }
            Role::User => json!({"role": "user", "content": text}),
            Role::System => json!({"role": "system", "content": text}),
        };
        // The anchors count tool calls as text, as the recorded prompt carried them.
        for call in &calls {
            text.push_str(&format!("\n{}({})", call.name, call.arguments_json));
        }
        if role == Role::Assistant {
            usage.push(message.get("usage").map(|u| {
                let fresh = u.get("input").and_then(Value::as_u64).unwrap_or(0);
                let read = u.get("cacheRead").and_then(Value::as_u64).unwrap_or(0);
                let write = u.get("cacheWrite").and_then(Value::as_u64).unwrap_or(0);
                RecordedUsage { prompt_tokens: fresh + read + write, cached_tokens: read }
            }));
        }
        out.push(TranscriptMessage { role, text, tool_name, at_ms, wire });
    }
    Ok(Transcript::new(name.into(), out, usage))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn mini_swe_agent_tool_output_and_usage() {
        let text = r#"{"info": {}, "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Fix the bug."},
            {"role": "assistant", "content": "THOUGHT: look\n```bash\nls\n```",
             "extra": {"response": {"created": 1700000000, "usage": {"prompt_tokens": 120, "prompt_tokens_details": {"cached_tokens": 64}}}}},
            {"role": "user", "content": "<returncode>0</returncode>\n<output>a.py</output>"},
            {"role": "assistant", "content": "done"}
        ]}"#;
        let t = parse_transcript("t.json", text, InputFormat::Auto).unwrap();
        assert_eq!(t.messages[3].role, Role::Tool);
        assert_eq!(
            t.calls,
            vec![(2, Some(RecordedUsage { prompt_tokens: 120, cached_tokens: 64 })), (4, None)]
        );
        assert_eq!(t.messages[2].at_ms, Some(1_700_000_000_000));
    }

    #[test]
    fn openai_messages_with_tool_calls() {
        let text = r#"[{"role":"user","content":"hi"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a\"}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"contents"},
            {"role":"assistant","content":[{"type":"text","text":"ok"}]}]"#;
        let t = parse_transcript("m.json", text, InputFormat::Auto).unwrap();
        assert_eq!(t.messages[1].tool_name.as_deref(), Some("read_file"));
        assert!(t.messages[1].text.contains("read_file({\"path\":\"a\"})"));
        assert_eq!(t.messages[2].role, Role::Tool);
        assert_eq!(t.calls.len(), 2);
    }

    #[test]
    fn pi_session_jsonl() {
        let text = concat!(
            r#"{"type":"session","version":3,"id":"s"}"#,
            "\n",
            r#"{"type":"message","message":{"role":"user","content":[{"type":"text","text":"hello"}],"timestamp":1000}}"#,
            "\n",
            r#"{"type":"message","message":{"role":"assistant","content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"hi"},{"type":"toolCall","id":"t1","name":"read","arguments":{"path":"x"}}],"usage":{"input":10,"cacheRead":500,"cacheWrite":20},"timestamp":2000}}"#,
            "\n",
            r#"{"type":"message","message":{"role":"toolResult","toolName":"read","content":[{"type":"text","text":"file body"}],"timestamp":3000}}"#,
            "\n",
        );
        let t = parse_transcript("s.jsonl", text, InputFormat::Auto).unwrap();
        assert_eq!(t.messages.len(), 3);
        assert_eq!(t.messages[1].tool_name.as_deref(), Some("read"));
        assert_eq!(t.messages[2].role, Role::Tool);
        assert_eq!(t.calls, vec![(1, Some(RecordedUsage { prompt_tokens: 530, cached_tokens: 500 }))]);
    }

    #[test]
    fn errors_name_the_file_and_place() {
        let err = parse_transcript("bad.json", "{\"messages\": [", InputFormat::Auto).unwrap_err();
        assert!(err.to_string().starts_with("bad.json: invalid JSON at line 1"), "{err}");
        let err =
            parse_transcript("x.json", r#"{"messages":[{"role":"robot","content":"x"}]}"#, InputFormat::Auto)
                .unwrap_err();
        assert_eq!(
            err.to_string(),
            "x.json: messages[0]: unknown role Some(\"robot\"): expected system, user, assistant or tool"
        );
        let err =
            parse_transcript("y.json", r#"{"messages":[{"role":"user","content":"x"}]}"#, InputFormat::Auto)
                .unwrap_err();
        assert!(matches!(err, FormatError::NoCalls { .. }));
        let err =
            parse_transcript("z.jsonl", "{\"type\":\"session\"}\nnot json\n", InputFormat::Auto).unwrap_err();
        assert!(err.to_string().starts_with("z.jsonl: invalid JSON at line 2"), "{err}");
    }
}
