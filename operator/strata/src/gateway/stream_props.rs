//! Property tests of the streaming translators: whatever the chunking of the upstream stream (first
//! delta without a name, names split across deltas, parallel calls interleaved, SSE bytes cut
//! anywhere), the client never sees a memory tool and sees every client tool whole.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use serde_json::{Value, json};

use super::sse::SseParser;
use super::{anthropic, openai};
use strata_core::session::tool_schema::is_memory_tool;

/// Cases per property (also quoted in RELIABILITY.md).
const CASES: u32 = 2_000;

/// Tool names drawn by the tests: the three memory tools and client tools, some sharing a prefix
/// with a memory tool's name.
const NAMES: [&str; 7] = [
    "strata_purge",
    "strata_compact_context",
    "strata_read_output",
    "read_file",
    "strata_status",
    "strata",
    "s",
];

/// One generated tool call: its name, its arguments and where both are cut into deltas.
#[derive(Debug, Clone)]
struct GeneratedCall {
    name: &'static str,
    arguments: String,
    name_cuts: Vec<usize>,
    argument_cuts: Vec<usize>,
}

fn generated_call() -> impl Strategy<Value = GeneratedCall> {
    (
        0..NAMES.len(),
        "[a-z0-9 ./]{0,24}",
        prop::collection::vec(0usize..64, 0..4),
        prop::collection::vec(0usize..64, 0..5),
    )
        .prop_map(|(name, path, name_cuts, argument_cuts)| GeneratedCall {
            name: NAMES[name],
            arguments: json!({ "path": path }).to_string(),
            name_cuts,
            argument_cuts,
        })
}

/// Cuts `text` at the given offsets (taken modulo its length, on char boundaries), keeping empty
/// pieces so that a first delta may carry no name at all.
fn cut(text: &str, cuts: &[usize]) -> Vec<String> {
    let mut points: Vec<usize> =
        cuts.iter().map(|cut| cut % (text.len() + 1)).filter(|point| text.is_char_boundary(*point)).collect();
    points.sort_unstable();
    let mut pieces = Vec::new();
    let mut start = 0;
    for point in points {
        pieces.push(text[start..point].to_owned());
        start = point;
    }
    pieces.push(text[start..].to_owned());
    pieces
}

/// Merges per-call sequences in the order `picks` says, keeping each sequence's own order.
fn interleave<T>(mut sequences: Vec<std::collections::VecDeque<T>>, picks: &[usize]) -> Vec<T> {
    let mut merged = Vec::new();
    let mut picks = picks.iter().cycle();
    while sequences.iter().any(|sequence| !sequence.is_empty()) {
        let open: Vec<usize> = (0..sequences.len()).filter(|i| !sequences[*i].is_empty()).collect();
        let pick = open[picks.next().copied().unwrap_or(0) % open.len()];
        merged.extend(sequences[pick].pop_front());
    }
    merged
}

/// Splits `bytes` at the given offsets.
fn byte_chunks(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|cut| cut % (bytes.len() + 1)).collect();
    points.sort_unstable();
    points.dedup();
    let mut chunks = Vec::new();
    let mut start = 0;
    for point in points {
        chunks.push(bytes[start..point].to_vec());
        start = point;
    }
    chunks.push(bytes[start..].to_vec());
    chunks
}

fn sse_text(events: &[(Option<&str>, String)]) -> String {
    events
        .iter()
        .map(|(name, data)| match name {
            Some(name) => format!("event: {name}\ndata: {data}\n\n"),
            None => format!("data: {data}\n\n"),
        })
        .collect()
}

/// The `data:` payloads of a client SSE body.
fn client_payloads(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|block| block.lines().find_map(|line| line.strip_prefix("data: ")))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).expect("the client stream carries JSON"))
        .collect()
}

fn call_id(position: usize) -> String {
    format!("call_{position}_x")
}

/// The upstream OpenAI stream of one round with `calls`, interleaved by `picks`.
fn openai_stream(text: &str, calls: &[GeneratedCall], picks: &[usize], finish: &str) -> String {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        .to_string()
    };
    let mut events = vec![(None, chunk(json!({"role": "assistant", "content": ""}), Value::Null))];
    for piece in cut(text, &[text.len() / 2]) {
        events.push((None, chunk(json!({ "content": piece }), Value::Null)));
    }
    let per_call = calls
        .iter()
        .enumerate()
        .map(|(position, call)| {
            let mut deltas = std::collections::VecDeque::new();
            for (piece_index, piece) in cut(call.name, &call.name_cuts).into_iter().enumerate() {
                let mut delta = json!({"index": position, "function": {}});
                if piece_index == 0 {
                    delta["id"] = call_id(position).into();
                    delta["type"] = "function".into();
                }
                if !piece.is_empty() {
                    delta["function"]["name"] = piece.into();
                }
                deltas.push_back(delta);
            }
            for piece in cut(&call.arguments, &call.argument_cuts) {
                deltas.push_back(json!({"index": position, "function": {"arguments": piece}}));
            }
            deltas
        })
        .collect();
    for delta in interleave(per_call, picks) {
        events.push((None, chunk(json!({ "tool_calls": [delta] }), Value::Null)));
    }
    events.push((None, chunk(json!({}), finish.into())));
    events.push((
        None,
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2}})
        .to_string(),
    ));
    events.push((None, "[DONE]".to_owned()));
    sse_text(&events)
}

/// Client tool calls reassembled from OpenAI deltas, by client index: (id, name, arguments).
fn openai_client_calls(payloads: &[Value]) -> Vec<(String, String, String)> {
    let mut calls: Vec<(String, String, String)> = Vec::new();
    for payload in payloads {
        for delta in
            payload.pointer("/choices/0/delta/tool_calls").and_then(Value::as_array).into_iter().flatten()
        {
            let index =
                usize::try_from(delta["index"].as_u64().expect("a client delta has an index")).unwrap();
            assert!(index <= calls.len(), "client indices are dense: {index} after {}", calls.len());
            if index == calls.len() {
                calls.push(Default::default());
            }
            let call = &mut calls[index];
            call.0.push_str(delta["id"].as_str().unwrap_or_default());
            call.1.push_str(delta.pointer("/function/name").and_then(Value::as_str).unwrap_or_default());
            call.2.push_str(delta.pointer("/function/arguments").and_then(Value::as_str).unwrap_or_default());
        }
    }
    calls
}

fn assert_no_memory_tool(client: &str, calls: &[GeneratedCall]) {
    for name in ["strata_purge", "strata_compact_context", "strata_read_output"] {
        assert!(!client.contains(name), "memory tool {name} leaked to the client: {client}");
    }
    for (position, call) in calls.iter().enumerate() {
        if is_memory_tool(call.name) {
            assert!(!client.contains(&call_id(position)), "memory call {position} leaked: {client}");
        }
    }
}

fn expected_client_calls(calls: &[GeneratedCall]) -> Vec<(String, String, String)> {
    let mut expected: Vec<_> = calls
        .iter()
        .enumerate()
        .filter(|(_, call)| !is_memory_tool(call.name))
        .map(|(position, call)| (call_id(position), call.name.to_owned(), call.arguments.clone()))
        .collect();
    expected.sort();
    expected
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    #[test]
    fn openai_streams_never_show_a_memory_tool(
        text in "[a-z ]{0,12}",
        calls in prop::collection::vec(generated_call(), 0..4),
        picks in prop::collection::vec(0usize..8, 1..16),
        byte_cuts in prop::collection::vec(0usize..4096, 0..24),
    ) {
        let finish = if calls.is_empty() { "stop" } else { "tool_calls" };
        let upstream = openai_stream(&text, &calls, &picks, finish);
        let mut parser = SseParser::default();
        let mut translator = openai::StreamTranslator::new(false);
        let mut client = String::new();
        for chunk in byte_chunks(upstream.as_bytes(), &byte_cuts) {
            for event in parser.push(&chunk) {
                if let Some(bytes) = translator.on_event(&event.data).unwrap() {
                    client.push_str(std::str::from_utf8(&bytes).unwrap());
                }
            }
        }
        prop_assert!(parser.finish().is_none());
        prop_assert!(translator.round_complete());
        assert_no_memory_tool(&client, &calls);
        let payloads = client_payloads(&client);
        let mut shown = openai_client_calls(&payloads);
        shown.sort();
        prop_assert_eq!(shown, expected_client_calls(&calls));
        let internal = calls.iter().any(|c| is_memory_tool(c.name)) && calls.iter().all(|c| is_memory_tool(c.name));
        let finish_shown = payloads.iter().any(|p| p.pointer("/choices/0/finish_reason").is_some_and(Value::is_string));
        prop_assert_eq!(finish_shown, !internal, "the finish is held back exactly for memory-only rounds");
        prop_assert_eq!(translator.is_internal_round(), internal);
        let round = translator.finish_round();
        let mut journaled: Vec<_> = round.tool_calls.iter().map(|c| (c.call_id.clone(), c.name.clone(), c.arguments_json.clone())).collect();
        journaled.sort();
        let mut all: Vec<_> = calls.iter().enumerate().map(|(p, c)| (call_id(p), c.name.to_owned(), c.arguments.clone())).collect();
        all.sort();
        prop_assert_eq!(journaled, all, "the journal gets every call whole");
        prop_assert_eq!(round.text, text);
    }

    #[test]
    fn openai_streams_cut_before_the_finish_are_incomplete(
        calls in prop::collection::vec(generated_call(), 0..3),
        keep in 0usize..4096,
    ) {
        let upstream = openai_stream("hi", &calls, &[0], "stop");
        let finish_at = upstream.find("\"finish_reason\":\"stop\"").unwrap();
        let mut parser = SseParser::default();
        let mut translator = openai::StreamTranslator::new(false);
        let mut events = parser.push(&upstream.as_bytes()[..keep % finish_at]);
        events.extend(parser.finish());
        for event in events {
            // A cut inside a chunk leaves a torn JSON event, refused as a protocol error.
            if translator.on_event(&event.data).is_err() {
                break;
            }
        }
        prop_assert!(!translator.round_complete());
    }
}

/// The upstream Anthropic stream of one round: a text block, then the calls' blocks interleaved.
fn anthropic_stream(
    text: &str,
    calls: &[GeneratedCall],
    picks: &[usize],
) -> Vec<(Option<&'static str>, String)> {
    let stop = if calls.is_empty() { "end_turn" } else { "tool_use" };
    let mut events = vec![(
        Some("message_start"),
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
            "content": [], "model": "m", "usage": {"input_tokens": 10, "output_tokens": 1}}})
        .to_string(),
    )];
    events.push((
        Some("content_block_start"),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            .to_string(),
    ));
    events.push((
        Some("content_block_delta"),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}})
            .to_string(),
    ));
    events.push((Some("content_block_stop"), json!({"type": "content_block_stop", "index": 0}).to_string()));
    let per_call = calls
        .iter()
        .enumerate()
        .map(|(position, call)| {
            let index = position + 1;
            let mut sequence = std::collections::VecDeque::new();
            sequence.push_back((
                Some("content_block_start"),
                json!({"type": "content_block_start", "index": index, "content_block":
                    {"type": "tool_use", "id": call_id(position), "name": call.name, "input": {}}})
                .to_string(),
            ));
            for piece in cut(&call.arguments, &call.argument_cuts) {
                sequence.push_back((
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece}})
                    .to_string(),
                ));
            }
            sequence.push_back((
                Some("content_block_stop"),
                json!({"type": "content_block_stop", "index": index}).to_string(),
            ));
            sequence
        })
        .collect();
    events.extend(interleave(per_call, picks));
    events.push((
        Some("message_delta"),
        json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 3}})
            .to_string(),
    ));
    events.push((Some("message_stop"), json!({"type": "message_stop"}).to_string()));
    events
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    #[test]
    fn anthropic_streams_never_show_a_memory_tool(
        text in "[a-z ]{0,12}",
        calls in prop::collection::vec(generated_call(), 0..4),
        picks in prop::collection::vec(0usize..8, 1..16),
        byte_cuts in prop::collection::vec(0usize..4096, 0..24),
    ) {
        let upstream = sse_text(&anthropic_stream(&text, &calls, &picks));
        let mut parser = SseParser::default();
        let mut translator = anthropic::StreamTranslator::default();
        let mut client = String::new();
        for chunk in byte_chunks(upstream.as_bytes(), &byte_cuts) {
            for event in parser.push(&chunk) {
                if let Some(bytes) = translator.on_event(event.event.as_deref(), &event.data).unwrap() {
                    client.push_str(std::str::from_utf8(&bytes).unwrap());
                }
            }
        }
        prop_assert!(translator.round_complete());
        assert_no_memory_tool(&client, &calls);
        let mut shown: Vec<(u64, String, String, String)> = Vec::new();
        for payload in client_payloads(&client) {
            match payload["type"].as_str() {
                Some("content_block_start") if payload["content_block"]["type"] == "tool_use" => {
                    let block = &payload["content_block"];
                    shown.push((payload["index"].as_u64().unwrap(), block["id"].as_str().unwrap().to_owned(),
                        block["name"].as_str().unwrap().to_owned(), String::new()));
                }
                Some("content_block_delta") => {
                    if let Some(piece) = payload.pointer("/delta/partial_json").and_then(Value::as_str) {
                        let index = payload["index"].as_u64().unwrap();
                        let call = shown.iter_mut().find(|call| call.0 == index).expect("a delta follows its block's start");
                        call.3.push_str(piece);
                    }
                }
                _ => {}
            }
        }
        let indices: Vec<u64> = shown.iter().map(|call| call.0).collect();
        let dense: Vec<u64> = (1..=shown.len() as u64).collect();
        prop_assert_eq!(indices, dense, "client block indices stay dense after the text block");
        let mut shown: Vec<_> = shown.into_iter().map(|(_, id, name, arguments)| (id, name, arguments)).collect();
        shown.sort();
        prop_assert_eq!(shown, expected_client_calls(&calls));
        let internal = calls.iter().any(|c| is_memory_tool(c.name)) && calls.iter().all(|c| is_memory_tool(c.name));
        prop_assert_eq!(client.contains("\"stop_reason\""), !internal);
        let round = translator.finish_round();
        prop_assert_eq!(round.tool_calls.len(), calls.len());
        prop_assert_eq!(round.text, text.clone());
    }
}

#[test]
fn an_upstream_error_event_fails_the_round() {
    let mut translator = anthropic::StreamTranslator::default();
    let error = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    let failure = translator.on_event(Some("error"), &error.to_string()).unwrap_err();
    assert!(failure.to_string().contains("overloaded_error"), "{failure}");
    let mut translator = openai::StreamTranslator::new(false);
    let failure =
        translator.on_event(&json!({"error": {"message": "server_error"}}).to_string()).unwrap_err();
    assert!(failure.to_string().contains("server_error"), "{failure}");
}
