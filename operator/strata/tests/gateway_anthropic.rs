//! The gateway in front of a fake Anthropic upstream: cache breakpoints, telemetry placement,
//! tool use, streaming with memory tools hidden, and cache usage accounting.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use gateway_support::{API_KEY, CACHED_TOKENS, FakeUpstream, Harness, RawReply, Reply, call, sse_events};
use serde_json::{Value, json};
use strata_api::agent::Provider;

const MESSAGES: &str = "/v1/messages";

fn count_breakpoints(value: &Value) -> usize {
    match value {
        Value::Object(fields) => {
            usize::from(fields.contains_key("cache_control"))
                + fields.values().map(count_breakpoints).sum::<usize>()
        }
        Value::Array(items) => items.iter().map(count_breakpoints).sum(),
        _ => 0,
    }
}

#[tokio::test]
async fn requests_carry_breakpoints_and_telemetry_after_the_cached_prefix() {
    let fake = FakeUpstream::start().await;
    fake.script([Reply::Calls(
        "Checking.".into(),
        vec![call("toolu_1", "get_weather", json!({"city": "Oslo"}))],
    )]);
    let gateway = Harness::start(&fake, Provider::Anthropic, |_| {}).await;
    let tools =
        json!([{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}]);
    let mut history = vec![json!({"role": "user", "content": "Weather in Oslo?"})];
    let request =
        json!({"model": "x", "max_tokens": 100, "system": "Be brief.", "messages": history, "tools": tools});
    let (status, answer) =
        gateway.post_json(MESSAGES, &request, &[("anthropic-version", "2023-06-01")]).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["stop_reason"], "tool_use");
    assert_eq!(answer["usage"]["cache_read_input_tokens"], CACHED_TOKENS);
    let sent = fake.last();
    assert_eq!(fake.seen()[0].headers["x-api-key"], API_KEY);
    assert_eq!(sent["system"][0]["cache_control"]["type"], "ephemeral");
    assert!(sent["system"][0]["text"].as_str().unwrap().contains("Be brief."));
    let names: Vec<&str> =
        sent["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["get_weather", "strata_purge", "strata_compact_context", "strata_read_output"]);
    let blocks = sent["messages"][0]["content"].as_array().unwrap();
    assert!(blocks[0]["text"].as_str().unwrap().ends_with("Weather in Oslo?"));
    assert_eq!(blocks[0]["cache_control"]["type"], "ephemeral", "breakpoint on the last Tier-2 entry");
    let telemetry = blocks.last().unwrap();
    assert!(telemetry["text"].as_str().unwrap().starts_with("Status: Context:"));
    assert!(telemetry.get("cache_control").is_none(), "telemetry stays after the cache boundary");

    history.push(json!({"role": "assistant", "content": answer["content"]}));
    history.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}, {"type": "text", "text": "Thanks"}]}));
    let request =
        json!({"model": "x", "max_tokens": 100, "system": "Be brief.", "messages": history, "tools": tools});
    let (status, _) = gateway.post_json(MESSAGES, &request, &[]).await;
    assert_eq!(status, 200);
    let sent = fake.last();
    assert!(count_breakpoints(&sent) <= 4);
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert_eq!(messages[1]["content"][1]["type"], "tool_use");
    assert_eq!(messages[2]["content"][0]["type"], "tool_result");
    assert_eq!(messages[2]["content"][0]["tool_use_id"], "toolu_1");
    assert_eq!(gateway.entries().await.len(), 5);
}

#[tokio::test]
async fn streaming_hides_memory_tools_and_counts_cache_usage() {
    let fake = FakeUpstream::start().await;
    fake.script([
        Reply::Calls(
            "Reading.".into(),
            vec![call("toolu_r", "strata_read_output", json!({"data_ref": "art:sha256:00", "mode": "head"}))],
        ),
        Reply::Text("Done reading.".into()),
    ]);
    let gateway = Harness::start(&fake, Provider::Anthropic, |_| {}).await;
    let request = json!({"model": "x", "max_tokens": 100, "stream": true, "messages": [{"role": "user", "content": "Go"}]});
    let (status, text) = gateway.post(MESSAGES, &request, &[]).await;
    assert_eq!(status, 200, "{text}");
    assert!(!text.contains("strata_read_output"), "{text}");
    let events = sse_events(&text);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_deref().unwrap()).collect();
    assert_eq!(names.iter().filter(|n| **n == "message_start").count(), 1);
    assert_eq!(names.iter().filter(|n| **n == "message_delta").count(), 1);
    assert_eq!(*names.last().unwrap(), "message_stop");
    let indexes: Vec<u64> = events
        .iter()
        .filter(|(name, _)| name.as_deref() == Some("content_block_start"))
        .map(|(_, data)| serde_json::from_str::<Value>(data).unwrap()["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, [0, 1], "blocks of both rounds, renumbered");
    let text_out: String = events
        .iter()
        .filter_map(|(_, data)| serde_json::from_str::<Value>(data).ok())
        .filter_map(|event| event["delta"]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text_out, "Reading.Done reading.");
    let delta: Value =
        serde_json::from_str(&events.iter().find(|(n, _)| n.as_deref() == Some("message_delta")).unwrap().1)
            .unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    let second = &fake.seen()[1].body;
    let last_user = second["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(last_user["content"][0]["type"], "tool_result");
    assert!(last_user["content"][0]["content"].as_str().unwrap().contains("strata_read_output"));
    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains(&format!(
            "strata_gateway_prompt_tokens_total{{kind=\"cached\"}} {}",
            2 * CACHED_TOKENS
        )),
        "{metrics}"
    );
    assert!(metrics.contains("strata_gateway_prompt_tokens_total{kind=\"cache_write\"} 6"), "{metrics}");
}

/// The answer of a request's only round reaches the client as the upstream sent it, byte for byte,
/// usage fields the gateway does not model included. One the gateway must correct is built again:
/// a `tool_use` stop with no tool called becomes `end_turn`.
#[tokio::test]
async fn a_single_rounds_answer_passes_byte_for_byte_unless_it_needs_correcting() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::Anthropic, |_| {}).await;
    let answer = r#"{"usage":{"input_tokens":30,"output_tokens":6,"cache_read_input_tokens":0,"cache_creation_input_tokens":0,"service_tier":"standard"},"stop_reason":"end_turn","content":[{"type":"text","text":"Done."}],"role":"assistant","type":"message","id":"msg_raw","model":"fake-model"}"#;
    fake.script([RawReply::ok("application/json", answer)]);
    let request = json!({"max_tokens": 100, "messages": [{"role": "user", "content": "Finish up."}]});
    let (status, body) = gateway.post(MESSAGES, &request, &[]).await;
    assert_eq!((status, body.as_str()), (200, answer));

    let inconsistent = answer.replace(r#""stop_reason":"end_turn""#, r#""stop_reason":"tool_use""#);
    fake.script([RawReply::ok("application/json", inconsistent)]);
    let request = json!({"max_tokens": 100, "messages": [
        {"role": "user", "content": "Finish up."},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Again."}
    ]});
    let (status, body) = gateway.post(MESSAGES, &request, &[]).await;
    assert_eq!(status, 200, "{body}");
    let rebuilt: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(rebuilt["stop_reason"], "end_turn", "{body}");
    assert_eq!(rebuilt["content"][0]["text"], "Done.");
}
