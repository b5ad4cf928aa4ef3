//! The upstream body of an OpenAI chat completion built from the compiled packet.

use crate::compiler::{Packet, RenderedEntry};
use crate::entry::Role;
use serde_json::{Map, Value, json};

use super::body::{Assembly, ChunkedBody, Sink};
use super::fragments::{FragmentCache, Rendered};
use super::ledger::CallLedger;
use super::tier1::Tier1Json;

/// One Tier-2 entry as OpenAI message JSON (one or more messages, comma-separated).
pub fn fragment(entry: &RenderedEntry, ledger: &CallLedger) -> Rendered {
    let user = |text: &str| json!({"role": "user", "content": text}).to_string();
    match entry.role {
        Role::User => Rendered { json: user(&entry.text), complete: true, assistant: false },
        Role::System => Rendered {
            json: json!({"role": "system", "content": entry.text}).to_string(),
            complete: true,
            assistant: false,
        },
        Role::Assistant => {
            let answered: Vec<Value> = entry
                .tool_calls
                .iter()
                .filter(|call| ledger.is_answered(entry.id, &call.call_id))
                .map(|call| {
                    json!({
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments_json}
                    })
                })
                .collect();
            let complete = answered.len() == entry.tool_calls.len() || !ledger.is_open(entry.id);
            let mut message = Map::new();
            message.insert("role".into(), "assistant".into());
            message.insert("content".into(), entry.text.clone().into());
            if !answered.is_empty() {
                message.insert("tool_calls".into(), Value::Array(answered));
            }
            Rendered { json: Value::Object(message).to_string(), complete, assistant: true }
        }
        Role::Tool => {
            let mut issued = ledger.answers(entry.id).iter();
            let Some(first) = issued.next() else {
                return Rendered { json: user(&entry.text), complete: true, assistant: false };
            };
            let mut messages =
                vec![json!({"role": "tool", "tool_call_id": first, "content": entry.text}).to_string()];
            for other in issued {
                messages.push(
                    json!({"role": "tool", "tool_call_id": other, "content": format!("[see {}]", entry.id)})
                        .to_string(),
                );
            }
            Rendered { json: messages.join(","), complete: true, assistant: false }
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
            let fragment = cache.get(index, entry, |entry| fragment(entry, ledger));
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
    let mut out = ChunkedBody::open_object(head);
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
            let fragment = cache.get(index, entry, |entry| fragment(entry, ledger));
            out.put_shared(&fragment.json);
            out.put(b",");
        }
    }
    out.put(json!({"role": "system", "content": packet.telemetry}).to_string().as_bytes());
    out.put(b"]}");
    out
}
