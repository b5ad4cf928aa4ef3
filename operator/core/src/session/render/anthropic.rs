//! The upstream body of an Anthropic message request built from the compiled packet, with
//! `cache_control` breakpoints where the compiler placed them.

use std::collections::HashSet;

use crate::compiler::{Breakpoint, Packet, RenderedEntry};
use crate::entry::{EntryId, Role, ToolCall};
use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::body::{Assembly, ChunkedBody, Sink};
use super::fragments::{FragmentCache, Rendered};
use super::json_write::{TextBlock, json_bytes, write_json};
use super::ledger::CallLedger;
use super::tier1::{Tier1Json, ephemeral};

/// Text that opens the conversation when its first kept entry is the assistant's.
pub const LEADING_USER_TEXT: &str = "[strata: earlier context continues]";

fn blocks(
    entry: &RenderedEntry,
    entry_text: &str,
    calls: &[ToolCall],
    ledger: &CallLedger,
) -> (Vec<Value>, bool, bool) {
    let text = |text: &str| json!({"type": "text", "text": text});
    match entry.role {
        Role::User | Role::System => (vec![text(entry_text)], true, false),
        Role::Assistant => {
            let mut out = vec![text(entry_text)];
            let mut complete = true;
            for call in calls {
                if !ledger.is_answered(entry.id, &call.call_id) {
                    complete &= !ledger.is_open(entry.id);
                    continue;
                }
                let input = serde_json::from_str::<Value>(&call.arguments_json)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| json!({}));
                out.push(json!({"type": "tool_use", "id": call.call_id, "name": call.name, "input": input}));
            }
            (out, complete, true)
        }
        Role::Tool => {
            let mut issued = ledger.answers(entry.id).iter();
            let Some(first) = issued.next() else {
                return (vec![text(entry_text)], true, false);
            };
            let mut out = vec![json!({"type": "tool_result", "tool_use_id": first, "content": entry_text})];
            for other in issued {
                out.push(json!({"type": "tool_result", "tool_use_id": other, "content": format!("[see {}]", entry.id)}));
            }
            (out, true, false)
        }
    }
}

/// The blocks comma-separated, written into one buffer sized for the entry's text.
fn join(values: &[Value], text_len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(text_len + 96 * values.len());
    for (index, value) in values.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        write_json(&mut out, value);
    }
    out
}

/// One Tier-2 entry, whose model-visible text is `text` and whose tool calls are `calls`, as
/// comma-separated Anthropic content blocks.
pub fn fragment(entry: &RenderedEntry, text: &str, calls: &[ToolCall], ledger: &CallLedger) -> Rendered {
    let (values, complete, assistant) = blocks(entry, text, calls, ledger);
    Rendered { json: join(&values, text.len()), complete, assistant }
}

fn fragment_with_breakpoint(
    entry: &RenderedEntry,
    text: &str,
    calls: &[ToolCall],
    ledger: &CallLedger,
) -> (Vec<u8>, bool) {
    let (mut values, _, assistant) = blocks(entry, text, calls, ledger);
    if let Some(Value::Object(last)) = values.last_mut() {
        last.insert("cache_control".into(), ephemeral());
    }
    (join(&values, text.len()), assistant)
}

/// Writes one content block, opening and closing message groups as the side changes.
fn block(out: &mut impl Sink, side: &mut Option<bool>, assistant: bool, json: &Bytes) {
    match *side {
        Some(current) if current == assistant => out.put(b","),
        Some(_) => {
            out.put(b"]},");
            open(out, side, assistant);
        }
        None => {
            if assistant {
                open(out, side, false);
                out.put(&json_bytes(&TextBlock::of(LEADING_USER_TEXT), LEADING_USER_TEXT.len()));
                out.put(b"]},");
            }
            open(out, side, assistant);
        }
    }
    out.put_shared(json);
}

fn open(out: &mut impl Sink, side: &mut Option<bool>, assistant: bool) {
    if assistant {
        out.put(b"{\"role\":\"assistant\",\"content\":[");
    } else {
        out.put(b"{\"role\":\"user\",\"content\":[");
    }
    *side = Some(assistant);
}

/// Serialises the request: `head` (model, parameters), Tier 1 with its breakpoint, Tier 2 (the
/// assembled part by reference, then the newer entries, with entry breakpoints) and the Tier-3
/// telemetry as a final text block of the last user message.
pub fn body(
    head: Map<String, Value>,
    tier1: &Tier1Json,
    packet: &Packet<'_>,
    cache: &mut FragmentCache,
    assembly: &mut Assembly,
    ledger: &CallLedger,
) -> ChunkedBody {
    let tier1_breakpoint = packet.breakpoints.contains(&Breakpoint::Tier1);
    let entry_breakpoints: HashSet<EntryId> = packet
        .breakpoints
        .iter()
        .filter_map(|point| match point {
            Breakpoint::Entry { id } => Some(*id),
            Breakpoint::Tier1 => None,
        })
        .collect();
    let last_included = packet.entries.iter().rposition(|entry| entry.included).unwrap_or(0);
    let mut index = assembly.upto();
    let mut side = assembly.side;
    while index < last_included {
        let entry = &packet.entries[index];
        if entry.included {
            if entry_breakpoints.contains(&entry.id) {
                let (json, assistant) =
                    fragment_with_breakpoint(entry, &packet.text(index), packet.tool_calls(index), ledger);
                block(assembly, &mut side, assistant, &Bytes::from(json));
            } else {
                let fragment = cache.get(index, entry, packet.source_hash(index), |entry| {
                    fragment(entry, &packet.text(index), packet.tool_calls(index), ledger)
                });
                if !fragment.is_complete() {
                    break;
                }
                block(assembly, &mut side, fragment.assistant, &fragment.json);
                cache.release(index);
            }
        }
        index += 1;
        assembly.side = side;
        assembly.advance(index);
    }
    let mut out = ChunkedBody::open_object(head, assembly.copied_hint);
    let system_has_text = !tier1.system_text.is_empty();
    if system_has_text {
        out.put(b"\"system\":");
        let system = if tier1_breakpoint { &tier1.system_json_breakpoint } else { &tier1.system_json };
        out.put_shared(system);
        out.put(b",");
    }
    if tier1.has_tools {
        out.put(b"\"tools\":");
        let tools = if tier1_breakpoint && !system_has_text {
            &tier1.tools_json_breakpoint
        } else {
            &tier1.tools_json
        };
        out.put_shared(tools);
        out.put(b",");
    }
    out.put(b"\"messages\":[");
    assembly.write_to(&mut out);
    let mut side = assembly.side;
    for (index, entry) in packet.entries.iter().enumerate().skip(assembly.upto()) {
        if !entry.included {
            continue;
        }
        if entry_breakpoints.contains(&entry.id) {
            let (json, assistant) =
                fragment_with_breakpoint(entry, &packet.text(index), packet.tool_calls(index), ledger);
            block(&mut out, &mut side, assistant, &Bytes::from(json));
        } else {
            let fragment = cache.get(index, entry, packet.source_hash(index), |entry| {
                fragment(entry, &packet.text(index), packet.tool_calls(index), ledger)
            });
            block(&mut out, &mut side, fragment.assistant, &fragment.json);
        }
    }
    let telemetry = Bytes::from(json_bytes(&TextBlock::of(&packet.telemetry), packet.telemetry.len()));
    block(&mut out, &mut side, false, &telemetry);
    out.put(b"]}]}");
    assembly.copied_hint = out.copied_len();
    out
}
