//! The upstream body of an OpenAI chat completion built from the compiled packet.

use crate::compiler::{Packet, RenderedEntry};
use crate::entry::{Role, ToolCall};
use serde_json::{Map, Value};

use super::body::{Assembly, ChunkedBody, Sink};
use super::fragments::{FragmentCache, Rendered};
use super::json_write::{ChatMessage, OpenAiFunction, OpenAiToolCall, json_bytes, write_json};
use super::ledger::CallLedger;
use super::tier1::Tier1Json;

/// One Tier-2 entry, whose model-visible text is `text` and whose tool calls are `calls`, as
/// OpenAI message JSON (one or more messages, comma-separated).
pub fn fragment(entry: &RenderedEntry, text: &str, calls: &[ToolCall], ledger: &CallLedger) -> Rendered {
    let plain = |role| json_bytes(&ChatMessage::text(role, text), text.len());
    match entry.role {
        Role::User => Rendered { json: plain("user"), complete: true, assistant: false },
        Role::System => Rendered { json: plain("system"), complete: true, assistant: false },
        Role::Assistant => {
            let answered: Vec<OpenAiToolCall<'_>> = calls
                .iter()
                .filter(|call| ledger.is_answered(entry.id, &call.call_id))
                .map(|call| OpenAiToolCall {
                    function: OpenAiFunction { arguments: &call.arguments_json, name: &call.name },
                    id: &call.call_id,
                    kind: "function",
                })
                .collect();
            let complete = answered.len() == calls.len() || !ledger.is_open(entry.id);
            let arguments_len: usize = answered.iter().map(|call| call.function.arguments.len()).sum();
            let message = ChatMessage::assistant(text, &answered);
            Rendered { json: json_bytes(&message, text.len() + arguments_len), complete, assistant: true }
        }
        Role::Tool => {
            let mut issued = ledger.answers(entry.id).iter();
            let Some(first) = issued.next() else {
                return Rendered { json: plain("user"), complete: true, assistant: false };
            };
            let mut json = json_bytes(&ChatMessage::tool(text, first), text.len());
            for other in issued {
                let pointer = format!("[see {}]", entry.id);
                json.push(b',');
                write_json(&mut json, &ChatMessage::tool(&pointer, other));
            }
            Rendered { json, complete: true, assistant: false }
        }
    }
}

/// Serialises the request: `head` (model, parameters, cache hints), Tier 1, Tier 2 (the assembled
/// part by reference, then the newer entries) and the Tier-3 telemetry as a trailing system message
/// after the cached prefix.
pub fn body(
    head: Map<String, Value>,
    tier1: &Tier1Json,
    packet: &Packet<'_>,
    cache: &mut FragmentCache,
    assembly: &mut Assembly,
    ledger: &CallLedger,
) -> ChunkedBody {
    let last_included = packet.entries.iter().rposition(|entry| entry.included).unwrap_or(0);
    let mut index = assembly.upto();
    while index < last_included {
        let entry = &packet.entries[index];
        if entry.included {
            let fragment = cache.get(index, entry, packet.source_hash(index), |entry| {
                fragment(entry, &packet.text(index), packet.tool_calls(index), ledger)
            });
            if !fragment.is_complete() {
                break;
            }
            assembly.put(&fragment.json);
            assembly.put(b",");
            cache.release(index);
        }
        index += 1;
        assembly.advance(index);
    }
    let mut out = ChunkedBody::open_object(head, assembly.copied_hint);
    if tier1.has_tools {
        out.put(b"\"tools\":");
        out.put_shared(&tier1.tools_json);
        out.put(b",");
    }
    out.put(b"\"messages\":[");
    if !tier1.system_text.is_empty() {
        out.put_shared(&tier1.system_json);
        out.put(b",");
    }
    assembly.write_to(&mut out);
    for (index, entry) in packet.entries.iter().enumerate().skip(assembly.upto()) {
        if entry.included {
            let fragment = cache.get(index, entry, packet.source_hash(index), |entry| {
                fragment(entry, &packet.text(index), packet.tool_calls(index), ledger)
            });
            out.put_shared(&fragment.json);
            out.put(b",");
        }
    }
    let telemetry = ChatMessage::text("system", &packet.telemetry);
    out.put(&json_bytes(&telemetry, packet.telemetry.len()));
    out.put(b"]}");
    assembly.copied_hint = out.copied_len();
    out
}
