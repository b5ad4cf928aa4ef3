//! The upstream body of an OpenAI chat completion built from the compiled packet.

use bytes::Bytes;
use serde_json::{Map, Value, json};
use strata_core::compiler::{Packet, RenderedEntry};
use strata_core::entry::Role;

use super::body::ChunkedBody;
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
                .filter(|call| ledger.is_answered(&call.call_id))
                .map(|call| {
                    json!({
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments_json}
                    })
                })
                .collect();
            let complete = answered.len() == entry.tool_calls.len();
            let mut message = Map::new();
            message.insert("role".into(), "assistant".into());
            message.insert("content".into(), entry.text.clone().into());
            if !answered.is_empty() {
                message.insert("tool_calls".into(), Value::Array(answered));
            }
            Rendered { json: Value::Object(message).to_string(), complete, assistant: true }
        }
        Role::Tool => {
            let mut issued = entry.answers_calls.iter().filter(|call| ledger.is_issued(call));
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

/// Serialises the request: `head` (model, parameters, cache hints), Tier 1, Tier 2 and the Tier-3
/// telemetry as a trailing system message after the cached prefix.
pub fn body(
    head: Map<String, Value>,
    tier1: &Tier1Json,
    packet: &Packet<'_>,
    cache: &mut FragmentCache,
    ledger: &CallLedger,
) -> ChunkedBody {
    let mut out = ChunkedBody::with_capacity(2 * packet.entries.len() + 12);
    let mut head = Value::Object(head).to_string();
    head.pop();
    let has_fields = head.len() > 1;
    out.push(Bytes::from(head));
    if has_fields {
        out.push_static(b",");
    }
    if !tier1.tools.is_empty() {
        out.push_static(b"\"tools\":");
        out.push(tier1.tools_json.clone());
        out.push_static(b",");
    }
    out.push_static(b"\"messages\":[");
    let mut separator = false;
    let mut push = |out: &mut ChunkedBody, json: Bytes| {
        if separator {
            out.push_static(b",");
        }
        separator = true;
        out.push(json);
    };
    if !tier1.system_text.is_empty() {
        push(&mut out, tier1.system_json.clone());
    }
    for (index, entry) in packet.entries.iter().enumerate() {
        if entry.included {
            let fragment = cache.get(index, entry, |entry| fragment(entry, ledger));
            push(&mut out, fragment.json.clone());
        }
    }
    push(&mut out, Bytes::from(json!({"role": "system", "content": packet.telemetry}).to_string()));
    out.push_static(b"]}");
    out
}
