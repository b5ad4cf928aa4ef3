//! The gateway in front of a fake OpenAI upstream: journaling, compilation, transparent sessions,
//! parallel tool calls, spill + read_output, memory-tool interception (streaming too), purge, usage.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use gateway_support::{CACHE_KEY, CACHED_TOKENS, FakeUpstream, Harness, RawReply, Reply, call, sse_events};
use serde_json::{Value, json};
use strata_api::agent::Provider;
use strata_core::artifacts::ArtifactRef;

const CHAT: &str = "/v1/chat/completions";

fn messages(body: &Value) -> Vec<Value> {
    body["messages"].as_array().unwrap().clone()
}

fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| tools.iter().map(|t| t["function"]["name"].as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_turn_is_journaled_and_sent_as_a_compiled_packet() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let weather =
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}});
    let request = json!({
        "model": "whatever-the-client-says",
        "messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hello there"}],
        "tools": [weather],
        "temperature": 0.2
    });
    let (status, answer) = gateway.post_json(CHAT, &request, &[]).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], "ok");
    assert_eq!(answer["usage"]["prompt_tokens_details"]["cached_tokens"], CACHED_TOKENS);

    let sent = fake.last();
    assert_eq!(sent["model"], "fake-model", "the sidecar decides the model");
    let status = gateway.get_json("/strata/v1/status").await;
    let bound = status["upstreamCacheKeyShort"].as_str().unwrap();
    let sent_key = sent["prompt_cache_key"].as_str().unwrap();
    assert!(sent_key.starts_with(bound) && sent_key.len() == 64, "{sent_key} is the bound key {bound}");
    assert_ne!(
        sent_key, CACHE_KEY,
        "the controller's key is bound to policy, adapter, runtime and credential"
    );
    assert_eq!(sent["temperature"], 0.2);
    assert_eq!(
        tool_names(&sent),
        ["get_weather", "strata_purge", "strata_compact_context", "strata_read_output"]
    );
    let sent_messages = messages(&sent);
    assert_eq!(sent_messages[0]["role"], "system");
    let system = sent_messages[0]["content"].as_str().unwrap();
    assert!(system.contains("You are builder") && system.contains("Answer briefly."), "{system}");
    assert_eq!(sent_messages[1]["role"], "user");
    let user = sent_messages[1]["content"].as_str().unwrap();
    assert!(user.starts_with("[msg_") && user.ends_with("] Hello there"), "{user}");
    let telemetry = sent_messages.last().unwrap();
    assert_eq!(telemetry["role"], "system");
    assert!(telemetry["content"].as_str().unwrap().starts_with("Status: Context: "), "{telemetry}");
    let authorization = fake.seen()[0].headers["authorization"].to_str().unwrap().to_owned();
    assert_eq!(authorization, format!("Bearer {}", gateway_support::API_KEY));

    let entries = gateway.entries().await;
    let roles: Vec<&str> = entries.iter().map(|e| e["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant"]);
    let status = gateway.get_json("/strata/v1/status").await;
    assert_eq!(status["context"]["limit"], 128_000);
    assert!(status["telemetry"].as_str().unwrap().starts_with("Status: Context: "));
    let inspect = gateway.get_json("/strata/v1/inspect?limit=1").await;
    let round = &inspect["requests"][0]["rounds"][0];
    assert_eq!(round["churn"], "cold");
    assert_eq!(round["cacheOutcome"], "partial");
    assert!(round["sections"].as_array().unwrap().iter().any(|s| s["id"] == "tier1.tools"));
    assert!(inspect["decisions"].as_array().unwrap().iter().any(|d| d["reason"] == "telemetry"));
    let lower: Vec<u64> = inspect["lowerBudgets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["percentOfLimit"].as_u64().unwrap())
        .collect();
    assert_eq!(lower, [75, 50, 25], "the inspector simulates lower budgets");
    assert!(
        inspect["lowerBudgets"].as_array().unwrap().iter().all(|o| o["fits"] == true),
        "a 2-entry packet fits"
    );
    // The read-only views are also on the metrics listener, for `kubectl strata inspect` via the pod proxy.
    let on_metrics_port = format!("http://{}/strata/v1/inspect", gateway.gateway.metrics_address);
    let proxied: Value = reqwest::get(on_metrics_port).await.unwrap().json().await.unwrap();
    assert_eq!(proxied["lowerBudgets"], inspect["lowerBudgets"]);
    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains(&format!("strata_gateway_prompt_tokens_total{{kind=\"cached\"}} {CACHED_TOKENS}")),
        "{metrics}"
    );
    assert!(metrics.contains("strata_gateway_added_overhead_seconds_count 1"), "{metrics}");
}

#[tokio::test]
async fn transparent_sessions_journal_only_new_messages() {
    let fake = FakeUpstream::start().await;
    fake.script([Reply::Text("first answer".into()), Reply::Text("second answer".into())]);
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let mut history = vec![json!({"role": "user", "content": "Hi"})];
    let (_, answer) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
    history.push(answer["choices"][0]["message"].clone());
    history.push(json!({"role": "user", "content": "Hi"}));
    let (status, _) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
    assert_eq!(status, 200);
    let entries = gateway.entries().await;
    assert_eq!(entries.len(), 4, "a repeated message at a new position is new: {entries:?}");
    let texts: Vec<String> = messages(&fake.last())
        .iter()
        .filter(|m| m["role"] != "system")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert!(texts[1].ends_with("first answer"));
    assert_eq!(fake.seen().len(), 2);
}

#[tokio::test]
async fn parallel_tool_results_are_journaled_in_arrival_order() {
    let fake = FakeUpstream::start().await;
    fake.script([Reply::Calls(
        String::new(),
        vec![call("call_a", "get_weather", json!({"city": "Oslo"})), call("call_b", "get_time", json!({}))],
    )]);
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    ]);
    let mut history = vec![json!({"role": "user", "content": "Weather and time?"})];
    let (_, answer) = gateway.post_json(CHAT, &json!({"messages": history, "tools": tools}), &[]).await;
    let message = answer["choices"][0]["message"].clone();
    assert_eq!(message["tool_calls"].as_array().unwrap().len(), 2);
    assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls");
    history.push(message);
    history.push(json!({"role": "tool", "tool_call_id": "call_b", "content": "12:00"}));
    history.push(json!({"role": "tool", "tool_call_id": "call_a", "content": "Sunny"}));
    let (status, _) = gateway.post_json(CHAT, &json!({"messages": history, "tools": tools}), &[]).await;
    assert_eq!(status, 200);
    let sent = messages(&fake.last());
    let tail: Vec<&Value> =
        sent.iter().filter(|m| m["role"] == "tool" || m["tool_calls"].is_array()).collect();
    assert_eq!(tail.len(), 3, "{sent:?}");
    assert_eq!(tail[1]["tool_call_id"], "call_b", "results in arrival order");
    assert!(tail[1]["content"].as_str().unwrap().ends_with("] 12:00"));
    assert_eq!(tail[2]["tool_call_id"], "call_a");
    let kinds: Vec<String> = gateway
        .entries()
        .await
        .iter()
        .map(|e| e["id"].as_str().unwrap().rsplit_once('_').unwrap().0.to_owned())
        .collect();
    assert_eq!(kinds, ["msg", "tool_call", "tool_res", "tool_res", "msg"]);
}

fn big_output() -> String {
    let mut text = String::new();
    for line in 0..600 {
        if line == 512 {
            text.push_str("line 512: the needle is here\n");
        } else {
            text.push_str(&format!("line {line}: nothing interesting in this log line\n"));
        }
    }
    text
}

#[tokio::test]
async fn spilled_output_is_read_back_through_an_intercepted_memory_tool() {
    let fake = FakeUpstream::start().await;
    let output = big_output();
    let data_ref = ArtifactRef::for_bytes(output.as_bytes()).to_string();
    fake.script([
        Reply::Calls(
            "Let me search. ".into(),
            vec![call(
                "call_read",
                "strata_read_output",
                json!({"data_ref": data_ref, "mode": "search", "pattern": "needle"}),
            )],
        ),
        Reply::Text("Found the needle on line 512.".into()),
    ]);
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let history = json!([
        {"role": "user", "content": "Check the log"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_log", "type": "function", "function": {"name": "read_log", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_log", "content": output}
    ]);
    let (status, answer) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
    assert_eq!(status, 200, "{answer}");
    let message = &answer["choices"][0]["message"];
    assert_eq!(message["content"], "Let me search. Found the needle on line 512.");
    assert!(message.get("tool_calls").is_none(), "memory tool calls never reach the client: {message}");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");

    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    let first = messages(&seen[0].body);
    let spilled = first.iter().find(|m| m["role"] == "tool").unwrap()["content"].as_str().unwrap().to_owned();
    assert!(spilled.contains(&format!("data_ref={data_ref}")), "{spilled}");
    assert!(spilled.len() < output.len());
    let second = messages(&seen[1].body);
    let read =
        second.iter().rev().find(|m| m["role"] == "tool").unwrap()["content"].as_str().unwrap().to_owned();
    assert!(read.contains("the needle is here"), "{read}");
    let metrics = gateway.metrics().await;
    assert!(metrics.contains(&format!("strata_gateway_spilled_bytes_total {}", output.len())), "{metrics}");
    assert!(metrics.contains("strata_gateway_memory_tool_calls_total{tool=\"strata_read_output\"} 1"));
}

#[tokio::test]
async fn streaming_hides_memory_tools_and_strips_the_usage_chunk() {
    let fake = FakeUpstream::start().await;
    let output = big_output();
    let data_ref = ArtifactRef::for_bytes(output.as_bytes()).to_string();
    fake.script([
        Reply::Calls(
            String::new(),
            vec![call(
                "call_read",
                "strata_read_output",
                json!({"data_ref": data_ref, "mode": "head", "lines": 2}),
            )],
        ),
        Reply::Calls("Now the weather.".into(), vec![call("call_w", "get_weather", json!({"city": "Oslo"}))]),
    ]);
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let history = json!([
        {"role": "user", "content": "Check the log"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_log", "type": "function", "function": {"name": "read_log", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_log", "content": output}
    ]);
    let tools =
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let (status, text) =
        gateway.post(CHAT, &json!({"messages": history, "tools": tools, "stream": true}), &[]).await;
    assert_eq!(status, 200, "{text}");
    assert!(!text.contains("strata_read_output"), "{text}");
    let events = sse_events(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> =
        events.iter().filter(|(_, d)| d != "[DONE]").map(|(_, d)| serde_json::from_str(d).unwrap()).collect();
    assert!(chunks.iter().all(|c| c.get("usage").is_none()), "the client did not ask for usage");
    let finishes: Vec<&Value> =
        chunks.iter().map(|c| &c["choices"][0]["finish_reason"]).filter(|f| !f.is_null()).collect();
    assert_eq!(finishes, [&json!("tool_calls")], "one finish for the client");
    let content: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(content, "Now the weather.");
    let calls: Vec<&Value> =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten().collect();
    assert!(calls.iter().all(|c| c["index"] == 0));
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert!(chunks.iter().all(|c| c["id"] == chunks[0]["id"]));
    for seen in fake.seen() {
        assert_eq!(seen.body["stream_options"]["include_usage"], true, "usage is always requested");
    }
    let entries = gateway.entries().await;
    assert!(entries.iter().any(|e| e["id"].as_str().unwrap().starts_with("tool_res")
        && e["role"] == "tool"
        && fake.seen().len() == 2));

    let with_usage = json!({"messages": [{"role": "user", "content": "again"}], "stream": true, "stream_options": {"include_usage": true}});
    let (_, text) = gateway.post(CHAT, &with_usage, &[("x-strata-session", "s1")]).await;
    let events = sse_events(&text);
    let usage: Value = serde_json::from_str(&events[events.len() - 2].1).unwrap();
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], CACHED_TOKENS);
}

#[tokio::test]
async fn the_model_purges_entries_through_the_memory_tool() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let session = [("x-strata-session", "main")];
    for text in ["Find the auth errors.", "They are Redis timeouts."] {
        gateway.post_json(CHAT, &json!({"messages": [{"role": "user", "content": text}]}), &session).await;
    }
    let ids: Vec<String> =
        gateway.entries().await.iter().take(2).map(|e| e["id"].as_str().unwrap().to_owned()).collect();
    fake.script([
        Reply::Calls(
            String::new(),
            vec![call(
                "call_p",
                "strata_purge",
                json!({"ids": ids, "summary": "Auth errors were Redis timeouts."}),
            )],
        ),
        Reply::Text("Purged.".into()),
    ]);
    let (status, answer) = gateway
        .post_json(CHAT, &json!({"messages": [{"role": "user", "content": "Clean up."}]}), &session)
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], "Purged.");
    let entries = gateway.entries().await;
    let listed: Vec<&str> = entries.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert!(ids.iter().all(|id| !listed.contains(&id.as_str())), "{listed:?}");
    assert!(listed.iter().any(|id| id.starts_with("summary_")), "{listed:?}");
    let last = messages(&fake.last());
    assert!(
        last.iter()
            .any(|m| m["content"].as_str().is_some_and(|t| t.contains("Auth errors were Redis timeouts.")))
    );
    let status = gateway.get_json("/strata/v1/status").await;
    assert_eq!(status["generation"], 2);
    let metrics = gateway.metrics().await;
    assert!(metrics.contains("strata_gateway_purges_total 1"), "{metrics}");
    assert!(metrics.contains("strata_gateway_prefix_churn_total{cause=\"history_rewrite\"} 1"), "{metrics}");
}

#[tokio::test]
async fn the_model_compacts_its_context_through_the_memory_tool() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let session = [("x-strata-session", "main")];
    for index in 0..8 {
        let text = format!("Step {index}: we decided to keep the retry budget at {index} attempts.");
        gateway.post_json(CHAT, &json!({"messages": [{"role": "user", "content": text}]}), &session).await;
    }
    let before = gateway.entries().await.len();
    let instruction = "Continue with the Redis timeout fix in auth.py.";
    fake.script([
        Reply::Calls(
            String::new(),
            vec![call("call_c", "strata_compact_context", json!({"resume_instruction": instruction}))],
        ),
        Reply::Text("Resuming.".into()),
    ]);
    let (status, answer) = gateway
        .post_json(CHAT, &json!({"messages": [{"role": "user", "content": "Compact now."}]}), &session)
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], "Resuming.");
    let status = gateway.get_json("/strata/v1/status").await;
    assert_eq!(status["generation"], 2, "{status}");
    let entries = gateway.entries().await;
    assert!(entries.len() < before + 4, "{} entries after compaction", entries.len());
    assert!(entries.iter().any(|e| e["id"].as_str().unwrap().starts_with("summary_")));
    let last = messages(&fake.last());
    assert!(last.iter().any(|m| m["content"].as_str().is_some_and(|t| t.contains(instruction))), "{last:?}");
    assert!(gateway.metrics().await.contains("strata_gateway_compactions_total 1"));
    assert!(gateway.data_dir.join("compactions").read_dir().unwrap().next().is_some());
}

#[tokio::test]
async fn identical_tool_less_requests_are_answered_from_the_response_cache() {
    let fake = FakeUpstream::start().await;
    fake.script([Reply::Text("cached answer".into())]);
    let gateway = Harness::start(&fake, Provider::OpenAICompatible, |config| {
        config.policy.cache.response_cache_ttl_seconds = 60;
    })
    .await;
    let request = json!({"messages": [{"role": "user", "content": "What is 2 + 2?"}]});
    let (_, first) = gateway.post_json(CHAT, &request, &[]).await;
    let (status, second) = gateway.post_json(CHAT, &request, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(first, second);
    assert_eq!(fake.seen().len(), 1, "the repeat did not reach the upstream");
    assert_eq!(gateway.entries().await.len(), 2, "and added nothing to the journal");
    let sent = fake.last();
    let status = gateway.get_json("/strata/v1/status").await;
    let bound = status["upstreamCacheKeyShort"].as_str().unwrap();
    assert!(
        sent["cache_salt"].as_str().unwrap().starts_with(bound),
        "OpenAI-compatible servers get the bound cache key as cache_salt"
    );
    assert!(sent.get("prompt_cache_key").is_none());

    let tools = json!([{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]);
    let with_tools = json!({"messages": [{"role": "user", "content": "And 3 + 3?"}], "tools": tools});
    gateway.post_json(CHAT, &with_tools, &[]).await;
    gateway.post_json(CHAT, &with_tools, &[]).await;
    assert_eq!(fake.seen().len(), 3, "requests offering tools are never cached");
    assert!(gateway.metrics().await.contains("strata_gateway_response_cache_hits_total 1"));
}

#[tokio::test]
async fn a_large_history_edited_anywhere_is_not_answered_from_the_response_cache() {
    let fake = FakeUpstream::start().await;
    fake.script(["a1", "a2", "a3"].map(|t| Reply::Text(t.into())));
    let gateway = Harness::start(&fake, Provider::OpenAICompatible, |config| {
        config.policy.cache.response_cache_ttl_seconds = 60;
    })
    .await;
    // About 100 KB: read into the kept body buffer, and keyed from the hash states kept of the last
    // body where the two share their opening.
    let rules = "Answer in one line. ".repeat(5_000);
    let body = |rules: &str, question: &str| json!({"messages": [{"role": "system", "content": rules}, {"role": "user", "content": question}]});
    let first = body(&rules, "What is 2 + 2?");
    let (status, first_answer) = gateway.post_json(CHAT, &first, &[]).await;
    assert_eq!(status, 200, "{first_answer}");
    assert_eq!(gateway.post_json(CHAT, &first, &[]).await.1, first_answer);
    assert_eq!(fake.seen().len(), 1, "the resent body was answered from the cache");

    // One letter changed 70 KB in, the length unchanged: most of the body is the last one's.
    let mut edited_rules = rules.clone();
    edited_rules.replace_range(70_000..70_001, "a");
    assert_ne!(edited_rules, rules);
    let edited = body(&edited_rules, "What is 2 + 2?");
    let (status, edited_answer) = gateway.post_json(CHAT, &edited, &[]).await;
    assert_eq!(status, 200, "{edited_answer}");
    assert_eq!(fake.seen().len(), 2, "the edited body reached the upstream");
    assert_ne!(edited_answer, first_answer);
    // Each is answered from the cache when resent, the one compared with the other included.
    assert_eq!(gateway.post_json(CHAT, &edited, &[]).await.1, edited_answer);
    assert_eq!(gateway.post_json(CHAT, &first, &[]).await.1, first_answer);
    assert_eq!(fake.seen().len(), 2);

    // A change in the last bytes.
    let (status, _) = gateway.post_json(CHAT, &body(&rules, "What is 2 + 3?"), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(fake.seen().len(), 3, "the new question reached the upstream");
    assert!(gateway.metrics().await.contains("strata_gateway_response_cache_hits_total 3"));
}

#[tokio::test]
async fn a_tool_block_sent_again_is_kept_and_a_changed_one_reaches_the_upstream() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    // Long descriptions, as a coding agent's schemas have: a block this size is found by its bytes
    // and read around rather than scanned.
    let tool = |name: &str| {
        let description = format!("{name}: ").repeat(600);
        json!({"type": "function", "function": {"name": name, "description": description, "parameters": {"type": "object"}}})
    };
    let mut history = vec![json!({"role": "user", "content": "Hello"})];
    // The tool block before the messages in one request and after them in the next (the body is
    // sent as written, keys in that order): the same bytes wherever they lie are the same block.
    let mut send = |tools: Value, tools_first: bool| {
        let text = serde_json::to_string(&history).unwrap();
        let tools = serde_json::to_string(&tools).unwrap();
        let body = if tools_first {
            format!(r#"{{"tools":{tools},"messages":{text}}}"#)
        } else {
            format!(r#"{{"messages":{text},"tools":{tools}}}"#)
        };
        let last_user = history[history.len() - 1]["content"].clone();
        history.push(json!({"role": "assistant", "content": "ok"}));
        history.push(json!({"role": "user", "content": format!("And now {}?", history.len())}));
        (body, last_user)
    };
    let memory = ["strata_purge", "strata_compact_context", "strata_read_output"];
    let read_write = || json!([tool("read"), tool("write")]);
    assert!(read_write().to_string().len() > 4096, "long enough to be read around");
    for (tools, tools_first, expected) in [
        (read_write(), true, vec!["read", "write"]),
        (read_write(), false, vec!["read", "write"]),
        (read_write(), true, vec!["read", "write"]),
        (json!([tool("grep")]), true, vec!["grep"]),
        (json!(null), false, vec![]),
        (read_write(), true, vec!["read", "write"]),
        (read_write(), false, vec!["read", "write"]),
    ] {
        let (body, sent_last) = send(tools, tools_first);
        let (status, answer) = gateway.post_text_json(CHAT, body.clone()).await;
        assert_eq!(status, 200, "{answer}");
        let mut wanted: Vec<&str> = expected.clone();
        wanted.extend(memory);
        let upstream = fake.last();
        assert_eq!(tool_names(&upstream), wanted, "{}", &body[..body.len().min(300)]);
        let sent_description = &upstream["tools"][0]["function"]["description"];
        if let Some(first) = expected.first() {
            assert_eq!(sent_description, &tool(first)["function"]["description"], "the schemas whole");
        }
        let last_user =
            upstream["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "user").cloned();
        let last_user = last_user.unwrap()["content"].as_str().unwrap().to_owned();
        // The upstream sees the message under its memory ID (`[msg_N] …`).
        assert!(last_user.ends_with(&format!("] {}", sent_last.as_str().unwrap())), "{last_user}");
    }
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "tools": {"read": true}});
    let (status, answer) = gateway.post_json(CHAT, &body, &[]).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["message"], "`tools` must be an array");
}

/// The value of the counter `name` in a Prometheus text exposition (0 when absent).
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or(0)
}

#[tokio::test]
async fn history_lists_close_to_full_are_grown_after_the_answer_and_then_left_alone() {
    const ROOM_MADE: &str = "strata_gateway_history_room_made_total";
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let mut messages = vec![json!({"role": "user", "content": "Hello"})];
    let (status, answer) = gateway.post_json(CHAT, &json!({"model": "m", "messages": messages}), &[]).await;
    assert_eq!(status, 200, "{answer}");
    // A new journal's lists hold two entries with room for a few more: they are grown in a task
    // of their own after the answer.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while counter(&gateway.metrics().await, ROOM_MADE) == 0 {
        assert!(std::time::Instant::now() < deadline, "no room was made after the first answer");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Doubled ahead, they have room for the next turns: nothing is grown again.
    for turn in 0..3 {
        messages.push(answer["choices"][0]["message"].clone());
        messages.push(json!({"role": "user", "content": format!("And then {turn}?")}));
        let (status, reply) =
            gateway.post_json(CHAT, &json!({"model": "m", "messages": messages}), &[]).await;
        assert_eq!(status, 200, "{reply}");
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(counter(&gateway.metrics().await, ROOM_MADE), 1, "room is made once, not per request");
}

/// The answer of a request's only round, with no memory tool in it, reaches the client as the
/// upstream sent it, byte for byte: its key order and the usage details the gateway does not model
/// (reasoning tokens) are kept. An answer after a memory tool's round is built again: the rounds'
/// texts joined, the usage summed over both.
#[tokio::test]
async fn a_single_rounds_answer_passes_byte_for_byte_and_one_after_a_memory_tool_is_rebuilt() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let answer = r#"{"usage":{"prompt_tokens":40,"completion_tokens":9,"total_tokens":49,"completion_tokens_details":{"reasoning_tokens":4}},"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"Done."}}],"system_fingerprint":"fp_1","id":"chatcmpl-raw","object":"chat.completion","created":7}"#;
    fake.script([RawReply::ok("application/json", answer)]);
    let first = json!({"messages": [{"role": "user", "content": "Finish up."}]});
    let (status, body) = gateway.post(CHAT, &first, &[]).await;
    assert_eq!((status, body.as_str()), (200, answer));

    fake.script([
        Reply::Calls(
            "Looking. ".into(),
            vec![call("call_r", "strata_read_output", json!({"data_ref": "sha256:00", "mode": "head"}))],
        ),
        RawReply::ok("application/json", answer),
    ]);
    let second = json!({"messages": [
        {"role": "user", "content": "Finish up."},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "And the log?"}
    ]});
    let (status, body) = gateway.post(CHAT, &second, &[]).await;
    assert_eq!(status, 200, "{body}");
    let rebuilt: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(rebuilt["choices"][0]["message"]["content"], "Looking. Done.");
    assert_eq!(rebuilt["usage"]["completion_tokens"], 5 + 9, "summed over both rounds: {body}");
    assert!(rebuilt["usage"]["prompt_tokens"].as_u64().unwrap() > 40, "summed over both rounds: {body}");
    assert!(rebuilt["usage"].get("completion_tokens_details").is_none(), "{body}");
}
