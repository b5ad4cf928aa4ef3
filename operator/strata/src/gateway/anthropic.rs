//! Anthropic messages: request parsing, response parsing and the client's view of answers, streamed
//! or not, with the gateway's memory tools hidden.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::{Value, json};
use strata_core::entry::{Content, Role, ToolCall, ToolResult};

use super::errors::GatewayError;
use super::openai::message_value;
use super::provider::ParsedRequest;
use super::schema_retry::SchemaRetryHold;
use super::sse;
use strata_core::session::message_memo::{MessageMemo, Reading};
use strata_core::session::tool_block::ToolBlocks;
use strata_core::session::tool_schema::is_memory_tool;
use strata_core::session::turn::{Api, AssistantOutput, ChatRequest, Turn, Usage, text_of};

/// Fields the request is rebuilt from; `tools` never reaches the fields (the splitter keeps its span).
const CONSUMED_FIELDS: [&str; 4] = ["messages", "system", "stream", "model"];

fn bad(message: impl Into<String>) -> GatewayError {
    GatewayError::BadRequest(message.into())
}

/// Joins the non-empty texts of an answer (the form both the gateway and the echoing client use).
pub fn join_texts<'a>(texts: impl IntoIterator<Item = &'a str>) -> String {
    texts.into_iter().filter(|text| !text.is_empty()).collect::<Vec<_>>().join("\n")
}

fn block_text(index: usize, value: &Value) -> Result<String, GatewayError> {
    text_of(value).map_err(|part| {
        bad(format!(
            "messages[{index}]: content type {part} is not supported; the gateway journals text only"
        ))
    })
}

fn user_turns(index: usize, content: &Value, turns: &mut Vec<Turn>) -> Result<(), GatewayError> {
    let Value::Array(blocks) = content else {
        turns.push(Turn { role: Role::User, content: Content::text(block_text(index, content)?) });
        return Ok(());
    };
    let mut texts: Vec<String> = Vec::new();
    let flush = |texts: &mut Vec<String>, turns: &mut Vec<Turn>| {
        if !texts.is_empty() {
            let text = join_texts(texts.iter().map(String::as_str));
            turns.push(Turn { role: Role::User, content: Content::text(text) });
            texts.clear();
        }
    };
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                texts.push(block.get("text").and_then(Value::as_str).unwrap_or_default().to_owned())
            }
            Some("tool_result") => {
                flush(&mut texts, turns);
                let call_id = block
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("messages[{index}]: tool_result needs `tool_use_id`")))?;
                let output = block_text(index, block.get("content").unwrap_or(&Value::Null))?;
                turns.push(Turn {
                    role: Role::Tool,
                    content: Content {
                        tool_results: vec![ToolResult { call_id: call_id.to_owned(), name: None, output }],
                        ..Content::default()
                    },
                });
            }
            Some(other) => {
                return Err(bad(format!(
                    "messages[{index}]: content type {other} is not supported; the gateway journals text only"
                )));
            }
            None => return Err(bad(format!("messages[{index}]: a content block needs `type`"))),
        }
    }
    flush(&mut texts, turns);
    Ok(())
}

/// The text blocks and `tool_use` blocks of an Anthropic content array, in order.
fn texts_and_tool_uses(blocks: &[Value]) -> (Vec<&str>, Vec<ToolCall>) {
    let mut texts = Vec::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => texts.push(block.get("text").and_then(Value::as_str).unwrap_or_default()),
            Some("tool_use") => tool_calls.push(ToolCall {
                call_id: block.get("id").and_then(Value::as_str).unwrap_or_default().to_owned(),
                name: block.get("name").and_then(Value::as_str).unwrap_or_default().to_owned(),
                arguments_json: block.get("input").cloned().unwrap_or_else(|| json!({})).to_string(),
            }),
            _ => {}
        }
    }
    (texts, tool_calls)
}

fn assistant_turn(index: usize, content: &Value) -> Result<Turn, GatewayError> {
    let Value::Array(blocks) = content else {
        return Ok(Turn { role: Role::Assistant, content: Content::text(block_text(index, content)?) });
    };
    let (texts, tool_calls) = texts_and_tool_uses(blocks);
    Ok(Turn {
        role: Role::Assistant,
        content: Content { text: join_texts(texts), tool_calls, tool_results: Vec::new() },
    })
}

/// Parses a `POST /v1/messages` body; messages equal to the ones `memo` remembers are taken from
/// it instead of being parsed again.
pub fn parse_request(
    body: &Bytes,
    mut memo: MessageMemo,
    tool_blocks: &ToolBlocks,
) -> Result<ParsedRequest, GatewayError> {
    let known_tools = tool_blocks.last_bytes();
    let mut split =
        memo.split(Api::Anthropic, body, known_tools.as_deref()).map_err(|error| bad(error.to_string()))?;
    let tools_span = split.tools.clone();
    let mut fields = std::mem::take(&mut split.fields);
    let count = split.messages.len();
    let read = memo.read(Api::Anthropic, body, split, |index, raw| {
        let message = message_value(index, raw)?;
        let content = message.get("content").unwrap_or(&Value::Null);
        let mut turns = Vec::with_capacity(1);
        match message.get("role").and_then(Value::as_str).unwrap_or_default() {
            "user" => user_turns(index, content, &mut turns)?,
            "assistant" => turns.push(assistant_turn(index, content)?),
            other => return Err(bad(format!("messages[{index}]: role {other:?} is not supported"))),
        }
        Ok(Reading { system: None, turns })
    })?;
    let system_text = match fields.get("system") {
        None | Some(Value::Null) => String::new(),
        Some(system) => {
            text_of(system).map_err(|part| bad(format!("system: block type {part} is not supported")))?
        }
    };
    let stream = fields.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let tools = tool_blocks.read(body, tools_span).map_err(|error| bad(error.to_string()))?;
    for field in CONSUMED_FIELDS {
        fields.remove(field);
    }
    let request = ChatRequest {
        api: Api::Anthropic,
        stream,
        system_text,
        turns: Vec::new(),
        tools,
        params: fields,
        wants_usage: false,
        known_chains: Vec::new(),
        hollow_turns: 0,
    };
    Ok(ParsedRequest::with_messages(request, read, count))
}

/// Usage from an Anthropic `usage` object (prompt tokens include cache reads and writes).
pub fn parse_usage(usage: &Value) -> Option<Usage> {
    let field = |name: &str| usage.get(name).and_then(Value::as_u64).unwrap_or(0);
    let input = usage.get("input_tokens")?.as_u64()?;
    let cached = field("cache_read_input_tokens");
    let written = field("cache_creation_input_tokens");
    Some(Usage {
        prompt_tokens: input.saturating_add(cached).saturating_add(written),
        cached_tokens: cached,
        cache_write_tokens: written,
        completion_tokens: field("output_tokens"),
    })
}

/// Reads a non-streaming message.
pub fn parse_response(value: Value) -> Result<AssistantOutput, GatewayError> {
    let blocks = value
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| GatewayError::UpstreamProtocol("message without content".into()))?;
    let (texts, tool_calls) = texts_and_tool_uses(blocks);
    let text = join_texts(texts);
    Ok(AssistantOutput {
        id: value.get("id").and_then(Value::as_str).unwrap_or_default().to_owned(),
        text,
        tool_calls,
        stop_reason: value.get("stop_reason").and_then(Value::as_str).unwrap_or_default().to_owned(),
        usage: value.get("usage").and_then(parse_usage),
        raw: Some(value),
    })
}

fn usage_json(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.fresh_tokens(),
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
        "output_tokens": usage.completion_tokens
    })
}

/// The client's view of the final answer: earlier rounds' text blocks first, memory tool calls
/// removed, usage summed over every round.
pub fn client_response(final_output: &AssistantOutput, earlier_texts: &[String], total: &Usage) -> Value {
    let mut raw = final_output.raw.clone().unwrap_or_else(|| json!({}));
    if let Some(Value::Array(blocks)) = raw.get_mut("content") {
        blocks.retain(|block| {
            !(block.get("type").and_then(Value::as_str) == Some("tool_use")
                && block.get("name").and_then(Value::as_str).is_some_and(is_memory_tool))
        });
        let earlier = earlier_texts
            .iter()
            .filter(|text| !text.is_empty())
            .map(|text| json!({"type": "text", "text": text}));
        let mut content: Vec<Value> = earlier.collect();
        content.append(blocks);
        let has_tool_use =
            content.iter().any(|block| block.get("type").and_then(Value::as_str) == Some("tool_use"));
        *blocks = content;
        if !has_tool_use && raw.get("stop_reason").and_then(Value::as_str) == Some("tool_use") {
            raw["stop_reason"] = "end_turn".into();
        }
    }
    if raw.get("usage").is_some() {
        raw["usage"] = usage_json(total);
    }
    raw
}

/// Whether [`client_response`] would leave a single round's answer as the upstream sent it, but for
/// key order and the form of its usage: the answer called no memory tool, and its `stop_reason` is
/// `tool_use` only if it calls a tool (it would be made `end_turn` otherwise).
pub fn answer_passes_as_sent(final_output: &AssistantOutput) -> bool {
    !final_output.tool_calls.iter().any(|call| is_memory_tool(&call.name))
        && (final_output.stop_reason != "tool_use" || !final_output.tool_calls.is_empty())
}

/// Translates upstream events of every round into one client stream.
#[derive(Debug, Default)]
pub struct StreamTranslator {
    started: bool,
    id: String,
    next_client_index: u64,
    client_index: HashMap<u64, Option<u64>>,
    texts: Vec<(u64, String)>,
    calls: Vec<(u64, ToolCall)>,
    stop_reason: String,
    usage: Option<Usage>,
    complete: bool,
    retry: SchemaRetryHold,
}

impl StreamTranslator {
    /// Arms the round for a repeat when the model calls one of `summarised` first.
    pub fn hold_summarised(&mut self, summarised: Vec<String>) {
        self.retry.arm(summarised);
    }

    /// Whether the round just read was held back whole for a repeat with loaded schemas.
    pub fn held_for_retry(&self) -> bool {
        self.retry.is_held()
    }

    /// Whether the current round's stream ended properly (`message_stop` was seen).
    pub fn round_complete(&self) -> bool {
        self.complete
    }

    fn is_internal(&self) -> bool {
        self.calls.iter().any(|(_, call)| is_memory_tool(&call.name))
            && !self.calls.iter().any(|(_, call)| !is_memory_tool(&call.name))
    }

    fn reindex(&self, event: &mut Value) -> Option<()> {
        let index = event.get("index")?.as_u64()?;
        let client = (*self.client_index.get(&index)?)?;
        event["index"] = client.into();
        Some(())
    }

    /// Handles one upstream event; returns the bytes to forward to the client.
    pub fn on_event(&mut self, name: Option<&str>, data: &str) -> Result<Option<Bytes>, GatewayError> {
        let mut event: Value = serde_json::from_str(data)
            .map_err(|error| GatewayError::UpstreamProtocol(format!("stream event is not JSON: {error}")))?;
        if !event.is_object() {
            return Err(GatewayError::UpstreamProtocol("stream event is not a JSON object".into()));
        }
        let kind = event.get("type").and_then(Value::as_str).or(name).unwrap_or_default().to_owned();
        if kind == "error" {
            let error = event.get("error").unwrap_or(&event);
            return Err(GatewayError::UpstreamProtocol(format!("the upstream stream failed: {error}")));
        }
        let forward = match kind.as_str() {
            "message_start" => {
                if let Some(usage) = event.pointer("/message/usage").and_then(parse_usage) {
                    self.usage = Some(usage);
                }
                if self.started {
                    false
                } else {
                    self.id =
                        event.pointer("/message/id").and_then(Value::as_str).unwrap_or_default().to_owned();
                    self.started = true;
                    true
                }
            }
            "content_block_start" => {
                let index = event.get("index").and_then(Value::as_u64).unwrap_or(0);
                let block = event.get("content_block").cloned().unwrap_or(Value::Null);
                let kind = block.get("type").and_then(Value::as_str).unwrap_or_default();
                let mut hidden = self.retry.is_held();
                if kind == "tool_use" {
                    let name = block.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
                    hidden = is_memory_tool(&name) || self.retry.withholds(&name);
                    let call_id = block.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
                    self.calls.push((index, ToolCall { call_id, name, arguments_json: String::new() }));
                } else if kind == "text" {
                    let text = block.get("text").and_then(Value::as_str).unwrap_or_default().to_owned();
                    self.texts.push((index, text));
                }
                if hidden {
                    self.client_index.insert(index, None);
                    false
                } else {
                    self.retry.shown();
                    self.client_index.insert(index, Some(self.next_client_index));
                    self.next_client_index += 1;
                    self.reindex(&mut event).is_some()
                }
            }
            "content_block_delta" => {
                let index = event.get("index").and_then(Value::as_u64).unwrap_or(0);
                if let Some(text) = event.pointer("/delta/text").and_then(Value::as_str)
                    && let Some((_, accumulated)) = self.texts.iter_mut().find(|(i, _)| *i == index)
                {
                    accumulated.push_str(text);
                }
                if let Some(json) = event.pointer("/delta/partial_json").and_then(Value::as_str)
                    && let Some((_, call)) = self.calls.iter_mut().find(|(i, _)| *i == index)
                {
                    call.arguments_json.push_str(json);
                }
                self.reindex(&mut event).is_some()
            }
            "content_block_stop" => self.reindex(&mut event).is_some(),
            "message_delta" => {
                if let Some(reason) = event.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = reason.to_owned();
                }
                if let Some(output) = event.pointer("/usage/output_tokens").and_then(Value::as_u64) {
                    self.usage.get_or_insert_with(Usage::default).completion_tokens = output;
                }
                !self.is_internal() && !self.retry.is_held()
            }
            "message_stop" => {
                self.complete = true;
                false
            }
            _ => true,
        };
        Ok(forward.then(|| sse::encode(Some(&kind), &event.to_string())))
    }

    /// Ends a round: returns what the model said in it and resets the per-round state.
    pub fn finish_round(&mut self) -> AssistantOutput {
        self.client_index.clear();
        self.complete = false;
        self.retry.reset();
        let texts = std::mem::take(&mut self.texts);
        let calls = std::mem::take(&mut self.calls)
            .into_iter()
            .map(|(_, mut call)| {
                let input = serde_json::from_str::<Value>(&call.arguments_json).unwrap_or_else(|_| json!({}));
                call.arguments_json = input.to_string();
                call
            })
            .collect();
        AssistantOutput {
            id: self.id.clone(),
            text: join_texts(texts.iter().map(|(_, text)| text.as_str())),
            tool_calls: calls,
            stop_reason: std::mem::take(&mut self.stop_reason),
            usage: self.usage.take(),
            raw: None,
        }
    }

    /// The closing event.
    pub fn closing(&self) -> Vec<Bytes> {
        vec![sse::encode(Some("message_stop"), &json!({"type": "message_stop"}).to_string())]
    }
}
