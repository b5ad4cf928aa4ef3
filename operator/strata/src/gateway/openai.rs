//! OpenAI chat completions: request parsing, response parsing and the client's view of answers,
//! streamed or not, with the gateway's memory tools hidden.

use bytes::Bytes;
use serde_json::{Value, json};
use strata_core::entry::ToolCall;
use strata_core::session::message_memo::{MessageMemo, Reading};
use strata_core::session::openai_messages::parse_message;
use strata_core::session::tool_block::ToolBlocks;

use super::errors::GatewayError;
use super::provider::ParsedRequest;
use super::schema_retry::SchemaRetryHold;
use super::sse;
use strata_core::session::tool_schema::{COMPACT_TOOL_NAME, PURGE_TOOL_NAME, is_memory_tool};
use strata_core::session::turn::{Api, AssistantOutput, ChatRequest, Usage, text_of};
use strata_core::tool_output::READ_OUTPUT_TOOL_NAME;

/// Fields the request is rebuilt from; `tools` never reaches the fields (the splitter keeps its span).
const CONSUMED_FIELDS: [&str; 4] = ["messages", "stream", "stream_options", "model"];

fn bad(message: impl Into<String>) -> GatewayError {
    GatewayError::BadRequest(message.into())
}

/// Parses a `POST /v1/chat/completions` body; messages equal to the ones `memo` remembers are
/// taken from it instead of being parsed again.
pub fn parse_request(
    body: &Bytes,
    mut memo: MessageMemo,
    tool_blocks: &ToolBlocks,
) -> Result<ParsedRequest, GatewayError> {
    let known_tools = tool_blocks.last_bytes();
    let mut split =
        memo.split(Api::OpenAi, body, known_tools.as_deref()).map_err(|error| bad(error.to_string()))?;
    let tools_span = split.tools.clone();
    let mut fields = std::mem::take(&mut split.fields);
    if fields.contains_key("functions") || fields.contains_key("function_call") {
        return Err(bad("`functions`/`function_call` are not supported; use `tools`"));
    }
    if fields.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        return Err(bad("`n` > 1 is not supported: the journal records one answer per turn"));
    }
    let count = split.messages.len();
    let read = memo.read(Api::OpenAi, body, split, |index, raw| {
        let message = message_value(index, raw)?;
        let mut system = Vec::new();
        let turn = parse_message(index, &message, &mut system).map_err(bad)?;
        Ok::<_, GatewayError>(Reading { system: system.pop(), turns: turn.into_iter().collect() })
    })?;
    let stream = fields.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let wants_usage = fields
        .get("stream_options")
        .and_then(|options| options.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let tools = tool_blocks.read(body, tools_span).map_err(|error| bad(error.to_string()))?;
    for field in CONSUMED_FIELDS {
        fields.remove(field);
    }
    let system_text = read.system.join("\n\n");
    let request = ChatRequest {
        api: Api::OpenAi,
        stream,
        system_text,
        turns: Vec::new(),
        tools,
        params: fields,
        wants_usage,
        known_chains: Vec::new(),
        hollow_turns: 0,
    };
    Ok(ParsedRequest::with_messages(request, read, count))
}

/// One message of a request as a JSON value (its bytes were already checked to be JSON).
pub fn message_value(index: usize, raw: &[u8]) -> Result<Value, GatewayError> {
    serde_json::from_slice(raw).map_err(|error| bad(format!("messages[{index}] is not valid JSON: {error}")))
}

/// Usage from an OpenAI `usage` object.
pub fn parse_usage(usage: &Value) -> Option<Usage> {
    let prompt_tokens = usage.get("prompt_tokens")?.as_u64()?;
    Some(Usage {
        prompt_tokens,
        cached_tokens: usage
            .get("prompt_tokens_details")
            .and_then(|details| details.get("cached_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(0),
        cache_write_tokens: 0,
        completion_tokens: usage.get("completion_tokens").and_then(Value::as_u64).unwrap_or(0),
    })
}

/// Reads a non-streaming chat completion.
pub fn parse_response(value: Value) -> Result<AssistantOutput, GatewayError> {
    let choice = value
        .get("choices")
        .and_then(|choices| choices.get(0))
        .ok_or_else(|| GatewayError::UpstreamProtocol("chat completion without choices".into()))?;
    let message = choice.get("message").unwrap_or(&Value::Null);
    let text = text_of(message.get("content").unwrap_or(&Value::Null)).unwrap_or_default();
    let mut tool_calls = Vec::new();
    for call in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
        let function = call.get("function").unwrap_or(&Value::Null);
        tool_calls.push(ToolCall {
            call_id: call.get("id").and_then(Value::as_str).unwrap_or_default().to_owned(),
            name: function.get("name").and_then(Value::as_str).unwrap_or_default().to_owned(),
            arguments_json: function.get("arguments").and_then(Value::as_str).unwrap_or("{}").to_owned(),
        });
    }
    let stop_reason = choice.get("finish_reason").and_then(Value::as_str).unwrap_or_default().to_owned();
    Ok(AssistantOutput {
        id: value.get("id").and_then(Value::as_str).unwrap_or_default().to_owned(),
        text,
        tool_calls,
        stop_reason,
        usage: value.get("usage").and_then(parse_usage),
        raw: Some(value),
    })
}

fn usage_json(usage: &Usage) -> Value {
    json!({
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}
    })
}

/// The client's view of the final answer: earlier rounds' text first, memory tool calls removed,
/// usage summed over every round.
pub fn client_response(final_output: &AssistantOutput, earlier_text: &str, total: &Usage) -> Value {
    let mut raw = final_output.raw.clone().unwrap_or_else(|| json!({}));
    if let Some(message) = raw.pointer_mut("/choices/0/message").and_then(Value::as_object_mut) {
        if !earlier_text.is_empty() {
            message.insert("content".into(), format!("{earlier_text}{}", final_output.text).into());
        }
        if let Some(Value::Array(calls)) = message.get_mut("tool_calls") {
            calls.retain(|call| {
                !call.pointer("/function/name").and_then(Value::as_str).is_some_and(is_memory_tool)
            });
            if calls.is_empty() {
                message.remove("tool_calls");
                if let Some(reason) = raw.pointer_mut("/choices/0/finish_reason")
                    && reason == "tool_calls"
                {
                    *reason = "stop".into();
                }
            }
        }
    }
    if raw.get("usage").is_some() {
        raw["usage"] = usage_json(total);
    }
    raw
}

/// Whether [`client_response`] would leave a single round's answer as the upstream sent it, but for
/// key order and the form of its usage: the answer called no memory tool, and a `tool_calls` it
/// carries is not empty (an empty one would be dropped).
pub fn answer_passes_as_sent(final_output: &AssistantOutput) -> bool {
    !final_output.tool_calls.iter().any(|call| is_memory_tool(&call.name))
        && final_output
            .raw
            .as_ref()
            .and_then(|raw| raw.pointer("/choices/0/message/tool_calls"))
            .is_none_or(|calls| calls.as_array().is_none_or(|calls| !calls.is_empty()))
}

/// The memory tools' names, for deciding whether a partial name may still become one.
const MEMORY_TOOL_NAMES: [&str; 3] = [PURGE_TOOL_NAME, COMPACT_TOOL_NAME, READ_OUTPUT_TOOL_NAME];

/// Whether a tool name seen so far may still turn out to be a memory tool's (it is a prefix of one).
fn may_become_memory_tool(name_so_far: &str) -> bool {
    MEMORY_TOOL_NAMES.iter().any(|name| name.starts_with(name_so_far))
}

/// Where one streamed tool call's deltas go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallRoute {
    /// Its name is not known well enough yet: its deltas are accumulated, nothing is forwarded.
    Held,
    /// A client tool: forwarded under this client index.
    Visible(u64),
    /// A memory tool: never shown.
    Hidden,
}

/// One tool call of the current round, as streamed so far.
#[derive(Debug)]
struct StreamedCall {
    upstream_index: u64,
    route: CallRoute,
    call: ToolCall,
}

/// Translates upstream chunks of every round into one client stream.
///
/// A tool call's deltas are held until its name is known: while the name seen so far is empty or
/// a prefix of a memory tool's name, nothing of the call is forwarded. The call is decided once its
/// name cannot become a memory tool's any more, or once its arguments start or the round finishes
/// with the name complete; a client tool is then sent as one delta carrying everything held so far,
/// a memory tool is dropped.
#[derive(Debug)]
pub struct StreamTranslator {
    wants_usage: bool,
    id: Option<String>,
    model: Value,
    created: Value,
    role_sent: bool,
    next_client_index: u64,
    calls: Vec<StreamedCall>,
    text: String,
    finish: String,
    usage: Option<Usage>,
    complete: bool,
    retry: SchemaRetryHold,
}

impl StreamTranslator {
    /// A translator; `wants_usage` says whether the client asked for the usage chunk.
    pub fn new(wants_usage: bool) -> Self {
        Self {
            wants_usage,
            id: None,
            model: Value::Null,
            created: Value::Null,
            role_sent: false,
            next_client_index: 0,
            calls: Vec::new(),
            text: String::new(),
            finish: String::new(),
            usage: None,
            complete: false,
            retry: SchemaRetryHold::default(),
        }
    }

    /// Arms the round for a repeat when the model calls one of `summarised` first.
    pub fn hold_summarised(&mut self, summarised: Vec<String>) {
        self.retry.arm(summarised);
    }

    /// Whether the round just read was held back whole for a repeat with loaded schemas.
    pub fn held_for_retry(&self) -> bool {
        self.retry.is_held()
    }

    fn has_visible_calls(&self) -> bool {
        self.calls.iter().any(|streamed| !is_memory_tool(&streamed.call.name))
    }

    fn has_memory_calls(&self) -> bool {
        self.calls.iter().any(|streamed| is_memory_tool(&streamed.call.name))
    }

    /// Whether the current round's stream ended properly (a finish reason or `[DONE]` was seen).
    pub fn round_complete(&self) -> bool {
        self.complete
    }

    /// Decides a held call's route; `final_name` says its name can no longer grow.
    fn decide(&mut self, position: usize, final_name: bool) -> Option<Value> {
        let streamed = &mut self.calls[position];
        if streamed.route != CallRoute::Held {
            return None;
        }
        let name = streamed.call.name.as_str();
        if name.is_empty() && !final_name {
            return None;
        }
        if may_become_memory_tool(name) && !final_name {
            return None;
        }
        if is_memory_tool(name) || self.retry.withholds(name) {
            streamed.route = CallRoute::Hidden;
            return None;
        }
        self.retry.shown();
        let client_index = self.next_client_index;
        self.next_client_index += 1;
        streamed.route = CallRoute::Visible(client_index);
        let call = &streamed.call;
        Some(json!({
            "index": client_index,
            "id": call.call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments_json}
        }))
    }

    /// Accumulates one upstream tool-call delta; returns what the client sees of it, if anything.
    fn on_call_delta(&mut self, mut delta: Value) -> Option<Value> {
        let index = delta.get("index").and_then(Value::as_u64).unwrap_or(0);
        let name = delta.pointer("/function/name").and_then(Value::as_str).unwrap_or_default();
        let arguments = delta.pointer("/function/arguments").and_then(Value::as_str).unwrap_or_default();
        let position = match self.calls.iter().position(|streamed| streamed.upstream_index == index) {
            Some(position) => position,
            None => {
                self.calls.push(StreamedCall {
                    upstream_index: index,
                    route: CallRoute::Held,
                    call: ToolCall {
                        call_id: String::new(),
                        name: String::new(),
                        arguments_json: String::new(),
                    },
                });
                self.calls.len() - 1
            }
        };
        let streamed = &mut self.calls[position];
        if let Some(id) = delta.get("id").and_then(Value::as_str) {
            streamed.call.call_id.push_str(id);
        }
        streamed.call.name.push_str(name);
        streamed.call.arguments_json.push_str(arguments);
        match streamed.route {
            CallRoute::Hidden => None,
            CallRoute::Visible(client_index) => {
                delta["index"] = client_index.into();
                Some(delta)
            }
            // Arguments only start once the name is complete.
            CallRoute::Held => self.decide(position, !arguments.is_empty()),
        }
    }

    /// Decides every held call (the round is finishing); returns the client deltas of those shown.
    fn release_held(&mut self) -> Vec<Value> {
        (0..self.calls.len()).filter_map(|position| self.decide(position, true)).collect()
    }

    /// Handles one upstream event; returns the bytes to forward to the client.
    pub fn on_event(&mut self, data: &str) -> Result<Option<Bytes>, GatewayError> {
        if data.trim() == "[DONE]" {
            self.complete = true;
            return Ok(None);
        }
        let mut chunk: Value = serde_json::from_str(data)
            .map_err(|error| GatewayError::UpstreamProtocol(format!("stream chunk is not JSON: {error}")))?;
        if !chunk.is_object() {
            return Err(GatewayError::UpstreamProtocol("stream chunk is not a JSON object".into()));
        }
        if let Some(error) = chunk.get("error") {
            return Err(GatewayError::UpstreamProtocol(format!("the upstream stream failed: {error}")));
        }
        if let Some(usage) = chunk.get("usage").and_then(parse_usage) {
            self.usage = Some(usage);
        }
        if let Some(fields) = chunk.as_object_mut() {
            fields.remove("usage");
        }
        match &self.id {
            None => {
                self.id = chunk.get("id").and_then(Value::as_str).map(str::to_owned);
                self.model = chunk.get("model").cloned().unwrap_or(Value::Null);
                self.created = chunk.get("created").cloned().unwrap_or(Value::Null);
            }
            Some(id) => {
                if let Some(fields) = chunk.as_object_mut() {
                    fields.insert("id".into(), id.clone().into());
                }
            }
        }
        let finish_reason =
            chunk.pointer("/choices/0/finish_reason").and_then(Value::as_str).map(str::to_owned);
        let mut visible = Vec::new();
        let mut forward = false;
        if let Some(delta) = chunk.pointer_mut("/choices/0/delta").and_then(Value::as_object_mut) {
            if delta.contains_key("role") {
                if self.role_sent {
                    delta.remove("role");
                } else {
                    self.role_sent = true;
                    forward = true;
                }
            }
            if let Some(text) = delta.get("content").and_then(Value::as_str) {
                self.text.push_str(text);
                if !text.is_empty() && !self.retry.is_held() {
                    self.retry.shown();
                    forward = true;
                }
            }
            if let Some(Value::Array(calls)) = delta.remove("tool_calls") {
                for call in calls {
                    visible.extend(self.on_call_delta(call));
                }
            }
        }
        if finish_reason.is_some() {
            visible.extend(self.release_held());
        }
        let Some(choice) = chunk.pointer_mut("/choices/0").and_then(Value::as_object_mut) else {
            return Ok(None);
        };
        if !visible.is_empty() {
            forward = true;
            if let Some(delta) = choice.get_mut("delta").and_then(Value::as_object_mut) {
                delta.insert("tool_calls".into(), Value::Array(visible));
            } else {
                choice.insert("delta".into(), json!({ "tool_calls": visible }));
            }
        }
        if self.retry.is_held() {
            // Nothing of a held round reaches the client; a role it carried goes with the repeat.
            if chunk.pointer("/choices/0/delta/role").is_some() {
                self.role_sent = false;
            }
            if let Some(reason) = finish_reason {
                self.finish = reason;
                self.complete = true;
            }
            return Ok(None);
        }
        if let Some(reason) = finish_reason {
            self.finish = reason;
            self.complete = true;
            if self.is_internal_round() {
                choice.insert("finish_reason".into(), Value::Null);
            } else {
                forward = true;
            }
        }
        Ok(forward.then(|| sse::encode(None, &chunk.to_string())))
    }

    /// Whether the round that just finished only called memory tools (the gateway continues).
    pub fn is_internal_round(&self) -> bool {
        self.has_memory_calls() && !self.has_visible_calls()
    }

    /// Ends a round: returns what the model said in it and resets the per-round state.
    pub fn finish_round(&mut self) -> AssistantOutput {
        self.complete = false;
        self.retry.reset();
        AssistantOutput {
            id: self.id.clone().unwrap_or_default(),
            text: std::mem::take(&mut self.text),
            tool_calls: std::mem::take(&mut self.calls).into_iter().map(|streamed| streamed.call).collect(),
            stop_reason: std::mem::take(&mut self.finish),
            usage: self.usage.take(),
            raw: None,
        }
    }

    /// The closing events: the usage chunk if the client asked for it, then `[DONE]`.
    pub fn closing(&self, total: &Usage) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.wants_usage {
            let chunk = json!({
                "id": self.id.clone().unwrap_or_default(),
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage_json(total)
            });
            out.push(sse::encode(None, &chunk.to_string()));
        }
        out.push(sse::encode(None, "[DONE]"));
        out
    }
}
